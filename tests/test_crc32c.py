"""The C CRC-32C (hardware and software paths, and the dispatcher) against crcmod's ``crc-32c``.

crcmod is an independent implementation: if the C core and crcmod agree on every
length 0..4096, on large inputs and on unaligned starts, the framing checksums of
the log are the standard CRC-32C (Castagnoli) and not an accident of our code.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import crcmod.predefined
import pytest

from wal._bindings import ffi, lib

_oracle = crcmod.predefined.mkCrcFun("crc-32c")
HW = bool(lib.wal_crc32c_hw_available())


def _c_fun(name: str) -> Callable[[int, bytes], int]:
    fn = getattr(lib, name)

    def crc(seed: int, data: bytes) -> int:
        buf = ffi.from_buffer("uint8_t[]", data) if data else ffi.NULL
        return int(fn(seed, buf, len(data)))

    return crc


IMPLS = [
    pytest.param("wal_crc32c", id="dispatch"),
    pytest.param("wal_crc32c_sw", id="software"),
    pytest.param(
        "wal_crc32c_hw",
        id="sse42",
        marks=pytest.mark.skipif(not HW, reason="CPU has no SSE4.2 crc32 instruction"),
    ),
]


def _random_bytes(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


def test_known_check_value_of_crc32c() -> None:
    # The catalogue check value of CRC-32C: crc("123456789") = 0xE3069283.
    assert _oracle(b"123456789") == 0xE3069283
    for name in ("wal_crc32c", "wal_crc32c_sw") + (("wal_crc32c_hw",) if HW else ()):
        assert _c_fun(name)(0, b"123456789") == 0xE3069283, name


@pytest.mark.parametrize("impl", IMPLS)
def test_every_length_from_0_to_4096_matches_crcmod(impl: str) -> None:
    crc = _c_fun(impl)
    rng = random.Random(0xC5C32C)
    block = _random_bytes(rng, 4096 + 64)
    for n in range(4097):
        start = rng.randrange(0, 64)
        data = block[start : start + n]
        assert crc(0, data) == _oracle(data), f"{impl}: length {n}"


@pytest.mark.parametrize("impl", IMPLS)
def test_all_zero_and_all_ones_inputs_match_crcmod(impl: str) -> None:
    crc = _c_fun(impl)
    for n in (1, 7, 8, 9, 63, 64, 65, 1000, 4096):
        for fill in (b"\x00", b"\xff"):
            data = fill * n
            assert crc(0, data) == _oracle(data), f"{impl}: {fill!r} * {n}"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("size", [1 << 20, (16 << 20) + 3], ids=["1MiB", "16MiB+3"])
def test_large_inputs_match_crcmod(impl: str, size: int) -> None:
    crc = _c_fun(impl)
    data = random.Random(size).randbytes(size)
    assert crc(0, data) == _oracle(data)


@pytest.mark.parametrize("impl", IMPLS)
def test_unaligned_starts_inside_one_buffer_match_crcmod(impl: str) -> None:
    """Pointers at every offset 0..15 of one C buffer: the word-at-a-time loops must not assume alignment."""
    fn = getattr(lib, impl)
    rng = random.Random(7)
    raw = _random_bytes(rng, 8192)
    cbuf = ffi.new("uint8_t[]", raw)
    for start in range(16):
        for n in (0, 1, 3, 8, 15, 16, 17, 31, 255, 1024, 4000):
            got = int(fn(0, cbuf + start, n))
            assert got == _oracle(raw[start : start + n]), f"{impl}: start {start}, length {n}"


@pytest.mark.parametrize("impl", IMPLS)
def test_chaining_crc_of_concatenation_equals_crc_continued_from_first_part(impl: str) -> None:
    crc = _c_fun(impl)
    rng = random.Random(11)
    for _ in range(300):
        a = _random_bytes(rng, rng.randrange(0, 600))
        b = _random_bytes(rng, rng.randrange(0, 600))
        whole = crc(0, a + b)
        assert whole == _oracle(a + b)
        assert crc(crc(0, a), b) == whole


def test_chaining_across_many_pieces_matches_one_shot() -> None:
    rng = random.Random(12)
    data = _random_bytes(rng, 100_000)
    cuts = sorted(rng.sample(range(1, len(data)), 50))
    for name in ("wal_crc32c", "wal_crc32c_sw") + (("wal_crc32c_hw",) if HW else ()):
        crc = _c_fun(name)
        running = 0
        prev = 0
        for cut in [*cuts, len(data)]:
            running = crc(running, data[prev:cut])
            prev = cut
        assert running == _oracle(data), name


@pytest.mark.parametrize(("rng_seed", "count", "max_len"), [(13, 2000, 300), (16, 300, 70_000)],
                         ids=["short", "long, across the three-stream blocks"])
def test_hardware_and_software_paths_agree_on_random_inputs(rng_seed: int, count: int, max_len: int) -> None:
    if not HW:
        pytest.skip("CPU has no SSE4.2 crc32 instruction")
    hw, sw = _c_fun("wal_crc32c_hw"), _c_fun("wal_crc32c_sw")
    rng = random.Random(rng_seed)
    for _ in range(count):
        seed = rng.getrandbits(32)
        data = _random_bytes(rng, rng.randrange(0, max_len))
        assert hw(seed, data) == sw(seed, data)


def test_dispatcher_uses_a_path_that_matches_both_implementations() -> None:
    data = random.Random(14).randbytes(12345)
    assert _c_fun("wal_crc32c")(0, data) == _c_fun("wal_crc32c_sw")(0, data) == _oracle(data)


@pytest.mark.parametrize("impl", IMPLS)
def test_lengths_around_every_three_stream_block_size_match_crcmod(impl: str) -> None:
    """The hardware path folds three blocks of 64 B .. 8 KiB at once and joins them with a
    carry-less multiply (native/crc32c.c): each block size, at its edges, from a running seed."""
    crc = _c_fun(impl)
    rng = random.Random(15)
    block = _random_bytes(rng, 3 * 8192 * 2 + 64)
    for size in (64 << i for i in range(8)):
        for n in (3 * size - 1, 3 * size, 3 * size + 1, 3 * size + 8, 6 * size - 9, 6 * size):
            start = rng.randrange(0, 64)
            data = block[start : start + n]
            seed_data = _random_bytes(rng, rng.randrange(0, 20))
            assert crc(crc(0, seed_data), data) == _oracle(seed_data + data), f"{impl}: length {n}"
