"""Observability: the `wal` logger's lines (recovery, torn tails, lost LSNs, checkpoints, fail-stop, slow
fsyncs) and the Prometheus rendering of `stats()`."""

from __future__ import annotations

import errno
import logging
import re
import time
from pathlib import Path

import pytest

import wal
from wal.drill.failpoints import failpoint
from wal.log import recovery
from wal.ops import metrics


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name.startswith("wal")]


def test_opening_a_log_logs_a_recovery_summary(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append_many([b"a", b"b", b"c"])
    caplog.set_level(logging.INFO, logger="wal")
    with wal.Log.open(tmp_path):
        pass
    info = messages(caplog, logging.INFO)
    assert any("1 segment(s), 3 record(s), last LSN 3" in m for m in info), info


def test_cutting_a_torn_tail_is_a_warning_naming_the_broken_file(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append(b"whole")
    (number, path), = recovery.list_segments(str(tmp_path))
    end = recovery.scan_segment_file(path, number).end_offset
    with open(path, "r+b") as f:
        f.seek(end)
        f.write(b"\x01\x02torn")
    caplog.set_level(logging.WARNING, logger="wal")
    with wal.Log.open(tmp_path):
        pass
    warnings = messages(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert f"offset {end} of {path}" in warnings[0] and f"{path}.{end:016x}.broken" in warnings[0]


def test_truncate_recovery_warns_with_the_lost_lsn_range(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with wal.Log.open(tmp_path, segment_bytes=4096) as log:
        for i in range(200):
            log.append(b"record %d" % i)
    segments = recovery.list_segments(str(tmp_path))
    assert len(segments) > 2
    with open(segments[1][1], "r+b") as f:  # a sealed segment in the middle
        f.seek(64 + 24)
        f.write(b"\xff")
    caplog.set_level(logging.WARNING, logger="wal")
    with wal.Log.open(tmp_path, recovery="truncate") as log:
        first, last = log.recovery_report.lost_lsns  # type: ignore[misc]
    warnings = messages(caplog, logging.WARNING)
    assert any(f"gave up LSNs {first}..{last}" in m for m in warnings), warnings


def test_store_logs_replay_and_checkpoints(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wal")
    with wal.open(tmp_path, segment_bytes=4096) as store:
        for i in range(100):
            store.put(f"k{i}", b"v" * 50)
        applied = store.checkpoint()
    info = messages(caplog, logging.INFO)
    assert any("replayed 0 record(s)" in m for m in info)
    assert any(f"checkpoint of {tmp_path} at applied LSN {applied}: " in m and "removed" in m for m in info), info


def test_a_slow_fsync_is_a_warning_with_its_latency(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="wal")
    with wal.open(tmp_path) as store:
        store.slow_fsync_ms = 0.0  # every fsync counts as slow: the first look must warn
        store.put("k", b"v")
        deadline = time.monotonic() + 10
        while not messages(caplog, logging.WARNING) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.stats()["slow_fsyncs"] >= 1
    warnings = messages(caplog, logging.WARNING)
    assert warnings and re.search(r"slow fdatasync in .*: \d+\.\d ms", warnings[0]), warnings


def test_fail_stop_is_logged_once_as_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="wal")
    store = wal.open(tmp_path)
    try:
        with failpoint("fsync", errno.EIO), pytest.raises(wal.FailedError):
            store.put("k", b"v")
        with pytest.raises(wal.FailedError):
            store.put("k2", b"v")
    finally:
        with pytest.raises(wal.WalError):
            store.close()
    errors = messages(caplog, logging.ERROR)
    assert len(errors) == 1 and "stopped after a failure" in errors[0]


# ---- Prometheus ----------------------------------------------------------------------------------------

_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? \S+$')


def test_prometheus_text_of_a_live_store(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        for i in range(10):
            store.put(f"k{i}", b"v")
        text = metrics.prometheus_text(store.stats(), labels={"store": str(tmp_path)})
    lines = text.splitlines()
    types = dict(line.split()[2:4] for line in lines if line.startswith("# TYPE"))
    assert types["agentwal_commits_total"] == "counter"
    assert types["agentwal_fsyncs_total"] == "counter"
    assert types["agentwal_durable_lsn"] == "gauge"
    for line in lines:
        if not line.startswith("#"):
            assert _LINE.match(line), line
            float(line.rsplit(" ", 1)[1])
    assert re.search(r'^agentwal_info\{.*durability="sync".*\} 1$', text, re.M)
    assert text.endswith("\n")


def test_prometheus_text_sanitizes_names_and_skips_what_is_not_a_number() -> None:
    text = metrics.prometheus_text({"weird name-1": 2, "9lives": 1.5, "flag": True, "nothing": None,
                                    "pair": (1, 2), "note": 'say "hi"\n'}, prefix="x_")
    assert "x_weird_name_1 2" in text
    assert "x_9lives 1.5" in text
    assert "x_flag 1" in text
    assert "nothing" not in text and "pair" not in text
    assert 'x_info{note="say \\"hi\\"\\n"} 1' in text
    assert metrics.metric_name("1abc") == "_1abc"
    assert metrics.prometheus_text({}) == ""
