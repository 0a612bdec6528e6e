"""Contended read-modify-write on one hot key, side by side, in one run.

    python benchmarks/rmw.py                 # 3 s per system and concurrency
    python benchmarks/rmw.py --seconds 1 --out /tmp/rmw

Every system increments one counter as many times as it can from N threads (and, for agentwal,
from 1,000 asyncio tasks), each increment durable before it returns:

- agentwal `Store.update` at sync: reads the newest version, in flight included, and commits
  with an if_version check, retrying on conflict (increments share fdatasyncs);
- agentwal, the loop a user writes: `version()` and `get()`, then a transaction with
  `if_version`, retrying on `ConflictError` (raised once the conflicting commit is visible);
- LMDB (py-lmdb, `sync=True`): one write transaction per increment (writers queue on LMDB's lock);
- SQLite WAL `synchronous=FULL`: `BEGIN IMMEDIATE`, read, write, `COMMIT`, a connection per thread.

Reported: increments/s, ConflictErrors per successful increment, and the ratio to the best peer.
The counter's final value is checked against the increments counted. Never a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import wal

KEY = b"counter"


def _bump(v: bytes | None) -> bytes:
    return b"%d" % (int(v or b"0") + 1)


def run_threads(n: int, seconds: float, one: Callable[[], int]) -> tuple[int, int, float]:
    """Call `one` (an increment; returns the conflicts it met) from n threads for `seconds`;
    (increments, conflicts, elapsed)."""
    stop = threading.Event()
    counts = [[0, 0] for _ in range(n)]

    def work(i: int) -> None:
        while not stop.is_set():
            counts[i][1] += one()
            counts[i][0] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(c[0] for c in counts), sum(c[1] for c in counts), time.perf_counter() - start


def agentwal_update(d: str, n: int, seconds: float) -> dict[str, Any]:
    with wal.open(d) as store:
        done, _, el = run_threads(n, seconds, lambda: (store.update(KEY, _bump, retries=10_000), 0)[1])
        conflicts = store.stats()["conflicts"]
        assert int(store.get(KEY)) == done
    return {"increments": done, "conflicts": conflicts, "seconds": el}


def agentwal_user_loop(d: str, n: int, seconds: float) -> dict[str, Any]:
    with wal.open(d) as store:
        def one() -> int:
            conflicts = 0
            while True:
                version = store.version(KEY)
                value = store.get(KEY)
                try:
                    with store.transaction() as tx:
                        tx.put(KEY, _bump(value), if_version=version or 0)
                    return conflicts
                except wal.ConflictError:
                    conflicts += 1
        done, conflicts, el = run_threads(n, seconds, one)
        assert int(store.get(KEY)) == done
    return {"increments": done, "conflicts": conflicts, "seconds": el}


def agentwal_tasks(d: str, n: int, seconds: float) -> dict[str, Any]:
    async def main(store: wal.Store) -> tuple[int, float]:
        stop = asyncio.Event()
        done = 0

        async def task() -> None:
            nonlocal done
            while not stop.is_set():
                await store.aupdate(KEY, _bump, retries=10_000)
                done += 1

        start = time.perf_counter()
        tasks = [asyncio.create_task(task()) for _ in range(n)]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
        return done, time.perf_counter() - start

    with wal.open(d) as store:
        done, el = asyncio.run(main(store))
        conflicts = store.stats()["conflicts"]
        assert int(store.get(KEY)) == done
    return {"increments": done, "conflicts": conflicts, "seconds": el}


def lmdb_txn(d: str, n: int, seconds: float) -> dict[str, Any]:
    import lmdb
    env = lmdb.open(d, map_size=1 << 30, sync=True, metasync=True, max_readers=256)

    def one() -> int:
        with env.begin(write=True) as txn:
            txn.put(KEY, _bump(txn.get(KEY)))
        return 0

    done, _, el = run_threads(n, seconds, one)
    with env.begin() as txn:
        assert int(txn.get(KEY)) == done
    env.close()
    return {"increments": done, "conflicts": 0, "seconds": el}


def sqlite_immediate(d: str, n: int, seconds: float) -> dict[str, Any]:
    path = os.path.join(d, "db.sqlite")
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
    setup.close()
    local = threading.local()

    def one() -> int:
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = sqlite3.connect(path, isolation_level=None, timeout=60, check_same_thread=False)
            c.execute("PRAGMA synchronous=FULL")
        c.execute("BEGIN IMMEDIATE")
        row = c.execute("SELECT v FROM kv WHERE k = ?", (KEY,)).fetchone()
        c.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (KEY, _bump(row[0] if row else None)))
        c.execute("COMMIT")
        return 0

    done, _, el = run_threads(n, seconds, one)
    check = sqlite3.connect(path)
    assert int(check.execute("SELECT v FROM kv WHERE k = ?", (KEY,)).fetchone()[0]) == done
    check.close()
    return {"increments": done, "conflicts": 0, "seconds": el}


SYSTEMS: list[tuple[str, str, Callable[[str, int, float], dict[str, Any]]]] = [
    ("agentwal-update", "agentwal Store.update (sync)", agentwal_update),
    ("agentwal-loop", "agentwal get/version + if_version loop (sync)", agentwal_user_loop),
    ("lmdb", "LMDB, a write txn per increment (sync=True)", lmdb_txn),
    ("sqlite", "SQLite WAL FULL, BEGIN IMMEDIATE", sqlite_immediate),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="per system and concurrency (default 3)")
    ap.add_argument("--threads", default="8,64", help="thread counts (default 8,64)")
    ap.add_argument("--tasks", type=int, default=1000, help="asyncio tasks for agentwal's aupdate (0: skip)")
    ap.add_argument("--out", default=None, help="write results.md and results.json here")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for n in (int(x) for x in args.threads.split(",")):
        for system, label, fn in SYSTEMS:
            with tempfile.TemporaryDirectory() as d:
                r = fn(d, n, args.seconds)
            rows.append({"system": system, "label": label, "concurrency": f"{n} threads", **r})
            print(f"{n:>4} threads  {label:48s} {r['increments'] / r['seconds']:>10,.0f}/s", flush=True)
    if args.tasks:
        with tempfile.TemporaryDirectory() as d:
            r = agentwal_tasks(d, args.tasks, args.seconds)
        rows.append({"system": "agentwal-aupdate", "label": "agentwal Store.aupdate (sync)",
                     "concurrency": f"{args.tasks} asyncio tasks", **r})
        print(f"{args.tasks} tasks  agentwal Store.aupdate {r['increments'] / r['seconds']:>10,.0f}/s", flush=True)
    for r in rows:
        r["per_s"] = r["increments"] / r["seconds"]
        r["conflicts_per_success"] = r["conflicts"] / max(1, r["increments"])
    best_peer = max((r["per_s"] for r in rows if r["system"] in ("lmdb", "sqlite")), default=0.0)
    lines = ["# Contended read-modify-write on one key (durable increments)", "",
             f"{args.seconds} s per row; ratio: to the best of LMDB and SQLite at any concurrency in this run.",
             "", "| concurrency | system | increments/s | conflicts per success | × best peer |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        ratio = r["per_s"] / best_peer if best_peer else float("nan")
        lines.append(f"| {r['concurrency']} | {r['label']} | {r['per_s']:,.0f} | {r['conflicts_per_success']:.2f} "
                     f"| {ratio:.2f}× |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"rows": rows, "seconds": args.seconds, "python": sys.version}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
