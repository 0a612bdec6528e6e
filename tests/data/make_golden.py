"""Regenerate ``golden_two_records.wal``, the worked example of FORMAT.md.

Usage, from the repository root::

    python tests/data/make_golden.py          # rewrite tests/data/golden_two_records.wal
    python tests/data/make_golden.py --dump   # also print the xxd-style dump for FORMAT.md

The file holds exactly the bytes of the example: a segment header (log id
0x0123456789abcdef, segment 1, first LSN 1, salt 0x5a17c0ffee15900d, prealloc
field 4096) and two DATA records (LSN 1 b"hello", LSN 2 b"agent state v1"), without
the zero tail a real segment file has. It is written with the pure-Python
reference encoder ``wal.log.format``. The golden file is pinned: if this script
changes its bytes, the format changed (see FORMAT.md, "Versioning").
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from wal.log.format import build_segment  # noqa: E402

GOLDEN = Path(__file__).with_name("golden_two_records.wal")

LOG_ID = 0x0123456789ABCDEF
SEGMENT_NO = 1
FIRST_LSN = 1
SALT = 0x5A17C0FFEE15900D
PREALLOC_BYTES = 4096
PAYLOADS = [b"hello", b"agent state v1"]


def golden_bytes() -> bytes:
    """The bytes of the worked example, made by the reference encoder."""
    return build_segment(
        log_id=LOG_ID,
        segment_no=SEGMENT_NO,
        first_lsn=FIRST_LSN,
        salt=SALT,
        payloads=PAYLOADS,
        prealloc_bytes=PREALLOC_BYTES,
    )


def xxd(data: bytes) -> str:
    """Format ``data`` like ``xxd`` does by default: offset, 8 groups of 2 bytes, text."""
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off : off + 16]
        hexpart = " ".join(chunk[i : i + 2].hex() for i in range(0, len(chunk), 2))
        text = "".join(chr(c) if 0x20 <= c < 0x7F else "." for c in chunk)
        lines.append(f"{off:08x}: {hexpart:<39}  {text}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    data = golden_bytes()
    GOLDEN.write_bytes(data)
    print(f"wrote {len(data)} bytes to {GOLDEN}")
    if "--dump" in argv:
        print(xxd(data))


if __name__ == "__main__":
    main(sys.argv[1:])
