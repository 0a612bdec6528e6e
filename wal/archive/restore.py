"""Point-in-time restore from an archive, and `verify` of an archive.

`restore(url, dir, lsn=None, time=None)`:
1. List the archive once; pick the newest snapshot at or before the target (for a time: taken
   at or before it, so every commit it holds was made at or before it).
2. Follow the chain of log objects from the snapshot's LSN on (`plan.Chain`: planned from the
   names, corrected as headers are read); download them in parallel (a window of `parallel`
   requests ahead), verify each alone (SHA-256 trailer, CRC-32C per record, header against
   name) and check the LSNs run on without a gap.
3. Meanwhile, write an ordinary store (`StoreBuilder`) beside `dir`: the snapshot's entries
   put into a new state straight from its verified bytes, in bounded transactions while the log
   downloads, and applied_lsn set to its LSN; then each object's records, as it arrives,
   collapsed in C and applied in batches (memory stays flat however large the log; the snapshot is
   held a window at a time, `_SNAPSHOT_WINDOW_BYTES`, or whole when sealed); a
   checkpoint, and a new log whose first LSN continues the archive's. Then it is moved to `dir`
   whole and opened once, as any store.

Refused, with nothing written to `dir`: a damaged object or a gap in the LSNs needed (naming
the range), a target LSN past the archive's end (naming the end), a time after its last
commit's stamp (naming the end) or before the oldest snapshot, a `dir` that exists and is not
empty. A damaged snapshot is not needed where an older
one and the log after it hold the same LSNs: it is passed over for them, with a WARNING
(`restore_chain`), and refused, naming its damage, only where they do not.

The archive's end is the chain's. Objects past it left by a writer that stopped with PUTs in
flight (the machine lost), or stored after the fence by a writer fenced with PUTs in flight
(strays, which the chain also passes over among its successor's objects), are an unfinished
tail (FORMAT.md §18; none of their records was acknowledged at `replicated`). A restore to the
end stops before the gap, names the tail in `RestoreReport.unfinished_tail` and logs a WARNING;
a target past the gap is refused, naming it. More objects past a gap than a writer can have in
flight is damage: refused.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as _dt
import errno
import fcntl
import logging
import os
import shutil
import time as _time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from wal._fs import fsync_dir, makedirs_durable
from wal.archive import layout
from wal.archive.objects import ObjectMissingError, ObjectStore, RangedRead, file_path, open_objects
from wal.archive.plan import Chain, Listing, Piece, beyond, decoded, list_archive, unfinished_tail
from wal.archive.sealed import for_reading, with_dictionaries
from wal.errors import (
    ArgumentError,
    ArgumentTypeError,
    CorruptionError,
    SealDamagedError,
    TargetNotHeldError,
    path_argument,
    storage_error,
)
from wal.log import record
from wal.log.log import Log, RecordSpan
from wal.store import store as store_mod
from wal.store.replay import BATCH_BYTES, BATCH_KEYS
from wal.store.state import DATA_FILE, State
from wal.store.store import open_local

_logger = logging.getLogger("wal.archive")

Progress = Callable[[int, int], None]  # (bytes downloaded, bytes planned)
Sink = Callable[[layout.LogObject, int, int], None]  # records [start, stop) of an object, in LSN order


class RestoreReport(NamedTuple):
    path: str
    lsn: int  # the restored store's last LSN
    snapshot_lsn: int
    records: int  # log records applied after the snapshot
    objects: int  # objects downloaded
    bytes: int
    seconds: float
    download_seconds: float
    unfinished_tail: tuple[str, ...] = ()  # objects past the end's gap, not used (module docstring)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.download_seconds, 1e-9)


def parse_time(value: Any) -> int:
    """An aware datetime or an ISO 8601 string with a zone (``Z`` allowed) -> unix milliseconds."""
    if isinstance(value, str):
        try:
            value = _dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError as exc:
            raise ArgumentError(f"time must be ISO 8601 (e.g. 2026-11-25T21:00:00Z), got {value!r}") from exc
    if not isinstance(value, _dt.datetime):
        raise ArgumentTypeError(f"time must be an aware datetime or an ISO 8601 string, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ArgumentError(f"time {value.isoformat()} has no time zone; give one (e.g. ...+00:00 or Z)")
    return int(value.timestamp() * 1000)


def _fetch_and_decode(objects: ObjectStore, name: str) -> tuple[int, layout.LogObject | CorruptionError]:
    """One log object downloaded and verified (layout.decode_log), in a download thread: the
    SHA-256 and the CRC-32Cs run without the GIL, so verifying keeps pace with downloading
    instead of queueing behind it on the caller's thread. Damage is returned, not raised, so
    the caller meets it in LSN order. So is an encrypted object's that fails its tag, which the
    sealed object store raises as it opens the object (so the chain names the right object, and
    `verify` reads on past it)."""
    try:
        data = objects.get_buffer(name)
    except CorruptionError as exc:
        return 0, exc
    return len(data), decoded(name, data)


def _stamp_of(objects: ObjectStore, listing: Listing, lsn: int) -> int | None:
    """The commit stamp of LSN `lsn`, from the newest-starting log object listed that holds it (one
    GET); None if none does (retention removed them) or it cannot be read."""
    holding = [p for p in listing.logs if p.first <= lsn and (p.last is None or p.last >= lsn)]
    for piece in sorted(holding, key=lambda p: -p.first):
        try:
            _, obj = _fetch_and_decode(objects, piece.name)
        except ObjectMissingError:
            continue
        if isinstance(obj, CorruptionError) or lsn not in obj.lsns:
            continue
        return layout.time_of(obj.payload(obj.lsns.index(lsn)))
    return None


def _fetch_all(objects: ObjectStore, pieces: list[Piece], parallel: int,
               progress: Progress | None) -> Iterator[tuple[Piece, int, layout.LogObject | CorruptionError]]:
    """Download and verify pieces, `parallel` at a time, yielding each in order as (piece, its
    size in bytes, the decoded object or the CorruptionError it gave) as soon as it and all
    before it are in. At most 2 x `parallel` pieces and _FETCH_AHEAD_BYTES are downloaded ahead
    of the one being used (always at least the next): merged objects are up to 16 MiB each."""
    total = sum(p.size for p in pieces)
    done = 0
    ahead = 0  # bytes of the pieces submitted and not yet yielded
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        futures: list[concurrent.futures.Future[tuple[int, layout.LogObject | CorruptionError]] | None] = []
        nxt = 0
        try:
            for i, piece in enumerate(pieces):
                while nxt < len(pieces) and nxt < i + parallel * 2 and (nxt == i or ahead < _FETCH_AHEAD_BYTES):
                    futures.append(pool.submit(_fetch_and_decode, objects, pieces[nxt].name))
                    ahead += pieces[nxt].size
                    nxt += 1
                future = futures[i]
                assert future is not None
                size, obj = future.result()
                futures[i] = None
                ahead -= piece.size
                done += size
                if progress is not None:
                    progress(done, total)
                yield piece, size, obj
        finally:
            for f in futures:
                if f is not None:
                    f.cancel()


class ChosenSnapshot(NamedTuple):
    """The snapshot a restore starts from: its header (checked), and its bytes, arriving
    (`RangedRead`), checked as they are loaded (`layout.snapshot_pieces`). No `read` for the
    implicit empty snapshot at LSN 0."""

    name: str
    header: layout.SnapshotHeader
    read: RangedRead | None


@contextlib.contextmanager
def _snapshot_damage(snap: ChosenSnapshot) -> Iterator[None]:
    """Damage found in the snapshot being loaded, as `_SnapshotDamagedError` (`restore_chain`)."""
    try:
        yield
    except CorruptionError as exc:
        raise _SnapshotDamagedError(snap.name, exc) from exc


@contextlib.contextmanager
def _damage_blamed_on_the_ciphertext(read: RangedRead) -> Iterator[None]:
    """Damage found while reading a snapshot's bytes as they arrive: an encrypted snapshot's are
    handed out before its tag is checked (`sealed.DecryptingRead`), so a changed ciphertext byte
    shows as damage in the plaintext (a bad magic, a header that disagrees with the name, an
    entry's CRC). Then the tag is checked first, and a tag that fails is what is raised
    (SealDamagedError: the ciphertext was changed); one that passes leaves the damage found.
    The check reads the rest of the snapshot (a window at a time), on damage only."""
    try:
        yield
    except SealDamagedError:
        raise
    except CorruptionError as exc:
        try:
            read.authenticate()
        except SealDamagedError as changed:
            raise changed from exc
        except Exception:  # the tag could not be read (the object store): the damage found stands
            pass
        raise


class _SnapshotDamagedError(Exception):
    """The snapshot a restore started from is damaged (`error`): `restore_chain` passes over it
    for an older one, whose log after it may be whole."""

    def __init__(self, name: str, error: CorruptionError) -> None:
        super().__init__(str(error))
        self.name = name
        self.error = error


def _choose_snapshot(objects: ObjectStore, listing: Listing, lsn: int | None,
                     time_ms: int | None, passed_over: dict[str, CorruptionError]) -> ChosenSnapshot:
    """The newest snapshot at or before the target, its header read and checked, its bytes on
    their way. An archive whose log starts at LSN 1 has an implicit empty snapshot at LSN 0.
    Snapshots found damaged (`passed_over`, by name: a restore found one, or this finds a header)
    are passed over for older ones; with none left, the newest one's damage is raised."""
    if any(p.first == 1 for p in listing.logs) or (not listing.logs and not listing.snapshots):
        # Its log from LSN 1 on, or nothing at all (a writer that shipped nothing yet): the state
        # at LSN 0 is the empty one.
        listing = Listing(listing.logs, [(0, ""), *[s for s in listing.snapshots if s[0] > 0]])
    if not listing.snapshots:
        raise CorruptionError(f"the archive {objects.url} holds no snapshot: nothing to restore from "
                              "(is it an agentwal archive? has its writer shipped anything yet?)",
                              path=objects.url, reason="no snapshot")
    candidates = [(s, n) for s, n in listing.snapshots if lsn is None or s <= lsn]
    if not candidates:
        raise TargetNotHeldError(f"LSN {lsn} is before the oldest snapshot in {objects.url} (LSN "
                                 f"{listing.snapshots[0][0]}); retention removed what an older restore needs")
    for _, name in reversed(candidates):
        if not name:
            return ChosenSnapshot("", layout.EMPTY_SNAPSHOT_HEADER, None)
        if name in passed_over:
            continue
        read = objects.read_ranged(name, window=_SNAPSHOT_WINDOW_BYTES)
        try:
            with _damage_blamed_on_the_ciphertext(read):
                header = layout.read_snapshot_header(read, name)
        except CorruptionError as exc:
            read.close()
            _pass_over(objects, name, exc, passed_over)
            continue
        except BaseException:
            read.close()
            raise
        if time_ms is None or header.taken_ms <= time_ms:
            return ChosenSnapshot(name, header, read)
        read.close()  # before the next one comes in
    if passed_over:  # every snapshot that could serve is damaged: the newest one's damage
        raise next(iter(passed_over.values()))
    read = objects.read_ranged(candidates[0][1], window=_SNAPSHOT_WINDOW_BYTES)  # never the implicit one
    try:
        with _damage_blamed_on_the_ciphertext(read):
            oldest = layout.read_snapshot_header(read, candidates[0][1])
    finally:
        read.close()
    raise TargetNotHeldError(f"time {_iso(time_ms or 0)} is before the oldest snapshot in {objects.url} "
                             f"(taken {_iso(oldest.taken_ms)})")


def _pass_over(objects: ObjectStore, name: str, error: CorruptionError,
               passed_over: dict[str, CorruptionError]) -> None:
    passed_over[name] = error
    _logger.warning("archive %s: the snapshot %s is damaged (%s); restoring from an older snapshot and the log "
                    "after it instead, if they are whole", objects.url, name, error)


def _passed_over_lsn(passed_over: dict[str, CorruptionError]) -> int:
    """The LSN of the newest snapshot passed over as damaged (its name's): the archive held every
    LSN up to it, so a restore from an older snapshot must reach it (a time target taken before
    a damaged header's snapshot too: refused then, as without the older one)."""
    names = (layout.parse_name(name) for name in passed_over)
    return max((n.first for n in names if n is not None), default=0)


def _iso(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.UTC).isoformat()


def stream(objects: ObjectStore, listing: Listing, after: int, sink: Sink, *, upto: int | None,
           time_ms: int | None, parallel: int, progress: Progress | None, writer: bytes | None = b"",
           tail_out: list[Piece] | None = None,
           after_taken_ms: int | None = None) -> tuple[int, int, int, bytes | None]:
    """Hand `sink` the verified records after+1.. (to `upto` / to the last commit at or before
    time_ms / to the end) along the chain (`plan.Chain`; `writer`: the writer_id of the
    snapshot or object ending at `after`), object by object as the downloads come in: ``sink(obj,
    start, stop)`` takes records [start, stop) of `obj`, the next ones in LSN order. Returns the
    last LSN handed over, the number of objects and bytes downloaded, and the writer_id of the
    last object used (else `writer`). CorruptionError on damage or a gap, raised before any
    record past it is handed over. Unfinished tails and strays past the end (module docstring) go
    into `tail_out`. after_taken_ms: when the snapshot at `after` was taken (a time target past
    the archive's end is refused; with no record after the snapshot, the end's commit stamp is
    read from the object holding it, or is this where none does)."""
    pos = after
    chain = Chain(objects, listing.logs, after, writer, upto=upto,
                  fetch=lambda pieces: _fetch_all(objects, pieces, parallel, progress))
    reached = False  # stopped at the target
    last_ms: int | None = None  # the stamp of the last record handed over
    misses, missed_at = 0, -1  # relists in a row with no record handed over between them, and where
    while True:
        try:
            for obj in chain:
                start, stop = max(0, pos + 1 - obj.first), len(obj.lsns)
                if upto is not None and obj.last > upto:
                    stop, reached = max(start, upto - obj.first + 1), True
                if time_ms is not None and obj.max_time_ms > time_ms:
                    for i in range(start, stop):
                        offset = obj.offsets[i]
                        if layout.time_of(obj.body[offset:offset + obj.lengths[i]]) > time_ms:
                            stop, reached = i, True
                            break
                if start < stop:
                    sink(obj, start, stop)
                    pos = obj.lsns[stop - 1]
                    if time_ms is not None:
                        offset = obj.offsets[stop - 1]
                        last_ms = layout.time_of(obj.body[offset:offset + obj.lengths[stop - 1]])
                if reached:
                    break
            break
        except ObjectMissingError:
            # Merged away (or removed by retention) between the listing and the download: list
            # again and go on from the last object verified. A writer merging as fast as this
            # restore reads meets it again and again (the new listing's end is further on, and
            # its newest group objects are the next merged): that is given up only after
            # _REPLANS relists in a row that handed nothing over.
            misses = misses + 1 if pos == missed_at else 1
            if misses > _REPLANS:
                raise
            missed_at = pos
            listing = list_archive(objects)
            chain.relist(listing.logs)
    found = (chain.fetched, chain.bytes, chain.writer)
    if reached or (upto is not None and pos >= upto):
        return pos, *found
    past = beyond(listing.logs, pos)
    tail = unfinished_tail(objects, listing.logs, pos, chain.heads) if past else None
    if past and tail is None:
        later = min(p.first for p in past)
        raise CorruptionError(f"the archive {objects.url} is missing LSNs {pos + 1}..{later - 1}: no object holds "
                              "them; restore refused (restore to an LSN before the gap with lsn=)",
                              path=objects.url, lsn=pos + 1, reason="archive gap")
    beyond_end = (f": LSNs {pos + 1}..{tail[0].first - 1} are missing and {len(tail)} object(s) past them "
                  "are an unfinished tail (of a writer stopped, or fenced, with PUTs in flight)" if tail else "")
    if upto is not None:
        raise TargetNotHeldError(f"LSN {upto} is past the end of the archive {objects.url}, which ends at LSN "
                                 f"{pos}{beyond_end}")
    if time_ms is not None and last_ms is None and pos > 0:
        last_ms = _stamp_of(objects, listing, pos)
        if last_ms is None:
            last_ms = after_taken_ms
    if time_ms is not None and last_ms is not None and time_ms > last_ms:
        # As a PostgreSQL recovery target past its WAL: the archive cannot say what was committed
        # between its last commit and the target (a writer lost meanwhile: not archived yet).
        raise TargetNotHeldError(f"time {_iso(time_ms)} is past the end of the archive {objects.url}, which ends at "
                                 f"LSN {pos}, committed {_iso(last_ms)}{beyond_end}; restore without a time "
                                 "target for its end")
    if tail_out is not None and tail:
        tail_out.extend(tail)
    return pos, *found


_REPLANS = 5
# Log objects downloaded ahead of the one being applied, at most (`_fetch_all`).
_FETCH_AHEAD_BYTES = 128 << 20
# A batch of keys mostly written once ends with the object that brings it to this size (StoreBuilder.add).
_OBJECT_BATCH_BYTES = 1 << 20
# Snapshot entries per LMDB transaction at most (and BATCH_BYTES of keys and values): bounds a
# transaction's dirty pages for a snapshot of many small entries.
_LOAD_ENTRIES = 1_000_000
# A snapshot's entries are checked and loaded as this many more of its bytes arrive.
_SNAPSHOT_PIECE_BYTES = 16 << 20
# At most about this many bytes of a snapshot are held at once while it loads (fetched ahead of
# the load, and the piece being loaded), however large it is: RangedRead's window, the ranges
# fetched at a time (RANGE_PARALLEL x RANGE_BYTES). A restore of a 1 GB snapshot from the local S3
# server ran as fast with it as with twice as much (268 and 271 MB/s), and of a 510 MB one from a
# local folder its process peaked at 393-471 MB of anonymous memory, against 801-921 whole.
_SNAPSHOT_WINDOW_BYTES = 128 << 20


def restore(url: str | ObjectStore, directory: str | os.PathLike[str], *, lsn: int | None = None,
            time: Any = None, parallel: int = 16, progress: Progress | None = None,
            **sealing: Any) -> RestoreReport:
    """Restore the archive at `url` into a new store at `directory`, to `lsn`, to `time` (an
    aware datetime or ISO 8601 string: the log up to the first commit stamped after it, which
    keeps every commit acknowledged at or before it; README, "Disaster recovery"), or to its end.
    `sealing`: the `wal.open` options of a sealed store (encryption=, compression=, ...): an
    encrypted archive needs its key, and the store restored is sealed as the one that shipped."""
    _refuse_missing_folder(url)
    return restore_chain(url, directory, lsn=lsn, time=time, parallel=parallel, progress=progress, **sealing)[0]


def _refuse_missing_folder(url: str | ObjectStore) -> None:
    """A ``file://`` archive whose folder does not exist: a mistyped URL, told apart from an
    archive that holds nothing yet (its writer makes the folder when it opens), which an S3
    prefix cannot be. Refused by restore and verify; a follower may start before its writer."""
    text = url if isinstance(url, str) else getattr(url, "url", None)  # an obstore store has none
    path = file_path(text) if isinstance(text, str) else None
    if path is not None and not os.path.isdir(path):
        raise ArgumentError(f"there is no archive at {text}: its folder does not exist")


def restore_chain(url: str | ObjectStore, directory: str | os.PathLike[str], *, lsn: int | None = None,
                  time: Any = None, parallel: int = 16, progress: Progress | None = None,
                  **sealing: Any) -> tuple[RestoreReport, bytes | None]:
    """`restore`, and the writer_id of the last object (or snapshot) restored: where a follower's
    chain goes on from (`plan.Chain`)."""
    started = _time.monotonic()
    if lsn is not None and (isinstance(lsn, bool) or not isinstance(lsn, int) or lsn < 0):
        raise ArgumentError(f"lsn must be an int >= 0, got {lsn!r}")
    if lsn is not None and time is not None:
        raise ArgumentError("give lsn= or time=, not both")
    if not isinstance(parallel, int) or parallel < 1:
        raise ArgumentError(f"parallel must be an int >= 1, got {parallel!r}")
    time_ms = parse_time(time) if time is not None else None
    path_argument(directory, "the directory to restore into")
    if not os.fspath(directory):  # "" (an unset variable, say) would restore onto the current directory
        raise ArgumentError("the directory to restore into is empty: name it")
    # A symlink to an empty directory is restored into: the store is built beside the directory
    # it names, and renamed onto it (a rename onto the link would replace the link).
    root = os.path.realpath(os.fspath(directory))
    if os.path.exists(root) and (not os.path.isdir(root) or os.listdir(root)):
        raise ArgumentError(f"{root} exists and is not an empty directory; restore into a new one")
    if os.path.ismount(root):
        raise ArgumentError(f"{root} is a mount point: a restore builds the store beside its directory and "
                            "renames it into place whole, which a mount point cannot take; restore into a new "
                            f"directory inside it (e.g. {os.path.join(root, 'store')})")
    objects, sealed = for_reading(open_objects(url), sealing)
    listing = list_archive(objects)
    if not listing.logs and not listing.snapshots:
        # A file:// folder that does not exist reaches here only from a follower (restore refuses
        # it): a standby may start before its writer, whose open makes the folder.
        folder = file_path(objects.url)
        why = ("its folder does not exist yet: its writer's open makes it, and a mistyped URL looks the same"
               if folder is not None and not os.path.isdir(folder) else
               "its writer shipped nothing yet, or the URL names no archive")
        _logger.warning("archive %s holds nothing (%s): restoring the empty state at LSN 0", objects.url, why)
    t0 = _time.monotonic()
    passed_over: dict[str, CorruptionError] = {}  # damaged snapshots, by name, the newest first
    while True:
        try:
            return _restore_from(objects, listing, root, sealing=sealing, sealed=sealed, started=started, t0=t0,
                                 lsn=lsn, time_ms=time_ms, parallel=parallel, progress=progress,
                                 passed_over=passed_over)
        except _SnapshotDamagedError as damaged:
            # Passed over for an older snapshot (`_choose_snapshot`), whose log after it makes the
            # same state: a restore is refused for damage only where nothing else holds the LSNs.
            _pass_over(objects, damaged.name, damaged.error, passed_over)
        except CorruptionError as exc:
            # From an older snapshot, a gap or damage in its log: the newest snapshot's damage stands.
            first = next(iter(passed_over.values()), None)
            if first is None or first is exc:
                raise
            raise first from exc


def _restore_from(objects: ObjectStore, listing: Listing, root: str, *, sealing: dict[str, Any],
                  sealed: dict[str, Any] | None, started: float, t0: float, lsn: int | None, time_ms: int | None,
                  parallel: int, progress: Progress | None,
                  passed_over: dict[str, CorruptionError]) -> tuple[RestoreReport, bytes | None]:
    """One try of `restore_chain`, from the newest snapshot at or before the target not found
    damaged yet; `_SnapshotDamagedError` if that one is."""
    snap = _choose_snapshot(objects, listing, lsn, time_ms, passed_over)
    snap_lsn, snap_writer, snap_taken_ms = snap.header.lsn, snap.header.writer_id, snap.header.taken_ms
    snap_bytes = snap.read.size if snap.read is not None else 0
    snap_read = snap.read  # closed below if the restore fails before the builder took it
    tail: list[Piece] = []
    # Built beside `root` and moved into place whole, so `root` never holds half a store.
    building = os.path.join(os.path.dirname(root), f"{_building_prefix(root)}{os.urandom(4).hex()}")
    made = _missing_dirs(os.path.dirname(root))  # a refused restore leaves none of them behind
    existed = os.path.isdir(root)  # an empty directory (checked above)
    _sweep_abandoned_builds(root)
    held = -1
    try:
        held = _hold_build(building)
        builder = StoreBuilder(building, snap, sealed)
        del snap  # its bytes go once the builder has loaded them
        snap_read = None  # the builder's now (it closes it)
        try:
            end, count, nbytes, writer = stream(objects, listing, snap_lsn, builder.add, upto=lsn, time_ms=time_ms,
                                                parallel=parallel, progress=progress, writer=snap_writer,
                                                tail_out=tail, after_taken_ms=snap_taken_ms)
            if passed_over and end < _passed_over_lsn(passed_over):
                # The archive reached the damaged snapshot's LSN; a chain from an older one that
                # ends before it lacks objects (retention, or deleted): not a shorter archive.
                raise next(iter(passed_over.values()))
            builder.finish()
        finally:
            builder.close()
        download = _time.monotonic() - t0
        if tail:
            _logger.warning("archive %s: a writer stopped (or was fenced) with PUTs in flight; restoring to LSN %d, "
                            "the end of the chain, without %s (an unfinished tail, never acknowledged at "
                            "replicated; or, if an object was deleted from the archive, what came after it)",
                            objects.url, end, ", ".join(p.name for p in tail))
        os.unlink(os.path.join(building, _BUILD_LOCK))  # (still held: no sweep takes it meanwhile)
        os.rename(building, root)  # onto a missing or empty directory: atomic
        fsync_dir(os.path.dirname(root))
    except BaseException as exc:
        if snap_read is not None:
            snap_read.close()
        shutil.rmtree(building, ignore_errors=True)
        if held >= 0:
            os.close(held)
            held = -1
        for made_dir in made:  # deepest first; one something else was put in meanwhile stays
            with contextlib.suppress(OSError):
                os.rmdir(made_dir)
        if isinstance(exc, OSError):  # a full disk: NoSpaceError, as for any store write
            raise storage_error(exc, f"restoring {objects.url} into {root}", _RESTORE_ADVICE) from exc
        raise
    os.close(held)
    try:
        open_local(root, **with_dictionaries(objects, sealing)).close()  # an ordinary store: it opens as one
    except BaseException as exc:
        # Its first open writes too (its log's first segment, the state's metadata): refused (a
        # full disk), the store is not left in place, where it would refuse a restore once there
        # is room ("not an empty directory"); what was there before (nothing, or an empty
        # directory) is.
        shutil.rmtree(root, ignore_errors=True)
        if existed:
            with contextlib.suppress(OSError):
                os.mkdir(root)
        if isinstance(exc, OSError):
            raise storage_error(exc, f"restoring {objects.url} into {root}", _RESTORE_ADVICE) from exc
        raise
    return RestoreReport(root, end, snap_lsn, builder.records, count + 1, nbytes + snap_bytes,
                         _time.monotonic() - started, download, tuple(p.name for p in tail)), writer


# A store being built by a restore is a hidden directory beside its target, holding this file
# flocked (LOCK_EX) by its restore for as long as it runs: a build no one holds was abandoned
# (its restore killed, or the machine lost power) and the next restore into the target removes it.
_BUILD_LOCK = ".restore-lock"
# An abandoned build's directory without its lock file (killed between making one and the
# other, or between giving the lock file up and the rename into place) is removed once this old.
_UNLOCKED_BUILD_AGE_S = 60.0


# What a refused restore tells its caller (errors.storage_error's advice is a running store's).
_RESTORE_ADVICE = {
    errno.ENOSPC: "the filesystem is full: nothing of the restore was left behind; restore again once there is room",
    errno.EDQUOT: "the disk quota is used up: nothing of the restore was left behind; restore again once there is room",
}
# Free space a restore needs before it opens the state it builds: LMDB sets up its lock file
# through a shared mapping of it, and a page of that mapping the disk has no block for is a
# SIGBUS, not an error (a restore into a disk with a few KiB left died so).
_MIN_FREE_BYTES = 256 << 10


def _check_room(root: str) -> None:
    st = os.statvfs(root)
    if st.f_bavail * st.f_frsize < _MIN_FREE_BYTES:
        raise OSError(errno.ENOSPC, f"{st.f_bavail * st.f_frsize} bytes free, fewer than a restore needs to start "
                                    f"({_MIN_FREE_BYTES})", root)


def _building_prefix(root: str) -> str:
    return f".{os.path.basename(root)}.restoring-"


def _hold_build(building: str) -> int:
    """Make the directory a restore builds in, holding its lock file; the fd that holds it. The
    lock file is locked under another name and renamed into place: a sweep never finds it
    there unlocked (it would take the lock and remove the build being made)."""
    makedirs_durable(building)
    made = os.path.join(building, f"{_BUILD_LOCK}.new")
    fd = os.open(made, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(made, os.path.join(building, _BUILD_LOCK))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sweep_abandoned_builds(root: str) -> None:
    """Remove the builds of earlier restores into `root` that were killed midway (each up to
    the store's size, hidden beside it): those whose lock file no restore holds."""
    parent, prefix = os.path.dirname(root), _building_prefix(root)
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            fd = os.open(os.path.join(path, _BUILD_LOCK), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if _time.time() - os.stat(path).st_mtime > _UNLOCKED_BUILD_AGE_S:
                    shutil.rmtree(path, ignore_errors=True)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a restore into `root` is running now: its build stays
        finally:
            os.close(fd)  # (closing it gives the lock back)
        _logger.warning("removing %s: the store a restore into %s was building when it was stopped", path, root)
        shutil.rmtree(path, ignore_errors=True)


def _missing_dirs(path: str) -> list[str]:
    """The directories of `path` (itself included) that do not exist yet, deepest first."""
    missing = []
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


class StoreBuilder:
    """An ordinary store written at `root` from a snapshot and the records after it, in one
    pass as they are downloaded: the records are collapsed in C straight from each object's
    bytes (`record.Collapser`, as a store's open replays its log) and applied to the state in
    batches, so memory stays flat however large the archive. The store's log then starts empty
    after the last record, as a store's log does after a checkpoint: the records are in the
    state, and the archive keeps their history. A sealed archive gives a sealed store (its STORE
    says `sealed`; the entries and records are envelopes already)."""

    def __init__(self, root: str, snap: ChosenSnapshot, sealed: dict[str, Any] | None) -> None:
        self._snap_read = snap.read  # stopped by close() if the restore ends early
        makedirs_durable(root)
        self.root = root
        self.last = snap.header.lsn
        self.records = 0
        self._added = 0  # payload bytes added to the collapser since its last take
        store_mod._write_store_file(root, {"sealed": sealed} if sealed is not None else None)
        self._collapser = record.Collapser()
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentwal-restore-writer")
        self._writing: concurrent.futures.Future[None] | None = None
        self._syncer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentwal-restore-syncer")
        self._syncing: concurrent.futures.Future[None] | None = None
        self._data_fd = -1
        _check_room(root)
        self._state: State | None = State(os.path.join(root, store_mod.STATE_DIR))
        try:
            self._data_fd = os.open(os.path.join(root, store_mod.STATE_DIR, DATA_FILE), os.O_RDONLY)
            if snap.header.lsn > 0:
                # In the writer thread, while the snapshot's later bytes and the first log
                # objects download.
                self._writing = self._writer.submit(self._load, snap)
            elif snap.read is not None:
                # A snapshot of the empty state (a writer's first): nothing to load, but it is
                # checked whole all the same (its trailer; an encrypted one's tag) before its
                # writer_id starts the chain.
                with _snapshot_damage(snap), _damage_blamed_on_the_ciphertext(snap.read):
                    for _ in layout.snapshot_pieces(snap.read, snap.name, snap.header, _SNAPSHOT_PIECE_BYTES):
                        pass
        except BaseException:
            self.close()
            raise

    def add(self, obj: layout.LogObject, start: int, stop: int) -> None:
        """Records [start, stop) of `obj`, the next ones after `last`."""
        whole = start == 0 and stop == len(obj.lsns)
        self._collapser.add(RecordSpan(obj.body, obj.lsns if whole else obj.lsns[start:stop],
                                       obj.offsets if whole else obj.offsets[start:stop],
                                       obj.lengths if whole else obj.lengths[start:stop], stop - start))
        self.last = obj.lsns[stop - 1]
        self.records += stop - start
        self._added += obj.offsets[stop - 1] + obj.lengths[stop - 1] - obj.offsets[start]
        held = self._collapser.held_bytes
        # The winners' values point into this object's bytes until the next object comes, when
        # the collapser must copy them (its table outlives the buffer), with the GIL held.
        # Collapsing across objects is worth that copy only where later writes replace earlier
        # ones: so while the batch's winners hold most of the bytes added to it (collapsing has
        # saved little: keys mostly written once, as in a bulk load), the batch ends with its
        # object once it holds _OBJECT_BATCH_BYTES (fewer, larger LMDB transactions for small
        # objects: each one rewrites its path of branch pages), and the values go to LMDB
        # straight from the object's bytes.
        if (self._collapser.keys >= BATCH_KEYS or held >= BATCH_BYTES
                or (held >= _OBJECT_BATCH_BYTES and held * 2 >= self._added)):
            self._apply()

    def _apply(self) -> None:
        # A batch is written to LMDB by the writer thread (the GIL released) while this one
        # collapses the next: one batch in the writer's hands at a time bounds the memory.
        batch = self._collapser.take()
        self._added = 0
        if batch is None:
            return
        self._wait_for_writer()
        self._writing = self._writer.submit(self._write, batch)

    def _load(self, snap: ChosenSnapshot) -> None:
        """The snapshot's entries, straight from its bytes into LMDB as they arrive, each piece
        checked first (`layout.snapshot_pieces`: the entries' CRC-32C as they come, the
        SHA-256 of the whole once in), in transactions of a bounded size, appended where the
        keys are in order, as written; then its idempotency entries, a chunk of
        `layout.IDEM_CHUNK` at a time (so a retry of a commit the snapshot holds is known as one
        by the restored store, and by a promoted follower); then applied_lsn = the snapshot's
        LSN, in a transaction of its own.
        Until then the state says it holds nothing, and nothing opens it: the store is moved
        into place only once whole, so entries loaded before a damaged byte further on is
        found are never seen."""
        assert self._state is not None and snap.read is not None
        read = snap.read
        try:
            with _snapshot_damage(snap), _damage_blamed_on_the_ciphertext(read):
                for piece in layout.snapshot_pieces(read, snap.name, snap.header, _SNAPSHOT_PIECE_BYTES):
                    if piece.idem:
                        self._state.load_idem(piece.idem)
                    offset, left = piece.offset, piece.n_entries
                    while left:
                        offset, done = self._state.load_snapshot(piece.body, offset, min(left, _LOAD_ENTRIES),
                                                                 BATCH_BYTES, piece.in_key_order)
                        assert done > 0, "load_snapshot puts at least one entry of those asked for"
                        left -= done
                        self._sync_soon()
                    del piece  # its view of the buffer
        finally:
            read.close()
        self._snap_read = None  # its bytes go once loaded
        lsn = snap.header.lsn
        self._state.apply((1, lsn, lsn, [], [], []), lambda: lsn)

    def _write(self, batch: record.Collapsed) -> None:
        assert self._state is not None
        last = batch[1]  # durable: in the archive, verified
        self._state.apply(batch, lambda: last)
        self._sync_soon()

    def _sync_soon(self) -> None:
        # Written back to the disk batch by batch, while the next batch is applied, rather than
        # all at the end: an fdatasync of the state's file in a thread of its own (LMDB's own
        # sync is the checkpoint's, which would keep the next apply waiting). One at a time; a
        # batch applied meanwhile goes with the next.
        if self._syncing is None or self._syncing.done():
            self._syncing = self._syncer.submit(os.fdatasync, self._data_fd)

    def _wait_for_writer(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def finish(self) -> None:
        """Apply the rest, make the state durable, and start the log after it."""
        self._collapser.detach()
        self._apply()
        self._wait_for_writer()
        if self._syncing is not None:
            self._syncing.result()
        assert self._state is not None
        self._state.checkpoint()
        self._state.close()
        self._state = None
        log = Log.open(os.path.join(self.root, store_mod.LOG_DIR), _first_lsn=self.last + 1, _store_log=True)
        try:
            log.sync()
        finally:
            log.close()

    def close(self) -> None:
        if self._snap_read is not None:
            self._snap_read.close()
        self._collapser.detach()
        with contextlib.suppress(BaseException):  # the caller's error (or finish's) is the one reported
            self._wait_for_writer()
        self._writer.shutdown()
        self._syncer.shutdown()
        if self._data_fd >= 0:
            os.close(self._data_fd)
            self._data_fd = -1
        if self._state is not None:
            self._state.close()
            self._state = None


class VerifyReport(NamedTuple):
    url: str
    objects: int
    bytes: int
    first_lsn: int
    last_lsn: int
    snapshots: int
    problems: list[str]
    unfinished_tail: tuple[str, ...] = ()  # objects past the end's gap (a writer stopped mid-flight)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(url: str | ObjectStore, *, parallel: int = 16, progress: Progress | None = None,
           **sealing: Any) -> VerifyReport:
    """Read every object of the archive: each must verify alone, the LSNs must run on without a
    gap from the oldest snapshot to the end, and every snapshot must be sound. `sealing`: the key
    (encryption=, ...) of an encrypted archive.

    A live writer's retention deletes old snapshots, and the log up to the oldest it keeps, while
    this reads: a snapshot gone since the listing, and the log after it, read as damage and a gap.
    So a verification that found problems where objects went missing under it is made again on a
    new listing (at most _REVERIFY times in all); an object listed but gone each time is reported."""
    _refuse_missing_folder(url)
    objects, _ = for_reading(open_objects(url), sealing)
    for _attempt in range(_REVERIFY):
        report, vanished = _verify_listing(objects, list_archive(objects), parallel, progress)
        if report.ok or not vanished:
            break
    return report


# Verifications of one archive made at most, each on a new listing, while objects go missing
# under them (`verify`: a writer's retention running meanwhile).
_REVERIFY = 3


def _verify_listing(objects: ObjectStore, listing: Listing, parallel: int,
                    progress: Progress | None) -> tuple[VerifyReport, bool]:
    """`verify` from one listing; and whether any object it names went missing meanwhile."""
    problems: list[str] = []
    vanished = False
    if not listing.logs and not listing.snapshots:
        # Not an archive found sound: a mistyped URL (an S3 prefix always "exists") said "sound".
        problems.append(f"{objects.url} holds nothing: no snapshot and no log object (a mistyped URL, or a writer "
                        "that has shipped nothing yet); a restore would have nothing to start from")
    nbytes = 0
    count = 0
    writers: dict[str, bytes] = {}
    for _, name in listing.snapshots:
        try:
            data = objects.get_large(name)
            nbytes += len(data)
            count += 1
            writers[name] = layout.open_snapshot(data, name).writer_id
        except ObjectMissingError as exc:
            vanished = True
            problems.append(str(exc))
        except CorruptionError as exc:
            problems.append(str(exc))
    # An implicit empty snapshot at LSN 0: the log from LSN 1 on, or an archive that holds nothing.
    from_start = any(p.first == 1 for p in listing.logs) or (not listing.logs and not listing.snapshots)
    if not listing.snapshots and not from_start:
        problems.append(f"{objects.url} holds no snapshot: a restore has nothing to start from")
    base = 0 if from_start or not listing.snapshots else listing.snapshots[0][0]
    first = base + 1
    # The chain from the base goes on with the base snapshot's writer (plan.Chain).
    writer: bytes | None = b"" if base == 0 else writers.get(listing.snapshots[0][1])
    chain = Chain(objects, listing.logs, base, writer,
                  fetch=lambda pieces: _fetch_all(objects, pieces, parallel, progress))
    damaged: set[str] = set()
    while True:
        try:
            for _ in chain:
                pass
        except CorruptionError as exc:
            problems.append(str(exc))
            if chain.current is not None:
                damaged.add(chain.current.name)
            if chain.skip():
                continue
        except ObjectMissingError:  # merged away meanwhile (or deleted by retention)
            vanished = True
            listing = list_archive(objects)
            chain.relist(listing.logs)
            continue
        pos = chain.pos
        past = [p for p in beyond(listing.logs, pos) if p.name not in damaged]
        tail = unfinished_tail(objects, past, pos, chain.heads) if past else None
        # (An object starting right after pos that the chain could not take is damaged, said above.)
        if not past or tail is not None or past[0].first <= pos + 1:
            break
        problems.append(f"LSNs {pos + 1}..{past[0].first - 1} are missing: no object holds them")
        # Every object is read, those past a gap too: damage there is reported with the gap (an
        # operator who restores from a snapshot past the gap needs to know the log after it is
        # sound). The chain goes on from the gap's end, as past damage.
        chain.go_on_after(past[0].first - 1)
    count += chain.fetched
    nbytes += chain.bytes
    return VerifyReport(objects.url, count, nbytes, first, pos, len(listing.snapshots), problems,
                        tuple(p.name for p in tail or ())), vanished
