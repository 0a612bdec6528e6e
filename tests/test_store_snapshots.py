"""Readers see whole transactions: `Store.scan`, `Store.snapshot` and `Store.get_many` read one
instant, in the writer's process (overlay included) and in read-only openers (wal/store/snapshot.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import wal
from wal.store.state import READER_SLOTS, ReadersFullError

PAIRS = 40  # transactions write key a/<i> and b/<i> with the same value; readers check they agree


def _committers(store: wal.Store, stop: threading.Event, n_threads: int = 4) -> list[threading.Thread]:
    def run(t: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            i = (n * 7 + t) % PAIRS
            value = b"%d-%d" % (t, n)
            with store.transaction() as tx:
                tx.put(b"pair/a/%03d" % i, value)
                tx.put(b"pair/b/%03d" % i, value)
    threads = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    return threads


def _torn(items: dict[bytes, bytes]) -> list[int]:
    return [i for i in range(PAIRS) if items.get(b"pair/a/%03d" % i) != items.get(b"pair/b/%03d" % i)]


@pytest.mark.parametrize("durability", ["sync", "interval", "buffered"])
def test_a_scan_in_the_writers_process_never_sees_part_of_a_transaction(tmp_path: Path, durability: str) -> None:
    rpo = None if durability == "sync" else 50
    with wal.open(tmp_path, durability=durability, rpo_ms=rpo, apply_interval_ms=1) as store:
        stop = threading.Event()
        threads = _committers(store, stop)
        try:
            torn = []
            for _ in range(300):
                items = dict(store.scan(b"pair/"))
                torn += _torn(items)
                with store.snapshot() as snap:
                    got = dict(snap.scan(b"pair/"))
                    torn += _torn(got)
                    values = snap.get_many([b"pair/a/%03d" % i for i in range(PAIRS)]
                                           + [b"pair/b/%03d" % i for i in range(PAIRS)])
                    torn += [i for i in range(PAIRS) if values[i] != values[PAIRS + i]]
                    assert got == {k: v for k, v in zip([b"pair/a/%03d" % i for i in range(PAIRS)]
                                                        + [b"pair/b/%03d" % i for i in range(PAIRS)], values,
                                                        strict=True) if v is not None}
                pair = store.get_many([b"pair/a/007", b"pair/b/007"])
                torn += [7] if pair[0] != pair[1] else []
        finally:
            stop.set()
            for th in threads:
                th.join()
        assert not torn, f"{len(torn)} torn reads"


_READER = textwrap.dedent("""
    import sys, wal
    torn = reads = 0
    with wal.open(sys.argv[1], readonly=True) as store:
        for _ in range(int(sys.argv[2])):
            items = dict(store.scan(b"pair/"))
            reads += 1
            torn += sum(items.get(b"pair/a/%03d" % i) != items.get(b"pair/b/%03d" % i) for i in range({pairs}))
            with store.snapshot() as snap:
                items = dict(snap.scan(b"pair/"))
                torn += sum(items.get(b"pair/a/%03d" % i) != items.get(b"pair/b/%03d" % i) for i in range({pairs}))
    print(reads, torn)
""").format(pairs=PAIRS)


def test_a_read_only_opener_in_another_process_never_sees_part_of_a_transaction(tmp_path: Path) -> None:
    with wal.open(tmp_path, apply_interval_ms=1) as store:
        with store.transaction() as tx:
            for i in range(PAIRS):
                tx.put(b"pair/a/%03d" % i, b"0")
                tx.put(b"pair/b/%03d" % i, b"0")
        store.checkpoint()
        stop = threading.Event()
        threads = _committers(store, stop)
        try:
            reader = subprocess.run([sys.executable, "-c", _READER, str(tmp_path), "300"], capture_output=True,
                                    text=True, timeout=300, check=False)
        finally:
            stop.set()
            for th in threads:
                th.join()
    assert reader.returncode == 0, reader.stderr
    assert reader.stdout.split() == ["300", "0"]


def test_a_snapshot_reads_one_lsn_while_commits_go_on(tmp_path: Path) -> None:
    with wal.open(tmp_path, durability="interval", rpo_ms=100) as store:
        first = store.put(b"k", b"one")
        store.put(b"gone", b"x")
        with store.snapshot() as snap:
            assert snap.lsn == store.watermarks.written >= first
            second = store.put(b"k", b"two")
            store.delete(b"gone")
            store.put(b"new", b"n")
            store.checkpoint()  # everything applied to LMDB, the overlay emptied: the snapshot keeps its view
            assert snap.get(b"k") == b"one" and snap.version(b"k") == first
            assert snap.get("gone") == b"x" and snap.get(b"new") is None and snap.version(b"new") is None
            assert list(snap.scan()) == [(b"gone", b"x"), (b"k", b"one")]
            assert snap.get_many([b"k", b"new", "gone"], b"-") == [b"one", b"-", b"x"]
        assert store.get(b"k") == b"two" and store.version(b"k") == second
        assert list(store.scan()) == [(b"k", b"two"), (b"new", b"n")]
        with pytest.raises(wal.ClosedError, match="snapshot is closed"):
            snap.get(b"k")


def test_closing_the_store_ends_its_snapshots_and_unfinished_scans_with_closed_error(tmp_path: Path) -> None:
    store = wal.open(tmp_path)
    with store.transaction() as tx:
        for i in range(3000):
            tx.put(b"k%05d" % i, b"v")
    store.checkpoint()
    snap = store.snapshot()
    scan = store.scan(b"k")
    assert next(scan) == (b"k00000", b"v")
    store.close()
    with pytest.raises(wal.ClosedError):
        snap.get(b"k00001")
    with pytest.raises(wal.ClosedError):
        list(snap.scan())
    with pytest.raises(wal.ClosedError):
        list(scan)
    with pytest.raises(wal.ClosedError):
        store.snapshot()
    with pytest.raises(wal.ClosedError):
        store.get_many([b"k00001"])


def test_a_long_scan_is_one_snapshot_across_its_chunks(tmp_path: Path) -> None:
    """A scan longer than one C call's chunk goes on in the same LMDB transaction: commits made
    while it is iterated, applied to LMDB meanwhile, never appear in it."""
    with wal.open(tmp_path, apply_interval_ms=1) as store:
        with store.transaction() as tx:
            for i in range(5000):
                tx.put(b"k%05d" % i, b"old")
        store.checkpoint()
        seen = []
        for n, (_, value) in enumerate(store.scan(b"k")):
            seen.append(value)
            if n == 10:
                with store.transaction() as tx:
                    for i in range(5000):
                        tx.put(b"k%05d" % i, b"new")
                store.checkpoint()
        assert len(seen) == 5000 and set(seen) == {b"old"}
        assert {v for _, v in store.scan(b"k")} == {b"new"}


def test_reads_in_c_and_in_python_agree_on_every_key_form_and_state(tmp_path: Path) -> None:
    """`get`/`version` read in one C call for bytes and str keys; other call forms take the Python
    function. Both give the same answers, overlay or LMDB, deleted or absent keys included."""
    with wal.open(tmp_path, durability="buffered", rpo_ms=1000, apply_interval_ms=100000) as store:
        lsn = store.put("ü-key", b"v1")
        store.put(b"deleted", b"x")
        store.delete(b"deleted")
        for key in ("ü-key", "ü-key".encode(), bytearray("ü-key".encode())):
            assert store.get(key) == b"v1" and store.get(key=key) == b"v1" and store.version(key) == lsn
        assert store.get(b"deleted", b"d") == b"d" == store.get(b"deleted", default=b"d")
        assert store.get(b"absent") is None and store.version(b"deleted") is None
        store.checkpoint()
        assert store.get("ü-key") == b"v1" and store.get(b"deleted") is None
        with pytest.raises(wal.ArgumentError):
            store.get(b"")
        with pytest.raises(TypeError):
            store.get(12)  # type: ignore[arg-type]
        with pytest.raises(wal.RecordTooLargeError):
            store.get(b"x" * 600)


def test_get_many_of_str_keys_or_an_iterable_reads_one_instant(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a list or tuple of bytes was read in one call: str keys or another iterable were read
    one `get` at a time, and a transaction committed between two of them came back half (seen
    4 times in 20,000 reads beside a writer). A lone str was read as keys of its characters."""
    with wal.open(tmp_path) as store:
        with store.transaction() as tx:
            tx.put(b"x", b"0")
            tx.put(b"y", b"0")
        get = wal.Store.get
        commits = iter(range(1, 100))

        def get_then_commit(self: wal.Store, key: bytes | str, default: bytes | None = None) -> bytes | None:
            value = get(self, key, default)
            with self.transaction() as tx:  # another thread's transaction lands between two reads
                n = b"%d" % next(commits)
                tx.put(b"x", n)
                tx.put(b"y", n)
            return value

        monkeypatch.setattr(wal.Store, "get", get_then_commit)
        for keys in (["x", "y"], ("x", b"y"), iter([b"x", b"y"]), (k for k in [b"x", b"y"])):
            x, y = store.get_many(keys)  # type: ignore[arg-type]
            assert x == y, keys
        store.put("a", b"1")
        for lone in ("ab", b"ab"):
            with pytest.raises(wal.ArgumentTypeError, match="a sequence of keys, not one"):
                store.get_many(lone)  # type: ignore[arg-type]
            with store.snapshot() as snap, pytest.raises(wal.ArgumentTypeError):
                snap.get_many(lone)  # type: ignore[arg-type]


def test_get_many_reads_every_call_form_and_refuses_bad_keys_clearly(tmp_path: Path) -> None:
    """`Store.get_many` reads a list or tuple of bytes keys in one C call; every other form (str
    keys, any iterable, bad keys) takes the Python path, with the same answers and errors."""
    with wal.open(tmp_path, durability="buffered", apply_interval_ms=60_000) as store:
        store.put(b"a", b"1")
        store.put(b"b", b"2")
        store.delete(b"b")  # in the overlay only: applying is held off by the interval
        assert store.stats()["unapplied_commits"] > 0
        want = [b"1", None, None]
        assert store.get_many([b"a", b"b", b"c"]) == want
        assert store.get_many((b"a", b"b", b"c")) == want
        assert store.get_many(["a", "b", "c"]) == want
        assert store.get_many(iter([b"a", b"b", b"c"])) == want
        assert store.get_many([b"a", b"b", b"c"], b"-") == [b"1", b"-", b"-"]
        assert store.get_many([b"a", b"b", b"c"], default=b"-") == [b"1", b"-", b"-"]
        assert store.get_many([]) == []
        with pytest.raises(wal.ArgumentError):
            store.get_many([b"a", b""])
        with pytest.raises(wal.RecordTooLargeError):
            store.get_many([b"a", b"k" * 600])
        with pytest.raises(TypeError):
            store.get_many([b"a", 5])  # type: ignore[list-item]


def test_readers_holding_every_slot_delay_checkpoints_and_never_stop_the_writer(tmp_path: Path) -> None:
    """Every reader slot of the state's lock file held by live snapshots: a new snapshot is
    refused with ReadersFullError saying so, an explicit checkpoint too, and the automatic
    checkpoints wait and retry (a host shortage): the commits go on, and once the snapshots
    close the store checkpoints again. (Full slots stopped the store's writes until reopened.)"""
    with wal.open(tmp_path / "s", checkpoint_bytes=64 << 10) as store:
        store.put(b"k", b"v")
        held: list[wal.Snapshot] = []
        with pytest.raises(ReadersFullError, match=f"every reader slot .*{READER_SLOTS} reader slots"):
            while len(held) <= READER_SLOTS:
                held.append(store.snapshot())
        assert READER_SLOTS - 10 <= len(held) < READER_SLOTS  # the store's own read transactions hold the rest
        for i in range(200):  # 800 KB: a dozen automatic checkpoints due
            store.put(b"w%03d" % i, bytes(4096), durability="sync")
        with pytest.raises(ReadersFullError):
            store.checkpoint()
        assert held[0].get(b"k") == b"v"
        for snap in held:
            snap.close()
        store.put(b"after", b"1")
        stats = store.stats()
        assert not stats["failed"] and stats["state_stalls"] > 0
        assert store.checkpoint() == store.stats()["applied_lsn"]
        assert store.get(b"w199") == bytes(4096)


def test_readers_full_names_the_slots_of_a_lock_file_another_opener_made(tmp_path: Path) -> None:
    """A lock file made by another opener with fewer slots (an older agentwal made 126, LMDB's
    default), still held open by it when the store opens: LMDB keeps its size, and the refusal
    names the slots it has, not the ones this version would have made."""
    path = tmp_path / "s"
    wal.open(path).close()
    (path / "state" / "lock.mdb").unlink()  # LMDB only ever grows a lock file: the holder makes it anew
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time, lmdb
        env = lmdb.open({str(path / "state")!r}, max_readers=126, readonly=True, lock=True)
        print("holding", flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with wal.open(path) as store:
            store.put(b"k", b"v")
            held: list[wal.Snapshot] = []
            with pytest.raises(ReadersFullError, match=r"\(126 reader slots\)"):
                while len(held) <= READER_SLOTS:
                    held.append(store.snapshot())
            assert 100 < len(held) < 126
            for snap in held:
                snap.close()
            assert store.get(b"k") == b"v"
    finally:
        holder.communicate("")


def test_a_read_only_opener_killed_with_a_snapshot_open_pins_no_pages_of_the_writers_state(tmp_path: Path) -> None:
    """A read-only opener SIGKILLed while its snapshot is open leaves its reader slot taken.
    The writer's checkpoints free the slots of dead processes: the state's pages freed by
    overwrites are reused, and the file stays near its live data. (The dead slot pinned the
    snapshot's pages for the writer's lifetime: the file grew by every overwrite.)"""
    path = tmp_path / "s"
    live = {b"k%04d" % i: bytes(1024) for i in range(1000)}  # ~1 MB live
    with wal.open(path, durability="interval", rpo_ms=20) as store:
        with store.transaction() as tx:
            for k, v in live.items():
                tx.put(k, v)
        store.checkpoint()
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import sys, time, wal
            s = wal.open({str(path)!r}, readonly=True)
            snap = s.snapshot()
            assert snap.get(b"k0000") is not None
            print("holding", flush=True)
            time.sleep(60)
            """)], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "holding"
        finally:
            child.kill()
            child.wait()
        data = path / "state" / "data.mdb"
        for n in range(12):  # each pass overwrites every key: ~1 MB of pages freed
            with store.transaction() as tx:
                for k in live:
                    tx.put(k, bytes([n]) * 1024)
            store.checkpoint()
        assert data.stat().st_blocks * 512 < 6 << 20, f"the state file holds {data.stat().st_blocks * 512} bytes"
