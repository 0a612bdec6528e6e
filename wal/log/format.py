"""Pure-Python reference encoder/decoder of the agentwal log format.

FORMAT.md (at the top of the repository) is the specification; ``native/format.h``
names its numbers for C; this module is the same specification written as code.
It is the oracle the tests and the fuzzer hold the C reader (``native/reader.c``)
against, so it favours being obviously right over being fast: every check of
``scan_segment`` carries the number of the validity rule in FORMAT.md
("Reading a segment") that it implements, and the reason strings are the
contract shared with the C reader, compared verbatim.

What is here:

* constants mirroring ``native/format.h``;
* ``crc32c`` (CRC-32C/Castagnoli computed by ``crcmod``, independent of the C core);
* encoders: ``encode_segment_header``, ``encode_record``, ``encode_seal`` and
  ``build_segment``; they take extra keyword knobs so tests can craft invalid
  headers and records that still carry valid CRCs;
* decoders: ``decode_segment_header`` and ``scan_segment`` (rules H1..H7, R1..R12);
* segment file names: ``segment_name``, ``parse_segment_name``, ``broken_name``.

The cross-segment rules S1..S5 are applied by ``Log.open`` (``wal/log/log.py``), not here.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crcmod.predefined

__all__ = [
    "ALIGN",
    "BROKEN_SUFFIX",
    "FORMAT_VERSION",
    "LOCK_FILE_NAME",
    "MAGIC",
    "MAX_PAYLOAD",
    "RECORD_DATA",
    "RECORD_HEADER_SIZE",
    "RECORD_MARK",
    "RECORD_SEAL",
    "SEAL_SIZE",
    "SEGMENT_HEADER_SIZE",
    "SEGMENT_NAME_LEN",
    "SEGMENT_SUFFIX",
    "STATUS_CODES",
    "STATUS_CORRUPT",
    "STATUS_OPEN",
    "STATUS_SEALED",
    "STATUS_TORN",
    "TEMP_SUFFIX",
    "FormatError",
    "ScanResult",
    "SegmentHeader",
    "broken_name",
    "build_segment",
    "crc32c",
    "decode_segment_header",
    "encode_record",
    "encode_seal",
    "encode_segment_header",
    "parse_segment_name",
    "record_size",
    "round_up_8",
    "scan_segment",
    "segment_name",
]

# ---- segment files (format.h: WAL_SEGMENT_*) ---------------------------------

SEGMENT_SUFFIX = ".wal"
SEGMENT_NAME_LEN = 20  # 16 lower-case hex digits + ".wal"
TEMP_SUFFIX = ".tmp"  # "<name>.tmp" while a segment is being made
BROKEN_SUFFIX = ".broken"  # "<name>.<offset:016x>.broken": bytes cut from a torn tail
LOCK_FILE_NAME = "LOCK"  # flock()ed by the single writer

# ---- segment header: 64 bytes at offset 0 (format.h: WAL_SH_*) ---------------

MAGIC = b"AGWALSEG"
MAGIC_LEN = 8
FORMAT_VERSION = 1
SEGMENT_HEADER_SIZE = 64

SH_MAGIC = 0
SH_VERSION = 8
SH_HEADER_SIZE = 10
SH_FLAGS = 12
SH_LOG_ID = 16
SH_SEGMENT_NO = 24
SH_FIRST_LSN = 32
SH_SALT = 40
SH_PREALLOC = 48
SH_RESERVED = 56
SH_CRC = 60

# magic, version, header size, flags, log id, segment no, first lsn, salt,
# prealloc, reserved: the 60 bytes the header CRC covers.
_SEGMENT_HEADER_BODY = struct.Struct("<8sHHIQQQQQI")
assert _SEGMENT_HEADER_BODY.size == SH_CRC

# ---- records (format.h: WAL_RH_*, WAL_REC_*) ---------------------------------

RECORD_HEADER_SIZE = 24
RH_CRC = 0
RH_LENGTH = 4
RH_LSN = 8
RH_TYPE = 16
RH_FLAGS = 17
RH_RESERVED = 18
RH_SALT_CHECK = 20

# crc, length, lsn, type, flags, reserved, salt check
_RECORD_HEADER = struct.Struct("<IIQBBHI")
assert _RECORD_HEADER.size == RECORD_HEADER_SIZE

RECORD_DATA = 1  # one committed payload, consumes one LSN
RECORD_SEAL = 2  # last record of a finished segment, payload empty
RECORD_MARK = 3  # durability mark, payload empty: LSN = an LSN durable when it was placed
_RECORD_TYPES = (RECORD_DATA, RECORD_SEAL, RECORD_MARK)

ALIGN = 8
MAX_NUMBER = (1 << 63) - 2  # segment numbers and LSNs (format.h WAL_MAX_NUMBER)
MAX_PAYLOAD = 16 << 20  # 16 MiB = 16777216 bytes
SEAL_SIZE = RECORD_HEADER_SIZE

# ---- scan statuses (reader.h: WAL_SCAN_*) ------------------------------------

STATUS_OPEN = "open"  # data ended cleanly (end of file or all-zero rest)
STATUS_SEALED = "sealed"  # a valid SEAL record ended it; the rest is zero
STATUS_TORN = "torn"  # a bad record after which nothing valid follows
STATUS_CORRUPT = "corrupt"  # damage that is not a torn tail
STATUS_CODES = {STATUS_OPEN: 0, STATUS_SEALED: 1, STATUS_TORN: 2, STATUS_CORRUPT: 3}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_crc32c_fun = crcmod.predefined.mkCrcFun("crc-32c")


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli): reflected poly 0x82F63B78, init and final xor 0xFFFFFFFF."""
    value: int = _crc32c_fun(data)
    return value


def round_up_8(n: int) -> int:
    """``n`` rounded up to the record alignment (8)."""
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def record_size(payload_len: int) -> int:
    """Bytes a record with a payload of this length occupies in a segment."""
    return RECORD_HEADER_SIZE + round_up_8(payload_len)


def _salt_check(salt: int) -> int:
    return salt & 0xFFFFFFFF


def _all_zero(data: bytes) -> bool:
    return data.count(0) == len(data)


# ---- segment file names ------------------------------------------------------

_SEGMENT_NAME_RE = re.compile(r"[0-9a-f]{16}\.wal")


def segment_name(segment_no: int) -> str:
    """File name of segment ``segment_no``: 16 lower-case hex digits + ".wal"."""
    if not 0 <= segment_no < 1 << 64:
        raise ValueError(f"segment number out of range: {segment_no}")
    return f"{segment_no:016x}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The segment number a file name stands for, or None if it is not a segment name.

    Only the exact form written by ``segment_name`` counts: temp files
    (``.tmp``), cut tails (``.broken``), upper-case hex and other lengths are
    not segments. ``0000000000000000.wal`` parses to 0; such a segment can never
    be valid (rule H7), which the caller reports rather than ignoring the file.
    """
    if _SEGMENT_NAME_RE.fullmatch(name) is None:
        return None
    return int(name[:16], 16)


def broken_name(segment_no: int, offset: int) -> str:
    """Name of the file keeping the bytes cut at ``offset`` from a segment's torn tail."""
    return f"{segment_name(segment_no)}.{offset:016x}{BROKEN_SUFFIX}"


# ---- encoders ----------------------------------------------------------------


def encode_segment_header(
    *,
    log_id: int,
    segment_no: int,
    first_lsn: int,
    salt: int,
    prealloc_bytes: int = 0,
    version: int = FORMAT_VERSION,
    header_size: int = SEGMENT_HEADER_SIZE,
    flags: int = 0,
    reserved: int = 0,
) -> bytes:
    """The 64-byte segment header, CRC included.

    No field is validated beyond fitting its width: ``version``,
    ``header_size``, ``flags``, ``reserved`` and zero values exist so tests can
    craft headers that fail rules H3, H5, H6 and H7 behind a valid CRC.
    """
    body = _SEGMENT_HEADER_BODY.pack(
        MAGIC,
        version,
        header_size,
        flags,
        log_id,
        segment_no,
        first_lsn,
        salt,
        prealloc_bytes,
        reserved,
    )
    return body + _U32.pack(crc32c(body))


def encode_record(
    *,
    lsn: int,
    payload: bytes,
    salt: int,
    rtype: int = RECORD_DATA,
    flags: int = 0,
    reserved: int = 0,
    salt_check: int | None = None,
) -> bytes:
    """One record: 24-byte header, payload, zero padding to a multiple of 8.

    The CRC covers record bytes 4..23 followed by the payload, not the padding.
    ``salt_check`` defaults to the low 32 bits of ``salt``. ``rtype``,
    ``flags``, ``reserved`` and ``salt_check`` let tests craft records that
    fail rules R7..R9 while their CRC is valid. Payloads longer than
    MAX_PAYLOAD are refused, as the writer refuses them.
    """
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds the maximum {MAX_PAYLOAD}")
    if salt_check is None:
        salt_check = _salt_check(salt)
    header = _RECORD_HEADER.pack(0, len(payload), lsn, rtype, flags, reserved, salt_check)
    crc = crc32c(header[RH_LENGTH:] + payload)
    padding = bytes(round_up_8(len(payload)) - len(payload))
    return _U32.pack(crc) + header[RH_LENGTH:] + payload + padding


def encode_seal(*, last_lsn: int, salt: int) -> bytes:
    """The SEAL record: type 2, empty payload, LSN = last DATA LSN of the segment."""
    return encode_record(lsn=last_lsn, payload=b"", salt=salt, rtype=RECORD_SEAL)


def encode_mark(*, durable_lsn: int, salt: int) -> bytes:
    """The MARK record: type 3, empty payload, LSN = an LSN that was durable when it was placed."""
    return encode_record(lsn=durable_lsn, payload=b"", salt=salt, rtype=RECORD_MARK)


def build_segment(
    *,
    log_id: int,
    segment_no: int,
    first_lsn: int,
    salt: int,
    payloads: list[bytes],
    sealed: bool = False,
    prealloc_bytes: int = 0,
    zero_tail: int = 0,
    marks: bool = False,
) -> bytes:
    """A whole segment image, as a writer leaves it.

    Header, one DATA record per payload numbered from ``first_lsn``, a SEAL if
    ``sealed``, then ``zero_tail`` zero bytes (the unwritten, preallocated rest
    of the file). ``marks``: a MARK before each record after the first, vouching
    for the record before it (as a writer does at sync, one commit per batch).
    """
    parts = [
        encode_segment_header(
            log_id=log_id,
            segment_no=segment_no,
            first_lsn=first_lsn,
            salt=salt,
            prealloc_bytes=prealloc_bytes,
        )
    ]
    for i, payload in enumerate(payloads):
        if marks and i > 0:
            parts.append(encode_mark(durable_lsn=first_lsn + i - 1, salt=salt))
        parts.append(encode_record(lsn=first_lsn + i, payload=payload, salt=salt))
    if sealed:
        parts.append(encode_seal(last_lsn=first_lsn + len(payloads) - 1, salt=salt))
    parts.append(bytes(zero_tail))
    return b"".join(parts)


# ---- decoders ----------------------------------------------------------------


class FormatError(ValueError):
    """A segment header does not decode; ``reason`` is the rule's reason string."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SegmentHeader:
    """The fields of a decoded segment header (reader.h: wal_segment_header)."""

    version: int
    log_id: int
    segment_no: int
    first_lsn: int
    salt: int
    prealloc_bytes: int


@dataclass(frozen=True)
class ScanResult:
    """How a segment scan ended (reader.h: wal_scan_result).

    status: "open", "sealed", "torn" or "corrupt".
    reason: the rule's reason string; "" when open or sealed.
    end_offset: end of the last valid record (sealed: just after the seal);
        where a writer would resume.
    bad_offset: torn/corrupt: offset of the offending header/record; 0 otherwise.
    damage_end: torn only: one past the last non-zero byte at or after
        bad_offset (bad_offset if there is none); 0 otherwise.
    records: valid DATA records before the stop.
    last_lsn: LSN of the last valid DATA record; first_lsn - 1 when there is
        none; 0 when the header did not decode.
    next_valid_offset, next_valid_lsn: corrupt because a valid-looking record
        follows a torn candidate: where it is and its LSN field; 0 otherwise.
    header_ok: the segment header decoded (rules H1..H7 passed).
    header: the decoded header, None when header_ok is False.
    payloads: (lsn, payload) of the valid DATA records before the stop.
    """

    status: str
    reason: str
    end_offset: int
    bad_offset: int
    damage_end: int
    records: int
    last_lsn: int
    next_valid_offset: int
    next_valid_lsn: int
    header_ok: bool
    header: SegmentHeader | None
    payloads: list[tuple[int, bytes]]


def decode_segment_header(data: bytes) -> SegmentHeader:
    """Decode the header at the start of ``data`` (rules H1..H7, in order).

    Raises FormatError with the reason string of the first rule that fails.
    """
    if len(data) < SEGMENT_HEADER_SIZE:  # H1
        raise FormatError("short header")
    (
        magic,
        version,
        header_size,
        flags,
        log_id,
        segment_no,
        first_lsn,
        salt,
        prealloc_bytes,
        reserved,
    ) = _SEGMENT_HEADER_BODY.unpack_from(data, 0)
    if magic != MAGIC:  # H2
        raise FormatError("bad magic")
    # H3 comes before the CRC check: a newer version may checksum differently,
    # and "unsupported version" tells the user what to do (upgrade).
    if version != FORMAT_VERSION:  # H3
        raise FormatError("unsupported version")
    if crc32c(bytes(data[:SH_CRC])) != _U32.unpack_from(data, SH_CRC)[0]:  # H4
        raise FormatError("bad header crc")
    if header_size != SEGMENT_HEADER_SIZE:  # H5
        raise FormatError("bad header size")
    if flags != 0 or reserved != 0:  # H6
        raise FormatError("bad header flags")
    if log_id == 0 or salt == 0 or not 0 < segment_no <= MAX_NUMBER or not 0 < first_lsn <= MAX_NUMBER:  # H7
        raise FormatError("bad header fields")
    return SegmentHeader(
        version=version,
        log_id=log_id,
        segment_no=segment_no,
        first_lsn=first_lsn,
        salt=salt,
        prealloc_bytes=prealloc_bytes,
    )


def _looks_valid(data: bytes, p: int, salt_check: int) -> bool:
    """Whether a whole, valid record starts at ``p`` (the torn-candidate search test)."""
    n = len(data)
    if p + RECORD_HEADER_SIZE > n:
        return False
    crc, length, _lsn, rtype, flags, reserved, check = _RECORD_HEADER.unpack_from(data, p)
    if check != salt_check or rtype not in _RECORD_TYPES or flags != 0 or reserved != 0:
        return False
    if length > MAX_PAYLOAD or p + RECORD_HEADER_SIZE + round_up_8(length) > n:
        return False
    covered = data[p + RH_LENGTH : p + RECORD_HEADER_SIZE + length]
    return bool(crc32c(covered) == crc)


def _valid_after(data: bytes, b: int, salt_check: int) -> Iterator[int]:
    """Offsets of the valid-looking records after bad bytes at ``b`` (rule T), in order.

    Candidates are p = b + 8, b + 16, ... (p + 24 <= len); after a valid-looking
    record the search goes on past its end. Only offsets where the 4 salt-check
    bytes sit are tested, found with bytes.find (equivalent, just faster).
    """
    needle = _U32.pack(salt_check)
    n = len(data)
    start = b + ALIGN  # the first candidate
    q = start + RH_SALT_CHECK
    while True:
        q = data.find(needle, q)
        if q < 0:
            return
        p = q - RH_SALT_CHECK
        if p + RECORD_HEADER_SIZE > n:
            return
        if (p - start) % ALIGN == 0 and _looks_valid(data, p, salt_check):
            yield p
            start = p + record_size(_U32.unpack_from(data, p + RH_LENGTH)[0])
            q = start + RH_SALT_CHECK
        else:
            q += 1


def scan_segment(data: bytes) -> ScanResult:
    """Validate a whole segment image and classify how it ends (rules H1..H7, R1..R12).

    Never raises on bad input: every outcome is a ScanResult.
    """
    data = bytes(data)  # accept any buffer; slices below are then plain bytes
    n = len(data)
    try:
        header = decode_segment_header(data)
    except FormatError as e:  # H1..H7: corrupt, bad_offset 0, header not ok
        return ScanResult(
            status=STATUS_CORRUPT,
            reason=e.reason,
            end_offset=0,
            bad_offset=0,
            damage_end=0,
            records=0,
            last_lsn=0,
            next_valid_offset=0,
            next_valid_lsn=0,
            header_ok=False,
            header=None,
            payloads=[],
        )

    salt_check = _salt_check(header.salt)
    payloads: list[tuple[int, bytes]] = []
    off = SEGMENT_HEADER_SIZE
    expected = header.first_lsn
    last_lsn = header.first_lsn - 1

    def finish(
        status: str,
        reason: str = "",
        *,
        end_offset: int,
        bad_offset: int = 0,
        damage_end: int = 0,
        next_valid_offset: int = 0,
        next_valid_lsn: int = 0,
    ) -> ScanResult:
        return ScanResult(
            status=status,
            reason=reason,
            end_offset=end_offset,
            bad_offset=bad_offset,
            damage_end=damage_end,
            records=len(payloads),
            last_lsn=last_lsn,
            next_valid_offset=next_valid_offset,
            next_valid_lsn=next_valid_lsn,
            header_ok=True,
            header=header,
            payloads=payloads,
        )

    def torn_candidate(b: int, reason: str) -> ScanResult:
        # Rule T. A crash only damages bytes that were never made durable; a later
        # valid MARK whose LSN reaches the damaged record proves these bytes had
        # been, so only then is the damage corruption. Otherwise it is a torn tail.
        first_valid: int | None = None
        for p in _valid_after(data, b, salt_check):
            if first_valid is None:
                first_valid = p
            _crc, _len, p_lsn, p_type, *_ = _RECORD_HEADER.unpack_from(data, p)
            if p_type == RECORD_MARK and p_lsn >= expected:
                return finish(
                    STATUS_CORRUPT,
                    reason,
                    end_offset=b,
                    bad_offset=b,
                    next_valid_offset=first_valid,
                    next_valid_lsn=_U64.unpack_from(data, first_valid + RH_LSN)[0],
                )
        rest = data[b:]
        damage_end = b + len(rest.rstrip(b"\0"))  # one past the last non-zero byte
        return finish(
            STATUS_TORN,
            reason,
            end_offset=b,
            bad_offset=b,
            damage_end=damage_end,
            next_valid_offset=first_valid or 0,
            next_valid_lsn=_U64.unpack_from(data, first_valid + RH_LSN)[0] if first_valid is not None else 0,
        )

    def corrupt(reason: str) -> ScanResult:
        return finish(STATUS_CORRUPT, reason, end_offset=off, bad_offset=off)

    while True:
        if off == n:  # R1
            return finish(STATUS_OPEN, end_offset=off)
        if n - off < RECORD_HEADER_SIZE:  # R2
            if _all_zero(data[off:]):
                return finish(STATUS_OPEN, end_offset=off)
            return torn_candidate(off, "truncated header")
        if _all_zero(data[off : off + RECORD_HEADER_SIZE]):  # R3
            if _all_zero(data[off:]):
                return finish(STATUS_OPEN, end_offset=off)
            return torn_candidate(off, "zeroed header")
        crc, length, lsn, rtype, flags, reserved, check = _RECORD_HEADER.unpack_from(data, off)
        if length > MAX_PAYLOAD:  # R4
            return torn_candidate(off, "bad length")
        size = record_size(length)
        if off + size > n:  # R5
            return torn_candidate(off, "truncated record")
        payload_end = off + RECORD_HEADER_SIZE + length
        if crc32c(data[off + RH_LENGTH : payload_end]) != crc:  # R6
            return torn_candidate(off, "bad crc")

        # The CRC is valid: the record was written whole, so anything wrong
        # with it now is corruption, never a torn tail.
        if rtype not in _RECORD_TYPES:  # R7
            return corrupt("unknown record type")
        if flags != 0 or reserved != 0:  # R8
            return corrupt("bad record flags")
        if check != salt_check:  # R9
            return corrupt("wrong salt")
        if not _all_zero(data[payload_end : off + size]):  # R10
            return corrupt("nonzero padding")
        if rtype == RECORD_DATA:  # R11
            if lsn > expected or lsn > MAX_NUMBER:
                return corrupt("lsn gap")
            if lsn < expected:
                return corrupt("lsn out of order")
            payloads.append((lsn, data[off + RECORD_HEADER_SIZE : payload_end]))
            last_lsn = lsn
            expected += 1
            off += size
            continue
        if rtype == RECORD_MARK:  # R13
            if length != 0:
                return corrupt("bad mark")
            if lsn > expected - 1:
                return corrupt("bad mark lsn")
            off += RECORD_HEADER_SIZE
            continue
        # R12: SEAL
        if length != 0:
            return corrupt("bad seal")
        if lsn != expected - 1:
            return corrupt("bad seal lsn")
        end_offset = off + SEAL_SIZE
        if not _all_zero(data[end_offset:]):
            return finish(STATUS_CORRUPT, "data after seal", end_offset=end_offset, bad_offset=end_offset)
        return finish(STATUS_SEALED, end_offset=end_offset)
