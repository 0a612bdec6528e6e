"""`agentwal demo`: end to end through the command line, and its check catching what it must catch.

The end-to-end tests run ``python -m wal demo`` as a user would: a supervisor SIGKILLs a real
worker process and restarts it, then checks the store. The other tests build a demo store with
the worker in-process (no kills), damage it by hand through the public API, and assert that
`wal.drill.demo.verify` reports the damage: a deleted step is lost, a step committed again is applied
twice, and a resume below an acknowledged step is caught at restart.
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import wal
from wal import cli
from wal.drill import demo
from wal.log import durability as dur


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wal", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def build_store(path: Path, agents: int = 3, steps: int = 6, seed: int = 5) -> list[demo.Ack]:
    """A finished demo store at `path` (worker run in-process, no kills); returns its acknowledgements."""
    out = io.StringIO()
    assert demo.run_worker(str(path), demo.DemoConfig(agents=agents, steps=steps, seed=seed), out) == 0
    acks = demo.parse_acks(out.getvalue().splitlines())
    assert len(acks) == agents * steps
    return acks


# ---- end to end ----------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [[], ["--durability", "interval", "--rpo-ms", "20"],
                                   ["--durability", "buffered", "--rpo-ms", "20"]],
                         ids=["sync", "interval", "buffered"])
def test_demo_survives_sigkills_and_its_check_passes(tmp_path: Path, level: list[str]) -> None:
    r = run_cli("demo", str(tmp_path / "store"), "--kills", "3", "--steps", "20", "--agents", "4",
                "--seed", "11", *level)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 killed with SIGKILL" in r.stdout
    verdict = [line for line in r.stdout.splitlines() if line.startswith("CHECK ")]
    assert len(verdict) == 1
    # A kill may land between a step's commit and its ACK line: that step is in the store, never
    # acknowledged, and the report says so. At most one per kill.
    passed = re.match(r"CHECK PASSED: 4 agents, (\d+) acknowledged steps, 0 lost, 0 applied twice", verdict[0])
    assert passed is not None, verdict[0]
    unacked = 80 - int(passed.group(1))
    assert 0 <= unacked <= 3, verdict[0]
    assert re.search(r"steps completed\s+80 of 80", r.stdout), r.stdout
    assert (f"{unacked} of them committed, but the worker was killed before printing their ACK" in r.stdout) \
        == (unacked > 0), r.stdout
    assert "\x1b[" not in r.stdout  # not a terminal: plain lines, no escape codes


def test_demo_in_a_temporary_directory_says_where_the_store_is() -> None:
    r = run_cli("demo", "--kills", "1", "--steps", "3", "--agents", "2", "--seed", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    where = next(line for line in r.stdout.splitlines() if line.startswith("store: "))
    path = Path(where.split()[1])
    try:
        assert (path / "STORE").is_file()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_demo_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    r = run_cli("demo", str(tmp_path))
    assert r.returncode == 2
    assert "not an empty directory" in r.stderr


def test_demo_rejects_a_contradictory_durability_before_starting(tmp_path: Path) -> None:
    r = run_cli("demo", str(tmp_path / "s"), "--durability", "sync", "--rpo-ms", "50")
    assert r.returncode == 2
    assert "rpo_ms" in r.stderr
    assert not (tmp_path / "s").exists()


# ---- the check on a store damaged by hand -----------------------------------------------------------


def test_verify_passes_on_an_untouched_demo_store(tmp_path: Path) -> None:
    acks = build_store(tmp_path)
    result = demo.verify(tmp_path, acks)
    assert result.ok, result.findings()
    assert result.verdict() == "CHECK PASSED: 3 agents, 18 acknowledged steps, 0 lost, 0 applied twice"
    assert result.steps_in_store == 18


def test_verify_reports_a_step_deleted_by_hand_as_lost(tmp_path: Path) -> None:
    acks = build_store(tmp_path)
    with wal.open(tmp_path) as store:
        store.delete(demo.msg_key(1, 4))
        store.delete(demo.tool_key(1, 4))
    result = demo.verify(tmp_path, acks)
    assert not result.ok
    assert len(result.lost) == 1 and "agent 01: step 4" in result.lost[0]
    assert any("step 4 has no message" in p for p in result.problems)  # a gap below the counter
    assert result.verdict().startswith("CHECK FAILED: 3 agents, 18 acknowledged steps, 1 lost, 0 applied twice")


def test_verify_reports_a_rolled_back_counter_as_lost_steps(tmp_path: Path) -> None:
    acks = build_store(tmp_path)
    with wal.open(tmp_path) as store, store.transaction() as tx:
        tx.put(demo.counter_key(2), b"4")
        for step in (5, 6):
            tx.delete(demo.msg_key(2, step))
            tx.delete(demo.tool_key(2, step))
    result = demo.verify(tmp_path, acks)
    assert [m.split(",")[0] for m in result.lost] == ["agent 02: step 5", "agent 02: step 6"]
    assert any("stopped at step 4 of 6" in p for p in result.problems)


def test_verify_reports_a_step_committed_again_as_applied_twice(tmp_path: Path) -> None:
    acks = build_store(tmp_path)
    # Step 3 of agent 0 applied a second time, with the very same content.
    with wal.open(tmp_path) as store, store.transaction() as tx:
        for key in (demo.msg_key(0, 3), demo.tool_key(0, 3)):
            value = store.get(key)
            assert value is not None
            tx.put(key, value)
    result = demo.verify(tmp_path, acks)
    assert not result.ok
    assert any("agent 00: step 3 was acknowledged at LSN" in m for m in result.applied_twice)
    assert any("agent 00: step 4 was built on step 3" in m for m in result.applied_twice)
    assert "0 lost" in result.verdict()


def test_verify_reports_a_message_past_the_counter(tmp_path: Path) -> None:
    acks = build_store(tmp_path, steps=4)
    with wal.open(tmp_path) as store:
        store.put(demo.msg_key(0, 5), b"{}")
    result = demo.verify(tmp_path, acks)
    assert any("message for step 5 exists past the counter 4" in p for p in result.problems)


def test_verify_refuses_a_store_that_is_not_a_demo(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put("k", b"v")
    result = demo.verify(tmp_path, [])
    assert not result.ok and "not a demo store" in result.problems[0]


# ---- the supervisor's restart check ------------------------------------------------------------------


def supervisor(tmp_path: Path, level: dur.Durability) -> tuple[demo._Supervisor, demo.RunRecord]:
    cfg = demo.DemoConfig(agents=1, steps=10, seed=0, durability=level.level, rpo_ms=level.rpo_ms)
    sup = demo._Supervisor(str(tmp_path), cfg, level, [], demo._Progress(io.StringIO(), tty=False))
    return sup, demo.RunRecord(1, 0, None, 0.0)


def test_a_restart_below_an_acknowledged_step_is_reported_lost_at_sync(tmp_path: Path) -> None:
    sup, run = supervisor(tmp_path, dur.parse("sync", None))
    for line in ("ACK 0 1 5 1.0", "ACK 0 2 6 1.1", "RESUME 0 1", "ACK 0 2 7 2.0"):
        sup._on_line(run, line)
    assert len(sup.lost) == 1 and "step 2" in sup.lost[0]
    assert sup.applied_twice == []  # the redo of a step already reported lost is not counted again


def test_a_step_acknowledged_twice_is_reported_applied_twice(tmp_path: Path) -> None:
    sup, run = supervisor(tmp_path, dur.parse("sync", None))
    for line in ("ACK 0 1 5 1.0", "ACK 0 1 9 2.0"):
        sup._on_line(run, line)
    assert len(sup.applied_twice) == 1
    sup._on_line(run, "ACK 0 1 9 2.1 dup")  # an idempotent retry returning the same commit is fine
    assert len(sup.applied_twice) == 1


# ---- command line and determinism --------------------------------------------------------------------


def test_help_lists_the_demo_and_the_demo_help_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("DIR", "--agents", "--kills", "--steps", "--seed", "--durability", "--rpo-ms"):
        assert option in text


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_a_step_is_a_pure_function_of_seed_agent_and_step() -> None:
    assert demo.plan_step(7, 3, 12) == demo.plan_step(7, 3, 12)
    assert demo.plan_step(7, 3, 12) != demo.plan_step(8, 3, 12)
    plan = demo.plan_step(7, 1, 1)
    assert plan.message["workflow"] == demo.KINDS[1] and json.dumps(plan.tool_call)
    assert demo.kill_plans(random.Random(4), 5) == demo.kill_plans(random.Random(4), 5)
    modes = [p.mode for p in demo.kill_plans(random.Random(4), 5)]
    assert modes[0] == "workflow" and sorted(modes) == ["recovery", "startup", "workflow", "workflow", "workflow"]
