"""Several PUTs in flight (``archive_puts_in_flight``): objects stored out of order, the archived LSN
moving only over the gap-free run, and a writer's unfinished tail (the machine lost with PUTs in
flight) restored up to the gap, then deleted by the next writer (FORMAT.md §18).

The archive is a real ``file://`` folder; one PUT is held back (the object store slow for one
request) by `HeldPut`, a fault injector in front of it, as the failpoints are for the log.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time

import pytest
from archive_helpers import HeldPut, wait_until

import wal
from wal.archive import layout
from wal.archive.objects import FileObjects
from wal.archive.restore import verify
from wal.archive.shipper import Shipper
from wal.cli import main

ONE_WRITER = {"archive_fencing": False, "archive_rpo_ms": 60_000}



def _commit_in_threads(store: wal.Store, n_threads: int, per_thread: int, acked: list[int],
                       durability: str = "replicated", *,
                       stop: threading.Event | None = None) -> list[threading.Thread]:
    """Threads making `per_thread` commits each (fewer once `stop` is set)."""
    def work(t: int) -> None:
        for i in range(per_thread):
            if stop is not None and stop.is_set():
                return
            acked.append(store.put(f"t{t}/{i}", b"v%d" % i, durability=durability))
            if durability != "replicated":
                time.sleep(0.002)  # commits spread over time: several objects

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    return threads


def test_puts_in_flight_are_1_to_8(tmp_path) -> None:
    for bad in (0, 9, True, "4"):
        with pytest.raises(wal.ArgumentError, match=r"1\.\.8"):
            wal.open(tmp_path / "s", archive=f"file://{tmp_path}/a", archive_puts_in_flight=bad)
    with wal.open(tmp_path / "s", archive=f"file://{tmp_path}/a", archive_puts_in_flight=8) as s:
        s.put("k", b"v", durability="replicated")


def test_objects_stored_out_of_order_acknowledge_only_the_gap_free_run(tmp_path) -> None:
    objects = HeldPut(str(tmp_path / "archive"), hold_from=20)
    store = wal.open(tmp_path / "s", archive=objects, archive_puts_in_flight=4, **ONE_WRITER)
    stop = threading.Event()
    try:
        first = [store.put(f"a{i}", b"x", durability="replicated") for i in range(19)]  # shipped one by one
        acked: list[int] = []
        threads = _commit_in_threads(store, 8, 10, acked)
        wait_until(lambda: objects.held is not None)
        held = layout.parse_name(objects.held)
        assert held is not None
        # The held object may hold every waiting thread's commit, so a `sync` writer, which does
        # not wait for the archive, goes on until objects past the held one are stored.
        def beyond_the_hold() -> None:
            i = 0
            while not stop.is_set():
                store.put(f"sync/{i}", b"x", durability="sync")
                i += 1
                time.sleep(0.002)
        writer = threading.Thread(target=beyond_the_hold)
        writer.start()
        # Objects past the held one get stored; nothing from the held one on is acknowledged.
        wait_until(lambda: any((p := layout.parse_name(n)) is not None and p.first > held.first
                               for n in objects.put_names))
        stop.set()
        writer.join(60)
        time.sleep(0.2)
        assert store.stats()["archived_lsn"] == held.first - 1
        assert all(lsn < held.first for lsn in acked), "a replicated commit was acknowledged past a gap"
        objects.release.set()
        for th in threads:
            th.join(60)
        assert len(acked) == 80 and store.stats()["archived_lsn"] >= max(acked)
        assert first[-1] < held.first
        end = store.watermarks.durable
    finally:
        stop.set()
        objects.release.set()
        store.close()
    report = wal.restore(f"file://{tmp_path}/archive", tmp_path / "r")
    assert report.lsn == end and report.unfinished_tail == ()
    assert verify(f"file://{tmp_path}/archive").ok


def test_machine_lost_with_puts_in_flight_restores_to_the_gap_and_the_next_writer_clears_the_tail(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    objects = HeldPut(str(tmp_path / "archive"), hold_from=10)
    store = wal.open(tmp_path / "s", archive=objects, archive_puts_in_flight=4, **ONE_WRITER)
    lost = tmp_path / "lost"  # the archive as it was when the machine went
    try:
        for i in range(9):
            store.put(f"a{i}", b"x", durability="replicated")
        acked: list[int] = []
        # Commits go on until two objects past the held one are stored (a fixed number may all
        # fit in one object, if they are made between two of the shipper's rounds).
        stop = threading.Event()
        threads = _commit_in_threads(store, 4, 100_000, acked, "sync", stop=stop)
        wait_until(lambda: objects.held is not None)
        held = layout.parse_name(objects.held)
        assert held is not None
        wait_until(lambda: sum(1 for n in objects.put_names
                               if (p := layout.parse_name(n)) is not None and p.first > held.first) >= 2)
        # The objects as stored: a file:// PUT under way is a temporary file, not an object.
        shutil.copytree(tmp_path / "archive", lost, ignore=shutil.ignore_patterns(".tmp-*"))
    finally:
        stop.set()
        objects.release.set()
        for th in threads:
            th.join(60)
        store.close()
    url = f"file://{lost}"
    tail = [n for n, _ in FileObjects(str(lost)).list(layout.LOG_PREFIX)
            if (p := layout.parse_name(n)) is not None and p.first > held.first]
    assert tail
    checked = verify(url)
    assert checked.ok and checked.last_lsn == held.first - 1 and list(checked.unfinished_tail) == tail
    capsys.readouterr()
    assert main(["verify", url]) == 0  # sound, and the tail a restore leaves out is named
    out = capsys.readouterr().out
    assert f"unfinished tail past LSN {held.first - 1}" in out and all(name in out for name in tail)
    report = wal.restore(url, tmp_path / "r")
    assert report.lsn == held.first - 1 and list(report.unfinished_tail) == tail
    with pytest.raises(wal.ArgumentError, match=r"missing .*unfinished tail"):
        wal.restore(url, tmp_path / "r2", lsn=held.first)
    # The restored store continues the archive: its first object fills the gap, then the tail goes.
    with wal.open(tmp_path / "r", archive=url, archive_fencing=False) as s:
        lsn = s.put("next", b"1", durability="replicated")
        assert lsn == held.first
        wait_until(lambda: not [n for n in tail if (lost / n).exists()])
    assert verify(url).ok and verify(url).unfinished_tail == ()
    with wal.open(tmp_path / "r") as s:
        assert s.get("next") == b"1"
    final = wal.restore(url, tmp_path / "r3")
    assert final.lsn == held.first and final.unfinished_tail == ()


def test_a_missing_object_in_a_finished_archive_is_still_damage(tmp_path, monkeypatch) -> None:
    url = f"file://{tmp_path}/archive"
    # The group objects left as they are at close (as by a writer killed after its last PUT):
    # the ones sent with behind 0 after the missing one are what tells damage from a tail.
    monkeypatch.setattr(Shipper, "_merge_session_tail", lambda self, deadline: None)
    with wal.open(tmp_path / "s", archive=url, archive_puts_in_flight=4, **ONE_WRITER) as s:
        for i in range(40):
            s.put(f"k{i}", b"v", durability="replicated")
    names = [n for n, _ in FileObjects(str(tmp_path / "archive")).list(layout.LOG_PREFIX)]
    assert len(names) >= 6
    FileObjects(str(tmp_path / "archive")).delete(names[-4])
    with pytest.raises(wal.CorruptionError, match="missing LSNs"):
        wal.restore(url, tmp_path / "r")
    assert not verify(url).ok


def test_a_close_that_could_not_ship_everything_in_time_says_which_lsns_stay_local(tmp_path, caplog) -> None:
    """close() waits a while for the archive to take what is durable, then closes: the LSNs it
    could not ship stay in the local log and go at the next open with the archive. It closed
    silently, and a machine lost meanwhile lost them with no word of it."""
    objects = HeldPut(str(tmp_path / "archive"), hold_from=5)
    store = wal.open(tmp_path / "s", archive=objects, **ONE_WRITER)
    try:
        for i in range(10):  # LSNs 1..4 shipped one by one, then 5..10 in the object held
            store.put(f"k{i}", b"v", durability="replicated" if i < 4 else "sync")
        wait_until(lambda: objects.held is not None)
        held = layout.parse_name(objects.held or "")
        assert held is not None
        objects.abandon()  # its PUT fails, and every one of that name after it: the archive stays behind
        store._close_flush_s = 0.3
        caplog.set_level(logging.WARNING, logger="wal.archive")
    finally:
        store.close()
    lines = [r.getMessage() for r in caplog.records if "not shipped after" in r.getMessage()]
    assert len(lines) == 1 and f"LSNs {held.first}..10 not shipped after 0.3 s" in lines[0], lines
