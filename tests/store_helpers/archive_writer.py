"""Child writer for the archive's machine-loss tests: commits to an archived store, prints acks.

usage: archive_writer.py STORE LEVEL RPO_MS ARCHIVE_URL ARCHIVE_RPO_MS

Commits transaction i = 1, 2, ...: ``c/{i:08d}`` = ``"{i}"`` and ``last`` = i, in one
transaction. After each commit returns it prints ``ack I LSN UNIX_NS`` (flushed). Runs until
SIGKILLed. The S3 endpoint and credentials come from the environment (AWS_*).
"""

from __future__ import annotations

import sys
import time

import wal


def main() -> int:
    path, level, rpo_ms, url, archive_rpo = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    store = wal.open(path, durability=level, rpo_ms=rpo_ms or None, archive=url, archive_rpo_ms=archive_rpo)
    print("ready", flush=True)
    try:
        for i in range(1, 10_000_000):
            with store.transaction() as tx:
                tx.put(f"c/{i:08d}", str(i).encode())
                tx.put(b"last", str(i).encode())
            print(f"ack {i} {tx.lsn} {time.time_ns()}", flush=True)
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
