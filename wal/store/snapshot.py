"""Consistent reads of a store: `Store.snapshot()` and the iterator of `Store.scan()`.

A store's state lives in two places (wal/store/store.py, "Reads"): LMDB, holding every commit up to
the applied LSN, and the overlay, holding the acknowledged commits not yet applied. A read
that must see one instant -- a scan's whole iteration, a snapshot's every read -- takes both
at one moment, in one C call (native/storecore.c, "Reads"): an LMDB read transaction, the
store's visible LSN V, and the overlay's newest version <= V of the keys it covers. It then
reads only from those: the transaction is LMDB's snapshot (the materializer's later commits
are invisible to it) and the overlay versions are a copy. So a transaction's writes are seen
all or none (each transaction is one log record, applied to LMDB in one LMDB transaction and
entered in the overlay under the commit lock), and every read sees exactly the commits
acknowledged up to V.

What a snapshot holds while it is open, and the bound:

* one LMDB read transaction (a reader slot of the state's lock file, of 1,024): the pages
  of its version cannot be reused, so the state file grows by what is written while it is
  open. Close snapshots when done (they are context managers); a scan's iterator holds one
  until it is exhausted or closed (``iterator.close()``, or dropping it);
* a copy of the overlay's versions <= V: at most the commits not yet applied when it was
  taken, which the store bounds by ``max_unapplied`` (200,000 commits by default) and the
  materializer keeps to the last few milliseconds' commits in steady state.

Closing the store ends its snapshots: their reads then raise `ClosedError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, overload

from wal._lmdbcall import DATA, META, LmdbError
from wal.errors import ArgumentTypeError, ClosedError
from wal.store.state import APPLIED_KEY, raise_lmdb

if TYPE_CHECKING:
    from wal._lmdbcall import Snapshot as Txn
    from wal.store.store import Store


def refuse_lone_key(keys: object) -> None:
    """get_many (a store's and a snapshot's) takes a sequence of keys: a lone str or bytes is one
    too (of its characters), and was read as such (`get_many("abc")` read keys a, b and c); what
    is no sequence at all (None, a number) raised a raw TypeError."""
    if isinstance(keys, str | bytes | bytearray | memoryview):
        raise ArgumentTypeError(f"get_many takes a sequence of keys, not one {type(keys).__name__}: pass [key]")
    if not isinstance(keys, Iterable):
        raise ArgumentTypeError(f"get_many takes a sequence of keys (a list or tuple), not {type(keys).__name__}")


class ScanTxn(Protocol):
    """What a scan needs of its LMDB read transaction (a wal._lmdbcall.Snapshot)."""

    def scan(self, db: int, prefix: bytes, after: bytes | None, limit: int, /) -> list[Any]: ...
    def abort(self) -> None: ...


# (key, lsn, value | None) of the overlay, as native/storecore.c hands them out
OverlayItems = list[tuple[bytes, int, bytes | None]]
SCAN_CHUNK = 1024  # LMDB entries per call once a scan goes past its first chunk


def merged(txn: ScanTxn, path: str, prefix: bytes, first: list[tuple[bytes, int, bytes]], *, first_limit: int,
           over: OverlayItems, end: bool = True) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of the keys with `prefix`: LMDB's entries in `txn` from `first` on (its first
    chunk of (key, version, value), asked with `first_limit`) merged with the overlay's versions
    `over`, the newer of the two winning, deleted keys left out; in key order. Ends `txn` when
    done if `end`."""
    newest = sorted(over)
    i = 0
    try:
        items, limit = first, first_limit
        while True:
            for key, version, value in items:
                while i < len(newest) and newest[i][0] < key:
                    okey, _, ovalue = newest[i]
                    i += 1
                    if ovalue is not None:
                        yield okey, ovalue
                if i < len(newest) and newest[i][0] == key:
                    _, olsn, ovalue = newest[i]
                    i += 1
                    if olsn >= version:
                        if ovalue is not None:
                            yield key, ovalue
                        continue
                yield key, value
            if len(items) < limit:
                break
            try:
                items, limit = txn.scan(DATA, prefix, items[-1][0], SCAN_CHUNK), SCAN_CHUNK
            except LmdbError as exc:
                raise_lmdb(exc, path, "scanning keys")
        for okey, _, ovalue in newest[i:]:
            if ovalue is not None:
                yield okey, ovalue
    finally:
        if end:
            txn.abort()


def lmdb_only(txn: Txn, path: str, prefix: bytes, first: list[tuple[bytes, bytes]],
              chunk: int = SCAN_CHUNK) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of the keys with `prefix` in `txn`, from its first chunk `first` on, when the
    overlay holds none of them. Ends `txn` when done."""
    try:
        yield from first
        items = first
        while items:
            try:
                items = txn.scan_values(prefix, items[-1][0], chunk)
            except LmdbError as exc:
                raise_lmdb(exc, path, "scanning keys")
            yield from items
            if len(items) < chunk:
                break
    finally:
        txn.abort()


class Snapshot:
    """The store as of one LSN: every read sees exactly the commits acknowledged up to `lsn`
    (in a read-only store: the commits its state holds), whatever is committed meanwhile.

    Create with `Store.snapshot()`; a context manager (close it: module docstring says what an
    open snapshot holds). Thread-safe for reads; closing the store ends it (`ClosedError`).
    """

    def __init__(self, store: Store, txn: Txn, lsn: int | None, over: OverlayItems,
                 key: Callable[..., bytes]) -> None:
        """`key`: the store's key check (bytes or str to bytes, or ArgumentError/TypeError)."""
        self._store = store
        self._key = key
        self._path = store._state.path
        self._txn = txn
        self._over = {key: (olsn, value) for key, olsn, value in over}
        self._closed = False
        if lsn is None:  # a read-only store: the state's own applied LSN
            try:
                raw = txn.get(META, APPLIED_KEY)
            except LmdbError as exc:
                raise_lmdb(exc, self._path, "reading applied_lsn")
            lsn = int.from_bytes(raw, "little") if raw else 0
        self.lsn: int = lsn

    def _usable(self) -> None:
        if self._closed:
            raise ClosedError("this snapshot is closed")
        self._store._usable()

    def _lookup(self, key: bytes) -> tuple[int, bytes | None] | None:
        self._usable()
        found = self._over.get(key)
        if found is not None:  # the overlay's newest version <= lsn is newer than LMDB's (wal/store/store.py)
            return found
        try:
            got: tuple[int, bytes] | None = self._txn.get(DATA, key)
        except LmdbError as exc:
            raise_lmdb(exc, self._path, f"reading key {key!r}")
        return got

    @overload
    def get(self, key: bytes | str, default: None = None) -> bytes | None: ...
    @overload
    def get(self, key: bytes | str, default: bytes) -> bytes: ...

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        """The value of key as of `lsn`, or `default`."""
        found = self._lookup(self._key(key))
        return default if found is None or found[1] is None else found[1]

    def version(self, key: bytes | str) -> int | None:
        """The LSN of the commit that last wrote key as of `lsn`, or None if it did not exist then."""
        found = self._lookup(self._key(key))
        return found[0] if found is not None and found[1] is not None else None

    def get_many(self, keys: Sequence[bytes | str], default: bytes | None = None) -> list[bytes | None]:
        """The values of `keys` as of `lsn` (`default` for absent ones), in the order given."""
        refuse_lone_key(keys)
        return [self.get(key, default) for key in keys]

    def scan(self, prefix: bytes | str = b"") -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of the keys starting with prefix as of `lsn`, in key order."""
        self._usable()
        p = self._key(prefix, allow_empty=True)
        over = [(k, olsn, v) for k, (olsn, v) in self._over.items() if k.startswith(p)]
        try:
            first: list[tuple[bytes, int, bytes]] = self._txn.scan(DATA, p, None, SCAN_CHUNK)
        except LmdbError as exc:
            raise_lmdb(exc, self._path, "scanning keys")
        return merged(self._txn, self._path, p, first, first_limit=SCAN_CHUNK, over=over, end=False)

    def close(self) -> None:
        """End the snapshot (idempotent): its LMDB read transaction and overlay copy go."""
        if not self._closed:
            self._closed = True
            self._txn.abort()
            self._over = {}

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self._txn.abort()

    def __repr__(self) -> str:
        return f"<wal.Snapshot of {self._store.path!r} at LSN {self.lsn}{' closed' if self._closed else ''}>"
