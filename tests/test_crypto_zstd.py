"""The zstd codec over both bindings (wal/crypto/zstd.py): `zstandard`, and the standard
library's `compression.zstd` API (Python 3.14+; `backports.zstd` here). A store written under one
reads under the other, dictionaries included, and damage is refused the same way."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import wal
from wal.crypto import sealing, zstd
from wal.crypto.sealing import CODEC_ZSTD
from wal.errors import SealDamagedError
from wal.store.store import Store

STDLIB = "compression.zstd" if sys.version_info >= (3, 14) else "backports.zstd"
BINDINGS = ("zstandard", STDLIB)


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """use(name): make `name` the binding every new handle takes."""
    def choose(name: str) -> None:
        monkeypatch.setenv("AGENTWAL_ZSTD", name)
        zstd.binding.cache_clear()
        assert zstd.binding().name == name

    yield choose
    zstd.binding.cache_clear()


def _messages(n: int) -> list[bytes]:
    return [json.dumps({"role": "user" if i % 2 else "assistant", "turn": i,
                        "content": f"step {i}: read the file, then summarise section {i % 7} for the report"}).encode()
            for i in range(n)]


@pytest.mark.parametrize(("writer", "reader"), [(a, b) for a in BINDINGS for b in BINDINGS])
def test_a_store_compressed_under_one_binding_reads_under_the_other(tmp_path: Path, use, writer: str,
                                                                     reader: str) -> None:
    use(writer)
    samples = _messages(2000)
    dictionary = sealing.train_dictionary(samples, 4096)
    values = {f"doc{i}": json.dumps({"i": i, "text": "agent state " * (10 + i)}).encode() for i in range(20)}
    small = {f"msg{i}": samples[i] for i in range(0, 2000, 97)}
    with wal.open(tmp_path / "s", compression="zstd", compression_dict=dictionary, compression_threshold=32) as s:
        for k, v in {**values, **small}.items():
            s.put(k, v)
        envelopes = {k: Store.get(s, k) for k in values}  # the envelopes (the plain store's read)
    assert all(e is not None and e[0] == CODEC_ZSTD for e in envelopes.values())
    assert sum(len(e or b"") for e in envelopes.values()) < sum(map(len, values.values())) / 3
    use(reader)
    with wal.open(tmp_path / "s", compression="zstd", compression_dict=dictionary, readonly=True) as s:
        assert {k.decode(): v for k, v in s.scan()} == {**values, **small}


def test_the_standard_library_binding_refuses_damage_and_frames_without_a_size(tmp_path: Path, use) -> None:
    use(STDLIB)
    with wal.open(tmp_path / "s", compression="zstd") as s:
        s.put("k", b"conversation " * 200)
        envelope = Store.get(s, b"k")
        assert envelope is not None
    sealer = sealing.Sealer(None, "zstd")
    where = lambda: "the value of key b'k'"  # noqa: E731
    assert sealer.open(envelope, b"", where) == b"conversation " * 200
    for i in range(1, len(envelope)):
        damaged = bytearray(envelope)
        damaged[i] ^= 0x10
        try:
            out = sealer.open(bytes(damaged), b"", where)
        except SealDamagedError:
            continue
        # A flip zstd cannot notice without a checksum is caught by the frame's own checksum
        # (written where no AEAD tag authenticates the value): nothing else may come back.
        assert out == b"conversation " * 200, i
    unsized = zstd.load("zstandard")._z.ZstdCompressor(write_content_size=False).compress(b"x" * 500)  # type: ignore[attr-defined]
    with pytest.raises(SealDamagedError, match="does not declare its size"):
        sealer.open(bytes([CODEC_ZSTD]) + unsized, b"", where)


def test_without_any_binding_compression_is_a_clear_error(tmp_path: Path, use, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> zstd.Binding:
        raise ImportError(name)

    monkeypatch.setattr(zstd, "load", missing)
    monkeypatch.delenv("AGENTWAL_ZSTD", raising=False)
    zstd.binding.cache_clear()
    with pytest.raises(wal.ArgumentError, match=r"zstandard.*compression\.zstd.*backports\.zstd"):
        wal.open(tmp_path / "s", compression="zstd")
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())


@pytest.mark.parametrize("binding", BINDINGS)
def test_an_envelope_is_one_frame_of_its_declared_size_and_nothing_after_it(use, binding: str) -> None:
    """The size guard reads the first frame's header: bytes after that frame were ignored by one
    binding, and decoded by the other (a second frame declaring no size, of any size, was
    decompressed whole). Both refuse them now, the same way."""
    use(binding)
    z = zstd.load("zstandard")._z  # type: ignore[attr-defined]
    frame = z.ZstdCompressor(write_content_size=True, write_checksum=True).compress(b"A" * 200)
    unsized = z.ZstdCompressor(write_content_size=False).compress(b"\0" * (8 << 20))
    sealer = sealing.Sealer(None, "zstd")
    where = lambda: "the value of key b'k'"  # noqa: E731
    assert sealer.open(bytes([CODEC_ZSTD]) + frame, b"", where) == b"A" * 200
    for after in (b"JUNKJUNK", frame, unsized):
        with pytest.raises(SealDamagedError, match="does not decode"):
            sealer.open(bytes([CODEC_ZSTD]) + frame + after, b"", where)
