/*
 * sealcore.h -- AES-256-GCM sealing sessions in C, for wal._storecore (see native/sealcore.c).
 *
 * A SealSession is one sealing session of wal/crypto/sealing.py (its module docstring,
 * "Nonces"): a derived key K_S, the key id and session id of its envelope header, and the one
 * nonce counter of that session. The Python Sealer holds it as its `_session` when libcrypto
 * loads; the sealed Store.put (storecore.c, FastCommit) seals through the same object, so both
 * paths take their counters from one atomic counter.
 */
#ifndef WAL_SEALCORE_H
#define WAL_SEALCORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

extern PyTypeObject SealSessionType;

/* The bytes an envelope adds to the body it seals: its header (codec, key id, session id,
 * counter) and the GCM tag (wal/crypto/sealing.py, OVERHEAD; FORMAT.md §19). */
#define SEAL_ENVELOPE_OVERHEAD 49
/* ... of which the header, before the ciphertext. */
#define SEAL_HEADER_BYTES 33

/* Ready the type and add SealSession to `module`: 0, or -1 with an exception set. */
int sealcore_add(PyObject *module);

/* load_aead() -> the name of the libcrypto loaded (dlopen, once); OSError saying why when none
 * could be. A module function of wal._storecore. */
PyObject *sealcore_load_aead(PyObject *self, PyObject *unused);

/* Whether `o` is a SealSession that may seal a value of `len` bytes on the C commit path: not
 * used up or inherited across a fork, and the value below the size from which its Sealer
 * compresses (those take the Python path, which compresses first). */
int seal_session_takes(PyObject *o, Py_ssize_t len);

/* The envelope (new bytes) of `body` under `codec` (0x80 or 0x81), with associated data
 * header || ctx1 || ctx2. NULL with no exception set: the session is used up (its limit, or a
 * fork) -- the caller goes to the Python path, which starts a new one; NULL with an exception
 * set: an error (out of memory, the library failed). Called with the GIL held; large bodies
 * are encrypted with it released (seal_job_run_holding_gil). */
PyObject *seal_session_seal(PyObject *o, int codec, const char *body, Py_ssize_t len, const char *ctx1,
                            Py_ssize_t ctx1_len, const char *ctx2, Py_ssize_t ctx2_len);

/* seal_session_seal in three steps, for a caller that encrypts after letting the GIL go
 * (storecore.c, "The sealed put"). seal_session_begin (GIL held) takes the counter and a cipher
 * context and returns the envelope with its header written and its ciphertext and tag still to
 * come -- NULL as seal_session_seal; seal_job_run (GIL held or not: it touches no Python
 * object) encrypts `body`, of the length begun with, into it: 1 on success; seal_job_end (GIL
 * held), called once after every begin that returned an envelope, gives the context back: 0,
 * or -1 with an exception set when the run failed (`ok` 0; the envelope must then be
 * dropped). The session, body and context bytes must outlive the run. */
typedef struct {
    void *ctx;          /* the cipher context lent to this seal */
    unsigned char *out; /* the envelope's bytes */
    Py_ssize_t len;     /* the body's length */
} seal_job;
PyObject *seal_session_begin(PyObject *o, int codec, Py_ssize_t len, seal_job *job);
int seal_job_run(seal_job *job, const char *body, const char *ctx1, Py_ssize_t ctx1_len, const char *ctx2,
                 Py_ssize_t ctx2_len);
/* seal_job_run called with the GIL held, which it lets go for a large body (sealcore.c says when). */
int seal_job_run_holding_gil(seal_job *job, const char *body, const char *ctx1, Py_ssize_t ctx1_len,
                             const char *ctx2, Py_ssize_t ctx2_len);
int seal_job_end(PyObject *o, seal_job *job, int ok);

#endif
