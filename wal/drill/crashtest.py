"""The crash drill: kill a real committing process, cut its power, and check what survived.

This is the engine behind ``agentwal crashtest`` and the kill / power-cut tests
(tests/test_crash_kill.py, tests/test_crash_powercut.py). It has three parts.

The child workload (``python -m wal.drill.crashtest --child STORE ...``)
-----------------------------------------------------------------
Opens the store with ``wal.open`` at the given level and commits from 1 or N threads until it
is killed. Thread ``t`` commits transactions ``n = 1, 2, ...``; the content of transaction
``(round, t, n)`` is a pure function of the drill's seed (`txn_ops`): a *ledger* key
``L/tt/nnnnnnnn`` (its value names the round, thread and number) plus 0-2 puts or deletes of
keys from a small shared pool ``S/nnn`` that all threads overwrite -- so 1-3 keys per
transaction, and every key a transaction writes carries its LSN as version. It prints, with
one ``write(2)`` per line to its stdout (a file, so nothing ever blocks on a pipe)::

    OPEN  t_ns                       right before wal.open (recovery starts)
    READY t_ns last_lsn              wal.open returned
    ACK   lsn t_ns key [key ...]     a commit returned (was acknowledged); t_ns read right after

``t_ns`` is CLOCK_MONOTONIC (``time.monotonic_ns``), which the parent reads too.

The parent loop (`run_kills`, `run_power_cuts`)
-----------------------------------------------
Round after round, a child is started on the *crashed, unrecovered* store the previous round
left, so every child's ``wal.open`` is a real recovery; the parent SIGKILLs it at a seeded
random moment: during that recovery (timed from the child's ``OPEN`` line and the previous
round's recovery time), within its first commits, or later. For power cuts the child runs
under the crash-simulation shim (`wal.drill.crashsim.env_for`) and, once it is dead,
`wal.drill.crashsim.apply_power_cut` (random mode and seed) rewinds the files to what a disk could
hold after a power cut at the kill moment. The parent then copies the store aside, recovers
the copy (that open is the measured recovery time) and hands the result to the oracle. The
original stays crashed for the next child to recover.

The oracle (`Oracle.check`)
---------------------------
It knows the state the previous round was verified to have (`model`, and its last LSN
`base`) and what this round's child acknowledged. From the state alone it finds the commits
of this round that survived: the ledger keys whose version is above `base`. Then:

* **I3 prefix**: their LSNs are exactly ``base+1 .. base+m`` (no hole), each thread's are
  its transactions ``1..k`` in order, the log ends at ``base+m``, and the whole state --
  every key, value and version -- equals `model` with those commits applied in LSN order (no
  partial transaction, no reordering, nothing else changed).
* **I2 acknowledged means durable**: every acknowledged commit with LSN ``<= base+m`` is in
  the state at the LSN it was acknowledged with; the acknowledged ones above are *lost*.
  A lost commit is a violation at ``sync`` (any crash) and at ``interval`` for a process
  kill. Otherwise (``interval`` power cut, ``buffered``) the loss is a suffix (it follows
  from I3) and its window -- kill time minus the ack time of the oldest lost commit -- must
  be ``<= rpo_ms + SLACK_MS``. The worst window is reported.
* **I4 idempotent recovery**: a child killed before ``READY`` was killed during its
  recovery (or before it), and wrote nothing; recovering what it left must give exactly the
  state the previous round's clean recovery gave: the digests of ``scan()`` with versions
  before and after must be equal.

Clocks and the slack. The kill time is read right before ``kill(2)``; an ack time right
after the commit returned. Both err towards a *smaller* window than the true one (the
signal lands a little after the reading; the engine acknowledged a little before it -- by
microseconds, or up to the GIL switch interval, 5 ms, with many threads). `SLACK_MS`
(2 ms) is the allowance for the two processes reading one clock around those events.

The exhaustive mode (`run_exhaustive`)
--------------------------------------
A short scripted workload -- 20 commits with a checkpoint in the middle, tiny segments so
it rolls and removes segments, small sleeps so the RPO flusher runs -- runs once under the
shim, noting every ack and a clock tick every 2 ms in the journal (`wal.drill.crashsim.note`).
Then, for every fsync/fdatasync/directory fsync the journal holds -- cut just before it
returned (what it was syncing may or may not be on disk) and just after -- and for the end
of the journal, and for every power-cut mode, a copy is cut there (``apply_power_cut(at=...)``)
and checked by the oracle with the acks noted before the cut; the cut's time is the last note
before it. At the end of the journal the child had closed the store, so nothing acknowledged
may be missing at any level. ``at="all"`` cuts before every journal record instead.

`storage_stack` reports what is under a directory (filesystem, device, write cache,
measured fdatasync latency) and warns where the declared guarantee cannot be trusted;
`main_crashtest` is the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import wal
from wal._mounts import MEMORY_FS, NETWORK_FS, OVERLAY_FS, mount_of, mounts
from wal.drill import crashsim
from wal.log import durability as dur

__all__ = [
    "MODES",
    "SLACK_MS",
    "Ack",
    "CheckOutcome",
    "LevelResult",
    "Oracle",
    "StorageStack",
    "main",
    "main_crashtest",
    "run_exhaustive",
    "run_kills",
    "run_level",
    "run_power_cuts",
    "storage_stack",
    "txn_ops",
]

Mode = Literal["drop", "prefix", "garble", "random"]
MODES: tuple[Mode, ...] = ("drop", "prefix", "garble", "random")
SLACK_MS = 2.0
# At interval and buffered, the share of power cuts in mode "drop" (the rest: a mode of MODES at
# random). Only "drop" loses everything not synced, so only its loss windows reach the whole
# span since the last fdatasync, which the RPO bound is about; the other modes keep a random part
# of it. Drawn uniformly from MODES, a drill's 20 cuts gave about 2-3 drop cuts late enough in
# their run to test the bound, and a store whose flusher ran at 2.5 times its rpo_ms passed
# about half the drills.
RPO_DROP_SHARE = 0.5
SILENT_AFTER_MS = 1000.0  # children committing this long in all without one acknowledgement fail
POOL = 16  # shared keys S/000 .. S/015
MAX_VIOLATIONS = 50  # kept per level (all are counted)

# The child's store options: small segments and checkpoints, so rolls, checkpoints and the
# removal of segments all happen within a fraction of a second of commits.
CHILD_SEGMENT_BYTES = 256 << 10
CHILD_CHECKPOINT_BYTES = 1 << 20
SCRIPT_COMMITS = 20
SCRIPT_SEGMENT_BYTES = 4096
SCRIPT_PAD = 500  # bytes added to the scripted commits: 20 of them fill about 3 segments


# ---- the deterministic workload -------------------------------------------------------------------


def ledger_key(tid: int, n: int) -> bytes:
    return b"L/%02d/%08d" % (tid, n)


def txn_ops(seed: int, round_no: int, tid: int, n: int, pad: int = 0) -> list[tuple[bytes, bytes | None]]:
    """The operations of transaction n of thread tid in a round: (key, value), value None = delete.

    The first is always the put of the transaction's ledger key (`pad` more bytes in its value);
    0-2 operations on shared keys follow (distinct keys), so a transaction writes 1-3 keys.
    Values name the transaction.
    """
    h = hashlib.blake2b(b"%d/%d/%d/%d" % (seed, round_no, tid, n), digest_size=16).digest()
    tag = b"%d:%d:%d" % (round_no, tid, n)
    # now and then a big one (segments roll sooner), and more rarely one just over an LMDB page,
    # which the state stores split (FORMAT.md §16): crashes find those too
    size = pad + (4100 if h[9] % 32 == 0 else 1500 if h[9] % 16 == 0 else h[1] % 96)
    ops: list[tuple[bytes, bytes | None]] = [(ledger_key(tid, n), tag + b"|" + bytes([97 + h[0] % 26]) * size)]
    used: set[int] = set()
    for j in range(h[2] % 3):
        slot = h[3 + j] % POOL
        if slot in used:
            continue
        used.add(slot)
        key = b"S/%03d" % slot
        if h[6 + j] % 5 == 0:
            ops.append((key, None))
        else:
            ops.append((key, tag + b":%d|" % j + bytes([65 + h[10 + j] % 26]) * (h[12 + j] % 48)))
    return ops



# Children of one power-cut round killed before the simulator loaded in them, drawn again before
# the drill gives up on the simulator (each such draw is a kill within the ~ms of an exec).
_UNSTARTED_REDRAWS = 20


def _journaled(journal: str) -> bool:
    """Whether the power-cut simulator wrote anything to `journal` (its START record first)."""
    return os.path.exists(journal) and os.path.getsize(journal) > 0


class SimulatorInactiveError(RuntimeError):
    """The power-cut simulator journaled nothing in a child it was to run in: a drill of power
    cuts would have rewound nothing and passed, proving nothing. `agentwal crashtest` stops
    with exit status 2 and says why."""


def commit_ops(store: wal.Store, ops: list[tuple[bytes, bytes | None]]) -> int:
    """Commit `ops` (txn_ops' shape) as one transaction; returns its LSN. A single op (a third of
    them) through `Store.put`, the C commit path most callers take, the others through
    `Store.transaction()`: a drill of one path alone proved nothing of the other."""
    if len(ops) == 1:
        key, value = ops[0]
        return int(store.put(key, value) if value is not None else store.delete(key))
    with store.transaction() as tx:
        for key, value in ops:
            if value is None:
                tx.delete(key)
            else:
                tx.put(key, value)
    assert tx.lsn is not None
    return tx.lsn

def _parse_ledger_value(value: bytes) -> tuple[int, int, int] | None:
    tag, _, _ = value.partition(b"|")
    parts = tag.split(b":")
    if len(parts) != 3:
        return None
    try:
        r, t, n = (int(p) for p in parts)
    except ValueError:
        return None
    return r, t, n


# ---- the child ----------------------------------------------------------------------------------


def _emit(text: str) -> None:
    """One line, one write(2): whole lines even from many threads, and nothing left in a buffer."""
    data = (text + "\n").encode()
    while data:
        n = os.write(1, data)
        data = data[n:]


def seal_options() -> dict[str, Any]:
    """The drill on a sealed store (wal/crypto/): ``AGENTWAL_CRASHTEST_KEY`` (64 hex digits, the
    encryption key) and ``AGENTWAL_CRASHTEST_COMPRESSION`` ("zstd"), read by the parent's
    recovery and, through the environment, by every child. Unset: a plain store."""
    out: dict[str, Any] = {}
    key = os.environ.get("AGENTWAL_CRASHTEST_KEY")
    if key:
        out["encryption"] = bytes.fromhex(key)
    compression = os.environ.get("AGENTWAL_CRASHTEST_COMPRESSION")
    if compression:
        out["compression"] = compression
        out["compression_threshold"] = 16  # the drill's values are small: compress them anyway
    return out


def _child_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m wal.drill.crashtest --child")
    p.add_argument("store")
    p.add_argument("--level", default="sync")
    p.add_argument("--rpo-ms", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--round", type=int, default=1)
    p.add_argument("--apply-interval-ms", type=int, default=20)
    p.add_argument("--script", action="store_true", help="the short scripted workload of the exhaustive mode")
    p.add_argument("--archive", default=None, help="an archive URL (the machine-loss drill)")
    p.add_argument("--archive-rpo-ms", type=int, default=1000)
    args = p.parse_args(argv)
    if args.script:
        return _script_main(args)

    _emit(f"OPEN {time.monotonic_ns()}")
    archive: dict[str, Any] = {}
    if args.archive:
        archive = {"archive": args.archive, "archive_rpo_ms": args.archive_rpo_ms}
    store = wal.open(args.store, durability=args.level, rpo_ms=args.rpo_ms or None,
                     segment_bytes=CHILD_SEGMENT_BYTES, checkpoint_bytes=CHILD_CHECKPOINT_BYTES,
                     apply_interval_ms=args.apply_interval_ms, **archive, **seal_options())
    _emit(f"READY {time.monotonic_ns()} {store.watermarks.written}")

    def worker(tid: int) -> None:
        try:
            n = 0
            while True:
                n += 1
                ops = txn_ops(args.seed, args.round, tid, n)
                lsn = commit_ops(store, ops)
                t = time.monotonic_ns()
                _emit(f"ACK {lsn} {t} " + " ".join(k.decode() for k, _ in ops))
        except BaseException as exc:  # the parent reports it; never a silent stop
            _emit(f"ERROR {tid} {type(exc).__name__}: {exc}")
            os._exit(3)

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(args.threads)]
    for th in threads:
        th.start()
    while True:  # until SIGKILL
        time.sleep(3600)


def _script_main(args: argparse.Namespace) -> int:
    """20 commits, a checkpoint after the 10th, then close: run once under the shim."""
    stop = threading.Event()

    def ticker() -> None:
        while not stop.wait(0.002):
            crashsim.note(f"t {time.monotonic_ns()}")

    crashsim.note(f"t {time.monotonic_ns()}")
    tick = threading.Thread(target=ticker, daemon=True)
    tick.start()
    store = wal.open(args.store, durability=args.level, rpo_ms=args.rpo_ms or None,
                     segment_bytes=SCRIPT_SEGMENT_BYTES, checkpoint_bytes=1 << 16, apply_interval_ms=5,
                     **seal_options())
    _emit(f"READY {time.monotonic_ns()} {store.watermarks.written}")
    for n in range(1, SCRIPT_COMMITS + 1):
        ops = txn_ops(args.seed, args.round, 0, n, SCRIPT_PAD)
        lsn = commit_ops(store, ops)
        t = time.monotonic_ns()
        crashsim.note(f"ack {lsn} {t} " + " ".join(k.decode() for k, _ in ops))
        _emit(f"ACK {lsn} {t} " + " ".join(k.decode() for k, _ in ops))
        if n == SCRIPT_COMMITS // 2:
            store.checkpoint()
        time.sleep(0.004)
    store.close()
    crashsim.note(f"t {time.monotonic_ns()}")
    stop.set()
    tick.join()
    _emit("DONE")
    return 0


# ---- what the child printed ---------------------------------------------------------------------


@dataclass(frozen=True)
class Ack:
    lsn: int
    t_ns: int
    tid: int
    n: int
    keys: tuple[bytes, ...]


@dataclass
class ChildOutput:
    open_ns: int | None = None
    ready_ns: int | None = None
    ready_lsn: int | None = None
    acks: list[Ack] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: bool = False


_LEDGER_RE = re.compile(rb"L/(\d+)/(\d+)\Z")


def _parse_ack(words: list[str]) -> Ack | None:
    if len(words) < 4:
        return None
    keys = tuple(w.encode() for w in words[3:])
    m = _LEDGER_RE.match(keys[0])
    if m is None:
        return None
    return Ack(int(words[1]), int(words[2]), int(m.group(1)), int(m.group(2)), keys)


def parse_child_output(text: str) -> ChildOutput:
    out = ChildOutput()
    lines = text.split("\n")
    for line in lines[:-1]:  # the last piece has no newline: cut short by the kill, or empty
        words = line.split()
        if not words:
            continue
        if words[0] == "OPEN" and len(words) >= 2:
            out.open_ns = int(words[1])
        elif words[0] == "READY" and len(words) >= 3:
            out.ready_ns, out.ready_lsn = int(words[1]), int(words[2])
        elif words[0] == "ACK":
            ack = _parse_ack(words)
            if ack is None:
                out.errors.append(f"unparsable line from the child: {line!r}")
            else:
                out.acks.append(ack)
        elif words[0] == "ERROR":
            out.errors.append(line)
        elif words[0] == "DONE":
            out.done = True
    return out


# ---- the oracle ---------------------------------------------------------------------------------

State = dict[bytes, tuple[int, bytes]]  # key -> (version, value)


def digest(state: State, last_lsn: int) -> str:
    """A digest of a store's whole content: every key, version and value, and the log's last LSN."""
    h = hashlib.sha256(b"last %d\n" % last_lsn)
    for key in sorted(state):
        version, value = state[key]
        h.update(b"%d %d %d " % (len(key), version, len(value)) + key + value)
    return h.hexdigest()


@dataclass
class Recovered:
    """A store opened (recovered) by the parent and read whole."""

    state: State
    last_lsn: int
    seconds: float
    torn_tail: object
    error: str | None = None


def recover(path: str | os.PathLike[str]) -> Recovered:
    """Open the store at path (strict recovery), read everything with versions, close it."""
    # The drill cuts torn tails by the hundred: it counts them instead of logging a WARNING for each.
    wal_logger = logging.getLogger("wal")
    level = wal_logger.level
    wal_logger.setLevel(logging.ERROR)
    started = time.monotonic()
    try:
        store = wal.open(path, **seal_options())
    except Exception as exc:
        return Recovered({}, 0, time.monotonic() - started, None, f"{type(exc).__name__}: {exc}")
    finally:
        wal_logger.setLevel(level)
    seconds = time.monotonic() - started
    try:
        state: State = {}
        for key, value in store.scan():
            version = store.version(key)
            state[key] = (version if version is not None else -1, value)
        last = store.watermarks.written
        torn = store.stats().get("torn_tail")
    finally:
        store.close()
    return Recovered(state, last, seconds, torn)


@dataclass
class CheckOutcome:
    violations: list[str]
    committed: int  # commits of this round in the state
    acknowledged: int
    lost: int  # acknowledged, not in the state
    loss_ms: float  # kill time - ack time of the oldest lost commit (0 when none lost)
    in_recovery: bool  # the child never reported READY


class Oracle:
    """Checks I2, I3, I4 and the loss window round after round (see the module docstring)."""

    def __init__(self, level: str, rpo_ms: int, seed: int, *, pad: int = 0) -> None:
        self.level = level
        self.rpo_ms = rpo_ms
        self.seed = seed
        self.pad = pad
        self.model: State = {}
        self.base = 0

    def check(self, got: Recovered, round_no: int, child: ChildOutput, kill_ns: int,
              crash: Literal["kill", "power", "machine"], *, where: str = "") -> CheckOutcome:
        """`crash` "machine": the store was restored from its archive after the machine was lost
        (wal/drill/machineloss.py); `rpo_ms` is then the archive's bound, and only `replicated`
        promises that nothing acknowledged is lost."""
        tag = f"[{where}] " if where else ""
        v: list[str] = []
        acks = child.acks
        in_recovery = child.ready_ns is None
        if got.error is not None:
            v.append(f"{tag}recovery failed: {got.error}")
            return CheckOutcome(v, 0, len(acks), 0, 0.0, in_recovery)
        base, model, state = self.base, self.model, got.state

        # I4: killed during (or before) its recovery, the child committed nothing; recovering
        # what it left must give what the clean recovery of the same crash gave.
        if in_recovery and digest(state, got.last_lsn) != digest(model, base):
            v.append(f"{tag}I4: after a kill during recovery, recovery again gives another state than the clean "
                     f"recovery (last LSN {got.last_lsn} vs {base}; {_diff(model, state)})")

        # This round's commits in the state: ledger keys above base.
        present: dict[tuple[int, int], int] = {}
        for key, (version, value) in state.items():
            if not key.startswith(b"L/") or version <= base:
                continue
            m = _LEDGER_RE.match(key)
            parsed = _parse_ledger_value(value)
            if m is None or parsed is None or parsed[0] != round_no or parsed[1:] != (int(m.group(1)),
                                                                                      int(m.group(2))):
                v.append(f"{tag}I3: key {key!r} at version {version} holds {value[:40]!r}, "
                         f"not a commit of round {round_no}")
                continue
            present[(parsed[1], parsed[2])] = version
        by_lsn = sorted(present.items(), key=lambda kv: kv[1])
        lsns = [lsn for _, lsn in by_lsn]
        m_count = len(lsns)
        top = base + m_count
        if lsns != list(range(base + 1, top + 1)):
            missing = sorted(set(range(base + 1, max(lsns, default=base) + 1)) - set(lsns))
            dup = len(lsns) - len(set(lsns))
            v.append(f"{tag}I3: the surviving commits are not a gap-free prefix: LSNs {base + 1}..{max(lsns)} "
                     f"miss {missing[:10]}{'...' if len(missing) > 10 else ''}"
                     + (f", {dup} LSNs carried by two commits" if dup else ""))
        if got.last_lsn != top and not v:
            v.append(f"{tag}I3: the log ends at LSN {got.last_lsn} but the state holds commits up to LSN {top} "
                     f"(previous round ended at {base})")
        threads: dict[int, list[tuple[int, int]]] = {}
        for (tid, n), lsn in present.items():
            threads.setdefault(tid, []).append((n, lsn))
        for tid, items in sorted(threads.items()):
            items.sort()
            ns = [n for n, _ in items]
            if ns != list(range(1, len(ns) + 1)):
                v.append(f"{tag}I3: thread {tid}'s surviving transactions are {ns[:5]}..., not 1..{len(ns)}")
            elif any(a[1] >= b[1] for a, b in itertools.pairwise(items)):
                v.append(f"{tag}I3: thread {tid}'s transactions are out of LSN order")

        # The whole state must be the model with exactly those commits applied in LSN order.
        expected = dict(model)
        for (tid, n), lsn in by_lsn:
            for op_key, op_value in txn_ops(self.seed, round_no, tid, n, self.pad):
                if op_value is None:
                    expected.pop(op_key, None)
                else:
                    expected[op_key] = (lsn, op_value)
        if state != expected:
            v.append(f"{tag}I3: the state is not the previous state plus a prefix of the commits "
                     f"(partial or reordered transaction, or foreign data): {_diff(expected, state)}")

        # I2: acknowledged commits.
        lost = []
        for a in acks:
            want = [k for k, _ in txn_ops(self.seed, round_no, a.tid, a.n, self.pad)]
            if list(a.keys) != want:
                v.append(f"{tag}child bug: ack of LSN {a.lsn} lists keys {a.keys} instead of {want}")
            if a.lsn <= base:
                v.append(f"{tag}I2: commit ({a.tid}, {a.n}) was acknowledged as LSN {a.lsn}, which the previous "
                         f"round already held (it ended at {base})")
            elif a.lsn <= top:
                if present.get((a.tid, a.n)) != a.lsn:
                    v.append(f"{tag}I2: commit ({a.tid}, {a.n}) was acknowledged as LSN {a.lsn} but the state has "
                             f"{present.get((a.tid, a.n), 'no such commit')}")
            else:
                lost.append(a)
        loss_ms = 0.0
        if lost:
            oldest = min(lost, key=lambda a: a.t_ns)
            loss_ms = (kill_ns - oldest.t_ns) / 1e6
            if crash == "machine":
                promised_nothing = self.level == "replicated"
            else:
                promised_nothing = self.level == "sync" or (self.level == "interval" and crash == "kill")
            crash_name = {"kill": "process kill", "power": "power cut", "machine": "machine loss"}[crash]
            event = {"kill": "kill", "power": "power cut", "machine": "machine loss"}[crash]
            bound = "archive_rpo_ms" if crash == "machine" else "rpo_ms"
            if promised_nothing:
                v.append(f"{tag}I2: {len(lost)} acknowledged commit(s) lost at level {self.level} after a "
                         f"{crash_name}: LSNs {sorted(a.lsn for a in lost)[:10]} (state ends at LSN {top}); the "
                         f"oldest was acknowledged {loss_ms:.1f} ms before the {event}")
            elif loss_ms > self.rpo_ms + SLACK_MS:
                v.append(f"{tag}RPO: {len(lost)} acknowledged commit(s) lost, the oldest acknowledged {loss_ms:.1f} ms "
                         f"before the {event}: over {bound}={self.rpo_ms} (+{SLACK_MS} ms slack)")
        if not v:
            self.model, self.base = state, top
        return CheckOutcome(v, m_count, len(acks), len(lost), loss_ms, in_recovery)


def _diff(expected: State, got: State) -> str:
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    changed = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    parts = []
    if missing:
        parts.append(f"{len(missing)} key(s) missing, e.g. {missing[0]!r}")
    if extra:
        k = extra[0]
        parts.append(f"{len(extra)} unexpected key(s), e.g. {k!r} at version {got[k][0]}")
    if changed:
        k = changed[0]
        parts.append(f"{len(changed)} key(s) differ, e.g. {k!r}: version {got[k][0]} value {got[k][1][:32]!r}, "
                     f"expected version {expected[k][0]} value {expected[k][1][:32]!r}")
    return "; ".join(parts) or "no difference"


# ---- results ------------------------------------------------------------------------------------


@dataclass
class LevelResult:
    """What the drill found at one durability level."""

    level: str
    rpo_ms: int
    threads: int
    kills: int = 0
    kills_in_recovery: int = 0  # crashes (kills or power cuts) after OPEN, before READY: inside wal.open
    power_cuts: int = 0
    exhaustive_cuts: int = 0
    acknowledged: int = 0
    ready_ms: float = 0.0  # how long children ran committing (READY to the kill), over the rounds
    lost: int = 0  # acknowledged, then not found after recovery
    lost_after_kills: int = 0
    lost_after_power_cuts: int = 0
    worst_kill_loss_ms: float = 0.0
    worst_power_loss_ms: float = 0.0
    machine_losses: int = 0  # rounds of the machine-loss drill (wal/drill/machineloss.py)
    lost_after_machine_losses: int = 0
    worst_machine_loss_ms: float = 0.0
    committed: int = 0  # commits found after recovery (acknowledged or in flight)
    torn_tails: int = 0  # recoveries that cut a torn tail (expected after power cuts; reported, not a failure)
    recovery_ms: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0
    notes: list[str] = field(default_factory=list)  # said, not a verdict (e.g. an archive left behind)

    @property
    def passed(self) -> bool:
        """No violation, and not a silent engine: children that ran committing for
        `SILENT_AFTER_MS` in all with no commit acknowledged (an engine that never answers, a
        disk too slow for --run-ms) fail the level; fewer, shorter rounds (a small drill whose
        kills all struck recovery or the first commits, as some do on purpose) prove nothing
        either way (`status` says so)."""
        return self.violation_count == 0 and not (self.acknowledged == 0 and self.ready_ms >= SILENT_AFTER_MS)

    @property
    def status(self) -> str:
        if self.violation_count == 0 and self.acknowledged == 0:
            return "FAIL (no commit acknowledged)" if not self.passed else "INCONCLUSIVE (no commit acknowledged)"
        return "PASS" if self.passed else "FAIL"

    @property
    def worst_loss_ms(self) -> float:
        return max(self.worst_kill_loss_ms, self.worst_power_loss_ms, self.worst_machine_loss_ms)

    @property
    def recovery_p50_ms(self) -> float:
        return _percentile(self.recovery_ms, 0.50)

    @property
    def recovery_max_ms(self) -> float:
        return max(self.recovery_ms, default=0.0)

    def add_violations(self, items: Sequence[str]) -> None:
        self.violation_count += len(items)
        room = MAX_VIOLATIONS - len(self.violations)
        self.violations.extend(items[:max(0, room)])

    def record(self, outcome: CheckOutcome, crash: Literal["kill", "power", "machine"]) -> None:
        self.add_violations(outcome.violations)
        self.acknowledged += outcome.acknowledged
        self.lost += outcome.lost
        self.committed += outcome.committed
        if crash == "machine":
            self.lost_after_machine_losses += outcome.lost
            self.worst_machine_loss_ms = max(self.worst_machine_loss_ms, outcome.loss_ms)
        elif crash == "kill":
            self.lost_after_kills += outcome.lost
            self.worst_kill_loss_ms = max(self.worst_kill_loss_ms, outcome.loss_ms)
        else:
            self.lost_after_power_cuts += outcome.lost
            self.worst_power_loss_ms = max(self.worst_power_loss_ms, outcome.loss_ms)

    def report(self) -> str:
        """The summary, then one line per violation (for assertion messages)."""
        return self.summary() + "".join(f"\n  - {v}" for v in self.violations)

    def summary(self) -> str:
        if self.machine_losses:
            rpo = f"{self.rpo_ms} ms" if self.level != "replicated" else "0 (nothing may be lost)"
            return (f"{self.level}, machine loss: {self.acknowledged} commits acknowledged, {self.lost} lost; worst "
                    f"loss {self.worst_machine_loss_ms:.1f} ms vs archive RPO {rpo}; restore p50 "
                    f"{self.recovery_p50_ms:.1f} ms, max {self.recovery_max_ms:.1f} ms; {self.machine_losses} "
                    f"machine losses; {self.status}")
        rpo = f"{self.rpo_ms} ms" if self.level != "sync" else "0 (nothing may be lost)"
        return (f"{self.level}: {self.acknowledged} commits acknowledged, {self.lost} lost "
                f"(after kills {self.lost_after_kills}, after power cuts {self.lost_after_power_cuts}); "
                f"worst loss {self.worst_loss_ms:.1f} ms vs RPO {rpo}; recovery p50 {self.recovery_p50_ms:.1f} ms, "
                f"max {self.recovery_max_ms:.1f} ms; {self.kills} kills and {self.power_cuts} power cuts "
                f"({self.kills_in_recovery} of them during a recovery), {self.exhaustive_cuts} exhaustive cuts, "
                f"{self.torn_tails} torn tails cut; {self.status}")


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---- running a child ----------------------------------------------------------------------------


class _Child:
    """A child process whose stdout/stderr go to files the parent polls."""

    def __init__(self, argv: list[str], out: str, err: str, env: dict[str, str] | None = None) -> None:
        self.out_path, self.err_path = out, err
        with open(out, "wb") as fo, open(err, "wb") as fe:
            self.start_ns = time.monotonic_ns()
            self.proc = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=env)
        self._fd = os.open(out, os.O_RDONLY | os.O_CLOEXEC)
        self._buf = b""
        self.kill_ns: int | None = None

    def _poll(self) -> str:
        while True:
            chunk = os.read(self._fd, 1 << 20)
            if not chunk:
                break
            self._buf += chunk
        return self._buf.decode(errors="replace")

    def wait_for(self, word: str, timeout: float) -> bool:
        """Until a complete line starting with `word` appeared; False if the child died or timed out."""
        deadline = time.monotonic() + timeout
        needle = "\n" + word + " "
        while time.monotonic() < deadline:
            text = "\n" + self._poll()
            if needle in text:
                return True
            if self.proc.poll() is not None:
                return needle in "\n" + self._poll()
            time.sleep(0.0005)
        return False

    def kill(self) -> int:
        self.kill_ns = time.monotonic_ns()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return self.kill_ns

    def output(self) -> ChildOutput:
        text = self._poll()
        os.close(self._fd)
        return parse_child_output(text)

    def stderr_tail(self) -> str:
        try:
            with open(self.err_path, "rb") as f:
                data = f.read()
        except OSError:
            return ""
        return data[-2000:].decode(errors="replace").strip()


def _power_cut_mode(rng: random.Random, level: str) -> Mode:
    """The mode of one power cut: "drop" for RPO_DROP_SHARE of the cuts at a level with an RPO
    bound, else one of MODES at random."""
    if level in ("interval", "buffered") and rng.random() < RPO_DROP_SHARE:
        return "drop"
    mode: Mode = rng.choice(MODES)
    return mode


def _child_argv(store: str, level: str, rpo_ms: int, *, threads: int, seed: int, round_no: int,
                apply_interval_ms: int, script: bool = False) -> list[str]:
    argv = [sys.executable, "-m", "wal.drill.crashtest", "--child", store, "--level", level, "--rpo-ms", str(rpo_ms),
            "--threads", str(threads), "--seed", str(seed), "--round", str(round_no),
            "--apply-interval-ms", str(apply_interval_ms)]
    if script:
        argv.append("--script")
    return argv


def copy_store(src: str, dst: str) -> None:
    """Copy a (crashed) store directory, keeping preallocated segments sparse. No-op if src is missing."""
    if not os.path.isdir(src):
        return
    shutil.copytree(src, dst, copy_function=crashsim.copy_sparse)


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---- the loops ------------------------------------------------------------------------------------


class _Loop:
    """State shared by the rounds of one kill or power-cut loop."""

    def __init__(self, workdir: str, level: str, rpo_ms: int, *, threads: int, seed: int,
                 result: LevelResult, crash: Literal["kill", "power"], run_max_s: float,
                 recovery_kill_fraction: float) -> None:
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.root = os.path.join(self.workdir, "root")
        self.store = os.path.join(self.root, "store")
        self.journal = os.path.join(self.workdir, "journal")
        os.makedirs(self.root, exist_ok=True)
        self.level, self.rpo_ms, self.threads = level, rpo_ms, threads
        self.rng = random.Random(f"{seed}/{level}/{crash}")
        self.seed = seed
        self.result = result
        self.crash: Literal["kill", "power"] = crash
        self.oracle = Oracle(level, rpo_ms, seed)
        self.run_max_s = run_max_s
        self.recovery_kill_fraction = recovery_kill_fraction
        self.last_recovery_s = 0.005
        self.ready_after_s = 0.3  # spawn -> READY, learnt from the rounds

    def _run_child(self, round_no: int) -> tuple[_Child, ChildOutput, bool, int]:
        """Start this round's child, kill it at a moment the round's draws pick, and read what it
        said: (the child, its output, whether it died by itself before the kill, when it was killed)."""
        rng = self.rng
        env = None
        if self.crash == "power":
            env = crashsim.env_for(self.root, self.journal)
        apply_ms = rng.choice((20, 20, 500, 2000))  # long intervals leave much to replay
        argv = _child_argv(self.store, self.level, self.rpo_ms, threads=self.threads, seed=self.seed, round_no=round_no,
                          apply_interval_ms=apply_ms)
        out = os.path.join(self.workdir, "child.out")
        err = os.path.join(self.workdir, "child.err")
        child = _Child(argv, out, err, env)
        how = rng.random()
        died = False
        try:
            if round_no > 1 and how < self.recovery_kill_fraction:
                # Into the recovery: from OPEN, within about as long as the last recovery took.
                if child.wait_for("OPEN", 60):
                    time.sleep(rng.uniform(0, 1.5 * self.last_recovery_s + 0.001))
                else:
                    died = True
            elif how < self.recovery_kill_fraction + 0.1:
                time.sleep(rng.uniform(0, self.ready_after_s))  # anywhere from exec to the first commits
            elif child.wait_for("READY", 60):
                # Mostly anywhere in the run; sometimes within its very first commits.
                time.sleep(rng.uniform(0, 0.005) if rng.random() < 0.15 else rng.uniform(0, self.run_max_s))
            else:
                died = True
            if child.proc.poll() is not None:
                died = True
            kill_ns = child.kill()
        except BaseException:
            child.kill()
            raise
        output = child.output()
        if output.ready_ns is not None:
            self.ready_after_s = 0.8 * self.ready_after_s + 0.2 * (output.ready_ns - child.start_ns) / 1e9
            self.result.ready_ms += max(0, kill_ns - output.ready_ns) / 1e6
        return child, output, died, kill_ns

    def round(self, round_no: int) -> bool:
        """One child, one kill (and power cut), one check. False when the loop cannot go on."""
        for _ in range(_UNSTARTED_REDRAWS):
            child, output, died, kill_ns = self._run_child(round_no)
            if not (self.crash == "power" and not died and output.open_ns is None and not _journaled(self.journal)):
                break
            # Killed between its exec and the simulator's constructor (which journals START before
            # the program runs): the child touched nothing, so there is nothing to cut. Draw the
            # round again rather than count a power cut that rewound nothing.
        else:
            raise SimulatorInactiveError(
                f"the power-cut simulator journaled nothing in {_UNSTARTED_REDRAWS} children of {self.crash} round "
                f"{round_no}, each killed before it printed OPEN; its library is {crashsim.shim_path()}. The last "
                f"child's stderr:\n{child.stderr_tail()}")
        rng = self.rng
        what = f"{self.crash} round {round_no}"
        if died or output.errors:
            msg = "; ".join(output.errors) or f"exit status {child.proc.returncode}"
            self.result.add_violations([f"[{what}] the child failed by itself before the kill: {msg}\n"
                                        f"{child.stderr_tail()}"])
            return False
        if self.crash == "power":
            if not _journaled(self.journal):
                # The shim journals its START record first thing in the child: none, and it did not
                # load there (its LD_PRELOAD refused, or its environment lost): the "cut" would
                # rewind nothing and prove no more than a kill.
                raise SimulatorInactiveError(
                    f"the power-cut simulator did not run in the child of {what} (no journal in {self.journal}): "
                    f"its library {crashsim.shim_path()} was not preloaded; see the child's stderr:\n"
                    f"{child.stderr_tail()}")
            mode = _power_cut_mode(rng, self.level)
            cut_seed = rng.randrange(1 << 30)
            crashsim.apply_power_cut(self.root, self.journal, mode=mode, seed=cut_seed)
            what += f" (mode={mode} seed={cut_seed})"
            self.result.power_cuts += 1
        else:
            self.result.kills += 1
        if output.open_ns is not None and output.ready_ns is None:
            self.result.kills_in_recovery += 1
        # Recover a copy; the original stays crashed for the next child to recover.
        check_dir = os.path.join(self.workdir, "check")
        _rmtree(check_dir)
        os.makedirs(check_dir)
        copy_store(self.store, os.path.join(check_dir, "store"))
        got = recover(os.path.join(check_dir, "store"))
        _rmtree(check_dir)
        if got.error is None:
            self.result.recovery_ms.append(got.seconds * 1000)
            self.result.torn_tails += got.torn_tail is not None
            self.last_recovery_s = max(got.seconds, 0.001)
        outcome = self.oracle.check(got, round_no, output, kill_ns, self.crash, where=what)
        self.result.record(outcome, self.crash)
        return not outcome.violations


def _run_rounds(directory: str | os.PathLike[str], level: str, rpo_ms: int, rounds: int,
                crash: Literal["kill", "power"], *,
                threads: int, seed: int, run_max_s: float, recovery_kill_fraction: float,
                result: LevelResult | None) -> LevelResult:
    result = result or LevelResult(level, rpo_ms, threads)
    loop = _Loop(os.fspath(directory), level, rpo_ms, threads=threads, seed=seed, result=result, crash=crash,
                 run_max_s=run_max_s, recovery_kill_fraction=recovery_kill_fraction)
    for round_no in range(1, rounds + 1):
        if not loop.round(round_no):
            break
    return result


def run_kills(directory: str | os.PathLike[str], level: str, rpo_ms: int, kills: int, *, threads: int = 1,
              seed: int = 0, run_max_s: float = 0.25, recovery_kill_fraction: float = 0.3,
              result: LevelResult | None = None) -> LevelResult:
    """`kills` rounds of: a child commits, SIGKILL at a random moment, recover a copy, check."""
    return _run_rounds(directory, level, rpo_ms, kills, "kill", threads=threads, seed=seed, run_max_s=run_max_s,
                       recovery_kill_fraction=recovery_kill_fraction, result=result)


def run_power_cuts(directory: str | os.PathLike[str], level: str, rpo_ms: int, cuts: int, *, threads: int = 1,
                   seed: int = 0, run_max_s: float = 0.25, recovery_kill_fraction: float = 0.3,
                   result: LevelResult | None = None) -> LevelResult:
    """`cuts` rounds of: a child under the shim commits, SIGKILL, a simulated power cut, recover, check."""
    return _run_rounds(directory, level, rpo_ms, cuts, "power", threads=threads, seed=seed, run_max_s=run_max_s,
                       recovery_kill_fraction=recovery_kill_fraction, result=result)


def run_exhaustive(directory: str | os.PathLike[str], level: str, rpo_ms: int, *,
                   modes: Sequence[Mode] = MODES, seed: int = 0, every: int = 1,
                   at: Literal["fsync", "all"] = "fsync", result: LevelResult | None = None) -> LevelResult:
    """The scripted workload once under the shim, then a power cut at every fsync boundary x mode.

    `every` > 1 checks only every `every`-th boundary (the journal's end is always checked);
    ``at="all"`` cuts before every journal record instead (every write, rename, unlink...).
    """
    result = result or LevelResult(level, rpo_ms, 1)
    work = os.path.abspath(os.fspath(directory))
    os.makedirs(work, exist_ok=True)
    root, journal = os.path.join(work, "root"), os.path.join(work, "journal")
    _rmtree(root)
    env = crashsim.env_for(root, journal)
    store = os.path.join(root, "store")
    argv = _child_argv(store, level, rpo_ms, threads=1, seed=seed, round_no=1, apply_interval_ms=5, script=True)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    output = parse_child_output(proc.stdout)
    if proc.returncode != 0 or not output.done or output.errors:
        result.add_violations([f"[exhaustive {level}] the scripted workload failed (exit {proc.returncode}): "
                               f"{'; '.join(output.errors)}\n{proc.stderr[-2000:]}"])
        return result

    records = crashsim.read_journal(journal).records
    # Just before each sync returned (what it was syncing may or may not be on disk), and just after.
    kinds = (crashsim.FSYNC, crashsim.DIRSYNC, crashsim.SYNCALL)
    boundaries = set()
    for i, r in enumerate(records):
        if at == "all" and r.kind != crashsim.NOTE:
            boundaries.add(r.pos)
        elif r.kind in kinds:
            boundaries.add(r.pos)
            if i + 1 < len(records):
                boundaries.add(records[i + 1].pos)
    positions: list[int | None] = [*sorted(boundaries)[::every], None]
    notes = [(r.pos, r.path) for r in records if r.kind == crashsim.NOTE]
    acks_all: list[tuple[int, Ack]] = []
    for pos, text in notes:
        words = text.split()
        if words and words[0] == "ack":
            ack = _parse_ack(["ACK", *words[1:]])
            if ack is not None:
                acks_all.append((pos, ack))
    case = 0
    for cut in positions:
        end = cut if cut is not None else 1 << 62
        acks = [a for pos, a in acks_all if pos < end]
        times = [int(text.split()[1]) for pos, text in notes if pos < end and len(text.split()) >= 2]
        cut_ns = max(times, default=0)
        for mode in modes:
            case += 1
            new_root, new_journal = os.path.join(work, "cut"), os.path.join(work, "cut.journal")
            _rmtree(new_root)
            _rmtree(new_journal + ".side")
            crashsim.clone(root, journal, new_root, new_journal)
            cut_seed = (seed * 1_000_003 + case) & 0xFFFFFFF
            crashsim.apply_power_cut(new_root, new_journal, mode=mode, seed=cut_seed, at=cut)
            got = recover(os.path.join(new_root, "store"))
            if got.error is None:
                result.recovery_ms.append(got.seconds * 1000)
                result.torn_tails += got.torn_tail is not None
            # After the child's clean close everything acknowledged is durable at every level.
            oracle = Oracle(level if cut is not None else "sync", rpo_ms, seed, pad=SCRIPT_PAD)
            child = ChildOutput(open_ns=0, ready_ns=0, acks=acks)
            where = f"exhaustive {level} at={cut if cut is not None else 'end'} mode={mode} seed={cut_seed}"
            outcome = oracle.check(got, 1, child, cut_ns, "power", where=where)
            result.record(outcome, "power")
            result.exhaustive_cuts += 1
            _rmtree(new_root)
    _rmtree(root)
    for p in (journal, journal + ".side", os.path.join(work, "cut.journal")):
        if os.path.isdir(p):
            _rmtree(p)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
    return result


def run_level(directory: str | os.PathLike[str], level: str, rpo_ms: int, *, kills: int, power_cuts: int,
              threads: int = 1, seed: int = 0, exhaustive: bool = False, run_max_s: float = 0.25) -> LevelResult:
    """Kills, power cuts and (optionally) the exhaustive cuts at one level, in subdirectories of directory."""
    rpo = rpo_ms if level != "sync" else 0
    result = LevelResult(level, rpo, threads)
    base = os.fspath(directory)
    if kills:
        run_kills(os.path.join(base, level, "kill"), level, rpo, kills, threads=threads, seed=seed,
                  run_max_s=run_max_s, result=result)
    if power_cuts:
        run_power_cuts(os.path.join(base, level, "power"), level, rpo, power_cuts, threads=threads, seed=seed,
                       run_max_s=run_max_s, result=result)
    if exhaustive:
        run_exhaustive(os.path.join(base, level, "exhaustive"), level, rpo, seed=seed, result=result)
    return result


# ---- the storage stack ----------------------------------------------------------------------------

@dataclass
class Device:
    name: str
    write_cache: str | None  # "write back" / "write through" / None when not exposed
    fua: bool | None
    kind: str  # "disk", "dm", "md", "loop", "zram", "ram", "nvme", "virtio", ...
    backing: str | None = None  # loop devices: the backing file


@dataclass
class StorageStack:
    path: str
    mount_point: str = "?"
    fstype: str = "?"
    source: str = "?"
    mount_options: str = ""
    super_options: str = ""
    devices: list[Device] = field(default_factory=list)
    fdatasync_p50_ms: float | None = None
    fdatasync_p99_ms: float | None = None
    fdatasync_samples: int = 0
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"storage stack of {self.path}:",
               f"  filesystem  {self.fstype} on {self.source}, mounted at {self.mount_point}"
               + (f" ({self.mount_options})" if self.mount_options else "")]
        if self.devices:
            for d in self.devices:
                wc = f'write cache "{d.write_cache}"' if d.write_cache else "write cache not exposed"
                fua = "" if d.fua is None else (", FUA yes" if d.fua else ", FUA no")
                back = f", backed by {d.backing}" if d.backing else ""
                out.append(f"  device      {d.name} ({d.kind}): {wc}{fua}{back}")
        else:
            out.append("  device      none (no block device under this filesystem)")
        if self.fdatasync_p50_ms is not None:
            out.append(f"  fdatasync   p50 {self.fdatasync_p50_ms:.3f} ms, p99 {self.fdatasync_p99_ms:.3f} ms "
                       f"({self.fdatasync_samples} samples of a 4 KiB write + fdatasync)")
        out.extend(f"  note: {n}" for n in self.notes)
        out.extend(f"  WARNING: {w}" for w in self.warnings)
        return out


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _devices_for(majmin: str, sys_root: str = "/sys", depth: int = 0) -> list[Device]:
    """The whole disk(s) under a block device: partitions climb to their disk, dm/md to their slaves."""
    if depth > 8 or not majmin or majmin.startswith("0:"):
        return []
    sys_dev = os.path.realpath(f"{sys_root}/dev/block/{majmin}")
    if not os.path.isdir(sys_dev):
        return []
    if os.path.exists(os.path.join(sys_dev, "partition")):
        sys_dev = os.path.dirname(sys_dev)
    name = os.path.basename(sys_dev)
    slaves_dir = os.path.join(sys_dev, "slaves")
    slaves = sorted(os.listdir(slaves_dir)) if os.path.isdir(slaves_dir) else []
    kind = ("dm" if name.startswith("dm-") else "md" if name.startswith("md") else "loop" if name.startswith("loop")
            else "zram" if name.startswith("zram") else "ram" if re.fullmatch(r"ram\d+", name)
            else "nvme" if name.startswith("nvme") else "virtio" if name.startswith("vd") else "disk")
    wc = _read(os.path.join(sys_dev, "queue", "write_cache"))
    fua_raw = _read(os.path.join(sys_dev, "queue", "fua"))
    dev = Device(name, wc, None if fua_raw is None else fua_raw == "1", kind,
                 _read(os.path.join(sys_dev, "loop", "backing_file")) if kind == "loop" else None)
    out = [dev]
    for s in slaves:
        dev_file = _read(os.path.join(slaves_dir, s, "dev"))
        if dev_file:
            out.extend(_devices_for(dev_file, sys_root, depth + 1))
    return out


def _measure_fdatasync(directory: str, *, samples: int = 200, budget_s: float = 1.5) -> list[float]:
    probe = os.path.join(directory, f".agentwal-fdatasync-probe-{os.getpid()}")
    fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    times: list[float] = []
    try:
        block = os.urandom(4096)
        started = time.monotonic()
        for i in range(samples):
            os.pwrite(fd, block, (i % 16) * 4096)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            times.append((time.perf_counter() - t0) * 1000)
            if time.monotonic() - started > budget_s and len(times) >= 10:
                break
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return times


def storage_stack(directory: str | os.PathLike[str], *, measure: bool = True,
                  mountinfo: str = "/proc/self/mountinfo", sys_root: str = "/sys") -> StorageStack:
    """What lies under `directory`, and where the durability guarantee cannot be trusted.

    `mountinfo` and `sys_root` are for tests (a fake mount table and sysfs tree)."""
    path = os.path.abspath(os.fspath(directory))
    st = StorageStack(path)
    w = st.warnings
    try:
        mount = mount_of(path, mounts(mountinfo))
    except OSError as exc:
        mount = None
        st.notes.append(f"cannot read {mountinfo}: {exc}")
    if mount is not None:
        st.mount_point, st.fstype, st.source = mount.point, mount.fstype, mount.source
        st.mount_options, st.super_options = mount.options, mount.super_options
        majmin = mount.majmin
        if majmin.startswith("0:") and mount.source.startswith("/dev/"):
            with contextlib.suppress(OSError):  # btrfs, zfs...: an anonymous st_dev; the source names the device
                rdev = os.stat(mount.source).st_rdev
                majmin = f"{os.major(rdev)}:{os.minor(rdev)}"
        st.devices = _devices_for(majmin, sys_root)
    fs = st.fstype
    opts = set(st.mount_options.split(",")) | set(st.super_options.split(","))
    if fs in MEMORY_FS:
        w.append(f"{fs} keeps files in memory: nothing survives a power cut or reboot, whatever the level "
                 "(a process kill is survived)")
    elif fs in NETWORK_FS or fs.startswith("nfs"):
        w.append(f"{fs} is a network or shared filesystem: whether fdatasync reaches stable storage depends on "
                 "the server and client settings (caching, async exports); the guarantee cannot be checked from here")
    elif fs in OVERLAY_FS:
        upper = next((o.split("=", 1)[1] for o in opts if o.startswith("upperdir=")), None)
        w.append(f"{fs} is an overlay (container) filesystem: durability is that of its upper layer"
                 + (f" ({upper})" if upper else "") + ", and containers often put it on storage discarded on exit")
    elif fs.startswith("fuse"):
        w.append(f"{fs} is a FUSE filesystem: fsync is whatever its daemon does with it")
    if opts & {"nobarrier", "barrier=0"}:
        w.append("mounted with nobarrier: the filesystem does not ask the device to flush its cache; "
                 "fdatasync does not survive a power cut")
    if "eatmydata" in os.environ.get("LD_PRELOAD", ""):
        w.append("libeatmydata is preloaded: fsync and fdatasync do nothing in this process")
    for d in st.devices:
        if d.kind in ("zram", "ram"):
            w.append(f"{d.name} is a RAM-backed block device: nothing survives a power cut")
        if d.write_cache == "write back":
            w.append(f'{d.name} has a volatile write cache ("write back"'
                     + ("" if d.fua is None else f", FUA {'yes' if d.fua else 'no'}")
                     + "): fdatasync is durable only if the device honours cache flushes"
                     + (" (a virtual disk: the host's cache mode decides)" if d.kind == "virtio" else ""))
        if d.kind == "loop" and d.backing:
            st.notes.append(f"{d.name} is a loop device over {d.backing}: its flushes are only as good as that "
                            "file's filesystem")
    if measure:
        try:
            times = _measure_fdatasync(path)
        except OSError as exc:
            st.notes.append(f"could not measure fdatasync in {path}: {exc}")
        else:
            st.fdatasync_samples = len(times)
            st.fdatasync_p50_ms = _percentile(times, 0.50)
            st.fdatasync_p99_ms = _percentile(times, 0.99)
            if st.fdatasync_p50_ms < 0.02 and fs not in MEMORY_FS:
                w.append(f"fdatasync returns in {st.fdatasync_p50_ms * 1000:.0f} us: faster than a device can "
                         "flush; the filesystem or device may not be flushing at all")
    return st


# ---- the command line -----------------------------------------------------------------------------


def _levels(text: str) -> list[str]:
    out = []
    for raw in text.split(","):
        part = raw.strip()
        if part not in ("sync", "interval", "buffered", "replicated"):
            raise argparse.ArgumentTypeError(f"unknown level {part!r}; use sync, interval, buffered (replicated "
                                             "with --archive)")
        if part not in out:
            out.append(part)
    return out


def _nonneg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _positive(text: str) -> int:
    v = _nonneg(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be >= 1, got 0")
    return v


def build_parser(prog: str = "agentwal crashtest") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "The crash drill, on your own disk. A child process commits through agentwal and is SIGKILLed at\n"
            "random moments (also while it recovers); then the same under a simulated power cut. After each\n"
            "crash the store is recovered and checked: every commit the level promised is there (I2), the\n"
            "state is a gap-free prefix of the commits (I3), recovery after a kill during recovery gives the\n"
            "same state (I4), and at interval/buffered the commits lost are within --rpo-ms of the crash.\n"
            "It also reports the storage stack under DIR and warns where fdatasync cannot be trusted.\n"
            "\nThe simulated power cut drops what was not fsynced, as an honest disk would: it proves the\n"
            "engine's part. Whether your device honours flushes is what the storage-stack section is about."),
        epilog="Exit status: 0 every level PASS, 1 a level FAILed, 2 bad usage.")
    p.add_argument("dir", nargs="?", metavar="DIR",
                   help="an existing directory on the disk to test (a subdirectory is created in it and removed "
                        "after); "
                        "default: a fresh directory under the system temp dir ($TMPDIR or /tmp)")
    p.add_argument("--level", type=_levels, default=["sync", "interval", "buffered"],
                   help="comma-separated levels to test (default: sync,interval,buffered)")
    p.add_argument("--rpo-ms", type=int, default=50, help="RPO for interval and buffered (default 50)")
    p.add_argument("--kills", type=_nonneg, default=20, help="process kills per level (default 20)")
    p.add_argument("--power-cuts", type=_nonneg, default=20, help="simulated power cuts per level (default 20)")
    p.add_argument("--exhaustive", action="store_true",
                   help="also cut a short scripted workload at every fsync boundary, in every mode (slower)")
    p.add_argument("--seed", type=int, default=None, help="seed of every random choice (default: a random one, shown)")
    p.add_argument("--threads", type=int, default=4, help="committing threads in the child (default 4)")
    p.add_argument("--run-ms", type=_positive, default=250,
                   help="a child commits for up to this long before it is killed (default 250)")
    p.add_argument("--keep", action="store_true", help="keep the stores afterwards (to inspect them)")
    g = p.add_argument_group(
        "machine loss", "With --archive URL (s3://bucket/prefix or file:///dir, your object store), each level also\n"
        "runs the machine-loss drill: a child commits with the archive, is SIGKILLed, its whole directory is\n"
        "deleted, the archive is restored elsewhere and checked: nothing acknowledged at replicated may be\n"
        "missing, nothing acknowledged at sync/interval/buffered more than --archive-rpo-ms before the loss.\n"
        "Level replicated (machine loss only) needs --archive. Each round writes under its own prefix of URL\n"
        "and deletes it afterwards (unless --keep).")
    g.add_argument("--archive", metavar="URL", default=None, help="the archive to drill machine loss against")
    g.add_argument("--machine-losses", type=_nonneg, default=5, help="machine losses per level (default 5)")
    g.add_argument("--archive-rpo-ms", type=int, default=1000,
                   help="archive_rpo_ms of the child's store: the machine-loss bound checked (default 1000)")
    return p


def main_crashtest(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """`agentwal crashtest`: returns the exit status (0 all PASS, 1 any FAIL, 2 bad usage)."""
    stream = out or sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    if args.rpo_ms <= 0 and any(lv != "sync" for lv in args.level):
        parser.print_usage(sys.stderr)
        print("agentwal crashtest: error: --rpo-ms must be > 0 for interval and buffered", file=sys.stderr)
        return 2
    if args.threads < 1:
        print("agentwal crashtest: error: --threads must be >= 1", file=sys.stderr)
        return 2
    if not (args.kills or args.power_cuts or args.exhaustive or (args.archive and args.machine_losses)):
        print("agentwal crashtest: error: nothing to drill: --kills and --power-cuts are both 0 (and no "
              "--exhaustive, nor --archive with --machine-losses above 0)", file=sys.stderr)
        return 2
    if "replicated" in args.level and not args.archive:
        print("agentwal crashtest: error: level replicated needs --archive URL (it is drilled by machine loss)",
              file=sys.stderr)
        return 2
    if args.archive and args.archive_rpo_ms <= 0:
        print("agentwal crashtest: error: --archive-rpo-ms must be > 0", file=sys.stderr)
        return 2
    for name, value in (("--rpo-ms", args.rpo_ms), ("--archive-rpo-ms", args.archive_rpo_ms)):
        if value > dur.MAX_RPO_MS:
            print(f"agentwal crashtest: error: {name} must be at most {dur.MAX_RPO_MS}", file=sys.stderr)
            return 2
    if args.archive:
        from wal.archive.objects import open_objects, parse_url  # noqa: PLC0415 -- only the machine-loss drill

        try:
            parse_url(args.archive)
        except wal.ArgumentError as exc:
            print(f"agentwal crashtest: error: --archive: {exc}", file=sys.stderr)
            return 2
        # An object store that does not answer (a wrong endpoint, credentials, bucket) is said
        # before anything runs: the drill would otherwise report each level FAILed, as if the
        # engine had lost commits. (The probe is the one a writer makes: two create-only PUTs.)
        try:
            open_objects(args.archive).check_create_only()
        except wal.WalError as exc:
            print(f"agentwal crashtest: error: --archive {args.archive} cannot be used: {exc}", file=sys.stderr)
            return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    shim_note = None
    if args.power_cuts or args.exhaustive:
        try:
            crashsim.shim_path()
        except FileNotFoundError as exc:  # a build without the simulator: kills only, and say so
            shim_note = f"power cuts skipped: {exc}"
            args.power_cuts, args.exhaustive = 0, False

    def say(text: str = "") -> None:
        print(text, file=stream, flush=True)

    if args.dir:
        parent = os.path.abspath(args.dir)
        if not os.path.isdir(parent):
            # Never made: a mistyped path or a volume not mounted would drill whatever disk holds
            # the directory made in its place, and pass for the one the user meant.
            print(f"agentwal crashtest: error: {parent} is not a directory: give an existing directory on the disk "
                  "to test", file=sys.stderr)
            return 2
        try:
            work = tempfile.mkdtemp(prefix="agentwal-crashtest-", dir=parent)
        except OSError as exc:  # a file there, no permission: said, not a traceback
            print(f"agentwal crashtest: error: cannot work in {parent}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    else:
        work = tempfile.mkdtemp(prefix="agentwal-crashtest-")
    say(f"agentwal crashtest in {work}" + (" (kept afterwards)" if args.keep else " (removed afterwards)"))
    say(f"seed {seed}; per level: {args.kills} kills, {args.power_cuts} simulated power cuts"
        + (", exhaustive cuts" if args.exhaustive else "") + f"; {args.threads} committing thread(s); "
        f"rpo {args.rpo_ms} ms for interval/buffered")
    if not args.dir:
        say("(to test the disk your store will live on, pass a directory on it: agentwal crashtest DIR)")
    machine = (f" --archive {args.archive} --machine-losses {args.machine_losses} --archive-rpo-ms "
               f"{args.archive_rpo_ms}" if args.archive else "")
    say(f"rerun: agentwal crashtest {args.dir or ''} --seed {seed} --level {','.join(args.level)} "
        f"--kills {args.kills} --power-cuts {args.power_cuts} --threads {args.threads} --rpo-ms {args.rpo_ms} "
        f"--run-ms {args.run_ms}{' --exhaustive' if args.exhaustive else ''}{machine}".replace("crashtest  ",
                                                                                               "crashtest "))
    if shim_note:
        say(shim_note)
    say()
    results: list[LevelResult] = []
    machine_results: list[LevelResult] = []
    try:
        stack = storage_stack(work)
        for line in stack.lines():
            say(line)
        say()
        for level in args.level:
            if level == "replicated" or not (args.kills or args.power_cuts or args.exhaustive):
                continue
            started = time.monotonic()
            print(f"  {level}: running...", file=sys.stderr, flush=True)
            r = run_level(work, level, args.rpo_ms, kills=args.kills, power_cuts=args.power_cuts,
                          threads=args.threads, seed=seed, exhaustive=args.exhaustive, run_max_s=args.run_ms / 1000)
            results.append(r)
            print(f"  {level}: done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
        if args.archive and args.machine_losses:
            from wal.drill.machineloss import run_machine_losses  # noqa: PLC0415 -- only with --archive

            for level in args.level:
                started = time.monotonic()
                print(f"  {level}: machine losses...", file=sys.stderr, flush=True)
                machine_results.append(run_machine_losses(
                    os.path.join(work, level, "machine"), level, archive=args.archive,
                    archive_rpo_ms=args.archive_rpo_ms, losses=args.machine_losses, rpo_ms=args.rpo_ms,
                    threads=args.threads, seed=seed, run_max_s=max(args.run_ms / 1000, 1.0), keep=args.keep))
                print(f"  {level}: done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except SimulatorInactiveError as exc:
        print(f"agentwal crashtest: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the drill's own I/O (a full disk, a directory it may not write): not a verdict
        say(f"the drill could not run in {work}: {exc}")
        return 1
    finally:
        if not args.keep:
            _rmtree(work)
    header = (f"{'level':<9} {'acked':>8} {'lost: kill/cut':>15} {'worst loss / RPO':>18} {'recovery p50 / max':>20} "
              f"{'kills':>6} {'cuts':>6} {'in recovery':>11}  result")
    if results:
        say(header)
    for r in results:
        rpo = f"{r.rpo_ms} ms" if r.level != "sync" else "0 ms"
        loss = f"{r.worst_loss_ms:.1f} ms / {rpo}"
        rec = f"{r.recovery_p50_ms:.1f} / {r.recovery_max_ms:.1f} ms"
        lost = f"{r.lost_after_kills}/{r.lost_after_power_cuts}"
        cuts = r.power_cuts + r.exhaustive_cuts
        say(f"{r.level:<9} {r.acknowledged:>8} {lost:>15} {loss:>18} {rec:>20} {r.kills:>6} {cuts:>6} "
            f"{r.kills_in_recovery:>11}  {r.status}")
    if results:
        say()
        say("acked: commits the child was told were committed; lost: of those, not found after recovery (allowed: "
            "none at sync, none after a kill at interval, the last RPO ms otherwise); in recovery: crashes that hit "
            "a recovery in progress; PASS: no invariant (I2 durable, I3 prefix, I4 idempotent recovery) or RPO "
            "violated.")
    if machine_results:
        say()
        say(f"machine loss, archive {args.archive} (archive_rpo_ms {args.archive_rpo_ms}):")
        say(f"{'level':<10} {'acked':>8} {'lost':>6} {'worst loss / archive RPO':>26} {'restore p50 / max':>22} "
            f"{'losses':>7}  result")
        for r in machine_results:
            rpo = "0 ms" if r.level == "replicated" else f"{r.rpo_ms} ms"
            loss = f"{r.worst_machine_loss_ms:.1f} ms / {rpo}"
            rec = f"{r.recovery_p50_ms:.0f} / {r.recovery_max_ms:.0f} ms"
            say(f"{r.level:<10} {r.acknowledged:>8} {r.lost_after_machine_losses:>6} {loss:>26} {rec:>22} "
                f"{r.machine_losses:>7}  {r.status}")
        say()
        say("machine loss: the child SIGKILLed and its directory deleted, the archive restored elsewhere. lost: "
            "acknowledged, not in the restored store (allowed: none at replicated; at the other levels only "
            "commits acknowledged within archive_rpo_ms of the loss). restore: wal.restore plus the first open.")
    for r in [*results, *machine_results]:
        for note in r.notes:
            say(f"note: {note}")
    for r in [*results, *machine_results]:
        if r.violations:
            say()
            say(f"{r.level}: {r.violation_count} violation(s):")
            for v in r.violations:
                say(f"  - {v}")
    if stack.warnings:
        say()
        say(f"{len(stack.warnings)} storage warning(s) above: the drill proves the engine; a power cut on this "
            "stack is survived only if the device and filesystem honour fdatasync.")
    return 0 if all(r.passed for r in [*results, *machine_results]) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        return _child_main(args[1:])
    return main_crashtest(args)


if __name__ == "__main__":
    sys.exit(main())
