/*
 * lmdbcall.c -- wal._lmdbcall: the package's one binding of LMDB (the state, wal/store/state.py).
 *
 * Why it exists. The materializer applies a batch of commits to LMDB. Through py-lmdb
 * that was `putmulti`, which releases and re-takes the GIL around every item: with a
 * thread putting in a loop it waited ~30 us per item for the GIL, so the apply queue
 * filled and the committing thread applied inline, serially (docs/performance.md).
 * Here `Env.apply` does a whole batch's LMDB transaction in ONE call with the GIL
 * released, on the other core, taking the GIL back only to ask the log's durable LSN
 * for invariant I1. py-lmdb does not expose its MDB_env or MDB_txn pointers, and LMDB
 * forbids opening one environment twice in a process (its fcntl locks are per process: closing
 * one handle's lock file drops the other's locks), so every LMDB access of the package
 * goes through this binding; no py-lmdb handle is ever opened by wal/.
 *
 * Where LMDB comes from. The `lmdb` package (py-lmdb) links LMDB into its extension
 * `lmdb/cpython*.so`: py-lmdb 3.x exports LMDB 0.9 as `mdb09_*` (and 1.0 as `mdb10_*`),
 * older wheels (1.4.x, checked: 1.4.1 bundles 0.9.29) export it as `mdb_*`. `load(path)`
 * resolves the functions below from that already-loaded file (dlopen RTLD_NOLOAD, so
 * the process keeps ONE copy of LMDB, shared with py-lmdb if anything else imports it)
 * and checks the engine is 0.9.x: py-lmdb opens 0.9 by default, so another process that
 * opens our state with py-lmdb sees the same file format and lock-file layout.
 * The declarations are ours, written from LMDB 0.9's documented API (lmdb.h).
 *
 * Contracts.
 *  - Errors: every LMDB or errno failure raises `LmdbError(code, message)` with LMDB's
 *    int code (negative MDB_* or a positive errno); wal/store/state.py classifies the codes.
 *    The binding's own refusals use codes below LMDB's range (ALREADY_OPEN, FORKED,
 *    CLOSED, BUSY, BAD_VALUE), also as LmdbError.
 *  - One Env per environment and process: a registry keyed by the directory's
 *    (st_dev, st_ino) refuses a second open in the same process (ALREADY_OPEN).
 *  - Fork: a child must not use its parent's handles (LMDB: "use the env only in the
 *    process that opened it"); every call checks the handle's process (FORKED; forkwatch.h
 *    sees every fork, also glibc's _Fork() and a raw clone), and a
 *    child never closes a parent's handle (mdb_env_close would clear the parent's
 *    reader slots in the shared lock file, since they carry the parent's pid).
 *  - GIL: reads (get, scan, snapshots) run with the GIL held (they are short and the GIL
 *    guards the spare read transactions). Everything that begins a WRITE transaction
 *    releases the GIL first: `apply` re-takes the GIL while it holds LMDB's writer mutex
 *    (to call a Python durable_lsn), so a thread that waited for the writer mutex with the
 *    GIL held would deadlock it. The store passes a `DurableLsn` instead, read in C, so its
 *    applies never take the GIL back. Syncs and opens release the GIL (fsync, lock files).
 *  - `close` refuses while a GIL-released call is running on the handle (BUSY), aborts
 *    live snapshots (they then fail as CLOSED) and spare read transactions first.
 *  - Values are stored as given: the store's layout (u64 version LE + value, FORMAT.md
 *    §16) is built by the caller; `applied_lsn`/`durable_seen` are u64 LE here as before.
 *    One exception, invisible to callers: a DATA value that would spill a few bytes onto
 *    one more overflow page is stored split (see "Split values" below); every read of
 *    DATA here returns it whole again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "crc32c.h" /* the per-entry checksum of DATA values (store format 4) */
#include "forkwatch.h" /* which process opened an environment */
#include "format.h" /* wal_get_u64 / wal_put_u64: little-endian u64, as everywhere on disk */
#include "lmdbapi.h" /* the C API this module lends wal._storecore (its fast reads) */

/* ---- LMDB 0.9's public API, as documented in lmdb.h (declared here, not included) ---- */

typedef struct MDB_env MDB_env;
typedef struct MDB_txn MDB_txn;
typedef struct MDB_cursor MDB_cursor;
typedef unsigned int MDB_dbi;
typedef struct {
    size_t mv_size;
    void *mv_data;
} MDB_val;
typedef struct {
    unsigned int ms_psize, ms_depth;
    size_t ms_branch_pages, ms_leaf_pages, ms_overflow_pages, ms_entries;
} MDB_stat;
typedef struct {
    void *me_mapaddr;
    size_t me_mapsize, me_last_pgno, me_last_txnid;
    unsigned int me_maxreaders, me_numreaders;
} MDB_envinfo;

#define MDB_NOSYNC 0x10000
#define MDB_RDONLY 0x20000
#define MDB_NOTLS 0x200000
#define MDB_NOLOCK 0x400000
#define MDB_NORDAHEAD 0x800000
#define MDB_CREATE 0x40000 /* mdb_dbi_open */
#define MDB_RESERVE 0x10000 /* mdb_put: make room for the value and return it; the caller fills it */
#define MDB_APPEND 0x20000  /* mdb_put: the key sorts after every key of the database (a bulk load) */
#define MDB_FIRST 0        /* MDB_cursor_op */
#define MDB_NEXT 8
#define MDB_SET_RANGE 17
#define FREE_DBI 0          /* LMDB's own databases: the free-page lists (key: txnid), the main one */
#define MAIN_DBI 1

#define MDB_KEYEXIST (-30799)
#define MDB_NOTFOUND (-30798)
#define MDB_PAGE_NOTFOUND (-30797)
#define MDB_CORRUPTED (-30796)
#define MDB_PANIC (-30795)
#define MDB_VERSION_MISMATCH (-30794)
#define MDB_INVALID (-30793)
#define MDB_MAP_FULL (-30792)
#define MDB_DBS_FULL (-30791)
#define MDB_READERS_FULL (-30790)
#define MDB_TXN_FULL (-30788)
#define MDB_MAP_RESIZED (-30785)
#define MDB_INCOMPATIBLE (-30784)
#define MDB_BAD_RSLOT (-30783)
#define MDB_BAD_TXN (-30782)
#define MDB_BAD_VALSIZE (-30781)
#define MDB_BAD_DBI (-30780)

/* The binding's own refusals: below LMDB's codes (-30799..-30780), never an errno. */
#define E_ALREADY_OPEN (-40001)
#define E_FORKED (-40002)
#define E_CLOSED (-40003)
#define E_BUSY (-40004)
#define E_BAD_VALUE (-40005) /* a stored value of the wrong size, or a split one without its tail: damage */
#define E_NO_TAILS (-40006)  /* a read-only handle opened before the state had split values met one */
#define E_CHECKSUM (-40007)  /* a DATA entry whose checksum does not match its key, version and value: damage */

/* apply's outcomes besides an LMDB error. */
#define APPLY_OK 0
#define APPLY_GAP 1         /* I3: the batch does not start right after applied_lsn, or has a hole */
#define APPLY_NOT_DURABLE 2 /* I1: its last LSN is above the log's durable LSN */

#define FILE_MODE 0644
#define MAX_DBS 8
#define N_DBS 3 /* data, idem, meta: their index is the `db` argument of every call */
#define DB_DATA 0
#define META_DB 2
#define DB_TAIL 3 /* the tails of split DATA values: internal, never a `db` argument */
#define SPARE_TXNS 4
/* Reader slots of the lock file (py-lmdb's default is 126): each open read transaction takes
 * one -- a snapshot, a scan's iterator, the checkpoint's pin, SPARE_TXNS per handle, and those
 * of read-only openers in other processes -- and 126 were taken by as many threads scanning at
 * once. 64 bytes each. The first opener sizes the table; a later one adopts the file's size. */
#define MAX_READERS 1024
static const char CHECKS_KEY[] = "entry_checksums"; /* META: every DATA entry carries a checksum */
static const char IDEM_CHECKS_KEY[] = "idem_checksums"; /* META: every IDEM entry carries one (format 6) */
#define DB_IDEM 1
#define IDEM_VALUE 16   /* an IDEM value: u64 LSN + u64 commit time ms */
#define IDEM_CHECKED 20 /* ... then CRC-32C(key || those 16 bytes), u32 LE (store format 6) */

typedef struct {
    char *(*version)(int *, int *, int *);
    char *(*strerror)(int);
    int (*env_create)(MDB_env **);
    int (*env_open)(MDB_env *, const char *, unsigned int, unsigned int);
    void (*env_close)(MDB_env *);
    int (*env_set_mapsize)(MDB_env *, size_t);
    int (*env_set_maxdbs)(MDB_env *, MDB_dbi);
    int (*env_sync)(MDB_env *, int);
    int (*env_stat)(MDB_env *, MDB_stat *);
    int (*env_info)(MDB_env *, MDB_envinfo *);
    int (*txn_begin)(MDB_env *, MDB_txn *, unsigned int, MDB_txn **);
    int (*txn_commit)(MDB_txn *);
    void (*txn_abort)(MDB_txn *);
    void (*txn_reset)(MDB_txn *);
    int (*txn_renew)(MDB_txn *);
    int (*dbi_open)(MDB_txn *, const char *, unsigned int, MDB_dbi *);
    int (*stat)(MDB_txn *, MDB_dbi, MDB_stat *);
    int (*get)(MDB_txn *, MDB_dbi, MDB_val *, MDB_val *);
    int (*put)(MDB_txn *, MDB_dbi, MDB_val *, MDB_val *, unsigned int);
    int (*del)(MDB_txn *, MDB_dbi, MDB_val *, MDB_val *);
    int (*cursor_open)(MDB_txn *, MDB_dbi, MDB_cursor **);
    void (*cursor_close)(MDB_cursor *);
    int (*cursor_get)(MDB_cursor *, MDB_val *, MDB_val *, int);
    int (*cursor_put)(MDB_cursor *, MDB_val *, MDB_val *, unsigned int);
    size_t (*txn_id)(MDB_txn *);
    int (*env_set_maxreaders)(MDB_env *, unsigned int);
    int (*reader_check)(MDB_env *, int *);
} mdb_api;

/* The names resolved, in mdb_api's order. */
static const char *const API_NAMES[] = {
    "version", "strerror", "env_create", "env_open", "env_close", "env_set_mapsize", "env_set_maxdbs",
    "env_sync", "env_stat", "env_info", "txn_begin", "txn_commit", "txn_abort", "txn_reset", "txn_renew",
    "dbi_open", "stat", "get", "put", "del", "cursor_open", "cursor_close", "cursor_get", "cursor_put",
    "txn_id", "env_set_maxreaders", "reader_check",
};
#define N_API (sizeof(API_NAMES) / sizeof(API_NAMES[0]))
_Static_assert(sizeof(mdb_api) == N_API * sizeof(void *), "API_NAMES must list every mdb_api member");

static mdb_api M;         /* valid once `loaded` */
static int loaded;
static char loaded_version[128];
static PyObject *LmdbError;

/* ---- errors ---- */

/* The reader slots of the lock file a read found all taken (new_read_txn), in this thread: its
 * MDB_READERS_FULL error names them. A lock file made by another opener (an older agentwal, or
 * another LMDB binding) has the slot count that opener gave it, not MAX_READERS. */
static _Thread_local unsigned int full_reader_slots;

static void set_error(int rc, const char *where) {
    PyObject *text = rc == MDB_READERS_FULL && full_reader_slots > 0
        ? PyUnicode_FromFormat("%s: %s (%u reader slots)", where, loaded ? M.strerror(rc) : "", full_reader_slots)
        : PyUnicode_FromFormat("%s: %s", where, loaded ? M.strerror(rc) : "");
    full_reader_slots = 0; /* named once: a later MDB_READERS_FULL not from new_read_txn names none */
    PyObject *a = text != NULL ? Py_BuildValue("(iN)", rc, text) : NULL;
    if (a != NULL) {
        PyErr_SetObject(LmdbError, a);
        Py_DECREF(a);
    }
}

static void set_own_error(int code, const char *text) {
    PyObject *args = Py_BuildValue("(is)", code, text);
    if (args != NULL) {
        PyErr_SetObject(LmdbError, args);
        Py_DECREF(args);
    }
}

/* LmdbError(E_BAD_VALUE, message): a stored value the binding found damaged. */
static void set_bad_value(const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    PyObject *msg = PyUnicode_FromFormatV(format, ap);
    va_end(ap);
    if (msg == NULL) return;
    PyObject *a = Py_BuildValue("(iN)", E_BAD_VALUE, msg);
    if (a != NULL) {
        PyErr_SetObject(LmdbError, a);
        Py_DECREF(a);
    }
}

/* ---- loading ---- */

/* Resolve every function of mdb_api from `path` (which must already be loaded) into `api`,
 * with the first prefix whose mdb_env_create exists; all of them must then exist under
 * that prefix (never a mix of two engines). On failure, a message in `why`. */
static int resolve(const char *path, mdb_api *api, char *why, size_t why_len) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        const char *e = dlerror();
        snprintf(why, why_len, "%s is not loaded in this process (%s)", path, e ? e : "dlopen failed");
        return -1;
    }
    static const char *const prefixes[] = {"mdb09_", "mdb_"};
    const char *prefix = NULL;
    char name[64];
    for (size_t p = 0; p < 2 && prefix == NULL; p++) {
        snprintf(name, sizeof name, "%senv_create", prefixes[p]);
        if (dlsym(lib, name) != NULL) prefix = prefixes[p];
    }
    if (prefix == NULL) {
        snprintf(why, why_len, "%s exports neither mdb09_env_create nor mdb_env_create (no LMDB 0.9 in it)", path);
        dlclose(lib);
        return -1;
    }
    void **slots = (void **)api;
    for (size_t i = 0; i < N_API; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, API_NAMES[i]);
        slots[i] = dlsym(lib, name);
        if (slots[i] == NULL) {
            snprintf(why, why_len, "%s exports %senv_create but not %s", path, prefix, name);
            dlclose(lib);
            return -1;
        }
    }
    int major = -1, minor = -1, patch = -1;
    const char *text = api->version(&major, &minor, &patch);
    if (major != 0 || minor != 9) {
        snprintf(why, why_len, "%s holds LMDB %d.%d.%d (%s), not 0.9.x", path, major, minor, patch,
                 text ? text : "?");
        dlclose(lib);
        return -1;
    }
    /* The handle is kept (never dlclose'd): the functions must outlive every Env. */
    return 0;
}

static PyObject *mod_load(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *bytes_path;
    if (!PyUnicode_FSConverter(arg, &bytes_path)) return NULL;
    mdb_api api;
    char why[1024];
    int rc = resolve(PyBytes_AS_STRING(bytes_path), &api, why, sizeof why);
    Py_DECREF(bytes_path);
    if (rc < 0) {
        PyErr_SetString(PyExc_ImportError, why);
        return NULL;
    }
    const char *text = api.version(NULL, NULL, NULL);
    if (!loaded) { /* the first library loaded stays: open Envs use its functions */
        M = api;
        snprintf(loaded_version, sizeof loaded_version, "%s", text ? text : "");
        loaded = 1;
    }
    return PyUnicode_FromString(text ? text : "");
}

/* ---- Env ---- */

typedef struct SnapshotObject SnapshotObject;

typedef struct EnvObject {
    PyObject_HEAD
    MDB_env *env; /* NULL once closed */
    MDB_dbi dbs[N_DBS + 1]; /* the N_DBS databases, then DB_TAIL */
    int has_tail;           /* DB_TAIL exists (a read-only open of a format-2 state may lack it) */
    int require_checks;     /* every DATA entry carries a checksum (META "entry_checksums" is set) */
    int require_idem_checks; /* every IDEM entry carries one (META "idem_checksums" is set) */
    unsigned int psize;     /* LMDB's page size: where split_tail() draws its line */
    uint64_t epoch; /* the process that opened it (forkwatch.h) */
    dev_t dev;
    ino_t ino;
    int readonly;
    int restored; /* env_init wrote the given meta page into both slots (restore_meta) */
    int busy; /* GIL-released calls running on this handle */
    unsigned long long background_applies; /* applies run at the lowest CPU priority (apply) */
    int n_spare;
    MDB_txn *spare[SPARE_TXNS]; /* reset read transactions, renewed by the next read */
    SnapshotObject *snapshots;  /* live snapshots, to abort before mdb_env_close */
    struct EnvObject *next;     /* the registry of open environments (guarded by the GIL) */
    PyObject *path;
} EnvObject;

struct SnapshotObject {
    PyObject_HEAD
    EnvObject *owner; /* strong reference */
    MDB_txn *txn;     /* NULL once aborted */
    SnapshotObject *prev, *next;
};

static EnvObject *registry;

static void registry_remove(EnvObject *e) {
    for (EnvObject **p = &registry; *p != NULL; p = &(*p)->next) {
        if (*p == e) {
            *p = e->next;
            e->next = NULL;
            return;
        }
    }
}

/* 0 if the handle may be used by this thread now; else an LmdbError is set. */
static int usable(EnvObject *e) {
    if (e->epoch != forkwatch_now()) {
        set_own_error(E_FORKED, "this LMDB handle was opened by another process (this is a forked child); "
                                "open the state again in this process");
        return -1;
    }
    if (e->env == NULL) {
        set_own_error(E_CLOSED, "the LMDB environment is closed");
        return -1;
    }
    return 0;
}

static int writable(EnvObject *e) {
    if (usable(e) < 0) return -1;
    if (e->readonly) {
        set_error(EACCES, "write transaction on a read-only environment");
        return -1;
    }
    return 0;
}

static int db_index(PyObject *arg, int *out) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v >= N_DBS) {
        PyErr_Format(PyExc_ValueError, "database index %ld out of range (DATA, IDEM, META)", v);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* ---- The map's size ----
 * The map is address space, not memory or disk: LMDB maps the whole map_size at open and the
 * file grows only with the data. The state sizes it from the file and grows it on
 * MDB_MAP_FULL (wal/store/state.py), so that a process can hold a thousand environments (a fixed
 * 1 TiB each would take the whole 47-bit user address space at the 128th).
 *
 * mdb_env_set_mapsize on an open environment munmaps and remaps the file. lmdb.h asks that
 * no transaction be active in the process; what LMDB 0.9 needs (mdb.c) is that no write
 * transaction is (it returns EINVAL then) and that nothing holds a pointer into the old
 * mapping: a cursor, or a value not yet copied out. Every call of this binding copies what
 * it reads and closes its cursors before it returns, and the ones that release the GIL
 * count themselves in `busy`: with the GIL held and busy == 0, only idle read transactions
 * (the spares, the snapshots, the checkpoint's pin) exist, and an idle LMDB 0.9 read
 * transaction keeps its database records by value and its reader slot in the lock file,
 * never a pointer into the data map. A transaction begun later checks its snapshot's last
 * page against the new map (MDB_MAP_RESIZED if another process grew the file past it). */
static void env_close_now(EnvObject *e);

static int set_map_size(EnvObject *e, size_t size) {
    if (e->busy > 0) return E_BUSY;
    int rc = M.env_set_mapsize(e->env, size);
    /* EINVAL (a write transaction active) is refused before anything changes. Any other
     * failure comes from the new mmap (ENOMEM: no address space left), after LMDB unmapped
     * the old map and left none: the handle is closed (its calls then fail with E_CLOSED)
     * rather than left to touch a map that is gone. Mapping the old size again would go
     * through mdb_env_set_mapsize, which would munmap from address 0. */
    if (rc != 0 && rc != EINVAL) env_close_now(e);
    return rc;
}

/* A new read transaction. Another process (the writer) may have grown the map past ours:
 * MDB_MAP_RESIZED, and lmdb.h's answer is to adopt the size it recorded
 * (mdb_env_set_mapsize(env, 0)) and begin again. Every reader slot taken: those of processes
 * that died holding them (a SIGKILLed read-only opener's) are freed (mdb_reader_check) and the
 * begin tried again; MDB_READERS_FULL only if live readers hold them all. */
static int new_read_txn(EnvObject *e, MDB_txn **txn) {
    int rc = M.txn_begin(e->env, NULL, MDB_RDONLY, txn);
    if (rc == MDB_MAP_RESIZED && set_map_size(e, 0) == 0) rc = M.txn_begin(e->env, NULL, MDB_RDONLY, txn);
    int dead = 0;
    if (rc == MDB_READERS_FULL && M.reader_check(e->env, &dead) == 0 && dead > 0)
        rc = M.txn_begin(e->env, NULL, MDB_RDONLY, txn);
    if (rc == MDB_READERS_FULL) {
        MDB_envinfo info;
        full_reader_slots = M.env_info(e->env, &info) == 0 ? info.me_maxreaders : 0;
    }
    return rc;
}

/* A read transaction: a spare one renewed, else a new one. GIL held. */
static int read_begin(EnvObject *e, MDB_txn **txn) {
    while (e->n_spare > 0) {
        MDB_txn *t = e->spare[--e->n_spare];
        if (M.txn_renew(t) == 0) {
            *txn = t;
            return 0;
        }
        M.txn_abort(t);
    }
    return new_read_txn(e, txn);
}

static void read_end(EnvObject *e, MDB_txn *txn) {
    if (e->n_spare < SPARE_TXNS) {
        M.txn_reset(txn);
        e->spare[e->n_spare++] = txn;
    } else {
        M.txn_abort(txn);
    }
}

static void abort_all_readers(EnvObject *e) {
    while (e->n_spare > 0) M.txn_abort(e->spare[--e->n_spare]);
    while (e->snapshots != NULL) {
        SnapshotObject *s = e->snapshots;
        e->snapshots = s->next;
        if (s->txn != NULL) M.txn_abort(s->txn);
        s->txn = NULL;
        s->prev = s->next = NULL;
    }
}

static void env_close_now(EnvObject *e) {
    if (e->env == NULL) return;
    registry_remove(e);
    if (e->epoch != forkwatch_now()) { /* a forked child: the parent owns the environment (see top) */
        e->env = NULL;
        e->n_spare = 0;
        e->snapshots = NULL;
        return;
    }
    abort_all_readers(e);
    M.env_close(e->env);
    e->env = NULL;
}

/* Write `page`, a meta page saved at a checkpoint (wal/store/state.py), into both meta slots of
 * dir/data.mdb and fdatasync it, so that LMDB opens at that snapshot -- unless another process
 * has the environment open. LMDB's own test for that: every opener holds a read lock on byte 0
 * of lock.mdb, and the first one takes a write lock there to initialise the file. If another
 * process holds it, the machine has not restarted since that process opened it, so the page
 * cache holds every page LMDB wrote and nothing needs restoring. Returns 1 written, 0 skipped,
 * -1 with errno. Called before mdb_env_open, while this process holds no LMDB lock on the
 * environment (the registry check came first): closing our lock-file descriptor, which drops
 * every fcntl lock this process has on the file, then drops none of LMDB's. */
static int restore_meta(const char *dir, const char *page, size_t psize) {
    char lock_path[PATH_MAX], data_path[PATH_MAX];
    if (snprintf(lock_path, sizeof lock_path, "%s/lock.mdb", dir) >= (int)sizeof lock_path ||
        snprintf(data_path, sizeof data_path, "%s/data.mdb", dir) >= (int)sizeof data_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int lfd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, FILE_MODE);
    if (lfd < 0) return -1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fcntl(lfd, F_SETLK, &fl) != 0) {
        int e = errno;
        close(lfd);
        if (e == EACCES || e == EAGAIN) return 0;
        errno = e;
        return -1;
    }
    int rc = -1, dfd = open(data_path, O_WRONLY | O_CLOEXEC);
    char *buf = malloc(psize);
    if (dfd >= 0 && buf != NULL) {
        rc = 1;
        for (uint64_t slot = 0; slot < 2 && rc == 1; slot++) {
            memcpy(buf, page, psize);
            wal_put_u64((uint8_t *)buf, slot); /* the page header's page number */
            if (pwrite(dfd, buf, psize, (off_t)(slot * psize)) != (ssize_t)psize) rc = -1;
        }
        if (rc == 1 && fdatasync(dfd) != 0) rc = -1;
    }
    int e = errno;
    free(buf);
    if (dfd >= 0) close(dfd);
    close(lfd);
    errno = e;
    return rc;
}

static int env_init_with(EnvObject *self, PyObject *path, int readonly, unsigned long long map_size,
                         const char *restore, size_t restore_len, int nolock);
static int mark_checked(EnvObject *e, MDB_txn *txn, const char **where);
static int mark_idem_checked(EnvObject *e, MDB_txn *txn, const char **where);

/* At open, in its transaction: is META `marker` set (*required = 1)? If not, and `can_mark`,
 * and database `db` is empty (nothing in it lacks a checksum), `mark` sets it now. */
static int checksum_marker(EnvObject *e, MDB_txn *txn, const char *marker, int db, int can_mark,
                           int (*mark)(EnvObject *, MDB_txn *, const char **), int *required, const char **where) {
    MDB_val k = {strlen(marker), (void *)marker}, v;
    MDB_stat st;
    *where = "mdb_get (a checksum marker)";
    int rc = M.get(txn, e->dbs[META_DB], &k, &v);
    if (rc == 0) *required = 1;
    if (rc != MDB_NOTFOUND) return rc;
    *where = "mdb_stat";
    rc = M.stat(txn, e->dbs[db], &st);
    if (rc == 0 && can_mark && st.ms_entries == 0) {
        rc = mark(e, txn, where);
        *required = rc == 0;
    }
    return rc;
}

static int env_init(EnvObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"path", "readonly", "map_size", "restore", "nolock", NULL};
    PyObject *path;
    int readonly = 0, nolock = 0;
    unsigned long long map_size = 0;
    Py_buffer restore = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&pK|z*p", kwlist, PyUnicode_FSConverter, &path, &readonly,
                                     &map_size, &restore, &nolock))
        return -1;
    if (nolock && !readonly) {
        if (restore.obj != NULL) PyBuffer_Release(&restore);
        Py_DECREF(path);
        PyErr_SetString(PyExc_ValueError, "nolock is for read-only opens only");
        return -1;
    }
    int rc = env_init_with(self, path, readonly, map_size, restore.buf, (size_t)restore.len, nolock);
    if (restore.obj != NULL) PyBuffer_Release(&restore);
    return rc;
}

/* Env(path, readonly, map_size, restore=None, nolock=False); `path` is a new reference, kept or
 * dropped. nolock (read-only only): MDB_NOLOCK, no reader slot in lock.mdb, for a user who may
 * not write that file. LMDB then cannot keep a writer from reusing the pages a read uses, so
 * the caller must keep every writer out for the handle's life (wal/store/state.py holds the log's
 * writer lock shared). */
static int env_init_with(EnvObject *self, PyObject *path, int readonly, unsigned long long map_size,
                         const char *restore, size_t restore_len, int nolock) {
    if (self->env != NULL || self->path != NULL) {
        Py_DECREF(path);
        PyErr_SetString(PyExc_TypeError, "Env is initialised once");
        return -1;
    }
    self->path = path;
    if (!loaded) {
        PyErr_SetString(PyExc_RuntimeError, "wal._lmdbcall.load() was not called");
        return -1;
    }
    const char *cpath = PyBytes_AS_STRING(path);
    struct stat st;
    if (stat(cpath, &st) != 0) {
        set_error(errno, "mdb_env_open");
        return -1;
    }
    for (EnvObject *o = registry; o != NULL; o = o->next) {
        if (o->epoch == forkwatch_now() && o->dev == st.st_dev && o->ino == st.st_ino) {
            set_own_error(E_ALREADY_OPEN, "this LMDB environment is already open in this process");
            return -1;
        }
    }
    if (restore != NULL) {
        if (readonly || restore_len < 4096 || restore_len > (1u << 16)) {
            PyErr_SetString(PyExc_ValueError, "restore takes one meta page (4 KiB .. 64 KiB), never on a read-only open");
            return -1;
        }
        int got;
        Py_BEGIN_ALLOW_THREADS
        got = restore_meta(cpath, restore, restore_len);
        Py_END_ALLOW_THREADS
        if (got < 0) {
            set_error(errno, "restoring the checkpoint's meta page");
            return -1;
        }
        self->restored = got;
    }
    self->readonly = readonly;
    self->epoch = forkwatch_epoch();
    self->dev = st.st_dev;
    self->ino = st.st_ino;
    MDB_env *env = NULL;
    int rc = M.env_create(&env);
    const char *where = "mdb_env_create";
    if (rc == 0) {
        rc = M.env_set_mapsize(env, (size_t)map_size);
        where = "mdb_env_set_mapsize";
    }
    if (rc == 0) {
        rc = M.env_set_maxdbs(env, MAX_DBS);
        where = "mdb_env_set_maxdbs";
    }
    if (rc == 0) {
        rc = M.env_set_maxreaders(env, MAX_READERS);
        where = "mdb_env_set_maxreaders";
    }
    if (rc != 0) {
        if (env != NULL) M.env_close(env);
        set_error(rc, where);
        return -1;
    }
    /* Reserve the registry slot before releasing the GIL: a concurrent open of the same
     * directory in another thread is refused rather than racing us. */
    self->env = env;
    self->next = registry;
    registry = self;
    self->busy++;
    /* Subdir layout; no fsync at commit (NOSYNC: the state is made durable at checkpoints,
     * and after a crash reopened at the last one, wal/store/state.py); never MAPASYNC/WRITEMAP, so
     * every page reaches the file through write(2), where a checkpoint's fdatasync finds it;
     * read transactions not bound to threads (NOTLS); no readahead. */
    unsigned int flags = MDB_NOTLS | MDB_NORDAHEAD | (readonly ? MDB_RDONLY : MDB_NOSYNC) | (nolock ? MDB_NOLOCK : 0);
    MDB_txn *txn = NULL;
    static const char *const names[N_DBS + 1] = {"data", "idem", "meta", "tail"};
    Py_BEGIN_ALLOW_THREADS
    rc = M.env_open(env, cpath, flags, FILE_MODE);
    where = "mdb_env_open";
    if (rc == 0) {
        rc = M.txn_begin(env, NULL, readonly ? MDB_RDONLY : 0, &txn);
        where = "mdb_txn_begin";
    }
    /* A state that holds any named database holds data, idem and meta: a writable open creates
     * them only in an empty one, never in place of one a damaged record hides (MDB_NOTFOUND). */
    MDB_stat main_stat = {0};
    if (rc == 0) {
        rc = M.stat(txn, 1 /* MAIN_DBI */, &main_stat);
        where = "mdb_stat (main)";
    }
    for (int i = 0; rc == 0 && i < N_DBS; i++) {
        rc = M.dbi_open(txn, names[i], readonly || main_stat.ms_entries > 0 ? 0 : MDB_CREATE, &self->dbs[i]);
        where = "mdb_dbi_open";
    }
    if (rc == 0) {
        rc = M.dbi_open(txn, names[DB_TAIL], readonly ? 0 : MDB_CREATE, &self->dbs[DB_TAIL]);
        self->has_tail = rc == 0;
        if (rc == MDB_NOTFOUND && readonly) rc = 0; /* a state written before split values */
    }
    if (rc == 0) {
        MDB_stat est;
        rc = M.env_stat(env, &est);
        where = "mdb_env_stat";
        self->psize = est.ms_psize;
    }
    /* Does every DATA entry carry a checksum? A new, empty state says so at once; then every
     * IDEM entry? Said at once of an empty one in a checked state (its marker is checked). */
    if (rc == 0)
        rc = checksum_marker(self, txn, CHECKS_KEY, DB_DATA, !readonly, mark_checked, &self->require_checks, &where);
    if (rc == 0)
        rc = checksum_marker(self, txn, IDEM_CHECKS_KEY, DB_IDEM, !readonly && self->require_checks,
                             mark_idem_checked, &self->require_idem_checks, &where);
    if (rc == 0) {
        rc = M.txn_commit(txn); /* also for a read txn: its dbi handles then stay usable */
        txn = NULL;
        where = "mdb_txn_commit";
    }
    if (rc != 0) {
        if (txn != NULL) M.txn_abort(txn);
        M.env_close(env); /* lmdb.h: after a failed mdb_env_open the handle must be closed */
    }
    Py_END_ALLOW_THREADS
    self->busy--;
    if (rc != 0) {
        self->env = NULL;
        registry_remove(self);
        set_error(rc, where);
        return -1;
    }
    return 0;
}

static void env_dealloc(EnvObject *self) {
    if (self->busy == 0) env_close_now(self); /* busy cannot hold here: calls keep a reference */
    Py_XDECREF(self->path);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *env_close(EnvObject *self, PyObject *unused) {
    (void)unused;
    if (self->busy > 0) {
        set_own_error(E_BUSY, "closing an LMDB environment while another thread is in a call on it");
        return NULL;
    }
    env_close_now(self);
    Py_RETURN_NONE;
}

static PyObject *value_bytes(const MDB_val *v) { return PyBytes_FromStringAndSize((const char *)v->mv_data, (Py_ssize_t)v->mv_size); }

/* ---- DATA entries: checksums and split values (FORMAT.md §16) ----
 *
 * A DATA value as callers give and get it is the version (u64 LE, the LSN of the commit that
 * wrote the key) and the user's value. As stored (store format 4) it is
 *
 *     version:u64 LE | crc:u32 LE | value        crc = CRC-32C(key || version || value)
 *
 * with CHECKED_FLAG set in the version's byte 7 (bit 62), the version in the checksum taken
 * without its flags. Every read recomputes the checksum (in C, ~15 GB/s) before anything
 * leaves this file, so a damaged entry -- a flipped byte of its key, version, value or size,
 * or a page pointer that lands in another entry's bytes -- raises E_CHECKSUM instead of
 * returning what was never written. Why per entry and not LMDB 1.0's page checksums: the state
 * must stay LMDB 0.9's format (py-lmdb opens 0.9 by default, so do operators' tools, and the
 * checkpoint code reads its meta pages), and the entry is what a read returns: its checksum
 * travels with it through splits and page moves, and covers the key the read asked for.
 * What it cannot see, a damaged branch page that steers a lookup away from a key, a full
 * walk sees (`agentwal verify` compares every entry it scans with a lookup of the same key).
 * Entries written before format 4 have no CHECKED_FLAG; they are read as they are until the
 * first writable open rewrites them (check_entries) and sets META "entry_checksums", after
 * which an entry without the flag is damage too.
 *
 * Split values. LMDB gives a value too large for a leaf overflow pages of its own:
 * ceil((16 + size) / P) whole pages, 16 being the page header. A 4 KiB value is 4,116 bytes
 * stored, on two 4 KiB pages, the second holding a few dozen: every put of one writes twice
 * the pages its bytes need, and the state's pages are what bounds a sustained run of 4 KiB
 * commits once the page cache has to give them to the disk (docs: performance notes). So when
 * the last overflow page would hold at most P/8 bytes, those last bytes go to DB_TAIL under
 * the same key, and the DATA value, one page shorter, carries SPLIT_FLAG in its version's top
 * bit (an LSN never reaches 2^62; apply refuses a version that does). The line is the
 * writer's choice alone: a reader joins any flagged value with its tail, whatever the sizes.
 * The checksum is over the whole value, so it is checked after the join. */
#define PAGE_HEADER 16  /* LMDB 0.9's page header on 64-bit: an overflow page holds P - 16 bytes */
#define SPLIT_FLAG 0x80 /* in byte 7 of a DATA value: the top bit of its u64 LE version */
#define CHECKED_FLAG 0x40 /* in byte 7: bit 62, the entry carries a checksum after its version */
#define VERSION_FLAGS (SPLIT_FLAG | CHECKED_FLAG)
#define ENTRY_HEAD 12   /* version + crc */

/* The bytes of a DATA value of `size` to store in DB_TAIL: 0 (store it whole) unless they are
 * all its last overflow page would hold, and at most P/8. */
static size_t split_tail(const EnvObject *e, size_t size) {
    size_t p = e->psize, last = (size + PAGE_HEADER) % p;
    if (!e->has_tail || size + PAGE_HEADER <= p || last == 0 || last > p / 8) return 0;
    return last;
}

static int del_tail(EnvObject *e, MDB_txn *txn, MDB_val *k) {
    if (!e->has_tail) return 0;
    int rc = M.del(txn, e->dbs[DB_TAIL], k, NULL);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* CRC-32C of a DATA entry: key, version (flags cleared, u64 LE), value in up to two pieces. */
static uint32_t entry_crc(const MDB_val *k, uint64_t version, const void *v1, size_t n1, const void *v2, size_t n2) {
    unsigned char ver[8];
    wal_put_u64(ver, version);
    uint32_t crc = wal_crc32c(0, k->mv_data, k->mv_size);
    crc = wal_crc32c(crc, ver, 8);
    crc = wal_crc32c(crc, v1, n1);
    return n2 ? wal_crc32c(crc, v2, n2) : crc;
}

/* Put the DATA entry of key `k`: version `version` (no flags) and `n` bytes of value at `val`,
 * checksummed, split or whole, through `cur` (a DATA cursor of `txn`); either way no tail of
 * an earlier value of `k` is left behind. On failure *where names the call. GIL not needed. */
static int put_entry_as(EnvObject *e, MDB_txn *txn, MDB_cursor *cur, MDB_val *k, uint64_t version, const char *val,
                        size_t n, unsigned int flags, const char **where) {
    size_t total = ENTRY_HEAD + n, tail = split_tail(e, total);
    MDB_val head = {total - tail, NULL};
    *where = "mdb_cursor_put";
    int rc = M.cursor_put(cur, k, &head, MDB_RESERVE | flags); /* head.mv_data: the room in the page */
    if (rc != 0) return rc;
    unsigned char *dst = head.mv_data;
    wal_put_u64(dst, version);
    dst[7] |= CHECKED_FLAG | (tail ? SPLIT_FLAG : 0);
    wal_put_u32(dst + 8, entry_crc(k, version, val, n, NULL, 0));
    memcpy(dst + ENTRY_HEAD, val, n - tail);
    if (tail == 0) {
        *where = "mdb_del (tail)";
        return del_tail(e, txn, k);
    }
    MDB_val rest = {tail, (char *)val + (n - tail)};
    *where = "mdb_put (tail)";
    return M.put(txn, e->dbs[DB_TAIL], k, &rest, 0);
}

static int put_entry(EnvObject *e, MDB_txn *txn, MDB_cursor *cur, MDB_val *k, uint64_t version, const char *val,
                     size_t n, const char **where) {
    return put_entry_as(e, txn, cur, k, version, val, n, 0, where);
}

/* A write transaction with a cursor on `dbi`, for the callers that walk or fill one database
 * (without the GIL). *where names the call that failed; on failure the caller closes what is
 * not NULL, as after any later error. */
/* End write transaction `txn` (NULL: none was begun): committed if `rc` is 0, else aborted.
 * Returns rc, or the commit's outcome. No fsync (MDB_NOSYNC): checkpoints make the state durable. */
static int end_write(MDB_txn *txn, int rc, const char **where) {
    if (txn == NULL) return rc;
    if (rc != 0) {
        M.txn_abort(txn);
        return rc;
    }
    *where = "mdb_txn_commit";
    return M.txn_commit(txn);
}

static int begin_write_cursor(EnvObject *e, MDB_dbi dbi, MDB_txn **txn, MDB_cursor **cur, const char **where) {
    *where = "mdb_txn_begin";
    int rc = M.txn_begin(e->env, NULL, 0, txn);
    if (rc == 0) {
        rc = M.cursor_open(*txn, dbi, cur);
        *where = "mdb_cursor_open";
    }
    return rc;
}

/* put_entry for a value given as the caller's layout: u64 LE version + value. */
static int put_data(EnvObject *e, MDB_txn *txn, MDB_cursor *cur, MDB_val *k, const MDB_val *v, const char **where) {
    return put_entry(e, txn, cur, k, wal_get_u64(v->mv_data), (const char *)v->mv_data + 8, v->mv_size - 8, where);
}

static void set_entry_damage(int code, const MDB_val *k, const char *what) {
    PyObject *key = PyBytes_FromStringAndSize(k->mv_data, (Py_ssize_t)k->mv_size);
    if (key == NULL) return;
    PyObject *msg = PyUnicode_FromFormat("key %R: %s", key, what);
    Py_DECREF(key);
    if (msg == NULL) return;
    PyObject *a = Py_BuildValue("(iN)", code, msg);
    if (a != NULL) {
        PyErr_SetObject(LmdbError, a);
        Py_DECREF(a);
    }
}

/* ---- META values: a CRC-32C of key and value after the value (store format 4) ----
 *
 * `applied_lsn` says where the log's replay starts: a flipped bit there would skip commits or
 * apply them twice without a trace. So in a state that requires checksums every META value
 * but the marker itself is stored as value || CRC-32C(key || value) (u32 LE), put and checked
 * here; callers see the value alone. */
static int is_checks_key(const MDB_val *k) {
    return k->mv_size == sizeof CHECKS_KEY - 1 && memcmp(k->mv_data, CHECKS_KEY, k->mv_size) == 0;
}

static int meta_checked(const EnvObject *e, const MDB_val *k) { return e->require_checks && !is_checks_key(k); }

static uint32_t meta_crc(const MDB_val *k, const void *v, size_t n) {
    return wal_crc32c(wal_crc32c(0, k->mv_data, k->mv_size), v, n);
}

/* The META value `v` of key `k` with its checksum checked and cut off (in place: v->mv_size
 * shrinks by 4); -1 with an LmdbError set if it does not match. */
static int meta_value(const EnvObject *e, const MDB_val *k, MDB_val *v) {
    if (!meta_checked(e, k)) return 0;
    if (v->mv_size < 4 || meta_crc(k, v->mv_data, v->mv_size - 4)
                              != wal_get_u32((const uint8_t *)v->mv_data + v->mv_size - 4)) {
        set_entry_damage(E_CHECKSUM, k, "a metadata value whose checksum does not match");
        return -1;
    }
    v->mv_size -= 4;
    return 0;
}

/* Put META value `n` bytes at `val` under `k` in `txn`, with its checksum when `checked`. */
static int put_meta(EnvObject *e, MDB_txn *txn, MDB_val *k, const void *val, size_t n, int checked) {
    MDB_val room = {n + (checked ? 4 : 0), NULL};
    int rc = M.put(txn, e->dbs[META_DB], k, &room, MDB_RESERVE);
    if (rc != 0) return rc;
    memcpy(room.mv_data, val, n);
    if (checked) wal_put_u32((uint8_t *)room.mv_data + n, meta_crc(k, val, n));
    return 0;
}

/* Give every META value but the marker its checksum, in `txn` (the step to store format 4
 * that sets the marker in the same transaction). GIL not needed. */
static int checksum_meta(EnvObject *e, MDB_txn *txn) {
    MDB_cursor *cur;
    int rc = M.cursor_open(txn, e->dbs[META_DB], &cur);
    if (rc != 0) return rc;
    MDB_val k, v;
    char key[512], *buf = NULL;
    size_t cap = 0;
    for (rc = M.cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = M.cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (is_checks_key(&k) || k.mv_size > sizeof key) continue;
        if (v.mv_size > cap) {
            char *nb = realloc(buf, v.mv_size);
            if (nb == NULL) {
                rc = ENOMEM;
                break;
            }
            buf = nb;
            cap = v.mv_size;
        }
        memcpy(key, k.mv_data, k.mv_size);
        memcpy(buf, v.mv_data, v.mv_size);
        MDB_val kk = {k.mv_size, key};
        rc = put_meta(e, txn, &kk, buf, v.mv_size, 1);
        if (rc != 0) break;
    }
    M.cursor_close(cur);
    free(buf);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* The step to store format 4, in `txn`: every META value gets its checksum, then the marker
 * that every entry has one is set (an empty state at creation, an older one after
 * check_entries has rewritten its entries). On failure *where names the call. */
static int mark_checked(EnvObject *e, MDB_txn *txn, const char **where) {
    MDB_val ck = {sizeof CHECKS_KEY - 1, (void *)CHECKS_KEY}, one = {1, "1"};
    *where = "checksumming the metadata";
    int rc = checksum_meta(e, txn);
    if (rc != 0) return rc;
    *where = "mdb_put (entry_checksums)";
    return M.put(txn, e->dbs[META_DB], &ck, &one, 0);
}

/* ---- IDEM values: a CRC-32C of key and value after the value (store format 6) ----
 *
 * An IDEM entry answers "was this idempotency key committed, and as which LSN?": a flipped bit
 * in one would make a new commit read as a retry of another and be dropped, acknowledged with
 * that commit's LSN, without a trace. So an entry is u64 LSN || u64 time_ms || CRC-32C(key ||
 * those 16 bytes), u32 LE. Entries of 16 bytes (written before format 6) are read as they are
 * until META "idem_checksums" says the upgrade (check_idem) has given every one its checksum;
 * from then on they are damage. Every write is checked, whatever the marker says. */

static uint32_t idem_crc(const void *k, size_t klen, const unsigned char *value16) {
    return wal_crc32c(wal_crc32c(0, k, klen), value16, IDEM_VALUE);
}

/* Is the IDEM entry (key `k`, value `v`) sound? Needs no GIL. */
static int idem_sound(const EnvObject *e, const MDB_val *k, const MDB_val *v) {
    const unsigned char *b = v->mv_data;
    if (v->mv_size == IDEM_CHECKED) return idem_crc(k->mv_data, k->mv_size, b) == wal_get_u32(b + IDEM_VALUE);
    return v->mv_size == IDEM_VALUE && !e->require_idem_checks;
}

/* What is wrong with an unsound IDEM entry of `size` bytes. */
static const char *idem_damage(size_t size) {
    return size == IDEM_CHECKED ? "an idempotency entry whose checksum does not match"
           : size == IDEM_VALUE ? "an idempotency entry without a checksum"
                                : "an idempotency entry of the wrong size";
}

/* The IDEM value `v` of key `k` checked and cut to its 16 bytes (in place); -1 with an
 * LmdbError set (E_CHECKSUM) if it is damaged. */
static int idem_value(const EnvObject *e, const MDB_val *k, MDB_val *v) {
    if (!idem_sound(e, k, v)) {
        set_entry_damage(E_CHECKSUM, k, idem_damage(v->mv_size));
        return -1;
    }
    v->mv_size = IDEM_VALUE;
    return 0;
}

/* The 20 bytes of a checked IDEM value for key `k` (klen bytes), LSN `lsn`, commit time `t`. */
static void idem_checked_value(unsigned char out[IDEM_CHECKED], const void *k, size_t klen, uint64_t lsn,
                               uint64_t t) {
    wal_put_u64(out, lsn);
    wal_put_u64(out + 8, t);
    wal_put_u32(out + IDEM_VALUE, idem_crc(k, klen, out));
}

/* Set META "idem_checksums" in `txn` (a checked META value: only in a state that requires checks). */
static int mark_idem_checked(EnvObject *e, MDB_txn *txn, const char **where) {
    MDB_val ck = {sizeof IDEM_CHECKS_KEY - 1, (void *)IDEM_CHECKS_KEY};
    *where = "mdb_put (idem_checksums)";
    return put_meta(e, txn, &ck, "1", 1, 1);
}

/* The DATA entry `v` of key `k`, read in `txn`, checked and taken apart: 0 with *version and
 * *value (new bytes: the user's value), -1 with an LmdbError set -- a checksum that does not
 * match (E_CHECKSUM), a flagged value without its tail or too short to be an entry
 * (E_BAD_VALUE), an entry without a checksum in a state that requires them (E_CHECKSUM), or a
 * split value this handle cannot see (E_NO_TAILS). */
static int read_entry(const EnvObject *e, MDB_txn *txn, const MDB_val *k, const MDB_val *v, uint64_t *version,
                      PyObject **value) {
    const unsigned char *head = v->mv_data;
    if (v->mv_size < 8) {
        set_entry_damage(E_BAD_VALUE, k, "an entry shorter than its 8-byte version");
        return -1;
    }
    unsigned char flags = head[7] & VERSION_FLAGS;
    uint64_t ver = wal_get_u64(head) & ~((uint64_t)VERSION_FLAGS << 56);
    MDB_val tail = {0, NULL};
    if (flags & SPLIT_FLAG) {
        if (!e->has_tail) {
            set_own_error(E_NO_TAILS, "the state stores split values (store format 3) since this read-only handle "
                                      "opened it; open the store again to read them");
            return -1;
        }
        MDB_val kk = *k;
        int rc = M.get(txn, e->dbs[DB_TAIL], &kk, &tail);
        if (rc == MDB_NOTFOUND) {
            set_entry_damage(E_BAD_VALUE, k, "stored split but its tail is missing");
            return -1;
        }
        if (rc != 0) {
            set_error(rc, "mdb_get");
            return -1;
        }
    }
    size_t at = 8;
    if (flags & CHECKED_FLAG) {
        if (v->mv_size < ENTRY_HEAD) {
            set_entry_damage(E_BAD_VALUE, k, "an entry shorter than its version and checksum");
            return -1;
        }
        uint32_t want = wal_get_u32(head + 8);
        uint32_t got = entry_crc(k, ver, head + ENTRY_HEAD, v->mv_size - ENTRY_HEAD, tail.mv_data, tail.mv_size);
        if (want != got) {
            char what[160];
            snprintf(what, sizeof what, "checksum mismatch (stored %08x, computed %08x over the key, version %llu "
                     "and %zu value bytes)", want, got, (unsigned long long)ver,
                     v->mv_size - ENTRY_HEAD + tail.mv_size);
            set_entry_damage(E_CHECKSUM, k, what);
            return -1;
        }
        at = ENTRY_HEAD;
    } else if (e->require_checks) {
        set_entry_damage(E_CHECKSUM, k, "an entry without a checksum in a state whose every entry has one");
        return -1;
    }
    size_t n1 = v->mv_size - at;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n1 + tail.mv_size));
    if (out == NULL) return -1;
    char *dst = PyBytes_AS_STRING(out);
    memcpy(dst, head + at, n1);
    if (tail.mv_size) memcpy(dst + n1, tail.mv_data, tail.mv_size);
    *version = ver;
    *value = out;
    return 0;
}

/* A read in a transaction, from the call's arguments after the db: what Env and Snapshot
 * share (env_read, snap_read). */
typedef PyObject *(*txn_reader)(const EnvObject *e, MDB_txn *txn, int db, PyObject *const *args);

/* The DATA entry of `key` in `txn`: 1 found (*version, *value), 0 absent, -1 error set. */
static int get_entry(const EnvObject *e, MDB_txn *txn, PyObject *key, uint64_t *version, PyObject **value) {
    MDB_val k = {(size_t)PyBytes_GET_SIZE(key), PyBytes_AS_STRING(key)}, v;
    int rc = M.get(txn, e->dbs[DB_DATA], &k, &v);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc != 0) {
        set_error(rc, "mdb_get");
        return -1;
    }
    return read_entry(e, txn, &k, &v, version, value) < 0 ? -1 : 1;
}

/* get in `txn` (args: key): for DATA (version, value) or None; for the others bytes or None. */
static PyObject *txn_get(const EnvObject *e, MDB_txn *txn, int db, PyObject *const *args) {
    PyObject *key = args[0];
    if (!PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "key must be bytes");
        return NULL;
    }
    if (db == DB_DATA) {
        uint64_t version;
        PyObject *value;
        int found = get_entry(e, txn, key, &version, &value);
        if (found <= 0) {
            if (found == 0) Py_RETURN_NONE;
            return NULL;
        }
        return Py_BuildValue("(KN)", (unsigned long long)version, value);
    }
    MDB_val k = {(size_t)PyBytes_GET_SIZE(key), PyBytes_AS_STRING(key)}, v;
    int rc = M.get(txn, e->dbs[db], &k, &v);
    if (rc == MDB_NOTFOUND) Py_RETURN_NONE;
    if (rc != 0) {
        set_error(rc, "mdb_get");
        return NULL;
    }
    if (db == META_DB && meta_value(e, &k, &v) < 0) return NULL;
    if (db == DB_IDEM && idem_value(e, &k, &v) < 0) return NULL;
    return value_bytes(&v);
}

/* (db, ...) -> read(...) in a spare read transaction of the environment. */
static PyObject *env_read(EnvObject *self, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                          const char *usage, txn_reader read) {
    int db;
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (usable(self) < 0 || db_index(args[0], &db) < 0) return NULL;
    MDB_txn *txn;
    int rc = read_begin(self, &txn);
    if (rc != 0) {
        set_error(rc, "mdb_txn_begin");
        return NULL;
    }
    PyObject *out = read(self, txn, db, args + 1);
    read_end(self, txn);
    return out;
}

static PyObject *env_get(EnvObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return env_read(self, args, nargs, 2, "get takes (db, key)", txn_get);
}

/* Up to `limit` items of database `db` in key order, keys starting with `prefix` and greater
 * than `after` (NULL: from the prefix on). DATA items are checked entries: (key, value), or
 * (key, version, value) with `versions`; the other databases' are (key, value) as stored. */
static PyObject *scan_items(const EnvObject *e, MDB_txn *txn, int db, PyObject *prefix, PyObject *after,
                            Py_ssize_t limit, int versions) {
    PyObject *out = PyList_New(0);
    if (out == NULL || limit <= 0) return out;
    MDB_cursor *cur;
    int rc = M.cursor_open(txn, e->dbs[db], &cur);
    if (rc != 0) {
        Py_DECREF(out);
        set_error(rc, "mdb_cursor_open");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(prefix);
    size_t plen = (size_t)PyBytes_GET_SIZE(prefix);
    PyObject *start = after != NULL ? after : prefix;
    MDB_val k = {(size_t)PyBytes_GET_SIZE(start), PyBytes_AS_STRING(start)}, v;
    /* An empty key is not a valid LMDB key for MDB_SET_RANGE: start from the first. */
    rc = k.mv_size ? M.cursor_get(cur, &k, &v, MDB_SET_RANGE) : M.cursor_get(cur, &k, &v, MDB_FIRST);
    if (rc == 0 && after != NULL && k.mv_size == (size_t)PyBytes_GET_SIZE(after)
        && memcmp(k.mv_data, PyBytes_AS_STRING(after), k.mv_size) == 0)
        rc = M.cursor_get(cur, &k, &v, MDB_NEXT);
    while (rc == 0) {
        if (k.mv_size < plen || memcmp(k.mv_data, p, plen) != 0) break;
        /* one at a time: a failed check sets its own error, which must not be overwritten */
        uint64_t version = 0;
        PyObject *vb;
        if (db == DB_DATA) {
            if (read_entry(e, txn, &k, &v, &version, &vb) < 0) goto fail;
        } else {
            if (db == META_DB && meta_value(e, &k, &v) < 0) goto fail;
            if (db == DB_IDEM && idem_value(e, &k, &v) < 0) goto fail;
            vb = value_bytes(&v);
            if (vb == NULL) goto fail;
        }
        PyObject *kb = value_bytes(&k);
        PyObject *item = kb == NULL ? NULL
                         : db == DB_DATA && versions ? Py_BuildValue("(NKN)", kb, (unsigned long long)version, vb)
                                                     : PyTuple_Pack(2, kb, vb);
        if (!(db == DB_DATA && versions) || item == NULL) {
            Py_XDECREF(kb);
            Py_DECREF(vb);
        }
        if (item == NULL) goto fail;
        int err = PyList_Append(out, item);
        Py_DECREF(item);
        if (err < 0) goto fail;
        if (PyList_GET_SIZE(out) >= limit) break;
        rc = M.cursor_get(cur, &k, &v, MDB_NEXT);
    }
    M.cursor_close(cur);
    if (rc != 0 && rc != MDB_NOTFOUND) {
        Py_DECREF(out);
        set_error(rc, "mdb_cursor_get");
        return NULL;
    }
    return out;
fail:
    M.cursor_close(cur);
    Py_DECREF(out);
    return NULL;
}

/* scan in `txn` (args: prefix, after | None, limit): DATA items as (key, version, value). */
static PyObject *txn_scan(const EnvObject *e, MDB_txn *txn, int db, PyObject *const *args) {
    PyObject *prefix = args[0], *after = args[1];
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (!PyBytes_Check(prefix) || (after != Py_None && !PyBytes_Check(after))) {
        PyErr_SetString(PyExc_TypeError, "scan takes (db, prefix: bytes, after: bytes | None, limit: int)");
        return NULL;
    }
    return scan_items(e, txn, db, prefix, after == Py_None ? NULL : after, limit, 1);
}

static PyObject *env_scan(EnvObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return env_read(self, args, nargs, 4, "scan takes (db, prefix, after, limit)", txn_scan);
}

/* put(db, key, value): one write transaction, committed. */
static PyObject *env_put(EnvObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int db;
    if (nargs != 3 || !PyBytes_Check(args[1]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "put takes (db, key: bytes, value: bytes)");
        return NULL;
    }
    if (writable(self) < 0 || db_index(args[0], &db) < 0) return NULL;
    MDB_val k = {(size_t)PyBytes_GET_SIZE(args[1]), PyBytes_AS_STRING(args[1])};
    MDB_val v = {(size_t)PyBytes_GET_SIZE(args[2]), PyBytes_AS_STRING(args[2])};
    if (db == DB_DATA && (v.mv_size < 8 || (((unsigned char *)v.mv_data)[7] & VERSION_FLAGS))) {
        PyErr_SetString(PyExc_ValueError, "a DATA value is a u64 LE version below 2^62 and then the value");
        return NULL;
    }
    unsigned char idem[IDEM_CHECKED];
    if (db == DB_IDEM) { /* stored with its checksum, as apply stores it */
        if (v.mv_size != IDEM_VALUE) {
            PyErr_SetString(PyExc_ValueError, "an IDEM value is a u64 LE LSN and a u64 LE time_ms");
            return NULL;
        }
        const unsigned char *raw = v.mv_data;
        idem_checked_value(idem, k.mv_data, k.mv_size, wal_get_u64(raw), wal_get_u64(raw + 8));
        v = (MDB_val){IDEM_CHECKED, idem};
    }
    MDB_dbi dbi = self->dbs[db];
    MDB_txn *txn = NULL;
    MDB_cursor *cur = NULL;
    const char *where = "mdb_txn_begin";
    int rc;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = M.txn_begin(self->env, NULL, 0, &txn);
    if (rc == 0 && db == DB_DATA) {
        rc = M.cursor_open(txn, dbi, &cur);
        where = "mdb_cursor_open";
        if (rc == 0) {
            rc = put_data(self, txn, cur, &k, &v, &where);
            M.cursor_close(cur);
        }
    } else if (rc == 0 && db == META_DB) {
        rc = put_meta(self, txn, &k, v.mv_data, v.mv_size, meta_checked(self, &k));
        where = "mdb_put";
    } else if (rc == 0) {
        rc = M.put(txn, dbi, &k, &v, 0);
        where = "mdb_put";
    }
    if (txn != NULL) {
        if (rc == 0) {
            rc = M.txn_commit(txn);
            where = "mdb_txn_commit";
        } else {
            M.txn_abort(txn);
        }
    }
    Py_END_ALLOW_THREADS
    self->busy--;
    if (rc != 0) {
        set_error(rc, where);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* load_snapshot(buffer, offset, count, max_bytes, append) -> (offset after, entries put)
 * The entries of an archive snapshot (FORMAT.md §18, "Snapshot": klen:u32 vlen:u32 version:u64
 * crc:u32 key value), checked whole beforehand (wal_snapshot_check, wal/archive/layout.py
 * `open_snapshot`), put into DATA from buffer[offset] on in ONE write transaction, the GIL
 * released: at most `count` entries, ending with the one that brings the key and value bytes
 * put to `max_bytes` (a transaction's dirty pages stay bounded however large the snapshot).
 * Each entry gets the state's own checksum, as any put. append: the keys strictly increase
 * and none in DATA sorts after them (a snapshot's entries into a new state): MDB_APPEND, which
 * fills each leaf page before it starts the next and searches nothing; out-of-order keys then
 * fail (MDB_KEYEXIST), nothing committed. No META is touched: applied_lsn stays as it is, for
 * the caller (restore) to set once every entry is in, in a store nobody opens before that.
 * A malformed entry (cut off, a version with flag bits) is ValueError, nothing committed. */
static PyObject *env_load_snapshot(EnvObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "load_snapshot takes (buffer, offset, count, max_bytes, append)");
        return NULL;
    }
    unsigned long long off = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long count = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long max_bytes = PyLong_AsUnsignedLongLong(args[3]);
    int append = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || append < 0 || writable(self) < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *buf = view.buf;
    uint64_t size = (uint64_t)view.len, done = 0, bytes = 0;
    int rc = 0, malformed = 0;
    const char *where = "mdb_txn_begin";
    MDB_txn *txn = NULL;
    MDB_cursor *cur = NULL;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = begin_write_cursor(self, self->dbs[DB_DATA], &txn, &cur, &where);
    while (rc == 0 && done < count && bytes < max_bytes) {
        uint32_t klen, vlen;
        if (off > size || size - off < 20) {
            malformed = 1;
            break;
        }
        memcpy(&klen, buf + off, 4);
        memcpy(&vlen, buf + off + 4, 4);
        uint64_t version = wal_get_u64(buf + off + 8), start = off + 20;
        if ((uint64_t)klen + vlen > size - start || (version >> 56) & VERSION_FLAGS) {
            malformed = 1;
            break;
        }
        MDB_val k = {klen, (void *)(buf + start)};
        rc = put_entry_as(self, txn, cur, &k, version, (const char *)buf + start + klen, vlen,
                          append ? MDB_APPEND : 0, &where);
        off = start + klen + vlen;
        bytes += (uint64_t)klen + vlen;
        done++;
    }
    if (cur != NULL) M.cursor_close(cur);
    if (txn != NULL) {
        if (rc == 0 && !malformed) {
            rc = M.txn_commit(txn); /* no fsync: MDB_NOSYNC; the restore syncs the state at its end */
            where = "mdb_txn_commit";
        } else {
            M.txn_abort(txn);
        }
    }
    Py_END_ALLOW_THREADS
    self->busy--;
    PyBuffer_Release(&view);
    if (malformed) {
        PyErr_Format(PyExc_ValueError, "load_snapshot: entry %llu at offset %llu is cut off or has a bad version",
                     (unsigned long long)done, (unsigned long long)off);
        return NULL;
    }
    if (rc != 0) {
        set_error(rc, where);
        return NULL;
    }
    return Py_BuildValue("(KK)", (unsigned long long)off, (unsigned long long)done);
}

static PyObject *env_sync(EnvObject *self, PyObject *arg) {
    int force = PyObject_IsTrue(arg);
    if (force < 0 || usable(self) < 0) return NULL;
    int rc;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = M.env_sync(self->env, force);
    Py_END_ALLOW_THREADS
    self->busy--;
    if (rc != 0) {
        set_error(rc, "mdb_env_sync");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* stat() -> (entries of data, page size, last page number). */
static PyObject *env_stat(EnvObject *self, PyObject *unused) {
    (void)unused;
    if (usable(self) < 0) return NULL;
    MDB_txn *txn;
    MDB_stat st, est;
    MDB_envinfo info;
    int rc = read_begin(self, &txn);
    const char *where = "mdb_txn_begin";
    if (rc == 0) {
        rc = M.stat(txn, self->dbs[0], &st);
        where = "mdb_stat";
        read_end(self, txn);
    }
    if (rc == 0) {
        rc = M.env_info(self->env, &info);
        where = "mdb_env_info";
    }
    if (rc == 0) {
        rc = M.env_stat(self->env, &est);
        where = "mdb_env_stat";
    }
    if (rc != 0) {
        set_error(rc, where);
        return NULL;
    }
    return Py_BuildValue("(nIn)", (Py_ssize_t)st.ms_entries, est.ms_psize, (Py_ssize_t)info.me_last_pgno);
}

/* expire_idempotency(older_than_ms) -> removed: in one write transaction, delete every
 * idem entry (u64 LSN + u64 commit time ms, checked: idem_value) whose time is below the bound.
 * A damaged entry stops it (nothing deleted) with the error a read of it raises. */
static PyObject *env_expire(EnvObject *self, PyObject *arg) {
    unsigned long long bound = PyLong_AsUnsignedLongLong(arg);
    if (bound == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (writable(self) < 0) return NULL;
    MDB_dbi dbi = self->dbs[1];
    MDB_txn *txn = NULL;
    MDB_cursor *cur = NULL;
    char *keys = NULL; /* expired keys, each as size_t length + bytes: deleted after the walk */
    size_t used = 0, cap = 0, removed = 0;
    const char *where = "mdb_txn_begin";
    char bad_key[512];
    size_t bad_len = 0, bad_size = 0; /* bad_size: the damaged entry's size + 1; 0: none found */
    int rc;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = begin_write_cursor(self, dbi, &txn, &cur, &where);
    if (rc == 0) {
        MDB_val k, v;
        where = "mdb_cursor_get";
        for (rc = M.cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = M.cursor_get(cur, &k, &v, MDB_NEXT)) {
            if (!idem_sound(self, &k, &v)) { /* reported once the GIL is back */
                bad_size = v.mv_size + 1;
                bad_len = k.mv_size < sizeof bad_key ? k.mv_size : sizeof bad_key;
                memcpy(bad_key, k.mv_data, bad_len);
                break;
            }
            if (wal_get_u64((const uint8_t *)v.mv_data + 8) >= bound) continue;
            if (used + sizeof(size_t) + k.mv_size > cap) {
                size_t ncap = cap ? cap * 2 : 4096;
                while (ncap < used + sizeof(size_t) + k.mv_size) ncap *= 2;
                char *n = realloc(keys, ncap);
                if (n == NULL) {
                    rc = ENOMEM;
                    where = "collecting expired idempotency keys";
                    break;
                }
                keys = n;
                cap = ncap;
            }
            memcpy(keys + used, &k.mv_size, sizeof(size_t));
            memcpy(keys + used + sizeof(size_t), k.mv_data, k.mv_size);
            used += sizeof(size_t) + k.mv_size;
        }
        if (rc == MDB_NOTFOUND) rc = 0;
        M.cursor_close(cur);
    }
    for (size_t off = 0; rc == 0 && !bad_size && off < used; removed++) {
        MDB_val k;
        memcpy(&k.mv_size, keys + off, sizeof(size_t));
        k.mv_data = keys + off + sizeof(size_t);
        off += sizeof(size_t) + k.mv_size;
        rc = M.del(txn, dbi, &k, NULL);
        where = "mdb_del";
    }
    if (txn != NULL) {
        if (rc == 0 && !bad_size) {
            rc = M.txn_commit(txn);
            where = "mdb_txn_commit";
        } else {
            M.txn_abort(txn);
        }
    }
    Py_END_ALLOW_THREADS
    self->busy--;
    free(keys);
    if (bad_size) {
        MDB_val k = {bad_len, bad_key};
        set_entry_damage(E_CHECKSUM, &k, idem_damage(bad_size - 1));
        return NULL;
    }
    if (rc != 0) {
        set_error(rc, where);
        return NULL;
    }
    return PyLong_FromSize_t(removed);
}

/* The items of a batch, checked and owned before the GIL is released. */
typedef struct {
    PyObject *puts, *deletes, *idem; /* tuples (own references: their items cannot go away) */
    unsigned char *idem_values;      /* IDEM_CHECKED bytes per idempotency item (idem_checked_value) */
} batch_items;

static void batch_release(batch_items *b) {
    Py_XDECREF(b->puts);
    Py_XDECREF(b->deletes);
    Py_XDECREF(b->idem);
    PyMem_Free(b->idem_values);
}

static int batch_take(batch_items *b, PyObject *puts, PyObject *deletes, PyObject *idem) {
    memset(b, 0, sizeof *b);
    /* Tuples: for a list, a shallow copy (one pointer each) that pins every item even if
     * some other thread changed the list while the GIL is released. */
    b->puts = PySequence_Tuple(puts);
    b->deletes = b->puts ? PySequence_Tuple(deletes) : NULL;
    b->idem = b->deletes ? PySequence_Tuple(idem) : NULL;
    if (b->idem == NULL) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(b->puts); i++) {
        PyObject *it = PyTuple_GET_ITEM(b->puts, i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(it, 0))
            || !PyBytes_Check(PyTuple_GET_ITEM(it, 1))) {
            PyErr_SetString(PyExc_TypeError, "apply: each put must be a (key: bytes, value: bytes) tuple");
            return -1;
        }
        PyObject *v = PyTuple_GET_ITEM(it, 1);
        if (PyBytes_GET_SIZE(v) < 8 || ((unsigned char)PyBytes_AS_STRING(v)[7] & VERSION_FLAGS)) {
            PyErr_SetString(PyExc_ValueError, "apply: a put's value is a u64 LE version below 2^62 and then the value");
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(b->deletes); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(b->deletes, i))) {
            PyErr_SetString(PyExc_TypeError, "apply: each delete must be a key (bytes)");
            return -1;
        }
    }
    Py_ssize_t n = PyTuple_GET_SIZE(b->idem);
    b->idem_values = PyMem_Malloc(n ? (size_t)n * IDEM_CHECKED : 1);
    if (b->idem_values == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyTuple_GET_ITEM(b->idem, i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 3 || !PyBytes_Check(PyTuple_GET_ITEM(it, 0))) {
            PyErr_SetString(PyExc_TypeError, "apply: each idempotency item must be a (key: bytes, lsn, time_ms) tuple");
            return -1;
        }
        unsigned long long lsn = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(it, 1));
        if (lsn == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        unsigned long long t = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(it, 2));
        if (t == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        PyObject *key = PyTuple_GET_ITEM(it, 0);
        idem_checked_value(b->idem_values + IDEM_CHECKED * i, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
                           lsn, t);
    }
    return 0;
}

static MDB_val bytes_val(PyObject *b) { return (MDB_val){(size_t)PyBytes_GET_SIZE(b), PyBytes_AS_STRING(b)}; }

/* ---- The order of a batch's puts: full leaf pages for large entries ----
 * LMDB splits a full leaf page near its middle, or, for an insert at the page's end, leaves
 * all but one node on the old page (mdb_page_split). A page that holds at most three entries
 * (each of ~1 KiB and more, up to where a value moves to overflow pages) is then left with
 * two after every split -- and keys appended in order, an agent's steps under its prefix or a
 * bulk load, split page after page: the state's pages in use reach 2x the live data (three
 * such entries fill a page; two leave a third of it empty for good, as overwrites of the same
 * size never move nodes). So the puts go in key order in two passes: first the "skeleton",
 * every key but the middle one of each run of three such keys (the first of a run of two,
 * where a page holds two), whose in-order inserts split pages into two nodes each; then the
 * keys left out, each of which lands, between two skeleton keys, on a page with room for
 * exactly it. New keys in order then fill their pages (2.99 of 3 entries per page for 1 KiB
 * values, measured, against 2.0), and keys already present are overwritten in place as in
 * any order. The order of a transaction's puts of distinct keys changes nothing a reader can
 * see; it is the writer's choice alone, like split_tail's. */
#define LEAF_NODE_HEAD 8 /* LMDB 0.9's leaf node header: flags, sizes */

typedef struct {
    const char *key;
    size_t klen;
    size_t room; /* bytes of a leaf page the entry takes: node and index slot */
    Py_ssize_t item;
} put_slot;

static int put_slot_cmp(const void *a, const void *b) { /* LMDB's default order: bytes, then length */
    const put_slot *x = a, *y = b;
    int c = memcmp(x->key, y->key, x->klen < y->klen ? x->klen : y->klen);
    return c ? c : (x->klen > y->klen) - (x->klen < y->klen);
}

/* Bytes of a leaf page a DATA entry of key size `klen` and value `vlen` (without its version)
 * takes: as mdb_leaf_size and mdb_node_add count it, a value that goes to overflow pages
 * leaving a page number in the node. */
static size_t leaf_room(const EnvObject *e, size_t klen, size_t vlen) {
    size_t total = ENTRY_HEAD + vlen, stored = total - split_tail(e, total);
    size_t nodemax = (((e->psize - PAGE_HEADER) / 2) & ~(size_t)1) - 2; /* LMDB's me_nodemax */
    size_t node = LEAF_NODE_HEAD + klen + stored;
    if (node >= nodemax) node = LEAF_NODE_HEAD + klen + 8;
    return node + (node & 1) + 2;
}

static size_t max_room(const put_slot *s, size_t n) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) m = s[i].room > m ? s[i].room : m;
    return m;
}

/* The order to put b's items in: indexes into b->puts, skeleton first; NULL (commit order) if
 * there is no run of large entries or no memory. */
static Py_ssize_t *put_order(const EnvObject *e, const batch_items *b) {
    Py_ssize_t n = PyTuple_GET_SIZE(b->puts);
    size_t pmax = e->psize - PAGE_HEADER;
    if (n < 2 || e->psize <= PAGE_HEADER) return NULL;
    put_slot *s = malloc((size_t)n * sizeof *s);
    Py_ssize_t *order = malloc((size_t)n * sizeof *order);
    unsigned char *gap = calloc((size_t)n, 1);
    if (s == NULL || order == NULL || gap == NULL) goto none;
    int large = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyTuple_GET_ITEM(b->puts, i);
        PyObject *k = PyTuple_GET_ITEM(it, 0), *v = PyTuple_GET_ITEM(it, 1);
        s[i] = (put_slot){PyBytes_AS_STRING(k), (size_t)PyBytes_GET_SIZE(k),
                          leaf_room(e, (size_t)PyBytes_GET_SIZE(k), (size_t)PyBytes_GET_SIZE(v) - 8), i};
        large |= pmax / s[i].room <= 3;
    }
    if (!large) goto none;
    qsort(s, (size_t)n, sizeof *s, put_slot_cmp);
    /* Reordering is only sound for distinct keys (the materializer's batches are collapsed to each
     * key's last write); a batch that writes a key twice keeps its order, so its last write wins. */
    for (Py_ssize_t i = 1; i < n; i++)
        if (put_slot_cmp(s + i - 1, s + i) == 0) goto none;
    for (Py_ssize_t i = 0; i < n;) {
        if (i + 2 < n && pmax / max_room(s + i, 3) == 3) {
            gap[i + 1] = 1;
            i += 3;
        } else if (i + 1 < n && pmax / max_room(s + i, 2) == 2) {
            gap[i] = 1;
            i += 2;
        } else {
            i++;
        }
    }
    Py_ssize_t j = 0;
    for (int pass = 0; pass < 2; pass++)
        for (Py_ssize_t i = 0; i < n; i++)
            if (gap[i] == pass) order[j++] = s[i].item;
    free(s);
    free(gap);
    return order;
none:
    free(s);
    free(order);
    free(gap);
    return NULL;
}

/* Write the batch's items in `txn`. GIL released: reads only the owned, immutable items. */
static int write_items(EnvObject *e, MDB_txn *txn, const batch_items *b, const char **where) {
    MDB_cursor *cur;
    int rc = M.cursor_open(txn, e->dbs[DB_DATA], &cur);
    *where = "mdb_cursor_open";
    if (rc != 0) return rc;
    /* The materializer's batches hold each key's last write only (collapsed in C,
     * wal/log/record.py): distinct keys, written in put_order's order when it gives one. */
    Py_ssize_t *order = put_order(e, b);
    for (Py_ssize_t i = 0; rc == 0 && i < PyTuple_GET_SIZE(b->puts); i++) {
        PyObject *it = PyTuple_GET_ITEM(b->puts, order != NULL ? order[i] : i);
        MDB_val k = bytes_val(PyTuple_GET_ITEM(it, 0)), v = bytes_val(PyTuple_GET_ITEM(it, 1));
        rc = put_data(e, txn, cur, &k, &v, where);
    }
    free(order);
    M.cursor_close(cur);
    if (rc != 0) return rc;
    *where = "mdb_del";
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(b->deletes); i++) {
        MDB_val k = bytes_val(PyTuple_GET_ITEM(b->deletes, i));
        rc = M.del(txn, e->dbs[DB_DATA], &k, NULL);
        if (rc == 0) rc = del_tail(e, txn, &k);
        if (rc != 0 && rc != MDB_NOTFOUND) return rc; /* deleting an absent key is no change */
    }
    *where = "mdb_put";
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(b->idem); i++) {
        MDB_val k = bytes_val(PyTuple_GET_ITEM(PyTuple_GET_ITEM(b->idem, i), 0));
        MDB_val v = {IDEM_CHECKED, b->idem_values + IDEM_CHECKED * i};
        rc = M.put(txn, e->dbs[DB_IDEM], &k, &v, 0);
        if (rc != 0) return rc;
    }
    return 0;
}

/* put_idem(items) -> None: every (key, lsn, time_ms) of `items` into IDEM, checked, in ONE write
 * transaction that touches nothing else (applied_lsn included): a restore loads a snapshot's
 * idempotency entries a bounded chunk at a time, before the transaction that sets applied_lsn.
 * GIL released around the transaction. */
static PyObject *env_put_idem(EnvObject *self, PyObject *items) {
    if (writable(self) < 0) return NULL;
    PyObject *none = PyTuple_New(0);
    if (none == NULL) return NULL;
    batch_items b;
    int took = batch_take(&b, none, none, items);
    Py_DECREF(none);
    if (took < 0) {
        batch_release(&b);
        return NULL;
    }
    MDB_txn *txn = NULL;
    const char *where = "mdb_txn_begin";
    int rc;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = M.txn_begin(self->env, NULL, 0, &txn);
    if (rc == 0) rc = write_items(self, txn, &b, &where);
    rc = end_write(txn, rc, &where); /* the restore syncs the state at its end */
    Py_END_ALLOW_THREADS
    self->busy--;
    batch_release(&b);
    if (rc != 0) {
        set_error(rc, where);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- DurableLsn: the log's durable LSN, readable without the GIL ---- */

/* wal_log_watermarks (native/wal.h): out[0..3) = appended, written, durable; it only takes the
 * log's own mutex, which no thread holds while it waits for the GIL or for LMDB. */
typedef int (*watermarks_fn)(void *log, uint64_t *out);

typedef struct {
    PyObject_HEAD
    watermarks_fn fn;
    void *log;
    PyObject *owner; /* the wal.Log: its C handle lives as long as this object (wal/log/log.py) */
} DurableObject;

static PyTypeObject DurableType;

static uint64_t durable_read(DurableObject *d) {
    uint64_t out[3] = {0, 0, 0};
    (void)d->fn(d->log, out); /* a failed or closed log still reports the LSN it made durable */
    return out[2];
}

static int durable_init(DurableObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"watermarks_address", "handle_address", "owner", NULL};
    unsigned long long fn, log;
    PyObject *owner;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KKO", kwlist, &fn, &log, &owner)) return -1;
    if (fn == 0 || log == 0) {
        PyErr_SetString(PyExc_ValueError, "DurableLsn needs the addresses of wal_log_watermarks and of a live log");
        return -1;
    }
    self->fn = (watermarks_fn)(uintptr_t)fn;
    self->log = (void *)(uintptr_t)log;
    Py_INCREF(owner);
    Py_XSETREF(self->owner, owner);
    return 0;
}

static void durable_dealloc(DurableObject *self) {
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *durable_call(DurableObject *self, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "DurableLsn() takes no arguments");
        return NULL;
    }
    if (self->fn == NULL) {
        PyErr_SetString(PyExc_ValueError, "DurableLsn was not initialised");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(durable_read(self));
}

static PyTypeObject DurableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wal._lmdbcall.DurableLsn",
    .tp_basicsize = sizeof(DurableObject),
    .tp_dealloc = (destructor)durable_dealloc,
    .tp_call = (ternaryfunc)durable_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DurableLsn(watermarks_address, handle_address, owner)() -> the log's durable LSN; apply reads it "
              "without the GIL",
    .tp_init = (initproc)durable_init,
    .tp_new = PyType_GenericNew,
};

static const char APPLIED_KEY[] = "applied_lsn";
static const char DURABLE_SEEN_KEY[] = "durable_seen";

/* apply(batch, durable_lsn, background=False) -> (status, lsn). batch = (first, last, commits,
 * puts, deletes, idempotency) as wal/log/record.py's Collapsed. In ONE write transaction:
 *   - read applied_lsn; a batch wholly at or below it changes nothing: (APPLY_OK, applied);
 *   - I3: first == applied + 1 and commits == last - first + 1, else (APPLY_GAP, applied);
 *   - write every put, delete and idempotency item;
 *   - I1: durable = durable_lsn(), read right before the commit; last > durable gives
 *     (APPLY_NOT_DURABLE, durable) and nothing is committed. A DurableLsn is read in C
 *     without the GIL; any other callable is called with the GIL taken back (the one
 *     point where apply needs it: taking it back from a thread busy in Python costs up
 *     to a switch interval, 5 ms by default, which is why the store passes a DurableLsn);
 *   - write applied_lsn = last and durable_seen = durable, commit: (APPLY_OK, last).
 * Everything but a Python durable_lsn() call runs with the GIL released.
 *
 * background: run the transaction in a thread of its own at the lowest CPU priority (nice
 * APPLY_NICE), the caller waiting for it with the GIL released. Why: on a machine with few
 * cores a committer woken by its fdatasync otherwise waits for the materializer's time slice
 * (docs/performance.md: one thread's p99 at sync ~570 -> ~340 us). That thread takes no
 * lock anything else needs at once: never the GIL, and not the log's mutex either -- the
 * durable LSN is read by the caller before the thread starts (durable LSNs only grow, so an
 * earlier read is as good a bound for I1, and the batch was taken below a still earlier one).
 * What it does hold is LMDB's writer lock, and the store holds its apply lock around the call:
 * a starved transaction delays whoever waits for those (a committer helping with a backlog, a
 * checkpoint, close), for one batch, which the store keeps small (wal/store/store.py). Needs a
 * DurableLsn (that thread cannot call Python); otherwise, or if the thread cannot be created,
 * the transaction runs in the calling thread as without it. */

/* The GIL-free part of one apply: a write transaction begun and ended by one thread (LMDB's
 * writer lock belongs to the thread that took it). */
typedef struct {
    EnvObject *self;
    const batch_items *b;
    unsigned long long first, last, commits;
    DurableObject *durable_c;  /* the log's durable LSN, read in C; or NULL: */
    PyObject *durable_py;      /* a Python callable, called with the GIL taken back */
    PyThreadState *ts;         /* the caller's, for that call (the calling thread only) */
    int durable_read_before;   /* durable_pre holds durable_c's value, read before the job */
    unsigned long long durable_pre;
    int rc, status, bad_applied, py_failed, lowered;
    uint64_t result;
    const char *where;
} apply_job;

#define APPLY_NICE 19
#define BAD_APPLIED_CRC 100000 /* apply_job.bad_applied: applied_lsn's checksum does not match */

static void apply_job_run(apply_job *j) {
    EnvObject *self = j->self;
    MDB_txn *txn = NULL;
    uint64_t applied = 0;
    MDB_val ak = {sizeof APPLIED_KEY - 1, (void *)APPLIED_KEY};
    int rc = M.txn_begin(self->env, NULL, 0, &txn);
    j->where = "mdb_txn_begin";
    if (rc == 0) {
        MDB_val av;
        rc = M.get(txn, self->dbs[2], &ak, &av);
        j->where = "mdb_get";
        int checked = meta_checked(self, &ak);
        if (rc == MDB_NOTFOUND) {
            rc = 0;
        } else if (rc == 0 && checked && (av.mv_size < 4 || meta_crc(&ak, av.mv_data, av.mv_size - 4)
                                                            != wal_get_u32((const uint8_t *)av.mv_data + av.mv_size - 4))) {
            j->bad_applied = BAD_APPLIED_CRC;
        } else if (rc == 0 && av.mv_size != (checked ? 12u : 8u)) {
            size_t n = av.mv_size - (checked ? 4 : 0);
            j->bad_applied = (int)(n > 1000 ? 1000 : n) + 1;
        } else if (rc == 0) {
            applied = wal_get_u64(av.mv_data);
        }
    }
    int go_on = 0;
    if (rc == 0 && !j->bad_applied) {
        if (j->last <= applied) {
            j->status = APPLY_OK, j->result = applied; /* already in the state (I4): no change */
        } else if (j->first != applied + 1 || j->commits != j->last - j->first + 1) {
            j->status = APPLY_GAP, j->result = applied; /* I3 */
        } else {
            rc = write_items(self, txn, j->b, &j->where);
            go_on = rc == 0;
        }
    }
    if (!go_on) {
        if (txn != NULL) M.txn_abort(txn);
        j->rc = rc;
        return;
    }
    /* I1 log before state: never commit the effect of a record the log could still lose.
     * Checked right before the commit, with the durable LSN read there -- or, for a background
     * apply, read by the caller just before this thread started (see env_apply). */
    unsigned long long durable;
    if (j->durable_read_before) {
        durable = j->durable_pre; /* read by the caller (background: see env_apply) */
    } else if (j->durable_c != NULL) {
        durable = durable_read(j->durable_c); /* the GIL stays released */
    } else {
        PyEval_RestoreThread(j->ts);
        PyObject *d = PyObject_CallNoArgs(j->durable_py);
        durable = d != NULL ? PyLong_AsUnsignedLongLong(d) : 0;
        Py_XDECREF(d);
        j->py_failed = d == NULL || PyErr_Occurred() != NULL; /* the exception stays set */
        j->ts = PyEval_SaveThread();
        if (j->py_failed) {
            M.txn_abort(txn); /* no I/O, no waiting */
            return;
        }
    }
    if (j->last > durable) {
        M.txn_abort(txn);
        j->status = APPLY_NOT_DURABLE, j->result = durable;
        return;
    }
    unsigned char lv[8], dv[8];
    wal_put_u64(lv, j->last);
    wal_put_u64(dv, durable);
    MDB_val lval = {8, lv}, dk = {sizeof DURABLE_SEEN_KEY - 1, (void *)DURABLE_SEEN_KEY}, dval = {8, dv};
    j->where = "mdb_put";
    rc = put_meta(self, txn, &ak, lval.mv_data, 8, meta_checked(self, &ak));
    if (rc == 0) rc = put_meta(self, txn, &dk, dval.mv_data, 8, meta_checked(self, &dk));
    if (rc == 0) {
        rc = M.txn_commit(txn); /* no fsync: MDB_NOSYNC, the state is made durable at checkpoints */
        j->where = "mdb_txn_commit";
    } else {
        M.txn_abort(txn);
    }
    j->rc = rc;
    j->status = APPLY_OK, j->result = j->last;
}

static void *apply_job_thread(void *arg) {
    apply_job *j = arg;
    /* Asynchronous signals go to the process's other threads (Python handles them in the
     * main one); the faults of a bad page (SIGBUS, SIGSEGV) stay deliverable here. */
    sigset_t mask;
    sigfillset(&mask);
    sigdelset(&mask, SIGBUS);
    sigdelset(&mask, SIGSEGV);
    sigdelset(&mask, SIGFPE);
    sigdelset(&mask, SIGILL);
    pthread_sigmask(SIG_BLOCK, &mask, NULL);
    /* A thread's own nice value (Linux: setpriority of a thread id); raising it needs no
     * privilege. Not lowered: the transaction runs all the same, at the caller's priority. */
    j->lowered = setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), APPLY_NICE) == 0;
    apply_job_run(j);
    return NULL;
}

static PyObject *env_apply(EnvObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 6 ||
        !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "apply takes (batch: (first, last, commits, puts, deletes, idempotency), "
                                         "durable_lsn: callable, background: bool = False)");
        return NULL;
    }
    int background = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (background < 0 || writable(self) < 0) return NULL;
    PyObject *batch = args[0], *durable_fn = args[1];
    apply_job j = {.self = self};
    j.first = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(batch, 0));
    j.last = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(batch, 1));
    j.commits = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(batch, 2));
    if (PyErr_Occurred()) return NULL;
    if (Py_IS_TYPE(durable_fn, &DurableType) && ((DurableObject *)durable_fn)->fn != NULL)
        j.durable_c = (DurableObject *)durable_fn;
    else
        j.durable_py = durable_fn;
    batch_items b;
    if (batch_take(&b, PyTuple_GET_ITEM(batch, 3), PyTuple_GET_ITEM(batch, 4), PyTuple_GET_ITEM(batch, 5)) < 0) {
        batch_release(&b);
        return NULL;
    }
    j.b = &b;
    self->busy++;
    j.ts = PyEval_SaveThread();
    pthread_t worker;
    if (background && j.durable_c != NULL) {
        j.durable_pre = durable_read(j.durable_c);
        j.durable_read_before = 1;
    }
    if (j.durable_read_before && pthread_create(&worker, NULL, apply_job_thread, &j) == 0)
        pthread_join(worker, NULL);
    else
        apply_job_run(&j);
    PyEval_RestoreThread(j.ts);
    self->busy--;
    batch_release(&b);
    if (j.lowered) self->background_applies++;
    if (j.py_failed) return NULL;
    if (j.bad_applied) {
        if (j.bad_applied == BAD_APPLIED_CRC)
            set_own_error(E_CHECKSUM, "key b'applied_lsn': a metadata value whose checksum does not match");
        else
            set_bad_value("an applied_lsn of %d bytes, not 8", j.bad_applied - 1);
        return NULL;
    }
    if (j.rc != 0) {
        set_error(j.rc, j.where);
        return NULL;
    }
    return Py_BuildValue("(iK)", j.status, (unsigned long long)j.result);
}

/* verify() -> (entries, value bytes): walk every DATA entry in one read transaction and check
 * what a read cannot see alone: each entry's checksum (read_entry), that a lookup of its key
 * finds this very entry (a damaged branch page or page header could steer it elsewhere, making
 * the key read as absent), and that the walk met as many entries as the database records. Any
 * failure raises as a read would (E_CHECKSUM / E_BAD_VALUE / an LMDB code). GIL held. */
static PyObject *env_verify(EnvObject *self, PyObject *unused) {
    (void)unused;
    if (usable(self) < 0) return NULL;
    MDB_txn *txn;
    int rc = read_begin(self, &txn);
    if (rc != 0) {
        set_error(rc, "mdb_txn_begin");
        return NULL;
    }
    MDB_cursor *cur = NULL;
    MDB_stat st;
    size_t entries = 0, bytes = 0;
    const char *where = "mdb_stat";
    rc = M.stat(txn, self->dbs[DB_DATA], &st);
    if (rc == 0) {
        rc = M.cursor_open(txn, self->dbs[DB_DATA], &cur);
        where = "mdb_cursor_open";
    }
    MDB_val k, v;
    if (rc == 0) {
        where = "mdb_cursor_get";
        for (rc = M.cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = M.cursor_get(cur, &k, &v, MDB_NEXT)) {
            uint64_t version;
            PyObject *value;
            if (read_entry(self, txn, &k, &v, &version, &value) < 0) goto failed;
            bytes += (size_t)PyBytes_GET_SIZE(value);
            Py_DECREF(value);
            MDB_val kk = k, found;
            int got = M.get(txn, self->dbs[DB_DATA], &kk, &found);
            if (got != 0 || found.mv_data != v.mv_data || found.mv_size != v.mv_size) {
                set_entry_damage(E_BAD_VALUE, &k, got == MDB_NOTFOUND
                                                      ? "walked to, but a lookup of its key finds nothing (a damaged page)"
                                                      : "walked to, but a lookup of its key finds another entry");
                goto failed;
            }
            entries++;
        }
    }
    if (rc == MDB_NOTFOUND) rc = 0;
    if (rc == 0 && entries != st.ms_entries) {
        char what[128];
        snprintf(what, sizeof what, "the data database records %zu entries but a walk finds %zu (a damaged page)",
                 (size_t)st.ms_entries, entries);
        set_bad_value("%s", what);
        goto failed;
    }
    if (cur != NULL) M.cursor_close(cur);
    cur = NULL;
    if (rc == 0) { /* every metadata value's checksum */
        rc = M.cursor_open(txn, self->dbs[META_DB], &cur);
        where = "mdb_cursor_open";
        if (rc == 0) {
            where = "mdb_cursor_get";
            for (rc = M.cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = M.cursor_get(cur, &k, &v, MDB_NEXT))
                if (meta_value(self, &k, &v) < 0) goto failed;
            if (rc == MDB_NOTFOUND) rc = 0;
            M.cursor_close(cur);
            cur = NULL;
        }
    }
    if (rc == 0) { /* every idempotency entry's checksum, and that a lookup finds it */
        MDB_stat ist;
        size_t idem_entries = 0;
        rc = M.stat(txn, self->dbs[DB_IDEM], &ist);
        where = "mdb_stat";
        if (rc == 0) {
            rc = M.cursor_open(txn, self->dbs[DB_IDEM], &cur);
            where = "mdb_cursor_open";
        }
        if (rc == 0) {
            where = "mdb_cursor_get";
            for (rc = M.cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = M.cursor_get(cur, &k, &v, MDB_NEXT)) {
                MDB_val kk = k, found, checked = v;
                if (idem_value(self, &k, &checked) < 0) goto failed;
                int got = M.get(txn, self->dbs[DB_IDEM], &kk, &found);
                if (got != 0 || found.mv_data != v.mv_data) {
                    set_entry_damage(E_BAD_VALUE, &k, "an idempotency entry walked to, but a lookup of its key does "
                                                      "not find it (a damaged page)");
                    goto failed;
                }
                idem_entries++;
            }
            if (rc == MDB_NOTFOUND) rc = 0;
            M.cursor_close(cur);
            cur = NULL;
        }
        if (rc == 0 && idem_entries != ist.ms_entries) {
            char what[128];
            snprintf(what, sizeof what, "the idem database records %zu entries but a walk finds %zu (a damaged page)",
                     (size_t)ist.ms_entries, idem_entries);
            set_bad_value("%s", what);
            goto failed;
        }
    }
    read_end(self, txn);
    if (rc != 0) {
        set_error(rc, where);
        return NULL;
    }
    return Py_BuildValue("(nn)", (Py_ssize_t)entries, (Py_ssize_t)bytes);
failed:
    if (cur != NULL) M.cursor_close(cur);
    read_end(self, txn);
    return NULL;
}

/* Put `cur` on the first item whose key is greater than `after` (bytes; None: the first item),
 * with its key and value in *k and *v; MDB_NOTFOUND if there is none. GIL not needed (`after`
 * is only read). */
static int cursor_after(MDB_cursor *cur, PyObject *after, MDB_val *k, MDB_val *v) {
    if (after == Py_None) return M.cursor_get(cur, k, v, MDB_FIRST);
    *k = (MDB_val){(size_t)PyBytes_GET_SIZE(after), PyBytes_AS_STRING(after)};
    int rc = M.cursor_get(cur, k, v, MDB_SET_RANGE);
    if (rc == 0 && k->mv_size == (size_t)PyBytes_GET_SIZE(after)
        && memcmp(k->mv_data, PyBytes_AS_STRING(after), k->mv_size) == 0)
        rc = M.cursor_get(cur, k, v, MDB_NEXT);
    return rc;
}

/* ---- Upgrades that give every item of a database its checksum (check_entries, check_idem) ----
 *
 * One step of such an upgrade is ONE write transaction: from the first key > `after`, each item
 * is handed to its `rewrite` until `limit` have been rewritten; at the end of the database
 * `mark` sets the META marker after which reads refuse an item without a checksum. A crash
 * between steps leaves items of both kinds, each read correctly. GIL not needed. */

typedef struct {
    char last[512];    /* the last key walked (a copy: a put may move the page it was on) */
    size_t last_len;
    size_t bad;        /* a damaged item's size + 1 (its key in `last`); 0: none met */
    int done;          /* the walk reached the end and set the marker */
    const char *where; /* the call that failed */
    char *buf;         /* the rewrite's scratch space, freed by the caller */
    size_t cap;
} upgrade_walk;

/* Rewrite the item under key `k` (a stable copy), value `v` (in its page), with its checksum if
 * it lacks one: 0 or an LMDB code; *rewrote says whether it did; w->bad set for damage. */
typedef int (*item_rewrite)(EnvObject *e, MDB_txn *txn, MDB_cursor *cur, MDB_val *k, const MDB_val *v,
                            upgrade_walk *w, int *rewrote);

static int walk_upgrade(EnvObject *e, MDB_dbi dbi, PyObject *after, Py_ssize_t limit, item_rewrite rewrite,
                        int (*mark)(EnvObject *, MDB_txn *, const char **), upgrade_walk *w) {
    MDB_txn *txn = NULL;
    MDB_cursor *cur = NULL;
    MDB_val k, v;
    Py_ssize_t n = 0;
    int rc = begin_write_cursor(e, dbi, &txn, &cur, &w->where);
    if (rc == 0) {
        w->where = "mdb_cursor_get";
        rc = cursor_after(cur, after, &k, &v);
    }
    while (rc == 0 && n < limit) {
        w->last_len = k.mv_size < sizeof w->last ? k.mv_size : sizeof w->last;
        memcpy(w->last, k.mv_data, w->last_len);
        if (k.mv_size > sizeof w->last) { /* no key is longer: damage */
            w->bad = v.mv_size + 1;
            break;
        }
        MDB_val key = {w->last_len, w->last};
        int rewrote = 0;
        rc = rewrite(e, txn, cur, &key, &v, w, &rewrote);
        if (rc != 0 || w->bad) break;
        n += rewrote;
        rc = M.cursor_get(cur, &k, &v, MDB_NEXT);
        w->where = "mdb_cursor_get";
    }
    if (rc == MDB_NOTFOUND && !w->bad) {
        rc = mark(e, txn, &w->where);
        w->done = rc == 0;
    }
    if (cur != NULL) M.cursor_close(cur);
    if (w->bad) { /* damage: nothing of this step is kept (the caller reports it) */
        if (txn != NULL) M.txn_abort(txn);
        return rc;
    }
    return end_write(txn, rc, &w->where);
}

/* The arguments of check_entries and check_idem: (after: bytes | None, limit: int); 0 or -1. */
static int upgrade_args(EnvObject *self, PyObject *const *args, Py_ssize_t nargs, const char *usage,
                        Py_ssize_t *limit) {
    if (nargs != 2 || (args[0] != Py_None && !PyBytes_Check(args[0]))) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *limit = PyLong_AsSsize_t(args[1]);
    if ((*limit == -1 && PyErr_Occurred()) || writable(self) < 0) return -1;
    if (*limit < 1) *limit = 1;
    return 0;
}

/* A step's result: None once done (the caller then sets its require_ flag), else the last key
 * walked; NULL with the LMDB error set. Damage is reported by the caller first. */
static PyObject *upgrade_result(const upgrade_walk *w, int rc) {
    if (rc != 0) {
        set_error(rc, w->where);
        return NULL;
    }
    if (w->done) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(w->last, (Py_ssize_t)w->last_len);
}

/* An IDEM entry: one of 16 bytes (before store format 6) is rewritten with its checksum; a
 * checked one is left as it is; anything else is damage. */
static int rewrite_idem(EnvObject *e, MDB_txn *txn, MDB_cursor *cur, MDB_val *k, const MDB_val *v,
                        upgrade_walk *w, int *rewrote) {
    (void)txn;
    if (v->mv_size != IDEM_VALUE) {
        if (!idem_sound(e, k, v)) w->bad = v->mv_size + 1;
        return 0;
    }
    const unsigned char *raw = v->mv_data;
    unsigned char checked[IDEM_CHECKED];
    idem_checked_value(checked, k->mv_data, k->mv_size, wal_get_u64(raw), wal_get_u64(raw + 8));
    MDB_val value = {IDEM_CHECKED, checked};
    w->where = "mdb_cursor_put";
    *rewrote = 1;
    return M.cursor_put(cur, k, &value, 0);
}

/* check_idem(after, limit) -> last key walked, or None once every IDEM entry is checked.
 * Store format 6's upgrade of an older state (walk_upgrade, rewrite_idem), after which META
 * "idem_checksums" is set and reads refuse an entry without a checksum. Runs only once every
 * DATA entry is checked: its marker is a checked META value. GIL released. */
static PyObject *env_check_idem(EnvObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t limit;
    if (upgrade_args(self, args, nargs, "check_idem takes (after: bytes | None, limit: int)", &limit) < 0)
        return NULL;
    if (!self->require_checks) {
        PyErr_SetString(PyExc_ValueError, "check_idem runs once every DATA entry is checked (check_entries)");
        return NULL;
    }
    upgrade_walk w = {.where = "mdb_txn_begin"};
    int rc;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = walk_upgrade(self, self->dbs[DB_IDEM], args[0], limit, rewrite_idem, mark_idem_checked, &w);
    Py_END_ALLOW_THREADS
    self->busy--;
    if (w.bad) {
        MDB_val key = {w.last_len, w.last};
        set_entry_damage(E_CHECKSUM, &key, idem_damage(w.bad - 1));
        return NULL;
    }
    PyObject *out = upgrade_result(&w, rc);
    if (out == Py_None) self->require_idem_checks = 1;
    return out;
}

/* A DATA entry without a checksum (CHECKED_FLAG clear) is rewritten with one, joined from its
 * tail if split (put_entry splits it again as it would now); one shorter than its version is
 * damage. */
static int rewrite_entry(EnvObject *e, MDB_txn *txn, MDB_cursor *cur, MDB_val *k, const MDB_val *v,
                         upgrade_walk *w, int *rewrote) {
    const unsigned char *head = v->mv_data;
    if (v->mv_size < 8) {
        w->bad = v->mv_size + 1;
        return 0;
    }
    if (head[7] & CHECKED_FLAG) return 0;
    MDB_val tail = {0, NULL};
    if (head[7] & SPLIT_FLAG) {
        MDB_val kk = *k;
        w->where = "mdb_get (tail)";
        int rc = M.get(txn, e->dbs[DB_TAIL], &kk, &tail);
        if (rc != 0) return rc;
    }
    size_t size = v->mv_size - 8 + tail.mv_size;
    if (size > w->cap) {
        char *nb = realloc(w->buf, size);
        if (nb == NULL) {
            w->where = "rewriting an entry";
            return ENOMEM;
        }
        w->buf = nb;
        w->cap = size;
    }
    /* A copy first: the put below may move or free the pages the value is on. */
    memcpy(w->buf, head + 8, v->mv_size - 8);
    if (tail.mv_size) memcpy(w->buf + v->mv_size - 8, tail.mv_data, tail.mv_size);
    uint64_t version = wal_get_u64(head) & ~((uint64_t)VERSION_FLAGS << 56);
    *rewrote = 1;
    return put_entry(e, txn, cur, k, version, w->buf, size, &w->where);
}

/* check_entries(after, limit) -> last key walked, or None once every entry is checked.
 * Store format 4's upgrade of an older state (walk_upgrade, rewrite_entry): DATA entries that
 * carry no checksum get one; at the end META "entry_checksums" is set, after which reads refuse
 * an entry without one. GIL released. */
static PyObject *env_check_entries(EnvObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t limit;
    if (upgrade_args(self, args, nargs, "check_entries takes (after: bytes | None, limit: int)", &limit) < 0)
        return NULL;
    upgrade_walk w = {.where = "mdb_txn_begin"};
    int rc;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = walk_upgrade(self, self->dbs[DB_DATA], args[0], limit, rewrite_entry, mark_checked, &w);
    Py_END_ALLOW_THREADS
    self->busy--;
    free(w.buf);
    if (w.bad) {
        set_bad_value("a DATA entry shorter than its version, or with a key over 511 bytes, at the upgrade to "
                      "checksummed entries");
        return NULL;
    }
    PyObject *out = upgrade_result(&w, rc);
    if (out == Py_None) self->require_checks = 1;
    return out;
}

/* ---- the C API lent to wal._storecore (native/lmdbapi.h) ---- */

static int capi_is_env(PyObject *o);

static int capi_read_begin(PyObject *env, void **txn) {
    EnvObject *e = (EnvObject *)env;
    if (usable(e) < 0) return -1;
    int rc = read_begin(e, (MDB_txn **)txn);
    if (rc != 0) {
        set_error(rc, "mdb_txn_begin");
        return -1;
    }
    return 0;
}

static void capi_read_end(PyObject *env, void *txn) { read_end((EnvObject *)env, txn); }

static int capi_get(PyObject *env, void *txn, PyObject *key, uint64_t *version, PyObject **value) {
    return get_entry((EnvObject *)env, txn, key, version, value);
}

static PyObject *capi_scan(PyObject *env, void *txn, PyObject *prefix, PyObject *after, Py_ssize_t limit,
                           int versions) {
    return scan_items((EnvObject *)env, txn, DB_DATA, prefix, after, limit, versions);
}

static PyObject *snapshot_adopt(EnvObject *self, MDB_txn *txn);

static PyObject *capi_adopt(PyObject *env, void *txn) { return snapshot_adopt((EnvObject *)env, txn); }

static wal_lmdb_capi capi = {
    WAL_LMDB_CAPI_VERSION, capi_is_env, capi_read_begin, capi_read_end, capi_get, capi_scan, capi_adopt,
};

/* ---- Space: where the file's pages go, and a compacted rebuild ---- */

/* space(pin_txnid) -> (page size, pages in the file, pages in use, free pages, free pages freed by
 * transactions after pin_txnid). In use: every page of the newest snapshot's B-trees (LMDB's free
 * list and main database included) and the two meta pages; free: the rest of the file, which LMDB
 * reuses before it grows the file -- except the pages freed after the oldest live reader's snapshot
 * (a checkpoint's pin, wal/store/state.py), which it keeps until that reader ends. LMDB's free list is
 * keyed by the id of the transaction that freed the pages, each value an ID list whose first word
 * is its length; reclaimed leftovers are saved under ids below the oldest reader (mdb.c,
 * mdb_freelist_save), so the records after pin_txnid are exactly the pages freed since the pin.
 * Walks only those records (one per write transaction since the pin). GIL held: a short read. */
static PyObject *env_space(EnvObject *self, PyObject *arg) {
    unsigned long long pin = PyLong_AsUnsignedLongLong(arg);
    if (pin == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (usable(self) < 0) return NULL;
    MDB_txn *txn;
    MDB_envinfo info;
    MDB_stat st;
    MDB_cursor *cur = NULL;
    unsigned long long used = 2, pinned = 0; /* the two meta pages */
    const char *where = "mdb_txn_begin";
    int rc = read_begin(self, &txn);
    if (rc != 0) {
        set_error(rc, where);
        return NULL;
    }
    MDB_dbi dbis[N_DBS + 3] = {FREE_DBI, MAIN_DBI};
    int n = 2;
    for (int i = 0; i < N_DBS; i++) dbis[n++] = self->dbs[i];
    if (self->has_tail) dbis[n++] = self->dbs[DB_TAIL];
    for (int i = 0; rc == 0 && i < n; i++) {
        rc = M.stat(txn, dbis[i], &st);
        where = "mdb_stat";
        if (rc == 0) used += st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages;
    }
    if (rc == 0) {
        rc = M.cursor_open(txn, FREE_DBI, &cur);
        where = "mdb_cursor_open";
    }
    if (rc == 0) {
        size_t from = (size_t)pin + 1;
        MDB_val k = {sizeof from, &from}, v;
        for (rc = M.cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0; rc = M.cursor_get(cur, &k, &v, MDB_NEXT)) {
            size_t count;
            if (v.mv_size < sizeof count) continue;
            memcpy(&count, v.mv_data, sizeof count);
            pinned += count;
        }
        if (rc == MDB_NOTFOUND) rc = 0;
        where = "mdb_cursor_get";
        M.cursor_close(cur);
    }
    read_end(self, txn);
    if (rc == 0) {
        rc = M.env_info(self->env, &info);
        where = "mdb_env_info";
    }
    if (rc != 0) {
        set_error(rc, where);
        return NULL;
    }
    unsigned long long pages = (unsigned long long)info.me_last_pgno + 1;
    unsigned long long free_pages = pages > used ? pages - used : 0;
    return Py_BuildValue("(IKKKK)", self->psize, pages, used, free_pages, pinned < free_pages ? pinned : free_pages);
}

/* Rebuild the newest snapshot into a new environment in `dir`: every database walked in key order
 * and written with MDB_APPEND, which fills each page before it starts the next (a B-tree filled by
 * random or interleaved inserts keeps its pages about half full: LMDB splits a full page in two,
 * and mdb_env_copy2's compaction renumbers pages but does not refill them). Values are copied as
 * stored (split ones stay split). A write transaction per COMPACT_TXN_ITEMS items keeps LMDB's
 * dirty-page list bounded; the new file is fdatasynced (mdb_env_sync force) before the return. */
#define COMPACT_TXN_ITEMS 65536
static int compact_into(EnvObject *e, const char *dir, unsigned long long *items, const char **where) {
    static const char *const names[N_DBS + 1] = {"data", "idem", "meta", "tail"};
    MDB_envinfo info;
    MDB_env *dst = NULL;
    MDB_txn *rtxn = NULL, *wtxn = NULL;
    MDB_cursor *cur = NULL;
    int rc = M.env_info(e->env, &info);
    *where = "mdb_env_info";
    if (rc == 0) rc = M.env_create(&dst), *where = "mdb_env_create";
    if (rc == 0) rc = M.env_set_mapsize(dst, info.me_mapsize), *where = "mdb_env_set_mapsize";
    if (rc == 0) rc = M.env_set_maxdbs(dst, MAX_DBS), *where = "mdb_env_set_maxdbs";
    if (rc == 0) rc = M.env_open(dst, dir, MDB_NOSYNC | MDB_NOTLS | MDB_NORDAHEAD, FILE_MODE), *where = "mdb_env_open";
    if (rc == 0) rc = M.txn_begin(e->env, NULL, MDB_RDONLY, &rtxn), *where = "mdb_txn_begin";
    int n_dbs = e->has_tail ? N_DBS + 1 : N_DBS;
    for (int i = 0; rc == 0 && i < n_dbs; i++) {
        MDB_dbi to;
        MDB_val k, v;
        rc = M.txn_begin(dst, NULL, 0, &wtxn), *where = "mdb_txn_begin";
        if (rc == 0) rc = M.dbi_open(wtxn, names[i], MDB_CREATE, &to), *where = "mdb_dbi_open";
        if (rc == 0) rc = M.cursor_open(rtxn, e->dbs[i], &cur), *where = "mdb_cursor_open";
        unsigned long long n = 0;
        for (int op = MDB_FIRST; rc == 0; op = MDB_NEXT) {
            rc = M.cursor_get(cur, &k, &v, op), *where = "mdb_cursor_get";
            if (rc != 0) break;
            rc = M.put(wtxn, to, &k, &v, MDB_APPEND), *where = "mdb_put";
            if (rc == 0 && ++n % COMPACT_TXN_ITEMS == 0) {
                rc = M.txn_commit(wtxn), *where = "mdb_txn_commit";
                wtxn = NULL;
                if (rc == 0) rc = M.txn_begin(dst, NULL, 0, &wtxn), *where = "mdb_txn_begin";
            }
        }
        if (rc == MDB_NOTFOUND) rc = 0;
        *items += n;
        if (cur != NULL) M.cursor_close(cur);
        cur = NULL;
        if (rc == 0) rc = M.txn_commit(wtxn), *where = "mdb_txn_commit";
        else if (wtxn != NULL) M.txn_abort(wtxn);
        wtxn = NULL;
    }
    if (rtxn != NULL) M.txn_abort(rtxn);
    if (rc == 0) rc = M.env_sync(dst, 1), *where = "mdb_env_sync";
    if (dst != NULL) M.env_close(dst);
    return rc;
}

/* compact_into(dir) -> items copied: `compact_into` above, into dir (an existing, empty directory),
 * GIL released. The caller keeps writes out if the copy must be the state as of now. */
static PyObject *env_compact_into(EnvObject *self, PyObject *arg) {
    PyObject *path;
    if (!PyUnicode_FSConverter(arg, &path)) return NULL;
    if (usable(self) < 0) {
        Py_DECREF(path);
        return NULL;
    }
    int rc;
    unsigned long long items = 0;
    const char *where = "";
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = compact_into(self, PyBytes_AS_STRING(path), &items, &where);
    Py_END_ALLOW_THREADS
    self->busy--;
    Py_DECREF(path);
    if (rc != 0) {
        set_error(rc, where);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(items);
}

static PyTypeObject SnapshotType;

/* A Snapshot that owns `txn` (a read transaction of `self`) from now on; NULL with the
 * transaction aborted if the object cannot be made. */
static PyObject *snapshot_adopt(EnvObject *self, MDB_txn *txn) {
    SnapshotObject *s = PyObject_New(SnapshotObject, &SnapshotType);
    if (s == NULL) {
        M.txn_abort(txn);
        return NULL;
    }
    s->txn = txn;
    s->prev = s->next = NULL;
    Py_INCREF(self);
    s->owner = self;
    s->next = self->snapshots;
    if (s->next != NULL) s->next->prev = s;
    self->snapshots = s;
    return (PyObject *)s;
}

static PyObject *env_begin(EnvObject *self, PyObject *unused) {
    (void)unused;
    if (usable(self) < 0) return NULL;
    MDB_txn *txn;
    int rc = new_read_txn(self, &txn);
    if (rc != 0) {
        set_error(rc, "mdb_txn_begin");
        return NULL;
    }
    return snapshot_adopt(self, txn);
}

/* reader_check() -> the reader slots freed: those held by processes no longer alive (a
 * read-only opener killed with a snapshot open pins the pages of its snapshot for as long as
 * its slot stays taken, so the file grows by everything written after it). */
static PyObject *env_reader_check(EnvObject *self, PyObject *unused) {
    (void)unused;
    if (usable(self) < 0) return NULL;
    int dead = 0;
    int rc = M.reader_check(self->env, &dead);
    if (rc != 0) {
        set_error(rc, "mdb_reader_check");
        return NULL;
    }
    return PyLong_FromLong(dead);
}

/* set_map_size(size) -> the map's size now: mdb_env_set_mapsize on the open environment
 * (0: adopt the size the file's newest meta page records; LMDB rounds a size below the data
 * up to it). E_BUSY while a call on this handle runs with the GIL released: try again. */
static PyObject *env_set_map_size(EnvObject *self, PyObject *arg) {
    unsigned long long size = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred() || usable(self) < 0) return NULL;
    int rc = set_map_size(self, (size_t)size);
    if (rc == E_BUSY) {
        set_own_error(E_BUSY, "resizing the LMDB map while another thread is in a call on it");
        return NULL;
    }
    if (rc != 0) {
        set_error(rc, "mdb_env_set_mapsize");
        return NULL;
    }
    MDB_envinfo info;
    rc = M.env_info(self->env, &info);
    if (rc != 0) {
        set_error(rc, "mdb_env_info");
        return NULL;
    }
    return PyLong_FromSize_t(info.me_mapsize);
}

static PyObject *env_get_map_size(EnvObject *self, void *closure) {
    (void)closure;
    if (usable(self) < 0) return NULL;
    MDB_envinfo info;
    int rc = M.env_info(self->env, &info);
    if (rc != 0) {
        set_error(rc, "mdb_env_info");
        return NULL;
    }
    return PyLong_FromSize_t(info.me_mapsize);
}

static PyObject *env_get_path(EnvObject *self, void *closure) {
    (void)closure;
    if (self->path == NULL) Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(self->path));
}

static PyObject *env_get_restored(EnvObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->restored);
}

static PyObject *env_get_closed(EnvObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->env == NULL);
}

static PyMethodDef env_methods[] = {
    {"get", (PyCFunction)(void (*)(void))env_get, METH_FASTCALL,
     "get(db, key) -> bytes | None; DATA: (version, value) | None (a read txn of its own)"},
    {"scan", (PyCFunction)(void (*)(void))env_scan, METH_FASTCALL,
     "scan(db, prefix, after, limit) -> [(key, value)]: keys with prefix, > after, in order"},
    {"put", (PyCFunction)(void (*)(void))env_put, METH_FASTCALL, "put(db, key, value): one committed write txn"},
    {"apply", (PyCFunction)(void (*)(void))env_apply, METH_FASTCALL,
     "apply(batch, durable_lsn, background=False) -> (status, lsn): a collapsed batch in one write txn, "
     "GIL released; background: in a thread at the lowest CPU priority"},
    {"expire_idempotency", (PyCFunction)env_expire, METH_O, "expire_idempotency(older_than_ms) -> removed"},
    {"load_snapshot", (PyCFunction)(void (*)(void))env_load_snapshot, METH_FASTCALL,
     "load_snapshot(buffer, offset, count, max_bytes, append) -> (offset after, entries): an archive "
     "snapshot's checked entries into DATA, one write txn"},
    {"sync", (PyCFunction)env_sync, METH_O, "sync(force): mdb_env_sync, GIL released"},
    {"stat", (PyCFunction)env_stat, METH_NOARGS, "stat() -> (data entries, page size, last page number)"},
    {"begin", (PyCFunction)env_begin, METH_NOARGS, "begin() -> Snapshot: a read-only transaction"},
    {"reader_check", (PyCFunction)env_reader_check, METH_NOARGS,
     "reader_check() -> int: free the reader slots of processes that died holding them; how many"},
    {"verify", (PyCFunction)env_verify, METH_NOARGS,
     "verify() -> (entries, value bytes): every DATA entry checked, looked up again, and counted"},
    {"put_idem", (PyCFunction)env_put_idem, METH_O,
     "put_idem(items) -> None: (key, lsn, time_ms) idempotency entries in one write txn, nothing else"},
    {"check_idem", (PyCFunction)(void (*)(void))env_check_idem, METH_FASTCALL,
     "check_idem(after, limit) -> last key | None: give up to `limit` unchecked IDEM entries a checksum, "
     "in one write txn; None once all have one (META idem_checksums then set)"},
    {"check_entries", (PyCFunction)(void (*)(void))env_check_entries, METH_FASTCALL,
     "check_entries(after, limit) -> last key | None: give up to `limit` unchecked DATA entries a checksum, "
     "in one write txn; None once all have one (META entry_checksums then set)"},
    {"close", (PyCFunction)env_close, METH_NOARGS, "close(): idempotent; aborts live snapshots"},
    {"space", (PyCFunction)env_space, METH_O,
     "space(pin_txnid) -> (page size, pages, pages in use, free pages, free pages freed after pin_txnid)"},
    {"compact_into", (PyCFunction)env_compact_into, METH_O,
     "compact_into(dir) -> items: the newest snapshot rebuilt, pages filled, into a new environment in dir; synced"},
    {"set_map_size", (PyCFunction)env_set_map_size, METH_O,
     "set_map_size(size) -> map size now: resize the map (0: adopt the file's); E_BUSY during a GIL-free call"},
    {NULL, NULL, 0, NULL},
};

static PyObject *env_get_background_applies(EnvObject *self, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->background_applies);
}

static PyObject *env_get_require_checks(EnvObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->require_checks);
}

static PyObject *env_get_require_idem_checks(EnvObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->require_idem_checks);
}

static PyGetSetDef env_getset[] = {
    {"require_checks", (getter)env_get_require_checks, NULL,
     "True if every DATA entry carries a checksum (an entry without one is damage)", NULL},
    {"require_idem_checks", (getter)env_get_require_idem_checks, NULL,
     "True if every IDEM entry carries a checksum (an entry without one is damage)", NULL},
    {"path", (getter)env_get_path, NULL, "the environment's directory", NULL},
    {"closed", (getter)env_get_closed, NULL, "True once closed", NULL},
    {"map_size", (getter)env_get_map_size, NULL, "the map's size in bytes (address space, not disk)", NULL},
    {"restored", (getter)env_get_restored, NULL, "True if the open wrote the given meta page into both slots", NULL},
    {"background_applies", (getter)env_get_background_applies, NULL,
     "applies whose transaction ran in a thread at the lowest CPU priority", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EnvType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wal._lmdbcall.Env",
    .tp_basicsize = sizeof(EnvObject),
    .tp_dealloc = (destructor)env_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Env(path, readonly, map_size): one LMDB environment (databases data, idem, meta)",
    .tp_methods = env_methods,
    .tp_getset = env_getset,
    .tp_init = (initproc)env_init,
    .tp_new = PyType_GenericNew,
};

static int capi_is_env(PyObject *o) { return PyObject_TypeCheck(o, &EnvType); }

/* ---- Snapshot: one read-only transaction, for consistent whole-state walks ---- */

static int snap_usable(SnapshotObject *s) {
    if (usable(s->owner) < 0) return -1;
    if (s->txn == NULL) {
        set_own_error(E_CLOSED, "the LMDB snapshot is closed");
        return -1;
    }
    return 0;
}

static void snap_unlink(SnapshotObject *s) {
    if (s->prev != NULL) s->prev->next = s->next;
    else if (s->owner->snapshots == s) s->owner->snapshots = s->next;
    if (s->next != NULL) s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static PyObject *snap_abort(SnapshotObject *s, PyObject *unused) {
    (void)unused;
    if (s->txn != NULL) {
        if (s->owner->epoch == forkwatch_now() && s->owner->env != NULL) M.txn_abort(s->txn);
        s->txn = NULL;
        snap_unlink(s);
    }
    Py_RETURN_NONE;
}

static void snap_dealloc(SnapshotObject *s) {
    PyObject *r = snap_abort(s, NULL);
    Py_XDECREF(r);
    Py_XDECREF(s->owner);
    PyObject_Free(s);
}

static PyObject *snap_renew(SnapshotObject *s, PyObject *unused) {
    (void)unused;
    if (snap_usable(s) < 0) return NULL;
    M.txn_reset(s->txn);
    int rc = M.txn_renew(s->txn);
    if (rc == MDB_MAP_RESIZED && set_map_size(s->owner, 0) == 0) rc = M.txn_renew(s->txn); /* see read_begin */
    if (rc != 0) {
        M.txn_abort(s->txn);
        s->txn = NULL;
        snap_unlink(s);
        set_error(rc, "mdb_txn_renew");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* (db, ...) -> read(...) in the snapshot's transaction. */
static PyObject *snap_read(SnapshotObject *s, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                           const char *usage, txn_reader read) {
    int db;
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (snap_usable(s) < 0 || db_index(args[0], &db) < 0) return NULL;
    return read(s->owner, s->txn, db, args + 1);
}

static PyObject *snap_get(SnapshotObject *s, PyObject *const *args, Py_ssize_t nargs) {
    return snap_read(s, args, nargs, 2, "get takes (db, key)", txn_get);
}

static PyObject *snap_scan(SnapshotObject *s, PyObject *const *args, Py_ssize_t nargs) {
    return snap_read(s, args, nargs, 4, "scan takes (db, prefix, after, limit)", txn_scan);
}

/* scan_values(prefix, after | None, limit) -> [(key, value)] of DATA, checked (no versions). */
static PyObject *snap_scan_values(SnapshotObject *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0]) || (args[1] != Py_None && !PyBytes_Check(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "scan_values takes (prefix: bytes, after: bytes | None, limit: int)");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if ((limit == -1 && PyErr_Occurred()) || snap_usable(s) < 0) return NULL;
    return scan_items(s->owner, s->txn, DB_DATA, args[0], args[1] == Py_None ? NULL : args[1], limit, 0);
}

static PyObject *snap_entries(SnapshotObject *s, PyObject *arg) {
    int db;
    if (snap_usable(s) < 0 || db_index(arg, &db) < 0) return NULL;
    MDB_stat st;
    int rc = M.stat(s->txn, s->owner->dbs[db], &st);
    if (rc != 0) {
        set_error(rc, "mdb_stat");
        return NULL;
    }
    return PyLong_FromSize_t(st.ms_entries);
}

static PyObject *snap_txnid(SnapshotObject *s, PyObject *unused) {
    (void)unused;
    if (snap_usable(s) < 0) return NULL;
    return PyLong_FromSize_t(M.txn_id(s->txn));
}

static PyMethodDef snap_methods[] = {
    {"txnid", (PyCFunction)snap_txnid, METH_NOARGS, "txnid() -> the LMDB transaction id the snapshot reads"},
    {"get", (PyCFunction)(void (*)(void))snap_get, METH_FASTCALL,
     "get(db, key) -> bytes | None; DATA: (version, value) | None"},
    {"scan", (PyCFunction)(void (*)(void))snap_scan, METH_FASTCALL,
     "scan(db, prefix, after, limit) -> [(key, value)]; DATA: [(key, version, value)]"},
    {"scan_values", (PyCFunction)(void (*)(void))snap_scan_values, METH_FASTCALL,
     "scan_values(prefix, after, limit) -> [(key, value)] of DATA"},
    {"entries", (PyCFunction)snap_entries, METH_O, "entries(db) -> number of keys"},
    {"renew", (PyCFunction)snap_renew, METH_NOARGS, "renew(): move the snapshot to the newest commit"},
    {"abort", (PyCFunction)snap_abort, METH_NOARGS, "abort(): end the transaction (idempotent)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SnapshotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wal._lmdbcall.Snapshot",
    .tp_basicsize = sizeof(SnapshotObject),
    .tp_dealloc = (destructor)snap_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A read-only LMDB transaction (Env.begin())",
    .tp_methods = snap_methods,
};

/* ---- check_pages: LMDB's own structure, checked before LMDB reads it ----
 *
 * LMDB 0.9 trusts its pages: a page number past the end of the file, a node offset past the
 * end of its page or an overflow run longer than the file makes it read outside the map
 * (SIGBUS, SIGSEGV) or trip an assertion, killing the process. The entry checksums cannot
 * help there, since the damage is met before any entry is. So a state small enough to read
 * whole at open (wal/store/state.py VERIFY_ON_OPEN_BYTES) is walked here first, from the meta page
 * LMDB would open at (the valid one with the higher transaction id; or the checkpoint's page
 * about to be restored), through every tree it holds -- the free list, the main database and
 * each named database -- checking every page and node against the bounds LMDB relies on.
 * Written from LMDB 0.9's documented on-disk layout (mdb.c: MDB_page, MDB_node, MDB_meta,
 * MDB_db; 64-bit). Whatever passes, LMDB can read without leaving its map. */

#define P_BRANCH 0x01
#define P_LEAF 0x02
#define P_OVERFLOW 0x04
#define P_META 0x08
#define P_LEAF2 0x20
#define F_BIGDATA 0x01
#define F_SUBDATA 0x02
#define F_DUPDATA 0x04
#define PAGE_HDR 16
#define NODE_HDR 8
#define MDB_DB_SIZE 48
#define META_DBS_AT (PAGE_HDR + 24) /* magic, version, address, mapsize */
#define META_LAST_PG_AT (META_DBS_AT + 2 * MDB_DB_SIZE)
#define META_TXNID_AT (META_LAST_PG_AT + 8)
#define P_INVALID UINT64_MAX
#define MAX_TREE_DEPTH 64

typedef struct {
    const unsigned char *file;
    size_t size, psize, npages;
    uint64_t last_pg;
    unsigned char *seen; /* one byte per page: reached already (a cycle or a page shared by two trees) */
    unsigned named;      /* the store's named databases found in the main one (bit i: names[i] below) */
    char why[200];
} page_walk;

static uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static int bad(page_walk *w, uint64_t pgno, const char *what) {
    snprintf(w->why, sizeof w->why, "page %llu: %s", (unsigned long long)pgno, what);
    return -1;
}

static int walk_tree(page_walk *w, uint64_t root, int free_db, int main_db);

/* One page of a tree and, depth first, what it points to. */
static int walk_page(page_walk *w, uint64_t pgno, int depth, int free_db, int main_db) {
    if (depth > MAX_TREE_DEPTH) return bad(w, pgno, "a tree deeper than any LMDB writes");
    if (pgno < 2 || pgno > w->last_pg || pgno >= w->npages) return bad(w, pgno, "a page number past the file");
    if (w->seen[pgno]) return bad(w, pgno, "a page reached twice");
    w->seen[pgno] = 1;
    const unsigned char *p = w->file + pgno * w->psize;
    uint16_t flags = get16(p + 10), lower = get16(p + 12), upper = get16(p + 14);
    if (wal_get_u64(p) != pgno) return bad(w, pgno, "a page header naming another page");
    /* On disk a tree page is exactly a branch or a leaf: LMDB clears its in-memory flags (dirty,
     * loose, keep) before it writes a page, and no database of a store holds sorted duplicates. */
    int branch = flags == P_BRANCH, leaf = flags == P_LEAF;
    if (!branch && !leaf) return bad(w, pgno, "neither a branch nor a leaf page where one must be");
    if (lower < PAGE_HDR || (lower - PAGE_HDR) % 2 || upper < lower || upper > w->psize)
        return bad(w, pgno, "bounds of its free space out of range");
    size_t n = (size_t)(lower - PAGE_HDR) / 2;
    if (branch && n == 0) return bad(w, pgno, "a branch page with no child");
    for (size_t i = 0; i < n; i++) {
        size_t off = get16(p + PAGE_HDR + 2 * i);
        if (off < upper || off + NODE_HDR > w->psize) return bad(w, pgno, "a node offset out of range");
        const unsigned char *node = p + off;
        size_t ksize = get16(node + 6), at = off + NODE_HDR + ksize;
        if (at > w->psize) return bad(w, pgno, "a key past the end of its page");
        uint16_t nflags = get16(node + 4);
        if (branch) {
            uint64_t child = (uint64_t)get16(node) | ((uint64_t)get16(node + 2) << 16) | ((uint64_t)nflags << 32);
            if (walk_page(w, child, depth + 1, free_db, main_db) < 0) return -1;
            continue;
        }
        size_t dsize = (size_t)get16(node) | ((size_t)get16(node + 2) << 16);
        if (nflags & ~(F_BIGDATA | F_SUBDATA | F_DUPDATA)) return bad(w, pgno, "unknown node flags");
        if (nflags & F_DUPDATA) return bad(w, pgno, "a duplicate-key node (no database of a store has them)");
        if (nflags & F_BIGDATA) {
            if (at + 8 > w->psize) return bad(w, pgno, "an overflow page number past the end of its page");
            uint64_t ov = wal_get_u64(p + at);
            if (ov < 2 || ov > w->last_pg || ov >= w->npages) return bad(w, pgno, "an overflow run past the file");
            const unsigned char *op = w->file + ov * w->psize;
            uint32_t pages = wal_get_u32(op + 12);
            if (wal_get_u64(op) != ov || get16(op + 10) != P_OVERFLOW || pages == 0 ||
                ov + pages - 1 > w->last_pg || ov + pages > w->npages || dsize > (size_t)pages * w->psize - PAGE_HDR)
                return bad(w, ov, "an overflow run that is not what its node says");
            for (uint64_t q = ov; q < ov + pages; q++) {
                if (w->seen[q]) return bad(w, q, "an overflow page reached twice");
                w->seen[q] = 1;
            }
            continue;
        }
        if (at + dsize > w->psize) return bad(w, pgno, "a value past the end of its page");
        if (free_db && (dsize < 8 || wal_get_u64(p + at) > dsize / 8 - 1))
            return bad(w, pgno, "a free-list record longer than its node");
        if (main_db) { /* the main database holds the store's named databases, and nothing else */
            static const char *const names[] = {"data", "idem", "meta", "tail"};
            unsigned which = 0;
            for (unsigned d = 0; d < 4; d++)
                if (ksize == strlen(names[d]) && memcmp(node + NODE_HDR, names[d], ksize) == 0) which = 1u << d;
            if (!(nflags & F_SUBDATA) || dsize != MDB_DB_SIZE || which == 0 || (w->named & which))
                return bad(w, pgno, "the main database holds a record that is not one of the store's databases");
            w->named |= which;
            if (walk_tree(w, wal_get_u64(p + at + 40), 0, 0) < 0) return -1;
        } else if (nflags & F_SUBDATA) {
            return bad(w, pgno, "a named database record out of place");
        }
    }
    return 0;
}

static int walk_tree(page_walk *w, uint64_t root, int free_db, int main_db) {
    return root == P_INVALID ? 0 : walk_page(w, root, 0, free_db, main_db);
}

/* check_pages(data_path, meta=None): walk data.mdb as described above, from its newest valid
 * meta page or from `meta` (a meta page about to be written over both slots); LmdbError
 * (E_BAD_VALUE, what and where) if anything is out of bounds. GIL released for the walk. */
static PyObject *mod_check_pages(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    PyObject *path;
    Py_buffer meta = {0};
    if (nargs < 1 || nargs > 2 || !PyUnicode_FSConverter(args[0], &path)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "check_pages takes (data_path, meta=None)");
        return NULL;
    }
    if (nargs == 2 && args[1] != Py_None && PyObject_GetBuffer(args[1], &meta, PyBUF_SIMPLE) < 0) {
        Py_DECREF(path);
        return NULL;
    }
    page_walk w = {0};
    int err = 0, rc = 0;
    unsigned char *file = NULL;
    Py_BEGIN_ALLOW_THREADS
    int fd = open(PyBytes_AS_STRING(path), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        err = errno;
    } else {
        /* Read to the end of the file, not to the size fstat gave: beside a running writer (a
         * read-only open) the file may grow in between. Its meta pages come first in the file,
         * and LMDB writes a transaction's pages before its meta page, so every page the meta
         * read here names is in the file by the time the read reaches it; read only to the
         * size first seen, a meta page written since named pages past it ("damaged"). */
        size_t cap = st.st_size > 0 ? (size_t)st.st_size : 4096, got = 0;
        if ((file = malloc(cap)) == NULL) err = ENOMEM;
        while (!err) {
            if (got == cap) {
                size_t grown = cap + cap / 8 + (64 << 10); /* the end is usually near: grow a little */
                unsigned char *more = realloc(file, grown);
                if (more == NULL) {
                    err = ENOMEM;
                    break;
                }
                file = more;
                cap = grown;
            }
            ssize_t r = pread(fd, file + got, cap - got, (off_t)got);
            if (r < 0) err = errno;
            if (r <= 0) break;
            got += (size_t)r;
        }
        w.file = file;
        w.size = got;
    }
    if (fd >= 0) close(fd);
    if (!err) {
        /* The meta page LMDB opens at: the given one, else the slot with the higher txnid. LMDB
         * reads slot 0 at offset 0 and slot 1 at slot 0's page size, and refuses the file itself
         * unless both are meta pages with its magic and version: such a file is left to it. */
        int given = meta.buf != NULL && (size_t)meta.len >= META_TXNID_AT + 8;
        const unsigned char *best = given ? meta.buf : NULL;
        int leave_to_lmdb = 0;
        size_t at = 0;
        for (int slot = 0; slot < 2 && !given; slot++) {
            const unsigned char *m = w.file + at;
            if (at + META_TXNID_AT + 8 > w.size || !(get16(m + 10) & P_META) ||
                wal_get_u32(m + PAGE_HDR) != 0xBEEFC0DE || wal_get_u32(m + PAGE_HDR + 4) != 1) {
                leave_to_lmdb = 1;
                break;
            }
            if (slot == 1) {
                /* LMDB writes transaction t's meta page in slot t & 1; a restore (restore_meta) writes
                 * one saved page into both. Anything else is a damaged transaction id. */
                uint64_t t0 = wal_get_u64(best + META_TXNID_AT), t1 = wal_get_u64(m + META_TXNID_AT);
                if (t0 != t1 && ((t0 & 1) != 0 || (t1 & 1) != 1)) {
                    rc = -1;
                    snprintf(w.why, sizeof w.why, "meta pages name transactions %llu and %llu, which LMDB never "
                             "writes in those slots", (unsigned long long)t0, (unsigned long long)t1);
                    break;
                }
            }
            if (best == NULL || wal_get_u64(m + META_TXNID_AT) > wal_get_u64(best + META_TXNID_AT)) best = m;
            at += wal_get_u32(m + META_DBS_AT); /* the free DB's md_pad: the page size */
        }
        size_t psize = best != NULL ? wal_get_u32(best + META_DBS_AT) : 0;
        if (rc < 0 || leave_to_lmdb) {
            /* refused above, or left to LMDB */
        } else if (best == NULL || psize < 4096 || psize > 65536 || (psize & (psize - 1))) {
            rc = -1;
            snprintf(w.why, sizeof w.why, "no valid meta page");
        } else {
            w.psize = psize;
            w.npages = w.size / psize;
            w.last_pg = wal_get_u64(best + META_LAST_PG_AT);
            if (w.last_pg >= w.npages) {
                rc = -1;
                snprintf(w.why, sizeof w.why, "the meta page's last page %llu is past the file's %zu pages",
                         (unsigned long long)w.last_pg, w.npages);
            } else if ((w.seen = calloc(w.npages, 1)) == NULL) {
                err = ENOMEM;
            } else {
                uint64_t main_root = wal_get_u64(best + META_DBS_AT + MDB_DB_SIZE + 40);
                rc = walk_tree(&w, wal_get_u64(best + META_DBS_AT + 40), 1, 0);
                if (rc == 0) rc = walk_tree(&w, main_root, 0, 1);
                /* An empty main database is a creation cut short (wal/store/state.py); otherwise data, idem
                 * and meta are all there (tail only from store format 3). */
                if (rc == 0 && main_root != P_INVALID && (w.named & 7) != 7) {
                    rc = -1;
                    snprintf(w.why, sizeof w.why, "the main database lacks one of data, idem and meta");
                }
            }
        }
    }
    free(w.seen);
    free(file);
    Py_END_ALLOW_THREADS
    if (meta.buf != NULL) PyBuffer_Release(&meta);
    Py_DECREF(path);
    if (err) {
        set_error(err, "reading data.mdb to check its pages");
        return NULL;
    }
    if (rc < 0) {
        set_bad_value("LMDB's structure is damaged: %s", w.why);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- module ---- */

static PyMethodDef mod_methods[] = {
    {"check_pages", (PyCFunction)(void (*)(void))mod_check_pages, METH_FASTCALL,
     "check_pages(data_path, meta=None): walk every tree of data.mdb and check each page and node against the "
     "bounds LMDB relies on; LmdbError(E_BAD_VALUE) on damage"},
    {"load", (PyCFunction)mod_load, METH_O,
     "load(path) -> version: resolve LMDB 0.9 from the already-loaded library at path; ImportError if it "
     "lacks the functions or is not 0.9. The first successful load is kept."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef lc_module = {
    PyModuleDef_HEAD_INIT, "wal._lmdbcall", "The package's LMDB binding (native/lmdbcall.c).", -1, mod_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lmdbcall(void) {
    if (PyType_Ready(&EnvType) < 0 || PyType_Ready(&SnapshotType) < 0 || PyType_Ready(&DurableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&lc_module);
    if (m == NULL) return NULL;
    LmdbError = PyErr_NewException("wal._lmdbcall.LmdbError", NULL, NULL);
    if (LmdbError == NULL || PyModule_AddObjectRef(m, "LmdbError", LmdbError) < 0
        || PyModule_AddObjectRef(m, "Env", (PyObject *)&EnvType) < 0
        || PyModule_AddObjectRef(m, "Snapshot", (PyObject *)&SnapshotType) < 0
        || PyModule_AddObjectRef(m, "DurableLsn", (PyObject *)&DurableType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&capi, WAL_LMDB_CAPI_NAME, NULL);
    int added = capsule != NULL ? PyModule_AddObjectRef(m, "CAPI", capsule) : -1;
    Py_XDECREF(capsule);
    if (added < 0) {
        Py_DECREF(m);
        return NULL;
    }
    static const struct {
        const char *name;
        long value;
    } consts[] = {
        {"DATA", 0}, {"IDEM", 1}, {"META", 2},
        {"APPLY_OK", APPLY_OK}, {"APPLY_GAP", APPLY_GAP}, {"APPLY_NOT_DURABLE", APPLY_NOT_DURABLE},
        {"E_ALREADY_OPEN", E_ALREADY_OPEN}, {"E_FORKED", E_FORKED}, {"E_CLOSED", E_CLOSED}, {"E_BUSY", E_BUSY},
        {"E_BAD_VALUE", E_BAD_VALUE},
        {"E_NO_TAILS", E_NO_TAILS}, {"E_CHECKSUM", E_CHECKSUM},
        {"MDB_KEYEXIST", MDB_KEYEXIST}, {"MDB_NOTFOUND", MDB_NOTFOUND}, {"MDB_PAGE_NOTFOUND", MDB_PAGE_NOTFOUND},
        {"MDB_CORRUPTED", MDB_CORRUPTED}, {"MDB_PANIC", MDB_PANIC}, {"MDB_VERSION_MISMATCH", MDB_VERSION_MISMATCH},
        {"MDB_INVALID", MDB_INVALID}, {"MDB_MAP_FULL", MDB_MAP_FULL}, {"MDB_DBS_FULL", MDB_DBS_FULL},
        {"MDB_READERS_FULL", MDB_READERS_FULL}, {"MDB_TXN_FULL", MDB_TXN_FULL}, {"MAX_READERS", MAX_READERS},
        {"MDB_MAP_RESIZED", MDB_MAP_RESIZED}, {"MDB_INCOMPATIBLE", MDB_INCOMPATIBLE},
        {"MDB_BAD_RSLOT", MDB_BAD_RSLOT}, {"MDB_BAD_TXN", MDB_BAD_TXN}, {"MDB_BAD_VALSIZE", MDB_BAD_VALSIZE},
        {"MDB_BAD_DBI", MDB_BAD_DBI},
    };
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++) {
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
