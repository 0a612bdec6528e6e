"""Micro-benchmarks of agentwal's hot paths (pytest-benchmark).

    python -m pytest benchmarks/test_micro.py --benchmark-only

Not part of the test suite (pyproject's testpaths is tests/). Each benchmark also checks its
result, so a broken hot path fails instead of looking fast. The side-by-side comparison with
SQLite, LMDB, RocksDB and LevelDB is benchmarks/compare.py.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import wal
from wal._bindings import ffi, lib
from wal.log import record, recovery
from wal.store.store import LOG_DIR

pytest.importorskip("pytest_benchmark")

LEVELS = ("sync", "interval", "buffered")
PAYLOAD = os.urandom(128)


def _rpo(level: str) -> int | None:
    return None if level == "sync" else 1000


# ---- CRC-32C ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [4096, 1 << 20], ids=["4KiB", "1MiB"])
def test_crc32c(benchmark: pytest.FixtureRequest, size: int) -> None:
    data = os.urandom(size)
    buf = ffi.from_buffer(data)
    benchmark.extra_info["bytes"] = size
    benchmark.extra_info["hardware"] = bool(lib.wal_crc32c_hw_available())
    got = benchmark(lib.wal_crc32c, 0, buf, size)
    assert got == lib.wal_crc32c_sw(0, buf, size)


# ---- encode: a record framed and copied into the log's buffer ---------------------------------------------


@pytest.fixture
def buffered_log(tmp_path: Path) -> Iterator[wal.Log]:
    with wal.Log.open(tmp_path / "log", durability="buffered", rpo_ms=1000) as lg:
        yield lg


@pytest.mark.parametrize("size", [128, 4096], ids=["128B", "4KiB"])
def test_encode_append_buffered(benchmark: pytest.FixtureRequest, buffered_log: wal.Log, size: int) -> None:
    payload = os.urandom(size)
    lsn = benchmark(buffered_log.append, payload)
    assert lsn == buffered_log.watermarks.appended


def test_encode_store_record(benchmark: pytest.FixtureRequest) -> None:
    ops = [(record.OP_PUT, b"agent/7/msg/000001", PAYLOAD)]
    payload = benchmark(record.encode, ops, 1, None)
    assert record.decode(payload, 1).ops == ops


# ---- decode: the C scan of a whole 4 MiB segment, and the store record decoder ----------------------------


@pytest.fixture(scope="module")
def segment_4mib(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("seg") / "log"
    with wal.Log.open(d, durability="buffered", rpo_ms=1000, segment_bytes=4 << 20) as lg:
        while len(recovery.list_segments(str(d))) < 2:
            lg.append_many([PAYLOAD] * 1000)
    first = recovery.list_segments(str(d))[0][1]
    return Path(first).read_bytes()


def test_decode_scan_4mib_segment(benchmark: pytest.FixtureRequest, segment_4mib: bytes) -> None:
    benchmark.extra_info["bytes"] = len(segment_4mib)
    res = benchmark(recovery.scan_buffer, segment_4mib)
    assert res.status == lib.WAL_SCAN_SEALED
    benchmark.extra_info["records"] = int(res.records)


def test_decode_store_record(benchmark: pytest.FixtureRequest) -> None:
    payload = record.encode([(record.OP_PUT, b"agent/7/msg/000001", PAYLOAD)], 1, None)
    txn = benchmark(record.decode, payload, 1)
    assert txn.ops[0][2] == PAYLOAD


# ---- append and commit per level -------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_log_append(benchmark: pytest.FixtureRequest, tmp_path: Path, level: str) -> None:
    with wal.Log.open(tmp_path / "log", durability=level, rpo_ms=_rpo(level)) as lg:
        benchmark(lg.append, PAYLOAD)
        assert lg.watermarks.appended >= 1


@pytest.mark.parametrize("level", ["interval", "buffered"])
def test_log_append_many_1000(benchmark: pytest.FixtureRequest, tmp_path: Path, level: str) -> None:
    batch = [PAYLOAD] * 1000
    benchmark.extra_info["records_per_call"] = len(batch)
    with wal.Log.open(tmp_path / "log", durability=level, rpo_ms=_rpo(level)) as lg:
        last = benchmark(lg.append_many, batch)
        assert last % 1000 == 0


@pytest.mark.parametrize("level", LEVELS)
def test_store_put(benchmark: pytest.FixtureRequest, tmp_path: Path, level: str) -> None:
    keys = (b"agent/7/msg/%09d" % i for i in itertools.count())
    with wal.open(tmp_path / "store", durability=level, rpo_ms=_rpo(level)) as store:
        lsn = benchmark(lambda: store.put(next(keys), PAYLOAD))
        assert store.get(b"agent/7/msg/000000000") == PAYLOAD
        assert lsn >= 1


@pytest.mark.parametrize("level", LEVELS)
def test_store_transaction_10_puts(benchmark: pytest.FixtureRequest, tmp_path: Path, level: str) -> None:
    counter = itertools.count()

    def commit() -> int | None:
        base = next(counter) * 10
        with store.transaction() as tx:
            for i in range(base, base + 10):
                tx.put(b"agent/7/msg/%09d" % i, PAYLOAD)
        return tx.lsn

    with wal.open(tmp_path / "store", durability=level, rpo_ms=_rpo(level)) as store:
        assert benchmark(commit) is not None


# ---- replay of a small store ------------------------------------------------------------------------------

REPLAY_RECORDS = 10_000


@pytest.fixture(scope="module")
def unapplied_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose log holds REPLAY_RECORDS put transactions LMDB has not applied (as after a SIGKILL)."""
    d = tmp_path_factory.mktemp("replay") / "store"
    wal.open(d).close()
    now_ms = time.time_ns() // 1_000_000
    payloads = [record.encode([(record.OP_PUT, b"agent%04d/state" % (i % 1000), PAYLOAD)], now_ms, None)
                for i in range(REPLAY_RECORDS)]
    with wal.Log.open(d / LOG_DIR, durability="buffered", rpo_ms=1000, _store_log=True) as lg:
        lg.append_many(payloads)
    return d


def test_replay_small_store(benchmark: pytest.FixtureRequest, unapplied_store: Path, tmp_path: Path) -> None:
    copies = itertools.count()

    def fresh_copy() -> tuple[tuple[str], dict[str, object]]:
        dest = tmp_path / f"copy{next(copies)}"
        shutil.copytree(unapplied_store, dest)
        return (str(dest),), {}

    def reopen(path: str) -> int:
        store = wal.open(path, durability="buffered", rpo_ms=1000)
        try:
            return int(store.stats()["records_replayed"])
        finally:
            store.close()

    benchmark.extra_info["records"] = REPLAY_RECORDS
    replayed = benchmark.pedantic(reopen, setup=fresh_copy, rounds=5, iterations=1)
    assert replayed == REPLAY_RECORDS
