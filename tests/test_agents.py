"""wal.agents: streams, tool calls, checkpoints, retention, blobs -- and crashes at the awkward moments."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

import wal
from wal.agents import (
    AgentStore,
    BlobMissingError,
    CheckpointCorruptError,
    CheckpointMismatchError,
    ThreadDeletingError,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[wal.Store]:
    s = wal.open(tmp_path / "db")
    yield s
    s.close()


def blob_files(path: Path) -> list[Path]:
    d = path / "blobs"
    return sorted(p for p in d.rglob("*") if p.is_file()) if d.exists() else []


# ---- streams ---------------------------------------------------------------------------------------


def test_append_read_last_seq_and_atomic_state(store: wal.Store) -> None:
    ag = AgentStore(store, "bot")
    assert ag.last_seq("t1") == 0
    assert ag.append("t1", b"hello", state={"step": b"1", b"x": b"y"}) == 1
    assert ag.append("t1", b"world", state={"step": b"2", "x": None}) == 2
    assert ag.append("t2", b"other") == 1
    assert list(ag.read("t1")) == [(1, b"hello"), (2, b"world")]
    assert list(ag.read("t1", from_seq=2)) == [(2, b"world")]
    assert ag.last_seq("t1") == 2
    assert ag.state("t1") == {b"step": b"2"}
    assert ag.get_state("t1", "x") is None
    # names with separators do not leak into each other
    ag.append("a/b", b"1")
    ag.append("a", b"2")
    assert list(ag.read("a/b")) == [(1, b"1")]
    assert list(ag.read("a")) == [(1, b"2")]
    # namespaces are isolated
    other = AgentStore(store, "other")
    assert other.last_seq("t1") == 0
    assert sorted(ag.threads()) == ["a", "a/b", "t1", "t2"]


def test_state_keys_and_arguments_of_the_wrong_type_are_refused_before_anything_is_written(store: wal.Store) -> None:
    # bytes(5) is five zero bytes and bytes((104, 105)) is b"hi": such keys were stored as that.
    agents = AgentStore(store)
    agents.append("t", b"first", state={b"k": b"v"})
    for bad in (5, (104, 105), None, 1.5):
        with pytest.raises(wal.ArgumentTypeError):
            agents.append("t", b"e", state={bad: b"x"})  # type: ignore[dict-item]
        with pytest.raises(wal.ArgumentTypeError):
            agents.get_state("t", bad)  # type: ignore[arg-type]
    with pytest.raises(wal.ArgumentTypeError):
        agents.read("t", "1")  # type: ignore[arg-type]  # raised at the call, not at the first next()
    with pytest.raises(wal.ArgumentTypeError):
        agents.read(5)  # type: ignore[arg-type]
    with pytest.raises(wal.ArgumentError):
        agents.get_state("t", "\ud800")
    assert agents.last_seq("t") == 1 and agents.state("t") == {b"k": b"v"}
    agents.append("t", b"second", state={"s": b"1", memoryview(b"m"): b"2"})
    assert agents.state("t") == {b"k": b"v", b"s": b"1", b"m": b"2"}
    assert list(agents.read("t", 2)) == [(2, b"second")]


def test_append_is_atomic_with_state_on_failure(store: wal.Store) -> None:
    ag = AgentStore(store)
    ag.append("t", b"e1")
    with pytest.raises(wal.ArgumentError):
        ag.append("t", b"e2", state={"k" * 600: b"too long key"})
    assert ag.last_seq("t") == 1
    assert list(ag.read("t")) == [(1, b"e1")]


def test_concurrent_appenders_get_contiguous_seqs(store: wal.Store) -> None:
    ag = AgentStore(store)
    got: list[int] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(40):
            seq = ag.append("shared", f"{n}-{i}".encode())
            with lock:
                got.append(seq)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 241))
    events = list(ag.read("shared"))
    assert [s for s, _ in events] == list(range(1, 241))
    assert ag.last_seq("shared") == 240


def test_streams_survive_reopen(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as s:
        AgentStore(s).append("t", b"x", state={"k": b"v"})
    with wal.open(tmp_path / "db") as s:
        ag = AgentStore(s)
        assert list(ag.read("t")) == [(1, b"x")]
        assert ag.get_state("t", "k") == b"v"
        assert ag.append("t", b"y") == 2


# ---- tool calls --------------------------------------------------------------------------------------


def test_tool_call_intent_outcome_idempotency(store: wal.Store) -> None:
    ag = AgentStore(store)
    rec = ag.begin_call("t", "call-1", "search", b'{"q": 1}')
    assert rec.new and rec.status == "pending" and rec.args == b'{"q": 1}'
    assert [c.call_id for c in ag.pending_calls()] == ["call-1"]
    assert [c.call_id for c in ag.pending_calls("t")] == ["call-1"]
    assert ag.pending_calls("other") == []
    again = ag.begin_call("t", "call-1", "search", b'{"q": 1}')
    assert not again.new and again.status == "pending"
    done = ag.end_call("t", "call-1", b"result!")
    assert done.status == "done" and done.result == b"result!"
    assert ag.pending_calls() == []
    # a finished call returns its recorded outcome instead of re-registering
    third = ag.begin_call("t", "call-1", "search", b'{"q": 1}')
    assert not third.new and third.status == "done" and third.result == b"result!"
    rec2 = ag.call_result("call-1")
    assert rec2 is not None and rec2.result == b"result!"
    assert ag.call_result("nope") is None
    # a second end_call keeps the first outcome
    assert ag.end_call("t", "call-1", b"other").result == b"result!"
    with pytest.raises(wal.ArgumentError):
        ag.end_call("t", "never-begun", b"x")


def test_begin_call_is_sync_durable_under_buffered_store(tmp_path: Path) -> None:
    s = wal.open(tmp_path / "db", durability="buffered", rpo_ms=10_000)
    try:
        ag = AgentStore(s)
        ag.begin_call("t", "c1", "tool", b"a")
        lsn = s.version(ag._ckey(b"c1", b"i"))
        assert lsn is not None and s.watermarks.durable >= lsn
    finally:
        s.close()


def test_begin_call_on_a_replicated_store_is_held_by_the_archive_when_it_returns(tmp_path: Path) -> None:
    """begin_call asked for durability="sync", which a store at "replicated" refuses as weaker
    than its own: every intent failed with ArgumentError. It asks for the store's level there,
    and the intent is in the archive when begin_call returns."""
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "db", durability="replicated", archive=url) as s:
        ag = AgentStore(s)
        rec = ag.begin_call("t", "c1", "tool", b"a")
        lsn = s.version(ag._ckey(b"c1", b"i"))
        assert rec.call_id == "c1" and lsn is not None and s.stats()["archived_lsn"] >= lsn
        assert [c.call_id for c in ag.pending_calls()] == ["c1"]


def test_concurrent_begin_call_registers_once(store: wal.Store) -> None:
    ag = AgentStore(store)
    results = []

    def go() -> None:
        results.append(ag.begin_call("t", "same", "tool", b"a"))

    ts = [threading.Thread(target=go) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sum(r.new for r in results) == 1
    assert len(ag.pending_calls()) == 1


# ---- checkpoints ---------------------------------------------------------------------------------------


def test_checkpoints_history_time_travel_and_checks(store: wal.Store) -> None:
    ag = AgentStore(store)
    assert ag.load_checkpoint("t") is None
    c1 = ag.save_checkpoint("t", b"state-1", schema_version=1, config_hash="cfgA")
    c2 = ag.save_checkpoint("t", b"state-2", schema_version=2, config_hash="cfgA")
    assert (c1, c2) == (1, 2)
    loaded = ag.load_checkpoint("t")
    assert loaded is not None
    info, data = loaded
    assert data == b"state-2" and info.checkpoint_id == 2
    assert info.sha256 == hashlib.sha256(b"state-2").hexdigest()
    old = ag.load_checkpoint("t", c1)
    assert old is not None and old[1] == b"state-1"
    assert [i.checkpoint_id for i in ag.list_checkpoints("t")] == [1, 2]
    assert ag.load_checkpoint("t", 99) is None
    with pytest.raises(CheckpointMismatchError, match="schema version 2"):
        ag.load_checkpoint("t", schema_version=3)
    with pytest.raises(CheckpointMismatchError, match="cfgA"):
        ag.load_checkpoint("t", config_hash="cfgB")
    assert ag.load_checkpoint("t", schema_version=2, config_hash="cfgA") is not None


def test_checkpoint_digest_mismatch_is_corruption(store: wal.Store) -> None:
    ag = AgentStore(store)
    cid = ag.save_checkpoint("t", b"good state", schema_version=1, config_hash="h")
    key = ag._tkey(b"t", b"k", b"%016x" % cid)
    raw = store.get(key)
    assert raw is not None
    store.put(key, raw[:-1] + b"X")  # flip the last byte of the state, header unchanged
    with pytest.raises(CheckpointCorruptError, match="SHA-256 mismatch"):
        ag.load_checkpoint("t")
    assert isinstance(CheckpointCorruptError("x"), wal.CorruptionError)


def test_checkpoint_blob_digest_mismatch(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as s:
        ag = AgentStore(s, blob_threshold=100)
        ag.save_checkpoint("t", b"z" * 1000, schema_version=1, config_hash="h")
        [blob] = blob_files(tmp_path / "db")
        blob.write_bytes(b"y" * 1000)
        with pytest.raises(BlobMissingError):
            ag.load_checkpoint("t")
        blob.unlink()
        with pytest.raises(BlobMissingError, match="missing"):
            ag.load_checkpoint("t")


# ---- retention ------------------------------------------------------------------------------------------


def test_delete_thread_removes_everything_and_frees_space(tmp_path: Path) -> None:
    s = wal.open(tmp_path / "db", segment_bytes=1 << 20)
    try:
        ag = AgentStore(s, blob_threshold=4096)
        ag.append("keep", b"k")
        s.checkpoint()
        base_keys = s.stats()["state_keys"]
        for i in range(2500):
            ag.append("big", b"e" * 500, state={f"s{i % 10}": b"v"})
        ag.begin_call("big", "c-pending", "tool", b"a")
        ag.begin_call("big", "c-done", "tool", b"a")
        ag.end_call("big", "c-done", b"r")
        ag.save_checkpoint("big", b"B" * 10_000, schema_version=1, config_hash="h")
        s.checkpoint()
        assert s.stats()["state_keys"] > base_keys + 2500
        assert blob_files(tmp_path / "db")
        n = ag.delete_thread("big")
        assert n > 2500
        assert list(ag.read("big")) == [] and ag.last_seq("big") == 0
        assert ag.pending_calls() == [] and ag.call_result("c-done") is None
        assert ag.list_checkpoints("big") == []
        assert list(ag.threads()) == ["keep"]
        s.checkpoint()
        assert s.stats()["state_keys"] == base_keys
        segs = [p for p in (tmp_path / "db" / "log").iterdir() if p.is_file()]
        assert len(segs) <= 2  # old segments went at the checkpoint
        assert ag.gc_blobs()["removed"] == 1 and blob_files(tmp_path / "db") == []
        assert ag.delete_thread("big") == 0  # idempotent
        # the thread can be reused after deletion
        assert ag.append("big", b"again") == 1
    finally:
        s.close()


def test_expire_idle(store: wal.Store) -> None:
    ag = AgentStore(store)
    ag.append("old", b"x")
    ag.begin_call("old", "c", "t", b"")
    time.sleep(0.25)
    ag.append("new", b"y")
    assert ag.expire_idle(0.2) == ["old"]
    assert sorted(ag.threads()) == ["new"]
    assert ag.pending_calls() == []
    assert ag.expire_idle(3600) == []


def test_expire_idle_keeps_a_thread_written_after_it_looked(store: wal.Store,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """expire_idle decided from a record it read, then deleted the thread unconditionally: an
    event appended (and acknowledged) in between was deleted with it."""
    ag = AgentStore(store)
    ag.append("t", b"old event")
    time.sleep(0.05)
    thread_info = AgentStore.thread_info

    def idle_then_written(self: AgentStore, thread: str) -> Any:
        info = thread_info(self, thread)  # the look: idle
        monkeypatch.setattr(AgentStore, "thread_info", thread_info)
        assert self.append(thread, b"new event") == 2  # another worker writes right now
        return info

    monkeypatch.setattr(AgentStore, "thread_info", idle_then_written)
    assert ag.expire_idle(0.01) == []
    assert [e for _, e in ag.read("t")] == [b"old event", b"new event"]
    time.sleep(0.05)
    assert ag.expire_idle(0.01) == ["t"] and list(ag.threads()) == []
    with pytest.raises(wal.ArgumentError):
        ag.expire_idle(float("nan"))


def test_end_call_after_its_thread_was_deleted_is_refused_and_leaves_no_outcome(
        store: wal.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """end_call looked the call up, then wrote its outcome in a transaction that made the thread
    again if it was gone: a delete_thread in between left the thread back, and an outcome that a
    later begin_call of the same call id reported as its own ("done", with the old result)."""
    ag = AgentStore(store)
    ag.begin_call("t", "call-1", "pay", b'{"eur": 5}')
    call = AgentStore._call

    def looked_up_then_deleted(self: AgentStore, call_id: str, **kw: Any) -> Any:
        rec = call(self, call_id, **kw)
        monkeypatch.setattr(AgentStore, "_call", call)
        self.delete_thread("t")  # another worker deletes the thread now
        return rec

    monkeypatch.setattr(AgentStore, "_call", looked_up_then_deleted)
    with pytest.raises(wal.ArgumentError, match="was deleted meanwhile"):
        ag.end_call("t", "call-1", b'{"ok": true}')
    assert list(ag.threads()) == [] and list(store.scan(b"ag/")) == []
    again = ag.begin_call("t2", "call-1", "refund", b'{"eur": 1}')
    assert again.new and again.status == "pending" and again.result is None


def test_deleting_thread_refuses_writes_until_finished(store: wal.Store) -> None:
    ag = AgentStore(store)
    ag.append("t", b"x")
    info = ag.thread_info("t")
    assert info is not None
    info["deleting"] = True
    store.put(ag._rkey(b"t"), json.dumps(info).encode())
    with pytest.raises(ThreadDeletingError):
        ag.append("t", b"y")
    assert ag.finish_deletions() == 1
    assert ag.append("t", b"y") == 1


# ---- blobs ------------------------------------------------------------------------------------------------


def test_an_archived_store_keeps_large_agent_values_in_the_log_so_a_restore_holds_them(tmp_path: Path) -> None:
    """Blob files are not shipped to an object archive: on a store that ships to one, values
    above the blob threshold stay in the log, and a restore elsewhere reads them back; one too
    large for a log record is refused, naming why, and nothing is written."""
    url = f"file://{tmp_path}/archive"
    big = os.urandom(3 << 20)
    with wal.open(tmp_path / "db", archive=url) as s:
        ag = AgentStore(s, blob_threshold=1 << 20)
        ag.append("t", big, state={"big": big})
        with pytest.raises(wal.RecordTooLargeError, match="archive"):
            ag.append("t", bytes(17 << 20))
        assert ag.last_seq("t") == 1
        s.put("last", b"1", durability="replicated")
    assert blob_files(tmp_path / "db") == []
    wal.restore(url, tmp_path / "restored")
    with wal.open(tmp_path / "restored") as r:
        ag = AgentStore(r)
        assert list(ag.read("t")) == [(1, big)]
        assert ag.get_state("t", "big") == big


def test_blobs_roundtrip_dedupe_and_gc(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as s:
        ag = AgentStore(s, blob_threshold=1000)
        big = os.urandom(5000)
        ag.append("t", big, state={"big": big})
        ag.append("u", big)
        ag.begin_call("t", "c", "tool", big)
        ag.end_call("t", "c", big + b"!")
        assert len(blob_files(tmp_path / "db")) == 2  # content-addressed: one file per distinct value
        assert list(ag.read("t")) == [(1, big)]
        assert ag.get_state("t", "big") == big
        rec = ag.call_result("c")
        assert rec is not None and rec.args == big and rec.result == big + b"!"
        assert ag.gc_blobs()["removed"] == 0
        ag.delete_thread("t")
        assert ag.gc_blobs() == {"kept": 1, "removed": 1, "bytes_freed": 5001}  # `u` still references big
        assert list(ag.read("u")) == [(1, big)]
        ag.delete_thread("u")
        assert ag.gc_blobs()["removed"] == 1
        assert blob_files(tmp_path / "db") == []


def test_gc_never_collects_blob_of_inflight_write(tmp_path: Path) -> None:
    with wal.open(tmp_path / "db") as s:
        ag = AgentStore(s, blob_threshold=10)
        started, release = threading.Event(), threading.Event()
        gc_result: list[dict[str, int]] = []

        def hook(path: str) -> None:
            started.set()
            release.wait(5)

        AgentStore._after_blob_write = hook
        try:
            w = threading.Thread(target=ag.append, args=("t", b"x" * 100))
            w.start()
            assert started.wait(5)
            g = threading.Thread(target=lambda: gc_result.append(ag.gc_blobs()))
            g.start()
            time.sleep(0.2)
            assert not gc_result  # GC waits for the in-flight write
            release.set()
            w.join()
            g.join()
        finally:
            AgentStore._after_blob_write = None
        assert gc_result == [{"kept": 1, "removed": 0, "bytes_freed": 0}]
        assert list(ag.read("t")) == [(1, b"x" * 100)]


# ---- crashes (real processes, SIGKILL) ------------------------------------------------------------


def run_child(code: str, db: Path, wait_for: str = "READY") -> None:
    """Run code in a child python, wait until it prints wait_for, SIGKILL it."""
    prog = textwrap.dedent("""
        import sys, time, wal
        from wal.agents import AgentStore
        s = wal.open(sys.argv[1])
    """) + textwrap.dedent(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", prog, str(db)], stdout=subprocess.PIPE, env=env, text=True)
    assert proc.stdout is not None
    deadline = time.time() + 60
    line = ""
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line or wait_for in line:
            break
    assert wait_for in line, f"child ended early (rc={proc.poll()})"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_crash_between_intent_and_outcome(tmp_path: Path) -> None:
    db = tmp_path / "db"
    run_child("""
        ag = AgentStore(s, "bot")
        ag.append("t", b"user: pay the bill")
        ag.begin_call("t", "pay-1", "payments.charge", b'{"eur": 10}')
        print("READY", flush=True)   # side effect would run now
        time.sleep(60)
    """, db)
    with wal.open(db) as s:
        ag = AgentStore(s, "bot")
        [pending] = ag.pending_calls()
        assert (pending.call_id, pending.tool, pending.args) == ("pay-1", "payments.charge", b'{"eur": 10}')
        assert ag.begin_call("t", "pay-1", "payments.charge", b"").new is False
        ag.end_call("t", "pay-1", b"reconciled: charged once")
        assert ag.pending_calls() == []
        assert ag.begin_call("t", "pay-1", "payments.charge", b"").result == b"reconciled: charged once"


def test_crash_between_blob_write_and_commit(tmp_path: Path) -> None:
    db = tmp_path / "db"
    run_child("""
        def hook(path):
            print("READY", path, flush=True)
            time.sleep(60)
        ag = AgentStore(s, blob_threshold=100)
        ag.append("t", b"small")
        AgentStore._after_blob_write = staticmethod(hook)
        ag.append("t", b"B" * 5000)
    """, db)
    assert len(blob_files(db)) == 1  # durable orphan left behind
    with wal.open(db) as s:
        ag = AgentStore(s, blob_threshold=100)
        assert list(ag.read("t")) == [(1, b"small")]  # no commit references the blob
        assert ag.gc_blobs() == {"kept": 0, "removed": 1, "bytes_freed": 5000}
        assert blob_files(db) == []
        assert ag.append("t", b"B" * 5000) == 2  # and the value can be written again
        assert list(ag.read("t", 2)) == [(2, b"B" * 5000)]


def test_crash_during_delete_thread(tmp_path: Path) -> None:
    db = tmp_path / "db"
    run_child("""
        import wal.agents.store
        wal.agents.store.DELETE_BATCH = 100
        ag = AgentStore(s, blob_threshold=1000)
        for i in range(450):
            ag.append("doomed", b"e%d" % i, state={"k%d" % (i % 7): b"v"})
        ag.begin_call("doomed", "c1", "tool", b"a")
        ag.save_checkpoint("doomed", b"C" * 2000, schema_version=1, config_hash="h")
        ag.append("kept", b"stay")
        def hook(n):
            if n >= 200:
                print("READY", n, flush=True)
                time.sleep(60)
        AgentStore._after_delete_batch = staticmethod(hook)
        ag.delete_thread("doomed")
    """, db)
    with wal.open(db) as s:
        ag = AgentStore(s, blob_threshold=1000)
        info = ag.thread_info("doomed")
        assert info is not None and info["deleting"]  # consistent partial state: marked, refuses writes
        assert 0 < len(list(ag.read("doomed"))) < 450
        with pytest.raises(ThreadDeletingError):
            ag.append("doomed", b"x")
        assert ag.delete_thread("doomed") > 0  # the second run completes it
        assert ag.thread_info("doomed") is None and list(ag.read("doomed")) == []
        assert ag.pending_calls() == [] and ag.call_result("c1") is None
        assert [k for k, _ in s.scan(b"ag/default/t/doomed/")] == []
        assert list(ag.read("kept")) == [(1, b"stay")]
        assert ag.gc_blobs()["removed"] == 1


def test_odd_arguments_are_wal_errors_and_a_bytes_thread_name_works_throughout(store: wal.Store) -> None:
    """A bytes thread name worked for append and raised TypeError (not JSON serializable) in
    begin_call; a str state, a str checkpoint id and a lone surrogate raised raw errors."""
    ag = AgentStore(store)
    rec = ag.begin_call(b"bt", "c1", "tool", b"a")
    assert rec.thread == "bt" and ag.end_call(b"bt", "c1", b"r").status == "done"
    for call, error in ((lambda: ag.begin_call("t", "c2", b"tool", b"a"), wal.ArgumentTypeError),  # type: ignore[arg-type]
                        (lambda: ag.save_checkpoint("t", "state", schema_version=1, config_hash="h"),  # type: ignore[arg-type]
                         wal.ArgumentTypeError),
                        (lambda: ag.load_checkpoint("t", "1"), wal.ArgumentTypeError),  # type: ignore[arg-type]
                        (lambda: ag.append("\ud800", b"e"), wal.ArgumentError)):
        with pytest.raises(error):
            call()


def test_a_path_for_a_store_a_non_mapping_state_or_a_non_int_blob_threshold_is_an_argument_error(
        store: wal.Store, tmp_path: Path) -> None:
    """AgentStore("/dir") and append(..., state=[1]) raised raw AttributeErrors; blob_threshold="1"
    a raw TypeError at the first append, and -1 was taken."""
    with pytest.raises(wal.ArgumentTypeError, match=r"not a path .*AgentStore\(wal.open\(path\)\)"):
        AgentStore(str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(wal.ArgumentTypeError, match="takes an open wal"):
        AgentStore(None)  # type: ignore[arg-type]
    with pytest.raises(wal.ArgumentTypeError, match="blob_threshold must be an int"):
        AgentStore(store, blob_threshold="1")  # type: ignore[arg-type]
    with pytest.raises(wal.ArgumentError, match="blob_threshold must be bytes >= 0"):
        AgentStore(store, blob_threshold=-1)
    ag = AgentStore(store)
    with pytest.raises(wal.ArgumentTypeError, match="state must be a mapping"):
        ag.append("t", b"e", state=[1])  # type: ignore[arg-type]
    assert list(ag.read("t")) == []


class _ReplacedWhileRead:
    """The store under an AgentStore, whose next get or scan of a key under `prefix`, once armed,
    returns what it read and then -- before the caller opens the blob that value references --
    has `replace` run (a replacing commit and a gc_blobs): the race a reader meets when another
    thread replaces the value it just read and collects its blob."""

    def __init__(self, store: wal.Store, prefix: bytes) -> None:
        self._store, self._prefix = store, prefix
        self.replace: Callable[[], None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _raced(self, key: bytes) -> None:
        if self.replace is not None and key.startswith(self._prefix):
            replace, self.replace = self.replace, None
            replace()

    def get(self, key: bytes, *args: Any, **kwargs: Any) -> Any:
        value = self._store.get(key, *args, **kwargs)
        self._raced(key)
        return value

    def scan(self, prefix: bytes, *args: Any, **kwargs: Any) -> Any:
        for key, value in list(self._store.scan(prefix, *args, **kwargs)):
            self._raced(key)
            yield key, value


def test_a_read_whose_blob_is_collected_as_its_value_is_replaced_gives_the_new_value(tmp_path: Path) -> None:
    old, new = b"o" * 100, b"n" * 100
    with wal.open(tmp_path / "db") as s:
        racing = _ReplacedWhileRead(s, b"ag/default/t/")
        ag = AgentStore(cast(wal.Store, racing), blob_threshold=10)
        writer = AgentStore(s, blob_threshold=10)

        def replace_state() -> None:
            writer.append("t", b"e2", state={"k": new})
            assert writer.gc_blobs()["removed"] == 1  # the old value's blob: nothing references it now

        ag.append("t", b"e1", state={"k": old})
        racing.replace = replace_state
        assert ag.get_state("t", "k") == new
        ag.append("t", b"e3", state={"k": old})
        racing.replace = replace_state
        assert ag.state("t") == {b"k": new}

        ag.save_checkpoint("t", old, schema_version=1, config_hash="h")

        def delete_thread() -> None:
            writer.delete_thread("t")
            assert writer.gc_blobs()["removed"] >= 1

        racing.replace = delete_thread
        assert ag.load_checkpoint("t", 1) is None  # deleted with its thread, as a read after it finds
        ag.append("t", old)
        racing.replace = delete_thread
        assert list(ag.read("t")) == []  # the event went with its thread between the scan and its blob
