"""The store's log payload: one transaction per log record (FORMAT.md, "Store records").

A transaction is all-or-nothing after any crash because it is one log record: the
record's CRC either holds for all of it or the record is a torn tail and none of it
is replayed.

    txn      := kind:u8 = 0x54 ('T')  flags:u8  time_ms:u64  n_ops:u32  [idem]  op*
    idem     := len:u16 key            (present when flags & 1)
    op       := 0x01 klen:u16 key vlen:u32 value     put
              | 0x02 klen:u16 key                    delete

All integers little-endian. time_ms is the commit's wall-clock time (for
idempotency-key expiry, so replay reproduces it exactly). The one encoder and decoder
of this layout is C (native/storecore.c); this module names its parts for Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from wal._bindings import storecore
from wal.errors import CorruptionError

if TYPE_CHECKING:
    from wal.log.log import RecordSpan

MAX_KEY_BYTES = 511  # LMDB's key limit; the store refuses longer keys before writing
KIND_TXN = 0x54
FLAG_IDEMPOTENCY = 0x01
OP_PUT = 0x01
OP_DELETE = 0x02

Op = tuple[int, bytes, bytes | None]  # (OP_PUT | OP_DELETE, key, value or None)
# A batch of consecutive commits collapsed to each key's last write, as `State.apply` takes it:
# (first LSN, last LSN, commits, puts [(key, u64 version LE + value)], deletes [key],
#  idempotency keys [(key, lsn, time_ms)]).
Collapsed = tuple[int, int, int, list[tuple[bytes, bytes]], list[bytes], list[tuple[bytes, int, int]]]


class Txn(NamedTuple):  # a tuple: built on every commit, so it must be cheap to make
    ops: list[Op] | tuple[Op, ...]  # decode gives a list; the commit path may use a tuple
    time_ms: int
    idempotency_key: bytes | None


# Txn(ops, time_ms, idempotency_key) without NamedTuple's Python-level __new__ (~1 us): the
# commit path and replay make one per record.
def make_txn(ops: list[Op] | tuple[Op, ...], time_ms: int, idempotency_key: bytes | None) -> Txn:
    return _tuple_new(Txn, (ops, time_ms, idempotency_key))


_tuple_new = tuple.__new__


def encode(ops: list[Op] | tuple[Op, ...], time_ms: int, idempotency_key: bytes | None) -> bytes:
    """The log payload of a transaction (native/storecore.c is the one encoder of this layout)."""
    return storecore.encode(ops, time_ms, idempotency_key)


def encode_one(kind: int, key: bytes, value: bytes | None, time_ms: int) -> bytes:
    """`encode([(kind, key, value)], time_ms, None)`: a single put or delete."""
    return storecore.encode(((kind, key, value),), time_ms, None)


def decode(payload: bytes, lsn: int) -> Txn:
    """Decode a payload the log vouched for (CRC ok); a malformed one means a bug or foreign data."""
    try:
        ops, time_ms, idem = storecore.decode(payload)
    except ValueError as exc:
        raise _not_a_txn(lsn, str(exc)) from exc
    return make_txn(ops, time_ms, idem)


def collapse(records: list[tuple[int, bytes]]) -> Collapsed:
    """Decode consecutive (lsn, payload) records and collapse them to each key's last write:
    (first LSN, last LSN, commits, puts [(key, u64 version LE + value)], deletes, idempotency
    [(key, lsn, time_ms)]) -- what `State.apply` takes. For replay: no Txn per record."""
    try:
        return storecore.collapse(records)
    except ValueError as exc:
        raise _bad_payload(exc) from exc


class Collapser:
    """`collapse` over a whole log, span by span (`Log.read_spans`), for replay.

    Works on the mapped segments: a Python object is made for each key's last write, at
    `take`, never for a record. Memory: the table of last writes (watch `keys` and
    `held_bytes`, then `take`) plus the segment being read. Call `detach` before the spans'
    source goes away early (an exception, a break); a span of 0 records does it in order.
    After a malformed record raised CorruptionError the collapser refuses further use.
    """

    __slots__ = ("_c",)

    def __init__(self) -> None:
        self._c = storecore.Collapser()

    def add(self, span: RecordSpan) -> None:
        try:
            self._c.add(span.buffer, span.lsns, span.offsets, span.lengths, span.records)
        except ValueError as exc:
            raise _bad_payload(exc) from exc

    def take(self) -> Collapsed | None:
        """The records added since the last take, collapsed (None if there were none)."""
        return self._c.take()

    def detach(self) -> None:
        self._c.detach()

    @property
    def keys(self) -> int:
        """Distinct keys added since the last take."""
        return self._c.keys

    @property
    def held_bytes(self) -> int:
        """Key and value bytes of their last writes."""
        return self._c.held_bytes


def _bad_payload(exc: ValueError) -> CorruptionError:
    lsn, reason = exc.args if len(exc.args) == 2 else (0, str(exc))
    return _not_a_txn(lsn, reason)


def _not_a_txn(lsn: int, reason: str) -> CorruptionError:
    return CorruptionError(
        f"log record LSN {lsn} has a valid CRC but is not a store transaction ({reason}); "
        "was this log written by something else?",
        lsn=lsn, reason="bad store record",
    )
