"""`wal.Store`: a key-value store whose every commit goes through the log first.

Data flow::

    put / transaction --encode--> Log.enqueue (LSN = commit order) --group commit--> segments
          |                                                                  | durable_lsn
          v                                                                  v
    overlay (acknowledged, not yet applied) <-- reads      materializer: records <= durable_lsn,
                                                            one LMDB txn per batch, applied_lsn inside

Commit path. Under `_commit_lock` a commit validates its `if_version` checks and its
idempotency key against the newest state (overlay included, so two commits cannot both
pass a check one of them invalidates), takes its LSN from the log and enters the
overlay and the apply queue -- all without I/O. It then waits *outside* the lock for its
durability level, so concurrent commits share fdatasyncs (group commit).

Reads (I2, read-your-writes). The overlay keeps, per key, the versions not yet in
LMDB, newest first, in a C hash table owned by the commit core (native/overlay.h):
commits enter versions under the commit lock, the materializer drops applied ones under
it, and a read looks a key up in one C call, which the GIL makes atomic, so reads take
no lock. A read takes the newest version whose LSN is acknowledged under the store's
level (sync: durable; interval: written; buffered: appended; replicated: durable and held by
the object archive) and otherwise reads LMDB:
it looks the key up, and if the newest version is above the watermark it reads next,
looks again for the newest at or below that watermark. A commit acknowledged before a
read starts is at or below any watermark the read takes, and is in the overlay or
already in LMDB, so the caller sees its own acknowledged commits at every level without
waiting for LMDB; a version returned is at or below a watermark read during the read,
so it never sees another thread's commit before that commit is acknowledged. A version
leaves the overlay only once LMDB holds it (or a newer one), so a lookup that finds
nothing visible there finds it in LMDB.

Materializer. A background thread applies queued transactions with LSN <= durable_lsn
in batches (`State.apply`, which asserts I1), then drops them from the overlay. It also
runs automatic checkpoints, so that recovery replays a bounded amount of log and the files
stay bounded by the live data (`_checkpoint_due`).

Space (bounded at any write rate). LMDB reuses no page freed after the snapshot the last
checkpoint pins (wal/store/state.py), so every page a transaction copies on write between two
checkpoints is new space: overwriting 1 KiB values scattered over many keys writes a 4 KiB page
per key. A checkpoint is therefore due, checked after every applied batch (not once the backlog
is gone: under a sustained load it never is), when the pages freed since the last one, the log
written since it, or the log a checkpoint now would let go of (applied since, which includes
what was still queued then) reach `_space_bound`: 1/8 of the state's pages in use, at least
8 MiB, at most `checkpoint_bytes`. The file then holds its pages in use, at most one bound of
pinned free pages and one of reusable ones (~1.25x its pages in use), and the log about one
bound plus its open segment. The trade: a checkpoint fdatasyncs what the state wrote since the
last one while holding the apply lock, so when commits arrive faster than the disk takes the
state's pages, the apply queue fills to its bound (`_limit_unapplied`: about one space bound of
log bytes, at most `max_unapplied` commits) and committers wait for the state (they help apply,
behind the checkpoint): the commit rate falls to what the disk sustains, rather than the disk
filling. `stats()` counts it (``state_backpressure_waits``, ``state_backpressure_ms``). The
pages in use are full for keys inserted in order, where LMDB alone leaves two ~1 KiB entries on
pages with room for three (native/lmdbcall.c, `put_order`). A bloated file (from an older
version, or pages in use that a workload has since deleted) shrinks only by `compact_state`
(`agentwal compact`).

Recovery on open: the log's own recovery (torn tail cut, damage refused), then replay of
(applied_lsn, last LSN] into LMDB in batches; a crash during it leaves a valid
applied_lsn and the next open continues from there (I4).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import errno
import json
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, overload

from wal._bindings import durable_lsn_reader, storecore
from wal._fs import fsync_dir, makedirs_durable
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
    StorageError,
    WalError,
    storage_error,
)
from wal.log import durability as dur
from wal.log import record
from wal.log.log import LOCK_NAME, MAX_PAYLOAD, Log
from wal.log.recovery import parse_segment_name
from wal.store.replay import Replay
from wal.store.sealed import (
    STORE_FIELD,
    UNREADABLE,
    mark_for,
    parse_mark,
    read_meta,
    read_state_mark,
    record_sealing,
    store_lost,
)
from wal.store.sealed import plan as plan_sealing
from wal.store.snapshot import Snapshot, lmdb_only, merged, refuse_lone_key
from wal.store.state import (
    DURABLE_SEEN_KEY,
    SEALED_KEY,
    ReadersFullError,
    State,
    StateError,
    compact,
    read_checkpoint,
)

if TYPE_CHECKING:
    from wal.store.sealed import SealingPlan

STORE_FORMAT = "agentwal-store"
# 2: the state durable at checkpoints (state/checkpoint.meta). 3: values stored split in the
# state (its `tail` database, FORMAT.md §16). 4: a checksum in every state entry, verified on
# every read. 5: a store may be sealed (values compressed and/or encrypted, wal/crypto/; STORE says
# so). 6: a checksum in every idempotency entry too. Older versions are read, and upgraded by their
# first writable open (`_upgrade_store`).
STORE_VERSION = 6
READABLE_STORE_VERSIONS = (1, 2, 3, 4, 5, 6)
STORE_FILE = "STORE"
LOG_DIR = "log"
STATE_DIR = "state"
ARCHIVE_DIR = "archive"
# The object archive's state, kept by its shipper (wal/archive/shipper.py; FORMAT.md): read here
# so that a local open of a store that ships keeps the log its archive has not received.
ARCHIVE_STATUS_FILE = "archive.json"
# An archive snapshot waiting for its PUT (wal/archive/spool.py): <prefix><lsn, 20 digits>-<8 hex><suffix>.
ARCHIVE_SPOOL_PREFIX, ARCHIVE_SPOOL_SUFFIX = "archive-snapshot-", ".tmp"

MAX_KEY_BYTES = record.MAX_KEY_BYTES
MAX_VALUE_BYTES = MAX_PAYLOAD - 4096  # one transaction is one log record
_APPLY_BATCH_RECORDS = 4096  # per LMDB transaction (no fsync there: MDB_NOSYNC), short lock holds
# per background (lowest-priority) transaction: a starved one holds the apply lock for one small batch
_BACKGROUND_BATCH_RECORDS = 1024
# LMDB entries a scan reads in its first call: a scan of up to this many keys is one C call and
# a list; a longer one goes on in chunks of wal.store.snapshot.SCAN_CHUNK from the same transaction.
_SCAN_FIRST = 256
# An idle materializer (nothing queued for this many rounds) sleeps this long between rounds,
# woken early by the next commit (Store._next_wait).
_IDLE_AFTER_ROUNDS = 50
_IDLE_WAIT_S = 1.0
# Space policy (module docstring): a checkpoint once the state's pages freed since the last one, or
# the log written or applied since, reach 1/_SPACE_FRACTION of the state's pages in use, but at least
# _SPACE_MIN_BYTES (a small store is not checkpointed at every batch) and at most checkpoint_bytes.
_SPACE_FRACTION = 8
_SPACE_MIN_BYTES = 8 << 20
# The apply queue's bound in commits is lowered to about one space bound of log bytes (the log keeps
# every unapplied record), never below this many commits (a batch's worth, for group collapse).
_MIN_UNAPPLIED = _APPLY_BATCH_RECORDS
_PAGE_BYTES = 4096  # LMDB's page on this platform: what one applied record may dirty
_MIN_BATCH_RECORDS = 256

Version = int
_NO_CHECKS: dict[bytes, int] = {}  # shared, never written: single puts and deletes check nothing
_BUFFERED = dur.LEVELS.index("buffered")


_open_stores: weakref.WeakSet[Store] = weakref.WeakSet()
_logger = logging.getLogger("wal.store.store")  # under the "wal" logger: recovery, checkpoints, fail-stop, slow fsyncs


def _after_fork_in_child() -> None:
    for store in list(_open_stores):
        store._forked = True
        store._core.disable()  # the parent's log handle: never append through it here
        store._core.close_reads()  # nor read the parent's LMDB handle: the Python path refuses
        # A parent thread may have held or waited on it at the fork; the child refuses every
        # use of the store (_usable), and this keeps the lock itself sane, as for threading's.
        store._commit_lock._at_fork_reinit()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Watermarks(NamedTuple):
    written: int  # last LSN written to the OS
    durable: int  # last LSN covered by an fdatasync
    applied: int  # last LSN whose effect is in LMDB


_MAX_TTL_S = 100 * 365 * 86_400  # "forever", as a number the idempotency index can hold
# Upper bounds of the open's numbers, far past any use, within what the C core holds (an
# off_t, a Py_ssize_t): a larger one raised a raw OverflowError after the store was made.
_MAX_CHECKPOINT_BYTES = 1 << 40
_MAX_UNAPPLIED = 1 << 40


def _key(key: object, *, allow_empty: bool = False, what: str = "key") -> bytes:
    """`key` as bytes, checked; `what` names it in errors ("idempotency key": a too long one
    said "key of N bytes", as if it were a key the transaction writes)."""
    if type(key) is bytes and 0 < len(key) <= MAX_KEY_BYTES:
        return key  # the common case, checked first: every commit passes here
    if isinstance(key, str):
        try:
            data = key.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate, as os.fsdecode makes of a non-UTF-8 name
            raise ArgumentError(f"a str {what} must be valid Unicode: {key!r} is not encodable as UTF-8 "
                                f"({exc.reason}); pass its bytes instead") from None
    elif isinstance(key, bytes):
        data = key
    elif isinstance(key, bytearray | memoryview):
        data = bytes(key)
    else:
        raise ArgumentTypeError(f"{_a(what)} must be bytes or str, not {type(key).__name__}")
    if not data and not allow_empty:
        raise ArgumentError(f"{_a(what)} must not be empty")
    if len(data) > MAX_KEY_BYTES:
        raise RecordTooLargeError(f"{what} of {len(data)} bytes is over the {MAX_KEY_BYTES}-byte {what} limit")
    return data


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _value(value: Any) -> bytes:
    if type(value) is bytes and len(value) <= MAX_VALUE_BYTES:
        return value  # the common case, checked first
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, bytearray | memoryview):
        data = bytes(value)
    else:
        raise ArgumentTypeError(
            f"a value must be bytes, not {type(value).__name__} (encode it first, e.g. json.dumps(v).encode())"
        )
    if len(data) > MAX_VALUE_BYTES:
        raise RecordTooLargeError(f"value of {len(data)} bytes is over the {MAX_VALUE_BYTES}-byte value limit")
    return data


def _if_version(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ArgumentError(f"if_version must be None, 0 (key absent) or an LSN, got {v!r}")
    return v


def _retries(retries: Any) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ArgumentError(f"retries must be an int >= 0, got {retries!r}")
    return retries


def _update_fn(fn: Any) -> None:
    """update's `fn`, checked before anything: None raised a raw "object is not callable"."""
    if not callable(fn):
        raise ArgumentTypeError(f"update's second argument must be a function of the current value (bytes or None) "
                                f"returning the bytes to put or None to delete, not {type(fn).__name__}")


def _gave_up(key: bytes, retries: int) -> ConflictError:
    return ConflictError(f"update of key {key!r} gave up after {retries} retries: other commits kept changing it",
                         key=key, expected=None, actual=None)


def _retryable(exc: BaseException) -> bool:
    """A failure of the state's writes that waits for the host, not a fail-stop: no space
    (ENOSPC, EDQUOT), no file descriptor (EMFILE, ENFILE) or no LMDB reader slot (a checkpoint
    pins a read transaction; live readers hold every slot) left. LMDB aborted the transaction,
    so the state is as it was, and the log holds every commit."""
    return isinstance(exc, NoSpaceError | ReadersFullError) or (
        isinstance(exc, StorageError) and exc.errno in (errno.EMFILE, errno.ENFILE))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _one_op(kind: int, key: bytes, value: bytes | None) -> tuple[record.Txn, bytes]:
    """The transaction and log payload of a single put or delete (no checks, no idempotency key)."""
    now = _now_ms()
    return record.make_txn(((kind, key, value),), now, None), record.encode_one(kind, key, value, now)


def _encode(txn: record.Txn) -> bytes:
    payload = record.encode(txn.ops, txn.time_ms, txn.idempotency_key)
    if len(payload) > MAX_PAYLOAD:
        raise RecordTooLargeError(
            f"transaction of {len(payload)} bytes is over the {MAX_PAYLOAD}-byte record limit; split it"
        )
    return payload


class Transaction:
    """Buffered writes committed atomically as one log record when the `with` block exits.
    Used outside one (``tx = store.transaction()`` with no ``with``), its methods raise
    `ClosedError`: there is no commit() to call, and its writes would never be committed.

    An exception inside the block aborts it: nothing is written. After the block, `lsn` is the
    commit's LSN (None if the transaction wrote nothing).

    Isolation. Writes are all-or-nothing and ordered by LSN. `get` and `version` read the newest
    version of a key, a commit still waiting for its fdatasync included: a commit that depends
    on it is later in the log, and the log is made durable as a prefix, so it can never be
    acknowledged before the commit it read (nor survive a crash that loses it). `if_version`
    checks a key at commit time. With ``serializable=True`` every key read through `get` or
    `version` is checked the same way, so the transaction commits only if none of them changed
    since it read them (optimistic serializability for the keys it read); otherwise reads are
    not checked.
    """

    def __init__(self, store: Store, durability: str | None, idempotency_key: bytes | None,
                 serializable: bool = False) -> None:
        self._store = store
        self._durability = durability
        self._idem = idempotency_key
        self._serializable = serializable
        self._ops: dict[bytes, record.Op] = {}
        self._checks: dict[bytes, int] = {}
        self._reads: dict[bytes, int] = {}  # serializable: version read per key (0: absent)
        self._done = False
        self._entered = False  # its writes are committed only by the block's exit
        self.lsn: int | None = None
        self.deduplicated = False  # True when an idempotency key matched an earlier commit

    def _check(self, key: bytes, if_version: int | None) -> None:
        if if_version is None:
            return
        prior = self._checks.get(key)
        if prior is not None and prior != if_version:
            raise ArgumentError(f"conflicting if_version for key {key!r}: {prior} and {if_version}")
        self._checks[key] = if_version

    def _open(self) -> None:
        if self._done:
            raise ClosedError("this transaction has already committed or aborted")
        if not self._entered:  # without `with` nothing commits: its writes vanished without a word
            raise ClosedError("a transaction is used inside `with store.transaction() as tx:` (or `async with "
                              "store.atransaction() as tx:`), which commits it when the block ends; outside "
                              "one nothing would ever be committed")

    def put(self, key: bytes | str, value: bytes, *, if_version: int | None = None) -> None:
        """Write key=value at commit; if_version: the key's version must then be this (0: absent)."""
        self._open()
        k = _key(key)
        self._check(k, _if_version(if_version))
        self._ops[k] = (record.OP_PUT, k, _value(value))

    def delete(self, key: bytes | str, *, if_version: int | None = None) -> None:
        """Delete key at commit; if_version as for `put`."""
        self._open()
        k = _key(key)
        self._check(k, _if_version(if_version))
        self._ops[k] = (record.OP_DELETE, k, None)

    @overload
    def get(self, key: bytes | str, default: None = None) -> bytes | None: ...
    @overload
    def get(self, key: bytes | str, default: bytes) -> bytes: ...

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        """This transaction's own writes first, then the store's newest version (in flight included)."""
        self._open()
        k = _key(key)
        op = self._ops.get(k)
        if op is not None:
            return op[2] if op[0] == record.OP_PUT else default
        found = self._store._lookup(k, newest=True)
        self._read(k, found)
        return default if found is None or found[1] is None else found[1]

    def version(self, key: bytes | str) -> int | None:
        """The LSN of the newest commit that wrote key (in flight included), or None if absent --
        the value to pass as `if_version` (None as 0). A key this transaction wrote: None until it
        commits."""
        self._open()
        k = _key(key)
        if k in self._ops:
            return None
        found = self._store._lookup(k, newest=True, value=False)
        self._read(k, found)
        return found[0] if found is not None and found[1] is not None else None

    def _read(self, key: bytes, found: tuple[int, bytes | None] | None) -> None:
        if self._serializable and key not in self._reads:
            self._reads[key] = found[0] if found is not None and found[1] is not None else 0

    def _all_checks(self) -> dict[bytes, int]:
        """The if_version checks, and with serializable=True the versions read (if_version wins)."""
        return {**self._reads, **self._checks} if self._reads else self._checks

    def _txn(self) -> record.Txn:
        return record.Txn(list(self._ops.values()), _now_ms(), self._idem)

    def __enter__(self) -> Transaction:
        self._entered = True
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._done:
            return
        self._done = True
        if et is not None or not self._ops:
            return
        self.lsn, self.deduplicated = self._store._commit(self._txn(), self._all_checks(), self._durability)

    async def __aenter__(self) -> Transaction:
        self._entered = True
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        """Commit (or abort on an exception, a CancelledError of the block included). A
        cancellation during the commit: see `Store.atransaction` (done before the
        CancelledError, or never)."""
        if self._done:
            return
        self._done = True
        if et is not None or not self._ops:
            return
        self.lsn, self.deduplicated = await self._store._commit_async(self._txn(), self._all_checks(),
                                                                     self._durability)


class Store:
    """An open store; create with `wal.open`. Thread-safe; one writer process per directory."""

    # The materializer logs a WARNING when the slowest fdatasync (stats()["fsync_ms_max"]) grew past
    # this many milliseconds since it last looked (about once a second). Set per store to tune.
    slow_fsync_ms: float = 1000.0
    # ---- archive hooks (wal/archive/store.py's ArchivedStore overrides these) ----
    _object_archive = False  # the store ships to an object archive: "replicated" is a level it can keep
    # A store that ships to an object archive, opened without it: the first LSN its archive has not
    # received (its archive.json says), kept in the log until an open with the archive ships it.
    _unshipped_from: int | None = None
    _fsync_ms_seen: float = 0.0
    # Why the store was closed, when not by its user (a follower rebuilt from a snapshot closes
    # its old store under the snapshots and scans still open on it): their ClosedError says so.
    _closed_because: str | None = None
    _fsync_checked_at: float = 0.0

    def __init__(self, path: str, log: Log | None, state: State, level: dur.Durability, *,
                 checkpoint_bytes: int, archive: str | None, idempotency_ttl_s: float,
                 apply_interval_ms: int, max_unapplied: int) -> None:
        self._path = path
        self._log = log
        self._state = state
        self._durability = level
        self._checkpoint_bytes = checkpoint_bytes
        self._archive = archive
        self._idem_ttl_ms = int(idempotency_ttl_s * 1000)
        self._apply_interval = apply_interval_ms / 1000
        self._max_unapplied = max_unapplied  # the caller's bound; _unapplied_limit is the one in force
        self._unapplied_limit = max_unapplied
        self._batch_limit = _APPLY_BATCH_RECORDS  # records per apply: lowered with the space bound
        self._appended_at_checkpoint = 0  # the log's appended LSN at the last checkpoint (or open)
        self._mean_commit_bytes = 0.0  # log bytes per commit, since the last checkpoint but one
        # The LSN below which the log holds no segment: applied_lsn at the last checkpoint, and
        # at open the LSN before the log's first (_replay). A checkpoint lets go of the log
        # from here to applied_lsn (_checkpoint_due).
        self._checkpointed_lsn = 0
        self._async_helping = False  # an async commit is applying a backlog (_commit_async)
        self._pid = os.getpid()
        self._forked = False  # set in a forked child by _after_fork_in_child
        self._closed = False
        # Set by close, under the apply lock, once its last checkpoint is taken: an apply or a
        # checkpoint of another thread that got past its own check of `_closed` before close
        # began then finds it under the lock, and raises ClosedError instead of using the state.
        self._state_released = False
        self._failure: BaseException | None = None
        # Orders commits (LSN, overlay, queue) and the materializer's take/prune. A lock the C
        # commit path tries and releases without a Python call (native/commitlock.h); the
        # Python path uses it as a threading.Lock (`with`, acquire, release, locked).
        self._commit_lock = storecore.CommitLock()
        self._apply_lock = threading.Lock()
        self._wake = threading.Event()
        # The commit path of single puts and deletes, the overlay and the apply queue of every
        # commit, in C (native/storecore.c); it shares the commit lock and the wake-up event.
        self._core = storecore.Core(log, log.native_address if log is not None else 0, self._commit_lock,
                                    self._wake, level.code, max_unapplied, checkpoint_bytes)
        self._commit_fast = self._core.commit
        self._core.bind_state(state.lmdb_env)  # reads in one C call (get, version, get_many, scan)
        # The LSN the materializer applies up to (I1: the durable LSN; at `replicated` no higher
        # than the archive's, wal/archive/store.py), for State.apply read in C without the GIL
        # (native/lmdbcall.c): a Python callable would make apply take the GIL back from a
        # thread busy putting.
        self._apply_limit_lsn: Callable[[], int] = (
            durable_lsn_reader(log, log.native_address) if log is not None and log.native_address
            else lambda: self._log.watermarks.durable)  # type: ignore[union-attr]
        self._idem_pending: dict[bytes, int] = {}
        self._applied = state.applied_lsn()
        self._last_checkpoint = time.time()
        # stats()["last_checkpoint"] of a writer: the last checkpoint finished (its segments
        # released), not the note a checkpoint under way has already put in the state.
        self._checkpoint_note: dict[str, Any] | None = _meta_json(state, b"checkpoint")
        # Store-level counters, all present from the start (stats() merges them over the log's own).
        self._counters = collections.Counter[str](dict.fromkeys(
            ("conflicts", "idempotent_hits", "apply_batches", "applied_commits", "checkpoints",
             "auto_checkpoints", "space_checkpoints", "segments_removed", "state_stalls",
             "state_backpressure_waits"), 0))
        self._backpressure_s = 0.0  # committers' time spent waiting for the state (_commit)
        self._recovery: dict[str, Any] = {"recovery_seconds": 0.0, "records_replayed": 0, "state_restored": 0}
        self._recovery_mode = "strict"
        self._stop = False
        self._thread: threading.Thread | None = None
        self._unapplied_batch: record.Collapsed | None = None  # taken, its apply failed: applied first
        self._stall: BaseException | None = None  # the state's writes fail for lack of space (_stalled)
        self._stall_rounds = 0
        self._idle_rounds = 0  # materializer rounds with nothing queued (_next_wait)

    # ---- opening -----------------------------------------------------------------------------

    @classmethod
    def _checked_level(cls, durability: str | None = None, rpo_ms: int | None = None, *,
                       checkpoint_bytes: int = 256 << 20, idempotency_ttl_s: float = 86_400,
                       apply_interval_ms: int = 20, max_unapplied: int = 200_000) -> dur.Durability:
        """The durability `_open` would open with, and its other numbers checked: ArgumentError
        as the open raises it, without opening anything (a promotion checks its options so,
        before it fences the old writer). Each number is checked for its type and range here,
        before the log or the state is opened: one that failed later (infinity, NaN, a string)
        raised a raw Python error after both were open, and left the directory locked."""
        level = dur.parse(durability, rpo_ms, replicable=cls._object_archive)
        if isinstance(checkpoint_bytes, bool) or not isinstance(checkpoint_bytes, int) \
                or not 1 << 16 <= checkpoint_bytes <= _MAX_CHECKPOINT_BYTES:
            raise ArgumentError(f"checkpoint_bytes must be an int in [65536, {_MAX_CHECKPOINT_BYTES}] (1 TiB), "
                                f"got {checkpoint_bytes!r}")
        if (isinstance(idempotency_ttl_s, bool) or not isinstance(idempotency_ttl_s, int | float)
                or not 0 < idempotency_ttl_s <= _MAX_TTL_S):
            raise ArgumentError(f"idempotency_ttl_s must be seconds in (0, {_MAX_TTL_S}] (a century), "
                                f"got {idempotency_ttl_s!r}")
        if (isinstance(apply_interval_ms, bool) or not isinstance(apply_interval_ms, int | float)
                or not 0 < apply_interval_ms <= dur.MAX_RPO_MS):
            raise ArgumentError(f"apply_interval_ms must be milliseconds > 0, got {apply_interval_ms!r}")
        if isinstance(max_unapplied, bool) or not isinstance(max_unapplied, int) \
                or not 1 <= max_unapplied <= _MAX_UNAPPLIED:
            raise ArgumentError(f"max_unapplied must be an int in [1, {_MAX_UNAPPLIED}], got {max_unapplied!r}")
        return level

    @classmethod
    def _open(cls, path: str | os.PathLike[str], *, durability: str | None = None, rpo_ms: int | None = None,
              readonly: bool = False, recovery: str = "strict", segment_bytes: int = 64 << 20,
              checkpoint_bytes: int = 256 << 20, archive: bool | str = False, idempotency_ttl_s: float = 86_400,
              apply_interval_ms: int = 20, max_unapplied: int = 200_000, preallocate: str = "size",
              sealing: SealingPlan | None = None, _following: bool = False) -> Store:
        # The defaults of `wal.open` (wal/_open.py, the signature users read); a test holds the two equal.
        level = cls._checked_level(durability, rpo_ms, checkpoint_bytes=checkpoint_bytes,
                                   idempotency_ttl_s=idempotency_ttl_s, apply_interval_ms=apply_interval_ms,
                                   max_unapplied=max_unapplied)
        root = os.fspath(path)
        archive_dir = (os.path.join(root, ARCHIVE_DIR) if archive is True
                       else (os.fspath(archive) if archive else None))
        common = dict(checkpoint_bytes=checkpoint_bytes, archive=archive_dir,
                      idempotency_ttl_s=idempotency_ttl_s, apply_interval_ms=apply_interval_ms,
                      max_unapplied=max_unapplied)
        if readonly:
            check_store_file(root, create=False)
            state = State(os.path.join(root, STATE_DIR), readonly=True,
                          writer_lock=os.path.join(root, LOG_DIR, LOCK_NAME))
            try:
                _check_sealed_marker(root, state, sealing, writable=False)
            except BaseException:
                state.close()
                raise
            ro = cls(root, None, state, level, **common)  # type: ignore[arg-type]
            if sealing is not None:
                sealing.attach(ro)
            _open_stores.add(ro)
            return ro
        # Refuse an unknown or newer format before the log's recovery touches (or misreads as
        # damage) a log laid out by another version.
        if os.path.exists(os.path.join(root, STORE_FILE)):
            check_store_file(root, create=False)
        else:
            _refuse_a_bare_log(root)
        if not _following:
            _refuse_a_follower(root)
        makedirs_durable(root)
        # Sealed segments are replayed into the state while the open reads the next ones
        # (wal/store/replay.py). The STORE file is brought to this version right before the state is
        # first opened for writing: under the log's lock (a writer of another version still
        # running keeps its store as it is) and before anything of this version is written.
        started = time.monotonic()
        # The log must never be cut below what the state's last checkpoint holds (Log.open keep_through).
        saved = read_checkpoint(os.path.join(root, STATE_DIR))
        replayer = Replay(os.path.join(root, STATE_DIR), before_open=lambda: _make_store_file_current(root, sealing))
        try:
            log = Log.open(os.path.join(root, LOG_DIR), durability=level.log_level, rpo_ms=level.rpo_ms or None,
                           segment_bytes=segment_bytes, recovery=recovery, preallocate=preallocate,
                           on_sealed_segment=replayer.sealed, keep_through=saved.applied_lsn if saved else 0,
                           _store_log=True)
        except BaseException:
            replayer.abandon()
            raise
        try:
            replayer.join()
            state = replayer.open_state()
            try:
                _check_sealed_marker(root, state, sealing, writable=True)
            except BaseException:
                state.close()
                raise
            # LMDB creates state/ and its files but never fsyncs a directory: make the names
            # durable before a checkpoint can delete the log segments they stand in for.
            fsync_dir(state.path)
            fsync_dir(root)
        except BaseException:
            replayer.abandon()
            log.close()
            raise
        try:
            store = cls(root, log, state, level, **common)  # type: ignore[arg-type]
        except BaseException:  # closed with the error: a store that failed to open leaves its directory unlocked
            replayer.abandon()
            log.close()
            raise
        _remove_archive_spools(root)  # under the log's lock: no other process is writing one
        if not cls._object_archive:
            store._unshipped_from = _unshipped_from(root)
        if sealing is not None:
            sealing.attach(store)
        store._recovery_mode = recovery
        _open_stores.add(store)
        try:
            store._replay(replayer, started)
        except BaseException:
            replayer.abandon()
            log.close()
            raise
        # Recorded for operators (`agentwal info`): the level is chosen per open, not stored elsewhere.
        state.meta_put(b"writer", json.dumps({"durability": level.level, "rpo_ms": level.rpo_ms,
                                              "pid": os.getpid(), "opened_unix_ms": _now_ms()}).encode())
        store._thread = threading.Thread(target=store._materializer, name=f"agentwal-apply:{root}", daemon=True)
        store._thread.start()
        return store

    def _replay(self, replayer: Replay, started: float) -> None:
        """Replay (applied_lsn, last LSN] of the log into LMDB: what the open's replay thread
        has not yet (wal/store/replay.py), after the checks that the state and the log agree."""
        assert self._log is not None
        report = self._log.recovery_report
        applied = self._state.applied_lsn()
        last = report.last_lsn
        if applied > last:
            raise CorruptionError(
                f"the state in {self._path} reflects LSN {applied} but the log ends at LSN {last}: the log lost "
                "records the state was built from (was it truncated or replaced?). Invariant I1 says this "
                "cannot happen through agentwal; restore the log, or move state/ aside to rebuild it from the log.",
                lsn=last + 1, reason="state ahead of log",
            )
        seen = self._state.durable_seen()
        if seen > last:
            if self._recovery_mode != "truncate":
                raise CorruptionError(
                    f"the log in {self._path} ends at LSN {last}, but LSNs up to {seen} were durable in it when "
                    "the state was last updated: records were lost from the log (its tail zeroed or cut?). "
                    "The log was not changed. Open with recovery='truncate' to accept the loss of LSNs "
                    f"{last + 1}..{seen}.",
                    lsn=last + 1, reason="log behind durable mark",
                )
            _logger.warning("recovery='truncate': %s lost LSNs %d..%d, which had been durable", self._path,
                           last + 1, seen)
            self._state.meta_put(DURABLE_SEEN_KEY, last.to_bytes(8, "little"))
            self._recovery["lost_durable_lsns"] = (last + 1, seen)
        first = self._log.first_lsn
        if applied + 1 < first and last > applied:
            raise CorruptionError(
                f"the state in {self._path} reflects LSN {applied} but the log starts at LSN {first}: "
                f"segments holding LSNs {applied + 1}..{first - 1} are missing",
                lsn=applied + 1, reason="missing segments",
            )
        if last >= replayer.next_lsn:
            replayer.feed(self._log.read_spans(replayer.next_lsn), durable=self._log.watermarks.durable)
        replayer.finish()
        self._applied = self._state.applied_lsn()
        self._checkpointed_lsn = max(0, last - report.records)  # below the log's first LSN
        self._appended_at_checkpoint = last
        self._recovery.update({
            "recovery_seconds": time.monotonic() - started,
            "records_replayed": replayer.replayed,
            "state_restored": int(self._state.restored),
            "log_scan_seconds": report.seconds,
        })
        _logger.info("opened store %s: replayed %d record(s) into the state (applied LSN %d) in %.3f s",
                     self._path, replayer.replayed, self._applied, self._recovery["recovery_seconds"])

    # ---- guards --------------------------------------------------------------------------------

    def _usable(self) -> None:
        if self._forked:
            raise LockedError(
                f"this Store of {self._path} was opened by process {self._pid}; a forked child cannot use it. "
                "Open the store again in the child (it gets LockedError while the parent holds it)."
            )
        if self._closed:
            raise ClosedError(self._closed_because or f"the store in {self._path} is closed")

    def _writable(self) -> Log:
        self._usable()
        if self._log is None:
            raise ReadOnlyError(f"the store in {self._path} was opened read-only")
        if self._failure is not None:
            raise FailedError(f"the store in {self._path} stopped after a failure ({self._failure}); "
                              "reopen it to recover every acknowledged commit") from self._failure
        return self._log

    # ---- reads ---------------------------------------------------------------------------------

    def _visible_lsn(self) -> int:
        """Highest LSN acknowledged under the store's level (see the module docstring): durable
        at sync, written at interval, appended at buffered. Read in C (Log.watermarks costs a
        cffi allocation and a named tuple, ~1 us, as much as the rest of a get)."""
        assert self._log is not None
        return self._core.visible_lsn()

    def _lookup(self, key: bytes, newest: bool, *, value: bool = True) -> tuple[int, bytes | None] | None:
        """(version, value or None if deleted) of key, or None if never written / unknown.
        `newest`: acknowledged or not (else as of what is acknowledged). `value`: the caller
        reads the value, not only the version and whether it is a delete; the newest version's
        value may be a sealed put's envelope still being encrypted (Core.overlay_newest waits
        for it, up to an fdatasync), which a caller holding the commit lock must not wait for."""
        if self._log is not None:
            found = (self._core.overlay_newest(key) if newest and value  # the newest, its value whole
                     else self._core.overlay_get(key, None))  # the newest, acknowledged or not
            if found is not None and not newest:
                # Returned only if acknowledged by a watermark read after the look (so by now);
                # else the newest version at or below that watermark, looked up after it.
                limit = self._visible_lsn()
                if found[0] > limit:
                    found = self._core.overlay_get(key, limit)
            if found is not None:
                return found
        # No version in the overlay (then every acknowledged one is in LMDB: a version leaves
        # the overlay only once applied), or none acknowledged yet: LMDB holds the newest
        # applied one, and applied <= durable, so it is acknowledged at every level. The
        # common reads -- a key not written lately, or whose newest write is acknowledged --
        # take no watermark or one, and look the key up once.
        return self._state.get(key)

    @overload
    def get(self, key: bytes | str, default: None = None) -> bytes | None: ...
    @overload
    def get(self, key: bytes | str, default: bytes) -> bytes: ...

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        """The value of key, or `default`. Sees the caller's own acknowledged commits."""
        self._usable()
        found = self._lookup(_key(key), newest=False)
        if found is None or found[1] is None:
            return default
        return found[1]

    def version(self, key: bytes | str) -> int | None:
        """LSN of the commit that last wrote key, or None if it does not exist."""
        self._usable()
        found = self._lookup(_key(key), newest=False)
        return found[0] if found is not None and found[1] is not None else None

    def _latest(self, key: bytes, default: bytes | None) -> bytes | None:
        found = self._lookup(key, newest=True)
        return default if found is None or found[1] is None else found[1]

    def get_many(self, keys: Sequence[bytes | str], default: bytes | None = None) -> list[bytes | None]:
        """The values of `keys` (`default` for absent ones), in the order given, all of one
        instant: one LMDB read transaction and one visible LSN (wal/store/snapshot.py)."""
        self._usable()
        refuse_lone_key(keys)
        values: list[bytes | None] | None = None
        if type(keys) in (list, tuple):  # a list or tuple of bytes goes to C as it is
            values = self._core.get_many(keys, default)  # type: ignore[arg-type]
        if values is None:  # str keys, another iterable, or keys C declined: as bytes, in one call
            ks = [_key(k) for k in keys]
            values = self._core.get_many(ks, default)
            if values is None:  # declined again (an error to classify): from one snapshot, so of one instant
                with self.snapshot() as snap:
                    values = [snap.get(k, default) for k in ks]
        return values

    def snapshot(self) -> Snapshot:
        """A consistent view of the store as of its visible LSN (`Snapshot.lsn`): get, version,
        get_many and scan see exactly the commits acknowledged up to it, whatever is committed
        meanwhile. A context manager; close it when done (wal/store/snapshot.py: what it holds)."""
        self._usable()
        taken = self._core.snapshot()
        if taken is None:
            self._state.applied_lsn()  # raises what made the C path decline
            raise ClosedError(f"the store in {self._path} is closed")
        txn, lsn, over = taken
        return Snapshot(self, txn, lsn, over, _key)

    def scan(self, prefix: bytes | str = b"") -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs whose key starts with prefix, in key order.

        A snapshot: the iteration sees exactly the commits acknowledged when the call was made
        (wal/store/snapshot.py), all of a transaction or none of it. An iterator not run to its end
        holds an LMDB read transaction until it is closed or dropped.
        """
        self._usable()
        p = _key(prefix, allow_empty=True)
        for _ in range(2):
            begun = self._core.scan_begin(p, _SCAN_FIRST)
            if begun is not None:
                break
            # The C path declined: the same read here raises the error that made it decline
            # (damage, a closed state); if it does not, the cause was passing, so try again.
            self._state.scan_chunk(p, None, _SCAN_FIRST)  # what scan_begin read first
        else:
            raise StateError(f"scanning {p!r} in the store in {self._path} failed twice without an error; retry")
        first, rest, over = begun
        if rest is None and over is None:
            return iter(first)  # the common case: every entry in one call, nothing to merge
        if over is None:
            return lmdb_only(rest, self._state.path, p, first)
        return merged(rest if rest is not None else _Ended(), self._state.path, p, first,
                      first_limit=_SCAN_FIRST, over=over)

    # ---- writes --------------------------------------------------------------------------------

    # Single puts and deletes at the store's level first try the C commit path (one call: the
    # record, the append, the overlay entry, the apply queue, the wait). It answers 0 when it
    # did nothing and the Python path must decide: a key or value that is not plain bytes, a
    # busy commit lock, back-pressure, a closed or failed store. put and delete spell the
    # fast path out rather than share a helper: a Python call is ~5% of a buffered put.

    def put(self, key: bytes | str, value: bytes, *, durability: str | None = None) -> int:
        """Commit key=value; returns the commit's LSN once its durability level holds."""
        if durability is None:
            lsn: int = self._commit_fast(record.OP_PUT, key, value, False)
            if lsn > 0:
                return lsn
            if lsn < 0:
                self._fast_wait_failed()
        txn, payload = _one_op(record.OP_PUT, _key(key), _value(value))
        return self._commit(txn, _NO_CHECKS, durability, payload)[0]

    def delete(self, key: bytes | str, *, durability: str | None = None) -> int:
        """Commit the deletion of key (a no-op delete still commits); returns the LSN."""
        if durability is None:
            lsn: int = self._commit_fast(record.OP_DELETE, key, None, False)
            if lsn > 0:
                return lsn
            if lsn < 0:
                self._fast_wait_failed()
        txn, payload = _one_op(record.OP_DELETE, _key(key), None)
        return self._commit(txn, _NO_CHECKS, durability, payload)[0]

    async def aput(self, key: bytes | str, value: bytes, *, durability: str | None = None) -> int:
        """`put` for asyncio: never blocks the event loop.

        Cancelled (task.cancel(), a timeout): the put either took effect before the
        CancelledError reaches the caller -- a cancellation that arrives once the commit has
        its LSN waits, shielded, for the commit's level and is raised after it -- or, when the
        cancellation came before that (while waiting for back-pressure to ease), never will.
        Either way the store holds what the caller can learn by reading after the error.
        At `replicated` the level is the archive's too: while the object store is down, a
        cancelled aput waits for it to hold the commit, for the store to close (FailedError,
        naming the LSN not shipped) or to be fenced, as a thread's put does."""
        return await self._commit_one_async(record.OP_PUT, key, value, durability)

    async def adelete(self, key: bytes | str, *, durability: str | None = None) -> int:
        """`delete` for asyncio; cancellation as for `aput`: done before the CancelledError, or never."""
        return await self._commit_one_async(record.OP_DELETE, key, None, durability)

    async def _commit_one_async(self, kind: int, key: bytes | str, value: bytes | None,
                                durability: str | None) -> int:
        if durability is None and (lsn := self._commit_fast(kind, key, value, True)) > 0:
            await self._acknowledged_async(lsn, None)
            return lsn
        txn, payload = _one_op(kind, _key(key), _value(value) if kind == record.OP_PUT else None)
        return (await self._commit_async(txn, _NO_CHECKS, durability, payload))[0]

    def _fast_wait_failed(self) -> NoReturn:
        """A C-path commit is in the log but waiting for its level failed. A log that fails
        stays failed (I5) and a closed one stays closed, so waiting again through the log
        reports the failure with the log's own detail."""
        assert self._log is not None
        try:
            self._log.wait(self._log.watermarks.appended)
        except FailedError as exc:
            self._failed(exc)
            raise
        raise FailedError(f"a commit to the store in {self._path} failed while waiting for its durability level")

    def transaction(self, durability: str | None = None, idempotency_key: bytes | str | None = None, *,
                    serializable: bool = False) -> Transaction:
        """An atomic transaction (a context manager). durability may be stronger than the store's.

        idempotency_key: a second commit with the same key returns the first commit's LSN and
        applies nothing; keys are remembered for `idempotency_ttl_s` (default 24 h). Bytes or str
        of 1..511 bytes (UTF-8), as a key (FORMAT.md); a longer one is `RecordTooLargeError`.
        serializable: also check, at commit, that no key read through the transaction changed
        (`Transaction` says what each read sees).
        """
        self._writable()
        self._durability.allows(durability)
        idem = _key(idempotency_key, what="idempotency key") if idempotency_key is not None else None
        return Transaction(self, durability, idem, serializable)

    def atransaction(self, durability: str | None = None, idempotency_key: bytes | str | None = None, *,
                     serializable: bool = False) -> Transaction:
        """The same transaction, for ``async with``: committing never blocks the event loop.

        Cancellation: a cancellation inside the block aborts the transaction (nothing is
        written). One during the commit at the block's end (``__aexit__``) either came before
        the commit took its LSN -- then it never takes effect -- or after, and then the commit
        is awaited to its level before the CancelledError is raised: a caller who gets
        CancelledError can read the store to learn which, and never sees the commit appear later."""
        return self.transaction(durability, idempotency_key, serializable=serializable)

    def update(self, key: bytes | str, fn: Callable[[bytes | None], bytes | None], *,
               durability: str | None = None, retries: int = 100) -> tuple[int, bytes | None]:
        """Read-modify-write of one key: commit ``fn(current value or None)`` (bytes to put, None
        to delete) only if the key is still at the version `fn` was given; on a conflict, read
        again and call `fn` again, at most `retries` times. Returns (LSN, the value written).

        `fn` sees the newest version, a commit still in flight included (`Transaction` says why
        that is safe), so concurrent updates of one key share fdatasyncs instead of waiting for
        each other's, and each retry follows a commit that got in first: it never spins. `fn`
        must be free of side effects (it may be called more than once). ConflictError once
        `retries` is exceeded."""
        k = _key(key)
        _update_fn(fn)
        for _ in range(_retries(retries) + 1):
            txn, checks, new = self._update_step(k, fn)
            try:
                return self._commit(txn, checks, durability, wait_visible=False)[0], new
            except ConflictError:
                continue
        raise _gave_up(k, retries)

    async def aupdate(self, key: bytes | str, fn: Callable[[bytes | None], bytes | None], *,
                      durability: str | None = None, retries: int = 100) -> tuple[int, bytes | None]:
        """`update` for asyncio: never blocks the event loop."""
        k = _key(key)
        _update_fn(fn)
        for _ in range(_retries(retries) + 1):
            txn, checks, new = self._update_step(k, fn)
            try:
                return (await self._commit_async(txn, checks, durability, wait_visible=False))[0], new
            except ConflictError:
                continue
        raise _gave_up(k, retries)

    def _update_step(self, key: bytes, fn: Callable[[bytes | None], bytes | None]
                     ) -> tuple[record.Txn, dict[bytes, int], bytes | None]:
        """One attempt of `update`: the newest version of key (in flight included), fn's result,
        and the one-op transaction with its if_version check."""
        self._writable()
        found = self._lookup(key, newest=True)
        current = found[1] if found is not None else None
        version = found[0] if found is not None and current is not None else 0
        new = fn(current)
        op: record.Op = (record.OP_PUT, key, _value(new)) if new is not None else (record.OP_DELETE, key, None)
        return record.Txn([op], _now_ms(), None), {key: version}, new

    def _prior_commit(self, idem: bytes) -> int | None:
        lsn = self._idem_pending.get(idem)
        if lsn is not None:
            return lsn
        found = self._state.idempotency(idem)
        if found is not None and found[1] + self._idem_ttl_ms >= _now_ms():
            return found[0]
        return None

    def _validate(self, checks: dict[bytes, int]) -> None:
        for key, expected in checks.items():
            found = self._lookup(key, newest=True, value=False)  # under the commit lock: never waits
            actual = found[0] if found is not None and found[1] is not None else None
            if (actual or 0) != expected:
                self._counters["conflicts"] += 1
                raise ConflictError(
                    f"conflict on key {key!r}: the transaction expected version {expected or 'absent'} (its "
                    f"if_version, or the version a serializable transaction read), and the key is at "
                    f"{actual if actual is not None else 'absent'}; re-read the key and retry",
                    key=key, expected=expected, actual=actual, conflicting_lsn=found[0] if found else None,
                )

    def _until_visible(self, lsn: int | None) -> None:
        """Wait until commit `lsn` is acknowledged at the store's level, so that a caller told of a
        conflict with it sees it on its next read (a loop of get/version, then if_version, then
        makes progress on every retry instead of spinning on a version it cannot yet read). A
        failure of that commit is reported by the caller's next commit, not here."""
        if lsn is not None and self._log is not None and lsn > self._visible_lsn():
            with contextlib.suppress(WalError):
                self._log.wait(lsn)

    def _try_commit(self, log: Log, txn: record.Txn, payload: bytes, checks: dict[bytes, int],
                    durability: str | None, *, for_async: bool) -> tuple[int, bool] | None:
        """The ordered, in-memory part of a commit, under the commit lock (no I/O, no blocking):
        an earlier commit with the same idempotency key, or validation + LSN + overlay entry.
        Returns (lsn, deduplicated), or None when the log pushes back (wait, then try again)."""
        with self._commit_lock:
            if self._failure is not None or self._closed:
                self._writable()  # raises
            idem = txn.idempotency_key
            if idem is not None:
                prior = self._prior_commit(idem)
                if prior is not None:
                    self._counters["idempotent_hits"] += 1
                    return prior, True
            if checks:
                self._validate(checks)
            lsn = log.enqueue(payload, durability=durability, block=False, for_async=for_async)
            if lsn is None:
                return None
            # Into the overlay (visible to validation now, and to reads once acknowledged: see
            # _lookup) and the apply queue; the core also counts the bytes toward a checkpoint
            # and wakes the materializer when due.
            self._core.enqueue_txn(lsn, txn, len(payload))
            if idem is not None:
                self._idem_pending[idem] = lsn
            return lsn, False

    def _failed(self, exc: FailedError) -> None:
        """I5: the log stopped; the store refuses writes from now on (reads keep working)."""
        self._log_failure(exc)
        self._fail_stop(exc)

    def _fail_stop(self, exc: BaseException) -> None:
        self._failure = exc
        self._core.disable()  # from now on every commit takes the Python path, which refuses it

    def _commit(self, txn: record.Txn, checks: dict[bytes, int], durability: str | None,
                payload: bytes | None = None, *, wait_visible: bool = True) -> tuple[int, bool]:
        """wait_visible: on a ConflictError, first wait until the conflicting commit is
        acknowledged (`_until_visible`); `update`, which reads in-flight versions, need not."""
        log = self._writable()
        level = self._durability.code if durability is None else self._durability.allows(durability)
        if payload is None:
            payload = _encode(txn)
        if len(self._core) > self._unapplied_limit:
            self._help_apply()  # the materializer fell behind: help it (bounded memory and space)
        try:
            while (done := self._try_commit(log, txn, payload, checks, durability, for_async=False)) is None:
                # Back-pressure: wait outside the lock for the log to catch up, then revalidate.
                log.wait_admitted(len(payload))
        except ConflictError as exc:
            if wait_visible:
                self._until_visible(exc.conflicting_lsn)
            raise
        try:
            if level != _BUFFERED:  # buffered: acknowledged once queued
                log.wait(done[0], durability=durability)
        except FailedError as exc:
            self._failed(exc)
            raise
        return done

    async def _commit_async(self, txn: record.Txn, checks: dict[bytes, int], durability: str | None,
                            payload: bytes | None = None, *, wait_visible: bool = True) -> tuple[int, bool]:
        log = self._writable()
        self._durability.allows(durability)
        if payload is None:
            payload = _encode(txn)
        if len(self._core) > self._unapplied_limit and not self._async_helping:
            # The materializer fell behind: help it, as _commit does, in a worker thread (an LMDB
            # transaction must not run on the event loop). One such helper at a time: the
            # applies run one after another anyway, and a helper per waiting task would fill
            # the default executor that other to_thread calls share.
            self._async_helping = True
            try:
                await asyncio.to_thread(self._help_apply)
            finally:
                self._async_helping = False
        # The commit lock is only held for in-memory work, so taking it here does not stall the loop.
        try:
            while (done := self._try_commit(log, txn, payload, checks, durability, for_async=True)) is None:
                await log.progress_async()
        except ConflictError as exc:
            # As _commit: raised once the conflicting commit is acknowledged (_until_visible).
            lsn = exc.conflicting_lsn
            if wait_visible and lsn is not None and lsn > self._visible_lsn():
                with contextlib.suppress(WalError):
                    await log.wait_async(lsn)
            raise
        await self._acknowledged_async(done[0], durability)
        return done

    async def _acknowledged_async(self, lsn: int, durability: str | None) -> None:
        """Await the level for a commit already in the log (it has its LSN and will be written
        whatever the caller does now).

        Cancellation contract: a cancellation that arrives here does not abandon the wait, since
        the commit would then take effect after the caller had its CancelledError (and a caller
        who retries would commit twice). The wait goes on, shielded, until the commit is
        acknowledged (or the log fails), and then the CancelledError is raised: the caller
        that sees it knows the commit took effect. A failure of the log wins over the
        cancellation (FailedError: the outcome is unknown, as without a cancellation)."""
        assert self._log is not None
        # Awaited directly, not through a Task of its own (a Task and an asyncio.wait per
        # commit made 1,000 committing tasks 3x slower): a cancellation cancels only the
        # log's future for this wait, and the loop registers a new one.
        cancelled: asyncio.CancelledError | None = None
        while True:
            try:
                await self._log.wait_async(lsn, durability=durability)
                break
            except asyncio.CancelledError as exc:
                cancelled = cancelled or exc  # keep waiting: the commit is already in the log
            except FailedError as exc:
                self._failed(exc)
                raise
        if cancelled is not None:
            raise cancelled

    # ---- materializer --------------------------------------------------------------------------

    def _apply_ready(self, limit: int = _APPLY_BATCH_RECORDS, *, background: bool = False) -> int:
        """Apply queued commits with LSN <= durable_lsn to LMDB in one transaction; returns how many.

        background: the LMDB transaction runs at the lowest CPU priority (`State.apply`); the
        materializer asks for it while the queue is short, committers helping with a backlog
        never do."""
        assert self._log is not None
        with self._apply_lock:
            self._state_held()
            # A batch whose apply failed is out of the apply queue, so it is kept and applied
            # again before anything is taken after it: the state never gets a gap (I3), and a
            # full disk (NoSpaceError: LMDB aborted the transaction, nothing of it is in the
            # state) only delays the apply until space returns.
            batch = self._unapplied_batch
            if batch is None:
                durable = self._apply_limit_lsn()
                with self._commit_lock:
                    batch = self._core.take(durable, limit)  # collapsed to each key's last write, in C
                if batch is None:
                    return 0
            try:
                self._applied = self._state.apply(batch, self._apply_limit_lsn, background=background)
            except BaseException as exc:
                self._unapplied_batch = batch
                if not _retryable(exc):  # anything else stops writes (reads keep working)
                    self._log_failure(exc)
                    self._fail_stop(exc)
                raise
            self._unapplied_batch = None
            _, _, commits, puts, deletes, idempotency = batch
            with self._commit_lock:
                self._core.prune(self._applied, puts, deletes)
                for key, lsn, _ in idempotency:
                    if self._idem_pending.get(key) == lsn:
                        del self._idem_pending[key]
            self._counters["apply_batches"] += 1
            self._counters["applied_commits"] += commits
            return commits

    def _help_apply(self) -> None:
        """A committer's share when max_unapplied commits wait: one batch applied, and the checkpoint
        that may then be due -- behind the apply lock, so behind a checkpoint in progress. This is
        the state's back-pressure on commits (module docstring, "Space"), counted in stats()."""
        started = time.monotonic()
        self._apply_ready(self._batch_limit)
        self._checkpoint_if_due()
        self._counters["state_backpressure_waits"] += 1
        self._backpressure_s += time.monotonic() - started

    def _materializer(self) -> None:
        while not self._stop:
            self._wake.wait(self._next_wait())
            self._wake.clear()
            if self._stop:
                break
            try:
                # Again at once only while a full batch shows a backlog: looping until nothing is
                # left would chase each fdatasync with a tiny LMDB transaction, taking the GIL and
                # CPU from the committers. One batch per interval otherwise.
                # At the lowest CPU priority, in batches of at most _BACKGROUND_BATCH_RECORDS,
                # while the queue is short: committers woken meanwhile then run first
                # (docs/performance.md), and a starved apply holds the apply lock (which helping committers,
                # checkpoints and close wait for) for one small batch. Not once a backlog builds,
                # which a starved low-priority apply would only let grow.
                # A checkpoint is considered after every batch (space: module docstring).
                while True:
                    background = len(self._core) <= self._unapplied_limit // 4
                    limit = min(_BACKGROUND_BATCH_RECORDS if background else _APPLY_BATCH_RECORDS, self._batch_limit)
                    applied = self._apply_ready(limit, background=background)
                    self._checkpoint_if_due()
                    if applied < limit:
                        break
                self._check_fsync_latency()
                self._stalled(None)
            except (NoSpaceError, StorageError, ReadersFullError) as exc:
                if not _retryable(exc):
                    self._log_failure(exc)
                    self._fail_stop(exc)
                    return
                self._stalled(exc)  # wait and retry: the store goes on once the host has room again
                # Back off (up to a second, not woken by commits, each of which sets _wake), so a
                # full disk is not hammered with transactions that cannot commit.
                until = time.monotonic() + min(1.0, self._apply_interval * (1 << min(self._stall_rounds, 6)))
                while not self._stop and time.monotonic() < until:
                    time.sleep(0.02)
            except FailedError as exc:
                self._log_failure(exc)
                return  # the log stopped; commits already report it
            except BaseException as exc:  # LMDB error: stop writes (fail-stop), keep reads working
                self._log_failure(exc)
                self._fail_stop(exc)
                return

    def _next_wait(self) -> float:
        """How long the materializer sleeps: `apply_interval_ms` while there is work, and once a
        store has had none for _IDLE_AFTER_ROUNDS rounds, _IDLE_WAIT_S -- woken at once by the next
        queued commit (the core's `idle` flag, native/storecore.c). A thousand idle stores in one
        process then cost a thousand wake-ups a second, not fifty thousand."""
        if len(self._core) or self._unapplied_batch is not None or self._stall is not None:
            self._idle_rounds = 0
            return self._apply_interval
        self._idle_rounds += 1
        if self._idle_rounds < _IDLE_AFTER_ROUNDS:
            return self._apply_interval
        self._core.idle = True
        if len(self._core):  # a commit queued before the flag was up: it did not wake us
            self._core.idle = False
            return self._apply_interval
        return _IDLE_WAIT_S

    def _stalled(self, exc: BaseException | None) -> None:
        """Observability of a host shortage under the state: a WARNING when applies or checkpoints
        start failing for lack of space, descriptors or reader slots (they are retried, with
        back-off up to a second), an
        INFO when they go through again. stats()["state_stalled"] holds the error meanwhile."""
        if exc is None:
            if self._stall is not None:
                _logger.info("store %s: the state applies again after %d failed attempt(s)", self._path,
                             self._stall_rounds)
                self._stall, self._stall_rounds = None, 0
            return
        if self._stall is None:
            _logger.warning("store %s: the state cannot be written (%s); commits still go to the log while it "
                            "has room, and the apply is retried until the host has room again", self._path, exc)
        self._stall = exc
        self._stall_rounds += 1
        self._counters["state_stalls"] += 1

    def _log_failure(self, exc: BaseException) -> None:
        """Observability: one ERROR when the store fail-stops (I5), however many commits then see it."""
        if not getattr(self, "_failure_logged", False):
            self._failure_logged = True
            _logger.error("store %s stopped after a failure and refuses writes until reopened "
                          "(reopening replays the log): %s", self._path, exc)

    def _check_fsync_latency(self) -> None:
        """Observability: WARNING when the slowest fdatasync grew past `slow_fsync_ms` (looked at ~1/s)."""
        now = time.monotonic()
        if self._log is None or now - self._fsync_checked_at < 1.0:
            return
        self._fsync_checked_at = now
        worst = float(self._log.stats().get("fsync_ms_max", 0.0))
        if worst > self._fsync_ms_seen and worst >= self.slow_fsync_ms:
            self._counters["slow_fsyncs"] += 1
            _logger.warning("slow fdatasync in %s: %.1f ms (threshold slow_fsync_ms=%.0f); commits at level "
                            "'sync' waited that long", self._path, worst, self.slow_fsync_ms)
        self._fsync_ms_seen = max(self._fsync_ms_seen, worst)

    # ---- checkpoints -------------------------------------------------------------------------------

    def checkpoint(self) -> int:
        """Make the state durable at applied_lsn and let go of the log segments below it; returns it."""
        self._writable()
        return self._checkpoint(sync_log=True)

    def _space_bound(self, used_bytes: int) -> int:
        """Bytes of state pages freed, or of log written, since the last checkpoint at which the
        next is due (module docstring, "Space")."""
        return min(self._checkpoint_bytes, max(_SPACE_MIN_BYTES, used_bytes // _SPACE_FRACTION))

    def _checkpoint_due(self) -> str | None:
        """Why an automatic checkpoint is due now ("space": the state's pages freed since the last
        one; "log": the log written, or applied, since), or None. Reads the state's free list (a short read)."""
        space = self._state.space()
        bound = self._space_bound(space["state_used_bytes"])
        if space["state_pinned_free_bytes"] >= bound:
            return "space"
        if self._core.bytes_since_checkpoint >= bound:
            return "log"
        # Or once the log a checkpoint would let go of now reaches it: a checkpoint taken with a
        # long queue (as under a sustained load) keeps that queue's log, and a load that stopped
        # right after it wrote too little since for the rule above: the queue's segments stayed
        # until the next write. Estimated from the mean commit size; as often as the rule above.
        appended = self._log.watermarks.appended if self._log is not None else 0
        commits = appended - self._appended_at_checkpoint
        mean = self._core.bytes_since_checkpoint / commits if commits > 0 else self._mean_commit_bytes
        if (self._applied - self._checkpointed_lsn) * mean >= bound:
            return "log"
        return None

    def _limit_unapplied(self) -> None:
        """Bound the apply queue to about one space bound of log bytes (every unapplied record keeps
        its segment), from the mean commit size since the last checkpoint; the caller's
        max_unapplied stays the upper bound. And an apply batch to about one bound of pages.
        Called at each checkpoint (apply lock held)."""
        assert self._log is not None
        appended = self._log.watermarks.appended
        commits = appended - self._appended_at_checkpoint
        self._appended_at_checkpoint = appended
        if commits <= 0 or self._core.bytes_since_checkpoint <= 0:
            return
        mean = self._mean_commit_bytes = self._core.bytes_since_checkpoint / commits
        bound = self._space_bound(self._state.space()["state_used_bytes"])
        limit = min(self._max_unapplied, max(_MIN_UNAPPLIED, int(bound / mean)))
        self._unapplied_limit = self._core.max_unapplied = limit
        # A record may dirty a page of its own: a batch stays within the bound, which is checked
        # between batches (a small store's bound is smaller than a full batch's pages).
        self._batch_limit = max(_MIN_BATCH_RECORDS, min(_APPLY_BATCH_RECORDS, bound // _PAGE_BYTES))

    def _checkpoint_if_due(self) -> bool:
        """Take an automatic checkpoint if `_checkpoint_due`, at the state as applied (without
        waiting for the apply queue to empty, which a sustained load never lets it). A failure
        stops the store's writes (fail-stop), as a failed apply does."""
        with self._apply_lock:
            self._state_held()  # closed meanwhile: ClosedError, never a failure of the store
            if self._failure is not None or (due := self._checkpoint_due()) is None:
                return False
            self._checkpoint_or_stop()
            self._counters["auto_checkpoints"] += 1
            if due == "space":
                self._counters["space_checkpoints"] += 1
            return True

    def _checkpoint(self, *, sync_log: bool) -> int:
        assert self._log is not None
        if sync_log:
            self._log.sync()
        stuck: NoSpaceError | None = None
        try:
            while self._apply_ready():
                pass
        except NoSpaceError as exc:
            # A full disk: still checkpoint what is applied, which lets the log segments below
            # it go (the space a full disk needs most); then report it.
            stuck = exc
        with self._apply_lock:
            applied = self._checkpoint_or_stop()
        if stuck is not None:
            raise stuck
        return applied

    def _checkpoint_or_stop(self) -> int:
        """`_checkpoint_locked` (the caller holds the apply lock), whoever asked for it. A failure
        that does not wait for the host stops the store's writes (fail-stop): a failed fdatasync
        of the state is never retried, so no later checkpoint may rest on it. A full disk waits
        and retries (the materializer's stall)."""
        try:
            return self._checkpoint_locked()
        except BaseException as exc:
            if not _retryable(exc) and not isinstance(exc, ClosedError):
                self._log_failure(exc)
                self._fail_stop(exc)
            raise

    def _state_held(self) -> None:
        """With the apply lock held: ClosedError once close has let the state go."""
        if self._state_released:
            raise ClosedError(f"the store in {self._path} is closed")

    def _checkpoint_locked(self) -> int:
        """The checkpoint itself, at applied_lsn; the caller holds the apply lock."""
        assert self._log is not None
        self._state_held()
        applied = self._applied
        note = {"unix_ms": _now_ms(), "applied_lsn": applied}
        with contextlib.suppress(NoSpaceError):  # a note for operators, not worth failing for
            self._state.meta_put(b"checkpoint", json.dumps(note).encode())
        self._state.checkpoint()  # applied_lsn durable before any segment holding it goes
        with contextlib.suppress(NoSpaceError):  # housekeeping: retried at the next checkpoint
            self._state.expire_idempotency(_now_ms() - self._idem_ttl_ms)
        removed = self._log.remove_segments_before(self._removable_before(applied), self._archive)
        self._limit_unapplied()
        self._core.bytes_since_checkpoint = 0
        self._checkpointed_lsn = applied
        self._last_checkpoint = time.time()
        self._counters["checkpoints"] += 1
        self._counters["segments_removed"] += len(removed)
        self._checkpoint_note = note
        _logger.info("checkpoint of %s at applied LSN %d: %d segment(s) %s", self._path, applied, len(removed),
                     "archived" if self._archive else "removed")
        return applied

    def _sealed_log_bytes(self) -> int:
        """Bytes of the log's segments but the newest (the one being written)."""
        assert self._log is not None
        sizes = []
        for name in os.listdir(self._log.directory):
            if parse_segment_name(name) is not None:
                with contextlib.suppress(FileNotFoundError):
                    sizes.append((name, os.stat(os.path.join(self._log.directory, name)).st_size))
        return sum(size for _, size in sorted(sizes)[:-1])

    def _removable_before(self, applied: int) -> int:
        """Archive hook: segments wholly below this LSN may go at a checkpoint (an object archive
        keeps every segment it has not shipped yet: wal/archive/store.py; opened without it, a
        store that ships keeps them too: `_unshipped_from`)."""
        kept = self._unshipped_from
        return applied + 1 if kept is None else min(applied + 1, kept)

    def _record_sealing(self, sealed: dict[str, Any]) -> None:
        """Set the state's record of its sealing (`SEALED_KEY`) to STORE's "sealed" object
        `sealed`, durably: what an open with STORE lost is held to (`_check_sealed_marker`).
        For `agentwal rekey`, which retires keys from STORE while the store is open."""
        self._writable()
        with self._apply_lock:
            self._state_held()
            record_sealing(self._state, sealed)

    def _compact_state(self) -> dict[str, int]:
        """Give the state's free and half-empty pages back to the filesystem (`wal.store.state.compact`),
        after a checkpoint; returns the state file's size before and after. For `wal.ops.compact`
        (`agentwal compact`), which opens the store for this alone: the state is closed while it
        is swapped, so no read may run meanwhile. Commits may: they wait for the apply lock."""
        self._writable()
        self._checkpoint(sync_log=True)
        with self._apply_lock:
            before = self._state.space()
            try:
                self._state = compact(self._state)
            except BaseException:
                if self._state._pin is None:  # closed before the swap failed: the old state is in place
                    self._state = State(self._state.path)
                    self._core.bind_state(self._state.lmdb_env)
                raise
            self._core.bind_state(self._state.lmdb_env)  # reads in C go to the new environment
            after = self._state.space()
        _logger.info("compacted the state of %s: %d -> %d bytes", self._path, before["state_file_bytes"],
                     after["state_file_bytes"])
        return {"state_file_bytes_before": before["state_file_bytes"], "state_file_bytes": after["state_file_bytes"],
                "state_used_bytes_before": before["state_used_bytes"], "state_used_bytes": after["state_used_bytes"]}

    # ---- observing ---------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._path

    @property
    def watermarks(self) -> Watermarks:
        """(written_lsn, durable_lsn, applied_lsn); applied <= durable always (I1)."""
        self._usable()
        if self._log is None:
            applied = self._state.applied_lsn()
            return Watermarks(applied, applied, applied)
        marks = self._log.watermarks
        return Watermarks(marks.written, marks.durable, self._applied)

    def stats(self) -> dict[str, Any]:
        """Log counters (commits, fsyncs, group sizes, fsync latency, durable lag) and store ones."""
        self._usable()
        out: dict[str, Any] = self._log.stats() if self._log is not None else {}
        out.update(self._recovery)
        out.update(self._counters)
        out.update(self._state.stat())
        space = self._state.space()
        out.update(space)
        out["checkpoint_space_bound_bytes"] = self._space_bound(space["state_used_bytes"])
        out["state_backpressure_ms"] = self._backpressure_s * 1000
        last_checkpoint = self._checkpoint_note if self._log is not None else _meta_json(self._state, b"checkpoint")
        last_writer = _meta_json(self._state, b"writer")
        since: float | None = time.time() - self._last_checkpoint
        if self._log is None:  # a reader: the writer's level and checkpoint, as its notes give them
            unix_ms = (last_checkpoint or {}).get("unix_ms")
            since = time.time() - unix_ms / 1000 if isinstance(unix_ms, int | float) else None
        level = self._durability if self._log is not None else None
        out.update({
            "durability": level.level if level is not None else (last_writer or {}).get("durability"),
            "rpo_ms": level.rpo_ms if level is not None else (last_writer or {}).get("rpo_ms"),
            "applied_lsn": self._applied if self._log is not None else self._state.applied_lsn(),
            "unapplied_commits": len(self._core),
            "overlay_keys": self._core.overlay_keys,
            "seconds_since_checkpoint": since,
            "last_checkpoint": last_checkpoint,
            "last_writer": last_writer,
            "failed": str(self._failure) if self._failure is not None else out.get("failed"),
            "state_stalled": str(self._stall) if self._stall is not None else None,
        })
        return out

    # ---- closing -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Make every acknowledged commit durable, apply it, and release the directory. Idempotent."""
        if self._closed:
            return
        if self._forked:
            self._closed = True  # the parent owns the files, the lock and the LMDB handle
            return
        self._closed = True
        self._core.disable()
        self._core.close_reads()
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        _open_stores.discard(self)
        error: BaseException | None = None
        if self._log is not None:
            try:
                if self._failure is None:
                    self._log.sync()  # a failure here is the log's (fsync: I5; buffered commits lost)
            except BaseException as exc:
                error = exc
            try:
                # The state only saves work for the next open, which replays the log from the
                # last checkpoint: a full disk or an earlier failure here loses nothing, so it
                # is logged, not raised (close raises at most the failure already reported).
                # After a failure none is taken: the state's writes since the last checkpoint
                # may rest on a failed fdatasync, and the next open falls back to that one.
                if self._failure is not None:
                    raise FailedError(f"the store failed earlier ({self._failure})")
                while self._apply_ready():
                    pass
                with self._apply_lock:  # a checkpoint() of another thread may be under way
                    self._state_released = True
                    # Expired idempotency keys go at every checkpoint, this one too: a store used in
                    # short sessions (and a restored one) kept them all, and shipped them in every snapshot.
                    with contextlib.suppress(NoSpaceError):
                        self._state.expire_idempotency(_now_ms() - self._idem_ttl_ms)
                    with contextlib.suppress(WalError, OSError):  # the note `agentwal info` shows, never in the way
                        self._state.meta_put(b"checkpoint", json.dumps({"unix_ms": _now_ms(),
                                                                         "applied_lsn": self._applied}).encode())
                    self._state.checkpoint()  # the next open starts from here, crash or not
                    # The segments below it go once they hold what the automatic checkpoint's rule
                    # allows (`_space_bound`): a store used in short sessions, whose automatic
                    # checkpoint never ran, kept every one for good. Below the bound they stay,
                    # for `agentwal dump` and the next open's replay, which they cost nothing.
                    if self._sealed_log_bytes() >= self._space_bound(self._state.space()["state_used_bytes"]):
                        self._log.remove_segments_before(self._removable_before(self._applied), self._archive)
            except BaseException as exc:
                _logger.warning("closing store %s: the state was left at applied LSN %d (%s); the next open "
                                "replays the log from its last checkpoint", self._path, self._applied, exc)
            try:
                self._log.close()
            except BaseException as exc:
                error = error or exc
        try:
            with self._apply_lock:
                self._state_released = True
                self._state.close()
        except BaseException as exc:
            error = error or exc
        if error is not None:
            if isinstance(error, WalError):
                raise error
            if isinstance(error, OSError):
                raise storage_error(error, f"closing the store in {self._path}") from error
            raise FailedError(f"closing the store in {self._path}: {error}") from error

    def __enter__(self) -> Store:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self._log is None else self._durability.level
        return f"<wal.Store {self._path!r} {mode}{' closed' if self._closed else ''}>"


# The hot path: `store.put(key, value)` and `store.delete(key)` commit in C without entering the
# functions above (a third of a put at `buffered`); any other call form, and every commit the C
# path declines, runs them unchanged (storecore.FastCommit, native/storecore.c).
Store.put = storecore.FastCommit(Store.put, record.OP_PUT)  # type: ignore[method-assign]
Store.delete = storecore.FastCommit(Store.delete, record.OP_DELETE)  # type: ignore[method-assign]
# Reads likewise: `store.get(key[, default])`, `store.version(key)` and `store.get_many(keys[,
# default])` read in one C call (the overlay, else LMDB); the C path declines closed stores and
# odd keys (native/storecore.c).
Store.get = storecore.FastRead(Store.get, storecore.READ_VALUE)  # type: ignore[method-assign]
Store.version = storecore.FastRead(Store.version, storecore.READ_VERSION)  # type: ignore[method-assign]
Store.get_many = storecore.FastRead(Store.get_many, storecore.READ_MANY)  # type: ignore[method-assign]


class _Ended:
    """The transaction of a scan whose LMDB entries all came in its first call (already ended)."""

    def scan(self, db: int, prefix: bytes, after: bytes | None, limit: int, /) -> list[Any]:
        raise AssertionError("a scan read past its last LMDB entry")

    def abort(self) -> None:
        pass


def read_archive_status(root: str) -> dict[str, Any] | None:
    """The archive.json of the store at `root` as its shipper last wrote it, or None (none, or
    unreadable): what `agentwal archive status` and `agentwal info` show, and what
    `shipping_archive` reads."""
    try:
        with open(os.path.join(root, ARCHIVE_STATUS_FILE), encoding="utf-8") as f:
            status = json.load(f)
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def shipping_archive(root: str) -> tuple[str, int] | None:
    """(URL, archived LSN) of the object archive the store at `root` ships to, from its
    archive.json, or None: it never shipped, or it was fenced (another writer took the archive
    over, and this store never ships into it again)."""
    status = read_archive_status(root)
    if status is None or status.get("archive_fenced"):
        return None
    url, archived = status.get("archive_url"), status.get("archived_lsn")
    if not isinstance(url, str) or not isinstance(archived, int) or isinstance(archived, bool) or archived < 0:
        return None
    return url, archived


def _remove_archive_spools(root: str) -> None:
    """Delete the archive snapshots a process that died left waiting for their PUT (by any
    writer's open: the next one may never ship to that archive again)."""
    with contextlib.suppress(OSError):  # best effort: a file left over never stops an open
        for name in os.listdir(root):
            if name.startswith(ARCHIVE_SPOOL_PREFIX) and name.endswith(ARCHIVE_SPOOL_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(root, name))


def _unshipped_from(root: str) -> int | None:
    """For a local open: the first LSN the object archive this store ships to has not received,
    from its archive.json, or None (it never shipped, or it was fenced: another writer took the
    archive over, and this store will never ship into it again). Its log from there on is kept,
    so that the next open with the archive ships it and the archive stays gap-free (a
    checkpoint would otherwise remove segments the archive never had, and a restore to a point
    among them would be refused). The file is informational (written about once a second, not
    synced): an archived LSN it reports behind the real one keeps a little more log; one lost
    keeps nothing, as before the store first shipped."""
    shipping = shipping_archive(root)
    if shipping is None:
        return None
    url, archived = shipping
    _logger.warning("the store in %s ships to the object archive %s (its %s) but was opened without it: nothing "
                    "is shipped, and its log from LSN %d on is kept until it is opened with archive=%r again, "
                    "which ships it. To stop shipping to that archive for good, delete %s.", root, url,
                    ARCHIVE_STATUS_FILE, archived + 1, url, os.path.join(root, ARCHIVE_STATUS_FILE))
    return archived + 1


def _meta_json(state: State, key: bytes) -> dict[str, Any] | None:
    raw = state.meta_get(key)
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _write_store_file(root: str, meta: dict[str, Any] | None = None) -> None:
    """Write STORE (durably, by rename): `meta` with the current format and version (a sealed
    store's "sealed" object kept), or just those."""
    path = os.path.join(root, STORE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({**(meta or {}), "format": STORE_FORMAT, "version": STORE_VERSION}, f)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(root)


def _upgrade_store(root: str, found: int) -> None:
    """To the current version, before anything is written to the store.
    1 -> 2: the state, which version 1 synced at every LMDB commit, gets its first checkpoint
    (state/checkpoint.meta) before the STORE file moves on; from then on it is written unsynced.
    A crash in between leaves version 1 with a checkpoint file, which every version reads.
    2 -> 3: nothing but the STORE file: a version-2 state is a version-3 state that holds no
    split value (its `tail` database is created by the next writable open of the state), and
    STORE says 3 before the first one is written, so an agentwal that reads only 1 and 2, which
    would take a split value's flagged version for the version, refuses the store instead.
    3 -> 4: again the STORE file first; then the state's first writable open (right after this)
    gives every entry a checksum, flagged in its version (wal/store/state.py `_check_every_entry`),
    which an agentwal reading only 1-3 would misread: it refuses the store instead.
    4 -> 5: nothing but the STORE file (a store is sealed at its creation or never).
    5 -> 6: the STORE file first; then the state's open gives every idempotency entry a checksum
    (`_check_every_idem`), whose 20 bytes an agentwal reading only 1-5 would refuse as damage."""
    if found == 1:
        State(os.path.join(root, STATE_DIR), legacy_synced=True, check_entries=False).close()
    _write_store_file(root, read_meta(root))
    _logger.info("upgraded the store at %s to format version %d", root, STORE_VERSION)


def _check_sealed_marker(root: str, state: State, sealing: SealingPlan | None, *, writable: bool) -> None:
    """A store whose state says it is sealed (`SEALED_KEY`) but whose STORE file names no sealing
    is refused (it would open plain): it would serve its envelopes as values and take new values in
    the clear. A sealed store's writable open sets the mark (stores sealed before it existed get
    it then)."""
    mark = state.meta_get(SEALED_KEY)
    # STORE, not `sealing`: the operator tools open a sealed store without it on purpose, to
    # read its envelopes as stored (wal/ops/target.py, open_reader).
    sealed = (read_meta(root) or {}).get(STORE_FIELD)
    if mark is not None and not isinstance(sealed, dict):
        raise store_lost(root)
    recorded = parse_mark(mark)
    if recorded is not None and isinstance(sealed, dict) and (
            recorded["encrypted"] != bool(sealed.get("encrypted"))
            or (recorded["encrypted"] and not set(recorded["key_ids"]) & set(sealed.get("key_ids") or []))):
        # A STORE replaced by one that holds together but not with the state (an encrypted
        # store's said to be plain, or to be under other keys): it would open without the key.
        path = os.path.join(root, STORE_FILE)
        raise CorruptionError(
            f"{path} says the store is {'encrypted' if sealed.get('encrypted') else 'not encrypted'} (key ids "
            f"{', '.join(sealed.get('key_ids') or []) or 'none'}), but its state records that it is "
            f"{'encrypted' if recorded['encrypted'] else 'not encrypted'} (key ids "
            f"{', '.join(recorded['key_ids']) or 'none'}): STORE was replaced. Put back the STORE file from a copy of "
            "the store, or delete it and open the store with its options", path=path, reason="STORE damaged")
    if sealing is not None and writable and isinstance(sealed, dict) and mark != mark_for(sealed):
        record_sealing(state, sealed)  # durable now: a STORE lost after a power cut is recovered from it


def _make_store_file_current(root: str, sealing: SealingPlan | None = None) -> None:
    """Create the STORE file, or upgrade an older store (`_upgrade_store`), holding the log's lock;
    then a sealed store's fields (a new store sealed, a new key's id listed: `SealingPlan.before_open`).
    A new sealed store's STORE is written once, with its fields: a crash can never leave it plain."""
    if sealing is not None and not os.path.exists(os.path.join(root, STORE_FILE)):
        _write_store_file(root, sealing.before_open({}))
        return
    if sealing is None and not os.path.exists(os.path.join(root, STORE_FILE)):
        # STORE lost (a state is there): refused before a plain STORE is written, so the
        # owner's open with the store's options still finds none, unless the state is readable
        # and not marked sealed.
        mark = read_state_mark(root)
        if mark == UNREADABLE:
            path = os.path.join(root, STORE_FILE)
            raise CorruptionError(f"{path} is missing, and whether the store is sealed, which its state records, "
                                  "cannot be read now (a read-only open of the state is refused: it waits for a "
                                  "writable open's repair). Put back the STORE file from a copy of the store, or "
                                  "open it with its options (encryption=..., compression=...)",
                                  path=path, reason="STORE damaged")
        if mark is not None:
            raise store_lost(root)
    found = check_store_file(root, create=True)
    if found < STORE_VERSION:
        _upgrade_store(root, found)
    if sealing is not None:
        meta = read_meta(root) or {}
        wanted = sealing.before_open(meta)
        if wanted != meta:
            _write_store_file(root, wanted)
        sealing.after_store_written()


def _refuse_a_bare_log(root: str) -> None:
    """ArgumentError if `root` holds a bare log (`wal.Log.open`'s segment files or LOCK, and no
    STORE): a store made there would keep its own log in log/ and hide those records from every
    tool (a store's own log/ directory, given by mistake, is one too)."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return  # a new store (or the open's own clear error)
    except OSError as exc:
        raise storage_error(exc, f"listing {root}") from exc
    if LOCK_NAME in names or any(parse_segment_name(n) is not None for n in names):
        raise ArgumentError(f"{root} holds a bare log (segment files or a LOCK file, no {STORE_FILE} file), not a "
                            "store: open it with wal.Log.open, or give wal.open the store's own directory (or an "
                            "empty or new one)")


FOLLOWING_FILE = "FOLLOWING"  # in a follower's directory until it is promoted (FORMAT.md §14)


def following_archive(root: str) -> str | None:
    """The URL of the archive the store at `root` follows ("?" where its FOLLOWING file cannot
    be read), or None: it is not a follower's directory."""
    try:
        with open(os.path.join(root, FOLLOWING_FILE), encoding="utf-8") as f:
            return str(json.load(f).get("archive", "?"))
    except (FileNotFoundError, NotADirectoryError):  # no FOLLOWING file; root not a directory (said later)
        return None
    except (OSError, ValueError, AttributeError):
        return "?"


def _refuse_a_follower(root: str) -> None:
    """ArgumentError if `root` is a follower's directory (its FOLLOWING file): a commit made in
    it would be in no archive, and the follower would then refuse the directory for good."""
    url = following_archive(root)
    if url is None:
        return
    raise ArgumentError(f"{root} is the directory of a follower of the archive {url}: writing there would make "
                        "commits no archive holds. Promote it to write (wal.follow(...).promote(), or `agentwal "
                        "follow URL DIR --promote`), follow on, or open it with readonly=True to read")


def check_store_file(root: str, *, create: bool) -> int:
    """The STORE file names the store format and version (FORMAT.md, "Store layout"); returns the
    version (creating the file at the current one if `create` and it is missing)."""
    path = os.path.join(root, STORE_FILE)
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read(1 << 16))  # a real one is ~40 bytes
    except FileNotFoundError:
        if not create:
            raise FileNotFoundError(f"no agentwal store at {root} (no {STORE_FILE} file)") from None
        _write_store_file(root)
        return STORE_VERSION
    except OSError as exc:  # the file is there but cannot be read now (EMFILE, EACCES, EIO): not damage
        raise storage_error(exc, f"reading {path}") from exc
    except (ValueError, RecursionError) as exc:
        raise CorruptionError(f"{path} is unreadable ({exc}); it should hold the store's format version",
                              path=path, reason="bad store file") from exc
    if not isinstance(meta, dict) or meta.get("format") != STORE_FORMAT:
        raise CorruptionError(f"{path} does not describe an agentwal store: {meta!r:.200}", path=path,
                              reason="bad store file")
    version = meta.get("version")
    if version not in READABLE_STORE_VERSIONS or isinstance(version, bool):
        raise FormatVersionError(
            f"the store at {root} has format version {version!r}; this agentwal reads versions "
            f"{', '.join(map(str, READABLE_STORE_VERSIONS))}. Open it with the agentwal version that wrote it."
        )
    return int(version)


def open_local(path: str | os.PathLike[str], *, encryption: Any = None, compression: str | None = None,
               compression_threshold: int | None = None, compression_dict: Any = None, **options: Any) -> Store:
    """A store on this machine, without an object archive: `wal.open` for every `archive` but an
    object-store URL (wal/_open.py), and what the archive's own modules open (a follower's
    replica, a restored store). Options as `wal.open`'s; every failure is a WalError.

    encryption: a 32-byte key, keys (the current one first) or a key provider; compression:
    "zstd"; compression_threshold (bytes) and compression_dict (a trained zstd dictionary): a
    sealed store (wal/store/sealed.py, FORMAT.md §19)."""
    try:
        sealing = plan_sealing(os.fspath(path), readonly=bool(options.get("readonly")), encryption=encryption,
                               compression=compression, compression_threshold=compression_threshold,
                               compression_dict=compression_dict)
        cls = sealing.store_class(Store) if sealing is not None else Store
        return cls._open(path, sealing=sealing, **options)
    except WalError:
        raise
    except OSError as exc:
        where = os.fspath(path) if isinstance(path, str | os.PathLike) else repr(path)
        how = " read-only" if options.get("readonly") else ""
        raise storage_error(exc, f"opening the store in {where}{how}") from exc


def _close_at_exit() -> None:
    """A store never closed is closed at interpreter exit, with a ResourceWarning naming it (as
    an unclosed file warns; shown under `python -X dev` or `-W default`): its acknowledged
    commits are made durable and applied, and its directory released."""
    for store in list(_open_stores):
        if store._closed or store._forked or store._pid != os.getpid():
            continue
        warnings.warn(f"unclosed store {store!r}: closed at interpreter exit; close it (or use `with`)",
                      ResourceWarning, source=store, stacklevel=1)
        try:
            store.close()
        except WalError as exc:
            _logger.error("closing store %s at interpreter exit: %s", store._path, exc)


atexit.register(_close_at_exit)


_ = asyncio  # atransaction uses Transaction's async context methods
