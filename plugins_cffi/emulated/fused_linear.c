/* GEMM epilogue kernels: a linear layer and what follows it, in one kernel each
 * way (forward, backward), as vendor stacks ship them (hipBLASLt bias +
 * activation epilogues, MIOpen/Apex-style bias + dropout + residual-add +
 * LayerNorm).
 *
 * Schemas (registered by torch_fl/fused/epilogues.py; `act`: 0 none, 1 relu, 2 gelu (erf)):
 *   fl::linear_act(Tensor input, Tensor weight, Tensor? bias, int act, float p, int seed, bool save)
 *       -> (Tensor out, Tensor pre)
 *       out = dropout_p(act(input @ weight^T + bias)); pre (the activation's input) is written only
 *       when `save` (gelu in training), else it is an empty tensor.
 *   fl::linear_act_backward(Tensor grad, Tensor input, Tensor weight, Tensor out, Tensor pre, int act,
 *       float p, int seed, bool has_bias) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)
 *       the three gradients from one pass: dpre = grad * mask/(1-p) * act'(.), then two GEMMs
 *       (dpre @ W, dpre^T @ input) and dpre's column sums (grad_bias; empty when there is no bias).
 *   fl::add_layer_norm(Tensor input, Tensor residual, Tensor? weight, Tensor? bias, float eps, float p,
 *       int seed, bool save) -> (Tensor out, Tensor sum, Tensor mean, Tensor rstd)
 *       sum = residual + dropout_p(input); out = layer_norm(sum) over the last dim.
 *   fl::linear_add_layer_norm(Tensor input, Tensor weight, Tensor? bias, Tensor residual,
 *       Tensor? ln_weight, Tensor? ln_bias, float eps, float p, int seed, bool save)
 *       -> (Tensor out, Tensor sum, Tensor mean, Tensor rstd)
 *       the same with input @ weight^T + bias as the dropout's input: the GEMM writes `out`, and one
 *       pass per row adds bias and residual, normalises and writes it back (sum only when `save`).
 *   fl::add_layer_norm_backward(Tensor grad, Tensor sum, Tensor mean, Tensor rstd, Tensor? weight,
 *       bool has_bias, float p, int seed)
 *       -> (Tensor grad_input, Tensor grad_residual, Tensor grad_weight, Tensor grad_bias)
 *   fl::linear_add_layer_norm_backward(Tensor grad, Tensor input, Tensor weight, Tensor sum, Tensor mean,
 *       Tensor rstd, Tensor? ln_weight, bool has_bias, bool has_ln_bias, float p, int seed) -> (Tensor grad_input,
 *       Tensor grad_weight, Tensor grad_bias, Tensor grad_residual, Tensor grad_ln_weight, Tensor grad_ln_bias)
 *
 * The backward ops compute every gradient in one kernel (grad_weight / grad_bias
 * are empty tensors where the forward had no such parameter).
 *
 * Dropout: element (row m, column n) of the (rows, N) output is kept iff
 * fl_rand_uniform(seed, m * N + n) >= p (counter-based, fl_host.h), kept
 * values scaled by 1/(1-p); the backward regenerates the mask from the seed,
 * so no mask is stored. torch_fl/fused/epilogues.py computes the same mask with torch
 * ops for the reference path.
 *
 * Layouts: input, residual and grad are read as (rows, last dim) matrices
 * whose rows are unit-stride and evenly spaced; weight as (N, K) or its
 * transpose; outputs must be contiguous. float32 and float64 (BLAS), the rest
 * (and any other layout) is declined (FL_ERR_UNSUPPORTED): the runtime then
 * runs the op's reference decomposition. */
#ifndef FL_LIN_TEMPLATE

#include <stdlib.h>

#include "emu.h"
#include "k_linalg.h"

typedef struct {
    const char *base; /* element (0, 0) */
    int64_t rows, cols, ld;
    int64_t cs; /* column stride: 1 for BLAS operands; any (0 for a broadcast gradient) for rows read elementwise */
} lin_mat_t;

/* t as a (rows, last dim) matrix with evenly spaced rows (any spacing, 0 included, when `any`) and
 * unit-stride rows (any column stride when `any`); 0 if it is not one. */
static int lin_rows_as(const fl_tensor_t *t, lin_mat_t *m, int any) {
    if (!t || t->ndim < 1) return 0;
    int nd = t->ndim;
    m->cols = t->sizes[nd - 1];
    m->rows = 1;
    for (int d = 0; d < nd - 1; d++) m->rows *= t->sizes[d];
    m->cs = m->cols > 1 ? t->strides[nd - 1] : 1;
    if (!any && m->cs != 1) return 0;
    int64_t ld = -1, expect = -1;
    for (int d = nd - 2; d >= 0; d--) {
        if (t->sizes[d] == 1) continue;
        if (ld < 0) { ld = t->strides[d]; expect = ld * t->sizes[d]; continue; }
        if (t->strides[d] != expect) return 0;
        expect *= t->sizes[d];
    }
    m->ld = ld < 0 ? (m->cols > 0 ? m->cols : 1) : ld;
    if (!any && m->rows > 1 && m->ld < m->cols) return 0;
    m->base = fl_elem(t, t->offset);
    return 1;
}
static int lin_rows(const fl_tensor_t *t, lin_mat_t *m) { return lin_rows_as(t, m, 0); }
static int lin_strided(const fl_tensor_t *t, lin_mat_t *m) { return lin_rows_as(t, m, 1); }

static int lin_contig(const fl_tensor_t *t, int dtype, int64_t numel) {
    return t && t->dtype == dtype && fl_is_contiguous(t) && fl_numel(t) == numel;
}

/* weight (N, K): row-major (tb = 1 in x @ W^T) or its transpose stored row-major (tb = 0). */
static int lin_weight(const fl_tensor_t *w, int64_t *N, int64_t *K, int *tb, int64_t *ld) {
    if (!w || w->ndim != 2) return 0;
    *N = w->sizes[0];
    *K = w->sizes[1];
    if (w->strides[1] == 1 || *K <= 1) { *tb = 1; *ld = *K <= 1 && w->strides[1] != 1 ? 1 : w->strides[0]; }
    else if (w->strides[0] == 1 || *N <= 1) { *tb = 0; *ld = w->strides[1]; }
    else return 0;
    if (*ld < 1) *ld = 1;
    return 1;
}

static double lin_float(const fl_arg_t *a) { return a->kind == FL_ARG_FLOAT ? a->f : (double)a->i; }

/* 1 when element `idx` survives dropout p under `seed` */
static inline int lin_keep(uint64_t seed, uint64_t idx, double p) {
    return p <= 0.0 || fl_rand_uniform(seed, idx) >= p;
}

#define FL_LIN_TEMPLATE 1
#define T float
#define SFX f32
#define T_DT FL_FLOAT32
#include "fused_linear.c"
#undef T
#undef SFX
#undef T_DT

#define T double
#define SFX f64
#define T_DT FL_FLOAT64
#include "fused_linear.c"
#undef T
#undef SFX
#undef T_DT
#undef FL_LIN_TEMPLATE

#define LIN_DISPATCH(dt, fn, ...) ((dt) == FL_FLOAT64 ? fn##_f64(__VA_ARGS__) : fn##_f32(__VA_ARGS__))

/* common checks of the forward ops; fills x (rows, K), the weight and the output matrix */
static int lin_setup(const fl_tensor_t *x, const fl_tensor_t *w, const fl_tensor_t *b, lin_mat_t *xm, int64_t *N,
                     int *tb, int64_t *ldw) {
    int64_t K;
    if (!x || !w || (x->dtype != FL_FLOAT32 && x->dtype != FL_FLOAT64) || w->dtype != x->dtype) return 0;
    if (!lin_rows(x, xm) || !lin_weight(w, N, &K, tb, ldw) || K != xm->cols) return 0;
    if (b && (b->dtype != x->dtype || b->ndim != 1 || b->sizes[0] != *N)) return 0;
    return 1;
}

static int linear_act(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 7 || n_out < 2) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *w = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *b = fl_arg_tensor(args, n_args, 2, in, n_in);
    lin_mat_t xm;
    int64_t N, ldw;
    int tb;
    if (!lin_setup(x, w, b, &xm, &N, &tb, &ldw) || args[3].kind != FL_ARG_INT) return FL_ERR_UNSUPPORTED;
    int act = (int)args[3].i, save = (args[6].kind == FL_ARG_BOOL || args[6].kind == FL_ARG_INT) && args[6].i;
    double p = lin_float(&args[4]);
    if (act < 0 || act > 2 || !(p >= 0.0 && p < 1.0)) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *o = fl_out_at(out, n_out, 0), *pre = fl_out_at(out, n_out, 1);
    if (!lin_contig(o, x->dtype, xm.rows * N)) return FL_ERR_UNSUPPORTED;
    if (save && !lin_contig(pre, x->dtype, xm.rows * N)) return FL_ERR_UNSUPPORTED;
    return LIN_DISPATCH(x->dtype, lin_act_fwd, &xm, w, ldw, tb, b, N, act, p, (uint64_t)args[5].i, o,
                        save ? pre : NULL);
}

static int linear_act_backward(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 9 || n_out < 3) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *x = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *w = fl_arg_tensor(args, n_args, 2, in, n_in), *o = fl_arg_tensor(args, n_args, 3, in, n_in);
    const fl_tensor_t *pre = fl_arg_tensor(args, n_args, 4, in, n_in);
    lin_mat_t xm, gm, om, pm;
    int64_t N, ldw;
    int tb;
    if (!lin_setup(x, w, NULL, &xm, &N, &tb, &ldw) || args[5].kind != FL_ARG_INT) return FL_ERR_UNSUPPORTED;
    int act = (int)args[5].i;
    double p = lin_float(&args[6]);
    if (act < 0 || act > 2 || !(p >= 0.0 && p < 1.0)) return FL_ERR_UNSUPPORTED;
    if (!g || g->dtype != x->dtype || !lin_strided(g, &gm) || gm.rows != xm.rows || gm.cols != N)
        return FL_ERR_UNSUPPORTED;
    if (act == 1 && (!o || o->dtype != x->dtype || !lin_strided(o, &om) || om.rows != xm.rows || om.cols != N))
        return FL_ERR_UNSUPPORTED;
    if (act == 2 && (!pre || pre->dtype != x->dtype || !lin_strided(pre, &pm) || pm.rows != xm.rows || pm.cols != N))
        return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *gi = fl_out_at(out, n_out, 0), *gw = fl_out_at(out, n_out, 1), *gb = fl_out_at(out, n_out, 2);
    if (!lin_contig(gi, x->dtype, xm.rows * xm.cols) || !lin_contig(gw, x->dtype, N * xm.cols)) return FL_ERR_UNSUPPORTED;
    if (gb && fl_numel(gb) == 0) gb = NULL;
    if (gb && !lin_contig(gb, x->dtype, N)) return FL_ERR_UNSUPPORTED;
    return LIN_DISPATCH(x->dtype, lin_act_bwd, &gm, &xm, w, ldw, tb, act == 1 ? &om : NULL, act == 2 ? &pm : NULL,
                        N, act, p, (uint64_t)args[7].i, gi, gw, gb);
}

/* the LayerNorm parameters and the (out, sum, mean, rstd) outputs of the two norm forwards */
static int norm_outputs(const fl_tensor_t *out, int n_out, int dt, int64_t M, int64_t N, int save,
                        const fl_tensor_t *lw, const fl_tensor_t *lb, const fl_tensor_t **o, const fl_tensor_t **sum,
                        const fl_tensor_t **mean, const fl_tensor_t **rstd) {
    if (n_out < 4) return 0;
    *o = fl_out_at(out, n_out, 0);
    *sum = save ? fl_out_at(out, n_out, 1) : NULL;
    *mean = fl_out_at(out, n_out, 2);
    *rstd = fl_out_at(out, n_out, 3);
    if (!lin_contig(*o, dt, M * N) || (save && !lin_contig(*sum, dt, M * N))) return 0;
    if (!lin_contig(*mean, dt, M) || !lin_contig(*rstd, dt, M)) return 0;
    for (int k = 0; k < 2; k++) {
        const fl_tensor_t *t = k ? lb : lw;
        if (t && (t->dtype != dt || t->ndim != 1 || t->sizes[0] != N)) return 0;
    }
    return 1;
}

static int add_layer_norm(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 8) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *r = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *lw = fl_arg_tensor(args, n_args, 2, in, n_in), *lb = fl_arg_tensor(args, n_args, 3, in, n_in);
    const fl_tensor_t *o, *sum, *mean, *rstd;
    lin_mat_t xm, rm;
    if (!x || !r || (x->dtype != FL_FLOAT32 && x->dtype != FL_FLOAT64) || r->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    if (!lin_strided(x, &xm) || !lin_strided(r, &rm) || rm.rows != xm.rows || rm.cols != xm.cols)
        return FL_ERR_UNSUPPORTED;
    int save = (args[7].kind == FL_ARG_BOOL || args[7].kind == FL_ARG_INT) && args[7].i;
    double eps = lin_float(&args[4]), p = lin_float(&args[5]);
    if (!(p >= 0.0 && p < 1.0)) return FL_ERR_UNSUPPORTED;
    if (!norm_outputs(out, n_out, x->dtype, xm.rows, xm.cols, save, lw, lb, &o, &sum, &mean, &rstd))
        return FL_ERR_UNSUPPORTED;
    return LIN_DISPATCH(x->dtype, lin_add_norm, &xm, NULL, &rm, lw, lb, eps, p, (uint64_t)args[6].i, o, sum, mean,
                        rstd);
}

static int linear_add_layer_norm(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 10) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *w = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *b = fl_arg_tensor(args, n_args, 2, in, n_in), *r = fl_arg_tensor(args, n_args, 3, in, n_in);
    const fl_tensor_t *lw = fl_arg_tensor(args, n_args, 4, in, n_in), *lb = fl_arg_tensor(args, n_args, 5, in, n_in);
    const fl_tensor_t *o, *sum, *mean, *rstd;
    lin_mat_t xm, rm;
    int64_t N, ldw;
    int tb;
    if (!lin_setup(x, w, b, &xm, &N, &tb, &ldw) || !r || r->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    if (!lin_strided(r, &rm) || rm.rows != xm.rows || rm.cols != N) return FL_ERR_UNSUPPORTED;
    int save = (args[9].kind == FL_ARG_BOOL || args[9].kind == FL_ARG_INT) && args[9].i;
    double eps = lin_float(&args[6]), p = lin_float(&args[7]);
    if (!(p >= 0.0 && p < 1.0)) return FL_ERR_UNSUPPORTED;
    if (!norm_outputs(out, n_out, x->dtype, xm.rows, N, save, lw, lb, &o, &sum, &mean, &rstd))
        return FL_ERR_UNSUPPORTED;
    /* the GEMM writes out; the row pass reads it back as the dropout's input */
    fl_lin_gemm(x->dtype, 0, tb, xm.rows, N, xm.cols, 1.0, xm.base, xm.ld, fl_elem(w, w->offset), ldw, 0.0,
                fl_elem(o, o->offset), N);
    lin_mat_t ym = {fl_elem(o, o->offset), xm.rows, N, N, 1};
    return LIN_DISPATCH(x->dtype, lin_add_norm, &ym, b, &rm, lw, lb, eps, p, (uint64_t)args[8].i, o, sum, mean, rstd);
}

/* grad, sum, mean, rstd and the norm weight of the two norm backwards */
static int norm_bwd_inputs(const fl_tensor_t *g, const fl_tensor_t *z, const fl_tensor_t *mean, const fl_tensor_t *rstd,
                           const fl_tensor_t *lw, lin_mat_t *gm, lin_mat_t *zm) {
    if (!g || !z || !mean || !rstd || (g->dtype != FL_FLOAT32 && g->dtype != FL_FLOAT64)) return 0;
    if (z->dtype != g->dtype || !lin_strided(g, gm) || !lin_strided(z, zm) || gm->rows != zm->rows ||
        gm->cols != zm->cols)
        return 0;
    if (!lin_contig(mean, g->dtype, gm->rows) || !lin_contig(rstd, g->dtype, gm->rows)) return 0;
    return !lw || (lw->dtype == g->dtype && lw->ndim == 1 && lw->sizes[0] == gm->cols);
}

static int add_layer_norm_backward(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 8 || n_out < 4) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *z = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *mean = fl_arg_tensor(args, n_args, 2, in, n_in), *rstd = fl_arg_tensor(args, n_args, 3, in, n_in);
    const fl_tensor_t *lw = fl_arg_tensor(args, n_args, 4, in, n_in);
    lin_mat_t gm, zm;
    if (!norm_bwd_inputs(g, z, mean, rstd, lw, &gm, &zm)) return FL_ERR_UNSUPPORTED;
    double p = lin_float(&args[6]);
    int64_t M = gm.rows, N = gm.cols;
    const fl_tensor_t *gx = fl_out_at(out, n_out, 0), *gr = fl_out_at(out, n_out, 1);
    const fl_tensor_t *gw = fl_out_at(out, n_out, 2), *gb = fl_out_at(out, n_out, 3);
    if (!lin_contig(gx, g->dtype, M * N) || !lin_contig(gr, g->dtype, M * N)) return FL_ERR_UNSUPPORTED;
    if (gw && fl_numel(gw) == 0) gw = NULL;
    if (gb && fl_numel(gb) == 0) gb = NULL;
    if ((gw && !lin_contig(gw, g->dtype, N)) || (gb && !lin_contig(gb, g->dtype, N))) return FL_ERR_UNSUPPORTED;
    return LIN_DISPATCH(g->dtype, lin_norm_bwd, &gm, &zm, mean, rstd, lw, p, (uint64_t)args[7].i,
                        fl_elem(gr, gr->offset), fl_elem(gx, gx->offset), gw, gb);
}

static int linear_add_layer_norm_backward(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 11 || n_out < 6) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *x = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *w = fl_arg_tensor(args, n_args, 2, in, n_in), *z = fl_arg_tensor(args, n_args, 3, in, n_in);
    const fl_tensor_t *mean = fl_arg_tensor(args, n_args, 4, in, n_in), *rstd = fl_arg_tensor(args, n_args, 5, in, n_in);
    const fl_tensor_t *lw = fl_arg_tensor(args, n_args, 6, in, n_in);
    lin_mat_t gm, zm, xm;
    int64_t N, ldw;
    int tb;
    if (!norm_bwd_inputs(g, z, mean, rstd, lw, &gm, &zm) || !lin_setup(x, w, NULL, &xm, &N, &tb, &ldw))
        return FL_ERR_UNSUPPORTED;
    if (x->dtype != g->dtype || xm.rows != gm.rows || N != gm.cols) return FL_ERR_UNSUPPORTED;
    double p = lin_float(&args[9]);
    int64_t M = gm.rows, K = xm.cols;
    const fl_tensor_t *gi = fl_out_at(out, n_out, 0), *gwt = fl_out_at(out, n_out, 1), *gbias = fl_out_at(out, n_out, 2);
    const fl_tensor_t *gr = fl_out_at(out, n_out, 3), *glw = fl_out_at(out, n_out, 4), *glb = fl_out_at(out, n_out, 5);
    int dt = g->dtype;
    if (!lin_contig(gi, dt, M * K) || !lin_contig(gwt, dt, N * K) || !lin_contig(gr, dt, M * N)) return FL_ERR_UNSUPPORTED;
    if (gbias && fl_numel(gbias) == 0) gbias = NULL;
    if (glw && fl_numel(glw) == 0) glw = NULL;
    if (glb && fl_numel(glb) == 0) glb = NULL;
    if ((gbias && !lin_contig(gbias, dt, N)) || (glw && !lin_contig(glw, dt, N)) || (glb && !lin_contig(glb, dt, N)))
        return FL_ERR_UNSUPPORTED;
    /* dy (the GEMM output's gradient) is grad_residual itself without dropout, else a scratch matrix */
    void *dy = fl_elem(gr, gr->offset);
    void *scratch = NULL;
    if (p > 0.0) {
        scratch = malloc((size_t)(M * N) * fl_itemsize(dt) + 1);
        if (!scratch) FL_FAIL(FL_ERR_OOM, "fl::linear_add_layer_norm_backward: out of host memory (%lld x %lld)",
                              (long long)M, (long long)N);
        dy = scratch;
    }
    int st = LIN_DISPATCH(dt, lin_norm_bwd, &gm, &zm, mean, rstd, lw, p, (uint64_t)args[10].i, fl_elem(gr, gr->offset),
                          dy, glw, glb);
    if (st == FL_OK) {
        /* grad_input = dy @ W; grad_weight = dy^T @ input; grad_bias = column sums of dy */
        fl_lin_gemm(dt, 0, tb ? 0 : 1, M, K, N, 1.0, dy, N, fl_elem(w, w->offset), ldw, 0.0, fl_elem(gi, gi->offset), K);
        fl_lin_gemm(dt, 1, 0, N, K, M, 1.0, dy, N, xm.base, xm.ld, 0.0, fl_elem(gwt, gwt->offset), K);
        if (gbias) LIN_DISPATCH(dt, lin_colsum, dy, M, N, fl_elem(gbias, gbias->offset));
    }
    free(scratch);
    return st;
}

static const fl_kernel_entry_t act_entries[] = {
    {"fl::linear_act", FL_F32 | FL_F64, FL_KERNEL_FUSED, linear_act},
    {"fl::linear_act_backward", FL_F32 | FL_F64, FL_KERNEL_FUSED, linear_act_backward},
};
const fl_kernel_group_t fl_emu_group_linear_act = {act_entries, (int)(sizeof act_entries / sizeof act_entries[0])};

static const fl_kernel_entry_t norm_entries[] = {
    {"fl::add_layer_norm", FL_F32 | FL_F64, FL_KERNEL_FUSED, add_layer_norm},
    {"fl::add_layer_norm_backward", FL_F32 | FL_F64, FL_KERNEL_FUSED, add_layer_norm_backward},
    {"fl::linear_add_layer_norm", FL_F32 | FL_F64, FL_KERNEL_FUSED, linear_add_layer_norm},
    {"fl::linear_add_layer_norm_backward", FL_F32 | FL_F64, FL_KERNEL_FUSED, linear_add_layer_norm_backward},
};
const fl_kernel_group_t fl_emu_group_add_layer_norm = {norm_entries,
                                                       (int)(sizeof norm_entries / sizeof norm_entries[0])};

#else /* FL_LIN_TEMPLATE: the kernels for one element type T */

#define TF__(a, b) a##_##b
#define TF_(a, b) TF__(a, b)
#define TF(name) TF_(name, SFX)

static inline T TF(lin_gelu)(T v) { return (T)0.5 * v * ((T)1 + (T)erf((double)v * M_SQRT1_2)); }
static inline T TF(lin_gelu_grad)(T v) {
    double cdf = 0.5 * (1.0 + erf((double)v * M_SQRT1_2)), pdf = exp(-0.5 * (double)v * v) * 0.3989422804014327;
    return (T)(cdf + (double)v * pdf);
}

/* GELU over n contiguous elements in place: a loop of its own, so that the compiler vectorizes it (erf through
 * libmvec, fl_host.h), in the AVX2 clone where the CPU has it */
FL_MV static void TF(lin_gelu_all)(T *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = TF(lin_gelu)(y[i]);
}

/* column sums of a contiguous (M, N) matrix */
static int TF(lin_colsum)(const void *src, int64_t M, int64_t N, void *dst) {
    const T *a = (const T *)src;
    T *d = (T *)dst;
#pragma omp parallel for schedule(static) if (M * N > 65536)
    for (int64_t n = 0; n < N; n++) {
        T s = 0;
        for (int64_t m = 0; m < M; m++) s += a[m * N + n];
        d[n] = s;
    }
    return FL_OK;
}

static int TF(lin_act_fwd)(const lin_mat_t *xm, const fl_tensor_t *w, int64_t ldw, int tb, const fl_tensor_t *b,
                           int64_t N, int act, double p, uint64_t seed, const fl_tensor_t *o, const fl_tensor_t *pre) {
    int64_t M = xm->rows;
    T *y = (T *)fl_elem(o, o->offset);
    fl_lin_gemm(T_DT, 0, tb, M, N, xm->cols, 1.0, xm->base, xm->ld, fl_elem(w, w->offset), ldw, 0.0, y, N);
    const T *bias = b ? (const T *)fl_elem(b, b->offset) : NULL;
    int64_t bs = b ? b->strides[0] : 0;
    T *pr = pre ? (T *)fl_elem(pre, pre->offset) : NULL;
    T scale = (T)(1.0 / (1.0 - p));
    const int late = act == 2 && p <= 0.0; /* GELU without dropout: after the bias, over the whole block */
#pragma omp parallel for schedule(static) if (M * N > 65536)
    for (int64_t m = 0; m < M; m++) {
        T *row = y + m * N;
        for (int64_t n = 0; n < N; n++) {
            T v = row[n] + (bias ? bias[n * bs] : (T)0);
            if (pr) pr[m * N + n] = v;
            if (act == 1) v = v > 0 ? v : (T)0;
            else if (act == 2 && !late) v = TF(lin_gelu)(v);
            if (p > 0.0) v = lin_keep(seed, (uint64_t)(m * N + n), p) ? v * scale : (T)0;
            row[n] = v;
        }
        if (late) TF(lin_gelu_all)(row, N);
    }
    return FL_OK;
}

static int TF(lin_act_bwd)(const lin_mat_t *gm, const lin_mat_t *xm, const fl_tensor_t *w, int64_t ldw, int tb,
                           const lin_mat_t *om, const lin_mat_t *pm, int64_t N, int act, double p, uint64_t seed,
                           const fl_tensor_t *gi, const fl_tensor_t *gw, const fl_tensor_t *gb) {
    int64_t M = xm->rows, K = xm->cols;
    T *dpre = malloc((size_t)(M * N) * sizeof(T) + 1);
    if (!dpre) FL_FAIL(FL_ERR_OOM, "fl::linear_act_backward: out of host memory (%lld x %lld)", (long long)M,
                       (long long)N);
    T scale = (T)(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static) if (M * N > 65536)
    for (int64_t m = 0; m < M; m++) {
        const T *g = (const T *)gm->base + m * gm->ld;
        const T *o = om ? (const T *)om->base + m * om->ld : NULL;
        const T *pr = pm ? (const T *)pm->base + m * pm->ld : NULL;
        int64_t gs = gm->cs, os = om ? om->cs : 0, ps = pm ? pm->cs : 0;
        T *d = dpre + m * N;
        for (int64_t n = 0; n < N; n++) {
            T v = g[n * gs];
            if (p > 0.0) v = lin_keep(seed, (uint64_t)(m * N + n), p) ? v * scale : (T)0;
            if (act == 1) v = o[n * os] > 0 ? v : (T)0; /* a kept output is > 0 iff its input was */
            else if (act == 2) v *= TF(lin_gelu_grad)(pr[n * ps]);
            d[n] = v;
        }
    }
    /* grad_input = dpre @ W (W row-major: no transpose; stored transposed: transpose) */
    fl_lin_gemm(T_DT, 0, tb ? 0 : 1, M, K, N, 1.0, dpre, N, fl_elem(w, w->offset), ldw, 0.0, fl_elem(gi, gi->offset), K);
    fl_lin_gemm(T_DT, 1, 0, N, K, M, 1.0, dpre, N, xm->base, xm->ld, 0.0, fl_elem(gw, gw->offset), K);
    if (gb) TF(lin_colsum)(dpre, M, N, fl_elem(gb, gb->offset));
    free(dpre);
    return FL_OK;
}

/* Per row: sum = residual + dropout(y + bias); mean, rstd; out = (sum - mean) * rstd * lw + lb.
 * y may be the output itself (the GEMM's result): each row is read before it is written. */
static int TF(lin_add_norm)(const lin_mat_t *ym, const fl_tensor_t *b, const lin_mat_t *rm, const fl_tensor_t *lw,
                            const fl_tensor_t *lb, double eps, double p, uint64_t seed, const fl_tensor_t *o,
                            const fl_tensor_t *sum, const fl_tensor_t *mean, const fl_tensor_t *rstd) {
    int64_t M = ym->rows, N = ym->cols;
    const T *bias = b ? (const T *)fl_elem(b, b->offset) : NULL, *gw = lw ? (const T *)fl_elem(lw, lw->offset) : NULL;
    const T *gb = lb ? (const T *)fl_elem(lb, lb->offset) : NULL;
    int64_t bs = b ? b->strides[0] : 0, ws = lw ? lw->strides[0] : 0, bbs = lb ? lb->strides[0] : 0;
    T *outp = (T *)fl_elem(o, o->offset), *sp = sum ? (T *)fl_elem(sum, sum->offset) : NULL;
    T *mp = (T *)fl_elem(mean, mean->offset), *rp = (T *)fl_elem(rstd, rstd->offset);
    T scale = (T)(1.0 / (1.0 - p));
    int failed = 0;
#pragma omp parallel if (M * N > 65536)
    {
        T *z = malloc((size_t)N * sizeof(T) + 1);
        if (!z) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            if (!z) continue;
            const T *y = (const T *)ym->base + m * ym->ld, *r = (const T *)rm->base + m * rm->ld;
            int64_t ys = ym->cs, rs = rm->cs;
            double s = 0.0;
            for (int64_t n = 0; n < N; n++) {
                T v = y[n * ys] + (bias ? bias[n * bs] : (T)0);
                if (p > 0.0) v = lin_keep(seed, (uint64_t)(m * N + n), p) ? v * scale : (T)0;
                z[n] = r[n * rs] + v;
                s += z[n];
            }
            double mu = N > 0 ? s / (double)N : 0.0, var = 0.0;
            for (int64_t n = 0; n < N; n++) { double d = (double)z[n] - mu; var += d * d; }
            var = N > 0 ? var / (double)N : 0.0;
            T is = (T)(1.0 / sqrt(var + eps)), mt = (T)mu;
            T *orow = outp + m * N;
            for (int64_t n = 0; n < N; n++) {
                T v = (z[n] - mt) * is;
                if (gw) v *= gw[n * ws];
                if (gb) v += gb[n * bbs];
                orow[n] = v;
            }
            if (sp) memcpy(sp + m * N, z, (size_t)N * sizeof(T));
            mp[m] = mt;
            rp[m] = is;
        }
        free(z);
    }
    if (failed) FL_FAIL(FL_ERR_OOM, "fl::add_layer_norm: out of host memory");
    return FL_OK;
}

/* Per row: dsum = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) with dxhat = grad * lw
 * (into gr, contiguous), dy = dsum * mask / (1-p) (into dy, contiguous; may be gr when p == 0);
 * then the norm's weight and bias gradients as column sums. */
static int TF(lin_norm_bwd)(const lin_mat_t *gm, const lin_mat_t *zm, const fl_tensor_t *mean, const fl_tensor_t *rstd,
                            const fl_tensor_t *lw, double p, uint64_t seed, void *gr_, void *dy_,
                            const fl_tensor_t *glw, const fl_tensor_t *glb) {
    int64_t M = gm->rows, N = gm->cols;
    const T *mp = (const T *)fl_elem(mean, mean->offset), *rp = (const T *)fl_elem(rstd, rstd->offset);
    const T *w = lw ? (const T *)fl_elem(lw, lw->offset) : NULL;
    int64_t ws = lw ? lw->strides[0] : 0;
    T *gr = (T *)gr_, *dy = (T *)dy_;
    T scale = (T)(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static) if (M * N > 65536)
    for (int64_t m = 0; m < M; m++) {
        const T *g = (const T *)gm->base + m * gm->ld, *z = (const T *)zm->base + m * zm->ld;
        int64_t gs = gm->cs, zs = zm->cs;
        T mu = mp[m], is = rp[m];
        double c1 = 0.0, c2 = 0.0;
        for (int64_t n = 0; n < N; n++) {
            T dx = g[n * gs] * (w ? w[n * ws] : (T)1), xh = (z[n * zs] - mu) * is;
            c1 += dx;
            c2 += (double)dx * xh;
        }
        T a = N > 0 ? (T)(c1 / (double)N) : (T)0, c = N > 0 ? (T)(c2 / (double)N) : (T)0;
        T *grow = gr + m * N, *drow = dy + m * N;
        for (int64_t n = 0; n < N; n++) {
            T dx = g[n * gs] * (w ? w[n * ws] : (T)1), xh = (z[n * zs] - mu) * is;
            T d = is * (dx - a - xh * c);
            grow[n] = d;
            drow[n] = p > 0.0 ? (lin_keep(seed, (uint64_t)(m * N + n), p) ? d * scale : (T)0) : d;
        }
    }
    if (glw || glb) {
        T *dw = glw ? (T *)fl_elem(glw, glw->offset) : NULL, *db = glb ? (T *)fl_elem(glb, glb->offset) : NULL;
#pragma omp parallel for schedule(static) if (M * N > 65536)
        for (int64_t n = 0; n < N; n++) {
            T sw = 0, sb = 0;
            for (int64_t m = 0; m < M; m++) {
                T g = ((const T *)gm->base)[m * gm->ld + n * gm->cs];
                sw += g * ((((const T *)zm->base)[m * zm->ld + n * zm->cs] - mp[m]) * rp[m]);
                sb += g;
            }
            if (dw) dw[n] = sw;
            if (db) db[n] = sb;
        }
    }
    return FL_OK;
}

#undef TF
#undef TF_
#undef TF__

#endif /* FL_LIN_TEMPLATE */
