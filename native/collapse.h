/*
 * collapse.h -- each key's last write over a run of store records, in plain C.
 *
 * Replay reads the whole log (a gigabyte is common) and LMDB only needs each key's
 * last write. A Python object per record would cost more than the disk read, so the
 * table below works on raw bytes: a slot's value points into the caller's memory (a
 * mapped segment) and is copied only when the caller says that memory is about to go
 * (ctab_own_all). Each distinct key is copied once, when first seen, into the table's
 * own chunks: every later write of it is compared with that compact copy, which stays
 * in cache, not with the previous write's key, megabytes back in the segment.
 * wal._storecore turns the winners into Python objects once, at the end of a batch
 * (native/storecore.c, Collapser and collapse()).
 *
 * Contracts.
 *  - ctab_put is called in LSN order (ops of one record in record order); a later call
 *    for the same key replaces the earlier one.
 *  - A borrowed slot's value stays valid until ctab_own_all or ctab_reset: the caller
 *    keeps its buffer alive until then. Keys never borrow.
 *  - Keys are hashed with a per-table random seed, so a log full of chosen keys cannot
 *    turn replay quadratic.
 */
#ifndef WAL_COLLAPSE_H
#define WAL_COLLAPSE_H

#include <stddef.h>
#include <stdint.h>

enum { CTAB_PUT = 0x01, CTAB_DELETE = 0x02 }; /* the op kinds of FORMAT.md §15 */

typedef struct {
    uint64_t hash; /* 0: empty slot */
    uint64_t lsn;
    uint64_t seq;  /* order of the winning write, for LSN-ordered output */
    const char *key, *val; /* key: the table's copy; val: the caller's memory or `owned` */
    uint32_t klen, vlen;
    char *owned;   /* the value's copy, once made (NULL while borrowed, and for vlen 0) */
    int kind;
} ctab_slot;

typedef struct ctab_chunk ctab_chunk; /* where the keys are copied (collapse.c) */

typedef struct {
    ctab_slot *slots;
    size_t cap, used;     /* cap: a power of two (or 0 before the first put) */
    size_t held_bytes;    /* key + value bytes of the winners, borrowed or owned */
    size_t borrowed;      /* winners whose value still points into the caller's memory */
    uint64_t seq, seed;
    ctab_chunk *keys;     /* newest chunk first */
} ctab;

void ctab_init(ctab *t);
/* Record a write of key (value: val/vlen for a put; NULL/0 for a delete). -1: out of memory. */
int ctab_put(ctab *t, uint64_t lsn, int kind, const char *key, uint32_t klen, const char *val, uint32_t vlen);
/* Copy every borrowed value, so the caller may free or unmap its memory. -1: out of memory
 * (the table is unchanged but for the slots already copied, which stay valid). */
int ctab_own_all(ctab *t);
/* The winners in the order of their last write (pointers into the table; NULL when empty,
 * or out of memory: then *n is set to SIZE_MAX). The caller frees the array. */
ctab_slot **ctab_sorted(ctab *t, size_t *n);
/* Forget everything (frees the copies, the keys and the slots). */
void ctab_reset(ctab *t);

#endif
