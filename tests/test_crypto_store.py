"""Sealed stores (wal/crypto/, FORMAT.md §19): encryption at rest, compression, keys and rotation.

Every test runs real stores on disk; files are searched byte for byte, and damage is made in
the files or written through the plain store underneath (an attacker with write access who
keeps the CRCs right).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard
from archive_helpers import wait_until
from legacy_state import strip_entry_checksums, strip_idem_checksums

import wal
from wal.agents import AgentStore
from wal.archive import follow as follow_mod
from wal.crypto import sealing
from wal.crypto.sealing import CODEC_ENCRYPTED, CODEC_PLAIN, CODEC_ZSTD, Sealer, key_id
from wal.errors import MissingKeyError, SealDamagedError, WrongKeyError
from wal.store.state import State
from wal.store.store import Store

KEY = bytes(range(32))
KEY2 = bytes(range(1, 33))
KEY3 = bytes(range(2, 34))
SECRET = b"the-patient-said-their-ssn-is-078-05-1120"


def _conversation(i: int) -> bytes:
    turns = [{"role": "user" if t % 2 == 0 else "assistant",
              "content": f"turn {t} of thread {i}: please summarise the quarterly report and {SECRET.decode()}"}
             for t in range(12)]
    return json.dumps({"thread": i, "messages": turns}).encode()


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _raw(store: wal.Store, key: bytes) -> bytes:
    """The envelope the store holds for key (the plain store's read underneath the sealed one)."""
    v = Store.get(store, key)
    assert v is not None
    return v


# ---- round trips -----------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [
    {"encryption": KEY},
    {"compression": "zstd"},
    {"encryption": KEY, "compression": "zstd"},
], ids=["encrypted", "compressed", "both"])
def test_every_read_and_write_path_round_trips_through_the_envelope(tmp_path: Path, options: dict) -> None:
    big = _conversation(1)
    with wal.open(tmp_path, **options) as store:
        store.put(b"a", big)
        store.put("s", b"small")
        assert store.get(b"a") == big and store.get("s") == b"small" and store.get("x", b"d") == b"d"
        assert store.get_many([b"a", "s", "x"], b"-") == [big, b"small", b"-"]
        with store.transaction() as tx:
            tx.put(b"t1", b"one")
            assert tx.get(b"t1") == b"one" and tx.get(b"a") == big
            tx.delete("s")
        assert store.update(b"t1", lambda v: (v or b"") + b"+") == (tx.lsn + 1, b"one+")
        assert asyncio.run(store.aput(b"async", b"v")) > 0
        with store.snapshot() as snap:
            assert snap.get(b"a") == big and snap.get("s") is None and snap.version(b"t1") == tx.lsn + 1
            assert dict(snap.scan()) == {b"a": big, b"t1": b"one+", b"async": b"v"}
        assert list(store.scan(b"t")) == [(b"t1", b"one+")]
        env = _raw(store, b"a")
        assert env != big
        assert env[0] == {frozenset(["encryption"]): CODEC_ENCRYPTED, frozenset(["compression"]): CODEC_ZSTD,
                          frozenset(["encryption", "compression"]): CODEC_ENCRYPTED | CODEC_ZSTD}[frozenset(options)]
    with wal.open(tmp_path, **options) as store:  # the log replayed, the state reopened
        assert dict(store.scan()) == {b"a": big, b"t1": b"one+", b"async": b"v"}
    with wal.open(tmp_path, readonly=True, **options) as ro:
        assert ro.get(b"a") == big


@pytest.mark.parametrize("options", [{"encryption": KEY}, {"compression": "zstd"}], ids=["encrypted", "compressed"])
def test_a_sealed_put_takes_and_refuses_arguments_as_the_plain_store_does(tmp_path: Path, options: dict) -> None:
    """The sealed put takes bytes and str keys as they are and hands the envelope to the C commit;
    every other argument goes through the store's own checks, with the plain store's errors."""
    too_long_key = b"k" * (wal.store.store.MAX_KEY_BYTES + 1)
    too_big_value = bytes(wal.store.store.MAX_VALUE_BYTES + 1)
    calls = [((b"b", b"v"), {}), (("s-\u00e9", b"v"), {}), ((bytearray(b"ba"), bytearray(b"v")), {}),
             ((memoryview(b"mv"), memoryview(b"v")), {}), ((b"d", b"v"), {"durability": "sync"}),
             ((b"", b"v"), {}), ((too_long_key, b"v"), {}), ((1, b"v"), {}), ((b"x", "text"), {}),
             ((b"x", too_big_value), {}), ((b"x", b"v"), {"durability": "nope"})]
    outcomes = []
    for opts, path in ((options, tmp_path / "sealed"), ({}, tmp_path / "plain")):
        with wal.open(path, **opts) as store:
            got = []
            for args, kwargs in calls:
                try:
                    got.append(store.put(*args, **kwargs) > 0)
                except Exception as exc:  # the error's class is what is compared
                    got.append(type(exc))
            got.append(dict(store.scan()))
            outcomes.append(got)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][:5] == [True] * 5 and outcomes[0][5:-1] == [
        wal.ArgumentError, wal.RecordTooLargeError, wal.ArgumentTypeError, wal.ArgumentTypeError,
        wal.RecordTooLargeError, wal.ArgumentError]


@pytest.mark.parametrize("options", [{"encryption": KEY}, {"compression": "zstd"}], ids=["encrypted", "compressed"])
def test_a_sealed_get_many_refuses_what_is_not_a_sequence_of_keys_as_the_plain_store_does(
        tmp_path: Path, options: dict) -> None:
    """A sealed store's get_many(None) raised a raw TypeError, and its snapshot's get_many("ab")
    read keys a and b."""
    with wal.open(tmp_path, **options) as store:
        store.put("a", b"v")
        with store.snapshot() as snap:
            for get_many in (store.get_many, snap.get_many):
                for bad in (None, "ab", b"ab"):
                    with pytest.raises(wal.ArgumentTypeError, match="get_many takes a sequence of keys"):
                        get_many(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("options", [{"encryption": KEY}, {"compression": "zstd"}], ids=["encrypted", "compressed"])
def test_a_sealed_transaction_used_without_with_says_so_and_writes_nothing(tmp_path: Path, options: dict) -> None:
    """As test_store_api.py's plain one: a sealed transaction's put seals, then is refused."""
    with wal.open(tmp_path, **options) as store:
        for tx in (store.transaction(), store.atransaction()):
            with pytest.raises(wal.ClosedError, match="used inside `with"):
                tx.put("k", b"v")
        assert store.get("k") is None and store.watermarks.written == 0


@pytest.mark.parametrize(("options", "overhead"), [({"encryption": KEY}, 49), ({"compression": "zstd"}, 1)],
                         ids=["encrypted", "compressed"])
def test_a_sealed_stores_value_limit_is_the_plain_one_less_its_envelope_and_its_error_names_the_value(
        tmp_path: Path, options: dict, overhead: int) -> None:
    """A value whose envelope would pass the value limit is refused naming the value's own size
    and the sealed store's limit, by every path (the C put, a transaction, aput, update); the
    longest value under it is stored and read back. (Random bytes: nothing compresses.)"""
    limit = wal.store.store.MAX_VALUE_BYTES - overhead
    longest, over = os.urandom(limit), os.urandom(limit + 1)
    with wal.open(tmp_path / "s", **options) as store:
        store.put(b"k", longest)
        assert store.get(b"k") == longest

        def in_a_transaction() -> None:
            with store.transaction() as tx:
                tx.put(b"t", over)

        for attempt in (lambda: store.put(b"k", over), lambda: store.put(b"k", over, durability="sync"),
                        in_a_transaction, lambda: asyncio.run(store.aput(b"k", over)),
                        lambda: store.update(b"k", lambda _: over)):
            with pytest.raises(wal.RecordTooLargeError, match=f"value of {limit + 1} bytes is over the {limit}-byte"):
                attempt()
        assert store.get(b"k") == longest and store.get(b"t") is None


def test_a_sealed_put_on_an_archived_store_is_admitted_against_the_archive_rpo(tmp_path: Path) -> None:
    """The sealed put calls the store's C commit straight only over the plain Store: over the
    archive's store every put still passes its admission (the archive_rpo_ms bound)."""
    with wal.open(tmp_path / "store", encryption=KEY, archive=f"file://{tmp_path}/archive") as store:
        shipper = store._shipper
        admitted = []
        real_admit = shipper.admit

        def counting_admit() -> None:
            admitted.append(1)
            real_admit()

        shipper.admit = counting_admit  # type: ignore[method-assign]
        for i in range(5):
            store.put(b"k%d" % i, SECRET)  # the store's level: the C path, after the admission
        assert len(admitted) == 5
        store.put("s", SECRET, durability="sync")
        assert len(admitted) > 5 and store.get(b"k4") == SECRET and store.get("s") == SECRET


def test_a_value_is_sealed_once_and_the_log_and_the_state_hold_the_same_envelope(tmp_path: Path) -> None:
    with wal.open(tmp_path, encryption=KEY, apply_interval_ms=600_000) as store:
        store.put(b"k", SECRET)
        env = _raw(store, b"k")  # from the overlay: the commit path's bytes
        store.checkpoint()
        assert _raw(store, b"k") == env  # from LMDB: the same bytes
        log = b"".join(p.read_bytes() for p in (tmp_path / "log").glob("*.wal"))
        assert env in log and len(env) == len(SECRET) + sealing.OVERHEAD + 1 - 1


# ---- nothing in the clear ---------------------------------------------------------------------------


def test_no_value_plaintext_appears_in_any_file_of_an_encrypted_store(tmp_path: Path) -> None:
    """Log segments, the LMDB state, checkpoint files, at every stage: while open (commits in the
    log only), after checkpoints, after close. Keys stay plain by design (FORMAT.md §19)."""
    store = wal.open(tmp_path, encryption=KEY, compression="zstd", apply_interval_ms=600_000,
                     segment_bytes=1 << 16)
    try:
        for i in range(300):
            store.put(f"thread/{i}", _conversation(i))
        with store.transaction() as tx:
            tx.put(b"tx", SECRET * 3)
        store.update(b"upd", lambda _: SECRET)
        seen = _files(tmp_path)
        assert not [p for p, data in seen.items() if SECRET in data or b"quarterly" in data]
        store.checkpoint()
        for i in range(0, 300, 2):
            store.delete(f"thread/{i}")
        store.checkpoint()
    finally:
        store.close()
    files = _files(tmp_path)
    assert any(p.suffix == ".wal" for p in files) and any(p.name == "data.mdb" for p in files)
    leaks = [str(p) for p, data in files.items() for needle in (SECRET, b"quarterly", b"assistant") if needle in data]
    assert not leaks
    assert any(b"thread/1" in data for data in files.values())  # keys: plain, as documented
    with wal.open(tmp_path, encryption=KEY) as store:
        assert store.get("thread/1") == _conversation(1) and store.get("tx") == SECRET * 3


# ---- keys: missing, wrong, rotation -----------------------------------------------------------------


@pytest.mark.parametrize("readonly", [False, True])
def test_an_encrypted_store_opened_without_a_key_is_refused_at_open(tmp_path: Path, readonly: bool) -> None:
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"k", SECRET)
    with pytest.raises(MissingKeyError, match="is encrypted") as info:
        wal.open(tmp_path, readonly=readonly)
    assert info.value.key_id == key_id(KEY).hex() and info.value.where == str(tmp_path)
    with pytest.raises(MissingKeyError):
        wal.open(tmp_path, readonly=readonly, compression="zstd")


@pytest.mark.parametrize("readonly", [False, True])
def test_an_encrypted_store_opened_with_a_wrong_key_is_refused_at_open_and_nothing_is_written(
        tmp_path: Path, readonly: bool) -> None:
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"k", SECRET)
    # Every file as it was but LMDB's reader table (state/lock.mdb): an open refusing a key first
    # looks at the values' key ids, and a look registers its reader slot there, as any read does.
    before = {p: b for p, b in _files(tmp_path).items() if p.name != "lock.mdb"}
    with pytest.raises(WrongKeyError, match=key_id(KEY).hex()):
        wal.open(tmp_path, readonly=readonly, encryption=os.urandom(32))
    assert {p: b for p, b in _files(tmp_path).items() if p.name != "lock.mdb"} == before


def test_bad_encryption_arguments_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(wal.ArgumentError, match="32 bytes"):
        wal.open(tmp_path / "a", encryption=b"short")
    with pytest.raises(TypeError, match="32 bytes"):
        wal.open(tmp_path / "b", encryption=[KEY, "text"])
    with pytest.raises(wal.ArgumentError, match="compression"):
        wal.open(tmp_path / "c", compression="lz4")
    assert not (tmp_path / "a").exists()
    # A dictionary that is not bytes is an argument's error, named (was a bare TypeError from
    # bytes()); a threshold of 0 is refused as -5 is (it was taken as the default).
    for bad in ("x", 5, ["x"]):
        with pytest.raises(wal.ArgumentTypeError, match="compression_dict must be"):
            wal.open(tmp_path / "d", compression="zstd", compression_dict=bad)
    with pytest.raises(wal.ArgumentError, match="compression_threshold must be an int >= 1, got 0"):
        wal.open(tmp_path / "d", compression="zstd", compression_threshold=0)
    assert not (tmp_path / "d").exists()


def test_a_plain_store_cannot_be_opened_sealed_and_an_unencrypted_one_cannot_gain_encryption(tmp_path: Path) -> None:
    with wal.open(tmp_path / "plain") as store:
        store.put(b"k", b"v")
    with pytest.raises(wal.ArgumentError, match="created without encryption or compression"):
        wal.open(tmp_path / "plain", encryption=KEY)
    with wal.open(tmp_path / "z", compression="zstd") as store:
        store.put(b"k", b"v")
    with pytest.raises(wal.ArgumentError, match="created without encryption"):
        wal.open(tmp_path / "z", encryption=KEY)
    with wal.open(tmp_path / "z", compression="none") as store:  # compression off: the old envelopes still read
        store.put(b"k2", b"v2" * 100)
        assert store.get(b"k") == b"v" and _raw(store, b"k2")[0] == CODEC_PLAIN


def test_rotation_new_writes_use_the_new_key_old_values_read_while_their_key_is_given(tmp_path: Path) -> None:
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"old", b"under key 1")
    with wal.open(tmp_path, encryption=[KEY2, KEY]) as store:
        store.put(b"new", b"under key 2")
        assert _raw(store, b"new")[1:9] == key_id(KEY2) and _raw(store, b"old")[1:9] == key_id(KEY)
        assert store.get(b"old") == b"under key 1"
    assert json.loads((tmp_path / "STORE").read_text())["sealed"]["key_ids"] == [key_id(KEY).hex(),
                                                                                 key_id(KEY2).hex()]
    with wal.open(tmp_path, encryption=KEY2) as store:  # the old key no longer given
        assert store.get(b"new") == b"under key 2"
        with pytest.raises(MissingKeyError, match=f"key b'old'.*key id {key_id(KEY).hex()}") as info:
            store.get(b"old")
        assert info.value.key_id == key_id(KEY).hex() and "b'old'" in (info.value.where or "")
        with pytest.raises(MissingKeyError):
            list(store.scan())


def test_a_key_provider_is_asked_for_the_current_key_and_for_old_ids_once_each(tmp_path: Path) -> None:
    asked: list[bytes | None] = []
    keys = {key_id(KEY): KEY, key_id(KEY2): KEY2}

    def provider(kid: bytes | None) -> bytes | None:
        asked.append(kid)
        return KEY2 if kid is None else keys.get(kid)

    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"old", b"1")
    with wal.open(tmp_path, encryption=provider) as store:
        store.put(b"new", b"2")
        assert [store.get(b"old") for _ in range(3)] == [b"1"] * 3 and store.get(b"new") == b"2"
    assert asked.count(None) == 1 and asked.count(key_id(KEY)) == 1

    def liar(kid: bytes | None) -> bytes | None:
        return KEY2  # the same key for every id
    with wal.open(tmp_path, encryption=liar) as store, pytest.raises(MissingKeyError, match="whose id is"):
        store.get(b"old")  # KEY2 is current and listed: the open asked for nothing else


def test_a_key_provider_answering_with_a_wrong_key_is_a_wrong_key_error_as_the_key_given_directly(
        tmp_path: Path) -> None:
    """A provider that answered the store's key id with a wrong key gave MissingKeyError at open,
    where the same key given directly gives WrongKeyError; it is WrongKeyError now, saying what
    the provider answered. Likewise for a restore and a follower of an archive."""
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "s", encryption=KEY, archive=url) as store:
        store.put(b"k", b"v", durability="replicated")
    before = {p: b for p, b in _files(tmp_path / "s").items() if p.name != "lock.mdb"}  # as above

    def wrong(kid: bytes | None) -> bytes:
        return KEY3

    with pytest.raises(WrongKeyError, match=f"none of the keys given.*whose id is {key_id(KEY3).hex()}"):
        wal.open(tmp_path / "s", encryption=wrong)
    with pytest.raises(WrongKeyError):
        wal.open(tmp_path / "s", encryption=KEY3)
    assert {p: b for p, b in _files(tmp_path / "s").items() if p.name != "lock.mdb"} == before
    with pytest.raises(WrongKeyError):
        wal.restore(url, tmp_path / "r", encryption=wrong)
    with pytest.raises(WrongKeyError):
        wal.follow(url, tmp_path / "f", encryption=wrong)


def test_a_key_provider_that_raises_gives_an_encryption_key_error_naming_the_store_and_the_key(
        tmp_path: Path) -> None:
    """A provider's own exception came out raw (or, being an OSError, as a StorageError, which
    speaks of the disk): now an EncryptionKeyError naming what needed the key and which key, the
    provider's error chained."""
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"old", b"1")
    with wal.open(tmp_path, encryption=[KEY2, KEY]) as store:
        store.put(b"new", b"2")

    def unreachable(kid: bytes | None) -> bytes | None:
        raise ConnectionError("KMS unreachable")

    with pytest.raises(wal.EncryptionKeyError, match=r"the store at .*: the key provider failed to give the "
                                                     r"current key: ConnectionError: KMS unreachable") as opened:
        wal.open(tmp_path, encryption=unreachable)
    assert isinstance(opened.value.__cause__, ConnectionError)

    def current_only(kid: bytes | None) -> bytes | None:
        if kid is None or kid == key_id(KEY2):
            return KEY2
        raise ConnectionError("KMS unreachable")

    with wal.open(tmp_path, encryption=current_only) as store:
        assert store.get(b"new") == b"2"
        with pytest.raises(wal.EncryptionKeyError, match=rf"the value of key b'old' .*key of id {key_id(KEY).hex()}"
                                                         ": ConnectionError") as read:
            store.get(b"old")
        assert read.value.key_id == key_id(KEY).hex() and isinstance(read.value.__cause__, ConnectionError)


@pytest.mark.parametrize("bad", [b"k" * 16, "k" * 32, 7], ids=["16 bytes", "a str", "an int"])
def test_a_key_provider_answering_with_no_key_gives_an_encryption_key_error_naming_where(tmp_path: Path,
                                                                                        bad: object) -> None:
    """A provider that answered with something other than 32 bytes gave ArgumentError or
    ArgumentTypeError, naming neither the store nor the value that needed the key: it is the
    provider's answer, not an argument, and is an EncryptionKeyError as a provider's failure is."""
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"old", b"1")
    with pytest.raises(wal.EncryptionKeyError, match=r"the store at .*: the key provider gave, for the current key, "
                                                     ) as opened:
        wal.open(tmp_path, encryption=lambda kid: bad)
    assert opened.value.where == str(tmp_path)
    # Asked at the open for the key the store is under, since the current key is not one of its.
    with pytest.raises(wal.EncryptionKeyError, match=rf"the store at .*: the key provider gave, for the key of id "
                                                     rf"{key_id(KEY).hex()}, ") as opened:
        wal.open(tmp_path, encryption=lambda kid: KEY2 if kid in (None, key_id(KEY2)) else bad)
    assert opened.value.where == str(tmp_path)
    with wal.open(tmp_path, encryption=[KEY2, KEY]) as store:
        store.put(b"new", b"2")  # KEY2 listed from now on: the open asks for no other key
    with wal.open(tmp_path, encryption=lambda kid: KEY2 if kid in (None, key_id(KEY2)) else bad) as store:
        with pytest.raises(wal.EncryptionKeyError, match=rf"the value of key b'old' .*: the key provider gave, for the "
                                                         rf"key of id {key_id(KEY).hex()}, ") as read:
            store.get(b"old")
        assert read.value.key_id == key_id(KEY).hex() and "b'old'" in str(read.value.where)


def test_a_sealed_store_whose_store_file_lost_its_sealing_is_refused_not_opened_plain(tmp_path: Path) -> None:
    """STORE says how a store is sealed; one deleted, or rewritten without its "sealed" object,
    opened the store plain: its envelopes came back as values, and new values were written in
    the clear into an encrypted store. The state records that it is sealed, and such an open is
    refused; deleting STORE and opening with the store's key writes it again."""
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"k", SECRET)
    kept = json.loads((tmp_path / "STORE").read_text())
    (tmp_path / "STORE").unlink()
    with pytest.raises(wal.CorruptionError, match="STORE file names no sealing"):
        wal.open(tmp_path)
    assert not (tmp_path / "STORE").exists()  # refused before a plain one was written
    meta = dict(kept)
    meta.pop("sealed", None)
    (tmp_path / "STORE").write_text(json.dumps(meta))  # a STORE without its "sealed" object
    for readonly in (False, True):
        with pytest.raises(wal.CorruptionError, match="STORE file names no sealing"):
            wal.open(tmp_path, readonly=readonly)
        # Given its key: the same (it said the store "was created without encryption").
        with pytest.raises(wal.CorruptionError, match="STORE file names no sealing"):
            wal.open(tmp_path, readonly=readonly, encryption=KEY)
    (tmp_path / "STORE").unlink()
    with wal.open(tmp_path, encryption=KEY) as store:
        assert store.get(b"k") == SECRET
        store.put(b"k2", SECRET)
    assert SECRET not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    with wal.open(tmp_path, encryption=KEY, readonly=True) as store:
        assert store.get(b"k2") == SECRET


def test_a_store_file_lost_is_written_again_only_by_an_open_with_a_key_the_store_is_under(tmp_path: Path) -> None:
    """STORE deleted (the documented way back from a lost or damaged one): the state records how
    the store is sealed, and an open is held to it as to STORE. Without a key, compressing only,
    or with a wrong key it is refused and writes nothing; with the key it opens and writes STORE
    again. (A compressing-only open made it a new store whose new values went in the clear, and a
    wrong key's open registered that key alone, so the right one was refused afterwards.)"""
    with wal.open(tmp_path, encryption=KEY, compression="zstd") as store:
        store.put(b"k", SECRET)
    kept = json.loads((tmp_path / "STORE").read_text())
    (tmp_path / "STORE").unlink()
    for options, error in (({}, wal.CorruptionError), ({"compression": "zstd"}, wal.MissingKeyError),
                           ({"encryption": bytes(32)}, wal.WrongKeyError),
                           ({"encryption": bytes(32), "compression": "zstd"}, wal.WrongKeyError)):
        with pytest.raises(error):
            wal.open(tmp_path, **options)
        assert not (tmp_path / "STORE").exists(), options
    with wal.open(tmp_path, encryption=KEY) as store:
        assert store.get(b"k") == SECRET
        store.put(b"k2", SECRET)
    assert json.loads((tmp_path / "STORE").read_text())["sealed"]["key_ids"] == kept["sealed"]["key_ids"]
    assert SECRET not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


@pytest.mark.parametrize("name", ["encrypted", "key_ids"])
def test_a_store_file_whose_sealing_was_changed_by_a_byte_is_refused_as_damaged(tmp_path: Path, name: str) -> None:
    """STORE is plain JSON: one bit changed in "encrypted" made the field read as missing, and the
    store opened without a key and took new values in the clear. Its sealing must hold together
    (an encrypted store lists key ids, one that is not lists none), else the open is refused."""
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"k", SECRET)
    text = (tmp_path / "STORE").read_text()
    damaged = text.replace(f'"{name}"', f'"{chr(ord(name[0]) ^ 1)}{name[1:]}"')
    assert damaged != text
    (tmp_path / "STORE").write_text(damaged)
    for options in ({}, {"encryption": KEY}, {"compression": "zstd"}):
        with pytest.raises(wal.CorruptionError, match="does not hold together"):
            wal.open(tmp_path, **options)
    assert (tmp_path / "STORE").read_text() == damaged
    (tmp_path / "STORE").unlink()  # the way back: the state records the sealing
    with wal.open(tmp_path, encryption=KEY) as store:
        assert store.get(b"k") == SECRET
    assert SECRET not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


def test_a_sealed_store_written_before_its_state_recorded_the_sealing_opens_and_gets_the_record(
        tmp_path: Path) -> None:
    """Stores sealed by an agentwal older than the state's `sealed` mark (FORMAT.md §16) have
    none: they open as before, and their next writable open sets it, after which a STORE lost
    is refused for them too."""
    import lmdb  # noqa: PLC0415

    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"k", SECRET)
    env = lmdb.open(str(tmp_path / "state"), max_dbs=8, subdir=True)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:  # as an older version left it
        assert txn.delete(b"sealed")
    env.close()
    with wal.open(tmp_path, encryption=KEY, readonly=True) as store:  # a reader reads, writes nothing
        assert store.get(b"k") == SECRET
    (tmp_path / "STORE").rename(tmp_path / "STORE.kept")
    with wal.open(tmp_path) as store:  # no mark yet: opened plain, as an older version did
        assert Store.get(store, b"k") != SECRET
    (tmp_path / "STORE.kept").replace(tmp_path / "STORE")
    with wal.open(tmp_path, encryption=KEY) as store:  # the writable open sets the mark
        assert store.get(b"k") == SECRET
    (tmp_path / "STORE").unlink()
    with pytest.raises(wal.CorruptionError, match="STORE file names no sealing"):
        wal.open(tmp_path)


# ---- damage: never wrong data --------------------------------------------------------------------------


def test_every_flipped_byte_of_an_envelope_is_refused_naming_the_key(tmp_path: Path) -> None:
    """Written through the plain store underneath, so the log's and the state's CRCs hold: only
    the AEAD stands between the flip and the caller."""
    with wal.open(tmp_path, encryption=KEY, compression="zstd") as store:
        store.put(b"k", _conversation(3))
        env = _raw(store, b"k")
        for i in range(len(env)):
            bad = bytearray(env)
            bad[i] ^= 0x01
            Store.put(store, b"k", bytes(bad))
            with pytest.raises((SealDamagedError, MissingKeyError)) as info:
                store.get(b"k")
            assert "b'k'" in str(info.value)
            if isinstance(info.value, SealDamagedError):
                assert isinstance(info.value, wal.CorruptionError) and info.value.reason == "sealed value damaged"
            else:
                assert 1 <= i < 9  # the key id itself was hit: that key was never given
        Store.put(store, b"k", env)
        assert store.get(b"k") == _conversation(3)


def test_a_ciphertext_moved_to_another_key_or_replaced_by_plaintext_is_refused(tmp_path: Path) -> None:
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"role/alice", b"admin")
        store.put(b"role/bob", b"guest")
        Store.put(store, b"role/bob", _raw(store, b"role/alice"))  # swap attempt
        with pytest.raises(SealDamagedError, match="authentication failed"):
            store.get(b"role/bob")
        Store.put(store, b"role/bob", bytes([CODEC_PLAIN]) + b"admin")  # downgrade attempt
        with pytest.raises(SealDamagedError, match="not encrypted"):
            store.get(b"role/bob")
        Store.put(store, b"role/bob", b"")
        with pytest.raises(SealDamagedError, match="empty"):
            store.get(b"role/bob")


def test_a_flipped_byte_in_the_files_of_an_encrypted_store_is_a_clean_error(tmp_path: Path) -> None:
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"k", SECRET)
        env = _raw(store, b"k")
    data_mdb = tmp_path / "state" / "data.mdb"
    raw = bytearray(data_mdb.read_bytes())
    at = raw.find(env)
    assert at > 0
    raw[at + len(env) - 3] ^= 0xFF  # in the tag
    data_mdb.write_bytes(bytes(raw))
    with pytest.raises(wal.CorruptionError, match=r"data\.mdb is damaged \(key b'k': checksum mismatch"):
        wal.open(tmp_path, encryption=KEY).close()  # the open's walk of a small state finds it


# ---- compression --------------------------------------------------------------------------------------


def test_compression_is_per_value_above_the_threshold_and_only_when_it_pays(tmp_path: Path) -> None:
    with wal.open(tmp_path, compression="zstd", compression_threshold=64) as store:
        store.put(b"small", b"x" * 63)
        store.put(b"json", _conversation(7))
        store.put(b"noise", os.urandom(4096))
        assert _raw(store, b"small")[0] == CODEC_PLAIN
        assert _raw(store, b"json")[0] == CODEC_ZSTD and len(_raw(store, b"json")) * 3 < len(_conversation(7))
        assert _raw(store, b"noise")[0] == CODEC_PLAIN  # incompressible: kept as it is
        assert store.get(b"noise") != store.get(b"json")


def test_a_compressed_store_reopened_without_saying_so_still_compresses_as_it_did(tmp_path: Path) -> None:
    # Compression was an option of each open: a reopen without compression= wrote every new
    # value uncompressed (the dictionary, the threshold and the codec all forgotten), though a
    # store is compressed "from its creation".
    samples = [json.dumps({"role": "tool", "call_id": f"call_{i}", "result": {"hits": i % 7}}).encode()
               for i in range(2000)]
    zdict = sealing.train_dictionary(samples, 4096)
    for name, options in (("codec", {}), ("dictionary", {"compression_dict": zdict})):
        with wal.open(tmp_path / name, compression="zstd", compression_threshold=32, **options) as store:
            store.put(b"first", samples[0])
        with wal.open(tmp_path / name) as store:  # nothing said: as created
            assert store.stats()["compression"] == "zstd"
            store.put(b"small", b"ab" * 50)  # under the default threshold (128), over the store's (32)
            store.put(b"json", _conversation(7))
            assert _raw(store, b"small")[0] == CODEC_ZSTD and _raw(store, b"json")[0] == CODEC_ZSTD
            assert store.get(b"small") == b"ab" * 50
    with wal.open(tmp_path / "plain") as store:
        store.put(b"json", _conversation(7))
    with pytest.raises(wal.ArgumentError):  # a store created plain stays plain, as before
        wal.open(tmp_path / "plain", compression="zstd")


def test_a_restore_given_compression_records_it_and_takes_none_as_wal_open_does(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "primary", archive=url, compression="zstd", compression_threshold=64) as store:
        store.put(b"a", b"ab" * 2500)
    for name, options, recorded in (("on", {"compression": "zstd", "compression_threshold": 64},
                                     {"codec": "zstd", "threshold": 64}),
                                    ("off", {"compression": "none"}, {"codec": "none"})):
        wal.restore(url, tmp_path / name, **options)  # "none" was refused here, taken by wal.open
        assert json.loads((tmp_path / name / "STORE").read_text())["sealed"]["compression"] == recorded
        with wal.open(tmp_path / name) as store:
            store.put(b"b", b"cd" * 50)  # 100 bytes: over the recorded threshold
            assert _raw(store, b"b")[0] == (CODEC_ZSTD if name == "on" else CODEC_PLAIN)
            assert store.get(b"a") == b"ab" * 2500


def test_a_plain_archive_is_restored_and_followed_with_compression_none_as_wal_open_takes_it(tmp_path: Path) -> None:
    """compression="none" on a plain archive was refused ("written by a store without encryption
    or compression"), though wal.open takes it on a plain store and restore takes it on a
    compressed archive; compression="zstd" there is still refused."""
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "primary", archive=url) as store:
        store.put(b"a", b"v")
    assert wal.restore(url, tmp_path / "r", compression="none").lsn == 1
    assert "sealed" not in json.loads((tmp_path / "r" / "STORE").read_text())  # a plain store, as wal.open's
    follower = wal.follow(url, tmp_path / "f", compression="none", poll_ms=20)
    try:
        assert follower.get(b"a") == b"v"
    finally:
        follower.close()
    with pytest.raises(wal.ArgumentError, match="without encryption or compression"):
        wal.restore(url, tmp_path / "z", compression="zstd")


def test_rekey_keeps_the_recorded_compression_its_threshold_and_its_being_off(tmp_path: Path) -> None:
    # rekey opened every store holding compressed values with compression="zstd": the recorded
    # threshold went back to the default, and a store turned off was turned on again.
    from wal import ops  # noqa: PLC0415

    with wal.open(tmp_path, encryption=KEY, compression="zstd", compression_threshold=4096) as store:
        store.put(b"a", b"x" * 5000)
    recorded = lambda: json.loads((tmp_path / "STORE").read_text())["sealed"]["compression"]  # noqa: E731
    ops.use_sealing(encryption=[KEY2, KEY])
    try:
        ops.rekey(str(tmp_path))
        assert recorded() == {"codec": "zstd", "threshold": 4096}
        with wal.open(tmp_path, encryption=[KEY2, KEY], compression="none") as store:
            store.put(b"b", b"y" * 5000)
            assert _raw(store, b"b")[0] == CODEC_ENCRYPTED  # stored uncompressed
        ops.rekey(str(tmp_path))
        assert recorded() == {"codec": "none"}
    finally:
        ops.use_sealing()
    with wal.open(tmp_path, encryption=KEY2) as store:
        assert store.get(b"a") == b"x" * 5000 and store.get(b"b") == b"y" * 5000


def test_a_trained_dictionary_compresses_small_json_and_is_needed_to_read_it(tmp_path: Path) -> None:
    samples = [json.dumps({"role": "tool", "call_id": f"call_{i}", "name": "search",
                           "result": {"status": "ok", "hits": i % 7, "query": f"q{i}"}}).encode()
               for i in range(2000)]
    zdict = sealing.train_dictionary(samples, 4096)
    with wal.open(tmp_path, compression="zstd", compression_dict=zdict, compression_threshold=32) as store:
        for i, s in enumerate(samples[:100]):
            store.put(f"r/{i}", s)
        sizes = [len(_raw(store, f"r/{i}".encode())) for i in range(100)]
        assert sum(sizes) * 2 < sum(map(len, samples[:100]))
    stored = next((tmp_path / "dicts").iterdir())  # kept with the store (tests/test_crypto_dictionary.py)
    stored.rename(tmp_path / "elsewhere")
    with pytest.raises(wal.CorruptionError, match="is missing"):
        wal.open(tmp_path)
    with wal.open(tmp_path, compression_dict=zdict) as store:  # given again: read, and stored again
        assert [store.get(f"r/{i}") for i in range(100)] == samples[:100]


def test_a_zstd_frame_claiming_a_huge_size_is_refused_not_decompressed() -> None:
    s = Sealer(None, "zstd")
    env = s.seal(b"a" * 1000, b"ctx")
    assert env[0] == CODEC_ZSTD
    assert s.open(env, b"ctx", lambda: "v") == b"a" * 1000
    undeclared = bytes([CODEC_ZSTD]) + zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * 100)
    with pytest.raises(SealDamagedError, match="does not declare its size"):
        s.open(undeclared, b"ctx", lambda: "value v")
    huge = bytes([CODEC_ZSTD]) + zstandard.ZstdCompressor().compress(b"\0" * ((1 << 30) + 1))
    with pytest.raises(SealDamagedError, match="claiming 1073741825 bytes"):
        s.open(huge, b"ctx", lambda: "value v")
    with pytest.raises(SealDamagedError, match="not a zstd frame"):
        s.open(bytes([CODEC_ZSTD]) + b"garbage-not-zstd", b"ctx", lambda: "value v")


# ---- formats ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_each_older_store_format_opens_reads_and_is_upgraded_to_6(tmp_path: Path, version: int) -> None:
    with wal.open(tmp_path) as store:
        for i in range(20):
            with store.transaction(idempotency_key=f"step-{i}") as tx:
                tx.put(f"k{i}", b"v%d" % i)
    strip_idem_checksums(tmp_path)
    if version < 4:
        strip_entry_checksums(tmp_path)
    if version == 1:
        (tmp_path / "state" / "checkpoint.meta").unlink()
    (tmp_path / "STORE").write_text(json.dumps({"format": "agentwal-store", "version": version}) + "\n")
    with wal.open(tmp_path, readonly=True) as ro:
        assert ro.get("k7") == b"v7"
    with wal.open(tmp_path) as store:
        assert [store.get(f"k{i}") for i in range(20)] == [b"v%d" % i for i in range(20)]
        store.put(b"after", b"upgrade")
        with store.transaction(idempotency_key="step-7") as retry:  # its key is remembered
            retry.put("k7", b"again")
        assert retry.deduplicated and store.get("k7") == b"v7"
    assert json.loads((tmp_path / "STORE").read_text()) == {"format": "agentwal-store", "version": 6}


def test_a_sealed_store_file_names_what_it_holds(tmp_path: Path) -> None:
    wal.open(tmp_path / "e", encryption=KEY).close()
    wal.open(tmp_path / "z", compression="zstd").close()
    assert json.loads((tmp_path / "e" / "STORE").read_text()) == {
        "format": "agentwal-store", "version": 6, "sealed": {"encrypted": True, "key_ids": [key_id(KEY).hex()]}}
    assert json.loads((tmp_path / "z" / "STORE").read_text())["sealed"] == {
        "encrypted": False, "key_ids": [], "compression": {"codec": "zstd", "threshold": 128}}
    wal.open(tmp_path / "z", compression="none").close()  # turned off, and recorded so
    assert json.loads((tmp_path / "z" / "STORE").read_text())["sealed"] == {
        "encrypted": False, "key_ids": [], "compression": {"codec": "none"}}
    wal.open(tmp_path / "z").close()  # an open that says nothing keeps it off
    assert json.loads((tmp_path / "z" / "STORE").read_text())["sealed"]["compression"] == {"codec": "none"}
    wal.open(tmp_path / "plain", compression="none").close()  # a plain store: nothing to turn off
    assert "sealed" not in json.loads((tmp_path / "plain" / "STORE").read_text())


def test_no_plaintext_in_blobs_archive_objects_or_a_restored_store_and_the_object_store_sees_no_key(
        tmp_path: Path) -> None:
    """The agent layer (events, state, tool calls, checkpoints) on an encrypted, compressed store
    that ships to a file:// archive, then a restore of that archive, and beside them a store
    without an archive that keeps large values as blob files: the plaintext and the agent's
    thread name appear in no file of the stores, the blobs, the archive or the restored store;
    the archive holds no key either (its objects are sealed whole)."""
    url = f"file://{tmp_path}/archive"
    store = wal.open(tmp_path / "store", encryption=KEY, compression="zstd", archive=url,
                     archive_snapshot_bytes=1 << 14)
    try:
        agents = AgentStore(store, "support-bot", blob_threshold=1024)
        for i in range(40):
            agents.append("thread-secret-customer", _conversation(i), state={"summary": SECRET * 2})
        agents.begin_call("thread-secret-customer", "call-1", "crm.lookup", SECRET)
        agents.end_call("thread-secret-customer", "call-1", _conversation(99))
        agents.save_checkpoint("thread-secret-customer", _conversation(100) * 3, schema_version=1, config_hash="h")
        assert agents.read("thread-secret-customer").__next__()[1] == _conversation(0)
        assert agents.get_state("thread-secret-customer", "summary") == SECRET * 2
        store.checkpoint()
    finally:
        store.close()
    wal.restore(url, tmp_path / "restored", encryption=KEY)
    with wal.open(tmp_path / "local", encryption=KEY, compression="zstd") as local:  # no archive: blob files
        local_agents = AgentStore(local, "support-bot", blob_threshold=1024)
        for i in range(40):
            local_agents.append("thread-secret-customer", _conversation(i))
        assert list((tmp_path / "local" / "blobs").rglob("*"))
        assert local_agents.read("thread-secret-customer").__next__()[1] == _conversation(0)
    files = _files(tmp_path)
    assert any("archive" in p.parts and p.suffix == ".snap" for p in files)
    leaks = [str(p) for p, data in files.items() for needle in (SECRET, b"quarterly", b"assistant") if needle in data]
    assert not leaks
    archive_leaks = [str(p) for p, data in files.items() if "archive" in p.parts and b"thread-secret" in data]
    assert not archive_leaks  # keys too: the object store sees ciphertext only
    with wal.open(tmp_path / "restored", encryption=KEY) as restored:
        agents = AgentStore(restored, "support-bot")
        assert agents.get_state("thread-secret-customer", "summary") == SECRET * 2
        assert restored.get(b"ag/support-bot/c/call-1/i").endswith(SECRET)  # the call's intent: its args


def test_a_flipped_byte_of_a_sealed_blob_or_archive_object_is_a_clean_error_naming_it(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "store", encryption=KEY, archive=url) as store:
        AgentStore(store, "a", blob_threshold=64).append("t", SECRET * 10)  # in the log: the archive holds it
        store.checkpoint()
    with wal.open(tmp_path / "local", encryption=KEY) as store:  # no archive: a large value is a blob file
        AgentStore(store, "a", blob_threshold=64).append("t", SECRET * 10)
    blob = next(p for p in (tmp_path / "local" / "blobs").rglob("*") if p.is_file())
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with wal.open(tmp_path / "local", encryption=KEY) as store, \
            pytest.raises(SealDamagedError, match=f"blob file {blob}.*authentication failed"):
        list(AgentStore(store, "a").read("t"))
    obj = sorted((tmp_path / "archive" / "log").glob("*.wal"))[0]
    data = bytearray(obj.read_bytes())
    data[40] ^= 1
    obj.write_bytes(bytes(data))
    with pytest.raises(SealDamagedError, match=f"archive object log/{obj.name}"):
        wal.restore(url, tmp_path / "r", encryption=KEY)
    with pytest.raises(MissingKeyError, match=r"archive .* is encrypted"):
        wal.restore(url, tmp_path / "r2")


@pytest.mark.parametrize("offset", [13, 27, 41, 50, -40])
def test_a_flipped_byte_in_an_encrypted_snapshot_is_a_seal_damaged_error_not_what_it_decrypts_to(
        tmp_path: Path, offset: int) -> None:
    """A restore reads an encrypted snapshot as it decrypts, before its tag is checked: a flipped
    byte of its session, counter or first ciphertext bytes decrypted to a header that failed to
    parse, and was reported as that ("bad magic", "format version 0", a header disagreeing with
    its name), not as the changed ciphertext it is. The tag is now checked first on such damage."""
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "store", encryption=KEY, archive=url, archive_snapshot_bytes=4096) as store:
        for i in range(200):
            store.put(f"k/{i:03d}", b"v" * 100)
    snap = sorted((tmp_path / "archive" / "snap").glob("*.snap"))[-1]
    for log_object in (tmp_path / "archive").glob("*/*.wal"):
        log_object.unlink()  # nothing else holds the snapshot's LSNs: no older snapshot to restore from instead
    data = bytearray(snap.read_bytes())
    data[offset] ^= 1
    snap.write_bytes(bytes(data))
    with pytest.raises(SealDamagedError, match=f"archive object snap/{snap.name}.*authentication failed"):
        wal.restore(url, tmp_path / "r", encryption=KEY)
    assert not (tmp_path / "r").exists()


def test_a_restore_or_follower_given_a_wrong_key_is_told_so_and_one_lacking_an_older_key_is_asked_for_it(
        tmp_path: Path) -> None:
    """An encrypted archive names the keys its objects are under (keys/<id>, FORMAT.md §18): a
    restore or follower given none of them gets WrongKeyError before anything is downloaded
    (it was MissingKeyError, asking for a key it had no way to have). After a rotation, the
    old key alone is not wrong: the first object under the new one asks for it
    (MissingKeyError). An archive without the markers (written before them) still gives
    MissingKeyError naming the key id."""
    url = f"file://{tmp_path}/archive"
    wrong = os.urandom(32)
    with wal.open(tmp_path / "s", encryption=KEY, archive=url) as s:
        for i in range(5):
            s.put(f"k/{i}", SECRET, durability="replicated")
    assert sorted(p.name for p in (tmp_path / "archive" / "keys").iterdir()) == [key_id(KEY).hex()]
    with pytest.raises(WrongKeyError, match=f"archive {url} is encrypted under \\({key_id(KEY).hex()}\\)") as info:
        wal.restore(url, tmp_path / "r", encryption=wrong)
    assert info.value.key_id == key_id(KEY).hex() and not (tmp_path / "r").exists()
    with pytest.raises(WrongKeyError, match="a wrong key"):
        wal.follow(url, tmp_path / "f", encryption=wrong)
    with pytest.raises(WrongKeyError):  # a provider that knows none of them
        wal.restore(url, tmp_path / "r", encryption=lambda kid: wrong if kid is None else None)
    # A provider whose current key is newer but which knows the archive's.
    provider = {None: KEY2, key_id(KEY2): KEY2, key_id(KEY): KEY}
    assert wal.restore(url, tmp_path / "r", encryption=provider.get).lsn == 5
    with wal.open(tmp_path / "s", encryption=[KEY2, KEY], archive=url) as s:  # rotated
        s.put("k/new", SECRET, durability="replicated")
    assert sorted(p.name for p in (tmp_path / "archive" / "keys").iterdir()) == sorted(
        [key_id(KEY).hex(), key_id(KEY2).hex()])
    with pytest.raises(MissingKeyError, match=f"encrypted under key id {key_id(KEY2).hex()}"):
        wal.restore(url, tmp_path / "r2", encryption=KEY)
    assert wal.restore(url, tmp_path / "r3", encryption=[KEY2, KEY]).lsn == 6
    shutil.rmtree(tmp_path / "archive" / "keys")  # as an archive written before the markers
    with pytest.raises(MissingKeyError, match=f"encrypted under key id {key_id(KEY2).hex()}"):
        wal.restore(url, tmp_path / "r4", encryption=wrong)  # the newest snapshot's, under the new key


def test_an_archive_begun_before_key_markers_never_calls_an_old_key_wrong(tmp_path: Path) -> None:
    """An archive whose manifest does not say "key_markers" (begun before them) lists only the
    keys its later writers marked: a restore with an older key, under which its early objects
    are, is not refused as a wrong key. And a key provider that fails for one listed id (a KMS
    refusing a retired key) is asked for the next rather than ending the restore."""
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "s", encryption=KEY, archive=url) as s:
        for i in range(4):
            s.put(f"k/{i}", SECRET, durability="replicated")
    manifest = tmp_path / "archive" / "sealed.json"
    meta = json.loads(manifest.read_bytes())
    assert meta.pop("key_markers") is True
    manifest.write_text(json.dumps(meta))  # as an older writer wrote it
    shutil.rmtree(tmp_path / "archive" / "keys")
    with wal.open(tmp_path / "s", encryption=[KEY2, KEY], archive=url) as s:  # upgraded, rotated
        s.put("k/new", SECRET, durability="replicated")
    assert [p.name for p in (tmp_path / "archive" / "keys").iterdir()] == [key_id(KEY2).hex()]
    assert wal.restore(url, tmp_path / "r", lsn=3, encryption=KEY).lsn == 3  # before the new snapshot

    # The retired key's id first in the listing (name order), so it is asked for first.
    retired, current = sorted((KEY, KEY2), key=key_id)
    url2 = f"file://{tmp_path}/archive2"
    with wal.open(tmp_path / "s2", encryption=retired, archive=url2) as s:
        s.put("k", SECRET, durability="replicated")
    with wal.open(tmp_path / "s2", encryption=[current, retired], archive=url2) as s:
        s.put("k2", SECRET, durability="replicated")  # a new snapshot under `current`: all a restore needs

    def provider(kid: bytes | None) -> bytes | None:
        if kid == key_id(retired):
            raise RuntimeError("key disabled in the KMS")
        return {None: KEY3, key_id(current): current}.get(kid)

    assert wal.restore(url2, tmp_path / "r2", encryption=provider).lsn == 2


def test_a_standby_follower_given_a_wrong_key_says_so_once_its_writer_ships(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/archive"
    (tmp_path / "archive").mkdir()
    standby = wal.follow(url, tmp_path / "f", encryption=os.urandom(32), poll_ms=20)
    try:
        with wal.open(tmp_path / "s", encryption=KEY, archive=url) as s:
            s.put("k", SECRET, durability="replicated")
        wait_until(lambda: standby.stats()["follower_error"] is not None)
        assert standby.lsn == 0 and "WrongKeyError" in standby.stats()["follower_error"]
    finally:
        standby.close()


def test_a_follower_promoted_under_a_new_key_fences_an_old_primary_that_lacks_that_key(tmp_path: Path) -> None:
    """The fence is sealed under the promoted writer's current key. The old primary, given only
    the old key, cannot open it; that is no outage to wait out (its PUTs were retried for ever,
    `sync` commits acknowledged that no archive would hold): a name it cannot read is not its own."""
    new_key = bytes(range(100, 132))
    url = f"file://{tmp_path}/archive"
    old = wal.open(tmp_path / "p", archive=url, encryption=KEY, archive_rpo_ms=2000)
    try:
        old.put("a", SECRET, durability="replicated")
        follower = wal.follow(url, tmp_path / "f", poll_ms=20, encryption=[new_key, KEY])
        wait_until(lambda: follower.lsn == 1)
        new = follower.promote()
        try:
            old.put("b", b"after the promotion")  # sync: its PUT finds the fence
            wait_until(lambda: old.stats()["archive_fenced"], timeout=10)
            with pytest.raises(wal.FailedError, match="fenced"):
                old.put("c", b"x", durability="replicated")
            assert new.put("n", b"1") == 3 and new.get("a") == SECRET
        finally:
            new.close()
    finally:
        old._close_flush_s = 0.5
        old.close()


def test_a_sealing_manifest_whose_encrypted_field_is_damaged_is_refused_as_damage(tmp_path: Path) -> None:
    """sealed.json with its "encrypted" name or value changed by a byte read as "not encrypted":
    the right key was refused as one given to an archive of a store without encryption."""
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "store", encryption=KEY, archive=url) as store:
        store.put("k", SECRET, durability="replicated")
    manifest = tmp_path / "archive" / "sealed.json"
    good = manifest.read_bytes()
    for damaged in (good.replace(b'"encrypted"', b'"encryptee"'), good.replace(b"true", b"1")):
        assert damaged != good
        manifest.write_bytes(damaged)
        with pytest.raises(wal.CorruptionError, match=r"unreadable sealed\.json"):
            wal.restore(url, tmp_path / "r", encryption=KEY)
        assert not (tmp_path / "r").exists()
    manifest.write_bytes(good)
    assert wal.restore(url, tmp_path / "r", encryption=KEY).lsn == 1


@pytest.mark.parametrize("options", [{"encryption": KEY}, {"compression": "zstd"}], ids=["encrypted", "compressed"])
def test_an_archive_whose_sealing_manifest_was_deleted_says_so(tmp_path: Path, options: dict[str, Any]) -> None:
    """sealed.json deleted (or not copied with the objects): a restore or follower without the
    sealing options called its first log object damaged (a SHA-256 mismatch), and one with them
    called the archive a plain store's. Both now say the manifest is missing, and make nothing.
    A plain archive whose object's first byte alone was flipped is still damage, as before."""
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "s", archive=url, **options) as s:
        for i in range(5):
            s.put(f"k/{i}", SECRET * 20, durability="replicated")
    manifest = tmp_path / "archive" / "sealed.json"
    good = manifest.read_bytes()
    manifest.unlink()
    for given in ({}, options):
        with pytest.raises(wal.CorruptionError, match=r"has no sealed\.json, which says so"):
            wal.restore(url, tmp_path / "r", **given)
        with pytest.raises(wal.CorruptionError, match=r"has no sealed\.json"):
            wal.follow(url, tmp_path / "f", **given)
        assert not (tmp_path / "r").exists() and not (tmp_path / "f").exists()
    manifest.write_bytes(good)
    assert wal.restore(url, tmp_path / "r", **options).lsn == 5
    plain_url = f"file://{tmp_path}/plain"
    with wal.open(tmp_path / "p", archive=plain_url) as p:
        p.put("k", b"v", durability="replicated")
    obj = next((tmp_path / "plain" / "log").glob("*.wal"))
    for codec in (CODEC_ENCRYPTED, CODEC_ZSTD, CODEC_PLAIN):
        data = bytearray(obj.read_bytes())
        data[0] = codec
        obj.write_bytes(bytes(data))
        with pytest.raises(wal.CorruptionError, match=f"{obj.name} .*is damaged"):
            wal.restore(plain_url, tmp_path / "pr")


def test_an_envelope_that_says_encrypted_in_a_store_never_encrypted_is_damage(tmp_path: Path) -> None:
    """A compressed-only store (STORE: never encrypted) whose blob's codec byte was flipped to
    "encrypted": it was MissingKeyError, asking for a key that never existed; it is damage. The
    same in a compressed-only archive's object. A keyless reader of a store or archive that *is*
    encrypted still gets MissingKeyError (above)."""
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "store", compression="zstd") as store:  # no archive: a large value is a blob file
        AgentStore(store, "a", blob_threshold=64).append("t", SECRET * 10)
    with wal.open(tmp_path / "shipping", compression="zstd", archive=url) as store:
        store.put("k", SECRET * 10, durability="replicated")
    blob = next(p for p in (tmp_path / "store" / "blobs").rglob("*") if p.is_file())
    data = bytearray(blob.read_bytes())
    data[0] |= CODEC_ENCRYPTED
    blob.write_bytes(bytes(data))
    with wal.open(tmp_path / "store", compression="zstd") as store, \
            pytest.raises(SealDamagedError, match=f"blob file {blob}.*says encrypted, in a store never encrypted"):
        list(AgentStore(store, "a").read("t"))
    obj = sorted((tmp_path / "archive" / "log").glob("*.wal"))[-1]
    data = bytearray(obj.read_bytes())
    data[0] |= CODEC_ENCRYPTED
    obj.write_bytes(bytes(data))
    with pytest.raises(SealDamagedError, match=f"archive object log/{obj.name}.*never encrypted"):
        wal.restore(url, tmp_path / "r")


def _watch_sealed_reads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every read a sealed archive makes for `read_ranged` from now on, in a list."""
    from wal.archive import sealed as sealed_mod  # noqa: PLC0415

    reads: list[object] = []
    real = sealed_mod.SealedObjects.read_ranged

    def watched(self: sealed_mod.SealedObjects, name: str, *, window: int | None = None) -> object:
        read = real(self, name, window=window)
        reads.append(read)
        return read

    monkeypatch.setattr(sealed_mod.SealedObjects, "read_ranged", watched)
    return reads


@pytest.mark.parametrize("damage", [None, "middle", "tag"])
def test_an_encrypted_snapshot_is_restored_a_window_at_a_time_and_authenticated_at_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str | None) -> None:
    """An encrypted archive's snapshot is decrypted as its ranges arrive, the ciphertext and the
    plaintext each released once used (it was downloaded whole, copied, and decrypted whole: three
    times its size). Its tag is checked once the last byte is in: a flipped byte in the middle or
    in the tag is refused, naming the object, and no directory is left."""
    from obstore.store import LocalStore  # noqa: PLC0415

    from wal.archive import objects as objects_mod  # noqa: PLC0415
    from wal.archive import restore as restore_mod  # noqa: PLC0415
    from wal.archive import sealed as sealed_mod  # noqa: PLC0415

    window = 1 << 20
    monkeypatch.setattr(restore_mod, "_SNAPSHOT_WINDOW_BYTES", window)
    monkeypatch.setattr(sealed_mod, "_DECRYPT_STEP", 256 << 10)
    monkeypatch.setattr(objects_mod, "RANGE_BYTES", 64 << 10)
    monkeypatch.setattr(restore_mod, "_SNAPSHOT_PIECE_BYTES", 64 << 10)  # what the loader waits for at once
    # An obstore store: fetched in ranges, as from S3 (a file:// archive maps its files instead).
    url = LocalStore(str(tmp_path / "archive"), mkdir=True)
    values = {f"k{i:04d}": os.urandom(64 << 10) for i in range(160)}  # 10 MiB
    with wal.open(tmp_path / "store", encryption=KEY, archive=url, archive_snapshot_bytes=1 << 40) as store:
        for k, v in values.items():
            store.put(k, v)
        store.checkpoint()
        lsn = store._ship_snapshot_now()
    snap = tmp_path / "archive" / "snap" / f"{lsn:020d}.snap"
    for log_object in (tmp_path / "archive" / "log").glob("*.wal"):
        log_object.unlink()  # the restore has the snapshot alone to go by
    if damage is not None:
        data = bytearray(snap.read_bytes())
        data[len(data) // 2 if damage == "middle" else -1] ^= 1
        snap.write_bytes(bytes(data))
    reads = _watch_sealed_reads(monkeypatch)
    if damage is not None:
        with pytest.raises(wal.CorruptionError, match=rf"snap/0*{lsn}\.snap"):
            wal.restore(url, tmp_path / "r", encryption=KEY)
        assert sorted(os.listdir(tmp_path)) == ["archive", "store"]
        return
    r = wal.restore(url, tmp_path / "r", encryption=KEY)
    assert r.snapshot_lsn == lsn == r.lsn
    with wal.open(tmp_path / "r", encryption=KEY) as restored:
        assert {k.decode(): v for k, v in restored.scan()} == values
    decrypting = [read for read in reads if isinstance(read, sealed_mod.DecryptingRead)]
    assert len(decrypting) == 1, reads
    read = decrypting[0]
    assert read.size > 10 * window
    # The ciphertext: a window ahead of what was decrypted, a range at its edge, and the step
    # being decrypted (a read that held it whole would have held all 10 MiB).
    assert 0 < read.held_max <= window + (64 << 10) + (256 << 10) + (1 << 16), read.held_max
    assert bytes(memoryview(read.buffer)[:4096]) == bytes(4096), "decrypted pages loaded were not given back"


def test_a_streamed_seal_is_an_envelope_as_seal_makes_it_under_a_session_of_its_own() -> None:
    """`Sealer.sealing` (an archive snapshot encrypted as it is written) gives the envelope
    FORMAT.md §19 describes: it opens whole and piece by piece, with counter 0 under a fresh
    session each time."""
    import io  # noqa: PLC0415

    sealer = Sealer(sealing.Keyring(KEY))
    plain = os.urandom(300_000)
    context = sealing.CONTEXT_ARCHIVE + b"snap/x"
    envelopes = []
    for _ in range(2):
        out = io.BytesIO()
        stream = sealer.sealing(out, context)
        for i in range(0, len(plain), 70_000):
            stream.write(memoryview(plain)[i:i + 70_000])
        stream.finish()
        envelopes.append(out.getvalue())
    one, two = envelopes
    assert len(one) == len(plain) + sealing.OVERHEAD and one[0] == CODEC_ENCRYPTED
    assert sealing.parse(one)[1:] == (key_id(KEY), one[9:25], 0) and one[9:25] != two[9:25]
    assert sealer.open(one, context, lambda: "x") == plain == sealer.open(two, context, lambda: "x")
    opening = sealer.opening(one[:sealing.HEADER_BYTES], context, lambda: "x")
    pieces = [opening.update(memoryview(one)[i:min(i + 50_000, len(one) - 16)])
              for i in range(sealing.HEADER_BYTES, len(one) - 16, 50_000)]
    opening.finish(one[-16:])
    assert b"".join(pieces) == plain
    bad = sealer.opening(one[:sealing.HEADER_BYTES], context, lambda: "the object x")
    bad.update(one[sealing.HEADER_BYTES:-16])
    with pytest.raises(SealDamagedError, match=r"the object x.*authentication failed"):
        bad.finish(bytes(16))
    # Never compressed (what is streamed holds envelopes already): encrypted by a compressing
    # sealer too, and by one that only compresses written as a plain envelope.
    out = io.BytesIO()
    stream = Sealer(sealing.Keyring(KEY), compression="zstd").sealing(out, context)
    stream.write(b"x" * 10_000)
    stream.finish()
    assert out.getvalue()[0] == CODEC_ENCRYPTED and len(out.getvalue()) == 10_000 + sealing.OVERHEAD
    out = io.BytesIO()
    stream = Sealer(None, compression="zstd").sealing(out, context)
    stream.write(b"x" * 10_000)
    stream.finish()
    assert out.getvalue() == bytes((CODEC_PLAIN,)) + b"x" * 10_000 and stream.overhead == 1


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_an_encrypted_archive_snapshot_is_encrypted_as_it_is_spooled_never_whole_in_memory(
        tmp_path: Path, compression: str | None) -> None:
    import tracemalloc  # noqa: PLC0415

    url = f"file://{tmp_path}/archive"
    values = {f"k{i:03d}": os.urandom(512 << 10) for i in range(64)}  # 32 MiB
    with wal.open(tmp_path / "store", encryption=KEY, compression=compression, archive=url,
                  archive_snapshot_bytes=1 << 40) as store:
        for k, v in values.items():
            store.put(k, v)
        store.checkpoint()
        deadline = time.monotonic() + 30
        while store.stats()["archived_lsn"] < 64:  # the log's objects are not counted below
            assert time.monotonic() < deadline
            time.sleep(0.01)
        tracemalloc.start()
        try:
            lsn = store._ship_snapshot_now()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 16 << 20, peak  # sealed whole, the ciphertext alone was 32 MiB
    snap = (tmp_path / "archive" / "snap" / f"{lsn:020d}.snap").read_bytes()
    assert snap[0] == CODEC_ENCRYPTED and sealing.parse(snap)[3] == 0  # a session of its own, counter 0
    assert not any(v[:64] in snap for v in values.values())
    r = wal.restore(url, tmp_path / "r", encryption=KEY, lsn=lsn)
    assert r.snapshot_lsn == lsn
    with wal.open(tmp_path / "r", encryption=KEY, compression=compression) as restored:
        assert {k.decode(): v for k, v in restored.scan()} == values


def test_a_compressing_archive_snapshot_is_a_plain_envelope_spooled_and_restored_a_window_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that compresses without encrypting: its snapshot's values are compressed
    envelopes already, so the object is a plain envelope (codec 0x00), written as it is spooled
    and read through the restore's window past its codec byte."""
    from wal.archive import restore as restore_mod  # noqa: PLC0415

    window = 1 << 20
    monkeypatch.setattr(restore_mod, "_SNAPSHOT_WINDOW_BYTES", window)
    url = f"file://{tmp_path}/archive"
    values = {f"k{i:04d}": (b"%06d conversation turn text " % i) * 2000 for i in range(200)}
    with wal.open(tmp_path / "store", compression="zstd", archive=url, archive_snapshot_bytes=1 << 40) as store:
        for k, v in values.items():
            store.put(k, v)
        store.checkpoint()
        lsn = store._ship_snapshot_now()
    snap = (tmp_path / "archive" / "snap" / f"{lsn:020d}.snap").read_bytes()
    assert snap[0] == CODEC_PLAIN and snap[1:9] == b"AGWALSNP"
    assert len(snap) < sum(map(len, values.values())) // 5  # its values compressed, each on its own
    reads = _watch_sealed_reads(monkeypatch)
    r = wal.restore(url, tmp_path / "r", lsn=lsn)
    assert r.snapshot_lsn == lsn
    with wal.open(tmp_path / "r", compression="zstd") as restored:
        assert {k.decode(): v for k, v in restored.scan()} == values
    assert [type(read).__name__ for read in reads] == ["EnvelopedRead"]


def test_a_restore_from_the_empty_states_snapshot_checks_it_whole_though_it_loads_nothing(tmp_path: Path) -> None:
    """An archive whose writer shipped its first snapshot (the empty state, LSN 0) and nothing
    else restores from that snapshot: nothing to load, but its tag is checked before its header
    starts the chain, so a changed byte is refused, as in any other snapshot."""
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "store", encryption=KEY, archive=url):
        pass
    snap = tmp_path / "archive" / "snap" / f"{0:020d}.snap"
    assert snap.exists() and not list((tmp_path / "archive").glob("log/*"))
    assert wal.restore(url, tmp_path / "r", encryption=KEY).lsn == 0
    plain_envelope = snap.read_bytes()
    # A plain envelope in its place (codec 0x00): refused from its first byte, not downloaded.
    snap.write_bytes(bytes((CODEC_PLAIN,)) + b"AGWALSNP" + bytes(200))
    with pytest.raises(SealDamagedError, match=r"snap/0+\.snap of .* is not encrypted, in an encrypted archive"):
        wal.restore(url, tmp_path / "r3", encryption=KEY)
    snap.write_bytes(plain_envelope)
    data = bytearray(snap.read_bytes())
    data[sealing.HEADER_BYTES + 45] ^= 1  # inside the snapshot's header: its writer_id
    snap.write_bytes(bytes(data))
    with pytest.raises(SealDamagedError, match=r"snap/0+\.snap.*authentication failed"):
        wal.restore(url, tmp_path / "r2", encryption=KEY)


def test_the_envelope_is_as_format_md_section_19_writes_it_checked_with_the_aead_directly() -> None:
    """FORMAT.md §19's worked example, decrypted from the spec alone (HKDF, AES-GCM, nonce, AAD)."""
    from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF  # noqa: PLC0415

    assert key_id(KEY).hex() == "e1a149a424b0b767"
    sealer = Sealer(sealing.Keyring(KEY))
    env = sealer.seal(b"hi", context := sealing.CONTEXT_VALUE + b"k")
    assert len(env) == 51 and env[0] == 0x80 and env[1:9] == bytes.fromhex("e1a149a424b0b767")
    session, counter = env[9:25], env[25:33]
    assert counter == bytes(8)
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=session, info=b"agentwal seal v1").derive(KEY)
    assert AESGCM(derived).decrypt(counter + bytes(4), env[33:], env[:33] + context) == b"hi"
    assert sealer.seal(b"hi", context)[25:33] == (1).to_bytes(8, "little")  # the counter goes up
    assert sealing.parse(env) == (0x80, env[1:9], session, 0)


def test_a_store_restored_with_a_new_and_an_old_key_opens_with_the_old_one_its_values_are_under(
        tmp_path: Path) -> None:
    """A restore given [new, old] listed only the new key in the restored STORE: an open with the
    old key, the one every value of the archive is under, was refused as a wrong key."""
    url = (tmp_path / "archive").as_uri()
    with wal.open(tmp_path / "src", archive=url, encryption=KEY) as store:
        store.put(b"k", SECRET)
    wal.restore(url, tmp_path / "r", encryption=[KEY2, KEY])
    with wal.open(tmp_path / "r", encryption=KEY) as store:
        assert store.get(b"k") == SECRET


def test_a_store_restored_after_a_rotation_with_the_new_key_alone_opens_with_the_old_key_its_values_are_under(
        tmp_path: Path) -> None:
    """Restored with the new key alone, the store's STORE listed that key only, though most of
    its values are under the old one: an open with the old key was refused as a wrong key. The
    open now looks at the values' envelopes before refusing; a key no value is under is still
    refused."""
    url = (tmp_path / "archive").as_uri()
    with wal.open(tmp_path / "src", archive=url, encryption=KEY) as store:
        for i in range(20):
            store.put(f"k/{i}", b"old %d" % i)
    with wal.open(tmp_path / "src", archive=url, encryption=[KEY2, KEY]) as store:
        store.put("k/new", b"new", durability="replicated")
    wal.restore(url, tmp_path / "r", encryption=KEY2)
    with wal.open(tmp_path / "r", encryption=KEY, readonly=True) as store:
        assert store.get("k/7") == b"old 7"
        with pytest.raises(MissingKeyError, match=key_id(KEY2).hex()):
            store.get("k/new")
    with pytest.raises(WrongKeyError):
        wal.open(tmp_path / "r", encryption=bytes(range(2, 34)))
    with wal.open(tmp_path / "r", encryption=[KEY2, KEY]) as store:  # both: everything
        assert store.get("k/7") == b"old 7" and store.get("k/new") == b"new"


@pytest.mark.parametrize("options", [{"encryption": KEY}, {"compression": "zstd"}])
def test_a_key_that_is_not_valid_unicode_is_refused_as_an_argument_by_a_sealed_put(
        tmp_path: Path, options: dict[str, Any]) -> None:
    with wal.open(tmp_path, **options) as store:
        with pytest.raises(wal.ArgumentError):
            store.put("\ud800", b"v")
        with pytest.raises(wal.ArgumentError):
            store.put("\ud800", b"v" * 4096, durability="sync")


def test_a_store_file_lost_after_an_unclean_stop_and_a_restart_takes_no_plaintext(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """STORE lost, and the state left by a process that died before the machine restarted: a
    read-only open of the state is refused until a writable open repairs it, so how the store is
    sealed cannot be read first. An open compressing only, or without options, was taken as one
    of a new (or plain) store: plaintext went in, and the owner's open with the key was refused
    afterwards. Now they are refused, nothing written; the open with the key opens it."""
    subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, time, wal
        s = wal.open({str(tmp_path)!r}, encryption={KEY!r})
        s.put(b"k", {SECRET!r})
        s.checkpoint()
        s.put(b"k2", {SECRET!r})
        time.sleep(0.5)  # applied: the state moves past its checkpoint
        os._exit(0)  # no close: the state is not closed cleanly
        """)], check=True)
    monkeypatch.setenv("AGENTWAL_BOOT_ID", "after-a-restart")
    with pytest.raises(wal.StateError, match="a read-only open cannot repair that"):
        State(str(tmp_path / "state"), readonly=True)
    (tmp_path / "STORE").unlink()
    for options in ({"compression": "zstd"}, {}):
        with pytest.raises(wal.CorruptionError, match="STORE is missing"):
            wal.open(tmp_path, **options)
        assert not (tmp_path / "STORE").exists(), options
    with wal.open(tmp_path, encryption=KEY) as store:
        assert store.get(b"k") == SECRET and store.get(b"k2") == SECRET
        store.put(b"k3", SECRET)
    assert json.loads((tmp_path / "STORE").read_text())["sealed"] == {
        "encrypted": True, "key_ids": [sealing.key_id(KEY).hex()]}
    assert SECRET not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


def test_a_compressed_only_store_whose_store_file_was_lost_is_not_opened_with_a_key(tmp_path: Path) -> None:
    """The state records a compressed-only store: an open with a key, STORE missing, is refused as
    it is with STORE there (it wrote a STORE that said encrypted and listed no key: refused as
    damaged at every open after)."""
    with wal.open(tmp_path, compression="zstd") as store:
        store.put(b"k", SECRET)
    (tmp_path / "STORE").unlink()
    with pytest.raises(wal.ArgumentError, match="created without encryption"):
        wal.open(tmp_path, encryption=KEY)
    assert not (tmp_path / "STORE").exists()
    with wal.open(tmp_path, compression="zstd") as store:
        assert store.get(b"k") == SECRET


def test_a_store_file_replaced_by_one_that_holds_together_but_not_with_the_state_is_refused(tmp_path: Path) -> None:
    """An encrypted store's STORE replaced by a plain-sealed one ({"encrypted": false, "key_ids":
    []}, consistent in itself): it opened without a key, took new values in the clear, and its
    state's record was overwritten to match."""
    with wal.open(tmp_path, encryption=KEY) as store:
        store.put(b"k", SECRET)
    meta = json.loads((tmp_path / "STORE").read_text())
    meta["sealed"] = {"encrypted": False, "key_ids": []}
    (tmp_path / "STORE").write_text(json.dumps(meta))
    for options in ({}, {"compression": "zstd"}):
        with pytest.raises(wal.CorruptionError, match="but its state records that it is encrypted"):
            wal.open(tmp_path, **options)
    (tmp_path / "STORE").unlink()
    with wal.open(tmp_path, encryption=KEY) as store:
        assert store.get(b"k") == SECRET
    assert SECRET not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


def test_a_follower_held_back_by_a_key_it_was_not_given_reports_its_lag_in_lsns(tmp_path: Path) -> None:
    """After a rotation the writer ships objects under the new key; a follower given only the
    old one stays at its LSN. Its lag in LSNs read 0 (the end it had seen was its own), so only
    the error and the growing lag in seconds told it was stuck."""
    url = f"file://{tmp_path}/a"
    with wal.open(tmp_path / "s", encryption=KEY, archive=url) as s:
        for i in range(20):
            s.put(f"k/{i}", b"v")
    follower = wal.follow(url, tmp_path / "f", encryption=KEY, poll_ms=20)
    try:
        wait_until(lambda: follower.lsn == 20)
        with wal.open(tmp_path / "s", encryption=[KEY2, KEY], archive=url) as s:
            for i in range(100):
                s.put(f"k/{i}", b"w")
            end = s.watermarks.durable
        wait_until(lambda: follower.stats()["follower_error"] is not None)
        stats, lag = follower.stats(), follower.lag()
        assert follower.lsn == 20 and follower.get("k/5") == b"v"
        assert key_id(KEY2).hex() in stats["follower_error"]
        # At least the first LSN of every object listed (an encrypted object's last LSN is in its
        # sealed header, which this follower cannot read: a group object is known by its first).
        assert 20 < stats["archive_end_lsn"] <= end and lag["lag_lsns"] == stats["archive_end_lsn"] - 20
    finally:
        follower.close()


def test_a_keyed_follower_whose_writer_ships_between_its_look_and_its_listing_says_the_archive_is_plain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race behind a keyed follower of a plain archive calling its first object damaged
    ("unknown codec"): its poll's look for the manifest found nothing shipped yet, and the
    listing right after found the writer's first object. Made certain here: the first look
    after the writer shipped is answered "nothing yet"."""
    plain_url = f"file://{tmp_path}/b"
    (tmp_path / "b").mkdir()
    real = follow_mod.holds_nothing
    lied: list[bool] = []

    def one_look_too_early(objects: object) -> bool:
        held = real(objects)
        if not held and not lied:
            lied.append(True)
            return True
        return held

    monkeypatch.setattr(follow_mod, "holds_nothing", one_look_too_early)
    keyed = wal.follow(plain_url, tmp_path / "h", encryption=KEY, poll_ms=20)
    try:
        with wal.open(tmp_path / "p", archive=plain_url) as p:
            p.put("k/1", b"plain", durability="replicated")
        wait_until(lambda: keyed.stats()["follower_error"] is not None)
        assert lied and keyed.lsn == 0 and "without encryption" in keyed.stats()["follower_error"]
    finally:
        keyed.close()


def test_a_standby_follower_started_before_its_writer_follows_an_encrypted_archive(tmp_path: Path) -> None:
    """A follower (and a restore) given the key of an archive that holds nothing yet was refused
    as "written by a store without encryption": a standby could not be started first. Taken as
    sealed as it is told until the writer ships; then held to the writer's manifest: a keyless
    follower of an encrypted writer says it needs the key (it called the objects damaged), one
    given a key for a plain writer says the archive is not encrypted."""
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    url = f"file://{tmp_path}/a"
    with wal.open(wal.restore(url, tmp_path / "r", encryption=KEY).path, encryption=KEY) as restored:
        assert restored.stats()["encryption"] and restored.get("k/1") is None
    standby = wal.follow(url, tmp_path / "f", encryption=KEY, poll_ms=20)
    keyless = wal.follow(url, tmp_path / "g", poll_ms=20)
    plain_url = f"file://{tmp_path}/b"
    keyed = wal.follow(plain_url, tmp_path / "h", encryption=KEY, poll_ms=20)
    try:
        with wal.open(tmp_path / "s", encryption=KEY, archive=url) as s:
            for i in range(5):
                s.put(f"k/{i}", b"secret %d" % i, durability="replicated")
        with wal.open(tmp_path / "p", archive=plain_url) as p:
            p.put("k/1", b"plain", durability="replicated")
        wait_until(lambda: standby.lsn == 5)
        assert standby.get("k/3") == b"secret 3"
        wait_until(lambda: keyless.stats()["follower_error"] is not None)
        assert keyless.lsn == 0 and "MissingKeyError" in keyless.stats()["follower_error"]
        assert "is encrypted: pass encryption=KEY" in keyless.stats()["follower_error"]
        wait_until(lambda: keyed.stats()["follower_error"] is not None)
        assert keyed.lsn == 0 and "without encryption" in keyed.stats()["follower_error"]
    finally:
        standby.close()
        keyless.close()
        keyed.close()
    with pytest.raises(wal.ArgumentError, match="without encryption"):  # once it holds objects
        wal.restore(plain_url, tmp_path / "r2", encryption=KEY)
