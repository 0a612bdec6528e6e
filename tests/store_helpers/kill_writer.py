"""Child writer for the store kill tests: commits transactions, prints each acknowledged one.

usage: kill_writer.py STORE LEVEL RPO_MS ROUND

Resumes after the highest committed index (the value of key ``last``), prints
``ready FIRST``, then commits transaction i = FIRST, FIRST+1, ...: it puts
``c/{i:08d}/{j}`` = ``"{i}:{ROUND}"`` for j < 2 + i % 2, and ``last`` = i, all in one
transaction. After each commit returns it prints ``ack I LSN`` (flushed). It runs until
it is SIGKILLed (or its stdout pipe closes).
"""

from __future__ import annotations

import sys

import wal


def main() -> int:
    path, level, rpo_ms, round_no = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    store = wal.open(path, durability=level, rpo_ms=rpo_ms or None)
    last = store.get(b"last")
    i = int(last) + 1 if last is not None else 1
    print(f"ready {i}", flush=True)
    try:
        for _ in range(1_000_000):
            with store.transaction() as tx:
                for j in range(2 + i % 2):
                    tx.put(f"c/{i:08d}/{j}", f"{i}:{round_no}".encode())
                tx.put(b"last", str(i).encode())
            print(f"ack {i} {tx.lsn}", flush=True)
            i += 1
    except BrokenPipeError:  # the parent went away
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
