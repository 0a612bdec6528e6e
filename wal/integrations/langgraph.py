"""A LangGraph checkpointer on an agentwal store: `AgentwalSaver`.

    from wal.integrations.langgraph import AgentwalSaver

    with AgentwalSaver.from_conn_string("agent.db") as saver:     # opens the store, closes it on exit
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "t1"}})

    async with AgentwalSaver.from_conn_string("agent.db") as saver:   # the same, for async code
        await graph.ainvoke(...)

    store = wal.open("agent.db", durability="interval", rpo_ms=50)   # or a store the caller owns
    saver = AgentwalSaver(store)

Incremental storage. Like LangGraph's Postgres saver, a checkpoint is stored without its
channel values; each channel value is stored once per ``(thread, ns, channel, version)``
and only the channels listed in ``new_versions`` (those whose version changed in this
step) are written by ``put``. Unchanged channels are never rewritten: a step that
touches one channel of a large state writes that channel, the small checkpoint header and
its metadata -- in one atomic store transaction. ``get_tuple`` reassembles the values
from the checkpoint's ``channel_versions``.

Growing lists are stored as parts. A channel whose value is a list that only grows -- the
message history of a ``MessagesState``, the commonest state there is -- would otherwise be
written whole at every step: at step n, n messages, so a run of n steps writes (and
fdatasyncs) O(n^2) bytes. When the serialized value (serde's ``msgpack``, an array, at least
`_PARTS_MIN` bytes) begins with the bytes of this channel's previous value in the same
thread and namespace, only the new elements are written, as one more immutable part; the
stored value then names its parts, and a read joins them back into exactly the bytes the
serializer produced (the same ``loads_typed`` as for a whole value). Parts are merged as a
binary counter is carried (a new part absorbs the previous one while that one is no larger),
up to parts of 1 MiB (`_PART_MERGE_BYTES`), which are never rewritten: a value has O(log n)
parts per MiB, each byte is rewritten O(log n) times, and a step writes its new elements and at
most 1 MiB of parts merged with them. Which parts held the previous value is remembered in memory
(`_PartsIndex`: from this saver's writes, and from reads of a thread's latest checkpoint, which
a graph's step makes first) but never trusted: before a part is reused, its stored bytes are
compared with the new value's, in the same transaction, so a thread pruned or forked from an
older checkpoint simply writes the value whole once more. A part's key ends with a hash of its
bytes, so a version written again with other bytes (a graph re-run from an older checkpoint
with the same versions) never changes a part an existing value uses.

Key layout (prefix ``lg/``; each name component is UTF-8 with ``%``, ``/`` and ``#``
percent-escaped, or ``#`` + 32 hex digits of its SHA-256 when the escaped form is over 96
bytes -- the real names are kept in the values)::

    lg/c/<thread>/<ns>/<checkpoint_id>                 checkpoint header, metadata, parent id
    lg/b/<thread>/<ns>/<channel>/<version>             one channel value (serde typed), or its parts' names
    lg/p/<thread>/<ns>/<channel>/<version>/<hash>      one part of a value stored in parts (raw bytes)
    lg/w/<thread>/<ns>/<checkpoint_id>/<task_id>/<idx> one pending write
    lg/l/<thread>/<ns>                                 id of the newest checkpoint (get_tuple without id)

Values are a u32 header length, a JSON header, then the serialized bytes. A value stored in
parts has the header ``{"t": "agentwal.parts", "pt": <serde type>, "parts": [[<version>/<hash>,
<length>], ...]}`` and, as its bytes, the serialized value's first bytes (the array's
msgpack header); the value is those bytes followed by the parts' bytes in order. (A saver
older than parts refuses such a value through its serializer, which knows no type
``agentwal.parts``, rather than reading it wrongly.)

Durability: LangGraph's modes and ours. LangGraph's ``durability`` decides *when* the
saver is called; the store's level decides *what a returned call survives*:

* ``durability="sync"`` (LangGraph): ``put`` is called and awaited before the next step
  starts. With an agentwal store at ``sync`` every finished step survives a process kill
  and a power cut; at ``interval, rpo_ms=T`` it survives a kill and a power cut loses
  at most the steps of the last T ms; at ``buffered`` a kill too may lose the last T ms.
* ``durability="async"`` (LangGraph): ``put`` runs while the next step executes; a kill
  can lose the step in flight regardless of our level, and our level then bounds what
  earlier steps a power cut may lose (as above).
* ``durability="exit"`` (LangGraph): only the final state is saved when the graph exits;
  a kill mid-run loses the whole run whatever our level; ours governs the final save.

For "resume after kill from the last finished step" use LangGraph ``sync`` with any of our
levels (``interval`` is the usual trade: no loss on a process kill, bounded loss on power
cut, no fsync per step). Pass ``durability="sync"`` to the saver to force fsync per
checkpoint on a weaker store.

Maintenance: ``copy_thread``, ``prune`` (``keep_latest``, DeltaChannel-aware, or ``delete``)
and ``delete_for_runs`` -- LangGraph's optional capabilities, all covered by its conformance
suite. They are meant for threads no graph is running on at the time (the section's comment
says what a concurrent ``put`` can and cannot lose).

The async methods run the sync ones in a worker thread, so they never block the event loop.
Cancellation: a cancelled ``aput``/``aput_writes``/``adelete_thread``/``acopy_thread``/
``aprune``/``adelete_for_runs`` waits for its worker to finish before the CancelledError is
raised, so the change took effect before the caller sees the error, or (when its worker
raised) never will -- it never appears afterwards (`wal.integrations._mutation`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import struct
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from wal._open import open_store
from wal.errors import ArgumentError, ArgumentTypeError, ConflictError, CorruptionError
from wal.integrations._mutation import run_mutation
from wal.store.snapshot import Snapshot
from wal.store.store import Store

__all__ = ["AgentwalSaver"]

_HDR = struct.Struct(">I")
_MAX_TXN_OPS = 100_000  # ops in one maintenance transaction, whatever their bytes
_Keys = list[bytes]  # in signatures inside AgentwalSaver, where `list` names its method
_TXN_BUDGET = 8 << 20  # bytes of keys and values in one maintenance transaction (a record is at most 16 MiB)
_MAX_COMPONENT = 96


def _c(name: str) -> bytes:
    """One key component: escaped so that '/' separates components unambiguously."""
    esc = name.replace("%", "%25").replace("/", "%2F").replace("#", "%23").encode()
    if len(esc) > _MAX_COMPONENT:
        return b"#" + hashlib.sha256(name.encode()).hexdigest()[:32].encode()
    return esc


def _frame(header: dict[str, Any], *bodies: bytes) -> bytes:
    header = dict(header, lens=[len(b) for b in bodies])
    head = json.dumps(header, separators=(",", ":")).encode()
    return _HDR.pack(len(head)) + head + b"".join(bodies)


def _unframe(raw: bytes) -> tuple[dict[str, Any], list[bytes]]:
    (n,) = _HDR.unpack_from(raw)
    header: dict[str, Any] = json.loads(raw[4:4 + n])
    out, pos = [], 4 + n
    for length in header["lens"]:
        out.append(raw[pos:pos + length])
        pos += length
    return header, out


def _version(v: str | int | float) -> bytes:
    return _c(json.dumps(v)) if not isinstance(v, str) else _c(v)


def _idx(idx: int) -> bytes:
    return b"%08x" % (idx + (1 << 31))  # negative special indexes sort before 0, fixed width


_PARTS = "agentwal.parts"  # the header type of a value stored in parts
_PARTS_MIN = 16 << 10  # smaller values are written whole: one key, and a whole write costs little
_PARTS_REMEMBERED = 4096  # (thread, ns, channel) whose parts _PartsIndex remembers, newest used kept
_PART_MERGE_BYTES = 1 << 20  # parts merge (`_put_value`) only into parts of at most this size
_Part = tuple[str, int]  # (<version>/<hash> key component, length)


def _array_head(t: str, data: bytes) -> int:
    """The length of the msgpack array header `data` starts with, 0 if it is not one (or too
    small to be worth parts). An array's elements follow its header, each encoded on its own:
    appending elements leaves the bytes after the header unchanged."""
    if t != "msgpack" or len(data) < _PARTS_MIN:
        return 0
    first = data[0]
    return 1 if 0x90 <= first <= 0x9F else 3 if first == 0xDC else 5 if first == 0xDD else 0


class _PartsIndex:
    """Which parts hold the newest value written of each (thread, ns, channel): a hint for the
    next write of that channel, verified against the store before use (module docstring), so
    forgetting an entry (the bound) costs one whole write, never correctness. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: OrderedDict[tuple[str, str, str], list[_Part]] = OrderedDict()

    def get(self, where: tuple[str, str, str]) -> list[_Part]:
        with self._lock:
            return list(self._parts.get(where, ()))

    def set(self, where: tuple[str, str, str], parts: list[_Part] | None) -> None:
        with self._lock:
            if parts is None:
                self._parts.pop(where, None)
                return
            self._parts[where] = parts
            self._parts.move_to_end(where)
            while len(self._parts) > _PARTS_REMEMBERED:
                self._parts.popitem(last=False)



def _thread(thread_id: Any) -> str:
    """A thread id as the saver keys it: a str; an int or a UUID as its str, as a graph passes
    them on (so ``7`` and ``"7"`` name one thread, as in SqliteSaver). Anything else is refused
    (it raised an AttributeError deep in the key escaping)."""
    if isinstance(thread_id, str):
        return thread_id
    if isinstance(thread_id, int | uuid.UUID) and not isinstance(thread_id, bool):
        return str(thread_id)
    raise ArgumentTypeError(f"thread_id must be a str (or an int or a UUID), not {type(thread_id).__name__}")


def _ids(ids: Sequence[str], what: str) -> list[str]:
    """`ids` as a list; a lone string (a sequence of its characters) is refused: taken as a
    sequence, "ab" named threads "a" and "b"."""
    if isinstance(ids, str | bytes):
        raise ArgumentTypeError(f"{what} must be a sequence of ids, not one {type(ids).__name__} ({ids!r}): "
                                f"pass [{ids!r}]")
    return list(ids)


class AgentwalSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpointer storing incrementally in a `wal.Store` (see the module docstring).

    ``store``: an open `wal.Store`, which stays owned by the caller (to have the saver open and
    close its own, use `from_conn_string`). ``durability``: the level each commit asks for
    (None: the store's; may only be stronger).
    """

    def __init__(self, store: Store, *, serde: SerializerProtocol | None = None,
                 durability: str | None = None) -> None:
        if not isinstance(store, Store):
            raise ArgumentTypeError(
                f"AgentwalSaver needs an open wal.Store, got {type(store).__name__} {store!r:.80}; pass "
                f"wal.open(path), or use `with AgentwalSaver.from_conn_string(path) as saver:` to have the "
                f"saver open and close the store itself")
        if durability is not None:  # a level the store may be asked for, now: "fast" was taken, and failed each commit
            store._durability.allows(durability)
        super().__init__(serde=serde)
        self.store = store
        self.durability = durability
        self._parts_index = _PartsIndex()

    @classmethod
    def from_conn_string(cls, path: str | os.PathLike[str], *, serde: SerializerProtocol | None = None,
                         **open_kwargs: Any) -> _SaverScope:
        """A context manager that opens the store at `path` (``wal.open(path, **open_kwargs)``),
        yields a saver on it and closes the store on exit -- LangGraph's
        ``SqliteSaver.from_conn_string`` convention. Both forms work: ``with ... as saver`` and,
        as LangGraph's async savers are used, ``async with ... as saver`` (which opens and
        closes the store in a worker thread: recovery and the final checkpoint never block the
        event loop). ``serde`` goes to the saver, everything else to `wal.open` -- ``durability``
        and ``rpo_ms`` among them: they set the store's level, which every checkpoint then has.
        """
        return _SaverScope(cls, path, serde, open_kwargs)

    # ---- keys ---------------------------------------------------------------------------------

    @staticmethod
    def _ckey(thread: str, ns: str, cid: str = "") -> bytes:
        return b"lg/c/" + _c(thread) + b"/" + _c(ns) + b"/" + (_c(cid) if cid else b"")

    @staticmethod
    def _lkey(thread: str, ns: str) -> bytes:
        return b"lg/l/" + _c(thread) + b"/" + _c(ns)

    @staticmethod
    def _bkey(thread: str, ns: str, channel: str, version: str | int | float) -> bytes:
        return b"lg/b/" + _c(thread) + b"/" + _c(ns) + b"/" + _c(channel) + b"/" + _version(version)

    @staticmethod
    def _pprefix(thread: str, ns: str, channel: str) -> bytes:
        return b"lg/p/" + _c(thread) + b"/" + _c(ns) + b"/" + _c(channel) + b"/"

    @staticmethod
    def _wprefix(thread: str, ns: str, cid: str) -> bytes:
        return b"lg/w/" + _c(thread) + b"/" + _c(ns) + b"/" + _c(cid) + b"/"

    # ---- reading --------------------------------------------------------------------------------

    def _tuple(self, raw: bytes, reader: Store | Snapshot | None = None, *, remember: bool = False
               ) -> tuple[CheckpointTuple, dict[str, Any]]:
        """The CheckpointTuple of checkpoint record `raw`, its channel values and pending writes
        read through `reader` (a snapshot: all of one instant; default the store), the values
        in one batched read. `remember`: the thread's latest checkpoint, which the graph's next
        step continues from: the parts of its values become `_PartsIndex`'s hint, so a saver
        that did not write them (a new process, another saver on the store) writes only the new
        bytes too, not the value whole once more."""
        src = reader if reader is not None else self.store
        head, (ckpt_b, meta_b) = _unframe(raw)
        thread, ns, cid, parent = head["thread"], head["ns"], head["id"], head["parent"]
        checkpoint: Checkpoint = self.serde.loads_typed((head["ct"], ckpt_b))
        values: dict[str, Any] = {}
        channels = list(checkpoint["channel_versions"].items())
        blobs = src.get_many([self._bkey(thread, ns, channel, ver) for channel, ver in channels])
        stored = [(channel, _unframe(blob)) for (channel, _), blob in zip(channels, blobs, strict=True)
                  if blob is not None]
        # The parts of every value stored in parts, in one more batched read of the same instant.
        part_keys = [self._pprefix(thread, ns, channel) + name.encode()
                     for channel, (bhead, _) in stored if bhead["t"] == _PARTS for name, _ in bhead["parts"]]
        parts = iter(src.get_many(part_keys) if part_keys else ())
        for channel, (bhead, (data,)) in stored:
            if bhead["t"] == _PARTS:
                joined = self._joined(data, bhead["parts"], parts, (thread, ns, channel))
                values[channel] = self.serde.loads_typed((bhead["pt"], joined))
                if remember:
                    self._parts_index.set((thread, ns, channel), [(name, length) for name, length in bhead["parts"]])
            elif bhead["t"] != "empty":
                values[channel] = self.serde.loads_typed((bhead["t"], data))
        writes = []
        for _, wraw in src.scan(self._wprefix(thread, ns, cid)):
            whead, (data,) = _unframe(wraw)
            writes.append((whead, data))
        writes.sort(key=lambda w: writes_sort_key(w[0]["path"], w[0]["task"], w[0]["idx"]))
        metadata = self.serde.loads_typed((head["mt"], meta_b))

        def cfg(checkpoint_id: str) -> RunnableConfig:
            return {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}

        tup = CheckpointTuple(
            config=cfg(cid),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=metadata,
            parent_config=cfg(parent) if parent else None,
            pending_writes=[(w["task"], w["ch"], self.serde.loads_typed((w["t"], d))) for w, d in writes],
        )
        return tup, head

    def _joined(self, head: bytes, names: list[_Part], parts: Iterator[bytes | None],
                where: tuple[str, str, str]) -> bytes:
        """A value stored in parts: its head, then each part named in its header (the next ones
        of `parts`), checked for length. `where`: (thread, ns, channel), for the error."""
        thread, ns, channel = where
        pieces = [head]
        for name, length in names:
            part = next(parts)
            if part is None or len(part) != length:
                found = "does not hold it" if part is None else f"holds {len(part)} bytes"
                raise CorruptionError(
                    f"LangGraph channel {channel!r} of thread {thread!r} (ns {ns!r}) is stored in parts, and its "
                    f"part {name} of {length} bytes is damaged: the store at {self.store.path} {found}",
                    path=self.store.path, reason="part of a checkpoint value")
            pieces.append(part)
        return b"".join(pieces)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by config (``checkpoint_id``), or the thread/ns's latest."""
        conf = config["configurable"]
        thread = _thread(conf["thread_id"])
        ns: str = conf.get("checkpoint_ns", "")
        cid = get_checkpoint_id(config)
        # One snapshot for every read: the latest pointer, the checkpoint, its channel values and
        # its pending writes are of one instant even while another step of the thread commits.
        with self.store.snapshot() as snap:
            if cid:
                raw = snap.get(self._ckey(thread, ns, cid))
                if raw is None:
                    return None
                tup, _ = self._tuple(raw, snap)
                return tup._replace(config=config) if conf.get("checkpoint_id") else tup
            latest = snap.get(self._lkey(thread, ns))
            last = snap.get(self._ckey(thread, ns, latest.decode())) if latest is not None else None
            if last is None:
                for _, value in snap.scan(self._ckey(thread, ns)):
                    last = value  # ids are time-ordered UUIDs: the last in key order is the newest
            if last is None:
                return None
            return self._tuple(last, snap, remember=True)[0]

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, narrowed by config (thread, ns, id), metadata filter, before, limit."""
        prefix = b"lg/c/"
        want_id: str | None = None
        if config is not None:
            conf = config["configurable"]
            if conf.get("thread_id") is not None:
                prefix += _c(_thread(conf["thread_id"])) + b"/"
                if conf.get("checkpoint_ns") is not None:
                    prefix += _c(conf["checkpoint_ns"]) + b"/"
            want_id = get_checkpoint_id(config)
        before_id = get_checkpoint_id(before) if before else None
        found: list[tuple[str, bytes]] = []
        for _, raw in self.store.scan(prefix):
            head = json.loads(raw[4:4 + _HDR.unpack_from(raw)[0]])
            cid = head["id"]
            if config is not None:
                conf = config["configurable"]
                if conf.get("thread_id") is not None and head["thread"] != _thread(conf["thread_id"]):
                    continue  # a hashed component collided in the prefix
                if conf.get("checkpoint_ns") is not None and head["ns"] != conf["checkpoint_ns"]:
                    continue
            if want_id and cid != want_id:
                continue
            if before_id and cid >= before_id:
                continue
            found.append((cid, raw))
        found.sort(key=lambda f: f[0], reverse=True)
        remaining = limit
        for _, raw in found:
            if remaining is not None and remaining <= 0:
                break
            tup, _ = self._tuple(raw)
            if filter and not all(tup.metadata.get(k) == v for k, v in filter.items()):
                continue
            if remaining is not None:
                remaining -= 1
            yield tup

    # ---- writing --------------------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Store the checkpoint and the values of the channels in new_versions, in one transaction."""
        conf = config["configurable"]
        thread = _thread(conf["thread_id"])
        ns: str = conf.get("checkpoint_ns", "")
        c: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = c.pop("channel_values", {})
        ct, ckpt_b = self.serde.dumps_typed(c)
        mt, meta_b = self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
        head = {"thread": thread, "ns": ns, "id": checkpoint["id"], "parent": conf.get("checkpoint_id"),
                "ct": ct, "mt": mt}
        lkey = self._lkey(thread, ns)
        while True:
            try:
                with self.store.transaction(durability=self.durability) as tx:
                    for channel, ver in new_versions.items():
                        if channel not in values:
                            tx.put(self._bkey(thread, ns, channel, ver), _frame({"t": "empty"}, b""))
                            continue
                        self._put_value(tx, (thread, ns, channel), ver, self.serde.dumps_typed(values[channel]))
                    tx.put(self._ckey(thread, ns, checkpoint["id"]), _frame(head, ckpt_b, meta_b))
                    # The newest checkpoint's id, moved only forward, over the version read: two puts
                    # of one thread at once could otherwise leave it on the older one.
                    seen = tx.version(lkey) or 0  # before the value: a commit in between fails the check
                    latest = tx.get(lkey)
                    if latest is None or latest.decode() < checkpoint["id"]:
                        tx.put(lkey, checkpoint["id"].encode(), if_version=seen)
                break
            except ConflictError as exc:
                if exc.key != lkey:
                    raise
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def _put_value(self, tx: Any, where: tuple[str, str, str], ver: str | int | float,
                   typed: tuple[str, bytes]) -> None:
        """Write the serialized value `typed` of channel `where` = (thread, ns, channel) at
        version `ver` in transaction `tx`: whole, or -- a growing list -- as the new bytes after
        the parts of this channel's previous value (module docstring, "parts")."""
        thread, ns, channel = where
        t, data = typed
        bkey = self._bkey(thread, ns, channel, ver)
        head = _array_head(t, data)
        if not head:
            tx.put(bkey, _frame({"t": t}, data))
            self._parts_index.set(where, None)
            return
        prefix = self._pprefix(thread, ns, channel)
        # Reuse the previous value's parts while their stored bytes are the new value's bytes.
        kept: list[_Part] = []
        at = head
        for name, length in self._parts_index.get(where):
            stored = tx.get(prefix + name.encode())
            if stored is None or len(stored) != length or not data.startswith(stored, at):
                break
            kept.append((name, length))
            at += length
        # The new bytes absorb the kept parts no larger than them: O(log n) parts per value. Not
        # past _PART_MERGE_BYTES: a part that large is never rewritten, so a step writes its new
        # bytes and at most that much more, and whether it fits the record limit depends on what
        # it changed, not on where the merges stand (a history's 16th message merged 15 earlier
        # ones into one part as large as the whole, refused past 16 MiB by one saver and not by
        # another whose parts lay otherwise).
        while kept and kept[-1][1] <= len(data) - at and len(data) - at + kept[-1][1] <= _PART_MERGE_BYTES:
            at -= kept.pop()[1]
        if at < len(data):
            piece = data[at:]
            name = _version(ver).decode() + "/" + self._part_hash(piece)
            tx.put(prefix + name.encode(), piece)
            kept.append((name, len(piece)))
        tx.put(bkey, _frame({"t": _PARTS, "pt": t, "parts": kept}, data[:head]))
        self._parts_index.set(where, kept)

    def _part_hash(self, piece: bytes) -> str:
        """The 16 hex digits naming a part (FORMAT.md §17): of BLAKE2b-64 of its bytes; on an
        encrypted store, of its keyed name (`Sealer.blob_name`: HMAC-SHA256 under a key derived
        from the current key). Keys are stored in the clear, and a plain hash of a message would
        let whoever reads the files confirm a guessed one."""
        sealer = getattr(self.store, "_sealer", None)
        if sealer is not None and sealer.keys is not None:
            return bytes(sealer.blob_name(piece)[:8]).hex()
        return hashlib.blake2b(piece, digest_size=8).hexdigest()

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Store a task's pending writes for a checkpoint, atomically.

        Writes to regular channels are kept on a repeat (first writer wins, like LangGraph's
        savers); special channels (errors, interrupts, ...) are overwritten.
        """
        conf = config["configurable"]
        thread = _thread(conf["thread_id"])
        ns: str = conf.get("checkpoint_ns", "")
        cid: str = conf["checkpoint_id"]
        prefix = self._wprefix(thread, ns, cid) + _c(task_id) + b"/"
        with self.store.transaction(durability=self.durability) as tx:
            for i, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, i)
                key = prefix + _idx(idx)
                if idx >= 0 and tx.get(key) is not None:
                    continue
                t, data = self.serde.dumps_typed(value)
                tx.put(key, _frame({"task": task_id, "ch": channel, "t": t, "path": task_path, "idx": idx}, data))

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, channel value and write of the thread: in one transaction
        when the keys fit in _TXN_BUDGET bytes, else in batches, the checkpoints (and latest
        pointers) first, so a crash never leaves a checkpoint without its values."""
        thread_id = _thread(thread_id)
        keys = [key for kind in (b"c", b"l", b"w", b"b", b"p")
                for key, _ in self.store.scan(b"lg/" + kind + b"/" + _c(thread_id) + b"/")]
        self._commit_batched(keys)

    # ---- maintenance: copy, prune, delete by run ----------------------------------------------------
    #
    # Each is meant for a thread no graph is running on at the time: a checkpoint added meanwhile
    # may be missed by a copy or a prune, and delete_for_runs may delete values a concurrent child
    # of a deleted checkpoint shares. (A prune never deletes what a concurrent child of the newest
    # checkpoint needs: a value goes only when no kept checkpoint references it, and the child
    # shares its unchanged values with the newest, which is kept.)
    # The changes for one thread are one transaction when they fit in _TXN_BUDGET bytes, so a
    # crash leaves all or nothing; beyond that they are batched, checkpoints first when deleting
    # and last when copying, so a crash leaves values nothing references, never a checkpoint
    # without its values.

    def _checkpoints(self, thread: str, reader: Store | Snapshot | None = None
                     ) -> dict[str, dict[str, tuple[dict[str, Any], bytes]]]:
        """The thread's checkpoints: ns -> checkpoint id -> (header, stored value), as `reader`
        (the store, or one snapshot of it) holds them."""
        out: dict[str, dict[str, tuple[dict[str, Any], bytes]]] = {}
        for _, raw in (reader or self.store).scan(b"lg/c/" + _c(thread) + b"/"):
            head, _ = _unframe(raw)
            if head["thread"] == thread:  # not a thread whose hashed name collided
                out.setdefault(head["ns"], {})[head["id"]] = (head, raw)
        return out

    def _versions(self, raw: bytes) -> dict[str, Any]:
        head, (ckpt_b, _) = _unframe(raw)
        checkpoint: Checkpoint = self.serde.loads_typed((head["ct"], ckpt_b))
        return dict(checkpoint["channel_versions"])

    def _metadata(self, raw: bytes) -> dict[str, Any]:
        head, (_, meta_b) = _unframe(raw)
        return dict(self.serde.loads_typed((head["mt"], meta_b)))

    def _value_stored(self, reader: Store | Snapshot, thread: str, ns: str, channel: str, version: Any) -> bool:
        blob = reader.get(self._bkey(thread, ns, channel, version))
        return blob is not None and _unframe(blob)[0]["t"] != "empty"

    def _doomed_keys(self, reader: Snapshot, thread: str, ns: str, by_id: dict[str, tuple[dict[str, Any], bytes]],
                     doomed: set[str]) -> _Keys:
        """The keys to delete with the checkpoints `doomed` among `by_id` (those of (thread, ns)):
        the checkpoints, then their pending writes, then the channel values they reference that
        none of the others does. Everything is read from `reader`, the one snapshot `by_id` was
        read from: a value or part a graph step commits meanwhile belongs to a checkpoint not in
        `by_id`, and must not be taken for one no kept checkpoint uses."""
        values: set[bytes] = set()
        keep_values: set[bytes] = set()
        for cid, (_, raw) in by_id.items():
            refs = values if cid in doomed else keep_values
            refs.update(self._bkey(thread, ns, ch, v) for ch, v in self._versions(raw).items())
        keys = [self._ckey(thread, ns, cid) for cid in sorted(doomed)]
        for cid in sorted(doomed):
            keys += [key for key, _ in reader.scan(self._wprefix(thread, ns, cid))]
        return keys + sorted(values - keep_values) + self._unused_parts(reader, thread, ns, keep_values)

    def _unused_parts(self, reader: Snapshot, thread: str, ns: str, kept_values: set[bytes]) -> _Keys:
        """The parts of (thread, ns) that none of the values `kept_values` names: after those
        values, the last to go, so a crash never leaves a value without its parts."""
        parts = [key for key, _ in reader.scan(b"lg/p/" + _c(thread) + b"/" + _c(ns) + b"/")]
        if not parts:
            return []
        used: set[bytes] = set()
        ordered = sorted(kept_values)
        for key, blob in zip(ordered, reader.get_many(ordered), strict=True):
            if blob is not None:
                head = _unframe(blob)[0]
                if head["t"] == _PARTS:
                    channel_prefix = key[:key.rindex(b"/") + 1].replace(b"lg/b/", b"lg/p/", 1)
                    used.update(channel_prefix + name.encode() for name, _ in head["parts"])
        return [key for key in parts if key not in used]

    def _commit_batched(self, deletes: _Keys, then: dict[bytes, bytes | None] | None = None) -> None:
        """Delete `deletes`, then put `then` (a value of None: delete), in this order: in one
        transaction when they fit in _TXN_BUDGET bytes, else in batches, each one transaction."""
        ops: list[tuple[bytes, bytes | None]] = [(k, None) for k in deletes] + list((then or {}).items())
        if not ops:
            return
        batches: list[list[tuple[bytes, bytes | None]]] = [[]]
        size = 0
        for key, value in ops:
            cost = len(key) + (len(value) if value is not None else 0) + 64
            if batches[-1] and (size + cost > _TXN_BUDGET or len(batches[-1]) >= _MAX_TXN_OPS):
                batches.append([])
                size = 0
            batches[-1].append((key, value))
            size += cost
        for batch in batches:
            with self.store.transaction(durability=self.durability) as tx:
                for key, value in batch:
                    if value is None:
                        tx.delete(key)
                    else:
                        tx.put(key, value)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint of one thread, with its channel values, pending writes and
        namespaces, to another; the target's checkpoints of the same ids are overwritten.

        The values and writes go first and the checkpoints after them (batched by size), so a
        crash part-way leaves no checkpoint of the target without its values. The source's
        values are read into memory first: a copy needs as much memory as the thread holds."""
        source_thread_id, target_thread_id = _thread(source_thread_id), _thread(target_thread_id)
        src, dst = _c(source_thread_id), _c(target_thread_id)
        if src == dst:
            return
        checkpoints = self._checkpoints(source_thread_id)
        if not checkpoints:
            return
        ops: dict[bytes, bytes | None] = {}
        for kind in (b"p", b"b", b"w"):
            prefix = b"lg/" + kind + b"/" + src + b"/"
            for key, value in self.store.scan(prefix):
                ops[b"lg/" + kind + b"/" + dst + b"/" + key[len(prefix):]] = value
        for ns, by_id in checkpoints.items():
            for cid, (head, raw) in sorted(by_id.items()):
                _, bodies = _unframe(raw)
                ops[self._ckey(target_thread_id, ns, cid)] = _frame(dict(head, thread=target_thread_id), *bodies)
            newest = max(by_id)
            latest = self.store.get(self._lkey(target_thread_id, ns))
            if latest is None or latest.decode() < newest:
                ops[self._lkey(target_thread_id, ns)] = newest.encode()
        self._commit_batched([], ops)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune the given threads. ``"delete"``: everything, as `delete_thread`.
        ``"keep_latest"``: each namespace keeps its newest checkpoint with its pending writes
        and the channel values it references, and -- when its metadata names DeltaChannels
        (``counters_since_delta_snapshot``) -- every ancestor back to the nearest one holding
        a stored value for each of them, so that those channels can still be rebuilt from
        the ancestors' writes (LangGraph's `prune` contract). A thread that does not exist is
        no error."""
        if strategy not in ("keep_latest", "delete"):
            raise ArgumentError(f"prune strategy must be 'keep_latest' or 'delete', got {strategy!r}")
        for thread in dict.fromkeys(_thread(t) for t in _ids(thread_ids, "thread_ids")):
            if strategy == "delete":
                self.delete_thread(thread)
                continue
            keys: list[bytes] = []
            with self.store.snapshot() as snap:  # one instant: see `_doomed_keys`
                for ns, by_id in self._checkpoints(thread, snap).items():
                    kept = self._delta_chain(snap, thread, ns, by_id)
                    keys += self._doomed_keys(snap, thread, ns, by_id, set(by_id) - kept)
            self._commit_batched(keys)

    def _delta_chain(self, reader: Snapshot, thread: str, ns: str,
                     by_id: dict[str, tuple[dict[str, Any], bytes]]) -> set[str]:
        """The newest checkpoint's id and those of the ancestors its DeltaChannels need."""
        newest = max(by_id)
        kept = {newest}
        head, raw = by_id[newest]
        delta = set(self._metadata(raw).get("counters_since_delta_snapshot") or ())
        cid: str | None = newest
        while delta and cid is not None and cid in by_id:
            head, raw = by_id[cid]
            kept.add(cid)
            versions = self._versions(raw)
            delta = {ch for ch in delta
                     if ch not in versions or not self._value_stored(reader, thread, ns, ch, versions[ch])}
            cid = head["parent"]
        return kept

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint whose metadata's ``run_id`` is one of `run_ids`, in every
        thread, with its pending writes and the channel values no other checkpoint uses. A
        namespace's latest pointer then names its newest remaining checkpoint. This reads
        every checkpoint's metadata: a maintenance operation, not one for a hot path.

        As LangGraph's contract warns: a DeltaChannel of a later run that is rebuilt from the
        deleted checkpoints' writes (no snapshot of it since) is rebuilt without them; delete
        such runs together, or `prune` instead, which keeps what DeltaChannels need."""
        runs = set(_ids(run_ids, "run_ids"))
        if not runs:
            return
        doomed_by_thread: dict[str, set[tuple[str, str]]] = {}  # thread -> {(ns, checkpoint id)}
        for _, raw in self.store.scan(b"lg/c/"):
            if self._metadata(raw).get("run_id") in runs:
                head = _unframe(raw)[0]
                doomed_by_thread.setdefault(head["thread"], set()).add((head["ns"], head["id"]))
        for thread, doomed_ids in sorted(doomed_by_thread.items()):
            keys: list[bytes] = []
            pointers: dict[bytes, bytes | None] = {}
            with self.store.snapshot() as snap:  # one instant: see `_doomed_keys`
                for ns, by_id in self._checkpoints(thread, snap).items():
                    doomed = {cid for cid in by_id if (ns, cid) in doomed_ids}
                    if not doomed:
                        continue
                    keys += self._doomed_keys(snap, thread, ns, by_id, doomed)
                    survivors = set(by_id) - doomed
                    pointers[self._lkey(thread, ns)] = max(survivors).encode() if survivors else None
            self._commit_batched(keys, pointers)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic string versions: a zero-padded counter plus a random tie-breaker."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(str(current).split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # ---- async ------------------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        items = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return await run_mutation(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        await run_mutation(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await run_mutation(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await run_mutation(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await run_mutation(self.prune, thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await run_mutation(self.delete_for_runs, run_ids)


class _SaverScope:
    """What `AgentwalSaver.from_conn_string` returns: a context manager, sync or async, owning
    the store it opens. One use: entering it twice is an error, as for a file."""

    def __init__(self, cls: type[AgentwalSaver], path: str | os.PathLike[str], serde: SerializerProtocol | None,
                 open_kwargs: dict[str, Any]) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(
                f"AgentwalSaver.from_conn_string needs the store's directory as a str or path, got "
                f"{type(path).__name__}; for a store you opened yourself use AgentwalSaver(store)")
        self._cls, self._path, self._serde = cls, path, serde
        self._open_kwargs = open_kwargs
        self._store: Store | None = None
        self._used = False

    def _make(self, store: Store) -> AgentwalSaver:
        try:
            return self._cls(store, serde=self._serde)
        except BaseException:
            store.close()
            raise

    def _claim(self) -> None:
        if self._used:
            raise RuntimeError("AgentwalSaver.from_conn_string(...) can be entered once; call it again for another")
        self._used = True

    def __enter__(self) -> AgentwalSaver:
        self._claim()
        self._store = open_store(self._path, **self._open_kwargs)
        return self._make(self._store)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            store.close()

    async def __aenter__(self) -> AgentwalSaver:
        self._claim()
        opening = asyncio.ensure_future(asyncio.to_thread(open_store, self._path, **self._open_kwargs))
        try:
            self._store = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The worker opens the store anyway: close it once it has (no one else will).
            opening.add_done_callback(_close_opened)
            raise
        return self._make(self._store)

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            await run_mutation(store.close)


def _close_opened(opening: asyncio.Future[Store]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
