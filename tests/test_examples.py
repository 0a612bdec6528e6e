"""The examples, run, SIGKILLed mid-run and rerun as a new user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def run_until(args: list[str], marker: str, extra_env: dict[str, str] | None = None) -> list[str]:
    """Start the example, SIGKILL it once a line containing marker appears; return its output lines."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True, env=env(**(extra_env or {})))
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        if marker in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, lines
    return lines


def run(args: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env(), timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_langgraph_resume_example(tmp_path: Path) -> None:
    pytest.importorskip("langgraph")
    db = str(tmp_path / "db")
    script = str(EXAMPLES / "langgraph_resume.py")
    first = run_until([script, db, "--delay", "0.1"], "did step 4")
    assert first[0] == "starting fresh"
    second = run([script, db, "--delay", "0"])
    assert second[0].startswith("resuming from checkpoint at step ")
    resumed_at = int(second[0].rsplit(" ", 1)[1])
    assert 3 <= resumed_at <= 4  # the last finished step's checkpoint (step 4 may have been cut before its commit)
    assert "did step 1" not in second  # finished steps are not redone
    assert second[-1] == "DONE step=10 log=" + ",".join(f"step{i}" for i in range(1, 11))
    assert run([script, db])[-1] == second[-1]  # a third run finds it finished


def test_agent_loop_example_reconciles(tmp_path: Path) -> None:
    db, ledger = str(tmp_path / "db"), str(tmp_path / "ledger.txt")
    script = str(EXAMPLES / "agent_loop.py")
    first = run_until([script, db, ledger], "PAUSED", {"AGENT_LOOP_PAUSE_AT": "call-3"})
    assert "effect done call-3" in first
    second = run([script, db, ledger])
    assert second[0] == "reconciled call-3: effect found, recording outcome"
    assert second[-1] == "DONE calls=6 events=6 pending=0"
    with open(ledger, encoding="utf-8") as f:
        ids = [json.loads(line)["call_id"] for line in f]
    assert ids == [f"call-{i}" for i in range(1, 7)]  # every side effect exactly once


def test_agent_loop_killed_before_effect_reruns_it(tmp_path: Path) -> None:
    """A kill right after the intent (before the side effect): the reconcile step runs it once."""
    db, ledger = str(tmp_path / "db"), str(tmp_path / "ledger.txt")
    script = str(EXAMPLES / "agent_loop.py")
    run_until([script, db, ledger], "PAUSED", {"AGENT_LOOP_PAUSE_AT": "call-2"})
    # simulate "killed before the effect": drop call-2's ledger line (the effect never happened)
    with open(ledger, encoding="utf-8") as f:
        kept = [line for line in f if json.loads(line)["call_id"] != "call-2"]
    with open(ledger, "w", encoding="utf-8") as f:
        f.writelines(kept)
    second = run([script, db, ledger])
    assert second[0] == "reconciled call-2: effect not found, running it"
    assert second[-1] == "DONE calls=6 events=6 pending=0"
    with open(ledger, encoding="utf-8") as f:
        ids = sorted(json.loads(line)["call_id"] for line in f)
    assert ids == [f"call-{i}" for i in range(1, 7)]
