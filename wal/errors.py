"""The exceptions agentwal raises: one root, `WalError`, and a class per thing a caller can act on.

Messages say what happened, where, and what to do about it.
"""

from __future__ import annotations


class WalError(Exception):
    """Root of every error agentwal raises on purpose."""


class ArgumentError(WalError, ValueError):
    """A bad argument value (wrong size, unknown level, ...); nothing was written."""


class ArgumentTypeError(WalError, TypeError):
    """An argument of the wrong type; nothing was written."""


class RecordTooLargeError(ArgumentError):
    """A payload, key or value over its documented limit; nothing was written."""


class CorruptionError(WalError):
    """Damage on disk that is not a torn tail; names the file, offset and LSN.

    Opening with ``recovery="truncate"`` opens at the last good record instead and
    reports the LSN range it gave up.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        lsn: int | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.lsn = lsn
        self.reason = reason


class FormatVersionError(WalError):
    """Files written by a newer or unknown format version; upgrade agentwal to read them."""


class LockedError(WalError):
    """Another writer (thread, process or forked child) holds this directory."""


class ConflictError(WalError):
    """An ``if_version`` check failed: the key changed since the caller read it."""

    def __init__(self, message: str, *, key: bytes, expected: int | None, actual: int | None,
                 conflicting_lsn: int | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.expected = expected
        self.actual = actual
        # The LSN of the commit that made the key what it is (a deletion's too). The store raises
        # the error only once that commit is acknowledged, so the caller's next read sees it.
        self.conflicting_lsn = conflicting_lsn


class FailedError(WalError):
    """The log stopped after an I/O or fsync failure (fail-stop, invariant I5).

    Nothing more is written until the store is reopened; reopening replays the log
    and recovers every acknowledged commit.
    """


class NoSpaceError(WalError, OSError):
    """A write failed for lack of disk space (ENOSPC/EDQUOT). The commit was not acknowledged;
    nothing acknowledged was lost, and the log stays open: its unwritten records are written
    again (they may still become durable) once space returns, so free space and retry."""


class ClosedError(WalError):
    """The log or store is closed."""


class ReadOnlyError(WalError):
    """A write was attempted through a read-only handle."""
