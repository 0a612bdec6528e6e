"""The store's log payload: one transaction per log record (FORMAT.md, "Store records").

A transaction is all-or-nothing after any crash because it is one log record: the
record's CRC either holds for all of it or the record is a torn tail and none of it
is replayed.

    txn      := kind:u8 = 0x54 ('T')  flags:u8  time_ms:u64  n_ops:u32  [idem]  op*
    idem     := len:u16 key            (present when flags & 1)
    op       := 0x01 klen:u16 key vlen:u32 value     put
              | 0x02 klen:u16 key                    delete

All integers little-endian. time_ms is the commit's wall-clock time (for
idempotency-key expiry, so replay reproduces it exactly).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from wal.errors import CorruptionError

MAX_KEY_BYTES = 511  # LMDB's key limit; the store refuses longer keys before writing
KIND_TXN = 0x54
FLAG_IDEMPOTENCY = 0x01
OP_PUT = 0x01
OP_DELETE = 0x02

_HEAD = struct.Struct("<BBQI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")

Op = tuple[int, bytes, bytes | None]  # (OP_PUT | OP_DELETE, key, value or None)


class Txn(NamedTuple):  # a tuple: built on every commit, so it must be cheap to make
    ops: list[Op] | tuple[Op, ...]  # decode gives a list; the commit path may use a tuple
    time_ms: int
    idempotency_key: bytes | None


# Txn(ops, time_ms, idempotency_key) without NamedTuple's Python-level __new__ (~1 us): the
# commit path and replay make one per record.
def make_txn(ops: list[Op] | tuple[Op, ...], time_ms: int, idempotency_key: bytes | None) -> Txn:
    return _tuple_new(Txn, (ops, time_ms, idempotency_key))


_tuple_new = tuple.__new__


# A one-op transaction's fixed bytes up to the key: kind, flags, time_ms, n_ops=1, op, klen.
_ONE_HEAD = struct.Struct("<BBQIBH")


def encode(ops: list[Op] | tuple[Op, ...], time_ms: int, idempotency_key: bytes | None) -> bytes:
    parts = [_HEAD.pack(KIND_TXN, FLAG_IDEMPOTENCY if idempotency_key is not None else 0, time_ms, len(ops))]
    if idempotency_key is not None:
        parts += (_U16.pack(len(idempotency_key)), idempotency_key)
    for kind, key, value in ops:
        parts += (bytes((kind,)), _U16.pack(len(key)), key)
        if kind == OP_PUT:
            assert value is not None
            parts += (_U32.pack(len(value)), value)
    return b"".join(parts)


def encode_one(kind: int, key: bytes, value: bytes | None, time_ms: int) -> bytes:
    """`encode([(kind, key, value)], time_ms, None)`, for the commit path of single puts and deletes."""
    head = _ONE_HEAD.pack(KIND_TXN, 0, time_ms, 1, kind, len(key))
    if value is None:
        return head + key
    return b"".join((head, key, _U32.pack(len(value)), value))


def decode(payload: bytes, lsn: int) -> Txn:
    """Decode a payload the log vouched for (CRC ok); a malformed one means a bug or foreign data."""
    # Most records are one put or delete without an idempotency key (encode_one): read those
    # with one unpack. Anything else, or anything not exactly that shape, takes the full path.
    if len(payload) >= _ONE_HEAD.size:
        kind, flags, time_ms, n, op, klen = _ONE_HEAD.unpack_from(payload, 0)
        if kind == KIND_TXN and flags == 0 and n == 1 and 0 < klen <= MAX_KEY_BYTES:
            end = _ONE_HEAD.size + klen
            if op == OP_DELETE and len(payload) == end:
                return make_txn([(OP_DELETE, payload[_ONE_HEAD.size : end], None)], time_ms, None)
            if op == OP_PUT and len(payload) >= end + 4 and len(payload) == end + 4 + _U32.unpack_from(payload, end)[0]:
                return make_txn([(OP_PUT, payload[_ONE_HEAD.size : end], payload[end + 4 :])], time_ms, None)
    try:
        kind, flags, time_ms, n = _HEAD.unpack_from(payload, 0)
        if kind != KIND_TXN or flags & ~FLAG_IDEMPOTENCY:
            raise ValueError(f"unknown record kind {kind:#x} or flags {flags:#x}")
        pos = _HEAD.size
        idem = None
        if flags & FLAG_IDEMPOTENCY:
            (ilen,) = _U16.unpack_from(payload, pos)
            idem = payload[pos + 2 : pos + 2 + ilen]
            if not 0 < ilen <= MAX_KEY_BYTES or len(idem) != ilen:
                raise ValueError(f"idempotency key of {ilen} bytes")
            pos += 2 + ilen
        ops: list[Op] = []
        for _ in range(n):
            op = payload[pos]
            (klen,) = _U16.unpack_from(payload, pos + 1)
            key = payload[pos + 3 : pos + 3 + klen]
            if not 0 < klen <= MAX_KEY_BYTES or len(key) != klen:
                raise ValueError(f"key of {klen} bytes")
            pos += 3 + klen
            if op == OP_PUT:
                (vlen,) = _U32.unpack_from(payload, pos)
                ops.append((OP_PUT, key, payload[pos + 4 : pos + 4 + vlen]))
                pos += 4 + vlen
            elif op == OP_DELETE:
                ops.append((OP_DELETE, key, None))
            else:
                raise ValueError(f"unknown op {op:#x}")
        if pos != len(payload):
            raise ValueError(f"{len(payload) - pos} trailing bytes")
        return Txn(ops, time_ms, idem)
    except (struct.error, IndexError, ValueError) as exc:
        raise CorruptionError(
            f"log record LSN {lsn} has a valid CRC but is not a store transaction ({exc}); "
            "was this log written by something else?",
            lsn=lsn, reason="bad store record",
        ) from exc
