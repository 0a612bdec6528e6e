"""Idempotency keys travel with the archive's snapshots (FORMAT.md §18, snapshot version 2): a
store restored from a snapshot, or a follower promoted after starting from one, knows a retry of
a commit the snapshot holds for what it is, and does not make it a second time. The failover
this is for: a primary lost before its answer reached the agent, which retries on the new one."""

from __future__ import annotations

import hashlib
import os
import struct
import time
from pathlib import Path

import crcmod.predefined
import pytest

import wal
import wal.store.state
from wal.archive import layout
from wal.archive.objects import FileObjects

_crc32c = crcmod.predefined.mkCrcFun("crc-32c")


def _commit(store: wal.Store, idem: str, key: str, value: bytes) -> tuple[int, bool]:
    with store.transaction(idempotency_key=idem) as tx:
        tx.put(key, value)
    assert tx.lsn is not None
    return tx.lsn, tx.deduplicated


def _archived_with_snapshot_after(tmp_path: Path) -> tuple[str, dict[str, int], int]:
    """A file:// archive whose newest snapshot holds three commits made with idempotency keys
    (and every log object up to it): returns the URL, each key's LSN and the snapshot's LSN."""
    url = f"file://{tmp_path}/a"
    with wal.open(tmp_path / "s", archive=url, archive_rpo_ms=200) as store:
        lsns = {f"step-{i}": _commit(store, f"step-{i}", f"k{i}", b"first")[0] for i in range(3)}
        snapshot_lsn = store._ship_snapshot_now()
    assert snapshot_lsn >= max(lsns.values())
    return url, lsns, snapshot_lsn


def test_a_store_restored_from_a_snapshot_knows_a_retry_of_a_commit_the_snapshot_holds(tmp_path: Path) -> None:
    url, lsns, snapshot_lsn = _archived_with_snapshot_after(tmp_path)
    report = wal.restore(url, tmp_path / "r")
    assert report.snapshot_lsn == snapshot_lsn  # restored from the snapshot, not from the log
    with wal.open(tmp_path / "r") as restored:
        assert _commit(restored, "step-1", "k1", b"retried") == (lsns["step-1"], True)
        assert restored.get("k1") == b"first"
        assert _commit(restored, "step-new", "k9", b"new")[1] is False


def test_a_follower_promoted_after_starting_from_a_snapshot_knows_a_retry_of_the_old_primarys_commit(
        tmp_path: Path) -> None:
    url, lsns, _ = _archived_with_snapshot_after(tmp_path)
    replica = wal.follow(url, tmp_path / "f", poll_ms=20)
    new_primary = replica.promote()
    try:
        assert _commit(new_primary, "step-2", "k2", b"retried") == (lsns["step-2"], True)
        assert new_primary.get("k2") == b"first"
    finally:
        new_primary.close()


def test_a_snapshot_is_laid_out_as_format_md_says_with_its_idempotency_entries() -> None:
    entries = [(b"a", 3, b"x"), (b"b", 4, b"")]
    idem = [(b"req-1", 3, 1_700_000_000_000), (b"req-2", 4, 1_700_000_000_001)]
    data = layout.encode_snapshot(9, 1234, b"w" * 16, entries, idem)
    magic, version, flags, reserved, lsn, taken, n_entries, writer, n_idem = struct.unpack_from(
        "<8sHHIQQQ16sQ", data, 0)
    assert (magic, version, flags, reserved, lsn, taken, n_entries, writer, n_idem) == (
        b"AGWALSNP", 2, 0, 0, 9, 1234, 2, b"w" * 16, 2)
    off = 64
    for key, ver, value in entries:
        klen, vlen, v, crc = struct.unpack_from("<IIQI", data, off)
        assert (klen, vlen, v) == (len(key), len(value), ver)
        assert crc == _crc32c(struct.pack("<IIQ", klen, vlen, v) + key + value)
        off += 20 + klen + vlen
    for key, commit_lsn, time_ms in idem:
        klen, got_lsn, got_time, crc = struct.unpack_from("<IQQI", data, off)
        assert (klen, got_lsn, got_time) == (len(key), commit_lsn, time_ms)
        assert crc == _crc32c(struct.pack("<IQQ", klen, got_lsn, got_time) + key)
        assert data[off + 24:off + 24 + klen] == key
        off += 24 + klen
    assert data[off:] == hashlib.sha256(data[:off]).digest()
    assert layout.decode_snapshot(data, layout.snap_name(9)).idem == idem


def _version_1_snapshot(lsn: int, entries: list[tuple[bytes, int, bytes]]) -> bytes:
    """A snapshot as version 1 wrote it (FORMAT.md §18), made with struct, not the encoder: its
    header's last 8 bytes reserved (zero), no idempotency entries."""
    body = struct.pack("<8sHHIQQQ16s8s", b"AGWALSNP", 1, 0, 0, lsn, int(time.time() * 1000), len(entries),
                       os.urandom(16), bytes(8))
    for key, version, value in entries:
        lengths = struct.pack("<IIQ", len(key), len(value), version)
        body += lengths + struct.pack("<I", _crc32c(lengths + key + value)) + key + value
    return body + hashlib.sha256(body).digest()


def test_a_version_1_snapshot_of_an_older_archive_is_restored(tmp_path: Path) -> None:
    entries = [(b"k%03d" % i, i + 1, b"v%d" % i) for i in range(50)]
    FileObjects(str(tmp_path / "a")).put(layout.snap_name(700), _version_1_snapshot(700, entries))
    report = wal.restore(f"file://{tmp_path}/a", tmp_path / "r")
    assert (report.lsn, report.snapshot_lsn) == (700, 700)
    with wal.open(tmp_path / "r") as store:
        assert [(k, store.version(k), v) for k, v in store.scan()] == entries


def test_a_damaged_idempotency_entry_in_a_snapshot_is_refused_by_name_and_nothing_is_restored(tmp_path: Path) -> None:
    name = layout.snap_name(40)
    data = layout.encode_snapshot(40, 0, b"w" * 16, [(b"k", 40, b"v")], [(b"req-1", 40, 5)])
    body = bytearray(data[:-layout.DIGEST])
    body[-1] ^= 1  # the key's last byte, under a trailer that matches: only the entry's CRC can tell
    FileObjects(str(tmp_path / "a")).put(name, bytes(body) + hashlib.sha256(body).digest())
    with pytest.raises(wal.CorruptionError, match=r"snap/0+40\.snap .*idempotency entry 0 fails its CRC-32C"):
        wal.restore(f"file://{tmp_path}/a", tmp_path / "r")
    assert sorted(os.listdir(tmp_path)) == ["a"]


def test_a_snapshots_idempotency_entries_are_loaded_a_chunk_at_a_time(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded whole, a million keys held ~0.4 GB of Python objects during a restore."""
    monkeypatch.setattr(layout, "IDEM_CHUNK", 100)
    idem = [(b"req-%05d" % i, 1 + i % 40, int(time.time() * 1000)) for i in range(1_050)]
    data = layout.encode_snapshot(40, 0, b"w" * 16, [(b"k", 40, b"v")], idem)
    FileObjects(str(tmp_path / "a")).put(layout.snap_name(40), data)
    loaded: list[int] = []
    real = wal.store.state.State.load_idem

    def counting(self: wal.store.state.State, items: list[tuple[bytes, int, int]]) -> None:
        loaded.append(len(items))
        real(self, items)

    monkeypatch.setattr(wal.store.state.State, "load_idem", counting)
    wal.restore(f"file://{tmp_path}/a", tmp_path / "r")
    assert loaded == [100] * 10 + [50]
    with wal.open(tmp_path / "r") as store:
        for i in (0, 99, 100, 1_049):
            assert _commit(store, f"req-{i:05d}", "again", b"x") == (1 + i % 40, True)


def test_a_snapshot_idempotency_key_over_the_key_limit_is_damage_named_in_the_snapshot(tmp_path: Path) -> None:
    name = layout.snap_name(40)
    FileObjects(str(tmp_path / "a")).put(name, layout.encode_snapshot(40, 0, b"w" * 16, [], [(b"r" * 512, 40, 5)]))
    with pytest.raises(wal.CorruptionError, match=r"snap/0+40\.snap .*idempotency entry 0 has a bad key length"):
        wal.restore(f"file://{tmp_path}/a", tmp_path / "r")
