"""Fuzz target: opening sealed values (wal/crypto/sealing.py, FORMAT.md §19) from arbitrary bytes.

For every input, a Sealer with a key and a trained-dictionary-free zstd codec opens bytes
that an attacker or a damaged disk could hand it, and must either return the exact value that
was sealed or raise `SealDamagedError` / `MissingKeyError` -- never another exception, and for an
encrypted envelope never other bytes. The first input byte chooses how the rest becomes an envelope:

    b % 4 == 0  raw: the rest is the envelope
    b % 4 == 1  a valid envelope of the rest (compressed and encrypted), then 1..8 byte flips,
                truncations or extensions at offsets read from the input
    b % 4 == 2  as 1, unencrypted (plain or zstd): the codec byte and zstd frame under attack
    b % 4 == 3  a valid envelope, its key id replaced: a key this handle was never given

Run under libFuzzer like the others (``python fuzz/fuzz_envelope.py [flags] [corpus]``);
tests/test_fuzz_smoke.py runs seeded random inputs through ``test_one_input``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import Finding

from wal.crypto.sealing import Keyring, Sealer
from wal.errors import MissingKeyError, SealDamagedError

KEY = bytes(range(32))
CONTEXT = b"agentwal value\x00fuzz"
_encrypting = Sealer(Keyring(KEY), "zstd", threshold=8)
_plain = Sealer(None, "zstd", threshold=8)


def _open(sealer: Sealer, envelope: bytes) -> bytes | None:
    try:
        return sealer.open(envelope, CONTEXT, lambda: "the fuzzed value")
    except (SealDamagedError, MissingKeyError):
        return None
    except Exception as exc:  # anything else is a finding
        raise Finding(f"opening {envelope[:40]!r}... raised {type(exc).__name__}: {exc}") from exc


def test_one_input(data: bytes) -> None:
    if not data:
        return
    mode, rest = data[0] & 3, data[1:]
    if mode == 0:
        _open(_encrypting, rest)
        _open(_plain, rest)
        return
    sealer = _plain if mode == 2 else _encrypting
    value = rest[: len(rest) // 2] * (1 + data[0] % 5)
    envelope = bytearray(sealer.seal(value, CONTEXT))
    if mode == 3:
        envelope[1:9] = bytes(8 - len(rest[:8])) + rest[:8]
        if bytes(envelope[1:9]) == _encrypting.keys.current_id:  # type: ignore[union-attr]
            return
        if _open(sealer, bytes(envelope)) is not None:
            raise Finding("an envelope under an unknown key id opened")
        return
    ops = rest[len(rest) // 2:]
    for i in range(0, min(len(ops), 24) - 2, 3):
        kind, where, what = ops[i] % 3, ops[i + 1] * 7 % max(1, len(envelope)), ops[i + 2]
        if kind == 0 and envelope:
            envelope[where] ^= what or 1
        elif kind == 1:
            del envelope[where:]
        else:
            envelope[where:where] = bytes([what])
    got = _open(sealer, bytes(envelope))
    # An unencrypted envelope has no integrity of its own (the log's and the state's CRCs hold it):
    # it may open to other bytes; an encrypted one never does.
    if mode == 1 and got is not None and got != value:
        raise Finding(f"a changed envelope opened to other bytes ({len(got)} vs {len(value)})")


if __name__ == "__main__":
    from _common import run_atheris

    run_atheris(test_one_input)
