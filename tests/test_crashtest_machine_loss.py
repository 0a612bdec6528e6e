"""`agentwal crashtest --archive URL`: the machine-loss drill as a user runs it, against the real S3
server of the test suite (SeaweedFS) and a ``file://`` archive: a child commits with the archive,
is SIGKILLed, its directory deleted, the archive restored and checked (wal/drill/machineloss.py).

Quick profile: two levels, one loss each on S3, one on ``file://`` (tests/test_archive_faults.py
loses the machine at every level too). AGENTWAL_LONG=1: every level, ten losses each.
"""

# ruff: noqa: F811 -- fixtures imported by name (tests/archive_server.py)
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from archive_server import BUCKET, WeedServer, s3_server  # noqa: F401 -- fixtures

from wal.archive.objects import open_objects
from wal.drill.crashtest import Ack, ChildOutput, Oracle, Recovered, txn_ops

LONG = os.environ.get("AGENTWAL_LONG", "") not in ("", "0")


def _drill(directory: Path, url: str, levels: str, losses: int, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "wal.drill.crashtest", str(directory), "--archive", url, "--level", levels,
         "--kills", "0", "--power-cuts", "0", "--machine-losses", str(losses), "--archive-rpo-ms", "500",
         "--threads", "2", "--seed", "5"],
        capture_output=True, text=True, timeout=900, check=False, env=env)
    print(proc.stdout, proc.stderr)
    return proc


def _table(out: str) -> dict[str, str]:
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("machine loss, archive "))
    rows = {}
    for ln in lines[start + 2:]:
        if not ln.strip():
            break
        rows[ln.split()[0]] = ln
    return rows


def test_machine_loss_drill_on_s3_passes_and_cleans_up(tmp_path: Path, s3_server: WeedServer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    s3_server.use_env(monkeypatch)
    url = f"s3://{BUCKET}/drill-{os.urandom(4).hex()}"
    levels = "replicated,sync,interval,buffered" if LONG else "replicated,interval"
    proc = _drill(tmp_path, url, levels, 10 if LONG else 1, dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _table(proc.stdout)
    assert set(rows) == set(levels.split(","))
    for row in rows.values():
        assert row.rstrip().endswith("PASS"), row
        assert row.split()[-2] == ("10" if LONG else "1"), row  # the losses run
    assert rows["replicated"].split()[2] == "0", "nothing acknowledged at replicated may be lost"
    assert f"--archive {url}" in proc.stdout  # how to rerun it
    assert list(open_objects(url).list("")) == [], "every round's prefix is deleted afterwards"


def test_machine_loss_drill_on_a_file_archive(tmp_path: Path) -> None:
    proc = _drill(tmp_path, f"file://{tmp_path}/archive", "replicated", 1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _table(proc.stdout)["replicated"].rstrip().endswith("PASS")


def test_level_replicated_needs_an_archive(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "wal.drill.crashtest", str(tmp_path), "--level", "replicated"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "needs --archive" in proc.stderr


def _acks(seed: int, n: int, t_ns: int) -> ChildOutput:
    out = ChildOutput(open_ns=0, ready_ns=0, ready_lsn=0)
    for i in range(1, n + 1):
        keys = tuple(k for k, _ in txn_ops(seed, 1, 0, i))
        out.acks.append(Ack(i, t_ns, 0, i, keys))
    return out


def _state(seed: int, upto: int) -> Recovered:
    state: dict[bytes, tuple[int, bytes]] = {}
    for i in range(1, upto + 1):
        for key, value in txn_ops(seed, 1, 0, i):
            if value is None:
                state.pop(key, None)
            else:
                state[key] = (i, value)
    return Recovered(state, upto, 0.0, None)


def test_the_oracle_holds_each_level_to_its_machine_loss_bound() -> None:
    """A restore missing the last acknowledged commit: a violation at replicated; within the archive
    bound elsewhere when it was acknowledged just before the loss, a violation when long before."""
    kill_ns = 10_000_000_000
    just_before = kill_ns - 100_000_000  # 100 ms
    long_before = kill_ns - 2_000_000_000  # 2 s
    got = _state(3, 4)
    outcome = Oracle("replicated", 500, 3).check(got, 1, _acks(3, 5, just_before), kill_ns, "machine")
    assert outcome.lost == 1 and any("lost at level replicated after a machine loss" in v for v in outcome.violations)
    outcome = Oracle("sync", 500, 3).check(got, 1, _acks(3, 5, just_before), kill_ns, "machine")
    assert outcome.lost == 1 and not outcome.violations
    outcome = Oracle("sync", 500, 3).check(got, 1, _acks(3, 5, long_before), kill_ns, "machine")
    assert any("over archive_rpo_ms=500" in v for v in outcome.violations)
    outcome = Oracle("replicated", 500, 3).check(_state(3, 5), 1, _acks(3, 5, long_before), kill_ns, "machine")
    assert not outcome.violations and outcome.lost == 0


@pytest.mark.parametrize("level", ["replicated"])
def test_drill_api_reports_restore_times(tmp_path: Path, level: str) -> None:
    from wal.drill.machineloss import run_machine_losses  # noqa: PLC0415

    result = run_machine_losses(tmp_path / "w", level, archive=f"file://{tmp_path}/a", archive_rpo_ms=500,
                                losses=1, threads=1, seed=9, run_max_s=0.3)
    assert result.passed, result.report()
    assert result.machine_losses == 1 and len(result.recovery_ms) == 1
    assert "machine loss" in result.summary()
