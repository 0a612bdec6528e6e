"""AgentwalSaver at `sync`: one fdatasync per LangGraph step. A task's pending writes
(`put_writes`) are written to the operating system at once and made durable by the fdatasync of
the step's checkpoint (`put`), which the log's prefix order makes cover them, or by the saver's
next read. Real store, real fdatasyncs (counted by the log), a real process killed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint

from wal.integrations.langgraph import AgentwalSaver


def _cfg(thread: str, cid: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def test_a_step_at_sync_costs_one_fdatasync(tmp_path: Path) -> None:
    with AgentwalSaver.from_conn_string(tmp_path / "db") as saver:  # the store at sync
        store = saver.store
        config = saver.put(_cfg("t"), empty_checkpoint(), {"step": 0}, {})
        for step in range(1, 11):
            before = store.stats()["fsyncs"]
            saver.put_writes(config, [("messages", f"m{step}")], task_id=f"a{step}")  # two tasks finish,
            saver.put_writes(config, [("other", step)], task_id=f"b{step}")
            unsynced = store.watermarks.written
            assert store.watermarks.durable < unsynced  # written to the OS, not yet durable
            config = saver.put(config, empty_checkpoint(), {"step": step}, {})  # then the step's checkpoint
            assert store.stats()["fsyncs"] - before == 1, step
            assert store.watermarks.durable >= unsynced  # the put's fdatasync covered the writes
        assert saver._unsynced == 0


def test_pending_writes_are_read_back_at_once_and_first_writer_wins(tmp_path: Path) -> None:
    with AgentwalSaver.from_conn_string(tmp_path / "db") as saver:
        config = saver.put(_cfg("t"), empty_checkpoint(), {"step": 0}, {})
        saver.put_writes(config, [("ch", "first")], task_id="task")
        saver.put_writes(config, [("ch", "second")], task_id="task")  # a repeat: the first is kept
        assert saver._unsynced > saver.store.watermarks.durable
        tup = saver.get_tuple(config)  # waits for the pending writes: durable, so visible at sync
        assert tup is not None and tup.pending_writes == [("task", "ch", "first")]
        assert saver._unsynced == 0 and saver.store.watermarks.durable >= saver.store.watermarks.written


def test_pending_writes_survive_a_killed_process(tmp_path: Path) -> None:
    path = tmp_path / "db"
    code = textwrap.dedent(f"""
        import os
        from langgraph.checkpoint.base import empty_checkpoint
        import wal
        from wal.integrations.langgraph import AgentwalSaver
        saver = AgentwalSaver(wal.open({str(path)!r}))
        config = saver.put({{"configurable": {{"thread_id": "t", "checkpoint_ns": ""}}}}, empty_checkpoint(),
                           {{"step": 0}}, {{}})
        saver.put_writes(config, [("ch", "done")], task_id="task")
        print(config["configurable"]["checkpoint_id"], flush=True)
        os._exit(0)  # killed: no close, no fdatasync of the pending write
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    cid = done.stdout.strip()
    with AgentwalSaver.from_conn_string(path) as saver:
        tup = saver.get_tuple(_cfg("t", cid))
        assert tup is not None and tup.pending_writes == [("task", "ch", "done")]


def test_a_weaker_store_is_unchanged_and_a_sync_saver_on_it_defers_too(tmp_path: Path) -> None:
    with AgentwalSaver.from_conn_string(tmp_path / "a", durability="interval", rpo_ms=50) as saver:
        config = saver.put(_cfg("t"), empty_checkpoint(), {"step": 0}, {})
        saver.put_writes(config, [("ch", 1)], task_id="task")
        assert saver._unsynced == 0  # nothing to defer: no commit of this saver waits for an fdatasync
    with AgentwalSaver.from_conn_string(tmp_path / "b", durability="interval", rpo_ms=60_000) as inner:
        saver = AgentwalSaver(inner.store, durability="sync")  # every checkpoint asks for sync
        config = saver.put(_cfg("t"), empty_checkpoint(), {"step": 0}, {})
        before = saver.store.stats()["fsyncs"]
        saver.put_writes(config, [("ch", 1)], task_id="task")
        saver.put(config, empty_checkpoint(), {"step": 1}, {})
        assert saver.store.stats()["fsyncs"] - before == 1
