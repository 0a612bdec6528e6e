"""The agent runtime layer: per-thread event streams and state, idempotent tool calls,
verified checkpoints with history, retention and content-addressed large-value blobs.

Everything here is built on one `wal.Store` and its transactions; nothing bypasses the
log, so every guarantee of the store's durability level (README, "Durability levels") holds for it. One
`AgentStore` is one *agent* namespace; inside it each *thread* (a conversation, a run)
owns its events, state values, checkpoints and tool calls.

Contracts
---------
* ``append(thread, event, state=...)`` commits the event and the state changes in **one**
  transaction. Sequence numbers start at 1 and are contiguous per thread even with
  concurrent appenders: each append checks the thread's record key with ``if_version``
  and retries on `wal.ConflictError`.
* ``begin_call`` makes the intent durable (``durability="sync"``, or the store's level where
  that is ``"replicated"``) before it returns, so
  a side effect started after it is never forgotten; ``end_call`` records the outcome.
  ``pending_calls()`` lists intents without outcome (after a crash: reconcile them).
  ``begin_call`` of a finished call returns the recorded outcome instead of
  re-registering it; call ids are unique within an agent namespace.
* ``save_checkpoint`` stores state bytes with a schema version, a configuration hash and
  their SHA-256; ``load_checkpoint`` recomputes the digest (mismatch:
  `CheckpointCorruptError`, a `wal.CorruptionError`) and, when asked, checks the schema
  version and configuration hash (mismatch: `CheckpointMismatchError`). Every checkpoint
  is kept until the thread is deleted (time travel by id).
* ``delete_thread`` first marks the thread *deleting* (one commit), then deletes what it
  owns in transactions of at most `DELETE_BATCH` keys, then its record. A crash in
  between leaves a thread that refuses new writes (`ThreadDeletingError`) and that
  ``delete_thread``/``expire_idle``/``finish_deletions`` completes. Space is reused after
  `wal.Store.checkpoint` (log segments dropped; LMDB pages freed for reuse).
* Values (events, state values, checkpoint state, call args/results) of at least
  ``blob_threshold`` bytes go to ``<store>/blobs/<aa>/<sha256>``: written to a temporary
  file, fsynced, renamed, directory fsynced -- all before the commit that references
  them. `gc_blobs` deletes only blobs no committed value references; a crash between
  blob write and commit leaves an orphan that the next `gc_blobs` removes. Blob files are
  not shipped to an object archive: on an archived store every value stays in the log.

Key layout (``P`` = ``ag/<agent>/``; names are UTF-8 with ``%`` -> ``%25`` and ``/`` ->
``%2F`` so that no name is a prefix of another's key range)::

    P r/<thread>                  thread record, JSON {"seq","ckpt","created_ms","active_ms","deleting"}
    P t/<thread>/e/<seq:016x>     event (packed value)
    P t/<thread>/s/<key>          state value (packed value)
    P t/<thread>/k/<id:016x>      checkpoint: u32 header length, JSON header, packed state
    P t/<thread>/c/<call_id>      marker (empty): this thread owns the call
    P c/<call_id>/i               call intent: u32 header length, JSON {"thread","tool","begun_ms"}, packed args
    P c/<call_id>/o               call outcome: u32 header length, JSON {"ended_ms"}, packed result
    P p/<thread>/<call_id>        marker (empty): call pending (intent without outcome)

A *packed value* is ``0x00`` + the bytes inline, or ``0x01`` + 32-byte SHA-256 + u64 size
(big-endian) naming a blob file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from wal._fs import fsync_dir, replace_durably
from wal.crypto.sealing import CONTEXT_BLOB, Sealer
from wal.errors import (
    ArgumentError,
    ArgumentTypeError,
    ConflictError,
    CorruptionError,
    RecordTooLargeError,
    WalError,
    storage_error,
)
from wal.store.store import MAX_KEY_BYTES, MAX_VALUE_BYTES, Store

__all__ = [
    "DELETE_BATCH",
    "AgentStore",
    "BlobMissingError",
    "CallRecord",
    "CheckpointCorruptError",
    "CheckpointInfo",
    "CheckpointMismatchError",
    "ThreadDeletingError",
]

DELETE_BATCH = 1000  # keys per transaction when deleting a thread
DEFAULT_BLOB_THRESHOLD = 1 << 20
BLOB_DIR = "blobs"
_INLINE = 0x00
_BLOB = 0x01
_BLOB_REF = struct.Struct(">32sQ")
_HDR = struct.Struct(">I")


class CheckpointCorruptError(CorruptionError):
    """A checkpoint's bytes do not match the SHA-256 recorded when it was saved."""


class BlobMissingError(CorruptionError):
    """A committed value references a blob file that is missing or damaged."""


class CheckpointMismatchError(WalError):
    """A checkpoint was saved under another schema version or agent configuration."""


class ThreadDeletingError(WalError):
    """The thread is being deleted (maybe by a crashed earlier run); call delete_thread to finish."""


@dataclass(frozen=True)
class CallRecord:
    """A tool call as recorded. ``status`` is ``"pending"`` (intent only) or ``"done"``.

    ``new`` is True only on the `AgentStore.begin_call` that registered the intent.
    """

    call_id: str
    thread: str
    tool: str
    args: bytes
    status: str
    result: bytes | None
    begun_ms: int
    ended_ms: int | None
    new: bool = False


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint's header: what `AgentStore.list_checkpoints` returns."""

    checkpoint_id: int
    thread: str
    schema_version: int
    config_hash: str
    sha256: str
    size: int
    created_ms: int


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _name(name: str | bytes, what: str) -> bytes:
    if isinstance(name, bytes):
        try:
            name = name.decode()
        except UnicodeDecodeError:
            raise ArgumentError(f"{what} must be valid UTF-8") from None
    if not isinstance(name, str):
        raise ArgumentTypeError(f"{what} must be a str, not {type(name).__name__}")
    if not name:
        raise ArgumentError(f"{what} must be a non-empty str")
    try:
        return name.replace("%", "%25").replace("/", "%2F").encode()
    except UnicodeEncodeError:  # a lone surrogate, as os.fsdecode makes of bytes that are not UTF-8
        raise ArgumentError(f"{what} must be valid Unicode, got {name!r}") from None


def _store_argument(store: object) -> None:
    """AgentStore's store: an open `wal.Store` (or an object with its interface). A path, or
    anything else, failed at its first use with a raw AttributeError."""
    if isinstance(store, Store):
        return
    if isinstance(store, str | bytes | os.PathLike):
        raise ArgumentTypeError(f"AgentStore takes an open wal.Store, not a path ({store!r}): "
                                "AgentStore(wal.open(path))")
    if not isinstance(getattr(store, "path", None), str) or not all(
            callable(getattr(store, name, None)) for name in ("transaction", "get", "scan")):
        raise ArgumentTypeError(f"AgentStore takes an open wal.Store (wal.open(path)), not {type(store).__name__}")


def _blob_threshold(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"blob_threshold must be an int of bytes (or None: never), not {type(value).__name__}")
    if value < 0:
        raise ArgumentError(f"blob_threshold must be bytes >= 0 (or None: never), got {value}")
    return value


def _unname(raw: bytes) -> str:
    return raw.decode().replace("%2F", "/").replace("%25", "%")


def _skey(key: bytes | str) -> bytes:
    if isinstance(key, str):
        try:
            data = key.encode()
        except UnicodeEncodeError:
            raise ArgumentError(f"a state key must be valid Unicode, got {key!r}") from None
    elif isinstance(key, (bytes, bytearray, memoryview)):
        data = bytes(key)  # never bytes(an int): that is so many zero bytes, not the number
    else:
        raise ArgumentTypeError(f"a state key must be bytes or str, not {type(key).__name__}")
    if not data:
        raise ArgumentError("a state key must not be empty")
    return data


def _framed(header: dict[str, Any], body: bytes) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return _HDR.pack(len(head)) + head + body


def _unframe(raw: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = _HDR.unpack_from(raw)
    header = json.loads(raw[4:4 + n])
    if not isinstance(header, dict):
        raise CorruptionError("agent record header is not a JSON object", reason="bad agent record")
    return header, raw[4 + n:]


_T = TypeVar("_T")

# Blob writes in flight per store directory: gc_blobs must not collect them (one writer per directory, I6).
_blob_locks: weakref.WeakValueDictionary[str, _BlobLock] = weakref.WeakValueDictionary()
_blob_locks_guard = threading.Lock()


class _BlobLock:
    """Writers (blob write .. commit) and readers retrying a blob (`AgentStore._reading`) share
    it; gc_blobs takes it exclusively."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._writers = 0
        self._collecting = False

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            while self._collecting:
                self._cond.wait()
            self._writers += 1
        try:
            yield
        finally:
            with self._cond:
                self._writers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        with self._cond:
            while self._collecting or self._writers:
                self._cond.wait()
            self._collecting = True
        try:
            yield
        finally:
            with self._cond:
                self._collecting = False
                self._cond.notify_all()


def _blob_lock_for(path: str) -> _BlobLock:
    with _blob_locks_guard:
        lock = _blob_locks.get(path)
        if lock is None:
            lock = _BlobLock()
            _blob_locks[path] = lock
        return lock


class AgentStore:
    """One agent's namespace in a `wal.Store`: threads with events, state, checkpoints and tool calls.

    The store stays owned by the caller (close it yourself). Thread-safe: share one instance.
    ``blob_threshold``: values of at least this many bytes become blob files (None: never).
    Ignored on a store that ships to an object archive: blob files are not archived, so there
    every value stays in the log (up to the store's value limit, `RecordTooLargeError` above).
    """

    # Test hooks (crash tests): called after a blob file is durable and before the commit
    # that references it, and after each committed batch of delete_thread.
    _after_blob_write: Callable[[str], None] | None = None
    _after_delete_batch: Callable[[int], None] | None = None

    def __init__(self, store: Store, agent: str = "default", *,
                 blob_threshold: int | None = DEFAULT_BLOB_THRESHOLD) -> None:
        _store_argument(store)
        threshold = _blob_threshold(blob_threshold)
        self.store = store
        self.agent = agent
        self._p = b"ag/" + _name(agent, "agent") + b"/"
        # Blob files live beside the store and are not shipped to an object archive: on a store
        # that ships to one, every value stays in the log (up to the store's value limit), so a
        # restore or a follower holds it too.
        self._archived = bool(getattr(store, "_object_archive", False))
        self.blob_threshold = None if self._archived else threshold
        self.blob_dir = os.path.join(store.path, BLOB_DIR)
        # A sealed store's blob files are sealed too, with its keys and codec (wal/crypto/).
        self._sealer: Sealer | None = getattr(store, "_sealer", None)
        self._blob_lock = _blob_lock_for(os.path.realpath(store.path))
        # begin_call's intent is made durable: "sync", unless the store's own level is that or
        # stronger ("replicated", where asking for the weaker "sync" is refused).
        level = getattr(getattr(store, "_durability", None), "level", None)
        self._intent_durability = None if level in ("sync", "replicated") else "sync"

    # ---- keys -------------------------------------------------------------------------------

    def _rkey(self, thread: bytes) -> bytes:
        return self._p + b"r/" + thread

    def _tkey(self, thread: bytes, kind: bytes, rest: bytes = b"") -> bytes:
        key = self._p + b"t/" + thread + b"/" + kind + b"/" + rest
        if len(key) > MAX_KEY_BYTES:
            raise ArgumentError(f"agent/thread/key names too long: key of {len(key)} bytes > {MAX_KEY_BYTES}")
        return key

    def _ckey(self, call: bytes, part: bytes) -> bytes:
        return self._p + b"c/" + call + b"/" + part

    def _pkey(self, thread: bytes, call: bytes = b"") -> bytes:
        return self._p + b"p/" + thread + b"/" + call

    # ---- values and blobs ---------------------------------------------------------------------

    def _blob_path(self, digest: bytes) -> str:
        hexd = digest.hex()
        return os.path.join(self.blob_dir, hexd[:2], hexd)

    def _write_blob(self, data: bytes) -> bytes:
        """Write data as a blob file (durable: file and directories fsynced); returns its digest."""
        sealer = self._sealer
        digest = hashlib.sha256(data).digest() if sealer is None else sealer.blob_name(data)
        path = self._blob_path(digest)
        if os.path.exists(path) and (sealer is not None or os.path.getsize(path) == len(data)):
            return digest  # a sealed blob's name is its content's (an unreadable one fails at read)
        if sealer is not None:  # a sealed store's blob: its file is the envelope (wal/crypto/)
            data = sealer.seal(data, CONTEXT_BLOB + digest)
        sub = os.path.dirname(path)
        if not os.path.isdir(sub):
            os.makedirs(sub, exist_ok=True)
            fsync_dir(self.blob_dir)
            fsync_dir(self.store.path)
        try:
            replace_durably(path, data)
        except OSError as exc:
            # Nothing references the blob yet (the commit comes after it): the call fails, and a
            # retry writes a new temporary file (a failed fsync is never trusted: I5).
            raise storage_error(exc, f"writing the blob file {path}") from exc
        hook = type(self)._after_blob_write
        if hook is not None:
            hook(path)
        return digest

    def _pack(self, data: bytes) -> bytes:
        """Inline or blob reference. A blob is written here: call with the blob lock held."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ArgumentError(f"agent values must be bytes, not {type(data).__name__}")
        data = bytes(data)
        if self.blob_threshold is not None and len(data) >= self.blob_threshold:
            return bytes([_BLOB]) + _BLOB_REF.pack(self._write_blob(data), len(data))
        if self._archived and len(data) >= MAX_VALUE_BYTES:
            raise RecordTooLargeError(
                f"an agent value of {len(data)} bytes: on a store that ships to an object archive every value "
                f"stays in the log, so the archive holds it, and a value is limited to {MAX_VALUE_BYTES - 1} bytes "
                "(blob files, for larger ones, are not archived); split the value or keep it elsewhere")
        return bytes([_INLINE]) + data

    def _reading(self, read: Callable[[], _T]) -> _T:
        """read(), and once more if a blob file it needed was gone. gc_blobs removes the blobs no
        value references: a read that took a value just before it was replaced (or deleted) and
        the blob collected finds its file gone, though nothing is lost. The second time with the
        blob lock shared, so no gc_blobs of this process runs between its reads and its opens: a
        blob missing then is really missing (or damaged)."""
        try:
            return read()
        except BlobMissingError:
            with self._blob_lock.writing():
                return read()

    def _unpack(self, packed: bytes) -> bytes:
        if not packed:
            raise CorruptionError("empty agent value", reason="bad agent value")
        if packed[0] == _INLINE:
            return packed[1:]
        if packed[0] != _BLOB:
            raise CorruptionError(f"unknown agent value tag {packed[0]}", reason="bad agent value")
        digest, size = _BLOB_REF.unpack_from(packed, 1)
        path = self._blob_path(digest)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise BlobMissingError(f"blob {digest.hex()} is missing ({path})", path=path,
                                   reason="missing blob") from None
        sealer = self._sealer
        if sealer is not None:  # the AEAD tag (encrypted) or the SHA-256 below vouches for it
            data = sealer.open(data, CONTEXT_BLOB + digest, lambda: f"the blob file {path}")
        if len(data) != size or (
                (sealer is None or not sealer.encrypting) and hashlib.sha256(data).digest() != digest):
            raise BlobMissingError(f"blob {path} is damaged (size or SHA-256 mismatch)", path=path,
                                   reason="damaged blob")
        return data

    @staticmethod
    def _refs(packed: bytes) -> bytes | None:
        if packed[:1] == bytes([_BLOB]) and len(packed) == 1 + _BLOB_REF.size:
            return bytes(_BLOB_REF.unpack_from(packed, 1)[0])
        return None

    def gc_blobs(self) -> dict[str, int]:
        """Delete blob files that no committed value of any agent references.

        Safe against concurrent writers of this process (they hold the blob lock from blob
        write to commit) and other processes cannot write (one writer per store, I6). A reader
        of this process that took a value just before it was replaced, and finds its blob
        collected, reads again (`_reading`); a reader in another process (a read-only opener)
        may meet `BlobMissingError` then, and a read again gives the new value.
        Returns {"kept": n, "removed": n, "bytes_freed": n}.
        """
        out = {"kept": 0, "removed": 0, "bytes_freed": 0}
        if not os.path.isdir(self.blob_dir):
            return out
        with self._blob_lock.collecting():
            referenced: set[bytes] = set()
            for key, value in self.store.scan(b"ag/"):
                digest = self._value_refs(key, value)
                if digest is not None:
                    referenced.add(digest)
            for sub in sorted(os.listdir(self.blob_dir)):
                subdir = os.path.join(self.blob_dir, sub)
                if not os.path.isdir(subdir):
                    continue
                removed_here = False
                for name in os.listdir(subdir):
                    path = os.path.join(subdir, name)
                    try:
                        digest = bytes.fromhex(name)
                    except ValueError:
                        digest = b""
                    if len(digest) == 32 and digest in referenced:
                        out["kept"] += 1
                        continue
                    size = os.path.getsize(path)
                    os.unlink(path)  # orphans and leftover *.tmp files of a crashed write
                    removed_here = True
                    out["removed"] += 1
                    out["bytes_freed"] += size
                if removed_here:
                    fsync_dir(subdir)
        return out

    def _value_refs(self, key: bytes, value: bytes) -> bytes | None:
        """The blob digest a stored value references, whatever its kind of key."""
        parts = key.split(b"/")
        if len(parts) >= 5 and parts[2] == b"t" and parts[4] == b"k":  # checkpoint
            with contextlib.suppress(Exception):
                return self._refs(_unframe(value)[1])
            return None
        if len(parts) >= 5 and parts[2] == b"c":  # call intent / outcome
            with contextlib.suppress(Exception):
                return self._refs(_unframe(value)[1])
            return None
        if len(parts) >= 5 and parts[2] == b"t" and parts[4] in (b"e", b"s"):
            return self._refs(value)
        return None

    # ---- thread records ---------------------------------------------------------------------

    def _record(self, tx_or_store: Any, rkey: bytes) -> dict[str, Any] | None:
        raw = tx_or_store.get(rkey)
        if raw is None:
            return None
        rec = json.loads(raw)
        assert isinstance(rec, dict)
        return rec

    def _mutate(self, thread: str, body: Callable[[Any, dict[str, Any], bytes], Any], *,
                durability: str | None = None, create: bool = True) -> Any:
        """Run body(tx, record, thread_name) in a transaction that also rewrites the thread record.

        The record is checked with if_version, so concurrent mutations of one thread
        serialize (retry on ConflictError). body mutates the record dict in place.
        """
        tname = _name(thread, "thread")
        rkey = self._rkey(tname)
        while True:
            with self._blob_lock.writing():
                try:
                    with self.store.transaction(durability=durability) as tx:
                        # The record's newest version, in flight included (wal.Transaction): a
                        # retry follows a commit that got in first, it never spins.
                        version = tx.version(rkey) or 0
                        rec = self._record(tx, rkey)
                        now = _now_ms()
                        if rec is None:
                            if not create:
                                raise KeyError(thread)
                            rec = {"seq": 0, "ckpt": 0, "created_ms": now, "active_ms": now, "deleting": False}
                        if rec.get("deleting"):
                            raise ThreadDeletingError(
                                f"thread {thread!r} of agent {self.agent!r} is being deleted; "
                                "call delete_thread() to finish before reusing it")
                        result = body(tx, rec, tname)
                        rec["active_ms"] = now
                        tx.put(rkey, json.dumps(rec, separators=(",", ":")).encode(), if_version=version)
                    return result
                except ConflictError as exc:
                    if exc.key != rkey:
                        raise

    def threads(self) -> Iterator[str]:
        """Names of this agent's threads (deleting ones included), in key order."""
        prefix = self._p + b"r/"
        for key, _ in self.store.scan(prefix):
            yield _unname(key[len(prefix):])

    def thread_info(self, thread: str) -> dict[str, Any] | None:
        """The thread record {"seq","ckpt","created_ms","active_ms","deleting"} or None."""
        return self._record(self.store, self._rkey(_name(thread, "thread")))

    # ---- event streams ------------------------------------------------------------------------

    def append(self, thread: str, event: bytes, *, state: Mapping[bytes | str, bytes | None] | None = None,
               durability: str | None = None) -> int:
        """Append event to thread's stream with state changes, atomically; returns its sequence number.

        state: key -> value (None deletes the key). Sequence numbers are 1, 2, 3, ... per thread
        with no gaps, also with concurrent appenders.
        """
        if state is not None and not isinstance(state, Mapping):
            raise ArgumentTypeError(f"state must be a mapping of state key -> value (None deletes the key), not "
                                    f"{type(state).__name__}")
        packed_state = {_skey(k): v for k, v in (state or {}).items()}

        def body(tx: Any, rec: dict[str, Any], tname: bytes) -> int:
            seq = int(rec["seq"]) + 1
            tx.put(self._tkey(tname, b"e", b"%016x" % seq), self._pack(event))
            for k, v in packed_state.items():
                skey = self._tkey(tname, b"s", k)
                if v is None:
                    tx.delete(skey)
                else:
                    tx.put(skey, self._pack(v))
            rec["seq"] = seq
            return seq

        seq: int = self._mutate(thread, body, durability=durability)
        return seq

    def read(self, thread: str, from_seq: int = 0) -> Iterator[tuple[int, bytes]]:
        """(seq, event) of thread with seq >= from_seq, in order. Bad arguments raise here, not
        at the first step of the iteration."""
        if isinstance(from_seq, bool) or not isinstance(from_seq, int):
            raise ArgumentTypeError(f"from_seq must be an int, not {type(from_seq).__name__}")
        return self._events(_name(thread, "thread"), from_seq)

    def _events(self, tname: bytes, from_seq: int) -> Iterator[tuple[int, bytes]]:
        prefix = self._tkey(tname, b"e")
        for key, value in self.store.scan(prefix):
            seq = int(key[len(prefix):], 16)
            if seq < from_seq:
                continue
            try:
                event = self._unpack(value)
            except BlobMissingError:  # as in `_reading`, for this event alone
                with self._blob_lock.writing():
                    again = self.store.get(key)
                    if again is None:
                        continue  # deleted (pruned, expired) since the scan read it
                    event = self._unpack(again)
            yield seq, event

    def last_seq(self, thread: str) -> int:
        """The thread's last sequence number (0: no events)."""
        rec = self.thread_info(thread)
        return int(rec["seq"]) if rec is not None else 0

    def get_state(self, thread: str, key: bytes | str, default: bytes | None = None) -> bytes | None:
        skey = self._tkey(_name(thread, "thread"), b"s", _skey(key))

        def read() -> bytes | None:
            raw = self.store.get(skey)
            return default if raw is None else self._unpack(raw)
        return self._reading(read)

    def state(self, thread: str) -> dict[bytes, bytes]:
        """All state values of thread."""
        prefix = self._tkey(_name(thread, "thread"), b"s")
        return self._reading(lambda: {k[len(prefix):]: self._unpack(v) for k, v in self.store.scan(prefix)})

    # ---- tool calls ---------------------------------------------------------------------------

    def _call(self, call_id: str, *, new: bool = False) -> CallRecord | None:
        return self._reading(lambda: self._read_call(call_id, new))

    def _read_call(self, call_id: str, new: bool) -> CallRecord | None:
        cname = _name(call_id, "call_id")
        raw = self.store.get(self._ckey(cname, b"i"))
        if raw is None:
            return None
        head, args = _unframe(raw)
        out = self.store.get(self._ckey(cname, b"o"))
        result: bytes | None = None
        ended: int | None = None
        if out is not None:
            ohead, packed = _unframe(out)
            result, ended = self._unpack(packed), int(ohead["ended_ms"])
        return CallRecord(call_id, str(head["thread"]), str(head["tool"]), self._unpack(args),
                          "done" if out is not None else "pending", result, int(head["begun_ms"]), ended, new)

    def begin_call(self, thread: str, call_id: str, tool: str, args: bytes) -> CallRecord:
        """Durably record the intent to run tool(args) (fsynced before returning).

        Returns the record: ``new=True`` when this call registered it; otherwise the call
        was known -- ``status == "done"`` carries the recorded ``result`` (do not run the
        tool again), ``status == "pending"`` means an earlier attempt may or may not have
        run it (reconcile).
        """
        cname = _name(call_id, "call_id")
        thread = _unname(_name(thread, "thread"))  # as the record's JSON holds it: a str
        if not isinstance(tool, str):
            raise ArgumentTypeError(f"tool must be a str, not {type(tool).__name__}")
        ikey = self._ckey(cname, b"i")
        while True:
            known = self._call(call_id)
            if known is not None:
                return known

            def body(tx: Any, rec: dict[str, Any], tname: bytes) -> None:
                head = {"thread": thread, "tool": tool, "begun_ms": _now_ms()}
                tx.put(ikey, _framed(head, self._pack(args)), if_version=0)
                tx.put(self._pkey(tname, cname), b"")
                tx.put(self._tkey(tname, b"c", cname), b"")

            try:
                self._mutate(thread, body, durability=self._intent_durability)
            except ConflictError as exc:
                if exc.key == ikey:
                    continue  # registered concurrently: report that one
                raise
            rec = self._call(call_id, new=True)
            assert rec is not None
            return rec

    def end_call(self, thread: str, call_id: str, result: bytes, *, durability: str | None = None) -> CallRecord:
        """Record the outcome of a begun call. A second end_call keeps the first outcome."""
        cname = _name(call_id, "call_id")
        thread = _unname(_name(thread, "thread"))  # as begin_call recorded it: a str
        okey = self._ckey(cname, b"o")
        known = self._call(call_id)
        if known is None:
            raise ArgumentError(f"end_call of unknown call {call_id!r}: call begin_call first")
        if known.thread != thread:
            raise ArgumentError(f"call {call_id!r} belongs to thread {known.thread!r}, not {thread!r}")
        if known.status == "done":
            return known

        def body(tx: Any, rec: dict[str, Any], tname: bytes) -> None:
            tx.put(okey, _framed({"ended_ms": _now_ms()}, self._pack(result)), if_version=0)
            tx.delete(self._pkey(tname, cname))

        try:
            # create=False: a thread deleted since the look above (its calls with it) is not made
            # again around this outcome, which a later begin_call of the same call_id would take
            # for its own.
            self._mutate(thread, body, durability=durability, create=False)
        except ConflictError as exc:
            if exc.key != okey:
                raise
        except (KeyError, ThreadDeletingError):
            raise ArgumentError(f"end_call of call {call_id!r}: its thread {thread!r} was deleted meanwhile, "
                                "the call with it") from None
        done = self._call(call_id)
        if done is None:
            raise ArgumentError(f"end_call of call {call_id!r}: its thread {thread!r} was deleted meanwhile, "
                                "the call with it")
        return done

    def pending_calls(self, thread: str | None = None) -> list[CallRecord]:
        """Calls begun and not ended (of one thread, or of all threads), in key order."""
        prefix = self._p + b"p/" + (_name(thread, "thread") + b"/" if thread is not None else b"")
        out: list[CallRecord] = []
        for key, _ in self.store.scan(prefix):
            cname = key.rsplit(b"/", 1)[1]
            rec = self._call(_unname(cname))
            if rec is not None and rec.status == "pending":
                out.append(rec)
        return out

    def call_result(self, call_id: str) -> CallRecord | None:
        """The call's record (status, result), or None if never begun."""
        return self._call(call_id)

    # ---- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, thread: str, state: bytes, *, schema_version: int, config_hash: str,
                        durability: str | None = None) -> int:
        """Save a checkpoint of thread's state; returns its id (1, 2, ... per thread). History is kept."""
        if isinstance(schema_version, bool) or not isinstance(schema_version, int):
            raise ArgumentError("schema_version must be an int")
        if not isinstance(config_hash, str):
            raise ArgumentError("config_hash must be a str")
        if not isinstance(state, bytes | bytearray | memoryview):
            raise ArgumentTypeError(f"a checkpoint's state must be bytes, not {type(state).__name__}")
        data = bytes(state)
        digest = hashlib.sha256(data).hexdigest()

        def body(tx: Any, rec: dict[str, Any], tname: bytes) -> int:
            cid = int(rec["ckpt"]) + 1
            head = {"schema_version": schema_version, "config_hash": config_hash, "sha256": digest,
                    "size": len(data), "created_ms": _now_ms()}
            tx.put(self._tkey(tname, b"k", b"%016x" % cid), _framed(head, self._pack(data)))
            rec["ckpt"] = cid
            return cid

        cid: int = self._mutate(thread, body, durability=durability)
        return cid

    def _info(self, thread: str, cid: int, head: dict[str, Any]) -> CheckpointInfo:
        return CheckpointInfo(cid, thread, int(head["schema_version"]), str(head["config_hash"]),
                              str(head["sha256"]), int(head["size"]), int(head["created_ms"]))

    def list_checkpoints(self, thread: str) -> list[CheckpointInfo]:
        """Headers of thread's checkpoints, oldest first."""
        prefix = self._tkey(_name(thread, "thread"), b"k")
        out = []
        for key, value in self.store.scan(prefix):
            out.append(self._info(thread, int(key[len(prefix):], 16), _unframe(value)[0]))
        return out

    def _read_checkpoint(self, thread: str, tname: bytes,
                         checkpoint_id: int | None) -> tuple[CheckpointInfo, bytes] | None:
        if checkpoint_id is None:
            rec = self.thread_info(thread)
            if rec is None or not rec["ckpt"]:
                return None
            checkpoint_id = int(rec["ckpt"])
        raw = self.store.get(self._tkey(tname, b"k", b"%016x" % checkpoint_id))
        if raw is None:
            return None
        head, packed = _unframe(raw)
        return self._info(thread, checkpoint_id, head), self._unpack(packed)

    def load_checkpoint(self, thread: str, checkpoint_id: int | None = None, *, schema_version: int | None = None,
                        config_hash: str | None = None) -> tuple[CheckpointInfo, bytes] | None:
        """(info, state) of a checkpoint (the latest if checkpoint_id is None), or None if there is none.

        Verifies the SHA-256 (`CheckpointCorruptError`); with schema_version / config_hash
        given, a checkpoint saved under other ones raises `CheckpointMismatchError`.
        """
        tname = _name(thread, "thread")
        if checkpoint_id is not None and (isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int)):
            raise ArgumentTypeError(f"checkpoint_id must be an int (or None: the latest), not "
                                    f"{type(checkpoint_id).__name__}")
        found = self._reading(lambda: self._read_checkpoint(thread, tname, checkpoint_id))
        if found is None:
            return None
        info, data = found
        if hashlib.sha256(data).hexdigest() != info.sha256 or len(data) != info.size:
            raise CheckpointCorruptError(
                f"checkpoint {info.checkpoint_id} of thread {thread!r}: SHA-256 mismatch (stored {info.sha256}, "
                f"computed {hashlib.sha256(data).hexdigest()}); load an earlier checkpoint",
                reason="checkpoint digest mismatch")
        if schema_version is not None and info.schema_version != schema_version:
            raise CheckpointMismatchError(
                f"checkpoint {info.checkpoint_id} of thread {thread!r} has schema version {info.schema_version}, "
                f"expected {schema_version}: migrate it or load with the matching schema")
        if config_hash is not None and info.config_hash != config_hash:
            raise CheckpointMismatchError(
                f"checkpoint {info.checkpoint_id} of thread {thread!r} was saved under configuration "
                f"{info.config_hash!r}, this agent runs {config_hash!r}")
        return info, data

    # ---- retention ------------------------------------------------------------------------------

    def delete_thread(self, thread: str) -> int:
        """Delete thread with its events, state, checkpoints and tool calls; returns keys deleted.

        Crash-safe: see the module docstring. Idempotent (0 for an unknown thread).
        """
        deleted = self._delete_thread(thread, None)
        assert deleted is not None
        return deleted

    def _delete_thread(self, thread: str, idle_before: int | None) -> int | None:
        """`delete_thread`; with `idle_before` (ms), only a thread not written since then (or one
        a deletion already marked): None, and nothing deleted, for one written since. The mark
        is committed over the record version the decision read, so a write in between makes it
        read and decide again."""
        tname = _name(thread, "thread")
        rkey = self._rkey(tname)
        while True:
            version = self.store.version(rkey)
            if version is None:
                break
            rec = self._record(self.store, rkey)
            if rec is None or rec.get("deleting"):
                break
            if idle_before is not None and int(rec["active_ms"]) >= idle_before:
                return None
            rec["deleting"] = True
            try:
                with self.store.transaction() as tx:
                    tx.put(rkey, json.dumps(rec, separators=(",", ":")).encode(), if_version=version)
                break
            except ConflictError:
                continue
        deleted = 0
        tprefix = self._p + b"t/" + tname + b"/"
        cprefix = self._tkey(tname, b"c")
        while True:  # calls first (their keys live outside the thread prefix), then the rest
            batch: list[bytes] = []
            for key, _ in self.store.scan(tprefix):
                batch.append(key)
                if len(batch) >= DELETE_BATCH:
                    break
            for key, _ in self.store.scan(self._pkey(tname)):
                if len(batch) >= DELETE_BATCH:
                    break
                batch.append(key)
            if not batch:
                break
            batch.sort(key=lambda k: (not k.startswith(cprefix), k))  # call markers last in their batch
            with self.store.transaction() as tx:
                for key in batch:
                    if key.startswith(cprefix):
                        cname = key[len(cprefix):]
                        tx.delete(self._ckey(cname, b"i"))
                        tx.delete(self._ckey(cname, b"o"))
                    tx.delete(key)
            deleted += len(batch)
            hook = type(self)._after_delete_batch
            if hook is not None:
                hook(deleted)
        # The record last, and only while it is still the deleting one: another delete_thread may
        # have finished first, and the thread been made again since.
        while True:
            version = self.store.version(rkey)
            rec = self._record(self.store, rkey) if version is not None else None
            if rec is None or not rec.get("deleting"):
                break
            try:
                with self.store.transaction() as tx:
                    tx.delete(rkey, if_version=version)
                deleted += 1
                break
            except ConflictError:
                continue
        return deleted

    def finish_deletions(self) -> int:
        """Complete delete_thread runs a crash interrupted; returns threads finished."""
        n = 0
        for thread in list(self.threads()):
            rec = self.thread_info(thread)
            if rec is not None and rec.get("deleting"):
                self.delete_thread(thread)
                n += 1
        return n

    def expire_idle(self, older_than_s: float) -> list[str]:
        """Delete threads not written for older_than_s seconds (and finish interrupted deletions).

        Returns the names of the threads deleted.
        """
        if isinstance(older_than_s, bool) or not isinstance(older_than_s, int | float) or not older_than_s >= 0:
            raise ArgumentError(f"older_than_s must be seconds >= 0, got {older_than_s!r}")
        cutoff = _now_ms() - int(older_than_s * 1000)
        gone = []
        for thread in list(self.threads()):
            rec = self.thread_info(thread)
            # Decided again on the record the deletion marks: a thread written since this look is
            # kept (its write was acknowledged; deleting it would lose it).
            if (rec is not None and (rec.get("deleting") or int(rec["active_ms"]) < cutoff)
                    and self._delete_thread(thread, cutoff) is not None):
                gone.append(thread)
        return gone
