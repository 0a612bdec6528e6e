#!/usr/bin/env python3
"""agentwal side by side with the tools a user would pick instead (BRIEF §7).

    python benchmarks/compare.py [--quick] [--out DIR] [--only a,b,...] [--systems agentwal,sqlite,...]

One run measures, on the same workloads, in fresh temp directories on one filesystem:

(a) durable commits of 128 B and 4 KiB values from 1, 8 and 64 threads and from 1,000 asyncio
    tasks: agentwal ``sync`` (Store.put and the bare Log.append) against SQLite WAL
    ``synchronous=FULL``, LMDB ``sync=True``, RocksDB (rocksdict) and LevelDB (plyvel) sync
    writes, and a bare C write+fdatasync loop (the physical reference);
(b) unsynced per-op commits and batched appends (batches of 1000): agentwal ``interval`` and
    ``buffered`` (rpo_ms=100) against SQLite ``synchronous=NORMAL``, LMDB without sync, RocksDB
    and LevelDB without sync, and a bare Python ``os.write`` loop;
(c) recovery: time and peak RSS of reopening a log of 100 MB and 1 GB (``--quick``: 20 MB),
    cold and warm page cache, in a child process; and a store whose whole log must be replayed;
(d) point reads and prefix scans of the state: Store.get / Store.scan against LMDB, SQLite,
    RocksDB and LevelDB;
(e) commit latency (p50/p99/...) per level, one thread.

Output in --out (default benchmarks/results/<timestamp>/): results.json (raw figures and the
machine), results.md (tables with ratios to the best peer and to the reference, and the BRIEF §7
targets with MET / NOT MET), and PNG plots when matplotlib is installed.

Peers and plotting are optional (``pip install '.[bench]'``): a missing one is skipped with a
note. Absolute figures depend on the machine and its load: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import bisect
import concurrent.futures
import contextlib
import datetime as dt
import functools
import gc
import importlib
import importlib.metadata
import itertools
import json
import math
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import wal
from wal._bindings import lib
from wal.log import record
from wal.store.store import LOG_DIR

SECTIONS = {
    "a": "Durable commits (sync)",
    "b": "Unsynced per-op commits and batched appends",
    "c": "Recovery",
    "d": "Point reads and prefix scans of the state",
    "e": "Commit latency per level (one thread, 128 B)",
}
SYSTEMS = ("agentwal-store", "agentwal-log", "sqlite", "lmdb", "rocksdb", "leveldb", "ref")
PEER_MODULES = {"sqlite": "sqlite3", "lmdb": "lmdb", "rocksdb": "rocksdict", "leveldb": "plyvel"}
RPO_MS = 100  # interval / buffered in (b) and (e)
EXECUTOR_THREADS = 64  # asyncio peers without an async API go through run_in_executor on this pool
MB = 1_000_000  # MB and GB are decimal throughout

SUSTAINED_NOTE = (
    "The checks above take each system's budget in slices of about a second, each in a fresh directory: the "
    "store's state pages written in a slice may still be in the page cache at its end (they reach the disk at "
    "checkpoints and by the kernel's writeback), as RocksDB's memtable is. Over this longer run they must reach "
    "the disk while the commits go on.")

C_REFERENCE = r"""/* fsync_loop.c -- physical reference of benchmarks/compare.py (compiled at run time).
 *
 *   fsync_loop MODE PATH SIZE SECONDS [LATFILE]
 *
 * Writes SIZE bytes and fdatasyncs, in a loop, for SECONDS; prints "<ops> <seconds>".
 * MODE "append": O_APPEND to a file that grows, so each fdatasync also commits the new size.
 * MODE "prealloc": overwrite a file first filled with zeros and fsynced (8 MiB, wrapping
 * around), so an fdatasync carries no metadata: the cheapest durable write the disk offers.
 * MODE "pages": the same file, the values laid end to end, and each commit writes the whole
 * pages its value touches (their earlier bytes from memory) and then drops them from the page
 * cache, as agentwal's sync log does (its native/writer.c, "Whole pages").
 * Per-commit latencies (u64 ns) go to LATFILE when given. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PREALLOC_BYTES (8u << 20)
#define PAGE 4096u

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s append|prealloc|pages PATH SIZE SECONDS [LATFILE]\n", argv[0]);
        return 2;
    }
    int pages = strcmp(argv[1], "pages") == 0;
    int prealloc = pages || strcmp(argv[1], "prealloc") == 0;
    size_t size = strtoul(argv[3], NULL, 10);
    uint64_t budget = (uint64_t)(atof(argv[4]) * 1e9);
    int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | (prealloc ? 0 : O_APPEND), 0644);
    if (fd < 0) { perror("open"); return 1; }
    unsigned char *buf = calloc(1, size > 65536 ? size : 65536);
    size_t cap = 1 << 16, n = 0;
    uint64_t *lat = malloc(cap * sizeof *lat);
    if (!buf || !lat || size == 0 || size > PREALLOC_BYTES) return 1;
    if (prealloc) {
        for (size_t off = 0; off < PREALLOC_BYTES; off += 65536)
            if (write(fd, buf, 65536) != 65536) { perror("prealloc"); return 1; }
        if (fsync(fd) != 0) { perror("fsync"); return 1; }
    }
    for (size_t i = 0; i < size; i++) buf[i] = (unsigned char)(i * 131 + 7);
    size_t slots = PREALLOC_BYTES / size;
    unsigned char *img = pages ? calloc(1, PREALLOC_BYTES) : NULL; /* the file's bytes, for "pages" */
    if (pages && (!img || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)) return 1;
    uint64_t start = now_ns(), end = start + budget, t0;
    while ((t0 = now_ns()) < end) {
        size_t off = (n % slots) * size;
        if (pages) {
            size_t from = off / PAGE * PAGE, to = (off + size + PAGE - 1) / PAGE * PAGE;
            memcpy(img + off, buf, size);
            if (pwrite(fd, img + from, to - from, (off_t)from) != (ssize_t)(to - from)) { perror("write"); return 1; }
            if (fdatasync(fd) != 0) { perror("fdatasync"); return 1; }
            posix_fadvise(fd, (off_t)from, (off_t)(to - from), POSIX_FADV_DONTNEED);
        } else {
            ssize_t w = prealloc ? pwrite(fd, buf, size, (off_t)off) : write(fd, buf, size);
            if (w != (ssize_t)size) { perror("write"); return 1; }
            if (fdatasync(fd) != 0) { perror("fdatasync"); return 1; }
        }
        if (n == cap) {
            cap *= 2;
            lat = realloc(lat, cap * sizeof *lat);
            if (!lat) return 1;
        }
        lat[n++] = now_ns() - t0;
    }
    double secs = (double)(now_ns() - start) / 1e9;
    if (argc > 5) {
        FILE *f = fopen(argv[5], "wb");
        if (!f || fwrite(lat, sizeof *lat, n, f) != n) { perror("latfile"); return 1; }
        fclose(f);
    }
    printf("%zu %.9f\n", n, secs);
    close(fd);
    return 0;
}
"""


REF_MODES = {"ref": "prealloc", "ref-append": "append", "ref-pages": "pages"}  # entry system -> fsync_loop MODE


# ---- sizes ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    name: str
    sync_seconds: float  # time budget of each durable-commit measurement, (a) and (e)
    warmup_ops: int  # untimed commits before each measurement
    perop_ops: int  # (b) per-op commits, fixed count
    batch_count: int  # (b) batches of batch_size records
    recovery_mb: tuple[int, ...]  # (c) log sizes
    read_keys: int  # (d) keys in the state
    read_ops: int  # (d) point reads
    scan_rounds: int  # (d) scans of every agent prefix
    agents: int  # (d) distinct prefixes
    latency_ops: int  # (e) commits at interval / buffered
    rounds: int = 1  # (a), (e) at sync: the time budget is taken in this many interleaved slices
    # (a) also runs the largest value from the most threads this long, in one slice per system, for
    # the store and RocksDB: what a sustained load makes of it once the state's deferred writes reach
    # the disk (reported, not a check; 0 skips it)
    sustained_seconds: float = 0.0
    threads: tuple[int, ...] = (1, 8, 64)
    tasks: int = 1000
    sizes: tuple[int, ...] = (128, 4096)
    batch_size: int = 1000
    recovery_payload: int = 1024
    store_keys: int = 10_000  # (c) distinct keys the replayed store overwrites
    recovery_runs: int = 3  # (c) runs of each reopen (and of the raw read); the median is reported
    read_passes: int = 5  # (d) interleaved passes over every reader; each row keeps its fastest


PROFILES = {
    "full": Profile("full", sync_seconds=3.0, warmup_ops=50, perop_ops=300_000, batch_count=500,
                    recovery_mb=(100, 1000), read_keys=100_000, read_ops=100_000, scan_rounds=3, agents=100,
                    latency_ops=100_000, rounds=3, sustained_seconds=20.0),
    "quick": Profile("quick", sync_seconds=0.5, warmup_ops=20, perop_ops=30_000, batch_count=100,
                     recovery_mb=(20,), read_keys=20_000, read_ops=20_000, scan_rounds=1, agents=100,
                     latency_ops=20_000, rounds=2),
    # --smoke (hidden): seconds in all, for tests/test_bench_smoke.py; the figures mean nothing.
    "smoke": Profile("smoke", sync_seconds=0.05, warmup_ops=2, perop_ops=300, batch_count=2,
                     recovery_mb=(1,), read_keys=500, read_ops=300, scan_rounds=1, agents=5,
                     latency_ops=300, store_keys=100, threads=(1, 8), tasks=100, sizes=(128,), recovery_runs=1,
                     read_passes=2),
}


# ---- small helpers ------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def latency_summary(ns: list[int]) -> dict[str, Any]:
    if not ns:
        return {}
    s = sorted(ns)
    n = len(s)

    def q(p: float) -> float:
        return s[min(n - 1, int(p * n))] / 1000

    return {"p50_us": q(0.50), "p90_us": q(0.90), "p99_us": q(0.99), "p999_us": q(0.999),
            "max_us": s[-1] / 1000, "mean_us": sum(s) / n / 1000, "samples": n}


def latency_histogram(ns: list[int]) -> dict[str, Any]:
    """Counts in log-spaced bins (10 a decade) from 1 µs to 10 s: the distribution, JSON-sized."""
    edges = [10 ** (k / 10) for k in range(0, 71)]  # µs
    counts = [0] * (len(edges) + 1)
    for v in ns:
        counts[bisect.bisect_right(edges, v / 1000)] += 1
    return {"edges_us": [round(e, 3) for e in edges], "counts": counts}


def proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _median_by(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The row whose `key` is the median (the lower middle of an even count), with every run's
    value of it kept for the record: one cold reopen moves by 10-30% from run to run here."""
    ordered = sorted(rows, key=lambda r: r[key])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs"] = [r[key] for r in rows]
    return chosen


def drop_page_cache(path: str) -> None:
    """Evict the files under path from the page cache (fsync, then POSIX_FADV_DONTNEED): no root needed."""
    for root, _, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                with contextlib.suppress(OSError):
                    os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def fs_info(path: str) -> dict[str, str]:
    path = os.path.realpath(path)
    best = {"mount": "", "type": "unknown", "device": "", "options": ""}
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 4:
                    continue
                dev, mnt, typ, opts = parts[0], parts[1].replace("\\040", " "), parts[2], parts[3]
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best["mount"]):
                    best = {"mount": mnt, "type": typ, "device": dev, "options": opts}
    except OSError:
        pass
    return best


def machine_info(tmp: str) -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    git = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              check=False)
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False)
        if head.returncode == 0:
            git = {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    versions: dict[str, str] = {"agentwal": wal.__version__}
    for system, module in PEER_MODULES.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if system == "sqlite":
            versions["sqlite"] = mod.sqlite_version
        elif system == "lmdb":
            versions["lmdb"] = ".".join(map(str, mod.version())) + f" (py-lmdb {mod.__version__})"
        elif system == "leveldb":
            versions["leveldb"] = f"{mod.__leveldb_version__} (plyvel {mod.__version__})"
        else:
            with contextlib.suppress(Exception):
                versions[system] = f"rocksdict {importlib.metadata.version('rocksdict')}"
    with contextlib.suppress(ImportError):
        versions["matplotlib"] = importlib.import_module("matplotlib").__version__
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_mb": round(mem_kb / 1024) if mem_kb else None,
        "crc32c_hardware": bool(lib.wal_crc32c_hw_available()),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "tmpdir": tmp,
        "filesystem": fs_info(tmp),
        "git": git,
        "versions": versions,
        "loadavg_start": list(os.getloadavg()),
    }


# ---- systems under test: one write interface ------------------------------------------------------------


class Target:
    """A store opened for one measurement. `worker()` is called in each thread that commits."""

    role = "peer"
    payload_only = False

    def worker(self) -> Callable[[bytes, bytes], Any]:
        raise NotImplementedError

    aput: Callable[[bytes, bytes], Any] | None = None  # native asyncio commit, if the system has one

    def loop(self, keys: list[bytes], value: bytes) -> None:
        """Commit each key in a tight loop (unsynced per-op figures)."""
        put = self.worker()
        for k in keys:
            put(k, value)

    def batch(self, keys: list[bytes], value: bytes) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def _agentwal_stats(st: dict[str, Any]) -> dict[str, Any]:
    keys = ("commits", "fsyncs", "group_size_mean", "group_size_max", "backpressure_waits", "fsync_ms_p50",
            "fsync_ms_p99", "durable_lag_ms")
    return {k: st[k] for k in keys if k in st}


def _merge_extra(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """agentwal counters summed over the rounds of one measurement (group size weighted by fsyncs)."""
    out = dict(parts[-1])
    for k in ("commits", "fsyncs", "backpressure_waits"):
        if all(k in p for p in parts):
            out[k] = sum(p[k] for p in parts)
    fsyncs = sum(p.get("fsyncs", 0) for p in parts)
    if fsyncs:
        out["group_size_mean"] = sum(p.get("group_size_mean", 0) * p.get("fsyncs", 0) for p in parts) / fsyncs
        out["group_size_max"] = max(p.get("group_size_max", 0) for p in parts)
    return out


class AgentwalStore(Target):
    role = "agentwal"

    def __init__(self, d: str, level: str) -> None:
        self.s = wal.open(d, durability=level, rpo_ms=None if level == "sync" else RPO_MS)
        self.aput = self.s.aput

    def worker(self) -> Callable[[bytes, bytes], Any]:
        return self.s.put

    def loop(self, keys: list[bytes], value: bytes) -> None:
        put = self.s.put
        for k in keys:
            put(k, value)

    def batch(self, keys: list[bytes], value: bytes) -> None:
        with self.s.transaction() as tx:
            put = tx.put
            for k in keys:
                put(k, value)

    def stats(self) -> dict[str, Any]:
        return _agentwal_stats(self.s.stats())

    def close(self) -> None:
        self.s.close()


class AgentwalLog(Target):
    """The bare log: the payload is the value (same size as the peers' values, no key)."""

    role = "agentwal"
    payload_only = True

    def __init__(self, d: str, level: str) -> None:
        self.log = wal.Log.open(d, durability=level, rpo_ms=None if level == "sync" else RPO_MS)
        self.aput = self._aput

    def _aput(self, key: bytes, value: bytes) -> Any:
        return self.log.append_async(value)

    def worker(self) -> Callable[[bytes, bytes], Any]:
        append = self.log.append
        return lambda _k, v: append(v)

    def loop(self, keys: list[bytes], value: bytes) -> None:
        append = self.log.append
        for _ in keys:
            append(value)

    def batch(self, keys: list[bytes], value: bytes) -> None:
        self.log.append_many(itertools.repeat(value, len(keys)))

    def stats(self) -> dict[str, Any]:
        return _agentwal_stats(self.log.stats())

    def close(self) -> None:
        self.log.close()


class SqliteTarget(Target):
    """SQLite in WAL mode, autocommit INSERT OR REPLACE, one connection per committing thread."""

    SQL = "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)"

    def __init__(self, mod: Any, d: str, synchronous: str) -> None:
        self.mod = mod
        self.path = os.path.join(d, "db.sqlite")
        self.synchronous = synchronous
        self.conns: list[Any] = []
        self.lock = threading.Lock()
        self.main = self._connect()
        self.main.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")

    def _connect(self) -> Any:
        c = self.mod.connect(self.path, timeout=600, isolation_level=None, check_same_thread=False)
        c.execute("PRAGMA journal_mode=WAL")
        c.execute(f"PRAGMA synchronous={self.synchronous}")
        with self.lock:
            self.conns.append(c)
        return c

    def worker(self) -> Callable[[bytes, bytes], Any]:
        execute = self._connect().execute
        sql = self.SQL
        return lambda k, v: execute(sql, (k, v))

    def batch(self, keys: list[bytes], value: bytes) -> None:
        c = self.main
        c.execute("BEGIN")
        c.executemany(self.SQL, zip(keys, itertools.repeat(value)))
        c.execute("COMMIT")

    def close(self) -> None:
        for c in self.conns:
            c.close()


class LmdbTarget(Target):
    """py-lmdb, one write transaction per commit."""

    def __init__(self, mod: Any, d: str, sync: bool) -> None:
        self.env = mod.open(d, map_size=1 << 36, sync=sync, metasync=sync, writemap=False, map_async=False,
                            max_readers=512, lock=True)

    def worker(self) -> Callable[[bytes, bytes], Any]:
        env = self.env

        def put(k: bytes, v: bytes) -> None:
            with env.begin(write=True) as txn:
                txn.put(k, v)

        return put

    def batch(self, keys: list[bytes], value: bytes) -> None:
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(zip(keys, itertools.repeat(value)))

    def close(self) -> None:
        self.env.close()


class RocksTarget(Target):
    def __init__(self, mod: Any, d: str, sync: bool) -> None:
        self.mod = mod
        self.db = mod.Rdict(os.path.join(d, "rocks"), mod.Options(raw_mode=True))
        self.wo = mod.WriteOptions()
        self.wo.sync = sync

    def worker(self) -> Callable[[bytes, bytes], Any]:
        return functools.partial(self.db.put, write_opt=self.wo)

    def batch(self, keys: list[bytes], value: bytes) -> None:
        wb = self.mod.WriteBatch(raw_mode=True)
        put = wb.put
        for k in keys:
            put(k, value)
        self.db.write(wb, self.wo)

    def close(self) -> None:
        self.db.close()


class LevelTarget(Target):
    def __init__(self, mod: Any, d: str, sync: bool) -> None:
        self.db = mod.DB(os.path.join(d, "level"), create_if_missing=True)
        self.sync = sync

    def worker(self) -> Callable[[bytes, bytes], Any]:
        return functools.partial(self.db.put, sync=self.sync)

    def batch(self, keys: list[bytes], value: bytes) -> None:
        with self.db.write_batch(sync=self.sync) as wb:
            put = wb.put
            for k in keys:
                put(k, value)

    def close(self) -> None:
        self.db.close()


class PyWriteTarget(Target):
    """Bare Python os.write of each record into one O_APPEND file: no framing, no CRC, no sync."""

    role = "ref"

    def __init__(self, d: str) -> None:
        self.fd = os.open(os.path.join(d, "ref.bin"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def loop(self, keys: list[bytes], value: bytes) -> None:
        write, fd, rec = os.write, self.fd, keys[0] + value
        for _ in keys:
            write(fd, rec)

    def batch(self, keys: list[bytes], value: bytes) -> None:
        os.write(self.fd, (keys[0] + value) * len(keys))

    def close(self) -> None:
        os.close(self.fd)


Factory = Callable[[str], Target]


@dataclass
class Entry:
    system: str  # key in SYSTEMS, plus "@level" where a workload has several levels of one system
    label: str
    role: str  # agentwal | peer | ref
    factory: Factory
    note: str = ""


# ---- measuring ------------------------------------------------------------------------------------------


def measure_threads(target: Target, nthreads: int, seconds: float, value: bytes,
                    warmup: int) -> tuple[dict[str, Any], list[int]]:
    """nthreads committing distinct keys for `seconds`; returns figures and every latency (ns)."""
    put = target.worker()
    for i in range(warmup):
        put(b"warm-%09d" % i, value)
    counts = [0] * nthreads
    lats: list[list[int]] = [[] for _ in range(nthreads)]
    errors: list[BaseException] = []
    stop = threading.Event()
    barrier = threading.Barrier(nthreads + 1)

    def run(i: int) -> None:
        try:
            put = target.worker()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            return
        prefix = b"t%03d-" % i
        lat = lats[i]
        pc = time.perf_counter_ns
        n = 0
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            while not stop.is_set():
                k = prefix + b"%010d" % n
                t0 = pc()
                put(k, value)
                lat.append(pc() - t0)
                n += 1
        except BaseException as exc:
            errors.append(exc)
        counts[i] = n

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(nthreads)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()  # broken: a worker failed to start; its error is raised below
    start = time.perf_counter()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    all_lat = [x for lat in lats for x in lat]
    ops = sum(counts)
    return {"ops": ops, "seconds": elapsed, "ops_per_s": ops / elapsed, **latency_summary(all_lat)}, all_lat


def measure_tasks(target: Target, ntasks: int, seconds: float, value: bytes,
                  warmup: int) -> tuple[dict[str, Any], list[int]]:
    """ntasks asyncio tasks committing for `seconds`: native async API, else run_in_executor."""

    async def main() -> tuple[dict[str, Any], list[int]]:
        loop = asyncio.get_running_loop()
        pool: concurrent.futures.ThreadPoolExecutor | None = None
        call: Callable[[bytes, bytes], Any]
        if target.aput is not None:
            call, via = target.aput, "native asyncio API"
        else:
            pool = concurrent.futures.ThreadPoolExecutor(EXECUTOR_THREADS)
            local = threading.local()

            def put_here(k: bytes, v: bytes) -> Any:
                put = getattr(local, "put", None)
                if put is None:
                    put = local.put = target.worker()
                return put(k, v)

            def call(k: bytes, v: bytes) -> Any:
                return loop.run_in_executor(pool, put_here, k, v)

            via = f"run_in_executor, {EXECUTOR_THREADS}-thread pool"
        for i in range(warmup):
            await call(b"warm-%09d" % i, value)
        stop = asyncio.Event()
        counts = [0] * ntasks
        lat: list[int] = []
        pc = time.perf_counter_ns

        async def task(i: int) -> None:
            prefix = b"a%04d-" % i
            n = 0
            while not stop.is_set():
                t0 = pc()
                await call(prefix + b"%010d" % n, value)
                lat.append(pc() - t0)
                n += 1
            counts[i] = n

        start = time.perf_counter()
        tasks = [asyncio.create_task(task(i)) for i in range(ntasks)]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
        if pool is not None:
            pool.shutdown(wait=True)
        ops = sum(counts)
        return {"ops": ops, "seconds": elapsed, "ops_per_s": ops / elapsed, **latency_summary(lat), "note": via}, lat

    return asyncio.run(main())


def measure_loop(target: Target, keys: list[bytes], value: bytes, warm: list[bytes]) -> dict[str, Any]:
    target.loop(warm, value)
    start = time.perf_counter()
    target.loop(keys, value)
    elapsed = time.perf_counter() - start
    return {"ops": len(keys), "seconds": elapsed, "ops_per_s": len(keys) / elapsed}


def measure_batches(target: Target, keys: list[bytes], value: bytes, size: int, warm: list[bytes]) -> dict[str, Any]:
    target.batch(warm[:size], value)
    start = time.perf_counter()
    for i in range(0, len(keys), size):
        target.batch(keys[i : i + size], value)
    elapsed = time.perf_counter() - start
    return {"ops": len(keys), "seconds": elapsed, "ops_per_s": len(keys) / elapsed,
            "batches_per_s": len(keys) / size / elapsed}


def measure_latency_loop(target: Target, keys: list[bytes], value: bytes,
                         warm: list[bytes]) -> tuple[dict[str, Any], list[int]]:
    put = target.worker()
    for k in warm:
        put(k, value)
    lat: list[int] = []
    pc = time.perf_counter_ns
    start = time.perf_counter()
    for k in keys:
        t0 = pc()
        put(k, value)
        lat.append(pc() - t0)
    elapsed = time.perf_counter() - start
    return {"ops": len(keys), "seconds": elapsed, "ops_per_s": len(keys) / elapsed, **latency_summary(lat)}, lat


# ---- recovery: builders and the child process ----------------------------------------------------------


def build_log(d: str, total_bytes: int, payload: bytes) -> dict[str, Any]:
    """A log of about total_bytes of payload, written with append_many at buffered level, closed."""
    batch = [payload] * 1000
    records = 0
    start = time.perf_counter()
    with wal.Log.open(d, durability="buffered", rpo_ms=1000) as lg:
        while records * len(payload) < total_bytes:
            lg.append_many(batch)
            records += len(batch)
        lg.sync()
        written = lg.stats()["bytes_written"]
    elapsed = time.perf_counter() - start
    return {"records": records, "log_bytes": written, "build_s": elapsed}


def build_unapplied_store(d: str, total_bytes: int, value: bytes, nkeys: int) -> dict[str, Any]:
    """A store whose log holds ~total_bytes of put transactions that LMDB has not applied.

    That is the state a SIGKILL leaves before the materializer ran. A SIGKILLed writer cannot
    leave it at this size: the materializer applies every 1024 commits whatever
    apply_interval_ms is, so only a short tail would be replayed. Hence the store is created
    empty, closed, and its log extended with store records (wal.log.record) by the bare Log.
    """
    wal.open(d).close()
    now_ms = time.time_ns() // 1_000_000
    payloads = [record.encode([(record.OP_PUT, b"agent%06d/state" % i, value)], now_ms, None) for i in range(nkeys)]
    records = 0
    start = time.perf_counter()
    with wal.Log.open(os.path.join(d, LOG_DIR), durability="buffered", rpo_ms=1000, _store_log=True) as lg:
        i = 0
        while records * len(value) < total_bytes:
            chunk = payloads[i : i + 1000]
            lg.append_many(chunk)
            records += len(chunk)
            i = (i + len(chunk)) % nkeys
        lg.sync()
        written = lg.stats()["bytes_written"]
    return {"records": records, "log_bytes": written, "build_s": time.perf_counter() - start}


def child_main(kind: str, d: str, limit: int) -> None:
    """Run one recovery in this fresh process; print its figures as JSON (peak RSS from /proc)."""
    gc.collect()
    rss0 = proc_status_kb("VmRSS")
    out: dict[str, Any] = {}
    start = time.perf_counter()
    if kind == "log":
        lg = wal.Log.open(d)
        out["open_s"] = time.perf_counter() - start
        n = nbytes = 0
        for _, payload in lg.read(1):
            n += 1
            nbytes += len(payload)
        out["total_s"] = time.perf_counter() - start
        out.update(records=lg.recovery_report.records, read_records=n, payload_bytes=nbytes,
                   scan_s=lg.recovery_report.seconds)
        lg.close()
    elif kind == "store":
        s = wal.open(d, durability="buffered", rpo_ms=1000)
        out["open_s"] = time.perf_counter() - start
        st = s.stats()
        s.close()
        out.update(total_s=time.perf_counter() - start, records=st["records_replayed"],
                   scan_s=st.get("log_scan_seconds"))
    elif kind == "raw":
        left = limit
        buf = bytearray(8 << 20)
        for root, _, files in sorted(os.walk(d)):
            for name in sorted(files):
                if left <= 0:
                    break
                with open(os.path.join(root, name), "rb", buffering=0) as f:
                    while left > 0 and (got := f.readinto(memoryview(buf)[: min(left, len(buf))])):
                        left -= got
        out.update(total_s=time.perf_counter() - start, open_s=time.perf_counter() - start, bytes=limit - left)
    else:
        raise SystemExit(f"unknown child kind {kind!r}")
    peak = proc_status_kb("VmHWM")
    if peak is None:  # no /proc: ru_maxrss is in KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.update(rss_before_kb=rss0, peak_rss_kb=peak)
    print(json.dumps(out))


# ---- the runner -----------------------------------------------------------------------------------------


class Runner:
    def __init__(self, args: argparse.Namespace, profile: Profile) -> None:
        self.args = args
        self.p = profile
        self.out = args.out
        self.sections: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.skipped: dict[str, str] = {}
        self.samples: dict[str, list[int]] = {}  # (e) latencies, for the plot
        self.hidden = set(filter(None, args.hide_peers.split(","))) if args.hide_peers else set()
        self.base = tempfile.mkdtemp(prefix="agentwal-bench-", dir=args.tmpdir)
        self.c_ref: str | None = None
        self.ref_label = self.ref_append_label = self.ref_pages_label = ""

    # ---- plumbing

    def enabled(self, system: str) -> bool:
        if not self.args.systems:
            return True
        return any(system.startswith(s) for s in self.args.systems)

    def peer(self, system: str) -> Any | None:
        if system in self.skipped:
            return None
        module = PEER_MODULES[system]
        try:
            if system in self.hidden:
                raise ImportError(f"hidden by --_hide-peers {system}")
            return importlib.import_module(module)
        except ImportError as exc:
            self.skipped[system] = f"`{module}` not importable ({exc}); `pip install '.[bench]'` adds it"
            log(f"  skipping {system}: {self.skipped[system]}")
            return None

    @contextlib.contextmanager
    def tmp(self) -> Iterator[str]:
        d = tempfile.mkdtemp(dir=self.base)
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def workload(self, section: str, wid: str, title: str, unit: str, *, metric: str = "ops_per_s",
                 columns: tuple[tuple[str, str, str], ...] = (), note: str = "") -> dict[str, Any]:
        w = {"id": wid, "title": title, "unit": unit, "metric": metric, "columns": [list(c) for c in columns],
             "note": note, "rows": []}
        self.sections.setdefault(section, {"title": SECTIONS[section], "workloads": []})["workloads"].append(w)
        return w

    def attempt(self, w: dict[str, Any], entry: Entry, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """Run one measurement; an exception becomes an error row, never the end of the run."""
        gc.collect()
        row: dict[str, Any] = {"system": entry.system, "label": entry.label, "role": entry.role}
        if entry.note:
            row["note"] = entry.note
        try:
            row.update(fn())
        except Exception as exc:
            traceback.print_exc()
            row["error"] = f"{type(exc).__name__}: {exc}"
            log(f"  {w['id']:<28} {entry.label:<52} ERROR {row['error']}")
            w["rows"].append(row)
            return None
        value = row.get(w["metric"])
        shown = f"{value:>14,.0f} {w['unit']}" if isinstance(value, int | float) else "-"
        log(f"  {w['id']:<28} {entry.label:<52} {shown}")
        w["rows"].append(row)
        return row

    def run_target(self, factory: Factory, body: Callable[[Target], dict[str, Any]]) -> dict[str, Any]:
        with self.tmp() as d:
            target = factory(d)
            try:
                res = body(target)
                extra = target.stats()
                if extra:
                    res["extra"] = extra
            finally:
                target.close()
        return res

    # ---- the systems, per mode

    def kv_entries(self, mode: str) -> list[Entry]:
        """Writers at `mode`: 'sync' (a, e), or 'nosync' (b's peers)."""
        out: list[Entry] = []
        sync = mode == "sync"
        if sync:
            if self.enabled("agentwal-store"):
                out.append(Entry("agentwal-store", "agentwal Store.put (sync)", "agentwal",
                                 lambda d: AgentwalStore(d, "sync")))
            if self.enabled("agentwal-log"):
                out.append(Entry("agentwal-log", "agentwal Log.append (sync)", "agentwal",
                                 lambda d: AgentwalLog(d, "sync")))
        if self.enabled("sqlite") and (m := self.peer("sqlite")) is not None:
            level = "FULL" if sync else "NORMAL"
            out.append(Entry("sqlite", f"SQLite WAL synchronous={level}", "peer",
                             functools.partial(SqliteTarget, m, synchronous=level)))
        if self.enabled("lmdb") and (m := self.peer("lmdb")) is not None:
            out.append(Entry("lmdb", "LMDB sync=True" if sync else "LMDB sync=False metasync=False", "peer",
                             functools.partial(LmdbTarget, m, sync=sync)))
        if self.enabled("rocksdb") and (m := self.peer("rocksdb")) is not None:
            out.append(Entry("rocksdb", f"RocksDB (rocksdict) sync={sync}", "peer",
                             functools.partial(RocksTarget, m, sync=sync)))
        if self.enabled("leveldb") and (m := self.peer("leveldb")) is not None:
            out.append(Entry("leveldb", f"LevelDB (plyvel) sync={sync}", "peer",
                             functools.partial(LevelTarget, m, sync=sync)))
        return out

    def agentwal_unsynced(self) -> list[Entry]:
        out = []
        for level in ("interval", "buffered"):
            if self.enabled("agentwal-store"):
                out.append(Entry(f"agentwal-store@{level}", f"agentwal Store.put ({level}, rpo_ms={RPO_MS})",
                                 "agentwal", functools.partial(AgentwalStore, level=level)))
            if self.enabled("agentwal-log"):
                out.append(Entry(f"agentwal-log@{level}", f"agentwal Log.append ({level}, rpo_ms={RPO_MS})",
                                 "agentwal", functools.partial(AgentwalLog, level=level)))
        return out

    # ---- the physical reference

    def prepare_c_reference(self) -> None:
        cc = shutil.which(os.environ.get("CC", "cc"))
        src = os.path.join(self.out, "fsync_loop.c")
        exe = os.path.join(self.out, "fsync_loop")
        if cc:
            with open(src, "w", encoding="ascii") as f:
                f.write(C_REFERENCE)
            proc = subprocess.run([cc, "-O2", "-o", exe, src], capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                self.c_ref = exe
                self.ref_label = "bare C write+fdatasync loop, preallocated file (1 thread)"
                self.ref_append_label = "bare C write+fdatasync loop, appending (1 thread)"
                self.ref_pages_label = "C write+fdatasync loop, whole pages dropped after each sync (1 thread)"
                self.notes.append(
                    f"Physical reference: {os.path.basename(src)}, compiled with {cc} -O2 into the output "
                    "directory, writes one value and fdatasyncs, in a loop, on one thread. `x reference` divides by "
                    "its preallocated variant (overwriting a zero-filled, fsynced file: no metadata per "
                    "fdatasync, the cheapest durable commit the disk offers); the appending variant (O_APPEND, "
                    "the file grows, so every fdatasync also journals the new size) is listed beside it. On a "
                    "quiet disk the two are close; under load the appending one waits for the shared ext4 journal. "
                    "The third variant lays the values end to end in the preallocated file and writes the whole "
                    "pages each one touches, dropping them from the page cache after each fdatasync: what a sync "
                    "agentwal log does (docs/performance.md, \"Whole pages\"), shown so its ratio to the bare loop "
                    "can be read against what the same technique gives without agentwal around it.")
                return
            self.notes.append(f"Compiling the C reference failed ({proc.stderr.strip()[:200]}).")
        self.ref_label = "Python os.pwrite+os.fdatasync loop, preallocated file (no C compiler; 1 thread)"
        self.ref_append_label = "Python os.write+os.fdatasync loop, appending (no C compiler; 1 thread)"
        self.ref_pages_label = "Python os.pwrite+os.fdatasync loop, whole pages dropped after each sync " \
                               "(no C compiler; 1 thread)"
        self.notes.append("No C compiler: the physical reference is a Python os.write+os.fdatasync loop, "
                          "labelled so.")

    def ref_entries(self) -> list[Entry]:
        if not self.enabled("ref"):
            return []
        return [Entry("ref", self.ref_label, "ref", lambda d: Target()),
                Entry("ref-append", self.ref_append_label, "ref-alt", lambda d: Target()),
                Entry("ref-pages", self.ref_pages_label, "ref-alt", lambda d: Target())]

    def fsync_reference(self, size: int, seconds: float, mode: str) -> tuple[dict[str, Any], list[int]]:
        """The physical reference: mode 'prealloc' (overwrite a zero-filled file), 'append', or 'pages'
        (the zero-filled file, whole pages written and dropped from the cache after each sync)."""
        with self.tmp() as d:
            path = os.path.join(d, "ref.bin")
            if self.c_ref:
                latfile = os.path.join(d, "lat.bin")
                proc = subprocess.run([self.c_ref, mode, path, str(size), str(seconds), latfile],
                                      capture_output=True, text=True, check=True)
                ops_s, secs_s = proc.stdout.split()
                lat = array.array("Q")
                with open(latfile, "rb") as f:
                    lat.frombytes(f.read())
                lats = lat.tolist()
                ops, secs = int(ops_s), float(secs_s)
            else:
                prealloc = 8 << 20
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "append" else 0), 0o644)
                if mode != "append":
                    os.write(fd, bytes(prealloc))
                    os.fsync(fd)
                if mode == "pages":
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                image = bytearray(prealloc if mode == "pages" else 0)
                page = 4096
                slots = prealloc // size
                buf = os.urandom(size)
                lats = []
                pc = time.perf_counter_ns
                start = time.perf_counter()
                end = start + seconds
                try:
                    while time.perf_counter() < end:
                        t0 = pc()
                        off = (len(lats) % slots) * size
                        if mode == "append":
                            os.write(fd, buf)
                        elif mode == "pages":
                            first, last = off // page * page, -(-(off + size) // page) * page
                            image[off:off + size] = buf
                            os.pwrite(fd, image[first:last], first)
                        else:
                            os.pwrite(fd, buf, off)
                        os.fdatasync(fd)
                        if mode == "pages":
                            os.posix_fadvise(fd, first, last - first, os.POSIX_FADV_DONTNEED)
                        lats.append(pc() - t0)
                finally:
                    os.close(fd)
                ops, secs = len(lats), time.perf_counter() - start
        return {"ops": ops, "seconds": secs, "ops_per_s": ops / secs, **latency_summary(lats)}, lats

    # ---- (a) durable commits

    def section_a(self) -> None:
        p = self.p
        for size in p.sizes:
            value = os.urandom(size)
            for conc in (*p.threads, -p.tasks):
                if conc > 0:
                    wid, what = f"a.sync.{size}B.t{conc}", f"{conc} thread{'s' if conc > 1 else ''}"
                else:
                    wid, what = f"a.sync.{size}B.async{p.tasks}", f"{p.tasks} asyncio tasks"
                w = self.workload("a", wid, f"Durable commits, {size} B values, {what}", "commits/s",
                                  columns=(("p50_us", "p50 µs", "lat"), ("p99_us", "p99 µs", "lat")))
                entries = self.kv_entries("sync") + self.ref_entries()
                self.interleaved(w, entries, functools.partial(self._a_one, conc=conc, value=value))
        if p.sustained_seconds:
            size, conc = max(p.sizes), max(p.threads)
            w = self.workload("a", f"a.sync.{size}B.t{conc}.sustained",
                              f"Durable commits, {size} B values, {conc} threads, {p.sustained_seconds:.0f} s in one "
                              "slice each (reported, not a check)", "commits/s",
                              columns=(("p50_us", "p50 µs", "lat"), ("p99_us", "p99 µs", "lat")),
                              note=SUSTAINED_NOTE)
            entries = [e for e in self.kv_entries("sync") if e.system in ("agentwal-store", "rocksdb")]
            self.interleaved(w, entries, functools.partial(self._a_one, conc=conc, value=os.urandom(size)),
                             seconds=p.sustained_seconds, rounds=1)

    def _a_one(self, entry: Entry, seconds: float, *, conc: int, value: bytes) -> tuple[dict[str, Any], list[int]]:
        p = self.p
        if entry.system.startswith("ref"):
            return self.fsync_reference(len(value), seconds, REF_MODES[entry.system])
        lat: list[int] = []

        def body(t: Target) -> dict[str, Any]:
            if conc > 0:
                res, got = measure_threads(t, conc, seconds, value, p.warmup_ops)
            else:
                res, got = measure_tasks(t, -conc, seconds, value, p.warmup_ops)
            lat.extend(got)
            return res

        return self.run_target(entry.factory, body), lat

    def interleaved(self, w: dict[str, Any], entries: list[Entry],
                    fn: Callable[[Entry, float], tuple[dict[str, Any], list[int]]], *,
                    seconds: float | None = None, rounds: int | None = None) -> dict[str, list[int]]:
        """Time-budgeted runs, round-robin: each entry gets `seconds` (sync_seconds) split into `rounds`
        slices, taken in turn, so a change in the machine's load hits every system alike. Returns latencies."""
        rounds = rounds or self.p.rounds
        seconds = (seconds or self.p.sync_seconds) / rounds
        acc: dict[str, dict[str, Any]] = {e.system: {"ops": 0, "seconds": 0.0, "lat": [], "extra": [], "note": ""}
                                          for e in entries}
        failed: dict[str, str] = {}
        for _ in range(rounds):
            for e in entries:
                if e.system in failed:
                    continue
                gc.collect()
                try:
                    res, lat = fn(e, seconds)
                except Exception as exc:
                    traceback.print_exc()
                    failed[e.system] = f"{type(exc).__name__}: {exc}"
                    continue
                a = acc[e.system]
                a["ops"] += res["ops"]
                a["seconds"] += res["seconds"]
                a["lat"].extend(lat)
                if res.get("extra"):
                    a["extra"].append(res["extra"])
                a["note"] = res.get("note", "")
        lats: dict[str, list[int]] = {}
        for e in entries:
            row: dict[str, Any] = {"system": e.system, "label": e.label, "role": e.role, "rounds": rounds}
            a = acc[e.system]
            if e.system in failed:
                row["error"] = failed[e.system]
                log(f"  {w['id']:<28} {e.label:<52} ERROR {row['error']}")
            else:
                row.update(ops=a["ops"], seconds=a["seconds"], ops_per_s=a["ops"] / a["seconds"],
                           **latency_summary(a["lat"]))
                row["note"] = "; ".join(x for x in (e.note, a["note"]) if x)
                if a["extra"]:
                    row["extra"] = _merge_extra(a["extra"])
                lats[e.label] = a["lat"]
                log(f"  {w['id']:<28} {e.label:<52} {row['ops_per_s']:>14,.0f} {w['unit']}")
            w["rows"].append(row)
        return lats

    # ---- (b) unsynced per-op commits and batches

    def section_b(self) -> None:
        p = self.p
        value = os.urandom(128)
        keys = [b"k%012d" % i for i in range(p.perop_ops)]
        warm = [b"w%012d" % i for i in range(max(p.batch_size, min(1000, p.perop_ops)))]
        entries = [*self.agentwal_unsynced(), *self.kv_entries("nosync")]
        ref = Entry("ref", "bare Python os.write loop (no sync)", "ref", PyWriteTarget)
        w = self.workload("b", "b.perop.128B", "Unsynced per-op commits, one thread, 128 B values", "commits/s",
                          note="fixed count of distinct keys; keys pre-built outside the timing")
        for entry in [*entries, *([ref] if self.enabled("ref") else [])]:
            self.attempt(w, entry, lambda e=entry: self.run_target(e.factory,
                                                                   lambda t: measure_loop(t, keys, value, warm)))
        bkeys = [b"b%012d" % i for i in range(p.batch_count * p.batch_size)]
        wb = self.workload("b", f"b.batch{p.batch_size}.128B",
                           f"Batched appends, {p.batch_size} records a batch, one thread, 128 B values",
                           "records/s", columns=(("batches_per_s", "batches/s", "int"),),
                           note="agentwal Log: append_many; agentwal Store: one transaction of "
                           f"{p.batch_size} puts; SQLite: executemany in BEGIN..COMMIT; LMDB: putmulti in one "
                           "write txn; RocksDB/LevelDB: a write batch; reference: one os.write of the records")
        batch_entries = []
        for level in ("interval", "buffered"):
            if self.enabled("agentwal-log"):
                batch_entries.append(Entry(f"agentwal-log@{level}",
                                           f"agentwal Log.append_many ({level}, rpo_ms={RPO_MS})", "agentwal",
                                           functools.partial(AgentwalLog, level=level)))
            if self.enabled("agentwal-store"):
                batch_entries.append(Entry(f"agentwal-store@{level}",
                                           f"agentwal Store.transaction ({level}, rpo_ms={RPO_MS})", "agentwal",
                                           functools.partial(AgentwalStore, level=level)))
        batch_entries += self.kv_entries("nosync")
        if self.enabled("ref"):
            batch_entries.append(Entry("ref", f"bare Python os.write of {p.batch_size} records", "ref",
                                       PyWriteTarget))
        for entry in batch_entries:
            self.attempt(wb, entry, lambda e=entry: self.run_target(
                e.factory, lambda t: measure_batches(t, bkeys, value, p.batch_size, warm)))

    # ---- (c) recovery

    def run_child(self, kind: str, d: str, limit: int = 0) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", kind, d, str(limit)],
                              capture_output=True, text=True, timeout=3600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"recovery child ({kind}) failed: {proc.stderr.strip()[-1500:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def section_c(self) -> None:
        p = self.p
        payload = os.urandom(p.recovery_payload)
        cols = (("records_per_s", "records/s", "int"), ("seconds", "s", "sec"),
                ("peak_rss_mb", "peak RSS MB", "mb"), ("rss_growth_mb", "RSS growth MB", "mb"))
        self.notes.append(
            "(c) runs each reopen in a fresh child process; peak RSS is the child's VmHWM, growth is VmHWM minus "
            "the RSS before opening (interpreter and imports excluded). Log segments are read through mmap, "
            "so mapped file pages count in RSS. Cold = the files were fsynced and evicted with "
            "posix_fadvise(DONTNEED) first (no root needed; a hypervisor cache may still serve them).")
        for mb in p.recovery_mb:
            total = mb * MB
            w = self.workload("c", f"c.recovery.{mb}MB", f"Recovery after {mb:,} MB of log "
                              f"({p.recovery_payload} B records)", "MB/s", metric="mb_per_s", columns=cols,
                              note="MB = log bytes written (framing included) / seconds; each row the median of "
                              f"{p.recovery_runs} run(s), a fresh child process each")
            if self.enabled("agentwal-log") or self.enabled("ref"):
                with self.tmp() as d:
                    built: dict[str, Any] = {}
                    try:
                        built = build_log(d, total, payload)
                    except Exception as exc:
                        traceback.print_exc()
                        w["rows"].append({"system": "agentwal-log", "label": "building the log", "role": "agentwal",
                                          "error": f"{type(exc).__name__}: {exc}"})
                    if built:
                        w["log_bytes"] = built["log_bytes"]
                        w["records"] = built["records"]
                        w["build_mb_per_s"] = built["log_bytes"] / MB / built["build_s"]
                        self._c_log_rows(w, d, built)
            if self.enabled("agentwal-store"):
                with self.tmp() as d:
                    entry = Entry("agentwal-store@replay", "agentwal Store reopen: scan + replay into LMDB (cold)",
                                  "agentwal", lambda d: Target(), note=f"{p.store_keys:,} distinct keys overwritten")

                    raw_rows: list[dict[str, Any]] = []

                    def store_run(d: str = d, total: int = total,
                                  raw_rows: list[dict[str, Any]] = raw_rows) -> dict[str, Any]:
                        rows = []
                        for i in range(p.recovery_runs):  # a replay applies the log: rebuild it each time
                            sd = os.path.join(d, f"run{i}")
                            built = build_unapplied_store(sd, total, payload, p.store_keys)
                            # The store's own reference: a raw cold read of these very log files,
                            # beside each reopen, first or second in turn. The section's raw read
                            # is of another log, made a minute or more earlier, and this disk's cold
                            # reads move by 10-20% over minutes (1.57-1.86 GB/s between runs); a
                            # pair made in the same minute cancels that drift out of the ratio.
                            for kind in ("raw", "store") if i % 2 == 0 else ("store", "raw"):
                                drop_page_cache(sd)
                                if kind == "store":
                                    res = self.run_child("store", sd)
                                    rows.append(self._c_row(res, built, res["open_s"], res["records"]))
                                elif self.enabled("ref"):
                                    res = self.run_child("raw", os.path.join(sd, LOG_DIR), built["log_bytes"])
                                    raw_rows.append(self._c_row(res, built, res["total_s"], built["records"]))
                            shutil.rmtree(sd, ignore_errors=True)
                        return _median_by(rows, "seconds")

                    self.attempt(w, entry, store_run)
                    if raw_rows:
                        self.attempt(w, Entry("ref-store", "raw sequential read of the store's log files, cold "
                                              "cache, beside each of its reopens (8 MiB reads)", "ref-alt",
                                              lambda d: Target()),
                                     functools.partial(_median_by, raw_rows, "seconds"))

    def _c_row(self, res: dict[str, Any], built: dict[str, Any], seconds: float, records: int) -> dict[str, Any]:
        peak = res["peak_rss_kb"] / 1024
        before = (res.get("rss_before_kb") or 0) / 1024
        return {"seconds": seconds, "records": records, "bytes": built["log_bytes"],
                "mb_per_s": built["log_bytes"] / MB / seconds, "records_per_s": records / seconds,
                "peak_rss_mb": peak, "rss_growth_mb": peak - before, "extra": res}

    def _c_log_rows(self, w: dict[str, Any], d: str, built: dict[str, Any]) -> None:
        runs: dict[str, list[dict[str, Any]]] = {}
        if self.enabled("agentwal-log"):
            for cache in ("cold", "warm"):
                if cache == "warm":
                    self.run_child("log", d)  # fills the page cache
                try:
                    runs[cache] = []
                    for _ in range(self.p.recovery_runs):
                        if cache == "cold":
                            drop_page_cache(d)
                        runs[cache].append(self.run_child("log", d))
                except Exception as exc:
                    traceback.print_exc()
                    runs.pop(cache, None)
                    w["rows"].append({"system": f"agentwal-log@{cache}", "label": f"agentwal Log reopen ({cache})",
                                      "role": "agentwal", "error": f"{type(exc).__name__}: {exc}"})
            for cache, results in runs.items():
                for what, key, field in (("Log.open (scan + CRC check)", "open", "open_s"),
                                         ("Log.open + full read", "read", "total_s")):
                    rows = [self._c_row(res, built, res[field], res["records"]) for res in results]
                    entry = Entry(f"agentwal-log@{key}-{cache}", f"agentwal {what}, {cache} cache", "agentwal",
                                  lambda d: Target())
                    self.attempt(w, entry, functools.partial(_median_by, rows, "seconds"))
        if self.enabled("ref"):
            entry = Entry("ref", "raw sequential read of the same bytes, cold cache (8 MiB reads)", "ref",
                          lambda d: Target())

            def raw() -> dict[str, Any]:
                rows = []
                for _ in range(self.p.recovery_runs):
                    drop_page_cache(d)
                    res = self.run_child("raw", d, built["log_bytes"])
                    rows.append(self._c_row(res, built, res["total_s"], built["records"]))
                return _median_by(rows, "seconds")

            self.attempt(w, entry, raw)

    # ---- (d) reads

    def section_d(self) -> None:
        """Reads of the state, as BRIEF §7 and the read-speed targets ask: random point gets, prefix
        scans of 10, 50 and 1,000 keys, and batches of 10 gets; the store read from its writer and
        from a read-only opener, beside LMDB through py-lmdb (the floor under the store: its state is
        an LMDB environment), LevelDB, RocksDB and SQLite."""
        p = self.p
        agents = max(1, p.read_keys // 1000)
        keys = [b"a%03d/c%02d/m%02d" % (a, c, m) for a in range(agents) for c in range(20) for m in range(50)]
        value = os.urandom(128)
        rng = random.Random(7)
        get_keys = [rng.choice(keys) for _ in range(p.read_ops)]
        many = [get_keys[i : i + 10] for i in range(0, len(get_keys) - 9, 10)]
        scans = {
            10: [b"a%03d/c%02d/m%d" % (rng.randrange(agents), rng.randrange(20), rng.randrange(5))
                 for _ in range(p.read_ops // 10)],
            50: [b"a%03d/c%02d/" % (rng.randrange(agents), rng.randrange(20)) for _ in range(p.read_ops // 50)],
            1000: [b"a%03d/" % rng.randrange(agents) for _ in range(max(1, p.read_ops // 1000) * p.scan_rounds)],
        }
        note = (f"{len(keys):,} keys of 128 B; the agentwal store was filled, closed (state fully applied) and "
                "reopened at sync, or read-only; reference: a Python dict / sorted list (in-memory ceiling)")
        wg = self.workload("d", "d.get", "Point gets, random keys, one thread", "gets/s", note=note)
        wm = self.workload("d", "d.get_many10", "Batches of 10 gets (get_many where there is one), one thread",
                           "keys/s", note="keys read per second; peers without a batched read loop over get "
                           "(LMDB: one read txn per batch)")
        wsc = {n: self.workload("d", f"d.scan{n}", f"Prefix scans of {n:,} keys, one thread", "scans/s",
                                columns=(("items_per_s", "items/s", "int"),),
                                note="each scan reads every (key, value) of one prefix")
               for n in scans}
        # Every reader is opened (filled in its own directory) first; then each pass runs every
        # workload once per reader, the readers in a rotated order (pass i starts at reader i), and a
        # reader's row keeps its fastest pass. So a change in the machine's load, or the position in
        # the run, hits the writer, the read-only opener and py-lmdb alike, as the commit rows'
        # interleaved slices do; one pass is a fraction of a second, which a neighbour's burst of CPU
        # on a shared machine can halve.
        def gets(r: dict[str, Any]) -> tuple[int, int]:  # (operations, items scanned)
            get = r["get"]
            for k in get_keys:
                get(k)
            return len(get_keys), 0

        def batches(r: dict[str, Any]) -> tuple[int, int]:
            get_many = r["get_many"]
            for batch in many:
                get_many(batch)
            return 10 * len(many), 0

        def scanner(prefixes: list[bytes]) -> Callable[[dict[str, Any]], tuple[int, int]]:
            def run(r: dict[str, Any]) -> tuple[int, int]:
                scan = r["scan"]
                return len(prefixes), sum(scan(x) for x in prefixes)
            return run

        workloads = [(wg, gets), (wm, batches), *((wsc[n], scanner(prefixes)) for n, prefixes in scans.items())]
        with contextlib.ExitStack() as stack:
            readers: list[tuple[Entry, dict[str, Any]]] = []
            for system, label, role, opener in self.read_entries():
                entry = Entry(system, label, role, lambda d: Target())
                d = stack.enter_context(self.tmp())
                try:
                    reader = opener(d, keys, value)
                    stack.callback(reader["close"])
                    assert reader["get"](keys[0]) == value, f"{label}: wrong value read back"
                    assert list(reader["get_many"](keys[:10])) == [value] * 10, f"{label}: get_many wrong"
                    for n, prefixes in scans.items():
                        got = reader["scan"](prefixes[0])
                        assert got == n, f"{label}: a {n}-key scan counted {got}"
                except Exception as exc:
                    traceback.print_exc()
                    for w in (wg, wm, *wsc.values()):
                        w["rows"].append({"system": system, "label": label, "role": role,
                                          "error": f"{type(exc).__name__}: {exc}"})
                    continue
                readers.append((entry, reader))
            best: dict[tuple[str, str], dict[str, Any]] = {}
            failed: dict[tuple[str, str], str] = {}
            for i in range(p.read_passes):
                order = readers[i % len(readers):] + readers[:i % len(readers)] if readers else []
                for w, body in workloads:
                    for entry, reader in order:
                        key = (w["id"], entry.system)
                        if key in failed:
                            continue
                        gc.collect()
                        try:
                            start = time.perf_counter()
                            ops, items = body(reader)
                            el = time.perf_counter() - start
                        except Exception as exc:
                            traceback.print_exc()
                            failed[key] = f"{type(exc).__name__}: {exc}"
                            continue
                        if key not in best or el < best[key]["seconds"]:
                            best[key] = {"ops": ops, "seconds": el, "ops_per_s": ops / el}
                            if items:
                                best[key].update(items=items, items_per_s=items / el)
            for w, _ in workloads:
                for entry, _ in readers:
                    row: dict[str, Any] = {"system": entry.system, "label": entry.label, "role": entry.role,
                                           "passes": p.read_passes}
                    key = (w["id"], entry.system)
                    if key in failed:
                        row["error"] = failed[key]
                        log(f"  {w['id']:<28} {entry.label:<52} ERROR {row['error']}")
                    else:
                        row.update(best[key])
                        log(f"  {w['id']:<28} {entry.label:<52} {row[w['metric']]:>14,.0f} {w['unit']} "
                            f"(best of {p.read_passes} interleaved passes)")
                    w["rows"].append(row)

    def read_entries(self) -> list[tuple[str, str, str, Callable[[str, list[bytes], bytes], dict[str, Any]]]]:
        out: list[tuple[str, str, str, Callable[[str, list[bytes], bytes], dict[str, Any]]]] = []
        if self.enabled("agentwal-store"):
            out.append(("agentwal-store", "agentwal Store (the writer)", "agentwal", open_store_reader))
            out.append(("agentwal-store@readonly", "agentwal Store (a read-only opener)", "agentwal",
                        functools.partial(open_store_reader, readonly=True)))
        if self.enabled("lmdb") and (m := self.peer("lmdb")) is not None:
            out.append(("lmdb", "LMDB, a read txn per get / scan", "peer", functools.partial(open_lmdb_reader, m,
                                                                                              one_txn=False)))
            out.append(("lmdb@one-txn", "LMDB, one read txn for all", "peer",
                        functools.partial(open_lmdb_reader, m, one_txn=True)))
        if self.enabled("sqlite") and (m := self.peer("sqlite")) is not None:
            out.append(("sqlite", "SQLite SELECT (WAL)", "peer", functools.partial(open_sqlite_reader, m)))
        if self.enabled("rocksdb") and (m := self.peer("rocksdb")) is not None:
            out.append(("rocksdb", "RocksDB (rocksdict) get / items(from_key)", "peer",
                        functools.partial(open_rocks_reader, m)))
        if self.enabled("leveldb") and (m := self.peer("leveldb")) is not None:
            out.append(("leveldb", "LevelDB (plyvel) get / iterator(prefix)", "peer",
                        functools.partial(open_level_reader, m)))
        if self.enabled("ref"):
            out.append(("ref", "Python dict / sorted list (in memory)", "ref", open_dict_reader))
        return out

    # ---- (e) latency per level

    def section_e(self) -> None:
        p = self.p
        value = os.urandom(128)
        keys = [b"l%012d" % i for i in range(p.latency_ops)]
        warm = [b"w%012d" % i for i in range(p.warmup_ops)]
        cols = (("level", "level", "str"), ("p50_us", "p50 µs", "lat"), ("p90_us", "p90 µs", "lat"),
                ("p99_us", "p99 µs", "lat"), ("p999_us", "p99.9 µs", "lat"), ("max_us", "max µs", "lat"))
        w = self.workload("e", "e.latency.128B", "Commit latency, one thread, 128 B values", "commits/s",
                          columns=cols, note=f"sync: {p.sync_seconds} s of commits each, in {p.rounds} "
                          f"interleaved round(s); interval/buffered: {p.latency_ops:,} commits, rpo_ms={RPO_MS}")
        sync_entries: list[Entry] = []
        if self.enabled("agentwal-store"):
            sync_entries.append(Entry("agentwal-store@sync", "agentwal Store.put (sync)", "agentwal",
                                      functools.partial(AgentwalStore, level="sync")))
        if self.enabled("agentwal-log"):
            sync_entries.append(Entry("agentwal-log@sync", "agentwal Log.append (sync)", "agentwal",
                                      functools.partial(AgentwalLog, level="sync")))
        sync_entries += [e for e in self.kv_entries("sync") if e.role == "peer"]
        sync_entries += self.ref_entries()
        first = len(w["rows"])
        lats = self.interleaved(w, sync_entries, functools.partial(self._a_one, conc=1, value=value))
        for row in w["rows"][first:]:
            if "error" not in row:
                row["level"] = "sync"
                row["histogram"] = latency_histogram(lats[row["label"]])
        self.samples.update(lats)
        for level in ("interval", "buffered"):
            entries = []
            if self.enabled("agentwal-store"):
                entries.append(Entry(f"agentwal-store@{level}", f"agentwal Store.put ({level})", "agentwal",
                                     functools.partial(AgentwalStore, level=level)))
            if self.enabled("agentwal-log"):
                entries.append(Entry(f"agentwal-log@{level}", f"agentwal Log.append ({level})", "agentwal",
                                     functools.partial(AgentwalLog, level=level)))
            for entry in entries:

                def body(t: Target, entry: Entry = entry, level: str = level) -> dict[str, Any]:
                    res, lat = measure_latency_loop(t, keys, value, warm)
                    self.samples[entry.label] = lat
                    res["level"] = level
                    res["histogram"] = latency_histogram(lat)
                    return res

                self.attempt(w, entry, lambda entry=entry, body=body: self.run_target(entry.factory, body))

    # ---- ratios, targets, output

    def finish_ratios(self) -> None:
        for section in self.sections.values():
            for w in section["workloads"]:
                metric = w["metric"]
                ok = [r for r in w["rows"] if "error" not in r and isinstance(r.get(metric), int | float)]
                peers = [r for r in ok if r["role"] == "peer"]
                refs = [r for r in ok if r["role"] == "ref"]
                best = max(peers, key=lambda r: r[metric]) if peers else None
                ref = refs[0] if refs else None
                w["best_peer"] = best["label"] if best else None
                w["reference"] = ref["label"] if ref else None
                for r in ok:
                    r["x_best_peer"] = r[metric] / best[metric] if best and best[metric] else None
                    r["x_reference"] = r[metric] / ref[metric] if ref and ref[metric] else None

    def find(self, wid: str, system: str) -> dict[str, Any] | None:
        for section in self.sections.values():
            for w in section["workloads"]:
                if w["id"] == wid:
                    for r in w["rows"]:
                        if r["system"] == system and "error" not in r:
                            return r
        return None

    def value(self, wid: str, system: str) -> float | None:
        r = self.find(wid, system)
        if r is None:
            return None
        for section in self.sections.values():
            for w in section["workloads"]:
                if w["id"] == wid:
                    v = r.get(w["metric"])
                    return float(v) if isinstance(v, int | float) else None
        return None

    def targets(self) -> list[dict[str, Any]]:
        p = self.p
        out: list[dict[str, Any]] = []

        def add(target: str, what: str, measured: float | None, against: float | None, threshold: float,
                *, kind: str = "ratio", higher: bool = True, missing: str = "", unjudged: str = "") -> None:
            """One check. unjudged: why this profile measures the figure but does not judge it
            (it is reported with status n/a and that reason)."""
            if measured is None or (kind == "ratio" and not against):
                out.append({"target": target, "what": what, "ratio": None, "threshold": threshold,
                            "status": "n/a", "detail": missing or "not measured in this run", "kind": kind,
                            "higher_is_better": higher})
                return
            ratio = measured / against if kind == "ratio" and against else measured
            met = ratio >= threshold if higher else ratio <= threshold
            detail = f"{measured:,.0f} vs {against:,.0f}" if kind == "ratio" else ""
            if unjudged:
                detail = f"{detail}; {unjudged}" if detail else unjudged
            out.append({"target": target, "what": what, "ratio": ratio, "threshold": threshold,
                        "status": "n/a" if unjudged else "MET" if met else "NOT MET", "detail": detail,
                        "kind": kind, "higher_is_better": higher})

        names = {"agentwal-store": "Store.put", "agentwal-log": "Log.append"}
        t1 = "one thread at sync within 10% of the bare write+fdatasync loop"
        for size in p.sizes:
            for sysk, name in names.items():
                wid = f"a.sync.{size}B.t1"
                add(t1, f"{name}, {size} B, 1 thread / preallocated-file loop", self.value(wid, sysk),
                    self.value(wid, "ref"), 0.9)
                add(t1, f"{name}, {size} B, 1 thread / appending loop", self.value(wid, sysk),
                    self.value(wid, "ref-append"), 0.9)
        t2 = "64 threads or 1,000 asyncio tasks at sync >= 10x the best of SQLite/RocksDB/LMDB (same run)"
        for size in p.sizes:
            for wid, what in ((f"a.sync.{size}B.t64", "64 threads"),
                              (f"a.sync.{size}B.async{p.tasks}", f"{p.tasks} asyncio tasks")):
                peers = [v for s in ("sqlite", "rocksdb", "lmdb") if (v := self.value(wid, s)) is not None]
                best = max(peers) if peers else None
                for sysk, name in names.items():
                    add(t2, f"{name}, {size} B, {what} / best of SQLite, RocksDB, LMDB", self.value(wid, sysk),
                        best, 10.0)
        t3 = "interval/buffered per-op commits >= 1.5x LevelDB's unsynced puts"
        lvl = self.value("b.perop.128B", "leveldb")
        for level in ("interval", "buffered"):
            for sysk, name in names.items():
                add(t3, f"{name} ({level}) / LevelDB put(sync=False), 128 B", self.value("b.perop.128B",
                                                                                          f"{sysk}@{level}"),
                    lvl, 1.5, missing="LevelDB (plyvel) or agentwal row missing")
        t4 = "batch appends several million records/s (read here as >= 2,000,000 records/s)"
        for level in ("interval", "buffered"):
            add(t4, f"Log.append_many ({level}), batches of {p.batch_size} x 128 B, records/s",
                self.value(f"b.batch{p.batch_size}.128B", f"agentwal-log@{level}"), None, 2_000_000, kind="abs")
        t5 = "recovery >= 1 GB/s scan with CRC check (1 GB = 1000 MB)"
        largest = f"c.recovery.{max(p.recovery_mb)}MB"
        # A reopen's fixed costs (a process, the LMDB environment, the first page faults) are tens
        # of milliseconds: against a log under 100 MB they, not the scan, set the MB/s, so such a
        # profile (--quick's 20 MB) reports the recovery figures without judging them.
        small_log = (f"not judged: a {max(p.recovery_mb):,} MB log is too small for MB/s, the open's fixed "
                     "costs dominate; the full profile judges 1 GB") if max(p.recovery_mb) < 100 else ""
        for sysk, what in (("agentwal-log@open-warm", "Log.open (scan + CRC), warm cache, MB/s"),
                           ("agentwal-log@open-cold", "Log.open (scan + CRC), cold cache, MB/s"),
                           ("agentwal-log@read-warm", "Log.open + full read, warm cache, MB/s"),
                           ("agentwal-log@read-cold", "Log.open + full read, cold cache, MB/s"),
                           ("agentwal-store@replay", "Store reopen with full replay, cold cache, MB/s")):
            add(t5, f"{what} ({max(p.recovery_mb):,} MB log)", self.value(largest, sysk), None, 1000, kind="abs",
                unjudged=small_log)
        # Recovery is what an open does before it returns: the log's scan with its CRC check, and
        # the store's replay of the log into LMDB. Both are held to the disk. Reading every record
        # back through a Python loop afterwards (the "Log.open + full read" rows) is the caller's
        # work, one interpreter iteration and one bytes object per record: it is reported in
        # section (c) with its ratio to the raw read, and held to the 1 GB/s above, not to this.
        # Each against a raw read of its own files in the same conditions: the log's rows against
        # the section's raw read of that log, the store's reopen against the raw reads made beside
        # each of its runs (section_c says why).
        t6 = "recovery bound by the disk, not by Python (read here as >= 0.8x a raw cold read of the same bytes)"
        for sysk, what, refk, ref_what in (
                ("agentwal-log@open-cold", "Log.open (scan + CRC check), cold", "ref", "raw sequential read, cold"),
                ("agentwal-store@replay", "Store reopen replaying the log into LMDB, cold", "ref-store",
                 "raw read of its log files beside each reopen, cold")):
            add(t6, f"{what} / {ref_what} ({max(p.recovery_mb):,} MB log)",
                self.value(largest, sysk), self.value(largest, refk), 0.8, unjudged=small_log)
        t7 = ("recovery memory flat in the log's size (read here as RSS growth at the largest / smallest <= 1.5, "
              "the smallest taken as at least the raw read's growth beside it: below that, a few MB of RSS are "
              "noise in a ratio)")
        if len(p.recovery_mb) < 2:
            out.append({"target": t7, "what": "RSS growth across log sizes", "ratio": None, "threshold": 1.5,
                        "status": "n/a", "detail": "one log size in this profile; the full run uses 100 MB and "
                        "1 GB", "kind": "ratio", "higher_is_better": False})
        else:
            small = f"c.recovery.{min(p.recovery_mb)}MB"
            for sysk, refk, what in (("agentwal-log@read-cold", "ref", "Log.open + full read"),
                                     ("agentwal-store@replay", "ref-store", "Store reopen with replay")):
                a, b, r = self.find(largest, sysk), self.find(small, sysk), self.find(small, refk)
                ga = a.get("rss_growth_mb") if a else None
                gb = b.get("rss_growth_mb") if b else None
                if ga is None or gb is None:
                    add(t7, what, None, None, 1.5, higher=False)
                    continue
                # The raw read's growth (its 8 MiB buffer and the interpreter's own noise) is the
                # resolution of these figures: a reader that grows 4 MB at 100 MB and 8 MB at 1 GB is
                # flat, which a plain ratio would call 2x.
                floor = max(1.0, r.get("rss_growth_mb") or 0.0) if r else 1.0
                ratio = ga / max(gb, floor)
                basis = f"{ga:.0f} / {gb:.0f} MB" + (f" (floor {floor:.0f} MB)" if floor > gb else "")
                out.append({"target": t7, "what": f"{what}: RSS growth {gb:.0f} MB at {min(p.recovery_mb):,} MB, "
                            f"{ga:.0f} MB at {max(p.recovery_mb):,} MB", "ratio": ratio, "threshold": 1.5,
                            "status": "MET" if ratio <= 1.5 else "NOT MET", "detail": basis,
                            "kind": "ratio", "higher_is_better": False})
        t8 = ("reads >= 0.9x LMDB's own rates through py-lmdb (a read txn per get / scan), with the store's "
              "snapshots and entry checksums on")
        for wid, what in (("d.get", "point gets"), ("d.scan10", "10-key scans"), ("d.scan50", "50-key scans"),
                          ("d.scan1000", "1,000-key scans"), ("d.get_many10", "batches of 10 gets")):
            for sysk, name in (("agentwal-store", "writer"), ("agentwal-store@readonly", "read-only opener")):
                add(t8, f"Store {what} ({name}) / LMDB", self.value(wid, sysk), self.value(wid, "lmdb"), 0.9)
        return out

    def run(self) -> dict[str, Any]:
        started = time.time()
        os.makedirs(self.out, exist_ok=True)
        machine = machine_info(self.base)
        log(f"agentwal benchmarks ({self.p.name}) -> {self.out}; temp dirs in {self.base} "
            f"({machine['filesystem']['type']})")
        self.notes.append("Each measurement opens its system in a fresh directory under one temp directory "
                          f"({self.base}, {machine['filesystem']['type']}) and removes it afterwards.")
        self.notes.append(f"(a) and (e) at sync: each measurement commits for {self.p.sync_seconds} s after "
                          f"{self.p.warmup_ops} untimed commits; every commit writes a distinct key. SQLite: one "
                          "connection per thread, autocommit INSERT OR REPLACE into a WITHOUT ROWID table; "
                          "LMDB: one write transaction per commit; agentwal Log: the payload is the value.")
        self.notes.append(f"Asyncio: agentwal uses its native API (Store.aput, Log.append_async); the peers have "
                          f"none and run through loop.run_in_executor on a {EXECUTOR_THREADS}-thread pool.")
        self.notes.append("RocksDB (rocksdict) holds the GIL during a write, so its threads do not overlap; "
                          "that is what a Python user of it gets.")
        if "a" in self.args.only or "e" in self.args.only:
            self.prepare_c_reference()
        for s in self.args.only:
            log(f"({s}) {SECTIONS[s]}")
            getattr(self, f"section_{s}")()
        self.finish_ratios()
        machine["loadavg_end"] = list(os.getloadavg())
        result = {
            "schema": 1,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "elapsed_s": time.time() - started,
            "profile": asdict(self.p),
            "args": {"only": self.args.only, "systems": self.args.systems, "out": self.out},
            "machine": machine,
            "notes": self.notes,
            "skipped": self.skipped,
            "sections": self.sections,
            "targets": self.targets(),
            "plots": [],
        }
        result["plots"] = self.plots(result)
        result["elapsed_s"] = time.time() - started
        with open(os.path.join(self.out, "results.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, sort_keys=False)
            f.write("\n")
        with open(os.path.join(self.out, "results.md"), "w", encoding="utf-8") as f:
            f.write(render_markdown(result))
        shutil.rmtree(self.base, ignore_errors=True)
        log(f"done in {result['elapsed_s']:.0f} s: {os.path.join(self.out, 'results.md')}")
        return result

    # ---- plots

    def plots(self, result: dict[str, Any]) -> list[str]:
        try:
            mpl = importlib.import_module("matplotlib")
            mpl.use("Agg")
            plt = importlib.import_module("matplotlib.pyplot")
        except ImportError:
            self.notes.append("matplotlib is not installed: no plots (`pip install '.[bench]'`).")
            return []
        made: list[str] = []
        p = self.p
        size = p.sizes[0]
        conc = [(f"a.sync.{size}B.t{n}", f"{n} thr") for n in p.threads]
        conc.append((f"a.sync.{size}B.async{p.tasks}", f"{p.tasks} tasks"))
        series: dict[str, list[float]] = {}
        for i, (wid, _) in enumerate(conc):
            for r in self._rows(wid):
                if "error" in r or r["role"] in ("ref", "ref-alt"):
                    continue
                series.setdefault(r["label"], [math.nan] * len(conc))[i] = r["ops_per_s"]
        if series:
            fig, ax = plt.subplots(figsize=(8, 5))
            xs = list(range(len(conc)))
            for label, ys in series.items():
                style = "-" if label.startswith("agentwal") else "--"
                ax.plot(xs, ys, style, marker="o", label=label, linewidth=2.2 if label.startswith("agentwal") else 1.2)
            for sysk, style in (("ref", ":"), ("ref-append", "-."), ("ref-pages", (0, (4, 1, 1, 1, 1, 1)))):
                ref = self.find(f"a.sync.{size}B.t1", sysk)
                if ref is not None:
                    ax.axhline(ref["ops_per_s"], color="grey", linestyle=style, label=ref["label"])
            ax.set_xticks(xs, [c[1] for c in conc])
            ax.set_yscale("log")
            ax.set_ylabel("durable commits/s (log scale)")
            ax.set_title(f"Durable commits of {size} B values vs concurrency ({p.name} run)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            name = f"sync_throughput_{size}B.png"
            fig.savefig(os.path.join(self.out, name), dpi=110)
            plt.close(fig)
            made.append(name)
        if self.samples:
            fig, ax = plt.subplots(figsize=(8, 5))
            for label, lat in self.samples.items():
                if not lat:
                    continue
                s = sorted(lat)
                n = len(s)
                step = max(1, n // 2000)
                xs_us = [s[i] / 1000 for i in range(0, n, step)] + [s[-1] / 1000]
                ys = [i / n for i in range(0, n, step)] + [1.0]
                ax.plot(xs_us, ys, "-" if label.startswith("agentwal") else "--", label=label)
            ax.set_xscale("log")
            ax.set_xlabel("commit latency, µs (log scale)")
            ax.set_ylabel("fraction of commits")
            ax.set_title(f"Commit latency distribution per level, one thread, 128 B ({p.name} run)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
            fig.tight_layout()
            fig.savefig(os.path.join(self.out, "latency_cdf.png"), dpi=110)
            plt.close(fig)
            made.append("latency_cdf.png")
        return made

    def _rows(self, wid: str) -> list[dict[str, Any]]:
        for section in self.sections.values():
            for w in section["workloads"]:
                if w["id"] == wid:
                    return list(w["rows"])
        return []


# ---- open a populated store for reads (d) ---------------------------------------------------------------


def open_store_reader(d: str, keys: list[bytes], value: bytes, *, readonly: bool = False) -> dict[str, Any]:
    with wal.open(d, durability="buffered", rpo_ms=1000) as s:
        for i in range(0, len(keys), 1000):
            with s.transaction() as tx:
                for k in keys[i : i + 1000]:
                    tx.put(k, value)
        s.checkpoint()
    s = wal.open(d, readonly=readonly)
    return {"get": s.get, "scan": lambda pfx: sum(1 for _ in s.scan(pfx)), "get_many": s.get_many,
            "close": s.close}


def open_lmdb_reader(mod: Any, d: str, keys: list[bytes], value: bytes, *, one_txn: bool) -> dict[str, Any]:
    env = mod.open(d, map_size=1 << 34, sync=False, metasync=False, max_readers=64)
    with env.begin(write=True) as txn:
        txn.cursor().putmulti(zip(keys, itertools.repeat(value)))
    env.sync(True)

    def scan(pfx: bytes) -> int:
        n = 0
        with env.begin() as txn:
            cur = txn.cursor()
            if cur.set_range(pfx):
                for k, _v in cur:
                    if not k.startswith(pfx):
                        break
                    n += 1
        return n

    def get_many(ks: list[bytes]) -> list[Any]:
        with env.begin() as txn:
            return [txn.get(k) for k in ks]

    if one_txn:
        rtxn = env.begin()

        def close() -> None:
            rtxn.abort()
            env.close()

        return {"get": rtxn.get, "scan": scan, "get_many": lambda ks: [rtxn.get(k) for k in ks], "close": close}

    def get(k: bytes) -> Any:
        with env.begin() as txn:
            return txn.get(k)

    return {"get": get, "scan": scan, "get_many": get_many, "close": env.close}


def _prefix_end(pfx: bytes) -> bytes:
    return pfx[:-1] + bytes([pfx[-1] + 1])


def open_sqlite_reader(mod: Any, d: str, keys: list[bytes], value: bytes) -> dict[str, Any]:
    c = mod.connect(os.path.join(d, "db.sqlite"), isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
    c.execute("BEGIN")
    c.executemany("INSERT INTO kv (k, v) VALUES (?, ?)", zip(keys, itertools.repeat(value)))
    c.execute("COMMIT")
    execute = c.execute

    def get(k: bytes) -> Any:
        row = execute("SELECT v FROM kv WHERE k = ?", (k,)).fetchone()
        return row[0] if row else None

    def scan(pfx: bytes) -> int:
        return sum(1 for _ in execute("SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k",
                                      (pfx, _prefix_end(pfx))))

    def get_many(ks: list[bytes]) -> list[Any]:
        found = dict(execute(f"SELECT k, v FROM kv WHERE k IN ({','.join('?' * len(ks))})", ks).fetchall())
        return [found.get(k) for k in ks]

    return {"get": get, "scan": scan, "get_many": get_many, "close": c.close}


def open_rocks_reader(mod: Any, d: str, keys: list[bytes], value: bytes) -> dict[str, Any]:
    db = mod.Rdict(os.path.join(d, "rocks"), mod.Options(raw_mode=True))
    for i in range(0, len(keys), 1000):
        wb = mod.WriteBatch(raw_mode=True)
        for k in keys[i : i + 1000]:
            wb.put(k, value)
        db.write(wb)

    def scan(pfx: bytes) -> int:
        n = 0
        for k, _v in db.items(from_key=pfx):
            if not k.startswith(pfx):
                break
            n += 1
        return n

    return {"get": db.get, "scan": scan, "get_many": db.get, "close": db.close}  # Rdict.get(list): a multi-get


def open_level_reader(mod: Any, d: str, keys: list[bytes], value: bytes) -> dict[str, Any]:
    db = mod.DB(os.path.join(d, "level"), create_if_missing=True)
    with db.write_batch() as wb:
        for k in keys:
            wb.put(k, value)
    return {"get": db.get, "scan": lambda pfx: sum(1 for _ in db.iterator(prefix=pfx)),
            "get_many": lambda ks: [db.get(k) for k in ks], "close": db.close}


def open_dict_reader(d: str, keys: list[bytes], value: bytes) -> dict[str, Any]:
    table = dict(zip(keys, itertools.repeat(value)))
    ordered = sorted(table.items())
    just_keys = [k for k, _ in ordered]

    def scan(pfx: bytes) -> int:
        lo = bisect.bisect_left(just_keys, pfx)
        hi = bisect.bisect_left(just_keys, _prefix_end(pfx))
        return sum(1 for _ in ordered[lo:hi])

    return {"get": table.get, "scan": scan, "get_many": lambda ks: [table.get(k) for k in ks], "close": lambda: None}


# ---- markdown ------------------------------------------------------------------------------------------

X = "\N{MULTIPLICATION SIGN}"


def _fmt(v: Any, kind: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if kind == "str":
        return str(v)
    if kind == "lat":
        return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"
    if kind == "sec":
        return f"{v:.2f}"
    if kind == "mb":
        return f"{v:,.0f}"
    if kind == "ratio":
        return f"{v:.2f}{X}" if v < 100 else f"{v:,.0f}{X}"
    return f"{v:,.0f}"


def render_markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    fs = m["filesystem"]
    lines = [
        "# agentwal side by side",
        "",
        f"Run {res['created']}, profile `{res['profile']['name']}`, {res['elapsed_s']:.0f} s; "
        f"agentwal {m['versions'].get('agentwal')}"
        + (f", git `{m['git']['commit'][:12]}`{' (dirty tree)' if m['git'].get('dirty') else ''}" if m.get("git")
           else "") + ".",
        "",
        f"Machine: {m['cpu_model']}, {m['cores']} cores ({m['cores_usable']} usable), "
        f"{m['memory_mb']} MB RAM, kernel {m['kernel']}, Python {m['python']}; temp dirs on {fs['type']} "
        f"({fs['device']} at {fs['mount']}). CRC-32C in hardware: {'yes' if m['crc32c_hardware'] else 'no'}. "
        f"Load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_start'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in m.get('loadavg_end', []))}.",
        "",
        "Peers: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if k != "agentwal") + ".",
        "",
        f"Ratios: `{X} best peer` divides by the best non-agentwal system in the same table; "
        f"`{X} reference` by the physical reference row. agentwal rows are in bold. Compare ratios "
        "within one run: absolute figures move with the machine's load.",
        "",
    ]
    if res["skipped"]:
        lines += ["**Skipped peers:**", ""] + [f"- {k}: {v}" for k, v in res["skipped"].items()] + [""]
    for key, section in res["sections"].items():
        lines += [f"## ({key}) {section['title']}", ""]
        for w in section["workloads"]:
            lines += [f"### {w['title']}", ""]
            if w.get("note"):
                lines += [f"_{w['note']}_", ""]
            if w.get("log_bytes"):
                lines += [f"Log: {w['records']:,} records, {w['log_bytes'] / MB:,.1f} MB, written with "
                          f"append_many (buffered) at {w['build_mb_per_s']:,.0f} MB/s.", ""]
            cols = w["columns"]
            head = ["system", w["unit"], f"{X} best peer", f"{X} reference", *[c[1] for c in cols], "notes"]
            lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 2)
                                                                 + ["---"]) + "|"]
            for r in w["rows"]:
                label = f"**{r['label']}**" if r["role"] == "agentwal" else r["label"]
                if r["role"] == "ref":
                    label += " _(reference)_"
                elif r["role"] == "ref-alt":
                    label += " _(reference variant)_"
                if "error" in r:
                    lines.append(f"| {label} | error | | | " + " | " * len(cols) + f"{r['error'][:120]} |")
                    continue
                notes = []
                if r.get("note"):
                    notes.append(r["note"])
                extra = r.get("extra") or {}
                if extra.get("fsyncs") and r["role"] == "agentwal":
                    notes.append(f"{extra.get('fsyncs', 0):,} fsyncs, {extra['group_size_mean']:.1f} commits/fsync")
                if extra.get("backpressure_waits"):
                    notes.append(f"{extra['backpressure_waits']:,} back-pressure waits")
                cells = [label, _fmt(r.get(w["metric"]), "int"), _fmt(r.get("x_best_peer"), "ratio"),
                         _fmt(r.get("x_reference"), "ratio"), *[_fmt(r.get(c[0]), c[2]) for c in cols],
                         "; ".join(notes)]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    lines += ["## Targets of BRIEF §7", ""]
    counts = {s: sum(1 for t in res["targets"] if t["status"] == s) for s in ("MET", "NOT MET", "n/a")}
    lines += [f"{counts['MET']} met, {counts['NOT MET']} not met, {counts['n/a']} not measured or not judged in this "
              "profile (the row says which). Where BRIEF §7 is "
              "vague the threshold used is stated in the target's heading.", ""]
    current = None
    for t in res["targets"]:
        if t["target"] != current:
            current = t["target"]
            lines += ["", f"**{current}**", "", "| measured | figures | ratio / value | threshold | status |",
                      "|---|---:|---:|---:|---|"]
        if t["ratio"] is None:
            val = "-"
        elif t.get("kind") == "abs":
            val = f"{t['ratio']:,.0f}"
        else:
            val = f"{t['ratio']:.2f}{X}"
        sign = ">=" if t.get("higher_is_better", True) else "<="
        thr = f"{sign} {t['threshold']:,.0f}" if t.get("kind") == "abs" else f"{sign} {t['threshold']:g}{X}"
        status = f"**{t['status']}**" if t["status"] == "NOT MET" else t["status"]
        lines.append(f"| {t['what']} | {t['detail']} | {val} | {thr} | {status} |")
    lines.append("")
    if res["plots"]:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in res["plots"]] + [""]
    lines += ["## Notes", ""] + [f"- {n}" for n in res["notes"]] + [""]
    return "\n".join(lines)


# ---- entry point ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    epilog = "sections:\n" + "\n".join(f"  {k}  {v}" for k, v in SECTIONS.items())
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short budgets (under two minutes); 20 MB recovery")
    ap.add_argument("--out", help="output directory (default benchmarks/results/<timestamp>/)")
    ap.add_argument("--only", default="a,b,c,d,e", help="sections to run, e.g. a,e (default: all)")
    ap.add_argument("--systems", default="", help="comma list of system prefixes to include, among "
                    + ", ".join(SYSTEMS) + " (default: all)")
    ap.add_argument("--tmpdir", default=None, help="where the fresh temp directories go (default: the system's)")
    ap.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_hide-peers", dest="hide_peers", default="", help=argparse.SUPPRESS)
    ap.add_argument("--_child", dest="child", nargs=3, metavar=("KIND", "DIR", "LIMIT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return args
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad or not only:
        ap.error(f"--only takes sections among {', '.join(SECTIONS)}; got {args.only!r}")
    args.only = [s for s in SECTIONS if s in only]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in args.systems:
        if not any(name.startswith(s) for name in SYSTEMS):
            ap.error(f"--systems: {s!r} matches none of {', '.join(SYSTEMS)}")
    if args.out is None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        args.out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", stamp)
    args.out = os.path.abspath(args.out)
    if args.tmpdir:
        os.makedirs(args.tmpdir, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        kind, d, limit = args.child
        child_main(kind, d, int(limit))
        return 0
    profile = PROFILES["smoke" if args.smoke else "quick" if args.quick else "full"]
    Runner(args, profile).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
