/* objindex.c -- check and index the records of an archive log object (FORMAT.md §18).
 *
 * A log object's records follow its 64-byte header: lsn:u64 length:u32 crc:u32 payload, with the
 * CRC-32C over the record's first 12 bytes and then its payload (the log's own checksum). The
 * archive's readers (restore, verify, followers, a writer's open) check every record of every
 * object they use; done in Python that was a few microseconds of interpreter per record, with the
 * GIL held, in the download threads. Here it is one call per object, without the GIL (cffi
 * releases it), and it leaves the records where they are: the arrays it fills are the layout
 * record.Collapser and Log.read_spans use (lsns and payload offsets u64, lengths u32). The
 * writing side, the record section of an object built in one call, is native/readcall.c's
 * `object_records`. */
#include <string.h>

#include "wal.h"

int64_t wal_archive_index(const uint8_t *buf, uint64_t size, uint64_t off, uint64_t first, uint64_t count,
                          uint64_t *lsns, uint64_t *offsets, uint32_t *lengths) {
    for (uint64_t i = 0; i < count; i++) {
        uint64_t lsn;
        uint32_t length, crc;
        if (off > size || size - off < 16) return -(int64_t)(i + 1);
        memcpy(&lsn, buf + off, 8); /* little-endian on every platform agentwal builds for */
        memcpy(&length, buf + off + 8, 4);
        memcpy(&crc, buf + off + 12, 4);
        uint64_t start = off + 16;
        if (lsn != first + i || length > size - start) return -(int64_t)(i + 1);
        if (wal_crc32c(wal_crc32c(0, buf + off, 12), buf + start, length) != crc) return -(int64_t)(i + 1);
        lsns[i] = lsn;
        offsets[i] = start;
        lengths[i] = length;
        off = start + length;
    }
    return (int64_t)off;
}

/* The entries of an archive snapshot (FORMAT.md §18, "Snapshot"): klen:u32 vlen:u32 version:u64
 * crc:u32 key value, the CRC-32C over the entry's first 16 bytes, its key and its value. Checks
 * `count` entries from buf[off] on within buf[0:size), one call for the whole snapshot without
 * the GIL (a Python loop cost microseconds per entry, and a snapshot can hold millions).
 * Returns the offset after the last entry, or -(i + 1) when entry i is cut off or fails its
 * CRC-32C. *in_order: 1 if the keys strictly increase in LMDB's order (bytes, then the shorter
 * first), as the writer lays them out, so a restore may append them (MDB_APPEND); else 0. */
int64_t wal_snapshot_check(const uint8_t *buf, uint64_t size, uint64_t off, uint64_t count, int *in_order) {
    uint64_t end, last = UINT64_MAX;
    *in_order = 1;
    int64_t n = wal_snapshot_check_prefix(buf, size, off, count, &end, &last, in_order);
    if (n < 0) return n;                             /* entry -n - 1 fails its CRC-32C */
    if ((uint64_t)n < count) return -(n + 1);        /* entry n is cut off */
    return (int64_t)end;
}

/* wal_snapshot_check over a snapshot still arriving (a restore loads it as its ranges come in):
 * the entries from buf[off] on, at most `count`, that lie whole within buf[0:size), each
 * checked as wal_snapshot_check does. Returns how many (0 when the next one is not whole yet),
 * with *end the offset after them; or -(i + 1) when whole entry i fails its check, with *end its
 * offset. Order is carried across calls over the same buffer: *last is the offset of the last
 * entry checked (UINT64_MAX before the first), and *in_order is cleared once a key does not
 * follow it. */
int64_t wal_snapshot_check_prefix(const uint8_t *buf, uint64_t size, uint64_t off, uint64_t count, uint64_t *end,
                                  uint64_t *last, int *in_order) {
    uint64_t i = 0;
    for (; i < count; i++) {
        uint32_t klen, vlen, crc;
        if (off > size || size - off < 20) break;
        memcpy(&klen, buf + off, 4);
        memcpy(&vlen, buf + off + 4, 4);
        memcpy(&crc, buf + off + 16, 4);
        uint64_t start = off + 20;
        if ((uint64_t)klen + vlen > size - start) break;
        /* A key LMDB cannot hold (FORMAT.md §18: 1 to 511 bytes) is the snapshot's damage, as a
         * failed CRC is, never a fault of the state it is loaded into. */
        if (klen == 0 || klen > WAL_MAX_KEY_BYTES ||
            wal_crc32c(wal_crc32c(0, buf + off, 16), buf + start, (size_t)klen + vlen) != crc) {
            *end = off;
            return -(int64_t)(i + 1);
        }
        if (*in_order && *last != UINT64_MAX) {
            uint32_t prev_len;
            memcpy(&prev_len, buf + *last, 4);
            const uint8_t *prev = buf + *last + 20;
            int c = memcmp(prev, buf + start, prev_len < klen ? prev_len : klen);
            if (c > 0 || (c == 0 && prev_len >= klen)) *in_order = 0;
        }
        *last = off;
        off = start + klen + vlen;
    }
    *end = off;
    return (int64_t)i;
}
