"""Prometheus text exposition of `stats()` dicts (format 0.0.4), for a scrape endpoint or `agentwal stats`.

    from wal.ops.metrics import prometheus_text
    body = prometheus_text(store.stats())          # serve as text/plain; version=0.0.4

Numbers become samples named ``<prefix><stat>``; counters (`COUNTERS`: monotonic totals of
the process lifetime) get TYPE ``counter`` and the conventional ``_total`` suffix, every
other number is a ``gauge``. Booleans are gauges of 0 or 1. Strings (the durability level,
a failure message) become labels of one ``<prefix>info`` gauge of value 1, the usual way to
export text; None and structured values (tuples, lists) are left out. Names are sanitized
to ``[a-zA-Z_:][a-zA-Z0-9_:]*``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

# Monotonic counters of Log.stats() and Store.stats(): they only grow while the process lives.
COUNTERS = frozenset({
    "commits", "appends", "finished_later", "writes", "mapped_writes", "fsyncs", "bytes_written", "backpressure_waits",
    "backpressure_ms",
    "rpo_overruns", "segments_created", "apply_batches", "applied_commits", "checkpoints", "auto_checkpoints",
    "segments_removed", "conflicts", "idempotent_hits", "slow_fsyncs", "background_applies",
    "space_checkpoints", "state_backpressure_waits", "state_backpressure_ms",
    # the object archive (wal/archive/shipper.py)
    "archive_puts", "archive_put_bytes", "archive_put_errors", "archive_objects", "archive_snapshots",
    "archive_merges", "archive_deletes", "archive_gets", "archive_rpo_overruns",
})

HELP = {
    "commits": "Commits acknowledged.",
    "appends": "Append calls to the log.",
    "finished_later": "Records appended before their last bytes were made, then finished (a sealed put at sync, "
                      "encrypted with the GIL let go).",
    "writes": "Batches written to the OS.",
    "mapped_writes": "Of those, stored through a shared mapping of the segment rather than write() (interval).",
    "fsyncs": "fdatasyncs that made records durable.",
    "bytes_written": "Bytes written to log segments.",
    "group_size_mean": "Mean records made durable per fdatasync (group commit).",
    "group_size_max": "Most records made durable by one fdatasync.",
    "fsync_ms_p50": "Median fdatasync latency over the last 1024, milliseconds.",
    "fsync_ms_p99": "99th percentile fdatasync latency over the last 1024, milliseconds.",
    "fsync_ms_max": "Slowest fdatasync since the log was opened, milliseconds.",
    "fsync_ms_mean": "Mean fdatasync latency, milliseconds.",
    "durable_lag_ms": "Age of the oldest acknowledged commit not yet durable, milliseconds.",
    "backpressure_waits": "Appends that waited for the RPO bound or the buffer cap.",
    "backpressure_ms": "Milliseconds appends spent waiting under back-pressure.",
    "rpo_overruns": "Syncs that finished with the durable lag over rpo_ms.",
    "segments_created": "Log segments created.",
    "pending_bytes": "Bytes buffered but not yet written to the OS.",
    "appended_lsn": "Last LSN handed out.",
    "written_lsn": "Last LSN written to the OS.",
    "durable_lsn": "Last LSN covered by an fdatasync.",
    "applied_lsn": "Last LSN whose effect is in the LMDB state.",
    "recovery_seconds": "Seconds the last open spent recovering.",
    "records_replayed": "Log records replayed into the state by the last open.",
    "state_restored": "1 if the last open reopened the state at its last checkpoint (unclean stop, then a restart).",
    "state_keys": "Keys in the state.",
    "state_map_bytes_used": "Bytes of the LMDB map in use.",
    "background_applies": "State transactions run in a thread at the lowest CPU priority.",
    "unapplied_commits": "Commits acknowledged but not yet applied to the state.",
    "seconds_since_checkpoint": "Seconds since the last checkpoint.",
    "checkpoints": "Checkpoints run.",
    "segments_removed": "Log segments released by checkpoints.",
    "log_segments": "Segment files in the log.",
    "log_bytes": "Apparent size of the log's segment files, bytes.",
    "log_disk_bytes": "Disk space allocated to the log's segment files, bytes.",
    "log_first_lsn": "Oldest LSN still in the log.",
    "log_last_lsn": "Newest valid LSN in the log files.",
    "log_broken_files": ".broken files (bytes cut by recoveries) in the log directory.",
    "unapplied_records": "Log records after the state's applied LSN (replayed by the next open).",
    "state_disk_bytes": "Disk space allocated to the LMDB state, bytes.",
    "writer_running": "1 if a process holds the store's writer lock.",
    "writer_pid": "Pid of the process holding the writer lock (0: none).",
    "last_commit_age_seconds": "Seconds since the newest commit in the log.",
    "stats_seconds": "Seconds `agentwal stats` took to read these.",
    "slow_fsyncs": "Times the slowest fdatasync grew past slow_fsync_ms.",
    "space_checkpoints": "Automatic checkpoints due to the state's pages freed since the last one.",
    "state_backpressure_waits": "Commits that waited for the state (apply queue full, a checkpoint in progress).",
    "state_backpressure_ms": "Milliseconds commits spent waiting for the state.",
    "state_file_bytes": "Size of the LMDB state's pages, bytes (in use + free).",
    "state_used_bytes": "Bytes of the state's pages in use by its newest snapshot.",
    "state_free_bytes": "Bytes of free pages in the state (reused before the file grows; compact returns them).",
    "state_free_pages": "Free pages in the state.",
    "state_pinned_free_bytes": "Bytes of pages freed since the last checkpoint: reusable after the next.",
    "checkpoint_space_bound_bytes": ("Pages freed, or log written or applied, since the last checkpoint at which "
                                     "the next is due."),
    "archived_lsn": "Last LSN the object archive holds.",
    "archive_status_age_seconds": "Age of the archive figures read from archive.json (the writer's last report), s.",
    "archive_lag_ms": "Upper bound on the age of the oldest commit not yet in the object archive, milliseconds.",
    "archive_backlog_ms": "Time to ship the commits not in the object archive yet, at its PUTs' rate, ms.",
    "archive_rpo_ms": "The archive's lag bound (archive_rpo_ms), milliseconds.",
    "archive_puts": "PUT requests to the object archive (they cost money).",
    "archive_puts_per_s": "PUT requests to the object archive per second since the store opened.",
    "archive_put_bytes": "Bytes PUT to the object archive.",
    "archive_put_errors": "Failed object-archive requests (retried with backoff).",
    "archive_objects": "Log objects shipped to the archive.",
    "archive_snapshots": "State snapshots shipped to the archive.",
    "archive_merges": "Merges of small log objects into one.",
    "archive_deletes": "Objects deleted from the archive (merged away).",
    "archive_gets": "GET requests to the archive (merges, ownership checks).",
    "archive_rpo_overruns": "Times commits reached the archive more than archive_rpo_ms after they were acknowledged.",
    "archive_last_snapshot_lsn": "LSN of the newest state snapshot in the archive.",
    "archive_fenced": "1 if another writer took the archive over and this store stopped.",
    "archive_request_wait_s": "Seconds the oldest unanswered object-store request has waited (0: none waiting).",
    "archive_failing": "1 if the shipper's last attempt failed (archive_error says why; it retries).",
}

_BAD = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(name: str, prefix: str = "") -> str:
    """`prefix + name` sanitized to a valid Prometheus metric name."""
    out = _BAD.sub("_", prefix + name)
    if not out or not (out[0].isalpha() or out[0] in "_:"):
        out = "_" + out
    return out


def _label_name(name: str) -> str:
    out = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    if not out or out[0].isdigit():
        out = "_" + out
    return out


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{_label_name(k)}="{_label_value(str(v))}"' for k, v in sorted(labels.items())) + "}"


def prometheus_text(stats: Mapping[str, object], prefix: str = "agentwal_", *,
                    labels: Mapping[str, str] | None = None) -> str:
    """Render the numeric entries of a stats dict as Prometheus text exposition (ends with a newline).

    labels: added to every sample, e.g. ``{"store": "/var/lib/agent"}``.
    """
    common = dict(labels or {})
    lines: list[str] = []
    info: dict[str, str] = {}
    seen: set[str] = set()
    for key in sorted(stats):
        value = stats[key]
        if isinstance(value, str):
            info[key] = value
            continue
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int | float):
            continue  # None, tuples, lists: not a sample
        counter = key in COUNTERS
        name = metric_name(key + ("_total" if counter else ""), prefix)
        if name in seen:
            continue
        seen.add(name)
        help_text = HELP.get(key, f"agentwal stat {key}.").replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {'counter' if counter else 'gauge'}")
        lines.append(f"{name}{_labels(common)} {_number(value)}")
    if info:
        name = metric_name("info", prefix)
        lines.append(f"# HELP {name} Text-valued stats as labels (value always 1).")
        lines.append(f"# TYPE {name} gauge")
        lines.append(f"{name}{_labels({**common, **info})} 1")
    return "\n".join(lines) + "\n" if lines else ""
