"""How operator commands show and parse bytes: JSON-safe values, text previews, byte counts,
keys given on a command line.
"""

from __future__ import annotations

import base64
import datetime as _dt
import os
from typing import Any

from wal.errors import ArgumentError, CorruptionError
from wal.log import record
from wal.store.store import MAX_KEY_BYTES

# ---- bytes in JSON ---------------------------------------------------------------------------------------


def render_bytes(data: bytes) -> str | dict[str, str]:
    """Printable UTF-8 text as a JSON string; anything else as ``{"base64": "..."}``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}
    if all(c.isprintable() or c in "\n\r\t" for c in text):
        return text
    return {"base64": base64.b64encode(data).decode("ascii")}


def parse_bytes(obj: object, what: str) -> bytes:
    """The inverse of `render_bytes`."""
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, dict) and set(obj) == {"base64"} and isinstance(obj["base64"], str):
        try:
            return base64.b64decode(obj["base64"], validate=True)
        except ValueError as exc:
            raise ArgumentError(f"{what}: bad base64 ({exc})") from None
    raise ArgumentError(f"{what} must be a string or {{\"base64\": \"...\"}}, got {obj!r}")


def text_preview(data: bytes, limit: int = 0) -> str:
    """A one-line, human-readable rendering of bytes (escapes for the unprintable)."""
    shown = data if not limit or len(data) <= limit else data[:limit]
    try:
        text = shown.decode("utf-8")
        out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    except UnicodeDecodeError:
        out = repr(shown)[2:-1]
    if shown is not data:
        out += f"... ({len(data)} bytes)"
    return out


def _iso(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record_json(lsn: int, payload: bytes, *, segment: str, offset: int, decode: bool) -> dict[str, Any]:
    """One log record as a JSON-ready dict; a store transaction's operations spelled out when `decode`."""
    out: dict[str, Any] = {"lsn": lsn, "segment": os.path.basename(segment), "offset": offset,
                           "bytes": len(payload)}
    if decode:
        try:
            txn = record.decode(payload, lsn)
        except CorruptionError as exc:
            out["payload"] = render_bytes(payload)
            out["error"] = f"not a store transaction: {exc}"
            return out
        out["time"] = _iso(txn.time_ms)
        out["time_ms"] = txn.time_ms
        if txn.idempotency_key is not None:
            out["idempotency_key"] = render_bytes(txn.idempotency_key)
        ops: list[dict[str, Any]] = []
        for kind, key, value in txn.ops:
            if kind == record.OP_PUT:
                assert value is not None
                ops.append({"op": "put", "key": render_bytes(key), "value": render_bytes(value)})
            else:
                ops.append({"op": "delete", "key": render_bytes(key)})
        out["ops"] = ops
    else:
        out["payload"] = render_bytes(payload)
    return out


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_bytes(n: float) -> str:
    return _human(n)


def key_bytes(key: str, *, base64_key: bool = False) -> bytes:
    """A key given on the command line: UTF-8 text, or base64 with --base64-key."""
    if base64_key:
        try:
            data = base64.b64decode(key, validate=True)
        except ValueError as exc:
            raise ArgumentError(f"key is not valid base64: {exc}") from None
    else:
        data = key.encode("utf-8", errors="surrogateescape")
    if not data:
        raise ArgumentError("a key must not be empty")
    if len(data) > MAX_KEY_BYTES:
        raise ArgumentError(f"key of {len(data)} bytes is over the {MAX_KEY_BYTES}-byte key limit")
    return data
