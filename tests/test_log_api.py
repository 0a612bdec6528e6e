"""The `wal.Log` API (public and frozen), as a user sees it.

append / append_many / sync / read / close / context manager; segments rolling
at `segment_bytes` and reads across them; LSNs continuing after a reopen; bad
arguments refused before anything is written; `ClosedError` after close;
`stats()`; the `rpo_ms` shorthand; `remove_segments_before`.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import wal
import wal.log.format as wf
from wal.log.log import _ReadCache
from wal.log.recovery import list_segments

SMALL = 8192


def payload(i: int, size: int = 100) -> bytes:
    head = f"record {i:06d} ".encode()
    return (head * (size // len(head) + 1))[:size]


def segment_files(d: Path) -> list[Path]:
    return [Path(p) for _, p in list_segments(str(d))]


# ---- append, read, sync, close ------------------------------------------------


def test_append_returns_consecutive_lsns_starting_at_1(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        assert [log.append(payload(i)) for i in range(5)] == [1, 2, 3, 4, 5]


def test_read_yields_every_record_in_lsn_order_with_its_payload(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        for i in range(1, 21):
            log.append(payload(i, size=i * 7))
        assert list(log.read()) == [(i, payload(i, size=i * 7)) for i in range(1, 21)]


def test_read_from_lsn_starts_at_that_record(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        for i in range(1, 11):
            log.append(payload(i))
        assert [lsn for lsn, _ in log.read(from_lsn=7)] == [7, 8, 9, 10]
        assert list(log.read(from_lsn=11)) == []
        assert list(log.read(10)) == [(10, payload(10))]


def test_reads_that_follow_the_writer_resume_where_the_last_one_stopped(tmp_path: Path) -> None:
    """A writable log's reads from ever later LSNs (the archive's shipper) resume each segment
    where the last read stopped: the same records as a first read of the files would give,
    across rolls, from any LSN, and from the start again; damage past the resume point is
    still found."""
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        shipped = 0
        for round_ in range(40):
            for _ in range(round_ % 7 + 1):
                log.append(payload(shipped + 1 + _))
            got = list(log.read(shipped + 1))
            want = log.watermarks.written
            assert [lsn for lsn, _ in got] == list(range(shipped + 1, want + 1))
            assert all(data == payload(lsn) for lsn, data in got)
            shipped = want
        assert log._scan_resume.resume, "reads of the newest segment left a point to resume from"
        assert set(log._scan_resume.resume) <= {str(f) for f in segment_files(tmp_path)}
        assert log._scan_resume.kept is not None and log._scan_resume.kept[0] == str(segment_files(tmp_path)[-1])
        assert list(log.read()) == [(i, payload(i)) for i in range(1, shipped + 1)]
        assert [lsn for lsn, _ in log.read(shipped - 3)] == list(range(shipped - 3, shipped + 1))
    # A record after the resume point damaged on disk: the resumed read validates it.
    with wal.Log.open(tmp_path / "damaged", durability="sync") as log:
        for i in range(1, 11):
            log.append(payload(i))
        assert len(list(log.read(1))) == 10
        (newest,) = segment_files(tmp_path / "damaged")
        resume_at = int(log._scan_resume.resume[str(newest)][1].end_offset)
        log.append(payload(11))
        log.append(payload(12))  # a valid record after the damage: corruption, not a torn tail
        with open(newest, "r+b") as f:
            f.seek(resume_at + wf.RECORD_HEADER_SIZE + 1)  # inside record 11's payload
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(wal.CorruptionError):
            list(log.read(11))


def test_reads_that_follow_the_writer_map_the_newest_segment_again_once_it_outgrew_the_map(tmp_path: Path) -> None:
    """The newest segment stays mapped between a writable log's reads; a map that ends before
    the records asked for (a segment grown past its preallocation) is made again and the read
    goes on in it: never fewer records than were written."""
    with wal.Log.open(tmp_path) as log:
        for i in range(1, 21):
            log.append(payload(i))
        assert list(log.read(1)) == [(i, payload(i)) for i in range(1, 21)]
        kept = log._scan_resume.kept
        assert kept is not None
        path = kept[0]
        with open(path, "rb") as f:
            short = mmap.mmap(f.fileno(), wf.SEGMENT_HEADER_SIZE + 50, access=mmap.ACCESS_READ)
        log._scan_resume.kept = (path, short, [0])
        log._scan_resume.resume.clear()
        for i in range(21, 31):
            log.append(payload(i))
        assert list(log.read(5)) == [(i, payload(i)) for i in range(5, 31)]
        assert log._scan_resume.kept is not None and log._scan_resume.kept[1] is not short
        assert list(log.read(30)) == [(30, payload(30))]


def test_append_accepts_bytes_bytearray_memoryview_and_empty_payloads(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append(b"bytes")
        log.append(bytearray(b"bytearray"))
        log.append(memoryview(b"..memoryview..")[2:-2])
        log.append(b"")
        assert list(log.read()) == [(1, b"bytes"), (2, b"bytearray"), (3, b"memoryview"), (4, b"")]


def test_append_many_assigns_consecutive_lsns_and_returns_the_last(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        assert log.append(b"a") == 1
        assert log.append_many([b"b", b"c", b"d"]) == 4
        assert log.append_many(iter([b"e"])) == 5
        assert list(log.read()) == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d"), (5, b"e")]


def test_append_many_of_nothing_appends_nothing_and_returns_the_last_lsn(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        assert log.append_many([]) == 0
        log.append(b"x")
        assert log.append_many([]) == 1
        assert log.watermarks.appended == 1


def test_sync_makes_everything_appended_durable(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=60_000) as log:
        last = log.append_many([payload(i) for i in range(50)])
        log.sync()
        marks = log.watermarks
        assert marks.durable == marks.written == marks.appended == last


def test_context_manager_closes_the_log(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append(b"x")
        assert not log.closed
    assert log.closed


def test_close_is_idempotent(tmp_path: Path) -> None:
    log = wal.Log.open(tmp_path)
    log.append(b"x")
    log.close()
    log.close()
    assert log.closed


def test_every_operation_after_close_raises_closed_error(tmp_path: Path) -> None:
    log = wal.Log.open(tmp_path)
    log.append(b"x")
    log.close()
    with pytest.raises(wal.ClosedError):
        log.append(b"y")
    with pytest.raises(wal.ClosedError):
        log.append_many([b"y"])
    with pytest.raises(wal.ClosedError):
        log.sync()
    with pytest.raises(wal.ClosedError):
        list(log.read())
    with pytest.raises(wal.ClosedError):
        asyncio.run(log.append_async(b"y"))
    assert isinstance(wal.ClosedError("x"), wal.WalError)


def test_records_appended_before_close_are_there_after_reopen(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=60_000) as log:
        log.append_many([payload(i) for i in range(1, 101)])
    with wal.Log.open(tmp_path) as log:
        assert list(log.read()) == [(i, payload(i)) for i in range(1, 101)]


def test_reopen_continues_lsns_after_the_last_record(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append_many([b"a", b"b", b"c"])
    with wal.Log.open(tmp_path) as log:
        assert log.recovery_report.last_lsn == 3
        assert log.watermarks == wal.LogWatermarks(3, 3, 3)
        assert log.append(b"d") == 4
    with wal.Log.open(tmp_path) as log:
        assert log.append(b"e") == 5
        assert list(log.read()) == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d"), (5, b"e")]


def test_a_fresh_directory_is_created_and_opened_empty(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    with wal.Log.open(d) as log:
        assert list(log.read()) == []
        assert log.watermarks == wal.LogWatermarks(0, 0, 0)
        assert log.directory == str(d)
    assert len(segment_files(d)) == 1


# ---- segments ------------------------------------------------------------------


def test_segments_roll_at_segment_bytes_and_reads_cross_them(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        for i in range(1, 301):
            log.append(payload(i))
        files = segment_files(tmp_path)
        assert len(files) >= 300 * wf.record_size(100) // SMALL
        assert list(log.read()) == [(i, payload(i)) for i in range(1, 301)]
        mid = [lsn for lsn, _ in log.read(from_lsn=150)]
        assert mid == list(range(150, 301))


def test_every_segment_but_the_last_is_sealed_and_none_exceeds_segment_bytes(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        log.append_many([payload(i, 300) for i in range(1, 201)])
    files = segment_files(tmp_path)
    assert len(files) > 3
    expected_first = 1
    for n, f in enumerate(files, start=1):
        data = f.read_bytes()
        assert len(data) <= SMALL
        assert f.name == wf.segment_name(n)
        res = wf.scan_segment(data)
        assert res.header is not None
        assert res.header.segment_no == n
        assert res.header.first_lsn == expected_first
        assert res.status == ("open" if f == files[-1] else "sealed")
        expected_first = res.last_lsn + 1
    assert expected_first == 201


def test_a_record_larger_than_segment_bytes_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    big = os.urandom(3 * SMALL)
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        log.append(b"before")
        log.append(big)
        log.append(b"after")
        assert list(log.read()) == [(1, b"before"), (2, big), (3, b"after")]
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        assert [lsn for lsn, _ in log.read()] == [1, 2, 3]


def test_reading_across_segments_after_reopen(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        log.append_many([payload(i) for i in range(1, 151)])
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        log.append_many([payload(i) for i in range(151, 301)])
        assert list(log.read()) == [(i, payload(i)) for i in range(1, 301)]


def test_remove_segments_before_deletes_only_segments_wholly_below_the_lsn(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        log.append_many([payload(i) for i in range(1, 401)])
        before = segment_files(tmp_path)
        removed = log.remove_segments_before(200)
        after = segment_files(tmp_path)
        assert removed
        assert [Path(p) for p in removed] == before[: len(removed)]
        assert after == before[len(removed) :]
        first = log.first_lsn
        assert 1 < first <= 200
        assert [lsn for lsn, _ in log.read(from_lsn=first)] == list(range(first, 401))
        with pytest.raises(wal.ArgumentError):
            list(log.read(from_lsn=1))
        # the segment being written is never removed
        log.remove_segments_before(10**9)
        assert segment_files(tmp_path) == after[-1:]
        assert log.append(b"more") == 401
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        assert log.append(b"after reopen") == 402
        assert [lsn for lsn, _ in log.read(from_lsn=log.first_lsn)][-2:] == [401, 402]


def test_remove_segments_before_can_archive_instead_of_deleting(tmp_path: Path) -> None:
    d, archive = tmp_path / "log", tmp_path / "archive"
    with wal.Log.open(d, segment_bytes=SMALL) as log:
        log.append_many([payload(i) for i in range(1, 301)])
        removed = log.remove_segments_before(250, archive_dir=str(archive))
    assert removed
    assert sorted(p.name for p in archive.iterdir()) == [os.path.basename(p) for p in removed]


def test_remove_segments_before_lsn_1_removes_nothing(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        log.append_many([payload(i) for i in range(1, 301)])
        assert log.remove_segments_before(1) == []


# ---- arguments ------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["text", 12, None, [b"x"]], ids=["str", "int", "None", "list"])
def test_append_of_a_non_bytes_payload_is_argument_type_error_and_writes_nothing(tmp_path: Path, bad: object) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append(b"one")
        with pytest.raises(wal.ArgumentTypeError) as info:
            log.append(bad)  # type: ignore[arg-type]
        assert isinstance(info.value, TypeError)
        with pytest.raises(TypeError):
            log.append_many([b"ok", bad])  # type: ignore[list-item]
        assert log.watermarks.appended == 1
        assert log.append(b"two") == 2
        assert list(log.read()) == [(1, b"one"), (2, b"two")]


@pytest.mark.parametrize("bad", [None, 3, b"abc"], ids=["None", "int", "bytes"])
def test_append_many_of_no_iterable_of_payloads_is_argument_type_error(tmp_path: Path, bad: object) -> None:
    """append_many(None) raised a raw TypeError ("'NoneType' object is not iterable")."""
    with wal.Log.open(tmp_path) as log:
        with pytest.raises(wal.ArgumentTypeError, match="append_many takes an iterable of payloads"):
            log.append_many(bad)  # type: ignore[arg-type]
        with pytest.raises(wal.ArgumentTypeError, match="append_many takes an iterable of payloads"):
            asyncio.run(log.append_many_async(bad))  # type: ignore[arg-type]
        assert log.watermarks.appended == 0


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"durability": "fast"}, wal.ArgumentError),
        ({"durability": "sync", "rpo_ms": 50}, wal.ArgumentError),
        ({"durability": "interval", "rpo_ms": 0}, wal.ArgumentError),
        ({"rpo_ms": -1}, wal.ArgumentError),
        ({"rpo_ms": "100"}, wal.ArgumentTypeError),
        ({"rpo_ms": 1.5}, wal.ArgumentTypeError),
        ({"rpo_ms": True}, wal.ArgumentTypeError),
        ({"segment_bytes": 100}, wal.ArgumentError),
        ({"segment_bytes": "big"}, wal.ArgumentError),
        ({"recovery": "ignore"}, wal.ArgumentError),
        ({"preallocate": "fallocate"}, wal.ArgumentError),
        ({"max_pending_bytes": 10}, wal.ArgumentError),
        ({"rpo_ms": 2**32}, wal.ArgumentError),
        ({"segment_bytes": 2**64}, wal.ArgumentError),
        ({"segment_bytes": True}, wal.ArgumentError),
        ({"max_pending_bytes": 2**64}, wal.ArgumentError),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else v.__name__,
)
def test_bad_open_arguments_raise_before_anything_is_created(
    tmp_path: Path, kwargs: dict[str, object], exc: type[Exception]
) -> None:
    d = tmp_path / "never"
    with pytest.raises(exc) as info:
        wal.Log.open(d, **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError if exc is wal.ArgumentError else TypeError)
    assert isinstance(info.value, wal.WalError)
    assert not d.exists()


def test_bad_open_arguments_leave_an_existing_log_untouched(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append(b"x")
    with open(next(tmp_path.glob("*.wal")), "r+b") as f:  # a torn tail the open would cut
        f.seek(64 + 24 + 1 + 8)
        f.write(b"\x07" * 40)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for bad in ({"durability": "sometimes"}, {"rpo_ms": 2**32}, {"segment_bytes": 2**64},
                {"max_pending_bytes": 2**64}):
        with pytest.raises(wal.ArgumentError):
            wal.Log.open(tmp_path, **bad)  # type: ignore[arg-type]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_bad_directory_is_an_argument_error(tmp_path: Path) -> None:
    """A directory with a NUL byte raised the OS call's raw ValueError, and None a raw TypeError."""
    with pytest.raises(wal.ArgumentError, match=r"the log's directory .* contains a NUL byte"):
        wal.Log.open(f"{tmp_path}/a\0b")
    with pytest.raises(wal.ArgumentTypeError, match="the log's directory must be a str or os"):
        wal.Log.open(None)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", [0, -1, "1", 1.0, None])
def test_read_from_a_bad_lsn_is_argument_error(tmp_path: Path, bad: object) -> None:
    with wal.Log.open(tmp_path) as log:
        log.append(b"x")
        with pytest.raises(wal.ArgumentError):
            list(log.read(from_lsn=bad))  # type: ignore[arg-type]


def test_unknown_per_append_durability_is_argument_error_and_writes_nothing(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        with pytest.raises(wal.ArgumentError):
            log.append(b"x", durability="eventually")
        with pytest.raises(wal.ArgumentError):
            log.append_many([b"x"], durability="eventually")
        assert log.watermarks.appended == 0


def test_error_classes_have_one_root_and_the_right_builtin_bases() -> None:
    for cls in (wal.CorruptionError, wal.LockedError, wal.ConflictError, wal.FailedError, wal.ClosedError,
                wal.ArgumentError, wal.ArgumentTypeError, wal.RecordTooLargeError, wal.FormatVersionError):
        assert issubclass(cls, wal.WalError)
    assert issubclass(wal.ArgumentError, ValueError)
    assert issubclass(wal.RecordTooLargeError, ValueError)
    assert issubclass(wal.ArgumentTypeError, TypeError)


# ---- durability configuration ----------------------------------------------------


def test_default_durability_is_sync(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        assert (log.durability, log.rpo_ms) == ("sync", 0)


def test_rpo_ms_zero_means_sync(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, rpo_ms=0) as log:
        assert (log.durability, log.rpo_ms) == ("sync", 0)
        lsn = log.append(b"x")
        assert log.watermarks.durable >= lsn


def test_rpo_ms_alone_means_interval_with_that_bound(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, rpo_ms=250) as log:
        assert (log.durability, log.rpo_ms) == ("interval", 250)
        assert log.stats()["rpo_ms"] == 250


def test_buffered_level_takes_its_rpo_ms(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, durability="buffered", rpo_ms=40) as log:
        assert (log.durability, log.rpo_ms) == ("buffered", 40)


# ---- stats ------------------------------------------------------------------------

STATS_KEYS = {"commits", "fsyncs", "group_size_mean", "group_size_max", "fsync_ms_p50", "fsync_ms_p99",
              "durable_lag_ms"}


def test_stats_reports_commits_fsyncs_group_sizes_fsync_latency_and_durable_lag(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        for i in range(10):
            log.append(payload(i))
        log.append_many([payload(i) for i in range(5)])
        s = log.stats()
    assert s.keys() >= STATS_KEYS
    assert s["commits"] == 15
    assert 1 <= s["fsyncs"] <= 15
    assert s["group_size_max"] >= 1
    assert s["group_size_mean"] >= 1.0
    assert s["fsync_ms_p99"] >= s["fsync_ms_p50"] >= 0.0
    assert s["durable_lag_ms"] == 0.0  # at sync nothing acknowledged is unsynced
    assert s["durability"] == "sync"


def test_stats_of_a_fresh_log_are_zero(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path) as log:
        s = log.stats()
    assert (s["commits"], s["fsyncs"], s["group_size_max"]) == (0, 0, 0)
    assert s["group_size_mean"] == 0.0


def test_stats_show_a_durable_lag_while_interval_commits_wait_for_their_sync(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, rpo_ms=60_000) as log:
        log.append(b"x")
        marks = log.watermarks
        s = log.stats()
        assert marks.durable < marks.appended  # the flusher syncs only when half the window has passed
        assert s["durable_lag_ms"] > 0.0
        log.sync()
        assert log.stats()["durable_lag_ms"] == 0.0


# ---- read-only --------------------------------------------------------------------


def test_readonly_log_reads_but_refuses_appends(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path, segment_bytes=SMALL) as log:
        log.append_many([payload(i) for i in range(1, 201)])
    with wal.Log.open(tmp_path, readonly=True) as ro:
        assert ro.readonly
        assert list(ro.read()) == [(i, payload(i)) for i in range(1, 201)]
        with pytest.raises(wal.ReadOnlyError):
            ro.append(b"x")
        assert ro.watermarks.appended == 200


def test_readonly_open_of_a_missing_directory_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        wal.Log.open(tmp_path / "nothing", readonly=True)


def test_reads_beside_a_releasing_writer_give_records_or_argument_error_never_a_raw_os_error(tmp_path: Path) -> None:
    """A read lists the segments and reads each one's first LSN; a checkpoint's release may
    remove the oldest meanwhile. The read lists again (the records it asks for may well still
    be there), or says the LSN is no longer in the log: it raised a raw FileNotFoundError, tens
    of times a second here."""
    log = wal.Log.open(tmp_path / "log", durability="interval", rpo_ms=50, segment_bytes=4096)
    deadline = time.monotonic() + 2.0
    errors: list[BaseException] = []
    reads = [0]

    def write_and_release() -> None:
        while time.monotonic() < deadline:
            last = log.append_many([b"x" * 200] * 20)
            log.remove_segments_before(last - 30)

    def read() -> None:
        while time.monotonic() < deadline:
            start = max(1, log.watermarks.written - 10)
            try:
                lsns = [lsn for lsn, _ in log.read(start)]
            except wal.ArgumentError as exc:
                assert "is no longer in the log" in str(exc)
                continue
            except BaseException as exc:  # the class is what is checked
                errors.append(exc)
                return
            assert lsns == list(range(start, start + len(lsns)))
            reads[0] += 1

    threads = [threading.Thread(target=write_and_release), threading.Thread(target=read), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert errors == [] and reads[0] > 0


def test_a_read_whose_kept_segment_another_reader_let_go_and_a_checkpoint_released_says_the_lsn_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writable log keeps its newest segment mapped for the next read, shared by every thread
    reading it. A read that found one kept, while another reader let it go (it listed the
    directory since) and a checkpoint released its file, opened it again by name and raised a
    raw FileNotFoundError (seen beside a writer releasing segments, now and then). The read
    lists the directory instead: the records, or ArgumentError naming the LSN gone."""
    with wal.Log.open(tmp_path / "log", segment_bytes=4096) as log:
        log.append_many([b"x" * 200] * 5)
        assert [lsn for lsn, _ in log.read(3)] == [3, 4, 5]  # its segment kept
        for _ in range(10):
            last = log.append_many([b"y" * 200] * 20)
        log.remove_segments_before(last)
        newest_map = _ReadCache.newest_map

        def let_go_first(self: _ReadCache, path: str) -> Any:
            self.kept = None  # the other reader's listing, between this read's look and its use
            return newest_map(self, path)

        monkeypatch.setattr(_ReadCache, "newest_map", let_go_first)
        with pytest.raises(wal.ArgumentError, match="LSN 4 is no longer in the log"):
            list(log.read(4))
        assert [lsn for lsn, _ in log.read(last)] == [last]
