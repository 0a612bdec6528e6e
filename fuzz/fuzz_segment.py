"""Fuzz target: the C segment scanner against the pure-Python reference decoder.

For every input, the segment image it stands for is scanned by ``lib.wal_scan_segment``
(native/reader.c) and by ``wal.log.format.scan_segment`` (the executable form of FORMAT.md);
every field of the two results must agree -- status, reason, end_offset, bad_offset,
damage_end, records, last_lsn, next_valid_offset, next_valid_lsn, header_ok and the header
fields -- and ``lib.wal_segment_records`` must yield exactly the reference decoder's
(lsn, payload) list, in batches of several sizes and from several start LSNs.

The image is placed so that it ends right at a PROT_NONE guard page, so a read past its
end faults even in the plain build; under the ASan/UBSan build (build_asan.sh) any other
memory error or undefined behaviour in the C reader aborts too.

The first input byte chooses how the rest becomes a segment image:

    b % 4 == 0  raw: the rest is the image
    b % 4 == 1  checksum fix-up: the rest is the image, then the header CRC and the record
                CRCs along the chain are recomputed (except record (b >> 2) - 1, if any),
                so byte-level mutations reach the rules behind the CRC checks
    b % 4 == 2  structure-aware: a valid segment built with wal.log.format's encoders from
                choices read from the rest, then 0..7 damage operations (_common.mutate)
    b % 4 == 3  as 2, then the header CRC is recomputed (header damage reaches H5..H7)

Run under libFuzzer: ``fuzz/run.sh`` (ASan build), or directly
``python fuzz/fuzz_segment.py [libFuzzer flags] [corpus dirs]``. Without atheris,
``test_one_input`` is a plain function (tests/test_fuzz_smoke.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import U64_MAX, Finding, Input, fix_checksums, guarded, mutate, plan_segment, tolerated

from wal._bindings import ffi, lib
from wal.log import format as wf

STATUS_NAMES = {lib.WAL_SCAN_OPEN: wf.STATUS_OPEN, lib.WAL_SCAN_SEALED: wf.STATUS_SEALED,
                lib.WAL_SCAN_TORN: wf.STATUS_TORN, lib.WAL_SCAN_CORRUPT: wf.STATUS_CORRUPT}
MAX_IMAGE = 1 << 16  # structure-aware images are cut here: keeps every execution fast
_HEADER_FIELDS = ("version", "log_id", "segment_no", "first_lsn", "salt", "prealloc_bytes")


def image_from_input(data: bytes) -> bytes:
    """The segment image an input stands for (see the module docstring)."""
    if not data:
        return b""
    mode = data[0] & 3
    if mode == 0:
        return data[1:]
    if mode == 1:
        image = bytearray(data[1:])
        fix_checksums(image, skip_record=(data[0] >> 2) - 1)
        return bytes(image)
    inp = Input(data[1:])
    seg = plan_segment(inp, log_id=inp.u64(), segment_no=inp.u64() or 1, first_lsn=inp.small_lsn(),
                       sealed=inp.chance(1, 3))
    for _ in range(inp.below(8)):
        mutate(seg, inp)
    image = seg.data
    if mode == 3:
        fix_checksums(image, records=False)
    return bytes(image[:MAX_IMAGE])


def c_scan(image: bytes) -> tuple[dict[str, object], tuple[Any, int, Any]]:
    """Scan image with the C reader; returns (result fields, (data pointer, buffer index, raw result))."""
    buf = guarded(len(image))
    addr, start = buf.place(image)
    ptr = ffi.cast("uint8_t *", addr)
    res = ffi.new("wal_scan_result *")
    status = lib.wal_scan_segment(ptr, len(image), res)
    if status != res.status:
        raise Finding(f"wal_scan_segment returned {status} but res->status is {res.status}")
    if res.status not in STATUS_NAMES:
        raise Finding(f"unknown scan status {res.status}")
    h = res.header
    fields: dict[str, object] = {
        "status": STATUS_NAMES[res.status],
        "reason": ffi.string(res.reason).decode(),
        "end_offset": res.end_offset,
        "bad_offset": res.bad_offset,
        "damage_end": res.damage_end,
        "records": res.records,
        "last_lsn": res.last_lsn,
        "next_valid_offset": res.next_valid_offset,
        "next_valid_lsn": res.next_valid_lsn,
        "header_ok": bool(res.header_ok),
        "header": tuple(int(getattr(h, name)) for name in _HEADER_FIELDS),
    }
    return fields, (ptr, start, res)


def c_records(image: bytes, raw: tuple[Any, int, Any], from_lsn: int, cap: int) -> list[tuple[int, bytes]]:
    """Every DATA record wal_segment_records yields up to the scan's end_offset, cap at a time."""
    ptr, start, res = raw
    end = res.end_offset
    if end > len(image):
        raise Finding(f"end_offset {end} is past the end of the {len(image)}-byte image")
    lsns = ffi.new("uint64_t[]", cap)
    offs = ffi.new("uint64_t[]", cap)
    lens = ffi.new("uint32_t[]", cap)
    cursor = ffi.new("uint64_t *")
    out: list[tuple[int, bytes]] = []
    buf = guarded(len(image))
    for _ in range(len(image) + 2):  # each batch makes progress or ends the loop
        n = lib.wal_segment_records(ptr, end, from_lsn, cursor, cap, lsns, offs, lens)
        if n > cap:
            raise Finding(f"wal_segment_records returned {n} records for a batch of {cap}")
        if n == 0:
            return out
        for k in range(n):
            off, length = int(offs[k]), int(lens[k])
            if off + length > end:
                raise Finding(f"wal_segment_records yielded a payload [{off}, {off + length}) past end_offset {end}")
            out.append((int(lsns[k]), buf.read(start + off, length)))
    raise Finding("wal_segment_records did not terminate")


def expected_fields(ref: wf.ScanResult) -> dict[str, object]:
    header = tuple(getattr(ref.header, name) for name in _HEADER_FIELDS) if ref.header is not None else (0,) * 6
    return {
        "status": ref.status,
        "reason": ref.reason,
        "end_offset": ref.end_offset,
        "bad_offset": ref.bad_offset,
        "damage_end": ref.damage_end,
        "records": ref.records,
        "last_lsn": ref.last_lsn,
        "next_valid_offset": ref.next_valid_offset,
        "next_valid_lsn": ref.next_valid_lsn,
        "header_ok": ref.header_ok,
        "header": header,
    }


def check_image(image: bytes) -> wf.ScanResult:
    """Scan image with both readers and raise Finding on any difference. Returns the reference result."""
    ref = wf.scan_segment(image)
    got, raw = c_scan(image)
    want = expected_fields(ref)
    diffs = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    if diffs and tolerated("lsn-wrap") and _lsn_wraps(ref, got):
        return ref
    if diffs:
        lines = "\n".join(f"  {k}: C {c!r} != reference {p!r}" for k, (c, p) in diffs.items())
        raise Finding(f"C scan differs from the reference decoder on a {len(image)}-byte image:\n{lines}\n"
                      f"  reference: {ref.status} {ref.reason!r} end_offset={ref.end_offset}")
    first = ref.header.first_lsn if ref.header is not None else 1
    # Batches of 1, 3 and 1024 from the start; then other start LSNs (a read from the middle).
    calls = [(0, 1), (0, 3), (0, 1024)]
    calls += [(lsn & 0xFFFFFFFFFFFFFFFF, 1024) for lsn in (first, ref.last_lsn, (first + ref.last_lsn) // 2 + 1)]
    for from_lsn, cap in calls:
        records = c_records(image, raw, from_lsn, cap)
        expected = [(lsn, p) for lsn, p in ref.payloads if lsn >= from_lsn]
        if records != expected:
            raise Finding(f"wal_segment_records(from_lsn={from_lsn}, cap={cap}) yielded "
                          f"{[(lsn, len(p)) for lsn, p in records]}, the reference decoder "
                          f"{[(lsn, len(p)) for lsn, p in expected]} (lsn, payload length)")
    return ref


def _lsn_wraps(ref: wf.ScanResult, got: dict[str, object]) -> bool:
    """Open finding F1: the segment's DATA LSNs reach 2**64-1 (the C reader then wraps to 0)."""
    if ref.header is None:
        return False
    c_records = got["records"]
    assert isinstance(c_records, int)
    return ref.last_lsn == U64_MAX or ref.header.first_lsn + max(ref.records, c_records) - 1 > U64_MAX


def run_one(data: bytes) -> tuple[str, ...]:
    """Check one input; returns a short signature of what it exercised (for corpus selection)."""
    image = image_from_input(data)
    ref = check_image(image)
    return (f"mode{data[0] & 3 if data else 0}", ref.status, ref.reason, "records" if ref.records else "none")


def test_one_input(data: bytes) -> None:
    run_one(data)


if __name__ == "__main__":
    from _common import run_atheris

    run_atheris(test_one_input)
