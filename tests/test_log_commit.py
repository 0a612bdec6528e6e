"""Group commit, the acknowledgement point of each durability level, the single-writer lock, fail-stop.

Counted, never timed: grouping is shown by stats (fsyncs against commits), the
levels by the watermarks at the moment an append returns, the flusher by
polling the watermarks with a generous deadline.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from log_helpers import sync_during_a_refused_write

import wal
import wal.drill.failpoints
from wal._bindings import append_nowait, append_record, handle_address, lib
from wal.log.format import record_size
from wal.log.log import MAX_PAYLOAD


def payload(tag: int | str, size: int = 128) -> bytes:
    head = f"[{tag}]".encode()
    return (head * (size // len(head) + 1))[:size]


def run_threads(n: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def wait_until(cond: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


@pytest.fixture(autouse=True)
def _no_failpoint_left_armed() -> object:
    yield
    wal.drill.failpoints.clear()


# ---- group commit -----------------------------------------------------------------


def test_at_buffered_no_append_is_admitted_once_a_write_was_refused_even_one_made_during_it(tmp_path: Path) -> None:
    """A refused write (no space) holds records acknowledged at `buffered`: nothing more may be
    admitted into memory until a write goes through. A commit appended while the refused write
    ran is past that write's batch; the check once looked for the whole log in it, and admitted
    every later append again."""
    log = wal.Log.open(tmp_path / "log", durability="buffered", rpo_ms=10_000)
    try:
        log.append(b"first")
        syncing, refused = sync_during_a_refused_write(log, repeat=True)
        time.sleep(0.1)
        log.append(b"during the refused write")  # admitted: no refusal known yet
        syncing.join()
        assert refused and wal.drill.failpoints.failures("write") >= 1
        wal.drill.failpoints.slow("write", 0)
        with pytest.raises(wal.NoSpaceError):
            log.append(b"after the refusal")
        wal.drill.failpoints.clear()  # space is back: the next append is admitted, and all are written
        log.append(b"after space returned")
        log.sync()
        assert [p for _lsn, p in log.read(1)] == [b"first", b"during the refused write", b"after space returned"]
    finally:
        wal.drill.failpoints.clear()
        log.close()


def test_64_threads_appending_128_byte_records_at_sync_share_fsyncs(tmp_path: Path) -> None:
    per_thread = 40
    got: dict[int, list[int]] = {}
    with wal.Log.open(tmp_path) as log:

        def writer(i: int) -> None:
            lsns = []
            for k in range(per_thread):
                lsn = log.append(payload(f"{i}:{k}"))
                assert log.watermarks.durable >= lsn  # acknowledged only once durable
                lsns.append(lsn)
            got[i] = lsns

        run_threads(64, writer)
        s = log.stats()
        records = dict(log.read())
    commits = 64 * per_thread
    assert s["commits"] == commits
    # Shared: without group commit there would be one fdatasync per commit. How many share one
    # follows the disk (commits gather while the previous fdatasync runs): a mean of 4.7 where
    # fdatasync took 0.13 ms, more where it takes a millisecond. Half is far from one each.
    assert s["fsyncs"] <= commits / 2, s
    assert s["group_size_max"] > 1
    assert s["group_size_mean"] >= 2
    every = sorted(lsn for lsns in got.values() for lsn in lsns)
    assert every == list(range(1, commits + 1))  # one LSN per commit, no gaps, no duplicates
    for i, lsns in got.items():
        assert lsns == sorted(lsns)  # a thread's commits are in its own order
        for k, lsn in enumerate(lsns):
            assert records[lsn] == payload(f"{i}:{k}")


def test_append_many_is_one_commit_per_record_sharing_one_fsync(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        last = log.append_many([payload(i) for i in range(100)])
        s = log.stats()
        assert last == 100
        assert s["commits"] == 100
        assert s["fsyncs"] <= 2
        assert log.watermarks.durable == 100


# ---- acknowledgement point of each level --------------------------------------------


def test_sync_append_returns_only_when_durable(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="sync") as log:
        for i in range(50):
            lsn = log.append(payload(i))
            assert log.watermarks.durable >= lsn


def test_sync_append_from_many_threads_returns_only_when_durable(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:

        def writer(i: int) -> None:
            for k in range(20):
                lsn = log.append(payload(f"{i}.{k}"))
                assert log.watermarks.durable >= lsn

        run_threads(16, writer)


def test_mixed_levels_back_pressure_and_rolls_from_many_threads_every_waiter_is_woken(tmp_path: Path) -> None:
    # The followers' targeted wake-ups (commit.c, wake_waiters): sync, interval and buffered
    # commits, enqueue-then-wait, a tiny buffer cap (back-pressure waits) and small segments
    # (rolls) at once. A lost wake-up shows as a thread still waiting when the deadline passes.
    done = threading.Event()
    errors: list[BaseException] = []
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=50, max_pending_bytes=8192,
                      segment_bytes=64 << 10) as log:

        def writer(i: int) -> None:
            try:
                for k in range(150):
                    level = ("sync", "interval", "buffered")[(i + k) % 3]
                    if k % 4 == 0:
                        lsn = log.enqueue(payload(f"{i}.{k}", 300), durability=level)
                        assert lsn is not None
                        log.wait(lsn, durability=level)
                    else:
                        lsn = log.append(payload(f"{i}.{k}", 300), durability=level)
                    marks = log.watermarks
                    if level == "sync":
                        assert marks.durable >= lsn
                    elif level == "interval":
                        assert marks.written >= lsn
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(48)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        done.set()
        stuck = [t.name for t in threads if t.is_alive()]
        assert not stuck, f"{len(stuck)} thread(s) never woken: {log.stats()}"
        assert not errors, errors[0]
        assert log.watermarks.appended == 48 * 150
        assert log.stats()["backpressure_waits"] > 0
    with wal.Log.open(tmp_path, durability="sync") as log:
        assert sum(1 for _ in log.read(1)) == 48 * 150


def commit_b_while_a_is_slow(log: wal.Log, site: str, a_is_in_it: Callable[[], bool]) -> list[int]:
    """A commits while `site` takes 300 ms a call; once `a_is_in_it()`, B commits and nothing else
    comes. Both must return (within 10 s): the LSNs they got, in order."""
    log.append(payload(0))
    wal.drill.failpoints.slow(site, 0.3)
    done: dict[str, int] = {}

    def commit(name: str) -> None:
        done[name] = log.append(payload(name))

    a = threading.Thread(target=commit, args=("a",))
    a.start()
    assert wait_until(a_is_in_it)
    b = threading.Thread(target=commit, args=("b",))
    b.start()
    a.join(timeout=10)
    b.join(timeout=10)
    assert not a.is_alive() and not b.is_alive(), f"a commit was never woken: {log.stats()}"
    return sorted(done.values())


def test_a_follower_left_behind_by_the_leaders_fdatasync_is_woken_to_lead_the_next_one(tmp_path: Path) -> None:
    # commit.c's wake_waiters, per free slot, wakes the first follower that needs it. Here A's
    # fdatasync is slow; B arrives meanwhile, writes its record itself (the write slot is free)
    # and sleeps as a follower because the sync slot is busy. A's fdatasync does not cover B's
    # record, and no other thread will come: B must be woken to lead its own fdatasync.
    with wal.Log.open(tmp_path, durability="sync") as log:
        # A has written and is in its fdatasync
        assert commit_b_while_a_is_slow(log, "fsync", lambda: log.watermarks.written >= 2) == [2, 3]
        assert log.watermarks.durable == 3
        assert log.stats()["fsyncs"] >= 3  # B's record needed an fdatasync of its own


def test_a_follower_left_behind_by_the_leaders_write_is_woken_to_write_its_record(tmp_path: Path) -> None:
    # The write slot's turn of the same rule: at interval (no fdatasync folded in) A's slow write
    # does not carry B's record, and the flusher would not write it for rpo_ms/2 = 30 s.
    with wal.Log.open(tmp_path, durability="interval", rpo_ms=60_000) as log:

        def a_is_writing() -> bool:
            if log.watermarks.appended < 2:
                return False
            time.sleep(0.05)  # enqueued; now well inside its 300 ms write
            return True

        assert commit_b_while_a_is_slow(log, "write", a_is_writing) == [2, 3]
        assert log.watermarks.written == 3


def test_interval_append_returns_once_written_to_the_os(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="interval", rpo_ms=60_000) as log:
        for i in range(50):
            lsn = log.append(payload(i))
            assert log.watermarks.written >= lsn
        # a process kill now loses nothing: another reader of the files sees every record
        with wal.Log.open(tmp_path, readonly=True) as ro:
            assert [lsn for lsn, _ in ro.read()] == list(range(1, 51))


def test_buffered_append_returns_before_the_write(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=60_000, max_pending_bytes=64 << 20) as log:
        lsn = log.append(payload(1))
        marks = log.watermarks
        assert marks.appended == lsn
        assert marks.written < lsn
        log.append_many([payload(i) for i in range(2, 11)])
        assert log.watermarks.written < 10
        log.sync()
        assert log.watermarks == wal.LogWatermarks(10, 10, 10)


@pytest.mark.parametrize("level", ["buffered", "interval"])
def test_flusher_makes_weaker_levels_durable_within_the_rpo(tmp_path: Path, level: str) -> None:
    with wal.Log.open(tmp_path, durability=level, rpo_ms=200) as log:
        time.sleep(0.05)  # let the flusher go idle first: the RPO clock must still start with the commit
        lsn = log.append(payload(1))
        assert wait_until(lambda: log.watermarks.durable >= lsn), log.stats()
        lsn = log.append_many([payload(i) for i in range(2, 50)])
        assert wait_until(lambda: log.watermarks.durable >= lsn), log.stats()
        assert log.stats()["durable_lag_ms"] == 0.0


def test_flusher_keeps_up_with_a_steady_stream_of_buffered_commits(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=100) as log:
        for i in range(300):
            log.append(payload(i))
            if i % 50 == 0:
                time.sleep(0.01)
        last = log.watermarks.appended
        assert wait_until(lambda: log.watermarks.durable >= last), log.stats()


def test_buffered_appends_are_held_back_when_the_buffer_cap_is_reached(tmp_path: Path) -> None:
    cap = 4096
    per_record = record_size(100)
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=60_000, max_pending_bytes=cap) as log:
        # Each of the flusher's writes takes 1 ms (a failpoint's sleep), so the appends outpace
        # it: on a loaded machine, with writes at the page cache's speed, they never reached the cap.
        wal.drill.failpoints.slow("write", 0.001)
        try:
            for i in range(1000):
                log.append(payload(i, 100))
                marks = log.watermarks
                # at most one full batch buffered and one being written
                assert (marks.appended - marks.written) * per_record <= 2 * cap
        finally:
            wal.drill.failpoints.slow("write", 0)
        assert log.stats()["backpressure_waits"] > 0


def test_gil_held_append_refuses_every_mode_that_may_block_and_appends_nothing(tmp_path: Path) -> None:
    # native/appendcall.c's contract: only WAL_WAIT_TRY / WAL_WAIT_NONE run with the GIL held.
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=60_000) as log:
        address = handle_address(log._handle)
        for mode in (lib.WAL_WAIT_LEVEL, lib.WAL_WAIT_LATER, 99):
            assert append_nowait(address, b"x", lib.WAL_LEVEL_BUFFERED, mode) == lib.WAL_EINVAL
        assert log.watermarks.appended == 0
        with pytest.raises(TypeError, match="must be bytes"):
            append_nowait(address, "text", lib.WAL_LEVEL_BUFFERED, lib.WAL_WAIT_TRY)  # type: ignore[arg-type]
        assert append_nowait(address, b"x", lib.WAL_LEVEL_BUFFERED, lib.WAL_WAIT_TRY) == 1
        log.sync()
        assert list(log.read(1)) == [(1, b"x")]


def test_gil_held_append_under_back_pressure_returns_eagain_and_log_append_then_waits(tmp_path: Path) -> None:
    cap = 4096
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=60_000, max_pending_bytes=cap) as log:
        address = handle_address(log._handle)
        # The flusher's writes held (a failpoint's sleep): on a loaded machine each call here took
        # long enough for a background write to make room before the next, and none was refused.
        wal.drill.failpoints.slow("write", 0.5)
        try:
            codes = [append_nowait(address, payload(i, 1000), lib.WAL_LEVEL_BUFFERED, lib.WAL_WAIT_TRY)
                     for i in range(10)]
        finally:
            wal.drill.failpoints.slow("write", 0)
        accepted = [c for c in codes if c > 0]
        # LSNs in order, with refusals among them: once the pending bytes pass the cap, appends are
        # refused until the flusher's background write makes room.
        assert accepted == list(range(1, len(accepted) + 1))
        assert all(c > 0 or c == lib.WAL_EAGAIN for c in codes), codes
        assert codes[:2] == [1, 2] and lib.WAL_EAGAIN in codes, codes
        assert log.watermarks.appended == len(accepted)  # a refused append left nothing behind
        # Log.append falls back to the blocking call and gets through.
        assert log.append(b"after") == len(accepted) + 1


def test_an_interval_try_append_makes_its_write_itself_and_wait_try_answers_eagain_for_anything_that_waits(
        tmp_path: Path) -> None:
    # native/logcall.h: Log.append and Store.put at interval append with WAL_WAIT_TRY and wait
    # with wal_log_wait_try, GIL held. The append makes the write when it can at once, in the
    # same hold of the log's mutex; wait_try then answers without taking it.
    with wal.Log.open(tmp_path, durability="interval", rpo_ms=60_000) as log:
        h, address = log._handle, handle_address(log._handle)
        lsn = append_nowait(address, b"a", lib.WAL_LEVEL_INTERVAL, lib.WAL_WAIT_TRY)
        assert lsn == 1 and log.watermarks.written == 1  # written by the append, in this thread
        assert lib.wal_log_wait_try(h, lsn, lib.WAL_LEVEL_INTERVAL) == 0
        assert lib.wal_log_wait_try(h, lsn, lib.WAL_LEVEL_BUFFERED) == 0
        # sync needs an fdatasync, which is never made here
        assert lib.wal_log_wait_try(h, lsn, lib.WAL_LEVEL_SYNC) == lib.WAL_EAGAIN
        assert log.watermarks.durable == 0
        assert lib.wal_log_wait_try(h, 2, lib.WAL_LEVEL_INTERVAL) == lib.WAL_EINVAL  # not appended
        assert lib.wal_log_wait_try(h, lsn, 7) == lib.WAL_EINVAL
        with wal.Log.open(tmp_path, readonly=True) as ro:  # a process kill now loses nothing
            assert list(ro.read()) == [(1, b"a")]


def test_wait_try_makes_the_write_an_append_could_not_because_the_write_slot_was_busy(tmp_path: Path) -> None:
    # The flusher holds the write slot (a failpoint makes its write take 0.4 s) while a try
    # append comes: that append only queues its record; wait_try, once the slot is free,
    # writes it in the calling thread.
    with wal.Log.open(tmp_path, durability="interval", rpo_ms=60_000) as log:
        h, address = log._handle, handle_address(log._handle)
        wal.drill.failpoints.slow("write", 0.4)
        first = append_nowait(address, b"a", lib.WAL_LEVEL_INTERVAL, lib.WAL_WAIT_NONE)  # the flusher writes it
        time.sleep(0.1)  # the flusher is inside its slow write now
        second = append_nowait(address, b"b", lib.WAL_LEVEL_INTERVAL, lib.WAL_WAIT_TRY)
        wal.drill.failpoints.slow("write", 0)
        assert log.watermarks.written < second  # the slot was busy: queued, not written
        assert lib.wal_log_wait_try(h, second, lib.WAL_LEVEL_INTERVAL) == lib.WAL_EAGAIN
        log.wait(first, durability="interval")  # the flusher's write is done (GIL released here)
        assert log.watermarks.written == first
        assert lib.wal_log_wait_try(h, second, lib.WAL_LEVEL_INTERVAL) == 0
        assert log.watermarks.written == second  # written by wait_try, in this thread
        assert [p for _, p in log.read()] == [b"a", b"b"]


def test_a_slow_write_made_by_wait_try_leaves_the_next_writes_to_threads_that_hold_nothing(tmp_path: Path) -> None:
    # A caller of wal_log_wait_try holds the GIL: after a write over 1 ms (the kernel throttling
    # writers, here a failpoint's sleep) it makes none for at least 1 s (native/commit.c).
    with wal.Log.open(tmp_path, durability="interval", rpo_ms=60_000) as log:
        h, address = log._handle, handle_address(log._handle)
        wal.drill.failpoints.slow("write", 0.005)
        first = append_nowait(address, b"a", lib.WAL_LEVEL_INTERVAL, lib.WAL_WAIT_TRY)
        assert lib.wal_log_wait_try(h, first, lib.WAL_LEVEL_INTERVAL) == 0
        wal.drill.failpoints.slow("write", 0)
        second = append_nowait(address, b"b", lib.WAL_LEVEL_INTERVAL, lib.WAL_WAIT_TRY)
        assert lib.wal_log_wait_try(h, second, lib.WAL_LEVEL_INTERVAL) == lib.WAL_EAGAIN
        assert log.watermarks.written == first
        assert log.append(b"c") == 3  # Log.append then waits with the GIL released
        assert log.watermarks.written == 3
        time.sleep(1.1)  # the pause is over: wait_try writes again
        fourth = append_nowait(address, b"d", lib.WAL_LEVEL_INTERVAL, lib.WAL_WAIT_TRY)
        assert lib.wal_log_wait_try(h, fourth, lib.WAL_LEVEL_INTERVAL) == 0
        assert log.watermarks.written == fourth
        assert [p for _, p in log.read()] == [b"a", b"b", b"c", b"d"]


def test_wait_try_reports_a_failed_write_and_a_full_disk(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path / "full", durability="interval", rpo_ms=60_000) as log:
        h, address = log._handle, handle_address(log._handle)
        with wal.drill.failpoints.failpoint("write", errno.ENOSPC, repeat=True):
            lsn = append_nowait(address, b"a", lib.WAL_LEVEL_INTERVAL, lib.WAL_WAIT_TRY)  # its write fails
            assert lsn == 1 and log.watermarks.written == 0
            assert lib.wal_log_wait_try(h, lsn, lib.WAL_LEVEL_INTERVAL) == lib.WAL_ENOSPC  # and again
        assert log.append(b"b") == 2  # space is back: both are written, in order
        assert list(log.read()) == [(1, b"a"), (2, b"b")]
    log = wal.Log.open(tmp_path / "eio", durability="interval", rpo_ms=60_000)
    h, address = log._handle, handle_address(log._handle)
    with wal.drill.failpoints.failpoint("write", errno.EIO):
        lsn = append_nowait(address, b"a", lib.WAL_LEVEL_INTERVAL, lib.WAL_WAIT_TRY)
        assert lib.wal_log_wait_try(h, lsn, lib.WAL_LEVEL_INTERVAL) == lib.WAL_EFAILED
    with pytest.raises(wal.FailedError):  # I5: stopped for good
        log.append(b"b")
    with pytest.raises(wal.FailedError, match="reopen it to recover"):
        log.close()


def test_per_append_sync_in_an_interval_log_is_durable_at_return(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="interval", rpo_ms=60_000) as log:
        log.append(payload(1))
        lsn = log.append(payload(2), durability="sync")
        assert log.watermarks.durable >= lsn
        lsn = log.append_many([payload(3), payload(4)], durability="sync")
        assert log.watermarks.durable >= lsn


def test_per_append_interval_in_a_buffered_log_is_written_at_return(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=60_000, max_pending_bytes=64 << 20) as log:
        log.append(payload(1))
        lsn = log.append(payload(2), durability="interval")
        assert log.watermarks.written >= lsn


@pytest.mark.parametrize(
    ("log_level", "rpo_ms", "asked"),
    [("sync", None, "interval"), ("sync", None, "buffered"), ("interval", 100, "buffered")],
)
def test_asking_for_a_weaker_level_than_the_logs_is_argument_error(
    tmp_path: Path, log_level: str, rpo_ms: int | None, asked: str
) -> None:
    with wal.Log.open(tmp_path, durability=log_level, rpo_ms=rpo_ms) as log:
        with pytest.raises(wal.ArgumentError):
            log.append(b"x", durability=asked)
        with pytest.raises(wal.ArgumentError):
            log.append_many([b"x"], durability=asked)
        with pytest.raises(wal.ArgumentError):
            asyncio.run(log.append_async(b"x", durability=asked))
        assert log.watermarks.appended == 0


# ---- asyncio ------------------------------------------------------------------------


def test_append_async_from_1000_tasks_at_sync_resolves_all_groups_fsyncs_and_never_blocks_the_loop(
    tmp_path: Path,
) -> None:
    n = 1000

    async def main(log: wal.Log) -> tuple[list[int], int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        async def commit(i: int) -> int:
            lsn = await log.append_async(payload(i))
            assert log.watermarks.durable >= lsn  # resolved only once durable
            return lsn

        tick_task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        lsns = await asyncio.gather(*(commit(i) for i in range(n)))
        done.set()
        await tick_task
        return list(lsns), ticks

    with wal.Log.open(tmp_path) as log:
        lsns, ticks = asyncio.run(main(log))
        s = log.stats()
        records = dict(log.read())
    assert sorted(lsns) == list(range(1, n + 1))
    assert s["commits"] == n
    assert s["fsyncs"] <= n / 5, s
    # The ticker ran while the commits were in flight: the loop was never held by an fdatasync.
    assert ticks > 1
    for i, lsn in enumerate(lsns):
        assert records[lsn] == payload(i)


def test_append_async_awaits_the_fdatasync_on_the_loop_instead_of_blocking_it(tmp_path: Path) -> None:
    """One commit at a time: while each awaits its fdatasync (done by the C flusher), other tasks run."""

    async def main(log: wal.Log) -> tuple[int, int]:
        ticks = 0
        stop = False

        async def ticker() -> None:
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        tick_task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ran_meanwhile = 0
        n = 200
        for i in range(n):
            before = ticks
            lsn = await log.append_async(payload(i))
            assert log.watermarks.durable >= lsn
            ran_meanwhile += ticks > before
        stop = True
        await tick_task
        return ran_meanwhile, n

    with wal.Log.open(tmp_path) as log:
        ran_meanwhile, n = asyncio.run(main(log))
    # An append that did its fdatasync inline would resolve without ever yielding to the loop.
    assert ran_meanwhile > n // 2


def test_the_first_asyncio_waiter_of_a_log_is_told_of_progress_made_before_it_existed(tmp_path: Path) -> None:
    # The eventfd is only written once asyncio asks for it (commit.c, notify_wanted), so the first
    # waiter gets one signal on arrival: it must not wait for a "next" progress that may never come
    # on an idle log, nor miss records made durable before it subscribed.
    async def main(log: wal.Log, lsn: int) -> None:
        await asyncio.wait_for(log.progress_async(), 5)
        await asyncio.wait_for(log.wait_async(lsn), 5)

    with wal.Log.open(tmp_path, durability="interval", rpo_ms=20) as log:
        lsn = log.append(payload(1))
        assert wait_until(lambda: log.watermarks.durable >= lsn)  # the flusher synced it, nobody listening
        asyncio.run(main(log, lsn))


def test_append_async_on_an_interval_log_resolves_once_written(tmp_path: Path) -> None:
    async def main(log: wal.Log) -> list[int]:
        async def commit(i: int) -> int:
            lsn = await log.append_async(payload(i))
            assert log.watermarks.written >= lsn
            return lsn

        return list(await asyncio.gather(*(commit(i) for i in range(200))))

    with wal.Log.open(tmp_path, rpo_ms=50) as log:
        assert sorted(asyncio.run(main(log))) == list(range(1, 201))


def test_append_async_with_per_commit_sync_in_an_interval_log_resolves_once_durable(tmp_path: Path) -> None:
    async def main(log: wal.Log) -> int:
        return await log.append_async(b"critical", durability="sync")

    with wal.Log.open(tmp_path, rpo_ms=60_000) as log:
        lsn = asyncio.run(main(log))
        assert log.watermarks.durable >= lsn


# ---- the lock (I6) ------------------------------------------------------------------------


def test_second_open_in_the_same_process_is_locked_error(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append(b"x")
        with pytest.raises(wal.LockedError) as info:
            wal.Log.open(tmp_path)
        assert str(tmp_path) in str(info.value)
        log.append(b"y")  # the refused opener changed nothing
    assert [lsn for lsn, _ in wal.Log.open(tmp_path, readonly=True).read()] == [1, 2]


def test_second_open_from_another_thread_is_locked_error(tmp_path: Path) -> None:
    caught: list[BaseException] = []

    def other() -> None:
        try:
            wal.Log.open(tmp_path)
        except BaseException as e:  # checked below
            caught.append(e)

    with wal.Log.open(tmp_path):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert len(caught) == 1
    assert isinstance(caught[0], wal.LockedError)


def test_second_open_from_another_process_is_locked_error(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, wal
        try:
            wal.Log.open(sys.argv[1])
        except wal.LockedError:
            sys.exit(17)
        sys.exit(0)
        """
    )
    argv = [sys.executable, "-c", script, str(tmp_path)]
    with wal.Log.open(tmp_path) as log:
        log.append(b"x")
        proc = subprocess.run(argv, capture_output=True, timeout=60, check=False)
        assert proc.returncode == 17, proc.stderr.decode()
    proc = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()  # after close the other process may open it


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_can_neither_open_nor_append_through_the_inherited_log(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append(b"parent 1")
        pid = os.fork()
        if pid == 0:  # child: report through the exit code only
            code = 0
            try:
                wal.Log.open(tmp_path)
                code |= 1
            except wal.LockedError:
                pass
            except BaseException:
                code |= 4
            try:
                log.append(b"from the child")
                code |= 2
            except wal.LockedError:
                pass
            except BaseException:
                code |= 8
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # the parent's log is unharmed and goes on
        assert log.append(b"parent 2") == 2
    with wal.Log.open(tmp_path) as log:
        assert list(log.read()) == [(1, b"parent 1"), (2, b"parent 2")]


def test_after_close_another_open_succeeds(tmp_path: Path) -> None:
    log = wal.Log.open(tmp_path)
    log.append(b"x")
    log.close()
    with wal.Log.open(tmp_path) as again:
        assert again.append(b"y") == 2


def test_readonly_open_while_a_writer_holds_the_lock_reads_the_records(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append_many([payload(i) for i in range(1, 21)])
        with wal.Log.open(tmp_path, readonly=True) as ro:
            assert list(ro.read()) == [(i, payload(i)) for i in range(1, 21)]
        log.append(payload(21))  # the writer is unaffected by the reader


@pytest.mark.timeout(120)
def test_close_while_threads_append_gives_each_append_success_or_closed_error_and_loses_nothing(
    tmp_path: Path,
) -> None:
    for rnd in range(30):
        d = tmp_path / str(rnd)
        log = wal.Log.open(d)
        acked: dict[int, bytes] = {}
        outcomes: list[str] = []
        started = threading.Barrier(9)

        def writer(i: int, log: wal.Log = log, acked: dict[int, bytes] = acked, outcomes: list[str] = outcomes,
                   started: threading.Barrier = started) -> None:
            started.wait()
            k = 0
            while True:
                p = payload(f"{i}:{k}")
                k += 1
                try:
                    acked[log.append(p)] = p
                except wal.ClosedError:
                    outcomes.append("closed")
                    return

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.002 * (rnd % 5))
        log.close()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "an append hung after close"
        assert outcomes == ["closed"] * 8
        with wal.Log.open(d) as again:
            got = dict(again.read())
        assert all(got.get(lsn) == p for lsn, p in acked.items())


def test_readonly_reader_in_another_process_reads_a_consistent_prefix_while_the_writer_appends(
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(Path(__file__).parent / "helpers"))
    from ro_reader import expected_payload  # noqa: PLC0415

    with wal.Log.open(tmp_path, durability="interval", rpo_ms=1000, segment_bytes=1 << 20) as log:
        log.append_many([expected_payload(lsn) for lsn in range(1, 11)])
        reader = subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "helpers" / "ro_reader.py"), str(tmp_path), "150"],
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 120
        while reader.poll() is None and time.monotonic() < deadline:
            first = log.watermarks.appended + 1
            log.append_many([expected_payload(lsn) for lsn in range(first, first + 10)])
            time.sleep(0.001)  # a steady writer, not a disk filler
        if reader.poll() is None:
            reader.kill()
        _, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err.decode()


# ---- fail-stop (I5) ---------------------------------------------------------------------


def _reopen_and_check(d: Path, acknowledged: dict[int, bytes], sent: dict[int, bytes]) -> None:
    with wal.Log.open(d) as log:
        got = list(log.read())
        lsns = [lsn for lsn, _ in got]
        assert lsns == list(range(1, len(lsns) + 1))  # gap-free prefix
        for lsn, p in got:
            assert sent[lsn] == p  # nothing that was never sent
        for lsn, p in acknowledged.items():
            assert dict(got).get(lsn) == p  # every acknowledged record survived
        # and the reopened log accepts appends again
        assert log.append(b"after reopen") == len(lsns) + 1


def test_failed_fsync_stops_the_log_for_good_and_reopen_recovers_every_acknowledged_record(
    tmp_path: Path,
) -> None:
    acknowledged: dict[int, bytes] = {}
    sent: dict[int, bytes] = {}
    log = wal.Log.open(tmp_path)
    for i in range(1, 11):
        sent[i] = acknowledged[i] = payload(i)
        assert log.append(sent[i]) == i
    with wal.drill.failpoints.failpoint("fsync", errno.EIO):
        sent[11] = payload(11)
        with pytest.raises(wal.FailedError) as info:
            log.append(sent[11])
        assert "fdatasync" in str(info.value)
        fsync_calls = wal.drill.failpoints.calls("fsync")
        # every later append fails, however asked, and nothing is retried and trusted
        for i in range(3):
            with pytest.raises(wal.FailedError):
                log.append(payload(f"later {i}"))
        with pytest.raises(wal.FailedError):
            log.append_many([b"a", b"b"])
        with pytest.raises(wal.FailedError):
            log.sync()
        with pytest.raises(wal.FailedError):
            asyncio.run(log.append_async(b"async"))
        assert log.stats()["failed"]
        with pytest.raises(wal.FailedError):
            log.close()
        assert wal.drill.failpoints.calls("fsync") == fsync_calls  # I5: no second fdatasync after the failure
    assert log.closed
    _reopen_and_check(tmp_path, acknowledged, sent)


def test_failed_fsync_fails_every_thread_waiting_in_the_same_group(tmp_path: Path) -> None:
    outcomes: list[str] = []
    lock = threading.Lock()
    log = wal.Log.open(tmp_path)
    log.append(b"before")
    with wal.drill.failpoints.failpoint("fsync", errno.EIO, nth=1, repeat=True):

        def writer(i: int) -> None:
            try:
                log.append(payload(i))
                result = "ok"
            except wal.FailedError:
                result = "failed"
            with lock:
                outcomes.append(result)

        run_threads(16, writer)
        assert outcomes.count("ok") == 0
        with pytest.raises(wal.FailedError):
            log.close()
    with wal.Log.open(tmp_path) as again:
        got = list(again.read())
    assert got[0] == (1, b"before")
    assert [lsn for lsn, _ in got] == list(range(1, len(got) + 1))
    assert {p for _, p in got[1:]} <= {payload(i) for i in range(16)}


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "half-written"])
def test_enospc_on_write_fails_the_commit_and_the_log_goes_on_once_space_returns(
    tmp_path: Path, partial: bool
) -> None:
    """A write that fails for lack of space is not fatal (unlike a failed fsync): the commit gets
    NoSpaceError, nothing acknowledged is lost, and once space returns the same log goes on; the
    unacknowledged record is rewritten at its place (a half-written one included)."""
    acknowledged: dict[int, bytes] = {}
    sent: dict[int, bytes] = {}
    log = wal.Log.open(tmp_path)
    for i in range(1, 21):
        sent[i] = acknowledged[i] = payload(i, 300)
        log.append(sent[i])
    with wal.drill.failpoints.failpoint("write", errno.ENOSPC, partial=partial, repeat=True):
        sent[21] = payload(21, 300)
        with pytest.raises(wal.NoSpaceError, match="No space left"):
            log.append(sent[21])
        sent[22] = payload(22)
        with pytest.raises(wal.NoSpaceError):  # still full: refused clearly, every time
            log.append(sent[22])
        assert log.stats()["write_errors"] >= 2
    # space returns: the same log accepts commits, and the refused ones are written before them
    sent[23] = acknowledged[23] = payload(23)
    assert log.append(sent[23]) == 23
    log.close()
    _reopen_and_check(tmp_path, acknowledged, sent)
    with wal.Log.open(tmp_path) as again:
        assert [lsn for lsn, _ in again.read()][:24] == list(range(1, 25))  # 21 and 22 reached the disk too


def test_a_wait_or_sync_after_space_returns_rewrites_the_refused_records_rather_than_report_the_old_failure(
        tmp_path: Path) -> None:
    """Nothing retries a refused write until someone needs one: a wait (or sync) that begins
    after space came back must make that write, not answer NoSpaceError from the failure it
    finds recorded (the store's back-pressure wait did, and a store that should have gone on
    refused its next commit)."""
    log = wal.Log.open(tmp_path)
    log.append(b"before")
    with wal.drill.failpoints.failpoint("write", errno.ENOSPC, repeat=True), pytest.raises(wal.NoSpaceError):
        log.append(b"refused")
    log.wait(2, durability="sync")  # no append in between: this wait alone rewrites LSN 2
    assert log.watermarks.durable == 2
    with wal.drill.failpoints.failpoint("write", errno.ENOSPC, repeat=True):
        with pytest.raises(wal.NoSpaceError):
            log.append(b"refused too")
        with pytest.raises(wal.NoSpaceError):  # still full: a write of its own failed, so it says so
            log.wait(3, durability="sync")
    log.sync()
    assert log.watermarks.durable == 3
    log.close()
    with wal.Log.open(tmp_path) as again:
        assert [p for _, p in again.read()] == [b"before", b"refused", b"refused too"]


def test_failed_fsync_in_the_flusher_stops_an_interval_log(tmp_path: Path) -> None:
    acknowledged: dict[int, bytes] = {}
    sent: dict[int, bytes] = {}
    log = wal.Log.open(tmp_path, durability="interval", rpo_ms=50)
    with wal.drill.failpoints.failpoint("fsync", errno.EIO):
        i = 0

        def stopped() -> bool:
            nonlocal i
            i += 1
            sent[i] = payload(i)
            try:
                log.append(sent[i])
            except wal.FailedError:
                return True
            acknowledged[i] = sent[i]  # written to the OS: survives a process kill, and this is one
            return False

        assert wait_until(stopped, seconds=10)
        with pytest.raises(wal.FailedError):
            log.append(b"after")
        with pytest.raises(wal.FailedError):
            log.close()
    _reopen_and_check(tmp_path, acknowledged, sent)


@pytest.mark.parametrize("site", ["open", "ftruncate", "rename", "dirsync"])
def test_failed_segment_creation_on_roll_stops_the_log_and_reopen_recovers(tmp_path: Path, site: str) -> None:
    acknowledged: dict[int, bytes] = {}
    sent: dict[int, bytes] = {}
    log = wal.Log.open(tmp_path, segment_bytes=8192)
    i = 0
    with wal.drill.failpoints.failpoint(site, errno.EIO):
        with pytest.raises(wal.FailedError):
            while True:
                i += 1
                sent[i] = payload(i, 200)
                log.append(sent[i])
                acknowledged[i] = sent[i]
        assert i > 1
        with pytest.raises(wal.FailedError):
            log.close()
    assert not list(tmp_path.glob("*.tmp"))  # the half-made segment was removed
    _reopen_and_check(tmp_path, acknowledged, sent)


def test_an_async_append_while_the_disk_is_full_raises_no_space_and_later_ones_succeed(tmp_path: Path) -> None:
    log = wal.Log.open(tmp_path)

    async def scenario() -> tuple[int, int]:
        first = await log.append_async(b"before")
        with wal.drill.failpoints.failpoint("write", errno.ENOSPC, repeat=True), pytest.raises(wal.NoSpaceError):
            await asyncio.wait_for(log.append_async(b"refused"), timeout=30)
        return first, await asyncio.wait_for(log.append_async(b"after"), timeout=30)

    first, after = asyncio.run(scenario())
    assert (first, after) == (1, 3)
    log.close()
    with wal.Log.open(tmp_path) as again:
        assert [p for _, p in again.read()] == [b"before", b"refused", b"after"]  # rewritten in place


@pytest.mark.parametrize("level", ["sync", "interval", "buffered"])
def test_log_append_at_every_level_takes_bytes_likes_refuses_bad_payloads_and_writes_nothing_for_them(
        tmp_path: Path, level: str) -> None:
    # Log.append is one call into native/appendcall.c at every level: what it refuses must be
    # refused before anything is written, with the same errors as the other append paths.
    with wal.Log.open(tmp_path, durability=level, rpo_ms=None if level == "sync" else 60_000) as log:
        assert log.append(b"a") == 1
        assert log.append(bytearray(b"b")) == 2
        assert log.append(memoryview(b"xcx")[1:2]) == 3
        with pytest.raises(wal.RecordTooLargeError, match=f"payload of {MAX_PAYLOAD + 1} bytes"):
            log.append(bytes(MAX_PAYLOAD + 1))
        with pytest.raises(TypeError):
            log.append("text")  # type: ignore[arg-type]
        assert log.watermarks.appended == 3
        with pytest.raises(TypeError, match="must be bytes"):
            append_record(handle_address(log._handle), "text", lib.WAL_LEVEL_SYNC)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="takes"):
            append_record(handle_address(log._handle), b"x")  # type: ignore[call-arg]
        log.sync()
        assert list(log.read(1)) == [(1, b"a"), (2, b"b"), (3, b"c")]
