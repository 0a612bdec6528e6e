/*
 * readcall.c -- wal._readcall: a span of log records turned into Python objects in one call.
 *
 * Why it exists. `Log.read` yields (lsn, payload) per record. Built in Python from a
 * `RecordSpan` (three arrays and the mapped segment), each record cost ~300 ns of
 * interpreter work -- an int from each array, a slice of the map, a tuple, a generator
 * step -- against ~170 ns per KiB record for the whole validated pass that produced the
 * span (1 GB of 1 KiB records, warm: 0.17 s for the spans, 0.48 s for `read`). Here the
 * same objects are made by one C loop per span (Log.read asks for spans of 256 records).
 *
 * Contract. `records(buffer, lsns, offsets, lengths, count)` takes a span's buffer and
 * arrays (native/spanargs.h), each array holding at least `count` items, and returns a
 * list of `count` (lsn, payload: bytes) tuples. A payload range outside the buffer is a
 * ValueError, never a read out of bounds. The payloads are copies: nothing returned
 * refers to the buffer, which the caller may unmap as soon as the call returns.
 *
 * Beside it, the reverse for the archive: `object_records` builds the record section of an
 * archive log object in one call (see there). Reading one back (check every record, index
 * it in place) is native/objindex.c's, through cffi so the download threads let the GIL go.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "crc32c.h"
#include "spanargs.h"

static PyObject *readcall_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "records takes (buffer, lsns, offsets, lengths, count)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[4]);
    if (count == -1 && PyErr_Occurred()) return NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "records: count out of range");
        return NULL;
    }
    Py_buffer buf;
    span_arrays a;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (span_arrays_get(&a, args[1], args[2], args[3], (size_t)count, "records") < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        uint64_t lsn, off;
        uint32_t len;
        if (span_record(&a, (size_t)i, (uint64_t)buf.len, &lsn, &off, &len) < 0) {
            PyErr_Format(PyExc_ValueError, "records: record %zd (offset %llu, length %u) lies outside the "
                         "%zd-byte buffer", i, (unsigned long long)off, len, buf.len);
            Py_CLEAR(out);
            break;
        }
        PyObject *item = PyTuple_New(2);
        PyObject *lsn_obj = PyLong_FromUnsignedLongLong(lsn);
        PyObject *payload = PyBytes_FromStringAndSize((const char *)buf.buf + off, (Py_ssize_t)len);
        if (item == NULL || lsn_obj == NULL || payload == NULL) {
            Py_XDECREF(item);
            Py_XDECREF(lsn_obj);
            Py_XDECREF(payload);
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(item, 0, lsn_obj);
        PyTuple_SET_ITEM(item, 1, payload);
        PyList_SET_ITEM(out, i, item);
    }
    span_arrays_release(&a);
    PyBuffer_Release(&buf);
    return out;
}

/* object_records(records) -> bytes: the record section of an archive log object (FORMAT.md,
 * "Log objects"; wal/archive/layout.py encode_log), from a list of (lsn: int, payload: bytes):
 * per record lsn:u64 length:u32 crc32c(lsn, length, payload):u32 then the payload, all
 * little-endian. One call instead of a cffi CRC call per record: each of those let the GIL go
 * and, with 64 committing threads waiting for it, took it back only after them, on the
 * shipper's path from one PUT to the next. The bytes are copied with the GIL held; the CRCs of
 * a large section (>= 256 KiB: merges, catching up) are computed without it, over the copy. */
#define OBJECT_RECORD_HEAD 16
#define OBJECT_CRC_NOGIL_BYTES (256 * 1024)

static PyObject *readcall_object_records(PyObject *self, PyObject *records) {
    (void)self;
    if (!PyList_CheckExact(records)) {
        PyErr_SetString(PyExc_TypeError, "object_records takes a list of (lsn, payload) tuples");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(records);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(records, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(item, 1))) {
            PyErr_SetString(PyExc_TypeError, "object_records takes a list of (lsn, payload: bytes) tuples");
            return NULL;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(item, 1));
        if (len > (Py_ssize_t)UINT32_MAX || total > PY_SSIZE_T_MAX - OBJECT_RECORD_HEAD - len) {
            PyErr_SetString(PyExc_OverflowError, "object_records: the records are too large");
            return NULL;
        }
        total += OBJECT_RECORD_HEAD + len;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) return NULL;
    unsigned char *base = (unsigned char *)PyBytes_AS_STRING(out);
    unsigned char *p = base;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(records, i);
        unsigned long long lsn = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 0));
        if (lsn == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *payload = PyTuple_GET_ITEM(item, 1);
        uint32_t len = (uint32_t)PyBytes_GET_SIZE(payload);
        for (int b = 0; b < 8; b++) p[b] = (unsigned char)(lsn >> (8 * b));
        for (int b = 0; b < 4; b++) p[8 + b] = (unsigned char)(len >> (8 * b));
        memcpy(p + OBJECT_RECORD_HEAD, PyBytes_AS_STRING(payload), len);
        p += OBJECT_RECORD_HEAD + len;
    }
    PyThreadState *released = total >= OBJECT_CRC_NOGIL_BYTES ? PyEval_SaveThread() : NULL;
    for (p = base; p < base + total;) {
        uint32_t len = (uint32_t)p[8] | (uint32_t)p[9] << 8 | (uint32_t)p[10] << 16 | (uint32_t)p[11] << 24;
        uint32_t crc = wal_crc32c(wal_crc32c(0, p, 12), p + OBJECT_RECORD_HEAD, len);
        for (int b = 0; b < 4; b++) p[12 + b] = (unsigned char)(crc >> (8 * b));
        p += OBJECT_RECORD_HEAD + len;
    }
    if (released != NULL) PyEval_RestoreThread(released);
    return out;
}

static PyMethodDef readcall_methods[] = {
    {"records", (PyCFunction)(void (*)(void))readcall_records, METH_FASTCALL,
     "records(buffer, lsns, offsets, lengths, count) -> [(lsn, payload)] (see native/readcall.c)."},
    {"object_records", (PyCFunction)readcall_object_records, METH_O,
     "object_records([(lsn, payload)]) -> bytes: an archive log object's record section (see native/readcall.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef readcall_module = {
    PyModuleDef_HEAD_INIT, "wal._readcall", "A span of log records as Python objects in one call, and an archive object's records (native/readcall.c).",
    -1, readcall_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__readcall(void) { return PyModule_Create(&readcall_module); }
