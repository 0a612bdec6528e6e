"""The `wal.Store` API (public and frozen), through `wal.open`, as a user sees it.

put / delete / get / version / scan (key order, prefix bounds), str keys, value types and
size limits (refused before anything is written), transactions (atomic, own writes,
`if_version`, idempotency keys, per-transaction durability), watermarks, stats,
checkpoints (segments removed or archived, automatic ones bounding replay), read-your-
writes at every level, closed and read-only stores, and the STORE format version.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from legacy_state import strip_entry_checksums

import wal
from wal.drill.failpoints import failpoint
from wal.log import record
from wal.store.state import InvariantError, State
from wal.store.store import MAX_KEY_BYTES, MAX_VALUE_BYTES, STORE_VERSION

HELPERS = Path(__file__).parent / "store_helpers"
# apply_interval_ms so long that the materializer only runs when close/checkpoint asks:
# commits then stay in the in-memory overlay and reads must be served from it.
NO_APPLY = 600_000
LEVELS = [("sync", None), ("interval", 1000), ("buffered", 1000)]
# "Nothing written" is checked on the written watermark: applied may move at any time, as
# the materializer catches up with earlier commits.


def wal_files(store_dir: Path) -> list[str]:
    return sorted(p.name for p in (store_dir / "log").glob("*.wal"))


def fill(store: wal.Store, n: int, size: int = 1000, prefix: str = "k") -> int:
    lsn = 0
    for i in range(n):
        lsn = store.put(f"{prefix}{i:06d}", bytes([i % 251]) * size)
    return lsn


# ---- put / get / delete / version -------------------------------------------------------


def test_a_store_and_a_bare_log_are_never_opened_as_each_other(tmp_path: Path) -> None:
    # A store made in a bare log's directory kept its own log in log/ and hid the bare log's
    # records from every tool; a bare log opened at a store's root put segments beside it.
    with wal.Log.open(tmp_path / "bare") as log:
        log.append(b"record")
    with wal.open(tmp_path / "store") as store:
        store.put("k", b"v")
    for not_a_store in (tmp_path / "bare", tmp_path / "store" / "log"):
        before = sorted(p.name for p in not_a_store.iterdir())
        with pytest.raises(wal.ArgumentError, match="holds a bare log"):
            wal.open(not_a_store)
        assert sorted(p.name for p in not_a_store.iterdir()) == before
    with pytest.raises(wal.ArgumentError, match="is an agentwal store"):
        wal.Log.open(tmp_path / "store")
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["STORE", "log", "state"]
    # A bare log's append into a store's own log/ made the store refuse its log ("not a store
    # transaction") from then on; reading it is harmless and stays allowed.
    segments = sorted((p.name, p.stat().st_size) for p in (tmp_path / "store" / "log").iterdir())
    with pytest.raises(wal.ArgumentError, match="is the log of the agentwal store"):
        wal.Log.open(tmp_path / "store" / "log")
    assert sorted((p.name, p.stat().st_size) for p in (tmp_path / "store" / "log").iterdir()) == segments
    (tmp_path / "alias").symlink_to(tmp_path / "store" / "log")  # nor through another name
    with pytest.raises(wal.ArgumentError, match="is the log of the agentwal store"):
        wal.Log.open(tmp_path / "alias")
    with wal.Log.open(tmp_path / "store" / "log", readonly=True) as store_log:
        assert [lsn for lsn, _payload in store_log.read(1)] == [1]
    with wal.open(tmp_path / "store") as store, wal.Log.open(tmp_path / "bare") as log:
        assert store.get("k") == b"v" and [payload for _lsn, payload in log.read(1)] == [b"record"]


def test_put_returns_the_commit_lsn_and_get_returns_the_value(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        lsn = store.put(b"agent/1", b"hello")
        assert lsn == 1
        assert store.get(b"agent/1") == b"hello"
        assert store.version(b"agent/1") == lsn


def test_each_commit_gets_the_next_lsn(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        lsns = [store.put(f"k{i}", b"v") for i in range(5)] + [store.delete("k0")]
        assert lsns == [1, 2, 3, 4, 5, 6]


def test_get_of_a_missing_key_returns_the_default(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        assert store.get(b"nope") is None
        assert store.get(b"nope", b"dflt") == b"dflt"
        assert store.version(b"nope") is None


def test_put_overwrites_and_the_version_moves_to_the_new_commit(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"one")
        second = store.put(b"k", b"two")
        assert store.get(b"k") == b"two"
        assert store.version(b"k") == second


def test_delete_removes_the_value_and_the_version(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
        lsn = store.delete(b"k")
        assert lsn == 2
        assert store.get(b"k") is None
        assert store.version(b"k") is None
        assert list(store.scan()) == []


def test_delete_of_a_missing_key_still_commits_and_returns_its_lsn(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        assert store.delete(b"ghost") == 1
        assert store.watermarks.written == 1
        assert store.get(b"ghost") is None


def test_empty_value_is_a_value_not_a_deletion(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        lsn = store.put(b"k", b"")
        assert store.get(b"k", b"dflt") == b""
        assert store.version(b"k") == lsn
        assert list(store.scan()) == [(b"k", b"")]


def test_data_and_versions_survive_close_and_reopen_and_lsns_continue(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        a = store.put(b"a", b"1")
        store.put(b"b", b"2")
        store.delete(b"b")
    with wal.open(tmp_path) as store:
        assert store.get(b"a") == b"1"
        assert store.version(b"a") == a
        assert store.get(b"b") is None
        assert store.put(b"c", b"3") == 4


def test_bytearray_and_memoryview_values_are_stored_as_bytes(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"a", bytearray(b"xy"))
        store.put(b"b", memoryview(b"zw"))
        assert store.get(b"a") == b"xy"
        assert store.get(b"b") == b"zw"
        assert type(store.get(b"a")) is bytes


# ---- str keys -----------------------------------------------------------------------------


def test_str_keys_are_encoded_as_utf8(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put("café/ü", b"v")
        assert store.get("café/ü".encode()) == b"v"
        assert store.get("café/ü") == b"v"
        assert list(store.scan()) == [("café/ü".encode(), b"v")]
        assert [k for k, _ in store.scan("caf")] == ["café/ü".encode()]
        store.delete("café/ü")
        assert store.get(b"caf\xc3\xa9/\xc3\xbc") is None


def test_a_str_key_that_is_not_valid_unicode_is_an_argument_error(tmp_path: Path) -> None:
    """A lone surrogate (what os.fsdecode makes of a non-UTF-8 file name) raised a raw
    UnicodeEncodeError from every call: it is an ArgumentError, and its bytes work."""
    bad = "agent/\udcff"
    with wal.open(tmp_path) as store:
        for call in (lambda: store.put(bad, b"v"), lambda: store.get(bad), lambda: store.delete(bad),
                     lambda: store.get_many([bad]), lambda: list(store.scan(bad)),
                     lambda: store.update(bad, lambda v: b"v")):
            with pytest.raises(wal.ArgumentError, match="not encodable as UTF-8"):
                call()
        store.put(os.fsencode(bad), b"v")
        assert store.get(b"agent/\xff") == b"v"


def test_get_many_of_no_sequence_and_update_without_a_function_are_argument_type_errors(tmp_path: Path) -> None:
    """get_many(None) and update(key, None) raised raw TypeErrors from deep inside."""
    with wal.open(tmp_path) as store:
        with store.snapshot() as snap:
            for get_many, bad in ((store.get_many, None), (store.get_many, 5), (snap.get_many, None)):
                with pytest.raises(wal.ArgumentTypeError, match="get_many takes a sequence of keys"):
                    get_many(bad)  # type: ignore[arg-type]
        with pytest.raises(wal.ArgumentTypeError, match="update's second argument must be a function"):
            store.update("k", None)  # type: ignore[arg-type]
        with pytest.raises(wal.ArgumentTypeError, match="update's second argument must be a function"):
            asyncio.run(store.aupdate("k", b"v"))  # type: ignore[arg-type]
        assert store.get("k") is None and store.watermarks.written == 0


# ---- scan ---------------------------------------------------------------------------------


def test_scan_yields_pairs_in_bytewise_key_order(tmp_path: Path) -> None:
    keys = [b"b", b"a", b"\xff", b"a\x00", b"\x00", b"ab", b"A", b"\xff\xff", b"a\xff", b"\x7f"]
    with wal.open(tmp_path) as store:
        for k in keys:
            store.put(k, b"v" + k)
        assert list(store.scan()) == [(k, b"v" + k) for k in sorted(keys)]


def test_scan_prefix_returns_exactly_the_keys_that_start_with_it(tmp_path: Path) -> None:
    keys = [b"`", b"`\xff", b"a", b"a\x00", b"a\xff", b"a\xff\xff", b"ab", b"abc", b"b", b"b\x00"]
    with wal.open(tmp_path) as store:
        for k in keys:
            store.put(k, k)
        got = [k for k, _ in store.scan(b"a")]
        assert got == [b"a", b"a\x00", b"ab", b"abc", b"a\xff", b"a\xff\xff"]
        assert b"b" not in got and b"`" not in got and b"`\xff" not in got
        assert [k for k, _ in store.scan(b"ab")] == [b"ab", b"abc"]
        assert [k for k, _ in store.scan(b"a\xff")] == [b"a\xff", b"a\xff\xff"]
        assert list(store.scan(b"zz")) == []


def test_scan_prefix_of_0xff_bytes_includes_keys_up_to_the_end_of_the_keyspace(tmp_path: Path) -> None:
    keys = [b"\xfe", b"\xfe\xff", b"\xff", b"\xff\x00", b"\xff\xfe", b"\xff\xff", b"\xff\xff\xff"]
    with wal.open(tmp_path) as store:
        for k in keys:
            store.put(k, b"v")
        assert [k for k, _ in store.scan(b"\xff")] == [b"\xff", b"\xff\x00", b"\xff\xfe", b"\xff\xff",
                                                       b"\xff\xff\xff"]
        assert [k for k, _ in store.scan(b"\xff\xff")] == [b"\xff\xff", b"\xff\xff\xff"]


def test_scan_with_the_empty_prefix_returns_every_key(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        for k in [b"\x00", b"m", b"\xff"]:
            store.put(k, b"v")
        assert [k for k, _ in store.scan(b"")] == [b"\x00", b"m", b"\xff"]
        assert [k for k, _ in store.scan("")] == [b"\x00", b"m", b"\xff"]
        assert [k for k, _ in store.scan()] == [b"\x00", b"m", b"\xff"]


def test_scan_merges_applied_and_unapplied_commits_across_many_chunks(tmp_path: Path) -> None:
    """More keys than one LMDB read chunk; half applied (checkpoint), half only in memory,
    overwrites and deletes of applied keys still in memory: the scan is the newest state."""
    with wal.open(tmp_path, durability="interval", rpo_ms=1000, apply_interval_ms=NO_APPLY) as store:
        expected: dict[bytes, bytes] = {}
        for i in range(0, 3000, 2):
            store.put(b"k%05d" % i, b"old%d" % i)
            expected[b"k%05d" % i] = b"old%d" % i
        store.checkpoint()
        assert store.watermarks.applied == store.watermarks.written
        for i in range(1, 3000, 2):
            store.put(b"k%05d" % i, b"new%d" % i)
            expected[b"k%05d" % i] = b"new%d" % i
        for i in range(0, 3000, 6):
            store.put(b"k%05d" % i, b"over%d" % i)
            expected[b"k%05d" % i] = b"over%d" % i
        for i in range(2, 3000, 10):
            store.delete(b"k%05d" % i)
            expected.pop(b"k%05d" % i, None)
        assert store.watermarks.applied < store.watermarks.written  # still in the overlay
        assert list(store.scan(b"k")) == sorted(expected.items())
        assert list(store.scan(b"k01")) == sorted((k, v) for k, v in expected.items() if k.startswith(b"k01"))
        store.checkpoint()
        assert list(store.scan()) == sorted(expected.items())


def test_scan_does_not_show_a_key_deleted_after_it_was_applied(tmp_path: Path) -> None:
    with wal.open(tmp_path, apply_interval_ms=NO_APPLY) as store:
        store.put(b"a", b"1")
        store.put(b"b", b"2")
        store.checkpoint()
        store.delete(b"a")
        assert list(store.scan()) == [(b"b", b"2")]
        assert store.get(b"a") is None


# ---- argument types and size limits ------------------------------------------------------


@pytest.mark.parametrize("value", ["text", 42, None, 1.5, [b"x"]])
def test_a_value_that_is_not_bytes_raises_argument_type_error_and_writes_nothing(
        tmp_path: Path, value: object) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
        before = store.watermarks.written
        with pytest.raises(wal.ArgumentTypeError) as info:
            store.put(b"k", value)  # type: ignore[arg-type]
        assert isinstance(info.value, TypeError)
        assert isinstance(info.value, wal.WalError)
        with pytest.raises(wal.ArgumentTypeError), store.transaction() as tx:
            tx.put(b"k2", value)  # type: ignore[arg-type]
        assert store.watermarks.written == before
        assert store.get(b"k") == b"v"
        assert store.get(b"k2") is None


@pytest.mark.parametrize("key", [42, None, 1.5, ("a",)])
def test_a_key_that_is_not_bytes_or_str_raises_argument_type_error(tmp_path: Path, key: object) -> None:
    with wal.open(tmp_path) as store:
        with pytest.raises(wal.ArgumentTypeError):
            store.put(key, b"v")  # type: ignore[arg-type]
        with pytest.raises(wal.ArgumentTypeError):
            store.get(key)  # type: ignore[arg-type]
        with pytest.raises(wal.ArgumentTypeError):
            store.delete(key)  # type: ignore[arg-type]
        assert store.watermarks.written == 0


@pytest.mark.parametrize("key", [b"", ""])
def test_the_empty_key_is_rejected_with_argument_error(tmp_path: Path, key: bytes | str) -> None:
    with wal.open(tmp_path) as store:
        with pytest.raises(wal.ArgumentError) as info:
            store.put(key, b"v")
        assert isinstance(info.value, ValueError)
        with pytest.raises(wal.ArgumentError):
            store.delete(key)
        assert store.watermarks.written == 0


def test_a_key_of_exactly_511_bytes_is_accepted(tmp_path: Path) -> None:
    key = b"k" * MAX_KEY_BYTES
    assert MAX_KEY_BYTES == 511
    with wal.open(tmp_path) as store:
        store.put(key, b"v")
        assert store.get(key) == b"v"
    with wal.open(tmp_path) as store:
        assert store.get(key) == b"v"
        assert list(store.scan(b"kkk")) == [(key, b"v")]


@pytest.mark.parametrize("key", [b"k" * 512, "é" * 256])  # "é" is 2 bytes in UTF-8
def test_a_key_over_511_bytes_raises_record_too_large_and_writes_nothing(
        tmp_path: Path, key: bytes | str) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"a", b"1")
        before = store.watermarks.written
        with pytest.raises(wal.RecordTooLargeError, match="511"):
            store.put(key, b"v")
        with pytest.raises(wal.RecordTooLargeError), store.transaction() as tx:
            tx.put(b"fine", b"v")
            tx.put(key, b"v")
        assert store.watermarks.written == before
        assert store.get(b"fine") is None


def test_a_value_at_the_limit_is_accepted_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        big = b"x" * MAX_VALUE_BYTES
        lsn = store.put(b"k" * MAX_KEY_BYTES, big)
        before = store.watermarks.written
        assert before == lsn
        with pytest.raises(wal.RecordTooLargeError) as info:
            store.put(b"k2", big + b"x")
        assert isinstance(info.value, wal.ArgumentError)
        assert store.watermarks.written == before
        assert store.get(b"k2") is None
        assert store.get(b"k" * MAX_KEY_BYTES) == big


def test_a_transaction_too_large_as_a_whole_is_refused_at_commit_and_writes_nothing(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"a", b"1")
        before = store.watermarks.written
        half = b"y" * (MAX_VALUE_BYTES // 2 + 4096)  # two of them exceed one record
        with pytest.raises(wal.RecordTooLargeError), store.transaction() as tx:
            tx.put(b"x1", half)
            tx.put(b"x2", half)
        assert tx.lsn is None
        assert store.watermarks.written == before
        assert store.get(b"x1") is None and store.get(b"x2") is None


# ---- transactions -------------------------------------------------------------------------


def test_a_transaction_commits_all_its_writes_as_one_record_with_one_lsn(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"old", b"x")
        with store.transaction() as tx:
            tx.put(b"a", b"1")
            tx.put("b", b"2")
            tx.delete(b"old")
        assert tx.lsn == 2
        assert store.watermarks.written == 2  # one log record
        assert store.get(b"a") == b"1" and store.get(b"b") == b"2" and store.get(b"old") is None
        assert store.version(b"a") == store.version(b"b") == tx.lsn
        assert tx.deduplicated is False


def test_an_exception_inside_the_transaction_aborts_it_and_nothing_is_written(tmp_path: Path) -> None:
    class BoomError(Exception):
        pass

    with wal.open(tmp_path) as store:
        store.put(b"a", b"before")
        before = store.watermarks.written
        with pytest.raises(BoomError), store.transaction() as tx:
            tx.put(b"a", b"after")
            tx.put(b"b", b"new")
            raise BoomError
        assert tx.lsn is None
        assert store.watermarks.written == before
        assert store.get(b"a") == b"before"
        assert store.get(b"b") is None
    with wal.open(tmp_path) as store:
        assert store.get(b"a") == b"before" and store.get(b"b") is None


def test_tx_get_sees_the_transactions_own_writes_and_deletes_before_commit(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"stored", b"s")
        store.put(b"doomed", b"d")
        with store.transaction() as tx:
            assert tx.get(b"stored") == b"s"
            assert tx.get(b"new") is None
            tx.put(b"new", b"n")
            tx.put(b"stored", b"s2")
            tx.delete(b"doomed")
            assert tx.get(b"new") == b"n"
            assert tx.get("stored") == b"s2"
            assert tx.get(b"doomed") is None
            assert tx.get(b"doomed", b"gone") == b"gone"
            assert store.get(b"new") is None  # not visible outside before commit
            assert store.get(b"stored") == b"s"
        assert store.get(b"new") == b"n" and store.get(b"stored") == b"s2" and store.get(b"doomed") is None


def test_the_last_write_to_a_key_in_a_transaction_wins(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        with store.transaction() as tx:
            tx.put(b"k", b"1")
            tx.delete(b"k")
            tx.put(b"j", b"1")
            tx.put(b"j", b"2")
        assert store.get(b"k") is None and store.get(b"j") == b"2"
    with wal.open(tmp_path) as store:
        assert store.get(b"k") is None and store.get(b"j") == b"2"


def test_an_empty_transaction_writes_nothing_and_has_no_lsn(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store, store.transaction() as tx:
        pass
    assert tx.lsn is None


def test_a_transaction_cannot_be_used_after_its_block(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        with store.transaction() as tx:
            tx.put(b"a", b"1")
        with pytest.raises(wal.ClosedError):
            tx.put(b"b", b"2")
        assert store.get(b"b") is None


# ---- if_version -----------------------------------------------------------------------------


def test_if_version_equal_to_the_current_version_commits(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        v1 = store.put(b"k", b"1")
        with store.transaction() as tx:
            tx.put(b"k", b"2", if_version=v1)
        assert store.get(b"k") == b"2" and store.version(b"k") == tx.lsn
        with store.transaction() as tx2:
            tx2.delete(b"k", if_version=tx.lsn)
        assert store.get(b"k") is None


def test_if_version_mismatch_raises_conflict_naming_key_expected_and_actual(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        v1 = store.put(b"agent/7", b"1")
        v2 = store.put(b"agent/7", b"2")
        before = store.watermarks.written
        with pytest.raises(wal.ConflictError) as info, store.transaction() as tx:
            tx.put(b"agent/7", b"3", if_version=v1)
        err = info.value
        assert err.key == b"agent/7"
        assert err.expected == v1
        assert err.actual == v2
        message = str(err)
        assert "agent/7" in message and str(v1) in message and str(v2) in message
        assert tx.lsn is None
        assert store.watermarks.written == before
        assert store.get(b"agent/7") == b"2"


def test_if_version_zero_means_the_key_must_be_absent(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        with store.transaction() as tx:
            tx.put(b"k", b"created", if_version=0)
        assert store.get(b"k") == b"created"
        with pytest.raises(wal.ConflictError) as info, store.transaction() as tx2:
            tx2.put(b"k", b"again", if_version=0)
        assert info.value.expected == 0
        assert info.value.actual == tx.lsn
        assert store.get(b"k") == b"created"


def test_a_deleted_key_counts_as_absent_for_if_version(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        v = store.put(b"k", b"1")
        store.delete(b"k")
        with pytest.raises(wal.ConflictError) as info, store.transaction() as tx:
            tx.put(b"k", b"2", if_version=v)
        assert info.value.actual is None
        assert "absent" in str(info.value)
        with store.transaction() as tx:
            tx.put(b"k", b"2", if_version=0)
        assert store.get(b"k") == b"2"


def test_one_failed_check_aborts_the_whole_transaction(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        va = store.put(b"a", b"1")
        store.put(b"b", b"1")
        before = store.watermarks.written
        with pytest.raises(wal.ConflictError), store.transaction() as tx:
            tx.put(b"a", b"2", if_version=va)  # would pass
            tx.put(b"b", b"2", if_version=va)  # fails: b has another version
            tx.put(b"c", b"2")
        assert store.watermarks.written == before
        assert (store.get(b"a"), store.get(b"b"), store.get(b"c")) == (b"1", b"1", None)


def test_if_version_sees_commits_not_yet_applied_to_lmdb(tmp_path: Path) -> None:
    with wal.open(tmp_path, apply_interval_ms=NO_APPLY) as store:
        v = store.put(b"k", b"1")
        assert store.watermarks.applied < v
        with pytest.raises(wal.ConflictError), store.transaction() as tx:
            tx.put(b"k", b"x", if_version=0)
        with store.transaction() as tx:
            tx.put(b"k", b"2", if_version=v)
        assert store.get(b"k") == b"2"


def test_if_version_checks_survive_reopen(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        v = store.put(b"k", b"1")
    with wal.open(tmp_path) as store:
        assert store.version(b"k") == v
        with store.transaction() as tx:
            tx.put(b"k", b"2", if_version=v)
        assert store.get(b"k") == b"2"


@pytest.mark.parametrize("bad", [-1, 1.0, "3", True])
def test_a_bad_if_version_is_an_argument_error(tmp_path: Path, bad: object) -> None:
    with wal.open(tmp_path) as store, pytest.raises(wal.ArgumentError), store.transaction() as tx:
        tx.put(b"k", b"v", if_version=bad)  # type: ignore[arg-type]


def test_of_many_threads_racing_on_one_version_exactly_one_wins(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        v = store.put(b"counter", b"0")
        barrier = threading.Barrier(8)
        results: list[str] = []

        def worker(n: int) -> None:
            barrier.wait()
            try:
                with store.transaction() as tx:
                    tx.put(b"counter", str(n).encode(), if_version=v)
                results.append("won")
            except wal.ConflictError:
                results.append("conflict")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == ["conflict"] * 7 + ["won"]
        assert store.watermarks.written == v + 1


# ---- idempotency keys ---------------------------------------------------------------------------


def test_a_second_commit_with_the_same_idempotency_key_returns_the_first_lsn_and_applies_nothing(
        tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        with store.transaction(idempotency_key=b"step-1") as first:
            first.put(b"k", b"first")
        assert first.deduplicated is False
        before = store.watermarks.written
        with store.transaction(idempotency_key=b"step-1") as again:
            again.put(b"k", b"second")
            again.put(b"other", b"x")
        assert again.lsn == first.lsn
        assert again.deduplicated is True
        assert store.watermarks.written == before
        assert store.get(b"k") == b"first"
        assert store.get(b"other") is None
        assert store.stats()["idempotent_hits"] == 1


def test_a_transaction_used_without_with_says_so_and_writes_nothing(tmp_path: Path) -> None:
    """tx = store.transaction(); tx.put(...) without `with` was taken, and nothing was ever
    committed, without a word. (A sealed store's: test_crypto_store.py.)"""
    with wal.open(tmp_path) as store:
        for tx in (store.transaction(), store.atransaction()):
            for name, args in (("put", ("k", b"v")), ("delete", ("k",)), ("get", ("k",)), ("version", ("k",))):
                with pytest.raises(wal.ClosedError, match="used inside `with"):
                    getattr(tx, name)(*args)
        assert store.get("k") is None and store.watermarks.written == 0

        async def in_async_with() -> int | None:
            async with store.atransaction() as atx:
                atx.put("k", b"v")
            return atx.lsn

        assert asyncio.run(in_async_with()) == 1 and store.get("k") == b"v"


def test_a_bad_idempotency_key_is_refused_naming_it_not_a_key(tmp_path: Path) -> None:
    """A 600-byte idempotency key was refused as "key of 600 bytes ... key limit", read as the key
    of a put; every error of one names the idempotency key now."""
    with wal.open(tmp_path) as store:
        with pytest.raises(wal.RecordTooLargeError, match=r"^idempotency key of 600 bytes is over the 511-byte"):
            store.transaction(idempotency_key=b"x" * 600)
        with pytest.raises(wal.ArgumentError, match=r"^an idempotency key must not be empty"):
            store.transaction(idempotency_key="")
        with pytest.raises(wal.ArgumentTypeError, match=r"^an idempotency key must be bytes or str"):
            store.transaction(idempotency_key=5)  # type: ignore[arg-type]
        with store.transaction(idempotency_key="i" * 511) as tx:  # the limit itself is taken
            tx.put("k", b"v")
        with pytest.raises(wal.RecordTooLargeError, match=r"^key of 600 bytes is over the 511-byte key limit"):
            store.put(b"k" * 600, b"v")


def test_idempotency_keys_are_remembered_across_checkpoint_and_reopen(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        with store.transaction(idempotency_key="job-42") as tx:
            tx.put(b"k", b"first")
        store.checkpoint()
        first = tx.lsn
    with wal.open(tmp_path) as store:
        written = store.watermarks.written
        with store.transaction(idempotency_key=b"job-42") as tx:
            tx.put(b"k", b"second")
        assert (tx.lsn, tx.deduplicated) == (first, True)
        assert store.watermarks.written == written
        assert store.get(b"k") == b"first"


def test_an_idempotency_key_of_an_unapplied_commit_is_remembered_after_a_reopen_replays_it(
        tmp_path: Path) -> None:
    store = wal.open(tmp_path, apply_interval_ms=NO_APPLY)
    with store.transaction(idempotency_key=b"once") as tx:
        tx.put(b"k", b"first")
    assert store.watermarks.applied < tx.lsn
    with store.transaction(idempotency_key=b"once") as dup:
        dup.put(b"k", b"second")
    assert (dup.lsn, dup.deduplicated) == (tx.lsn, True)
    store.close()
    with wal.open(tmp_path) as store, store.transaction(idempotency_key=b"once") as again:
        again.put(b"k", b"third")
    assert (again.lsn, again.deduplicated) == (tx.lsn, True)


def test_an_idempotency_key_is_forgotten_after_its_ttl(tmp_path: Path) -> None:
    with wal.open(tmp_path, idempotency_ttl_s=0.2) as store:
        with store.transaction(idempotency_key=b"k1") as tx:
            tx.put(b"k", b"first")
        time.sleep(0.4)
        store.checkpoint()  # expires old keys from LMDB
        with store.transaction(idempotency_key=b"k1") as again:
            again.put(b"k", b"second")
        assert again.deduplicated is False
        assert again.lsn is not None and again.lsn > tx.lsn  # type: ignore[operator]
        assert store.get(b"k") == b"second"


def test_a_close_forgets_idempotency_keys_past_their_ttl_as_a_checkpoint_does(tmp_path: Path) -> None:
    """A store used in short sessions kept every key (only the checkpoints of an open store
    expired them), and shipped them all in each archive snapshot."""
    import lmdb  # noqa: PLC0415

    for i in range(3):
        with wal.open(tmp_path, idempotency_ttl_s=1) as store, store.transaction(idempotency_key=f"s{i}") as tx:
            tx.put(b"k", b"v%d" % i)
        time.sleep(1.1)
    env = lmdb.open(str(tmp_path / "state"), readonly=True, max_dbs=4, lock=False)
    try:
        with env.begin() as txn:
            held = [key for key, _ in txn.cursor(db=env.open_db(b"idem", txn=txn, create=False))]
    finally:
        env.close()
    assert held == [b"s2"]  # the last session's key was not yet expired at its close


def test_an_aborted_or_conflicting_transaction_does_not_use_up_its_idempotency_key(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        v = store.put(b"k", b"0")
        with pytest.raises(RuntimeError), store.transaction(idempotency_key=b"i") as tx:
            tx.put(b"k", b"aborted")
            raise RuntimeError
        with pytest.raises(wal.ConflictError), store.transaction(idempotency_key=b"i") as tx:
            tx.put(b"k", b"conflict", if_version=v + 100)
        with store.transaction(idempotency_key=b"i") as tx:
            tx.put(b"k", b"committed")
        assert tx.deduplicated is False
        assert store.get(b"k") == b"committed"


def test_different_idempotency_keys_commit_independently(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        with store.transaction(idempotency_key=b"a") as ta:
            ta.put(b"x", b"1")
        with store.transaction(idempotency_key=b"b") as tb:
            tb.put(b"x", b"2")
        assert not tb.deduplicated and tb.lsn != ta.lsn
        assert store.get(b"x") == b"2"


# ---- durability levels ----------------------------------------------------------------------------


def test_a_sync_transaction_in_an_interval_store_is_durable_when_it_returns(tmp_path: Path) -> None:
    with wal.open(tmp_path, durability="interval", rpo_ms=60_000) as store:
        for _ in range(3):
            store.put(b"chatter", b"x")
            with store.transaction(durability="sync") as tx:
                tx.put(b"critical", b"state transition")
            assert tx.lsn is not None
            assert store.watermarks.durable >= tx.lsn
        lsn = store.put(b"also", b"critical", durability="sync")
        assert store.watermarks.durable >= lsn


def test_puts_at_interval_from_many_threads_each_return_once_written_to_the_os(tmp_path: Path) -> None:
    """A put at interval writes its record itself, GIL held, when it can at once, and otherwise
    waits with the GIL released (native/logcall.h): either way it is in the OS when it returns."""
    threads, per_thread = 16, 300
    late: list[int] = []
    with wal.open(tmp_path, durability="interval", rpo_ms=60_000) as store:
        barrier = threading.Barrier(threads)

        def body(t: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                lsn = store.put(b"t%02d-%04d" % (t, i), b"v%d" % i)
                if store.watermarks.written < lsn:
                    late.append(lsn)

        workers = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert late == []
        with wal.Log.open(tmp_path / "log", readonly=True) as files:  # what a process kill leaves
            assert [lsn for lsn, _ in files.read()] == list(range(1, threads * per_thread + 1))
        assert len(list(store.scan())) == threads * per_thread


def test_a_sync_transaction_in_a_buffered_store_is_durable_when_it_returns(tmp_path: Path) -> None:
    with wal.open(tmp_path, durability="buffered", rpo_ms=60_000) as store:
        store.put(b"chatter", b"x")
        with store.transaction(durability="sync") as tx:
            tx.put(b"critical", b"v")
        assert store.watermarks.durable >= tx.lsn  # type: ignore[operator]
        with store.transaction(durability="interval") as tx2:
            tx2.put(b"written", b"v")
        assert store.watermarks.written >= tx2.lsn  # type: ignore[operator]


@pytest.mark.parametrize(("level", "rpo_ms", "weaker"), [
    ("sync", None, "interval"), ("sync", None, "buffered"), ("interval", 100, "buffered"),
])
def test_asking_a_weaker_level_than_the_stores_raises_argument_error(
        tmp_path: Path, level: str, rpo_ms: int | None, weaker: str) -> None:
    with wal.open(tmp_path, durability=level, rpo_ms=rpo_ms) as store:
        with pytest.raises(wal.ArgumentError, match="weaker"):
            store.transaction(durability=weaker)
        with pytest.raises(wal.ArgumentError):
            store.put(b"k", b"v", durability=weaker)
        with pytest.raises(wal.ArgumentError):
            store.delete(b"k", durability=weaker)
        assert store.watermarks.written == 0


def test_an_unknown_durability_level_is_an_argument_error(tmp_path: Path) -> None:
    with pytest.raises(wal.ArgumentError):
        wal.open(tmp_path, durability="fast")
    with wal.open(tmp_path) as store, pytest.raises(wal.ArgumentError):
        store.transaction(durability="fast")


def test_rpo_ms_zero_means_sync_and_rpo_ms_alone_means_interval(tmp_path: Path) -> None:
    with wal.open(tmp_path / "a", rpo_ms=0) as store:
        assert store.stats()["durability"] == "sync"
    with wal.open(tmp_path / "b", rpo_ms=250) as store:
        stats = store.stats()
        assert (stats["durability"], stats["rpo_ms"]) == ("interval", 250)
    with pytest.raises(wal.ArgumentError):
        wal.open(tmp_path / "c", durability="sync", rpo_ms=100)


@pytest.mark.parametrize(("level", "rpo_ms"), LEVELS)
def test_watermarks_are_ordered_applied_le_durable_le_written(
        tmp_path: Path, level: str, rpo_ms: int | None) -> None:
    with wal.open(tmp_path, durability=level, rpo_ms=rpo_ms) as store:
        for i in range(300):
            store.put(b"k%d" % (i % 17), b"v")
            marks = store.watermarks
            assert marks.applied <= marks.durable <= marks.written
        store.checkpoint()
        marks = store.watermarks
        assert marks.applied == marks.durable == marks.written == 300


@pytest.mark.parametrize(("level", "rpo_ms"), LEVELS)
def test_reads_see_your_own_acknowledged_writes_before_they_reach_lmdb(
        tmp_path: Path, level: str, rpo_ms: int | None) -> None:
    with wal.open(tmp_path, durability=level, rpo_ms=rpo_ms, apply_interval_ms=NO_APPLY) as store:
        for i in range(20):
            lsn = store.put(f"k{i:02d}", b"v%d" % i)
            assert store.get(f"k{i:02d}") == b"v%d" % i
            assert store.version(f"k{i:02d}") == lsn
        store.delete("k05")
        assert store.get("k05") is None
        assert store.watermarks.applied == 0  # nothing applied: every read above came from memory
        assert [k for k, _ in store.scan()] == [f"k{i:02d}".encode() for i in range(20) if i != 5]


@pytest.mark.parametrize(("level", "rpo_ms"), LEVELS)
def test_reads_see_your_writes_at_each_level_while_lmdb_lags(
        tmp_path: Path, level: str, rpo_ms: int | None) -> None:
    with wal.open(tmp_path, durability=level, rpo_ms=rpo_ms) as store:
        lagging = 0
        for i in range(200):
            lsn = store.put(b"k", b"%d" % i)
            lagging += store.watermarks.applied < lsn
            assert store.get(b"k") == b"%d" % i
            assert store.version(b"k") == lsn
        assert lagging > 0  # some reads really were served while LMDB was behind


# ---- stats ------------------------------------------------------------------------------------


def test_stats_report_commits_fsyncs_group_sizes_recovery_and_applied_lsn(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        for i in range(10):
            store.put(b"k%d" % i, b"v")
        stats = store.stats()
        for key in ("commits", "fsyncs", "group_size_mean", "recovery_seconds", "records_replayed",
                    "applied_lsn"):
            assert key in stats, key
        assert stats["commits"] == 10
        assert stats["fsyncs"] >= 1
        assert stats["group_size_mean"] >= 1.0
        assert stats["records_replayed"] == 0
        assert stats["recovery_seconds"] >= 0
        store.checkpoint()
        assert store.stats()["applied_lsn"] == store.watermarks.applied == 10


def test_stats_after_reopen_report_the_records_replayed(tmp_path: Path) -> None:
    store = wal.open(tmp_path, apply_interval_ms=NO_APPLY)
    fill(store, 5, size=10)
    store.close()  # applies everything: nothing left to replay
    with wal.open(tmp_path) as store:
        assert store.stats()["records_replayed"] == 0
        assert store.stats()["applied_lsn"] == 5


# ---- checkpoints ------------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "rpo_ms"), LEVELS)
def test_checkpoint_returns_the_applied_lsn_covering_every_acknowledged_commit(
        tmp_path: Path, level: str, rpo_ms: int | None) -> None:
    with wal.open(tmp_path, durability=level, rpo_ms=rpo_ms, apply_interval_ms=NO_APPLY) as store:
        last = fill(store, 50, size=10)
        assert store.checkpoint() == last
        assert store.watermarks.applied == last


def test_checkpoint_removes_segments_wholly_below_the_applied_lsn(tmp_path: Path) -> None:
    with wal.open(tmp_path, segment_bytes=65536, apply_interval_ms=NO_APPLY) as store:
        fill(store, 600)  # ~600 KB: about 10 segments
        before = wal_files(tmp_path)
        assert len(before) >= 5
        store.checkpoint()
        after = wal_files(tmp_path)
        assert len(after) <= 2
        assert set(after) <= set(before) | {after[-1]}
        assert not (tmp_path / "archive").exists()
    with wal.open(tmp_path) as store:
        assert sum(1 for _ in store.scan()) == 600
        assert store.get("k000000") == bytes([0]) * 1000
        assert store.put(b"next", b"v") == 601


def test_checkpoint_with_archive_moves_old_segments_to_the_archive_folder(tmp_path: Path) -> None:
    with wal.open(tmp_path, segment_bytes=65536, archive=True, apply_interval_ms=NO_APPLY) as store:
        fill(store, 600)
        before = wal_files(tmp_path)
        store.checkpoint()
        after = wal_files(tmp_path)
        archived = sorted(p.name for p in (tmp_path / "archive").glob("*.wal"))
        assert len(archived) >= 4
        assert sorted(archived + after) == sorted(set(before) | set(after))
        assert not set(archived) & set(after)
    with wal.open(tmp_path) as store:
        assert sum(1 for _ in store.scan()) == 600


def test_checkpoint_with_an_archive_path_moves_segments_there(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    with wal.open(tmp_path / "s", segment_bytes=65536, archive=str(elsewhere),
                  apply_interval_ms=NO_APPLY) as store:
        fill(store, 400)
        store.checkpoint()
    assert len(list(elsewhere.glob("*.wal"))) >= 3


def test_automatic_checkpoints_keep_the_log_bounded_without_explicit_checkpoints(tmp_path: Path) -> None:
    with wal.open(tmp_path, segment_bytes=65536, checkpoint_bytes=65536) as store:
        fill(store, 2000)  # ~2 MB of log
        deadline = time.monotonic() + 30
        while len(wal_files(tmp_path)) > 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(wal_files(tmp_path)) <= 4
        assert store.stats()["auto_checkpoints"] >= 1
    with wal.open(tmp_path) as store:
        assert sum(1 for _ in store.scan()) == 2000


def test_a_load_that_stops_right_after_a_checkpoint_taken_with_a_long_queue_leaves_a_bounded_log(
        tmp_path: Path) -> None:
    """A checkpoint taken while many commits wait to be applied keeps their segments; once the
    load stops and they are applied, a checkpoint must let them go without another write.
    The materializer is held back (the apply lock, which it takes per batch) while 3 MB are
    committed, as a starved low-priority materializer is on a busy machine. Values of 3 KB
    (overflow pages) free few pages, so no checkpoint falls due for space: only the log's
    own bound can release the segments."""
    with wal.open(tmp_path, segment_bytes=65536, checkpoint_bytes=256 << 10) as store:
        fill(store, 200, size=3000)
        deadline = time.monotonic() + 30
        while store.stats()["auto_checkpoints"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.stats()["auto_checkpoints"] >= 1
        with store._apply_lock:
            last = fill(store, 1000, size=3000, prefix="m")
        deadline = time.monotonic() + 30
        bound = (256 << 10) // 65536 + 2  # one checkpoint's bound of segments, the open one, one partial
        while ((store.stats()["applied_lsn"] < last or len(wal_files(tmp_path)) > bound)
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert store.stats()["applied_lsn"] == last
        assert len(wal_files(tmp_path)) <= bound
    with wal.open(tmp_path) as store:
        assert sum(1 for _ in store.scan()) == 1200


def test_automatic_checkpoints_bound_the_records_replayed_after_a_kill(tmp_path: Path) -> None:
    """A writer SIGKILLed after ~2 MB: the next open replays about one checkpoint's worth of
    records, not the whole log, and keeps only a few segments (counts, not times)."""
    count, size = 2000, 1000
    proc = subprocess.Popen([sys.executable, str(HELPERS / "bulk_writer.py"), str(tmp_path), str(count), str(size)],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("done "), line
        last = int(line.split()[1])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert last == count
    segments_left = len(wal_files(tmp_path))
    per_record = size + 40  # value + key + record and frame headers, roughly
    bound = 65536 // per_record + 65536 // per_record + 16  # one checkpoint + one segment of records
    with wal.open(tmp_path) as store:
        replayed = store.stats()["records_replayed"]
        assert replayed <= bound, f"replayed {replayed} records of {count}"
        assert segments_left <= 4
        assert sum(1 for _ in store.scan()) == count
        assert store.get(f"k{count - 1:06d}") == bytes([(count - 1) % 251]) * size


# ---- closing --------------------------------------------------------------------------------------


def test_every_operation_on_a_closed_store_raises_closed_error(tmp_path: Path) -> None:
    store = wal.open(tmp_path)
    store.put(b"k", b"v")
    store.close()
    calls = [
        lambda: store.put(b"k", b"v"),
        lambda: store.delete(b"k"),
        lambda: store.get(b"k"),
        lambda: store.version(b"k"),
        lambda: list(store.scan()),
        store.transaction,
        store.checkpoint,
        lambda: store.watermarks,
        store.stats,
    ]
    for call in calls:
        with pytest.raises(wal.ClosedError):
            call()


def test_a_scan_iterated_after_close_raises_closed_error(tmp_path: Path) -> None:
    store = wal.open(tmp_path)
    for i in range(1200):  # more than one LMDB read chunk
        store.put(b"k%04d" % i, b"v")
    store.checkpoint()
    started, unstarted = store.scan(), store.scan()
    assert next(started) == (b"k0000", b"v")
    store.close()
    with pytest.raises(wal.ClosedError):
        list(started)
    with pytest.raises(wal.ClosedError):
        list(unstarted)


def test_close_is_idempotent_and_the_context_manager_closes(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
    with pytest.raises(wal.ClosedError):
        store.get(b"k")
    store.close()
    store.close()
    with wal.open(tmp_path) as again:  # the directory was released
        assert again.get(b"k") == b"v"


def test_close_applies_every_acknowledged_commit_at_every_level(tmp_path: Path) -> None:
    for level, rpo_ms in LEVELS:
        path = tmp_path / level
        with wal.open(path, durability=level, rpo_ms=rpo_ms, apply_interval_ms=NO_APPLY) as store:
            last = fill(store, 30, size=10)
        with wal.open(path) as store:
            assert store.stats()["records_replayed"] == 0
            assert store.watermarks.applied == last
            assert sum(1 for _ in store.scan()) == 30


# ---- read-only stores ----------------------------------------------------------------------------


def test_a_read_only_store_reads_the_state_and_refuses_every_write(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"a", b"1")
        lsn = store.put(b"b", b"2")
    with wal.open(tmp_path, readonly=True) as ro:
        assert ro.get(b"a") == b"1"
        assert ro.version(b"b") == lsn
        assert list(ro.scan()) == [(b"a", b"1"), (b"b", b"2")]
        assert ro.watermarks.applied == lsn
        with pytest.raises(wal.ReadOnlyError):
            ro.put(b"c", b"3")
        with pytest.raises(wal.ReadOnlyError):
            ro.delete(b"a")
        with pytest.raises(wal.ReadOnlyError):
            ro.transaction()
        with pytest.raises(wal.ReadOnlyError):
            ro.checkpoint()
    with wal.open(tmp_path) as store:
        assert store.get(b"c") is None and store.watermarks.written == lsn


def test_a_read_only_open_beside_a_writer_in_the_same_process_is_a_clear_locked_error(tmp_path: Path) -> None:
    """LMDB allows one handle per environment and process: read-only openers belong in other
    processes (test_store_processes); in the writer's own process the error says so."""
    with wal.open(tmp_path) as store:
        store.put(b"a", b"1")
        with pytest.raises(wal.LockedError, match="already open in this process"):
            wal.open(tmp_path, readonly=True)
        assert store.put(b"b", b"2") == 2
        assert store.get(b"a") == b"1"
    with wal.open(tmp_path, readonly=True) as ro:
        assert ro.get(b"b") == b"2"


def test_opening_a_missing_store_read_only_fails_without_creating_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        wal.open(tmp_path / "nothing", readonly=True)
    assert not (tmp_path / "nothing").exists()


# ---- on-disk format version ----------------------------------------------------------------------


def test_a_new_store_has_a_store_file_naming_format_version_6(tmp_path: Path) -> None:
    wal.open(tmp_path).close()
    meta = json.loads((tmp_path / "STORE").read_text())
    assert meta == {"format": "agentwal-store", "version": 6} and STORE_VERSION == 6
    assert {p.name for p in tmp_path.iterdir()} >= {"STORE", "log", "state"}
    assert (tmp_path / "state" / "checkpoint.meta").is_file()


@pytest.mark.parametrize("readonly", [False, True])
def test_a_store_of_a_newer_format_version_raises_format_version_error(tmp_path: Path, readonly: bool) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
    meta = json.loads((tmp_path / "STORE").read_text())
    meta["version"] = STORE_VERSION + 1
    (tmp_path / "STORE").write_text(json.dumps(meta))
    with pytest.raises(wal.FormatVersionError, match=f"version {STORE_VERSION + 1}"):
        wal.open(tmp_path, readonly=readonly)
    meta["version"] = STORE_VERSION
    (tmp_path / "STORE").write_text(json.dumps(meta))
    with wal.open(tmp_path) as store:  # the failed open left it intact and unlocked
        assert store.get(b"k") == b"v"


def _as_format_1(path: Path) -> None:
    """What format 1 left on disk: the same log and LMDB files (its LMDB synced at every commit,
    as a clean close of format 2 leaves it too), no checkpoint.meta, and STORE saying 1."""
    strip_entry_checksums(path)
    (path / "state" / "checkpoint.meta").unlink()
    (path / "STORE").write_text(json.dumps({"format": "agentwal-store", "version": 1}) + "\n")


def test_a_format_1_store_is_read_and_upgraded_by_its_first_writable_open(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        for i in range(50):
            store.put(f"k{i}", b"v%d" % i)
    _as_format_1(tmp_path)
    with wal.open(tmp_path, readonly=True) as reader:  # read as it is, nothing written
        assert reader.get("k7") == b"v7"
    assert json.loads((tmp_path / "STORE").read_text())["version"] == 1
    assert not (tmp_path / "state" / "checkpoint.meta").exists()
    with wal.open(tmp_path) as store:
        assert [store.get(f"k{i}") for i in range(50)] == [b"v%d" % i for i in range(50)]
        store.put("after", b"upgrade")
    assert json.loads((tmp_path / "STORE").read_text())["version"] == STORE_VERSION
    assert (tmp_path / "state" / "checkpoint.meta").is_file()
    with wal.open(tmp_path) as store:
        assert store.get("after") == b"upgrade" and store.get("k49") == b"v49"


def test_an_older_store_is_upgraded_only_by_the_open_that_gets_its_writer_lock(tmp_path: Path) -> None:
    """A writer of the older version may still be running: the open that finds the lock taken
    must leave STORE as that writer expects it (else its next open would refuse its own store)."""
    with wal.open(tmp_path) as running:
        (tmp_path / "STORE").write_text(json.dumps({"format": "agentwal-store", "version": 2}) + "\n")
        with pytest.raises(wal.LockedError):
            wal.open(tmp_path)
        assert json.loads((tmp_path / "STORE").read_text())["version"] == 2
        running.put(b"k", b"v")
    with wal.open(tmp_path) as store:
        assert store.get(b"k") == b"v"
    assert json.loads((tmp_path / "STORE").read_text())["version"] == STORE_VERSION


def test_opening_a_newer_store_touches_nothing_in_it(tmp_path: Path) -> None:
    """A newer store may lay out its log differently: refuse before recovering (or creating)
    anything in it."""
    (tmp_path / "STORE").write_text(json.dumps({"format": "agentwal-store", "version": STORE_VERSION + 1}))
    (tmp_path / "log").mkdir()
    junk = b"\x00" * 100 + b"not a v1 segment"
    (tmp_path / "log" / "0000000000000001.wal").write_bytes(junk)
    with pytest.raises(wal.FormatVersionError):
        wal.open(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["STORE", "log"]
    assert [p.name for p in (tmp_path / "log").iterdir()] == ["0000000000000001.wal"]
    assert (tmp_path / "log" / "0000000000000001.wal").read_bytes() == junk


def test_a_directory_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "STORE").write_text(json.dumps({"format": "something-else", "version": 1}))
    with pytest.raises(wal.CorruptionError):
        wal.open(tmp_path)


# ---- configuration ----------------------------------------------------------------------------------


def test_bad_configuration_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    with pytest.raises(wal.ArgumentError):
        wal.open(tmp_path / "a", checkpoint_bytes=100)
    with pytest.raises(wal.ArgumentError):
        wal.open(tmp_path / "b", idempotency_ttl_s=0)
    with pytest.raises(wal.ArgumentError):
        wal.open(tmp_path / "c", apply_interval_ms=0)
    with pytest.raises(wal.ArgumentTypeError):
        wal.open(tmp_path / "d", rpo_ms="100")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", [{"idempotency_ttl_s": math.inf}, {"idempotency_ttl_s": math.nan},
                                 {"idempotency_ttl_s": "60"}, {"apply_interval_ms": "20"},
                                 {"apply_interval_ms": math.nan}, {"max_unapplied": "many"},
                                 {"max_unapplied": 0}, {"rpo_ms": 10**12}])
def test_a_bad_number_is_an_argument_error_and_leaves_the_directory_unlocked(tmp_path: Path, bad: dict) -> None:
    """Checked only after the log and the state were open, these raised raw Python errors
    (OverflowError for a TTL of infinity, "remember forever") and left them open: the next open
    of the directory was refused as locked by this very process."""
    with wal.open(tmp_path):
        pass
    with pytest.raises(wal.ArgumentError) as refused:
        wal.open(tmp_path, **bad)
    assert isinstance(refused.value, wal.WalError)
    with wal.open(tmp_path) as store:  # not locked
        store.put("k", b"v")


def test_an_empty_or_odd_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wal.open("") made the current directory a store (an unset variable, say)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(wal.ArgumentError, match="path is empty"):
        wal.open("")
    for odd in (None, 5):
        with pytest.raises(wal.ArgumentTypeError):
            wal.open(odd)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_path_or_archive_url_with_a_nul_byte_is_an_argument_error(tmp_path: Path) -> None:
    """A NUL byte in the store's path, or in a file:// archive's, raised the OS call's raw
    ValueError ("embedded null byte")."""
    with pytest.raises(wal.ArgumentError, match=r"the store's path .* contains a NUL byte"):
        wal.open(f"{tmp_path}/a\0b")
    with pytest.raises(wal.ArgumentError, match="NUL byte"):
        wal.open(tmp_path / "s", archive=f"file://{tmp_path}/a\0b")
    assert list(tmp_path.iterdir()) == []


def test_a_reader_takes_the_writers_archive_options_and_checks_them(tmp_path: Path) -> None:
    """A read-only open given the writer's archive= and options (the same call as the writer's,
    with readonly=True) was refused for the options; they are checked, and unused."""
    url = f"file://{tmp_path}/a"
    with wal.open(tmp_path / "s", archive=url, archive_rpo_ms=1000) as writer:
        writer.put("k", b"v")
    with wal.open(tmp_path / "s", readonly=True, archive=url, archive_rpo_ms=1000) as reader:
        assert reader.get("k") == b"v"
    with pytest.raises(wal.ArgumentError):
        wal.open(tmp_path / "s", readonly=True, archive=url, archive_rpo_ms=0)
    with pytest.raises(wal.ArgumentError):
        wal.open(tmp_path / "s", readonly=True, archive=url, archive_typo=1)


def test_every_error_class_derives_from_wal_error() -> None:
    for cls in (wal.ArgumentError, wal.ArgumentTypeError, wal.ClosedError, wal.ConflictError,
                wal.CorruptionError, wal.FailedError, wal.FormatVersionError, wal.LockedError,
                wal.ReadOnlyError, wal.RecordTooLargeError):
        assert issubclass(cls, wal.WalError)
    assert issubclass(wal.ArgumentError, ValueError)
    assert issubclass(wal.ArgumentTypeError, TypeError)
    assert issubclass(wal.RecordTooLargeError, ValueError)


def test_the_store_lays_out_log_and_state_directories(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put(b"k", b"v")
        assert store.path == os.fspath(tmp_path)
    assert wal_files(tmp_path)
    assert (tmp_path / "state" / "data.mdb").exists()


# ---- concurrency within one process ----------------------------------------------------------------


def test_threads_racing_with_one_idempotency_key_commit_once_and_all_get_its_lsn(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        barrier = threading.Barrier(8)
        results: list[tuple[int | None, bool]] = []

        def worker(n: int) -> None:
            barrier.wait()
            with store.transaction(idempotency_key=b"payment-1") as tx:
                tx.put(b"paid", str(n).encode())
            results.append((tx.lsn, tx.deduplicated))

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 8
        assert len({lsn for lsn, _ in results}) == 1
        assert sorted(dup for _, dup in results) == [False] + [True] * 7
        assert store.watermarks.written == 1


def test_commits_from_many_threads_during_repeated_checkpoints_all_survive(tmp_path: Path) -> None:
    stop = threading.Event()
    checkpoints = 0
    with wal.open(tmp_path, segment_bytes=65536, durability="interval", rpo_ms=20) as store:
        def checkpointer() -> None:
            nonlocal checkpoints
            while not stop.is_set():
                store.checkpoint()
                checkpoints += 1

        def writer(w: int) -> None:
            for i in range(400):
                with store.transaction() as tx:
                    tx.put(f"w{w}/{i:04d}", bytes([i % 251]) * 300)
                    tx.put(f"w{w}/last", str(i).encode())

        background = threading.Thread(target=checkpointer)
        background.start()
        writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        stop.set()
        background.join()
        assert checkpoints >= 2
        store.checkpoint()
        assert len(wal_files(tmp_path)) <= 2  # ~500 KB written, old segments let go
    with wal.open(tmp_path) as store:
        for w in range(4):
            assert store.get(f"w{w}/last") == b"399"
            assert sum(1 for _ in store.scan(f"w{w}/0")) == 400


# ---- fail-stop (I5) -----------------------------------------------------------------------------------


def test_an_fsync_failure_stops_writes_until_reopen_and_reopen_recovers_every_acknowledged_commit(
        tmp_path: Path) -> None:
    store = wal.open(tmp_path)
    acknowledged = store.put(b"a", b"1")
    with failpoint("fsync", errno.EIO), pytest.raises(wal.FailedError):
        store.put(b"b", b"2")
    for write in (lambda: store.put(b"c", b"3"), lambda: store.delete(b"a"), store.transaction):
        with pytest.raises(wal.FailedError, match="reopen"):
            write()
    assert store.get(b"a") == b"1"  # reads keep working
    with pytest.raises(wal.FailedError):
        store.close()  # says the log had stopped; still releases the directory
    with wal.open(tmp_path) as store:
        assert store.get(b"a") == b"1"
        assert store.version(b"a") == acknowledged
        assert store.get(b"c") is None
        store.put(b"d", b"4")
        assert store.get(b"d") == b"4"


def test_one_apply_batch_with_several_writes_of_a_key_leaves_each_keys_last_write(tmp_path: Path) -> None:
    # State.apply collapses a batch to each key's last write before LMDB sees it.
    with wal.open(tmp_path / "s", apply_interval_ms=600_000) as s:
        s.put(b"a", b"1")
        s.delete(b"a")          # put then delete: gone
        s.delete(b"b")
        s.put(b"b", b"2")       # delete then put: there
        for i in range(5):
            s.put(b"c", b"%d" % i)  # last of many
        with s.transaction() as tx:
            tx.put(b"d", b"x")
            tx.delete(b"c")
        last = s.put(b"c", b"final")
    with wal.open(tmp_path / "s", readonly=True) as r:
        assert dict(r.scan()) == {b"b": b"2", b"c": b"final", b"d": b"x"}
        assert r.version(b"c") == last and r.watermarks.applied == last


def _batch(first: int, *puts: bytes) -> list[tuple[int, bytes]]:
    """Consecutive one-put records from LSN `first`, key k<i>, as the log would hand them over."""
    return [(lsn, record.encode_one(record.OP_PUT, b"k%d" % lsn, value, 0)) for lsn, value in enumerate(puts, first)]


def test_state_apply_refuses_a_batch_not_yet_durable_in_the_log_and_changes_nothing(tmp_path: Path) -> None:
    # I1 log before state, enforced in State.apply right before the LMDB commit.
    state = State(str(tmp_path / "state"))
    try:
        assert state.apply(record.collapse(_batch(1, b"a", b"b")), lambda: 2) == 2
        with pytest.raises(InvariantError, match="I1"):
            state.apply(record.collapse(_batch(3, b"c", b"d")), lambda: 3)
        assert state.applied_lsn() == 2 and state.get(b"k3") is None and state.durable_seen() == 2
    finally:
        state.close()


def test_state_apply_refuses_a_gap_and_skips_a_batch_it_already_holds(tmp_path: Path) -> None:
    # I3 no holes (a batch must start right after applied_lsn and hold every LSN up to its last);
    # I4 a batch wholly applied already (a replay after a crash mid-apply) changes nothing.
    state = State(str(tmp_path / "state"))
    try:
        state.apply(record.collapse(_batch(1, b"a", b"b")), lambda: 10)
        with pytest.raises(InvariantError, match="gap"):
            state.apply(record.collapse(_batch(4, b"d")), lambda: 10)  # LSN 3 missing
        first, last, commits, puts, deletes, idem = record.collapse(_batch(3, b"c", b"d", b"e"))
        with pytest.raises(InvariantError, match="gap"):
            state.apply((first, last, commits - 1, puts, deletes, idem), lambda: 10)  # a hole inside
        assert state.apply(record.collapse(_batch(1, b"x", b"y")), lambda: 10) == 2
        assert state.applied_lsn() == 2 and state.get(b"k1") == (1, b"a") and state.get(b"k3") is None
    finally:
        state.close()


def test_the_materializer_applies_at_low_priority_only_while_its_queue_is_short(
        tmp_path: Path, starve_materializer: Callable[[object], Callable[[], None]]) -> None:
    """The materializer runs its LMDB transactions at the lowest CPU priority (so committers
    woken meanwhile run first), in small batches, while at most max_unapplied / 4 commits
    wait, and at normal priority in full batches once a backlog builds, which a starved
    low-priority apply would only let grow."""
    limit = 40_000
    calls: list[tuple[bool, bool, int, int, int]] = []  # (materializer?, background, queue, limit, applied)
    with wal.open(tmp_path / "s", durability="buffered", max_unapplied=limit, apply_interval_ms=10_000_000) as s:
        real = s._apply_ready
        recorded = [0]

        def spy(n: int = 4096, *, background: bool = False) -> int:
            queued = len(s._core)
            applied = real(n, background=background)
            calls.append((threading.current_thread() is s._thread, background, queued, n, applied))
            recorded[0] = s.watermarks.applied  # the calls up to this LSN's apply are in `calls`
            return applied

        s._apply_ready = spy  # type: ignore[method-assign]
        wake = starve_materializer(s)
        for i in range(30_000):  # a backlog: more than a quarter of the limit, not the limit
            s.put(b"k%07d" % i, b"v" * 32)
        end = s.put(b"last", b"v", durability="sync")
        time.sleep(0.2)  # the one pass the starving may have cost is over
        calls.clear()
        wake()  # one wake-up: batches until one is not full, from a queue of ~30,000
        # The whole backlog applied and its calls recorded: a batch of it still running once the
        # trickle begins would be counted in `before` or in the trickle's calls, not in both.
        deadline = time.monotonic() + 10
        while recorded[0] < end and time.monotonic() < deadline:
            time.sleep(0.01)
        backlog = list(calls)
        calls.clear()
        before = s.stats()["background_applies"]
        for i in range(5):  # a trickle: the queue stays short
            last = s.put(b"t%02d" % i, b"v", durability="sync")
            wake()
            time.sleep(0.05)
        # Every trickle commit applied and its call recorded before the calls are read: an apply
        # landing between that read and stats() below would be counted by one and not the other.
        deadline = time.monotonic() + 10
        while recorded[0] < last and time.monotonic() < deadline:
            time.sleep(0.01)
        trickle = list(calls)
        stats = s.stats()
    assert backlog and all(c[0] for c in backlog)
    assert [c[1] for c in backlog] == [c[2] <= limit // 4 for c in backlog]
    assert [c[3] for c in backlog] == [1024 if c[1] else 4096 for c in backlog]
    assert not backlog[0][1] and backlog[0][2] > limit // 4  # the first batches at normal priority
    assert any(c[1] for c in backlog)  # and small ones at the lowest once the queue is short
    assert trickle and all(c[0] and c[1] for c in trickle)
    applied_in_trickle = sum(1 for c in trickle if c[4] > 0)
    assert applied_in_trickle >= 1
    assert stats["background_applies"] - before == applied_in_trickle  # each in the low-priority thread


def test_a_damaged_log_tail_that_the_state_already_holds_is_refused_without_cutting_it(tmp_path: Path) -> None:
    """A cleanly closed store has applied (and checkpointed) every commit; damage to its newest
    segment's last record looks like a torn tail, but cutting it would hand that LSN out again
    to the next commit. The open refuses and changes nothing (Log.open keep_through)."""
    with wal.open(tmp_path) as store:
        for i in range(5):
            last = store.put(f"k{i}", b"v%d" % i)
    seg = sorted((tmp_path / "log").glob("*.wal"))[-1]
    data = bytearray(seg.read_bytes())
    where = data.rfind(b"k4")
    data[where] ^= 0xFF  # inside the payload of the last record: its CRC fails
    seg.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in (tmp_path / "log").iterdir()}
    with pytest.raises(wal.CorruptionError, match=f"would lose LSNs {last}..{last}") as info:
        wal.open(tmp_path)
    assert info.value.reason == "damaged log below the state"
    assert {p.name: p.read_bytes() for p in (tmp_path / "log").iterdir()} == before
    with wal.open(tmp_path, readonly=True) as reader:  # the state itself is whole and readable
        assert reader.get("k4") == b"v4"


def test_wal_open_and_the_store_it_opens_share_one_set_of_defaults() -> None:
    """`wal.open` (wal/_open.py) is the signature users read; `Store._open` (what a follower's
    replica or a restored store is opened with) must default every option the same way."""
    import inspect  # noqa: PLC0415

    from wal.store.store import Store, open_local  # noqa: PLC0415

    public = {n: p.default for n, p in inspect.signature(wal.open).parameters.items()
              if p.kind is inspect.Parameter.KEYWORD_ONLY}
    internal = {n: p.default for n, p in inspect.signature(Store._open).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    # The sealing options (encryption=, compression=, ...) choose the store's class: open_local
    # takes them and hands Store._open the plan made of them.
    sealing = {n: p.default for n, p in inspect.signature(open_local).parameters.items()
               if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert internal.pop("_following") is False  # a follower's own open of its directory (wal/archive/follow.py)
    assert internal.pop("sealing") is None and set(sealing) == {"encryption", "compression", "compression_threshold",
                                                                 "compression_dict"}
    # The object archive's options (None: archive_settings' defaults, wal/archive/store.py).
    archived = {n: public.pop(n) for n in list(public) if n.startswith("archive_")}
    assert set(archived.values()) == {None} and len(archived) == 7
    assert public == {**internal, **sealing}
    assert len(public) >= 11


def test_a_store_in_a_directory_whose_name_is_not_utf8_opens(tmp_path: Path) -> None:
    """The log's path went to C as UTF-8: a directory named by bytes that are not (as
    os.fsdecode gives them) raised a raw UnicodeEncodeError."""
    path = tmp_path / os.fsdecode(b"store-\xff")
    with wal.open(path) as store:
        store.put("k", b"v")
    with wal.open(path) as store:
        assert store.get("k") == b"v"
    assert os.fsencode(path).endswith(b"store-\xff")


def test_a_readers_stats_give_the_writers_level_and_the_checkpoints_real_age(tmp_path: Path) -> None:
    """A read-only opener reported its own unused default level (sync, 0) and the time since it
    opened as `seconds_since_checkpoint`, beside a `last_checkpoint` older than that."""
    reader = ("import json, sys, wal\n"
              "with wal.open(sys.argv[1], readonly=True) as r:\n"
              "    st = r.stats()\n"
              "print(json.dumps([st['durability'], st['rpo_ms'], st['seconds_since_checkpoint']]))")
    with wal.open(tmp_path, durability="interval", rpo_ms=40) as writer:
        writer.put("k", b"v")
        writer.checkpoint()
        time.sleep(0.3)
        out = subprocess.run([sys.executable, "-c", reader, str(tmp_path)], capture_output=True, text=True,
                             timeout=60, check=True).stdout  # a reader is another process (one LMDB handle each)
    level, rpo_ms, since = json.loads(out)
    assert level == "interval" and rpo_ms == 40 and since >= 0.3


def test_a_checkpoint_racing_close_gets_closed_error_and_close_raises_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() takes its last checkpoint and closes the state under the apply lock, and a
    checkpoint() of another thread that gets the lock after that finds the state released:
    ClosedError. Here the other thread is held just before it takes the lock until close's own
    checkpoint has begun, and then in the middle of its checkpoint until the state is closed (or
    for a second): close used to release the state under it (AttributeError), the two
    checkpoints wrote one temporary file (a NotFoundError), and close itself could raise."""
    import wal.store.state as state_mod  # noqa: PLC0415 -- the module whose function is held

    store = wal.open(tmp_path / "s")
    store.put(b"k", b"v")
    closing, closed = threading.Event(), threading.Event()
    checkpointer: list[threading.Thread] = []
    mine = lambda: threading.current_thread() in checkpointer  # noqa: E731
    apply_ready, write, state_checkpoint, state_close = (wal.Store._apply_ready, state_mod._write_checkpoint,
                                                         State.checkpoint, State.close)

    def held_apply(self: wal.Store, *args: Any, **kwargs: Any) -> int:
        n = int(apply_ready(self, *args, **kwargs))
        if mine() and n == 0:
            closing.wait(1.0)  # then on to the apply lock
        return n

    def held_write(path: str, saved: Any) -> None:
        write(path, saved)
        if mine():
            closed.wait(1.0)

    def checkpoint_state(self: State) -> Any:
        if not mine():
            closing.set()
        return state_checkpoint(self)

    def close_state(self: State) -> None:
        state_close(self)
        closed.set()

    monkeypatch.setattr(wal.Store, "_apply_ready", held_apply)
    monkeypatch.setattr(state_mod, "_write_checkpoint", held_write)
    monkeypatch.setattr(State, "checkpoint", checkpoint_state)
    monkeypatch.setattr(State, "close", close_state)
    outcome: list[object] = []

    def checkpoint() -> None:
        try:
            outcome.append(store.checkpoint())
        except Exception as exc:  # the class is what is checked
            outcome.append(exc)

    checkpointer.append(threading.Thread(target=checkpoint))
    checkpointer[0].start()
    time.sleep(0.2)  # the checkpointer waits in held_apply
    store.close()  # raises nothing
    checkpointer[0].join(10)
    assert len(outcome) == 1 and (outcome[0] == 1 or isinstance(outcome[0], wal.ClosedError)), outcome
    with wal.open(tmp_path / "s") as again:
        assert again.get(b"k") == b"v"


def test_an_automatic_checkpoint_a_committer_starts_as_the_store_closes_is_closed_error_not_a_failure(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A committer helping with a backlog takes the checkpoint that falls due after its apply
    (`_checkpoint_if_due`); when close released the state in between, that is ClosedError for
    the committer, never a failure: it was logged as one ("stopped after a failure")."""
    store = wal.open(tmp_path / "s")
    store.put(b"k", b"v")
    store._checkpoint_due = lambda: "log"  # type: ignore[method-assign]  # as when one is due
    store.close()
    with pytest.raises(wal.ClosedError):
        store._checkpoint_if_due()
    assert store._failure is None
    assert not [r for r in caplog.records if "stopped after a failure" in r.getMessage()]


def test_archive_options_are_named_parameters_of_wal_open_checked_before_anything_is_made(tmp_path: Path) -> None:
    # They were **archive_options: a misspelt one type-checked, and was found only at run time.
    # Any other name is refused by a type checker (**unknown: Never) and, at run time, as ArgumentError.
    url = (tmp_path / "archive").as_uri()
    named = set(inspect.signature(wal.open).parameters)
    assert {"archive_rpo_ms", "archive_policy", "archive_snapshot_bytes", "archive_merge_objects",
            "archive_retention_s", "archive_puts_in_flight", "archive_fencing"} <= named
    with pytest.raises(wal.ArgumentError, match=r"unknown option\(s\) of wal.open: archive_rpo"):
        wal.open(tmp_path / "a", archive=url, archive_rpo=5)  # type: ignore[arg-type]
    with pytest.raises(wal.ArgumentError, match="archive_rpo_ms: options of an object archive"):
        wal.open(tmp_path / "b", archive_rpo_ms=5)
    with pytest.raises(wal.ArgumentError, match="archive_rpo_ms must be an int > 0"):
        wal.open(tmp_path / "c", archive=url, archive_rpo_ms=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with wal.open(tmp_path / "d", archive=url, archive_rpo_ms=5000, archive_fencing=True) as store:
        store.put("k", b"v")
        assert store.stats()["archive_rpo_ms"] == 5000


def test_a_one_slash_file_url_is_an_object_archive_not_a_folder_named_file(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # file:/dir (RFC 8089's one-slash form) was taken for a relative folder: a local archive in
    # ./file:/dir, and no object archive at all.
    monkeypatch.chdir(tmp_path)
    url = "file:" + str(tmp_path / "archive")
    with wal.open(tmp_path / "s", archive=url) as store:
        store.put("k", b"v")
    assert not (tmp_path / "file:").exists()
    assert wal.restore(url, tmp_path / "r").lsn == 1
    with pytest.raises(wal.ArgumentError, match="unsupported archive URL 'gs:bucket'"):
        wal.open(tmp_path / "t", archive="gs:bucket")


@pytest.mark.parametrize("options", [{"checkpoint_bytes": 2**64}, {"max_unapplied": 2**63}, {"archive": 5}],
                         ids=["checkpoint_bytes", "max_unapplied", "archive"])
def test_numbers_past_what_the_core_holds_and_archives_of_no_kind_are_refused_before_anything_is_made(
        tmp_path: Path, options: dict[str, Any]) -> None:
    # Each raised a raw OverflowError or TypeError, the first two after the store was made.
    with pytest.raises(wal.WalError, match=next(iter(options))):
        wal.open(tmp_path / "s", **options)
    assert not (tmp_path / "s").exists()


def test_a_path_that_is_a_file_is_refused_as_not_a_directory(tmp_path: Path) -> None:
    # It said "the directory of a follower of the archive ?" (the FOLLOWING check read
    # "not a directory" as a marker it could not parse), or "File exists".
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(wal.ArgumentError, match="is a file, not a directory"):
        wal.open(tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "hello"
