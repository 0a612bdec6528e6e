"""AgentwalSaver's maintenance operations beyond the conformance suite's checks: `prune` keeps
what a DeltaChannel needs to be rebuilt and frees the channel values nothing references,
`delete_for_runs` leaves the latest pointer on the newest survivor, `copy_thread` gives a
thread a graph can go on running, and all of it holds when one call spans several
transactions."""

from __future__ import annotations

import operator
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.channels.delta")

from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

import wal
import wal.integrations.langgraph as lg
from wal.integrations.langgraph import AgentwalSaver


def _extend(state: list[int], writes: list[list[int]]) -> list[int]:
    return state + [x for w in writes for x in w]


class Steps(TypedDict):
    log: Annotated[list[int], DeltaChannel(_extend, snapshot_frequency=4)]
    n: int


def delta_graph(saver: AgentwalSaver) -> Any:
    """Appends n to a DeltaChannel list and counts up to 10: a snapshot every 4 updates, so the
    newest checkpoint (10 updates) is not one, and rebuilding `log` needs its ancestors."""
    def step(state: Steps) -> dict[str, Any]:
        return {"log": [state["n"]], "n": state["n"] + 1}

    g = StateGraph(Steps)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < 10 else END)
    return g.compile(checkpointer=saver)


class Big(TypedDict):
    big: str
    counter: Annotated[int, operator.add]


def counting_graph(saver: AgentwalSaver) -> Any:
    def bump(state: Big) -> dict[str, int]:
        return {"counter": 1}

    g = StateGraph(Big)
    g.add_node("bump", bump)
    g.add_edge(START, "bump")
    g.add_conditional_edges("bump", lambda s: "bump" if s["counter"] < 5 else END)
    return g.compile(checkpointer=saver)


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def keys(store: wal.Store, prefix: bytes) -> list[bytes]:
    return [k for k, _ in store.scan(prefix)]


def test_prune_keeps_the_ancestors_a_delta_channel_is_rebuilt_from(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        graph = delta_graph(saver)
        graph.invoke({"log": [], "n": 0}, cfg("t"))
        before = graph.get_state(cfg("t")).values
        assert before == {"log": list(range(10)), "n": 10}
        history = len(list(graph.get_state_history(cfg("t"))))

        # What a prune blind to DeltaChannels would leave: the newest checkpoint alone.
        saver.copy_thread("t", "naive")
        with store.snapshot() as snap:
            by_id = saver._checkpoints("naive", snap)[""]
            doomed = set(by_id) - {max(by_id)}
            naive = saver._doomed_keys(snap, "naive", "", by_id, doomed)
        saver._commit_batched(naive)
        assert graph.get_state(cfg("naive")).values["log"] != before["log"]  # the log cannot be rebuilt

        saver.prune(["t"])
        kept = list(graph.get_state_history(cfg("t")))
        assert graph.get_state(cfg("t")).values == before
        assert 2 <= len(kept) < history  # pruned, but not down to the newest alone
        # the graph goes on from the pruned thread
        graph.update_state(cfg("t"), {"log": [99]})
        assert graph.get_state(cfg("t")).values["log"] == [*range(10), 99]


def test_prune_keep_latest_frees_the_values_only_older_checkpoints_used(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        graph = counting_graph(saver)
        graph.invoke({"big": "x" * 10_000, "counter": 0}, cfg("t"))
        graph.invoke({"big": "x" * 10_000, "counter": 0}, cfg("other"))
        before = graph.get_state(cfg("t")).values
        other_before = keys(store, b"lg/c/other/") + keys(store, b"lg/b/other/") + keys(store, b"lg/w/other/")
        counter_values = len(keys(store, b"lg/b/t//counter/"))
        assert counter_values >= 5

        saver.prune(["t", "t", "missing"])
        assert graph.get_state(cfg("t")).values == before
        assert len(list(graph.get_state_history(cfg("t")))) == 1
        assert len(keys(store, b"lg/c/t/")) == 1
        assert len(keys(store, b"lg/b/t//counter/")) == 1  # the newest checkpoint's version only
        assert len(keys(store, b"lg/b/t//big/")) == 1  # shared with the newest: kept
        assert keys(store, b"lg/c/other/") + keys(store, b"lg/b/other/") + keys(store, b"lg/w/other/") == other_before

        with pytest.raises(ValueError, match="keep_latest"):
            saver.prune(["other"], strategy="keep_oldest")
        assert len(keys(store, b"lg/c/other/")) == len([k for k in other_before if k.startswith(b"lg/c/")])
        saver.prune(["other"], strategy="delete")
        assert keys(store, b"lg/") == [k for k in keys(store, b"lg/") if b"/other/" not in k]


def _put(saver: AgentwalSaver, thread: str, run: str, parent: str | None, value: str) -> str:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"v": value, "shared": "s"}
    checkpoint["channel_versions"] = {"v": f"{value}-1", "shared": "1"}
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if parent:
        conf["checkpoint_id"] = parent
    new_versions = {"v": f"{value}-1"} if parent else {"v": f"{value}-1", "shared": "1"}
    saver.put({"configurable": conf}, checkpoint, {"run_id": run, "source": "loop", "step": 0}, new_versions)
    return checkpoint["id"]


def test_delete_for_runs_leaves_the_latest_pointer_on_the_newest_survivor(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        first = _put(saver, "t", "run-a", None, "a")
        second = _put(saver, "t", "run-b", first, "b")
        _put(saver, "t", "run-b", second, "c")
        _put(saver, "u", "run-b", None, "d")
        assert saver.get_tuple(cfg("t")).checkpoint["channel_values"]["v"] == "c"

        saver.delete_for_runs(["run-b"])
        tup = saver.get_tuple(cfg("t"))
        assert tup is not None and tup.config["configurable"]["checkpoint_id"] == first
        assert tup.checkpoint["channel_values"] == {"v": "a", "shared": "s"}
        assert store.get(saver._lkey("t", "")) == first.encode()
        assert keys(store, b"lg/b/t//v/") == [saver._bkey("t", "", "v", "a-1")]
        assert keys(store, b"lg/") == [k for k in keys(store, b"lg/") if b"/u/" not in k]  # u had only run-b
        saver.delete_for_runs([])
        saver.delete_for_runs(["run-a"])
        assert keys(store, b"lg/") == []


def test_a_copied_thread_carries_on_and_leaves_its_source_alone(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        graph = counting_graph(saver)
        graph.invoke({"big": "b", "counter": 0}, cfg("src"))
        source = [s.values for s in graph.get_state_history(cfg("src"))]
        saver.copy_thread("src", "dst")
        assert [s.values for s in graph.get_state_history(cfg("dst"))] == source
        graph.update_state(cfg("dst"), {"counter": 10})
        assert graph.get_state(cfg("dst")).values == {"big": "b", "counter": 15}
        assert [s.values for s in graph.get_state_history(cfg("src"))] == source
        saver.copy_thread("src", "src")  # a no-op
        assert [s.values for s in graph.get_state_history(cfg("src"))] == source


class RecordingStore:
    """The store, with each transaction's puts and deletes recorded in order (one list per
    transaction), to check the order maintenance calls change keys in."""

    def __init__(self, store: wal.Store) -> None:
        self.store = store
        self.txns: list[list[tuple[str, bytes]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def transaction(self, durability: str | None = None) -> Any:
        inner = self.store.transaction(durability=durability)
        ops: list[tuple[str, bytes]] = []
        self.txns.append(ops)

        class Recorded:
            def __enter__(self) -> Recorded:
                inner.__enter__()
                return self

            def __exit__(self, *exc: Any) -> None:
                inner.__exit__(*exc)

            def put(self, key: bytes, value: bytes) -> None:
                ops.append(("put", key))
                inner.put(key, value)

            def delete(self, key: bytes) -> None:
                ops.append(("delete", key))
                inner.delete(key)

            def get(self, key: bytes) -> bytes | None:
                return inner.get(key)

        return Recorded()

    def order(self, op: str, kinds: bytes) -> list[int]:
        """Indexes of the transactions that `op` keys of these kinds (b"c", b"b", ...)."""
        return [i for i, ops in enumerate(self.txns) if any(o == op and k[3:4] in kinds for o, k in ops)]


def test_a_crash_part_way_never_leaves_a_checkpoint_without_its_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Split into many transactions, deletions take the checkpoints before their values and
    writes, and a copy writes the values and writes before the checkpoints: whichever
    transaction a crash stops at, every checkpoint left has its values."""
    monkeypatch.setattr(lg, "_TXN_BUDGET", 300)
    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        graph = counting_graph(saver)
        for thread in ("a", "b", "c", "d"):
            graph.invoke({"big": "b", "counter": 0}, {**cfg(thread), "metadata": {"run_id": f"run-{thread}"}})
        recorder = RecordingStore(store)
        saver.store = recorder  # type: ignore[assignment]
        for call in (lambda: saver.copy_thread("a", "a2"), lambda: saver.prune(["a"]),
                     lambda: saver.prune(["b"], strategy="delete"), lambda: saver.delete_thread("c"),
                     lambda: saver.delete_for_runs(["run-d"])):
            recorder.txns.clear()
            call()
            assert len(recorder.txns) > 2
            puts_of_values, puts_of_checkpoints = recorder.order("put", b"bw"), recorder.order("put", b"c")
            if puts_of_checkpoints:
                assert max(puts_of_values) <= min(puts_of_checkpoints)
            deleted_checkpoints, deleted_values = recorder.order("delete", b"c"), recorder.order("delete", b"bw")
            if deleted_values:
                assert max(deleted_checkpoints) <= min(deleted_values)
        saver.store = store
        assert graph.get_state(cfg("a2")).values == graph.get_state(cfg("a")).values == {"big": "b", "counter": 5}
        assert all(graph.get_state(cfg(t)).values == {} for t in ("b", "c", "d"))


def test_maintenance_spanning_several_transactions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a budget of a few hundred bytes every call is split into many transactions (the
    path a thread with megabytes to delete or copy takes), and the outcome is the same."""
    monkeypatch.setattr(lg, "_TXN_BUDGET", 300)
    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        graph = delta_graph(saver)
        graph.invoke({"log": [], "n": 0}, {**cfg("t"), "metadata": {"run_id": "run-1"}})
        before = graph.get_state(cfg("t")).values
        commits = store.stats()["commits"]
        saver.copy_thread("t", "copy")
        assert store.stats()["commits"] - commits > 3
        assert graph.get_state(cfg("copy")).values == before
        commits = store.stats()["commits"]
        saver.prune(["t", "copy"])
        assert store.stats()["commits"] - commits > 3
        assert graph.get_state(cfg("t")).values == before == graph.get_state(cfg("copy")).values
        assert graph.get_state(cfg("copy")).metadata["run_id"] == "run-1"
        commits = store.stats()["commits"]
        saver.delete_for_runs(["run-1", str(uuid.uuid4())])
        assert store.stats()["commits"] - commits > 3
        assert graph.get_state(cfg("copy")).values == {} == graph.get_state(cfg("t")).values
        assert keys(store, b"lg/") == []
