/*
 * reader.c -- validate a segment image and classify its end (FORMAT.md,
 * "Reading a segment"; rule numbers H*, R* below refer to it).
 *
 * The one subtle decision is torn versus corrupt. A crash can only damage
 * bytes that were never fdatasynced, and those are always the newest bytes of
 * the newest segment -- but not necessarily its last bytes: a power cut during
 * an fdatasync may keep a later sector of the batch and lose an earlier one.
 * So a bad record is a *torn tail* unless the log itself proves the damaged
 * bytes had been made durable: a valid MARK record after the damage whose LSN
 * (durable when the writer placed it) reaches the damaged record. Only then is
 * it corruption, which no crash explains.
 */
#include "reader.h"

#include "crc32c.h"
#include "format.h"

static int all_zero(const uint8_t *p, size_t n) {
    /* Word-at-a-time: zero tails of preallocated segments can be large. */
    while (n && ((uintptr_t)p & 7)) {
        if (*p++) return 0;
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        if (w) return 0;
        p += 8;
        n -= 8;
    }
    while (n--)
        if (*p++) return 0;
    return 1;
}

static uint32_t record_crc(const uint8_t *rec, uint32_t length) {
    uint32_t c = wal_crc32c(0, rec + 4, WAL_RECORD_HEADER_SIZE - 4);
    return wal_crc32c(c, rec + WAL_RECORD_HEADER_SIZE, length);
}

int wal_segment_header_decode(const uint8_t *d, size_t len, wal_segment_header *h, const char **reason) {
    if (len < WAL_SEGMENT_HEADER_SIZE) { *reason = "short header"; return -1; }             /* H1 */
    if (memcmp(d, WAL_MAGIC, WAL_MAGIC_LEN) != 0) { *reason = "bad magic"; return -1; }     /* H2 */
    if (wal_get_u16(d + WAL_SH_VERSION) != WAL_FORMAT_VERSION) {                            /* H3 */
        *reason = "unsupported version";
        return -1;
    }
    if (wal_crc32c(0, d, WAL_SH_CRC) != wal_get_u32(d + WAL_SH_CRC)) {                      /* H4 */
        *reason = "bad header crc";
        return -1;
    }
    if (wal_get_u16(d + WAL_SH_HEADER_SIZE) != WAL_SEGMENT_HEADER_SIZE) {                   /* H5 */
        *reason = "bad header size";
        return -1;
    }
    if (wal_get_u32(d + WAL_SH_FLAGS) || wal_get_u32(d + WAL_SH_RESERVED)) {                /* H6 */
        *reason = "bad header flags";
        return -1;
    }
    h->version = wal_get_u16(d + WAL_SH_VERSION);
    h->log_id = wal_get_u64(d + WAL_SH_LOG_ID);
    h->segment_no = wal_get_u64(d + WAL_SH_SEGMENT_NO);
    h->first_lsn = wal_get_u64(d + WAL_SH_FIRST_LSN);
    h->salt = wal_get_u64(d + WAL_SH_SALT);
    h->prealloc_bytes = wal_get_u64(d + WAL_SH_PREALLOC);
    if (!h->log_id || !h->segment_no || !h->first_lsn || !h->salt || h->segment_no > WAL_MAX_NUMBER ||
        h->first_lsn > WAL_MAX_NUMBER) {                                                    /* H7 */
        *reason = "bad header fields";
        return -1;
    }
    return 0;
}

/* A record at p that would pass R4..R9 -- used to tell torn from corrupt. */
static int looks_valid(const uint8_t *d, size_t len, size_t p, uint32_t salt_check) {
    const uint8_t *r = d + p;
    if (wal_get_u32(r + WAL_RH_SALT_CHECK) != salt_check) return 0;
    uint8_t type = r[WAL_RH_TYPE];
    if (type != WAL_REC_DATA && type != WAL_REC_SEAL && type != WAL_REC_MARK) return 0;
    if (r[WAL_RH_FLAGS] || wal_get_u16(r + WAL_RH_RESERVED)) return 0;
    uint32_t length = wal_get_u32(r + WAL_RH_LENGTH);
    if (length > WAL_MAX_PAYLOAD) return 0;
    if (wal_record_size(length) > len - p) return 0;
    return record_crc(r, length) == wal_get_u32(r + WAL_RH_CRC);
}

/* Rule T: bad bytes at `bad`, where the record with LSN `expected` should be. */
static int torn_candidate(const uint8_t *d, size_t len, size_t bad, const char *reason, uint32_t salt_check,
                          uint64_t expected, wal_scan_result *res) {
    res->reason = reason;
    res->bad_offset = bad;
    res->end_offset = bad;
    size_t p = bad + WAL_ALIGN;
    while (p + WAL_RECORD_HEADER_SIZE <= len) {
        if (!looks_valid(d, len, p, salt_check)) {
            p += WAL_ALIGN;
            continue;
        }
        const uint8_t *r = d + p;
        if (!res->next_valid_offset) {
            res->next_valid_offset = p;
            res->next_valid_lsn = wal_get_u64(r + WAL_RH_LSN);
        }
        if (r[WAL_RH_TYPE] == WAL_REC_MARK && wal_get_u64(r + WAL_RH_LSN) >= expected) {
            res->status = WAL_SCAN_CORRUPT; /* the writer knew the damaged record durable */
            return res->status;
        }
        p += wal_record_size(wal_get_u32(r + WAL_RH_LENGTH));
    }
    size_t end = len;
    while (end > bad && d[end - 1] == 0) end--;
    res->status = WAL_SCAN_TORN;
    res->damage_end = end;
    return res->status;
}

static int corrupt_at(size_t off, const char *reason, wal_scan_result *res) {
    res->status = WAL_SCAN_CORRUPT;
    res->reason = reason;
    res->bad_offset = off;
    res->end_offset = off;
    return res->status;
}

/* Where validated DATA records go, for wal_scan_records; NULL for a plain scan. */
typedef struct {
    uint64_t from_lsn;
    size_t cap, n;
    uint64_t *lsns, *offsets;
    uint32_t *lengths;
} record_sink;

/* The header rules (H*): on success the scan resumes from the first record. */
static int scan_start(const uint8_t *d, size_t len, wal_scan_result *res) {
    memset(res, 0, sizeof *res);
    res->reason = "";
    const char *why;
    if (wal_segment_header_decode(d, len, &res->header, &why) != 0) {
        memset(&res->header, 0, sizeof res->header);
        return corrupt_at(0, why, res);
    }
    res->header_ok = 1;
    res->last_lsn = res->header.first_lsn - 1;
    res->end_offset = WAL_SEGMENT_HEADER_SIZE;
    return WAL_SCAN_MORE;
}

/* The record rules (R*), from res->end_offset with the next DATA LSN res->last_lsn + 1. */
static int scan_records(const uint8_t *d, size_t len, wal_scan_result *res, record_sink *sink) {
    const uint32_t salt_check = (uint32_t)res->header.salt;
    uint64_t expected = res->last_lsn + 1;
    size_t off = (size_t)res->end_offset;

    for (;;) {
        res->end_offset = off;
        if (sink && sink->n == sink->cap) { res->status = WAL_SCAN_MORE; return res->status; }
        if (off == len) { res->status = WAL_SCAN_OPEN; return res->status; }                 /* R1 */
        if (len - off < WAL_RECORD_HEADER_SIZE) {                                              /* R2 */
            if (all_zero(d + off, len - off)) { res->status = WAL_SCAN_OPEN; return res->status; }
            return torn_candidate(d, len, off, "truncated header", salt_check, expected, res);
        }
        const uint8_t *r = d + off;
        if (all_zero(r, WAL_RECORD_HEADER_SIZE)) {                                             /* R3 */
            if (all_zero(r, len - off)) { res->status = WAL_SCAN_OPEN; return res->status; }
            return torn_candidate(d, len, off, "zeroed header", salt_check, expected, res);
        }
        uint32_t length = wal_get_u32(r + WAL_RH_LENGTH);
        if (length > WAL_MAX_PAYLOAD) return torn_candidate(d, len, off, "bad length", salt_check, expected, res); /* R4 */
        uint64_t size = wal_record_size(length);
        if (size > len - off) return torn_candidate(d, len, off, "truncated record", salt_check, expected, res);  /* R5 */
        if (record_crc(r, length) != wal_get_u32(r + WAL_RH_CRC))                              /* R6 */
            return torn_candidate(d, len, off, "bad crc", salt_check, expected, res);

        /* The CRC holds: this record was written whole; anything wrong is corruption. */
        uint8_t type = r[WAL_RH_TYPE];
        if (type != WAL_REC_DATA && type != WAL_REC_SEAL && type != WAL_REC_MARK)                  /* R7 */
            return corrupt_at(off, "unknown record type", res);
        if (r[WAL_RH_FLAGS] || wal_get_u16(r + WAL_RH_RESERVED)) return corrupt_at(off, "bad record flags", res); /* R8 */
        if (wal_get_u32(r + WAL_RH_SALT_CHECK) != salt_check) return corrupt_at(off, "wrong salt", res);   /* R9 */
        if (!all_zero(r + WAL_RECORD_HEADER_SIZE + length, size - WAL_RECORD_HEADER_SIZE - length))    /* R10 */
            return corrupt_at(off, "nonzero padding", res);
        uint64_t lsn = wal_get_u64(r + WAL_RH_LSN);
        if (type == WAL_REC_DATA) {                                                            /* R11 */
            if (lsn > expected || lsn > WAL_MAX_NUMBER) return corrupt_at(off, "lsn gap", res);
            if (lsn < expected) return corrupt_at(off, "lsn out of order", res);
            res->records++;
            res->last_lsn = lsn;
            expected++;
            if (sink && lsn >= sink->from_lsn) {
                sink->lsns[sink->n] = lsn;
                sink->offsets[sink->n] = off + WAL_RECORD_HEADER_SIZE;
                sink->lengths[sink->n] = length;
                sink->n++;
            }
            off += size;
            continue;
        }
        if (type == WAL_REC_MARK) {                                                            /* R13 */
            if (length != 0) return corrupt_at(off, "bad mark", res);
            if (lsn > expected - 1) return corrupt_at(off, "bad mark lsn", res);
            off += WAL_RECORD_HEADER_SIZE;
            continue;
        }
        if (length != 0) return corrupt_at(off, "bad seal", res);                              /* R12 */
        if (lsn != expected - 1) return corrupt_at(off, "bad seal lsn", res);
        off += WAL_SEAL_SIZE;
        res->end_offset = off;
        if (!all_zero(d + off, len - off)) {
            res->status = WAL_SCAN_CORRUPT;
            res->reason = "data after seal";
            res->bad_offset = off;
            return res->status;
        }
        res->status = WAL_SCAN_SEALED;
        return res->status;
    }
}

int wal_scan_segment(const uint8_t *d, size_t len, wal_scan_result *res) {
    if (scan_start(d, len, res) != WAL_SCAN_MORE) return res->status;
    return scan_records(d, len, res, NULL);
}

int wal_scan_records(const uint8_t *d, size_t len, wal_scan_result *res, uint64_t from_lsn, size_t cap,
                     uint64_t *lsns, uint64_t *offsets, uint32_t *lengths, size_t *count) {
    *count = 0;
    if (res->status != WAL_SCAN_MORE && scan_start(d, len, res) != WAL_SCAN_MORE) return res->status;
    record_sink sink = {from_lsn, cap, 0, lsns, offsets, lengths};
    int status = scan_records(d, len, res, &sink);
    *count = sink.n;
    return status;
}

size_t wal_segment_records(const uint8_t *d, size_t end, uint64_t from_lsn, uint64_t *cursor, size_t cap,
                           uint64_t *lsns, uint64_t *offsets, uint32_t *lengths) {
    size_t off = *cursor ? (size_t)*cursor : WAL_SEGMENT_HEADER_SIZE;
    size_t n = 0;
    while (n < cap && off + WAL_RECORD_HEADER_SIZE <= end) {
        const uint8_t *r = d + off;
        uint32_t length = wal_get_u32(r + WAL_RH_LENGTH);
        uint64_t lsn = wal_get_u64(r + WAL_RH_LSN);
        if (r[WAL_RH_TYPE] == WAL_REC_DATA && lsn >= from_lsn) {
            lsns[n] = lsn;
            offsets[n] = off + WAL_RECORD_HEADER_SIZE;
            lengths[n] = length;
            n++;
        }
        off += wal_record_size(length);
    }
    *cursor = off;
    return n;
}
