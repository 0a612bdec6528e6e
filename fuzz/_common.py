"""Shared pieces of the agentwal fuzz targets: an input reader, segment builders and mutators.

Nothing here needs atheris, so the targets' ``test_one_input`` functions run under plain
pytest too (tests/test_fuzz_smoke.py). The targets are deterministic functions of their
input bytes: every choice below is read from the input, never from a random generator,
so a saved input reproduces its run exactly.

The structure-aware builders use the pure-Python reference encoders of ``wal.log.format``.
They only ever produce *bytes*; what those bytes mean is decided by the reference decoder
(``wal.log.format.scan_segment``), which is the oracle the C reader and ``Log.open`` are held
against. A builder or mutator that misjudges an offset just produces different bytes,
never a wrong verdict.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import shutil
import struct
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from wal.log import format as wf

# Boundary values for u64 fields (LSNs, segment numbers, salts, log ids).
INTERESTING_U64 = (
    1, 2, 3, 4, 7, 8, 100, 255, 256, 0xFFFF, 0x10000,
    (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32,
    (1 << 63) - 1, 1 << 63, (1 << 64) - 2, (1 << 64) - 1, 0,
)
U64_MAX = (1 << 64) - 1
_RH = struct.Struct("<IIQBBHI")  # record header: crc, length, lsn, type, flags, reserved, salt check


# Open findings (fuzz/findings/README.md) a run may be told to step over, so that the fuzzer
# keeps looking for new ones while a known one is unfixed: AGENTWAL_FUZZ_KNOWN=name,name (or "all").
# Each target checks the names it knows how to recognise. Empty by default: everything is reported.
KNOWN_FINDINGS = {
    "lsn-wrap": "C reader: the expected LSN wraps from 2**64-1 to 0 (fuzz/findings/README.md, F1)",
    "store-key-size": "store replay: a record with an empty key fails in LMDB, not as 'bad store record' (F2)",
    "read-buffer-error": "Log.read: leaving the generator inside a segment raises BufferError (F3)",
    "lsn-int64": "Log.append: an LSN >= 2**63 comes back as a negative int64 and is taken for an error (F4)",
    "store-file-json": "wal.open: a deeply nested STORE file raises RecursionError (F5)",
    "segment-names": "recovery takes '0000000000000A.wal', '+00...1.wal', ... for segments (F6)",
    "log-id-zero": "a log whose id is 0 gets a new segment with a random id when resumed (F7)",
    "segment-no-max": "segment number 2**64-1: OverflowError, or the next segment wraps to 0 (F8)",
    "readonly-damage": "Log.open(readonly=True) accepts non-torn damage in the newest segment (F9)",
    "idem-key-size": "store replay: an idempotency key LMDB cannot hold fails in LMDB, blaming the state (F10)",
}


def tolerated(name: str) -> bool:
    """Whether this run was told to step over the open finding `name`."""
    assert name in KNOWN_FINDINGS, name
    wanted = {w.strip() for w in os.environ.get("AGENTWAL_FUZZ_KNOWN", "").split(",")}
    return name in wanted or "all" in wanted


class Finding(Exception):  # noqa: N818 - what the fuzzer reports, not an error condition of the library
    """The code under test did something its contract forbids (a mismatch, a wrong record, a non-WalError)."""


# ---- reading choices from the input --------------------------------------------------------------------


class Input:
    """Reads choices from fuzz input bytes; past the end every read returns zeros (never raises)."""

    def __init__(self, data: bytes) -> None:
        self._data = bytes(data)
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def byte(self) -> int:
        if self._pos < len(self._data):
            b = self._data[self._pos]
            self._pos += 1
            return b
        return 0

    def take(self, n: int) -> bytes:
        out = self._data[self._pos : self._pos + max(0, n)]
        self._pos += len(out)
        return out

    def rest(self) -> bytes:
        return self.take(self.remaining)

    def uint(self, nbytes: int) -> int:
        return int.from_bytes(self.take(nbytes).ljust(nbytes, b"\0"), "little")

    def below(self, n: int) -> int:
        """A value in [0, n)."""
        if n <= 1:
            return 0
        width = 1 if n <= 0x100 else 2 if n <= 0x10000 else 4
        return self.uint(width) % n

    def chance(self, k: int, n: int) -> bool:
        """True with probability k/n over uniform input bytes."""
        return self.below(n) < k

    def u64(self) -> int:
        """Mostly a boundary value, else 8 raw bytes."""
        b = self.byte()
        if b < 0xA0:
            return INTERESTING_U64[b % len(INTERESTING_U64)]
        return self.uint(8)

    def nonzero_u64(self) -> int:
        v = self.uint(8)
        return v if v else 0x5EED5EED5EED5EED

    def small_lsn(self) -> int:
        """A first LSN: usually 1 or small, sometimes a boundary value."""
        b = self.byte()
        if b < 0xB0:
            return 1 + b % 8
        return self.u64() or 1

    def payload(self, max_len: int = 48) -> bytes:
        return self.take(self.below(max_len + 1))


# ---- building segments --------------------------------------------------------------------------------


@dataclass
class Segment:
    """A segment image under construction, with the record offsets the builder knows about."""

    data: bytearray
    salt: int
    first_lsn: int
    log_id: int = 0
    segment_no: int = 0
    offsets: list[int] = field(default_factory=list)  # record starts (DATA and SEAL) as built

    @property
    def next_lsn(self) -> int:
        return self.first_lsn + sum(1 for o in self.offsets if self._type_at(o) == wf.RECORD_DATA)

    def _type_at(self, off: int) -> int:
        return self.data[off + wf.RH_TYPE] if off + wf.RECORD_HEADER_SIZE <= len(self.data) else -1


def build_segment(
    *, log_id: int, segment_no: int, first_lsn: int, salt: int, payloads: list[bytes], sealed: bool, zero_tail: int,
    marks: int = 0,
) -> Segment:
    """A valid segment, as a writer leaves it. marks: bit i set = a MARK before DATA record i + 1,
    vouching for the records before it (the writer starts a batch with one when the durable LSN moved)."""
    header = wf.encode_segment_header(log_id=log_id, segment_no=segment_no, first_lsn=first_lsn, salt=salt,
                                      prealloc_bytes=4096)
    data = bytearray(header)
    offsets = []
    lsn = first_lsn
    for i, p in enumerate(payloads):
        if i and marks >> (i - 1) & 1:
            offsets.append(len(data))
            data += wf.encode_mark(durable_lsn=(lsn - 1) & U64_MAX, salt=salt)
        offsets.append(len(data))
        data += wf.encode_record(lsn=lsn & U64_MAX, payload=p, salt=salt)
        lsn += 1
    if sealed:
        offsets.append(len(data))
        data += wf.encode_seal(last_lsn=(lsn - 1) & U64_MAX, salt=salt)
    data += bytes(zero_tail)
    return Segment(data, salt, first_lsn, log_id, segment_no, offsets)


def plan_segment(inp: Input, *, log_id: int, segment_no: int, first_lsn: int, sealed: bool) -> Segment:
    """A valid segment whose shape (salt, records, payloads, zero tail) is read from the input."""
    salt = inp.nonzero_u64()
    n = inp.below(6)
    payloads = [inp.payload() for _ in range(n)]
    zero_tail = (0, 8, 24, 40, 200, 1024)[inp.below(6)]
    marks = inp.byte() if inp.chance(1, 2) else 0
    return build_segment(log_id=log_id, segment_no=segment_no, first_lsn=first_lsn, salt=salt, payloads=payloads,
                         sealed=sealed, zero_tail=zero_tail, marks=marks)


def _aligned_end(seg: Segment) -> int:
    """Where the next record would go: after the last record the builder placed, else after the
    header; never past the end of the image (a damaged length field must not blow it up)."""
    end = wf.SEGMENT_HEADER_SIZE
    if seg.offsets:
        off = seg.offsets[-1]
        if off + wf.RECORD_HEADER_SIZE <= len(seg.data):
            length = struct.unpack_from("<I", seg.data, off + wf.RH_LENGTH)[0]
            end = off + wf.record_size(min(length, wf.MAX_PAYLOAD))
    return wf.round_up_8(min(end, max(len(seg.data), wf.SEGMENT_HEADER_SIZE)))


def _put(seg: Segment, off: int, blob: bytes) -> None:
    """Write blob at off, growing the image with zeros if needed."""
    if off > len(seg.data):
        seg.data += bytes(off - len(seg.data))
    seg.data[off : off + len(blob)] = blob


def _reencode(seg: Segment, off: int, inp: Input) -> None:
    """Re-encode the record at off with one field changed and a valid CRC (rules R7..R12)."""
    if off + wf.RECORD_HEADER_SIZE > len(seg.data):
        return
    _crc, length, lsn, rtype, flags, reserved, check = _RH.unpack_from(seg.data, off)
    if length > wf.MAX_PAYLOAD or off + wf.record_size(length) > len(seg.data):
        return
    payload = bytes(seg.data[off + wf.RECORD_HEADER_SIZE : off + wf.RECORD_HEADER_SIZE + length])
    knobs = {"rtype": rtype, "flags": flags, "reserved": reserved, "salt_check": check}
    what = inp.below(8)
    pad = False
    if what == 0:
        lsn = (lsn + (-2, -1, 1, 2, 5)[inp.below(5)]) & U64_MAX
    elif what == 1:
        lsn = inp.u64()
    elif what == 2:
        knobs["rtype"] = (0, 4, 255, wf.RECORD_SEAL, wf.RECORD_DATA, wf.RECORD_MARK)[inp.below(6)]
    elif what == 3:
        knobs["flags"] = inp.byte() or 1
    elif what == 4:
        knobs["reserved"] = inp.uint(2) or 1
    elif what == 5:
        knobs["salt_check"] = (check ^ (inp.uint(4) or 1)) & 0xFFFFFFFF
    elif what == 6:
        pad = True
    else:  # a SEAL or MARK with a payload, or with another LSN
        knobs["rtype"] = (wf.RECORD_SEAL, wf.RECORD_MARK)[inp.below(2)]
        if inp.chance(1, 2):
            lsn = (lsn + (-1, 1)[inp.below(2)]) & U64_MAX
    rec = bytearray(wf.encode_record(lsn=lsn, payload=payload, salt=seg.salt, **knobs))
    if pad and len(rec) > wf.RECORD_HEADER_SIZE + length:
        rec[wf.RECORD_HEADER_SIZE + length + inp.below(len(rec) - wf.RECORD_HEADER_SIZE - length)] = inp.byte() or 1
    seg.data[off : off + len(rec)] = rec


def mutate(seg: Segment, inp: Input, *, reencode: bool = True) -> None:
    """Apply one damage operation chosen by the input.

    reencode=False leaves out the operations that rewrite a record's fields behind a valid CRC
    (used where the oracle must be able to tell original records from forged ones).
    """
    data = seg.data
    n = len(data)
    op = inp.below(20)
    if op == 0 and n:  # flip a bit
        data[inp.below(n)] ^= 1 << inp.below(8)
    elif op == 1 and n:  # set a byte
        data[inp.below(n)] = inp.byte()
    elif op == 2:  # truncate (a short write / lost tail)
        del data[inp.below(n + 1) :]
    elif op == 3 and n:  # zero a range (a lost page)
        pos = inp.below(n)
        k = min(n - pos, 1 + inp.below(128))
        data[pos : pos + k] = bytes(k)
    elif op == 4 and n:  # overwrite a range with input bytes (garbage)
        pos = inp.below(n)
        chunk = inp.take(1 + inp.below(32))
        data[pos : pos + len(chunk)] = chunk[: n - pos]
    elif op == 5:  # append input bytes
        data += inp.take(inp.below(64))
    elif op == 6:  # append zeros
        data += bytes(inp.below(512))
    elif op == 7 and reencode and seg.offsets:  # a field changed behind a valid CRC
        _reencode(seg, seg.offsets[inp.below(len(seg.offsets))], inp)
    elif op == 8 and seg.offsets:  # a record copied to a later aligned offset (evidence after damage)
        src = seg.offsets[inp.below(len(seg.offsets))]
        if src + wf.RECORD_HEADER_SIZE <= n:
            length = min(struct.unpack_from("<I", data, src + wf.RH_LENGTH)[0], 4096)
            rec = bytes(data[src : src + wf.record_size(length)])
            _put(seg, _aligned_end(seg) + 8 * inp.below(8), rec)
    elif op == 9:  # a record of another segment (valid CRC, other salt)
        other = seg.salt ^ (inp.nonzero_u64() | 1)
        rec = wf.encode_record(lsn=seg.next_lsn & U64_MAX, payload=inp.payload(16), salt=other)
        _put(seg, _aligned_end(seg) + 8 * inp.below(4), rec)
    elif op == 10 and seg.offsets:  # a length field changed (CRC not fixed)
        off = seg.offsets[inp.below(len(seg.offsets))]
        if off + wf.RECORD_HEADER_SIZE <= n:
            choices = (wf.MAX_PAYLOAD, wf.MAX_PAYLOAD + 1, 0xFFFFFFFF, n, n - off, inp.uint(4), inp.below(64))
            value = choices[inp.below(len(choices))]
            struct.pack_into("<I", data, off + wf.RH_LENGTH, value & 0xFFFFFFFF)
    elif op == 11 and reencode:  # a header field changed behind a valid header CRC (H3, H5..H7, S-rules)
        _rewrite_header(seg, inp)
    elif op == 12:  # a valid next record after a gap (zeroed header + valid record: corrupt, not torn)
        lsn = (seg.next_lsn + (0, 0, 0, 1, -1)[inp.below(5)]) & U64_MAX
        rec = wf.encode_record(lsn=lsn, payload=inp.payload(24), salt=seg.salt)
        _put(seg, _aligned_end(seg) + 8 * inp.below(6), rec)
    elif op == 13:  # a SEAL appended (right or wrong LSN)
        lsn = (seg.next_lsn - 1 + (0, 0, 1, -1)[inp.below(4)]) & U64_MAX
        _put(seg, _aligned_end(seg), wf.encode_seal(last_lsn=lsn, salt=seg.salt))
    elif op == 14 and seg.offsets:  # a record duplicated in place (LSN out of order)
        src = seg.offsets[inp.below(len(seg.offsets))]
        if src + wf.RECORD_HEADER_SIZE <= n:
            length = min(struct.unpack_from("<I", data, src + wf.RH_LENGTH)[0], 4096)
            rec = bytes(data[src : src + wf.record_size(length)])
            data[src:src] = rec
    elif op == 15 and seg.offsets:  # bytes inserted at a record start (misalignment)
        off = seg.offsets[inp.below(len(seg.offsets))]
        data[off:off] = inp.take(1 + inp.below(7))
    elif op == 16 and n > wf.SEGMENT_HEADER_SIZE:  # fill the rest after some offset with one byte value
        pos = wf.SEGMENT_HEADER_SIZE + inp.below(n - wf.SEGMENT_HEADER_SIZE)
        data[pos:] = bytes([inp.byte()]) * (n - pos)
    elif op == 17:  # a valid next DATA record appended right at the end (a longer log)
        rec = wf.encode_record(lsn=seg.next_lsn & U64_MAX, payload=inp.payload(24), salt=seg.salt)
        pos = _aligned_end(seg)
        _put(seg, pos, rec)
        seg.offsets.append(pos)
    elif op == 18:  # a MARK after the end, maybe past a gap (rule T: does it vouch for damaged bytes?)
        lsn = (seg.next_lsn + (-1, -1, 0, 1, -2, 5)[inp.below(6)]) & U64_MAX
        pos = _aligned_end(seg) + 8 * inp.below(6)
        _put(seg, pos, wf.encode_mark(durable_lsn=lsn, salt=seg.salt))
        if inp.chance(1, 2):  # and a record after it
            _put(seg, pos + wf.RECORD_HEADER_SIZE,
                 wf.encode_record(lsn=seg.next_lsn & U64_MAX, payload=inp.payload(16), salt=seg.salt))
    elif op == 19 and seg.offsets:  # a MARK written over a record (a batch start where data was)
        off = seg.offsets[inp.below(len(seg.offsets))]
        lsn = (seg.first_lsn + inp.below(8) - 1) & U64_MAX
        _put(seg, off, wf.encode_mark(durable_lsn=lsn, salt=seg.salt))


def _rewrite_header(seg: Segment, inp: Input) -> None:
    fields: dict[str, int] = {
        "log_id": seg.log_id, "segment_no": seg.segment_no, "first_lsn": seg.first_lsn, "salt": seg.salt,
        "prealloc_bytes": 4096,
    }
    what = inp.below(9)
    if what == 0:
        fields["version"] = (0, 2, 0xFFFF, 256)[inp.below(4)]
    elif what == 1:
        fields["header_size"] = (0, 63, 65, 128, 0xFFFF)[inp.below(5)]
    elif what == 2:
        fields["flags"] = inp.uint(4) or 1
    elif what == 3:
        fields["reserved"] = inp.uint(4) or 1
    elif what == 4:
        fields[("segment_no", "first_lsn", "salt")[inp.below(3)]] = 0
    elif what == 5:
        fields["segment_no"] = inp.u64()
    elif what == 6:
        fields["first_lsn"] = inp.u64()
    elif what == 7:
        fields["log_id"] = inp.u64()
    else:
        fields["prealloc_bytes"] = inp.u64()
    try:
        header = wf.encode_segment_header(**fields)
    except struct.error:
        return
    seg.data[0 : wf.SEGMENT_HEADER_SIZE] = header
    seg.first_lsn = fields["first_lsn"]
    seg.segment_no = fields["segment_no"]
    seg.log_id = fields["log_id"]


def fix_checksums(data: bytearray, skip_record: int = -1, *, records: bool = True) -> None:
    """Recompute the header CRC and the CRC of every record along the chain (except skip_record).

    Lets a byte-level mutator's changes to lengths, LSNs, types, salts and padding reach the
    rules behind the CRC checks. Walks the way the reader does; stops where the chain breaks.
    """
    if len(data) < wf.SEGMENT_HEADER_SIZE:
        return
    struct.pack_into("<I", data, wf.SH_CRC, wf.crc32c(bytes(data[: wf.SH_CRC])))
    if not records:
        return
    off = wf.SEGMENT_HEADER_SIZE
    i = 0
    while off + wf.RECORD_HEADER_SIZE <= len(data) and i < 256:
        length = struct.unpack_from("<I", data, off + wf.RH_LENGTH)[0]
        if length > wf.MAX_PAYLOAD or off + wf.record_size(length) > len(data):
            return
        if not any(data[off : off + wf.RECORD_HEADER_SIZE]):
            return
        if i != skip_record:
            covered = bytes(data[off + wf.RH_LENGTH : off + wf.RECORD_HEADER_SIZE + length])
            struct.pack_into("<I", data, off, wf.crc32c(covered))
        off += wf.record_size(length)
        i += 1


# ---- memory with a guard page ---------------------------------------------------------------------------


class GuardedBuffer:
    """Anonymous memory whose last page is PROT_NONE: data placed just before it makes any
    read past the end of the data fault at once, in the plain build as well as under ASan."""

    _PROT_NONE = 0

    def __init__(self, capacity: int = 1 << 20) -> None:
        page = mmap.PAGESIZE
        self.capacity = (capacity + page - 1) // page * page
        self._map = mmap.mmap(-1, self.capacity + page)
        self._view = ctypes.c_char.from_buffer(self._map)  # keeps the mapping exported (never moved)
        self.base = ctypes.addressof(self._view)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        if libc.mprotect(self.base + self.capacity, page, self._PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect of the guard page failed")

    def place(self, data: bytes) -> tuple[int, int]:
        """Copy data so that it ends at the guard page; returns (address, start index)."""
        if len(data) > self.capacity:
            raise ValueError("input larger than the guarded buffer")
        start = self.capacity - len(data)
        self._map[start : self.capacity] = data
        return self.base + start, start

    def read(self, start: int, length: int) -> bytes:
        return self._map[start : start + length]


_GUARDED: dict[int, GuardedBuffer] = {}


def guarded(size: int) -> GuardedBuffer:
    """A process-wide guarded buffer big enough for size bytes."""
    buf = _GUARDED.get(0)
    if buf is None or buf.capacity < size:
        buf = _GUARDED[0] = GuardedBuffer(max(size, 1 << 20))
    return buf


# ---- temporary directories --------------------------------------------------------------------------------


def scratch_root() -> str:
    """Where the targets make their directories: $AGENTWAL_FUZZ_TMP, else /dev/shm (tmpfs), else the temp dir."""
    root = os.environ.get("AGENTWAL_FUZZ_TMP")
    if root:
        os.makedirs(root, exist_ok=True)
        return root
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix=prefix, dir=scratch_root())
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def unraisable_is_finding(known: Callable[[Any], str | None] = lambda _: None) -> Iterator[None]:
    """Exceptions Python could not raise (``Exception ignored in ...``: a finaliser failed) are findings.

    known(unraisable) may name an open finding the exception belongs to; tolerated ones pass.
    """
    caught: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = caught.append
    try:
        yield
    finally:
        sys.unraisablehook = previous
    for u in caught:
        name = known(u)
        if name is not None and tolerated(name):
            continue
        exc = u.exc_value
        text = describe(exc) if exc is not None else repr(u.exc_type)
        raise Finding(f"an exception was swallowed ({u.err_msg or 'Exception ignored in'} {u.object!r}):\n{text}")


def describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).rstrip()


def run_atheris(test_one_input: object, extra_modules: tuple[str, ...] = ()) -> None:
    """Instrument the Python code under test (the wal package and the target) and run libFuzzer.

    Coverage feedback comes from the Python code (atheris instruments its bytecode and its
    comparisons, which also lets libFuzzer learn magic numbers and CRCs); the C core is
    built by gcc, which cannot emit libFuzzer's edge counters, but with ASan/UBSan and
    -fsanitize-coverage=trace-cmp (see build_asan.sh).
    """
    import gc  # noqa: PLC0415
    import types  # noqa: PLC0415

    import atheris  # type: ignore[import-untyped]  # noqa: PLC0415 - only the fuzzing entry point needs it

    # The library logs every torn tail it cuts and every loss it reports: noise here, and slow.
    if not os.environ.get("AGENTWAL_FUZZ_LOG"):
        logging.getLogger("wal").setLevel(logging.CRITICAL)
    wanted = ("wal", "_common", "__main__", *extra_modules)
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and str(getattr(obj, "__module__", "")).split(".")[0] in wanted:
            with contextlib.suppress(Exception):
                atheris.instrument_func(obj)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
