/*
 * commit.c -- group commit, durability levels and the flusher.
 *
 * Design. Appenders copy their encoded records into the `pending` batch under
 * one mutex, which also hands out LSNs, so LSN order is commit order. Two
 * I/O *slots* then move bytes on: the write slot takes the whole pending
 * batch and writes it to the OS; the sync slot fdatasyncs what has been
 * written. Any waiting thread that finds a slot free takes it (leader) and
 * works for everyone; the others wait (followers). Because a
 * new batch accumulates while the previous fdatasync runs, each fdatasync
 * covers every commit that arrived during the one before it: that is the
 * group commit, with no timer and no added latency. A batch is capped at
 * max_pending_bytes (back-pressure beyond it).
 *
 * Wake-ups. A follower sleeps on its own futex word in the `waiters` list,
 * with the watermarks it waits for. When a slot finishes, wake_waiters picks
 * the followers whose watermarks were reached and, per free slot, the first
 * follower that needs it (the next leader) -- not every follower: with 64
 * committing threads a broadcast woke 64 to let a few through, and the herd on
 * `mu` cost more than the fdatasync (perf: ~75% of all context switches). The
 * picked followers are woken after `mu` is released, and one whose watermarks
 * were reached returns without taking `mu` again: with 64 threads, re-taking it
 * after every wake-up was ~12% of all context switches, and each futex wake
 * made under `mu` made the appenders queued on it wait longer.
 *
 * Watermarks, all under `mu`: appended >= written >= durable.
 *   sync      returns once durable >= its LSN   (I2: nothing acknowledged early)
 *   interval  returns once written >= its LSN; the flusher keeps durable lag under rpo
 *   buffered  returns once enqueued;           the flusher writes and syncs under rpo
 * The flusher is a C thread (no GIL). It syncs when the oldest acknowledged but
 * not durable commit is rpo/2 old, so the window stays under rpo while an
 * fdatasync takes less than rpo/2. Appenders under weaker levels wait
 * (back-pressure, counted in stats) while the lag exceeds 3/4 rpo, so the disk
 * falling behind slows writers instead of silently widening the window; a sync
 * that still finishes past rpo is counted as an rpo overrun.
 *
 * A caller that holds the GIL (native/logcall.h) first tries wal_log_wait_try, which makes
 * an `interval` write itself when the write slot is free, or answers WAL_EAGAIN, never waits.
 *
 * I5 fail-stop: a failed write or fdatasync is never retried. The log records
 * the error, wakes everyone, and from then on every append fails with
 * WAL_EFAILED; commits not yet durable are reported failed, not acknowledged.
 * Reopening recovers from what the disk holds.
 */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "forkwatch.h"
#include "format.h"
#include "io.h"
#include "spin.h"
#include "wal.h"
#include "writer.h"

#define FINISH_SPIN_NS 30000 /* await_finished */
#define LAT_RING 1024  /* fsync latencies kept for p50/p99 */
#define MARK_RING 65536 /* (lsn, enqueue time) marks for the durable-lag clock */
#define MARK_SPACING_NS 100000
#define LONE_STREAK 4 /* do_sync */
#define DROP_WINDOW_BYTES (4u << 20) /* do_sync: the most one drop covers */

typedef struct {
    uint64_t lsn, ns;
} lag_mark;

/* A thread blocked in progress_step until written >= w_lsn and durable >= d_lsn, or until
 * it is chosen to lead the next step. Lives on that thread's stack; linked under mu.
 * `woken` is its futex word: 0 while it sleeps, then set once, under mu, by wake_waiters
 * (which unlinks it first) to WOKEN_DONE or WOKEN_RECHECK. Nothing reads or writes the
 * waiter after that store: the FUTEX_WAKE that follows, after mu is released, only names
 * the address, and a wake that arrives after the thread has moved on is a spurious wake-up
 * for whatever sleeps there next, which every futex user tolerates. That is why it is a
 * bare futex and not a condition variable, which would have to outlive the signal. */
typedef struct wal_waiter {
    uint64_t w_lsn, d_lsn;
    _Atomic uint32_t woken;
    struct wal_waiter *prev, *next;
} wal_waiter;

#define WOKEN_DONE 1    /* its watermarks were reached: it may return without mu */
#define WOKEN_RECHECK 2 /* chosen to lead, or failure, close, no space: look again under mu */
#define WAKE_BATCH 64   /* futex wakes deferred past mu per event; more are woken under mu */

/* Followers picked by wake_waiters, to be woken once mu is released. */
typedef struct {
    _Atomic uint32_t *words[WAKE_BATCH];
    int n;
} wake_list;

/* A log remembers the process that opened it (forkwatch.h: any fork is seen, also one that
 * skips Python's os.register_at_fork hooks and libc's pthread_atfork handlers) and appends
 * nothing in another: a child's commits would take LSNs its parent also hands out, each
 * acknowledged, one lost. Checked before `mu` is taken: a thread of the parent may have held
 * it at the fork, and in the child nothing would ever release it. */
/* Every entry point that writes, syncs or waits starts with this: in a forked child it returns
 * `rc` before touching `mu` or a file (the parent's batch, copied at the fork, would be written
 * again over what the parent wrote since: zero padding over its acknowledged records). */
#define REFUSE_IN_A_FORK(log, rc)                                                                   \
    do {                                                                                            \
        if ((log)->epoch != forkwatch_now()) return rc;                                             \
    } while (0)

struct wal_log {
    uint64_t epoch; /* the process that opened it (forkwatch_epoch) */
    pthread_mutex_t mu;
    pthread_cond_t progress; /* the sync slot freed, failure, close (do_write waits on it before a roll) */
    wal_waiter *waiters, *waiters_tail; /* followers, oldest first */
    /* The archive's watermark ("The archive's watermark" below): the LSN up to which the
     * object archive holds the log, set by the archive's shipper; the threads waiting for it
     * (d_lsn: the LSN each waits for), and whether the shipper stopped for good. */
    uint64_t archived;
    wal_waiter *awaiters, *awaiters_tail;
    int archive_stopped;
    pthread_cond_t wake;     /* the flusher has work */
    wal_writer w;
    wal_batch pending, spare;
    /* Records finished later ("Records finished later" below): batches handed out so far
     * (pending is number pending_no), the bytes a failed write put in front of pending's own
     * (pending_shift), and the batch a writer waits to be finished (finishing, number
     * finishing_no, its own such shift finishing_shift; NULL when none), signalled by
     * `finished`. */
    uint64_t pending_no, pending_shift, finishing_no, finishing_shift;
    wal_batch *finishing;
    pthread_cond_t finished;
    int level;
    uint64_t rpo_ns;
    uint64_t max_pending;
    int write_busy, sync_busy;
    uint64_t next_lsn;
    uint64_t appended, written, durable;
    uint64_t want_written, want_durable; /* non-waiting appends ask the flusher */
    /* durable-lag clock: marks[head..tail) cover LSNs > durable */
    lag_mark *marks;
    size_t mark_head, mark_tail;
    int failed, failed_errno;
    /* A write that failed for lack of space -- or, at a segment roll, for lack of a file
     * descriptor to create the next segment with -- is not fatal: its batch goes back in front
     * of the pending one and is rewritten, at the same offsets, by the next write. Its waiters
     * get WAL_ENOSPC (not acknowledged; the records may still reach the disk later), and
     * write_failed_errno says which resource was missing. */
    uint64_t write_failed_through; /* last LSN of the batch whose write failed */
    int write_failed_errno;        /* ENOSPC, EDQUOT, EMFILE or ENFILE: what that write lacked */
    uint64_t write_attempts;       /* do_write calls begun */
    uint64_t write_failed_attempt; /* the write_attempts number of the last write that failed so */
    uint64_t n_write_errors;
    uint64_t try_write_resume_ns; /* wal_log_wait_try makes no write before this time */
    /* Synced pages of the open segment the sync slot may let the page cache drop (writer.c
     * "Whole pages"; do_sync says when): [drop_from, drop_to) once an fdatasync covered it,
     * drop_from then moving to drop_next_from, the page the next write starts with. The last
     * write began at page write_from, by thread last_writer. Set by do_write (a roll starts
     * them at 0 in the new segment), used by do_sync. */
    uint64_t drop_from, drop_to, drop_next_from, write_from;
    pthread_t last_writer;
    uint64_t lone_streak; /* consecutive fdatasyncs of a lone commit (do_sync) */
    uint64_t streak_from; /* drop_from when the streak began, or after its last drop */
    char detail[512];
    int closing, closed;
    pthread_t flusher;
    int flusher_started;
    int flusher_idle; /* the flusher sleeps without a deadline: a new unsynced commit must wake it */
    int notify_fd;
    int notify_wanted; /* someone asked for notify_fd (asyncio waiters): only then pay a write() per event */
    /* stats */
    uint64_t n_finished_later;
    uint64_t n_appends, n_commits, n_writes, n_fsyncs, bytes_written, synced_records, group_max;
    uint64_t fsync_ns_total, fsync_ns_max, bp_waits, bp_ns, rpo_overruns;
    uint64_t lat[LAT_RING];
    uint64_t lat_n;
};

const char *wal_strerror(int code) {
    switch (code) {
    case WAL_OK: return "ok";
    case WAL_EIO: return "I/O error";
    case WAL_ENOSPC: return "no space left on device";
    case WAL_EFAILED: return "log stopped after an I/O or fsync failure; reopen to recover";
    case WAL_ECLOSED: return "log is closed";
    case WAL_EINVAL: return "invalid argument";
    case WAL_ETOOBIG: return "payload larger than the maximum record size";
    case WAL_EAGAIN: return "would block";
    case WAL_ENOMEM: return "out of memory";
    case WAL_EOS: return "operating-system error";
    case WAL_EFORKED: return "this process is a fork of the one that opened the log; open it again here";
    default: return "unknown error";
    }
}

static int code_of_errno(int neg_errno) {
    switch (-neg_errno) {
    case ENOSPC: return WAL_ENOSPC;
    case EIO: return WAL_EIO;
    case ENOMEM: return WAL_ENOMEM;
    default: return WAL_EOS;
    }
}

static int write_failed_for(wal_log *log, uint64_t lsn);
static int pick_awaiters(wal_log *log, int everyone, wake_list *wl);
static int wait_level(wal_log *log, uint64_t lsn, int level, int *unlocked);

static void futex_wake_one(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void wake_listed(wake_list *wl) {
    for (int i = 0; i < wl->n; i++) futex_wake_one(wl->words[i]);
    wl->n = 0;
}

/* The followers (`waiters`) and the archive's waiters (`awaiters`) are each a list of
 * wal_waiter, head and tail, under mu. */
static void list_unlink(wal_waiter **head, wal_waiter **tail, wal_waiter *w) {
    if (w->prev) w->prev->next = w->next;
    else *head = w->next;
    if (w->next) w->next->prev = w->prev;
    else *tail = w->prev;
    w->prev = w->next = NULL;
}

static void waiter_unlink(wal_log *log, wal_waiter *w) { list_unlink(&log->waiters, &log->waiters_tail, w); }

/* Join a list as `me` (its watermarks set by the caller), release mu and sleep on me's own futex
 * word until someone picks it; what it was woken with (WOKEN_DONE or WOKEN_RECHECK). mu held on
 * entry, NOT on return. */
static uint32_t sleep_listed(wal_log *log, wal_waiter **head, wal_waiter **tail, wal_waiter *me) {
    me->prev = *tail;
    if (*tail) (*tail)->next = me;
    else *head = me;
    *tail = me;
    pthread_mutex_unlock(&log->mu);
    uint32_t got;
    while ((got = atomic_load_explicit(&me->woken, memory_order_acquire)) == 0)
        syscall(SYS_futex, (uint32_t *)&me->woken, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
    return got;
}

/* After any event that moves a watermark or frees a slot: wake the followers that are done
 * (watermarks met, or their write failed for lack of space), and per free slot the first
 * follower that needs it, to lead. Everyone on failure or close. mu held. With `later`, the
 * futex wakes are listed there for the caller to make after releasing mu (up to
 * WAKE_BATCH; the rest now); without, they are made now. */
static void wake_waiters(wal_log *log, wake_list *later) {
    int everyone = log->failed || log->closing;
    int need_writer = !log->write_busy, need_syncer = !log->sync_busy;
    wal_waiter *next;
    for (wal_waiter *w = log->waiters; w; w = next) {
        next = w->next;
        int wake = everyone || (log->written >= w->w_lsn && log->durable >= w->d_lsn) ||
                   write_failed_for(log, w->w_lsn);
        if (!wake && need_writer && log->written < w->w_lsn) {
            wake = 1;
            need_writer = 0;
        } else if (!wake && need_syncer && log->written >= w->w_lsn && log->durable < w->d_lsn) {
            wake = 1;
            need_syncer = 0;
        }
        if (wake) {
            int done = log->written >= w->w_lsn && log->durable >= w->d_lsn;
            _Atomic uint32_t *word = &w->woken;
            waiter_unlink(log, w);
            atomic_store_explicit(word, done ? WOKEN_DONE : WOKEN_RECHECK, memory_order_release);
            if (later && later->n < WAKE_BATCH) later->words[later->n++] = word;
            else futex_wake_one(word);
        }
    }
}

/* Sleep as a follower until wake_waiters picks this thread. mu held (released while asleep).
 * Returns 1 -- with mu NOT held -- when `may_return_unlocked` and the watermarks were
 * reached; otherwise 0 with mu held again. */
static int wait_as_follower(wal_log *log, uint64_t w_lsn, uint64_t d_lsn, int may_return_unlocked) {
    wal_waiter me = {.w_lsn = w_lsn, .d_lsn = d_lsn};
    uint32_t got = sleep_listed(log, &log->waiters, &log->waiters_tail, &me);
    if (got == WOKEN_DONE && may_return_unlocked) return 1;
    pthread_mutex_lock(&log->mu);
    return 0;
}

static void notify(wal_log *log) {
    if (log->notify_fd >= 0 && log->notify_wanted) {
        uint64_t one = 1;
        (void)!write(log->notify_fd, &one, sizeof one);
    }
}

/* A watermark moved, a slot freed or the log failed: tell everyone who may be waiting for it --
 * do_write before a roll (progress), the followers (wake_waiters), asyncio (the eventfd). mu held. */
static void progress_made(wal_log *log) {
    pthread_cond_broadcast(&log->progress);
    wake_waiters(log, NULL);
    notify(log);
}

/* progress_made at the end of an I/O slot's step, where the state is whole: the followers'
 * futex wakes are made with mu released (then taken again), so appenders queued on mu do
 * not wait for those system calls. mu held on entry and on return. */
static void progress_made_then_wake(wal_log *log) {
    wake_list wl = {.n = 0};
    pthread_cond_broadcast(&log->progress);
    wake_waiters(log, &wl);
    notify(log);
    if (wl.n) {
        pthread_mutex_unlock(&log->mu);
        wake_listed(&wl);
        pthread_mutex_lock(&log->mu);
    }
}

/* I5: record the failure once; never let anyone retry and trust. mu held. */
static void fail(wal_log *log, int neg_errno, const char *what, uint64_t segment_no) {
    if (!log->failed) {
        log->failed = code_of_errno(neg_errno);
        log->failed_errno = -neg_errno;
        snprintf(log->detail, sizeof log->detail, "%s of %s/%016llx.wal failed: %s", what, log->w.dir,
                 (unsigned long long)segment_no, strerror(-neg_errno));
    }
    pthread_cond_broadcast(&log->wake);
    pthread_cond_broadcast(&log->finished);
    pick_awaiters(log, 1, NULL);
    progress_made(log);
}

/* ---- the archive's watermark ----
 *
 * A store whose commits are acknowledged only once an object archive holds them (the
 * `replicated` level, wal/archive/shipper.py) has each committing thread wait here, right
 * after its append: first for its commit to be durable (as any `sync` waiter, leading the
 * fdatasync or following), then for the shipper to report the archive's progress, in one call
 * with the GIL released once, and one wake-up when the object that holds the commit (and every
 * object before it) is stored. The archive's waiters are a list of their own, never picked to
 * lead an I/O step; a woken waiter returns without taking mu again (WOKEN_DONE), as a follower
 * does.
 * wal_log_set_archived makes the futex wakes after mu is released. On failure, close, or once
 * the shipper stopped (fenced, closed: wal_log_stop_archived), every waiter is woken and
 * looks again under mu. Coroutines wait for the same watermark on their loop (wal/log/log.py,
 * _AsyncWaiters): both calls write the eventfd, and wal_log_archive_marks reads it. */

/* Unlink every archive waiter whose LSN the archive holds (all of them when `everyone`) and
 * mark it woken; their words go to `wl` (up to WAKE_BATCH) or are woken at once. Returns how
 * many were picked. mu held. */
static int pick_awaiters(wal_log *log, int everyone, wake_list *wl) {
    int n = 0;
    wal_waiter *next;
    for (wal_waiter *w = log->awaiters; w; w = next) {
        next = w->next;
        if (!everyone && w->d_lsn > log->archived) continue;
        list_unlink(&log->awaiters, &log->awaiters_tail, w);
        _Atomic uint32_t *word = &w->woken;
        atomic_store_explicit(word, everyone ? WOKEN_RECHECK : WOKEN_DONE, memory_order_release);
        if (wl && wl->n < WAKE_BATCH) wl->words[wl->n++] = word;
        else futex_wake_one(word);
        n++;
    }
    return n;
}

int wal_log_set_archived(wal_log *log, uint64_t lsn) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED);
    wake_list wl = {.n = 0};
    pthread_mutex_lock(&log->mu);
    int n = 0;
    if (lsn > log->archived) {
        log->archived = lsn;
        n = pick_awaiters(log, 0, &wl);
        notify(log); /* asyncio's archive waiters (wal/log/log.py, _AsyncWaiters) */
    }
    pthread_mutex_unlock(&log->mu);
    wake_listed(&wl);
    return n;
}

void wal_log_stop_archived(wal_log *log) {
    REFUSE_IN_A_FORK(log, );
    pthread_mutex_lock(&log->mu);
    log->archive_stopped = 1;
    pick_awaiters(log, 1, NULL);
    notify(log);
    pthread_mutex_unlock(&log->mu);
}

void wal_log_archive_marks(wal_log *log, uint64_t *out) {
    pthread_mutex_lock(&log->mu);
    out[0] = log->archived;
    out[1] = (uint64_t)log->archive_stopped;
    pthread_mutex_unlock(&log->mu);
}

int wal_log_settled(wal_log *log) {
    /* Without mu (the shipper asks on a committer's path, where taking it would queue behind
     * the appenders): appended and durable are stored atomically under mu, and durable is
     * read first, so a commit appended after that read makes appended > durable, not a false
     * "settled". A hint only: the answer may be stale by the time the caller acts on it. */
    uint64_t durable = __atomic_load_n(&log->durable, __ATOMIC_ACQUIRE);
    return __atomic_load_n(&log->appended, __ATOMIC_ACQUIRE) <= durable;
}

int wal_log_wait_archived(wal_log *log, uint64_t lsn) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED);
    pthread_mutex_lock(&log->mu);
    /* First durable (the `sync` wait, helping with the I/O as any waiter does): a commit
     * appended without waiting waits for both in this one call, the GIL released once. */
    int unlocked = 0;
    int rc = lsn > log->appended ? WAL_EINVAL : wait_level(log, lsn, WAL_LEVEL_SYNC, &unlocked);
    if (unlocked) pthread_mutex_lock(&log->mu);
    if (rc) {
        pthread_mutex_unlock(&log->mu);
        return rc;
    }
    for (;;) {
        if (log->archived >= lsn) break;
        if (lsn > log->appended) { rc = WAL_EINVAL; break; }
        if (log->failed) { rc = WAL_EFAILED; break; }
        if (log->closing || log->closed) { rc = WAL_ECLOSED; break; }
        if (log->archive_stopped) { rc = WAL_EAGAIN; break; }
        wal_waiter me = {.d_lsn = lsn};
        if (sleep_listed(log, &log->awaiters, &log->awaiters_tail, &me) == WOKEN_DONE)
            return 0; /* the archive holds lsn: no need to take mu again */
        pthread_mutex_lock(&log->mu);
    }
    pthread_mutex_unlock(&log->mu);
    return rc;
}

/* ---- durable-lag clock ---- */

static void mark_enqueue(wal_log *log, uint64_t first_lsn, uint64_t t) {
    size_t n = log->mark_tail - log->mark_head;
    if (n && t - log->marks[(log->mark_tail - 1) % MARK_RING].ns < MARK_SPACING_NS) return;
    if (n == MARK_RING) return; /* full: later records inherit an older time -- conservative */
    log->marks[log->mark_tail % MARK_RING] = (lag_mark){first_lsn, t};
    log->mark_tail++;
}

/* Enqueue time (a lower bound) of the oldest record not yet durable; 0 if none. */
static uint64_t oldest_unsynced_ns(wal_log *log) {
    if (log->durable >= log->appended) return 0;
    /* Drop marks wholly durable: mark k covers [k.lsn, (k+1).lsn). */
    while (log->mark_tail - log->mark_head >= 2 &&
           log->marks[(log->mark_head + 1) % MARK_RING].lsn <= log->durable + 1)
        log->mark_head++;
    if (log->mark_tail == log->mark_head) return 0;
    return log->marks[log->mark_head % MARK_RING].ns;
}

/* What a write may fail with and be made again later (do_write). */
static int retryable_write_errno(int e) { return e == ENOSPC || e == EDQUOT || e == EMFILE || e == ENFILE; }

/* The write of `lsn` failed for lack of space and has not been redone yet. mu held. */
static int write_failed_for(wal_log *log, uint64_t lsn) {
    return log->written < lsn && log->write_failed_through >= lsn;
}

/* write_failed_for, counting only a write begun after `since` (a write_attempts value read
 * when the caller began to wait): an earlier failure may be stale -- space may have come
 * back since, and nothing retries a write until someone needs one -- so a waiter makes (or
 * waits for) a write of its own before it reports WAL_ENOSPC. */
static int write_failed_since(wal_log *log, uint64_t lsn, uint64_t since) {
    return write_failed_for(log, lsn) && log->write_failed_attempt > since;
}

/* Wait until every record of b placed open is finished, or the log failed (b is the batch a
 * writer took, log->finishing). mu held, released meanwhile. A finisher is a committing thread
 * that is encrypting right now, a few microseconds of AES: the writer first spins on the count
 * for up to FINISH_SPIN_NS with mu released, and sleeps only if that was not enough (the
 * finisher was preempted). Sleeping at once put a context switch in one write of four among 64
 * threads at `sync` and cost ~6% of the commits/s of a sealed store. */
static void await_finished(wal_log *log, wal_batch *b) {
    pthread_mutex_unlock(&log->mu);
    uint64_t spin_until = now_ns() + FINISH_SPIN_NS;
    for (unsigned i = 1; __atomic_load_n(&b->unfilled, __ATOMIC_ACQUIRE); i++) {
        cpu_relax();
        if (i % 64 == 0 && now_ns() > spin_until) break;
    }
    pthread_mutex_lock(&log->mu);
    while (b->unfilled && !log->failed) pthread_cond_wait(&log->finished, &log->mu);
}

/* ---- the two I/O slots; each called with mu held, returns with mu held ---- */

static void do_write(wal_log *log) {
    wal_batch b = log->pending;
    uint64_t shift = log->pending_shift;
    log->pending = log->spare;
    wal_batch_reset(&log->pending);
    log->pending_no++;
    log->pending_shift = 0;
    int with_sync_slot = b.rolls > 0; /* a roll closes the fd the sync slot uses */
    log->write_busy = 1;
    if (b.unfilled) { /* records finished later: each a few microseconds away (see there) */
        log->finishing = &b;
        log->finishing_no = log->pending_no - 1;
        log->finishing_shift = shift;
        await_finished(log, &b);
        log->finishing = NULL;
        if (log->failed) { /* a record that could not be finished failed the log: write nothing */
            log->write_busy = 0;
            log->spare = b;
            wal_batch_reset(&log->spare);
            progress_made_then_wake(log);
            return;
        }
    }
    while (with_sync_slot && log->sync_busy) pthread_cond_wait(&log->progress, &log->mu);
    if (with_sync_slot) log->sync_busy = 1;
    uint64_t attempt = ++log->write_attempts;
    uint64_t write_from = log->drop_next_from;
    pthread_mutex_unlock(&log->mu);

    uint64_t synced = 0;
    int rc = wal_writer_write(&log->w, &b, &synced);

    pthread_mutex_lock(&log->mu);
    uint64_t failed_last = b.last_lsn; /* before the concat below moves it */
    /* No space, or no descriptor for a roll's new segment: keep the batch (rolls included:
     * wal_writer_write is idempotent) and write it again later. Never after a failed fdatasync
     * (I5). EMFILE/ENFILE can only come from an open() -- the new segment's, or its
     * directory's for the fsync that makes its name durable -- and a failed open did no I/O:
     * nothing the kernel might have dropped, so a retry proves as much as a first try. */
    if (rc && !log->w.sync_failed && retryable_write_errno(-rc) && failed_last &&
        wal_batch_concat(&b, &log->pending) == 0) {
        log->pending_shift += b.len - log->pending.len; /* pending's unfinished records moved by that much */
        log->write_failed_through = failed_last;
        log->write_failed_errno = -rc;
        log->write_failed_attempt = attempt;
        wal_batch tmp = log->pending;
        log->pending = b; /* the failed bytes first, then what queued up meanwhile */
        b = tmp;
        log->n_write_errors++;
        snprintf(log->detail, sizeof log->detail, "write of %s/%016llx.wal failed: %s; the commit was not "
                 "acknowledged and is rewritten when %s", log->w.dir, (unsigned long long)log->w.fd_segno,
                 strerror(-rc), rc == -EMFILE || rc == -ENFILE ? "a file descriptor is free" : "space returns");
    } else if (rc) {
        fail(log, rc, "write", log->w.fd_segno);
    } else {
        if (b.last_lsn) __atomic_store_n(&log->written, b.last_lsn, __ATOMIC_RELEASE); /* read unlocked: wait_try */
        if (synced > log->durable) __atomic_store_n(&log->durable, synced, __ATOMIC_RELEASE); /* read unlocked: settled */
        if (b.rolls) log->drop_from = log->streak_from = write_from = 0; /* the sealed segment was dropped whole */
        wal_writer_drop_range(&log->w, &log->drop_next_from, &log->drop_to);
        log->write_from = write_from;
        log->last_writer = pthread_self();
        log->n_writes++;
        log->bytes_written += b.len;
    }
    log->write_busy = 0;
    if (with_sync_slot) log->sync_busy = 0;
    log->spare = b;
    wal_batch_reset(&log->spare);
    progress_made_then_wake(log);
}

static void do_sync(wal_log *log) {
    uint64_t target = log->written;
    uint64_t before = log->durable;
    uint64_t oldest = log->level != WAL_LEVEL_SYNC ? oldest_unsynced_ns(log) : 0;
    int fd = log->w.fd;
    uint64_t segno = log->w.fd_segno;
    /* Synced pages are dropped (writer.c "Whole pages") only in a stream of lone commits:
     * LONE_STREAK fdatasyncs in a row with no follower waiting, no write running, and the
     * last write by this thread, begun on the page the fdatasync before left as the tail (a
     * heuristic for "one write since": several small ones within a page pass too), so the
     * pages it dirtied sit in this CPU's lists. Measured (docs/performance.md, "Whole pages"): one thread gains 10-20%; drops after
     * a group's fdatasync cost more than they gained (8 threads, 4 KiB: -14%; 64 threads
     * through the store, dropping at its lone fdatasyncs only: -6%): a drop delays the
     * followers' wake-up, and pages another CPU wrote make the kernel drain every CPU's page
     * lists first. Pages not dropped stay cached, as any file's. A drop takes the pages the
     * streak wrote (from streak_from), at most DROP_WINDOW_BYTES. No roll runs while the sync
     * slot is held, so the offsets name pages of fd. */
    int lone = !log->waiters && !log->write_busy && pthread_equal(log->last_writer, pthread_self()) &&
               log->write_from == log->drop_from;
    if (!lone) log->lone_streak = 0;
    else if (log->lone_streak++ == 0) log->streak_from = log->drop_from;
    uint64_t drop_from = log->streak_from, drop_next_from = log->drop_next_from;
    uint64_t drop_to = log->lone_streak >= LONE_STREAK ? log->drop_to : 0;
    if (drop_to > drop_from + DROP_WINDOW_BYTES) drop_from = drop_to - DROP_WINDOW_BYTES;
    log->sync_busy = 1;
    pthread_mutex_unlock(&log->mu);

    uint64_t t0 = now_ns();
    int rc = wal_io_fdatasync(fd);
    uint64_t dt = now_ns() - t0;
    if (rc == 0) wal_writer_drop_synced(&log->w, fd, drop_from, drop_to);

    pthread_mutex_lock(&log->mu);
    log->sync_busy = 0;
    if (rc) {
        fail(log, rc, "fdatasync", segno);
        return;
    }
    log->drop_from = drop_next_from;
    if (drop_to > drop_from) log->streak_from = drop_next_from;
    if (target > log->durable) {
        uint64_t group = target - (before > log->durable ? before : log->durable);
        __atomic_store_n(&log->durable, target, __ATOMIC_RELEASE); /* read unlocked: wal_log_settled */
        log->synced_records += group;
        if (group > log->group_max) log->group_max = group;
    }
    log->n_fsyncs++;
    log->fsync_ns_total += dt;
    if (dt > log->fsync_ns_max) log->fsync_ns_max = dt;
    log->lat[log->lat_n++ % LAT_RING] = dt;
    if (oldest && now_ns() - oldest > log->rpo_ns) log->rpo_overruns++;
    progress_made_then_wake(log);
}

/* Make one step of progress towards written >= w_lsn and durable >= d_lsn
 * (d_lsn <= w_lsn), or wait for someone else's step. mu held.
 * Before an fdatasync the leader folds in the commits that queued up while the
 * previous one ran (one write, so a steady stream cannot postpone the sync):
 * otherwise they would wait a whole extra fdatasync, and groups would shrink.
 * Returns 1 -- mu released -- only when `may_return_unlocked` and, as a follower, it was
 * woken with its watermarks reached; otherwise 0, mu held. */
static int progress_step(wal_log *log, uint64_t w_lsn, uint64_t d_lsn, int may_return_unlocked) {
    if (log->failed) return 0; /* I5: no I/O after a failure; callers check failed */
    if (log->written < w_lsn) {
        if (!log->write_busy && log->pending.len) {
            do_write(log);
            return 0;
        }
    } else if (log->durable < d_lsn && !log->sync_busy) {
        if (log->pending.len && !log->write_busy) {
            do_write(log);
            if (log->failed || log->sync_busy || log->durable >= d_lsn) return 0;
        }
        do_sync(log);
        return 0;
    }
    return wait_as_follower(log, w_lsn, d_lsn, may_return_unlocked);
}

/* ---- appending ---- */

static int level_ok(wal_log *log, int level) { return level >= WAL_LEVEL_SYNC && level <= WAL_LEVEL_BUFFERED && level <= log->level; }

/* Back-pressure for weaker levels: hold new acknowledgements while the window
 * is at risk or the batch is full. Returns 0, or WAL_EAGAIN when !wait. mu held.
 * *now: the monotonic time if it was read here (else 0), so the append reads the
 * clock once (a clock read is ~25 ns on these VMs, a fair share of an append). */
static int admit(wal_log *log, size_t bytes, int wait, uint64_t *now) {
    uint64_t t_start = 0;
    for (;;) {
        *now = 0; /* a time read before a wait below is stale after it */
        if (log->failed) return WAL_EFAILED;
        if (log->closing) return WAL_ECLOSED;
        int full = log->pending.len && log->pending.len + bytes > log->max_pending;
        int late = 0;
        if (log->level != WAL_LEVEL_SYNC) {
            uint64_t oldest = oldest_unsynced_ns(log);
            if (oldest) *now = now_ns();
            /* A write refused for lack of space (not redone yet: its batch's last LSN is past
             * what is written; commits appended while it ran are past that batch) holds records
             * acknowledged already: nothing more is acknowledged into memory the disk refused
             * until a write goes through (made below), or they would wait there past rpo_ms too. */
            late = (oldest && *now - oldest > log->rpo_ns / 4 * 3) || log->written < log->write_failed_through;
        }
        if (!full && !late) break;
        if (!wait) return WAL_EAGAIN;
        if (!t_start) {
            t_start = now_ns();
            log->bp_waits++;
        }
        if (full) progress_step(log, log->appended, 0, 0);
        else progress_step(log, log->appended, log->appended, 0);
        if (log->written < log->write_failed_through) return WAL_ENOSPC; /* the disk is full: say so */
    }
    if (t_start) log->bp_ns += now_ns() - t_start;
    return 0;
}

/* Where a waiting (sync or interval) `level` stands for `lsn`: 0 held, WAL_EFAILED or
 * WAL_ENOSPC it will not be (for now), WAL_EAGAIN not yet. mu held. */
static int level_status(wal_log *log, uint64_t lsn, int level) {
    if (log->written >= lsn && (level != WAL_LEVEL_SYNC || log->durable >= lsn)) return 0;
    if (log->failed) return WAL_EFAILED;
    if (write_failed_for(log, lsn)) return WAL_ENOSPC;
    return WAL_EAGAIN;
}

/* Wait, helping with the I/O, until `level` holds for `lsn`. mu held on entry; on return
 * too, unless *unlocked was set to 1 (woken as a follower with the level reached: 0 is
 * returned and mu is not taken again just to be released). */
static int wait_level(wal_log *log, uint64_t lsn, int level, int *unlocked) {
    if (level == WAL_LEVEL_BUFFERED) return 0;
    uint64_t d = level == WAL_LEVEL_SYNC ? lsn : 0, since = log->write_attempts;
    int rc;
    while ((rc = level_status(log, lsn, level)) == WAL_EAGAIN ||
           (rc == WAL_ENOSPC && !write_failed_since(log, lsn, since))) {
        if (progress_step(log, lsn, d, 1)) {
            *unlocked = 1;
            return 0;
        }
    }
    return rc;
}

/* The callers of wal_log_wait_try and of a WAL_WAIT_TRY append may hold something other
 * threads wait for (the GIL, native/logcall.h), so a write made there must be quick. One that
 * took longer than TRY_WRITE_SLOW_NS (the kernel throttling writers: a buffered write on ext4
 * cannot be asked not to wait, RWF_NOWAIT is refused) stops such writes for a hundred times as
 * long, at least TRY_WRITE_PAUSE_NS: the writes go to threads that wait with nothing held, and
 * the stalls such a caller causes stay under about 1% of the time. */
#define TRY_WRITE_SLOW_NS 1000000ull
#define TRY_WRITE_PAUSE_NS 1000000000ull

/* The write of the pending batch in the calling thread, made at once or not at all: when
 * `lsn` is not written yet, the write slot is free, no segment roll is due (that waits for the
 * sync slot and creates a file) and no slow write paused such writes. `now`: the monotonic
 * time if the caller read it a moment ago (the append's admit did), else 0; timing the write
 * from there adds the record's placement, a fraction of a microsecond, to a 1 ms threshold,
 * and saves a clock read per commit. mu held. */
static void try_write_now(wal_log *log, uint64_t lsn, uint64_t now) {
    if (log->failed || log->written >= lsn || log->write_busy || !log->pending.len || log->pending.rolls != 0 ||
        log->pending.unfilled)
        return;
    uint64_t t0 = now ? now : now_ns();
    if (log->try_write_resume_ns && t0 < log->try_write_resume_ns) return;
    do_write(log);
    uint64_t t1 = now_ns(), took = t1 - t0;
    log->try_write_resume_ns = 0;
    if (took > TRY_WRITE_SLOW_NS)
        log->try_write_resume_ns = t1 + (took * 100 > TRY_WRITE_PAUSE_NS ? took * 100 : TRY_WRITE_PAUSE_NS);
}

/* Account an append and wait as `wait` says. mu held on entry; released on return. */
static int64_t finish(wal_log *log, uint64_t first, uint64_t last, int level, int wait, uint64_t now) {
    if (!now) now = now_ns();
    mark_enqueue(log, first, now);
    log->n_appends++;
    log->n_commits += last - first + 1;
    if (wait == WAL_WAIT_NONE) {
        if (level == WAL_LEVEL_SYNC && last > log->want_durable) log->want_durable = last;
        if (level <= WAL_LEVEL_INTERVAL && last > log->want_written) log->want_written = last;
        pthread_cond_signal(&log->wake);
        pthread_mutex_unlock(&log->mu);
        return (int64_t)last;
    }
    if (level == WAL_LEVEL_BUFFERED && log->pending.len >= log->max_pending / 2) pthread_cond_signal(&log->wake);
    /* The RPO clock starts now: an idle flusher has no deadline to wake at, so give it one. */
    else if (log->flusher_idle && level != WAL_LEVEL_SYNC) pthread_cond_signal(&log->wake);
    if (wait == WAL_WAIT_LATER || wait == WAL_WAIT_TRY) {
        /* The caller's wal_log_wait_try would make this write next: made in this hold of mu,
         * it then finds the level reached without taking mu again. */
        if (wait == WAL_WAIT_TRY && level == WAL_LEVEL_INTERVAL) try_write_now(log, last, now);
        pthread_mutex_unlock(&log->mu);
        return (int64_t)last;
    }
    int unlocked = 0;
    int rc = wait_level(log, last, level, &unlocked);
    if (!unlocked) pthread_mutex_unlock(&log->mu);
    return rc ? rc : (int64_t)last;
}

int wal_log_wait(wal_log *log, uint64_t lsn, int level) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED);
    if (level < WAL_LEVEL_SYNC || level > WAL_LEVEL_BUFFERED) return WAL_EINVAL;
    pthread_mutex_lock(&log->mu);
    int unlocked = 0;
    int rc = lsn > log->appended ? WAL_EINVAL : wait_level(log, lsn, level, &unlocked);
    if (!unlocked) pthread_mutex_unlock(&log->mu);
    return rc;
}

int wal_log_wait_admitted(wal_log *log, size_t len) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED);
    if (len > WAL_MAX_PAYLOAD) return WAL_ETOOBIG;
    pthread_mutex_lock(&log->mu);
    uint64_t now;
    int rc = admit(log, wal_record_size((uint32_t)len), 1, &now);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

int wal_log_wait_try(wal_log *log, uint64_t lsn, int level) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED);
    if (level < WAL_LEVEL_SYNC || level > WAL_LEVEL_BUFFERED) return WAL_EINVAL;
    /* The common answer at interval, without mu: the append (WAL_WAIT_TRY) made the write.
     * written <= appended, so an LSN it covers was appended: no WAL_EINVAL is missed. */
    if (level == WAL_LEVEL_INTERVAL && lsn && __atomic_load_n(&log->written, __ATOMIC_ACQUIRE) >= lsn) return 0;
    pthread_mutex_lock(&log->mu);
    int rc;
    if (lsn > log->appended) {
        rc = WAL_EINVAL;
    } else if (level == WAL_LEVEL_BUFFERED) {
        rc = 0;
    } else {
        try_write_now(log, lsn, 0);
        rc = level_status(log, lsn, level);
    }
    pthread_mutex_unlock(&log->mu);
    return rc;
}

/* Append n payloads (checked by the caller) at the next LSNs and account them as `wait` says;
 * with `open_rec` (n == 1) the record is placed open (wal_log_append_unfinished). */
static int64_t append_records(wal_log *log, const char *data, const uint32_t *lens, size_t n, int level, int wait,
                              wal_unfinished *open_rec) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += wal_record_size(lens[i]);
    pthread_mutex_lock(&log->mu);
    uint64_t now = 0;
    int rc = admit(log, total, wait == WAL_WAIT_LEVEL || wait == WAL_WAIT_LATER, &now);
    if (rc) {
        pthread_mutex_unlock(&log->mu);
        return rc;
    }
    if (log->next_lsn + n - 1 > WAL_MAX_NUMBER) { /* LSNs must fit the int64 this API returns */
        pthread_mutex_unlock(&log->mu);
        return WAL_EINVAL;
    }
    uint64_t first = log->next_lsn;
    const uint8_t *p = (const uint8_t *)data;
    if (log->pending.len == 0) {
        int mrc = wal_writer_mark(&log->w, &log->pending, log->durable);
        if (mrc) {
            fail(log, mrc, "buffering a mark", log->w.p_segno);
            pthread_mutex_unlock(&log->mu);
            return WAL_EFAILED;
        }
    }
    for (size_t i = 0; i < n; i++) {
        size_t at = 0;
        int prc = wal_writer_place(&log->w, &log->pending, p, lens[i], log->next_lsn, open_rec ? &at : NULL);
        if (prc) {
            /* Only ENOMEM gets here; records already placed cannot be taken
             * back from the batch, so the log must stop. */
            fail(log, prc, "buffering a record", log->w.p_segno);
            pthread_mutex_unlock(&log->mu);
            return WAL_EFAILED;
        }
        if (open_rec) {
            open_rec->batch = log->pending_no;
            open_rec->at = at - log->pending_shift; /* as if the batch began with pending's own bytes */
            open_rec->len = lens[i];
        }
        p += lens[i];
        log->next_lsn++;
    }
    __atomic_store_n(&log->appended, log->next_lsn - 1, __ATOMIC_RELEASE); /* read unlocked: wal_log_settled */
    return finish(log, first, log->appended, level, wait, now);
}

int64_t wal_log_append_many(wal_log *log, const char *data, const uint32_t *lens, size_t n, int level,
                            int wait) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED);
    if (!level_ok(log, level) || n == 0 || wait < WAL_WAIT_NONE || wait > WAL_WAIT_TRY) return WAL_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (lens[i] > WAL_MAX_PAYLOAD) return WAL_ETOOBIG;
    return append_records(log, data, lens, n, level, wait, NULL);
}

/* ---- Records finished later ----
 *
 * A sealed store's commit encrypts its value (native/storecore.c, "The sealed put"). Done with
 * the GIL held, the AES of a 4 KiB value delayed every other committing thread by its few
 * microseconds (~13% of the commits/s of 64 threads at `sync`); done with the GIL handed over
 * and taken back, it cost more in context switches. So the commit appends its record with the
 * ciphertext still to come -- the LSN, the place in the batch and the nonce are all decided,
 * with the GIL held -- and encrypts once it has let the GIL go to wait for its fdatasync
 * anyway, then hands the bytes over here.
 *
 * Contracts. A record placed open has no CRC yet and is counted in its batch's `unfilled`; no
 * batch with such a record is written: do_write, having taken the pending batch, waits for its
 * records to be finished (`finished`), and try_write_now -- whose caller may hold the GIL --
 * never takes such a batch. wal_log_finish copies the bytes in and computes the CRC under mu,
 * so the record is complete before any writer can see its batch as finished. The finisher
 * needs nothing but mu, and holds nothing anyone waits for while it encrypts, so a writer's
 * wait ends. A record cannot be finished only if the encryption itself fails (never seen):
 * the log then fails (I5) and writes nothing more, so the record never reaches the disk with
 * the bytes it was placed with. Readers see a commit once its level holds (the store uses
 * this at `sync` only, where that is once durable), and it cannot be written unfinished; the
 * store's reads of the newest value, acknowledged or not, wait for the value to be written
 * (native/storecore.c, core_overlay_newest). */

int64_t wal_log_append_unfinished(wal_log *log, const char *data, size_t len, size_t fill_from, int level,
                                  wal_unfinished *out) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED);
    /* Not at `buffered`, which acknowledges a commit at its append: before it is finished. */
    if (!level_ok(log, level) || level == WAL_LEVEL_BUFFERED || fill_from > len || out == NULL) return WAL_EINVAL;
    if (len > WAL_MAX_PAYLOAD) return WAL_ETOOBIG;
    uint32_t l = (uint32_t)len;
    out->fill_from = (uint32_t)fill_from;
    return append_records(log, data, &l, 1, level, WAL_WAIT_TRY, out);
}

int wal_log_finish(wal_log *log, const wal_unfinished *rec, const char *bytes, int ok) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED);
    pthread_mutex_lock(&log->mu);
    wal_batch *b = NULL;
    uint64_t at = rec->at;
    if (rec->batch == log->pending_no) {
        b = &log->pending;
        at += log->pending_shift;
    } else if (log->finishing && rec->batch == log->finishing_no) {
        b = log->finishing;
        at += log->finishing_shift;
    }
    int rc = 0;
    if (log->failed) {
        /* Nothing more is written (I5): a writer that held this record's batch may have let it
         * go already, so there may be nothing to finish. */
        rc = WAL_EFAILED;
    } else if (b == NULL || !b->unfilled || rec->len > WAL_MAX_PAYLOAD || rec->fill_from > rec->len ||
               at > b->len || wal_record_size(rec->len) > b->len - at ||
               wal_get_u32(b->bytes + at + WAL_RH_LENGTH) != rec->len || wal_get_u32(b->bytes + at + WAL_RH_CRC) != 0) {
        /* Not a record this log holds open (a closed one's CRC is 0 once in 2^32 times). The
         * caller broke the contract, and a record of its that is open would hold every write
         * back for good: the log stops instead. */
        fail(log, -EINVAL, "finishing a record that is not open", log->w.p_segno);
        rc = WAL_EINVAL;
    } else if (!ok) {
        fail(log, -EIO, "sealing a record", log->w.p_segno);
        rc = WAL_EFAILED;
    } else {
        uint8_t *r = b->bytes + at;
        memcpy(r + WAL_RECORD_HEADER_SIZE + rec->fill_from, bytes, rec->len - rec->fill_from);
        wal_record_close(r);
        log->n_finished_later++;
        __atomic_store_n(&b->unfilled, b->unfilled - 1, __ATOMIC_RELEASE); /* read unlocked: do_write's spin */
        if (b->unfilled == 0 && b == log->finishing) pthread_cond_broadcast(&log->finished);
    }
    pthread_mutex_unlock(&log->mu);
    return rc;
}

int64_t wal_log_append(wal_log *log, const char *data, size_t len, int level, int wait) {
    if (len > WAL_MAX_PAYLOAD) return WAL_ETOOBIG;
    uint32_t l = (uint32_t)len;
    return wal_log_append_many(log, data, &l, 1, level, wait);
}

int wal_log_sync(wal_log *log) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED);
    pthread_mutex_lock(&log->mu);
    uint64_t target = log->appended, since = log->write_attempts;
    int rc = 0;
    while (log->durable < target) {
        if (log->failed) { rc = WAL_EFAILED; break; }
        if (write_failed_since(log, target, since)) { rc = WAL_ENOSPC; break; }
        progress_step(log, target, target, 0);
    }
    if (!rc && log->closed) rc = WAL_ECLOSED;
    pthread_mutex_unlock(&log->mu);
    return rc;
}

/* ---- the flusher ---- */

static void *flusher_main(void *arg) {
    wal_log *log = arg;
    pthread_mutex_lock(&log->mu);
    for (;;) {
        if (log->failed || log->closed) break;
        uint64_t t = now_ns();
        uint64_t oldest = oldest_unsynced_ns(log);
        int rpo_due = log->level != WAL_LEVEL_SYNC && oldest && t - oldest >= log->rpo_ns / 2;
        uint64_t d = log->want_durable, w = log->want_written;
        if (rpo_due) d = log->appended;
        if (log->level == WAL_LEVEL_BUFFERED && log->pending.len >= log->max_pending / 2) w = log->appended;
        if (w < d) w = d;
        if (d > log->durable || w > log->written) {
            progress_step(log, w, d, 0);
            if (log->written < log->write_failed_through) { /* no space: retry in 10 ms, not in a spin */
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                uint64_t abs = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + 10000000ull;
                ts.tv_sec = (time_t)(abs / 1000000000ull);
                ts.tv_nsec = (long)(abs % 1000000000ull);
                pthread_cond_timedwait(&log->wake, &log->mu, &ts);
            }
            continue;
        }
        if (log->closing) break;
        if (log->level != WAL_LEVEL_SYNC && oldest) {
            uint64_t due = oldest + log->rpo_ns / 2;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t wait_ns = due > t ? due - t : 0;
            uint64_t abs = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + wait_ns;
            ts.tv_sec = (time_t)(abs / 1000000000ull);
            ts.tv_nsec = (long)(abs % 1000000000ull);
            pthread_cond_timedwait(&log->wake, &log->mu, &ts);
        } else {
            log->flusher_idle = 1;
            pthread_cond_wait(&log->wake, &log->mu);
            log->flusher_idle = 0;
        }
    }
    pthread_mutex_unlock(&log->mu);
    return NULL;
}

/* ---- lifecycle ---- */

int wal_log_open(const char *dir, const wal_log_config *cfg, wal_log **out) {
    if (!cfg || cfg->level < WAL_LEVEL_SYNC || cfg->level > WAL_LEVEL_BUFFERED || cfg->segment_bytes < 4096 ||
        (cfg->level != WAL_LEVEL_SYNC && cfg->rpo_ms == 0) || cfg->next_lsn == 0 || cfg->segment_no == 0)
        return WAL_EINVAL;
    wal_log *log = calloc(1, sizeof *log);
    if (!log) return WAL_ENOMEM;
    log->epoch = forkwatch_epoch();
    log->marks = calloc(MARK_RING, sizeof *log->marks);
    if (!log->marks) {
        free(log);
        return WAL_ENOMEM;
    }
    log->notify_fd = -1;
    int rc = wal_writer_init(&log->w, dir, cfg);
    if (rc) {
        int code = code_of_errno(rc);
        wal_writer_close(&log->w);
        free(log->marks);
        free(log);
        errno = -rc;
        return code;
    }
    pthread_mutex_init(&log->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&log->progress, &ca);
    pthread_cond_init(&log->wake, &ca);
    pthread_cond_init(&log->finished, &ca);
    pthread_condattr_destroy(&ca);
    log->level = cfg->level;
    log->rpo_ns = (uint64_t)cfg->rpo_ms * 1000000ull;
    log->max_pending = cfg->max_pending_bytes ? cfg->max_pending_bytes : 4u << 20;
    log->next_lsn = cfg->next_lsn;
    log->appended = log->written = log->durable = cfg->next_lsn - 1;
    log->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pthread_create(&log->flusher, NULL, flusher_main, log) == 0) log->flusher_started = 1;
    else {
        wal_log_close(log);
        wal_log_free(log);
        return WAL_ENOMEM;
    }
    *out = log;
    return WAL_OK;
}

int wal_log_close(wal_log *log) {
    REFUSE_IN_A_FORK(log, WAL_EFORKED); /* the parent's to close; its flusher is not in the child either */
    pthread_mutex_lock(&log->mu);
    if (log->closed) {
        pthread_mutex_unlock(&log->mu);
        return WAL_OK;
    }
    log->closing = 1;
    pthread_cond_broadcast(&log->progress);
    wake_waiters(log, NULL);
    pick_awaiters(log, 1, NULL);
    /* Everything acknowledged becomes durable before close returns. */
    while (!log->failed && (log->durable < log->appended || log->write_busy || log->sync_busy)) {
        progress_step(log, log->appended, log->appended, 0);
        if (write_failed_for(log, log->appended)) /* still no space: what is left cannot be kept */
            fail(log, -(log->write_failed_errno ? log->write_failed_errno : ENOSPC), "write at close",
                 log->w.fd_segno);
    }
    int rc = log->failed ? WAL_EFAILED : WAL_OK;
    log->closed = 1;
    pthread_cond_broadcast(&log->wake);
    pthread_cond_broadcast(&log->progress);
    wake_waiters(log, NULL);
    pthread_mutex_unlock(&log->mu);
    if (log->flusher_started) pthread_join(log->flusher, NULL);
    log->flusher_started = 0;
    pthread_mutex_lock(&log->mu);
    wal_writer_close(&log->w);
    notify(log);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

void wal_log_free(wal_log *log) {
    if (!log) return;
    if (!log->closed && log->epoch == forkwatch_now()) wal_log_close(log);
    if (log->notify_fd >= 0) close(log->notify_fd);
    wal_batch_free(&log->pending);
    wal_batch_free(&log->spare);
    free(log->marks);
    pthread_cond_destroy(&log->progress);
    pthread_cond_destroy(&log->wake);
    pthread_cond_destroy(&log->finished);
    pthread_mutex_destroy(&log->mu);
    free(log);
}

void wal_log_get_stats(wal_log *log, wal_log_stats *s) {
    pthread_mutex_lock(&log->mu);
    memset(s, 0, sizeof *s);
    s->commits = log->n_commits;
    s->appends = log->n_appends;
    s->writes = log->n_writes;
    s->mapped_writes = __atomic_load_n(&log->w.mapped_writes, __ATOMIC_RELAXED);
    s->finished_later = log->n_finished_later;
    s->fsyncs = log->n_fsyncs;
    s->bytes_written = log->bytes_written;
    s->synced_records = log->synced_records;
    s->group_max = log->group_max;
    s->fsync_ns_total = log->fsync_ns_total;
    s->fsync_ns_max = log->fsync_ns_max;
    s->backpressure_waits = log->bp_waits;
    s->backpressure_ns = log->bp_ns;
    s->rpo_overruns = log->rpo_overruns;
    s->write_errors = log->n_write_errors;
    s->segments_created = log->w.segments_created;
    uint64_t oldest = oldest_unsynced_ns(log);
    s->lag_ns = oldest ? (int64_t)(now_ns() - oldest) : 0;
    s->appended_lsn = log->appended;
    s->written_lsn = log->written;
    s->durable_lsn = log->durable;
    s->segment_no = log->w.p_segno;
    s->segment_offset = log->w.p_offset;
    s->pending_bytes = log->pending.len;
    s->failed = log->failed;
    s->failed_errno = log->failed_errno;
    s->closed = log->closed;
    pthread_mutex_unlock(&log->mu);
}

static int read_watermarks(wal_log *log, uint64_t *out, int archived) {
    pthread_mutex_lock(&log->mu);
    out[0] = log->appended;
    out[1] = log->written;
    out[2] = archived && log->archived < log->durable ? log->archived : log->durable;
    int failed = log->failed ? log->failed : (log->closed ? WAL_ECLOSED : 0);
    pthread_mutex_unlock(&log->mu);
    return failed;
}

int wal_log_watermarks(wal_log *log, uint64_t *out) { return read_watermarks(log, out, 0); }

int wal_log_watermarks_archived(wal_log *log, uint64_t *out) { return read_watermarks(log, out, 1); }

uint64_t wal_log_write_failed_through(wal_log *log) {
    pthread_mutex_lock(&log->mu);
    uint64_t v = log->write_failed_through > log->written ? log->write_failed_through : 0;
    pthread_mutex_unlock(&log->mu);
    return v;
}

int wal_log_write_failed_errno(wal_log *log) {
    pthread_mutex_lock(&log->mu);
    int v = log->write_failed_through > log->written ? log->write_failed_errno : 0;
    pthread_mutex_unlock(&log->mu);
    return v;
}

size_t wal_log_fsync_latencies(wal_log *log, uint64_t *out, size_t cap) {
    pthread_mutex_lock(&log->mu);
    size_t n = log->lat_n < LAT_RING ? (size_t)log->lat_n : LAT_RING;
    if (n > cap) n = cap;
    memcpy(out, log->lat, n * sizeof *out);
    pthread_mutex_unlock(&log->mu);
    return n;
}

const char *wal_log_error_detail(wal_log *log) { return log->detail; }

int wal_log_notify_fd(wal_log *log) {
    pthread_mutex_lock(&log->mu);
    if (!log->notify_wanted) {
        log->notify_wanted = 1; /* from now on every event writes the eventfd */
        /* ...and one now: events before this call wrote nothing, so the new reader
         * must look at the watermarks once rather than wait for the next event. */
        notify(log);
    }
    pthread_mutex_unlock(&log->mu);
    return log->notify_fd;
}
