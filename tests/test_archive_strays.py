"""Strays: group objects a writer had in flight when a promoted follower fenced it, stored after the
fence among its successor's objects (FORMAT.md §18, "Chain"). Readers (restore, `verify`, a
follower, a writer's open) pass over them; the successor deletes one that takes a name it needs;
an object sent with nothing of its writer in flight still fences.

The strays are made with the archive's own encoder (another writer_id, `behind >= 1`), as a fenced
writer would have sent them, and put into a real archive (``file://`` and SeaweedFS) that a
promoted follower owns. The end-to-end test makes real ones: an old primary with four PUTs in
flight, held back by a proxy in front of SeaweedFS while a follower is promoted, then released.
"""

# ruff: noqa: F811 -- the archive fixtures are imported by name (tests/archive_server.py)
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid

import pytest
from archive_helpers import wait_until
from archive_server import ACCESS_KEY, BUCKET, SECRET_KEY, WeedServer, archive_url, s3_server  # noqa: F401
from s3_proxy import HoldingProxy

import wal
from wal.archive import layout
from wal.archive.objects import FileObjects, S3Objects, open_objects
from wal.archive.restore import verify
from wal.cli import main
from wal.log import record

A_LOT = {"archive_rpo_ms": 60_000}



def stray(first: int, last: int, *, behind: int = 1, writer: bytes | None = None) -> bytes:
    """A group object of a fenced writer: LSNs first..last, each a put of ``stray/<lsn>``."""
    now = time.time_ns() // 1_000_000
    records = [(lsn, record.encode([(record.OP_PUT, b"stray/%d" % lsn, b"never acknowledged")], now, None))
               for lsn in range(first, last + 1)]
    return layout.encode_log(records, writer or os.urandom(16), behind)


class Owned:
    """An archive whose first writer stopped after `n` commits and whose follower was promoted:
    `store`, the new writer (replicated, 4 PUTs in flight, merging every 4 objects); `expected`,
    every acknowledged commit's key and value."""

    def __init__(self, tmp_path, url: str, n: int = 12) -> None:
        self.url = url
        self.objects = open_objects(url)
        self.expected: dict[bytes, bytes] = {}
        with wal.open(tmp_path / "old", archive=url, durability="replicated") as old:
            for i in range(n):
                old.put(f"old/{i}", b"a")
                self.expected[f"old/{i}".encode()] = b"a"
        with wal.follow(url, tmp_path / "follower", poll_ms=60_000) as replica:
            self.store = replica.promote(durability="replicated", archive_puts_in_flight=4,
                                         archive_merge_objects=4, **A_LOT)
        self.fence = n + 1

    def commit(self, count: int, tag: str) -> int:
        lsn = 0
        for i in range(count):
            lsn = self.store.put(f"{tag}/{i}", b"b")
            self.expected[f"{tag}/{i}".encode()] = b"b"
        return lsn

    @property
    def archived(self) -> int:
        return int(self.store.stats()["archived_lsn"])

    def put_stray(self, first: int, last: int, **kw: object) -> str:
        name = layout.log_name(first)
        self.objects.put(name, stray(first, last, **kw))  # type: ignore[arg-type]
        return name

    def check_restores(self, tmp_path, tag: str, *, end: int) -> None:
        """A restore to the end and to an LSN, and verify, hold exactly the new writer's history."""
        report = wal.restore(self.url, tmp_path / f"r-{tag}")
        assert report.lsn == end
        with wal.open(tmp_path / f"r-{tag}") as r:
            assert dict(r.scan()) == self.expected
        mid = wal.restore(self.url, tmp_path / f"m-{tag}", lsn=end - 1)
        assert mid.lsn == end - 1
        with wal.open(tmp_path / f"m-{tag}") as r:
            assert not any(k.startswith(b"stray/") for k, _ in r.scan())
        checked = verify(self.url)
        assert checked.ok and checked.last_lsn == end, checked.problems


def test_the_successor_deletes_a_stray_that_takes_its_next_name_and_an_object_sent_alone_still_fences(
        tmp_path, archive_url) -> None:
    owned = Owned(tmp_path, archive_url)
    try:
        # (i) at the successor's first object's name, right after its fence
        first_stray = owned.put_stray(owned.fence + 1, owned.fence + 3, behind=1)
        lsn = owned.commit(1, "new")
        assert lsn == owned.fence + 1 and owned.archived == lsn
        taken = layout.decode_log(owned.objects.get(first_stray), first_stray)
        assert taken.writer_id == owned.store._shipper.writer_id and taken.last == lsn
        # ... and at a later one, while it runs several PUTs in flight
        owned.commit(5, "more")
        nxt = owned.archived + 1
        name = owned.put_stray(nxt, nxt + 4, behind=3)
        assert owned.commit(3, "after") == nxt + 2
        assert layout.decode_log(owned.objects.get(name), name).writer_id == owned.store._shipper.writer_id
        assert owned.store.stats()["archive_deletes"] >= 2
        end = owned.archived
        owned.check_restores(tmp_path, "i", end=end)
        # An object sent with nothing of its writer in flight (behind 0) at the next name is a
        # takeover: the writer is fenced, as before.
        owned.put_stray(end + 1, end + 1, behind=0)
        with pytest.raises(wal.FailedError, match="fenced"):
            owned.store.put("late", b"x")
    finally:
        owned.store.close()


def test_readers_pass_over_a_stray_where_the_successor_merged_from_the_same_lsn(tmp_path, archive_url) -> None:
    owned = Owned(tmp_path, archive_url)
    follower = wal.follow(archive_url, tmp_path / "f1", poll_ms=60_000)  # polled by hand below
    restarted = wal.follow(archive_url, tmp_path / "f2", poll_ms=60_000)
    restarted.close()  # opened again below: it finds where its chain is from the archive
    try:
        owned.commit(24, "new")
        wait_until(lambda: owned.store.stats()["archive_merges"] >= 2)
        merged = [layout.parse_name(n) for n, _ in owned.objects.list(layout.MERGED_PREFIX)]
        merged = [m for m in merged if m is not None and m.first > owned.fence + 1]
        assert merged
        m = merged[0]
        assert m.last is not None and m.last + 3 < owned.archived
        # The successor's objects: its first sent alone (behind 0, right after the fence, whose
        # writer_id is the promotion's), its merged ones stamped with its own writer_id.
        writer = owned.store._shipper.writer_id
        first = layout.decode_log(owned.objects.get(layout.log_name(owned.fence + 1)), layout.log_name(owned.fence + 1))
        assert first.behind == 0 and first.writer_id == writer
        merged_obj = layout.decode_log(owned.objects.get(layout.merged_name(m.first, m.last)),
                                       layout.merged_name(m.first, m.last))
        assert merged_obj.behind == 0 and merged_obj.writer_id == writer
        # (ii) a stray named like the group object the merge replaced, reaching further than it
        name = owned.put_stray(m.first, m.last + 3, behind=2)
        assert name not in {n for n, _ in owned.objects.list(layout.MERGED_PREFIX)}
        end = owned.commit(2, "tail")
        wait_until(lambda: owned.archived == end)
        owned.check_restores(tmp_path, "ii", end=end)
        follower.poll()
        assert follower.lsn == end and dict(follower.scan()) == owned.expected
        again = wal.follow(archive_url, tmp_path / "f2", poll_ms=60_000)
        try:
            again.poll()
            assert again.lsn == end and dict(again.scan()) == owned.expected
        finally:
            again.close()
    finally:
        follower.close()
        owned.store.close()


def test_strays_past_the_end_are_not_the_archive_and_the_successor_clears_them(tmp_path, archive_url) -> None:
    owned = Owned(tmp_path, archive_url)
    follower = wal.follow(archive_url, tmp_path / "f", poll_ms=60_000)
    try:
        end = owned.commit(4, "new")
        wal.follow(archive_url, tmp_path / "f2", poll_ms=60_000).close()  # at `end`, reopened below
        # (iii) past the end: one right after it, one past a gap
        after = owned.put_stray(end + 1, end + 2, behind=1)
        past_gap = owned.put_stray(end + 4, end + 4, behind=2)
        report = wal.restore(archive_url, tmp_path / "r")
        assert report.lsn == end and report.unfinished_tail == (after, past_gap)
        with wal.open(tmp_path / "r") as r:
            assert dict(r.scan()) == owned.expected
        with pytest.raises(wal.ArgumentError, match=f"ends at LSN {end}"):
            wal.restore(archive_url, tmp_path / "r2", lsn=end + 1)
        checked = verify(archive_url)
        assert checked.ok and checked.last_lsn == end and checked.unfinished_tail == (after, past_gap)
        assert main(["verify", archive_url]) == 0
        follower.poll()
        assert follower.lsn == end and dict(follower.scan()) == owned.expected
        assert follower.stats()["follower_error"] is None
        # Reopened on its directory, a follower does not know whose object it stopped after; the
        # stray right after it continues only after its own writer's: it reads that from the archive.
        with wal.follow(archive_url, tmp_path / "f2", poll_ms=60_000) as reopened:
            reopened.poll()
            assert reopened.lsn == end and dict(reopened.scan()) == owned.expected
        # The writer goes on: its objects take both names (one replicated commit per object).
        last = owned.commit(6, "more")
        assert last == end + 6 and owned.archived == last
        owned.check_restores(tmp_path, "iii", end=last)
        assert verify(archive_url).unfinished_tail == ()
        follower.poll()
        assert follower.lsn == last and dict(follower.scan()) == owned.expected
    finally:
        follower.close()
        owned.store.close()


def test_a_new_writer_opening_an_archive_with_strays_past_its_end(tmp_path, archive_url) -> None:
    """The writer's open (`plan.find_end`) takes the chain's end, not a stray's, and deletes the
    strays past it once its first object is in."""
    owned = Owned(tmp_path, archive_url)
    end = owned.commit(3, "new")
    owned.store.close()
    names = [owned.put_stray(end + 1, end + 3, behind=1), owned.put_stray(end + 5, end + 5, behind=2)]
    with wal.open(tmp_path / "follower", archive=archive_url, durability="replicated") as s:
        assert s.stats()["archived_lsn"] == end
        assert s.put("reopened", b"c") == end + 1
        owned.expected[b"reopened"] = b"c"
        wait_until(lambda: not any(n for n in names if n != names[0] and _exists(owned.objects, n)))
    owned.check_restores(tmp_path, "open", end=end + 1)


def _exists(objects: object, name: str) -> bool:
    return name in {n for n, _ in objects.list(layout.LOG_PREFIX)}  # type: ignore[attr-defined]


class HoldName(FileObjects):
    """file:// objects whose PUT of the name `hold` waits for `release` (a slow PUT)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.hold: str | None = None
        self.release = threading.Event()
        self.tried: list[str] = []

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        self.tried.append(name)
        if name == self.hold:
            assert self.release.wait(60), "never released"
        super().put(name, data, create_only=create_only)


def _one_object_each(store: wal.Store, count: int) -> int:
    """`count` commits at sync, each shipped as its own group object (the next commit waits
    until the shipper has sent the last)."""
    lsn = 0
    for i in range(count):
        lsn = store.put(f"w/{i}", b"w")
        wait_until(lambda lsn=lsn: store._shipper._dispatched >= lsn)  # type: ignore[attr-defined]
    return lsn


@pytest.mark.parametrize("taken_by", ["stray", "successor"])
def test_a_taken_name_is_decided_only_once_the_writers_objects_before_it_are_stored(tmp_path, taken_by) -> None:
    """The writer's PUT at e+1 is slow; its PUT at e+3 finds another writer's object sent with
    behind 1. "stray": nothing else is there; once e+1 and e+2 are stored the object at e+3 is a
    stray, deleted, and the writer goes on. "successor": another writer took over at e+1 (its
    first object, behind 0; its object at e+2 still in flight): the object at e+3 is that
    writer's and stays; the writer is fenced when its PUT at e+1 is answered."""
    objects = HoldName(str(tmp_path / "archive"))
    store = wal.open(tmp_path / "s", archive=objects, archive_puts_in_flight=4, **A_LOT)  # no lag bound met
    try:
        end = store.put("a", b"1", durability="replicated")
        other = os.urandom(16)
        if taken_by == "successor":
            FileObjects(objects.root).put(layout.log_name(end + 1), stray(end + 1, end + 1, behind=0, writer=other))
        FileObjects(objects.root).put(layout.log_name(end + 3), stray(end + 3, end + 3, behind=1, writer=other))
        objects.hold = layout.log_name(end + 1)
        assert _one_object_each(store, 4) == end + 4
        wait_until(lambda: layout.log_name(end + 3) in objects.tried)
        time.sleep(0.3)  # undecided while e+1 is in flight: the object at e+3 stays
        taken = layout.decode_log(objects.get(layout.log_name(end + 3)), layout.log_name(end + 3))
        assert taken.writer_id == other and store.stats()["archived_lsn"] == end
        objects.release.set()
        if taken_by == "stray":
            wait_until(lambda: store.stats()["archived_lsn"] == end + 4)
            mine = layout.decode_log(objects.get(layout.log_name(end + 3)), layout.log_name(end + 3))
            assert mine.writer_id == store._shipper.writer_id
            assert store.put("b", b"2", durability="replicated") == end + 5
        else:
            wait_until(lambda: store.stats()["archive_fenced"])
            with pytest.raises(wal.FailedError, match="fenced"):
                store.put("b", b"2")
            kept = layout.decode_log(objects.get(layout.log_name(end + 3)), layout.log_name(end + 3))
            assert kept.writer_id == other, "the successor's object was deleted"
    finally:
        objects.release.set()
        store.close()


def test_objects_of_version_1_are_read_and_unknown_versions_refused(tmp_path) -> None:
    """A group object sent with behind >= 1 is version 2 (its reader must know the chain rule);
    every other log object stays version 1, as written before; a version past 2 is refused."""
    now = time.time_ns() // 1_000_000
    recs = [(5, record.encode([(record.OP_PUT, b"k", b"v")], now, None))]
    alone = layout.encode_log(recs, b"w" * 16, 0)
    sent_behind = layout.encode_log(recs, b"w" * 16, 3)
    assert int.from_bytes(alone[8:10], "little") == 1 and int.from_bytes(sent_behind[8:10], "little") == 2
    assert layout.decode_log(sent_behind, layout.log_name(5)).behind == 3
    # A version 1 object with behind set (written by the earlier one-writer pipelining) reads as before.
    old = bytearray(sent_behind[:-32])
    old[8:10] = (1).to_bytes(2, "little")
    old_obj = layout.decode_log(bytes(old) + hashlib.sha256(bytes(old)).digest(), layout.log_name(5))
    assert old_obj.behind == 3 and old_obj.records == recs
    future = bytearray(alone[:-32])
    future[8:10] = (3).to_bytes(2, "little")
    with pytest.raises(wal.CorruptionError, match="format version 3; this agentwal reads 1 and 2"):
        layout.decode_log(bytes(future) + hashlib.sha256(bytes(future)).digest(), layout.log_name(5))


# ---- end to end: real strays ---------------------------------------------------------------------


def test_an_old_primary_fenced_with_puts_in_flight_leaves_nothing_the_new_primary_did_not_write(
        tmp_path, s3_server: WeedServer, monkeypatch, caplog) -> None:
    """The old primary (4 PUTs in flight) ships through a proxy that holds its log PUTs while a
    follower is promoted and the new primary makes its first commit; then they are released and
    reach SeaweedFS. The old primary stops with FailedError; its objects past the fence that did
    not collide are strays past the new primary's end, which the new primary deletes as it takes
    their names, committing at `replicated` throughout. A restore holds every commit the new
    primary acknowledged and nothing the old one did not."""
    import boto3  # noqa: PLC0415
    from botocore.config import Config  # noqa: PLC0415

    caplog.set_level(logging.INFO, logger="wal.archive")
    s3_server.use_env(monkeypatch)
    prefix = uuid.uuid4().hex
    url = f"s3://{BUCKET}/{prefix}"
    with HoldingProxy(s3_server.endpoint) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                              config=Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 1}))
        old = wal.open(tmp_path / "old", archive=S3Objects(BUCKET, prefix, client=client), durability="replicated",
                       archive_puts_in_flight=4, **A_LOT)
        acked: dict[bytes, bytes] = {}
        for i in range(20):
            old.put(f"first/{i}", b"a")
            acked[f"first/{i}".encode()] = b"a"
        fence = old.stats()["archived_lsn"] + 1
        failures: list[BaseException] = []

        def old_writer(t: int) -> None:
            time.sleep(0.1 * t)  # one commit after another: each its own group object
            try:
                for i in range(1000):
                    old.put(f"old/{t}/{i}", b"a")
                    acked[f"old/{t}/{i}".encode()] = b"a"
            except wal.FailedError as exc:
                failures.append(exc)

        proxy.hold = lambda method, path: method == "PUT" and f"/{prefix}/log/" in path
        threads = [threading.Thread(target=old_writer, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        wait_until(lambda: len(proxy.held) >= 4)  # four group objects in flight, none stored
        replica = wal.follow(url, tmp_path / "new", poll_ms=50)
        new = replica.promote(durability="replicated", archive_puts_in_flight=4, archive_merge_objects=4, **A_LOT)
        assert new.watermarks.durable == fence
        new_acked: dict[bytes, bytes] = {}
        try:
            new.put("new/0", b"b")
            new_acked[b"new/0"] = b"b"
            proxy.release.set()  # the old primary's PUTs reach the object store now
            for th in threads:
                th.join(60)
            assert len(failures) == len(threads) and all("fenced" in str(exc) for exc in failures)
            assert old.stats()["archive_fenced"]
            strays = [n for n, _ in open_objects(url).list(layout.LOG_PREFIX)
                      if layout.decode_log(open_objects(url).get(n), n).writer_id == old._shipper.writer_id
                      and (layout.parse_name(n) or layout.Name("", 0, None)).first > fence]
            assert strays, "none of the old primary's held objects was stored past the fence"
            for i in range(1, 30):
                new.put(f"new/{i}", b"b")
                new_acked[f"new/{i}".encode()] = b"b"
            end = new.stats()["archived_lsn"]
            assert end == new.watermarks.durable
        finally:
            proxy.release.set()
            new.close()
            old.close()
    assert "a stray of a writer fenced" in caplog.text
    left = [n for n, _ in open_objects(url).list(layout.LOG_PREFIX)
            if layout.decode_log(open_objects(url).get(n), n).writer_id == old._shipper.writer_id
            and (layout.parse_name(n) or layout.Name("", 0, None)).first > fence]
    assert left == [], "the new primary's objects took every name the old primary's strays held"
    # The old primary acknowledged nothing after its log PUTs were held (all its writers failed).
    assert set(acked) == {f"first/{i}".encode() for i in range(20)}
    report = wal.restore(url, tmp_path / "r")
    assert report.lsn == end and report.unfinished_tail == ()
    with wal.open(tmp_path / "r") as r:
        assert dict(r.scan()) == {**acked, **new_acked}
    checked = verify(url)
    assert checked.ok and checked.last_lsn == end, checked.problems
