/*
 * overlay.h -- the store's overlay: per key, the versions not yet applied to LMDB.
 *
 * What it is for (wal/store/store.py, "Reads"). Every commit enters its ops here before it is
 * acknowledged, and the materializer drops them once LMDB holds them, so a read finds
 * any acknowledged commit either here or in LMDB (I2, read-your-writes). With one
 * thread putting 300,000 distinct keys, the table holds 100k-300k keys; every put adds
 * one and every apply removes one, each a cache miss into a large table.
 *
 * Why not a Python dict of (lsn, value, older) tuples, as before. Each version then cost
 * a PyLong and a 3-tuple (allocation, and the cyclic GC counting and walking them), the
 * dict was traversed by every full collection, and an apply rebuilt tuple chains. Here a
 * version is a 24-byte struct and the table is invisible to the GC.
 *
 * Layout. An open-addressing table with linear probing over slots {hash, key, newest};
 * each slot points to the key's versions, newest first, as a chain of {lsn, value,
 * older}. A removed slot is filled by shifting the later slots of its probe run back
 * (no tombstones), so millions of insert/remove cycles never lengthen the probes; the
 * table doubles past 5/8 full and shrinks once it stays below 1/8 (see overlay_compact).
 *
 * Contracts.
 *  - Every call is made with the GIL held; nothing here releases it, so a reader never
 *    sees a half-made change (the store has no other lock around reads). Nor does
 *    anything here run Python code while it walks the table: it only drops references
 *    to exact bytes (whose dealloc runs none) and makes Python objects (which may start
 *    a garbage collection, hence finalizers, hence a thread switch) after the walk.
 *  - Keys are exact bytes (the callers convert anything else): their hash is Python's,
 *    cached in the object and seeded per process, so chosen keys cannot force long
 *    probe runs. A slot holds a strong reference to its key, a version one to its
 *    value (exact bytes) or NULL for a delete. Neither can be part of a reference
 *    cycle, which is why the table need not be visible to the GC.
 *  - Versions of one key are entered in LSN order; overlay_prune(applied) drops exactly
 *    the versions with lsn <= applied and keeps the newer ones.
 */
#ifndef WAL_OVERLAY_H
#define WAL_OVERLAY_H

#include <Python.h>
#include <stdint.h>

enum { OV_WHOLE = 0, OV_BEING_WRITTEN = 1, OV_NEVER = 2 };

typedef struct ov_version {
    uint64_t lsn;
    PyObject *value; /* exact bytes, or NULL: the version is a delete */
    struct ov_version *older;
    /* OV_WHOLE, or OV_BEING_WRITTEN: `value` is an envelope whose bytes its committing thread
     * is still writing, with the GIL released (a sealed put at `sync`; native/commit.c,
     * "Records finished later"), until it sets OV_WHOLE (or OV_NEVER: they could not be made)
     * with overlay_version_written. Only a read of the newest version, past what is
     * acknowledged, can meet it (storecore.c, core_overlay_newest). Read and set atomically. */
    unsigned char state;
} ov_version;

typedef struct {
    Py_hash_t hash;
    PyObject *key; /* NULL: an empty slot */
    ov_version *newest;
} ov_slot;

typedef struct {
    ov_slot *slots; /* NULL until the first key */
    size_t mask;    /* capacity - 1; the capacity is a power of two */
    size_t used;    /* keys in the table */
    ov_version *spare; /* freed versions kept for reuse, linked through `older` */
    size_t n_spare;
    unsigned sparse_runs; /* overlay_compact calls in a row that found the table sparse */
} overlay;

void overlay_init(overlay *o);
/* Release every key, value and version, and the table itself. */
void overlay_free(overlay *o);
/* Start loading the cache line where `key` would be found, so that a later call on it does
 * not wait for memory: the table outgrows the CPU's cache (300k keys: ~12 MiB), so a probe
 * is a cache (and TLB) miss, which a caller can overlap with other work. */
void overlay_prefetch(const overlay *o, PyObject *key);
/* The same for the key's newest version, once its slot is in cache (overlay_prefetch first). */
void overlay_prefetch_version(const overlay *o, PyObject *key);
/* Enter version `lsn` of `key` (value: bytes, or NULL for a delete) as the key's newest.
 * `being_written` non-NULL: the value's bytes are still being written; the version is marked
 * OV_BEING_WRITTEN and *being_written points to it, for overlay_version_written. The pointer
 * stays valid until then: a version is pruned only once applied, so durable, and its record
 * cannot be durable before the writer has finished it, which it does after marking it.
 * 0, or -1 with MemoryError set (the overlay is then unchanged). */
int overlay_add(overlay *o, PyObject *key, uint64_t lsn, PyObject *value, ov_version **being_written);
/* The bytes of a version entered OV_BEING_WRITTEN are written (ok) or will never be (!ok);
 * callable without the GIL. */
void overlay_version_written(ov_version *v, int ok);
/* The key's newest version with lsn <= limit, or NULL. */
const ov_version *overlay_find(const overlay *o, PyObject *key, uint64_t limit);
/* Drop the key's versions with lsn <= applied; the key goes when none is left. */
void overlay_prune(overlay *o, PyObject *key, uint64_t applied);
/* Once per materializer pass: shrink the table to at most 1/4 full once it has stayed under
 * 1/8 full for a number of calls in a row (a failed allocation leaves it as it is: still
 * correct, only larger). */
void overlay_compact(overlay *o);
/* [(key, lsn, value | None)] of the keys starting with prefix, each with its newest version
 * with lsn <= limit (keys with none are left out), in no particular order. */
PyObject *overlay_scan(const overlay *o, const char *prefix, Py_ssize_t prefix_len, uint64_t limit);

#endif
