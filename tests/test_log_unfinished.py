"""Records finished later (native/commit.c): a record appended with the end of its payload still
to come -- a sealed store's put, whose value is encrypted once the GIL is let go -- is never
written before it is finished, lands whole with a valid CRC, and fails the log (never reaching
the disk) when it cannot be finished."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from log_helpers import sync_during_a_refused_write

import wal
import wal.drill.failpoints
from wal._bindings import append_nowait, ffi, handle_address, lib


@pytest.fixture(autouse=True)
def _no_failpoint_left_armed() -> object:
    yield
    wal.drill.failpoints.clear()


def append_open(log: wal.Log, head: bytes, rest_len: int, level: int = lib.WAL_LEVEL_SYNC) -> tuple[int, Any]:
    """Append head + rest_len placeholder bytes, the placeholder to be finished later."""
    rec = ffi.new("wal_unfinished *")
    data = head + b"?" * rest_len
    lsn = lib.wal_log_append_unfinished(log._handle, data, len(data), len(head), level, rec)
    assert lsn > 0, lsn
    return int(lsn), rec


def finish(log: wal.Log, rec: Any, rest: bytes, ok: bool = True) -> int:
    return int(lib.wal_log_finish(log._handle, rec, rest, int(ok)))


def reopened_payloads(path: Path) -> list[tuple[int, bytes]]:
    """The log's records as recovery finds them on disk (every CRC checked)."""
    with wal.Log.open(path, durability="sync") as log:
        return list(log.read(1))


def test_a_record_finished_later_lands_with_its_final_bytes_and_a_valid_crc(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="sync") as log:
        lsn, rec = append_open(log, b"head:", 10)
        assert finish(log, rec, b"0123456789") == 0
        log.wait(lsn)
        assert list(log.read(1)) == [(1, b"head:0123456789")]
    assert reopened_payloads(tmp_path) == [(1, b"head:0123456789")]


def test_nothing_is_written_until_the_unfinished_record_is_finished(tmp_path: Path) -> None:
    # The batch holding the open record also holds a later, finished one: a writer takes it and
    # waits (spinning, then asleep) until the open record is finished.
    with wal.Log.open(tmp_path, durability="sync") as log:
        _, rec = append_open(log, b"open:", 4)
        assert append_nowait(handle_address(log._handle), b"after", lib.WAL_LEVEL_SYNC, lib.WAL_WAIT_TRY) == 2
        syncing = threading.Thread(target=log.sync)
        syncing.start()
        time.sleep(0.3)
        assert syncing.is_alive() and log.watermarks.written == 0
        assert finish(log, rec, b"done") == 0
        syncing.join(timeout=10)
        assert not syncing.is_alive()
        assert log.watermarks.durable == 2
    assert reopened_payloads(tmp_path) == [(1, b"open:done"), (2, b"after")]


def test_a_write_made_holding_the_gil_never_takes_a_batch_with_an_unfinished_record(tmp_path: Path) -> None:
    # At `interval` an append with WAL_WAIT_TRY writes the pending batch in the calling thread,
    # which may hold the GIL (native/logcall.h). Were it to wait there for a record that thread
    # has yet to finish -- its own, or the next append's -- it would wait forever. Each append
    # runs in a thread of its own so that a stuck one is seen (and let go by the finish).
    with wal.Log.open(tmp_path, durability="interval", rpo_ms=60_000) as log:
        rec = ffi.new("wal_unfinished *")
        got: list[int] = []
        appends = [
            lambda: got.append(lib.wal_log_append_unfinished(log._handle, b"open:????", 9, 5, lib.WAL_LEVEL_INTERVAL,
                                                             rec)),
            lambda: got.append(append_nowait(handle_address(log._handle), b"tried", lib.WAL_LEVEL_INTERVAL,
                                             lib.WAL_WAIT_TRY)),
        ]
        threads = [threading.Thread(target=append, daemon=True) for append in appends]
        stuck = []
        for t in threads:
            t.start()
            t.join(timeout=5)
            stuck.append(t.is_alive())
        written = log.watermarks.written
        assert finish(log, rec, b"done") == 0  # (also lets a stuck append go, so the log closes)
        for t in threads:
            t.join(timeout=10)
        assert stuck == [False, False] and got == [1, 2] and written == 0
        log.sync()
    assert reopened_payloads(tmp_path) == [(1, b"open:done"), (2, b"tried")]


@pytest.mark.parametrize(("how", "detail"), [
    ("its bytes cannot be made", "sealing a record"),
    # A caller that names a record wrongly may have left one of its own open, which would hold
    # every write back for good: the log fails instead.
    ("named in another batch", "not open"),
    ("finished twice", "not open"),
    # Bounds a caller could get wrong: checked before any byte is copied.
    ("filled from past its end", "not open"),
    ("placed past its batch", "not open"),
])
def test_a_record_not_finished_as_the_contract_says_fails_the_log_and_never_reaches_the_disk(
        tmp_path: Path, how: str, detail: str) -> None:
    log = wal.Log.open(tmp_path, durability="sync")
    try:
        log.append(b"kept")
        _, rec = append_open(log, b"open:", 4)
        if how == "its bytes cannot be made":
            assert finish(log, rec, b"\0\0\0\0", ok=False) == lib.WAL_EFAILED
        else:
            named = rec
            wrong = {"named in another batch": {"batch": rec.batch + 7},
                     "filled from past its end": {"fill_from": rec.len + 1},
                     "placed past its batch": {"at": 2**64 - 8}}.get(how)
            if wrong is not None:
                fields = {"batch": rec.batch, "at": rec.at, "len": rec.len, "fill_from": rec.fill_from, **wrong}
                named = ffi.new("wal_unfinished *", fields)
            else:
                append_open(log, b"also open:", 4)  # keeps the batch waiting for a finish
                assert finish(log, rec, b"done") == 0
            assert finish(log, named, b"nope") == lib.WAL_EINVAL
        with pytest.raises(wal.FailedError, match=detail) as refused:
            log.append(b"refused")
        # The I5 explanation names the step that failed: neither is a failed fsync or write.
        why = "could not be sealed" if how == "its bytes cannot be made" else "did not hold open"
        assert why in str(refused.value) and "failed fsync or write" not in str(refused.value)
    finally:
        with pytest.raises(wal.FailedError):
            log.close()
    assert reopened_payloads(tmp_path) == [(1, b"kept")]  # nothing it had not written is acknowledged


def test_a_finish_once_the_log_has_failed_takes_no_bytes_and_says_so(tmp_path: Path) -> None:
    # A writer that held the record's batch when the log failed lets it go: the finish that
    # comes after finds nothing to fill, and answers with the log's failure.
    log = wal.Log.open(tmp_path, durability="sync")
    try:
        _, first = append_open(log, b"a:", 2)
        _, second = append_open(log, b"b:", 2)
        assert finish(log, first, b"??", ok=False) == lib.WAL_EFAILED
        assert finish(log, second, b"ok") == lib.WAL_EFAILED
    finally:
        with pytest.raises(wal.FailedError, match="sealing a record"):
            log.close()
    assert reopened_payloads(tmp_path) == []


def test_no_record_is_appended_open_at_buffered_which_would_acknowledge_it_unfinished(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="buffered") as log:
        rec = ffi.new("wal_unfinished *")
        data = b"head:????"
        assert lib.wal_log_append_unfinished(log._handle, data, len(data), 5, lib.WAL_LEVEL_BUFFERED,
                                             rec) == lib.WAL_EINVAL
        assert log.append(b"still usable") == 1


def test_a_refused_write_puts_its_batch_before_unfinished_records_which_still_land_whole(tmp_path: Path) -> None:
    # A write refused for lack of space goes back in front of the pending batch: a record
    # appended open meanwhile has moved by that batch's length when it is finished, and one
    # appended open after it is finished while a writer that took that batch waits for it.
    with wal.Log.open(tmp_path, durability="sync") as log:
        log.append(b"first")
        assert append_nowait(handle_address(log._handle), b"refused once", lib.WAL_LEVEL_SYNC, lib.WAL_WAIT_TRY) == 2
        syncing, refused = sync_during_a_refused_write(log, repeat=False)
        time.sleep(0.1)  # inside the refused write
        _, rec = append_open(log, b"open:", 8)
        syncing.join(timeout=10)
        assert refused and wal.drill.failpoints.failures("write") == 1
        wal.drill.failpoints.clear()
        lsn2, rec2 = append_open(log, b"after:", 5)  # into the batch the refused one went back in front of
        assert finish(log, rec, b"finished") == 0
        syncing = threading.Thread(target=log.sync)
        syncing.start()
        time.sleep(0.2)
        assert syncing.is_alive() and log.watermarks.written < lsn2  # the writer waits for rec2
        assert finish(log, rec2, b"later") == 0
        syncing.join(timeout=10)
        assert not syncing.is_alive()
        want = [(1, b"first"), (2, b"refused once"), (3, b"open:finished"), (4, b"after:later")]
        assert list(log.read(1)) == want
    assert reopened_payloads(tmp_path) == want
