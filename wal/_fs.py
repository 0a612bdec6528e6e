"""Making directory entries durable: the part of crash safety that file fsyncs do not cover.

A new file or directory exists after a power cut only once the directory holding its
name has been fsynced (found by the power-cut simulator, wal/drill/crashsim.py: a new store
could vanish whole, and LMDB's files were never durably linked).
"""

from __future__ import annotations

import contextlib
import hashlib
import os


def fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: str, data: bytes) -> None:
    """Put `data` at `path`, whole or not at all across a crash: written to a temporary file
    beside it, fsynced, renamed over `path`, the directory fsynced. The temporary file never
    outlives a failure."""
    tmp = f"{path}.tmp-{os.urandom(4).hex()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(os.path.dirname(path))


def makedirs_durable(path: str) -> None:
    """`os.makedirs(path, exist_ok=True)`, then fsync the parent of every directory it created."""
    path = os.path.abspath(path)
    missing = []
    probe = path
    while not os.path.isdir(probe):
        missing.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    os.makedirs(path, exist_ok=True)
    for created in reversed(missing):  # outermost first: its parent already exists durably
        fsync_dir(os.path.dirname(created))


# A simulated power cut (wal.drill.crashsim.apply_power_cut) restarts no machine: it sets this to a
# new value instead, in its own process and so in the children it starts afterwards.
BOOT_ID_ENV = "AGENTWAL_BOOT_ID"


def boot_id() -> bytes:
    """16 bytes that change whenever the machine restarts (Linux's boot id, or $AGENTWAL_BOOT_ID);
    16 zero bytes where the kernel does not say. Equal boot ids mean the page cache survived: every
    byte written to a file since is what reads see, synced or not."""
    simulated = os.environ.get(BOOT_ID_ENV)
    if simulated:
        return hashlib.blake2b(simulated.encode(), digest_size=16).digest()
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return bytes.fromhex(f.read().strip().replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return bytes(16)
