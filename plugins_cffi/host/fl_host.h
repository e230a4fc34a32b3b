/* Internals shared by the host plugin's kernel files. Not part of the ABI. */
#ifndef FL_HOST_H
#define FL_HOST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fl_plugin.h"
#include "fl_kernel_util.h" /* the helpers vendors get too: dtypes, iterators, arguments */

/* Hot leaf loops are compiled twice (AVX2+FMA and baseline x86-64) and
 * picked at load time through an ifunc, so the library runs on any x86-64. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_MV __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FL_MV
#endif

/* erf of a float: where glibc's libmvec has erf (x86-64, glibc >= 2.35), through the double erf declared
 * `omp declare simd`, so that a loop over elements calls its 2/4-wide variants (one call per element of erff took
 * ~5 ns, most of a GELU), rounded once to float: within 1 ulp of erff, which is not correctly rounded (over
 * 13M floats in [-6, 6], 6 % differed by 1 ulp, the double route being the closer). Elsewhere erff. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(_OPENMP) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#pragma omp declare simd notinbranch
double erf(double) __attribute__((__const__, __nothrow__));
#define FL_ERFF(x) ((float)erf((double)(x)))
#else
#define FL_ERFF(x) erff(x)
#endif

/* ---- pool.c: the kernels' worker pool ----
 * fn(ctx, lo, hi) over [lo, hi) ranges covering [0, n), each at least `grain` long but the last: on the
 * calling thread alone when n < 2 * grain or the caller's OpenMP team size is 1, else in chunks shared with
 * the pool's workers, the caller taking its share from the start and waiting only for chunks a worker
 * claimed (pool.c says why not an OpenMP region). fn must not depend on which thread runs a range. */
typedef void (*fl_par_fn)(void *ctx, int64_t lo, int64_t hi);
void fl_par_for(int64_t n, int64_t grain, fl_par_fn fn, void *ctx);
/* fl_par_for's grain for `units` units of `numel` elements in all: every unit on the calling thread below
 * min_par elements, else chunks of at least min_chunk elements */
static inline int64_t fl_par_grain(int64_t units, int64_t numel, int64_t min_par, int64_t min_chunk) {
    if (numel < min_par || units < 2) return units > 1 ? units : 1;
    int64_t per = numel / units > 0 ? numel / units : 1, g = (min_chunk + per - 1) / per;
    return g > 1 ? g : 1;
}

/* ---- errors: a thread-local message read back through last_error ---- */
void fl_host_set_error(const char *fmt, ...);
const char *fl_host_last_error(void);
#define FL_FAIL(status, ...) do { fl_host_set_error(__VA_ARGS__); return (status); } while (0)

/* Load/store any dtype through double (exact for every integer up to 2^53). A complex
 * element loads as its real part and stores as (v, 0); fl_load_cx/fl_store_cx keep both. */
static inline double fl_load_f64(int dtype, const void *p) {
    switch (dtype) {
    case FL_FLOAT32: return *(const float *)p;
    case FL_FLOAT64: return *(const double *)p;
    case FL_FLOAT16: return fl_f16_to_f32(*(const uint16_t *)p);
    case FL_BFLOAT16: return fl_bf16_to_f32(*(const uint16_t *)p);
    case FL_INT64: return (double)*(const int64_t *)p;
    case FL_INT32: return *(const int32_t *)p;
    case FL_INT16: return *(const int16_t *)p;
    case FL_INT8: return *(const int8_t *)p;
    case FL_UINT8: return *(const uint8_t *)p;
    case FL_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    case FL_COMPLEX64: return *(const float *)p;
    case FL_COMPLEX128: return *(const double *)p;
    }
    return 0.0;
}
static inline void fl_store_f64(int dtype, void *p, double v) {
    switch (dtype) {
    case FL_FLOAT32: *(float *)p = (float)v; break;
    case FL_FLOAT64: *(double *)p = v; break;
    case FL_FLOAT16: *(uint16_t *)p = fl_f32_to_f16((float)v); break;
    case FL_BFLOAT16: *(uint16_t *)p = fl_f32_to_bf16((float)v); break;
    case FL_INT64: *(int64_t *)p = (int64_t)v; break;
    case FL_INT32: *(int32_t *)p = (int32_t)v; break;
    case FL_INT16: *(int16_t *)p = (int16_t)v; break;
    case FL_INT8: *(int8_t *)p = (int8_t)v; break;
    case FL_UINT8: *(uint8_t *)p = (uint8_t)v; break;
    case FL_BOOL: *(uint8_t *)p = v != 0.0; break;
    case FL_COMPLEX64: ((float *)p)[0] = (float)v; ((float *)p)[1] = 0.0f; break;
    case FL_COMPLEX128: ((double *)p)[0] = v; ((double *)p)[1] = 0.0; break;
    }
}

/* Complex values through a pair of doubles: a real dtype loads with im = 0; storing
 * into a real dtype keeps the real part (PyTorch's cast discards the imaginary part). */
typedef struct { double re, im; } fl_cx_t;
static inline fl_cx_t fl_load_cx(int dtype, const void *p) {
    if (dtype == FL_COMPLEX64) return (fl_cx_t){((const float *)p)[0], ((const float *)p)[1]};
    if (dtype == FL_COMPLEX128) return (fl_cx_t){((const double *)p)[0], ((const double *)p)[1]};
    return (fl_cx_t){fl_load_f64(dtype, p), 0.0};
}
static inline void fl_store_cx(int dtype, void *p, fl_cx_t v) {
    if (dtype == FL_COMPLEX64) { ((float *)p)[0] = (float)v.re; ((float *)p)[1] = (float)v.im; }
    else if (dtype == FL_COMPLEX128) { ((double *)p)[0] = v.re; ((double *)p)[1] = v.im; }
    else fl_store_f64(dtype, p, v.re);
}

/* sizes and counts from the environment (common.c): the grammar of torch_fl/runtime/config.py
 * (fl_parse_size). They give dflt when the variable is unset or empty and fail with
 * FL_ERR_INVALID and a message naming the variable when its value is not accepted. */
int fl_host_env_size(const char *name, uint64_t dflt, uint64_t *out);
int fl_host_env_count(const char *name, int dflt, int lo, int hi, const char *what, int *out);

/* The compiled-code cache folder (cachedir.c): `sub` appended ("" for the host JIT, "/opencl"), 0 when the
 * path fits in n with `room` bytes to spare for file names; fl_make_dirs creates missing folders 0700 */
int fl_cache_dir(char *out, size_t n, const char *sub, size_t room);
int fl_make_dirs(const char *path);

/* SHA-256 (sha256.c): the JIT cache records the digest of every library it builds */
typedef struct {
    uint32_t h[8];
    uint64_t len;
    size_t used;
    unsigned char buf[64];
} fl_sha256_t;
void fl_sha256_init(fl_sha256_t *s);
void fl_sha256_update(fl_sha256_t *s, const void *data, size_t n);
void fl_sha256_hex(fl_sha256_t *s, char out[65]);

/* dst[i*ds] = (dtype dd) src[i*ss] for i < n, strides in elements (common.c) */
void fl_cvt_row(int dd, void *dst, int64_t ds, int sd, const void *src, int64_t ss, int64_t n);
/* dst = src converted to dst's dtype; src already has dst's shape, both strided (common.c) */
void fl_copy_strided(const fl_tensor_t *dst, const fl_tensor_t *src);
/* dst = 0 in dst's dtype, any strides (common.c) */
void fl_zero_strided(const fl_tensor_t *dst);
/* an index element (int64, int32 or any dtype through double) as int64_t; off includes t->offset */
static inline int64_t fl_load_i64(const fl_tensor_t *t, int64_t off) {
    if (t->dtype == FL_INT64) return *(const int64_t *)fl_elem(t, off);
    if (t->dtype == FL_INT32) return *(const int32_t *)fl_elem(t, off);
    return (int64_t)fl_load_f64(t->dtype, fl_elem(t, off));
}
/* qsort's comparison of two int64_t */
static inline int fl_cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* ---- synchronous streams and events, for a plugin whose work has finished when each call returns:
 * a stream is a token and an event is always complete. Defines stream_create, stream_destroy,
 * stream_sync, event_create, event_destroy, event_record, event_sync, event_query and synchronize,
 * each checking its device with CHECK(device). ---- */
#define FL_SYNC_STREAMS(CHECK)                                                                               \
    static int stream_create(int device, fl_stream_t *s) { *s = (fl_stream_t)(intptr_t)1; return CHECK(device); } \
    static int stream_destroy(int device, fl_stream_t s) { (void)s; return CHECK(device); }                  \
    static int stream_sync(int device, fl_stream_t s) { (void)s; return CHECK(device); }                     \
    static int event_create(int device, fl_event_t *e) { *e = (fl_event_t)(intptr_t)1; return CHECK(device); } \
    static int event_destroy(int device, fl_event_t e) { (void)e; return CHECK(device); }                    \
    static int event_record(int device, fl_event_t e, fl_stream_t s) { (void)e; (void)s; return CHECK(device); } \
    static int event_sync(int device, fl_event_t e) { (void)e; return CHECK(device); }                       \
    static int event_query(int device, fl_event_t e, int *done) { (void)e; *done = 1; return CHECK(device); } \
    static int synchronize(int device) { return CHECK(device); }

/* ---- random numbers: counter-based (Philox-like via splitmix64) ---- */
uint64_t fl_host_rng_reserve(int device, uint64_t count, uint64_t *seed);
static inline uint64_t fl_splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
/* uniform in [0,1) from (seed, counter) */
static inline double fl_rand_uniform(uint64_t seed, uint64_t counter) {
    return (double)(fl_splitmix64(seed ^ fl_splitmix64(counter)) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- jit.c: compile generated C kernels with the system compiler (cached) ---- */
int fl_host_jit_compile(const char *source, const char *symbol, fl_kernel_fn *fn);

/* ---- kernel tables: each kernel file exports one ---- */
typedef struct { const fl_kernel_entry_t *entries; int count; } fl_kernel_group_t;
/* the elementwise family (k_elementwise.h): */
extern const fl_kernel_group_t fl_host_group_elementwise; /* k_elementwise.c: the engine; copy_, fill_, zero_ */
extern const fl_kernel_group_t fl_host_group_binary;      /* k_binary.c: arithmetic, comparisons, logical */
extern const fl_kernel_group_t fl_host_group_unary;       /* k_unary.c */
extern const fl_kernel_group_t fl_host_group_ternary;     /* k_ternary.c: pointwise backward, where, addc*, lerp */
extern const fl_kernel_group_t fl_host_group_random;      /* k_random.c */
extern const fl_kernel_group_t fl_host_group_reduce;
extern const fl_kernel_group_t fl_host_group_linalg;
extern const fl_kernel_group_t fl_host_group_special; /* k_special.c */
/* the LAPACK family (k_lapack.h): */
extern const fl_kernel_group_t fl_host_group_lu;         /* k_lu.c */
extern const fl_kernel_group_t fl_host_group_cholesky;   /* k_cholesky.c */
extern const fl_kernel_group_t fl_host_group_eigh_svd;   /* k_eigh_svd.c */
extern const fl_kernel_group_t fl_host_group_qr;         /* k_qr.c */
extern const fl_kernel_group_t fl_host_group_triangular; /* k_triangular.c: triangular solves, LDL^T */
extern const fl_kernel_group_t fl_host_group_matrix_exp; /* k_matrix_exp.c */
/* the indexing family (k_index.h): */
extern const fl_kernel_group_t fl_host_group_gather;  /* k_gather.c: gathers, cat, stack, flip, arange */
extern const fl_kernel_group_t fl_host_group_sort;    /* k_sort.c: sorting and scans */
extern const fl_kernel_group_t fl_host_group_scatter; /* k_scatter.c */
extern const fl_kernel_group_t fl_host_group_index;   /* k_index.c: advanced, flat and masked indexing */
extern const fl_kernel_group_t fl_host_group_search;  /* k_search.c */
extern const fl_kernel_group_t fl_host_group_layout;  /* k_layout.c: layout ops, segment_reduce */
/* the nn family on float64 scratch (k_nn.h): */
extern const fl_kernel_group_t fl_host_group_pad;           /* k_pad.c */
extern const fl_kernel_group_t fl_host_group_upsample;      /* k_upsample.c */
extern const fl_kernel_group_t fl_host_group_im2col;        /* k_im2col.c */
extern const fl_kernel_group_t fl_host_group_grid_sample;   /* k_grid_sample.c */
extern const fl_kernel_group_t fl_host_group_distance;      /* k_distance.c: pdist, cdist */
extern const fl_kernel_group_t fl_host_group_rrelu;         /* k_rrelu.c */
extern const fl_kernel_group_t fl_host_group_embedding_bag; /* k_embedding_bag.c */
extern const fl_kernel_group_t fl_host_group_pool;    /* k_pool.c: every pooling and unpooling kernel */
extern const fl_kernel_group_t fl_host_group_loss;    /* k_loss.c: nll_loss(2d) forward and backward */
/* every group above, the table the host plugin serves and the emulators filter (common.c) */
extern const fl_kernel_group_t *const fl_host_groups[];
extern const int fl_host_ngroups;
extern const fl_kernel_group_t fl_host_group_fft;     /* k_fft.c: _fft_r2c, _fft_c2c, _fft_c2r */

/* k_complex.c: pointwise kernels on complex outputs, called by k_binary.c's and k_unary.c's kernels of
 * the same ops when out[0] is complex (a kernel name appears once per table). op is one of
 * FL_CX_*; binary ops take args[0..1] (+ alpha in args[2] for add/sub); unary take args[0]. */
enum { FL_CX_ADD, FL_CX_SUB, FL_CX_MUL, FL_CX_DIV, FL_CX_NEG, FL_CX_CONJ };
int fl_host_complex_pointwise(int op, fl_stream_t stream, int device, const fl_tensor_t *in, int n_in,
                              const fl_tensor_t *out, int n_out, const fl_arg_t *args, int n_args);

/* Mask helpers for the table */
#define FL_F32 FL_DTYPE_BIT(FL_FLOAT32)
#define FL_F64 FL_DTYPE_BIT(FL_FLOAT64)
#define FL_F16 FL_DTYPE_BIT(FL_FLOAT16)
#define FL_BF16 FL_DTYPE_BIT(FL_BFLOAT16)
#define FL_FLOATS (FL_F32 | FL_F64 | FL_F16 | FL_BF16)
#define FL_INTS (FL_DTYPE_BIT(FL_INT64) | FL_DTYPE_BIT(FL_INT32) | FL_DTYPE_BIT(FL_INT16) | \
                 FL_DTYPE_BIT(FL_INT8) | FL_DTYPE_BIT(FL_UINT8))
/* Every real dtype: the mask of kernels that compute through fl_load_f64 & co. Complex is
 * declared separately, by the kernels that handle it (the runtime never hands a kernel a
 * complex tensor its mask does not name). */
#define FL_ALL_DTYPES (FL_FLOATS | FL_INTS | FL_DTYPE_BIT(FL_BOOL))
#define FL_C64 FL_DTYPE_BIT(FL_COMPLEX64)
#define FL_C128 FL_DTYPE_BIT(FL_COMPLEX128)
#define FL_COMPLEX (FL_C64 | FL_C128)

#define FL_KERNEL_ARGS fl_stream_t stream, int device, const fl_tensor_t *in, int n_in, \
                       const fl_tensor_t *out, int n_out, const fl_arg_t *args, int n_args
#define FL_UNUSED_KERNEL_ARGS (void)stream; (void)device; (void)in; (void)n_in; (void)out; \
                              (void)n_out; (void)args; (void)n_args

#endif
