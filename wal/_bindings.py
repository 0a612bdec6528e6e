"""The only module that touches the cffi extension: it loads it and maps C codes to exceptions.

Nothing here decides policy; callers pass the context that makes a message useful.
"""

from __future__ import annotations

import errno
import importlib.machinery
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from wal import errors
from wal.crypto import sealing as _sealing

_CORE = ("_native", "_appendcall", "_readcall", "_storecore", "_lmdbcall")


def _core_missing(exc: ImportError) -> str:
    """Why the C core did not load, and what to do: the message of the ImportError `import wal`
    raises without it. Three cases, told apart by what is on disk beside this file:

    - not Linux: the C core uses futex(2), eventfd(2) and fdatasync(2), so it is never built
      elsewhere (setup.py refuses the build with the same words);
    - a source tree (native/build.py and pyproject.toml next to wal/) with the modules unbuilt:
      Python found the tree before site-packages, because the current directory (or PYTHONPATH)
      comes first on sys.path -- the trap numpy's "you should not try to import numpy from its
      source directory" names. An installed copy, if any, is named, and how to reach it;
    - otherwise an install whose modules are missing or fail to load (a cffi too old for the
      wheel, a file removed): the loader's own error, and a reinstall."""
    package = Path(__file__).resolve().parent
    if not sys.platform.startswith("linux"):
        return (f"agentwal runs on Linux only: its C core uses futex(2), eventfd(2) and fdatasync(2), and this "
                f"is {sys.platform}. Run it on Linux (x86_64 or aarch64 wheels; any Linux with a C compiler from "
                f"the sdist), e.g. in a container or VM.")
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    built = [name for name in _CORE if any((package / f"{name}{suffix}").exists() for suffix in suffixes)]
    root = package.parent
    if len(built) < len(_CORE) and (root / "native" / "build.py").is_file() and (root / "pyproject.toml").is_file():
        message = (f"`import wal` found agentwal's source tree ({package}), where the C core is not built: "
                   f"Python searches the current directory (or PYTHONPATH) before the installed packages. ")
        installed = _installed_elsewhere(package)
        if installed is not None:
            message += (f"agentwal is installed at {installed}: leave the source tree (cd to another directory) "
                        f"and start Python again to use it. ")
        else:
            message += ("Install it (`pip install agentwal`, or `pip install .` here, which needs a C compiler), "
                        "then leave the source tree (cd to another directory) and start Python again. ")
        return message + ("To work on agentwal itself, `pip install -e .` builds the C core in this tree "
                          f"(./run.sh test does it). The loader said: {exc}")
    missing = [f"wal.{name}" for name in _CORE if name not in built]
    return (f"agentwal's C core failed to load from {package}"
            + (f" (missing: {', '.join(missing)})" if missing else "") + f": {exc}. "
            "Reinstall it: pip install --force-reinstall agentwal")


def _installed_elsewhere(package: Path) -> Path | None:
    """Another copy of agentwal with its C core built, later on sys.path (site-packages, a
    PYTHONPATH entry), or None. An editable install reached through an import hook is not
    looked for: it may be this very tree, for which `pip install -e .` is the advice anyway."""
    for entry in sys.path:
        candidate = Path(entry or ".").resolve() / "wal"
        if candidate != package and (candidate / "_bindings.py").is_file() and any(candidate.glob("_native*")):
            return candidate
    return None


try:
    # The built extension modules: the only place above native/ that imports them by name
    # (import-linter sees this line as an import of `wal`; pyproject.toml ignores it).
    from wal import _appendcall, _lmdbcall, _readcall, _storecore
    from wal._native import ffi, lib
except ImportError as exc:
    raise ImportError(_core_missing(exc)) from exc

__all__ = ["WATERMARKS_ARCHIVED", "append_nowait", "append_record", "check", "durable_lsn_reader", "ffi",
           "handle_address", "lib", "lmdbcall", "object_records", "raise_code", "span_records", "storecore"]


def _address(name: str) -> int:
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))


# Log.append's and the store's commit paths in C call these functions of the cffi module
# (native/logcall.h).
_LOG_CALLS = (_address("wal_log_append"), _address("wal_log_wait"), _address("wal_log_wait_try"))
_appendcall.bind(*_LOG_CALLS)
# ... and a sealed store's put these two as well: its record appended before its value is
# encrypted, and finished once the GIL is let go (native/commit.c, "Records finished later").
_storecore.bind(*_LOG_CALLS, _address("wal_log_append_unfinished"), _address("wal_log_finish"))
_WATERMARKS = _address("wal_log_watermarks")
_storecore.bind_watermarks(_WATERMARKS)  # the store's reads take their watermark in C
# ... at `replicated`, this one: no higher than the archive's (Core.acknowledge_archived)
WATERMARKS_ARCHIVED = _address("wal_log_watermarks_archived")
_storecore.bind_lmdb(_lmdbcall.CAPI)  # ... and read LMDB through wal._lmdbcall's C API (native/lmdbapi.h)
storecore = _storecore
# Sealing sessions in C for wal/crypto/sealing.py, which sits below this floor (native/sealcore.c).
_sealing.bind_native(_storecore.SealSession, _storecore.load_aead)
lmdbcall = _lmdbcall  # the LMDB state's C calls (native/lmdbcall.c), for wal/store/state.py

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
# object_records([(lsn, payload: bytes)]) -> bytes: the record section of an archive log object
# (lsn, length, CRC-32C, payload per record; FORMAT.md) in one call (native/readcall.c).
object_records = _readcall.object_records


def handle_address(handle: Any) -> int:
    """The address of a wal_log* handle, as append_record and append_nowait take it."""
    return int(ffi.cast("uintptr_t", handle))


def durable_lsn_reader(log: Any, native_address: int, *, archived: bool = False) -> Callable[[], int]:
    """The durable LSN of `log` (a wal.Log taking appends; `native_address` its handle's
    address) as a callable that `State.apply` reads in C without taking the GIL back
    (native/lmdbcall.c, DurableLsn). It keeps `log`, so the handle outlives it. `archived`: no
    higher than the archive's watermark (what `replicated` acknowledges)."""
    reader: Callable[[], int] = _lmdbcall.DurableLsn(WATERMARKS_ARCHIVED if archived else _WATERMARKS,
                                                     native_address, log)
    return reader


_BY_CODE: dict[int, type[errors.WalError]] = {
    lib.WAL_EFAILED: errors.FailedError,
    lib.WAL_ECLOSED: errors.ClosedError,
    lib.WAL_EINVAL: errors.ArgumentError,
    lib.WAL_ETOOBIG: errors.RecordTooLargeError,
    lib.WAL_ENOSPC: errors.NoSpaceError,
    lib.WAL_EFORKED: errors.LockedError,  # as a child forked through os.fork is told (Store._usable)
}


def _why_failed(detail: str) -> str:
    """Why a failed log is not retried, for the step that failed (`detail`, the log's own: "<step>
    of <segment> failed: <reason>", native/commit.c `fail`)."""
    if detail.startswith("sealing "):
        # A record appended with its ciphertext to come (native/commit.c, "Records finished
        # later") that could not be encrypted: it holds an LSN, and the log writes no batch past
        # a record it cannot write whole.
        return ("a record already given its LSN could not be sealed, so nothing after it can be written "
                "(it and the commits after it were never written, nor acknowledged) -- reopen the store, "
                "which replays the log from what is on disk")
    if detail.startswith("finishing "):
        # wal_log_finish named no record held open: its caller may have left one of its own
        # open, which would hold every later write back for good.
        return ("a record was finished that the log did not hold open, so one the caller holds may never be "
                "finished and nothing after it could be written -- reopen the store, which replays the log "
                "from what is on disk")
    return ("a failed fsync or write is never retried, since the kernel may have dropped the pages it could "
            "not write and a later success would prove nothing -- reopen it, which replays the log from what "
            "is on disk")


def raise_code(code: int, context: str, detail: str = "", write_errno: int = 0) -> NoReturn:
    """Raise the exception for a negative WAL_E* code. `write_errno`, for WAL_ENOSPC: what the
    refused write lacked (wal_log_write_failed_errno): EMFILE/ENFILE make it a StorageError
    with that errno, since no descriptor was free to roll to the next segment."""
    if code == lib.WAL_ENOSPC and write_errno in (errno.EMFILE, errno.ENFILE):
        raise errors.no_descriptor_error(context, detail, write_errno)
    text = ffi.string(lib.wal_strerror(code)).decode()
    message = f"{context}: {text}"
    if detail:
        message += f" ({detail})"
    cls = _BY_CODE.get(code)
    if cls is errors.FailedError:
        message += "; the store fail-stops (invariant I5): " + _why_failed(detail)
    if cls is not None:
        raise cls(message)
    if code in (lib.WAL_EIO, lib.WAL_EOS):
        raise errors.StorageError(message)
    raise errors.WalError(message)


def check(code: int, context: str, handle: Any = None) -> int:
    """Return code if it is not an error, else raise; `handle` (a wal_log*) adds its detail."""
    if code >= 0:
        return code
    detail = ""
    write_errno = 0
    if handle is not None:
        detail = ffi.string(lib.wal_log_error_detail(handle)).decode(errors="replace")
        if code == lib.WAL_ENOSPC:
            write_errno = int(lib.wal_log_write_failed_errno(handle))
    raise_code(code, context, detail, write_errno)
