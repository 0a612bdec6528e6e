"""Helpers shared by the log's tests."""

from __future__ import annotations

import errno
import threading

import wal
import wal.drill.failpoints


def sync_during_a_refused_write(log: wal.Log, *, repeat: bool) -> tuple[threading.Thread, list[BaseException]]:
    """Start log.sync() in a thread whose write is refused for lack of space after 300 ms (every
    write from then on too when `repeat`): the thread, and the NoSpaceError it got, once joined."""
    wal.drill.failpoints.arm("write", errno.ENOSPC, nth=1, repeat=repeat)
    wal.drill.failpoints.slow("write", 0.3)
    refused: list[BaseException] = []

    def sync() -> None:
        try:
            log.sync()
        except wal.NoSpaceError as exc:
            refused.append(exc)

    syncing = threading.Thread(target=sync)
    syncing.start()
    return syncing, refused
