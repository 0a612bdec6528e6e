"""The pure-Python reference decoder (wal/log/format.py) against the spec (FORMAT.md).

One named test per validity rule of FORMAT.md section 8 ("Reading a segment"),
each checking its reason string verbatim, plus the worked example and golden
file, round trips, and the crash shapes the rules exist for: truncation and
byte flips. The C reader is held against this module elsewhere; here the
module itself is held against the document.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wal.log.format as wf

ROOT = Path(__file__).resolve().parents[1]
FORMAT_MD = ROOT / "FORMAT.md"
FORMAT_H = ROOT / "native" / "format.h"
GOLDEN = ROOT / "tests" / "data" / "golden_two_records.wal"

# The worked example of FORMAT.md section 13.
EXAMPLE_LOG_ID = 0x0123456789ABCDEF
EXAMPLE_SALT = 0x5A17C0FFEE15900D
EXAMPLE_PAYLOADS = [b"hello", b"agent state v1"]

LOG_ID = 0x1122334455667788
SALT = 0x0BADC0DE600DF00D
OTHER_SALT = 0x7777777712345678
H = wf.SEGMENT_HEADER_SIZE
MiB16 = 16 * 1024 * 1024


# ---- helpers -----------------------------------------------------------------


def header(**overrides: int) -> bytes:
    fields = {"log_id": LOG_ID, "segment_no": 1, "first_lsn": 1, "salt": SALT}
    fields.update(overrides)
    return wf.encode_segment_header(**fields)


def record(lsn: int, payload: bytes = b"payload", **knobs: int) -> bytes:
    return wf.encode_record(lsn=lsn, payload=payload, salt=SALT, **knobs)


def segment(payloads: list[bytes], *, first_lsn: int = 1, sealed: bool = False, zero_tail: int = 0) -> bytes:
    return wf.build_segment(
        log_id=LOG_ID,
        segment_no=1,
        first_lsn=first_lsn,
        salt=SALT,
        payloads=payloads,
        sealed=sealed,
        zero_tail=zero_tail,
    )


def raw_record(*, length: int, lsn: int, payload: bytes, salt: int = SALT) -> bytes:
    """A DATA record packed by hand, with any length field and a CRC valid for it.

    Independent of wf.encode_record, which refuses what the writer refuses.
    """
    body = struct.pack("<IQBBHI", length, lsn, wf.RECORD_DATA, 0, 0, salt & 0xFFFFFFFF)
    crc = wf.crc32c(body + payload)
    padding = bytes(-len(payload) % 8)
    return struct.pack("<I", crc) + body + payload + padding


def mark(durable_lsn: int) -> bytes:
    return wf.encode_mark(durable_lsn=durable_lsn, salt=SALT)


def flip(data: bytes, offset: int, mask: int = 0xFF) -> bytes:
    out = bytearray(data)
    out[offset] ^= mask
    return bytes(out)


def put(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value) :]


def check_torn(res: wf.ScanResult, reason: str, bad_offset: int, *, records: int, damage_end: int) -> None:
    assert (res.status, res.reason) == (wf.STATUS_TORN, reason)
    assert res.bad_offset == res.end_offset == bad_offset
    assert res.damage_end == damage_end
    assert res.records == records
    assert (res.next_valid_offset, res.next_valid_lsn) == (0, 0)


def check_corrupt_record(res: wf.ScanResult, reason: str, offset: int, *, records: int) -> None:
    assert (res.status, res.reason) == (wf.STATUS_CORRUPT, reason)
    assert res.bad_offset == res.end_offset == offset
    assert res.damage_end == 0
    assert res.records == records
    assert res.header_ok


def check_bad_header(data: bytes, reason: str) -> None:
    res = wf.scan_segment(data)
    assert (res.status, res.reason) == (wf.STATUS_CORRUPT, reason)
    assert not res.header_ok
    assert res.header is None
    assert (res.bad_offset, res.end_offset, res.damage_end) == (0, 0, 0)
    assert (res.records, res.last_lsn, res.payloads) == (0, 0, [])
    with pytest.raises(wf.FormatError) as info:
        wf.decode_segment_header(data)
    assert info.value.reason == reason


def xxd_block(markdown: str) -> bytes:
    """The bytes of the first ```xxd fenced block of a markdown text."""
    match = re.search(r"^```xxd\n(.*?)^```", markdown, re.S | re.M)
    assert match, "FORMAT.md has no ```xxd block"
    out = bytearray()
    for line in match.group(1).splitlines():
        offset, rest = line.split(": ", 1)
        assert int(offset, 16) == len(out), f"offset column out of step: {line!r}"
        hexpart = rest.split("  ", 1)[0]  # the text column follows two spaces
        out += bytes.fromhex(hexpart.replace(" ", ""))
    return bytes(out)


# ---- the document, the golden file, the constants ----------------------------


def test_format_md_hex_dump_equals_the_golden_file_byte_for_byte() -> None:
    dumped = xxd_block(FORMAT_MD.read_text(encoding="utf-8"))
    assert dumped == GOLDEN.read_bytes()


def test_golden_file_is_exactly_what_the_reference_encoder_writes_for_the_example() -> None:
    expected = wf.build_segment(
        log_id=EXAMPLE_LOG_ID,
        segment_no=1,
        first_lsn=1,
        salt=EXAMPLE_SALT,
        payloads=EXAMPLE_PAYLOADS,
        prealloc_bytes=4096,
    )
    assert GOLDEN.read_bytes() == expected
    assert len(expected) == 136


def test_golden_file_decodes_to_the_two_example_records() -> None:
    res = wf.scan_segment(GOLDEN.read_bytes())
    assert res.status == wf.STATUS_OPEN
    assert res.reason == ""
    assert res.end_offset == 136
    assert (res.records, res.last_lsn) == (2, 2)
    assert res.payloads == [(1, b"hello"), (2, b"agent state v1")]
    assert res.header == wf.SegmentHeader(
        version=1,
        log_id=EXAMPLE_LOG_ID,
        segment_no=1,
        first_lsn=1,
        salt=EXAMPLE_SALT,
        prealloc_bytes=4096,
    )


def test_golden_file_with_its_zero_tail_still_decodes_to_the_two_records() -> None:
    res = wf.scan_segment(GOLDEN.read_bytes() + bytes(4096))
    assert (res.status, res.end_offset, res.records) == (wf.STATUS_OPEN, 136, 2)


def test_format_md_example_annotations_name_the_right_crcs() -> None:
    md = FORMAT_MD.read_text(encoding="utf-8")
    data = GOLDEN.read_bytes()
    header_crc = wf.crc32c(data[:60])
    crc1 = wf.crc32c(data[0x44:0x58] + b"hello")
    crc2 = wf.crc32c(data[0x64:0x78] + b"agent state v1")
    assert data[0x3C:0x40] == struct.pack("<I", header_crc)
    assert data[0x40:0x44] == struct.pack("<I", crc1)
    assert data[0x60:0x64] == struct.pack("<I", crc2)
    for crc in (header_crc, crc1, crc2):
        assert f"`0x{crc:08x}`" in md
    seal = wf.encode_seal(last_lsn=2, salt=EXAMPLE_SALT)
    assert seal.hex(" ")[:11] in md  # the CRC bytes of the example's SEAL


RULES = [
    ("H1", "short header"),
    ("H2", "bad magic"),
    ("H3", "unsupported version"),
    ("H4", "bad header crc"),
    ("H5", "bad header size"),
    ("H6", "bad header flags"),
    ("H7", "bad header fields"),
    ("R2", "truncated header"),
    ("R3", "zeroed header"),
    ("R4", "bad length"),
    ("R5", "truncated record"),
    ("R6", "bad crc"),
    ("R7", "unknown record type"),
    ("R8", "bad record flags"),
    ("R9", "wrong salt"),
    ("R10", "nonzero padding"),
    ("R11", "lsn gap"),
    ("R11", "lsn out of order"),
    ("R12", "bad seal"),
    ("R12", "bad seal lsn"),
    ("R12", "data after seal"),
]


@pytest.mark.parametrize(("rule", "reason"), RULES)
def test_format_md_states_every_rule_with_its_reason_string(rule: str, reason: str) -> None:
    md = FORMAT_MD.read_text(encoding="utf-8")
    section = md[md.index("**" + rule + "**") :]
    section = section[: section.index("\n- **", 1)] if "\n- **" in section[1:] else section
    assert f'`"{reason}"`' in section


def _format_h_defines() -> dict[str, bytes | int]:
    """The value-carrying #defines of native/format.h: strings, integers, "(16u << 20)"."""
    defines: dict[str, bytes | int] = {}
    text = FORMAT_H.read_text(encoding="utf-8")
    for name, raw in re.findall(r"^#define (WAL_\w+) ([^/\n]+)", text, re.M):
        value = raw.strip()
        shift = re.fullmatch(r"\(?(\d+)u?(?:\s*<<\s*(\d+))?\)?", value)
        if value.startswith('"'):
            defines[name] = value.strip('"').encode()
        elif value in defines:
            defines[name] = defines[value]
        elif shift:
            defines[name] = int(shift[1]) << int(shift[2] or 0)
        else:
            raise AssertionError(f"cannot read #define {name} {value}")
    return defines


def test_constants_mirror_native_format_h() -> None:
    renames = {"REC_DATA": "RECORD_DATA", "REC_SEAL": "RECORD_SEAL", "REC_MARK": "RECORD_MARK"}
    checked = 0
    for name, value in _format_h_defines().items():
        short = name.removeprefix("WAL_")
        mine = getattr(wf, renames.get(short, short))
        assert (mine.encode() if isinstance(mine, str) else mine) == value, name
        checked += 1
    assert checked >= 30
    assert wf.MAX_PAYLOAD == MiB16 == 16777216


# ---- CRC and names -----------------------------------------------------------


def test_crc32c_is_castagnoli_with_the_standard_check_value() -> None:
    assert wf.crc32c(b"123456789") == 0xE3069283
    assert wf.crc32c(b"") == 0


def test_segment_name_is_sixteen_lower_case_hex_digits_and_wal() -> None:
    assert wf.segment_name(1) == "0000000000000001.wal"
    assert wf.segment_name(0xABCDEF) == "0000000000abcdef.wal"
    assert len(wf.segment_name(2**64 - 1)) == wf.SEGMENT_NAME_LEN
    with pytest.raises(ValueError):
        wf.segment_name(-1)


def test_parse_segment_name_inverts_segment_name() -> None:
    for n in (1, 2, 0xABCDEF, 2**64 - 1):
        assert wf.parse_segment_name(wf.segment_name(n)) == n


@pytest.mark.parametrize(
    "name",
    [
        "0000000000000001.wal.tmp",
        "0000000000000001.wal.0000000000001a40.broken",
        "0000000000000001.WAL",
        "000000000000000A.wal",
        "000000000000001.wal",
        "00000000000000001.wal",
        "LOCK",
        "notes.txt",
    ],
)
def test_temp_broken_and_foreign_files_are_not_segments(name: str) -> None:
    assert wf.parse_segment_name(name) is None


def test_broken_file_name_is_segment_name_then_cut_offset_in_hex() -> None:
    assert wf.broken_name(3, 0x1A40) == "0000000000000003.wal.0000000000001a40.broken"


# ---- round trips -------------------------------------------------------------


def test_segment_header_round_trips() -> None:
    data = wf.encode_segment_header(
        log_id=LOG_ID, segment_no=7, first_lsn=1000, salt=SALT, prealloc_bytes=64 << 20
    )
    assert len(data) == wf.SEGMENT_HEADER_SIZE
    assert wf.decode_segment_header(data) == wf.SegmentHeader(
        version=1, log_id=LOG_ID, segment_no=7, first_lsn=1000, salt=SALT, prealloc_bytes=64 << 20
    )


def test_records_are_padded_to_a_multiple_of_8_with_zeros() -> None:
    for n in range(20):
        rec = record(1, b"x" * n)
        assert len(rec) == wf.record_size(n) == 24 + (n + 7) // 8 * 8
        assert rec[24 + n :] == bytes(len(rec) - 24 - n)


def test_record_crc_covers_header_bytes_4_to_23_and_the_payload_but_not_padding() -> None:
    rec = record(5, b"abc")
    (crc,) = struct.unpack_from("<I", rec)
    assert crc == wf.crc32c(rec[4:24] + b"abc")
    # The padding is not covered: changing it keeps the CRC valid (R10 catches it).
    data = header() + record(1, b"a") + put(rec, 24 + 3, b"\x01")
    assert wf.scan_segment(data).reason == "nonzero padding"


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=100), max_size=12),
    first_lsn=st.integers(min_value=1, max_value=wf.MAX_NUMBER - 20),
    sealed=st.booleans(),
    zero_tail=st.integers(min_value=0, max_value=100),
)
def test_any_payloads_round_trip_through_a_segment(
    payloads: list[bytes], first_lsn: int, sealed: bool, zero_tail: int
) -> None:
    data = segment(payloads, first_lsn=first_lsn, sealed=sealed, zero_tail=zero_tail)
    res = wf.scan_segment(data)
    assert res.status == (wf.STATUS_SEALED if sealed else wf.STATUS_OPEN)
    assert res.reason == ""
    assert res.payloads == [(first_lsn + i, p) for i, p in enumerate(payloads)]
    assert res.records == len(payloads)
    assert res.last_lsn == first_lsn + len(payloads) - 1
    assert res.end_offset == len(data) - zero_tail
    assert (res.bad_offset, res.damage_end, res.next_valid_offset) == (0, 0, 0)


def test_empty_segment_is_open_with_last_lsn_one_before_its_first_lsn() -> None:
    res = wf.scan_segment(segment([], first_lsn=42))
    assert (res.status, res.end_offset, res.records, res.last_lsn) == (wf.STATUS_OPEN, H, 0, 41)


def test_sealed_empty_segment_carries_first_lsn_minus_one_in_its_seal() -> None:
    data = segment([], first_lsn=42, sealed=True)
    assert struct.unpack_from("<Q", data, H + wf.RH_LSN)[0] == 41
    res = wf.scan_segment(data)
    assert (res.status, res.end_offset, res.last_lsn) == (wf.STATUS_SEALED, H + 24, 41)


@pytest.mark.parametrize("tail", [1, 7, 8, 23, 24, 25, 4096])
def test_zero_filled_tail_is_open(tail: int) -> None:
    data = segment([b"one", b"two"], zero_tail=tail)
    res = wf.scan_segment(data)
    assert (res.status, res.reason) == (wf.STATUS_OPEN, "")
    assert res.end_offset == len(data) - tail
    assert res.records == 2


def test_encoder_refuses_a_payload_over_16_mib_as_the_writer_does() -> None:
    with pytest.raises(ValueError):
        wf.encode_record(lsn=1, payload=bytes(MiB16 + 1), salt=SALT)


# ---- header rules H1..H7 -----------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 63])
def test_h1_a_file_shorter_than_64_bytes_is_corrupt_short_header(size: int) -> None:
    check_bad_header(header()[:size], "short header")


def test_h2_wrong_magic_is_corrupt_bad_magic() -> None:
    check_bad_header(put(header(), 0, b"AGWALSEX") + record(1), "bad magic")


def test_h3_another_version_is_unsupported_version_even_before_the_crc_check() -> None:
    check_bad_header(header(version=2) + record(1), "unsupported version")
    check_bad_header(header(version=0), "unsupported version")
    # A newer version may checksum differently: its CRC is not even looked at.
    check_bad_header(flip(header(version=2), 60), "unsupported version")


@pytest.mark.parametrize("offset", [12, 16, 24, 32, 40, 48, 56, 60, 63])
def test_h4_any_damaged_header_byte_is_corrupt_bad_header_crc(offset: int) -> None:
    check_bad_header(flip(header(), offset, 0x01) + record(1), "bad header crc")


def test_h5_header_size_other_than_64_is_corrupt_bad_header_size() -> None:
    check_bad_header(header(header_size=128), "bad header size")


@pytest.mark.parametrize("field", ["flags", "reserved"])
def test_h6_nonzero_header_flags_or_reserved_is_corrupt_bad_header_flags(field: str) -> None:
    check_bad_header(header(**{field: 1}), "bad header flags")


@pytest.mark.parametrize("field", ["segment_no", "first_lsn", "salt"])
def test_h7_zero_segment_number_first_lsn_or_salt_is_corrupt_bad_header_fields(
    field: str,
) -> None:
    check_bad_header(header(**{field: 0}), "bad header fields")


def test_header_rules_apply_in_order_h1_to_h7() -> None:
    # Version and CRC both bad: H3 first. CRC and size both bad: H4 first.
    check_bad_header(flip(header(version=9), 60), "unsupported version")
    check_bad_header(flip(header(header_size=32), 60), "bad header crc")
    check_bad_header(header(header_size=32, flags=1, salt=0), "bad header size")
    check_bad_header(header(flags=1, salt=0), "bad header flags")


# ---- record rules R1..R12 ----------------------------------------------------


def test_r1_records_ending_exactly_at_end_of_file_are_open() -> None:
    data = segment([b"a", b"bb", b"ccc"])
    res = wf.scan_segment(data)
    assert (res.status, res.reason, res.end_offset) == (wf.STATUS_OPEN, "", len(data))
    assert (res.bad_offset, res.damage_end) == (0, 0)


def test_r2_fewer_than_24_zero_bytes_after_the_last_record_are_open() -> None:
    data = segment([b"a"], zero_tail=16)
    res = wf.scan_segment(data)
    assert (res.status, res.end_offset) == (wf.STATUS_OPEN, len(data) - 16)


def test_r2_fewer_than_24_nonzero_bytes_after_the_last_record_are_a_torn_truncated_header() -> None:
    good = segment([b"a"])
    data = good + b"\x11\x22\x33" + bytes(13)
    res = wf.scan_segment(data)
    check_torn(res, "truncated header", len(good), records=1, damage_end=len(good) + 3)


def test_r3_zeroed_record_header_then_garbage_is_a_torn_zeroed_header() -> None:
    good = segment([b"a"])
    data = good + bytes(24) + b"garbage!" + bytes(8)
    res = wf.scan_segment(data)
    check_torn(res, "zeroed header", len(good), records=1, damage_end=len(good) + 32)


def test_r3_zeroed_record_header_followed_by_a_vouching_mark_is_corruption() -> None:
    good = segment([b"a"])
    after = mark(2) + record(3)
    data = good + bytes(32) + after
    res = wf.scan_segment(data)
    assert (res.status, res.reason) == (wf.STATUS_CORRUPT, "zeroed header")
    assert res.bad_offset == res.end_offset == len(good)
    assert (res.next_valid_offset, res.next_valid_lsn) == (len(good) + 32, 2)
    assert res.damage_end == 0
    assert res.payloads == [(1, b"a")]


def test_t_zeroed_record_header_followed_by_valid_records_but_no_vouching_mark_is_torn() -> None:
    # A power cut during an fdatasync: the batch's first sector lost, a later one kept.
    good = segment([b"a"])
    data = good + bytes(32) + record(3)
    res = wf.scan_segment(data)
    assert (res.status, res.reason) == (wf.STATUS_TORN, "zeroed header")
    assert (res.next_valid_offset, res.next_valid_lsn) == (len(good) + 32, 3)
    assert res.damage_end == len(data.rstrip(b"\0"))  # up to the last non-zero byte
    assert res.payloads == [(1, b"a")]


def test_r4_length_field_over_16_mib_is_a_torn_candidate_bad_length() -> None:
    good = segment([b"a"])
    bad = put(record(2), wf.RH_LENGTH, struct.pack("<I", MiB16 + 1))
    res = wf.scan_segment(good + bad)
    # damage_end: one past the last payload byte (the padding byte is zero)
    check_torn(res, "bad length", len(good), records=1, damage_end=len(good) + 24 + 7)


def test_r4_bad_length_is_checked_before_the_record_is_found_truncated() -> None:
    good = segment([b"a"])
    bad = put(record(2), wf.RH_LENGTH, b"\xff\xff\xff\xff")[:24]
    assert wf.scan_segment(good + bad).reason == "bad length"


def test_r5_record_running_past_end_of_file_is_a_torn_truncated_record() -> None:
    good = segment([b"a"])
    cut = record(2, b"x" * 40)[:50]
    res = wf.scan_segment(good + cut)
    check_torn(res, "truncated record", len(good), records=1, damage_end=len(good) + 50)


def test_r5_missing_padding_counts_as_a_truncated_record() -> None:
    good = segment([b"a"])
    res = wf.scan_segment(good + record(2, b"12345")[:29])  # payload whole, padding cut
    assert (res.status, res.reason) == (wf.STATUS_TORN, "truncated record")


def test_bad_crc_in_last_record_is_a_torn_tail() -> None:
    # R6
    good = segment([b"a", b"b"])
    bad = flip(record(3, b"last"), 24)
    res = wf.scan_segment(good + bad + bytes(100))
    check_torn(res, "bad crc", len(good), records=2, damage_end=len(good) + 28)
    assert res.payloads == [(1, b"a"), (2, b"b")]


def test_r6_bad_crc_followed_by_a_mark_vouching_for_it_is_corruption() -> None:
    good = segment([b"a"])
    bad = flip(record(2, b"middle"), 28)  # a payload byte
    data = good + bad + mark(2) + record(3, b"after")
    res = wf.scan_segment(data)
    assert (res.status, res.reason) == (wf.STATUS_CORRUPT, "bad crc")
    assert res.bad_offset == res.end_offset == len(good)
    assert (res.next_valid_offset, res.next_valid_lsn) == (len(good) + len(bad), 2)
    assert res.damage_end == 0
    assert res.payloads == [(1, b"a")]


def test_t_bad_crc_followed_by_a_mark_that_does_not_reach_it_is_torn() -> None:
    good = segment([b"a"])
    bad = flip(record(2, b"middle"), 28)
    data = good + bad + mark(1) + record(3, b"after")
    res = wf.scan_segment(data)
    assert (res.status, res.reason, res.damage_end) == (wf.STATUS_TORN, "bad crc", len(data.rstrip(b"\0")))
    assert res.next_valid_lsn == 1


def test_t_bad_crc_followed_by_a_seal_alone_is_torn() -> None:
    good = segment([b"a"])
    data = good + flip(record(2), 0) + wf.encode_seal(last_lsn=2, salt=SALT)
    res = wf.scan_segment(data)
    assert (res.status, res.reason, res.next_valid_lsn) == (wf.STATUS_TORN, "bad crc", 2)


def test_r7_unknown_record_type_with_a_valid_crc_is_corruption() -> None:
    good = segment([b"a"])
    res = wf.scan_segment(good + record(2, rtype=9) + record(3))
    check_corrupt_record(res, "unknown record type", len(good), records=1)


def test_r13_mark_with_a_payload_is_corruption() -> None:
    good = segment([b"a"])
    res = wf.scan_segment(good + record(1, b"x", rtype=wf.RECORD_MARK) + record(2))
    check_corrupt_record(res, "bad mark", len(good), records=1)


def test_r13_mark_vouching_for_a_record_not_yet_written_is_corruption() -> None:
    good = segment([b"a"])
    res = wf.scan_segment(good + mark(2) + record(2))
    check_corrupt_record(res, "bad mark lsn", len(good), records=1)


def test_r13_marks_are_skipped_and_consume_no_lsn() -> None:
    data = segment([b"a"]) + mark(1) + record(2, b"b") + mark(2) + record(3, b"c")
    res = wf.scan_segment(data)
    assert (res.status, res.records, res.last_lsn) == (wf.STATUS_OPEN, 3, 3)
    assert res.payloads == [(1, b"a"), (2, b"b"), (3, b"c")]


@pytest.mark.parametrize(("knob", "value"), [("flags", 1), ("flags", 0x80), ("reserved", 1)])
def test_r8_nonzero_record_flags_or_reserved_with_a_valid_crc_is_corruption(knob: str, value: int) -> None:
    good = segment([b"a"])
    res = wf.scan_segment(good + record(2, b"payload", **{knob: value}))
    check_corrupt_record(res, "bad record flags", len(good), records=1)


def test_r9_record_carrying_another_segments_salt_is_corruption() -> None:
    good = segment([b"a"])
    stale = wf.encode_record(lsn=2, payload=b"stale", salt=OTHER_SALT)
    res = wf.scan_segment(good + stale)
    check_corrupt_record(res, "wrong salt", len(good), records=1)


def test_r10_nonzero_padding_is_corruption_although_the_crc_is_valid() -> None:
    good = segment([b"a"])
    rec = put(record(2, b"abc"), 24 + 7, b"\x01")  # last padding byte
    res = wf.scan_segment(good + rec)
    check_corrupt_record(res, "nonzero padding", len(good), records=1)


def test_r11_lsn_above_the_expected_one_is_corruption_lsn_gap() -> None:
    good = segment([b"a", b"b"])
    res = wf.scan_segment(good + record(4))
    check_corrupt_record(res, "lsn gap", len(good), records=2)
    assert res.last_lsn == 2


def test_r11_repeated_lsn_is_corruption_lsn_out_of_order() -> None:
    good = segment([b"a", b"b"])
    res = wf.scan_segment(good + record(2))
    check_corrupt_record(res, "lsn out of order", len(good), records=2)


def test_r11_first_record_must_carry_the_headers_first_lsn() -> None:
    base = wf.build_segment(log_id=LOG_ID, segment_no=1, first_lsn=10, salt=SALT, payloads=[])
    assert wf.scan_segment(base + record(11)).reason == "lsn gap"
    assert wf.scan_segment(base + record(9)).reason == "lsn out of order"
    res = wf.scan_segment(base + record(9))
    assert (res.records, res.last_lsn) == (0, 9)


def test_r12_seal_ends_the_segment_as_sealed() -> None:
    data = segment([b"a", b"b"], sealed=True, zero_tail=100)
    res = wf.scan_segment(data)
    assert (res.status, res.reason) == (wf.STATUS_SEALED, "")
    assert res.end_offset == len(data) - 100
    assert (res.bad_offset, res.damage_end, res.records, res.last_lsn) == (0, 0, 2, 2)


def test_r12_seal_with_a_payload_is_corruption_bad_seal() -> None:
    good = segment([b"a"])
    seal = record(1, b"x", rtype=wf.RECORD_SEAL)
    res = wf.scan_segment(good + seal)
    check_corrupt_record(res, "bad seal", len(good), records=1)


@pytest.mark.parametrize("lsn", [0, 2, 3])
def test_r12_seal_not_naming_the_last_data_lsn_is_corruption_bad_seal_lsn(lsn: int) -> None:
    good = segment([b"a"])
    res = wf.scan_segment(good + wf.encode_seal(last_lsn=lsn, salt=SALT))
    check_corrupt_record(res, "bad seal lsn", len(good), records=1)


def test_r12_anything_but_zeros_after_the_seal_is_corruption_data_after_seal() -> None:
    sealed = segment([b"a"], sealed=True)
    for extra in (record(2), b"\x01", bytes(500) + b"\x01"):
        res = wf.scan_segment(sealed + extra)
        assert (res.status, res.reason) == (wf.STATUS_CORRUPT, "data after seal")
        assert res.bad_offset == res.end_offset == len(sealed)
        assert (res.records, res.last_lsn, res.damage_end) == (1, 1, 0)


# ---- torn candidates ---------------------------------------------------------


def test_torn_tail_damage_ends_one_past_its_last_nonzero_byte() -> None:
    good = segment([b"a"])
    data = good + b"\x00\x07" + bytes(30) + b"\x09" + bytes(1000)
    res = wf.scan_segment(data)
    check_torn(res, "bad crc", len(good), records=1, damage_end=len(good) + 33)


def test_stale_record_with_another_salt_after_damage_is_still_a_torn_tail() -> None:
    good = segment([b"a"])
    bad = flip(record(2), 0)
    stale = wf.encode_record(lsn=3, payload=b"old", salt=OTHER_SALT)
    res = wf.scan_segment(good + bad + stale)
    end_of_stale_payload = len(good + bad) + 24 + len(b"old")
    check_torn(res, "bad crc", len(good), records=1, damage_end=end_of_stale_payload)


def test_a_record_after_damage_counts_only_if_it_is_whole() -> None:
    good = segment([b"a"])
    bad = flip(record(2), 0)
    res = wf.scan_segment(good + bad + record(3, b"x" * 16)[:-1])
    assert (res.status, res.reason) == (wf.STATUS_TORN, "bad crc")


def test_the_search_after_damage_looks_only_at_8_aligned_offsets() -> None:
    good = segment([b"a"])
    bad = flip(record(2), 0)
    misaligned = b"\x01\x02\x03\x04" + mark(2) + b"\x05\x06\x07\x08"
    res = wf.scan_segment(good + bad + misaligned)
    assert (res.status, res.reason, res.next_valid_offset) == (wf.STATUS_TORN, "bad crc", 0)
    aligned = wf.scan_segment(good + bad + bytes(8) + mark(2))
    assert (aligned.status, aligned.next_valid_offset) == (
        wf.STATUS_CORRUPT,
        len(good + bad) + 8,
    )


def test_the_search_after_damage_reports_the_first_valid_record() -> None:
    good = segment([b"a"])
    data = good + flip(record(2), 0) + record(3, b"three") + record(4, b"four")
    res = wf.scan_segment(data)
    assert (res.next_valid_offset, res.next_valid_lsn) == (len(good) + 32, 3)


def test_only_a_mark_reaching_the_damaged_lsn_proves_corruption() -> None:
    good = segment([b"a"])
    damaged = good + flip(record(2), 0)
    assert wf.scan_segment(damaged + record(77)).status == wf.STATUS_TORN
    assert wf.scan_segment(damaged + mark(1) + record(3)).status == wf.STATUS_TORN
    assert wf.scan_segment(damaged + record(3) + mark(2)).status == wf.STATUS_CORRUPT
    assert wf.scan_segment(damaged + mark(5)).status == wf.STATUS_CORRUPT


# ---- crash shapes ------------------------------------------------------------


def test_truncating_the_last_record_anywhere_leaves_a_torn_tail_and_the_first_two_records() -> None:
    data = segment([b"first", b"second", b"third record"])
    start = len(segment([b"first", b"second"]))
    assert data[start] != 0  # the last record's CRC starts non-zero: no cut leaves only zeros
    for cut in range(start, len(data)):
        res = wf.scan_segment(data[:cut])
        assert res.payloads == [(1, b"first"), (2, b"second")], cut
        assert (res.records, res.last_lsn) == (2, 2)
        if cut == start:  # exactly at a record boundary
            assert (res.status, res.end_offset) == (wf.STATUS_OPEN, start)
            continue
        reason = "truncated header" if cut - start < 24 else "truncated record"
        assert (res.status, res.reason) == (wf.STATUS_TORN, reason), cut
        assert res.bad_offset == res.end_offset == start
        assert start < res.damage_end <= cut
    assert wf.scan_segment(data).status == wf.STATUS_OPEN


def test_no_single_byte_change_anywhere_in_a_segment_yields_wrong_data() -> None:
    payloads = [b"alpha", b"bravo-charlie", b""]
    originals = [(i + 1, p) for i, p in enumerate(payloads)]
    data = segment(payloads, sealed=True)
    for offset in range(len(data)):
        for mask in range(1, 256):
            res = wf.scan_segment(flip(data, offset, mask))
            if res.status == wf.STATUS_CORRUPT:
                continue
            assert res.payloads == originals[: len(res.payloads)], (offset, mask)
            # A damaged segment is never taken for a whole, sealed one.
            assert res.status != wf.STATUS_SEALED or res.payloads == originals


def test_a_record_of_exactly_16_mib_decodes() -> None:
    payload = bytes(range(256)) * (MiB16 // 256)
    assert len(payload) == MiB16
    data = segment([b"a", payload, b"z"], sealed=True)
    res = wf.scan_segment(data)
    assert res.status == wf.STATUS_SEALED
    assert res.payloads == [(1, b"a"), (2, payload), (3, b"z")]


def test_a_record_of_16_mib_plus_one_with_a_valid_crc_is_a_torn_candidate_bad_length() -> None:
    good = segment([b"a"])
    payload = b"\x01" * (MiB16 + 1)
    oversize = raw_record(length=len(payload), lsn=2, payload=payload)
    assert struct.unpack_from("<I", oversize)[0] == wf.crc32c(oversize[4 : 24 + len(payload)])
    res = wf.scan_segment(good + oversize)
    check_torn(res, "bad length", len(good), records=1, damage_end=len(good) + 24 + MiB16 + 1)


# ---- arbitrary input ---------------------------------------------------------


def _check_consistent(res: wf.ScanResult, size: int) -> None:
    assert res.status in wf.STATUS_CODES
    assert (res.reason == "") == (res.status in (wf.STATUS_OPEN, wf.STATUS_SEALED))
    assert 0 <= res.end_offset <= size
    assert res.records == len(res.payloads)
    if res.status in (wf.STATUS_OPEN, wf.STATUS_SEALED):
        assert res.bad_offset == 0
    if res.status != wf.STATUS_TORN:
        assert res.damage_end == 0
    else:
        assert res.bad_offset <= res.damage_end <= size


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_scan_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    _check_consistent(wf.scan_segment(data), len(data))


@settings(max_examples=300, deadline=None)
@given(tail=st.binary(max_size=300), n=st.integers(min_value=0, max_value=3))
def test_garbage_after_valid_records_never_hides_or_alters_them(tail: bytes, n: int) -> None:
    payloads = [b"p%d" % i for i in range(n)]
    data = segment(payloads) + tail
    res = wf.scan_segment(data)
    _check_consistent(res, len(data))
    assert res.payloads == [(i + 1, p) for i, p in enumerate(payloads)]
