"""The state read by operator commands: a read-only LMDB view that works while a writer has the store open.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import wal
from wal.errors import ArgumentError, WalError
from wal.log import record
from wal.ops.segments import iter_log
from wal.ops.target import OpsError, Target, UsageError, open_reader

# ---- the state, read-only ------------------------------------------------------------------------------


class _StateSnapshot:
    """One LMDB read transaction of a store's state (a consistent snapshot at `applied`).

    Opened through ``wal.open(path, readonly=True)`` (no writer lock; LMDB readers never block
    its writer); the Store's public reads take a new transaction per call, so a whole-state
    walk that must be consistent uses the same LMDB handle in one transaction.
    """

    def __init__(self, store: wal.Store) -> None:
        self.store = store
        self._snap = store._state.snapshot()
        self.applied = self._snap.applied_lsn()

    @classmethod
    def open(cls, target: Target) -> _StateSnapshot:
        if not os.path.exists(os.path.join(target.state_dir, "data.mdb")):
            raise OpsError(f"the store has no state ({target.state_dir}/data.mdb is missing); a writable open "
                           f"rebuilds it from the log: `agentwal repair {target.path} --rebuild-state`")
        store = open_reader(target)
        try:
            return cls(store)
        except BaseException:
            store.close()
            raise

    def renew(self) -> None:
        self._snap.renew()
        self.applied = self._snap.applied_lsn()

    def entries(self) -> int:
        return self._snap.entries()

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        return self._snap.get(key)

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, int, bytes]]:
        return self._snap.items(prefix)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._snap.close()
        self.store.close()


class StateView:
    """The store's state as a reader should see it: LMDB at applied LSN A, plus the log after A.

    After a crash (or while a writer runs) the log holds commits the state does not reflect
    yet; a reader through LMDB alone would miss acknowledged commits. The view replays
    records A+1.. from the log in memory over one LMDB snapshot. If the log cannot be read
    to its end (damaged), the view stops at the last record it could read and `warning`
    says so.
    """

    def __init__(self, target: Target) -> None:
        if not target.is_store:
            raise UsageError(f"{target.path} is a bare log, not a store")
        self.target = target
        self._snap = _StateSnapshot.open(target)
        self.warning: str | None = None
        self.overlay: dict[bytes, tuple[int, bytes | None]] = {}
        self.last_lsn = self._snap.applied
        try:
            for attempt in range(5):
                try:
                    self._load_overlay()
                    break
                except ArgumentError:  # a checkpoint removed segments after our snapshot: take a newer one
                    if attempt == 4:
                        raise
                    self._snap.renew()
        except (WalError, OSError) as exc:
            # What was read is a gap-free prefix of the log after A: keep it (I3), say where it stops.
            self.warning = (f"the log after LSN {self.last_lsn} could not be read ({exc}); showing the state as "
                            f"of LSN {self.last_lsn}. Run `agentwal verify`.")
        except BaseException:
            self._snap.close()
            raise

    def _load_overlay(self) -> None:
        self.overlay = {}
        self.last_lsn = self._snap.applied
        if not os.path.isdir(self.target.log_dir):
            return
        for rec in iter_log(self.target.log_dir, self._snap.applied + 1):
            txn = record.decode(rec.payload, rec.lsn)
            for _kind, key, value in txn.ops:
                self.overlay[key] = (rec.lsn, value)
            self.last_lsn = rec.lsn

    @property
    def applied_lsn(self) -> int:
        return self._snap.applied

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        """(version, value) of key, or None if absent."""
        found = self.overlay.get(key)
        if found is not None:
            lsn, value = found
            return None if value is None else (lsn, value)
        return self._snap.get(key)

    def scan(self, prefix: bytes = b"") -> Iterator[tuple[bytes, int, bytes]]:
        """(key, version, value) with `prefix`, in key order."""
        over = sorted(k for k in self.overlay if k.startswith(prefix))
        oi = 0
        for key, version, value in self._snap.items(prefix):
            while oi < len(over) and over[oi] < key:
                ok = over[oi]
                oi += 1
                lsn, ov = self.overlay[ok]
                if ov is not None:
                    yield ok, lsn, ov
            if oi < len(over) and over[oi] == key:
                oi += 1
                lsn, ov = self.overlay[key]
                if ov is not None:
                    yield key, lsn, ov
                continue
            yield key, version, value
        for ok in over[oi:]:
            lsn, ov = self.overlay[ok]
            if ov is not None:
                yield ok, lsn, ov

    def close(self) -> None:
        self._snap.close()

    def __enter__(self) -> StateView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
