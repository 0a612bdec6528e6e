/*
 * writer.h -- encode records into batches and write batches to segments.
 *
 * The writer never decides *when* to write or sync: that is the group-commit
 * layer (commit.c). It offers two steps, split so that the expensive one runs
 * without the commit lock:
 *   wal_writer_place  (under the commit lock) assigns a record its place --
 *                     segment and offset -- and encodes it into a batch; when
 *                     the record does not fit, it seals the segment and opens
 *                     the next one in the batch (a "roll").
 *   wal_writer_write  (outside the lock, by one thread at a time) writes a
 *                     batch: for a roll it first fdatasyncs the sealed
 *                     segment, then creates the next one (segment.c).
 * Placement is decided at encode time because the CRC covers the segment's
 * salt and the LSN.
 *
 * An interval log's bytes go out as stores into a shared mapping of a window
 * of the segment rather than pwrite calls where that is safe (mapstore.c, and
 * map_at in writer.c); the bytes on disk are the same either way.
 */
#ifndef WAL_WRITER_H
#define WAL_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "wal.h"

typedef struct {
    uint64_t segment_no, salt, first_lsn;
    int create;          /* the segment file must be made before writing this span */
    uint64_t file_size;  /* preallocated size to make it with */
    uint64_t offset;     /* file offset of the span's first byte */
    size_t start, len;   /* slice of the batch's bytes */
} wal_span;

typedef struct {
    uint8_t *bytes;
    size_t len, cap;
    wal_span *spans;
    size_t nspans, span_cap;
    uint64_t records;  /* DATA records in the batch */
    uint64_t last_lsn; /* LSN of its last DATA record, 0 if none */
    int rolls;         /* spans with create set */
    uint64_t unfilled; /* records placed open (wal_writer_place with open_at) not yet closed */
} wal_batch;

typedef struct {
    char *dir;
    uint64_t log_id;
    uint64_t segment_bytes;
    int zero_fill;
    int zero_ahead; /* a sparse segment of a sync log: zero-fill ahead of the tail (writer.c) */
    int map_writes; /* an interval log: bytes below fd_zeroed go through a shared mapping */
    uint64_t rng; /* salt source when seeded (tests); else getrandom */
    /* placement: only under the commit lock */
    uint64_t p_segno, p_salt, p_first_lsn, p_offset, p_size;
    /* the open segment: only by the thread holding the write slot */
    int fd;
    uint64_t fd_segno;
    int sync_failed; /* the last wal_writer_write failed in an fdatasync (never retried: I5) */
    uint64_t fd_size;   /* the open segment's file size */
    uint64_t fd_zeroed; /* bytes below this offset are data or written zeros, never a hole */
    int mappable;       /* the open segment may take stores through a mapping (writer.c) */
    uint8_t *map;       /* a window of it mapped MAP_SHARED at file offset map_off, or NULL */
    uint64_t map_off;
    uint64_t segments_created;
    uint64_t mapped_writes; /* spans stored through the mapping: written by the write slot, read by stats any time */
    uint64_t last_mark; /* LSN of the last MARK placed (under the commit lock) */
    /* Whole-page writes (a sync log; writer.c "Whole pages"): by the write slot only */
    int whole_pages;
    size_t page;          /* the page size: a power of two, at most WAL_ZERO_WRITE_BYTES */
    uint8_t *last_page;   /* the written bytes of the open segment's last page, from last_page_off */
    uint64_t last_page_off;
    size_t last_page_len;
    uint64_t fd_written;  /* end of the bytes written to the open segment */
    int tail_dropped;     /* atomic: set by a drop, taken by the next write (writer.c) */
} wal_writer;

int wal_writer_init(wal_writer *w, const char *dir, const wal_log_config *cfg);
void wal_writer_close(wal_writer *w);
/* With `open_at`, the record is left open: its CRC is not computed (and b->unfilled counts it),
 * so the caller may still change its payload's bytes in the batch; *open_at = the record's
 * offset in b->bytes. The batch must not be written before wal_record_close has closed it. */
int wal_writer_place(wal_writer *w, wal_batch *b, const uint8_t *payload, uint32_t len, uint64_t lsn,
                     size_t *open_at);
/* Close a record placed open, at `record` (its header): compute and store its CRC. */
void wal_record_close(uint8_t *record);
/* At the start of a batch: a MARK vouching that durable_lsn is durable, when it moved
 * since the last mark (FORMAT.md: what lets a reader tell corruption from a torn tail). */
int wal_writer_mark(wal_writer *w, wal_batch *b, uint64_t durable_lsn);
/* Write b. *synced_through is raised to the last LSN made durable by a roll's
 * fdatasync (0 if none). Returns 0 or -errno. */
int wal_writer_write(wal_writer *w, const wal_batch *b, uint64_t *synced_through);
/* Whole pages (writer.c): after a write, by the write slot, with no write running. *to is
 * the end of what is written to the open segment, zeros ahead included (up to 2 MiB past the
 * tail); *next_from the page the next write starts with, from which a later drop must begin
 * again. Both 0 when the writer does not write whole pages. */
void wal_writer_drop_range(const wal_writer *w, uint64_t *next_from, uint64_t *to);
/* After an fdatasync of the open segment fd that covered every write below `to`: let the page
 * cache drop [from, to), and have the next write rewrite its first page whole. Called by the
 * sync slot (a write may run meanwhile). Advisory: no error, and pages written since stay. */
void wal_writer_drop_synced(wal_writer *w, int fd, uint64_t from, uint64_t to);

void wal_batch_reset(wal_batch *b);
/* Append src's records (bytes and spans, placement unchanged) to dst. Returns 0 or -ENOMEM. */
int wal_batch_concat(wal_batch *dst, const wal_batch *src);
void wal_batch_free(wal_batch *b);

#endif
