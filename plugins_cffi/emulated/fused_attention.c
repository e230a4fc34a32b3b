/* Fused flash-style scaled dot-product attention (forward and backward).
 *
 *   aten::_scaled_dot_product_fused_attention_overrideable(q, k, v, attn_bias?, dropout_p, is_causal,
 *       return_debug_mask, *, scale?) -> (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
 *                                         philox_seed, philox_offset, debug_attn_mask)
 *   aten::_scaled_dot_product_fused_attention_overrideable_backward(grad_out, q, k, v, attn_bias,
 *       grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
 *       philox_seed, philox_offset, *, scale?) -> (grad_query, grad_key, grad_value, grad_attn_bias)
 *
 * q (B,H,L,E), k (B,H,S,E), v (B,H,S,Ev), any strides. For every (b,h) and
 * block of BQ query rows the kernel streams over blocks of BK keys with an
 * online softmax (running row max m and sum l), so the (L,S) score matrix is
 * never materialised: only a BQ x BK tile of it exists at a time, per thread.
 * Scores and accumulators are float32 for f32/f16/bf16 inputs and float64 for
 * f64; the tile products are BLAS calls (fl_lin_gemm1, one thread each) and the
 * work is spread over the OpenMP threads: (b, h, query block) tasks in the
 * forward, (b, h) tasks in the backward (a (b,h) owns its dK/dV accumulators).
 *
 * Conventions (checked against PyTorch's math path, torch 2.13):
 *   - scale defaults to 1/sqrt(E); scores = q.k * scale + bias.
 *   - is_causal is top-left aligned: query i attends key j iff j <= i
 *     (torch.ones(L, S).tril()), also when L != S; it may be combined with a
 *     bias here (PyTorch's sdpa front end forbids that combination itself).
 *   - attn_bias: float (additive, any floating dtype) or bool (True = attend),
 *     of any shape broadcastable to (B,H,L,S) with at most 4 dims.
 *   - a fully masked row (every score -inf, or S == 0) gives output 0 and
 *     zero gradients, as the math path's safe softmax does; its logsumexp is
 *     -inf (log of an empty sum). The backward treats a -inf score as weight
 *     0 whatever the stored logsumexp of the row says, so lse conventions of
 *     other kernels (0, +inf) work too.
 *   - logsumexp = m + log(l), natural log, in the dtype of the output
 *     descriptor (float32 for every input dtype per PyTorch's meta function).
 *     For f64 inputs a float32 logsumexp is too coarse for the backward, which
 *     then recomputes the row statistics in float64 (one more q.k pass).
 *   - grad_attn_bias (when grad_input_mask[3] and a float bias is given) is
 *     dS summed over the bias's broadcast dims; when not requested the
 *     defined output is zero-filled.
 * Declined (FL_ERR_UNSUPPORTED): dropout_p != 0 (fl::attention_dropout, below, takes it), return_debug_mask, q/k/v not
 * 4-D, q/k/v dtypes that differ or are not floating, batch/head sizes that
 * differ between q, k and v (no GQA broadcast), a bias of more than 4 dims, not
 * broadcastable, or of an integer dtype, grad_attn_bias requested for a bool
 * mask, and output descriptors whose shape does not match. */
#ifndef FL_ATTN_TEMPLATE

#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "emu.h"
#include "k_linalg.h"


#define ATTN_BQ 64   /* query rows per tile */
#define ATTN_BK 128  /* keys per tile */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTN_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define ATTN_CLONES
#endif

typedef struct {
    const fl_tensor_t *q, *k, *v, *bias; /* bias NULL when absent */
    int bias_bool;
    int causal;
    double scale;
    double drop;   /* dropout probability on the attention weights (fl::attention_dropout), 0 for the aten op */
    uint64_t seed; /* its counter-based mask: weight (b, h, i, j) kept iff fl_rand_uniform(seed, ((b*H+h)*L+i)*S+j) >= drop */
    int64_t B, H, L, S, E, Ev;
    int64_t bsz[4]; /* the bias's extent over (b, h, i, j): the target size, or 1 where broadcast */
    int64_t bst[4]; /* its element strides over (b, h, i, j), 0 where broadcast */
} attn_prob_t;

static const fl_tensor_t *attn_out(const fl_tensor_t *out, int n_out, int k) {
    if (k >= n_out || out[k].ndim < 0 || (out[k].data == NULL && fl_numel(&out[k]) != 0)) return NULL;
    return &out[k];
}

static int attn_shape_is(const fl_tensor_t *t, int ndim, const int64_t *sizes) {
    if (t->ndim != ndim) return 0;
    for (int d = 0; d < ndim; d++)
        if (t->sizes[d] != sizes[d]) return 0;
    return 1;
}

static int attn_flag(const fl_arg_t *a) { return (a->kind == FL_ARG_BOOL || a->kind == FL_ARG_INT) && a->i != 0; }

static int attn_mask_bit(const fl_arg_t *a, int k) {
    if (a->kind != FL_ARG_INT_LIST || a->len <= k) return 1;
    return a->list[k] != 0;
}

/* q, k, v, bias, is_causal and scale into *p; FL_OK or FL_ERR_UNSUPPORTED. */
static int attn_setup(attn_prob_t *p, const fl_tensor_t *q, const fl_tensor_t *k, const fl_tensor_t *v,
                      const fl_tensor_t *bias, const fl_arg_t *causal, const fl_arg_t *scale) {
    memset(p, 0, sizeof *p);
    if (bias && bias->ndim < 0) bias = NULL; /* an undefined tensor: no bias */
    if (!q || !k || !v || q->ndim != 4 || k->ndim != 4 || v->ndim != 4) return FL_ERR_UNSUPPORTED;
    int dt = q->dtype;
    if (!fl_is_floating(dt) || k->dtype != dt || v->dtype != dt) return FL_ERR_UNSUPPORTED;
    p->B = q->sizes[0]; p->H = q->sizes[1]; p->L = q->sizes[2]; p->E = q->sizes[3];
    p->S = k->sizes[2]; p->Ev = v->sizes[3];
    if (k->sizes[0] != p->B || k->sizes[1] != p->H || k->sizes[3] != p->E) return FL_ERR_UNSUPPORTED;
    if (v->sizes[0] != p->B || v->sizes[1] != p->H || v->sizes[2] != p->S) return FL_ERR_UNSUPPORTED;
    p->q = q; p->k = k; p->v = v;
    p->causal = attn_flag(causal);
    if (scale->kind == FL_ARG_FLOAT) p->scale = scale->f;
    else if (scale->kind == FL_ARG_INT) p->scale = (double)scale->i;
    else if (scale->kind == FL_ARG_NONE) p->scale = p->E > 0 ? 1.0 / sqrt((double)p->E) : 1.0;
    else return FL_ERR_UNSUPPORTED;
    if (bias) {
        if (bias->dtype == FL_BOOL) p->bias_bool = 1;
        else if (!fl_is_floating(bias->dtype)) return FL_ERR_UNSUPPORTED;
        if (bias->ndim > 4) return FL_ERR_UNSUPPORTED;
        const int64_t target[4] = {p->B, p->H, p->L, p->S};
        for (int d = 0; d < 4; d++) {
            int src = d - (4 - bias->ndim);
            int64_t s = src >= 0 ? bias->sizes[src] : 1;
            if (s == target[d] && s != 1) { p->bsz[d] = s; p->bst[d] = bias->strides[src]; }
            else if (s == 1) { p->bsz[d] = 1; p->bst[d] = 0; }
            else return FL_ERR_UNSUPPORTED;
        }
        p->bias = bias;
    }
    return FL_OK;
}

static void attn_store_scalar_zero(const fl_tensor_t *t) {
    if (t && t->data && fl_numel(t) == 1 && t->dtype != FL_BOOL)
        fl_store_f64(t->dtype, fl_elem(t, t->offset), 0.0);
}

/* float32 instantiation: f32, f16, bf16 inputs */
#define FL_ATTN_TEMPLATE 1
#define T float
#define SFX f32
#define T_DT FL_FLOAT32
#define T_EXP fl_vexpf
#define T_LOG logf
#include "fused_attention.c"
#undef T
#undef SFX
#undef T_DT
#undef T_EXP
#undef T_LOG

/* float64 instantiation */
#define T double
#define SFX f64
#define T_DT FL_FLOAT64
#define T_EXP exp
#define T_LOG log
#include "fused_attention.c"
#undef T
#undef SFX
#undef T_DT
#undef T_EXP
#undef T_LOG
#undef FL_ATTN_TEMPLATE

static int sdpa_forward(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 8 || n_out < 2) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *q = fl_arg_tensor(args, n_args, 0, in, n_in), *k = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *v = fl_arg_tensor(args, n_args, 2, in, n_in), *bias = fl_arg_tensor(args, n_args, 3, in, n_in);
    if (args[3].kind != FL_ARG_NONE && !bias) return FL_ERR_UNSUPPORTED;
    if (args[4].kind != FL_ARG_FLOAT && args[4].kind != FL_ARG_INT) return FL_ERR_UNSUPPORTED;
    double dropout = args[4].kind == FL_ARG_FLOAT ? args[4].f : (double)args[4].i;
    if (dropout != 0.0 || attn_flag(&args[6])) return FL_ERR_UNSUPPORTED;
    attn_prob_t p;
    int st = attn_setup(&p, q, k, v, bias, &args[5], &args[7]);
    if (st) return st;
    const fl_tensor_t *o = attn_out(out, n_out, 0), *lse = attn_out(out, n_out, 1);
    const int64_t osz[4] = {p.B, p.H, p.L, p.Ev};
    if (!o || o->dtype != q->dtype || !attn_shape_is(o, 4, osz)) return FL_ERR_UNSUPPORTED;
    if (lse && (!fl_is_floating(lse->dtype) || !attn_shape_is(lse, 3, osz))) return FL_ERR_UNSUPPORTED;
    fl_lin_blas_init(); /* BLAS to one thread before the tiles' calls from the OpenMP threads */
    if (q->dtype == FL_FLOAT64) st = attn_fwd_f64(&p, o, lse);
    else st = attn_fwd_f32(&p, o, lse);
    if (st) return st;
    for (int i = 6; i < 8 && i < n_out; i++) attn_store_scalar_zero(attn_out(out, n_out, i));
    return FL_OK;
}

static int sdpa_backward(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 17 || n_out < 3) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *q = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *k = fl_arg_tensor(args, n_args, 2, in, n_in), *v = fl_arg_tensor(args, n_args, 3, in, n_in);
    const fl_tensor_t *bias = fl_arg_tensor(args, n_args, 4, in, n_in);
    const fl_tensor_t *o = fl_arg_tensor(args, n_args, 6, in, n_in), *lse = fl_arg_tensor(args, n_args, 7, in, n_in);
    if (args[4].kind != FL_ARG_NONE && !bias) return FL_ERR_UNSUPPORTED;
    if (args[12].kind != FL_ARG_FLOAT && args[12].kind != FL_ARG_INT) return FL_ERR_UNSUPPORTED;
    double dropout = args[12].kind == FL_ARG_FLOAT ? args[12].f : (double)args[12].i;
    if (dropout != 0.0) return FL_ERR_UNSUPPORTED;
    attn_prob_t p;
    int st = attn_setup(&p, q, k, v, bias, &args[13], &args[16]);
    if (st) return st;
    const int64_t osz[4] = {p.B, p.H, p.L, p.Ev};
    if (!g || !o || !lse || g->dtype != q->dtype || o->dtype != q->dtype || !fl_is_floating(lse->dtype))
        return FL_ERR_UNSUPPORTED;
    if (!attn_shape_is(g, 4, osz) || !attn_shape_is(o, 4, osz) || !attn_shape_is(lse, 3, osz))
        return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *gq = attn_out(out, n_out, 0), *gk = attn_out(out, n_out, 1), *gv = attn_out(out, n_out, 2);
    const fl_tensor_t *gb = attn_out(out, n_out, 3);
    if (gq && (gq->dtype != q->dtype || !attn_shape_is(gq, 4, q->sizes))) return FL_ERR_UNSUPPORTED;
    if (gk && (gk->dtype != k->dtype || !attn_shape_is(gk, 4, k->sizes))) return FL_ERR_UNSUPPORTED;
    if (gv && (gv->dtype != v->dtype || !attn_shape_is(gv, 4, v->sizes))) return FL_ERR_UNSUPPORTED;
    int want_gb = 0;
    if (gb && !p.bias) { /* no bias: nothing to write, unless the runtime expects more than an empty tensor */
        if (fl_numel(gb) != 0) return FL_ERR_UNSUPPORTED;
        gb = NULL;
    }
    if (gb) {
        if (!attn_shape_is(gb, p.bias->ndim, p.bias->sizes)) return FL_ERR_UNSUPPORTED;
        want_gb = attn_mask_bit(&args[5], 3);
        if (want_gb && (p.bias_bool || gb->dtype == FL_BOOL)) return FL_ERR_UNSUPPORTED;
    }
    fl_lin_blas_init();
    if (q->dtype == FL_FLOAT64) return attn_bwd_f64(&p, g, o, lse, gq, gk, gv, gb, want_gb);
    return attn_bwd_f32(&p, g, o, lse, gq, gk, gv, gb, want_gb);
}

/* fl::attention_dropout(Tensor query, Tensor key, Tensor value, Tensor? attn_bias, float dropout_p,
 *     bool is_causal, int seed, float? scale) -> (Tensor output, Tensor logsumexp)
 * The same flash kernel with dropout on the attention weights (torch_fl/fused/epilogues.py): the mask is
 * counter-based (attn_prob_t.seed), so the backward regenerates it and nothing (L, S) is stored. */
static int attention_dropout(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 8 || n_out < 2) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *q = fl_arg_tensor(args, n_args, 0, in, n_in), *k = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *v = fl_arg_tensor(args, n_args, 2, in, n_in), *bias = fl_arg_tensor(args, n_args, 3, in, n_in);
    if (args[3].kind != FL_ARG_NONE && !bias) return FL_ERR_UNSUPPORTED;
    if (args[4].kind != FL_ARG_FLOAT || args[6].kind != FL_ARG_INT) return FL_ERR_UNSUPPORTED;
    attn_prob_t p;
    int st = attn_setup(&p, q, k, v, bias, &args[5], &args[7]);
    if (st) return st;
    p.drop = args[4].f;
    p.seed = (uint64_t)args[6].i;
    if (!(p.drop >= 0.0 && p.drop < 1.0)) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *o = attn_out(out, n_out, 0), *lse = attn_out(out, n_out, 1);
    const int64_t osz[4] = {p.B, p.H, p.L, p.Ev};
    if (!o || o->dtype != q->dtype || !attn_shape_is(o, 4, osz)) return FL_ERR_UNSUPPORTED;
    if (!lse || !fl_is_floating(lse->dtype) || !attn_shape_is(lse, 3, osz)) return FL_ERR_UNSUPPORTED;
    fl_lin_blas_init();
    return q->dtype == FL_FLOAT64 ? attn_fwd_f64(&p, o, lse) : attn_fwd_f32(&p, o, lse);
}

/* fl::attention_dropout_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor? attn_bias,
 *     Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, int seed, float? scale)
 *     -> (Tensor grad_query, Tensor grad_key, Tensor grad_value); no bias gradient. */
static int attention_dropout_backward(FL_KERNEL_ARGS) {
    (void)stream; (void)device;
    if (n_args < 11 || n_out < 3) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *q = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *k = fl_arg_tensor(args, n_args, 2, in, n_in), *v = fl_arg_tensor(args, n_args, 3, in, n_in);
    const fl_tensor_t *bias = fl_arg_tensor(args, n_args, 4, in, n_in);
    const fl_tensor_t *o = fl_arg_tensor(args, n_args, 5, in, n_in), *lse = fl_arg_tensor(args, n_args, 6, in, n_in);
    if (args[4].kind != FL_ARG_NONE && !bias) return FL_ERR_UNSUPPORTED;
    if (args[7].kind != FL_ARG_FLOAT || args[9].kind != FL_ARG_INT) return FL_ERR_UNSUPPORTED;
    attn_prob_t p;
    int st = attn_setup(&p, q, k, v, bias, &args[8], &args[10]);
    if (st) return st;
    p.drop = args[7].f;
    p.seed = (uint64_t)args[9].i;
    if (!(p.drop >= 0.0 && p.drop < 1.0)) return FL_ERR_UNSUPPORTED;
    const int64_t osz[4] = {p.B, p.H, p.L, p.Ev};
    if (!g || !o || !lse || g->dtype != q->dtype || o->dtype != q->dtype || !fl_is_floating(lse->dtype))
        return FL_ERR_UNSUPPORTED;
    if (!attn_shape_is(g, 4, osz) || !attn_shape_is(o, 4, osz) || !attn_shape_is(lse, 3, osz))
        return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *gq = attn_out(out, n_out, 0), *gk = attn_out(out, n_out, 1), *gv = attn_out(out, n_out, 2);
    if (!gq || gq->dtype != q->dtype || !attn_shape_is(gq, 4, q->sizes)) return FL_ERR_UNSUPPORTED;
    if (!gk || gk->dtype != k->dtype || !attn_shape_is(gk, 4, k->sizes)) return FL_ERR_UNSUPPORTED;
    if (!gv || gv->dtype != v->dtype || !attn_shape_is(gv, 4, v->sizes)) return FL_ERR_UNSUPPORTED;
    fl_lin_blas_init();
    if (q->dtype == FL_FLOAT64) return attn_bwd_f64(&p, g, o, lse, gq, gk, gv, NULL, 0);
    return attn_bwd_f32(&p, g, o, lse, gq, gk, gv, NULL, 0);
}

static const fl_kernel_entry_t dropout_entries[] = {
    {"fl::attention_dropout", FL_FLOATS, FL_KERNEL_FUSED, attention_dropout},
    {"fl::attention_dropout_backward", FL_FLOATS, FL_KERNEL_FUSED, attention_dropout_backward},
};
const fl_kernel_group_t fl_emu_group_attention_dropout = {dropout_entries,
                                                          (int)(sizeof dropout_entries / sizeof dropout_entries[0])};

static const fl_kernel_entry_t entries[] = {
    {"aten::_scaled_dot_product_fused_attention_overrideable", FL_FLOATS, FL_KERNEL_FUSED, sdpa_forward},
    {"aten::_scaled_dot_product_fused_attention_overrideable_backward", FL_FLOATS, FL_KERNEL_FUSED, sdpa_backward},
};
const fl_kernel_group_t fl_emu_group_attention = {entries, (int)(sizeof entries / sizeof entries[0])};

#else /* FL_ATTN_TEMPLATE: the kernels for one accumulation type T */

#define TF__(a, b) a##_##b
#define TF_(a, b) TF__(a, b)
#define TF(name) TF_(name, SFX)

/* dst[r*ld + c] = t[base + r*rs + c*cs] for r < rows, c < cols, converted to T. */
static void TF(attn_load)(const fl_tensor_t *t, int64_t base, int64_t rs, int64_t cs, int64_t rows, int64_t cols,
                          T *dst, int64_t ld) {
    switch (t->dtype) {
    case FL_FLOAT32: {
        const float *s = (const float *)t->data + base;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[r * ld + c] = (T)s[r * rs + c * cs];
        break;
    }
    case FL_FLOAT64: {
        const double *s = (const double *)t->data + base;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[r * ld + c] = (T)s[r * rs + c * cs];
        break;
    }
    case FL_FLOAT16: {
        const uint16_t *s = (const uint16_t *)t->data + base;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[r * ld + c] = (T)fl_f16_to_f32(s[r * rs + c * cs]);
        break;
    }
    case FL_BFLOAT16: {
        const uint16_t *s = (const uint16_t *)t->data + base;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[r * ld + c] = (T)fl_bf16_to_f32(s[r * rs + c * cs]);
        break;
    }
    default:
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                dst[r * ld + c] = (T)fl_load_f64(t->dtype, fl_elem(t, base + r * rs + c * cs));
    }
}

/* t[base + r*rs + c*cs] = src[r*ld + c], converted to t's dtype. */
static void TF(attn_store)(const fl_tensor_t *t, int64_t base, int64_t rs, int64_t cs, int64_t rows, int64_t cols,
                           const T *src, int64_t ld) {
    switch (t->dtype) {
    case FL_FLOAT32: {
        float *d = (float *)t->data + base;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) d[r * rs + c * cs] = (float)src[r * ld + c];
        break;
    }
    case FL_FLOAT64: {
        double *d = (double *)t->data + base;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) d[r * rs + c * cs] = (double)src[r * ld + c];
        break;
    }
    case FL_FLOAT16: {
        uint16_t *d = (uint16_t *)t->data + base;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) d[r * rs + c * cs] = fl_f32_to_f16((float)src[r * ld + c]);
        break;
    }
    case FL_BFLOAT16: {
        uint16_t *d = (uint16_t *)t->data + base;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) d[r * rs + c * cs] = fl_f32_to_bf16((float)src[r * ld + c]);
        break;
    }
    default:
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                fl_store_f64(t->dtype, fl_elem(t, base + r * rs + c * cs), (double)src[r * ld + c]);
    }
}

/* A rows x cols matrix of t as a row-major T matrix for BLAS: t's own memory
 * when its dtype is T and its rows are unit-stride (*ld = row stride), else a
 * converted copy in buf (*ld = cols). */
static const T *TF(attn_view)(const fl_tensor_t *t, int64_t base, int64_t rs, int64_t cs, int64_t rows, int64_t cols,
                              T *buf, int64_t *ld) {
    int64_t minld = cols > 1 ? cols : 1;
    if (t->dtype == T_DT && (cs == 1 || cols <= 1) && (rows <= 1 || rs >= minld)) {
        *ld = rows <= 1 ? minld : rs;
        return (const T *)t->data + base;
    }
    TF(attn_load)(t, base, rs, cs, rows, cols, buf, minld);
    *ld = minld;
    return buf;
}

/* sc[r*ld + c] += bias(b, h, i0 + r, j0 + c) (bool: -inf where false). */
static void TF(attn_add_bias)(const attn_prob_t *p, int64_t b, int64_t h, int64_t i0, int64_t ni, int64_t j0,
                              int64_t nj, T *sc, int64_t ld) {
    const fl_tensor_t *t = p->bias;
    int64_t base = t->offset + b * p->bst[0] + h * p->bst[1] + i0 * p->bst[2] + j0 * p->bst[3];
    int64_t si = p->bst[2], sj = p->bst[3];
    if (p->bias_bool) {
        const uint8_t *m = (const uint8_t *)t->data + base;
        for (int64_t r = 0; r < ni; r++) {
            T *s = sc + r * ld;
            const uint8_t *mr = m + r * si;
            for (int64_t c = 0; c < nj; c++)
                if (!mr[c * sj]) s[c] = -INFINITY;
        }
        return;
    }
    switch (t->dtype) {
    case FL_FLOAT32: {
        const float *bp = (const float *)t->data + base;
        for (int64_t r = 0; r < ni; r++)
            for (int64_t c = 0; c < nj; c++) sc[r * ld + c] += (T)bp[r * si + c * sj];
        break;
    }
    case FL_FLOAT64: {
        const double *bp = (const double *)t->data + base;
        for (int64_t r = 0; r < ni; r++)
            for (int64_t c = 0; c < nj; c++) sc[r * ld + c] += (T)bp[r * si + c * sj];
        break;
    }
    case FL_FLOAT16: {
        const uint16_t *bp = (const uint16_t *)t->data + base;
        for (int64_t r = 0; r < ni; r++)
            for (int64_t c = 0; c < nj; c++) sc[r * ld + c] += (T)fl_f16_to_f32(bp[r * si + c * sj]);
        break;
    }
    default: {
        const uint16_t *bp = (const uint16_t *)t->data + base;
        for (int64_t r = 0; r < ni; r++)
            for (int64_t c = 0; c < nj; c++) sc[r * ld + c] += (T)fl_bf16_to_f32(bp[r * si + c * sj]);
    }
    }
}

/* The score tile for query rows [i0, i0+ni) and keys [j0, j0+nj):
 * sc = scale * Q K^T + bias, -inf where causally masked. */
static void TF(attn_scores)(const attn_prob_t *p, int64_t b, int64_t h, int64_t i0, int64_t ni, int64_t j0,
                            int64_t nj, const T *Q, int64_t ldq, const T *K, int64_t ldk, T *sc) {
    fl_lin_gemm1(T_DT, 0, 1, ni, nj, p->E, p->scale, Q, ldq, K + j0 * ldk, ldk, 0.0, sc, ATTN_BK);
    if (p->bias) TF(attn_add_bias)(p, b, h, i0, ni, j0, nj, sc, ATTN_BK);
    if (p->causal && j0 + nj - 1 > i0) {
        for (int64_t r = 0; r < ni; r++) {
            int64_t first = i0 + r + 1 - j0; /* first masked column of row r */
            for (int64_t c = first < 0 ? 0 : first; c < nj; c++) sc[r * ATTN_BK + c] = -INFINITY;
        }
    }
}

/* Keys [0, end) can be attended by query rows [i0, i0+ni). */
static inline int64_t TF(attn_key_end)(const attn_prob_t *p, int64_t i0, int64_t ni) {
    if (!p->causal) return p->S;
    int64_t e = i0 + ni;
    return e < p->S ? e : p->S;
}

/* Online softmax over one tile: updates the running max m and sum l of each
 * row, turns sc into exp(s - m_new) (0 for -inf scores), and rescales acc
 * rows (acc may be NULL: statistics only). */
ATTN_CLONES
static void TF(attn_online)(T *sc, int64_t ni, int64_t nj, T *m, T *l, T *acc, int64_t ldacc, int64_t nacc) {
    for (int64_t r = 0; r < ni; r++) {
        T *s = sc + r * ATTN_BK;
        T mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t c = 0; c < nj; c++) mx = s[c] > mx ? s[c] : mx;
        T mn = m[r] > mx ? m[r] : mx;
        if (mn == -INFINITY) { /* nothing attended so far */
            memset(s, 0, (size_t)nj * sizeof(T));
            continue;
        }
        T alpha = m[r] == -INFINITY ? (T)0 : T_EXP(m[r] - mn);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < nj; c++) {
            T e = T_EXP(s[c] - mn);
            e = s[c] == -INFINITY ? (T)0 : e;
            s[c] = e;
            sum += e;
        }
        l[r] = l[r] * alpha + sum;
        m[r] = mn;
        if (acc && alpha != (T)1) {
            T *a = acc + r * ldacc;
            for (int64_t c = 0; c < nacc; c++) a[c] *= alpha;
        }
    }
}

/* sc := P = exp(s - lse): 0 for -inf scores and for rows without any weight. */
ATTN_CLONES
static void TF(attn_probs)(T *sc, int64_t ni, int64_t nj, const T *lse) {
    for (int64_t r = 0; r < ni; r++) {
        T *s = sc + r * ATTN_BK;
        T ls = lse[r];
        if (!(ls > -INFINITY && ls < INFINITY)) {
            memset(s, 0, (size_t)nj * sizeof(T));
            continue;
        }
#pragma omp simd
        for (int64_t c = 0; c < nj; c++) {
            T e = T_EXP(s[c] - ls);
            s[c] = s[c] == -INFINITY ? (T)0 : e;
        }
    }
}

/* dp := dS = P * (dP - D). */
ATTN_CLONES
static void TF(attn_ds)(const T *P, T *dp, int64_t ni, int64_t nj, const T *D) {
    for (int64_t r = 0; r < ni; r++) {
        const T *s = P + r * ATTN_BK;
        T *d = dp + r * ATTN_BK;
        T dr = D[r];
#pragma omp simd
        for (int64_t c = 0; c < nj; c++) d[c] = s[c] * (d[c] - dr);
    }
}

/* The dropout mask of a tile: sc *= mask / (1 - p). */
static void TF(attn_drop_fwd)(const attn_prob_t *p, int64_t b, int64_t h, int64_t i0, int64_t ni, int64_t j0,
                              int64_t nj, T *sc) {
    T keep = (T)(1.0 / (1.0 - p->drop));
    for (int64_t r = 0; r < ni; r++) {
        uint64_t base = (uint64_t)(((b * p->H + h) * p->L + i0 + r) * p->S + j0);
        T *s = sc + r * ATTN_BK;
        for (int64_t c = 0; c < nj; c++) s[c] = fl_rand_uniform(p->seed, base + (uint64_t)c) >= p->drop ? s[c] * keep : 0;
    }
}

/* dp := P * (Z dP - D) and sc := Z P, with Z the tile's mask / (1 - p). */
static void TF(attn_drop_bwd)(const attn_prob_t *p, int64_t b, int64_t h, int64_t i0, int64_t ni, int64_t j0,
                              int64_t nj, T *sc, T *dp, const T *D) {
    T keep = (T)(1.0 / (1.0 - p->drop));
    for (int64_t r = 0; r < ni; r++) {
        uint64_t base = (uint64_t)(((b * p->H + h) * p->L + i0 + r) * p->S + j0);
        T *s = sc + r * ATTN_BK, *d = dp + r * ATTN_BK;
        for (int64_t c = 0; c < nj; c++) {
            T z = fl_rand_uniform(p->seed, base + (uint64_t)c) >= p->drop ? keep : (T)0;
            d[c] = s[c] * (z * d[c] - D[r]);
            s[c] *= z;
        }
    }
}

static int TF(attn_fwd)(const attn_prob_t *p, const fl_tensor_t *o, const fl_tensor_t *lse) {
    const fl_tensor_t *q = p->q, *k = p->k, *v = p->v;
    int64_t B = p->B, H = p->H, L = p->L, S = p->S, E = p->E, Ev = p->Ev;
    int64_t nqb = (L + ATTN_BQ - 1) / ATTN_BQ, ntask = B * H * nqb;
    if (ntask == 0) return FL_OK;
    double work = (double)B * H * L * ((double)S + 1) * (double)(E + Ev + 8);
    int failed = 0;
    size_t need = (size_t)(S * E + S * Ev + ATTN_BQ * E + ATTN_BQ * ATTN_BK + ATTN_BQ * Ev + 2 * ATTN_BQ + 2);
#pragma omp parallel if (ntask > 1 && work > 1e6)
    {
        T *buf = malloc(need * sizeof(T));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        T *Kb = buf, *Vb = Kb + S * E, *Qb = Vb + S * Ev, *sc = Qb + ATTN_BQ * E, *acc = sc + ATTN_BQ * ATTN_BK;
        T *m = acc + ATTN_BQ * Ev, *l = m + ATTN_BQ;
        int64_t cur = -1, ldk = 1, ldv = 1, ldq = 1;
        const T *K = NULL, *V = NULL;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < ntask; task++) {
            if (!buf) continue;
            int64_t bh = task / nqb, qb = task % nqb, b = bh / H, h = bh % H;
            if (bh != cur) { /* keys and values of this (b, h), kept while the thread stays on it */
                K = TF(attn_view)(k, k->offset + b * k->strides[0] + h * k->strides[1], k->strides[2], k->strides[3],
                                  S, E, Kb, &ldk);
                V = TF(attn_view)(v, v->offset + b * v->strides[0] + h * v->strides[1], v->strides[2], v->strides[3],
                                  S, Ev, Vb, &ldv);
                cur = bh;
            }
            int64_t i0 = qb * ATTN_BQ, ni = L - i0 < ATTN_BQ ? L - i0 : ATTN_BQ;
            const T *Q = TF(attn_view)(q, q->offset + b * q->strides[0] + h * q->strides[1] + i0 * q->strides[2],
                                       q->strides[2], q->strides[3], ni, E, Qb, &ldq);
            for (int64_t r = 0; r < ni; r++) { m[r] = -INFINITY; l[r] = 0; }
            memset(acc, 0, (size_t)(ni * Ev) * sizeof(T));
            int64_t jend = TF(attn_key_end)(p, i0, ni);
            for (int64_t j0 = 0; j0 < jend; j0 += ATTN_BK) {
                int64_t nj = jend - j0 < ATTN_BK ? jend - j0 : ATTN_BK;
                TF(attn_scores)(p, b, h, i0, ni, j0, nj, Q, ldq, K, ldk, sc);
                TF(attn_online)(sc, ni, nj, m, l, acc, Ev, Ev);
                if (p->drop > 0.0) TF(attn_drop_fwd)(p, b, h, i0, ni, j0, nj, sc); /* after l: the sum is undropped */
                fl_lin_gemm1(T_DT, 0, 0, ni, Ev, nj, 1.0, sc, ATTN_BK, V + j0 * ldv, ldv, 1.0, acc, Ev);
            }
            for (int64_t r = 0; r < ni; r++) {
                T inv = l[r] > 0 ? (T)1 / l[r] : (T)0;
                T *a = acc + r * Ev;
                for (int64_t c = 0; c < Ev; c++) a[c] *= inv;
                m[r] = l[r] > 0 ? m[r] + T_LOG(l[r]) : (T)-INFINITY;
            }
            TF(attn_store)(o, o->offset + b * o->strides[0] + h * o->strides[1] + i0 * o->strides[2], o->strides[2],
                           o->strides[3], ni, Ev, acc, Ev);
            if (lse)
                TF(attn_store)(lse, lse->offset + b * lse->strides[0] + h * lse->strides[1] + i0 * lse->strides[2], 0,
                               lse->strides[2], 1, ni, m, ni);
        }
        free(buf);
    }
    if (failed) FL_FAIL(FL_ERR_OOM, "scaled_dot_product_fused_attention: out of host memory for the tiles");
    return FL_OK;
}

static int TF(attn_bwd)(const attn_prob_t *p, const fl_tensor_t *g, const fl_tensor_t *o, const fl_tensor_t *lse,
                        const fl_tensor_t *gq, const fl_tensor_t *gk, const fl_tensor_t *gv, const fl_tensor_t *gb,
                        int want_gb) {
    const fl_tensor_t *q = p->q, *k = p->k, *v = p->v;
    int64_t B = p->B, H = p->H, L = p->L, S = p->S, E = p->E, Ev = p->Ev, BH = B * H;
    /* the stored logsumexp is exact enough unless it is coarser than T */
    int recompute = fl_itemsize(lse->dtype) < sizeof(T) || lse->dtype == FL_FLOAT16 || lse->dtype == FL_BFLOAT16;
    /* grad_attn_bias accumulates in T over the bias's own extent; (b, h)
     * pairs that share a bias slice (broadcast over B or H) accumulate in
     * per-thread copies that are summed at the end. */
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    int64_t gst[4] = {0, 0, 0, 0}, gnum = 1;
    for (int d = 3; d >= 0; d--) {
        if (want_gb && p->bsz[d] != 1) gst[d] = gnum;
        if (want_gb) gnum *= p->bsz[d];
    }
    int shared_slices = want_gb && (p->bsz[0] != B || p->bsz[1] != H) && BH > 1;
    int ncopies = shared_slices ? nthreads : 1;
    T *gacc = NULL;
    if (want_gb) {
        gacc = calloc((size_t)(gnum * ncopies + 1), sizeof(T));
        if (!gacc) FL_FAIL(FL_ERR_OOM, "scaled_dot_product_fused_attention_backward: out of host memory");
    }
    double work = (double)BH * L * ((double)S + 1) * (double)(E + Ev + 8);
    int failed = 0;
    size_t need = (size_t)(2 * S * E + 2 * S * Ev + 2 * ATTN_BQ * E + 2 * ATTN_BQ * Ev + 2 * ATTN_BQ * ATTN_BK +
                           4 * ATTN_BQ + 4);
#pragma omp parallel num_threads(nthreads) if (BH > 1 && work > 1e6)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        T *buf = malloc(need * sizeof(T));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        T *Kb = buf, *Vb = Kb + S * E, *dK = Vb + S * Ev, *dV = dK + S * E, *Qb = dV + S * Ev, *dQ = Qb + ATTN_BQ * E;
        T *dOb = dQ + ATTN_BQ * E, *Ob = dOb + ATTN_BQ * Ev, *sc = Ob + ATTN_BQ * Ev, *dp = sc + ATTN_BQ * ATTN_BK;
        T *ls = dp + ATTN_BQ * ATTN_BK, *D = ls + ATTN_BQ, *m = D + ATTN_BQ, *l = m + ATTN_BQ;
        T *gmine = gacc ? gacc + (shared_slices ? (int64_t)tid * gnum : 0) : NULL;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (!buf) continue;
            int64_t b = bh / H, h = bh % H, ldk, ldv, ldq, ldo;
            const T *K = TF(attn_view)(k, k->offset + b * k->strides[0] + h * k->strides[1], k->strides[2],
                                       k->strides[3], S, E, Kb, &ldk);
            const T *V = TF(attn_view)(v, v->offset + b * v->strides[0] + h * v->strides[1], v->strides[2],
                                       v->strides[3], S, Ev, Vb, &ldv);
            memset(dK, 0, (size_t)(S * E) * sizeof(T));
            memset(dV, 0, (size_t)(S * Ev) * sizeof(T));
            T *gslice = gmine ? gmine + b * gst[0] + h * gst[1] : NULL;
            for (int64_t i0 = 0; i0 < L; i0 += ATTN_BQ) {
                int64_t ni = L - i0 < ATTN_BQ ? L - i0 : ATTN_BQ;
                const T *Q = TF(attn_view)(q, q->offset + b * q->strides[0] + h * q->strides[1] + i0 * q->strides[2],
                                           q->strides[2], q->strides[3], ni, E, Qb, &ldq);
                const T *dO = TF(attn_view)(g, g->offset + b * g->strides[0] + h * g->strides[1] + i0 * g->strides[2],
                                            g->strides[2], g->strides[3], ni, Ev, dOb, &ldo);
                /* D_i = rowsum(dO_i * O_i) */
                TF(attn_load)(o, o->offset + b * o->strides[0] + h * o->strides[1] + i0 * o->strides[2], o->strides[2],
                              o->strides[3], ni, Ev, Ob, Ev > 0 ? Ev : 1);
                for (int64_t r = 0; r < ni; r++) {
                    T s = 0;
                    for (int64_t c = 0; c < Ev; c++) s += dO[r * ldo + c] * Ob[r * Ev + c];
                    D[r] = s;
                }
                int64_t jend = TF(attn_key_end)(p, i0, ni);
                if (recompute) {
                    for (int64_t r = 0; r < ni; r++) { m[r] = -INFINITY; l[r] = 0; }
                    for (int64_t j0 = 0; j0 < jend; j0 += ATTN_BK) {
                        int64_t nj = jend - j0 < ATTN_BK ? jend - j0 : ATTN_BK;
                        TF(attn_scores)(p, b, h, i0, ni, j0, nj, Q, ldq, K, ldk, sc);
                        TF(attn_online)(sc, ni, nj, m, l, NULL, 0, 0);
                    }
                    for (int64_t r = 0; r < ni; r++) ls[r] = l[r] > 0 ? m[r] + T_LOG(l[r]) : (T)-INFINITY;
                } else {
                    TF(attn_load)(lse, lse->offset + b * lse->strides[0] + h * lse->strides[1] + i0 * lse->strides[2],
                                  0, lse->strides[2], 1, ni, ls, ni);
                }
                memset(dQ, 0, (size_t)(ni * E) * sizeof(T));
                for (int64_t j0 = 0; j0 < jend; j0 += ATTN_BK) {
                    int64_t nj = jend - j0 < ATTN_BK ? jend - j0 : ATTN_BK;
                    TF(attn_scores)(p, b, h, i0, ni, j0, nj, Q, ldq, K, ldk, sc);
                    TF(attn_probs)(sc, ni, nj, ls);                                      /* sc := P */
                    if (p->drop > 0.0) { /* dS = P * (Z dP - D), dV += (Z P)^T dO with Z = mask / (1 - p) */
                        fl_lin_gemm1(T_DT, 0, 1, ni, nj, Ev, 1.0, dO, ldo, V + j0 * ldv, ldv, 0.0, dp, ATTN_BK);
                        TF(attn_drop_bwd)(p, b, h, i0, ni, j0, nj, sc, dp, D);            /* dp := dS, sc := Z P */
                        fl_lin_gemm1(T_DT, 1, 0, nj, Ev, ni, 1.0, sc, ATTN_BK, dO, ldo, 1.0, dV + j0 * Ev, Ev);
                    } else {
                        fl_lin_gemm1(T_DT, 1, 0, nj, Ev, ni, 1.0, sc, ATTN_BK, dO, ldo, 1.0, dV + j0 * Ev, Ev);
                        fl_lin_gemm1(T_DT, 0, 1, ni, nj, Ev, 1.0, dO, ldo, V + j0 * ldv, ldv, 0.0, dp, ATTN_BK);
                        TF(attn_ds)(sc, dp, ni, nj, D);                                  /* dp := dS */
                    }
                    if (gslice) {
                        for (int64_t r = 0; r < ni; r++) {
                            T *gr = gslice + (i0 + r) * gst[2] + j0 * gst[3];
                            const T *dr = dp + r * ATTN_BK;
                            if (gst[3] == 1) {
                                for (int64_t c = 0; c < nj; c++) gr[c] += dr[c];
                            } else {
                                T s = 0;
                                for (int64_t c = 0; c < nj; c++) s += dr[c];
                                gr[0] += s;
                            }
                        }
                    }
                    fl_lin_gemm1(T_DT, 0, 0, ni, E, nj, p->scale, dp, ATTN_BK, K + j0 * ldk, ldk, 1.0, dQ, E);
                    fl_lin_gemm1(T_DT, 1, 0, nj, E, ni, p->scale, dp, ATTN_BK, Q, ldq, 1.0, dK + j0 * E, E);
                }
                if (gq)
                    TF(attn_store)(gq, gq->offset + b * gq->strides[0] + h * gq->strides[1] + i0 * gq->strides[2],
                                   gq->strides[2], gq->strides[3], ni, E, dQ, E);
            }
            if (gk)
                TF(attn_store)(gk, gk->offset + b * gk->strides[0] + h * gk->strides[1], gk->strides[2],
                               gk->strides[3], S, E, dK, E);
            if (gv)
                TF(attn_store)(gv, gv->offset + b * gv->strides[0] + h * gv->strides[1], gv->strides[2],
                               gv->strides[3], S, Ev, dV, Ev);
        }
        free(buf);
    }
    if (failed) {
        free(gacc);
        FL_FAIL(FL_ERR_OOM, "scaled_dot_product_fused_attention_backward: out of host memory for the tiles");
    }
    if (gb) {
        int nb = gb->ndim;
        int64_t ost[4];
        for (int d = 0; d < 4; d++) ost[d] = d - (4 - nb) >= 0 ? gb->strides[d - (4 - nb)] : 0;
        int64_t rows = p->bsz[0] * p->bsz[1] * p->bsz[2], cols = p->bsz[3];
        if (!want_gb) { /* defined but not requested: zeros */
            for (int64_t r = 0; r < rows; r++) {
                int64_t i = r % p->bsz[2], h = (r / p->bsz[2]) % p->bsz[1], b = r / (p->bsz[2] * p->bsz[1]);
                for (int64_t c = 0; c < cols; c++)
                    fl_store_f64(gb->dtype, fl_elem(gb, gb->offset + b * ost[0] + h * ost[1] + i * ost[2] + c * ost[3]),
                                 0.0);
            }
        } else {
            for (int t = 1; t < ncopies; t++)
                for (int64_t e = 0; e < gnum; e++) gacc[e] += gacc[t * gnum + e];
            for (int64_t r = 0; r < rows; r++) {
                int64_t i = r % p->bsz[2], h = (r / p->bsz[2]) % p->bsz[1], b = r / (p->bsz[2] * p->bsz[1]);
                TF(attn_store)(gb, gb->offset + b * ost[0] + h * ost[1] + i * ost[2], 0, ost[3], 1, cols,
                               gacc + r * cols, cols);
            }
        }
    }
    free(gacc);
    return FL_OK;
}

#undef TF
#undef TF_
#undef TF__

#endif /* FL_ATTN_TEMPLATE */
