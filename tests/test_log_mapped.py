"""An `interval` log stores its records through a shared mapping of the segment (native/mapstore.c).

What that path promises, and what these tests hold it to:

* where it is used: `interval` logs on filesystems that overwrite in place (ext4, XFS, tmpfs);
  never for `sync` or `buffered`, never on others, never while a failpoint is armed;
* what a store gives: the record is in the page cache when the append returns (another file
  descriptor reads it at once), so a process kill loses nothing -- the kill tests of
  tests/test_log_kill.py run their `interval` children on the same filesystem as `tmp_path`,
  which the first test shows is a mapped one here;
* what a store never does: kill the process. A page the kernel cannot provide (here: cut off
  the file behind the writer's back) fails the write with EIO and stops the log, as a failed
  write() does.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import wal
import wal.drill.failpoints
from wal._mounts import mount_of, mounts

MAPPED_FS = {"ext4", "xfs", "tmpfs"}


def fstype(path: Path) -> str:
    m = mount_of(str(path), mounts())
    assert m is not None, f"no mount found for {path}"
    return m.fstype


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A directory on tmpfs (/dev/shm), a filesystem where stores are always mapped."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        assert fstype(Path(d)) == "tmpfs"
        yield Path(d)


def payload(i: int) -> bytes:
    return b"record-%08d:" % i + bytes([i % 251]) * (i % 300)


def append_and_read_back(d: Path, n: int, **kwargs: object) -> dict[str, object]:
    with wal.Log.open(d, durability="interval", rpo_ms=100, **kwargs) as log:  # type: ignore[arg-type]
        lsns = [log.append(payload(i)) for i in range(n)]
        stats = log.stats()
    assert lsns == list(range(1, n + 1))
    with wal.Log.open(d, durability="interval", rpo_ms=100, **kwargs) as log:  # type: ignore[arg-type]
        assert [(lsn, bytes(p)) for lsn, p in log.read()] == [(i + 1, payload(i)) for i in range(n)]
    return stats


def test_interval_records_are_stored_through_a_mapping_on_tmpfs_and_read_back(shm_dir: Path) -> None:
    # 1 MiB segments and ~170 B records: several rolls and many moves of the 256 KiB window
    stats = append_and_read_back(shm_dir, 20_000, segment_bytes=1 << 20)
    assert stats["segments_created"] >= 3
    assert stats["mapped_writes"] > 19_000  # all but the first write of each segment (before its zeros)


def test_interval_records_on_the_test_filesystem_are_mapped_exactly_when_it_overwrites_in_place(
        tmp_path: Path) -> None:
    stats = append_and_read_back(tmp_path, 2_000)
    mapped = stats["mapped_writes"]
    assert isinstance(mapped, int)
    assert (mapped > 0) == (fstype(tmp_path) in MAPPED_FS), (fstype(tmp_path), mapped)


@pytest.mark.parametrize("durability", ["sync", "buffered"])
def test_sync_and_buffered_logs_write_with_write_calls_only(shm_dir: Path, durability: str) -> None:
    with wal.Log.open(shm_dir, durability=durability, rpo_ms=None if durability == "sync" else 100) as log:
        for i in range(200):
            log.append(payload(i))
        log.sync()
        stats = log.stats()
    assert stats["writes"] > 0
    assert stats["mapped_writes"] == 0


def test_each_acknowledged_record_is_in_the_page_cache_when_append_returns(shm_dir: Path) -> None:
    # A 1 MiB segment: each check below reads the whole file, and 300 reads of a 64 MiB one
    # could outlast the RPO on a loaded machine (the flusher would then sync, and the last
    # assertion could no longer tell the store's bytes from the disk's).
    with wal.Log.open(shm_dir, durability="interval", rpo_ms=60_000, segment_bytes=1 << 20) as log:
        segment = next(shm_dir.glob("*.wal"))
        with open(segment, "rb") as other_fd:
            for i in range(300):
                p = b"acknowledged-%06d" % i
                log.append(p)
                other_fd.seek(0)
                assert p in other_fd.read(), f"record {i} not in the file when its append returned"
        assert log.stats()["mapped_writes"] > 250
        assert log.watermarks.durable < 300  # the flusher had not synced them: the bytes came from the store


def test_while_a_failpoint_is_armed_every_interval_write_goes_through_it(shm_dir: Path) -> None:
    with wal.Log.open(shm_dir, durability="interval", rpo_ms=10_000) as log:
        for i in range(100):
            log.append(payload(i))
        mapped = log.stats()["mapped_writes"]
        assert mapped > 0
        with wal.drill.failpoints.failpoint("write", nth=1_000_000):  # armed, never reached here
            for i in range(100):
                log.append(payload(i))
            assert wal.drill.failpoints.calls("write") >= 100
        assert log.stats()["mapped_writes"] == mapped
        wal.drill.failpoints.arm("write", nth=1)
        try:
            with pytest.raises(wal.FailedError):
                log.append(b"this write fails")
        finally:
            wal.drill.failpoints.clear()
        with pytest.raises(wal.FailedError):
            log.close()


CUT_CHILD = r"""
import glob, os, sys
import wal
d = sys.argv[1]
log = wal.Log.open(d, durability="interval", rpo_ms=10_000)
for i in range(100):
    log.append(b"x" * 100)
stats = log.stats()
assert stats["mapped_writes"] > 0, stats
segment = glob.glob(os.path.join(d, "*.wal"))[0]
os.truncate(segment, stats["segment_offset"] & ~4095)  # the tail's page is no longer in the file
try:
    log.append(b"y" * 100)
except wal.FailedError as exc:
    print("FailedError:", exc, flush=True)
else:
    print("acknowledged", flush=True)
try:
    log.append(b"z")
except wal.FailedError:
    print("then refused", flush=True)
"""


@pytest.mark.parametrize("faulthandler", [False, True], ids=["plain", "faulthandler-enabled"])
def test_a_store_into_a_page_the_kernel_cannot_provide_fails_the_write_with_eio(
        shm_dir: Path, faulthandler: bool) -> None:
    # The kernel reports it with SIGBUS; mapstore.c turns it into the EIO a write() would
    # have had. With Python's faulthandler on (installed before ours) the signal is still ours.
    args = [sys.executable, *(["-X", "faulthandler"] if faulthandler else []), "-c", CUT_CHILD, str(shm_dir)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert lines[0].startswith("FailedError:") and "write" in lines[0] and "Input/output error" in lines[0], lines
    assert lines[1:] == ["then refused"]
    assert "Fatal Python error" not in done.stderr
