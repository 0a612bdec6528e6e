"""agentwal: an embedded write-ahead-log storage engine for AI-agent runtimes.

`wal.open(path)` opens a `wal.Store`: a key-value store whose commits go through a
write-ahead log (C core, CRC-32C framing, group commit, durability as an RPO target)
into an LMDB materialized state. `wal.Log` is the bare segmented log. See README.md for the tour and FORMAT.md for
every byte on disk.
"""

from wal.errors import (
    ArgumentError,
    ArgumentTypeError,
    ClosedError,
    ConflictError,
    CorruptionError,
    FailedError,
    FormatVersionError,
    LockedError,
    NoSpaceError,
    ReadOnlyError,
    RecordTooLargeError,
    WalError,
)
from wal.log import Log, LogWatermarks, RecoveryReport
from wal.snapshot import Snapshot
from wal.state import StateError
from wal.store import Store, Transaction, Watermarks
from wal.store import open_store as open


def restore(url: object, directory: object, *, lsn: int | None = None, time: object = None,
            parallel: int = 16, progress: object = None) -> object:
    """Point-in-time restore of an archive into a new store (wal/archive/restore.py)."""
    from wal.archive.restore import restore as _restore  # noqa: PLC0415 -- wal.archive loads on use

    return _restore(url, directory, lsn=lsn, time=time, parallel=parallel, progress=progress)  # type: ignore[arg-type]


def follow(url: object, directory: object, **options: object) -> object:
    """A read-only follower of an archive that can be promoted to its writer (wal/archive/follow.py)."""
    from wal.archive.follow import follow as _follow  # noqa: PLC0415

    return _follow(url, directory, **options)  # type: ignore[arg-type]


__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "ClosedError",
    "ConflictError",
    "CorruptionError",
    "FailedError",
    "FormatVersionError",
    "LockedError",
    "Log",
    "LogWatermarks",
    "NoSpaceError",
    "ReadOnlyError",
    "RecordTooLargeError",
    "RecoveryReport",
    "Snapshot",
    "StateError",
    "Store",
    "Transaction",
    "WalError",
    "Watermarks",
    "follow",
    "open",
    "restore",
]
