/* Host kernels: binary pointwise ops -- add, sub, rsub, mul, div, maximum/minimum,
 * pow, remainder, fmod, atan2, bitwise and/or/xor/not; comparisons (eq ... ge),
 * logical and/or/xor/not, isnan, isinf. Complex results go to k_complex.c.
 * The engine they run through: k_elementwise.h. */
#pragma GCC optimize("no-math-errno") /* as in every file of the family (k_elementwise.h) */
#include "k_elementwise.h"

/* ---- unary ops the binary and comparison kernels use ---- */
OP1(isnan, (float)(a != a), (double)(a != a), 0)
OP1(isinf, (float)(isinf(a) != 0), (double)(isinf(a) != 0), 0)
OP1(lnot, (float)(a == 0), (double)(a == 0), a == 0)
OP1(bnot, 0, 0, ~a)
OP1F(powsc, powf(a, s0), pow(a, s0))
OP1F(powsq, a * a, a * a)
OP1F(powsqrt, sqrtf(a), sqrt(a))
OP1(powi, 0, 0, ipow(a, s0))

/* ---- binary ---- */
OP2(add, a + s0 * b, a + s0 * b, (int64_t)((uint64_t)a + (uint64_t)s0 * (uint64_t)b))
OP2(add1, a + b, a + b, (int64_t)((uint64_t)a + (uint64_t)b))
OP2(sub, a - s0 * b, a - s0 * b, (int64_t)((uint64_t)a - (uint64_t)s0 * (uint64_t)b))
OP2(sub1, a - b, a - b, (int64_t)((uint64_t)a - (uint64_t)b))
OP2(rsub, b - s0 * a, b - s0 * a, (int64_t)((uint64_t)b - (uint64_t)s0 * (uint64_t)a))
OP2(mul, a * b, a * b, (int64_t)((uint64_t)a * (uint64_t)b))
OP2F(tdiv, a / b, a / b)
OP2(maximum, (a != a) ? a : ((b != b) ? b : (a > b ? a : b)), (a != a) ? a : ((b != b) ? b : (a > b ? a : b)), a > b ? a : b)
OP2(minimum, (a != a) ? a : ((b != b) ? b : (a < b ? a : b)), (a != a) ? a : ((b != b) ? b : (a < b ? a : b)), a < b ? a : b)
OP2(pow, powf(a, b), pow(a, b), ipow(a, b))
OP2(eq, (float)(a == b), (double)(a == b), a == b)
OP2(ne, (float)(a != b), (double)(a != b), a != b)
OP2(lt, (float)(a < b), (double)(a < b), a < b)
OP2(le, (float)(a <= b), (double)(a <= b), a <= b)
OP2(gt, (float)(a > b), (double)(a > b), a > b)
OP2(ge, (float)(a >= b), (double)(a >= b), a >= b)
OP2(land, (float)(a != 0 && b != 0), (double)(a != 0 && b != 0), a != 0 && b != 0)
OP2(lor, (float)(a != 0 || b != 0), (double)(a != 0 || b != 0), a != 0 || b != 0)
OP2(lxor, (float)((a != 0) != (b != 0)), (double)((a != 0) != (b != 0)), (a != 0) != (b != 0))
OP2(rem, remf_(a, b), rem_(a, b), irem(a, b))
OP2(fmod, fmodf(a, b), fmod(a, b), ifmod(a, b))
OP2F(atan2, atan2f(a, b), atan2(a, b))
OP2(band, 0, 0, a & b)
OP2(bor, 0, 0, a | b)
OP2(bxor, 0, 0, a ^ b)

DEF_UNARY(k_bnot, bnot_t)

/* unary whose result is bool but computed in the input's type */
static int unary_pred(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out) || n_args < 1 || args[0].kind != FL_ARG_TENSOR || args[0].i >= n_in) return UNSUP;
    kp_t p = {{0}};
    int ct = in[args[0].i].dtype == FL_FLOAT64 ? CT_D : (fl_is_floating(in[args[0].i].dtype) ? CT_F : CT_I);
    if (tab == lnot_t) ct = fl_is_floating(in[args[0].i].dtype) ? CT_D : CT_I;
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, tab, &p, ct);
}
static int k_isnan(FL_KERNEL_ARGS) { return unary_pred(stream, device, in, n_in, out, n_out, args, n_args, isnan_t); }
static int k_isinf(FL_KERNEL_ARGS) { return unary_pred(stream, device, in, n_in, out, n_out, args, n_args, isinf_t); }
static int k_lnot(FL_KERNEL_ARGS) { return unary_pred(stream, device, in, n_in, out, n_out, args, n_args, lnot_t); }

/* ---- binary arithmetic ---- */
static int binary_alpha(FL_KERNEL_ARGS, const ewfn *tab, const ewfn *tab1) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    p.d[0] = 1; p.i[0] = 1;
    if (n_args >= 3 && args[2].kind != FL_ARG_NONE) {
        int st = fl_ew_set_param(&p, 0, &args[2], ct);
        if (st) return st;
    }
    if (p.d[0] == 1.0 && p.i[0] == 1 && tab1) tab = tab1;
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, ct);
}
static int k_add(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_ADD);
    return binary_alpha(stream, device, in, n_in, out, n_out, args, n_args, add_t, add1_t);
}
static int k_sub(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_SUB);
    if (fl_out_ok(out, n_out) && out[0].dtype == FL_BOOL) return UNSUP;
    return binary_alpha(stream, device, in, n_in, out, n_out, args, n_args, sub_t, sub1_t);
}
static int k_rsub(FL_KERNEL_ARGS) {
    if (fl_out_ok(out, n_out) && out[0].dtype == FL_BOOL) return UNSUP;
    return binary_alpha(stream, device, in, n_in, out, n_out, args, n_args, rsub_t, NULL);
}

DEF_BINARY(k_mul_real, mul_t)
static int k_mul(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_MUL);
    return k_mul_real(stream, device, in, n_in, out, n_out, args, n_args);
}
DEF_BINARY(k_maximum, maximum_t)
DEF_BINARY(k_minimum, minimum_t)
DEF_BINARY(k_atan2, atan2_t)

static int k_div(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args >= 3 && args[2].kind != FL_ARG_NONE) return UNSUP; /* rounding_mode given (string) */
    COMPLEX_TO(FL_CX_DIV);
    CHECK_OUT;
    if (!fl_is_floating(out[0].dtype)) return UNSUP;
    if (n_args >= 3 && args[2].kind != FL_ARG_NONE) return UNSUP; /* rounding_mode given (string) */
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tdiv_t, &p, -1);
}

/* scans operand for an integer zero (division guard) */
static int has_int_zero(const fl_tensor_t *in, int n_in, const fl_arg_t *a) {
    if (fl_arg_is_num(a)) return a->kind != FL_ARG_FLOAT && a->i == 0;
    if (a->kind != FL_ARG_TENSOR || a->i < 0 || a->i >= n_in) return 0;
    const fl_tensor_t *t = &in[a->i];
    if (fl_is_floating(t->dtype)) return 0;
    fl_iter_t it;
    fl_iter_init(&it, 1, (const fl_tensor_t *[]){t});
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++)
            if (fl_load_f64(t->dtype, fl_elem(t, b[0] + i * it.inner_stride[0])) == 0.0) return 1;
    }
    return 0;
}
static int int_divlike(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2) return UNSUP;
    if (ct_of(out[0].dtype) == CT_I && has_int_zero(in, n_in, &args[1]))
        FL_FAIL(FL_ERR_INVALID, "ZeroDivisionError"); /* PyTorch's words */
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, -1);
}
static int k_remainder(FL_KERNEL_ARGS) { return int_divlike(stream, device, in, n_in, out, n_out, args, n_args, rem_t); }
static int k_fmod(FL_KERNEL_ARGS) { return int_divlike(stream, device, in, n_in, out, n_out, args, n_args, fmod_t); }

static int bitwise(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (fl_is_floating(out[0].dtype)) return UNSUP;
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, CT_I);
}
static int k_band(FL_KERNEL_ARGS) { return bitwise(stream, device, in, n_in, out, n_out, args, n_args, band_t); }
static int k_bor(FL_KERNEL_ARGS) { return bitwise(stream, device, in, n_in, out, n_out, args, n_args, bor_t); }
static int k_bxor(FL_KERNEL_ARGS) { return bitwise(stream, device, in, n_in, out, n_out, args, n_args, bxor_t); }
static int k_bnot_chk(FL_KERNEL_ARGS) {
    if (!fl_out_ok(out, n_out) || fl_is_floating(out[0].dtype)) return UNSUP;
    if (out[0].dtype == FL_BOOL) return k_lnot(stream, device, in, n_in, out, n_out, args, n_args);
    return k_bnot(stream, device, in, n_in, out, n_out, args, n_args);
}

/* pow */
static int k_pow_ts(FL_KERNEL_ARGS) { /* pow.Tensor_Scalar, pow_.Scalar */
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2 || !fl_arg_is_num(&args[1])) return UNSUP;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    if (ct == CT_I) {
        if (args[1].kind == FL_ARG_FLOAT) return UNSUP;
        if (args[1].i < 0) FL_FAIL(FL_ERR_INVALID, "Integers to negative integer powers are not allowed.");
        p.i[0] = args[1].i;
        return fl_ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, powi_t, &p, ct);
    }
    double e = fl_arg_num(&args[1]);
    p.d[0] = e;
    const ewfn *tab = powsc_t;
    if (e == 2.0) tab = powsq_t;
    else if (e == 0.5) tab = powsqrt_t;
    else if (e == 1.0) tab = NULL;
    else if (e == -1.0) tab = recip_t;
    if (!tab) { /* x ** 1: copy with conversion */
        opnds_t o;
        o.n = 0;
        int st = fl_ew_opnd_add(&o, in, n_in, &args[0], &out[0], ct);
        if (st) return st;
        fl_ew_copy_strided(&out[0], &o.t[0]);
        return FL_OK;
    }
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, tab, &p, ct);
}
static int k_pow_tt(FL_KERNEL_ARGS) { /* pow.Tensor_Tensor, pow_.Tensor, pow.Scalar */
    FL_UNUSED_KERNEL_ARGS;
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, pow_t, &p, -1);
}

/* ---- comparisons: computed in the promoted input type, result converted ---- */
static int cmp_kernel(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2 || args[0].kind != FL_ARG_TENSOR || args[0].i >= n_in) return UNSUP;
    int da = in[args[0].i].dtype;
    int ct, common;
    if (args[1].kind == FL_ARG_TENSOR) {
        if (args[1].i >= n_in) return UNSUP;
        int db = in[args[1].i].dtype;
        int fa = fl_is_floating(da), fb = fl_is_floating(db);
        if (da == db) common = da;
        else if (!fa && !fb) common = FL_INT64;
        else if (fa && fb) return UNSUP; /* category tie: depends on dimensions */
        else {
            common = fa ? da : db;
            if (common == FL_FLOAT16 || common == FL_BFLOAT16) return UNSUP;
        }
        ct = ct_of(common);
        kp_t p = {{0}};
        return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, ct);
    }
    if (!fl_arg_is_num(&args[1])) return UNSUP;
    /* tensor vs wrapped number */
    if (fl_is_floating(da)) common = da;
    else if (args[1].kind == FL_ARG_FLOAT) common = FL_FLOAT32;
    else if (da == FL_BOOL && args[1].kind == FL_ARG_INT) common = FL_INT64;
    else common = da;
    ct = ct_of(common);
    /* the scalar rounded to the common dtype, then to the compute dtype */
    int64_t tmp = 0;
    fl_arg_t sa;
    scalar_to(&args[1], common, &tmp);
    double v = fl_load_f64(common, &tmp);
    if (ct == CT_I) {
        int64_t iv = 0;
        fl_cvt_row(FL_INT64, &iv, 1, common, &tmp, 0, 1);
        sa = (fl_arg_t){.kind = FL_ARG_INT, .i = iv};
    } else {
        sa = (fl_arg_t){.kind = FL_ARG_FLOAT, .f = v};
    }
    opnds_t o;
    o.n = 0;
    int st = fl_ew_opnd_add(&o, in, n_in, &args[0], &out[0], ct);
    if (st) return st;
    st = fl_ew_opnd_add(&o, in, n_in, &sa, &out[0], ct);
    if (st) return st;
    kp_t p = {{0}};
    return fl_ew_run(&out[0], &o, ct, tab[ct], &p);
}
#define DEF_CMP(kname, tab) \
    static int kname(FL_KERNEL_ARGS) { return cmp_kernel(stream, device, in, n_in, out, n_out, args, n_args, tab); }
DEF_CMP(k_eq, eq_t)
DEF_CMP(k_ne, ne_t)
DEF_CMP(k_lt, lt_t)
DEF_CMP(k_le, le_t)
DEF_CMP(k_gt, gt_t)
DEF_CMP(k_ge, ge_t)

static int logical2(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    /* double holds every value's truthiness exactly */
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, CT_D);
}
static int k_land(FL_KERNEL_ARGS) { return logical2(stream, device, in, n_in, out, n_out, args, n_args, land_t); }
static int k_lor(FL_KERNEL_ARGS) { return logical2(stream, device, in, n_in, out, n_out, args, n_args, lor_t); }
static int k_lxor(FL_KERNEL_ARGS) { return logical2(stream, device, in, n_in, out, n_out, args, n_args, lxor_t); }

/* ------------------------------------------------------------------ */
/* table                                                               */
/* ------------------------------------------------------------------ */
static const fl_kernel_entry_t entries[] = {
    /* binary arithmetic (complex results: k_complex.c) */
    E("aten::add.Tensor", ALL | CPX, k_add), E("aten::add_.Tensor", ALL | CPX, k_add),
    E("aten::add.Scalar", ALL | CPX, k_add), E("aten::add_.Scalar", ALL | CPX, k_add),
    E("aten::sub.Tensor", NUM | CPX, k_sub), E("aten::sub_.Tensor", NUM | CPX, k_sub),
    E("aten::sub.Scalar", NUM | CPX, k_sub), E("aten::sub_.Scalar", NUM | CPX, k_sub),
    E("aten::rsub.Scalar", NUM, k_rsub), E("aten::rsub.Tensor", NUM, k_rsub),
    E("aten::mul.Tensor", ALL | CPX, k_mul), E("aten::mul_.Tensor", ALL | CPX, k_mul),
    E("aten::mul.Scalar", ALL | CPX, k_mul), E("aten::mul_.Scalar", ALL | CPX, k_mul),
    E("aten::div.Tensor", ALL | CPX, k_div), E("aten::div_.Tensor", ALL | CPX, k_div),
    E("aten::div.Scalar", ALL | CPX, k_div), E("aten::div_.Scalar", ALL | CPX, k_div),
    E("aten::maximum", ALL, k_maximum), E("aten::minimum", ALL, k_minimum),
    E("aten::pow.Tensor_Scalar", NUM, k_pow_ts), E("aten::pow_.Scalar", NUM, k_pow_ts),
    E("aten::pow.Tensor_Tensor", NUM, k_pow_tt), E("aten::pow_.Tensor", NUM, k_pow_tt),
    E("aten::remainder.Tensor", NUM, k_remainder), E("aten::remainder_.Tensor", NUM, k_remainder),
    E("aten::remainder.Scalar", NUM, k_remainder), E("aten::remainder_.Scalar", NUM, k_remainder),
    E("aten::fmod.Tensor", NUM, k_fmod), E("aten::fmod_.Tensor", NUM, k_fmod),
    E("aten::fmod.Scalar", NUM, k_fmod), E("aten::fmod_.Scalar", NUM, k_fmod),
    E("aten::atan2", ALL, k_atan2), E("aten::atan2_", ALL, k_atan2),
    E("aten::bitwise_and.Tensor", INTB, k_band), E("aten::bitwise_and_.Tensor", INTB, k_band),
    E("aten::bitwise_and.Scalar", INTB, k_band), E("aten::bitwise_and_.Scalar", INTB, k_band),
    E("aten::bitwise_or.Tensor", INTB, k_bor), E("aten::bitwise_or_.Tensor", INTB, k_bor),
    E("aten::bitwise_or.Scalar", INTB, k_bor), E("aten::bitwise_or_.Scalar", INTB, k_bor),
    E("aten::bitwise_xor.Tensor", INTB, k_bxor), E("aten::bitwise_xor_.Tensor", INTB, k_bxor),
    E("aten::bitwise_xor.Scalar", INTB, k_bxor), E("aten::bitwise_xor_.Scalar", INTB, k_bxor),
    E("aten::bitwise_not", INTB, k_bnot_chk), E("aten::bitwise_not_", INTB, k_bnot_chk),
    /* comparisons */
    E("aten::eq.Tensor", ALL, k_eq), E("aten::eq.Scalar", ALL, k_eq), E("aten::eq_.Tensor", ALL, k_eq), E("aten::eq_.Scalar", ALL, k_eq),
    E("aten::ne.Tensor", ALL, k_ne), E("aten::ne.Scalar", ALL, k_ne), E("aten::ne_.Tensor", ALL, k_ne), E("aten::ne_.Scalar", ALL, k_ne),
    E("aten::lt.Tensor", ALL, k_lt), E("aten::lt.Scalar", ALL, k_lt), E("aten::lt_.Tensor", ALL, k_lt), E("aten::lt_.Scalar", ALL, k_lt),
    E("aten::le.Tensor", ALL, k_le), E("aten::le.Scalar", ALL, k_le), E("aten::le_.Tensor", ALL, k_le), E("aten::le_.Scalar", ALL, k_le),
    E("aten::gt.Tensor", ALL, k_gt), E("aten::gt.Scalar", ALL, k_gt), E("aten::gt_.Tensor", ALL, k_gt), E("aten::gt_.Scalar", ALL, k_gt),
    E("aten::ge.Tensor", ALL, k_ge), E("aten::ge.Scalar", ALL, k_ge), E("aten::ge_.Tensor", ALL, k_ge), E("aten::ge_.Scalar", ALL, k_ge),
    E("aten::logical_and", ALL, k_land), E("aten::logical_and_", ALL, k_land),
    E("aten::logical_or", ALL, k_lor), E("aten::logical_or_", ALL, k_lor),
    E("aten::logical_xor", ALL, k_lxor), E("aten::logical_xor_", ALL, k_lxor),
    E("aten::logical_not", ALL, k_lnot), E("aten::logical_not_", ALL, k_lnot),
    E("aten::isnan", ALL, k_isnan), E("aten::isinf", ALL, k_isinf),
};

const fl_kernel_group_t fl_host_group_binary = {entries, (int)(sizeof entries / sizeof entries[0])};
