/*
 * wal.h -- the C API of the agentwal core, as seen by Python.
 *
 * native/build.py feeds the part between the CDEF markers to cffi verbatim,
 * so this file is the single declaration of the boundary: keep that part to
 * plain declarations and integer #defines. Every symbol starts with wal_.
 * Functions return WAL_OK (0) or a negative WAL_E* code; wal_strerror names it.
 */
#ifndef WAL_H
#define WAL_H

#include <stddef.h>
#include <stdint.h>

/* CDEF-BEGIN */
#define WAL_OK 0
#define WAL_EIO -1       /* a write failed; errno in the log's error detail */
#define WAL_ENOSPC -2    /* no space left on device */
#define WAL_EFAILED -3   /* the log stopped after an I/O or fsync failure (I5) */
#define WAL_ECLOSED -4   /* the log is closed */
#define WAL_EINVAL -5    /* bad argument */
#define WAL_ETOOBIG -6   /* payload over WAL_MAX_PAYLOAD */
#define WAL_EAGAIN -7    /* would block (non-waiting append under back-pressure) */
#define WAL_ENOMEM -8
#define WAL_EOS -9       /* other operating-system error; errno in the error detail */
#define WAL_EFORKED -10  /* a forked child: the log belongs to the process that opened it */

#define WAL_LEVEL_SYNC 0      /* acknowledged after an fdatasync covering it */
#define WAL_LEVEL_INTERVAL 1  /* acknowledged after write() to the OS */
#define WAL_LEVEL_BUFFERED 2  /* acknowledged after the copy into the log's buffer */

#define WAL_WAIT_NONE 0   /* append: enqueue, ask the flusher to reach the level, WAL_EAGAIN on back-pressure */
#define WAL_WAIT_LEVEL 1  /* append: return once the level holds (group commit) */
#define WAL_WAIT_LATER 2  /* append: enqueue only; the caller calls wal_log_wait */
#define WAL_WAIT_TRY 3    /* append: as LATER, but WAL_EAGAIN instead of blocking on back-pressure; at
                           * interval it also makes the write when wal_log_wait_try would */

#define WAL_PREALLOC_SIZE 0   /* new segments: extend with ftruncate */
#define WAL_PREALLOC_ZEROS 1  /* new segments: write zeros (fdatasync then flushes no metadata) */

#define WAL_SCAN_OPEN 0
#define WAL_SCAN_SEALED 1
#define WAL_SCAN_TORN 2
#define WAL_SCAN_CORRUPT 3
#define WAL_SCAN_MORE 4 /* wal_scan_records only: the arrays are full; call again */

#define WAL_MAX_PAYLOAD_BYTES 16777216
#define WAL_SEGMENT_HEADER_BYTES 64
#define WAL_RECORD_HEADER_BYTES 24
#define WAL_FORMAT_VERSION_CURRENT 1

const char *wal_strerror(int code);

/* ---- CRC-32C (crc32c.c) ---- */
uint32_t wal_crc32c(uint32_t crc, const void *data, size_t len);
uint32_t wal_crc32c_sw(uint32_t crc, const void *data, size_t len);
uint32_t wal_crc32c_hw(uint32_t crc, const void *data, size_t len);
int wal_crc32c_hw_available(void);

/* ---- archive log objects (objindex.c) ---- */
/* Check `count` records (lsn:u64 length:u32 crc:u32 payload, LSNs first, first+1, ...) from
 * buf[off] on, within buf[0:size), filling each one's LSN, payload offset and length. Returns the
 * offset after the last record, or -(i + 1) when record i is cut off, out of order or fails its
 * CRC-32C. */
int64_t wal_archive_index(const uint8_t *buf, uint64_t size, uint64_t off, uint64_t first, uint64_t count,
                          uint64_t *lsns, uint64_t *offsets, uint32_t *lengths);
#define WAL_MAX_KEY_BYTES 511 /* the longest key a store holds: LMDB's default key limit */
/* Check the `count` entries of an archive snapshot from buf[off] on (objindex.c): the offset after
 * the last, or -(i + 1) when entry i is cut off, has a key of 0 or over WAL_MAX_KEY_BYTES bytes or
 * fails its CRC-32C; *in_order: keys increasing. */
int64_t wal_snapshot_check(const uint8_t *buf, uint64_t size, uint64_t off, uint64_t count, int *in_order);
/* The same over a snapshot still arriving: the whole entries in buf[0:size) (objindex.c); on
 * -(i + 1), *end is entry i's offset. */
int64_t wal_snapshot_check_prefix(const uint8_t *buf, uint64_t size, uint64_t off, uint64_t count, uint64_t *end,
                                  uint64_t *last, int *in_order);

/* ---- reader (reader.c) ---- */
typedef struct {
    uint16_t version;
    uint64_t log_id;
    uint64_t segment_no;
    uint64_t first_lsn;
    uint64_t salt;
    uint64_t prealloc_bytes;
} wal_segment_header;

typedef struct {
    int status;
    const char *reason;
    uint64_t end_offset;
    uint64_t bad_offset;
    uint64_t damage_end;
    uint64_t records;
    uint64_t last_lsn;
    uint64_t next_valid_offset;
    uint64_t next_valid_lsn;
    int header_ok;
    wal_segment_header header;
} wal_scan_result;

int wal_scan_segment(const uint8_t *data, size_t len, wal_scan_result *res);
size_t wal_segment_records(const uint8_t *data, size_t end, uint64_t from_lsn, uint64_t *cursor,
                           size_t cap, uint64_t *lsns, uint64_t *offsets, uint32_t *lengths);
int wal_scan_records(const uint8_t *data, size_t len, wal_scan_result *res, uint64_t from_lsn, size_t cap,
                     uint64_t *lsns, uint64_t *offsets, uint32_t *lengths, size_t *count);

/* ---- the log (writer.c, commit.c) ---- */
typedef struct wal_log wal_log;

typedef struct {
    uint64_t segment_bytes;   /* roll to a new segment past this size */
    int level;                /* WAL_LEVEL_*: the log's default */
    uint32_t rpo_ms;          /* bound for INTERVAL/BUFFERED; ignored for SYNC */
    uint64_t max_pending_bytes; /* cap on bytes buffered but not written (group cap) */
    int prealloc;             /* WAL_PREALLOC_* */
    uint64_t seed;            /* nonzero: deterministic log id and salts (tests only) */
    /* Where to resume, from the recovery scan. need_new_segment = 1 when there is
     * no segment yet or the last one is sealed; then segment_no/next_lsn name the
     * segment to create and its first LSN. */
    uint64_t log_id;          /* 0: draw a new one (new log) */
    int need_new_segment;
    uint64_t segment_no;
    uint64_t segment_salt;    /* salt of the segment resumed; for a new one 0 = draw (tests may pin it) */
    uint64_t segment_size;    /* current file size of the segment resumed */
    uint64_t tail_offset;     /* where the next record goes in that segment */
    uint64_t next_lsn;
} wal_log_config;

typedef struct {
    uint64_t commits;            /* DATA records acknowledged */
    uint64_t appends;            /* append calls */
    uint64_t writes;             /* batches written to the OS */
    uint64_t mapped_writes;      /* of which stored through a shared mapping, no write() (writer.c) */
    uint64_t finished_later;     /* records appended unfinished and then finished (wal_log_finish) */
    uint64_t fsyncs;             /* fdatasyncs that made records durable */
    uint64_t bytes_written;
    uint64_t synced_records;     /* records made durable, sum over fsyncs */
    uint64_t group_max;          /* most records made durable by one fsync */
    uint64_t fsync_ns_total;
    uint64_t fsync_ns_max;
    uint64_t backpressure_waits; /* appends that waited for the RPO bound or the buffer cap */
    uint64_t backpressure_ns;
    uint64_t rpo_overruns;       /* syncs that finished with the durable lag over rpo_ms */
    uint64_t write_errors;       /* writes that failed for lack of space (retried, not fatal) */
    uint64_t segments_created;
    int64_t lag_ns;              /* now - oldest acknowledged but not durable commit (0: none) */
    uint64_t appended_lsn;
    uint64_t written_lsn;
    uint64_t durable_lsn;
    uint64_t segment_no;         /* segment being appended to */
    uint64_t segment_offset;     /* its tail */
    uint64_t pending_bytes;
    int failed;                  /* WAL_E* that stopped the log, 0 if running */
    int failed_errno;
    int closed;
} wal_log_stats;

int wal_log_open(const char *dir, const wal_log_config *cfg, wal_log **out);
/* Append one payload; returns its LSN (> 0) or a WAL_E* code. `level` may be
 * the log's level or a stronger one; `wait` is a WAL_WAIT_* mode. */
int64_t wal_log_append(wal_log *log, const char *data, size_t len, int level, int wait);
/* Append n payloads packed back to back (lens[i] each) as n consecutive LSNs;
 * returns the last LSN. */
int64_t wal_log_append_many(wal_log *log, const char *data, const uint32_t *lens, size_t n, int level,
                            int wait);
/* A record appended now and finished later (native/commit.c, "Records finished later"): the
 * LSN and the place are taken at the append, and the payload's bytes from fill_from on are
 * given by wal_log_finish, which the log waits for before it writes the record. */
typedef struct {
    uint64_t batch;     /* which batch holds it (the log's count of batches) */
    uint64_t at;        /* the record's offset in that batch */
    uint32_t len;       /* its payload length */
    uint32_t fill_from; /* the payload offset wal_log_finish's bytes start at */
} wal_unfinished;
/* Append one payload of `len` bytes whose bytes from fill_from on are not final yet: as
 * wal_log_append with WAL_WAIT_TRY at `level` (never waits; WAL_EAGAIN under back-pressure;
 * WAL_EINVAL at WAL_LEVEL_BUFFERED, which would acknowledge it before it is finished),
 * and *out says where it is. The caller must then call wal_log_finish, exactly once, and soon:
 * no write of the log is made until it has (it needs nothing the log holds to do so). */
int64_t wal_log_append_unfinished(wal_log *log, const char *data, size_t len, size_t fill_from, int level,
                                  wal_unfinished *out);
/* Give an unfinished record its last len - fill_from payload bytes (`ok`), or with ok == 0 say
 * they cannot be made: the log then fails (I5) and the record is never written. 0, or a WAL_E*
 * code: WAL_EFAILED once the log has failed (the bytes are not taken: nothing more is
 * written), or WAL_EINVAL for a record it does not hold open (not appended so, finished
 * already, or out of its batch's bounds), which also fails the log. */
int wal_log_finish(wal_log *log, const wal_unfinished *rec, const char *bytes, int ok);
/* Block (helping with the I/O) until `level` holds for `lsn`. */
int wal_log_wait(wal_log *log, uint64_t lsn, int level);
/* Block (helping with the I/O) until an append of a payload of `len` bytes would be admitted, as a blocking
 * append waits under back-pressure (counted in the stats the same way): for a caller whose
 * non-blocking append was refused with WAL_EAGAIN and that must retry it under its own lock.
 * 0, or the WAL_E* code such an append would return. */
int wal_log_wait_admitted(wal_log *log, size_t len);
/* wal_log_wait without blocking, for a caller that would rather not let go of something
 * (the store keeps Python's GIL): 0 once `level` holds for `lsn`, WAL_EAGAIN when it would
 * have to wait. When only the write of the pending batch is missing and the write slot is
 * free, that write (one pwrite, no segment roll) is made here, in the calling thread. */
int wal_log_wait_try(wal_log *log, uint64_t lsn, int level);
int wal_log_sync(wal_log *log);   /* everything appended so far is durable on return */
int wal_log_close(wal_log *log);  /* flush, sync, stop the flusher; idempotent */
void wal_log_free(wal_log *log);  /* after close, when no thread can call in */
void wal_log_get_stats(wal_log *log, wal_log_stats *out);
/* out[0..3) = appended, written, durable LSN; returns the failure code (0 while running). */
int wal_log_watermarks(wal_log *log, uint64_t *out);
/* The same, with out[2] no higher than the archive's watermark (wal_log_set_archived): what is
 * acknowledged at `replicated`, for that level's reads and its materializer. */
int wal_log_watermarks_archived(wal_log *log, uint64_t *out);
/* Last LSN of a write that failed for lack of space, if still unwritten (else 0). */
uint64_t wal_log_write_failed_through(wal_log *log);
/* What that write lacked: ENOSPC or EDQUOT (space), EMFILE or ENFILE (a descriptor for a
 * segment roll); 0 when no such write is outstanding. */
int wal_log_write_failed_errno(wal_log *log);
size_t wal_log_fsync_latencies(wal_log *log, uint64_t *out_ns, size_t cap);
const char *wal_log_error_detail(wal_log *log);
int wal_log_notify_fd(wal_log *log); /* readable when watermarks advance (and once right after the first call); drain by reading 8 bytes */

/* ---- failpoints (failpoint.c), test-only ---- */
int wal_fp_set(const char *name, int err, uint64_t nth, int repeat, uint32_t prob_ppm, uint64_t seed,
               int partial);
void wal_fp_clear(void);
int64_t wal_fp_count(const char *name, int failures);
/* Every call of the site first sleeps delay_us (0: no delay); cleared by wal_fp_clear. For tests that
 * need an I/O to be slow, e.g. an fdatasync still running while another commit arrives. */
int wal_fp_set_delay(const char *name, uint32_t delay_us);
/* CDEF-END */

#endif
