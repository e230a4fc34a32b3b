/* The OpenCL plugin: elementwise kernels: arithmetic, activations, comparisons, bitwise,
 * predicates, rounding, division modes, random fills.
 * Shared declarations: ocl.h. */
#include "ocl.h"

/* ------------------------------------------------------------------ elementwise */

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
int ew_run(dev_t_ *D, fl_stream_t s, int T, const char *kn, const fl_tensor_t *o, int nop, opnd_t *ops,
                  double pa, double pb) {
    return ew_run_e(D, s, T, kn, o, nop, ops, pa, pb, NULL);
}

int out0(dev_t_ *D, const fl_tensor_t *out, int n_out, const fl_tensor_t **o) {
    if (!fl_out_ok(out, n_out)) return UNSUP;
    if (!dt_ok(D, out[0].dtype)) return UNSUP;
    *o = &out[0];
    return FL_OK;
}
int out0_store(dev_t_ *D, const fl_tensor_t *out, int n_out, const fl_tensor_t **o) { /* float16 too */
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
#define U1(fn, kn, fo) int fn(KARGS) { return ew_simple(PASS, kn, 1, fo, 0, 0); }
#define B2(fn, kn, fo) int fn(KARGS) { return ew_simple(PASS, kn, 2, fo, 0, 0); }
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
int k_add(KARGS) {
    if (!fl_out_ok(out, n_out)) return UNSUP;
    double al; if (alpha_of(&out[0], args, n_args, 2, &al)) return UNSUP;
    return ew_simple(PASS, "b_add", 2, 0, al, 0);
}
int k_sub(KARGS) {
    if (!fl_out_ok(out, n_out)) return UNSUP;
    double al; if (alpha_of(&out[0], args, n_args, 2, &al)) return UNSUP;
    return ew_simple(PASS, "b_sub", 2, 0, al, 0);
}
int k_pow_ts(KARGS) { /* pow.Tensor_Scalar(self, exponent) */
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
int k_gelu(KARGS) {
    int m = gelu_mode(args, n_args, 1);
    if (m < 0) return UNSUP;
    return ew_simple(PASS, m ? "u_gelut" : "u_gelu", 1, 1, 0, 0);
}
int k_gelu_bw(KARGS) { /* gelu_backward(grad_output, self, approximate) */
    int m = gelu_mode(args, n_args, 2);
    if (m < 0) return UNSUP;
    return ew_simple(PASS, m ? "b_gelut_bw" : "b_gelu_bw", 2, 1, 0, 0);
}
int k_threshold_bw(KARGS) { /* threshold_backward(grad_output, self, threshold) */
    if (n_args < 3 || !fl_arg_is_num(&args[2])) return UNSUP;
    return ew_simple(PASS, "b_threshold_bw", 2, 0, fl_arg_num(&args[2]), 0);
}
int k_threshold(KARGS) { /* threshold(self, threshold, value) */
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
int k_eq(KARGS) { return cmp_k(PASS, "c_eq"); }
int k_ne(KARGS) { return cmp_k(PASS, "c_ne"); }
int k_lt(KARGS) { return cmp_k(PASS, "c_lt"); }
int k_le(KARGS) { return cmp_k(PASS, "c_le"); }
int k_gt(KARGS) { return cmp_k(PASS, "c_gt"); }
int k_ge(KARGS) { return cmp_k(PASS, "c_ge"); }

int k_where(KARGS) { /* where.self(condition, self, other) */
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
int k_band(KARGS) { return ew_bits(PASS, "b_band", 2); }
int k_bor(KARGS) { return ew_bits(PASS, "b_bor", 2); }
int k_bxor(KARGS) { return ew_bits(PASS, "b_bxor", 2); }
int k_bnot(KARGS) { return ew_bits(PASS, "u_bnot", 1); }
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
int k_lnot(KARGS) { return pred_k(PASS, "p_lnot", 0); }
int k_signbit(KARGS) {
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
int k_div_mode(KARGS) { /* div.Tensor_mode / div.Scalar_mode(self, other, *, rounding_mode) */
    if (n_args < 3) return UNSUP;
    if (args[2].kind == FL_ARG_NONE) return ew_simple(PASS, "b_div", 2, 1, 0, 0);
    if (args[2].kind != FL_ARG_OTHER) return UNSUP;
    if (args[2].i == FL_STR_trunc) return divlike(PASS, "d_divtrunc", "div");
    if (args[2].i == FL_STR_floor) return divlike(PASS, "d_divfloor", "div");
    return UNSUP;
}
int k_fmod(KARGS) { return divlike(PASS, "d_fmod", "fmod"); }
int k_remainder(KARGS) { return divlike(PASS, "d_rem", "remainder"); }

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
int k_uniform(KARGS) { return rand_k(PASS, 0); }
int k_normal(KARGS) { return rand_k(PASS, 1); }
int k_bernoulli(KARGS) { return rand_k(PASS, 2); }
