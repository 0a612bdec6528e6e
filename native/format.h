/*
 * format.h -- the on-disk constants of the agentwal log, in one place.
 *
 * FORMAT.md is the specification; this header only names its numbers.
 * Every multi-byte integer on disk is little-endian. A change to anything
 * here is a format change: bump WAL_FORMAT_VERSION, add a CHANGELOG line and a
 * test that files of the old version are read or refused clearly.
 */
#ifndef WAL_FORMAT_H
#define WAL_FORMAT_H

#include <stdint.h>
#include <string.h>

/* ---- segment files ------------------------------------------------------ */

/* A segment is named by its number as 16 lower-case hex digits + ".wal",
 * e.g. "0000000000000001.wal". While it is being made it is "<name>.tmp". */
#define WAL_SEGMENT_SUFFIX ".wal"
#define WAL_SEGMENT_NAME_LEN 20 /* 16 hex digits + ".wal" */

/* Segment header: 64 bytes at offset 0.
 *   0  8  magic "AGWALSEG"
 *   8  2  format version (WAL_FORMAT_VERSION)
 *  10  2  header size (WAL_SEGMENT_HEADER_SIZE)
 *  12  4  flags, reserved: must be 0
 *  16  8  log id: random, the same in every segment of one log
 *  24  8  segment number, >= 1, consecutive
 *  32  8  first LSN: the LSN the first data record of the segment carries
 *  40  8  salt: random per segment, never 0
 *  48  8  preallocated size the writer gave the file (informational)
 *  56  4  reserved: must be 0
 *  60  4  CRC-32C of bytes 0..59
 */
#define WAL_MAGIC "AGWALSEG"
#define WAL_MAGIC_LEN 8
#define WAL_FORMAT_VERSION 1
#define WAL_SEGMENT_HEADER_SIZE 64
#define WAL_SH_MAGIC 0
#define WAL_SH_VERSION 8
#define WAL_SH_HEADER_SIZE 10
#define WAL_SH_FLAGS 12
#define WAL_SH_LOG_ID 16
#define WAL_SH_SEGMENT_NO 24
#define WAL_SH_FIRST_LSN 32
#define WAL_SH_SALT 40
#define WAL_SH_PREALLOC 48
#define WAL_SH_RESERVED 56
#define WAL_SH_CRC 60

/* ---- records ------------------------------------------------------------ */

/* Record header: 24 bytes at an 8-aligned offset, then the payload, then
 * zero padding up to the next multiple of 8.
 *   0  4  CRC-32C of record bytes 4..23 followed by the payload (not padding)
 *   4  4  payload length in bytes (padding excluded)
 *   8  8  LSN (DATA: this record's LSN; SEAL: LSN of the segment's last
 *         DATA record, i.e. first LSN - 1 when it holds none; MARK: the
 *         durable LSN it vouches for)
 *  16  1  type (WAL_REC_DATA, WAL_REC_SEAL or WAL_REC_MARK)
 *  17  1  flags, reserved: must be 0
 *  18  2  reserved: must be 0
 *  20  4  salt check: low 32 bits of the segment's salt
 */
#define WAL_RECORD_HEADER_SIZE 24
#define WAL_RH_CRC 0
#define WAL_RH_LENGTH 4
#define WAL_RH_LSN 8
#define WAL_RH_TYPE 16
#define WAL_RH_FLAGS 17
#define WAL_RH_RESERVED 18
#define WAL_RH_SALT_CHECK 20

#define WAL_REC_DATA 1 /* one committed payload, consumes one LSN */
#define WAL_REC_SEAL 2 /* last record of a finished segment, payload empty */
#define WAL_REC_MARK 3 /* durability mark, payload empty: LSN field = an LSN that was
                        * durable when the writer placed this record; starts a write
                        * batch whenever the durable LSN moved since the last mark */

/* Segment numbers and LSNs stay below 2^63 - 1: the C API returns LSNs as int64. */
#define WAL_MAX_NUMBER 9223372036854775806u /* 2^63 - 2 */

#define WAL_ALIGN 8
#define WAL_MAX_PAYLOAD (16u << 20) /* 16 MiB */
#define WAL_SEAL_SIZE WAL_RECORD_HEADER_SIZE

/* Bytes a record with this payload length occupies in the segment. */
static inline uint64_t wal_record_size(uint64_t payload_len) {
    return WAL_RECORD_HEADER_SIZE + ((payload_len + (WAL_ALIGN - 1)) & ~(uint64_t)(WAL_ALIGN - 1));
}

/* ---- little-endian helpers ---------------------------------------------- */

static inline void wal_put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void wal_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void wal_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t wal_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t wal_get_u32(const uint8_t *p) {
    uint32_t v; memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}
static inline uint64_t wal_get_u64(const uint8_t *p) {
    uint64_t v; memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

#endif /* WAL_FORMAT_H */
