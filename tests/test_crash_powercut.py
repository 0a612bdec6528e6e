"""Power-cut tests: the kill-loop oracle over simulated power cuts.

Random cuts (`wal.drill.crashtest.run_power_cuts`): the committing child runs under the crash-simulation
shim (`wal.drill.crashsim`), is SIGKILLed at a random moment -- also inside its recovery of the previous
cut -- and `apply_power_cut` rewinds the files with a random mode (drop / prefix / garble / random)
and seed, as a disk could leave them had the power failed at the kill. What a power cut may cost:

| level      | acknowledged commits a power cut may lose |
|------------|-------------------------------------------|
| `sync`     | none                                      |
| `interval` | those acknowledged within rpo_ms of it    |
| `buffered` | those acknowledged within rpo_ms of it    |

and, as after a kill, the state is a gap-free prefix of the commits (I3).

Exhaustive cuts (`wal.drill.crashtest.run_exhaustive`): a scripted workload -- 20 commits, a checkpoint
after the 10th, 4 KiB segments so it rolls and removes segments, then close -- runs once per
level under the shim; a copy is cut just before and just after every fsync, fdatasync and
directory fsync in its journal, and at its end, in every mode, and each is checked by the same
oracle against the acks noted before the cut.

Quick profile: 10 random cuts per level and thread count, every boundary x every mode. AGENTWAL_LONG=1:
150 random cuts per level and thread count.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import wal
from wal.drill import crashsim, crashtest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim is LD_PRELOAD on glibc")

LONG = os.environ.get("AGENTWAL_LONG", "") not in ("", "0")
CUTS = 150 if LONG else 10
SEED = int(os.environ.get("AGENTWAL_CRASH_SEED", "20261122"))
# A power cut loses nothing acknowledged at sync, whatever the timing: that level runs with the
# rest of the suite; the others' loss is bounded in time (tests/conftest.py, `alone`).
LEVELS = [pytest.param("sync", 0, marks=pytest.mark.no_time_bound), ("interval", 50), ("buffered", 50)]


@pytest.mark.parametrize("threads", [1, 8])
@pytest.mark.parametrize(("level", "rpo_ms"), LEVELS)
def test_random_power_cuts_lose_nothing_at_sync_and_only_the_last_rpo_ms_otherwise(
        tmp_path: Path, level: str, rpo_ms: int, threads: int) -> None:
    r = crashtest.run_power_cuts(tmp_path, level, rpo_ms, CUTS, threads=threads, seed=SEED)
    print(r.summary())
    assert r.violation_count == 0, r.report()
    assert r.power_cuts == CUTS and r.acknowledged > 0
    if level == "sync":
        assert r.lost == 0
    else:
        assert r.worst_power_loss_ms <= rpo_ms + crashtest.SLACK_MS, r.report()


@pytest.mark.parametrize(("level", "rpo_ms"), LEVELS)
def test_a_cut_at_every_fsync_boundary_of_a_scripted_workload_in_every_mode_keeps_the_promise(
        tmp_path: Path, level: str, rpo_ms: int) -> None:
    r = crashtest.run_exhaustive(tmp_path, level, rpo_ms, modes=crashtest.MODES, seed=SEED)
    print(r.summary())
    assert r.violation_count == 0, r.report()
    # ~20 fdatasyncs of the log alone at sync; the flusher's at the others; plus segment and
    # directory syncs, LMDB's and the checkpoint's -- each cut before and after, in 4 modes.
    assert r.exhaustive_cuts >= 4 * 40, r.summary()
    assert r.exhaustive_cuts % len(crashtest.MODES) == 0
    if level == "sync":
        assert r.lost == 0
    else:
        assert r.lost > 0, "no cut ever fell between an acknowledgement and its fdatasync: the test lost its teeth"
        assert r.worst_power_loss_ms <= rpo_ms + crashtest.SLACK_MS



_KILLED_IN_ROLL = r'''
import sys, wal
from wal.drill import failpoints
log = wal.Log.open(sys.argv[1], segment_bytes=4096)
failpoints.slow("dirsync", 60)  # the next directory fsync -- the roll's -- hangs until the kill
for i in range(100):
    print("ack", log.append(b"A" * 500), flush=True)
'''
_RESUMED = r'''
import sys, wal
log = wal.Log.open(sys.argv[1], segment_bytes=4096)
for i in range(3):
    print("ack", log.append(b"B%d" % i), flush=True)  # sync: acknowledged once fdatasynced
log.close()
'''


def _first_round_kills_early(seed: int) -> bool:
    """Whether round 1 of a power-cut loop with this seed kills its child anywhere from its exec on
    (the loop's first draws: the apply interval, then where to kill: under 0.4 at round 1)."""
    rng = random.Random(f"{seed}/sync/power")
    rng.choice((20, 20, 500, 2000))
    return rng.random() < 0.4


def test_a_child_killed_before_the_simulator_loaded_in_it_is_drawn_again_not_failed_or_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill within the milliseconds between a child's exec and the shim's constructor leaves no
    journal: the child touched nothing. The drill stopped with exit status 2 ("the power-cut
    simulator did not run in the child") although the simulator was fine. Here round 1's first
    child is a process that never loads the shim nor prints OPEN, killed early: the round is
    drawn again with a real child, and both cuts are made."""
    seed = next(s for s in range(1000) if _first_round_kills_early(s))
    real_argv, real_env = crashtest._child_argv, crashsim.env_for
    spawned: list[list[str]] = []

    def argv(*args: object, **kw: object) -> list[str]:
        spawned.append(real_argv(*args, **kw) if spawned else [sys.executable, "-c", "import time; time.sleep(5)"])
        return spawned[-1]

    def env(*args: object, **kw: object) -> dict[str, str]:
        made = real_env(*args, **kw)
        return made if spawned else {k: v for k, v in made.items() if k != "LD_PRELOAD"}

    monkeypatch.setattr(crashtest, "_child_argv", argv)
    monkeypatch.setattr(crashsim, "env_for", env)
    r = crashtest.run_power_cuts(tmp_path, "sync", 0, 2, seed=seed)
    assert r.violation_count == 0, r.report()
    assert r.power_cuts == 2 and len(spawned) == 3
    assert spawned[0][1] == "-c" and "--child" in spawned[1]


def test_a_simulator_that_never_journals_is_reported_after_the_redraws(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Children that never journal nor print OPEN round after round: the drill gives up on the
    simulator, naming it, rather than draw forever."""
    loop = crashtest._Loop(str(tmp_path), "sync", 0, threads=1, seed=1, result=crashtest.LevelResult("sync", 0, 1),
                           crash="power", run_max_s=0.25, recovery_kill_fraction=0.3)
    runs: list[int] = []

    class Unstarted:
        def stderr_tail(self) -> str:
            return "(nothing)"

    def unstarted(round_no: int) -> tuple[object, crashtest.ChildOutput, bool, int]:
        runs.append(round_no)
        return Unstarted(), crashtest.ChildOutput(), False, 0

    monkeypatch.setattr(loop, "_run_child", unstarted)
    with pytest.raises(crashtest.SimulatorInactiveError, match=r"journaled nothing in 20 children of power round 1"):
        loop.round(1)
    assert runs == [1] * 20


def test_commits_a_writer_makes_in_a_segment_whose_roll_was_killed_before_its_directory_fsync_survive_a_power_cut(
        tmp_path: Path) -> None:
    """A writer SIGKILLed between a roll's rename of its new segment and the directory fsync
    (FORMAT.md §7.2, steps 6-7) leaves a segment whose name is not durable. The next open
    resumes in it: it must make the name durable first, or the `sync` commits it then
    acknowledges there go with the name at the next power cut (they did)."""
    root, journal = tmp_path / "root", tmp_path / "journal" / "journal"
    logdir = root / "log"
    env = crashsim.env_for(str(root), str(journal))
    killed = subprocess.Popen([sys.executable, "-c", _KILLED_IN_ROLL, str(logdir)], env=env,
                              stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (logdir / "0000000000000002.wal").exists():
        assert time.monotonic() < deadline and killed.poll() is None, "the log never rolled"
        time.sleep(0.01)
    time.sleep(0.3)  # in the roll's directory fsync, held by the failpoint
    killed.send_signal(signal.SIGKILL)
    out = killed.communicate()[0]
    resumed = subprocess.run([sys.executable, "-c", _RESUMED, str(logdir)], env=env, stdout=subprocess.PIPE,
                             text=True, check=True).stdout
    acks = [int(line.split()[1]) for line in (out + resumed).splitlines() if line.startswith("ack")]
    assert len([line for line in resumed.splitlines() if line.startswith("ack")]) == 3
    crashsim.apply_power_cut(str(root), str(journal), mode="drop", seed=1)
    with wal.Log.open(logdir, readonly=True) as log:
        kept = {lsn for lsn, _ in log.read()}
    assert [lsn for lsn in acks if lsn not in kept] == []


def _power_cut_once(tmp_path: Path, script: str, ready: str, *args: str) -> Path:
    """`script` run under the power-cut shim on the store root/s (its first argument, then
    `args`), SIGKILLed once it prints `ready`, and the power cut (mode drop) applied: the root."""
    root, journal = tmp_path / "root", tmp_path / "journal" / "journal"
    env = crashsim.env_for(str(root), str(journal))
    child = subprocess.Popen([sys.executable, "-c", script, str(root / "s"), *args], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == ready
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    crashsim.apply_power_cut(str(root), str(journal), mode="drop", seed=1)
    return root


_ARCHIVED_WRITER = r'''
import json, os, sys, time, wal
store = wal.open(sys.argv[1], archive=sys.argv[2], archive_rpo_ms=100)
store.put(b"k", b"v")
status = os.path.join(sys.argv[1], "archive.json")
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        with open(status) as f:
            if json.load(f)["archived_lsn"] >= 1:
                break
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.05)
print("shipped", flush=True)
time.sleep(60)
'''


def test_the_archive_status_an_open_without_the_archive_relies_on_survives_a_power_cut(tmp_path: Path) -> None:
    """archive.json tells an open without the archive which segments it may not release: lost
    or left empty by a power cut (it was renamed into place, never synced), that open would
    release segments never shipped. It is now written durably."""
    root = _power_cut_once(tmp_path, _ARCHIVED_WRITER, "shipped", f"file://{tmp_path}/a")
    status = json.loads((root / "s" / "archive.json").read_text())
    assert status["archived_lsn"] >= 1


_SEALED_WRITER = r'''
import sys, time, wal
store = wal.open(sys.argv[1], encryption=bytes(range(32)), durability="sync")
store.put(b"k", b"the-value")
print("written", flush=True)
time.sleep(60)
'''


def test_a_sealed_stores_record_of_its_sealing_survives_a_power_cut(tmp_path: Path) -> None:
    """The state records how the store is sealed, so that an open with STORE lost is held to it.
    Written unsynced after the state's first checkpoint, a power cut took it back, and a later
    open without the key (STORE lost) opened the store plain and returned an envelope as the
    value. It is now made durable when written."""
    root = _power_cut_once(tmp_path, _SEALED_WRITER, "written")
    (root / "s" / "STORE").unlink()
    for options in ({}, {"compression": "zstd"}):
        with pytest.raises((wal.CorruptionError, wal.MissingKeyError)):
            wal.open(root / "s", **options)
    with wal.open(root / "s", encryption=bytes(range(32))) as store:
        assert store.get(b"k") == b"the-value"
