#!/usr/bin/env python3
# ruff: noqa: PLC0415  (each peer is imported where it is used: a missing one is skipped with a note)
"""The integrations side by side with their peers in one run.

    python benchmarks/integrations.py [--steps 200] [--msg-bytes 2048] [--out DIR] [--no-postgres]

(1) LangGraph: a real compiled graph -- one node in a loop, each step appending one message
    of --msg-bytes bytes to a ``MessagesState`` (LangChain ``AIMessage`` through
    ``add_messages``) -- run with ``durability="sync"`` (every step's checkpoint saved before
    the next starts) on ``InMemorySaver``, ``SqliteSaver`` (WAL, ``synchronous=FULL`` and
    ``NORMAL``), ``PostgresSaver`` (a PostgreSQL server started here on 127.0.0.1 in a temp
    directory, fsync on, when Debian's ``postgresql`` binaries are installed; skipped with a
    note otherwise) and ``AgentwalSaver`` on stores at ``sync`` and at ``interval`` (rpo_ms=100).
(2) OpenAI Agents SDK: a conversation of --steps turns, each the Runner's session traffic
    (``get_items()`` then ``add_items([user, assistant])``, both messages of --msg-bytes
    bytes), on ``SQLiteSession`` (the SDK's defaults: WAL, ``synchronous=FULL``) and
    ``AgentwalSession`` at ``sync`` and ``interval``.

Per system: steps/s (steps over the wall time of the whole run), p50/p99 of one step (for the
graph, the time between the node's successive calls: one superstep with its checkpoint), and
bytes on disk after closing (allocated blocks, ``du``; agentwal's log segments are
preallocated, so the log's written bytes are given beside them; PostgreSQL: the database's
size growth, ``pg_database_size``, without its WAL). Then the saver's own share of a step
(the time inside the saver's methods, measured by wrapping them, over the wall time) and a
cProfile of the agentwal ``sync`` graph run, whose top entries go into the results.

Output in --out (default ``benchmarks/results/integrations-<timestamp>/``): results.json
and results.md, with the ratios to SqliteSaver FULL (and to PostgresSaver) and the
goal (agentwal ``sync`` >= 2x SqliteSaver FULL, and ahead of PostgresSaver) marked MET or
NOT MET. One run of each system, interleaved over --rounds rounds (the median round is
reported), so a change of the machine's load hits all alike. Compare ratios within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime as dt
import io
import itertools
import json
import os
import platform
import pstats
import random
import shutil
import socket
import sqlite3
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph

GOAL_VS_SQLITE_FULL = 2.0
READS = 100  # get_tuple / get_items calls timed one at a time after each run


def du(path: Path) -> int:
    """Allocated bytes under path (st_blocks), as du reports."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


# ---- PostgreSQL, started here ----------------------------------------------------------------------


class Postgres:
    """A throwaway PostgreSQL server on 127.0.0.1 (fsync and synchronous_commit on, the defaults)."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "pg"
        self.port = 0
        self.note = ""
        self._bin: Path | None = None
        self._run_as: list[str] = []

    def start(self) -> bool:
        try:
            import psycopg  # noqa: F401
            from langgraph.checkpoint.postgres import PostgresSaver  # noqa: F401
        except ImportError as exc:
            self.note = (f"skipped: {exc.name} is not installed "
                         "(pip install langgraph-checkpoint-postgres 'psycopg[binary]')")
            return False
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        initdb = Path(found[-1]) if found else (Path(shutil.which("initdb")) if shutil.which("initdb") else None)
        if initdb is None:
            self.note = "skipped: no PostgreSQL server binaries (apt-get install -y postgresql)"
            return False
        self._bin = initdb.parent
        self.dir.mkdir(parents=True)
        run_as: list[str] = []
        if os.geteuid() == 0:  # the server refuses to run as root: use Debian's postgres user
            try:
                import pwd
                pw = pwd.getpwnam("postgres")
            except KeyError:
                self.note = "skipped: running as root and there is no 'postgres' user to run the server"
                return False
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            os.chmod(self.dir.parent, 0o755)
            run_as = ["runuser", "-u", "postgres", "--"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._run_as = run_as
        try:
            subprocess.run([*run_as, str(self._bin / "initdb"), "-D", str(self.dir / "data"), "-A", "trust",
                                     "-U", "postgres", "--no-sync"], check=True, capture_output=True, timeout=120)
            subprocess.run([*run_as, str(self._bin / "pg_ctl"), "-D", str(self.dir / "data"), "-w", "-l",
                                     str(self.dir / "log"), "-o",
                                     f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}",
                                     "start"], check=True, capture_output=True, timeout=120)
        except (subprocess.SubprocessError, OSError) as exc:
            self.note = f"skipped: the server did not start ({exc})"
            return False
        return True

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def fresh_db(self, name: str) -> str:
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def db_size(self, url: str) -> int:
        import psycopg
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
            return int(row[0]) if row else 0

    def stop(self) -> None:
        if self._bin is not None and (self.dir / "data" / "postmaster.pid").exists():
            subprocess.run([*self._run_as, str(self._bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast",
                                           "stop"], capture_output=True, timeout=120, check=False)


# ---- LangGraph ---------------------------------------------------------------------------------


class SaverTimer:
    """Wraps a saver's methods to measure the time spent inside them (the saver's own share):
    LangGraph calls them from its executor threads, sometimes two at once, so the share is the
    union of the calls' intervals over the wall time. With profile=True each call also runs
    under its own cProfile (cProfile sees one thread; this follows the saver into LangGraph's
    worker threads), and `stats()` merges them."""

    METHODS = ("put", "put_writes", "get_tuple", "list")

    def __init__(self, saver: Any, profile: bool = False) -> None:
        self.spans: list[tuple[float, float]] = []
        self.calls: dict[str, int] = {}
        self.profiles: list[cProfile.Profile] = []
        self._profile = profile
        self._lock = threading.Lock()
        for name in self.METHODS:
            orig = getattr(saver, name, None)
            if orig is not None:
                setattr(saver, name, self._wrap(name, orig))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            prof = cProfile.Profile() if self._profile else None
            t0 = time.perf_counter()
            try:
                if prof is not None:
                    return prof.runcall(fn, *a, **k)
                return fn(*a, **k)
            finally:
                t1 = time.perf_counter()
                with self._lock:
                    self.spans.append((t0, t1))
                    self.calls[name] = self.calls.get(name, 0) + 1
                    if prof is not None:
                        self.profiles.append(prof)
        return timed

    @property
    def total(self) -> float:
        """The union of the calls' intervals, in seconds."""
        busy, end = 0.0, float("-inf")
        for a, b in sorted(self.spans):
            if b > end:
                busy += b - max(a, end)
                end = b
        return busy

    def stats(self) -> pstats.Stats | None:
        if not self.profiles:
            return None
        st = pstats.Stats(self.profiles[0])
        for p in self.profiles[1:]:
            st.add(p)
        return st


def texts(n: int, size: int) -> list[str]:
    """n distinct messages of `size` bytes of random letters and spaces (made before the clock
    starts): text that neither PostgreSQL's TOAST compression nor anyone else shrinks to nothing,
    as a run of one repeated letter would be."""
    rng = random.Random(26)
    alphabet = string.ascii_letters + "      "
    return ["".join(rng.choices(alphabet, k=size)) for _ in range(n)]


def build_graph(saver: Any, steps: int, msg_bytes: int, marks: list[float]) -> Any:
    bodies = texts(steps, msg_bytes)

    def step(state: MessagesState) -> dict[str, Any]:
        marks.append(time.perf_counter())
        n = len(state["messages"])
        return {"messages": [AIMessage(content=bodies[n], id=f"m{n}")]}

    def route(state: MessagesState) -> str:
        return "step" if len(state["messages"]) < steps else END

    g = StateGraph(MessagesState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", route)
    return g.compile(checkpointer=saver)


@contextlib.contextmanager
def lg_saver(kind: str, where: Path, pg: Postgres | None) -> Iterator[tuple[Any, Callable[[], dict[str, int]]]]:
    """(saver, a function giving the bytes on disk once closed)."""
    if kind == "InMemorySaver":
        from langgraph.checkpoint.memory import InMemorySaver
        yield InMemorySaver(), lambda: {"disk": 0}
    elif kind.startswith("SqliteSaver"):
        from langgraph.checkpoint.sqlite import SqliteSaver
        conn = sqlite3.connect(where / "cp.sqlite", check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()  # sets journal_mode=WAL
        conn.execute(f"PRAGMA synchronous={'FULL' if kind.endswith('FULL') else 'NORMAL'}")
        try:
            yield saver, lambda: {"disk": du(where)}
        finally:
            conn.close()
    elif kind == "PostgresSaver":
        from langgraph.checkpoint.postgres import PostgresSaver
        assert pg is not None
        url = pg.fresh_db("bench_" + where.name.replace("-", "_"))
        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
            size0 = pg.db_size(url)
            yield saver, lambda: {"disk": pg.db_size(url) - size0}
    else:
        from wal.integrations.langgraph import AgentwalSaver
        kw: dict[str, Any] = {"durability": "sync"} if kind.endswith("sync") else {"durability": "interval",
                                                                                    "rpo_ms": 100}
        written: dict[str, int] = {}
        with AgentwalSaver.from_conn_string(where / "db", **kw) as saver:
            yield saver, lambda: {"disk": du(where), "log_written": written.get("log", 0),
                                  "log_fsyncs": written.get("fsyncs", 0)}
            st = saver.store.stats()
            written["log"] = int(st.get("bytes_written", 0))
            written["fsyncs"] = int(st.get("fsyncs", 0))


def run_graph(kind: str, where: Path, steps: int, msg_bytes: int, pg: Postgres | None, *,
              profile: bool = False) -> dict[str, Any]:
    where.mkdir(parents=True)
    marks: list[float] = []
    with lg_saver(kind, where, pg) as (saver, disk):
        timer = SaverTimer(saver, profile=profile)
        graph = build_graph(saver, steps, msg_bytes, marks)
        cfg = {"configurable": {"thread_id": "bench"}, "recursion_limit": steps + 10}
        t0 = time.perf_counter()
        out = graph.invoke({"messages": []}, cfg, durability="sync")
        wall = time.perf_counter() - t0
        share = timer.total
        calls = dict(timer.calls)  # the graph's calls, before the reads timed below
        assert len(out["messages"]) == steps, len(out["messages"])
        if kind != "InMemorySaver":  # a real round trip: the latest state comes back from the saver
            assert len(graph.get_state({"configurable": {"thread_id": "bench"}}).values["messages"]) == steps
        # The read an agent's step starts with: the thread's latest checkpoint, its channel
        # values (here every message of the run) and its pending writes, one call at a time.
        reads: list[float] = []
        if not profile:
            latest = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
            for _ in range(READS):
                t = time.perf_counter()
                got = saver.get_tuple(latest)
                reads.append(time.perf_counter() - t)
            assert got is not None
    step_s = [b - a for a, b in itertools.pairwise(marks)]
    res: dict[str, Any] = {
        "system": kind, "steps": steps, "wall_s": wall, "steps_per_s": steps / wall,
        "p50_ms": pct(step_s, 0.5) * 1e3, "p99_ms": pct(step_s, 0.99) * 1e3,
        "saver_s": share, "saver_share": share / wall, "saver_calls": calls,
    }
    if reads:
        res["get_tuple_us"] = statistics.median(reads) * 1e6
    res.update(disk())
    st = timer.stats()
    if st is not None:
        buf = io.StringIO()
        st.stream = buf  # type: ignore[attr-defined]
        st.sort_stats("tottime").print_stats(30)
        text = buf.getvalue()
        for prefix in sorted({sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[1])}, key=len,
                             reverse=True):
            text = text.replace(prefix + os.sep, "")
        res["profile_top"] = text
    return res


# ---- OpenAI Agents SDK sessions -----------------------------------------------------------------


def run_session(kind: str, where: Path, steps: int, msg_bytes: int) -> dict[str, Any]:
    where.mkdir(parents=True)
    bodies = texts(2 * steps, msg_bytes)

    async def conversation(session: Any) -> tuple[list[float], list[float]]:
        lat = []
        for i in range(steps):
            t = time.perf_counter()
            await session.get_items()
            await session.add_items([{"role": "user", "content": bodies[2 * i]},
                                     {"role": "assistant", "content": bodies[2 * i + 1]}])
            lat.append(time.perf_counter() - t)
        assert len(await session.get_items()) == 2 * steps
        reads = []  # the read a turn starts with, of the whole conversation, one call at a time
        for _ in range(READS):
            t = time.perf_counter()
            await session.get_items()
            reads.append(time.perf_counter() - t)
        return lat, reads

    if kind == "SQLiteSession":
        from agents import SQLiteSession
        session: Any = SQLiteSession("bench", where / "conv.sqlite")
    else:
        from wal.integrations.openai_agents import AgentwalSession
        session = AgentwalSession("bench", where / "db", **({} if kind.endswith("sync") else {"rpo_ms": 100}))
    t0 = time.perf_counter()
    try:
        lat, reads = asyncio.run(conversation(session))
    finally:
        wall = time.perf_counter() - t0
        session.close()
    return {"system": kind, "steps": steps, "wall_s": wall, "steps_per_s": steps / wall,
            "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "disk": du(where),
            "get_items_us": statistics.median(reads) * 1e6}


# ---- the run -----------------------------------------------------------------------------------


def median_round(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = sorted(rows, key=lambda r: r["steps_per_s"])
    out = dict(rows[len(rows) // 2])
    out["rounds_steps_per_s"] = [round(r["steps_per_s"], 1) for r in rows]
    return out


def table(rows: list[dict[str, Any]], base: str, extra: str | None = None) -> list[str]:
    by = {r["system"]: r for r in rows}
    head = f"| system | steps/s | x {base} |" + (f" x {extra} |" if extra in by else "") + \
        " p50 ms | p99 ms | disk | saver share |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        name = f"**{r['system']}**" if r["system"].startswith("Agentwal") else r["system"]
        x = r["steps_per_s"] / by[base]["steps_per_s"] if base in by else float("nan")
        cells = [name, f"{r['steps_per_s']:.0f}", f"{x:.2f}"]
        if extra in by:
            cells.append(f"{r['steps_per_s'] / by[extra]['steps_per_s']:.2f}")
        disk = f"{r['disk'] / 1e6:.1f} MB"
        if r.get("log_written"):
            disk += f" (log written {r['log_written'] / 1e6:.1f} MB, {r.get('log_fsyncs', 0):,} fdatasyncs)"
        share = f"{r['saver_share'] * 100:.0f}%" if "saver_share" in r else "-"
        cells += [f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", disk, share]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--msg-bytes", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tmpdir", default=None)
    ap.add_argument("--no-postgres", action="store_true", help="do not start a PostgreSQL server")
    ap.add_argument("--no-sessions", action="store_true")
    args = ap.parse_args(argv)

    out = Path(args.out or Path(__file__).parent / "results" /
               f"integrations-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="agentwal-integrations-", dir=args.tmpdir))
    notes: list[str] = []
    pg: Postgres | None = None
    graph_kinds = ["InMemorySaver", "SqliteSaver FULL", "SqliteSaver NORMAL", "AgentwalSaver sync",
                   "AgentwalSaver interval"]
    session_kinds = [] if args.no_sessions else ["SQLiteSession", "AgentwalSession sync", "AgentwalSession interval"]
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
    except ImportError:
        graph_kinds = [k for k in graph_kinds if not k.startswith("SqliteSaver")]
        notes.append("SqliteSaver skipped: pip install langgraph-checkpoint-sqlite")
    if args.no_postgres:
        notes.append("PostgresSaver skipped: --no-postgres")
    else:
        pg = Postgres(base)
        if pg.start():
            graph_kinds.insert(3, "PostgresSaver")
        else:
            notes.append(f"PostgresSaver {pg.note}")
            pg = None
    try:
        graph_rows: dict[str, list[dict[str, Any]]] = {k: [] for k in graph_kinds}
        session_rows: dict[str, list[dict[str, Any]]] = {k: [] for k in session_kinds}
        n = 0
        for r in range(args.rounds):
            for kind in graph_kinds:
                n += 1
                graph_rows[kind].append(run_graph(kind, base / f"g{n}", args.steps, args.msg_bytes, pg))
                print(f"round {r}: graph {kind}: {graph_rows[kind][-1]['steps_per_s']:.0f} steps/s", file=sys.stderr)
            for kind in session_kinds:
                n += 1
                session_rows[kind].append(run_session(kind, base / f"s{n}", args.steps, args.msg_bytes))
                print(f"round {r}: session {kind}: {session_rows[kind][-1]['steps_per_s']:.0f} steps/s",
                      file=sys.stderr)
        graphs = [median_round(v) for v in graph_rows.values()]
        sessions = [median_round(v) for v in session_rows.values()]
        profiled = run_graph("AgentwalSaver sync", base / "profiled", args.steps, args.msg_bytes, pg, profile=True)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)

    by = {r["system"]: r for r in graphs}
    goals = []

    def per_round(peer: str) -> list[float]:
        """agentwal sync over `peer` in each round (the two ran next to each other: the same load)."""
        return [a["steps_per_s"] / b["steps_per_s"]
                for a, b in zip(graph_rows["AgentwalSaver sync"], graph_rows[peer], strict=True)]

    if "SqliteSaver FULL" in by:
        xs = per_round("SqliteSaver FULL")
        x = statistics.median(xs)
        goals.append({"what": "AgentwalSaver sync >= 2x SqliteSaver FULL (steps/s, median of the rounds' ratios)",
                      "ratio": x, "rounds": xs, "status": "MET" if x >= GOAL_VS_SQLITE_FULL else "NOT MET"})
    if "PostgresSaver" in by:
        xs = per_round("PostgresSaver")
        x = statistics.median(xs)
        goals.append({"what": "AgentwalSaver sync ahead of PostgresSaver (steps/s, median of the rounds' ratios)",
                      "ratio": x, "rounds": xs, "status": "MET" if x > 1 else "NOT MET"})
    else:
        goals.append({"what": "AgentwalSaver sync ahead of PostgresSaver (steps/s)", "ratio": None,
                      "status": "n/a", "detail": "PostgresSaver not measured"})
    machine = {"python": sys.version.split()[0], "platform": platform.platform(), "cores": os.cpu_count(),
               "load": os.getloadavg(), "steps": args.steps, "msg_bytes": args.msg_bytes, "rounds": args.rounds}
    for dist in ("langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres", "openai-agents",
                 "psycopg"):
        with contextlib.suppress(Exception):
            import importlib.metadata
            machine[dist] = importlib.metadata.version(dist)
    result = {"machine": machine, "graph": graphs, "sessions": sessions, "goals": goals, "notes": notes,
              "profile": {k: v for k, v in profiled.items() if k != "profile_top"},
              "profile_top": profiled.get("profile_top", "")}
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    md = [f"# Integrations side by side ({args.steps} steps, {args.msg_bytes}-byte messages, median of "
          f"{args.rounds} interleaved rounds)", "", f"Machine: {json.dumps(machine)}", "",
          "## LangGraph graph, durability=\"sync\"", ""]
    md += table(graphs, "SqliteSaver FULL", "PostgresSaver")
    if sessions:
        md += ["", "## OpenAI Agents SDK session (get_items + add_items of 2 items per turn)", ""]
        md += table(sessions, "SQLiteSession")
    md += ["", f"## Reads side by side: one call on the finished run, median of {READS} calls", "",
           "| system | LangGraph get_tuple (latest checkpoint, its values and writes) |", "|---|---:|"]
    md += [f"| {r['system']} | {r['get_tuple_us']:,.0f} µs |" for r in graphs if "get_tuple_us" in r]
    if sessions:
        md += ["", f"| system | OpenAI Agents get_items ({2 * args.steps} items) |", "|---|---:|"]
        md += [f"| {r['system']} | {r['get_items_us']:,.0f} µs |" for r in sessions]
    md += ["", "## Goals", ""] + [
        f"- {g['what']}: " + (f"{g['ratio']:.2f}x " if g["ratio"] else "") + g["status"]
        + (f" (rounds: {', '.join(f'{r:.2f}' for r in g['rounds'])})" if g.get("rounds") else "")
        for g in goals]
    md += ["", "## The saver's own share of a step (AgentwalSaver sync)", "",
           f"- timed by wrapping its methods: {by['AgentwalSaver sync']['saver_share'] * 100:.0f}% of the wall time "
           f"({by['AgentwalSaver sync']['saver_s'] * 1e3 / args.steps:.3f} ms a step; calls "
           f"{by['AgentwalSaver sync']['saver_calls']})",
           "- where the saver's calls spend their time (cProfile of each call, merged, by own time; a "
           "separate run, since cProfile slows Python code):", "", "```",
           profiled.get("profile_top", "").strip()[:6000], "```"]
    if notes:
        md += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    (out / "results.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))
    print(f"\nwritten to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
