"""`wal.Log`: the bare segmented write-ahead log.

A log is a directory of segment files (FORMAT.md). One process writes it at a
time (the ``LOCK`` file, flock); any number may read it. Appending, group
commit, the flusher and the durability levels are in C (native/commit.c); this
module opens the directory (recovery.py), converts arguments and results, and
gives asyncio a way to wait for durability without a thread per call.

The log knows nothing about what its payloads mean.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import errno
import fcntl
import heapq
import itertools
import logging
import mmap
import os
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple

from wal._bindings import append_nowait, append_record, check, ffi, handle_address, lib, raise_code, span_records
from wal._fs import fsync_dir, makedirs_durable
from wal.errors import (
    ArgumentError,
    ArgumentTypeError,
    ClosedError,
    CorruptionError,
    FailedError,
    LockedError,
    NoSpaceError,
    ReadOnlyError,
    RecordTooLargeError,
    StorageError,
    WalError,
    no_descriptor_error,
    path_argument,
    storage_error,
)
from wal.log import durability as dur
from wal.log import recovery

MAX_PAYLOAD = int(lib.WAL_MAX_PAYLOAD_BYTES)
LOCK_NAME = "LOCK"
# The file a store (wal.store, FORMAT.md §14) keeps at its root, its log in log/ below it: a bare
# log opened at a store's root would write its segments beside the store's own.
_STORE_FILE = "STORE"
# segment_bytes and max_pending_bytes at most: what a segment header's preallocated size may say,
# far within the C config's u64.
_MAX_SEGMENT_BYTES = recovery.MAX_PREALLOC
_SPAN_RECORDS = 1024  # records per span of read_spans (the replay: fewer, bigger steps)
# Records per span for Log.read: ~256 KiB of 1 KiB records, so that turning a span into Python
# objects finds its bytes still in cache after the scan that validated them (1,024: ~10% slower).
_READ_RECORDS = 256
_HEADER_BYTES = 64  # a segment header (FORMAT.md §4): what tells one segment file from another
_RECORD_HEADER_BYTES = 24  # a record's header (FORMAT.md §4): a span's offsets point past it
_SCAN_RESULT_BYTES = ffi.sizeof("wal_scan_result")
_NO_ARRAY = memoryview(b"")  # the arrays of a span of 0 records (casts to any item type)
_open_logs: weakref.WeakSet[Log] = weakref.WeakSet()
_logger = logging.getLogger("wal.log.log")  # under the "wal" logger: recovery summaries, torn tails, lost LSNs


class _FinalMarks(NamedTuple):
    """A closed log's watermarks, read once its close is done (`Log._after_close`)."""

    written: int
    durable: int
    archived: int  # the archive's watermark, capped at durable
    archive_stopped: bool
    failed: int  # the log's failure code, WAL_ECLOSED if none
    detail: str


class LogWatermarks(NamedTuple):
    appended: int  # last LSN handed out
    written: int  # last LSN written to the OS (survives a process kill)
    durable: int  # last LSN covered by an fdatasync (survives a power cut)


@dataclass(frozen=True)
class RecoveryReport:
    """What opening the log found and did."""

    segments: int
    records: int  # valid records found in the retained segments
    last_lsn: int
    seconds: float
    torn_tail: tuple[str, int, int] | None  # (segment, offset, bytes cut) when a torn tail was cut
    broken_files: tuple[str, ...]  # where cut bytes / set-aside segments were kept
    lost_lsns: tuple[int, int | None] | None  # recovery="truncate": first and last LSN given up (None: unknown)


# C constants read once: a `lib.X` attribute lookup on every append is measurable.
_WAIT_LEVEL = lib.WAL_WAIT_LEVEL
_WAIT_LATER = lib.WAL_WAIT_LATER
_WAIT_TRY = lib.WAL_WAIT_TRY
_WAIT_NONE = lib.WAL_WAIT_NONE
_EAGAIN = lib.WAL_EAGAIN
_ETOOBIG = lib.WAL_ETOOBIG


def _after_fork_in_child() -> None:
    for log in list(_open_logs):
        log._forked = True
        log._writer = None
        # The child's copy of the LOCK fd shares the parent's flock: drop it, or a child that
        # outlives the parent's close() would keep the directory locked.
        if log._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(log._lock_fd)
            log._lock_fd = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _as_payload(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload)
    raise ArgumentTypeError(f"a log payload must be bytes, bytearray or memoryview, not {type(payload).__name__}")


class Log:
    """An open log. Thread-safe; use `Log.open`, and close it (or use it as a context manager)."""

    def __init__(self, directory: str, handle: Any, durability: dur.Durability, *, lock_fd: int | None,
                 report: RecoveryReport, segment_bytes: int) -> None:
        self._dir = directory
        self._handle = handle
        self._durability = durability
        self._level = durability.code  # read on every append
        self._lock_fd = lock_fd
        self._report = report
        self._segment_bytes = segment_bytes
        self._pid = os.getpid()
        self._forked = False
        self._closed = False  # a read-only Log has neither handle nor lock, and is open too
        # The handle while appends may use it, else None (read-only, closed, forked): the append
        # paths test this one attribute and fall back to _live() for the error to raise.
        self._writer: Any = handle
        self._writer_address = handle_address(handle) if handle is not None else 0
        self._async: dict[asyncio.AbstractEventLoop, _AsyncWaiters] = {}
        self._closing = False  # close under way or done (`_closed_waits`)
        self._final: _FinalMarks | None = None  # set by close, once its handle is closed
        # This log's own reads (_ReadCache): the archive's shipper reads the newest records
        # again and again, and must not re-validate, nor map again, the whole segment each time.
        self._scan_resume = _ReadCache()
        _open_logs.add(self)

    # ---- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        durability: str | None = None,
        rpo_ms: int | None = None,
        segment_bytes: int = 64 << 20,
        readonly: bool = False,
        recovery: str = "strict",
        preallocate: str = "size",
        max_pending_bytes: int = 4 << 20,
        on_sealed_segment: Callable[[SealedSegment], None] | None = None,
        keep_through: int = 0,
        _seed: int = 0,
        _new_log_id: int = 0,
        _new_salt: int = 0,
        _first_lsn: int = 1,
        _lock_fd: int | None = None,
        _store_log: bool = False,
    ) -> Log:
        """Open (creating if needed) the log in `directory`.

        durability/rpo_ms: see `wal.log.durability` (default ``sync``). segment_bytes: roll to a new
        segment past this size. readonly: no lock, no repair, no appends. recovery: ``"strict"``
        raises `CorruptionError` on damage that is not a torn tail; ``"truncate"`` opens at the
        last good record and reports the lost LSN range in `recovery_report`. preallocate:
        ``"size"`` (extend new segments with ftruncate) or ``"zeros"`` (write zeros: slower to
        create, cheaper fdatasyncs).

        on_sealed_segment: called during the open, in LSN order, with each segment but the
        newest as soon as the open's scan has verified it (its records are durable), while
        the scan reads the next segments (two at a time); a caller that hands it to another
        thread can work on those records while the open reads on (the store's replay does).
        An exception it raises fails the open. A damaged log can still fail the open after
        some calls.

        keep_through: an LSN that something built on this log already holds (a store passes its
        state's checkpointed applied LSN). A torn tail, or a `recovery="truncate"` cut, that would
        leave the log ending before it is refused as `CorruptionError` before anything is changed:
        such a cut would hand out those LSNs again to new commits.

        _lock_fd: the directory's writer lock, taken already (`take_lock`) by a caller that had
        to hold it before the open (`agentwal repair` backs the log up under it); the log owns
        it from then on, closed with the log or by a failed open.

        _store_log: the caller is the store (or a tool acting for it) opening its own log/ for
        writing; anyone else is refused there, since records appended through a bare log are not
        store transactions and the store would refuse its log from then on.
        """
        level = dur.parse(durability, rpo_ms)
        # Checked whole before anything is opened: a number the C config cannot hold raised a raw
        # OverflowError after the recovery had already cut a torn tail.
        if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) \
                or not 4096 <= segment_bytes <= _MAX_SEGMENT_BYTES:
            raise ArgumentError(f"segment_bytes must be an int in [4096, {_MAX_SEGMENT_BYTES}] (1 TiB), "
                                f"got {segment_bytes!r}")
        if recovery not in ("strict", "truncate"):
            raise ArgumentError(f"recovery must be 'strict' or 'truncate', got {recovery!r}")
        if preallocate not in ("size", "zeros"):
            raise ArgumentError(f"preallocate must be 'size' or 'zeros', got {preallocate!r}")
        if isinstance(max_pending_bytes, bool) or not isinstance(max_pending_bytes, int) \
                or not 4096 <= max_pending_bytes <= _MAX_SEGMENT_BYTES:
            raise ArgumentError(f"max_pending_bytes must be an int in [4096, {_MAX_SEGMENT_BYTES}] (1 TiB), "
                                f"got {max_pending_bytes!r}")
        path = path_argument(directory, "the log's directory")
        if os.path.exists(os.path.join(path, _STORE_FILE)):
            raise ArgumentError(f"{path} is an agentwal store, not a bare log: its log is {os.path.join(path, 'log')}, "
                                "which wal.open opens with the store's state (a log opened here would put segment "
                                "files beside the store's own)")
        if not readonly and not _store_log and _is_a_stores_log(path):
            store_root = os.path.dirname(os.path.realpath(path))
            raise ArgumentError(f"{path} is the log of the agentwal store in {store_root}: "
                                "wal.open writes it; records appended through wal.Log are not store transactions, and "
                                "the store would refuse its log from then on (readonly=True reads it)")
        # What the host refuses (no permission, no descriptors, a full disk, a missing directory)
        # is a StorageError -- NoSpaceError, NotFoundError -- with errno and advice, as from wal.open.
        try:
            if readonly:
                return cls._open_readonly(path, level, segment_bytes)
            return cls._open_writer(path, level, recovery, segment_bytes, preallocate,
                                    max_pending_bytes=max_pending_bytes, on_sealed_segment=on_sealed_segment,
                                    keep_through=keep_through, seed=_seed, new_log_id=_new_log_id,
                                    new_salt=_new_salt, first_lsn=_first_lsn, lock_fd=_lock_fd)
        except OSError as exc:
            raise storage_error(exc, f"opening the log in {path}" + (" read-only" if readonly else "")) from exc

    @classmethod
    def _open_writer(cls, path: str, level: dur.Durability, recovery: str, segment_bytes: int, preallocate: str, *,
                     max_pending_bytes: int, on_sealed_segment: Callable[[SealedSegment], None] | None,
                     keep_through: int, seed: int, new_log_id: int, new_salt: int, first_lsn: int,
                     lock_fd: int | None) -> Log:
        if lock_fd is None:
            makedirs_durable(path)
            lock_fd = take_lock(path)
        try:
            report, cfg = _recover(path, recovery, segment_bytes, on_sealed_segment, keep_through,
                                   first_lsn=first_lsn)
            cfg.level = level.code
            cfg.rpo_ms = level.rpo_ms
            cfg.max_pending_bytes = max_pending_bytes
            cfg.prealloc = lib.WAL_PREALLOC_ZEROS if preallocate == "zeros" else lib.WAL_PREALLOC_SIZE
            cfg.seed = seed
            if report.segments == 0:  # a new log: tests may pin its identity (golden file)
                cfg.log_id = new_log_id
                cfg.segment_salt = new_salt
            out = ffi.new("wal_log **")
            rc = lib.wal_log_open(os.fsencode(path), cfg, out)  # any name the OS takes, UTF-8 or not
            if rc != 0:
                code = ffi.errno
                if rc in (lib.WAL_EOS, lib.WAL_EIO, lib.WAL_ENOSPC) and code:  # a system call failed: say which
                    raise OSError(code, os.strerror(code), path)
                raise_code(rc, f"opening the log writer in {path}", os.strerror(code) if code else "")
        except BaseException:
            os.close(lock_fd)
            raise
        _log_recovery(path, report)
        return cls(path, out[0], level, lock_fd=lock_fd, report=report, segment_bytes=segment_bytes)

    @classmethod
    def _open_readonly(cls, path: str, level: dur.Durability, segment_bytes: int) -> Log:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no log at {path}")
        for _ in range(5):
            scan = recovery.scan_directory(path)
            if scan.damage is None or scan.damage.offset == 0:
                break
            # Damage found by the record scan: a live writer may have been copying a batch in
            # while we read. Real damage stays put; if it moved on, scan the log again.
            if recovery.settled_scan_segment_file(scan.segments[scan.damage.index]).status == "corrupt":
                break
        if scan.damage is not None:  # a torn tail is not damage: readers stop at it
            raise recovery.corruption_error(scan.damage, scan.segments)
        last = scan.segments[-1].last_lsn if scan.segments else 0
        report = RecoveryReport(len(scan.segments), sum(s.records for s in scan.segments), last,
                                scan.seconds, None, (), None)
        return cls(path, None, level, lock_fd=None, report=report, segment_bytes=segment_bytes)

    # ---- properties ------------------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def durability(self) -> str:
        return self._durability.level

    @property
    def rpo_ms(self) -> int:
        return self._durability.rpo_ms

    @property
    def readonly(self) -> bool:
        return self._handle is None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def recovery_report(self) -> RecoveryReport:
        return self._report

    @property
    def watermarks(self) -> LogWatermarks:
        if self._handle is None:
            last = self._report.last_lsn
            return LogWatermarks(last, last, last)
        h = self._live()
        out = ffi.new("uint64_t[3]")
        lib.wal_log_watermarks(h, out)
        return LogWatermarks(int(out[0]), int(out[1]), int(out[2]))

    def bytes_per_record(self) -> float | None:
        """The mean size in the log of the records this process has written to the OS (framing
        included), None before its first write: what the records not yet written will likely
        take, known locally, without waiting for anything else to measure it."""
        h = self._handle
        if h is None or self._forked or self._closed:
            return None
        s = ffi.new("wal_log_stats *")
        lib.wal_log_get_stats(h, s)  # the handle outlives close (freed with this object)
        records = int(s.written_lsn) - self._report.last_lsn
        return s.bytes_written / records if records > 0 and s.bytes_written else None

    @property
    def native_address(self) -> int:
        """The address of the C handle while this log takes appends (0 when read-only, closed or
        forked), for a C extension in this process that appends through it: the store's commit
        path (native/storecore.c). The handle is freed with this Log object, so such a user
        keeps a reference to it; after close the handle answers WAL_ECLOSED."""
        return self._writer_address if self._writer is not None else 0

    @property
    def first_lsn(self) -> int:
        """Oldest LSN still in the log (older segments were removed by checkpoints)."""
        for _, path in recovery.list_segments(self._dir):
            try:
                return _segment_first_lsn(path)
            except FileNotFoundError:
                continue  # released by a checkpoint since the listing: the next is the oldest now
        return 1

    # ---- writing ---------------------------------------------------------------------------

    def _live(self) -> Any:
        if self._forked:
            raise LockedError(
                f"this Log of {self._dir} was opened by process {self._pid}; a forked child cannot use it. "
                "Open the log again in the child (it gets LockedError while the parent holds the lock)."
            )
        if self._closed:
            raise ClosedError(f"the log in {self._dir} is closed")
        if self._handle is None:
            raise ReadOnlyError(f"the log in {self._dir} was opened read-only")
        return self._handle

    def append(self, payload: bytes, *, durability: str | None = None) -> int:
        """Append one record; returns its LSN once `durability` (default: the log's) holds for it."""
        h = self._writer or self._live()
        data = payload if type(payload) is bytes else _as_payload(payload)  # the hot path: no call
        level = self._level if durability is None else self._durability.allows(durability)
        # One call into C (native/appendcall.c): the GIL is kept for a buffered copy and for
        # an interval write made at once, released for any wait (native/logcall.h); oversize
        # payloads come back as WAL_ETOOBIG.
        lsn: int = append_record(self._writer_address, data, level)
        if lsn < 0:
            if lsn == _ETOOBIG:
                raise _too_large(data)
            check(lsn, f"append to the log in {self._dir}", h)
        return lsn

    def append_many(self, payloads: Iterable[bytes], *, durability: str | None = None) -> int:
        """Append records as consecutive LSNs in one call; returns the last LSN (given none: the
        log's last LSN, 0 on an empty log).

        Atomicity: each record is framed on its own; a crash may keep a prefix of the batch.
        """
        h = self._live()
        data, lens = _pack(payloads)
        if not lens:
            return self.watermarks.appended
        lsn: int = lib.wal_log_append_many(h, data, lens, len(lens), self._durability.allows(durability),
                                           _WAIT_LEVEL)
        if lsn < 0:
            check(lsn, f"append to the log in {self._dir}", h)
        return lsn

    async def append_async(self, payload: bytes, *, durability: str | None = None) -> int:
        """Like `append`, but awaits durability on the event loop: no thread per call, never blocks."""
        level = self._durability.allows(durability)
        while (lsn := self.enqueue(payload, durability=durability, for_async=True)) is None:
            await self.progress_async()  # back-pressure: the RPO window or the buffer is full
        await self._waiters().until(lsn, level)
        return lsn

    async def append_many_async(self, payloads: Iterable[bytes], *, durability: str | None = None) -> int:
        """Like `append_many`, awaited on the event loop."""
        h = self._live()
        data, lens = _pack(payloads)
        if not lens:
            return self.watermarks.appended
        level = self._durability.allows(durability)
        while True:
            lsn: int = lib.wal_log_append_many(h, data, lens, len(lens), level, lib.WAL_WAIT_NONE)
            if lsn != lib.WAL_EAGAIN:
                break
            await self.progress_async()
        if lsn < 0:
            check(lsn, f"append to the log in {self._dir}", h)
        await self._waiters().until(lsn, level)
        return lsn

    # Two-step appends, for a layer that must order its commits under its own lock without
    # holding that lock through the fdatasync: enqueue under the lock, wait outside it.

    def enqueue(self, payload: bytes, *, durability: str | None = None, block: bool = True,
                for_async: bool = False) -> int | None:
        """Give `payload` its LSN and queue it, without waiting for durability; returns the LSN.

        Then `wait(lsn)` (threads) or `await wait_async(lsn)` (asyncio) before acknowledging.
        block=False: return None instead of blocking under back-pressure (then wait for
        progress and try again). for_async: the flusher, not the caller, does the I/O; implies
        block=False.
        """
        h = self._writer or self._live()
        data = payload if type(payload) is bytes else _as_payload(payload)
        if len(data) > MAX_PAYLOAD:
            raise _too_large(data)
        level = self._durability.code if durability is None else self._durability.allows(durability)
        if for_async or not block:
            # Never blocks: keep the GIL (see native/appendcall.c).
            lsn: int = append_nowait(self._writer_address, data, level, _WAIT_NONE if for_async else _WAIT_TRY)
        else:
            lsn = lib.wal_log_append(h, data, len(data), level, _WAIT_LATER)
        if lsn == _EAGAIN and (for_async or not block):
            return None
        if lsn < 0:
            check(lsn, f"append to the log in {self._dir}", h)
        return lsn

    def wait_admitted(self, payload_bytes: int) -> None:
        """Block, helping with the I/O, until an append of `payload_bytes` would be admitted:
        for a caller whose `enqueue(block=False)` answered None (back-pressure) and that must
        make it again under its own lock. Counted in `stats()["backpressure_waits"]` as a
        blocking append's wait is."""
        h = self._writer or self._live()
        rc = lib.wal_log_wait_admitted(h, payload_bytes)
        if rc < 0:
            check(rc, f"waiting for room in the log in {self._dir}", h)

    def wait(self, lsn: int, *, durability: str | None = None) -> None:
        """Block until `durability` (default: the log's) holds for `lsn`; helps with the I/O."""
        h = self._writer or self._live()
        level = self._durability.code if durability is None else self._durability.allows(durability)
        rc = lib.wal_log_wait(h, lsn, level)
        if rc < 0:  # the message is only formatted for an error
            check(rc, f"waiting for LSN {lsn} in the log in {self._dir}", h)

    # The archive's watermark (native/commit.c): the LSN up to which an object archive holds
    # this log, moved by the archive's shipper (wal/archive/shipper.py), and what its
    # `replicated` commits wait for, each in one futex sleep with the GIL released.

    def _archive_set(self, lsn: int) -> int:
        """The archive holds every LSN up to `lsn` (it only grows); wakes the threads waiting
        for it and returns how many. 0 on a closed or read-only log."""
        h = self._handle
        return int(lib.wal_log_set_archived(h, lsn)) if h is not None and not self._closed else 0

    def _settled(self) -> bool:
        """Every record appended is durable (a hint, read without the log's mutex: no commit is
        between its append and its fdatasync). True on a closed or read-only log."""
        h = self._handle
        return bool(lib.wal_log_settled(h)) if h is not None and not self._closed else True

    def _archive_stop(self) -> None:
        """The archive's shipper stopped for good (fenced, closing): every waiter returns."""
        h = self._handle
        if h is not None and not self._closed:
            lib.wal_log_stop_archived(h)

    def _archive_wait(self, lsn: int) -> bool:
        """Until `lsn` is durable (as `wait` at sync: it may lead the fdatasync) and the archive
        holds it (True), or its shipper stopped (False); raises the log's failure (FailedError,
        ClosedError, NoSpaceError) if it fails or closes first. One call, the GIL released once."""
        h = self._writer or self._live()
        rc = lib.wal_log_wait_archived(h, lsn)
        if rc == 0:
            return True
        if rc == lib.WAL_EAGAIN:
            return False
        check(rc, f"waiting for the archive to hold LSN {lsn} of the log in {self._dir}", h)
        return False  # not reached: check raised

    async def wait_async(self, lsn: int, *, durability: str | None = None) -> None:
        """Await, without blocking the loop, until `durability` holds for `lsn`. On a closed
        log, answered from its final marks (`_after_close`)."""
        level = self._durability.allows(durability)
        waiters = self._waiters_unless_answered(lsn, level)
        if waiters is not None:
            await waiters.until(lsn, level)

    async def wait_archived_async(self, lsn: int) -> None:
        """Await, without blocking the loop, until `lsn` is durable and the archive holds it
        (`_archive_set`): `_archive_wait` for a coroutine, one future of its loop woken through
        the log's eventfd. FailedError once the archive's shipper stopped first
        (`_archive_stop`); the log's own failure (FailedError), close (ClosedError) or lack of
        space for the record (NoSpaceError). On a closed log, answered from its final marks."""
        waiters = self._waiters_unless_answered(lsn, None)
        if waiters is not None:
            await waiters.until_archived(lsn)

    def _waiters_unless_answered(self, lsn: int, level: int | None) -> _AsyncWaiters | None:
        """The running loop's waiters, for a coroutine's wait for `lsn` (`level`; None: the
        archive); None when a closed log's final marks already answer it (`_closed_waits`)."""
        if (self._closed or self._handle is None or self._forked) and self._closed_waits(lsn, level):
            return None
        try:
            return self._waiters()
        except ClosedError:  # closed since the check above: answered from the final marks
            if self._final is None or not self._closed_waits(lsn, level):
                raise
            return None

    def _closed_waits(self, lsn: int, level: int | None) -> bool:
        """Before a coroutine's wait for `lsn` (`level`; None: the archive), on a log that is
        closed, read-only or forked: LockedError in a fork (the C state is the parent's); True if
        this closed log's final marks cover it, its failure if they do not. A wait while close is
        under way (`_closing` is set before `_closed`) goes on (False): its loop's waiters are
        answered once the final marks are read. Otherwise the log's state as `_live` reports it
        (ClosedError, ReadOnlyError). A cancelled commit waits again
        (`Store._acknowledged_async`): with a ClosedError here, a commit that close made durable
        was reported as not made."""
        if self._forked:
            self._live()  # LockedError: the C state is the parent's
        if self._final is not None:
            outcome = self._after_close(lsn, level)
            if outcome is not None:
                raise outcome
            return True
        if not (self._closed and self._closing):
            self._live()
        return False

    def _after_close(self, lsn: int, level: int | None) -> WalError | None:
        """What a wait for `lsn` (`level`; None: the archive) gets from this closed log's final
        marks: None if they cover it (close writes and fdatasyncs everything appended, and the
        store's shipper stopped before its log closed), else why not."""
        final = self._final
        if final is None:  # a forked child's copy: nothing of the parent's is read
            return ClosedError(f"the log in {self._dir} was closed while a commit awaited durability")
        if level is None:
            covered = lsn <= final.archived
        else:
            covered = level == lib.WAL_LEVEL_BUFFERED or lsn <= (
                final.durable if level == lib.WAL_LEVEL_SYNC else final.written)
        if covered:
            return None
        if final.failed and final.failed != lib.WAL_ECLOSED:
            return FailedError(f"append to the log in {self._dir} failed: {final.detail}")
        if level is None and final.archive_stopped:
            return FailedError(f"the archive of the log in {self._dir} stopped before LSN {lsn} reached it")
        return ClosedError(f"the log in {self._dir} was closed while a commit awaited durability")

    def progress_async(self) -> asyncio.Future[None]:
        """A future resolved at the log's next progress (a write, an fdatasync, a failure)."""
        self._live()
        return self._waiters().progress()

    def _waiters(self) -> _AsyncWaiters:
        loop = asyncio.get_running_loop()
        w = self._async.get(loop)
        if w is None:
            handle = self._handle  # read once: close may set it to None meanwhile
            if handle is None:
                self._live()  # raises: closed, forked or read-only
            # Loops that have closed since (each asyncio.run makes one) are forgotten here.
            for old in [old for old in self._async if old.is_closed()]:
                del self._async[old]
            w = self._async[loop] = _AsyncWaiters(self, loop, handle)
        return w

    def sync(self) -> None:
        """Make every record appended so far durable (fdatasync), at any level."""
        h = self._live()
        check(lib.wal_log_sync(h), f"sync of the log in {self._dir}", h)

    def remove_segments_before(self, lsn: int, archive_dir: str | None = None) -> list[str]:
        """Delete (or move to archive_dir) every segment whose records all have LSN < lsn.

        The segment being written is never removed. Returns the paths removed.
        """
        self._live()
        segments = recovery.list_segments(self._dir)
        removed = []
        for (_, path), (_, nxt) in itertools.pairwise(segments):
            if _segment_first_lsn(nxt) > lsn:
                break
            if archive_dir is not None:
                makedirs_durable(archive_dir)
                os.replace(path, os.path.join(archive_dir, os.path.basename(path)))
            else:
                os.unlink(path)
            removed.append(path)
        if removed:
            fsync_dir(self._dir)
            if archive_dir is not None:
                fsync_dir(archive_dir)
        return removed

    # ---- reading ---------------------------------------------------------------------------

    def read(self, from_lsn: int = 1) -> Iterator[tuple[int, bytes]]:
        """Yield (lsn, payload) in LSN order from `from_lsn`.

        On a writable log: records written to the OS when the call was made (a ``buffered``
        record still in the process buffer is not yet in the files; `sync` first to see it).
        On a read-only log: everything valid in the files, a torn tail in progress excluded.
        """
        upto = self._read_bounds(from_lsn)
        return _read_records(self._dir, from_lsn, upto, self._scan_resume if upto is not None else None)

    def _read_upto(self, from_lsn: int, upto: int) -> Iterator[tuple[int, bytes]]:
        """`read` of a writable log, ending at `upto` (at most the written watermark): the
        archive's shipper reads up to the durable LSN, and the scan stops right there, where
        its next read begins."""
        written = self._read_bounds(from_lsn)
        assert written is not None, "a writable log's read"
        return _read_records(self._dir, from_lsn, min(upto, written), self._scan_resume)

    def read_spans(self, from_lsn: int = 1) -> Generator[RecordSpan, None, None]:
        """The records of `read`, as spans of a mapped segment (see `RecordSpan`), for readers
        that decode in C: no Python object per record. Replay uses it (wal.log.record.Collapser)."""
        upto = self._read_bounds(from_lsn)
        return _read_spans(self._dir, from_lsn, upto, resume=self._scan_resume if upto is not None else None)

    def _read_bounds(self, from_lsn: int) -> int | None:
        """The last LSN a read may return (None on a read-only log: whatever the files hold)."""
        if not isinstance(from_lsn, int) or from_lsn < 1:
            raise ArgumentError(f"from_lsn must be an int >= 1, got {from_lsn!r}")
        upto = self.watermarks.written if self._handle is not None else None
        if self._closed:
            raise ClosedError(f"the log in {self._dir} is closed")
        return upto

    # ---- stats -----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: commits, fsyncs, group sizes, fsync latency, durable lag, recovery."""
        rec = self._report
        base: dict[str, Any] = {
            "durability": self._durability.level,
            "rpo_ms": self._durability.rpo_ms,
            "recovery_seconds": rec.seconds,
            "recovery_segments": rec.segments,
            "recovery_records": rec.records,
            "torn_tail": rec.torn_tail,
            "lost_lsns": rec.lost_lsns,
        }
        if self._handle is None or self._forked:
            return base
        h = self._handle
        s = ffi.new("wal_log_stats *")
        lib.wal_log_get_stats(h, s)
        lat = ffi.new("uint64_t[1024]")
        n = lib.wal_log_fsync_latencies(h, lat, 1024)
        samples = sorted(lat[i] for i in range(n))

        def pct(p: float) -> float:
            return samples[min(len(samples) - 1, int(p * len(samples)))] / 1e6 if samples else 0.0

        base.update({
            "commits": s.commits,
            "appends": s.appends,
            "writes": s.writes,
            "mapped_writes": s.mapped_writes,
            "finished_later": s.finished_later,
            "fsyncs": s.fsyncs,
            "bytes_written": s.bytes_written,
            "group_size_mean": (s.synced_records / s.fsyncs) if s.fsyncs else 0.0,
            "group_size_max": s.group_max,
            "fsync_ms_p50": pct(0.50),
            "fsync_ms_p99": pct(0.99),
            "fsync_ms_max": s.fsync_ns_max / 1e6,
            "fsync_ms_mean": (s.fsync_ns_total / s.fsyncs / 1e6) if s.fsyncs else 0.0,
            "durable_lag_ms": s.lag_ns / 1e6,
            "backpressure_waits": s.backpressure_waits,
            "backpressure_ms": s.backpressure_ns / 1e6,
            "rpo_overruns": s.rpo_overruns,
            "write_errors": s.write_errors,
            "segments_created": s.segments_created,
            "segment_no": s.segment_no,
            "segment_offset": s.segment_offset,
            "pending_bytes": s.pending_bytes,
            "appended_lsn": s.appended_lsn,
            "written_lsn": s.written_lsn,
            "durable_lsn": s.durable_lsn,
            "failed": ffi.string(lib.wal_log_error_detail(h)).decode() if s.failed else None,
        })
        return base

    # ---- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Write and fdatasync everything acknowledged, stop the flusher, release the lock. Idempotent."""
        if self._closed:
            return
        if self._handle is not None and not self._forked and self._pid == os.getpid():
            self._closing = True  # first: a wait that sees `_closed` set goes on (`_closed_waits`)
        self._closed = True
        self._writer = None
        self._scan_resume.kept = None  # the newest segment's map (its fd) goes with the last reader
        if self._forked or self._pid != os.getpid():
            waiting, self._async = list(self._async.values()), {}
            try:
                for waiters in waiting:
                    waiters.detach()  # ClosedError: the C state is the parent's, not read here
            finally:
                # The parent still owns the lock and the C state: only drop our copy of the fd.
                if self._lock_fd is not None:
                    os.close(self._lock_fd)
            return
        rc = 0
        try:
            if self._handle is not None:
                try:
                    rc = lib.wal_log_close(self._handle)
                finally:  # even if interrupted: the waits registered meanwhile are answered from these
                    detail = ffi.string(lib.wal_log_error_detail(self._handle)).decode()
                    marks, archive_marks = ffi.new("uint64_t[3]"), ffi.new("uint64_t[2]")
                    failed = lib.wal_log_watermarks(self._handle, marks)
                    lib.wal_log_archive_marks(self._handle, archive_marks)
                    self._final = _FinalMarks(int(marks[1]), int(marks[2]),
                                              min(int(archive_marks[0]), int(marks[2])), bool(archive_marks[1]),
                                              failed, detail)
            # After the final marks: a loop's waiters made during the close are answered too,
            # and a wait after this line is answered from the marks (`_closed_waits`).
            waiting, self._async = list(self._async.values()), {}
            for waiters in waiting:
                waiters.detach()
        finally:
            if self._handle is not None:
                # Not freed here: another thread may be inside a call with this handle right now
                # (the closed log answers it with WAL_ECLOSED). Freed with the Log object, in
                # __del__, when no method of it can be running.
                self._closed_handle = self._handle
                self._handle = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None
        if rc != 0:
            raise FailedError(f"closing the log in {self._dir}: it had stopped after a failure ({detail}); "
                              "reopen it to recover every acknowledged commit")

    def __enter__(self) -> Log:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and not self._forked and self._pid == os.getpid():
            with contextlib.suppress(Exception):  # interpreter teardown: nothing to report to
                self.close()
        handle = getattr(self, "_closed_handle", None)
        if handle is not None and not self._forked and self._pid == os.getpid():
            self._closed_handle = None
            lib.wal_log_free(handle)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self._handle is None else "open")
        return f"<wal.Log {self._dir!r} {self._durability.level} {state}>"


# ---- helpers -----------------------------------------------------------------------------------


def _is_a_stores_log(path: str) -> bool:
    """Whether `path` is a store's log/ directory: named log, beside a STORE file (FORMAT.md §14)."""
    real = os.path.realpath(path)  # through a symlink too
    return os.path.basename(real) == "log" and os.path.exists(os.path.join(os.path.dirname(real), _STORE_FILE))


def _too_large(payload: bytes) -> RecordTooLargeError:
    return RecordTooLargeError(f"payload of {len(payload)} bytes is over the {MAX_PAYLOAD}-byte record limit")


def _pack(payloads: Iterable[bytes]) -> tuple[bytes, Any]:
    if isinstance(payloads, bytes | bytearray | memoryview | str):  # would be appended a record per byte
        raise ArgumentTypeError(f"append_many takes an iterable of payloads, not one {type(payloads).__name__}: "
                                "pass [payload], or call append")
    if not isinstance(payloads, Iterable):
        raise ArgumentTypeError(f"append_many takes an iterable of payloads (bytes), not {type(payloads).__name__}")
    items = [_as_payload(p) for p in payloads]
    for p in items:
        if len(p) > MAX_PAYLOAD:
            raise _too_large(p)
    lens = ffi.new("uint32_t[]", [len(p) for p in items]) if items else []
    return b"".join(items), lens


def take_lock(path: str) -> int:
    """I6: one writer per directory. flock conflicts between any two open file descriptions,
    so a second opener in this process, another process or a forked child is refused."""
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise LockedError(
            f"{path} is in use by another writer (pid {holder}); only one writer may open it at a time. "
            "Close the other writer, or open with readonly=True to read. (A read-only opener whose user may not "
            "write state/lock.mdb also keeps writers out while it is open.)"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # ENOSPC on a full disk: the lock is not kept
    except BaseException:
        os.close(fd)
        raise
    return fd


def _log_recovery(path: str, report: RecoveryReport) -> None:
    """Observability: what opening the log found and did (INFO), and what it cut or gave up (WARNING)."""
    _logger.info("opened log %s: %d segment(s), %d record(s), last LSN %d, scanned in %.3f s",
                 path, report.segments, report.records, report.last_lsn, report.seconds)
    if report.torn_tail is not None:
        segment, offset, nbytes = report.torn_tail
        kept = [b for b in report.broken_files if b.startswith(segment + ".")]
        _logger.warning("torn tail cut: %d byte(s) at offset %d of %s (after LSN %d); kept as %s",
                        nbytes, offset, segment, report.last_lsn, kept[0] if kept else "(all zero, not kept)")
    if report.lost_lsns is not None:
        first, last = report.lost_lsns
        _logger.warning("recovery='truncate' opened %s at LSN %d and gave up LSNs %d..%s; set aside: %s",
                        path, report.last_lsn, first, last if last is not None else "?",
                        ", ".join(report.broken_files) or "nothing")


def _segment_first_lsn(path: str) -> int:
    with open(path, "rb") as f:
        head = f.read(64)
    return int.from_bytes(head[32:40], "little")


def _refuse_cut_below(keep_through: int, new_last: int, where: str, offset: int) -> None:
    """A cut that would end the log at `new_last` < `keep_through`: refused, nothing changed."""
    if new_last < keep_through:
        raise CorruptionError(
            f"{where} is damaged at offset {offset}, after LSN {new_last}; cutting it there would lose LSNs "
            f"{new_last + 1}..{keep_through}, which the store's state already holds (they would be handed out "
            "again to new commits). Nothing was changed. The state holds every commit through LSN "
            f"{keep_through}: export it (`agentwal export`), or restore the log from a backup or the archive.",
            path=where, offset=offset, lsn=new_last + 1, reason="damaged log below the state")


def _recover(path: str, mode: str, segment_bytes: int, on_sealed: Callable[[SealedSegment], None] | None,
             keep_through: int = 0, *, first_lsn: int = 1) -> tuple[RecoveryReport, Any]:
    """Scan, repair what a torn tail or `recovery="truncate"` allows, and say where to resume;
    never cut the log below `keep_through` (Log.open). first_lsn: where a new (empty) log
    starts; an archive restore continues the archive's LSNs."""
    recovery.remove_temp_files(path)
    hook = None
    if on_sealed is not None:
        def hook(seg: recovery.SegmentScan) -> None:
            on_sealed(SealedSegment(seg.path, seg.segment_no, seg.first_lsn, seg.last_lsn))
    scan = recovery.scan_directory(path, on_sealed=hook)
    segments = scan.segments
    broken: list[str] = []
    torn: tuple[str, int, int] | None = None
    lost: tuple[int, int | None] | None = None
    damage = scan.damage
    if damage is not None:
        if mode != "truncate":
            raise recovery.corruption_error(damage, segments)
        bad = segments[damage.index]
        # scan_directory stops at the damage: read on past it, or the lost range is understated.
        lost = recovery.lost_range(path, scan)
        if damage.offset == 0 and damage.index == 0:
            # Checked before anything is set aside: the error says "Nothing was changed".
            err = recovery.corruption_error(damage, segments)
            err.add_note(
                "recovery='truncate' cannot help: the oldest segment itself is unreadable, so there is "
                "no good record to open at. Move the directory aside and restore from a backup."
            )
            raise err
        _refuse_cut_below(keep_through, damage.lsn - 1, bad.path, damage.offset)
        # Cut the damaged segment at its last good record, then set aside every later segment,
        # oldest first. A crash in the middle leaves later segments behind the cut one (rule
        # S4, or a gap): a strict open refuses that as damage, and the next truncate finds the
        # newest of them and reports the whole lost range. Set aside first, a crash before the
        # cut left the damaged segment newest: its damage could read as a torn tail (cut as
        # after any crash), and the lost range ended at its own records.
        later_segments = [p for n, p in recovery.list_segments(path) if n > bad.segment_no]
        if damage.offset == 0:
            broken.append(recovery.set_aside(bad.path))
            segments = segments[: damage.index]
        elif damage.reason == "data after seal":
            # The segment is whole up to its seal; cut the junk after it and keep it sealed.
            cut = recovery.cut_tail(bad.path, bad.end_offset, bad.size)
            if cut:
                broken.append(cut)
            bad.status = "sealed"
            segments = segments[: damage.index + 1]
        else:
            cut = recovery.cut_tail(bad.path, damage.offset, bad.size)
            if cut:
                broken.append(cut)
            if bad.size < bad.prealloc_bytes <= recovery.MAX_PREALLOC:
                # Cut short by someone: give it back its size, so rule S6 holds again.
                fd = os.open(bad.path, os.O_RDWR | os.O_CLOEXEC)
                try:
                    os.ftruncate(fd, bad.prealloc_bytes)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                bad.size = bad.prealloc_bytes
            bad.status, bad.end_offset = "open", damage.offset
            segments = segments[: damage.index + 1]
        broken.extend(recovery.set_aside(p) for p in later_segments)
    elif segments and segments[-1].status == "torn":
        last = segments[-1]
        _refuse_cut_below(keep_through, last.last_lsn, last.path, last.bad_offset)
        cut = recovery.cut_tail(last.path, last.bad_offset, last.damage_end)
        if cut:
            broken.append(cut)
        torn = (last.path, last.bad_offset, last.damage_end - last.bad_offset)
        last.status, last.end_offset = "open", last.bad_offset

    cfg = ffi.new("wal_log_config *")
    cfg.segment_bytes = segment_bytes
    if segments:
        last = segments[-1]
        cfg.log_id = last.log_id
        cfg.next_lsn = last.last_lsn + 1
        # Records found on open may only be in the page cache (written, never synced): make
        # them durable before anything is built on them (I1). A sealed newest segment too: a
        # writer killed between writing the seal and its fdatasync leaves exactly that.
        fd = os.open(last.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        # And their names: a writer killed between a roll's rename and its directory fsync
        # (FORMAT.md §7.2, steps 6-7) leaves a segment whose name a power cut would take back,
        # with every commit this open appends to it.
        fsync_dir(path)
        if last.status == "sealed":
            cfg.need_new_segment = 1
            cfg.segment_no = last.segment_no + 1
        else:
            cfg.segment_no = last.segment_no
            cfg.segment_salt = last.salt
            cfg.segment_size = last.size
            cfg.tail_offset = last.end_offset
    else:
        cfg.need_new_segment = 1
        cfg.segment_no = 1
        cfg.next_lsn = first_lsn
    report = RecoveryReport(
        segments=len(segments), records=sum(s.records for s in segments),
        last_lsn=int(cfg.next_lsn) - 1, seconds=scan.seconds, torn_tail=torn,
        broken_files=tuple(broken), lost_lsns=lost,
    )
    return report, cfg


class RecordSpan(NamedTuple):
    """Up to `records` consecutive records of one segment, as `Log.read_spans` yields them.

    Record i's payload is ``buffer[offsets[i] : offsets[i] + lengths[i]]``; `lsns`, `offsets`
    (u64) and `lengths` (u32) are native-endian arrays that support the buffer protocol. The
    buffer is the mapped segment image: it and the arrays are valid only until the next span
    is asked for. A span of 0 records ends a segment: views of its buffer must be released
    then (the log unmaps it next).
    """

    buffer: Any
    lsns: Any
    offsets: Any
    lengths: Any
    records: int


class SealedSegment(NamedTuple):
    """A segment the open's scan verified whole and sealed (see `Log.open`, on_sealed_segment)."""

    path: str
    number: int
    first_lsn: int
    last_lsn: int  # first_lsn - 1 when it holds no records

    def read_spans(self, from_lsn: int) -> Generator[RecordSpan, None, int | None]:
        """Its records from `from_lsn` on, as `Log.read_spans` hands them out (checked again as
        they are read, like every read of the log)."""
        return _segment_spans(self.path, self.number, from_lsn, None)


class _ReadCache:
    """What a writable log's own reads keep between calls (`Log.read` and `Log.read_spans` up to
    the written watermark; the archive's shipper makes one per group object, on its path from
    one PUT to the next, where every system call lets the GIL go and waits to get it back):

    - ``resume``: path -> (its header bytes, the scan state at the end of the last batch read,
      the state at its start or None): both at record boundaries; a read from a later LSN of
      the same segment (same header) continues from the later of them before that LSN instead
      of validating the segment again from its start. The start matters to a reader that
      stops inside a batch (it took fewer records than the scan validated): without it, its
      next read, from inside that batch, validated the whole segment again, a cost that grew
      with the segment;
    - ``firsts``: path -> the segment's first LSN (from its header; it never changes);
    - ``kept``: the newest segment, mapped whole, with the offset below which its pages were
      given back: not mapped again for each read, and a read from an LSN in it starts there
      without listing the directory (`_read_spans`). Segments are preallocated and never cut
      while the log is open (only the open's repair truncates), so the map stays inside the
      file; a map that ends before the records asked for (a segment grown past its
      preallocation) is made again, and the read goes on in the new one. Dropped, never
      closed here: spans handed out may still point into it (the map closes with the last
      reference)."""

    def __init__(self) -> None:
        self.resume: dict[str, tuple[bytes, Any, Any]] = {}
        self.firsts: dict[str, int] = {}
        self.kept: tuple[str, Any, list[int]] | None = None

    def forget_except(self, paths: set[str]) -> None:
        """Forget segments a checkpoint removed."""
        for gone in self.resume.keys() - paths:
            self.resume.pop(gone, None)
        for gone in self.firsts.keys() - paths:
            self.firsts.pop(gone, None)
        if self.kept is not None and self.kept[0] not in paths:
            self.kept = None

    def first_lsn(self, path: str) -> int:
        first = self.firsts.get(path)
        if first is None:
            first = self.firsts[path] = _segment_first_lsn(path)
        return first

    @contextlib.contextmanager
    def newest_map(self, path: str) -> Iterator[tuple[Any, list[int]]]:
        """The newest segment's map (made once) and its given-back mark."""
        kept = self.kept
        if kept is None or kept[0] != path:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                buf = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
            kept = self.kept = (path, buf, [0])
        yield kept[1], kept[2]


def _read_records(directory: str, from_lsn: int, upto: int | None,
                  resume: _ReadCache | None = None) -> Iterator[tuple[int, bytes]]:
    for span in _read_spans(directory, from_lsn, upto, _READ_RECORDS, resume):
        if span.records:
            # One C call per span makes its (lsn, payload) tuples (native/readcall.c).
            yield from span_records(span.buffer, span.lsns, span.offsets, span.lengths, span.records)


def _read_spans(directory: str, from_lsn: int, upto: int | None, batch: int = _SPAN_RECORDS,
                resume: _ReadCache | None = None) -> Generator[RecordSpan, None, None]:
    kept = resume.kept if resume is not None and upto is not None else None
    if kept is not None and resume is not None and resume.firsts.get(kept[0], from_lsn + 1) <= from_lsn:
        # The newest segment as of the last listing, kept mapped, and it starts at or before
        # from_lsn: read it without listing the directory. Once it ends before upto (sealed: the
        # log rolled since), the listing below finds the rest (and checks the LSNs run on).
        number = recovery.parse_segment_name(os.path.basename(kept[0]))
        if number is not None:
            spans = _segment_spans(kept[0], number, from_lsn, upto, batch=batch, resume=resume, newest=True)
            handed = False  # a span of records handed out from it
            try:
                while True:
                    span = next(spans)
                    handed = handed or span.records > 0
                    yield span
            except StopIteration as done:
                last = done.value
                if last is None:
                    return
                from_lsn = max(from_lsn, last + 1)
            except FileNotFoundError:
                # Released by a checkpoint since it was kept (the log rolled past it and the
                # oldest segments went): the listing below finds where from_lsn is now, or says
                # it is gone; a raw FileNotFoundError reached the reader.
                if os.path.exists(kept[0]):
                    raise
                if handed:
                    raise _released_while_read(directory, from_lsn) from None
            finally:
                spans.close()
    segments, firsts = _listed(directory, resume)
    if segments and from_lsn < firsts[0] and (upto is None or from_lsn <= upto):
        raise ArgumentError(
            f"LSN {from_lsn} is no longer in the log of {directory}: its oldest record is LSN {firsts[0]} "
            "(older segments were removed by a checkpoint)"
        )
    ended: tuple[str, int] | None = None  # (path, last LSN) of the segment read before this one
    for i, (number, path) in enumerate(segments):
        if i + 1 < len(firsts) and firsts[i + 1] <= from_lsn:
            continue  # wholly before from_lsn
        if upto is not None and firsts[i] > upto:
            return
        if ended is not None and firsts[i] != ended[1] + 1:
            # A segment cut short after the open (a torn tail is only ever the newest one's):
            # never hand out what follows a hole (I3).
            raise CorruptionError(
                f"log damaged while reading: {ended[0]} ends at LSN {ended[1]} but the next segment, {path}, "
                f"starts at LSN {firsts[i]}", path=ended[0], lsn=ended[1] + 1, reason="lsn gap",
            )
        live_tail = upto is None and i == len(segments) - 1
        try:
            last = yield from _segment_spans(path, number, from_lsn, upto, live_tail=live_tail, batch=batch,
                                             resume=resume, newest=i == len(segments) - 1)
        except FileNotFoundError:
            if os.path.exists(path):
                raise
            # Released by a checkpoint since the listing (the oldest segments go first): the
            # records asked for went with it.
            raise _released_while_read(directory, max(from_lsn, firsts[i])) from None
        if last is None:
            return  # past upto
        ended = (path, last)


def _released_while_read(directory: str, lsn: int) -> ArgumentError:
    return ArgumentError(f"LSN {lsn} is no longer in the log of {directory}: its segment was removed by a "
                         "checkpoint while it was being read")


def _listed(directory: str, resume: _ReadCache | None) -> tuple[list[tuple[int, str]], list[int]]:
    """The log's segments and the first LSN of each. A checkpoint may release the oldest while
    their headers are read (a reader beside the writer, or the writer's own reads beside its
    checkpoints): a segment gone meanwhile means a listing out of date, so it is listed again."""
    for _ in range(_RELISTS):
        segments = recovery.list_segments(directory)
        if resume is not None:
            resume.forget_except({p for _, p in segments})
        try:
            firsts = [resume.first_lsn(p) if resume is not None else _segment_first_lsn(p) for _, p in segments]
        except FileNotFoundError:
            continue
        return segments, firsts
    raise StorageError(f"the segments of the log in {directory} kept disappearing while they were listed "
                       f"({_RELISTS} times); is something else removing them?", errno=errno.ENOENT, filename=directory)


_RELISTS = 100


def _segment_spans(path: str, number: int, from_lsn: int, upto: int | None, *, live_tail: bool = False,
                   batch: int = _SPAN_RECORDS, resume: _ReadCache | None = None,
                   newest: bool = False) -> Generator[RecordSpan, None, int | None]:
    """The records of one segment file from `from_lsn` on, as spans, ending with a span of 0
    records; returns the segment's last LSN, or None once a record past `upto` was reached.

    The segment is validated and handed out in one pass (wal_scan_records); damage comes
    after the records already handed out, and is raised when reached. The tail of a log
    another process may be writing (`live_tail`) is scanned whole first, the scan repeated
    until its verdict holds still (a record caught mid-write looks like damage), and only
    the part that verdict vouches for is handed out.

    `resume` (a writable log's own reads, up to `upto`): what earlier reads kept (`_ReadCache`):
    the scan resumes where one stopped, and the `newest` segment stays mapped.
    """
    lsns = ffi.new("uint64_t[]", batch)
    offs = ffi.new("uint64_t[]", batch)
    lens = ffi.new("uint32_t[]", batch)
    count = ffi.new("size_t *")

    def refuse_damage(res: Any) -> None:
        if res.status == lib.WAL_SCAN_CORRUPT and (upto is None or res.last_lsn < upto):
            scan = recovery.scan_segment_file(path, number)
            raise CorruptionError(
                f"log damaged while reading: {recovery._describe(scan)}",
                path=path, offset=scan.bad_offset, lsn=scan.last_lsn + 1, reason=scan.reason,
            )

    keep = resume is not None and newest and upto is not None
    with (resume.newest_map(path) if keep and resume is not None else _fresh_map(path)) as (buf, mark):
        data = ffi.from_buffer("uint8_t[]", buf) if len(buf) else ffi.NULL
        dropped = mark[0]  # pages before this were given back (recovery.give_back_pages)
        try:
            limit = len(buf)
            if live_tail:
                settled = recovery.settled_scan_buffer(buf, recovery.scan_buffer(buf))
                refuse_damage(settled)
                limit = settled.end_offset
            res = ffi.new("wal_scan_result *")
            head = bytes(buf[:_HEADER_BYTES])
            saved = resume.resume.get(path) if resume is not None else None
            if saved is not None and saved[0] == head:
                # Validated before: go on from there (the end of the last batch, else its start:
                # a reader that stopped inside the batch, as the shipper does at the durable LSN,
                # reads on from there without validating the segment again from its start).
                for state in (saved[1], saved[2]):
                    if state is not None and state.last_lsn < from_lsn:
                        ffi.memmove(res, state, _SCAN_RESULT_BYTES)
                        break
            while True:
                # Reading up to `upto` (a writable log), ask for no record past it: the scan then
                # stops right after it instead of validating on to the end of the segment (and
                # over the zeros of its unwritten, preallocated rest).
                want = batch if upto is None else min(batch, upto - max(from_lsn, int(res.last_lsn) + 1) + 1)
                if want <= 0:
                    yield RecordSpan(buf, _NO_ARRAY, _NO_ARRAY, _NO_ARRAY, 0)
                    return None
                more = lib.wal_scan_records(data, limit, res, from_lsn, want, lsns, offs, lens,
                                            count) == lib.WAL_SCAN_MORE
                n = count[0]
                if more and resume is not None:
                    # Record boundaries every byte before which was validated: the next read of
                    # this segment (from a later LSN) resumes at the end of this batch, or at
                    # its first record if it begins inside it (`_ReadCache`).
                    kept = ffi.new("wal_scan_result *")
                    ffi.memmove(kept, res, _SCAN_RESULT_BYTES)
                    start = None
                    if n:
                        # The state the scan had right before the batch's first record: the n
                        # records from there on are the DATA records it counted since.
                        start = ffi.new("wal_scan_result *")
                        ffi.memmove(start, res, _SCAN_RESULT_BYTES)
                        start.end_offset = offs[0] - _RECORD_HEADER_BYTES
                        start.last_lsn = lsns[0] - 1
                        start.records = res.records - n
                    resume.resume[path] = (head, kept, start)
                past_end = n > 0 and upto is not None and lsns[n - 1] > upto
                if past_end:  # LSNs ascend: keep those up to `upto`
                    n = next(j for j in range(n) if lsns[j] > upto)
                if n:
                    yield RecordSpan(buf, memoryview(ffi.buffer(lsns, 8 * n)),
                                     memoryview(ffi.buffer(offs, 8 * n)), memoryview(ffi.buffer(lens, 4 * n)), n)
                    dropped = mark[0] = recovery.give_back_pages(buf, dropped, int(offs[n - 1]))
                if past_end:
                    yield RecordSpan(buf, _NO_ARRAY, _NO_ARRAY, _NO_ARRAY, 0)
                    return None
                if not more:
                    break
            if keep and resume is not None and upto is not None and res.last_lsn < upto \
                    and len(buf) < _size_if_present(path):
                # The segment grew past the kept map (past its preallocation): map it again and
                # go on from the next record (the scan resumes where it was validated up to).
                resume.kept = None
                return (yield from _segment_spans(path, number, max(from_lsn, int(res.last_lsn) + 1), upto, batch=batch,
                                                  resume=resume, newest=True))
            refuse_damage(res)
            yield RecordSpan(buf, _NO_ARRAY, _NO_ARRAY, _NO_ARRAY, 0)
            return int(res.last_lsn)
        finally:
            # The map cannot close while a cffi buffer still exports it (also when the
            # caller stops iterating early).
            if data != ffi.NULL:
                ffi.release(data)


def _size_if_present(path: str) -> int:
    """A segment's size; 0 once a checkpoint removed it. The kept map of a segment that was the
    newest at the last listing may outlive its file: the log rolled, the archive shipped it
    whole, a checkpoint removed it. It holds all its records then (sealed before it went), and
    the read goes on past it in the listing."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


@contextlib.contextmanager
def _fresh_map(path: str) -> Iterator[tuple[Any, list[int]]]:
    with recovery.mapped(path) as buf:
        yield buf, [0]


class _AsyncWaiters:
    """Futures of one event loop waiting for watermarks, woken through the log's eventfd."""

    def __init__(self, log: Log, loop: asyncio.AbstractEventLoop, handle: Any) -> None:
        self._log = log
        self._loop = loop
        self._handle = handle
        self._fd = int(lib.wal_log_notify_fd(self._handle))
        self._heap: list[tuple[int, int, int, asyncio.Future[None]]] = []
        # (lsn, future) of coroutines waiting for the archive's watermark (`until_archived`), in
        # LSN order, apart from `_heap`: they are ready in LSN order whatever the levels waited
        # for there. A deque, not a heap: a loop's commits register in the order they were
        # appended (a task waits right after its append), so a wait is an append and a wake a
        # popleft; an LSN out of order (a commit that waited for its fdatasync first) is
        # inserted in its place.
        self._archived: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._archive_marks = ffi.new("uint64_t[2]")
        # The archive's watermark (capped at the durable LSN), whether its shipper stopped and
        # the log's failure code, as of the last `_check`, once a coroutine of this loop has
        # waited for the archive (`_archiving`): from then on every `_check` reads them, so a
        # wait registered after the event that announced them (drained) is answered at once.
        self._archiving = False
        self._archived_mark = 0
        self._archive_stopped = False
        self._archive_failed = 0
        self._progress: list[asyncio.Future[None]] = []
        self._failed = 0  # the log's failure code as of the last `_check` (a wait after it fails at once)
        self._closed_out = False  # `_close_out` ran: every later wait is answered from the final marks
        self._seq = itertools.count()
        self._marks = ffi.new("uint64_t[3]")
        lib.wal_log_watermarks(self._handle, self._marks)  # after notify_fd: later progress is an event
        self._attached = False

    def _attach(self) -> None:
        if not self._attached and not self._closed_out and self._log._final is None:
            self._loop.add_reader(self._fd, self._on_ready)
            # Attached, then the marks read again, and a check once this callback is done:
            # another loop that drains the eventfd wakes only loops attached by then
            # (`_on_ready`), so an event it drained before this line (progress, a failure, a
            # refusal for lack of space) is in these marks or found by that check, and one after
            # it wakes this loop. Without them, a first wait on this loop slept through such an
            # event for good.
            self._attached = True
            lib.wal_log_watermarks(self._handle, self._marks)
            self._loop.call_soon(self._check)

    def detach(self) -> None:
        """The log closed (`Log.close`, its final marks read) or this process is a fork of the one
        that owns it: answer every waiter of this loop, on the loop's own thread. A future is
        the loop's to resolve: set from another thread it neither wakes the loop nor is safe
        against the loop resolving it at the same moment, and the waiters' lists are the loop's
        too. Each gets what `Log._after_close` says: a commit the final marks cover is
        acknowledged (a blanket ClosedError told a caller whose commit close made durable, or the
        archive took during the store's close, to commit it again)."""
        if self._loop.is_closed():
            return  # nobody awaits its futures any more
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is not self._loop and self._loop.is_running():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: nobody awaits its futures
                self._loop.call_soon_threadsafe(self._close_out)
            return
        self._close_out()

    def _close_out(self) -> None:
        """`detach`'s answers, on the loop's thread. A wait registered later (a coroutine between
        its check of the log and its registration, on this object or on one made during the
        close) is answered as it registers (`until`, `until_archived`)."""
        self._closed_out = True
        if self._attached:
            self._loop.remove_reader(self._fd)
            self._attached = False
        after_close = self._log._after_close
        for lsn, level, _, fut in self._heap:
            if not fut.done():
                self._answer(fut, after_close(lsn, level))
        for lsn, fut in self._archived:
            if not fut.done():
                self._answer(fut, after_close(lsn, None))
        self._heap.clear()
        self._archived.clear()
        self._wake_progress()

    @staticmethod
    def _answer(fut: asyncio.Future[None], outcome: BaseException | None) -> None:
        if outcome is None:
            fut.set_result(None)
        else:
            fut.set_exception(outcome)

    def _wake_progress(self) -> None:
        for fut in self._progress:
            if not fut.done():
                fut.set_result(None)
        self._progress.clear()

    def progress(self) -> asyncio.Future[None]:
        self._attach()
        fut: asyncio.Future[None] = self._loop.create_future()
        if self._closed_out or self._log._final is not None:
            fut.set_result(None)  # closed: no progress will come; the caller finds the log closed
        else:
            self._progress.append(fut)
        return fut

    async def until(self, lsn: int, level: int) -> None:
        """Resolve once `level` holds for `lsn` (mostly an LSN this loop has just enqueued; also
        one waited for again after a cancellation, or another commit's).

        No C call here (each would release the GIL): the marks and failure cached by the last
        check answer the early cases; otherwise register. Nothing is missed: progress or a
        failure after that check writes the eventfd, which stays readable until an
        `_on_ready` drains it -- this loop's, after the registration, or another attached
        loop's, which then schedules this loop's check (`_attach` covers a loop not yet
        attached).
        """
        if level == lib.WAL_LEVEL_BUFFERED:
            return
        self._attach()
        if (self._marks[2] if level == lib.WAL_LEVEL_SYNC else self._marks[1]) >= lsn:
            return
        if self._failed:  # seen by an earlier check: no event will come again for it
            raise self._failure(self._failed)
        fut: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._heap, (lsn, level, next(self._seq), fut))
        if self._closed_out or self._log._final is not None:
            self._answer(fut, self._log._after_close(lsn, level))
        await fut

    async def until_archived(self, lsn: int) -> None:
        """Resolve once `lsn` is durable and the archive holds it (`Log.wait_archived_async`).
        Nothing is missed, as in `until`: the archive's progress writes the eventfd too."""
        self._attach()
        if not self._archiving:
            self._archiving = True
            failed = lib.wal_log_watermarks(self._handle, self._marks)  # fresher marks: harmless to `until`
            self._read_archive_marks(int(self._marks[2]), failed)
        if self._archived_mark >= lsn:
            return
        if self._archive_failed or self._archive_stopped:
            raise self._archive_error(lsn)
        fut: asyncio.Future[None] = self._loop.create_future()
        waiting = self._archived
        if not waiting or waiting[-1][0] <= lsn:
            waiting.append((lsn, fut))
        else:
            waiting.insert(bisect.bisect_right([w[0] for w in waiting], lsn), (lsn, fut))
        if self._closed_out or self._log._final is not None:
            self._answer(fut, self._log._after_close(lsn, None))
        await fut

    def _on_ready(self) -> None:
        try:
            os.read(self._fd, 8)  # drain the eventfd
        except BlockingIOError:
            pass  # another loop drained it first, and woke this one (below)
        else:
            # The eventfd is the log's, one for every loop: the others may not have seen it
            # readable before this read, and would sleep through the progress it announced.
            for other in list(self._log._async.values()):
                if other is not self and other._attached:
                    with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                        other._loop.call_soon_threadsafe(other._check)
        self._check()

    def _check(self) -> None:
        """Resolve what the watermarks now allow (on this loop)."""
        self._wake_progress()
        failed = lib.wal_log_watermarks(self._handle, self._marks)
        if failed == lib.WAL_ECLOSED:
            if self._log._final is not None:  # as `detach` would (and does, unless its close was interrupted)
                self._close_out()
                return
            failed = 0  # closing: `detach` answers from the final marks once they are read
        self._failed = failed
        written, durable = int(self._marks[1]), int(self._marks[2])
        no_space_through = int(lib.wal_log_write_failed_through(self._handle))
        refused_errno = int(lib.wal_log_write_failed_errno(self._handle)) if no_space_through else 0
        pending: list[tuple[int, int, int, asyncio.Future[None]]] = []
        while self._heap:
            lsn, level, seq, fut = heapq.heappop(self._heap)
            mark = durable if level == lib.WAL_LEVEL_SYNC else written
            if fut.done():
                continue
            if mark >= lsn:
                fut.set_result(None)
            elif written < lsn <= no_space_through:
                fut.set_exception(self._refused(refused_errno))
            elif failed:
                fut.set_exception(self._failure(failed))
            else:
                pending.append((lsn, level, seq, fut))
                if level == lib.WAL_LEVEL_SYNC and lsn > durable:
                    # the heap is ordered by LSN; later ones are not ready either
                    break
        for item in pending:
            heapq.heappush(self._heap, item)
        if self._archiving:
            self._check_archived(written, durable, failed, no_space_through, refused_errno)

    def _failure(self, failed: int) -> WalError:
        """What a waiting commit gets from a log that failed (I5) or closed (`failed`: its code)."""
        if failed == lib.WAL_ECLOSED:
            return ClosedError("the log was closed")
        detail = ffi.string(lib.wal_log_error_detail(self._handle)).decode()
        return FailedError(f"append to the log in {self._log.directory} failed: {detail}")

    def _refused(self, refused_errno: int) -> WalError:
        """What a commit the log could not write for lack of space (or of a file) gets."""
        detail = ffi.string(lib.wal_log_error_detail(self._handle)).decode()
        doing = f"append to the log in {self._log.directory}"
        return (no_descriptor_error(doing, detail, refused_errno) if refused_errno in (errno.EMFILE, errno.ENFILE)
                else NoSpaceError(f"{doing}: {detail}"))

    def _read_archive_marks(self, durable: int, failed: int) -> None:
        """The archive's marks, after the watermarks (`durable`, `failed`) were read."""
        lib.wal_log_archive_marks(self._handle, self._archive_marks)
        if int(self._archive_marks[0]) > durable:
            # The archive only ever holds durable records: the watermarks, read first, are older
            # than what it took since. Read them again, or a commit it took in between, past the
            # stale durable LSN, would be failed as one it never will take once its shipper
            # stopped (and its caller, told so, would commit it twice).
            failed = lib.wal_log_watermarks(self._handle, self._marks)
            durable = int(self._marks[2])
        self._archived_mark = min(int(self._archive_marks[0]), durable)
        self._archive_stopped = bool(self._archive_marks[1])
        self._archive_failed = 0 if failed == lib.WAL_ECLOSED else failed  # closed: `detach` answers

    def _archive_error(self, lsn: int) -> WalError:
        """What a coroutine waiting for the archive to hold `lsn` gets once it never will."""
        if self._archive_failed:
            return self._failure(self._archive_failed)
        return FailedError(f"the archive of the log in {self._log.directory} stopped before LSN {lsn} reached it")

    def _check_archived(self, written: int, durable: int, failed: int, no_space_through: int,
                        refused_errno: int) -> None:
        self._read_archive_marks(durable, failed)
        archived = self._archived_mark
        waiting = self._archived
        while waiting:
            lsn, fut = waiting[0]
            if fut.done() or lsn <= archived:
                waiting.popleft()
                if not fut.done():
                    fut.set_result(None)
            elif written < lsn <= no_space_through:  # never written, so never archived
                waiting.popleft()
                fut.set_exception(self._refused(refused_errno))
            else:
                break
        if waiting and (self._archive_failed or self._archive_stopped):
            for lsn, fut in waiting:
                if not fut.done():
                    fut.set_exception(self._archive_error(lsn))
            waiting.clear()

