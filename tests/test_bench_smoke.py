"""The benchmark runner works: benchmarks/compare.py, shrunk to seconds, writes its results.

No timing is asserted (speed is proven in benchmarks/, never by timed tests); this only
checks that a run produces results.json and results.md with the expected structure, and
that a missing peer is skipped with a note instead of failing the run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

COMPARE = Path(__file__).resolve().parents[1] / "benchmarks" / "compare.py"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object], str]:
    base = tmp_path_factory.mktemp("bench")
    out = base / "out"
    cmd = [sys.executable, str(COMPARE), "--quick", "--smoke", "--out", str(out), "--tmpdir", str(base / "tmp"),
           "--only", "a,b,c,d,e", "--systems", "agentwal,sqlite,leveldb,ref", "--_hide-peers", "leveldb"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, f"compare.py failed:\n{proc.stderr[-4000:]}"
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return out, data, (out / "results.md").read_text(encoding="utf-8")


def test_results_json_names_the_machine(smoke_run: tuple[Path, dict, str]) -> None:
    _, data, _ = smoke_run
    machine = data["machine"]
    for key in ("cpu_model", "cores", "kernel", "python", "filesystem", "versions"):
        assert key in machine, key
    assert machine["filesystem"]["type"]
    assert data["profile"]["name"] == "smoke"


def test_every_section_has_workloads_with_agentwal_figures(smoke_run: tuple[Path, dict, str]) -> None:
    _, data, _ = smoke_run
    assert set(data["sections"]) == {"a", "b", "c", "d", "e"}
    for key, section in data["sections"].items():
        assert section["workloads"], key
        for w in section["workloads"]:
            assert {"id", "title", "unit", "metric", "rows"} <= set(w), w.get("id")
            agentwal = [r for r in w["rows"] if r["role"] == "agentwal"]
            assert agentwal, f"{w['id']} has no agentwal row"
            for r in agentwal:
                assert "error" not in r, f"{w['id']}: {r['label']}: {r['error']}"
                assert r[w["metric"]] > 0


def test_ratios_to_the_best_peer_and_the_reference(smoke_run: tuple[Path, dict, str]) -> None:
    _, data, _ = smoke_run
    w = next(w for w in data["sections"]["a"]["workloads"] if w["id"] == "a.sync.128B.t1")
    roles = {r["role"] for r in w["rows"]}
    assert {"agentwal", "peer", "ref"} <= roles
    if "sqlite" in data["skipped"]:
        pytest.skip("sqlite3 is not importable here")
    assert w["best_peer"].startswith("SQLite")
    for r in w["rows"]:
        assert r["x_best_peer"] is not None
        assert r["x_reference"] is not None
    ref = next(r for r in w["rows"] if r["role"] == "ref")
    assert ref["x_reference"] == pytest.approx(1.0)


def test_a_missing_peer_is_skipped_with_a_note(smoke_run: tuple[Path, dict, str]) -> None:
    _, data, md = smoke_run
    assert "leveldb" in data["skipped"]
    assert all(r["system"] != "leveldb" for s in data["sections"].values() for w in s["workloads"]
               for r in w["rows"])
    assert "Skipped peers" in md


def test_targets_are_listed_with_a_status(smoke_run: tuple[Path, dict, str]) -> None:
    _, data, md = smoke_run
    assert data["targets"]
    for t in data["targets"]:
        assert t["status"] in ("MET", "NOT MET", "n/a"), t
    assert any(t["status"] != "n/a" for t in data["targets"])
    assert "## Targets of BRIEF §7" in md


def test_markdown_has_a_table_per_workload(smoke_run: tuple[Path, dict, str]) -> None:
    _, data, md = smoke_run
    for section in data["sections"].values():
        for w in section["workloads"]:
            assert f"### {w['title']}" in md
    assert "| **agentwal Store.put (sync)** |" in md


def test_plots_are_written_when_matplotlib_is_there(smoke_run: tuple[Path, dict, str]) -> None:
    out, data, _ = smoke_run
    pytest.importorskip("matplotlib")
    assert data["plots"]
    for name in data["plots"]:
        assert (out / name).stat().st_size > 0


def test_the_store_reopen_is_held_to_a_raw_read_of_its_own_files(smoke_run: tuple[Path, dict, str]) -> None:
    """The 'bound by the disk' check of the store's reopen divides by the raw reads made beside
    each of its runs (the `ref-store` row), not by the section's read of another log."""
    _, data, _ = smoke_run
    rec = [w for w in data["sections"]["c"]["workloads"] if w["id"].startswith("c.recovery.")]
    assert rec
    for w in rec:
        pair = next(r for r in w["rows"] if r["system"] == "ref-store")
        assert pair["role"] == "ref-alt" and "error" not in pair
        assert pair["bytes"] == next(r for r in w["rows"] if r["system"] == "agentwal-store@replay")["bytes"]
    check = next(t for t in data["targets"] if t["what"].startswith("Store reopen replaying the log into LMDB"))
    replay, raw = (next(r for r in rec[-1]["rows"] if r["system"] == s)["mb_per_s"]
                   for s in ("agentwal-store@replay", "ref-store"))
    assert check["ratio"] == pytest.approx(replay / raw)


def _targets_for(data: dict, recovery_mb: int) -> list[dict]:
    """compare.py's checks over the smoke run's figures, as if its recovery log had been
    `recovery_mb` MB (the workload ids carry the size)."""
    spec = importlib.util.spec_from_file_location("agentwal_compare", COMPARE)
    assert spec is not None and spec.loader is not None
    compare = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = compare  # dataclasses look their module up there while it loads
    try:
        spec.loader.exec_module(compare)
    finally:
        del sys.modules[spec.name]
    runner = object.__new__(compare.Runner)
    runner.p = dataclasses.replace(compare.PROFILES["smoke"], recovery_mb=(recovery_mb,))
    runner.sections = json.loads(json.dumps(data["sections"]).replace(
        '"c.recovery.1MB"', f'"c.recovery.{recovery_mb}MB"'))
    return runner.targets()  # type: ignore[no-any-return]


def test_recovery_rates_of_a_small_log_are_reported_not_judged(smoke_run: tuple[Path, dict, str]) -> None:
    """Under 100 MB a reopen's fixed costs set the MB/s: --quick (20 MB) and the smoke run show
    the figures with status n/a and the reason; a 1 GB log's are judged, MET or NOT MET."""
    _, data, md = smoke_run
    recovery_rates = ("recovery >= 1 GB/s", "recovery bound by the disk")
    small = [t for t in data["targets"] if t["target"].startswith(recovery_rates)]
    assert len(small) == 7
    for t in small:
        assert t["status"] == "n/a" and t["ratio"] is not None and "too small" in t["detail"], t
    assert "not judged" in md
    judged = [t for t in _targets_for(data, 1000) if t["target"].startswith(recovery_rates)]
    assert len(judged) == 7
    for t in judged:
        assert t["status"] in ("MET", "NOT MET") and "too small" not in t["detail"], t
        met = t["ratio"] >= t["threshold"]
        assert t["status"] == ("MET" if met else "NOT MET")
    assert [t["ratio"] for t in judged] == pytest.approx([t["ratio"] for t in small])


def test_the_read_modify_write_benchmark_runs_and_checks_its_counters(tmp_path: Path) -> None:
    """benchmarks/rmw.py, tiny: every system's counter ends at the increments it counted (each
    row asserts it), and the table names every system with a rate and its conflicts per success."""
    rmw = COMPARE.parent / "rmw.py"
    proc = subprocess.run([sys.executable, str(rmw), "--seconds", "0.2", "--threads", "2", "--tasks", "20",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["system"] for r in rows} == {"agentwal-update", "agentwal-loop", "lmdb", "sqlite", "agentwal-aupdate"}
    assert all(r["increments"] > 0 for r in rows)
    assert "conflicts per success" in (tmp_path / "results.md").read_text()
