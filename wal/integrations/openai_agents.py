"""An OpenAI Agents SDK session on an agentwal store: `AgentwalSession`.

    from agents import Agent, Runner
    from wal.integrations.openai_agents import AgentwalSession

    session = AgentwalSession("user-42", "agent.db")    # as SQLiteSession("user-42", "agent.db")
    await Runner.run(agent, "hello", session=session)
    session.close()

    store = wal.open("agent.db", durability="interval", rpo_ms=50)   # or on a store the caller owns
    session = AgentwalSession("user-42", store)

Lifecycle. Given a path, the session opens the store there (``wal.open(path, **open_kwargs)``),
or, when another session of this process already opened it, shares that store: sessions of
one process on one path hold one store (a store has one writer, I6), reference-counted, and
the last `close()` closes it. Given a `wal.Store`, the session never closes it. After `close()`
the session's methods raise `wal.ClosedError`. A path that the process also opened itself
with `wal.open` gives `wal.LockedError`: pass that store instead.

``session_settings`` goes through the SDK's own coercion, as ``SQLiteSession`` does: a
`SessionSettings` or a dict (``{"limit": 10}``); unknown fields or bad values are refused
when the session is made (the SDK's TypeError / ValidationError).

Contract (the SDK's ``Session`` protocol, same semantics as its ``SQLiteSession``):
``get_items(limit=None)`` returns the history oldest first; with a limit (or
``session_settings.limit``) the latest ``limit`` items, still oldest first.
``add_items`` appends items in one atomic transaction (all or none after a crash).
``pop_item`` removes and returns the newest item (None when empty). ``clear_session``
removes every item. Items must be JSON-serializable (they are the SDK's TypedDicts).
Each mutation is one commit at the store's durability level (or the stronger
``durability`` given here) and survives what that level promises; concurrent mutations
of one session serialize through ``if_version`` on the session's record and retry.

Key layout (prefix ``oa/``; the session id escaped like `wal.agents` names)::

    oa/m/<session>               JSON {"first": a, "next": b}: items live at sequence numbers [a, b)
    oa/i/<session>/<seq:016x>    one item, JSON

Methods are coroutines that run the store calls in a worker thread, never blocking the event
loop. Cancellation: a cancelled ``add_items``/``pop_item``/``clear_session`` waits for its worker
to finish before the CancelledError is raised, so the change took effect before the caller
sees the error (or, when the worker raised, never will); it never appears afterwards and a
retry after the error does not add an item twice (`wal.integrations._mutation`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit

from wal._open import open_store
from wal.errors import ArgumentError, ArgumentTypeError, ClosedError, ConflictError
from wal.integrations._mutation import run_mutation
from wal.store.store import Store

__all__ = ["AgentwalSession", "SessionClosedError"]

_T = TypeVar("_T")
_DELETE_BATCH = 1000


# The longest escaped session id whose item keys (oa/i/<id>/<seq:016x>) fit the store's 511-byte
# key limit: a longer one is named by its SHA-256 instead (FORMAT.md §17), so that every id the
# SDK's SQLiteSession takes works here too; ids that fit keep their keys as they always were.
_MAX_ESCAPED_ID = 511 - len(b"oa/i/") - len(b"/") - 16


def _esc(name: str) -> bytes:
    if not isinstance(name, str):
        raise ArgumentTypeError(f"session_id must be a str, not {type(name).__name__}")
    if not name:
        raise ArgumentError("session_id must be a non-empty str")
    try:
        esc = name.replace("%", "%25").replace("/", "%2F").encode()
    except UnicodeEncodeError:  # a lone surrogate
        raise ArgumentError(f"session_id must be valid Unicode, got {name!r:.100}") from None
    if len(esc) > _MAX_ESCAPED_ID:
        # "%H" never begins an escaped id: every "%" of a name is escaped as "%25".
        return b"%H" + hashlib.sha256(name.encode()).hexdigest().encode()
    return esc


class SessionClosedError(ClosedError, RuntimeError):
    """A closed AgentwalSession was used: a `wal.ClosedError`, and a RuntimeError as the SDK's
    own SQLiteSession raises in that case."""


class _Shared:
    """The stores sessions opened by path, one per directory in this process, reference-counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[Store, dict[str, Any], int]] = {}

    def acquire(self, path: str | os.PathLike[str], open_kwargs: dict[str, Any]) -> tuple[str, Store]:
        key = os.path.realpath(os.fspath(path))
        with self._lock:
            found = self._open.get(key)
            if found is not None:
                store, kwargs, refs = found
                if open_kwargs and open_kwargs != kwargs:
                    raise ArgumentError(
                        f"the store in {key} is already open in this process (by another AgentwalSession) with "
                        f"{kwargs or 'the defaults'}, not {open_kwargs}; sessions on one path share one store: "
                        f"pass the same options, or none")
                self._open[key] = (store, kwargs, refs + 1)
                return key, store
            store = open_store(key, **open_kwargs)  # under the lock: one opener per directory
            self._open[key] = (store, dict(open_kwargs), 1)
            return key, store

    def release(self, key: str) -> None:
        with self._lock:
            store, kwargs, refs = self._open[key]
            if refs > 1:
                self._open[key] = (store, kwargs, refs - 1)
                return
            del self._open[key]
            store.close()


_SHARED = _Shared()


class AgentwalSession(SessionABC):
    """Conversation history of one session id, stored in a `wal.Store` (see the module docstring).

    ``store_or_path``: a store directory (opened, or shared with the other sessions of this
    process on it, and closed by the last `close()`), or an open `wal.Store` the caller owns.
    ``open_kwargs`` go to `wal.open` (only with a path). ``durability``: with a store, the level
    each commit asks for (None: the store's; may only be stronger); with a path, the level the
    store is opened at (with ``rpo_ms`` and the other ``open_kwargs``), which every commit has.
    """

    def __init__(self, session_id: str, store_or_path: Store | str | os.PathLike[str], *,
                 session_settings: SessionSettings | dict[str, Any] | None = None,
                 durability: str | None = None, **open_kwargs: Any) -> None:
        sid = _esc(session_id)
        settings = coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        self.session_id = session_id
        self.session_settings = settings
        self.durability = durability
        self._meta = b"oa/m/" + sid
        self._items = b"oa/i/" + sid + b"/"
        self._shared_key: str | None = None
        self._closed = False
        if isinstance(store_or_path, Store):
            if open_kwargs:
                raise ArgumentTypeError(
                    f"AgentwalSession got wal.open options {sorted(open_kwargs)} with an open store; "
                    f"they apply only when the session opens the store from a path")
            self.store = store_or_path
        elif isinstance(store_or_path, (str, os.PathLike)):
            if durability is not None:
                open_kwargs["durability"] = durability
                self.durability = durability = None  # the store's own level
            self._shared_key, self.store = _SHARED.acquire(store_or_path, open_kwargs)
        else:
            raise ArgumentTypeError(
                f"AgentwalSession needs a store directory (str or path) or an open wal.Store, got "
                f"{type(store_or_path).__name__}")
        if durability is not None:
            try:
                self.store._durability.allows(durability)
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Close the session: its methods raise `wal.ClosedError` from now on. The store it opened
        from a path is closed with the last session of this process on it; a store passed in
        stays open (its owner closes it). Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        if self._shared_key is not None:
            key, self._shared_key = self._shared_key, None
            _SHARED.release(key)

    def __enter__(self) -> AgentwalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"AgentwalSession {self.session_id!r} is closed; make a new one")

    def _ikey(self, seq: int) -> bytes:
        return self._items + b"%016x" % seq

    def _bounds(self, reader: Any) -> tuple[int, int, int]:
        """(version of the record, first, next), read through `reader` (a transaction, a snapshot)."""
        version = reader.version(self._meta) or 0
        raw = reader.get(self._meta)
        if raw is None:
            return version, 1, 1
        meta = json.loads(raw)
        return version, int(meta["first"]), int(meta["next"])

    def _mutate(self, fn: Callable[[Any, int, int], tuple[int, int, _T]]) -> _T:
        """fn(tx, first, next) -> (first, next, result), retried until the record check passes.
        The record is read inside the transaction, its newest version in flight included
        (wal.Transaction), so a retry follows a commit that got in first and never spins."""
        while True:
            try:
                with self.store.transaction(durability=self.durability) as tx:
                    version, first, nxt = self._bounds(tx)
                    first2, nxt2, result = fn(tx, first, nxt)
                    if (first2, nxt2) != (first, nxt):
                        if first2 >= nxt2:
                            tx.delete(self._meta, if_version=version)
                        else:
                            meta = json.dumps({"first": first2, "next": nxt2}).encode()
                            tx.put(self._meta, meta, if_version=version)
                return result
            except ConflictError as exc:
                if exc.key != self._meta:
                    raise

    # ---- sync bodies ----------------------------------------------------------------------------

    def _get_items(self, limit: int | None) -> list[Any]:
        limit = resolve_session_limit(limit, self.session_settings)
        if limit == 0:
            return []
        with self.store.snapshot() as snap:  # the record and the items of one instant
            if limit is None or limit < 0:
                return [json.loads(v) for _, v in snap.scan(self._items)]
            _, first, nxt = self._bounds(snap)
            raws = snap.get_many([self._ikey(seq) for seq in range(max(first, nxt - limit), nxt)])
        return [json.loads(raw) for raw in raws if raw is not None]

    def _add_items(self, items: list[Any]) -> None:
        encoded = [json.dumps(item, separators=(",", ":")).encode() for item in items]

        def fn(tx: Any, first: int, nxt: int) -> tuple[int, int, None]:
            for i, data in enumerate(encoded):
                tx.put(self._ikey(nxt + i), data)
            return first, nxt + len(encoded), None

        if encoded:
            self._mutate(fn)

    def _pop_item(self) -> Any:
        def fn(tx: Any, first: int, nxt: int) -> tuple[int, int, Any]:
            if nxt <= first:
                return first, nxt, None
            key = self._ikey(nxt - 1)
            raw = tx.get(key)
            tx.delete(key)
            return (1, 1, None if raw is None else json.loads(raw)) if nxt - 1 <= first else \
                (first, nxt - 1, None if raw is None else json.loads(raw))

        return self._mutate(fn)

    def _clear(self) -> None:
        while True:  # items in batches, the record last: a crash leaves a consistent suffix
            batch = []
            for key, _ in self.store.scan(self._items):
                batch.append(key)
                if len(batch) >= _DELETE_BATCH:
                    break
            if not batch:
                break
            last = int(batch[-1][len(self._items):], 16)

            def fn(tx: Any, first: int, nxt: int, batch: list[bytes] = batch,
                   last: int = last) -> tuple[int, int, None]:
                for key in batch:
                    tx.delete(key)
                return (max(first, last + 1), nxt, None) if last + 1 < nxt else (1, 1, None)

            self._mutate(fn)
        # The record goes last, and only if it still names no item: an add_items that committed
        # after the last batch is kept (the clear came first), with its record. Deleted without
        # that check, the record went, and the next add wrote over that item's sequence number.
        while True:
            try:
                with self.store.transaction(durability=self.durability) as tx:
                    version, first, nxt = self._bounds(tx)
                    if version and nxt <= first:
                        tx.delete(self._meta, if_version=version)
                return
            except ConflictError as exc:
                if exc.key != self._meta:
                    raise

    # ---- the Session protocol ------------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The history oldest first; with limit (or session_settings.limit) only the latest limit items."""
        self._check_open()
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):  # "2" failed in a thread
            raise ArgumentTypeError(f"limit must be an int of items (or None: session_settings.limit, else every "
                                    f"item), not {type(limit).__name__}")
        return await asyncio.to_thread(self._get_items, limit)

    async def add_items(self, items: list[Any]) -> None:
        """Append items atomically (one transaction). Cancelled: done before the CancelledError, or never."""
        self._check_open()
        if items:
            await run_mutation(self._add_items, list(items))

    async def pop_item(self) -> Any:
        """Remove and return the newest item, or None if the session is empty. Cancelled: the
        item was removed before the CancelledError (and is lost to the caller, as in the SDK's
        sessions), or never will be."""
        self._check_open()
        return await run_mutation(self._pop_item)

    async def clear_session(self) -> None:
        """Remove every item of this session. Cancelled: cleared before the CancelledError, or
        never (a failure part-way through a large session leaves a consistent newest suffix)."""
        self._check_open()
        await run_mutation(self._clear)
