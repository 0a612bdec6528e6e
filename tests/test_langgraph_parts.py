"""AgentwalSaver stores a growing list (a MessagesState's history) as parts: each step writes
the new messages, not the whole history, and every read gives back exactly what a whole
write would have. The hint of which parts hold a channel's previous value is checked against
the store before use, so a fork, a prune, another saver or damage never gives a wrong value."""

from __future__ import annotations

import os
import random
import signal
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

import wal
import wal.integrations.langgraph as lg
from wal.integrations.langgraph import AgentwalSaver

MSG = 2048


def texts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_letters + " ", k=MSG)) for _ in range(n)]


def chat_graph(saver: Any, steps: int, seed: int = 7) -> Any:
    """One message per step until the history holds `steps` messages."""
    bodies = texts(steps, seed)

    def step(state: MessagesState) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=bodies[n], id=f"m{n}")]}

    g = StateGraph(MessagesState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if len(s["messages"]) < steps else END)
    return g.compile(checkpointer=saver)


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 1000}


def keys(store: wal.Store, prefix: bytes) -> list[bytes]:
    return [k for k, _ in store.scan(prefix)]


def newest_parts(store: wal.Store, thread: str) -> list[Any]:
    """The parts named by the newest stored value of the thread's `messages` channel."""
    _, blob = max((kv for kv in store.scan(b"lg/b/" + thread.encode() + b"/") if b"/messages/" in kv[0]),
                    key=lambda kv: kv[0])
    head, _ = lg._unframe(blob)
    assert head["t"] == "agentwal.parts", head
    return list(head["parts"])


def history(saver: Any, thread: str) -> list[list[str]]:
    """Every checkpoint's message contents, newest first."""
    return [[m.content for m in t.checkpoint["channel_values"].get("messages", [])]
            for t in saver.list({"configurable": {"thread_id": thread}})]


def test_a_growing_history_is_written_as_parts_and_read_back_exactly(tmp_path: Path) -> None:
    steps = 120
    reference = InMemorySaver()
    chat_graph(reference, steps).invoke({"messages": []}, cfg("t"))
    with wal.open(tmp_path / "db", durability="interval") as store:
        saver = AgentwalSaver(store)
        before = store.stats()["bytes_written"]
        chat_graph(saver, steps).invoke({"messages": []}, cfg("t"))
        written = store.stats()["bytes_written"] - before
        # Every checkpoint, old ones included, reads back as the whole-value saver's does.
        assert history(saver, "t") == history(reference, "t")
        parts = keys(store, b"lg/p/")
        assert parts, "no value was stored in parts"
        # Merged like a binary counter: the newest value has O(log n) parts.
        latest = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert latest is not None and len(latest.checkpoint["channel_values"]["messages"]) == steps
        assert 1 <= len(newest_parts(store, "t")) <= steps.bit_length() + 1
    # Whole values would write the history at every step: steps^2 / 2 messages in all.
    whole = MSG * steps * steps // 2
    assert written < whole / 4, (written, whole)
    with wal.open(tmp_path / "db") as store:  # and after a reopen, from the state
        assert history(AgentwalSaver(store), "t") == history(reference, "t")


def test_a_history_past_the_record_limit_grows_a_step_at_a_time_whichever_saver_writes_it(
        tmp_path: Path) -> None:
    """A history of 1 MiB messages: its 16th message merged the 15 before it into one part as
    large as the whole history, refused past the 16 MiB record limit, while a new saver on the
    same store (which wrote the value whole once, then small parts after it) took the same step.
    Parts now merge only up to 1 MiB, and a saver continues from the parts of the latest
    checkpoint it reads: each step writes its new message and little more, from any saver."""
    body = "x" * (1 << 20)

    def step(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=body, id=f"m{len(state['messages'])}")]}

    def graph(saver: Any) -> Any:
        g = StateGraph(MessagesState)
        g.add_node("step", step)
        g.add_edge(START, "step")
        g.add_edge("step", END)
        return g.compile(checkpointer=saver)

    with wal.open(tmp_path / "db", durability="interval") as store:
        first = graph(AgentwalSaver(store))
        for _ in range(18):  # past 16 MiB of history
            first.invoke({"messages": []}, cfg("t"))
        second = graph(AgentwalSaver(store))  # as in a new process
        before = store.stats()["bytes_written"]
        out = second.invoke({"messages": []}, cfg("t"))
        assert len(out["messages"]) == 19
        assert store.stats()["bytes_written"] - before < 3 << 20, "the new saver wrote the history whole"
        first.invoke({"messages": []}, cfg("t"))
        latest = AgentwalSaver(store).get_tuple({"configurable": {"thread_id": "t"}})
        assert latest is not None
        assert [m.id for m in latest.checkpoint["channel_values"]["messages"]] == [f"m{i}" for i in range(20)]
        assert max(length for _, length in newest_parts(store, "t")) <= (1 << 20) + 4096


def test_a_fork_from_an_older_checkpoint_is_written_whole_and_reads_back(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db", durability="interval") as store:
        saver = AgentwalSaver(store)
        graph = chat_graph(saver, 30)
        graph.invoke({"messages": []}, cfg("t"))
        states = list(graph.get_state_history(cfg("t")))
        older = next(s for s in states if len(s.values.get("messages", [])) == 20)
        # Time travel: a new branch from the 20-message checkpoint, with another message.
        forked = graph.update_state(older.config, {"messages": [HumanMessage(content="x" * 5000, id="fork")]})
        branch = graph.get_state(forked)
        contents = [m.content for m in branch.values["messages"]]
        expected = [m.content for m in older.values["messages"]] + ["x" * 5000]
        assert contents == expected
        # The original branch's newest checkpoint still reads back whole.
        assert len(graph.get_state(states[0].config).values["messages"]) == 30


def test_another_saver_deleting_the_thread_never_leaves_a_stale_hint_in_use(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db", durability="interval") as store:
        first, second = AgentwalSaver(store), AgentwalSaver(store)
        chat_graph(first, 25, seed=1).invoke({"messages": []}, cfg("t"))
        second.delete_thread("t")
        assert keys(store, b"lg/") == []
        # `first` remembers parts that are gone; the same thread, other messages.
        chat_graph(first, 25, seed=2).invoke({"messages": []}, cfg("t"))
        got = history(second, "t")[0]
        assert got == texts(25, seed=2)


def test_a_missing_or_cut_part_is_a_corruption_error_naming_the_channel(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db", durability="interval") as store:
        saver = AgentwalSaver(store)
        chat_graph(saver, 20).invoke({"messages": []}, cfg("t"))
        part = keys(store, b"lg/p/")[-1]
        store.put(part, store.get(part)[:-1])  # type: ignore[index]
        with pytest.raises(wal.CorruptionError, match="channel 'messages'") as exc:
            saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert str(store.path) in str(exc.value)
        store.delete(part)
        with pytest.raises(wal.CorruptionError, match="does not hold it"):
            saver.get_tuple({"configurable": {"thread_id": "t"}})


def test_a_version_written_again_with_other_bytes_leaves_the_parts_others_use(tmp_path: Path) -> None:
    """Parts are named by version and a hash of their bytes: the same version put again with
    another value (hand-made versions) writes new parts beside the ones older values use."""
    with wal.open(tmp_path / "db", durability="interval") as store:
        saver = AgentwalSaver(store)
        msgs = [AIMessage(content=t, id=f"m{i}") for i, t in enumerate(texts(12))]

        def put(cid: str, value: list[Any], version: int) -> None:
            ckpt = empty_checkpoint()
            ckpt["id"] = cid
            ckpt["channel_values"] = {"messages": value}
            ckpt["channel_versions"] = {"messages": version}
            saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, ckpt, {}, {"messages": version})

        put("1", msgs[:10], 1)
        put("2", msgs[:12], 2)  # parts: the first value's, then the new messages
        put("3", msgs[:10][::-1], 1)  # version 1 again, other bytes: must not touch "2"'s parts

        def read(cid: str) -> list[str]:
            tup = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}})
            assert tup is not None
            return [m.content for m in tup.checkpoint["channel_values"]["messages"]]

        assert read("2") == [m.content for m in msgs[:12]]
        assert read("3") == [m.content for m in msgs[:10][::-1]]


def test_prune_copy_and_delete_keep_exactly_the_parts_in_use(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db", durability="interval") as store:
        saver = AgentwalSaver(store)
        graph = chat_graph(saver, 40)
        graph.invoke({"messages": []}, cfg("t"))
        expected = texts(40)
        saver.copy_thread("t", "u")
        assert len(keys(store, b"lg/p/u/")) == len(keys(store, b"lg/p/t/")) > 0
        saver.prune(["t"], strategy="keep_latest")
        assert history(saver, "t") == [expected]
        # What the newest value names is kept; nothing else is.
        stored = {k.split(b"/messages/", 1)[1].decode() for k in keys(store, b"lg/p/t/")}
        assert stored == {name for name, _ in newest_parts(store, "t")}
        # The copy is whole and untouched by the source's prune, and carries on.
        assert history(saver, "u")[0] == expected
        chat_graph(saver, 45).invoke({"messages": []}, cfg("u"))
        assert history(saver, "u")[0] == texts(45)
        saver.delete_thread("t")
        assert keys(store, b"lg/p/t/") == [] and keys(store, b"lg/b/t/") == []
        assert history(saver, "u")[0][:40] == expected


def test_a_prune_while_the_run_goes_on_leaves_the_new_checkpoint_whole(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A prune read the checkpoints, then the parts, later: a step committed in between wrote a
    part its (unseen) checkpoint needs, and the prune deleted it as used by no kept checkpoint:
    the newest checkpoint could not be read. Now it reads all of them from one snapshot."""
    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        chat_graph(saver, 8).invoke({"messages": []}, cfg("t"))
        unused_parts = AgentwalSaver._unused_parts

        def with_a_step_committed_meanwhile(self: AgentwalSaver, *args: Any) -> Any:
            monkeypatch.setattr(AgentwalSaver, "_unused_parts", unused_parts)
            chat_graph(saver, 9).invoke({"messages": []}, cfg("t"))  # the run goes on: one more step
            return unused_parts(self, *args)

        monkeypatch.setattr(AgentwalSaver, "_unused_parts", with_a_step_committed_meanwhile)
        saver.prune(["t"], strategy="keep_latest")
        assert history(saver, "t")[0] == texts(9)
        with pytest.raises(wal.ArgumentTypeError, match=r"not one str \('t'\): pass \['t'\]"):
            saver.prune("t", strategy="delete")  # a lone string: it pruned threads named by its characters
        with pytest.raises(wal.ArgumentTypeError):
            saver.delete_for_runs("run")
        assert history(saver, "t")[0] == texts(9)


def test_a_thread_written_whole_by_an_older_saver_reads_and_carries_on_in_parts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with wal.open(tmp_path / "db", durability="interval") as store:
        with monkeypatch.context() as m:
            m.setattr(lg, "_PARTS_MIN", 1 << 40)  # the saver before parts: every value whole
            chat_graph(AgentwalSaver(store), 20).invoke({"messages": []}, cfg("t"))
        assert keys(store, b"lg/p/") == []
        saver = AgentwalSaver(store)
        assert history(saver, "t")[0] == texts(20)
        chat_graph(saver, 30).invoke({"messages": []}, cfg("t"))
        assert keys(store, b"lg/p/")
        assert history(saver, "t")[0] == texts(30)
        assert texts(20) in history(saver, "t")  # the checkpoints written whole still read


CHILD = r"""
import sys, time
sys.path.insert(0, {tests!r})
import wal
from test_langgraph_parts import chat_graph, cfg
from wal.integrations.langgraph import AgentwalSaver
with AgentwalSaver.from_conn_string({db!r}, durability="sync") as saver:
    graph = chat_graph(saver, 120)
    for i, _ in enumerate(graph.stream({{"messages": []}}, cfg("t"), durability="sync")):
        print(i, flush=True)
"""


def test_a_run_killed_mid_history_resumes_with_its_parts_exact(tmp_path: Path) -> None:
    db = str(tmp_path / "db")
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(Path(__file__).parent), db=db)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    for line in child.stdout:  # past 16 KiB of history, so the value is in parts, then a kill
        if int(line) >= 40:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    expected = texts(120)
    with wal.open(db) as store:
        assert keys(store, b"lg/p/")
        saver = AgentwalSaver(store)
        done = history(saver, "t")[0]
        assert len(done) >= 40 and done == expected[:len(done)]
        chat_graph(saver, 120).invoke(None, cfg("t"))  # resume from the last checkpoint
        assert history(saver, "t")[0] == expected


def test_an_encrypted_stores_part_names_are_keyed_so_they_confirm_no_guessed_message(tmp_path: Path) -> None:
    """Keys are stored in the clear: a part named by a plain hash of its bytes let whoever reads
    the files confirm a guessed message. On an encrypted store the name is keyed (and still
    reads back exactly); a plain store's stays the BLAKE2b-64 FORMAT.md gives."""
    import hashlib  # noqa: PLC0415

    key = bytes(range(32))
    for name, options in (("plain", {}), ("encrypted", {"encryption": key})):
        store = wal.open(tmp_path / name, **options)
        saver = AgentwalSaver(store)
        with_history = chat_graph(saver, 12)
        final = with_history.invoke({"messages": [HumanMessage(content="hi", id="h")]}, cfg("t"))
        assert len(final["messages"]) == 12
        parts = list(store.scan(b"lg/p/t/"))  # (key, the part's bytes)
        assert parts
        plain_names = sum(key.rsplit(b"/", 1)[1] == hashlib.blake2b(piece, digest_size=8).hexdigest().encode()
                          for key, piece in parts)
        assert plain_names == (len(parts) if name == "plain" else 0), name
        assert history(saver, "t")[0] == ["hi", *texts(12)[1:12]]
        store.close()


def test_a_put_racing_a_newer_put_of_its_thread_leaves_the_newest_as_latest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "latest" pointer was read and rewritten without a version check: a put of an older
    checkpoint racing a newer one's could leave get_tuple on the older."""
    import wal.store.store as store_module  # noqa: PLC0415

    with wal.open(tmp_path / "db") as store:
        saver = AgentwalSaver(store)
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        older, newer = empty_checkpoint(), empty_checkpoint()
        older["id"], newer["id"] = "1ef00000-0000-6000-8000-000000000001", "1ef00000-0000-6000-8000-000000000002"
        get = store_module.Transaction.get
        raced = []

        def get_then_newer_put_lands(self: Any, key: bytes | str, default: bytes | None = None) -> Any:
            value = get(self, key, default)
            if key.startswith(b"lg/l/") and not raced:  # type: ignore[union-attr]
                raced.append(True)
                saver.put(config, newer, {}, {})  # another thread's put of the newer one commits now
            return value

        monkeypatch.setattr(store_module.Transaction, "get", get_then_newer_put_lands)
        saver.put(config, older, {}, {})
        monkeypatch.undo()
        assert raced and saver.get_tuple(config).checkpoint["id"] == newer["id"]
