"""The exceptions agentwal raises: one root, `WalError`, and a class per thing a caller can act on.

Messages say what happened, where, and what to do about it.
"""

from __future__ import annotations

import errno as _errno
import os as _os


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


class TargetNotHeldError(ArgumentError):
    """The archive does not hold a restore's target: an LSN past its end, or an LSN or a time
    before its oldest snapshot (retention removed what a restore to it needs). The arguments were
    sound; the archive cannot give what they name (`agentwal restore` exits 1, not 2)."""


class ArchiveLagError(WalError):
    """A commit was refused, and not made: the store's object archive lags past its bound
    (`archive_rpo_ms`, with `archive_policy="error"`). Retry once the archive has caught up."""


class FailedError(WalError):
    """The log stopped after an I/O or fsync failure (fail-stop, invariant I5).

    Nothing more is written until the store is reopened; reopening replays the log
    and recovers every acknowledged commit.
    """


class StorageError(WalError, OSError):
    """The operating system refused an operation on the store's files: a read-only filesystem
    (EROFS), no permission (EACCES/EPERM), no file descriptors left (EMFILE/ENFILE), a file
    deleted or replaced under the store (ENOENT/ESTALE), an I/O error outside an fsync. An
    `OSError` too: `errno` and `filename` say which. Nothing acknowledged is lost by it; what
    to do is in the message (free descriptors, fix the mount or the permissions, reopen)."""

    def __init__(self, message: str, *, errno: int | None = None, filename: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.strerror = message
        self.filename = filename

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NotFoundError(StorageError, FileNotFoundError):
    """A file or directory of the store is missing (ENOENT): never created, or deleted or moved
    under the store. A `FileNotFoundError` too."""


class NoSpaceError(StorageError):
    """A write failed for lack of disk space (ENOSPC/EDQUOT). The commit was not acknowledged;
    nothing acknowledged was lost, and the log stays open: its unwritten records are written
    again (they may still become durable) once space returns, so free space and retry."""

    def __init__(self, message: str, *, errno: int | None = _errno.ENOSPC, filename: str | None = None) -> None:
        super().__init__(message, errno=errno, filename=filename)


class ClosedError(WalError):
    """The log or store is closed."""


class ReadOnlyError(WalError):
    """A write was attempted through a read-only handle."""


def path_argument(path: object, what: str) -> str:
    """`path`, a caller's name of a file or directory (a str or os.PathLike), as a str;
    ArgumentTypeError for anything else (None, bytes, a number), ArgumentError for one holding a
    NUL byte, which no file name can (the OS call would raise a raw ValueError). `what` names
    it in the message ("the store's path", "the directory to restore into")."""
    if not isinstance(path, str | _os.PathLike):
        raise ArgumentTypeError(f"{what} must be a str or os.PathLike, not {type(path).__name__}")
    text = _os.fspath(path)
    if not isinstance(text, str):
        raise ArgumentTypeError(f"{what} must be a str or os.PathLike of a str, not {type(text).__name__}")
    if "\0" in text:
        raise ArgumentError(f"{what} {text!r} contains a NUL byte, which no file name can hold: pass the path "
                            "without it")
    return text


# What a caller can do about each operating-system error (StorageError's messages).
_ADVICE = {
    _errno.ENOSPC: "the filesystem is full: free space on it; nothing acknowledged was lost, and the store "
                   "goes on once space returns (commits refused meanwhile raise NoSpaceError)",
    _errno.EDQUOT: "the disk quota is used up: raise it or free space; nothing acknowledged was lost",
    _errno.EROFS: "the filesystem is mounted read-only: remount it read-write, or open the store with readonly=True",
    _errno.EACCES: "permission denied: give this process's user read and write access to the store's directory "
                   "(or open it with readonly=True where only reading is allowed)",
    _errno.EPERM: "operation not permitted: check the permissions and attributes of the store's files",
    _errno.EMFILE: "this process has no file descriptors left: close stores or files it no longer needs, or raise "
                   "its limit (ulimit -n, resource.setrlimit(RLIMIT_NOFILE))",
    _errno.ENFILE: "the system has no file descriptors left: close files, or raise fs.file-max",
    _errno.ENOENT: "a file or directory of the store is missing: it was deleted or moved while in use, or the path "
                   "is wrong; reopen the store (recovery checks what remains)",
    _errno.ESTALE: "a file of the store was replaced under it (stale handle): reopen the store",
    _errno.EIO: "the device reported an I/O error: check the disk (dmesg); reopening replays the log",
}


def no_descriptor_error(doing: str, detail: str, code: int) -> StorageError:
    """A commit the log could not write because no file descriptor was free to create its next
    segment with (EMFILE/ENFILE at a segment roll). Like a full disk, not a fail-stop: nothing
    was written, so nothing the kernel might have dropped; the commit was not acknowledged, and
    the log writes it (it may still become durable) once a descriptor is free."""
    message = (f"{doing}: {_os.strerror(code)}" + (f" ({detail})" if detail else "") +
               f"; {_ADVICE[code]}; the commit was not acknowledged, and the store goes on once a "
               "descriptor is free (no reopen)")
    return StorageError(message, errno=code)


def storage_error(exc: OSError, doing: str, advice: dict[int, str] | None = None) -> WalError:
    """The WalError for an OSError met while `doing` (e.g. "opening the store in /x"): itself if
    it already is one; NoSpaceError for ENOSPC/EDQUOT, NotFoundError for ENOENT, else
    StorageError -- each keeping errno and filename and saying what the caller can do (a
    store's caller; `advice`, by errno, in place of that for another one, a restore's)."""
    if isinstance(exc, WalError):
        return exc
    code = exc.errno
    if code is None and isinstance(exc, FileNotFoundError):  # raised with a message only
        code = _errno.ENOENT
    what = exc.strerror or str(exc)
    if code is not None and not exc.strerror:
        what = _os.strerror(code)
    where = f" ({exc.filename})" if exc.filename else ""
    said = (advice or {}).get(code or 0) or _ADVICE.get(code or 0)
    message = f"{doing}: {what}{where}" + (f"; {said}" if said else "")
    cls: type[StorageError] = StorageError
    if code in (_errno.ENOSPC, _errno.EDQUOT):
        cls = NoSpaceError
    elif code == _errno.ENOENT:
        cls = NotFoundError
    return cls(message, errno=code, filename=None if exc.filename is None else str(exc.filename))


class EncryptionKeyError(WalError):
    """An encrypted store, value or object needs a key this handle was not given (wal/crypto/).
    `key_id` names the key wanted (16 hex digits, or None when any key of the store would do);
    `where` names what could not be read. Nothing was returned in its place."""

    def __init__(self, message: str, *, key_id: str | None = None, where: str | None = None) -> None:
        super().__init__(message)
        self.key_id = key_id
        self.where = where


class MissingKeyError(EncryptionKeyError):
    """The store is encrypted and no key was given, or a value is sealed under a key id that
    none of the given keys has: pass ``encryption=`` with that key (or a provider that knows it)."""


class WrongKeyError(EncryptionKeyError):
    """None of the keys given is one the store's data is encrypted under (a mistyped or wrong
    key): nothing was written under it."""


class SealDamagedError(CorruptionError):
    """A sealed (encrypted or compressed) value, blob or object failed its authentication tag or
    does not parse: its bytes were changed after they were written. `path`/`lsn` and the
    message name where; the value is never returned."""
