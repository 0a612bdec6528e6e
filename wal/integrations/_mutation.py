"""Running a blocking mutation from a coroutine so that cancellation has a clear meaning.

``await asyncio.to_thread(fn)`` abandons the thread when the awaiting task is cancelled: the
thread goes on and may commit after the caller already has its CancelledError, so a caller
who retries commits twice. `run_mutation` instead keeps awaiting the thread (shielded) and
raises the CancelledError only once the thread has finished: when the caller sees the
error, the mutation has either taken effect or never will. (The Agents SDK's own sessions do
the same; the store's `aput`/`atransaction` do it for a commit already in the log.)

A cancellation that arrives before the worker thread has started its call still lets the
call run: a commit cannot be withdrawn once handed to the thread, and a thread cannot be
stopped half-way through a read-modify-commit, so the call is always completed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


async def run_mutation(fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)`` in a worker thread; cancellation waits for it (see the module)."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if task.cancelled():  # the loop itself cancelled the helper (shutting down)
        raise cancelled or asyncio.CancelledError()
    if task.exception() is None and cancelled is not None:
        raise cancelled  # the mutation is done: the caller learns of its cancellation after it
    return task.result()  # its result, or its own error (whose outcome is as without a cancellation)
