"""AgentwalSaver against the LangGraph team's conformance suite (PyPI `langgraph-checkpoint-conformance`)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate

import wal
from wal.integrations.langgraph import AgentwalSaver


@checkpointer_test(name="AgentwalSaver")
async def agentwal_checkpointer() -> AsyncIterator[AgentwalSaver]:
    with tempfile.TemporaryDirectory() as tmp:
        async with AgentwalSaver.from_conn_string(Path(tmp) / "db") as saver:  # as a LangGraph user would
            yield saver


def test_conformance_suite_passes() -> None:
    report = asyncio.run(validate(agentwal_checkpointer))
    report.print_report()
    failures: dict[str, Any] = {
        name: result.failures for name, result in report.results.items() if result.passed is False
    }
    assert report.passed_all_base(), failures
    assert not failures


# ---- a real graph on the saver --------------------------------------------------------------------

from typing import TypedDict  # noqa: E402

from langgraph.graph import END, START, StateGraph  # noqa: E402


class S(TypedDict):
    big: str
    counter: int


def build(saver: AgentwalSaver) -> Any:
    def bump(state: S) -> dict[str, int]:
        return {"counter": state["counter"] + 1}

    def route(state: S) -> str:
        return "bump" if state["counter"] < 5 else END

    g = StateGraph(S)
    g.add_node("bump", bump)
    g.add_edge(START, "bump")
    g.add_conditional_edges("bump", route)
    return g.compile(checkpointer=saver)


def test_graph_runs_and_stores_unchanged_channels_once(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        graph = build(saver)
        cfg = {"configurable": {"thread_id": "t1"}}
        out = graph.invoke({"big": "x" * 100_000, "counter": 0}, cfg, durability="sync")
        assert out["counter"] == 5
        state = graph.get_state(cfg)
        assert state.values == {"big": "x" * 100_000, "counter": 5}
        history = list(graph.get_state_history(cfg))
        assert len(history) >= 6
        big_blobs = [k for k, _ in store.scan(b"lg/b/t1//big/")]
        counter_blobs = [k for k, _ in store.scan(b"lg/b/t1//counter/")]
        assert len(big_blobs) == 1  # written once, not at every step
        assert len(counter_blobs) >= 5
        # time travel: an earlier checkpoint still has its own counter and the shared big value
        old = history[-2]
        assert old.values["big"] == "x" * 100_000 and old.values["counter"] < 5
        saver.delete_thread("t1")
        assert list(store.scan(b"lg/")) == []
        assert graph.get_state(cfg).values == {}


def test_graph_async_and_reopen(tmp_path: Path) -> None:
    async def go() -> Any:
        with wal.open(tmp_path / "db") as store:
            graph = build(AgentwalSaver(store))
            return await graph.ainvoke({"big": "b", "counter": 0}, {"configurable": {"thread_id": "t"}})

    assert asyncio.run(go())["counter"] == 5
    with wal.open(tmp_path / "db") as store:
        graph = build(AgentwalSaver(store))
        assert graph.get_state({"configurable": {"thread_id": "t"}}).values == {"big": "b", "counter": 5}
