"""Archive fault tests against a real S3 server (SeaweedFS): the server SIGKILLed and restarted
during commits at each level; the primary SIGKILLed and its directory deleted ("machine loss"),
then a restore checked against what the primary acknowledged.

Oracle (machine-loss column of the durability table): at `replicated` nothing acknowledged is
lost; at sync/interval/buffered nothing acknowledged more than `archive_rpo_ms` before the loss.
Always: the restored store is a gap-free prefix of the commits (I3).

Quick profile (CI): the server killed at `replicated` (commits wait) and at `sync` (commits go on;
interval and buffered take the same path past the local log), one machine loss per level.
AGENTWAL_LONG=1: the server killed at every level, twenty machine losses per level.
"""

# ruff: noqa: F811, PLR0917 -- fixtures imported by name (tests/archive_server.py); parametrized tests
from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from archive_server import BUCKET, WeedServer, s3_server  # noqa: F401 -- fixtures

import wal

LONG = os.environ.get("AGENTWAL_LONG", "") not in ("", "0")
HELPER = os.path.join(os.path.dirname(__file__), "store_helpers", "archive_writer.py")
LEVELS = [("replicated", 0), ("sync", 0), ("interval", 200), ("buffered", 200)]
ARCHIVE_RPO_MS = 500


def _url(name: str) -> str:
    return f"s3://{BUCKET}/{name}-{os.urandom(6).hex()}"


OUTAGE_LEVELS = LEVELS if LONG else [lv for lv in LEVELS if lv[0] in ("replicated", "sync")]


@pytest.mark.parametrize(("level", "rpo_ms"), OUTAGE_LEVELS)
def test_object_store_killed_and_restarted_during_commits(tmp_path, s3_server: WeedServer, monkeypatch,
                                                          caplog, level, rpo_ms):
    s3_server.use_env(monkeypatch)
    url = _url("outage")
    caplog.set_level(logging.INFO, logger="wal.archive")
    store = wal.open(tmp_path / "s", durability=level, rpo_ms=rpo_ms or None, archive=url,
                     archive_rpo_ms=60_000)
    acked: list[int] = []
    lsns: list[int] = []
    stop = threading.Event()

    def commit() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            lsns.append(store.put(f"k{i:06d}", str(i).encode()))
            acked.append(i)

    t = threading.Thread(target=commit)
    t.start()
    try:
        try:
            time.sleep(0.3)
            at_kill = len(caplog.records)
            s3_server.kill()
            before = len(acked)
            time.sleep(1.5)
            during = len(acked) - before
            if level == "replicated":
                assert during <= 1, "replicated commits were acknowledged while the object store was down"
            else:
                assert during > 0, f"commits at {level} were blocked by the archive being down"
            # The shipper notices at its next request, which a loaded machine may delay: wait for it.
            deadline = time.monotonic() + 30
            while store.stats()["archive_error"] is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert store.stats()["archive_error"] is not None
            at_restart = len(caplog.records)
            s3_server.start()
            time.sleep(0.5)
        finally:
            stop.set()
            if s3_server.proc is None:  # a failed assertion above: the tests after this one need it
                s3_server.start()
            t.join(60)
        assert not t.is_alive()
        last = lsns[-1]
        store._log.sync()  # buffered: the last commits may still be in the process buffer
        deadline = time.monotonic() + 60
        while store.stats()["archived_lsn"] < last:
            assert time.monotonic() < deadline, "the archive did not catch up after the server came back"
            time.sleep(0.05)
        # A server just restarted may still refuse a request or two (a 500 while it loads its
        # volumes) after the log caught up, e.g. a merge's GET: the error clears at the retry.
        while store.stats()["archive_error"] is not None:
            assert time.monotonic() < deadline, store.stats()["archive_error"]
            time.sleep(0.05)
    finally:
        store.close()  # else its shipper goes on logging into the next test's records

    def outage_lines(records: list[logging.LogRecord]) -> list[str]:
        """This archive's lines: "down" (an outage began), "up" (shipping resumed), or any other
        ERROR line itself (none is expected)."""
        lines = []
        for r in records:
            message = r.getMessage()
            if url not in message and str(tmp_path) not in message:
                continue  # another test's store
            if r.levelno == logging.ERROR:
                lines.append("down" if "unreachable" in message else message)
            elif "shipping resumed" in message:
                lines.append("up")
        return lines

    # One ERROR line for the outage the kill made, however many requests failed during it; and
    # every outage, this one or a blip of the server's before or after it (a loaded machine has
    # seen a new client's first requests refused), ended with a line saying shipping resumed.
    assert outage_lines(caplog.records[at_kill:at_restart]) == ["down"], "one ERROR line per outage"
    lines = outage_lines(caplog.records)
    assert lines and lines[-1] == "up" and all(a != b for a, b in itertools.pairwise(lines)), lines
    report = wal.restore(url, tmp_path / "r")
    assert report.lsn == last
    with wal.open(tmp_path / "r") as r:
        assert r.get(f"k{acked[-1]:06d}") == str(acked[-1]).encode()


def _machine_loss_round(tmp_path, s3_server: WeedServer, level: str, rpo_ms: int, rng: random.Random,
                        round_no: int) -> tuple[int, int]:
    store_dir = tmp_path / f"primary{round_no}"
    url = _url(f"loss-{level}")
    proc = subprocess.Popen([sys.executable, HELPER, str(store_dir), level, str(rpo_ms), url, str(ARCHIVE_RPO_MS)],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert proc.stdout is not None
    acks: list[tuple[int, int]] = []  # (i, ack time ns)
    assert proc.stdout.readline().strip() == "ready"
    run_for = rng.uniform(0.3, 1.5)
    reader_done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "ack":
                acks.append((int(parts[1]), int(parts[3])))
        reader_done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    time.sleep(run_for)
    killed_at = time.time_ns()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader_done.wait(10)
    shutil.rmtree(store_dir)  # the machine is gone: only the archive is left
    restored = tmp_path / f"restored{round_no}"
    wal.restore(url, restored)
    with wal.open(restored) as r:
        last_raw = r.get("last")
        last = int(last_raw) if last_raw is not None else 0
        # I3: a gap-free prefix.
        keys = [k for k, _ in r.scan(b"c/")]
        assert keys == [f"c/{i:08d}".encode() for i in range(1, last + 1)]
    lost = [(i, at) for i, at in acks if i > last]
    if level == "replicated":
        assert not lost, f"replicated: acknowledged commits {lost[:3]}... lost with the machine"
    else:
        too_old = [(i, at) for i, at in lost if at < killed_at - ARCHIVE_RPO_MS * 1_000_000]
        assert not too_old, (f"{level}: commits acknowledged more than {ARCHIVE_RPO_MS} ms before the loss "
                             f"were lost: {too_old[:3]}")
    return len(acks), len(lost)


@pytest.mark.parametrize(("level", "rpo_ms"), LEVELS)
def test_machine_loss_then_restore_keeps_each_levels_bound(tmp_path, s3_server: WeedServer, monkeypatch,
                                                           level, rpo_ms):
    s3_server.use_env(monkeypatch)
    rng = random.Random(f"{level}-{os.getpid()}")
    rounds = 20 if LONG else 1
    total = 0
    for n in range(rounds):
        acked, _ = _machine_loss_round(tmp_path, s3_server, level, rpo_ms, rng, n)
        total += acked
    assert total > 0


def test_a_snapshot_larger_than_the_request_timeout_allows_reaches_a_slow_object_store(
        tmp_path, s3_server: WeedServer, monkeypatch) -> None:
    """The S3 client's timeout covers a whole request, body included: a snapshot that takes
    longer than it to send was cut off and tried again, for ever (at the default 30 s, any
    snapshot over ~1 GB sent at less than ~33 MB/s). A large PUT is given time for its size.
    Scaled down here: a 1 s timeout, and a link of 2 MB/s that takes ~2 s for the snapshot."""
    from s3_proxy import SlowUploadProxy  # noqa: PLC0415

    from wal.archive import objects  # noqa: PLC0415

    monkeypatch.setattr(objects, "_OBSTORE_TIMEOUTS", {**objects._OBSTORE_TIMEOUTS, "timeout": dt.timedelta(seconds=1)})
    monkeypatch.setattr(objects, "_LARGE_PUT_BYTES", 1 << 20)
    s3_server.use_env(monkeypatch)
    with SlowUploadProxy(s3_server.endpoint, rate=2e6) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        url = _url("slow-link")
        values = {f"k{i}": os.urandom(100_000) for i in range(40)}  # 4 MB the snapshot holds, incompressible
        with wal.open(tmp_path / "s", archive=url, archive_snapshot_bytes=3_000_000) as store:
            for key, value in values.items():
                store.put(key, value)
            deadline = time.monotonic() + 60
            while not store.stats()["archive_last_snapshot_lsn"] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert store.stats()["archive_last_snapshot_lsn"] > 0, store.stats()["archive_error"]
        report = wal.restore(url, tmp_path / "r")
        assert report.snapshot_lsn > 0
    with wal.open(tmp_path / "r") as restored:
        assert dict(restored.scan()) == {k.encode(): v for k, v in values.items()}
