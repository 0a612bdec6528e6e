"""An OpenAI Agents SDK session on an agentwal store: `AgentwalSession`.

    import wal
    from agents import Agent, Runner
    from wal.integrations.openai_agents import AgentwalSession

    store = wal.open("agent.db")
    session = AgentwalSession("user-42", store)
    await Runner.run(agent, "hello", session=session)

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

Methods are coroutines that run the store calls in a worker thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from wal.errors import ArgumentError, ConflictError
from wal.store import Store

__all__ = ["AgentwalSession"]

_T = TypeVar("_T")
_DELETE_BATCH = 1000


def _esc(name: str) -> bytes:
    if not isinstance(name, str) or not name:
        raise ArgumentError("session_id must be a non-empty str")
    return name.replace("%", "%25").replace("/", "%2F").encode()


class AgentwalSession(SessionABC):
    """Conversation history of one session id, stored in a `wal.Store` (see the module docstring)."""

    def __init__(self, session_id: str, store: Store, *, session_settings: SessionSettings | None = None,
                 durability: str | None = None) -> None:
        self.session_id = session_id
        self.session_settings = session_settings or SessionSettings()
        self.store = store
        self.durability = durability
        sid = _esc(session_id)
        self._meta = b"oa/m/" + sid
        self._items = b"oa/i/" + sid + b"/"

    def _ikey(self, seq: int) -> bytes:
        return self._items + b"%016x" % seq

    def _bounds(self) -> tuple[int, int, int]:
        """(version of the record, first, next)."""
        version = self.store.version(self._meta) or 0
        raw = self.store.get(self._meta)
        if raw is None:
            return version, 1, 1
        meta = json.loads(raw)
        return version, int(meta["first"]), int(meta["next"])

    def _mutate(self, fn: Callable[[Any, int, int], tuple[int, int, _T]]) -> _T:
        """fn(tx, first, next) -> (first, next, result), retried until the record check passes."""
        while True:
            version, first, nxt = self._bounds()
            try:
                with self.store.transaction(durability=self.durability) as tx:
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
            time.sleep(0.0002)  # a concurrent commit of this session is being acknowledged

    # ---- sync bodies ----------------------------------------------------------------------------

    def _get_items(self, limit: int | None) -> list[Any]:
        limit = resolve_session_limit(limit, self.session_settings)
        _, first, nxt = self._bounds()
        if limit is None or limit < 0:
            return [json.loads(v) for _, v in self.store.scan(self._items)]
        if limit == 0:
            return []
        out = []
        for seq in range(max(first, nxt - limit), nxt):
            raw = self.store.get(self._ikey(seq))
            if raw is not None:
                out.append(json.loads(raw))
        return out

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
        if self.store.version(self._meta) is not None:
            self.store.delete(self._meta, durability=self.durability)

    # ---- the Session protocol ------------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The history oldest first; with limit (or session_settings.limit) only the latest limit items."""
        return await asyncio.to_thread(self._get_items, limit)

    async def add_items(self, items: list[Any]) -> None:
        """Append items atomically (one transaction)."""
        await asyncio.to_thread(self._add_items, list(items))

    async def pop_item(self) -> Any:
        """Remove and return the newest item, or None if the session is empty."""
        return await asyncio.to_thread(self._pop_item)

    async def clear_session(self) -> None:
        """Remove every item of this session."""
        await asyncio.to_thread(self._clear)
