"""A snapshot object on its way to the archive, spooled to a file in the store's directory.

A writer ships a snapshot of its state (FORMAT.md §18) once the archive holds the log up to it,
which may be a while after it was taken. Encoded in memory, a state of several GB was held whole
(and twice, its parts and their join) for all that time. Spooled, it is written to
``archive-snapshot-<lsn>-<random>.tmp`` in the store's directory as the LMDB read transaction
yields it (`layout.write_snapshot`), then PUT from a read-only mapping of that file: the object
store's client reads the pages (obstore sends a buffer without copying it), which the kernel
may drop and read back at will, so the process holds no copy of its own. A sealed archive's
snapshot is written as its envelope (`Sealer.sealing`): encrypted as it is written where the
archive encrypts (under a session of its own), and never compressed, since its values are
envelopes already (compressed where that paid; ciphertext does not compress).

The file is the writer's alone (the store's lock); deleted once shipped or given up, and any left
by a process that died is deleted by the store's next writer open. It costs as much free disk
as the snapshot is large, on the store's own disk, which the log needs too: a snapshot is not
spooled while the disk lacks room for it and a margin (the shipper's `_snapshot_if_due`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterable, Iterator
from typing import BinaryIO, cast

from wal.archive import layout
from wal.crypto.sealing import CONTEXT_ARCHIVE, Sealer
from wal.store.store import ARCHIVE_SPOOL_PREFIX, ARCHIVE_SPOOL_SUFFIX


class SpooledSnapshot:
    """A snapshot object of the state at `lsn` (its header's), in a file of `size` bytes."""

    def __init__(self, directory: str, header: layout.SnapshotHeader, entries: Iterable[tuple[bytes, int, bytes]],
                 idem: Iterable[layout.IdemEntry] = (), sealer: Sealer | None = None) -> None:
        """sealer: a sealed archive's: the file then holds the object's envelope, encrypted as
        it is written if the archive encrypts (`sealed`)."""
        self.lsn = header.lsn
        self.taken_ms = header.taken_ms
        self.sealed = sealer is not None
        name = f"{ARCHIVE_SPOOL_PREFIX}{self.lsn:020d}-{os.urandom(4).hex()}{ARCHIVE_SPOOL_SUFFIX}"
        self.path = os.path.join(directory, name)
        try:
            with open(self.path, "xb") as out:
                if sealer is None:
                    self.size = layout.write_snapshot(out, header, entries, idem)
                else:
                    sealing = sealer.sealing(out, CONTEXT_ARCHIVE + layout.snap_name(self.lsn).encode())
                    self.size = layout.write_snapshot(cast(BinaryIO, sealing), header, entries, idem) + sealing.overhead
                    sealing.finish()
        except BaseException:
            self.discard()
            raise

    @contextlib.contextmanager
    def mapped(self) -> Iterator[memoryview]:
        """The object's bytes: a read-only mapping of the file, for one PUT."""
        with open(self.path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            view = memoryview(m)
            try:
                yield view
            finally:
                # A PUT that raised may leave views of the mapping alive in its traceback (the
                # exception the caller handles), and a store that keeps what it is given (obstore's
                # MemoryStore) holds the view itself: releasing or closing then would raise
                # BufferError in place of the PUT's outcome. The mapping then goes with the last
                # view (the file is read-only and only ever unlinked, so the bytes stay valid).
                with contextlib.suppress(BufferError):
                    view.release()
                    m.close()

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
