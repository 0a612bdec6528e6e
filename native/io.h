/*
 * io.h -- every system call the log makes on its files goes through here, so
 * that failpoints (test-only, see failpoint.c) can make any of them fail.
 * When no failpoint is armed the cost is one predictable branch.
 *
 * All functions return 0 (or a byte count) on success and -errno on failure.
 */
#ifndef WAL_IO_H
#define WAL_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Failpoint sites. */
enum {
    WAL_FP_WRITE = 0, /* pwrite of record bytes and headers */
    WAL_FP_FSYNC,     /* fdatasync/fsync of a segment file */
    WAL_FP_DIRSYNC,   /* fsync of the log directory */
    WAL_FP_OPEN,      /* open/create of a segment file */
    WAL_FP_RENAME,    /* rename of a new segment into place */
    WAL_FP_FTRUNCATE, /* ftruncate (preallocation, tail cut) */
    WAL_FP_COUNT
};

extern int wal_fp_active; /* nonzero while any failpoint is armed */
/* Returns 0 to proceed or -errno to fail this call; *partial set when a write
 * should go half through before failing. */
int wal_fp_check(int site, int *partial);

/* Zeros laid down ahead of records (writer.c's zero-ahead, segment.c's preallocate="zeros")
 * go out in writes of this size, not larger: the page cache keeps a file's pages in folios as
 * large as the write that created them (ext4, Linux 6.x), and every later small write into a
 * folio walks all of its blocks. Records written over zeros laid down in 8 MiB writes cost
 * ~6 us per 4 KiB pwrite instead of ~1.3 us (docs/performance.md, large folios); 64 KiB
 * costs no more than 4 KiB. */
#define WAL_ZERO_WRITE_BYTES (64u << 10)

int wal_io_open(const char *path, int flags, int mode);
ssize_t wal_io_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
/* The same for the bytes of iov[0..cnt) in order; the iovecs may be changed. A failpoint's
 * partial write puts iov[0] and the first half of the other bytes: iov[0] is what a caller
 * rewrites as it already is (writer.c, "Whole pages"), not new bytes. */
ssize_t wal_io_pwritev_all(int fd, struct iovec *iov, int cnt, uint64_t off);
int wal_io_fdatasync(int fd);
int wal_io_fsync(int fd);
int wal_io_fsync_dir(const char *dir);
int wal_io_rename(const char *from, const char *to);
int wal_io_ftruncate(int fd, uint64_t size);
int wal_io_close(int fd);

/* A segment written through a shared mapping (mapstore.c says when that is safe). */
int wal_io_map(int fd, uint64_t off, uint64_t len, uint8_t **out);
void wal_io_unmap(uint8_t *map, uint64_t len);
/* Copy len bytes to dst in a mapping: 0, or -EIO when a page could not be had (the kernel's
 * SIGBUS, caught). Failpoints do not see it: while one is armed, write with wal_io_pwrite_all. */
int wal_io_store(uint8_t *dst, const void *buf, size_t len);

#endif
