"""Child process of tests/test_log_kill.py: append until SIGKILLed, printing every acknowledgement.

Usage: kill_child.py DIR ROUND DURABILITY THREADS SEGMENT_BYTES

Opens the log in DIR (recovering whatever the previous, killed child left) and
appends from THREADS threads at DURABILITY until killed. Every payload is
derived from (round, thread, counter) by `make_payload`, so the parent can tell
a payload that was sent from one that never was. After each append returns, one
line per acknowledged record goes to stdout, flushed at once:

    <lsn> <payload as hex>

Before the first append it prints ``ready``. It never exits on its own.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import threading

import wal


def make_payload(round_no: int, thread: int, k: int) -> bytes:
    """The payload record k of `thread` in `round_no` carries; the parent recomputes it."""
    head = f"r{round_no}:t{thread}:k{k}:".encode()
    seed = hashlib.sha256(head).digest()
    filler_len = seed[0] + seed[1] % 4 * 256  # 0..1023 bytes: records of many sizes, some rolls
    filler = (seed * (filler_len // len(seed) + 1))[:filler_len]
    return head + filler


def parse_payload(data: bytes) -> tuple[int, int, int] | None:
    """(round, thread, k) from a payload made by make_payload, or None."""
    try:
        r, t, k, _ = data.split(b":", 3)
        return int(r[1:]), int(t[1:]), int(k[1:])
    except ValueError:
        return None


def main() -> None:
    directory, round_no, durability, threads, segment_bytes = (
        sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    )
    rpo_ms = 50 if durability != "sync" else None
    log = wal.Log.open(directory, durability=durability, rpo_ms=rpo_ms, segment_bytes=segment_bytes)
    out_lock = threading.Lock()

    def say(text: str) -> None:
        with out_lock:
            os.write(1, text.encode())  # one write per line: the line is in the file or not at all

    say("ready\n")

    def worker(t: int) -> None:
        rng = random.Random(round_no * 1000 + t)
        k = 0
        while True:
            n = 1 if rng.random() < 0.8 else rng.randint(2, 4)
            batch = [make_payload(round_no, t, k + i) for i in range(n)]
            k += n
            last = log.append(batch[0]) if n == 1 else log.append_many(batch)
            # append_many gives consecutive LSNs ending at `last`
            lines = "".join(f"{last - n + 1 + i} {p.hex()}\n" for i, p in enumerate(batch))
            say(lines)

    pool = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()


if __name__ == "__main__":
    main()
