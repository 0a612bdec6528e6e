"""Read-modify-write that converges: a ConflictError is raised only once the commit it conflicts
with is visible to the caller's next read (so a get/if_version loop makes progress on every
retry), `Store.update` reads in-flight versions and retries for the caller, and serializable
transactions check every key they read."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import wal

LEVELS = [("sync", None), ("interval", 50), ("buffered", 50)]


def _user_loop(store: wal.Store, key: bytes, n: int, conflicts: list[int], t: int) -> None:
    """The loop a user writes: read version and value, commit with if_version, retry on conflict."""
    for _ in range(n):
        while True:
            version = store.version(key)
            value = int(store.get(key, b"0"))
            try:
                with store.transaction() as tx:
                    tx.put(key, b"%d" % (value + 1), if_version=version or 0)
                break
            except wal.ConflictError:
                conflicts[t] += 1


@pytest.mark.parametrize(("level", "rpo"), LEVELS)
def test_a_user_loop_on_one_hot_key_is_exact_and_never_spins(tmp_path: Path, level: str, rpo: int | None) -> None:
    threads, per = 8, 60
    conflicts = [0] * threads
    with wal.open(tmp_path, durability=level, rpo_ms=rpo) as store:
        workers = [threading.Thread(target=_user_loop, args=(store, b"counter", per, conflicts, t))
                   for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert store.get(b"counter") == b"%d" % (threads * per)
    # Each ConflictError is a commit of another thread that got in first: a thread can meet at most
    # as many as the others made (a spin would meet hundreds per success).
    for t in range(threads):
        assert conflicts[t] <= threads * per - per, conflicts


@pytest.mark.parametrize(("level", "rpo"), LEVELS)
def test_update_gives_an_exact_counter_under_contention_at_every_level(tmp_path: Path, level: str,
                                                                       rpo: int | None) -> None:
    threads, per = 8, 100
    with wal.open(tmp_path, durability=level, rpo_ms=rpo) as store:
        def run() -> None:
            for _ in range(per):
                store.update(b"counter", lambda v: b"%d" % (int(v or b"0") + 1))
        workers = [threading.Thread(target=run) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert store.get(b"counter") == b"%d" % (threads * per)
        stats = store.stats()
        assert stats["conflicts"] <= threads * per * (threads - 1)
    with wal.open(tmp_path) as store:  # and so after a reopen (replayed or applied)
        assert store.get(b"counter") == b"%d" % (threads * per)


def test_aupdate_from_a_thousand_tasks_is_exact(tmp_path: Path) -> None:
    async def main(store: wal.Store) -> None:
        await asyncio.gather(*(store.aupdate(b"counter", lambda v: b"%d" % (int(v or b"0") + 1))
                               for _ in range(1000)))

    with wal.open(tmp_path) as store:
        asyncio.run(main(store))
        assert store.get(b"counter") == b"1000"


def test_update_returns_what_it_wrote_deletes_on_none_and_gives_up_after_its_retries(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        lsn, value = store.update("k", lambda v: (v or b"") + b"a")
        assert value == b"a" and store.version("k") == lsn
        lsn, value = store.update("k", lambda v: None)
        assert value is None and store.get("k") is None
        calls = []

        def meddling(v: bytes | None) -> bytes:  # a competing commit between every read and commit
            calls.append(v)
            store.put("k", b"x%d" % len(calls))
            return b"mine"

        with pytest.raises(wal.ConflictError, match="gave up after 3 retries"):
            store.update("k", meddling, retries=3)
        assert len(calls) == 4 and store.get("k") == b"x4"
        with pytest.raises(wal.ArgumentError):
            store.update("k", lambda v: v, retries=-1)


def test_a_conflict_is_raised_only_once_the_conflicting_commit_is_visible(tmp_path: Path) -> None:
    """At sync a commit is visible once durable: the ConflictError waits for it, so the caller's
    very next read sees the version that beat it."""
    with wal.open(tmp_path) as store:
        store.put(b"k", b"0")
        seen: list[tuple[int | None, int | None]] = []

        def racer() -> None:
            for _ in range(200):
                store.put(b"k", b"r")

        th = threading.Thread(target=racer)
        th.start()
        for _ in range(200):
            v = store.version(b"k")
            try:
                with store.transaction() as tx:
                    tx.put(b"k", b"me", if_version=v)
            except wal.ConflictError as exc:
                assert exc.conflicting_lsn is not None
                seen.append((exc.conflicting_lsn, store.version(b"k")))
        th.join()
        assert all(now is not None and now >= lsn for lsn, now in seen), seen


def test_a_serializable_transaction_fails_if_a_key_it_read_changed(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put("a", b"1")
        store.put("b", b"1")
        # Write skew: each reads both and writes one; plain transactions let both commit.
        with store.transaction() as t1:
            assert t1.get("a") == b"1" and t1.version("b") == store.version("b")
            store.put("b", b"changed")
            t1.put("a", b"2")
        assert store.get("a") == b"2"
        read_changed = r"key b'b'.*serializable transaction read"
        with pytest.raises(wal.ConflictError, match=read_changed), store.transaction(serializable=True) as t2:
            t2.get("a")
            t2.get("b")
            store.put("b", b"changed again")
            t2.put("a", b"3")
        assert store.get("a") == b"2"
        with store.transaction(serializable=True) as t3:  # nothing it read changed: commits
            t3.get("a")
            assert t3.version("missing") is None
            t3.put("a", b"4")
        assert store.get("a") == b"4"


_CHILD = textwrap.dedent("""
    import sys, threading, wal
    store = wal.open(sys.argv[1])
    def run():
        while True:
            lsn, v = store.update(b"counter", lambda v: b"%d" % (int(v or b"0") + 1))
            sys.stdout.write(v.decode() + "\\n")
            sys.stdout.flush()
    for _ in range(8):
        threading.Thread(target=run, daemon=True).start()
    threading.Event().wait()
""")


def test_a_kill_during_contended_updates_loses_no_acknowledged_increment_and_repeats_none(tmp_path: Path) -> None:
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        acked: list[int] = []
        deadline = time.monotonic() + 0.5 + 0.3 * round_
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line:
                acked.append(int(line))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        acked += [int(line) for line in proc.stdout.read().split()]
        with wal.open(tmp_path) as store:
            final = int(store.get(b"counter", b"0"))
        # Every value acknowledged is unique (no increment applied twice) and none is lost.
        assert len(acked) == len(set(acked)) and acked, acked[:20]
        assert max(acked) <= final
