"""AgentwalSaver's lifecycle like LangGraph's own savers: `from_conn_string` owns its store (sync and
async forms), the constructor refuses what is not a store, and a cancelled async write took effect
before the CancelledError or never will."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph

import wal
from wal.integrations.langgraph import AgentwalSaver


def _cfg(thread: str, cid: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def test_from_conn_string_opens_and_closes_its_store(tmp_path: Path) -> None:
    with AgentwalSaver.from_conn_string(tmp_path / "db", durability="interval", rpo_ms=50) as saver:
        assert isinstance(saver, AgentwalSaver)
        assert saver.store.stats()["durability"] == "interval"  # open_kwargs reached wal.open
        ck = empty_checkpoint()
        saver.put(_cfg("t"), ck, {"step": 1}, {})
        store = saver.store
    with pytest.raises(wal.ClosedError):
        store.get(b"x")
    # closed means the lock is released: the directory opens again, with the checkpoint in it
    with AgentwalSaver.from_conn_string(str(tmp_path / "db")) as saver:
        tup = saver.get_tuple(_cfg("t"))
        assert tup is not None and tup.checkpoint["id"] == ck["id"]


def test_from_conn_string_closes_on_error(tmp_path: Path) -> None:
    with pytest.raises(KeyError), AgentwalSaver.from_conn_string(tmp_path / "db") as saver:
        store = saver.store
        raise KeyError("boom")
    with pytest.raises(wal.ClosedError):
        store.get(b"x")


def test_async_from_conn_string(tmp_path: Path) -> None:
    async def go() -> wal.Store:
        async with AgentwalSaver.from_conn_string(tmp_path / "db") as saver:
            ck = empty_checkpoint()
            await saver.aput(_cfg("t"), ck, {"step": 1}, {})
            tup = await saver.aget_tuple(_cfg("t"))
            assert tup is not None and tup.checkpoint["id"] == ck["id"]
            return saver.store

    store = asyncio.run(go())
    with pytest.raises(wal.ClosedError):
        store.get(b"x")


def test_from_conn_string_is_entered_once(tmp_path: Path) -> None:
    scope = AgentwalSaver.from_conn_string(tmp_path / "db")
    with scope:
        pass
    with pytest.raises(RuntimeError, match="once"), scope:
        pass


@pytest.mark.parametrize("bad", ["agent.db", Path("agent.db"), None, object()])
def test_constructor_refuses_what_is_not_a_store(bad: Any) -> None:
    with pytest.raises(TypeError, match="from_conn_string") as info:
        AgentwalSaver(bad)
    assert isinstance(info.value, wal.WalError)


def test_from_conn_string_refuses_a_store(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as store, pytest.raises(TypeError, match=r"AgentwalSaver\(store\)"):
        AgentwalSaver.from_conn_string(store)  # type: ignore[arg-type]


def test_a_durability_that_is_no_level_and_a_prune_strategy_that_is_none_are_argument_errors(tmp_path: Path) -> None:
    """AgentwalSaver(durability="fast") was taken, and every commit failed later; prune's unknown
    strategy raised a plain ValueError."""
    with wal.open(tmp_path / "db", durability="interval", rpo_ms=50) as store:
        with pytest.raises(wal.ArgumentError, match="unknown durability 'fast'"):
            AgentwalSaver(store, durability="fast")
        with pytest.raises(wal.ArgumentError, match="not a weaker one"):
            AgentwalSaver(store, durability="buffered")
        saver = AgentwalSaver(store, durability="sync")
        with pytest.raises(wal.ArgumentError, match="prune strategy must be"):
            saver.prune(["t"], strategy="bogus")


def test_cancelled_async_writes_took_effect_before_the_error_or_never(tmp_path: Path) -> None:
    """Cancel aput / aput_writes while their worker thread commits. What the caller can read the
    moment it has the CancelledError is what the store holds for good (checked after a reopen)."""
    rounds = 30
    seen: dict[str, bool] = {}
    writes_seen: dict[str, int] = {}

    async def go(saver: AgentwalSaver) -> int:
        cancelled = 0
        for i in range(rounds):
            ck = empty_checkpoint()
            task = asyncio.ensure_future(saver.aput(_cfg(f"t{i}"), ck, {"step": i}, {}))
            await asyncio.sleep(0)  # the worker thread has the call
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                cancelled += 1
            seen[f"t{i}"] = saver.get_tuple(_cfg(f"t{i}")) is not None
            wtask = asyncio.ensure_future(saver.aput_writes(_cfg(f"w{i}", ck["id"]), [("a", i), ("b", i)], "task"))
            await asyncio.sleep(0)
            wtask.cancel()
            try:
                await wtask
            except asyncio.CancelledError:
                cancelled += 1
            writes_seen[f"w{i}"] = len(list(saver.store.scan(b"lg/w/w%d/" % i)))
        return cancelled

    with AgentwalSaver.from_conn_string(tmp_path / "db") as saver:
        cancelled = asyncio.run(go(saver))
    assert cancelled == 2 * rounds
    assert all(seen.values()) and all(n == 2 for n in writes_seen.values())  # done before the error
    with AgentwalSaver.from_conn_string(tmp_path / "db") as saver:
        assert {t: saver.get_tuple(_cfg(t)) is not None for t in seen} == seen
        assert {t: len(list(saver.store.scan(b"lg/w/%s/" % t.encode()))) for t in writes_seen} == writes_seen


def test_an_int_or_uuid_thread_id_names_the_same_thread_as_its_str_in_every_saver_call(tmp_path: Path) -> None:
    """A graph passes an int or a UUID thread_id on as it is; AgentwalSaver's list and
    delete_thread called with one raised an AttributeError from its key escaping (SqliteSaver
    takes 7 and "7" for one thread). Other types are refused clearly."""
    class S(TypedDict):
        n: int

    b = StateGraph(S)
    b.add_node("x", lambda s: {"n": s["n"] + 1})
    b.add_edge(START, "x")
    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        g = b.compile(checkpointer=saver)
        tid = uuid.uuid4()
        for thread in (7, tid):
            assert g.invoke({"n": 0}, {"configurable": {"thread_id": thread}}) == {"n": 1}
            assert [h.values for h in g.get_state_history({"configurable": {"thread_id": thread}})] == \
                [{"n": 1}, {"n": 0}, {}]
        assert len(list(saver.list({"configurable": {"thread_id": "7"}}))) == 3
        saver.copy_thread(7, 8)
        assert len(list(saver.list({"configurable": {"thread_id": 8}}))) == 3
        saver.prune([8])
        saver.delete_thread(7)
        saver.delete_thread(tid)
        assert list(saver.list({"configurable": {"thread_id": 7}})) == []
        assert list(saver.list({"configurable": {"thread_id": str(tid)}})) == []
        with pytest.raises(wal.ArgumentTypeError, match="thread_id must be a str"):
            saver.delete_thread(7.5)  # type: ignore[arg-type]
