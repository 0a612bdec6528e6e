/*
 * gilheld.c -- wal._gilheld: the one append call made WITHOUT releasing the GIL.
 *
 * Why it exists. cffi releases the GIL around every C call. For a call that may
 * block (a write, an fdatasync, a wait) that is what we want; for an append that
 * only copies a record into the log's buffer (~100 ns) it is a loss: each release
 * lets another Python thread -- the store's materializer, say -- take the GIL, and
 * the appending thread then sleeps until it is handed back. Measured with the store
 * at `buffered`: ~180,000 context switches per 400,000 puts and ~2 us per put.
 *
 * Contract. `append_nowait` calls wal_log_append (through the pointer handed to
 * `bind`, so the code is the one in the cffi module, not a second copy) only with
 * WAL_WAIT_TRY or WAL_WAIT_NONE. In those modes wal_log_append does no I/O and
 * never waits on a condition: it takes the log's mutex, copies, and returns
 * WAL_EAGAIN instead of blocking under back-pressure. The mutex is only ever held
 * for memory work (do_write and do_sync drop it around their syscalls), and no C
 * thread of the log ever takes the GIL, so holding the GIL across the call cannot
 * deadlock and stalls other Python threads for at most a copy. Any other mode is
 * refused with WAL_EINVAL: a blocking call must go through cffi.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "wal.h"

typedef int64_t (*append_fn)(wal_log *log, const char *data, size_t len, int level, int wait);

static append_fn g_append;

static PyObject *gilheld_bind(PyObject *self, PyObject *address) {
    (void)self;
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bind: a null function address");
        return NULL;
    }
    g_append = (append_fn)(uintptr_t)p;
    Py_RETURN_NONE;
}

/* append_nowait(handle_address: int, payload: bytes, level: int, wait: int) -> int
 * Returns wal_log_append's result: the LSN, or a negative WAL_E* code. */
static PyObject *gilheld_append_nowait(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "append_nowait takes (handle_address, payload, level, wait)");
        return NULL;
    }
    if (g_append == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "append_nowait before bind");
        return NULL;
    }
    wal_log *log = (wal_log *)PyLong_AsVoidPtr(args[0]);
    if (log == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "append_nowait: a null log handle");
        return NULL;
    }
    if (!PyBytes_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "append_nowait: the payload must be bytes, not %.100s",
                     Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    long level = PyLong_AsLong(args[2]);
    long wait = PyLong_AsLong(args[3]);
    if ((level == -1 || wait == -1) && PyErr_Occurred()) return NULL;
    if (wait != WAL_WAIT_TRY && wait != WAL_WAIT_NONE) return PyLong_FromLongLong(WAL_EINVAL);
    int64_t r = g_append(log, PyBytes_AS_STRING(args[1]), (size_t)PyBytes_GET_SIZE(args[1]), (int)level,
                         (int)wait);
    return PyLong_FromLongLong(r);
}

static PyMethodDef gilheld_methods[] = {
    {"bind", gilheld_bind, METH_O, "bind(address of wal_log_append): set the function append_nowait calls."},
    {"append_nowait", (PyCFunction)(void (*)(void))gilheld_append_nowait, METH_FASTCALL,
     "append_nowait(handle_address, payload, level, wait) -> LSN or WAL_E* code; GIL held (see gilheld.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gilheld_module = {
    PyModuleDef_HEAD_INIT, "wal._gilheld", "Non-blocking appends that keep the GIL (see native/gilheld.c).",
    -1, gilheld_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gilheld(void) { return PyModule_Create(&gilheld_module); }
