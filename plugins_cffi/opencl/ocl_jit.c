/* The OpenCL plugin: the device JIT (FL_JIT_OPENCL_C).
 * Shared declarations: ocl.h. */
#include "ocl.h"

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

int jit_build(int device, const char *source, const char *symbol, void **handle) {
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

int jit_launch(void *handle, fl_stream_t stream, int device, const fl_tensor_t *inputs, int n_in,
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
