/* Short spin-waits: for a thread that expects another, running now, to be done within
 * microseconds (native/commit.c, await_finished; native/storecore.c, core_overlay_newest),
 * where sleeping on a condition would cost a context switch each side. A spin is bounded by a
 * deadline on the monotonic clock, and its caller falls back to a blocking wait after it. */
#ifndef WAL_SPIN_H
#define WAL_SPIN_H

#include <stdint.h>
#include <time.h>

/* A pause inside a spin loop: tells the CPU (and a hypervisor) that this thread waits. */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
