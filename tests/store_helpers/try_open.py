"""Child for the one-writer test: tries to open a store for writing, prints what happened.

usage: try_open.py STORE

Prints ``opened`` (and closes) or ``error ClassName: message``.
"""

from __future__ import annotations

import sys

import wal


def main() -> int:
    try:
        store = wal.open(sys.argv[1])
    except Exception as exc:
        print(f"error {type(exc).__name__}: {exc}", flush=True)
        return 0
    store.close()
    print("opened", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
