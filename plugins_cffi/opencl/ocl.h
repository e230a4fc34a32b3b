/* Internals shared by the OpenCL plugin's files. Not part of the ABI.
 *
 * The plugin (how it works: opencl.c) is cut along its seams:
 *   opencl.c         the plugin: errors, the OpenCL library (dlopen), device discovery and properties,
 *                    the RNG state, the kernel table, fl_plugin_init
 *   ocl_memory.c     the device address map (allocations in a reserved range -> cl_mem + offset), copies
 *   ocl_streams.c    streams (in-order queues) and events
 *   ocl_launch.c     programs (built through the binary cache, bincache.c) and kernels, launching, tensors
 *                    on the device (resolution, walks, parameter blocks), the device-side error flag
 *   ocl_pointwise.c  elementwise, bitwise, predicates, rounding, division modes, random fills
 *   ocl_copy.c       copy_, fill_, zero_, cat, arange
 *   ocl_index.c      gather, scatter, index_select, embedding
 *   ocl_reduce.c     reductions, arg/min/max, var/std, cumsum, sort, topk
 *   ocl_norm.c       the softmax family, layer norm
 *   ocl_gemm.c       mm, bmm, addmm (CLBlast where clblast.c says so, else the plugin's kernel)
 *   ocl_conv.c       convolution and its backward
 *   ocl_jit.c        the device JIT (FL_JIT_OPENCL_C): jit_build, jit_launch
 * The OpenCL C the kernels run is in kernels_cl.h. */
#ifndef FL_OPENCL_OCL_H
#define FL_OPENCL_OCL_H

#define _GNU_SOURCE /* first: every file includes this header before anything else */
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

#define NAME "opencl"
#define UNSUP FL_ERR_UNSUPPORTED
#define ALIGN 256 /* device addresses: every allocation starts on this boundary */

/* ---- errors (opencl.c): a thread-local message read back through last_error */
__attribute__((format(printf, 2, 3))) int fail(int st, const char *fmt, ...);

/* ---- the OpenCL library, looked up in libOpenCL.so.1 by fl_plugin_init (opencl.c) */
struct ocl_lib {
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
};
extern struct ocl_lib cl;

/* ---- devices (opencl.c) */
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

extern dev_t_ *devs;
extern int ndev;
/* the device numbered `device`, or FL_ERR_INVALID */
int chk(int device, dev_t_ **d);
#define DEV(device) dev_t_ *D = NULL; { int st_ = chk(device, &D); if (st_) return st_; }
/* a share of the device's counter-based random stream: the first counter of n, the seed in *seed */
uint64_t rng_reserve(dev_t_ *D, uint64_t n, uint64_t *seed);

/* ---- memory and copies (ocl_memory.c) */
/* (cl_mem, byte offset) of a device address; NULL mem when unknown */
cl_mem resolve(dev_t_ *D, const void *p, size_t *off, size_t *room);
int dev_malloc(int device, size_t nbytes, void **ptr);
int dev_free(int device, void *ptr);
int memory_used(int device, uint64_t *bytes);
int copy_h2d(int device, void *dst, const void *src, size_t n, fl_stream_t s);
int copy_d2h(int device, void *dst, const void *src, size_t n, fl_stream_t s);
int copy_d2h_async(int device, void *dst, const void *src, size_t n, fl_stream_t s);
int copy_d2d(int device, void *dst, const void *src, size_t n, fl_stream_t s);
int mem_set(int device, void *dst, int value, size_t n, fl_stream_t s);

/* ---- streams and events (ocl_streams.c) */
static inline cl_command_queue qof(dev_t_ *D, fl_stream_t s) { return s ? (cl_command_queue)s : D->q; }
int stream_create(int device, fl_stream_t *s);
int stream_destroy(int device, fl_stream_t s);
int stream_sync(int device, fl_stream_t s);
int event_create(int device, fl_event_t *ev);
int event_destroy(int device, fl_event_t ev);
int event_record(int device, fl_event_t ev, fl_stream_t s);
int stream_wait_event(int device, fl_stream_t s, fl_event_t ev);
int event_sync(int device, fl_event_t ev);
int event_query(int device, fl_event_t ev, int *done);
int event_elapsed(int device, fl_event_t a, fl_event_t b, double *ms);
int synchronize(int device);

/* ---- programs, kernels and launches (ocl_launch.c) */
static inline const char *tname(int dt) {
    switch (dt) {
    case FL_FLOAT32: return "f32"; case FL_FLOAT64: return "f64"; case FL_INT64: return "i64"; case FL_INT32: return "i32";
    case FL_INT16: return "i16"; case FL_INT8: return "i8"; case FL_UINT8: return "u8"; case FL_BOOL: return "b";
    case FL_FLOAT16: return "f16";
    }
    return NULL;
}
static inline const char *ctype(int dt) {
    switch (dt) {
    case FL_FLOAT32: return "float"; case FL_FLOAT64: return "double"; case FL_INT64: return "long"; case FL_INT32: return "int";
    case FL_INT16: return "short"; case FL_INT8: return "char"; case FL_UINT8: case FL_BOOL: return "uchar";
    }
    return NULL;
}
/* dtypes the kernels compute in; float16 is storage only (copies, conversions, fills, cat) */
static inline int dt_ok(dev_t_ *D, int dt) { return tname(dt) && dt != FL_FLOAT16 && (dt != FL_FLOAT64 || D->fp64); }
static inline int dt_store(dev_t_ *D, int dt) { return dt == FL_FLOAT16 || dt_ok(D, dt); }
static inline int is_flt(int dt) { return dt == FL_FLOAT32 || dt == FL_FLOAT64; }
/* The compiler's log for a message, at most n-1 bytes: from the line of its first error on when the whole
 * log does not fit (warnings often come first). */
void log_excerpt(const char *log, char *out, size_t n);
/* src built with opts for D, through the binary cache; NULL on failure (error in *err, log in *log: free it) */
cl_program build_program(dev_t_ *D, const char *src, const char *opts, cl_int *err, char **log);
typedef struct { size_t sz; const void *p; } karg_t;
#define KA(x) ((karg_t){sizeof(x), &(x)})
/* sets the arguments and enqueues, under the device's kernel lock (cl_kernel is not thread-safe) */
int launch(dev_t_ *D, fl_stream_t s, const char *prog, const char *kn, int na, const karg_t *a, int dims,
           const size_t *g, const size_t *l);
/* a 1-D launch of n work items (the global size rounded up to a multiple of 64) */
int launch1(dev_t_ *D, fl_stream_t s, const char *prog, const char *kn, int na, const karg_t *a, int64_t n);

/* ---- tensors on the device (ocl_launch.c) */
typedef struct { int64_t size[8]; int64_t st[4][8]; int64_t off[4]; int64_t ndim; int64_t n; } walk_t;
typedef struct { cl_mem m; int64_t off; } dt_t; /* buffer and element offset of element 0 */
static inline void span_of(const fl_tensor_t *t, int64_t *lo, int64_t *hi) {
    int64_t a = t->offset, b = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        int64_t e = (t->sizes[d] - 1) * t->strides[d];
        if (e > 0) b += e; else a += e;
    }
    *lo = a; *hi = b;
}
/* resolves t (checks its elements lie in its allocation); a tensor with no elements gets m = NULL */
int tres(dev_t_ *D, const fl_tensor_t *t, dt_t *r);
/* a walk over shape (sizes of ts0) for up to 4 tensors (NULL = scalar: stride 0), dims coalesced */
void mkwalk(walk_t *w, int nd, const int64_t *sizes, int nt, const fl_tensor_t *const *ts, const int64_t *base);
/* the parameter block prm_t of the kernels: long si[4], pi[4]; REAL sd[4], pd[4] */
typedef struct { int64_t si[4], pi[4]; unsigned char r[64]; } prm_t;
void prm_real(dev_t_ *D, prm_t *p, int which, int k, double v);
size_t prm_size(dev_t_ *D);
typedef union { double d; float f; } real_t;
karg_t ka_real(dev_t_ *D, real_t *r, double v);
cl_mem tmpbuf(dev_t_ *D, size_t n, int *st);
/* The device-side error flag: err_begin locks it; err_end unlocks, reads it (1 index out of range, 2 integer
 * division by zero, the offending value in *val) and resets it (ocl_launch.c says more). */
int err_begin(dev_t_ *D, cl_mem *em);
int err_end(dev_t_ *D, fl_stream_t s, int st, int *code, int64_t *val);

/* ---- kernels: the arguments every kernel entry point takes */
#define KARGS fl_stream_t stream, int device, const fl_tensor_t *in, int n_in, const fl_tensor_t *out, int n_out, \
              const fl_arg_t *args, int n_args
#define PASS stream, device, in, n_in, out, n_out, args, n_args

typedef struct { fl_tensor_t v; dt_t d; int scalar; double sd; int64_t si; } opnd_t;

/* ocl_pointwise.c: the elementwise driver, an op's output checked (out0_store: float16 too) */
int ew_run(dev_t_ *D, fl_stream_t s, int T, const char *kn, const fl_tensor_t *o, int nop, opnd_t *ops,
           double pa, double pb);
int out0(dev_t_ *D, const fl_tensor_t *out, int n_out, const fl_tensor_t **o);
int out0_store(dev_t_ *D, const fl_tensor_t *out, int n_out, const fl_tensor_t **o);
/* ocl_copy.c */
int fill_bits(dev_t_ *D, fl_stream_t s, const fl_tensor_t *o, uint64_t bits);
int copy_view(dev_t_ *D, fl_stream_t s, const fl_tensor_t *dst, const dt_t *dd, const fl_tensor_t *src, const dt_t *sd);
void contig_strides(fl_tensor_t *t);
int copy_any(dev_t_ *D, fl_stream_t s, const fl_tensor_t *dst, const fl_tensor_t *src0);
/* ocl_reduce.c */
int reduce(dev_t_ *D, fl_stream_t s, const fl_tensor_t *x0, const fl_arg_t *dims, int keepdim, const fl_tensor_t *o, int op, int mean);
int bool_at(const fl_arg_t *args, int n_args, int k);
/* ocl_gemm.c: C[b] (+)= alpha A[b] @ B[b] (K > 0); a (batch of) matrix in a buffer: element (b, i, j) at
 * off + b * bs + i * rs + j * cs */
typedef struct { cl_mem m; int64_t off, rs, cs, bs; } mat_t;
int gemm_mats(dev_t_ *D, fl_stream_t s, int T, int64_t batch, int64_t M, int64_t N, int64_t K, mat_t a, mat_t b,
              mat_t c, double alpha, int accum);
/* ocl_jit.c */
int jit_build(int device, const char *source, const char *symbol, void **handle);
int jit_launch(void *handle, fl_stream_t stream, int device, const fl_tensor_t *inputs, int n_in,
               const fl_tensor_t *outputs, int n_out, const fl_arg_t *args, int n_args);

/* the kernel table's entry points (opencl.c lists them) */
/* ocl_pointwise.c */
int k_add(KARGS), k_sub(KARGS), k_mul(KARGS), k_div(KARGS), k_neg(KARGS), k_exp(KARGS), k_log(KARGS), k_sqrt(KARGS),
    k_rsqrt(KARGS), k_tanh(KARGS), k_erf(KARGS), k_abs(KARGS), k_sigmoid(KARGS), k_pow_ts(KARGS), k_maximum(KARGS),
    k_minimum(KARGS), k_where(KARGS), k_eq(KARGS), k_gt(KARGS), k_lt(KARGS), k_uniform(KARGS), k_normal(KARGS),
    k_bernoulli(KARGS), k_ne(KARGS), k_le(KARGS), k_ge(KARGS), k_relu(KARGS), k_gelu(KARGS), k_silu(KARGS),
    k_threshold(KARGS), k_threshold_bw(KARGS), k_gelu_bw(KARGS), k_silu_bw(KARGS), k_sigmoid_bw(KARGS),
    k_tanh_bw(KARGS), k_band(KARGS), k_bor(KARGS), k_bxor(KARGS), k_bnot(KARGS), k_lnot(KARGS), k_signbit(KARGS),
    k_sin(KARGS), k_cos(KARGS), k_ceil(KARGS), k_floor(KARGS), k_trunc(KARGS), k_sign(KARGS), k_div_mode(KARGS),
    k_fmod(KARGS), k_remainder(KARGS);
/* ocl_copy.c */
int k_fill(KARGS), k_copy(KARGS), k_cat(KARGS), k_arange(KARGS), k_zero(KARGS);
/* ocl_index.c */
int k_gather(KARGS), k_scatter_value(KARGS), k_scatter_src(KARGS), k_scatter_add(KARGS), k_index_select(KARGS),
    k_embedding(KARGS), k_embedding_bw(KARGS);
/* ocl_reduce.c */
int k_sum_dim(KARGS), k_amax(KARGS), k_sum(KARGS), k_mean_dim(KARGS), k_mean(KARGS), k_max_all(KARGS),
    k_min_all(KARGS), k_amin(KARGS), k_max_dim(KARGS), k_min_dim(KARGS), k_argmax(KARGS), k_argmin(KARGS),
    k_var(KARGS), k_std(KARGS), k_var_mean(KARGS), k_std_mean(KARGS), k_cumsum(KARGS), k_sort_stable(KARGS),
    k_topk(KARGS);
/* ocl_norm.c */
int k_softmax(KARGS), k_log_softmax(KARGS), k_softmax_bw(KARGS), k_log_softmax_bw(KARGS), k_layer_norm(KARGS),
    k_layer_norm_bw(KARGS);
/* ocl_gemm.c */
int k_mm(KARGS), k_bmm(KARGS), k_addmm(KARGS);
/* ocl_conv.c */
int k_conv(KARGS), k_conv_bw(KARGS);

#endif
