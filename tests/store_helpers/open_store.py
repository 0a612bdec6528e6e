"""Child for the kill-during-recovery test: opens (and so recovers) a store, then closes it.

usage: open_store.py STORE [BATCH_KEYS]

BATCH_KEYS caps the distinct keys of one replay batch (one LMDB transaction): the test's
log has few keys, which replay would otherwise apply in one transaction, leaving no
"mid-replay" for a kill to land in.

Prints ``start`` right before `wal.open` (the parent times its SIGKILL from there) and
``opened REPLAYED`` once recovery is done.
"""

from __future__ import annotations

import sys

import wal
from wal.store import replay


def main() -> int:
    if len(sys.argv) > 2:
        replay.BATCH_KEYS = int(sys.argv[2])
    print("start", flush=True)
    store = wal.open(sys.argv[1])
    print(f"opened {store.stats()['records_replayed']}", flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
