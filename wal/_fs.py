"""Making directory entries durable: the part of crash safety that file fsyncs do not cover.

A new file or directory exists after a power cut only once the directory holding its
name has been fsynced (found by the power-cut simulator, wal/crashsim.py: a new store
could vanish whole, and LMDB's files were never durably linked).
"""

from __future__ import annotations

import os


def fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
