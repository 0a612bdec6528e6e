"""The store's C core (native/storecore.c): the record codec, the collapse of a batch to each
key's last write, the overlay pruning, and the commit path's fallback to Python.

The codec is checked against bytes built here from FORMAT.md §15 with `struct` (an oracle
independent of the C), the collapse against a dict model, and the commit path through the
public API (its other behaviour -- read-your-writes, fail-stop, fork, close -- is covered
by the store tests, which all run through it).
"""

from __future__ import annotations

import errno
import inspect
import mmap
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import wal
from wal._bindings import storecore
from wal.drill.failpoints import failpoint
from wal.log import record
from wal.log.log import RecordSpan
from wal.store import replay

KEYS = st.binary(min_size=1, max_size=record.MAX_KEY_BYTES)
SMALL_KEYS = st.sampled_from([b"a", b"b", b"c", b"\x00", b"\xff\xff"])
VALUES = st.binary(max_size=300)
OPS = st.lists(st.one_of(st.tuples(st.just(record.OP_PUT), KEYS, VALUES),
                         st.tuples(st.just(record.OP_DELETE), KEYS, st.none())), max_size=6)
IDEM = st.one_of(st.none(), KEYS)
TIME_MS = st.integers(min_value=0, max_value=2**64 - 1)


def reference_encoding(ops: list[record.Op], time_ms: int, idem: bytes | None) -> bytes:
    """FORMAT.md §15, written out with struct: the oracle for the C encoder."""
    out = struct.pack("<BBQI", 0x54, 1 if idem is not None else 0, time_ms, len(ops))
    if idem is not None:
        out += struct.pack("<H", len(idem)) + idem
    for kind, key, value in ops:
        out += struct.pack("<BH", kind, len(key)) + key
        if kind == record.OP_PUT:
            assert value is not None
            out += struct.pack("<I", len(value)) + value
    return out


def test_a_known_transaction_encodes_to_the_bytes_format_md_specifies() -> None:
    payload = record.encode([(record.OP_PUT, b"k", b"vv"), (record.OP_DELETE, b"gone", None)], 0x0102, b"job")
    assert payload == bytes.fromhex(
        "54" "01" "0201000000000000" "02000000"  # kind, flags (idempotency key), time_ms, n_ops
        "0300" "6a6f62"  # idempotency key "job"
        "01" "0100" "6b" "02000000" "7676"  # put k = vv
        "02" "0400" "676f6e65"  # delete gone
    )


@given(OPS, TIME_MS, IDEM)
def test_encode_matches_the_format_and_decode_inverts_it(ops: list[record.Op], time_ms: int,
                                                         idem: bytes | None) -> None:
    payload = record.encode(ops, time_ms, idem)
    assert payload == reference_encoding(ops, time_ms, idem)
    if ops:
        assert record.encode_one(*ops[0], time_ms) == reference_encoding(ops[:1], time_ms, None)
    txn = record.decode(payload, 7)
    assert (list(txn.ops), txn.time_ms, txn.idempotency_key) == (ops, time_ms, idem)


@settings(max_examples=50)
@given(OPS.filter(bool), TIME_MS, IDEM)
def test_every_truncation_and_any_trailing_byte_is_refused_as_a_bad_store_record(
        ops: list[record.Op], time_ms: int, idem: bytes | None) -> None:
    payload = record.encode(ops, time_ms, idem)
    for bad in [payload[:n] for n in range(len(payload))] + [payload + b"\x00"]:
        with pytest.raises(wal.CorruptionError) as info:
            record.decode(bad, 42)
        assert info.value.reason == "bad store record" and info.value.lsn == 42
        with pytest.raises(wal.CorruptionError) as info:
            record.collapse([(41, record.encode_one(record.OP_PUT, b"x", b"y", 0)), (42, bad)])
        assert info.value.lsn == 42


@pytest.mark.parametrize(("payload", "why"), [
    (b"\x55" + bytes(13), "unknown record kind"),
    (b"\x54\x02" + bytes(12), "unknown flags"),
    (struct.pack("<BBQI", 0x54, 0, 0, 1) + b"\x03\x01\x00k", "unknown op"),
    (struct.pack("<BBQI", 0x54, 0, 0, 1) + b"\x02\x00\x00", "bad key length"),  # an empty key
    (struct.pack("<BBQI", 0x54, 0, 0, 1) + b"\x02\x00\x02" + b"k" * 512, "bad key length"),  # over 511
    (struct.pack("<BBQIH", 0x54, 1, 0, 0, 512) + b"i" * 512, "bad idempotency key length"),
])
def test_a_malformed_record_names_what_is_wrong(payload: bytes, why: str) -> None:
    with pytest.raises(wal.CorruptionError, match=why):
        record.decode(payload, 1)


def model_collapse(txns: list[tuple[list[record.Op], int, bytes | None]], first: int) -> record.Collapsed:
    last_write: dict[bytes, tuple[int, bytes | None]] = {}
    idem = []
    for lsn, (ops, time_ms, key) in enumerate(txns, first):
        for _, k, v in ops:
            last_write[k] = (lsn, v)
        if key is not None:
            idem.append((key, lsn, time_ms))
    puts = [(k, struct.pack("<Q", lsn) + v) for k, (lsn, v) in last_write.items() if v is not None]
    deletes = sorted(k for k, (_, v) in last_write.items() if v is None)
    return first, first + len(txns) - 1, len(txns), puts, deletes, idem


TXNS = st.lists(st.tuples(st.lists(st.one_of(st.tuples(st.just(record.OP_PUT), SMALL_KEYS, VALUES),
                                             st.tuples(st.just(record.OP_DELETE), SMALL_KEYS, st.none())),
                                   min_size=1, max_size=4),
                          st.integers(min_value=0, max_value=2**40),
                          st.one_of(st.none(), st.sampled_from([b"job-1", b"job-2"]))),
                min_size=1, max_size=30)


@given(TXNS, st.integers(min_value=1, max_value=2**40))
def test_collapse_leaves_each_keys_last_write_with_its_lsn_as_version(
        txns: list[tuple[list[record.Op], int, bytes | None]], first: int) -> None:
    records = [(lsn, record.encode(ops, t, idem)) for lsn, (ops, t, idem) in enumerate(txns, first)]
    got = record.collapse(records)
    want = model_collapse(txns, first)
    assert got[:3] == want[:3]
    assert sorted(got[3]) == sorted(want[3])
    versions = [struct.unpack_from("<Q", stored)[0] for _, stored in got[3]]
    assert versions == sorted(versions)  # LSN order: what LMDB likes when keys grow with time
    assert sorted(got[4]) == want[4]
    assert got[5] == want[5]


def test_the_apply_queue_collapses_python_and_c_commits_alike_and_prune_keeps_unapplied_versions(
        tmp_path: Path) -> None:
    log = wal.Log.open(str(tmp_path / "log"), durability="buffered", rpo_ms=1000)
    lock, wake = storecore.CommitLock(), threading.Event()
    core = storecore.Core(log, log.native_address, lock, wake, 2, 1000, 1 << 30)
    try:
        lsns = [core.commit(record.OP_PUT, b"k", b"v%d" % i, False) for i in range(1, 4)]
        assert lsns == [1, 2, 3]
        assert core.commit(record.OP_DELETE, "other", None, False) == 4  # a str key: its UTF-8 bytes
        txn = record.make_txn([(record.OP_PUT, b"t", b"x"), (record.OP_DELETE, b"k", None)], 9, b"idem")
        lsn = log.append(record.encode(txn.ops, txn.time_ms, txn.idempotency_key))
        with lock:
            core.enqueue_txn(lsn, txn, 40)
        assert len(core) == 5
        # Each version of k, newest first, as a read at each watermark sees it.
        assert [core.overlay_get(b"k", limit) for limit in (None, 3, 2, 1, 0)] == [
            (5, None), (3, b"v3"), (2, b"v2"), (1, b"v1"), None]
        assert core.overlay_get(b"other", None) == (4, None) and core.overlay_keys == 3

        with lock:
            assert core.take(0, 100) is None  # nothing durable yet
            batch = core.take(2, 100)
        assert batch == (1, 2, 2, [(b"k", struct.pack("<Q", 2) + b"v2")], [], [])
        with lock:
            core.prune(2, batch[3], batch[4])
        assert core.overlay_get(b"k", 3) == (3, b"v3") and core.overlay_get(b"k", 2) is None  # applied: gone
        with lock:
            batch = core.take(5, 100)
        assert batch == (3, 5, 3, [(b"t", struct.pack("<Q", 5) + b"x")], [b"k", b"other"], [(b"idem", 5, 9)])
        with lock:
            core.prune(5, batch[3], batch[4])
        assert core.overlay_keys == 0  # every version applied, the Python path's (t, k at 5) too
        assert len(core) == 0
    finally:
        log.close()


def test_the_commit_path_answers_0_and_does_nothing_for_what_python_must_decide(tmp_path: Path) -> None:
    log = wal.Log.open(str(tmp_path / "log"), durability="buffered", rpo_ms=1000)
    lock = storecore.CommitLock()
    core = storecore.Core(log, log.native_address, lock, threading.Event(), 2, 2, 1 << 30)
    try:
        for key, value in [(bytearray(b"k"), b"v"), (b"k", bytearray(b"v")), (b"", b"v"), (b"k" * 512, b"v"),
                           (1, b"v"), ("\ud800", b"v")]:
            assert core.commit(record.OP_PUT, key, value, False) == 0
        assert core.commit(record.OP_DELETE, b"k", b"not None", False) == 0
        with lock:
            assert core.commit(record.OP_PUT, b"k", b"v", False) == 0  # the commit lock is busy
        assert [core.commit(record.OP_PUT, b"k", b"v", False) for _ in range(4)] == [1, 2, 3, 0]  # over max_unapplied
        core.disable()
        with lock:
            core.take(10, 10)
        assert core.commit(record.OP_PUT, b"k", b"v", False) == 0
        assert log.watermarks.appended == 3 and core.overlay_get(b"k", None) == (3, b"v")
    finally:
        log.close()


def test_a_put_meeting_a_held_commit_lock_waits_for_it_and_then_commits(tmp_path: Path) -> None:
    with wal.open(tmp_path, durability="buffered", rpo_ms=100) as store:
        done: list[int] = []
        with store._commit_lock:
            worker = threading.Thread(target=lambda: done.append(store.put(b"k", b"v")))
            worker.start()
            worker.join(0.3)
            assert worker.is_alive() and not done  # the Python path waits for the lock
        worker.join(10)
        assert done and store.get(b"k") == b"v" and store.version(b"k") == done[0]


def test_store_put_and_delete_are_the_c_path_and_keep_the_python_functions_signature_and_errors(
        tmp_path: Path) -> None:
    # Store.put / Store.delete are storecore.FastCommit descriptors wrapping the Python functions.
    assert isinstance(wal.Store.__dict__["put"], storecore.FastCommit)
    assert str(inspect.signature(wal.Store.put)) == str(inspect.signature(wal.Store.put.__wrapped__))
    assert wal.Store.delete.__name__ == "delete" and "deletion" in (wal.Store.delete.__doc__ or "")
    with wal.open(tmp_path, durability="buffered", rpo_ms=100) as store:
        lsns = [store.put(b"a", b"1"),                      # the C path
                store.put("b", b"2"),                       # a str key: the C path, as UTF-8
                store.put(b"c", b"3", durability="sync"),   # a keyword: the Python function
                wal.Store.put(store, b"d", b"4"),           # through the class
                store.delete(b"a"),
                store.delete(b"b", durability="sync")]
        bound = store.put
        lsns.append(bound(b"e", b"5"))
        assert store._log is not None
        assert lsns == list(range(1, 8)) and store._log.watermarks.appended == 7  # one commit each
        assert dict(store.scan()) == {b"c": b"3", b"d": b"4", b"e": b"5"}
        with pytest.raises(TypeError, match="value"):
            store.put(b"k")  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="positional"):
            store.put(b"k", b"v", b"x")  # type: ignore[call-arg]
        with pytest.raises(wal.ArgumentTypeError):
            store.put(b"k", "not bytes")  # type: ignore[arg-type]
        assert store._log is not None and store._log.watermarks.appended == 7


def test_a_c_path_commit_whose_fdatasync_fails_raises_the_logs_failure_and_is_in_the_log_once(
        tmp_path: Path) -> None:
    store = wal.open(tmp_path)
    store.put(b"a", b"1")
    with failpoint("fsync", errno.EIO), pytest.raises(wal.FailedError, match="Input/output error"):
        store.put(b"b", b"2")  # appended by the C path, then its fdatasync fails
    assert store._log is not None and store._log.watermarks.appended == 2
    with pytest.raises(wal.FailedError):
        store.close()


# ---- replay: the Collapser over spans of mapped segments (native/collapse.c) ----------------------------


def spans_of(payloads: list[tuple[int, bytes]], cut: int) -> Iterator[tuple[bytes, int, list[tuple[int, int, int]]]]:
    """(buffer, records, [(lsn, offset, length)]) spans: `cut` records per buffer, each buffer
    with a few bytes of junk before every payload, as a segment has frame headers."""
    for start in range(0, len(payloads), cut):
        buf, index = b"", []
        for lsn, payload in payloads[start:start + cut]:
            buf += b"\xee" * 5
            index.append((lsn, len(buf), len(payload)))
            buf += payload
        yield buf, len(index), index


def feed(collapser: record.Collapser, buf: object, index: list[tuple[int, int, int]]) -> None:
    lsns, offs, lens = zip(*index, strict=True) if index else ((), (), ())
    collapser.add(RecordSpan(buf, struct.pack(f"={len(lsns)}Q", *lsns), struct.pack(f"={len(offs)}Q", *offs),
                             struct.pack(f"={len(lens)}I", *lens), len(index)))


@settings(max_examples=150)
@given(TXNS, st.integers(min_value=1, max_value=2**40), st.integers(min_value=1, max_value=7),
       st.integers(min_value=1, max_value=5))
def test_the_collapser_over_spans_of_buffers_equals_collapse_of_the_records(
        txns: list[tuple[list[record.Op], int, bytes | None]], first: int, per_buffer: int, per_span: int) -> None:
    records = [(lsn, record.encode(ops, t, idem)) for lsn, (ops, t, idem) in enumerate(txns, first)]
    c = record.Collapser()
    for buf, _, index in spans_of(records, per_buffer):
        for i in range(0, len(index), per_span):
            feed(c, buf, index[i:i + per_span])
        feed(c, buf, [])  # the segment ends: what points into it is copied
    got = c.take()
    want = record.collapse(records)
    assert got == want
    model = model_collapse(txns, first)
    assert got is not None and got[:3] == model[:3] and sorted(got[3]) == sorted(model[3])
    assert sorted(got[4]) == model[4] and got[5] == model[5]
    assert c.take() is None and c.keys == 0 and c.held_bytes == 0  # take starts afresh


def test_the_collapser_keeps_the_last_of_many_writes_to_tens_of_thousands_of_keys() -> None:
    n = 30_000  # the table grows many times
    records = [(lsn, record.encode_one(record.OP_PUT, b"k%06d" % (i % n), b"v%d" % lsn, 0))
               for lsn, i in enumerate(range(2 * n), 1)]
    records.append((2 * n + 1, record.encode_one(record.OP_DELETE, b"k000007", None, 0)))
    c = record.Collapser()
    for buf, _, index in spans_of(records, 10_000):
        feed(c, buf, index)
        feed(c, buf, [])
    held = sum(7 + len(b"v%d" % lsn) for lsn in range(n + 1, 2 * n + 1)) - len(b"v%d" % (n + 8))  # k000007 deleted
    assert c.keys == n and c.held_bytes == held
    first, last, commits, puts, deletes, _ = c.take()  # type: ignore[misc]
    assert (first, last, commits) == (1, 2 * n + 1, 2 * n + 1)
    assert deletes == [b"k000007"]
    assert len(puts) == n - 1
    assert all(stored == struct.pack("<Q", lsn) + b"v%d" % lsn
               for (key, stored), lsn in zip(puts, [x for x in range(n + 1, 2 * n + 1) if x != n + 8], strict=True))
    assert puts[0][0] == b"k000000" and puts[-1][0] == b"k%06d" % (n - 1)


def test_the_collapser_pins_a_mapped_segment_until_its_end_and_copies_what_it_still_needs(tmp_path: Path) -> None:
    records = [(lsn, record.encode_one(record.OP_PUT, b"key", b"value-%d" % lsn, 0)) for lsn in (1, 2, 3)]
    ((buf, _, index),) = spans_of(records, 3)
    path = tmp_path / "segment"
    path.write_bytes(buf)
    c = record.Collapser()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        feed(c, mm, index)
        with pytest.raises(BufferError):
            mm.close()  # the table points into the map: it cannot go away under it
        feed(c, mm, [])  # the segment ends
        mm.close()
    assert c.take() == (1, 3, 3, [(b"key", struct.pack("<Q", 3) + b"value-3")], [], [])


def test_the_collapser_refuses_a_record_outside_its_buffer_and_a_malformed_one_then_any_use() -> None:
    good = record.encode_one(record.OP_PUT, b"k", b"v", 0)
    c = record.Collapser()
    with pytest.raises(wal.CorruptionError, match="outside the buffer"):
        feed(c, good, [(1, 3, len(good))])
    c = record.Collapser()
    with pytest.raises(wal.CorruptionError, match="unknown record kind") as info:
        feed(c, good + b"\x55" + bytes(13), [(1, 0, len(good)), (2, len(good), 14)])
    assert info.value.lsn == 2
    with pytest.raises(RuntimeError, match="after a failure"):
        c.take()


def test_log_read_spans_yield_what_read_yields_and_end_each_segment_with_an_empty_span(tmp_path: Path) -> None:
    payloads = [b"p%05d" % i * (1 + i % 50) for i in range(3_000)]
    with wal.Log.open(tmp_path / "log", durability="buffered", segment_bytes=64 << 10) as lg:
        lg.append_many(payloads)
        lg.sync()
        assert lg.stats()["segments_created"] > 3
        for start in (1, 1_500, 2_999):
            seen, ends = [], 0
            spans = lg.read_spans(start)
            for span in spans:
                if span.records == 0:
                    ends += 1
                    continue
                lsns, offs, lens = span.lsns.cast("Q"), span.offsets.cast("Q"), span.lengths.cast("I")
                seen += [(lsn, bytes(span.buffer[o:o + n])) for lsn, o, n in zip(lsns, offs, lens, strict=True)]
            assert seen == list(lg.read(start)) == list(enumerate(payloads, 1))[start - 1:]
            assert ends >= 1
        last = lg.append(b"only in the process buffer")  # buffered: not yet written to the OS
        assert all(lsn < last for span in lg.read_spans(2_990) for lsn in span.lsns.cast("Q"))


@pytest.mark.parametrize("segment_bytes", [64 << 20, 4096])
def test_replay_in_many_small_batches_rebuilds_the_same_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                segment_bytes: int) -> None:
    """One segment: all of it replayed after the log's open. 4 KiB segments: all but the newest
    replayed by the open's replay thread, batches running on across segment ends."""
    monkeypatch.setattr(replay, "BATCH_KEYS", 7)
    monkeypatch.setattr(replay, "BATCH_BYTES", 300)
    model: dict[bytes, bytes] = {}
    wal.open(tmp_path / "s", segment_bytes=segment_bytes).close()
    with wal.Log.open(tmp_path / "s" / "log", durability="buffered", _store_log=True,  # records the state never saw
                      segment_bytes=segment_bytes) as lg:
        for i in range(2_000):
            key = b"k%03d" % (i * 7919 % 150)
            if i % 11 == 0:
                lg.append(record.encode_one(record.OP_DELETE, key, None, 0))
                model.pop(key, None)
            else:
                lg.append(record.encode_one(record.OP_PUT, key, b"v%d" % i * (i % 40), 0))
                model[key] = b"v%d" % i * (i % 40)
    with wal.open(tmp_path / "s", segment_bytes=segment_bytes) as store:
        assert (len(list((tmp_path / "s" / "log").glob("*.wal"))) > 10) == (segment_bytes == 4096)
        assert store.stats()["records_replayed"] == 2_000
        assert dict(store.scan(b"")) == model


def _unapplied_log(d: Path, n: int, segment_bytes: int = 4096) -> dict[bytes, bytes]:
    """A closed store whose log holds n put commits (over 50 keys) the state never saw."""
    model: dict[bytes, bytes] = {}
    wal.open(d, segment_bytes=segment_bytes).close()
    with wal.Log.open(d / "log", segment_bytes=segment_bytes, _store_log=True) as lg:
        for i in range(n):
            key, value = b"k%02d" % (i % 50), b"v%d" % i
            lg.append(record.encode_one(record.OP_PUT, key, value, 0))
            model[key] = value
    return model


def test_sealed_segments_are_replayed_while_the_log_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay, "BATCH_KEYS", 10)
    model = _unapplied_log(tmp_path, 600)
    applied_when_the_log_had_opened: list[int] = []
    join = replay.Replay.join

    def spy(self: replay.Replay) -> None:
        join(self)
        assert self.state is not None
        applied_when_the_log_had_opened.append(self.state.applied_lsn())

    monkeypatch.setattr(replay.Replay, "join", spy)
    with wal.open(tmp_path, segment_bytes=4096) as store:
        assert dict(store.scan(b"")) == model
        assert store.stats()["records_replayed"] == 600
        assert store.watermarks.applied == 600
    (early,) = applied_when_the_log_had_opened
    assert 0 < early < 600  # batches of the sealed segments were in the state before the open returned


def test_damage_after_sealed_segments_fails_the_open_and_the_state_keeps_only_a_prefix(tmp_path: Path) -> None:
    model = _unapplied_log(tmp_path, 600)
    segs = sorted((tmp_path / "log").glob("*.wal"))
    assert len(segs) >= 5
    damaged = segs[3]
    data = bytearray(damaged.read_bytes())
    data[200] ^= 0x20  # inside a record of a sealed segment: damage, not a torn tail
    damaged.write_bytes(bytes(data))
    log_before = {p.name: p.read_bytes() for p in segs}
    with pytest.raises(wal.CorruptionError) as info:
        wal.open(tmp_path, segment_bytes=4096)
    assert info.value.path == str(damaged)
    assert {p.name: p.read_bytes() for p in segs} == log_before  # the log is not changed
    with pytest.raises(wal.CorruptionError):  # not LockedError: the failed open let go of everything
        wal.open(tmp_path, segment_bytes=4096)
    with wal.open(tmp_path, segment_bytes=4096, recovery="truncate") as store:
        last = store.watermarks.applied
        assert 0 < last < 600
        expected = {b"k%02d" % (i % 50): b"v%d" % i for i in range(last)}
        assert dict(store.scan(b"")) == expected
    assert set(expected) <= set(model)


def test_a_sealed_segment_holding_a_record_that_is_no_store_transaction_fails_the_open(tmp_path: Path) -> None:
    wal.open(tmp_path, segment_bytes=4096).close()
    with wal.Log.open(tmp_path / "log", segment_bytes=4096, _store_log=True) as lg:
        lg.append(record.encode_one(record.OP_PUT, b"a", b"1", 0))
        lg.append(b"not a store transaction")  # LSN 2, in the first (sealed) segment
        for i in range(100):
            lg.append(record.encode_one(record.OP_PUT, b"b", b"%d" % i, 0))
    for _ in range(2):  # and again: the failed open closed the log and the state it had opened
        with pytest.raises(wal.CorruptionError, match="LSN 2 has a valid CRC but is not a store transaction"):
            wal.open(tmp_path, segment_bytes=4096)
