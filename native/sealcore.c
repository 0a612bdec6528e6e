/*
 * sealcore.c -- AES-256-GCM sealing sessions in C (wal._storecore.SealSession).
 *
 * Why it exists. A sealed store's put spent most of its extra time not in AES but around it:
 * `cryptography`'s AESGCM.encrypt sets up a cipher context on every call (the key schedule
 * copied, the GHASH tables made) and, for 2,048 bytes or more, hands the GIL to another
 * thread and waits to get it back; and the put was a Python frame around it
 * (docs/performance.md, "Sealed values"). Here a session keeps OpenSSL cipher contexts with
 * its key already set, so a seal sets only the nonce, and the sealed Store.put (storecore.c,
 * FastCommit) seals inside the C commit call, GIL held, with no Python frame.
 *
 * No cryptography is written here: the AEAD is OpenSSL's EVP AES-256-GCM, the same code
 * `cryptography` wraps. libcrypto is loaded at run time (dlopen), not linked, and no OpenSSL
 * header is needed to build: the few EVP functions below are declared here, their
 * signatures the same in OpenSSL 1.1 and 3. Python's own `ssl` module links libcrypto, so it
 * is present wherever Python has ssl; where it cannot be loaded, `load_aead` says why and
 * wal/crypto/sealing.py seals through `cryptography` as before. The key derivation (HKDF)
 * stays in Python, once per session.
 *
 * The envelope is wal/crypto/sealing.py's, byte for byte (FORMAT.md §19):
 *     codec:u8  key_id:8  session:16  counter:u64 LE  ciphertext  tag:16
 * nonce = counter (u64 LE) || 4 zero bytes; associated data = the 33 header bytes || context.
 * So an envelope sealed here opens with the Python Sealer.open, and the reverse.
 *
 * Contracts.
 *  - A session's counter is taken with one atomic fetch-and-add, before the trace line and the
 *    encryption, by every seal of the session from either path: no two seals of a session get
 *    one counter. At the session's limit (wal/crypto/sealing.py's SESSION_LIMIT) it seals
 *    nothing more and answers "used up"; so does a session in any process but the one that
 *    made it, however that process was forked (forkwatch.h): the caller starts a new
 *    session (a new random id and key), which the Python side also does in every forked
 *    child before it seals.
 *  - AGENTWAL_TRACE_NONCES: a session given a trace fd appends "key_id session counter\n"
 *    (hex, hex, decimal) to it before each encryption, one write(2), as the Python path does.
 *  - Cipher contexts are lent from a per-session pool, taken and given back with the GIL held;
 *    while lent, a context belongs to one seal. Bodies of SEAL_NOGIL_BYTES or more are
 *    encrypted with the GIL released (the AES work then outweighs a hand-off of the GIL);
 *    smaller ones keep it, which is cheaper among many committing threads (logcall.h argues the
 *    same for the log's writes).
 *  - The derived key is wiped when the session is freed.
 */
#include "sealcore.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <structmember.h>
#include <unistd.h>

#include "forkwatch.h"

#define KEY_BYTES 32
#define KEY_ID_BYTES 8
#define SESSION_BYTES 16
#define HEADER_BYTES (1 + KEY_ID_BYTES + SESSION_BYTES + 8)
#define TAG_BYTES 16
_Static_assert(HEADER_BYTES + TAG_BYTES == SEAL_ENVELOPE_OVERHEAD, "sealcore.h's envelope overhead");
_Static_assert(HEADER_BYTES == SEAL_HEADER_BYTES, "sealcore.h's envelope header");
#define NONCE_BYTES 12
#define CODEC_ENCRYPTED 0x80
#define CODEC_ZSTD 0x01
#define POOL_MAX 8
/* From this many bytes of body the encryption runs with the GIL released: at ~2-4 GB/s that
 * is 10-20 us of AES, more than a hand-off of the GIL costs the threads around it. */
#ifndef SEAL_NOGIL_BYTES /* (a build may set it, to measure other cut-offs) */
#define SEAL_NOGIL_BYTES (32 * 1024)
#endif
/* One EVP update takes an int length: longer bodies are fed in pieces of this size. */
#define UPDATE_PIECE (1 << 30)

/* ---- libcrypto, loaded at run time ---------------------------------------------------------- */

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;
typedef struct evp_cipher_st EVP_CIPHER;
#define EVP_CTRL_GCM_GET_TAG 0x10

static struct {
    EVP_CIPHER_CTX *(*ctx_new)(void);
    void (*ctx_free)(EVP_CIPHER_CTX *);
    const EVP_CIPHER *(*aes_256_gcm)(void);
    int (*encrypt_init)(EVP_CIPHER_CTX *, const EVP_CIPHER *, void *engine, const unsigned char *key,
                        const unsigned char *iv);
    int (*encrypt_update)(EVP_CIPHER_CTX *, unsigned char *out, int *outl, const unsigned char *in, int inl);
    int (*encrypt_final)(EVP_CIPHER_CTX *, unsigned char *out, int *outl);
    int (*ctx_ctrl)(EVP_CIPHER_CTX *, int type, int arg, void *ptr);
    unsigned long (*version_num)(void);
} g_evp;

static void *g_libcrypto;        /* the loaded library, or NULL */
static const char *g_lib_name;   /* which name loaded */
static char g_load_error[512];   /* why it did not, once tried */

static int load_libcrypto(void) {
    if (g_libcrypto != NULL) return 0;
    if (g_load_error[0] != '\0') return -1;
    /* libcrypto.so.3 first (OpenSSL 3, what current Pythons link); 1.1 has the same calls; the
     * unversioned name only where a -dev package provides it. */
    static const char *names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"};
    char tried[384] = "";
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            const char *why = dlerror();
            size_t used = strlen(tried);
            snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "", why ? why : names[i]);
            continue;
        }
        struct {
            const char *name;
            void **slot;
        } want[] = {
            {"EVP_CIPHER_CTX_new", (void **)&g_evp.ctx_new},
            {"EVP_CIPHER_CTX_free", (void **)&g_evp.ctx_free},
            {"EVP_aes_256_gcm", (void **)&g_evp.aes_256_gcm},
            {"EVP_EncryptInit_ex", (void **)&g_evp.encrypt_init},
            {"EVP_EncryptUpdate", (void **)&g_evp.encrypt_update},
            {"EVP_EncryptFinal_ex", (void **)&g_evp.encrypt_final},
            {"EVP_CIPHER_CTX_ctrl", (void **)&g_evp.ctx_ctrl},
            {"OpenSSL_version_num", (void **)&g_evp.version_num},
        };
        const char *missing = NULL;
        for (size_t j = 0; j < sizeof want / sizeof *want && missing == NULL; j++) {
            *want[j].slot = dlsym(lib, want[j].name);
            if (*want[j].slot == NULL) missing = want[j].name;
        }
        if (missing == NULL && g_evp.version_num() < 0x10100000UL) missing = "OpenSSL 1.1 or later";
        if (missing != NULL) {
            size_t used = strlen(tried);
            snprintf(tried + used, sizeof tried - used, "%s%s lacks %s", used ? "; " : "", names[i], missing);
            memset(&g_evp, 0, sizeof g_evp);
            dlclose(lib);
            continue;
        }
        g_libcrypto = lib;
        g_lib_name = names[i];
        return 0;
    }
    snprintf(g_load_error, sizeof g_load_error, "libcrypto could not be loaded (%s)", tried);
    return -1;
}

PyObject *sealcore_load_aead(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (load_libcrypto() < 0) {
        PyErr_SetString(PyExc_OSError, g_load_error);
        return NULL;
    }
    return PyUnicode_FromString(g_lib_name);
}

/* ---- SealSession ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    unsigned char key[KEY_BYTES];       /* K_S, derived by the caller */
    unsigned char prefix[HEADER_BYTES]; /* codec (set per seal), key id, session id, counter (per seal) */
    PyObject *id;                       /* the session id, bytes */
    PyObject *key_id;                   /* the key id, bytes */
    uint64_t next;                      /* the next counter (atomic) */
    uint64_t limit;                     /* counters from here on are never used */
    uint64_t epoch;                     /* the process that made it (forkwatch.h) */
    Py_ssize_t compress_from;           /* 0, or values this long go to the Python path (compressed first) */
    int trace_fd;                       /* -1, or AGENTWAL_TRACE_NONCES's file */
    int pooled;
    EVP_CIPHER_CTX *pool[POOL_MAX];
} SealSession;

static void put_u64_le(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int session_live(SealSession *s) { return s->epoch == forkwatch_now(); }

/* A context with the session's key set, for one seal; NULL with an exception set. GIL held. */
static EVP_CIPHER_CTX *ctx_take(SealSession *s) {
    if (s->pooled > 0) return s->pool[--s->pooled];
    EVP_CIPHER_CTX *ctx = g_evp.ctx_new();
    if (ctx == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (g_evp.encrypt_init(ctx, g_evp.aes_256_gcm(), NULL, s->key, NULL) != 1) {
        g_evp.ctx_free(ctx);
        PyErr_SetString(PyExc_RuntimeError, "libcrypto's AES-256-GCM refused the session key");
        return NULL;
    }
    return ctx;
}

/* GIL held. */
static void ctx_give(SealSession *s, EVP_CIPHER_CTX *ctx) {
    if (s->pooled < POOL_MAX)
        s->pool[s->pooled++] = ctx;
    else
        g_evp.ctx_free(ctx);
}

static int aad(EVP_CIPHER_CTX *ctx, const char *p, Py_ssize_t n) {
    int outl;
    if (n > INT_MAX) return 0; /* contexts are names and keys: never near this */
    return n == 0 || g_evp.encrypt_update(ctx, NULL, &outl, (const unsigned char *)p, (int)n) == 1;
}

/* Encrypt `body` into out (ciphertext, then the tag) under `nonce`: 1 on success. Touches no
 * Python object: may run without the GIL. */
static int gcm_seal(EVP_CIPHER_CTX *ctx, const unsigned char *nonce, const unsigned char *header, const char *ctx1,
                    Py_ssize_t ctx1_len, const char *ctx2, Py_ssize_t ctx2_len, const char *body, Py_ssize_t len,
                    unsigned char *out) {
    if (g_evp.encrypt_init(ctx, NULL, NULL, NULL, nonce) != 1) return 0;
    if (!aad(ctx, (const char *)header, HEADER_BYTES) || !aad(ctx, ctx1, ctx1_len) || !aad(ctx, ctx2, ctx2_len))
        return 0;
    Py_ssize_t done = 0;
    while (done < len) {
        int piece = len - done > UPDATE_PIECE ? UPDATE_PIECE : (int)(len - done), outl = 0;
        if (g_evp.encrypt_update(ctx, out + done, &outl, (const unsigned char *)body + done, piece) != 1 ||
            outl != piece)
            return 0;
        done += piece;
    }
    int outl = 0;
    if (g_evp.encrypt_final(ctx, out + len, &outl) != 1 || outl != 0) return 0;
    return g_evp.ctx_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG_BYTES, out + len) == 1;
}

static void trace(SealSession *s, uint64_t n) {
    static const char hex[] = "0123456789abcdef";
    char line[2 * (KEY_ID_BYTES + SESSION_BYTES) + 2 + 21 + 1];
    char *p = line;
    for (int i = 1; i < 1 + KEY_ID_BYTES + SESSION_BYTES; i++) {
        *p++ = hex[s->prefix[i] >> 4];
        *p++ = hex[s->prefix[i] & 15];
        if (i == KEY_ID_BYTES) *p++ = ' ';
    }
    int tail = snprintf(p, sizeof line - (size_t)(p - line), " %llu\n", (unsigned long long)n);
    (void)!write(s->trace_fd, line, (size_t)(p - line) + (size_t)tail);
}

int seal_session_takes(PyObject *o, Py_ssize_t len) {
    if (!PyObject_TypeCheck(o, &SealSessionType)) return 0;
    SealSession *s = (SealSession *)o;
    return session_live(s) && (s->compress_from == 0 || len < s->compress_from) &&
           __atomic_load_n(&s->next, __ATOMIC_RELAXED) < s->limit;
}

PyObject *seal_session_begin(PyObject *o, int codec, Py_ssize_t len, seal_job *job) {
    SealSession *s = (SealSession *)o;
    if (!session_live(s)) return NULL;
    uint64_t n = __atomic_fetch_add(&s->next, 1, __ATOMIC_RELAXED);
    if (n >= s->limit) return NULL;
    if (s->trace_fd >= 0) trace(s, n); /* before the counter is used, as the Python path does */
    PyObject *env = PyBytes_FromStringAndSize(NULL, HEADER_BYTES + len + TAG_BYTES);
    if (env == NULL) return NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(env);
    memcpy(out, s->prefix, HEADER_BYTES - 8);
    out[0] = (unsigned char)codec;
    put_u64_le(out + HEADER_BYTES - 8, n);
    if ((job->ctx = ctx_take(s)) == NULL) {
        Py_DECREF(env);
        return NULL;
    }
    job->out = out;
    job->len = len;
    return env;
}

int seal_job_run(seal_job *job, const char *body, const char *ctx1, Py_ssize_t ctx1_len, const char *ctx2,
                 Py_ssize_t ctx2_len) {
    unsigned char nonce[NONCE_BYTES] = {0};
    memcpy(nonce, job->out + HEADER_BYTES - 8, 8); /* the counter, then four zero bytes */
    return gcm_seal(job->ctx, nonce, job->out, ctx1, ctx1_len, ctx2, ctx2_len, body, job->len,
                    job->out + HEADER_BYTES);
}

int seal_job_run_holding_gil(seal_job *job, const char *body, const char *ctx1, Py_ssize_t ctx1_len,
                             const char *ctx2, Py_ssize_t ctx2_len) {
    if (job->len < SEAL_NOGIL_BYTES) return seal_job_run(job, body, ctx1, ctx1_len, ctx2, ctx2_len);
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = seal_job_run(job, body, ctx1, ctx1_len, ctx2, ctx2_len);
    Py_END_ALLOW_THREADS
    return ok;
}

int seal_job_end(PyObject *o, seal_job *job, int ok) {
    if (ok) {
        ctx_give((SealSession *)o, job->ctx);
        return 0;
    }
    g_evp.ctx_free(job->ctx); /* never seen: the context is dropped, not reused */
    PyErr_SetString(PyExc_RuntimeError, "libcrypto's AES-256-GCM failed to seal a value");
    return -1;
}

PyObject *seal_session_seal(PyObject *o, int codec, const char *body, Py_ssize_t len, const char *ctx1,
                            Py_ssize_t ctx1_len, const char *ctx2, Py_ssize_t ctx2_len) {
    seal_job job;
    PyObject *env = seal_session_begin(o, codec, len, &job);
    if (env == NULL) return NULL;
    int ok = seal_job_run_holding_gil(&job, body, ctx1, ctx1_len, ctx2, ctx2_len);
    if (seal_job_end(o, &job, ok) < 0) {
        Py_DECREF(env);
        return NULL;
    }
    return env;
}

static int bytes_arg(PyObject *o, Py_ssize_t n, const char *what) {
    if (PyBytes_Check(o) && PyBytes_GET_SIZE(o) == n) return 0;
    PyErr_Format(PyExc_ValueError, "SealSession: %s must be %zd bytes", what, n);
    return -1;
}

/* SealSession(key, key_id, session_id, limit, trace_fd, compress_from) */
static PyObject *session_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"key", "key_id", "session_id", "limit", "trace_fd", "compress_from", NULL};
    PyObject *key, *kid, *sid;
    unsigned long long limit;
    int trace_fd;
    Py_ssize_t compress_from;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOKin:SealSession", kwlist, &key, &kid, &sid, &limit, &trace_fd,
                                     &compress_from))
        return NULL;
    if (bytes_arg(key, KEY_BYTES, "key") < 0 || bytes_arg(kid, KEY_ID_BYTES, "key_id") < 0 ||
        bytes_arg(sid, SESSION_BYTES, "session_id") < 0)
        return NULL;
    if (compress_from < 0) {
        PyErr_SetString(PyExc_ValueError, "SealSession: compress_from must be >= 0");
        return NULL;
    }
    if (load_libcrypto() < 0) {
        PyErr_SetString(PyExc_OSError, g_load_error);
        return NULL;
    }
    SealSession *s = (SealSession *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    memcpy(s->key, PyBytes_AS_STRING(key), KEY_BYTES);
    s->prefix[0] = CODEC_ENCRYPTED;
    memcpy(s->prefix + 1, PyBytes_AS_STRING(kid), KEY_ID_BYTES);
    memcpy(s->prefix + 1 + KEY_ID_BYTES, PyBytes_AS_STRING(sid), SESSION_BYTES);
    s->id = PyBytes_FromStringAndSize(PyBytes_AS_STRING(sid), SESSION_BYTES);
    s->key_id = PyBytes_FromStringAndSize(PyBytes_AS_STRING(kid), KEY_ID_BYTES);
    s->limit = limit;
    s->epoch = forkwatch_epoch();
    s->trace_fd = trace_fd;
    s->compress_from = compress_from;
    if (s->id == NULL || s->key_id == NULL) {
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

static void session_dealloc(SealSession *s) {
    while (s->pooled > 0) g_evp.ctx_free(s->pool[--s->pooled]);
    explicit_bzero(s->key, sizeof s->key);
    Py_XDECREF(s->id);
    Py_XDECREF(s->key_id);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* seal(codec, body, context) -> envelope | None (used up: start a new session) */
static PyObject *session_seal(SealSession *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyLong_Check(args[0]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "seal takes (codec: int, body: bytes-like, context: bytes)");
        return NULL;
    }
    long codec = PyLong_AsLong(args[0]);
    if (codec != CODEC_ENCRYPTED && codec != (CODEC_ENCRYPTED | CODEC_ZSTD)) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "seal: codec 0x%lx is not an encrypted one", codec);
        return NULL;
    }
    Py_buffer body;
    if (PyObject_GetBuffer(args[1], &body, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *env = seal_session_seal((PyObject *)s, (int)codec, body.buf, body.len, PyBytes_AS_STRING(args[2]),
                                      PyBytes_GET_SIZE(args[2]), NULL, 0);
    PyBuffer_Release(&body);
    if (env == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return env;
}

static PyObject *session_get_used(SealSession *s, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&s->next, __ATOMIC_RELAXED));
}

static PyObject *session_get_live(SealSession *s, void *closure) {
    (void)closure;
    return PyBool_FromLong(session_live(s) && __atomic_load_n(&s->next, __ATOMIC_RELAXED) < s->limit);
}

static PyMethodDef session_methods[] = {
    {"seal", (PyCFunction)(void (*)(void))session_seal, METH_FASTCALL,
     "seal(codec, body, context) -> the envelope, or None when the session is used up (limit, fork)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef session_members[] = {
    {"id", T_OBJECT, offsetof(SealSession, id), READONLY, "The session id (16 random bytes)."},
    {"key_id", T_OBJECT, offsetof(SealSession, key_id), READONLY, "The master key's id (8 bytes)."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef session_getset[] = {
    {"used", (getter)session_get_used, NULL, "Counters handed out so far (the next one).", NULL},
    {"live", (getter)session_get_live, NULL, "Whether it may seal: under its limit, in the process that made it.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SealSessionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wal._storecore.SealSession",
    .tp_basicsize = sizeof(SealSession),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One AES-256-GCM sealing session: derived key, ids and nonce counter (native/sealcore.c).",
    .tp_new = session_new,
    .tp_dealloc = (destructor)session_dealloc,
    .tp_methods = session_methods,
    .tp_members = session_members,
    .tp_getset = session_getset,
};

int sealcore_add(PyObject *module) {
    if (PyType_Ready(&SealSessionType) < 0) return -1;
    Py_INCREF(&SealSessionType);
    if (PyModule_AddObject(module, "SealSession", (PyObject *)&SealSessionType) < 0) {
        Py_DECREF(&SealSessionType);
        return -1;
    }
    return 0;
}
