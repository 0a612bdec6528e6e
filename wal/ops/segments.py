"""Reading log segments directly from their files, past damage, while a writer may be appending.

Reading past damage (`dump --salvage`, and `tail`'s incremental polling) uses one trick:
the C scanner validates a whole segment image from its header, so to scan from some
offset P with next LSN N we hand it the segment's 64-byte header with ``first_lsn``
rewritten to N (and its CRC recomputed) followed by the bytes from P on. The scanner's
offsets in that image are mapped back by adding ``P - 64``.


A record the writer is copying in at that moment looks torn, or -- for a few microseconds
-- like damage in the middle of the log; a scan that finds damage in the newest segment
looks again until it holds still (`recovery.settled_scan_buffer` does the same for
`wal.Log`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from wal._bindings import ffi, lib
from wal.errors import ArgumentError, CorruptionError, WalError
from wal.log import record, recovery
from wal.ops.target import Progress

HEADER_SIZE = 64  # FORMAT.md section 4 (native/format.h WAL_SEGMENT_HEADER_SIZE)
RECORD_HEADER_SIZE = 24  # FORMAT.md section 5; a SEAL record is just a record header
LOG_FORMAT_VERSION = int(lib.WAL_FORMAT_VERSION_CURRENT)
_SH_FIRST_LSN = 32
_SH_CRC = 60
_HEADER_BODY = struct.Struct("<8sHHIQQQQQI")  # segment header bytes 0..59 (FORMAT.md section 4)
_U64 = struct.Struct("<Q")
_REC_DATA = 1  # record type byte (offset 16 of a record header): DATA; 2 is SEAL, 3 MARK
_BATCH = 1024


# ---- scanning segments -------------------------------------------------------------------------------


@dataclass
class _Seg:
    """A segment file opened for reading. Holding the descriptor keeps it readable even after a running
    writer's checkpoint unlinks it, so a reader that listed it can always finish it."""

    number: int
    path: str
    fd: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def _open_segments(log_dir: str, after: int = -1) -> list[_Seg]:
    """Open every segment of the log numbered above `after`, in order; ones that vanish meanwhile are skipped."""
    out = []
    for number, path in recovery.list_segments(log_dir):
        if number <= after:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # removed by a checkpoint between listing and opening
        out.append(_Seg(number, path, fd))
    return out


def _close_segments(segs: list[_Seg]) -> None:
    for seg in segs:
        with contextlib.suppress(OSError):
            os.close(seg.fd)


@contextlib.contextmanager
def _mapped(seg: _Seg) -> Iterator[Any]:
    """Map a segment read-only up to its last data extent (b"" when there is nothing to map)."""
    size = os.fstat(seg.fd).st_size
    length = recovery.data_end(seg.fd, size)
    if length == 0:
        yield b""
        return
    with mmap.mmap(seg.fd, length, access=mmap.ACCESS_READ) as mm:
        yield mm


def _header_of(seg: _Seg) -> bytes:
    return os.pread(seg.fd, HEADER_SIZE, 0)


def _first_lsn_of(seg: _Seg) -> int | None:
    """first_lsn from a segment header if the header is whole and its CRC holds; else None."""
    head = _header_of(seg)
    if len(head) < HEADER_SIZE or lib.wal_crc32c(0, head, _SH_CRC) != int.from_bytes(head[_SH_CRC:], "little"):
        return None
    return int(_U64.unpack_from(head, _SH_FIRST_LSN)[0])


def _synthetic_header(buf: Any, segment_no: int) -> bytes | None:
    """A header for a segment whose own header is unreadable, from its first record (salvage only).

    The records carry the low 32 bits of the salt and their LSNs; that is all the scanner needs.
    """
    if len(buf) < HEADER_SIZE + RECORD_HEADER_SIZE:
        return None
    rec = bytes(buf[HEADER_SIZE:HEADER_SIZE + RECORD_HEADER_SIZE])
    lsn, _ = recovery.resume_lsn(buf, HEADER_SIZE)
    salt_check = struct.unpack_from("<I", rec, 20)[0]
    if not lsn or not salt_check or not segment_no:
        return None
    log_id = int(_U64.unpack_from(bytes(buf[16:24]))[0]) or 1  # the damaged header's, if it looks set
    body = _HEADER_BODY.pack(b"AGWALSEG", LOG_FORMAT_VERSION, HEADER_SIZE, 0, log_id, segment_no, lsn,
                             salt_check, 0, 0)
    return body + struct.pack("<I", lib.wal_crc32c(0, body, _SH_CRC))


@dataclass
class _View:
    """A scan of a segment from `shift + 64` on: offsets in `res` + `shift` are offsets in the file."""

    res: Any
    data: Any
    shift: int

    @property
    def status(self) -> str:
        return recovery.STATUS_NAMES[self.res.status]

    @property
    def reason(self) -> str:
        return str(ffi.string(self.res.reason).decode())

    def real(self, view_offset: int) -> int:
        return int(view_offset) + self.shift


def _scan_view(buf: Any, header: bytes | None, pos: int, first_lsn: int | None, *, settle: bool) -> _View:
    """Scan `buf` (a segment image) from `pos` expecting `first_lsn` next; `header` replaces a bad one."""

    def once() -> _View:
        if header is None and pos == HEADER_SIZE and first_lsn is None:
            return _View(recovery.scan_buffer(buf), buf, 0)
        head = header if header is not None else bytes(buf[:HEADER_SIZE])
        if first_lsn is not None:
            head = recovery.header_with_first_lsn(head, first_lsn)
        data = head + bytes(buf[pos:])
        return _View(recovery.scan_buffer(data), data, pos - HEADER_SIZE)

    view = once()
    if settle:  # the newest segment of a live writer: damage that moves on was a write in progress
        for _ in range(20):
            if view.res.status != lib.WAL_SCAN_CORRUPT:
                break
            time.sleep(0.005)
            again = once()
            if (again.res.status, again.res.bad_offset, again.res.next_valid_offset) == (
                    view.res.status, view.res.bad_offset, view.res.next_valid_offset):
                view = again
                break
            view = again
    return view


def _view_records(view: _View, from_lsn: int, upto: int | None) -> Iterator[tuple[int, int, bytes]]:
    """(lsn, file offset of the record, payload) of the valid records of a view, in batches."""
    lsns = ffi.new("uint64_t[]", _BATCH)
    offs = ffi.new("uint64_t[]", _BATCH)
    lens = ffi.new("uint32_t[]", _BATCH)
    cursor = ffi.new("uint64_t *")
    end = int(view.res.end_offset)
    while True:
        if not len(view.data):
            return
        cdata = ffi.from_buffer("uint8_t[]", view.data)
        try:
            n = lib.wal_segment_records(cdata, end, from_lsn, cursor, _BATCH, lsns, offs, lens)
            batch = [(int(lsns[k]), int(offs[k]), int(lens[k])) for k in range(n)]
        finally:
            ffi.release(cdata)  # no buffer export may outlive a batch: the map is closed after us
        if not batch:
            return
        for lsn, off, length in batch:
            if upto is not None and lsn > upto:
                return
            yield lsn, view.real(off - RECORD_HEADER_SIZE), bytes(view.data[off:off + length])


@dataclass(frozen=True)
class Skip:
    """A region `dump --salvage` could not read: [start, end) of a segment, and the LSNs it lost."""

    path: str
    start: int
    end: int | None  # None: to the end of the segment
    reason: str
    lost: tuple[int, int] | None  # first and last LSN known lost, when known

    def describe(self) -> str:
        if self.start == self.end == 0:  # about the segment as a whole, not a byte range
            text = f"{os.path.basename(self.path)}: {self.reason}"
        else:
            where = (f"bytes {self.start}..{self.end}" if self.end is not None
                     else f"from byte {self.start} to the end")
            text = f"skipped {os.path.basename(self.path)} {where} ({self.reason})"
        if self.lost is not None:
            first, last = self.lost
            text += f": LSN {first} lost" if first == last else f": LSNs {first}..{last} lost"
        return text


@dataclass(frozen=True)
class LogRecord:
    lsn: int
    payload: bytes
    path: str
    offset: int


def _segment_records(seg: _Seg, from_lsn: int, upto: int | None, *, salvage: bool, live: bool,
                     expected: int | None, on_skip: Callable[[Skip], None]) -> Iterator[LogRecord | _View]:
    """Records of one segment. Yields LogRecords, then the last `_View` (for its status and LSNs).

    Strict (salvage=False): stops at the first damage and raises CorruptionError, except a torn
    tail, which ends the segment quietly. Salvage: reports each unreadable region to `on_skip`
    and continues after it.
    """
    path, number = seg.path, seg.number
    with _mapped(seg) as buf:
        view = _scan_view(buf, None, HEADER_SIZE, None, settle=live)
        header: bytes | None = None
        if not view.res.header_ok:
            if view.reason == "unsupported version":
                raise CorruptionError(f"{path} was written by an unsupported log format version", path=path,
                                      offset=0, reason="unsupported version")
            if not salvage:
                raise CorruptionError(f"{view.reason} in the segment header of {path}", path=path, offset=0,
                                      lsn=expected, reason=view.reason)
            header = _synthetic_header(buf, number)
            if header is None:
                on_skip(Skip(path, 0, None, f"{view.reason} in the segment header, no readable record after it",
                             None))
                yield view
                return
            on_skip(Skip(path, 0, HEADER_SIZE, f"{view.reason} in the segment header; reading its records anyway",
                         None))
            view = _scan_view(buf, header, HEADER_SIZE, None, settle=live)
        seen: set[tuple[int, int]] = set()
        while True:
            if not view.res.header_ok:  # only a header we made up can fail here
                on_skip(Skip(path, view.real(HEADER_SIZE), None, f"unreadable ({view.reason})", None))
                break
            yield from (LogRecord(lsn, payload, path, off) for lsn, off, payload in _view_records(view, from_lsn, upto))
            status, res = view.status, view.res
            last = int(res.last_lsn)
            if status in ("open", "sealed") or (upto is not None and last >= upto):
                break
            bad = view.real(res.bad_offset)
            if not salvage:
                if status == "torn":
                    break  # a torn tail (or a record being written) ends the segment
                scan_text = f"{view.reason} in {path} at offset {bad} (after LSN {last})"
                if res.next_valid_offset:
                    scan_text += (f"; a valid record (LSN {res.next_valid_lsn}) follows at offset "
                                  f"{view.real(res.next_valid_offset)}")
                raise CorruptionError(f"log damaged: {scan_text}", path=path, offset=bad, lsn=last + 1,
                                      reason=view.reason)
            what = f"torn: {view.reason}" if status == "torn" else view.reason
            if res.next_valid_offset:
                # Bad bytes, then a record whose CRC holds: read on from it.
                resume = view.real(res.next_valid_offset)
                next_lsn, first_lost_after = recovery.resume_lsn(buf, resume)
                lost = (last + 1, first_lost_after) if first_lost_after >= last + 1 else None
                on_skip(Skip(path, bad, resume, what, lost))
            elif status == "torn":
                on_skip(Skip(path, bad, view.real(res.damage_end), what, None))
                break
            elif view.reason in ("lsn gap", "lsn out of order") and (bad, last) not in seen:
                # A whole DATA record (CRC holds) with an unexpected LSN: read on from it.
                seen.add((bad, last))
                next_lsn, _ = recovery.resume_lsn(buf, bad)
                lost = (last + 1, next_lsn - 1) if next_lsn - 1 >= last + 1 else None
                on_skip(Skip(path, bad, bad, f"{view.reason}: LSN {next_lsn} follows LSN {last}", lost))
                resume = bad
            elif view.reason == "data after seal":
                on_skip(Skip(path, view.real(res.end_offset), None, "data after the seal", None))
                break
            else:
                # A whole record (CRC holds) that breaks a rule (type, flags, salt, padding, seal or mark
                # fields): skip just that record.
                head = bytes(buf[bad:bad + RECORD_HEADER_SIZE])
                length = struct.unpack_from("<I", head, 4)[0]
                resume = bad + RECORD_HEADER_SIZE + ((length + 7) & ~7)
                next_lsn = last + 1
                is_data = len(head) > 16 and head[16] == _REC_DATA
                on_skip(Skip(path, bad, resume, f"{view.reason}: record skipped",
                             (last + 1, last + 1) if is_data else None))
            if resume + RECORD_HEADER_SIZE > len(buf):
                break
            view = _scan_view(buf, header, resume, next_lsn, settle=False)
        yield view


def iter_log(log_dir: str, from_lsn: int = 1, to_lsn: int | None = None, *, salvage: bool = False,
             on_skip: Callable[[Skip], None] | None = None, live: bool = True,
             segments: list[_Seg] | None = None) -> Iterator[LogRecord]:
    """Every valid record of a log with from_lsn <= LSN <= to_lsn, in log order, read-only.

    Strict: raises CorruptionError at the first damage (after yielding the records before it);
    a torn tail of the last segment ends the log quietly (a live writer may be writing it).
    salvage=True: reads past damage and tells `on_skip` each region it could not read.
    segments: already opened ones (else every segment is opened first, so that a running
    writer's checkpoint cannot remove one from under the reader).
    """
    owned = segments is None
    segs = _open_segments(log_dir) if segments is None else segments
    try:
        yield from _iter_segments(log_dir, segs, from_lsn, to_lsn, salvage=salvage,
                                  skip=on_skip or (lambda s: None), live=live)
    finally:
        if owned:
            _close_segments(segs)


def _iter_segments(log_dir: str, segs: list[_Seg], from_lsn: int, to_lsn: int | None, *, salvage: bool,
                   skip: Callable[[Skip], None], live: bool) -> Iterator[LogRecord]:
    firsts = [_first_lsn_of(seg) for seg in segs]
    if not salvage and segs and firsts[0] is not None and from_lsn < firsts[0] and (
            to_lsn is None or from_lsn <= to_lsn) and from_lsn > 1:
        raise ArgumentError(f"LSN {from_lsn} is no longer in the log of {log_dir}: its oldest record is LSN "
                            f"{firsts[0]} (older segments were removed by checkpoints)")
    expected: int | None = None
    prev_no: int | None = None
    for i, seg in enumerate(segs):
        nxt = firsts[i + 1] if i + 1 < len(firsts) else None
        if nxt is not None and nxt <= from_lsn:
            expected, prev_no = nxt, seg.number
            continue  # wholly before from_lsn
        first = firsts[i]
        if to_lsn is not None and first is not None and first > to_lsn:
            return
        if expected is not None and first is not None and first != expected:
            text = (f"first lsn mismatch: {seg.path} starts at LSN {first}, the segment before it ended at LSN "
                    f"{expected - 1}")
            if not salvage:
                raise CorruptionError(f"log damaged: {text}", path=seg.path, offset=0, lsn=expected,
                                      reason="first lsn mismatch")
            skip(Skip(seg.path, 0, 0, text, (expected, first - 1) if first > expected else None))
        elif prev_no is not None and seg.number != prev_no + 1 and salvage:
            skip(Skip(seg.path, 0, 0, f"segment number gap: segment {prev_no:016x} is followed by "
                                      f"{seg.number:016x}", None))
        is_last = i == len(segs) - 1
        view: _View | None = None
        for item in _segment_records(seg, from_lsn, to_lsn, salvage=salvage, live=live and is_last,
                                     expected=expected, on_skip=skip):
            if isinstance(item, _View):
                view = item
            else:
                yield item
        assert view is not None
        if view.res.header_ok:
            expected = int(view.res.last_lsn) + 1
        if to_lsn is not None and expected is not None and expected > to_lsn:
            return
        if not is_last and view.status != "sealed" and not salvage and view.status != "corrupt":
            raise CorruptionError(f"log damaged: missing seal: {seg.path} is not the last segment but ends "
                                  f"without a seal at offset {view.real(view.res.end_offset)}", path=seg.path,
                                  offset=view.real(view.res.end_offset), lsn=expected, reason="missing seal")
        prev_no = seg.number


# ---- info ----------------------------------------------------------------------------------------------


@dataclass
class SegmentInfo:
    name: str
    path: str
    size: int
    disk_bytes: int
    status: str  # open | sealed | torn | corrupt (the C scanner's verdict)
    reason: str
    first_lsn: int
    last_lsn: int
    records: int
    end_offset: int
    bad_offset: int
    damage_end: int
    next_valid_offset: int
    next_valid_lsn: int
    version: int
    header_ok: bool
    header_segment_no: int
    log_id: int
    prealloc_bytes: int  # the size the header says the segment was created with (rule S6)

    @property
    def damaged(self) -> bool:
        return self.status == "corrupt"


def _scan_segments(segs: list[_Seg], progress: Progress | None = None) -> list[SegmentInfo]:
    """The C scanner's verdict on each opened segment (the newest one settled: a writer may be at it)."""
    total = sum(os.fstat(seg.fd).st_size for seg in segs)
    done = 0
    out = []
    for i, seg in enumerate(segs):
        st = os.fstat(seg.fd)
        with _mapped(seg) as buf:
            res = _scan_view(buf, None, HEADER_SIZE, None, settle=i == len(segs) - 1).res
        h = res.header
        head = _header_of(seg)
        out.append(SegmentInfo(
            name=seg.name, path=seg.path, size=st.st_size, disk_bytes=st.st_blocks * 512,
            status=recovery.STATUS_NAMES[res.status], reason=ffi.string(res.reason).decode(),
            first_lsn=int(h.first_lsn), last_lsn=int(res.last_lsn), records=int(res.records),
            end_offset=int(res.end_offset), bad_offset=int(res.bad_offset), damage_end=int(res.damage_end),
            next_valid_offset=int(res.next_valid_offset), next_valid_lsn=int(res.next_valid_lsn),
            version=int.from_bytes(head[8:10], "little") if len(head) >= 10 else 0, header_ok=bool(res.header_ok),
            header_segment_no=int(h.segment_no), log_id=int(h.log_id), prealloc_bytes=int(h.prealloc_bytes),
        ))
        done += st.st_size
        if progress is not None:
            progress("scanning the log", done, total)
    return out


def _commit_time(log_dir: str, lsn: int) -> int | None:
    """time_ms of the store transaction at `lsn`, or None (unreadable or not a store record)."""
    if lsn < 1:
        return None
    try:
        for rec in iter_log(log_dir, lsn, lsn):
            return record.decode(rec.payload, rec.lsn).time_ms
    except WalError:
        return None
    return None


def last_lsn(log_dir: str) -> tuple[int, int]:
    """(first retained LSN, last valid LSN) of a log, scanning only the newest segment."""
    segs = _open_segments(log_dir)
    try:
        if not segs:
            return 1, 0
        first = _first_lsn_of(segs[0]) or 1
        with _mapped(segs[-1]) as buf:
            res = _scan_view(buf, None, HEADER_SIZE, None, settle=True).res
        return first, int(res.last_lsn) if res.header_ok else first - 1
    finally:
        _close_segments(segs)
