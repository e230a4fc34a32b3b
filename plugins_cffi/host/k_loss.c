/* Host kernels: losses. Serves aten::nll_loss_forward / nll_loss_backward and
 * nll_loss2d_forward / nll_loss2d_backward (cross_entropy reaches them through
 * log_softmax, from k_reduce.c); the other losses PyTorch composes from
 * elementwise ops and reductions.
 *
 * Targets are class indices of any integer dtype, checked against the class
 * count with PyTorch's message; ignore_index entries add nothing; weights are
 * per class. Sums accumulate in double, in a fixed order (deterministic).
 */
#include <stdlib.h>

#include "fl_host.h"

#define UNSUP FL_ERR_UNSUPPORTED

typedef struct {
    int64_t N, C, H, W;
    int64_t xs[4], ts[3]; /* self strides (n, c, h, w), target strides (n, h, w) */
} nll_geo_t;
static int nll_geo(const fl_tensor_t *x, const fl_tensor_t *t, int two_d, nll_geo_t *g) {
    memset(g, 0, sizeof *g);
    g->H = g->W = 1;
    if (!two_d && x->ndim == 1 && t->ndim == 0) {
        g->N = 1; g->C = x->sizes[0]; g->xs[1] = x->strides[0];
    } else if (!two_d && x->ndim == 2 && t->ndim == 1 && t->sizes[0] == x->sizes[0]) {
        g->N = x->sizes[0]; g->C = x->sizes[1]; g->xs[0] = x->strides[0]; g->xs[1] = x->strides[1]; g->ts[0] = t->strides[0];
    } else if (two_d && x->ndim == 4 && t->ndim == 3 && t->sizes[0] == x->sizes[0] && t->sizes[1] == x->sizes[2] &&
               t->sizes[2] == x->sizes[3]) {
        g->N = x->sizes[0]; g->C = x->sizes[1]; g->H = x->sizes[2]; g->W = x->sizes[3];
        for (int d = 0; d < 4; d++) g->xs[d] = x->strides[d];
        for (int d = 0; d < 3; d++) g->ts[d] = t->strides[d];
    } else {
        return -1;
    }
    return 0;
}

static int nll_fwd(FL_KERNEL_ARGS, int two_d) { /* (self, target, weight?, reduction, ignore_index) -> (out, total_weight) */
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *t = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!x || !t || n_args < 5 || n_out < 2 || !fl_tensor_ok(&out[0]) || !fl_tensor_ok(&out[1])) return UNSUP;
    if (fl_is_floating(t->dtype) || !fl_is_floating(x->dtype)) return UNSUP;
    const fl_tensor_t *w = args[2].kind == FL_ARG_TENSOR ? fl_arg_tensor(args, n_args, 2, in, n_in) : NULL;
    if (args[2].kind == FL_ARG_TENSOR && !w) return UNSUP;
    int64_t red = args[3].i, ign = args[4].i;
    nll_geo_t g;
    if (nll_geo(x, t, two_d, &g)) return UNSUP;
    if (w && (w->ndim != 1 || w->sizes[0] != g.C)) return UNSUP;
    if (red == 0) {
        int64_t per = g.H * g.W;
        if (fl_numel(&out[0]) != g.N * per) return UNSUP;
    } else if (out[0].ndim != 0) {
        return UNSUP;
    }
    double total = 0, tw = 0;
    for (int64_t n = 0; n < g.N; n++)
        for (int64_t h = 0; h < g.H; h++)
            for (int64_t q = 0; q < g.W; q++) {
                int64_t c = fl_load_i64(t, t->offset + n * g.ts[0] + h * g.ts[1] + q * g.ts[2]);
                double v = 0;
                if (c != ign) {
                    if (c < 0 || c >= g.C) FL_FAIL(FL_ERR_INVALID, "Target %lld is out of bounds.", (long long)c);
                    double wt = w ? fl_load_f64(w->dtype, fl_elem(w, w->offset + c * w->strides[0])) : 1.0;
                    v = -wt * fl_load_f64(x->dtype, fl_elem(x, x->offset + n * g.xs[0] + c * g.xs[1] + h * g.xs[2] + q * g.xs[3]));
                    tw += wt;
                }
                if (red == 0) {
                    int64_t off = out[0].offset;
                    if (out[0].ndim == 1) off += n * out[0].strides[0];
                    else if (out[0].ndim == 3) off += n * out[0].strides[0] + h * out[0].strides[1] + q * out[0].strides[2];
                    fl_store_f64(out[0].dtype, fl_elem(&out[0], off), v);
                }
                total += v;
            }
    if (red == 1) fl_store_f64((&out[0])->dtype, fl_elem(&out[0], (&out[0])->offset), total / tw);
    else if (red == 2) fl_store_f64((&out[0])->dtype, fl_elem(&out[0], (&out[0])->offset), total);
    /* torch leaves total_weight 0 for an unreduced batch; a single sample reports its weight */
    if (fl_numel(&out[1]) == 1) fl_store_f64((&out[1])->dtype, fl_elem(&out[1], (&out[1])->offset), (red == 0 && x->ndim != 1) ? 0.0 : tw);
    return FL_OK;
}
static int k_nll_fwd(FL_KERNEL_ARGS) { return nll_fwd(stream, device, in, n_in, out, n_out, args, n_args, 0); }
static int k_nll2d_fwd(FL_KERNEL_ARGS) { return nll_fwd(stream, device, in, n_in, out, n_out, args, n_args, 1); }

/* (grad_output, self, target, weight?, reduction, ignore_index, total_weight) */
static int nll_bwd(FL_KERNEL_ARGS, int two_d) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *go = fl_arg_tensor(args, n_args, 0, in, n_in), *x = fl_arg_tensor(args, n_args, 1, in, n_in),
                      *t = fl_arg_tensor(args, n_args, 2, in, n_in), *tw = fl_arg_tensor(args, n_args, 6, in, n_in);
    if (!go || !x || !t || !tw || n_args < 7 || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    const fl_tensor_t *w = args[3].kind == FL_ARG_TENSOR ? fl_arg_tensor(args, n_args, 3, in, n_in) : NULL;
    if (args[3].kind == FL_ARG_TENSOR && !w) return UNSUP;
    int64_t red = args[4].i, ign = args[5].i;
    nll_geo_t g;
    if (nll_geo(x, t, two_d, &g) || out[0].ndim != x->ndim) return UNSUP;
    const fl_tensor_t *o = &out[0];
    fl_zero_strided(o);
    int64_t oxs[4] = {0, 0, 0, 0};
    if (o->ndim == 1) oxs[1] = o->strides[0];
    else for (int d = 0; d < o->ndim; d++) oxs[d] = o->strides[d];
    double scale = 1.0;
    if (red != 0) {
        scale = fl_load_f64(go->dtype, fl_elem(go, go->offset));
        if (red == 1) scale /= fl_load_f64(tw->dtype, fl_elem(tw, tw->offset));
    }
    for (int64_t n = 0; n < g.N; n++)
        for (int64_t h = 0; h < g.H; h++)
            for (int64_t q = 0; q < g.W; q++) {
                int64_t c = fl_load_i64(t, t->offset + n * g.ts[0] + h * g.ts[1] + q * g.ts[2]);
                if (c == ign) continue;
                if (c < 0 || c >= g.C) FL_FAIL(FL_ERR_INVALID, "Target %lld is out of bounds.", (long long)c);
                double wt = w ? fl_load_f64(w->dtype, fl_elem(w, w->offset + c * w->strides[0])) : 1.0;
                double gv = scale;
                if (red == 0) {
                    int64_t off = go->offset;
                    if (go->ndim == 1) off += n * go->strides[0];
                    else if (go->ndim == 3) off += n * go->strides[0] + h * go->strides[1] + q * go->strides[2];
                    gv = fl_load_f64(go->dtype, fl_elem(go, off));
                }
                fl_store_f64(o->dtype, fl_elem(o, o->offset + n * oxs[0] + c * oxs[1] + h * oxs[2] + q * oxs[3]), -wt * gv);
            }
    return FL_OK;
}
static int k_nll_bwd(FL_KERNEL_ARGS) { return nll_bwd(stream, device, in, n_in, out, n_out, args, n_args, 0); }
static int k_nll2d_bwd(FL_KERNEL_ARGS) { return nll_bwd(stream, device, in, n_in, out, n_out, args, n_args, 1); }

#define FLT FL_FLOATS
#define E(name, mask, fn) {name, mask, 0, fn}

static const fl_kernel_entry_t entries[] = {
    E("aten::nll_loss_forward", FLT, k_nll_fwd),
    E("aten::nll_loss_backward", FLT, k_nll_bwd),
    E("aten::nll_loss2d_forward", FLT, k_nll2d_fwd),
    E("aten::nll_loss2d_backward", FLT, k_nll2d_bwd),
};

const fl_kernel_group_t fl_host_group_loss = {entries, (int)(sizeof entries / sizeof entries[0])};
