"""Which archive objects hold which LSNs: the plan a restore, a follower and `verify` work from.

Group objects (``log/<first>.wal``) carry only their first LSN in the name; their last is the
next object's first minus one (objects tile the LSN sequence). Merged objects name both ends.
While a merge is under way both the merged object and some of its group objects exist; the
plan takes, at each point, the object reaching furthest.
"""

from __future__ import annotations

from typing import NamedTuple

from wal.archive import layout
from wal.archive.objects import ObjectStore


class Piece(NamedTuple):
    name: str
    first: int
    last: int | None  # None: the newest group object, whose end only its header says
    size: int


class Listing(NamedTuple):
    logs: list[Piece]  # every log and merged object, by first LSN
    snapshots: list[tuple[int, str]]  # (lsn, name) in LSN order


def list_archive(objects: ObjectStore, *, after_lsn: int = 0) -> Listing:
    """Every archive object (log objects from `after_lsn`'s neighbourhood on: a follower's
    listing names only objects that may hold LSNs above what it has)."""
    raw: list[tuple[layout.Name, str, int]] = []
    start_log = layout.log_name(after_lsn) if after_lsn > 0 else None
    for prefix, start in ((layout.LOG_PREFIX, start_log), (layout.MERGED_PREFIX, None)):
        for name, size in objects.list(prefix, start):
            parsed = layout.parse_name(name)
            if parsed is None or parsed.kind == "snap":
                continue
            if parsed.kind == "merged" and parsed.last is not None and parsed.last <= after_lsn:
                continue
            raw.append((parsed, name, size))
    snapshots = []
    for name, _ in objects.list(layout.SNAP_PREFIX):
        parsed = layout.parse_name(name)
        if parsed is not None and parsed.kind == "snap":
            snapshots.append((parsed.first, name))
    firsts = sorted({p.first for p, _, _ in raw})
    pieces: list[Piece] = []
    for parsed, name, size in raw:
        last = parsed.last
        if last is None:
            later = [f for f in firsts if f > parsed.first]
            last = later[0] - 1 if later else None
        pieces.append(Piece(name, parsed.first, last, size))
    pieces.sort(key=lambda p: (p.first, -(p.last if p.last is not None else 1 << 63)))
    return Listing(pieces, sorted(snapshots))


def cover(pieces: list[Piece], after: int) -> tuple[list[Piece], int | None]:
    """The objects holding LSNs after+1.. in order, each reaching furthest; stops at a gap.
    Returns (pieces, first missing LSN or None if the cover runs to the newest object)."""
    out: list[Piece] = []
    pos = after
    while True:
        best: Piece | None = None
        for p in pieces:
            holds_next = p.first <= pos + 1 and (p.last is None or p.last > pos)
            if holds_next and (best is None or (best.last is not None and (p.last is None or p.last > best.last))):
                best = p
        if best is None:
            later = [p.first for p in pieces if p.first > pos + 1]
            return out, (pos + 1 if later else None)
        out.append(best)
        if best.last is None:
            return out, None
        pos = best.last


def unfinished_tail(objects: ObjectStore, pieces: list[Piece], pos: int) -> list[Piece] | None:
    """The objects past a gap at pos+1, if they are a writer's unfinished tail (FORMAT.md §18),
    else None (damage: refused). A tail is at most MAX_IN_FLIGHT - 1 group objects (merges only
    ever take stored, gap-free objects), each sent while the missing object was in flight: the
    j-th of them (from 1) was sent with at least j objects before it not yet stored (its
    `behind`). One object missing from a finished archive fails that test: the object after it
    was sent once everything before it was stored, or it would not have been stored either."""
    beyond = sorted((p for p in pieces if p.first > pos + 1), key=lambda p: p.first)
    if not beyond or len(beyond) > layout.MAX_IN_FLIGHT - 1 or any(
            not p.name.startswith(layout.LOG_PREFIX) for p in beyond):
        return None
    for j, piece in enumerate(beyond, 1):
        if layout.decode_log(objects.get(piece.name), piece.name).behind < j:
            return None
    return beyond


class End(NamedTuple):
    lsn: int | None  # the last LSN of the gap-free run of log objects (None: the archive holds none)
    last_object: layout.LogObject | None  # the object ending there, verified
    tail: list[Piece]  # group objects past a gap: a writer's unfinished tail (FORMAT.md §18)


def find_end(objects: ObjectStore, listing: Listing) -> End:
    """Where the archive's log ends. Its newest MAX_IN_FLIGHT group objects are read (their ends
    are only in their headers): a gap among them followed by a writer's unfinished tail
    (`unfinished_tail`) puts the end before the gap; any other gap is left to restore and
    `verify` to refuse, and the end is the newest object's."""
    if not listing.logs:
        return End(None, None, [])
    groups = sorted((p for p in listing.logs if p.name.startswith(layout.LOG_PREFIX)), key=lambda p: p.first)
    merged_end = max((p.last for p in listing.logs if p.name.startswith(layout.MERGED_PREFIX)
                      and p.last is not None), default=None)
    newest = [p for p in groups if merged_end is None or p.first > merged_end][-layout.MAX_IN_FLIGHT:]
    decoded = [layout.decode_log(objects.get(p.name), p.name) for p in newest]
    for i in range(1, len(decoded)):
        if decoded[i].first != decoded[i - 1].last + 1:
            tail = unfinished_tail(objects, listing.logs, decoded[i - 1].last)
            if tail is not None:
                return End(decoded[i - 1].last, decoded[i - 1], tail)
            break
    if decoded:
        return End(decoded[-1].last, decoded[-1], [])
    piece = max(listing.logs, key=lambda p: (p.last if p.last is not None else 1 << 63, p.first))
    obj = layout.decode_log(objects.get(piece.name), piece.name)
    return End(obj.last, obj, [])
