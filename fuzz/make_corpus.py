"""Generate the seed corpus in fuzz/corpus/segment and fuzz/corpus/open (committed; keep it small).

    python fuzz/make_corpus.py            # rewrite both corpora
    python fuzz/make_corpus.py --check    # exit 1 if the committed corpora differ from a fresh run

Seeds for fuzz_segment: hand-made segment images, one per validity rule of FORMAT.md
section 8 (every reason string, every status), the golden file, as raw inputs (mode 0)
and as checksum-fix-up inputs (mode 1); plus structure-aware inputs (modes 2 and 3) from a
seeded generator, one per (mode, status, reason) they reach. Seeds for fuzz_open: inputs
from a seeded generator, kept when they reach an outcome (scan verdict, open result,
recovery mode, store or log) no earlier seed reached. Inputs that run into a finding are
left out (a seed corpus must pass, or every run would stop at once); they belong in
fuzz/findings/. Deterministic for a given library: the same code gives the same files.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from collections.abc import Callable, Iterable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fuzz_open
import fuzz_segment
from _common import Finding

from wal.log import format as wf

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(os.path.dirname(HERE), "tests", "data", "golden_two_records.wal")
LOG_ID = 0x0123456789ABCDEF
SALT = 0x5A17C0FFEE15900D
OTHER = 0x7777777712345678
MAX_INPUT = 1500


def _header(**kw: int) -> bytes:
    fields = {"log_id": LOG_ID, "segment_no": 1, "first_lsn": 1, "salt": SALT, "prealloc_bytes": 4096}
    fields.update(kw)
    return wf.encode_segment_header(**fields)


def _rec(lsn: int, payload: bytes = b"payload", **kw: int) -> bytes:
    return wf.encode_record(lsn=lsn, payload=payload, salt=SALT, **kw)


def crafted_segments() -> list[bytes]:
    """One image per rule of FORMAT.md section 8, plus ordinary ones."""
    h = _header()
    r1, r2, r3 = _rec(1, b"hello"), _rec(2, b"agent state v1"), _rec(3, b"")
    seal = wf.encode_seal(last_lsn=2, salt=SALT)
    with open(GOLDEN, "rb") as f:
        golden = f.read()
    bad_crc = bytearray(r2)
    bad_crc[30] ^= 1
    big_len = bytearray(r2)
    big_len[4:8] = (wf.MAX_PAYLOAD + 1).to_bytes(4, "little")
    return [
        golden, golden + bytes(256), golden + seal, golden + seal + bytes(64),
        h, h + r1 + r2 + r3 + bytes(40),  # OPEN (R1, R2/R3 zero tail)
        h[:40],  # H1 short header
        b"AGWALSEX" + h[8:],  # H2 bad magic
        _header(version=2),  # H3
        h[:60] + b"\0\0\0\0",  # H4 bad header crc
        _header(header_size=32),  # H5
        _header(flags=1), _header(reserved=1),  # H6
        _header(segment_no=0), _header(first_lsn=0), _header(salt=0),  # H7
        h + r1 + r2[:20],  # R2 truncated header (torn)
        h + r1 + r2[:20] + bytes(64) + r3,  # truncated header, then a valid record (corrupt)
        h + r1 + bytes(24) + b"\x01" + bytes(7),  # R3 zeroed header (torn)
        h + r1 + bytes(24) + _rec(2),  # zeroed header, then a valid record (corrupt)
        h + r1 + bytes(big_len),  # R4 bad length
        h + r1 + r2[:30],  # R5 truncated record
        h + r1 + bytes(bad_crc),  # R6 bad crc (torn)
        h + bytes(bad_crc) + r3,  # bad crc then a record with the right salt (corrupt)
        h + _rec(1, rtype=4),  # R7
        h + _rec(1, flags=1), h + _rec(1, reserved=2),  # R8
        h + _rec(1, salt_check=OTHER & 0xFFFFFFFF),  # R9
        h + _rec(1, b"abc")[:-1] + b"\x01",  # R10 nonzero padding
        h + r1 + _rec(3),  # R11 lsn gap
        h + r1 + _rec(1),  # R11 lsn out of order
        h + r1 + wf.encode_record(lsn=1, payload=b"x", salt=SALT, rtype=wf.RECORD_SEAL),  # R12 bad seal
        h + r1 + wf.encode_seal(last_lsn=2, salt=SALT),  # R12 bad seal lsn
        h + r1 + wf.encode_seal(last_lsn=1, salt=SALT) + b"\0\x01",  # R12 data after seal
        h + wf.encode_seal(last_lsn=0, salt=SALT),  # sealed, empty
        h + r1 + wf.encode_mark(durable_lsn=1, salt=SALT) + r2 + seal,  # a MARK between batches
        h + r1 + wf.encode_record(lsn=1, payload=b"x", salt=SALT, rtype=wf.RECORD_MARK),  # R13 bad mark
        h + r1 + wf.encode_mark(durable_lsn=2, salt=SALT),  # R13 bad mark lsn
        # rule T: damage, then a MARK vouching for the damaged record (corrupt) or not (torn)
        h + r1 + bytes(bad_crc) + wf.encode_mark(durable_lsn=2, salt=SALT) + r3,
        h + r1 + bytes(bad_crc) + wf.encode_mark(durable_lsn=1, salt=SALT) + r3,
        h + r1 + bytes(24) + b"\x01" * 8 + wf.encode_mark(durable_lsn=5, salt=SALT),
        _header(first_lsn=1000) + _rec(1000, b"x" * 100) + _rec(1001, b"y" * 7),
    ]


def segment_candidates(rng: random.Random) -> Iterable[bytes]:
    for image in crafted_segments():
        yield b"\x00" + image  # raw
        yield b"\xfd" + image  # checksum fix-up of every record (mode 1, skip index 62)
    for _ in range(6000):
        mode = rng.choice((2, 3))
        n = rng.choice((4, 16, 40, 100, 300, 800))
        yield bytes([mode | (rng.randrange(64) << 2)]) + rng.randbytes(n)


def open_candidates(rng: random.Random) -> Iterable[bytes]:
    for _ in range(2500):
        kind = rng.randrange(256)
        n = rng.choice((16, 48, 100, 200, 400, 800, 1400))
        yield bytes([kind]) + rng.randbytes(n)


def distil(candidates: Iterable[bytes], run: Callable[[bytes], tuple[str, ...]], *, per_signature: bool,
           limit: int) -> list[bytes]:
    """Keep the inputs that reach something new: a new signature, or a new element of one."""
    kept: list[bytes] = []
    seen: set[object] = set()
    for data in candidates:
        if len(data) > MAX_INPUT:
            continue
        try:
            signature = run(data)
        except Finding:
            continue  # a finding: not a seed (see the module docstring)
        keys: set[object] = {signature} if per_signature else {s for s in signature if s}
        if keys - seen:
            seen |= keys
            kept.append(data)
            if len(kept) >= limit:
                break
    return kept


def write_corpus(name: str, inputs: list[bytes], check: bool) -> bool:
    directory = os.path.join(HERE, "corpus", name)
    wanted = {hashlib.sha1(data).hexdigest(): data for data in inputs}
    if check:
        present = set(os.listdir(directory)) if os.path.isdir(directory) else set()
        ok = present == set(wanted)
        print(f"corpus/{name}: {'up to date' if ok else 'differs from a fresh run'}")
        return ok
    os.makedirs(directory, exist_ok=True)
    for old in os.listdir(directory):
        if old not in wanted:
            os.unlink(os.path.join(directory, old))
    for digest, data in wanted.items():
        with open(os.path.join(directory, digest), "wb") as f:
            f.write(data)
    size = sum(len(d) for d in wanted.values())
    print(f"corpus/{name}: {len(wanted)} inputs, {size} bytes")
    return True


def main(argv: list[str]) -> int:
    check = "--check" in argv
    os.environ.pop("AGENTWAL_FUZZ_KNOWN", None)  # seeds must pass with every check on
    segment = distil(segment_candidates(random.Random(20261122)), fuzz_segment.run_one, per_signature=True,
                     limit=250)
    opened = distil(open_candidates(random.Random(20261123)), fuzz_open.run_one, per_signature=False, limit=120)
    ok = write_corpus("segment", segment, check)
    ok = write_corpus("open", opened, check) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
