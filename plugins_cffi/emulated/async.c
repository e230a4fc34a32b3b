/* The emulators' asynchronous mode (FL_EMU_ASYNC=1): the emulated chip
 * behaves as a real one does where torch_fl could get it wrong.
 *
 *   - Kernels are asynchronous. A kernel call checks and copies its
 *     descriptors, queues the work on the device's default stream (a worker
 *     thread, streams.c) and returns; the device declares
 *     FL_FEATURE_ASYNC_KERNELS. A NULL-stream copy waits for the work before
 *     it, as fl_plugin.h's copy contract says.
 *   - Device memory cannot be read by the host. Each device's memory is a
 *     shared-memory arena (memfd) mapped twice: PROT_NONE at the addresses
 *     malloc hands the runtime, read-write at a second address that only the
 *     plugin's kernels, copies and collectives use. A host read of device
 *     memory anywhere in torch_fl is a SIGSEGV, not a silently stale value.
 *
 * What it does not copy from real chips, and why:
 *   - A kernel's decision to decline a call (FL_ERR_UNSUPPORTED) or refuse it
 *     (FL_ERR_INVALID) must come back from the call (fl_plugin.h). The host
 *     kernels decide while they run, so the first call of each signature
 *     (kernel, dtypes, shapes, strides, arguments) runs to completion before
 *     it returns; later calls with that signature are queued.
 *   - Kernels whose errors depend on the data (indices out of range: index,
 *     gather, scatter, embedding, nll_loss, ...) always run to completion, so
 *     the error is raised at the call, as on the CPU. A chip reports these
 *     later (CUDA's device-side asserts); the stream's sticky error
 *     (streams.c) is how this emulator reports any other failure of a queued
 *     kernel.
 *   - Launch slots: a kernel function pointer cannot carry its kernel, so each
 *     kernel (table entries and JIT kernels) gets one of FL_EMU_SLOTS static
 *     trampolines; when they run out, jit_compile declines and the runtime
 *     uses another tier. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu.h"

static int async_on = -1;

int fl_emu_async_on(void) { return async_on == 1; }

/* ------------------------------------------------------------------ far memory ---- */

#define PAGE 4096u

typedef struct span { size_t off, len; struct span *next; } span_t;
typedef struct sized { size_t off, len, req; struct sized *next; } sized_t;

#define NBUCKETS 4096
typedef struct {
    char *dev;          /* PROT_NONE view: the addresses the runtime gets */
    char *rw;           /* read-write view, the same pages */
    size_t size;
    size_t bump;        /* [bump, size) never handed out yet */
    span_t *free_spans; /* sorted by offset, coalesced */
    sized_t *live[NBUCKETS];
    pthread_mutex_t mu;
} arena_t;

static arena_t arenas[FL_EMU_MAX_DEVICES];
static int n_arenas;

static int arena_init(arena_t *a, int device, size_t size) {
    char name[32];
    snprintf(name, sizeof name, "fl-emu-%s-%d", fl_emu_profile.name, device);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) FL_FAIL(FL_ERR_INTERNAL, "%s: FL_EMU_ASYNC=1 needs memfd_create: %s", fl_emu_profile.name, strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        FL_FAIL(FL_ERR_INTERNAL, "%s: cannot size the device arena (%zu bytes): %s", fl_emu_profile.name, size,
                strerror(errno));
    }
    void *dev = mmap(NULL, size, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    void *rw = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (dev == MAP_FAILED || rw == MAP_FAILED) {
        if (dev != MAP_FAILED) munmap(dev, size);
        if (rw != MAP_FAILED) munmap(rw, size);
        FL_FAIL(FL_ERR_INTERNAL, "%s: cannot map the device arena (%zu bytes): %s", fl_emu_profile.name, size,
                strerror(errno));
    }
    a->dev = dev;
    a->rw = rw;
    a->size = size;
    pthread_mutex_init(&a->mu, NULL);
    return FL_OK;
}

static size_t bucket(size_t off) { return (off / PAGE) % NBUCKETS; }

int fl_emu_far_alloc(int device, size_t nbytes, void **ptr) {
    arena_t *a = &arenas[device];
    size_t len = (nbytes + PAGE - 1) / PAGE * PAGE;
    if (len == 0) len = PAGE; /* a unique pointer for an empty tensor */
    sized_t *rec = malloc(sizeof *rec);
    if (!rec) FL_FAIL(FL_ERR_OOM, "%s: host memory exhausted", fl_emu_profile.name);
    pthread_mutex_lock(&a->mu);
    size_t off = (size_t)-1;
    for (span_t **pp = &a->free_spans; *pp; pp = &(*pp)->next) {
        span_t *s = *pp;
        if (s->len < len) continue;
        off = s->off;
        s->off += len;
        s->len -= len;
        if (!s->len) {
            *pp = s->next;
            free(s);
        }
        break;
    }
    if (off == (size_t)-1 && a->size - a->bump >= len) {
        off = a->bump;
        a->bump += len;
    }
    if (off == (size_t)-1) {
        pthread_mutex_unlock(&a->mu);
        free(rec);
        FL_FAIL(FL_ERR_OOM, "%s: device %d's address space (%zu bytes) is too fragmented for %zu bytes",
                fl_emu_profile.name, device, a->size, nbytes);
    }
    rec->off = off;
    rec->len = len;
    rec->req = nbytes;
    rec->next = a->live[bucket(off)];
    a->live[bucket(off)] = rec;
    pthread_mutex_unlock(&a->mu);
    *ptr = a->dev + off;
    return FL_OK;
}

static void release(arena_t *a, size_t off, size_t len) {
    madvise(a->rw + off, len, MADV_REMOVE); /* the pages go back to the host */
    pthread_mutex_lock(&a->mu);
    span_t *prev = NULL, **pp = &a->free_spans;
    while (*pp && (*pp)->off < off) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    span_t *next = *pp;
    if (prev && prev->off + prev->len == off) {
        prev->len += len;
        if (next && prev->off + prev->len == next->off) {
            prev->len += next->len;
            prev->next = next->next;
            free(next);
        }
    } else if (next && off + len == next->off) {
        next->off = off;
        next->len += len;
    } else {
        span_t *s = malloc(sizeof *s);
        if (s) { /* without it the range is lost to this arena, nothing worse */
            s->off = off;
            s->len = len;
            s->next = next;
            *pp = s;
        }
    }
    pthread_mutex_unlock(&a->mu);
}

typedef struct { arena_t *a; size_t off, len; } free_job_t;

static int free_job(void *arg) {
    free_job_t *j = arg;
    release(j->a, j->off, j->len);
    free(j);
    return FL_OK;
}

int fl_emu_far_free(int device, void *ptr, size_t *nbytes) {
    arena_t *a = &arenas[device];
    char *p = ptr;
    if (p < a->dev || p >= a->dev + a->size)
        FL_FAIL(FL_ERR_INVALID, "%s: free of %p, which is not device %d's memory", fl_emu_profile.name, ptr, device);
    size_t off = (size_t)(p - a->dev);
    pthread_mutex_lock(&a->mu);
    sized_t *rec = NULL;
    for (sized_t **pp = &a->live[bucket(off)]; *pp; pp = &(*pp)->next)
        if ((*pp)->off == off) {
            rec = *pp;
            *pp = rec->next;
            break;
        }
    pthread_mutex_unlock(&a->mu);
    if (!rec) FL_FAIL(FL_ERR_INVALID, "%s: free of %p, which malloc did not return (or was freed)", fl_emu_profile.name, ptr);
    free_job_t *j = malloc(sizeof *j);
    size_t len = rec->len;
    *nbytes = rec->req;
    free(rec);
    if (!j) { /* no memory to queue it: wait for the queue, then release now */
        int st = fl_emu_stream_synchronize(device, NULL);
        release(a, off, len);
        return st;
    }
    j->a = a;
    j->off = off;
    j->len = len;
    return fl_emu_submit(device, NULL, free_job, j, 0); /* after the kernels queued before it */
}

void *fl_emu_far_host(const void *device_ptr) {
    const char *p = device_ptr;
    for (int i = 0; i < n_arenas; i++) {
        arena_t *a = &arenas[i];
        if (p >= a->dev && p < a->dev + a->size) return a->rw + (p - a->dev);
    }
    return (void *)device_ptr; /* host memory (the other end of a copy) */
}

/* ------------------------------------------------------------- configuration ---- */

int fl_emu_async_configure(int n_devices, uint64_t mem_limit) {
    if (async_on >= 0) return FL_OK;
    const char *v = getenv("FL_EMU_ASYNC");
    if (!v || !*v || strcmp(v, "0") == 0) {
        async_on = 0;
        return FL_OK;
    }
    if (strcmp(v, "1") != 0)
        FL_FAIL(FL_ERR_INVALID, "FL_EMU_ASYNC=%s: use 1 (emulated chips run kernels asynchronously, memory "
                "unreadable from the host) or 0", v);
    /* room for the allocator's page rounding and fragmentation; address space only, no memory */
    uint64_t size = mem_limit * 4 + (1ull << 30);
    if (size > (1ull << 40)) size = 1ull << 40;
    for (int d = 0; d < n_devices && d < FL_EMU_MAX_DEVICES; d++) {
        int st = arena_init(&arenas[d], d, (size_t)size);
        if (st) return st;
        n_arenas = d + 1;
    }
    int st = fl_emu_default_streams_start(n_devices);
    if (st) return st;
    async_on = 1;
    return FL_OK;
}

/* ------------------------------------------------------------ kernel launches ---- */

#define FL_EMU_SLOTS 4096

typedef struct {
    fl_kernel_fn fn;
    const char *op;
    int always_wait; /* errors depend on the data */
} slot_t;

static slot_t slots[FL_EMU_SLOTS];
static atomic_int n_slots;

typedef struct {
    fl_kernel_fn fn;
    const char *op;
    int waited; /* the caller waits: its own status and message are the call's */
    int device, ni, no, na;
    fl_tensor_t *in, *out;
    fl_arg_t *args;
} job_t;

static int run_job(void *arg) {
    job_t *j = arg;
    fl_host_set_error("%s", "");
    int st = j->fn(NULL, j->device, j->in, j->ni, j->out, j->no, j->args, j->na);
    if (st != FL_OK && !j->waited) { /* reported by a later call: say which kernel it was */
        char msg[400];
        snprintf(msg, sizeof msg, "%s", fl_host_last_error());
        fl_host_set_error("%s (status %d): %s", j->op, st, *msg ? msg : "the kernel left no message");
    }
    free(j);
    return st;
}

/* signatures that completed once: later calls with them are queued without waiting */
#define SEEN_SIZE (1u << 16)
static uint64_t seen[SEEN_SIZE];
static unsigned n_seen;
static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0x100000001b3ull;
}

static uint64_t hash_tensor(uint64_t h, const fl_tensor_t *t) {
    h = mix(h, (uint64_t)(uint32_t)t->dtype << 32 | (uint32_t)t->ndim);
    h = mix(h, (uint64_t)t->offset & 15);
    h = mix(h, t->data == NULL);
    for (int d = 0; d < t->ndim && d < FL_MAX_DIMS; d++) h = mix(mix(h, (uint64_t)t->sizes[d]), (uint64_t)t->strides[d]);
    return h;
}

static uint64_t signature(int slot, const fl_tensor_t *in, int ni, const fl_tensor_t *out, int no, const fl_arg_t *a,
                          int na) {
    uint64_t h = mix(0xcbf29ce484222325ull, (uint64_t)slot);
    h = mix(h, (uint64_t)ni << 40 | (uint64_t)no << 20 | (uint64_t)na);
    for (int i = 0; i < ni; i++) h = hash_tensor(h, &in[i]);
    for (int i = 0; i < no; i++) h = hash_tensor(h, &out[i]);
    for (int i = 0; i < na; i++) {
        uint64_t f;
        memcpy(&f, &a[i].f, sizeof f);
        h = mix(mix(mix(h, (uint64_t)a[i].kind << 32 | (uint32_t)a[i].len), (uint64_t)a[i].i), f);
        for (int k = 0; k < a[i].len && k < FL_MAX_DIMS; k++) h = mix(h, (uint64_t)a[i].list[k]);
    }
    return h ? h : 1;
}

static int seen_has(uint64_t h, int insert) {
    pthread_mutex_lock(&seen_mu);
    unsigned i = (unsigned)h & (SEEN_SIZE - 1);
    int found = 0;
    while (seen[i]) {
        if (seen[i] == h) { found = 1; break; }
        i = (i + 1) & (SEEN_SIZE - 1);
    }
    if (!found && insert) {
        if (n_seen >= SEEN_SIZE / 2) { /* full: start over (those calls wait once more) */
            memset(seen, 0, sizeof seen);
            n_seen = 0;
            i = (unsigned)h & (SEEN_SIZE - 1);
        }
        seen[i] = h;
        n_seen++;
    }
    pthread_mutex_unlock(&seen_mu);
    return found;
}

static void translate(fl_tensor_t *t, int n) {
    for (int i = 0; i < n; i++)
        if (t[i].data) t[i].data = fl_emu_far_host(t[i].data);
}

static int launch(int slot, fl_stream_t stream, int device, const fl_tensor_t *in, int ni, const fl_tensor_t *out,
                  int no, const fl_arg_t *args, int na) {
    const slot_t *k = &slots[slot];
    if (ni < 0 || no < 0 || na < 0 || (ni && !in) || (no && !out) || (na && !args))
        FL_FAIL(FL_ERR_INVALID, "%s: %s called with inconsistent array counts", fl_emu_profile.name, k->op);
    size_t bytes = sizeof(job_t) + (size_t)(ni + no) * sizeof(fl_tensor_t) + (size_t)na * sizeof(fl_arg_t);
    job_t *j = malloc(bytes);
    if (!j) FL_FAIL(FL_ERR_OOM, "%s: cannot queue %s", fl_emu_profile.name, k->op);
    j->fn = k->fn;
    j->op = k->op;
    j->device = device;
    j->ni = ni;
    j->no = no;
    j->na = na;
    j->in = (fl_tensor_t *)(j + 1);
    j->out = j->in + ni;
    j->args = (fl_arg_t *)(j->out + no);
    if (ni) memcpy(j->in, in, (size_t)ni * sizeof *in);
    if (no) memcpy(j->out, out, (size_t)no * sizeof *out);
    if (na) memcpy(j->args, args, (size_t)na * sizeof *args);
    translate(j->in, ni);
    translate(j->out, no);
    uint64_t sig = signature(slot, in, ni, out, no, args, na);
    int wait = k->always_wait || !seen_has(sig, 0);
    j->waited = wait;
    int st = fl_emu_submit(device, stream, run_job, j, wait);
    if (wait && st == FL_OK && !k->always_wait) seen_has(sig, 1);
    return st;
}

/* FL_EMU_SLOTS trampolines, tramp_x<base-4 digits>, each calling launch() with its own slot number */
#define TR_ARGS fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na
#define TR(p, v) static int tramp_##p(TR_ARGS) { return launch((v), s, d, i, ni, o, no, a, na); }
#define TR1(p, v) TR(p##0, (v)*4) TR(p##1, (v)*4 + 1) TR(p##2, (v)*4 + 2) TR(p##3, (v)*4 + 3)
#define TR2(p, v) TR1(p##0, (v)*4) TR1(p##1, (v)*4 + 1) TR1(p##2, (v)*4 + 2) TR1(p##3, (v)*4 + 3)
#define TR3(p, v) TR2(p##0, (v)*4) TR2(p##1, (v)*4 + 1) TR2(p##2, (v)*4 + 2) TR2(p##3, (v)*4 + 3)
#define TR4(p, v) TR3(p##0, (v)*4) TR3(p##1, (v)*4 + 1) TR3(p##2, (v)*4 + 2) TR3(p##3, (v)*4 + 3)
#define TR5(p, v) TR4(p##0, (v)*4) TR4(p##1, (v)*4 + 1) TR4(p##2, (v)*4 + 2) TR4(p##3, (v)*4 + 3)
#define TR6(p, v) TR5(p##0, (v)*4) TR5(p##1, (v)*4 + 1) TR5(p##2, (v)*4 + 2) TR5(p##3, (v)*4 + 3)
TR6(x, 0)
#define RF(p) tramp_##p,
#define RF1(p) RF(p##0) RF(p##1) RF(p##2) RF(p##3)
#define RF2(p) RF1(p##0) RF1(p##1) RF1(p##2) RF1(p##3)
#define RF3(p) RF2(p##0) RF2(p##1) RF2(p##2) RF2(p##3)
#define RF4(p) RF3(p##0) RF3(p##1) RF3(p##2) RF3(p##3)
#define RF5(p) RF4(p##0) RF4(p##1) RF4(p##2) RF4(p##3)
#define RF6(p) RF5(p##0) RF5(p##1) RF5(p##2) RF5(p##3)
static const fl_kernel_fn trampolines[FL_EMU_SLOTS] = {RF6(x)};

/* ops whose kernels refuse calls by the values in their tensors (indices, targets): these run to
 * completion before the call returns, so the error is the call's */
static const char *const data_checked[] = {
    "index", "gather", "scatter", "take", "put", "embedding", "nll_loss", "multi_margin", "multilabel",
    "bincount", "histc", "repeat_interleave", "cross_entropy", "one_hot", "multinomial", "binary_cross_entropy",
    "_assert", "max_unpool", "segment_reduce", "ctc_loss", "bucketize", "searchsorted", NULL};

fl_kernel_fn fl_emu_async_wrap(const char *op, fl_kernel_fn fn) {
    int slot = atomic_fetch_add(&n_slots, 1);
    if (slot >= FL_EMU_SLOTS) {
        atomic_fetch_sub(&n_slots, 1);
        return NULL;
    }
    slots[slot].fn = fn;
    /* a copy: a JIT kernel's symbol is the caller's buffer (a slot lives as long as the process) */
    char *name = strdup(op ? op : "a JIT kernel");
    slots[slot].op = name ? name : "a kernel";
    slots[slot].always_wait = 0;
    for (const char *const *w = data_checked; op && *w; w++)
        if (strstr(op, *w)) slots[slot].always_wait = 1;
    return trampolines[slot];
}

/* ---------------------------------------------------------------- collectives ---- */

/* The shared-memory collectives read and write through the tensors' pointers on the calling thread:
 * they wait for the queued work first (the gradient a kernel is still computing), then use the
 * read-write view. */
static fl_plugin_t base_comm;

static int comm_ready(int device, const fl_tensor_t *t, fl_tensor_t *local) {
    int st = fl_emu_stream_synchronize(device, NULL);
    if (st) return st;
    *local = *t;
    translate(local, 1);
    return FL_OK;
}
static int c_all_reduce(int device, const fl_tensor_t *t, int op, void *comm) {
    fl_tensor_t x;
    int st = comm_ready(device, t, &x);
    return st ? st : base_comm.comm_all_reduce(device, &x, op, comm);
}
static int c_broadcast(int device, const fl_tensor_t *t, int root, void *comm) {
    fl_tensor_t x;
    int st = comm_ready(device, t, &x);
    return st ? st : base_comm.comm_broadcast(device, &x, root, comm);
}
static int c_all_gather(int device, const fl_tensor_t *in, const fl_tensor_t *out, void *comm) {
    fl_tensor_t x, y;
    int st = comm_ready(device, in, &x);
    if (!st) st = comm_ready(device, out, &y);
    return st ? st : base_comm.comm_all_gather(device, &x, &y, comm);
}
static int c_reduce_scatter(int device, const fl_tensor_t *in, const fl_tensor_t *out, int op, void *comm) {
    fl_tensor_t x, y;
    int st = comm_ready(device, in, &x);
    if (!st) st = comm_ready(device, out, &y);
    return st ? st : base_comm.comm_reduce_scatter(device, &x, &y, op, comm);
}
static int c_send(int device, const fl_tensor_t *t, int peer, void *comm) {
    fl_tensor_t x;
    int st = comm_ready(device, t, &x);
    return st ? st : base_comm.comm_send(device, &x, peer, comm);
}
static int c_recv(int device, const fl_tensor_t *t, int peer, void *comm) {
    fl_tensor_t x;
    int st = comm_ready(device, t, &x);
    return st ? st : base_comm.comm_recv(device, &x, peer, comm);
}

void fl_emu_async_wrap_comm(fl_plugin_t *p) {
    base_comm = *p;
    if (p->comm_all_reduce) p->comm_all_reduce = c_all_reduce;
    if (p->comm_broadcast) p->comm_broadcast = c_broadcast;
    if (p->comm_all_gather) p->comm_all_gather = c_all_gather;
    if (p->comm_reduce_scatter) p->comm_reduce_scatter = c_reduce_scatter;
    if (p->comm_send) p->comm_send = c_send;
    if (p->comm_recv) p->comm_recv = c_recv;
}
