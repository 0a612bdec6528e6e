/*
 * forkwatch.h -- which process is running: an epoch that differs in every forked child.
 *
 * Why. Objects made in one process must not act in a child forked from it: a log would hand
 * out LSNs its parent also hands out, a sealing session would reuse its parent's nonces, an
 * LMDB environment must not be used across a fork at all. Every fork must be seen, whoever
 * makes it: os.fork, libc fork() called straight (ctypes, a C extension), glibc's _Fork() and a
 * raw clone(2) without CLONE_VM -- the last two run no pthread_atfork handler, so counting forks
 * in one misses them.
 *
 * How. The epoch is kept in a page marked MADV_WIPEONFORK, which the kernel gives every child
 * zeroed, from the child's first instruction on. An object records `forkwatch_epoch()` when it
 * is made (drawing a random epoch if this process has none yet) and compares it with
 * `forkwatch_now()` before it acts: a load, cheap enough for every append. Where the kernel has
 * no MADV_WIPEONFORK (before Linux 4.14) the epoch is the pid, read at every check (getpid(2),
 * ~0.2 us on the measuring machine).
 *
 * Each extension module that links forkwatch.c has its own page; epochs are compared only
 * within one module.
 */
#ifndef WAL_FORKWATCH_H
#define WAL_FORKWATCH_H

#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

/* The epoch page, or NULL where MADV_WIPEONFORK is missing (or before the first forkwatch_epoch). */
extern uint64_t *forkwatch_page;

/* This process's epoch for an object made now: never 0, the same for every call in one
 * process, different in every child. Thread-safe. */
uint64_t forkwatch_epoch(void);

/* This process's epoch as an object made earlier compares it: 0 in a child that has drawn none
 * yet, so no object made before a fork ever matches in the child. */
static inline uint64_t forkwatch_now(void) {
    uint64_t *page = __atomic_load_n(&forkwatch_page, __ATOMIC_ACQUIRE);
    if (page == NULL) return (uint64_t)getpid();
    return __atomic_load_n(page, __ATOMIC_ACQUIRE);
}

#endif
