"""`agentwal export` / `import`: a store's keys and values as JSON lines, and back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from wal.errors import ArgumentError
from wal.ops.inspect import scan
from wal.ops.render import parse_bytes, render_bytes
from wal.ops.target import _writer_target, open_writer
from wal.store.store import MAX_KEY_BYTES, MAX_VALUE_BYTES

# ---- export / import ---------------------------------------------------------------------------------


def export_lines(path: str, prefix: bytes = b"") -> Iterator[str]:
    """One JSON line per key: {"key", "value", "version"}; bytes as text or {"base64": ...}."""
    for key, version, value in scan(path, prefix):
        yield json.dumps({"key": render_bytes(key), "value": render_bytes(value), "version": version},
                         ensure_ascii=False)


def parse_import(lines: Iterator[str], source: str) -> list[tuple[bytes, bytes]]:
    """Parse and check every line before anything is written; (key, value) pairs in file order."""
    out: list[tuple[bytes, bytes]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ArgumentError(f"{source} line {n}: not JSON ({exc})") from None
        if not isinstance(obj, dict) or "key" not in obj or "value" not in obj:
            raise ArgumentError(f"{source} line {n}: expected an object with \"key\" and \"value\"")
        key = parse_bytes(obj["key"], f"{source} line {n}: key")
        value = parse_bytes(obj["value"], f"{source} line {n}: value")
        if not key or len(key) > MAX_KEY_BYTES:
            raise ArgumentError(f"{source} line {n}: key must be 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
        if len(value) > MAX_VALUE_BYTES:
            raise ArgumentError(f"{source} line {n}: value of {len(value)} bytes is over the limit")
        out.append((key, value))
    return out


def import_pairs(path: str, pairs: list[tuple[bytes, bytes]], *, batch: int = 1000,
                 batch_bytes: int = 8 << 20, create: bool = False) -> dict[str, int]:
    """Commit the pairs as the store's writer, in transactions of up to `batch` keys / `batch_bytes`."""
    target = _writer_target(path, create)
    commits = 0
    last = 0
    with open_writer(target, "import") as store:
        i = 0
        while i < len(pairs):
            size = 0
            with store.transaction() as tx:
                j = i
                while j < len(pairs) and j - i < batch and (j == i or size + len(pairs[j][1]) < batch_bytes):
                    tx.put(pairs[j][0], pairs[j][1])
                    size += len(pairs[j][0]) + len(pairs[j][1])
                    j += 1
            i = j
            commits += 1
            last = tx.lsn or last
    return {"keys": len(pairs), "commits": commits, "last_lsn": last}
