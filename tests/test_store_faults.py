"""Injected I/O failures through the store (README, "Failure policy"; invariant I5): nothing acknowledged is
lost, the store stops cleanly, and once the fault is gone a reopen gives a consistent, usable store."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

import wal
import wal.store.state
from wal.drill import failpoints as testing


@pytest.fixture(autouse=True)
def _disarm() -> object:
    yield
    testing.clear()


def _fill(store: wal.Store, n: int, prefix: str = "k") -> dict[bytes, bytes]:
    acked = {}
    for i in range(n):
        key, value = f"{prefix}{i:04d}".encode(), b"v%d" % i * 10
        store.put(key, value)
        acked[key] = value
    return acked


@pytest.mark.parametrize("durability", [{"durability": "sync"}, {"durability": "interval", "rpo_ms": 50}])
def test_enospc_in_the_middle_of_a_commit_loses_nothing_acknowledged_and_the_store_goes_on_once_space_returns(
        tmp_path: Path, durability: dict[str, object]) -> None:
    store = wal.open(tmp_path, **durability)  # type: ignore[arg-type]
    acked = _fill(store, 50)
    with store.transaction() as tx:  # a transaction acknowledged just before the fault
        tx.put("t/a", b"1")
        tx.put("t/b", b"2")
    acked.update({b"t/a": b"1", b"t/b": b"2"})
    testing.arm("write", errno.ENOSPC, partial=True, repeat=True)  # half of each write lands, then ENOSPC
    with pytest.raises(wal.NoSpaceError, match="No space left"), store.transaction() as tx:
        tx.put("lost/a", b"x" * 5000)
        tx.put("lost/b", b"y" * 5000)
    with pytest.raises(wal.NoSpaceError):  # still full: refused clearly
        store.put("refused", b"1")
    assert store.get("t/a") == b"1"  # reads still work
    testing.clear()  # space returns: the same store goes on, no reopen needed
    store.put("after", b"1")
    assert store.get("after") == b"1"
    store.close()
    with wal.open(tmp_path) as again:
        rest = {k: v for k, v in again.scan() if not k.startswith((b"lost/", b"refused", b"after"))}
        assert rest == acked
        lost = dict(again.scan(b"lost/"))
        assert lost in ({}, {b"lost/a": b"x" * 5000, b"lost/b": b"y" * 5000})  # all or nothing (I3)
        assert again.get("after") == b"1"


def test_fsync_eio_fail_stops_the_store_and_a_reopen_recovers_every_acknowledged_commit(tmp_path: Path) -> None:
    store = wal.open(tmp_path)
    acked = _fill(store, 30)
    testing.arm("fsync", errno.EIO)
    with pytest.raises(wal.FailedError, match="Input/output error"):
        store.put("unacked", b"?")
    testing.clear()
    with pytest.raises(wal.FailedError, match="a failed fsync or write is never retried"):  # nor trusted (I5)
        store.put("later", b"1")
    with pytest.raises(wal.FailedError):
        store.close()
    with wal.open(tmp_path) as again:
        got = dict(again.scan(b"k"))
        assert got == acked
        assert again.get("unacked") in (None, b"?")  # never acknowledged: may or may not be there
        assert again.watermarks.applied <= again.watermarks.durable


def test_a_failed_segment_creation_stops_writes_and_the_log_reopens(tmp_path: Path) -> None:
    store = wal.open(tmp_path, segment_bytes=1 << 16)
    acked = _fill(store, 20)
    testing.arm("rename", errno.EIO)  # the next new segment cannot be put in place
    with pytest.raises(wal.FailedError):
        for i in range(2000):  # enough to roll to a new segment
            key = f"r{i:05d}".encode()
            store.put(key, b"z" * 100)
            acked[key] = b"z" * 100
    testing.clear()
    with pytest.raises(wal.FailedError):
        store.close()
    with wal.open(tmp_path, segment_bytes=1 << 16) as again:
        assert {k: v for k, v in again.scan() if k in acked} == acked
        again.put("after", b"ok")


CHILD = """
import os, sys, wal
store = wal.open(sys.argv[1], apply_interval_ms=3_600_000)   # the materializer stays asleep
for i in range(10):
    store.put(f"k{i}", b"v")                                  # LSNs 1..10, all durable (sync)
store._apply_ready(limit=9)      # LSNs 1..9 reach LMDB while 10 is already durable: mark = 10
os._exit(0)                      # a kill: LSN 10 is durable in the log only
"""


def test_a_log_tail_zeroed_below_the_durable_mark_is_corruption_not_silent_loss(tmp_path: Path) -> None:
    """A zeroed tail looks like unwritten space; the state's record of the durable LSN it last saw
    makes the loss of durable records visible (strict), or reported (recovery="truncate")."""
    subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], check=True)
    seg = sorted((tmp_path / "log").glob("*.wal"))[-1]
    data = bytearray(seg.read_bytes())
    with wal.Log.open(tmp_path / "log", readonly=True) as log:
        assert [lsn for lsn, _ in log.read()] == list(range(1, 11))
    offsets = [off for off in range(64, len(data), 8) if data[off + 8 : off + 16] == (10).to_bytes(8, "little")
               and data[off + 16] == 1]
    start = offsets[0]  # the DATA record of LSN 10; zero it and everything after
    end = len(data.rstrip(b"\0"))
    data[start:end] = bytes(end - start)
    seg.write_bytes(bytes(data))
    with pytest.raises(wal.CorruptionError) as exc:
        wal.open(tmp_path)
    assert exc.value.reason == "log behind durable mark"
    with wal.open(tmp_path, recovery="truncate") as store:
        assert store.stats()["lost_durable_lsns"] == (10, 10)
        assert store.get("k8") == b"v" and store.get("k9") is None
        store.put("after", b"1")
    with wal.open(tmp_path) as store:  # strict opens again: the mark was moved to what is left
        assert store.get("after") == b"1"


def test_a_state_entry_without_its_version_is_corruption_at_open_and_when_scanned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The store checks the shape of what it reads back: the open's walk of a small state finds it,
    # and so does a scan of a state too large for that walk.
    store = tmp_path / "s"
    with wal.open(store) as s:
        s.put(b"a", b"1")
    env = lmdb.open(str(store / "state"), max_dbs=4, subdir=True)
    with env.begin(write=True, db=env.open_db(b"data")) as txn:
        txn.put(b"b", b"xyz")  # no 8-byte version
    env.close()
    with pytest.raises(wal.CorruptionError, match="8-byte version"):
        wal.open(store, readonly=True)
    monkeypatch.setattr(wal.store.state, "VERIFY_ON_OPEN_BYTES", 0)
    with wal.open(store, readonly=True) as s, pytest.raises(wal.CorruptionError, match="8-byte version"):
        list(s.scan())
