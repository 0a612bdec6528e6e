"""Waiting at `replicated`: the log's archive watermark (native/commit.c, "The archive's
watermark"), where committing threads wait in C for the shipper to report the archive's
progress, and the shipper's gathering of a group (wal/archive/shipper.py, `Shipper._gather`).

Real logs, real fdatasync, a real ``file://`` archive; the object store is held back for one
PUT by `HeldPut` (a fault injector in front of it, as the failpoints are for the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from archive_helpers import HeldPut, wait_until

import wal
import wal.drill.failpoints
from wal.archive import layout
from wal.archive.objects import ArchiveUnavailableError, FileObjects
from wal.archive.restore import verify
from wal.log import record

ONE_WRITER = {"archive_fencing": False, "archive_rpo_ms": 60_000}



# ---- the log's archive watermark ---------------------------------------------------------------


def test_threads_waiting_for_the_archive_watermark_wake_once_it_holds_their_lsn(tmp_path) -> None:
    """Each waiter returns once the watermark reaches its LSN, not before; a watermark never goes
    back; stopping it wakes every waiter left, which then learns the archive never held its LSN."""
    with wal.Log.open(tmp_path, durability="sync") as log:
        last = log.append_many([b"r%d" % i for i in range(1, 11)])
        assert last == 10
        done: dict[int, bool] = {}
        lock = threading.Lock()

        def wait(lsn: int) -> None:
            held = log._archive_wait(lsn)
            with lock:
                done[lsn] = held

        threads = [threading.Thread(target=wait, args=(lsn,)) for lsn in range(1, 11)]
        for th in threads:
            th.start()
        time.sleep(0.1)
        assert done == {}
        log._archive_set(4)
        wait_until(lambda: len(done) == 4)
        time.sleep(0.05)
        assert done == {1: True, 2: True, 3: True, 4: True}
        log._archive_set(2)  # never backwards: nobody else wakes, 3 and 4 stay held
        assert log._archive_wait(3) is True
        time.sleep(0.05)
        assert len(done) == 4
        log._archive_set(7)
        wait_until(lambda: len(done) == 7)
        log._archive_stop()
        for th in threads:
            th.join(10)
        assert done == {**{lsn: True for lsn in range(1, 8)}, **{lsn: False for lsn in range(8, 11)}}
        assert log._archive_wait(9) is False  # stopped for good
        assert log._archive_wait(7) is True  # held before it stopped
        with pytest.raises(wal.WalError, match="invalid argument"):
            log._archive_wait(11)  # not appended


def test_coroutines_waiting_for_the_archive_watermark_wake_in_lsn_order_whatever_order_they_came_in(
        tmp_path) -> None:
    """`Log.wait_archived_async`: a coroutine resolves once the watermark (and the log's
    durable LSN) reaches its LSN, not before, however the waits were registered (LSN 9 before
    2..8: a wait is placed by its LSN); stopping the watermark fails the rest with FailedError."""
    with wal.Log.open(tmp_path, durability="sync") as log:
        log.append_many([b"r%d" % i for i in range(1, 11)])
        done: list[int] = []
        failed: dict[int, BaseException] = {}

        async def wait(lsn: int) -> None:
            try:
                await log.wait_archived_async(lsn)
                done.append(lsn)
            except wal.WalError as exc:
                failed[lsn] = exc

        async def until_done(n: int) -> None:
            while len(done) < n:
                await asyncio.sleep(0.005)

        async def main() -> None:
            tasks = [asyncio.ensure_future(wait(lsn)) for lsn in (1, 9, *range(2, 9), 10)]
            await asyncio.sleep(0.05)
            assert done == []
            await asyncio.to_thread(log._archive_set, 4)
            await asyncio.wait_for(until_done(4), 10)
            await asyncio.sleep(0.05)
            assert sorted(done) == [1, 2, 3, 4]
            await asyncio.to_thread(log._archive_set, 8)
            await asyncio.wait_for(until_done(8), 10)
            await asyncio.sleep(0.05)
            assert sorted(done) == list(range(1, 9)), "9 was registered second and must not go early"
            await asyncio.to_thread(log._archive_stop)
            await asyncio.wait_for(asyncio.gather(*tasks), 10)

        asyncio.run(main())
        assert sorted(failed) == [9, 10]
        assert all(isinstance(e, wal.FailedError) and "stopped before" in str(e) for e in failed.values())


def test_a_coroutine_that_waits_after_the_event_announcing_its_lsn_was_drained_returns_at_once(tmp_path) -> None:
    """The loop drains the log's eventfd when the watermark moves, whoever waits: a coroutine
    that registers after that (the Python commit path waits for its fdatasync first) is
    answered from what the loop read then, as is one that waits after the shipper stopped or
    the log failed, rather than waiting for an event that will never come."""

    async def main(log: wal.Log) -> None:
        first = asyncio.ensure_future(log.wait_archived_async(1))
        await asyncio.sleep(0.02)
        await asyncio.to_thread(log._archive_set, 1)
        await asyncio.wait_for(first, 5)
        await asyncio.to_thread(log._archive_set, 2)
        await asyncio.sleep(0.05)  # the loop drains that event, with nobody waiting
        await asyncio.wait_for(log.wait_archived_async(2), 5)
        await asyncio.to_thread(log._archive_stop)
        await asyncio.sleep(0.05)
        with pytest.raises(wal.FailedError, match="stopped before LSN 3"):
            await asyncio.wait_for(log.wait_archived_async(3), 5)
        await asyncio.wait_for(log.wait_archived_async(2), 5)  # held before it stopped

    with wal.Log.open(tmp_path / "stopped", durability="sync") as log:
        log.append_many([b"a", b"b", b"c"])
        asyncio.run(main(log))

    async def failing(log: wal.Log) -> None:
        first = asyncio.ensure_future(log.wait_archived_async(1))
        await asyncio.sleep(0.02)
        await asyncio.to_thread(log._archive_set, 1)
        await asyncio.wait_for(first, 5)
        with wal.drill.failpoints.failpoint("fsync", errno.EIO), pytest.raises(wal.FailedError):
            await asyncio.to_thread(log.append, b"b")
        await asyncio.sleep(0.05)  # the loop drains the failure's event, with nobody waiting
        with pytest.raises(wal.FailedError, match="failed"):
            await asyncio.wait_for(log.wait_archived_async(2), 5)

    log = wal.Log.open(tmp_path / "failed", durability="sync")
    try:
        log.append(b"a")
        asyncio.run(failing(log))
    finally:
        wal.drill.failpoints.clear()
        with contextlib.suppress(wal.FailedError):
            log.close()


def test_archive_waiters_get_the_logs_failure_and_its_close(tmp_path) -> None:
    """A waiter learns of an fdatasync failure (I5: FailedError) or of the log closing
    (ClosedError) while it waits, rather than waiting on."""
    errors: list[BaseException] = []

    def wait(log: wal.Log, lsn: int) -> None:
        try:
            log._archive_wait(lsn)
        except wal.WalError as exc:
            errors.append(exc)

    log = wal.Log.open(tmp_path / "failed", durability="sync")
    try:
        lsn = log.append(b"a")
        th = threading.Thread(target=wait, args=(log, lsn))
        th.start()
        time.sleep(0.05)
        with wal.drill.failpoints.failpoint("fsync", errno.EIO), pytest.raises(wal.FailedError):
            log.append(b"b")
        th.join(10)
        assert len(errors) == 1 and isinstance(errors[0], wal.FailedError)
    finally:
        wal.drill.failpoints.clear()
        with contextlib.suppress(wal.FailedError):  # it says again that it failed
            log.close()
    errors.clear()
    log = wal.Log.open(tmp_path / "closed", durability="sync")
    lsn = log.append(b"a")
    th = threading.Thread(target=wait, args=(log, lsn))
    th.start()
    time.sleep(0.05)
    log.close()
    th.join(10)
    assert len(errors) == 1 and isinstance(errors[0], wal.ClosedError)


# ---- replicated commits ------------------------------------------------------------------------


def test_replicated_commits_from_many_threads_return_only_once_the_archive_holds_them(tmp_path) -> None:
    """At a `replicated` store, 16 threads commit: each put returns only once the archived LSN
    covers it; the commits share objects (groups); a restore holds every acknowledged commit."""
    store = wal.open(tmp_path / "s", durability="replicated", archive=f"file://{tmp_path}/a", **ONE_WRITER)
    acked: list[tuple[str, int]] = []
    early: list[int] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(40):
            lsn = store.put(f"t{t}/{i}", b"v%d" % i)
            if store.archived_lsn < lsn:
                early.append(lsn)
            with lock:
                acked.append((f"t{t}/{i}", lsn))

    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert len(acked) == 640 and early == []
        puts = store.stats()["archive_objects"]
        assert puts < 640, "every commit had an object of its own: no group"
    finally:
        store.close()
    restored = wal.open(wal.restore(f"file://{tmp_path}/a", tmp_path / "r").path)
    try:
        for key, lsn in acked:
            assert restored.version(key) == lsn
    finally:
        restored.close()


def test_a_held_put_holds_back_every_commit_it_carries_and_those_behind_it_share_the_next(tmp_path) -> None:
    """One PUT in flight at a `replicated` store: while it is held, none of its commits (nor any
    later one) is acknowledged and every thread waits; once it is stored, every commit is
    acknowledged, and the commits that waited behind it share the next PUT."""
    objects = HeldPut(str(tmp_path / "a"), hold_from=10)
    store = wal.open(tmp_path / "s", durability="replicated", archive=objects, **ONE_WRITER)
    try:
        for i in range(9):
            store.put(f"first{i}", b"x")  # one object each: nothing else commits
        acked: list[int] = []
        lock = threading.Lock()
        go = threading.Barrier(8)

        def work(t: int) -> None:
            go.wait()
            for i in range(5):
                lsn = store.put(f"t{t}/{i}", b"v")
                with lock:
                    acked.append(lsn)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        wait_until(lambda: objects.held is not None)
        held = layout.parse_name(objects.held or "")
        assert held is not None and held.first == 10
        time.sleep(0.2)
        assert acked == [] and store.archived_lsn == 9
        before = objects.log_puts
        objects.release.set()
        for th in threads:
            th.join(60)
        assert sorted(acked) == list(range(10, 50))
        # The commits that waited behind the held object (LSNs 11-17, one per other thread)
        # went out together in the next PUT: fewer PUTs than commits, whatever the timing.
        assert objects.log_puts - before <= 33
    finally:
        objects.release.set()
        store.close()
    assert verify(f"file://{tmp_path}/a").ok


def test_a_gather_ends_once_the_commits_it_released_are_appended_again_and_durable(tmp_path) -> None:
    """The next group's PUT waits for the commits the last stored object released to be
    committed again (`Shipper._gather`): the last of them to append wakes the gathering
    thread, which waits for their fdatasync and sends them, one object for all of them. With
    the gather's own bound made 60 s, 8 threads x 6 commits finish long before one bound could
    pass, and each group object after the first carries the 8 commits of a round."""
    store = wal.open(tmp_path / "s", durability="replicated", archive=f"file://{tmp_path}/a", **ONE_WRITER)
    shipper = store._shipper
    assert shipper is not None
    shipper._gather_s = lambda: 60.0  # type: ignore[method-assign]
    started = time.monotonic()
    go = threading.Barrier(8)
    done: list[int] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        go.wait()
        for i in range(6):
            lsn = store.put(f"t{t}/{i}", b"v")
            with lock:
                done.append(lsn)

    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(50)
        assert sorted(done) == list(range(1, 49))
        assert time.monotonic() - started < 45, "a gather waited for its 60 s bound"
        # One round's 8 commits per object once the threads run in step (the first objects may
        # split a round: the threads start one by one).
        assert shipper.counters["archive_objects"] <= 16
    finally:
        store.close()


def test_threads_waiting_for_an_archive_that_never_answers_fail_when_the_store_closes(tmp_path) -> None:
    """The object store never answers the PUT a thread waits for: closing the store (its flush
    bounded) wakes the thread with FailedError, the commit durable locally but not acknowledged
    at `replicated`; reopened, the store ships it."""
    objects = HeldPut(str(tmp_path / "a"), hold_from=2)
    store = wal.open(tmp_path / "s", durability="replicated", archive=objects, **ONE_WRITER)
    store._close_flush_s = 0.2
    store.put("one", b"1")
    outcome, th = _put_two_in_a_thread(store)
    wait_until(lambda: objects.held is not None)
    time.sleep(0.1)
    assert outcome == []
    store.close()
    th.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], wal.FailedError), outcome
    assert "stopped before LSN 2 was shipped (the store was closed)" in str(outcome[0])
    assert "durable in the local log and ships when the store is next opened" in str(outcome[0])
    objects.abandon()
    with wal.open(tmp_path / "s", durability="replicated", archive=f"file://{tmp_path}/a", **ONE_WRITER) as again:
        assert again.get("two") == b"2"
        again.put("three", b"3")
        assert again.archived_lsn >= 3


# ---- the shipper's reads of the log ------------------------------------------------------------


def test_reads_that_stop_inside_a_batch_resume_there_not_at_the_segment_start(tmp_path) -> None:
    """The shipper reads the log up to the durable LSN, which is often inside the batch of
    records the scan validated: the next read starts at the batch's first record at worst (a
    resume point the cache keeps), never at the segment's start, and reads exactly what a fresh
    read of the files gives, from every LSN."""
    payload = os.urandom(100)
    with wal.Log.open(tmp_path, durability="sync") as log:
        log.append_many([payload + b"%d" % i for i in range(1, 3001)])
        got: list[int] = []
        nxt = 1
        step = 1
        while nxt <= 3000:
            upto = min(3000, nxt + step - 1)
            for lsn, data in log._read_upto(nxt, upto):
                assert data == payload + b"%d" % lsn
                got.append(lsn)
            (state,) = log._scan_resume.resume.values()
            assert state[1].last_lsn == upto  # the scan stopped at upto, where the next read begins
            nxt = upto + 1
            step = step * 3 % 97 + 1
        assert got == list(range(1, 3001))
        # A reader that stops early (a plain read, broken off): the cache keeps the batch's start.
        for lsn, _ in log.read(1000):
            if lsn == 1010:
                break
        (state,) = log._scan_resume.resume.values()
        assert state[2] is not None and state[2].last_lsn == 999 and state[1].last_lsn > 1010
        assert [lsn for lsn, _ in log.read(1011)] == list(range(1011, 3001))
        assert [lsn for lsn, _ in log.read(1)] == list(range(1, 3001))


def test_a_replicated_put_whose_fdatasync_fails_is_not_acknowledged_and_the_store_stops(tmp_path) -> None:
    """A put at a `replicated` store waits for its fdatasync and the archive in one call: an
    fdatasync that fails there (I5) fails the put with FailedError, and the store refuses every
    commit after it; reopened, it recovers what the disk holds and ships on."""
    url = f"file://{tmp_path}/a"
    store = wal.open(tmp_path / "s", durability="replicated", archive=url, **ONE_WRITER)
    try:
        assert store.put("before", b"1") == 1
        with wal.drill.failpoints.failpoint("fsync", errno.EIO), pytest.raises(wal.FailedError):
            store.put("lost", b"2")
        with pytest.raises(wal.FailedError):
            store.put("after", b"3")
    finally:
        wal.drill.failpoints.clear()
        with contextlib.suppress(wal.WalError):
            store.close()
    with wal.open(tmp_path / "s", durability="replicated", archive=url, **ONE_WRITER) as again:
        assert again.get("before") == b"1"
        lsn = again.put("later", b"4")
        assert again.archived_lsn >= lsn


# ---- coroutines at `replicated` (the log's eventfd: wal/log/log.py, `until_archived`) ----------


def test_coroutines_at_replicated_are_acknowledged_only_once_the_archive_holds_their_commits(tmp_path) -> None:
    """50 tasks aput at a `replicated` store whose PUT from LSN 2 on is held: none is
    acknowledged while it is held, each once its object (and every one before it) is stored, on
    one future each (no second wait for the fdatasync); a restore holds every commit."""
    objects = HeldPut(str(tmp_path / "a"), hold_from=2)
    store = wal.open(tmp_path / "s", durability="replicated", archive=objects, **ONE_WRITER)
    acked: list[tuple[str, int]] = []
    early: list[int] = []

    async def work(t: int) -> None:
        for i in range(4):
            lsn = await store.aput(f"t{t}/{i}", b"v%d" % i)
            if store.archived_lsn < lsn:
                early.append(lsn)
            acked.append((f"t{t}/{i}", lsn))

    async def main() -> None:
        assert await store.aput("first", b"1") == 1
        tasks = [asyncio.ensure_future(work(t)) for t in range(50)]
        while objects.held is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert acked == [] and store.archived_lsn == 1, "acknowledged before the archive held it"
        objects.release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)

    try:
        asyncio.run(main())
        assert len(acked) == 200 and early == []
        assert store.stats()["archive_objects"] < 200, "every commit had an object of its own: no group"
    finally:
        objects.release.set()
        store.close()
    restored = wal.open(wal.restore(f"file://{tmp_path}/a", tmp_path / "r").path)
    try:
        for key, lsn in acked:
            assert restored.version(key) == lsn
    finally:
        restored.close()


def test_no_replicated_commit_is_left_for_the_shipper_threads_round(tmp_path, monkeypatch) -> None:
    """Every `replicated` commit's group is sent by a PUT thread or by the commit itself, never
    left to the shipper thread's periodic round: with that round made 60 s, 300 awaited aputs
    one after another (each kicks a gather that may be ending as it appends) and 8 threads'
    puts beside them all return, each well within the 20 s it is given."""
    from wal.archive.shipper import Shipper  # noqa: PLC0415

    monkeypatch.setattr(Shipper, "period", property(lambda self: 60.0))
    store = wal.open(tmp_path / "s", durability="replicated", archive=f"file://{tmp_path}/a", **ONE_WRITER)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(40):
                store.put(f"t{t}/{i}", b"v")
        except BaseException as exc:  # reported below
            errors.append(exc)

    async def main() -> None:
        for i in range(300):
            await asyncio.wait_for(store.aput(f"a{i}", b"v"), 20)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    try:
        for th in threads:
            th.start()
        asyncio.run(main())
        for th in threads:
            th.join(60)
        assert errors == [] and not any(th.is_alive() for th in threads)
        assert store.archived_lsn == 300 + 8 * 40
    finally:
        store.close()


async def _second_aput_held(store: wal.Store, objects: HeldPut) -> asyncio.Future[int]:
    """aput "one" (LSN 1, archived), then start aput "two" and return its task once `objects`
    holds its PUT (`HeldPut(..., hold_from=2)`)."""
    await store.aput("one", b"1")
    task = asyncio.ensure_future(store.aput("two", b"2"))
    while objects.held is None:
        await asyncio.sleep(0.01)
    return task


def test_a_cancelled_replicated_aput_waits_for_the_archive_then_raises(tmp_path) -> None:
    """aput's cancellation contract at `replicated`: the commit is in the log, so a task
    cancelled while the archive holds its PUT back goes on waiting, and its CancelledError comes
    once the archive holds the commit."""
    objects = HeldPut(str(tmp_path / "a"), hold_from=2)
    store = wal.open(tmp_path / "s", durability="replicated", archive=objects, **ONE_WRITER)

    async def main() -> None:
        task = await _second_aput_held(store, objects)
        task.cancel()
        await asyncio.sleep(0.2)
        assert not task.done(), "the cancellation abandoned a commit already in the log"
        objects.release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        assert store.archived_lsn >= 2

    try:
        asyncio.run(main())
    finally:
        objects.release.set()
        store.close()
    assert wal.restore(f"file://{tmp_path}/a", tmp_path / "r").lsn == 2


def test_a_coroutine_waiting_for_an_archive_that_never_answers_fails_when_the_store_closes(tmp_path) -> None:
    """As for a thread: closing the store (its flush bounded) fails the waiting aput with
    FailedError naming the LSN; reopened, the store ships it."""
    objects = HeldPut(str(tmp_path / "a"), hold_from=2)
    store = wal.open(tmp_path / "s", durability="replicated", archive=objects, **ONE_WRITER)
    store._close_flush_s = 0.2

    async def main() -> None:
        task = await _second_aput_held(store, objects)
        closing = threading.Thread(target=store.close)
        closing.start()
        with pytest.raises(wal.FailedError, match="stopped before LSN 2"):
            await asyncio.wait_for(task, 30)
        closing.join(30)

    asyncio.run(main())
    objects.abandon()
    with wal.open(tmp_path / "s", durability="replicated", archive=f"file://{tmp_path}/a", **ONE_WRITER) as again:
        assert again.get("two") == b"2"
        again.put("three", b"3")
        assert again.archived_lsn >= 3


def test_a_store_closed_from_a_coroutine_acknowledges_the_commits_its_archive_took_meanwhile(tmp_path) -> None:
    """`store.close()` called on the loop's own thread (as in a `finally`) while a coroutine's
    PUT is held: the PUT is stored during close's flush, so the waiting aput returns its LSN
    (not ClosedError, which would tell its caller to commit again)."""
    objects = HeldPut(str(tmp_path / "a"), hold_from=2)
    store = wal.open(tmp_path / "s", durability="replicated", archive=objects, **ONE_WRITER)

    async def main() -> int:
        await store.aput("one", b"1")
        task = asyncio.ensure_future(store.aput("two", b"2"))
        while objects.held is None:
            await asyncio.sleep(0.01)
        threading.Timer(0.3, objects.release.set).start()
        store.close()  # blocks the loop: its flush waits for the PUT
        assert store.archived_lsn == 2
        return await asyncio.wait_for(task, 10)

    try:
        assert asyncio.run(main()) == 2
    finally:
        objects.release.set()
        store.close()


def test_a_store_closed_from_another_thread_acknowledges_every_waiting_coroutine_its_archive_took(tmp_path) -> None:
    """Closed from another thread while 200 coroutines wait at `replicated`, the archive taking
    their group during close's flush: each aput returns its LSN, whether the loop runs during
    the close or is held until the log has closed (then only the close's answers, from the
    final marks, can tell it; they told it ClosedError), and the log's lock is released. The
    answers are given on the loop's thread; that they no longer race the loop is by
    construction, which this test does not force."""
    for round_no in range(6):
        objects = HeldPut(str(tmp_path / f"a{round_no}"), hold_from=2)
        store = wal.open(tmp_path / f"s{round_no}", durability="replicated", archive=objects, **ONE_WRITER)

        async def main(store: wal.Store = store, objects: HeldPut = objects, round_no: int = round_no) -> list[int]:
            await store.aput("first", b"1")
            tasks = [asyncio.ensure_future(store.aput(f"k{i}", b"v")) for i in range(200)]
            while objects.held is None:
                await asyncio.sleep(0.005)
            closing = threading.Thread(target=store.close)
            closing.start()
            threading.Timer(0.05, objects.release.set).start()
            if round_no % 2:
                closing.join(30)  # the loop held until the log has closed: its waiters wait for detach
                assert not closing.is_alive()
            lsns = await asyncio.wait_for(asyncio.gather(*tasks), 30)
            closing.join(30)
            assert not closing.is_alive()
            return lsns

        try:
            assert sorted(asyncio.run(main())) == list(range(2, 202))
        finally:
            objects.release.set()
            store.close()
        with wal.open(tmp_path / f"s{round_no}") as again:  # closed whole: its lock released
            assert again.get("k199") == b"v"


def test_a_commit_the_archive_took_after_the_durable_lsn_was_read_is_acknowledged_not_failed(tmp_path) -> None:
    """A loop reads the log's watermarks, then the archive's marks. Between the two the archive
    may take a commit past the durable LSN read (made durable and shipped meanwhile), and its
    shipper may then stop (the store closing): that commit is held, not one it never will."""
    log = wal.Log.open(tmp_path / "log", durability="sync")
    try:
        async def main() -> None:
            await log.append_async(b"one")
            waiters = log._waiters()
            lsn = log.append(b"two")
            log.wait(lsn)
            log._archive_set(lsn)
            log._archive_stop()
            fut = asyncio.get_running_loop().create_future()
            waiters._archived.append((lsn, fut))
            waiters._check_archived(written=lsn - 1, durable=lsn - 1, failed=0, no_space_through=0,
                                    refused_errno=0)  # the watermarks as read before the archive took it
            assert fut.done() and fut.exception() is None, fut

        asyncio.run(main())
    finally:
        log.close()


def test_a_replicated_aput_whose_fdatasync_fails_is_not_acknowledged_and_the_store_stops(tmp_path) -> None:
    """The log's failure reaches a coroutine waiting for the archive (I5: FailedError), and the
    store refuses every commit after it."""
    store = wal.open(tmp_path / "s", durability="replicated", archive=f"file://{tmp_path}/a", **ONE_WRITER)

    async def main() -> None:
        assert await store.aput("before", b"1") == 1
        with wal.drill.failpoints.failpoint("fsync", errno.EIO), pytest.raises(wal.FailedError):
            await asyncio.wait_for(store.aput("lost", b"2"), 30)
        with pytest.raises(wal.FailedError):
            await store.aput("after", b"3")

    try:
        asyncio.run(main())
    finally:
        wal.drill.failpoints.clear()
        with contextlib.suppress(wal.WalError):
            store.close()


def test_a_coroutine_waiting_at_replicated_learns_that_its_store_was_fenced(tmp_path) -> None:
    """Another writer's object takes the name of the PUT a coroutine waits for (a follower was
    promoted meanwhile): the aput fails with FailedError saying the store was fenced, and the
    store refuses every commit after it."""
    objects = HeldPut(str(tmp_path / "a"), hold_from=2)
    store = wal.open(tmp_path / "s", durability="replicated", archive=objects, **ONE_WRITER)

    async def main() -> None:
        task = await _second_aput_held(store, objects)
        now = time.time_ns() // 1_000_000
        taken = layout.encode_log([(2, record.encode([(record.OP_PUT, b"theirs", b"2")], now, None))], os.urandom(16))
        FileObjects(str(tmp_path / "a")).put(layout.log_name(2), taken)
        objects.release.set()
        with pytest.raises(wal.FailedError, match="fenced"):
            await asyncio.wait_for(task, 30)
        with pytest.raises(wal.FailedError, match="fenced"):
            await store.aput("three", b"3")

    try:
        asyncio.run(main())
    finally:
        objects.release.set()
        with contextlib.suppress(wal.WalError):
            store.close()


def _put_two_in_a_thread(store: wal.Store) -> tuple[list[object], threading.Thread]:
    """A thread (started) putting "two": its LSN, or the WalError, lands in the list."""
    outcome: list[object] = []

    def commit() -> None:
        try:
            outcome.append(store.put("two", b"2"))
        except wal.WalError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=commit)
    thread.start()
    return outcome, thread


class LandsLate(FileObjects):
    """file:// objects; the first PUT of ``log/<2>.wal`` waits for `release` and then stores its
    object; any later PUT of that name waits until it has, so it finds the name taken."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.release, self.landed = threading.Event(), threading.Event()
        self.first_sent = False

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        if name != layout.log_name(2):
            return super().put(name, data, create_only=create_only)
        if not self.first_sent:
            self.first_sent = True
            self.release.wait(60)
            try:
                return super().put(name, data, create_only=create_only)
            finally:
                self.landed.set()
        self.landed.wait(10)
        return super().put(name, data, create_only=create_only)


def test_a_store_reopened_while_a_put_of_its_closed_predecessor_is_in_flight_waits_for_it(tmp_path) -> None:
    """Closed with a PUT in flight (its flush bounded), then reopened in the same process: the
    old PUT landed after the new open had read the archive's end, the new store's PUT of the same
    name found it taken by the writer it resumed after, and it stopped as fenced. The open now
    waits for the closed store's PUTs first, and so finds that object in the archive."""
    objects = LandsLate(str(tmp_path / "a"))
    store = wal.open(tmp_path / "s", durability="replicated", archive=objects, archive_rpo_ms=60_000)
    store._close_flush_s = 0.2
    store.put("one", b"1")
    outcome, committer = _put_two_in_a_thread(store)
    wait_until(lambda: objects.first_sent)
    store.close()
    committer.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], wal.FailedError), outcome
    threading.Timer(0.3, objects.release.set).start()  # lands while the store below opens
    with wal.open(tmp_path / "s", durability="replicated", archive=objects, archive_rpo_ms=60_000) as again:
        assert again.get("two") == b"2"
        assert again.put("three", b"3") == 3  # acknowledged at replicated: the archive holds it
    report = wal.restore(f"file://{tmp_path}/a", tmp_path / "r")
    assert report.lsn == 3


class _SnapshotsHeld(FileObjects):
    """A file:// archive whose snapshot PUTs wait until `release` is set."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.release = threading.Event()

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        if name.startswith(layout.SNAP_PREFIX):
            self.release.wait(60)
        super().put(name, data, create_only=create_only)


def _store_with_history(path: Path) -> dict[str, Any]:
    """A store whose log starts past LSN 1 (its history checkpointed away before any archive);
    the options it is opened with."""
    opts: dict[str, Any] = {"segment_bytes": 4096, "checkpoint_bytes": 1 << 16}
    with wal.open(path, **opts) as s:
        for i in range(300):
            s.put(f"k{i}", b"b" * 64)
        s.checkpoint()
        assert s._log.first_lsn > 1
    return opts


def _putting(store: wal.Store, key: str, value: bytes) -> tuple[threading.Thread, list[int]]:
    """A put in a thread of its own, started: the thread and the list its LSN lands in."""
    done: list[int] = []
    putting = threading.Thread(target=lambda: done.append(store.put(key, value)))
    putting.start()
    return putting, done


def test_a_store_with_history_older_than_its_archive_acknowledges_nothing_at_replicated_before_its_base_snapshot(
        tmp_path: Path) -> None:
    # Its log starts past LSN 1: the archive can restore nothing until the snapshot the log
    # continues from is stored, however many log objects it holds. A commit acknowledged
    # before then would be lost with the machine (a restore refuses an archive with no base).
    opts = _store_with_history(tmp_path / "s")
    objects = _SnapshotsHeld(str(tmp_path / "a"))
    s = wal.open(tmp_path / "s", archive=objects, durability="replicated", **opts)
    try:
        putting, done = _putting(s, "paid", b"yes")
        wait_until(lambda: any((tmp_path / "a" / "log").glob("*")), 30)  # its log object is stored
        putting.join(timeout=1.0)
        assert done == [] and putting.is_alive()  # ... and the commit still waits for the base
        objects.release.set()
        putting.join(timeout=60)
        assert done and not putting.is_alive()
    finally:
        objects.release.set()
        s.close()
    restored = wal.restore(f"file://{tmp_path}/a", tmp_path / "r")
    assert restored.lsn >= done[0]
    with wal.open(tmp_path / "r") as r:
        assert r.get("paid") == b"yes" and r.get("k0") == b"b" * 64


class _NoSnapshots(FileObjects):
    """A file:// archive that refuses snapshot PUTs (a writer that stops before its base is stored)."""

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        if name.startswith(layout.SNAP_PREFIX):
            raise ArchiveUnavailableError(f"{name}: refused")
        super().put(name, data, create_only=create_only)


def test_a_base_snapshot_still_missing_at_the_next_open_still_holds_replicated_acknowledgements_back(
        tmp_path: Path) -> None:
    # The first session shipped log objects and closed before its base snapshot was stored:
    # the archive holds log from past LSN 1 and no snapshot. The next session must not take
    # that log for a restorable archive.
    opts = _store_with_history(tmp_path / "s")
    with wal.open(tmp_path / "s", archive=_NoSnapshots(str(tmp_path / "a")), **opts) as s:
        s.put("shipped", b"without a base")
        wait_until(lambda: any((tmp_path / "a" / "log").glob("*")), 30)
    assert not any((tmp_path / "a").glob("snap/*"))
    objects = _SnapshotsHeld(str(tmp_path / "a"))
    s = wal.open(tmp_path / "s", archive=objects, durability="replicated", **opts)
    try:
        putting, done = _putting(s, "paid", b"yes")
        putting.join(timeout=1.5)
        assert done == [] and putting.is_alive()  # waits for the base, not only for its log object
        objects.release.set()
        putting.join(timeout=60)
        assert done
    finally:
        objects.release.set()
        s.close()
    with wal.open(wal.restore(f"file://{tmp_path}/a", tmp_path / "r").path) as r:
        assert r.get("paid") == b"yes" and r.get("shipped") == b"without a base"
