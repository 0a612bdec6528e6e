"""Opening a log directory: scan every segment, classify its end, cut a torn tail, refuse damage.

The per-segment rules (H*, R*) live in the C reader; the rules across segments
(S1-S5 in FORMAT.md) live here. `scan_directory` only reads; `repair` applies
what a writable open must do before the writer resumes:

* a torn tail of the last segment is cut: its bytes are saved beside the segment
  as ``<segment>.<offset>.broken`` (fsynced) and then zeroed in place (fdatasync);
* with ``recovery="truncate"``, damage anywhere is cut the same way at the last
  good record, later segments are renamed to ``*.broken``, and the lost LSN range
  is reported;
* otherwise damage raises `CorruptionError` naming the file, offset and LSN.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import re
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from wal._bindings import ffi, lib
from wal._fs import fsync_dir
from wal.errors import CorruptionError, FormatVersionError

SEGMENT_SUFFIX = ".wal"
MAX_PREALLOC = 1 << 40  # a larger preallocated-size field is not one our writer wrote: S6 ignores it
STATUS_NAMES = {lib.WAL_SCAN_OPEN: "open", lib.WAL_SCAN_SEALED: "sealed", lib.WAL_SCAN_TORN: "torn",
                lib.WAL_SCAN_CORRUPT: "corrupt"}


def segment_name(segment_no: int) -> str:
    return f"{segment_no:016x}{SEGMENT_SUFFIX}"


_SEGMENT_NAME = re.compile(r"[0-9a-f]{16}\.wal")


def parse_segment_name(name: str) -> int | None:
    """The segment number of a file named exactly `%016x.wal` (FORMAT.md §2), else None."""
    return int(name[:16], 16) if _SEGMENT_NAME.fullmatch(name) else None


def data_end(fd: int, size: int) -> int:
    """End of the last data extent: past it the file is a hole, which reads as zeros.

    Segments are preallocated by extending their size, so most of a fresh 64 MiB segment
    is a hole; scanning stops here instead of reading megabytes of zeros. The validity
    rules treat "the rest is all zero" exactly like end of file, so the result of a scan
    is the same. Filesystems without SEEK_HOLE report the whole file as data.
    """
    end = pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole from pos to the end
            return size  # SEEK_DATA not supported here
        pos = os.lseek(fd, start, os.SEEK_HOLE)
        end = pos
    return min(end, size)


@contextmanager
def mapped(path: str, *, whole: bool = False) -> Iterator[Any]:
    """Map a file read-only, up to its last data extent (all of it with whole=True).

    Yields a buffer (bytes when there is nothing to map: mmap refuses length 0)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        length = size if whole else data_end(fd, size)
        if length == 0:
            yield b""
            return
        with mmap.mmap(fd, length, access=mmap.ACCESS_READ) as mm:
            # Read front to back: ask for aggressive read-ahead, as a sequential read() gets.
            with contextlib.suppress(OSError, AttributeError):
                mm.madvise(mmap.MADV_SEQUENTIAL)
            yield mm
    finally:
        os.close(fd)


@dataclass
class SegmentScan:
    path: str
    segment_no: int  # from the file name
    size: int
    status: str  # open | sealed | torn | corrupt
    reason: str
    end_offset: int
    bad_offset: int
    damage_end: int
    records: int
    first_lsn: int
    last_lsn: int
    log_id: int
    salt: int
    header_ok: bool
    header_segment_no: int = 0
    prealloc_bytes: int = 0
    next_valid_offset: int = 0
    next_valid_lsn: int = 0


def scan_buffer(buf: Any) -> Any:
    """Run the C scan over a buffer; returns the filled wal_scan_result."""
    res = ffi.new("wal_scan_result *")
    if not len(buf):
        lib.wal_scan_segment(ffi.NULL, 0, res)
        return res
    with ffi.from_buffer("uint8_t[]", buf) as data:  # released before the caller's map closes
        lib.wal_scan_segment(data, len(buf), res)
    return res


# A store's open maps up to three segments at once (the scan's two and the replay's one), each
# holding about a step and a drop of pages: 8192 records and 4 MiB made a 1 GB replay peak
# ~10 MB above a 100 MB one (docs/performance.md, recovery memory), for no speed.
_SCAN_STEP_RECORDS = 2048  # scan_segment_file checks this many records between page drops
_DROP_BEHIND_BYTES = 1 << 20  # a reader of a mapped segment gives back pages in steps of this


def give_back_pages(buf: Any, dropped: int, offset: int) -> int:
    """A reader of a `mapped` segment has moved past `offset`: once that is _DROP_BEHIND_BYTES
    beyond `dropped` (what it gave back before), give back the pages in between and return
    the new mark. They stay in the page cache and leave this process's RSS; a pointer into
    them still reads the same bytes (faulted in again). That keeps memory flat while a
    store's open scans one segment and replays another (wal/store/replay.py)."""
    behind = offset // mmap.PAGESIZE * mmap.PAGESIZE
    if behind - dropped < _DROP_BEHIND_BYTES or not isinstance(buf, mmap.mmap):
        return dropped
    buf.madvise(mmap.MADV_DONTNEED, dropped, behind - dropped)
    return behind


def _scan_dropping_behind(buf: Any) -> Any:
    """`scan_buffer` of a mapped segment, in steps (wal_scan_records: the same verdict, field
    by field), giving back the pages already checked (`give_back_pages`): an open's scan
    holds a few MiB of a segment, not all of it."""
    if not len(buf):
        return scan_buffer(buf)
    res = ffi.new("wal_scan_result *")
    lsns = ffi.new("uint64_t[]", _SCAN_STEP_RECORDS)
    offs = ffi.new("uint64_t[]", _SCAN_STEP_RECORDS)
    lens = ffi.new("uint32_t[]", _SCAN_STEP_RECORDS)
    count = ffi.new("size_t *")
    dropped = 0
    with ffi.from_buffer("uint8_t[]", buf) as data:  # released before the caller's map closes
        while lib.wal_scan_records(data, len(buf), res, 0, _SCAN_STEP_RECORDS, lsns, offs, lens,
                                   count) == lib.WAL_SCAN_MORE:
            dropped = give_back_pages(buf, dropped, int(res.end_offset))
    return res


def scan_segment_file(path: str, segment_no: int) -> SegmentScan:
    with mapped(path) as buf:
        res = _scan_dropping_behind(buf)
    size = os.path.getsize(path)
    h = res.header
    return SegmentScan(
        path=path, segment_no=segment_no, size=size, status=STATUS_NAMES[res.status],
        reason=ffi.string(res.reason).decode(), end_offset=res.end_offset, bad_offset=res.bad_offset,
        damage_end=res.damage_end, records=res.records, first_lsn=h.first_lsn, last_lsn=res.last_lsn,
        log_id=h.log_id, salt=h.salt, header_ok=bool(res.header_ok), header_segment_no=h.segment_no,
        prealloc_bytes=h.prealloc_bytes,
        next_valid_offset=res.next_valid_offset, next_valid_lsn=res.next_valid_lsn,
    )


_SEGMENT_HEADER_BYTES = 64  # FORMAT.md section 4
_HEADER_FIRST_LSN = 32  # offset of the header's first_lsn (u64 LE)
_HEADER_CRC = 60  # offset of the header's CRC-32C of bytes 0..59
_RECORD_HEADER_BYTES = 24  # FORMAT.md section 5
_RECORD_DATA = 1  # a record header's type byte (offset 16): DATA; 2 is SEAL, 3 MARK


def header_with_first_lsn(header: bytes, first_lsn: int) -> bytes:
    """A segment header with first_lsn rewritten (and its CRC made again): put before the bytes
    of a segment from some offset on, it lets the scanner validate them as a segment of their
    own, expecting `first_lsn` next. This is how every reader goes past damage."""
    body = bytearray(header[:_HEADER_CRC])
    body[_HEADER_FIRST_LSN:_HEADER_FIRST_LSN + 8] = first_lsn.to_bytes(8, "little")
    crc = int(lib.wal_crc32c(0, bytes(body), _HEADER_CRC))
    return bytes(body) + crc.to_bytes(4, "little")


def resume_lsn(buf: Any, offset: int) -> tuple[int, int]:
    """For a whole record at `offset`: (first LSN to expect there, last LSN known lost before it).

    DATA: its own LSN, and everything before it. SEAL and MARK carry an LSN already used (the
    segment's last DATA LSN; a durable LSN), so the next DATA LSN is one more.
    """
    head = bytes(buf[offset:offset + _RECORD_HEADER_BYTES])
    lsn = int.from_bytes(head[8:16], "little")
    if head[16] == _RECORD_DATA:
        return lsn, lsn - 1
    return lsn + 1, lsn


def last_lsn_past_damage(scan: SegmentScan) -> int:
    """The highest LSN among the valid records after the damage a segment's scan stopped at,
    reading on past every damaged region (the scan itself reports only the first record after
    the first); 0 when none follows. A truncate gives all of them up, so its lost range must
    reach that far."""
    last, pos = 0, scan.next_valid_offset
    if not scan.header_ok or not pos:
        return 0
    with mapped(scan.path) as buf:
        head = bytes(buf[:_SEGMENT_HEADER_BYTES])
        while pos:
            expect, lost_before = resume_lsn(buf, pos)
            res = scan_buffer(header_with_first_lsn(head, expect) + bytes(buf[pos:]))
            last = max(last, int(res.last_lsn), lost_before)
            # A later damaged region may read as torn (no MARK after it): records past it are
            # given up all the same, so read on while a valid one follows.
            if res.status not in (lib.WAL_SCAN_CORRUPT, lib.WAL_SCAN_TORN) or not res.next_valid_offset:
                break
            pos += int(res.next_valid_offset) - _SEGMENT_HEADER_BYTES
    return last


def lost_range(directory: str, scan: DirectoryScan) -> tuple[int, int | None]:
    """The LSNs a truncate at `scan.damage` gives up: from the first lost one to the highest any
    valid record past the cut holds -- in the damaged segment past its damage, and in every later
    segment (None when no record past the cut can be read)."""
    assert scan.damage is not None
    bad = scan.segments[scan.damage.index]
    later = [scan_segment_file(p, n) for n, p in list_segments(directory) if n > bad.segment_no]
    last = max([s.last_lsn for s in later if s.header_ok]
               + [last_lsn_past_damage(s) for s in [bad, *later]] + [bad.next_valid_lsn], default=0)
    first = scan.damage.lsn
    return first, last if last >= first else None


def settled_scan_buffer(buf: Any, res: Any, *, tries: int = 20, pause: float = 0.005) -> Any:
    """Rescan the last segment of a log another process may be writing, until its damage holds still.

    A read-only reader can catch the writer in the middle of copying a batch in: it reads
    a record still being written (bad) and, a moment later in the same scan, a record after
    it that is already whole -- which looks exactly like damage in the middle of the log.
    Real damage stays put from one scan to the next; a write in progress moves on.
    """
    for _ in range(tries):
        if res.status != lib.WAL_SCAN_CORRUPT:
            return res
        time.sleep(pause)
        again = scan_buffer(buf)
        if (again.status, again.bad_offset, again.next_valid_offset) == (
                res.status, res.bad_offset, res.next_valid_offset):
            return again
        res = again
    return res


def settled_scan_segment_file(scan: SegmentScan, *, tries: int = 20, pause: float = 0.005) -> SegmentScan:
    """`settled_scan_buffer` for a SegmentScan of a file."""
    for _ in range(tries):
        if scan.status != "corrupt" or not scan.header_ok:
            return scan
        time.sleep(pause)
        again = scan_segment_file(scan.path, scan.segment_no)
        if (again.status, again.bad_offset, again.next_valid_offset) == (
                scan.status, scan.bad_offset, scan.next_valid_offset):
            return again
        scan = again
    return scan


def list_segments(directory: str) -> list[tuple[int, str]]:
    found = []
    for name in os.listdir(directory):
        number = parse_segment_name(name)
        if number is not None:
            found.append((number, os.path.join(directory, name)))
    found.sort()
    return found


@dataclass
class Damage:
    """Where the valid log ends, and why."""

    index: int  # position in the scans list of the segment with the problem
    offset: int  # keep bytes [0, offset) of that segment; the whole segment goes when offset == 0
    reason: str
    lsn: int  # first LSN lost
    message: str


@dataclass
class DirectoryScan:
    directory: str
    segments: list[SegmentScan] = field(default_factory=list)
    damage: Damage | None = None  # damage that is not a torn tail
    seconds: float = 0.0

    @property
    def last(self) -> SegmentScan | None:
        return self.segments[-1] if self.segments else None


def _describe(scan: SegmentScan) -> str:
    where = f"{scan.path} at offset {scan.bad_offset}"
    text = f"{scan.reason} in {where} (after LSN {scan.last_lsn})"
    if scan.next_valid_offset:
        text += (f"; a valid record (LSN {scan.next_valid_lsn}) follows at offset {scan.next_valid_offset}, "
                 "so this is damage, not a torn tail")
    return text


def _header_crc_ok(path: str) -> bool:
    """Whether the 64-byte header's CRC (bytes 60..63 over 0..59) holds, whatever its version says."""
    with open(path, "rb") as f:
        head = f.read(64)
    return len(head) == 64 and lib.wal_crc32c(0, head, 60) == int.from_bytes(head[60:64], "little")


# Segments an open scans at once. One sequential reader leaves a virtio or NVMe disk idle
# between its requests: two cold 1 GB readers here take ~2.1 GB/s together against ~1.3-1.8
# for one. The C scan runs without the GIL, so the threads overlap; each gives back the pages
# it has checked (give_back_pages), so memory stays a few MiB per segment.
_SCAN_AHEAD = 2


def _scans_in_order(listed: list[tuple[int, str]]) -> Generator[SegmentScan, None, None]:
    """`scan_segment_file` of each listed segment, in order, with up to _SCAN_AHEAD scans running
    ahead in threads. A caller that stops early (damage) waits for those still running, never
    for ones not started: no thread touches the files once this generator is closed."""
    if len(listed) < 2 or _SCAN_AHEAD < 2:
        for number, path in listed:
            yield scan_segment_file(path, number)
        return
    pool = ThreadPoolExecutor(max_workers=_SCAN_AHEAD, thread_name_prefix="agentwal-scan")
    try:
        todo = iter(listed)
        ahead: deque[Future[SegmentScan]] = deque(
            pool.submit(scan_segment_file, path, number) for number, path in itertools.islice(todo, _SCAN_AHEAD))
        while ahead:
            scan = ahead.popleft().result()
            if (following := next(todo, None)) is not None:
                ahead.append(pool.submit(scan_segment_file, following[1], following[0]))
            yield scan
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def scan_directory(directory: str, on_sealed: Callable[[SegmentScan], None] | None = None) -> DirectoryScan:
    """Scan every segment and apply the cross-segment rules S1-S5. Reads only.

    on_sealed: called, in order, with each segment but the newest once it has passed every
    rule (so it is SEALED and was fdatasynced before its successor was created), while the
    next segments are being scanned (`_scans_in_order`). A caller that works on those records
    in another thread overlaps that work with the scan's reads.
    """
    started = time.monotonic()
    result = DirectoryScan(directory)
    listed = list_segments(directory)
    with contextlib.closing(_scans_in_order(listed)) as scans:
        for i, ((number, path), scan) in enumerate(zip(listed, scans, strict=True)):
            result.segments.append(scan)
            prev = result.segments[i - 1] if i else None
            is_last = i == len(listed) - 1
            problem = None
            if not scan.header_ok:
                if scan.reason == "unsupported version" and not _header_crc_ok(path):
                    # Another version number behind a header CRC that does not hold is a damaged
                    # version field (a flipped byte), not a file from another agentwal: corruption.
                    scan.reason = "bad header crc"
                if scan.reason == "unsupported version":
                    raise FormatVersionError(
                        f"{path} was written by an unsupported log format version; this agentwal reads "
                        f"version {lib.WAL_FORMAT_VERSION_CURRENT}. Open it with the agentwal that wrote it."
                    )
                problem = Damage(i, 0, scan.reason, prev.last_lsn + 1 if prev else 0,
                                 f"{scan.reason} in segment header of {path}")
            elif scan.segment_no != scan.header_segment_no:
                problem = Damage(i, 0, "segment name mismatch", scan.first_lsn, f"segment name mismatch: {path}")
            elif prev is not None and number != prev.segment_no + 1:
                problem = Damage(i, 0, "segment number gap", prev.last_lsn + 1,
                                 f"segment number gap: {prev.path} is followed by {path}")
            elif prev is not None and scan.log_id != prev.log_id:
                problem = Damage(i, 0, "log id mismatch", prev.last_lsn + 1,
                                 f"log id mismatch: {path} belongs to another log than {prev.path}")
            elif prev is not None and scan.first_lsn != prev.last_lsn + 1:
                problem = Damage(i, 0, "first lsn mismatch", prev.last_lsn + 1,
                                 f"first lsn mismatch: {path} starts at LSN {scan.first_lsn}, "
                                 f"{prev.path} ended at LSN {prev.last_lsn}")
            elif scan.status == "corrupt":
                problem = Damage(i, scan.end_offset, scan.reason, scan.last_lsn + 1, _describe(scan))
            elif not is_last and scan.status != "sealed":
                reason = "missing seal"
                text = (f"missing seal: {path} is not the last segment but ends without a seal at offset "
                        f"{scan.end_offset}")
                if scan.status == "torn":
                    text += f" ({_describe(scan)})"
                problem = Damage(i, scan.end_offset, reason, scan.last_lsn + 1, text)
            elif scan.status != "sealed" and cut_below_creation(scan.size, scan.prealloc_bytes):
                # S6: a segment's size is made durable before it gets its name and never shrinks, so
                # no crash leaves it shorter than the size in its header: someone cut it, and the
                # records that were there (durable, perhaps acknowledged) are gone.
                problem = Damage(i, scan.end_offset, "segment truncated", scan.last_lsn + 1,
                                 f"segment truncated: {path} is {scan.size} bytes but was created with "
                                 f"{scan.prealloc_bytes}; records after LSN {scan.last_lsn} may have been cut off")
            if problem is not None:
                result.damage = problem
                break
            if on_sealed is not None and not is_last:
                on_sealed(scan)
    result.seconds = time.monotonic() - started
    return result


def cut_below_creation(size: int, prealloc_bytes: int) -> bool:
    """Rule S6 for a segment that is not sealed: shorter than the size its header says it was
    created with (a field our writer wrote: between 1 and MAX_PREALLOC)."""
    return 0 < size < prealloc_bytes <= MAX_PREALLOC


def corruption_error(damage: Damage, scans: list[SegmentScan]) -> CorruptionError:
    scan = scans[damage.index]
    return CorruptionError(
        f"log damaged: {damage.message}. Nothing was changed. To open at the last good record "
        f"(LSN {damage.lsn - 1}) and set the rest aside, pass recovery='truncate' "
        "(or run `agentwal repair`).",
        path=scan.path, offset=scan.bad_offset if damage.offset else 0, lsn=damage.lsn, reason=damage.reason,
    )


def cut_tail(path: str, offset: int, end: int) -> str | None:
    """Save bytes [offset, end) of a segment beside it as .broken, then zero them in place.

    Order matters for I4 (a crash here, then another open, gives the same log): the
    copy is durable before the original bytes are overwritten, and zeroing the same
    range twice is harmless.
    """
    if end <= offset:
        return None
    broken = f"{path}.{offset:016x}.broken"
    with open(path, "r+b") as seg:
        seg.seek(offset)
        data = seg.read(end - offset)
        if any(data):
            # Never over an earlier copy: a crash while these bytes were being zeroed leaves a
            # copy made whole before the zeroing began, and this read of them half zeroed.
            n = 0
            while os.path.exists(broken):
                n += 1
                broken = f"{path}.{offset:016x}.{n}.broken"
            fd = os.open(broken, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except BaseException:
                # Nothing was zeroed yet, so the bytes are still in the segment: a copy cut short
                # (a full disk) is no evidence of anything; the next open copies them again.
                with contextlib.suppress(OSError):
                    os.unlink(broken)
                raise
            finally:
                os.close(fd)
            fsync_dir(os.path.dirname(path) or ".")
        seg.seek(offset)
        seg.write(bytes(len(data)))
        seg.flush()
        os.fdatasync(seg.fileno())
    return broken


def set_aside(path: str) -> str:
    """Rename a whole segment out of the log, kept as ``<name>.broken`` -- or, where an earlier
    recovery set aside a segment of that name (the log resumed before it and rolled into the
    name again), ``<name>.<n>.broken``: never over it. The writer holds the log's LOCK, so no
    one else takes the name between the look and the rename."""
    broken = f"{path}.broken"
    n = 0
    while os.path.lexists(broken):
        n += 1
        broken = f"{path}.{n}.broken"
    os.rename(path, broken)
    fsync_dir(os.path.dirname(path) or ".")
    return broken


def remove_temp_files(directory: str) -> None:
    """Segments still named *.tmp never became part of the log (segment.c renames after fsync)."""
    for name in os.listdir(directory):
        if name.endswith(SEGMENT_SUFFIX + ".tmp"):
            os.unlink(os.path.join(directory, name))
