"""The shipper: one background thread per archived store that copies the log off the machine.

Loop (woken by a `replicated` commit, else every ``period``): read the records made durable
locally since the last object (`Log.read`, capped at the durable LSN) and PUT them as ONE
create-only group object (``log/<first>.wal``), so every commit waiting at `replicated`
meanwhile shares that PUT (group commit, as fdatasync is shared). Then, when due: a logical
snapshot of the state (one LMDB read transaction, shipped once the log objects reach its LSN,
so a snapshot never holds what the archive's log does not), and a merge of small group objects.

Contracts:
- Never blocks a commit at sync/interval/buffered: commits do not wait for it, except as the
  configured bound says (`admit`): when the archive lag passes ``archive_rpo_ms`` a commit
  waits for it to fall back (policy "block") or gets `ArchiveLagError` (policy "error").
- The object store down, slow or refusing: the PUT is retried with exponential backoff
  (50 ms .. 5 s), one ERROR log line per outage, one INFO line when shipping resumes.
- A create-only PUT that finds its name taken by another writer (a promoted follower): this
  writer is fenced. The store stops (`FailedError`, as after a failed fsync) and never ships again.
- `archived_lsn` only grows; a checkpoint never removes a segment above it (ArchivedStore).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wal.archive import layout
from wal.archive.objects import (
    ArchiveError,
    ArchiveUnavailableError,
    ObjectExistsError,
    ObjectMissingError,
    ObjectStore,
)
from wal.errors import FailedError, WalError

if TYPE_CHECKING:
    from wal.archive.store import ArchivedStore

_logger = logging.getLogger("wal.archive")

STATUS_FILE = "archive.json"  # in the store's directory: the shipper's state for `agentwal archive status`
MAX_OBJECT_BYTES = 16 << 20  # one group object holds at most this much log (more: several PUTs)
SMALL_OBJECT_BYTES = 1 << 20  # group objects below this are merged


class ArchiveLagError(WalError):
    """A commit was refused: the archive lags more than archive_rpo_ms (policy "error")."""


class Shipper:
    def __init__(self, store: ArchivedStore, objects: ObjectStore, *, rpo_ms: int, policy: str,
                 snapshot_bytes: int, merge_objects: int, archived: int, need_snapshot: bool,
                 last_snapshot: int, retention_s: float | None = None,
                 resolve: Callable[[], tuple[int, bool, int]] | None = None) -> None:
        self.store = store
        self.objects = objects
        self.rpo_ms = rpo_ms
        self.policy = policy
        self.snapshot_bytes = snapshot_bytes
        self.merge_objects = merge_objects
        self.retention_s = retention_s
        self._resolve = resolve  # set while the archive's end is unknown (unreachable at open)
        self._retained_at = time.monotonic()
        self._owner_checked_at = time.monotonic()
        self.writer_id = os.urandom(16)
        self.archived = archived
        self.fenced: FailedError | None = None
        self.error: str | None = None  # the current outage, if any
        self.last_snapshot = last_snapshot
        self._need_snapshot = need_snapshot
        self._pending_snapshot: tuple[int, bytes] | None = None  # (lsn, encoded) waiting for the log
        self._bytes_since_snapshot = 0
        self._first_of_session: int | None = None  # never merged away: it fences older writers
        self._unmerged: list[tuple[int, int, int]] = []  # (first, last, size) shipped since this writer opened
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = False
        self._samples: collections.deque[tuple[int, float]] = collections.deque()
        self._samples.append((archived, time.monotonic()))
        self._started = time.monotonic()
        self._status_at = 0.0
        self.counters = collections.Counter[str](dict.fromkeys(
            ("archive_puts", "archive_put_bytes", "archive_put_errors", "archive_objects", "archive_snapshots",
             "archive_merges", "archive_deletes", "archive_gets"), 0))
        self._thread = threading.Thread(target=self._run, name=f"agentwal-archive:{store.path}", daemon=True)

    # ---- control ------------------------------------------------------------------------------

    @property
    def period(self) -> float:
        return max(0.005, min(self.rpo_ms / 4000, 0.25))

    def start(self) -> None:
        self._thread.start()

    def kick(self) -> None:
        self._wake.set()

    def stop(self, flush_timeout: float) -> None:
        """Ship what is durable (waiting at most flush_timeout), then end the thread."""
        deadline = time.monotonic() + flush_timeout
        log = self.store._log
        if log is not None and self.fenced is None and self._thread.is_alive():
            target = log.watermarks.durable
            with self._cond:
                while self.archived < target and self.fenced is None and time.monotonic() < deadline:
                    self._wake.set()
                    self._cond.wait(0.05)
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self.write_status()

    # ---- waiting ------------------------------------------------------------------------------

    def wait_archived(self, lsn: int) -> None:
        """Until the archive holds lsn (a `replicated` commit); FailedError once fenced or stopped."""
        if self.archived >= lsn:
            return
        self._wake.set()
        with self._cond:
            while self.archived < lsn:
                if self.fenced is not None:
                    raise FailedError(str(self.fenced)) from self.fenced
                if self._stop:
                    raise FailedError(f"the archive of {self.store.path} stopped before LSN {lsn} was shipped")
                self._cond.wait(0.5)

    async def wait_archived_async(self, lsn: int) -> None:
        import asyncio  # noqa: PLC0415

        if self.archived < lsn:
            await asyncio.to_thread(self.wait_archived, lsn)

    def lag_ms(self) -> float:
        """Upper bound on the age of the oldest commit not yet in the archive (0 if none)."""
        log = self.store._log
        if log is None:
            return 0.0
        now = time.monotonic()
        appended = log.watermarks.appended
        archived = self.archived
        with self._cond:
            self._samples.append((appended, now))
            # Keep the newest sample whose LSN is archived: every unarchived commit came after it.
            while len(self._samples) > 1 and self._samples[1][0] <= archived:
                self._samples.popleft()
            if appended <= archived:
                return 0.0
            lsn, at = self._samples[0]
            return (now - (at if lsn <= archived else self._started)) * 1000

    def admit(self) -> None:
        """The archive_rpo_ms bound, before a commit: wait (policy "block") or refuse ("error")."""
        if self.fenced is not None:
            raise FailedError(str(self.fenced)) from self.fenced
        if self.lag_ms() <= self.rpo_ms:
            return
        if self.policy == "error":
            raise ArchiveLagError(
                f"the archive of {self.store.path} lags {self.lag_ms():.0f} ms, over archive_rpo_ms="
                f"{self.rpo_ms} ({self.error or 'shipping is behind'}); the commit was not made. Retry later, "
                "or open with archive_policy='block' to wait instead")
        self._wake.set()
        with self._cond:
            while self.lag_ms() > self.rpo_ms and self.fenced is None and not self._stop:
                self._cond.wait(0.05)
        if self.fenced is not None:
            raise FailedError(str(self.fenced)) from self.fenced

    # ---- the thread ---------------------------------------------------------------------------

    def write_status(self) -> None:
        """archive.json in the store's directory (FORMAT.md): what `agentwal archive status` and
        `agentwal info` show from another process. Informational: written by rename, not synced."""
        self._status_at = time.monotonic()
        data = {k: v for k, v in self.stats().items() if k != "archive_puts_per_s"}
        data.update({"pid": os.getpid(), "updated_unix_ms": time.time_ns() // 1_000_000})
        path = os.path.join(self.store.path, STATUS_FILE)
        with contextlib.suppress(OSError):
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(path + ".tmp", path)

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop:
            self._wake.wait(self.period)
            self._wake.clear()
            self.lag_ms()  # a sample: the lag's bound stays tight between commits
            if time.monotonic() - self._status_at >= 1.0:
                self.write_status()
            try:
                if self._resolve is not None:
                    archived, self._need_snapshot, self.last_snapshot = self._resolve()
                    self._resolve = None
                    self._publish(archived)
                while self._ship_once():
                    pass
                if self.error is not None or time.monotonic() - self._owner_checked_at > 10:
                    self._check_still_writer()
                self._snapshot_if_due()
                self._merge_if_due()
                self._retain_if_due()
                self._reachable()
                backoff = 0.05
            except ObjectExistsError as exc:
                self._fence(exc)
                return
            except FailedError as exc:  # resolved late: this store does not continue the archive
                self._stop_with(exc)
                return
            except ArchiveError as exc:
                self.counters["archive_put_errors"] += 1
                if self.error is None:
                    _logger.error("archive %s unreachable, retrying with backoff (commits are kept locally; "
                                  "archived LSN %d): %s", self.objects.url, self.archived, exc)
                self.error = str(exc)
                with self._cond:
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # a closed log, a damaged local segment: stop shipping, say why
                if self._stop:
                    return
                self.error = f"{type(exc).__name__}: {exc}"
                _logger.error("archive shipping of %s stopped: %s", self.store.path, exc)
                with self._cond:
                    self._cond.wait(1.0)

    def _fence(self, exc: ObjectExistsError) -> None:
        self._stop_with(FailedError(
            f"the store in {self.store.path} was fenced: another writer now ships into {self.objects.url} "
            f"(a follower was promoted; {exc}). Its LSNs above {self.archived} were never archived; it stops "
            "rather than diverge. Restore or follow the archive to continue."))

    def _stop_with(self, exc: FailedError) -> None:
        self.fenced = exc
        _logger.error("%s", self.fenced)
        self.store._fenced(self.fenced)
        self.write_status()
        with self._cond:
            self._cond.notify_all()

    def _publish(self, last: int) -> None:
        with self._cond:
            self.archived = last
            self._cond.notify_all()
        self.store._archived_moved(last)

    def _ship_once(self) -> bool:
        """PUT one group object of what is durable and not archived; False if nothing was."""
        log = self.store._log
        assert log is not None
        marks = log.watermarks
        durable = marks.durable
        if marks.appended > durable and self.lag_ms() > self.rpo_ms / 2:
            # Only durable records are shipped (an archive ahead of a log that a crash cut back
            # would refuse the store). At interval/buffered the log syncs every rpo_ms; when
            # that would make the archive miss its own bound, sync now.
            log.sync()
            durable = log.watermarks.durable
        if durable <= self.archived:
            return False
        records: list[tuple[int, bytes]] = []
        size = 0
        for lsn, payload in log.read(self.archived + 1):
            if lsn > durable:
                break
            records.append((lsn, payload))
            size += len(payload) + 16
            if size >= MAX_OBJECT_BYTES:
                break
        if not records or records[0][0] != self.archived + 1:
            raise ArchiveUnavailableError(
                f"the local log of {self.store.path} no longer holds LSN {self.archived + 1}, the next to ship")
        data = layout.encode_log(records, self.writer_id)
        name = layout.log_name(records[0][0])
        try:
            self._put(name, data)
        except ObjectExistsError:
            # Ours from an attempt whose answer was lost (a timeout after the store took it)?
            obj = layout.decode_log(self._get(name), name)
            if obj.writer_id != self.writer_id:
                raise
            records = records[: obj.last - obj.first + 1]
        first, last = records[0][0], records[-1][0]
        self.counters["archive_objects"] += 1
        self._bytes_since_snapshot += len(data)
        if self._first_of_session is None:
            self._first_of_session = first
        elif len(data) < SMALL_OBJECT_BYTES:
            self._unmerged.append((first, last, len(data)))
        self._publish(last)
        return True

    def _reachable(self) -> None:
        """After a request succeeded: the outage (if any) is over."""
        if self.error is not None:
            _logger.info("archive %s reachable again: shipping resumed (archived LSN %d)",
                         self.objects.url, self.archived)
            self.error = None

    def _put(self, name: str, data: bytes, *, create_only: bool = True) -> None:
        try:
            self.objects.put(name, data, create_only=create_only)
        finally:
            self.counters["archive_puts"] += 1
        self.counters["archive_put_bytes"] += len(data)
        self._reachable()

    def _get(self, name: str) -> bytes:
        self.counters["archive_gets"] += 1
        return self.objects.get(name)

    # ---- snapshots ----------------------------------------------------------------------------

    def _snapshot_if_due(self) -> None:
        if self._pending_snapshot is None and (self._need_snapshot
                                               or self._bytes_since_snapshot >= self.snapshot_bytes):
            self._pending_snapshot = self.store._logical_snapshot(self.writer_id)
            self._need_snapshot = False
            self._bytes_since_snapshot = 0
        if self._pending_snapshot is not None and self._pending_snapshot[0] <= self.archived:
            lsn, data = self._pending_snapshot
            # Exists: the same LSN's state, shipped before (by this writer or the one it continues).
            with contextlib.suppress(ObjectExistsError):
                self._put(layout.snap_name(lsn), data)
            self._pending_snapshot = None
            self.last_snapshot = max(self.last_snapshot, lsn)
            self.counters["archive_snapshots"] += 1

    # ---- merging ------------------------------------------------------------------------------

    def _merge_if_due(self) -> None:
        """Merge the oldest `merge_objects` small group objects shipped since this writer opened into one object,
        then delete them, so the object count grows by one per merge_objects PUTs. Never merged
        away: the session's first object (its name fences writers older than this one) and the
        archive's newest object (a follower that lists only names after its own LSN and finds
        nothing knows from it that nothing is new: wal/archive/follow.py)."""
        if len(self._unmerged) <= self.merge_objects:
            return
        batch = self._unmerged[: self.merge_objects]
        # Only a consecutive run (a restart mid-session would not break one, but be sure).
        run = [batch[0]]
        for item in batch[1:]:
            if item[0] != run[-1][1] + 1:
                break
            run.append(item)
        records: list[tuple[int, bytes]] = []
        for first, _, _ in run:
            name = layout.log_name(first)
            try:
                records.extend(layout.decode_log(self._get(name), name).records)
            except ObjectMissingError:  # removed by retention meanwhile: nothing to merge there
                del self._unmerged[: len(run)]
                return
        first, last = run[0][0], run[-1][1]
        merged = layout.merged_name(first, last)
        try:
            self._put(merged, layout.encode_log(records, self.writer_id))
        except ObjectExistsError:
            layout.decode_log(self._get(merged), merged)  # there and sound: a retry of this merge
        for f, _, _ in run:
            self.objects.delete(layout.log_name(f))
            self.counters["archive_deletes"] += 1
        del self._unmerged[: len(run)]
        self.counters["archive_merges"] += 1

    def _check_still_writer(self) -> None:
        """One LIST: no object may start after this writer's archived LSN but its own next one.
        Catches a takeover while this writer was cut off (an outage, a long pause) before its next
        PUT would, and one whose fence object retention has since deleted."""
        self._owner_checked_at = time.monotonic()
        for name, _ in self.objects.list(layout.LOG_PREFIX, layout.log_name(self.archived)):
            parsed = layout.parse_name(name)
            if parsed is not None and parsed.first > self.archived:
                raise ObjectExistsError(f"{self.objects.url}/{name} was written by another writer")

    # ---- retention ----------------------------------------------------------------------------

    def _retain_if_due(self) -> None:
        """Delete what a restore to any time within the last `retention_s` does not need: every
        snapshot older than the newest one written before the window, and every log object wholly
        at or below that snapshot's LSN. Checked every retention_s / 10 (at most once a minute)."""
        if self.retention_s is None:
            return
        now = time.monotonic()
        if now - self._retained_at < min(self.retention_s / 10, 60.0):
            return
        self._retained_at = now
        cutoff = time.time() - self.retention_s
        snaps = sorted((layout.parse_name(n), n, t) for n, t in self.objects.list_times(layout.SNAP_PREFIX)
                       if layout.parse_name(n) is not None)
        before = [(p.first, n) for p, n, t in snaps if p is not None and t <= cutoff]
        if not before:
            return
        base = before[-1][0]
        for _, name in before[:-1]:
            self.objects.delete(name)
            self.counters["archive_deletes"] += 1
        from wal.archive.plan import list_archive  # noqa: PLC0415

        self._unmerged = [u for u in self._unmerged if u[1] > base]  # the merger must not look for them
        for piece in list_archive(self.objects).logs:
            # Never the newest object, nor one whose end is unknown.
            if piece.last is not None and piece.last <= base and piece.last < self.archived:
                self.objects.delete(piece.name)
                self.counters["archive_deletes"] += 1

    def stats(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        out: dict[str, Any] = dict(self.counters)
        out.update({
            "archive_url": self.objects.url,
            "archived_lsn": self.archived,
            "archive_lag_ms": self.lag_ms(),
            "archive_rpo_ms": self.rpo_ms,
            "archive_puts_per_s": self.counters["archive_puts"] / elapsed,
            "archive_last_snapshot_lsn": self.last_snapshot,
            "archive_error": self.error,
            "archive_fenced": self.fenced is not None,
        })
        return out
