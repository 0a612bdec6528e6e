"""AgentwalSession against the OpenAI Agents SDK's Session contract (no model, no network)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents.memory import Session, SessionABC, SessionSettings

import wal
from wal.integrations.openai_agents import AgentwalSession


def msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = wal.open(tmp_path / "db")
    yield s
    s.close()


def test_is_an_sdk_session(store: wal.Store) -> None:
    session = AgentwalSession("s1", store)
    assert isinstance(session, SessionABC)
    assert isinstance(session, Session)  # the runtime-checkable protocol
    assert session.session_id == "s1"


def test_add_get_pop_clear_contract(store: wal.Store) -> None:
    async def go() -> None:
        s = AgentwalSession("conv", store)
        assert await s.get_items() == []
        assert await s.pop_item() is None
        items = [msg("user", "hi"), msg("assistant", "hello"), msg("user", "how are you?")]
        await s.add_items(items)
        await s.add_items([])
        assert await s.get_items() == items
        assert await s.get_items(limit=2) == items[1:]  # latest N, chronological order
        assert await s.get_items(limit=10) == items
        assert await s.get_items(limit=0) == []
        assert await s.pop_item() == items[2]
        assert await s.get_items() == items[:2]
        await s.add_items([msg("user", "again")])
        assert await s.get_items() == [*items[:2], msg("user", "again")]
        await s.clear_session()
        assert await s.get_items() == []
        assert await s.pop_item() is None
        await s.add_items([msg("user", "fresh")])
        assert await s.get_items() == [msg("user", "fresh")]
        assert await s.pop_item() == msg("user", "fresh")
        assert await s.pop_item() is None

    run(go())


def test_sessions_are_isolated(store: wal.Store) -> None:
    async def go() -> None:
        a, b = AgentwalSession("a", store), AgentwalSession("a/b", store)
        await a.add_items([msg("user", "A")])
        await b.add_items([msg("user", "B")])
        assert await a.get_items() == [msg("user", "A")]
        assert await b.get_items() == [msg("user", "B")]
        await a.clear_session()
        assert await b.get_items() == [msg("user", "B")]

    run(go())


def test_session_settings_limit(store: wal.Store) -> None:
    async def go() -> None:
        s = AgentwalSession("lim", store, session_settings=SessionSettings(limit=2))
        await s.add_items([msg("user", str(i)) for i in range(5)])
        assert await s.get_items() == [msg("user", "3"), msg("user", "4")]
        assert len(await s.get_items(limit=4)) == 4  # an explicit limit wins

    run(go())


def test_persists_across_reopen(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as s:
        run(AgentwalSession("p", s).add_items([msg("user", "1"), msg("assistant", "2")]))
    with wal.open(tmp_path / "db") as s:
        session = AgentwalSession("p", s)
        assert run(session.get_items()) == [msg("user", "1"), msg("assistant", "2")]
        assert run(session.pop_item()) == msg("assistant", "2")
    with wal.open(tmp_path / "db") as s:
        assert run(AgentwalSession("p", s).get_items()) == [msg("user", "1")]


def test_concurrent_adds_keep_every_item(store: wal.Store) -> None:
    async def go() -> None:
        s = AgentwalSession("c", store)
        await asyncio.gather(*(s.add_items([msg("user", f"{i}-a"), msg("user", f"{i}-b")]) for i in range(20)))
        got = await s.get_items()
        assert len(got) == 40
        for i in range(20):  # each add_items is atomic and contiguous
            j = got.index(msg("user", f"{i}-a"))
            assert got[j + 1] == msg("user", f"{i}-b")

    run(go())


def test_clear_large_session(store: wal.Store) -> None:
    async def go() -> None:
        s = AgentwalSession("big", store)
        await s.add_items([msg("user", str(i)) for i in range(2500)])
        assert len(await s.get_items()) == 2500
        await s.clear_session()
        assert await s.get_items() == []
        assert list(store.scan(b"oa/")) == []

    run(go())
