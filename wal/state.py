"""The materialized state: an LMDB environment holding the effect of the log up to `applied_lsn`.

Why LMDB cannot be corrupted by a power cut, and how its lost transaction comes back
-------------------------------------------------------------------------------------
LMDB is copy-on-write: a commit writes new pages, then flips one of two meta pages to
point at the new root. We open it with ``sync=True, metasync=False`` (MDB_NOMETASYNC):
the data pages are fsynced at every commit, the meta page is not. A power cut can
therefore lose the meta-page flip of the last commit(s), and LMDB reopens at the
previous meta page -- an older, complete, consistent tree. It never sees a half-written
tree, because the pages an older meta points at are never overwritten while it is the
newest durable one. We never use MDB_NOSYNC / MDB_MAPASYNC / MDB_WRITEMAP, which can
leave a meta page pointing at unwritten pages after a crash.

What the lost commit(s) held comes back from the log: `applied_lsn` is stored in the
same LMDB transaction as the state it describes, so the state that survives says
exactly which LSN it reflects, and recovery replays the log from `applied_lsn + 1`.
A checkpoint forces the meta page to disk (a forced ``mdb_env_sync``) before any log segment
is deleted, so the log always still holds everything after the durable `applied_lsn`.

Invariant I1 (log before state) is enforced in `State.apply`: a batch is committed
only if its last LSN is durable in the log, checked right before the LMDB commit.

Where LMDB comes from, and why our own binding
----------------------------------------------
Every LMDB call of the package goes through ``wal._lmdbcall`` (native/lmdbcall.c), a thin
binding of LMDB 0.9's C API. The library is the one py-lmdb (the ``lmdb`` package) links
into its extension: py-lmdb 3.x exports it as ``mdb09_*``, 1.4.x as ``mdb_*``; `_load_lmdb`
resolves those symbols from the already-loaded file at import and checks the engine is
0.9.x, the format py-lmdb opens by default, so other processes reading our state with
py-lmdb see the same file and lock-file layout. Why not py-lmdb itself: its ``putmulti``
releases and re-takes the GIL around every item, so with a thread committing in a loop the
materializer could not apply anything; `State.apply` is now one C call that does the whole
LMDB transaction with the GIL released. And why not py-lmdb beside it: LMDB forbids opening
one environment twice in a process (its fcntl locks are per process) and py-lmdb does not
expose its handles, so nothing in ``wal/`` opens LMDB through py-lmdb.

Databases: ``data`` (key -> u64 version LE + value), ``idem`` (idempotency key ->
u64 LSN + u64 commit time ms), ``meta`` (``applied_lsn``, ``store_format``).

Errors. Every LMDB error leaves this module as a `wal.WalError` (found by the corruption
matrix, tests/test_corruption_matrix.py, which flips bytes of ``data.mdb``), classified by
LMDB's int code (`_raise_lmdb`): damage LMDB
detects (bad magic or version, a page that is not found, a database with impossible flags)
is `CorruptionError` naming ``data.mdb``; anything else LMDB reports (disk error, map full,
too many readers) is `StateError`. LMDB keeps no checksums, so damage it does not detect is
neither: see the known limitations in that test.
"""

from __future__ import annotations

import errno
import importlib
import importlib.metadata
import os
import struct
from collections.abc import Callable, Iterator
from typing import NoReturn

from wal import _lmdbcall, record
from wal._lmdbcall import DATA, IDEM, META, LmdbError
from wal.errors import ClosedError, CorruptionError, LockedError, WalError

_U64 = struct.Struct("<Q")
_IDEM = struct.Struct("<QQ")
APPLIED_KEY = b"applied_lsn"
# The log's durable LSN as seen at the last apply: a log that later ends below it lost durable
# records (a zeroed or cut tail looks like unwritten space; this mark makes the loss visible).
DURABLE_SEEN_KEY = b"durable_seen"
DEFAULT_MAP_SIZE = 1 << 40  # address space only: the file grows with the data
_SCAN_CHUNK = 1024  # keys per call of a snapshot's walk

# The py-lmdb releases checked to carry LMDB 0.9 under names `_lmdbcall.load` resolves (pyproject.toml).
LMDB_PACKAGE_RANGE = ">=1.4.1,<4"


def _load_lmdb(library: str, installed: str) -> str:
    """Bind `wal._lmdbcall` to the LMDB 0.9 in `library` (a file already loaded in this process);
    returns LMDB's version string. ImportError naming the installed `lmdb` package if the file
    does not export LMDB 0.9's functions or holds another LMDB version."""
    try:
        return _lmdbcall.load(library)
    except ImportError as exc:
        raise ImportError(
            f"agentwal needs LMDB 0.9 from the `lmdb` package (py-lmdb {LMDB_PACKAGE_RANGE}), whose extension "
            f"exports it as mdb09_* (py-lmdb 3.x) or mdb_* (1.4.x); the installed lmdb {installed} does not: {exc}. "
            f"Install a supported release: pip install 'lmdb{LMDB_PACKAGE_RANGE}'"
        ) from exc


def _lmdb_library() -> tuple[str, str]:
    """(path of py-lmdb's compiled extension, installed `lmdb` version), importing it so that it is
    loaded: the binding takes LMDB from that loaded file, never a second copy."""
    try:
        installed = importlib.metadata.version("lmdb")
    except importlib.metadata.PackageNotFoundError:
        installed = "(not installed)"
    try:
        extension = importlib.import_module("lmdb.cpython")
    except ImportError as exc:
        raise ImportError(f"agentwal needs the `lmdb` package (py-lmdb {LMDB_PACKAGE_RANGE}) with its compiled "
                          f"extension lmdb.cpython; installed lmdb {installed}: {exc}") from exc
    return str(extension.__file__), installed


LMDB_VERSION = _load_lmdb(*_lmdb_library())


class InvariantError(WalError):
    """An internal invariant would be broken; the operation was refused."""


class StateError(WalError):
    """LMDB failed for a reason other than damage (disk error, map full, too many readers...)."""


# LMDB's codes for a file that is not what it wrote: corruption, not a failure to retry. EINVAL
# is LMDB's answer to impossible parameters read from the file; E_BAD_VALUE is a stored value of
# the wrong size (applied_lsn, an idempotency entry), found by the binding.
_DAMAGE = frozenset({_lmdbcall.MDB_CORRUPTED, _lmdbcall.MDB_PAGE_NOTFOUND, _lmdbcall.MDB_INVALID,
                     _lmdbcall.MDB_VERSION_MISMATCH, _lmdbcall.MDB_INCOMPATIBLE, _lmdbcall.MDB_BAD_DBI,
                     _lmdbcall.MDB_PANIC, _lmdbcall.MDB_BAD_VALSIZE, errno.EINVAL, _lmdbcall.E_BAD_VALUE})

# Operating-system errors LMDB passes on (its positive codes are errno values): not damage.
_OS_ERRORS = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                        errno.EMFILE, errno.ENFILE, errno.EIO, errno.ENOMEM, errno.EAGAIN, errno.EBUSY,
                        errno.ENOTDIR})

# Failures while opening that are about resources, not the file: classified as at any other time.
_OPEN_RESOURCE = frozenset({errno.EAGAIN, errno.ENOMEM, errno.ENOSPC, _lmdbcall.MDB_READERS_FULL,
                            _lmdbcall.MDB_MAP_FULL})


def _raise_lmdb(exc: LmdbError | struct.error, path: str, doing: str, *, opening: bool = False) -> NoReturn:
    """Re-raise an LMDB error (or a stored value of the wrong size) as a WalError that says what to do.
    On open every error but an operating-system one is damage: the same call succeeds on any file
    LMDB wrote. Any other LMDB code (map full, too many readers, ...) is StateError, and an errno
    LMDB has no business returning for a sound file is damage."""
    data = os.path.join(path, "data.mdb")
    code: int | None = exc.args[0] if isinstance(exc, LmdbError) else None
    text = exc.args[1] if isinstance(exc, LmdbError) else str(exc)
    if code == _lmdbcall.E_CLOSED:
        raise ClosedError(f"the LMDB state in {path} is closed (while {doing})") from exc
    if code == _lmdbcall.E_FORKED:
        raise LockedError(f"the LMDB state in {path} was opened by another process (this is a forked child); "
                          "open the store again in this process") from exc
    if code in _OS_ERRORS:
        raise StateError(f"the LMDB state in {path} failed while {doing}: {text}") from exc
    if opening or code is None or code in _DAMAGE or code > 0:
        raise CorruptionError(
            f"the LMDB state {data} is damaged ({text}) -- found while {doing}. LMDB keeps no checksums, so this "
            "is damage to the file (disk, copy or edit), not a crash. The state is derived from the log: if the "
            "log still holds every commit from LSN 1 (no checkpoint removed a segment), move state/ aside and "
            "reopen to rebuild it; otherwise restore the store from a backup.",
            path=data, reason="state damaged",
        ) from exc
    raise StateError(f"the LMDB state in {path} failed while {doing}: {text}") from exc


def _versioned(path: str, key: bytes, raw: bytes) -> tuple[int, bytes]:
    """A data value (FORMAT.md §16: u64 version LE + value) split; CorruptionError if it is short."""
    if len(raw) < _U64.size or not key:  # the store never writes an empty key
        raise CorruptionError(
            f"the LMDB state in {path} holds " + (f"key {key!r} without its 8-byte version" if key else "an empty key"),
            path=os.path.join(path, "data.mdb"), reason="state damaged")
    return _U64.unpack_from(raw)[0], raw[8:]


def _applied(path: str, raw: bytes | None) -> int:
    if raw is not None and len(raw) != _U64.size:
        raise CorruptionError(f"the LMDB state in {path} holds an applied_lsn of {len(raw)} bytes, not 8",
                              path=os.path.join(path, "data.mdb"), reason="state damaged")
    return _U64.unpack(raw)[0] if raw else 0


class State:
    def __init__(self, path: str, *, readonly: bool = False, map_size: int = DEFAULT_MAP_SIZE) -> None:
        if not readonly:
            os.makedirs(path, exist_ok=True)
        self.path = path
        self.readonly = readonly
        try:
            # Flags as py-lmdb was asked before (native/lmdbcall.c): subdir, sync=True with
            # metasync=False, no MAPASYNC/WRITEMAP, NOTLS, no readahead; max_dbs=4.
            self._env = _lmdbcall.Env(path, readonly, map_size)
        except LmdbError as exc:
            if exc.args[0] == _lmdbcall.E_ALREADY_OPEN:
                # One handle per environment and process (two would break LMDB's per-process locks).
                raise LockedError(
                    f"the state in {path} is already open in this process (LMDB allows one handle per process); "
                    "read through the Store already open, or open it read-only from another process"
                ) from exc
            _raise_lmdb(exc, path, "opening it", opening=exc.args[0] not in _OPEN_RESOURCE)

    # ---- reads (any thread; the environment is opened with MDB_NOTLS) ----

    def applied_lsn(self) -> int:
        try:
            raw = self._env.get(META, APPLIED_KEY)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "reading applied_lsn")
        return _applied(self.path, raw)

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        try:
            raw = self._env.get(DATA, key)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "reading a key")
        return None if raw is None else _versioned(self.path, key, raw)

    def scan_chunk(self, prefix: bytes, after: bytes | None, limit: int) -> list[tuple[bytes, int, bytes]]:
        """Up to `limit` (key, version, value) with `prefix`, in key order, keys > `after`."""
        try:
            chunk = self._env.scan(DATA, prefix, after, limit)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "scanning keys")
        return [(key, *_versioned(self.path, key, raw)) for key, raw in chunk]

    def idempotency(self, key: bytes) -> tuple[int, int] | None:
        try:
            raw = self._env.get(IDEM, key)
            if raw is None:
                return None
            lsn, time_ms = _IDEM.unpack(raw)
        except (LmdbError, struct.error) as exc:
            _raise_lmdb(exc, self.path, "reading an idempotency key")
        return lsn, time_ms

    def meta_get(self, key: bytes) -> bytes | None:
        try:
            return self._env.get(META, key)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "reading its metadata")

    def meta_put(self, key: bytes, value: bytes) -> None:
        try:
            self._env.put(META, key, value)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "writing its metadata")

    def snapshot(self) -> StateSnapshot:
        """One read transaction over the whole state (a consistent view at its applied LSN)."""
        return StateSnapshot(self)

    # ---- the one writer ----

    def apply(self, batch: record.Collapsed, durable_lsn: Callable[[], int]) -> int:
        """Apply a collapsed batch of consecutive commits (`record.collapse`, `Core.take`) in ONE
        LMDB transaction, with `applied_lsn`. A batch wholly at or below applied_lsn is already
        in the state (a replay after a crash mid-apply, I4) and changes nothing.

        LMDB's fsync is paid once per batch, never per commit. Returns the new applied LSN.

        The whole transaction is one C call with the GIL released (native/lmdbcall.c `apply`),
        which reads `durable_lsn` right before the commit: in C if it is the store's
        `DurableLsn`, else by taking the GIL back to call it. The call pins the batch's items
        (a tuple of each list) before it lets the GIL go.
        """
        first, last, commits = batch[0], batch[1], batch[2]
        try:
            status, lsn = self._env.apply(batch, durable_lsn)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "applying log records to it")
        # I3: the batch is the commits applied+1..last, every one of them (checked in C, in the txn).
        if status == _lmdbcall.APPLY_GAP:
            raise InvariantError(f"apply of {commits} commit(s) LSN {first}..{last} after applied LSN "
                                 f"{lsn}: a gap (I3)")
        # I1 log before state: never commit the effect of a record the log could still lose
        # (checked in C with the durable LSN read right before the commit; nothing was committed).
        if status == _lmdbcall.APPLY_NOT_DURABLE:
            raise InvariantError(f"I1 violated: would store applied_lsn {last} > durable_lsn {lsn}")
        return lsn

    def durable_seen(self) -> int:
        """The log's durable LSN when the state was last applied to (0 if never recorded)."""
        raw = self.meta_get(DURABLE_SEEN_KEY)
        return _U64.unpack(raw)[0] if raw is not None and len(raw) == _U64.size else 0

    def expire_idempotency(self, older_than_ms: int) -> int:
        """Forget idempotency keys of commits older than `older_than_ms` (wall clock)."""
        try:
            return self._env.expire_idempotency(max(older_than_ms, 0))
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "expiring idempotency keys")

    def sync(self) -> None:
        """Make the last commit durable, meta page included (checkpoints need this)."""
        try:
            self._env.sync(True)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "syncing it")

    def stat(self) -> dict[str, int]:
        try:
            entries, psize, last_pgno = self._env.stat()
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "reading its statistics")
        return {"state_keys": entries, "state_map_bytes_used": (last_pgno + 1) * psize}

    def close(self) -> None:
        """Idempotent. Aborts any snapshot still open (it then raises ClosedError)."""
        try:
            self._env.close()
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "closing it")


class StateSnapshot:
    """One LMDB read transaction of a state: every read sees the same commit. LMDB readers
    never block its writer, but a snapshot kept open pins the pages of its commit: close it."""

    def __init__(self, state: State) -> None:
        self.path = state.path
        try:
            self._txn = state._env.begin()
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "beginning a read transaction")

    def applied_lsn(self) -> int:
        try:
            raw = self._txn.get(META, APPLIED_KEY)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "reading applied_lsn")
        return _applied(self.path, raw)

    def renew(self) -> None:
        """Move to the newest commit."""
        try:
            self._txn.renew()
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "renewing a read transaction")

    def entries(self) -> int:
        try:
            return self._txn.entries(DATA)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "counting its keys")

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        try:
            raw = self._txn.get(DATA, key)
        except LmdbError as exc:
            _raise_lmdb(exc, self.path, "reading a key")
        return None if raw is None else _versioned(self.path, key, raw)

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, int, bytes]]:
        """(key, version, value) with `prefix`, in key order."""
        after: bytes | None = None
        while True:
            try:
                chunk = self._txn.scan(DATA, prefix, after, _SCAN_CHUNK)
            except LmdbError as exc:
                _raise_lmdb(exc, self.path, "scanning keys")
            for key, raw in chunk:
                yield (key, *_versioned(self.path, key, raw))
            if len(chunk) < _SCAN_CHUNK:
                return
            after = chunk[-1][0]

    def close(self) -> None:
        """Idempotent."""
        self._txn.abort()
