"""Commands that write one thing as the store's one writer: `put`, `delete`, `checkpoint`, `compact`.

Each opens the store as its writer and fails with `LockedError` naming the process that holds it.
"""

from __future__ import annotations

import os
from typing import Any

from wal.errors import ArgumentError
from wal.log import recovery
from wal.ops.target import _tree_bytes, _writer_target, locate, open_writer
from wal.store.store import MAX_VALUE_BYTES


def put(path: str, key: bytes, value: bytes, *, if_version: int | None = None, create: bool = False) -> int:
    """Commit key=value through the log as the store's writer; returns the LSN."""
    target = _writer_target(path, create)
    if len(value) > MAX_VALUE_BYTES:
        raise ArgumentError(f"value of {len(value)} bytes is over the {MAX_VALUE_BYTES}-byte value limit")
    with open_writer(target, "put") as store:
        if if_version is None:
            return store.put(key, value)
        with store.transaction() as tx:
            tx.put(key, value, if_version=if_version)
        assert tx.lsn is not None
        return tx.lsn


def delete(path: str, key: bytes, *, if_version: int | None = None) -> int | None:
    """Commit the deletion of key as the store's writer; returns the LSN, or None (no such key: nothing done)."""
    target = locate(path, need_store=True)
    with open_writer(target, "delete") as store:
        if store.version(key) is None and if_version is None:
            return None
        with store.transaction() as tx:
            tx.delete(key, if_version=if_version)
        return tx.lsn


def checkpoint(path: str) -> dict[str, Any]:
    """Run a checkpoint as the store's writer: state durable, segments below it released."""
    target = locate(path, need_store=True)
    before = [p for _, p in recovery.list_segments(target.log_dir)]
    with open_writer(target, "checkpoint") as store:
        applied = store.checkpoint()
    after = {p for _, p in recovery.list_segments(target.log_dir)}
    removed = [os.path.basename(p) for p in before if p not in after]
    return {"applied_lsn": applied, "segments_removed": removed, "segments_left": len(after)}


def compact(path: str) -> dict[str, Any]:
    """Return the state's free and half-empty pages to the filesystem, as the store's writer: a
    checkpoint, then the state rebuilt into a new file swapped in atomically (`wal.state.compact`).
    Returns the state file's bytes before and after, and the store's allocated bytes after."""
    target = locate(path, need_store=True)
    with open_writer(target, "compact") as store:
        result: dict[str, Any] = store._compact_state()
    result["total_disk_bytes"] = _tree_bytes(target.path)[1]
    return result
