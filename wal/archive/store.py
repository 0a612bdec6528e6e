"""`ArchivedStore`: a `wal.Store` whose log and state are shipped to an object archive.

It is the store unchanged (the same commit path, the C fast path included) plus:
- a `Shipper` thread (wal/archive/shipper.py) started after the open's recovery;
- `replicated` commits, acknowledged only once the local fdatasync AND the archive hold them.
  A single put/delete at a `replicated` store is appended through the C path without waiting
  (storecore's `commit(..., True)`, as `aput` does) and then waits once, in C, for its
  fdatasync and the archive (`Shipper.wait_archived(appended=True)`); what the C path
  declines, and every other commit, runs at `sync` and then waits for the shipper's archived
  LSN (the Python path's `_commit`). The store's `_commit_fast` declines, so nothing in the
  store's own code acknowledges a commit at `replicated` from the C path alone;
- the `archive_rpo_ms` bound checked before each commit (`Shipper.admit`);
- checkpoints that never remove a log segment holding an LSN not yet archived (`_removable_before`);
- `stats()` with `archived_lsn`, `archive_lag_ms`, PUT counts and rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from wal._bindings import WATERMARKS_ARCHIVED, durable_lsn_reader
from wal.archive import layout
from wal.archive.objects import (
    ArchiveUnavailableError,
    ObjectMissingError,
    ObjectStore,
    fencing_refusal,
    open_objects,
    same_location,
)
from wal.archive.plan import Piece, find_end, list_archive
from wal.archive.sealed import SealedObjects
from wal.archive.sealed import wrap as seal_objects
from wal.archive.shipper import ADMIT_POLL_S, Resolved, Shipper, wait_for_lingering_puts
from wal.archive.spool import SpooledSnapshot
from wal.errors import ArgumentError, ConflictError, FailedError, NoSpaceError, WalError, storage_error
from wal.log import record
from wal.store.sealed import plan as plan_sealing
from wal.store.store import Store, shipping_archive

_logger = logging.getLogger("wal.archive")
# How long an archived open waits for PUTs a store closed earlier in this process left in
# flight to the same archive (`_resolve`): an S3 client's own timeouts run to about a minute.
_LINGERING_PUTS_WAIT_S = 60.0

_STORE_PUT = Store.put  # the C fast path (storecore.FastCommit) wrapping the Python method
_STORE_DELETE = Store.delete

POLICIES = ("block", "error")
# An archive snapshot is spooled only with room for the state's live pages (not its file, which
# keeps its free pages), this much per entry (a snapshot entry's header), and this margin left
# for the log (ArchivedStore._logical_snapshot).
_SPOOL_ENTRY_BYTES = 24
_SPOOL_MARGIN_BYTES = 256 << 20


def _decline(*_args: object) -> int:
    return 0  # "the fast path did nothing": the Python path decides


class ArchivedStore(Store):
    _object_archive = True
    _shipper: Shipper | None = None
    _replicated = False
    _close_flush_s = 10.0
    _archive_fencing = True

    # ---- commits ------------------------------------------------------------------------------

    def _admit(self) -> None:
        shipper = self._shipper
        if shipper is not None:
            shipper.admit()

    # put/delete at the store's level. At a replicated store: the C path's append without a
    # wait, then one wait in C for the fdatasync and the archive (the GIL let go once, where a
    # `sync` commit and then a wait for the archive let it go twice, and every thread woken
    # takes it back in turn). What the C path declines goes to Store.put and `_commit` below,
    # which waits for the archive itself. At 64 threads the C path's share of the GIL is a
    # fraction of the Python path's, and every microsecond of it delays the shipper's next PUT.

    def put(self, key: bytes | str, value: bytes, *, durability: str | None = None) -> int:
        self._admit()
        if durability is None:
            return self._commit_replicating(record.OP_PUT, key, value, _STORE_PUT, (self, key, value))
        return int(_STORE_PUT(self, key, value, durability=durability))  # -> _commit below

    def delete(self, key: bytes | str, *, durability: str | None = None) -> int:
        self._admit()
        if durability is None:
            return self._commit_replicating(record.OP_DELETE, key, None, _STORE_DELETE, (self, key))
        return int(_STORE_DELETE(self, key, durability=durability))

    def _commit_replicating(self, kind: int, key: bytes | str, value: bytes | None,
                            plain: Callable[..., Any], args: tuple[Any, ...]) -> int:
        """put/delete at the store's level. At a replicated store: appended through the C path
        without waiting, then one wait for the fdatasync and the archive together
        (Shipper.wait_appended): the GIL let go once. What the C path declines goes to
        `plain(*args)` (Store.put/delete), then waits for the archive."""
        if self._replicated:
            lsn = int(self._core.commit(kind, key, value, True))
            if lsn > 0:
                self._wait_archived(lsn, appended=True)
                return lsn
        lsn = int(plain(*args))
        if self._replicated:
            self._wait_archived(lsn)
        return lsn

    async def _commit_one_async(self, kind: int, key: bytes | str, value: bytes | None,
                                durability: str | None) -> int:
        """aput/adelete, admitted first at every level (archive_rpo_ms): the base's C path
        bypasses `_commit_async`, which admits the Python path's commits. At a replicated store:
        the local commit through the C path (never blocks the loop), awaited at `sync`, then the
        archive awaited; what the C path declines goes to the Python path (`_commit_fast`
        declines there, so `_commit_async` below waits for the archive)."""
        await self._admit_async()
        if durability is None and self._replicated:
            lsn = int(self._core.commit(kind, key, value, True))
            if lsn > 0:
                await self._wait_archived_async(lsn, appended=True)
                return lsn
        return await super()._commit_one_async(kind, key, value, durability)

    def _inner(self, durability: str | None) -> str | None:
        """The level the store's own commit path runs a commit at: "sync" for the local part of
        a replicated one (None at a replicated store, whose log level is sync)."""
        if durability == "replicated":
            return None if self._replicated else "sync"
        return durability

    def _is_replicated(self, durability: str | None) -> bool:
        return durability == "replicated" or (durability is None and self._replicated)

    def _commit(self, txn: record.Txn, checks: dict[bytes, int], durability: str | None,
                payload: bytes | None = None, *, wait_visible: bool = True) -> tuple[int, bool]:
        self._admit()
        replicated = self._is_replicated(durability)
        done = super()._commit(txn, checks, self._inner(durability), payload, wait_visible=wait_visible)
        if replicated:
            self._wait_archived(done[0])
        return done

    async def _commit_async(self, txn: record.Txn, checks: dict[bytes, int], durability: str | None,
                            payload: bytes | None = None, *, wait_visible: bool = True) -> tuple[int, bool]:
        await self._admit_async()
        replicated = self._is_replicated(durability)
        try:
            done = await super()._commit_async(txn, checks, self._inner(durability), payload,
                                               wait_visible=wait_visible)
        except ConflictError as exc:
            # As `_until_visible`: raised once the conflicting commit is readable, here once the
            # archive holds it too (a replicated store's reads wait for that).
            lsn = exc.conflicting_lsn
            if wait_visible and self._replicated and lsn is not None and lsn > self._visible_lsn():
                with contextlib.suppress(WalError):
                    await self._wait_archived_async(lsn)
            raise
        if replicated:
            await self._wait_archived_async(done[0])
        return done

    def _until_visible(self, lsn: int | None) -> None:
        """A replicated store's reads see a commit once the archive holds it: a caller told of a
        conflict waits for that too, or its retry reads the version it conflicted with, again."""
        super()._until_visible(lsn)
        if self._replicated and lsn is not None and self._log is not None and lsn > self._visible_lsn():
            with contextlib.suppress(WalError):
                self._wait_archived(lsn)

    async def _admit_async(self) -> None:
        """`_admit` for a coroutine: it sleeps on its loop while held back (policy "block"); a
        thread each (asyncio.to_thread) filled the default executor that the application's
        own to_thread calls share, for as long as the object store was down."""
        shipper = self._shipper
        while shipper is not None and not shipper.try_admit():
            await asyncio.sleep(ADMIT_POLL_S)

    async def _wait_archived_async(self, lsn: int, *, appended: bool = False) -> None:
        """`_wait_archived` for a coroutine: one future of its loop, resolved once the commit is
        durable and the archive holds it (`Log.wait_archived_async`; the archive only ever holds
        durable records). `appended`: a commit appended without waiting, whose group a PUT
        thread gathers (`Shipper.kick_for`). Cancellation as for `_acknowledged_async`: the
        commit is in the log, so the wait goes on, shielded, and the CancelledError is raised
        once the commit is acknowledged."""
        shipper, log = self._shipper, self._log
        assert shipper is not None and log is not None
        if not self._replicated:
            shipper.note_waited(lsn)
        shipper.kick_for(lsn, appended=appended)
        cancelled: asyncio.CancelledError | None = None
        while True:
            try:
                await log.wait_archived_async(lsn)
                break
            except asyncio.CancelledError as exc:
                cancelled = cancelled or exc
            except FailedError as exc:
                failure = shipper.failure_for(lsn) or exc  # fenced or stopped: say so
                self._failed(failure)
                if failure is exc:
                    raise
                raise failure from exc
        if cancelled is not None:
            raise cancelled

    def _wait_archived(self, lsn: int, *, appended: bool = False) -> None:
        """Until the archive holds lsn; `appended`: a commit appended without waiting, whose
        fdatasync is waited for in the same call."""
        shipper = self._shipper
        assert shipper is not None
        if not self._replicated:
            shipper.note_waited(lsn)
        try:
            shipper.wait_archived(lsn, appended=appended)
        except FailedError as exc:
            self._failed(exc)
            raise

    # ---- shipper hooks ------------------------------------------------------------------------

    def _removable_before(self, applied: int) -> int:
        # Never a segment with an LSN the archive does not hold yet (before the shipper is
        # attached, during the open: none at all).
        shipper = self._shipper
        return min(applied, shipper.archived if shipper is not None else 0) + 1

    def _fenced(self, exc: FailedError) -> None:
        self._failed(exc)

    def _archived_moved(self, lsn: int) -> None:
        """Called by the shipper after each object (hook for observers; nothing to do here)."""

    def _logical_snapshot(self, writer_id: bytes) -> SpooledSnapshot:
        """A snapshot object of the state at its applied LSN, from one LMDB read transaction
        (FORMAT.md, archive snapshots), spooled to a file in the store's directory.

        NoSpaceError, before anything is written, when the disk lacks room for it and
        _SPOOL_MARGIN_BYTES more (the log shares the disk: a snapshot must never be what fills
        it), or when it fills the disk all the same (the file is deleted)."""
        snap = self._state.snapshot()
        try:
            entries = snap.entries()
            need = self._state.space()["state_used_bytes"] + entries * _SPOOL_ENTRY_BYTES + _SPOOL_MARGIN_BYTES
            free = shutil.disk_usage(self.path).free
            if free < need:
                raise NoSpaceError(f"an archive snapshot of the store in {self.path} needs about {need >> 20} MiB of "
                                   f"free disk there (the state, and a margin for the log), and {free >> 20} MiB are "
                                   "free: not taken now (the shipper tries again later)", filename=self.path)
            header = layout.SnapshotHeader(snap.applied_lsn(), time.time_ns() // 1_000_000, writer_id, entries,
                                           snap.idem_count())
            shipper = self._shipper
            sealer = shipper.objects.stream_sealer() if shipper is not None else None
            try:
                return SpooledSnapshot(self.path, header, snap.items(), snap.idem_items(), sealer)
            except OSError as exc:
                raise storage_error(exc, f"spooling an archive snapshot of the store in {self.path}") from exc
        finally:
            snap.close()

    def _ship_snapshot_now(self, timeout_s: float = 60.0) -> int:
        """Ship a snapshot of the state as it is now, once the archive holds the log up to it
        (`Shipper.ship_snapshot_now`), and return its LSN: `agentwal rekey` after rewriting the
        values, so the archive's newest snapshot holds them under the new key."""
        shipper, log = self._shipper, self._log
        if shipper is None or log is None:
            raise FailedError(f"the store in {self.path} is closed")
        log.sync()
        while self._apply_ready():  # the state, of everything durable
            pass
        if shipper.last_snapshot >= self._applied and _stale_key_id(shipper.objects, shipper.last_snapshot):
            # The archive holds a snapshot of this LSN already, under a key being retired, and
            # snapshot names are create-only: one empty transaction (nothing to replay) moves
            # the state on to an LSN of its own.
            self._commit(record.Txn([], time.time_ns() // 1_000_000, None), {}, None)
            while self._apply_ready():
                pass
        spooled = self._logical_snapshot(shipper.writer_id)
        shipper.ship_snapshot_now(spooled, timeout_s)
        return spooled.lsn

    # ---- observing and closing ----------------------------------------------------------------

    @property
    def archived_lsn(self) -> int:
        return self._shipper.archived if self._shipper is not None else 0

    def stats(self) -> dict[str, Any]:
        # The archive's figures first: the archive holds only durable records, and the log's
        # watermarks, read after, only go up, so archived_lsn <= durable_lsn in every dict (read
        # the other way round, a PUT answered in between showed the archive ahead of the disk).
        shipped = self._shipper.stats() if self._shipper is not None else {}
        out = super().stats()
        out.update(shipped)
        return out

    def close(self) -> None:
        """Ship what is durable (waiting up to 10 s for the object store), then close the store."""
        if self._closed or self._forked:
            super().close()
            return
        shipper = self._shipper
        if shipper is not None:
            if self._failure is None and self._log is not None:
                with contextlib.suppress(Exception):  # Store.close reports it
                    self._log.sync()
            shipper.stop(self._close_flush_s)
        super().close()


def _resolve(store: ArchivedStore, objects: ObjectStore) -> Resolved:
    """Where the archive ends, checked against this store's log: the archived LSN, whether a
    snapshot is needed, the newest snapshot's LSN, the objects past the end (unfinished tails
    and strays), the writer_id of the object at the end. FailedError if the store does not
    continue the archive; ArchiveError if the object store does not answer.

    The end is that of the archive's chain (`plan.find_end`): objects past it are the unfinished
    tail of a writer that stopped with PUTs in flight, or strays of a fenced one. This writer's
    first object, at the end + 1, is stored before they are deleted (`Shipper`), which fences
    a writer still running; if it stores that name first, this store is the one fenced."""
    log = store._log
    assert log is not None
    if not wait_for_lingering_puts(objects.url, _LINGERING_PUTS_WAIT_S):
        _logger.warning("archive %s: a PUT of a store closed earlier in this process is still running after %.0f s; "
                        "opening anyway (if it lands after this open has read the archive, this writer stops "
                        "as fenced)", objects.url, _LINGERING_PUTS_WAIT_S)
    if not objects.check_create_only():
        if store._archive_fencing:
            raise FailedError(fencing_refusal(objects))
        _logger.warning("archive %s does not honour create-only writes (If-None-Match): no fencing; opened anyway "
                        "(archive_fencing=False): run only one writer of this archive at a time", objects.url)
    listing = list_archive(objects)
    local_first, local_last = log.first_lsn, log.watermarks.durable
    last_snapshot = listing.snapshots[-1][0] if listing.snapshots else 0
    need_snapshot = not listing.snapshots
    end: int | None = None
    end_payload: bytes | None = None
    end_writer: bytes | None = None
    found = find_end(objects, listing)
    if found.last_object is not None:
        end, end_payload = found.last_object.last, found.last_object.records[-1][1]
        end_writer = found.last_object.writer_id
    elif listing.snapshots:
        end = last_snapshot  # a restored archive without log yet
    base_missing = False
    if end is None:
        archived, end_writer = local_first - 1, None
        base_missing = local_first > 1  # from LSN 1, the empty state is the base
    elif end > local_last:
        raise FailedError(
            f"the archive {objects.url} holds LSNs up to {end} but the store in {store.path} ends at {local_last}: "
            "another writer ships into it (a promoted follower?) or this store lost commits. Restore or follow "
            "the archive (wal.restore / wal.follow) instead of writing to it from here.")
    elif end < local_first - 1:
        _logger.warning("archive %s ends at LSN %d but the store in %s starts at LSN %d: LSNs %d..%d are in "
                        "neither; shipping resumes from a new snapshot", objects.url, end, store.path,
                        local_first, end + 1, local_first - 1)
        archived, need_snapshot, end_writer, base_missing = local_first - 1, True, None, True
    else:
        if end_payload is not None and end >= local_first:
            mine = next(iter(log.read(end)), None)
            if mine is None or mine[0] != end or mine[1] != end_payload:
                raise FailedError(
                    f"the archive {objects.url} and the store in {store.path} differ at LSN {end}: they are "
                    "different histories (the archive was taken over by a promoted follower, or belongs to "
                    "another store). Restore or follow the archive instead.")
        archived = end
        # No snapshot and no log from LSN 1: a writer before this one shipped its log without the
        # base it continues from (closed before that snapshot was stored); still missing.
        base_missing = not listing.snapshots and not any(p.first == 1 for p in listing.logs)
    if listing.snapshots and not need_snapshot:
        stale = _stale_key_id(objects, last_snapshot)
        if stale is not None:
            # After a rotation (and `agentwal rekey`): a snapshot under the current key now, so a
            # restore to any point from here on needs that key alone.
            _logger.info("archive %s: its newest snapshot (LSN %d) is sealed under key id %s, not the current "
                         "key: a snapshot under the current key is shipped", objects.url, last_snapshot, stale.hex())
            need_snapshot = True
    return Resolved(archived, need_snapshot, last_snapshot, found.tail, end_writer,
                    _log_bytes_between(listing.logs, last_snapshot, archived), base_missing)


def _stale_key_id(objects: ObjectStore, snapshot_lsn: int) -> bytes | None:
    """The id of the key the archive's snapshot of `snapshot_lsn` is sealed under, if that is not
    the current key (after a rotation); None if it is, if the archive is not sealed, or if the
    snapshot is gone (removed by retention since it was listed: a newer one is there)."""
    if not isinstance(objects, SealedObjects):
        return None
    try:
        return objects.stale_key_id(layout.snap_name(snapshot_lsn))
    except ObjectMissingError:
        return None


def _log_bytes_between(logs: list[Piece], after: int, upto: int) -> int:
    """Bytes of the archive's log objects holding LSNs after..upto, each range counted once: a
    writer killed between a merge's PUT and the deletion of its parts leaves both listed."""
    total, covered = 0, after
    for piece in sorted(logs, key=lambda p: (p.first, -(p.last or p.first))):
        if covered < piece.first <= upto:
            total += piece.size
            covered = piece.last if piece.last is not None else piece.first
    return total


def _attach(store: ArchivedStore, objects: ObjectStore, *, shipped_before: int, rpo_ms: int, policy: str,
            snapshot_bytes: int, merge_objects: int, retention_s: float | None, puts_in_flight: int) -> None:
    """Find where the archive ends and check this store continues it; then start shipping. An
    object store that does not answer does not stop the open: the shipper resolves the archive's
    end once it answers, and until then ships nothing and lets no segment go (archived LSN 0).
    `shipped_before`: the LSN the store's archive.json says it shipped to this archive (0: none)."""
    resolve = None
    try:
        found = _resolve(store, objects)
    except ArchiveUnavailableError as exc:
        _logger.error("archive %s unreachable when %s was opened; the store works, shipping starts once it "
                      "answers (commits wait or fail once the lag passes archive_rpo_ms): %s", objects.url,
                      store.path, exc)
        found = Resolved(0, True, 0, [], None)
        resolve = lambda: _resolve(store, objects)  # noqa: E731
    shipper = Shipper(store, objects, rpo_ms=rpo_ms, policy=policy, snapshot_bytes=snapshot_bytes,
                      merge_objects=merge_objects, archived=found.archived, need_snapshot=found.need_snapshot,
                      last_snapshot=found.last_snapshot, retention_s=retention_s, resolve=resolve, tail=found.tail,
                      puts_in_flight=puts_in_flight, end_writer=found.writer,
                      since_snapshot_bytes=found.since_snapshot_bytes, base_missing=found.base_missing,
                      shipped_before=shipped_before)
    if resolve is not None:
        shipper.error = "unreachable when the store was opened"
    store._shipper = shipper
    shipper.start()
    shipper.kick()


def open_archived(path: str | os.PathLike[str], archive: str | ObjectStore, options: dict[str, Any], *,
                  encryption: Any = None, compression: str | None = None, compression_threshold: int | None = None,
                  compression_dict: Any = None, **store_kwargs: Any) -> ArchivedStore:
    """`wal.open` with an object archive. Options (all keyword, all optional):

    - archive_rpo_ms (1000): the machine-loss bound; the archive's lag is kept under it.
    - archive_policy ("block"): when the lag passes the bound, commits wait ("block") or raise
      `ArchiveLagError` ("error").
    - archive_snapshot_bytes (64 MiB): ship a state snapshot after this much shipped log.
    - archive_merge_objects (32): merge this many small group objects into one.
    - archive_retention_s (None: keep all): keep what a restore within this window needs.
    - archive_puts_in_flight (1): group objects in flight at once, sent and not yet in the
      gap-free run (1..8, FORMAT.md §18). With fencing, a writer fenced with several in flight can
      store the later ones after the fence; readers pass over them and the next writer deletes
      any that takes a name it needs (FORMAT.md §18, "Chain").
    - archive_fencing (True): refuse an object store that does not honour create-only writes
      (no fencing there); False opens anyway, with a WARNING, for a single-writer deployment.
    """
    settings = archive_settings(options)
    sealing = plan_sealing(os.fspath(path), readonly=False, encryption=encryption, compression=compression,
                           compression_threshold=compression_threshold, compression_dict=compression_dict)
    objects = seal_objects(open_objects(archive), sealing.sealer if sealing is not None else None)
    previous = shipping_archive(os.fspath(path))  # read before the shipper writes its own status
    same_archive = previous is not None and same_location(previous[0], objects.url)
    if previous is not None and not same_archive:
        # Allowed (a store may move to another archive), but never silently: the archive it
        # leaves gets nothing more, and going back to it later leaves a gap there.
        _logger.warning("the store in %s ships to the object archive %s (archived LSN %d) and is opened with %s "
                        "instead: from now on it ships there, and %s gets nothing more (a later open with it "
                        "again finds LSNs missing there and starts it anew from a snapshot)",
                        os.fspath(path), previous[0], previous[1], objects.url, previous[0])
    cls = sealing.store_class(ArchivedStore) if sealing is not None else ArchivedStore
    store = cls._open(path, readonly=False, archive=False, sealing=sealing, **store_kwargs)
    assert isinstance(store, ArchivedStore)
    store._replicated = store._durability.level == "replicated"
    store._archive_fencing = settings.pop("fencing")
    if store._replicated:
        store._commit_fast = _decline  # Python path for aput/adelete too: it waits for the archive
    try:
        _attach(store, objects, shipped_before=previous[1] if previous is not None and same_archive else 0,
                **settings)
    except BaseException:
        store.close()
        raise
    if store._replicated and store._log is not None and store._log.native_address:
        # Acknowledged at `replicated` = held by the archive too: no other thread reads a commit,
        # nor does the materializer put it in the state, before the archive holds it (its
        # commit not returned yet, and a machine loss would take it back).
        store._core.acknowledge_archived(WATERMARKS_ARCHIVED)
        store._apply_limit_lsn = durable_lsn_reader(store._log, store._log.native_address, archived=True)
    return store


def check_open_options(options: dict[str, Any]) -> None:
    """`open_archived`'s options (the archive's and the store's, as `wal.open` takes them)
    checked without opening anything: the ArgumentError the open would raise. A follower's
    `promote` checks them before it fences the old writer, which cannot be undone."""
    archive = {k: v for k, v in options.items() if k.startswith("archive_")}
    archive_settings(archive)
    sealing = ("encryption", "compression", "compression_threshold", "compression_dict")
    rest = {k: v for k, v in options.items() if k not in archive and k not in sealing}
    checked = ("durability", "rpo_ms", "checkpoint_bytes", "idempotency_ttl_s", "apply_interval_ms", "max_unapplied")
    known = set(inspect.signature(Store._open).parameters) - {"cls", "path", "readonly", "archive", "sealing"}
    unknown = sorted(set(rest) - known)
    if unknown:
        raise ArgumentError(f"unknown option(s) of wal.open: {', '.join(unknown)}")
    ArchivedStore._checked_level(**{k: v for k, v in rest.items() if k in checked})


def archive_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The archive_* options of `open_archived`, checked, with their defaults, named as
    `_attach` takes them (and `fencing`)."""
    opts = dict(options)
    rpo_ms = opts.pop("archive_rpo_ms", 1000)
    policy = opts.pop("archive_policy", "block")
    snapshot_bytes = opts.pop("archive_snapshot_bytes", 64 << 20)
    merge_objects = opts.pop("archive_merge_objects", 32)
    retention_s = opts.pop("archive_retention_s", None)
    puts_in_flight = opts.pop("archive_puts_in_flight", 1)
    fencing = opts.pop("archive_fencing", True)
    if opts:
        raise ArgumentError(f"unknown option(s) of wal.open: {', '.join(sorted(opts))}")
    if isinstance(rpo_ms, bool) or not isinstance(rpo_ms, int) or rpo_ms <= 0:
        raise ArgumentError(f"archive_rpo_ms must be an int > 0 (milliseconds), got {rpo_ms!r}")
    if policy not in POLICIES:
        raise ArgumentError(f"archive_policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not isinstance(snapshot_bytes, int) or snapshot_bytes < 1:
        raise ArgumentError(f"archive_snapshot_bytes must be an int > 0, got {snapshot_bytes!r}")
    if not isinstance(merge_objects, int) or merge_objects < 2:
        raise ArgumentError(f"archive_merge_objects must be an int >= 2, got {merge_objects!r}")
    if retention_s is not None and (isinstance(retention_s, bool) or not isinstance(retention_s, int | float)
                                    or not 0 < retention_s < math.inf):  # nan fails both
        raise ArgumentError(f"archive_retention_s must be None (keep everything) or seconds > 0, got {retention_s!r}")
    if isinstance(puts_in_flight, bool) or not isinstance(puts_in_flight, int) \
            or not 1 <= puts_in_flight <= layout.MAX_IN_FLIGHT:
        raise ArgumentError(f"archive_puts_in_flight must be an int in 1..{layout.MAX_IN_FLIGHT}, "
                            f"got {puts_in_flight!r}")
    if not isinstance(fencing, bool):
        raise ArgumentError(f"archive_fencing must be True or False, got {fencing!r}")
    return {"rpo_ms": rpo_ms, "policy": policy, "snapshot_bytes": snapshot_bytes, "merge_objects": merge_objects,
            "retention_s": retention_s, "puts_in_flight": puts_in_flight, "fencing": fencing}
