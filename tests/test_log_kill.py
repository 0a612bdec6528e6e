"""Kill tests: a real child process appends and is SIGKILLed at random moments, again and again.

The child (tests/helpers/kill_child.py) prints every acknowledged LSN and its
payload the moment its append returns. After each kill the parent reopens the
log (recovering whatever the kill left) and checks the oracle:

* I2: every LSN the child ever acknowledged is there with the payload it sent;
* I3: the LSNs in the log are exactly 1..last, without a gap;
* nothing that was never sent: every payload decodes to (round, thread, k) and
  equals the payload the child derived from those.

At ``sync`` and at ``interval`` a process kill loses nothing (README, "Durability levels"). The
kill moments come from a seeded random generator, so a failure is replayable.
Quick profile: 14 kills per variant; AGENTWAL_LONG=1: 300.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import wal

HELPERS = Path(__file__).resolve().parent / "helpers"
sys.path.insert(0, str(HELPERS))
from kill_child import make_payload, parse_payload  # noqa: E402

LONG = os.environ.get("AGENTWAL_LONG", "") not in ("", "0")  # as the other crash tests read it
KILLS = 300 if LONG else 14
SEGMENT_BYTES = 64 << 10  # small: kills land during segment rolls too


def read_acks(path: Path) -> dict[int, bytes]:
    """LSN -> payload of every complete line the child printed (a line cut by the kill is ignored)."""
    acks: dict[int, bytes] = {}
    text = path.read_bytes()
    for line in text.split(b"\n")[:-1]:  # the part after the last newline is incomplete
        if line == b"ready":
            continue
        lsn, hexed = line.split(b" ")
        acks[int(lsn)] = bytes.fromhex(hexed.decode())
    return acks


def wait_ready(out: Path, child: subprocess.Popen[bytes]) -> None:
    """Until the child has opened the log (it prints "ready" first); not a timing assertion."""
    deadline = time.monotonic() + 60
    while not out.read_bytes().startswith(b"ready\n"):
        assert child.poll() is None, f"the child died on its own: {child.communicate()[1].decode()[-2000:]}"
        assert time.monotonic() < deadline, "the child did not open the log within 60 s"
        time.sleep(0.002)


def check_log(d: Path, acknowledged: dict[int, bytes]) -> int:
    """The oracle; returns the last LSN in the log.

    Segments before `first` were removed on purpose by `trim` (and their LSNs dropped from
    `acknowledged`); everything from there on must be present.
    """
    with wal.Log.open(d, segment_bytes=SEGMENT_BYTES) as log:
        first = log.first_lsn
        records = list(log.read(from_lsn=first))
    lsns = [lsn for lsn, _ in records]
    assert lsns == list(range(first, first + len(lsns))), "I3: the log is not gap-free"
    got = dict(records)
    for lsn, p in records:
        ids = parse_payload(p)
        assert ids is not None, f"LSN {lsn} holds a payload that was never sent: {p[:40]!r}"
        assert p == make_payload(*ids), f"LSN {lsn} holds a damaged payload {p[:40]!r}"
    lost = [lsn for lsn in acknowledged if got.get(lsn) != acknowledged[lsn]]
    assert not lost, f"I2: acknowledged LSNs lost or changed: {lost[:10]} (log ends at {lsns[-1:]})"
    return first + len(lsns) - 1


def trim(d: Path, acknowledged: dict[int, bytes], keep_bytes: int = 32 << 20) -> None:
    """Remove old segments once the log passes keep_bytes, so long runs stay small on disk."""
    if sum(p.stat().st_size for p in d.glob("*.wal")) < keep_bytes:
        return
    with wal.Log.open(d, segment_bytes=SEGMENT_BYTES) as log:
        log.remove_segments_before(log.watermarks.appended - 1000)
        first = log.first_lsn
    for lsn in [lsn for lsn in acknowledged if lsn < first]:
        del acknowledged[lsn]


@pytest.mark.parametrize(
    ("durability", "threads"),
    [("sync", 1), ("sync", 8), ("interval", 1), ("interval", 8)],
    ids=["sync-1-thread", "sync-8-threads", "interval-1-thread", "interval-8-threads"],
)
def test_sigkill_at_random_moments_never_loses_an_acknowledged_record(
    tmp_path: Path, durability: str, threads: int
) -> None:
    d = tmp_path / "log"
    rng = random.Random(f"kill-{durability}-{threads}")
    acknowledged: dict[int, bytes] = {}
    rounds_with_acks = 0
    total_acked = 0
    last = 0
    for round_no in range(KILLS):
        out = tmp_path / f"acks-{round_no}.txt"
        with open(out, "wb") as f:
            child = subprocess.Popen(
                [sys.executable, str(HELPERS / "kill_child.py"), str(d), str(round_no), durability,
                 str(threads), str(SEGMENT_BYTES)],
                stdout=f, stderr=subprocess.PIPE,
            )
        # Mostly while the child is appending; sometimes during its start-up and recovery.
        if rng.random() < 0.15:
            time.sleep(rng.uniform(0.0, 0.1))
        else:
            wait_ready(out, child)
            time.sleep(rng.uniform(0.0, 0.25))
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")[-2000:]
        acks = read_acks(out)
        out.unlink()
        for lsn, p in acks.items():
            assert lsn not in acknowledged, f"LSN {lsn} acknowledged twice"
            assert lsn > last, f"LSN {lsn} acknowledged again after the log had reached {last}"
            acknowledged[lsn] = p
        rounds_with_acks += bool(acks)
        last = check_log(d, acknowledged)
        assert last >= max(acknowledged, default=0)
        total_acked += len(acks)
        trim(d, acknowledged)
    # the test really killed a child in the middle of appending, most of the time
    assert rounds_with_acks >= KILLS // 2, rounds_with_acks
    assert total_acked > KILLS
