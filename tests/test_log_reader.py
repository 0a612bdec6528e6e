"""The C segment reader (native/reader.c) against the pure-Python reference decoder (wal/log/format.py).

Two kinds of tests:

* agreement: on Hypothesis-generated segments, clean and damaged, the C scan
  (``wal.log.recovery.scan_buffer`` -> ``wal_scan_segment``) gives exactly the
  reference's status, reason, offsets, record count, last LSN and next-valid
  pointer, and ``wal_segment_records`` yields exactly the reference's records;
* one named test per reader edge case (as LevelDB's log_test.cc),
  run through the C reader: truncation at every byte of the last record, every
  single-byte flip of a small segment, zero-filled tail, LSN gap, wrong salt,
  unknown record type, the maximum record size and one byte over.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wal
import wal.log.format as wf
from wal._bindings import ffi, lib, span_records
from wal.log.recovery import STATUS_NAMES, scan_buffer

LOG_ID = 0x5EED5EED12345678
SALT = 0x0DDBA11CAFEF00D5
OTHER_SALT = 0x1234567876543210
H = wf.SEGMENT_HEADER_SIZE
MAX = wf.MAX_PAYLOAD


# ---- helpers -----------------------------------------------------------------


@dataclass(frozen=True)
class CScan:
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
    header: wf.SegmentHeader | None
    payloads: list[tuple[int, bytes]]


def c_records(data: bytes, end: int, from_lsn: int = 0, batch: int = 3) -> list[tuple[int, bytes]]:
    """Every DATA record of data[:end] through lib.wal_segment_records (small batches on purpose)."""
    buf = ffi.from_buffer("uint8_t[]", data) if data else ffi.NULL
    lsns = ffi.new("uint64_t[]", batch)
    offs = ffi.new("uint64_t[]", batch)
    lens = ffi.new("uint32_t[]", batch)
    cursor = ffi.new("uint64_t *")
    out: list[tuple[int, bytes]] = []
    while True:
        n = lib.wal_segment_records(buf, end, from_lsn, cursor, batch, lsns, offs, lens)
        if n == 0:
            return out
        for k in range(n):
            off = int(offs[k])
            out.append((int(lsns[k]), data[off : off + int(lens[k])]))


def c_scan(data: bytes) -> CScan:
    res = scan_buffer(data)
    ok = bool(res.header_ok)
    h = res.header
    header = (
        wf.SegmentHeader(
            version=h.version, log_id=h.log_id, segment_no=h.segment_no, first_lsn=h.first_lsn,
            salt=h.salt, prealloc_bytes=h.prealloc_bytes,
        )
        if ok
        else None
    )
    end = int(res.end_offset)
    return CScan(
        status=STATUS_NAMES[res.status],
        reason=ffi.string(res.reason).decode(),
        end_offset=end,
        bad_offset=int(res.bad_offset),
        damage_end=int(res.damage_end),
        records=int(res.records),
        last_lsn=int(res.last_lsn),
        next_valid_offset=int(res.next_valid_offset),
        next_valid_lsn=int(res.next_valid_lsn),
        header_ok=ok,
        header=header,
        payloads=c_records(data, end) if ok else [],
    )


def py_scan(data: bytes) -> CScan:
    r = wf.scan_segment(data)
    return CScan(
        status=r.status, reason=r.reason, end_offset=r.end_offset, bad_offset=r.bad_offset,
        damage_end=r.damage_end, records=r.records, last_lsn=r.last_lsn,
        next_valid_offset=r.next_valid_offset, next_valid_lsn=r.next_valid_lsn,
        header_ok=r.header_ok, header=r.header, payloads=list(r.payloads),
    )


def scan_both(data: bytes) -> CScan:
    """The C scan, after checking it equals the reference field by field."""
    c, py = c_scan(data), py_scan(data)
    assert c == py
    return c


def segment(payloads: list[bytes], *, first_lsn: int = 1, sealed: bool = False, zero_tail: int = 0,
            salt: int = SALT, marks: bool = False) -> bytes:
    """A segment as the writer leaves it; marks=True: a MARK vouching for each record before the next one
    (the writer at sync, one commit per batch)."""
    return wf.build_segment(log_id=LOG_ID, segment_no=1, first_lsn=first_lsn, salt=salt, payloads=payloads,
                            sealed=sealed, zero_tail=zero_tail, marks=marks)


def record_starts(data: bytes) -> list[tuple[int, int]]:
    """(offset, type) of every record of a clean segment image, MARK and SEAL included."""
    out, off = [], H
    end = wf.scan_segment(data).end_offset
    while off < end:
        length, rtype = struct.unpack_from("<I", data, off + wf.RH_LENGTH)[0], data[off + wf.RH_TYPE]
        out.append((off, rtype))
        off += wf.record_size(length)
    return out


def offsets_of(payloads: list[bytes]) -> list[int]:
    """Offsets of each record of segment(payloads), then the end."""
    out = [H]
    for p in payloads:
        out.append(out[-1] + wf.record_size(len(p)))
    return out


def raw_record(*, length: int, lsn: int, payload: bytes, salt: int = SALT, rtype: int = wf.RECORD_DATA) -> bytes:
    """A record packed by hand with any length field and a CRC valid for it (encode_record refuses > 16 MiB)."""
    body = struct.pack("<IQBBHI", length, lsn, rtype, 0, 0, salt & 0xFFFFFFFF)
    crc = wf.crc32c(body + payload)
    return struct.pack("<I", crc) + body + payload + bytes(-len(payload) % 8)


def is_prefix(got: list[tuple[int, bytes]], full: list[tuple[int, bytes]]) -> bool:
    return got == full[: len(got)]


# ---- agreement with the reference on generated segments ----------------------

payload_st = st.binary(min_size=0, max_size=80)


@st.composite
def clean_segments(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, bytes]]]:
    payloads = draw(st.lists(payload_st, max_size=12))
    first = draw(st.integers(min_value=1, max_value=2**40))
    sealed = draw(st.booleans())
    tail = draw(st.sampled_from([0, 0, 7, 24, 100, 512]))
    salt = draw(st.integers(min_value=1, max_value=2**64 - 1))
    data = wf.build_segment(log_id=LOG_ID, segment_no=draw(st.integers(1, 2**20)), first_lsn=first, salt=salt,
                            payloads=payloads, sealed=sealed, zero_tail=tail, marks=draw(st.booleans()))
    return data, [(first + i, p) for i, p in enumerate(payloads)]


@st.composite
def damaged_segments(draw: st.DrawFn) -> bytes:
    data, _ = draw(clean_segments())
    out = bytearray(data)

    def position(n: int) -> int:
        # Mostly past the segment header, so that most cases exercise the record rules.
        lo = 0 if n <= H or draw(st.integers(0, 7)) == 0 else H
        return draw(st.integers(lo, n - 1))

    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "zero", "junk", "record", "splice"]))
        n = len(out)
        if kind == "truncate" and n:
            del out[position(n) + 1 :]
        elif kind == "flip" and n:
            out[position(n)] ^= draw(st.integers(1, 255))
        elif kind == "zero" and n:
            a = position(n)
            b = draw(st.integers(a, min(n, a + 64)))
            out[a:b] = bytes(b - a)
        elif kind == "junk":
            out += draw(st.binary(min_size=1, max_size=64))
        elif kind == "record":
            # a record with a valid CRC (maybe a wrong LSN, type or salt) at an aligned place
            rtype = draw(st.sampled_from([wf.RECORD_DATA, wf.RECORD_DATA, wf.RECORD_SEAL, wf.RECORD_MARK, 4]))
            salt = wf.decode_segment_header(data).salt if draw(st.booleans()) else OTHER_SALT
            first = wf.decode_segment_header(data).first_lsn
            lsn = draw(st.one_of(st.integers(first - 1, first + 14), st.integers(0, 2**40)))
            rec = wf.encode_record(lsn=lsn, payload=draw(payload_st), salt=salt, rtype=rtype)
            at = (position(n) // 8) * 8 if n else 0
            out[at : at + len(rec)] = rec
        elif kind == "splice" and n > H:
            # copy an aligned slice of the segment elsewhere (a record appearing twice, or shifted)
            a = draw(st.integers(H // 8, (n - 1) // 8)) * 8
            b = draw(st.integers(a, n))
            at = (position(n) // 8) * 8
            out[at:at] = out[a:b]
    return bytes(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clean_segments())
def test_c_reader_agrees_with_reference_on_clean_segments(case: tuple[bytes, list[tuple[int, bytes]]]) -> None:
    data, records = case
    res = scan_both(data)
    assert res.status in ("open", "sealed")
    assert res.payloads == records
    assert res.records == len(records)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_segments())
def test_c_reader_agrees_with_reference_on_damaged_segments(data: bytes) -> None:
    scan_both(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_c_reader_agrees_with_reference_on_arbitrary_bytes_after_a_valid_header(tail: bytes) -> None:
    scan_both(segment([]) + tail)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_c_reader_agrees_with_reference_on_arbitrary_bytes(data: bytes) -> None:
    scan_both(data)


@settings(max_examples=200, deadline=None)
@given(clean_segments(), st.integers(0, 2**41))
def test_segment_records_from_lsn_yields_exactly_the_records_at_or_after_it(
    case: tuple[bytes, list[tuple[int, bytes]]], from_lsn: int
) -> None:
    data, records = case
    end = c_scan(data).end_offset
    assert c_records(data, end, from_lsn) == [r for r in records if r[0] >= from_lsn]


def c_scan_records(data: bytes, from_lsn: int, cap: int) -> tuple[Any, list[tuple[int, bytes]]]:
    """lib.wal_scan_records to the end, `cap` records a call: the final result and what it handed out."""
    buf = ffi.from_buffer("uint8_t[]", data) if data else ffi.NULL
    res = ffi.new("wal_scan_result *")
    lsns = ffi.new("uint64_t[]", cap)
    offs = ffi.new("uint64_t[]", cap)
    lens = ffi.new("uint32_t[]", cap)
    count = ffi.new("size_t *")
    out: list[tuple[int, bytes]] = []
    while True:
        status = lib.wal_scan_records(buf, len(data), res, from_lsn, cap, lsns, offs, lens, count)
        n = int(count[0])
        assert n <= cap
        out += [(int(lsns[k]), data[int(offs[k]) : int(offs[k]) + int(lens[k])]) for k in range(n)]
        if status != lib.WAL_SCAN_MORE:
            assert status == res.status
            return res, out
        assert n == cap, "MORE only when the arrays are full"


def assert_stepwise_scan_equals_the_whole_scan(data: bytes, from_lsn: int, cap: int) -> None:
    whole = c_scan(data)
    res, got = c_scan_records(data, from_lsn, cap)
    assert (STATUS_NAMES[res.status], ffi.string(res.reason).decode(), res.end_offset, res.bad_offset,
            res.damage_end, res.records, res.last_lsn, res.next_valid_offset, res.next_valid_lsn,
            bool(res.header_ok)) == (
        whole.status, whole.reason, whole.end_offset, whole.bad_offset, whole.damage_end, whole.records,
        whole.last_lsn, whole.next_valid_offset, whole.next_valid_lsn, whole.header_ok)
    # Exactly the valid records before the stop, damage or not: none past it, none twice.
    assert got == [r for r in whole.payloads if r[0] >= from_lsn]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clean_segments(), st.integers(0, 2**41), st.integers(1, 5))
def test_stepwise_scan_hands_out_the_records_and_ends_as_the_whole_scan_on_clean_segments(
    case: tuple[bytes, list[tuple[int, bytes]]], from_lsn: int, cap: int
) -> None:
    data, records = case
    if records and from_lsn % 2:
        from_lsn = records[from_lsn % len(records)][0]  # often inside the segment, not only past or before it
    assert_stepwise_scan_equals_the_whole_scan(data, from_lsn, cap)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_segments(), st.integers(1, 4))
def test_stepwise_scan_stops_at_damage_exactly_where_the_whole_scan_does(data: bytes, cap: int) -> None:
    assert_stepwise_scan_equals_the_whole_scan(data, 0, cap)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_stepwise_scan_of_arbitrary_bytes_ends_as_the_whole_scan(data: bytes) -> None:
    assert_stepwise_scan_equals_the_whole_scan(data, 0, 2)


# ---- named edge cases, through the C reader -----------------------------------

PAYLOADS = [b"first record", b"second record!", b"the third and last record, long enough to cut anywhere"]
RECORDS = [(i + 1, p) for i, p in enumerate(PAYLOADS)]


@pytest.mark.parametrize("marks", [False, True], ids=["no-marks", "marks"])
@pytest.mark.parametrize("zero_filled", [False, True], ids=["file-cut", "rest-zeroed"])
def test_truncation_at_every_byte_offset_of_the_last_record_is_a_torn_tail_keeping_earlier_records(
    zero_filled: bool, marks: bool
) -> None:
    full = segment(PAYLOADS, marks=marks)
    start, end = record_starts(full)[-1][0], len(full)
    payload_end = start + wf.RECORD_HEADER_SIZE + len(PAYLOADS[-1])
    for cut in range(start, end):
        data = full[:cut] + (bytes(end - cut) if zero_filled else b"")
        res = scan_both(data)
        if zero_filled and cut >= payload_end:
            # only zero padding was missing, and zeros are what the padding holds: the record is whole
            assert (res.status, res.payloads) == ("open", RECORDS), cut
            continue
        assert res.payloads == RECORDS[:-1], cut
        assert res.end_offset == start, cut
        if cut == start or (zero_filled and not any(full[start:cut])):
            assert res.status == "open", cut  # nothing of the last record reached the disk
        else:
            assert res.status == "torn", cut
            assert res.bad_offset == start
            assert res.reason in ("truncated header", "truncated record", "bad crc"), cut
            assert res.damage_end <= cut if zero_filled else res.damage_end <= len(data)
    assert scan_both(full).payloads == RECORDS


def test_truncation_names_truncated_header_then_truncated_record() -> None:
    full = segment(PAYLOADS)
    start = offsets_of(PAYLOADS)[-2]
    assert c_scan(full[: start + 10]).reason == "truncated header"
    assert c_scan(full[: start + 24 + 3]).reason == "truncated record"


@pytest.mark.parametrize("marks", [False, True], ids=["no-marks", "marks"])
@pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
def test_every_single_byte_flip_of_a_small_segment_is_corruption_or_a_prefix_never_wrong_data(
    sealed: bool, marks: bool
) -> None:
    full = segment(PAYLOADS, sealed=sealed, zero_tail=40, marks=marks)
    starts = record_starts(full)
    # Rule T: damage is provably corruption when a later MARK vouches for it, i.e. before the last batch
    # (the last DATA record and the MARK in front of it).
    data_starts = [off for off, t in starts if t == wf.RECORD_DATA]
    last_batch = data_starts[-1] - (wf.SEAL_SIZE if marks else 0)
    for i in range(len(full)):
        for mask in (0x01, 0x80, 0xFF):
            data = bytearray(full)
            data[i] ^= mask
            res = scan_both(bytes(data))
            where = f"offset {i} ^ {mask:#x}"
            if res.status == "corrupt":
                continue
            assert res.status in ("open", "sealed", "torn"), where
            assert is_prefix(res.payloads, RECORDS), where  # never a wrong or skipped record
            if marks and H <= i < last_batch:
                pytest.fail(f"{where}: damage vouched for by a later MARK was not called corruption")
            if res.status != "torn":
                # a clean verdict only when the flip could not touch any record
                assert res.payloads == RECORDS, where


def test_flipped_byte_in_a_record_vouched_for_by_a_later_mark_is_corruption() -> None:
    full = segment(PAYLOADS, marks=True)
    data_starts = [off for off, t in record_starts(full) if t == wf.RECORD_DATA]
    data = bytearray(full)
    data[data_starts[1] + 30] ^= 0x40  # payload of record 2; the MARK before record 3 vouches for it
    res = scan_both(bytes(data))
    assert (res.status, res.reason) == ("corrupt", "bad crc")
    assert res.bad_offset == data_starts[1]
    assert res.next_valid_offset == data_starts[2] - wf.SEAL_SIZE  # the MARK
    assert res.next_valid_lsn == 2
    assert res.payloads == RECORDS[:1]


def test_flipped_byte_in_a_record_no_mark_vouches_for_is_a_torn_tail_cutting_what_follows() -> None:
    """A power cut may keep a later sector of an unsynced batch and lose an earlier one (rule T)."""
    full = segment(PAYLOADS)  # one batch, no marks
    data_starts = [off for off, t in record_starts(full) if t == wf.RECORD_DATA]
    data = bytearray(full)
    data[data_starts[1] + 30] ^= 0x40
    res = scan_both(bytes(data))
    assert (res.status, res.reason, res.bad_offset) == ("torn", "bad crc", data_starts[1])
    assert res.next_valid_offset == data_starts[2]
    assert res.damage_end == len(full.rstrip(b"\0"))
    assert res.payloads == RECORDS[:1]


@pytest.mark.parametrize("tail", [1, 7, 8, 23, 24, 25, 4096, 1 << 20])
def test_zero_filled_tail_after_the_records_is_an_open_segment(tail: int) -> None:
    res = scan_both(segment(PAYLOADS, zero_tail=tail))
    assert res.status == "open"
    assert res.reason == ""
    assert res.end_offset == offsets_of(PAYLOADS)[-1]
    assert res.payloads == RECORDS


def test_zero_filled_segment_with_no_records_is_open_and_empty() -> None:
    res = scan_both(segment([], first_lsn=42, zero_tail=8192))
    assert (res.status, res.records, res.last_lsn, res.end_offset) == ("open", 0, 41, H)


def test_zeroed_middle_of_the_last_record_in_a_zero_filled_tail_is_torn() -> None:
    full = segment(PAYLOADS, zero_tail=256)
    start = offsets_of(PAYLOADS)[-2]
    data = bytearray(full)
    data[start + 30 : start + 50] = bytes(20)
    res = scan_both(bytes(data))
    assert (res.status, res.reason, res.bad_offset) == ("torn", "bad crc", start)
    assert res.damage_end == start + wf.RECORD_HEADER_SIZE + len(PAYLOADS[-1])  # one past its last non-zero byte
    assert res.payloads == RECORDS[:-1]


def test_lsn_gap_with_a_valid_crc_is_corruption() -> None:
    head = segment(PAYLOADS[:2])
    gap = wf.encode_record(lsn=4, payload=b"skipped lsn 3", salt=SALT)
    res = scan_both(head + gap)
    assert (res.status, res.reason) == ("corrupt", "lsn gap")
    assert res.bad_offset == len(head)
    assert res.payloads == RECORDS[:2]
    assert res.last_lsn == 2


def test_repeated_lsn_is_corruption_out_of_order() -> None:
    head = segment(PAYLOADS[:2])
    res = scan_both(head + wf.encode_record(lsn=2, payload=b"again", salt=SALT))
    assert (res.status, res.reason, res.bad_offset) == ("corrupt", "lsn out of order", len(head))


def test_record_with_the_wrong_salt_is_corruption() -> None:
    head = segment(PAYLOADS[:2])
    stale = wf.encode_record(lsn=3, payload=b"from an older segment", salt=OTHER_SALT)
    res = scan_both(head + stale)
    assert (res.status, res.reason, res.bad_offset) == ("corrupt", "wrong salt", len(head))
    assert res.payloads == RECORDS[:2]


def test_segment_header_with_a_flipped_salt_makes_every_record_wrong_salt() -> None:
    data = bytearray(segment(PAYLOADS))
    # Rewrite the header with another salt and a valid CRC: the records no longer belong to it.
    data[:H] = wf.encode_segment_header(log_id=LOG_ID, segment_no=1, first_lsn=1, salt=OTHER_SALT)
    res = scan_both(bytes(data))
    assert (res.status, res.reason, res.bad_offset, res.records) == ("corrupt", "wrong salt", H, 0)


def test_unknown_record_type_with_a_valid_crc_is_corruption() -> None:
    head = segment(PAYLOADS[:2])
    res = scan_both(head + wf.encode_record(lsn=3, payload=b"type 4", salt=SALT, rtype=4))
    assert (res.status, res.reason, res.bad_offset) == ("corrupt", "unknown record type", len(head))
    assert res.payloads == RECORDS[:2]


def test_record_of_exactly_the_maximum_size_is_read_whole() -> None:
    big = bytes(range(256)) * (MAX // 256)
    assert len(big) == MAX
    data = segment([b"before", big, b"after"])
    res = c_scan(data)  # the reference is slow-ish at 16 MiB; compare the essentials
    py = wf.scan_segment(data)
    assert (res.status, res.records, res.end_offset) == ("open", 3, len(data))
    assert (py.status, py.records, py.end_offset) == ("open", 3, len(data))
    assert res.payloads == [(1, b"before"), (2, big), (3, b"after")]


def test_record_one_byte_over_the_maximum_is_a_bad_length_torn_candidate() -> None:
    head = segment(PAYLOADS[:2])
    over = raw_record(length=MAX + 1, lsn=3, payload=bytes(MAX + 1))
    res = scan_both(head + over)
    assert (res.status, res.reason, res.bad_offset) == ("torn", "bad length", len(head))
    assert res.payloads == RECORDS[:2]
    # followed by a MARK vouching for LSN 3 it is corruption, never a skipped record
    after = wf.encode_mark(durable_lsn=3, salt=SALT) + wf.encode_record(lsn=4, payload=b"valid", salt=SALT)
    res = scan_both(head + over[:24] + after)
    assert (res.status, res.reason, res.next_valid_offset) == ("corrupt", "bad length", len(head) + 24)
    assert res.payloads == RECORDS[:2]


def test_crafted_record_one_byte_over_the_maximum_on_disk_is_cut_as_a_torn_tail_on_open(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.Log.open(d, segment_bytes=1 << 16) as log:
        log.append_many([b"a", b"b"])
    seg = d / wf.segment_name(1)
    end = wf.scan_segment(seg.read_bytes()).end_offset
    crafted = raw_record(length=MAX + 1, lsn=3, payload=b"\x5a" * 100)[:124]
    with open(seg, "r+b") as f:
        f.seek(end)
        f.write(crafted)
    assert c_scan(seg.read_bytes()).reason == "bad length"
    with wal.Log.open(d, segment_bytes=1 << 16) as log:
        assert log.recovery_report.torn_tail == (str(seg), end, len(crafted.rstrip(b"\0")))
        assert list(log.read()) == [(1, b"a"), (2, b"b")]
        assert log.append(b"c") == 3


def test_writer_refuses_a_payload_one_byte_over_the_maximum_and_writes_nothing(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path / "log", segment_bytes=1 << 16) as log:
        log.append(b"x")
        with pytest.raises(wal.RecordTooLargeError):
            log.append(bytes(MAX + 1))
        with pytest.raises(wal.RecordTooLargeError):
            log.append_many([b"ok", bytes(MAX + 1)])
        assert log.watermarks.appended == 1
        assert log.append(b"y") == 2
    with wal.Log.open(tmp_path / "log") as log:
        assert list(log.read()) == [(1, b"x"), (2, b"y")]


def test_writer_accepts_a_payload_of_exactly_the_maximum_and_reads_it_back(tmp_path: Path) -> None:
    big = bytes(range(251)) * (MAX // 251) + b"z" * (MAX % 251)
    assert len(big) == MAX
    with wal.Log.open(tmp_path / "log", segment_bytes=1 << 16) as log:
        assert log.append(b"small") == 1
        assert log.append(big) == 2
        assert log.append(b"after") == 3
    with wal.Log.open(tmp_path / "log", segment_bytes=1 << 16) as log:
        got = list(log.read())
    assert [lsn for lsn, _ in got] == [1, 2, 3]
    assert got[1][1] == big


def test_seal_ends_the_segment_and_a_seal_with_the_wrong_lsn_is_corruption() -> None:
    res = scan_both(segment(PAYLOADS, sealed=True, zero_tail=64))
    assert (res.status, res.payloads) == ("sealed", RECORDS)
    head = segment(PAYLOADS)
    res = scan_both(head + wf.encode_record(lsn=2, payload=b"", salt=SALT, rtype=wf.RECORD_SEAL))
    assert (res.status, res.reason) == ("corrupt", "bad seal lsn")


def test_data_after_a_seal_is_corruption() -> None:
    sealed = segment(PAYLOADS, sealed=True)
    res = scan_both(sealed + b"\x00" * 16 + b"\x01")
    assert (res.status, res.reason, res.bad_offset) == ("corrupt", "data after seal", len(sealed))


@pytest.mark.parametrize("cut", [0, 1, 8, 63])
def test_a_header_shorter_than_64_bytes_is_corrupt_short_header(cut: int) -> None:
    res = scan_both(segment(PAYLOADS)[:cut])
    assert (res.status, res.reason, res.header_ok) == ("corrupt", "short header", False)


def test_newer_format_version_is_reported_as_unsupported_version() -> None:
    data = wf.encode_segment_header(log_id=LOG_ID, segment_no=1, first_lsn=1, salt=SALT, version=2)
    res = scan_both(data + bytes(100))
    assert (res.status, res.reason) == ("corrupt", "unsupported version")


def test_garbage_appended_after_the_records_is_a_torn_tail_keeping_them() -> None:
    full = segment(PAYLOADS)
    junk = b"\xde\xad\xbe\xef" * 20
    res = scan_both(full + junk)
    assert (res.status, res.bad_offset, res.damage_end) == ("torn", len(full), len(full) + len(junk))
    assert res.payloads == RECORDS


def test_every_truncation_of_a_segment_with_a_large_record_is_open_or_torn_as_the_reference_says() -> None:
    # Length fields pointing past the end, at every truncation of a segment with a large record.
    full = segment([b"a" * 1000, b"b" * 3])
    for cut in range(H, len(full), 7):
        res = scan_both(full[:cut])
        assert res.status in ("open", "torn")


# ---- a span's records as Python objects (native/readcall.c, Log.read) ------------------------------


@settings(max_examples=100)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=2**64 - 1), st.binary(max_size=300)), max_size=40),
       st.binary(max_size=8))
def test_span_records_are_the_slices_the_arrays_name(records: list[tuple[int, bytes]], gap: bytes) -> None:
    buf, lsns, offs, lens = b"", [], [], []
    for lsn, payload in records:
        buf += gap  # frame headers sit between payloads in a segment
        lsns.append(lsn)
        offs.append(len(buf))
        lens.append(len(payload))
        buf += payload
    n = len(records)
    got = span_records(memoryview(buf), struct.pack(f"={n}Q", *lsns), struct.pack(f"={n}Q", *offs),
                       struct.pack(f"={n}I", *lens), n)
    assert got == records and all(type(p) is bytes for _, p in got)


def test_span_records_refuses_a_range_outside_the_buffer_and_arrays_shorter_than_count() -> None:
    one_q, one_i = struct.pack("=Q", 1), struct.pack("=I", 4)
    assert span_records(b"abcd", one_q, struct.pack("=Q", 0), one_i, 1) == [(1, b"abcd")]
    for off, length in [(1, 4), (5, 0), (2**63, 4), (0, 2**32 - 1)]:
        with pytest.raises(ValueError, match="outside"):
            span_records(b"abcd", one_q, struct.pack("=Q", off), struct.pack("=I", length), 1)
    with pytest.raises(ValueError, match="needed"):
        span_records(b"abcd", one_q, struct.pack("=Q", 0), one_i, 2)
    with pytest.raises(ValueError, match="count"):
        span_records(b"abcd", one_q, one_q, one_i, -1)
    assert span_records(b"", b"", b"", b"", 0) == []


def test_log_read_after_reopen_equals_what_was_appended_across_segments(tmp_path: Path) -> None:
    payloads = [bytes([i % 251]) * (i % 700) for i in range(3000)]  # spans of 256 and 1,024 records, 4 segments
    with wal.Log.open(str(tmp_path), durability="buffered", rpo_ms=50, segment_bytes=1 << 19) as lg:
        lg.append_many(payloads)
    with wal.Log.open(str(tmp_path)) as lg:
        assert len([p for p in tmp_path.iterdir() if p.suffix == ".wal"]) >= 3
        assert list(lg.read()) == list(enumerate(payloads, start=1))
        assert list(lg.read(2500)) == list(enumerate(payloads, start=1))[2499:]
