/*
 * failpoint.c -- test-only fault injection at the I/O sites of io.h, and the
 * io.h wrappers themselves.
 *
 * A failpoint fails the Nth call of its site from the moment it is armed
 * (and every later call when `repeat`), or each call with a seeded
 * probability. Writes may be made to go half through first, leaving a torn
 * record on disk as a failing device would. A site may also be made slow (every
 * call sleeps first), to hold an I/O slot busy while other commits arrive.
 * Arming is process-wide; tests arm and clear around one scenario.
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "wal.h"

int wal_fp_active;

typedef struct {
    int err;           /* errno to inject (0 = site disarmed) */
    uint64_t nth;      /* fail the nth call after arming (0: use prob) */
    int repeat;        /* keep failing after the first failure */
    uint32_t prob_ppm; /* per-call probability in parts per million */
    uint64_t rng;      /* xorshift state for prob */
    int partial;       /* writes: write half the bytes, then fail */
    uint64_t calls, failures;
} failpoint;

static failpoint fps[WAL_FP_COUNT];
static uint32_t delays_us[WAL_FP_COUNT];
static pthread_mutex_t fp_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *const fp_names[WAL_FP_COUNT] = {"write", "fsync", "dirsync", "open", "rename", "ftruncate"};

static int site_of(const char *name) {
    for (int i = 0; i < WAL_FP_COUNT; i++)
        if (strcmp(name, fp_names[i]) == 0) return i;
    return -1;
}

int wal_fp_set(const char *name, int err, uint64_t nth, int repeat, uint32_t prob_ppm, uint64_t seed,
               int partial) {
    int s = site_of(name);
    if (s < 0 || err <= 0 || (nth == 0 && prob_ppm == 0)) return WAL_EINVAL;
    pthread_mutex_lock(&fp_mu);
    fps[s] = (failpoint){err, nth, repeat, prob_ppm, seed ? seed : 0x9E3779B97F4A7C15ull, partial, 0, 0};
    __atomic_store_n(&wal_fp_active, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&fp_mu);
    return WAL_OK;
}

int wal_fp_set_delay(const char *name, uint32_t delay_us) {
    int s = site_of(name);
    if (s < 0) return WAL_EINVAL;
    pthread_mutex_lock(&fp_mu);
    delays_us[s] = delay_us;
    if (delay_us) __atomic_store_n(&wal_fp_active, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&fp_mu);
    return WAL_OK;
}

void wal_fp_clear(void) {
    pthread_mutex_lock(&fp_mu);
    memset(fps, 0, sizeof fps);
    memset(delays_us, 0, sizeof delays_us);
    __atomic_store_n(&wal_fp_active, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&fp_mu);
}

int64_t wal_fp_count(const char *name, int failures) {
    int s = site_of(name);
    if (s < 0) return WAL_EINVAL;
    pthread_mutex_lock(&fp_mu);
    uint64_t v = failures ? fps[s].failures : fps[s].calls;
    pthread_mutex_unlock(&fp_mu);
    return (int64_t)v;
}

int wal_fp_check(int site, int *partial) {
    int rc = 0;
    pthread_mutex_lock(&fp_mu);
    uint32_t delay = delays_us[site];
    pthread_mutex_unlock(&fp_mu);
    if (delay) usleep(delay); /* outside fp_mu: other sites and threads go on meanwhile */
    pthread_mutex_lock(&fp_mu);
    failpoint *f = &fps[site];
    if (f->err) {
        f->calls++;
        int fire;
        if (f->nth) {
            fire = f->calls == f->nth || (f->repeat && f->calls > f->nth);
        } else {
            f->rng ^= f->rng << 13;
            f->rng ^= f->rng >> 7;
            f->rng ^= f->rng << 17;
            fire = (f->rng % 1000000u) < f->prob_ppm;
        }
        if (fire) {
            f->failures++;
            rc = -f->err;
            if (partial) *partial = f->partial;
        }
    }
    pthread_mutex_unlock(&fp_mu);
    return rc;
}

#define FAILPOINT(site)                                                        \
    do {                                                                       \
        if (__builtin_expect(__atomic_load_n(&wal_fp_active, __ATOMIC_ACQUIRE), 0)) { \
            int fp_rc_ = wal_fp_check(site, NULL);                             \
            if (fp_rc_) return fp_rc_;                                         \
        }                                                                      \
    } while (0)

int wal_io_open(const char *path, int flags, int mode) {
    FAILPOINT(WAL_FP_OPEN);
    int fd;
    do fd = open(path, flags | O_CLOEXEC, mode);
    while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : fd;
}

ssize_t wal_io_pwrite_all(int fd, const void *buf, size_t len, uint64_t off) {
    if (__builtin_expect(__atomic_load_n(&wal_fp_active, __ATOMIC_ACQUIRE), 0)) {
        int partial = 0;
        int rc = wal_fp_check(WAL_FP_WRITE, &partial);
        if (rc) {
            if (partial && len > 1) (void)!pwrite(fd, buf, len / 2, (off_t)off);
            return rc;
        }
    }
    const uint8_t *p = buf;
    size_t left = len;
    while (left) {
        ssize_t n = pwrite(fd, p, left, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) return -EIO;
        p += n;
        off += (uint64_t)n;
        left -= (size_t)n;
    }
    return (ssize_t)len;
}

ssize_t wal_io_pwritev_all(int fd, struct iovec *iov, int cnt, uint64_t off) {
    size_t total = 0;
    for (int i = 0; i < cnt; i++) total += iov[i].iov_len;
    if (__builtin_expect(__atomic_load_n(&wal_fp_active, __ATOMIC_ACQUIRE), 0)) {
        int partial = 0;
        int rc = wal_fp_check(WAL_FP_WRITE, &partial);
        if (rc) {
            if (partial && total > 1) { /* iov[0] (bytes rewritten) and the first half of the rest */
                size_t half = iov[0].iov_len + (total - iov[0].iov_len) / 2;
                for (int i = 0; i < cnt && half; i++) {
                    size_t n = iov[i].iov_len < half ? iov[i].iov_len : half;
                    (void)!pwrite(fd, iov[i].iov_base, n, (off_t)off);
                    off += n;
                    half -= n;
                }
            }
            return rc;
        }
    }
    size_t left = total;
    while (left) {
        while (cnt && iov->iov_len == 0) iov++, cnt--;
        ssize_t n = pwritev(fd, iov, cnt, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) return -EIO;
        off += (uint64_t)n;
        left -= (size_t)n;
        for (size_t k = (size_t)n; k;) { /* skip what went out */
            size_t step = k < iov->iov_len ? k : iov->iov_len;
            iov->iov_base = (uint8_t *)iov->iov_base + step;
            iov->iov_len -= step;
            k -= step;
            if (iov->iov_len == 0 && k) iov++, cnt--;
        }
    }
    return (ssize_t)total;
}

int wal_io_fdatasync(int fd) {
    FAILPOINT(WAL_FP_FSYNC);
    return fdatasync(fd) < 0 ? -errno : 0; /* never retried: see I5 in commit.c */
}

int wal_io_fsync(int fd) {
    FAILPOINT(WAL_FP_FSYNC);
    return fsync(fd) < 0 ? -errno : 0;
}

int wal_io_fsync_dir(const char *dir) {
    FAILPOINT(WAL_FP_DIRSYNC);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

int wal_io_rename(const char *from, const char *to) {
    FAILPOINT(WAL_FP_RENAME);
    return rename(from, to) < 0 ? -errno : 0;
}

int wal_io_ftruncate(int fd, uint64_t size) {
    FAILPOINT(WAL_FP_FTRUNCATE);
    int rc;
    do rc = ftruncate(fd, (off_t)size);
    while (rc < 0 && errno == EINTR);
    return rc < 0 ? -errno : 0;
}

int wal_io_close(int fd) { return close(fd) < 0 ? -errno : 0; }
