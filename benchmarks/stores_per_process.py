"""What an idle store costs a process: resident memory, threads, file descriptors, address space
and CPU, measured by opening N stores (default 1,000) in this process, one commit each, then
leaving them idle.

    python benchmarks/stores_per_process.py                    # 1,000 stores under a temp dir
    python benchmarks/stores_per_process.py -n 200 --dir /mnt/x --durability buffered

RLIMIT_NOFILE is raised to its hard limit first (each store holds 6 descriptors). Figures come
from /proc/self (VmRSS, VmSize, task/, fd/) before the first open and once the stores are idle;
idle CPU is this process's CPU time over `--idle` seconds with every store open and idle. The
README's "Many stores in one process" quotes a run of this script. Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

import wal


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _sample() -> dict[str, int]:
    return {"rss": _status("VmRSS"), "vm": _status("VmSize"), "threads": len(os.listdir("/proc/self/task")),
            "fds": len(os.listdir("/proc/self/fd"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=1000, help="stores to open (default 1000)")
    ap.add_argument("--dir", help="where to create them (default: a new temp directory, removed after)")
    ap.add_argument("--durability", default="sync", choices=["sync", "interval", "buffered"])
    ap.add_argument("--idle", type=float, default=5.0, help="seconds to measure idle CPU over")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 6 * args.n + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else want, hard))
    root = args.dir or tempfile.mkdtemp(prefix="agentwal-stores-")
    rpo = None if args.durability == "sync" else 100
    before = _sample()
    started = time.monotonic()
    stores = []
    try:
        for i in range(args.n):
            stores.append(wal.open(os.path.join(root, f"s{i:05d}"), durability=args.durability, rpo_ms=rpo))
        opened = time.monotonic() - started
        for i, store in enumerate(stores):
            store.put(b"key", b"%d" % i)
        for i, store in enumerate(stores):
            assert store.get(b"key") == b"%d" % i
        time.sleep(2.0)  # every materializer goes idle (50 empty rounds of 20 ms)
        idle_from, cpu_from = time.monotonic(), time.process_time()
        time.sleep(args.idle)
        idle_cpu = (time.process_time() - cpu_from) / (time.monotonic() - idle_from)
        after = _sample()
        maps = [s.stats()["state_map_bytes"] for s in stores]
        closing = time.monotonic()
        for store in stores:
            store.close()
        closed = time.monotonic() - closing
    finally:
        for store in stores:
            store.close()
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    n = args.n
    out = {
        "stores": n, "durability": args.durability, "dir": root,
        "open_seconds": round(opened, 2), "close_seconds": round(closed, 2),
        "rss_bytes_per_store": (after["rss"] - before["rss"]) // n,
        "address_space_bytes_per_store": (after["vm"] - before["vm"]) // n,
        "threads_per_store": round((after["threads"] - before["threads"]) / n, 2),
        "fds_per_store": round((after["fds"] - before["fds"]) / n, 2),
        "lmdb_map_bytes_per_store": sum(maps) // n,
        "idle_cpu_fraction_of_one_core": round(idle_cpu, 3),
        "process_rss_bytes": after["rss"], "python": sys.version.split()[0],
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
