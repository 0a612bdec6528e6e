"""Followers: a read-only copy of an archived store that keeps up with its archive, and can
take over as its writer.

    replica = wal.follow("s3://bucket/agent", "/data/replica")   # restores first if dir is new
                                                                  # (empty at LSN 0 if the archive is)
    replica.get(key); replica.scan(prefix); replica.lag()         # the Store read API
    store = replica.promote(durability="sync")                    # now the archive's writer

Polling lists only what is new: ``log/`` objects named after the follower's LSN and ``merged/``
objects starting after it (S3 ``StartAfter``); only when that shows a gap (the writer merged
objects the follower had not read yet) does it list ``merged/`` in full once.

It applies the archive's chain (`plan.Chain`, FORMAT.md §18): objects a writer fenced with PUTs
in flight stored after the fence (strays) are passed over, and objects past the chain's end
that are an unfinished tail are waited for, not reported as a gap.

Promotion fences the old primary. The follower catches up, then writes the next LSN's group
object, ``log/<n+1>.wal``, create-only, holding one empty transaction. If that name is taken,
the old primary shipped more meanwhile: catch up and try again (or a stray holds it: delete it,
try again). Once it is in, the old primary
can never ship again: its next object is ``log/<n+1>.wal`` (its archived LSN is n, or it would
have taken the name first), which now exists, so its create-only PUT fails and it stops with
`FailedError`; an old primary that reopens finds the archive ahead of, or different from, its
log and refuses to open with an archive. This relies on create-only PUTs (``If-None-Match: *``);
an object store that ignores them would let the old primary overwrite the fence object: no
fencing there: promote() and an archived open refuse such a store (`ObjectStore.check_create_only`)
unless given archive_fencing=False.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

from wal._fs import fsync_dir, replace_durably
from wal.archive import layout
from wal.archive.objects import (
    ArchiveError,
    ObjectExistsError,
    ObjectMissingError,
    ObjectStore,
    fencing_refusal,
    open_objects,
)
from wal.archive.plan import (
    Chain,
    Listing,
    Piece,
    WriterUnknownError,
    beyond,
    find_end,
    list_archive,
    merged_holding,
    unfinished_tail,
)
from wal.archive.restore import restore_chain
from wal.archive.sealed import SealedObjects, check_manifest, for_reading, holds_nothing, read_manifest
from wal.archive.store import check_open_options, open_archived
from wal.errors import (
    ArgumentError,
    ClosedError,
    CorruptionError,
    EncryptionKeyError,
    FailedError,
    ReadOnlyError,
    WalError,
    path_argument,
    storage_error,
)
from wal.log import record
from wal.store.sealed import dict_file, store_dictionaries
from wal.store.state import StateError
from wal.store.store import FOLLOWING_FILE, Store, open_local

_PROMOTE_ATTEMPTS = 100
_FENCE_HOPS = 64  # objects a fence is tried past, read but not applied, before a poll (`_put_fence`)
_REBUILD_RETRY_S = 60.0  # a rebuild that failed is tried again after this
_MAX_POLL_MS = 86_400_000  # a day: a longer pause makes no follower (and a wait of 2^63 ms overflows)
_logger = logging.getLogger("wal.archive")
_T = TypeVar("_T")


class Follower:
    """A read-only store following an archive (see the module docstring). Thread-safe reads."""

    def __init__(self, objects: ObjectStore, directory: str, *, poll_ms: int, parallel: int,
                 sealing: dict[str, Any] | None = None, writer: bytes | None = None,
                 sealing_unconfirmed: bool = False) -> None:
        self._objects = objects
        self._sealing_unconfirmed = sealing_unconfirmed
        self._dir = directory
        self._poll = poll_ms / 1000
        self._parallel = parallel
        self._sealing = sealing or {}  # a sealed store's wal.open options (encryption=, ...)
        self._store: Store | None = open_local(directory, _following=True, **self._sealing)
        self._pos = self._store.watermarks.durable
        # The writer_id of the archive object ending at _pos (plan.Chain): known after a restore
        # and after each object applied; None after a restart until `_anchor` finds it.
        self._writer = writer
        self._end_seen = self._pos
        self._listed_end = 0  # during a poll: the end of what it listed (`_apply_new`)
        self._caught_up_at = time.monotonic()
        self._error: str | None = None
        self._polls = 0
        self._lock = threading.Lock()  # one poll at a time (the thread, or promote)
        self._rebuild_retry_at = 0.0  # no rebuild (`_rebuild_from_snapshot`) is tried before this
        # An unfinished tail past the end (`_apply_new`): where it was found with a full listing,
        # and the headers of its objects, so an idle follower waiting on it lists what is new only.
        self._settled: tuple[int, frozenset[str]] | None = None
        self._tail_heads: dict[tuple[str, int], Any] = {}
        try:
            if writer is None and self._pos > 0:  # reopened on a directory that holds commits
                self._check_history(self._store)
            # Marked once it is known to be the archive's: an old primary's directory refused
            # above stays its own (its writer may still reopen it).
            _mark_following(directory, objects.url)
        except BaseException:
            self._store.close()
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"agentwal-follow:{directory}", daemon=True)
        self._thread.start()

    # ---- the read API -------------------------------------------------------------------------

    def _live(self) -> Store:
        if self._store is None:
            raise ClosedError(f"the follower of {self._objects.url} in {self._dir} is closed or was promoted")
        return self._store

    def _read(self, read: Callable[[Store], _T]) -> _T:
        """`read` of the store; made again on the new one if the store was swapped under it (a
        follower that held nothing, or fell behind retention, rebuilt from a snapshot:
        `_rebuild_from_snapshot`). Every read begins here: a scan, snapshot, stats or
        watermarks that met the closed old store raised ClosedError (or a scan, StateError)
        to a follower nobody closed. A snapshot or scan begun before the swap and used after
        it ends with a ClosedError saying so: the state it was a view of is gone."""
        store = self._live()
        try:
            return read(store)
        except (ClosedError, StateError):
            with self._lock:  # a swap under way (polls hold the lock) ends first
                if self._store is None or self._store is store:
                    raise
                return read(self._store)

    @overload
    def get(self, key: bytes | str, default: None = None) -> bytes | None: ...
    @overload
    def get(self, key: bytes | str, default: bytes) -> bytes: ...

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        return self._read(lambda store: store.get(key, default))

    def version(self, key: bytes | str) -> int | None:
        return self._read(lambda store: store.version(key))

    def scan(self, prefix: bytes | str = b"") -> Iterator[tuple[bytes, bytes]]:
        return self._read(lambda store: store.scan(prefix))

    def snapshot(self) -> Any:
        return self._read(lambda store: store.snapshot())

    @property
    def watermarks(self) -> Any:
        return self._read(lambda store: store.watermarks)

    @property
    def lsn(self) -> int:
        """The last LSN applied from the archive."""
        return self._pos

    @property
    def path(self) -> str:
        return self._dir

    def put(self, *_a: object, **_k: object) -> int:
        raise ReadOnlyError(f"the follower in {self._dir} is read-only; promote() it to write")

    delete = transaction = update = atransaction = put  # every write of the Store API, and the async ones

    async def aput(self, *args: object, **kwargs: object) -> int:
        return self.put(*args, **kwargs)  # refused as put is, once awaited

    adelete = aupdate = aput

    def lag(self) -> dict[str, float]:
        """lag_lsns: LSNs the archive held at the last listing that are not applied here;
        lag_seconds: time since this follower last held everything the archive held.
        ClosedError once closed or promoted, as every read is: it follows no longer."""
        self._live()
        return {"lag_lsns": float(max(self._end_seen, self._listed_end, self._pos) - self._pos),
                "lag_seconds": time.monotonic() - self._caught_up_at}

    def stats(self) -> dict[str, Any]:
        out = dict(self._read(lambda store: store.stats()))
        out.update(self.lag())
        out.update({"follower_lsn": self._pos, "archive_end_lsn": self._end_seen, "follower_polls": self._polls,
                    "follower_error": self._error, "archive_url": self._objects.url})
        return out

    # ---- following ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                self.poll()
                self._applying()
            except ClosedError:
                return
            except WalError as exc:  # an outage, a gap, a full disk, a missing key: said, tried again
                if self._error is None:  # one ERROR line when it begins, however many polls fail
                    _logger.error("follower %s stopped applying at LSN %d (it tries again at every poll): %s",
                                  self._dir, self._pos, exc)
                self._error = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a fault of this code: said with its traceback, never silently
                if self._error is None:
                    _logger.exception("follower %s stopped applying at LSN %d on an unexpected error (it tries "
                                      "again at every poll)", self._dir, self._pos)
                self._error = f"{type(exc).__name__}: {exc}"

    def _applying(self) -> None:
        """A poll ended, or an object applied: whatever failed before has passed (said once)."""
        if self._error is not None:
            self._error = None
            _logger.info("follower %s applies again (LSN %d)", self._dir, self._pos)

    def _list_new(self, *, full_merged: bool) -> list[Piece]:
        pos = self._pos
        raw: list[tuple[layout.Name, str, int]] = []
        merged_after = None if full_merged else f"{layout.MERGED_PREFIX}{pos:020d}-~"
        for prefix, after in ((layout.LOG_PREFIX, layout.log_name(pos)), (layout.MERGED_PREFIX, merged_after)):
            for name, size in self._objects.list(prefix, after):
                parsed = layout.parse_name(name)
                if parsed is not None and parsed.kind != "snap" and (parsed.last is None or parsed.last > pos):
                    raw.append((parsed, name, size))
        firsts = sorted({p.first for p, _, _ in raw})
        pieces = []
        for parsed, name, size in raw:
            last = parsed.last
            if last is None:
                later = [f for f in firsts if f > parsed.first]
                last = later[0] - 1 if later else None
            pieces.append(Piece(name, parsed.first, last, size))
        return pieces

    def poll(self) -> int:
        """Apply every new archive object now; returns how many records were applied."""
        with self._lock:
            if self._sealing_unconfirmed:
                self._confirm_sealing()  # may make the store again: it is taken after
            store = self._live()
            started = time.monotonic()
            self._polls += 1
            gap: CorruptionError | None = None
            applied = 0
            try:
                applied = self._apply(store)
            except CorruptionError as exc:
                if self._sealing_unconfirmed:
                    # The writer's first objects came between the look above and this listing,
                    # and were read as this follower was told to read them: the manifest says
                    # whether that was wrong (raised as `follow` raises it), else they are
                    # read again, as confirmed, at the next poll.
                    self._confirm_sealing()
                    if not self._sealing_unconfirmed:
                        return 0
                if self._pos != 0 and exc.reason != "archive gap":
                    raise
                gap = exc
            # Holding nothing, with nothing to apply: the archive may start at a snapshot (its
            # writer's history from before it was archived). Past a gap: retention may have
            # removed the log after this follower's LSN (it was stopped longer than the
            # archive's retention window), and a newer snapshot holds what it lacks.
            if (self._pos == 0 or gap is not None) and applied == 0 and time.monotonic() >= self._rebuild_retry_at:
                try:
                    rebuilt = self._rebuild_from_snapshot()
                except BaseException:
                    # Whatever failed it (a full disk, a missing key, a damaged snapshot) is
                    # said in follower_error; the next try, a snapshot download, waits a while.
                    self._rebuild_retry_at = time.monotonic() + _REBUILD_RETRY_S
                    raise
                if rebuilt:
                    gap = None
                    applied = self._apply(self._live())
            if gap is not None:
                raise gap
            if self._pos >= self._end_seen:
                self._caught_up_at = started
            return applied

    def _confirm_sealing(self) -> None:
        """A follower started on an archive that held nothing: once its writer has shipped, the
        archive's manifest must say what this follower was opened with, else the archive is
        refused as `follow` refuses it (an encrypted one without a key: MissingKeyError, not
        its objects "damaged"; a plain one with a key: ArgumentError), in follower_error."""
        raw = self._objects.inner if isinstance(self._objects, SealedObjects) else self._objects
        if holds_nothing(raw):  # listed first: an object found means its manifest is readable
            return
        sealer = self._objects.sealer if isinstance(self._objects, SealedObjects) else None
        check_manifest(read_manifest(raw), sealer, raw.url)
        # Opened again as `follow` opens an archive that holds something: its dictionaries
        # loaded, and a compressed one read as such by a follower given no options. Where that
        # changes how its values read, the store, which holds nothing yet, is made again from
        # the archive with that sealing (`_swap_in_restored`), as a follower started now is.
        was = self._objects
        self._objects, _ = for_reading(raw, self._sealing)
        if self._pos == 0 and isinstance(self._objects, SealedObjects) and (
                not isinstance(was, SealedObjects) or self._objects.sealer.dictionaries):
            self._swap_in_restored()
        self._sealing_unconfirmed = False

    def _apply(self, store: Store) -> int:
        try:
            return self._apply_new(store, strict=True)
        except WriterUnknownError:
            # Reopened on its directory, it does not know which writer's object it stopped
            # after, and the next object continues only after its own writer's (nothing was
            # applied: the writer is known once an object is).
            self._writer = self._anchor()
            return self._apply_new(store, strict=False)

    def _rebuild_from_snapshot(self) -> bool:
        """A follower that holds nothing yet (LSN 0), of an archive that holds a snapshot past
        LSN 0 (its writer had a history before it was archived, or retention removed the log's
        start), or one that meets a gap after its LSN with a snapshot past it (retention removed
        the log it lacks): rebuilt from the newest snapshot, as `follow` restores a new
        directory (one listing of ``snap/`` per poll meanwhile). True if it was; False if no
        snapshot is past its LSN. The new store is restored
        beside the follower's directory and swapped in; if the swap fails, the old one is put
        back and goes on (a crash in between leaves the directory missing, and `follow`
        restores it again and deletes what was left beside it). A read of the old, empty store
        at that moment is made again on the new one (`_read`). Called with `_lock` held."""
        newest = max((parsed.first for name, _ in self._objects.list(layout.SNAP_PREFIX)
                      if (parsed := layout.parse_name(name)) is not None and parsed.kind == "snap"), default=0)
        if newest <= self._pos:
            return False
        self._swap_in_restored()
        _logger.info("follower %s: rebuilt from the snapshot at LSN %d of %s", self._dir, self._pos, self._objects.url)
        return True

    def _swap_in_restored(self) -> None:
        """The archive restored beside the follower's directory and swapped in for its store
        (`_rebuild_from_snapshot`, `_confirm_sealing`). Called with `_lock` held."""
        parent, base = os.path.split(os.path.abspath(self._dir))
        building = os.path.join(parent, f".{base}{_REBUILT}{os.urandom(4).hex()}")
        _, writer = restore_chain(self._objects, building, parallel=self._parallel, **self._sealing)
        _mark_following(building, self._objects.url)
        retired = os.path.join(parent, f".{base}{_RETIRED}{os.urandom(4).hex()}")
        old = self._store
        if old is not None:
            old._closed_because = (f"the follower in {self._dir} closed its store to make it again from the archive "
                                   f"{self._objects.url} (rebuilt from a newer snapshot, or once its writer first "
                                   "shipped) while this snapshot or scan was open on it: begin it again")
            old.close()
        try:
            os.rename(self._dir, retired)
            try:
                os.rename(building, self._dir)
                fsync_dir(parent)
                self._store = open_local(self._dir, _following=True, **self._sealing)
            except BaseException:
                # Back as it was: the old, empty store goes on (the error is said; tried again later).
                with contextlib.suppress(OSError):
                    os.rename(self._dir, building)
                os.rename(retired, self._dir)
                raise
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            self._store = open_local(self._dir, _following=True, **self._sealing)
            raise
        shutil.rmtree(retired, ignore_errors=True)
        self._pos = self._end_seen = self._store.watermarks.durable
        self._writer = writer

    def _apply_new(self, store: Store, *, strict: bool) -> int:
        try:
            return self._apply_listed(store, strict=strict)
        finally:
            self._listed_end = 0

    def _apply_listed(self, store: Store, *, strict: bool) -> int:
        applied = 0
        for full_merged in (False, True):
            pieces = self._list_new(full_merged=full_merged)
            # Nothing new past this follower's LSN since a full listing found only an unfinished
            # tail there: that listing is not made again on every poll.
            if not full_merged and self._settled == (self._pos, frozenset(p.name for p in beyond(pieces, self._pos))):
                return applied
            # While this poll applies them, what was listed counts in the lag: a follower far
            # behind said lag_lsns 0 for its whole catch-up (the end moved only as objects were
            # applied). The run of listed objects gap-free from here; dropped once the poll ends.
            self._listed_end = _run_end(pieces, self._pos)
            chain = Chain(self._objects, pieces, self._pos, self._writer, strict=strict)
            try:
                for obj in chain:
                    fresh = [(lsn, p) for lsn, p in obj.records if lsn > self._pos]
                    _keep_dictionaries(self._objects, store)
                    _append(store, fresh)
                    applied += len(fresh)
                    self._pos, self._writer = obj.last, obj.writer_id
                    # An object applied: whatever failed the last poll (an outage, a full disk)
                    # has passed, and `stats()` no longer says it while the LSN moves on.
                    self._applying()
                    self._end_seen = max(self._end_seen, obj.last)
            except ObjectMissingError:
                return applied  # merged away meanwhile: the next poll finds the merged object
            except (CorruptionError, EncryptionKeyError):
                # A damaged object, or one under a key this follower was not given: it stays
                # here, behind at least the objects listed (its lag in LSNs says so).
                self._end_seen = max(self._end_seen, max((p.last if p.last is not None else p.first
                                                          for p in pieces), default=0))
                raise
            past = beyond(pieces, self._pos)
            if not past:
                break
        tail = unfinished_tail(self._objects, past, self._pos, chain.heads, self._tail_heads) if past else None
        # Settled: a tail after the full listing, where nothing was applied (nothing applied
        # means that listing is the one to compare the next polls' with).
        self._settled = (self._pos, frozenset(p.name for p in past)) if tail is not None and not applied else None
        if tail is None:
            self._tail_heads.clear()
        if past and tail is None:
            later = past[0].first
            self._end_seen = max(self._end_seen, later - 1, *(p.first for p in past))
            raise CorruptionError(f"the archive {self._objects.url} is missing LSNs {self._pos + 1}..{later - 1}; "
                                  f"the follower in {self._dir} stays at LSN {self._pos}",
                                  path=self._objects.url, lsn=self._pos + 1, reason="archive gap")
        # Past the end: objects of the writer stored while one before them is still in flight
        # (they count in the lag), or strays of a fenced writer (they never will).
        for piece in tail or ():
            head = chain.heads.get(piece.name)
            if head is not None and head.writer_id == self._writer:
                self._end_seen = max(self._end_seen, head.last)
        return applied

    def _anchor(self) -> bytes | None:
        """The writer_id of the archive object ending at this follower's LSN (after a restart):
        the chain from the newest snapshot at or before it (whose writer it goes on with), read
        up to it. None if the archive no longer reaches back there (nothing is passed over then)."""
        return self._archive_at()[0]

    def _archive_at(self, listing: Listing | None = None) -> tuple[bytes | None, bytes | None]:
        """(`_anchor`'s writer_id, the archive's record at this follower's LSN): the record is
        None where the archive holds none there (the LSN is a snapshot's, or out of its reach).
        `listing`: the archive's, if the caller has just listed it."""
        listing = listing or list_archive(self._objects)
        snaps = [s for s in listing.snapshots if s[0] <= self._pos]
        if snaps:
            lsn, name = snaps[-1]
            writer: bytes | None = layout.open_snapshot(self._objects.get_large(name), name).writer_id
        elif any(p.first == 1 for p in listing.logs):
            lsn, writer = 0, b""
        else:
            return None, None
        if lsn == self._pos:
            return writer, None
        chain = Chain(self._objects, listing.logs, lsn, writer, upto=self._pos)
        for obj in chain:
            if obj.last >= self._pos:
                return obj.writer_id, next((p for n, p in obj.records if n == self._pos), None)
        return None, None

    def _check_history(self, store: Store) -> None:
        """A follower opened on a directory that holds commits: they must be the archive's. An
        old primary fenced with commits it never shipped, followed in its own directory, would
        otherwise serve a state that never existed, and, promoted, diverge from the archive.
        FailedError if the archive ends before this store's LSN, or holds another record there
        (compared where both still hold one: a checkpointed log may no longer)."""
        listing = list_archive(self._objects)
        last_object = find_end(self._objects, listing).last_object
        archive_end = max(last_object.last if last_object is not None else 0,
                          listing.snapshots[-1][0] if listing.snapshots else 0)
        advice = ("; it is not a follower of this archive (an old primary fenced with commits it never shipped?): "
                  "follow the archive into a new directory (wal.follow restores it), or wal.restore it")
        if archive_end < self._pos:
            raise FailedError(f"the store in {self._dir} holds LSNs up to {self._pos} but the archive "
                              f"{self._objects.url} ends at {archive_end}{advice}")
        writer, payload = self._archive_at(listing)
        log = store._log
        held = log is not None and payload is not None and log.first_lsn <= self._pos
        mine = next(iter(log.read(self._pos)), None) if held and log is not None else None
        if mine is not None and mine[0] == self._pos and mine[1] != payload:
            raise FailedError(f"the store in {self._dir} and the archive {self._objects.url} differ at LSN "
                              f"{self._pos}{advice}")
        self._writer = writer

    def promote(self, **open_kwargs: Any) -> Store:
        """Make this follower the archive's writer: catch up, fence the old primary (create-only
        ``log/<n+1>.wal``, or right past the objects an old primary still shipping has stored
        there: `_put_fence`), and return a writable store shipping to the archive, continuing the
        LSN sequence. open_kwargs go to `wal.open` (durability, archive_rpo_ms, ...), and are
        checked before the fence is written: a fence cannot be undone."""
        check_open_options(open_kwargs)
        if open_kwargs.get("archive_fencing", True) and not self._objects.check_create_only():
            raise FailedError(fencing_refusal(self._objects) + " (and promote with archive_fencing=False)")
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        try:
            store = self._fence()
        except BaseException:
            # Follow on, as before the attempt, rather than stop where the archive was then. A
            # fence stored before the failure is applied as any object (it is the archive's),
            # and a promote tried again goes on from there.
            if self._store is not None and threading.current_thread() is not self._thread:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, name=self._thread.name, daemon=True)
                self._thread.start()
            raise
        store.close()
        self._store = None
        _unmark_following(self._dir)  # the writer now: it ships what it commits
        options = {k: open_kwargs.pop(k) for k in list(open_kwargs) if k.startswith("archive_")}
        return open_archived(self._dir, self._objects, options, **{**self._sealing, **open_kwargs})

    def _fence(self) -> Store:
        """Catch up and write the fence (`promote`); the local store, which holds it too."""
        for _ in range(_PROMOTE_ATTEMPTS):
            self.poll()
            store = self._live()  # the poll may have rebuilt it (`_rebuild_from_snapshot`)
            payload = record.encode((), time.time_ns() // 1_000_000, None)
            nxt, taken = self._put_fence(self._pos + 1, payload)
            if nxt is None:
                # The old primary shipped more (catch up, try again), or the name is taken by a
                # stray (FORMAT.md §18): delete it, try again.
                if taken == self._pos + 1:
                    self._delete_stray(taken)
                continue
            if merged_holding(self._objects, nxt) is not None:
                # The old primary shipped nxt and merged its group object away before our PUT
                # (the listing missed it): the name fences nothing. Withdraw, catch up, retry.
                self._objects.delete(layout.log_name(nxt))
                continue
            # The objects the fence was put after are in the archive: apply them (and the
            # fence with them, as any object) before the store is handed over.
            for _ in range(_PROMOTE_ATTEMPTS):
                if self._pos >= nxt - 1:
                    break
                self.poll()
            else:
                raise ArchiveError(f"the follower in {self._dir} put its fence at LSN {nxt} but could not apply "
                                   f"the archive's objects before it (it is at LSN {self._pos}); promote again")
            with self._lock:
                store = self._live()  # taken again: a poll may have rebuilt it, closing the one before
                if self._pos < nxt:
                    _append(store, [(nxt, payload)])
                    self._pos = nxt
            self._delete_tail(nxt)
            return store
        raise ArchiveError(f"could not promote the follower in {self._dir}: the archive kept growing "
                           f"({_PROMOTE_ATTEMPTS} attempts); stop the old primary first")

    def _put_fence(self, nxt: int, payload: bytes) -> tuple[int | None, int]:
        """Store the fence create-only at `nxt`, this follower's next LSN, or further on: where
        the name is taken, the object holding it is read (not applied) and the fence tried
        right after it, up to _FENCE_HOPS objects on. A writer shipping an object every few ms
        (at `replicated`, one per commit) took each name while a whole poll -- list, read,
        apply -- ran between two tries: the promote gave up. Objects are read on only as the
        chain takes them (FORMAT.md §18): one sent while its writer had another in flight
        follows only an object of that writer; else (and where an object is gone, merged away)
        the caller polls. Returns (the LSN fenced, or None, and the last name tried)."""
        writer = self._writer
        for _ in range(_FENCE_HOPS):
            name = layout.log_name(nxt)
            try:
                self._objects.put(name, layout.encode_log([(nxt, payload)], os.urandom(16)), create_only=True)
                return nxt, nxt
            except ObjectExistsError:
                pass
            try:
                obj = layout.decode_log(self._objects.get(name), name)
            except (ObjectMissingError, CorruptionError):
                return None, nxt
            if obj.first != nxt or (obj.behind and obj.writer_id != writer):
                return None, nxt
            writer, nxt = obj.writer_id, obj.last + 1
        return None, nxt

    def _delete_stray(self, lsn: int) -> None:
        """``log/<lsn>.wal``, just after this follower's chain, if it is a stray: sent with an
        object of its writer in flight (behind >= 1) while the object ending at lsn - 1, which
        this follower applied, is another writer's. Its writer was fenced; the chain can never
        go on with it."""
        name = layout.log_name(lsn)
        try:
            obj = layout.decode_log(self._objects.get(name), name)
        except (ObjectMissingError, CorruptionError):
            return
        if obj.behind and self._writer is not None and obj.writer_id != self._writer:
            self._objects.delete(name)

    def _delete_tail(self, fence: int) -> None:
        """Group objects past the fence are the old primary's unfinished tail (FORMAT.md §18):
        stored out of order while its object at `fence` was in flight. That object can never be
        stored now, so none of them can ever join the gap-free run: delete them."""
        for name, _ in self._objects.list(layout.LOG_PREFIX, layout.log_name(fence)):
            parsed = layout.parse_name(name)
            if parsed is not None and parsed.first > fence:
                self._objects.delete(name)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<wal.Follower {self._objects.url} -> {self._dir!r} at LSN {self._pos}>"


def _run_end(pieces: list[Piece], pos: int) -> int:
    """The last LSN of the listed objects that run on from `pos` without a gap (`pos` if none)."""
    end = pos
    for piece in sorted(pieces, key=lambda p: p.first):
        if piece.first > end + 1:
            break
        if piece.last is not None:
            end = max(end, piece.last)
    return end


def _keep_dictionaries(objects: ObjectStore, store: Store) -> None:
    """Dictionaries the archive's writer started compressing with after this follower started
    (read from the archive when an object first needed one): stored in the follower's own
    store (dicts/) before any value compressed with them is, so that its reads, a reopen and a
    promotion find them there."""
    local = getattr(store, "_sealer", None)
    if not isinstance(objects, SealedObjects) or local is None:
        return
    # Told new by dicts/ itself, not by what the sealer knows: one a failed write left out is
    # written by the next object's call (values compressed with it are appended only after).
    new = [did for did in objects.sealer.dictionaries if not os.path.exists(dict_file(store.path, did))]
    if new:
        for did in new:
            local.add_dictionary(objects.sealer.dictionaries[did])
        store_dictionaries(store.path, local, new)


def _append(store: Store, records: list[tuple[int, bytes]]) -> None:
    """Append archived records to the follower's own log with their archived LSNs, into the
    store's overlay and apply queue as commits are (Store._try_commit), then wait until durable."""
    log = store._log
    assert log is not None
    for lsn, payload in records:
        txn = record.decode(payload, lsn)
        while True:
            with store._commit_lock:
                # Taken already by an earlier call that then failed waiting for durability (a
                # full disk: the log keeps it and writes it once space returns): not again.
                # Anything but the next LSN is refused before the log gives it one.
                appended = log.watermarks.appended
                if lsn <= appended:
                    break
                if lsn != appended + 1:
                    raise CorruptionError(f"the follower's log in {store.path} ends at LSN {appended}, and the next "
                                          f"record archived is LSN {lsn}", lsn=lsn, reason="follower LSN mismatch")
                got = log.enqueue(payload, durability="sync", block=False)
                if got is not None:
                    if got != lsn:
                        raise CorruptionError(f"the follower's log in {store.path} gave LSN {got} to the record "
                                              f"archived as LSN {lsn}", lsn=lsn, reason="follower LSN mismatch")
                    store._core.enqueue_txn(got, txn, len(payload))
                    if txn.idempotency_key is not None:
                        store._idem_pending[txn.idempotency_key] = got
                    break
            log.wait(log.watermarks.appended, durability="sync")
    if records:
        log.wait(records[-1][0], durability="sync")


def follow(url: str | ObjectStore, directory: str | os.PathLike[str], *, poll_ms: int = 200,
           parallel: int = 16, **sealing: Any) -> Follower:
    """Follow the archive at `url` in `directory` (restored from the archive first if it is new).
    `sealing`: a sealed store's `wal.open` options (encryption=, compression=, ...)."""
    if isinstance(poll_ms, bool) or not isinstance(poll_ms, int | float) or not 0 < poll_ms <= _MAX_POLL_MS:
        raise ArgumentError(f"poll_ms must be milliseconds in (0, {_MAX_POLL_MS}] (a day), got {poll_ms!r}")
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ArgumentError(f"parallel must be an int >= 1, got {parallel!r}")
    path_argument(directory, "the follower's directory")
    if not os.fspath(directory):  # "" (an unset variable, say) would make the current directory the follower
        raise ArgumentError("the follower's directory is empty: name it")
    raw = open_objects(url)
    # Started before its writer shipped anything: whether the archive is sealed, and how, is
    # known once objects come (`Follower._confirm_sealing`).
    unconfirmed = holds_nothing(raw) and read_manifest(raw) is None  # listed first (`holds_nothing`)
    objects, _ = for_reading(raw, sealing)
    root = os.fspath(directory)
    _remove_rebuild_leftovers(root)
    writer = None
    if not os.path.exists(os.path.join(root, "STORE")):
        # An archive that holds nothing yet restores to the empty state at LSN 0 (with a
        # WARNING): the follower then applies the first objects as they arrive, or rebuilds
        # itself from the first snapshot (`Follower._rebuild_from_snapshot`).
        try:
            _, writer = restore_chain(objects, root, parallel=parallel, **sealing)
        except CorruptionError as exc:
            if exc.reason != "no snapshot":
                raise
            # Log objects, none from LSN 1, and no snapshot yet: a writer with a history from
            # before it was archived ships its first snapshot once its log is in (later, on a
            # full disk). Followed from LSN 0 meanwhile; the gap is its follower_error until then.
            _logger.warning("%s; %s follows it from LSN 0 and rebuilds itself from its first snapshot", exc, root)
            open_local(root, _following=True, **sealing).close()
            writer = b""
    return Follower(objects, root, poll_ms=poll_ms, parallel=parallel, sealing=sealing, writer=writer,
                    sealing_unconfirmed=unconfirmed)


_REBUILT, _RETIRED = ".rebuilt-", ".retired-"  # beside a follower's directory while it is rebuilt


def _mark_following(root: str, url: str) -> None:
    """Mark `root` a follower's directory (FORMAT.md §14): a writable open of it is refused
    until `promote` removes the mark (written whole: a temporary file, fsynced, renamed)."""
    path = os.path.join(root, FOLLOWING_FILE)
    if os.path.exists(path):
        return
    try:
        replace_durably(path, json.dumps({"archive": url}).encode() + b"\n")
    except OSError as exc:
        raise storage_error(exc, f"marking {root} a follower's directory ({FOLLOWING_FILE})") from exc


def _unmark_following(root: str) -> None:
    try:
        os.unlink(os.path.join(root, FOLLOWING_FILE))
        fsync_dir(root)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise storage_error(exc, f"removing {root}'s {FOLLOWING_FILE} file") from exc


def _remove_rebuild_leftovers(root: str) -> None:
    """What a process that died while rebuilding a follower left beside its directory."""
    parent, base = os.path.split(os.path.abspath(root))
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            # ..<base>.rebuilt-*: the restore's own building directory beside the rebuilt one
            if name.startswith((f".{base}{_REBUILT}", f".{base}{_RETIRED}", f"..{base}{_REBUILT}")):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
