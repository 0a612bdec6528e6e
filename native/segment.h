/* segment.h -- making segment files (FORMAT.md, "Creating a segment"). */
#ifndef WAL_SEGMENT_H
#define WAL_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "wal.h"

/* "<dir>/<16 hex digits>.wal" into buf (size >= strlen(dir) + 32). */
void wal_segment_path(char *buf, size_t cap, const char *dir, uint64_t segment_no, const char *suffix);

void wal_segment_header_encode(uint8_t out[64], const wal_segment_header *h);

/* Create segment h->segment_no in dir, crash-safely: write "<name>.tmp",
 * preallocate it to `size` (ftruncate, or zeros when zero_fill), write the
 * header, fsync, rename into place, fsync the directory. Never fallocate with
 * KEEP_SIZE: that lost data on ext4 (CrashMonkey). On success *fd_out is the
 * open (read-write) file; on failure returns -errno and leaves no final file. */
int wal_segment_create(const char *dir, const wal_segment_header *h, uint64_t size, int zero_fill,
                       int *fd_out);

#endif
