"""Kill loops: a real child commits through `wal.open` and is SIGKILLed at random.

`wal.drill.crashtest.run_kills` runs the loop: each round a child (``python -m wal.drill.crashtest --child``)
opens the store the previous round left crashed -- so its open is a real recovery -- and commits
from 1 or 8 threads, printing every acknowledged commit; the parent SIGKILLs it at a seeded
random moment: inside that recovery, within its first commits, or later. A copy of what it left
is recovered and handed to the oracle (`wal.drill.crashtest.Oracle`, explained in that module):

* I2: at ``sync`` and ``interval`` every acknowledged commit survives a process kill; at
  ``buffered`` the lost ones are a suffix acknowledged within ``rpo_ms`` of the kill;
* I3: the state is the previous state plus a gap-free prefix of the round's commits, whole
  transactions in LSN order, nothing else;
* I4: a child killed during its recovery leaves what a second recovery turns into exactly the
  state a clean recovery gave (digest of every key, version and value).

Quick profile: 14 kills per level and thread count. AGENTWAL_LONG=1: 300 (hundreds of kills with
zero violations is the bar). The second half checks the oracle itself on made-up states: each
kind of violation it must report.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wal.drill import crashtest
from wal.drill.crashtest import Ack, ChildOutput, Oracle, Recovered, txn_ops

LONG = os.environ.get("AGENTWAL_LONG", "") not in ("", "0")
KILLS = 300 if LONG else 14
SEED = int(os.environ.get("AGENTWAL_CRASH_SEED", "20261122"))
# A process kill loses nothing acknowledged at sync and interval, whatever the timing: those run
# with the rest of the suite; buffered's loss is bounded in time (tests/conftest.py, `alone`).
LEVELS = [pytest.param("sync", 0, marks=pytest.mark.no_time_bound),
          pytest.param("interval", 50, marks=pytest.mark.no_time_bound), ("buffered", 50)]


@pytest.mark.parametrize("threads", [1, 8])
@pytest.mark.parametrize(("level", "rpo_ms"), LEVELS)
def test_sigkill_at_random_moments_loses_nothing_the_level_promises(
        tmp_path: Path, level: str, rpo_ms: int, threads: int) -> None:
    r = crashtest.run_kills(tmp_path, level, rpo_ms, KILLS, threads=threads, seed=SEED)
    print(r.summary())
    assert r.violation_count == 0, r.report()
    assert r.kills == KILLS
    assert r.acknowledged > 0 and r.committed > 0, "no commit was ever acknowledged before a kill"
    if level in ("sync", "interval"):
        assert r.lost == 0  # a process kill loses nothing acknowledged at these levels
    else:
        assert r.worst_kill_loss_ms <= rpo_ms + crashtest.SLACK_MS, r.report()


def test_kills_during_recovery_then_recovery_again_give_the_state_of_a_clean_recovery(tmp_path: Path) -> None:
    """Most rounds aim the kill into the child's wal.open; the store has much to replay
    (the child's materializer runs every 0.5-2 s in most rounds), and at buffered the log
    may end in a torn write."""
    r = crashtest.run_kills(tmp_path, "buffered", 50, KILLS, threads=4, seed=SEED + 1, recovery_kill_fraction=0.7)
    print(r.summary())
    assert r.violation_count == 0, r.report()
    assert r.kills_in_recovery >= 3, f"too few kills landed inside a recovery: {r.summary()}"


# ---- the oracle on made-up states: it reports each kind of violation --------------------------------


def _apply(state: dict[bytes, tuple[int, bytes]], seed: int, round_no: int,
           commits: list[tuple[int, int, int]]) -> dict[bytes, tuple[int, bytes]]:
    out = dict(state)
    for tid, n, lsn in sorted(commits, key=lambda c: c[2]):
        for key, value in txn_ops(seed, round_no, tid, n):
            if value is None:
                out.pop(key, None)
            else:
                out[key] = (lsn, value)
    return out


def _ack(tid: int, n: int, lsn: int, t_ns: int, *, seed: int = 1, round_no: int = 1) -> Ack:
    return Ack(lsn, t_ns, tid, n, tuple(k for k, _ in txn_ops(seed, round_no, tid, n)))


# Two threads: thread 0 commits n=1,2,3 at LSNs 1,3,5; thread 1 commits n=1,2 at LSNs 2,4.
COMMITS = [(0, 1, 1), (1, 1, 2), (0, 2, 3), (1, 2, 4), (0, 3, 5)]
MS = 1_000_000


def _child(*acks: Ack, ready: bool = True) -> ChildOutput:
    return ChildOutput(open_ns=0, ready_ns=1 if ready else None, acks=list(acks))


def test_oracle_accepts_a_gap_free_prefix_including_unacknowledged_commits() -> None:
    o = Oracle("sync", 0, 1)
    got = Recovered(_apply({}, 1, 1, COMMITS[:4]), 4, 0.0, None)
    out = o.check(got, 1, _child(_ack(0, 1, 1, 0), _ack(1, 1, 2, 0)), 10 * MS, "kill")
    assert out.violations == [] and out.committed == 4 and out.lost == 0
    assert (o.base, o.model) == (4, got.state)


def test_oracle_reports_a_hole_in_the_commit_sequence() -> None:
    o = Oracle("buffered", 50, 1)
    commits = [c for c in COMMITS if c[2] != 3]
    out = o.check(Recovered(_apply({}, 1, 1, commits), 5, 0.0, None), 1, _child(), 0, "kill")
    assert any("I3" in v and "gap-free" in v for v in out.violations), out.violations


def test_oracle_reports_a_partial_transaction() -> None:
    o = Oracle("sync", 0, 1)
    state = _apply({}, 1, 1, COMMITS)
    shared = next(k for tid, n, _ in COMMITS for k, v in txn_ops(1, 1, tid, n)[1:] if v is not None)
    del state[shared]  # one key of a transaction that is otherwise there
    out = o.check(Recovered(state, 5, 0.0, None), 1, _child(), 0, "kill")
    assert any("I3" in v and "partial" in v for v in out.violations), out.violations


def test_oracle_reports_commits_applied_out_of_order() -> None:
    """A shared key showing an older commit's write although a newer commit to it survived."""
    commits = [(0, n, n) for n in range(1, 31)]
    writes: dict[bytes, list[tuple[int, bytes]]] = {}
    for _, n, lsn in commits:
        for key, value in txn_ops(1, 1, 0, n)[1:]:
            if value is not None:
                writes.setdefault(key, []).append((lsn, value))
    key, history = next((k, h) for k, h in writes.items() if len(h) >= 2)
    state = _apply({}, 1, 1, commits)
    state[key] = history[-2]  # the older write wins: replayed out of order
    out = Oracle("sync", 0, 1).check(Recovered(state, 30, 0.0, None), 1, _child(), 0, "kill")
    assert any("I3" in v and "prefix of the commits" in v for v in out.violations), out.violations


def test_oracle_reports_an_acknowledged_commit_lost_at_sync_and_at_interval_after_a_kill() -> None:
    for level, crash in (("sync", "kill"), ("sync", "power"), ("interval", "kill")):
        o = Oracle(level, 0 if level == "sync" else 50, 1)
        got = Recovered(_apply({}, 1, 1, COMMITS[:3]), 3, 0.0, None)
        out = o.check(got, 1, _child(_ack(1, 2, 4, 9 * MS)), 10 * MS, crash)  # type: ignore[arg-type]
        assert out.lost == 1 and any("I2" in v for v in out.violations), (level, crash, out.violations)


def test_oracle_accepts_a_loss_within_rpo_and_reports_one_beyond_it() -> None:
    for level, crash in (("buffered", "kill"), ("interval", "power"), ("buffered", "power")):
        got = Recovered(_apply({}, 1, 1, COMMITS[:3]), 3, 0.0, None)
        within = Oracle(level, 50, 1).check(got, 1, _child(_ack(1, 2, 4, 100 * MS)), 140 * MS, crash)  # type: ignore[arg-type]
        assert within.violations == [] and within.lost == 1 and within.loss_ms == pytest.approx(40)
        beyond = Oracle(level, 50, 1).check(got, 1, _child(_ack(1, 2, 4, 100 * MS)), 160 * MS, crash)  # type: ignore[arg-type]
        assert any("RPO" in v for v in beyond.violations), beyond.violations


def test_oracle_reports_an_acknowledged_lsn_that_holds_another_commit() -> None:
    o = Oracle("sync", 0, 1)
    got = Recovered(_apply({}, 1, 1, COMMITS), 5, 0.0, None)
    out = o.check(got, 1, _child(_ack(0, 2, 4, 0)), 0, "kill")  # acknowledged as 4, in the state at 3
    assert any("acknowledged as LSN 4" in v for v in out.violations), out.violations


def test_oracle_reports_a_state_that_changed_after_a_kill_during_recovery() -> None:
    o = Oracle("sync", 0, 1)
    first = Recovered(_apply({}, 1, 1, COMMITS), 5, 0.0, None)
    assert o.check(first, 1, _child(), 0, "kill").violations == []
    same = o.check(Recovered(dict(first.state), 5, 0.0, None), 2, _child(ready=False), 0, "kill")
    assert same.violations == [] and same.in_recovery
    changed = dict(first.state)
    changed.pop(next(iter(changed)))
    out = o.check(Recovered(changed, 5, 0.0, None), 2, _child(ready=False), 0, "kill")
    assert any("I4" in v for v in out.violations), out.violations


def test_oracle_reports_a_log_that_ends_elsewhere_than_the_state_and_a_failed_recovery() -> None:
    got = Recovered(_apply({}, 1, 1, COMMITS[:2]), 7, 0.0, None)
    assert any("log ends at LSN 7" in v for v in Oracle("sync", 0, 1).check(got, 1, _child(), 0, "kill").violations)
    failed = Recovered({}, 0, 0.0, None, "CorruptionError: log damaged")
    assert Oracle("sync", 0, 1).check(failed, 1, _child(), 0, "power").violations == [
        "recovery failed: CorruptionError: log damaged"]


def test_child_output_parsing_ignores_a_line_cut_short_by_the_kill() -> None:
    keys = " ".join(k.decode() for k, _ in txn_ops(1, 1, 0, 1))
    out = crashtest.parse_child_output(f"OPEN 5\nREADY 7 0\nACK 1 9 {keys}\nACK 2 1")
    assert (out.open_ns, out.ready_ns, out.ready_lsn) == (5, 7, 0)
    assert [(a.lsn, a.tid, a.n) for a in out.acks] == [(1, 0, 1)] and not out.errors
