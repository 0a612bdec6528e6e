/*
 * collapse.c -- see collapse.h. An open-addressing hash table (linear probing, at most
 * half full) keyed by the key's bytes.
 */
#include "collapse.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CTAB_MIN_CAP 1024
#define KEY_CHUNK_BYTES (64u << 10)

struct ctab_chunk {
    ctab_chunk *next;
    size_t used, cap;
    char data[];
};

/* A copy of key in the table's chunks (bump allocation; freed with the table). NULL: out of memory. */
static const char *keep_key(ctab *t, const char *key, uint32_t klen) {
    ctab_chunk *c = t->keys;
    if (c == NULL || c->cap - c->used < klen) {
        size_t cap = klen > KEY_CHUNK_BYTES ? klen : KEY_CHUNK_BYTES;
        c = malloc(sizeof *c + cap);
        if (c == NULL) return NULL;
        c->next = t->keys;
        c->used = 0;
        c->cap = cap;
        t->keys = c;
    }
    char *copy = c->data + c->used;
    memcpy(copy, key, klen);
    c->used += klen;
    return copy;
}

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t key_hash(uint64_t seed, const char *k, uint32_t n) {
    uint64_t h = seed ^ ((uint64_t)n * 0x9e3779b97f4a7c15ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, k, 8);
        h = mix(h ^ w);
        k += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, k, n);
    h = mix(h ^ w ^ ((uint64_t)n << 56));
    return h ? h : 1; /* 0 marks an empty slot */
}

void ctab_init(ctab *t) {
    memset(t, 0, sizeof *t);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t->seed = mix((uint64_t)(uintptr_t)t ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32));
}

static ctab_slot *find(ctab_slot *slots, size_t cap, uint64_t h, const char *key, uint32_t klen) {
    size_t i = (size_t)h & (cap - 1);
    for (;; i = (i + 1) & (cap - 1)) {
        ctab_slot *s = &slots[i];
        if (s->hash == 0 || (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0)) return s;
    }
}

static int grow(ctab *t) {
    size_t cap = t->cap ? t->cap * 2 : CTAB_MIN_CAP;
    ctab_slot *slots = calloc(cap, sizeof *slots);
    if (slots == NULL) return -1;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].hash) *find(slots, cap, t->slots[i].hash, t->slots[i].key, t->slots[i].klen) = t->slots[i];
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

int ctab_put(ctab *t, uint64_t lsn, int kind, const char *key, uint32_t klen, const char *val, uint32_t vlen) {
    if ((t->used + 1) * 2 > t->cap && grow(t) < 0) return -1;
    uint64_t h = key_hash(t->seed, key, klen);
    ctab_slot *s = find(t->slots, t->cap, h, key, klen);
    const char *kept;
    if (s->hash) { /* an older write of this key: replaced; its key copy stays */
        kept = s->key;
        t->held_bytes -= s->klen + s->vlen;
        if (s->owned) free(s->owned);
        else if (s->vlen) t->borrowed--;
    } else {
        kept = keep_key(t, key, klen);
        if (kept == NULL) return -1;
        t->used++;
    }
    *s = (ctab_slot){.hash = h, .lsn = lsn, .seq = t->seq++, .key = kept, .val = vlen ? val : NULL,
                     .klen = klen, .vlen = vlen, .owned = NULL, .kind = kind};
    t->held_bytes += (size_t)klen + vlen;
    if (vlen) t->borrowed++;
    return 0;
}

int ctab_own_all(ctab *t) {
    for (size_t i = 0; i < t->cap && t->borrowed; i++) {
        ctab_slot *s = &t->slots[i];
        if (s->hash == 0 || s->owned || s->vlen == 0) continue;
        char *copy = malloc(s->vlen);
        if (copy == NULL) return -1;
        memcpy(copy, s->val, s->vlen);
        s->owned = copy;
        s->val = copy;
        t->borrowed--;
    }
    return 0;
}

static int by_seq(const void *a, const void *b) {
    uint64_t x = (*(ctab_slot *const *)a)->seq, y = (*(ctab_slot *const *)b)->seq;
    return (x > y) - (x < y);
}

ctab_slot **ctab_sorted(ctab *t, size_t *n) {
    *n = 0;
    if (t->used == 0) return NULL;
    ctab_slot **out = malloc(t->used * sizeof *out);
    if (out == NULL) {
        *n = SIZE_MAX;
        return NULL;
    }
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].hash) out[(*n)++] = &t->slots[i];
    qsort(out, *n, sizeof *out, by_seq);
    return out;
}

void ctab_reset(ctab *t) {
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].hash && t->slots[i].owned) free(t->slots[i].owned);
    free(t->slots);
    for (ctab_chunk *c = t->keys, *next; c != NULL; c = next) {
        next = c->next;
        free(c);
    }
    uint64_t seed = t->seed;
    memset(t, 0, sizeof *t);
    t->seed = seed;
}
