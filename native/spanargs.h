/*
 * spanargs.h -- the arrays of a wal.log.log.RecordSpan, as the CPython extensions that read one
 * take them: readcall.c (Log.read) and storecore.c (Collapser.add, the replay).
 *
 * A span's record i has its LSN at lsns[i] and its payload at buffer[offsets[i] :
 * offsets[i] + lengths[i]]; lsns and offsets are native-endian u64 arrays, lengths u32,
 * any object with the buffer protocol. Both readers check every range against the buffer
 * here, so neither can read outside it. Static inline: each module gets its own copy and
 * no symbol is shared between them.
 */
#ifndef WAL_SPANARGS_H
#define WAL_SPANARGS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Py_buffer lsns, offsets, lengths;
} span_arrays;

/* Views of the three arrays, each holding at least `count` items; 0, or -1 with a ValueError
 * naming `who` (and nothing held). */
static inline int span_arrays_get(span_arrays *a, PyObject *lsns, PyObject *offsets, PyObject *lengths,
                                  size_t count, const char *who) {
    PyObject *objs[3] = {lsns, offsets, lengths};
    Py_buffer *views[3] = {&a->lsns, &a->offsets, &a->lengths};
    static const char *names[3] = {"lsns", "offsets", "lengths"};
    static const size_t item[3] = {8, 8, 4};
    for (int k = 0; k < 3; k++) {
        int bad = PyObject_GetBuffer(objs[k], views[k], PyBUF_SIMPLE) < 0;
        if (!bad && (size_t)views[k]->len / item[k] < count) {
            PyErr_Format(PyExc_ValueError, "%s: %s holds %zd bytes, %zu needed", who, names[k], views[k]->len,
                         count * item[k]);
            PyBuffer_Release(views[k]);
            bad = 1;
        }
        if (bad) {
            while (k-- > 0) PyBuffer_Release(views[k]);
            return -1;
        }
    }
    return 0;
}

static inline void span_arrays_release(span_arrays *a) {
    PyBuffer_Release(&a->lsns);
    PyBuffer_Release(&a->offsets);
    PyBuffer_Release(&a->lengths);
}

/* Record i's LSN, offset and length; 0, or -1 when its payload lies outside a buffer of
 * `size` bytes (no exception set: the caller says what it was doing). Needs no GIL. */
static inline int span_record(const span_arrays *a, size_t i, uint64_t size, uint64_t *lsn, uint64_t *off,
                              uint32_t *len) {
    memcpy(lsn, (const char *)a->lsns.buf + 8 * i, 8);
    memcpy(off, (const char *)a->offsets.buf + 8 * i, 8);
    memcpy(len, (const char *)a->lengths.buf + 4 * i, 4);
    return *off > size || *len > size - *off ? -1 : 0;
}

#endif
