"""The only module that touches the cffi extension: it loads it and maps C codes to exceptions.

Nothing here decides policy; callers pass the context that makes a message useful.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from wal import errors

try:
    from wal import _appendcall, _lmdbcall, _readcall, _storecore
    from wal._native import ffi, lib
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "agentwal's C core (wal._native, wal._appendcall, wal._readcall, wal._storecore, wal._lmdbcall) is not "
        "built; install the package with `pip install .` (needs a C compiler) rather than running from a source tree"
    ) from exc

__all__ = ["append_nowait", "append_record", "check", "durable_lsn_reader", "ffi", "handle_address", "lib",
           "raise_code", "span_records", "storecore"]


def _address(name: str) -> int:
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))


# Log.append's and the store's commit paths in C call these functions of the cffi module
# (native/logcall.h).
_LOG_CALLS = (_address("wal_log_append"), _address("wal_log_wait"), _address("wal_log_wait_try"))
_appendcall.bind(*_LOG_CALLS)
_storecore.bind(*_LOG_CALLS)
_WATERMARKS = _address("wal_log_watermarks")
_storecore.bind_watermarks(_WATERMARKS)  # the store's reads take their watermark in C
_storecore.bind_lmdb(_lmdbcall.CAPI)  # ... and read LMDB through wal._lmdbcall's C API (native/lmdbapi.h)
storecore = _storecore

# append(handle_address, payload: bytes, level) -> LSN once the level holds, or a negative WAL_E*
# code: Log.append's one call. The GIL is kept for a buffered copy and an interval write made at
# once, released for anything that waits (native/logcall.h).
append_record = _appendcall.append
# append_nowait(handle_address, payload: bytes, level, wait) -> LSN or a negative WAL_E* code.
# wal_log_append without releasing the GIL; only WAL_WAIT_TRY and WAL_WAIT_NONE (others give
# WAL_EINVAL). For the non-blocking append paths: native/appendcall.c says why it is safe.
append_nowait = _appendcall.append_nowait
# span_records(buffer, lsns, offsets, lengths, count) -> [(lsn, payload: bytes)]: a RecordSpan's
# records as Python objects in one call, every range checked against the buffer (native/readcall.c).
span_records = _readcall.records


def handle_address(handle: Any) -> int:
    """The address of a wal_log* handle, as append_record and append_nowait take it."""
    return int(ffi.cast("uintptr_t", handle))


def durable_lsn_reader(log: Any, native_address: int) -> Callable[[], int]:
    """The durable LSN of `log` (a wal.Log taking appends; `native_address` its handle's
    address) as a callable that `State.apply` reads in C without taking the GIL back
    (native/lmdbcall.c, DurableLsn). It keeps `log`, so the handle outlives it."""
    reader: Callable[[], int] = _lmdbcall.DurableLsn(_WATERMARKS, native_address, log)
    return reader


_BY_CODE: dict[int, type[errors.WalError]] = {
    lib.WAL_EFAILED: errors.FailedError,
    lib.WAL_ECLOSED: errors.ClosedError,
    lib.WAL_EINVAL: errors.ArgumentError,
    lib.WAL_ETOOBIG: errors.RecordTooLargeError,
    lib.WAL_ENOSPC: errors.NoSpaceError,
}


def raise_code(code: int, context: str, detail: str = "") -> NoReturn:
    """Raise the exception for a negative WAL_E* code."""
    text = ffi.string(lib.wal_strerror(code)).decode()
    message = f"{context}: {text}"
    if detail:
        message += f" ({detail})"
    cls = _BY_CODE.get(code)
    if cls is not None:
        raise cls(message)
    if code in (lib.WAL_EIO, lib.WAL_EOS):
        raise OSError(message)
    raise errors.WalError(message)


def check(code: int, context: str, handle: Any = None) -> int:
    """Return code if it is not an error, else raise; `handle` (a wal_log*) adds its detail."""
    if code >= 0:
        return code
    detail = ""
    if handle is not None:
        detail = ffi.string(lib.wal_log_error_detail(handle)).decode(errors="replace")
    raise_code(code, context, detail)
