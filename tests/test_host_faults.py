"""The faults a host throws at a running store, for real (no failpoints): a full filesystem at each
phase and each durability level, a read-only mount, a directory without permission, no file
descriptors left, files deleted or replaced under the store (README, "Failure policy").

Each cell checks two things. The oracle: every commit acknowledged is there after a reopen, and a
commit that raised is all there or not at all. And the caller's view: the error class, errno and
message are the documented ones, and never a raw OSError or an internal error.

A full disk is a small tmpfs filled by a file, given back by deleting it; the tests mount it, so
they need root (they run as root here) and skip, saying why, where `mount` is refused. Cells that
need an unprivileged user (permissions mean nothing to root) or a low RLIMIT_NOFILE run in a child
process.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import wal
from wal.agents import AgentStore
from wal.errors import NotFoundError

VALUE = 2000  # bytes per value: 2 KB, a typical agent message
LEVELS = {"sync": {"durability": "sync"}, "interval": {"durability": "interval", "rpo_ms": 50},
          "buffered": {"durability": "buffered", "rpo_ms": 50}}


def _mount(point: Path, size: str, options: str = "") -> None:
    point.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=0755" + (f",{options}" if options else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)], check=False, capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {point} ({done.stderr.strip() or done.returncode}): the host-fault "
                    "cells need a small filesystem of their own, which takes root (CAP_SYS_ADMIN)")


def _umount(point: Path) -> None:
    subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 40 MiB tmpfs of its own."""
    point = tmp_path / "fs"
    _mount(point, "40m")
    try:
        yield point
    finally:
        _umount(point)


def _fill(fs: Path) -> None:
    """Take every free page of the filesystem (tmpfs allocates whole pages)."""
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 20, 4096):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)


def _give_back(fs: Path) -> None:
    (fs / "filler").unlink()


def _value(tag: str, i: int) -> bytes:
    return (f"{tag}{i}:".encode() * VALUE)[:VALUE]


def _wait(predicate: object, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


class Oracle:
    """What the caller was told: acknowledged commits, and the ones that raised."""

    def __init__(self) -> None:
        self.acked: dict[bytes, bytes] = {}
        self.refused: dict[bytes, bytes] = {}
        self.errors: list[BaseException] = []

    def put(self, store: wal.Store, key: bytes, value: bytes) -> bool:
        try:
            store.put(key, value)
        except Exception as exc:  # recorded, then judged (no_space_errors_only)
            self.refused[key] = value
            self.errors.append(exc)
            return False
        self.acked[key] = value
        return True

    def no_space_errors_only(self) -> None:
        for exc in self.errors:
            assert isinstance(exc, wal.NoSpaceError), f"{type(exc).__name__}: {exc}"
            assert exc.errno == errno.ENOSPC and "space" in str(exc).lower()

    def check(self, path: Path) -> None:
        with wal.open(path) as again:
            got = dict(again.scan())
        lost = [k for k, v in self.acked.items() if got.get(k) != v]
        assert not lost, f"{len(lost)} acknowledged commit(s) lost, first {lost[0]!r}"
        for key, value in self.refused.items():  # not acknowledged: all there or not at all
            assert got.get(key) in (None, value)


def _commit_until_refused(store: wal.Store, oracle: Oracle, tag: str, limit: int = 6000) -> None:
    for i in range(limit):
        if not oracle.put(store, f"{tag}{i:05d}".encode(), _value(tag, i)) and len(oracle.errors) >= 3:
            return
    raise AssertionError(f"{limit} commits of {VALUE} bytes on a full filesystem and none refused")


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("phase", ["log write", "segment roll"])
def test_a_full_disk_refuses_commits_with_no_space_error_and_the_same_store_goes_on_once_space_returns(
        small_fs: Path, phase: str, level: str) -> None:
    """The log write (a sparse segment: every write allocates) or the segment roll (zero-filled
    segments: only a new segment needs space) fails: those commits raise NoSpaceError, the store
    never fail-stops, and once space returns the same store commits again."""
    oracle = Oracle()
    options = ({"preallocate": "size", "segment_bytes": 8 << 20} if phase == "log write"
               else {"preallocate": "zeros", "segment_bytes": 256 << 10})
    path = small_fs / "store"
    store = wal.open(path, checkpoint_bytes=1 << 20, **LEVELS[level], **options)  # type: ignore[arg-type]
    for i in range(50):
        assert oracle.put(store, b"before%03d" % i, _value("before", i))
    _fill(small_fs)
    _commit_until_refused(store, oracle, "full")
    oracle.no_space_errors_only()
    assert store.stats()["failed"] is None  # not a fail-stop
    assert store.get(b"before001") == _value("before", 1)  # reads go on
    _give_back(small_fs)
    for i in range(50):  # the same store, no reopen
        assert oracle.put(store, b"after%03d" % i, _value("after", i)), oracle.errors[-1]
    store.checkpoint()
    store.close()
    oracle.check(path)


def test_at_buffered_nothing_is_acknowledged_into_memory_once_the_disk_refused_a_write(small_fs: Path) -> None:
    """Commits acknowledged at `buffered` before a write was refused wait in memory until space
    returns; later ones must not join them (they were, until the buffer filled or rpo_ms ran
    out: at rpo_ms=10 s, a thousand commits acknowledged into memory the disk had refused)."""
    oracle = Oracle()
    path = small_fs / "store"
    store = wal.open(path, durability="buffered", rpo_ms=10_000)
    assert oracle.put(store, b"before", b"x")
    _fill(small_fs)
    acked_after_a_refusal = 0
    deadline = time.monotonic() + 20
    while len(oracle.errors) < 20 and time.monotonic() < deadline:  # paced: the flusher's writes come between
        refused_before = store.stats()["write_errors"]
        if oracle.put(store, b"full%09d" % len(oracle.acked), b"v" * 1000) and refused_before:
            acked_after_a_refusal += 1
        time.sleep(0.001)
    oracle.no_space_errors_only()
    assert store.stats()["write_errors"] > 0 and len(oracle.errors) >= 20, "the disk never refused a write"
    assert acked_after_a_refusal == 0
    _give_back(small_fs)
    assert oracle.put(store, b"after", b"y"), oracle.errors[-1]  # the same store goes on once space returns
    store.close()
    oracle.check(path)


@pytest.mark.parametrize("level", list(LEVELS))
def test_a_full_disk_under_the_state_makes_the_apply_wait_and_commits_go_on(small_fs: Path, level: str) -> None:
    """The log has room (a zero-filled segment) but LMDB cannot grow: commits are acknowledged,
    reads see them (the overlay), the apply waits and retries -- no fail-stop, no gap -- and it
    catches up once space returns, without a reopen."""
    oracle = Oracle()
    path = small_fs / "store"
    store = wal.open(path, preallocate="zeros", segment_bytes=16 << 20, **LEVELS[level])  # type: ignore[arg-type]
    for i in range(20):
        assert oracle.put(store, b"before%03d" % i, _value("before", i))
    _fill(small_fs)
    for i in range(1500):  # 3 MB: in the segment's preallocated room; the state needs new pages
        assert oracle.put(store, b"full%05d" % i, _value("full", i)), oracle.errors[-1]
    assert _wait(lambda: store.stats()["state_stalled"] is not None), "the apply never hit the full disk"
    stats = store.stats()
    assert "space" in stats["state_stalled"] and stats["failed"] is None
    assert store.watermarks.applied < store.watermarks.written
    assert store.get(b"full01499") == _value("full", 1499)
    with pytest.raises(wal.NoSpaceError):  # an explicit checkpoint says why it cannot
        store.checkpoint()
    _give_back(small_fs)
    assert _wait(lambda: store.stats()["state_stalled"] is None
                 and store.watermarks.applied == store.watermarks.written), store.stats()["state_stalled"]
    assert store.checkpoint() == store.watermarks.written
    assert oracle.put(store, b"after", b"1")
    store.close()
    oracle.check(path)


@pytest.mark.parametrize("level", list(LEVELS))
def test_a_checkpoint_on_a_full_disk_raises_no_space_and_runs_once_space_returns(small_fs: Path, level: str) -> None:
    oracle = Oracle()
    path = small_fs / "store"
    store = wal.open(path, preallocate="zeros", segment_bytes=8 << 20, **LEVELS[level])  # type: ignore[arg-type]
    for i in range(200):
        assert oracle.put(store, b"k%05d" % i, _value("k", i))
    store.checkpoint()
    for i in range(200, 400):
        assert oracle.put(store, b"k%05d" % i, _value("k", i))
    _fill(small_fs)
    with pytest.raises(wal.NoSpaceError, match="space") as info:
        store.checkpoint()
    assert info.value.errno == errno.ENOSPC
    assert store.stats()["failed"] is None
    _give_back(small_fs)
    assert store.checkpoint() >= 400
    assert oracle.put(store, b"after", b"1")
    store.close()
    oracle.check(path)


@pytest.mark.parametrize("level", list(LEVELS))
def test_opening_on_a_full_disk_raises_no_space_and_a_read_only_open_reads_everything(
        small_fs: Path, level: str) -> None:
    oracle = Oracle()
    path = small_fs / "store"
    with wal.open(path, **LEVELS[level]) as store:  # type: ignore[arg-type]
        for i in range(300):
            assert oracle.put(store, b"k%05d" % i, _value("k", i))
    _fill(small_fs)
    try:
        opened = wal.open(path, **LEVELS[level])  # type: ignore[arg-type]
    except wal.NoSpaceError as exc:
        assert exc.errno == errno.ENOSPC and "space" in str(exc)
    else:  # nothing to write on this open: then it must work as well
        opened.close()
    with wal.open(path, readonly=True) as ro:
        assert dict(ro.scan()) == oracle.acked
    _give_back(small_fs)
    with wal.open(path, **LEVELS[level]) as store:  # type: ignore[arg-type]
        assert oracle.put(store, b"after", b"1")
    oracle.check(path)


def test_a_blob_file_on_a_full_disk_raises_no_space_and_the_append_can_be_retried(small_fs: Path) -> None:
    path = small_fs / "store"
    with wal.open(path, preallocate="zeros", segment_bytes=4 << 20) as store:
        agent = AgentStore(store, blob_threshold=4096)
        agent.append("t", b"small")
        _fill(small_fs)
        big = os.urandom(1 << 20)
        with pytest.raises(wal.NoSpaceError, match="blob"):
            agent.append("t", big)
        assert not list((path / "blobs").rglob("*.tmp"))  # the temporary file is gone
        _give_back(small_fs)
        assert agent.append("t", big) == 2
        assert [e for _, e in agent.read("t")] == [b"small", big]


def test_a_read_only_mount_opens_read_only_and_refuses_a_writer_with_storage_error(tmp_path: Path) -> None:
    point = tmp_path / "fs"
    _mount(point, "16m")
    try:
        path = point / "store"
        with wal.open(path) as store:
            acked = {b"k%03d" % i: b"v%d" % i for i in range(100)}
            for k, v in acked.items():
                store.put(k, v)
        subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
        with wal.open(path, readonly=True) as ro:  # operators inspect snapshots and backups this way
            assert dict(ro.scan()) == acked
            assert ro.get(b"k007") == b"v7"
        with pytest.raises(wal.StorageError, match="read-only") as info:
            wal.open(path)
        assert info.value.errno == errno.EROFS and not isinstance(info.value, wal.NoSpaceError)
        subprocess.run(["mount", "-o", "remount,rw", str(point)], check=True)
        with wal.open(path) as store:
            assert dict(store.scan()) == acked
    finally:
        _umount(point)


def _run_child(code: str, *, user: int | None = None, nofile: int | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `code` in a child Python, as `user` (uid and gid) and/or with RLIMIT_NOFILE = nofile."""
    prologue = "import os, resource, sys\n"
    if nofile is not None:
        prologue += (f"hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
                     f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, max(hard, {nofile}) "
                     f"if hard != resource.RLIM_INFINITY else hard))\n")
    if user is not None:  # imports first: the interpreter's own files may be private to root here
        prologue += "import errno, encodings.ascii, encodings.latin_1, wal, wal.cli\n"
        prologue += f"os.setgroups([]); os.setgid({user}); os.setuid({user})\n"
    return subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], check=False,
                          capture_output=True, text=True, timeout=timeout)


NOBODY = 65534


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="agentwal-perm-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_store_directory_without_permission_is_a_storage_error_saying_so(shared_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as another user (permissions do not bind root itself)")
    path = shared_dir / "store"
    with wal.open(path) as store:
        store.put(b"k", b"v")
    (shared_dir / "locked").mkdir(mode=0o755)
    done = _run_child(f"""
        import errno, wal
        try:
            wal.open({str(path)!r})
        except wal.StorageError as exc:
            assert exc.errno == errno.EACCES, exc.errno
            assert "permission" in str(exc).lower(), str(exc)
            print("writer:", type(exc).__name__)
        with wal.open({str(path)!r}, readonly=True) as ro:  # no write access to state/lock.mdb: still reads
            print("reader:", ro.get(b"k"))
        try:
            wal.open({str(shared_dir / "locked" / "new")!r})  # a directory it may not create in
        except wal.StorageError as exc:
            print("create:", type(exc).__name__, exc.errno == errno.EACCES)
    """, user=NOBODY)
    assert done.returncode == 0, done.stderr
    assert "writer: StorageError" in done.stdout
    assert "reader: b'v'" in done.stdout, done.stdout
    assert "create: StorageError True" in done.stdout, done.stdout


def test_a_reader_who_may_not_write_lock_mdb_reads_while_no_writer_runs_and_keeps_writers_out(
        shared_dir: Path) -> None:
    """LMDB registers readers in state/lock.mdb; a user who may read the store but not write that
    file reads without a reader slot (MDB_NOLOCK), which is safe only while no writer runs. So
    such a read-only open holds the writer lock shared: refused (StorageError, EACCES, saying
    why) while a writer has the store open, and a writer cannot open while it reads."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as another user (permissions do not bind root itself)")
    path = shared_dir / "store"
    acked = {b"k%03d" % i: b"v%d" % i for i in range(300)}
    with wal.open(path) as store:
        for k, v in acked.items():
            store.put(k, v)
    assert (path / "state" / "lock.mdb").stat().st_mode & 0o022 == 0  # only its owner may write it
    release = shared_dir / "release"  # the parent (root) makes it; the reader only looks
    reader = textwrap.dedent(f"""
        import errno, os, time, wal
        with wal.open({str(path)!r}, readonly=True) as ro:
            assert dict(ro.scan()) == {acked!r}
            with ro.snapshot() as snap:
                assert snap.get(b"k007") == b"v7"
            print("ready", flush=True)
            while not os.path.exists({str(release)!r}):
                time.sleep(0.01)
            assert ro.get(b"k299") == b"v299"
        print("read", len({acked!r}))
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, encodings.ascii, encodings.latin_1, errno, wal, wal.cli\n"
         f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n" + reader],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # the reader has the store open
        assert line == "ready\n", (line, child.communicate())
        with pytest.raises(wal.LockedError, match="read-only opener"):  # the reader keeps writers out
            wal.open(path)
        release.touch()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert out.strip() == "read 300", out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with wal.open(path) as store:  # the reader is gone: the writer opens, and holds the store while
        store.put(b"later", b"x")
        done = _run_child(f"""
            import errno, wal
            try:
                wal.open({str(path)!r}, readonly=True)
            except wal.StorageError as exc:
                assert exc.errno == errno.EACCES, exc.errno
                print("refused:", exc)
        """, user=NOBODY)
        assert done.returncode == 0, done.stderr
        assert "refused:" in done.stdout, done.stdout
        assert "a writer has the store open (pid" in done.stdout and "lock.mdb" in done.stdout, done.stdout
        assert store.get(b"later") == b"x"  # the writer is unharmed by the refused reader


def test_a_torn_tail_met_on_a_full_disk_leaves_no_empty_broken_file(small_fs: Path) -> None:
    """The open's copy of a torn tail into a .broken file fails on a full disk: NoSpaceError,
    and no copy cut short is left (an empty one stayed beside the real copy made later)."""
    path = small_fs / "log"
    with wal.Log.open(path, segment_bytes=1 << 20) as log:
        log.append(b"r" * 1000)
    seg = next(path.glob("*.wal"))
    data = seg.read_bytes()
    end = (len(data.rstrip(b"\0")) + 7) & ~7
    with open(seg, "r+b") as f:  # a record torn mid-write: a header and 64 KiB of its payload
        f.seek(end)
        f.write(b"\x11\x22\x33\x44" + b"\x00\x00\x02\x00" + b"t" * (64 << 10))
    _fill(small_fs)
    try:
        with pytest.raises(wal.NoSpaceError):
            wal.Log.open(path, segment_bytes=1 << 20)
        assert not list(path.glob("*.broken"))
    finally:
        _give_back(small_fs)
    with wal.Log.open(path, segment_bytes=1 << 20) as log:
        assert [p for _lsn, p in log.read(1)] == [b"r" * 1000]
    (broken,) = path.glob("*.broken")
    assert broken.read_bytes().endswith(b"t" * (64 << 10))


def test_a_bare_log_open_maps_what_the_host_refuses_to_storage_errors(small_fs: Path, shared_dir: Path) -> None:
    """`wal.Log.open` on its own (no store around it) raises the documented StorageError family
    with errno set: NotFoundError, NoSpaceError, EACCES, EMFILE -- never a raw OSError."""
    with pytest.raises(NotFoundError, match=r"opening the log in .* read-only") as missing:
        wal.Log.open(small_fs / "nothing", readonly=True)
    assert missing.value.errno == errno.ENOENT and isinstance(missing.value, FileNotFoundError)
    _fill(small_fs)
    try:
        with pytest.raises(wal.NoSpaceError, match="opening the log in") as full:
            wal.Log.open(small_fs / "new", segment_bytes=1 << 20)  # its first segment cannot be made
        assert full.value.errno == errno.ENOSPC
    finally:
        _give_back(small_fs)
    with wal.Log.open(small_fs / "new", segment_bytes=1 << 20) as log:  # space is back: it opens
        log.append(b"x")
    made = shared_dir / "log"
    wal.Log.open(made).close()
    done = _run_child(f"""
        import errno, wal
        for where, kwargs in (({str(made)!r}, {{}}), ({str(shared_dir / "mine")!r}, {{}})):
            try:
                wal.Log.open(where, **kwargs)
            except wal.StorageError as exc:
                print("refused", exc.errno == errno.EACCES, "permission denied" in str(exc).lower())
        with wal.Log.open({str(made)!r}, readonly=True) as ro:  # reading needs no write access
            print("read", ro.watermarks.appended)
    """, user=NOBODY if os.geteuid() == 0 else None)
    assert done.returncode == 0, done.stderr
    if os.geteuid() == 0:
        assert done.stdout.count("refused True True") == 2, done.stdout
    assert "read 0" in done.stdout, done.stdout
    done = _run_child(f"""
        import errno, os, wal
        hog = []
        try:
            while True:
                hog.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        try:
            wal.Log.open({str(shared_dir / "nofd")!r})
        except wal.StorageError as exc:
            print("refused", exc.errno == errno.EMFILE, "descriptors" in str(exc))
    """, nofile=32)
    assert done.returncode == 0, done.stderr
    assert "refused True True" in done.stdout, done.stdout


def test_no_file_descriptors_left_is_a_storage_error_and_open_stores_go_on(tmp_path: Path) -> None:
    done = _run_child(f"""
        import errno, wal
        stores, error = [], None
        for i in range(100):
            try:
                stores.append(wal.open({str(tmp_path)!r} + f"/s{{i}}"))
            except wal.WalError as exc:
                error = exc
                break
        assert error is not None, "100 stores opened under a 48-descriptor limit"
        assert isinstance(error, wal.StorageError), repr(error)
        assert error.errno == errno.EMFILE and "descriptors" in str(error), str(error)
        for i, s in enumerate(stores):  # the open ones are unharmed
            s.put(b"k", b"%d" % i)
            assert s.get(b"k") == b"%d" % i
        stores.pop().close()
        stores.append(wal.open({str(tmp_path)!r} + f"/s{{len(stores)}}"))  # a descriptor is back: opens
        for s in stores:
            s.close()
        print("ok", len(stores))
    """, nofile=48)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")


@pytest.mark.parametrize("level", ["sync", "interval", "buffered"])
def test_no_file_descriptors_left_while_a_store_runs_refuses_commits_and_goes_on(tmp_path: Path,
                                                                                 level: str) -> None:
    """A segment roll that cannot open its new segment (EMFILE) refuses the commits that needed
    it with a StorageError, like a full disk: no fail-stop, and once descriptors are back the
    same store goes on, without a reopen, and loses nothing it acknowledged."""
    done = _run_child(f"""
        import errno, os, wal
        path = {str(tmp_path / "store")!r}
        store = wal.open(path, durability={level!r}, segment_bytes=1 << 16, checkpoint_bytes=1 << 16)
        acked = {{}}
        for i in range(50):
            store.put(b"a%05d" % i, b"x" * 500); acked[b"a%05d" % i] = b"x" * 500
        hog = []
        try:
            while True:
                hog.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
        seen, refused = set(), 0
        for i in range(2000):  # 1 MB of log: segment rolls and checkpoints need descriptors
            try:
                store.put(b"b%05d" % i, b"y" * 500); acked[b"b%05d" % i] = b"y" * 500
            except wal.StorageError as exc:
                assert exc.errno == errno.EMFILE and "descriptor" in str(exc), str(exc)
                assert not isinstance(exc, wal.NoSpaceError), repr(exc)
                seen.add(type(exc).__name__); refused += 1
        try:  # syncs the log first: its next segment needs a descriptor
            store.checkpoint()
        except wal.StorageError as exc:
            assert exc.errno == errno.EMFILE and not isinstance(exc, wal.NoSpaceError), repr(exc)
            seen.add(type(exc).__name__); refused += 1
        # At buffered the commits were acknowledged in memory (the buffer had room): only the
        # checkpoint's sync of the log meets the missing descriptor.
        assert refused, "nothing needed a descriptor: the test made no roll"
        for fd in hog:
            os.close(fd)
        for i in range(2000):  # descriptors are back: the same store goes on, rolls included
            store.put(b"c%05d" % i, b"z" * 500); acked[b"c%05d" % i] = b"z" * 500
        store.checkpoint()
        assert not store.stats()["failed"], store.stats()["failed"]
        store.close()  # nothing to report: the refused records were written once descriptors returned
        with wal.open(path) as again:
            got = dict(again.scan())
        lost = [k for k, v in acked.items() if got.get(k) != v]
        assert not lost, lost[:3]
        print("ok", refused, *sorted(seen))
    """, nofile=64)
    assert done.returncode == 0, done.stderr
    seen = done.stdout.split()
    assert seen[0] == "ok"
    assert set(seen[2:]) == {"StorageError"}, seen


def test_a_store_directory_deleted_under_a_running_store_gives_only_wal_errors(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = wal.open(path, segment_bytes=1 << 16, checkpoint_bytes=1 << 16)
    for i in range(50):
        store.put(b"k%03d" % i, b"v" * 500)
    shutil.rmtree(path)
    seen: list[BaseException] = []
    for i in range(1000):  # segment rolls and automatic checkpoints meet the missing directory
        try:
            store.put(b"n%04d" % i, b"w" * 500)
        except wal.WalError as exc:
            seen.append(exc)
    for call in (store.checkpoint, store.close):
        try:
            call()
        except wal.WalError as exc:
            seen.append(exc)
    assert all(isinstance(e, wal.WalError) for e in seen)  # never a raw OSError (it would have escaped)
    with wal.open(path) as fresh:  # the path is free again: a new, empty store
        assert fresh.get(b"k001") is None


def test_a_state_file_replaced_under_a_running_store_is_found_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store"
    acked: dict[bytes, bytes] = {}
    with wal.open(path) as store:
        for i in range(200):
            store.put(b"k%03d" % i, b"v%d" % i)
            acked[b"k%03d" % i] = b"v%d" % i
        store.checkpoint()
        shutil.copy(path / "state" / "data.mdb", tmp_path / "old.mdb")
        for i in range(200, 400):
            store.put(b"k%03d" % i, b"v%d" % i)
            acked[b"k%03d" % i] = b"v%d" % i
        store.checkpoint()
        os.replace(tmp_path / "old.mdb", path / "state" / "data.mdb")  # an older copy, renamed over it
    try:
        with wal.open(path) as again:
            assert dict(again.scan()) == acked
    except wal.CorruptionError as exc:
        assert "data.mdb" in str(exc)


def test_a_store_never_closed_is_closed_at_exit_with_a_resource_warning(tmp_path: Path) -> None:
    path = tmp_path / "store"
    done = _run_child(f"""
        import wal
        store = wal.open({str(path)!r}, durability="buffered", rpo_ms=10_000)
        store.put(b"k", b"v")  # acknowledged in memory only: the exit's close writes it
    """)
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr  # ignored by default, as for files
    with wal.open(path) as store:
        assert store.get(b"k") == b"v"
        assert store.stats()["records_replayed"] == 0  # closed cleanly: the state had it
    shown = subprocess.run([sys.executable, "-X", "dev", "-c",
                            f"import wal; wal.open({str(tmp_path / 'two')!r}).put(b'k', b'v')"],
                           check=False, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "ResourceWarning: unclosed store" in shown.stderr


def test_a_thousand_stores_open_at_once_in_one_process_each_usable(tmp_path: Path) -> None:
    """Each store's LMDB map starts at twice its file (64 MiB at least), not 1 TiB, so 1,000 fit in the
    address space; each takes 6 file descriptors (the child raises RLIMIT_NOFILE)."""
    point = tmp_path / "fs"
    _mount(point, "1g")  # fsync-free: the resource under test is the process's, not the disk's
    try:
        done = _run_child(f"""
            import wal
            root = {str(point)!r}
            stores = [wal.open(f"{{root}}/s{{i}}", segment_bytes=1 << 18) for i in range(1000)]
            for i, s in enumerate(stores):
                s.put(b"k", b"%d" % i)
            for i, s in enumerate(stores):
                assert s.get(b"k") == b"%d" % i
                assert s.stats()["state_map_bytes"] < 1 << 30
            for s in stores:
                s.close()
            with wal.open(f"{{root}}/s999") as s:
                assert s.get(b"k") == b"999"
            print("ok")
        """, nofile=8192, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == "ok"
    finally:
        _umount(point)


@pytest.mark.parametrize("level", list(LEVELS))
def test_an_idle_store_sleeps_long_and_its_next_commit_wakes_it(tmp_path: Path, level: str) -> None:
    """A thousand idle stores must not each wake fifty times a second: after 50 empty rounds the
    materializer raises the core's idle flag and sleeps a second; the next commit (C path or
    Python path) lowers it and wakes the materializer."""
    with wal.open(tmp_path / level, **LEVELS[level]) as store:  # type: ignore[arg-type]
        store.put(b"a", b"1")
        assert _wait(lambda: store._core.idle, timeout=30), "the materializer never went idle"
        store.put(b"b", b"2")  # the C fast path
        assert not store._core.idle
        assert _wait(lambda: store.watermarks.applied >= 2)
        assert _wait(lambda: store._core.idle, timeout=30)
        with store.transaction() as tx:  # the Python path
            tx.put(b"c", b"3")
        assert not store._core.idle
        assert _wait(lambda: store.watermarks.applied >= 3)


# ---- the archive ----------------------------------------------------------------------------------
# The shipper stages nothing locally: it reads the log's own segments and PUTs them, so a full disk
# under an archived store is the log's (NoSpaceError, as above) and shipping goes on; a full
# filesystem under a file:// archive is an outage of the object store (retried with backoff); a
# restore into a full filesystem is NoSpaceError with nothing left behind.


def test_a_full_disk_under_an_archived_store_refuses_commits_with_no_space_and_shipping_goes_on(
        small_fs: Path, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/archive"
    oracle = Oracle()
    path = small_fs / "store"
    store = wal.open(path, archive=url, archive_rpo_ms=60_000, preallocate="size", segment_bytes=8 << 20,
                     checkpoint_bytes=1 << 20)
    for i in range(50):
        assert oracle.put(store, b"before%03d" % i, _value("before", i))
    _fill(small_fs)
    _commit_until_refused(store, oracle, "full")
    oracle.no_space_errors_only()
    assert store.stats()["failed"] is None
    durable = store.watermarks.durable
    assert _wait(lambda: store.stats()["archived_lsn"] >= durable), "shipping stopped on a full local disk"
    assert store.stats()["archive_error"] is None
    _give_back(small_fs)
    for i in range(20):
        assert oracle.put(store, b"after%03d" % i, _value("after", i)), oracle.errors[-1]
    store.close()
    oracle.check(path)
    wal.restore(url, tmp_path / "restored")
    oracle.check(tmp_path / "restored")


def test_a_full_file_archive_is_an_outage_retried_until_space_returns(small_fs: Path, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="wal.archive")
    url = f"file://{small_fs}/archive"
    store = wal.open(tmp_path / "store", archive=url, archive_rpo_ms=60_000)
    store.put("first", b"1", durability="replicated")
    _fill(small_fs)
    lsns = [store.put(f"k{i}", _value("k", i)) for i in range(200)]  # sync: never waits for the archive
    assert _wait(lambda: store.stats()["archive_error"] is not None)
    assert "No space" in store.stats()["archive_error"]
    assert store.stats()["archived_lsn"] < lsns[-1]
    done = threading.Event()

    def replicated() -> None:
        store.put("critical", b"2", durability="replicated")
        done.set()

    t = threading.Thread(target=replicated)
    t.start()
    assert not done.wait(0.5), "a replicated commit was acknowledged while the archive could not store it"
    _give_back(small_fs)
    t.join(30)
    assert done.is_set()
    assert _wait(lambda: store.stats()["archive_error"] is None)
    store.close()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "unreachable" in r.getMessage()]
    assert len(errors) == 1 and any("shipping resumed" in r.getMessage() for r in caplog.records)
    report = wal.restore(url, tmp_path / "restored")
    with wal.open(tmp_path / "restored") as r:
        assert r.get("critical") == b"2" and r.get("k199") == _value("k", 199) and report.lsn == lsns[-1] + 1


def test_a_restore_into_a_full_disk_raises_no_space_and_leaves_nothing(small_fs: Path, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/archive"
    with wal.open(tmp_path / "store", archive=url) as s:
        for i in range(300):
            s.put(f"k{i}", _value("k", i))
    _fill(small_fs)
    with pytest.raises(wal.NoSpaceError, match="space"):
        wal.restore(url, small_fs / "restored")
    assert not (small_fs / "restored").exists()
    _give_back(small_fs)
    assert wal.restore(url, small_fs / "restored").lsn == 300


def test_an_archive_snapshot_is_not_spooled_onto_a_disk_without_room_for_it_and_the_store_goes_on(
        small_fs: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A writer's archive snapshot is spooled in the store's directory, on the disk the log
    needs: with less room than the state and a margin for the log, it is not taken (NoSpaceError
    before a byte is written; the shipper says so in a WARNING and tries again later), and the
    store commits and ships its log all the same."""
    url = f"file://{tmp_path}/archive"
    with caplog.at_level(logging.WARNING, logger="wal.archive"), \
            wal.open(small_fs / "s", archive=url, archive_rpo_ms=200) as store:
        for i in range(20):
            store.put(f"k{i}", _value("a", i))
        store.checkpoint()
        with pytest.raises(wal.NoSpaceError, match=r"needs about \d+ MiB of free disk"):
            store._ship_snapshot_now()
        assert not [n for n in os.listdir(small_fs / "s") if n.startswith("archive-snapshot-")]
        assert _wait(lambda: "needs about" in caplog.text)  # the shipper's own snapshot, deferred
        store.put("after", b"v")
        assert _wait(lambda: store.stats()["archived_lsn"] == 21)
        assert store.stats()["archive_snapshots"] == 0
    report = wal.restore(url, tmp_path / "restored")  # from the log alone
    assert report.lsn == 21 and report.snapshot_lsn == 0
