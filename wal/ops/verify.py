"""`agentwal verify`: every record of the log and every entry of the state checked, problems listed with where they are.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from wal.errors import CorruptionError, FormatVersionError, WalError
from wal.log import record, recovery
from wal.ops.render import render_bytes, text_preview
from wal.ops.segments import (
    SegmentInfo,
    _close_segments,
    _first_lsn_of,
    _open_segments,
    _scan_segments,
    _Seg,
    iter_log,
)
from wal.ops.stateview import _StateSnapshot
from wal.ops.target import Progress, Target, _extra_files, locate, lock_holder
from wal.store.state import check_meta_pages, read_checkpoint
from wal.store.store import STORE_FILE, check_store_file

# ---- verify ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where ("log", "state", or "store": the STORE file), the file and offset or key, and what."""

    area: Literal["log", "state", "store"]
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
        elif s.status != "sealed" and s.header_ok and recovery.cut_below_creation(s.size, s.prealloc_bytes):
            # S6, as an open checks it: no crash leaves a segment shorter than it was created, so
            # what looks like a torn tail (or a clean end) here is a cut that took records with it.
            report.problems.append(Problem(
                "log", f"segment truncated: {s.path} is {s.size} bytes but was created with {s.prealloc_bytes}; "
                       f"records after LSN {s.last_lsn} may have been cut off (no crash leaves this)",
                s.path, s.end_offset, s.last_lsn + 1))
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
    store_file_ok = True
    if target.is_store:
        try:
            check_store_file(target.path, create=False)
        except (CorruptionError, FormatVersionError) as exc:
            report.problems.append(Problem("store", str(exc), os.path.join(target.path, STORE_FILE)))
            store_file_ok = False
    if target.is_store and store_file_ok:
        try:
            snapshot = _StateSnapshot.open(target)  # before the log: the log then holds all it reflects (I1)
        except WalError as exc:
            report.problems.append(Problem("state", f"cannot open the state: {exc}"))
        else:
            try:  # what a writable open refuses and a read-only one does not look at
                saved = read_checkpoint(target.state_dir)
                if saved is not None:
                    check_meta_pages(target.state_dir, saved)
            except CorruptionError as exc:
                report.problems.append(Problem("state", str(exc)))
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
    log_damaged = any(p.area == "log" for p in report.problems)
    if applied > last and log_damaged:
        then = ("a repair that keeps the log up to there rebuilds the state from it, exporting the old state's "
                "newer values first" if first <= 1 else
                f"the log no longer starts at LSN 1 (oldest retained: {first}), so no repair can rebuild the state "
                "from it")
        report.problems.append(Problem(
            "state", f"the state reflects LSN {applied}, past the log's damage (its last good record is LSN "
                     f"{last}): {then}", lsn=last + 1))
    elif applied > last:
        report.problems.append(Problem(
            "state", f"the state reflects LSN {applied} but the log ends at LSN {last}: the log lost records "
                     "the state was built from (invariant I1 broken from outside agentwal?)", lsn=last + 1))
    if report.segments and applied + 1 < first and last > applied:
        report.problems.append(Problem(
            "state", f"the state reflects LSN {applied} but the oldest retained record is LSN {first}: segments "
                     f"holding LSNs {applied + 1}..{first - 1} are missing", lsn=applied + 1))
    report.records_to_replay = max(0, last - applied)
    if log_damaged:
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
