"""The state durable at checkpoints (store format 2, FORMAT.md §16, wal/store/state.py).

LMDB runs with MDB_NOSYNC; each checkpoint pins its snapshot, fdatasyncs data.mdb and saves the
snapshot's meta page in state/checkpoint.meta. These tests drive each branch of the open:

- closed cleanly: opened as it is;
- not closed cleanly, same boot (a process kill): opened as it is, then checkpointed;
- not closed cleanly, after a restart: reopened at the saved snapshot, the log replayed from it;
  skipped while another process has the environment open;
- read-only after a restart: refused until a writer has recovered it;
- damage (the checkpoint file, or meta pages no crash explains) and a creation cut short.

A restart is simulated the way wal.drill.crashsim does it: a new $AGENTWAL_BOOT_ID. Whether the pages a
restore relies on really were kept (the pin) is what the random power cuts of
tests/test_crash_powercut.py check, with real lost writes; these tests keep the page cache.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import wal
from wal._fs import BOOT_ID_ENV
from wal.store.state import CHECKPOINT_FILE, DATA_FILE, State, StateError, read_checkpoint

UNCLEAN_CHILD = """
import os, sys, wal
store = wal.open(sys.argv[1], apply_interval_ms=3_600_000)  # the materializer stays asleep
for i in range(100):
    store.put(f"k{i}", b"before")
store.checkpoint()                                          # durable state: LSNs 1..100
for i in range(100, 300):
    store.put(f"k{i}", b"after")
store.put("k0", b"overwritten")
store._apply_ready()                # 101..301 in LMDB, not synced: newer than the checkpoint
print(store.watermarks.durable, flush=True)
os._exit(0)                         # a kill: no close, no checkpoint
"""


def unclean_store(path: Path) -> int:
    """A store whose LMDB state is newer than its checkpoint, left by a killed writer; returns
    the last durable LSN."""
    out = subprocess.run([sys.executable, "-c", UNCLEAN_CHILD, str(path)], check=True, capture_output=True,
                         text=True).stdout
    return int(out.split()[-1])


def expected_contents(store: wal.Store) -> None:
    assert store.get("k0") == b"overwritten"
    assert [store.get(f"k{i}") for i in range(1, 100)] == [b"before"] * 99
    assert [store.get(f"k{i}") for i in range(100, 300)] == [b"after"] * 200


def newest_txnid(state: Path) -> int:
    raw = (state / DATA_FILE).read_bytes()[:8192]
    return max(struct.unpack_from("<Q", raw, slot * 4096 + 144)[0] for slot in (0, 1))


def test_every_checkpoint_and_the_close_save_the_newest_snapshot(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with wal.open(tmp_path) as store:
        first = read_checkpoint(str(state))
        assert first is not None and first.applied_lsn == 0
        for i in range(10):
            store.put(f"k{i}", b"v")
        assert store.checkpoint() == 10
        saved = read_checkpoint(str(state))
        assert saved is not None and saved.applied_lsn == 10 and saved.txnid > first.txnid
        assert saved.txnid == newest_txnid(state)
        store.put("k10", b"v")
    closed = read_checkpoint(str(state))
    assert closed is not None and closed.applied_lsn == 11 and closed.txnid == newest_txnid(state)
    with wal.open(tmp_path) as store:  # clean: nothing restored, nothing replayed
        assert store.stats()["state_restored"] == 0 and store.stats()["records_replayed"] == 0


def test_after_a_kill_the_state_is_taken_as_it_is_and_checkpointed_at_once(tmp_path: Path) -> None:
    last = unclean_store(tmp_path)
    before = read_checkpoint(str(tmp_path / "state"))
    assert before is not None and before.applied_lsn == 100 and newest_txnid(tmp_path / "state") > before.txnid
    with wal.open(tmp_path) as store:
        stats = store.stats()
        assert stats["state_restored"] == 0 and stats["records_replayed"] == 0  # the page cache held it all
        after = read_checkpoint(str(tmp_path / "state"))
        assert after is not None and after.applied_lsn == last and after.txnid > before.txnid
        expected_contents(store)


def test_after_a_restart_the_state_is_reopened_at_its_checkpoint_and_the_log_replayed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    last = unclean_store(tmp_path)
    monkeypatch.setenv(BOOT_ID_ENV, "after-a-restart")
    with wal.open(tmp_path) as store:
        stats = store.stats()
        assert stats["state_restored"] == 1
        assert stats["records_replayed"] == last - 100  # from the checkpoint's applied LSN on
        assert store.watermarks.applied == last
        expected_contents(store)
    with wal.open(tmp_path) as store:  # the open checkpointed where it ended up: clean now
        assert store.stats()["state_restored"] == 0 and store.stats()["records_replayed"] == 0
        expected_contents(store)


def test_a_restore_is_skipped_while_another_process_has_the_state_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another opener proves the machine did not restart since it opened (its page cache is whole),
    and rewriting meta pages under its read transactions would hand it reused pages."""
    unclean_store(tmp_path)
    reader = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, wal
            with wal.open(sys.argv[1], readonly=True) as store:
                assert store.get("k299") == b"after"
                print("open", flush=True)
                sys.stdin.readline()
        """), str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "open\n"
        monkeypatch.setenv(BOOT_ID_ENV, "a-restart-the-reader-disproves")
        with wal.open(tmp_path) as store:
            assert store.stats()["state_restored"] == 0 and store.stats()["records_replayed"] == 0
            expected_contents(store)
    finally:
        assert reader.stdin is not None
        reader.stdin.write("\n")
        reader.stdin.close()
        assert reader.wait(30) == 0


def test_a_read_only_open_after_a_restart_is_refused_until_a_writer_recovered_the_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unclean_store(tmp_path)
    with wal.open(tmp_path, readonly=True) as reader:  # same boot: the page cache holds it all
        assert reader.get("k299") == b"after"
    monkeypatch.setenv(BOOT_ID_ENV, "after-a-restart")
    with pytest.raises(StateError, match=r"not closed cleanly before the machine restarted.*Open the store for"):
        wal.open(tmp_path, readonly=True)
    wal.open(tmp_path).close()
    with wal.open(tmp_path, readonly=True) as reader:
        expected_contents(reader)


def test_a_damaged_checkpoint_file_is_a_corruption_error_and_changes_nothing(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put("k", b"v")
    ckp = tmp_path / "state" / CHECKPOINT_FILE
    good = ckp.read_bytes()
    for offset in (0, 9, 20, 40, 100, len(good) - 1):
        raw = bytearray(good)
        raw[offset] ^= 0x01
        ckp.write_bytes(bytes(raw))
        for readonly in (False, True):
            with pytest.raises(wal.CorruptionError, match=r"checkpoint\.meta is damaged") as info:
                wal.open(tmp_path, readonly=readonly)
            assert info.value.reason == "bad checkpoint file" and info.value.path == str(ckp)
    ckp.write_bytes(good[:-10])
    with pytest.raises(wal.CorruptionError, match="bytes for a page"):
        wal.open(tmp_path)
    ckp.write_bytes(good)
    with wal.open(tmp_path) as store:
        assert store.get("k") == b"v"


def test_a_data_file_older_than_its_checkpoint_is_damage_not_a_crash(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put("k", b"1")
    older = (tmp_path / "state" / DATA_FILE).read_bytes()
    with wal.open(tmp_path) as store:
        store.put("k", b"2")
    (tmp_path / "state" / DATA_FILE).write_bytes(older)  # e.g. restored from an old copy
    with pytest.raises(wal.CorruptionError, match="older than the one its last checkpoint made durable") as info:
        wal.open(tmp_path)
    assert info.value.reason == "state damaged"


def test_a_state_cut_short_at_creation_is_created_again_and_one_that_lost_its_checkpoint_is_refused(
        tmp_path: Path) -> None:
    with wal.open(tmp_path / "a") as store:
        store.put("k", b"v")
    # A creation cut short: LMDB's files exist, the first checkpoint was never saved.
    (tmp_path / "a" / "state" / CHECKPOINT_FILE).unlink()
    fresh = tmp_path / "fresh"
    State(str(fresh)).close()
    (fresh / CHECKPOINT_FILE).unlink()
    state = State(str(fresh))  # holds only LMDB's first transaction: started again
    try:
        assert state.applied_lsn() == 0 and read_checkpoint(str(fresh)) is not None
    finally:
        state.close()
    # The store's state held commits: its lost checkpoint file is not a creation cut short.
    with pytest.raises(wal.CorruptionError, match=r"has no checkpoint\.meta") as info:
        wal.open(tmp_path / "a")
    assert info.value.reason == "missing checkpoint file"
    assert os.path.getsize(tmp_path / "a" / "state" / DATA_FILE) > 0  # nothing was deleted


def test_a_store_that_overwrites_its_keys_checkpoints_on_the_state_files_growth(tmp_path: Path) -> None:
    """LMDB reuses no page the last checkpoint pins, so between checkpoints every page a commit
    copies on write is new: small overwrites scattered over many keys grow the file far faster than
    the log, whose bytes alone would checkpoint too late. The store checkpoints on either."""
    rng = random.Random(7)
    keys = [f"key-{i:06d}" for i in range(20_000)]
    with wal.open(tmp_path, checkpoint_bytes=1 << 20, apply_interval_ms=2) as store:
        with store.transaction() as tx:
            for key in keys:
                tx.put(key, b"x" * 100)
        store.checkpoint()
        start = store.stats()
        for n in range(3000):
            store.put(rng.choice(keys), b"y%099d" % n)
        store.checkpoint()  # whatever is left applied
        end = store.stats()
    assert end["bytes_written"] - start["bytes_written"] < 1 << 20  # the log's own trigger never fired
    assert end["auto_checkpoints"] - start["auto_checkpoints"] >= 2
    grown = end["state_map_bytes_used"] - start["state_map_bytes_used"]
    assert grown < 6 << 20, f"the state grew by {grown} bytes for 3,000 overwrites of 100 B"


def test_readers_can_read_beside_a_writer_opened_after_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's open checkpoints in the new boot, so its later, unsynced transactions are not
    taken by a reader for pages a restart lost."""
    with wal.open(tmp_path) as store:
        store.put("a", b"1")
    monkeypatch.setenv(BOOT_ID_ENV, "after-a-restart")
    with wal.open(tmp_path, apply_interval_ms=3_600_000) as store:
        store.put("b", b"2")
        store._apply_ready()  # in LMDB, newer than the checkpoint, not synced
        saved = read_checkpoint(str(tmp_path / "state"))
        assert saved is not None and newest_txnid(tmp_path / "state") > saved.txnid
        reader = subprocess.run(
            [sys.executable, "-c", "import sys, wal\nwith wal.open(sys.argv[1], readonly=True) as s:\n"
             "    print(s.get('a'), s.get('b'))", str(tmp_path)], check=False, capture_output=True, text=True,
            timeout=60)
        assert reader.returncode == 0, reader.stderr
        assert reader.stdout.split() == ["b'1'", "b'2'"]


def test_a_checkpoint_of_a_state_whose_file_was_deleted_under_it_says_so(tmp_path: Path) -> None:
    """The store's directory removed while it is open (a temporary directory cleaned up before
    the store was closed): the checkpoint names the missing file, as a storage error, rather
    than failing on its own bookkeeping (it raised IndexError)."""
    with wal.open(tmp_path / "s") as store:
        store.put("k", b"v")
        os.unlink(tmp_path / "s" / "state" / DATA_FILE)
        with pytest.raises(wal.WalError, match=r"the state's file is gone.*data\.mdb"):
            store.checkpoint()
