"""The store across real processes: SIGKILL, real fdatasync, real LMDB, no mocks.

(a) A child commits multi-key transactions at each durability level and prints each
    acknowledged one; it is SIGKILLed at random moments and the parent checks, after each
    reopen: at `sync` and `interval` every acknowledged commit is there (I2: a process kill
    loses nothing at those levels); at `buffered` the lost ones form a suffix; never a
    partial transaction; the state is a gap-free prefix of the commits (I3).
(b) A kill during recovery, then another recovery, gives the state of an uninterrupted
    replay (I4).
(c) Read-only openers in another process while a writer runs: consistent reads, no
    LockedError, no writes.
(d) LMDB read directly with py-lmdb from another process never shows an applied_lsn above
    the log's durable LSN (I1).
(e) A second writer -- thread, process or forked child -- gets LockedError (I6).

Quick profile by default; AGENTWAL_LONG=1 runs 100 kills per level.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest

import wal
from wal.log import record
from wal.store.state import DEFAULT_MAP_SIZE

LONG = os.environ.get("AGENTWAL_LONG", "") not in ("", "0")
KILLS = 100 if LONG else 10
HELPERS = Path(__file__).parent / "store_helpers"


def spawn(script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HELPERS / script), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


@contextmanager
def child(script: str, *args: object) -> Iterator[subprocess.Popen[str]]:
    proc = spawn(script, *args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def expect_line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(prefix), f"expected {prefix!r} from the child, got {line!r} (exit {proc.poll()})"
    return line.strip()


def complete_lines(text: str) -> list[str]:
    """Lines the child finished printing (a SIGKILL may cut the last one)."""
    return text.split("\n")[:-1]


# A reader of the state from outside agentwal must map as much as the writer may grow the file
# to (wal.store.state.DEFAULT_MAP_SIZE): py-lmdb's default of 10 MiB gets MDB_MAP_RESIZED once the
# state outgrows it (found by the long profile: 3,000 polls against an interval writer).
STATE_MAP_SIZE = DEFAULT_MAP_SIZE


def read_applied_lsn(env: lmdb.Environment) -> int:
    meta = env.open_db(b"meta", create=False)
    with env.begin(db=meta) as txn:
        raw = txn.get(b"applied_lsn")
    return struct.unpack_from("<Q", raw)[0] if raw else 0  # u64 LE, then its CRC-32C (FORMAT.md §16)


def lmdb_dump(state_dir: Path) -> dict[str, object]:
    """Every database of the store's LMDB, read directly: data, idem and meta (less the operator
    notes `writer` and `checkpoint`, and `durable_seen`, the log's durable LSN as last seen)."""
    env = lmdb.open(str(state_dir), readonly=True, max_dbs=4, lock=True, map_size=STATE_MAP_SIZE)
    try:
        out: dict[str, object] = {}
        for name in (b"data", b"idem", b"meta"):
            db = env.open_db(name, create=False)
            with env.begin(db=db) as txn:
                out[name.decode()] = [(k, v) for k, v in txn.cursor()
                                      if name != b"meta" or k not in (b"writer", b"checkpoint", b"durable_seen")]
        return out
    finally:
        env.close()


# ---- (a) kill a committing child at each level ---------------------------------------------------


class PrefixOracle:
    """What the parent knows: the commits acknowledged in each round, and the state after it."""

    def __init__(self, path: Path, level: str) -> None:
        self.path = path
        self.level = level
        self.committed = 0  # highest index in the state after the last reopen
        self.lost = 0  # acknowledged but lost (buffered only)

    def check_round(self, round_no: int, first: int | None, acks: dict[int, int]) -> None:
        with wal.open(self.path) as store:
            raw = store.get(b"last")
            n = int(raw) if raw is not None else 0
            groups: dict[int, dict[int, bytes]] = defaultdict(dict)
            for key, value in store.scan(b"c/"):
                _, idx, j = key.decode().split("/")
                groups[int(idx)][int(j)] = value
            # I3: a gap-free prefix 1..n of the commits, each one whole.
            assert sorted(groups) == list(range(1, n + 1)), f"holes in the committed indices (last={n})"
            for i in range(1, n + 1):
                group = groups[i]
                assert sorted(group) == list(range(2 + i % 2)), f"transaction {i} is partial: {sorted(group)}"
                assert len(set(group.values())) == 1, f"transaction {i} mixes commits"
            # Commit order: the versions of the transactions new since the last reopen (older
            # ones were checked then and are never rewritten) are one per transaction, increasing.
            previous_lsn = 0
            for i in range(max(1, self.committed), n + 1):
                versions = {store.version(f"c/{i:08d}/{j}") for j in groups[i]}
                assert len(versions) == 1, f"transaction {i} has keys of several commits: {versions}"
                (version,) = versions
                assert version is not None and version > previous_lsn, "commits out of order"
                previous_lsn = version
            assert store.version(b"last") == (previous_lsn or None)
            # What an earlier round left (and reopened, so it was made durable) is never lost.
            assert n >= self.committed, f"state went back from {self.committed} to {n}"
            if first is not None:
                assert first == self.committed + 1
            # I2: at sync and interval, every acknowledged commit survived a process kill.
            top_ack = max(acks, default=0)
            if self.level in ("sync", "interval"):
                assert n >= top_ack, f"{self.level}: acknowledged commit {top_ack} lost (state ends at {n})"
            else:
                self.lost += max(0, top_ack - n)  # a suffix: the state is a prefix
            for i, lsn in acks.items():
                if i <= n:  # this round wrote index i once, at this LSN
                    assert store.version(f"c/{i:08d}/0") == lsn, f"commit {i} is not the one acknowledged"
                    assert groups[i][0] == f"{i}:{round_no}".encode()
            self.committed = n


@pytest.mark.parametrize(("level", "rpo_ms"), [("sync", 0), ("interval", 50), ("buffered", 50)])
def test_a_killed_writer_leaves_a_gap_free_prefix_holding_every_commit_its_level_promises(
        tmp_path: Path, level: str, rpo_ms: int) -> None:
    rng = random.Random(f"kill-{level}")
    oracle = PrefixOracle(tmp_path, level)
    total_acks = 0
    for round_no in range(1, KILLS + 1):
        with child("kill_writer.py", tmp_path, level, rpo_ms, round_no) as proc:
            assert proc.stdout is not None
            if rng.random() < 0.2:
                time.sleep(rng.uniform(0.0, 0.3))  # may land while it opens and recovers
            else:
                expect_line(proc, "ready")
                time.sleep(rng.uniform(0.0, 0.25))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            out = proc.stdout.read()
        lines = complete_lines(out)
        first = int(lines[0].split()[1]) if lines and lines[0].startswith("ready") else None
        acks = {int(w[1]): int(w[2]) for w in (line.split() for line in lines) if w[0] == "ack"}
        total_acks += len(acks)
        oracle.check_round(round_no, first, acks)
    assert total_acks > 0, "no commit was ever acknowledged before a kill"
    assert oracle.committed > 0
    print(f"{level}: {KILLS} kills, {total_acks} acknowledged commits, {oracle.committed} in the store, "
          f"{oracle.lost} acknowledged-then-lost")


# ---- (b) a kill during recovery --------------------------------------------------------------------


RECOVERY_RECORDS = 200_000


def build_unapplied_log(path: Path) -> dict[bytes, tuple[int, bytes]]:
    """A store whose LMDB state is empty and whose log holds RECOVERY_RECORDS transactions,
    as if the writer died before its materializer applied any of them. Written with the
    bare log in the store's own record format. Returns the expected key -> (version, value)."""
    wal.open(path).close()
    expected: dict[bytes, tuple[int, bytes]] = {}
    payloads = []
    now_ms = time.time_ns() // 1_000_000  # recent: idempotency keys are remembered for 24 h
    for lsn in range(1, RECOVERY_RECORDS + 1):
        key = b"k%05d" % (lsn % 7919)
        ops: list[record.Op] = [(record.OP_PUT, key, b"v%d" % lsn), (record.OP_PUT, b"counter", b"%d" % lsn)]
        if lsn % 5 == 0:
            ops.append((record.OP_DELETE, b"k%05d" % ((lsn * 31) % 7919), None))
        idem = b"job-%d" % lsn if lsn % 1000 == 0 else None
        payloads.append(record.encode(ops, now_ms, idem))
        for kind, k, v in ops:
            if kind == record.OP_PUT:
                assert v is not None
                expected[k] = (lsn, v)
            else:
                expected.pop(k, None)
    with wal.Log.open(path / "log", durability="interval", rpo_ms=1000, _store_log=True) as log:
        assert log.append_many(payloads) == RECOVERY_RECORDS
        log.sync()
    return expected


def test_a_kill_during_recovery_then_recovery_again_gives_the_uninterrupted_state(tmp_path: Path) -> None:
    store_dir, reference_dir = tmp_path / "store", tmp_path / "reference"
    expected = build_unapplied_log(store_dir)
    shutil.copytree(store_dir, reference_dir)
    rng = random.Random("recovery")
    applied_after_kills: list[int] = []
    mid_recovery = 0
    delay = 0.05
    for _ in range(40):
        with child("open_store.py", store_dir, "1000") as proc:
            expect_line(proc, "start")
            time.sleep(delay + rng.uniform(0, 0.05))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        env = lmdb.open(str(store_dir / "state"), readonly=True, max_dbs=4, lock=True, map_size=STATE_MAP_SIZE)
        try:
            applied = read_applied_lsn(env)
        finally:
            env.close()
        assert applied >= (applied_after_kills[-1] if applied_after_kills else 0)  # replay never goes back
        applied_after_kills.append(applied)
        if 0 < applied < RECOVERY_RECORDS:
            mid_recovery += 1
        if applied == RECOVERY_RECORDS or mid_recovery >= 3:
            break
        if applied == 0:
            delay += 0.1  # not into the replay yet: kill later next time
    assert mid_recovery >= 1, f"no kill landed mid-replay: applied_lsn after each kill {applied_after_kills}"
    # Recovery again, uninterrupted, in this process.
    with wal.open(store_dir) as store:
        assert store.stats()["records_replayed"] == RECOVERY_RECORDS - applied_after_kills[-1]
        got = {k: (store.version(k), v) for k, v in store.scan()}
        assert got == expected
        with store.transaction(idempotency_key=b"job-5000") as tx:  # idempotency keys were replayed
            tx.put(b"counter", b"again")
        assert (tx.lsn, tx.deduplicated) == (5000, True)
    with wal.open(reference_dir) as reference:
        assert reference.stats()["records_replayed"] == RECOVERY_RECORDS
    # I4: byte for byte the same LMDB contents as the reference replay.
    assert lmdb_dump(store_dir / "state") == lmdb_dump(reference_dir / "state")
    print(f"applied_lsn after each kill: {applied_after_kills}")


# ---- (c) read-only openers in another process --------------------------------------------------------


def test_a_read_only_opener_in_another_process_reads_consistent_state_while_a_writer_runs(
        tmp_path: Path) -> None:
    # Paced at 1 ms a commit: each sample rescans every t/ key, which an unpaced writer grows
    # by ~10,000 a second (the test then took minutes); a batch applied every 20 ms still
    # holds many transactions for a reader to catch half-applied.
    with child("poll_writer.py", tmp_path, "interval", 20, 1) as writer:
        expect_line(writer, "ready")
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while (len(set(seen)) < 5 or len(seen) < 30) and time.monotonic() < deadline:
            with wal.open(tmp_path, readonly=True) as ro:  # no LockedError beside the writer
                for _ in range(5):
                    group = dict(ro.scan(b"g/"))  # one LMDB read transaction
                    if not group:
                        continue  # nothing applied yet
                    assert sorted(group) == [b"g/a", b"g/b", b"g/c"]
                    assert len(set(group.values())) == 1, f"a transaction seen half-applied: {group}"
                    value = int(group[b"g/a"])
                    assert not seen or value >= seen[-1], "a reader went back in time"
                    seen.append(value)
                    # Every transaction up to the one seen is whole (t/ keys only grow).
                    per_tx: dict[int, int] = defaultdict(int)
                    for key, v in ro.scan(b"t/"):
                        per_tx[int(key.split(b"/")[1])] += 1
                        assert int(v) == int(key.split(b"/")[1])
                    upto = max(per_tx)
                    assert upto >= value
                    assert sorted(per_tx) == list(range(1, upto + 1)), "holes in the applied transactions"
                    assert set(per_tx.values()) == {3}, "a transaction seen half-applied"
                    with pytest.raises(wal.ReadOnlyError):
                        ro.put(b"g/a", b"from the reader")
                    with pytest.raises(wal.ReadOnlyError), ro.transaction():
                        pass
                    time.sleep(0.01)
        assert len(set(seen)) >= 5, f"the reader saw no progress: {seen[:10]}"
        assert writer.stdin is not None
        writer.stdin.write("quit\n")
        writer.stdin.flush()
        commits = int(expect_line(writer, "closed").split()[1])
    with wal.open(tmp_path, readonly=True) as ro:  # after the writer closed: all of it
        assert dict(ro.scan(b"g/")) == {b"g/a": b"%d" % commits, b"g/b": b"%d" % commits, b"g/c": b"%d" % commits}
        assert sum(1 for _ in ro.scan(b"t/")) == 3 * commits
        assert b"from the reader" not in {v for _, v in ro.scan()}


# ---- (d) applied_lsn in LMDB never above the durable LSN of the log --------------------------------------


def test_lmdb_read_directly_never_shows_applied_lsn_above_the_logs_durable_lsn(tmp_path: Path) -> None:
    """Sound ordering: read applied_lsn from LMDB first, then ask the writer for its durable
    watermark. durable only grows, so I1 (applied <= durable at every LMDB commit) implies
    applied-read-earlier <= durable-read-later."""
    polls = 3000 if LONG else 300
    with child("poll_writer.py", tmp_path, "interval", 200) as writer:
        expect_line(writer, "ready")
        assert writer.stdin is not None
        env = lmdb.open(str(tmp_path / "state"), readonly=True, max_dbs=4, lock=True, map_size=STATE_MAP_SIZE)
        try:
            applied_values: set[int] = set()
            checks = 0
            deadline = time.monotonic() + 60
            while (checks < polls or len(applied_values) < 5) and time.monotonic() < deadline:
                applied = read_applied_lsn(env)
                writer.stdin.write("durable\n")
                writer.stdin.flush()
                durable = int(expect_line(writer, "durable").split()[1])
                assert applied <= durable, f"LMDB applied_lsn {applied} > log durable_lsn {durable} (I1)"
                applied_values.add(applied)
                checks += 1
                time.sleep(0.001)
        finally:
            env.close()
        writer.stdin.write("quit\n")
        writer.stdin.flush()
        expect_line(writer, "closed")
    print(f"{checks} checks, {len(applied_values)} distinct applied_lsn values")
    assert len(applied_values) >= 5, "applied_lsn hardly moved during the polls"


# ---- (e) one writer ----------------------------------------------------------------------------------------


def test_a_second_writer_in_the_same_process_gets_locked_error(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
        with pytest.raises(wal.LockedError) as info:
            wal.open(tmp_path)
        assert str(tmp_path) in str(info.value)
        assert store.put(b"k", b"still mine") == 2


def test_a_second_writer_in_another_thread_gets_locked_error(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def second() -> None:
        try:
            wal.open(tmp_path).close()
        except BaseException as exc:
            errors.append(exc)

    with wal.open(tmp_path) as store:
        t = threading.Thread(target=second)
        t.start()
        t.join()
        assert len(errors) == 1 and isinstance(errors[0], wal.LockedError), errors
        store.put(b"k", b"v")
    with wal.open(tmp_path) as store:  # released on close
        assert store.get(b"k") == b"v"


def test_a_second_writer_in_another_process_gets_locked_error(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
        with child("try_open.py", tmp_path) as proc:
            line = expect_line(proc, "error")
        assert line.startswith("error LockedError"), line
        assert str(os.getpid()) in line  # names the holder
    with child("try_open.py", tmp_path) as proc:  # after close, another process may write
        expect_line(proc, "opened")


def test_a_killed_writers_lock_is_released_with_its_process(tmp_path: Path) -> None:
    with child("kill_writer.py", tmp_path, "sync", 0, 1) as proc:
        expect_line(proc, "ready")
        with child("try_open.py", tmp_path) as other:
            assert expect_line(other, "error").startswith("error LockedError")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with wal.open(tmp_path) as store:
        assert store.get(b"last") is not None or store.watermarks.written == 0


def test_a_forked_child_gets_locked_error_from_the_inherited_store_and_from_a_new_open(
        tmp_path: Path, forked_outcomes: Callable[..., dict[str, str]]) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
        report = forked_outcomes((("inherited put", lambda: store.put(b"k", b"child")),
                                  ("new open", lambda: wal.open(tmp_path))))
        assert report == {"inherited put": "LockedError", "new open": "LockedError"}
        assert store.put(b"k", b"parent") == 2  # the parent's store is unharmed
        assert store.get(b"k") == b"parent"
    with wal.open(tmp_path) as store:
        assert store.get(b"k") == b"parent"


def _needs(forker: str) -> None:
    if not hasattr(ctypes.CDLL(None), forker):
        pytest.skip(f"this C library has no {forker}() (glibc before 2.34)")


@pytest.mark.parametrize("forker", ["fork", "_Fork"])
def test_a_child_forked_past_pythons_fork_hooks_cannot_write_through_the_inherited_store(tmp_path: Path,
                                                                                       forker: str) -> None:
    """libc fork() called straight (ctypes, a C extension) runs no os.register_at_fork hook, so
    the inherited Store did not know it was in a child: the child's commits were acknowledged,
    then the parent handed out the same LSNs again and the child's were lost; and a sync or a
    checkpoint in the child wrote the batch it had copied at the fork over what the parent wrote
    since (zero padding over an acknowledged record). glibc's _Fork() runs not even a
    pthread_atfork handler. The log's C core knows the process that opened it (native/forkwatch.h)
    and refuses every write, sync and wait in another."""
    _needs(forker)
    script = textwrap.dedent(f"""
        import ctypes, os
        import wal
        store = wal.open({str(tmp_path)!r}, segment_bytes=1 << 16)
        store.put("before", b"1")
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = getattr(ctypes.CDLL(None), {forker!r})()
        if pid == 0:
            os.read(go_r, 1)  # once the parent committed after the fork
            outcomes = []
            for attempt in (lambda: store.put("child", b"c"), lambda: store.delete("before"),
                            lambda: store._log.sync(), store.checkpoint):
                try:
                    attempt()
                    outcomes.append("done")
                except wal.WalError as exc:
                    outcomes.append(type(exc).__name__)
            os.write(out_w, " ".join(outcomes).encode())
            os._exit(0)
        print(store.put("parent", b"p"))  # acknowledged (sync) before the child tries anything
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        print(os.read(out_r, 4096).decode())
        print(store.put("parent2", b"p2"))
        store.close()
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split("\n")
    assert out[0] == "2" and out[2] == "3"  # the parent's LSNs: the child took none
    assert out[1] == "LockedError LockedError LockedError LockedError"
    with wal.open(tmp_path) as store:
        assert dict(store.scan()) == {b"before": b"1", b"parent": b"p", b"parent2": b"p2"}


@pytest.mark.parametrize("forker", ["fork", "_Fork"])
def test_a_child_forked_past_pythons_fork_hooks_while_another_thread_held_the_commit_lock_is_refused_not_hung(
        tmp_path: Path, forker: str) -> None:
    """The commit lock held by another of the parent's threads at a libc fork() is held by no
    thread of the child: its first commit waited for it forever, before the log could refuse
    it. The lock knows the process it was set up in (native/commitlock.h) and starts over in
    such a child."""
    _needs(forker)
    script = textwrap.dedent(f"""
        import ctypes, os, select, threading
        import wal
        store = wal.open({str(tmp_path)!r})
        store.put("before", b"1")
        held, done = threading.Event(), threading.Event()
        def holder():
            with store._commit_lock:
                held.set()
                done.wait()
        thread = threading.Thread(target=holder)
        thread.start()
        held.wait()
        out_r, out_w = os.pipe()
        pid = getattr(ctypes.CDLL(None), {forker!r})()
        if pid == 0:
            def txn():
                with store.transaction() as t:
                    t.put("x", b"y")
            outcomes = []
            for attempt in (lambda: store.put("child", b"c"), lambda: store.delete("before"), txn,
                            store.checkpoint):
                try:
                    attempt()
                    outcomes.append("done")
                except wal.WalError as exc:
                    outcomes.append(type(exc).__name__)
            os.write(out_w, " ".join(outcomes).encode())
            os._exit(0)
        done.set()
        thread.join()
        ready, _, _ = select.select([out_r], [], [], 20)
        print(os.read(out_r, 4096).decode() if ready else "hung")
        if not ready:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
        print(store.put("parent", b"p"))
        store.close()
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split("\n")
    assert out[0] == "LockedError LockedError LockedError LockedError"
    assert out[1] == "2"  # the parent's next LSN: the child took none
    with wal.open(tmp_path) as store:
        assert dict(store.scan()) == {b"before": b"1", b"parent": b"p"}


def test_a_forked_child_that_never_uses_the_store_does_not_keep_it_locked_after_the_parent_closes(
        tmp_path: Path) -> None:
    store = wal.open(tmp_path)
    store.put(b"k", b"v")
    read_fd, write_fd = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker forked for something else: waits until the parent is done
        try:
            os.close(write_fd)
            os.write(ready_w, b"r")  # the after-fork hooks have run by the time child code runs
            os.read(read_fd, 1)
        finally:
            os._exit(0)
    os.close(read_fd)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"r"
        os.close(ready_r)
        store.close()
        with wal.open(tmp_path) as again:  # LockedError while the child lives
            assert again.get(b"k") == b"v"
    finally:
        os.close(write_fd)
        os.waitpid(pid, 0)
