# Stub of the CPython extension built from native/lmdbcall.c (read it for the contracts).
from collections.abc import Callable

from wal.record import Collapsed

DATA: int
IDEM: int
META: int
APPLY_OK: int
APPLY_GAP: int
APPLY_NOT_DURABLE: int
E_ALREADY_OPEN: int
E_FORKED: int
E_CLOSED: int
E_BUSY: int
E_BAD_VALUE: int
E_NO_TAILS: int
MDB_KEYEXIST: int
MDB_NOTFOUND: int
MDB_PAGE_NOTFOUND: int
MDB_CORRUPTED: int
MDB_PANIC: int
MDB_VERSION_MISMATCH: int
MDB_INVALID: int
MDB_MAP_FULL: int
MDB_DBS_FULL: int
MDB_READERS_FULL: int
MDB_TXN_FULL: int
MDB_MAP_RESIZED: int
MDB_INCOMPATIBLE: int
MDB_BAD_RSLOT: int
MDB_BAD_TXN: int
MDB_BAD_VALSIZE: int
MDB_BAD_DBI: int

class LmdbError(Exception):
    # args: (code: int, message: str)
    ...

def load(path: str, /) -> str: ...

class Env:
    path: str | None
    closed: bool
    restored: bool
    background_applies: int
    map_size: int
    def __init__(self, path: str, readonly: bool, map_size: int, restore: bytes | None = None) -> None: ...
    def get(self, db: int, key: bytes, /) -> bytes | None: ...
    def scan(self, db: int, prefix: bytes, after: bytes | None, limit: int, /) -> list[tuple[bytes, bytes]]: ...
    def put(self, db: int, key: bytes, value: bytes, /) -> None: ...
    def apply(self, batch: Collapsed, durable_lsn: Callable[[], int], background: bool = ..., /) -> tuple[int, int]: ...
    def expire_idempotency(self, older_than_ms: int, /) -> int: ...
    def sync(self, force: bool, /) -> None: ...
    def stat(self) -> tuple[int, int, int]: ...
    def begin(self) -> Snapshot: ...
    def close(self) -> None: ...
    def set_map_size(self, size: int, /) -> int: ...

class DurableLsn:
    def __init__(self, watermarks_address: int, handle_address: int, owner: object) -> None: ...
    def __call__(self) -> int: ...

class Snapshot:
    def get(self, db: int, key: bytes, /) -> bytes | None: ...
    def scan(self, db: int, prefix: bytes, after: bytes | None, limit: int, /) -> list[tuple[bytes, bytes]]: ...
    def entries(self, db: int, /) -> int: ...
    def txnid(self) -> int: ...
    def renew(self) -> None: ...
    def abort(self) -> None: ...
