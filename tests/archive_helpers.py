"""What the archive tests share: a condition to wait for, threads committing in the
background, and an object store whose PUT of one log object can be held."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from wal.archive import layout
from wal.archive.objects import FileObjects


def wait_until(cond: Callable[[], object], timeout: float = 30.0) -> None:
    """Return once `cond()` is true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@contextlib.contextmanager
def committing(store: Any, threads: int, value: bytes, keys: int = 100) -> Iterator[None]:
    """`threads` threads putting `value` under keys of their own (`keys` each, overwritten in
    turn) until the block ends; they are joined before it returns."""
    stop = threading.Event()

    def commit(n: int) -> None:
        i = 0
        while not stop.is_set():
            store.put(f"t{n}/{i % keys}", value)
            i += 1

    running = [threading.Thread(target=commit, args=(n,)) for n in range(threads)]
    for t in running:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in running:
            t.join()


class HeldPut(FileObjects):
    """file:// objects; the PUT of the first log object at or past `hold_from` waits for
    `release` (at most 60 s, so a test that never releases it still ends). `put_names` lists
    the names stored, in order; `log_puts` counts the log objects' PUTs begun."""

    def __init__(self, root: str, hold_from: int) -> None:
        super().__init__(root)
        self.hold_from = hold_from
        self.release = threading.Event()
        self.held: str | None = None
        self.put_names: list[str] = []
        self.log_puts = 0
        self.abandoned = False

    def abandon(self) -> None:
        """Release the held PUT as one that fails (its connection dropped): nothing is stored,
        and a store reopened on the directory ships those LSNs itself."""
        self.abandoned = True
        self.release.set()

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        parsed = layout.parse_name(name)
        if parsed is not None and parsed.kind == "log":
            self.log_puts += 1
            if self.held is None and parsed.first >= self.hold_from:
                self.held = name
        if name == self.held:
            self.release.wait(60)
            if self.abandoned:
                raise ConnectionResetError(f"the PUT of {name} was abandoned")
        super().put(name, data, create_only=create_only)
        self.put_names.append(name)
