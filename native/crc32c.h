/* crc32c.h -- CRC-32C (Castagnoli), the checksum of every record and header.
 *
 * wal_crc32c() dispatches once, at first use, to the SSE4.2 instruction path
 * (three interleaved streams joined with PCLMULQDQ when the CPU has it too, see
 * crc32c.c) when the CPU has it and to a portable slicing-by-8 table otherwise. Both are
 * exported so tests can hold each against an independent implementation.
 * `crc` is the running value of a previous call (0 to start), so
 * wal_crc32c(wal_crc32c(0, a), b) == wal_crc32c(0, a || b). */
#ifndef WAL_CRC32C_H
#define WAL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t wal_crc32c(uint32_t crc, const void *data, size_t len);
uint32_t wal_crc32c_sw(uint32_t crc, const void *data, size_t len);
uint32_t wal_crc32c_hw(uint32_t crc, const void *data, size_t len); /* only if available */
int wal_crc32c_hw_available(void);

#endif
