"""A `sync` log writes whole pages and lets the page cache drop what a lone commit's fdatasync
made durable (native/writer.c "Whole pages"; docs/performance.md, "Whole pages").

What that promises, and what these tests hold it to:

* the bytes on disk are the format's, exactly: the page's earlier bytes rewritten as they were,
  zeros after the last record (zero tail), across page boundaries, segment rolls and reopens;
* after one thread's commits the segment's pages are out of the page cache (mincore), where a
  `buffered` log's stay -- the control that shows the measurement can see them;
* a write refused half-way (ENOSPC) and retried rewrites the same whole pages; nothing
  acknowledged is lost.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import wal
import wal.drill.failpoints
from wal.log import format as fmt

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident(path: Path) -> list[bool]:
    """Whether each page of the file is in the page cache: mincore(2) on a fresh shared
    mapping, which faults nothing in."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return [bool(v & 1) for v in vec]
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def payload(i: int) -> bytes:
    """Sizes from 0 to past two pages, so records start and end anywhere in a page."""
    return bytes([i % 251]) * ((i * 977) % (2 * PAGE + 300))


def segments(d: Path) -> list[Path]:
    return sorted(d.glob("*.wal"))


def scan_exact(d: Path) -> list[bytes]:
    """The log's records, in order, once every segment has scanned clean with the reference
    decoder, is as long as its header says it was made, and holds nothing but zeros after its
    last record."""
    got: list[bytes] = []
    segs = segments(d)
    for i, seg in enumerate(segs):
        data = seg.read_bytes()
        r = fmt.scan_segment(data)
        assert r.status == ("open" if i == len(segs) - 1 else "sealed"), (seg.name, r.status, r.reason)
        assert r.header is not None and len(data) == r.header.prealloc_bytes, (seg.name, len(data))
        assert not any(data[r.end_offset:]), f"{seg.name}: non-zero bytes after offset {r.end_offset}"
        got.extend(p for _, p in r.payloads)
    return got


def assert_format_exact(d: Path, expected: list[bytes]) -> None:
    assert scan_exact(d) == expected


def run_threads(n: int, target: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=target, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("preallocate", ["size", "zeros"])
@pytest.mark.parametrize("segment_bytes", [64 << 10, (64 << 10) + 1000], ids=["aligned", "unaligned"])
def test_one_threads_sync_commits_write_the_format_exactly_across_pages_rolls_and_reopens(
        tmp_path: Path, preallocate: str, segment_bytes: int) -> None:
    sent: list[bytes] = []
    for session in range(3):  # each reopen resumes in the middle of a page
        with wal.Log.open(tmp_path, durability="sync", segment_bytes=segment_bytes, preallocate=preallocate) as log:
            for i in range(60):
                sent.append(payload(session * 60 + i))
                log.append(sent[-1])
            log.append_many([payload(i) for i in range(7)])  # a batch of several records
            sent.extend(payload(i) for i in range(7))
            sent.append(b"%d" % session * 50_000)  # larger than a segment: a segment of its own size
            log.append(sent[-1])
            for i in range(8):  # small ones, several to a page, after the roll: past LONE_STREAK
                sent.append(b"small %d" % i)
                log.append(sent[-1])
        assert_format_exact(tmp_path, sent)
    assert len(segments(tmp_path)) > 3  # the records rolled segments
    with wal.Log.open(tmp_path, readonly=True) as log:
        assert [bytes(p) for _, p in log.read()] == sent


def test_a_reopened_log_rewrites_the_bytes_before_its_tail_as_they_were(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="sync") as log:
        for i in range(5):
            log.append(b"x" * (PAGE // 3 + i))
    seg = segments(tmp_path)[0]
    before = seg.read_bytes()
    tail = fmt.scan_segment(before).end_offset
    assert tail % PAGE > 100  # the next writes start mid-page: that page's bytes come from the writer
    added = [b"after the reopen %d" % i for i in range(10)]  # past LONE_STREAK, within the page
    assert tail % PAGE + sum(24 + len(p) + 8 + 24 for p in added) < PAGE
    with wal.Log.open(tmp_path, durability="sync") as log:
        for p in added:
            log.append(p)
    after = seg.read_bytes()
    assert after[:tail] == before[:tail]
    assert_format_exact(tmp_path, [b"x" * (PAGE // 3 + i) for i in range(5)] + added)


@pytest.mark.parametrize("preallocate", ["size", "zeros"])
def test_a_lone_committers_synced_pages_leave_the_page_cache_and_a_buffered_logs_stay(
        tmp_path: Path, preallocate: str) -> None:
    probe = tmp_path / "probe"
    probe.write_bytes(b"\1" * (64 * PAGE))
    fd = os.open(probe, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if sum(resident(probe)) > 8:
        pytest.skip("this filesystem keeps a file's clean pages after POSIX_FADV_DONTNEED (tmpfs does)")

    def commit_and_count(level: wal.Durability, d: Path) -> int:
        with wal.Log.open(d, durability=level, segment_bytes=8 << 20, preallocate=preallocate) as log:
            for i in range(400):
                log.append(os.urandom(PAGE if i % 2 else 100))
            log.sync()
            seg = segments(d)[0]
            cached = resident(seg)  # before reading the file, which caches it
            end = fmt.scan_segment(seg.read_bytes()).end_offset
            return sum(cached[: -(-end // PAGE)])  # the pages that hold records

    written_pages = 200 * (PAGE + 24 + 100 + 24 + 24) // PAGE  # records and marks
    sync_resident = commit_and_count("sync", tmp_path / "sync")
    buffered_resident = commit_and_count("buffered", tmp_path / "buffered")
    assert buffered_resident >= written_pages  # the measurement sees cached pages
    assert sync_resident <= 4, f"{sync_resident} of the sync log's pages still cached"


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "half-written"])
@pytest.mark.parametrize("before", [1, 6], ids=["before-any-drop", "after-drops"])
def test_a_refused_whole_page_write_is_rewritten_once_space_returns(tmp_path: Path, partial: bool, before: int) -> None:
    sent = [payload(i) for i in range(1, 7 + before)]
    with wal.Log.open(tmp_path, durability="sync", segment_bytes=64 << 10) as log:
        for p in sent[:before]:
            log.append(p)
        with wal.drill.failpoints.failpoint("write", errno.ENOSPC, partial=partial, repeat=True), \
                pytest.raises(wal.NoSpaceError):
            log.append(sent[before])
        for p in sent[before + 1:]:
            log.append(p)
    assert_format_exact(tmp_path, sent)  # the refused record too: rewritten before the next


def test_writes_refused_at_random_under_many_committers_come_out_exact(tmp_path: Path) -> None:
    """A batch refused for lack of space goes back in front of what queued meanwhile, so its
    retry may write spans of which the first already went out before a later one failed; the
    next retry then rewrites that first one where it is. Whatever the order of refusals, the
    segments hold the format exactly and every acknowledged record."""
    acknowledged: dict[int, bytes] = {}
    refused = 0
    # one segment: a batch that rolls one is not retried (a failure there stops the log)
    with wal.Log.open(tmp_path, durability="sync", segment_bytes=8 << 20) as log:
        def commit(t: int) -> None:
            nonlocal refused
            for i in range(80):
                p = payload(t * 1000 + i)
                try:
                    acknowledged[log.append(p)] = p
                except wal.NoSpaceError:
                    refused += 1

        with wal.drill.failpoints.failpoint("write", errno.ENOSPC, probability=0.3, seed=11, partial=True):
            run_threads(8, commit)
        log.append(b"space is back")
    assert refused > 0
    found = scan_exact(tmp_path)
    assert found[-1] == b"space is back"
    assert all(found[lsn - 1] == p for lsn, p in acknowledged.items())


def test_many_threads_commits_write_the_format_exactly(tmp_path: Path) -> None:
    sent: dict[int, bytes] = {}
    with wal.Log.open(tmp_path, durability="sync", segment_bytes=256 << 10) as log:
        def commit(t: int) -> None:
            for i in range(60):
                p = payload(t * 1000 + i)
                sent[log.append(p)] = p

        run_threads(8, commit)
    assert_format_exact(tmp_path, [sent[lsn] for lsn in sorted(sent)])
