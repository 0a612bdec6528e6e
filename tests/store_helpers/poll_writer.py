"""Child writer for the concurrent-reader tests: commits in a thread, answers queries on stdin.

usage: poll_writer.py STORE LEVEL RPO_MS [PACE_MS]

A thread commits transaction i = 1, 2, ... (PACE_MS apart; default 0: as fast as it can):
``g/a``, ``g/b``, ``g/c`` = i and ``t/{i:08d}/{j}`` = i for j in 0..2, all in one transaction. Once the first commit is
acknowledged it prints ``ready``. Each stdin line is a query:

  ``durable``  -> prints ``durable D`` with D = store.watermarks.durable, read *after*
                  the query arrived;
  ``quit`` / EOF -> stops committing, closes the store, prints ``closed N`` (N commits).
"""

from __future__ import annotations

import sys
import threading

import wal


def main() -> int:
    path, level, rpo_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pace_s = float(sys.argv[4]) / 1000 if len(sys.argv) > 4 else 0.0
    store = wal.open(path, durability=level, rpo_ms=rpo_ms or None)
    stop = threading.Event()
    first = threading.Event()
    count = [0]

    def commit() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            value = str(i).encode()
            with store.transaction() as tx:
                for k in ("a", "b", "c"):
                    tx.put(f"g/{k}", value)
                for j in range(3):
                    tx.put(f"t/{i:08d}/{j}", value)
            count[0] = i
            first.set()
            if pace_s:
                stop.wait(pace_s)

    thread = threading.Thread(target=commit)
    thread.start()
    first.wait()
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "durable":
            print(f"durable {store.watermarks.durable}", flush=True)
        elif cmd == "quit":
            break
    stop.set()
    thread.join()
    store.close()
    print(f"closed {count[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
