"""The store's overlay (native/overlay.c) and commit lock (native/commitlock.c).

The overlay holds, per key, the versions not yet applied to LMDB; reads consult it under a
watermark (wal/store/store.py, "Reads"). Checked here: the table against a dict model through
growth, shrinking and removal of colliding keys; many versions of one key pruned a batch at
a time; delete then put; scans merging overlay and LMDB; the level contract of reads
(never an unacknowledged commit, always one's own acknowledged ones); memory given back
once everything is applied. The commit lock: its threading.Lock-like face, and no lost
wake-up when many threads wait on it. A forked child: the inherited store stays refused.
"""

from __future__ import annotations

import os
import random
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import wal
from wal._bindings import storecore
from wal.log import record

BUFFERED = 2  # Core's level code for `buffered` (wal.log.durability)


@pytest.fixture
def core(tmp_path: Path) -> Iterator[storecore.Core]:
    """A commit core on a buffered log, with room for a million unapplied commits."""
    log = wal.Log.open(str(tmp_path / "log"), durability="buffered", rpo_ms=1000)
    try:
        yield storecore.Core(log, log.native_address, storecore.CommitLock(), threading.Event(), BUFFERED,
                             1 << 20, 1 << 40)
    finally:
        log.close()


def commit(core: storecore.Core, kind: int, key: bytes, value: bytes | None) -> int:
    """One commit on the C path. It answers 0 when it would have to wait -- the buffered log's
    buffer is at its cap until the flusher drains it (a busy machine) -- and the store's Python
    path then waits; here the test waits and tries again."""
    while (lsn := core.commit(kind, key, value, False)) == 0:
        time.sleep(0.001)
    return int(lsn)


def apply_through(core: storecore.Core, lsn: int) -> None:
    """What the materializer does once LMDB holds everything up to lsn: take, then prune."""
    while (batch := core.take(lsn, 4096)) is not None:
        core.prune(lsn, batch[3], batch[4])


# ---- the table against a model -------------------------------------------------------------


def test_the_overlay_matches_a_dict_model_through_growth_shrinking_and_removals(core: storecore.Core) -> None:
    rng = random.Random(20261122)
    model: dict[bytes, list[tuple[int, bytes | None]]] = {}  # key -> unapplied versions, oldest first
    lsn = applied = 0

    def newest(key: bytes, limit: int | None) -> tuple[int, bytes | None] | None:
        for version in reversed(model.get(key, [])):
            if limit is None or version[0] <= limit:
                return version
        return None

    # Phases of filling (the table grows, keys collide in their probe runs) and draining (keys
    # leave from the middle of runs, the table shrinks), with key spaces of several sizes.
    for keyspace, commits, drain_to in [(300, 3000, 0.5), (20_000, 30_000, 1.0), (50, 5000, 0.9),
                                        (5000, 20_000, 1.0)]:
        keys = [b"key-%d" % i for i in range(keyspace)]
        for step in range(commits):
            lsn += 1
            ops: dict[bytes, record.Op] = {}
            for _ in range(rng.choice((1, 1, 1, 2, 3))):
                k = rng.choice(keys)
                ops[k] = (record.OP_PUT, k, b"v%d" % lsn) if rng.random() < 0.8 else (record.OP_DELETE, k, None)
            core.enqueue_txn(lsn, record.make_txn(list(ops.values()), 0, None), 10)
            for _, k, v in ops.values():
                model.setdefault(k, []).append((lsn, v))
            if step % 97 == 0:  # apply part of what is there, as the materializer would
                applied = rng.randint(applied, applied + int((lsn - applied) * drain_to))
                apply_through(core, applied)
                for k in list(model):
                    model[k] = [v for v in model[k] if v[0] > applied]
                    if not model[k]:
                        del model[k]
            if step % 13 == 0:
                for k in rng.sample(keys, min(20, len(keys))):
                    limit = rng.choice((None, lsn, applied, rng.randint(0, lsn)))
                    assert core.overlay_get(k, limit) == newest(k, limit), (k, limit)
                assert core.overlay_keys == len(model)
        prefix = b"key-1"
        want = sorted((k, *newest(k, None)) for k in model if k.startswith(prefix))  # type: ignore[misc]
        assert sorted(core.overlay_scan(prefix, None)) == want
    apply_through(core, lsn)
    assert core.overlay_keys == 0 and core.overlay_get(b"key-1", None) is None


def test_many_versions_of_one_key_pruned_a_batch_at_a_time_keep_exactly_the_unapplied_ones(
        core: storecore.Core) -> None:
    lsns = [commit(core, record.OP_PUT, b"hot", b"v%d" % i) for i in range(1000)]
    assert lsns == list(range(1, 1001))
    for applied in range(0, 1001, 37):
        apply_through(core, applied)
        newest_applied = core.overlay_get(b"hot", applied)
        assert newest_applied is None  # every version <= applied is gone ...
        if applied < 1000:  # ... every newer one is still there, each at its own watermark
            assert core.overlay_get(b"hot", applied + 1) == (applied + 1, b"v%d" % applied)
            assert core.overlay_get(b"hot", None) == (1000, b"v999")
            assert core.overlay_keys == 1
    apply_through(core, 1000)
    assert core.overlay_keys == 0


def test_delete_then_put_shows_each_version_at_its_watermark(core: storecore.Core) -> None:
    put1 = commit(core, record.OP_PUT, b"k", b"first")
    gone = commit(core, record.OP_DELETE, b"k", None)
    put2 = commit(core, record.OP_PUT, b"k", b"second")
    assert [core.overlay_get(b"k", limit) for limit in (put1, gone, put2, None)] == [
        (put1, b"first"), (gone, None), (put2, b"second"), (put2, b"second")]
    apply_through(core, gone)
    assert core.overlay_get(b"k", gone) is None and core.overlay_get(b"k", None) == (put2, b"second")


def test_overlay_reads_take_only_bytes_and_copy_a_bytes_subclass(core: storecore.Core) -> None:
    class Key(bytes):
        def __hash__(self) -> int:
            return 1  # never asked: the overlay hashes an exact copy

    lsn = commit(core, record.OP_PUT, b"k", b"v")
    assert core.overlay_get(Key(b"k"), None) == (lsn, b"v")
    with pytest.raises(TypeError):
        core.overlay_get("k", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        core.overlay_scan("k", None)  # type: ignore[arg-type]


def test_a_million_insert_and_prune_cycles_leave_an_empty_overlay(core: storecore.Core) -> None:
    lsn = 0
    for cycle in range(100):
        base = cycle * 7919  # each cycle a different (partly overlapping) set of keys
        for i in range(10_000):
            lsn = commit(core, record.OP_PUT, b"c%d" % (base + i), b"x")
        assert core.overlay_keys == 10_000
        assert core.overlay_get(b"c%d" % (base + 5000), None) == (lsn - 4999, b"x")
        apply_through(core, lsn)
        assert core.overlay_keys == 0
    assert lsn == 1_000_000


def test_the_table_gives_its_memory_back_once_everything_is_applied(core: storecore.Core) -> None:
    keys = [b"m%d" % i for i in range(100_000)]

    def fill_and_apply() -> int:
        lsn = 0
        for k in keys:
            lsn = commit(core, record.OP_PUT, k, b"x")
        full = tracemalloc.get_traced_memory()[0]
        apply_through(core, lsn)
        for _ in range(32):  # the materializer's idle passes, every apply_interval_ms
            assert core.take(lsn, 4096) is None
        return full

    fill_and_apply()  # once before measuring: the apply queue's ring keeps the size it grew to
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        full = fill_and_apply()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # 100k keys: a table of 256k slots (6 MiB) and 100k versions, all given back but for a
    # few thousand spare versions and the smallest table once the table stayed empty a while.
    assert full - before > 7 << 20
    assert after - before < 1 << 20
    assert core.overlay_keys == 0


# ---- through the store -------------------------------------------------------------------------


def test_scan_merges_overlay_and_lmdb_by_version_with_deletes_hiding_applied_keys(tmp_path: Path) -> None:
    with wal.open(tmp_path, durability="buffered", rpo_ms=50, apply_interval_ms=60_000) as store:
        for k in (b"a1", b"a2", b"a3", b"b1", b"ab"):
            store.put(k, b"lmdb-" + k)
        store.checkpoint()  # all applied: in LMDB, out of the overlay
        assert store.stats()["overlay_keys"] == 0
        store.delete(b"a1")             # hides an LMDB key
        store.put(b"a2", b"new")        # newer than LMDB's
        store.put(b"a0", b"only-here")  # overlay only
        store.delete(b"a4")             # a delete of a key that never was
        store.put(b"a5", b"x")
        store.delete(b"a5")
        store.put(b"a5", b"back")       # delete then put, both unapplied
        assert store.stats()["overlay_keys"] == 5
        want = {b"a0": b"only-here", b"a2": b"new", b"a3": b"lmdb-a3", b"a5": b"back", b"ab": b"lmdb-ab"}
        assert list(store.scan(b"a")) == sorted(want.items())
        assert list(store.scan(b"b")) == [(b"b1", b"lmdb-b1")]
        assert dict(store.scan()) == {**want, b"b1": b"lmdb-b1"}
        assert store.get(b"a1") is None and store.version(b"a1") is None
        store.checkpoint()
        assert store.stats()["overlay_keys"] == 0
        assert list(store.scan(b"a")) == sorted(want.items())  # the same, now all from LMDB


@pytest.mark.parametrize("level", ["sync", "interval", "buffered"])
def test_reads_show_every_own_acknowledged_commit_and_never_an_unacknowledged_one(
        tmp_path: Path, level: str) -> None:
    rounds = 60 if level == "sync" else 2000
    errors: list[str] = []
    stop = threading.Event()
    with wal.open(tmp_path, durability=level, rpo_ms=None if level == "sync" else 20,
                  apply_interval_ms=1) as store:

        def writer(me: int) -> None:
            key = b"w%d" % me
            for i in range(rounds):
                lsn = store.put(key, b"%d" % i)
                if store.get(key) != b"%d" % i or store.version(key) != lsn:  # read-your-writes
                    errors.append(f"{key!r}: after put {i} (LSN {lsn}) read {store.get(key)!r}")
                    return

        def reader() -> None:
            seen: dict[bytes, int] = {}
            while not stop.is_set():
                for me in range(4):
                    key = b"w%d" % me
                    version = store.version(key)
                    visible = store._visible_lsn()  # read after: the version was acknowledged by then
                    if version is not None and version > visible:
                        errors.append(f"{key!r}: saw version {version}, acknowledged only up to {visible}")
                    if version is not None and version < seen.get(key, 0):
                        errors.append(f"{key!r}: version went back from {seen[key]} to {version}")
                    seen[key] = max(seen.get(key, 0), version or 0)

        writers = [threading.Thread(target=writer, args=(me,)) for me in range(4)]
        readers = [threading.Thread(target=reader) for _ in range(2)]
        for t in writers + readers:
            t.start()
        for t in writers:
            t.join(120)
        stop.set()
        for t in readers:
            t.join(120)
        assert not errors, errors[:5]
        assert [store.get(b"w%d" % me) for me in range(4)] == [b"%d" % (rounds - 1)] * 4


def test_c_path_puts_and_python_path_transactions_interleave_under_one_commit_lock(tmp_path: Path) -> None:
    with wal.open(tmp_path, durability="buffered", rpo_ms=20, apply_interval_ms=1) as store:
        lsns: list[int] = []

        def putter(me: int) -> None:
            for i in range(3000):
                lsns.append(store.put(b"p%d-%d" % (me, i % 500), b"%d" % i))

        def transactor(me: int) -> None:
            for i in range(500):
                with store.transaction() as tx:
                    tx.put(b"t%d-%d" % (me, i % 50), b"%d" % i)
                    tx.delete(b"gone%d" % me)
                assert tx.lsn is not None
                lsns.append(tx.lsn)

        threads = ([threading.Thread(target=putter, args=(me,)) for me in range(3)]
                   + [threading.Thread(target=transactor, args=(me,)) for me in range(3)])
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(lsns) == list(range(1, 3 * 3000 + 3 * 500 + 1))  # one LSN per commit, none lost
        assert all(store.get(b"p%d-%d" % (me, i)) == b"%d" % (2500 + i) for me in range(3) for i in range(500))
        assert all(store.get(b"t%d-%d" % (me, i)) == b"%d" % (450 + i) for me in range(3) for i in range(50))
        store.checkpoint()
        assert store.stats()["overlay_keys"] == 0


# ---- the commit lock ---------------------------------------------------------------------------


def test_the_commit_lock_acts_like_a_threading_lock() -> None:
    lock = storecore.CommitLock()
    assert not lock.locked()
    assert lock.acquire() is True and lock.locked()
    assert lock.acquire(False) is False and lock.acquire(blocking=False) is False
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(ValueError), lock:
        raise ValueError("released on the way out")
    assert not lock.locked()


def test_a_blocking_acquire_waits_for_the_release_and_then_succeeds() -> None:
    lock = storecore.CommitLock()
    got: list[float] = []
    lock.acquire()
    waiter = threading.Thread(target=lambda: (lock.acquire(), got.append(time.monotonic())))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got  # waiting, with the GIL released (this thread runs)
    released = time.monotonic()
    lock.release()
    waiter.join(10)
    assert got and got[0] >= released and lock.locked()  # the waiter holds it now
    lock.release()


def test_many_threads_contending_for_the_commit_lock_lose_no_wake_up_and_no_update() -> None:
    lock = storecore.CommitLock()
    counter = [0]
    rounds, n_threads = 3000, 16

    def work() -> None:
        for i in range(rounds):
            with lock:
                value = counter[0]
                if i % 5 == 0:
                    time.sleep(0)  # let the GIL go while holding the lock: others must wait on it
                counter[0] = value + 1
            if i % 3 == 0:  # and sometimes the non-blocking try the C commit path makes
                if lock.acquire(False):
                    counter[0] += 1
                    lock.release()
                else:
                    with lock:
                        counter[0] += 1

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a waiter was never woken"
    assert counter[0] == n_threads * (rounds + len(range(0, rounds, 3)))
    assert not lock.locked()


# ---- fork --------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_the_commit_lock_is_held_gets_a_free_lock_and_a_refused_store(
        tmp_path: Path, forked_outcomes: Callable[..., dict[str, str]]) -> None:
    with wal.open(tmp_path, durability="buffered", rpo_ms=50) as store:
        store.put(b"k", b"v")

        def lock_usable() -> None:  # usable, not a copy of the parent's held lock
            with store._commit_lock:
                pass

        with store._commit_lock:  # as a committing thread of the parent might at the fork
            report = forked_outcomes(
                (("put", lambda: store.put(b"k", b"child")),
                 ("get", lambda: store.get(b"k")),
                 ("transaction", store.transaction),
                 ("scan", lambda: list(store.scan()))),
                first=lambda: {"lock held": str(store._commit_lock.locked())}, then=lock_usable)
        assert report == {"lock held": "False", "put": "LockedError", "get": "LockedError",
                          "transaction": "LockedError", "scan": "LockedError"}
        assert store.put(b"k", b"parent") == 2 and store.get(b"k") == b"parent"


def test_keys_of_a_bytes_subclass_are_stored_applied_and_pruned_by_their_bytes(tmp_path: Path) -> None:
    class Key(bytes):
        def __hash__(self) -> int:
            return 7  # legal but degenerate: neither the overlay nor the collapse may rely on it

    with wal.open(tmp_path, durability="buffered", rpo_ms=20) as store:
        with store.transaction() as tx:
            tx.put(Key(b"a"), b"1")
            tx.put(Key(b"b"), b"2")
        store.put(b"a", b"3")  # the same key as plain bytes: a newer version of it
        with store.transaction() as tx:
            tx.delete(Key(b"b"))
        assert (store.get(b"a"), store.get(Key(b"b"))) == (b"3", None)
        store.checkpoint()
        assert store.stats()["overlay_keys"] == 0
        assert list(store.scan()) == [(b"a", b"3")]


@pytest.mark.parametrize(("level", "field"), [("sync", "durable"), ("interval", "written"), ("buffered", "appended")])
def test_reads_take_the_watermark_of_the_stores_level_and_keep_it_after_a_failure(
        tmp_path: Path, level: str, field: str) -> None:
    with wal.open(tmp_path, durability=level, rpo_ms=None if level == "sync" else 1000) as store:
        assert store._log is not None
        for i in range(50):
            store.put(b"k%d" % i, b"v")
            before = getattr(store._log.watermarks, field)
            visible = store._visible_lsn()
            assert before <= visible <= getattr(store._log.watermarks, field)
        store._fail_stop(RuntimeError("simulated"))  # writes refused from here on, reads go on
        assert store._visible_lsn() >= before and store.get(b"k49") == b"v"
        with pytest.raises(wal.FailedError):
            store.put(b"k", b"v")
