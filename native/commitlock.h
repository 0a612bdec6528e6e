/*
 * commitlock.h -- the store's commit lock (wal._storecore.CommitLock).
 *
 * Why not threading.Lock. The C commit path (storecore.c) takes the commit lock on every
 * put with a non-blocking try and lets it go a microsecond later. On a threading.Lock
 * that is two Python calls, a monotonic clock read and a sem_post: ~3.5% of a put. Here
 * the lock is a flag guarded by the GIL: trying and releasing it are a test and a store,
 * plus a mutex and a signal only when some thread is waiting.
 *
 * Protocol. `locked` is read and written only with the GIL held. A thread that must wait
 * (a blocking acquire from the Python path) takes `mu` while it still holds the GIL,
 * counts itself in `waiters`, notes `gen`, releases the GIL and sleeps on `cv` until
 * `gen` moves; then it lets `mu` go, takes the GIL back and tries again. A release
 * clears `locked` and, if `waiters` is not 0, bumps `gen` and signals under `mu`.
 *  - No lost wake-up: the waiter checks `locked` and joins `waiters` in one stretch of
 *    holding the GIL, and a release needs the GIL to clear `locked`, so the release that
 *    frees the lock comes after the waiter counted itself, sees the count (the GIL's
 *    hand-over orders the two), and its `gen` bump under `mu` cannot fall between the
 *    waiter's check of `gen` and its sleep.
 *  - No deadlock with the GIL: `mu` is only ever held for a few instructions, never
 *    while waiting for the GIL (a woken waiter drops `mu` before taking the GIL back).
 *  - Not fair, like threading.Lock: a woken waiter may find the lock taken again by a
 *    thread that never slept, and then waits for the next release.
 *  - A blocked acquire is not interrupted by a signal (KeyboardInterrupt): the lock is
 *    only ever held for in-memory work, so it waits microseconds.
 *  - Fork. A child has only the forking thread: a lock another thread held at the fork is
 *    held by nobody, forever. os.fork() resets it (threading's hooks: _at_fork_reinit); a
 *    fork past Python's hooks (libc's fork through ctypes or a C extension) did not, and the
 *    child's first commit waited forever instead of being refused by the log. A lock
 *    remembers the process it was set up in (forkwatch.h): one first acquired through its
 *    Python face in another process starts over there.
 */
#ifndef WAL_COMMITLOCK_H
#define WAL_COMMITLOCK_H

#include <Python.h>
#include <pthread.h>
#include <stdint.h>

#include "forkwatch.h"

typedef struct {
    PyObject_HEAD
    int locked;     /* GIL-guarded */
    int waiters;    /* threads asleep or about to sleep on cv; changed under mu, atomically */
    uint64_t gen;   /* releases that found waiters; under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t epoch; /* the process it was set up (or last started over) in: forkwatch_epoch */
} CommitLock;

extern PyTypeObject CommitLockType;

/* Non-blocking acquire, GIL held: 1 if taken. */
static inline int commitlock_try(CommitLock *l) {
    if (l->locked) return 0;
    l->locked = 1;
    return 1;
}

void commitlock_wake(CommitLock *l);

/* Release a lock this thread's caller holds, GIL held. */
static inline void commitlock_release(CommitLock *l) {
    l->locked = 0;
    if (__atomic_load_n(&l->waiters, __ATOMIC_RELAXED) != 0) commitlock_wake(l);
}

#endif
