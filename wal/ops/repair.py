"""`agentwal repair`: a plan first (what is damaged, what would be cut or rebuilt, what is
backed up where), then the repair.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import wal
from wal.errors import LockedError
from wal.log import recovery
from wal.log.log import LOCK_NAME, take_lock
from wal.ops.segments import Skip, iter_log
from wal.ops.stateview import _StateSnapshot
from wal.ops.target import OpsError, Target, locate, lock_holder, locked_message, open_reader, open_writer
from wal.ops.transfer import dictionary_lines, framed, is_sealed, value_line
from wal.store.store import FOLLOWING_FILE, check_store_file

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
    if lock_holder(target.log_dir) is not None:
        # Refused as every writer command is: a running writer's log ends where it is writing, so
        # a plan made beside it means nothing ("sound, nothing to repair" exited 0).
        raise LockedError(locked_message(target, "repair"))
    scan = recovery.scan_directory(target.log_dir)
    segs = scan.segments
    good_last = segs[-1].last_lsn if segs else 0
    if scan.damage is not None:
        d = scan.damage
        # What the open's truncate will report, and past it what a salvage read finds (a later
        # segment whose header is unreadable, which the open does not read into).
        last_known = max(recovery.lost_range(target.log_dir, scan)[1] or 0, _last_lsn_past(target.log_dir, d.lsn))
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
    if target.is_store and os.path.exists(os.path.join(target.path, FOLLOWING_FILE)):
        # Its log and state are the archive's: a copy to make again from there, not to cut.
        plan.refuse = (f"{target.path} is a follower's directory (its {FOLLOWING_FILE} file): nothing was changed. "
                       "Follow the archive into a new directory (wal.follow restores it first), or restore it "
                       "(`agentwal restore`), rather than repair this copy")
        return plan
    if target.is_store:
        try:
            check_store_file(target.path, create=False)
        except (wal.CorruptionError, wal.FormatVersionError) as exc:
            plan.refuse = (f"{exc}. Nothing was changed: repair works on a store it can read the description of; "
                           "put STORE back from a backup first")
            return plan
        applied = 0
        unreadable: wal.CorruptionError | None = None
        if os.path.exists(os.path.join(target.state_dir, "data.mdb")):
            try:
                with open_reader(target) as store:
                    applied = store.stats()["applied_lsn"]
            except wal.CorruptionError as exc:
                # A damaged state (what `verify` sends here with --rebuild-state): an open checks
                # every entry of a small state, and refused it, so the rebuild it needs could
                # not be planned. Rebuilt, it is moved aside as it is (not exported: it cannot
                # be read).
                if not rebuild_state:
                    raise
                unreadable = exc
        first = segs[0].first_lsn if segs else 1
        if applied > good_last or rebuild_state:
            if first > 1 and unreadable is not None:
                # Not "export it": the export reads through the same open that refused the state.
                plan.refuse = (
                    f"the state is damaged ({unreadable}), and the log no longer starts at LSN 1 (oldest retained: "
                    f"{first}), so the state cannot be rebuilt from it. Nothing was changed. Put back the state "
                    "from a copy of the store, or restore the store from its object archive (`agentwal restore`)")
                return plan
            if first > 1 and applied <= good_last:  # asked for, on a sound store: nothing is wrong with it
                plan.refuse = (f"the log no longer starts at LSN 1 (oldest retained: {first}), so the state cannot be "
                               "rebuilt from it; nothing was changed (the log and the state agree: `agentwal verify` "
                               "says whether anything is damaged)")
                return plan
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
                   if applied > good_last else
                   f"asked for (--rebuild-state); the state is damaged: {unreadable}" if unreadable is not None else
                   "asked for (--rebuild-state)")
            plan.actions.append(f"rebuild the state from the log ({why}): move {target.state_dir} to "
                                f"{plan.state_backup_dir} and replay LSNs 1..{good_last}")
            if applied > good_last:
                plan.state_export = _free_name(os.path.join(target.path, f"state.backup-{stamp}.jsonl"))
                plan.actions.append(f"first export the old state (as of LSN {applied}) to {plan.state_export}; "
                                    "`agentwal import` it afterwards to put its newer values back as new commits")
    if plan.actions:
        plan.actions.insert(0, f"copy the log to {plan.backup_dir} first")
    return plan


def _last_lsn_past(log_dir: str, first: int) -> int:
    """The highest LSN any readable record from `first` on holds, reading past damage as `dump
    --salvage` does: a segment's own scan stops at its first damage, and the valid records after
    it (in the newest segment, the log's whole rest) are given up too, so the plan must say so."""
    last = 0

    def skipped(skip: Skip) -> None:
        nonlocal last
        if skip.lost is not None:
            last = max(last, skip.lost[1])

    for rec in iter_log(log_dir, first, salvage=True, on_skip=skipped, live=False):
        last = max(last, rec.lsn)
    return last


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


def _export_snapshot(target: Target, dest: str) -> int:
    """The LMDB state alone (no log: it is damaged), as export lines, fsynced; returns the key
    count. A sealed store's values are its envelopes, exported as `agentwal export` writes them
    (its dictionaries first, then {"key", "sealed"} lines), so `agentwal import` opens them: as
    plain values, the import put the ciphertexts back as every key's value."""
    sealed = is_sealed(target.path)
    snap = _StateSnapshot.open(target)
    count = 0
    try:
        with open(dest, "w", encoding="utf-8") as f:
            def lines() -> Iterator[str]:
                nonlocal count
                yield from dictionary_lines(target.path)
                for key, version, value in snap.items():
                    yield value_line(key, value, version, sealed=sealed)
                    count += 1
            for line in framed(lines()):
                f.write(line + "\n")
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
    # The writer lock is held from before the backups to the truncation (the log takes it over):
    # probed and let go, a writer started in between had its state moved from under it, and
    # the repair then failed as "nothing was changed" with the state set aside.
    try:
        lock_fd: int | None = take_lock(target.log_dir)
    except LockedError as exc:
        raise LockedError(locked_message(target, "repair")) from exc
    try:
        backup_log(target.log_dir, plan.backup_dir)
        if plan.state_export is not None:
            _export_snapshot(target, plan.state_export)
        if plan.rebuild_state and plan.state_backup_dir is not None and os.path.isdir(target.state_dir):
            os.replace(target.state_dir, plan.state_backup_dir)
        held, lock_fd = lock_fd, None  # the log's from here: closed with it, or by its failed open
        log = wal.Log.open(target.log_dir, recovery="truncate", _lock_fd=held, _store_log=True)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
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
