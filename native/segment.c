/* segment.c -- see segment.h. */
#include "segment.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "crc32c.h"
#include "format.h"
#include "io.h"

void wal_segment_path(char *buf, size_t cap, const char *dir, uint64_t segment_no, const char *suffix) {
    snprintf(buf, cap, "%s/%016llx%s%s", dir, (unsigned long long)segment_no, WAL_SEGMENT_SUFFIX, suffix);
}

void wal_segment_header_encode(uint8_t out[64], const wal_segment_header *h) {
    memset(out, 0, WAL_SEGMENT_HEADER_SIZE);
    memcpy(out + WAL_SH_MAGIC, WAL_MAGIC, WAL_MAGIC_LEN);
    wal_put_u16(out + WAL_SH_VERSION, WAL_FORMAT_VERSION);
    wal_put_u16(out + WAL_SH_HEADER_SIZE, WAL_SEGMENT_HEADER_SIZE);
    wal_put_u64(out + WAL_SH_LOG_ID, h->log_id);
    wal_put_u64(out + WAL_SH_SEGMENT_NO, h->segment_no);
    wal_put_u64(out + WAL_SH_FIRST_LSN, h->first_lsn);
    wal_put_u64(out + WAL_SH_SALT, h->salt);
    wal_put_u64(out + WAL_SH_PREALLOC, h->prealloc_bytes);
    wal_put_u32(out + WAL_SH_CRC, wal_crc32c(0, out, WAL_SH_CRC));
}

static int zero_fill_file(int fd, uint64_t size) {
    enum { CHUNK = WAL_ZERO_WRITE_BYTES };
    uint8_t *zeros = calloc(1, CHUNK);
    if (!zeros) return -12; /* ENOMEM */
    int rc = 0;
    for (uint64_t off = 0; off < size && rc >= 0; off += CHUNK) {
        size_t n = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
        ssize_t w = wal_io_pwrite_all(fd, zeros, n, off);
        if (w < 0) rc = (int)w;
    }
    free(zeros);
    return rc < 0 ? rc : 0;
}

int wal_segment_create(const char *dir, const wal_segment_header *h, uint64_t size, int zero_fill,
                       int *fd_out) {
    size_t cap = strlen(dir) + 64;
    char *tmp = malloc(cap), *final = malloc(cap);
    if (!tmp || !final) {
        free(tmp);
        free(final);
        return -12;
    }
    wal_segment_path(tmp, cap, dir, h->segment_no, ".tmp");
    wal_segment_path(final, cap, dir, h->segment_no, "");
    uint8_t hdr[WAL_SEGMENT_HEADER_SIZE];
    wal_segment_header_encode(hdr, h);

    int fd = wal_io_open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
    int rc = fd < 0 ? fd : 0;
    if (rc == 0) rc = zero_fill ? zero_fill_file(fd, size) : wal_io_ftruncate(fd, size);
    if (rc == 0) {
        ssize_t w = wal_io_pwrite_all(fd, hdr, sizeof hdr, 0);
        rc = w < 0 ? (int)w : 0;
    }
    if (rc == 0) rc = wal_io_fsync(fd); /* size and header durable before the name exists */
    if (rc == 0) rc = wal_io_rename(tmp, final);
    if (rc == 0) rc = wal_io_fsync_dir(dir); /* the name itself durable */
    if (rc != 0) {
        if (fd >= 0) wal_io_close(fd);
        unlink(tmp);
        /* A failed directory fsync leaves the final name maybe-durable; the
         * caller fail-stops, and recovery treats an empty segment as valid. */
    } else {
        *fd_out = fd;
    }
    free(tmp);
    free(final);
    return rc;
}
