"""Space and memory under sustained updates: agentwal at each level next to LMDB, RocksDB and SQLite.

The workload: `--threads` threads overwrite `--keys` keys of `--value-bytes` bytes,
each thread cycling through its own share of the keys, for `--seconds`. Every `--sample`
seconds the bytes allocated on disk by everything in the store's directory (st_blocks: log,
state, WAL, SST files alike) and the process's RSS (anonymous and file-backed: mapped segments,
the LMDB map) are recorded. Each system runs in a child process of its own, so its RSS is its
own, one after the other in one run. Reported per system: puts and puts/s, the live data
(keys x (key + value bytes)), allocated bytes and their ratio to the live data at the end and
at their highest once every key has been written, RSS, and for agentwal the state's back-pressure.

    python benchmarks/space.py --quick            # 100,000 keys, 30 s per system (a few minutes)
    python benchmarks/space.py                    # 800,000 x 1 KiB keys, 60 s per system
    python benchmarks/space.py --full             # the long check: 800,000 keys, 10 minutes per system

Writes space.json and space.png (allocated bytes and RSS over time; matplotlib) into --out.
A benchmark, never a timed test: figures vary with the machine and what else runs on it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

SYSTEMS = ("agentwal-interval", "agentwal-buffered", "agentwal-sync", "agentwal-interval+compact", "lmdb", "rocksdb",
           "sqlite")
PROFILES = {
    "quick": {"keys": 100_000, "seconds": 30.0, "sample": 2.0},
    "default": {"keys": 800_000, "seconds": 60.0, "sample": 5.0},
    "full": {"keys": 800_000, "seconds": 600.0, "sample": 10.0},
}


def allocated_bytes(path: str) -> int:
    """Bytes the filesystem allocated to every file under path (st_blocks x 512)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # deleted while we walked (a segment, an SST file)
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def rss() -> dict[str, int]:
    """This process's resident set, bytes: total, anonymous, file-backed (/proc/self/status)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                out[name] = int(rest.split()[0]) * 1024
    return {"rss": out.get("VmRSS", 0), "rss_anon": out.get("RssAnon", 0), "rss_file": out.get("RssFile", 0)}


# ---- one system, in a child process ----

def key_of(n: int) -> bytes:
    return b"key%010d" % n


def prefill(path: str, keys: int, value_bytes: int, threads: int, **kwargs: Any) -> None:
    """Every key written once, by `threads` threads as the workload does (for "+compact")."""
    wal = importlib.import_module("wal")
    per = keys // threads
    value = os.urandom(value_bytes)
    with wal.open(path, **kwargs) as store:
        workers = [threading.Thread(target=lambda t=t: [store.put(key_of(t * per + i), value) for i in range(per)])
                   for t in range(threads)]
        for th in workers:
            th.start()
        for th in workers:
            th.join()


class Writer:
    """The open system: put(thread, key, value) from any thread; close()."""

    def __init__(self, system: str, path: str, threads: int, keys: int, value_bytes: int) -> None:
        self.system = system
        self.store: Any = None
        if system.startswith("agentwal"):
            wal = importlib.import_module("wal")
            level, _, then = system.split("-", 1)[1].partition("+")
            kwargs: dict[str, Any] = {"durability": level}
            if level in ("interval", "buffered"):
                kwargs["rpo_ms"] = 100
            self.store = wal.open(path, **kwargs)
            if then == "compact":  # every key written once, then `agentwal compact`, before the clock starts
                self.store.close()
                prefill(path, keys, value_bytes, threads, **kwargs)
                importlib.import_module("wal.ops").compact(path)
                self.store = wal.open(path, **kwargs)
            self.put = lambda t, k, v: self.store.put(k, v)
        elif system == "lmdb":
            lmdb = importlib.import_module("lmdb")
            self.env = lmdb.open(path, map_size=1 << 40, sync=False, metasync=False, max_readers=256)

            def put(t: int, k: bytes, v: bytes) -> None:
                with self.env.begin(write=True) as txn:
                    txn.put(k, v)
            self.put = put
        elif system == "rocksdb":
            rocksdict = importlib.import_module("rocksdict")
            self.db = rocksdict.Rdict(path)
            self.put = lambda t, k, v: self.db.put(k, v)
        elif system == "sqlite":
            sqlite3 = importlib.import_module("sqlite3")
            self.conns: list[Any] = []
            for _ in range(threads):
                conn = sqlite3.connect(os.path.join(path, "db.sqlite"), timeout=60, check_same_thread=False,
                                       isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
                self.conns.append(conn)
            self.put = lambda t, k, v: self.conns[t].execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (k, v))
        else:
            raise SystemExit(f"unknown system {system!r}; one of {', '.join(SYSTEMS)}")

    def extra(self) -> dict[str, Any]:
        if self.store is None:
            return {}
        s = self.store.stats()
        return {k: s.get(k) for k in ("state_file_bytes", "state_used_bytes", "state_free_bytes",
                                      "state_pinned_free_bytes", "checkpoints", "space_checkpoints",
                                      "state_backpressure_waits", "state_backpressure_ms", "unapplied_commits")}

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        elif self.system == "lmdb":
            self.env.close()
        elif self.system == "rocksdb":
            self.db.close()
        elif self.system == "sqlite":
            for c in self.conns:
                c.close()


def child(args: argparse.Namespace) -> None:
    w = Writer(args.child, args.dir, args.threads, args.keys, args.value_bytes)
    per = args.keys // args.threads
    pool = [os.urandom(args.value_bytes) for _ in range(64)]
    counts = [0] * args.threads
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(t: int) -> None:
        base = t * per
        n = 0
        try:
            while not stop.is_set():
                i = n % per
                w.put(t, key_of(base + i), pool[(n + t) & 63])
                n += 1
                counts[t] = n
        except BaseException as exc:  # reported, then the run stops
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(args.threads)]
    started = time.monotonic()
    for th in threads:
        th.start()
    samples = []
    first_pass_at = None
    while True:
        now = time.monotonic() - started
        puts = sum(counts)
        if first_pass_at is None and min(counts) >= per:
            first_pass_at = now
        samples.append({"t": round(now, 2), "puts": puts, "allocated": allocated_bytes(args.dir), **rss(),
                        "first_pass": first_pass_at is not None, **w.extra()})
        if now >= args.seconds or stop.is_set():
            break
        stop.wait(min(args.sample, max(0.0, args.seconds - now)))
    stop.set()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - started
    w.close()
    if errors:
        print(f"{args.child}: a writer failed: {errors[0]!r}", file=sys.stderr)
    json.dump({"system": args.child, "seconds": elapsed, "puts": sum(counts), "first_pass_s": first_pass_at,
               "live_bytes": per * args.threads * (len(key_of(0)) + args.value_bytes),
               "allocated_after_close": allocated_bytes(args.dir), "samples": samples,
               "error": repr(errors[0]) if errors else None}, sys.stdout)


# ---- the run ----

def summarize(r: dict[str, Any]) -> dict[str, Any]:
    live = r["live_bytes"]
    after = [s for s in r["samples"] if s["first_pass"]]
    end = r["samples"][-1]
    out = {"system": r["system"], "puts": r["puts"], "puts_per_s": r["puts"] / r["seconds"],
           "first_pass_s": r["first_pass_s"], "live_gb": live / 1e9, "end_gb": end["allocated"] / 1e9,
           "end_x": end["allocated"] / live,
           "max_after_first_pass_x": max(s["allocated"] for s in after) / live if after else None,
           "rss_max_gb": max(s["rss"] for s in r["samples"]) / 1e9, "rss_end_gb": end["rss"] / 1e9,
           "rss_after_first_pass_min_max_gb": ((min(s["rss"] for s in after) / 1e9, max(s["rss"] for s in after) / 1e9)
                                               if after else None)}
    if "state_backpressure_ms" in end:
        out["state_backpressure_s"] = (end["state_backpressure_ms"] or 0) / 1000
        out["checkpoints"] = end["checkpoints"]
    return out


def plot(results: list[dict[str, Any]], path: str) -> bool:
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
    for r in results:
        t = [s["t"] for s in r["samples"]]
        ax1.plot(t, [s["allocated"] / r["live_bytes"] for s in r["samples"]], label=r["system"])
        ax2.plot(t, [s["rss"] / 1e9 for s in r["samples"]], label=r["system"])
    ax1.axhline(2.0, color="grey", linestyle="--", linewidth=0.8)
    ax1.set_ylabel("allocated bytes / live data")
    ax1.set_title(f"sustained overwrites: {results[0]['live_bytes'] / 1e9:.2f} GB live data")
    ax1.legend(fontsize=8)
    ax2.set_ylabel("RSS, GB")
    ax2.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_const", dest="profile", const="quick")
    p.add_argument("--full", action="store_const", dest="profile", const="full")
    p.add_argument("--keys", type=int)
    p.add_argument("--value-bytes", type=int, default=1024)
    p.add_argument("--seconds", type=float)
    p.add_argument("--sample", type=float)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "space"))
    p.add_argument("--dir", help="where the stores are created (default: a temporary directory)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    prof = PROFILES[args.profile or "default"]
    for name in ("keys", "seconds", "sample"):
        if getattr(args, name) is None:
            setattr(args, name, prof[name])
    if args.child:
        child(args)
        return
    base = tempfile.mkdtemp(prefix="agentwal-space-", dir=args.dir)
    results = []
    try:
        for system in args.systems.split(","):
            d = os.path.join(base, system)
            os.makedirs(d)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", system, "--dir", d,
                   "--keys", str(args.keys), "--value-bytes", str(args.value_bytes), "--seconds", str(args.seconds),
                   "--sample", str(args.sample), "--threads", str(args.threads)]
            print(f"{system}: {args.threads} threads x {args.keys // args.threads} keys of {args.value_bytes} B "
                  f"for {args.seconds:.0f} s ...", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True)
            r = json.loads(done.stdout)
            results.append(r)
            s = summarize(r)
            print(json.dumps(s), file=sys.stderr, flush=True)
            shutil.rmtree(d)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "space.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items() if k != "child"}, "results": results}, f)
    print(f"\n{'system':<20} {'puts':>10} {'puts/s':>9} {'1st pass s':>10} {'end x live':>10} "
          f"{'max x live':>10} {'RSS max GB':>10}  state back-pressure")
    for r in results:
        s = summarize(r)
        mx = f"{s['max_after_first_pass_x']:.2f}" if s["max_after_first_pass_x"] is not None else "n/a"
        fp = f"{s['first_pass_s']:.1f}" if s["first_pass_s"] is not None else "never"
        bp = (f"{s['state_backpressure_s']:.1f} s, {s['checkpoints']} checkpoints"
              if "state_backpressure_s" in s else "")
        print(f"{s['system']:<20} {s['puts']:>10,} {s['puts_per_s']:>9,.0f} {fp:>10} {s['end_x']:>10.2f} "
              f"{mx:>10} {s['rss_max_gb']:>10.2f}  {bp}")
    print(f"live data {results[0]['live_bytes'] / 1e9:.3f} GB; 'max x live': highest allocated/live once every key "
          "was written")
    if plot(results, os.path.join(args.out, "space.png")):
        print(f"plot: {os.path.join(args.out, 'space.png')}")


if __name__ == "__main__":
    main()
