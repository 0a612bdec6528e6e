"""The LMDB map sized from the file and grown on MDB_MAP_FULL (wal/store/state.py, native/lmdbcall.c
"The map's size"): the writer grows it between transactions with its checkpoint pin and any
snapshot held open, and a read-only opener in another process adopts the grown map
(MDB_MAP_RESIZED) instead of failing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import wal
from wal.store import state as state_mod
from wal.store.state import State


def _batch(first: int, n: int, size: int) -> tuple[int, int, int, list[tuple[bytes, bytes]], list[bytes],
                                                    list[tuple[bytes, int, int]]]:
    puts = [(b"k%08d" % lsn, lsn.to_bytes(8, "little") + bytes([lsn % 251]) * size)
            for lsn in range(first, first + n)]
    return first, first + n - 1, n, puts, [], []


def test_the_map_grows_while_a_snapshot_is_open_and_the_snapshot_still_reads_its_commit(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"), map_size=1 << 20)
    try:
        st.apply(_batch(1, 10, 100), lambda: 10)
        snap = st.snapshot()
        before = st.stat()["state_map_bytes"]
        st.apply(_batch(11, 3000, 1000), lambda: 3010)  # ~3 MB: the map doubles at least twice
        assert st.stat()["state_map_bytes"] >= 4 * before and st.map_grows >= 2
        assert snap.applied_lsn() == 10 and snap.entries() == 10  # its own commit, across the remaps
        assert snap.get(b"k%08d" % 5) is not None and snap.get(b"k%08d" % 11) is None
        snap.close()
        assert st.get(b"k%08d" % 3010) is not None
        st.checkpoint()
    finally:
        st.close()


def test_a_store_grows_its_map_and_a_read_only_opener_in_another_process_follows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_mod, "MIN_MAP_SIZE", 1 << 20)  # start tiny: grow within the test
    path = tmp_path / "store"
    code = textwrap.dedent(f"""
        import sys, wal
        from wal.store import state
        state.MIN_MAP_SIZE = 1 << 20
        with wal.open({str(path)!r}, readonly=True) as ro:
            print("opened", ro.stats()["state_map_bytes"], flush=True)
            sys.stdin.readline()  # the writer grows the file far past this map meanwhile
            got = dict(ro.scan())
            print("read", len(got), sum(len(v) for v in got.values()), ro.stats()["state_map_bytes"], flush=True)
    """)
    with wal.open(path) as store:
        for i in range(100):
            store.put(b"k%05d" % i, b"x" * 1000)
        store.checkpoint()
        reader = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert reader.stdout is not None and reader.stdin is not None
        line = reader.stdout.readline()
        assert line.startswith("opened"), line + (reader.stderr.read() if reader.stderr else "")
        reader_map = int(line.split()[1])
        for start in range(100, 6000, 100):
            with store.transaction() as tx:
                for i in range(start, start + 100):
                    tx.put(b"k%05d" % i, b"x" * 1000)
        store.checkpoint()
        grown = store.stats()["state_map_bytes"]
        assert grown > reader_map and store.stats()["state_map_grows"] >= 2
        reader.stdin.write("go\n")
        reader.stdin.flush()
        out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    _, count, total, after = out.split()
    assert int(count) == 6000 and int(total) == 6000 * 1000
    assert int(after) >= grown > reader_map  # it adopted the writer's map (MDB_MAP_RESIZED)
