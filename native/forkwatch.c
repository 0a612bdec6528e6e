/* forkwatch.c -- the process epoch (forkwatch.h says why and how). */
#include "forkwatch.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>

uint64_t *forkwatch_page;
static pthread_once_t g_page_once = PTHREAD_ONCE_INIT;

static void map_page(void) {
    long size = sysconf(_SC_PAGESIZE);
    size_t bytes = (size_t)(size > 0 ? size : 4096);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
#ifdef MADV_WIPEONFORK
    if (madvise(p, bytes, MADV_WIPEONFORK) == 0) {
        __atomic_store_n(&forkwatch_page, (uint64_t *)p, __ATOMIC_RELEASE);
        return;
    }
#endif
    munmap(p, bytes); /* the pid it is, then */
}

uint64_t forkwatch_epoch(void) {
    pthread_once(&g_page_once, map_page);
    uint64_t epoch = forkwatch_now();
    if (epoch != 0) return epoch;
    uint64_t fresh = 0;
    while (fresh == 0) {
        if (getrandom(&fresh, sizeof fresh, 0) != (ssize_t)sizeof fresh) {
            /* No entropy call (seccomp, an old kernel): the pid and the clock tell this child
             * from its parent, whose epoch was drawn in another process at another time. */
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            fresh = ((uint64_t)getpid() << 40) ^ ((uint64_t)now.tv_sec << 30) ^ (uint64_t)now.tv_nsec;
        }
    }
    /* Two threads of one child may both draw: the first stored wins, and both use it. */
    if (!__atomic_compare_exchange_n(forkwatch_page, &epoch, fresh, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return epoch;
    return fresh;
}
