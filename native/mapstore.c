/*
 * mapstore.c -- writing a segment's bytes through a shared mapping (io.h:
 * wal_io_map, wal_io_unmap, wal_io_store).
 *
 * Why. At `interval` a commit is acknowledged once its bytes are in the OS
 * (README, "Durability levels"): a process kill must not lose it, an OS crash may lose the last
 * rpo_ms. A write() per commit pays a system call (~0.5 us here) for that. A
 * store into a MAP_SHARED mapping of the segment puts the bytes in the same
 * page-cache pages write() would, with no system call: they survive a kill of
 * the process exactly as written bytes do, and the flusher's fdatasync writes
 * them back like any dirty page (the kernel write-protects a page it cleans, so
 * a later store dirties it again).
 *
 * The contract that makes a store safe (kept by writer.c):
 *   - only bytes below the segment's zeroed mark are stored this way: blocks
 *     already given to the file by a write() of zeros, so a store never has to
 *     allocate (on a copy-on-write filesystem it would, and a full disk would
 *     then be a SIGBUS instead of ENOSPC -- writer.c maps only on filesystems
 *     that overwrite in place);
 *   - while a failpoint is armed nothing is stored, every write goes through
 *     wal_io_pwrite_all, so fault injection sees the same calls whichever path
 *     a log takes.
 *
 * A page that must be read back from the disk for the store (evicted since it
 * was zeroed) can fail to read; the kernel reports that to a store as SIGBUS,
 * to a write() as EIO. wal_io_store turns it back into -EIO: a process-wide
 * SIGBUS handler, installed at the first mapping, jumps out of a store in
 * progress on this thread and otherwise hands the signal to whatever handler
 * was there before (Python's faulthandler, or the default action: the process
 * dies as it would have). SA_NODEFER keeps SIGBUS unblocked after the jump.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>

#include "io.h"

/* Set only while this thread stores into a mapping. initial-exec: read from a signal handler,
 * it must not need the lazy allocation of dynamic TLS. */
static __thread sigjmp_buf *t_store_jmp __attribute__((tls_model("initial-exec")));
static struct sigaction g_prev_bus;
static pthread_once_t g_bus_once = PTHREAD_ONCE_INIT;
static int g_bus_installed;

static void on_sigbus(int sig, siginfo_t *info, void *uctx) {
    sigjmp_buf *jb = t_store_jmp;
    if (jb) {
        t_store_jmp = NULL;
        siglongjmp(*jb, 1);
    }
    if (g_prev_bus.sa_flags & SA_SIGINFO) {
        g_prev_bus.sa_sigaction(sig, info, uctx);
    } else if (g_prev_bus.sa_handler == SIG_DFL || g_prev_bus.sa_handler == SIG_IGN) {
        /* Not a store of ours: restore the default and return; the faulting access runs
         * again and the process ends the way it would have without this handler. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGBUS, &dfl, NULL);
    } else {
        g_prev_bus.sa_handler(sig);
    }
}

static void install_sigbus(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    g_bus_installed = sigaction(SIGBUS, &sa, &g_prev_bus) == 0;
}

int wal_io_map(int fd, uint64_t off, uint64_t len, uint8_t **out) {
    *out = NULL;
    pthread_once(&g_bus_once, install_sigbus);
    if (!g_bus_installed) return -ENOTSUP; /* no way to turn a failed page-in into an error */
    void *p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
    if (p == MAP_FAILED) return -errno;
    *out = p;
    return 0;
}

void wal_io_unmap(uint8_t *map, uint64_t len) {
    if (map) munmap(map, (size_t)len);
}

int wal_io_store(uint8_t *dst, const void *buf, size_t len) {
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0)) return -EIO; /* the handler cleared t_store_jmp */
    t_store_jmp = &jb;
    __atomic_signal_fence(__ATOMIC_SEQ_CST); /* armed before the first byte is stored */
    memcpy(dst, buf, len);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    t_store_jmp = NULL;
    return 0;
}
