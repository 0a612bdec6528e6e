"""Space under sustained writes: the files stay bounded by the live data at any write rate.

LMDB reuses no page freed after the snapshot a checkpoint pins (wal/store/state.py), so between two
checkpoints every page the state copies on write is new space. These tests overwrite every key
of a store many times from several threads and assert on the files' size relative to the live
data (never on time): the state file stops growing after the first pass, and the store's
allocated bytes stay a small multiple of the live data. Before the space policy
(wal/store/store.py, "Space"), the same workload grew the state file with every pass.

Quick profile: 8,192 keys of 1 KiB, 6 passes. AGENTWAL_LONG=1: 65,536 keys, 20 passes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import wal
from wal import cli, ops
from wal.store import store as store_module
from wal.store.state import COMPACT_SUFFIX, read_checkpoint

LONG = os.environ.get("AGENTWAL_LONG", "") not in ("", "0")
KEYS = 65_536 if LONG else 8_192
PASSES = 20 if LONG else 6
THREADS = 4
VALUE = 1024
LIVE = KEYS * (len(b"key%08d" % 0) + VALUE)
LEVELS = {"interval": {"durability": "interval", "rpo_ms": 50},
          "buffered": {"durability": "buffered", "rpo_ms": 50},
          "sync": {"durability": "sync"}}


def allocated(path: Path) -> int:
    return sum(os.lstat(os.path.join(root, name)).st_blocks * 512
               for root, _, files in os.walk(path) for name in files)


def overwrite(store: wal.Store, passes: int, after_pass: list[int] | None = None) -> None:
    """THREADS threads, each cycling `passes` times over its share of the KEYS keys; the state
    file's size is noted after each whole pass, once the materializer has applied it (at
    `buffered` on a loaded machine it may lag a pass or two behind the commits, and a size read
    before then would be of an earlier pass)."""
    per = KEYS // THREADS
    values = [os.urandom(VALUE) for _ in range(16)]
    errors: list[BaseException] = []

    def pass_done() -> None:  # in one thread, the others waiting at the barrier
        if after_pass is None:
            return
        written = store.watermarks.written
        deadline = time.monotonic() + 60
        while store.watermarks.applied < written:
            assert time.monotonic() < deadline, "the materializer did not catch up in 60 s"
            time.sleep(0.005)
        after_pass.append(store.stats()["state_file_bytes"])

    barrier = threading.Barrier(THREADS, action=pass_done)

    def run(t: int) -> None:
        try:
            for p in range(passes):
                for i in range(per):
                    store.put(b"key%08d" % (t * per + i), values[(i + p + t) % 16])
                barrier.wait(120)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


@pytest.mark.parametrize("level", list(LEVELS))
def test_sustained_overwrites_keep_the_state_file_bounded_by_the_live_data(
        tmp_path: Path, level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key overwritten PASSES times by 4 threads: the state file stays within 3x the live
    data (LMDB's sequential-insert splits alone leave its pages about half full: ~2x), it stops
    growing after the first passes, and everything allocated (log included) within 4x. The space
    bound's floor (8 MiB, meant for real stores) is lowered so that the 1/8-of-the-state rule
    governs this small store, as it governs a large one."""
    monkeypatch.setattr(store_module, "_SPACE_MIN_BYTES", 1 << 20)
    sizes: list[int] = []
    with wal.open(tmp_path, segment_bytes=1 << 20, **LEVELS[level]) as store:  # type: ignore[arg-type]
        overwrite(store, PASSES, sizes)
        stats = store.stats()
        # Memory: no segment a checkpoint deleted stays mapped (the writer maps a window of the open one).
        with open("/proc/self/maps") as maps:
            stale = [line for line in maps if str(tmp_path) in line and "(deleted)" in line]
        assert not stale, stale
        assert stats["segments_removed"] > 0, {k: v for k, v in stats.items() if "checkpoint" in k or "segment" in k}
    assert stats["space_checkpoints"] >= PASSES - 1, stats  # the policy, not luck, kept it bounded
    assert len(sizes) == PASSES
    assert max(sizes) <= 3 * LIVE, f"state file {sizes} for {LIVE} bytes of live data"
    # Stops growing: the later passes write as much as the first three, in pages LMDB reuses.
    assert max(sizes[3:]) <= max(sizes[:3]) * 1.25 + (4 << 20), sizes
    total = allocated(tmp_path)
    assert total <= 4 * LIVE, f"{total} bytes allocated for {LIVE} bytes of live data"


@pytest.mark.parametrize(("value_bytes", "bound"), [(1024, 1.5), (1800, 1.3)])
def test_keys_inserted_in_order_fill_their_leaf_pages(tmp_path: Path, value_bytes: int, bound: float) -> None:
    """4 threads each append keys in order under a range of their own (an agent's steps under its
    prefix, a bulk load). LMDB splits a page of such entries so that two 1 KiB entries of the
    three a page holds stay on each (one of two at 1.8 KB): pages in use 2x the live data, for
    good, as overwrites never move them. The apply's put order (native/lmdbcall.c, put_order)
    fills the pages: about 1.33x at 1 KiB, 1.14x at 1.8 KB."""
    keys, threads = 8_192, 4
    per = keys // threads
    value = os.urandom(value_bytes)
    with wal.open(tmp_path, durability="interval", rpo_ms=50) as store:
        workers = [threading.Thread(target=lambda t=t: [store.put(b"key%08d" % (t * per + i), value)
                                                        for i in range(per)]) for t in range(threads)]
        for th in workers:
            th.start()
        for th in workers:
            th.join()
        store.checkpoint()  # every commit applied
        used = store.stats()["state_used_bytes"]
        assert store.get(b"key%08d" % (keys - 1)) == value and len(list(store.scan(b"key"))) == keys
    live = keys * (len(b"key%08d" % 0) + value_bytes)
    assert used <= bound * live, f"{used} bytes of pages in use for {live} bytes of live data ({used / live:.2f}x)"


def test_stats_report_free_pages_and_what_a_checkpoint_gives_back(tmp_path: Path) -> None:
    """Overwrites after a checkpoint free pages the checkpoint's pin keeps: stats() counts them as
    pinned, and the next checkpoint makes them reusable (pinned back to 0, free pages kept)."""
    with wal.open(tmp_path, durability="buffered", rpo_ms=50, apply_interval_ms=3_600_000) as store:
        for i in range(2_000):
            store.put(b"key%08d" % i, os.urandom(VALUE))
        store.checkpoint()
        for i in range(1_000):  # ~4 MiB of pages: under the 8 MiB at which a checkpoint would be due
            store.put(b"key%08d" % i, os.urandom(VALUE))
        store._log.sync()  # type: ignore[union-attr]  # durable, so that it can be applied
        while store._apply_ready():
            pass
        before = store.stats()
        assert before["space_checkpoints"] == 0
        assert before["state_pinned_free_bytes"] >= 1_000 * VALUE  # every overwritten page, at least
        assert before["state_free_bytes"] >= before["state_pinned_free_bytes"]
        assert before["state_file_bytes"] == before["state_used_bytes"] + before["state_free_bytes"]
        store.checkpoint()
        after = store.stats()
        assert after["state_pinned_free_bytes"] == 0
        assert after["state_free_bytes"] >= before["state_pinned_free_bytes"] - (1 << 20)
        for name in ("space_checkpoints", "state_backpressure_waits", "state_backpressure_ms",
                     "checkpoint_space_bound_bytes"):
            assert name in after
    info = ops.info(str(tmp_path))["state"]  # read-only: the writer's pin from checkpoint.meta
    assert info["free_bytes"] == after["state_free_bytes"] and info["checkpoint_reclaims_bytes"] == 0


def test_commits_wait_for_the_state_when_it_falls_behind(tmp_path: Path) -> None:
    """A materializer that cannot keep up (a long interval, a tiny apply queue) makes committers
    apply and checkpoint themselves: counted as back-pressure, and the state stays bounded."""
    with wal.open(tmp_path, durability="buffered", rpo_ms=50, apply_interval_ms=3_600_000, max_unapplied=64,
                  checkpoint_bytes=1 << 20) as store:
        for p in range(4):
            for i in range(2_000):
                store.put(b"key%08d" % i, b"%d" % p * 512)
        stats = store.stats()
    assert stats["state_backpressure_waits"] > 0 and stats["state_backpressure_ms"] > 0
    assert stats["space_checkpoints"] + stats["auto_checkpoints"] >= 2
    assert stats["state_file_bytes"] < 16 << 20


def test_compact_returns_free_and_half_empty_pages_and_keeps_every_key(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A state bloated by free pages (overwrites between two checkpoints) and by half-full pages
    (LMDB's splits under sequential inserts) is rebuilt smaller; every key and version is kept,
    the new state is checkpointed (its checkpoint.meta names its own meta page), and the store
    opens and writes as before."""
    keys = 4_000
    with wal.open(tmp_path, durability="buffered", rpo_ms=50, checkpoint_bytes=1 << 30) as store:
        for p in range(3):
            for i in range(keys):
                store.put(b"key%08d" % i, b"%d" % p + os.urandom(VALUE - 1))
        for i in range(0, keys, 2):  # every other key deleted: pages left with one or two of three
            store.delete(b"key%08d" % i)
        store.checkpoint()  # every commit applied
        expected = {k: (v, store.version(k)) for k, v in store.scan()}
        before = store.stats()["state_file_bytes"]
    keys //= 2
    assert before > 1.6 * keys * VALUE  # half-empty pages, and free pages
    assert cli.main(["compact", str(tmp_path)]) == 0
    assert "compacted the state" in capsys.readouterr().out
    assert not (tmp_path / ("state" + COMPACT_SUFFIX)).exists()
    saved = read_checkpoint(str(tmp_path / "state"))
    assert saved is not None
    with wal.open(tmp_path) as store:
        stats = store.stats()
        assert stats["state_file_bytes"] < min(1.5 * keys * (VALUE + 16), 0.75 * before), (before, stats)
        assert stats["state_free_bytes"] <= 64 << 10
        assert {k: (v, store.version(k)) for k, v in store.scan()} == expected
        store.put(b"after", b"compaction")
    with wal.open(tmp_path, readonly=True) as store:
        assert store.get(b"after") == b"compaction" and store.get(b"key00000007") == expected[b"key00000007"][0]


def test_compact_refuses_while_a_writer_holds_the_store(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
        with pytest.raises(wal.LockedError, match="agentwal compact"):
            ops.compact(str(tmp_path))


_READER = """
import sys, wal
store = wal.open(sys.argv[1], readonly=True)
print(store.get("k").decode(), flush=True)
for line in sys.stdin:  # each line: a key to read now
    value = store.get(line.strip())
    print(value.decode() if value is not None else "-", flush=True)
store.close()
"""


def test_compact_refuses_while_another_process_reads_the_store_which_would_be_left_on_the_old_file(
        tmp_path: Path) -> None:
    """A compaction swaps in a new state file; a read-only handle open in another process kept
    the old one and never saw a later commit (stale reads, no error). Refused while one is open;
    once it closes, the compaction goes on and a reader opened after it sees every commit."""
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v0")
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdin is not None
        assert reader.stdout.readline().strip() == "v0"
        with pytest.raises(wal.WalError, match="open read-only"):
            ops.compact(str(tmp_path))
        with wal.open(tmp_path) as store:  # the store goes on, and the reader sees what it commits
            store.put(b"k", b"v1")
            store.checkpoint()
        reader.stdin.write("k\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "v1"
    finally:
        if reader.stdin is not None:
            reader.stdin.close()
        reader.wait(timeout=30)
    assert ops.compact(str(tmp_path))["state_file_bytes"] > 0  # nobody reading: compacted
    with wal.open(tmp_path, readonly=True) as store:
        assert store.get(b"k") == b"v1"


def test_a_refused_read_only_open_or_a_forked_child_keeps_no_hold_that_refuses_compaction(tmp_path: Path) -> None:
    """A read-only open holds the state's data file shared until it closes. One refused part-way
    (LockedError: the store is open in this process) kept the hold, and a child forked while a
    reader was open kept its copy: every later compaction was refused until the process ended."""
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
        with pytest.raises(wal.LockedError):
            wal.open(tmp_path, readonly=True)
    assert ops.compact(str(tmp_path))["state_file_bytes"] > 0
    reader = wal.open(tmp_path, readonly=True)
    child = os.fork()
    if child == 0:  # the child lives on after the parent's reader closes
        time.sleep(30)
        os._exit(0)
    try:
        reader.close()
        assert ops.compact(str(tmp_path))["state_file_bytes"] > 0
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_the_space_benchmark_runs_and_writes_its_files(tmp_path: Path) -> None:
    """benchmarks/space.py end to end at a tiny size (what it measures is a benchmark's business)."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "space.py"
    done = subprocess.run([sys.executable, str(script), "--keys", "400", "--seconds", "1", "--sample", "0.5",
                           "--systems", "agentwal-interval,agentwal-sync+compact,lmdb", "--out", str(tmp_path),
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "space.json").read_text())["results"]
    assert [r["system"] for r in results] == ["agentwal-interval", "agentwal-sync+compact", "lmdb"]
    assert all(r["samples"] and r["puts"] > 0 and r["error"] is None for r in results)
    assert "allocated" in done.stdout


@pytest.mark.parametrize("level", ["sync", "buffered"])
def test_a_store_used_in_short_sessions_keeps_its_log_within_the_checkpoint_bound(tmp_path: Path, level: str) -> None:
    """Open, commit a little, close, again and again (a short-lived agent process): close's
    checkpoint removed no segment and the automatic one never ran, so the log kept every
    segment for good (20 of 4 MiB after 300 sessions of 256 KiB, the state holding 0.25 MiB).
    Close now lets them go once they hold the automatic rule's bound (8 MiB for a small state)."""
    opts = {"durability": level, "segment_bytes": 2 << 20, **({"rpo_ms": 50} if level == "buffered" else {})}
    value = os.urandom(1 << 20)
    most = 0
    for session in range(30):  # 30 MiB of log in all
        with wal.open(tmp_path, **opts) as store:
            store.put(b"agent/state", value)
            store.put(b"agent/step", b"%d" % session)
        held = sum(os.path.getsize(tmp_path / "log" / n) for n in os.listdir(tmp_path / "log") if n.endswith(".wal"))
        most = max(most, held)
    assert most <= (8 << 20) + 2 * (2 << 20) + (1 << 20), most  # the bound, the newest segment, one commit
    with wal.open(tmp_path, **opts) as store:
        assert store.get(b"agent/step") == b"29" and store.get(b"agent/state") == value
        assert store.stats()["records_replayed"] == 0
