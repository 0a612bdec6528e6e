/* fsync_loop.c -- physical reference of benchmarks/compare.py (compiled at run time).
 *
 *   fsync_loop MODE PATH SIZE SECONDS [LATFILE]
 *
 * Writes SIZE bytes and fdatasyncs, in a loop, for SECONDS; prints "<ops> <seconds>".
 * MODE "append": O_APPEND to a file that grows, so each fdatasync also commits the new size.
 * MODE "prealloc": overwrite a file first filled with zeros and fsynced (8 MiB, wrapping
 * around), so an fdatasync carries no metadata: the cheapest durable write the disk offers.
 * Per-commit latencies (u64 ns) go to LATFILE when given. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PREALLOC_BYTES (8u << 20)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s append|prealloc PATH SIZE SECONDS [LATFILE]\n", argv[0]);
        return 2;
    }
    int prealloc = strcmp(argv[1], "prealloc") == 0;
    size_t size = strtoul(argv[3], NULL, 10);
    uint64_t budget = (uint64_t)(atof(argv[4]) * 1e9);
    int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | (prealloc ? 0 : O_APPEND), 0644);
    if (fd < 0) { perror("open"); return 1; }
    unsigned char *buf = calloc(1, size > 65536 ? size : 65536);
    size_t cap = 1 << 16, n = 0;
    uint64_t *lat = malloc(cap * sizeof *lat);
    if (!buf || !lat || size == 0 || size > PREALLOC_BYTES) return 1;
    if (prealloc) {
        for (size_t off = 0; off < PREALLOC_BYTES; off += 65536)
            if (write(fd, buf, 65536) != 65536) { perror("prealloc"); return 1; }
        if (fsync(fd) != 0) { perror("fsync"); return 1; }
    }
    for (size_t i = 0; i < size; i++) buf[i] = (unsigned char)(i * 131 + 7);
    size_t slots = PREALLOC_BYTES / size;
    uint64_t start = now_ns(), end = start + budget, t0;
    while ((t0 = now_ns()) < end) {
        ssize_t w = prealloc ? pwrite(fd, buf, size, (off_t)((n % slots) * size)) : write(fd, buf, size);
        if (w != (ssize_t)size) { perror("write"); return 1; }
        if (fdatasync(fd) != 0) { perror("fdatasync"); return 1; }
        if (n == cap) {
            cap *= 2;
            lat = realloc(lat, cap * sizeof *lat);
            if (!lat) return 1;
        }
        lat[n++] = now_ns() - t0;
    }
    double secs = (double)(now_ns() - start) / 1e9;
    if (argc > 5) {
        FILE *f = fopen(argv[5], "wb");
        if (!f || fwrite(lat, sizeof *lat, n, f) != n) { perror("latfile"); return 1; }
        fclose(f);
    }
    printf("%zu %.9f\n", n, secs);
    close(fd);
    return 0;
}
