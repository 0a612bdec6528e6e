/*
 * lmdbapi.h -- the reads wal._lmdbcall lends wal._storecore, through a capsule.
 *
 * Why. A `Store.get` is an overlay lookup (owned by wal._storecore's Core) and, when the
 * overlay has no acknowledged version, an LMDB read (owned by wal._lmdbcall's Env). Done as
 * two Python calls and a tuple between them, a get cost ~2 us against py-lmdb's ~1.3 us for
 * the same LMDB read. With these functions the store's Core makes the whole read in one C
 * call (native/storecore.c, "Reads"), and a scan takes its LMDB snapshot and its overlay
 * versions at one instant, which is what makes it consistent (wal/store/store.py, "Reads").
 *
 * The capsule is `wal._lmdbcall.CAPI`, named WAL_LMDB_CAPI_NAME. Every function is called with
 * the GIL held and never releases it. `env` must be a wal._lmdbcall.Env (checked by is_env).
 * Errors: -1 or NULL with an LmdbError set, which wal/store/state.py classifies; the store's fast
 * paths drop such an error and repeat the read on the Python path, which raises it properly.
 */
#ifndef WAL_LMDBAPI_H
#define WAL_LMDBAPI_H

#include <Python.h>
#include <stdint.h>

#define WAL_LMDB_CAPI_NAME "wal._lmdbcall.CAPI"
#define WAL_LMDB_CAPI_VERSION 1

typedef struct {
    int version; /* WAL_LMDB_CAPI_VERSION */
    /* 1 if `o` is an Env, else 0. */
    int (*is_env)(PyObject *o);
    /* Begin a read transaction of the environment: 0, or -1 (closed, forked, LMDB error). */
    int (*read_begin)(PyObject *env, void **txn);
    /* End a read transaction begun by read_begin (kept as a spare for the next one). */
    void (*read_end)(PyObject *env, void *txn);
    /* The DATA entry of `key` (exact bytes) in `txn`, checked: 1 with *version and *value (a
     * new reference to the value's bytes, version and checksum stripped), 0 if absent, -1. */
    int (*get)(PyObject *env, void *txn, PyObject *key, uint64_t *version, PyObject **value);
    /* Up to `limit` DATA entries with `prefix`, keys > `after` (NULL: from the prefix on), in
     * key order, checked: a list of (key, value), or of (key, version, value) if `versions`. */
    PyObject *(*scan)(PyObject *env, void *txn, PyObject *prefix, PyObject *after, Py_ssize_t limit,
                      int versions);
    /* A wal._lmdbcall.Snapshot that owns `txn` from now on (aborted with it, or when the
     * environment closes); NULL with the transaction ended on failure. */
    PyObject *(*adopt)(PyObject *env, void *txn);
} wal_lmdb_capi;

#endif
