/* Host kernels: unary pointwise ops -- neg, abs, exp/log families, sqrt, rsqrt,
 * reciprocal, trigonometric, tanh, sigmoid, erf, sign, rounding, activations
 * (relu, silu, gelu, hardtanh, leaky_relu, elu, threshold), clamp and
 * nan_to_num. The engine they run through: k_elementwise.h. */
#pragma GCC optimize("no-math-errno") /* as in every file of the family (k_elementwise.h) */
#include "k_elementwise.h"

/* ---- unary ---- */
OP1(neg, -a, -a, (int64_t)(0ull - (uint64_t)a))
OP1(abs, fabsf(a), fabs(a), a < 0 ? (int64_t)(0ull - (uint64_t)a) : a)
OP1F(exp, fl_vexpf(a), exp(a))
OP1F(exp2, exp2f(a), exp2(a))
OP1F(log, logf(a), log(a))
OP1F(log2, log2f(a), log2(a))
OP1F(log10, log10f(a), log10(a))
OP1F(log1p, log1pf(a), log1p(a))
OP1F(expm1, expm1f(a), expm1(a))
OP1F(sqrt, sqrtf(a), sqrt(a))
OP1F(rsqrt, 1.0f / sqrtf(a), 1.0 / sqrt(a))
OP1F(sin, sinf(a), sin(a))
OP1F(cos, cosf(a), cos(a))
OP1F(tan, tanf(a), tan(a))
OP1F(tanh, vtanhf(a), tanh(a))
OP1F(sigmoid, sigm_f(a), sigm_d(a))
OP1F(erf, FL_ERFF(a), erf(a))
OP1(sign, (float)SGN(a), (double)SGN(a), SGN(a))
OP1(floor, floorf(a), floor(a), a)
OP1(ceil, ceilf(a), ceil(a), a)
OP1(round, nearbyintf(a), nearbyint(a), a)
OP1(trunc, truncf(a), trunc(a), a)
OP1(relu, a < 0 ? 0.0f : a, a < 0 ? 0.0 : a, a < 0 ? 0 : a)
OP1F(silu, a * sigm_f(a), a * sigm_d(a))
OP1F(gelu, gelu_sf(a), gelu_sd(a))
OP1F(gelut, gelut_sf(a), gelut_sd(a))
OP1(clamp, CLAMP(a, s0, s1), CLAMP(a, s0, s1), CLAMP(a, s0, s1))
OP1(clampmin, CLAMP_LO(a, s0), CLAMP_LO(a, s0), a < s0 ? s0 : a)
OP1(clampmax, CLAMP_HI(a, s0), CLAMP_HI(a, s0), a > s0 ? s0 : a)
OP1F(leaky, a > 0 ? a : a * s0, a > 0 ? a : a * s0)
OP1F(elu, a > 0 ? a * s1 : s0 * s1 * expm1f(a * s2), a > 0 ? a * s1 : s0 * s1 * expm1(a * s2)) /* elu(-0.0) = -0.0 */
OP1(threshold, a <= s0 ? s1 : a, a <= s0 ? s1 : a, a <= s0 ? s1 : a)
OP1F(nan2num, a != a ? s0 : (a == INFINITY ? s1 : (a == -INFINITY ? s2 : a)),
     a != a ? s0 : (a == INFINITY ? s1 : (a == -INFINITY ? s2 : a)))

/* clamp.Tensor's bounds */
OP3(clampt, CLAMP(a, b, c), CLAMP(a, b, c), CLAMP(a, b, c))
OP3(clampt_max, (a != a) ? a : ((c != c) ? c : (a > c ? c : a)), (a != a) ? a : ((c != c) ? c : (a > c ? c : a)), a > c ? c : a)
OP3(clampt_min, (a != a) ? a : ((b != b) ? b : (a < b ? b : a)), (a != a) ? a : ((b != b) ? b : (a < b ? b : a)), a < b ? b : a)

DEF_UNARY(k_neg_real, neg_t)
DEF_UNARY(k_abs, abs_t)
DEF_UNARY(k_exp, exp_t)
DEF_UNARY(k_exp2, exp2_t)
DEF_UNARY(k_log, log_t)
DEF_UNARY(k_log2, log2_t)
DEF_UNARY(k_log10, log10_t)
DEF_UNARY(k_log1p, log1p_t)
DEF_UNARY(k_expm1, expm1_t)
DEF_UNARY(k_sqrt, sqrt_t)
DEF_UNARY(k_rsqrt, rsqrt_t)
DEF_UNARY(k_recip, recip_t)
DEF_UNARY(k_sin, sin_t)
DEF_UNARY(k_cos, cos_t)
DEF_UNARY(k_tan, tan_t)
DEF_UNARY(k_tanh, tanh_t)
DEF_UNARY(k_sigmoid, sigmoid_t)
DEF_UNARY(k_erf, erf_t)
DEF_UNARY(k_sign, sign_t)
DEF_UNARY(k_floor, floor_t)
DEF_UNARY(k_ceil, ceil_t)
DEF_UNARY(k_round, round_t)
DEF_UNARY(k_trunc, trunc_t)
DEF_UNARY(k_relu, relu_t)
DEF_UNARY(k_silu, silu_t)

static int k_gelu(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int m = n_args >= 2 ? approx_mode(&args[1]) : 0;
    if (m < 0) return UNSUP;
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, m ? gelut_t : gelu_t, &p, -1);
}

/* unary with scalar params at args[pi[k]] */
static int unary_params(FL_KERNEL_ARGS, const ewfn *tab, int np, const int *pi, const double *defaults) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    for (int k = 0; k < np; k++) {
        if (pi[k] < n_args && fl_arg_is_num(&args[pi[k]])) {
            int st = fl_ew_set_param(&p, k, &args[pi[k]], ct);
            if (st) return st;
        } else if (defaults) {
            p.d[k] = defaults[k]; p.i[k] = (int64_t)defaults[k];
        } else {
            return UNSUP;
        }
    }
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, tab, &p, ct);
}
static int k_hardtanh(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clamp_t, 2, (int[]){1, 2}, (double[]){-1, 1});
}
static int k_leaky(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, leaky_t, 1, (int[]){1}, (double[]){0.01});
}
static int k_elu(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, elu_t, 3, (int[]){1, 2, 3}, (double[]){1, 1, 1});
}
static int k_threshold(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, threshold_t, 2, (int[]){1, 2}, NULL);
}
static int k_clamp_min(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clampmin_t, 1, (int[]){1}, NULL);
}
static int k_clamp_max(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clampmax_t, 1, (int[]){1}, NULL);
}
static int k_clamp(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 3) return UNSUP;
    int hmin = args[1].kind != FL_ARG_NONE, hmax = args[2].kind != FL_ARG_NONE;
    if (hmin && hmax) return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clamp_t, 2, (int[]){1, 2}, NULL);
    if (hmin) return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clampmin_t, 1, (int[]){1}, NULL);
    if (hmax) return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clampmax_t, 1, (int[]){2}, NULL);
    return UNSUP; /* PyTorch raises */
}
/* clamp.Tensor: min / max are tensors (or scalars) or None */
static int k_clamp_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 3) return UNSUP;
    int hmin = args[1].kind != FL_ARG_NONE, hmax = args[2].kind != FL_ARG_NONE;
    kp_t p = {{0}};
    if (hmin && hmax) return fl_ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 2}, clampt_t, &p, -1);
    if (hmin) return fl_ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 1}, clampt_min_t, &p, -1);
    if (hmax) return fl_ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 2, 2}, clampt_max_t, &p, -1);
    return UNSUP;
}
static int k_clamp_min_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 1}, clampt_min_t, &p, -1);
}
static int k_clamp_max_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 1}, clampt_max_t, &p, -1);
}

static int k_nan_to_num(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 4) return UNSUP;
    int dt = out[0].dtype;
    if (!fl_is_floating(dt)) { /* integers have no NaN or infinity */
        opnds_t o;
        o.n = 0;
        int st = fl_ew_opnd_add(&o, in, n_in, &args[0], &out[0], CT_I);
        if (st) return st;
        fl_ew_copy_strided(&out[0], &o.t[0]);
        return FL_OK;
    }
    double big = dt == FL_FLOAT32 ? 3.4028234663852886e38 : dt == FL_FLOAT64 ? 1.7976931348623157e308
                 : dt == FL_FLOAT16 ? 65504.0 : 3.3895313892515355e38;
    kp_t p = {{0}};
    p.d[0] = args[1].kind == FL_ARG_NONE ? 0.0 : fl_arg_num(&args[1]);
    p.d[1] = args[2].kind == FL_ARG_NONE ? big : fl_arg_num(&args[2]);
    p.d[2] = args[3].kind == FL_ARG_NONE ? -big : fl_arg_num(&args[3]);
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, nan2num_t, &p, -1);
}

static int k_neg(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_NEG);
    return k_neg_real(stream, device, in, n_in, out, n_out, args, n_args);
}
static int k_conj_physical(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_CONJ);
    return UNSUP; /* real: PyTorch's conj_physical is a copy, its decomposition serves it */
}

/* ------------------------------------------------------------------ */
/* table                                                               */
/* ------------------------------------------------------------------ */
static const fl_kernel_entry_t entries[] = {
    /* unary */
    E("aten::neg", NUM | CPX, k_neg), E("aten::neg_", NUM | CPX, k_neg),
    E("aten::_conj_physical", CPX, k_conj_physical), E("aten::conj_physical_", CPX, k_conj_physical),
    E("aten::abs", NUM, k_abs), E("aten::abs_", NUM, k_abs),
    E("aten::exp", ALL, k_exp), E("aten::exp_", FLT, k_exp),
    E("aten::exp2", ALL, k_exp2), E("aten::exp2_", FLT, k_exp2),
    E("aten::log", ALL, k_log), E("aten::log_", FLT, k_log),
    E("aten::log2", ALL, k_log2), E("aten::log2_", FLT, k_log2),
    E("aten::log10", ALL, k_log10), E("aten::log10_", FLT, k_log10),
    E("aten::log1p", ALL, k_log1p), E("aten::log1p_", FLT, k_log1p),
    E("aten::expm1", ALL, k_expm1), E("aten::expm1_", FLT, k_expm1),
    E("aten::sqrt", ALL, k_sqrt), E("aten::sqrt_", FLT, k_sqrt),
    E("aten::rsqrt", ALL, k_rsqrt), E("aten::rsqrt_", FLT, k_rsqrt),
    E("aten::reciprocal", ALL, k_recip), E("aten::reciprocal_", FLT, k_recip),
    E("aten::sin", ALL, k_sin), E("aten::sin_", FLT, k_sin),
    E("aten::cos", ALL, k_cos), E("aten::cos_", FLT, k_cos),
    E("aten::tan", ALL, k_tan), E("aten::tan_", FLT, k_tan),
    E("aten::tanh", ALL, k_tanh), E("aten::tanh_", FLT, k_tanh),
    E("aten::sigmoid", ALL, k_sigmoid), E("aten::sigmoid_", FLT, k_sigmoid),
    E("aten::erf", ALL, k_erf), E("aten::erf_", FLT, k_erf),
    E("aten::sign", NUM, k_sign), E("aten::sign_", NUM, k_sign),
    E("aten::floor", NUM, k_floor), E("aten::floor_", NUM, k_floor),
    E("aten::ceil", NUM, k_ceil), E("aten::ceil_", NUM, k_ceil),
    E("aten::round", NUM, k_round), E("aten::round_", NUM, k_round),
    E("aten::trunc", NUM, k_trunc), E("aten::trunc_", NUM, k_trunc),
    E("aten::relu", NUM, k_relu), E("aten::relu_", NUM, k_relu),
    E("aten::silu", FLT, k_silu), E("aten::silu_", FLT, k_silu),
    E("aten::gelu", FLT, k_gelu), E("aten::gelu_", FLT, k_gelu),
    E("aten::hardtanh", NUM, k_hardtanh), E("aten::hardtanh_", NUM, k_hardtanh),
    E("aten::leaky_relu", FLT, k_leaky), E("aten::leaky_relu_", FLT, k_leaky),
    E("aten::elu", FLT, k_elu), E("aten::elu_", FLT, k_elu),
    E("aten::threshold", NUM, k_threshold), E("aten::threshold_", NUM, k_threshold),
    E("aten::clamp", NUM, k_clamp), E("aten::clamp_", NUM, k_clamp),
    E("aten::clamp.Tensor", NUM, k_clamp_t), E("aten::clamp_.Tensor", NUM, k_clamp_t),
    E("aten::clamp_min", NUM, k_clamp_min), E("aten::clamp_min_", NUM, k_clamp_min),
    E("aten::clamp_max", NUM, k_clamp_max), E("aten::clamp_max_", NUM, k_clamp_max),
    E("aten::clamp_min.Tensor", NUM, k_clamp_min_t), E("aten::clamp_min_.Tensor", NUM, k_clamp_min_t),
    E("aten::clamp_max.Tensor", NUM, k_clamp_max_t), E("aten::clamp_max_.Tensor", NUM, k_clamp_max_t),
    E("aten::nan_to_num", NUM, k_nan_to_num), E("aten::nan_to_num_", NUM, k_nan_to_num),
};

const fl_kernel_group_t fl_host_group_unary = {entries, (int)(sizeof entries / sizeof entries[0])};
