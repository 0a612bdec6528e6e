"""Older store formats made from a current store, for the upgrade tests: with py-lmdb, never
through agentwal, so the bytes are those the older version wrote (FORMAT.md §16)."""

from __future__ import annotations

import json
from pathlib import Path

import lmdb

from wal.store.state import DEFAULT_MAP_SIZE

_FLAGS = 0xC0 << 56  # a version's split (bit 63) and checked (bit 62) flags


def strip_idem_checksums(root: Path) -> None:
    """Rewrite every idempotency entry as store formats 1-5 did: u64 LSN + u64 time ms (no
    checksum), and drop the marker that every one has a checksum."""
    env = lmdb.open(str(root / "state"), max_dbs=4, map_size=DEFAULT_MAP_SIZE)
    try:
        with env.begin(write=True) as txn:
            idem = env.open_db(b"idem", txn=txn, create=False)
            meta = env.open_db(b"meta", txn=txn, create=False)
            for key, raw in list(txn.cursor(db=idem)):
                txn.put(key, raw[:16], db=idem)
            txn.delete(b"idem_checksums", db=meta)
    finally:
        env.close()


def strip_entry_checksums(root: Path) -> None:
    """Rewrite every state entry as store formats 1-3 did: u64 version LE + value, whole (no
    checksum, no tail), metadata values without their checksum, and drop the marker that every
    entry has a checksum (idempotency entries lose theirs first: `strip_idem_checksums`)."""
    strip_idem_checksums(root)
    env = lmdb.open(str(root / "state"), max_dbs=4, map_size=DEFAULT_MAP_SIZE)
    try:
        with env.begin(write=True) as txn:
            data = env.open_db(b"data", txn=txn, create=False)
            tail = env.open_db(b"tail", txn=txn, create=False)
            meta = env.open_db(b"meta", txn=txn, create=False)
            for key, raw in list(txn.cursor(db=data)):
                version = int.from_bytes(raw[:8], "little")
                value = raw[12:] if version & (1 << 62) else raw[8:]
                if version & (1 << 63):
                    value += txn.get(key, db=tail)
                    txn.delete(key, db=tail)
                txn.put(key, (version & ~_FLAGS).to_bytes(8, "little") + value, db=data)
            for key, raw in list(txn.cursor(db=meta)):  # metadata values lose their trailing CRC
                if key != b"entry_checksums":
                    txn.put(key, raw[:-4], db=meta)
            txn.delete(b"entry_checksums", db=meta)
    finally:
        env.close()


def set_store_version(root: Path, version: int) -> None:
    (root / "STORE").write_text(json.dumps({"format": "agentwal-store", "version": version}) + "\n")
