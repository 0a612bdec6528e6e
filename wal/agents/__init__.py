"""The agent runtime layer over one `wal.Store`: per-thread event streams and state, idempotent
tool calls, verified checkpoints with history, retention and content-addressed blobs.

`AgentStore` and its errors live in `wal.agents.store` (the contracts are in its docstring);
they are re-exported here, their public home.
"""

from wal.agents.store import (
    DELETE_BATCH,
    AgentStore,
    BlobMissingError,
    CallRecord,
    CheckpointCorruptError,
    CheckpointInfo,
    CheckpointMismatchError,
    ThreadDeletingError,
)

__all__ = [
    "DELETE_BATCH",
    "AgentStore",
    "BlobMissingError",
    "CallRecord",
    "CheckpointCorruptError",
    "CheckpointInfo",
    "CheckpointMismatchError",
    "ThreadDeletingError",
]
