"""`agentwal tail`: follow a live log from the segment files, record by record, across segment rolls and damage.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from wal.errors import CorruptionError
from wal.ops.segments import (
    HEADER_SIZE,
    RECORD_HEADER_SIZE,
    LogRecord,
    Skip,
    _close_segments,
    _first_lsn_of,
    _mapped,
    _open_segments,
    _scan_view,
    _Seg,
    _view_records,
)

# ---- tail -f -------------------------------------------------------------------------------------------


class Follower:
    """Follows a log read-only as a writer appends to it: `poll()` returns the records new since the last call.

    Keeps (segment, offset, next LSN) and scans only the bytes after the offset each time. A
    record the writer is still copying in looks torn: the follower waits at it. When the
    segment it follows is sealed it moves to the next. Segments are opened as soon as they
    are seen, so a checkpoint of the writer cannot remove one before the follower read it;
    only if the follower starts (or falls) behind the oldest segment does it jump ahead, and
    it reports the LSNs it missed through `on_skip`. Call `close()` when done.
    """

    def __init__(self, log_dir: str, start_lsn: int, on_skip: Callable[[Skip], None] | None = None) -> None:
        self.log_dir = log_dir
        self.next_lsn = start_lsn
        self.on_skip = on_skip or (lambda s: None)
        self._segs: dict[int, _Seg] = {}
        self._current: _Seg | None = None
        self._pos = HEADER_SIZE
        self._base_lsn: int | None = None  # the LSN expected at _pos (None: the segment's own first LSN)
        self._stuck: tuple[int, int, str] | None = None
        self._stuck_since = 0.0

    def _refresh(self) -> None:
        after = max(self._segs) if self._segs else -1
        for seg in _open_segments(self.log_dir, after):
            self._segs[seg.number] = seg

    def _drop_before(self, number: int) -> None:
        for n in [n for n in self._segs if n < number]:
            _close_segments([self._segs.pop(n)])

    def _locate(self) -> bool:
        """Find the segment holding next_lsn (or the first after it); False if there is none yet."""
        chosen: tuple[_Seg, int] | None = None
        for number in sorted(self._segs):
            first = _first_lsn_of(self._segs[number])
            if first is None:
                continue
            if first <= self.next_lsn or chosen is None:
                chosen = (self._segs[number], first)
            if first > self.next_lsn:
                break
        if chosen is None:
            return False
        seg, first = chosen
        if first > self.next_lsn:
            self.on_skip(Skip(seg.path, 0, 0, "records before this segment were removed by a checkpoint "
                                              "before they could be read", (self.next_lsn, first - 1)))
            self.next_lsn = first
        self._drop_before(seg.number)
        self._current, self._pos, self._base_lsn = seg, HEADER_SIZE, None
        return True

    def poll(self) -> list[LogRecord]:
        """The records written since the last poll (an empty list when there are none yet)."""
        out: list[LogRecord] = []
        self._refresh()
        for _ in range(1 << 16):  # segments crossed in one poll
            if self._current is None and not self._locate():
                return out
            seg = self._current
            assert seg is not None
            with _mapped(seg) as buf:
                view = _scan_view(buf, None, self._pos, self._base_lsn, settle=True)
                if not view.res.header_ok:
                    raise CorruptionError(f"{view.reason} in the segment header of {seg.path}", path=seg.path,
                                          offset=0, reason=view.reason)
                for lsn, off, payload in _view_records(view, self.next_lsn, None):
                    out.append(LogRecord(lsn, payload, seg.path, off))
                    self.next_lsn = lsn + 1
                status, reason = view.status, view.reason
                end, last = view.real(view.res.end_offset), int(view.res.last_lsn)
            if status == "sealed":
                nxt = self._segs.get(seg.number + 1)
                if nxt is None:
                    self._refresh()
                    nxt = self._segs.get(seg.number + 1)
                if nxt is None and not any(n > seg.number for n in self._segs):
                    # The next segment is not created yet: wait at the seal.
                    self._pos, self._base_lsn = end - RECORD_HEADER_SIZE, last + 1
                    return out
                if nxt is None:
                    # The next segment was removed (a checkpoint) before we saw it: this one is done;
                    # relocate among the later ones, reporting the LSNs that went with it.
                    self._drop_before(seg.number + 1)
                    self._current = None
                    continue
                self._drop_before(nxt.number)
                self._current, self._pos, self._base_lsn = nxt, HEADER_SIZE, None
                continue
            self._pos, self._base_lsn = end, last + 1
            if status != "corrupt":
                self._stuck = None
            else:
                # Damage that stays put for a few seconds is not a write in progress.
                key = (seg.number, end, reason)
                if self._stuck != key:
                    self._stuck, self._stuck_since = key, time.monotonic()
                elif time.monotonic() - self._stuck_since > 5:
                    raise CorruptionError(f"log damaged: {reason} in {seg.path} at offset {end} (after LSN {last})",
                                          path=seg.path, offset=end, lsn=last + 1, reason=reason)
            return out
        return out

    @property
    def at_damage(self) -> bool:
        """Whether the last poll stopped at bytes that do not read as a record although a valid
        one follows: damage, or a write in progress; `poll` raises CorruptionError once it has
        stayed put for 5 s."""
        return self._stuck is not None

    def close(self) -> None:
        _close_segments(list(self._segs.values()))
        self._segs.clear()
        self._current = None
