/* Internals shared by the host plugin's elementwise kernel files. Not part of the ABI.
 *
 * Files (each exports its own kernel group, listed in common.c in this order):
 *   k_elementwise.c  the engine below, and copy_, fill_, zero_
 *   k_binary.c       binary arithmetic, bitwise ops, pow, comparisons, logical ops, isnan/isinf
 *   k_unary.c        unary math and activations, clamp, nan_to_num
 *   k_ternary.c      pointwise backward (grad, saved), where, addcmul/addcdiv, lerp, masked_fill
 *   k_random.c       uniform_, normal_, exponential_, bernoulli, random_, native_dropout
 * Each compiles with #pragma GCC optimize("no-math-errno") before this header.
 *
 * Engine (k_elementwise.c): every op is a small loop over contiguous arrays of one "compute
 * type" (float for f32/f16/bf16 results, double for f64, int64 for integer
 * and bool results). The driver walks the output with fl_iter_t in chunks of
 * CH elements; an operand that already has the compute dtype and a unit or
 * zero inner stride is used in place, any other operand is converted into a
 * per-chunk buffer (cvt_row), and so is the result on the way out. Scalars
 * become zero-stride tensors over a local of the compute dtype. Inputs are
 * broadcast to the output shape here too (a no-op for pointwise-tagged ops,
 * which the runtime broadcasts; needed for the untagged ones such as
 * hardtanh_backward, masked_fill_, rsub.Tensor, abs_).
 *
 * String arguments: the runtime passes gelu/gelu_backward's `approximate` as
 * FL_ARG_OTHER with i = FL_STR_none or FL_STR_tanh (fl_plugin.h). div with a
 * rounding_mode (div.Tensor_mode & co) has no kernel here: PyTorch's
 * decomposition into div and trunc/floor serves it.
 */
#ifndef FL_K_ELEMENTWISE_H
#define FL_K_ELEMENTWISE_H

#include <stdlib.h>

#include "fl_host.h"

#define CH 1024
#define PAR_MIN 32768
#define PAR_CHUNK 16384 /* elements a thread of fl_par_for gets at least */
#define UNSUP FL_ERR_UNSUPPORTED

/* value of a scalar argument stored as dtype `dt` into buf (exact for ints) */
static void scalar_to(const fl_arg_t *a, int dt, void *buf) {
    if (a->kind == FL_ARG_FLOAT) fl_cvt_row(dt, buf, 1, FL_FLOAT64, &a->f, 0, 1);
    else fl_cvt_row(dt, buf, 1, FL_INT64, &a->i, 0, 1);
}

enum { CT_F = 0, CT_D = 1, CT_I = 2 };
static const int ct_dtype[3] = {FL_FLOAT32, FL_FLOAT64, FL_INT64};
static int ct_of(int dtype) {
    if (dtype == FL_FLOAT32 || dtype == FL_FLOAT16 || dtype == FL_BFLOAT16) return CT_F;
    if (dtype == FL_FLOAT64) return CT_D;
    return CT_I;
}

typedef struct {
    double d[6];
    int64_t i[6];
} kp_t;
typedef void (*ewfn)(int64_t n, void *o, const void *const *x, const int64_t *xs, const kp_t *p);

#define MAXOP 5
typedef struct {
    fl_tensor_t t[MAXOP];
    int64_t sc[MAXOP]; /* scalar storage (8 bytes: float, double or int64) */
    int n;
} opnds_t;

/* ---- the engine (k_elementwise.c) ---- */
/* dst = convert(src), src already broadcast to dst's shape: parallel, tiled for transposes, a fill for a
 * broadcast single value */
void fl_ew_copy_strided(const fl_tensor_t *dst, const fl_tensor_t *src);
/* Adds operand from argument a (tensor broadcast to out, or scalar stored in the compute dtype). */
int fl_ew_opnd_add(opnds_t *o, const fl_tensor_t *in, int n_in, const fl_arg_t *a, const fl_tensor_t *out, int ct);
/* out = fn(operands), in chunks of CH elements of compute type ct, across the kernels' worker pool */
int fl_ew_run(const fl_tensor_t *out, const opnds_t *ops, int ct, ewfn fn, const kp_t *p);
/* Operands are args[opi[k]] (k < nop); params p (already filled); ct < 0: the output's compute type. */
int fl_ew_simple(const fl_tensor_t *in, int n_in, const fl_tensor_t *out, int n_out, const fl_arg_t *args,
                 int n_args, int nop, const int *opi, const ewfn *tab, const kp_t *p, int ct);
/* param k from scalar argument a; declines a fractional value for int compute */
int fl_ew_set_param(kp_t *p, int k, const fl_arg_t *a, int ct);

/* ---- loop generators ---- */
#define PL_F const float s0 = (float)p->d[0], s1 = (float)p->d[1], s2 = (float)p->d[2], s3 = (float)p->d[3];
#define PL_D const double s0 = p->d[0], s1 = p->d[1], s2 = p->d[2], s3 = p->d[3];
#define PL_I const int64_t s0 = p->i[0], s1 = p->i[1], s2 = p->i[2], s3 = p->i[3];
#define PL_USE (void)s0; (void)s1; (void)s2; (void)s3; (void)p;

#define U __attribute__((unused))
#define K1(fname, T, PL, EXPR)                                                              \
    FL_MV static void fname(int64_t n, void *o_, const void *const *x, const int64_t *xs, const kp_t *p) { \
        T *restrict o = (T *)o_;                                                            \
        const T *restrict A = (const T *)x[0];                                              \
        PL PL_USE                                                                           \
        if (xs[0]) {                                                                        \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; o[i] = (EXPR); }                  \
        } else {                                                                            \
            U T a = A[0]; T v_ = (EXPR);                                                      \
            for (int64_t i = 0; i < n; i++) o[i] = v_;                                      \
        }                                                                                   \
    }

#define K2(fname, T, PL, EXPR)                                                              \
    FL_MV static void fname(int64_t n, void *o_, const void *const *x, const int64_t *xs, const kp_t *p) { \
        T *restrict o = (T *)o_;                                                            \
        const T *restrict A = (const T *)x[0], *restrict B = (const T *)x[1];               \
        PL PL_USE                                                                           \
        if (xs[0] && xs[1]) {                                                               \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; U T b = B[i]; o[i] = (EXPR); }        \
        } else if (xs[0]) {                                                                 \
            U T b = B[0];                                                                     \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; o[i] = (EXPR); }                  \
        } else if (xs[1]) {                                                                 \
            U T a = A[0];                                                                     \
            for (int64_t i = 0; i < n; i++) { U T b = B[i]; o[i] = (EXPR); }                  \
        } else {                                                                            \
            U T a = A[0]; U T b = B[0]; T v_ = (EXPR);                                            \
            for (int64_t i = 0; i < n; i++) o[i] = v_;                                      \
        }                                                                                   \
    }

#define K3(fname, T, PL, EXPR)                                                              \
    FL_MV static void fname(int64_t n, void *o_, const void *const *x, const int64_t *xs, const kp_t *p) { \
        T *restrict o = (T *)o_;                                                            \
        const T *restrict A = (const T *)x[0], *restrict B = (const T *)x[1], *restrict C = (const T *)x[2]; \
        PL PL_USE                                                                           \
        if (xs[0] && xs[1] && xs[2]) {                                                      \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; U T b = B[i]; U T c = C[i]; o[i] = (EXPR); } \
        } else if (xs[0] && xs[1]) {                                                        \
            U T c = C[0];                                                                     \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; U T b = B[i]; o[i] = (EXPR); }        \
        } else {                                                                            \
            const int64_t sa = xs[0], sb = xs[1], sc = xs[2];                               \
            for (int64_t i = 0; i < n; i++) { U T a = A[i * sa]; U T b = B[i * sb]; U T c = C[i * sc]; o[i] = (EXPR); } \
        }                                                                                   \
    }

/* op tables: {float, double, int64} */
#define OP1(name, EF, ED, EI) K1(name##_f, float, PL_F, EF) K1(name##_d, double, PL_D, ED) K1(name##_i, int64_t, PL_I, EI) \
    static const ewfn name##_t[3] = {name##_f, name##_d, name##_i};
#define OP1F(name, EF, ED) K1(name##_f, float, PL_F, EF) K1(name##_d, double, PL_D, ED) \
    static const ewfn name##_t[3] = {name##_f, name##_d, NULL};
#define OP2(name, EF, ED, EI) K2(name##_f, float, PL_F, EF) K2(name##_d, double, PL_D, ED) K2(name##_i, int64_t, PL_I, EI) \
    static const ewfn name##_t[3] = {name##_f, name##_d, name##_i};
#define OP2F(name, EF, ED) K2(name##_f, float, PL_F, EF) K2(name##_d, double, PL_D, ED) \
    static const ewfn name##_t[3] = {name##_f, name##_d, NULL};
#define OP3(name, EF, ED, EI) K3(name##_f, float, PL_F, EF) K3(name##_d, double, PL_D, ED) K3(name##_i, int64_t, PL_I, EI) \
    static const ewfn name##_t[3] = {name##_f, name##_d, name##_i};
#define OP3F(name, EF, ED) K3(name##_f, float, PL_F, EF) K3(name##_d, double, PL_D, ED) \
    static const ewfn name##_t[3] = {name##_f, name##_d, NULL};

/* ---- scalar helpers ---- */

static inline float vtanhf(float x) {
    float ax = fabsf(x);
    float z = x * x;
    float small = ((((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z + 1.33314422036E-1f) * z -
                   3.33332819422E-1f) * z * x + x;
    float big = 1.0f - 2.0f / (fl_vexpf(2.0f * ax) + 1.0f);
    big = x < 0 ? -big : big;
    return ax < 0.625f ? (x == 0.0f ? x : small) : big; /* tanh(-0.0) is -0.0 */
}
static inline float sigm_f(float x) { return 1.0f / (1.0f + fl_vexpf(-x)); }
static inline double sigm_d(double x) { return 1.0 / (1.0 + exp(-x)); }
static inline int64_t ipow(int64_t b, int64_t e) {
    if (e < 0) return b == 1 ? 1 : (b == -1 ? ((e & 1) ? -1 : 1) : 0);
    uint64_t r = 1, bb = (uint64_t)b;
    while (e) { if (e & 1) r *= bb; bb *= bb; e >>= 1; }
    return (int64_t)r;
}
static inline int64_t irem(int64_t a, int64_t b) { /* python-style, b != 0 guarded */
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t ifmod(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }
static inline float remf_(float a, float b) { float m = fmodf(a, b); return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m; }
static inline double rem_(double a, double b) { double m = fmod(a, b); return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m; }
static inline float gelu_sf(float x) { return 0.5f * x * (1.0f + FL_ERFF(x * (float)M_SQRT1_2)); }
static inline double gelu_sd(double x) { return 0.5 * x * (1.0 + erf(x * M_SQRT1_2)); }
#define KBETA 0.7978845608028654 /* sqrt(2/pi) */
#define KKAPPA 0.044715
static inline float gelut_sf(float x) { return 0.5f * x * (1.0f + vtanhf((float)KBETA * (x + (float)KKAPPA * x * x * x))); }
static inline double gelut_sd(double x) { return 0.5 * x * (1.0 + tanh(KBETA * (x + KKAPPA * x * x * x))); }
static inline float gelu_bw_sf(float g, float x) {
    float cdf = 0.5f * (1.0f + FL_ERFF(x * (float)M_SQRT1_2));
    float pdf = fl_vexpf(-0.5f * x * x) * (float)(0.3989422804014327);
    return g * (cdf + x * pdf);
}
static inline double gelu_bw_sd(double g, double x) {
    double cdf = 0.5 * (1.0 + erf(x * M_SQRT1_2));
    double pdf = exp(-0.5 * x * x) * 0.3989422804014327;
    return g * (cdf + x * pdf);
}
static inline float gelut_bw_sf(float g, float x) {
    float xsq = x * x, inner = (float)KBETA * (x + (float)KKAPPA * xsq * x), t = vtanhf(inner);
    float left = 0.5f * x, right = 1.0f + t;
    float ld = 0.5f * right, rd = left * (1.0f - t * t) * (float)KBETA * (1.0f + 3.0f * (float)KKAPPA * xsq);
    return g * (ld + rd);
}
static inline double gelut_bw_sd(double g, double x) {
    double xsq = x * x, inner = KBETA * (x + KKAPPA * xsq * x), t = tanh(inner);
    double left = 0.5 * x, right = 1.0 + t;
    double ld = 0.5 * right, rd = left * (1.0 - t * t) * KBETA * (1.0 + 3.0 * KKAPPA * xsq);
    return g * (ld + rd);
}
#define SGN(a) ((a) > 0 ? 1 : ((a) < 0 ? -1 : 0))
/* as PyTorch: a NaN bound gives NaN (x != x is false for integers), x is kept when it equals a bound */
#define CLAMP_LO(a, lo) ((lo) != (lo) ? (lo) : ((a) < (lo) ? (lo) : (a)))
#define CLAMP_HI(a, hi) ((hi) != (hi) ? (hi) : ((a) > (hi) ? (hi) : (a)))
#define CLAMP(a, lo, hi) ({ __typeof__(a) t_ = CLAMP_LO(a, lo); CLAMP_HI(t_, hi); })

#define OUTCT (fl_out_ok(out, n_out) ? ct_of(out[0].dtype) : CT_F)
#define CHECK_OUT if (!fl_out_ok(out, n_out)) return UNSUP;

/* unary, no params */
#define DEF_UNARY(kname, tab)                                                          \
    static int kname(FL_KERNEL_ARGS) {                                                 \
        FL_UNUSED_KERNEL_ARGS;                                                         \
        kp_t p = {{0}};                                                                \
        return fl_ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, tab, &p, -1); \
    }

#define DEF_BINARY(kname, tab)                                                            \
    static int kname(FL_KERNEL_ARGS) {                                                    \
        FL_UNUSED_KERNEL_ARGS;                                                            \
        kp_t p = {{0}};                                                                   \
        return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, -1); \
    }

/* a complex result goes to k_complex.c (the table names each op once) */
#define COMPLEX_TO(op)                                                                          \
    if (fl_out_ok(out, n_out) && fl_is_complex(out[0].dtype))                                      \
        return fl_host_complex_pointwise(op, stream, device, in, n_in, out, n_out, args, n_args)

static int approx_mode(const fl_arg_t *a) { /* 0 none, 1 tanh, -1 unknown */
    if (a->kind == FL_ARG_OTHER && (a->i == FL_STR_none || a->i == FL_STR_tanh)) return a->i == FL_STR_tanh;
    return -1;
}

/* 1 / x: reciprocal, and pow(x, -1) (k_unary.c, k_binary.c) */
OP1F(recip, 1.0f / a, 1.0 / a)

/* table shorthands */
#define ALL FL_ALL_DTYPES
#define FLT FL_FLOATS
#define NUM (FL_FLOATS | FL_INTS)
#define INTB (FL_INTS | FL_DTYPE_BIT(FL_BOOL))
#define CPX FL_COMPLEX
#define E(name, mask, fn) {name, mask, 0, fn}

#endif
