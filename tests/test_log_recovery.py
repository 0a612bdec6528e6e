"""Opening a log after a crash or damage, through `wal.Log.open` on real files (README, "Failure policy").

* a torn tail of the last segment (a truncated last record, garbage after the
  last record, a zeroed part of the last record) is cut, the cut bytes are kept
  in a ``.broken`` file, ``recovery_report.torn_tail`` says so, appends go on
  with the next LSN, and a second open finds nothing to do;
* damage anywhere else is `CorruptionError` naming file, offset and LSN, and
  nothing is changed; ``recovery="truncate"`` opens at the last good record,
  reports the lost LSN range and sets the rest aside;
* a missing segment, a newer format version, leftover temp files.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import os
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

import wal
import wal.log.format as wf
from wal.log import recovery
from wal.log.recovery import list_segments

SMALL = 8192
H = wf.SEGMENT_HEADER_SIZE


def payload(i: int, size: int = 100) -> bytes:
    head = f"<payload {i:05d}>".encode()
    return (head * (size // len(head) + 1))[:size]


def make_log(d: Path, n: int, *, segment_bytes: int = 1 << 20, size: int = 100) -> list[tuple[int, bytes]]:
    records = [(i, payload(i, size)) for i in range(1, n + 1)]
    with wal.Log.open(d, segment_bytes=segment_bytes) as log:
        for _, p in records:
            log.append(p)
    return records


def segments(d: Path) -> list[Path]:
    return [Path(p) for _, p in list_segments(str(d))]


def record_offsets(path: Path) -> list[tuple[int, int, int]]:
    """(lsn, offset, size) of every DATA record of a segment file (MARK and SEAL records skipped)."""
    data = path.read_bytes()
    end = wf.scan_segment(data).end_offset
    out, off = [], H
    while off < end:
        length, lsn, rtype = struct.unpack_from("<IQB", data, off + wf.RH_LENGTH)
        size = wf.record_size(length)
        if rtype == wf.RECORD_DATA:
            out.append((lsn, off, size))
        off += size
    return out


def read_all(d: Path) -> list[tuple[int, bytes]]:
    with wal.Log.open(d) as log:
        return list(log.read())


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "LOCK"}


def flip(path: Path, offset: int, mask: int = 0x20) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def write_at(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# ---- torn tails ----------------------------------------------------------------


def torn_zero_after_cut(seg: Path, off: int, size: int) -> bytes:
    """Only the first part of the last record reached the preallocated (zero) file."""
    data = seg.read_bytes()
    write_at(seg, off + 30, bytes(size - 30))
    return data[off : off + 30].rstrip(b"\0")


def torn_zeroed_middle(seg: Path, off: int, size: int) -> bytes:
    """A zeroed range inside the last record's payload (a lost page)."""
    data = bytearray(seg.read_bytes())
    write_at(seg, off + 40, bytes(20))
    data[off + 40 : off + 60] = bytes(20)
    return bytes(data[off : off + size]).rstrip(b"\0")


TORN_SHAPES = {
    "cut-in-zero-filled-file": torn_zero_after_cut,
    "zeroed-part": torn_zeroed_middle,
}


@pytest.mark.parametrize("shape", TORN_SHAPES)
def test_torn_last_record_is_cut_kept_as_broken_and_appends_continue_with_its_lsn(
    tmp_path: Path, shape: str
) -> None:
    records = make_log(tmp_path, 5)
    seg = segments(tmp_path)[-1]
    lsn, off, size = record_offsets(seg)[-1]
    assert lsn == 5
    cut = TORN_SHAPES[shape](seg, off, size)
    with wal.Log.open(tmp_path) as log:
        report = log.recovery_report
        assert report.torn_tail == (str(seg), off, len(cut))
        assert report.last_lsn == 4
        assert report.lost_lsns is None
        broken = Path(f"{seg}.{off:016x}.broken")
        assert report.broken_files == (str(broken),)
        assert broken.read_bytes() == cut
        assert log.stats()["torn_tail"] == report.torn_tail
        assert list(log.read()) == records[:4]
        assert log.append(b"after the cut") == 5
    # a second open is clean and sees the new record
    with wal.Log.open(tmp_path) as log:
        assert log.recovery_report.torn_tail is None
        assert log.recovery_report.broken_files == ()
        assert list(log.read()) == [*records[:4], (5, b"after the cut")]
        assert log.append(b"six") == 6
    assert broken.read_bytes() == cut


@pytest.mark.parametrize("where", ["mid-record", "record-boundary"])
def test_a_newest_segment_shorter_than_its_preallocated_size_is_corruption_not_a_torn_tail(
    tmp_path: Path, where: str
) -> None:
    """S6: a segment's size is durable before it is named and never shrinks, so no crash makes it
    shorter; a cut file lost records that were durable, even when it ends on a record boundary."""
    records = make_log(tmp_path, 5)
    seg = segments(tmp_path)[-1]
    _, off, size = record_offsets(seg)[-1]
    os.truncate(seg, off + size // 2 if where == "mid-record" else off)
    before = snapshot(tmp_path)
    with pytest.raises(wal.CorruptionError, match="segment truncated") as exc:
        wal.Log.open(tmp_path)
    assert exc.value.reason == "segment truncated" and exc.value.lsn == 5
    assert snapshot(tmp_path) == before  # nothing changed
    with wal.Log.open(tmp_path, recovery="truncate") as log:
        assert log.recovery_report.lost_lsns is not None and log.recovery_report.lost_lsns[0] == 5
        assert list(log.read()) == records[:4]
        assert log.append(b"after") == 5


def test_garbage_after_the_last_record_is_cut_and_kept_and_no_record_is_lost(tmp_path: Path) -> None:
    records = make_log(tmp_path, 5)
    seg = segments(tmp_path)[-1]
    _, off, size = record_offsets(seg)[-1]
    junk = b"\x17garbage from a torn write\xff" * 3
    write_at(seg, off + size, junk)
    with wal.Log.open(tmp_path) as log:
        assert log.recovery_report.torn_tail == (str(seg), off + size, len(junk))
        assert Path(f"{seg}.{off + size:016x}.broken").read_bytes() == junk
        assert list(log.read()) == records
        assert log.append(b"six") == 6
    with wal.Log.open(tmp_path) as log:
        assert log.recovery_report.torn_tail is None
        assert list(log.read()) == [*records, (6, b"six")]


def test_garbage_appended_past_the_end_of_a_full_segment_file_is_cut(tmp_path: Path) -> None:
    records = make_log(tmp_path, 3, segment_bytes=SMALL)
    seg = segments(tmp_path)[-1]
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\x01" * 13)
    with wal.Log.open(tmp_path) as log:
        assert log.recovery_report.torn_tail is not None
        assert log.recovery_report.torn_tail[0] == str(seg)
        assert list(log.read()) == records
        assert log.append(b"four") == 4
    assert read_all(tmp_path) == [*records, (4, b"four")]
    assert seg.stat().st_size >= size


def test_torn_tail_in_a_log_of_many_segments_touches_only_the_last(tmp_path: Path) -> None:
    records = make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    assert len(segs) > 2
    before = {p.name: p.read_bytes() for p in segs[:-1]}
    lsn, off, _ = record_offsets(segs[-1])[-1]
    write_at(segs[-1], off + 10, b"\xee" * 8)
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        assert log.recovery_report.torn_tail is not None
        assert list(log.read()) == records[:-1]
        assert log.append(b"again") == lsn
    assert {p.name: p.read_bytes() for p in segs[:-1]} == before


def test_damage_inside_the_last_unsynced_batch_is_a_torn_tail_even_with_valid_records_after_it(
    tmp_path: Path,
) -> None:
    """A power cut during the batch's fdatasync may keep a later sector and lose an earlier one (rule T)."""
    with wal.Log.open(tmp_path) as log:
        log.append_many([payload(i) for i in range(1, 6)])  # acknowledged, synced
        log.append_many([payload(i) for i in range(6, 11)])  # one batch: imagine its fdatasync cut off
    seg = segments(tmp_path)[-1]
    recs = record_offsets(seg)
    lsn, off, _ = recs[6]  # LSN 7, in the middle of the last batch
    write_at(seg, off + 30, b"\x00" * 8)
    with wal.Log.open(tmp_path) as log:
        assert log.recovery_report.torn_tail is not None
        assert log.recovery_report.torn_tail[1] == off
        assert [n for n, _ in log.read()] == list(range(1, lsn))
        assert log.append(b"resumed") == lsn


def test_damage_to_a_record_a_later_mark_vouches_for_in_the_last_segment_is_corruption(tmp_path: Path) -> None:
    """Each batch starts with a MARK naming the durable LSN: damage before it cannot be a torn write."""
    make_log(tmp_path, 20)
    seg = segments(tmp_path)[-1]
    lsn, off, _ = record_offsets(seg)[5]
    flip(seg, off + 40)
    with pytest.raises(wal.CorruptionError) as info:
        wal.Log.open(tmp_path)
    assert (info.value.path, info.value.offset, info.value.lsn) == (str(seg), off, lsn)


def test_readonly_open_reads_up_to_a_torn_tail_without_changing_any_file(tmp_path: Path) -> None:
    records = make_log(tmp_path, 5)
    seg = segments(tmp_path)[-1]
    _, off, _ = record_offsets(seg)[-1]
    write_at(seg, off + 5, b"\xaa\xbb")
    before = snapshot(tmp_path)
    with wal.Log.open(tmp_path, readonly=True) as ro:
        assert list(ro.read()) == records[:4]
    assert snapshot(tmp_path) == before


# ---- corruption ---------------------------------------------------------------------


def test_flipped_byte_in_a_sealed_segment_is_corruption_error_naming_file_offset_and_lsn(tmp_path: Path) -> None:
    make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    assert len(segs) >= 3
    target = segs[1]
    lsn, off, _ = record_offsets(target)[3]
    flip(target, off + 30)
    before = snapshot(tmp_path)
    with pytest.raises(wal.CorruptionError) as info:
        wal.Log.open(tmp_path, segment_bytes=SMALL)
    err = info.value
    assert err.path == str(target)
    assert err.offset == off
    assert err.lsn == lsn
    assert err.reason == "bad crc"
    assert str(target) in str(err)
    assert "recovery='truncate'" in str(err)
    assert snapshot(tmp_path) == before  # nothing was changed
    # and the lock was released: a fixed log opens again
    flip(target, off + 30)
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        assert log.watermarks.appended == 200


@pytest.mark.parametrize("where", ["segment-header", "first-record", "last-record", "seal"])
def test_any_flipped_byte_in_a_non_last_segment_refuses_to_open(tmp_path: Path, where: str) -> None:
    make_log(tmp_path, 200, segment_bytes=SMALL)
    first = segments(tmp_path)[0]
    recs = record_offsets(first)
    offset = {
        "segment-header": 40,
        "first-record": recs[0][1] + 26,
        "last-record": recs[-1][1] + 26,
        "seal": recs[-1][1] + recs[-1][2] + 8,
    }[where]
    flip(first, offset)
    with pytest.raises(wal.CorruptionError) as info:
        wal.Log.open(tmp_path, segment_bytes=SMALL)
    assert info.value.path == str(first)
    assert str(first) in str(info.value)
    with pytest.raises(wal.CorruptionError):
        wal.Log.open(tmp_path, readonly=True)


def test_a_flip_of_any_byte_of_a_sealed_segment_is_corruption_error(tmp_path: Path) -> None:
    """Header, records, padding, seal, zero tail: every byte of a sealed segment is checked on open."""
    make_log(tmp_path, 100, segment_bytes=SMALL, size=77)  # 77: records carry padding
    first = segments(tmp_path)[0]
    recs = record_offsets(first)
    seal_at = recs[-1][1] + recs[-1][2]
    must = set(range(H)) | set(range(recs[0][1], recs[0][1] + 24)) | set(range(seal_at, seal_at + 24))
    padding = recs[0][1] + 24 + 77  # first padding byte of record 1
    offsets = sorted(must | {padding, seal_at + 24, SMALL - 1} | set(range(0, SMALL, 37)))
    original = first.read_bytes()
    for off in offsets:
        flip(first, off, 0x01)
        with pytest.raises(wal.CorruptionError) as info:
            wal.Log.open(tmp_path, segment_bytes=SMALL)
        assert info.value.path == str(first), off
        first.write_bytes(original)
    assert first.read_bytes() == original


def test_damaged_segment_is_never_read_as_wrong_data_by_a_readonly_reader(tmp_path: Path) -> None:
    make_log(tmp_path, 200, segment_bytes=SMALL)
    target = segments(tmp_path)[1]
    _, off, _ = record_offsets(target)[2]
    flip(target, off + 50)
    with pytest.raises(wal.CorruptionError):
        wal.Log.open(tmp_path, readonly=True)


def test_damage_found_by_a_later_read_raises_after_the_records_before_it_and_never_yields_wrong_data(
        tmp_path: Path) -> None:
    # Damage that appears after the open (bit rot under a running process): a read validates
    # each sealed segment as it hands it out, so it gives every record before the damage,
    # then CorruptionError naming the segment and the first LSN it cannot vouch for.
    records = make_log(tmp_path, 200, segment_bytes=SMALL)
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        target = segments(tmp_path)[1]
        lsn, off, _ = record_offsets(target)[2]
        flip(target, off + 50)
        got: list[tuple[int, bytes]] = []
        with pytest.raises(wal.CorruptionError) as info:
            for item in log.read(1):
                got.append(item)
        assert got == records[: lsn - 1]
        assert info.value.path == str(target)
        assert info.value.lsn == lsn
        assert list(log.read(1 + len(records) - 10)) == records[-10:]  # segments past it still read


def test_a_segment_cut_short_after_the_open_is_a_gap_a_read_refuses_not_a_skip(tmp_path: Path) -> None:
    # Zeros from a record to the end of a sealed segment look like a clean end inside that one
    # segment; only the next segment's first LSN shows the hole. A read must not step over it.
    records = make_log(tmp_path, 200, segment_bytes=SMALL)
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        target = segments(tmp_path)[1]
        lsn, off, _ = record_offsets(target)[2]
        data = bytearray(target.read_bytes())
        data[off:] = bytes(len(data) - off)
        target.write_bytes(bytes(data))
        got: list[tuple[int, bytes]] = []
        with pytest.raises(wal.CorruptionError, match="starts at LSN") as info:
            for item in log.read(1):
                got.append(item)
        assert got == records[: lsn - 1]
        assert info.value.path == str(target)
        assert info.value.lsn == lsn


def test_recovery_truncate_opens_at_the_last_good_record_and_reports_lost_lsns(tmp_path: Path) -> None:
    records = make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    target = segs[1]
    lsn, off, _ = record_offsets(target)[3]
    flip(target, off + 30)
    with wal.Log.open(tmp_path, segment_bytes=SMALL, recovery="truncate") as log:
        report = log.recovery_report
        assert report.lost_lsns == (lsn, 200)
        assert report.last_lsn == lsn - 1
        assert log.stats()["lost_lsns"] == (lsn, 200)
        for later in segs[2:]:
            assert not later.exists()
            assert Path(f"{later}.broken").exists()
            assert f"{later}.broken" in report.broken_files
        assert list(log.read()) == records[: lsn - 1]
        assert log.append(b"resumed") == lsn
        log.append_many([payload(i) for i in range(3)])
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        assert log.recovery_report.torn_tail is None
        assert log.recovery_report.lost_lsns is None
        got = list(log.read())
    assert got[: lsn - 1] == records[: lsn - 1]
    assert got[lsn - 1 :] == [(lsn, b"resumed"), *[(lsn + 1 + i, payload(i)) for i in range(3)]]


@pytest.mark.parametrize("regions", [1, 2])
def test_recovery_truncate_in_the_newest_segment_reports_every_lsn_past_the_damage_as_lost(
        tmp_path: Path, regions: int) -> None:
    """The scan of the damaged segment stops at its damage and names only the first record after
    it; the truncate sets aside the segment's whole rest. It reported LSNs 12..12 lost where 12..20
    went. Past a second damaged region (records further on) the rest goes too."""
    records = make_log(tmp_path, 20)
    seg = segments(tmp_path)[-1]
    offsets = {lsn: off for lsn, off, _ in record_offsets(seg)}
    flip(seg, offsets[12] + 30)
    if regions == 2:
        flip(seg, offsets[16] + 30)
    with wal.Log.open(tmp_path, recovery="truncate") as log:
        assert log.recovery_report.lost_lsns == (12, 20)
        assert log.stats()["lost_lsns"] == (12, 20)
        assert list(log.read()) == records[:11]


class _CrashError(Exception):
    pass


@pytest.mark.parametrize("step", ["cut", "first set-aside", "second set-aside"])
def test_a_truncate_recovery_crashed_midway_is_refused_by_a_strict_open_and_redone_with_the_whole_lost_range(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """A crash at each step of recovery="truncate" (cutting the damaged segment, setting aside
    the later ones): a strict open still refuses the log as damaged, and truncate again reports
    the lost range to the newest LSN. (The later segments were set aside first: a crash before
    the cut left the damaged segment newest, and the range the next truncate reported ended at
    its own records.)"""
    records = make_log(tmp_path, 300, segment_bytes=SMALL)
    segs = segments(tmp_path)
    assert len(segs) >= 5  # two set aside before the crash, at least one after
    lsn, off, _ = record_offsets(segs[1])[3]
    flip(segs[1], off + 30)
    calls = {"cut": 0, "set-aside": 0}

    def crashing(name: str, real: Any) -> Any:
        def step_then_maybe_crash(*args: Any) -> Any:
            calls[name] += 1
            if step == "cut" and name == "cut":
                raise _CrashError
            out = real(*args)
            if name == "set-aside" and calls[name] == {"first set-aside": 1, "second set-aside": 2}.get(step):
                raise _CrashError
            return out
        return step_then_maybe_crash

    with monkeypatch.context() as m:
        m.setattr(recovery, "cut_tail", crashing("cut", recovery.cut_tail))
        m.setattr(recovery, "set_aside", crashing("set-aside", recovery.set_aside))
        with pytest.raises(_CrashError):
            wal.Log.open(tmp_path, segment_bytes=SMALL, recovery="truncate")
    with pytest.raises(wal.CorruptionError):
        wal.Log.open(tmp_path, segment_bytes=SMALL)
    with wal.Log.open(tmp_path, segment_bytes=SMALL, recovery="truncate") as log:
        assert log.recovery_report.lost_lsns == (lsn, 300)
        assert list(log.read()) == records[: lsn - 1]
    assert all(not s.exists() and Path(f"{s}.broken").exists() for s in segs[2:])


def test_a_segment_set_aside_twice_under_one_name_keeps_both_copies(tmp_path: Path) -> None:
    """Truncate, the log resumes and rolls into a segment name set aside before, then another
    truncate sets that segment aside too: the first copy stays, the second is <name>.1.broken.
    (It was renamed over the first: the records it held, kept for salvage, were destroyed.)"""
    make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    _, off, _ = record_offsets(segs[1])[3]
    flip(segs[1], off + 30)
    with wal.Log.open(tmp_path, segment_bytes=SMALL, recovery="truncate") as log:
        for i in range(200):
            log.append(payload(1000 + i))
    first_copy = Path(f"{segs[2]}.broken").read_bytes()
    assert segs[2].exists()  # the log rolled into that name again
    _, off, _ = record_offsets(segs[1])[1]
    flip(segs[1], off + 30)
    with wal.Log.open(tmp_path, segment_bytes=SMALL, recovery="truncate") as log:
        assert f"{segs[2]}.1.broken" in log.recovery_report.broken_files
    assert Path(f"{segs[2]}.broken").read_bytes() == first_copy
    assert Path(f"{segs[2]}.1.broken").read_bytes() != first_copy


def test_recovery_truncate_refuses_when_the_oldest_segment_header_is_damaged_and_changes_nothing(
    tmp_path: Path,
) -> None:
    make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    flip(segs[0], 20)  # log id: the header CRC fails, no record of the log can be trusted
    before = snapshot(tmp_path)
    with pytest.raises(wal.CorruptionError) as info:
        wal.Log.open(tmp_path, segment_bytes=SMALL)
    assert info.value.reason == "bad header crc"
    with pytest.raises(wal.CorruptionError) as info:
        wal.Log.open(tmp_path, segment_bytes=SMALL, recovery="truncate")
    assert info.value.path == str(segs[0])
    assert snapshot(tmp_path) == before


def test_recovery_truncate_of_a_damaged_later_segment_header_sets_that_segment_aside(tmp_path: Path) -> None:
    records = make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    flip(segs[1], 20)
    first_lost = record_offsets(segs[0])[-1][0] + 1
    with wal.Log.open(tmp_path, segment_bytes=SMALL, recovery="truncate") as log:
        assert log.recovery_report.lost_lsns == (first_lost, 200)
        assert all(Path(f"{s}.broken").exists() for s in segs[1:])
        assert list(log.read()) == records[: first_lost - 1]
        assert log.append(b"next") == first_lost
    assert read_all(tmp_path)[-1] == (first_lost, b"next")


def test_missing_middle_segment_is_corruption_segment_number_gap(tmp_path: Path) -> None:
    make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    assert len(segs) >= 3
    segs[1].unlink()
    with pytest.raises(wal.CorruptionError) as info:
        wal.Log.open(tmp_path, segment_bytes=SMALL)
    assert info.value.reason == "segment number gap"
    assert "segment number gap" in str(info.value)
    assert info.value.path == str(segs[2])
    assert info.value.lsn == record_offsets(segs[0])[-1][0] + 1


def test_segment_header_of_a_newer_format_version_is_format_version_error(tmp_path: Path) -> None:
    make_log(tmp_path, 5)
    seg = segments(tmp_path)[-1]
    h = wf.decode_segment_header(seg.read_bytes()[:H])
    newer = wf.encode_segment_header(log_id=h.log_id, segment_no=h.segment_no, first_lsn=h.first_lsn,
                                     salt=h.salt, prealloc_bytes=h.prealloc_bytes, version=wf.FORMAT_VERSION + 1)
    write_at(seg, 0, newer)
    before = snapshot(tmp_path)
    with pytest.raises(wal.FormatVersionError) as info:
        wal.Log.open(tmp_path)
    assert str(seg) in str(info.value)
    with pytest.raises(wal.FormatVersionError):
        wal.Log.open(tmp_path, readonly=True)
    with pytest.raises(wal.FormatVersionError):
        wal.Log.open(tmp_path, recovery="truncate")
    assert snapshot(tmp_path) == before


def test_leftover_segment_temp_files_are_removed_on_open(tmp_path: Path) -> None:
    records = make_log(tmp_path, 5)
    leftover = tmp_path / (wf.segment_name(2) + ".tmp")
    leftover.write_bytes(b"half-made segment")
    other = tmp_path / "notes.tmp"
    other.write_bytes(b"not ours")
    with wal.Log.open(tmp_path) as log:
        assert not leftover.exists()
        assert other.exists()
        assert list(log.read()) == records


def test_sealed_last_segment_left_by_a_crash_before_the_next_was_made_opens_a_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    records = make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    segs[-1].unlink()  # the crash came after the seal was written, before the next segment existed
    last = record_offsets(segs[-2])[-1][0]
    assert wf.scan_segment(segs[-2].read_bytes()).status == "sealed"
    synced: list[str] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:  # the real one, noting which file it made durable
        real_fdatasync(fd)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        # The seal may have been written and never synced (a kill before its fdatasync): the
        # open makes the segment durable before a store builds on its records (I1).
        assert str(segs[-2]) in synced
        assert log.recovery_report.last_lsn == last
        assert log.recovery_report.torn_tail is None
        assert log.append(b"next") == last + 1
    assert segments(tmp_path)[-1].name == segs[-1].name
    assert read_all(tmp_path) == [*records[:last], (last + 1, b"next")]


def test_new_segment_with_no_records_yet_is_the_open_tail(tmp_path: Path) -> None:
    records = make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    first = wf.decode_segment_header(segs[-1].read_bytes()).first_lsn
    write_at(segs[-1], H, bytes(SMALL - H))  # made, but the crash came before its first record
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        assert log.recovery_report.last_lsn == first - 1
        assert log.recovery_report.torn_tail is None
        assert list(log.read()) == records[: first - 1]
        assert log.append(b"first of the segment") == first
    assert read_all(tmp_path)[-1] == (first, b"first of the segment")


def test_segment_from_another_log_is_corruption(tmp_path: Path) -> None:
    make_log(tmp_path / "a", 200, segment_bytes=SMALL)
    make_log(tmp_path / "b", 200, segment_bytes=SMALL)
    victim = segments(tmp_path / "a")[1]
    victim.write_bytes(segments(tmp_path / "b")[1].read_bytes())
    with pytest.raises(wal.CorruptionError) as info:
        wal.Log.open(tmp_path / "a", segment_bytes=SMALL)
    assert info.value.reason == "log id mismatch"


def test_open_after_recovery_finds_an_unchanged_log_idempotent(tmp_path: Path) -> None:
    make_log(tmp_path, 5)
    seg = segments(tmp_path)[-1]
    _, off, _ = record_offsets(seg)[-1]
    write_at(seg, off + 12, b"\x99" * 4)
    with wal.Log.open(tmp_path):
        pass
    after_first = snapshot(tmp_path)
    with wal.Log.open(tmp_path) as log:
        assert log.recovery_report.torn_tail is None
    assert snapshot(tmp_path) == after_first


# ---- zero-fill ahead (native/writer.c) ----------------------------------------------------------


def _first_hole(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE)
    finally:
        os.close(fd)


@pytest.mark.parametrize("reopen", [False, True])
def test_a_sync_log_zero_fills_ahead_of_its_tail_and_recovery_reads_the_same_records(
    tmp_path: Path, reopen: bool
) -> None:
    # Blocks ahead of the tail are allocated (zeros written) so that later sync commits
    # overwrite instead of allocating; the zeros read as unwritten space, as in "zeros" mode.
    payloads = [os.urandom(4000) for _ in range(300)]
    with wal.Log.open(tmp_path, durability="sync") as log:
        for p in payloads[:150]:
            log.append(p)
    if reopen:
        with wal.Log.open(tmp_path, durability="sync") as log:
            assert log.recovery_report.torn_tail is None
            for p in payloads[150:]:
                log.append(p)
    (segment,) = [Path(p) for _, p in list_segments(str(tmp_path))]
    scan = wf.scan_segment(segment.read_bytes())
    written = len(payloads) if reopen else 150
    assert scan.status == "open"
    assert [p for _, p in scan.payloads] == payloads[:written]
    hole = _first_hole(segment)
    assert hole % (1 << 20) == 0 and hole >= scan.end_offset + (1 << 19), (hole, scan.end_offset)
    assert segment.read_bytes()[scan.end_offset:hole] == bytes(hole - scan.end_offset)
    with wal.Log.open(tmp_path, durability="sync") as log:
        assert [p for _, p in log.read(1)] == payloads[:written]
        assert log.recovery_report.torn_tail is None


def test_a_buffered_log_does_not_zero_fill_ahead(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=50) as log:
        for _ in range(150):
            log.append(os.urandom(4000))
    (segment,) = [Path(p) for _, p in list_segments(str(tmp_path))]
    end = wf.scan_segment(segment.read_bytes()).end_offset
    assert _first_hole(segment) < end + (64 << 10)  # only the data's own blocks are allocated


# ---- on_sealed_segment: sealed segments handed out while the open goes on ------------------------------


def test_open_hands_out_every_sealed_segment_in_order_each_before_the_next_is_scanned(tmp_path: Path) -> None:
    records = make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    assert len(segs) >= 4
    handed: list[wal.log.log.SealedSegment] = []
    read: list[tuple[int, bytes]] = []

    def on_sealed(seg: wal.log.log.SealedSegment) -> None:
        handed.append(seg)
        for span in seg.read_spans(seg.first_lsn):
            lsns, offs, lens = span.lsns.cast("Q"), span.offsets.cast("Q"), span.lengths.cast("I")
            read.extend((lsn, bytes(span.buffer[o:o + n])) for lsn, o, n in zip(lsns, offs, lens, strict=True))

    with wal.Log.open(tmp_path, segment_bytes=SMALL, on_sealed_segment=on_sealed) as log:
        assert log.watermarks.appended == 200
    assert [s.path for s in handed] == [str(p) for p in segs[:-1]]  # the newest is the open's own
    assert [s.number for s in handed] == list(range(1, len(segs)))
    assert handed[0].first_lsn == 1
    assert all(a.last_lsn + 1 == b.first_lsn for a, b in itertools.pairwise(handed))
    assert read == records[: handed[-1].last_lsn]


def test_open_stops_handing_out_segments_at_damage_and_still_refuses_the_log(tmp_path: Path) -> None:
    make_log(tmp_path, 200, segment_bytes=SMALL)
    segs = segments(tmp_path)
    lsn, off, _ = record_offsets(segs[2])[1]
    flip(segs[2], off + 30)
    before = snapshot(tmp_path)
    handed: list[int] = []
    with pytest.raises(wal.CorruptionError) as info:
        wal.Log.open(tmp_path, segment_bytes=SMALL, on_sealed_segment=lambda s: handed.append(s.number))
    assert info.value.lsn == lsn
    assert handed == [1, 2]  # the segments before the damage, never the damaged one
    assert snapshot(tmp_path) == before


def test_an_on_sealed_segment_callback_that_raises_fails_the_open_and_leaves_the_log_openable(
        tmp_path: Path) -> None:
    make_log(tmp_path, 200, segment_bytes=SMALL)

    def refuse(seg: wal.log.log.SealedSegment) -> None:
        raise RuntimeError(f"no thanks: {seg.number}")

    with pytest.raises(RuntimeError, match="no thanks: 1"):
        wal.Log.open(tmp_path, segment_bytes=SMALL, on_sealed_segment=refuse)
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:  # the lock was released
        assert log.watermarks.appended == 200


def test_each_sealed_segment_is_handed_out_before_the_scan_runs_more_than_its_lookahead_past_it(
        tmp_path: Path) -> None:
    make_log(tmp_path, 300, segment_bytes=SMALL)
    segs = segments(tmp_path)
    later = segs[recovery._SCAN_AHEAD + 1]  # not started while segment 1 is handed out
    assert later != segs[-1]
    lsn, off, _ = record_offsets(later)[2]

    def damage_a_later_one(seg: wal.log.log.SealedSegment) -> None:
        if seg.number == 1:
            flip(later, off + 30)

    with pytest.raises(wal.CorruptionError) as info:
        wal.Log.open(tmp_path, segment_bytes=SMALL, on_sealed_segment=damage_a_later_one)
    assert (info.value.path, info.value.lsn) == (str(later), lsn)


def _scan_fields(scan: recovery.DirectoryScan) -> tuple[object, ...]:
    return (scan.damage, [dataclasses.astuple(s) for s in scan.segments])


def _scan_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("agentwal-scan")]


@pytest.mark.parametrize("damaged", [None, 0, 1, 3, "last"])
def test_the_open_scans_segments_two_at_a_time_with_the_verdict_of_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: int | str | None) -> None:
    make_log(tmp_path, 300, segment_bytes=SMALL)
    segs = segments(tmp_path)
    assert len(segs) >= 6
    if damaged is not None:
        seg = segs[-1] if damaged == "last" else segs[int(damaged)]
        _, off, _ = record_offsets(seg)[1]
        flip(seg, off + 30)
    ahead = recovery.scan_directory(str(tmp_path))
    assert not _scan_threads()  # every scan thread is gone once the open has its verdict
    monkeypatch.setattr(recovery, "_SCAN_AHEAD", 1)  # one segment at a time, in this thread
    alone = recovery.scan_directory(str(tmp_path))
    assert _scan_fields(ahead) == _scan_fields(alone)
    if damaged in (0, 1, 3):
        assert ahead.damage is not None and ahead.damage.index == damaged
        assert len(ahead.segments) == int(damaged) + 1  # nothing scanned past the damage is reported
    else:
        assert len(ahead.segments) == len(segs)


def test_a_scan_that_fails_stops_the_scans_running_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_log(tmp_path, 300, segment_bytes=SMALL)
    segs = segments(tmp_path)
    real = recovery.scan_segment_file
    started: list[int] = []

    def failing(path: str, number: int) -> recovery.SegmentScan:
        started.append(number)
        if number == 2:
            raise OSError(errno.EIO, "Input/output error", path)
        return real(path, number)

    monkeypatch.setattr(recovery, "scan_segment_file", failing)
    with pytest.raises(OSError, match="Input/output error"):
        recovery.scan_directory(str(tmp_path))
    assert not _scan_threads()
    assert max(started) <= 2 + recovery._SCAN_AHEAD < len(segs)  # the rest were never started


def test_a_cut_redone_after_a_crash_in_its_zeroing_keeps_the_whole_copy_it_made_first(tmp_path: Path) -> None:
    """A crash while a torn tail was being zeroed leaves its .broken copy (made whole and synced
    first) and the tail half zeroed; the next open cuts what is left again. It keeps the first
    copy and writes the rest beside it: it overwrote the whole copy with the half-zeroed bytes."""
    make_log(tmp_path, 5)
    seg = segments(tmp_path)[-1]
    _, off, size = record_offsets(seg)[-1]
    cut = torn_zeroed_middle(seg, off, size)
    first = Path(f"{seg}.{off:016x}.broken")
    first.write_bytes(cut)  # the copy a first, crashed, cut made
    with open(seg, "r+b") as f:  # ... and the half of the tail it had zeroed
        f.seek(off)
        f.write(bytes(len(cut) // 2))
    with wal.Log.open(tmp_path) as log:
        again = Path(f"{seg}.{off:016x}.1.broken")
        assert log.recovery_report.broken_files == (str(again),)
        assert log.recovery_report.last_lsn == 4
    assert first.read_bytes() == cut
    assert again.read_bytes() == bytes(len(cut) // 2) + cut[len(cut) // 2:]


def test_recovery_truncate_reads_past_a_later_damaged_region_that_looks_torn(tmp_path: Path) -> None:
    # Damage at LSN 11, again at 21, and the MARK before 22..30 gone: the re-scan past the first
    # damage found the second torn-looking (no MARK after it) and stopped, reporting 11..20 lost
    # while 11..30 went into the .broken file.
    with wal.Log.open(tmp_path) as log:
        log.append_many([b"r%03d" % i for i in range(1, 11)])
        log.append(b"r011")
        log.append_many([b"r%03d" % i for i in range(12, 21)])
        log.append(b"r021")
        log.append_many([b"r%03d" % i for i in range(22, 31)])
    seg = segments(tmp_path)[-1]
    buf = bytearray(seg.read_bytes())
    found, off = [], 64
    while off + 24 <= len(buf) and any(buf[off:off + 24]):
        length, lsn = struct.unpack_from("<IQ", buf, off + 4)  # the length (u32) and the LSN (u64) after it
        kind = buf[off + 16]
        found.append((off, kind, lsn))
        off += 24 + (length + 7) // 8 * 8
    for kind, lsn, at in ((1, 11, 24), (1, 21, 24), (3, 21, 8)):  # DATA 11, DATA 21, the MARK(21)
        buf[[o for o, k, n in found if k == kind and n == lsn][-1] + at] ^= 0x01
    seg.write_bytes(bytes(buf))
    with wal.Log.open(tmp_path, recovery="truncate") as log:
        assert log.recovery_report.lost_lsns == (11, 30)
        assert log.recovery_report.last_lsn == 10
