"""Point-in-time restore from an archive, and `verify` of an archive.

`restore(url, dir, lsn=None, time=None)`:
1. List the archive once; pick the newest snapshot at or before the target (for a time: taken
   at or before it, so every commit it holds was made at or before it).
2. Plan the log objects from the snapshot's LSN on (`plan.cover`); download them in parallel
   (a window of `parallel` requests ahead), verify each alone (SHA-256 trailer, CRC-32C per
   record, header against name) and check the LSNs run on without a gap.
3. Write an ordinary store: the snapshot's entries applied to a new state at the snapshot's
   LSN (one LMDB transaction), the log records after it into a new log whose first LSN
   continues the archive's, then one ordinary open replays them.

Refused, with nothing written to `dir`: a damaged object or a gap in the LSNs needed (naming
the range), a target LSN past the archive's end (naming the end), a time before the oldest
snapshot, a `dir` that exists and is not empty.

The end of an archive whose writer stopped with PUTs in flight (the machine lost) is the end of
its gap-free run: the group objects past the gap are its unfinished tail (FORMAT.md §18; none
of their records was acknowledged at `replicated`). A restore to the end stops before the gap,
names the tail in `RestoreReport.unfinished_tail` and logs a WARNING; a target past the gap is
refused, naming it. More objects past a gap than a writer can have in flight is damage: refused.
"""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import logging
import os
import shutil
import time as _time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from wal.archive import layout
from wal.archive.objects import ObjectMissingError, ObjectStore, open_objects
from wal.archive.plan import Listing, Piece, cover, list_archive, unfinished_tail
from wal.archive.sealed import for_reading
from wal.errors import ArgumentError, ArgumentTypeError, CorruptionError, storage_error

_logger = logging.getLogger("wal.archive")

Progress = Callable[[int, int], None]  # (bytes downloaded, bytes planned)


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
    the caller meets it in LSN order."""
    data = objects.get(name)
    try:
        return len(data), layout.decode_log(data, name)
    except CorruptionError as exc:
        return len(data), exc


def _fetch_all(objects: ObjectStore, pieces: list[Piece], parallel: int,
               progress: Progress | None) -> Iterator[tuple[Piece, int, layout.LogObject | CorruptionError]]:
    """Download and verify pieces, `parallel` at a time, yielding each in order as (piece, its
    size in bytes, the decoded object or the CorruptionError it gave) as soon as it and all
    before it are in."""
    total = sum(p.size for p in pieces)
    done = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        futures: list[concurrent.futures.Future[tuple[int, layout.LogObject | CorruptionError]] | None] = []
        nxt = 0
        try:
            for i, piece in enumerate(pieces):
                while nxt < len(pieces) and nxt < i + parallel * 2:
                    futures.append(pool.submit(_fetch_and_decode, objects, pieces[nxt].name))
                    nxt += 1
                future = futures[i]
                assert future is not None
                size, obj = future.result()
                futures[i] = None
                done += size
                if progress is not None:
                    progress(done, total)
                yield piece, size, obj
        finally:
            for f in futures:
                if f is not None:
                    f.cancel()


def _choose_snapshot(objects: ObjectStore, listing: Listing, lsn: int | None,
                     time_ms: int | None) -> tuple[layout.Snapshot, int]:
    """The newest snapshot at or before the target, decoded and verified, and its size. An
    archive whose log starts at LSN 1 has an implicit empty snapshot at LSN 0."""
    if any(p.first == 1 for p in listing.logs):
        listing = Listing(listing.logs, [(0, ""), *[s for s in listing.snapshots if s[0] > 0]])
    if not listing.snapshots:
        raise CorruptionError(f"the archive {objects.url} holds no snapshot: nothing to restore from "
                              "(is it an agentwal archive? has its writer shipped anything yet?)",
                              path=objects.url, reason="no snapshot")
    candidates = [(s, n) for s, n in listing.snapshots if lsn is None or s <= lsn]
    if not candidates:
        raise ArgumentError(f"LSN {lsn} is before the oldest snapshot in {objects.url} (LSN "
                            f"{listing.snapshots[0][0]}); retention removed what an older restore needs")
    for _, name in reversed(candidates):
        if not name:
            return layout.Snapshot(0, 0, b"", []), 0
        data = objects.get(name)
        snap = layout.decode_snapshot(data, name)
        if time_ms is None or snap.taken_ms <= time_ms:
            return snap, len(data)
    oldest = layout.decode_snapshot(objects.get(candidates[0][1]), candidates[0][1])  # never the implicit one
    raise ArgumentError(f"time {_iso(time_ms or 0)} is before the oldest snapshot in {objects.url} "
                        f"(taken {_iso(oldest.taken_ms)})")


def _iso(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.UTC).isoformat()


class _TailReached(Exception):  # noqa: N818 -- a signal inside collect, never raised out of it
    def __init__(self, tail: list[Piece], gap_end: int) -> None:
        super().__init__()
        self.tail = tail
        self.gap_end = gap_end


def collect(objects: ObjectStore, listing: Listing, after: int, *, upto: int | None, time_ms: int | None,
            parallel: int, progress: Progress | None,
            tail_out: list[Piece] | None = None) -> tuple[list[tuple[int, bytes]], int, int]:
    """Verified records after+1.. (to `upto` / to the last commit at or before time_ms / to the
    end), the number of objects and bytes downloaded. CorruptionError on damage or a gap.
    An unfinished tail past the end (module docstring) goes into `tail_out`."""
    records: list[tuple[int, bytes]] = []
    tally = {"objects": 0, "bytes": 0}
    reached = False  # stopped at the target, before any gap
    for attempt in range(_REPLANS + 1):
        try:
            reached = _collect_planned(objects, listing, records, after, upto=upto, time_ms=time_ms,
                                       parallel=parallel, progress=progress, tally=tally)
            break
        except _TailReached as stop:
            pos = records[-1][0] if records else after
            if upto is not None and upto > pos:
                raise ArgumentError(
                    f"LSN {upto} is past the end of the archive {objects.url}, which ends at LSN {pos}: LSNs "
                    f"{pos + 1}..{stop.gap_end} are missing (its writer stopped with PUTs in flight), and "
                    f"{len(stop.tail)} object(s) past them are that writer's unfinished tail") from None
            if tail_out is not None:
                tail_out.extend(stop.tail)
            return records, tally["objects"], tally["bytes"]
        except ObjectMissingError:
            # Merged away (or removed by retention) between the listing and the download: list
            # again and go on from the last record already verified.
            if attempt == _REPLANS:
                raise
            listing = list_archive(objects)
    pos = records[-1][0] if records else after
    count, nbytes = tally["objects"], tally["bytes"]
    end_known = pos
    if upto is not None and end_known >= upto:
        reached = True
    _, gap = cover(listing.logs, pos)
    if gap is not None and not reached:
        later = min((p.first for p in listing.logs if p.first > gap), default=gap)
        raise CorruptionError(f"the archive {objects.url} is missing LSNs {gap}..{later - 1}: no object holds "
                              "them; restore refused (restore to an LSN before the gap with lsn=)",
                              path=objects.url, lsn=gap, reason="archive gap")
    if upto is not None and end_known < upto:
        tail = unfinished_tail(objects, listing.logs, end_known)
        beyond = (f": LSNs {end_known + 1}..{tail[0].first - 1} are missing (its writer stopped with PUTs in "
                  f"flight), and {len(tail)} object(s) past them are that writer's unfinished tail" if tail else "")
        raise ArgumentError(f"LSN {upto} is past the end of the archive {objects.url}, which ends at LSN "
                            f"{end_known}{beyond}")
    return records, count, nbytes


_REPLANS = 5


def _collect_planned(objects: ObjectStore, listing: Listing, records: list[tuple[int, bytes]], after: int, *,
                     upto: int | None, time_ms: int | None, parallel: int, progress: Progress | None,
                     tally: dict[str, int]) -> bool:
    """One pass of `collect` over the plan from `listing`, from the last record in `records`
    (else `after`); appends verified records. Returns whether it stopped at the target."""
    pos = records[-1][0] if records else after
    pieces, _ = cover(listing.logs, pos)
    if upto is not None:
        pieces = [p for p in pieces if p.first <= upto]
    reached = False
    for piece, size, obj in _fetch_all(objects, pieces, parallel, progress):
        tally["objects"] += 1
        tally["bytes"] += size
        if isinstance(obj, CorruptionError):
            raise obj
        if obj.first > pos + 1:
            tail = unfinished_tail(objects, listing.logs, pos)
            if tail is not None:
                raise _TailReached(tail, obj.first - 1)
            raise CorruptionError(f"the archive {objects.url} is missing LSNs {pos + 1}..{obj.first - 1} "
                                  f"(between {piece.name} and the object before it); restore refused",
                                  path=objects.url, lsn=pos + 1, reason="archive gap")
        stop = False
        for lsn, payload in obj.records:
            if lsn <= pos:
                continue
            if (upto is not None and lsn > upto) or (time_ms is not None and layout.time_of(payload) > time_ms):
                stop = True
                break
            records.append((lsn, payload))
            pos = lsn
        if stop:
            reached = True
            break
    return reached


def restore(url: str | ObjectStore, directory: str | os.PathLike[str], *, lsn: int | None = None,
            time: Any = None, parallel: int = 16, progress: Progress | None = None,
            **sealing: Any) -> RestoreReport:
    """Restore the archive at `url` into a new store at `directory`, to `lsn`, to `time` (an
    aware datetime or ISO 8601 string: every commit made at or before it), or to its end.
    `sealing`: the `wal.open` options of a sealed store (encryption=, compression=, ...): an
    encrypted archive needs its key, and the store restored is sealed as the one that shipped."""
    started = _time.monotonic()
    if lsn is not None and (isinstance(lsn, bool) or not isinstance(lsn, int) or lsn < 0):
        raise ArgumentError(f"lsn must be an int >= 0, got {lsn!r}")
    if lsn is not None and time is not None:
        raise ArgumentError("give lsn= or time=, not both")
    if not isinstance(parallel, int) or parallel < 1:
        raise ArgumentError(f"parallel must be an int >= 1, got {parallel!r}")
    time_ms = parse_time(time) if time is not None else None
    root = os.fspath(directory)
    if os.path.exists(root) and (not os.path.isdir(root) or os.listdir(root)):
        raise ArgumentError(f"{root} exists and is not an empty directory; restore into a new one")
    objects, sealed = for_reading(open_objects(url), sealing)
    listing = list_archive(objects)
    t0 = _time.monotonic()
    snap, snap_bytes = _choose_snapshot(objects, listing, lsn, time_ms)
    tail: list[Piece] = []
    records, count, nbytes = collect(objects, listing, snap.lsn, upto=lsn, time_ms=time_ms,
                                     parallel=parallel, progress=progress, tail_out=tail)
    if tail:
        _logger.warning("archive %s: its writer stopped with PUTs in flight; restoring to LSN %d, the end of its "
                        "gap-free run, without %s (its unfinished tail, never acknowledged at replicated)",
                        objects.url, records[-1][0] if records else snap.lsn, ", ".join(p.name for p in tail))
    download = _time.monotonic() - t0
    end = records[-1][0] if records else snap.lsn
    created = not os.path.exists(root)
    try:
        write_store(root, snap, records, sealed=sealed, open_options=sealing)
    except BaseException as exc:
        if created:
            shutil.rmtree(root, ignore_errors=True)
        if isinstance(exc, OSError):  # a full disk: NoSpaceError, as for any store write
            raise storage_error(exc, f"restoring {objects.url} into {root}") from exc
        raise
    return RestoreReport(root, end, snap.lsn, len(records), count + 1, nbytes + snap_bytes,
                         _time.monotonic() - started, download, tuple(p.name for p in tail))


def write_store(root: str, snap: layout.Snapshot, records: list[tuple[int, bytes]], *,
                sealed: dict[str, Any] | None = None, open_options: dict[str, Any] | None = None) -> None:
    """An ordinary store at `root` holding the snapshot's state and then `records` (a sealed one,
    its STORE saying `sealed`, when the archive is: the entries and records are envelopes already)."""
    from wal._fs import makedirs_durable  # noqa: PLC0415
    from wal.log.log import Log  # noqa: PLC0415
    from wal.store import store as store_mod  # noqa: PLC0415
    from wal.store.state import State  # noqa: PLC0415

    makedirs_durable(root)
    store_mod._write_store_file(root, {"sealed": sealed} if sealed is not None else None)
    state = State(os.path.join(root, store_mod.STATE_DIR))
    try:
        if snap.lsn > 0:
            puts = [(key, version.to_bytes(8, "little") + value) for key, version, value in snap.entries]
            state.apply((1, snap.lsn, snap.lsn, puts, [], []), lambda: snap.lsn)
        state.checkpoint()
    finally:
        state.close()
    log = Log.open(os.path.join(root, store_mod.LOG_DIR), _first_lsn=snap.lsn + 1)
    try:
        if records:
            last = log.append_many([p for _, p in records], durability="sync")
            if last != records[-1][0]:
                raise CorruptionError(f"restoring into {root}: the new log gave LSN {last} to the record archived "
                                      f"as LSN {records[-1][0]}", path=root, reason="restore LSN mismatch")
        log.sync()
    finally:
        log.close()
    store_mod.open_local(root, **(open_options or {})).close()  # replay the records into the state, as any open does


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
    (encryption=, ...) of an encrypted archive."""
    objects, _ = for_reading(open_objects(url), sealing)
    listing = list_archive(objects)
    problems: list[str] = []
    nbytes = 0
    count = 0
    for _, name in listing.snapshots:
        try:
            data = objects.get(name)
            nbytes += len(data)
            count += 1
            layout.decode_snapshot(data, name)
        except (CorruptionError, ObjectMissingError) as exc:
            problems.append(str(exc))
    from_start = any(p.first == 1 for p in listing.logs)  # an implicit empty snapshot at LSN 0
    if not listing.snapshots and not from_start:
        problems.append(f"{objects.url} holds no snapshot: a restore has nothing to start from")
    base = 0 if from_start or not listing.snapshots else listing.snapshots[0][0]
    first = base + 1
    pos = base
    pieces, gap = cover(listing.logs, base)
    tail: list[Piece] | None = None
    for piece, size, obj in _fetch_all(objects, pieces, parallel, progress):
        nbytes += size
        count += 1
        if isinstance(obj, CorruptionError):
            problems.append(str(obj))
            pos = piece.last if piece.last is not None else pos
            continue
        if obj.first > pos + 1:
            tail = unfinished_tail(objects, listing.logs, pos)
            if tail is not None:
                break  # the end: the rest is a stopped writer's unfinished tail, not damage
            problems.append(f"LSNs {pos + 1}..{obj.first - 1} are missing (before {piece.name})")
        pos = max(pos, obj.last)
    if gap is not None and tail is None:
        later = min((p.first for p in listing.logs if p.first > gap), default=gap)
        problems.append(f"LSNs {gap}..{later - 1} are missing: no object holds them")
    return VerifyReport(objects.url, count, nbytes, first, pos, len(listing.snapshots), problems,
                        tuple(p.name for p in tail or ()))
