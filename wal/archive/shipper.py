"""The shipper: one background thread per archived store that copies the log off the machine.

Loop (woken by a `replicated` commit that finds a PUT slot free, a PUT that failed or whose
answer its thread did not take in, a merge due, else every ``period``): while fewer than
``puts_in_flight`` PUTs are in flight, read the records made durable locally and not yet handed
to a PUT (`Log.read`, capped at the durable LSN) and PUT them as ONE create-only group object
(``log/<first>.wal``), so every commit made meanwhile shares that PUT (group commit, as
fdatasync is shared: under load, the records that pile up while the PUTs are in flight make the
next object). PUTs are answered in any order; the archived LSN only moves over a gap-free run
of stored objects (`_harvest`), so a `replicated` commit is acknowledged only once its object
and every object before it are stored. Threads wait for that in C, on the log's archive
watermark (native/commit.c: a put at a `replicated` store waits there for its fdatasync too,
in the same call); coroutines on a future of their loop that the same watermark resolves
(`Log.wait_archived_async`). A PUT's thread takes its answer in itself (`_put_log`); at a store
whose level is `replicated` it wakes the commits it acknowledged and gathers the next group
(`_gather`: the next PUT waits, at most half a PUT's latency, for them to be committed again,
then for their fdatasync), elsewhere it sends the next PUT first. A PUT that failed is
retried with the same name and bytes (names stay immutable). Beside it, one maintenance job
at a time in its own thread: a logical snapshot of the state (one LMDB read transaction,
shipped once the log objects reach its LSN, so a snapshot never holds what the archive's log
does not), merges of small group objects (from the bytes kept in memory, not read back),
retention, and the owner check.

Contracts:
- Never blocks a commit at sync/interval/buffered: commits do not wait for it, except as the
  configured bound says (`admit`): when the archive lag passes ``archive_rpo_ms`` a commit
  waits for it to fall back (policy "block") or gets `ArchiveLagError` (policy "error").
- The object store down, slow or refusing: the PUT is retried with exponential backoff
  (50 ms .. 5 s, or a quarter of archive_rpo_ms if less: `max_backoff`), one ERROR log line per
  outage, one INFO line when shipping resumes.
- A create-only PUT that finds its name taken by another writer's object is decided once every
  object of this writer before it is stored (until then, an earlier PUT of this writer may be
  the one a fence took): an object sent with nothing of its writer in flight (behind 0: a
  promoted follower's fence, another writer's first object) or one continuing its own writer's
  chain means this writer is fenced: the store stops (`FailedError`, as after a failed fsync) and
  never ships again. An object sent with behind >= 1 right after this writer's own objects is a
  *stray* of a writer fenced earlier (FORMAT.md §18): it is deleted and the PUT sent again.
- `archived_lsn` only grows; a checkpoint never removes a segment above it (ArchivedStore).
- A writer session's first object is PUT alone (it is what fences older writers); only once it
  is stored are the objects of an earlier writer's unfinished tail deleted (FORMAT.md §18: none
  of them can ever complete a gap-free run now) and more PUTs sent in flight.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import json
import logging
import math
import os
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from wal._fs import replace_durably
from wal.archive import layout
from wal.archive.objects import (
    ArchiveError,
    ArchiveUnavailableError,
    ObjectExistsError,
    ObjectMissingError,
    ObjectStore,
)
from wal.archive.plan import Piece, merged_holding
from wal.archive.spool import SpooledSnapshot
from wal.errors import ArchiveLagError, CorruptionError, EncryptionKeyError, FailedError, NoSpaceError, WalError
from wal.store.store import ARCHIVE_STATUS_FILE

if TYPE_CHECKING:
    from wal.archive.store import ArchivedStore

_logger = logging.getLogger("wal.archive")

MAX_OBJECT_BYTES = 16 << 20  # one group object holds at most this much log (more: several PUTs)
SMALL_OBJECT_BYTES = 1 << 20  # group objects below this are merged
# Until the shipper has measured its rate, a group object holds at most this much log; then what
# one PUT ships in a quarter of archive_rpo_ms (within MAX_OBJECT_BYTES, at least this much).
FIRST_OBJECT_BYTES = 1 << 20
# Until measured, the shipper's rate is taken to be this at archive_policy="block": a slow object
# store, so that the first commits of a session cannot build a backlog the store takes longer than
# archive_rpo_ms to receive (they wait for the first objects, which measure it: milliseconds on a
# store that keeps up). The bytes per record are the log's own until the first object is stored
# (`Log.bytes_per_record`), this before the log has written any. A record of this size assumed
# until the first object was stored held `sync` commits back after about 1,400 small ones when the
# object store was down from the start: 60 KiB of log estimated as 45 MiB. At "error" nothing is
# assumed: a commit is refused for a lag measured, never for a guess.
ASSUMED_RATE = 1e6
ASSUMED_RECORD_BYTES = 32 << 10
MERGE_MEMORY_BYTES = 32 << 20  # small objects' bytes kept for merging (beyond: read back)
_SNAPSHOT_SPACE_RETRY_S = 60.0  # a snapshot the disk had no room for is tried again after this
# A request unanswered this long is shown as waiting (`agentwal archive status`): an object
# store that stopped answering without refusing (a frozen server, a dropped connection) fails a
# request only at the client's timeout, 30 s or more, and until then no error says why the lag grows.
SLOW_REQUEST_S = 5.0


# How often a commit takes a lag sample (Shipper.admit): often enough that the bound it gives is
# within a millisecond of the truth, rarely enough that 64 committing threads do not queue on
# the shipper's lock.
_SAMPLE_EVERY_S = 0.001
# How often a commit held back by archive_rpo_ms (policy "block") asks again (Shipper.admit).
ADMIT_POLL_S = 0.05


# PUTs a stopped shipper left in flight, by archive URL. Such a PUT may still store its object
# after the store closed; a writer reopened on the same archive in this process that read the
# archive's end before it landed would then find its own first name taken by the writer it
# resumed after, and stop as fenced. So an archived open waits for them first
# (`wait_for_lingering_puts`). (Another process's PUT, sent just before it was killed, can land
# as late: that case stops the new writer as fenced, FORMAT.md §18.)
_lingering: dict[str, list[concurrent.futures.Future[Any]]] = {}
_lingering_lock = threading.Lock()


def wait_for_lingering_puts(url: str, timeout: float) -> bool:
    """Wait (at most `timeout` seconds) for the PUTs stopped shippers of this process left in
    flight to the archive at `url`; False if some are still running."""
    with _lingering_lock:
        futures = [f for f in _lingering.pop(url, []) if not f.done()]
    if not futures:
        return True
    _, running = concurrent.futures.wait(futures, timeout=timeout)
    if running:
        with _lingering_lock:
            _lingering.setdefault(url, []).extend(running)
    return not running


class _DaemonPool:
    """Threads running submitted calls, each answered through a `concurrent.futures.Future`.
    Daemon threads, unlike ThreadPoolExecutor's: a PUT hanging on an unreachable object store
    (botocore's timeouts run to a minute) never holds up the interpreter's exit; whatever it was
    shipping is durable in the local log."""

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...]]
                                       | None] = queue.SimpleQueue()
        self._workers = workers
        self._name = name
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._threads.append(thread)
                thread.start()
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever reads the future
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Calls not started are cancelled; running ones finish on their own; the threads end."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)


class Resolved(NamedTuple):
    """Where the archive ends for a writer that opens it (wal/archive/store.py `_resolve`)."""
    archived: int  # the archive's end: this writer's first object holds archived + 1
    need_snapshot: bool
    last_snapshot: int
    tail: list[Piece]  # objects past the end: unfinished tails and strays, deleted after the first PUT
    writer: bytes | None  # writer_id of the object ending at `archived` (None: none, or not known)
    # Log the archive holds past its newest snapshot: the next snapshot is due once this and what
    # is shipped from here on reach archive_snapshot_bytes (else a store reopened more often than
    # that much log is shipped would never be snapshotted again, nor its history released).
    since_snapshot_bytes: int = 0
    # The archive holds no state this writer's log continues from: no snapshot, and its log does
    # not reach back to LSN 1 (a store with history from before its archive), or it ends before
    # the store's log begins. Nothing shipped can be restored until the base snapshot is stored,
    # so no commit is acknowledged at `replicated` before then (Shipper._ack_held_at).
    base_missing: bool = False


class NameTakenError(ObjectExistsError):
    """A create-only PUT of a group object found its name taken by another writer's object
    (`taken`: it, decoded)."""

    def __init__(self, message: str, taken: layout.LogObject) -> None:
        super().__init__(message)
        self.taken = taken


# A name taken by strays again and again (a fenced writer re-sending one it believes failed)
# is cleared at most this many times before this writer gives up as fenced.
_STRAY_CLEARS = 16
# An object this writer cannot read is never one of its own: damaged, or sealed under a key it
# was not given (a follower promoted under a rotated key set seals its fence under the new key).
_NOT_OURS = (CorruptionError, EncryptionKeyError)

# Retention reads the headers of the snapshots an object store lists up to this long after the
# window's start (its listed times are rounded to the second, and by its own clock).
_LISTED_TIME_SLACK_S = 60.0
# A write's temporary file in a folder archive older than this is one its process left dying:
# no PUT takes an hour, and an old writer's PUT still under way keeps its file.
_STALE_TEMPORARY_S = 3600.0


# A commit admitted this close (seconds) before the next PUT goes out is taken to miss it: its
# append and fdatasync may come after that PUT has read the log (`Shipper.new_commit_ms`).
_DISPATCH_MISS_S = 0.05
# A gather (Shipper._gather) waits at most this part of a PUT's latency (its moving average),
# within these bounds: a gather that waits for commits that do not come back costs the commits
# already gathered at most half a PUT, and a PUT that carries twice the commits halves the
# requests the object store serves.
_GATHER_PART = 0.5
_GATHER_MIN_S = 0.0005
_GATHER_MAX_S = 0.010
_GATHER_ROUNDS = 100  # gathers in a row that found nothing durable to send (`_gather`)

# Merges one maintenance job makes at most (then snapshots, retention and the owner check get
# their turn): at 400 PUTs/s and 32 objects a merge, 13 are due a second and jobs run about 4.
_MERGES_PER_JOB = 8


def _stopped_before(path: str, lsn: int) -> str:
    """Why a `replicated` commit was not acknowledged: the store closed before its archive took it."""
    return (f"the archive of {path} stopped before LSN {lsn} was shipped (the store was closed): the commit is not "
            "acknowledged at replicated, but it is durable in the local log and ships when the store is next opened "
            "with the archive, unless this machine is lost first")


class Shipper:
    def __init__(self, store: ArchivedStore, objects: ObjectStore, *, rpo_ms: int, policy: str,
                 snapshot_bytes: int, merge_objects: int, archived: int, need_snapshot: bool,
                 last_snapshot: int, retention_s: float | None = None,
                 resolve: Callable[[], Resolved] | None = None,
                 tail: list[Piece] | None = None, puts_in_flight: int = 1, end_writer: bytes | None = None,
                 since_snapshot_bytes: int = 0, shipped_before: int = 0, base_missing: bool = False) -> None:
        self.store = store
        self.objects = objects
        self.rpo_ms = rpo_ms
        # Commits are admitted while the archive lags at most this much, as a log's appenders
        # wait at 3/4 of rpo_ms: the rest of the bound is left for what was acknowledged before
        # to reach the archive. What reaches it past rpo_ms all the same is an overrun,
        # counted and logged (`_advance`): the window never widens silently.
        self.admit_ms = rpo_ms * 3 / 4
        # What the commits waiting for the archive will take to reach it: the shipper's rate
        # (bytes per second of the PUTs of at least FIRST_OBJECT_BYTES / 4, a moving average;
        # ASSUMED_RATE until one) and the log's bytes per record (from the objects sent) give the time to
        # ship every commit not archived yet (`_drain_ms`, refreshed with each lag sample). A
        # commit is admitted while the oldest commit's age plus that time is within admit_ms,
        # and a group object holds what one PUT ships in a quarter of rpo_ms (`_object_bytes`).
        # The age alone let a backlog build, and 16 MiB objects, that the object store could not
        # take within the bound where it was the bottleneck (commits reached it seconds past it).
        # Estimates, moved by the PUT threads without a lock: an update lost between two is harmless.
        self._ship_rate = 0.0
        self._record_bytes = 0.0
        self._drain_ms = 0.0
        self._overrun_logged_at = -math.inf
        # LSNs of commits acknowledged only once archived on a store whose level is not
        # `replicated` (durability="replicated" per commit), not archived yet: no overrun is
        # theirs (`note_waited`, `_acknowledged_early`). Under _cond.
        self._waited: set[int] = set()
        self.policy = policy
        self.snapshot_bytes = snapshot_bytes
        self.merge_objects = merge_objects
        self.retention_s = retention_s
        self._resolve = resolve  # set while the archive's end is unknown (unreachable at open)
        # The first maintenance job applies retention: a writer whose sessions are shorter than
        # the period (retention_s / 10) still deletes what the window no longer needs.
        self._retained_at = -math.inf
        self._swept = False  # the archive's stale temporary files removed, once per open
        self._snapshots_taken: dict[str, int] = {}  # snapshot name -> its header's taken_ms (retention)
        self._owner_checked_at = time.monotonic()
        self.writer_id = os.urandom(16)
        self.archived = archived
        # The archived LSN as the log's archive watermark has it (`_wake_threads`): what reads
        # and waits see. `archived` moves first, under the Condition; a commit that found its
        # LSN there returned before a read in its thread could see it (a stale read after an
        # acknowledged `replicated` commit), so the waits' shortcut reads this one.
        self.published = archived
        self.fenced: FailedError | None = None
        self.error: str | None = None  # the current outage, if any
        self._error_lock = threading.Lock()  # its start and end, each logged once
        self.last_snapshot = last_snapshot
        self._need_snapshot = need_snapshot
        # A snapshot that was needed and found its LSN's name taken (after a rotation: the
        # archive's newest snapshot, at the state's LSN, under the old key): the need holds, and
        # the next is taken once the state passes this LSN.
        self._needed_snapshot_after = -1
        self._pending_needed = False  # the pending snapshot was taken for `_need_snapshot`
        self._pending_snapshot: SpooledSnapshot | None = None  # waiting for the log up to its LSN
        # While the archive has no base to restore from (Resolved.base_missing): the watermark
        # `replicated` acknowledges up to stays here until the snapshot that makes one is stored.
        self._ack_held_at: int | None = archived if base_missing else None
        self._snapshot_retry_at = 0.0  # no snapshot is spooled before this (monotonic): a full disk
        self._space_logged_at = -math.inf
        self._bytes_since_snapshot = since_snapshot_bytes  # Resolved.since_snapshot_bytes
        self._first_of_session: int | None = None  # never merged away: it fences older writers
        # (first, last, size, bytes or None) of small group objects stored since this writer
        # opened, in LSN order; the bytes are kept (up to MERGE_MEMORY_BYTES) for merging.
        self._unmerged: list[tuple[int, int, int, bytes | None]] = []
        self._unmerged_bytes = 0
        self._unmerged_lock = threading.Lock()
        self._tail = list(tail or ())  # an earlier writer's unfinished tail, deleted after our first PUT
        # The writer_id of the object ending where this writer began (None: none, or not known):
        # a name taken right after it by an object continuing that writer's chain fences us.
        self._end_writer = end_writer
        # First LSNs of PUTs whose name another writer's object took, waiting to be decided
        # (module docstring) until every object of ours before them is stored; how many strays
        # were cleared from each name.
        self._collided: set[int] = set()
        self._cleared: collections.Counter[int] = collections.Counter()
        self._foreign: dict[str, layout.LogObject] = {}  # other writers' objects the owner check read
        self.puts_in_flight = puts_in_flight
        self._dispatched = archived  # the last LSN handed to a PUT
        # first LSN -> (last LSN, bytes, future, epoch sent in) of each PUT in flight, or waiting
        # (future None) to be sent again after a failure.
        self._inflight: dict[int, tuple[int, bytes, concurrent.futures.Future[int | None] | None, int]] = {}
        # first -> (last, bytes) of objects stored but not yet in the gap-free run (a PUT before
        # them is still in flight).
        self._stored: dict[int, tuple[int, bytes]] = {}
        self._retry_at = 0.0  # no PUT is retried before this (monotonic), during an outage
        self._backoff = 0.05
        self._epoch = 0  # one more per failed request: tells answers to requests sent since apart
        self._counter_lock = threading.Lock()  # counters move in the PUT and maintenance threads too
        # id -> (object name, when sent) of each PUT and GET not answered yet (`_request`).
        self._unanswered: dict[int, tuple[str, float]] = {}
        self._request_ids = itertools.count()
        # Guards the shipping state (_dispatched, _inflight, _stored, the outage state): taken by
        # the shipper thread, by a PUT thread once its PUT is answered (it publishes and sends the
        # next PUTs itself: no thread hand-off between an answer and the acknowledgements), and
        # by a committer waiting at `replicated` that finds it free (it sends the PUT for its own
        # commit). Lock order: _ship_lock, then _cond.
        self._ship_lock = threading.Lock()
        # One thread more than PUTs in flight: the thread whose PUT was answered wakes the commits
        # it acknowledged while another sends the next PUT. The wake (native/commit.c) lets the
        # GIL go, and the commits it wakes take it: a thread that sent the next PUT itself after
        # them waited for all of them (~3 ms at 64 threads) with its PUT slot idle.
        self._pool = _DaemonPool(puts_in_flight + 1, f"agentwal-archive-put:{store.path}")
        self._maint = _DaemonPool(1, f"agentwal-archive-maint:{store.path}")
        self._maint_job: concurrent.futures.Future[bool] | None = None
        self._maint_epoch = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        # Gathering (`_gather`): the appended LSN at which every thread the last stored object
        # released has committed again (the appended LSN before the wake plus the threads woken:
        # a hint, it only ever delays a PUT, never decides what it holds), whether a PUT thread
        # is gathering the next group, and the event the commit that reaches the target sets.
        self._gather_target = 0
        self._gathering = False
        self._gathered = threading.Event()
        self._put_ewma = 0.005  # seconds, the PUTs' latency (bounds a gather and admissions): `_latency_is`
        self._idle_fits = True
        self._latency_is(self._put_ewma)
        self._put_sent: dict[int, float] = {}  # PUTs in flight: first LSN -> when sent (monotonic)
        self._put_measured = False  # the first PUT's latency replaces the assumed one whole
        self._seed_latency()
        # PUTs answered whose threads have not sent the next yet (`_put_log`): a commit made
        # now may miss the next PUT. Changed by PUT threads with the GIL held (a read-modify-write
        # of an int attribute is not atomic, so under `_answers_lock`).
        self._answers_pending = 0
        self._answers_lock = threading.Lock()
        self._next_wake_at = time.monotonic()  # the shipper thread's next round (a dispatch)
        self._stop = False
        # While the archive's end is unknown (`resolve`: unreachable at the open), what this store's
        # own archive.json says it shipped before: the lag (and so what commits are admitted
        # under archive_rpo_ms) is counted from there, not from LSN 1 -- a store reopened during
        # an outage, with everything shipped, held back its first commit. Only the lag: nothing
        # is released or acknowledged as archived on its word.
        self._lag_floor = shipped_before if resolve is not None else 0
        self._samples: collections.deque[tuple[int, float]] = collections.deque()
        self._samples.append((self._lag_archived, self._carried_since(self._lag_archived)))
        self._started = time.monotonic()
        self._sampled_at = self._started
        self._status_at = 0.0
        self.counters = collections.Counter[str](dict.fromkeys(
            ("archive_puts", "archive_put_bytes", "archive_put_errors", "archive_objects", "archive_snapshots",
             "archive_merges", "archive_deletes", "archive_gets", "archive_rpo_overruns"), 0))
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
            durable = log.watermarks.durable
            if not self._await_archived(durable, deadline) and self.fenced is None:
                _logger.warning("archive %s: closing with LSNs %d..%d not shipped after %.1f s (%s); they stay in "
                                "the local log and ship at the next open with the archive: until then a loss of "
                                "this machine loses them", self.objects.url, self.archived + 1, durable,
                                flush_timeout, self.error or "the object store is slow")
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self._stop_waiters()
        # The maintenance job under way ends (within the deadline), and a snapshot waiting for
        # the log it needs goes out now that the log is in.
        job = self._maint_job
        if job is not None:
            concurrent.futures.wait([job], timeout=max(0.0, deadline - time.monotonic()))
        if self.fenced is None and (job is None or job.done()):
            try:
                # A snapshot still needed (a rotation's) is of the session's last commit: the
                # state applies what is durable first, as the store's close would.
                while self._need_snapshot and self.store._apply_ready():
                    pass
                self._snapshot_if_due()
            except Exception as exc:  # reported; the next writer ships a snapshot
                _logger.warning("archive %s: the snapshot due at close was not shipped: %s", self.objects.url, exc)
            if self.error is None:
                try:
                    self._merge_session_tail(deadline)
                except Exception as exc:  # the objects stay as they are: sound, only more of them
                    _logger.info("archive %s: the session's last objects were not merged at close: %s",
                                 self.objects.url, exc)
                if self._retained_at == -math.inf:  # a session too short for its first job to reach it
                    try:
                        self._retain_if_due()
                    except Exception as exc:  # the next session's first job applies it
                        _logger.info("archive %s: retention was not applied at close: %s", self.objects.url, exc)
        if job is None or job.done():  # else its file is the next archived open's to delete
            self._discard_pending_snapshot()
        # PUTs still in flight may finish after this: durable records, under create-only names.
        # A writer reopened on this archive in this process waits for them before it reads where
        # the archive ends (`wait_for_lingering_puts`).
        left = [entry[2] for entry in list(self._inflight.values()) if entry[2] is not None and not entry[2].done()]
        if left:
            with _lingering_lock:
                _lingering.setdefault(self.objects.url, []).extend(left)
        self._pool.shutdown()
        self._maint.shutdown()
        self.write_status()

    # ---- waiting ------------------------------------------------------------------------------

    def wait_archived(self, lsn: int, *, appended: bool = False) -> None:
        """Until the archive holds lsn (a `replicated` commit, durable locally, or, `appended`,
        appended without waiting: its fdatasync is waited for in the same C call, and a PUT
        thread gathers the group it joins, `_gather`); FailedError once fenced or stopped.

        Threads wait in C on the log's archive watermark (native/commit.c, "The archive's
        watermark"), which `_publish` moves: one futex sleep with the GIL released, woken by
        the stored object that acknowledges the commit and by no other. Waiting in Python (a
        lock per commit in a heap by LSN, woken as a tree) cost each of 64 committing threads
        a Condition, a heap push, a lock and two wakes of other threads, all with the GIL."""
        if self.published >= lsn and not appended:
            return
        if self._gathering and lsn >= self._gather_target:
            self._gathered.set()  # the last of the commits the gather waits for
        self._try_dispatch()
        log = self.store._log
        if log is None:
            raise FailedError(f"the store in {self.store.path} is closed")
        try:
            held = log._archive_wait(lsn)
        except WalError:
            if self.fenced is not None:  # the store stopped because it was fenced: say so
                raise FailedError(str(self.fenced)) from self.fenced
            raise
        if held:
            return
        if self.fenced is not None:
            raise FailedError(str(self.fenced)) from self.fenced
        raise FailedError(_stopped_before(self.store.path, lsn))

    def _group_complete(self) -> bool:
        """Every commit the last stored object released is appended again (`_gather_target`);
        the gather then waits for their fdatasync."""
        log = self.store._log
        return log is None or log.watermarks.appended >= self._gather_target

    def _gather_s(self) -> float:
        return max(_GATHER_MIN_S, min(_GATHER_MAX_S, _GATHER_PART * self._put_ewma))

    def _gather(self) -> None:
        """In a PUT thread with a slot free: wait until the next group is complete
        (`_group_complete`: the thread's commit that completes it sets `_gathered`), at most a fraction
        of a PUT's latency, then for its fdatasync (`Log.wait`: the one its commits lead or
        follow), then send it. The fdatasync's end is waited for here because nothing in Python
        sees it (it ends in C, in a committer or the flusher): a gather that waited for the log
        to settle had nobody to wake it then, and mostly ran to its bound.

        Why: with one PUT in flight, sending the next PUT the moment one is answered splits the
        committers in two halves that alternate (one half in the PUT, the other committing
        locally for the next one), so each commit waits for about two PUTs and each PUT carries
        about half of them. Waiting the short while the commits just acknowledged take to be
        committed again (their fdatasync) makes one group of all of them: a commit waits for
        about one PUT plus its fdatasync, and the object store gets half the PUTs."""
        rounds = 0
        try:
            while not self._stop:
                rounds += 1
                deadline = time.monotonic() + self._gather_s()
                while not self._stop:
                    self._gathered.clear()
                    if self._group_complete():
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._gathered.wait(left)
                log = self.store._log
                if log is not None and self.store._failure is None:
                    # The group is what is appended now: its records durable (the fdatasync its
                    # commits lead or follow), then sent. Coroutines' commits, which no target
                    # counts, too: else a gather that found them not durable yet sent nothing.
                    log.wait(log.watermarks.appended)
                with self._ship_lock:
                    sent = self._dispatched
                    self._dispatch()
                    sent = self._dispatched != sent or len(self._inflight) + len(self._stored) >= self.puts_in_flight
                # Nothing durable to send yet, but commits appended without waiting are on their
                # way (their threads wait in C, and only a PUT thread sends their group): again.
                # Not during an outage nor on a failed log (the shipper thread's rounds send what
                # is durable then), and not for ever: past _GATHER_ROUNDS, the shipper thread's.
                log = self.store._log
                if sent or log is None or self.fenced is not None or rounds >= _GATHER_ROUNDS \
                        or time.monotonic() < self._retry_at or self.store._failure is not None \
                        or log.watermarks.appended <= self._dispatched:
                    break
        except Exception:  # the shipper thread meets it again and handles it
            self._gathering = False
            self._wake.set()
        else:
            self._end_gathering()

    def _end_gathering(self) -> None:
        """`_gathering` off, then one more look. A commit appended while it was on found a gather
        under way and left its group to it (`_try_dispatch`); if the gather ended without it,
        the commit would wait for the shipper thread's next round (`period`: up to 250 ms).
        The commit reads `_gathering` after its append and this reads the appended LSN after
        clearing it, so one of the two sees the other."""
        self._gathering = False
        log = self.store._log
        if log is None or self._stop or self.fenced is not None or self.store._failure is not None \
                or time.monotonic() < self._retry_at:
            return
        if log.watermarks.appended > self._dispatched:
            self._try_dispatch()

    def _try_dispatch(self, *, gather: bool = True) -> None:
        """Send the PUTs due now from this thread if no other is at it, else wake the shipper.
        Anything that goes wrong is left to the shipper thread, which meets it again.

        With every PUT slot taken, nothing: the answer of a PUT in flight sends what is durable
        by then (`_put_log`), or a failed one wakes the shipper thread, so no commit is left
        behind; and 64 committers each waking the shipper thread (and through it the
        maintenance thread) made every PUT cycle pay for a few hundred needless runs of them."""
        if len(self._inflight) + len(self._stored) >= self.puts_in_flight:
            return
        if self._gathering:
            return
        log = self.store._log
        if gather and self.store._replicated and self._resolve is None and log is not None and not log._settled():
            # Commits are on their way into this group: a PUT thread gathers them, then sends.
            self._gathering = True
            self._pool.submit(self._gather)
            return
        if self._resolve is None and self.fenced is None and not self._stop \
                and self._ship_lock.acquire(blocking=False):
            try:
                self._dispatch()
                return
            except Exception:  # the shipper thread handles it (outage, fencing)
                pass
            finally:
                self._ship_lock.release()
        self._wake.set()

    def kick_for(self, lsn: int, *, appended: bool = False) -> None:
        """A coroutine's commit is about to wait for the archive to hold lsn (on its loop, through
        the log: `Log.wait_archived_async`): have it shipped. `appended`: appended without
        waiting, so not durable yet: a PUT thread gathers its group (`_try_dispatch`), as for a
        thread; else (durable) the PUT is sent now if a slot is free."""
        if self.archived < lsn or appended:
            self._try_dispatch(gather=appended)

    def failure_for(self, lsn: int) -> FailedError | None:
        """Why a commit waiting for lsn will never be archived by this shipper, if it will not:
        fenced, or stopped (closed) first."""
        if self.fenced is not None:
            return FailedError(str(self.fenced))
        if self._stop and self.archived < lsn:
            return FailedError(_stopped_before(self.store.path, lsn))
        return None

    def _carried_since(self, archived: int) -> float:
        """The lag's first sample's time (monotonic): now, unless the log holds commits past
        `archived` made before this open (by a session without the archive, or one that closed
        before shipping them): then when the oldest of them was made, from its stamp. Counted from
        the open, commits hours old read as a lag of a few milliseconds, and commits were
        admitted under archive_rpo_ms as if none were late."""
        now = time.monotonic()
        log = self.store._log
        if log is None or log.watermarks.durable <= archived:
            return now
        try:
            first = next(iter(log.read(archived + 1)), None)
        except WalError:  # unreadable here: the shipper meets it and says so
            return now
        if first is None or first[0] != archived + 1:
            return now
        age_s = max(0.0, time.time() - layout.time_of(first[1]) / 1000)
        return now - age_s

    def lag_ms(self) -> float:
        """Upper bound on the age of the oldest commit not yet in the archive (0 if none).

        A sample (appended LSN, t) with the LSN read after t says: every commit with a higher
        LSN was appended after t. So the newest sample whose LSN is archived bounds the age of
        every unarchived commit by now - t, however rarely samples are taken; sparser samples
        only make the bound looser, never smaller than the truth."""
        log = self.store._log
        if log is None:
            return 0.0
        now = time.monotonic()
        appended = log.watermarks.appended
        archived = self._lag_archived
        # Until the first object is stored, the log's own bytes per record (outside the lock: a
        # call into C that takes the log's mutex).
        local_record = log.bytes_per_record() if self.policy == "block" and not self._record_bytes else None
        with self._cond:
            self._samples.append((appended, now))
            self._sampled_at = now
            # Keep the newest sample whose LSN is archived: every unarchived commit came after it.
            while len(self._samples) > 1 and self._samples[1][0] <= archived:
                self._samples.popleft()
            rate, record = self._ship_rate, self._record_bytes
            if self.policy == "block":
                rate, record = rate or ASSUMED_RATE, record or local_record or ASSUMED_RECORD_BYTES
            self._drain_ms = (appended - archived) * record / rate * 1000 if rate else 0.0
            if appended <= archived:
                return 0.0
            lsn, at = self._samples[0]
            # A sample a committer took after `now` was read (waiting for the lock) says its
            # commits are younger than now: 0, not a negative age.
            return max(0.0, (now - (at if lsn <= archived else self._started)) * 1000)

    @property
    def _lag_archived(self) -> int:
        """The archived LSN the lag is counted from (`_lag_floor`)."""
        return max(self.archived, self._lag_floor)

    def admits_now(self) -> bool:
        """True if a commit may go ahead now (the archive_rpo_ms bound holds), False if it must
        wait or be refused (`admit` decides). Never blocks: asyncio commits ask it on the loop."""
        if self.fenced is not None:
            return False
        # Every commit passes here, from every thread: without taking the lock the waiters and
        # the PUT threads use, admit when the oldest kept sample is archived and young enough
        # (the bound from it is at least lag_ms's, see there), sampling about once a millisecond.
        now = time.monotonic()
        lsn, at = self._samples[0]
        if now - self._sampled_at < _SAMPLE_EVERY_S and lsn <= self.archived \
                and (now - at) * 1000 + self._drain_ms <= self.admit_ms and self._new_commit_fits(now):
            return True
        return self._bound_holds()

    def _seed_latency(self) -> None:
        """Before any PUT of its own is answered, take the PUTs' latency from the open's probe of
        the object store (`ObjectStore.check_create_only`): assumed at 5 ms, a store answering in
        0.6 s let every commit of the first PUT's time in, each to reach the archive two PUTs
        later."""
        probe = getattr(getattr(self.objects, "inner", self.objects), "probe_put_s", None)
        if probe is not None and not self._put_measured:
            # One request (a fresh bucket's first can be slow): the first PUT of its own
            # replaces it whole.
            self._latency_is(max(probe, 1e-4))

    def _latency_is(self, seconds: float) -> None:
        """The PUTs' latency estimate; with it, whether a commit made while no PUT is out fits
        the bound whatever the moment (`new_commit_ms` is then at most the shipper's round, or
        the miss margin, plus two PUTs): every commit asks, and this spares most of them the
        estimate's arithmetic on the commit path."""
        self._put_ewma = seconds
        self._idle_fits = (max(self.period, _DISPATCH_MISS_S) + 2 * seconds) * 1000 <= self.admit_ms

    def new_commit_ms(self, now: float) -> float:
        """How long a commit made now should take to reach the archive: until a PUT slot is free
        (the PUTs in flight answered, at the PUTs' usual latency) and then one PUT of its own.
        The lag bounds the commits acknowledged already; this one the commit being admitted.
        Against an object store that answers every PUT in 0.6 s, a commit admitted at a small
        lag waited for the PUT in flight and then its own, and reached the archive 1.2 s after
        it was acknowledged under archive_rpo_ms=1000."""
        sent, latency = self._put_sent, self._put_ewma
        # When the next PUT goes out: at the shipper thread's next round, or sooner at the
        # answer of a PUT in flight, whose thread sends the next.
        dispatch_in = max(0.0, self._next_wake_at - now)
        if sent:
            elapsed = now - min(sent.values(), default=now)
            latency = max(latency, elapsed)  # a PUT out this long takes at least as long
            answer_in = max(0.0, self._put_ewma - elapsed)
            # Every slot taken: the next PUT goes out at an answer, whatever the thread's round.
            dispatch_in = answer_in if len(sent) >= self.puts_in_flight else min(dispatch_in, answer_in)
        if self._answers_pending or dispatch_in < _DISPATCH_MISS_S:
            # Too close to a PUT going out (or one going out now): made durable after it reads
            # the log, the commit goes in the one after, a whole PUT later.
            dispatch_in += latency
        return (dispatch_in + latency) * 1000

    def _bound_holds(self) -> bool:
        """The archive_rpo_ms bound holds for a commit made now: the oldest commit not archived
        and what waits before it (`lag_ms`, its drain), and the new commit's own way there."""
        return self.lag_ms() + self._drain_ms <= self.admit_ms and self._new_commit_fits(time.monotonic())

    def _new_commit_fits(self, now: float) -> bool:
        """`new_commit_ms` within the bound -- or nothing to wait for: no PUT out and everything
        appended archived. A commit held back then would wait for a PUT that never goes out
        (an object store whose PUTs take longer than the bound allows, or a first estimate from
        a slow probe): it goes in, and reaches the archive late only if the store is that slow."""
        if (self._idle_fits and not self._put_sent) or self.new_commit_ms(now) <= self.admit_ms:
            return True
        if (self._put_ewma + 2 * _DISPATCH_MISS_S) * 1000 > self.admit_ms:
            # An object store this slow leaves no moment at which a commit could be admitted in
            # time: held back, commits got in one per PUT (a thread waited 20 s at 0.8 s PUTs).
            # They go in at the lag's pace, as before the latency was weighed, and reach the
            # archive late: counted in archive_rpo_overruns, each with a WARNING.
            return True
        log = self.store._log
        return not self._put_sent and not self._answers_pending and (log is None or
                                                                     self._lag_archived >= log.watermarks.appended)

    def admit(self) -> None:
        """The archive_rpo_ms bound, before a commit: wait (policy "block") or refuse ("error")."""
        if self.try_admit():
            return
        with self._cond:
            while not self._bound_holds() and self.fenced is None and not self._stop:
                self._cond.wait(ADMIT_POLL_S)
        if self.fenced is not None:
            raise FailedError(str(self.fenced)) from self.fenced

    def try_admit(self) -> bool:
        """`admit` without the wait: True if the commit may go ahead, False if it must wait
        (policy "block": the caller asks again every ADMIT_POLL_S; a coroutine sleeps between,
        so waiting commits hold no thread of the loop's default executor); raises as `admit`."""
        if self.fenced is not None:
            raise FailedError(str(self.fenced)) from self.fenced
        if self.admits_now():
            return True
        if self.policy == "error":
            lag = self.lag_ms()
            raise ArchiveLagError(
                f"the archive of {self.store.path} lags {lag:.0f} ms and needs about {self._drain_ms:.0f} ms more "
                f"to ship what waits (a commit made now about {self.new_commit_ms(time.monotonic()):.0f} ms: its "
                f"PUTs take {self._put_ewma * 1000:.0f} ms), past 3/4 of archive_rpo_ms={self.rpo_ms} (the rest is "
                "left for what was acknowledged to reach it; "
                f"{self.error or 'shipping is behind'}); the commit was not made. Retry later, "
                "or open with archive_policy='block' to wait instead")
        if self._stop:
            return True  # closing: what waits is shipped (or named) by the close
        self._wake.set()
        return False

    # ---- the thread ---------------------------------------------------------------------------

    def write_status(self) -> None:
        """archive.json in the store's directory (FORMAT.md): what `agentwal archive status` and
        `agentwal info` show from another process, and what an open without the archive reads to
        keep every segment the archive does not hold yet. So it is made durable (fsynced, renamed,
        the directory fsynced: once a second): lost or left empty by a power cut, it would let
        such an open's checkpoints release segments never shipped."""
        self._status_at = time.monotonic()
        data = {k: v for k, v in self.stats().items() if k != "archive_puts_per_s"}
        data.update({"pid": os.getpid(), "updated_unix_ms": time.time_ns() // 1_000_000})
        if (waiting := self.waiting()) is not None and waiting[1] >= SLOW_REQUEST_S:
            data["archive_waiting_for"] = waiting[0]
        with contextlib.suppress(OSError):
            replace_durably(os.path.join(self.store.path, ARCHIVE_STATUS_FILE), json.dumps(data).encode())

    def _run(self) -> None:
        while not self._stop:
            pause = (max(0.0, min(self.period, self._retry_at - time.monotonic()))
                     if self._retry_at > time.monotonic() else self.period)
            self._next_wake_at = time.monotonic() + pause
            self._wake.wait(pause)
            self._wake.clear()
            self.lag_ms()  # a sample: the lag's bound stays tight between commits
            if time.monotonic() - self._status_at >= 1.0:
                self.write_status()
            try:
                if self._resolve is not None:
                    found = self._resolve()
                    archived, self._need_snapshot, self.last_snapshot = found[:3]
                    self._ack_held_at = archived if found.base_missing else None
                    self._tail, self._end_writer = found.tail, found.writer
                    self._bytes_since_snapshot += found.since_snapshot_bytes
                    self._resolve = None
                    self._lag_floor = 0
                    self._dispatched = archived
                    self._seed_latency()
                    with self._cond:
                        self._samples.clear()
                        self._samples.append((archived, self._carried_since(archived)))
                    self._publish(archived)
                with self._ship_lock:
                    self._harvest()
                    self._dispatch()
                self._maintain()
            except ObjectExistsError as exc:
                self._fence(exc)
                return
            except FailedError as exc:  # resolved late: this store does not continue the archive
                self._stop_with(exc)
                return
            except ArchiveError as exc:
                self._outage(exc)
            except Exception as exc:  # a closed log, a damaged local segment: stop shipping, say why
                if self._stop:
                    return
                with self._error_lock:
                    self.error = f"{type(exc).__name__}: {exc}"
                _logger.error("archive shipping of %s stopped: %s", self.store.path, exc)
                with self._cond:
                    self._cond.wait(1.0)

    @property
    def max_backoff(self) -> float:
        """The longest wait between tries during an outage: 5 s, or a quarter of archive_rpo_ms
        if less (at least 250 ms). Once the object store is back, the next try finds it within
        that: the commits an archive lag past the bound holds back (policy "block") and the
        `replicated` ones are not kept waiting seconds past its return (a 1 s bound waited up to
        5 s). It costs a request per wait while the outage lasts: 4 a second at a 1 s bound."""
        return min(5.0, max(0.25, self.rpo_ms / 4000))

    def _outage(self, exc: ArchiveError) -> None:
        """A request failed for now: one ERROR line per outage; requests wait out a backoff
        (50 ms doubling to `max_backoff`) before the next try."""
        with self._ship_lock:
            self._outage_locked(exc)

    def _outage_locked(self, exc: ArchiveError) -> None:
        self._count("archive_put_errors")
        self._epoch += 1
        with self._error_lock:
            began, self.error = self.error is None, str(exc)
        if began:
            _logger.error("archive %s unreachable, retrying with backoff (commits are kept locally; "
                          "archived LSN %d): %s", self.objects.url, self.archived, exc)
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.max_backoff)

    def _succeeded(self, epoch: int) -> None:
        """A request sent at `epoch` succeeded. Only one sent after the newest failure ends the
        outage: a late answer to an older request says nothing about the store now."""
        if epoch == self._epoch:
            self._backoff = 0.05
            self._reachable()

    def _fence(self, exc: ObjectExistsError) -> None:
        self._stop_with(FailedError(
            f"the store in {self.store.path} was fenced: another writer now ships into {self.objects.url} "
            f"(a follower was promoted, or a copy of this store shipped; {exc}). Its LSNs above {self.archived} were "
            "never archived; it stops rather than diverge. Restore or follow the archive to continue."))

    def _stop_with(self, exc: FailedError) -> None:
        self.fenced = exc
        _logger.error("%s", self.fenced)
        self.store._fenced(self.fenced)
        self.write_status()
        self._stop_waiters()
        with self._cond:
            self._cond.notify_all()

    def _stop_waiters(self) -> None:
        """Every thread and coroutine waiting for the archive returns (fenced or stopped:
        `wait_archived`, `failure_for`)."""
        log = self.store._log
        if log is not None:
            log._archive_stop()

    def _publish(self, last: int) -> None:
        with self._cond:
            self.archived = last
        self._wake_archived()

    def _wake_archived(self) -> None:
        """Wake the commits the archived LSN now covers (and admit()/stop(), on the Condition)."""
        self._wake_threads()
        self._wake_rest()

    def _wake_threads(self) -> int:
        """Wake the threads whose commits the archived LSN now covers; how many."""
        log = self.store._log
        if log is None:
            return 0
        before = log.watermarks.appended
        held = self._ack_held_at
        archived = self.archived if held is None else min(self.archived, held)
        woken = log._archive_set(archived)
        self.published = max(self.published, archived)
        self._gather_target = before + woken
        return woken

    def _wake_rest(self) -> None:
        """`_wake_archived` after `_wake_threads`: admit() and stop() (coroutines are woken by
        the same `_archive_set`, through the log's eventfd)."""
        with self._cond:
            self._cond.notify_all()
        self.store._archived_moved(self.archived)

    def _dispatch(self) -> None:
        """Send PUTs of what is durable and not yet handed to one, while slots are free."""
        log = self.store._log
        assert log is not None
        if time.monotonic() < self._retry_at:
            return
        for first, (last, data, future, _) in list(self._inflight.items()):
            if future is None and first not in self._collided:  # failed earlier: the same name and bytes again
                self._send(first, last, data)
        # In flight: every object sent and not yet in the gap-free run, stored or not (so an
        # object's `behind` never passes MAX_IN_FLIGHT - 1, nor a fenced writer's strays).
        while len(self._inflight) + len(self._stored) < self.puts_in_flight:
            if (self._first_of_session is None or self._tail) and self._inflight:
                return  # the session's first object goes alone (module docstring)
            marks = log.watermarks
            durable = marks.durable
            if marks.appended > durable and self.lag_ms() > self.rpo_ms / 2:
                # Only durable records are shipped (an archive ahead of a log that a crash cut back
                # would refuse the store). At interval/buffered the log syncs every rpo_ms; when
                # that would make the archive miss its own bound, sync now.
                log.sync()
                durable = log.watermarks.durable
            if durable <= self._dispatched:
                return
            records: list[tuple[int, bytes]] = []
            size, limit = 0, self._object_bytes()
            for lsn, payload in log._read_upto(self._dispatched + 1, durable):
                records.append((lsn, payload))
                size += len(payload) + 16
                if size >= limit:
                    break
            if not records or records[0][0] != self._dispatched + 1:
                raise ArchiveUnavailableError(f"the local log of {self.store.path} no longer holds LSN "
                                              f"{self._dispatched + 1}, the next to ship")
            first, last = records[0][0], records[-1][0]
            # behind: objects sent before it and not yet in the gap-free run (FORMAT.md §18).
            behind = len(self._inflight) + len(self._stored)
            self._send(first, last, layout.encode_log(records, self.writer_id, behind))
            self._dispatched = last

    def _object_bytes(self) -> int:
        """The most log one group object holds: what one PUT ships in a quarter of rpo_ms at the
        rate measured (FIRST_OBJECT_BYTES until measured), within MAX_OBJECT_BYTES."""
        rate = self._ship_rate
        if not rate:
            return FIRST_OBJECT_BYTES
        return int(min(MAX_OBJECT_BYTES, max(FIRST_OBJECT_BYTES // 4, rate * self.rpo_ms / 4000)))

    def _send(self, first: int, last: int, data: bytes) -> None:
        future = self._pool.submit(self._put_log, first, last, data)
        self._inflight[first] = (last, data, future, self._epoch)
        # A PUT that failed, or whose answer its thread did not take in, is the shipper
        # thread's (`_harvest`); a stored one its PUT thread took in wakes nobody.
        future.add_done_callback(self._answered)

    def _answered(self, future: concurrent.futures.Future[int | None]) -> None:
        if future.cancelled() or future.exception() is not None or future.result() is not None:
            self._wake.set()

    def _check_first_not_overtaken(self, first: int, name: str) -> None:
        """The session's first object is stored at ``log/<first>.wal``. Its name was free,
        yet another writer may have shipped `first` before it -- in an object of that name,
        then merged away (`merged_holding`): a store restored, or reopened from a copy, while
        the writer it was restored from went on. Nothing then stops this writer at the name:
        its commits would be acknowledged as archived into a chain that passes them by. So that
        writer's merged object fences this one (ObjectExistsError), and our object, which no
        chain can hold, is deleted."""
        merged = merged_holding(self.objects, first)
        if merged is None:
            return
        try:
            self.objects.delete(name)
            self._count("archive_deletes")
        except ArchiveError as exc:  # left: a reader's chain takes whichever of the two reaches further (plan.py)
            _logger.warning("archive %s: could not delete %s, this fenced writer's only object: %s",
                            self.objects.url, name, exc)
        raise ObjectExistsError(f"{self.objects.url}/{merged} holds LSN {first}, where this store's first object "
                                f"began: another writer shipped past this store's start and merged the object of "
                                "that name away (was this store restored, or copied, while its writer went on?)")

    def _put_log(self, first: int, last: int, data: bytes) -> int | None:
        """`_store_log_object`, counted in `_answers_pending` from its answer to its return."""
        answered: list[bool] = []
        try:
            return self._store_log_object(first, last, data, answered)
        finally:
            if answered:
                with self._answers_lock:
                    self._answers_pending -= 1

    def _store_log_object(self, first: int, last: int, data: bytes, answered: list[bool]) -> int | None:
        """In a PUT thread: store one group object. Once stored, it takes the answer in
        (`_stored_one`) and sends the next PUTs itself when it can, and returns None; else it
        returns the object's last LSN once stored, for `_harvest`. A failed PUT raises: the
        shipper thread's `_harvest` takes it from the future."""
        name = layout.log_name(first)
        try:
            sent = time.monotonic()
            self._put_sent[first] = sent
            try:
                self._put(name, data)
                with self._answers_lock:  # until this thread has sent the next (below)
                    self._answers_pending += 1
                answered.append(True)
            finally:
                self._put_sent.pop(first, None)
            took = time.monotonic() - sent
            self._latency_is(self._put_ewma + (took - self._put_ewma) / (8 if self._put_measured else 1))
            self._put_measured = True
            per_record = len(data) / (last - first + 1)
            self._record_bytes += (per_record - self._record_bytes) / (8 if self._record_bytes else 1)
            if len(data) >= FIRST_OBJECT_BYTES // 4:
                rate = len(data) / max(took, 1e-6)
                self._ship_rate += (rate - self._ship_rate) / (4 if self._ship_rate else 1)
            stored = last
        except ObjectExistsError as exc:
            # Ours from an attempt whose answer was lost (a timeout after the store took it)?
            try:
                obj = layout.decode_log(self._get(name), name)
            except _NOT_OURS:
                raise exc from None  # not an object this writer could continue after: fenced
            if obj.writer_id != self.writer_id:
                raise NameTakenError(str(exc), obj) from None
            stored = obj.last
        if self._first_of_session is None:  # it goes alone: nothing of ours is archived yet
            self._check_first_not_overtaken(first, name)
        if stored == last and self.store._replicated:
            with self._ship_lock:
                entry = self._inflight.get(first)
                taken = entry is not None and entry[2] is not None and not self._stop
                if taken:
                    assert entry is not None
                    self._stored_one(first, last, data, entry[3])
                    self._gathering = True
                    try:
                        moved = self._advance(wake=False)
                    except Exception:  # the shipper thread meets it again and handles it
                        moved = False
                        self._wake.set()
            if taken:
                # Gather (`_gather`): the commits this object acknowledges are woken first, and
                # the next PUT waits for them to commit again. Coroutines are not waited for:
                # from 1,000 tasks a PUT carries hundreds of commits already, and the loop that
                # runs them again would hold the gather to its bound every time.
                if moved and self._wake_threads() > 0:
                    self._wake_rest()
                    self._gather()
                else:  # as below: the next PUT first, then the wake
                    try:
                        with self._ship_lock:
                            before = self._dispatched
                            self._dispatch()
                            idle = self._dispatched == before and not self._inflight and not self._stored
                    except Exception:  # the shipper thread meets it again and handles it
                        idle = False
                        self._wake.set()
                    if moved:
                        self._wake_rest()
                    log = self.store._log
                    if idle and log is not None and log.watermarks.appended > self._dispatched:
                        self._gather()  # commits appended without waiting are on their way
                    else:
                        self._end_gathering()
                if self._tail:  # the shipper thread deletes an earlier writer's unfinished tail
                    self._wake.set()
                return None
        if stored == last:
            with self._ship_lock:
                entry = self._inflight.get(first)
                if entry is not None and entry[2] is not None and not self._stop:
                    moved = False
                    try:
                        self._stored_one(first, last, data, entry[3])
                        # The next PUT goes out before the commits this one acknowledges are
                        # woken: once they run, they compete for the GIL with every step of the
                        # dispatch (measured at 64 threads: ~4 ms from a PUT's answer to the
                        # next PUT when woken first, the PUT slot idle all the while).
                        moved = self._advance(wake=False)
                        self._dispatch()
                    except Exception:  # the shipper thread meets it again and handles it
                        self._wake.set()
                    finally:
                        if moved:
                            self._wake_archived()
                    if self._tail:  # the shipper thread deletes an earlier writer's unfinished tail
                        self._wake.set()
                    return None
        self._wake.set()
        return stored

    def _stored_one(self, first: int, last: int, data: bytes, epoch: int) -> None:
        del self._inflight[first]
        self._stored[first] = (last, data)
        self._count("archive_objects")
        self._bytes_since_snapshot += len(data)
        self._succeeded(epoch)

    def _advance(self, *, wake: bool = True) -> bool:
        """Move the archived LSN over the gap-free run of stored objects; True if it moved.
        wake=False: the caller wakes the commits it covers (`_wake_archived`) afterwards."""
        moved = self.archived
        while moved + 1 in self._stored:
            first = moved + 1
            moved, data = self._stored.pop(first)
            self._on_archived(first, moved, data)
        if moved == self.archived:
            return False
        if not self.store._replicated:
            lag = self.lag_ms()  # the age bound of the oldest commit archived now
            if self._acknowledged_early(self.archived + 1, moved) and lag > self.rpo_ms:
                self._overrun(lag)
        if wake:
            self._publish(moved)
        else:
            with self._cond:
                self.archived = moved
        return True

    def note_waited(self, lsn: int) -> None:
        """The commit `lsn`, on a store whose level is not `replicated`, is acknowledged only once
        the archive holds it (durability="replicated"): reaching the archive late is no overrun."""
        with self._cond:
            if lsn > self.archived:
                self._waited.add(lsn)

    def _acknowledged_early(self, first: int, last: int) -> bool:
        """Whether any commit from `first` to `last` (archived now) was acknowledged before the
        archive held it: any but those `note_waited` named. Forgets those."""
        with self._cond:
            if not self._waited:
                return True
            waited = sum(1 for lsn in self._waited if first <= lsn <= last)
            self._waited = {lsn for lsn in self._waited if lsn > last}
        return waited < last - first + 1

    def _overrun(self, lag_ms: float) -> None:
        """Commits reached the archive up to `lag_ms` after they were acknowledged, past
        archive_rpo_ms: a machine loss before now would have lost them beyond the bound. Counted
        (stats()["archive_rpo_overruns"]), and one WARNING line a minute at most."""
        self._count("archive_rpo_overruns")
        now = time.monotonic()
        if now - self._overrun_logged_at >= 60:
            self._overrun_logged_at = now
            _logger.warning("archive %s: commits acknowledged up to %.0f ms ago reached it only now, past "
                            "archive_rpo_ms=%d (the object store or this process fell behind): a machine loss "
                            "before this would have lost them; stats()['archive_rpo_overruns'] counts these",
                            self.objects.url, lag_ms, self.rpo_ms)

    def _harvest(self) -> None:
        """Take the answers of finished PUTs; move the archived LSN over the gap-free run of
        stored objects. ObjectExistsError (another writer's object: fenced) propagates; a
        failed PUT stays in `_inflight` to be sent again after the backoff."""
        failure: ArchiveError | None = None
        for first, (last, data, future, epoch) in list(self._inflight.items()):
            if future is None or not future.done():
                continue
            exc = future.exception()
            if exc is None:  # stored; its PUT thread had not taken it in (or was stopped)
                stored = future.result()
                if stored is None:  # taken in by its PUT thread (never left in _inflight)
                    continue
                if stored != last:  # never: a retry sends the same bytes
                    raise ArchiveUnavailableError(f"{self.objects.url}/{layout.log_name(first)} holds LSNs "
                                                  f"{first}..{stored}, not {first}..{last}")
                self._stored_one(first, last, data, epoch)
                continue
            if isinstance(exc, NameTakenError):
                self._inflight[first] = (last, data, None, epoch)
                self._collided.add(first)
                continue
            if isinstance(exc, ObjectExistsError):
                raise exc
            self._inflight[first] = (last, data, None, epoch)
            failure = exc if isinstance(exc, ArchiveError) else ArchiveUnavailableError(
                f"writing {layout.log_name(first)} to {self.objects.url}: {type(exc).__name__}: {exc}")
        self._advance()
        if self.archived + 1 in self._collided:
            self._settle_collision(self.archived + 1)
        if failure is not None:
            self._outage_locked(failure)
        elif self._tail and self._first_of_session is not None:
            self._delete_tail()

    def _settle_collision(self, first: int) -> None:
        """Our PUT of ``log/<first>.wal`` found another writer's object there, and every object of
        ours before it is stored: the object ending at first - 1 is ours (or, before our first
        object, that of `_end_writer`). The object there was sent with behind 0 (a fence, a
        writer's first object), or continues the chain of the writer before it: we are fenced.
        Sent with behind >= 1 by a writer other than the one before it: a stray (FORMAT.md §18),
        deleted; our PUT goes again with the same name and bytes."""
        name = layout.log_name(first)
        self._collided.discard(first)
        try:
            obj = layout.decode_log(self._get(name), name)
        except ObjectMissingError:
            return  # gone meanwhile: sent again
        except _NOT_OURS as exc:
            raise ObjectExistsError(f"{self.objects.url}/{name} is taken by an object this writer cannot read "
                                    f"({exc})") from None
        before = self.writer_id if self._first_of_session is not None else self._end_writer
        if obj.writer_id == self.writer_id:
            return  # ours after all (an earlier attempt): sent again, and found ours
        if obj.behind == 0 or before is None or obj.writer_id == before:
            raise ObjectExistsError(f"{self.objects.url}/{name} was written by another writer")
        self._cleared[first] += 1
        if self._cleared[first] > _STRAY_CLEARS:
            raise ObjectExistsError(f"{self.objects.url}/{name} keeps being written by another writer")
        self.objects.delete(name)
        self._count("archive_deletes")
        _logger.info("archive %s: deleted %s (LSNs %d..%d), a stray of a writer fenced with PUTs in flight; "
                     "shipping LSN %d on", self.objects.url, name, obj.first, obj.last, first)

    def _on_archived(self, first: int, last: int, data: bytes) -> None:
        """An object joined the gap-free run: remember it for merging."""
        if self._first_of_session is None:
            self._first_of_session = first
            return
        if len(data) < SMALL_OBJECT_BYTES:
            with self._unmerged_lock:
                keep = data if self._unmerged_bytes + len(data) <= MERGE_MEMORY_BYTES else None
                self._unmerged_bytes += len(keep) if keep is not None else 0
                self._unmerged.append((first, last, len(data), keep))
                due = len(self._unmerged) > self.merge_objects and len(self._unmerged) % self.merge_objects == 1
            if due:  # a merge is due: the shipper thread starts the maintenance job now
                self._wake.set()

    def _delete_tail(self) -> None:
        """An earlier writer's unfinished tail (FORMAT.md §18): now that this writer's first
        object is stored, no object of that writer can ever join the gap-free run."""
        while self._tail:
            piece = self._tail[0]
            # The name may be ours now: a stray there was cleared for one of our objects
            # (`_settle_collision`), or is being (in flight).
            if piece.first not in self._inflight and not self._ours(piece.name):
                self.objects.delete(piece.name)
                self._count("archive_deletes")
                _logger.info("archive %s: deleted %s, the unfinished tail or a stray of an earlier writer (none of "
                             "it was acknowledged at replicated)", self.objects.url, piece.name)
            del self._tail[0]

    def _ours(self, name: str) -> bool:
        try:
            return layout.decode_log(self._get(name), name).writer_id == self.writer_id
        except (ObjectMissingError, *_NOT_OURS):
            return False

    def _reachable(self) -> None:
        """After a request succeeded: the outage (if any) is over. A PUT thread and the shipper
        thread may both see it end: one says so."""
        with self._error_lock:
            ended, self.error = self.error is not None, None
        if ended:
            _logger.info("archive %s reachable again: shipping resumed (archived LSN %d)",
                         self.objects.url, self.archived)

    def _put(self, name: str, data: bytes | memoryview, *, create_only: bool = True, sealed: bool = False) -> None:
        """In any shipper thread (the outage state is the shipper thread's: `_harvest`).
        sealed: `data` is an envelope of the archive's `stream_sealer()` already."""
        try:
            with self._request(name):
                (self.objects.put_envelope if sealed else self.objects.put)(name, data, create_only=create_only)
        finally:
            self._count("archive_puts")
        self._count("archive_put_bytes", len(data))

    def _get(self, name: str) -> bytes:
        self._count("archive_gets")
        with self._request(name):
            return self.objects.get(name)

    @contextlib.contextmanager
    def _request(self, name: str) -> Iterator[None]:
        """A request to the object store, noted while it waits for its answer (`waiting`)."""
        request = next(self._request_ids)  # atomic under the GIL, as are the dict's updates
        self._unanswered[request] = (name, time.monotonic())
        try:
            yield
        finally:
            del self._unanswered[request]

    def waiting(self) -> tuple[str, float] | None:
        """(object name, seconds) of the request that has waited longest for its answer, or None."""
        pending = list(self._unanswered.values())
        if not pending:
            return None
        name, sent = min(pending, key=lambda p: p[1])
        return name, time.monotonic() - sent

    def _count(self, name: str, n: int = 1) -> None:
        with self._counter_lock:
            self.counters[name] += n

    # ---- maintenance ----------------------------------------------------------------------------

    def _maintain(self) -> None:
        """Start the next maintenance job once the last one ended; raise what the last one raised."""
        job = self._maint_job
        if job is not None:
            if not job.done():
                return
            self._maint_job = None
            exc = job.exception()
            if exc is not None:
                raise exc
            if job.result():
                self._succeeded(self._maint_epoch)
        if time.monotonic() < self._retry_at:
            return
        self._maint_epoch = self._epoch
        self._maint_job = self._maint.submit(self._maintenance)

    def _maintenance(self) -> bool:
        """In the maintenance thread: the owner check (during an outage, else every 10 s), a
        snapshot, a merge, retention, each when due. True if it made a request."""
        before = self._requests()
        if not self._swept:
            self._swept = True
            with contextlib.suppress(OSError):
                n = self.objects.remove_stale_temporaries(_STALE_TEMPORARY_S)
                if n:
                    _logger.info("archive %s: removed %d temporary file(s) left by writes of processes that died",
                                 self.objects.url, n)
        if self.error is not None or time.monotonic() - self._owner_checked_at > 10:
            self._check_still_writer()
            before -= 1
        self._snapshot_if_due()
        # Every merge due (a few per job at most): the maintenance job runs every `period` and
        # when a request fails, not after every PUT, so one merge per job could fall behind.
        for _ in range(_MERGES_PER_JOB):
            if self._stop or not self._merge_if_due():
                break
        else:
            self._wake.set()  # more are due: the next job starts at once
        self._retain_if_due()
        return self._requests() != before

    def _requests(self) -> int:
        return self.counters["archive_puts"] + self.counters["archive_gets"] + self.counters["archive_deletes"]

    # ---- snapshots ----------------------------------------------------------------------------

    def _snapshot_if_due(self) -> None:
        needed = self._need_snapshot and self.store._applied > self._needed_snapshot_after
        if self._pending_snapshot is None and (needed or self._bytes_since_snapshot >= self.snapshot_bytes) \
                and time.monotonic() >= self._snapshot_retry_at:
            try:
                self._pending_snapshot = self.store._logical_snapshot(self.writer_id)
            except NoSpaceError as exc:
                # The disk is the log's first: no snapshot is taken while it lacks room for one,
                # and the next try waits a minute (a restore needs more log meanwhile).
                self._snapshot_retry_at = time.monotonic() + _SNAPSHOT_SPACE_RETRY_S
                now = time.monotonic()
                if now - self._space_logged_at >= 600:
                    self._space_logged_at = now
                    _logger.warning("archive %s: %s", self.objects.url, exc)
                return
            self._pending_needed = needed
            if needed:  # a snapshot due to its size, of the LSN whose name was taken, meets no need
                self._need_snapshot = False
            self._bytes_since_snapshot = 0
        pending = self._pending_snapshot
        if pending is not None and pending.lsn <= self.archived:
            stored = self._ship_snapshot(pending)  # a failed PUT leaves it pending, for the next job
            self._pending_snapshot = None
            pending.discard()
            if stored and self._ack_held_at is not None:
                # The archive now restores from this snapshot to `archived`: what waited, goes.
                self._ack_held_at = None
                self._wake_archived()
            if not stored and self._pending_needed:
                self._need_snapshot, self._needed_snapshot_after = True, pending.lsn

    def _discard_pending_snapshot(self) -> None:
        pending, self._pending_snapshot = self._pending_snapshot, None
        if pending is not None:
            pending.discard()

    def _ship_snapshot(self, snap: SpooledSnapshot) -> bool:
        """PUT the snapshot of the state at its LSN (the archive holds the log up to it). False if
        the archive holds one of that LSN already: the same state, shipped before (by this writer
        or the one it continues), though perhaps under another key."""
        name = layout.snap_name(snap.lsn)
        stored = True
        try:
            with snap.mapped() as data:
                self._put(name, data, sealed=snap.sealed)
            self._snapshots_taken[name] = snap.taken_ms  # not an existing one's: it may differ (read if needed)
        except ObjectExistsError:
            stored = False
        self.last_snapshot = max(self.last_snapshot, snap.lsn)
        self._count("archive_snapshots")
        return stored

    def ship_snapshot_now(self, snap: SpooledSnapshot, timeout_s: float) -> None:
        """In the caller's thread: once the archive holds the log up to the snapshot's LSN
        (waiting at most timeout_s: `ArchiveUnavailableError` past it), PUT it; its file is
        deleted either way. For `agentwal rekey`, whose rewritten state must reach the archive
        under the new key before the old one is retired; the periodic snapshots are
        `_snapshot_if_due`'s."""
        try:
            if not self._await_archived(snap.lsn, time.monotonic() + timeout_s):
                if self.fenced is not None:
                    raise FailedError(str(self.fenced)) from self.fenced
                raise ArchiveUnavailableError(
                    f"the archive {self.objects.url} did not receive the log up to LSN {snap.lsn} within "
                    f"{timeout_s:g} s" + (f" ({self.error})" if self.error else ""))
            self._ship_snapshot(snap)
        finally:
            snap.discard()

    def _await_archived(self, lsn: int, deadline: float) -> bool:
        """Keep the shipper awake until the archive holds `lsn` (True), or it is fenced or
        stopped, or `deadline` (monotonic) passes (False)."""
        with self._cond:
            while self.archived < lsn and self.fenced is None and not self._stop:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake.set()
                self._cond.wait(min(left, 0.05))
            return self.archived >= lsn

    # ---- merging ------------------------------------------------------------------------------

    def _merge_if_due(self) -> bool:
        """Merge the oldest `merge_objects` small group objects shipped since this writer opened into one object,
        then delete them, so the object count grows by one per merge_objects PUTs. Never merged
        away: the session's first object (its name fences writers older than this one) and the
        archive's newest object (a follower that lists only names after its own LSN and finds
        nothing knows from it that nothing is new: wal/archive/follow.py). Only objects in the
        gap-free run are ever listed here; their bytes come from memory where kept."""
        with self._unmerged_lock:
            if len(self._unmerged) <= self.merge_objects:
                return False
            batch = self._unmerged[: self.merge_objects]
        # Only a consecutive run (a restart mid-session would not break one, but be sure).
        run = [batch[0]]
        for item in batch[1:]:
            if item[0] != run[-1][1] + 1:
                break
            run.append(item)
        self._merge_run(run)
        return True

    def _merge_run(self, run: list[tuple[int, int, int, bytes | None]]) -> None:
        """Merge `run` (consecutive entries at the front of `_unmerged`) into one object, delete
        its parts, and drop them from `_unmerged`."""
        parts: list[layout.LogObject] = []
        for first, _, _, kept in run:
            name = layout.log_name(first)
            try:
                obj = layout.decode_log(kept if kept is not None else self._get(name), name)
            except ObjectMissingError:  # removed by retention meanwhile: nothing to merge there
                self._drop_unmerged(len(run))
                return
            if obj.writer_id != self.writer_id:  # never: only our own stored objects are listed here
                self._drop_unmerged(len(run))
                return
            parts.append(obj)
        first, last = run[0][0], run[-1][1]
        merged = layout.merged_name(first, last)
        try:
            self._put(merged, layout.merge_logs(parts, self.writer_id))
        except ObjectExistsError:
            layout.decode_log(self._get(merged), merged)  # there and sound: a retry of this merge
        # One request for the parts (S3 DeleteObjects): deleted one by one they doubled the
        # requests the object store serves under `replicated` load, one per group object.
        self.objects.delete_many([layout.log_name(f) for f, _, _, _ in run])
        self._count("archive_deletes", len(run))
        self._drop_unmerged(len(run))
        self._count("archive_merges")

    def _merge_session_tail(self, deadline: float) -> None:
        """At close: the small objects this session left unmerged (fewer than merge_objects, or
        what the maintenance job had not reached), all but the archive's newest, into one object
        per consecutive run. Else each session left up to merge_objects + 2 objects for good, and
        a store opened for a few commits at a time (a short-lived agent process) grew the archive
        by that many objects per run, which every restore reads one GET each. Now a session
        leaves its first object (never merged away), one merged object and the newest."""
        while time.monotonic() < deadline:
            with self._unmerged_lock:
                items = list(self._unmerged)
            if items and items[-1][1] == self.archived:
                items.pop()  # the archive's newest object stays (`_merge_if_due`)
            if not items:
                return
            run = [items[0]]
            for item in items[1:]:
                if item[0] != run[-1][1] + 1:
                    break
                run.append(item)
            if len(run) == 1:
                self._drop_unmerged(1)  # alone before a large object: nothing to merge it with
                continue
            self._merge_run(run)

    def _drop_unmerged(self, n: int) -> None:
        with self._unmerged_lock:
            self._unmerged_bytes -= sum(len(k) for _, _, _, k in self._unmerged[:n] if k is not None)
            del self._unmerged[:n]

    def _check_still_writer(self) -> None:
        """One LIST: no object may start after this writer's archived LSN but its own, and strays
        (FORMAT.md §18). Catches a takeover while this writer was cut off (an outage, a long
        pause) before its next PUT would. Another writer's object there sent with behind 0 (a
        fence, a writer's first object) is a takeover; one sent with behind >= 1 may be a stray
        of a writer fenced before this one, or an object of a writer that took over whose fence
        retention has since deleted: then a snapshot or merged object past our archived LSN
        (only a writer that shipped past it makes those) tells the takeover."""
        self._owner_checked_at = time.monotonic()
        names = list(self.objects.list(layout.LOG_PREFIX, layout.log_name(self.archived)))
        # Ours: objects in flight or stored out of order (taken after the listing: whatever of
        # ours it shows was sent before it), and the earlier writer's tail awaiting deletion.
        mine = set(self._inflight) | set(self._stored) | {p.first for p in list(self._tail)}
        archived = self.archived
        foreign = False
        for name, _ in names:
            parsed = layout.parse_name(name)
            if parsed is None or parsed.first <= archived or parsed.first in mine:
                continue
            obj = self._foreign.get(name)
            if obj is None:
                try:
                    obj = layout.decode_log(self._get(name), name)
                except ObjectMissingError:
                    continue
                except _NOT_OURS:
                    obj = None
                if obj is not None and obj.writer_id != self.writer_id:
                    self._foreign[name] = obj
            if obj is not None and obj.writer_id == self.writer_id:
                continue
            if obj is None or obj.behind == 0:
                raise ObjectExistsError(f"{self.objects.url}/{name} was written by another writer")
            foreign = True
        if foreign:
            past = [n for n, _ in self.objects.list(layout.SNAP_PREFIX, layout.snap_name(archived))]
            past += [n for n, _ in self.objects.list(layout.MERGED_PREFIX, f"{layout.MERGED_PREFIX}{archived:020d}-~")]
            if past:
                raise ObjectExistsError(f"{self.objects.url}/{past[0]} was written by another writer")

    # ---- retention ----------------------------------------------------------------------------

    def _retain_if_due(self) -> None:
        """Delete what a restore to any time within the last `retention_s` does not need: every
        snapshot older than the newest one taken before the window, and every log object wholly
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
        # The base is the newest snapshot *taken* at or before the window's start, as a restore
        # to a time chooses by its header's taken_ms. The store's listed time only narrows the
        # candidates: S3 gives it to the second, rounded down, and by the server's clock (a
        # snapshot taken just inside the window was listed before it, and its predecessor, which
        # a restore into that second needs, deleted). Taken times rise with the LSN.
        listed = [(p.first, n) for p, n, t in snaps if p is not None and t <= cutoff + _LISTED_TIME_SLACK_S]
        at = len(listed)
        while at > 0:
            taken = self._snapshot_taken_ms(listed[at - 1][1])
            if taken is not None and taken <= cutoff * 1000:
                break
            at -= 1
        before = listed[:at]
        if not before:
            return
        base = before[-1][0]
        for _, name in before[:-1]:
            self.objects.delete(name)
            self._snapshots_taken.pop(name, None)
            self._count("archive_deletes")
        from wal.archive.plan import list_archive  # noqa: PLC0415

        with self._unmerged_lock:  # the merger must not look for them
            gone = [u for u in self._unmerged if u[1] <= base]
            self._unmerged_bytes -= sum(len(k) for _, _, _, k in gone if k is not None)
            self._unmerged = [u for u in self._unmerged if u[1] > base]
        for piece in list_archive(self.objects).logs:
            # Never the newest object, nor one whose end is unknown.
            if piece.last is not None and piece.last <= base and piece.last < self.archived:
                if piece.name.startswith(layout.LOG_PREFIX):
                    # A group object's end from the names is a guess that a stray starting inside
                    # it cuts short (FORMAT.md §18): its header says.
                    try:
                        if layout.decode_log(self._get(piece.name), piece.name).last > base:
                            continue
                    except WalError:  # gone, damaged, or under a key no longer given: kept
                        continue
                self.objects.delete(piece.name)
                self._count("archive_deletes")

    def _snapshot_taken_ms(self, name: str) -> int | None:
        """When snapshot `name` was taken (its header's taken_ms): known for those this shipper
        shipped, read once (and kept: objects never change) for the others; None if it cannot
        be read now (gone, damaged, unreachable: retention then keeps what it would have used)."""
        taken = self._snapshots_taken.get(name)
        if taken is None:
            try:
                if self.objects.stream_sealer() is None:  # a plain object: its first bytes, one small GET
                    head = self.objects.get_head(name, layout.SNAPSHOT_HEADER_BYTES)
                    taken = layout.snapshot_header(head, name).taken_ms
                else:  # sealed whole: opened as a restore opens it, a window at a time
                    read = self.objects.read_ranged(name, window=1 << 20)
                    try:
                        taken = layout.read_snapshot_header(read, name).taken_ms
                    finally:
                        read.close()
                self._count("archive_gets")
            except (WalError, struct.error):  # damaged, gone, unreachable, or under a key not given
                return None
            self._snapshots_taken[name] = taken
        return taken

    def stats(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        out: dict[str, Any] = dict(self.counters)
        out.update({
            "archive_url": self.objects.url,
            "archived_lsn": self.archived,
            "archive_lag_ms": self.lag_ms(),
            "archive_backlog_ms": self._drain_ms,
            "archive_rpo_ms": self.rpo_ms,
            "archive_puts_per_s": self.counters["archive_puts"] / elapsed,
            "archive_last_snapshot_lsn": self.last_snapshot,
            "archive_error": self.error,
            "archive_fenced": self.fenced is not None,
            "archive_request_wait_s": round(waiting[1], 3) if (waiting := self.waiting()) is not None else 0.0,
        })
        return out
