"""agentwal: an embedded write-ahead-log storage engine for AI-agent runtimes.

`wal.open(path)` opens a `wal.Store`: a key-value store whose commits go through a
write-ahead log (C core, CRC-32C framing, group commit, durability as an RPO target)
into an LMDB materialized state. `wal.Log` is the bare segmented log. See README.md for the tour and FORMAT.md for
every byte on disk.
"""

# The object archive (wal/archive/). Its modules use `wal.open` only when called, so this order is safe.
from wal._open import open_store as open
from wal.archive.follow import Follower, follow
from wal.archive.objects import ArchiveError, ArchiveUnavailableError
from wal.archive.restore import RestoreReport, restore
from wal.errors import (
    ArchiveLagError,
    ArgumentError,
    ArgumentTypeError,
    ClosedError,
    ConflictError,
    CorruptionError,
    EncryptionKeyError,
    FailedError,
    FormatVersionError,
    LockedError,
    MissingKeyError,
    NoSpaceError,
    NotFoundError,
    ReadOnlyError,
    RecordTooLargeError,
    SealDamagedError,
    StorageError,
    TargetNotHeldError,
    WalError,
    WrongKeyError,
)
from wal.log.log import Log, LogWatermarks, RecoveryReport
from wal.store.snapshot import Snapshot
from wal.store.state import ReadersFullError, StateError
from wal.store.store import Store, Transaction, Watermarks

__version__ = "0.1.0"  # the one place it is written: pyproject.toml and `agentwal --version` read it

__all__ = [
    "ArchiveError",
    "ArchiveLagError",
    "ArchiveUnavailableError",
    "ArgumentError",
    "ArgumentTypeError",
    "ClosedError",
    "ConflictError",
    "CorruptionError",
    "EncryptionKeyError",
    "FailedError",
    "Follower",
    "FormatVersionError",
    "LockedError",
    "Log",
    "LogWatermarks",
    "MissingKeyError",
    "NoSpaceError",
    "NotFoundError",
    "ReadOnlyError",
    "ReadersFullError",
    "RecordTooLargeError",
    "RecoveryReport",
    "RestoreReport",
    "SealDamagedError",
    "Snapshot",
    "StateError",
    "StorageError",
    "Store",
    "TargetNotHeldError",
    "Transaction",
    "WalError",
    "Watermarks",
    "WrongKeyError",
    "follow",
    "open",
    "restore",
]
