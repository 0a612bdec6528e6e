"""Where an operator command points: a store or a bare log directory, who holds its writer
lock, and opening it as the writer.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import wal
from wal.errors import LockedError, WalError, storage_error
from wal.log import recovery
from wal.log.log import LOCK_NAME
from wal.store.store import ARCHIVE_DIR, LOG_DIR, STATE_DIR, STORE_FILE, Store, check_store_file

# Optional callback for long work: progress(phase, done, total).
Progress = Callable[[str, int, int], None]


class UsageError(WalError):
    """The command cannot run on this target (not a store, missing file, refused without --yes)."""


class OpsError(WalError):
    """An operator command ran and could not do what was asked; the message says why."""


# ---- targets -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a path names: a store (``kind == "store"``) or a bare log directory."""

    path: str
    kind: Literal["store", "log"]
    log_dir: str

    @property
    def is_store(self) -> bool:
        return self.kind == "store"

    @property
    def state_dir(self) -> str:
        return os.path.join(self.path, STATE_DIR)


def locate(path: str, *, need_store: bool = False) -> Target:
    """Classify `path`: a store by its STORE file, else a bare log by its segments or LOCK file."""
    if not os.path.isdir(path):
        what = "a file, not a directory" if os.path.exists(path) else "no such directory"
        raise UsageError(f"{path}: {what} (give the path of an agentwal store or log)")
    if os.path.exists(os.path.join(path, STORE_FILE)):
        return Target(path, "store", os.path.join(path, LOG_DIR))
    names = os.listdir(path)
    if any(recovery.parse_segment_name(n) is not None for n in names) or LOCK_NAME in names:
        if need_store:
            raise UsageError(f"{path} is a bare log (segment files, no {STORE_FILE} file), not a store; "
                             "this command works on stores (directories made by wal.open)")
        return Target(path, "log", path)
    hint = " (it has a log/ subdirectory but no STORE file)" if os.path.isdir(os.path.join(path, LOG_DIR)) else ""
    raise UsageError(f"{path} is not an agentwal store or log: no {STORE_FILE} file and no segment files{hint}")


def lock_holder(log_dir: str) -> int | None:
    """Pid of the process holding the writer lock of `log_dir`, from /proc/locks; None if free or unknown.

    Read-only: it never takes the lock itself (a probe, however short, could make a writer
    starting at that moment fail with LockedError).
    """
    try:
        st = os.stat(os.path.join(log_dir, LOCK_NAME))
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if "->" in parts:  # a blocked waiter, not the holder
            continue
        # A writer holds it exclusive (WRITE); a reader without a slot in lock.mdb holds it
        # shared (READ: wal/store/state.py, _open_unregistered), and is no writer.
        if len(parts) < 6 or parts[1] != "FLOCK" or parts[3] != "WRITE":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            if int(inode) == st.st_ino and (int(major, 16), int(minor, 16)) == (os.major(st.st_dev),
                                                                                 os.minor(st.st_dev)):
                return int(parts[4])
        except ValueError:
            continue
    return None


def recorded_lock_pid(log_dir: str) -> str:
    """The pid the last writer wrote into the LOCK file (stale once it exited), or '?'."""
    try:
        with open(os.path.join(log_dir, LOCK_NAME), encoding="ascii", errors="replace") as f:
            return f.read(64).strip() or "?"
    except OSError:
        return "?"


def locked_message(target: Target, command: str) -> str:
    """What to tell a user whose write command found another writer holding the store."""
    pid = lock_holder(target.log_dir)
    who = f"process {pid}" if pid is not None else f"process {recorded_lock_pid(target.log_dir)} (per its LOCK file)"
    return (f"{target.path} is open by its writer, {who}; `agentwal {command}` must open it as the one "
            "writer and cannot while that process holds the lock. Make the change through that process, or "
            "stop it (its acknowledged commits are safe) and run the command again. Read-only commands "
            "(info, get, scan, dump, verify, tail, stats, export) work while it runs.")


# The sealing options (encryption=, ...) of the writable opens of this process's commands: the
# command line's --key-file (`use_sealing`). Reading commands need none (`open_reader`).
_sealing: dict[str, Any] = {}


def use_sealing(**options: Any) -> None:
    """Open stores as their writer with these `wal.open` sealing options from now on (encryption=...)."""
    _sealing.clear()
    _sealing.update({k: v for k, v in options.items() if v is not None})


def sealing_options() -> dict[str, Any]:
    return dict(_sealing)


def open_reader(target: Target) -> wal.Store:
    """The store read-only, values as they are stored: a sealed store's envelopes, so that checking,
    inspecting and exporting an encrypted store needs no key (and shows no plaintext)."""
    try:
        return Store._open(target.path, readonly=True)
    except WalError:
        raise
    except OSError as exc:
        raise storage_error(exc, f"opening the store in {target.path} read-only") from exc


def open_writer(target: Target, command: str, *, object_archive: str | None = None,
                compression: str | None = None) -> wal.Store:
    """Open the store as its writer, translating LockedError into a message that says who and what to do.

    A store whose application archives released segments (``archive=True``: an ``archive/``
    directory exists) is opened the same way, so a checkpoint from here archives them too.
    `object_archive`: the URL of the object archive it ships to, to open it with (else a store
    that ships is opened without it and keeps the log its archive has not received).
    `compression`: the compression to open it with where the command line gave none.
    """
    archive: bool | str = object_archive or os.path.isdir(os.path.join(target.path, ARCHIVE_DIR))
    try:
        options = {"compression": compression, **_sealing} if compression is not None else _sealing
        return wal.open(target.path, archive=archive, **options)
    except LockedError as exc:
        raise LockedError(locked_message(target, command)) from exc


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _tree_bytes(path: str) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of every file under path."""
    apparent = allocated = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def _extra_files(log_dir: str) -> tuple[list[str], list[str]]:
    """(.broken files, leftover .tmp segments) in a log directory."""
    names = sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []
    return ([n for n in names if n.endswith(".broken")],
            [n for n in names if n.endswith(recovery.SEGMENT_SUFFIX + ".tmp")])


def _store_meta(target: Target) -> dict[str, Any]:
    check_store_file(target.path, create=False)  # damaged or of a newer agentwal: its own clear error
    with open(os.path.join(target.path, STORE_FILE), encoding="utf-8") as f:
        meta: dict[str, Any] = json.load(f)
    return meta


# ---- writes ----------------------------------------------------------------------------------------------


def _writer_target(path: str, create: bool) -> Target:
    """The store to write to; with `create`, a missing or empty directory becomes a new store."""
    if create and (not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path))):
        return Target(path, "store", os.path.join(path, LOG_DIR))
    return locate(path, need_store=True)


def _probe_lock(target: Target, command: str) -> None:
    """Fail with LockedError if a writer holds the log (a real flock probe: we are about to write anyway)."""
    lock = os.path.join(target.log_dir, LOCK_NAME)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LockedError(locked_message(target, command)) from None
    finally:
        os.close(fd)
