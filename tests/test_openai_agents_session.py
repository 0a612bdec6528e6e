"""AgentwalSession against the OpenAI Agents SDK's Session contract (no model, no network)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner
from agents.memory import Session, SessionABC, SessionSettings
from agents.testing import ScriptedModel, assistant_message

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


def test_any_session_id_the_sdk_takes_works_and_ids_that_fit_keep_their_keys(store: wal.Store) -> None:
    # SQLiteSession takes an id of any length; ours failed every call past ~490 bytes (the
    # store's key limit), and a lone surrogate raised a raw UnicodeEncodeError.
    long_ids = ["user-42/" + "c" * 500, "user-42/" + "c" * 501, "é" * 4000]
    fitting = "f" * 489

    async def go() -> None:
        for sid in [*long_ids, fitting]:
            session = AgentwalSession(sid, store)
            await session.add_items([msg("user", sid[:20]), msg("assistant", "ok")])
            assert await session.pop_item() == msg("assistant", "ok")
        for sid in [*long_ids, fitting]:
            assert await AgentwalSession(sid, store).get_items() == [msg("user", sid[:20])]
        await AgentwalSession(long_ids[0], store).clear_session()
        assert await AgentwalSession(long_ids[0], store).get_items() == []
        assert await AgentwalSession(long_ids[1], store).get_items() == [msg("user", long_ids[1][:20])]

    run(go())
    assert store.get(b"oa/m/" + fitting.encode()) is not None  # the key an id that fits always had
    for bad, error in (("\ud800", wal.ArgumentError), (5, wal.ArgumentTypeError)):
        with pytest.raises(error):
            AgentwalSession(bad, store)  # type: ignore[arg-type]


def test_session_settings_limit(store: wal.Store) -> None:
    async def go() -> None:
        s = AgentwalSession("lim", store, session_settings=SessionSettings(limit=2))
        await s.add_items([msg("user", str(i)) for i in range(5)])
        assert await s.get_items() == [msg("user", "3"), msg("user", "4")]
        assert len(await s.get_items(limit=4)) == 4  # an explicit limit wins

    run(go())


@pytest.mark.parametrize("bad", ["2", 1.5, True])
def test_a_limit_that_is_not_an_int_is_an_argument_type_error(store: wal.Store, bad: Any) -> None:
    """get_items(limit="2") raised a raw TypeError from the thread reading the items."""
    async def go() -> None:
        s = AgentwalSession("lim", store)
        await s.add_items([msg("user", "0")])
        with pytest.raises(wal.ArgumentTypeError, match="limit must be an int"):
            await s.get_items(limit=bad)

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


def test_an_add_committed_while_a_clear_ends_is_kept_with_its_record(store: wal.Store) -> None:
    """clear_session deletes the items in batches until none is left, then the record. An add
    that committed after its last look for items lost its record to that final delete (made
    without a check): the item stayed, unnamed, and the next add wrote over it. Now the add is
    kept, with its record: the clear came first."""
    session = AgentwalSession("s", store)

    class AddOnceTheLastBatchIsGone:
        def __init__(self) -> None:
            self.added = False

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def scan(self, prefix: bytes) -> Any:
            found = list(store.scan(prefix))
            if not found and not self.added:  # the clear saw no item left: another task adds one
                self.added = True
                session.store = store
                session._add_items([msg("user", "added meanwhile")])
            return iter(found)

    async def go() -> None:
        await session.add_items([msg("user", "old")])
        session.store = AddOnceTheLastBatchIsGone()  # type: ignore[assignment]
        await session.clear_session()
        assert session.store is store
        assert await session.get_items() == [msg("user", "added meanwhile")]
        assert await session.get_items(limit=5) == [msg("user", "added meanwhile")]
        await session.add_items([msg("user", "next")])
        assert await session.get_items() == [msg("user", "added meanwhile"), msg("user", "next")]

    run(go())


# ---- lifecycle like SQLiteSession: a path, a shared store, close() -------------------------------


def test_a_path_opens_the_store_and_close_closes_it(tmp_path: Path) -> None:
    session = AgentwalSession("s", tmp_path / "db")
    run(session.add_items([msg("user", "hi")]))
    store = session.store
    session.close()
    with pytest.raises(wal.ClosedError):
        store.get(b"x")
    with pytest.raises(wal.ClosedError):
        run(session.get_items())
    session.close()  # twice is harmless
    again = AgentwalSession("s", str(tmp_path / "db"))  # the lock is free again; the history is there
    assert run(again.get_items()) == [msg("user", "hi")]
    again.close()


def test_sessions_on_one_path_share_one_store_until_the_last_closes(tmp_path: Path) -> None:
    a = AgentwalSession("a", tmp_path / "db")
    b = AgentwalSession("b", str(tmp_path / "sub" / ".." / "db"))  # the same directory
    assert a.store is b.store
    a.close()
    run(b.add_items([msg("user", "still open")]))
    assert run(b.get_items()) == [msg("user", "still open")]
    b.close()
    with pytest.raises(wal.ClosedError):
        b.store.get(b"x")


def test_open_kwargs_go_to_wal_open_and_must_agree_when_shared(tmp_path: Path) -> None:
    with AgentwalSession("a", tmp_path / "db", durability="interval", rpo_ms=50) as a:
        assert a.store.stats()["durability"] == "interval"  # the store opened at that level
        with pytest.raises(ValueError, match="already open in this process"):
            AgentwalSession("b", tmp_path / "db", rpo_ms=10)
        with AgentwalSession("c", tmp_path / "db") as c:  # no options: shares whatever is open
            assert c.store is a.store


def test_a_store_passed_in_stays_open(store: wal.Store) -> None:
    session = AgentwalSession("s", store)
    session.close()
    with pytest.raises(wal.ClosedError) as info:
        run(session.add_items([]))  # refused even when there is nothing to add, as SQLiteSession
    assert isinstance(info.value, RuntimeError)  # the type SQLiteSession raises there
    assert store.get(b"x") is None  # the caller's store is still open


@pytest.mark.parametrize("bad", [None, 42, object()])
def test_what_is_neither_a_store_nor_a_path_is_refused(bad: Any) -> None:
    with pytest.raises(TypeError, match="store directory"):
        AgentwalSession("s", bad)


def test_open_options_with_a_store_are_refused(store: wal.Store) -> None:
    with pytest.raises(TypeError, match="only when the session opens"):
        AgentwalSession("s", store, rpo_ms=5)


def test_session_settings_go_through_the_sdk_coercion(tmp_path: Path) -> None:
    with AgentwalSession("s", tmp_path / "db", session_settings={"limit": 1}) as session:
        assert isinstance(session.session_settings, SessionSettings)
        assert session.session_settings.limit == 1
        run(session.add_items([msg("user", "1"), msg("user", "2")]))
        assert run(session.get_items()) == [msg("user", "2")]
    with pytest.raises(TypeError, match="Unknown session settings"):
        AgentwalSession("s", tmp_path / "db", session_settings={"limmit": 1})
    with pytest.raises(ValueError):
        AgentwalSession("s", tmp_path / "db", session_settings={"limit": "many"})
    with AgentwalSession("s", tmp_path / "db") as again:  # the refused sessions left nothing open
        assert len(run(again.get_items())) == 2


def test_runner_run_with_dict_settings_and_a_path(tmp_path: Path) -> None:
    """The SDK's real Runner.run path (a scripted model from agents.testing, no network)."""
    async def go() -> list[Any]:
        model = ScriptedModel([[assistant_message("first answer")], [assistant_message("second answer")]])
        agent = Agent(name="a", model=model)
        with AgentwalSession("conv", tmp_path / "db", session_settings={"limit": 10}) as session:
            r1 = await Runner.run(agent, "hello", session=session)
            r2 = await Runner.run(agent, "again", session=session)
            assert (r1.final_output, r2.final_output) == ("first answer", "second answer")
            # the second call saw the first turn as history
            assert any("hello" in json.dumps(c.input) for c in model.calls[1:])
            return await session.get_items()

    items = asyncio.run(go())
    assert [i.get("content") for i in items if i.get("role") == "user"] == ["hello", "again"]
    with AgentwalSession("conv", tmp_path / "db") as again:  # and it is on disk
        assert len(run(again.get_items())) == len(items)


# ---- cancellation: done before the CancelledError, or never ----------------------------------------


def test_cancelled_mutations_took_effect_before_the_error_or_never(tmp_path: Path) -> None:
    """Cancel add_items / pop_item / clear_session while their worker commits: the history the
    caller reads the moment it has the CancelledError is the history for good (after a reopen);
    so a caller who retries a cancelled add_items only if its item is missing never adds it twice."""
    rounds = 25

    async def go(session: AgentwalSession) -> tuple[int, list[Any]]:
        cancelled = 0
        for i in range(rounds):
            for make in (lambda i=i: session.add_items([msg("user", f"m{i}")]), session.pop_item,
                         lambda i=i: session.add_items([msg("user", f"n{i}"), msg("assistant", f"a{i}")])):
                task = asyncio.ensure_future(make())
                await asyncio.sleep(0)  # the worker thread has the call
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled += 1
        before = await session.get_items()
        await asyncio.sleep(0.2)  # a worker left running would commit now
        assert await session.get_items() == before
        return cancelled, before

    with AgentwalSession("s", tmp_path / "db") as session:
        cancelled, history = asyncio.run(go(session))
    assert cancelled == 3 * rounds
    assert len(history) == 2 * rounds  # every add and every pop took effect before its error
    with AgentwalSession("s", tmp_path / "db") as session:
        assert run(session.get_items()) == history

        async def clear() -> None:
            task = asyncio.ensure_future(session.clear_session())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await session.get_items() == []

        asyncio.run(clear())
    with AgentwalSession("s", tmp_path / "db") as session:
        assert run(session.get_items()) == []
