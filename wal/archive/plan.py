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
