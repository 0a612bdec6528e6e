"""Operator functions behind the `agentwal` command line: inspect, verify, dump, edit, repair, follow.

Each subcommand of `wal.cli` has one function here that does the work and returns data
(dicts, dataclasses, iterators); the CLI only parses arguments and prints. Tests and
scripts may call these directly.

Read-only by default. Everything that only reads works while a writer process has the
store open: the log is read from the segment files (the C scanner checks every CRC and
LSN), the state through a read-only LMDB handle, and neither takes the writer lock. A
record the writer is copying in at that moment looks torn, or -- for a few microseconds
-- like damage in the middle of the log; a scan that finds damage in the newest segment
looks again until it holds still (`recovery.settled_scan_buffer` does the same for
`wal.Log`). Commands that write (`put`, `delete`, `import`, `checkpoint`, `repair`) open
the store as its one writer and fail with `LockedError` naming the process that holds it.

A target is a store (a directory with a ``STORE`` file; its log is ``log/``) or a bare
log directory (segment files and/or a ``LOCK`` file). `info`, `verify`, `dump`, `tail`,
`stats` and `repair` accept both; the key-value commands need a store.

Reading past damage (`dump --salvage`, and `tail`'s incremental polling) uses one trick:
the C scanner validates a whole segment image from its header, so to scan from some
offset P with next LSN N we hand it the segment's 64-byte header with ``first_lsn``
rewritten to N (and its CRC recomputed) followed by the bytes from P on. The scanner's
offsets in that image are mapped back by adding ``P - 64``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as _dt
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import wal
from wal import record, recovery
from wal._bindings import ffi, lib
from wal._mounts import MEMORY_FS, NETWORK_FS, OVERLAY_FS, mount_of, mounts
from wal.errors import ArgumentError, CorruptionError, LockedError, WalError
from wal.log import LOCK_NAME
from wal.store import ARCHIVE_DIR, LOG_DIR, MAX_KEY_BYTES, MAX_VALUE_BYTES, STATE_DIR, STORE_FILE

HEADER_SIZE = 64  # FORMAT.md section 4 (native/format.h WAL_SEGMENT_HEADER_SIZE)
RECORD_HEADER_SIZE = 24  # FORMAT.md section 5; a SEAL record is just a record header
LOG_FORMAT_VERSION = int(lib.WAL_FORMAT_VERSION_CURRENT)
_SH_FIRST_LSN = 32
_SH_CRC = 60
_HEADER_BODY = struct.Struct("<8sHHIQQQQQI")  # segment header bytes 0..59 (FORMAT.md section 4)
_U64 = struct.Struct("<Q")
_REC_DATA = 1  # record type byte (offset 16 of a record header): DATA; 2 is SEAL, 3 MARK
_BATCH = 1024

# Optional callback for long work: progress(phase, done, total).
Progress = Callable[[str, int, int], None]


class UsageError(WalError):
    """The command cannot run on this target (not a store, missing file, refused without --yes)."""


class OpsError(WalError):
    """An operator command ran and could not do what was asked; the message says why."""


# ---- targets -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a path names: a store (``kind == "store"``) or a bare log directory."""

    path: str
    kind: Literal["store", "log"]
    log_dir: str

    @property
    def is_store(self) -> bool:
        return self.kind == "store"

    @property
    def state_dir(self) -> str:
        return os.path.join(self.path, STATE_DIR)


def locate(path: str, *, need_store: bool = False) -> Target:
    """Classify `path`: a store by its STORE file, else a bare log by its segments or LOCK file."""
    if not os.path.isdir(path):
        raise UsageError(f"{path}: no such directory (give the path of an agentwal store or log)")
    if os.path.exists(os.path.join(path, STORE_FILE)):
        return Target(path, "store", os.path.join(path, LOG_DIR))
    names = os.listdir(path)
    if any(recovery.parse_segment_name(n) is not None for n in names) or LOCK_NAME in names:
        if need_store:
            raise UsageError(f"{path} is a bare log (segment files, no {STORE_FILE} file), not a store; "
                             "this command works on stores (directories made by wal.open)")
        return Target(path, "log", path)
    hint = " (it has a log/ subdirectory but no STORE file)" if os.path.isdir(os.path.join(path, LOG_DIR)) else ""
    raise UsageError(f"{path} is not an agentwal store or log: no {STORE_FILE} file and no segment files{hint}")


def lock_holder(log_dir: str) -> int | None:
    """Pid of the process holding the writer lock of `log_dir`, from /proc/locks; None if free or unknown.

    Read-only: it never takes the lock itself (a probe, however short, could make a writer
    starting at that moment fail with LockedError).
    """
    try:
        st = os.stat(os.path.join(log_dir, LOCK_NAME))
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if "->" in parts:  # a blocked waiter, not the holder
            continue
        if len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            if int(inode) == st.st_ino and (int(major, 16), int(minor, 16)) == (os.major(st.st_dev),
                                                                                 os.minor(st.st_dev)):
                return int(parts[4])
        except ValueError:
            continue
    return None


def recorded_lock_pid(log_dir: str) -> str:
    """The pid the last writer wrote into the LOCK file (stale once it exited), or '?'."""
    try:
        with open(os.path.join(log_dir, LOCK_NAME), encoding="ascii", errors="replace") as f:
            return f.read(64).strip() or "?"
    except OSError:
        return "?"


def locked_message(target: Target, command: str) -> str:
    """What to tell a user whose write command found another writer holding the store."""
    pid = lock_holder(target.log_dir)
    who = f"process {pid}" if pid is not None else f"process {recorded_lock_pid(target.log_dir)} (per its LOCK file)"
    return (f"{target.path} is open by its writer, {who}; `agentwal {command}` must open it as the one "
            "writer and cannot while that process holds the lock. Make the change through that process, or "
            "stop it (its acknowledged commits are safe) and run the command again. Read-only commands "
            "(info, get, scan, dump, verify, tail, stats, export) work while it runs.")


def open_writer(target: Target, command: str) -> wal.Store:
    """Open the store as its writer, translating LockedError into a message that says who and what to do.

    A store whose application archives released segments (``archive=True``: an ``archive/``
    directory exists) is opened the same way, so a checkpoint from here archives them too.
    """
    try:
        return wal.open(target.path, archive=os.path.isdir(os.path.join(target.path, ARCHIVE_DIR)))
    except LockedError as exc:
        raise LockedError(locked_message(target, command)) from exc


# ---- bytes in JSON ---------------------------------------------------------------------------------------


def render_bytes(data: bytes) -> str | dict[str, str]:
    """Printable UTF-8 text as a JSON string; anything else as ``{"base64": "..."}``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}
    if all(c.isprintable() or c in "\n\r\t" for c in text):
        return text
    return {"base64": base64.b64encode(data).decode("ascii")}


def parse_bytes(obj: object, what: str) -> bytes:
    """The inverse of `render_bytes`."""
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, dict) and set(obj) == {"base64"} and isinstance(obj["base64"], str):
        try:
            return base64.b64decode(obj["base64"], validate=True)
        except ValueError as exc:
            raise ArgumentError(f"{what}: bad base64 ({exc})") from None
    raise ArgumentError(f"{what} must be a string or {{\"base64\": \"...\"}}, got {obj!r}")


def text_preview(data: bytes, limit: int = 0) -> str:
    """A one-line, human-readable rendering of bytes (escapes for the unprintable)."""
    shown = data if not limit or len(data) <= limit else data[:limit]
    try:
        text = shown.decode("utf-8")
        out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    except UnicodeDecodeError:
        out = repr(shown)[2:-1]
    if shown is not data:
        out += f"... ({len(data)} bytes)"
    return out


def _iso(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record_json(lsn: int, payload: bytes, *, segment: str, offset: int, decode: bool) -> dict[str, Any]:
    """One log record as a JSON-ready dict; a store transaction's operations spelled out when `decode`."""
    out: dict[str, Any] = {"lsn": lsn, "segment": os.path.basename(segment), "offset": offset,
                           "bytes": len(payload)}
    if decode:
        try:
            txn = record.decode(payload, lsn)
        except CorruptionError as exc:
            out["payload"] = render_bytes(payload)
            out["error"] = f"not a store transaction: {exc}"
            return out
        out["time"] = _iso(txn.time_ms)
        out["time_ms"] = txn.time_ms
        if txn.idempotency_key is not None:
            out["idempotency_key"] = render_bytes(txn.idempotency_key)
        ops: list[dict[str, Any]] = []
        for kind, key, value in txn.ops:
            if kind == record.OP_PUT:
                assert value is not None
                ops.append({"op": "put", "key": render_bytes(key), "value": render_bytes(value)})
            else:
                ops.append({"op": "delete", "key": render_bytes(key)})
        out["ops"] = ops
    else:
        out["payload"] = render_bytes(payload)
    return out


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


def _with_first_lsn(header: bytes, first_lsn: int) -> bytes:
    body = bytearray(header[:_SH_CRC])
    _U64.pack_into(body, _SH_FIRST_LSN, first_lsn)
    return bytes(body) + struct.pack("<I", lib.wal_crc32c(0, bytes(body), _SH_CRC))


def _synthetic_header(buf: Any, segment_no: int) -> bytes | None:
    """A header for a segment whose own header is unreadable, from its first record (salvage only).

    The records carry the low 32 bits of the salt and their LSNs; that is all the scanner needs.
    """
    if len(buf) < HEADER_SIZE + RECORD_HEADER_SIZE:
        return None
    rec = bytes(buf[HEADER_SIZE:HEADER_SIZE + RECORD_HEADER_SIZE])
    lsn, _ = _resume_lsn(buf, HEADER_SIZE)
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
            head = _with_first_lsn(head, first_lsn)
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


def _resume_lsn(buf: Any, offset: int) -> tuple[int, int]:
    """For a whole record at `offset`: (first LSN to expect there, last LSN known lost before it).

    DATA: its own LSN, and everything before it. SEAL and MARK carry an LSN already used (the
    segment's last DATA LSN; a durable LSN), so the next DATA LSN is one more.
    """
    head = bytes(buf[offset:offset + RECORD_HEADER_SIZE])
    lsn = int(_U64.unpack_from(head, 8)[0])
    if head[16] == _REC_DATA:
        return lsn, lsn - 1
    return lsn + 1, lsn


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
                next_lsn, first_lost_after = _resume_lsn(buf, resume)
                lost = (last + 1, first_lost_after) if first_lost_after >= last + 1 else None
                on_skip(Skip(path, bad, resume, what, lost))
            elif status == "torn":
                on_skip(Skip(path, bad, view.real(res.damage_end), what, None))
                break
            elif view.reason in ("lsn gap", "lsn out of order") and (bad, last) not in seen:
                # A whole DATA record (CRC holds) with an unexpected LSN: read on from it.
                seen.add((bad, last))
                next_lsn, _ = _resume_lsn(buf, bad)
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
            header_segment_no=int(h.segment_no), log_id=int(h.log_id),
        ))
        done += st.st_size
        if progress is not None:
            progress("scanning the log", done, total)
    return out


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _tree_bytes(path: str) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of every file under path."""
    apparent = allocated = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def _extra_files(log_dir: str) -> tuple[list[str], list[str]]:
    """(.broken files, leftover .tmp segments) in a log directory."""
    names = sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []
    return ([n for n in names if n.endswith(".broken")],
            [n for n in names if n.endswith(recovery.SEGMENT_SUFFIX + ".tmp")])


def storage_warnings(path: str) -> list[str]:
    """What about the filesystem under `path` could make durability promises false, or commits fail."""
    warnings: list[str] = []
    try:
        mount = mount_of(path, mounts())
    except OSError:
        mount = None
    if mount is not None:
        point, fstype, options = mount.point, mount.fstype, mount.all_options
        if fstype in MEMORY_FS:
            warnings.append(f"{fstype} at {point}: memory-backed; every commit is lost at reboot or power "
                            "loss whatever the durability level")
        elif fstype in NETWORK_FS or fstype.startswith("fuse"):
            warnings.append(f"{fstype} at {point}: a network or FUSE filesystem; flock (the writer lock) and "
                            "fdatasync may not mean what they mean on a local disk. Use a local filesystem")
        elif fstype in OVERLAY_FS:
            warnings.append(f"overlay at {point}: a container's writable layer, discarded with the container; "
                            "put the store on a mounted volume")
        if "nobarrier" in options or "barrier=0" in options:
            warnings.append(f"{point} is mounted with write barriers off (nobarrier): fdatasync may return "
                            "before data reaches stable storage, so a power cut can lose acknowledged commits")
        if "data=writeback" in options:
            warnings.append(f"{point} is ext4 data=writeback: file data and metadata are not ordered; "
                            "agentwal's fdatasyncs still hold, other tools' files may not")
    try:
        vfs = os.statvfs(path)
        free = vfs.f_bavail * vfs.f_frsize
        total = vfs.f_blocks * vfs.f_frsize
        if total and (free < 256 << 20 or free / total < 0.05):
            warnings.append(f"only {_human(free)} free of {_human(total)}: new segments and LMDB growth "
                            "will fail with ENOSPC (commits fail; nothing acknowledged is lost)")
    except OSError:
        pass
    return warnings


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_bytes(n: float) -> str:
    return _human(n)


def _store_meta(target: Target) -> dict[str, Any]:
    with open(os.path.join(target.path, STORE_FILE), encoding="utf-8") as f:
        meta: dict[str, Any] = json.load(f)
    return meta


def info(path: str) -> dict[str, Any]:
    """Everything an operator wants to know at a glance; read-only (works while a writer runs)."""
    target = locate(path)
    out: dict[str, Any] = {"path": target.path, "kind": target.kind, "log_dir": target.log_dir}
    holder = lock_holder(target.log_dir) if os.path.isdir(target.log_dir) else None
    out["writer_pid"] = holder
    out["durability"] = "chosen by each writer when it opens the store"
    if target.is_store:
        out["store_format"] = _store_meta(target)
    opened = _open_segments(target.log_dir) if os.path.isdir(target.log_dir) else []
    try:
        segs = _scan_segments(opened)
    finally:
        _close_segments(opened)
    out["log_format_version"] = segs[0].version if segs else None
    out["segments"] = [dataclasses.asdict(s) for s in segs]
    first = segs[0].first_lsn if segs else 1
    last = segs[-1].last_lsn if segs else 0
    damaged = next((s for s in segs if s.damaged), None)
    if damaged is not None:
        last = damaged.last_lsn
    out["log"] = {"segments": len(segs), "first_lsn": first, "last_lsn": last,
                  "records": sum(s.records for s in segs),
                  "bytes": sum(s.size for s in segs), "disk_bytes": sum(s.disk_bytes for s in segs),
                  "damaged": damaged is not None,
                  "torn_tail": bool(segs) and segs[-1].status == "torn"}
    checked = VerifyReport(target, segments=segs)
    _log_problems(checked, holder is not None)  # the per-segment scans and the rules across segments
    out["log"]["problems"] = [p.message for p in checked.problems]
    out["log"]["damaged"] = bool(checked.problems)
    broken, tmps = _extra_files(target.log_dir)
    out["broken_files"] = broken
    out["tmp_files"] = tmps
    if target.is_store:
        stats = _state_stats(target)
        applied = int(stats["applied_lsn"])
        out["state"] = {"applied_lsn": applied, "keys": stats["state_keys"],
                        "map_bytes_used": stats["state_map_bytes_used"]}
        out["watermarks"] = {"log_last_lsn": last, "applied_lsn": applied,
                             "unapplied_records": max(0, last - applied)}
        oldest = _commit_time(target.log_dir, first) if segs else None
        newest = _commit_time(target.log_dir, last) if segs and last >= first else None
        now_ms = time.time() * 1000
        out["commits"] = {
            "oldest_retained": _iso(oldest) if oldest else None,
            "oldest_retained_age_s": round((now_ms - oldest) / 1000, 3) if oldest else None,
            "newest": _iso(newest) if newest else None,
            "newest_age_s": round((now_ms - newest) / 1000, 3) if newest else None,
        }
        writer = stats.get("last_writer")
        if writer:
            out["durability"] = (f"{writer['durability']}"
                                 + (f", rpo_ms={writer['rpo_ms']}" if writer.get("rpo_ms") else "")
                                 + f" (as last opened for writing, pid {writer.get('pid')}, "
                                 + f"{_iso(writer['opened_unix_ms'])})")
        ckpt = stats.get("last_checkpoint")
        if ckpt:
            out["checkpoint"] = {"last": _iso(ckpt["unix_ms"]), "age_s": round((now_ms - ckpt["unix_ms"]) / 1000, 3),
                                 "applied_lsn": ckpt["applied_lsn"]}
        else:
            out["checkpoint"] = ("none yet; the log retains the commits since "
                                 f"{out['commits']['oldest_retained'] or '(none)'}")
    apparent, allocated = _tree_bytes(target.path)
    out["total_bytes"] = apparent
    out["total_disk_bytes"] = allocated
    out["warnings"] = storage_warnings(target.path)
    return out


def _state_stats(target: Target) -> dict[str, Any]:
    """applied_lsn, state_keys, state_map_bytes_used of a store's state, read-only (zeros if it has none)."""
    if not os.path.exists(os.path.join(target.state_dir, "data.mdb")):
        return {"applied_lsn": 0, "state_keys": 0, "state_map_bytes_used": 0}
    with wal.open(target.path, readonly=True) as store:
        return store.stats()


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


# ---- verify ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where ("log" or "state"), the file and offset or key, and what."""

    area: Literal["log", "state"]
    message: str
    path: str | None = None
    offset: int | None = None
    lsn: int | None = None
    key: bytes | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"area": self.area, "message": self.message}
        for name in ("path", "offset", "lsn"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.key is not None:
            out["key"] = render_bytes(self.key)
        return out


@dataclass
class VerifyReport:
    target: Target
    segments: list[SegmentInfo] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log_records: int = 0
    log_bytes: int = 0
    first_lsn: int = 1
    last_lsn: int = 0
    applied_lsn: int | None = None
    state_keys: int | None = None
    keys_checked: int = 0
    keys_before_log: int = 0
    records_to_replay: int = 0
    seconds: float = 0.0

    @property
    def sound(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.target.path, "kind": self.target.kind, "sound": self.sound,
            "problems": [p.as_dict() for p in self.problems], "warnings": self.warnings, "notes": self.notes,
            "segments": [{"name": s.name, "status": s.status, "reason": s.reason, "first_lsn": s.first_lsn,
                          "last_lsn": s.last_lsn, "records": s.records} for s in self.segments],
            "log_records": self.log_records, "log_bytes": self.log_bytes, "first_lsn": self.first_lsn,
            "last_lsn": self.last_lsn, "applied_lsn": self.applied_lsn, "state_keys": self.state_keys,
            "keys_checked": self.keys_checked, "keys_before_log": self.keys_before_log,
            "records_to_replay": self.records_to_replay, "seconds": round(self.seconds, 3),
        }


_MAX_STATE_PROBLEMS = 50


def _log_problems(report: VerifyReport, writer_running: bool) -> None:
    """Each segment's own scan (H*, R* rules in C) and the rules across segments (S1-S5), every problem."""
    segs = report.segments
    prev: SegmentInfo | None = None
    for i, s in enumerate(segs):
        is_last = i == len(segs) - 1
        number = recovery.parse_segment_name(s.name)
        if s.status == "corrupt":
            if not s.header_ok:
                msg = f"{s.reason} in the segment header of {s.path} (offset 0)"
            else:
                msg = f"{s.reason} in {s.path} at offset {s.bad_offset} (after LSN {s.last_lsn})"
                if s.next_valid_offset:
                    msg += (f"; a valid record (LSN {s.next_valid_lsn}) follows at offset {s.next_valid_offset}, "
                            "so this is damage, not a torn tail")
            report.problems.append(Problem("log", msg, s.path, s.bad_offset, s.last_lsn + 1 if s.header_ok else None))
        elif s.status == "torn":
            text = f"torn tail: {s.path} has {s.reason} at offset {s.bad_offset} (after LSN {s.last_lsn})"
            if s.next_valid_offset:
                text += (f"; whole records follow (from LSN {s.next_valid_lsn} at offset {s.next_valid_offset}) "
                         "but nothing in the log shows the damaged one was ever durable, so recovery cuts "
                         "everything from the damage on")
            else:
                text += " and nothing valid after it"
            if not is_last:
                report.problems.append(Problem("log", f"missing seal: {text}, but it is not the last segment",
                                               s.path, s.bad_offset, s.last_lsn + 1))
            elif writer_running:
                report.notes.append(f"{text}: a writer is running, so this is most likely a commit being written")
            else:
                report.warnings.append(
                    f"{text}. A crash leaves this; the next writable open (or `agentwal repair`) cuts it and keeps "
                    "the bytes as a .broken file. If no writer crashed, the last record was damaged on disk.")
        elif not is_last and s.status != "sealed":
            report.problems.append(Problem(
                "log", f"missing seal: {s.path} is not the last segment but ends without a seal at offset "
                       f"{s.end_offset}", s.path, s.end_offset, s.last_lsn + 1))
        if s.header_ok and number is not None and s.header_segment_no != number:
            report.problems.append(Problem("log", f"segment name mismatch: {s.path} holds segment "
                                                  f"{s.header_segment_no:016x}", s.path, 0, s.first_lsn))
        if prev is not None and s.header_ok and prev.header_ok:
            prev_no = recovery.parse_segment_name(prev.name)
            if number is not None and prev_no is not None and number != prev_no + 1:
                report.problems.append(Problem("log", f"segment number gap: {prev.path} is followed by {s.path}",
                                               s.path, 0, prev.last_lsn + 1))
            elif s.log_id != prev.log_id:
                report.problems.append(Problem("log", f"log id mismatch: {s.path} belongs to another log than "
                                                      f"{prev.path}", s.path, 0, prev.last_lsn + 1))
            elif s.first_lsn != prev.last_lsn + 1 and prev.status != "corrupt":
                report.problems.append(Problem(
                    "log", f"first lsn mismatch: {s.path} starts at LSN {s.first_lsn}, {prev.path} ended at LSN "
                           f"{prev.last_lsn}", s.path, 0, prev.last_lsn + 1))
        prev = s


def verify(path: str, progress: Progress | None = None) -> VerifyReport:
    """Full check, read-only: every segment (CRC, LSN order, seals, continuity), then the state against the log.

    The state check (stores only) takes one LMDB read snapshot at applied LSN A and replays the
    retained log over it in memory: for every key, the state's version must be the LSN of the
    last record <= A that wrote it (and its value that record's value; a deleted key must be
    absent). Keys whose version is older than the oldest retained record come from segments a
    checkpoint removed and are only counted. Also: A <= the log's last LSN (I1), and no gap
    between A and the oldest retained record.
    """
    started = time.monotonic()
    target = locate(path)
    report = VerifyReport(target)
    if not os.path.isdir(target.log_dir):
        report.problems.append(Problem("log", f"the store has no log directory {target.log_dir}"))
        report.seconds = time.monotonic() - started
        return report
    snapshot: _StateSnapshot | None = None
    if target.is_store:
        try:
            snapshot = _StateSnapshot.open(target)  # before the log: the log then holds all it reflects (I1)
        except WalError as exc:
            report.problems.append(Problem("state", f"cannot open the state: {exc}"))
    opened: list[_Seg] = []
    try:
        opened = _open_segments(target.log_dir)  # after the snapshot, and kept open: see _Seg
        for _ in range(5):
            # A running writer's checkpoint between the snapshot and the listing may have removed segments the
            # snapshot still needs: take both again (a real gap stays and is reported below).
            first_open = _first_lsn_of(opened[0]) if opened else None
            if snapshot is None or first_open is None or snapshot.applied + 1 >= first_open:
                break
            _close_segments(opened)
            opened = []
            snapshot.renew()
            opened = _open_segments(target.log_dir)
        report.segments = _scan_segments(opened, progress)
        _log_problems(report, lock_holder(target.log_dir) is not None)
        segs = report.segments
        report.log_records = sum(s.records for s in segs)
        report.log_bytes = sum(s.end_offset for s in segs)
        report.first_lsn = segs[0].first_lsn if segs and segs[0].first_lsn else 1
        damaged = next((s for s in segs if s.status == "corrupt"), None)
        report.last_lsn = (damaged.last_lsn if damaged is not None else segs[-1].last_lsn) if segs else 0
        broken, tmps = _extra_files(target.log_dir)
        if broken:
            report.notes.append(f"{len(broken)} .broken file(s) in {target.log_dir} (bytes cut by earlier "
                                "recoveries, kept for inspection; never read): " + ", ".join(broken))
        if tmps:
            report.notes.append(f"leftover segment(s) being created: {', '.join(tmps)} (removed by the next "
                                "writable open)")
        if snapshot is not None:
            _verify_state(report, snapshot, opened, progress)
    finally:
        _close_segments(opened)
        if snapshot is not None:
            snapshot.close()
    report.seconds = time.monotonic() - started
    return report


def _digest(value: bytes) -> bytes:
    return hashlib.blake2b(value, digest_size=16).digest()


def _verify_state(report: VerifyReport, snap: _StateSnapshot, segs: list[_Seg], progress: Progress | None) -> None:
    applied = snap.applied
    report.applied_lsn = applied
    report.state_keys = snap.entries()
    first, last = report.first_lsn, report.last_lsn
    if applied > last:
        report.problems.append(Problem(
            "state", f"the state reflects LSN {applied} but the log ends at LSN {last}: the log lost records "
                     "the state was built from (invariant I1 broken from outside agentwal?)", lsn=last + 1))
    if report.segments and applied + 1 < first and last > applied:
        report.problems.append(Problem(
            "state", f"the state reflects LSN {applied} but the oldest retained record is LSN {first}: segments "
                     f"holding LSNs {applied + 1}..{first - 1} are missing", lsn=applied + 1))
    report.records_to_replay = max(0, last - applied)
    if any(p.area == "log" for p in report.problems):
        report.notes.append("the state was not checked key by key against the log: the log is damaged "
                            "(repair it first)")
        return
    # Replay the retained log in memory: key -> (LSN of its last write up to `applied`, value digest or None
    # if deleted). Records after `applied` are only decoded: the next open replays them, so they must parse.
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    total_records = max(0, last - first + 1)
    done = 0
    try:
        for rec in iter_log(report.target.log_dir, first, None, segments=segs):
            try:
                txn = record.decode(rec.payload, rec.lsn)
            except CorruptionError as exc:
                report.problems.append(Problem("log", str(exc), rec.path, rec.offset, rec.lsn))
                continue
            if rec.lsn <= applied:
                for kind, key, value in txn.ops:
                    latest[key] = (rec.lsn, _digest(value) if kind == record.OP_PUT and value is not None else None)
            done += 1
            if progress is not None and done % 64 == 0:
                progress("replaying the log", done, total_records)
    except (WalError, OSError) as exc:
        report.problems.append(Problem("log", f"reading the log for the state check: {exc}"))
        return
    if progress is not None:
        progress("replaying the log", total_records, total_records)
    state_problems: list[Problem] = []
    n_entries = report.state_keys or 0
    try:  # every entry's checksum, each key found again by a lookup, the count (State.verify)
        snap.store._state.verify()
    except WalError as exc:
        report.problems.append(Problem("state", str(exc)))
        return
    for seen, (key, version, value) in enumerate(snap.items(), 1):
        if progress is not None and seen % 4096 == 0:
            progress("checking the state", seen, n_entries)
        report.keys_checked += 1
        want = latest.pop(key, None)
        if version > applied:
            state_problems.append(Problem("state", f"key {text_preview(key, 80)!r} has version {version}, "
                                                   f"beyond the state's applied LSN {applied}", key=key, lsn=version))
        elif want is None:
            if version >= first:
                state_problems.append(Problem(
                    "state", f"key {text_preview(key, 80)!r} has version {version} but no retained log record "
                             f"<= LSN {applied} wrote it", key=key, lsn=version))
            else:
                report.keys_before_log += 1
        elif want[1] is None:
            state_problems.append(Problem(
                "state", f"key {text_preview(key, 80)!r} is in the state (version {version}) but the log deleted "
                         f"it at LSN {want[0]}", key=key, lsn=want[0]))
        elif want[0] != version:
            state_problems.append(Problem(
                "state", f"key {text_preview(key, 80)!r} has version {version} but the log's last write of it "
                         f"up to LSN {applied} is LSN {want[0]}", key=key, lsn=want[0]))
        elif want[1] != _digest(value):
            state_problems.append(Problem(
                "state", f"key {text_preview(key, 80)!r} at version {version} holds a value that differs from "
                         f"what LSN {version} wrote", key=key, lsn=version))
    for key, (lsn, digest) in latest.items():
        if digest is not None:
            state_problems.append(Problem(
                "state", f"key {text_preview(key, 80)!r} was written at LSN {lsn} (<= applied LSN {applied}) "
                         "but is missing from the state", key=key, lsn=lsn))
    if progress is not None:
        progress("checking the state", n_entries, n_entries)
    if len(state_problems) > _MAX_STATE_PROBLEMS:
        extra = len(state_problems) - _MAX_STATE_PROBLEMS
        state_problems = state_problems[:_MAX_STATE_PROBLEMS]
        state_problems.append(Problem("state", f"... and {extra} more key mismatch(es)"))
    report.problems.extend(state_problems)


# ---- the state, read-only ------------------------------------------------------------------------------


class _StateSnapshot:
    """One LMDB read transaction of a store's state (a consistent snapshot at `applied`).

    Opened through ``wal.open(path, readonly=True)`` (no writer lock; LMDB readers never block
    its writer); the Store's public reads take a new transaction per call, so a whole-state
    walk that must be consistent uses the same LMDB handle in one transaction.
    """

    def __init__(self, store: wal.Store) -> None:
        self.store = store
        self._snap = store._state.snapshot()
        self.applied = self._snap.applied_lsn()

    @classmethod
    def open(cls, target: Target) -> _StateSnapshot:
        if not os.path.exists(os.path.join(target.state_dir, "data.mdb")):
            raise OpsError(f"the store has no state ({target.state_dir}/data.mdb is missing); a writable open "
                           f"rebuilds it from the log: `agentwal repair {target.path} --rebuild-state`")
        store = wal.open(target.path, readonly=True)
        try:
            return cls(store)
        except BaseException:
            store.close()
            raise

    def renew(self) -> None:
        self._snap.renew()
        self.applied = self._snap.applied_lsn()

    def entries(self) -> int:
        return self._snap.entries()

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        return self._snap.get(key)

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, int, bytes]]:
        return self._snap.items(prefix)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._snap.close()
        self.store.close()


class StateView:
    """The store's state as a reader should see it: LMDB at applied LSN A, plus the log after A.

    After a crash (or while a writer runs) the log holds commits the state does not reflect
    yet; a reader through LMDB alone would miss acknowledged commits. The view replays
    records A+1.. from the log in memory over one LMDB snapshot. If the log cannot be read
    to its end (damaged), the view stops at the last record it could read and `warning`
    says so.
    """

    def __init__(self, target: Target) -> None:
        if not target.is_store:
            raise UsageError(f"{target.path} is a bare log, not a store")
        self.target = target
        self._snap = _StateSnapshot.open(target)
        self.warning: str | None = None
        self.overlay: dict[bytes, tuple[int, bytes | None]] = {}
        self.last_lsn = self._snap.applied
        try:
            for attempt in range(5):
                try:
                    self._load_overlay()
                    break
                except ArgumentError:  # a checkpoint removed segments after our snapshot: take a newer one
                    if attempt == 4:
                        raise
                    self._snap.renew()
        except (WalError, OSError) as exc:
            # What was read is a gap-free prefix of the log after A: keep it (I3), say where it stops.
            self.warning = (f"the log after LSN {self.last_lsn} could not be read ({exc}); showing the state as "
                            f"of LSN {self.last_lsn}. Run `agentwal verify`.")
        except BaseException:
            self._snap.close()
            raise

    def _load_overlay(self) -> None:
        self.overlay = {}
        self.last_lsn = self._snap.applied
        if not os.path.isdir(self.target.log_dir):
            return
        for rec in iter_log(self.target.log_dir, self._snap.applied + 1):
            txn = record.decode(rec.payload, rec.lsn)
            for _kind, key, value in txn.ops:
                self.overlay[key] = (rec.lsn, value)
            self.last_lsn = rec.lsn

    @property
    def applied_lsn(self) -> int:
        return self._snap.applied

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        """(version, value) of key, or None if absent."""
        found = self.overlay.get(key)
        if found is not None:
            lsn, value = found
            return None if value is None else (lsn, value)
        return self._snap.get(key)

    def scan(self, prefix: bytes = b"") -> Iterator[tuple[bytes, int, bytes]]:
        """(key, version, value) with `prefix`, in key order."""
        over = sorted(k for k in self.overlay if k.startswith(prefix))
        oi = 0
        for key, version, value in self._snap.items(prefix):
            while oi < len(over) and over[oi] < key:
                ok = over[oi]
                oi += 1
                lsn, ov = self.overlay[ok]
                if ov is not None:
                    yield ok, lsn, ov
            if oi < len(over) and over[oi] == key:
                oi += 1
                lsn, ov = self.overlay[key]
                if ov is not None:
                    yield key, lsn, ov
                continue
            yield key, version, value
        for ok in over[oi:]:
            lsn, ov = self.overlay[ok]
            if ov is not None:
                yield ok, lsn, ov

    def close(self) -> None:
        self._snap.close()

    def __enter__(self) -> StateView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def key_bytes(key: str, *, base64_key: bool = False) -> bytes:
    """A key given on the command line: UTF-8 text, or base64 with --base64-key."""
    if base64_key:
        try:
            data = base64.b64decode(key, validate=True)
        except ValueError as exc:
            raise ArgumentError(f"key is not valid base64: {exc}") from None
    else:
        data = key.encode("utf-8", errors="surrogateescape")
    if not data:
        raise ArgumentError("a key must not be empty")
    if len(data) > MAX_KEY_BYTES:
        raise ArgumentError(f"key of {len(data)} bytes is over the {MAX_KEY_BYTES}-byte key limit")
    return data


def get(path: str, key: bytes) -> tuple[tuple[int, bytes] | None, str | None]:
    """((version, value) or None if absent, a warning or None); read-only."""
    with StateView(locate(path, need_store=True)) as view:
        return view.get(key), view.warning


def scan(path: str, prefix: bytes = b"", limit: int | None = None,
         on_warning: Callable[[str], None] | None = None) -> Iterator[tuple[bytes, int, bytes]]:
    """(key, version, value) with `prefix` in key order, from one consistent snapshot; read-only."""
    view = StateView(locate(path, need_store=True))
    try:
        if view.warning and on_warning is not None:
            on_warning(view.warning)
        for n, item in enumerate(view.scan(prefix)):
            if limit is not None and n >= limit:
                break
            yield item
    finally:
        view.close()


# ---- dump ----------------------------------------------------------------------------------------------


def dump(path: str, from_lsn: int = 1, to_lsn: int | None = None, *, raw: bool = False, salvage: bool = False,
         on_skip: Callable[[Skip], None] | None = None,
         on_note: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Log records as JSON-ready dicts, read-only; store transactions decoded unless `raw`.

    Strict: raises CorruptionError at the first damage, after the records before it.
    salvage: reads past damage, telling `on_skip` what it could not read.
    """
    target = locate(path)
    if not os.path.isdir(target.log_dir):
        raise UsageError(f"{target.path} has no log directory")
    if to_lsn is not None and to_lsn < from_lsn:
        raise ArgumentError(f"--to-lsn {to_lsn} is below --from-lsn {from_lsn}")
    segs = _open_segments(target.log_dir)
    try:
        first = _first_lsn_of(segs[0]) if segs else None
        if first is not None and from_lsn < first:
            if from_lsn > 1 and on_note is not None:
                on_note(f"LSNs below {first} are no longer in the log (removed by checkpoints); "
                        f"starting at LSN {first}")
            from_lsn = first
        decode = target.is_store and not raw
        for rec in iter_log(target.log_dir, from_lsn, to_lsn, salvage=salvage, on_skip=on_skip, segments=segs):
            yield record_json(rec.lsn, rec.payload, segment=rec.path, offset=rec.offset, decode=decode)
    finally:
        _close_segments(segs)


# ---- writes ----------------------------------------------------------------------------------------------


def _writer_target(path: str, create: bool) -> Target:
    """The store to write to; with `create`, a missing or empty directory becomes a new store."""
    if create and (not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path))):
        return Target(path, "store", os.path.join(path, LOG_DIR))
    return locate(path, need_store=True)


def put(path: str, key: bytes, value: bytes, *, if_version: int | None = None, create: bool = False) -> int:
    """Commit key=value through the log as the store's writer; returns the LSN."""
    target = _writer_target(path, create)
    if len(value) > MAX_VALUE_BYTES:
        raise ArgumentError(f"value of {len(value)} bytes is over the {MAX_VALUE_BYTES}-byte value limit")
    with open_writer(target, "put") as store:
        if if_version is None:
            return store.put(key, value)
        with store.transaction() as tx:
            tx.put(key, value, if_version=if_version)
        assert tx.lsn is not None
        return tx.lsn


def delete(path: str, key: bytes, *, if_version: int | None = None) -> int | None:
    """Commit the deletion of key as the store's writer; returns the LSN, or None (no such key: nothing done)."""
    target = locate(path, need_store=True)
    with open_writer(target, "delete") as store:
        if store.version(key) is None and if_version is None:
            return None
        with store.transaction() as tx:
            tx.delete(key, if_version=if_version)
        return tx.lsn


def checkpoint(path: str) -> dict[str, Any]:
    """Run a checkpoint as the store's writer: state durable, segments below it released."""
    target = locate(path, need_store=True)
    before = [p for _, p in recovery.list_segments(target.log_dir)]
    with open_writer(target, "checkpoint") as store:
        applied = store.checkpoint()
    after = {p for _, p in recovery.list_segments(target.log_dir)}
    removed = [os.path.basename(p) for p in before if p not in after]
    return {"applied_lsn": applied, "segments_removed": removed, "segments_left": len(after)}


# ---- export / import ---------------------------------------------------------------------------------


def export_lines(path: str, prefix: bytes = b"") -> Iterator[str]:
    """One JSON line per key: {"key", "value", "version"}; bytes as text or {"base64": ...}."""
    for key, version, value in scan(path, prefix):
        yield json.dumps({"key": render_bytes(key), "value": render_bytes(value), "version": version},
                         ensure_ascii=False)


def parse_import(lines: Iterator[str], source: str) -> list[tuple[bytes, bytes]]:
    """Parse and check every line before anything is written; (key, value) pairs in file order."""
    out: list[tuple[bytes, bytes]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ArgumentError(f"{source} line {n}: not JSON ({exc})") from None
        if not isinstance(obj, dict) or "key" not in obj or "value" not in obj:
            raise ArgumentError(f"{source} line {n}: expected an object with \"key\" and \"value\"")
        key = parse_bytes(obj["key"], f"{source} line {n}: key")
        value = parse_bytes(obj["value"], f"{source} line {n}: value")
        if not key or len(key) > MAX_KEY_BYTES:
            raise ArgumentError(f"{source} line {n}: key must be 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
        if len(value) > MAX_VALUE_BYTES:
            raise ArgumentError(f"{source} line {n}: value of {len(value)} bytes is over the limit")
        out.append((key, value))
    return out


def import_pairs(path: str, pairs: list[tuple[bytes, bytes]], *, batch: int = 1000,
                 batch_bytes: int = 8 << 20, create: bool = False) -> dict[str, int]:
    """Commit the pairs as the store's writer, in transactions of up to `batch` keys / `batch_bytes`."""
    target = _writer_target(path, create)
    commits = 0
    last = 0
    with open_writer(target, "import") as store:
        i = 0
        while i < len(pairs):
            size = 0
            with store.transaction() as tx:
                j = i
                while j < len(pairs) and j - i < batch and (j == i or size + len(pairs[j][1]) < batch_bytes):
                    tx.put(pairs[j][0], pairs[j][1])
                    size += len(pairs[j][0]) + len(pairs[j][1])
                    j += 1
            i = j
            commits += 1
            last = tx.lsn or last
    return {"keys": len(pairs), "commits": commits, "last_lsn": last}


# ---- repair ----------------------------------------------------------------------------------------------


@dataclass
class RepairPlan:
    target: Target
    actions: list[str] = field(default_factory=list)
    torn_tail: bool = False
    damage: str | None = None
    lost: tuple[int, int | None] | None = None
    rebuild_state: bool = False
    refuse: str | None = None  # why repair cannot proceed (nothing is changed)
    backup_dir: str = ""
    state_backup_dir: str | None = None
    state_export: str | None = None  # the old state as JSON lines, when it held more than the kept log

    @property
    def needed(self) -> bool:
        return bool(self.actions)


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _free_name(base: str) -> str:
    candidate, n = base, 1
    while os.path.exists(candidate):
        candidate = f"{base}-{n}"
        n += 1
    return candidate


def plan_repair(path: str, *, rebuild_state: bool = False) -> RepairPlan:
    """Work out what `repair` would do, without changing anything."""
    target = locate(path)
    plan = RepairPlan(target)
    stamp = _stamp()
    if target.is_store:
        plan.backup_dir = _free_name(os.path.join(target.path, f"log.backup-{stamp}"))
    else:
        plan.backup_dir = _free_name(f"{target.log_dir.rstrip('/')}.backup-{stamp}")
    if not os.path.isdir(target.log_dir):
        plan.refuse = f"{target.log_dir} does not exist: there is no log to repair"
        return plan
    scan = recovery.scan_directory(target.log_dir)
    segs = scan.segments
    good_last = segs[-1].last_lsn if segs else 0
    if scan.damage is not None:
        d = scan.damage
        bad = segs[d.index]
        later = [recovery.scan_segment_file(p, n) for n, p in recovery.list_segments(target.log_dir)
                 if n > bad.segment_no]
        last_known = max([s.last_lsn for s in [bad, *later] if s.header_ok] + [bad.next_valid_lsn], default=0)
        plan.lost = (d.lsn, last_known if last_known >= d.lsn else None)
        plan.damage = d.message
        good_last = d.lsn - 1
        if d.offset == 0 and d.index == 0:
            plan.refuse = (f"{d.message}: the oldest segment itself is unreadable, so there is no good record to "
                           "keep. Restore the log from a backup.")
            return plan
        lost_text = (f"LSNs {plan.lost[0]}..{plan.lost[1]}" if plan.lost[1] is not None
                     else f"LSN {plan.lost[0]} and any after it")
        plan.actions.append(f"damage: {d.message}")
        plan.actions.append(f"keep the log up to its last good record, LSN {good_last}; {lost_text} are given up "
                            "(the damaged bytes are kept as .broken files and later segments renamed to "
                            "*.broken)")
    elif segs and segs[-1].status == "torn":
        last = segs[-1]
        plan.torn_tail = True
        plan.actions.append(f"torn tail: cut {last.damage_end - last.bad_offset} byte(s) at offset "
                            f"{last.bad_offset} of {last.path} ({last.reason}; nothing valid after it); the bytes "
                            "are kept as a .broken file")
    if target.is_store:
        applied = 0
        if os.path.exists(os.path.join(target.state_dir, "data.mdb")):
            with wal.open(target.path, readonly=True) as store:
                applied = store.stats()["applied_lsn"]
        first = segs[0].first_lsn if segs else 1
        if applied > good_last or rebuild_state:
            if first > 1:
                plan.refuse = (
                    f"the state reflects LSN {applied} but the log keeps only LSNs up to {good_last}, and it no "
                    f"longer starts at LSN 1 (oldest retained: {first}), so the state cannot be rebuilt from it. "
                    "Nothing was changed. To salvage the data: `agentwal export` the store to a file, create a new "
                    "store, and `agentwal import` the file into it.")
                return plan
            plan.rebuild_state = True
            plan.state_backup_dir = _free_name(os.path.join(target.path, f"state.backup-{stamp}"))
            why = (f"the state reflects LSN {applied}, beyond the last good record (LSN {good_last})"
                   if applied > good_last else "asked for (--rebuild-state)")
            plan.actions.append(f"rebuild the state from the log ({why}): move {target.state_dir} to "
                                f"{plan.state_backup_dir} and replay LSNs 1..{good_last}")
            if applied > good_last:
                plan.state_export = _free_name(os.path.join(target.path, f"state.backup-{stamp}.jsonl"))
                plan.actions.append(f"first export the old state (as of LSN {applied}) to {plan.state_export}; "
                                    "`agentwal import` it afterwards to put its newer values back as new commits")
    if plan.actions:
        plan.actions.insert(0, f"copy the log to {plan.backup_dir} first")
    return plan


def _copy_sparse(src: str, dst: str) -> None:
    """Copy a file's data extents, keeping its size (a preallocated segment stays sparse)."""
    fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        end = recovery.data_end(fd, size) if src.endswith(recovery.SEGMENT_SUFFIX) else size
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            pos = 0
            while pos < end:
                chunk = os.pread(fd, min(8 << 20, end - pos), pos)
                if not chunk:
                    break
                os.write(out, chunk)
                pos += len(chunk)
            os.ftruncate(out, size)
            os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    shutil.copystat(src, dst)


def backup_log(log_dir: str, dest: str) -> list[str]:
    """Copy every file of the log directory (LOCK excluded) to `dest`, fsynced; returns the names."""
    os.makedirs(dest)
    names = []
    for name in sorted(os.listdir(log_dir)):
        src = os.path.join(log_dir, name)
        if name == LOCK_NAME or not os.path.isfile(src):
            continue
        _copy_sparse(src, os.path.join(dest, name))
        names.append(name)
    for d in (dest, os.path.dirname(os.path.abspath(dest))):
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return names


def _probe_lock(target: Target, command: str) -> None:
    """Fail with LockedError if a writer holds the log (a real flock probe: we are about to write anyway)."""
    lock = os.path.join(target.log_dir, LOCK_NAME)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LockedError(locked_message(target, command)) from None
    finally:
        os.close(fd)


def _export_snapshot(target: Target, dest: str) -> int:
    """The LMDB state alone (no log: it is damaged), as export lines, fsynced; returns the key count."""
    snap = _StateSnapshot.open(target)
    count = 0
    try:
        with open(dest, "w", encoding="utf-8") as f:
            for key, version, value in snap.items():
                f.write(json.dumps({"key": render_bytes(key), "value": render_bytes(value), "version": version},
                                   ensure_ascii=False) + "\n")
                count += 1
            f.flush()
            os.fsync(f.fileno())
    finally:
        snap.close()
    return count


@dataclass
class RepairResult:
    backup_dir: str
    state_backup_dir: str | None
    state_export: str | None
    report: wal.RecoveryReport
    last_lsn: int
    applied_lsn: int | None
    records_replayed: int | None


def repair(plan: RepairPlan) -> RepairResult:
    """Carry out a plan from `plan_repair`: back up, truncate at the last good record, replay the state."""
    if plan.refuse:
        raise OpsError(plan.refuse)
    target = plan.target
    _probe_lock(target, "repair")
    backup_log(target.log_dir, plan.backup_dir)
    if plan.state_export is not None:
        _export_snapshot(target, plan.state_export)
    if plan.rebuild_state and plan.state_backup_dir is not None and os.path.isdir(target.state_dir):
        os.replace(target.state_dir, plan.state_backup_dir)
    try:
        log = wal.Log.open(target.log_dir, recovery="truncate")
    except LockedError as exc:
        raise LockedError(locked_message(target, "repair")) from exc
    with log:
        report = log.recovery_report
        last = log.watermarks.durable
    applied = replayed = None
    if target.is_store:
        with open_writer(target, "repair") as store:
            stats = store.stats()
            applied, replayed = int(stats["applied_lsn"]), int(stats["records_replayed"])
    return RepairResult(plan.backup_dir, plan.state_backup_dir if plan.rebuild_state else None, plan.state_export,
                        report, last, applied, replayed)


# ---- tail -f -------------------------------------------------------------------------------------------


class Follower:
    """Follows a log read-only as a writer appends to it: `poll()` returns the records new since the last call.

    Keeps (segment, offset, next LSN) and scans only the bytes after the offset each time. A
    record the writer is still copying in looks torn: the follower waits at it. When the
    segment it follows is sealed it moves to the next. Segments are opened as soon as they
    are seen, so a checkpoint of the writer cannot remove one before the follower read it;
    only if the follower starts (or falls) behind the oldest segment does it jump ahead, and
    it reports the LSNs it missed through `on_skip`. Call `close()` when done.
    """

    def __init__(self, log_dir: str, start_lsn: int, on_skip: Callable[[Skip], None] | None = None) -> None:
        self.log_dir = log_dir
        self.next_lsn = start_lsn
        self.on_skip = on_skip or (lambda s: None)
        self._segs: dict[int, _Seg] = {}
        self._current: _Seg | None = None
        self._pos = HEADER_SIZE
        self._base_lsn: int | None = None  # the LSN expected at _pos (None: the segment's own first LSN)
        self._stuck: tuple[int, int, str] | None = None
        self._stuck_since = 0.0

    def _refresh(self) -> None:
        after = max(self._segs) if self._segs else -1
        for seg in _open_segments(self.log_dir, after):
            self._segs[seg.number] = seg

    def _drop_before(self, number: int) -> None:
        for n in [n for n in self._segs if n < number]:
            _close_segments([self._segs.pop(n)])

    def _locate(self) -> bool:
        """Find the segment holding next_lsn (or the first after it); False if there is none yet."""
        chosen: tuple[_Seg, int] | None = None
        for number in sorted(self._segs):
            first = _first_lsn_of(self._segs[number])
            if first is None:
                continue
            if first <= self.next_lsn or chosen is None:
                chosen = (self._segs[number], first)
            if first > self.next_lsn:
                break
        if chosen is None:
            return False
        seg, first = chosen
        if first > self.next_lsn:
            self.on_skip(Skip(seg.path, 0, 0, "records before this segment were removed by a checkpoint "
                                              "before they could be read", (self.next_lsn, first - 1)))
            self.next_lsn = first
        self._drop_before(seg.number)
        self._current, self._pos, self._base_lsn = seg, HEADER_SIZE, None
        return True

    def poll(self) -> list[LogRecord]:
        """The records written since the last poll (an empty list when there are none yet)."""
        out: list[LogRecord] = []
        self._refresh()
        for _ in range(1 << 16):  # segments crossed in one poll
            if self._current is None and not self._locate():
                return out
            seg = self._current
            assert seg is not None
            with _mapped(seg) as buf:
                view = _scan_view(buf, None, self._pos, self._base_lsn, settle=True)
                if not view.res.header_ok:
                    raise CorruptionError(f"{view.reason} in the segment header of {seg.path}", path=seg.path,
                                          offset=0, reason=view.reason)
                for lsn, off, payload in _view_records(view, self.next_lsn, None):
                    out.append(LogRecord(lsn, payload, seg.path, off))
                    self.next_lsn = lsn + 1
                status, reason = view.status, view.reason
                end, last = view.real(view.res.end_offset), int(view.res.last_lsn)
            if status == "sealed":
                nxt = self._segs.get(seg.number + 1)
                if nxt is None:
                    self._refresh()
                    nxt = self._segs.get(seg.number + 1)
                if nxt is None and not any(n > seg.number for n in self._segs):
                    # The next segment is not created yet: wait at the seal.
                    self._pos, self._base_lsn = end - RECORD_HEADER_SIZE, last + 1
                    return out
                if nxt is None:
                    # The next segment was removed (a checkpoint) before we saw it: this one is done;
                    # relocate among the later ones, reporting the LSNs that went with it.
                    self._drop_before(seg.number + 1)
                    self._current = None
                    continue
                self._drop_before(nxt.number)
                self._current, self._pos, self._base_lsn = nxt, HEADER_SIZE, None
                continue
            self._pos, self._base_lsn = end, last + 1
            if status == "corrupt":
                # Damage that stays put for a few seconds is not a write in progress.
                key = (seg.number, end, reason)
                if self._stuck != key:
                    self._stuck, self._stuck_since = key, time.monotonic()
                elif time.monotonic() - self._stuck_since > 5:
                    raise CorruptionError(f"log damaged: {reason} in {seg.path} at offset {end} (after LSN {last})",
                                          path=seg.path, offset=end, lsn=last + 1, reason=reason)
            return out
        return out

    def close(self) -> None:
        _close_segments(list(self._segs.values()))
        self._segs.clear()
        self._current = None


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


# ---- stats ---------------------------------------------------------------------------------------------


def stats(path: str) -> dict[str, Any]:
    """Gauges read from disk, read-only: log extent, state, what the next open would replay, the writer.

    The live counters of a running writer (commits, fsyncs, fsync latency, durable lag) are in
    that process: ``store.stats()``, rendered for Prometheus by `wal.metrics.prometheus_text`.
    """
    started = time.monotonic()
    target = locate(path)
    segments = recovery.list_segments(target.log_dir) if os.path.isdir(target.log_dir) else []
    first, last = last_lsn(target.log_dir) if segments else (1, 0)
    log_apparent = log_disk = 0
    for _, p in segments:
        with contextlib.suppress(OSError):
            st = os.stat(p)
            log_apparent += st.st_size
            log_disk += st.st_blocks * 512
    broken, _tmps = _extra_files(target.log_dir)
    holder = lock_holder(target.log_dir) if os.path.isdir(target.log_dir) else None
    out: dict[str, Any] = {
        "kind": target.kind,
        "log_segments": len(segments),
        "log_bytes": log_apparent,
        "log_disk_bytes": log_disk,
        "log_first_lsn": first,
        "log_last_lsn": last,
        "log_broken_files": len(broken),
        "writer_running": holder is not None,
        "writer_pid": holder or 0,
    }
    if target.is_store:
        s = _state_stats(target)
        applied = int(s["applied_lsn"])
        _, state_disk = _tree_bytes(target.state_dir)
        out.update({
            "applied_lsn": applied,
            "unapplied_records": max(0, last - applied),
            "state_keys": s["state_keys"],
            "state_map_bytes_used": s["state_map_bytes_used"],
            "state_disk_bytes": state_disk,
        })
        newest = _commit_time(target.log_dir, last) if last >= first else None
        if newest is not None:
            out["last_commit_age_seconds"] = round(max(0.0, time.time() - newest / 1000), 3)
    out["stats_seconds"] = round(time.monotonic() - started, 6)
    return out

