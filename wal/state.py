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
A checkpoint forces the meta page to disk (``env.sync(True)``) before any log segment
is deleted, so the log always still holds everything after the durable `applied_lsn`.

Invariant I1 (log before state) is enforced in `State.apply`: a batch is committed
only if its last LSN is durable in the log, checked right before the LMDB commit.

Databases: ``data`` (key -> u64 version LE + value), ``idem`` (idempotency key ->
u64 LSN + u64 commit time ms), ``meta`` (``applied_lsn``, ``store_format``).

Errors. Every LMDB error leaves this module as a `wal.WalError` (found by the corruption
matrix, tests/test_corruption_matrix.py, which flips bytes of ``data.mdb``): damage LMDB
detects (bad magic or version, a page that is not found, a database with impossible flags)
is `CorruptionError` naming ``data.mdb``; anything else LMDB reports (disk error, map full,
too many readers) is `StateError`. LMDB keeps no checksums, so damage it does not detect is
neither: see the known limitations in that test.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable
from typing import NoReturn

import lmdb

from wal import record
from wal.errors import CorruptionError, LockedError, WalError

_U64 = struct.Struct("<Q")
_IDEM = struct.Struct("<QQ")
APPLIED_KEY = b"applied_lsn"
# The log's durable LSN as seen at the last apply: a log that later ends below it lost durable
# records (a zeroed or cut tail looks like unwritten space; this mark makes the loss visible).
DURABLE_SEEN_KEY = b"durable_seen"
DEFAULT_MAP_SIZE = 1 << 40  # address space only: the file grows with the data


class InvariantError(WalError):
    """An internal invariant would be broken; the operation was refused."""


class StateError(WalError):
    """LMDB failed for a reason other than damage (disk error, map full, too many readers...)."""


# What LMDB raises when the file is not what it wrote: corruption, not a failure to retry.
_DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.VersionMismatchError,
           lmdb.IncompatibleError, lmdb.BadDbiError, lmdb.PanicError, lmdb.BadValsizeError, lmdb.InvalidParameterError)


# py-lmdb reports an operating-system error as a bare lmdb.Error ending in strerror(): not damage.
_OS_ERRORS = tuple(os.strerror(e) for e in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC,
                                             errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.EIO, errno.ENOMEM,
                                             errno.EAGAIN, errno.EBUSY, errno.ENOTDIR))


def _raise_lmdb(exc: lmdb.Error | struct.error, path: str, doing: str, *, opening: bool = False) -> NoReturn:
    """Re-raise an LMDB error (or a stored value of the wrong size) as a WalError that says what to do.
    On open every error but an operating-system one is damage: the same call succeeds on any file
    LMDB wrote."""
    data = os.path.join(path, "data.mdb")
    if isinstance(exc, lmdb.Error) and str(exc).endswith(_OS_ERRORS):
        raise StateError(f"the LMDB state in {path} failed while {doing}: {exc}") from exc
    if opening or isinstance(exc, (*_DAMAGE, struct.error)) or type(exc) is lmdb.Error:
        raise CorruptionError(
            f"the LMDB state {data} is damaged ({exc}) -- found while {doing}. LMDB keeps no checksums, so this "
            "is damage to the file (disk, copy or edit), not a crash. The state is derived from the log: if the "
            "log still holds every commit from LSN 1 (no checkpoint removed a segment), move state/ aside and "
            "reopen to rebuild it; otherwise restore the store from a backup.",
            path=data, reason="state damaged",
        ) from exc
    raise StateError(f"the LMDB state in {path} failed while {doing}: {exc}") from exc


class State:
    def __init__(self, path: str, *, readonly: bool = False, map_size: int = DEFAULT_MAP_SIZE) -> None:
        if not readonly:
            os.makedirs(path, exist_ok=True)
        self.path = path
        self.readonly = readonly
        try:
            self.env = lmdb.open(
                path, map_size=map_size, subdir=True, readonly=readonly, metasync=False, sync=True,
                map_async=False, writemap=False, max_dbs=4, lock=True, create=not readonly, readahead=False,
            )
        except lmdb.Error as exc:
            if "already open in this process" not in str(exc):
                if isinstance(exc, lmdb.LockError | lmdb.ReadersFullError | lmdb.MemoryError | lmdb.DiskError):
                    _raise_lmdb(exc, path, "opening it")
                _raise_lmdb(exc, path, "opening it", opening=True)
            # py-lmdb allows one handle per environment and process (two would break LMDB's locks).
            raise LockedError(
                f"the state in {path} is already open in this process (LMDB allows one handle per process); "
                "read through the Store already open, or open it read-only from another process"
            ) from exc
        try:
            self.data = self.env.open_db(b"data", create=not readonly)
            self.idem = self.env.open_db(b"idem", create=not readonly)
            self.meta = self.env.open_db(b"meta", create=not readonly)
        except lmdb.Error as exc:
            self.env.close()
            _raise_lmdb(exc, path, "opening its databases", opening=not isinstance(exc, lmdb.MapFullError
                                                                                    | lmdb.DiskError))

    # ---- reads (any thread; py-lmdb opens with MDB_NOTLS) ----

    def applied_lsn(self) -> int:
        try:
            with self.env.begin(db=self.meta) as txn:
                raw = txn.get(APPLIED_KEY)
        except lmdb.Error as exc:
            _raise_lmdb(exc, self.path, "reading applied_lsn")
        if raw is not None and len(raw) != _U64.size:
            raise CorruptionError(f"the LMDB state in {self.path} holds an applied_lsn of {len(raw)} bytes, not 8",
                                  path=os.path.join(self.path, "data.mdb"), reason="state damaged")
        return _U64.unpack(raw)[0] if raw else 0

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        try:
            with self.env.begin(db=self.data) as txn:
                raw = txn.get(key)
        except lmdb.Error as exc:
            _raise_lmdb(exc, self.path, "reading a key")
        if raw is None:
            return None
        if len(raw) < _U64.size:
            raise CorruptionError(f"the LMDB state in {self.path} holds key {key!r} without its 8-byte version",
                                  path=os.path.join(self.path, "data.mdb"), reason="state damaged")
        return _U64.unpack_from(raw)[0], raw[8:]

    def scan_chunk(self, prefix: bytes, after: bytes | None, limit: int) -> list[tuple[bytes, int, bytes]]:
        """Up to `limit` (key, version, value) with `prefix`, in key order, keys > `after`."""
        out: list[tuple[bytes, int, bytes]] = []
        try:
            with self.env.begin(db=self.data) as txn:
                cur = txn.cursor()
                if not cur.set_range(after if after is not None else prefix):
                    return out
                for key, raw in cur:
                    if after is not None and key == after:
                        continue
                    if not key.startswith(prefix):
                        break
                    if len(raw) < _U64.size or not key:  # the store never writes an empty key
                        raise CorruptionError(
                            f"the LMDB state in {self.path} holds "
                            + (f"key {key!r} without its 8-byte version" if key else "an empty key"),
                            path=os.path.join(self.path, "data.mdb"), reason="state damaged")
                    out.append((key, _U64.unpack_from(raw)[0], raw[8:]))
                    if len(out) >= limit:
                        break
        except lmdb.Error as exc:
            _raise_lmdb(exc, self.path, "scanning keys")
        return out

    def idempotency(self, key: bytes) -> tuple[int, int] | None:
        try:
            with self.env.begin(db=self.idem) as txn:
                raw = txn.get(key)
            if raw is None:
                return None
            lsn, time_ms = _IDEM.unpack(raw)
        except (lmdb.Error, struct.error) as exc:
            _raise_lmdb(exc, self.path, "reading an idempotency key")
        return lsn, time_ms

    def meta_get(self, key: bytes) -> bytes | None:
        try:
            with self.env.begin(db=self.meta) as txn:
                raw = txn.get(key)
        except lmdb.Error as exc:
            _raise_lmdb(exc, self.path, "reading its metadata")
        return bytes(raw) if raw is not None else None

    def meta_put(self, key: bytes, value: bytes) -> None:
        try:
            with self.env.begin(write=True, db=self.meta) as txn:
                txn.put(key, value)
        except lmdb.Error as exc:
            _raise_lmdb(exc, self.path, "writing its metadata")

    # ---- the one writer ----

    def apply(self, batch: record.Collapsed, durable_lsn: Callable[[], int]) -> int:
        """Apply a collapsed batch of consecutive commits (`record.collapse`, `Core.take`) in ONE
        LMDB transaction, with `applied_lsn`. A batch wholly at or below applied_lsn is already
        in the state (a replay after a crash mid-apply, I4) and changes nothing.

        LMDB's fsync is paid once per batch, never per commit. Returns the new applied LSN.
        """
        try:
            return self._apply(batch, durable_lsn)
        except (lmdb.Error, struct.error) as exc:
            _raise_lmdb(exc, self.path, "applying log records to it")

    def _apply(self, batch: record.Collapsed, durable_lsn: Callable[[], int]) -> int:
        first, last, commits, puts, deletes, idempotency = batch
        with self.env.begin(write=True) as txn:
            raw = txn.get(APPLIED_KEY, db=self.meta)
            applied = _U64.unpack(raw)[0] if raw else 0
            if last <= applied:
                return applied
            # I3: the batch is the commits applied+1..last, every one of them.
            if first != applied + 1 or commits != last - first + 1:
                raise InvariantError(f"apply of {commits} commit(s) LSN {first}..{last} after applied LSN "
                                     f"{applied}: a gap (I3)")
            # Only each key's last write in the batch reaches LMDB (collapsed in C), the puts in
            # one putmulti call (its loop is C, not Python).
            if puts:
                txn.cursor(db=self.data).putmulti(puts)
            for key in deletes:
                txn.delete(key, db=self.data)
            if idempotency:
                txn.cursor(db=self.idem).putmulti([(key, _IDEM.pack(lsn, time_ms))
                                                   for key, lsn, time_ms in idempotency])
            # I1 log before state: never commit the effect of a record the log could still lose.
            durable = durable_lsn()
            if last > durable:
                raise InvariantError(f"I1 violated: would store applied_lsn {last} > durable_lsn {durable}")
            txn.put(APPLIED_KEY, _U64.pack(last), db=self.meta)
            txn.put(DURABLE_SEEN_KEY, _U64.pack(durable), db=self.meta)
        return last

    def durable_seen(self) -> int:
        """The log's durable LSN when the state was last applied to (0 if never recorded)."""
        raw = self.meta_get(DURABLE_SEEN_KEY)
        return _U64.unpack(raw)[0] if raw is not None and len(raw) == _U64.size else 0

    def expire_idempotency(self, older_than_ms: int) -> int:
        """Forget idempotency keys of commits older than `older_than_ms` (wall clock)."""
        removed = 0
        try:
            with self.env.begin(write=True, db=self.idem) as txn:
                cur = txn.cursor()
                for key, raw in cur:
                    if _IDEM.unpack(raw)[1] < older_than_ms:
                        txn.delete(key)
                        removed += 1
        except (lmdb.Error, struct.error) as exc:
            _raise_lmdb(exc, self.path, "expiring idempotency keys")
        return removed

    def sync(self) -> None:
        """Make the last commit durable, meta page included (checkpoints need this)."""
        try:
            self.env.sync(True)
        except lmdb.Error as exc:
            _raise_lmdb(exc, self.path, "syncing it")

    def stat(self) -> dict[str, int]:
        try:
            with self.env.begin() as txn:
                entries = txn.stat(self.data)["entries"]
            info = self.env.info()
            psize = self.env.stat()["psize"]
        except lmdb.Error as exc:
            _raise_lmdb(exc, self.path, "reading its statistics")
        return {"state_keys": entries, "state_map_bytes_used": (info["last_pgno"] + 1) * psize}

    def close(self) -> None:
        self.env.close()
