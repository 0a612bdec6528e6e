"""Every value read is verified: a CRC-32C of key, version and value in each state entry (FORMAT.md
§16, "Entry checksums"), checked in C on every read path; damage is a CorruptionError naming the key
and data.mdb, never a wrong value."""

from __future__ import annotations

import json
from pathlib import Path

import crcmod.predefined
import lmdb
import pytest
from legacy_state import set_store_version, strip_entry_checksums, strip_idem_checksums

import wal
import wal.store.state
from wal import ops
from wal.store.state import DEFAULT_MAP_SIZE, VERIFY_ON_OPEN_BYTES

_crc32c = crcmod.predefined.mkCrcFun("crc-32c")
VALUE = b"the value that must never come back wrong " * 4


def _raw_entries(root: Path, db: bytes = b"data") -> dict[bytes, bytes]:
    """Database `db` of the state as stored (py-lmdb, not agentwal)."""
    env = lmdb.open(str(root / "state"), readonly=True, max_dbs=4, lock=False, map_size=DEFAULT_MAP_SIZE)
    try:
        with env.begin() as txn:
            return dict(txn.cursor(db=env.open_db(db, txn=txn, create=False)))
    finally:
        env.close()


def _flip_in_file(root: Path, needle: bytes, at: int = 0) -> None:
    """Flip one byte of the only occurrence of `needle` in data.mdb (at offset `at` within it)."""
    path = root / "state" / "data.mdb"
    data = bytearray(path.read_bytes())
    where = data.find(needle)
    assert where >= 0 and data.find(needle, where + 1) < 0, "needle must occur exactly once"
    data[where + at] ^= 0x01
    path.write_bytes(bytes(data))


def test_an_entry_is_version_checksum_and_value_as_format_md_says(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        lsn = store.put(b"a", b"1")
    raw = _raw_entries(tmp_path)[b"a"]
    version = int.from_bytes(raw[:8], "little")
    assert version == lsn | (1 << 62)  # bit 62: the entry carries a checksum
    assert raw[8:12] == _crc32c(b"a" + lsn.to_bytes(8, "little") + b"1").to_bytes(4, "little")
    assert raw[12:] == b"1"


def _damaged_store(tmp_path: Path) -> Path:
    with wal.open(tmp_path) as store:
        store.put(b"good", b"fine")
        store.put(b"victim", VALUE)
        store.checkpoint()
    # The log still holds the commits; a state-only read-only open must catch the damage itself.
    _flip_in_file(tmp_path, VALUE, at=7)
    return tmp_path


@pytest.mark.parametrize("read", ["get", "version", "get_many", "scan", "snapshot_get", "snapshot_scan"])
def test_a_flipped_value_byte_is_a_corruption_error_naming_the_key_on_every_read_path(
        tmp_path: Path, read: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _damaged_store(tmp_path)
    monkeypatch.setattr(wal.store.state, "VERIFY_ON_OPEN_BYTES", 0)  # no walk at open: each read must check
    store = wal.open(root, readonly=True)
    try:
        assert store.get(b"good") == b"fine"
        with pytest.raises(wal.CorruptionError, match=r"key b'victim': checksum mismatch") as info:
            if read == "get":
                store.get(b"victim")
            elif read == "version":
                store.version(b"victim")
            elif read == "get_many":
                store.get_many([b"good", b"victim"])
            elif read == "scan":
                list(store.scan())
            elif read == "snapshot_get":
                with store.snapshot() as snap:
                    snap.get(b"victim")
            else:
                with store.snapshot() as snap:
                    list(snap.scan(b"v"))
        assert info.value.path == str(root / "state" / "data.mdb") and info.value.reason == "state damaged"
    finally:
        store.close()


def test_an_open_of_a_small_state_verifies_every_entry(tmp_path: Path) -> None:
    root = _damaged_store(tmp_path)
    assert (root / "state" / "data.mdb").stat().st_size <= VERIFY_ON_OPEN_BYTES
    for readonly in (True, False):
        with pytest.raises(wal.CorruptionError, match="victim"):
            wal.open(root, readonly=readonly)


def test_agentwal_verify_reports_a_damaged_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _damaged_store(tmp_path)
    monkeypatch.setattr(wal.store.state, "VERIFY_ON_OPEN_BYTES", 0)  # the open lets it through; verify finds it
    report = ops.verify(str(root))
    assert any(p.area == "state" and "victim" in p.message for p in report.problems)


def test_an_entry_without_a_checksum_in_a_format_4_state_is_damage(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
    env = lmdb.open(str(tmp_path / "state"), max_dbs=4, map_size=DEFAULT_MAP_SIZE)
    with env.begin(write=True) as txn:
        data = env.open_db(b"data", txn=txn, create=False)
        raw = txn.get(b"k", db=data)
        version = int.from_bytes(raw[:8], "little") & ~(1 << 62)
        txn.put(b"k", version.to_bytes(8, "little") + raw[12:], db=data)  # flag and checksum gone
    env.close()
    with pytest.raises(wal.CorruptionError, match="without a checksum"):
        wal.open(tmp_path, readonly=True)


def test_a_format_3_store_is_read_unchecked_then_upgraded_so_every_entry_is_checked(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store, store.transaction() as tx:
        for i in range(500):
            tx.put(b"k%04d" % i, b"v%d" % i * (1 + i % 700))  # whole and split entries
    strip_entry_checksums(tmp_path)
    set_store_version(tmp_path, 3)
    assert not any(int.from_bytes(r[:8], "little") >> 62 for r in _raw_entries(tmp_path).values())
    with wal.open(tmp_path, readonly=True) as reader:
        assert reader.get(b"k0499") == b"v499" * 500
    with wal.open(tmp_path) as store:
        assert store.get(b"k0007") == b"v7" * 8
    assert all(int.from_bytes(r[:8], "little") & (1 << 62) for r in _raw_entries(tmp_path).values())
    with wal.open(tmp_path, readonly=True) as reader:
        assert [reader.get(b"k%04d" % i) for i in range(500)] == [b"v%d" % i * (1 + i % 700) for i in range(500)]


@pytest.mark.parametrize("key", [b"applied_lsn", b"durable_seen"])
def test_a_flipped_bit_in_a_metadata_value_is_a_corruption_error_not_a_skipped_commit(tmp_path: Path,
                                                                                       key: bytes) -> None:
    """applied_lsn 30 read as 31 would skip commit 31 on replay without a trace: metadata values
    carry a checksum too (FORMAT.md §16)."""
    with wal.open(tmp_path) as store:
        for i in range(40):
            store.put(b"k%d" % i, b"v")
    env = lmdb.open(str(tmp_path / "state"), max_dbs=4, map_size=DEFAULT_MAP_SIZE)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn, create=False)
        raw = bytearray(txn.get(key, db=meta))
        assert len(raw) == 12 and raw[8:] == _crc32c(key + bytes(raw[:8])).to_bytes(4, "little")
        raw[0] ^= 0x01
        txn.put(key, bytes(raw), db=meta)
    env.close()
    for readonly in (True, False):
        with pytest.raises(wal.CorruptionError, match=f"key {key!r}: a metadata value whose checksum"):
            wal.open(tmp_path, readonly=readonly)


# ---- idempotency entries (store format 6) ----------------------------------------------------------


def _raw_idem(root: Path) -> dict[bytes, bytes]:
    return _raw_entries(root, b"idem")


def _commit_once(store: wal.Store, idem: bytes, key: bytes) -> tuple[int, bool]:
    with store.transaction(idempotency_key=idem) as tx:
        tx.put(key, b"v")
    assert tx.lsn is not None
    return tx.lsn, tx.deduplicated


def test_an_idempotency_entry_is_lsn_time_and_checksum_as_format_md_says(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        lsn, _ = _commit_once(store, b"req-A", b"k")
    raw = _raw_idem(tmp_path)[b"req-A"]
    assert len(raw) == 20 and int.from_bytes(raw[:8], "little") == lsn
    assert raw[16:] == _crc32c(b"req-A" + raw[:16]).to_bytes(4, "little")


def _idem_damaged(tmp_path: Path) -> Path:
    """A store whose one idempotency entry, b"req-A", has had its key's last bit flipped in
    data.mdb: it now reads as b"req-@", a key no commit used."""
    with wal.open(tmp_path) as store:
        _commit_once(store, b"req-A", b"k")
        store.checkpoint()
    _flip_in_file(tmp_path, b"req-A", at=4)
    return tmp_path


def test_a_flipped_bit_in_an_idempotency_entry_is_a_corruption_error_not_a_dropped_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its checksum the damaged entry made the first commit under b"req-@" read as a retry:
    acknowledged with another commit's LSN, and nothing written."""
    root = _idem_damaged(tmp_path)
    monkeypatch.setattr(wal.store.state, "VERIFY_ON_OPEN_BYTES", 0)  # no walk at open: the lookup must check
    with wal.open(root) as store:
        with pytest.raises(wal.CorruptionError, match=r"key b'req-@': an idempotency entry whose checksum") as info:
            _commit_once(store, b"req-@", b"new")
        assert info.value.path == str(root / "state" / "data.mdb") and info.value.reason == "state damaged"
        assert store.get(b"new") is None


def test_a_damaged_idempotency_entry_is_found_by_the_open_and_by_verify(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    root = _idem_damaged(tmp_path)
    for readonly in (True, False):
        with pytest.raises(wal.CorruptionError, match="req-@"):
            wal.open(root, readonly=readonly)
    monkeypatch.setattr(wal.store.state, "VERIFY_ON_OPEN_BYTES", 0)
    report = ops.verify(str(root))
    assert any(p.area == "state" and "req-@" in p.message and "idempotency" in p.message for p in report.problems)


def test_expiry_meeting_a_damaged_idempotency_entry_stops_the_store_rather_than_guess(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _idem_damaged(tmp_path)
    monkeypatch.setattr(wal.store.state, "VERIFY_ON_OPEN_BYTES", 0)
    store = wal.open(root)
    try:
        with pytest.raises(wal.CorruptionError, match="req-@"):
            store.checkpoint()  # expires idempotency keys: it cannot tell the damaged one's age
        with pytest.raises(wal.FailedError):
            store.put(b"after", b"v")
    finally:
        store.close()


def _format_5_store_with_keys(root: Path, n: int = 300) -> dict[bytes, int]:
    """A store of format 5 (idempotency entries of 16 bytes) holding `n` commits made with keys
    b"req-000".. ; returns each key's LSN."""
    with wal.open(root) as store:
        first = {b"req-%03d" % i: _commit_once(store, b"req-%03d" % i, b"k%d" % i)[0] for i in range(n)}
    strip_idem_checksums(root)
    set_store_version(root, 5)
    return first


def test_a_format_5_store_keeps_its_idempotency_keys_and_is_upgraded_so_each_is_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _format_5_store_with_keys(tmp_path)
    assert {len(v) for v in _raw_idem(tmp_path).values()} == {16}
    with wal.open(tmp_path, readonly=True) as reader:
        assert reader.get(b"k7") == b"v"
    monkeypatch.setattr(wal.store.state, "_UPGRADE_BATCH", 64)  # several transactions
    with wal.open(tmp_path) as store:
        assert _commit_once(store, b"req-007", b"again") == (first[b"req-007"], True)
    raw = _raw_idem(tmp_path)
    assert len(raw) == 300 and all(len(v) == 20 and v[16:] == _crc32c(k + v[:16]).to_bytes(4, "little")
                                   for k, v in raw.items())
    assert json.loads((tmp_path / "STORE").read_text())["version"] == 6
    with wal.open(tmp_path) as store:
        assert _commit_once(store, b"req-299", b"again") == (first[b"req-299"], True)


def test_an_idempotency_entry_without_a_checksum_in_a_format_6_state_is_damage(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        _commit_once(store, b"req-A", b"k")
    env = lmdb.open(str(tmp_path / "state"), max_dbs=4, map_size=DEFAULT_MAP_SIZE)
    with env.begin(write=True) as txn:
        idem = env.open_db(b"idem", txn=txn, create=False)
        txn.put(b"req-A", txn.get(b"req-A", db=idem)[:16], db=idem)  # checksum gone, marker kept
    env.close()
    with pytest.raises(wal.CorruptionError, match="req-A': an idempotency entry without a checksum"):
        wal.open(tmp_path, readonly=True)


def test_an_upgrade_of_idempotency_entries_cut_short_reads_both_kinds_and_the_next_open_finishes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _format_5_store_with_keys(tmp_path)
    # As if the process died after the upgrade's first transaction (100 entries).
    monkeypatch.setattr(wal.store.state.State, "_check_every_idem", lambda self: self._env.check_idem(None, 100))
    with wal.open(tmp_path) as store:
        for key in (b"req-005", b"req-250"):  # one rewritten, one not yet
            assert _commit_once(store, key, b"again") == (first[key], True)
    assert sorted(len(v) for v in _raw_idem(tmp_path).values()) == [16] * 200 + [20] * 100
    monkeypatch.undo()
    with wal.open(tmp_path) as store:
        assert _commit_once(store, b"req-250", b"again") == (first[b"req-250"], True)
    assert {len(v) for v in _raw_idem(tmp_path).values()} == {20}
