"""cffi builder for the agentwal C core (out-of-line API mode).

`pip install .` runs this through setuptools' `cffi_modules`, producing the
private extension module `wal._native`. The declarations handed to cffi are
the CDEF block of native/wal.h, so the C boundary is declared exactly once.

Environment knobs (for the fuzz and sanitizer builds, never needed by users):
  AGENTWAL_CFLAGS   extra compiler flags, e.g. "-fsanitize=address,undefined -O1 -g"
  AGENTWAL_LDFLAGS  extra linker flags
"""

from __future__ import annotations

import os
import pathlib
import re

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
SOURCES = ["crc32c.c", "reader.c", "segment.c", "writer.c", "commit.c", "failpoint.c", "mapstore.c", "objindex.c",
           "forkwatch.c"]


def cdef_text() -> str:
    header = (HERE / "wal.h").read_text()
    match = re.search(r"/\* CDEF-BEGIN \*/(.*)/\* CDEF-END \*/", header, re.S)
    if match is None:
        raise RuntimeError("native/wal.h lost its CDEF-BEGIN/CDEF-END markers")
    return match.group(1)


# The archive's watermark (native/commit.c, "The archive's watermark"): what the archive's
# shipper reports and `replicated` commits wait for. wal_log_wait_archived: 0 once lsn is
# durable (it waits for that first, as wal_log_wait at sync) and the archive holds it; else a
# WAL_E* code from the log (WAL_EFAILED, WAL_ECLOSED, WAL_ENOSPC), WAL_EINVAL for an LSN not
# appended, WAL_EAGAIN once the shipper stopped (wal_log_stop_archived).
# wal_log_set_archived returns the waiters woken (and, as wal_log_stop_archived, writes the
# eventfd for asyncio's waiters); wal_log_archive_marks: out[0] = the archive's watermark,
# out[1] = 1 once the shipper stopped.
# wal_log_settled: 1 when every record appended is durable (read without the log's mutex).
ARCHIVE_CDEF = """
int wal_log_settled(wal_log *log);
int wal_log_set_archived(wal_log *log, uint64_t lsn);
void wal_log_stop_archived(wal_log *log);
void wal_log_archive_marks(wal_log *log, uint64_t *out);
int wal_log_wait_archived(wal_log *log, uint64_t lsn);
"""

ffibuilder = FFI()
ffibuilder.cdef(cdef_text() + ARCHIVE_CDEF)
ffibuilder.set_source(
    "wal._native",
    '#include "wal.h"\n' + ARCHIVE_CDEF,
    # setuptools wants source paths relative to the project root.
    sources=[f"native/{name}" for name in SOURCES],
    include_dirs=["native"],
    extra_compile_args=["-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        *os.environ.get("AGENTWAL_CFLAGS", "").split()],
    extra_link_args=["-pthread", *os.environ.get("AGENTWAL_LDFLAGS", "").split()],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
