"""benchmarks/integrations.py works: run tiny (5 steps, one round), it writes its results.

No timing is asserted (speed is proven in benchmarks/, never by timed tests); this checks
that every saver and session ran the real graph / conversation, that the goals are judged,
and that PostgresSaver is either measured or skipped with a note.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("agents")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "integrations.py"


def test_integrations_benchmark_runs_tiny(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--steps", "5", "--rounds", "1", "--out", str(out), "--tmpdir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    graph = {r["system"]: r for r in data["graph"]}
    assert {"InMemorySaver", "AgentwalSaver sync", "AgentwalSaver interval"} <= set(graph)
    for row in graph.values():
        assert row["steps"] == 5 and row["steps_per_s"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
        assert 0 < row["saver_share"] <= 1.0
        assert row["get_tuple_us"] > 0  # the read a step starts with, timed beside the peers'
    assert graph["AgentwalSaver sync"]["disk"] > 0 and graph["AgentwalSaver sync"]["log_written"] > 0
    if "PostgresSaver" not in graph:
        assert any(n.startswith("PostgresSaver") for n in data["notes"]), data["notes"]
    if "SqliteSaver FULL" in graph:
        assert data["goals"][0]["status"] in ("MET", "NOT MET")
    sessions = {r["system"] for r in data["sessions"]}
    assert sessions >= {"AgentwalSession sync", "AgentwalSession interval"}
    assert all(r["get_items_us"] > 0 for r in data["sessions"])
    assert "put" in data["profile_top"]  # the saver's calls were profiled
    md = (out / "results.md").read_text(encoding="utf-8")
    assert "| **AgentwalSaver sync** |" in md and "## Goals" in md and "## Reads side by side" in md
    assert not list(tmp_path.glob("agentwal-integrations-*"))  # its temp directory is removed
