"""`agentwal demo`: agents whose whole state lives in the store, a worker killed and restarted.

What it shows
-------------
A *supervisor* (the process you started, `run_demo`) starts a *worker* as a real child
process (``python -m wal.drill.demo --worker DIR ...``). The worker simulates N agents, each
running a multi-step workflow (`WORKFLOWS`: research = search, read, summarize; support =
classify, lookup, reply; ...). The supervisor SIGKILLs the worker K times at random
moments -- during interpreter start-up, while the store is opening (recovery), or in the
middle of the workflows -- and restarts it each time; every agent resumes from the step
counter it finds in the store. The last run finishes every step. Then the supervisor opens
the store itself and checks it against every step the worker acknowledged (`verify`).

Data model (NN: the agent number from 0, at least two digits; SSSSSS: the step from 1)
--------------------------------------------------------------------------------------
``demo/config``            JSON ``{"format", "agents", "steps", "seed"}``, written by the first worker
``agent/NN/step``          the step counter: ASCII decimal, the number of completed steps
``agent/NN/msg/SSSSSS``    the conversation message step SSSSSS produced (JSON, `plan_step`
                           plus ``prev``: the LSN of the previous step's commit, 0 for step 1)
``agent/NN/tool/SSSSSS``   the tool call step SSSSSS made, with its result (JSON)

One step is ONE transaction writing the counter, the message and the tool result, with
``if_version`` on the counter (the version the agent read when the step began, 0 for the first
step) and the idempotency key ``demo/agent/NN/step/SSSSSS``. The ``if_version`` check makes it
impossible to apply a step on top of state the agent did not see (a step can never be
applied twice); the idempotency key makes a retried commit return the first one's LSN.
Everything a step writes is a pure function of ``(seed, agent, step)`` except ``prev``, so a
run is deterministic given ``--seed`` apart from the kill timing and the commit interleaving.

Concurrency: asyncio, one task per agent
----------------------------------------
Agent runtimes (LangGraph, the OpenAI Agents SDK, most home-grown loops) are asyncio
programs in which many agents await model and tool latency on one event loop; the demo runs
that way, through ``store.atransaction``, which never blocks the loop. Commits of tasks that
reach the log together share one fdatasync (group commit). One thread also keeps the ACK
lines the worker prints ordered and whole without a lock.

Worker protocol (stdout, one line per event, flushed at once)
-------------------------------------------------------------
``OPENING <t>``                                    about to call ``wal.open`` (recovery starts)
``RECOVERED <seconds> <replayed> <log_records> <torn_bytes>``   the store is open
``RESUME <agent> <step>``                          the counter an agent found (once per agent)
``ACK <agent> <step> <lsn> <t> [dup]``             a step's commit was acknowledged
``STATS <json>``                                   counters (`_stats_summary`), every 0.05 s
``CLOSING``                                        every step is done; closing the store
``DONE <json>``                                    final counters; the store is closed

``t`` is ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the machine),
so the supervisor can compare an acknowledgement with the moment it sent SIGKILL.

The check
---------
For every agent: the counter is at least the last step acknowledged; the message and tool keys
are exactly steps 1..counter (no gap, nothing past the counter); a step's counter, message and
tool keys carry the same version (one transaction); each acknowledged step is stored at the
LSN it was acknowledged with (a step committed again after its acknowledgement -- applied
twice -- would carry a later LSN); each message's ``prev`` is the LSN of the step before it (a
step applied again after its successor read it breaks the chain); the content is what
`plan_step` gives. At every restart the supervisor also compares the counters the worker
resumes from (``RESUME``) with the steps acknowledged before the kill, and a step acknowledged
twice is reported as applied twice.

Durability levels: ``sync`` and ``interval`` promise that a process kill loses nothing, so
every acknowledged step must survive. ``buffered`` with ``rpo_ms=T`` may lose the commits
acknowledged in the last T ms before the kill: such steps are counted as "lost within the
RPO" (allowed, then redone and acknowledged again); any older loss fails the check.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple, TextIO

import wal
from wal.log import durability as dur

DEMO_FORMAT = 1
CONFIG_KEY = "demo/config"
MAX_AGENTS = 1000
MAX_STEPS = 999_999
STATS_INTERVAL_S = 0.05
HANG_TIMEOUT_S = 60.0  # no line from the worker for this long: it is hung, the demo fails

# kind -> the (phase, tool) cycle its workflow repeats, one step per phase.
WORKFLOWS: dict[str, tuple[tuple[str, str], ...]] = {
    "research": (("search", "web.search"), ("read", "web.fetch"), ("summarize", "llm.summarize")),
    "support": (("classify", "llm.classify"), ("lookup", "crm.lookup"), ("reply", "mail.send")),
    "coding": (("plan", "llm.plan"), ("edit", "fs.write"), ("test", "ci.run")),
    "travel": (("search", "flights.search"), ("compare", "llm.rank"), ("book", "booking.hold")),
}
KINDS: tuple[str, ...] = tuple(WORKFLOWS)
_TOPICS: dict[str, tuple[str, ...]] = {
    "research": ("group commit", "LMDB copy-on-write", "fsyncgate", "torn writes", "CRC-32C", "RPO targets"),
    "support": ("refund #4471", "late delivery", "password reset", "invoice copy", "plan upgrade", "API quota"),
    "coding": ("flaky test", "off-by-one in pager", "slow query", "missing index", "race in cache", "typo in docs"),
    "travel": ("LIS to OSL", "BER to ATH", "NYC to SFO", "MAD to ROM", "TYO to SEL", "CPH to DUB"),
}
_NOTES = ("looks solid", "needs a second source", "two options left", "confidence high", "one open question",
          "done, moving on", "escalate if it recurs", "matches the earlier finding")


class DemoError(wal.WalError):
    """The demo cannot run as asked (e.g. DIR is not empty, or holds a demo with another config)."""


# ---- keys and the deterministic workflow ------------------------------------------------------------


def counter_key(agent: int) -> str:
    return f"agent/{agent:02d}/step"


def msg_key(agent: int, step: int) -> str:
    return f"agent/{agent:02d}/msg/{step:06d}"


def tool_key(agent: int, step: int) -> str:
    return f"agent/{agent:02d}/tool/{step:06d}"


def idempotency_key(agent: int, step: int) -> str:
    return f"demo/agent/{agent:02d}/step/{step:06d}"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


class StepPlan(NamedTuple):
    """What step `step` of `agent` does: a pure function of (seed, agent, step)."""

    think_s: float  # simulated model / tool latency awaited before the commit
    message: dict[str, Any]  # stored as the message, plus "prev"
    tool_call: dict[str, Any]  # stored as the tool result


def plan_step(seed: int, agent: int, step: int) -> StepPlan:
    """The deterministic content of one step (string seeding: stable across processes and versions)."""
    rng = random.Random(f"agentwal-demo:{seed}:{agent}:{step}")
    kind = KINDS[agent % len(KINDS)]
    cycle = WORKFLOWS[kind]
    phase, tool = cycle[(step - 1) % len(cycle)]
    task = (step - 1) // len(cycle) + 1
    topic = rng.choice(_TOPICS[kind])
    think_ms = rng.randint(10, 40)
    hits = rng.randint(1, 9)
    message = {"agent": agent, "step": step, "role": "assistant", "workflow": kind, "task": task,
               "phase": phase, "content": f"{phase} {topic}: {hits} results, {rng.choice(_NOTES)}"}
    tool_call = {"agent": agent, "step": step, "tool": tool, "args": {"topic": topic, "task": task},
                 "result": {"ok": True, "hits": hits, "latency_ms": think_ms}}
    return StepPlan(think_ms / 1000, message, tool_call)


# ---- the worker ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoConfig:
    """What a demo simulates. `durability`/`rpo_ms` as for `wal.open` (validated by it)."""

    agents: int = 8
    steps: int = 60
    seed: int = 0
    durability: str | None = None
    rpo_ms: int | None = None


def _stats_summary(st: dict[str, Any]) -> dict[str, Any]:
    keys = ("commits", "fsyncs", "group_size_mean", "group_size_max", "fsync_ms_p50", "fsync_ms_p99",
            "durable_lag_ms", "idempotent_hits", "conflicts", "apply_batches", "rpo_overruns")
    return {k: st.get(k, 0) for k in keys}


class _Emitter:
    """Writes one protocol line and flushes it, so the supervisor sees it before anything that follows."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def __call__(self, *fields: object) -> None:
        self._out.write(" ".join(str(f) for f in fields) + "\n")
        self._out.flush()


def _ensure_config(store: wal.Store, cfg: DemoConfig) -> None:
    want = {"format": DEMO_FORMAT, "agents": cfg.agents, "steps": cfg.steps, "seed": cfg.seed}
    raw = store.get(CONFIG_KEY)
    if raw is None:
        with store.transaction() as tx:
            tx.put(CONFIG_KEY, _dumps(want), if_version=0)
        return
    have = json.loads(raw)
    if have != want:
        raise DemoError(f"{store.path} holds a demo run with config {have}, not {want}; use a fresh directory")


async def _agent(store: wal.Store, cfg: DemoConfig, agent: int, *, step: int, version: int,
                 emit: _Emitter) -> None:
    """Run `agent` from `step` completed steps (counter version `version`) to `cfg.steps`.

    Contract: an ACK line is printed only after the step's transaction was acknowledged at the
    store's durability level; the step's effects are never applied on top of a counter other
    than the one read (if_version), and a retried step is deduplicated (idempotency key).
    """
    ckey = counter_key(agent)
    while step < cfg.steps:
        n = step + 1
        plan = plan_step(cfg.seed, agent, n)
        await asyncio.sleep(plan.think_s)  # the model / tool call this step waits for
        async with store.atransaction(idempotency_key=idempotency_key(agent, n)) as tx:
            tx.put(ckey, str(n).encode(), if_version=version)
            tx.put(msg_key(agent, n), _dumps({**plan.message, "prev": version}))
            tx.put(tool_key(agent, n), _dumps(plan.tool_call))
        assert tx.lsn is not None  # the transaction wrote keys
        emit("ACK", agent, n, tx.lsn, f"{time.monotonic():.6f}", *(["dup"] if tx.deduplicated else []))
        step, version = n, tx.lsn


async def _report_stats(store: wal.Store, emit: _Emitter, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), STATS_INTERVAL_S)
        emit("STATS", json.dumps(_stats_summary(store.stats())))


async def _run_agents(store: wal.Store, cfg: DemoConfig, emit: _Emitter) -> None:
    starts: list[tuple[int, int]] = []
    for agent in range(cfg.agents):
        raw = store.get(counter_key(agent))
        step = int(raw) if raw is not None else 0
        starts.append((step, store.version(counter_key(agent)) or 0))
        emit("RESUME", agent, step)
    stop = asyncio.Event()
    reporter = asyncio.create_task(_report_stats(store, emit, stop))
    try:
        async with asyncio.TaskGroup() as group:
            for agent, (step, version) in enumerate(starts):
                group.create_task(_agent(store, cfg, agent, step=step, version=version, emit=emit))
    finally:
        stop.set()
        await reporter


def run_worker(path: str, cfg: DemoConfig, out: TextIO | None = None) -> int:
    """The worker: open the store at `path`, resume every agent, run them to `cfg.steps`, close.

    Prints the protocol lines of the module docstring to `out` (default stdout). Returns 0
    when every agent finished; raises on any store error (the supervisor reports stderr).
    """
    emit = _Emitter(out if out is not None else sys.stdout)
    emit("OPENING", f"{time.monotonic():.6f}")
    store = wal.open(path, durability=cfg.durability, rpo_ms=cfg.rpo_ms)
    try:
        st = store.stats()
        torn = st.get("torn_tail")
        emit("RECOVERED", f"{st['recovery_seconds']:.6f}", st.get("records_replayed", 0),
             st.get("recovery_records", 0), torn[2] if torn else 0)
        _ensure_config(store, cfg)
        asyncio.run(_run_agents(store, cfg, emit))
        emit("CLOSING")
        final = _stats_summary(store.stats())
    finally:
        store.close()
    emit("DONE", json.dumps(final))
    return 0


def worker_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m wal.drill.demo --worker DIR ...`` (internal: run ``agentwal demo``)."""
    p = argparse.ArgumentParser(prog="python -m wal.drill.demo",
                                description="The agentwal demo's worker process. Run `agentwal demo` instead.")
    p.add_argument("--worker", metavar="DIR", required=True, help="the store directory")
    p.add_argument("--agents", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--durability", choices=dur.LEVELS, required=True)
    p.add_argument("--rpo-ms", type=int, required=True)
    a = p.parse_args(argv)
    cfg = DemoConfig(a.agents, a.steps, a.seed, a.durability, a.rpo_ms)
    try:
        return run_worker(a.worker, cfg)
    except DemoError as exc:
        print(f"agentwal demo worker: {exc}", file=sys.stderr)
        return 2


# ---- the check ---------------------------------------------------------------------------------------


class Ack(NamedTuple):
    """A step the worker acknowledged: `agent` finished `step` in the commit at `lsn`."""

    agent: int
    step: int
    lsn: int
    t: float = 0.0  # time.monotonic() when acknowledged
    dup: bool = False  # the commit was deduplicated by its idempotency key


def parse_acks(lines: Iterable[str]) -> list[Ack]:
    """The ACK lines of a worker's output, in order; other lines are ignored."""
    acks = []
    for line in lines:
        f = line.split()
        if f and f[0] == "ACK":
            acks.append(Ack(int(f[1]), int(f[2]), int(f[3]), float(f[4]), len(f) > 5 and f[5] == "dup"))
    return acks


@dataclass
class CheckResult:
    """The verdict on a demo store. `ok` when nothing was lost, applied twice or inconsistent."""

    agents: int = 0
    acknowledged: int = 0  # distinct (agent, step) pairs acknowledged
    steps_in_store: int = 0  # sum of the agents' step counters
    steps_expected: int = 0  # agents x steps of the demo config
    lost: list[str] = field(default_factory=list)
    applied_twice: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # any other inconsistency
    lost_within_rpo: int = 0  # buffered only: allowed losses (set by the supervisor)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.applied_twice or self.problems)

    def verdict(self) -> str:
        head = "CHECK PASSED" if self.ok else "CHECK FAILED"
        text = (f"{head}: {self.agents} agents, {self.acknowledged} acknowledged steps, "
                f"{len(self.lost)} lost, {len(self.applied_twice)} applied twice")
        if self.problems:
            text += f", {len(self.problems)} other problem{'s' if len(self.problems) != 1 else ''}"
        if self.lost_within_rpo:
            text += f" ({self.lost_within_rpo} lost within the RPO, allowed by the buffered level)"
        return text

    def findings(self) -> list[str]:
        return ([f"lost: {m}" for m in self.lost] + [f"applied twice: {m}" for m in self.applied_twice]
                + [f"inconsistent: {m}" for m in self.problems])


def _steps_under(store: wal.Store, prefix: str) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for key, value in store.scan(prefix):
        suffix = key[len(prefix):]
        if suffix.isdigit():
            out[int(suffix)] = value
    return out


def verify_store(store: wal.Store, acks: Iterable[Ack], *, require_complete: bool = True) -> CheckResult:
    """Check an open demo store against the steps a worker acknowledged (see the module docstring).

    `acks`: when a (agent, step) appears more than once, the last one counts (an earlier one was
    lost within a buffered store's RPO and redone; deciding whether that was allowed is the
    caller's job). `require_complete`: every agent must have finished all its steps.
    """
    res = CheckResult()
    raw = store.get(CONFIG_KEY)
    if raw is None:
        res.problems.append(f"{store.path} has no {CONFIG_KEY} key: not a demo store")
        return res
    config = json.loads(raw)
    agents, steps, seed = int(config["agents"]), int(config["steps"]), int(config["seed"])
    res.agents, res.steps_expected = agents, agents * steps
    last: dict[int, dict[int, Ack]] = {}  # agent -> step -> its last acknowledgement
    for ack in acks:
        last.setdefault(ack.agent, {})[ack.step] = ack
    res.acknowledged = sum(len(steps_acked) for steps_acked in last.values())
    for agent in sorted(last.keys() - set(range(agents))):
        res.problems.append(f"agent {agent} was acknowledged but the demo has agents 0..{agents - 1}")
    for agent in range(agents):
        name = f"agent {agent:02d}"
        raw = store.get(counter_key(agent))
        counter = int(raw) if raw is not None else 0
        res.steps_in_store += counter
        msgs = _steps_under(store, f"agent/{agent:02d}/msg/")
        tools = _steps_under(store, f"agent/{agent:02d}/tool/")
        expected = set(range(1, counter + 1))
        for what, got in (("message", msgs), ("tool result", tools)):
            for s in sorted(expected - got.keys()):
                res.problems.append(f"{name}: step {s} has no {what} although the counter is {counter} (a gap)")
            for s in sorted(got.keys() - expected):
                res.problems.append(f"{name}: a {what} for step {s} exists past the counter {counter}")
        versions: dict[int, int] = {}
        for s in sorted(expected & msgs.keys()):
            vm = store.version(msg_key(agent, s)) or 0
            vt = store.version(tool_key(agent, s))
            versions[s] = vm
            if vt is not None and vt != vm:
                res.problems.append(f"{name}: step {s}'s message is at LSN {vm} but its tool result at LSN {vt} "
                                    "(one step must be one transaction)")
            try:
                msg = json.loads(msgs[s])
            except ValueError:
                res.problems.append(f"{name}: step {s}'s message is not JSON: {msgs[s][:60]!r}")
                continue
            prev = msg.pop("prev", None)
            if msg != plan_step(seed, agent, s).message:
                res.problems.append(f"{name}: step {s}'s message is not what the workflow produces: {msg}")
            if s in tools and json.loads(tools[s]) != plan_step(seed, agent, s).tool_call:
                res.problems.append(f"{name}: step {s}'s tool result is not what the workflow produces")
            want_prev = versions.get(s - 1, 0) if s > 1 else 0
            if s > 1 and (s - 1) in versions and prev != want_prev:
                res.applied_twice.append(
                    f"{name}: step {s} was built on step {s - 1} at LSN {prev}, but step {s - 1} is now at "
                    f"LSN {want_prev} (step {s - 1} was committed again after step {s} read it)")
            elif s == 1 and prev != 0:
                res.problems.append(f"{name}: step 1 records a previous step at LSN {prev}")
        if counter:
            vc = store.version(counter_key(agent))
            if counter in versions and vc != versions[counter]:
                res.problems.append(f"{name}: the counter ({counter}) is at LSN {vc} but step {counter} at LSN "
                                    f"{versions[counter]} (one step must be one transaction)")
        for s, ack in sorted(last.get(agent, {}).items()):
            if s > counter or s not in msgs or s not in tools:
                where = (f"the counter is {counter}" if s > counter
                         else "its message or tool result is missing")
                res.lost.append(f"{name}: step {s}, acknowledged at LSN {ack.lsn}, is not in the store ({where})")
            elif versions.get(s) != ack.lsn:
                res.applied_twice.append(
                    f"{name}: step {s} was acknowledged at LSN {ack.lsn} but the store holds it from LSN "
                    f"{versions.get(s)} (committed again after its acknowledgement)")
        if require_complete and counter != steps:
            res.problems.append(f"{name} stopped at step {counter} of {steps}")
    return res


def verify(path: str | os.PathLike[str], acks: Iterable[Ack], *, require_complete: bool = True) -> CheckResult:
    """`verify_store` on the store at `path`, opened (recovering it) and closed here.

    The store must not be open for writing elsewhere (`wal.LockedError`).
    """
    with wal.open(path) as store:
        return verify_store(store, acks, require_complete=require_complete)


# ---- the supervisor ----------------------------------------------------------------------------------


class KillPlan(NamedTuple):
    """When to SIGKILL one run. mode: "startup" (`delay_s` after spawn), "recovery" (`delay_s`
    after the worker says OPENING) or "workflow" (`delay_s` after `fraction` of the steps left,
    divided among the kills left, were acknowledged in this run)."""

    mode: str
    delay_s: float
    fraction: float = 0.0


def kill_plans(rng: random.Random, kills: int) -> list[KillPlan]:
    """K plans: one during start-up and one during recovery when K >= 3 (one during recovery when
    K == 2), the rest mid-workflow; the first kill always mid-workflow, so later early kills
    find a log to recover."""
    if kills <= 0:
        return []
    early = ["startup", "recovery"] if kills >= 3 else (["recovery"] if kills == 2 else [])
    rest = early + ["workflow"] * (kills - 1 - len(early))
    rng.shuffle(rest)
    plans = []
    for mode in ["workflow", *rest]:
        if mode == "startup":
            plans.append(KillPlan(mode, rng.uniform(0.0, 0.06)))
        elif mode == "recovery":
            plans.append(KillPlan(mode, rng.uniform(0.0, 0.004)))
        else:
            plans.append(KillPlan(mode, rng.uniform(0.0, 0.015), rng.uniform(0.15, 0.8)))
    return plans


_PHASE_BY_LINE = {"OPENING": "recovery", "RECOVERED": "workflow", "CLOSING": "shutdown", "DONE": "exit"}
_PHASE_TEXT = {"startup": "during start-up (before wal.open)", "recovery": "during recovery (in wal.open)",
               "workflow": "mid-workflow", "shutdown": "while closing", "exit": "after closing"}


@dataclass
class RunRecord:
    """One worker process: how it ended and what it reported."""

    number: int
    pid: int
    plan: KillPlan | None
    started: float
    ended: float = 0.0
    outcome: str = "running"  # "killed", "finished", "failed"
    phase: str = "startup"  # the last phase the worker announced
    recovery_s: float | None = None
    replayed: int | None = None
    resumed: int | None = None  # sum of the agents' counters when it resumed
    acked: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    returncode: int | None = None


class _Progress:
    """Event lines, plus (on a terminal) one status line redrawn in place below them."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out, self.tty = out, tty
        self._status = ""
        self._drawn = 0.0

    def event(self, text: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[K" + text + "\n" + self._status)
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def status(self, text: str, *, force: bool = False) -> None:
        self._status = text
        now = time.monotonic()
        if self.tty and (force or now - self._drawn >= 0.05):
            self._drawn = now
            self.out.write("\r\x1b[K" + text)
            self.out.flush()

    def clear(self) -> None:
        if self.tty:
            self.out.write("\r\x1b[K")
            self.out.flush()
        self._status = ""


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


class _Supervisor:
    """Runs the worker until it finishes, killing it per `plans`, and keeps the books on its ACKs."""

    def __init__(self, path: str, cfg: DemoConfig, level: dur.Durability, plans: list[KillPlan],
                 progress: _Progress) -> None:
        self.path, self.cfg, self.level, self.plans, self.progress = path, cfg, level, plans, progress
        self.total = cfg.agents * cfg.steps
        self.runs: list[RunRecord] = []
        self.acks: dict[tuple[int, int], Ack] = {}
        self.ack_run: dict[tuple[int, int], int] = {}
        self.at_risk: set[tuple[int, int]] = set()  # buffered: acknowledged within the RPO before a kill
        self.redo_expected: set[tuple[int, int]] = set()  # known lost; their re-acknowledgement is no news
        self.lost: list[str] = []
        self.applied_twice: list[str] = []
        self.lost_within_rpo = 0
        self.dup_acks = 0
        self.kills_done = 0
        self.failure: str | None = None

    # -- bookkeeping of the protocol lines --

    def _on_ack(self, run: RunRecord, ack: Ack) -> None:
        key = (ack.agent, ack.step)
        prev = self.acks.get(key)
        if ack.dup:
            self.dup_acks += 1
        if prev is None or key in self.redo_expected:
            self.redo_expected.discard(key)  # first acknowledgement, or the redo of a known loss
        elif not (ack.dup and ack.lsn == prev.lsn):  # a dup with the same LSN: not applied again
            self.applied_twice.append(
                f"agent {ack.agent:02d}: step {ack.step} acknowledged at LSN {prev.lsn} in run "
                f"{self.ack_run[key]}, then again at LSN {ack.lsn} in run {run.number}")
        self.acks[key] = ack
        self.ack_run[key] = run.number
        run.acked += 1

    def _on_resume(self, run: RunRecord, agent: int, step: int) -> None:
        """The agent found counter `step`: every step acknowledged before must be there."""
        run.resumed = (run.resumed or 0) + step
        self.at_risk -= {k for k in self.at_risk if k[0] == agent and k[1] <= step}  # they survived
        for s in range(step + 1, self.cfg.steps + 1):
            key = (agent, s)
            ack = self.acks.pop(key, None)
            if ack is None:
                continue
            self.redo_expected.add(key)  # the worker will do (and acknowledge) it again
            if key in self.at_risk:
                self.at_risk.discard(key)
                self.lost_within_rpo += 1
            else:
                self.lost.append(f"agent {agent:02d}: step {s}, acknowledged at LSN {ack.lsn} in run "
                                 f"{self.ack_run[key]}, was not there when run {run.number} resumed at step {step}")

    def _on_line(self, run: RunRecord, line: str) -> None:
        f = line.split(maxsplit=1)
        if not f:
            return
        tag, rest = f[0], (f[1] if len(f) > 1 else "")
        if tag in _PHASE_BY_LINE:
            run.phase = _PHASE_BY_LINE[tag]
        if tag == "ACK":
            self._on_ack(run, parse_acks([line])[0])
        elif tag == "RESUME":
            agent, step = map(int, rest.split())
            self._on_resume(run, agent, step)
        elif tag == "RECOVERED":
            seconds, replayed, _records, torn = rest.split()
            run.recovery_s, run.replayed = float(seconds), int(replayed)
            torn_text = f", torn tail of {torn} bytes cut" if int(torn) else ""
            self.progress.event(f"run {run.number}: store opened, recovery {float(seconds) * 1000:.1f} ms, "
                                f"{replayed} records replayed{torn_text}")
        elif tag in ("STATS", "DONE"):
            run.stats = json.loads(rest)

    def _status(self, run: RunRecord, *, force: bool = False) -> None:
        done = len(self.acks)
        width = 24
        filled = width * done // self.total if self.total else width
        self.progress.status(
            f"run {run.number} | kills {self.kills_done}/{len(self.plans)} | "
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} steps acknowledged", force=force)

    # -- one run --

    def _spawn(self, number: int, plan: KillPlan | None, stderr: IO[bytes]) -> tuple[subprocess.Popen[str], RunRecord]:
        cmd = [sys.executable, "-m", "wal.drill.demo", "--worker", self.path, "--agents", str(self.cfg.agents),
               "--steps", str(self.cfg.steps), "--seed", str(self.cfg.seed),
               "--durability", self.level.level, "--rpo-ms", str(self.level.rpo_ms)]
        env = dict(os.environ)
        # The child imports the very `wal` this process runs, wherever it was imported from.
        root = os.path.dirname(os.path.dirname(os.path.abspath(wal.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                text=True, bufsize=1, env=env)
        return proc, RunRecord(number, proc.pid, plan, time.monotonic())

    def _kill_after_acks(self, plan: KillPlan) -> int:
        """Acknowledgements to wait for: a share of the steps left, leaving at least 2 x agents steps
        undone -- at >= 10 ms of think time per step, more than the kill's delay -- so that the
        worker cannot finish before the kill lands."""
        left = self.total - len(self.acks)
        kills_left = len(self.plans) - self.kills_done
        return max(1, min(int(left * plan.fraction / max(1, kills_left)), left - 2 * self.cfg.agents))

    def run_once(self, number: int) -> RunRecord:
        plan = self.plans[self.kills_done] if self.kills_done < len(self.plans) else None
        with tempfile.TemporaryFile() as stderr:
            proc, run = self._spawn(number, plan, stderr)
            try:
                self._drive(proc, run)
            finally:
                if proc.poll() is None:  # an exception on our side: do not leave the worker behind
                    proc.kill()
                    proc.wait()
            run.ended = time.monotonic()
            if run.outcome == "failed" or (run.returncode not in (0, -signal.SIGKILL)):
                stderr.seek(0)
                tail = stderr.read().decode(errors="replace").strip().splitlines()[-20:]
                run.outcome = "failed"
                self.failure = (f"run {number}: the worker (pid {run.pid}) exited with status {run.returncode}"
                                + ("".join(f"\n    {t}" for t in tail) if tail else ""))
        return run

    def _drive(self, proc: subprocess.Popen[str], run: RunRecord) -> None:
        assert proc.stdout is not None
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        plan = run.plan
        what = f"SIGKILL planned {_PHASE_TEXT[plan.mode]}" if plan else "no kill planned: runs to the end"
        self.progress.event(f"run {run.number}: worker pid {run.pid} started; {what}")
        kill_at = run.started + plan.delay_s if plan and plan.mode == "startup" else None
        ack_target = self._kill_after_acks(plan) if plan and plan.mode == "workflow" else None
        last_line = time.monotonic()
        killed_at: float | None = None
        while True:
            now = time.monotonic()
            if kill_at is not None and killed_at is None and now >= kill_at:
                killed_at = time.monotonic()
                proc.kill()  # SIGKILL
            wait = HANG_TIMEOUT_S - (now - last_line)
            if kill_at is not None and killed_at is None:
                wait = min(wait, kill_at - now)
            try:
                line = lines.get(timeout=max(0.0, wait))
            except queue.Empty:
                if time.monotonic() - last_line >= HANG_TIMEOUT_S:
                    proc.kill()
                    run.outcome = "failed"
                    self.progress.event(f"run {run.number}: no output for {HANG_TIMEOUT_S:.0f} s: worker hung")
                continue
            if line is None:
                break  # EOF: the worker is gone (or closed stdout); every line it wrote has been read
            last_line = time.monotonic()
            self._on_line(run, line)
            if plan and killed_at is None and kill_at is None:
                opening = plan.mode == "recovery" and line.startswith("OPENING")
                enough = plan.mode == "workflow" and ack_target is not None and run.acked >= ack_target
                if opening or enough:
                    kill_at = time.monotonic() + plan.delay_s
            self._status(run)
        run.returncode = proc.wait()
        if run.outcome == "failed":
            return
        if run.returncode == -signal.SIGKILL and killed_at is not None:
            run.outcome = "killed"
            self.kills_done += 1
            if self.level.level == "buffered":  # these may be lost: the level allows it
                window = killed_at - self.level.rpo_ms / 1000
                self.at_risk.update(k for k, a in self.acks.items()
                                    if self.ack_run[k] == run.number and a.t > window)
            self.progress.event(
                f"run {run.number}: SIGKILL at {killed_at - run.started:.2f} s, landed {_PHASE_TEXT[run.phase]}; "
                f"{run.acked} steps acknowledged in this run, {len(self.acks)}/{self.total} in all")
        elif run.returncode == 0:
            run.outcome = "finished"
            late = " (it finished before the planned kill)" if plan else ""
            self.progress.event(f"run {run.number}: finished at {time.monotonic() - run.started:.2f} s{late}; "
                                f"{run.acked} steps acknowledged in this run, {len(self.acks)}/{self.total} in all")
        else:
            run.outcome = "failed"  # died of something other than our SIGKILL
        self._status(run, force=True)

    def run_all(self) -> bool:
        """Run workers until one finishes; False when a worker failed (see `failure`)."""
        number = 0
        while True:
            number += 1
            run = self.run_once(number)
            self.runs.append(run)
            if run.outcome == "failed":
                return False
            if run.outcome == "finished":
                return True


# ---- the report --------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _report(sup: _Supervisor, check: CheckResult, final_open: dict[str, Any], out: TextIO) -> None:
    rows = [["run", "ended", "after", "recovery", "replayed", "resumed at", "acked", "commits", "fsyncs", "group"]]
    for r in sup.runs:
        ended = {"killed": f"SIGKILL {_PHASE_TEXT[r.phase]}", "finished": "finished all steps"}.get(
            r.outcome, r.outcome)
        st = r.stats
        rows.append([str(r.number), ended, f"{r.ended - r.started:.2f} s", _ms(r.recovery_s),
                     "-" if r.replayed is None else str(r.replayed), "-" if r.resumed is None else str(r.resumed),
                     str(r.acked), str(st.get("commits", "-")), str(st.get("fsyncs", "-")),
                     f"{st['group_size_mean']:.2f}" if st.get("fsyncs") else "-"])
    rows.append(["check", "the checker's own wal.open", "", _ms(final_open.get("recovery_seconds")),
                 str(final_open.get("records_replayed", "-")), str(check.steps_in_store), "", "", "", ""])
    out.write("\n" + "\n".join(_table(rows, right={0, 2, 3, 4, 5, 6, 7, 8, 9})) + "\n")
    out.write("(commits/fsyncs of a killed run: the worker's last report before the kill, every "
              f"{STATS_INTERVAL_S:g} s)\n\n")
    commits = sum(int(r.stats.get("commits", 0)) for r in sup.runs)
    fsyncs = sum(int(r.stats.get("fsyncs", 0)) for r in sup.runs)
    synced = sum(float(r.stats.get("group_size_mean", 0)) * int(r.stats.get("fsyncs", 0)) for r in sup.runs)
    recoveries = [r.recovery_s for r in sup.runs[1:] if r.recovery_s is not None]
    replayed = [r.replayed for r in sup.runs[1:] if r.replayed is not None]
    cfg = sup.cfg
    n = check.steps_in_store - check.acknowledged
    unacked = (f"; {n} of them committed, but the worker was killed before printing their ACK"
               if n > 0 else "")
    lines = [
        ("steps completed", f"{check.steps_in_store} of {check.steps_expected} "
                            f"({cfg.agents} agents x {cfg.steps} steps)" + unacked),
        ("runs", f"{len(sup.runs)}: {sup.kills_done} killed with SIGKILL, then 1 to the end"),
        ("commits", f"{commits}"),
        ("fsyncs", f"{fsyncs}"),
        ("mean group size", f"{synced / fsyncs:.2f} commits per fsync" if fsyncs else "-"),
        ("recovery time", (f"mean {_ms(sum(recoveries) / len(recoveries))}, max {_ms(max(recoveries))} "
                           f"over {len(recoveries)} restarts that reached it; records replayed "
                           f"{min(replayed)}..{max(replayed)}") if recoveries and replayed else "-"),
        ("idempotent hits", f"{sup.dup_acks} (a retried step returned the first commit)"),
    ]
    if sup.level.level == "buffered":
        lines.append(("lost within RPO", f"{check.lost_within_rpo} acknowledged steps lost to a kill within "
                                         f"rpo_ms={sup.level.rpo_ms} (allowed at buffered), then redone"))
    lines.append(("check", "every acknowledged step present at the LSN it was acknowledged at; messages and\n"
                           "tool results exactly steps 1..counter, each built on the step before; no step\n"
                           "acknowledged twice; the content each step's workflow produces"))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        out.write(k.ljust(width) + "  " + v.replace("\n", "\n" + " " * (width + 2)) + "\n")
    out.write("\n")


# ---- entry point -------------------------------------------------------------------------------------


def run_demo(directory: str | None = None, *, agents: int = 8, kills: int = 5, steps: int = 60,
             seed: int | None = None, durability: str | None = None, rpo_ms: int | None = None,
             out: TextIO | None = None, tty: bool | None = None) -> int:
    """Run the demo (the module docstring says what it does) and print its report to `out`.

    Returns 0 when the check passed, 1 when it failed or a worker failed. Raises `DemoError`
    when `directory` exists and is not empty, `wal.ArgumentError` for a bad durability setting
    or out-of-range counts. `seed` None: a random seed, printed so the run can be repeated.
    `tty` None: a status line redrawn in place when `out` is a terminal, plain lines otherwise.
    """
    out = out if out is not None else sys.stdout
    level = dur.parse(durability, rpo_ms)
    if not 1 <= agents <= MAX_AGENTS:
        raise wal.ArgumentError(f"agents must be 1..{MAX_AGENTS}, got {agents}")
    if not 1 <= steps <= MAX_STEPS:
        raise wal.ArgumentError(f"steps must be 1..{MAX_STEPS}, got {steps}")
    if kills < 0:
        raise wal.ArgumentError(f"kills must be >= 0, got {kills}")
    if seed is None:
        seed = random.SystemRandom().randrange(1, 1_000_000)
    if directory is None:
        path = tempfile.mkdtemp(prefix="agentwal-demo-")
        where = f"{path} (a new temporary directory; it is kept, remove it when done)"
    else:
        path = os.path.abspath(directory)
        if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
            raise DemoError(f"{path} exists and is not an empty directory; the demo needs a fresh one "
                            "(or give no DIR for a temporary directory)")
        os.makedirs(path, exist_ok=True)
        where = path
    if tty is None:
        tty = out.isatty() and os.environ.get("TERM") != "dumb"
    cfg = DemoConfig(agents, steps, seed, level.level, level.rpo_ms)
    rpo = f" (rpo_ms={level.rpo_ms})" if level.level != "sync" else ""
    out.write(f"agentwal demo: {agents} agents x {steps} steps, durability {level.level}{rpo}, {kills} kills, "
              f"seed {seed}\nstore: {where}\n\n")
    out.flush()
    progress = _Progress(out, tty)
    sup = _Supervisor(path, cfg, level, kill_plans(random.Random(seed), kills), progress)
    try:
        finished = sup.run_all()
    finally:
        progress.clear()
    if not finished:
        out.write(f"\nDEMO FAILED: {sup.failure}\n")
        return 1
    acks = list(sup.acks.values())
    with wal.open(path) as store:
        final_open = store.stats()
        check = verify_store(store, acks)
    check.lost[:0] = sup.lost
    check.applied_twice[:0] = sup.applied_twice
    check.lost_within_rpo = sup.lost_within_rpo
    _report(sup, check, final_open, out)
    findings = check.findings()
    for line in findings[:20]:
        out.write(f"  {line}\n")
    if len(findings) > 20:
        out.write(f"  ... and {len(findings) - 20} more\n")
    verdict = check.verdict()
    if tty and "NO_COLOR" not in os.environ:
        verdict = ("\x1b[1;32m" if check.ok else "\x1b[1;31m") + verdict + "\x1b[0m"
    out.write(verdict + "\n")
    out.flush()
    return 0 if check.ok else 1



if __name__ == "__main__":
    raise SystemExit(worker_main())
