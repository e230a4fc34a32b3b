/* Host kernels: batch norm (every aten entry point), layer norm, group norm,
 * forward and backward. Statistics accumulate in double; channels / rows are
 * spread over OpenMP threads. Inputs that are not contiguous are packed first
 * and non-contiguous outputs are written through a scratch buffer.
 *
 * This file includes itself once per element type for the typed section. */
#ifndef LIN_T

#include "k_linalg.h"

/* A 1-D parameter (weight, bias, running stats, saved stats): base + stride. */
typedef struct { char *p; int64_t s; } vec_t;
static vec_t vec_of(const fl_tensor_t *t) {
    vec_t v = {NULL, 0};
    if (!t) return v;
    v.p = fl_elem(t, t->offset);
    v.s = t->ndim >= 1 ? t->strides[t->ndim - 1] : 0;
    return v;
}
/* Is t a vector of n elements we can walk with one stride (any rank, one
 * non-1 dim)? */
static int vec_ok(const fl_tensor_t *t, int64_t n, int dt) {
    if (!t) return 1;
    if (t->dtype != dt || fl_numel(t) != n) return 0;
    int non1 = 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->sizes[d] != 1) { non1++; if (d != t->ndim - 1) return 0; }
    return non1 <= 1;
}

static int mask_bit(const fl_arg_t *a, int k) {
    if (a->kind != FL_ARG_INT_LIST || a->len <= k) return 1;
    return a->list[k] != 0;
}

#define LIN_SELF "k_norm.c"
#include "k_linalg_typed.h"


/* ======================================================================
 * batch norm
 * ====================================================================== */

/* x and t both channels-last (4-D) and x not also contiguous (size-1 dims can make it both): the NHWC kernels
 * read them where they are; t has x's shape (an output, or the gradient of one). */
static int nhwc_pair(const fl_tensor_t *x, const fl_tensor_t *t) {
    if (x->ndim != 4 || t->ndim != 4 || fl_is_contiguous(x) || !fl_is_channels_last(x) || !fl_is_channels_last(t))
        return 0;
    for (int d = 0; d < 4; d++)
        if (t->sizes[d] != x->sizes[d]) return 0;
    return 1;
}

/* Forward core shared by every entry point. x: (N, C, *). */
static int bn_forward(const fl_tensor_t *x, const fl_tensor_t *w, const fl_tensor_t *b, const fl_tensor_t *rm,
                      const fl_tensor_t *rv, int training, double momentum, double eps, const fl_tensor_t *y,
                      const fl_tensor_t *smean, const fl_tensor_t *sinv) {
    int dt = x->dtype;
    if (!fl_lin_float_dt(dt) || x->ndim < 2 || x->ndim > FL_MAX_DIMS || !y || y->dtype != dt) return FL_ERR_UNSUPPORTED;
    int64_t N = x->sizes[0], C = x->sizes[1], S = 1;
    for (int d = 2; d < x->ndim; d++) S *= x->sizes[d];
    if (!vec_ok(w, C, dt) || !vec_ok(b, C, dt) || !vec_ok(rm, C, dt) || !vec_ok(rv, C, dt)) return FL_ERR_UNSUPPORTED;
    if (smean && fl_numel(smean) == 0) smean = NULL;
    if (sinv && fl_numel(sinv) == 0) sinv = NULL;
    if (!vec_ok(smean, C, dt) || !vec_ok(sinv, C, dt)) return FL_ERR_UNSUPPORTED;
    if (!training && (!rm || !rv)) FL_FAIL(FL_ERR_INVALID, "batch_norm: running_mean and running_var are required in eval mode");
    if (training && N * S == 0) FL_FAIL(FL_ERR_INVALID, "batch_norm: input tensor must have at least one element");
    if (nhwc_pair(x, y)) {
        double *acc = malloc((size_t)(C > 0 ? C : 1) * 6 * sizeof(double));
        if (!acc) FL_FAIL(FL_ERR_OOM, "batch_norm: cannot allocate scratch");
        if (dt == FL_FLOAT32)
            bn_fwd_nhwc_f32((void *)fl_elem(x, x->offset), (void *)fl_elem(y, y->offset), N * S, C, vec_of(w),
                            vec_of(b), vec_of(rm), vec_of(rv), training, momentum, eps, vec_of(smean), vec_of(sinv),
                            acc);
        else
            bn_fwd_nhwc_f64((void *)fl_elem(x, x->offset), (void *)fl_elem(y, y->offset), N * S, C, vec_of(w),
                            vec_of(b), vec_of(rm), vec_of(rv), training, momentum, eps, vec_of(smean), vec_of(sinv),
                            acc);
        free(acc);
        return FL_OK;
    }
    void *xo, *yo;
    const void *xp = fl_lin_pack(x, &xo);
    void *yp = fl_lin_out_buf(y, &yo);
    if (!xp || !yp) { free(xo); free(yo); FL_FAIL(FL_ERR_OOM, "batch_norm: cannot allocate scratch"); }
    if (dt == FL_FLOAT32)
        bn_fwd_f32(xp, yp, N, C, S, vec_of(w), vec_of(b), vec_of(rm), vec_of(rv), training, momentum, eps,
                   vec_of(smean), vec_of(sinv));
    else
        bn_fwd_f64(xp, yp, N, C, S, vec_of(w), vec_of(b), vec_of(rm), vec_of(rv), training, momentum, eps,
                   vec_of(smean), vec_of(sinv));
    free(xo);
    fl_lin_unpack(y, yo);
    return FL_OK;
}

static int bn_backward(const fl_tensor_t *go, const fl_tensor_t *x, const fl_tensor_t *w, const fl_tensor_t *rm,
                       const fl_tensor_t *rv, const fl_tensor_t *smean, const fl_tensor_t *sinv, int train, double eps,
                       const fl_tensor_t *gi, const fl_tensor_t *gw, const fl_tensor_t *gb) {
    int dt = x->dtype;
    if (!fl_lin_float_dt(dt) || go->dtype != dt || x->ndim < 2 || x->ndim > FL_MAX_DIMS || go->ndim != x->ndim)
        return FL_ERR_UNSUPPORTED;
    int64_t N = x->sizes[0], C = x->sizes[1], S = 1;
    for (int d = 2; d < x->ndim; d++) S *= x->sizes[d];
    if (!vec_ok(w, C, dt)) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *mean = train ? smean : rm, *var = train ? sinv : rv;
    if (!mean || !var || !vec_ok(mean, C, dt) || !vec_ok(var, C, dt)) return FL_ERR_UNSUPPORTED;
    if ((gi && gi->dtype != dt) || (gw && (gw->dtype != dt || !vec_ok(gw, C, dt))) ||
        (gb && (gb->dtype != dt || !vec_ok(gb, C, dt))))
        return FL_ERR_UNSUPPORTED;
    if (nhwc_pair(x, go) && (!gi || nhwc_pair(x, gi))) {
        double *acc = malloc((size_t)(C > 0 ? C : 1) * 7 * sizeof(double));
        if (!acc) FL_FAIL(FL_ERR_OOM, "batch_norm_backward: cannot allocate scratch");
        void *gip = gi ? fl_elem(gi, gi->offset) : NULL;
        if (dt == FL_FLOAT32)
            bn_bwd_nhwc_f32((void *)fl_elem(go, go->offset), (void *)fl_elem(x, x->offset), gip, N * S, C,
                            vec_of(w), vec_of(mean), vec_of(var), train, eps, vec_of(gw), vec_of(gb), acc);
        else
            bn_bwd_nhwc_f64((void *)fl_elem(go, go->offset), (void *)fl_elem(x, x->offset), gip, N * S, C,
                            vec_of(w), vec_of(mean), vec_of(var), train, eps, vec_of(gw), vec_of(gb), acc);
        free(acc);
        return FL_OK;
    }
    void *xo, *goo, *gio = NULL;
    const void *xp = fl_lin_pack(x, &xo), *gop = fl_lin_pack(go, &goo);
    void *gip = gi ? fl_lin_out_buf(gi, &gio) : NULL;
    if (!xp || !gop || (gi && !gip)) {
        free(xo); free(goo); free(gio);
        FL_FAIL(FL_ERR_OOM, "batch_norm_backward: cannot allocate scratch");
    }
    if (dt == FL_FLOAT32)
        bn_bwd_f32(gop, xp, gip, N, C, S, vec_of(w), vec_of(mean), vec_of(var), train, eps, vec_of(gw), vec_of(gb));
    else
        bn_bwd_f64(gop, xp, gip, N, C, S, vec_of(w), vec_of(mean), vec_of(var), train, eps, vec_of(gw), vec_of(gb));
    free(xo); free(goo);
    if (gi) fl_lin_unpack(gi, gio);
    return FL_OK;
}

#define T_(k) fl_arg_tensor(args, n_args, (k), in, n_in)
#define O_(k) fl_out_at(out, n_out, (k))

/* native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps) */
int fl_lin_native_batch_norm(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 8 || n_out < 3 || !T_(0)) return FL_ERR_UNSUPPORTED;
    return bn_forward(T_(0), T_(1), T_(2), T_(3), T_(4), (int)args[5].i, fl_lin_num(&args[6], 0.1),
                      fl_lin_num(&args[7], 1e-5), O_(0), O_(1), O_(2));
}
/* _native_batch_norm_legit(input, weight?, bias?, running_mean!, running_var!, training, momentum, eps) */
int fl_lin_bn_legit(FL_KERNEL_ARGS) { return fl_lin_native_batch_norm(stream, device, in, n_in, out, n_out, args, n_args); }
/* _native_batch_norm_legit.no_stats(input, weight?, bias?, training, momentum, eps) */
int fl_lin_bn_legit_no_stats(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 6 || n_out < 3 || !T_(0)) return FL_ERR_UNSUPPORTED;
    return bn_forward(T_(0), T_(1), T_(2), NULL, NULL, 1, fl_lin_num(&args[4], 0.1), fl_lin_num(&args[5], 1e-5),
                      O_(0), O_(1), O_(2));
}
/* _native_batch_norm_legit_no_training(input, weight?, bias?, running_mean, running_var, momentum, eps) */
int fl_lin_bn_legit_no_training(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 7 || n_out < 3 || !T_(0)) return FL_ERR_UNSUPPORTED;
    return bn_forward(T_(0), T_(1), T_(2), T_(3), T_(4), 0, fl_lin_num(&args[5], 0.1), fl_lin_num(&args[6], 1e-5),
                      O_(0), O_(1), O_(2));
}
/* _batch_norm_with_update(input, weight?, bias?, running_mean!, running_var!, momentum, eps)
 *   -> (out, save_mean, save_invstd, reserve) */
int fl_lin_bn_with_update(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 7 || n_out < 3 || !T_(0)) return FL_ERR_UNSUPPORTED;
    return bn_forward(T_(0), T_(1), T_(2), T_(3), T_(4), 1, fl_lin_num(&args[5], 0.1), fl_lin_num(&args[6], 1e-5),
                      O_(0), O_(1), O_(2));
}
/* _batch_norm_no_update(input, weight?, bias?, running_mean?, running_var?, momentum, eps):
 * eval with the running statistics; batch statistics when they are None */
int fl_lin_bn_no_update(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 7 || n_out < 3 || !T_(0)) return FL_ERR_UNSUPPORTED;
    int training = !T_(3) || !T_(4);
    return bn_forward(T_(0), T_(1), T_(2), training ? NULL : T_(3), training ? NULL : T_(4), training,
                      fl_lin_num(&args[5], 0.1), fl_lin_num(&args[6], 1e-5), O_(0), O_(1), O_(2));
}
/* native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
 *                            save_invstd?, train, eps, output_mask) */
int fl_lin_native_batch_norm_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 10 || n_out < 3 || !T_(0) || !T_(1)) return FL_ERR_UNSUPPORTED;
    const fl_arg_t *m = &args[9];
    return bn_backward(T_(0), T_(1), T_(2), T_(3), T_(4), T_(5), T_(6), (int)args[7].i, fl_lin_num(&args[8], 1e-5),
                       mask_bit(m, 0) ? O_(0) : NULL, mask_bit(m, 1) ? O_(1) : NULL, mask_bit(m, 2) ? O_(2) : NULL);
}
/* batch_norm_backward(grad_out, input, weight, running_mean?, running_var?, save_mean?, save_var?,
 *                     update, eps, output_mask, reserve); save_var holds the saved invstd */
int fl_lin_batch_norm_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 11 || n_out < 3 || !T_(0) || !T_(1)) return FL_ERR_UNSUPPORTED;
    const fl_arg_t *m = &args[9];
    return bn_backward(T_(0), T_(1), T_(2), T_(3), T_(4), T_(5), T_(6), (int)args[7].i, fl_lin_num(&args[8], 1e-5),
                       mask_bit(m, 0) ? O_(0) : NULL, mask_bit(m, 1) ? O_(1) : NULL, mask_bit(m, 2) ? O_(2) : NULL);
}

/* ======================================================================
 * layer norm
 * ====================================================================== */

/* native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd) */
int fl_lin_native_layer_norm(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 5 || n_out < 3) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *x = T_(0), *w = T_(2), *b = T_(3), *y = O_(0), *mo = O_(1), *ro = O_(2);
    if (!x || !y || args[1].kind != FL_ARG_INT_LIST) return FL_ERR_UNSUPPORTED;
    int dt = x->dtype, nd = args[1].len;
    if (!fl_lin_float_dt(dt) || y->dtype != dt || x->ndim > FL_MAX_DIMS || nd > x->ndim) return FL_ERR_UNSUPPORTED;
    int64_t M = 1, Nn = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d < x->ndim - nd) M *= x->sizes[d];
        else {
            if (x->sizes[d] != args[1].list[d - (x->ndim - nd)]) FL_FAIL(FL_ERR_INVALID, "layer_norm: normalized_shape does not match the input");
            Nn *= x->sizes[d];
        }
    }
    if ((w && (w->dtype != dt || fl_numel(w) != Nn)) || (b && (b->dtype != dt || fl_numel(b) != Nn)) ||
        (mo && (mo->dtype != dt || fl_numel(mo) != M)) || (ro && (ro->dtype != dt || fl_numel(ro) != M)))
        return FL_ERR_UNSUPPORTED;
    void *xo = NULL, *wo = NULL, *bo = NULL, *yo = NULL, *moo = NULL, *roo = NULL;
    const void *xp = fl_lin_pack(x, &xo), *wp = w ? fl_lin_pack(w, &wo) : NULL, *bp = b ? fl_lin_pack(b, &bo) : NULL;
    void *yp = fl_lin_out_buf(y, &yo), *mp = mo ? fl_lin_out_buf(mo, &moo) : NULL, *rp = ro ? fl_lin_out_buf(ro, &roo) : NULL;
    if (!xp || (w && !wp) || (b && !bp) || !yp || (mo && !mp) || (ro && !rp)) {
        free(xo); free(wo); free(bo); free(yo); free(moo); free(roo);
        FL_FAIL(FL_ERR_OOM, "layer_norm: cannot allocate scratch");
    }
    double eps = fl_lin_num(&args[4], 1e-5);
    if (dt == FL_FLOAT32) ln_fwd_f32(xp, wp, bp, yp, mp, rp, M, Nn, eps);
    else ln_fwd_f64(xp, wp, bp, yp, mp, rp, M, Nn, eps);
    free(xo); free(wo); free(bo);
    fl_lin_unpack(y, yo);
    if (mo) fl_lin_unpack(mo, moo);
    if (ro) fl_lin_unpack(ro, roo);
    return FL_OK;
}

/* native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask) */
int fl_lin_native_layer_norm_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 8 || n_out < 3) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *go = T_(0), *x = T_(1), *mean = T_(3), *rstd = T_(4), *w = T_(5);
    if (!go || !x || !mean || !rstd || args[2].kind != FL_ARG_INT_LIST) return FL_ERR_UNSUPPORTED;
    const fl_arg_t *m = &args[7];
    const fl_tensor_t *gi = mask_bit(m, 0) ? O_(0) : NULL, *gw = mask_bit(m, 1) ? O_(1) : NULL,
                      *gb = mask_bit(m, 2) ? O_(2) : NULL;
    int dt = x->dtype, nd = args[2].len;
    if (!fl_lin_float_dt(dt) || go->dtype != dt || x->ndim > FL_MAX_DIMS || nd > x->ndim) return FL_ERR_UNSUPPORTED;
    int64_t M = 1, Nn = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d < x->ndim - nd) M *= x->sizes[d];
        else Nn *= x->sizes[d];
    }
    if (fl_numel(go) != M * Nn || mean->dtype != dt || rstd->dtype != dt || fl_numel(mean) != M || fl_numel(rstd) != M ||
        (w && (w->dtype != dt || fl_numel(w) != Nn)) || (gi && gi->dtype != dt) ||
        (gw && (gw->dtype != dt || fl_numel(gw) != Nn)) || (gb && (gb->dtype != dt || fl_numel(gb) != Nn)))
        return FL_ERR_UNSUPPORTED;
    void *goo = NULL, *xo = NULL, *mo = NULL, *ro = NULL, *wo = NULL, *gio = NULL, *gwo = NULL, *gbo = NULL;
    const void *gop = fl_lin_pack(go, &goo), *xp = fl_lin_pack(x, &xo), *mp = fl_lin_pack(mean, &mo),
               *rp = fl_lin_pack(rstd, &ro), *wp = w ? fl_lin_pack(w, &wo) : NULL;
    void *gip = gi ? fl_lin_out_buf(gi, &gio) : NULL, *gwp = gw ? fl_lin_out_buf(gw, &gwo) : NULL,
         *gbp = gb ? fl_lin_out_buf(gb, &gbo) : NULL;
    int st = FL_OK;
    if (!gop || !xp || !mp || !rp || (w && !wp) || (gi && !gip) || (gw && !gwp) || (gb && !gbp)) {
        st = FL_ERR_OOM;
        fl_host_set_error("layer_norm_backward: cannot allocate scratch");
    } else if (dt == FL_FLOAT32) {
        st = ln_bwd_f32(gop, xp, mp, rp, wp, gip, gwp, gbp, M, Nn);
    } else {
        st = ln_bwd_f64(gop, xp, mp, rp, wp, gip, gwp, gbp, M, Nn);
    }
    free(goo); free(xo); free(mo); free(ro); free(wo);
    return fl_lin_finish_grads(st, (const fl_tensor_t *const[3]){gi, gw, gb}, (void *[3]){gio, gwo, gbo});
}

/* ======================================================================
 * group norm
 * ====================================================================== */

/* native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean (N,G), rstd (N,G)) */
int fl_lin_native_group_norm(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 8 || n_out < 3) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *x = T_(0), *w = T_(1), *b = T_(2), *y = O_(0), *mo = O_(1), *ro = O_(2);
    if (!x || !y) return FL_ERR_UNSUPPORTED;
    int dt = x->dtype;
    int64_t N = args[3].i, C = args[4].i, HW = args[5].i, G = args[6].i;
    if (!fl_lin_float_dt(dt) || y->dtype != dt || x->ndim > FL_MAX_DIMS) return FL_ERR_UNSUPPORTED;
    if (G <= 0 || C % G || fl_numel(x) != N * C * HW) FL_FAIL(FL_ERR_INVALID, "group_norm: bad N/C/HxW/group");
    if ((w && (w->dtype != dt || fl_numel(w) != C)) || (b && (b->dtype != dt || fl_numel(b) != C)) ||
        (mo && (mo->dtype != dt || fl_numel(mo) != N * G)) || (ro && (ro->dtype != dt || fl_numel(ro) != N * G)))
        return FL_ERR_UNSUPPORTED;
    void *xo = NULL, *wo = NULL, *bo = NULL, *yo = NULL, *moo = NULL, *roo = NULL;
    const void *xp = fl_lin_pack(x, &xo), *wp = w ? fl_lin_pack(w, &wo) : NULL, *bp = b ? fl_lin_pack(b, &bo) : NULL;
    void *yp = fl_lin_out_buf(y, &yo), *mp = mo ? fl_lin_out_buf(mo, &moo) : NULL, *rp = ro ? fl_lin_out_buf(ro, &roo) : NULL;
    if (!xp || (w && !wp) || (b && !bp) || !yp || (mo && !mp) || (ro && !rp)) {
        free(xo); free(wo); free(bo); free(yo); free(moo); free(roo);
        FL_FAIL(FL_ERR_OOM, "group_norm: cannot allocate scratch");
    }
    double eps = fl_lin_num(&args[7], 1e-5);
    if (dt == FL_FLOAT32) gn_fwd_f32(xp, wp, bp, yp, mp, rp, N, C, HW, G, eps);
    else gn_fwd_f64(xp, wp, bp, yp, mp, rp, N, C, HW, G, eps);
    free(xo); free(wo); free(bo);
    fl_lin_unpack(y, yo);
    if (mo) fl_lin_unpack(mo, moo);
    if (ro) fl_lin_unpack(ro, roo);
    return FL_OK;
}

/* native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group, output_mask) */
int fl_lin_native_group_norm_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 10 || n_out < 3) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *go = T_(0), *x = T_(1), *mean = T_(2), *rstd = T_(3), *w = T_(4);
    if (!go || !x || !mean || !rstd) return FL_ERR_UNSUPPORTED;
    const fl_arg_t *m = &args[9];
    const fl_tensor_t *gi = mask_bit(m, 0) ? O_(0) : NULL, *gw = mask_bit(m, 1) ? O_(1) : NULL,
                      *gb = mask_bit(m, 2) ? O_(2) : NULL;
    int dt = x->dtype;
    int64_t N = args[5].i, C = args[6].i, HW = args[7].i, G = args[8].i;
    if (!fl_lin_float_dt(dt) || go->dtype != dt || x->ndim > FL_MAX_DIMS) return FL_ERR_UNSUPPORTED;
    if (G <= 0 || C % G || fl_numel(x) != N * C * HW || fl_numel(go) != N * C * HW)
        FL_FAIL(FL_ERR_INVALID, "group_norm_backward: bad N/C/HxW/group");
    if (mean->dtype != dt || rstd->dtype != dt || fl_numel(mean) != N * G || fl_numel(rstd) != N * G ||
        (w && (w->dtype != dt || fl_numel(w) != C)) || (gi && gi->dtype != dt) ||
        (gw && (gw->dtype != dt || fl_numel(gw) != C)) || (gb && (gb->dtype != dt || fl_numel(gb) != C)))
        return FL_ERR_UNSUPPORTED;
    void *goo = NULL, *xo = NULL, *mo = NULL, *ro = NULL, *wo = NULL, *gio = NULL, *gwo = NULL, *gbo = NULL;
    const void *gop = fl_lin_pack(go, &goo), *xp = fl_lin_pack(x, &xo), *mp = fl_lin_pack(mean, &mo),
               *rp = fl_lin_pack(rstd, &ro), *wp = w ? fl_lin_pack(w, &wo) : NULL;
    void *gip = gi ? fl_lin_out_buf(gi, &gio) : NULL, *gwp = gw ? fl_lin_out_buf(gw, &gwo) : NULL,
         *gbp = gb ? fl_lin_out_buf(gb, &gbo) : NULL;
    int st = FL_OK;
    if (!gop || !xp || !mp || !rp || (w && !wp) || (gi && !gip) || (gw && !gwp) || (gb && !gbp)) {
        st = FL_ERR_OOM;
        fl_host_set_error("group_norm_backward: cannot allocate scratch");
    } else if (dt == FL_FLOAT32) {
        st = gn_bwd_f32(gop, xp, mp, rp, wp, gip, gwp, gbp, N, C, HW, G);
    } else {
        st = gn_bwd_f64(gop, xp, mp, rp, wp, gip, gwp, gbp, N, C, HW, G);
    }
    free(goo); free(xo); free(mo); free(ro); free(wo);
    return fl_lin_finish_grads(st, (const fl_tensor_t *const[3]){gi, gw, gb}, (void *[3]){gio, gwo, gbo});
}

#else /* ======================= typed section (LIN_T) ======================= */

#define T LIN_T
#define F(name) LIN_CAT(name, LIN_CAT(_, LIN_S))
#define V(v, c) (((T *)(v).p)[(c) * (v).s])

LIN_CLONES static double F(sum)(const T *p, int64_t n) {
    double a = 0.0;
#pragma omp simd reduction(+ : a)
    for (int64_t i = 0; i < n; i++) a += p[i];
    return a;
}
LIN_CLONES static double F(sqdev)(const T *p, int64_t n, double mean) {
    double a = 0.0;
#pragma omp simd reduction(+ : a)
    for (int64_t i = 0; i < n; i++) { double d = p[i] - mean; a += d * d; }
    return a;
}
/* y = (x - center) * alpha + beta: centred first, so a near-constant channel gives exact zeros */
LIN_CLONES static void F(affine)(const T *x, T *y, int64_t n, T center, T alpha, T beta) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - center) * alpha + beta;
}
/* Channel c's normalisation, both layouts' forward: in training from its batch mean and sum of squared
 * deviations over cnt values (the running statistics updated), else from the running statistics; the saved
 * statistics stored; y = (x - center) * alpha + beta returned through the last three. */
static void F(bn_channel)(int64_t c, int training, double mean, double sqdev, int64_t cnt, vec_t w, vec_t b,
                          vec_t rm, vec_t rv, double momentum, double eps, vec_t smean, vec_t sinv, T *center,
                          T *alpha, T *beta) {
    double invstd;
    if (training) {
        invstd = 1.0 / sqrt(sqdev / (double)cnt + eps);
        if (rm.p) V(rm, c) = (T)((1.0 - momentum) * V(rm, c) + momentum * mean);
        if (rv.p) V(rv, c) = (T)((1.0 - momentum) * V(rv, c) + momentum * (sqdev / (double)(cnt - 1)));
    } else {
        mean = V(rm, c);
        invstd = 1.0 / sqrt((double)V(rv, c) + eps);
    }
    if (smean.p) V(smean, c) = (T)mean;
    if (sinv.p) V(sinv, c) = (T)invstd;
    double wc = w.p ? (double)V(w, c) : 1.0, bc = b.p ? (double)V(b, c) : 0.0;
    *center = (T)mean; *alpha = (T)(invstd * wc); *beta = (T)bc;
}

static void F(bn_fwd)(const T *x, T *y, int64_t N, int64_t C, int64_t S, vec_t w, vec_t b, vec_t rm, vec_t rv,
                      int training, double momentum, double eps, vec_t smean, vec_t sinv) {
#pragma omp parallel for schedule(dynamic, 1) if (N * C * S > 16384)
    for (int64_t c = 0; c < C; c++) {
        double mean = 0.0, v = 0.0;
        if (training) {
            double s = 0.0;
            for (int64_t n = 0; n < N; n++) s += F(sum)(x + (n * C + c) * S, S);
            mean = s / (double)(N * S);
            for (int64_t n = 0; n < N; n++) v += F(sqdev)(x + (n * C + c) * S, S, mean);
        }
        T center, alpha, beta;
        F(bn_channel)(c, training, mean, v, N * S, w, b, rm, rv, momentum, eps, smean, sinv, &center, &alpha, &beta);
        for (int64_t n = 0; n < N; n++) F(affine)(x + (n * C + c) * S, y + (n * C + c) * S, S, center, alpha, beta);
    }
}

/* One channel of the batch norm backward: the two sums, then grad_input. */
LIN_CLONES static void F(bn_bwd_channel)(const T *go, const T *x, T *gi, int64_t N, int64_t C, int64_t S, int64_t c,
                                         double mean, double invstd, double wc, int train, int need_dots,
                                         double *sg_out, double *sgx_out) {
    double sg = 0.0, sgx = 0.0;
    if (need_dots)
        for (int64_t n = 0; n < N; n++) {
            const T *g = go + (n * C + c) * S, *xp = x + (n * C + c) * S;
            double a = 0.0, b = 0.0;
#pragma omp simd reduction(+ : a, b)
            for (int64_t i = 0; i < S; i++) { a += g[i]; b += g[i] * (xp[i] - mean); }
            sg += a; sgx += b;
        }
    *sg_out = sg; *sgx_out = sgx;
    if (!gi) return;
    if (train) {
        double cnt = (double)(N * S);
        T k = (T)(sgx * invstd * invstd / cnt), gm = (T)(sg / cnt), m = (T)mean, sc = (T)(invstd * wc);
        for (int64_t n = 0; n < N; n++) {
            const T *g = go + (n * C + c) * S, *xp = x + (n * C + c) * S;
            T *d = gi + (n * C + c) * S;
#pragma omp simd
            for (int64_t i = 0; i < S; i++) d[i] = (g[i] - gm - (xp[i] - m) * k) * sc;
        }
    } else {
        T sc = (T)(invstd * wc);
        for (int64_t n = 0; n < N; n++) {
            const T *g = go + (n * C + c) * S;
            T *d = gi + (n * C + c) * S;
#pragma omp simd
            for (int64_t i = 0; i < S; i++) d[i] = g[i] * sc;
        }
    }
}

static void F(bn_bwd)(const T *go, const T *x, T *gi, int64_t N, int64_t C, int64_t S, vec_t w, vec_t mean_v,
                      vec_t var_v, int train, double eps, vec_t gw, vec_t gb) {
    const int need_dots = train || gw.p || gb.p;
#pragma omp parallel for schedule(static) if (N * C * S > 16384)
    for (int64_t c = 0; c < C; c++) {
        double mean = V(mean_v, c);
        double invstd = train ? (double)V(var_v, c) : 1.0 / sqrt((double)V(var_v, c) + eps);
        double wc = w.p ? (double)V(w, c) : 1.0;
        double sg, sgx;
        F(bn_bwd_channel)(go, x, gi, N, C, S, c, mean, invstd, wc, train, need_dots, &sg, &sgx);
        if (gw.p) V(gw, c) = (T)(sgx * invstd);
        if (gb.p) V(gb, c) = (T)sg;
    }
}

/* Channels-last batch norm: x (and y, go, gi) dense as M = N*H*W rows of C channels, read where they are
 * (the NCHW kernels above need a transposing pack of each input and an unpack of each output). Per-channel
 * sums accumulate in double across the rows, vectorised over the channels; the per-element formulas are the
 * NCHW kernels'. acc: 6*C doubles of scratch (7*C for the backward). */
static void F(bn_fwd_nhwc)(const T *x, T *y, int64_t M, int64_t C, vec_t w, vec_t b, vec_t rm, vec_t rv,
                           int training, double momentum, double eps, vec_t smean, vec_t sinv, double *acc) {
    double *mean = acc, *var = acc + C;
    T *center = (T *)(acc + 2 * C), *alpha = (T *)(acc + 3 * C), *beta = (T *)(acc + 4 * C);
    for (int64_t c = 0; c < C; c++) mean[c] = var[c] = 0.0;
    if (training) {
        for (int64_t r = 0; r < M; r++) {
            const T *row = x + r * C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) mean[c] += row[c];
        }
        for (int64_t c = 0; c < C; c++) mean[c] /= (double)M;
        for (int64_t r = 0; r < M; r++) {
            const T *row = x + r * C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) { double d = row[c] - mean[c]; var[c] += d * d; }
        }
    }
    for (int64_t c = 0; c < C; c++)
        F(bn_channel)(c, training, mean[c], var[c], M, w, b, rm, rv, momentum, eps, smean, sinv, &center[c], &alpha[c],
                      &beta[c]);
#pragma omp parallel for schedule(static) if (M * C > 16384)
    for (int64_t r = 0; r < M; r++) {
        const T *xr = x + r * C;
        T *yr = y + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - center[c]) * alpha[c] + beta[c];
    }
}

static void F(bn_bwd_nhwc)(const T *go, const T *x, T *gi, int64_t M, int64_t C, vec_t w, vec_t mean_v,
                           vec_t var_v, int train, double eps, vec_t gw, vec_t gb, double *acc) {
    double *sg = acc, *sgx = acc + C;
    T *k = (T *)(acc + 2 * C), *gm = (T *)(acc + 3 * C), *m = (T *)(acc + 4 * C), *sc = (T *)(acc + 5 * C);
    double *mu = acc + 6 * C;
    for (int64_t c = 0; c < C; c++) { sg[c] = sgx[c] = 0.0; mu[c] = V(mean_v, c); }
    if (train || gw.p || gb.p)
        for (int64_t r = 0; r < M; r++) {
            const T *g = go + r * C, *xr = x + r * C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) { sg[c] += g[c]; sgx[c] += g[c] * (xr[c] - mu[c]); }
        }
    double cnt = (double)M;
    for (int64_t c = 0; c < C; c++) {
        double mean = mu[c], invstd = train ? (double)V(var_v, c) : 1.0 / sqrt((double)V(var_v, c) + eps);
        double wc = w.p ? (double)V(w, c) : 1.0;
        if (gw.p) V(gw, c) = (T)(sgx[c] * invstd);
        if (gb.p) V(gb, c) = (T)sg[c];
        T kc = (T)(sgx[c] * invstd * invstd / cnt);
        k[c] = kc; gm[c] = (T)(sg[c] / cnt); m[c] = (T)mean; sc[c] = (T)(invstd * wc);
    }
    if (!gi) return;
#pragma omp parallel for schedule(static) if (M * C > 16384)
    for (int64_t r = 0; r < M; r++) {
        const T *g = go + r * C, *xr = x + r * C;
        T *d = gi + r * C;
        if (train) {
#pragma omp simd
            for (int64_t c = 0; c < C; c++) d[c] = (g[c] - gm[c] - (xr[c] - m[c]) * k[c]) * sc[c];
        } else {
#pragma omp simd
            for (int64_t c = 0; c < C; c++) d[c] = g[c] * sc[c];
        }
    }
}

LIN_CLONES static void F(ln_row)(const T *xp, const T *w, const T *b, T *yp, int64_t Nn, double eps, double *mo,
                                 double *ro) {
    double mean, rstd;
    if (Nn == 0) { mean = 0.0; rstd = NAN; }
    else {
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < Nn; i++) s += xp[i];
        mean = s / (double)Nn;
        double v = 0.0;
#pragma omp simd reduction(+ : v)
        for (int64_t i = 0; i < Nn; i++) { double d = xp[i] - mean; v += d * d; }
        rstd = 1.0 / sqrt(v / (double)Nn + eps);
    }
    *mo = mean; *ro = rstd;
    /* (x - mean) * rstd, not x * rstd - mean * rstd: with a near-constant row (variance ~ 0, rstd
     * ~ 1/sqrt(eps)) the folded form leaves rounding noise of |x| * rstd * ulp where PyTorch gives 0 */
    T a = (T)rstd, m = (T)mean;
    if (w && b) {
#pragma omp simd
        for (int64_t i = 0; i < Nn; i++) yp[i] = ((xp[i] - m) * a) * w[i] + b[i];
    } else if (w) {
#pragma omp simd
        for (int64_t i = 0; i < Nn; i++) yp[i] = ((xp[i] - m) * a) * w[i];
    } else if (b) {
#pragma omp simd
        for (int64_t i = 0; i < Nn; i++) yp[i] = (xp[i] - m) * a + b[i];
    } else {
#pragma omp simd
        for (int64_t i = 0; i < Nn; i++) yp[i] = (xp[i] - m) * a;
    }
}

static void F(ln_fwd)(const T *x, const T *w, const T *b, T *y, T *mo, T *ro, int64_t M, int64_t Nn, double eps) {
#pragma omp parallel for schedule(static) if (M * Nn > 16384)
    for (int64_t r = 0; r < M; r++) {
        double mean, rstd;
        F(ln_row)(x + r * Nn, w, b, y + r * Nn, Nn, eps, &mean, &rstd);
        if (mo) mo[r] = (T)mean;
        if (ro) ro[r] = (T)rstd;
    }
}

/* one row of the layer norm backward; aw/ab (may be NULL) accumulate the
 * weight/bias gradients */
/* fp-contract off: an FMA fusing g*w - mean(gw) would skip the product's rounding that mean(gw) carries,
 * and leave |g*w| * ulp * rstd of noise on a near-constant row, where the exact answer is 0 */
__attribute__((optimize("fp-contract=off")))
LIN_CLONES static void F(ln_bwd_row)(const T *g, const T *xp, const T *w, double mu, double rs, T *d, double *aw,
                                     double *ab, int64_t Nn) {
    if (d) {
        /* d = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), xhat = (x - mean) * rstd, every term centred:
         * a near-constant row then gives exact zeros where a folded a*g + b*x + c form leaves noise */
        double sg = 0.0, sgx = 0.0;
        if (w) {
#pragma omp simd reduction(+ : sg, sgx)
            for (int64_t i = 0; i < Nn; i++) { double gw_ = (double)(T)(g[i] * w[i]); sg += gw_; sgx += gw_ * (xp[i] - mu); }
        } else {
#pragma omp simd reduction(+ : sg, sgx)
            for (int64_t i = 0; i < Nn; i++) { sg += g[i]; sgx += (double)g[i] * (xp[i] - mu); }
        }
        double s = 1.0 / (double)Nn;
        T r = (T)rs, m = (T)mu, mg = (T)(sg * s), k = (T)(sgx * s * rs * rs);
        if (w) {
#pragma omp simd
            for (int64_t i = 0; i < Nn; i++) d[i] = r * (g[i] * w[i] - mg - (xp[i] - m) * k);
        } else {
#pragma omp simd
            for (int64_t i = 0; i < Nn; i++) d[i] = r * (g[i] - mg - (xp[i] - m) * k);
        }
    }
    if (aw) {
        T m = (T)mu, r = (T)rs;
#pragma omp simd
        for (int64_t i = 0; i < Nn; i++) {
            aw[i] += (double)(g[i] * ((xp[i] - m) * r));
            ab[i] += g[i];
        }
    }
}

static int F(ln_bwd)(const T *go, const T *x, const T *mean, const T *rstd, const T *w, T *gi, T *gw, T *gb,
                     int64_t M, int64_t Nn) {
    int nt = fl_lin_team_size();
    double *acc = NULL;
    if (gw || gb) {
        acc = calloc((size_t)(2 * nt * (Nn > 0 ? Nn : 1)), sizeof(double));
        if (!acc) FL_FAIL(FL_ERR_OOM, "layer_norm_backward: cannot allocate scratch");
    }
#pragma omp parallel if (M * Nn > 16384)
    {
        int tid = fl_lin_thread_id();
        double *aw = acc ? acc + (size_t)(2 * tid) * (size_t)Nn : NULL, *ab = acc ? aw + Nn : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < M; r++)
            F(ln_bwd_row)(go + r * Nn, x + r * Nn, w, mean[r], rstd[r], gi ? gi + r * Nn : NULL, aw, ab, Nn);
    }
    if (acc) {
#pragma omp parallel for schedule(static) if (Nn * nt > 16384)
        for (int64_t i = 0; i < Nn; i++) {
            double sw = 0.0, sb = 0.0;
            for (int t = 0; t < nt; t++) { sw += acc[(size_t)(2 * t) * (size_t)Nn + i]; sb += acc[(size_t)(2 * t + 1) * (size_t)Nn + i]; }
            if (gw) gw[i] = (T)sw;
            if (gb) gb[i] = (T)sb;
        }
        free(acc);
    }
    return FL_OK;
}

static void F(gn_fwd)(const T *x, const T *w, const T *b, T *y, T *mo, T *ro, int64_t N, int64_t C, int64_t HW,
                      int64_t G, double eps) {
    const int64_t D = C / G, L = D * HW;
#pragma omp parallel for schedule(dynamic, 1) if (N * C * HW > 16384)
    for (int64_t ng = 0; ng < N * G; ng++) {
        const T *xp = x + ng * L;
        T *yp = y + ng * L;
        double mean = 0.0, rstd = NAN;
        if (L > 0) {
            mean = F(sum)(xp, L) / (double)L;
            rstd = 1.0 / sqrt(F(sqdev)(xp, L, mean) / (double)L + eps);
        }
        if (mo) mo[ng] = (T)mean;
        if (ro) ro[ng] = (T)rstd;
        int64_t g = ng % G;
        for (int64_t d = 0; d < D; d++) {
            int64_t c = g * D + d;
            double wc = w ? (double)w[c] : 1.0, bc = b ? (double)b[c] : 0.0;
            T a = (T)(rstd * wc), bt = (T)bc, m = (T)mean;
            const T *xs = xp + d * HW;
            T *ys = yp + d * HW;
#pragma omp simd
            for (int64_t i = 0; i < HW; i++) ys[i] = (xs[i] - m) * a + bt;
        }
    }
}

static int F(gn_bwd)(const T *go, const T *x, const T *mean, const T *rstd, const T *w, T *gi, T *gw, T *gb,
                     int64_t N, int64_t C, int64_t HW, int64_t G) {
    const int64_t D = C / G;
    /* per (n, c): ds = sum g*x, db = sum g */
    double *ds = malloc((size_t)(2 * (N * C > 0 ? N * C : 1)) * sizeof(double));
    if (!ds) FL_FAIL(FL_ERR_OOM, "group_norm_backward: cannot allocate scratch");
    double *db = ds + N * C;
#pragma omp parallel for schedule(static) if (N * C * HW > 16384)
    for (int64_t nc = 0; nc < N * C; nc++) {
        const T *g = go + nc * HW, *xp = x + nc * HW;
        double a = 0.0, b = 0.0;
#pragma omp simd reduction(+ : a, b)
        for (int64_t i = 0; i < HW; i++) { a += (double)g[i] * xp[i]; b += g[i]; }
        ds[nc] = a; db[nc] = b;
    }
    if (gi) {
        const double s = 1.0 / (double)(D * HW);
#pragma omp parallel for schedule(static) if (N * C * HW > 16384)
        for (int64_t ng = 0; ng < N * G; ng++) {
            int64_t n = ng / G, g = ng % G;
            double mu = mean[ng], rs = rstd[ng], s1 = 0.0, s2 = 0.0;
            for (int64_t d = 0; d < D; d++) {
                int64_t c = g * D + d;
                double wc = w ? (double)w[c] : 1.0;
                s1 += ds[n * C + c] * wc;
                s2 += db[n * C + c] * wc;
            }
            double bb = (s2 * mu - s1) * rs * rs * rs * s;
            double cc = -bb * mu - s2 * rs * s;
            for (int64_t d = 0; d < D; d++) {
                int64_t c = g * D + d;
                T a = (T)(rs * (w ? (double)w[c] : 1.0)), bt = (T)bb, ct = (T)cc;
                const T *gp = go + (n * C + c) * HW, *xp = x + (n * C + c) * HW;
                T *dp = gi + (n * C + c) * HW;
#pragma omp simd
                for (int64_t i = 0; i < HW; i++) dp[i] = a * gp[i] + bt * xp[i] + ct;
            }
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double sw = 0.0, sb = 0.0;
        for (int64_t n = 0; n < N; n++) {
            int64_t ng = n * G + c / D;
            sw += (ds[n * C + c] - db[n * C + c] * (double)mean[ng]) * (double)rstd[ng];
            sb += db[n * C + c];
        }
        if (gw) gw[c] = (T)sw;
        if (gb) gb[c] = (T)sb;
    }
    free(ds);
    return FL_OK;
}

#undef V
#undef T
#undef F
#endif
