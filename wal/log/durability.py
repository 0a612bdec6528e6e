"""Durability levels and their RPO bound (README, "Durability levels"), parsed in one place for the log and the store.

| level      | acknowledged after                  | process kill loses | power cut loses    |
|------------|-------------------------------------|--------------------|--------------------|
| `sync`     | an fdatasync covering the commit    | nothing            | nothing            |
| `interval` | write() to the OS                   | nothing            | at most rpo_ms     |
| `buffered` | the copy into the in-process buffer | at most rpo_ms     | at most rpo_ms     |

`replicated` (only with an object archive, wal/archive/): acknowledged once an fdatasync AND the
archive hold the commit. To the log it is `sync` (its C level code is sync's); the store waits
for the archive on top (wal/archive/store.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from wal.errors import ArgumentError, ArgumentTypeError

Level = Literal["replicated", "sync", "interval", "buffered"]
LEVELS: tuple[Level, ...] = ("sync", "interval", "buffered")  # strongest first; index = C level code
# Every level a store accepts, strongest first; "replicated" needs an object archive.
ALL_LEVELS: tuple[Level, ...] = ("replicated", *LEVELS)
DEFAULT_RPO_MS = 1000


@dataclass(frozen=True)
class Durability:
    level: Level
    rpo_ms: int  # 0 for sync
    code: int = field(init=False, compare=False)  # the C level code: LEVELS.index(level)
    replicable: bool = field(default=False, compare=False)  # an object archive can take "replicated"

    def __post_init__(self) -> None:
        # Computed once: every commit asks for it (allows(None)), so it must not cost a search.
        object.__setattr__(self, "code", LEVELS.index(self.log_level))

    @property
    def log_level(self) -> Level:
        """The level the log itself runs at: "sync" for "replicated" (the archive is the store's part)."""
        return "sync" if self.level == "replicated" else self.level

    def allows(self, requested: str | None) -> int:
        """C level code for a per-commit request; only the same or a stronger level may be asked for."""
        if requested is None:
            return self.code
        if requested == "replicated":
            if not self.replicable:
                raise ArgumentError("durability='replicated' needs an object archive: open the store with "
                                    "archive='s3://bucket/prefix' or archive='file:///dir'")
            return 0
        if requested not in LEVELS:
            raise ArgumentError(f"unknown durability {requested!r}; expected one of {', '.join(LEVELS)}")
        code = LEVELS.index(requested)
        if code > self.code or (self.level == "replicated" and requested != "replicated"):
            raise ArgumentError(
                f"a commit may ask for a stronger durability than the store's ({self.level!r}), "
                f"not a weaker one ({requested!r})"
            )
        return code


MAX_RPO_MS = (1 << 32) - 1  # the log's bound is a u32 of milliseconds (native/wal.h)


def parse(durability: str | None, rpo_ms: int | None, *, replicable: bool = False) -> Durability:
    """`rpo_ms=0` means sync; `rpo_ms=N>0` with no level means interval; a level without rpo_ms gets 1000 ms.
    replicable: the store has an object archive, so "replicated" is a level it can keep."""
    if rpo_ms is not None:
        if isinstance(rpo_ms, bool) or not isinstance(rpo_ms, int):
            raise ArgumentTypeError(f"rpo_ms must be an int of milliseconds, not {type(rpo_ms).__name__}")
        if rpo_ms < 0:
            raise ArgumentError(f"rpo_ms must be >= 0, got {rpo_ms}")
        if rpo_ms > MAX_RPO_MS:
            raise ArgumentError(f"rpo_ms must be at most {MAX_RPO_MS} (about 49 days), got {rpo_ms}")
    if durability == "replicated":
        if not replicable:
            raise ArgumentError("durability='replicated' needs an object archive: pass "
                                "archive='s3://bucket/prefix' or archive='file:///dir'")
        if rpo_ms:
            raise ArgumentError(f"durability='replicated' loses nothing, so rpo_ms={rpo_ms} contradicts it")
        return Durability("replicated", 0, replicable=True)
    if durability is not None and durability not in LEVELS:
        raise ArgumentError(f"unknown durability {durability!r}; expected one of {', '.join(ALL_LEVELS)}")
    if durability is None:
        durability = "interval" if rpo_ms else "sync"
    if durability == "sync":
        if rpo_ms:
            raise ArgumentError(
                f"durability='sync' loses nothing, so rpo_ms={rpo_ms} contradicts it; "
                "pass durability='interval' or 'buffered' with rpo_ms, or rpo_ms=0"
            )
        return Durability("sync", 0, replicable=replicable)
    if rpo_ms == 0:
        raise ArgumentError(f"durability={durability!r} needs rpo_ms > 0 (rpo_ms=0 means 'sync')")
    level: Level = "interval" if durability == "interval" else "buffered"
    return Durability(level, DEFAULT_RPO_MS if rpo_ms is None else rpo_ms, replicable=replicable)
