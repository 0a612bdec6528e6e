"""Child process of tests/test_log_commit.py: read a log read-only while another process writes it.

Usage: ro_reader.py DIR READS

Opens DIR read-only READS times and reads the records near the end ten times
over; each time they must run gap-free up to the last one, with the payloads
`expected_payload(lsn)`.
Exit code 0 when every read was right; a CorruptionError or a wrong record is
printed to stderr with exit code 1.
"""

from __future__ import annotations

import sys

import wal


def expected_payload(lsn: int) -> bytes:
    """What the writer appends at `lsn` (the test writes these)."""
    size = 500 + lsn * 7919 % 3000
    head = f"lsn={lsn};".encode()
    return (head * (size // len(head) + 1))[:size]


def main() -> int:
    directory, reads = sys.argv[1], int(sys.argv[2])
    seen = 0
    for _ in range(reads):
        try:
            with wal.Log.open(directory, readonly=True) as ro:
                # The tail is where the writer is: read the last ~200 records, again and again.
                start = max(1, ro.watermarks.appended - 200)
                for _ in range(10):
                    n = start - 1
                    for lsn, p in ro.read(from_lsn=start):
                        n += 1
                        if lsn != n or p != expected_payload(lsn):
                            print(f"wrong record: LSN {lsn} where {n} was due: {p[:40]!r}", file=sys.stderr)
                            return 1
        except wal.CorruptionError as e:
            print(f"CorruptionError while the writer was live: {e}", file=sys.stderr)
            return 1
        if n < seen:
            print(f"records went backwards: {n} < {seen}", file=sys.stderr)
            return 1
        seen = n
    return 0


if __name__ == "__main__":
    sys.exit(main())
