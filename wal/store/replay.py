"""Replay of the log into the state when a store opens (open -> scan -> replay).

Records are decoded and collapsed to each key's last write in C, straight from the mapped
segments (`record.Collapser`): no Python object per record. One LMDB transaction per batch,
with `applied_lsn` in it (I1, I3); a batch ends when its last writes hold too many keys or
bytes, so memory stays flat however long the log is. A crash part-way leaves `applied_lsn`
at the last whole batch, and the next open replays from there (I4).

Why a thread. A store opened after a crash (or with a long unapplied log) pays for two
things: `Log.open` reading and checking every segment, bound by the disk when the files are
not cached, and the replay, bound by the CPU. They need not take turns: `Log.open` hands
over each sealed segment as soon as its scan has verified it (``on_sealed_segment``), and
this module replays it in a thread while the open goes on reading the next ones. Sealed
segments are durable -- each was fdatasynced before its successor was created -- so applying
them before the open has finished keeps I1. What is left after the open, the newest segment
(fdatasynced by the open), is replayed by the caller through `Log.read_spans`, continuing the
same batches.

If the open then fails (damage later in the log, under ``recovery="strict"``), the state
keeps the sealed segments' records it applied: they are a gap-free prefix of the log that
any later open, however it is repaired, replays the same way (I3, I4).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import Any

from wal.log import record
from wal.log.log import RecordSpan, SealedSegment
from wal.store.state import State

# A replay batch (one LMDB transaction) ends when its last writes hold this many keys or bytes.
BATCH_KEYS = 100_000
BATCH_BYTES = 32 << 20


class Replay:
    """One store open's replay: sealed segments from `Log.open` in a thread, then the rest.

    Use: pass `sealed` as Log.open's ``on_sealed_segment``; then `join` (or `abandon` when
    the open failed), `open_state`, the caller's checks, `feed` the remaining spans, `finish`.
    """

    def __init__(self, state_path: str, *, before_open: Callable[[], None] | None = None) -> None:
        """`before_open`: called once, right before the state is first opened (the store
        makes its STORE file current there)."""
        self._state_path = state_path
        self._before_open = before_open
        self.state: State | None = None
        self.next_lsn = 0  # the first LSN not yet fed to the collapser (set when the state opens)
        self.replayed = 0  # commits applied to the state
        self._collapser = record.Collapser()
        self._fed_durable = 0  # every LSN fed so far is durable up to here (the I1 bound of a batch)
        self._queue: queue.SimpleQueue[SealedSegment | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def open_state(self) -> State:
        """The store's state, opened once (by the replay thread, if a sealed segment came first)."""
        if self.state is None:
            if self._before_open is not None:
                self._before_open()
                self._before_open = None
            self.state = State(self._state_path)
            self.next_lsn = self.state.applied_lsn() + 1
        return self.state

    # ---- the sealed segments, during Log.open ----

    def sealed(self, segment: SealedSegment) -> None:
        """Log.open's on_sealed_segment: queue the segment for the replay thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"agentwal-replay:{self._state_path}",
                                            daemon=True)
            self._thread.start()
        self._queue.put(segment)

    def _run(self) -> None:
        while (segment := self._queue.get()) is not None:
            if self._error is not None:
                continue  # drain: the open goes on, and join reports the error
            try:
                self.open_state()
                if segment.last_lsn < self.next_lsn:
                    continue  # already in the state
                if segment.first_lsn > self.next_lsn:
                    # LSNs the state lacks are missing from the log (and so skipped by every later
                    # segment too, as next_lsn stays put): the caller's checks say so.
                    continue
                self.feed(segment.read_spans(self.next_lsn), durable=segment.last_lsn)
                self.next_lsn = segment.last_lsn + 1
            except BaseException as exc:  # reported by join, in the opening thread
                self._error = exc

    def join(self) -> None:
        """Wait for the sealed segments' replay; raises what it raised."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error

    def abandon(self) -> None:
        """The open failed: stop the thread and close what was opened (errors are the open's)."""
        try:
            self.join()
        except BaseException:  # the open's own error is the one to report
            pass
        finally:
            self._collapser.detach()
            if self.state is not None:
                self.state.close()
                self.state = None

    # ---- any spans, in LSN order ----

    def feed(self, spans: Generator[RecordSpan, None, Any], *, durable: int) -> None:
        """Replay spans that continue the ones fed before; `durable`: every LSN in them is
        durable in the log up to it. Applies a batch whenever one is full."""
        self._fed_durable = durable
        try:
            for span in spans:
                self._collapser.add(span)
                if self._collapser.keys >= BATCH_KEYS or self._collapser.held_bytes >= BATCH_BYTES:
                    self._apply()
        except BaseException:
            self._collapser.detach()  # before the spans' map goes away under its slots
            raise
        finally:
            spans.close()

    def finish(self) -> None:
        """Apply what was fed since the last batch."""
        self._apply()
        self._collapser.detach()

    def _apply(self) -> None:
        batch = self._collapser.take()
        if batch is None:
            return
        assert self.state is not None
        durable = self._fed_durable
        self.state.apply(batch, lambda: durable)
        self.replayed += batch[2]
