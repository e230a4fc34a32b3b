/*
 * opencl.c — the torch_fl OpenCL backend ("opencl").
 *
 * Every OpenCL device of every platform becomes one fl device. libOpenCL.so.1
 * (the ICD loader) is opened at run time with dlopen, so this library builds and
 * loads on machines without OpenCL headers or drivers (fl_plugin_init then
 * returns FL_ERR_UNSUPPORTED and says how to install one).
 *
 * Memory: the ABI passes raw addresses (allocation base + byte offset), OpenCL
 * has cl_mem handles. Each device reserves a PROT_NONE virtual range; malloc
 * hands out addresses from it (first fit over an address-ordered free list with
 * coalescing, 256-byte alignment) backed by one cl_mem per allocation, and any
 * address inside an allocation maps back to (cl_mem, byte offset) through a
 * sorted table. The host can never dereference those addresses.
 *
 * Kernels: OpenCL C kept in kernels_cl.h, built per device and compute type at
 * first use, enqueued on an in-order profiling queue (FL_FEATURE_ASYNC_KERNELS).
 *
 * Device JIT (FL_JIT_OPENCL_C): jit_build compiles the kernels torch_fl generates,
 * jit_launch runs them with fl_plugin.h's launch convention (meta, status, one
 * buffer per tensor).
 *
 * Program binaries: every build (the plugin's programs and the JIT's) goes through
 * an on-disk cache of the driver's binaries, private to the user and checked
 * against a SHA-256 before each load (bincache.c says where it is and its rules).
 * FL_OPENCL_CACHE=0 turns it off (every program is built from source), =1 on for
 * every program; unset, it is on except that on a driver that keeps its own cache
 * of built programs (pocl with its POCL_KERNEL_CACHE on) only programs of a few
 * kernels (the JIT's) are stored: build_identity says why.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

#include "fl_plugin.h"
#include "fl_kernel_util.h"
#include "cl_min.h"
#include "kernels_cl.h"
#include "bincache.h"
#include "clblast.h"

#define NAME "opencl"
#define UNSUP FL_ERR_UNSUPPORTED
#define ALIGN 256

/* ------------------------------------------------------------------ errors */
static _Thread_local char tl_err[4096];
__attribute__((format(printf, 2, 3))) static int fail(int st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_err, sizeof tl_err, fmt, ap);
    va_end(ap);
    return st;
}
static const char *last_error(void) { return tl_err; }

/* ------------------------------------------------------------------ the CL library */
static struct {
    void *lib;
#define F(n) PFN_##n n;
    F(clGetPlatformIDs) F(clGetPlatformInfo) F(clGetDeviceIDs) F(clGetDeviceInfo) F(clCreateContext)
    F(clCreateCommandQueue) F(clReleaseCommandQueue) F(clCreateBuffer) F(clReleaseMemObject)
    F(clCreateProgramWithSource) F(clBuildProgram) F(clGetProgramBuildInfo) F(clReleaseProgram) F(clCreateKernel)
    F(clSetKernelArg) F(clEnqueueNDRangeKernel) F(clEnqueueReadBuffer) F(clEnqueueWriteBuffer) F(clEnqueueCopyBuffer)
    F(clEnqueueFillBuffer) F(clEnqueueMarkerWithWaitList) F(clFinish) F(clFlush) F(clWaitForEvents) F(clGetEventInfo)
    F(clGetEventProfilingInfo) F(clReleaseEvent) F(clCreateProgramWithBinary) F(clGetProgramInfo) F(clGetKernelInfo)
    F(clGetKernelWorkGroupInfo) F(clReleaseKernel)
#undef F
} cl;

/* ------------------------------------------------------------------ devices */
typedef struct { uintptr_t addr; size_t size, nbytes; cl_mem mem; } blk_t;  /* live allocation */
typedef struct { uintptr_t addr; size_t size; } ext_t;               /* free extent */

#define NPROG 40
#define KSLOTS 512
typedef struct { char name[48]; cl_kernel k; } kslot_t;

typedef struct {
    cl_platform_id plat;
    cl_device_id id;
    cl_context ctx;
    cl_command_queue q;
    char name[64], vendor[64];
    uint64_t mem_total, max_alloc;
    int cus, fp64;
    int host_cpu; /* CL_DEVICE_TYPE_CPU: the host's own cores (pocl) */
    char opts[64];     /* the build options of every program (language version, fp64) */
    char ident[1024];  /* platform and device names and versions: part of the binary cache's key */
    int bincache;      /* 0: no binary cache, 1: every program, 2: only programs of a few kernels (build_identity) */
    cl_mem scratch;    /* zeroed bytes the JIT binds where any buffer will do (never read back) */
    /* allocator */
    pthread_mutex_t mlock;
    uintptr_t vbase, rover;
    size_t vsize;
    blk_t *blks; int nblk, capblk;
    ext_t *free_; int nfree, capfree;
    uint64_t used;
    /* programs and kernels */
    pthread_mutex_t klock;
    struct { char key[32]; cl_program p; } progs[NPROG];
    int nprog;
    kslot_t ks[KSLOTS];
    /* rng */
    pthread_mutex_t rlock;
    uint64_t seed, offset;
    /* streams created (so synchronize can finish them) */
    cl_command_queue *streams; int nstreams, capstreams;
    /* device-side error flag (int code, pad, long value), read back after kernels that check data */
    pthread_mutex_t elock;
    cl_mem errm;
} dev_t_;

static dev_t_ *devs;
static int ndev;
static const char *g_vendor = "unknown";
static char g_vendor_buf[128];

static int chk(int device, dev_t_ **d) {
    if (device < 0 || device >= ndev) return fail(FL_ERR_INVALID, NAME ": no device %d (there are %d)", device, ndev);
    *d = &devs[device];
    return FL_OK;
}
#define DEV(device) dev_t_ *D = NULL; { int st_ = chk(device, &D); if (st_) return st_; }

static int device_count(int *c) { if (!c) return fail(FL_ERR_INVALID, NAME ": NULL"); *c = ndev; return FL_OK; }

static uint32_t dev_dtypes(const dev_t_ *D) {
    uint32_t m = FL_DTYPE_BIT(FL_FLOAT32) | FL_DTYPE_BIT(FL_INT64) | FL_DTYPE_BIT(FL_INT32) | FL_DTYPE_BIT(FL_INT16) |
                 FL_DTYPE_BIT(FL_INT8) | FL_DTYPE_BIT(FL_UINT8) | FL_DTYPE_BIT(FL_BOOL);
    if (D->fp64) m |= FL_DTYPE_BIT(FL_FLOAT64);
    m |= FL_DTYPE_BIT(FL_FLOAT16); /* storage and conversions (vload_half / vstore_half: OpenCL 1.2 core) */
    return m;
}

static int device_props(int device, fl_device_props_t *p) {
    DEV(device);
    if (!p) return fail(FL_ERR_INVALID, NAME ": device_props(NULL)");
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", D->name);
    p->total_memory = D->mem_total;
    p->dtypes = dev_dtypes(D);
    /* copies on a stream other than NULL are non-blocking enqueues on that stream's queue (copy_h2d) */
    p->features = FL_FEATURE_ASYNC_KERNELS | FL_FEATURE_ASYNC_COPY | (D->host_cpu ? FL_FEATURE_HOST_CPU : 0);
    p->compute_units = D->cus;
    return FL_OK;
}

/* ------------------------------------------------------------------ memory */
static int blk_find(dev_t_ *D, uintptr_t a) { /* index of the block containing a, or -1 (mlock held) */
    int lo = 0, hi = D->nblk - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        blk_t *b = &D->blks[mid];
        if (a < b->addr) hi = mid - 1;
        else if (a >= b->addr + (b->size ? b->size : 1)) lo = mid + 1;
        else return mid;
    }
    return -1;
}

/* (cl_mem, byte offset) of a device address; NULL mem when unknown */
static cl_mem resolve(dev_t_ *D, const void *p, size_t *off, size_t *room) {
    pthread_mutex_lock(&D->mlock);
    int i = blk_find(D, (uintptr_t)p);
    cl_mem m = NULL;
    if (i >= 0) {
        m = D->blks[i].mem;
        *off = (uintptr_t)p - D->blks[i].addr;
        if (room) *room = D->blks[i].nbytes > *off ? D->blks[i].nbytes - *off : 0; /* the cl_mem's bytes, not the span */
    }
    pthread_mutex_unlock(&D->mlock);
    return m;
}

static int dev_malloc(int device, size_t nbytes, void **ptr) {
    DEV(device);
    if (!ptr) return fail(FL_ERR_INVALID, NAME ": malloc with a NULL result pointer");
    *ptr = NULL;
    if (nbytes > D->mem_total)
        return fail(FL_ERR_OOM, NAME ": cannot allocate %zu bytes on %s: the device has %llu bytes", nbytes, D->name,
                    (unsigned long long)D->mem_total);
    if (nbytes > D->max_alloc)
        return fail(FL_ERR_OOM, NAME ": %zu bytes exceed the device's largest allocation (CL_DEVICE_MAX_MEM_ALLOC_SIZE %llu)",
                    nbytes, (unsigned long long)D->max_alloc);
    size_t span = nbytes ? (nbytes + ALIGN - 1) / ALIGN * ALIGN : ALIGN;
    pthread_mutex_lock(&D->mlock);
    if (D->used + nbytes > D->mem_total) {
        uint64_t u = D->used;
        pthread_mutex_unlock(&D->mlock);
        return fail(FL_ERR_OOM, NAME ": cannot allocate %zu bytes on %s: %llu of %llu bytes in use", nbytes, D->name,
                    (unsigned long long)u, (unsigned long long)D->mem_total);
    }
    D->used += nbytes; /* reserved now, given back on any failure below */
    pthread_mutex_unlock(&D->mlock);
    cl_mem m = NULL;
    if (nbytes) {
        cl_int e = 0;
        m = cl.clCreateBuffer(D->ctx, CL_MEM_READ_WRITE, nbytes, NULL, &e);
        if (!m || e) {
            pthread_mutex_lock(&D->mlock); D->used -= nbytes; pthread_mutex_unlock(&D->mlock);
            return fail(FL_ERR_OOM, NAME ": clCreateBuffer(%zu bytes) failed with OpenCL error %d", nbytes, e);
        }
    }
    pthread_mutex_lock(&D->mlock);
    int f = -1;
    /* next fit from a rover: freed addresses are not handed out again until the range wraps, so a stale
     * pointer to a freed block fails loudly (not device memory) instead of aliasing a new allocation */
    for (int i = 0; i < D->nfree; i++) if (D->free_[i].size >= span && D->free_[i].addr + D->free_[i].size > D->rover) {
        f = i; break; }
    if (f < 0) for (int i = 0; i < D->nfree; i++) if (D->free_[i].size >= span) { f = i; break; }
    if (f < 0) goto nospace;
    if (D->nblk == D->capblk) {
        int nc = D->capblk ? 2 * D->capblk : 1024;
        blk_t *nb = realloc(D->blks, (size_t)nc * sizeof(blk_t));
        if (!nb) goto nospace;
        D->blks = nb; D->capblk = nc;
    }
    uintptr_t a = D->free_[f].addr;
    if (a < D->rover && D->rover + span <= D->free_[f].addr + D->free_[f].size) { /* split: take from the rover on */
        size_t pre = D->rover - a;
        if (D->nfree == D->capfree) {
            ext_t *ne = realloc(D->free_, (size_t)(2 * D->capfree) * sizeof(ext_t));
            if (!ne) goto nospace;
            D->free_ = ne; D->capfree *= 2;
        }
        memmove(&D->free_[f + 1], &D->free_[f], (size_t)(D->nfree - f) * sizeof(ext_t));
        D->nfree++;
        D->free_[f].size = pre;
        f++;
        D->free_[f].addr = D->rover;
        D->free_[f].size -= pre;
        a = D->rover;
    }
    D->rover = a + span;
    D->free_[f].addr += span;
    D->free_[f].size -= span;
    if (!D->free_[f].size) { memmove(&D->free_[f], &D->free_[f + 1], (size_t)(D->nfree - f - 1) * sizeof(ext_t)); D->nfree--; }
    int lo = 0, hi = D->nblk; /* insertion point, sorted by address */
    while (lo < hi) { int mid = (lo + hi) / 2; if (D->blks[mid].addr < a) lo = mid + 1; else hi = mid; }
    memmove(&D->blks[lo + 1], &D->blks[lo], (size_t)(D->nblk - lo) * sizeof(blk_t));
    D->blks[lo] = (blk_t){a, span, nbytes, m};
    D->nblk++;
    pthread_mutex_unlock(&D->mlock);
    *ptr = (void *)a;
    return FL_OK;
nospace:
    D->used -= nbytes;
    pthread_mutex_unlock(&D->mlock);
    if (m) cl.clReleaseMemObject(m);
    return fail(FL_ERR_OOM, NAME ": out of device address space (or host memory) for %zu bytes", nbytes);
}

static int dev_free(int device, void *ptr) {
    DEV(device);
    if (!ptr) return FL_OK;
    pthread_mutex_lock(&D->mlock);
    int i = blk_find(D, (uintptr_t)ptr);
    if (i < 0 || D->blks[i].addr != (uintptr_t)ptr) {
        pthread_mutex_unlock(&D->mlock);
        return fail(FL_ERR_INVALID, NAME ": free(%p): not a pointer this plugin's malloc returned (or freed twice)", ptr);
    }
    blk_t b = D->blks[i];
    memmove(&D->blks[i], &D->blks[i + 1], (size_t)(D->nblk - i - 1) * sizeof(blk_t));
    D->nblk--;
    D->used -= b.nbytes;
    int pos = 0;
    while (pos < D->nfree && D->free_[pos].addr < b.addr) pos++;
    if (D->nfree == D->capfree) {
        int nc = D->capfree ? 2 * D->capfree : 1024;
        ext_t *ne = realloc(D->free_, (size_t)nc * sizeof(ext_t));
        if (ne) { D->free_ = ne; D->capfree = nc; }
    }
    if (D->nfree < D->capfree) { /* (else the range leaks: host out of memory) */
        memmove(&D->free_[pos + 1], &D->free_[pos], (size_t)(D->nfree - pos) * sizeof(ext_t));
        D->free_[pos] = (ext_t){b.addr, b.size};
        D->nfree++;
        if (pos + 1 < D->nfree && D->free_[pos].addr + D->free_[pos].size == D->free_[pos + 1].addr) {
            D->free_[pos].size += D->free_[pos + 1].size;
            memmove(&D->free_[pos + 1], &D->free_[pos + 2], (size_t)(D->nfree - pos - 2) * sizeof(ext_t));
            D->nfree--;
        }
        if (pos > 0 && D->free_[pos - 1].addr + D->free_[pos - 1].size == D->free_[pos].addr) {
            D->free_[pos - 1].size += D->free_[pos].size;
            memmove(&D->free_[pos], &D->free_[pos + 1], (size_t)(D->nfree - pos - 1) * sizeof(ext_t));
            D->nfree--;
        }
    }
    pthread_mutex_unlock(&D->mlock);
    /* OpenCL keeps the object alive until the commands queued on it have finished */
    if (b.mem) cl.clReleaseMemObject(b.mem);
    return FL_OK;
}

static int memory_used(int device, uint64_t *bytes) {
    DEV(device);
    if (!bytes) return fail(FL_ERR_INVALID, NAME ": memory_used(NULL)");
    pthread_mutex_lock(&D->mlock);
    *bytes = D->used;
    pthread_mutex_unlock(&D->mlock);
    return FL_OK;
}

/* ------------------------------------------------------------------ streams and events */
static cl_command_queue qof(dev_t_ *D, fl_stream_t s) { return s ? (cl_command_queue)s : D->q; }

static int stream_create(int device, fl_stream_t *s) {
    DEV(device);
    if (!s) return fail(FL_ERR_INVALID, NAME ": stream_create(NULL)");
    cl_int e = 0;
    cl_command_queue q = cl.clCreateCommandQueue(D->ctx, D->id, CL_QUEUE_PROFILING_ENABLE, &e);
    if (!q || e) return fail(FL_ERR_INTERNAL, NAME ": clCreateCommandQueue failed with OpenCL error %d", e);
    pthread_mutex_lock(&D->klock);
    if (D->nstreams == D->capstreams) {
        int nc = D->capstreams ? 2 * D->capstreams : 16;
        cl_command_queue *ns = realloc(D->streams, (size_t)nc * sizeof *ns);
        if (!ns) { pthread_mutex_unlock(&D->klock); cl.clReleaseCommandQueue(q); return fail(FL_ERR_OOM, NAME ": host out of memory"); }
        D->streams = ns; D->capstreams = nc;
    }
    D->streams[D->nstreams++] = q;
    pthread_mutex_unlock(&D->klock);
    *s = (fl_stream_t)q;
    return FL_OK;
}
static int stream_destroy(int device, fl_stream_t s) {
    DEV(device);
    if (!s) return FL_OK;
    pthread_mutex_lock(&D->klock);
    int found = 0;
    for (int i = 0; i < D->nstreams; i++)
        if (D->streams[i] == (cl_command_queue)s) { D->streams[i] = D->streams[--D->nstreams]; found = 1; break; }
    pthread_mutex_unlock(&D->klock);
    if (!found) return fail(FL_ERR_INVALID, NAME ": stream_destroy: unknown stream %p", s);
    cl.clFinish((cl_command_queue)s);
    cl.clReleaseCommandQueue((cl_command_queue)s);
    return FL_OK;
}
static int stream_sync(int device, fl_stream_t s) {
    DEV(device);
    cl_int e = cl.clFinish(qof(D, s));
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clFinish failed with OpenCL error %d", e);
    return FL_OK;
}
typedef struct { cl_event e; } ev_t;
static int event_create(int device, fl_event_t *ev) {
    DEV(device); (void)D;
    if (!ev) return fail(FL_ERR_INVALID, NAME ": event_create(NULL)");
    ev_t *x = calloc(1, sizeof *x);
    if (!x) return fail(FL_ERR_OOM, NAME ": host out of memory");
    *ev = x;
    return FL_OK;
}
static int event_destroy(int device, fl_event_t ev) {
    DEV(device); (void)D;
    ev_t *x = ev;
    if (!x) return FL_OK;
    if (x->e) cl.clReleaseEvent(x->e);
    free(x);
    return FL_OK;
}
static int event_record(int device, fl_event_t ev, fl_stream_t s) {
    DEV(device);
    ev_t *x = ev;
    if (!x) return fail(FL_ERR_INVALID, NAME ": event_record(NULL)");
    cl_event ne = NULL;
    cl_int e = cl.clEnqueueMarkerWithWaitList(qof(D, s), 0, NULL, &ne);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clEnqueueMarkerWithWaitList failed with OpenCL error %d", e);
    if (x->e) cl.clReleaseEvent(x->e);
    x->e = ne;
    cl.clFlush(qof(D, s));
    return FL_OK;
}
/* Later commands on the stream's queue wait for the event: a marker with a wait list, which on an in-order
 * queue (torch_fl creates only those) holds back everything enqueued after it. */
static int stream_wait_event(int device, fl_stream_t s, fl_event_t ev) {
    DEV(device);
    ev_t *x = ev;
    if (!x) return fail(FL_ERR_INVALID, NAME ": stream_wait_event(NULL event)");
    if (!x->e) return FL_OK; /* never recorded: complete */
    cl_int e = cl.clEnqueueMarkerWithWaitList(qof(D, s), 1, &x->e, NULL);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clEnqueueMarkerWithWaitList (a wait on an event) failed with OpenCL error %d", e);
    return FL_OK;
}
static int event_sync(int device, fl_event_t ev) {
    DEV(device); (void)D;
    ev_t *x = ev;
    if (!x || !x->e) return FL_OK;
    cl_int e = cl.clWaitForEvents(1, &x->e);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clWaitForEvents failed with OpenCL error %d (a kernel before this event failed)", e);
    return FL_OK;
}
static int event_query(int device, fl_event_t ev, int *done) {
    DEV(device); (void)D;
    ev_t *x = ev;
    if (!done) return fail(FL_ERR_INVALID, NAME ": event_query(NULL)");
    *done = 1;
    if (!x || !x->e) return FL_OK;
    cl_int st = 0;
    cl_int e = cl.clGetEventInfo(x->e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clGetEventInfo failed with OpenCL error %d", e);
    if (st < 0) return fail(FL_ERR_INTERNAL, NAME ": work before this event failed (OpenCL status %d)", st);
    *done = st == CL_COMPLETE;
    return FL_OK;
}
static int event_elapsed(int device, fl_event_t a, fl_event_t b, double *ms) {
    DEV(device); (void)D;
    ev_t *x = a, *y = b;
    if (!ms) return fail(FL_ERR_INVALID, NAME ": event_elapsed(NULL)");
    if (!x || !y || !x->e || !y->e) return fail(FL_ERR_INVALID, NAME ": event_elapsed on an event never recorded");
    cl.clWaitForEvents(1, &x->e);
    cl.clWaitForEvents(1, &y->e);
    cl_ulong t0 = 0, t1 = 0;
    cl_int e1 = cl.clGetEventProfilingInfo(x->e, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL);
    cl_int e2 = cl.clGetEventProfilingInfo(y->e, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    if (e1 || e2) return fail(FL_ERR_INTERNAL, NAME ": clGetEventProfilingInfo failed with OpenCL error %d", e1 ? e1 : e2);
    *ms = ((double)t1 - (double)t0) / 1e6;
    return FL_OK;
}
static int synchronize(int device) {
    DEV(device);
    cl_int e = cl.clFinish(D->q);
    pthread_mutex_lock(&D->klock);
    int n = D->nstreams;
    cl_command_queue qs[64];
    if (n > 64) n = 64;
    memcpy(qs, D->streams, (size_t)n * sizeof *qs);
    pthread_mutex_unlock(&D->klock);
    for (int i = 0; i < n && !e; i++) e = cl.clFinish(qs[i]);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clFinish failed with OpenCL error %d (a queued kernel failed)", e);
    return FL_OK;
}

/* ------------------------------------------------------------------ copies */
static int dres(dev_t_ *D, const void *p, size_t n, const char *what, cl_mem *m, size_t *off) {
    size_t room = 0;
    *m = resolve(D, p, off, &room);
    if (!*m) return fail(FL_ERR_INVALID, NAME ": %s: %p is not device memory of %s", what, p, D->name);
    if (n > room) return fail(FL_ERR_INVALID, NAME ": %s of %zu bytes runs past the end of its allocation (%zu bytes left)", what, n, room);
    return FL_OK;
}
static int copy_h2d(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    DEV(device);
    if (!n) return FL_OK;
    cl_mem m; size_t off; int st = dres(D, dst, n, "copy_h2d", &m, &off);
    if (st) return st;
    cl_int e = cl.clEnqueueWriteBuffer(qof(D, s), m, s ? CL_FALSE : CL_TRUE, off, n, src, 0, NULL, NULL);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": copy_h2d: clEnqueueWriteBuffer failed with OpenCL error %d", e);
    return FL_OK;
}
/* device -> host; blocking (NULL stream: the copy contract) or left in flight on the stream */
static int read_buffer(int device, void *dst, const void *src, size_t n, fl_stream_t s, int blocking,
                       const char *what) {
    DEV(device);
    if (!n) return FL_OK;
    cl_mem m; size_t off; int st = dres(D, src, n, what, &m, &off);
    if (st) return st;
    cl_int e = cl.clEnqueueReadBuffer(qof(D, s), m, blocking ? CL_TRUE : CL_FALSE, off, n, dst, 0, NULL, NULL);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": %s: clEnqueueReadBuffer failed with OpenCL error %d (or an earlier "
                       "kernel failed)", what, e);
    return FL_OK;
}
static int copy_d2h(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    return read_buffer(device, dst, src, n, s, s == NULL, "copy_d2h");
}
static int copy_d2h_async(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    return read_buffer(device, dst, src, n, s, 0, "copy_d2h_async");
}
static int copy_d2d(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    DEV(device);
    if (!n || dst == src) return FL_OK;
    cl_mem md, ms; size_t od, os;
    int st = dres(D, dst, n, "copy_d2d", &md, &od);
    if (!st) st = dres(D, src, n, "copy_d2d", &ms, &os);
    if (st) return st;
    cl_command_queue q = qof(D, s);
    cl_int e;
    if (md == ms && od < os + n && os < od + n) { /* overlap: clEnqueueCopyBuffer refuses it, stage */
        cl_mem t = cl.clCreateBuffer(D->ctx, CL_MEM_READ_WRITE, n, NULL, &e);
        if (!t || e) return fail(FL_ERR_OOM, NAME ": copy_d2d: no room for a %zu-byte staging buffer (OpenCL error %d)", n, e);
        e = cl.clEnqueueCopyBuffer(q, ms, t, os, 0, n, 0, NULL, NULL);
        if (!e) e = cl.clEnqueueCopyBuffer(q, t, md, 0, od, n, 0, NULL, NULL);
        cl.clReleaseMemObject(t);
    } else {
        e = cl.clEnqueueCopyBuffer(q, ms, md, os, od, n, 0, NULL, NULL);
    }
    if (e) return fail(FL_ERR_INTERNAL, NAME ": copy_d2d: clEnqueueCopyBuffer failed with OpenCL error %d", e);
    if (!s) {
        e = cl.clFinish(q);
        if (e) return fail(FL_ERR_INTERNAL, NAME ": copy_d2d: clFinish failed with OpenCL error %d", e);
    }
    return FL_OK;
}
static int mem_set(int device, void *dst, int value, size_t n, fl_stream_t s) {
    DEV(device);
    if (!n) return FL_OK;
    cl_mem m; size_t off; int st = dres(D, dst, n, "mem_set", &m, &off);
    if (st) return st;
    unsigned char pat = (unsigned char)value;
    cl_int e = cl.clEnqueueFillBuffer(qof(D, s), m, &pat, 1, off, n, 0, NULL, NULL);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": mem_set: clEnqueueFillBuffer failed with OpenCL error %d", e);
    return FL_OK;
}

/* ------------------------------------------------------------------ rng */
static int rng_set_state(int device, uint64_t seed, uint64_t offset) {
    DEV(device);
    pthread_mutex_lock(&D->rlock); D->seed = seed; D->offset = offset; pthread_mutex_unlock(&D->rlock);
    return FL_OK;
}
static int rng_get_state(int device, uint64_t *seed, uint64_t *offset) {
    DEV(device);
    if (!seed || !offset) return fail(FL_ERR_INVALID, NAME ": rng_get_state(NULL)");
    pthread_mutex_lock(&D->rlock); *seed = D->seed; *offset = D->offset; pthread_mutex_unlock(&D->rlock);
    return FL_OK;
}
static uint64_t rng_reserve(dev_t_ *D, uint64_t n, uint64_t *seed) {
    pthread_mutex_lock(&D->rlock);
    uint64_t s = D->offset; D->offset += n; *seed = D->seed;
    pthread_mutex_unlock(&D->rlock);
    return s;
}

/* ------------------------------------------------------------------ programs and kernels */
static const char *tname(int dt) {
    switch (dt) {
    case FL_FLOAT32: return "f32"; case FL_FLOAT64: return "f64"; case FL_INT64: return "i64"; case FL_INT32: return "i32";
    case FL_INT16: return "i16"; case FL_INT8: return "i8"; case FL_UINT8: return "u8"; case FL_BOOL: return "b";
    case FL_FLOAT16: return "f16";
    }
    return NULL;
}
static const char *ctype(int dt) {
    switch (dt) {
    case FL_FLOAT32: return "float"; case FL_FLOAT64: return "double"; case FL_INT64: return "long"; case FL_INT32: return "int";
    case FL_INT16: return "short"; case FL_INT8: return "char"; case FL_UINT8: case FL_BOOL: return "uchar";
    }
    return NULL;
}
/* dtypes the kernels compute in; float16 is storage only (copies, conversions, fills, cat) */
static int dt_ok(dev_t_ *D, int dt) { return tname(dt) && dt != FL_FLOAT16 && (dt != FL_FLOAT64 || D->fp64); }
static int dt_store(dev_t_ *D, int dt) { return dt == FL_FLOAT16 || dt_ok(D, dt); }
static int is_flt(int dt) { return dt == FL_FLOAT32 || dt == FL_FLOAT64; }

/* The compiler's log for a message, at most n-1 bytes: from the line of its first error on when the whole
 * log does not fit (warnings often come first). */
static void log_excerpt(const char *log, char *out, size_t n) {
    if (!log || !*log) { snprintf(out, n, "(the compiler printed no log)"); return; }
    const char *s = log, *err = strstr(log, "error");
    if (strlen(log) >= n && err) {
        while (err > log && err[-1] != '\n') err--;
        s = err;
    }
    snprintf(out, n, "%s", s);
    for (size_t k = strlen(out); k && (out[k - 1] == '\n' || out[k - 1] == ' '); k--) out[k - 1] = 0;
}

#define FEW_KERNELS 8
/* Builds src with opts for D: from the binary cache when it holds this very build (same platform, device,
 * driver, options and source), else from source, and then the driver's binary is cached. NULL when the
 * build fails: the OpenCL error in *err, the compiler's log in *log (malloc'ed, or NULL; the caller frees). */
static cl_program build_program(dev_t_ *D, const char *src, const char *opts, cl_int *err, char **log) {
    *err = 0;
    *log = NULL;
    char name[OCL_CACHE_NAME] = "";
    int cache = D->bincache;
    if (cache) {
        const char *parts[3] = {D->ident, opts, src};
        ocl_cache_name(parts, 3, name);
        unsigned char *bin = NULL;
        size_t n = 0;
        if (ocl_cache_load(name, &bin, &n)) {
            cl_int e = 0, bst = 0;
            const unsigned char *bp = bin;
            cl_program p = cl.clCreateProgramWithBinary(D->ctx, 1, &D->id, &n, &bp, &bst, &e);
            if (p && !e && !bst) e = cl.clBuildProgram(p, 1, &D->id, opts, NULL, NULL);
            free(bin);
            if (p && !e && !bst) return p;
            if (p) cl.clReleaseProgram(p);
            char why[96];
            snprintf(why, sizeof why, "the driver refused it (OpenCL error %d)", e ? e : bst);
            ocl_cache_drop(name, why);
        }
    }
    cl_int e = 0;
    cl_program p = cl.clCreateProgramWithSource(D->ctx, 1, &src, NULL, &e);
    if (!p || e) {
        *err = e ? e : -1;
        return NULL;
    }
    e = cl.clBuildProgram(p, 1, &D->id, opts, NULL, NULL);
    if (e) {
        size_t ln = 0;
        cl.clGetProgramBuildInfo(p, D->id, CL_PROGRAM_BUILD_LOG, 0, NULL, &ln);
        *log = calloc(1, ln + 1);
        if (*log && ln) cl.clGetProgramBuildInfo(p, D->id, CL_PROGRAM_BUILD_LOG, ln, *log, NULL);
        cl.clReleaseProgram(p);
        *err = e;
        return NULL;
    }
    size_t n = 0, nk = 0;
    if (cache == 2 && (cl.clGetProgramInfo(p, CL_PROGRAM_NUM_KERNELS, sizeof nk, &nk, NULL) || nk > FEW_KERNELS))
        return p;
    if (cache && !cl.clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL) && n) {
        unsigned char *bin = malloc(n);
        if (bin && !cl.clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL)) ocl_cache_store(name, bin, n);
        free(bin);
    }
    return p;
}

/* key: "ew:<t>", "red:<t>", "nn:<t>", "conv:<t>", "cvt" (klock held) */
static cl_program prog_get(dev_t_ *D, const char *key, int *st) {
    for (int i = 0; i < D->nprog; i++) if (!strcmp(D->progs[i].key, key)) return D->progs[i].p;
    if (D->nprog == NPROG) { *st = fail(FL_ERR_INTERNAL, NAME ": too many programs"); return NULL; }
    const char *src = NULL;
    char opts[512] = "";
    const char *colon = strchr(key, ':');
    int dt = -1;
    if (colon) for (int d = 0; d < FL_DTYPE_COUNT; d++) if (tname(d) && !strcmp(tname(d), colon + 1)) dt = d;
    const char *fp = D->opts; /* the language version and -DHAS_FP64 */
    if (!strcmp(key, "cvt")) { src = CL_CVT_SRC; snprintf(opts, sizeof opts, "%s", fp); }
    else if (dt >= 0) {
        const char *acc = is_flt(dt) ? (D->fp64 ? "double" : "float") : "long";
        int tn = dt == FL_FLOAT64 ? 8 : 16;
        if (!strncmp(key, "ew:", 3)) src = CL_EW_SRC;
        else if (!strncmp(key, "red:", 4)) src = CL_RED_SRC;
        else if (!strncmp(key, "nn:", 3)) src = CL_NN_SRC;
        else if (!strncmp(key, "conv:", 5)) src = CL_CONV_SRC;
        snprintf(opts, sizeof opts, "%s -DT=%s -DACC=%s%s%s -DTN=%d -DVT=%s%d -DVLOAD=vload%d -DVSTORE=vstore%d", fp, ctype(dt),
                 acc, is_flt(dt) ? " -DIS_FLOAT" : "", dt == FL_BOOL ? " -DIS_BOOL" : "", tn, ctype(dt), tn, tn, tn);
    }
    if (!src) { *st = fail(FL_ERR_INTERNAL, NAME ": unknown program %s", key); return NULL; }
    cl_int e = 0;
    char *log = NULL;
    cl_program p = build_program(D, src, opts, &e, &log);
    if (!p) {
        char ex[2800];
        log_excerpt(log, ex, sizeof ex);
        free(log);
        *st = fail(FL_ERR_INTERNAL, NAME ": building OpenCL program %s (%s) failed with error %d: %s", key, opts, e, ex);
        return NULL;
    }
    snprintf(D->progs[D->nprog].key, sizeof D->progs[D->nprog].key, "%s", key);
    D->progs[D->nprog++].p = p;
    return p;
}
static uint32_t hstr(const char *a, const char *b) {
    uint32_t h = 2166136261u;
    for (; *a; a++) h = (h ^ (uint8_t)*a) * 16777619u;
    h = (h ^ '/') * 16777619u;
    for (; *b; b++) h = (h ^ (uint8_t)*b) * 16777619u;
    return h;
}
static cl_kernel kern_get(dev_t_ *D, const char *prog, const char *kn, int *st) {
    char full[48];
    snprintf(full, sizeof full, "%s/%s", prog, kn);
    uint32_t h = hstr(prog, kn) % KSLOTS;
    for (int i = 0; i < KSLOTS; i++) {
        kslot_t *s = &D->ks[(h + i) % KSLOTS];
        if (!s->k) {
            cl_program p = prog_get(D, prog, st);
            if (!p) return NULL;
            cl_int e = 0;
            cl_kernel k = cl.clCreateKernel(p, kn, &e);
            if (!k || e) { *st = fail(FL_ERR_INTERNAL, NAME ": clCreateKernel(%s) failed with OpenCL error %d", full, e); return NULL; }
            snprintf(s->name, sizeof s->name, "%s", full);
            s->k = k;
            return k;
        }
        if (!strcmp(s->name, full)) return s->k;
    }
    *st = fail(FL_ERR_INTERNAL, NAME ": kernel cache full");
    return NULL;
}

typedef struct { size_t sz; const void *p; } karg_t;
#define KA(x) ((karg_t){sizeof(x), &(x)})
/* sets the arguments and enqueues, under the device's kernel lock (cl_kernel is not thread-safe) */
static int launch(dev_t_ *D, fl_stream_t s, const char *prog, const char *kn, int na, const karg_t *a, int dims,
                  const size_t *g, const size_t *l) {
    int st = FL_OK;
    pthread_mutex_lock(&D->klock);
    cl_kernel k = kern_get(D, prog, kn, &st);
    if (!k) { pthread_mutex_unlock(&D->klock); return st; }
    cl_int e = 0;
    for (int i = 0; i < na && !e; i++) {
        e = cl.clSetKernelArg(k, (cl_uint)i, a[i].sz, a[i].p);
        if (e) st = fail(FL_ERR_INTERNAL, NAME ": clSetKernelArg(%s/%s, %d) failed with OpenCL error %d", prog, kn, i, e);
    }
    if (!e) {
        e = cl.clEnqueueNDRangeKernel(qof(D, s), k, (cl_uint)dims, NULL, g, l, 0, NULL, NULL);
        if (e) st = fail(FL_ERR_INTERNAL, NAME ": clEnqueueNDRangeKernel(%s/%s) failed with OpenCL error %d", prog, kn, e);
    }
    pthread_mutex_unlock(&D->klock);
    return st;
}
static size_t round_up(int64_t n, int64_t m) { return (size_t)((n + m - 1) / m * m); }
static int launch1(dev_t_ *D, fl_stream_t s, const char *prog, const char *kn, int na, const karg_t *a, int64_t n) {
    if (n <= 0) return FL_OK;
    size_t g = round_up(n, 64);
    return launch(D, s, prog, kn, na, a, 1, &g, NULL);
}

/* ------------------------------------------------------------------ tensors on the device */
typedef struct { int64_t size[8]; int64_t st[4][8]; int64_t off[4]; int64_t ndim; int64_t n; } walk_t;
typedef struct { cl_mem m; int64_t off; } dt_t; /* buffer and element offset of element 0 */

static void span_of(const fl_tensor_t *t, int64_t *lo, int64_t *hi) {
    int64_t a = t->offset, b = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        int64_t e = (t->sizes[d] - 1) * t->strides[d];
        if (e > 0) b += e; else a += e;
    }
    *lo = a; *hi = b;
}
/* resolves t (checks its elements lie in its allocation); a tensor with no elements gets m = NULL */
static int tres(dev_t_ *D, const fl_tensor_t *t, dt_t *r) {
    r->m = NULL; r->off = 0;
    if (fl_numel(t) == 0) return FL_OK;
    size_t off = 0, room = 0, isz = fl_itemsize(t->dtype);
    r->m = resolve(D, t->data, &off, &room);
    if (!r->m) return fail(FL_ERR_INVALID, NAME ": tensor data %p is not memory of %s", t->data, D->name);
    if (off % isz) return UNSUP;
    int64_t lo, hi;
    span_of(t, &lo, &hi);
    if (lo < 0 || (uint64_t)(hi + 1) * isz > room)
        return fail(FL_ERR_INVALID, NAME ": tensor view (offset %lld, last element %lld) lies outside its allocation",
                    (long long)t->offset, (long long)hi);
    r->off = (int64_t)(off / isz);
    return FL_OK;
}
/* a walk over shape (sizes of ts0) for up to 4 tensors (NULL = scalar: stride 0), dims coalesced */
static void mkwalk(walk_t *w, int nd, const int64_t *sizes, int nt, const fl_tensor_t *const *ts, const int64_t *base) {
    memset(w, 0, sizeof *w);
    int64_t sz[8], st[4][8];
    int m = 0;
    w->n = 1;
    for (int d = 0; d < nd; d++) w->n *= sizes[d];
    for (int d = 0; d < nd; d++) {
        if (sizes[d] == 1) continue;
        int merge = m > 0;
        for (int k = 0; k < nt && merge; k++) {
            int64_t s = ts[k] ? ts[k]->strides[d] : 0;
            if (st[k][m - 1] != s * sizes[d]) merge = 0;
        }
        if (merge) {
            sz[m - 1] *= sizes[d];
            for (int k = 0; k < nt; k++) st[k][m - 1] = ts[k] ? ts[k]->strides[d] : 0;
            continue;
        }
        sz[m] = sizes[d];
        for (int k = 0; k < nt; k++) st[k][m] = ts[k] ? ts[k]->strides[d] : 0;
        m++;
    }
    if (m == 0) { sz[0] = 1; for (int k = 0; k < 4; k++) st[k][0] = 0; m = 1; }
    w->ndim = m;
    for (int d = 0; d < m; d++) {
        w->size[d] = sz[d];
        for (int k = 0; k < nt; k++) w->st[k][d] = st[k][d];
    }
    for (int k = 0; k < nt; k++) w->off[k] = ts[k] ? base[k] + ts[k]->offset : 0;
}

/* the parameter block prm_t of the kernels: long si[4], pi[4]; REAL sd[4], pd[4] */
typedef struct { int64_t si[4], pi[4]; unsigned char r[64]; } prm_t;
static void prm_real(dev_t_ *D, prm_t *p, int which, int k, double v) { /* which 0: sd, 1: pd */
    if (D->fp64) memcpy(p->r + which * 32 + k * 8, &v, 8);
    else { float f = (float)v; memcpy(p->r + which * 16 + k * 4, &f, 4); }
}
static size_t prm_size(dev_t_ *D) { return D->fp64 ? sizeof(prm_t) : sizeof(prm_t) - 32; }
typedef union { double d; float f; } real_t;
static karg_t ka_real(dev_t_ *D, real_t *r, double v) {
    if (D->fp64) { r->d = v; return (karg_t){8, r}; }
    r->f = (float)v; return (karg_t){4, r};
}
static cl_mem tmpbuf(dev_t_ *D, size_t n, int *st) {
    cl_int e = 0;
    cl_mem m = cl.clCreateBuffer(D->ctx, CL_MEM_READ_WRITE, n ? n : 1, NULL, &e);
    if (!m || e) { *st = fail(FL_ERR_OOM, NAME ": cannot allocate a %zu-byte temporary buffer (OpenCL error %d)", n, e); return NULL; }
    return m;
}

/* The device-side error flag. err_begin locks it (and creates it zeroed on first use); err_end always
 * unlocks: after a successful launch it reads the flag with a blocking read on the kernel's queue (so the
 * kernel is synchronous), resets it, and returns the flag's code (1 index out of range, 2 integer division
 * by zero) with the offending value in *val; st when the launch failed. */
static int err_begin(dev_t_ *D, cl_mem *em) {
    pthread_mutex_lock(&D->elock);
    if (!D->errm) {
        int64_t z[2] = {0, 0};
        cl_int e = 0;
        D->errm = cl.clCreateBuffer(D->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof z, z, &e);
        if (!D->errm || e) {
            D->errm = NULL;
            pthread_mutex_unlock(&D->elock);
            return fail(FL_ERR_OOM, NAME ": cannot allocate the device error flag (OpenCL error %d)", e);
        }
    }
    *em = D->errm;
    return FL_OK;
}
static int err_end(dev_t_ *D, fl_stream_t s, int st, int *code, int64_t *val) {
    *code = 0; *val = 0;
    if (st) { pthread_mutex_unlock(&D->elock); return st; }
    int32_t b[4] = {0, 0, 0, 0};
    cl_int e = cl.clEnqueueReadBuffer(qof(D, s), D->errm, CL_TRUE, 0, sizeof b, b, 0, NULL, NULL);
    if (!e && b[0]) {
        int64_t z[2] = {0, 0};
        memcpy(val, &b[2], 8);
        *code = b[0];
        e = cl.clEnqueueWriteBuffer(qof(D, s), D->errm, CL_TRUE, 0, sizeof z, z, 0, NULL, NULL);
    }
    pthread_mutex_unlock(&D->elock);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": reading the device error flag failed with OpenCL error %d (or an earlier kernel failed)", e);
    return FL_OK;
}

/* ------------------------------------------------------------------ elementwise */
#define KARGS fl_stream_t stream, int device, const fl_tensor_t *in, int n_in, const fl_tensor_t *out, int n_out, \
              const fl_arg_t *args, int n_args
#define PASS stream, device, in, n_in, out, n_out, args, n_args

typedef struct { fl_tensor_t v; dt_t d; int scalar; double sd; int64_t si; } opnd_t;

static int get_opnd(dev_t_ *D, const fl_arg_t *a, const fl_tensor_t *in, int n_in, const fl_tensor_t *o, int want, opnd_t *r) {
    memset(r, 0, sizeof *r);
    if (a->kind == FL_ARG_TENSOR) {
        if (a->i < 0 || a->i >= n_in) return UNSUP;
        if (fl_bcast(&in[a->i], o->ndim, o->sizes, &r->v)) return UNSUP;
        if (r->v.dtype != want) return fail(UNSUP, NAME ": operand dtype %d, kernel computes in %d", r->v.dtype, want);
        return tres(D, &r->v, &r->d);
    }
    if (fl_arg_is_num(a)) {
        if (!is_flt(want) && a->kind == FL_ARG_FLOAT && a->f != (double)(int64_t)a->f) return UNSUP;
        r->scalar = 1;
        r->sd = fl_arg_num(a);
        r->si = fl_arg_int(a);
        if (want == FL_BOOL) r->si = r->sd != 0;
        return FL_OK;
    }
    return UNSUP;
}

/* out[...] = kernel(ops...) in program ew:<T>; pa/pb are the op's scalar parameters */
static int ew_run_e(dev_t_ *D, fl_stream_t s, int T, const char *kn, const fl_tensor_t *o, int nop, opnd_t *ops,
                    double pa, double pb, cl_mem *errm) {
    dt_t od;
    int st = tres(D, o, &od);
    if (st) return st;
    int64_t n = fl_numel(o);
    if (n == 0) return FL_OK;
    const fl_tensor_t *ts[4] = {o, NULL, NULL, NULL};
    int64_t base[4] = {od.off, 0, 0, 0};
    prm_t p;
    memset(&p, 0, sizeof p);
    uint32_t sm = 0;
    cl_mem mems[4] = {od.m, od.m, od.m, od.m};
    for (int k = 0; k < nop; k++) {
        if (ops[k].scalar) {
            sm |= 1u << k;
            p.si[k] = ops[k].si;
            prm_real(D, &p, 0, k, ops[k].sd);
        } else {
            ts[k + 1] = &ops[k].v;
            base[k + 1] = ops[k].d.off;
            mems[k + 1] = ops[k].d.m;
        }
    }
    p.pi[0] = (int64_t)pa; p.pi[1] = (int64_t)pb;
    prm_real(D, &p, 1, 0, pa);
    prm_real(D, &p, 1, 1, pb);
    walk_t w;
    mkwalk(&w, o->ndim, o->sizes, nop + 1, ts, base);
    karg_t a[8];
    int na = 0;
    for (int k = 0; k <= nop; k++) a[na++] = (karg_t){sizeof(cl_mem), &mems[k]};
    a[na++] = KA(w);
    a[na++] = (karg_t){prm_size(D), &p};
    a[na++] = KA(sm);
    if (errm) a[na++] = (karg_t){sizeof(cl_mem), errm};
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(T));
    return launch1(D, s, prog, kn, na, a, n);
}
static int ew_run(dev_t_ *D, fl_stream_t s, int T, const char *kn, const fl_tensor_t *o, int nop, opnd_t *ops,
                  double pa, double pb) {
    return ew_run_e(D, s, T, kn, o, nop, ops, pa, pb, NULL);
}

static int out0(dev_t_ *D, const fl_tensor_t *out, int n_out, const fl_tensor_t **o) {
    if (!fl_out_ok(out, n_out)) return UNSUP;
    if (!dt_ok(D, out[0].dtype)) return UNSUP;
    *o = &out[0];
    return FL_OK;
}
static int out0_store(dev_t_ *D, const fl_tensor_t *out, int n_out, const fl_tensor_t **o) { /* float16 too */
    if (!fl_out_ok(out, n_out)) return UNSUP;
    if (!dt_store(D, out[0].dtype)) return UNSUP;
    *o = &out[0];
    return FL_OK;
}
#define FLOATS_ONLY(o) if (!is_flt((o)->dtype)) return UNSUP;
#define NOBOOL(o) if ((o)->dtype == FL_BOOL) return UNSUP;

/* unary / binary with operands args[0..nop) in the output's dtype */
static int ew_simple(KARGS, const char *kn, int nop, int floats_only, double pa, double pb) {
    (void)stream;
    DEV(device);
    const fl_tensor_t *o;
    int st = out0(D, out, n_out, &o);
    if (st) return st;
    if (floats_only && !is_flt(o->dtype)) return UNSUP;
    if (o->dtype == FL_BOOL) return UNSUP;
    if (n_args < nop) return UNSUP;
    opnd_t ops[3];
    for (int k = 0; k < nop; k++) if ((st = get_opnd(D, &args[k], in, n_in, o, o->dtype, &ops[k]))) return st;
    if (ops[0].scalar && nop == 1) return UNSUP;
    return ew_run(D, stream, o->dtype, kn, o, nop, ops, pa, pb);
}
#define U1(fn, kn, fo) static int fn(KARGS) { return ew_simple(PASS, kn, 1, fo, 0, 0); }
#define B2(fn, kn, fo) static int fn(KARGS) { return ew_simple(PASS, kn, 2, fo, 0, 0); }
U1(k_neg, "u_neg", 0) U1(k_abs, "u_abs", 0) U1(k_relu, "u_relu", 0)
U1(k_exp, "u_exp", 1) U1(k_log, "u_log", 1) U1(k_sqrt, "u_sqrt", 1) U1(k_rsqrt, "u_rsqrt", 1) U1(k_tanh, "u_tanh", 1)
U1(k_erf, "u_erf", 1) U1(k_sigmoid, "u_sigmoid", 1) U1(k_silu, "u_silu", 1)
B2(k_mul, "b_mul", 0) B2(k_div, "b_div", 1) B2(k_maximum, "b_maximum", 0) B2(k_minimum, "b_minimum", 0)
B2(k_sigmoid_bw, "b_sigmoid_bw", 1) B2(k_tanh_bw, "b_tanh_bw", 1) B2(k_silu_bw, "b_silu_bw", 1)

static int alpha_of(const fl_tensor_t *o, const fl_arg_t *args, int n_args, int k, double *al) {
    *al = 1;
    if (k >= n_args || args[k].kind == FL_ARG_NONE) return FL_OK;
    if (!fl_arg_is_num(&args[k])) return UNSUP;
    if (!is_flt(o->dtype) && args[k].kind == FL_ARG_FLOAT && args[k].f != (double)(int64_t)args[k].f) return UNSUP;
    *al = fl_arg_num(&args[k]);
    return FL_OK;
}
static int k_add(KARGS) {
    if (!fl_out_ok(out, n_out)) return UNSUP;
    double al; if (alpha_of(&out[0], args, n_args, 2, &al)) return UNSUP;
    return ew_simple(PASS, "b_add", 2, 0, al, 0);
}
static int k_sub(KARGS) {
    if (!fl_out_ok(out, n_out)) return UNSUP;
    double al; if (alpha_of(&out[0], args, n_args, 2, &al)) return UNSUP;
    return ew_simple(PASS, "b_sub", 2, 0, al, 0);
}
static int k_pow_ts(KARGS) { /* pow.Tensor_Scalar(self, exponent) */
    if (!fl_out_ok(out, n_out) || n_args < 2 || !fl_arg_is_num(&args[1])) return UNSUP;
    double e = fl_arg_num(&args[1]);
    if (e == 2.0) return ew_simple(PASS, "u_sq", 1, 1, 0, 0);
    return ew_simple(PASS, "u_pow", 1, 1, e, 0);
}
static int gelu_mode(const fl_arg_t *args, int n_args, int k) {
    if (k >= n_args) return 0;
    if (args[k].kind == FL_ARG_OTHER && (args[k].i == FL_STR_none || args[k].i == FL_STR_tanh)) return args[k].i == FL_STR_tanh;
    return -1;
}
static int k_gelu(KARGS) {
    int m = gelu_mode(args, n_args, 1);
    if (m < 0) return UNSUP;
    return ew_simple(PASS, m ? "u_gelut" : "u_gelu", 1, 1, 0, 0);
}
static int k_gelu_bw(KARGS) { /* gelu_backward(grad_output, self, approximate) */
    int m = gelu_mode(args, n_args, 2);
    if (m < 0) return UNSUP;
    return ew_simple(PASS, m ? "b_gelut_bw" : "b_gelu_bw", 2, 1, 0, 0);
}
static int k_threshold_bw(KARGS) { /* threshold_backward(grad_output, self, threshold) */
    if (n_args < 3 || !fl_arg_is_num(&args[2])) return UNSUP;
    return ew_simple(PASS, "b_threshold_bw", 2, 0, fl_arg_num(&args[2]), 0);
}
static int k_threshold(KARGS) { /* threshold(self, threshold, value) */
    if (n_args < 3 || !fl_arg_is_num(&args[1]) || !fl_arg_is_num(&args[2])) return UNSUP;
    return ew_simple(PASS, "u_threshold", 1, 1, fl_arg_num(&args[1]), fl_arg_num(&args[2]));
}

/* comparisons: bool output, operands in self's dtype */
static int cmp_k(KARGS, const char *kn) {
    DEV(device);
    if (!fl_out_ok(out, n_out) || out[0].dtype != FL_BOOL || n_args < 2) return UNSUP;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !dt_ok(D, x->dtype)) return UNSUP;
    int T = x->dtype;
    opnd_t ops[2];
    int st;
    for (int k = 0; k < 2; k++) if ((st = get_opnd(D, &args[k], in, n_in, &out[0], T, &ops[k]))) return st;
    return ew_run(D, stream, T, kn, &out[0], 2, ops, 0, 0);
}
static int k_eq(KARGS) { return cmp_k(PASS, "c_eq"); }
static int k_ne(KARGS) { return cmp_k(PASS, "c_ne"); }
static int k_lt(KARGS) { return cmp_k(PASS, "c_lt"); }
static int k_le(KARGS) { return cmp_k(PASS, "c_le"); }
static int k_gt(KARGS) { return cmp_k(PASS, "c_gt"); }
static int k_ge(KARGS) { return cmp_k(PASS, "c_ge"); }

static int k_where(KARGS) { /* where.self(condition, self, other) */
    DEV(device);
    const fl_tensor_t *o;
    int st = out0(D, out, n_out, &o);
    if (st) return st;
    if (n_args < 3) return UNSUP;
    opnd_t ops[3];
    if ((st = get_opnd(D, &args[0], in, n_in, o, FL_BOOL, &ops[0])) || (st = get_opnd(D, &args[1], in, n_in, o, o->dtype, &ops[1])) ||
        (st = get_opnd(D, &args[2], in, n_in, o, o->dtype, &ops[2])))
        return st;
    return ew_run(D, stream, o->dtype, "t_where", o, 3, ops, 0, 0);
}

/* ------------------------------------------------------------------ bitwise, predicates, rounding, division modes */
/* bitwise ops: integer and bool dtypes, operands in the output's dtype */
static int ew_bits(KARGS, const char *kn, int nop) {
    DEV(device);
    const fl_tensor_t *o;
    int st = out0(D, out, n_out, &o);
    if (st) return st;
    if (is_flt(o->dtype) || n_args < nop) return UNSUP;
    opnd_t ops[2];
    for (int k = 0; k < nop; k++) {
        if (fl_arg_is_num(&args[k]) && args[k].kind == FL_ARG_FLOAT) return UNSUP;
        if ((st = get_opnd(D, &args[k], in, n_in, o, o->dtype, &ops[k]))) return st;
    }
    if (ops[0].scalar && nop == 1) return UNSUP;
    return ew_run(D, stream, o->dtype, kn, o, nop, ops, 0, 0);
}
static int k_band(KARGS) { return ew_bits(PASS, "b_band", 2); }
static int k_bor(KARGS) { return ew_bits(PASS, "b_bor", 2); }
static int k_bxor(KARGS) { return ew_bits(PASS, "b_bxor", 2); }
static int k_bnot(KARGS) { return ew_bits(PASS, "u_bnot", 1); }
/* bool output computed in self's dtype */
static int pred_k(KARGS, const char *kn, int floats_only) {
    DEV(device);
    if (!fl_out_ok(out, n_out) || out[0].dtype != FL_BOOL || n_args < 1) return UNSUP;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !dt_ok(D, x->dtype) || (floats_only && !is_flt(x->dtype))) return UNSUP;
    opnd_t op;
    int st = get_opnd(D, &args[0], in, n_in, &out[0], x->dtype, &op);
    if (st) return st;
    return ew_run(D, stream, x->dtype, kn, &out[0], 1, &op, 0, 0);
}
static int k_lnot(KARGS) { return pred_k(PASS, "p_lnot", 0); }
static int k_signbit(KARGS) {
    if (n_args >= 1 && args[0].kind == FL_ARG_TENSOR && args[0].i >= 0 && args[0].i < n_in && in[args[0].i].dtype == FL_BOOL) return UNSUP;
    return pred_k(PASS, "p_signbit", 0);
}
U1(k_sin, "u_sin", 1) U1(k_cos, "u_cos", 1) U1(k_ceil, "u_ceil", 0) U1(k_floor, "u_floor", 0) U1(k_trunc, "u_trunc", 0)
U1(k_sign, "u_sign", 0)
/* div (rounding_mode), fmod, remainder: integer division by zero raises, as PyTorch's CPU kernels do */
static int divlike(KARGS, const char *kn, const char *what) {
    DEV(device);
    const fl_tensor_t *o;
    int st = out0(D, out, n_out, &o);
    if (st) return st;
    if (o->dtype == FL_BOOL || n_args < 2) return UNSUP;
    opnd_t ops[2];
    for (int k = 0; k < 2; k++) if ((st = get_opnd(D, &args[k], in, n_in, o, o->dtype, &ops[k]))) return st;
    if (ops[0].scalar) return UNSUP;
    if (!is_flt(o->dtype) && ops[1].scalar && ops[1].si == 0) return fail(FL_ERR_INVALID, "ZeroDivisionError");
    cl_mem em;
    if ((st = err_begin(D, &em))) return st;
    if (is_flt(o->dtype)) { /* floats never set the flag: no read-back, the kernel stays asynchronous */
        pthread_mutex_unlock(&D->elock);
        return ew_run_e(D, stream, o->dtype, kn, o, 2, ops, 0, 0, &em);
    }
    st = ew_run_e(D, stream, o->dtype, kn, o, 2, ops, 0, 0, &em);
    int code; int64_t v;
    if ((st = err_end(D, stream, st, &code, &v))) return st;
    (void)what;
    if (code) return fail(FL_ERR_INVALID, "ZeroDivisionError"); /* PyTorch's words */
    return FL_OK;
}
static int k_div_mode(KARGS) { /* div.Tensor_mode / div.Scalar_mode(self, other, *, rounding_mode) */
    if (n_args < 3) return UNSUP;
    if (args[2].kind == FL_ARG_NONE) return ew_simple(PASS, "b_div", 2, 1, 0, 0);
    if (args[2].kind != FL_ARG_OTHER) return UNSUP;
    if (args[2].i == FL_STR_trunc) return divlike(PASS, "d_divtrunc", "div");
    if (args[2].i == FL_STR_floor) return divlike(PASS, "d_divfloor", "div");
    return UNSUP;
}
static int k_fmod(KARGS) { return divlike(PASS, "d_fmod", "fmod"); }
static int k_remainder(KARGS) { return divlike(PASS, "d_rem", "remainder"); }

/* ------------------------------------------------------------------ copy_, fill_, cat, arange */
static uint64_t val_bits(int dt, double v, int64_t iv, int isint) {
    uint64_t b = 0;
    switch (dt) {
    case FL_FLOAT32: { float f = isint ? (float)iv : (float)v; memcpy(&b, &f, 4); break; }
    case FL_FLOAT64: { double d = isint ? (double)iv : v; memcpy(&b, &d, 8); break; }
    case FL_INT64: { int64_t x = isint ? iv : (int64_t)v; memcpy(&b, &x, 8); break; }
    case FL_INT32: { int32_t x = (int32_t)(isint ? iv : (int64_t)v); memcpy(&b, &x, 4); break; }
    case FL_INT16: { int16_t x = (int16_t)(isint ? iv : (int64_t)v); memcpy(&b, &x, 2); break; }
    case FL_INT8: { int8_t x = (int8_t)(isint ? iv : (int64_t)v); memcpy(&b, &x, 1); break; }
    case FL_UINT8: { uint8_t x = (uint8_t)(isint ? iv : (int64_t)v); memcpy(&b, &x, 1); break; }
    case FL_BOOL: { uint8_t x = isint ? iv != 0 : v != 0; memcpy(&b, &x, 1); break; }
    case FL_FLOAT16: { uint16_t x = fl_f32_to_f16(isint ? (float)iv : (float)v); memcpy(&b, &x, 2); break; }
    }
    return b;
}
static int fill_bits(dev_t_ *D, fl_stream_t s, const fl_tensor_t *o, uint64_t bits) {
    dt_t od;
    int st = tres(D, o, &od);
    if (st) return st;
    int64_t n = fl_numel(o);
    if (!n) return FL_OK;
    const fl_tensor_t *ts[1] = {o};
    int64_t base[1] = {od.off};
    walk_t w;
    mkwalk(&w, o->ndim, o->sizes, 1, ts, base);
    size_t isz = fl_itemsize(o->dtype);
    char kn[8];
    snprintf(kn, sizeof kn, "fl_%zu", isz);
    karg_t a[3] = {{sizeof(cl_mem), &od.m}, KA(w), {isz, &bits}};
    return launch1(D, s, "cvt", kn, 3, a, n);
}
static int k_fill(KARGS) { /* fill_.Scalar(self, value) */
    (void)in; (void)n_in;
    DEV(device);
    const fl_tensor_t *o;
    int st = out0_store(D, out, n_out, &o);
    if (st) return st;
    if (n_args < 2 || !fl_arg_is_num(&args[1])) return UNSUP;
    return fill_bits(D, stream, o, val_bits(o->dtype, fl_arg_num(&args[1]), args[1].i, args[1].kind != FL_ARG_FLOAT));
}
static int k_zero(KARGS) {
    (void)in; (void)n_in; (void)args; (void)n_args;
    DEV(device);
    const fl_tensor_t *o;
    int st = out0_store(D, out, n_out, &o);
    if (st) return st;
    return fill_bits(D, stream, o, 0);
}
/* dst = (dst dtype) src, src already broadcast to dst's shape; both resolved */
static int copy_view(dev_t_ *D, fl_stream_t s, const fl_tensor_t *dst, const dt_t *dd, const fl_tensor_t *src, const dt_t *sd) {
    int64_t n = fl_numel(dst);
    if (!n) return FL_OK;
    const fl_tensor_t *ts[2] = {dst, src};
    int64_t base[2] = {dd->off, sd->off};
    walk_t w;
    mkwalk(&w, dst->ndim, dst->sizes, 2, ts, base);
    char kn[24];
    if (dst->dtype == src->dtype) snprintf(kn, sizeof kn, "cp_%zu", fl_itemsize(dst->dtype));
    else snprintf(kn, sizeof kn, "cv_%s_%s", tname(src->dtype), tname(dst->dtype));
    karg_t a[3] = {{sizeof(cl_mem), &dd->m}, {sizeof(cl_mem), &sd->m}, KA(w)};
    return launch1(D, s, "cvt", kn, 3, a, n);
}
static void contig_strides(fl_tensor_t *t) {
    int64_t st = 1;
    for (int d = t->ndim - 1; d >= 0; d--) { t->strides[d] = st; st *= t->sizes[d]; }
}
static int copy_any(dev_t_ *D, fl_stream_t s, const fl_tensor_t *dst, const fl_tensor_t *src0) {
    fl_tensor_t src;
    if (fl_bcast(src0, dst->ndim, dst->sizes, &src)) return UNSUP;
    if (!dt_store(D, dst->dtype) || !dt_store(D, src.dtype)) return UNSUP;
    dt_t dd, sd;
    int st;
    if ((st = tres(D, dst, &dd)) || (st = tres(D, &src, &sd))) return st;
    int64_t n = fl_numel(dst);
    if (!n) return FL_OK;
    if (dd.m == sd.m) {
        int same = dd.off + dst->offset == sd.off + src.offset;
        for (int d = 0; d < dst->ndim && same; d++) if (dst->sizes[d] > 1 && dst->strides[d] != src.strides[d]) same = 0;
        if (same && dst->dtype == src.dtype) return FL_OK;
        int64_t a0, a1, b0, b1;
        span_of(dst, &a0, &a1); span_of(&src, &b0, &b1);
        a0 += dd.off; a1 += dd.off; b0 += sd.off; b1 += sd.off;
        if (a0 <= b1 && b0 <= a1) { /* overlapping views: stage through a contiguous temporary */
            fl_tensor_t tmp = *dst;
            tmp.dtype = src.dtype; tmp.offset = 0;
            contig_strides(&tmp);
            dt_t td = {tmpbuf(D, (size_t)n * fl_itemsize(src.dtype), &st), 0};
            if (!td.m) return st;
            st = copy_view(D, s, &tmp, &td, &src, &sd);
            if (!st) st = copy_view(D, s, dst, &dd, &tmp, &td);
            cl.clReleaseMemObject(td.m);
            return st;
        }
    }
    return copy_view(D, s, dst, &dd, &src, &sd);
}
static int k_copy(KARGS) { /* copy_(self, src, non_blocking) */
    DEV(device);
    const fl_tensor_t *o;
    int st = out0_store(D, out, n_out, &o);
    if (st) return st;
    if (n_args < 2) return UNSUP;
    if (fl_arg_is_num(&args[1])) return fill_bits(D, stream, o, val_bits(o->dtype, fl_arg_num(&args[1]), args[1].i, args[1].kind != FL_ARG_FLOAT));
    if (args[1].kind != FL_ARG_TENSOR || args[1].i < 0 || args[1].i >= n_in) return UNSUP;
    return copy_any(D, stream, o, &in[args[1].i]);
}
static int k_cat(KARGS) { /* cat(tensors, dim) */
    DEV(device);
    if (n_args < 1 || args[0].kind != FL_ARG_TENSOR_LIST || !fl_out_ok(out, n_out)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!dt_store(D, o->dtype) || o->ndim == 0) return UNSUP;
    int64_t first = args[0].i, cnt = args[0].len;
    if (first < 0 || first + cnt > n_in) return UNSUP;
    if (o->ndim == 1 && o->sizes[0] == 0) return FL_OK;
    int dim;
    if (fl_wrap_dim(n_args > 1 && args[1].kind == FL_ARG_INT ? args[1].i : 0, o->ndim, &dim)) return UNSUP;
    int64_t pos = 0;
    for (int64_t k = 0; k < cnt; k++) { /* check everything before queueing anything */
        const fl_tensor_t *t = &in[first + k];
        if (t->ndim == 1 && t->sizes[0] == 0 && o->ndim != 1) continue;
        if (t->ndim != o->ndim || !dt_store(D, t->dtype)) return UNSUP;
        for (int d = 0; d < o->ndim; d++) if (d != dim && t->sizes[d] != o->sizes[d]) return UNSUP;
        dt_t td; int st = tres(D, t, &td); if (st) return st;
        pos += t->sizes[dim];
    }
    if (pos != o->sizes[dim]) return UNSUP;
    pos = 0;
    for (int64_t k = 0; k < cnt; k++) {
        const fl_tensor_t *t = &in[first + k];
        if (t->ndim == 1 && t->sizes[0] == 0 && o->ndim != 1) continue;
        fl_tensor_t d = *o;
        d.sizes[dim] = t->sizes[dim];
        d.offset += pos * o->strides[dim];
        int st = copy_any(D, stream, &d, t);
        if (st) return st;
        pos += t->sizes[dim];
    }
    return FL_OK;
}
static int k_arange(KARGS) { /* arange.start_step(start, end, step, dtype, layout, device, pin_memory) */
    (void)in; (void)n_in;
    DEV(device);
    const fl_tensor_t *o;
    int st = out0(D, out, n_out, &o);
    if (st) return st;
    if (o->ndim != 1 || n_args < 3 || !fl_arg_is_num(&args[0]) || !fl_arg_is_num(&args[2]) || o->dtype == FL_BOOL) return UNSUP;
    dt_t od;
    if ((st = tres(D, o, &od))) return st;
    int64_t n = o->sizes[0];
    const fl_tensor_t *ts[1] = {o};
    int64_t base[1] = {od.off};
    walk_t w;
    mkwalk(&w, 1, o->sizes, 1, ts, base);
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(o->dtype));
    if (is_flt(o->dtype)) {
        real_t r0, r1;
        karg_t a[4] = {{sizeof(cl_mem), &od.m}, KA(w), ka_real(D, &r0, fl_arg_num(&args[0])), ka_real(D, &r1, fl_arg_num(&args[2]))};
        return launch1(D, stream, prog, "a_arange", 4, a, n);
    }
    if (args[0].kind == FL_ARG_FLOAT || args[2].kind == FL_ARG_FLOAT) return UNSUP;
    int64_t s0 = args[0].i, s1 = args[2].i;
    karg_t a[4] = {{sizeof(cl_mem), &od.m}, KA(w), KA(s0), KA(s1)};
    return launch1(D, stream, prog, "a_arange", 4, a, n);
}

static int bool_at(const fl_arg_t *args, int n_args, int k);
/* ------------------------------------------------------------------ indexing
 * Every kernel that reads indices checks them on the device and sets the error flag; the call reads it
 * back at once (these kernels are synchronous) and raises PyTorch's message. */
static int idx_error(int code, int64_t v, const char *op, int dim, int64_t size) {
    if (code == 1) {
        if (!op) return fail(FL_ERR_INVALID, "index out of range in self");
        return fail(FL_ERR_INVALID, "index %lld is out of bounds for dimension %d with size %lld", (long long)v, dim,
                    (long long)size); /* PyTorch's words (gather, scatter*) */
    }
    return fail(FL_ERR_INVALID, "%s: device error %d", op ? op : "index", code);
}
/* out[w] = x[xv(w) + idx[iv(w)] * xs] over out's shape; xv and iv are views of x and idx in out's shape */
static int gather_run(dev_t_ *D, fl_stream_t s, const fl_tensor_t *o, const dt_t *od, const fl_tensor_t *xv, const dt_t *xd,
                      const fl_tensor_t *iv, const dt_t *id, int64_t xs, int64_t xn, const char *op, int dim) {
    int64_t n = fl_numel(o);
    if (!n) return FL_OK;
    if (xn == 0) return idx_error(1, 0, op, dim, 0); /* any index is out of range (checked at the call, as PyTorch) */
    const fl_tensor_t *ts[3] = {o, iv, xv};
    int64_t base[3] = {od->off, id->off, xd->off};
    walk_t w;
    mkwalk(&w, o->ndim, o->sizes, 3, ts, base);
    cl_mem xm = xd->m ? xd->m : od->m, em;
    int st = err_begin(D, &em);
    if (st) return st;
    karg_t a[7] = {{sizeof(cl_mem), &od->m}, {sizeof(cl_mem), &xm}, {sizeof(cl_mem), &id->m}, KA(w), KA(xs), KA(xn), {sizeof(cl_mem), &em}};
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(o->dtype));
    st = launch1(D, s, prog, "x_gather", 7, a, n);
    int code; int64_t v;
    if ((st = err_end(D, s, st, &code, &v))) return st;
    return code ? idx_error(code, v, op, dim, xn) : FL_OK;
}
/* gather(self, dim, index, sparse_grad): out has index's shape */
static int k_gather(KARGS) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !ix || !fl_out_ok(out, n_out) || n_args < 3 || args[1].kind != FL_ARG_INT) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (ix->dtype != FL_INT64 || x->dtype != o->dtype || !dt_ok(D, o->dtype) || o->ndim != ix->ndim || x->ndim != ix->ndim || !x->ndim) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) return UNSUP;
    for (int d = 0; d < o->ndim; d++) if (o->sizes[d] != ix->sizes[d] || (d != dim && ix->sizes[d] > x->sizes[d])) return UNSUP;
    dt_t od, xd, id;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x, &xd)) || (st = tres(D, ix, &id))) return st;
    fl_tensor_t xv = *x;
    for (int d = 0; d < o->ndim; d++) xv.sizes[d] = o->sizes[d];
    xv.strides[dim] = 0;
    return gather_run(D, stream, o, &od, &xv, &xd, ix, &id, x->strides[dim], x->sizes[dim], "gather", dim);
}
/* index_select(self, dim, index): out = self with dim indexed by the 1-D index */
static int k_index_select(KARGS) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !ix || !fl_out_ok(out, n_out) || n_args < 3 || args[1].kind != FL_ARG_INT) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (ix->dtype != FL_INT64 || ix->ndim > 1 || x->dtype != o->dtype || !dt_ok(D, o->dtype) || o->ndim != x->ndim) return UNSUP;
    if (x->ndim == 0) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) return UNSUP;
    int64_t ni = ix->ndim ? ix->sizes[0] : 1;
    for (int d = 0; d < o->ndim; d++) if (o->sizes[d] != (d == dim ? ni : x->sizes[d])) return UNSUP;
    dt_t od, xd, id;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x, &xd)) || (st = tres(D, ix, &id))) return st;
    fl_tensor_t xv = *x, iv = *o;
    xv.strides[dim] = 0; xv.sizes[dim] = ni;
    iv.dtype = FL_INT64; iv.data = ix->data; iv.offset = ix->offset;
    for (int d = 0; d < o->ndim; d++) iv.strides[d] = d == dim && ix->ndim ? ix->strides[0] : 0;
    return gather_run(D, stream, o, &od, &xv, &xd, &iv, &id, x->strides[dim], x->sizes[dim], NULL, dim);
}
/* embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse): out = indices.shape + [D] */
static int k_embedding(KARGS) {
    DEV(device);
    const fl_tensor_t *wt = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!wt || !ix || !fl_out_ok(out, n_out)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (ix->dtype != FL_INT64 || wt->ndim != 2 || wt->dtype != o->dtype || !dt_ok(D, o->dtype) || o->ndim != ix->ndim + 1) return UNSUP;
    for (int d = 0; d < ix->ndim; d++) if (o->sizes[d] != ix->sizes[d]) return UNSUP;
    if (o->sizes[o->ndim - 1] != wt->sizes[1]) return UNSUP;
    dt_t od, xd, id;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, wt, &xd)) || (st = tres(D, ix, &id))) return st;
    fl_tensor_t xv = *o, iv = *o;
    int last = o->ndim - 1;
    xv.dtype = wt->dtype; xv.data = wt->data; xv.offset = wt->offset;
    iv.dtype = FL_INT64; iv.data = ix->data; iv.offset = ix->offset;
    for (int d = 0; d < last; d++) { xv.strides[d] = 0; iv.strides[d] = ix->strides[d]; }
    xv.strides[last] = wt->strides[1]; iv.strides[last] = 0;
    return gather_run(D, stream, o, &od, &xv, &xd, &iv, &id, wt->strides[0], wt->sizes[0], NULL, 0);
}
/* embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq) */
static int k_embedding_bw(KARGS) {
    DEV(device);
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!g || !ix || !fl_out_ok(out, n_out) || n_args < 5 || args[2].kind != FL_ARG_INT) return UNSUP;
    if (bool_at(args, n_args, 4)) return UNSUP; /* scale_grad_by_freq */
    const fl_tensor_t *o = &out[0];
    if (ix->dtype != FL_INT64 || !is_flt(o->dtype) || !dt_ok(D, o->dtype) || g->dtype != o->dtype || o->ndim != 2) return UNSUP;
    if (g->ndim != ix->ndim + 1 || o->sizes[0] != args[2].i || g->sizes[g->ndim - 1] != o->sizes[1]) return UNSUP;
    for (int d = 0; d < ix->ndim; d++) if (g->sizes[d] != ix->sizes[d]) return UNSUP;
    int64_t pad = args[3].kind == FL_ARG_INT ? args[3].i : -1;
    dt_t od, gd, id;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, g, &gd)) || (st = tres(D, ix, &id))) return st;
    if ((st = fill_bits(D, stream, o, 0))) return st;
    int64_t Dm = o->sizes[1], nw = o->sizes[0];
    if (!Dm || !fl_numel(ix)) return FL_OK;
    fl_tensor_t gv = *g;
    gv.ndim = ix->ndim;
    const fl_tensor_t *ts[2] = {ix, &gv};
    int64_t base[2] = {id.off, gd.off};
    walk_t w;
    mkwalk(&w, ix->ndim, ix->sizes, 2, ts, base);
    int64_t gsl = g->strides[g->ndim - 1], ooff = od.off + o->offset, os0 = o->strides[0], os1 = o->strides[1];
    cl_mem em;
    if ((st = err_begin(D, &em))) return st;
    karg_t a[12] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &id.m}, {sizeof(cl_mem), &gd.m}, KA(w), KA(Dm), KA(gsl),
                    KA(ooff), KA(os0), KA(os1), KA(nw), KA(pad), {sizeof(cl_mem), &em}};
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(o->dtype));
    st = launch1(D, stream, prog, "x_embbw", 12, a, Dm);
    int code; int64_t v;
    if ((st = err_end(D, stream, st, &code, &v))) return st;
    return code ? idx_error(code, v, NULL, 0, nw) : FL_OK;
}
/* scatter family: (self, dim, index, src|value[, reduce]); out = self, then the indexed writes.
 * mode 0 src, 1 value, 2 add src */
static int scatter_k(KARGS, int mode) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !ix || !fl_out_ok(out, n_out) || n_args < 4 || args[1].kind != FL_ARG_INT) return UNSUP;
    if (n_args > 4 && args[4].kind != FL_ARG_NONE) return UNSUP; /* reduce= */
    const fl_tensor_t *o = &out[0], *src = NULL;
    if (ix->dtype != FL_INT64 || x->dtype != o->dtype || !dt_ok(D, o->dtype) || !o->ndim || x->ndim != o->ndim) return UNSUP;
    for (int d = 0; d < o->ndim; d++) if (x->sizes[d] != o->sizes[d]) return UNSUP;
    prm_t p;
    memset(&p, 0, sizeof p);
    if (mode == 1) {
        if (!fl_arg_is_num(&args[3])) return UNSUP;
        if (!is_flt(o->dtype) && args[3].kind == FL_ARG_FLOAT) return UNSUP;
        p.si[0] = fl_arg_int(&args[3]);
        if (o->dtype == FL_BOOL) p.si[0] = fl_arg_num(&args[3]) != 0;
        prm_real(D, &p, 0, 0, fl_arg_num(&args[3]));
    } else {
        src = fl_arg_tensor(args, n_args, 3, in, n_in);
        if (!src || src->dtype != o->dtype || src->ndim != o->ndim) return UNSUP;
    }
    int dim;
    if (fl_wrap_dim(args[1].i, o->ndim, &dim)) return UNSUP;
    if (ix->ndim != o->ndim && fl_numel(ix)) return UNSUP;
    for (int d = 0; d < ix->ndim; d++)
        if ((d != dim && ix->sizes[d] > o->sizes[d]) || (src && ix->sizes[d] > src->sizes[d])) return UNSUP;
    dt_t od, id, sd = {0, 0};
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, ix, &id)) || (src && (st = tres(D, src, &sd)))) return st;
    if ((st = copy_any(D, stream, o, x))) return st;
    if (!fl_numel(ix)) return FL_OK;
    int64_t L = ix->sizes[dim];
    fl_tensor_t ov = *o, iv = *ix, sv = src ? *src : *ix;
    for (int d = 0; d < o->ndim; d++) ov.sizes[d] = iv.sizes[d] = sv.sizes[d] = d == dim ? 1 : ix->sizes[d];
    const fl_tensor_t *ts[3] = {&ov, &iv, &sv};
    int64_t base[3] = {od.off, id.off, src ? sd.off : id.off};
    walk_t w;
    mkwalk(&w, o->ndim, iv.sizes, 3, ts, base);
    int64_t os = o->strides[dim], on = o->sizes[dim], is = ix->strides[dim], ss = src ? src->strides[dim] : 0;
    cl_mem sm = src ? sd.m : id.m, em;
    if ((st = err_begin(D, &em))) return st;
    karg_t a[12] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &id.m}, {sizeof(cl_mem), &sm}, KA(w), KA(L), KA(os), KA(on),
                    KA(is), KA(ss), {prm_size(D), &p}, KA(mode), {sizeof(cl_mem), &em}};
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(o->dtype));
    st = launch1(D, stream, prog, "x_scat", 12, a, w.n);
    int code; int64_t v;
    if ((st = err_end(D, stream, st, &code, &v))) return st;
    return code ? idx_error(code, v, mode == 2 ? "scatter_add" : "scatter", dim, on) : FL_OK;
}
static int k_scatter_src(KARGS) { return scatter_k(PASS, 0); }
static int k_scatter_value(KARGS) { return scatter_k(PASS, 1); }
static int k_scatter_add(KARGS) { return scatter_k(PASS, 2); }

/* ------------------------------------------------------------------ random */
static int rand_k(KARGS, int kind) { /* 0 uniform_(self, from, to), 1 normal_(self, mean, std), 2 bernoulli_.float(self, p) */
    (void)in; (void)n_in;
    DEV(device);
    const fl_tensor_t *o;
    int st = out0(D, out, n_out, &o);
    if (st) return st;
    if (kind < 2 && !is_flt(o->dtype)) return UNSUP;
    if (n_args < (kind < 2 ? 3 : 2) || !fl_arg_is_num(&args[1]) || (kind < 2 && !fl_arg_is_num(&args[2]))) return UNSUP;
    double a = fl_arg_num(&args[1]), b = kind < 2 ? fl_arg_num(&args[2]) : 0;
    if (kind == 0 && !(a <= b)) return fail(FL_ERR_INVALID, "uniform_ expects to return a [from, to) range, but found from=%g > to=%g", a, b);
    if (kind == 1 && b < 0) return fail(FL_ERR_INVALID, "normal expects std >= 0.0, but found std %g", b);
    if (kind == 2 && !(a >= 0 && a <= 1)) return fail(FL_ERR_INVALID, "bernoulli_ expects p to be in [0, 1], but got p=%g", a);
    dt_t od;
    if ((st = tres(D, o, &od))) return st;
    int64_t n = fl_numel(o);
    if (!n) return FL_OK;
    const fl_tensor_t *ts[1] = {o};
    int64_t base[1] = {od.off};
    walk_t w;
    mkwalk(&w, o->ndim, o->sizes, 1, ts, base);
    /* counters follow the row-major index (mkwalk keeps that order: it only merges and drops size-1 dims) */
    uint64_t seed, start = rng_reserve(D, (uint64_t)n * (kind == 1 ? 2 : 1), &seed);
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(o->dtype));
    real_t r0, r1;
    karg_t ka[6] = {{sizeof(cl_mem), &od.m}, KA(w), KA(seed), KA(start), ka_real(D, &r0, a), ka_real(D, &r1, b)};
    return launch1(D, stream, prog, kind == 0 ? "r_uniform" : kind == 1 ? "r_normal" : "r_bernoulli", kind == 2 ? 5 : 6, ka, n);
}
static int k_uniform(KARGS) { return rand_k(PASS, 0); }
static int k_normal(KARGS) { return rand_k(PASS, 1); }
static int k_bernoulli(KARGS) { return rand_k(PASS, 2); }

/* ------------------------------------------------------------------ reductions */
typedef struct { int64_t osize[8], ost_o[8], ost_i[8], rsize[8], rst[8]; int64_t ooff, ioff, ondim, rndim, nout, nred, chunk, nchunk; } red_t;

static int parse_dims(const fl_arg_t *a, int nd, uint32_t *mask) {
    *mask = 0;
    if (!a || a->kind == FL_ARG_NONE || (a->kind == FL_ARG_INT_LIST && a->len == 0)) { *mask = nd ? (1u << nd) - 1 : 0; return FL_OK; }
    if (a->kind == FL_ARG_INT) { int d; if (fl_wrap_dim(a->i, nd, &d)) return UNSUP; if (nd) *mask = 1u << d; return FL_OK; }
    if (a->kind != FL_ARG_INT_LIST) return UNSUP;
    for (int k = 0; k < a->len; k++) { int d; if (fl_wrap_dim(a->list[k], nd, &d)) return UNSUP; if (nd) *mask |= 1u << d; }
    return FL_OK;
}
/* op 0 sum (scale: 1, or 1/n for mean), 1 max */
/* op 0 sum (scale: 1, or 1/n for mean), 1 max, 2 min, 3 arg max/min (rx: flags 1 min, 2 values, 4 indices;
 * o2 the int64 indices), 4 var/std (rx: flags 1 sqrt, 2 mean in o2; corr) */
typedef struct { const fl_tensor_t *o2; int flags; double corr; } rx_t;
typedef struct { int64_t st[8]; int64_t off; } ist_t;
static int reduce_x(dev_t_ *D, fl_stream_t s, const fl_tensor_t *x0, const fl_arg_t *dims, int keepdim, const fl_tensor_t *o, int op,
                    int mean, const rx_t *rx) {
    int ext = op == 1 || op == 2 || op == 3;
    if (!dt_ok(D, o->dtype) || !dt_ok(D, x0->dtype) || (o->dtype == FL_BOOL && !(op == 1 || op == 2))) return UNSUP;
    if (op >= 1 && x0->dtype != o->dtype) return UNSUP;
    if ((mean || op == 4) && !is_flt(o->dtype)) return UNSUP;
    const fl_tensor_t *o2 = rx ? rx->o2 : NULL;
    if (op == 3 && o2 && (o2->dtype != FL_INT64 || o2->ndim != o->ndim)) return UNSUP;
    if (op == 4 && o2 && (o2->dtype != o->dtype || o2->ndim != o->ndim)) return UNSUP;
    if (o2) for (int d = 0; d < o->ndim; d++) if (o2->sizes[d] != o->sizes[d]) return UNSUP;
    uint32_t mask;
    if (parse_dims(dims, x0->ndim, &mask)) return UNSUP;
    int nkeep = 0;
    for (int d = 0; d < x0->ndim; d++) if (!(mask >> d & 1)) nkeep++;
    if (o->ndim != (keepdim ? x0->ndim : nkeep)) return UNSUP;
    int64_t nred = 1;
    for (int d = 0; d < x0->ndim; d++) if (mask >> d & 1) nred *= x0->sizes[d];
    if (ext && nred == 0) return UNSUP;
    for (int d = 0, k = 0; d < x0->ndim; d++) { /* kept dims match the output (decided before anything is queued) */
        if ((mask >> d & 1) && !keepdim) continue;
        if (!(mask >> d & 1) && o->sizes[k] != x0->sizes[d]) return UNSUP;
        k++;
    }
    dt_t od, xd, o2d = {0, 0};
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x0, &xd)) || (o2 && (st = tres(D, o2, &o2d)))) return st;
    int64_t nout = fl_numel(o);
    if (!nout) return FL_OK;
    fl_tensor_t x = *x0;
    cl_mem tmpx = NULL;
    if (x0->dtype != o->dtype && fl_numel(x0) > 0) { /* sum(int32) -> int64 etc.: convert first */
        x.dtype = o->dtype; x.offset = 0;
        contig_strides(&x);
        dt_t td = {tmpbuf(D, (size_t)fl_numel(x0) * fl_itemsize(o->dtype), &st), 0};
        if (!td.m) return st;
        if ((st = copy_view(D, s, &x, &td, x0, &xd))) { cl.clReleaseMemObject(td.m); return st; }
        tmpx = td.m; xd = td;
    }
    red_t r;
    ist_t is2;
    memset(&r, 0, sizeof r);
    memset(&is2, 0, sizeof is2);
    int od_i = 0, on = 0, rn = 0;
    for (int d = 0; d < x.ndim; d++) {
        int red = mask >> d & 1;
        int oi = keepdim ? d : (red ? -1 : od_i++);
        if (red) {
            if (x.sizes[d] == 1) continue;
            if (rn > 0 && r.rst[rn - 1] == x.strides[d] * x.sizes[d]) { r.rsize[rn - 1] *= x.sizes[d]; r.rst[rn - 1] = x.strides[d]; continue; }
            r.rsize[rn] = x.sizes[d]; r.rst[rn] = x.strides[d]; rn++;
        } else {
            if (o->sizes[oi] != x.sizes[d]) { if (tmpx) cl.clReleaseMemObject(tmpx); return UNSUP; }
            if (x.sizes[d] == 1) continue;
            r.osize[on] = x.sizes[d]; r.ost_o[on] = o->strides[oi]; r.ost_i[on] = x.strides[d];
            if (o2) is2.st[on] = o2->strides[oi];
            on++;
        }
    }
    if (o2) is2.off = o2d.off + o2->offset;
    if (rn == 0) { r.rsize[0] = 1; r.rst[0] = 0; rn = 1; }
    if (nred == 0) { r.rsize[0] = 0; }
    r.ondim = on; r.rndim = rn; r.nout = nout; r.nred = nred;
    r.ooff = od.off + o->offset; r.ioff = xd.off + x.offset;
    r.nchunk = 1; r.chunk = nred > 0 ? nred : 1;
    if (op <= 2 && nout < 4096 && nred > 8192) {
        int64_t want = (8192 + nout - 1) / nout, bych = (nred + 4095) / 4096;
        r.nchunk = want < bych ? want : bych;
        if (r.nchunk < 1) r.nchunk = 1;
        r.chunk = (nred + r.nchunk - 1) / r.nchunk;
        r.nchunk = (nred + r.chunk - 1) / r.chunk;
    }
    if (nred == 0) { r.chunk = 0; }
    char prog[16];
    snprintf(prog, sizeof prog, "red:%s", tname(o->dtype));
    if (op == 3 || op == 4) {
        cl_mem m2 = o2 ? o2d.m : od.m, xm = xd.m ? xd.m : od.m;
        int flags = rx ? rx->flags : 0;
        if (op == 3) {
            karg_t a[6] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &m2}, {sizeof(cl_mem), &xm}, KA(r), KA(is2), KA(flags)};
            st = launch1(D, s, prog, "r_arg", 6, a, nout);
        } else {
            real_t rc;
            karg_t a[7] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &m2}, {sizeof(cl_mem), &xm}, KA(r), KA(is2),
                           ka_real(D, &rc, rx ? rx->corr : 1.0), KA(flags)};
            st = launch1(D, s, prog, "r_var", 7, a, nout);
        }
        if (tmpx) cl.clReleaseMemObject(tmpx);
        return st;
    }
    size_t accsz = op ? fl_itemsize(o->dtype) : 8;
    if (op == 0 && o->dtype == FL_FLOAT32 && !D->fp64) accsz = 4;
    cl_mem part = r.nchunk > 1 ? tmpbuf(D, (size_t)(r.nchunk * nout) * accsz, &st) : NULL;
    if (r.nchunk > 1 && !part) { if (tmpx) cl.clReleaseMemObject(tmpx); return st; }
    double scale = mean ? 1.0 / (double)nred : 1.0;
    real_t rs;
    cl_mem pm = part ? part : od.m;
    karg_t a[5] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &pm}, {sizeof(cl_mem), &xd.m}, KA(r), ka_real(D, &rs, scale)};
    if (!xd.m) a[2] = (karg_t){sizeof(cl_mem), &od.m};
    static const char *const rk[3] = {"r_sum", "r_max", "r_min"}, *const fk[3] = {"f_sum", "f_max", "f_min"};
    st = launch1(D, s, prog, rk[op], 5, a, nout * r.nchunk);
    if (!st && r.nchunk > 1) {
        karg_t b[4] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &pm}, KA(r), ka_real(D, &rs, scale)};
        st = launch1(D, s, prog, fk[op], 4, b, nout);
    }
    if (part) cl.clReleaseMemObject(part);
    if (tmpx) cl.clReleaseMemObject(tmpx);
    return st;
}
static int reduce(dev_t_ *D, fl_stream_t s, const fl_tensor_t *x0, const fl_arg_t *dims, int keepdim, const fl_tensor_t *o, int op, int mean) {
    return reduce_x(D, s, x0, dims, keepdim, o, op, mean, NULL);
}
static int bool_at(const fl_arg_t *args, int n_args, int k) {
    return k < n_args && (args[k].kind == FL_ARG_BOOL || args[k].kind == FL_ARG_INT) ? (int)args[k].i : 0;
}
static int k_sum_dim(KARGS) { /* sum.dim_IntList(self, dim?, keepdim, dtype?) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 2), &out[0], 0, 0);
}
static int k_sum(KARGS) { /* sum(self, dtype?) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, NULL, 0, &out[0], 0, 0);
}
static int k_mean_dim(KARGS) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 2), &out[0], 0, 1);
}
static int k_mean(KARGS) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, NULL, 0, &out[0], 0, 1);
}
static int k_amax(KARGS) { /* amax(self, dim[], keepdim) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 2), &out[0], 1, 0);
}

static int k_amin(KARGS) { /* amin(self, dim[], keepdim) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 2), &out[0], 2, 0);
}
static int maxmin_all(KARGS, int op) { /* max(self) / min(self): the whole tensor */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    if (!fl_numel(x))
        return fail(FL_ERR_INVALID, "%s(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim "
                    "with the 'dim' argument.", op == 1 ? "max" : "min");
    return reduce(D, stream, x, NULL, 0, &out[0], op, 0);
}
static int k_max_all(KARGS) { return maxmin_all(PASS, 1); }
static int k_min_all(KARGS) { return maxmin_all(PASS, 2); }
static int empty_red(const fl_tensor_t *x, const fl_arg_t *dims) {
    uint32_t mask;
    if (fl_numel(x)) return 0;
    if (parse_dims(dims, x->ndim, &mask)) return 0;
    if (!dims || dims->kind == FL_ARG_NONE) return 1;
    for (int d = 0; d < x->ndim; d++) if ((mask >> d & 1) && x->sizes[d] == 0) return 1;
    return 0;
}
static int maxmin_dim(KARGS, int mn) { /* max.dim(self, dim, keepdim) -> (values, indices) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_out_ok(out, n_out) || !fl_out_at(out, n_out, 1) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    if (empty_red(x, &args[1]))
        return fail(FL_ERR_INVALID, "%s(): Expected reduction dim %lld to have non-zero size.", mn ? "min" : "max", (long long)args[1].i);
    rx_t rx = {&out[1], (mn ? 1 : 0) | 2 | 4, 0};
    return reduce_x(D, stream, x, &args[1], bool_at(args, n_args, 2), &out[0], 3, 0, &rx);
}
static int k_max_dim(KARGS) { return maxmin_dim(PASS, 0); }
static int k_min_dim(KARGS) { return maxmin_dim(PASS, 1); }
static int argext(KARGS, int mn) { /* argmax(self, dim?, keepdim) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out) || out[0].dtype != FL_INT64) return UNSUP;
    const fl_arg_t *dims = n_args > 1 ? &args[1] : NULL;
    if (dims && dims->kind != FL_ARG_NONE && dims->kind != FL_ARG_INT) return UNSUP;
    if (empty_red(x, dims))
        return fail(FL_ERR_INVALID, "%s(): Expected reduction dim to be specified for input.numel() == 0.", mn ? "argmin" : "argmax");
    int all = !dims || dims->kind == FL_ARG_NONE;
    int keep = bool_at(args, n_args, 2);
    /* the values go nowhere: r_arg writes only the indices (out is passed as both, flags 4) */
    fl_tensor_t ov = out[0];
    ov.dtype = x->dtype;
    if (all && keep) { /* argmax(keepdim=True) without dim: a [1]*ndim output */
        rx_t rx = {&out[0], (mn ? 1 : 0) | 4, 0};
        return reduce_x(D, stream, x, NULL, 1, &ov, 3, 0, &rx);
    }
    rx_t rx = {&out[0], (mn ? 1 : 0) | 4, 0};
    return reduce_x(D, stream, x, all ? NULL : dims, all ? 0 : keep, &ov, 3, 0, &rx);
}
static int k_argmax(KARGS) { return argext(PASS, 0); }
static int k_argmin(KARGS) { return argext(PASS, 1); }
static int varstd(KARGS, int flags, int nouts) { /* var.correction(self, dim?, *, correction?, keepdim) ; var_mean -> (var, mean) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out) || n_out < nouts || (nouts == 2 && !fl_out_at(out, n_out, 1))) return UNSUP;
    if (!is_flt(x->dtype) || out[0].dtype != x->dtype) return UNSUP;
    double corr = (n_args > 2 && fl_arg_is_num(&args[2])) ? fl_arg_num(&args[2]) : 1.0;
    rx_t rx = {nouts == 2 ? &out[1] : NULL, flags | (nouts == 2 ? 2 : 0), corr};
    return reduce_x(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 3), &out[0], 4, 0, &rx);
}
static int k_var(KARGS) { return varstd(PASS, 0, 1); }
static int k_std(KARGS) { return varstd(PASS, 1, 1); }
static int k_var_mean(KARGS) { return varstd(PASS, 0, 2); }
static int k_std_mean(KARGS) { return varstd(PASS, 1, 2); }
/* cumsum(self, dim, dtype?): integer inputs accumulate in int64 (the output's dtype), floats in double */
typedef struct { int64_t osize[8], ost[2][8], off[2], ondim, nrows, L, lst[2]; } crow_t;
static int k_cumsum(KARGS) {
    DEV(device);
    const fl_tensor_t *x0 = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x0 || !fl_out_ok(out, n_out) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!dt_ok(D, o->dtype) || !dt_ok(D, x0->dtype) || o->dtype == FL_BOOL || o->ndim != x0->ndim) return UNSUP;
    for (int d = 0; d < o->ndim; d++) if (o->sizes[d] != x0->sizes[d]) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x0->ndim, &dim)) return fail(FL_ERR_INVALID, "cumsum: dimension out of range");
    dt_t od, xd;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x0, &xd))) return st;
    int64_t n = fl_numel(o);
    if (!n) return FL_OK;
    fl_tensor_t x = *x0;
    cl_mem tmpx = NULL;
    if (x0->dtype != o->dtype) {
        x.dtype = o->dtype; x.offset = 0;
        contig_strides(&x);
        dt_t td = {tmpbuf(D, (size_t)n * fl_itemsize(o->dtype), &st), 0};
        if (!td.m) return st;
        if ((st = copy_view(D, stream, &x, &td, x0, &xd))) { cl.clReleaseMemObject(td.m); return st; }
        tmpx = td.m; xd = td;
    }
    crow_t r;
    memset(&r, 0, sizeof r);
    const fl_tensor_t *ts[2] = {o, &x};
    r.nrows = 1;
    r.L = o->ndim ? o->sizes[dim] : 1;
    int on = 0;
    for (int d = 0; d < o->ndim; d++) {
        if (d == dim) { for (int k = 0; k < 2; k++) r.lst[k] = ts[k]->strides[d]; continue; }
        if (o->sizes[d] == 1) continue;
        r.osize[on] = o->sizes[d];
        for (int k = 0; k < 2; k++) r.ost[k][on] = ts[k]->strides[d];
        r.nrows *= o->sizes[d];
        on++;
    }
    r.ondim = on;
    r.off[0] = od.off + o->offset; r.off[1] = xd.off + x.offset;
    char prog[16];
    snprintf(prog, sizeof prog, "red:%s", tname(o->dtype));
    karg_t a[3] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &xd.m}, KA(r)};
    st = launch1(D, stream, prog, "cumsum", 3, a, r.nrows);
    if (tmpx) cl.clReleaseMemObject(tmpx);
    return st;
}

/* sort / topk: (values, int64 indices) along dim, by rank (stable) */
typedef struct { int64_t osize[8], ost[3][8], off[3], ondim, nrows, L, lst[3]; } srow_t;
static int sort_run(dev_t_ *D, fl_stream_t s, const fl_tensor_t *x, int dim, int64_t K, int desc, const fl_tensor_t *vo, const fl_tensor_t *io) {
    if (!dt_ok(D, x->dtype) || vo->dtype != x->dtype || io->dtype != FL_INT64 || vo->ndim != x->ndim || io->ndim != x->ndim) return UNSUP;
    for (int d = 0; d < x->ndim; d++)
        if (vo->sizes[d] != (d == dim ? K : x->sizes[d]) || io->sizes[d] != vo->sizes[d]) return UNSUP;
    dt_t vd, id, xd;
    int st;
    if ((st = tres(D, vo, &vd)) || (st = tres(D, io, &id)) || (st = tres(D, x, &xd))) return st;
    if (!fl_numel(vo)) return FL_OK;
    srow_t r;
    memset(&r, 0, sizeof r);
    const fl_tensor_t *ts[3] = {vo, io, x};
    r.nrows = 1;
    r.L = x->ndim ? x->sizes[dim] : 1;
    int on = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (d == dim) { for (int k = 0; k < 3; k++) r.lst[k] = ts[k]->strides[d]; continue; }
        if (x->sizes[d] == 1) continue;
        r.osize[on] = x->sizes[d];
        for (int k = 0; k < 3; k++) r.ost[k][on] = ts[k]->strides[d];
        r.nrows *= x->sizes[d];
        on++;
    }
    r.ondim = on;
    r.off[0] = vd.off + vo->offset; r.off[1] = id.off + io->offset; r.off[2] = xd.off + x->offset;
    char prog[16];
    snprintf(prog, sizeof prog, "red:%s", tname(x->dtype));
    if (r.L <= 1024) { /* short rows: every element finds its rank (O(L^2) per row, one pass) */
        karg_t a[6] = {{sizeof(cl_mem), &vd.m}, {sizeof(cl_mem), &id.m}, {sizeof(cl_mem), &xd.m}, KA(r), KA(K), KA(desc)};
        return launch1(D, s, prog, "sort_rank", 6, a, r.nrows * r.L);
    }
    int64_t P = 1;
    while (P < r.L) P <<= 1;
    cl_mem km = tmpbuf(D, (size_t)(r.nrows * P) * fl_itemsize(x->dtype), &st);
    if (!km) return st;
    cl_mem im = tmpbuf(D, (size_t)(r.nrows * P) * 8, &st);
    if (!im) { cl.clReleaseMemObject(km); return st; }
    karg_t a[5] = {{sizeof(cl_mem), &km}, {sizeof(cl_mem), &im}, {sizeof(cl_mem), &xd.m}, KA(r), KA(P)};
    st = launch1(D, s, prog, "bs_init", 5, a, r.nrows * P);
    for (int64_t kk = 2; kk <= P && !st; kk <<= 1)
        for (int64_t j = kk >> 1; j > 0 && !st; j >>= 1) {
            karg_t b[8] = {{sizeof(cl_mem), &km}, {sizeof(cl_mem), &im}, KA(r.nrows), KA(P), KA(r.L), KA(j), KA(kk), KA(desc)};
            st = launch1(D, s, prog, "bs_step", 8, b, r.nrows * P);
        }
    if (!st) {
        karg_t c[7] = {{sizeof(cl_mem), &vd.m}, {sizeof(cl_mem), &id.m}, {sizeof(cl_mem), &km}, {sizeof(cl_mem), &im}, KA(r), KA(P), KA(K)};
        st = launch1(D, s, prog, "bs_out", 7, c, r.nrows * K);
    }
    cl.clReleaseMemObject(km); /* OpenCL keeps them until the queued kernels are done */
    cl.clReleaseMemObject(im);
    return st;
}
static int sort_k(KARGS, int stable) { /* sort(self, dim, descending) ; sort.stable(self, *, stable?, dim, descending) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_out_ok(out, n_out) || !fl_out_at(out, n_out, 1)) return UNSUP;
    int dk = stable ? 2 : 1;
    int64_t d0 = fl_arg_int_or(args, n_args, dk, -1);
    int desc = (int)fl_arg_int_or(args, n_args, dk + 1, 0);
    int dim;
    if (fl_wrap_dim(d0, x->ndim, &dim)) return fail(FL_ERR_INVALID, "sort: dimension out of range");
    return sort_run(D, stream, x, dim, x->ndim ? x->sizes[dim] : 1, desc, &out[0], &out[1]);
}
static int k_sort_stable(KARGS) { return sort_k(PASS, 1); }
static int k_topk(KARGS) { /* topk(self, k, dim, largest, sorted) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_out_ok(out, n_out) || !fl_out_at(out, n_out, 1) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    int dim;
    if (fl_wrap_dim(fl_arg_int_or(args, n_args, 2, -1), x->ndim, &dim)) return fail(FL_ERR_INVALID, "topk: dimension out of range");
    int64_t K = args[1].i, L = x->ndim ? x->sizes[dim] : 1;
    if (K < 0 || K > L) return fail(FL_ERR_INVALID, "selected index k out of range");
    /* sorted=False: PyTorch leaves the order unspecified; these are sorted */
    return sort_run(D, stream, x, dim, K, (int)fl_arg_int_or(args, n_args, 3, 1), &out[0], &out[1]);
}

/* ------------------------------------------------------------------ softmax family */
typedef struct { int64_t osize[8], ost[3][8], off[3], ondim, nrows, L, lst[3]; } rows_t;
static int softmax_run(dev_t_ *D, fl_stream_t s, const fl_tensor_t *o, const fl_tensor_t *x, const fl_tensor_t *y, int dim, int kind) {
    if (!is_flt(o->dtype) || !dt_ok(D, o->dtype) || x->dtype != o->dtype || (y && y->dtype != o->dtype)) return UNSUP;
    if (x->ndim != o->ndim || (y && y->ndim != o->ndim)) return UNSUP;
    for (int d = 0; d < o->ndim; d++) if (x->sizes[d] != o->sizes[d] || (y && y->sizes[d] != o->sizes[d])) return UNSUP;
    dt_t od, xd, yd = {0, 0};
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x, &xd)) || (y && (st = tres(D, y, &yd)))) return st;
    if (!fl_numel(o)) return FL_OK;
    rows_t r;
    memset(&r, 0, sizeof r);
    const fl_tensor_t *ts[3] = {o, x, y ? y : x};
    int64_t base[3] = {od.off, xd.off, y ? yd.off : xd.off};
    r.nrows = 1;
    r.L = o->ndim ? o->sizes[dim] : 1;
    int on = 0;
    for (int d = 0; d < o->ndim; d++) {
        if (d == dim) { for (int k = 0; k < 3; k++) r.lst[k] = ts[k]->strides[d]; continue; }
        if (o->sizes[d] == 1) continue;
        r.osize[on] = o->sizes[d];
        for (int k = 0; k < 3; k++) r.ost[k][on] = ts[k]->strides[d];
        r.nrows *= o->sizes[d];
        on++;
    }
    r.ondim = on;
    for (int k = 0; k < 3; k++) r.off[k] = base[k] + ts[k]->offset;
    cl_mem ym = y ? yd.m : xd.m;
    int kd = kind;
    char prog[16];
    snprintf(prog, sizeof prog, "nn:%s", tname(o->dtype));
    karg_t a[5] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &xd.m}, {sizeof(cl_mem), &ym}, KA(r), KA(kd)};
    return launch1(D, s, prog, "softmax", 5, a, r.nrows);
}
static int softmax_k(KARGS, int kind) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    if (n_args > 2 && args[2].kind == FL_ARG_BOOL && args[2].i) return UNSUP; /* half_to_float */
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) return fail(FL_ERR_INVALID, "softmax: dimension out of range");
    return softmax_run(D, stream, &out[0], x, NULL, dim, kind);
}
static int softmax_bw_k(KARGS, int kind) { /* (grad_output, output, dim, input_dtype) */
    DEV(device);
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *y = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!g || !y || !fl_out_ok(out, n_out) || n_args < 3 || args[2].kind != FL_ARG_INT) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[2].i, g->ndim, &dim)) return fail(FL_ERR_INVALID, "softmax backward: dimension out of range");
    return softmax_run(D, stream, &out[0], g, y, dim, kind);
}
static int k_softmax(KARGS) { return softmax_k(PASS, 0); }
static int k_log_softmax(KARGS) { return softmax_k(PASS, 1); }
static int k_softmax_bw(KARGS) { return softmax_bw_k(PASS, 3); }
static int k_log_softmax_bw(KARGS) { return softmax_bw_k(PASS, 4); }

/* ------------------------------------------------------------------ layer norm */
static int contig_of(dev_t_ *D, const fl_tensor_t *t, int dt, int64_t numel, dt_t *r) {
    if (!t) { r->m = NULL; r->off = 0; return FL_OK; }
    if (t->dtype != dt || !fl_is_contiguous(t) || fl_numel(t) != numel) return UNSUP;
    int st = tres(D, t, r);
    r->off += t->offset;
    return st;
}
static int k_layer_norm(KARGS) { /* native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 3 || n_args < 5 || args[1].kind != FL_ARG_INT_LIST || !fl_arg_is_num(&args[4])) return UNSUP;
    int T = x->dtype;
    if (!is_flt(T) || !dt_ok(D, T)) return UNSUP;
    int nn = args[1].len;
    if (nn > x->ndim) return UNSUP;
    int64_t N = 1, total = fl_numel(x);
    for (int k = 0; k < nn; k++) N *= args[1].list[k];
    if (N == 0 || total % N) return UNSUP;
    int64_t M = total / N;
    const fl_tensor_t *w = fl_arg_tensor(args, n_args, 2, in, n_in), *b = fl_arg_tensor(args, n_args, 3, in, n_in);
    dt_t xd, od, md, rd, wd, bd;
    int st;
    if ((st = contig_of(D, x, T, total, &xd)) || (st = contig_of(D, &out[0], T, total, &od)) ||
        (st = contig_of(D, fl_out_at(out, n_out, 1), T, M, &md)) || (st = contig_of(D, fl_out_at(out, n_out, 2), T, M, &rd)) ||
        (st = contig_of(D, w, T, N, &wd)) || (st = contig_of(D, b, T, N, &bd)))
        return st;
    if (!M) return FL_OK;
    int flags = (w ? 1 : 0) | (b ? 2 : 0) | (md.m && rd.m ? 4 : 0);
    cl_mem mm = md.m ? md.m : od.m, rm = rd.m ? rd.m : od.m, wm = w ? wd.m : od.m, bm = b ? bd.m : od.m;
    real_t re;
    char prog[16];
    snprintf(prog, sizeof prog, "nn:%s", tname(T));
    karg_t a[16] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &mm}, {sizeof(cl_mem), &rm}, {sizeof(cl_mem), &xd.m},
                    {sizeof(cl_mem), &wm}, {sizeof(cl_mem), &bm}, KA(xd.off), KA(od.off), KA(md.off), KA(rd.off),
                    KA(wd.off), KA(bd.off), KA(M), KA(N), ka_real(D, &re, fl_arg_num(&args[4])), KA(flags)};
    return launch1(D, stream, prog, "ln_fwd", 16, a, M);
}
static int k_layer_norm_bw(KARGS) {
    /* native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask) */
    DEV(device);
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *x = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *mean = fl_arg_tensor(args, n_args, 3, in, n_in), *rstd = fl_arg_tensor(args, n_args, 4, in, n_in);
    const fl_tensor_t *w = fl_arg_tensor(args, n_args, 5, in, n_in);
    if (!g || !x || !mean || !rstd || n_args < 3 || args[2].kind != FL_ARG_INT_LIST) return UNSUP;
    int T = x->dtype;
    if (!is_flt(T) || !dt_ok(D, T) || g->dtype != T) return UNSUP;
    int64_t N = 1, total = fl_numel(x);
    for (int k = 0; k < args[2].len; k++) N *= args[2].list[k];
    if (N == 0 || total % N) return UNSUP;
    int64_t M = total / N;
    const fl_tensor_t *gi = fl_out_at(out, n_out, 0), *gw = fl_out_at(out, n_out, 1), *gb = fl_out_at(out, n_out, 2);
    dt_t gd, xd, md, rd, wd, gid, gwd, gbd;
    int st;
    if ((st = contig_of(D, g, T, total, &gd)) || (st = contig_of(D, x, T, total, &xd)) || (st = contig_of(D, mean, T, M, &md)) ||
        (st = contig_of(D, rstd, T, M, &rd)) || (st = contig_of(D, w, T, N, &wd)) || (st = contig_of(D, gi, T, total, &gid)) ||
        (st = contig_of(D, gw, T, N, &gwd)) || (st = contig_of(D, gb, T, N, &gbd)))
        return st;
    char prog[16];
    snprintf(prog, sizeof prog, "nn:%s", tname(T));
    if (gi && M) {
        int flags = w ? 1 : 0;
        cl_mem wm = w ? wd.m : gd.m;
        karg_t a[15] = {{sizeof(cl_mem), &gid.m}, {sizeof(cl_mem), &gd.m}, {sizeof(cl_mem), &xd.m}, {sizeof(cl_mem), &md.m},
                        {sizeof(cl_mem), &rd.m}, {sizeof(cl_mem), &wm}, KA(gid.off), KA(gd.off), KA(xd.off), KA(md.off),
                        KA(rd.off), KA(wd.off), KA(M), KA(N), KA(flags)};
        if ((st = launch1(D, stream, prog, "ln_bwd_in", 15, a, M))) return st;
    }
    if (gw || gb) {
        if (!M) { /* sums over no rows */
            if (gw && (st = fill_bits(D, stream, gw, 0))) return st;
            if (gb && (st = fill_bits(D, stream, gb, 0))) return st;
            return FL_OK;
        }
        int flags = (gw ? 1 : 0) | (gb ? 2 : 0);
        cl_mem wm = gw ? gwd.m : gbd.m, bm = gb ? gbd.m : gwd.m;
        karg_t a[15] = {{sizeof(cl_mem), &wm}, {sizeof(cl_mem), &bm}, {sizeof(cl_mem), &gd.m}, {sizeof(cl_mem), &xd.m},
                        {sizeof(cl_mem), &md.m}, {sizeof(cl_mem), &rd.m}, KA(gwd.off), KA(gbd.off), KA(gd.off), KA(xd.off),
                        KA(md.off), KA(rd.off), KA(M), KA(N), KA(flags)};
        if ((st = launch1(D, stream, prog, "ln_bwd_wb", 15, a, N))) return st;
    }
    return FL_OK;
}

/* ------------------------------------------------------------------ GEMM */
typedef struct { int64_t M, N, K, ao, ars, acs, abs, bo, brs, bbs, co, crs, cbs, accum; real_t alpha; } gemm_t;
/* a (batch of) matrix in a buffer: element (b, i, j) at off + b * bs + i * rs + j * cs */
typedef struct { cl_mem m; int64_t off, rs, cs, bs; } mat_t;

/* C[b] (+)= alpha A[b] @ B[b] on buffers, K > 0. A has any strides; C has unit column stride; a B without it
 * is first copied into a contiguous temporary. CLBlast where clblast.c says so, else the plugin's kernel. */
static int gemm_mats(dev_t_ *D, fl_stream_t s, int T, int64_t batch, int64_t M, int64_t N, int64_t K, mat_t a, mat_t b,
                     mat_t c, double alpha, int accum) {
    if (!M || !N || !batch) return FL_OK;
    if (N == 1) b.cs = c.cs = 1;
    if (c.cs != 1) return UNSUP; /* the output has unit column stride (every layout the runtime allocates for these ops) */
    if (batch == 1) a.bs = b.bs = c.bs = 0;
    gemm_t g;
    memset(&g, 0, sizeof g);
    g.M = M; g.N = N; g.K = K; g.accum = accum;
    g.ao = a.off; g.ars = a.rs; g.acs = a.cs; g.abs = a.bs;
    g.bo = b.off; g.brs = b.rs; g.bbs = b.bs;
    g.co = c.off; g.crs = c.rs; g.cbs = c.bs;
    if (D->fp64) g.alpha.d = alpha; else g.alpha.f = (float)alpha;
    if ((T == FL_FLOAT32 || T == FL_FLOAT64) && ocl_clblast_for(D->host_cpu)) { /* CLBlast (clblast.c says when) */
        int cst = 0;
        int r = ocl_clblast_gemm(qof(D, s), T == FL_FLOAT64, batch, M, N, K, alpha, a.m, g.ao, g.ars, g.acs, g.abs,
                                 b.m, g.bo, g.brs, b.cs, g.bbs, c.m, g.co, g.crs, g.cbs, accum, &cst);
        if (r == 0) return FL_OK;
        if (r < 0) return fail(FL_ERR_INTERNAL, NAME ": CLBlast's GEMM (%lld x %lld x %lld, batch %lld) failed with "
                               "status %d; FL_OPENCL_CLBLAST=0 uses the plugin's own kernel", (long long)M, (long long)N,
                               (long long)K, (long long)batch, cst);
    }
    int st = FL_OK;
    cl_mem tmp = NULL, bm = b.m;
    if (b.cs != 1) { /* B transposed or strided: make it contiguous first */
        fl_tensor_t src, tb;
        memset(&src, 0, sizeof src);
        src.dtype = T; src.ndim = 3; src.offset = 0;
        src.sizes[0] = batch; src.sizes[1] = K; src.sizes[2] = N;
        src.strides[0] = b.bs; src.strides[1] = b.rs; src.strides[2] = b.cs;
        tb = src;
        contig_strides(&tb);
        dt_t sd = {b.m, b.off}, td = {tmpbuf(D, (size_t)(batch * K * N) * fl_itemsize(T), &st), 0};
        if (!td.m) return st;
        if ((st = copy_view(D, s, &tb, &td, &src, &sd))) { cl.clReleaseMemObject(td.m); return st; }
        tmp = td.m; bm = td.m;
        g.bo = 0; g.brs = N; g.bbs = batch > 1 ? K * N : 0;
    }
    char prog[16];
    snprintf(prog, sizeof prog, "nn:%s", tname(T));
    karg_t ka[4] = {{sizeof(cl_mem), &c.m}, {sizeof(cl_mem), &a.m}, {sizeof(cl_mem), &bm}, KA(g)};
    size_t gs[3] = {(size_t)((N + 63) / 64), (size_t)((M + 63) / 64), (size_t)batch}, ls[3] = {1, 1, 1};
    st = launch(D, s, prog, "gemm", 4, ka, 3, gs, ls);
    if (tmp) cl.clReleaseMemObject(tmp);
    return st;
}

/* C[b] (+)= alpha A[b] @ B[b]; views given as (tensor, batch dim or -1) */
static int gemm_run(dev_t_ *D, fl_stream_t s, int T, int64_t batch, int64_t M, int64_t N, int64_t K, const fl_tensor_t *a,
                    const fl_tensor_t *b, const fl_tensor_t *c, double alpha, int accum) {
    int bd = a->ndim == 3; /* the batch dim is dim 0 for bmm */
    int i0 = bd, i1 = bd + 1;
    dt_t ad, bdd, cd;
    int st;
    if ((st = tres(D, a, &ad)) || (st = tres(D, b, &bdd)) || (st = tres(D, c, &cd))) return st;
    if (!M || !N || !batch) return FL_OK;
    if ((N == 1 ? 1 : c->strides[i1]) != 1) return UNSUP;
    if (K == 0) return accum ? FL_OK : fill_bits(D, s, c, 0);
    mat_t am = {ad.m, ad.off + a->offset, a->strides[i0], a->strides[i1], bd ? a->strides[0] : 0};
    mat_t bm = {bdd.m, bdd.off + b->offset, b->strides[i0], b->strides[i1], bd ? b->strides[0] : 0};
    mat_t cm = {cd.m, cd.off + c->offset, c->strides[i0], 1, bd ? c->strides[0] : 0};
    return gemm_mats(D, s, T, batch, M, N, K, am, bm, cm, alpha, accum);
}
static int mm_check(dev_t_ *D, const fl_tensor_t *a, const fl_tensor_t *b, const fl_tensor_t *o, int nd) {
    if (a->ndim != nd || b->ndim != nd || o->ndim != nd) return UNSUP;
    if (!is_flt(o->dtype) || !dt_ok(D, o->dtype) || a->dtype != o->dtype || b->dtype != o->dtype) return UNSUP;
    int i = nd - 2;
    if (b->sizes[i] != a->sizes[i + 1] || o->sizes[i] != a->sizes[i] || o->sizes[i + 1] != b->sizes[i + 1]) return UNSUP;
    if (nd == 3 && (a->sizes[0] != o->sizes[0] || b->sizes[0] != o->sizes[0])) return UNSUP;
    return FL_OK;
}
static int k_mm(KARGS) {
    (void)args; (void)n_args;
    DEV(device);
    if (n_in < 2 || !fl_out_ok(out, n_out)) return UNSUP;
    if (mm_check(D, &in[0], &in[1], &out[0], 2)) return UNSUP;
    return gemm_run(D, stream, out[0].dtype, 1, in[0].sizes[0], in[1].sizes[1], in[0].sizes[1], &in[0], &in[1], &out[0], 1.0, 0);
}
static int k_bmm(KARGS) {
    (void)args; (void)n_args;
    DEV(device);
    if (n_in < 2 || !fl_out_ok(out, n_out)) return UNSUP;
    if (mm_check(D, &in[0], &in[1], &out[0], 3)) return UNSUP;
    return gemm_run(D, stream, out[0].dtype, out[0].sizes[0], in[0].sizes[1], in[1].sizes[2], in[0].sizes[2], &in[0], &in[1], &out[0], 1.0, 0);
}
static int k_addmm(KARGS) { /* addmm(self, mat1, mat2, beta, alpha) */
    DEV(device);
    const fl_tensor_t *self = fl_arg_tensor(args, n_args, 0, in, n_in), *a = fl_arg_tensor(args, n_args, 1, in, n_in),
                      *b = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!self || !a || !b || !fl_out_ok(out, n_out) || n_args < 5 || !fl_arg_is_num(&args[3]) || !fl_arg_is_num(&args[4])) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (mm_check(D, a, b, o, 2) || self->dtype != o->dtype) return UNSUP;
    if ((o->sizes[1] == 1 ? 1 : o->strides[1]) != 1) return UNSUP;
    double beta = fl_arg_num(&args[3]), alpha = fl_arg_num(&args[4]);
    int st;
    fl_tensor_t sv;
    if (fl_bcast(self, 2, o->sizes, &sv)) return UNSUP;
    dt_t sd, odd;
    if ((st = tres(D, &sv, &sd)) || (st = tres(D, o, &odd))) return st;
    if (odd.m && sd.m == odd.m && fl_numel(o)) return UNSUP; /* addmm_ (self is the output): not handled here */
    if (beta != 0) {
        opnd_t ops[2];
        memset(ops, 0, sizeof ops);
        ops[0].v = sv; ops[0].d = sd;
        ops[1].scalar = 1; ops[1].sd = beta; ops[1].si = (int64_t)beta;
        if ((st = ew_run(D, stream, o->dtype, "b_mul", o, 2, ops, 0, 0))) return st;
    }
    return gemm_run(D, stream, o->dtype, 1, a->sizes[0], b->sizes[1], a->sizes[1], a, b, o, alpha, beta != 0);
}

/* ------------------------------------------------------------------ convolution
 * aten::convolution and aten::convolution_backward under the names, argument order and output conventions of
 * the host plugin's kernels (plugins_cffi/host/k_conv.c), which the runtime calls the same way:
 *   convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
 *   convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation, transposed,
 *                        output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)
 * Served: 2-D and 1-D (as 2-D with one row), plain and transposed, float32 and float64 (where the device has
 * fp64), any stride, padding, dilation, output padding and groups, inputs and outputs of any strides. The rest
 * (3-D, float16) declines before anything is queued, and the runtime uses its next tier (a decomposition into
 * views and bmm). A transposed convolution is, as in k_conv.c, the ordinary one with the roles swapped: its
 * forward is the ordinary input gradient, its input gradient the ordinary forward.
 *
 * All of it is GEMMs over a column buffer in (j, k) layout, j = (sample, output pixel) and k = (channel, tap),
 * one GEMM per group g (Og = O/G output channels, Kg = C/G * KH * KW taps), with dY packed once per chunk as
 * a (j, O) matrix:
 *   forward      Y^T (j, o)  = cols(X) (j, k) @ W_g (o, k)^T      gemm_nt, into a (j, O) temporary, then Y
 *   grad_weight  dW_g (o, k) += dY^T (o, j) @ cols(X) (j, k)      straight into grad_weight, over the chunks
 *   grad_input   cols (j, k)  = dY (j, o) @ W_g (o, k)            then col2im into grad_input
 * Why these layouts: the plugin's gemm vectorizes along C's second index and needs unit stride there in B and C;
 * here that index is an output channel or a tap, never a pixel of one image alone (a late ResNet stage at 64x64
 * input has 2x2 pixels, far below a tile), and j spans the samples of a chunk. The weight is read as it is
 * stored, never transposed: gemm_nt takes it as (o, k) rows (a transposing copy of ResNet-50's late weights
 * cost more than their GEMMs). A 1x1, stride-1, unpadded convolution over images that fill a tile is one GEMM
 * per sample straight from X into Y: Y[n] = W_g @ X[n].
 * Samples go in chunks whose buffers stay within CONV_CHUNK_BYTES (and the device's largest allocation);
 * temporaries are released right after their commands are queued, which OpenCL allows (the queue keeps them
 * until those commands are done). */
#define CONV_CHUNK_BYTES ((int64_t)64 << 20)
#define CONV_DIRECT_PIXELS 64 /* the 1x1 direct path: pixels per image, at least one GEMM tile's columns */
typedef struct { int64_t C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, xs[4], xoff, n0, nb, ks, js; } conv_t;
typedef struct { int64_t I, J, soff, sb, si, sj, doff, db, di, dj; } tcopy_t;
typedef struct { int64_t M, N, K, ao, ars, bo, brs, co, crs, accum; } gnt_t;
typedef struct { int64_t N, C, H, W, O, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, G; } cgeom_t;

static int conv_list2(const fl_arg_t *a, int spatial, int64_t dflt, int64_t v[2]) {
    if (a->kind == FL_ARG_INT) { v[0] = v[1] = a->i; return 1; }
    if (a->kind != FL_ARG_INT_LIST) return 0;
    if (a->len == 0) { v[0] = v[1] = dflt; return 1; }
    if (a->len == 1) { v[0] = v[1] = a->list[0]; return 1; }
    if (a->len == 2 && spatial == 2) { v[0] = a->list[0]; v[1] = a->list[1]; return 1; }
    return 0;
}
/* t as a 4-D NCHW tensor: a 2-D convolution's itself, a 1-D convolution's (N, C, L) as (N, C, 1, L) */
static void conv_4d(const fl_tensor_t *t, fl_tensor_t *v) {
    *v = *t;
    if (t->ndim != 3) return;
    v->ndim = 4;
    v->sizes[3] = t->sizes[2]; v->strides[3] = t->strides[2];
    v->sizes[2] = 1; v->strides[2] = t->strides[2] * t->sizes[2];
}
/* The geometry of the ordinary convolution from its input x (N, C, H, W) to its output y (N, O, OH, OW) with the
 * weight (O, C/G, KH, KW), all 4-D (conv_4d), and the stride, padding and dilation arguments at
 * a_stride..a_stride+2 (one value each for a 1-D convolution: spatial 1); checked as k_conv.c checks it. A
 * transposed convolution runs from y to x: its output_padding may leave x one step longer than y needs. */
static int conv_geom(cgeom_t *g, const fl_tensor_t *x, const fl_tensor_t *y, const fl_tensor_t *w, const fl_arg_t *args,
                     int a_stride, const fl_arg_t *groups, int spatial, int transposed) {
    int64_t st[2], pd[2], dl[2];
    if (!conv_list2(&args[a_stride], spatial, 1, st) || !conv_list2(&args[a_stride + 1], spatial, 0, pd) ||
        !conv_list2(&args[a_stride + 2], spatial, 1, dl) || groups->kind != FL_ARG_INT)
        return UNSUP;
    if (spatial == 1) { st[0] = 1; pd[0] = 0; dl[0] = 1; } /* the one row */
    *g = (cgeom_t){x->sizes[0], x->sizes[1], x->sizes[2], x->sizes[3], y->sizes[1], y->sizes[2], y->sizes[3],
                   w->sizes[2], w->sizes[3], st[0], st[1], pd[0], pd[1], dl[0], dl[1], groups->i};
    if (y->sizes[0] != g->N) return fail(FL_ERR_INVALID, "convolution: batch sizes differ");
    if (g->G < 1 || g->C % g->G || g->O % g->G) return fail(FL_ERR_INVALID, "convolution: bad groups %lld", (long long)g->G);
    if (g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1 || g->ph < 0 || g->pw < 0)
        return fail(FL_ERR_INVALID, "convolution: bad stride/padding/dilation");
    if (w->sizes[0] != g->O || w->sizes[1] * g->G != g->C)
        return fail(FL_ERR_INVALID, "convolution: weight shape does not match the channels");
    int64_t eh = g->H + 2 * g->ph - g->dh * (g->KH - 1) - 1, ew = g->W + 2 * g->pw - g->dw * (g->KW - 1) - 1;
    int64_t oh = eh < 0 ? 0 : eh / g->sh + 1, ow = ew < 0 ? 0 : ew / g->sw + 1;
    int loose = transposed && g->OH <= oh && g->OW <= ow && g->OH + g->sh + g->dh > oh && g->OW + g->sw + g->dw > ow;
    if (g->N > 0 && (oh != g->OH || ow != g->OW) && !loose)
        return fail(FL_ERR_INVALID, "convolution: output extent %lldx%lld, expected %lldx%lld", (long long)g->OH,
                    (long long)g->OW, (long long)oh, (long long)ow);
    /* im2col and col2im index pixels, taps and columns in 32-bit ints (element offsets stay 64-bit) */
    const int64_t lim = 0x7fffffff;
    if (g->N * g->OH * g->OW > lim || g->C * g->KH * g->KW > lim || g->H * g->W > lim || g->N * g->C > lim ||
        g->sh * g->OH + g->dh * g->KH > lim || g->sw * g->OW + g->dw * g->KW > lim || g->ph + g->H > lim ||
        g->pw + g->W > lim)
        return fail(UNSUP, NAME ": convolution: sizes beyond the kernels' 32-bit pixel indices");
    return FL_OK;
}
/* The stride of dims d0.. of t taken as one dimension, or -1 when they do not form one (size-1 dims fit
 * anywhere). */
static int64_t merged_stride(const fl_tensor_t *t, int d0) {
    int64_t st = 1, inner = 1;
    int have = 0;
    for (int d = t->ndim - 1; d >= d0; d--) {
        if (t->sizes[d] == 1) continue;
        if (have && t->strides[d] != st * inner) return -1;
        if (!have) { st = t->strides[d]; have = 1; }
        inner *= t->sizes[d];
    }
    return st;
}
/* Samples per chunk: as many as keep a (nb * OH * OW) x row_len buffer within the budget, at least one. */
static int64_t conv_chunk(dev_t_ *D, const cgeom_t *g, size_t isz, int64_t row_len) {
    int64_t budget = CONV_CHUNK_BYTES;
    if ((uint64_t)budget > D->max_alloc) budget = (int64_t)D->max_alloc;
    int64_t per = g->OH * g->OW * row_len * (int64_t)isz, nb = per > 0 ? budget / per : g->N;
    return nb < 1 ? 1 : nb > g->N ? g->N : nb;
}
/* im2col (x the input) or col2im (x grad_input) for samples [n0, n0 + nb), the column buffer in (j, k) layout */
static int conv_cols(dev_t_ *D, fl_stream_t s, int T, const cgeom_t *g, const fl_tensor_t *x, const dt_t *xd, cl_mem col,
                     int64_t n0, int64_t nb, int to_cols) {
    conv_t c = {g->C, g->H, g->W, g->OH, g->OW, g->KH, g->KW, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw,
                {x->strides[0], x->strides[1], x->strides[2], x->strides[3]}, xd->off + x->offset, n0, nb,
                1, g->C * g->KH * g->KW};
    char prog[16];
    snprintf(prog, sizeof prog, "conv:%s", tname(T));
    if (to_cols) {
        if (g->C == 0 || nb * g->OH * g->OW == 0) return FL_OK;
        size_t gs[2] = {(size_t)g->C, (size_t)(nb * g->OH * g->OW)};
        karg_t a[3] = {{sizeof(cl_mem), &col}, {sizeof(cl_mem), &xd->m}, KA(c)};
        return launch(D, s, prog, "im2col", 3, a, 2, gs, NULL);
    }
    if (g->W == 0 || g->H == 0 || nb * g->C == 0) return FL_OK;
    size_t gs[3] = {(size_t)g->W, (size_t)g->H, (size_t)(nb * g->C)};
    karg_t a[3] = {{sizeof(cl_mem), &xd->m}, {sizeof(cl_mem), &col}, KA(c)};
    return launch(D, s, prog, "col2im", 3, a, 3, gs, NULL);
}
/* dst(b, i, j) = src(b, i, j) over (B, t.I, t.J), both strided, in 16 x 16 tiles */
static int conv_tile_copy(dev_t_ *D, fl_stream_t s, int T, cl_mem dst, cl_mem src, int64_t B, tcopy_t t) {
    if (!B || !t.I || !t.J) return FL_OK;
    char prog[16];
    snprintf(prog, sizeof prog, "conv:%s", tname(T));
    size_t gs[3] = {(size_t)((t.J + 15) / 16), (size_t)((t.I + 15) / 16), (size_t)B};
    karg_t a[3] = {{sizeof(cl_mem), &dst}, {sizeof(cl_mem), &src}, KA(t)};
    return launch(D, s, prog, "tile_copy", 3, a, 3, gs, NULL);
}
/* C (M x N) = A (M x K) @ B (N x K)^T, A and B with unit stride along K (mat_t.cs ignored), K > 0: CLBlast where
 * clblast.c says so (B^T is a transposed matrix to it), else the gemm_nt kernel */
static int conv_gemm_nt(dev_t_ *D, fl_stream_t s, int T, int64_t M, int64_t N, int64_t K, mat_t a, mat_t b, mat_t c) {
    if (!M || !N) return FL_OK;
    if (ocl_clblast_for(D->host_cpu)) {
        int cst = 0;
        int r = ocl_clblast_gemm(qof(D, s), T == FL_FLOAT64, 1, M, N, K, 1.0, a.m, a.off, a.rs, 1, 0, b.m, b.off, 1, b.rs, 0,
                                 c.m, c.off, c.rs, 0, 0, &cst);
        if (r == 0) return FL_OK;
        if (r < 0) return fail(FL_ERR_INTERNAL, NAME ": CLBlast's GEMM (%lld x %lld x %lld, convolution) failed with "
                               "status %d; FL_OPENCL_CLBLAST=0 uses the plugin's own kernel", (long long)M, (long long)N,
                               (long long)K, cst);
    }
    gnt_t g = {M, N, K, a.off, a.rs, b.off, b.rs, c.off, c.rs, 0};
    char prog[16];
    snprintf(prog, sizeof prog, "conv:%s", tname(T));
    karg_t ka[4] = {{sizeof(cl_mem), &c.m}, {sizeof(cl_mem), &a.m}, {sizeof(cl_mem), &b.m}, KA(g)};
    size_t gs[2] = {(size_t)((N + 3) / 4), (size_t)((M + 3) / 4)}, ls[2] = {1, 1};
    return launch(D, s, prog, "gemm_nt", 4, ka, 2, gs, ls);
}
/* A (j, O) matrix of samples [0, nb): element (sample, channel, pixel) at (sample * P + pixel) * O + channel */
static tcopy_t conv_jo(int64_t O, int64_t P) {
    tcopy_t t = {O, P, 0, P * O, 1, O, 0, P * O, 1, O};
    return t;
}

/* y (N, C, H, W) += b (C), when there is a bias */
static int conv_bias(dev_t_ *D, fl_stream_t s, int T, const fl_tensor_t *y, const dt_t *yd, const fl_tensor_t *b, const dt_t *bd) {
    if (!b) return FL_OK;
    opnd_t ops[2]; /* the bias broadcast along dims 0, 2, 3 */
    memset(ops, 0, sizeof ops);
    ops[0].v = *y; ops[0].d = *yd;
    ops[1].v = *y; ops[1].d = *bd;
    ops[1].v.offset = b->offset;
    ops[1].v.strides[0] = ops[1].v.strides[2] = ops[1].v.strides[3] = 0;
    ops[1].v.strides[1] = b->strides[0];
    return ew_run(D, s, T, "b_add", y, 2, ops, 1.0, 0);
}

/* y = conv(x, w) + b (ordinary convolution space: x (N, C, H, W), y (N, O, OH, OW)) */
static int conv_fwd(dev_t_ *D, fl_stream_t s, int T, const cgeom_t *g, const fl_tensor_t *x, const dt_t *xd,
                    const fl_tensor_t *w, const dt_t *wd, const fl_tensor_t *b, const dt_t *bd, const fl_tensor_t *y,
                    const dt_t *yd) {
    const int64_t P = g->OH * g->OW, KK = g->KH * g->KW, Cg = g->C / g->G, Og = g->O / g->G, Kg = Cg * KK;
    const int64_t CK = g->C * KK, O = g->O;
    const size_t isz = fl_itemsize(T);
    int st = FL_OK;
    if (fl_numel(y) == 0) return FL_OK;
    const int64_t xsp = merged_stride(x, 2), ysp = merged_stride(y, 2), wk = merged_stride(w, 1);
    if (Kg == 0) { /* no input channels: the bias alone */
        st = fill_bits(D, s, y, 0);
    } else if (g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 && xsp == 1 && ysp == 1 &&
               P >= CONV_DIRECT_PIXELS) { /* Y[n] (Og, P) = W_g (Og, C/G) @ X[n] (C/G, P), every sample at once */
        for (int64_t gr = 0; gr < g->G && !st; gr++) {
            mat_t am = {wd->m, wd->off + w->offset + gr * Og * w->strides[0], w->strides[0], w->strides[1], 0};
            mat_t bm = {xd->m, xd->off + x->offset + gr * Cg * x->strides[1], x->strides[1], 1, x->strides[0]};
            mat_t cm = {yd->m, yd->off + y->offset + gr * Og * y->strides[1], y->strides[1], 1, y->strides[0]};
            st = gemm_mats(D, s, T, g->N, Og, P, Cg, am, bm, cm, 1.0, 0);
        }
    } else {
        const int64_t nb_max = conv_chunk(D, g, isz, CK > O ? CK : O);
        cl_mem tmp = tmpbuf(D, (size_t)(nb_max * P * O) * isz, &st), col = NULL, wc = NULL;
        if (tmp) col = tmpbuf(D, (size_t)(nb_max * P * CK) * isz, &st);
        mat_t wm = {wd->m, wd->off + w->offset, w->strides[0], 1, 0};
        if (col && wk != 1) { /* gemm_nt reads the weight's rows along k: a contiguous copy first */
            fl_tensor_t wdense = *w;
            wdense.offset = 0;
            contig_strides(&wdense);
            dt_t wcd = {wc = tmpbuf(D, (size_t)(O * Kg) * isz, &st), 0};
            if (wc) st = copy_view(D, s, &wdense, &wcd, w, wd);
            wm = (mat_t){wc, 0, Kg, 1, 0};
        }
        for (int64_t n0 = 0; n0 < g->N && col && !st; n0 += nb_max) {
            const int64_t nb = g->N - n0 < nb_max ? g->N - n0 : nb_max;
            st = conv_cols(D, s, T, g, x, xd, col, n0, nb, 1);
            for (int64_t gr = 0; gr < g->G && !st; gr++) {
                mat_t am = {col, gr * Kg, CK, 1, 0}, bm = {wm.m, wm.off + gr * Og * wm.rs, wm.rs, 1, 0};
                mat_t cm = {tmp, gr * Og, O, 1, 0};
                st = conv_gemm_nt(D, s, T, nb * P, Og, Kg, am, bm, cm);
            }
            if (st) break;
            fl_tensor_t yv = *y, tv;
            yv.sizes[0] = nb;
            yv.offset += n0 * y->strides[0];
            if (ysp >= 0) { /* (j, O) -> NCHW in tiles */
                tcopy_t t = conv_jo(O, P);
                t.doff = yd->off + yv.offset; t.db = y->strides[0]; t.di = y->strides[1]; t.dj = ysp;
                st = conv_tile_copy(D, s, T, yd->m, tmp, nb, t);
            } else {
                memset(&tv, 0, sizeof tv);
                tv.dtype = T; tv.ndim = 4;
                tv.sizes[0] = nb; tv.sizes[1] = O; tv.sizes[2] = g->OH; tv.sizes[3] = g->OW;
                tv.strides[0] = P * O; tv.strides[1] = 1; tv.strides[2] = g->OW * O; tv.strides[3] = O;
                dt_t td = {tmp, 0};
                st = copy_view(D, s, &yv, yd, &tv, &td);
            }
        }
        if (tmp) cl.clReleaseMemObject(tmp);
        if (col) cl.clReleaseMemObject(col);
        if (wc) cl.clReleaseMemObject(wc);
    }
    return st ? st : conv_bias(D, s, T, y, yd, b, bd);
}

/* the ranks these kernels take: 1-D and 2-D convolutions (3-D and 4-D tensors), all of the same rank */
static int conv_rank_ok(const fl_tensor_t *x, const fl_tensor_t *w, const fl_tensor_t *y, const char *op) {
    if ((x->ndim != 3 && x->ndim != 4) || w->ndim != x->ndim || y->ndim != x->ndim)
        return fail(UNSUP, NAME ": %s: kernels for 1-D and 2-D convolutions only (%d-D tensors here)", op, x->ndim);
    return FL_OK;
}

/* The gradients of y = conv(x, w) in ordinary convolution space: gi (N, C, H, W) and/or gw from go (N, O, OH, OW);
 * x is read only for gw, w only for gi. A transposed convolution's forward (gi its output, go its input) and
 * weight gradient (go its input, x its grad_output) run through it too. */
static int conv_bwd(dev_t_ *D, fl_stream_t s, int T, const cgeom_t *g, const fl_tensor_t *go, const dt_t *god,
                    const fl_tensor_t *x, const dt_t *xd, const fl_tensor_t *w, const dt_t *wd, const fl_tensor_t *gi,
                    const dt_t *gid, const fl_tensor_t *gw, const dt_t *gwd) {
    const int64_t P = g->OH * g->OW, KK = g->KH * g->KW, Cg = g->C / g->G, Og = g->O / g->G, Kg = Cg * KK;
    const int64_t CK = g->C * KK, O = g->O;
    const size_t isz = fl_itemsize(T);
    int st = FL_OK;
    if (fl_numel(go) == 0 || Kg == 0) { /* nothing reaches the gradients: zeros (or no elements at all) */
        if (gi && (st = fill_bits(D, s, gi, 0))) return st;
        return gw ? fill_bits(D, s, gw, 0) : FL_OK;
    }
    /* W_g is B of the grad_input GEMM and grad_weight C of the other: both need unit stride along k, else a
     * contiguous copy of the weight / a contiguous temporary for grad_weight */
    const int64_t wk = merged_stride(w, 1), gwk = gw ? merged_stride(gw, 1) : 1, gsp = merged_stride(go, 2);
    const int64_t nb_max = conv_chunk(D, g, isz, CK > O ? CK : O);
    cl_mem col = tmpbuf(D, (size_t)(nb_max * P * CK) * isz, &st), pack = NULL, wc = NULL, gwt = NULL;
    if (col) pack = tmpbuf(D, (size_t)(nb_max * P * O) * isz, &st);
    if (pack && gi && wk != 1) wc = tmpbuf(D, (size_t)(O * Kg) * isz, &st);
    if (pack && gw && gwk != 1) gwt = tmpbuf(D, (size_t)(O * Kg) * isz, &st);
    fl_tensor_t wdense = *w, gwdense = gw ? *gw : *w;
    wdense.offset = 0; gwdense.offset = 0;
    contig_strides(&wdense);
    contig_strides(&gwdense);
    mat_t wm = {wd->m, wd->off + w->offset, w->strides[0], 1, 0};
    mat_t gwm = gw ? (mat_t){gwd->m, gwd->off + gw->offset, gw->strides[0], 1, 0} : (mat_t){NULL, 0, 0, 1, 0};
    if (!st && wc) {
        dt_t wcd = {wc, 0};
        st = copy_view(D, s, &wdense, &wcd, w, wd);
        wm = (mat_t){wc, 0, Kg, 1, 0};
    }
    if (gwt) gwm = (mat_t){gwt, 0, Kg, 1, 0};
    for (int64_t n0 = 0; n0 < g->N && !st; n0 += nb_max) {
        const int64_t nb = g->N - n0 < nb_max ? g->N - n0 : nb_max;
        if (gsp >= 0) { /* dY as a (j, O) matrix */
            tcopy_t t = conv_jo(O, P);
            t.soff = god->off + go->offset + n0 * go->strides[0]; t.sb = go->strides[0]; t.si = go->strides[1]; t.sj = gsp;
            st = conv_tile_copy(D, s, T, pack, god->m, nb, t);
        } else {
            fl_tensor_t gov = *go, pv;
            gov.sizes[0] = nb;
            gov.offset += n0 * go->strides[0];
            pv = gov;
            pv.offset = 0;
            pv.strides[0] = P * O; pv.strides[1] = 1; pv.strides[2] = g->OW * O; pv.strides[3] = O;
            dt_t pd = {pack, 0};
            st = copy_view(D, s, &pv, &pd, &gov, god);
        }
        if (!st && gw) {
            st = conv_cols(D, s, T, g, x, xd, col, n0, nb, 1);
            for (int64_t gr = 0; gr < g->G && !st; gr++) {
                mat_t am = {pack, gr * Og, 1, O, 0}, bm = {col, gr * Kg, CK, 1, 0};
                mat_t cm = {gwm.m, gwm.off + gr * Og * gwm.rs, gwm.rs, 1, 0};
                st = gemm_mats(D, s, T, 1, Og, Kg, nb * P, am, bm, cm, 1.0, n0 > 0);
            }
        }
        if (!st && gi) {
            for (int64_t gr = 0; gr < g->G && !st; gr++) {
                mat_t am = {pack, gr * Og, O, 1, 0}, bm = {wm.m, wm.off + gr * Og * wm.rs, wm.rs, 1, 0};
                mat_t cm = {col, gr * Kg, CK, 1, 0};
                st = gemm_mats(D, s, T, 1, nb * P, Kg, Og, am, bm, cm, 1.0, 0);
            }
            if (!st) st = conv_cols(D, s, T, g, gi, gid, col, n0, nb, 0);
        }
    }
    if (!st && gwt) {
        dt_t gtd = {gwt, 0};
        st = copy_view(D, s, gw, gwd, &gwdense, &gtd);
    }
    if (col) cl.clReleaseMemObject(col);
    if (pack) cl.clReleaseMemObject(pack);
    if (wc) cl.clReleaseMemObject(wc);
    if (gwt) cl.clReleaseMemObject(gwt);
    return st;
}

static int k_conv(KARGS) {
    DEV(device);
    if (n_args < 9 || !fl_out_ok(out, n_out)) return UNSUP;
    const fl_tensor_t *x0 = fl_arg_tensor(args, n_args, 0, in, n_in), *w0 = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *b = fl_arg_tensor(args, n_args, 2, in, n_in), *y0 = &out[0];
    if (!x0 || !w0) return UNSUP;
    const int T = x0->dtype;
    if (!is_flt(T) || !dt_ok(D, T) || w0->dtype != T || y0->dtype != T) return UNSUP;
    const int tr = (int)fl_arg_int_or(args, n_args, 6, -1);
    if (tr < 0) return UNSUP;
    int st = conv_rank_ok(x0, w0, y0, "convolution");
    if (st) return st;
    fl_tensor_t xv, wv, yv;
    conv_4d(x0, &xv); conv_4d(w0, &wv); conv_4d(y0, &yv);
    const fl_tensor_t *x = &xv, *w = &wv, *y = &yv;
    cgeom_t g; /* a transposed convolution is the ordinary one's input gradient: from y's space to x's */
    st = tr ? conv_geom(&g, y, x, w, args, 3, &args[8], x0->ndim - 2, 1) : conv_geom(&g, x, y, w, args, 3, &args[8], x0->ndim - 2, 0);
    if (st) return st;
    if (b && (b->dtype != T || b->ndim != 1 || b->sizes[0] != y->sizes[1])) return UNSUP;
    dt_t xd, wd, bd = {NULL, 0}, yd;
    if ((st = tres(D, x, &xd)) || (st = tres(D, w, &wd)) || (b && (st = tres(D, b, &bd))) || (st = tres(D, y, &yd))) return st;
    if (!tr) return conv_fwd(D, stream, T, &g, x, &xd, w, &wd, b, &bd, y, &yd);
    st = conv_bwd(D, stream, T, &g, x, &xd, NULL, NULL, w, &wd, y, &yd, NULL, NULL);
    return st ? st : conv_bias(D, stream, T, y, &yd, b, &bd);
}

static int k_conv_bw(KARGS) {
    DEV(device);
    if (n_args < 11 || n_out < 3) return UNSUP;
    const fl_tensor_t *go0 = fl_arg_tensor(args, n_args, 0, in, n_in), *x0 = fl_arg_tensor(args, n_args, 1, in, n_in),
                      *w0 = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!go0 || !x0 || !w0) return UNSUP;
    const int T = go0->dtype;
    if (!is_flt(T) || !dt_ok(D, T) || x0->dtype != T || w0->dtype != T) return UNSUP;
    const int tr = (int)fl_arg_int_or(args, n_args, 7, -1);
    if (tr < 0) return UNSUP;
    int m[3] = {1, 1, 1};
    if (args[10].kind == FL_ARG_INT_LIST && args[10].len == 3)
        for (int k = 0; k < 3; k++) m[k] = args[10].list[k] != 0;
    const fl_tensor_t *gi0 = m[0] ? fl_out_at(out, n_out, 0) : NULL, *gw0 = m[1] ? fl_out_at(out, n_out, 1) : NULL,
                      *gb = m[2] ? fl_out_at(out, n_out, 2) : NULL;
    if ((gi0 && gi0->dtype != T) || (gw0 && gw0->dtype != T) || (gb && gb->dtype != T)) return UNSUP;
    int st = conv_rank_ok(x0, w0, go0, "convolution_backward");
    if (st) return st;
    for (int d = 0; d < x0->ndim; d++) {
        if (gi0 && (gi0->ndim != x0->ndim || gi0->sizes[d] != x0->sizes[d]))
            return fail(FL_ERR_INVALID, "convolution_backward: grad_input shape");
        if (gw0 && (gw0->ndim != w0->ndim || gw0->sizes[d] != w0->sizes[d]))
            return fail(FL_ERR_INVALID, "convolution_backward: grad_weight shape");
    }
    fl_tensor_t gov, xv, wv, giv, gwv;
    conv_4d(go0, &gov); conv_4d(x0, &xv); conv_4d(w0, &wv);
    if (gi0) conv_4d(gi0, &giv);
    if (gw0) conv_4d(gw0, &gwv);
    const fl_tensor_t *go = &gov, *x = &xv, *w = &wv, *gi = gi0 ? &giv : NULL, *gw = gw0 ? &gwv : NULL;
    cgeom_t g;
    st = tr ? conv_geom(&g, go, x, w, args, 4, &args[9], x0->ndim - 2, 1) : conv_geom(&g, x, go, w, args, 4, &args[9], x0->ndim - 2, 0);
    if (st) return st;
    if (gb && (gb->ndim != 1 || gb->sizes[0] != go->sizes[1]))
        return fail(FL_ERR_INVALID, "convolution_backward: grad_bias shape");
    dt_t god, xd, wd, gid = {NULL, 0}, gwd = {NULL, 0};
    if ((st = tres(D, go, &god)) || (st = tres(D, x, &xd)) || (st = tres(D, w, &wd)) || (gi && (st = tres(D, gi, &gid))) ||
        (gw && (st = tres(D, gw, &gwd))))
        return st;
    if (gb) { /* the sum of grad_output over batch and pixels; first: the reduction may still decline */
        fl_arg_t dims;
        memset(&dims, 0, sizeof dims);
        dims.kind = FL_ARG_INT_LIST; dims.len = 3;
        dims.list[0] = 0; dims.list[1] = 2; dims.list[2] = 3;
        if ((st = reduce(D, stream, go, &dims, 0, gb, 0, 0))) return st;
    }
    if (!gi && !gw) return FL_OK;
    if (!tr) return conv_bwd(D, stream, T, &g, go, &god, x, &xd, w, &wd, gi, &gid, gw, &gwd);
    /* transposed: grad_input = the ordinary convolution of grad_output; grad_weight that of the ordinary one with
     * grad_output as its input and the input as its output gradient */
    if (gi && (st = conv_fwd(D, stream, T, &g, go, &god, w, &wd, NULL, NULL, gi, &gid))) return st;
    return gw ? conv_bwd(D, stream, T, &g, x, &xd, go, &god, w, &wd, NULL, NULL, gw, &gwd) : FL_OK;
}

/* ------------------------------------------------------------------ device JIT (FL_JIT_OPENCL_C)
 * jit_build compiles a generated source (through the binary cache) into a handle that lives for the
 * process; jit_launch runs it with fl_plugin.h's launch convention:
 *   kernel(__global const long *meta, __global int *status, __global uchar *t0, ..., tN-1). */
#define JIT_MAGIC 0x4f434a49u
typedef struct jit_k {
    uint32_t magic;
    int device;
    cl_program p;
    cl_kernel k;
    cl_uint nargs;
    int checked;         /* the source defines FL_JIT_CHECKED: the launch waits and returns the kernel's status */
    size_t wg;           /* CL_KERNEL_WORK_GROUP_SIZE (0: unknown) */
    pthread_mutex_t mu;  /* one cl_kernel: clSetKernelArg and the enqueue must not interleave between threads */
    struct jit_k *next;
    char symbol[128];
} jit_k;
static jit_k *jits; /* every handle built, newest first: they live for the process (no teardown releases them) */
static pthread_mutex_t jits_mu = PTHREAD_MUTEX_INITIALIZER;

static int jit_build(int device, const char *source, const char *symbol, void **handle) {
    if (handle) *handle = NULL;
    if (!source || !symbol || !handle) return fail(FL_ERR_INVALID, NAME ": jit_build with a NULL source, symbol or handle");
    DEV(device);
    cl_int e = 0;
    char *log = NULL;
    cl_program p = build_program(D, source, D->opts, &e, &log);
    if (!p) {
        char ex[3000];
        log_excerpt(log, ex, sizeof ex);
        free(log);
        return fail(FL_ERR_INTERNAL, NAME ": jit_build: building %.128s for %s failed with OpenCL error %d: %s", symbol,
                    D->name, e, ex);
    }
    cl_kernel k = cl.clCreateKernel(p, symbol, &e);
    if (!k || e) {
        cl.clReleaseProgram(p);
        return fail(FL_ERR_INTERNAL, NAME ": jit_build: the program defines no kernel %.128s (OpenCL error %d)", symbol, e);
    }
    cl_uint na = 0;
    e = cl.clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof na, &na, NULL);
    if (e || na < 2) {
        cl.clReleaseKernel(k);
        cl.clReleaseProgram(p);
        return fail(FL_ERR_INTERNAL, NAME ": jit_build: kernel %.128s takes %u arguments (OpenCL error %d); the "
                    "FL_JIT_OPENCL_C convention is (meta, status, one buffer per tensor)", symbol, na, e);
    }
    jit_k *h = calloc(1, sizeof *h);
    if (!h) {
        cl.clReleaseKernel(k);
        cl.clReleaseProgram(p);
        return fail(FL_ERR_OOM, NAME ": host out of memory");
    }
    h->magic = JIT_MAGIC;
    h->device = device;
    h->p = p;
    h->k = k;
    h->nargs = na;
    h->checked = strstr(source, "#define FL_JIT_CHECKED") != NULL;
    if (cl.clGetKernelWorkGroupInfo(k, D->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof h->wg, &h->wg, NULL)) h->wg = 0;
    pthread_mutex_init(&h->mu, NULL);
    snprintf(h->symbol, sizeof h->symbol, "%s", symbol);
    pthread_mutex_lock(&jits_mu);
    h->next = jits;
    jits = h;
    pthread_mutex_unlock(&jits_mu);
    *handle = h;
    return FL_OK;
}

/* the buffer and byte offset of descriptor k's data; an undefined tensor (ndim -1 or no data) and an empty one
 * whose address maps to no buffer get the device's scratch buffer */
static int jit_res(dev_t_ *D, const jit_k *h, const fl_tensor_t *t, int k, cl_mem *m, size_t *boff) {
    *m = D->scratch;
    *boff = 0;
    if (t->ndim == -1 || !t->data) return FL_OK;
    if (t->ndim < 0 || t->ndim > FL_MAX_DIMS)
        return fail(FL_ERR_INVALID, NAME ": jit kernel %s: tensor %d has %d dimensions", h->symbol, k, t->ndim);
    size_t isz = fl_itemsize(t->dtype);
    if (!isz) return fail(FL_ERR_INVALID, NAME ": jit kernel %s: tensor %d has an unknown dtype %d", h->symbol, k, t->dtype);
    for (int d = 0; d < t->ndim; d++)
        if (t->sizes[d] < 0) return fail(FL_ERR_INVALID, NAME ": jit kernel %s: tensor %d has a negative size", h->symbol, k);
    size_t room = 0;
    cl_mem r = resolve(D, t->data, boff, &room);
    int64_t n = fl_numel(t);
    if (!r) {
        *boff = 0;
        if (n == 0) return FL_OK;
        return fail(FL_ERR_INVALID, NAME ": jit kernel %s: tensor %d's data %p is not memory of %s", h->symbol, k, t->data,
                    D->name);
    }
    *m = r;
    if (n == 0) return FL_OK;
    int64_t lo, hi;
    span_of(t, &lo, &hi);
    if (lo < 0 || (uint64_t)(hi + 1) * isz > room) /* a kernel must never reach past its buffer */
        return fail(FL_ERR_INVALID, NAME ": jit kernel %s: tensor %d's view (offset %lld, last element %lld) lies outside "
                    "its allocation", h->symbol, k, (long long)t->offset, (long long)hi);
    return FL_OK;
}

static int jit_launch(void *handle, fl_stream_t stream, int device, const fl_tensor_t *inputs, int n_in,
                      const fl_tensor_t *outputs, int n_out, const fl_arg_t *args, int n_args) {
    jit_k *h = handle;
    if (!h || h->magic != JIT_MAGIC) return fail(FL_ERR_INVALID, NAME ": jit_launch: %p is not a handle from jit_build", handle);
    if (device != h->device)
        return fail(FL_ERR_INVALID, NAME ": jit_launch: kernel %s was built for device %d, not %d", h->symbol, h->device, device);
    DEV(device);
    if (n_in < 0 || n_out < 0 || n_args < 0 || (n_in && !inputs) || (n_out && !outputs) || (n_args && !args))
        return fail(FL_ERR_INVALID, NAME ": jit_launch(%s): bad descriptor arrays", h->symbol);
    int N = n_in + n_out;
    if ((cl_uint)N + 2 != h->nargs)
        return fail(FL_ERR_INVALID, NAME ": jit kernel %s takes %u tensor buffers, the launch passes %d (%d inputs, %d outputs)",
                    h->symbol, h->nargs - 2, N, n_in, n_out);
    if (!D->scratch) return fail(FL_ERR_OOM, NAME ": jit_launch: %s has no scratch buffer (its creation failed)", D->name);
    size_t nmeta = (size_t)N * FL_JIT_META_TENSOR + (size_t)n_args * FL_JIT_META_ARG;
    int64_t meta_s[8 * FL_JIT_META_TENSOR + 16 * FL_JIT_META_ARG];
    cl_mem mems_s[8];
    int64_t *meta = nmeta <= sizeof meta_s / sizeof *meta_s ? meta_s : malloc(nmeta * sizeof *meta);
    cl_mem *mems = N <= 8 ? mems_s : malloc((size_t)N * sizeof *mems);
    int st = meta && mems ? FL_OK : fail(FL_ERR_OOM, NAME ": host out of memory");
    for (int k = 0; k < N && !st; k++) {
        const fl_tensor_t *t = k < n_in ? &inputs[k] : &outputs[k - n_in];
        size_t boff = 0;
        st = jit_res(D, h, t, k, &mems[k], &boff);
        int64_t *m = meta + (size_t)k * FL_JIT_META_TENSOR;
        m[0] = (int64_t)boff; m[1] = t->offset; m[2] = t->dtype; m[3] = t->ndim;
        memcpy(m + 4, t->sizes, sizeof t->sizes);
        memcpy(m + 12, t->strides, sizeof t->strides);
    }
    for (int k = 0; k < n_args && !st; k++) {
        int64_t *m = meta + (size_t)N * FL_JIT_META_TENSOR + (size_t)k * FL_JIT_META_ARG;
        m[0] = args[k].kind; m[1] = args[k].len; m[2] = args[k].i;
        memcpy(&m[3], &args[k].f, 8);
        memcpy(m + 4, args[k].list, sizeof args[k].list);
    }
    cl_mem metam = NULL, statm = D->scratch;
    cl_int e = 0;
    if (!st) {
        int64_t none = 0;
        metam = cl.clCreateBuffer(D->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, nmeta ? nmeta * sizeof *meta : sizeof none,
                                  nmeta ? (void *)meta : (void *)&none, &e);
        if (!metam || e) {
            metam = NULL;
            st = fail(FL_ERR_OOM, NAME ": jit_launch(%s): no room for its metadata (OpenCL error %d)", h->symbol, e);
        }
    }
    if (!st && h->checked) { /* its own status word: concurrent checked launches never share one */
        int32_t zero = 0;
        statm = cl.clCreateBuffer(D->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zero, &zero, &e);
        if (!statm || e) {
            statm = NULL;
            st = fail(FL_ERR_OOM, NAME ": jit_launch(%s): no room for its status (OpenCL error %d)", h->symbol, e);
        }
    }
    cl_command_queue q = qof(D, stream);
    if (!st) {
        /* any global size is correct (generated kernels stride by get_global_size): on the host's CPU (pocl)
         * one work-item per work-group and 4 per core; on a GPU 256 per compute unit in groups of 64 */
        size_t cus = D->cus > 0 ? (size_t)D->cus : 1, g, l;
        if (D->host_cpu) { g = 4 * cus; l = 1; }
        else {
            for (l = 64; l > 1 && h->wg && l > h->wg; l /= 2) {}
            g = 256 * cus;
        }
        pthread_mutex_lock(&h->mu);
        e = cl.clSetKernelArg(h->k, 0, sizeof(cl_mem), &metam);
        if (!e) e = cl.clSetKernelArg(h->k, 1, sizeof(cl_mem), &statm);
        for (int k = 0; k < N && !e; k++) e = cl.clSetKernelArg(h->k, (cl_uint)k + 2, sizeof(cl_mem), &mems[k]);
        if (e) st = fail(FL_ERR_INTERNAL, NAME ": jit kernel %s: clSetKernelArg failed with OpenCL error %d", h->symbol, e);
        else if ((e = cl.clEnqueueNDRangeKernel(q, h->k, 1, NULL, &g, &l, 0, NULL, NULL)))
            st = fail(FL_ERR_INTERNAL, NAME ": jit kernel %s: clEnqueueNDRangeKernel failed with OpenCL error %d", h->symbol, e);
        pthread_mutex_unlock(&h->mu);
    }
    if (metam) cl.clReleaseMemObject(metam); /* the queue keeps it alive until the kernel is done */
    if (meta != meta_s) free(meta);
    if (mems != mems_s) free(mems);
    if (!h->checked || !statm) return st;
    int32_t code = 0;
    if (!st && (e = cl.clEnqueueReadBuffer(q, statm, CL_TRUE, 0, sizeof code, &code, 0, NULL, NULL)))
        st = fail(FL_ERR_INTERNAL, NAME ": jit kernel %s failed (OpenCL error %d reading its status)", h->symbol, e);
    cl.clReleaseMemObject(statm);
    if (st || !code) return st;
    if (code == FL_ERR_INVALID)
        return fail(FL_ERR_INVALID, "jit kernel %s: an index out of range or an integer division by zero", h->symbol);
    if (code > 0 && code <= FL_ERR_INTERNAL) return fail(code, "jit kernel %s: the kernel reported status %d", h->symbol, code);
    return fail(FL_ERR_INTERNAL, "jit kernel %s stored an unknown status %d", h->symbol, code);
}

/* ------------------------------------------------------------------ kernel table */
#define B_(d) FL_DTYPE_BIT(d)
#define FLT (B_(FL_FLOAT32) | B_(FL_FLOAT64))
#define INTS (B_(FL_INT64) | B_(FL_INT32) | B_(FL_INT16) | B_(FL_INT8) | B_(FL_UINT8))
#define NUM (FLT | INTS)
#define ALLD (NUM | B_(FL_BOOL))
#define INTB (INTS | B_(FL_BOOL))
#define STOR (ALLD | B_(FL_FLOAT16))
#define E(n, m, f) {n, m, 0, f}
static const fl_kernel_entry_t kernels[] = {
    /* minimal's primitives */
    E("aten::add.Tensor", NUM, k_add), E("aten::add_.Tensor", NUM, k_add), E("aten::sub.Tensor", NUM, k_sub),
    E("aten::sub_.Tensor", NUM, k_sub), E("aten::mul.Tensor", NUM, k_mul), E("aten::mul_.Tensor", NUM, k_mul),
    E("aten::div.Tensor", FLT, k_div), E("aten::div_.Tensor", FLT, k_div), E("aten::neg", NUM, k_neg),
    E("aten::exp", FLT, k_exp), E("aten::log", FLT, k_log), E("aten::sqrt", FLT, k_sqrt), E("aten::rsqrt", FLT, k_rsqrt),
    E("aten::tanh", FLT, k_tanh), E("aten::erf", FLT, k_erf), E("aten::abs", NUM, k_abs), E("aten::sigmoid", FLT, k_sigmoid),
    E("aten::pow.Tensor_Scalar", FLT, k_pow_ts), E("aten::maximum", NUM, k_maximum), E("aten::minimum", NUM, k_minimum),
    E("aten::where.self", B_(FL_BOOL), k_where), E("aten::eq.Tensor", ALLD, k_eq), E("aten::gt.Scalar", ALLD, k_gt),
    E("aten::lt.Scalar", ALLD, k_lt), E("aten::sum.dim_IntList", ALLD, k_sum_dim), E("aten::amax", ALLD, k_amax),
    E("aten::mm", FLT, k_mm), E("aten::bmm", FLT, k_bmm), E("aten::fill_.Scalar", STOR, k_fill), E("aten::copy_", STOR, k_copy),
    E("aten::cat", STOR, k_cat), E("aten::uniform_", FLT, k_uniform), E("aten::normal_", FLT, k_normal),
    E("aten::bernoulli_.float", ALLD, k_bernoulli), E("aten::arange.start_step", NUM, k_arange),
    /* more pointwise and comparisons */
    E("aten::eq.Scalar", ALLD, k_eq), E("aten::ne.Tensor", ALLD, k_ne), E("aten::ne.Scalar", ALLD, k_ne),
    E("aten::lt.Tensor", ALLD, k_lt), E("aten::le.Tensor", ALLD, k_le), E("aten::le.Scalar", ALLD, k_le),
    E("aten::gt.Tensor", ALLD, k_gt), E("aten::ge.Tensor", ALLD, k_ge), E("aten::ge.Scalar", ALLD, k_ge),
    E("aten::zero_", STOR, k_zero), E("aten::relu", NUM, k_relu), E("aten::relu_", NUM, k_relu),
    E("aten::gelu", FLT, k_gelu), E("aten::silu", FLT, k_silu), E("aten::threshold", FLT, k_threshold),
    E("aten::threshold_backward", NUM, k_threshold_bw), E("aten::gelu_backward", FLT, k_gelu_bw),
    E("aten::silu_backward", FLT, k_silu_bw), E("aten::sigmoid_backward", FLT, k_sigmoid_bw),
    E("aten::tanh_backward", FLT, k_tanh_bw),
    /* reductions, normalization, linear algebra */
    E("aten::sum", ALLD, k_sum), E("aten::mean.dim", FLT, k_mean_dim), E("aten::mean", FLT, k_mean),
    E("aten::_softmax", FLT, k_softmax), E("aten::_log_softmax", FLT, k_log_softmax),
    E("aten::_softmax_backward_data", FLT, k_softmax_bw), E("aten::_log_softmax_backward_data", FLT, k_log_softmax_bw),
    E("aten::native_layer_norm", FLT, k_layer_norm), E("aten::native_layer_norm_backward", FLT, k_layer_norm_bw),
    E("aten::addmm", FLT, k_addmm),
    {"aten::convolution", FLT, FL_KERNEL_ANY_OUT_LAYOUT, k_conv}, /* writes its output through its strides */
    E("aten::convolution_backward", FLT, k_conv_bw),
    E("aten::gather", ALLD, k_gather), E("aten::scatter.value", ALLD, k_scatter_value),
    E("aten::scatter_.value", ALLD, k_scatter_value), E("aten::scatter.src", ALLD, k_scatter_src),
    E("aten::scatter_.src", ALLD, k_scatter_src), E("aten::scatter_add", ALLD, k_scatter_add),
    E("aten::scatter_add_", ALLD, k_scatter_add), E("aten::index_select", ALLD, k_index_select),
    E("aten::embedding", ALLD, k_embedding), E("aten::embedding_dense_backward", FLT, k_embedding_bw),
    /* bitwise and logical */
    E("aten::bitwise_and.Tensor", INTB, k_band), E("aten::bitwise_and_.Tensor", INTB, k_band),
    E("aten::bitwise_and.Scalar", INTB, k_band), E("aten::bitwise_and_.Scalar", INTB, k_band),
    E("aten::bitwise_or.Tensor", INTB, k_bor), E("aten::bitwise_or_.Tensor", INTB, k_bor),
    E("aten::bitwise_or.Scalar", INTB, k_bor), E("aten::bitwise_or_.Scalar", INTB, k_bor),
    E("aten::bitwise_xor.Tensor", INTB, k_bxor), E("aten::bitwise_xor_.Tensor", INTB, k_bxor),
    E("aten::bitwise_xor.Scalar", INTB, k_bxor), E("aten::bitwise_xor_.Scalar", INTB, k_bxor),
    E("aten::bitwise_not", INTB, k_bnot), E("aten::bitwise_not_", INTB, k_bnot),
    E("aten::logical_not", ALLD, k_lnot), E("aten::signbit", NUM, k_signbit),
    /* more pointwise */
    E("aten::sin", FLT, k_sin), E("aten::sin_", FLT, k_sin), E("aten::cos", FLT, k_cos), E("aten::cos_", FLT, k_cos),
    E("aten::ceil", NUM, k_ceil), E("aten::ceil_", NUM, k_ceil), E("aten::floor", NUM, k_floor), E("aten::floor_", NUM, k_floor),
    E("aten::trunc", NUM, k_trunc), E("aten::trunc_", NUM, k_trunc), E("aten::sign", NUM, k_sign), E("aten::sign_", NUM, k_sign),
    E("aten::div.Tensor_mode", NUM, k_div_mode), E("aten::div_.Tensor_mode", NUM, k_div_mode),
    E("aten::div.Scalar_mode", NUM, k_div_mode), E("aten::div_.Scalar_mode", NUM, k_div_mode),
    E("aten::fmod.Tensor", NUM, k_fmod), E("aten::fmod_.Tensor", NUM, k_fmod),
    E("aten::fmod.Scalar", NUM, k_fmod), E("aten::fmod_.Scalar", NUM, k_fmod),
    E("aten::remainder.Tensor", NUM, k_remainder), E("aten::remainder_.Tensor", NUM, k_remainder),
    E("aten::remainder.Scalar", NUM, k_remainder), E("aten::remainder_.Scalar", NUM, k_remainder),
    /* more reductions */
    E("aten::max", ALLD, k_max_all), E("aten::min", ALLD, k_min_all),
    E("aten::amin", ALLD, k_amin), E("aten::max.dim", NUM, k_max_dim), E("aten::min.dim", NUM, k_min_dim),
    E("aten::argmax", NUM, k_argmax), E("aten::argmin", NUM, k_argmin),
    E("aten::var.correction", FLT, k_var), E("aten::std.correction", FLT, k_std),
    E("aten::var_mean.correction", FLT, k_var_mean), E("aten::std_mean.correction", FLT, k_std_mean),
    E("aten::cumsum", NUM | B_(FL_BOOL), k_cumsum), E("aten::cumsum_", NUM, k_cumsum),
    /* sort.stable only, and topk for floats only: ties are ordered stably here, while PyTorch's CPU sort(stable=False)
     * and topk order them as its std::sort / nth_element happen to, which `plugin check` compares index by index */
    E("aten::sort.stable", ALLD, k_sort_stable), E("aten::topk", FLT, k_topk),
};
#define NK ((int)(sizeof kernels / sizeof kernels[0]))
static int kernel_count(int *c) { if (!c) return fail(FL_ERR_INVALID, NAME ": kernel_count(NULL)"); *c = NK; return FL_OK; }
static int kernel_get(int i, fl_kernel_entry_t *e) {
    if (i < 0 || i >= NK) return fail(FL_ERR_INVALID, NAME ": kernel index %d out of range [0, %d)", i, NK);
    if (!e) return fail(FL_ERR_INVALID, NAME ": kernel_get(NULL)");
    *e = kernels[i];
    return FL_OK;
}

/* ------------------------------------------------------------------ init */
int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }

static int load_cl(void) {
    if (cl.lib) return FL_OK;
    void *h = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return fail(FL_ERR_UNSUPPORTED, "no OpenCL driver: libOpenCL.so.1 not found (%s); install one: Debian/Ubuntu "
                    "`apt-get install pocl-opencl-icd ocl-icd-libopencl1` for any CPU, or your GPU vendor's OpenCL driver", dlerror());
#define L(n) if (!(cl.n = (PFN_##n)dlsym(h, #n))) { dlclose(h); memset(&cl, 0, sizeof cl); \
        return fail(FL_ERR_UNSUPPORTED, "no usable OpenCL driver: libOpenCL.so.1 lacks %s (OpenCL 1.2 is needed)", #n); }
    L(clGetPlatformIDs) L(clGetPlatformInfo) L(clGetDeviceIDs) L(clGetDeviceInfo) L(clCreateContext)
    L(clCreateCommandQueue) L(clReleaseCommandQueue) L(clCreateBuffer) L(clReleaseMemObject)
    L(clCreateProgramWithSource) L(clBuildProgram) L(clGetProgramBuildInfo) L(clReleaseProgram) L(clCreateKernel)
    L(clSetKernelArg) L(clEnqueueNDRangeKernel) L(clEnqueueReadBuffer) L(clEnqueueWriteBuffer) L(clEnqueueCopyBuffer)
    L(clEnqueueFillBuffer) L(clEnqueueMarkerWithWaitList) L(clFinish) L(clFlush) L(clWaitForEvents) L(clGetEventInfo)
    L(clGetEventProfilingInfo) L(clReleaseEvent) L(clCreateProgramWithBinary) L(clGetProgramInfo) L(clGetKernelInfo)
    L(clGetKernelWorkGroupInfo) L(clReleaseKernel)
#undef L
    cl.lib = h;
    return FL_OK;
}

/* D->opts (OpenCL C 1.2 where the device has it, -DHAS_FP64 with cl_khr_fp64) and D->ident (what a program
 * binary depends on besides its options and source: the binary cache's key) */
static void build_identity(dev_t_ *D) {
    char cv[128] = "";
    cl.clGetDeviceInfo(D->id, CL_DEVICE_OPENCL_C_VERSION, sizeof cv - 1, cv, NULL);
    int major = 0, minor = 0;
    int c12 = sscanf(cv, "OpenCL C %d.%d", &major, &minor) == 2 && (major > 1 || (major == 1 && minor >= 2));
    snprintf(D->opts, sizeof D->opts, "%s%s", c12 ? "-cl-std=CL1.2" : "", D->fp64 ? " -DHAS_FP64" : "");
    static const struct { int plat; cl_uint what; } parts[] = {
        {1, CL_PLATFORM_NAME}, {1, CL_PLATFORM_VERSION}, {0, CL_DEVICE_NAME}, {0, CL_DEVICE_VENDOR},
        {0, CL_DEVICE_VERSION}, {0, CL_DRIVER_VERSION}, {0, CL_DEVICE_OPENCL_C_VERSION}};
    size_t used = 0;
    for (size_t k = 0; k < sizeof parts / sizeof *parts && used + 2 < sizeof D->ident; k++) {
        char v[256] = "";
        if (parts[k].plat) cl.clGetPlatformInfo(D->plat, parts[k].what, sizeof v - 1, v, NULL);
        else cl.clGetDeviceInfo(D->id, parts[k].what, sizeof v - 1, v, NULL);
        int w = snprintf(D->ident + used, sizeof D->ident - used, "%s\n", v);
        if (w > 0) used += (size_t)w;
    }
    /* The binary cache: FL_OPENCL_CACHE=0 off, =1 every program, unset every program except where the driver
     * keeps its own cache of built programs across processes. pocl does (POCL_KERNEL_CACHE, on by default), and
     * asking it for a binary makes it compile every kernel of the program at once (a generic work-group function
     * each): for the plugin's own programs (dozens of kernels) seconds, once per machine, to gain nothing over
     * pocl's cache; for the JIT's programs (one kernel) a few milliseconds, and a later process then builds one
     * in ~2 ms instead of the ~25 ms pocl's cache takes. So there only programs of FEW_KERNELS are stored. */
    const char *v = getenv("FL_OPENCL_CACHE"), *pk = getenv("POCL_KERNEL_CACHE");
    char pname[128] = "";
    cl.clGetPlatformInfo(D->plat, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
    int own_cache = strstr(pname, "Portable Computing Language") && !(pk && !strcmp(pk, "0"));
    /* the words torch_fl's config check accepts for a boolean (torch_fl/runtime/config.py) */
    int off = v && (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"));
    int on = v && (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
    D->bincache = off ? 0 : on ? 1 : own_cache ? 2 : 1;
}

static int open_devices(void) {
    if (devs) return FL_OK;
    cl_uint np = 0;
    cl_int e = cl.clGetPlatformIDs(0, NULL, &np);
    if (e || !np)
        return fail(FL_ERR_UNSUPPORTED, "no OpenCL platform: libOpenCL.so.1 loaded but lists no platform (error %d); install a "
                    "driver: Debian/Ubuntu `apt-get install pocl-opencl-icd` for any CPU, or your GPU vendor's OpenCL driver", e);
    cl_platform_id plats[16];
    if (np > 16) np = 16;
    cl.clGetPlatformIDs(np, plats, NULL);
    dev_t_ *ds = calloc(64, sizeof *ds);
    if (!ds) return fail(FL_ERR_OOM, NAME ": host out of memory");
    int n = 0;
    for (cl_uint p = 0; p < np && n < 64; p++) {
        cl_device_id ids[16];
        cl_uint nd = 0;
        if (cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, ids, &nd) || !nd) continue;
        if (nd > 16) nd = 16;
        if (!n) cl.clGetPlatformInfo(plats[p], CL_PLATFORM_VENDOR, sizeof g_vendor_buf, g_vendor_buf, NULL);
        for (cl_uint i = 0; i < nd && n < 64; i++) {
            dev_t_ *D = &ds[n];
            D->plat = plats[p];
            D->id = ids[i];
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_NAME, sizeof D->name - 1, D->name, NULL);
            cl_ulong gm = 0, ma = 0;
            cl_uint cu = 0;
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gm, &gm, NULL);
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof ma, &ma, NULL);
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
            cl_ulong dtype = 0;
            if (cl.clGetDeviceInfo(ids[i], CL_DEVICE_TYPE, sizeof dtype, &dtype, NULL) == 0)
                D->host_cpu = (dtype & CL_DEVICE_TYPE_CPU) != 0;
            size_t xl = 0;
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_EXTENSIONS, 0, NULL, &xl);
            char *ext = calloc(1, xl + 1);
            if (ext) { cl.clGetDeviceInfo(ids[i], CL_DEVICE_EXTENSIONS, xl, ext, NULL); D->fp64 = strstr(ext, "cl_khr_fp64") != NULL; free(ext); }
            D->mem_total = gm; D->max_alloc = ma ? ma : gm; D->cus = (int)cu;
            D->ctx = cl.clCreateContext(NULL, 1, &ids[i], NULL, NULL, &e);
            if (!D->ctx || e) continue;
            D->q = cl.clCreateCommandQueue(D->ctx, ids[i], CL_QUEUE_PROFILING_ENABLE, &e);
            if (!D->q || e) continue;
            build_identity(D);
            char zeros[256] = {0};
            D->scratch = cl.clCreateBuffer(D->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &e);
            if (e) D->scratch = NULL; /* jit_launch then says so */
            /* reserve the device's address range: 4x its memory, at most 1 TiB, never readable by the host */
            size_t vs = gm * 4;
            if (vs > (1ull << 40)) vs = 1ull << 40;
            if (vs < (1ull << 30)) vs = 1ull << 30;
            void *base = mmap(NULL, vs, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (base == MAP_FAILED) continue;
            D->vbase = ((uintptr_t)base + ALIGN - 1) / ALIGN * ALIGN;
            D->vsize = vs - (D->vbase - (uintptr_t)base);
            D->free_ = malloc(1024 * sizeof(ext_t));
            D->capfree = 1024; D->nfree = 1;
            D->free_[0] = (ext_t){D->vbase, D->vsize / ALIGN * ALIGN};
            pthread_mutex_init(&D->mlock, NULL);
            pthread_mutex_init(&D->klock, NULL);
            pthread_mutex_init(&D->rlock, NULL);
            pthread_mutex_init(&D->elock, NULL);
            D->seed = 67280421310721ull;
            n++;
        }
    }
    if (!n) { free(ds); return fail(FL_ERR_UNSUPPORTED, "no OpenCL device: %u platform(s) but no usable device; install a driver "
                                    "(Debian/Ubuntu `apt-get install pocl-opencl-icd` for any CPU, or your GPU vendor's)", np); }
    devs = ds;
    ndev = n;
    if (g_vendor_buf[0]) g_vendor = g_vendor_buf;
    return FL_OK;
}

int fl_plugin_init(fl_plugin_t *p) {
    if (!p) return fail(FL_ERR_INVALID, NAME ": fl_plugin_init(NULL)");
    memset(p, 0, sizeof *p);
    p->last_error = last_error;
    p->name = NAME; /* set first: a machine without a driver lists the backend by name, as unavailable */
    int st = load_cl();
    if (!st) st = open_devices();
    if (st) return st;
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = NAME;
    p->vendor = g_vendor;
    p->version = "0.1.0";
    static char desc[256];
    const char *why = NULL;
    if (ocl_clblast_version(&why))
        snprintf(desc, sizeof desc, "OpenCL devices through the system's ICD loader (pocl, or a GPU vendor's driver); "
                 "GEMM: CLBlast on %s, else the plugin's register-blocked kernel",
                 ocl_clblast_for(1) ? "every device (FL_OPENCL_CLBLAST=1)" : "GPU and accelerator devices");
    else
        snprintf(desc, sizeof desc, "OpenCL devices through the system's ICD loader (pocl, or a GPU vendor's driver); "
                 "GEMM: the plugin's register-blocked kernel (CLBlast %s)", why ? why : "");
    p->description = desc;
    p->emulated = 0;
    p->device_count = device_count;
    p->device_props = device_props;
    p->malloc = dev_malloc;
    p->free = dev_free;
    p->memory_used = memory_used;
    p->copy_h2d = copy_h2d;
    p->copy_d2h = copy_d2h;
    p->copy_d2d = copy_d2d;
    p->stream_create = stream_create;
    p->stream_wait_event = stream_wait_event;
    p->stream_destroy = stream_destroy;
    p->stream_synchronize = stream_sync;
    p->event_create = event_create;
    p->event_destroy = event_destroy;
    p->event_record = event_record;
    p->event_synchronize = event_sync;
    p->event_query = event_query;
    p->synchronize = synchronize;
    p->rng_set_state = rng_set_state;
    p->rng_get_state = rng_get_state;
    p->kernel_count = kernel_count;
    p->kernel_get = kernel_get;
    p->event_elapsed = event_elapsed;
    p->mem_set = mem_set;
    p->copy_d2h_async = copy_d2h_async;
    p->jit_language = FL_JIT_OPENCL_C;
    p->jit_build = jit_build;
    p->jit_launch = jit_launch;
    return FL_OK;
}
