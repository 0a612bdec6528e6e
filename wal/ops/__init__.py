"""Operator functions behind the `agentwal` command line: inspect, verify, dump, edit, repair, follow.

Each subcommand of `wal.cli` has one function in this package that does the work and returns data
(dicts, dataclasses, iterators); the CLI only parses arguments and prints. Tests and
scripts may call these directly.

Read-only by default. Everything that only reads works while a writer process has the
store open: the log is read from the segment files (the C scanner checks every CRC and
LSN), the state through a read-only LMDB handle, and neither takes the writer lock.
Commands that write (`put`, `delete`, `import`, `checkpoint`, `repair`) open the store
as its one writer and fail with `LockedError` naming the process that holds it.

A target is a store (a directory with a ``STORE`` file; its log is ``log/``) or a bare
log directory (segment files and/or a ``LOCK`` file). `info`, `verify`, `dump`, `tail`,
`stats` and `repair` accept both; the key-value commands need a store.

The modules, by what the operator does: target (which store, who holds it), render (bytes
shown and parsed), segments (the log read from its files), inspect (info, stats, get, scan,
dump), verify, edit (put, delete, checkpoint, compact), transfer (export, import), repair,
follow (tail), metrics (Prometheus text).
"""

# The operator functions, re-exported: `wal.ops.verify(path)` wherever they live.
from wal.ops.edit import checkpoint, compact, delete, put
from wal.ops.follow import Follower
from wal.ops.inspect import dump, get, info, scan, stats, storage_warnings
from wal.ops.rekey import rekey
from wal.ops.render import human_bytes, key_bytes, parse_bytes, record_json, render_bytes, text_preview
from wal.ops.repair import RepairPlan, RepairResult, backup_log, plan_repair, repair
from wal.ops.segments import LogRecord, SegmentInfo, Skip, iter_log, last_lsn
from wal.ops.stateview import StateView
from wal.ops.target import OpsError, Progress, Target, UsageError, locate, lock_holder, use_sealing
from wal.ops.transfer import export_lines, import_pairs, parse_import
from wal.ops.verify import Problem, VerifyReport, verify

__all__ = [
    "Follower",
    "LogRecord",
    "OpsError",
    "Problem",
    "Progress",
    "RepairPlan",
    "RepairResult",
    "SegmentInfo",
    "Skip",
    "StateView",
    "Target",
    "UsageError",
    "VerifyReport",
    "backup_log",
    "checkpoint",
    "compact",
    "delete",
    "dump",
    "export_lines",
    "get",
    "human_bytes",
    "import_pairs",
    "info",
    "iter_log",
    "key_bytes",
    "last_lsn",
    "locate",
    "lock_holder",
    "parse_bytes",
    "parse_import",
    "plan_repair",
    "put",
    "record_json",
    "rekey",
    "render_bytes",
    "repair",
    "scan",
    "stats",
    "storage_warnings",
    "text_preview",
    "use_sealing",
    "verify",
]
