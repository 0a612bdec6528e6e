"""A Hypothesis stateful model of `wal.Store` against a dict of key -> (version, value).

Rules: put, delete, transactions of several ops (sometimes aborted by an exception, some
with an idempotency key), `if_version` writes that must conflict exactly when the model
says, `update`, concurrent conditional commits of one key (exactly one wins), snapshots that
keep their view across a commit, checkpoints, and close + reopen between steps (the model does not change). Every
step checks get / version / scan(prefix) against the model. A small key alphabet makes
keys collide and share prefixes; 0x00 and 0xff bytes probe the prefix bounds.
AGENTWAL_LONG=1 runs many more and longer examples.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import wal

ALPHABET = [b"a", b"b", b"\x00", b"\xff"]
KEYS = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=2).map(b"".join)
PREFIXES = st.lists(st.sampled_from(ALPHABET), min_size=0, max_size=2).map(b"".join)
# Mostly small; now and then one of LMDB's page-boundary sizes (tests/test_state_split.py): a
# value stored split in the state, one a byte short of it, one past its line.
VALUES = st.one_of(st.binary(max_size=12),
                   st.sampled_from([4072, 4073, 4096, 4600, 8184]).map(lambda n: bytes([n % 251]) * n))
IDEMPOTENCY_KEYS = st.sampled_from([b"job-1", b"job-2", b"job-3"])
# (kind, key, value): kind "put" or "delete"
OPS = st.lists(st.tuples(st.sampled_from(["put", "delete"]), KEYS, VALUES), min_size=1, max_size=5)


class AbortedError(Exception):
    pass


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="agentwal-model-")
        self.model: dict[bytes, tuple[int, bytes]] = {}
        self.idempotency: dict[bytes, int] = {}
        self.last_lsn = 0
        self.options: dict[str, object] = {}
        self.store: wal.Store | None = None

    @initialize(level=st.sampled_from([("sync", None), ("interval", 1000), ("buffered", 1000)]),
                lazy_apply=st.booleans())
    def open_store(self, level: tuple[str, int | None], lazy_apply: bool) -> None:
        # lazy_apply: the materializer rarely runs, so reads come from the in-memory overlay.
        self.options = {"durability": level[0], "rpo_ms": level[1],
                        "apply_interval_ms": 600_000 if lazy_apply else 5}
        self.store = wal.open(self.dir, **self.options)  # type: ignore[arg-type]

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def s(self) -> wal.Store:
        assert self.store is not None
        return self.store

    def _committed(self, lsn: int) -> None:
        # Consecutive LSNs also prove that aborted, conflicting and deduplicated transactions
        # wrote nothing to the log.
        assert lsn == self.last_lsn + 1, f"LSN {lsn} after {self.last_lsn}: commits must get consecutive LSNs"
        self.last_lsn = lsn

    def _apply(self, lsn: int, ops: list[tuple[str, bytes, bytes]]) -> None:
        for kind, key, value in ops:
            if kind == "put":
                self.model[key] = (lsn, value)
            else:
                self.model.pop(key, None)

    def _version(self, key: bytes) -> int:
        return self.model[key][0] if key in self.model else 0

    # ---- writes ----

    @rule(key=KEYS, value=VALUES)
    def put(self, key: bytes, value: bytes) -> None:
        lsn = self.s.put(key, value)
        self._committed(lsn)
        self.model[key] = (lsn, value)

    @rule(key=KEYS)
    def delete(self, key: bytes) -> None:
        lsn = self.s.delete(key)
        self._committed(lsn)
        self.model.pop(key, None)

    @rule(ops=OPS, abort=st.booleans(), idem=st.none() | IDEMPOTENCY_KEYS)
    def transaction(self, ops: list[tuple[str, bytes, bytes]], abort: bool, idem: bytes | None) -> None:
        own: dict[bytes, bytes | None] = {}
        try:
            with self.s.transaction(idempotency_key=idem) as tx:
                for kind, key, value in ops:
                    if kind == "put":
                        tx.put(key, value)
                        own[key] = value
                    else:
                        tx.delete(key)
                        own[key] = None
                    # the transaction sees its own writes, the store does not yet
                    assert tx.get(key) == own[key]
                if abort:
                    raise AbortedError
        except AbortedError:
            assert tx.lsn is None  # and the next commit's LSN shows nothing was written
            return
        if idem is not None and idem in self.idempotency:
            assert tx.deduplicated
            assert tx.lsn == self.idempotency[idem]  # applied nothing: the model is unchanged
            return
        assert not tx.deduplicated
        assert tx.lsn is not None
        self._committed(tx.lsn)
        self._apply(tx.lsn, ops)
        if idem is not None:
            self.idempotency[idem] = tx.lsn

    @rule(key=KEYS, value=VALUES, right=st.booleans(), other=st.integers(min_value=0, max_value=60),
          delete=st.booleans())
    def conditional_write(self, key: bytes, value: bytes, right: bool, other: int, delete: bool) -> None:
        current = self._version(key)
        expected = current if right else other
        should_conflict = expected != current
        try:
            with self.s.transaction() as tx:
                if delete:
                    tx.delete(key, if_version=expected)
                else:
                    tx.put(key, value, if_version=expected)
        except wal.ConflictError as err:
            assert should_conflict, f"unexpected conflict on {key!r}: {err}"
            assert err.key == key
            assert err.expected == expected
            assert err.actual == (current or None)
            return
        assert not should_conflict, f"if_version={expected} on {key!r} at version {current} did not conflict"
        assert tx.lsn is not None
        self._committed(tx.lsn)
        self._apply(tx.lsn, [("delete" if delete else "put", key, value)])

    @rule(ops=OPS, conflict_at=st.integers(min_value=0, max_value=4))
    def transaction_with_one_failing_check(self, ops: list[tuple[str, bytes, bytes]], conflict_at: int) -> None:
        i = conflict_at % len(ops)
        key = ops[i][1]
        wrong = self._version(key) + 1000
        try:
            with self.s.transaction() as tx:
                for j, (kind, k, value) in enumerate(ops):
                    check = wrong if j == i else None
                    if kind == "put":
                        tx.put(k, value, if_version=check if k == key else None)
                    else:
                        tx.delete(k, if_version=check if k == key else None)
        except wal.ConflictError as err:
            assert err.key == key
        else:
            raise AssertionError("a transaction with a failing if_version committed")

    # ---- maintenance ----

    @rule(key=KEYS, suffix=st.binary(max_size=3), delete=st.booleans())
    def update(self, key: bytes, suffix: bytes, delete: bool) -> None:
        want = self.model.get(key)
        lsn, written = self.s.update(key, lambda v: None if delete else (v or b"") + suffix)
        self._committed(lsn)
        if delete:
            assert written is None
            self.model.pop(key, None)
        else:
            assert written == (want[1] if want else b"") + suffix
            self.model[key] = (lsn, written)

    @rule(key=KEYS, n=st.integers(min_value=2, max_value=6))
    def concurrent_conditional_commits(self, key: bytes, n: int) -> None:
        """n threads commit key at the version they all read: exactly one wins; every other gets
        a ConflictError naming the winner's commit, which its next read then sees."""
        version = self._version(key)
        barrier = threading.Barrier(n)
        outcomes: list[tuple[str, int | None]] = [("", None)] * n

        def attempt(i: int) -> None:
            barrier.wait()
            try:
                with self.s.transaction() as tx:
                    tx.put(key, b"t%d" % i, if_version=version)
                outcomes[i] = ("won", tx.lsn)
            except wal.ConflictError as exc:
                outcomes[i] = ("lost", exc.conflicting_lsn)

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [(i, lsn) for i, (what, lsn) in enumerate(outcomes) if what == "won"]
        assert len(winners) == 1, outcomes
        i, lsn = winners[0]
        assert lsn is not None
        self._committed(lsn)
        self.model[key] = (lsn, b"t%d" % i)
        assert all(what == "won" or got == lsn for what, got in outcomes), outcomes
        assert self.s.version(key) == lsn

    @rule(key=KEYS, value=VALUES, prefix=PREFIXES)
    def snapshot_keeps_its_view(self, key: bytes, value: bytes, prefix: bytes) -> None:
        before = sorted((k, v) for k, (_, v) in self.model.items() if k.startswith(prefix))
        with self.s.snapshot() as snap:
            lsn = self.s.put(key, value)
            assert list(snap.scan(prefix)) == before
            assert snap.lsn < lsn
        self._committed(lsn)
        self.model[key] = (lsn, value)

    @rule()
    def checkpoint(self) -> None:
        assert self.s.checkpoint() == self.last_lsn
        assert self.s.watermarks.applied == self.last_lsn

    @rule()
    def reopen(self) -> None:
        self.s.close()
        self.store = wal.open(self.dir, **self.options)  # type: ignore[arg-type]
        assert self.s.watermarks.written == self.last_lsn
        assert self.s.stats()["records_replayed"] == 0  # close applied everything

    @rule(key=KEYS)
    def get_and_version(self, key: bytes) -> None:
        want = self.model.get(key)
        assert self.s.get(key) == (want[1] if want else None)
        assert self.s.version(key) == (want[0] if want else None)

    @rule(prefix=PREFIXES)
    def scan_prefix(self, prefix: bytes) -> None:
        want = sorted((k, v) for k, (_, v) in self.model.items() if k.startswith(prefix))
        assert list(self.s.scan(prefix)) == want

    # ---- invariants ----

    @invariant()
    def state_matches_the_model(self) -> None:
        if self.store is None:
            return
        assert list(self.s.scan()) == sorted((k, v) for k, (_, v) in self.model.items())
        for key, (version, _) in self.model.items():
            assert self.s.version(key) == version
        marks = self.s.watermarks
        assert marks.applied <= marks.durable <= marks.written <= self.last_lsn
        if self.options["durability"] != "buffered":
            assert marks.written == self.last_lsn  # acknowledged means written at sync/interval


LONG = os.environ.get("AGENTWAL_LONG", "") not in ("", "0")
StoreModel.TestCase.settings = settings(
    max_examples=500 if LONG else 60, stateful_step_count=60 if LONG else 40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_store_behaves_like_a_dict_of_versioned_values = StoreModel.TestCase
