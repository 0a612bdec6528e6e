"""The store floor: a key-value store whose commits go through the log (wal/log/) into an LMDB
materialized state.

Modules: `store` (`wal.Store` and `wal.Transaction`: commits, the in-memory overlay of
acknowledged but unapplied writes, the materializer thread, checkpoints and back-pressure),
`state` (the LMDB state: applied LSN, per-entry checksums, checkpoints, map sizing, compaction),
`snapshot` (`wal.Snapshot`: one consistent view across overlay and LMDB), `replay` (the log
replayed into the state when a store opens).
"""
