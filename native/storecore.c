/*
 * storecore.c -- wal._storecore: the store's per-commit and per-apply work, in C.
 *
 * Why it exists. A `Store.put` at `interval` or `buffered` has a budget of about one
 * microsecond (the target: 1.5x LevelDB's unsynced put, benchmarks/README.md). In Python the commit path
 * (record, lock, overlay entry, apply queue) cost ~3 us and the materializer's share
 * (collapse each key to its last write, build LMDB's putmulti list, trim the overlay)
 * ~1.5 us, both under the one GIL. This module does that work in C; wal/store/store.py keeps
 * the policy (what is checked, when to wake whom, the LMDB transaction and I1) and the
 * slow paths (if_version, idempotency keys, multi-op transactions, back-pressure).
 *
 * Store records (FORMAT.md §15; all integers little-endian):
 *
 *     txn  := kind:u8 = 0x54  flags:u8  time_ms:u64  n_ops:u32  [idem]  op*
 *     idem := len:u16 key                  (present when flags & 1)
 *     op   := 0x01 klen:u16 key vlen:u32 value   put
 *           | 0x02 klen:u16 key                  delete
 *
 * This file is the one encoder and decoder of that layout (wal/log/record.py wraps it).
 *
 * Contracts.
 *  - Core.commit runs with the GIL held except where native/logcall.h's policy waits for
 *    the level with it released (after the commit lock is let go), and only takes the
 *    store's commit lock (a CommitLock, native/commitlock.h) with a non-blocking try:
 *    when the lock is busy, the value is not plain bytes, the log pushes back or the
 *    apply queue is over its bound, it returns 0 and the caller takes the Python path,
 *    which waits properly.
 *  - The append is made with WAL_WAIT_TRY / WAL_WAIT_NONE, which never block
 *    (native/appendcall.c argues why that is safe with the GIL held).
 *  - The overlay (native/overlay.h) is owned by Core and touched only with the GIL held:
 *    commits enter their versions under the commit lock, the materializer prunes them
 *    under it, and reads (overlay_get, overlay_scan) need no lock, each being one call
 *    that the GIL makes atomic.
 *  - The apply queue holds, in LSN order, one-op commits (key, value) and whole
 *    transactions (a wal.log.record.Txn) from the Python path. `take` and `prune` are called
 *    with the commit lock held by the caller.
 *  - Core holds a reference to the wal.Log whose handle it uses: the handle is freed only
 *    with that object, so a commit still waiting when the store closes cannot touch
 *    freed memory (the closed log answers it with WAL_ECLOSED).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "collapse.h"
#include "commitlock.h"
#include "lmdbapi.h"
#include "logcall.h"
#include "overlay.h"
#include "sealcore.h"
#include "spanargs.h"
#include "spin.h"
#include "wal.h"

#define KIND_TXN 0x54
#define FLAG_IDEMPOTENCY 0x01
#define OP_PUT 0x01
#define OP_DELETE 0x02
#define MAX_KEY_BYTES 511
#define TXN_HEAD_BYTES 14 /* kind, flags, time_ms, n_ops */
#define VERSION_BYTES 8   /* LMDB value = u64 version (LSN) + value (FORMAT.md §16) */
/* A queue length that is a multiple of this wakes the materializer (see wal/store/store.py). */
#define WAKE_EVERY 1024

static log_calls g_log; /* set by bind() */
/* wal_log_watermarks, set by bind_watermarks(): reads' watermark without a Python call. */
static int (*g_watermarks)(wal_log *log, uint64_t *out);

/* ---- little-endian helpers -------------------------------------------------------------- */

static void put_u16(char *p, uint16_t v) {
    p[0] = (char)(v & 0xff);
    p[1] = (char)(v >> 8);
}

static void put_u32(char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (char)((v >> (8 * i)) & 0xff);
}

static void put_u64(char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (char)((v >> (8 * i)) & 0xff);
}

static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A record's time_ms is for idempotency-key expiry (hours) and for people reading the log:
 * the coarse clock (a few ms of resolution) is enough, and reading it costs no clock read. */
static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- encoding ------------------------------------------------------------------------------ */

/* Bytes of one op: kind, klen, key, and for a put vlen and value. */
static size_t op_bytes(Py_ssize_t klen, Py_ssize_t vlen, int kind) {
    return 1 + 2 + (size_t)klen + (kind == OP_PUT ? 4 + (size_t)vlen : 0);
}

static char *write_head(char *p, uint8_t flags, uint64_t time_ms, uint32_t n_ops) {
    p[0] = (char)KIND_TXN;
    p[1] = (char)flags;
    put_u64(p + 2, time_ms);
    put_u32(p + 10, n_ops);
    return p + TXN_HEAD_BYTES;
}

static char *write_op(char *p, int kind, const char *key, Py_ssize_t klen, const char *val, Py_ssize_t vlen) {
    *p++ = (char)kind;
    put_u16(p, (uint16_t)klen);
    p += 2;
    memcpy(p, key, (size_t)klen);
    p += klen;
    if (kind == OP_PUT) {
        put_u32(p, (uint32_t)vlen);
        p += 4;
        memcpy(p, val, (size_t)vlen);
        p += vlen;
    }
    return p;
}

/* Check one (kind, key, value) op of a transaction; on success kind, key and val are set. */
static int parse_op(PyObject *op, int *kind, PyObject **key, PyObject **val) {
    if (!PyTuple_Check(op) || PyTuple_GET_SIZE(op) != 3) {
        PyErr_SetString(PyExc_TypeError, "an op must be a (kind, key, value) tuple");
        return -1;
    }
    long k = PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
    if (k == -1 && PyErr_Occurred()) return -1;
    *key = PyTuple_GET_ITEM(op, 1);
    *val = PyTuple_GET_ITEM(op, 2);
    /* Only what the layout can hold: the key limits are the store's to enforce (and the fuzz
     * findings build records over them on purpose, to check the decoder refuses them). */
    if (!PyBytes_Check(*key) || PyBytes_GET_SIZE(*key) > UINT16_MAX) {
        PyErr_SetString(PyExc_ValueError, "an op's key must be bytes of at most 65535 bytes");
        return -1;
    }
    if (k == OP_PUT) {
        if (!PyBytes_Check(*val) || (uint64_t)PyBytes_GET_SIZE(*val) > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a put's value must be bytes");
            return -1;
        }
    } else if (k == OP_DELETE) {
        if (*val != Py_None) {
            PyErr_SetString(PyExc_ValueError, "a delete's value must be None");
            return -1;
        }
    } else {
        PyErr_Format(PyExc_ValueError, "unknown op kind %ld", k);
        return -1;
    }
    *kind = (int)k;
    return 0;
}

/* encode(ops, time_ms, idempotency_key) -> bytes */
static PyObject *sc_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode takes (ops, time_ms, idempotency_key)");
        return NULL;
    }
    PyObject *ops = PySequence_Fast(args[0], "encode: ops must be a sequence");
    if (ops == NULL) return NULL;
    PyObject *result = NULL;
    uint64_t time_ms = PyLong_AsUnsignedLongLong(args[1]);
    PyObject *idem = args[2];
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ops);
    size_t total = TXN_HEAD_BYTES;
    if (time_ms == (uint64_t)-1 && PyErr_Occurred()) goto done;
    if (idem != Py_None) {
        if (!PyBytes_Check(idem) || PyBytes_GET_SIZE(idem) > UINT16_MAX) {
            PyErr_SetString(PyExc_ValueError, "an idempotency key must be bytes of at most 65535 bytes");
            goto done;
        }
        total += 2 + (size_t)PyBytes_GET_SIZE(idem);
    }
    if ((uint64_t)n > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many ops");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int kind;
        PyObject *key, *val;
        if (parse_op(PySequence_Fast_GET_ITEM(ops, i), &kind, &key, &val) < 0) goto done;
        total += op_bytes(PyBytes_GET_SIZE(key), kind == OP_PUT ? PyBytes_GET_SIZE(val) : 0, kind);
    }
    if (total > (size_t)PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) goto done;
    char *p = write_head(PyBytes_AS_STRING(result), idem != Py_None ? FLAG_IDEMPOTENCY : 0, time_ms,
                         (uint32_t)n);
    if (idem != Py_None) {
        put_u16(p, (uint16_t)PyBytes_GET_SIZE(idem));
        memcpy(p + 2, PyBytes_AS_STRING(idem), (size_t)PyBytes_GET_SIZE(idem));
        p += 2 + PyBytes_GET_SIZE(idem);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *op = PySequence_Fast_GET_ITEM(ops, i);
        int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
        PyObject *key = PyTuple_GET_ITEM(op, 1), *val = PyTuple_GET_ITEM(op, 2);
        p = write_op(p, kind, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key),
                     kind == OP_PUT ? PyBytes_AS_STRING(val) : NULL, kind == OP_PUT ? PyBytes_GET_SIZE(val) : 0);
    }
done:
    Py_DECREF(ops);
    return result;
}

/* ---- decoding ------------------------------------------------------------------------------ */

/* One op as the decoder found it: pointers into the payload. */
typedef struct {
    int kind;
    const char *key;
    Py_ssize_t klen;
    const char *val;
    Py_ssize_t vlen;
} raw_op;

typedef int (*op_sink)(void *ctx, const raw_op *op);

/* Walk one payload. Returns NULL when it is a well-formed transaction (each op handed to
 * `sink`, which may fail with a Python error: then *sink_failed is set), else the reason. */
static const char *walk_txn(const char *data, Py_ssize_t len, uint64_t *time_ms, const char **idem,
                            Py_ssize_t *idem_len, op_sink sink, void *ctx, int *sink_failed) {
    const unsigned char *p = (const unsigned char *)data;
    *sink_failed = 0;
    if (len < TXN_HEAD_BYTES) return "shorter than a transaction header";
    if (p[0] != KIND_TXN) return "unknown record kind";
    if (p[1] & ~FLAG_IDEMPOTENCY) return "unknown flags";
    *time_ms = get_u64(p + 2);
    uint32_t n = get_u32(p + 10);
    Py_ssize_t pos = TXN_HEAD_BYTES;
    *idem = NULL;
    *idem_len = 0;
    if (p[1] & FLAG_IDEMPOTENCY) {
        if (len - pos < 2) return "truncated idempotency key";
        uint16_t ilen = get_u16(p + pos);
        if (ilen == 0 || ilen > MAX_KEY_BYTES || len - pos - 2 < ilen) return "bad idempotency key length";
        *idem = data + pos + 2;
        *idem_len = ilen;
        pos += 2 + ilen;
    }
    for (uint32_t i = 0; i < n; i++) {
        raw_op op;
        if (len - pos < 3) return "truncated op";
        op.kind = p[pos];
        op.klen = get_u16(p + pos + 1);
        pos += 3;
        if (op.klen == 0 || op.klen > MAX_KEY_BYTES || len - pos < op.klen) return "bad key length";
        op.key = data + pos;
        pos += op.klen;
        op.val = NULL;
        op.vlen = 0;
        if (op.kind == OP_PUT) {
            if (len - pos < 4) return "truncated value length";
            uint32_t vlen = get_u32(p + pos);
            pos += 4;
            if ((uint64_t)(len - pos) < vlen) return "value runs past the record";
            op.val = data + pos;
            op.vlen = (Py_ssize_t)vlen;
            pos += (Py_ssize_t)vlen;
        } else if (op.kind != OP_DELETE) {
            return "unknown op";
        }
        if (sink(ctx, &op) < 0) {
            *sink_failed = 1;
            return "";
        }
    }
    if (pos != len) return "trailing bytes";
    return NULL;
}

static int sink_to_list(void *ctx, const raw_op *op) {
    PyObject *item = op->kind == OP_PUT ? Py_BuildValue("(iy#y#)", op->kind, op->key, op->klen, op->val, op->vlen)
                                        : Py_BuildValue("(iy#O)", op->kind, op->key, op->klen, Py_None);
    if (item == NULL) return -1;
    int rc = PyList_Append((PyObject *)ctx, item);
    Py_DECREF(item);
    return rc;
}

static PyObject *bad_record(const char *reason) {
    PyErr_SetString(PyExc_ValueError, reason);
    return NULL;
}

/* decode(payload) -> (ops: list, time_ms, idempotency_key | None); ValueError(reason) if malformed. */
static PyObject *sc_decode(PyObject *self, PyObject *payload) {
    (void)self;
    Py_buffer buf;
    if (PyObject_GetBuffer(payload, &buf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *ops = PyList_New(0), *result = NULL;
    uint64_t time_ms;
    const char *idem;
    Py_ssize_t idem_len;
    int sink_failed;
    if (ops == NULL) goto done;
    const char *why = walk_txn(buf.buf, buf.len, &time_ms, &idem, &idem_len, sink_to_list, ops, &sink_failed);
    if (sink_failed) goto done;
    if (why != NULL) {
        bad_record(why);
        goto done;
    }
    if (idem != NULL)
        result = Py_BuildValue("(OKy#)", ops, (unsigned long long)time_ms, idem, idem_len);
    else
        result = Py_BuildValue("(OKO)", ops, (unsigned long long)time_ms, Py_None);
done:
    Py_XDECREF(ops);
    PyBuffer_Release(&buf);
    return result;
}

/* ---- collapsing a batch to each key's last write ---------------------------------------- */

/* One write in a batch, in LSN order. `key` is a new reference when `owns_key`. */
typedef struct {
    uint64_t lsn;
    int kind;
    int owns_key;
    PyObject *key;
    const char *val;
    Py_ssize_t vlen;
} flat_op;

typedef struct {
    flat_op *ops;
    size_t n, cap;
    PyObject *idem; /* list of (idempotency key, lsn, time_ms), LSN order */
    uint64_t first, last, commits;
} flat_batch;

static int flat_init(flat_batch *b) {
    memset(b, 0, sizeof *b);
    b->idem = PyList_New(0);
    return b->idem == NULL ? -1 : 0;
}

static void flat_free(flat_batch *b) {
    for (size_t i = 0; i < b->n; i++)
        if (b->ops[i].owns_key) Py_DECREF(b->ops[i].key);
    PyMem_Free(b->ops);
    Py_XDECREF(b->idem);
    b->ops = NULL;
    b->n = b->cap = 0;
    b->idem = NULL;
}

static int flat_push(flat_batch *b, const flat_op *op) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        flat_op *ops = PyMem_Realloc(b->ops, cap * sizeof *ops);
        if (ops == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->ops = ops;
        b->cap = cap;
    }
    b->ops[b->n++] = *op;
    return 0;
}

static void flat_commit(flat_batch *b, uint64_t lsn) {
    if (b->commits == 0) b->first = lsn;
    b->last = lsn;
    b->commits++;
}

static int flat_idem(flat_batch *b, PyObject *key, uint64_t lsn, uint64_t time_ms) {
    PyObject *t = Py_BuildValue("(OKK)", key, (unsigned long long)lsn, (unsigned long long)time_ms);
    if (t == NULL) return -1;
    int rc = PyList_Append(b->idem, t);
    Py_DECREF(t);
    return rc;
}

/* Append (key, u64 version LE + value) -- LMDB's stored form (FORMAT.md §16) -- to `puts`. */
static int append_put(PyObject *puts, PyObject *key, uint64_t lsn, const char *val, Py_ssize_t vlen) {
    PyObject *stored = PyBytes_FromStringAndSize(NULL, VERSION_BYTES + vlen);
    if (stored == NULL) return -1;
    put_u64(PyBytes_AS_STRING(stored), lsn);
    if (vlen) memcpy(PyBytes_AS_STRING(stored) + VERSION_BYTES, val, (size_t)vlen);
    PyObject *pair = PyTuple_Pack(2, key, stored);
    Py_DECREF(stored);
    if (pair == NULL) return -1;
    PyObject_GC_UnTrack(pair); /* two bytes objects: no cycle possible */
    int rc = PyList_Append(puts, pair);
    Py_DECREF(pair);
    return rc;
}

/* The Collapsed tuple wal/log/record.py names: (first, last, commits, puts, deletes, idem). */
static PyObject *collapsed_tuple(const flat_batch *b, PyObject *puts, PyObject *dels) {
    return Py_BuildValue("(KKKOOO)", (unsigned long long)b->first, (unsigned long long)b->last,
                         (unsigned long long)b->commits, puts, dels, b->idem);
}

/* The keys flat_collapse has emitted: an open-addressing set over the batch's keys, borrowed
 * from it (exact bytes: their hash is Python's, cached, and runs no code). A set of its own
 * rather than a Python set: one probe per op instead of a lookup and an insert, and no
 * reference counting of thousands of keys per batch. */
typedef struct {
    Py_hash_t hash;
    PyObject *key; /* NULL: empty */
} seen_slot;

/* Add key; 1 if it was not there yet, 0 if it was. The set is never full (see flat_collapse). */
static int seen_add(seen_slot *slots, size_t mask, PyObject *key) {
    Py_hash_t hash = PyObject_Hash(key);
    Py_ssize_t n = PyBytes_GET_SIZE(key);
    for (size_t i = (size_t)hash & mask;; i = (i + 1) & mask) {
        seen_slot *s = &slots[i];
        if (s->key == NULL) {
            s->key = key;
            s->hash = hash;
            return 1;
        }
        if (s->key == key || (s->hash == hash && PyBytes_GET_SIZE(s->key) == n &&
                              memcmp(PyBytes_AS_STRING(s->key), PyBytes_AS_STRING(key), (size_t)n) == 0))
            return 0;
    }
}

/* The batch as a Collapsed tuple: each key once, with its last write; puts as
 * (key, u64 version LE + value) ready for LMDB's putmulti. */
static PyObject *flat_collapse(flat_batch *b) {
    size_t cap = 8;
    while (cap < 2 * b->n) cap *= 2; /* at most half full */
    seen_slot *seen = PyMem_Calloc(cap, sizeof *seen);
    PyObject *puts = PyList_New(0), *dels = PyList_New(0), *result = NULL;
    if (seen == NULL || puts == NULL || dels == NULL) {
        if (seen == NULL) PyErr_NoMemory();
        goto done;
    }
    /* Lists of keys and (key, stored) pairs: no cycle can pass through them, and the pairs
     * made below start a young-generation collection every ~700, each of which would walk
     * both lists (thousands of entries) again. */
    PyObject_GC_UnTrack(puts);
    PyObject_GC_UnTrack(dels);
    for (size_t i = b->n; i-- > 0;) { /* newest first: the first sighting of a key is its last write */
        flat_op *op = &b->ops[i];
        if (!seen_add(seen, cap - 1, op->key)) continue;
        if (op->kind == OP_DELETE) {
            if (PyList_Append(dels, op->key) < 0) goto done;
            continue;
        }
        if (append_put(puts, op->key, op->lsn, op->val, op->vlen) < 0) goto done;
    }
    /* Newest first is how they were found; LSN order is what LMDB likes best when keys grow
     * with time (message ids, step numbers): each insert lands at the end of a page. */
    if (PyList_Reverse(puts) < 0) goto done;
    result = collapsed_tuple(b, puts, dels);
done:
    PyMem_Free(seen);
    Py_XDECREF(puts);
    Py_XDECREF(dels);
    return result;
}

/* ---- collapsing raw records (replay) --------------------------------------------------------- */

/* Replay works on records in memory the log maps: each op goes into a ctab (native/collapse.h)
 * as pointers, and only each key's last write becomes Python objects, in emit_collapsed. */

typedef struct {
    ctab *table;
    uint64_t lsn;
} ctab_ctx;

static int sink_to_ctab(void *ctx, const raw_op *op) {
    ctab_ctx *c = ctx;
    return ctab_put(c->table, c->lsn, op->kind, op->key, (uint32_t)op->klen, op->val, (uint32_t)op->vlen);
}

/* What collapse_raw leaves for the GIL-holding side (collapse_finish) to do. */
enum { RAW_OK = 0, RAW_IDEM = 1, RAW_BAD = -1, RAW_NOMEM = -2 };

typedef struct {
    const char *idem; /* RAW_IDEM: the idempotency key, in the payload */
    Py_ssize_t idem_len;
    uint64_t time_ms;
    const char *why; /* RAW_BAD: what is wrong with the payload */
} raw_result;

/* Add one payload's ops to `table` and count the commit, touching no Python object, so it may
 * run without the GIL. RAW_IDEM: the commit carries an idempotency key, still to be recorded
 * by collapse_finish; RAW_BAD: the payload is malformed (half of it may be in the table). */
static int collapse_raw(ctab *table, flat_batch *counts, const char *data, Py_ssize_t len, uint64_t lsn,
                        raw_result *r) {
    ctab_ctx ctx = {table, lsn};
    int sink_failed;
    r->why = walk_txn(data, len, &r->time_ms, &r->idem, &r->idem_len, sink_to_ctab, &ctx, &sink_failed);
    if (sink_failed) return RAW_NOMEM;
    if (r->why != NULL) return RAW_BAD;
    flat_commit(counts, lsn);
    return r->idem != NULL ? RAW_IDEM : RAW_OK;
}

/* The GIL-holding half: record the idempotency key, or raise -- a malformed payload as
 * ValueError(lsn, reason). Returns 0 or -1 with an exception set. */
static int collapse_finish(flat_batch *counts, int raw, uint64_t lsn, const raw_result *r) {
    if (raw == RAW_OK) return 0;
    if (raw == RAW_NOMEM) {
        PyErr_NoMemory();
        return -1;
    }
    if (raw == RAW_BAD) {
        PyObject *err = Py_BuildValue("(Ks)", (unsigned long long)lsn, r->why);
        if (err != NULL) {
            PyErr_SetObject(PyExc_ValueError, err);
            Py_DECREF(err);
        }
        return -1;
    }
    PyObject *key = PyBytes_FromStringAndSize(r->idem, r->idem_len);
    if (key == NULL) return -1;
    int rc = flat_idem(counts, key, lsn, r->time_ms);
    Py_DECREF(key);
    return rc;
}

/* Add one payload's ops to `table` and count the commit, with the GIL held. */
static int collapse_payload(ctab *table, flat_batch *counts, const char *data, Py_ssize_t len, uint64_t lsn) {
    raw_result r;
    return collapse_finish(counts, collapse_raw(table, counts, data, len, lsn, &r), lsn, &r);
}

/* The table's winners as a Collapsed tuple (see flat_collapse): puts and deletes in the order
 * of their last write. */
static PyObject *emit_collapsed(ctab *table, flat_batch *counts) {
    size_t n;
    ctab_slot **won = ctab_sorted(table, &n);
    if (won == NULL && n == SIZE_MAX) return PyErr_NoMemory();
    PyObject *puts = PyList_New(0), *dels = PyList_New(0), *result = NULL;
    if (puts == NULL || dels == NULL) goto done;
    for (size_t i = 0; i < n; i++) {
        ctab_slot *s = won[i];
        PyObject *key = PyBytes_FromStringAndSize(s->key, s->klen);
        if (key == NULL) goto done;
        int rc = s->kind == OP_DELETE ? PyList_Append(dels, key)
                                      : append_put(puts, key, s->lsn, s->val, (Py_ssize_t)s->vlen);
        Py_DECREF(key);
        if (rc < 0) goto done;
    }
    result = collapsed_tuple(counts, puts, dels);
done:
    free(won);
    Py_XDECREF(puts);
    Py_XDECREF(dels);
    return result;
}

/* collapse(records: list[(lsn, payload: bytes)]) -> (first, last, commits, puts, deletes, idem)
 * Decodes each payload and collapses the lot. A malformed payload raises ValueError(lsn,
 * reason). The records list keeps the payloads alive while this runs. */
static PyObject *sc_collapse(PyObject *self, PyObject *records) {
    (void)self;
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "collapse takes a list of (lsn, payload)");
        return NULL;
    }
    ctab table;
    ctab_init(&table);
    flat_batch counts;
    if (flat_init(&counts) < 0) return NULL;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(rec, 1))) {
            PyErr_SetString(PyExc_TypeError, "collapse takes a list of (lsn, payload: bytes)");
            goto done;
        }
        uint64_t lsn = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(rec, 0));
        if (lsn == (uint64_t)-1 && PyErr_Occurred()) goto done;
        PyObject *payload = PyTuple_GET_ITEM(rec, 1);
        if (collapse_payload(&table, &counts, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), lsn) < 0)
            goto done;
    }
    result = emit_collapsed(&table, &counts);
done:
    ctab_reset(&table);
    flat_free(&counts);
    return result;
}

/* Collapser: the same over many spans of records in mapped log segments (Log.read_spans), so
 * that replay makes no Python object per record. It holds a buffer view of the span's
 * segment image while slots point into it; a span with count 0 (the log's "this segment
 * ends") or `detach` copies those winners and lets the view go, before the log unmaps it. */
typedef struct {
    PyObject_HEAD
    ctab table;
    flat_batch counts;
    Py_buffer view;
    int has_view;
    int busy; /* add is walking records without the GIL: every other call is refused */
} Collapser;

/* A Collapser serves one thread at a time; add releases the GIL part-way, so say so clearly
 * rather than let a second thread in on a table being written. */
static int collapser_idle(Collapser *c) {
    if (!c->busy) return 0;
    PyErr_SetString(PyExc_RuntimeError, "Collapser is in use by another thread");
    return -1;
}

static int collapser_detach_view(Collapser *c) {
    if (!c->has_view) return 0;
    if (ctab_own_all(&c->table) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    PyBuffer_Release(&c->view);
    c->has_view = 0;
    return 0;
}

static void collapser_reset(Collapser *c) {
    ctab_reset(&c->table);
    flat_free(&c->counts);
}

static int collapser_init(Collapser *c, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "", kwlist) || collapser_idle(c) < 0) return -1;
    if (c->has_view) {
        PyBuffer_Release(&c->view);
        c->has_view = 0;
    }
    collapser_reset(c);
    ctab_init(&c->table);
    return flat_init(&c->counts);
}

static void collapser_dealloc(Collapser *c) {
    if (c->has_view) PyBuffer_Release(&c->view);
    collapser_reset(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* add(buffer, lsns: u64[], offsets: u64[], lengths: u32[], count)
 * Collapse `count` records whose payloads lie at buffer[offsets[i] : offsets[i] + lengths[i]],
 * in LSN order after everything added before. count == 0: the buffer is going away (detach). */
static PyObject *collapser_add(Collapser *c, PyObject *const *args, Py_ssize_t nargs) {
    if (collapser_idle(c) < 0) return NULL;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "add takes (buffer, lsns, offsets, lengths, count)");
        return NULL;
    }
    if (c->counts.idem == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Collapser used after a failure (make a new one)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[4]);
    if (count < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "add: count must be >= 0");
        return NULL;
    }
    if (count == 0) {
        if (collapser_detach_view(c) < 0) return NULL;
        Py_RETURN_NONE;
    }
    if (c->has_view && c->view.obj != args[0] && collapser_detach_view(c) < 0) return NULL;
    if (!c->has_view) {
        if (PyObject_GetBuffer(args[0], &c->view, PyBUF_SIMPLE) < 0) return NULL;
        c->has_view = 1;
    }
    span_arrays a;
    size_t n = (size_t)count;
    if (span_arrays_get(&a, args[1], args[2], args[3], n, "add") < 0) return NULL;
    /* The records are walked without the GIL (the replay of a store's open runs in a thread
     * beside the open's scan, which then need not wait for it), stopping at each record that
     * needs Python -- an idempotency key to record, an error to raise. The buffers stay
     * exported to this object meanwhile; `busy` refuses any other use of it until done. */
    int rc = 0;
    const char *base = c->view.buf;
    size_t i = 0;
    c->busy = 1;
    while (i < n && rc == 0) {
        int raw = RAW_OK, outside = 0;
        uint64_t lsn = 0, off = 0;
        uint32_t len = 0;
        raw_result r;
        Py_BEGIN_ALLOW_THREADS
        for (; i < n; i++) {
            if (span_record(&a, i, (uint64_t)c->view.len, &lsn, &off, &len) < 0) {
                outside = 1;
                break;
            }
            raw = collapse_raw(&c->table, &c->counts, base + off, (Py_ssize_t)len, lsn, &r);
            if (raw != RAW_OK) break;
        }
        Py_END_ALLOW_THREADS
        if (i == n) break;
        if (outside) {
            PyErr_Format(PyExc_ValueError, "add: record LSN %llu at %llu+%u lies outside the buffer",
                         (unsigned long long)lsn, (unsigned long long)off, len);
            rc = -1;
        } else {
            rc = collapse_finish(&c->counts, raw, lsn, &r);
            i++;
        }
    }
    c->busy = 0;
    span_arrays_release(&a);
    if (rc < 0) { /* half a record may be in the table: nothing here can be applied any more */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        collapser_reset(c);
        if (c->has_view) {
            PyBuffer_Release(&c->view);
            c->has_view = 0;
        }
        PyErr_Restore(et, ev, tb);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *collapser_detach(Collapser *c, PyObject *unused) {
    (void)unused;
    if (collapser_idle(c) < 0) return NULL;
    if (collapser_detach_view(c) < 0) return NULL;
    Py_RETURN_NONE;
}

/* take() -> Collapsed | None: what was added since the last take, and start afresh. */
static PyObject *collapser_take(Collapser *c, PyObject *unused) {
    (void)unused;
    if (collapser_idle(c) < 0) return NULL;
    if (c->counts.idem == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Collapser used after a failure (make a new one)");
        return NULL;
    }
    if (c->counts.commits == 0) Py_RETURN_NONE;
    PyObject *result = emit_collapsed(&c->table, &c->counts);
    if (result == NULL) return NULL;
    collapser_reset(c);
    if (flat_init(&c->counts) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *collapser_get_keys(Collapser *c, void *closure) {
    (void)closure;
    if (collapser_idle(c) < 0) return NULL;
    return PyLong_FromSize_t(c->table.used);
}

static PyObject *collapser_get_held_bytes(Collapser *c, void *closure) {
    (void)closure;
    if (collapser_idle(c) < 0) return NULL;
    return PyLong_FromSize_t(c->table.held_bytes);
}

static PyMethodDef collapser_methods[] = {
    {"add", (PyCFunction)(void (*)(void))collapser_add, METH_FASTCALL,
     "add(buffer, lsns, offsets, lengths, count): collapse a span of records (count 0: detach)."},
    {"detach", (PyCFunction)collapser_detach, METH_NOARGS,
     "Copy what still points into the last buffer and release it."},
    {"take", (PyCFunction)collapser_take, METH_NOARGS,
     "take() -> (first, last, commits, puts, deletes, idem) or None; starts a new batch."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef collapser_getset[] = {
    {"keys", (getter)collapser_get_keys, NULL, "Distinct keys among them.", NULL},
    {"held_bytes", (getter)collapser_get_held_bytes, NULL, "Key and value bytes of their last writes.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CollapserType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wal._storecore.Collapser",
    .tp_basicsize = sizeof(Collapser),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Each key's last write over spans of store records in mapped memory (replay).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)collapser_init,
    .tp_dealloc = (destructor)collapser_dealloc,
    .tp_methods = collapser_methods,
    .tp_getset = collapser_getset,
};

/* ---- the commit core ------------------------------------------------------------------------ */

/* One queued commit: a single put/delete (key, value or NULL), or a whole transaction (txn). */
typedef struct {
    uint64_t lsn;
    int kind; /* OP_PUT, OP_DELETE, or 0: `txn` is a wal.log.record.Txn */
    PyObject *key;
    PyObject *value;
    PyObject *txn;
} qentry;

typedef struct {
    PyObject_HEAD
    PyObject *log;       /* the wal.Log: kept alive so its handle is (see the contracts above) */
    wal_log *handle;     /* NULL: the fast path is off (read-only, closed, failed, forked) */
    wal_log *marks;      /* the same handle, kept for reads' watermark (NULL: read-only) */
    CommitLock *lock;    /* the store's commit lock */
    overlay ov;          /* acknowledged-or-about-to-be versions not yet in LMDB */
    /* The watermarks reads take V from: wal_log_watermarks, or at `replicated`
     * wal_log_watermarks_archived (acknowledge_archived()): NULL until then. */
    int (*marks_fn)(wal_log *log, uint64_t *out);
    PyObject *wake_set;  /* the materializer's Event: bound set / is_set */
    PyObject *wake_is_set;
    int level;
    Py_ssize_t max_unapplied;
    long long checkpoint_bytes;
    long long bytes_since_checkpoint;
    char idle; /* the materializer sleeps long: the next queued commit wakes it (set by wal/store/store.py) */
    qentry *q; /* ring buffer */
    size_t head, len, cap;
    PyObject *env;       /* the store's LMDB environment (bind_state), for reads; or NULL */
    int reads_off;       /* close_reads(): reads take the Python path */
} Core;

static void q_clear_entry(qentry *e) {
    Py_XDECREF(e->key);
    Py_XDECREF(e->value);
    Py_XDECREF(e->txn);
    memset(e, 0, sizeof *e);
}

/* Append an entry; steals nothing (takes its own references). */
static int q_push(Core *c, uint64_t lsn, int kind, PyObject *key, PyObject *value, PyObject *txn) {
    if (c->len == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 1024;
        qentry *q = PyMem_Malloc(cap * sizeof *q);
        if (q == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < c->len; i++) q[i] = c->q[(c->head + i) % c->cap];
        PyMem_Free(c->q);
        c->q = q;
        c->cap = cap;
        c->head = 0;
    }
    qentry *e = &c->q[(c->head + c->len) % c->cap];
    e->lsn = lsn;
    e->kind = kind;
    e->key = key;
    e->value = value;
    e->txn = txn;
    Py_XINCREF(key);
    Py_XINCREF(value);
    Py_XINCREF(txn);
    c->len++;
    return 0;
}

/* `o` as exact bytes (new reference): what the overlay holds. A bytes subclass is copied, so
 * its own __hash__, __eq__ or __del__ never run inside the table; anything else is refused. */
static PyObject *exact_bytes(PyObject *o, const char *what) {
    if (PyBytes_CheckExact(o)) return Py_NewRef(o);
    if (PyBytes_Check(o)) return PyBytes_FromStringAndSize(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
    PyErr_Format(PyExc_TypeError, "%s must be bytes, not %.100s", what, Py_TYPE(o)->tp_name);
    return NULL;
}

/* Wake the materializer early once per WAKE_EVERY queued commits, or once a checkpoint is due
 * -- not on every commit while the queue is long: at interval/buffered most of it waits for the
 * flusher's fdatasync, and a materializer woken per commit finds nothing to apply and only
 * steals the GIL. Both commit paths go through here. */
static int core_maybe_wake(Core *c) {
    if ((c->len % WAKE_EVERY) != 0 && c->bytes_since_checkpoint < c->checkpoint_bytes && !c->idle) return 0;
    c->idle = 0; /* an idle materializer: woken by the first commit (then polls again) */
    PyObject *set = PyObject_CallNoArgs(c->wake_is_set);
    if (set == NULL) return -1;
    int is_set = PyObject_IsTrue(set);
    Py_DECREF(set);
    if (is_set) return is_set < 0 ? -1 : 0;
    PyObject *r = PyObject_CallNoArgs(c->wake_set);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* commit(kind, key, value, for_async) -> int
 * One put (value: bytes) or delete (value: None) at the store's level. Returns the LSN once
 * the level holds (for_async: once queued; the caller awaits the level), 0 when the caller
 * must take the Python path instead (nothing was done), or a negative WAL_E* code when the
 * commit was queued but waiting for its level failed. */
static PyObject *commit_bytes_key(Core *c, long kind, PyObject *key, PyObject *value, int for_async);

static PyObject *commit_one(Core *c, long kind, PyObject *key, PyObject *value, int for_async) {
    if (!PyUnicode_CheckExact(key)) return commit_bytes_key(c, kind, key, value, for_async);
    /* A str key is stored as its UTF-8 bytes, as wal/store/store.py's _key does. */
    PyObject *utf8 = PyUnicode_AsUTF8String(key);
    if (utf8 == NULL) {
        PyErr_Clear(); /* e.g. a lone surrogate: the Python path reports it */
        return PyLong_FromLong(0);
    }
    PyObject *r = commit_bytes_key(c, kind, utf8, value, for_async);
    Py_DECREF(utf8);
    return r;
}

static PyObject *core_commit(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "commit takes (kind, key, value, for_async)");
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    int for_async = PyObject_IsTrue(args[3]);
    if ((kind == -1 && PyErr_Occurred()) || for_async < 0) return NULL;
    return commit_one(c, kind, args[1], args[2], for_async);
}

/* commit_bytes_key, or with `open_rec` (a put at `sync`; native/commit.c, "Records finished
 * later") the put's record appended with the value's bytes from `fill_from` on still to come:
 * then the LSN is returned at once, without waiting, and the caller must finish the record
 * (g_log.finish) before it waits for the level. */
static PyObject *commit_put_or_open(Core *c, long kind, PyObject *key, PyObject *value, int for_async,
                                    wal_unfinished *open_rec, size_t fill_from, ov_version **open_version);

static PyObject *commit_bytes_key(Core *c, long kind, PyObject *key, PyObject *value, int for_async) {
    return commit_put_or_open(c, kind, key, value, for_async, NULL, 0, NULL);
}

static PyObject *commit_put_or_open(Core *c, long kind, PyObject *key, PyObject *value, int for_async,
                                    wal_unfinished *open_rec, size_t fill_from, ov_version **open_version) {
    wal_log *handle = c->handle;
    if (handle == NULL || !PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) == 0 ||
        PyBytes_GET_SIZE(key) > MAX_KEY_BYTES || (Py_ssize_t)c->len > c->max_unapplied)
        return PyLong_FromLong(0);
    Py_ssize_t vlen = 0;
    if (kind == OP_PUT) {
        if (!PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > WAL_MAX_PAYLOAD_BYTES - 4096)
            return PyLong_FromLong(0);
        vlen = PyBytes_GET_SIZE(value);
    } else if (kind != OP_DELETE || value != Py_None) {
        return PyLong_FromLong(0);
    }
    if (!commitlock_try(c->lock)) return PyLong_FromLong(0); /* a Python-path commit or the materializer */
    overlay_prefetch(&c->ov, key); /* in flight while the record is made and appended */

    Py_ssize_t klen = PyBytes_GET_SIZE(key);
    size_t n = TXN_HEAD_BYTES + op_bytes(klen, vlen, (int)kind);
    char small[1024];
    char *buf = n <= sizeof small ? small : PyMem_Malloc(n);
    if (buf == NULL) {
        commitlock_release(c->lock);
        return PyErr_NoMemory();
    }
    write_op(write_head(buf, 0, now_ms(), 1), (int)kind, PyBytes_AS_STRING(key), klen,
             kind == OP_PUT ? PyBytes_AS_STRING(value) : NULL, vlen);
    int64_t lsn = open_rec ? g_log.append_unfinished(handle, buf, n, n - (size_t)vlen + fill_from, c->level, open_rec)
                           : g_log.append(handle, buf, n, c->level, for_async ? WAL_WAIT_NONE : WAL_WAIT_TRY);
    if (buf != small) PyMem_Free(buf);
    if (lsn < 0) { /* back-pressure or a stopped log: the Python path waits or reports it */
        commitlock_release(c->lock);
        return PyLong_FromLong(0);
    }
    /* Visible to validation now, and to reads once acknowledged (wal/store/store.py, _lookup). From
     * here on the commit is in the log: a failure below is a bug or out-of-memory, reported as
     * an exception after the lock is released. */
    PyObject *stored = kind == OP_PUT ? value : NULL;
    /* Queued first: it gives the slot's prefetch (above) more time to arrive. */
    int failed = q_push(c, (uint64_t)lsn, (int)kind, key, stored, NULL) < 0 ||
                 overlay_add(&c->ov, key, (uint64_t)lsn, stored, open_rec ? open_version : NULL) < 0;
    c->bytes_since_checkpoint += (long long)n;
    /* An open record's caller wakes the materializer once it has finished it: the wake runs
     * Python (Event.set), where a signal handler or a finalizer could read or sync the store,
     * and wait on this thread's own open record for good. */
    if (!failed && open_rec == NULL) failed = core_maybe_wake(c) < 0;
    commitlock_release(c->lock);
    if (failed) return NULL;
    if (for_async || open_rec || c->level == WAL_LEVEL_BUFFERED) return PyLong_FromLongLong(lsn);
    int rc = log_wait_level(&g_log, handle, (uint64_t)lsn, c->level);
    return PyLong_FromLongLong(rc < 0 ? rc : lsn);
}

/* Enter each op of a Python-path transaction into the overlay at `lsn`, in op order (a later
 * op of the same key becomes its newer version). The ops are all checked first, so a
 * malformed one leaves the overlay unchanged. */
static int overlay_enter_txn(Core *c, uint64_t lsn, PyObject *ops) {
    int kind;
    PyObject *key, *val;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ops);
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_op(PySequence_Fast_GET_ITEM(ops, i), &kind, &key, &val) < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        (void)parse_op(PySequence_Fast_GET_ITEM(ops, i), &kind, &key, &val);
        PyObject *k = exact_bytes(key, "a key");
        PyObject *v = kind == OP_PUT && k != NULL ? exact_bytes(val, "a value") : NULL;
        int rc = k == NULL || (kind == OP_PUT && v == NULL) ? -1 : overlay_add(&c->ov, k, lsn, v, NULL);
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) return -1;
    }
    return 0;
}

/* enqueue_txn(lsn, txn, payload_bytes): a commit made on the Python path (the caller holds the
 * commit lock): enter its ops into the overlay, queue it for the materializer, count its log
 * bytes toward the next checkpoint and wake the materializer by the same rule as the C path. */
static PyObject *core_enqueue_txn(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "enqueue_txn takes (lsn, txn, payload_bytes)");
        return NULL;
    }
    uint64_t lsn = PyLong_AsUnsignedLongLong(args[0]);
    long long payload_bytes = PyLong_AsLongLong(args[2]);
    if ((lsn == (uint64_t)-1 || payload_bytes == -1) && PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 3) {
        PyErr_SetString(PyExc_TypeError, "enqueue_txn: txn must be a wal.log.record.Txn");
        return NULL;
    }
    PyObject *ops = PySequence_Fast(PyTuple_GET_ITEM(args[1], 0), "a Txn's ops must be a sequence");
    if (ops == NULL) return NULL;
    int rc = overlay_enter_txn(c, lsn, ops);
    Py_DECREF(ops);
    if (rc < 0 || q_push(c, lsn, 0, NULL, NULL, args[1]) < 0) return NULL;
    c->bytes_since_checkpoint += payload_bytes;
    if (core_maybe_wake(c) < 0) return NULL;
    Py_RETURN_NONE;
}

/* Add a queued transaction's ops and idempotency key to the batch (borrowing its objects). */
static int flat_add_txn(flat_batch *b, uint64_t lsn, PyObject *txn) {
    PyObject *ops = PySequence_Fast(PyTuple_GET_ITEM(txn, 0), "a Txn's ops must be a sequence");
    if (ops == NULL) return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(ops) && rc == 0; i++) {
        int kind;
        PyObject *key, *val;
        rc = parse_op(PySequence_Fast_GET_ITEM(ops, i), &kind, &key, &val);
        if (rc == 0) {
            /* flat_collapse hashes keys as exact bytes: a subclass's key is copied (and owned). */
            int owns = !PyBytes_CheckExact(key);
            if (owns && (key = exact_bytes(key, "a key")) == NULL) {
                rc = -1;
                break;
            }
            flat_op f = {lsn, kind, owns, key, kind == OP_PUT ? PyBytes_AS_STRING(val) : NULL,
                         kind == OP_PUT ? PyBytes_GET_SIZE(val) : 0};
            rc = flat_push(b, &f);
            if (rc < 0 && owns) Py_DECREF(key);
        }
    }
    Py_DECREF(ops);
    PyObject *idem = PyTuple_GET_ITEM(txn, 2);
    if (rc == 0 && idem != Py_None) {
        uint64_t time_ms = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(txn, 1));
        if (time_ms == (uint64_t)-1 && PyErr_Occurred()) return -1;
        rc = flat_idem(b, idem, lsn, time_ms);
    }
    return rc;
}

/* take(durable_lsn, limit) -> (first, last, commits, puts, deletes, idem) | None
 * Removes up to `limit` queued commits with LSN <= durable_lsn, oldest first, and returns
 * them collapsed (see flat_collapse). The caller holds the commit lock. */
static PyObject *core_take(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "take takes (durable_lsn, limit)");
        return NULL;
    }
    uint64_t durable = PyLong_AsUnsignedLongLong(args[0]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if ((durable == (uint64_t)-1 || limit == -1) && PyErr_Occurred()) return NULL;
    /* Each materializer pass, busy or idle, lets a table that stays sparse shrink: prunes
     * empty it, and an idle store's passes find nothing to prune. */
    overlay_compact(&c->ov);
    size_t n = 0;
    while (n < c->len && (Py_ssize_t)n < limit && c->q[(c->head + n) % c->cap].lsn <= durable) n++;
    if (n == 0) Py_RETURN_NONE;
    qentry *taken = PyMem_Malloc(n * sizeof *taken);
    if (taken == NULL) return PyErr_NoMemory();
    for (size_t i = 0; i < n; i++) taken[i] = c->q[(c->head + i) % c->cap];
    c->head = (c->head + n) % c->cap;
    c->len -= n;
    /* The entries are out of the queue: whatever happens below, they are released here, and
     * an error fails the store (wal/store/store.py), whose reopen replays them from the log. */
    flat_batch b;
    PyObject *result = NULL;
    if (flat_init(&b) == 0) {
        int rc = 0;
        for (size_t i = 0; i < n && rc == 0; i++) {
            qentry *e = &taken[i];
            flat_commit(&b, e->lsn);
            if (e->kind == 0) {
                rc = flat_add_txn(&b, e->lsn, e->txn);
            } else {
                flat_op f = {e->lsn, e->kind, 0, e->key, e->value ? PyBytes_AS_STRING(e->value) : NULL,
                             e->value ? PyBytes_GET_SIZE(e->value) : 0};
                rc = flat_push(&b, &f);
            }
        }
        if (rc == 0) result = flat_collapse(&b);
        flat_free(&b);
    }
    for (size_t i = 0; i < n; i++) q_clear_entry(&taken[i]);
    PyMem_Free(taken);
    return result;
}

/* How far ahead prune's pipeline runs: each key's slot is fetched 2 * PRUNE_AHEAD keys before
 * its turn and its newest version PRUNE_AHEAD keys before. A batch's keys lie at random in a
 * table larger than the cache: this way their cache misses overlap instead of each being
 * waited for in turn. */
#define PRUNE_AHEAD 8

/* prune(applied_lsn, puts, deletes): after a batch from `take` is in LMDB, drop its keys'
 * applied versions from the overlay. The caller holds the commit lock. The keys are the
 * queue's own objects, their hashes cached. */
static PyObject *core_prune(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "prune takes (applied_lsn, puts: list, deletes: list)");
        return NULL;
    }
    uint64_t applied = PyLong_AsUnsignedLongLong(args[0]);
    if (applied == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    PyObject *puts = args[1], *dels = args[2];
    Py_ssize_t n_puts = PyList_GET_SIZE(puts), n = n_puts + PyList_GET_SIZE(dels), got = 0;
    PyObject **keys = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *keys); /* exact bytes, new references */
    if (keys == NULL) return PyErr_NoMemory();
    for (; got < n; got++) {
        PyObject *item = got < n_puts ? PyList_GET_ITEM(puts, got) : PyList_GET_ITEM(dels, got - n_puts);
        if (got < n_puts) {
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
                PyErr_SetString(PyExc_TypeError, "prune: puts must be take()'s (key, stored) pairs");
                break;
            }
            item = PyTuple_GET_ITEM(item, 0);
        }
        if ((keys[got] = exact_bytes(item, "a pruned key")) == NULL) break;
    }
    if (got == n) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + 2 * PRUNE_AHEAD < n) overlay_prefetch(&c->ov, keys[i + 2 * PRUNE_AHEAD]);
            if (i + PRUNE_AHEAD < n) overlay_prefetch_version(&c->ov, keys[i + PRUNE_AHEAD]);
            overlay_prune(&c->ov, keys[i], applied);
        }
    }
    for (Py_ssize_t i = 0; i < got; i++) Py_DECREF(keys[i]);
    PyMem_Free(keys);
    if (got < n) return NULL;
    Py_RETURN_NONE;
}

/* The `limit` argument of the overlay reads: None (the newest version) or an LSN. */
static int parse_limit(PyObject *arg, uint64_t *limit) {
    if (arg == Py_None) {
        *limit = UINT64_MAX;
        return 0;
    }
    *limit = PyLong_AsUnsignedLongLong(arg);
    return *limit == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *version_tuple(const ov_version *v);

/* overlay_get(key, limit) -> (lsn, value | None) | None: the key's newest overlay version with
 * lsn <= limit (None: the newest). The caller reads its watermark (`limit`) before this. */
static PyObject *core_overlay_get(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t limit;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "overlay_get takes (key, limit)");
        return NULL;
    }
    if (parse_limit(args[1], &limit) < 0) return NULL;
    PyObject *key = exact_bytes(args[0], "a key");
    if (key == NULL) return NULL;
    const ov_version *v = overlay_find(&c->ov, key, limit);
    Py_DECREF(key);
    return version_tuple(v);
}

/* (lsn, value | None) of version `v`, or None for NULL. */
static PyObject *version_tuple(const ov_version *v) {
    if (v == NULL) Py_RETURN_NONE;
    /* Copied out before making objects (which may let another thread prune the version). */
    PyObject *value = Py_NewRef(v->value != NULL ? v->value : Py_None);
    PyObject *lsn = PyLong_FromUnsignedLongLong(v->lsn);
    PyObject *result = lsn != NULL ? PyTuple_New(2) : NULL;
    if (result == NULL) {
        Py_XDECREF(lsn);
        Py_DECREF(value);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, lsn);
    PyTuple_SET_ITEM(result, 1, value);
    return result;
}

/* overlay_newest(key) -> (lsn, value | None) | None: the key's newest overlay version, acknowledged
 * or not, with its value whole. A sealed put at `sync` enters its envelope before encrypting
 * into it, with the GIL released (commit_put_or_open with an open record; ov_version.state).
 * Such a version is waited for: first spinning, the GIL held (so it cannot be pruned), for
 * up to READ_SPIN_NS -- the AES of one value, which runs now -- then, if its writer was
 * preempted, with the GIL released until its commit is durable (it cannot be durable
 * unwritten; at most one fdatasync away), and looked up again, at most up to its LSN: the
 * overlay may have changed meanwhile (a newer version, or this one applied and pruned: then
 * None, and LMDB holds it or a newer one). A version whose bytes will never be made (its seal
 * failed; the log fails) is passed over, as is one whose log fails or closes before it is
 * durable: it will never be acknowledged. Reads up to an acknowledged LSN (overlay_get,
 * read_key) never meet one being written: at `sync` nothing above durable is acknowledged. */
#define READ_SPIN_NS 50000

static PyObject *core_overlay_newest(Core *c, PyObject *arg) {
    PyObject *key = exact_bytes(arg, "a key");
    if (key == NULL) return NULL;
    const ov_version *v = overlay_find(&c->ov, key, UINT64_MAX);
    int state = v != NULL ? __atomic_load_n(&v->state, __ATOMIC_ACQUIRE) : OV_WHOLE;
    if (state == OV_BEING_WRITTEN) {
        uint64_t until = now_ns() + READ_SPIN_NS;
        do {
            cpu_relax();
            state = __atomic_load_n(&v->state, __ATOMIC_ACQUIRE);
        } while (state == OV_BEING_WRITTEN && now_ns() < until);
    }
    if (state == OV_NEVER) {
        v = overlay_find(&c->ov, key, v->lsn - 1);
    } else if (state == OV_BEING_WRITTEN && c->marks != NULL) {
        uint64_t lsn = v->lsn, marks[3]; /* appended, written, durable (here, not the archive's) */
        wal_log *handle = c->marks;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = g_log.wait(handle, lsn, WAL_LEVEL_SYNC);
        Py_END_ALLOW_THREADS
        if (rc < 0 && g_watermarks != NULL) (void)g_watermarks(c->marks, marks);
        v = overlay_find(&c->ov, key, rc < 0 ? (g_watermarks != NULL ? marks[2] : lsn - 1) : lsn);
    }
    Py_DECREF(key);
    return version_tuple(v);
}

/* overlay_scan(prefix, limit) -> [(key, lsn, value | None)]: each overlay key starting with
 * prefix with its newest version with lsn <= limit (keys with none are left out), unsorted. */
static PyObject *core_overlay_scan(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t limit;
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "overlay_scan takes (prefix: bytes, limit)");
        return NULL;
    }
    if (parse_limit(args[1], &limit) < 0) return NULL;
    return overlay_scan(&c->ov, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), limit);
}

/* visible_lsn() -> the highest LSN acknowledged at the store's level: durable (sync), written
 * (interval) or appended (buffered). From the log's handle, which lives as long as the wal.Log
 * this Core holds, so it answers after close or a failure too (reads keep working). */
static PyObject *core_visible_lsn(Core *c, PyObject *unused) {
    (void)unused;
    if (c->marks == NULL || g_watermarks == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "visible_lsn: no log (a read-only store), or bind_watermarks() not called");
        return NULL;
    }
    uint64_t marks[3]; /* appended, written, durable */
    (void)(c->marks_fn ? c->marks_fn : g_watermarks)(c->marks, marks); /* a failed log's marks still stand */
    int at = c->level == WAL_LEVEL_SYNC ? 2 : c->level == WAL_LEVEL_INTERVAL ? 1 : 0;
    return PyLong_FromUnsignedLongLong(marks[at]);
}

/* acknowledge_archived(address): the store acknowledges at `replicated`; its reads' V is then no
 * higher than the archive's watermark, from `address` (the cffi module's
 * wal_log_watermarks_archived): a commit durable here but not yet held by the object store is
 * not acknowledged, and no other thread reads it (machine loss would take it back). */
static PyObject *core_acknowledge_archived(Core *c, PyObject *address) {
    unsigned long long p = PyLong_AsUnsignedLongLong(address);
    if (p == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    c->marks_fn = (int (*)(wal_log *, uint64_t *))(uintptr_t)p;
    Py_RETURN_NONE;
}

/* ---- Reads: a get, a batch of gets, the start of a scan, a snapshot, each in one call ----
 *
 * What a read sees (wal/store/store.py, "Reads"): for each key, its newest version with LSN <= V,
 * where V is the store's visible LSN (durable at sync, written at interval, appended at
 * buffered), taken from the overlay if it holds one, else from LMDB. Each function here does
 * the whole read holding the GIL, which every overlay change (commit, prune) also needs, so
 * the overlay cannot change under it; and it begins its LMDB read transaction BEFORE it reads
 * V: the materializer applies only durable commits, durable <= V, so the transaction holds no
 * commit above V, and a version pruned from the overlay (only once LMDB holds it) is in any
 * transaction begun after the prune. Overlay and transaction together then hold, for every
 * key, its newest version <= V; where both hold one the newer wins.
 *
 * LMDB is reached through the capsule of wal._lmdbcall (native/lmdbapi.h). An LMDB error
 * (damage, a closed environment) is not raised from here: the fast paths answer "take the
 * Python path", which reads again and raises the error classified (wal/store/state.py). */

static const wal_lmdb_capi *g_lmdb; /* set by bind_lmdb() */

/* V for a read, with an overlay to consult; UINT64_MAX (and no overlay look) for a read-only
 * store, which has neither log nor overlay. */
static uint64_t read_limit(Core *c) {
    if (c->marks == NULL || g_watermarks == NULL) return UINT64_MAX;
    uint64_t marks[3]; /* appended, written, durable */
    (void)(c->marks_fn ? c->marks_fn : g_watermarks)(c->marks, marks);
    return marks[c->level == WAL_LEVEL_SYNC ? 2 : c->level == WAL_LEVEL_INTERVAL ? 1 : 0];
}

/* The value of `key` (exact bytes) as of V in `txn` (begun before V was read): 1 with *value
 * (a new reference; Py_None for a key deleted in the overlay), 0 absent, -1 error set. */
static int read_key(Core *c, void *txn, uint64_t limit, PyObject *key, uint64_t *version, PyObject **value) {
    if (c->ov.used != 0) {
        const ov_version *v = overlay_find(&c->ov, key, limit);
        if (v != NULL) {
            *version = v->lsn;
            *value = Py_NewRef(v->value != NULL ? v->value : Py_None);
            return 1;
        }
    }
    return g_lmdb->get(c->env, txn, key, version, value);
}

/* Whether reads may take the C path: the store is open in this process and bound to its state. */
static int reads_on(Core *c) { return c->env != NULL && !c->reads_off && g_lmdb != NULL; }

/* A key as exact bytes of 1..MAX_KEY_BYTES (a new reference), from bytes or str; NULL without
 * an error set when it is anything else (the Python path then explains what is wrong). */
static PyObject *plain_key(PyObject *key) {
    PyObject *out;
    if (PyBytes_CheckExact(key)) {
        out = Py_NewRef(key);
    } else if (PyUnicode_CheckExact(key)) {
        out = PyUnicode_AsUTF8String(key);
        if (out == NULL) {
            PyErr_Clear();
            return NULL;
        }
    } else {
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(out);
    if (n < 1 || n > MAX_KEY_BYTES) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* get(key, default) for FastGet: the value, `dflt`, or NULL with NO error set (take the Python
 * path), or NULL with an error set (out of memory). */
static PyObject *core_fast_get(Core *c, PyObject *key_arg, PyObject *dflt, int want_version) {
    if (!reads_on(c)) return NULL;
    PyObject *key = plain_key(key_arg);
    if (key == NULL) return NULL;
    void *txn = NULL;
    if (g_lmdb->read_begin(c->env, &txn) < 0) {
        Py_DECREF(key);
        PyErr_Clear();
        return NULL;
    }
    uint64_t version = 0;
    PyObject *value = NULL;
    int found = read_key(c, txn, read_limit(c), key, &version, &value);
    g_lmdb->read_end(c->env, txn);
    Py_DECREF(key);
    if (found < 0) {
        PyErr_Clear();
        return NULL;
    }
    if (found == 0 || value == Py_None) {
        Py_XDECREF(value);
        return Py_NewRef(dflt);
    }
    if (want_version) {
        Py_DECREF(value);
        return PyLong_FromUnsignedLongLong(version);
    }
    return value;
}

/* The values of `keys` (a list or tuple) as of ONE V, read in ONE LMDB transaction, so they are
 * of one instant; `dflt` for absent ones. NULL with NO error set when the C path declines (a
 * key not exact bytes of 1..MAX_KEY_BYTES, the store closed or not bound, an LMDB error to
 * classify): the caller reads again on the Python path, which explains or raises. NULL with an
 * error set: out of memory. */
static PyObject *read_many(Core *c, PyObject *keys, PyObject *dflt) {
    if (!(PyList_CheckExact(keys) || PyTuple_CheckExact(keys)) || !reads_on(c)) return NULL;
    /* A list's items are read through its item array without a copy. Only the list's own
     * allocation can run Python code (a garbage collection's finalizers), so the array and
     * the size are taken after it: from there on nothing but bytes and memcmp runs. */
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    PyObject *const *items = PySequence_Fast_ITEMS(keys);
    int plain = PySequence_Fast_GET_SIZE(keys) == n;
    for (Py_ssize_t i = 0; plain && i < n; i++)
        plain = PyBytes_CheckExact(items[i]) && PyBytes_GET_SIZE(items[i]) >= 1 &&
                PyBytes_GET_SIZE(items[i]) <= MAX_KEY_BYTES;
    if (!plain) {
        Py_DECREF(out);
        return NULL;
    }
    void *txn = NULL;
    if (g_lmdb->read_begin(c->env, &txn) < 0) {
        Py_DECREF(out);
        PyErr_Clear();
        return NULL;
    }
    uint64_t limit = read_limit(c);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t version;
        PyObject *value = NULL;
        int found = read_key(c, txn, limit, items[i], &version, &value);
        if (found < 0) {
            g_lmdb->read_end(c->env, txn);
            Py_DECREF(out);
            PyErr_Clear();
            return NULL;
        }
        if (found == 0 || value == Py_None) {
            Py_XDECREF(value);
            value = Py_NewRef(dflt);
        }
        PyList_SET_ITEM(out, i, value);
    }
    g_lmdb->read_end(c->env, txn);
    return out;
}

/* get_many(keys, default) -> [value | default] of one instant, or None when the C path
 * declines (read_many): the caller reads again on the Python path. */
static PyObject *core_get_many(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "get_many takes (keys, default)");
        return NULL;
    }
    PyObject *out = read_many(c, args[0], args[1]);
    if (out == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* scan_begin(prefix, limit) -> (first, rest, overlay) | None, the start of a consistent scan:
 *   first: up to `limit` LMDB entries with `prefix` in key order, as (key, value) when overlay
 *          is None, else as (key, version, value);
 *   rest: None if `first` holds every LMDB entry with the prefix, else the read transaction as
 *         a wal._lmdbcall.Snapshot to go on from (the same instant);
 *   overlay: None if the overlay holds no version <= V of a key with the prefix, else its
 *            [(key, lsn, value | None)] (unsorted), to merge.
 * None: take the Python path (an error, read again there). */
static PyObject *core_scan_begin(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "scan_begin takes (prefix: bytes, limit: int)");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (!reads_on(c)) Py_RETURN_NONE;
    void *txn = NULL;
    if (g_lmdb->read_begin(c->env, &txn) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *over = NULL;
    if (c->ov.used != 0) {
        over = overlay_scan(&c->ov, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), read_limit(c));
        if (over == NULL) {
            g_lmdb->read_end(c->env, txn);
            return NULL;
        }
        if (PyList_GET_SIZE(over) == 0) Py_CLEAR(over);
    }
    PyObject *first = g_lmdb->scan(c->env, txn, args[0], NULL, limit, over != NULL);
    if (first == NULL) {
        g_lmdb->read_end(c->env, txn);
        Py_XDECREF(over);
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *rest;
    if (PyList_GET_SIZE(first) < limit) {
        g_lmdb->read_end(c->env, txn);
        rest = Py_NewRef(Py_None);
    } else {
        rest = g_lmdb->adopt(c->env, txn);
        if (rest == NULL) {
            Py_DECREF(first);
            Py_XDECREF(over);
            return NULL;
        }
    }
    return Py_BuildValue("(NNN)", first, rest, over != NULL ? over : Py_NewRef(Py_None));
}

/* snapshot() -> (txn, lsn, overlay) | None: a read transaction (a wal._lmdbcall.Snapshot), the
 * V it goes with (for a read-only store: None, the transaction's applied LSN stands), and
 * every overlay key's newest version <= V as [(key, lsn, value | None)]. Together: the store as
 * of V, for as long as the transaction is kept. None: take the Python path. */
static PyObject *core_snapshot(Core *c, PyObject *unused) {
    (void)unused;
    if (!reads_on(c)) Py_RETURN_NONE;
    void *txn = NULL;
    if (g_lmdb->read_begin(c->env, &txn) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    uint64_t limit = read_limit(c);
    PyObject *over = c->ov.used != 0 ? overlay_scan(&c->ov, "", 0, limit) : PyList_New(0);
    if (over == NULL) {
        g_lmdb->read_end(c->env, txn);
        return NULL;
    }
    PyObject *snap = g_lmdb->adopt(c->env, txn);
    if (snap == NULL) {
        Py_DECREF(over);
        return NULL;
    }
    PyObject *lsn = limit == UINT64_MAX ? Py_NewRef(Py_None) : PyLong_FromUnsignedLongLong(limit);
    return Py_BuildValue("(NNN)", snap, lsn, over);
}

/* bind_state(env): the store's LMDB environment (a wal._lmdbcall.Env) for the reads above. */
static PyObject *core_bind_state(Core *c, PyObject *env) {
    if (g_lmdb == NULL || !g_lmdb->is_env(env)) {
        PyErr_SetString(PyExc_TypeError, "bind_state takes a wal._lmdbcall.Env (after bind_lmdb())");
        return NULL;
    }
    Py_XSETREF(c->env, Py_NewRef(env));
    Py_RETURN_NONE;
}

/* close_reads(): reads take the Python path from now on (which refuses them once the store is
 * closed, or in a forked child). */
static PyObject *core_close_reads(Core *c, PyObject *unused) {
    (void)unused;
    c->reads_off = 1;
    Py_RETURN_NONE;
}

static PyObject *core_get_overlay_keys(Core *c, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(c->ov.used);
}

static PyObject *core_disable(Core *c, PyObject *unused) {
    (void)unused;
    c->handle = NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t core_len(Core *c) { return (Py_ssize_t)c->len; }

static int core_init(Core *c, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"log", "handle_address", "lock", "wake", "level", "max_unapplied", "checkpoint_bytes",
                             NULL};
    PyObject *log, *address, *lock, *wake;
    int level;
    Py_ssize_t max_unapplied;
    long long checkpoint_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!OinL", kwlist, &log, &address, &CommitLockType, &lock, &wake,
                                     &level, &max_unapplied, &checkpoint_bytes))
        return -1;
    if (g_log.append == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "wal._storecore.Core before bind()");
        return -1;
    }
    void *handle = PyLong_AsVoidPtr(address);
    if (handle == NULL && PyErr_Occurred()) return -1;
    PyObject *wake_set = PyObject_GetAttrString(wake, "set");
    PyObject *wake_is_set = PyObject_GetAttrString(wake, "is_set");
    if (!wake_set || !wake_is_set) {
        Py_XDECREF(wake_set);
        Py_XDECREF(wake_is_set);
        return -1;
    }
    Py_XSETREF(c->wake_set, wake_set);
    Py_XSETREF(c->wake_is_set, wake_is_set);
    Py_XSETREF(c->lock, (CommitLock *)Py_NewRef(lock));
    Py_XSETREF(c->log, Py_NewRef(log));
    c->handle = c->marks = handle;
    c->level = level;
    c->max_unapplied = max_unapplied;
    c->checkpoint_bytes = checkpoint_bytes;
    return 0;
}

/* Core is not tracked by the cyclic GC: what it holds -- the log, the lock, the Event's
 * methods, queued bytes and transactions, the overlay's bytes -- never refers back to it, so
 * it is never part of a cycle; and a full collection need not walk a queue of ~200,000
 * commits (nor the GC count the objects it frees). */
static void core_dealloc(Core *c) {
    c->handle = NULL;
    for (size_t i = 0; i < c->len; i++) q_clear_entry(&c->q[(c->head + i) % c->cap]);
    PyMem_Free(c->q);
    overlay_free(&c->ov);
    Py_XDECREF(c->log);
    Py_XDECREF(c->env);
    Py_XDECREF(c->lock);
    Py_XDECREF(c->wake_set);
    Py_XDECREF(c->wake_is_set);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyMethodDef core_methods[] = {
    {"commit", (PyCFunction)(void (*)(void))core_commit, METH_FASTCALL,
     "commit(kind, key, value, for_async) -> LSN, 0 (take the Python path) or a WAL_E* code from the wait."},
    {"enqueue_txn", (PyCFunction)(void (*)(void))core_enqueue_txn, METH_FASTCALL,
     "enqueue_txn(lsn, txn, payload_bytes): queue a Python-path commit for the materializer (commit lock held)."},
    {"take", (PyCFunction)(void (*)(void))core_take, METH_FASTCALL,
     "take(durable_lsn, limit) -> (first, last, commits, puts, deletes, idem) or None (commit lock held)."},
    {"prune", (PyCFunction)(void (*)(void))core_prune, METH_FASTCALL,
     "prune(applied_lsn, puts, deletes): drop applied versions of those keys from the overlay (lock held)."},
    {"acknowledge_archived", (PyCFunction)core_acknowledge_archived, METH_O,
     "acknowledge_archived(address): reads see only what the object archive holds (a replicated store)."},
    {"visible_lsn", (PyCFunction)core_visible_lsn, METH_NOARGS,
     "visible_lsn() -> the highest LSN acknowledged at the store's level (durable, written or appended)."},
    {"overlay_get", (PyCFunction)(void (*)(void))core_overlay_get, METH_FASTCALL,
     "overlay_get(key, limit) -> (lsn, value | None) | None: the newest version with lsn <= limit (None: any)."},
    {"overlay_newest", (PyCFunction)core_overlay_newest, METH_O,
     "overlay_newest(key) -> (lsn, value | None) | None: the newest version, acknowledged or not, its value whole "
     "(one still being sealed is waited for)."},
    {"overlay_scan", (PyCFunction)(void (*)(void))core_overlay_scan, METH_FASTCALL,
     "overlay_scan(prefix, limit) -> [(key, lsn, value | None)]: keys with prefix, newest version <= limit."},
    {"get_many", (PyCFunction)(void (*)(void))core_get_many, METH_FASTCALL,
     "get_many(keys, default) -> [value | default] of one instant, or None: take the Python path."},
    {"scan_begin", (PyCFunction)(void (*)(void))core_scan_begin, METH_FASTCALL,
     "scan_begin(prefix, limit) -> (first, rest, overlay) | None: the start of a consistent scan."},
    {"snapshot", (PyCFunction)core_snapshot, METH_NOARGS,
     "snapshot() -> (txn, lsn | None, overlay) | None: the store as of one visible LSN."},
    {"bind_state", (PyCFunction)core_bind_state, METH_O, "bind_state(env): the LMDB environment reads use."},
    {"close_reads", (PyCFunction)core_close_reads, METH_NOARGS, "close_reads(): reads take the Python path."},
    {"disable", (PyCFunction)core_disable, METH_NOARGS,
     "Turn the fast path off for good (close, failure, fork): commit returns 0 from now on."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef core_members[] = {
    {"bytes_since_checkpoint", T_LONGLONG, offsetof(Core, bytes_since_checkpoint), 0,
     "Log bytes committed since the last checkpoint (the store resets it)."},
    {"idle", T_BOOL, offsetof(Core, idle), 0,
     "Set by an idle materializer before a long sleep; the next queued commit clears it and wakes it."},
    {"max_unapplied", T_PYSSIZET, offsetof(Core, max_unapplied), 0,
     "Queued commits above which the C path declines (the store lowers it to bound the log and state)."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef core_getset[] = {
    {"overlay_keys", (getter)core_get_overlay_keys, NULL, "Keys with versions not yet applied to LMDB.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods core_as_sequence = {.sq_length = (lenfunc)core_len};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wal._storecore.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The store's commit path, overlay and apply queue in C (see native/storecore.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)core_init,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_methods = core_methods,
    .tp_members = core_members,
    .tp_getset = core_getset,
    .tp_as_sequence = &core_as_sequence,
};

/* ---- Store.put and Store.delete without a Python frame ------------------------------------------
 *
 * A FastCommit wraps one of wal/store/store.py's Store.put / Store.delete and takes its place on the
 * class (see the end of that file). Called as store.put(key, value) or store.delete(key) --
 * positional arguments, the store's own level -- it makes Core.commit's one-op commit
 * straight away, without the ~0.1-0.2 us of entering the Python function (a third of a put
 * at `buffered`). Every other case goes to the wrapped function, unchanged:
 *  - any other call form (a keyword such as durability=, a wrong argument count): the
 *    function itself, so it also reports bad arguments;
 *  - Core.commit answering 0 (nothing was done: busy lock, back-pressure, a key or value
 *    that is not plain bytes, a closed, failed or read-only store): the function, which
 *    tries again and then takes the Python path;
 *  - a negative answer (the commit is in the log, waiting for its level failed): not the
 *    function, which would try to commit again, but store._fast_wait_failed(), which raises
 *    the log's own failure (a log that failed or closed refuses every later append anyway).
 * Py_TPFLAGS_METHOD_DESCRIPTOR lets `store.put(...)` call it with the store prepended,
 * without making a bound method, as CPython does for functions.
 *
 * The sealed put. `FastCommit(sealed_put, OP_PUT, Store.put, CONTEXT_VALUE)` is a sealed
 * store's put (wal/store/sealed.py) over the plain Store: called as store.put(key, value), it
 * seals the value in C through the store's sealing session (store._sealer._session, a
 * SealSession: native/sealcore.h) -- associated data CONTEXT_VALUE + key, as
 * wal/crypto/sealing.py's Sealer.seal would -- and commits the envelope as Core.commit does,
 * all in this one call with the GIL held. Anything else goes to the wrapped Python put,
 * which seals in Python: another call form, a closed or failed store (it reports that), a
 * key or value that is not plain bytes (or str for the key) within the limits, a value its
 * Sealer would compress, a session that is not a SealSession (libcrypto not loaded, no
 * encryption) or is used up (its limit, a fork: the Python put starts a new one). When
 * Core.commit declines the envelope (busy lock, back-pressure), the envelope goes to
 * `Store.put` (`base`), which waits or takes the Python path: the value is sealed once. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *func;    /* the wrapped Python function */
    long kind;         /* OP_PUT or OP_DELETE */
    PyObject *base;    /* a sealed put: the plain Store.put the envelope goes to when Core.commit declines */
    PyObject *context; /* a sealed put: the associated data's context before the key (bytes) */
} FastCommit;

static PyObject *str_core;             /* "_core" */
static PyObject *str_fast_wait_failed; /* "_fast_wait_failed" */
static PyObject *str_sealer;           /* "_sealer" */
static PyObject *str_session;          /* "_session" */

/* The Core of `store` (a new reference), NULL with no error set when it has none, or NULL
 * with an error set. */
static Core *store_core(PyObject *store) {
    PyObject *core = PyObject_GetAttr(store, str_core);
    if (core == NULL) return NULL;
    if (PyObject_TypeCheck(core, &CoreType)) return (Core *)core;
    Py_DECREF(core);
    return NULL;
}

/* After commit_bytes_key's answer `r` (stolen) for an envelope: the LSN, the plain
 * Store.put's answer for the envelope (declined), or the store's failure (waiting failed). */
static PyObject *sealed_commit_done(FastCommit *f, PyObject *store, PyObject *key, PyObject *env, PyObject *r) {
    if (r == NULL) return NULL;
    long long lsn = PyLong_AsLongLong(r);
    if (lsn > 0) return r;
    Py_DECREF(r);
    if (lsn == -1 && PyErr_Occurred()) return NULL;
    if (lsn < 0) return PyObject_CallMethodNoArgs(store, str_fast_wait_failed);
    PyObject *call[3] = {store, key, env};
    return PyObject_Vectorcall(f->base, call, 3, NULL);
}

static PyObject *fast_sealed_put(FastCommit *f, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 3) return PyObject_Vectorcall(f->func, args, nargsf, kwnames);
    PyObject *store = args[0], *value = args[2], *sealer = NULL, *session = NULL, *key = NULL, *env = NULL;
    Core *core = store_core(store);
    if (core == NULL) {
        if (PyErr_Occurred()) return NULL;
        goto python;
    }
    /* A value whose envelope would pass the value limit: the Python put refuses it, naming the
     * value's own size and the limit of a sealed store. */
    wal_log *handle = core->handle;
    if (handle == NULL || !PyBytes_CheckExact(value) ||
        PyBytes_GET_SIZE(value) > WAL_MAX_PAYLOAD_BYTES - 4096 - SEAL_ENVELOPE_OVERHEAD)
        goto python;
    if ((sealer = PyObject_GetAttr(store, str_sealer)) == NULL || (session = PyObject_GetAttr(sealer, str_session)) == NULL)
        goto failed;
    if (!seal_session_takes(session, PyBytes_GET_SIZE(value))) goto python;
    if ((key = plain_key(args[1])) == NULL) goto python; /* the Python put explains what is wrong with it */
    seal_job job;
    Py_ssize_t vlen = PyBytes_GET_SIZE(value);
    env = seal_session_begin(session, 0x80, vlen, &job);
    if (env == NULL) {
        if (PyErr_Occurred()) goto failed;
        goto python; /* used up: the Python put starts a new session */
    }
    const char *body = PyBytes_AS_STRING(value), *ctx1 = PyBytes_AS_STRING(f->context), *ctx2 = PyBytes_AS_STRING(key);
    Py_ssize_t ctx1_len = PyBytes_GET_SIZE(f->context), ctx2_len = PyBytes_GET_SIZE(key);
    /* At `sync` the record goes into the log before its value is encrypted, and the AES runs
     * once the GIL is let go to wait for the fdatasync (native/commit.c, "Records finished
     * later"): the seal delays no other committing thread. Whatever happens after the append,
     * the record is finished -- every write of the log waits for it. */
    wal_unfinished rec = {.len = UINT32_MAX}; /* len: still UINT32_MAX unless the append was made */
    int open_path = core->level == WAL_LEVEL_SYNC && g_log.finish != NULL;
    ov_version *entered = NULL; /* its overlay version, while its bytes are written */
    PyObject *r = open_path ? commit_put_or_open(core, OP_PUT, key, env, 0, &rec, SEAL_HEADER_BYTES, &entered) : NULL;
    int ok;
    if (rec.len != UINT32_MAX) {
        long long lsn = r != NULL ? PyLong_AsLongLong(r) : 0;
        char *rest = PyBytes_AS_STRING(env) + SEAL_HEADER_BYTES;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        ok = seal_job_run(&job, body, ctx1, ctx1_len, ctx2, ctx2_len);
        /* Before the finish: until it, the record cannot be durable, so the version is not pruned. */
        if (entered != NULL) overlay_version_written(entered, ok);
        rc = g_log.finish(handle, &rec, rest, ok);
        if (rc == 0 && lsn > 0) rc = g_log.wait(handle, (uint64_t)lsn, WAL_LEVEL_SYNC);
        Py_END_ALLOW_THREADS
        if (r != NULL && lsn > 0) {
            Py_DECREF(r);
            r = PyLong_FromLongLong(rc < 0 ? rc : lsn);
            if (r != NULL && core_maybe_wake(core) < 0) Py_CLEAR(r); /* not before: commit_put_or_open */
        }
    } else { /* sealed now: then committed, or (declined at sync) handed to the Python path */
        ok = seal_job_run_holding_gil(&job, body, ctx1, ctx1_len, ctx2, ctx2_len);
        if (ok && !open_path) r = commit_bytes_key(core, OP_PUT, key, env, 0);
    }
    if (seal_job_end(session, &job, ok) < 0) Py_CLEAR(r);
    if (r != NULL) r = sealed_commit_done(f, store, key, env, r);
    Py_DECREF(env);
    Py_DECREF(key);
    Py_DECREF(session);
    Py_DECREF(sealer);
    Py_DECREF(core);
    return r;
python:
    Py_XDECREF(key);
    Py_XDECREF(session);
    Py_XDECREF(sealer);
    Py_XDECREF(core);
    return PyObject_Vectorcall(f->func, args, nargsf, kwnames);
failed:
    Py_XDECREF(key);
    Py_XDECREF(session);
    Py_XDECREF(sealer);
    Py_XDECREF(core);
    return NULL;
}

static PyObject *fast_commit_call(FastCommit *f, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != (f->kind == OP_PUT ? 3 : 2))
        return PyObject_Vectorcall(f->func, args, nargsf, kwnames);
    PyObject *store = args[0];
    PyObject *core = PyObject_GetAttr(store, str_core);
    if (core == NULL) return NULL;
    if (!PyObject_TypeCheck(core, &CoreType)) {
        Py_DECREF(core);
        return PyObject_Vectorcall(f->func, args, nargsf, kwnames);
    }
    PyObject *r = commit_one((Core *)core, f->kind, args[1], f->kind == OP_PUT ? args[2] : Py_None, 0);
    Py_DECREF(core);
    if (r == NULL) return NULL;
    long long lsn = PyLong_AsLongLong(r);
    if (lsn > 0) return r;
    Py_DECREF(r);
    if (lsn == -1 && PyErr_Occurred()) return NULL;
    if (lsn == 0) return PyObject_Vectorcall(f->func, args, nargsf, kwnames);
    return PyObject_CallMethodNoArgs(store, str_fast_wait_failed);
}

/* A FastCommit or FastRead wrapping `func`, `call` its vectorcall. */
static PyObject *fast_wrapper(PyTypeObject *type, PyObject *func, long kind, vectorcallfunc call) {
    FastCommit *f = (FastCommit *)type->tp_alloc(type, 0);
    if (f == NULL) return NULL;
    f->vectorcall = call;
    f->func = Py_NewRef(func);
    f->kind = kind;
    return (PyObject *)f;
}

static PyObject *fast_commit_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *func, *base = NULL, *context = NULL;
    long kind;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "FastCommit takes (function, kind[, base, context])");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "Ol|OO:FastCommit", &func, &kind, &base, &context)) return NULL;
    if (!PyCallable_Check(func) || (kind != OP_PUT && kind != OP_DELETE)) {
        PyErr_SetString(PyExc_TypeError, "FastCommit takes (a function, OP_PUT or OP_DELETE)");
        return NULL;
    }
    if (base == NULL) return fast_wrapper(type, func, kind, (vectorcallfunc)fast_commit_call);
    if (kind != OP_PUT || !PyCallable_Check(base) || context == NULL || !PyBytes_CheckExact(context)) {
        PyErr_SetString(PyExc_TypeError, "a sealed FastCommit takes (a function, OP_PUT, Store.put, context: bytes)");
        return NULL;
    }
    FastCommit *f = (FastCommit *)fast_wrapper(type, func, kind, (vectorcallfunc)fast_sealed_put);
    if (f != NULL) {
        f->base = Py_NewRef(base);
        f->context = Py_NewRef(context);
    }
    return (PyObject *)f;
}

static int fast_commit_traverse(FastCommit *f, visitproc visit, void *arg) {
    Py_VISIT(f->func);
    Py_VISIT(f->base);
    Py_VISIT(f->context);
    return 0;
}

static int fast_commit_clear(FastCommit *f) {
    Py_CLEAR(f->func);
    Py_CLEAR(f->base);
    Py_CLEAR(f->context);
    return 0;
}

static void fast_commit_dealloc(FastCommit *f) {
    PyObject_GC_UnTrack(f);
    fast_commit_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* store.put as an attribute (not called at once): a bound method, as for a function. */
static PyObject *fast_commit_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* The wrapped function's name, qualified name and docstring; `inspect.signature` follows
 * __wrapped__ to its signature. */
static PyObject *fast_commit_attr(FastCommit *f, void *name) {
    return PyObject_GetAttrString(f->func, (const char *)name);
}

static PyGetSetDef fast_commit_getset[] = {
    {"__name__", (getter)fast_commit_attr, NULL, NULL, "__name__"},
    {"__qualname__", (getter)fast_commit_attr, NULL, NULL, "__qualname__"},
    {"__doc__", (getter)fast_commit_attr, NULL, NULL, "__doc__"},
    {"__module__", (getter)fast_commit_attr, NULL, NULL, "__module__"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef fast_commit_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(FastCommit, func), READONLY, NULL},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(FastCommit, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FastCommitType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wal._storecore.FastCommit",
    .tp_basicsize = sizeof(FastCommit),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Store.put / Store.delete: the one-op commit in C, else the wrapped function (storecore.c).",
    .tp_new = fast_commit_new,
    .tp_dealloc = (destructor)fast_commit_dealloc,
    .tp_traverse = (traverseproc)fast_commit_traverse,
    .tp_clear = (inquiry)fast_commit_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastCommit, vectorcall),
    .tp_descr_get = fast_commit_get,
    .tp_getset = fast_commit_getset,
    .tp_members = fast_commit_members,
};

/* ---- FastRead: Store.get, Store.version and Store.get_many as one C call ----
 *
 * `Store.get = FastRead(Store.get, READ_VALUE)` (wal/store/store.py): a call store.get(key) or
 * store.get(key, default), key bytes or str, reads in C (core_fast_get: the overlay, else
 * LMDB, checksum checked) without entering the Python function; store.get_many(keys[,
 * default]) likewise for a list or tuple of bytes keys (read_many); any other call form, and
 * every read the C path declines (closed or forked store, an odd key, an LMDB error to
 * classify), runs the wrapped function unchanged. Same descriptor protocol as FastCommit. */

#define READ_VALUE 1
#define READ_VERSION 2
#define READ_MANY 3 /* Store.get_many(keys[, default]): read_many */

static PyObject *fast_read_call(FastCommit *f, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 2 || nargs > (f->kind == READ_VERSION ? 2 : 3))
        return PyObject_Vectorcall(f->func, args, nargsf, kwnames);
    PyObject *core = PyObject_GetAttr(args[0], str_core);
    if (core == NULL) return NULL;
    PyObject *r = NULL;
    PyObject *dflt = nargs == 3 ? args[2] : Py_None;
    if (PyObject_TypeCheck(core, &CoreType))
        r = f->kind == READ_MANY ? read_many((Core *)core, args[1], dflt)
                                 : core_fast_get((Core *)core, args[1], dflt, f->kind == READ_VERSION);
    Py_DECREF(core);
    if (r != NULL || PyErr_Occurred()) return r;
    return PyObject_Vectorcall(f->func, args, nargsf, kwnames);
}

static PyObject *fast_read_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *func;
    long kind;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) != 0) || !PyArg_ParseTuple(args, "Ol:FastRead", &func, &kind))
        return NULL;
    if (!PyCallable_Check(func) || (kind != READ_VALUE && kind != READ_VERSION && kind != READ_MANY)) {
        PyErr_SetString(PyExc_TypeError, "FastRead takes (a function, READ_VALUE, READ_VERSION or READ_MANY)");
        return NULL;
    }
    return fast_wrapper(type, func, kind, (vectorcallfunc)fast_read_call);
}

static PyTypeObject FastReadType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wal._storecore.FastRead",
    .tp_basicsize = sizeof(FastCommit),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Store.get / version / get_many: the read in C, else the wrapped function (storecore.c).",
    .tp_new = fast_read_new,
    .tp_dealloc = (destructor)fast_commit_dealloc,
    .tp_traverse = (traverseproc)fast_commit_traverse,
    .tp_clear = (inquiry)fast_commit_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastCommit, vectorcall),
    .tp_descr_get = fast_commit_get,
    .tp_getset = fast_commit_getset,
    .tp_members = fast_commit_members,
};

/* ---- module ---------------------------------------------------------------------------------- */

static PyObject *sc_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (log_calls_bind(&g_log, args, nargs) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *sc_bind_lmdb(PyObject *self, PyObject *capsule) {
    (void)self;
    const wal_lmdb_capi *api = PyCapsule_GetPointer(capsule, WAL_LMDB_CAPI_NAME);
    if (api == NULL) return NULL;
    if (api->version != WAL_LMDB_CAPI_VERSION) {
        PyErr_Format(PyExc_ImportError, "wal._lmdbcall's C API is version %d, wal._storecore needs %d: rebuild "
                     "agentwal", api->version, WAL_LMDB_CAPI_VERSION);
        return NULL;
    }
    g_lmdb = api;
    Py_RETURN_NONE;
}

static PyObject *sc_bind_watermarks(PyObject *self, PyObject *address) {
    (void)self;
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bind_watermarks: a null function address");
        return NULL;
    }
    g_watermarks = (int (*)(wal_log *, uint64_t *))(uintptr_t)p;
    Py_RETURN_NONE;
}

static PyMethodDef sc_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))sc_bind, METH_FASTCALL,
     "bind(append_address, wait_address, wait_try_address[, append_unfinished_address, finish_address]): the "
     "cffi module's wal_log_append, wal_log_wait and wal_log_wait_try (and wal_log_append_unfinished and "
     "wal_log_finish, for the sealed put)."},
    {"bind_lmdb", sc_bind_lmdb, METH_O, "bind_lmdb(capsule): wal._lmdbcall.CAPI, for the reads (lmdbapi.h)."},
    {"bind_watermarks", sc_bind_watermarks, METH_O,
     "bind_watermarks(address): the cffi module's wal_log_watermarks, for Core.visible_lsn."},
    {"encode", (PyCFunction)(void (*)(void))sc_encode, METH_FASTCALL,
     "encode(ops, time_ms, idempotency_key) -> the transaction's log payload."},
    {"decode", sc_decode, METH_O, "decode(payload) -> (ops, time_ms, idempotency_key); ValueError if malformed."},
    {"collapse", sc_collapse, METH_O,
     "collapse(records: list[(lsn, payload)]) -> (first, last, commits, puts, deletes, idem)."},
    {"load_aead", sealcore_load_aead, METH_NOARGS,
     "load_aead() -> the libcrypto SealSession uses (loaded once); OSError saying why if none can be."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sc_module = {
    PyModuleDef_HEAD_INIT, "wal._storecore", "The store's commit path and record codec in C (native/storecore.c).",
    -1, sc_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__storecore(void) {
    if (PyType_Ready(&CoreType) < 0 || PyType_Ready(&CollapserType) < 0 || PyType_Ready(&FastCommitType) < 0 ||
        PyType_Ready(&FastReadType) < 0 ||
        PyType_Ready(&CommitLockType) < 0)
        return NULL;
    str_core = PyUnicode_InternFromString("_core");
    str_fast_wait_failed = PyUnicode_InternFromString("_fast_wait_failed");
    str_sealer = PyUnicode_InternFromString("_sealer");
    str_session = PyUnicode_InternFromString("_session");
    if (str_core == NULL || str_fast_wait_failed == NULL || str_sealer == NULL || str_session == NULL) return NULL;
    PyObject *m = PyModule_Create(&sc_module);
    if (m == NULL) return NULL;
    Py_INCREF(&FastCommitType);
    if (PyModule_AddObject(m, "FastCommit", (PyObject *)&FastCommitType) < 0) {
        Py_DECREF(&FastCommitType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "FastRead", (PyObject *)&FastReadType) < 0
        || PyModule_AddIntConstant(m, "READ_VALUE", READ_VALUE) < 0
        || PyModule_AddIntConstant(m, "READ_VERSION", READ_VERSION) < 0
        || PyModule_AddIntConstant(m, "READ_MANY", READ_MANY) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&CollapserType);
    if (PyModule_AddObject(m, "Collapser", (PyObject *)&CollapserType) < 0) {
        Py_DECREF(&CollapserType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&CommitLockType);
    if (PyModule_AddObject(m, "CommitLock", (PyObject *)&CommitLockType) < 0) {
        Py_DECREF(&CommitLockType);
        Py_DECREF(m);
        return NULL;
    }
    if (sealcore_add(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
