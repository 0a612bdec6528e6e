"""agentwal: an embedded write-ahead-log storage engine for AI-agent runtimes.

`wal.Log` is the bare segmented log (C core, CRC-32C framing, group commit,
durability as an RPO target). See README.md for the tour and FORMAT.md for
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
    ReadOnlyError,
    RecordTooLargeError,
    WalError,
)
from wal.log import Log, LogWatermarks, RecoveryReport

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "ClosedError",
    "ConflictError",
    "CorruptionError",
    "FailedError",
    "FormatVersionError",
    "Log",
    "LockedError",
    "LogWatermarks",
    "ReadOnlyError",
    "RecordTooLargeError",
    "RecoveryReport",
    "WalError",
]
