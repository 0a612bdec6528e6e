"""The materialized state: an LMDB environment holding the effect of the log up to `applied_lsn`.

Durable at checkpoints, reopened at the last one after a crash
--------------------------------------------------------------
The log is what makes a commit durable (I2); the state only has to be durable when a
checkpoint lets log segments go. So LMDB is opened with MDB_NOSYNC: its transactions are
written to the file (write(2), never a writable mapping) but not fsynced, and the disk takes
the state's pages at checkpoints rather than beside every group of commits (a 4 KiB value is
two LMDB pages, more bytes than its log record: docs/performance.md).

An unsynced LMDB is only safe to reopen if the snapshot it falls back to is whole. LMDB is
copy-on-write, but it reuses the pages a newer transaction freed as soon as no reader holds
the snapshot that still uses them, and a power cut may keep a later meta page and lose the
pages it points at. Hence `checkpoint`:

1. begin a read transaction (the *pin*): LMDB reuses none of the pages of its snapshot
   while it is open, which is until the next checkpoint or the close;
2. fdatasync the file (``mdb_env_sync(force)``): every page of that snapshot is durable;
3. save that snapshot's meta page, with its transaction id and the boot id, in
   ``checkpoint.meta`` (written aside, fsynced, renamed, directory fsynced; FORMAT.md §16);
4. let the previous pin go.

On a writable open, if the newest meta page of ``data.mdb`` is not the saved one, the state
was not closed cleanly. If the machine restarted since the checkpoint (the boot id differs),
the pages that newer meta page points at may never have reached the disk: the saved page is
written over both meta slots before LMDB opens (``restore`` in native/lmdbcall.c), LMDB opens
at the checkpoint's snapshot, whose pages the pin kept from reuse until the writer stopped,
and the store replays the log from the checkpoint's ``applied_lsn`` (the log keeps every
segment after it). If it did not restart (a process kill), the page cache holds every page
LMDB wrote: the state is taken as it is and the open checkpoints it at once, before any
write. A restore is also skipped while another process has the environment open (it proves
the page cache is whole). A read-only open, which cannot restore, refuses a state that was not
closed cleanly before a restart and reads it otherwise. Meta pages that no crash explains
(not a meta page at all, or older than the checkpoint) are damage, never restored over.

`applied_lsn` is stored in the same LMDB transaction as the state it describes, so whatever
snapshot LMDB opens says exactly which LSN it reflects, and recovery replays from
``applied_lsn + 1``. Invariant I1 (log before state) is enforced in `State.apply`: a batch is
committed only if its last LSN is durable in the log, checked right before the LMDB commit.

A state written by store format 1 (LMDB synced at every commit, no ``checkpoint.meta``) is
taken as it is (``legacy_synced``) and gets its first checkpoint when opened.

Where LMDB comes from, and why our own binding
----------------------------------------------
Every LMDB call of the package goes through ``wal._lmdbcall`` (native/lmdbcall.c), a thin
binding of LMDB 0.9's C API. The library is the one py-lmdb (the ``lmdb`` package) links
into its extension: py-lmdb 3.x exports it as ``mdb09_*``, 1.4.x as ``mdb_*``; `_load_lmdb`
resolves those symbols from the already-loaded file at import and checks the engine is
0.9.x, the format py-lmdb opens by default, so other processes reading our state with
py-lmdb see the same file and lock-file layout. Why not py-lmdb itself: its ``putmulti``
releases and re-takes the GIL around every item, so with a thread committing in a loop the
materializer could not apply anything; `State.apply` is now one C call that does the whole
LMDB transaction with the GIL released. And why not py-lmdb beside it: LMDB forbids opening
one environment twice in a process (its fcntl locks are per process) and py-lmdb does not
expose its handles, so nothing in ``wal/`` opens LMDB through py-lmdb.

Databases: ``data`` (key -> u64 version LE + value), ``idem`` (idempotency key -> u64 LSN +
u64 commit time ms, then their checksum from store format 6), ``meta`` (``applied_lsn``,
``durable_seen``, ...), and ``tail`` (store format 3): a ``data`` value that would put only a
few bytes on one more LMDB overflow page keeps those bytes there instead, flagged in its
version's top bit. The binding
splits on write and joins on read (native/lmdbcall.c, "Split values"), so nothing here sees it;
it halves the pages a 4 KiB value costs the disk (docs/performance.md).

Errors. Every LMDB error leaves this module as a `wal.WalError` (found by the corruption
matrix, tests/test_corruption_matrix.py, which flips bytes of ``data.mdb``), classified by
LMDB's int code (`raise_lmdb`): damage LMDB
detects (bad magic or version, a page that is not found, a database with impossible flags)
is `CorruptionError` naming ``data.mdb``; anything else LMDB reports (disk error, map full,
too many readers) is `StateError`. LMDB keeps no checksums, so damage it does not detect is
neither: see the known limitations in that test.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import importlib
import importlib.metadata
import logging
import os
import shutil
import struct
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, NoReturn

from wal._bindings import lib
from wal._bindings import lmdbcall as _lmdbcall
from wal._fs import boot_id, fsync_dir
from wal._lmdbcall import DATA, IDEM, META, LmdbError
from wal.errors import (
    _ADVICE,
    ClosedError,
    CorruptionError,
    FailedError,
    LockedError,
    NoSpaceError,
    StorageError,
    WalError,
    storage_error,
)
from wal.log import record

_logger = logging.getLogger("wal.store.state")

_U64 = struct.Struct("<Q")
_IDEM = struct.Struct("<QQ")
APPLIED_KEY = b"applied_lsn"
# The log's durable LSN as seen at the last apply: a log that later ends below it lost durable
# records (a zeroed or cut tail looks like unwritten space; this mark makes the loss visible).
DURABLE_SEEN_KEY = b"durable_seen"
# Set (to b"1") by a sealed store's writable open: the state holds envelopes, whatever STORE says.
# A STORE that lost its "sealed" object (deleted, replaced, copied without it) would otherwise
# open the store plain: ciphertext served as values, and new values written in the clear.
SEALED_KEY = b"sealed"
# LMDB's map is address space, not memory or disk (the file grows with the data), but a process
# has only 128 TiB of it: a fixed 1 TiB map per state stopped the 128th store. So the map starts
# at twice the file (at least MIN_MAP_SIZE) and grows on MDB_MAP_FULL (`State._grow_map`), by
# doubling, capped at MAX_MAP_SIZE. DEFAULT_MAP_SIZE is a map no state outgrows, for readers
# outside the package (py-lmdb) that would rather never see MDB_MAP_RESIZED.
MIN_MAP_SIZE = 64 << 20
MAX_MAP_SIZE = 1 << 40
DEFAULT_MAP_SIZE = MAX_MAP_SIZE
_SCAN_CHUNK = 1024  # keys per call of a snapshot's walk, at most
_SCAN_CHUNK_BYTES = 4 << 20  # and about this much of their values
# A state file up to this size is verified entry by entry by every open (State._small_enough_to_verify).
VERIFY_ON_OPEN_BYTES = 8 << 20
_UPGRADE_BATCH = 20_000  # entries given a checksum per LMDB transaction at the upgrade to store format 4

CHECKPOINT_FILE = "checkpoint.meta"
DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"
# checkpoint.meta (FORMAT.md §16): this header, the meta page, a CRC-32C of everything before it.
_CKP_MAGIC = b"AGWSTCKP"
_CKP_VERSION = 1
_CKP_HEAD = struct.Struct("<8sII16sQQQ")  # magic, version, page size, boot id, txnid, applied LSN, unix ms
# checkpoint.meta's boot id after a failed fdatasync of the state: no boot has it, so the next
# writable open reopens at the checkpoint as after a restart (`State._distrust_since_checkpoint`).
UNTRUSTED_BOOT_ID = bytes(16)
_CKP_MAX_PAGE = 1 << 16
# The fields of LMDB 0.9's meta page read here (its page header, then MDB_meta; mdb.c): the page
# flags, magic and data version say it is a meta page, the free DB's md_pad is the page size,
# then the transaction id. Bytes [16, 152) are the whole MDB_meta: equal bytes, same snapshot.
_LMDB_P_META = 0x08
_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_DATA_VERSION = 1
_LMDB_META_BODY = slice(16, 152)
_LMDB_TXNID_AT = 144
_LMDB_MIN_PAGE = 4096
# A state created by this module holds at most LMDB's first transaction (the one that creates its
# databases) before its first checkpoint is saved.
_CREATED_TXNID = 1

# The py-lmdb releases that carry LMDB 0.9 under names `_lmdbcall.load` resolves: the same range as
# pyproject.toml's dependency, and every release in it on the index is installed and drives a store in
# .ci/packaging (upper bound: the next minor release may move the exports again).
LMDB_PACKAGE_RANGE = ">=1.4.1,<3.1"


def _load_lmdb(library: str, installed: str) -> str:
    """Bind `wal._lmdbcall` to the LMDB 0.9 in `library` (a file already loaded in this process);
    returns LMDB's version string. ImportError naming the installed `lmdb` package if the file
    does not export LMDB 0.9's functions or holds another LMDB version."""
    try:
        return _lmdbcall.load(library)
    except ImportError as exc:
        raise ImportError(
            f"agentwal needs LMDB 0.9 from the `lmdb` package (py-lmdb {LMDB_PACKAGE_RANGE}), whose extension "
            f"exports it as mdb09_* (py-lmdb 3.x) or mdb_* (1.4.x); the installed lmdb {installed} does not: {exc}. "
            f"Install a supported release: pip install 'lmdb{LMDB_PACKAGE_RANGE}'"
        ) from exc


def _lmdb_library() -> tuple[str, str]:
    """(path of py-lmdb's compiled extension, installed `lmdb` version), importing it so that it is
    loaded: the binding takes LMDB from that loaded file, never a second copy."""
    try:
        installed = importlib.metadata.version("lmdb")
    except importlib.metadata.PackageNotFoundError:
        installed = "(not installed)"
    try:
        extension = importlib.import_module("lmdb.cpython")
    except ImportError as exc:
        raise ImportError(f"agentwal needs the `lmdb` package (py-lmdb {LMDB_PACKAGE_RANGE}) with its compiled "
                          f"extension lmdb.cpython; installed lmdb {installed}: {exc}") from exc
    return str(extension.__file__), installed


LMDB_VERSION = _load_lmdb(*_lmdb_library())


class InvariantError(WalError):
    """An internal invariant would be broken; the operation was refused."""


class StateError(WalError):
    """LMDB failed for a reason other than damage (disk error, map full, too many readers...)."""


class StateStorageError(StateError, StorageError):
    """LMDB failed because the operating system refused it (a read-only filesystem, no
    permission, an I/O error...): a StateError, and a `wal.StorageError` (an `OSError`, with
    `errno` and `filename` set) as every refusal of the operating system is."""


READER_SLOTS = _lmdbcall.MAX_READERS  # of a lock file this version makes (native/lmdbcall.c says why so many)


class ReadersFullError(StateError):
    """Every reader slot of the state's lock file is held by a live reader. A read raises it;
    the store's own applies and checkpoints wait and retry (a host shortage, not a failure)."""


# LMDB's codes for a file that is not what it wrote: corruption, not a failure to retry. EINVAL
# is LMDB's answer to impossible parameters read from the file; E_BAD_VALUE is a stored value of
# the wrong size (applied_lsn, an idempotency entry), found by the binding.
_DAMAGE = frozenset({_lmdbcall.MDB_CORRUPTED, _lmdbcall.MDB_PAGE_NOTFOUND, _lmdbcall.MDB_INVALID,
                     _lmdbcall.MDB_VERSION_MISMATCH, _lmdbcall.MDB_INCOMPATIBLE, _lmdbcall.MDB_BAD_DBI,
                     _lmdbcall.MDB_PANIC, _lmdbcall.MDB_BAD_VALSIZE, errno.EINVAL, _lmdbcall.E_BAD_VALUE,
                     _lmdbcall.E_CHECKSUM})

# Operating-system errors LMDB passes on (its positive codes are errno values): not damage.
_OS_ERRORS = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                        errno.EMFILE, errno.ENFILE, errno.EIO, errno.ENOMEM, errno.EAGAIN, errno.EBUSY,
                        errno.ENOTDIR})

# Failures while opening that are about resources, not the file: classified as at any other time.
_OPEN_RESOURCE = frozenset({errno.EAGAIN, errno.ENOMEM, errno.ENOSPC, _lmdbcall.MDB_READERS_FULL,
                            _lmdbcall.MDB_MAP_FULL})


# How a damaged state's message ends: the two ways back, from the log or from elsewhere.
_REBUILD_OR_RESTORE = ("If the log still holds every commit from LSN 1 (no checkpoint removed a segment), move "
                       "state/ aside and reopen to rebuild the state (`agentwal repair --rebuild-state STORE` does "
                       "it); otherwise restore the store from a backup, or from its object archive (`agentwal "
                       "restore URL DIR`).")


def _sync_failed(exc: LmdbError, path: str) -> FailedError:
    """A failed fdatasync of the state: never retried and trusted (fsyncgate: the kernel may have
    dropped the pages it could not write, and a second fdatasync then succeeds with them lost),
    whatever its errno, ENOSPC included. No checkpoint rests on it: the store stops its writes
    (fail-stop, I5), and the next open falls back to the last checkpoint and replays the log."""
    text = exc.args[1] if len(exc.args) > 1 else str(exc)
    return FailedError(f"the fdatasync of the LMDB state in {path} failed ({text}): its pages may be lost, so it "
                       "is not retried; the store stops its writes, and reopening falls back to the last checkpoint "
                       "and replays the log from there")


def raise_lmdb(exc: LmdbError | struct.error, path: str, doing: str, *, opening: bool = False) -> NoReturn:
    """Re-raise an LMDB error (or a stored value of the wrong size) as a WalError that says what to do.
    On open every error but an operating-system one is damage: the same call succeeds on any file
    LMDB wrote. Any other LMDB code (map full, too many readers, ...) is StateError, and an errno
    LMDB has no business returning for a sound file is damage."""
    data = os.path.join(path, "data.mdb")
    code: int | None = exc.args[0] if isinstance(exc, LmdbError) else None
    text = exc.args[1] if isinstance(exc, LmdbError) else str(exc)
    if code == _lmdbcall.E_CLOSED:
        raise ClosedError(f"the LMDB state in {path} is closed (while {doing})") from exc
    if code == _lmdbcall.E_FORKED:
        raise LockedError(f"the LMDB state in {path} was opened by another process (this is a forked child); "
                          "open the store again in this process") from exc
    if code in (errno.ENOSPC, errno.EDQUOT) or (code == errno.EIO and not opening and _nearly_full(path)):
        # LMDB 0.9 reports a short write (the disk filled up in the middle of it) as EIO.
        kind = errno.EDQUOT if code == errno.EDQUOT else errno.ENOSPC
        raise NoSpaceError(
            f"the LMDB state in {path} could not grow while {doing}: {text}. Nothing acknowledged is lost (the "
            "log holds it); the store retries once space is freed on this filesystem", errno=kind,
            filename=os.path.join(path, DATA_FILE)) from exc
    if code == _lmdbcall.MDB_READERS_FULL and not opening:
        raise ReadersFullError(
            f"every reader slot of the LMDB state in {path} is taken (while {doing}: {text}): each open "
            "snapshot, unfinished scan iterator and read-only opener holds one while it lasts. Close snapshots "
            "and scans when done (they are context managers); slots of processes that died are freed at "
            "once") from exc
    if code in _OS_ERRORS:
        advice = _ADVICE.get(code)
        if code == errno.EACCES and opening:
            advice = ("LMDB needs read access to state/data.mdb, and write access to state/lock.mdb (its table of "
                      "readers) unless the store is opened read-only while no writer has it open; " + (advice or ""))
        raise StateStorageError(f"the LMDB state in {path} failed while {doing}: {text}"
                                + (f"; {advice}" if advice else ""), errno=code, filename=data) from exc
    if opening or code is None or code in _DAMAGE or code > 0:
        raise CorruptionError(
            f"the LMDB state {data} is damaged ({text}) -- found while {doing}. No crash leaves the state so "
            "(it is reopened at its last checkpoint): this is damage to the file (disk, copy or edit). "
            f"`agentwal verify` checks every entry. The state is derived from the log. {_REBUILD_OR_RESTORE}",
            path=data, reason="state damaged",
        ) from exc
    raise StateError(f"the LMDB state in {path} failed while {doing}: {text}") from exc


def _empty_key(path: str) -> NoReturn:
    """The store never writes an empty key: one in the state is damage."""
    raise CorruptionError(f"the LMDB state in {path} holds an empty key", path=os.path.join(path, "data.mdb"),
                          reason="state damaged")


def _nearly_full(path: str) -> bool:
    """The filesystem of `path` has less than 1 MiB free for this user: an EIO from an LMDB write
    there is a short write at a full disk (mdb_page_flush turns one into EIO), not a bad device.
    LMDB aborted the transaction before writing a meta page, so running it again is safe."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20


def _applied(path: str, raw: bytes | None) -> int:
    if raw is not None and len(raw) != _U64.size:
        raise CorruptionError(f"the LMDB state in {path} holds an applied_lsn of {len(raw)} bytes, not 8",
                              path=os.path.join(path, "data.mdb"), reason="state damaged")
    return _U64.unpack(raw)[0] if raw else 0

# ---- LMDB's meta pages and the saved checkpoint ----


class SavedCheckpoint(NamedTuple):
    """checkpoint.meta: the meta page of the state's last durable snapshot, and where it came from."""

    page: bytes
    txnid: int
    applied_lsn: int
    boot_id: bytes
    unix_ms: int


def _meta_txnid(page: bytes) -> int | None:
    """The transaction id of an LMDB 0.9 meta page; None if `page` is not one."""
    if len(page) < _LMDB_MIN_PAGE:
        return None
    flags, = struct.unpack_from("<H", page, 10)
    magic, version = struct.unpack_from("<II", page, 16)
    if not flags & _LMDB_P_META or magic != _LMDB_MAGIC or version != _LMDB_DATA_VERSION:
        return None
    txnid: int = struct.unpack_from("<Q", page, _LMDB_TXNID_AT)[0]
    return txnid


def _meta_pages(path: str, psize: int) -> list[bytes]:
    """Both meta slots of path/data.mdb as they read now (short or empty where the file is)."""
    try:
        fd = os.open(os.path.join(path, DATA_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        return [os.pread(fd, psize, slot * psize) for slot in (0, 1)]
    finally:
        os.close(fd)


def _newest_meta(pages: list[bytes]) -> tuple[int, bytes] | None:
    """(txnid, page) of the meta page LMDB would open at, of the slots `_meta_pages` read; None if
    neither slot is one."""
    found = [(txnid, page) for page in pages if (txnid := _meta_txnid(page)) is not None]
    return max(found, key=lambda tp: tp[0]) if found else None


def _is_saved_snapshot(newest: tuple[int, bytes] | None, saved: SavedCheckpoint) -> bool:
    """LMDB would open at exactly the saved snapshot (a clean close, or nothing written since)."""
    return newest is not None and newest[1][_LMDB_META_BODY] == saved.page[_LMDB_META_BODY]


def read_checkpoint(path: str) -> SavedCheckpoint | None:
    """path/checkpoint.meta, checked; None if there is none. CorruptionError if it is damaged: it is
    written aside, fsynced and renamed into place, so no crash leaves it partial."""
    name = os.path.join(path, CHECKPOINT_FILE)
    try:
        with open(name, "rb") as f:
            raw = f.read(_CKP_HEAD.size + _CKP_MAX_PAGE + 4 + 1)
    except FileNotFoundError:
        return None

    def damaged(why: str) -> NoReturn:
        raise CorruptionError(
            f"{name} is damaged ({why}). It holds the state's last durable snapshot; without it a state not "
            f"closed cleanly cannot be reopened safely. {_REBUILD_OR_RESTORE}",
            path=name, reason="bad checkpoint file")

    if len(raw) < _CKP_HEAD.size + 4:
        damaged(f"{len(raw)} bytes")
    magic, version, psize, boot, txnid, applied, unix_ms = _CKP_HEAD.unpack_from(raw)
    if magic != _CKP_MAGIC:
        damaged("bad magic")
    if version != _CKP_VERSION:
        damaged(f"version {version}, this agentwal reads {_CKP_VERSION}")
    if len(raw) != _CKP_HEAD.size + psize + 4 or not _LMDB_MIN_PAGE <= psize <= _CKP_MAX_PAGE:
        damaged(f"{len(raw)} bytes for a page of {psize}")
    if lib.wal_crc32c(0, raw[:-4], len(raw) - 4) != int.from_bytes(raw[-4:], "little"):
        damaged("bad crc")
    page = raw[_CKP_HEAD.size:-4]
    if _meta_txnid(page) != txnid:
        damaged("its page is not LMDB's meta page of the transaction it names")
    return SavedCheckpoint(page, txnid, applied, boot, unix_ms)


def check_meta_pages(path: str, saved: SavedCheckpoint) -> tuple[int, bytes] | None:
    """The newest meta page of the state in `path` (txnid, page), checked against its checkpoint
    `saved`; None where a slot is not a meta page (left to LMDB, which refuses the file).
    CorruptionError where they cannot come from LMDB writing after the checkpoint: the newest
    older than the checkpoint, or another page under the checkpoint's transaction id. A
    writable open refuses such a state, and `agentwal verify` reports it (it said "sound")."""
    pages = _meta_pages(path, len(saved.page))
    newest = _newest_meta(pages)
    if len(pages) != 2 or any(_meta_txnid(page) is None for page in pages) or newest is None:
        return None
    if not _is_saved_snapshot(newest, saved) and newest[0] <= saved.txnid:
        which = (f"differs from the one its last checkpoint made durable under the same transaction, {saved.txnid}"
                 if newest[0] == saved.txnid else
                 f"is older than the one its last checkpoint made durable, transaction {saved.txnid}")
        raise CorruptionError(
            f"the LMDB state {os.path.join(path, DATA_FILE)} is damaged (its newest meta page, transaction "
            f"{newest[0]}, {which}): "
            f"the file was replaced by an older copy or overwritten. {_REBUILD_OR_RESTORE}",
            path=os.path.join(path, DATA_FILE), reason="state damaged")
    return newest


def _write_checkpoint(path: str, saved: SavedCheckpoint) -> None:
    """Durably replace path/checkpoint.meta: written aside, fsynced, renamed, directory fsynced."""
    body = _CKP_HEAD.pack(_CKP_MAGIC, _CKP_VERSION, len(saved.page), saved.boot_id, saved.txnid,
                          saved.applied_lsn, saved.unix_ms) + saved.page
    name = os.path.join(path, CHECKPOINT_FILE)
    tmp = name + ".tmp"
    data = body + lib.wal_crc32c(0, body, len(body)).to_bytes(4, "little")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            if os.write(fd, data) != len(data):  # a short write: the filesystem filled up under it
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name)
        fsync_dir(path)
    except OSError as exc:
        # The previous checkpoint.meta is still in place (the new one is only renamed over it
        # once whole): the checkpoint did not happen, the caller may try again.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise storage_error(exc, f"writing the state's checkpoint file {name}") from exc


def initial_map_size(path: str) -> int:
    """The map a state opens with: twice its data file, at least MIN_MAP_SIZE, at most
    MAX_MAP_SIZE, in whole MiB. Room for the file to double before the first MDB_MAP_FULL."""
    try:
        size = os.stat(os.path.join(path, DATA_FILE)).st_size
    except OSError:
        size = 0
    return min(MAX_MAP_SIZE, max(MIN_MAP_SIZE, (2 * size + (1 << 20) - 1) >> 20 << 20))


class State:
    """The LMDB state of one store. A writable State holds the pin of its last checkpoint (see the
    module docstring) from the open to the close; `restored` says whether the open fell back to it."""

    def __init__(self, path: str, *, readonly: bool = False, map_size: int | None = None,
                 legacy_synced: bool = False, check_entries: bool = True, writer_lock: str | None = None) -> None:
        """`legacy_synced`: a state without checkpoint.meta was written by store format 1, which
        synced every LMDB commit: take it as it is (else such a state is refused, unless it is a
        creation cut short, which is started again). `map_size`: the map to start with (None:
        `initial_map_size`); it grows on MDB_MAP_FULL either way. `check_entries`: a writable
        open gives every entry without a checksum one (store format 4) -- only once STORE says 4,
        so never within an upgrade's earlier steps (wal/store/store.py `_upgrade_store`). `writer_lock`
        (read-only opens): the file the store's writer holds flock()ed, which lets a user who may
        not write lock.mdb read (`_open_unregistered`)."""
        if not readonly:
            os.makedirs(path, exist_ok=True)
        self.path = path
        self.readonly = readonly
        self.restored = False
        self._pin: _lmdbcall.Snapshot | None = None
        self._writer_lock_fd: int | None = None
        self._last_pgno_at_checkpoint = 0
        self.map_grows = 0
        saved = read_checkpoint(path)
        restore: bytes | None = None
        self._reader_hold_fd: int | None = None
        if readonly:
            self._check_readable(saved)
            self._reader_hold_fd = _hold_for_reading(path)
            _holding_states.add(self)
        elif saved is None:
            if not legacy_synced:
                self._discard_unfinished_creation()
        else:
            restore = self._page_to_restore(saved)
        try:
            small = self._small_enough_to_verify()
            if small:  # LMDB's own structure first: LMDB trusts it (native/lmdbcall.c, check_pages)
                try:
                    _lmdbcall.check_pages(os.path.join(path, DATA_FILE), restore)
                except LmdbError as exc:
                    if exc.args[0] != errno.ENOENT:
                        raise_lmdb(exc, path, "checking its pages", opening=True)
            try:
                try:
                    self._env = _lmdbcall.Env(path, readonly, map_size or initial_map_size(path), restore)
                except LmdbError as exc:
                    if not (readonly and exc.args[0] == errno.EACCES and writer_lock and not self._may_write_lock()):
                        raise
                    self._env = self._open_unregistered(writer_lock, map_size or initial_map_size(path), exc)
            except LmdbError as exc:
                if exc.args[0] == _lmdbcall.E_ALREADY_OPEN:
                    # One handle per environment and process (two would break LMDB's per-process locks).
                    raise LockedError(
                        f"the state in {path} is already open in this process (LMDB allows one handle per process); "
                        "read through the Store already open, or open it read-only from another process"
                    ) from exc
                raise_lmdb(exc, path, "opening it", opening=exc.args[0] not in _OPEN_RESOURCE)
            if small:
                try:
                    self.verify()
                except BaseException:
                    self.close()
                    raise
            if readonly:
                return
            try:
                self._pin = self._env.begin()
                if self._env.restored:
                    assert saved is not None
                    self.restored = True
                    _logger.warning("the state in %s was not closed cleanly: reopened at its last checkpoint "
                                    "(applied LSN %d); the log is replayed from there", path, saved.applied_lsn)
                # A checkpoint at once unless the saved one is this state as it is, taken in this boot: a
                # reader compares the boot id to tell a writer's unsynced pages from lost ones.
                if saved is None or self._pin.txnid() != saved.txnid or saved.boot_id != boot_id():
                    try:
                        self.checkpoint()
                    except InvariantError as exc:  # its meta pages disagree with what LMDB opened
                        raise CorruptionError(
                            f"the LMDB state {os.path.join(path, DATA_FILE)} is damaged ({exc}): a meta page names a "
                            "transaction LMDB did not write there. If the log still holds every commit from LSN 1, "
                            "move state/ aside and reopen to rebuild the state; otherwise restore the store from a "
                            "backup.", path=os.path.join(path, DATA_FILE), reason="state damaged") from exc
                if check_entries and not self._env.require_checks:
                    self._check_every_entry()
                if check_entries and not self._env.require_idem_checks:
                    self._check_every_idem()
            except LmdbError as exc:
                self.close()
                raise_lmdb(exc, path, "taking its first checkpoint", opening=True)
            except BaseException:
                self.close()
                raise
        except BaseException:
            # A refused read-only open lets its hold go: kept, it refused every later compaction.
            self._release_reader_hold()
            raise

    def _small_enough_to_verify(self) -> bool:
        """A state of at most VERIFY_ON_OPEN_BYTES is verified whole by every open (a few ms): the
        entry checksums catch damage to what a read returns, and this walk also damage to LMDB's
        pages that would make a key read as absent. A larger state is verified by `agentwal verify`."""
        try:
            return os.path.getsize(os.path.join(self.path, DATA_FILE)) <= VERIFY_ON_OPEN_BYTES
        except OSError:
            return False

    def _check_every_entry(self) -> None:
        """Give every entry written before store format 4 its checksum (native/lmdbcall.c, "DATA
        entries"): `_checksum_in_batches`."""
        self._checksum_in_batches(self._env.check_entries, "every entry (store format 4)")

    def _check_every_idem(self) -> None:
        """Give every idempotency entry written before store format 6 its checksum (native/lmdbcall.c,
        "IDEM values"): `_checksum_in_batches`."""
        self._checksum_in_batches(self._env.check_idem, "every idempotency entry (store format 6)")

    def _checksum_in_batches(self, step: Callable[[bytes | None, int], bytes | None], what: str) -> None:
        """Run an upgrade `step` (rewrite up to N unchecked items after a key, in one LMDB
        transaction; None once none is left and the state is marked) in transactions of
        _UPGRADE_BATCH items, then checkpoint. A crash part-way leaves items of both kinds, each
        read correctly; the next writable open goes on."""
        after: bytes | None = None
        while True:
            try:
                after = step(after, _UPGRADE_BATCH)
            except LmdbError as exc:
                if not self._grow_map(exc):
                    raise
                continue  # the same batch again, in a larger map
            if after is None:
                break
        self.checkpoint()
        _logger.info("the state in %s now keeps a checksum with %s", self.path, what)

    def _page_to_restore(self, saved: SavedCheckpoint) -> bytes | None:
        """The saved meta page if LMDB must be reopened at the checkpoint: it was not closed cleanly
        (its newest meta page is a later one) and the machine restarted since the checkpoint, so the
        pages that later meta page points at may not have reached the disk. After a process kill the
        page cache still holds them: the state is taken as it is, and the open checkpoints it.
        Damage to the meta pages is refused first (`check_meta_pages`)."""
        newest = check_meta_pages(self.path, saved)
        if newest is None or _is_saved_snapshot(newest, saved):
            return None  # closed cleanly (or nothing written since the checkpoint); or left to LMDB
        return saved.page if saved.boot_id != boot_id() else None

    def _may_write_lock(self) -> bool:
        """This process may write lock.mdb (or create it, when it is missing)."""
        lock = os.path.join(self.path, LOCK_FILE)
        return os.access(lock, os.W_OK) if os.path.exists(lock) else os.access(self.path, os.W_OK)

    def _open_unregistered(self, writer_lock: str, map_size: int, refused: LmdbError) -> _lmdbcall.Env:
        """A read-only open by a user who may read the state but not write lock.mdb, the table in
        which LMDB registers readers (an operator inspecting another user's store or backup).
        Unregistered (MDB_NOLOCK), a reader is safe only while no writer runs: a writer reuses
        the pages no registered reader holds. So the open holds the store's writer lock
        (`writer_lock`, flock()ed exclusively by every writer and by `agentwal compact`/`repair`)
        shared until close: no writer can open meanwhile (it gets LockedError), and if one has
        the store open now, this open is refused with a StorageError saying why."""
        lock_md = os.path.join(self.path, LOCK_FILE)
        try:
            fd = os.open(writer_lock, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise storage_error(exc, f"opening the state in {self.path} read-only without write access to "
                                f"{lock_md} (it needs the writer lock {writer_lock} to keep writers out)") from refused
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            except OSError:
                holder = "unknown"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise storage_error(exc, f"locking {writer_lock} shared for a read-only open") from refused
            raise StorageError(
                f"opening the state in {self.path} read-only: this user may not write {lock_md}, where LMDB "
                f"registers its readers, and a writer has the store open (pid {holder}); an unregistered reader "
                "could read pages the writer is reusing, so the open is refused. Read it as a user who may "
                "write state/lock.mdb (the store's owner or group), or once the writer has closed.",
                errno=errno.EACCES, filename=lock_md) from refused
        try:
            env = _lmdbcall.Env(self.path, True, map_size, None, True)
        except BaseException:
            os.close(fd)
            raise
        self._writer_lock_fd = fd
        _holding_states.add(self)
        _logger.info("opened the state in %s read-only without a reader slot (no write access to %s); "
                     "writers are kept out until it closes", self.path, lock_md)
        return env

    def _check_readable(self, saved: SavedCheckpoint | None) -> None:
        """A read-only open cannot restore: refuse a state that may have lost pages its newest meta
        page points at (not closed cleanly, and the machine restarted since its last checkpoint)."""
        if saved is None or saved.boot_id == boot_id() or _is_saved_snapshot(
                _newest_meta(_meta_pages(self.path, len(saved.page))), saved):
            return
        raise StateError(
            f"the state in {self.path} was not closed cleanly before the machine restarted, so its newest "
            f"pages may not have reached the disk; a read-only open cannot repair that. Open the store for "
            f"writing once (it reopens the state at its last checkpoint, applied LSN {saved.applied_lsn}, "
            "and replays the log), then read it.")

    def _discard_unfinished_creation(self) -> None:
        """No checkpoint.meta: a new state, or one whose creation a crash cut short before its first
        checkpoint -- which then holds no more than the transaction that creates its databases, and
        is started again. Anything more is refused: its checkpoint file is gone."""
        data = os.path.join(self.path, DATA_FILE)
        if not os.path.exists(data) or os.path.getsize(data) == 0:
            return
        newest = _newest_meta(_meta_pages(self.path, _LMDB_MIN_PAGE))
        if newest is not None and newest[0] > _CREATED_TXNID:
            raise CorruptionError(
                f"the state in {self.path} holds LMDB transactions up to {newest[0]} but has no {CHECKPOINT_FILE}, "
                "which every state of this store format keeps once it holds anything: it was deleted, or the "
                f"state comes from elsewhere. {_REBUILD_OR_RESTORE}",
                path=os.path.join(self.path, CHECKPOINT_FILE), reason="missing checkpoint file")
        _logger.warning("the state in %s was being created when the store last stopped; creating it again",
                        self.path)
        for name in (DATA_FILE, LOCK_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.path, name))
        fsync_dir(self.path)

    # ---- reads (any thread; the environment is opened with MDB_NOTLS) ----

    def applied_lsn(self) -> int:
        try:
            raw = self._env.get(META, APPLIED_KEY)
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "reading applied_lsn")
        return _applied(self.path, raw)

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        """(version, value) of key, its checksum verified by the binding; None if absent."""
        try:
            found: tuple[int, bytes] | None = self._env.get(DATA, key)
        except LmdbError as exc:
            raise_lmdb(exc, self.path, f"reading key {key!r}")
        return found

    def scan_chunk(self, prefix: bytes, after: bytes | None, limit: int) -> list[tuple[bytes, int, bytes]]:
        """Up to `limit` (key, version, value) with `prefix`, in key order, keys > `after`."""
        try:
            chunk: list[tuple[bytes, int, bytes]] = self._env.scan(DATA, prefix, after, limit)
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "scanning keys")
        if chunk and not chunk[0][0]:
            _empty_key(self.path)
        return chunk

    def idempotency(self, key: bytes) -> tuple[int, int] | None:
        try:
            raw = self._env.get(IDEM, key)
            if raw is None:
                return None
            lsn, time_ms = _IDEM.unpack(raw)
        except (LmdbError, struct.error) as exc:
            raise_lmdb(exc, self.path, "reading an idempotency key")
        return lsn, time_ms

    def meta_get(self, key: bytes) -> bytes | None:
        try:
            raw: bytes | None = self._env.get(META, key)
            return raw
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "reading its metadata")

    def meta_put(self, key: bytes, value: bytes) -> None:
        while True:
            try:
                self._env.put(META, key, value)
                return
            except LmdbError as exc:
                if not self._grow_map(exc):
                    raise_lmdb(exc, self.path, "writing its metadata")

    def _grow_map(self, exc: LmdbError) -> bool:
        """After MDB_MAP_FULL (the write transaction was aborted, nothing of it is in the state):
        double the map, up to MAX_MAP_SIZE, and say whether to run the transaction again. The
        map is resized only between transactions, with the GIL held and no call on the handle
        running without it (native/lmdbcall.c, "The map's size"): the caller holds the store's
        apply lock, the one writer. False for any other error, or a map that cannot grow."""
        if not exc.args or exc.args[0] != _lmdbcall.MDB_MAP_FULL:
            return False
        try:
            size = self._env.map_size
            if size >= MAX_MAP_SIZE:
                return False
            grown = self._env.set_map_size(min(MAX_MAP_SIZE, size * 2))
        except LmdbError as err:
            if err.args[0] == _lmdbcall.E_BUSY:  # a reader's GIL-free call: let it finish, then retry
                time.sleep(0.001)
                return True
            raise_lmdb(err, self.path, f"growing its map past {size} bytes")
        self.map_grows += 1
        _logger.info("the LMDB map of %s grew from %d to %d bytes", self.path, size, grown)
        return grown > size

    def verify(self) -> tuple[int, int]:
        """Check every entry: its checksum, that a lookup of its key finds it, and that the walk
        counts as many entries as LMDB records (native/lmdbcall.c `verify`). Returns (entries,
        value bytes); CorruptionError naming the key and data.mdb on the first damage."""
        try:
            counts: tuple[int, int] = self._env.verify()
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "verifying every entry")
        return counts

    @property
    def lmdb_env(self) -> _lmdbcall.Env:
        """The LMDB environment, for the store's reads in C (native/storecore.c, "Reads")."""
        return self._env

    def snapshot(self) -> StateSnapshot:
        """One read transaction over the whole state (a consistent view at its applied LSN)."""
        return StateSnapshot(self)

    # ---- the one writer ----

    def apply(self, batch: record.Collapsed, durable_lsn: Callable[[], int], *, background: bool = False) -> int:
        """Apply a collapsed batch of consecutive commits (`record.collapse`, `Core.take`) in ONE
        LMDB transaction, with `applied_lsn`. A batch wholly at or below applied_lsn is already
        in the state (a replay after a crash mid-apply, I4) and changes nothing.

        LMDB's fsync is paid once per batch, never per commit. Returns the new applied LSN.

        The whole transaction is one C call with the GIL released (native/lmdbcall.c `apply`),
        which reads `durable_lsn` right before the commit (a background apply: just before
        its thread starts): in C if it is the store's `DurableLsn`, else by taking the GIL back
        to call it. The call pins the batch's items
        (a tuple of each list) before it lets the GIL go.

        background: the transaction runs in a thread of its own at the lowest CPU priority,
        so that threads woken meanwhile (committers) run first (with a `DurableLsn` only;
        native/lmdbcall.c `apply` says why it cannot hold up the interpreter).
        """
        first, last, commits = batch[0], batch[1], batch[2]
        while True:
            try:
                status, lsn = self._env.apply(batch, durable_lsn, background)
                break
            except LmdbError as exc:
                if not self._grow_map(exc):
                    raise_lmdb(exc, self.path, "applying log records to it")
        # I3: the batch is the commits applied+1..last, every one of them (checked in C, in the txn).
        if status == _lmdbcall.APPLY_GAP:
            raise InvariantError(f"apply of {commits} commit(s) LSN {first}..{last} after applied LSN "
                                 f"{lsn}: a gap (I3)")
        # I1 log before state: never commit the effect of a record the log could still lose
        # (checked in C with the durable LSN read right before the commit; nothing was committed).
        if status == _lmdbcall.APPLY_NOT_DURABLE:
            raise InvariantError(f"I1 violated: would store applied_lsn {last} > durable_lsn {lsn}")
        return lsn

    def load_snapshot(self, buffer: bytes | memoryview, offset: int, count: int, max_bytes: int,
                      append: bool) -> tuple[int, int]:
        """Put up to `count` entries of an archive snapshot, checked beforehand, from
        buffer[offset] on into the state, in ONE LMDB transaction that ends once `max_bytes`
        of keys and values are in; returns (the offset after them, how many). applied_lsn is
        not touched: for a store being built, which nothing opens until its `apply` of the
        snapshot's LSN (restore). append: keys in increasing order after every key in the
        state (MDB_APPEND). native/lmdbcall.c `load_snapshot` has the contract."""
        while True:
            try:
                done: tuple[int, int] = self._env.load_snapshot(buffer, offset, count, max_bytes, append)
                return done
            except LmdbError as exc:
                if not self._grow_map(exc):
                    raise_lmdb(exc, self.path, "loading a snapshot into it")

    def load_idem(self, items: Sequence[tuple[bytes, int, int]]) -> None:
        """Put (idempotency key, LSN, time_ms) entries of an archive snapshot into the state, in ONE
        LMDB transaction; applied_lsn is not touched (as `load_snapshot`)."""
        while True:
            try:
                self._env.put_idem(items)
                return
            except LmdbError as exc:
                if not self._grow_map(exc):
                    raise_lmdb(exc, self.path, "loading a snapshot's idempotency keys into it")

    def durable_seen(self) -> int:
        """The log's durable LSN when the state was last applied to (0 if never recorded)."""
        raw = self.meta_get(DURABLE_SEEN_KEY)
        return _U64.unpack(raw)[0] if raw is not None and len(raw) == _U64.size else 0

    def expire_idempotency(self, older_than_ms: int) -> int:
        """Forget idempotency keys of commits older than `older_than_ms` (wall clock)."""
        while True:
            try:
                return self._env.expire_idempotency(max(older_than_ms, 0))
            except LmdbError as exc:
                if not self._grow_map(exc):
                    raise_lmdb(exc, self.path, "expiring idempotency keys")

    def checkpoint(self) -> SavedCheckpoint:
        """Make the state durable as it is now, and the snapshot the next writable open falls back to
        if this one does not close cleanly (module docstring). The caller keeps every other write
        out while it runs (the store's apply lock). Returns what was saved."""
        if self._pin is None:
            raise ClosedError(f"the LMDB state in {self.path} is closed (while taking a checkpoint)")
        try:
            # The slots of read-only openers that died holding a snapshot: each pins the pages of
            # its snapshot, so the file would grow by all that is written after it, for good.
            self._env.reader_check()
            pin = self._env.begin()
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "beginning a checkpoint")
        try:
            txnid = pin.txnid()
            applied = _applied(self.path, pin.get(META, APPLIED_KEY))
            _, psize, last_pgno = self._env.stat()
            try:
                self._env.sync(True)  # every page of the pinned snapshot (and any later one) durable
            except LmdbError as exc:
                self._distrust_since_checkpoint()
                raise _sync_failed(exc, self.path) from exc
            pages = _meta_pages(self.path, psize)
            if not pages:  # its file deleted under the open store (LMDB keeps writing to the inode)
                raise FileNotFoundError(errno.ENOENT, "the state's file is gone", os.path.join(self.path, DATA_FILE))
            page = pages[txnid & 1]  # LMDB writes transaction t's meta in slot t & 1
            if _meta_txnid(page) != txnid:
                raise InvariantError(f"checkpoint of {self.path}: meta slot {txnid & 1} holds transaction "
                                     f"{_meta_txnid(page)}, not {txnid} (a write ran during the checkpoint)")
            saved = SavedCheckpoint(page, txnid, applied, boot_id(), time.time_ns() // 1_000_000)
            _write_checkpoint(self.path, saved)
        except LmdbError as exc:
            pin.abort()
            raise_lmdb(exc, self.path, "syncing it")
        except OSError as exc:  # reading the meta page: no descriptor (EMFILE), the file gone...
            pin.abort()
            raise storage_error(exc, f"taking a checkpoint of the state in {self.path}") from exc
        except BaseException:
            pin.abort()
            raise
        old, self._pin = self._pin, pin  # only now may LMDB reuse the pages the old checkpoint kept
        old.abort()
        self._last_pgno_at_checkpoint = last_pgno
        return saved

    def _distrust_since_checkpoint(self) -> None:
        """After a failed fdatasync: the page cache no longer proves the pages LMDB wrote since the
        last checkpoint (the kernel may drop those it could not write), so the next writable open
        must reopen at that checkpoint even in this boot. Its boot id is rewritten as all zeros,
        which no boot has (FORMAT.md §16)."""
        try:
            saved = read_checkpoint(self.path)
            if saved is not None:
                _write_checkpoint(self.path, saved._replace(boot_id=UNTRUSTED_BOOT_ID))
        except (OSError, WalError) as exc:
            _logger.error("the state in %s: after a failed fdatasync, its checkpoint could not be marked for a "
                          "reopen at it (%s); if this machine does not restart, move state/ aside before the "
                          "next open so that it is rebuilt from the log", self.path, exc)

    def growth_since_checkpoint(self) -> int:
        """Bytes the file grew since the last checkpoint. While the checkpoint's snapshot is pinned,
        LMDB cannot reuse the pages later transactions free, so a state that overwrites its keys
        grows by what it writes until the next checkpoint. The store's policy counts those pages
        directly (`space`, ``state_pinned_free_bytes``): growth misses the ones taken from reusable
        free pages, and a policy on growth alone lets each interval write more than the last."""
        try:
            _, psize, last_pgno = self._env.stat()
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "reading its statistics")
        return max(0, last_pgno - self._last_pgno_at_checkpoint) * psize

    def space(self) -> dict[str, int]:
        """Where the state file's bytes go (native/lmdbcall.c `space`): ``state_file_bytes`` (pages
        in the file), ``state_used_bytes`` (pages of the newest snapshot), ``state_free_bytes``
        (every other page: LMDB reuses them before it grows the file, and a compaction,
        `compact_state`, gives them back to the filesystem) and, of those,
        ``state_pinned_free_bytes``: pages freed since the last checkpoint, which its pin keeps
        from reuse until the next one -- the space a checkpoint would give back to LMDB. The
        pin is the writer's (this State's, or on a read-only open the one checkpoint.meta
        names); another process's snapshot pins pages too, uncounted here."""
        if self._pin is not None:
            pin = self._pin.txnid()
        else:
            saved = read_checkpoint(self.path) if self.readonly else None
            pin = saved.txnid if saved is not None else 0
        try:
            psize, pages, used, free, pinned = self._env.space(pin)
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "reading its free pages")
        return {"state_file_bytes": pages * psize, "state_used_bytes": used * psize,
                "state_free_bytes": free * psize, "state_free_pages": free,
                "state_pinned_free_bytes": pinned * psize}

    def stat(self) -> dict[str, int]:
        try:
            entries, psize, last_pgno = self._env.stat()
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "reading its statistics")
        return {"state_keys": entries, "state_map_bytes_used": (last_pgno + 1) * psize,
                "state_map_bytes": self._env.map_size, "state_map_grows": self.map_grows,
                "background_applies": self._env.background_applies}

    def close(self) -> None:
        """Idempotent. Aborts any snapshot still open (it then raises ClosedError). Takes no
        checkpoint: a close that did not take one leaves the state to be reopened at the last."""
        if self._pin is not None:
            self._pin.abort()
            self._pin = None
        try:
            self._env.close()
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "closing it")
        finally:
            if self._writer_lock_fd is not None:  # after the environment: no page is read any more
                os.close(self._writer_lock_fd)
                self._writer_lock_fd = None
            self._release_reader_hold()

    def _release_reader_hold(self) -> None:
        if self._reader_hold_fd is not None:
            os.close(self._reader_hold_fd)
            self._reader_hold_fd = None


# The flock()ed fds of this process that a forked child must not keep: its copy shares the
# parent's lock, and a child outliving the parent's close would keep every compaction refused
# (a reader's hold) or every reader waiting (a compaction's). States holding one, and the
# compactions under way.
_holding_states: weakref.WeakSet[State] = weakref.WeakSet()
_compacting_fds: set[int] = set()


def _after_fork_in_child() -> None:
    for state in list(_holding_states):
        for attr in ("_reader_hold_fd", "_writer_lock_fd"):
            fd = getattr(state, attr)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(state, attr, None)
    for fd in list(_compacting_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _compacting_fds.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _hold_for_reading(path: str) -> int | None:
    """A read-only open's shared flock() on its state's data file, held until it closes: a
    compaction (`compact`), which swaps in a new file, is refused while any is held, since the
    holder would go on reading the old file and never see a later commit. Waits for a compaction
    under way, then holds the file that is in place (the one it waited on may have been swapped
    out meanwhile). None where the file cannot be opened: the LMDB open says why."""
    data = os.path.join(path, DATA_FILE)
    while True:
        try:
            fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:  # no flock() here (ENOLCK: some network filesystems): reads go unguarded
            os.close(fd)
            return None
        try:
            held, now = os.fstat(fd), os.stat(data)
        except OSError:  # swapped out and the old one deleted meanwhile: look again
            os.close(fd)
            continue
        if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
            return fd
        os.close(fd)


def _refuse_if_read_elsewhere(path: str) -> int:
    """An exclusive flock() on the state's data file for a compaction, held until its new file
    is in place (readers opening meanwhile wait, then read the new one); StateError while a
    read-only open holds it shared (`_hold_for_reading`)."""
    fd = os.open(os.path.join(path, DATA_FILE), os.O_RDONLY | os.O_CLOEXEC)
    deadline = time.monotonic() + _COMPACT_READERS_WAIT_S
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)  # a short-lived reader (agentwal stats from a scraper) ends soon
            except OSError:  # no flock() here (ENOLCK): readers hold nothing either
                return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    raise StateError(f"the state in {path} is open read-only (a wal.open(..., readonly=True) or an agentwal "
                     f"command, in this or another process, for over {_COMPACT_READERS_WAIT_S:.0f} s): "
                     "compacting it now would leave that reader on the old file, never seeing a later "
                     "commit. Close it, then compact again")


# How long a compaction waits for read-only opens to close before it is refused.
_COMPACT_READERS_WAIT_S = 2.0


COMPACT_SUFFIX = ".compact"  # state.compact/: a compaction's new state, or (after the swap) the old one
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> None:
    """Swap two directories in one step (renameat2 RENAME_EXCHANGE, Linux 3.15+, glibc 2.28+): a
    crash leaves either both as they were or both swapped, never neither in place."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None or fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno() if fn is not None else errno.ENOSYS
        raise StateError(f"compacting the state needs an atomic swap of {a} and {b} (renameat2 with "
                         f"RENAME_EXCHANGE), which this system refused: {os.strerror(err)}; the state is unchanged")


def compact(state: State) -> State:
    """Rebuild `state` into a new file and swap it in; returns the reopened State (`state` is closed).

    The new file (native/lmdbcall.c `compact_into`) holds the newest snapshot with no free page
    and its B-tree pages filled in key order: what LMDB's own file keeps of free pages and of
    half-filled pages (a page split leaves two halves) is given back to the filesystem. It is
    built in ``state.compact/`` beside the state, fdatasynced, given its own checkpoint.meta (so
    it is a checkpointed state of this boot, FORMAT.md §16), then swapped with ``state/`` in one
    atomic rename (`_exchange`) and the parent directory fsynced; the old state, now in
    ``state.compact/``, is deleted. A crash before the swap leaves the old state in place; after
    it, the new one; either way a leftover ``state.compact/`` is deleted by the next compaction.

    The caller keeps every write out (the store's apply lock) and every reader off `state` (it is
    closed). Read-only opens elsewhere would keep the old file, and see no later commit: a
    compaction is refused while one is open (`_refuse_if_read_elsewhere`), and one opening
    meanwhile waits for the new file."""
    if state.readonly or state._pin is None:
        raise StateError(f"the state in {state.path} is not open for writing; it cannot be compacted")
    path = os.path.abspath(state.path)
    tmp = path + COMPACT_SUFFIX
    hold = _refuse_if_read_elsewhere(path)
    _compacting_fds.add(hold)
    try:
        return _compact_held(state, path, tmp)
    finally:
        _compacting_fds.discard(hold)
        os.close(hold)


def _compact_held(state: State, path: str, tmp: str) -> State:
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp)
    try:
        applied = state.applied_lsn()
        try:
            state._env.compact_into(tmp)
            _, psize, _ = state._env.stat()
        except LmdbError as exc:
            raise_lmdb(exc, state.path, "compacting it")
        newest = _newest_meta(_meta_pages(tmp, psize))
        if newest is None:
            raise InvariantError(f"the compacted state in {tmp} has no meta page")
        _write_checkpoint(tmp, SavedCheckpoint(newest[1], newest[0], applied, boot_id(),
                                               time.time_ns() // 1_000_000))
        state.close()
        _exchange(tmp, path)
    except BaseException:  # the old state is in place (closed if it got that far: the caller reopens it)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(os.path.dirname(path))
    shutil.rmtree(tmp, ignore_errors=True)
    return State(path)


class StateSnapshot:
    """One LMDB read transaction of a state: every read sees the same commit. LMDB readers
    never block its writer, but a snapshot kept open pins the pages of its commit: close it."""

    def __init__(self, state: State) -> None:
        self.path = state.path
        try:
            self._txn = state._env.begin()
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "beginning a read transaction")

    def applied_lsn(self) -> int:
        try:
            raw = self._txn.get(META, APPLIED_KEY)
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "reading applied_lsn")
        return _applied(self.path, raw)

    def renew(self) -> None:
        """Move to the newest commit."""
        try:
            self._txn.renew()
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "renewing a read transaction")

    def entries(self) -> int:
        try:
            return self._txn.entries(DATA)
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "counting its keys")

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        try:
            found: tuple[int, bytes] | None = self._txn.get(DATA, key)
        except LmdbError as exc:
            raise_lmdb(exc, self.path, f"reading key {key!r}")
        return found

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, int, bytes]]:
        """(key, version, value) with `prefix`, in key order, each entry's checksum verified.

        Read in chunks of up to _SCAN_CHUNK keys and about _SCAN_CHUNK_BYTES of values: a walk
        of a whole state (an archive snapshot) holds one chunk at a time, whatever its values'
        sizes (1,024 values of 1 MiB would be a GiB)."""
        after: bytes | None = None
        limit = 4  # doubled while the chunks stay small
        while True:
            try:
                chunk: list[tuple[bytes, int, bytes]] = self._txn.scan(DATA, prefix, after, limit)
            except LmdbError as exc:
                raise_lmdb(exc, self.path, "scanning keys")
            if chunk and not chunk[0][0]:
                _empty_key(self.path)
            yield from chunk
            if len(chunk) < limit:
                return
            after = chunk[-1][0]
            held = sum(len(value) for _, _, value in chunk)
            limit = max(1, min(_SCAN_CHUNK, limit * 2 if held * 2 <= _SCAN_CHUNK_BYTES
                               else limit * _SCAN_CHUNK_BYTES // held))

    def idem_count(self) -> int:
        try:
            return self._txn.entries(IDEM)
        except LmdbError as exc:
            raise_lmdb(exc, self.path, "counting its idempotency keys")

    def idem_items(self) -> Iterator[tuple[bytes, int, int]]:
        """(idempotency key, LSN of its commit, that commit's time_ms) in key order, each entry's
        checksum verified; read _SCAN_CHUNK at a time."""
        after: bytes | None = None
        while True:
            try:
                chunk: list[tuple[bytes, bytes]] = self._txn.scan(IDEM, b"", after, _SCAN_CHUNK)
            except LmdbError as exc:
                raise_lmdb(exc, self.path, "reading its idempotency keys")
            for key, raw in chunk:  # 16 bytes each: the binding checked them
                lsn, time_ms = _IDEM.unpack(raw)
                yield key, lsn, time_ms
            if len(chunk) < _SCAN_CHUNK:
                return
            after = chunk[-1][0]

    def close(self) -> None:
        """Idempotent."""
        self._txn.abort()
