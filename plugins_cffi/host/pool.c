/* The host kernels' worker pool: fl_par_for (fl_host.h).
 *
 * Why not an OpenMP parallel region: a region ends in a barrier that waits for every thread of the
 * team, including one the OS has not scheduled yet. On a loaded machine (2 cores, another process
 * busy on the second) that wait is a scheduler time slice, 4-8 ms, for a kernel that takes 5 us on
 * one thread; measured for the plugin's kernels and for native PyTorch's alike (docs/benchmarks.md,
 * "Host plugin: cost per kernel"). Here the calling thread works from the start: the range is cut
 * into chunks that the caller and the pool's workers claim one at a time from one atomic ticket, and
 * the caller waits only for chunks a worker has claimed. A worker that wakes late finds no chunk left
 * and goes back to waiting; at worst the caller runs every chunk itself, as a serial kernel would.
 *
 * The workers are started once, at the first parallel call of the process (again after a fork, in the
 * child), and stay: no thread start-up per kernel. Between jobs a worker spins for SPIN_NS (a training
 * step's kernels come a few microseconds apart), then sleeps on a condition variable; the caller
 * signals it only when one sleeps. One caller at a time: a second thread that calls while a job runs
 * (or a call from inside a worker or an OpenMP region) runs its range inline. The team size follows
 * omp_get_max_threads() of the calling thread (torch.set_num_threads sets it: torch and the plugins
 * share one OpenMP runtime), so one thread means no pool at all. */
#define _GNU_SOURCE
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "fl_host.h"

#define POOL_MAX 64      /* workers at most (the caller is one more) */
#define SPIN_NS 50000    /* a worker's busy wait for the next job before it sleeps */
#define CHUNKS_MAX 1024  /* chunks of one job: they fit the ticket's 20-bit fields */
#define YIELD_NS 20000   /* the caller's busy wait on a claimed chunk before it yields its core */

/* ticket: generation (24 bits) | first unclaimed chunk (20) | one past the last unclaimed chunk (20). The
 * caller claims from the front, the workers from the back: with a worker that keeps up, each thread gets
 * the same part of the range on every call (the cache locality of a static schedule) */
#define T_GEN(t) ((t) >> 40)
#define T_LO(t) (((t) >> 20) & 0xFFFFF)
#define T_HI(t) ((t) & 0xFFFFF)

static struct {
    pthread_mutex_t run; /* held by the caller of the running job */
    pthread_mutex_t mu;  /* the sleepers' condition variable */
    pthread_cond_t cv;
    _Atomic uint64_t ticket;
    _Atomic int64_t done; /* chunks of the current job finished */
    _Atomic int sleepers;
    /* the job of the ticket's generation: written before the ticket is published, read after it */
    _Atomic(fl_par_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t n, chunk;
    int workers; /* started; 0: not yet (or none possible) */
    int tried;
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static _Thread_local int in_worker;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* claims a chunk of generation gen, the first unclaimed one (front) or the last; 0 when the job is
 * another's or has no chunk left */
static int claim(uint64_t gen, int front, int64_t *idx) {
    uint64_t t = atomic_load_explicit(&P.ticket, memory_order_acquire);
    for (;;) {
        if (T_GEN(t) != gen || T_LO(t) >= T_HI(t)) return 0;
        uint64_t next = front ? t + ((uint64_t)1 << 20) : t - 1;
        if (atomic_compare_exchange_weak_explicit(&P.ticket, &t, next, memory_order_acq_rel, memory_order_acquire)) {
            *idx = front ? (int64_t)T_LO(t) : (int64_t)T_HI(t) - 1;
            return 1;
        }
    }
}

static void run_chunks(uint64_t gen, int front, fl_par_fn fn, void *ctx, int64_t n, int64_t chunk) {
    int64_t idx;
    while (claim(gen, front, &idx)) {
        int64_t lo = idx * chunk, hi = lo + chunk < n ? lo + chunk : n;
        fn(ctx, lo, hi);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
    }
}

static void *worker(void *arg) {
    (void)arg;
    in_worker = 1;
    uint64_t seen = T_GEN(atomic_load(&P.ticket));
    for (;;) {
        uint64_t t = atomic_load_explicit(&P.ticket, memory_order_acquire);
        if (T_GEN(t) == seen) {
            /* yields while it spins: on a loaded machine it may share a core with the caller */
            int64_t until = now_ns() + SPIN_NS;
            for (int i = 0; T_GEN(t) == seen; i++) {
                cpu_relax();
                if ((i & 63) == 63) {
                    if (now_ns() > until) break;
                    sched_yield();
                }
                t = atomic_load_explicit(&P.ticket, memory_order_acquire);
            }
            if (T_GEN(t) == seen) {
                pthread_mutex_lock(&P.mu);
                atomic_fetch_add(&P.sleepers, 1); /* seq_cst: pairs with the caller's store, then load */
                while (T_GEN(atomic_load(&P.ticket)) == seen) pthread_cond_wait(&P.cv, &P.mu);
                atomic_fetch_sub(&P.sleepers, 1);
                pthread_mutex_unlock(&P.mu);
                continue;
            }
        }
        seen = T_GEN(t);
        /* read after the acquire of generation `seen`; used only for chunks claimed in that generation,
         * whose caller cannot have returned (so the next job cannot have overwritten them) */
        fl_par_fn fn = atomic_load_explicit(&P.fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&P.ctx, memory_order_relaxed);
        int64_t n = atomic_load_explicit(&P.n, memory_order_relaxed);
        int64_t chunk = atomic_load_explicit(&P.chunk, memory_order_relaxed);
        run_chunks(seen, 0, fn, ctx, n, chunk);
    }
    return NULL;
}

static void after_fork_child(void) {
    /* the workers are not in the child: start anew at its first parallel call */
    pthread_mutex_init(&P.run, NULL);
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.cv, NULL);
    atomic_store(&P.sleepers, 0);
    P.workers = 0;
    P.tried = 0;
}

/* under P.run */
static void start_workers(void) {
    P.tried = 1;
    static int registered;
    if (!registered) {
        pthread_atfork(NULL, NULL, after_fork_child);
        registered = 1;
    }
    int want = omp_get_num_procs() - 1;
    if (want > POOL_MAX) want = POOL_MAX;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (int i = 0; i < want; i++) {
        pthread_t th;
        if (pthread_create(&th, &attr, worker, NULL)) break;
        P.workers++;
    }
    pthread_attr_destroy(&attr);
}

void fl_par_for(int64_t n, int64_t grain, fl_par_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (n < 2 * grain || in_worker || omp_get_max_threads() < 2 || omp_in_parallel() ||
        pthread_mutex_trylock(&P.run)) {
        fn(ctx, 0, n);
        return;
    }
    if (!P.tried) start_workers();
    if (P.workers == 0) {
        pthread_mutex_unlock(&P.run);
        fn(ctx, 0, n);
        return;
    }
    int64_t nch = n / grain, cap = 16 * (int64_t)(P.workers + 1);
    if (nch > cap) nch = cap;
    if (nch > CHUNKS_MAX) nch = CHUNKS_MAX;
    int64_t chunk = (n + nch - 1) / nch;
    nch = (n + chunk - 1) / chunk;
    atomic_store_explicit(&P.fn, fn, memory_order_relaxed);
    atomic_store_explicit(&P.ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&P.n, n, memory_order_relaxed);
    atomic_store_explicit(&P.chunk, chunk, memory_order_relaxed);
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    uint64_t gen = (T_GEN(atomic_load_explicit(&P.ticket, memory_order_relaxed)) + 1) & 0xFFFFFF;
    atomic_store(&P.ticket, gen << 40 | (uint64_t)nch); /* seq_cst: publishes the job above */
    if (atomic_load(&P.sleepers)) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.mu);
    }
    run_chunks(gen, 1, fn, ctx, n, chunk);
    /* only chunks a worker claimed are left: wait for them, giving up the core after a while (on a
     * loaded machine that worker may be waiting for this very core) */
    int64_t until = 0;
    for (int i = 0; atomic_load_explicit(&P.done, memory_order_acquire) < nch; i++) {
        cpu_relax();
        if ((i & 63) == 63) {
            if (!until) until = now_ns() + YIELD_NS;
            else if (now_ns() > until) sched_yield();
        }
    }
    pthread_mutex_unlock(&P.run);
}
