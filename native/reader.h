/*
 * reader.h -- decode and validate one segment image held in memory.
 *
 * The reader never touches files: callers map or read a segment and hand the
 * bytes here, so the same code serves recovery, `Log.read`, the CLI and the
 * fuzzer. Validity rules are numbered in FORMAT.md ("Reading a segment"); the
 * reason strings are part of the contract (tests and the pure-Python reference
 * decoder in wal/log/format.py compare them verbatim).
 *
 * wal_scan_result (declared in wal.h):
 *   status            WAL_SCAN_OPEN    data ended cleanly (EOF or all-zero rest): writable tail
 *                     WAL_SCAN_SEALED  a valid SEAL record ended it; the rest is zero
 *                     WAL_SCAN_TORN    a bad record after which nothing valid follows
 *                     WAL_SCAN_CORRUPT damage that is not a torn tail
 *   reason            stable short string; "" when OPEN/SEALED
 *   end_offset        end of the last valid record (SEALED: after the seal)
 *   bad_offset        TORN/CORRUPT: offset of the offending header/record
 *   damage_end        TORN: one past the last non-zero byte at/after bad_offset
 *   records, last_lsn valid DATA records before the stop; last_lsn = first_lsn - 1 if none
 *   next_valid_*      CORRUPT because a valid record follows damage: where, and its LSN
 *
 * wal_scan_segment never reads outside data[0..len) and returns res->status.
 * wal_segment_records iterates DATA records of bytes that already passed the
 * scan (up to its end_offset) in batches of (lsn, payload offset, length).
 * wal_scan_records is the same scan in steps that hands out, as it validates
 * them, the DATA records with lsn >= from_lsn, up to `cap` per call (*count):
 * one pass over the bytes where scan-then-iterate makes two. Call it first with
 * *res zeroed and again while it returns WAL_SCAN_MORE; the last call leaves
 * exactly what wal_scan_segment would. Records handed out before damage was
 * found are valid ones (the damage comes after them).
 */
#ifndef WAL_READER_H
#define WAL_READER_H

#include "wal.h"

/* Decode a segment header; returns 0, or sets *reason and returns -1. */
int wal_segment_header_decode(const uint8_t *data, size_t len, wal_segment_header *out, const char **reason);

#endif
