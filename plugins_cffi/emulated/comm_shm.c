/* Collectives for the emulators whose profile sets `collectives`: real data
 * movement between the local processes of a communicator through one POSIX
 * shared-memory segment, in the style of NCCL's SHM transport.
 *
 * Segment "/fl_<backend>_<unique_id>" (rank 0 creates it; the others open it,
 * retrying until the timeout), laid out as:
 *   header page   magic (stored last, release), geometry, abort flag
 *   rank_ctrl[w]  per rank, one cache line pair each: barrier epoch `arrive`,
 *                 pid once joined, and the call descriptor per buffer set
 *   chan[w*(w-1)] per ordered (src,dst) pair: `posted` / `consumed` chunk
 *                 counters (each on its own line) and the slot headers
 *   data          per rank, two buffer sets of set_bytes (512 KiB by default;
 *                 FL_<PREFIX>_COMM_CHUNK_BYTES on rank 0 changes it)
 *   p2p           per ordered pair, P2P_SLOTS slots of p2p_slot_bytes
 *
 * Barrier: each rank publishes its barrier count with a release store into
 * its own `arrive` and waits (acquire) until every other rank's count has
 * reached it: a generation-counter barrier with no shared read-modify-write,
 * so a dead rank leaves nothing locked. Messages of any size go through the
 * fixed buffers in steps; consecutive steps alternate between the two buffer
 * sets, so one barrier per step suffices (a rank writes set s only after a
 * barrier every rank reached after its last read of set s). all_reduce: each
 * rank copies its step's slice into its buffer, barrier, rank r reduces the
 * r-th part of the slice over all buffers in rank order (floats of half
 * types accumulate in float) back into its own buffer, barrier, everyone
 * copies all parts out; each element is reduced by exactly one rank, so every
 * rank gets bit-identical results. The first step of every call also
 * publishes a descriptor (kind, dtype, count, op/root, step number) that all
 * ranks compare after the barrier, so mismatched calls fail with
 * FL_ERR_INVALID on every rank instead of corrupting data.
 * send/recv: a per-pair ring of P2P_SLOTS chunks (eager: send returns once
 * its last chunk is posted), matched in order per (src,dst) pair.
 *
 * Waits spin briefly, then sched_yield, then nanosleep; each wait gives up
 * after the communicator's timeout with FL_ERR_INTERNAL ("rocm: all_reduce
 * timed out after 5000 ms waiting for rank 1") and raises the segment's
 * abort flag, so the other ranks fail at once instead of waiting out their
 * own timeouts. A communicator that failed that way refuses further calls.
 *
 * Cleanup: rank 0 shm_unlinks the name as soon as every rank has joined
 * (every rank then holds its own mapping), so no /dev/shm entry outlives
 * comm_init, even when a process later dies; a failed comm_init unlinks too.
 * comm_destroy only unmaps and never blocks on peers.
 *
 * Every data-moving call first synchronizes the device (work queued on its
 * streams lands first), then moves data synchronously: it has completed on
 * this rank when it returns.
 *
 * Thread safety: a communicator must be used by one thread at a time (the
 * runtime's process-group thread); different communicators are independent. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

#define COMM_MAGIC 0x4d4f434d4853464cull /* "FLSHMCOM" */
#define COMM_LIVE 0x6c69766563306d6dull
#define COMM_VERSION 1
#define COMM_MAX_WORLD 64
#define COMM_UID_MAX 128
#define LINE 128
#define PAGE 4096
#define HEADER_BYTES PAGE
#define DEFAULT_SET_BYTES ((uint64_t)512 << 10) /* cache-resident steps: measured best of 128K..4M */
#define MIN_SET_BYTES ((uint64_t)4096)
#define MAX_SET_BYTES ((uint64_t)1 << 30)
#define P2P_SLOTS 2
#define P2P_MAX_SLOT_BYTES ((uint64_t)512 << 10)

#define NAME fl_emu_profile.name

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory collectives need address-free (lock-free) atomics");

enum { K_ALL_REDUCE = 1, K_BROADCAST, K_ALL_GATHER, K_REDUCE_SCATTER, K_BARRIER };
static const char *const kind_names[] = {"?", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
static const char *const op_names[] = {"sum", "prod", "min", "max", "avg"};
static const char *const dtype_names[FL_DTYPE_COUNT] = {
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128"};

typedef struct {
    _Atomic uint64_t magic; /* COMM_MAGIC once the creator has filled the rest */
    uint32_t version;
    int32_t world;
    uint64_t set_bytes;      /* one buffer set of one rank */
    uint64_t p2p_slot_bytes; /* one slot of one pair's ring */
    uint64_t total_bytes;
    uint64_t off_ranks, off_chans, off_data, off_p2p;
    _Alignas(LINE) _Atomic int32_t abort_by; /* 0, or 1 + the rank that gave up */
} shm_header_t;
_Static_assert(sizeof(shm_header_t) <= HEADER_BYTES, "header fits its page");

typedef struct {
    int32_t kind, dtype, arg, pad;
    int64_t count;
    uint64_t seq;
} desc_t;

typedef struct {
    _Alignas(LINE) _Atomic uint64_t arrive; /* barriers this rank has reached */
    _Atomic int32_t pid;                    /* 0 until the rank joined */
    _Alignas(LINE) desc_t desc[2];          /* the call in progress, per buffer set */
} rank_ctrl_t;

typedef struct {
    uint64_t total; /* bytes of the whole message */
    uint64_t bytes; /* bytes in this chunk */
} slot_hdr_t;

typedef struct {
    _Alignas(LINE) _Atomic uint64_t posted;   /* chunks the sender has written */
    _Alignas(LINE) _Atomic uint64_t consumed; /* chunks the receiver has read */
    _Alignas(LINE) slot_hdr_t slot[P2P_SLOTS];
} chan_t;

typedef struct {
    uint64_t live; /* COMM_LIVE until comm_destroy */
    char *base;
    size_t map_bytes;
    shm_header_t *hdr;
    rank_ctrl_t *ranks;
    chan_t *chans;
    char *data, *p2p;
    uint64_t set_bytes, p2p_slot_bytes;
    int rank, world, device, timeout_ms;
    uint64_t epoch; /* barriers passed */
    uint64_t step;  /* buffer-set steps taken: the set is step & 1 */
    int broken;     /* a wait failed: the ranks are no longer in step */
    int unlinked;
    char shm_name[COMM_UID_MAX + 80];
} comm_t;

static int (*emu_device_count)(int *count);
static int (*emu_synchronize)(int device);

/* ---------------------------------------------------------------- waiting */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static void backoff(unsigned iter) {
    if (iter < 256) {
        cpu_relax();
    } else if (iter < 2048) {
        sched_yield();
    } else {
        struct timespec ts = {0, iter < 8192 ? 20000 : 200000};
        nanosleep(&ts, NULL);
    }
}

static void raise_abort(comm_t *c) {
    int32_t zero = 0;
    c->broken = 1;
    atomic_compare_exchange_strong(&c->hdr->abort_by, &zero, c->rank + 1);
}

/* Waits until *v >= target. *deadline is 0 until the first wait of the
 * operation starts the clock. */
static int wait_ge(comm_t *c, _Atomic uint64_t *v, uint64_t target, const char *op, int peer, const char *what,
                   double *deadline) {
    for (unsigned iter = 0;; iter++) {
        if (atomic_load_explicit(v, memory_order_acquire) >= target) return FL_OK;
        int32_t ab = atomic_load_explicit(&c->hdr->abort_by, memory_order_relaxed);
        if (ab && ab != c->rank + 1) {
            c->broken = 1;
            FL_FAIL(FL_ERR_INTERNAL,
                    "%s: %s aborted: rank %d gave up on this communicator (a peer timed out or failed); "
                    "destroy it and create a new one", NAME, op, ab - 1);
        }
        if (iter >= 64) {
            double t = now_ms();
            if (*deadline == 0) {
                *deadline = t + c->timeout_ms;
            } else if (t > *deadline) {
                raise_abort(c);
                FL_FAIL(FL_ERR_INTERNAL, "%s: %s timed out after %d ms waiting for rank %d%s", NAME, op,
                        c->timeout_ms, peer, what);
            }
        }
        backoff(iter);
    }
}

static int barrier_wait(comm_t *c, const char *op) {
    uint64_t e = ++c->epoch;
    atomic_store_explicit(&c->ranks[c->rank].arrive, e, memory_order_release);
    double deadline = 0;
    for (int k = 0; k < c->world; k++) {
        if (k == c->rank) continue;
        int st = wait_ge(c, &c->ranks[k].arrive, e, op, k, "", &deadline);
        if (st) return st;
    }
    return FL_OK;
}

/* ---------------------------------------------------------------- checks */

static int check_comm(void *comm, const char *op) {
    comm_t *c = comm;
    if (!c) FL_FAIL(FL_ERR_INVALID, "%s: %s on a NULL communicator", NAME, op);
    if (c->live != COMM_LIVE) FL_FAIL(FL_ERR_INVALID, "%s: %s on a destroyed or invalid communicator", NAME, op);
    if (c->broken)
        FL_FAIL(FL_ERR_INTERNAL, "%s: %s on a communicator that failed earlier (a peer timed out or the call "
                "was aborted); destroy it and create a new one", NAME, op);
    return FL_OK;
}

static int check_device(int device, const char *op) {
    int n = 0;
    if (emu_device_count) emu_device_count(&n);
    if (device < 0 || device >= n)
        FL_FAIL(FL_ERR_INVALID, "%s: %s: no device %d (this emulator has %d)", NAME, op, device, n);
    return FL_OK;
}

/* Work the runtime queued on the device's streams (an async copy into the
 * tensor, say) lands before a collective reads or writes device memory. */
static int settle(int device) { return emu_synchronize ? emu_synchronize(device) : FL_OK; }

static int check_tensor(const fl_tensor_t *t, const char *op, const char *what) {
    if (!t) FL_FAIL(FL_ERR_INVALID, "%s: %s: %s tensor is NULL", NAME, op, what);
    if (t->dtype < 0 || t->dtype >= FL_DTYPE_COUNT)
        FL_FAIL(FL_ERR_INVALID, "%s: %s: %s tensor has unknown dtype %d", NAME, op, what, t->dtype);
    if (t->ndim < 0 || t->ndim > FL_MAX_DIMS)
        FL_FAIL(FL_ERR_INVALID, "%s: %s: %s tensor has ndim %d", NAME, op, what, t->ndim);
    for (int d = 0; d < t->ndim; d++)
        if (t->sizes[d] < 0) FL_FAIL(FL_ERR_INVALID, "%s: %s: %s tensor has a negative size", NAME, op, what);
    if (!fl_is_contiguous(t))
        FL_FAIL(FL_ERR_INVALID, "%s: %s: %s tensor is not contiguous (the runtime must pass contiguous tensors)",
                NAME, op, what);
    if (fl_numel(t) > 0 && !t->data) FL_FAIL(FL_ERR_INVALID, "%s: %s: %s tensor has no data", NAME, op, what);
    return FL_OK;
}

static int reducible(int dtype) { return dtype != FL_BOOL; }
/* complex tensors sum and average as pairs of reals; prod/min/max are not defined for them here */
static int complex_op_ok(int op) { return op == FL_REDUCE_SUM || op == FL_REDUCE_AVG; }

static int check_op(int op, int dtype, const char *name) {
    if (op < FL_REDUCE_SUM || op > FL_REDUCE_AVG)
        FL_FAIL(FL_ERR_INVALID, "%s: %s: unknown reduce op %d", NAME, name, op);
    if (!reducible(dtype))
        FL_FAIL(FL_ERR_UNSUPPORTED, "%s: %s does not reduce %s tensors", NAME, name, dtype_names[dtype]);
    if (fl_is_complex(dtype) && !complex_op_ok(op))
        FL_FAIL(FL_ERR_UNSUPPORTED, "%s: %s: %s of %s tensors is not supported (sum and avg are)", NAME, name,
                op_names[op], dtype_names[dtype]);
    if (op == FL_REDUCE_AVG && !fl_is_floating(dtype) && !fl_is_complex(dtype))
        FL_FAIL(FL_ERR_INVALID, "%s: %s: avg is only defined for floating-point tensors, not %s", NAME, name,
                dtype_names[dtype]);
    return FL_OK;
}

/* memcpy that tolerates the NULL pointers of zero-size tensors */
static inline void copy_bytes(void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
}

static inline char *tdata(const fl_tensor_t *t) { return (char *)t->data + t->offset * (int64_t)fl_itemsize(t->dtype); }
static inline char *slot(comm_t *c, int rank, int set) {
    return c->data + ((size_t)rank * 2 + (size_t)set) * c->set_bytes;
}

/* The first step of a call publishes what this rank is doing; after the
 * step's barrier every rank compares, so every rank sees a mismatch. */
static void publish(comm_t *c, int set, int kind, int dtype, int arg, int64_t count) {
    desc_t *d = &c->ranks[c->rank].desc[set];
    d->kind = kind;
    d->dtype = dtype;
    d->arg = arg;
    d->count = count;
    d->seq = c->step;
}

static void describe(char *buf, size_t n, const desc_t *d) {
    int k = d->kind >= 1 && d->kind <= K_BARRIER ? d->kind : 0;
    const char *dt = d->dtype >= 0 && d->dtype < FL_DTYPE_COUNT ? dtype_names[d->dtype] : "?";
    if (k == K_BARRIER) snprintf(buf, n, "barrier()");
    else if (k == K_ALL_REDUCE || k == K_REDUCE_SCATTER)
        snprintf(buf, n, "%s(%s[%lld], %s)", kind_names[k], dt, (long long)d->count,
                 d->arg >= 0 && d->arg <= FL_REDUCE_AVG ? op_names[d->arg] : "?");
    else if (k == K_BROADCAST)
        snprintf(buf, n, "broadcast(%s[%lld], root=%d)", dt, (long long)d->count, d->arg);
    else snprintf(buf, n, "%s(%s[%lld])", kind_names[k], dt, (long long)d->count);
}

static int compare(comm_t *c, int set, const char *op) {
    const desc_t *me = &c->ranks[c->rank].desc[set];
    for (int k = 0; k < c->world; k++) {
        const desc_t *o = &c->ranks[k].desc[set];
        if (o->kind != me->kind || o->dtype != me->dtype || o->arg != me->arg || o->count != me->count ||
            o->seq != me->seq) {
            char a[128], b[128];
            const desc_t *lo = k < c->rank ? o : me, *hi = k < c->rank ? me : o;
            describe(a, sizeof a, lo);
            describe(b, sizeof b, hi);
            if (o->seq != me->seq) c->broken = 1;
            FL_FAIL(FL_ERR_INVALID, "%s: %s: the ranks called different operations: rank %d %s, rank %d %s", NAME,
                    op, k < c->rank ? k : c->rank, a, k < c->rank ? c->rank : k, b);
        }
    }
    return FL_OK;
}

/* One buffer-set step: the set to use. */
static inline int next_set(comm_t *c) { return (int)(c->step++ & 1); }

/* ---------------------------------------------------------------- reductions */

#define BLK 1024
#define F_SUM(a, x) ((a) + (x))
#define F_PROD(a, x) ((a) * (x))
#define F_MIN(a, x) (((a) < (x) || (a) != (a)) ? (a) : (x)) /* NaN propagates */
#define F_MAX(a, x) (((a) > (x) || (a) != (a)) ? (a) : (x))
#define I_MIN(a, x) ((a) < (x) ? (a) : (x))
#define I_MAX(a, x) ((a) > (x) ? (a) : (x))
#define ID(x) (x)

/* dst[i] = src[0][i] OP src[1][i] OP ... in rank order, through ACC. dst may
 * be one of the sources (each block is read completely before it is stored). */
#define DEF_REDUCE(FN, T, ACC, LOAD, STORE, OP, AVG)                                             \
    static void FN(char *dst, char *const *src, int nsrc, int64_t n) {                         \
        ACC acc[BLK];                                                                          \
        for (int64_t b = 0; b < n; b += BLK) {                                                 \
            int64_t m = n - b < BLK ? n - b : BLK;                                             \
            const T *s0 = (const T *)src[0] + b;                                               \
            for (int64_t i = 0; i < m; i++) acc[i] = (ACC)LOAD(s0[i]);                         \
            for (int k = 1; k < nsrc; k++) {                                                   \
                const T *s = (const T *)src[k] + b;                                            \
                for (int64_t i = 0; i < m; i++) {                                              \
                    ACC a = acc[i], x = (ACC)LOAD(s[i]);                                       \
                    acc[i] = OP(a, x);                                                         \
                }                                                                              \
            }                                                                                  \
            if (AVG)                                                                           \
                for (int64_t i = 0; i < m; i++) acc[i] = acc[i] / (ACC)nsrc;                   \
            T *d = (T *)dst + b;                                                               \
            for (int64_t i = 0; i < m; i++) d[i] = (T)STORE(acc[i]);                           \
        }                                                                                      \
    }

#define DEF_FLOAT(TAG, T, ACC, LOAD, STORE)                 \
    DEF_REDUCE(r_##TAG##_sum, T, ACC, LOAD, STORE, F_SUM, 0)  \
    DEF_REDUCE(r_##TAG##_prod, T, ACC, LOAD, STORE, F_PROD, 0) \
    DEF_REDUCE(r_##TAG##_min, T, ACC, LOAD, STORE, F_MIN, 0)  \
    DEF_REDUCE(r_##TAG##_max, T, ACC, LOAD, STORE, F_MAX, 0)  \
    DEF_REDUCE(r_##TAG##_avg, T, ACC, LOAD, STORE, F_SUM, 1)

/* integer sums and products wrap (two's complement, as PyTorch's do): they
 * accumulate unsigned, where overflow is defined */
#define DEF_INT(TAG, T, U)                                   \
    DEF_REDUCE(r_##TAG##_sum, T, U, ID, ID, F_SUM, 0)        \
    DEF_REDUCE(r_##TAG##_prod, T, U, ID, ID, F_PROD, 0)      \
    DEF_REDUCE(r_##TAG##_min, T, T, ID, ID, I_MIN, 0)        \
    DEF_REDUCE(r_##TAG##_max, T, T, ID, ID, I_MAX, 0)

DEF_FLOAT(f32, float, float, ID, ID)
DEF_FLOAT(f64, double, double, ID, ID)
DEF_FLOAT(f16, uint16_t, float, fl_f16_to_f32, fl_f32_to_f16)
DEF_FLOAT(bf16, uint16_t, float, fl_bf16_to_f32, fl_f32_to_bf16)
DEF_INT(i64, int64_t, uint64_t)
DEF_INT(i32, int32_t, uint32_t)
DEF_INT(i16, int16_t, uint32_t)
DEF_INT(i8, int8_t, uint32_t)
DEF_INT(u8, uint8_t, uint32_t)

typedef void (*reduce_fn)(char *dst, char *const *src, int nsrc, int64_t n);
/* a complex element is two reals: the real kernels over 2n values */
static void r_c64_sum(char *dst, char *const *src, int nsrc, int64_t n) { r_f32_sum(dst, src, nsrc, 2 * n); }
static void r_c64_avg(char *dst, char *const *src, int nsrc, int64_t n) { r_f32_avg(dst, src, nsrc, 2 * n); }
static void r_c128_sum(char *dst, char *const *src, int nsrc, int64_t n) { r_f64_sum(dst, src, nsrc, 2 * n); }
static void r_c128_avg(char *dst, char *const *src, int nsrc, int64_t n) { r_f64_avg(dst, src, nsrc, 2 * n); }
#define ROW_F(TAG) {r_##TAG##_sum, r_##TAG##_prod, r_##TAG##_min, r_##TAG##_max, r_##TAG##_avg}
#define ROW_I(TAG) {r_##TAG##_sum, r_##TAG##_prod, r_##TAG##_min, r_##TAG##_max, NULL}
static const reduce_fn reducers[FL_DTYPE_COUNT][5] = {
    [FL_FLOAT32] = ROW_F(f32), [FL_FLOAT64] = ROW_F(f64), [FL_FLOAT16] = ROW_F(f16),
    [FL_BFLOAT16] = ROW_F(bf16), [FL_INT64] = ROW_I(i64),  [FL_INT32] = ROW_I(i32),
    [FL_INT16] = ROW_I(i16),    [FL_INT8] = ROW_I(i8),     [FL_UINT8] = ROW_I(u8),
    [FL_COMPLEX64] = {r_c64_sum, NULL, NULL, NULL, r_c64_avg}, [FL_COMPLEX128] = {r_c128_sum, NULL, NULL, NULL, r_c128_avg},
};

/* ---------------------------------------------------------------- init / destroy */

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static void layout(shm_header_t *h, int world, uint64_t set_bytes) {
    uint64_t nchan = (uint64_t)world * (uint64_t)(world - 1);
    h->version = COMM_VERSION;
    h->world = world;
    h->set_bytes = set_bytes;
    h->p2p_slot_bytes = set_bytes < P2P_MAX_SLOT_BYTES ? set_bytes : P2P_MAX_SLOT_BYTES;
    h->off_ranks = HEADER_BYTES;
    h->off_chans = h->off_ranks + (uint64_t)world * sizeof(rank_ctrl_t);
    h->off_data = round_up(h->off_chans + nchan * sizeof(chan_t), PAGE);
    h->off_p2p = h->off_data + (uint64_t)world * 2 * set_bytes;
    h->total_bytes = round_up(h->off_p2p + nchan * P2P_SLOTS * h->p2p_slot_bytes, PAGE);
}

static void attach(comm_t *c) {
    shm_header_t *h = (shm_header_t *)c->base;
    c->hdr = h;
    c->ranks = (rank_ctrl_t *)(c->base + h->off_ranks);
    c->chans = (chan_t *)(c->base + h->off_chans);
    c->data = c->base + h->off_data;
    c->p2p = c->base + h->off_p2p;
    c->set_bytes = h->set_bytes;
    c->p2p_slot_bytes = h->p2p_slot_bytes;
}

static void sleep_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms - (double)(time_t)(ms / 1000) * 1000) * 1e6)};
    nanosleep(&ts, NULL);
}

/* Rank 0: create, size, reserve (so a full /dev/shm is an error here, not a
 * SIGBUS later) and fill the segment. */
static int create_segment(comm_t *c) {
    char key[96];
    snprintf(key, sizeof key, "FL_%s_COMM_CHUNK_BYTES", fl_emu_profile.env_prefix);
    uint64_t set_bytes;
    int bad = fl_host_env_size(key, DEFAULT_SET_BYTES, &set_bytes);
    if (bad) return bad;
    if (set_bytes < MIN_SET_BYTES) set_bytes = MIN_SET_BYTES;
    if (set_bytes > MAX_SET_BYTES) set_bytes = MAX_SET_BYTES;
    set_bytes = round_up(set_bytes, PAGE);
    shm_header_t geo;
    memset(&geo, 0, sizeof geo);
    layout(&geo, c->world, set_bytes);

    int fd = shm_open(c->shm_name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            FL_FAIL(FL_ERR_INVALID, "%s: comm_init: shared-memory segment %s already exists: the unique_id is in "
                    "use by another communicator, or a crashed run left /dev/shm%s behind", NAME, c->shm_name,
                    c->shm_name);
        FL_FAIL(FL_ERR_INTERNAL, "%s: comm_init: shm_open(%s) failed: %s", NAME, c->shm_name, strerror(errno));
    }
    int err = ftruncate(fd, (off_t)geo.total_bytes) ? errno : 0;
    if (!err) err = posix_fallocate(fd, 0, (off_t)geo.total_bytes);
    if (err) {
        close(fd);
        shm_unlink(c->shm_name);
        FL_FAIL(FL_ERR_INTERNAL, "%s: comm_init: cannot reserve %llu bytes of shared memory for %d ranks: %s "
                "(is /dev/shm too small? %s sets the per-rank buffer size)", NAME,
                (unsigned long long)geo.total_bytes, c->world, strerror(err), key);
    }
    void *base = mmap(NULL, geo.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    err = errno;
    close(fd);
    if (base == MAP_FAILED) {
        shm_unlink(c->shm_name);
        FL_FAIL(FL_ERR_INTERNAL, "%s: comm_init: mmap of %llu bytes failed: %s", NAME,
                (unsigned long long)geo.total_bytes, strerror(err));
    }
    c->base = base;
    c->map_bytes = geo.total_bytes;
    shm_header_t *h = base; /* zero-filled by ftruncate */
    h->version = geo.version;
    h->world = geo.world;
    h->set_bytes = geo.set_bytes;
    h->p2p_slot_bytes = geo.p2p_slot_bytes;
    h->total_bytes = geo.total_bytes;
    h->off_ranks = geo.off_ranks;
    h->off_chans = geo.off_chans;
    h->off_data = geo.off_data;
    h->off_p2p = geo.off_p2p;
    attach(c);
    atomic_store_explicit(&h->magic, COMM_MAGIC, memory_order_release);
    return FL_OK;
}

/* Ranks > 0: open the segment once rank 0 has created and filled it. */
static int open_segment(comm_t *c) {
    double deadline = now_ms() + c->timeout_ms;
    int fd = -1;
    void *page = MAP_FAILED;
    for (unsigned iter = 0;; iter++) {
        if (fd < 0) fd = shm_open(c->shm_name, O_RDWR, 0600);
        if (fd < 0 && errno != ENOENT)
            FL_FAIL(FL_ERR_INTERNAL, "%s: comm_init: shm_open(%s) failed: %s", NAME, c->shm_name, strerror(errno));
        if (fd >= 0 && page == MAP_FAILED) {
            struct stat st;
            if (fstat(fd, &st) == 0 && st.st_size >= HEADER_BYTES)
                page = mmap(NULL, HEADER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        }
        if (page != MAP_FAILED &&
            atomic_load_explicit(&((shm_header_t *)page)->magic, memory_order_acquire) == COMM_MAGIC)
            break;
        if (now_ms() > deadline) {
            if (page != MAP_FAILED) munmap(page, HEADER_BYTES);
            if (fd >= 0) close(fd);
            FL_FAIL(FL_ERR_INTERNAL, "%s: comm_init timed out after %d ms waiting for rank 0 to create the "
                    "communicator (%s)", NAME, c->timeout_ms, c->shm_name);
        }
        if (iter < 100) sched_yield();
        else sleep_ms(1);
    }
    shm_header_t *h = page;
    uint64_t total = h->total_bytes;
    int world = h->world, version = (int)h->version;
    munmap(page, HEADER_BYTES);
    if (version != COMM_VERSION || world != c->world) {
        close(fd);
        if (version != COMM_VERSION)
            FL_FAIL(FL_ERR_INTERNAL, "%s: comm_init: segment %s has layout version %d, this plugin speaks %d", NAME,
                    c->shm_name, version, COMM_VERSION);
        FL_FAIL(FL_ERR_INVALID, "%s: comm_init: rank %d was given world=%d, but rank 0 created the communicator "
                "with world=%d", NAME, c->rank, c->world, world);
    }
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (base == MAP_FAILED)
        FL_FAIL(FL_ERR_INTERNAL, "%s: comm_init: mmap of %llu bytes failed: %s", NAME, (unsigned long long)total,
                strerror(err));
    c->base = base;
    c->map_bytes = total;
    attach(c);
    return FL_OK;
}

static void release(comm_t *c) {
    if (c->base) munmap(c->base, c->map_bytes);
    c->base = NULL;
    c->live = 0;
    free(c);
}

static int comm_init(int device, const char *unique_id, int rank, int world, int timeout_ms, void **comm) {
    int st = check_device(device, "comm_init");
    if (st) return st;
    if (!comm) FL_FAIL(FL_ERR_INVALID, "%s: comm_init: the comm out-pointer is NULL", NAME);
    *comm = NULL;
    if (world < 1 || world > COMM_MAX_WORLD)
        FL_FAIL(FL_ERR_INVALID, "%s: comm_init: world=%d, expected 1..%d", NAME, world, COMM_MAX_WORLD);
    if (rank < 0 || rank >= world)
        FL_FAIL(FL_ERR_INVALID, "%s: comm_init: rank %d out of range for world=%d (expected 0..%d)", NAME, rank,
                world, world - 1);
    if (timeout_ms <= 0) FL_FAIL(FL_ERR_INVALID, "%s: comm_init: timeout_ms=%d, expected > 0", NAME, timeout_ms);
    if (!unique_id) FL_FAIL(FL_ERR_INVALID, "%s: comm_init: unique_id is NULL", NAME);
    size_t len = strlen(unique_id);
    if (len < 1 || len > COMM_UID_MAX)
        FL_FAIL(FL_ERR_INVALID, "%s: comm_init: unique_id must be 1..%d characters, got %zu", NAME, COMM_UID_MAX,
                len);
    for (size_t i = 0; i < len; i++) {
        char ch = unique_id[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                 ch == '-' || ch == '.';
        if (!ok)
            FL_FAIL(FL_ERR_INVALID, "%s: comm_init: unique_id may hold only letters, digits, '_', '-' and '.'; "
                    "character %zu is 0x%02x", NAME, i, (unsigned char)ch);
    }

    comm_t *c = calloc(1, sizeof *c);
    if (!c) FL_FAIL(FL_ERR_OOM, "%s: comm_init: out of host memory", NAME);
    c->rank = rank;
    c->world = world;
    c->device = device;
    c->timeout_ms = timeout_ms;
    snprintf(c->shm_name, sizeof c->shm_name, "/fl_%s_%s", NAME, unique_id);
    st = rank == 0 ? create_segment(c) : open_segment(c);
    if (st) {
        free(c);
        return st;
    }

    /* join: claim the rank, then wait for everyone (barrier 1) */
    int32_t zero = 0;
    rank_ctrl_t *me = &c->ranks[rank];
    if (!atomic_compare_exchange_strong(&me->pid, &zero, (int32_t)getpid())) {
        raise_abort(c);
        shm_unlink(c->shm_name);
        fl_host_set_error("%s: comm_init: rank %d joined communicator %s twice (pids %d and %d)", NAME, rank,
                          c->shm_name, (int)zero, (int)getpid());
        release(c);
        return FL_ERR_INVALID;
    }
    c->live = COMM_LIVE;
    st = barrier_wait(c, "comm_init");
    /* every rank has mapped the segment (or the init failed): the name is no
     * longer needed, and unlinking now means no process death can leak it */
    if (rank == 0 || st) shm_unlink(c->shm_name);
    c->unlinked = 1;
    if (st) {
        release(c);
        return st;
    }
    *comm = c;
    return FL_OK;
}

static int comm_destroy(void *comm) {
    comm_t *c = comm;
    if (!c) FL_FAIL(FL_ERR_INVALID, "%s: comm_destroy of a NULL communicator", NAME);
    if (c->live != COMM_LIVE) FL_FAIL(FL_ERR_INVALID, "%s: comm_destroy of a destroyed or invalid communicator", NAME);
    if (!c->unlinked) shm_unlink(c->shm_name);
    release(c);
    return FL_OK;
}

/* ---------------------------------------------------------------- collectives */

static int comm_barrier(void *comm) {
    int st = check_comm(comm, "barrier");
    if (st) return st;
    comm_t *c = comm;
    int set = next_set(c);
    publish(c, set, K_BARRIER, 0, 0, 0);
    st = barrier_wait(c, "barrier");
    return st ? st : compare(c, set, "barrier");
}

static int comm_all_reduce(int device, const fl_tensor_t *t, int op, void *comm) {
    const char *name = "all_reduce";
    int st = check_comm(comm, name);
    if (!st) st = check_device(device, name);
    if (!st) st = check_tensor(t, name, "the");
    if (!st) st = check_op(op, t->dtype, name);
    if (!st) st = settle(device);
    if (st) return st;
    comm_t *c = comm;
    reduce_fn fn = reducers[t->dtype][op];
    size_t isz = fl_itemsize(t->dtype);
    int64_t n = fl_numel(t), per = (int64_t)(c->set_bytes / isz);
    char *base = tdata(t);
    char *src[COMM_MAX_WORLD];
    int64_t off = 0;
    do {
        int64_t m = n - off < per ? n - off : per;
        int set = next_set(c);
        if (off == 0) publish(c, set, K_ALL_REDUCE, t->dtype, op, n);
        copy_bytes(slot(c, c->rank, set), base + off * isz, (size_t)m * isz);
        if ((st = barrier_wait(c, name))) return st;
        if (off == 0 && (st = compare(c, set, name))) return st;
        int64_t lo = m * c->rank / c->world, hi = m * (c->rank + 1) / c->world;
        for (int k = 0; k < c->world; k++) src[k] = slot(c, k, set) + lo * isz;
        fn(slot(c, c->rank, set) + lo * isz, src, c->world, hi - lo);
        if ((st = barrier_wait(c, name))) return st;
        for (int k = 0; k < c->world; k++) {
            int64_t klo = m * k / c->world, khi = m * (k + 1) / c->world;
            copy_bytes(base + (off + klo) * isz, slot(c, k, set) + klo * isz, (size_t)(khi - klo) * isz);
        }
        off += m;
    } while (off < n);
    return FL_OK;
}

static int comm_broadcast(int device, const fl_tensor_t *t, int root, void *comm) {
    const char *name = "broadcast";
    int st = check_comm(comm, name);
    if (!st) st = check_device(device, name);
    if (!st) st = check_tensor(t, name, "the");
    if (!st) st = settle(device);
    if (st) return st;
    comm_t *c = comm;
    if (root < 0 || root >= c->world)
        FL_FAIL(FL_ERR_INVALID, "%s: broadcast: root %d out of range for world=%d", NAME, root, c->world);
    int64_t n = fl_numel(t), bytes = n * (int64_t)fl_itemsize(t->dtype), per = (int64_t)c->set_bytes;
    char *base = tdata(t);
    int64_t off = 0;
    do {
        int64_t m = bytes - off < per ? bytes - off : per;
        int set = next_set(c);
        if (off == 0) publish(c, set, K_BROADCAST, t->dtype, root, n);
        if (c->rank == root) copy_bytes(slot(c, root, set), base + off, (size_t)m);
        if ((st = barrier_wait(c, name))) return st;
        if (off == 0 && (st = compare(c, set, name))) return st;
        if (c->rank != root) copy_bytes(base + off, slot(c, root, set), (size_t)m);
        off += m;
    } while (off < bytes);
    return FL_OK;
}

static int comm_all_gather(int device, const fl_tensor_t *in, const fl_tensor_t *out, void *comm) {
    const char *name = "all_gather";
    int st = check_comm(comm, name);
    if (!st) st = check_device(device, name);
    if (!st) st = check_tensor(in, name, "the input");
    if (!st) st = check_tensor(out, name, "the output");
    if (!st) st = settle(device);
    if (st) return st;
    comm_t *c = comm;
    int64_t n = fl_numel(in);
    if (out->dtype != in->dtype)
        FL_FAIL(FL_ERR_INVALID, "%s: all_gather: output dtype %s differs from input dtype %s", NAME,
                dtype_names[out->dtype], dtype_names[in->dtype]);
    if (fl_numel(out) != n * c->world)
        FL_FAIL(FL_ERR_INVALID, "%s: all_gather: output holds %lld elements, expected world (%d) x %lld", NAME,
                (long long)fl_numel(out), c->world, (long long)n);
    size_t isz = fl_itemsize(in->dtype);
    int64_t per = (int64_t)(c->set_bytes / isz);
    char *ib = tdata(in), *ob = tdata(out);
    int64_t off = 0;
    do {
        int64_t m = n - off < per ? n - off : per;
        int set = next_set(c);
        if (off == 0) publish(c, set, K_ALL_GATHER, in->dtype, 0, n);
        copy_bytes(slot(c, c->rank, set), ib + off * isz, (size_t)m * isz);
        if ((st = barrier_wait(c, name))) return st;
        if (off == 0 && (st = compare(c, set, name))) return st;
        for (int k = 0; k < c->world; k++) copy_bytes(ob + (k * n + off) * isz, slot(c, k, set), (size_t)m * isz);
        off += m;
    } while (off < n);
    return FL_OK;
}

static int comm_reduce_scatter(int device, const fl_tensor_t *in, const fl_tensor_t *out, int op, void *comm) {
    const char *name = "reduce_scatter";
    int st = check_comm(comm, name);
    if (!st) st = check_device(device, name);
    if (!st) st = check_tensor(in, name, "the input");
    if (!st) st = check_tensor(out, name, "the output");
    if (!st) st = check_op(op, in->dtype, name);
    if (!st) st = settle(device);
    if (st) return st;
    comm_t *c = comm;
    int64_t n = fl_numel(out);
    if (out->dtype != in->dtype)
        FL_FAIL(FL_ERR_INVALID, "%s: reduce_scatter: output dtype %s differs from input dtype %s", NAME,
                dtype_names[out->dtype], dtype_names[in->dtype]);
    if (fl_numel(in) != n * c->world)
        FL_FAIL(FL_ERR_INVALID, "%s: reduce_scatter: input holds %lld elements, expected world (%d) x %lld", NAME,
                (long long)fl_numel(in), c->world, (long long)n);
    reduce_fn fn = reducers[in->dtype][op];
    size_t isz = fl_itemsize(in->dtype);
    int64_t per = (int64_t)(c->set_bytes / (isz * (size_t)c->world));
    char *ib = tdata(in), *ob = tdata(out);
    char *src[COMM_MAX_WORLD];
    int64_t off = 0;
    do {
        int64_t m = n - off < per ? n - off : per;
        int set = next_set(c);
        if (off == 0) publish(c, set, K_REDUCE_SCATTER, in->dtype, op, n);
        char *mine = slot(c, c->rank, set);
        for (int j = 0; j < c->world; j++) copy_bytes(mine + j * m * isz, ib + (j * n + off) * isz, (size_t)m * isz);
        if ((st = barrier_wait(c, name))) return st;
        if (off == 0 && (st = compare(c, set, name))) return st;
        for (int k = 0; k < c->world; k++) src[k] = slot(c, k, set) + c->rank * m * isz;
        fn(ob + off * isz, src, c->world, m);
        off += m;
    } while (off < n);
    return FL_OK;
}

/* ---------------------------------------------------------------- point to point */

static inline size_t chan_index(comm_t *c, int src, int dst) {
    return (size_t)src * (size_t)(c->world - 1) + (size_t)(dst < src ? dst : dst - 1);
}
static inline char *chan_slot(comm_t *c, size_t ch, uint64_t seq) {
    return c->p2p + (ch * P2P_SLOTS + (size_t)(seq % P2P_SLOTS)) * c->p2p_slot_bytes;
}

static int check_peer(comm_t *c, int peer, const char *op) {
    if (peer < 0 || peer >= c->world)
        FL_FAIL(FL_ERR_INVALID, "%s: %s: peer %d out of range for world=%d", NAME, op, peer, c->world);
    if (peer == c->rank) FL_FAIL(FL_ERR_INVALID, "%s: %s: rank %d cannot %s itself", NAME, op, peer, op);
    return FL_OK;
}

static int comm_send(int device, const fl_tensor_t *t, int peer, void *comm) {
    int st = check_comm(comm, "send");
    if (!st) st = check_device(device, "send");
    if (!st) st = check_tensor(t, "send", "the");
    if (!st) st = check_peer(comm, peer, "send");
    if (!st) st = settle(device);
    if (st) return st;
    comm_t *c = comm;
    size_t ci = chan_index(c, c->rank, peer);
    chan_t *ch = &c->chans[ci];
    uint64_t total = (uint64_t)fl_numel(t) * fl_itemsize(t->dtype), off = 0;
    uint64_t posted = atomic_load_explicit(&ch->posted, memory_order_relaxed); /* only this rank writes it */
    const char *base = tdata(t);
    double deadline = 0;
    do {
        uint64_t m = total - off < c->p2p_slot_bytes ? total - off : c->p2p_slot_bytes;
        if (posted >= P2P_SLOTS &&
            (st = wait_ge(c, &ch->consumed, posted + 1 - P2P_SLOTS, "send", peer, " to receive", &deadline)))
            return st;
        deadline = 0;
        copy_bytes(chan_slot(c, ci, posted), base + off, (size_t)m);
        ch->slot[posted % P2P_SLOTS].total = total;
        ch->slot[posted % P2P_SLOTS].bytes = m;
        atomic_store_explicit(&ch->posted, ++posted, memory_order_release);
        off += m;
    } while (off < total);
    return FL_OK;
}

static int comm_recv(int device, const fl_tensor_t *t, int peer, void *comm) {
    int st = check_comm(comm, "recv");
    if (!st) st = check_device(device, "recv");
    if (!st) st = check_tensor(t, "recv", "the");
    if (!st) st = check_peer(comm, peer, "recv");
    if (!st) st = settle(device);
    if (st) return st;
    comm_t *c = comm;
    size_t ci = chan_index(c, peer, c->rank);
    chan_t *ch = &c->chans[ci];
    uint64_t want = (uint64_t)fl_numel(t) * fl_itemsize(t->dtype), off = 0, total = 0;
    uint64_t consumed = atomic_load_explicit(&ch->consumed, memory_order_relaxed); /* only this rank writes it */
    char *base = tdata(t);
    double deadline = 0;
    /* the sender's chunks decide the message; a size mismatch drains the
     * whole message (keeping the pair in step) and then fails */
    do {
        if ((st = wait_ge(c, &ch->posted, consumed + 1, "recv", peer, " to send", &deadline))) return st;
        deadline = 0;
        const slot_hdr_t *sh = &ch->slot[consumed % P2P_SLOTS];
        total = sh->total;
        uint64_t m = sh->bytes;
        if (off < want) copy_bytes(base + off, chan_slot(c, ci, consumed), (size_t)(want - off < m ? want - off : m));
        atomic_store_explicit(&ch->consumed, ++consumed, memory_order_release);
        off += m;
    } while (off < total);
    if (total != want)
        FL_FAIL(FL_ERR_INVALID, "%s: recv: expected %llu bytes from rank %d, which sent %llu", NAME,
                (unsigned long long)want, peer, (unsigned long long)total);
    return FL_OK;
}

void fl_emu_comm_install(fl_plugin_t *p) {
    emu_device_count = p->device_count;
    emu_synchronize = p->synchronize;
    p->comm_init = comm_init;
    p->comm_destroy = comm_destroy;
    p->comm_all_reduce = comm_all_reduce;
    p->comm_broadcast = comm_broadcast;
    p->comm_all_gather = comm_all_gather;
    p->comm_reduce_scatter = comm_reduce_scatter;
    p->comm_send = comm_send;
    p->comm_recv = comm_recv;
    p->comm_barrier = comm_barrier;
}
