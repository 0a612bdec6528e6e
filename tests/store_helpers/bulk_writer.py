"""Child writer for the bounded-replay test: many puts with automatic checkpoints, then waits.

usage: bulk_writer.py STORE COUNT VALUE_BYTES

Opens the store at ``sync`` with segment_bytes = checkpoint_bytes = 65536 and an apply
interval so long that only the checkpoint-bytes trigger (or a full apply queue) makes the
materializer run. Puts ``k{i:06d}`` for i < COUNT, prints ``done LSN`` and sleeps until
SIGKILLed: it never closes the store, so the next open must replay from the LMDB state.
"""

from __future__ import annotations

import sys
import time

import wal


def main() -> int:
    path, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = wal.open(path, segment_bytes=65536, checkpoint_bytes=65536, apply_interval_ms=600_000)
    lsn = 0
    for i in range(count):
        lsn = store.put(f"k{i:06d}", bytes([i % 251]) * size)
    # The checkpoints run in the materializer thread, after the puts that trigger them: on a busy
    # machine the last one may still be under way here. Wait (up to a minute) until one covers all
    # but the last checkpoint_bytes of records, which is what the parent's bound allows.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        last = store.stats()["last_checkpoint"]
        if last and last["applied_lsn"] >= lsn - 65536 // (size + 40) - 16:
            break
        time.sleep(0.01)
    print(f"done {lsn}", flush=True)
    time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
