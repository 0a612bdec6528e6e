"""Which archive objects hold which LSNs: the chain a restore, a follower, `verify` and a
writer's open work from (FORMAT.md §18, "Chain").

Group objects (``log/<first>.wal``) carry only their first LSN in the name; until its header is
read, a group object's last LSN is taken to be the next object's first minus one (objects tile
the LSN sequence). Merged objects name both ends. While a merge is under way both the merged
object and some of its group objects exist; the chain takes, at each point, the object reaching
furthest.

Not every object belongs to the chain. A writer fenced while it had several PUTs in flight can
store the later ones after the fence, among its successor's objects: *strays*. Each was sent
with `behind >= 1` (an object of its writer before it was still in flight: the one the fence
took the name of), and the object before it in the chain is its successor's, not its writer's.
So a group object with `behind >= 1` continues the chain only after an object of its own
`writer_id`; `Chain` reads each object's header as it goes and passes over any that fails this.
A plan made from names alone (`cover`) is a guess that the chain corrects as headers are read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from wal.archive import layout
from wal.archive.objects import ObjectStore
from wal.errors import CorruptionError


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


def merged_holding(objects: ObjectStore, lsn: int) -> str | None:
    """The merged object holding `lsn`, if any: asked by a writer whose create-only PUT of
    ``log/<lsn>.wal`` -- the first object of a promoted follower's fence, or of any writer's
    session -- found the name free. Another writer that shipped `lsn` first, in an object of
    that name, and merged it away freed the name: the PUT then fences nothing, and the chain
    goes on through the merged object. A merge stores the merged object before deleting its
    group objects, and merged objects go only by retention (far behind), so a listing made after
    the PUT shows it."""
    for name, _ in objects.list(layout.MERGED_PREFIX):
        parsed = layout.parse_name(name)
        if parsed is not None and parsed.last is not None and parsed.first <= lsn <= parsed.last:
            return name
    return None


class Head(NamedTuple):
    """What a log object's header says that the chain needs."""
    first: int
    last: int
    writer_id: bytes
    behind: int


def head_of(obj: layout.LogObject) -> Head:
    return Head(obj.first, obj.last, obj.writer_id, obj.behind)


def is_group(piece: Piece) -> bool:
    return piece.name.startswith(layout.LOG_PREFIX)


def cover(pieces: list[Piece], after: int, *, heads: dict[str, Head] | None = None, writer: bytes | None = None,
          rejected: set[str] | frozenset[str] = frozenset(), start: bool = True) -> tuple[list[Piece], int | None]:
    """The objects holding LSNs after+1.. in chain order, each reaching furthest; stops at a gap.
    Returns (pieces, first LSN no candidate holds if objects lie past it, else None).

    `heads`: headers already read (their ends replace the guesses from names; a group object
    with `behind >= 1` whose writer is not that of the object before it is passed over);
    `writer`: the writer_id of the object ending at `after` (None: not known, nothing is
    passed over for it); `rejected`: names the chain has passed over; `start`: `after` is where
    the chain starts (a snapshot's LSN may fall inside an object), so an object starting at or
    before it may hold after+1. Past the start, a group object never does: chain positions are
    object boundaries, and a group object is never split by another object's boundary."""
    known = heads or {}
    out: list[Piece] = []
    pos = after
    while True:
        best: Piece | None = None
        best_end: int | None = None
        for p in pieces:
            if p.name in rejected:
                continue
            head = known.get(p.name)
            last = head.last if head is not None else p.last
            if p.first > pos + 1 or (last is not None and last <= pos):
                continue
            if is_group(p):
                if p.first <= pos and not start:
                    continue
                if head is not None and head.behind and writer is not None and head.writer_id != writer:
                    continue
            if best is None or (best_end is not None and (last is None or last > best_end)):
                best, best_end = p, last
        if best is None:
            later = any(p.first > pos for p in pieces)
            return out, (pos + 1 if later else None)
        out.append(best)
        if best_end is None:
            return out, None
        pos = best_end
        head = known.get(best.name)
        writer = head.writer_id if head is not None else None
        start = False


# Pieces downloaded and verified, in order: (piece, its size, the decoded object or the
# CorruptionError it gave). Restores verify in their download threads (wal/archive/restore.py).
Fetch = Callable[[list[Piece]], Iterator[tuple[Piece, int, "layout.LogObject | CorruptionError"]]]


def decoded(name: str, data: bytes | memoryview) -> layout.LogObject | CorruptionError:
    try:
        return layout.decode_log(data, name)
    except CorruptionError as exc:
        return exc


class WriterUnknownError(Exception):
    """A `Chain` made with ``strict=True`` and no writer met an object that continues the chain
    only after its own writer's (`behind >= 1`): the caller finds that writer and goes on."""


def fetch_serially(get: Callable[[str], bytes]) -> Fetch:
    """A `Fetch` reading one object after another through `get` (an ObjectStore's, or a cache
    in front of it)."""
    def fetch(pieces: list[Piece]) -> Iterator[tuple[Piece, int, layout.LogObject | CorruptionError]]:
        for piece in pieces:
            data = get(piece.name)
            yield piece, len(data), decoded(piece.name, data)
    return fetch


class Chain:
    """The chain of log objects from `after` on (module docstring; FORMAT.md §18, "Chain"):
    iterating yields each object that continues it, verified and decoded, in LSN order. It plans
    from names (`cover`), fetches the plan through `fetch` (restores download in parallel), and
    plans again from where it is whenever a header shows the plan was wrong: a group object
    reaching further than its name suggested, or one that does not continue the chain.

    `writer`: the writer_id of the object ending at `after` (a snapshot's writer, as the chain
    starting at a snapshot goes on with its writer's objects; b"": nothing before `after`; None:
    not known: nothing is passed over for its writer, or with `strict`, `WriterUnknownError` is
    raised where it matters). `upto`: no object starting past it is fetched. After iterating,
    `pos` is the chain's last LSN; a failed fetch or a damaged object
    raises out of the iteration with `pos` and `writer` where they were, so the caller may go on
    (`relist`, `skip`) by iterating again."""

    def __init__(self, objects: ObjectStore, pieces: list[Piece], after: int, writer: bytes | None, *,
                 fetch: Fetch | None = None, upto: int | None = None, strict: bool = False) -> None:
        self.objects = objects
        self.pieces = pieces
        self.pos = after
        self.writer = writer
        self.start = True
        self.upto = upto
        self.strict = strict
        self.heads: dict[str, Head] = {}
        self.rejected: set[str] = set()
        self.fetched = 0
        self.bytes = 0
        self.current: Piece | None = None  # the object being fetched or decoded
        self._fetch = fetch or fetch_serially(objects.get)

    def relist(self, pieces: list[Piece]) -> None:
        """Go on over a new listing (objects merged away or deleted meanwhile)."""
        self.pieces = pieces
        self.heads.clear()
        self.rejected.clear()

    def skip(self) -> bool:
        """Pass over the object that failed to decode (`verify` reports it and goes on), if its
        name says where it ends; its writer is then not known."""
        piece = self.current
        if piece is None or piece.last is None or piece.last <= self.pos:
            return False
        self.go_on_after(piece.last)
        self.rejected.add(piece.name)
        return True

    def go_on_after(self, lsn: int) -> None:
        """Go on from LSN `lsn` (past damage or a gap `verify` reports), its writer not known."""
        self.pos, self.writer, self.start = lsn, None, False

    def __iter__(self) -> Iterator[layout.LogObject]:
        while True:
            if self.upto is not None and self.pos >= self.upto:
                return
            plan, _ = cover(self.pieces, self.pos, heads=self.heads, writer=self.writer, rejected=self.rejected,
                            start=self.start)
            if self.upto is not None:
                plan = [p for p in plan if p.first <= self.upto]
            if not plan:
                return
            for piece, size, obj in self._fetch(plan):
                self.current = piece
                self.fetched += 1
                self.bytes += size
                if isinstance(obj, CorruptionError):
                    raise obj
                self.heads[piece.name] = head_of(obj)
                if not self._continues(piece, obj):
                    self.rejected.add(piece.name)
                    break
                self.pos, self.writer, self.start = obj.last, obj.writer_id, False
                yield obj
                if obj.last != piece.last:
                    break  # the plan guessed its end wrong: plan again from here
            self.current = None

    def _continues(self, piece: Piece, obj: layout.LogObject) -> bool:
        if obj.last <= self.pos or obj.first > self.pos + 1:
            return False
        if not is_group(piece):
            return True  # merged objects hold only their writer's gap-free run: always the chain
        if obj.first <= self.pos and not self.start:
            return False
        if obj.behind and self.writer is None and self.strict:
            raise WriterUnknownError(piece.name)
        return obj.behind == 0 or self.writer is None or obj.writer_id == self.writer


def beyond(pieces: list[Piece], pos: int) -> list[Piece]:
    """The objects starting past `pos` (the chain's end), in LSN order."""
    return sorted((p for p in pieces if p.first > pos), key=lambda p: p.first)


def unfinished_tail(objects: ObjectStore, pieces: list[Piece], pos: int, heads: dict[str, Head] | None = None,
                    cache: dict[tuple[str, int], Head] | None = None) -> list[Piece] | None:
    """The objects past the chain's end `pos`, if they are unfinished tails (FORMAT.md §18),
    else None (damage: refused). Each writer's objects there are at most MAX_IN_FLIGHT - 1 group
    objects (merges only ever take stored, gap-free objects), each sent while an object before
    it was in flight: the j-th of them (from 1) was sent with at least j objects before it not
    yet stored (its `behind`). That holds for a writer that stopped with PUTs in flight and for
    the strays of a fenced writer (its objects past the fence, the j-th of which had the fenced
    one and j - 1 more before it in flight). One object missing from a finished archive fails it
    where the objects after it are more than a writer ever has in flight, or the one right after
    it was sent once everything before it was stored (not where it was among the last objects a
    writer had in flight: FORMAT.md §18). Headers are read unless in `heads`; `cache`, keyed by
    (name, size), keeps those read for the next call (a follower's polls)."""
    past = beyond(pieces, pos)
    if not past or any(not is_group(p) for p in past):
        return None
    seen: dict[bytes, int] = {}
    for piece in past:
        head = (heads or {}).get(piece.name) or (cache or {}).get((piece.name, piece.size))
        if head is None:
            try:
                head = head_of(layout.decode_log(objects.get(piece.name), piece.name))
            except CorruptionError:
                return None
            if cache is not None:
                cache[(piece.name, piece.size)] = head
        j = seen[head.writer_id] = seen.get(head.writer_id, 0) + 1
        if j > layout.MAX_IN_FLIGHT - 1 or head.behind < j:
            return None
    return past


class End(NamedTuple):
    lsn: int | None  # the chain's last LSN (None: the archive holds no log object)
    last_object: layout.LogObject | None  # the object ending there, verified
    tail: list[Piece]  # objects past it: unfinished tails and strays (FORMAT.md §18)


def find_end(objects: ObjectStore, listing: Listing) -> End:
    """Where the archive's log ends: the chain from its newest object that needs no object
    before it (a group object sent with behind 0, or a merged one: the newest group objects
    are read back to the first such, else the newest merged object; else the chain from the
    newest snapshot). Objects past the chain's end that are unfinished tails or strays
    (`unfinished_tail`) are the end's tail; any other gap is left to restore and `verify` to
    refuse, and the end is the newest object's."""
    if not listing.logs:
        return End(None, None, [])
    groups = sorted((p for p in listing.logs if is_group(p)), key=lambda p: p.first)
    merged = [p for p in listing.logs if not is_group(p) and p.last is not None]
    merged_end = max((p.last for p in merged if p.last is not None), default=None)
    data: dict[str, bytes] = {}  # each object is downloaded once, whichever step reads it

    def get(name: str) -> bytes:
        if name not in data:
            data[name] = objects.get(name)
        return data[name]

    fetch = fetch_serially(get)

    anchor: layout.LogObject | None = None
    heads: dict[str, Head] = {}
    for piece in reversed(groups):
        if merged_end is not None and piece.first <= merged_end:
            break
        obj = layout.decode_log(get(piece.name), piece.name)
        heads[piece.name] = head_of(obj)
        if obj.behind == 0:
            anchor = obj
            break
    if anchor is None and merged:
        newest = max(merged, key=lambda p: (p.last or 0, -p.first))
        anchor = layout.decode_log(get(newest.name), newest.name)
    if anchor is not None:
        chain = Chain(objects, listing.logs, anchor.last, anchor.writer_id, fetch=fetch)
    elif listing.snapshots:
        lsn, name = listing.snapshots[-1]
        snap = layout.open_snapshot(objects.get_large(name), name)  # verified; its entries not copied out
        chain = Chain(objects, listing.logs, lsn, snap.writer_id, fetch=fetch)
    else:  # nothing anchors it (damage): the oldest object on
        chain = Chain(objects, listing.logs, groups[0].first - 1 if groups else 0, None, fetch=fetch)
    last = anchor
    for obj in chain:
        last = obj
    heads.update(chain.heads)
    if last is None:
        last = layout.decode_log(get(groups[-1].name), groups[-1].name) if groups else None
        return End(last.last if last is not None else None, last, [])
    past = beyond(listing.logs, last.last)
    if not past:
        return End(last.last, last, [])
    tail = unfinished_tail(objects, listing.logs, last.last, heads)
    if tail is not None:
        return End(last.last, last, tail)
    newest = max(listing.logs, key=lambda p: (p.last if p.last is not None else 1 << 63, p.first))
    obj = layout.decode_log(get(newest.name), newest.name)
    return End(obj.last, obj, [])
