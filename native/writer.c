/* writer.c -- see writer.h. */
#include "writer.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "crc32c.h"
#include "format.h"
#include "io.h"
#include "segment.h"

static uint64_t next_random(wal_writer *w) {
    uint64_t v = 0;
    if (w->rng) { /* splitmix64: reproducible salts for golden-file tests */
        uint64_t z = (w->rng += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        v = z ^ (z >> 31);
    } else {
        while (getrandom(&v, sizeof v, 0) != sizeof v) {
        }
    }
    return v ? v : 1; /* 0 is not a valid salt or log id */
}

static int batch_reserve(wal_batch *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + extra) cap *= 2;
    uint8_t *p = realloc(b->bytes, cap);
    if (!p) return -ENOMEM;
    b->bytes = p;
    b->cap = cap;
    return 0;
}

static wal_span *batch_new_span(wal_batch *b) {
    if (b->nspans == b->span_cap) {
        size_t cap = b->span_cap ? b->span_cap * 2 : 4;
        wal_span *s = realloc(b->spans, cap * sizeof *s);
        if (!s) return NULL;
        b->spans = s;
        b->span_cap = cap;
    }
    wal_span *s = &b->spans[b->nspans++];
    memset(s, 0, sizeof *s);
    s->start = b->len;
    return s;
}

void wal_batch_reset(wal_batch *b) {
    b->len = 0;
    b->nspans = 0;
    b->records = 0;
    b->last_lsn = 0;
    b->rolls = 0;
    b->unfilled = 0;
}

int wal_batch_concat(wal_batch *dst, const wal_batch *src) {
    if (batch_reserve(dst, src->len)) return -ENOMEM;
    size_t base = dst->len;
    if (src->len) memcpy(dst->bytes + base, src->bytes, src->len);
    dst->len += src->len;
    for (size_t i = 0; i < src->nspans; i++) {
        wal_span *s = batch_new_span(dst);
        if (!s) return -ENOMEM;
        *s = src->spans[i];
        s->start += base;
    }
    dst->records += src->records;
    if (src->last_lsn) dst->last_lsn = src->last_lsn;
    dst->rolls += src->rolls;
    dst->unfilled += src->unfilled;
    return 0;
}

void wal_batch_free(wal_batch *b) {
    free(b->bytes);
    free(b->spans);
    memset(b, 0, sizeof *b);
}

static void set_crc(uint8_t *r, uint32_t len) {
    /* The header from its length field on, then the payload: contiguous in the record. */
    wal_put_u32(r + WAL_RH_CRC, wal_crc32c(0, r + 4, WAL_RECORD_HEADER_SIZE - 4 + len));
}

void wal_record_close(uint8_t *record) { set_crc(record, wal_get_u32(record + WAL_RH_LENGTH)); }

/* Encode one record at the end of b (space already reserved); `open`: without its CRC. */
static void encode(wal_batch *b, uint8_t type, uint64_t lsn, uint64_t salt, const uint8_t *payload,
                   uint32_t len, int open) {
    uint8_t *r = b->bytes + b->len;
    uint64_t size = wal_record_size(len);
    wal_put_u32(r + WAL_RH_LENGTH, len);
    wal_put_u64(r + WAL_RH_LSN, lsn);
    r[WAL_RH_TYPE] = type;
    r[WAL_RH_FLAGS] = 0;
    wal_put_u16(r + WAL_RH_RESERVED, 0);
    wal_put_u32(r + WAL_RH_SALT_CHECK, (uint32_t)salt);
    if (len) memcpy(r + WAL_RECORD_HEADER_SIZE, payload, len);
    memset(r + WAL_RECORD_HEADER_SIZE + len, 0, size - WAL_RECORD_HEADER_SIZE - len);
    if (open) wal_put_u32(r + WAL_RH_CRC, 0);
    else set_crc(r, len);
    b->len += size;
}

/* The span the next record of b goes into: the last one, or a new one at the placement. */
static wal_span *current_span(wal_writer *w, wal_batch *b) {
    wal_span *cur = b->nspans ? &b->spans[b->nspans - 1] : NULL;
    if (!cur || cur->segment_no != w->p_segno) {
        if (!(cur = batch_new_span(b))) return NULL;
        cur->segment_no = w->p_segno;
        cur->salt = w->p_salt;
        cur->first_lsn = w->p_first_lsn;
        cur->offset = w->p_offset;
    }
    return cur;
}

int wal_writer_mark(wal_writer *w, wal_batch *b, uint64_t durable_lsn) {
    if (durable_lsn == 0 || durable_lsn == w->last_mark) return 0;
    if (w->p_offset + WAL_RECORD_HEADER_SIZE + WAL_SEAL_SIZE > w->p_size) return 0; /* a roll comes next */
    int rc = batch_reserve(b, WAL_RECORD_HEADER_SIZE);
    if (rc) return rc;
    wal_span *cur = current_span(w, b);
    if (!cur) return -ENOMEM;
    encode(b, WAL_REC_MARK, durable_lsn, w->p_salt, NULL, 0, 0);
    cur->len = b->len - cur->start;
    w->p_offset += WAL_RECORD_HEADER_SIZE;
    w->last_mark = durable_lsn;
    return 0;
}

int wal_writer_place(wal_writer *w, wal_batch *b, const uint8_t *payload, uint32_t len, uint64_t lsn,
                     size_t *open_at) {
    uint64_t size = wal_record_size(len);
    int rc = batch_reserve(b, size + WAL_SEAL_SIZE);
    if (rc) return rc;
    wal_span *cur = current_span(w, b);
    if (!cur) return -ENOMEM;
    /* Every segment keeps room for its seal. */
    uint64_t need = w->p_offset + size + WAL_SEAL_SIZE;
    if (need > w->p_size) {
        uint64_t new_size = w->segment_bytes;
        if (new_size < WAL_SEGMENT_HEADER_SIZE + size + WAL_SEAL_SIZE)
            new_size = WAL_SEGMENT_HEADER_SIZE + size + WAL_SEAL_SIZE; /* one oversized record */
        if (cur->create && w->p_offset == WAL_SEGMENT_HEADER_SIZE) {
            cur->file_size = w->p_size = new_size; /* not made yet: just make it bigger */
        } else {
            encode(b, WAL_REC_SEAL, lsn - 1, w->p_salt, NULL, 0, 0); /* seal: last DATA LSN */
            cur->len = b->len - cur->start;
            w->p_segno++;
            w->p_salt = next_random(w);
            w->p_first_lsn = lsn;
            w->p_offset = WAL_SEGMENT_HEADER_SIZE;
            w->p_size = new_size;
            if (!(cur = batch_new_span(b))) return -ENOMEM;
            cur->segment_no = w->p_segno;
            cur->salt = w->p_salt;
            cur->first_lsn = lsn;
            cur->offset = WAL_SEGMENT_HEADER_SIZE;
            cur->create = 1;
            cur->file_size = new_size;
            b->rolls++;
        }
    }
    if (open_at) {
        *open_at = b->len;
        b->unfilled++;
    }
    encode(b, WAL_REC_DATA, lsn, w->p_salt, payload, len, open_at != NULL);
    cur->len = b->len - cur->start;
    w->p_offset += size;
    b->records++;
    b->last_lsn = lsn;
    return 0;
}

/* Zeros for zero_ahead and for the padding of whole pages. */
static const uint8_t zeros[WAL_ZERO_WRITE_BYTES];

/* ---- Whole pages ----
 * A sync log writes whole pages, so that the page cache may drop what an fdatasync has made
 * durable. On the benchmark machine (Linux 6.18, ext4 on virtio) an fdatasync whose
 * pages the write created afresh takes 10-20% less time than one whose pages the cache
 * already held -- a page of zeros laid down ahead, or the page the last commit left half
 * full -- measured with a bare C loop either way (docs/performance.md, "Whole pages"). The
 * group commit decides when to drop (commit.c, do_sync: in a stream of lone commits only).
 * Every write ends with zeros up to the next page boundary (within the file), and a write
 * after a drop also starts at the page boundary below its first byte, with the bytes of that
 * page already written (kept in last_page): a write into part of a page that is not cached
 * would first read it from the disk. The bytes rewritten are those already there, and the
 * zeros are zero tail (FORMAT.md section 7.2), so nothing a reader sees changes: the device
 * took the whole page on every commit before too. A log is rarely read back while it is
 * written, which is also why PostgreSQL drops its WAL from the cache. */

static uint64_t page_floor(const wal_writer *w, uint64_t off) { return off & ~(uint64_t)(w->page - 1); }

/* Whole pages for a sync log only (an interval log stores through a mapping, a buffered one
 * fdatasyncs rarely), and not when the page size is above what the zeros array covers. */
static void whole_pages_init(wal_writer *w, const wal_log_config *cfg) {
    long page = sysconf(_SC_PAGESIZE);
    if (cfg->level != WAL_LEVEL_SYNC || page <= 0 || (page & (page - 1)) || (size_t)page > sizeof zeros) return;
    w->last_page = malloc((size_t)page);
    if (!w->last_page) return;
    w->page = (size_t)page;
    w->whole_pages = 1;
}

/* last_page after a new segment's header was written at offset 0. */
static void last_page_header(wal_writer *w, const wal_segment_header *h) {
    if (!w->whole_pages) return;
    wal_segment_header_encode(w->last_page, h);
    w->last_page_off = 0;
    w->last_page_len = WAL_SEGMENT_HEADER_SIZE;
}

/* last_page of a segment reopened with its tail at `tail`: read back, or whole pages off. */
static void last_page_read(wal_writer *w, uint64_t tail) {
    if (!w->whole_pages) return;
    w->last_page_off = page_floor(w, tail);
    w->last_page_len = (size_t)(tail - w->last_page_off);
    size_t got = 0;
    while (got < w->last_page_len) {
        ssize_t n = pread(w->fd, w->last_page + got, w->last_page_len - got, (off_t)(w->last_page_off + got));
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            w->whole_pages = 0; /* plain writes, then */
            return;
        }
        got += (size_t)n;
    }
}

/* Write [off, off + len) of the open segment as whole pages. off must be the tail. */
static int write_whole_pages(wal_writer *w, const uint8_t *bytes, size_t len, uint64_t off) {
    uint64_t start = page_floor(w, off), end = off + len;
    uint64_t padded = page_floor(w, end + w->page - 1);
    if (padded > w->fd_size) padded = w->fd_size > end ? w->fd_size : end; /* never grow the file */
    if (end <= w->fd_written) {
        /* Bytes written before, again: a batch that failed for lack of space comes back whole
         * (commit.c, do_write), its spans before the one that failed included. The same bytes
         * at the same place; the tail is past them and stays as it is. */
        ssize_t n = wal_io_pwrite_all(w->fd, bytes, len, off);
        return n < 0 ? (int)n : 0;
    }
    if (w->last_page_off != start || w->last_page_len != off - start) {
        /* not at the tail it knows (cannot happen): plain writes, and no drops, to the
         * segment's end, as a page the cache no longer holds must not be written in part */
        w->last_page_off = UINT64_MAX;
        ssize_t n = wal_io_pwrite_all(w->fd, bytes, len, off);
        return n < 0 ? (int)n : 0;
    }
    /* the page's earlier bytes only when it may have been dropped: else it is cached, and the
     * write need not cover it whole */
    int dropped = __atomic_exchange_n(&w->tail_dropped, 0, __ATOMIC_ACQ_REL);
    struct iovec iov[3] = {{w->last_page, dropped ? w->last_page_len : 0}, {(void *)bytes, len},
                           {(void *)zeros, padded - end}};
    ssize_t n = wal_io_pwritev_all(w->fd, iov, 3, dropped ? start : off);
    if (n < 0) {
        if (dropped) __atomic_store_n(&w->tail_dropped, 1, __ATOMIC_RELEASE); /* the retry needs it too */
        return (int)n;
    }
    if (padded > w->fd_zeroed) w->fd_zeroed = padded; /* the pad: zeros written */
    uint64_t new_start = page_floor(w, end);
    if (new_start == start) {
        memcpy(w->last_page + w->last_page_len, bytes, len);
    } else {
        memcpy(w->last_page, bytes + (new_start - off), (size_t)(end - new_start));
        w->last_page_off = new_start;
    }
    w->last_page_len = (size_t)(end - new_start);
    return 0;
}

void wal_writer_drop_synced(wal_writer *w, int fd, uint64_t from, uint64_t to) {
    if (to <= from) return;
    __atomic_store_n(&w->tail_dropped, 1, __ATOMIC_RELEASE); /* before: a write may start meanwhile */
    (void)posix_fadvise(fd, (off_t)from, (off_t)(to - from), POSIX_FADV_DONTNEED);
}

/* How far past the tail a drop reaches: the zeros ahead (at most 1.5 MiB past it), not the
 * rest of a segment preallocate="zeros" filled, which the tail reaches later. */
#define DROP_AHEAD_BYTES (2u << 20)

void wal_writer_drop_range(const wal_writer *w, uint64_t *next_from, uint64_t *to) {
    *next_from = *to = 0;
    if (!w->whole_pages || w->last_page_off == UINT64_MAX) return;
    uint64_t end = page_floor(w, w->fd_written + w->page - 1);
    uint64_t ahead = w->fd_zeroed < end + DROP_AHEAD_BYTES ? w->fd_zeroed : end + DROP_AHEAD_BYTES;
    *to = ahead > end ? ahead : end;
    *next_from = page_floor(w, w->fd_written);
}

/* Whether the open segment may take stores through a mapping (mapstore.c): when this log
 * writes that way and the filesystem overwrites a file's blocks in place -- ext4, XFS,
 * tmpfs: a store into blocks the zeros already allocated needs no new space there. On a
 * copy-on-write filesystem (btrfs, ZFS, ...) every overwrite allocates, and a full disk
 * would end the process (SIGBUS) rather than fail a write with ENOSPC, so those keep
 * pwrite. */
static int segment_mappable(const wal_writer *w) {
    struct statfs fs;
    if (!w->map_writes || fstatfs(w->fd, &fs) != 0) return 0;
    return fs.f_type == EXT4_SUPER_MAGIC || fs.f_type == XFS_SUPER_MAGIC || fs.f_type == TMPFS_MAGIC;
}

/* Only a window of the segment around the tail is mapped, moved along as the tail passes
 * its end. An fdatasync write-protects every dirty page still mapped writable, and each of
 * those costs an inter-processor TLB flush that interrupts the committing thread (perf: a
 * whole 64 MiB segment kept mapped made these ~10% of a 300,000-put burst and took all the
 * gain). Pages behind the window are unmapped, so their writeback touches no page table. */
#define MAP_WINDOW_BYTES (256u << 10)

/* Where to store [off, off + len) of the open segment, or NULL: write it with pwrite (as
 * always while a failpoint is armed, so fault injection sees every write). */
static uint8_t *map_at(wal_writer *w, uint64_t off, size_t len) {
    if (!w->mappable || off + len > w->fd_zeroed || __atomic_load_n(&wal_fp_active, __ATOMIC_ACQUIRE)) return NULL;
    if (w->map && off >= w->map_off && off + len <= w->map_off + MAP_WINDOW_BYTES) return w->map + (off - w->map_off);
    uint64_t start = off & ~(uint64_t)(MAP_WINDOW_BYTES - 1); /* a multiple of any page size up to it */
    if (off + len > start + MAP_WINDOW_BYTES) return NULL;     /* straddles a window boundary */
    wal_io_unmap(w->map, MAP_WINDOW_BYTES);
    w->map = NULL;
    if (wal_io_map(w->fd, start, MAP_WINDOW_BYTES, &w->map) != 0) {
        w->mappable = 0; /* not this segment, then */
        return NULL;
    }
    w->map_off = start;
    return w->map + (off - start);
}

static void close_segment(wal_writer *w) {
    wal_io_unmap(w->map, MAP_WINDOW_BYTES);
    w->map = NULL;
    w->mappable = 0;
    if (w->fd >= 0) wal_io_close(w->fd);
    w->fd = -1;
}

/* Create the segment of span s and make it the open one, closing the previous one only once
 * it exists (a failed creation leaves the writer as it was). */
static int open_segment(wal_writer *w, const wal_span *s) {
    wal_segment_header h = {WAL_FORMAT_VERSION, w->log_id, s->segment_no, s->first_lsn, s->salt, s->file_size};
    int fd;
    int rc = wal_segment_create(w->dir, &h, s->file_size, w->zero_fill, &fd);
    if (rc) return rc;
    close_segment(w);
    w->fd = fd;
    w->fd_segno = s->segment_no;
    w->fd_size = s->file_size;
    w->fd_zeroed = w->zero_fill ? s->file_size : WAL_SEGMENT_HEADER_SIZE;
    w->fd_written = WAL_SEGMENT_HEADER_SIZE;
    last_page_header(w, &h);
    w->segments_created++;
    w->mappable = segment_mappable(w);
    return 0;
}

/* Zero-fill ahead. A segment preallocated with ftruncate is sparse: each write into a hole
 * allocates blocks, so the fdatasync after it also journals the allocation -- for 4 KiB
 * commits that doubles the cost of every sync commit. Writing zeros ahead of the tail, a
 * chunk at a time, makes the next fdatasync carry the allocation of a whole chunk once;
 * the commits that then overwrite those zeros flush data only (what preallocate="zeros"
 * gets for the whole file, without writing 64 MiB when a segment is created).
 * Zeros beyond the last record are what a reader already takes for unwritten space
 * (FORMAT.md), so a crash at any point leaves a log recovery reads the same way.
 * A mapped log (interval) stores only below fd_zeroed, so for it the zeros are what makes
 * a store safe (mapstore.c), not an optimisation.
 * Best effort: a failure (ENOSPC) is ignored and retried at the next write, and until it
 * succeeds the records past fd_zeroed go out with pwrite, which reports the ENOSPC. It calls
 * pwrite directly so that failpoints count only the log's own writes. Called by the write
 * slot only. */
#define ZERO_AHEAD_BYTES (1u << 20)

static void zero_ahead(wal_writer *w, uint64_t end) {
    if (!w->zero_ahead || end + ZERO_AHEAD_BYTES / 2 <= w->fd_zeroed || w->fd_zeroed >= w->fd_size) return;
    uint64_t from = end > w->fd_zeroed ? end : w->fd_zeroed;
    /* to the first chunk boundary at least half a chunk past the tail: after this call
     * fd_zeroed >= end + ZERO_AHEAD_BYTES / 2 (or the file's end), so one call per chunk */
    uint64_t to = (end + ZERO_AHEAD_BYTES / 2 + ZERO_AHEAD_BYTES - 1) & ~(uint64_t)(ZERO_AHEAD_BYTES - 1);
    if (to > w->fd_size) to = w->fd_size;
    while (from < to) {
        size_t n = to - from < sizeof zeros ? (size_t)(to - from) : sizeof zeros;
        ssize_t got = pwrite(w->fd, zeros, n, (off_t)from);
        if (got <= 0) return; /* retried at the next write */
        from += (uint64_t)got;
        w->fd_zeroed = from;
    }
}

/* Written again whole after a failure for lack of space (commit.c do_write keeps the batch and
 * retries it once space returns), so every step is idempotent: spans are written at fixed
 * offsets; a span of a segment below the open one was written and fdatasynced before that
 * segment was created (skipped); a segment this batch already created is not created again;
 * and the sealed segment stays open until its successor exists, so a failed creation leaves
 * the writer where it was. A failed fdatasync sets sync_failed: that is never retried (I5). */
int wal_writer_write(wal_writer *w, const wal_batch *b, uint64_t *synced_through) {
    w->sync_failed = 0;
    for (size_t i = 0; i < b->nspans; i++) {
        const wal_span *s = &b->spans[i];
        if (w->fd >= 0 && s->segment_no < w->fd_segno) continue; /* an earlier attempt wrote and synced it */
        if (s->create && !(w->fd >= 0 && w->fd_segno == s->segment_no)) {
            /* I1 across segments: the sealed segment is durable before the next
             * one exists, so every segment but the last is sealed on disk. */
            if (w->fd >= 0) {
                int rc = wal_io_fdatasync(w->fd);
                if (rc) {
                    w->sync_failed = 1;
                    return rc;
                }
                *synced_through = s->first_lsn - 1;
            }
            int rc = open_segment(w, s);
            if (rc) return rc;
        }
        if (s->len) {
            const uint8_t *bytes = b->bytes + s->start;
            uint8_t *dst = map_at(w, s->offset, s->len);
            if (dst) {
                int rc = wal_io_store(dst, bytes, s->len);
                if (rc) return rc;
                /* one writer (the write slot): a plain increment, published for stats */
                __atomic_store_n(&w->mapped_writes, w->mapped_writes + 1, __ATOMIC_RELAXED);
            } else if (w->whole_pages) {
                int rc = write_whole_pages(w, bytes, s->len, s->offset);
                if (rc) return rc;
            } else {
                ssize_t n = wal_io_pwrite_all(w->fd, bytes, s->len, s->offset);
                if (n < 0) return (int)n;
            }
            if (s->offset + s->len > w->fd_written) w->fd_written = s->offset + s->len;
            if (s->offset + s->len > w->fd_zeroed) w->fd_zeroed = s->offset + s->len;
            zero_ahead(w, s->offset + s->len);
        }
    }
    return 0;
}

int wal_writer_init(wal_writer *w, const char *dir, const wal_log_config *cfg) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    w->dir = strdup(dir);
    if (!w->dir) return -ENOMEM;
    w->segment_bytes = cfg->segment_bytes;
    w->zero_fill = cfg->prealloc == WAL_PREALLOC_ZEROS;
    /* An interval commit is acknowledged once its bytes are in the OS, and a store into a
     * shared mapping gets them there without a system call (mapstore.c). Not under the crash
     * simulator (native/crashsim.c), which journals system calls: a store would be invisible
     * to it. */
    w->map_writes = cfg->level == WAL_LEVEL_INTERVAL && !getenv("AGENTWAL_CRASHSIM_JOURNAL");
    /* Zeros ahead of the tail: for a sync log, so a commit's fdatasync does not also journal
     * a block allocation; for a mapped log, because a store must land on allocated blocks.
     * Buffered and unmapped interval logs fdatasync once per rpo/2, so an allocation per sync
     * costs them nothing and the zeros would only double the bytes the disk takes. */
    w->zero_ahead = !w->zero_fill && (cfg->level == WAL_LEVEL_SYNC || w->map_writes);
    w->rng = cfg->seed;
    w->log_id = cfg->log_id ? cfg->log_id : next_random(w);
    whole_pages_init(w, cfg);
    if (cfg->need_new_segment) {
        wal_span first = {0};
        first.segment_no = cfg->segment_no;
        first.salt = cfg->segment_salt ? cfg->segment_salt : next_random(w); /* tests pin it */
        first.first_lsn = cfg->next_lsn;
        first.file_size = cfg->segment_bytes;
        int rc = open_segment(w, &first);
        if (rc) return rc;
        w->p_segno = first.segment_no;
        w->p_salt = first.salt;
        w->p_first_lsn = first.first_lsn;
        w->p_offset = WAL_SEGMENT_HEADER_SIZE;
        w->p_size = first.file_size;
        return 0;
    }
    char path[4096];
    wal_segment_path(path, sizeof path, dir, cfg->segment_no, "");
    int fd = wal_io_open(path, O_RDWR, 0);
    if (fd < 0) return fd;
    w->fd = fd;
    w->fd_segno = cfg->segment_no;
    w->fd_size = cfg->segment_size > cfg->tail_offset ? cfg->segment_size : cfg->tail_offset;
    w->fd_zeroed = cfg->tail_offset; /* beyond the tail: holes or zeros, unknown */
    w->fd_written = cfg->tail_offset;
    last_page_read(w, cfg->tail_offset);
    w->p_segno = cfg->segment_no;
    w->p_salt = cfg->segment_salt;
    w->p_first_lsn = 0; /* only used for new spans of a rolled segment */
    w->p_offset = cfg->tail_offset;
    w->p_size = cfg->segment_size > cfg->tail_offset ? cfg->segment_size : cfg->tail_offset;
    w->mappable = segment_mappable(w);
    return 0;
}

void wal_writer_close(wal_writer *w) {
    close_segment(w);
    free(w->dir);
    w->dir = NULL;
    free(w->last_page);
    w->last_page = NULL;
    w->whole_pages = 0;
}
