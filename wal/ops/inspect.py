"""Read-only inspection of a store or a log: `info`, `stats`, `get`, `scan`, `dump`, and the storage warnings.

Everything here works while a writer process has the store open: the log is read from the
segment files (wal/ops/segments.py), the state through a read-only LMDB handle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from wal._mounts import MEMORY_FS, NETWORK_FS, OVERLAY_FS, mount_of, mounts
from wal.crypto.sealing import CONTEXT_VALUE
from wal.errors import ArgumentError, MissingKeyError
from wal.log import recovery
from wal.ops.render import _human, _iso, record_json
from wal.ops.segments import (
    Skip,
    _close_segments,
    _commit_time,
    _first_lsn_of,
    _open_segments,
    _scan_segments,
    iter_log,
    last_lsn,
)
from wal.ops.stateview import StateView
from wal.ops.target import (
    Target,
    UsageError,
    _extra_files,
    _store_meta,
    _tree_bytes,
    locate,
    lock_holder,
    open_reader,
    sealing_options,
)
from wal.ops.verify import VerifyReport, _log_problems
from wal.store.sealed import STORE_FIELD, plan, read_meta
from wal.store.store import following_archive, read_archive_status


def storage_warnings(path: str) -> list[str]:
    """What about the filesystem under `path` could make durability promises false, or commits fail."""
    warnings: list[str] = []
    try:
        mount = mount_of(path, mounts())
    except OSError:
        mount = None
    if mount is not None:
        point, fstype, options = mount.point, mount.fstype, mount.all_options
        if fstype in MEMORY_FS:
            warnings.append(f"{fstype} at {point}: memory-backed; every commit is lost at reboot or power "
                            "loss whatever the durability level")
        elif fstype in NETWORK_FS or fstype.startswith("fuse"):
            warnings.append(f"{fstype} at {point}: a network or FUSE filesystem; flock (the writer lock) and "
                            "fdatasync may not mean what they mean on a local disk. Use a local filesystem")
        elif fstype in OVERLAY_FS:
            warnings.append(f"overlay at {point}: a container's writable layer, discarded with the container; "
                            "put the store on a mounted volume")
        if "nobarrier" in options or "barrier=0" in options:
            warnings.append(f"{point} is mounted with write barriers off (nobarrier): fdatasync may return "
                            "before data reaches stable storage, so a power cut can lose acknowledged commits")
        if "data=writeback" in options:
            warnings.append(f"{point} is ext4 data=writeback: file data and metadata are not ordered; "
                            "agentwal's fdatasyncs still hold, other tools' files may not")
    try:
        vfs = os.statvfs(path)
        free = vfs.f_bavail * vfs.f_frsize
        total = vfs.f_blocks * vfs.f_frsize
        if total and (free < 256 << 20 or free / total < 0.05):
            warnings.append(f"only {_human(free)} free of {_human(total)}: new segments and LMDB growth "
                            "will fail with ENOSPC (commits fail; nothing acknowledged is lost)")
    except OSError:
        pass
    return warnings


def info(path: str) -> dict[str, Any]:
    """Everything an operator wants to know at a glance; read-only (works while a writer runs)."""
    target = locate(path)
    out: dict[str, Any] = {"path": target.path, "kind": target.kind, "log_dir": target.log_dir}
    holder = lock_holder(target.log_dir) if os.path.isdir(target.log_dir) else None
    out["writer_pid"] = holder
    out["durability"] = "chosen by each writer when it opens the store"
    if target.is_store:
        out["store_format"] = _store_meta(target)
        out["follower_of"] = following_archive(target.path)
        out["sealing"] = _sealing(out["store_format"])
    opened = _open_segments(target.log_dir) if os.path.isdir(target.log_dir) else []
    try:
        segs = _scan_segments(opened)
    finally:
        _close_segments(opened)
    out["log_format_version"] = segs[0].version if segs else None
    out["segments"] = [dataclasses.asdict(s) for s in segs]
    first = segs[0].first_lsn if segs else 1
    last = segs[-1].last_lsn if segs else 0
    damaged = next((s for s in segs if s.damaged), None)
    if damaged is not None:
        last = damaged.last_lsn
    out["log"] = {"segments": len(segs), "first_lsn": first, "last_lsn": last,
                  "records": sum(s.records for s in segs),
                  "bytes": sum(s.size for s in segs), "disk_bytes": sum(s.disk_bytes for s in segs),
                  "damaged": damaged is not None,
                  "torn_tail": bool(segs) and segs[-1].status == "torn"}
    checked = VerifyReport(target, segments=segs)
    _log_problems(checked, holder is not None)  # the per-segment scans and the rules across segments
    out["log"]["problems"] = [p.message for p in checked.problems]
    out["log"]["damaged"] = bool(checked.problems)
    broken, tmps = _extra_files(target.log_dir)
    out["broken_files"] = broken
    out["tmp_files"] = tmps
    if target.is_store:
        stats = _state_stats(target)
        applied = int(stats["applied_lsn"])
        out["state"] = {"applied_lsn": applied, "keys": stats["state_keys"],
                        "map_bytes_used": stats["state_map_bytes_used"],
                        # Free pages: LMDB reuses them before growing the file; `agentwal compact`
                        # gives them back. Of those, the ones freed since the last checkpoint: what
                        # the next checkpoint makes reusable (the writer's pin keeps them till then).
                        "file_bytes": stats.get("state_file_bytes", 0),
                        "used_bytes": stats.get("state_used_bytes", 0),
                        "free_bytes": stats.get("state_free_bytes", 0),
                        "free_pages": stats.get("state_free_pages", 0),
                        "checkpoint_reclaims_bytes": stats.get("state_pinned_free_bytes", 0)}
        out["watermarks"] = {"log_last_lsn": last, "applied_lsn": applied,
                             "unapplied_records": max(0, last - applied)}
        oldest = _commit_time(target.log_dir, first) if segs else None
        newest = _commit_time(target.log_dir, last) if segs and last >= first else None
        now_ms = time.time() * 1000
        out["commits"] = {
            "oldest_retained": _iso(oldest) if oldest else None,
            "oldest_retained_age_s": round((now_ms - oldest) / 1000, 3) if oldest else None,
            "newest": _iso(newest) if newest else None,
            "newest_age_s": round((now_ms - newest) / 1000, 3) if newest else None,
        }
        writer = stats.get("last_writer")
        if writer:
            out["durability"] = (f"{writer['durability']}"
                                 + (f", rpo_ms={writer['rpo_ms']}" if writer.get("rpo_ms") else "")
                                 + f" (as last opened for writing, pid {writer.get('pid')}, "
                                 + f"{_iso(writer['opened_unix_ms'])})")
        ckpt = stats.get("last_checkpoint")
        if ckpt:
            out["checkpoint"] = {"last": _iso(ckpt["unix_ms"]), "age_s": round((now_ms - ckpt["unix_ms"]) / 1000, 3),
                                 "applied_lsn": ckpt["applied_lsn"]}
        else:
            out["checkpoint"] = ("none yet; the log retains the commits since "
                                 f"{out['commits']['oldest_retained'] or '(none)'}")
    apparent, allocated = _tree_bytes(target.path)
    out["total_bytes"] = apparent
    out["total_disk_bytes"] = allocated
    out["warnings"] = storage_warnings(target.path)
    return out


def _sealing(meta: dict[str, Any]) -> dict[str, Any]:
    """What a store's STORE file (`meta`) says of its sealing: {"encrypted", "key_ids",
    "compression"} (the codec, "none" where it never compressed)."""
    sealed = meta.get(STORE_FIELD)
    if not isinstance(sealed, dict):
        return {"encrypted": False, "key_ids": [], "compression": "none"}
    compression = sealed.get("compression")
    return {"encrypted": bool(sealed.get("encrypted")),
            "key_ids": [i for i in sealed.get("key_ids") or [] if isinstance(i, str)],
            "compression": str(compression.get("codec", "?")) if isinstance(compression, dict) else "none"}


def _state_stats(target: Target) -> dict[str, Any]:
    """applied_lsn, state_keys, state_map_bytes_used of a store's state, read-only (zeros if it has none)."""
    if not os.path.exists(os.path.join(target.state_dir, "data.mdb")):
        return {"applied_lsn": 0, "state_keys": 0, "state_map_bytes_used": 0}
    with open_reader(target) as store:
        return store.stats()


def value_opener(target: Target) -> Callable[[bytes, bytes], bytes] | None:
    """For `get` and `scan`: None for a plain store (values are shown as stored); for a sealed
    one, `open_(key, envelope) -> value`, which decompresses and decrypts with the command's keys
    (`use_sealing`: the command line's --key-file). A compressed store needs no key; an
    encrypted one without a key is refused here (MissingKeyError naming --key-file), one with
    none of its keys by `wal.store.sealed.plan` (WrongKeyError), before any value is read."""
    meta = read_meta(target.path)
    sealed = meta.get(STORE_FIELD) if meta is not None else None
    if not isinstance(sealed, dict):
        return None
    # A key given for a store that is not encrypted opens nothing: reading ignores it.
    encryption = sealing_options().get("encryption") if sealed.get("encrypted") else None
    if sealed.get("encrypted") and encryption is None:
        ids = [i for i in sealed.get("key_ids") or [] if isinstance(i, str)]
        listed = f" (key ids {', '.join(ids)})" if ids else ""
        raise MissingKeyError(f"the store at {target.path} is encrypted{listed}: its values are shown only "
                              "with its key. Give it with --key-file FILE (repeat --key-file for older keys), or "
                              "list the keys alone with `scan --keys-only`", key_id=ids[0] if ids else None,
                              where=target.path)
    sealing = plan(target.path, readonly=True, encryption=encryption, compression=None,
                   compression_threshold=None, compression_dict=None)
    if sealing is None:
        return None
    sealer = sealing.sealer

    def open_(key: bytes, envelope: bytes) -> bytes:
        return sealer.open(envelope, CONTEXT_VALUE + key, lambda: f"the value of key {key!r} in the store at "
                                                                  f"{target.path}")
    return open_


def get(path: str, key: bytes) -> tuple[tuple[int, bytes] | None, str | None]:
    """((version, value) or None if absent, a warning or None); read-only. A sealed store's value
    is opened (`value_opener`: an encrypted one needs its key)."""
    target = locate(path, need_store=True)
    open_ = value_opener(target)
    with StateView(target) as view:
        found = view.get(key)
        if found is not None and open_ is not None:
            found = (found[0], open_(key, found[1]))
        return found, view.warning


def scan(path: str, prefix: bytes = b"", limit: int | None = None,
         on_warning: Callable[[str], None] | None = None, *,
         opened: bool = True) -> Iterator[tuple[bytes, int, bytes]]:
    """(key, version, value) with `prefix` in key order, from one consistent snapshot; read-only.
    A sealed store's values are opened (`value_opener`) unless `opened` is False: then they are
    the envelopes as stored (export, a listing of keys alone), and an encrypted store needs no key."""
    target = locate(path, need_store=True)
    open_ = value_opener(target) if opened else None
    view = StateView(target)
    try:
        if view.warning and on_warning is not None:
            on_warning(view.warning)
        for n, item in enumerate(view.scan(prefix)):
            if limit is not None and n >= limit:
                break
            yield item if open_ is None else (item[0], item[1], open_(item[0], item[2]))
    finally:
        view.close()


# ---- dump ----------------------------------------------------------------------------------------------


def dump(path: str, from_lsn: int = 1, to_lsn: int | None = None, *, raw: bool = False, salvage: bool = False,
         on_skip: Callable[[Skip], None] | None = None,
         on_note: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Log records as JSON-ready dicts, read-only; store transactions decoded unless `raw`.

    Strict: raises CorruptionError at the first damage, after the records before it.
    salvage: reads past damage, telling `on_skip` what it could not read.
    """
    target = locate(path)
    if not os.path.isdir(target.log_dir):
        raise UsageError(f"{target.path} has no log directory")
    if to_lsn is not None and to_lsn < from_lsn:
        raise ArgumentError(f"--to-lsn {to_lsn} is below --from-lsn {from_lsn}")
    segs = _open_segments(target.log_dir)
    try:
        first = _first_lsn_of(segs[0]) if segs else None
        if first is not None and from_lsn < first:
            if from_lsn > 1 and on_note is not None:
                on_note(f"LSNs below {first} are no longer in the log (removed by checkpoints); "
                        f"starting at LSN {first}")
            from_lsn = first
        decode = target.is_store and not raw
        for rec in iter_log(target.log_dir, from_lsn, to_lsn, salvage=salvage, on_skip=on_skip, segments=segs):
            yield record_json(rec.lsn, rec.payload, segment=rec.path, offset=rec.offset, decode=decode)
    finally:
        _close_segments(segs)


# ---- stats ---------------------------------------------------------------------------------------------


def stats(path: str) -> dict[str, Any]:
    """Gauges read from disk, read-only: log extent, state, what the next open would replay, the writer.

    The live counters of a running writer (commits, fsyncs, fsync latency, durable lag) are in
    that process: ``store.stats()``, rendered for Prometheus by `wal.metrics.prometheus_text`.
    """
    started = time.monotonic()
    target = locate(path)
    segments = recovery.list_segments(target.log_dir) if os.path.isdir(target.log_dir) else []
    first, last = last_lsn(target.log_dir) if segments else (1, 0)
    log_apparent = log_disk = 0
    for _, p in segments:
        with contextlib.suppress(OSError):
            st = os.stat(p)
            log_apparent += st.st_size
            log_disk += st.st_blocks * 512
    broken, _tmps = _extra_files(target.log_dir)
    holder = lock_holder(target.log_dir) if os.path.isdir(target.log_dir) else None
    out: dict[str, Any] = {
        "kind": target.kind,
        "log_segments": len(segments),
        "log_bytes": log_apparent,
        "log_disk_bytes": log_disk,
        "log_first_lsn": first,
        "log_last_lsn": last,
        "log_broken_files": len(broken),
        "writer_running": holder is not None,
        "writer_pid": holder or 0,
    }
    if target.is_store:
        s = _state_stats(target)
        applied = int(s["applied_lsn"])
        _, state_disk = _tree_bytes(target.state_dir)
        out.update({
            "applied_lsn": applied,
            "unapplied_records": max(0, last - applied),
            "state_keys": s["state_keys"],
            "state_map_bytes_used": s["state_map_bytes_used"],
            "state_disk_bytes": state_disk,
        })
        newest = _commit_time(target.log_dir, last) if last >= first else None
        if newest is not None:
            out["last_commit_age_seconds"] = round(max(0.0, time.time() - newest / 1000), 3)
        out.update(_archive_gauges(target.path))
    out["stats_seconds"] = round(time.monotonic() - started, 6)
    return out


def _archive_gauges(root: str) -> dict[str, Any]:
    """The archive's gauges and counters as the store's writer last reported them (its
    archive.json, about once a second): the archived LSN, the lag, the PUTs made (a counter, for
    rate()), ... with the report's age, so a scrape from another process sees the archive too.
    archive_failing is 1 while the shipper's last attempt failed, and archive_error then says
    why (text: `agentwal stats --format prometheus` leaves it out, since each new message would
    make a new series)."""
    status = read_archive_status(root)
    if status is None:
        return {}
    out: dict[str, Any] = {k: v for k, v in status.items()
                           if (k.startswith("archive_") or k == "archived_lsn") and isinstance(v, int | float)}
    if isinstance(status.get("archive_url"), str):
        out["archive_url"] = status["archive_url"]
    error = status.get("archive_error")
    out["archive_failing"] = int(isinstance(error, str) and bool(error))
    if out["archive_failing"]:
        out["archive_error"] = error
    updated = status.get("updated_unix_ms")
    if isinstance(updated, int) and not isinstance(updated, bool):
        out["archive_status_age_seconds"] = round(max(0.0, time.time() - updated / 1000), 3)
    return out
