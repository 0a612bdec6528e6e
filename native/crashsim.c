/*
 * crashsim.c -- an LD_PRELOAD shim that journals every change a process makes
 * to the files and directories under one root, so that after the process is
 * killed at an arbitrary moment an offline step (wal/drill/crashsim.py) can put the
 * files into any state a disk could be in after a power cut at that moment.
 *
 * Test-only. Never imported as a Python module: setuptools builds it as
 * wal/_crashsim*.so and tests start children with LD_PRELOAD pointing at it
 * (wal.drill.crashsim.env_for). Models: RocksDB's FaultInjectionTestFS (remember
 * what was synced, drop the rest), SQLite's crash VFS (garble unsynced
 * sectors), CrashMonkey/ALICE (record the syscalls, replay subsets offline).
 *
 * Configuration (environment, read once at load):
 *   AGENTWAL_CRASHSIM_ROOT     absolute path; only files and directories under
 *                              it are tracked (the root itself: its entries)
 *   AGENTWAL_CRASHSIM_JOURNAL  absolute path of the journal, outside the root.
 *                              Files unlinked or replaced under the root are
 *                              hard-linked aside into JOURNAL.side/ (a copy
 *                              when a hard link is impossible) so an undone
 *                              unlink can bring back the very same inode.
 * Without both variables every wrapper is a plain pass-through.
 *
 * How the journal is written
 * --------------------------
 * Every tracked change is journaled BEFORE it is performed, with what is
 * needed to undo it (old bytes, old size, the name it replaced), under one
 * process-wide mutex that is held across "journal, then perform", so the old
 * bytes recorded are exactly the bytes the change overwrote. The journal fd is
 * O_APPEND and each record goes out in one write() call (looping only on a
 * short write), so the page cache holds every complete record even when the
 * process is SIGKILLed; a record cut short by the kill is recognised by its
 * length prefix and trailer and ignored. A change that fails after it was
 * journaled is harmless for data (undoing it restores the bytes it did not
 * change) and is cancelled by a CANCEL record for directory operations.
 * Sync markers are journaled AFTER the fsync returned 0, and cover only the
 * records that were complete when the fsync was called (`upto`), so an fsync
 * racing a write in another thread never claims that write is durable.
 *
 * Journal format (private to this file and wal/drill/crashsim.py)
 * ---------------------------------------------------------
 * The journal is a sequence of records, native byte order (little-endian on
 * every platform we build for). A record's position is its byte offset in the
 * journal; positions order all records of all processes writing the journal.
 *
 *   offset size field
 *        0    4 magic    0x314A5343 ("CSJ1")
 *        4    4 type     see REC_* below
 *        8    8 length   of the whole record, header + paths + data + trailer
 *       16    4 pid      process that wrote it
 *       20    4 flags    per type
 *       24    8 dev      st_dev  of the file (data/sync records) or of the
 *       32    8 ino      st_ino  parent directory (directory-entry records)
 *       40    8 a        \
 *       48    8 b         } per type
 *       56    8 c        /
 *       64    4 len1     bytes of path1 (no NUL)
 *       68    4 len2     bytes of path2 (no NUL)
 *       72    8 datalen  bytes of data
 *       80      path1, path2, data
 *   length-4  4 trailer  0x21444E45 ("END!")
 *
 * Paths are relative to the root ("" is the root itself).
 *
 *   type        meaning / undo                          fields
 *   1 START     a process started journaling            path1 = root, a = format version
 *   2 WRITE     bytes [a, a+b) of file (dev,ino) are     a = offset, b = length, c = old file
 *               about to be written; data = the old         size, data = old bytes of
 *               bytes of [a, min(a+b, c)). Undo: write       [a, min(a+b, c)); path1 = name (info)
 *               data at a, truncate to c.                   flags 1: old bytes unreadable (zeros)
 *   3 TRUNC     size of (dev,ino) goes c -> a; data =    a = new size, c = old size,
 *               the bytes cut [a, c) when shrinking.        data = cut bytes
 *               Undo: truncate to c, write data at a.
 *   4 FSYNC     fsync/fdatasync of (dev,ino) returned 0: a = upto: records at positions
 *               its data and size are durable up to a.      < a are covered; b = 0 fsync,
 *                                                           1 fdatasync, 2 O_DSYNC/O_SYNC write,
 *                                                           3 RWF_DSYNC/RWF_SYNC pwritev2
 *   5 DIRSYNC   fsync of directory (dev,ino) returned 0: a = upto
 *               its entries are durable up to a.
 *   6 SYNCALL   sync()/syncfs() returned: everything     a = upto
 *               is durable up to a.
 *   7 CREATE    a new entry path1 in directory (dev,ino) flags 1: by link/symlink
 *               (open O_CREAT of a missing file, link,
 *               symlink). Undo: unlink path1.
 *   8 MKDIR     directory path1 created in (dev,ino).
 *               Undo: remove it.
 *   9 UNLINK    file path1 removed from (dev,ino); its   path2 = name in JOURNAL.side/
 *               inode was linked aside as path2. Undo:      flags 1: path2 is a copy, not
 *               move path2 back to path1.                   the inode; 2: nothing saved
 *  10 RMDIR     empty directory path1 removed from
 *               (dev,ino). Undo: mkdir path1.
 *  11 RENAME    path1 -> path2, (dev,ino) = the new      c = old parent dev, a = old parent ino,
 *               parent. A replaced file was linked          b = renameat2 flags, data = side name
 *               aside as data. Undo: rename back,           flags 1: replaced file saved,
 *               restore what was replaced.                  2: replaced an empty directory,
 *                                                           4: the saved file is a copy
 *  12 CANCEL    the directory operation journaled at     a = its position
 *               position a failed: ignore it.
 *  13 NOTE      free text from agentwal_crashsim_note()  path1 = text
 *
 * Renames across the root's boundary are journaled as an UNLINK (moving out)
 * or a CREATE (moving in).
 *
 * What is NOT seen (documented for users in wal/drill/crashsim.py): stores through
 * mmap(MAP_SHARED) and msync; stdio (fopen/fwrite go through glibc-internal
 * calls); copy_file_range/sendfile/splice into tracked files; raw syscall(2);
 * io_uring/AIO; O_DIRECT is treated like buffered I/O; changes made by
 * processes that do not carry the shim. Writes from signal handlers to
 * tracked files may deadlock (pipes and sockets are fine).
 */
#undef _FORTIFY_SOURCE /* we define open() & co.; fortify's inline wrappers would clash */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define CRASHSIM_FORMAT 1
#define REC_MAGIC 0x314A5343u
#define REC_TRAILER 0x21444E45u

enum {
    REC_START = 1,
    REC_WRITE = 2,
    REC_TRUNC = 3,
    REC_FSYNC = 4,
    REC_DIRSYNC = 5,
    REC_SYNCALL = 6,
    REC_CREATE = 7,
    REC_MKDIR = 8,
    REC_UNLINK = 9,
    REC_RMDIR = 10,
    REC_RENAME = 11,
    REC_CANCEL = 12,
    REC_NOTE = 13,
};

typedef struct {
    uint32_t magic, type;
    uint64_t length;
    uint32_t pid, flags;
    uint64_t dev, ino;
    uint64_t a, b, c;
    uint32_t len1, len2;
    uint64_t datalen;
} rec_hdr;
_Static_assert(sizeof(rec_hdr) == 80, "journal header layout is part of the format");

#define EXPORT __attribute__((visibility("default")))

/* ---- the real functions ------------------------------------------------------------------- */

#define REAL(name) real_##name
#define LOAD(name)                                                                             \
    do {                                                                                       \
        if (!real_##name) real_##name = (__typeof__(real_##name))dlsym(RTLD_NEXT, #name);      \
    } while (0)
/* A symbol this libc lacks (close_range on an old glibc): fail the call like the kernel would. */
#define NEED(name, fail)                                                                       \
    do {                                                                                       \
        LOAD(name);                                                                            \
        if (!real_##name) {                                                                    \
            errno = ENOSYS;                                                                    \
            return fail;                                                                       \
        }                                                                                      \
    } while (0)

static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static int (*real_close)(int);
static int (*real_close_range)(unsigned int, unsigned int, int);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_fcntl)(int, int, ...);
static int (*real_fcntl64)(int, int, ...);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off64_t);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev64)(int, const struct iovec *, int, off64_t);
static ssize_t (*real_pwritev2)(int, const struct iovec *, int, off_t, int);
static ssize_t (*real_pwritev64v2)(int, const struct iovec *, int, off64_t, int);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off64_t);
static int (*real_truncate)(const char *, off_t);
static int (*real_truncate64)(const char *, off64_t);
static int (*real_fallocate)(int, int, off_t, off_t);
static int (*real_fallocate64)(int, int, off64_t, off64_t);
static int (*real_posix_fallocate)(int, off_t, off_t);
static int (*real_posix_fallocate64)(int, off64_t, off64_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_sync_file_range)(int, off64_t, off64_t, unsigned int);
static void (*real_sync)(void);
static int (*real_syncfs)(int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned int);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_rmdir)(const char *);
static int (*real_mkdir)(const char *, mode_t);
static int (*real_mkdirat)(int, const char *, mode_t);
static int (*real_linkat)(int, const char *, int, const char *, int);
static int (*real_symlink)(const char *, const char *);
static int (*real_symlinkat)(const char *, int, const char *);

/* ---- state ----------------------------------------------------------------------------------- */

static int g_active;               /* set once by the constructor when configured */
static char g_root[PATH_MAX];      /* realpath of the root */
static size_t g_rootlen;
static char g_side[PATH_MAX];      /* JOURNAL.side */
static int g_jfd = -1;             /* journal, O_APPEND */
static uint64_t g_sidectr;         /* names in the side directory */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
/* Set while this thread is inside the shim's critical section: any file call
 * made from there (by libc internals) goes straight to the real function. */
static __thread int t_busy __attribute__((tls_model("initial-exec")));

/* fd table. It only caches "this fd is not ours" (pipes, sockets, files outside
 * the root), so the hot path for those costs no system call. Tracked fds are
 * re-identified (fstat + /proc/self/fd) at every change, so a stale entry can
 * never attribute a change to the wrong file. close/dup2/dup3/F_DUPFD/
 * close_range reset the entry of the fd they (re)define. */
#define FD_MAX 65536
enum { FD_UNKNOWN = 0, FD_UNTRACKED = 1 };
static unsigned char g_fds[FD_MAX];

static void fd_forget(int fd) {
    if (fd >= 0 && fd < FD_MAX) __atomic_store_n(&g_fds[fd], FD_UNKNOWN, __ATOMIC_RELAXED);
}
static void fd_untracked(int fd) {
    if (fd >= 0 && fd < FD_MAX) __atomic_store_n(&g_fds[fd], FD_UNTRACKED, __ATOMIC_RELAXED);
}
static int fd_skip(int fd) {
    if (!g_active || t_busy || fd < 0) return 1;
    return fd < FD_MAX && __atomic_load_n(&g_fds[fd], __ATOMIC_RELAXED) == FD_UNTRACKED;
}

static void lock(void) {
    pthread_mutex_lock(&g_mu);
    t_busy = 1;
}
static void unlock(void) {
    t_busy = 0;
    pthread_mutex_unlock(&g_mu);
}

static void die(const char *what) {
    /* The journal is the only record of what to undo: losing a record would make
     * every later simulated power cut wrong, so stop loudly instead. */
    char msg[512];
    int n = snprintf(msg, sizeof msg, "agentwal crashsim: %s: %s; aborting\n", what, strerror(errno));
    if (n > 0) {
        LOAD(write);
        ssize_t ignored = real_write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)ignored;
    }
    abort();
}

/* ---- journal ------------------------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len;
    unsigned char *data;
} rec;

static rec_hdr *hdr(rec *r) { return (rec_hdr *)r->buf; }

static void rec_new(rec *r, uint32_t type, const char *p1, const char *p2, size_t datalen) {
    size_t l1 = p1 ? strlen(p1) : 0, l2 = p2 ? strlen(p2) : 0;
    r->len = sizeof(rec_hdr) + l1 + l2 + datalen + 4;
    r->buf = malloc(r->len);
    if (!r->buf) die("out of memory for a journal record");
    rec_hdr *h = hdr(r);
    memset(h, 0, sizeof *h);
    h->magic = REC_MAGIC;
    h->type = type;
    h->length = r->len;
    h->pid = (uint32_t)getpid();
    h->len1 = (uint32_t)l1;
    h->len2 = (uint32_t)l2;
    h->datalen = datalen;
    char *p = r->buf + sizeof(rec_hdr);
    if (l1) memcpy(p, p1, l1);
    if (l2) memcpy(p + l1, p2, l2);
    r->data = (unsigned char *)p + l1 + l2;
    uint32_t trailer = REC_TRAILER;
    memcpy(r->buf + r->len - 4, &trailer, 4);
}

/* Appends the record (caller holds g_mu) and returns its position. */
static int64_t rec_put(rec *r) {
    size_t done = 0;
    while (done < r->len) {
        ssize_t n = real_write(g_jfd, r->buf + done, r->len - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("writing the journal");
        }
        done += (size_t)n;
    }
    off_t end = lseek(g_jfd, 0, SEEK_CUR); /* O_APPEND: the end of what we just wrote */
    free(r->buf);
    r->buf = NULL;
    if (end < 0) die("locating the journal's end");
    return (int64_t)end - (int64_t)r->len;
}

/* Position up to which records are complete; caller holds g_mu. */
static uint64_t journal_end(void) {
    struct stat st;
    if (fstat(g_jfd, &st) != 0) die("fstat of the journal");
    return (uint64_t)st.st_size;
}

static void cancel(int64_t pos) {
    if (pos < 0) return;
    rec r;
    rec_new(&r, REC_CANCEL, NULL, NULL, 0);
    hdr(&r)->a = (uint64_t)pos;
    rec_put(&r);
}

/* ---- paths ------------------------------------------------------------------------------------ */

static void proc_fd_link(int fd, char out[32]) {
    static const char prefix[] = "/proc/self/fd/";
    char digits[16];
    int n = 0;
    unsigned v = (unsigned)fd;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    memcpy(out, prefix, sizeof prefix - 1);
    int i = sizeof prefix - 1;
    while (n) out[i++] = digits[--n];
    out[i] = 0;
}

/* Absolute path of what fd refers to; " (deleted)" stripped. Async-signal-safe. */
static int fd_path(int fd, char *out, size_t cap) {
    char link[32];
    proc_fd_link(fd, link);
    ssize_t n = readlink(link, out, cap - 1);
    if (n < 0) return -1;
    out[n] = 0;
    static const char del[] = " (deleted)";
    size_t dl = sizeof del - 1;
    if ((size_t)n > dl && strcmp(out + n - dl, del) == 0) out[n - dl] = 0;
    return 0;
}

/* The root-relative part of an absolute canonical path, or NULL when outside the root. */
static const char *rel_of(const char *abs) {
    if (strncmp(abs, g_root, g_rootlen) != 0) return NULL;
    if (abs[g_rootlen] == 0) return abs + g_rootlen;
    if (abs[g_rootlen] == '/') return abs + g_rootlen + 1;
    return NULL;
}

/* Canonical absolute path of (dirfd, path) without following a final symlink:
 * realpath(parent) + "/" + last component. */
static int canon_at(int dirfd, const char *path, char *out) {
    char full[2 * PATH_MAX];
    if (!path || !*path) return -1;
    if (path[0] == '/') {
        if (strlen(path) >= sizeof full) return -1;
        strcpy(full, path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (!getcwd(base, sizeof base)) return -1;
        } else if (fd_path(dirfd, base, sizeof base) != 0) {
            return -1;
        }
        if (strlen(base) + 1 + strlen(path) >= sizeof full) return -1;
        strcpy(full, base);
        strcat(full, "/");
        strcat(full, path);
    }
    size_t n = strlen(full);
    while (n > 1 && full[n - 1] == '/') full[--n] = 0;
    char *slash = strrchr(full, '/');
    const char *name = slash + 1;
    if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) return realpath(full, out) ? 0 : -1;
    char parent[PATH_MAX];
    if (slash == full) {
        strcpy(parent, "/");
    } else {
        *slash = 0;
        if (!realpath(full, parent)) return -1;
    }
    size_t pl = strlen(parent);
    if (pl + 1 + strlen(name) >= PATH_MAX) return -1;
    memcpy(out, parent, pl);
    if (pl > 1) out[pl++] = '/';
    strcpy(out + pl, name);
    return 0;
}

/* dev/ino of the directory holding abs. */
static void parent_id(const char *abs, uint64_t *dev, uint64_t *ino) {
    char parent[PATH_MAX];
    strcpy(parent, abs);
    char *slash = strrchr(parent, '/');
    if (slash == parent) slash[1] = 0;
    else if (slash) *slash = 0;
    struct stat st;
    if (stat(parent, &st) == 0) {
        *dev = (uint64_t)st.st_dev;
        *ino = (uint64_t)st.st_ino;
    } else {
        *dev = *ino = 0;
    }
}

/* ---- reading old bytes ------------------------------------------------------------------------------ */

static ssize_t pread_full(int fd, unsigned char *buf, size_t len, uint64_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, buf + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

/* Old bytes of [off, off+len) of the file behind fd; a write-only fd is reopened
 * read-only through /proc. Returns 0, or 1 when they could not be read (zeros). */
static int read_old(int fd, unsigned char *buf, size_t len, uint64_t off) {
    ssize_t n = pread_full(fd, buf, len, off);
    if (n < 0 && errno == EBADF) {
        char link[32];
        proc_fd_link(fd, link);
        int rfd = real_open(link, O_RDONLY | O_CLOEXEC);
        if (rfd >= 0) {
            n = pread_full(rfd, buf, len, off);
            real_close(rfd);
        }
    }
    if (n < 0) {
        memset(buf, 0, len);
        return 1;
    }
    if ((size_t)n < len) memset(buf + n, 0, len - (size_t)n);
    return 0;
}

/* ---- data changes -------------------------------------------------------------------------------- */

typedef struct {
    struct stat st;
    char abs[PATH_MAX];
    const char *rel;
} target;

/* Is fd a tracked regular file (or, with allow_dir, directory)? No lock taken. */
static int resolve_fd(int fd, target *t, int allow_dir) {
    if (fd == g_jfd) return 0;
    if (fstat(fd, &t->st) != 0) return 0;
    int reg = S_ISREG(t->st.st_mode), dir = S_ISDIR(t->st.st_mode);
    if (!reg && !dir) {
        fd_untracked(fd);
        return 0;
    }
    if (dir && !allow_dir) return 0;
    if (fd_path(fd, t->abs, sizeof t->abs) != 0) return 0;
    t->rel = rel_of(t->abs);
    if (!t->rel) {
        fd_untracked(fd);
        return 0;
    }
    return 1;
}

static void journal_write(int fd, const target *t, uint64_t off, uint64_t len, uint32_t type_write) {
    uint64_t size = (uint64_t)t->st.st_size;
    size_t oldlen = 0;
    if (off < size) oldlen = (size_t)(len < size - off ? len : size - off);
    rec r;
    rec_new(&r, type_write, t->rel, NULL, oldlen);
    rec_hdr *h = hdr(&r);
    h->dev = (uint64_t)t->st.st_dev;
    h->ino = (uint64_t)t->st.st_ino;
    h->a = off;
    h->b = len;
    h->c = size;
    if (oldlen && read_old(fd, r.data, oldlen, off)) h->flags |= 1;
    rec_put(&r);
}

static void journal_trunc(int fd, const target *t, uint64_t newsize) {
    uint64_t size = (uint64_t)t->st.st_size;
    size_t cut = newsize < size ? (size_t)(size - newsize) : 0;
    rec r;
    rec_new(&r, REC_TRUNC, t->rel, NULL, cut);
    rec_hdr *h = hdr(&r);
    h->dev = (uint64_t)t->st.st_dev;
    h->ino = (uint64_t)t->st.st_ino;
    h->a = newsize;
    h->c = size;
    if (cut && read_old(fd, r.data, cut, newsize)) h->flags |= 1;
    rec_put(&r);
}

static void journal_sync(const target *t, uint32_t type, uint64_t upto, uint64_t kind) {
    rec r;
    rec_new(&r, type, t ? t->rel : NULL, NULL, 0);
    rec_hdr *h = hdr(&r);
    if (t) {
        h->dev = (uint64_t)t->st.st_dev;
        h->ino = (uint64_t)t->st.st_ino;
    }
    h->a = upto;
    h->b = kind;
    rec_put(&r);
}

/* Under g_mu: refresh size and flags, and work out where a write lands. */
static int64_t write_offset(int fd, target *t, int64_t off, int append_flag, int *flags) {
    *flags = real_fcntl(fd, F_GETFL);
    if (*flags < 0) *flags = 0;
    if (fstat(fd, &t->st) != 0) return -1;
    if ((*flags & O_APPEND) || append_flag) return (int64_t)t->st.st_size;
    if (off >= 0) return off;
    off_t cur = lseek(fd, 0, SEEK_CUR);
    return cur < 0 ? -1 : (int64_t)cur;
}

static uint64_t iov_total(const struct iovec *iov, int cnt) {
    uint64_t n = 0;
    for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    return n;
}

/* One body for every write flavour: journal old bytes, perform, mark O_DSYNC durability. */
#define WRITE_BODY(call, off_expr, len_expr, append_flag, dsync_flag)                          \
    target t;                                                                                  \
    if (!resolve_fd(fd, &t, 0) || (len_expr) == 0) return call;                                \
    lock();                                                                                    \
    int fl;                                                                                    \
    int64_t at = write_offset(fd, &t, (off_expr), (append_flag), &fl);                         \
    if (at >= 0) journal_write(fd, &t, (uint64_t)at, (len_expr), REC_WRITE);                   \
    ssize_t r = call;                                                                          \
    int e = errno;                                                                             \
    if (r >= 0 && at >= 0 && ((fl & O_DSYNC) || (dsync_flag)))                                 \
        journal_sync(&t, REC_FSYNC, journal_end(), (dsync_flag) ? 3 : 2);                      \
    unlock();                                                                                  \
    errno = e;                                                                                 \
    return r;

EXPORT ssize_t write(int fd, const void *buf, size_t n) {
    LOAD(write);
    if (fd_skip(fd)) return real_write(fd, buf, n);
    WRITE_BODY(real_write(fd, buf, n), -1, (uint64_t)n, 0, 0)
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    LOAD(writev);
    if (fd_skip(fd)) return real_writev(fd, iov, cnt);
    WRITE_BODY(real_writev(fd, iov, cnt), -1, iov_total(iov, cnt), 0, 0)
}

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    LOAD(pwrite);
    if (fd_skip(fd)) return real_pwrite(fd, buf, n, off);
    WRITE_BODY(real_pwrite(fd, buf, n, off), (int64_t)off, (uint64_t)n, 0, 0)
}

EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off) {
    LOAD(pwrite64);
    if (fd_skip(fd)) return real_pwrite64(fd, buf, n, off);
    WRITE_BODY(real_pwrite64(fd, buf, n, off), (int64_t)off, (uint64_t)n, 0, 0)
}

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    LOAD(pwritev);
    if (fd_skip(fd)) return real_pwritev(fd, iov, cnt, off);
    WRITE_BODY(real_pwritev(fd, iov, cnt, off), (int64_t)off, iov_total(iov, cnt), 0, 0)
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off) {
    LOAD(pwritev64);
    if (fd_skip(fd)) return real_pwritev64(fd, iov, cnt, off);
    WRITE_BODY(real_pwritev64(fd, iov, cnt, off), (int64_t)off, iov_total(iov, cnt), 0, 0)
}

#ifndef RWF_APPEND
#define RWF_APPEND 0x10
#endif
#ifndef RWF_DSYNC
#define RWF_DSYNC 0x02
#endif
#ifndef RWF_SYNC
#define RWF_SYNC 0x04
#endif

EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    NEED(pwritev2, -1);
    if (fd_skip(fd)) return real_pwritev2(fd, iov, cnt, off, flags);
    WRITE_BODY(real_pwritev2(fd, iov, cnt, off, flags), (int64_t)off, iov_total(iov, cnt),
               (flags & RWF_APPEND) != 0, (flags & (RWF_DSYNC | RWF_SYNC)) != 0)
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags) {
    NEED(pwritev64v2, -1);
    if (fd_skip(fd)) return real_pwritev64v2(fd, iov, cnt, off, flags);
    WRITE_BODY(real_pwritev64v2(fd, iov, cnt, off, flags), (int64_t)off, iov_total(iov, cnt),
               (flags & RWF_APPEND) != 0, (flags & (RWF_DSYNC | RWF_SYNC)) != 0)
}

#define TRUNC_BODY(call, newsize)                                                              \
    target t;                                                                                  \
    if (!resolve_fd(fd, &t, 0) || (int64_t)(newsize) < 0) return call;                         \
    lock();                                                                                    \
    if (fstat(fd, &t.st) == 0 && (uint64_t)(newsize) != (uint64_t)t.st.st_size)                \
        journal_trunc(fd, &t, (uint64_t)(newsize));                                            \
    int r = call;                                                                              \
    int e = errno;                                                                             \
    unlock();                                                                                  \
    errno = e;                                                                                 \
    return r;

EXPORT int ftruncate(int fd, off_t len) {
    LOAD(ftruncate);
    if (fd_skip(fd)) return real_ftruncate(fd, len);
    TRUNC_BODY(real_ftruncate(fd, len), len)
}

EXPORT int ftruncate64(int fd, off64_t len) {
    LOAD(ftruncate64);
    if (fd_skip(fd)) return real_ftruncate64(fd, len);
    TRUNC_BODY(real_ftruncate64(fd, len), len)
}

/* fallocate: mode 0 may extend the size (content unchanged); hole punching and
 * zeroing change bytes; collapse/insert shift the tail. All undo exactly as a
 * WRITE covering the affected bytes (or a TRUNC for a pure extension). */
static void journal_fallocate(int fd, target *t, int mode, uint64_t off, uint64_t len) {
    if (fstat(fd, &t->st) != 0) return;
    uint64_t size = (uint64_t)t->st.st_size;
    int keep = (mode & FALLOC_FL_KEEP_SIZE) != 0;
    int bytes = (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE | FALLOC_FL_COLLAPSE_RANGE |
                         FALLOC_FL_INSERT_RANGE)) != 0;
    if (!bytes) {
        if (!keep && off + len > size) journal_trunc(fd, t, off + len);
        return;
    }
    uint64_t span = len;
    if (mode & (FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE)) span = (size > off ? size - off : 0) + len;
    journal_write(fd, t, off, span, REC_WRITE);
}

EXPORT int fallocate(int fd, int mode, off_t off, off_t len) {
    LOAD(fallocate);
    target t;
    if (fd_skip(fd) || !resolve_fd(fd, &t, 0) || off < 0 || len <= 0) return real_fallocate(fd, mode, off, len);
    lock();
    journal_fallocate(fd, &t, mode, (uint64_t)off, (uint64_t)len);
    int r = real_fallocate(fd, mode, off, len);
    int e = errno;
    unlock();
    errno = e;
    return r;
}

EXPORT int fallocate64(int fd, int mode, off64_t off, off64_t len) {
    LOAD(fallocate64);
    target t;
    if (fd_skip(fd) || !resolve_fd(fd, &t, 0) || off < 0 || len <= 0) return real_fallocate64(fd, mode, off, len);
    lock();
    journal_fallocate(fd, &t, mode, (uint64_t)off, (uint64_t)len);
    int r = real_fallocate64(fd, mode, off, len);
    int e = errno;
    unlock();
    errno = e;
    return r;
}

EXPORT int posix_fallocate(int fd, off_t off, off_t len) {
    LOAD(posix_fallocate);
    target t;
    if (fd_skip(fd) || !resolve_fd(fd, &t, 0) || off < 0 || len <= 0) return real_posix_fallocate(fd, off, len);
    lock();
    journal_fallocate(fd, &t, 0, (uint64_t)off, (uint64_t)len);
    int r = real_posix_fallocate(fd, off, len);
    unlock();
    return r; /* returns the error number; errno untouched */
}

EXPORT int posix_fallocate64(int fd, off64_t off, off64_t len) {
    LOAD(posix_fallocate64);
    target t;
    if (fd_skip(fd) || !resolve_fd(fd, &t, 0) || off < 0 || len <= 0) return real_posix_fallocate64(fd, off, len);
    lock();
    journal_fallocate(fd, &t, 0, (uint64_t)off, (uint64_t)len);
    int r = real_posix_fallocate64(fd, off, len);
    unlock();
    return r;
}

/* truncate(path): journal through a read-only fd on the same file. */
static void journal_truncate_path(const char *path, uint64_t newsize) {
    char abs[PATH_MAX];
    if (canon_at(AT_FDCWD, path, abs) != 0 || !rel_of(abs)) return;
    int fd = real_open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    target t;
    if (resolve_fd(fd, &t, 0) && (uint64_t)t.st.st_size != newsize) journal_trunc(fd, &t, newsize);
    real_close(fd);
    fd_forget(fd);
}

EXPORT int truncate(const char *path, off_t len) {
    LOAD(truncate);
    if (!g_active || t_busy || len < 0) return real_truncate(path, len);
    lock();
    journal_truncate_path(path, (uint64_t)len);
    int r = real_truncate(path, len);
    int e = errno;
    unlock();
    errno = e;
    return r;
}

EXPORT int truncate64(const char *path, off64_t len) {
    LOAD(truncate64);
    if (!g_active || t_busy || len < 0) return real_truncate64(path, len);
    lock();
    journal_truncate_path(path, (uint64_t)len);
    int r = real_truncate64(path, len);
    int e = errno;
    unlock();
    errno = e;
    return r;
}

/* ---- durability ------------------------------------------------------------------------------- */

static int do_sync(int fd, int (*fn)(int), uint64_t kind) {
    target t;
    if (fd_skip(fd) || !resolve_fd(fd, &t, 1)) return fn(fd);
    lock();
    uint64_t upto = journal_end();
    unlock();
    int r = fn(fd); /* not under the mutex: other threads keep writing meanwhile */
    int e = errno;
    if (r == 0) {
        lock();
        journal_sync(&t, S_ISDIR(t.st.st_mode) ? REC_DIRSYNC : REC_FSYNC, upto, kind);
        unlock();
    }
    errno = e;
    return r;
}

EXPORT int fsync(int fd) {
    LOAD(fsync);
    return do_sync(fd, real_fsync, 0);
}

EXPORT int fdatasync(int fd) {
    LOAD(fdatasync);
    return do_sync(fd, real_fdatasync, 1);
}

/* sync_file_range starts or waits for writeback of a range but never flushes the
 * device cache nor the metadata: it is no durability at all, and journals nothing. */
EXPORT int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags) {
    NEED(sync_file_range, -1);
    return real_sync_file_range(fd, off, n, flags);
}

static uint64_t syncall_begin(void) {
    lock();
    uint64_t upto = journal_end();
    unlock();
    return upto;
}

static void syncall_end(uint64_t upto) {
    lock();
    journal_sync(NULL, REC_SYNCALL, upto, 0);
    unlock();
}

EXPORT void sync(void) {
    LOAD(sync);
    if (!g_active || t_busy) {
        real_sync();
        return;
    }
    uint64_t upto = syncall_begin();
    real_sync();
    syncall_end(upto);
}

EXPORT int syncfs(int fd) {
    LOAD(syncfs);
    if (!g_active || t_busy) return real_syncfs(fd);
    uint64_t upto = syncall_begin();
    int r = real_syncfs(fd);
    int e = errno;
    if (r == 0) syncall_end(upto); /* any filesystem: the root is assumed to be on it */
    errno = e;
    return r;
}

/* ---- directory entries ------------------------------------------------------------------------ */

/* Journal a directory-entry record for abs (root-relative rel); returns its position. */
static int64_t journal_entry(uint32_t type, const char *abs, const char *rel, const char *rel2,
                             const char *data, uint32_t flags) {
    rec r;
    size_t dl = data ? strlen(data) : 0;
    rec_new(&r, type, rel, rel2, dl);
    if (dl) memcpy(r.data, data, dl);
    rec_hdr *h = hdr(&r);
    h->flags = flags;
    parent_id(abs, &h->dev, &h->ino);
    return rec_put(&r);
}

static int copy_file(const char *from, const char *to) {
    int in = real_open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0) return -1;
    int out = real_open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0) {
        real_close(in);
        return -1;
    }
    char buf[65536];
    int rc = 0;
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            rc = n < 0 ? -1 : 0;
            break;
        }
        for (ssize_t done = 0; done < n;) {
            ssize_t w = real_write(out, buf + done, (size_t)(n - done));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) {
                rc = -1;
                break;
            }
            done += w;
        }
        if (rc) break;
    }
    real_close(in);
    real_close(out);
    return rc;
}

/* Keep the inode at abs alive under JOURNAL.side/ before its name goes away.
 * Returns 0 (hard link), 1 (copy: a different inode) or 2 (nothing saved). */
static int save_aside(const char *abs, const struct stat *st, char name[64]) {
    snprintf(name, 64, "%d-%llu", (int)getpid(), (unsigned long long)++g_sidectr);
    char dst[PATH_MAX + 64];
    snprintf(dst, sizeof dst, "%s/%s", g_side, name);
    if (real_linkat(AT_FDCWD, abs, AT_FDCWD, dst, 0) == 0) return 0;
    if (S_ISLNK(st->st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlink(abs, target, sizeof target - 1);
        if (n >= 0) {
            target[n] = 0;
            if (real_symlink(target, dst) == 0) return 1;
        }
    } else if (S_ISREG(st->st_mode) && copy_file(abs, dst) == 0) {
        return 1;
    }
    name[0] = 0;
    return 2;
}

static void drop_aside(const char *name) {
    if (!name[0]) return;
    char dst[PATH_MAX + 64];
    snprintf(dst, sizeof dst, "%s/%s", g_side, name);
    real_unlink(dst);
}

enum { K_OPEN, K_OPEN64, K_OPENAT, K_OPENAT64 };

static int call_open(int kind, int dirfd, const char *path, int flags, mode_t mode) {
    switch (kind) {
    case K_OPEN: return real_open(path, flags, mode);
    case K_OPEN64: return real_open64(path, flags, mode);
    case K_OPENAT: return real_openat(dirfd, path, flags, mode);
    default: return real_openat64(dirfd, path, flags, mode);
    }
}

/* O_TRUNC of an existing file: journal its whole content as cut bytes. */
static void journal_otrunc(const char *abs) {
    int fd = real_open(abs, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;
    target t;
    if (resolve_fd(fd, &t, 0) && t.st.st_size > 0) journal_trunc(fd, &t, 0);
    real_close(fd);
    fd_forget(fd);
}

static int do_open(int kind, int dirfd, const char *path, int flags, mode_t mode) {
    if (!g_active || t_busy || !(flags & (O_CREAT | O_TRUNC))) {
        int fd = call_open(kind, dirfd, path, flags, mode);
        fd_forget(fd);
        return fd;
    }
    char abs[PATH_MAX];
    const char *rel;
    if (canon_at(dirfd, path, abs) != 0 || !(rel = rel_of(abs)) || !*rel) {
        int fd = call_open(kind, dirfd, path, flags, mode);
        fd_forget(fd);
        return fd;
    }
    lock();
    struct stat st;
    int64_t pos = -1;
    int exists = lstat(abs, &st) == 0;
    if (!exists && (flags & O_CREAT)) {
        pos = journal_entry(REC_CREATE, abs, rel, NULL, NULL, 0);
    } else if (exists && (flags & O_TRUNC) && !((flags & O_CREAT) && (flags & O_EXCL))) {
        journal_otrunc(abs);
    }
    int fd = call_open(kind, dirfd, path, flags, mode);
    int e = errno;
    if (fd < 0) cancel(pos);
    unlock();
    fd_forget(fd);
    errno = e;
    return fd;
}

#ifdef __O_TMPFILE
#define NEEDS_MODE(flags) (((flags) & O_CREAT) || ((flags) & __O_TMPFILE) == __O_TMPFILE)
#else
#define NEEDS_MODE(flags) ((flags) & O_CREAT)
#endif

#define OPEN_MODE(flags)                                                                       \
    mode_t mode = 0;                                                                           \
    if (NEEDS_MODE(flags)) {                                                                   \
        va_list ap;                                                                            \
        va_start(ap, flags);                                                                   \
        mode = (mode_t)va_arg(ap, int);                                                        \
        va_end(ap);                                                                            \
    }

EXPORT int open(const char *path, int flags, ...) {
    LOAD(open);
    OPEN_MODE(flags)
    return do_open(K_OPEN, AT_FDCWD, path, flags, mode);
}

EXPORT int open64(const char *path, int flags, ...) {
    LOAD(open64);
    OPEN_MODE(flags)
    return do_open(K_OPEN64, AT_FDCWD, path, flags, mode);
}

EXPORT int openat(int dirfd, const char *path, int flags, ...) {
    LOAD(openat);
    OPEN_MODE(flags)
    return do_open(K_OPENAT, dirfd, path, flags, mode);
}

EXPORT int openat64(int dirfd, const char *path, int flags, ...) {
    LOAD(openat64);
    OPEN_MODE(flags)
    return do_open(K_OPENAT64, dirfd, path, flags, mode);
}

/* The _FORTIFY_SOURCE entry points (flags known not to need a mode). */
EXPORT int __open_2(const char *path, int flags) {
    LOAD(open);
    return do_open(K_OPEN, AT_FDCWD, path, flags, 0);
}

EXPORT int __open64_2(const char *path, int flags) {
    LOAD(open64);
    return do_open(K_OPEN64, AT_FDCWD, path, flags, 0);
}

EXPORT int __openat_2(int dirfd, const char *path, int flags) {
    LOAD(openat);
    return do_open(K_OPENAT, dirfd, path, flags, 0);
}

EXPORT int __openat64_2(int dirfd, const char *path, int flags) {
    LOAD(openat64);
    return do_open(K_OPENAT64, dirfd, path, flags, 0);
}

EXPORT int creat(const char *path, mode_t mode) {
    LOAD(open);
    return do_open(K_OPEN, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

EXPORT int creat64(const char *path, mode_t mode) {
    LOAD(open64);
    return do_open(K_OPEN64, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

static int do_mkdir(int dirfd, const char *path, mode_t mode, int at) {
    char abs[PATH_MAX];
    const char *rel;
    if (!g_active || t_busy || canon_at(dirfd, path, abs) != 0 || !(rel = rel_of(abs)) || !*rel)
        return at ? real_mkdirat(dirfd, path, mode) : real_mkdir(path, mode);
    lock();
    struct stat st;
    int64_t pos = lstat(abs, &st) == 0 ? -1 : journal_entry(REC_MKDIR, abs, rel, NULL, NULL, 0);
    int r = at ? real_mkdirat(dirfd, path, mode) : real_mkdir(path, mode);
    int e = errno;
    if (r != 0) cancel(pos);
    unlock();
    errno = e;
    return r;
}

EXPORT int mkdir(const char *path, mode_t mode) {
    LOAD(mkdir);
    LOAD(mkdirat);
    return do_mkdir(AT_FDCWD, path, mode, 0);
}

EXPORT int mkdirat(int dirfd, const char *path, mode_t mode) {
    LOAD(mkdir);
    LOAD(mkdirat);
    return do_mkdir(dirfd, path, mode, 1);
}

enum { U_UNLINK, U_UNLINKAT, U_RMDIR };

static int call_unlink(int kind, int dirfd, const char *path, int flags) {
    switch (kind) {
    case U_UNLINK: return real_unlink(path);
    case U_UNLINKAT: return real_unlinkat(dirfd, path, flags);
    default: return real_rmdir(path);
    }
}

static int do_unlink(int kind, int dirfd, const char *path, int flags) {
    char abs[PATH_MAX];
    const char *rel;
    if (!g_active || t_busy || canon_at(dirfd, path, abs) != 0 || !(rel = rel_of(abs)) || !*rel)
        return call_unlink(kind, dirfd, path, flags);
    lock();
    struct stat st;
    int64_t pos = -1;
    char side[64] = "";
    int removedir = kind == U_RMDIR || (flags & AT_REMOVEDIR);
    if (lstat(abs, &st) == 0) {
        if (S_ISDIR(st.st_mode) && removedir) {
            pos = journal_entry(REC_RMDIR, abs, rel, NULL, NULL, 0);
        } else if (!S_ISDIR(st.st_mode) && !removedir) {
            int how = save_aside(abs, &st, side);
            pos = journal_entry(REC_UNLINK, abs, rel, side, NULL, how == 0 ? 0u : how == 1 ? 1u : 2u);
        }
    }
    int r = call_unlink(kind, dirfd, path, flags);
    int e = errno;
    if (r != 0) {
        cancel(pos);
        drop_aside(side);
    }
    unlock();
    errno = e;
    return r;
}

EXPORT int unlink(const char *path) {
    LOAD(unlink);
    LOAD(linkat);
    LOAD(symlink);
    return do_unlink(U_UNLINK, AT_FDCWD, path, 0);
}

EXPORT int unlinkat(int dirfd, const char *path, int flags) {
    LOAD(unlinkat);
    LOAD(unlink);
    LOAD(linkat);
    LOAD(symlink);
    return do_unlink(U_UNLINKAT, dirfd, path, flags);
}

EXPORT int rmdir(const char *path) {
    LOAD(rmdir);
    LOAD(unlink);
    return do_unlink(U_RMDIR, AT_FDCWD, path, 0);
}

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

enum { R_RENAME, R_RENAMEAT, R_RENAMEAT2 };

static int call_rename(int kind, int ofd, const char *from, int nfd, const char *to, unsigned flags) {
    switch (kind) {
    case R_RENAME: return real_rename(from, to);
    case R_RENAMEAT: return real_renameat(ofd, from, nfd, to);
    default: return real_renameat2(ofd, from, nfd, to, flags);
    }
}

static int do_rename(int kind, int ofd, const char *from, int nfd, const char *to, unsigned flags) {
    char oabs[PATH_MAX], nabs[PATH_MAX];
    const char *orel = NULL, *nrel = NULL;
    if (!g_active || t_busy) return call_rename(kind, ofd, from, nfd, to, flags);
    if (canon_at(ofd, from, oabs) == 0) orel = rel_of(oabs);
    if (canon_at(nfd, to, nabs) == 0) nrel = rel_of(nabs);
    if (orel && !*orel) orel = NULL;
    if (nrel && !*nrel) nrel = NULL;
    if (!orel && !nrel) return call_rename(kind, ofd, from, nfd, to, flags);
    lock();
    struct stat ost, nst;
    int oexists = lstat(oabs, &ost) == 0, nexists = lstat(nabs, &nst) == 0;
    int64_t pos = -1, pos2 = -1;
    char side[64] = "", side2[64] = "";
    if (!oexists || (nexists && ost.st_dev == nst.st_dev && ost.st_ino == nst.st_ino)) {
        /* fails, or a no-op (same file): nothing changes */
    } else if (orel && nrel) {
        uint32_t fl = 0;
        if (nexists && !(flags & (RENAME_EXCHANGE | RENAME_NOREPLACE))) {
            if (S_ISDIR(nst.st_mode)) {
                fl |= 2;
            } else {
                int how = save_aside(nabs, &nst, side);
                if (how < 2) fl |= 1;
                if (how == 1) fl |= 4;
            }
        }
        rec r;
        rec_new(&r, REC_RENAME, orel, nrel, strlen(side));
        memcpy(r.data, side, strlen(side));
        rec_hdr *h = hdr(&r);
        h->flags = fl;
        h->b = flags;
        parent_id(nabs, &h->dev, &h->ino);
        parent_id(oabs, &h->c, &h->a);
        pos = rec_put(&r);
    } else if (orel) { /* moving out of the root: like an unlink */
        int how = save_aside(oabs, &ost, side);
        pos = journal_entry(REC_UNLINK, oabs, orel, side, NULL, how == 0 ? 0u : how == 1 ? 1u : 2u);
    } else { /* moving in: like a create, after an unlink of what it replaces */
        if (nexists && !S_ISDIR(nst.st_mode) && !(flags & (RENAME_EXCHANGE | RENAME_NOREPLACE))) {
            int how = save_aside(nabs, &nst, side2);
            pos2 = journal_entry(REC_UNLINK, nabs, nrel, side2, NULL, how == 0 ? 0u : how == 1 ? 1u : 2u);
        }
        pos = journal_entry(S_ISDIR(ost.st_mode) ? REC_MKDIR : REC_CREATE, nabs, nrel, NULL, NULL, 0);
    }
    int r = call_rename(kind, ofd, from, nfd, to, flags);
    int e = errno;
    if (r != 0) {
        cancel(pos);
        cancel(pos2);
        drop_aside(side);
        drop_aside(side2);
    }
    unlock();
    errno = e;
    return r;
}

#define RENAME_LOADS()                                                                         \
    LOAD(rename);                                                                              \
    LOAD(renameat);                                                                            \
    LOAD(renameat2);                                                                           \
    LOAD(linkat);                                                                              \
    LOAD(symlink);                                                                             \
    LOAD(unlink)

EXPORT int rename(const char *from, const char *to) {
    RENAME_LOADS();
    return do_rename(R_RENAME, AT_FDCWD, from, AT_FDCWD, to, 0);
}

EXPORT int renameat(int ofd, const char *from, int nfd, const char *to) {
    RENAME_LOADS();
    return do_rename(R_RENAMEAT, ofd, from, nfd, to, 0);
}

EXPORT int renameat2(int ofd, const char *from, int nfd, const char *to, unsigned int flags) {
    RENAME_LOADS();
    if (!real_renameat2) {
        errno = ENOSYS;
        return -1;
    }
    return do_rename(R_RENAMEAT2, ofd, from, nfd, to, flags);
}

/* link/symlink: a new entry, undone by unlinking it. */
static int do_newentry(int nfd, const char *to, int (*perform)(const void *), const void *args) {
    char abs[PATH_MAX];
    const char *rel;
    if (!g_active || t_busy || canon_at(nfd, to, abs) != 0 || !(rel = rel_of(abs)) || !*rel) return perform(args);
    lock();
    struct stat st;
    int64_t pos = lstat(abs, &st) == 0 ? -1 : journal_entry(REC_CREATE, abs, rel, NULL, NULL, 1);
    int r = perform(args);
    int e = errno;
    if (r != 0) cancel(pos);
    unlock();
    errno = e;
    return r;
}

typedef struct {
    int ofd;
    const char *from;
    int nfd;
    const char *to;
    int flags;
} link_args;

static int perform_linkat(const void *p) {
    const link_args *a = p;
    return real_linkat(a->ofd, a->from, a->nfd, a->to, a->flags);
}

static int perform_symlinkat(const void *p) {
    const link_args *a = p;
    return real_symlinkat(a->from, a->nfd, a->to);
}

EXPORT int link(const char *from, const char *to) {
    LOAD(linkat);
    link_args a = {AT_FDCWD, from, AT_FDCWD, to, 0};
    return do_newentry(AT_FDCWD, to, perform_linkat, &a);
}

EXPORT int linkat(int ofd, const char *from, int nfd, const char *to, int flags) {
    LOAD(linkat);
    link_args a = {ofd, from, nfd, to, flags};
    return do_newentry(nfd, to, perform_linkat, &a);
}

EXPORT int symlink(const char *target, const char *to) {
    LOAD(symlinkat);
    link_args a = {0, target, AT_FDCWD, to, 0};
    return do_newentry(AT_FDCWD, to, perform_symlinkat, &a);
}

EXPORT int symlinkat(const char *target, int nfd, const char *to) {
    LOAD(symlinkat);
    link_args a = {0, target, nfd, to, 0};
    return do_newentry(nfd, to, perform_symlinkat, &a);
}

/* ---- fd table maintenance ---------------------------------------------------------------- */

/* The journal fd must survive whatever the program does with its descriptors. */
static void move_journal_fd(void) {
    int nfd = real_fcntl(g_jfd, F_DUPFD_CLOEXEC, 100);
    if (nfd < 0) die("moving the journal fd out of the way");
    g_jfd = nfd; /* the old number is about to be replaced by the caller's dup2 */
}

EXPORT int close(int fd) {
    LOAD(close);
    if (g_active && fd == g_jfd && fd >= 0) return 0; /* keep journaling; pretend it closed */
    int r = real_close(fd);
    fd_forget(fd);
    return r;
}

EXPORT int close_range(unsigned int first, unsigned int last, int flags) {
    NEED(close_range, -1);
    int r;
    unsigned j = (unsigned)g_jfd;
    if (g_active && g_jfd >= 0 && j >= first && j <= last && !(flags & 4 /* CLOSE_RANGE_CLOEXEC */)) {
        r = j > first ? real_close_range(first, j - 1, flags) : 0;
        if (r == 0 && j < last) r = real_close_range(j + 1, last, flags);
    } else {
        r = real_close_range(first, last, flags);
    }
    for (unsigned fd = first; fd <= last && fd < FD_MAX; fd++) fd_forget((int)fd);
    return r;
}

EXPORT int dup(int fd) {
    LOAD(dup);
    int r = real_dup(fd);
    fd_forget(r);
    return r;
}

EXPORT int dup2(int fd, int nfd) {
    LOAD(dup2);
    LOAD(fcntl);
    if (g_active && nfd == g_jfd && nfd >= 0 && fd != nfd) {
        lock();
        move_journal_fd();
        unlock();
    }
    int r = real_dup2(fd, nfd);
    fd_forget(r);
    return r;
}

EXPORT int dup3(int fd, int nfd, int flags) {
    LOAD(dup3);
    LOAD(fcntl);
    if (g_active && nfd == g_jfd && nfd >= 0 && fd != nfd) {
        lock();
        move_journal_fd();
        unlock();
    }
    int r = real_dup3(fd, nfd, flags);
    fd_forget(r);
    return r;
}

/* fcntl: only F_DUPFD/F_DUPFD_CLOEXEC matter (a new descriptor). The argument is
 * passed on as a pointer-sized value, as glibc's own fcntl does. */
EXPORT int fcntl(int fd, int cmd, ...) {
    LOAD(fcntl);
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    int r = real_fcntl(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) fd_forget(r);
    return r;
}

EXPORT int fcntl64(int fd, int cmd, ...) {
    LOAD(fcntl64);
    LOAD(fcntl);
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    int r = real_fcntl64 ? real_fcntl64(fd, cmd, arg) : real_fcntl(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) fd_forget(r);
    return r;
}

/* ---- notes and setup ------------------------------------------------------------------------ */

/* Lets a traced program mark a moment in the journal (e.g. "acknowledged LSN 17"),
 * so a test can cut the history there (apply_power_cut(at=...)). */
EXPORT void agentwal_crashsim_note(const char *text) {
    if (!g_active || !text) return;
    lock();
    rec r;
    rec_new(&r, REC_NOTE, text, NULL, 0);
    rec_put(&r);
    unlock();
}

EXPORT int agentwal_crashsim_active(void) { return g_active; }

static void atfork_prepare(void) {
    if (g_active) pthread_mutex_lock(&g_mu);
}
static void atfork_parent(void) {
    if (g_active) pthread_mutex_unlock(&g_mu);
}
static void atfork_child(void) {
    if (g_active) pthread_mutex_unlock(&g_mu);
}

static void load_all(void) {
    LOAD(open);
    LOAD(open64);
    LOAD(openat);
    LOAD(openat64);
    LOAD(close);
    LOAD(dup);
    LOAD(dup2);
    LOAD(dup3);
    LOAD(fcntl);
    LOAD(fcntl64);
    LOAD(write);
    LOAD(writev);
    LOAD(pwrite);
    LOAD(pwrite64);
    LOAD(pwritev);
    LOAD(pwritev64);
    LOAD(ftruncate);
    LOAD(ftruncate64);
    LOAD(truncate);
    LOAD(truncate64);
    LOAD(fallocate);
    LOAD(fallocate64);
    LOAD(posix_fallocate);
    LOAD(posix_fallocate64);
    LOAD(fsync);
    LOAD(fdatasync);
    LOAD(sync);
    LOAD(syncfs);
    LOAD(rename);
    LOAD(renameat);
    LOAD(renameat2);
    LOAD(unlink);
    LOAD(unlinkat);
    LOAD(rmdir);
    LOAD(mkdir);
    LOAD(mkdirat);
    LOAD(linkat);
    LOAD(symlink);
    LOAD(symlinkat);
}

__attribute__((constructor)) static void crashsim_init(void) {
    const char *root = getenv("AGENTWAL_CRASHSIM_ROOT");
    const char *journal = getenv("AGENTWAL_CRASHSIM_JOURNAL");
    load_all();
    if (!root || !journal || root[0] != '/' || journal[0] != '/') return;
    if (!realpath(root, g_root)) {
        if (strlen(root) >= sizeof g_root) return;
        strcpy(g_root, root);
    }
    g_rootlen = strlen(g_root);
    while (g_rootlen > 1 && g_root[g_rootlen - 1] == '/') g_root[--g_rootlen] = 0;
    if (g_rootlen <= 1) return; /* refusing to track the whole filesystem */
    if (strlen(journal) + sizeof ".side" > sizeof g_side) return;
    snprintf(g_side, sizeof g_side, "%s.side", journal);
    if (real_mkdir(g_side, 0755) != 0 && errno != EEXIST) die("creating the side directory");
    int fd = real_open(journal, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) die("opening the journal");
    /* Well above the descriptors programs dup2 onto (0-2, pass_fds), so the
     * program's own descriptor juggling never has to move it. */
    int high = real_fcntl(fd, F_DUPFD_CLOEXEC, 500);
    if (high >= 0) {
        real_close(fd);
        fd = high;
    }
    g_jfd = fd;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    rec r;
    rec_new(&r, REC_START, g_root, journal, 0);
    hdr(&r)->a = CRASHSIM_FORMAT;
    rec_put(&r);
    __atomic_store_n(&g_active, 1, __ATOMIC_RELEASE);
}
