/* crc32c.c -- CRC-32C, hardware and software paths (see crc32c.h). */
#include "crc32c.h"

#include <string.h>

#define POLY 0x82F63B78u /* Castagnoli, bit-reflected */

static uint32_t table[8][256];
static int table_ready;

static void build_table(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++) table[t][n] = (table[t - 1][n] >> 8) ^ table[0][table[t - 1][n] & 0xff];
    __atomic_store_n(&table_ready, 1, __ATOMIC_RELEASE);
}

uint32_t wal_crc32c_sw(uint32_t crc, const void *data, size_t len) {
    if (!__atomic_load_n(&table_ready, __ATOMIC_ACQUIRE)) build_table(); /* idempotent race */
    const uint8_t *p = data;
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
#endif
        w ^= crc;
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
              table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
              table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>

/* One 8-byte crc32 instruction per word: ~8 bytes per 3 cycles. Interleaving
 * three streams would triple that; records are small, so it has not paid yet. */
__attribute__((target("sse4.2"))) uint32_t wal_crc32c_hw(uint32_t crc, const void *data, size_t len) {
    const uint8_t *p = data;
    uint64_t c = (uint32_t)~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        len -= 8;
    }
    while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

int wal_crc32c_hw_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
}
#else
uint32_t wal_crc32c_hw(uint32_t crc, const void *data, size_t len) { return wal_crc32c_sw(crc, data, len); }
int wal_crc32c_hw_available(void) { return 0; }
#endif

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);
static crc_fn chosen;

uint32_t wal_crc32c(uint32_t crc, const void *data, size_t len) {
    crc_fn f = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (!f) {
        f = wal_crc32c_hw_available() ? wal_crc32c_hw : wal_crc32c_sw;
        __atomic_store_n(&chosen, f, __ATOMIC_RELEASE);
    }
    return f(crc, data, len);
}
