/*
 * appendcall.c -- wal._appendcall: how Python calls wal_log_append on its hot paths,
 * without cffi's generic call.
 *
 * Why it exists. A cffi call converts each argument generically and always releases
 * the GIL. For `Log.append` at `interval` (one write() per commit, ~0.9 us in all) the
 * conversion alone was ~0.1 us; a METH_FASTCALL function that takes the handle as an
 * int and the payload as bytes does it in a few loads. And for an append that only
 * copies a record into the log's buffer (~100 ns) releasing the GIL is a loss: each
 * release lets another Python thread -- the store's materializer, say -- take the GIL,
 * and the appending thread then sleeps until it is handed back (measured with the store
 * at `buffered`: ~180,000 context switches per 400,000 puts, ~2 us per put).
 *
 * Contract. Both functions call wal_log_append through the pointer handed to `bind`, so
 * the code is the one in the cffi module, not a second copy.
 *  - `append_nowait` keeps the GIL and accepts only WAL_WAIT_TRY or WAL_WAIT_NONE. In
 *    those modes wal_log_append does no I/O and never waits on a condition: it takes the
 *    log's mutex, copies, and returns WAL_EAGAIN instead of blocking under back-pressure.
 *    The mutex is only ever held for memory work (do_write and do_sync drop it around
 *    their syscalls), and no C thread of the log ever takes the GIL, so holding the GIL
 *    across the call cannot deadlock and stalls other Python threads for at most a copy.
 *    Any other mode is refused with WAL_EINVAL.
 *  - `append` is Log.append's whole call. At `buffered` and `interval` it appends as
 *    append_nowait does (WAL_WAIT_TRY), GIL held, then waits for the level as
 *    native/logcall.h's policy says (an `interval` write it can make at once keeps the GIL;
 *    any real wait releases it). At `sync`, or under back-pressure, the whole call is made
 *    with the GIL released (WAL_WAIT_LEVEL), as cffi would: many threads committing at
 *    `sync` then never hold the GIL while they queue for the log's mutex. The
 *    payload is a bytes object the caller's frame holds, so its buffer stays valid while
 *    the GIL is released.
 * The handle is a wal_log* as an int (wal._bindings.handle_address). wal.Log frees it only
 * when the Log object dies, so a call racing close() gets WAL_ECLOSED, never freed memory.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "logcall.h"
#include "wal.h"

static log_calls g_log; /* set by bind() */

static PyObject *appendcall_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (log_calls_bind(&g_log, args, nargs) < 0) return NULL;
    Py_RETURN_NONE;
}

/* The arguments both functions share: (handle_address, payload: bytes, level). 0 or -1 with
 * an exception set. */
static int parse_common(const char *name, PyObject *const *args, wal_log **log, PyObject **payload, int *level) {
    if (g_log.append == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s before bind", name);
        return -1;
    }
    *log = (wal_log *)PyLong_AsVoidPtr(args[0]);
    if (*log == NULL) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: a null log handle", name);
        return -1;
    }
    if (!PyBytes_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "%s: the payload must be bytes, not %.100s", name, Py_TYPE(args[1])->tp_name);
        return -1;
    }
    *payload = args[1];
    long l = PyLong_AsLong(args[2]);
    if (l == -1 && PyErr_Occurred()) return -1;
    *level = (int)l;
    return 0;
}

/* append_nowait(handle_address, payload: bytes, level: int, wait: int) -> int
 * Returns wal_log_append's result: the LSN, or a negative WAL_E* code. GIL held. */
static PyObject *appendcall_append_nowait(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "append_nowait takes (handle_address, payload, level, wait)");
        return NULL;
    }
    wal_log *log;
    PyObject *payload;
    int level;
    if (parse_common("append_nowait", args, &log, &payload, &level) < 0) return NULL;
    long wait = PyLong_AsLong(args[3]);
    if (wait == -1 && PyErr_Occurred()) return NULL;
    if (wait != WAL_WAIT_TRY && wait != WAL_WAIT_NONE) return PyLong_FromLongLong(WAL_EINVAL);
    return PyLong_FromLongLong(
        g_log.append(log, PyBytes_AS_STRING(payload), (size_t)PyBytes_GET_SIZE(payload), level, (int)wait));
}

/* append(handle_address, payload: bytes, level: int) -> int
 * wal_log_append(..., WAL_WAIT_LEVEL): the LSN once `level` holds, or a negative WAL_E* code. */
static PyObject *appendcall_append(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "append takes (handle_address, payload, level)");
        return NULL;
    }
    wal_log *log;
    PyObject *payload;
    int level;
    if (parse_common("append", args, &log, &payload, &level) < 0) return NULL;
    const char *data = PyBytes_AS_STRING(payload);
    size_t len = (size_t)PyBytes_GET_SIZE(payload);
    int64_t r;
    if (level != WAL_LEVEL_SYNC) { /* sync waits for an fdatasync anyway: all of it without the GIL */
        r = g_log.append(log, data, len, level, WAL_WAIT_TRY); /* a copy: keep the GIL */
        if (r > 0) {
            int rc = log_wait_level(&g_log, log, (uint64_t)r, level);
            return PyLong_FromLongLong(rc < 0 ? rc : r);
        }
        if (r != WAL_EAGAIN) return PyLong_FromLongLong(r);
    }
    Py_BEGIN_ALLOW_THREADS
    r = g_log.append(log, data, len, level, WAL_WAIT_LEVEL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(r);
}

static PyMethodDef appendcall_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))appendcall_bind, METH_FASTCALL,
     "bind(append_address, wait_address, wait_try_address): the cffi module's wal_log_append, wal_log_wait "
     "and wal_log_wait_try, which both appends call."},
    {"append", (PyCFunction)(void (*)(void))appendcall_append, METH_FASTCALL,
     "append(handle_address, payload, level) -> LSN once the level holds, or a WAL_E* code (see appendcall.c)."},
    {"append_nowait", (PyCFunction)(void (*)(void))appendcall_append_nowait, METH_FASTCALL,
     "append_nowait(handle_address, payload, level, wait) -> LSN or WAL_E* code; GIL held (see appendcall.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef appendcall_module = {
    PyModuleDef_HEAD_INIT, "wal._appendcall", "The log's hot append calls without cffi (see native/appendcall.c).",
    -1, appendcall_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__appendcall(void) { return PyModule_Create(&appendcall_module); }
