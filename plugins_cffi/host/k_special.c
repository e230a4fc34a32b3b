/* Host kernels: special functions.
 *
 * The gamma family (digamma, lgamma, polygamma, mvlgamma, igamma, igammac),
 * the error-function family (erfinv, erfcx, ndtri, log_ndtr), Bessel and
 * Airy functions, the orthogonal polynomials of torch.special, and a few
 * elementwise ops PyTorch implements next to them (angle of a real tensor,
 * fmax/fmin, nextafter, frexp, round.decimals).
 *
 * The mathematics lives in fl_special_math.h and fl_special_bessel.h, ported from PyTorch's
 * ATen/native/Math.h and shared with the JIT tier; this file only walks
 * tensors. The engine (sp_run) follows k_elementwise.c: the output is
 * walked with fl_iter_t in chunks of CH elements, each operand (a tensor
 * broadcast to the output, or a scalar argument) is converted to double per
 * chunk, the function fills a double buffer and the chunk is stored in the
 * output dtype. Operands are first rounded to the output dtype, as PyTorch's
 * TensorIterator casts every input to the common dtype (a float64 scalar
 * next to a float32 tensor computes with the float32 value). Everything then
 * computes in double, float16 and bfloat16 included; results agree with
 * PyTorch's float32 kernels within float rounding. The exceptions, where the
 * element type changes the answer beyond rounding, pick a per-dtype function:
 * nextafter, round.decimals and trigamma (float arithmetic below float64),
 * and the orthogonal polynomials (float32 recurrences overflow sooner; the
 * Hermite ones give NaN above degree 128 in float32, 512 in float64).
 */
#include <stdlib.h>

#include "fl_host.h"
#include "fl_special_math.h"
#include "fl_special_bessel.h"  /* after fl_special_math.h: it uses its helpers */

#define CH 1024
#define PAR_MIN 4096 /* these cost tens to hundreds of ns an element: parallelise early */
#define UNSUP FL_ERR_UNSUPPORTED

/* ------------------------------------------------------------------ */
/* the engine                                                          */
/* ------------------------------------------------------------------ */

/* One op: a function of one or two doubles, or of one double and an int
 * argument of the op (polygamma's n, mvlgamma's p, round's decimals). */
typedef struct {
    int nop;                        /* operands taken from args: 1 or 2 */
    double (*f1)(double);
    double (*f2)(double, double);
    double (*fi)(double, int64_t);
    int64_t iarg;                   /* the int argument of fi */
    int no_half;                    /* PyTorch has no float16/bfloat16 kernel: decline them */
} sp_fn_t;

typedef struct {
    fl_tensor_t t[2];
    int64_t scalar[2]; /* storage of a scalar operand (8 bytes, in the output dtype) */
    int n;
} sp_opnds_t;




/* Adds args[k] as an operand: a tensor broadcast to out, or a scalar stored
 * in the dtype `dt` as a zero-stride tensor. */
static int opnd_add(sp_opnds_t *o, const fl_tensor_t *in, int n_in, const fl_arg_t *a, const fl_tensor_t *out, int dt) {
    fl_tensor_t *t = &o->t[o->n];
    if (a->kind == FL_ARG_TENSOR) {
        if (a->i < 0 || a->i >= n_in || fl_bcast(&in[a->i], out->ndim, out->sizes, t)) return UNSUP;
    } else if (fl_arg_is_num(a)) {
        if (a->kind == FL_ARG_FLOAT) fl_cvt_row(dt, &o->scalar[o->n], 1, FL_FLOAT64, &a->f, 0, 1);
        else fl_cvt_row(dt, &o->scalar[o->n], 1, FL_INT64, &a->i, 0, 1);
        fl_tensor_t s = {.data = &o->scalar[o->n], .offset = 0, .dtype = dt, .ndim = 0};
        if (fl_bcast(&s, out->ndim, out->sizes, t)) return UNSUP;
    } else {
        return UNSUP;
    }
    o->n++;
    return FL_OK;
}

static void sp_apply(const sp_fn_t *fn, int64_t n, double *o, const double *a, const double *b) {
    if (fn->f1) {
        for (int64_t i = 0; i < n; i++) o[i] = fn->f1(a[i]);
    } else if (fn->f2) {
        for (int64_t i = 0; i < n; i++) o[i] = fn->f2(a[i], b[i]);
    } else {
        for (int64_t i = 0; i < n; i++) o[i] = fn->fi(a[i], fn->iarg);
    }
}

/* out = fn(operands...) for a floating out; operands are args[opi[k]]. */
static int sp_run(const fl_tensor_t *in, int n_in, const fl_tensor_t *out, int n_out, const fl_arg_t *args,
                  int n_args, const int *opi, const sp_fn_t *fn) {
    if (!fl_out_ok(out, n_out) || !fl_is_floating(out[0].dtype)) return UNSUP;
    if (fn->no_half && (out[0].dtype == FL_FLOAT16 || out[0].dtype == FL_BFLOAT16)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    sp_opnds_t ops = {.n = 0};
    for (int k = 0; k < fn->nop; k++) {
        if (opi[k] >= n_args) return UNSUP;
        int st = opnd_add(&ops, in, n_in, &args[opi[k]], o, o->dtype);
        if (st) return st;
    }
    const fl_tensor_t *ts[3] = {o, &ops.t[0], &ops.t[1]};
    fl_iter_t it;
    fl_iter_init(&it, 1 + ops.n, ts);
    int64_t numel = it.outer * it.inner;
    if (numel == 0) return FL_OK;
    int64_t nchunk = (it.inner + CH - 1) / CH, units = it.outer * nchunk;
#pragma omp parallel for schedule(static) if (numel >= PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        double x[2][CH], r[CH];
        int64_t tmp[CH]; /* an operand in the output dtype on its way to double */
        int64_t row = u / nchunk, c0 = (u % nchunk) * CH;
        int64_t len = it.inner - c0 < CH ? it.inner - c0 : CH;
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, row, base);
        for (int k = 0; k < ops.n; k++) {
            const fl_tensor_t *t = &ops.t[k];
            int64_t st = it.inner_stride[k + 1];
            const char *p = fl_elem(t, base[k + 1] + c0 * st);
            if (t->dtype == o->dtype) {
                fl_cvt_row(FL_FLOAT64, x[k], 1, t->dtype, p, st, len);
            } else {
                fl_cvt_row(o->dtype, tmp, 1, t->dtype, p, st, len);
                fl_cvt_row(FL_FLOAT64, x[k], 1, o->dtype, tmp, 1, len);
            }
        }
        sp_apply(fn, len, r, x[0], x[1]);
        fl_cvt_row(o->dtype, fl_elem(o, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_FLOAT64, r, 1, len);
    }
    return FL_OK;
}

/* ------------------------------------------------------------------ */
/* unary and binary functions of the header                            */
/* ------------------------------------------------------------------ */

/* self = args[0]; half: 0 where PyTorch has no float16/bfloat16 kernel */
#define DEF_UNARY(kname, f, half)                                                       \
    static int kname(FL_KERNEL_ARGS) {                                                  \
        FL_UNUSED_KERNEL_ARGS;                                                          \
        sp_fn_t fn = {.nop = 1, .f1 = f, .no_half = !(half)};                           \
        return sp_run(in, n_in, out, n_out, args, n_args, (int[]){0}, &fn);             \
    }
DEF_UNARY(k_digamma, fl_sp_digamma, 1)
DEF_UNARY(k_lgamma, lgamma, 1)
DEF_UNARY(k_erfinv, fl_sp_erfinv, 1)
DEF_UNARY(k_i0, fl_sp_i0, 1)
DEF_UNARY(k_i0e, fl_sp_i0e, 1)
DEF_UNARY(k_i1, fl_sp_i1, 1)
DEF_UNARY(k_i1e, fl_sp_i1e, 1)
DEF_UNARY(k_ndtri, fl_sp_ndtri, 0)
DEF_UNARY(k_log_ndtr, fl_sp_log_ndtr, 0)
DEF_UNARY(k_erfcx, fl_sp_erfcx, 0)
DEF_UNARY(k_airy_ai, fl_sp_airy_ai, 0)
DEF_UNARY(k_bessel_j0, fl_sp_bessel_j0, 0)
DEF_UNARY(k_bessel_j1, fl_sp_bessel_j1, 0)
DEF_UNARY(k_bessel_y0, fl_sp_bessel_y0, 0)
DEF_UNARY(k_bessel_y1, fl_sp_bessel_y1, 0)
DEF_UNARY(k_mod_bessel_i0, fl_sp_modified_bessel_i0, 0)
DEF_UNARY(k_mod_bessel_i1, fl_sp_modified_bessel_i1, 0)
DEF_UNARY(k_mod_bessel_k0, fl_sp_modified_bessel_k0, 0)
DEF_UNARY(k_mod_bessel_k1, fl_sp_modified_bessel_k1, 0)
DEF_UNARY(k_scaled_bessel_k0, fl_sp_scaled_modified_bessel_k0, 0)
DEF_UNARY(k_scaled_bessel_k1, fl_sp_scaled_modified_bessel_k1, 0)
DEF_UNARY(k_sph_bessel_j0, fl_sp_spherical_bessel_j0, 0)
DEF_UNARY(k_angle, fl_sp_angle, 1)

/* (self, other), each a tensor or a scalar: args[0], args[1] */
#define DEF_BINARY(kname, f, half)                                                      \
    static int kname(FL_KERNEL_ARGS) {                                                  \
        FL_UNUSED_KERNEL_ARGS;                                                          \
        sp_fn_t fn = {.nop = 2, .f2 = f, .no_half = !(half)};                           \
        return sp_run(in, n_in, out, n_out, args, n_args, (int[]){0, 1}, &fn);          \
    }
DEF_BINARY(k_igamma, fl_sp_igamma, 1)
DEF_BINARY(k_igammac, fl_sp_igammac, 1)
DEF_BINARY(k_zeta, fl_sp_zeta, 0)
/* orthogonal polynomials (x, n): the float32 flavour rounds each recurrence
 * step to float, so overflow gives PyTorch's infinities and NaNs */
static int poly(FL_KERNEL_ARGS, double (*f64)(double, double), double (*f32)(double, double)) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out)) return UNSUP;
    sp_fn_t fn = {.nop = 2, .f2 = out[0].dtype == FL_FLOAT64 ? f64 : f32, .no_half = 1};
    return sp_run(in, n_in, out, n_out, args, n_args, (int[]){0, 1}, &fn);
}
#define DEF_POLY(kname, name)                                                              \
    static int kname(FL_KERNEL_ARGS) {                                                     \
        return poly(stream, device, in, n_in, out, n_out, args, n_args, fl_sp_##name, fl_sp_##name##f); \
    }
DEF_POLY(k_cheb_t, chebyshev_polynomial_t)
DEF_POLY(k_cheb_u, chebyshev_polynomial_u)
DEF_POLY(k_cheb_v, chebyshev_polynomial_v)
DEF_POLY(k_cheb_w, chebyshev_polynomial_w)
DEF_POLY(k_scheb_t, shifted_chebyshev_polynomial_t)
DEF_POLY(k_scheb_u, shifted_chebyshev_polynomial_u)
DEF_POLY(k_scheb_v, shifted_chebyshev_polynomial_v)
DEF_POLY(k_scheb_w, shifted_chebyshev_polynomial_w)
DEF_POLY(k_hermite_h, hermite_polynomial_h)
DEF_POLY(k_hermite_he, hermite_polynomial_he)
DEF_POLY(k_laguerre_l, laguerre_polynomial_l)
DEF_POLY(k_legendre_p, legendre_polynomial_p)

/* ------------------------------------------------------------------ */
/* ops with an int argument: polygamma, mvlgamma, round.decimals       */
/* ------------------------------------------------------------------ */

static double polygamma_fn(double x, int64_t n) { return fl_sp_polygamma(n, x); }
static double polygammaf_fn(double x, int64_t n) { return fl_sp_polygammaf(n, x); }

/* polygamma(int n, Tensor self) and polygamma_(Tensor self, int n) */
static int polygamma(FL_KERNEL_ARGS, int self_at, int n_at) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out) || n_args < 2 || args[n_at].kind != FL_ARG_INT) return UNSUP;
    if (args[n_at].i < 0) FL_FAIL(FL_ERR_INVALID, "polygamma(n, x) does not support negative n.");
    sp_fn_t fn = {.nop = 1, .fi = out[0].dtype == FL_FLOAT64 ? polygamma_fn : polygammaf_fn, .iarg = args[n_at].i};
    return sp_run(in, n_in, out, n_out, args, n_args, (int[]){self_at}, &fn);
}
static int k_polygamma(FL_KERNEL_ARGS) { return polygamma(stream, device, in, n_in, out, n_out, args, n_args, 1, 0); }
static int k_polygamma_(FL_KERNEL_ARGS) { return polygamma(stream, device, in, n_in, out, n_out, args, n_args, 0, 1); }

/* mvlgamma(self, int p) and mvlgamma_ */
static int k_mvlgamma(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 2 || args[0].kind != FL_ARG_TENSOR || args[0].i >= n_in || args[1].kind != FL_ARG_INT) return UNSUP;
    if (in[args[0].i].dtype == FL_BOOL) FL_FAIL(FL_ERR_INVALID, "The input tensor may not be a boolean tensor.");
    if (args[1].i < 1) FL_FAIL(FL_ERR_INVALID, "p has to be greater than or equal to 1");
    sp_fn_t fn = {.nop = 1, .fi = fl_sp_mvlgamma, .iarg = args[1].i};
    return sp_run(in, n_in, out, n_out, args, n_args, (int[]){0}, &fn);
}

/* round.decimals: PyTorch rounds float32, float16 and bfloat16 in float
 * (the value is exact in float: it was rounded to the output dtype) */
static double round_dec_f(double x, int64_t d) { return fl_sp_round_decimalsf((float)x, d); }
static int k_round_decimals(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    sp_fn_t fn = {.nop = 1, .fi = out[0].dtype == FL_FLOAT64 ? fl_sp_round_decimals : round_dec_f, .iarg = args[1].i};
    return sp_run(in, n_in, out, n_out, args, n_args, (int[]){0}, &fn);
}

/* ------------------------------------------------------------------ */
/* nextafter: one step in the output dtype's own representation        */
/* ------------------------------------------------------------------ */

static double nextafter_f32(double a, double b) { return nextafterf((float)a, (float)b); }

/* float16 / bfloat16: step the 16-bit pattern (PyTorch's c10::nextafter for
 * reduced floats, after musl): toward `to`, through the smallest subnormal
 * at zero, NaN if either is NaN */
static uint16_t nextafter_bits16(uint16_t from, uint16_t to, int from_nan, int to_nan) {
    const uint16_t sign = 0x8000u;
    if (from_nan || to_nan) return (uint16_t)(from_nan ? from : to);
    if (from == to) return from;
    uint16_t af = from & (uint16_t)~sign, at = to & (uint16_t)~sign;
    if (af == 0) return at == 0 ? to : (uint16_t)((to & sign) | 1u);
    if (af > at || ((from ^ to) & sign)) return (uint16_t)(from - 1);
    return (uint16_t)(from + 1);
}
static double nextafter_f16(double a, double b) {
    uint16_t r = nextafter_bits16(fl_f32_to_f16((float)a), fl_f32_to_f16((float)b), isnan(a), isnan(b));
    return fl_f16_to_f32(r);
}
static double nextafter_bf16(double a, double b) {
    uint16_t r = nextafter_bits16(fl_f32_to_bf16((float)a), fl_f32_to_bf16((float)b), isnan(a), isnan(b));
    return fl_bf16_to_f32(r);
}
static int k_nextafter(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out)) return UNSUP;
    int dt = out[0].dtype;
    sp_fn_t fn = {.nop = 2, .f2 = dt == FL_FLOAT64 ? nextafter : dt == FL_FLOAT32 ? nextafter_f32
                                : dt == FL_FLOAT16 ? nextafter_f16 : nextafter_bf16};
    return sp_run(in, n_in, out, n_out, args, n_args, (int[]){0, 1}, &fn);
}

/* ------------------------------------------------------------------ */
/* fmax / fmin: NaN-ignoring on floats, plain max/min on integers      */
/* ------------------------------------------------------------------ */

/* integer (and bool) outputs compute in int64, exact beyond 2^53 */
static int fminmax_int(const fl_tensor_t *in, int n_in, const fl_tensor_t *o, const fl_arg_t *args, int is_max) {
    sp_opnds_t ops = {.n = 0};
    for (int k = 0; k < 2; k++) {
        int st = opnd_add(&ops, in, n_in, &args[k], o, FL_INT64);
        if (st) return st;
    }
    const fl_tensor_t *ts[3] = {o, &ops.t[0], &ops.t[1]};
    fl_iter_t it;
    fl_iter_init(&it, 3, ts);
    int64_t numel = it.outer * it.inner;
    if (numel == 0) return FL_OK;
    int64_t nchunk = (it.inner + CH - 1) / CH, units = it.outer * nchunk;
#pragma omp parallel for schedule(static) if (numel >= 8 * PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        int64_t x[2][CH], r[CH];
        int64_t row = u / nchunk, c0 = (u % nchunk) * CH;
        int64_t len = it.inner - c0 < CH ? it.inner - c0 : CH;
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, row, base);
        for (int k = 0; k < 2; k++) {
            int64_t st = it.inner_stride[k + 1];
            fl_cvt_row(FL_INT64, x[k], 1, ops.t[k].dtype, fl_elem(&ops.t[k], base[k + 1] + c0 * st), st, len);
        }
        for (int64_t i = 0; i < len; i++) r[i] = (x[0][i] > x[1][i]) == is_max ? x[0][i] : x[1][i];
        fl_cvt_row(o->dtype, fl_elem(o, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_INT64, r, 1, len);
    }
    return FL_OK;
}
static int fminmax(FL_KERNEL_ARGS, int is_max) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out) || n_args < 2) return UNSUP;
    if (!fl_is_floating(out[0].dtype)) return fminmax_int(in, n_in, &out[0], args, is_max);
    sp_fn_t fn = {.nop = 2, .f2 = is_max ? fmax : fmin};
    return sp_run(in, n_in, out, n_out, args, n_args, (int[]){0, 1}, &fn);
}
static int k_fmax(FL_KERNEL_ARGS) { return fminmax(stream, device, in, n_in, out, n_out, args, n_args, 1); }
static int k_fmin(FL_KERNEL_ARGS) { return fminmax(stream, device, in, n_in, out, n_out, args, n_args, 0); }

/* ------------------------------------------------------------------ */
/* frexp.Tensor(self) -> (mantissa, exponent int32)                    */
/* ------------------------------------------------------------------ */
static int k_frexp(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_out < 2 || !fl_out_ok(out, n_out) || !fl_out_ok(out + 1, 1) || n_args < 1) return UNSUP;
    if (args[0].kind != FL_ARG_TENSOR || args[0].i < 0 || args[0].i >= n_in) return UNSUP;
    const fl_tensor_t *m = &out[0], *e = &out[1];
    if (!fl_is_floating(in[args[0].i].dtype))
        FL_FAIL(FL_ERR_INVALID, "torch.frexp() only supports floating-point dtypes");
    if (!fl_is_floating(m->dtype) || e->dtype != FL_INT32 || e->ndim != m->ndim) return UNSUP;
    for (int d = 0; d < m->ndim; d++)
        if (e->sizes[d] != m->sizes[d]) return UNSUP;
    fl_tensor_t x;
    if (fl_bcast(&in[args[0].i], m->ndim, m->sizes, &x)) return UNSUP;
    fl_iter_t it;
    fl_iter_init(&it, 3, (const fl_tensor_t *[]){m, e, &x});
    int64_t numel = it.outer * it.inner;
    if (numel == 0) return FL_OK;
    int64_t nchunk = (it.inner + CH - 1) / CH, units = it.outer * nchunk;
#pragma omp parallel for schedule(static) if (numel >= 8 * PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        double xv[CH], mv[CH];
        int32_t ev[CH];
        int64_t row = u / nchunk, c0 = (u % nchunk) * CH;
        int64_t len = it.inner - c0 < CH ? it.inner - c0 : CH;
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, row, base);
        fl_cvt_row(FL_FLOAT64, xv, 1, x.dtype, fl_elem(&x, base[2] + c0 * it.inner_stride[2]), it.inner_stride[2], len);
        for (int64_t i = 0; i < len; i++) {
            mv[i] = fl_sp_frexp_mantissa(xv[i]);
            ev[i] = fl_sp_frexp_exponent(xv[i]);
        }
        fl_cvt_row(m->dtype, fl_elem(m, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_FLOAT64, mv, 1, len);
        fl_cvt_row(FL_INT32, fl_elem(e, base[1] + c0 * it.inner_stride[1]), it.inner_stride[1], FL_INT32, ev, 1, len);
    }
    return FL_OK;
}

/* ------------------------------------------------------------------ */
/* table                                                               */
/* ------------------------------------------------------------------ */
/* Integer and bool inputs promote to float32 (the kernels see a float output)
 * except where PyTorch refuses them; torch.special's newer functions have
 * no float16/bfloat16 kernels in PyTorch and none here either. */
#define INTB (FL_INTS | FL_DTYPE_BIT(FL_BOOL))
#define ANY (FL_FLOATS | INTB)                  /* float16/bfloat16 too */
#define F3264 (FL_F32 | FL_F64 | INTB)           /* float32/float64 results only */
#define FLT FL_FLOATS
#define E(name, mask, fn) {name, mask, 0, fn}
/* the three overloads of a torch.special polynomial (x, n) */
#define POLY(name, fn)                                                                              \
    E("aten::special_" name, F3264, fn), E("aten::special_" name ".x_scalar", F3264, fn),          \
    E("aten::special_" name ".n_scalar", F3264, fn)

static const fl_kernel_entry_t entries[] = {
    /* gamma family */
    E("aten::digamma", ANY, k_digamma), E("aten::digamma_", FLT, k_digamma),
    E("aten::lgamma", ANY, k_lgamma), E("aten::lgamma_", FLT, k_lgamma),
    E("aten::polygamma", ANY, k_polygamma), E("aten::polygamma_", FLT, k_polygamma_),
    E("aten::mvlgamma", ANY, k_mvlgamma), E("aten::mvlgamma_", FLT, k_mvlgamma),
    E("aten::igamma", FLT, k_igamma), E("aten::igamma_", FLT, k_igamma),
    E("aten::igammac", FLT, k_igammac), E("aten::igammac_", FLT, k_igammac),
    E("aten::special_zeta", F3264, k_zeta), E("aten::special_zeta.self_scalar", F3264, k_zeta),
    E("aten::special_zeta.other_scalar", F3264, k_zeta),
    /* error function family */
    E("aten::erfinv", ANY, k_erfinv), E("aten::erfinv_", FLT, k_erfinv),
    E("aten::special_erfcx", F3264, k_erfcx),
    E("aten::special_ndtri", F3264, k_ndtri),
    E("aten::special_log_ndtr", F3264, k_log_ndtr),
    /* Bessel and Airy */
    E("aten::i0", ANY, k_i0), E("aten::i0_", FLT, k_i0),
    E("aten::special_i0e", ANY, k_i0e), E("aten::special_i1", ANY, k_i1), E("aten::special_i1e", ANY, k_i1e),
    E("aten::special_bessel_j0", F3264, k_bessel_j0), E("aten::special_bessel_j1", F3264, k_bessel_j1),
    E("aten::special_bessel_y0", F3264, k_bessel_y0), E("aten::special_bessel_y1", F3264, k_bessel_y1),
    E("aten::special_modified_bessel_i0", F3264, k_mod_bessel_i0),
    E("aten::special_modified_bessel_i1", F3264, k_mod_bessel_i1),
    E("aten::special_modified_bessel_k0", F3264, k_mod_bessel_k0),
    E("aten::special_modified_bessel_k1", F3264, k_mod_bessel_k1),
    E("aten::special_scaled_modified_bessel_k0", F3264, k_scaled_bessel_k0),
    E("aten::special_scaled_modified_bessel_k1", F3264, k_scaled_bessel_k1),
    E("aten::special_spherical_bessel_j0", F3264, k_sph_bessel_j0),
    E("aten::special_airy_ai", F3264, k_airy_ai),
    /* orthogonal polynomials */
    POLY("chebyshev_polynomial_t", k_cheb_t), POLY("chebyshev_polynomial_u", k_cheb_u),
    POLY("chebyshev_polynomial_v", k_cheb_v), POLY("chebyshev_polynomial_w", k_cheb_w),
    POLY("shifted_chebyshev_polynomial_t", k_scheb_t), POLY("shifted_chebyshev_polynomial_u", k_scheb_u),
    POLY("shifted_chebyshev_polynomial_v", k_scheb_v), POLY("shifted_chebyshev_polynomial_w", k_scheb_w),
    POLY("hermite_polynomial_h", k_hermite_h), POLY("hermite_polynomial_he", k_hermite_he),
    POLY("laguerre_polynomial_l", k_laguerre_l), POLY("legendre_polynomial_p", k_legendre_p),
    /* small elementwise ops */
    E("aten::angle", ANY, k_angle),
    E("aten::fmax", FL_ALL_DTYPES, k_fmax), E("aten::fmin", FL_ALL_DTYPES, k_fmin),
    E("aten::nextafter", FLT, k_nextafter), E("aten::nextafter_", FLT, k_nextafter),
    E("aten::frexp.Tensor", FLT, k_frexp),
    E("aten::round.decimals", FLT, k_round_decimals), E("aten::round_.decimals", FLT, k_round_decimals),
};

const fl_kernel_group_t fl_host_group_special = {entries, (int)(sizeof entries / sizeof entries[0])};
