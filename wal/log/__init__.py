"""The log floor: a directory of segment files that commits are appended to, group-committed
to disk, and read back from after a crash.

Modules: `log` (`wal.Log`: segments, appends, the group-commit waits, reads, checkpoint
truncation), `durability` (the levels and RPO targets, and how each maps onto the C core's
group-commit flusher), `recovery` (the open-time scan: every record checked, a torn tail
cut, damage reported with where it is), `record` (the payload of a store's commit record:
its puts and deletes), `format` (FORMAT.md written as a pure-Python reference codec, the
oracle the tests and the fuzzer hold the C reader against).

The bytes themselves are written and checked in C (native/: writer.c, segment.c, reader.c,
commit.c, crc32c.c); this floor imports only the bindings and the shared ground below it.
"""
