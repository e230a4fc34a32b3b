/* The OpenCL plugin: the device address map and copies: allocations are addresses in a reserved range,
 * each backed by one cl_mem; any address inside one maps back to (cl_mem, offset).
 * Shared declarations: ocl.h. */
#include "ocl.h"

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
cl_mem resolve(dev_t_ *D, const void *p, size_t *off, size_t *room) {
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

int dev_malloc(int device, size_t nbytes, void **ptr) {
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

int dev_free(int device, void *ptr) {
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

int memory_used(int device, uint64_t *bytes) {
    DEV(device);
    if (!bytes) return fail(FL_ERR_INVALID, NAME ": memory_used(NULL)");
    pthread_mutex_lock(&D->mlock);
    *bytes = D->used;
    pthread_mutex_unlock(&D->mlock);
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
int copy_h2d(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
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
int copy_d2h(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    return read_buffer(device, dst, src, n, s, s == NULL, "copy_d2h");
}
int copy_d2h_async(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    return read_buffer(device, dst, src, n, s, 0, "copy_d2h_async");
}
int copy_d2d(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
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
int mem_set(int device, void *dst, int value, size_t n, fl_stream_t s) {
    DEV(device);
    if (!n) return FL_OK;
    cl_mem m; size_t off; int st = dres(D, dst, n, "mem_set", &m, &off);
    if (st) return st;
    unsigned char pat = (unsigned char)value;
    cl_int e = cl.clEnqueueFillBuffer(qof(D, s), m, &pat, 1, off, n, 0, NULL, NULL);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": mem_set: clEnqueueFillBuffer failed with OpenCL error %d", e);
    return FL_OK;
}
