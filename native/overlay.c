/*
 * overlay.c -- the store's overlay table (see overlay.h for what it holds and why).
 */
#include "overlay.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define OV_MIN_SLOTS 256
/* Freed versions kept for reuse: an apply batch (4096 commits, wal/store/store.py) frees about as
 * many as the puts that follow it enter, so this many spares serve a burst without a
 * malloc each, and bound what an emptied overlay keeps (192 KiB). */
#define OV_SPARE_MAX 8192
/* Consecutive overlay_compact calls (materializer passes: every apply batch, and every
 * apply_interval_ms when idle) that must find the table under 1/8 full before it shrinks. */
#define OV_SHRINK_AFTER 16
/* How many slots ahead a resize fetches where it will write. */
#define RESIZE_AHEAD 16
/* Tables from this size on are faulted in whole when made (see ov_prefault). */
#define OV_PREFAULT_BYTES ((size_t)256 << 10)

void overlay_init(overlay *o) { memset(o, 0, sizeof *o); }

static size_t ov_capacity(const overlay *o) { return o->slots == NULL ? 0 : o->mask + 1; }

/* Exact bytes hash to Python's cached hash, which never fails. */
static Py_hash_t ov_hash(PyObject *key) { return PyObject_Hash(key); }

static int ov_same(const ov_slot *s, PyObject *key, Py_hash_t hash) {
    if (s->key == key) return 1;
    Py_ssize_t n = PyBytes_GET_SIZE(key);
    return s->hash == hash && PyBytes_GET_SIZE(s->key) == n &&
           memcmp(PyBytes_AS_STRING(s->key), PyBytes_AS_STRING(key), (size_t)n) == 0;
}

/* The slot holding `key`, or the empty slot ending its probe run (where it would go).
 * The table is never full (at most 5/8), so the run ends. */
static ov_slot *ov_probe(const overlay *o, PyObject *key, Py_hash_t hash) {
    size_t i = (size_t)hash & o->mask;
    for (;;) {
        ov_slot *s = &o->slots[i];
        if (s->key == NULL || ov_same(s, key, hash)) return s;
        i = (i + 1) & o->mask;
    }
}

/* A probe run for a missing key averages ~3 slots at 5/8 full, often into the next line.
 * (Past the table's end, a prefetch is simply dropped: it never faults.) */
static void ov_prefetch_run(const ov_slot *s) {
    __builtin_prefetch(s, 1, 3);
    __builtin_prefetch((const char *)s + 64, 1, 3);
}

static ov_version *ov_version_new(overlay *o) {
    ov_version *v = o->spare;
    if (v != NULL) {
        o->spare = v->older;
        o->n_spare--;
        return v;
    }
    return PyMem_Malloc(sizeof *v);
}

/* Release a chain of versions (their values with them). */
static void ov_chain_free(overlay *o, ov_version *v) {
    while (v != NULL) {
        ov_version *older = v->older;
        Py_XDECREF(v->value);
        if (o->n_spare < OV_SPARE_MAX) {
            v->older = o->spare;
            o->spare = v;
            o->n_spare++;
        } else {
            PyMem_Free(v);
        }
        v = older;
    }
}

/* Make a fresh table's pages present in one call, before the rehash writes them in random
 * order: each first touch of a 4 KiB page is otherwise a page fault of its own, and a table
 * of 300k keys (12 MiB) takes 3,000 of them. Measured on 300k one-op commits into a fresh
 * core (no materializer): 0.37 -> 0.33 us a commit. (The apply queue's ring, grown by
 * copying in order, gained nothing from the same.) A hint: where MADV_POPULATE_WRITE is
 * missing (Linux < 5.14) the faults happen as before. */
static void ov_prefault(void *p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1), end = ((uintptr_t)p + bytes) & ~(page - 1);
    if (end > start) (void)madvise((void *)start, end - start, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)bytes;
#endif
}

/* Move every key into a fresh table of `cap` slots (a power of two above the key count).
 * The keys are distinct, so each goes to the first empty slot of its run with no compare.
 * -1 (nothing changed) if the table cannot be allocated. */
static int ov_resize(overlay *o, size_t cap) {
    ov_slot *slots = PyMem_Calloc(cap, sizeof *slots);
    if (slots == NULL) return -1;
    if (cap * sizeof *slots >= OV_PREFAULT_BYTES) ov_prefault(slots, cap * sizeof *slots);
    size_t mask = cap - 1, old_cap = ov_capacity(o);
    for (size_t j = 0; j < old_cap; j++) {
        ov_slot *s = &o->slots[j];
        /* The old table is read in order, the new one written at random: fetch ahead. */
        if (j + RESIZE_AHEAD < old_cap && s[RESIZE_AHEAD].key != NULL)
            ov_prefetch_run(&slots[(size_t)s[RESIZE_AHEAD].hash & mask]);
        if (s->key == NULL) continue;
        size_t i = (size_t)s->hash & mask;
        while (slots[i].key != NULL) i = (i + 1) & mask;
        slots[i] = *s;
    }
    PyMem_Free(o->slots);
    o->slots = slots;
    o->mask = mask;
    return 0;
}

void overlay_prefetch(const overlay *o, PyObject *key) {
    if (o->slots != NULL) ov_prefetch_run(&o->slots[(size_t)ov_hash(key) & o->mask]);
}

void overlay_prefetch_version(const overlay *o, PyObject *key) {
    if (o->used == 0) return;
    const ov_slot *s = ov_probe(o, key, ov_hash(key));
    if (s->newest != NULL) __builtin_prefetch(s->newest, 1, 3);
}

int overlay_add(overlay *o, PyObject *key, uint64_t lsn, PyObject *value, ov_version **being_written) {
    Py_hash_t hash = ov_hash(key);
    size_t cap = ov_capacity(o);
    /* Grow before probing, so the slot found is the one written. A key already present
     * does not need it, but checking first would cost a second probe on every new key. */
    if ((o->used + 1) * 8 > cap * 5 && ov_resize(o, cap ? cap * 2 : OV_MIN_SLOTS) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    ov_version *v = ov_version_new(o);
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ov_slot *s = ov_probe(o, key, hash);
    v->lsn = lsn;
    v->value = value;
    v->state = being_written != NULL ? OV_BEING_WRITTEN : OV_WHOLE;
    if (being_written != NULL) *being_written = v;
    Py_XINCREF(value);
    if (s->key == NULL) {
        Py_INCREF(key);
        s->key = key;
        s->hash = hash;
        v->older = NULL;
        o->used++;
    } else {
        v->older = s->newest;
    }
    s->newest = v;
    return 0;
}

void overlay_version_written(ov_version *v, int ok) {
    /* Release: the value's bytes before the state, for a reader's acquire load. */
    __atomic_store_n(&v->state, ok ? OV_WHOLE : OV_NEVER, __ATOMIC_RELEASE);
}

const ov_version *overlay_find(const overlay *o, PyObject *key, uint64_t limit) {
    if (o->used == 0) return NULL;
    const ov_slot *s = ov_probe(o, key, ov_hash(key));
    if (s->key == NULL) return NULL;
    const ov_version *v = s->newest;
    while (v != NULL && v->lsn > limit) v = v->older;
    return v;
}

/* Empty slot i by shifting back the later slots of its run that may live there: a slot
 * may move to i when i lies on its probe path, from its home slot up to where it is.
 * Every key stays reachable from its home, and no tombstone is left behind. */
static void ov_remove_at(overlay *o, size_t i) {
    ov_slot *slots = o->slots;
    size_t mask = o->mask;
    for (size_t j = (i + 1) & mask; slots[j].key != NULL; j = (j + 1) & mask) {
        size_t home = (size_t)slots[j].hash & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            slots[i] = slots[j];
            i = j;
        }
    }
    slots[i].key = NULL;
    slots[i].newest = NULL;
    o->used--;
}

void overlay_prune(overlay *o, PyObject *key, uint64_t applied) {
    if (o->used == 0) return;
    ov_slot *s = ov_probe(o, key, ov_hash(key));
    if (s->key == NULL) return;
    ov_version **link = &s->newest; /* versions are newest first: the applied ones are a tail */
    while (*link != NULL && (*link)->lsn > applied) link = &(*link)->older;
    ov_version *applied_tail = *link;
    *link = NULL;
    if (s->newest == NULL) {
        PyObject *k = s->key;
        ov_remove_at(o, (size_t)(s - o->slots));
        Py_DECREF(k); /* bytes: frees memory, runs no Python code that could reach the table */
    }
    ov_chain_free(o, applied_tail);
}

void overlay_compact(overlay *o) {
    size_t cap = ov_capacity(o);
    if (cap <= OV_MIN_SLOTS || o->used * 8 >= cap) {
        o->sparse_runs = 0;
        return;
    }
    /* Only a table that stays sparse: in a burst the materializer may catch up for a moment
     * and empty the table almost, then fall behind again; shrinking there would regrow it
     * at once, rehashing every key twice for nothing. */
    if (++o->sparse_runs < OV_SHRINK_AFTER) return;
    o->sparse_runs = 0;
    /* Down to at most 1/4 full, well under the 5/8 that grows it again. */
    size_t want = OV_MIN_SLOTS;
    while (want < o->used * 4) want *= 2;
    if (want < cap) (void)ov_resize(o, want);
}

void overlay_free(overlay *o) {
    size_t cap = ov_capacity(o);
    for (size_t i = 0; i < cap; i++) {
        ov_slot *s = &o->slots[i];
        if (s->key == NULL) continue;
        ov_chain_free(o, s->newest);
        Py_DECREF(s->key);
    }
    PyMem_Free(o->slots);
    while (o->spare != NULL) {
        ov_version *v = o->spare;
        o->spare = v->older;
        PyMem_Free(v);
    }
    overlay_init(o);
}

PyObject *overlay_scan(const overlay *o, const char *prefix, Py_ssize_t prefix_len, uint64_t limit) {
    /* First the matches as plain references, then the Python objects: making a tuple may
     * start a garbage collection, whose finalizers may run Python code that lets another
     * thread in to prune (and resize) the table while it is being walked. */
    typedef struct {
        PyObject *key, *value;
        uint64_t lsn;
    } match;
    size_t cap = ov_capacity(o), n = 0;
    match *found = PyMem_Malloc((o->used ? o->used : 1) * sizeof *found);
    if (found == NULL) return PyErr_NoMemory();
    for (size_t i = 0; i < cap; i++) {
        const ov_slot *s = &o->slots[i];
        if (s->key == NULL || PyBytes_GET_SIZE(s->key) < prefix_len ||
            memcmp(PyBytes_AS_STRING(s->key), prefix, (size_t)prefix_len) != 0)
            continue;
        const ov_version *v = s->newest;
        while (v != NULL && v->lsn > limit) v = v->older;
        if (v == NULL) continue;
        found[n].key = Py_NewRef(s->key);
        found[n].value = Py_NewRef(v->value != NULL ? v->value : Py_None);
        found[n].lsn = v->lsn;
        n++;
    }
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        PyObject *item = out != NULL ? Py_BuildValue("(OKO)", found[i].key, (unsigned long long)found[i].lsn,
                                                     found[i].value)
                                     : NULL;
        if (item == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, (Py_ssize_t)i, item);
        Py_DECREF(found[i].key);
        Py_DECREF(found[i].value);
    }
    PyMem_Free(found);
    return out;
}
