"""`wal.open`: a store on this machine, or one whose log is also shipped to an object archive.

It sits above both the store (wal/store/) and the archive (wal/archive/, whose ArchivedStore
is a Store that ships): the store never imports the archive. The object archive's modules are
imported only when an archive URL is given, so a plain open never loads an object-store client.
"""

from __future__ import annotations

import os
from typing import Any, Never

from wal.archive import is_archive_url
from wal.errors import ArgumentError, ArgumentTypeError, WalError, path_argument, storage_error
from wal.store.sealed import check_compression_options
from wal.store.store import Store, open_local


def open_store(path: str | os.PathLike[str], *, durability: str | None = None, rpo_ms: int | None = None,
               readonly: bool = False, recovery: str = "strict", segment_bytes: int = 64 << 20,
               checkpoint_bytes: int = 256 << 20, archive: Any = False,
               idempotency_ttl_s: float = 86_400, apply_interval_ms: int = 20, max_unapplied: int = 200_000,
               preallocate: str = "size", encryption: Any = None, compression: str | None = None,
               compression_threshold: int | None = None, compression_dict: Any = None,
               archive_rpo_ms: int | None = None, archive_policy: str | None = None,
               archive_snapshot_bytes: int | None = None, archive_merge_objects: int | None = None,
               archive_retention_s: float | None = None, archive_puts_in_flight: int | None = None,
               archive_fencing: bool | None = None, **unknown: Never) -> Store:
    """Open (creating if needed) the store at `path`; this is `wal.open`.

    The open recovers: it takes the writer's lock, scans the log (cutting a torn tail), and
    replays into the state the commits it has not applied, so the store it returns holds every
    acknowledged commit its durability level promised to keep.

    durability: ``"sync"`` (the default), ``"interval"``, ``"buffered"`` or ``"replicated"``;
    rpo_ms: the loss bound of ``interval`` and ``buffered`` (0 means ``sync``; rpo_ms alone means
    ``interval``). readonly: no lock and no writes, beside a running writer in another process.
    recovery: ``"strict"`` raises `CorruptionError` on damage that is not a torn tail;
    ``"truncate"`` opens at the last good record. segment_bytes: the log's segment size.
    checkpoint_bytes: the most log (or freed state pages) between automatic checkpoints.
    idempotency_ttl_s: how long an idempotency key is remembered. apply_interval_ms and
    max_unapplied: how often the state is brought up to date, and how many acknowledged commits
    may wait for it before committers apply them themselves. preallocate: ``"size"`` or
    ``"zeros"`` for new log segments (see `wal.Log.open`).

    archive: True or a directory path keeps the log segments a checkpoint removes in a local
    folder; an object-store URL (``s3://bucket/prefix``, ``file:///dir``) ships the log and state
    snapshots off the machine and enables durability="replicated". The archive_* options are an
    object archive's (None: the default; `wal.archive.store.open_archived` documents each):
    archive_rpo_ms (1000), archive_policy ("block" or "error"), archive_snapshot_bytes (64 MiB),
    archive_merge_objects (32), archive_retention_s (keep all), archive_puts_in_flight (1) and
    archive_fencing (True).

    Every failure is a WalError: what the operating system refuses (a full disk, a read-only
    filesystem, a directory without permission, no file descriptors left, a missing file)
    is a StorageError (NoSpaceError, NotFoundError) saying what to do; nothing is half-open.

    encryption (a 32-byte key, keys with the current one first, or a key provider), compression
    ("zstd"; "none" stops a store that compresses from compressing new values: without it, a store
    compresses as its STORE file records), compression_threshold and compression_dict: a sealed
    store (wal/store/sealed.py)."""
    options: dict[str, Any] = {
        "durability": durability, "rpo_ms": rpo_ms, "recovery": recovery, "segment_bytes": segment_bytes,
        "checkpoint_bytes": checkpoint_bytes, "idempotency_ttl_s": idempotency_ttl_s,
        "apply_interval_ms": apply_interval_ms, "max_unapplied": max_unapplied, "preallocate": preallocate,
        "encryption": encryption, "compression": compression, "compression_threshold": compression_threshold,
        "compression_dict": compression_dict,
    }
    if unknown:  # **unknown: Never makes a type checker refuse any other name; at run time, say so
        raise ArgumentError(f"unknown option(s) of wal.open: {', '.join(sorted(unknown))}")
    # The archive_* options given (None: its default, wal.archive.store.archive_settings).
    archive_options = {name: value for name, value in (
        ("archive_rpo_ms", archive_rpo_ms), ("archive_policy", archive_policy),
        ("archive_snapshot_bytes", archive_snapshot_bytes), ("archive_merge_objects", archive_merge_objects),
        ("archive_retention_s", archive_retention_s), ("archive_puts_in_flight", archive_puts_in_flight),
        ("archive_fencing", archive_fencing)) if value is not None}
    if not isinstance(readonly, bool):  # "yes", or a mode string, was taken as true
        raise ArgumentTypeError(f"readonly must be True or False, not {type(readonly).__name__}")
    path_argument(path, "the store's path")  # a str or os.PathLike without a NUL byte
    if not os.fspath(path):  # "" (an unset variable, say) would make the current directory a store
        raise ArgumentError("the store's path is empty: name its directory")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ArgumentError(f"{os.fspath(path)!r} is a file, not a directory: a store is a directory (wal.open "
                            "makes it where none exists)")
    check_compression_options(os.fspath(path), compression, compression_threshold, compression_dict)
    if not (isinstance(archive, bool | str | os.PathLike) or is_archive_url(archive)):
        raise ArgumentTypeError("archive must be True or False, a directory path, an archive URL (s3://bucket/prefix, "
                                f"file:///dir), an obstore store or an ObjectStore; not {type(archive).__name__}")
    try:
        if is_archive_url(archive) and not readonly:
            from wal.archive.store import open_archived  # noqa: PLC0415

            return open_archived(path, archive, archive_options, **options)
        if is_archive_url(archive):  # read-only: nothing to ship; the writer's archive options are
            from wal.archive.store import archive_settings  # noqa: PLC0415 -- checked, then unused

            archive_settings(archive_options)
            archive = False
        elif archive_options:
            raise ArgumentError(f"{', '.join(sorted(archive_options))}: options of an object archive "
                                "(archive='s3://...' or 'file:///...'), or unknown")
        return open_local(path, readonly=readonly, archive=archive, **options)
    except WalError:
        raise
    except OSError as exc:
        where = os.fspath(path) if isinstance(path, str | os.PathLike) else repr(path)
        raise storage_error(exc, f"opening the store in {where}" + (" read-only" if readonly else "")) from exc
