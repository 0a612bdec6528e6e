/*
 * logcall.h -- how the CPython extensions (appendcall.c for Log.append, storecore.c for the
 * store's commit) call the log's append and wait, and when they let go of the GIL.
 *
 * The functions are the cffi module's (wal._native), handed over as addresses by
 * wal/_bindings.py, so there is one copy of the log's code in the process. Static inline:
 * each extension gets its own copy of these few lines and no symbol is shared.
 *
 * GIL policy. Releasing the GIL for a call that takes a microsecond is a loss whenever
 * another Python thread wants it -- the store's materializer, other committing threads:
 * each release hands the GIL over and the caller then sleeps until it is handed back
 * (measured: `Store.put` at `interval` from 64 threads, ~180,000 commits/s releasing the
 * GIL around each write(), ~570,000/s keeping it). So:
 *  - `buffered` is acknowledged once copied into the log's buffer: appended with the GIL held.
 *  - `interval` is acknowledged once written to the OS: the append (WAL_WAIT_TRY) makes the
 *    write of the pending batch in this thread, GIL held, when the write slot is free, no
 *    segment roll is due and the last write was quick (native/commit.c); wal_log_wait_try
 *    then answers without the log's mutex, or makes the write if the append could not. A write
 *    to the page cache takes microseconds; when the kernel throttles writers (dirty pages
 *    over its limits) one can take milliseconds, and after a write over 1 ms commit.c makes
 *    none under the GIL for a hundred times as long (at least a second): such stalls stay
 *    under ~1% of the time.
 *  - Anything that has to wait -- `sync`'s fdatasync, another thread's write in progress,
 *    back-pressure -- waits with the GIL released.
 */
#ifndef WAL_LOGCALL_H
#define WAL_LOGCALL_H

#include <Python.h>
#include <stdint.h>

#include "wal.h"

typedef int64_t (*log_append_fn)(wal_log *log, const char *data, size_t len, int level, int wait);
typedef int (*log_wait_fn)(wal_log *log, uint64_t lsn, int level);
typedef int64_t (*log_append_unfinished_fn)(wal_log *log, const char *data, size_t len, size_t fill_from, int level,
                                            wal_unfinished *out);
typedef int (*log_finish_fn)(wal_log *log, const wal_unfinished *rec, const char *bytes, int ok);

/* The functions, set once by each module's bind(). */
typedef struct {
    log_append_fn append;   /* wal_log_append */
    log_wait_fn wait;       /* wal_log_wait */
    log_wait_fn wait_try;   /* wal_log_wait_try */
    log_append_unfinished_fn append_unfinished; /* wal_log_append_unfinished (NULL: not bound) */
    log_finish_fn finish;   /* wal_log_finish */
} log_calls;

/* bind(append_address, wait_address, wait_try_address[, append_unfinished_address,
 * finish_address]): fill `calls`; 0, or -1 with an exception set. */
static inline int log_calls_bind(log_calls *calls, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "bind takes the addresses of wal_log_append, wal_log_wait and "
                                         "wal_log_wait_try, and optionally wal_log_append_unfinished and wal_log_finish");
        return -1;
    }
    void *p[5] = {NULL, NULL, NULL, NULL, NULL};
    for (int i = 0; i < nargs; i++) {
        p[i] = PyLong_AsVoidPtr(args[i]);
        if (p[i] == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bind: a null function address");
            return -1;
        }
    }
    calls->append = (log_append_fn)(uintptr_t)p[0];
    calls->wait = (log_wait_fn)(uintptr_t)p[1];
    calls->wait_try = (log_wait_fn)(uintptr_t)p[2];
    calls->append_unfinished = (log_append_unfinished_fn)(uintptr_t)p[3];
    calls->finish = (log_finish_fn)(uintptr_t)p[4];
    return 0;
}

/* Wait, called with the GIL held, until `level` holds for `lsn` (appended by this thread):
 * 0 or a WAL_E* code. Keeps the GIL for an `interval` write it can make at once (see above);
 * releases it for anything that waits. */
static inline int log_wait_level(const log_calls *calls, wal_log *log, uint64_t lsn, int level) {
    if (level == WAL_LEVEL_BUFFERED) return 0; /* appended is all it asks */
    int rc = level == WAL_LEVEL_INTERVAL ? calls->wait_try(log, lsn, level) : WAL_EAGAIN;
    if (rc != WAL_EAGAIN) return rc;
    Py_BEGIN_ALLOW_THREADS
    rc = calls->wait(log, lsn, level);
    Py_END_ALLOW_THREADS
    return rc;
}

#endif
