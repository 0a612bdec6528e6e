"""The state's LMDB binding (native/lmdbcall.c, wal._lmdbcall) as wal/store/state.py uses it.

What is specified here: one handle per environment and process (a second open is LockedError),
closed and forked handles fail loudly, LMDB's error codes map to CorruptionError / StateError as
they did through py-lmdb, `State.apply` does its LMDB work with the GIL released and still
enforces I1 right before the commit, and the resolver names what is missing when the library
is not LMDB 0.9. Files written through the binding are read by py-lmdb in other processes in
tests/test_store_processes.py and tests/test_cli.py.
"""

from __future__ import annotations

import ctypes.util
import errno
import os
import random
import re
import sys
import threading
from pathlib import Path

import pytest

import wal
from wal import _lmdbcall
from wal._bindings import durable_lsn_reader
from wal.errors import ClosedError, CorruptionError, LockedError
from wal.store import state
from wal.store.state import InvariantError, State, StateError

VALUE = b"v" * 128


def _batch(first: int, n: int, *, value: bytes = VALUE, prefix: bytes = b"k") -> tuple[int, int, int, list[
        tuple[bytes, bytes]], list[bytes], list[tuple[bytes, int, int]]]:
    """`n` one-put commits from LSN `first`, collapsed as `State.apply` takes them (FORMAT.md §16 values)."""
    puts = [(prefix + b"%09d" % lsn, lsn.to_bytes(8, "little") + value) for lsn in range(first, first + n)]
    return first, first + n - 1, n, puts, [], []


# ---- one handle per environment and process ---------------------------------------------------------


def test_a_second_open_of_the_same_state_in_this_process_is_refused(tmp_path: Path) -> None:
    first = State(str(tmp_path / "state"))
    try:
        with pytest.raises(LockedError, match="already open in this process"):
            State(str(tmp_path / "state"))
        with pytest.raises(LockedError, match="already open in this process"):
            State(str(tmp_path / "state"), readonly=True)
        # The registry knows the directory, not its spelling.
        os.symlink(tmp_path / "state", tmp_path / "alias")
        with pytest.raises(LockedError):
            State(str(tmp_path / "alias"))
    finally:
        first.close()
    State(str(tmp_path / "alias")).close()  # closing let it go


def test_two_different_states_open_side_by_side(tmp_path: Path) -> None:
    a, b = State(str(tmp_path / "a")), State(str(tmp_path / "b"))
    try:
        a.apply(_batch(1, 2), lambda: 2)
        assert b.applied_lsn() == 0 and a.applied_lsn() == 2
    finally:
        a.close()
        b.close()


def test_a_closed_state_and_its_snapshots_fail_loudly(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    st.apply(_batch(1, 3), lambda: 3)
    snap = st.snapshot()
    st.close()
    st.close()  # idempotent
    with pytest.raises(ClosedError, match="closed"):
        st.get(b"k000000001")
    with pytest.raises(ClosedError):
        st.apply(_batch(4, 1), lambda: 4)
    with pytest.raises(ClosedError):
        snap.get(b"k000000001")  # closing the state aborted it
    snap.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("forker", ["os.fork", "_Fork"])
def test_a_forked_child_cannot_use_its_parents_handle_and_leaves_it_intact(tmp_path: Path, forker: str) -> None:
    # glibc's _Fork() (ctypes, a C extension) runs no pthread_atfork handler: the binding knew
    # the process by a pid such a handler updated, and took the child for its parent.
    fork = os.fork if forker == "os.fork" else getattr(ctypes.CDLL(None), forker, None)
    if fork is None:
        pytest.skip(f"this C library has no {forker}() (glibc before 2.34)")
    st = State(str(tmp_path / "state"))
    try:
        st.apply(_batch(1, 3), lambda: 3)
        st.get(b"k000000001")  # a spare read transaction (a reader slot) the child inherits
        pid = fork()
        if pid == 0:  # the child: report through the exit status only
            code = 1
            try:
                st.get(b"k000000001")
            except LockedError as exc:
                code = 0 if "forked child" in str(exc) else 2
            except BaseException:
                code = 3
            del st  # the child must not close the parent's environment (its reader slots)
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's handle still works, writes included.
        assert st.get(b"k000000002") == (2, VALUE)
        assert st.apply(_batch(4, 1), lambda: 4) == 4
    finally:
        st.close()


# ---- errors: LMDB's codes mapped as before ----------------------------------------------------------


_DAMAGE = [_lmdbcall.MDB_CORRUPTED, _lmdbcall.MDB_PAGE_NOTFOUND, _lmdbcall.MDB_INVALID,
           _lmdbcall.MDB_VERSION_MISMATCH, _lmdbcall.MDB_INCOMPATIBLE, _lmdbcall.MDB_BAD_DBI,
           _lmdbcall.MDB_PANIC, _lmdbcall.MDB_BAD_VALSIZE, errno.EINVAL, errno.EXDEV]
_OS = [errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EMFILE,
       errno.ENFILE, errno.EIO, errno.ENOMEM, errno.EAGAIN, errno.EBUSY, errno.ENOTDIR]
_RESOURCE = [_lmdbcall.MDB_MAP_FULL, _lmdbcall.MDB_READERS_FULL, _lmdbcall.MDB_TXN_FULL, _lmdbcall.MDB_BAD_TXN]


@pytest.mark.parametrize("code", _DAMAGE)
def test_lmdb_damage_codes_and_unexpected_errnos_are_corruption_errors_naming_data_mdb(code: int) -> None:
    with pytest.raises(CorruptionError, match=r"/s/data\.mdb is damaged \(mdb_get: boom\)") as info:
        state.raise_lmdb(_lmdbcall.LmdbError(code, "mdb_get: boom"), "/s", "reading a key")
    assert info.value.reason == "state damaged"


@pytest.mark.parametrize("code", _OS)
def test_operating_system_errors_are_state_errors_even_while_opening(code: int) -> None:
    for opening in (False, True):
        with pytest.raises(StateError, match="the LMDB state in /s failed while doing it: mdb_x: boom"):
            state.raise_lmdb(_lmdbcall.LmdbError(code, "mdb_x: boom"), "/s", "doing it", opening=opening)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_no_space_from_lmdb_is_no_space_error_even_while_opening(code: int) -> None:
    for opening in (False, True):
        with pytest.raises(wal.NoSpaceError, match="the LMDB state in /s could not grow while doing it") as info:
            state.raise_lmdb(_lmdbcall.LmdbError(code, "mdb_x: boom"), "/s", "doing it", opening=opening)
        assert info.value.errno == code and isinstance(info.value, OSError)


@pytest.mark.parametrize("code", _RESOURCE)
def test_other_lmdb_errors_are_state_errors_but_corruption_while_opening(code: int) -> None:
    with pytest.raises(StateError):
        state.raise_lmdb(_lmdbcall.LmdbError(code, "mdb_x: boom"), "/s", "doing it")
    with pytest.raises(CorruptionError):
        state.raise_lmdb(_lmdbcall.LmdbError(code, "mdb_x: boom"), "/s", "opening it", opening=True)


def test_a_damaged_meta_page_of_data_mdb_is_a_corruption_error(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    st.apply(_batch(1, 10), lambda: 10)
    st.close()
    data = tmp_path / "state" / "data.mdb"
    raw = bytearray(data.read_bytes())
    page = os.sysconf("SC_PAGE_SIZE")
    for meta in (0, page):  # both meta pages' magic (LMDB's page header is 16 bytes)
        raw[meta + 16] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptionError, match=r"data\.mdb is damaged"):
        State(str(tmp_path / "state"))


def test_a_full_map_grows_and_the_transaction_runs_again(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"), map_size=1 << 20)
    try:
        assert st.stat()["state_map_bytes"] == 1 << 20
        assert st.apply(_batch(1, 2000, value=b"x" * 1000), lambda: 2000) == 2000  # 2 MB+ in a 1 MiB map
        assert st.map_grows >= 1 and st.stat()["state_map_bytes"] >= 4 << 20
        assert st.get(b"k000000001") is not None and st.applied_lsn() == 2000
        st.checkpoint()  # the checkpoint's pin was held across the resize
        st.meta_put(b"m", b"x" * 50_000)
    finally:
        st.close()
    again = State(str(tmp_path / "state"))
    try:
        assert again.applied_lsn() == 2000 and again.get(b"k000000002") is not None
    finally:
        again.close()


def test_a_map_starts_at_twice_the_file_and_at_least_the_minimum(tmp_path: Path) -> None:
    assert state.initial_map_size(str(tmp_path / "none")) == state.MIN_MAP_SIZE
    (tmp_path / "big").mkdir()
    with open(tmp_path / "big" / "data.mdb", "wb") as f:
        f.truncate(100 << 20)
    assert state.initial_map_size(str(tmp_path / "big")) == 200 << 20


def test_a_missing_state_opened_read_only_is_a_state_error(tmp_path: Path) -> None:
    """An errno from LMDB is the operating system's refusal: a StateError and a StorageError
    (an OSError with errno and filename), as the README says every such refusal is."""
    with pytest.raises(StateError, match="No such file or directory") as info:
        State(str(tmp_path / "nothing"), readonly=True)
    assert isinstance(info.value, wal.StorageError) and isinstance(info.value, OSError)
    assert info.value.errno == errno.ENOENT and info.value.filename == str(tmp_path / "nothing" / "data.mdb")


def test_stored_values_of_the_wrong_size_are_corruption_errors(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    try:
        st.meta_put(b"applied_lsn", b"abc")
        with pytest.raises(CorruptionError, match="applied_lsn of 3 bytes"):
            st.apply(_batch(1, 1), lambda: 1)
        with pytest.raises(CorruptionError, match="applied_lsn of 3 bytes"):
            st.applied_lsn()
    finally:
        st.close()


# ---- apply: the GIL, I1, I3 ---------------------------------------------------------------------------


class _Counter(threading.Thread):
    """Counts in a Python loop: it advances only while it holds the GIL."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.count = 0
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            self.count += 1


def test_apply_releases_the_gil_for_its_lmdb_work(tmp_path: Path) -> None:
    """The counter is read right before the call and again inside durable_lsn, which apply calls
    after writing every item: a call that kept the GIL would let the counter run at most for one
    switch interval in between (about nothing at the tiny interval set here). The same batch's
    keys sorted with the GIL held (list.sort runs no bytecode) give the reference."""
    n = 300_000
    batch = _batch(1, n)
    shuffled = [key for key, _ in batch[3]]
    random.Random(1).shuffle(shuffled)
    old_interval = sys.getswitchinterval()
    counter = _Counter()
    st = State(str(tmp_path / "state"))
    seen: list[int] = []
    try:
        sys.setswitchinterval(1e-6)
        counter.start()
        while counter.count == 0:
            pass
        before = counter.count
        sorted(shuffled)
        held = counter.count - before

        def durable() -> int:
            seen.append(counter.count)
            return n

        before = counter.count
        assert st.apply(batch, durable) == n
    finally:
        counter.stop = True
        counter.join()
        sys.setswitchinterval(old_interval)
        st.close()
    during_apply = seen[0] - before
    print(f"counter: +{during_apply} during apply's LMDB work, +{held} during a GIL-held sort of its keys")
    assert during_apply > 100_000
    assert during_apply > held


def test_apply_refuses_a_batch_above_the_durable_lsn_and_commits_none_of_it(tmp_path: Path) -> None:
    # I1 log before state, checked by the binding with the durable LSN read right before the commit.
    st = State(str(tmp_path / "state"))
    calls = []
    try:
        assert st.apply(_batch(1, 5), lambda: 5) == 5

        def durable() -> int:
            calls.append(st.applied_lsn())  # a read from inside the write transaction's call
            return 5_004

        with pytest.raises(InvariantError, match="I1 violated: would store applied_lsn 5005 > durable_lsn 5004"):
            st.apply(_batch(6, 5_000), durable)
        assert calls == [5]  # called once, while the transaction was still uncommitted
        assert st.applied_lsn() == 5 and st.get(b"k000000006") is None and st.durable_seen() == 5
    finally:
        st.close()


def test_an_exception_from_durable_lsn_aborts_the_apply(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    try:
        def failing() -> int:
            raise wal.FailedError("the log failed")

        with pytest.raises(wal.FailedError, match="the log failed"):
            st.apply(_batch(1, 100), failing)
        assert st.applied_lsn() == 0 and st.get(b"k000000001") is None
        assert st.apply(_batch(1, 100), lambda: 100) == 100  # the writer was released
    finally:
        st.close()


def test_apply_writes_puts_deletes_idempotency_applied_and_durable_seen_in_one_transaction(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    try:
        st.apply(_batch(1, 3), lambda: 3)
        puts = [(b"k000000001", (4).to_bytes(8, "little") + b"new")]
        assert st.apply((4, 5, 2, puts, [b"k000000002", b"absent"], [(b"idem-1", 5, 1234)]), lambda: 9) == 5
        assert st.get(b"k000000001") == (4, b"new") and st.get(b"k000000002") is None
        assert st.idempotency(b"idem-1") == (5, 1234)
        assert st.applied_lsn() == 5 and st.durable_seen() == 9
        assert st.apply(_batch(1, 5), lambda: 9) == 5  # wholly applied already (I4): no change
        assert st.get(b"k000000001") == (4, b"new")
        with pytest.raises(InvariantError, match="gap"):
            st.apply(_batch(7, 1), lambda: 9)  # I3
    finally:
        st.close()


def test_apply_refuses_items_that_are_not_bytes_before_writing(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    try:
        with pytest.raises(TypeError, match="put must be"):
            st.apply((1, 1, 1, [(b"k", "text")], [], []), lambda: 1)  # type: ignore[list-item]
        assert st.applied_lsn() == 0
    finally:
        st.close()


def test_expiring_idempotency_keys_removes_exactly_the_old_ones_across_many_pages(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    try:
        idem = [(b"idem-%06d" % i, i + 1, 1000 if i % 3 else 5000) for i in range(6000)]
        st.apply((1, 6000, 6000, [], [], idem), lambda: 6000)
        assert st.expire_idempotency(2000) == 4000
        assert st.expire_idempotency(2000) == 0
        assert st.idempotency(b"idem-000000") == (1, 5000) and st.idempotency(b"idem-000001") is None
        assert st.stat()["state_keys"] == 0
    finally:
        st.close()


# ---- reads and snapshots --------------------------------------------------------------------------------


def test_a_snapshot_keeps_its_commit_until_renewed(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    try:
        st.apply(_batch(1, 2500), lambda: 2500)
        snap = st.snapshot()
        st.apply(_batch(2501, 10), lambda: 2510)
        assert snap.applied_lsn() == 2500 and snap.entries() == 2500 and snap.get(b"k000002501") is None
        items = list(snap.items(b"k00000"))  # more than one scan chunk
        assert [k for k, _, _ in items] == [b"k%09d" % i for i in range(1, 2501)] == sorted(k for k, _, _ in items)
        assert items[0][1:] == (1, VALUE)
        snap.renew()
        assert snap.applied_lsn() == 2510 and snap.get(b"k000002501") == (2501, VALUE)
        snap.close()
        snap.close()
    finally:
        st.close()


def test_scan_chunks_resume_after_the_last_key_and_stop_at_the_prefix(tmp_path: Path) -> None:
    st = State(str(tmp_path / "state"))
    try:
        st.apply(_batch(1, 10), lambda: 10)
        st.apply(_batch(11, 2, prefix=b"l"), lambda: 12)
        first = st.scan_chunk(b"k", None, 4)
        assert [k for k, _, _ in first] == [b"k%09d" % i for i in range(1, 5)]
        rest = st.scan_chunk(b"k", first[-1][0], 100)
        assert [k for k, _, _ in rest] == [b"k%09d" % i for i in range(5, 11)]
        assert [k for k, _, _ in st.scan_chunk(b"", None, 100)][-2:] == [b"l000000011", b"l000000012"]
    finally:
        st.close()


# ---- where LMDB comes from ----------------------------------------------------------------------------


def test_a_library_without_lmdb_is_refused_naming_the_installed_lmdb_and_what_is_needed(tmp_path: Path) -> None:
    libc = ctypes.util.find_library("c")
    assert libc is not None
    with pytest.raises(ImportError, match=r"installed lmdb 0\.0\.test does not.*mdb09_env_create nor mdb_env_create"
                                          r".*pip install 'lmdb" + re.escape(state.LMDB_PACKAGE_RANGE) + "'"):
        state._load_lmdb(libc, "0.0.test")
    with pytest.raises(ImportError, match="not loaded in this process"):
        state._load_lmdb("/nonexistent/libnothing.so", "0.0.test")
    assert state.LMDB_VERSION.startswith("LMDB 0.9.")
    st = State(str(tmp_path / "state"))  # the binding in use is untouched by the refusals
    try:
        assert st.apply(_batch(1, 1), lambda: 1) == 1
    finally:
        st.close()


def test_wal_never_imports_py_lmdb_for_its_own_use() -> None:
    sources = (Path(wal.__file__).parent).rglob("*.py")
    offenders = [p.name for p in sources if any(line.strip().startswith(("import lmdb", "from lmdb"))
                                               for line in p.read_text().splitlines())]
    assert offenders == []


def test_the_stores_durable_lsn_reader_reads_the_logs_durable_lsn_and_apply_enforces_i1_with_it(tmp_path: Path) -> None:
    """The store hands apply a DurableLsn (read in C, the GIL left released): the same I1 check."""
    log = wal.Log.open(str(tmp_path / "log"), durability="sync")
    st = State(str(tmp_path / "state"))
    try:
        for _ in range(3):
            log.append(b"record")
        reader = durable_lsn_reader(log, log.native_address)
        assert reader() == log.watermarks.durable == 3
        with pytest.raises(InvariantError, match="I1 violated: would store applied_lsn 4 > durable_lsn 3"):
            st.apply(_batch(1, 4), reader)
        assert st.applied_lsn() == 0 and st.get(b"k000000001") is None
        assert st.apply(_batch(1, 3), reader) == 3 and st.durable_seen() == 3
        log.append(b"record")
        assert st.apply(_batch(4, 1), reader) == 4
    finally:
        st.close()
        log.close()


def test_a_background_apply_runs_the_same_transaction_at_the_lowest_priority(tmp_path: Path) -> None:
    """apply(background=True) with the store's DurableLsn: the transaction runs in a thread of
    its own at nice 19 (counted in `background_applies`), with the same result and the same
    I1 / I3 / I4 checks as in the calling thread. With a Python durable_lsn it cannot (that
    thread cannot call Python), so it runs in the calling thread, uncounted."""
    if os.getpriority(os.PRIO_PROCESS, 0) >= 19:
        pytest.skip("this process already runs at the lowest priority: nothing to tell apart")
    log = wal.Log.open(str(tmp_path / "log"), durability="sync")
    st = State(str(tmp_path / "state"))
    seen_nice: list[int] = []
    try:
        for _ in range(6):
            log.append(b"record")
        reader = durable_lsn_reader(log, log.native_address)
        assert st.stat()["background_applies"] == 0
        assert st.apply(_batch(1, 3), reader, background=True) == 3
        assert st.stat()["background_applies"] == 1
        assert st.get(b"k000000002") == (2, VALUE) and st.durable_seen() == 6
        with pytest.raises(InvariantError, match="I1 violated: would store applied_lsn 7 > durable_lsn 6"):
            st.apply(_batch(4, 4), reader, background=True)
        with pytest.raises(InvariantError, match="gap"):
            st.apply(_batch(5, 1), reader, background=True)
        assert st.apply(_batch(1, 3), reader, background=True) == 3  # I4: already applied
        assert st.applied_lsn() == 3 and st.get(b"k000000004") is None

        def python_durable() -> int:
            seen_nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return 6

        before = st.stat()["background_applies"]
        assert st.apply(_batch(4, 3), python_durable, background=True) == 6
        assert st.stat()["background_applies"] == before  # ran here, at this thread's priority
        assert seen_nice == [os.getpriority(os.PRIO_PROCESS, threading.get_native_id())]  # called here, once
    finally:
        st.close()
        log.close()


def test_the_background_thread_really_runs_at_nice_19(tmp_path: Path) -> None:
    """Seen from outside: while background applies run, a thread of the process shows nice 19
    in /proc (the test's own threads stay at their priority)."""
    if os.getpriority(os.PRIO_PROCESS, 0) >= 19:
        pytest.skip("this process already runs at the lowest priority: nothing to tell apart")
    log = wal.Log.open(str(tmp_path / "log"), durability="buffered")
    st = State(str(tmp_path / "state"))
    nices: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        me = threading.get_native_id()
        while not stop.is_set():
            for tid in os.listdir("/proc/self/task"):
                if int(tid) in (me, threading.main_thread().native_id):
                    continue
                try:
                    with open(f"/proc/self/task/{tid}/stat") as f:
                        nices.add(int(f.read().rsplit(")", 1)[1].split()[16]))
                except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                    pass

    try:
        n = 20_000
        for _ in range(n):
            log.append(b"r")
        log.sync()
        reader = durable_lsn_reader(log, log.native_address)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            first = 1
            while first <= n:
                st.apply(_batch(first, 2_000, value=b"x" * 2000), reader, background=True)
                first += 2_000
        finally:
            stop.set()
            watcher.join()
        assert st.applied_lsn() == n
        assert 19 in nices, nices
    finally:
        st.close()
        log.close()


def test_a_batch_that_writes_a_key_twice_keeps_its_last_write_whatever_the_put_order(tmp_path: Path) -> None:
    """The apply reorders a batch's large puts to fill leaf pages (native/lmdbcall.c, put_order);
    that is sound for distinct keys only, so a batch that writes one key twice is written as given."""
    st = State(str(tmp_path / "state"))
    try:
        big = 1500  # large enough for put_order to reorder (at most three entries to a page)
        puts = [(b"k%03d" % i, (1).to_bytes(8, "little") + bytes([i]) * big) for i in range(9)]
        puts.append((b"k004", (1).to_bytes(8, "little") + b"last" * (big // 4)))
        assert st.apply((1, 1, 1, puts, [], []), lambda: 1) == 1
        assert st.get(b"k004") == (1, b"last" * (big // 4))
        assert st.get(b"k005") == (1, bytes([5]) * big)
    finally:
        st.close()
