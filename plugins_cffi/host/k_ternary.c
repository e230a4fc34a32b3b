/* Host kernels: pointwise backward ops (threshold, gelu, sigmoid, tanh, silu,
 * hardtanh, leaky_relu, elu, dropout: a = grad, b = the saved tensor) and the
 * ternary ops where, addcmul, addcdiv, lerp, with masked_fill. The engine they
 * run through: k_elementwise.h. */
#pragma GCC optimize("no-math-errno") /* as in every file of the family (k_elementwise.h) */
#include "k_elementwise.h"

/* ---- pointwise backward ---- */
/* backward: a = grad, b = saved tensor */
OP2(thresh_bw, b <= s0 ? 0.0f : a, b <= s0 ? 0.0 : a, b <= s0 ? 0 : a)
OP2F(gelu_bw, gelu_bw_sf(a, b), gelu_bw_sd(a, b))
OP2F(gelut_bw, gelut_bw_sf(a, b), gelut_bw_sd(a, b))
OP2F(sigmoid_bw, a * (1.0f - b) * b, a * (1.0 - b) * b)
OP2F(tanh_bw, a * (1.0f - b * b), a * (1.0 - b * b))
OP2F(silu_bw, a * sigm_f(b) * (1.0f + b * (1.0f - sigm_f(b))), a * sigm_d(b) * (1.0 + b * (1.0 - sigm_d(b))))
OP2F(hardtanh_bw, (b <= s0 || b >= s1) ? 0.0f : a, (b <= s0 || b >= s1) ? 0.0 : a)
OP2F(leaky_bw, b > 0 ? a : a * s0, b > 0 ? a : a * s0)
/* elu_backward: s0 alpha, s1 scale, s2 input_scale, is_result in p->i[3] */
OP2F(elu_bw_res, b <= 0 ? a * s2 * (b + s0 * s1) : a * s1, b <= 0 ? a * s2 * (b + s0 * s1) : a * s1)
OP2F(elu_bw_in, b <= 0 ? a * s2 * s0 * s1 * expf(b * s2) : a * s1, b <= 0 ? a * s2 * s0 * s1 * exp(b * s2) : a * s1)
OP2F(dropout_bw, a * (b * s0), a * (b * s0))
OP2(masked_fill, b != 0 ? s0 : a, b != 0 ? s0 : a, b != 0 ? s0 : a)

/* ---- ternary ---- */
OP3(where, a != 0 ? b : c, a != 0 ? b : c, a != 0 ? b : c)
OP3(addcmul, a + s0 * b * c, a + s0 * b * c, (int64_t)((uint64_t)a + (uint64_t)s0 * (uint64_t)b * (uint64_t)c))
OP3F(addcdiv, a + s0 * b / c, a + s0 * b / c)
OP3F(lerp, fabsf(c) < 0.5f ? a + c * (b - a) : b - (b - a) * (1.0f - c), fabs(c) < 0.5 ? a + c * (b - a) : b - (b - a) * (1.0 - c))
OP2F(lerps, fabsf(s0) < 0.5f ? a + s0 * (b - a) : b - (b - a) * (1.0f - s0), fabs(s0) < 0.5 ? a + s0 * (b - a) : b - (b - a) * (1.0 - s0))

DEF_BINARY(k_sigmoid_bw, sigmoid_bw_t)
DEF_BINARY(k_tanh_bw, tanh_bw_t)
DEF_BINARY(k_silu_bw, silu_bw_t)

static int k_threshold_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    int ct = ct_of(out[0].dtype);
    if (n_args < 3 || fl_ew_set_param(&p, 0, &args[2], ct)) return UNSUP;
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, thresh_bw_t, &p, ct);
}
static int k_gelu_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int m = n_args >= 3 ? approx_mode(&args[2]) : 0;
    if (m < 0) return UNSUP;
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, m ? gelut_bw_t : gelu_bw_t, &p, -1);
}
static int k_hardtanh_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 4 || fl_ew_set_param(&p, 0, &args[2], CT_F) || fl_ew_set_param(&p, 1, &args[3], CT_F)) return UNSUP;
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, hardtanh_bw_t, &p, -1);
}
static int k_leaky_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 3 || fl_ew_set_param(&p, 0, &args[2], CT_F)) return UNSUP;
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, leaky_bw_t, &p, -1);
}
static int k_elu_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 6 || fl_ew_set_param(&p, 0, &args[1], CT_F) || fl_ew_set_param(&p, 1, &args[2], CT_F) ||
        fl_ew_set_param(&p, 2, &args[3], CT_F) || args[4].kind != FL_ARG_BOOL)
        return UNSUP;
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 5}, args[4].i ? elu_bw_res_t : elu_bw_in_t, &p, -1);
}
static int k_dropout_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 3 || fl_ew_set_param(&p, 0, &args[2], CT_F)) return UNSUP;
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, dropout_bw_t, &p, -1);
}

/* ---- ternary ---- */
static int k_where(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 2}, where_t, &p, -1);
}
static int addc(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    p.d[0] = 1; p.i[0] = 1;
    if (n_args >= 4 && args[3].kind != FL_ARG_NONE && fl_ew_set_param(&p, 0, &args[3], ct)) return UNSUP;
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 2}, tab, &p, ct);
}
static int k_addcmul(FL_KERNEL_ARGS) { return addc(stream, device, in, n_in, out, n_out, args, n_args, addcmul_t); }
static int k_addcdiv(FL_KERNEL_ARGS) {
    if (fl_out_ok(out, n_out) && !fl_is_floating(out[0].dtype)) return UNSUP;
    return addc(stream, device, in, n_in, out, n_out, args, n_args, addcdiv_t);
}
static int k_lerp_s(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 3 || fl_ew_set_param(&p, 0, &args[2], CT_F)) return UNSUP;
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, lerps_t, &p, -1);
}
static int k_lerp_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args >= 3 && fl_arg_is_num(&args[2])) return k_lerp_s(stream, device, in, n_in, out, n_out, args, n_args);
    kp_t p = {{0}};
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 2}, lerp_t, &p, -1);
}
static int k_masked_fill(FL_KERNEL_ARGS) { /* .Scalar and .Tensor (0-dim value) */
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 3) return UNSUP;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    /* the value rounded to the output dtype first */
    int64_t tmp = 0;
    if (args[2].kind == FL_ARG_TENSOR) {
        if (args[2].i < 0 || args[2].i >= n_in) return UNSUP;
        const fl_tensor_t *v = &in[args[2].i];
        if (v->ndim != 0) return UNSUP;
        fl_cvt_row(out[0].dtype, &tmp, 1, v->dtype, fl_elem(v, v->offset), 0, 1);
    } else if (fl_arg_is_num(&args[2])) {
        scalar_to(&args[2], out[0].dtype, &tmp);
    } else {
        return UNSUP;
    }
    p.d[0] = fl_load_f64(out[0].dtype, &tmp);
    fl_cvt_row(FL_INT64, &p.i[0], 1, out[0].dtype, &tmp, 0, 1);
    return fl_ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, masked_fill_t, &p, ct);
}

/* ------------------------------------------------------------------ */
/* table                                                               */
/* ------------------------------------------------------------------ */
static const fl_kernel_entry_t entries[] = {
    /* pointwise backward */
    E("aten::threshold_backward", NUM, k_threshold_bw),
    E("aten::gelu_backward", FLT, k_gelu_bw),
    E("aten::sigmoid_backward", FLT, k_sigmoid_bw),
    E("aten::tanh_backward", FLT, k_tanh_bw),
    E("aten::silu_backward", FLT, k_silu_bw),
    E("aten::hardtanh_backward", FLT, k_hardtanh_bw),
    E("aten::leaky_relu_backward", FLT, k_leaky_bw),
    E("aten::elu_backward", FLT, k_elu_bw),
    E("aten::native_dropout_backward", FLT, k_dropout_bw),
    /* ternary */
    E("aten::where.self", ALL, k_where),
    E("aten::addcmul", NUM, k_addcmul), E("aten::addcmul_", NUM, k_addcmul),
    E("aten::addcdiv", FLT, k_addcdiv), E("aten::addcdiv_", FLT, k_addcdiv),
    E("aten::lerp.Scalar", FLT, k_lerp_s), E("aten::lerp_.Scalar", FLT, k_lerp_s),
    E("aten::lerp.Tensor", FLT, k_lerp_t), E("aten::lerp_.Tensor", FLT, k_lerp_t),
    E("aten::masked_fill.Scalar", ALL, k_masked_fill), E("aten::masked_fill_.Scalar", ALL, k_masked_fill),
    E("aten::masked_fill.Tensor", ALL, k_masked_fill), E("aten::masked_fill_.Tensor", ALL, k_masked_fill),
};

const fl_kernel_group_t fl_host_group_ternary = {entries, (int)(sizeof entries / sizeof entries[0])};
