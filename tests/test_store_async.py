"""The asyncio API: `aput`, `adelete`, `atransaction` from 1,000 concurrent tasks.

All commits succeed and are visible; at `sync` they share fdatasyncs (group commit); and
the event loop is never blocked while a commit waits for durability -- shown by counting:
a task that blocked the loop until its fdatasync would finish before the next task could
even start, and a ticker task could not run between commits. And a materializer that falls
behind does not let async commits queue without bound (max_unapplied holds for `aput` too).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import wal
import wal.drill.failpoints
from wal.log.log import _AsyncWaiters

TASKS = 1000
LEVELS = [("sync", None), ("interval", 50), ("buffered", 50)]


class Ticker:
    """Counts how often the loop gets to run it (and the longest gap, reported, not asserted).

    `period` 0 counts loop iterations. `busy()` says whether commits are in flight; ticks taken
    then are counted apart: a commit that blocked the loop until its fdatasync would leave
    no loop iteration for the ticker while commits are outstanding.
    """

    def __init__(self, period: float = 0.001, busy: Callable[[], bool] = lambda: False) -> None:
        self.period = period
        self.busy = busy
        self.ticks = 0
        self.ticks_while_busy = 0
        self.max_gap = 0.0
        self._stop = False

    async def run(self) -> None:
        last = time.monotonic()
        while not self._stop:
            await asyncio.sleep(self.period)
            now = time.monotonic()
            self.max_gap = max(self.max_gap, now - last)
            last = now
            self.ticks += 1
            self.ticks_while_busy += self.busy()

    def stop(self) -> None:
        self._stop = True


async def run_mixed_workload(store: wal.Store) -> tuple[list[str], Ticker]:
    """600 aput, 200 two-key atransaction, 200 adelete of pre-existing keys, all at once."""
    with store.transaction() as setup:  # one commit, one fsync
        for i in range(200):
            setup.put(f"del/{i:04d}", b"doomed")
    events: list[str] = []
    ticker = Ticker(period=0, busy=lambda: events.count("start") > events.count("done"))
    tick_task = asyncio.create_task(ticker.run())

    async def put(i: int) -> None:
        events.append("start")
        lsn = await store.aput(f"put/{i:04d}", b"v%d" % i)
        assert store.get(f"put/{i:04d}") == b"v%d" % i  # read-your-writes right after the await
        assert store.version(f"put/{i:04d}") == lsn
        events.append("done")

    async def tx(i: int) -> None:
        events.append("start")
        async with store.atransaction() as t:
            t.put(f"tx/{i:04d}/a", b"a%d" % i)
            t.put(f"tx/{i:04d}/b", b"b%d" % i)
        assert t.lsn is not None
        events.append("done")

    async def delete(i: int) -> None:
        events.append("start")
        await store.adelete(f"del/{i:04d}")
        events.append("done")

    jobs = ([put(i) for i in range(600)] + [tx(i) for i in range(200)] + [delete(i) for i in range(200)])
    assert len(jobs) == TASKS
    await asyncio.gather(*jobs)
    ticker.stop()
    await tick_task
    return events, ticker


def check_final_state(store: wal.Store) -> None:
    assert dict(store.scan(b"put/")) == {f"put/{i:04d}".encode(): b"v%d" % i for i in range(600)}
    tx_state = dict(store.scan(b"tx/"))
    assert len(tx_state) == 400
    for i in range(200):
        assert tx_state[f"tx/{i:04d}/a".encode()] == b"a%d" % i
        assert tx_state[f"tx/{i:04d}/b".encode()] == b"b%d" % i
        assert store.version(f"tx/{i:04d}/a") == store.version(f"tx/{i:04d}/b")
    assert list(store.scan(b"del/")) == []


@pytest.mark.parametrize(("level", "rpo_ms"), LEVELS)
def test_a_thousand_concurrent_tasks_all_commit_and_every_value_is_present(
        tmp_path: Path, level: str, rpo_ms: int | None) -> None:
    with wal.open(tmp_path, durability=level, rpo_ms=rpo_ms) as store:
        events, _ = asyncio.run(run_mixed_workload(store))
        assert events.count("done") == TASKS
        check_final_state(store)
        assert store.stats()["commits"] == 1 + TASKS
    with wal.open(tmp_path) as store:  # and all of it survives a reopen
        check_final_state(store)


def test_a_thousand_tasks_at_sync_share_fsyncs_and_never_block_the_loop(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        fsyncs_before = store.stats()["fsyncs"]
        events, ticker = asyncio.run(run_mixed_workload(store))
        stats = store.stats()
        fsyncs = stats["fsyncs"] - fsyncs_before - 1  # the setup transaction's
        # Group commit: fewer fdatasyncs than commits (each covers several). How many
        # depends on how fast the loop enqueues relative to one fdatasync: 4 to ~300 here.
        assert fsyncs * 2 <= TASKS, f"{fsyncs} fsyncs for {TASKS} commits"
        # Never blocking: most tasks started before most had finished. A blocking aput
        # would alternate start/done, so at most 1 task could be in flight at a time.
        in_flight = max_in_flight(events)
        assert in_flight >= TASKS // 2, f"at most {in_flight} commits were in flight at once"
        assert ticker.ticks_while_busy >= 1, "the loop never ran the ticker while commits were in flight"
        print(f"fsyncs={fsyncs} max_in_flight={in_flight} ticks={ticker.ticks} "
              f"busy_ticks={ticker.ticks_while_busy} max_loop_gap={ticker.max_gap * 1000:.1f} ms")


def max_in_flight(events: list[str]) -> int:
    level = peak = 0
    for e in events:
        level += 1 if e == "start" else -1
        peak = max(peak, level)
    return peak


def test_the_loop_keeps_ticking_while_one_task_awaits_commit_after_commit(tmp_path: Path) -> None:
    """500 awaited sync commits in a row and nothing else yielding: a 1 ms ticker only runs
    if each commit really awaits its fdatasync (a blocking commit would starve it to 0)."""
    async def main(store: wal.Store) -> Ticker:
        ticker = Ticker(period=0.001)
        task = asyncio.create_task(ticker.run())
        await asyncio.sleep(0)  # let the ticker start
        start = ticker.ticks
        for i in range(500):
            await store.aput(b"seq", b"%d" % i)
        ticker.ticks -= start
        ticker.stop()
        await task
        return ticker

    with wal.open(tmp_path) as store:
        fsyncs_before = store.stats()["fsyncs"]
        ticker = asyncio.run(main(store))
        assert store.get(b"seq") == b"499"
        assert store.stats()["fsyncs"] - fsyncs_before >= 100  # the commits really waited for disk
        assert ticker.ticks >= 10, f"the ticker ran only {ticker.ticks} times during 500 commits"
        print(f"ticks={ticker.ticks} max_loop_gap={ticker.max_gap * 1000:.1f} ms")


def test_async_conflicts_and_idempotency_behave_as_in_the_sync_api(tmp_path: Path) -> None:
    async def main(store: wal.Store) -> None:
        v = await store.aput(b"k", b"1")
        async with store.atransaction() as tx:
            tx.put(b"k", b"2", if_version=v)
        with pytest.raises(wal.ConflictError) as info:
            async with store.atransaction() as stale:
                stale.put(b"k", b"3", if_version=v)
        assert info.value.actual == tx.lsn
        async with store.atransaction(idempotency_key=b"once") as first:
            first.put(b"j", b"first")
        async with store.atransaction(idempotency_key=b"once") as again:
            again.put(b"j", b"second")
        assert (again.lsn, again.deduplicated) == (first.lsn, True)
        with pytest.raises(RuntimeError):
            async with store.atransaction() as aborted:
                aborted.put(b"j", b"aborted")
                raise RuntimeError
        assert aborted.lsn is None

    with wal.open(tmp_path) as store:
        asyncio.run(main(store))
        assert store.get(b"k") == b"2"
        assert store.get(b"j") == b"first"


def test_an_async_sync_transaction_in_an_interval_store_is_durable_when_awaited(tmp_path: Path) -> None:
    async def main(store: wal.Store) -> int:
        await store.aput(b"chatter", b"x")
        async with store.atransaction(durability="sync") as tx:
            tx.put(b"critical", b"v")
        assert tx.lsn is not None
        return tx.lsn

    with wal.open(tmp_path, durability="interval", rpo_ms=60_000) as store:
        lsn = asyncio.run(main(store))
        assert store.watermarks.durable >= lsn


def test_async_writes_on_a_closed_or_read_only_store_raise(tmp_path: Path) -> None:
    store = wal.open(tmp_path)
    store.put(b"k", b"v")
    store.close()
    with pytest.raises(wal.ClosedError):
        asyncio.run(store.aput(b"k", b"v"))
    with wal.open(tmp_path, readonly=True) as ro:
        with pytest.raises(wal.ReadOnlyError):
            asyncio.run(ro.aput(b"k", b"v2"))
        with pytest.raises(wal.ReadOnlyError):
            asyncio.run(ro.adelete(b"k"))
        assert ro.get(b"k") == b"v"


@pytest.mark.parametrize("api", ["put", "aput"])
def test_commits_apply_the_backlog_themselves_when_the_materializer_falls_behind(
        tmp_path: Path, api: str, starve_materializer: Callable[[object], Callable[[], None]]) -> None:
    """max_unapplied bounds the commits waiting for LMDB (their memory) even when the
    materializer gets no time: a commit that finds more waiting applies them first, from
    `put` in its own thread and from `aput` in a worker thread. Without that help in the async
    path 3,000 `aput`s would leave all 3,000 queued."""
    limit, commits = 200, 3000
    with wal.open(tmp_path / "s", durability="sync", max_unapplied=limit, apply_interval_ms=10_000_000) as s:
        starve_materializer(s)
        batches_before = s.stats()["apply_batches"]
        most = 0

        async def commit_all_async() -> None:
            nonlocal most
            for i in range(commits):
                await s.aput(b"k%05d" % i, b"v%05d" % i)
                most = max(most, s.stats()["unapplied_commits"])

        if api == "aput":
            asyncio.run(commit_all_async())
        else:
            for i in range(commits):
                s.put(b"k%05d" % i, b"v%05d" % i)
                most = max(most, s.stats()["unapplied_commits"])
        stats = s.stats()
        assert most <= limit + 1, most
        assert stats["apply_batches"] - batches_before >= (commits - limit) // (limit + 1)
        assert stats["applied_commits"] >= commits - limit - 1
        assert all(s.get(b"k%05d" % i) == b"v%05d" % i for i in range(commits))


# ---- cancellation: done before the CancelledError, or never ----------------------------------------


def _cancel_mid_commit(tmp_path: Path, make: Callable[[wal.Store, int], Any], rounds: int = 60) -> None:
    """Cancel each commit once it has started and is awaiting its fdatasync. The commit must be
    visible the moment the caller has its CancelledError (it was in the log: it will survive), and
    what a caller read then is what the store holds after a reopen -- nothing appears later."""
    seen: dict[int, bytes | None] = {}
    cancelled = 0

    async def main(store: wal.Store) -> None:
        nonlocal cancelled
        for i in range(rounds):
            task = asyncio.ensure_future(make(store, i))
            for _ in range(i % 3):  # cancel at different points: before the first step, or after it
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                cancelled += 1
            seen[i] = store.get(b"k%d" % i)

    with wal.open(tmp_path / "db", durability="sync") as store:
        asyncio.run(main(store))
    assert cancelled > rounds // 2  # the cancellations did reach commits in flight
    assert sum(v is not None for v in seen.values()) > 0
    with wal.open(tmp_path / "db") as store:
        after = {i: store.get(b"k%d" % i) for i in range(rounds)}
    assert after == seen


def test_cancelled_aput_took_effect_before_the_error_or_never(tmp_path: Path) -> None:
    _cancel_mid_commit(tmp_path, lambda store, i: store.aput(b"k%d" % i, b"v"))


def test_cancelled_adelete_took_effect_before_the_error_or_never(tmp_path: Path) -> None:
    async def put_then_delete(store: wal.Store, i: int) -> None:
        await store.aput(b"k%d" % i, b"v")  # a cancellation here: the put is there, the delete never comes
        await store.adelete(b"k%d" % i)

    _cancel_mid_commit(tmp_path, put_then_delete)


def test_cancelled_atransaction_took_effect_before_the_error_or_never(tmp_path: Path) -> None:
    async def txn(store: wal.Store, i: int) -> None:
        async with store.atransaction() as tx:
            tx.put(b"k%d" % i, b"v")
            tx.put(b"other%d" % i, b"w")

    _cancel_mid_commit(tmp_path, txn)


@contextlib.contextmanager
def idle_loop(store: wal.Store) -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop in a thread of its own that committed once and now just runs, its eventfd
    reader attached, so it drains the log's events as any loop does; stopped and joined on
    exit (an error of its own then fails the test)."""
    loops: list[asyncio.AbstractEventLoop] = []
    attached, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    async def idle() -> None:
        await store.aput("idle", b"x")
        loops.append(asyncio.get_running_loop())
        attached.set()
        while not release.is_set():
            await asyncio.sleep(0.001)

    def run() -> None:
        try:
            asyncio.run(idle())
        except BaseException as exc:
            errors.append(exc)
            attached.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert attached.wait(10) and not errors, errors
        yield loops[0]
    finally:
        release.set()
        thread.join()
    assert not errors, errors


def commit_in_a_loop_of_its_own(store: wal.Store, outcome: list[object]) -> threading.Thread:
    """A thread (not started) whose own event loop commits `k` once: the LSN, or the WalError,
    is appended to `outcome`. A daemon: a lost wake-up leaves it asleep."""
    def commit() -> None:
        async def one() -> None:
            try:
                outcome.append(await store.aput("k", b"v"))
            except wal.WalError as exc:
                outcome.append(exc)
        asyncio.run(one())

    return threading.Thread(target=commit, daemon=True)



@pytest.mark.timeout(60)  # a waiter left asleep never wakes: the commit waits, shielded, for its level
def test_event_loops_in_several_threads_each_see_their_commits_acknowledged(tmp_path: Path) -> None:
    """The log wakes asyncio waiters through one eventfd; a loop that drains it must not leave
    another loop's waiters asleep (nothing else would wake them once the commits stop)."""
    store = wal.open(tmp_path)
    done: list[int] = []

    async def committer() -> None:
        for i in range(200):
            done.append(await asyncio.wait_for(store.aput(f"k{i}", b"v"), timeout=10))

    try:
        with idle_loop(store):
            asyncio.run(committer())
    finally:
        store.close()
    assert len(done) == 200 and done == sorted(done)


def test_a_loop_whose_first_wait_comes_after_another_loop_drained_its_commits_progress_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop's first wait reads the log's marks when its waiters are made and attaches its
    reader after; another loop may drain, in between, the eventfd write announcing that the
    commit is durable, and it wakes only loops attached by then. Forced here: the new loop's
    marks say nothing is durable, and the idle loop has drained the event, before it attaches."""
    store = wal.open(tmp_path)
    log = store._log
    assert log is not None
    outcome: list[object] = []
    committer = commit_in_a_loop_of_its_own(store, outcome)
    try:
        with idle_loop(store) as idle:
            attach = _AsyncWaiters._attach

            def late_attach(self: _AsyncWaiters) -> None:
                if not self._attached and self._loop is not idle:
                    self._marks[1] = self._marks[2] = 0  # read before the commit was durable
                    idle_waiters = log._async[idle]
                    deadline = time.monotonic() + 10
                    while idle_waiters._marks[2] < log.watermarks.appended:  # it drained the event, then read
                        assert time.monotonic() < deadline
                        time.sleep(0.001)
                attach(self)

            monkeypatch.setattr(_AsyncWaiters, "_attach", late_attach)
            committer.start()
            committer.join(10)
            assert outcome == [2], "the commit's waiter slept through progress another loop drained"
    finally:
        store.close()
        committer.join(10)


def test_an_aput_waiting_when_its_fdatasync_fails_gets_failed_error_and_the_store_stops(tmp_path: Path) -> None:
    """I5 reaches a coroutine that waits on its loop: the fdatasync of its group fails, and the
    aput raises FailedError (not ClosedError: the log failed, it was not closed); every commit
    after it is refused."""
    import errno  # noqa: PLC0415

    import wal.drill.failpoints  # noqa: PLC0415

    store = wal.open(tmp_path / "s", durability="sync")

    async def main() -> None:
        await store.aput("before", b"1")
        with wal.drill.failpoints.failpoint("fsync", errno.EIO), pytest.raises(wal.FailedError, match="fdatasync"):
            await asyncio.wait_for(store.aput("lost", b"2"), 30)
        with pytest.raises(wal.FailedError):
            await store.aput("after", b"3")

    try:
        asyncio.run(main())
    finally:
        wal.drill.failpoints.clear()
        with contextlib.suppress(wal.WalError):
            store.close()


def test_a_wait_after_the_loop_saw_the_log_fail_raises_at_once_rather_than_wait_for_good(tmp_path: Path) -> None:
    """A cancelled aput waits again, shielded (`Store._acknowledged_async`); when the cancellation
    landed in the loop iteration in which its future got the log's failure, that second wait
    comes after the only event the failure makes. It must fail at once, not register and sleep."""
    store = wal.open(tmp_path / "s", durability="sync")
    log = store._log
    assert log is not None

    async def main() -> None:
        await store.aput("warm", b"0")
        with wal.drill.failpoints.failpoint("fsync", errno.EIO), pytest.raises(wal.FailedError, match="fdatasync"):
            await asyncio.wait_for(store.aput("k", b"v"), 30)
        with pytest.raises(wal.FailedError, match="fdatasync"):
            await asyncio.wait_for(log.wait_async(log.watermarks.appended), 10)

    try:
        asyncio.run(main())
    finally:
        wal.drill.failpoints.clear()
        with contextlib.suppress(wal.WalError):
            store.close()


def test_a_cancelled_aput_that_waits_again_after_the_store_closed_gets_its_commits_outcome(tmp_path: Path) -> None:
    """Closed from another thread while the loop is busy, then the aput cancelled before the
    loop ran the close's answers: its shielded wait starts again on a closed log, and the final
    marks answer it (the commit is durable: CancelledError, the contract's "it took effect"),
    not ClosedError, which tells the caller to commit again."""
    store = wal.open(tmp_path, durability="sync")
    log = store._log
    assert log is not None

    async def main() -> None:
        await store.aput("warm", b"0")
        wal.drill.failpoints.slow("fsync", 0.3)  # the aput still waits when it is cancelled
        task = asyncio.ensure_future(store.aput("k", b"v"))
        waiters = log._async[asyncio.get_running_loop()]
        while not waiters._heap:  # its future registered
            await asyncio.sleep(0)
        assert not task.done()
        closing = threading.Thread(target=store.close)
        closing.start()
        closing.join(30)  # the loop held meanwhile
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    finally:
        wal.drill.failpoints.clear()
    with wal.open(tmp_path) as again:
        assert again.get("k") == b"v"


def test_a_loop_whose_first_wait_comes_after_another_loop_drained_the_logs_failure_gets_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As for progress, so for a failure: the idle loop drains the eventfd write announcing that
    the log failed before the committer's loop attaches; the committer's aput still gets
    FailedError instead of sleeping for good."""
    store = wal.open(tmp_path, durability="sync")
    drained = threading.Event()
    idle: list[asyncio.AbstractEventLoop] = []
    on_ready, attach = _AsyncWaiters._on_ready, _AsyncWaiters._attach

    def watching_on_ready(self: _AsyncWaiters) -> None:
        on_ready(self)
        if self._loop in idle and self._failed:
            drained.set()  # the idle loop drained the failure's event

    def late_attach(self: _AsyncWaiters) -> None:
        if not self._attached and self._loop not in idle:
            assert drained.wait(10)
        attach(self)

    outcome: list[object] = []
    committer = commit_in_a_loop_of_its_own(store, outcome)
    monkeypatch.setattr(_AsyncWaiters, "_on_ready", watching_on_ready)  # before the idle loop attaches it
    try:
        with idle_loop(store) as loop:
            idle.append(loop)
            monkeypatch.setattr(_AsyncWaiters, "_attach", late_attach)
            with wal.drill.failpoints.failpoint("fsync", errno.EIO):
                committer.start()
                committer.join(10)
            assert len(outcome) == 1 and isinstance(outcome[0], wal.FailedError), outcome
    finally:
        wal.drill.failpoints.clear()
        with contextlib.suppress(wal.WalError):
            store.close()
        committer.join(10)


def test_a_log_closed_after_the_loop_waiting_on_it_closes_releases_its_lock(tmp_path: Path) -> None:
    """A loop closed while one of its tasks waits on the log (its futures can no longer be
    resolved): closing the log neither raises nor keeps the directory locked."""
    log = wal.Log.open(tmp_path, durability="sync")
    loop = asyncio.new_event_loop()

    async def waiter() -> None:
        while True:
            await log.progress_async()

    tasks: list[asyncio.Task[None]] = []

    async def start() -> None:
        tasks.append(asyncio.ensure_future(waiter()))
        await asyncio.sleep(0.05)

    loop.run_until_complete(start())
    loop.close()
    log.close()
    with wal.Log.open(tmp_path, durability="sync") as again:
        assert again.watermarks.appended == 0
