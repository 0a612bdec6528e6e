"""Test-only fault injection: arm the C core's failpoints from Python.

Not for production use. Failpoints are process-wide and cost one predictable
branch per I/O call while none is armed. Sites: ``write`` (pwrite of records and
headers), ``fsync`` (fdatasync/fsync of segment files), ``dirsync``, ``open``,
``rename``, ``ftruncate``.

    with failpoint("fsync", errno.EIO):          # the next fdatasync fails
        ...
    with failpoint("write", errno.ENOSPC, nth=3, repeat=True, partial=True):
        ...
    slow("fsync", 0.3)                             # every fdatasync takes 300 ms more, until clear()
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Iterator
from contextlib import contextmanager

from wal._bindings import lib
from wal.errors import ArgumentError

SITES = ("write", "fsync", "dirsync", "open", "rename", "ftruncate")


def arm(site: str, err: int = _errno.EIO, *, nth: int = 1, repeat: bool = False,
        probability: float = 0.0, seed: int = 0, partial: bool = False) -> None:
    """Make the `nth` call of `site` from now fail with `err` (every later one too when `repeat`),
    or, with `probability` > 0, each call with that probability (seeded, reproducible).
    `partial`: a failing write first writes half its bytes, as a dying device may."""
    if site not in SITES:
        raise ArgumentError(f"unknown failpoint {site!r}; sites are {', '.join(SITES)}")
    ppm = int(probability * 1_000_000)
    if probability:
        nth = 0
    if lib.wal_fp_set(site.encode(), err, nth, int(repeat), ppm, seed, int(partial)) != 0:
        raise ArgumentError(f"bad failpoint arguments for {site!r}: err={err}, nth={nth}, probability={probability}")


def slow(site: str, seconds: float) -> None:
    """Make every call of `site` sleep `seconds` first (0 to stop); `clear()` also stops it."""
    if site not in SITES:
        raise ArgumentError(f"unknown failpoint {site!r}; sites are {', '.join(SITES)}")
    if not 0 <= seconds <= 60:
        raise ArgumentError(f"a failpoint delay must be 0..60 s, got {seconds!r}")
    lib.wal_fp_set_delay(site.encode(), int(seconds * 1_000_000))


def clear() -> None:
    """Disarm every failpoint."""
    lib.wal_fp_clear()


def calls(site: str) -> int:
    """Calls of `site` since it was armed."""
    return int(lib.wal_fp_count(site.encode(), 0))


def failures(site: str) -> int:
    """Failures injected at `site` since it was armed."""
    return int(lib.wal_fp_count(site.encode(), 1))


@contextmanager
def failpoint(site: str, err: int = _errno.EIO, **kwargs: object) -> Iterator[None]:
    """Arm a failpoint for the duration of a with-block."""
    arm(site, err, **kwargs)  # type: ignore[arg-type]
    try:
        yield
    finally:
        clear()
