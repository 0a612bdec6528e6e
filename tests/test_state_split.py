"""Split values in the state (store format 3, FORMAT.md §16 "Split values").

What is specified here: a value whose last LMDB overflow page would hold at most P/8 bytes is
stored one page shorter with those bytes in the `tail` database, so a 4 KiB value costs one
overflow page, not two; every read (get, scan, snapshots, the Store above them) returns every
value whole at every size around the page boundaries; an overwrite or a delete leaves no tail
behind; a split value without its tail is damage; a version with its top bit set is refused
before anything is written; and a format-2 store is read, and upgraded to 3 by its first
writable open, while a read-only handle opened before that upgrade says to reopen rather than
misread a split value.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
from legacy_state import strip_entry_checksums

import wal
import wal.store.state
from wal.errors import CorruptionError
from wal.store.state import DEFAULT_MAP_SIZE, State, StateError
from wal.store.store import STORE_VERSION

P = 4096  # LMDB's page size on this platform (checked below)
ENTRY_HEAD = 12  # a state entry's version and checksum before its value (FORMAT.md §16)
# LMDB puts a value of S bytes (S = 8-byte version + 4-byte checksum + value) on ceil((S + 16) / P)
# overflow pages.
# Sizes of the user's value around each line: a whole page, one byte over, the P/8 limit and one
# byte past it, on one to three pages.
SIZES = sorted({n for pages in (1, 2, 3) for base in (pages * P - 16 - ENTRY_HEAD,)
                for n in (base - 1, base, base + 1, base + 24, base + P // 8, base + P // 8 + 1)}
               | {0, 1, 100, 2000, 4096, 8192, 100_000})


def _value(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


def _puts(values: dict[bytes, bytes], first: int) -> list[tuple[bytes, bytes]]:
    return [(k, first.to_bytes(8, "little") + v) for k, v in values.items()]


def _apply(st: State, lsn: int, puts: list[tuple[bytes, bytes]], deletes: tuple[bytes, ...] = ()) -> None:
    st.apply((lsn, lsn, 1, puts, list(deletes), []), lambda: lsn)


def _db_stats(state_dir: Path) -> dict[str, dict[str, int]]:
    env = lmdb.open(str(state_dir), readonly=True, max_dbs=4, lock=False, map_size=DEFAULT_MAP_SIZE)
    try:
        assert env.stat()["psize"] == P  # the sizes above assume it
        with env.begin() as txn:
            return {name: txn.stat(env.open_db(name.encode(), txn=txn, create=False))
                    for name in ("data", "tail")}
    finally:
        env.close()


def _expected_tail(n: int) -> int:
    """The rule of native/lmdbcall.c `split_tail`, for a user value of n bytes."""
    stored = ENTRY_HEAD + n
    last = (stored + 16) % P
    return last if stored + 16 > P and 0 < last <= P // 8 else 0


def test_every_size_around_the_page_boundaries_reads_back_whole_through_get_scan_and_snapshots(
        tmp_path: Path) -> None:
    values = {b"k%07d" % n: _value(n, n) for n in SIZES}
    st = State(str(tmp_path / "state"))
    try:
        _apply(st, 1, _puts(values, 1))
        for k, v in values.items():
            assert st.get(k) == (1, v), (k, len(v))
        assert {k: v for k, _, v in st.scan_chunk(b"k", None, 1000)} == values
        snap = st.snapshot()
        try:
            assert {k: (ver, v) for k, ver, v in snap.items(b"k")} == {k: (1, v) for k, v in values.items()}
            assert all(snap.get(k) == (1, v) for k, v in values.items())
        finally:
            snap.close()
    finally:
        st.close()
    stats = _db_stats(tmp_path / "state")
    assert stats["tail"]["entries"] == sum(1 for n in SIZES if _expected_tail(n)) >= 6


def test_a_4_kib_value_takes_one_overflow_page_and_a_value_past_the_line_takes_two(tmp_path: Path) -> None:
    n = 64
    for size, pages_each, tails in ((4096, 1, n), (4600, 2, 0), (P - 16 - ENTRY_HEAD, 1, 0)):
        d = tmp_path / str(size)
        st = State(str(d))
        try:
            _apply(st, 1, _puts({b"k%03d" % i: _value(size, i) for i in range(n)}, 1))
        finally:
            st.close()
        stats = _db_stats(d)
        assert stats["data"]["overflow_pages"] == n * pages_each, size
        assert stats["tail"]["entries"] == tails, size


def test_overwrites_and_deletes_leave_no_tail_behind(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    keys = [b"k%03d" % i for i in range(40)]
    try:
        _apply(st, 1, _puts({k: _value(4096, i) for i, k in enumerate(keys)}, 1))
        # 0..9 become small, 10..19 stay split with new bytes, 20..29 are deleted, 30..39 untouched
        _apply(st, 2, _puts({k: b"small" for k in keys[:10]} | {k: _value(8184, 7) for k in keys[10:20]}, 2),
               tuple(keys[20:30]))
        assert [st.get(k) for k in keys[:10]] == [(2, b"small")] * 10
        assert [st.get(k) for k in keys[10:20]] == [(2, _value(8184, 7))] * 10
        assert [st.get(k) for k in keys[20:30]] == [None] * 10
        assert [st.get(k) for k in keys[30:]] == [(1, _value(4096, 30 + i)) for i in range(10)]
        # and back: a small value becomes split again
        _apply(st, 3, _puts({keys[0]: _value(4096, 99)}, 3))
        assert st.get(keys[0]) == (3, _value(4096, 99))
    finally:
        st.close()
    assert _db_stats(tmp_path / "state")["tail"]["entries"] == 1 + 10 + 10


def test_a_split_value_whose_tail_is_missing_is_a_corruption_error(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with wal.open(tmp_path / "s") as store:
        store.put(b"big", _value(4096))
        store.put(b"small", b"x")
    env = lmdb.open(str(tmp_path / "s" / "state"), max_dbs=4, map_size=DEFAULT_MAP_SIZE)
    with env.begin(write=True) as txn:
        assert txn.delete(b"big", db=env.open_db(b"tail", txn=txn, create=False))
    env.close()
    with pytest.raises(CorruptionError, match="tail is missing"):  # the open's walk of a small state
        wal.open(tmp_path / "s", readonly=True)
    monkeypatch.setattr(wal.store.state, "VERIFY_ON_OPEN_BYTES", 0)  # no walk: each read finds it
    with wal.open(tmp_path / "s", readonly=True) as reader:
        assert reader.get(b"small") == b"x"
        with pytest.raises(CorruptionError, match="tail is missing"):
            reader.get(b"big")
        with pytest.raises(CorruptionError, match="tail is missing"):
            list(reader.scan(b""))


@pytest.mark.parametrize("bit", [63, 62])
def test_a_version_with_a_flag_bit_set_is_refused_before_anything_is_written(tmp_path: Path, bit: int) -> None:
    st = State(str(tmp_path / "state"))
    try:
        bad = (1 << bit).to_bytes(8, "little") + b"v"
        with pytest.raises(ValueError, match="below 2\\^62"):
            _apply(st, 1, [(b"a", (1).to_bytes(8, "little") + b"ok"), (b"b", bad)])
        with pytest.raises(ValueError, match="below 2\\^62"):
            _apply(st, 1, [(b"short", b"1234567")])
        assert st.applied_lsn() == 0 and st.get(b"a") is None
    finally:
        st.close()


# ---- format 2 -> 3 ------------------------------------------------------------------------------------


def _as_format_2(path: Path) -> None:
    """What format 2 left on disk: the same files without checksums or the `tail` database,
    STORE saying 2."""
    strip_entry_checksums(path)
    env = lmdb.open(str(path / "state"), max_dbs=4, map_size=DEFAULT_MAP_SIZE)
    with env.begin(write=True) as txn:
        tail = env.open_db(b"tail", txn=txn, create=False)
        assert txn.stat(tail)["entries"] == 0
        txn.drop(tail, delete=True)
    env.close()
    (path / "STORE").write_text(json.dumps({"format": "agentwal-store", "version": 2}) + "\n")


def _tail_exists(state_dir: Path) -> bool:
    env = lmdb.open(str(state_dir), readonly=True, max_dbs=4, lock=False, map_size=DEFAULT_MAP_SIZE)
    try:
        with env.begin() as txn:
            return txn.get(b"tail") is not None  # named databases are keys of the main one
    finally:
        env.close()


def test_a_format_2_store_is_read_and_upgraded_by_its_first_writable_open(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        for i in range(20):
            store.put(f"k{i}", b"v%d" % i)
    _as_format_2(tmp_path)
    assert not _tail_exists(tmp_path / "state")
    with wal.open(tmp_path, readonly=True) as reader:  # read as it is, nothing written
        assert reader.get("k7") == b"v7"
    assert json.loads((tmp_path / "STORE").read_text())["version"] == 2
    with wal.open(tmp_path) as store:
        assert json.loads((tmp_path / "STORE").read_text())["version"] == STORE_VERSION
        assert [store.get(f"k{i}") for i in range(20)] == [b"v%d" % i for i in range(20)]
        store.put("big", _value(4096))
    assert _db_stats(tmp_path / "state")["tail"]["entries"] == 1
    with wal.open(tmp_path, readonly=True) as reader:
        assert reader.get("big") == _value(4096) and reader.get("k19") == b"v19"


_WRITER = """
import sys, wal
with wal.open(sys.argv[1]) as store:
    store.put(b"big", bytes(4096))
"""


def test_a_read_only_handle_opened_on_format_2_says_to_reopen_when_a_writer_has_split_a_value(
        tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"old", b"v")
    _as_format_2(tmp_path)
    with wal.open(tmp_path, readonly=True) as reader:
        assert reader.get(b"old") == b"v"
        subprocess.run([sys.executable, "-c", _WRITER, str(tmp_path)], check=True, timeout=60)
        assert reader.get(b"old") == b"v"  # whole values are still read
        with pytest.raises(StateError, match="open the store again"):
            reader.get(b"big")
    with wal.open(tmp_path, readonly=True) as reader:
        assert reader.get(b"big") == bytes(4096)
