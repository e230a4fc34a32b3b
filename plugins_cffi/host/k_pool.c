/* Host kernels: pooling. Serves every pooling op and its backward:
 * max_pool2d_with_indices, avg_pool2d, _adaptive_avg_pool2d (float16/bfloat16
 * through float32 copies), max_pool3d_with_indices, avg_pool3d,
 * adaptive_max_pool2d/3d, _adaptive_avg_pool3d, fractional_max_pool2d/3d, and
 * max_unpool2d/3d.
 *
 * 2-D pooling works on (N, C, H, W) or (C, H, W) in the input's own type:
 * every (plane, output row) pair is independent, so the loops run over them in
 * parallel; the backward passes run over planes (a plane's gradient is
 * accumulated by one thread). Non-contiguous tensors go through packed copies.
 * The other ops see their tensor as planes x (D, H, W) in float64 scratch
 * (k_nn.h), as the other nn files' ops do. Semantics mirror ATen's CPU kernels: NaN wins
 * in max pooling, the first maximum in window order wins, indices are flat
 * within a plane (d*H*W + h*W + w).
 *
 * This file includes itself once per element type for the typed section. */
#ifndef LIN_T

#include "k_linalg.h"
#include "k_nn.h"

typedef struct {
    int64_t planes, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int count_include_pad;
    int64_t divisor; /* 0: none */
} pool_t;

static inline int64_t start_index(int64_t a, int64_t b, int64_t c) { return (a * c) / b; }
static inline int64_t end_index(int64_t a, int64_t b, int64_t c) { return ((a + 1) * c + b - 1) / b; }

#define LIN_SELF "k_pool.c"
#include "k_linalg_typed.h"


/* an int[2] argument: [] -> dflt (a pair), [a] -> (a, a), [a, b] */
static int pair(const fl_arg_t *a, const int64_t *dflt, int64_t v[2]) {
    if (a->kind == FL_ARG_INT) { v[0] = v[1] = a->i; return 1; }
    if (a->kind != FL_ARG_INT_LIST) return 0;
    if (a->len == 0) { if (!dflt) return 0; v[0] = dflt[0]; v[1] = dflt[1]; return 1; }
    if (a->len == 1) { v[0] = v[1] = a->list[0]; return 1; }
    if (a->len == 2) { v[0] = a->list[0]; v[1] = a->list[1]; return 1; }
    return 0;
}

/* Geometry from the input (x, in input space) and an output-space tensor y. */
static int geom(pool_t *p, const fl_tensor_t *x, const fl_tensor_t *y) {
    if (x->ndim != 3 && x->ndim != 4) return FL_ERR_UNSUPPORTED;
    if (y->ndim != x->ndim) return FL_ERR_UNSUPPORTED;
    int nd = x->ndim;
    p->planes = 1;
    for (int d = 0; d < nd - 2; d++) {
        if (y->sizes[d] != x->sizes[d]) FL_FAIL(FL_ERR_INVALID, "pool: batch/channel sizes differ");
        p->planes *= x->sizes[d];
    }
    p->H = x->sizes[nd - 2]; p->W = x->sizes[nd - 1];
    p->OH = y->sizes[nd - 2]; p->OW = y->sizes[nd - 1];
    return FL_OK;
}

static int window_args(pool_t *p, const fl_arg_t *args, int n_args, int ak, int with_dilation) {
    int64_t k[2], s[2], pd[2], dl[2] = {1, 1};
    static const int64_t zero[2] = {0, 0}, one[2] = {1, 1};
    if (n_args <= ak + 2 || !pair(&args[ak], NULL, k) || !pair(&args[ak + 1], k, s) || !pair(&args[ak + 2], zero, pd))
        return FL_ERR_UNSUPPORTED;
    if (with_dilation && (n_args <= ak + 3 || !pair(&args[ak + 3], one, dl))) return FL_ERR_UNSUPPORTED;
    if (k[0] < 1 || k[1] < 1 || s[0] < 1 || s[1] < 1 || pd[0] < 0 || pd[1] < 0 || dl[0] < 1 || dl[1] < 1)
        FL_FAIL(FL_ERR_INVALID, "pool: bad kernel_size/stride/padding/dilation");
    p->kh = k[0]; p->kw = k[1]; p->sh = s[0]; p->sw = s[1]; p->ph = pd[0]; p->pw = pd[1]; p->dh = dl[0]; p->dw = dl[1];
    return FL_OK;
}

#define T_(k) fl_arg_tensor(args, n_args, (k), in, n_in)

/* max_pool2d_with_indices(self, kernel_size, stride=[], padding=0, dilation=1, ceil_mode=False) */
int fl_lin_max_pool2d(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = T_(0), *y = fl_out_at(out, n_out, 0), *ind = fl_out_at(out, n_out, 1);
    if (!x || !y || !fl_lin_float_dt(x->dtype) || y->dtype != x->dtype || (ind && ind->dtype != FL_INT64)) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, x, y);
    if (!st) st = window_args(&p, args, n_args, 1, 1);
    if (st) return st;
    if (ind && fl_numel(ind) != fl_numel(y)) return FL_ERR_UNSUPPORTED;
    if (fl_is_channels_last(x) && fl_is_channels_last(y) && !fl_is_contiguous(y) && (!ind || fl_is_channels_last(ind))) {
        /* channels-last in and out (torch.compile's layout pass): pooled in place, no transposes */
        const int64_t N = x->sizes[0], C = x->sizes[1];
        int64_t *ip = ind ? (int64_t *)fl_elem(ind, ind->offset) : NULL;
        if (x->dtype == FL_FLOAT32)
            maxpool_nhwc_f32(&p, N, C, (const float *)fl_elem(x, x->offset), (float *)fl_elem(y, y->offset), ip);
        else
            maxpool_nhwc_f64(&p, N, C, (const double *)fl_elem(x, x->offset), (double *)fl_elem(y, y->offset), ip);
        return FL_OK;
    }
    void *xo, *yo, *io = NULL;
    const void *xp = fl_lin_pack(x, &xo);
    void *yp = fl_lin_out_buf(y, &yo), *ip = ind ? fl_lin_out_buf(ind, &io) : NULL;
    if (!xp || !yp || (ind && !ip)) { free(xo); free(yo); free(io); FL_FAIL(FL_ERR_OOM, "max_pool2d: cannot allocate scratch"); }
    if (x->dtype == FL_FLOAT32) maxpool_fwd_f32(&p, xp, yp, ip);
    else maxpool_fwd_f64(&p, xp, yp, ip);
    free(xo);
    fl_lin_unpack(y, yo);
    if (ind) fl_lin_unpack(ind, io);
    return FL_OK;
}

/* max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices) */
int fl_lin_max_pool2d_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *go = T_(0), *x = T_(1), *ind = T_(7), *gi = fl_out_at(out, n_out, 0);
    if (!go || !x || !ind || !gi || !fl_lin_float_dt(go->dtype) || gi->dtype != go->dtype || ind->dtype != FL_INT64)
        return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, gi, go);
    if (st) return st;
    if (fl_numel(ind) != fl_numel(go)) FL_FAIL(FL_ERR_INVALID, "max_pool2d_backward: indices shape");
    void *goo, *io, *gio;
    const void *gop = fl_lin_pack(go, &goo), *ip = fl_lin_pack(ind, &io);
    void *gip = fl_lin_out_buf(gi, &gio);
    if (!gop || !ip || !gip) { free(goo); free(io); free(gio); FL_FAIL(FL_ERR_OOM, "max_pool2d_backward: cannot allocate scratch"); }
    if (go->dtype == FL_FLOAT32) maxpool_bwd_f32(&p, gop, ip, gip);
    else maxpool_bwd_f64(&p, gop, ip, gip);
    free(goo); free(io);
    fl_lin_unpack(gi, gio);
    return FL_OK;
}

static int avg_args(pool_t *p, const fl_arg_t *args, int n_args, int ak) {
    int st = window_args(p, args, n_args, ak, 0);
    if (st) return st;
    if (n_args <= ak + 5) return FL_ERR_UNSUPPORTED;
    p->count_include_pad = args[ak + 4].i != 0;
    p->divisor = args[ak + 5].kind == FL_ARG_INT ? args[ak + 5].i : 0;
    if (args[ak + 5].kind == FL_ARG_INT && p->divisor == 0) FL_FAIL(FL_ERR_INVALID, "avg_pool2d: divisor must be not zero");
    return FL_OK;
}

/* One float32/float64 pooling pass from src to dst through packed buffers (the
 * average and adaptive-average kernels, forward and backward). */
typedef void (*pool_pass_fn)(const pool_t *, const void *, void *);
static int pool_pass(const pool_t *p, const fl_tensor_t *src, const fl_tensor_t *dst, pool_pass_fn f32,
                     pool_pass_fn f64, const char *name) {
    void *so, *dso;
    const void *sp = fl_lin_pack(src, &so);
    void *dp = fl_lin_out_buf(dst, &dso);
    if (!sp || !dp) { free(so); free(dso); FL_FAIL(FL_ERR_OOM, "%s: cannot allocate scratch", name); }
    (src->dtype == FL_FLOAT32 ? f32 : f64)(p, sp, dp);
    free(so);
    fl_lin_unpack(dst, dso);
    return FL_OK;
}

/* avg_pool2d(self, kernel_size, stride=[], padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None) */
int fl_lin_avg_pool2d(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = T_(0), *y = fl_out_at(out, n_out, 0);
    if (!x || !y || !fl_lin_float_dt(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, x, y);
    if (!st) st = avg_args(&p, args, n_args, 1);
    if (st) return st;
    return pool_pass(&p, x, y, avgpool_fwd_f32, avgpool_fwd_f64, "avg_pool2d");
}

/* avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override) */
int fl_lin_avg_pool2d_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *go = T_(0), *gi = fl_out_at(out, n_out, 0);
    if (!go || !gi || !fl_lin_float_dt(go->dtype) || gi->dtype != go->dtype) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, gi, go);
    if (!st) st = avg_args(&p, args, n_args, 2);
    if (st) return st;
    return pool_pass(&p, go, gi, avgpool_bwd_f32, avgpool_bwd_f64, "avg_pool2d_backward");
}

/* _adaptive_avg_pool2d(self, output_size) */
int fl_lin_adaptive_avg_pool2d(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = T_(0), *y = fl_out_at(out, n_out, 0);
    if (!x || !y || !fl_lin_float_dt(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, x, y);
    if (st) return st;
    return pool_pass(&p, x, y, adaptive_fwd_f32, adaptive_fwd_f64, "adaptive_avg_pool2d");
}

/* _adaptive_avg_pool2d_backward(grad_output, self) */
int fl_lin_adaptive_avg_pool2d_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *go = T_(0), *gi = fl_out_at(out, n_out, 0);
    if (!go || !gi || !fl_lin_float_dt(go->dtype) || gi->dtype != go->dtype) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, gi, go);
    if (st) return st;
    return pool_pass(&p, go, gi, adaptive_bwd_f32, adaptive_bwd_f64, "adaptive_avg_pool2d_backward");
}

/* ======================================================================
 * Pooling over (D, H, W) windows. A window table gives, per output index
 * of one dim, [start, end) and a step (dilation); max pooling keeps ATen's
 * visiting order (d, h, w) and ties/NaN rules.
 * ====================================================================== */

typedef struct { int64_t start, end, step, full; } win_t; /* full: the unclamped extent (avg pooling's pool_size) */

static void max_plane(const double *x, const vol_t *iv, const win_t *wd, const win_t *wh, const win_t *ww,
                      const vol_t *ov, double *y, int64_t *ind) {
    for (int64_t od = 0; od < ov->D; od++)
        for (int64_t oh = 0; oh < ov->H; oh++)
            for (int64_t ow = 0; ow < ov->W; ow++) {
                const win_t *a = &wd[od], *b = &wh[oh], *c = &ww[ow];
                int64_t mi = (a->start * iv->H + b->start) * iv->W + c->start;
                double mv = -INFINITY;
                for (int64_t d = a->start; d < a->end; d += a->step)
                    for (int64_t h = b->start; h < b->end; h += b->step) {
                        const double *row = x + (d * iv->H + h) * iv->W;
                        for (int64_t w = c->start; w < c->end; w += c->step) {
                            double v = row[w];
                            if (v > mv || isnan(v)) { mv = v; mi = (d * iv->H + h) * iv->W + w; }
                        }
                    }
                int64_t o = (od * ov->H + oh) * ov->W + ow;
                y[o] = mv;
                if (ind) ind[o] = mi;
            }
}

/* windows of max_pool / avg_pool: output o covers o*s - p + [0, (k-1)*dil] */
static void pool_windows(win_t *w, int64_t n, int64_t in, int64_t k, int64_t s, int64_t p, int64_t dil, int avg) {
    for (int64_t o = 0; o < n; o++) {
        int64_t st = o * s - p, en;
        if (avg) {
            en = st + k < in + p ? st + k : in + p;
            w[o].full = en - st;
            if (st < 0) st = 0;
            if (en > in) en = in;
        } else {
            en = st + (k - 1) * dil + 1;
            if (en > in) en = in;
            while (st < 0) st += dil;
            w[o].full = 0;
        }
        w[o].start = st; w[o].end = en; w[o].step = avg ? 1 : dil;
    }
}
static void adaptive_windows(win_t *w, int64_t n, int64_t in) {
    for (int64_t o = 0; o < n; o++) {
        w[o].start = (o * in) / n;
        w[o].end = ((o + 1) * in + n - 1) / n;
        w[o].step = 1;
        w[o].full = w[o].end - w[o].start;
    }
}

/* scatter grad_output into grad_input through the flat per-plane indices of a max pooling */
static int max_scatter(const char *what, int64_t planes, int64_t in_n, int64_t out_n, const double *go,
                       const int64_t *ind, double *gi) {
    int bad = 0;
    int64_t bad_ix = 0;
#pragma omp parallel for schedule(static) if (planes * out_n > PAR_MIN)
    for (int64_t p = 0; p < planes; p++) {
        double *g = gi + p * in_n;
        for (int64_t i = 0; i < out_n; i++) {
            int64_t k = ind[p * out_n + i];
            if (k < 0 || k >= in_n) {
#pragma omp critical(nn_bad_index)
                { bad = 1; bad_ix = k; }
                continue;
            }
            g[k] += go[p * out_n + i];
        }
    }
    if (bad) FL_FAIL(FL_ERR_INVALID, "%s: index %ld out of range for a plane of %ld elements", what, (long)bad_ix, (long)in_n);
    return FL_OK;
}

/* max_pool3d_with_indices(self, kernel_size, stride=[], padding=0, dilation=1, ceil_mode=False) */
static int k_max_pool3d(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = IN(0), *y = OUT(0), *ind = OUT(1);
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype || (ind && ind->dtype != FL_INT64)) return FL_ERR_UNSUPPORTED;
    vol_t iv, ov;
    if (!vol_of(x, 3, 1, 2, &iv) || !vol_of(y, 3, 1, 2, &ov) || !same_planes(x, y, 3))
        FL_FAIL(FL_ERR_INVALID, "max_pool3d: expected a 4D or 5D input");
    int64_t kk[3], s[3], p[3], dl[3];
    static const int64_t zero[3] = {0, 0, 0}, one[3] = {1, 1, 1};
    if (n_args < 5 || !ints_arg(&args[1], 3, NULL, kk) || !ints_arg(&args[2], 3, kk, s) ||
        !ints_arg(&args[3], 3, zero, p) || !ints_arg(&args[4], 3, one, dl))
        return FL_ERR_UNSUPPORTED;
    for (int i = 0; i < 3; i++)
        if (kk[i] < 1 || s[i] < 1 || p[i] < 0 || dl[i] < 1)
            FL_FAIL(FL_ERR_INVALID, "max_pool3d: kernel_size, stride and dilation must be positive, padding non-negative");
    win_t *w = malloc((size_t)(ov.D + ov.H + ov.W + 1) * sizeof(win_t));
    if (!w) FL_FAIL(FL_ERR_OOM, "max_pool3d: cannot allocate scratch");
    win_t *wd = w, *wh = wd + ov.D, *ww = wh + ov.H;
    pool_windows(wd, ov.D, iv.D, kk[0], s[0], p[0], dl[0], 0);
    pool_windows(wh, ov.H, iv.H, kk[1], s[1], p[1], dl[1], 0);
    pool_windows(ww, ov.W, iv.W, kk[2], s[2], p[2], dl[2], 0);
    io_t io = {0};
    const double *xp = io_in(&io, x, FL_FLOAT64);
    double *yp = io_out(&io, y, FL_FLOAT64, 0);
    int64_t *ip = ind ? io_out(&io, ind, FL_INT64, 0) : NULL;
    if (!xp || !yp || (ind && !ip)) { free(w); IO_OOM(&io, "max_pool3d"); }
    const int64_t IN_ = vol_n(&iv), ON = vol_n(&ov);
#pragma omp parallel for schedule(static) if (iv.planes * ON > 4096)
    for (int64_t pl = 0; pl < iv.planes; pl++)
        max_plane(xp + pl * IN_, &iv, wd, wh, ww, &ov, yp + pl * ON, ip ? ip + pl * ON : NULL);
    free(w);
    return io_end(&io, FL_OK);
}

/* Backward of every max pooling with indices: grad_input[plane][ind] += grad_output.
 * (grad_output, self, ..., indices at argument ind_arg) */
static int max_backward(const char *what, int k, int ind_arg, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *go = IN(0), *ind = IN(ind_arg), *gi = OUT(0);
    if (!go || !ind || !gi || !is_float(go->dtype) || gi->dtype != go->dtype || ind->dtype != FL_INT64)
        return FL_ERR_UNSUPPORTED;
    vol_t iv, ov;
    if (!vol_of(gi, k, 1, 2, &iv) || !vol_of(go, k, 1, 2, &ov) || !same_planes(gi, go, k) || fl_numel(ind) != fl_numel(go))
        FL_FAIL(FL_ERR_INVALID, "%s: grad_output, indices and input shapes disagree", what);
    io_t io = {0};
    const double *g = io_in(&io, go, FL_FLOAT64);
    const int64_t *ip = io_in(&io, ind, FL_INT64);
    double *gp = io_out(&io, gi, FL_FLOAT64, 1);
    if (!g || !ip || !gp) IO_OOM(&io, what);
    return io_end(&io, max_scatter(what, iv.planes, vol_n(&iv), vol_n(&ov), g, ip, gp));
}
static int k_max_pool3d_bwd(FL_KERNEL_ARGS) {
    return max_backward("max_pool3d_with_indices_backward", 3, 7, stream, device, in, n_in, out, n_out, args, n_args);
}
static int k_adaptive_max_pool2d_bwd(FL_KERNEL_ARGS) {
    return max_backward("adaptive_max_pool2d_backward", 2, 2, stream, device, in, n_in, out, n_out, args, n_args);
}
static int k_adaptive_max_pool3d_bwd(FL_KERNEL_ARGS) {
    return max_backward("adaptive_max_pool3d_backward", 3, 2, stream, device, in, n_in, out, n_out, args, n_args);
}
static int k_fractional_max_pool2d_bwd(FL_KERNEL_ARGS) {
    return max_backward("fractional_max_pool2d_backward", 2, 4, stream, device, in, n_in, out, n_out, args, n_args);
}
/* PyTorch has no meta function for this one: the runtime lays its output out like `self` */
static int k_fractional_max_pool3d_bwd(FL_KERNEL_ARGS) {
    return max_backward("fractional_max_pool3d_backward", 3, 4, stream, device, in, n_in, out, n_out, args, n_args);
}

/* adaptive_max_pool{2,3}d(self, output_size) -> (out, indices) */
static int adaptive_max_run(int k, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = IN(0), *y = OUT(0), *ind = OUT(1);
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype || (ind && ind->dtype != FL_INT64)) return FL_ERR_UNSUPPORTED;
    vol_t iv, ov;
    if (!vol_of(x, k, 1, 2, &iv) || !vol_of(y, k, 1, 2, &ov) || !same_planes(x, y, k))
        FL_FAIL(FL_ERR_INVALID, "adaptive_max_pool%dd: expected a %dD or %dD input", k, k + 1, k + 2);
    if ((iv.D == 0 || iv.H == 0 || iv.W == 0) && vol_n(&ov) > 0 && iv.planes > 0)
        FL_FAIL(FL_ERR_INVALID, "adaptive_max_pool%dd: expected non-empty spatial dims", k);
    win_t *w = malloc((size_t)(ov.D + ov.H + ov.W + 1) * sizeof(win_t));
    if (!w) FL_FAIL(FL_ERR_OOM, "adaptive_max_pool: cannot allocate scratch");
    win_t *wd = w, *wh = wd + ov.D, *ww = wh + ov.H;
    adaptive_windows(wd, ov.D, iv.D);
    adaptive_windows(wh, ov.H, iv.H);
    adaptive_windows(ww, ov.W, iv.W);
    io_t io = {0};
    const double *xp = io_in(&io, x, FL_FLOAT64);
    double *yp = io_out(&io, y, FL_FLOAT64, 0);
    int64_t *ip = ind ? io_out(&io, ind, FL_INT64, 0) : NULL;
    if (!xp || !yp || (ind && !ip)) { free(w); IO_OOM(&io, "adaptive_max_pool"); }
    const int64_t IN_ = vol_n(&iv), ON = vol_n(&ov);
#pragma omp parallel for schedule(static) if (iv.planes * IN_ > PAR_MIN)
    for (int64_t pl = 0; pl < iv.planes; pl++)
        max_plane(xp + pl * IN_, &iv, wd, wh, ww, &ov, yp + pl * ON, ip ? ip + pl * ON : NULL);
    free(w);
    return io_end(&io, FL_OK);
}
static int k_adaptive_max_pool2d(FL_KERNEL_ARGS) { return adaptive_max_run(2, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_adaptive_max_pool3d(FL_KERNEL_ARGS) { return adaptive_max_run(3, stream, device, in, n_in, out, n_out, args, n_args); }

/* ATen's generate_intervals, in the input's precision */
static void fractional_windows(win_t *w, int single, double sample, int64_t in, int64_t out, int64_t pool) {
    if (out > 1) {
        double alpha = rnd(single, (double)(in - pool) / (double)(out - 1));
        int64_t base = (int64_t)(int)rnd(single, sample * alpha);
        for (int64_t i = 0; i < out - 1; i++)
            w[i].start = (int64_t)(int)rnd(single, rnd(single, (double)i + sample) * alpha) - base;
    }
    if (out > 0) w[out - 1].start = in - pool;
    for (int64_t i = 0; i < out; i++) { w[i].end = w[i].start + pool; w[i].step = 1; w[i].full = 0; }
}

/* fractional_max_pool{2,3}d(self, kernel_size, output_size, random_samples) -> (out, indices);
 * random_samples (N, C, k) holds, per plane, the samples for W, H (2-D) or T, H, W (3-D). */
static int fractional_run(int k, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = IN(0), *rs = IN(3), *y = OUT(0), *ind = OUT(1);
    if (!x || !rs || !y || !ind || !is_float(x->dtype) || y->dtype != x->dtype || ind->dtype != FL_INT64 ||
        rs->dtype != x->dtype)
        return FL_ERR_UNSUPPORTED;
    vol_t iv, ov;
    if (!vol_of(x, k, 1, 2, &iv) || !vol_of(y, k, 1, 2, &ov) || !same_planes(x, y, k))
        FL_FAIL(FL_ERR_INVALID, "fractional_max_pool%dd: expected a %dD or %dD input", k, k + 1, k + 2);
    int64_t ks[3] = {1, 1, 1}, kk[3];
    if (n_args < 3 || !ints_arg(&args[1], k, NULL, kk)) return FL_ERR_UNSUPPORTED;
    for (int i = 0; i < k; i++) ks[3 - k + i] = kk[i];
    const int64_t isz[3] = {iv.D, iv.H, iv.W}, osz[3] = {ov.D, ov.H, ov.W};
    static const char *dim_names[3] = {"time", "height", "width"};
    for (int d = 3 - k; d < 3; d++)
        if (osz[d] + ks[d] - 1 > isz[d] || ks[d] < 1)
            FL_FAIL(FL_ERR_INVALID, "fractional_max_pool%dd(): pool %s %ld too large relative to input %s %ld", k,
                    dim_names[d], (long)ks[d], dim_names[d], (long)isz[d]);
    /* (N', C, k) with N' >= N: the first N rows serve, as on CPU (an unbatched input takes row 0) */
    if (fl_numel(rs) < iv.planes * k || (rs->ndim >= 1 && rs->sizes[rs->ndim - 1] != k))
        FL_FAIL(FL_ERR_INVALID, "fractional_max_pool%dd: random_samples has %ld values of shape (..., %ld), expected "
                "at least %ld of shape (N, C, %d)", k, (long)fl_numel(rs),
                (long)(rs->ndim >= 1 ? rs->sizes[rs->ndim - 1] : 0), (long)(iv.planes * k), k);
    io_t io = {0};
    const double *xp = io_in(&io, x, FL_FLOAT64), *sp = io_in(&io, rs, FL_FLOAT64);
    double *yp = io_out(&io, y, FL_FLOAT64, 0);
    int64_t *ip = io_out(&io, ind, FL_INT64, 0);
    if (!xp || !sp || !yp || !ip) IO_OOM(&io, "fractional_max_pool");
    const int64_t IN_ = vol_n(&iv), ON = vol_n(&ov), nw = ov.D + ov.H + ov.W;
    const int single = single_of(x->dtype);
    int oom = 0;
#pragma omp parallel for schedule(static) if (iv.planes * ON > 4096)
    for (int64_t pl = 0; pl < iv.planes; pl++) {
        win_t *w = malloc((size_t)nw * sizeof(win_t));
        if (!w) { oom = 1; continue; }
        win_t *wd = w, *wh = wd + ov.D, *ww = wh + ov.H;
        const double *smp = sp + pl * k;
        if (k == 2) {
            fractional_windows(wd, single, 0.0, 1, 1, 1);
            fractional_windows(ww, single, smp[0], iv.W, ov.W, ks[2]);
            fractional_windows(wh, single, smp[1], iv.H, ov.H, ks[1]);
        } else {
            fractional_windows(wd, single, smp[0], iv.D, ov.D, ks[0]);
            fractional_windows(wh, single, smp[1], iv.H, ov.H, ks[1]);
            fractional_windows(ww, single, smp[2], iv.W, ov.W, ks[2]);
        }
        max_plane(xp + pl * IN_, &iv, wd, wh, ww, &ov, yp + pl * ON, ip + pl * ON);
        free(w);
    }
    if (oom) IO_OOM(&io, "fractional_max_pool");
    return io_end(&io, FL_OK);
}
static int k_fractional_max_pool2d(FL_KERNEL_ARGS) { return fractional_run(2, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_fractional_max_pool3d(FL_KERNEL_ARGS) { return fractional_run(3, stream, device, in, n_in, out, n_out, args, n_args); }

/* ---- average pooling: avg_pool3d (+ backward), _adaptive_avg_pool3d (+ backward) ---- */

typedef struct { int cip; int64_t divisor; } avg_rule_t; /* cip: count_include_pad; divisor 0: none */

static inline int64_t avg_div(const avg_rule_t *r, const win_t *a, const win_t *b, const win_t *c) {
    if (a->start >= a->end || b->start >= b->end || c->start >= c->end) return 0;
    if (r->divisor) return r->divisor;
    if (r->cip) return a->full * b->full * c->full;
    return (a->end - a->start) * (b->end - b->start) * (c->end - c->start);
}

static void avg_fwd(const vol_t *iv, const vol_t *ov, const win_t *wd, const win_t *wh, const win_t *ww,
                    const avg_rule_t *r, const double *x, double *y) {
    const int64_t IN_ = vol_n(iv), ON = vol_n(ov);
#pragma omp parallel for schedule(static) collapse(2) if (iv->planes * ON > 4096)
    for (int64_t p = 0; p < iv->planes; p++)
        for (int64_t od = 0; od < ov->D; od++)
            for (int64_t oh = 0; oh < ov->H; oh++)
                for (int64_t ow = 0; ow < ov->W; ow++) {
                    const win_t *a = &wd[od], *b = &wh[oh], *c = &ww[ow];
                    int64_t div = avg_div(r, a, b, c);
                    double s = 0.0;
                    for (int64_t d = a->start; d < a->end; d++)
                        for (int64_t h = b->start; h < b->end; h++) {
                            const double *row = x + p * IN_ + (d * iv->H + h) * iv->W;
                            for (int64_t w = c->start; w < c->end; w++) s += row[w];
                        }
                    y[p * ON + (od * ov->H + oh) * ov->W + ow] = div ? s / (double)div : 0.0;
                }
}

static void avg_bwd(const vol_t *iv, const vol_t *ov, const win_t *wd, const win_t *wh, const win_t *ww,
                    const avg_rule_t *r, const double *go, double *gi) {
    const int64_t IN_ = vol_n(iv), ON = vol_n(ov);
#pragma omp parallel for schedule(static) if (iv->planes * (IN_ + ON) > PAR_MIN)
    for (int64_t p = 0; p < iv->planes; p++)
        for (int64_t od = 0; od < ov->D; od++)
            for (int64_t oh = 0; oh < ov->H; oh++)
                for (int64_t ow = 0; ow < ov->W; ow++) {
                    const win_t *a = &wd[od], *b = &wh[oh], *c = &ww[ow];
                    int64_t div = avg_div(r, a, b, c);
                    if (!div) continue;
                    double v = go[p * ON + (od * ov->H + oh) * ov->W + ow] / (double)div;
                    for (int64_t d = a->start; d < a->end; d++)
                        for (int64_t h = b->start; h < b->end; h++) {
                            double *row = gi + p * IN_ + (d * iv->H + h) * iv->W;
                            for (int64_t w = c->start; w < c->end; w++) row[w] += v;
                        }
                }
}

/* avg_pool3d(self, kernel_size, stride=[], padding=0, ceil_mode, count_include_pad, divisor_override)
 * avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
 * _adaptive_avg_pool3d(self, output_size); _adaptive_avg_pool3d_backward(grad_output, self) */
static int avg_run(int adaptive, int bwd, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const char *what = adaptive ? "adaptive_avg_pool3d" : "avg_pool3d";
    const fl_tensor_t *x = IN(0), *y = OUT(0);
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *small = bwd ? y : x, *big = bwd ? x : y; /* input space / output space */
    vol_t iv, ov;
    if (!vol_of(small, 3, 1, 2, &iv) || !vol_of(big, 3, 1, 2, &ov) || !same_planes(small, big, 3))
        FL_FAIL(FL_ERR_INVALID, "%s: expected a 4D or 5D input", what);
    avg_rule_t r = {0, 0};
    int64_t kk[3], s[3], p[3];
    static const int64_t zero[3] = {0, 0, 0};
    if (!adaptive) {
        int a = bwd ? 2 : 1;
        if (n_args < a + 6 || !ints_arg(&args[a], 3, NULL, kk) || !ints_arg(&args[a + 1], 3, kk, s) ||
            !ints_arg(&args[a + 2], 3, zero, p))
            return FL_ERR_UNSUPPORTED;
        for (int i = 0; i < 3; i++)
            if (kk[i] < 1 || s[i] < 1 || p[i] < 0)
                FL_FAIL(FL_ERR_INVALID, "avg_pool3d: kernel_size and stride must be positive, padding non-negative");
        r.cip = args[a + 4].i != 0;
        if (args[a + 5].kind == FL_ARG_INT) {
            if (args[a + 5].i == 0) FL_FAIL(FL_ERR_INVALID, "avg_pool3d: divisor must be not zero");
            r.divisor = args[a + 5].i;
        }
    }
    win_t *w = malloc((size_t)(ov.D + ov.H + ov.W + 1) * sizeof(win_t));
    if (!w) FL_FAIL(FL_ERR_OOM, "%s: cannot allocate scratch", what);
    win_t *wd = w, *wh = wd + ov.D, *ww = wh + ov.H;
    if (adaptive) {
        adaptive_windows(wd, ov.D, iv.D);
        adaptive_windows(wh, ov.H, iv.H);
        adaptive_windows(ww, ov.W, iv.W);
    } else {
        pool_windows(wd, ov.D, iv.D, kk[0], s[0], p[0], 1, 1);
        pool_windows(wh, ov.H, iv.H, kk[1], s[1], p[1], 1, 1);
        pool_windows(ww, ov.W, iv.W, kk[2], s[2], p[2], 1, 1);
    }
    io_t io = {0};
    const double *src = io_in(&io, x, FL_FLOAT64);
    double *dst = io_out(&io, y, FL_FLOAT64, bwd);
    if (!src || !dst) { free(w); IO_OOM(&io, what); }
    if (bwd) avg_bwd(&iv, &ov, wd, wh, ww, &r, src, dst);
    else avg_fwd(&iv, &ov, wd, wh, ww, &r, src, dst);
    free(w);
    return io_end(&io, FL_OK);
}
static int k_avg_pool3d(FL_KERNEL_ARGS) { return avg_run(0, 0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_avg_pool3d_bwd(FL_KERNEL_ARGS) { return avg_run(0, 1, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_adaptive_avg_pool3d(FL_KERNEL_ARGS) { return avg_run(1, 0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_adaptive_avg_pool3d_bwd(FL_KERNEL_ARGS) { return avg_run(1, 1, stream, device, in, n_in, out, n_out, args, n_args); }

/* ---- max_unpool2d(self, indices, output_size), max_unpool3d(self, indices, output_size, stride, padding) ---- */
static int unpool_run(int k, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = IN(0), *ind = IN(1), *y = OUT(0);
    if (!x || !ind || !y || !is_float(x->dtype) || y->dtype != x->dtype || ind->dtype != FL_INT64) return FL_ERR_UNSUPPORTED;
    vol_t iv, ov;
    if (!vol_of(x, k, 1, 2, &iv) || !vol_of(y, k, 1, 2, &ov) || !same_planes(x, y, k))
        FL_FAIL(FL_ERR_INVALID, "max_unpool%dd: expected a %dD or %dD input", k, k + 1, k + 2);
    if (ind->ndim != x->ndim || fl_numel(ind) != fl_numel(x))
        FL_FAIL(FL_ERR_INVALID, "max_unpool%dd: expected shape of indices to be same as that of the input tensor", k);
    io_t io = {0};
    const double *xp = io_in(&io, x, FL_FLOAT64);
    const int64_t *ip = io_in(&io, ind, FL_INT64);
    double *yp = io_out(&io, y, FL_FLOAT64, 1);
    if (!xp || !ip || !yp) IO_OOM(&io, "max_unpool");
    const int64_t IN_ = vol_n(&iv), ON = vol_n(&ov);
    int bad = 0;
    int64_t bad_ix = 0;
#pragma omp parallel for schedule(static) if (iv.planes * IN_ > PAR_MIN)
    for (int64_t p = 0; p < iv.planes; p++)
        for (int64_t i = 0; i < IN_; i++) { /* in order: a repeated index keeps the last value, as ATen */
            int64_t j = ip[p * IN_ + i];
            if (j < 0 || j >= ON) {
#pragma omp critical(nn_bad_index)
                { bad = 1; bad_ix = j; }
                continue;
            }
            yp[p * ON + j] = xp[p * IN_ + i];
        }
    if (bad) {
        io_end(&io, FL_ERR_INVALID);
        if (k == 2)
            FL_FAIL(FL_ERR_INVALID, "Found an invalid max index: %ld (output volumes are of size %ldx%ld", (long)bad_ix,
                    (long)ov.H, (long)ov.W);
        FL_FAIL(FL_ERR_INVALID, "Found an invalid max index: %ld (output volumes are of size %ldx%ldx%ld", (long)bad_ix,
                (long)ov.D, (long)ov.H, (long)ov.W);
    }
    return io_end(&io, FL_OK);
}
static int k_max_unpool2d(FL_KERNEL_ARGS) { return unpool_run(2, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_max_unpool3d(FL_KERNEL_ARGS) { return unpool_run(3, stream, device, in, n_in, out, n_out, args, n_args); }

/* ======================================================================
 * Table: 2-D pooling (float16/bfloat16 through float32 copies), and the
 * 3-D, adaptive, fractional pooling and unpooling above
 * ====================================================================== */
LIN_ANY_FLOAT(d_max_pool2d, fl_lin_max_pool2d)
LIN_ANY_FLOAT(d_max_pool2d_backward, fl_lin_max_pool2d_backward)
LIN_ANY_FLOAT(d_avg_pool2d, fl_lin_avg_pool2d)
LIN_ANY_FLOAT(d_avg_pool2d_backward, fl_lin_avg_pool2d_backward)
LIN_ANY_FLOAT(d_adaptive_avg_pool2d, fl_lin_adaptive_avg_pool2d)
LIN_ANY_FLOAT(d_adaptive_avg_pool2d_backward, fl_lin_adaptive_avg_pool2d_backward)

static const fl_kernel_entry_t entries[] = {
    {"aten::max_pool2d_with_indices", FL_FLOATS, 0, d_max_pool2d},
    {"aten::max_pool2d_with_indices_backward", FL_FLOATS, 0, d_max_pool2d_backward},
    {"aten::avg_pool2d", FL_FLOATS, 0, d_avg_pool2d},
    {"aten::avg_pool2d_backward", FL_FLOATS, 0, d_avg_pool2d_backward},
    {"aten::_adaptive_avg_pool2d", FL_FLOATS, 0, d_adaptive_avg_pool2d},
    {"aten::_adaptive_avg_pool2d_backward", FL_FLOATS, 0, d_adaptive_avg_pool2d_backward},
    {"aten::max_pool3d_with_indices", FL_FLOATS, 0, k_max_pool3d},
    {"aten::max_pool3d_with_indices_backward", FL_FLOATS, 0, k_max_pool3d_bwd},
    {"aten::adaptive_max_pool2d", FL_FLOATS, 0, k_adaptive_max_pool2d},
    {"aten::adaptive_max_pool2d_backward", FL_FLOATS, 0, k_adaptive_max_pool2d_bwd},
    {"aten::adaptive_max_pool3d", FL_FLOATS, 0, k_adaptive_max_pool3d},
    {"aten::adaptive_max_pool3d_backward", FL_FLOATS, 0, k_adaptive_max_pool3d_bwd},
    {"aten::fractional_max_pool2d", F3264, 0, k_fractional_max_pool2d},
    {"aten::fractional_max_pool2d_backward", F3264, 0, k_fractional_max_pool2d_bwd},
    {"aten::fractional_max_pool3d_backward", F3264, 0, k_fractional_max_pool3d_bwd},
    {"aten::fractional_max_pool3d", F3264, 0, k_fractional_max_pool3d},
    {"aten::avg_pool3d", FL_FLOATS, 0, k_avg_pool3d},
    {"aten::avg_pool3d_backward", FL_FLOATS, 0, k_avg_pool3d_bwd},
    {"aten::_adaptive_avg_pool3d", FL_FLOATS, 0, k_adaptive_avg_pool3d},
    {"aten::_adaptive_avg_pool3d_backward", FL_FLOATS, 0, k_adaptive_avg_pool3d_bwd},
    {"aten::max_unpool2d", FL_FLOATS, 0, k_max_unpool2d},
    {"aten::max_unpool3d", FL_FLOATS, 0, k_max_unpool3d},
};

const fl_kernel_group_t fl_host_group_pool = {entries, (int)(sizeof entries / sizeof entries[0])};

#else /* ======================= typed section (LIN_T) ======================= */

#define T LIN_T
#define F(name) LIN_CAT(name, LIN_CAT(_, LIN_S))

/* One output row of max pooling. Output columns whose window lies inside
 * the row are done tap by tap across a block of columns without branches
 * (same visiting order as ATen, so ties and NaNs pick the same index); the
 * border columns take the scalar path. */
LIN_CLONES static void F(maxpool_row)(const pool_t *p, const T *xp, int64_t oh, T *yrow, int64_t *irow) {
    const int64_t H = p->H, W = p->W, OW = p->OW, sw = p->sw, pw = p->pw, dw = p->dw, kw = p->kw;
    int64_t ih0 = oh * p->sh - p->ph;
    int64_t ih1 = ih0 + (p->kh - 1) * p->dh + 1;
    if (ih1 > H) ih1 = H;
    while (ih0 < 0) ih0 += p->dh;
    /* interior: ow*sw - pw >= 0 and ow*sw - pw + (kw-1)*dw <= W-1 */
    int64_t lo = (pw + sw - 1) / sw, span = W - 1 - (kw - 1) * dw + pw;
    int64_t hi = span < 0 ? 0 : span / sw + 1;
    if (hi > OW) hi = OW;
    if (lo > hi) lo = hi;
    for (int64_t ow = 0; ow < OW; ow++) {
        if (ow == lo && hi > lo && ih0 < ih1) { ow = hi - 1; continue; }
        int64_t iw0 = ow * sw - pw;
        int64_t iw1 = iw0 + (kw - 1) * dw + 1;
        if (iw1 > W) iw1 = W;
        while (iw0 < 0) iw0 += dw;
        int64_t mi = ih0 * W + iw0;
        T mv = -INFINITY;
        for (int64_t ih = ih0; ih < ih1; ih += p->dh)
            for (int64_t iw = iw0; iw < iw1; iw += dw) {
                T v = xp[ih * W + iw];
                if (v > mv || isnan(v)) { mv = v; mi = ih * W + iw; }
            }
        yrow[ow] = mv;
        if (irow) irow[ow] = mi;
    }
    if (!(hi > lo && ih0 < ih1)) return;
    enum { BLK = 256 };
    T mv[BLK];
    int64_t mi[BLK];
    for (int64_t b0 = lo; b0 < hi; b0 += BLK) {
        int64_t n = hi - b0 < BLK ? hi - b0 : BLK;
        for (int64_t t = 0; t < n; t++) { mv[t] = -INFINITY; mi[t] = ih0 * W + (b0 + t) * sw - pw; }
        for (int64_t ih = ih0; ih < ih1; ih += p->dh)
            for (int64_t kj = 0; kj < kw; kj++) {
                const int64_t off = ih * W + kj * dw - pw + b0 * sw;
                const T *src = xp + off;
#define MAXPOOL_TAPS(S)                                     \
    _Pragma("omp simd") for (int64_t t = 0; t < n; t++) {   \
        T v = src[t * (S)];                                 \
        int take = (v > mv[t]) | (v != v);                  \
        mv[t] = take ? v : mv[t];                           \
        mi[t] = take ? off + t * (S) : mi[t];               \
    }
                if (sw == 1) { MAXPOOL_TAPS(1) }
                else if (sw == 2) { MAXPOOL_TAPS(2) }
                else { MAXPOOL_TAPS(sw) }
#undef MAXPOOL_TAPS
            }
        memcpy(yrow + b0, mv, (size_t)n * sizeof(T));
        if (irow) memcpy(irow + b0, mi, (size_t)n * sizeof(int64_t));
    }
}

static void F(maxpool_fwd)(const pool_t *p, const T *x, T *y, int64_t *ind) {
    const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW;
#pragma omp parallel for schedule(static) collapse(2) if (p->planes * OH * OW > 4096)
    for (int64_t pl = 0; pl < p->planes; pl++)
        for (int64_t oh = 0; oh < OH; oh++)
            F(maxpool_row)(p, x + pl * H * W, oh, y + (pl * OH + oh) * OW, ind ? ind + (pl * OH + oh) * OW : NULL);
}

/* Channels-last: each output pixel's C values at once, the taps in ATen's order (ties and NaNs pick
 * the same index as the NCHW path); y and ind hold the running maxima. */
static void F(maxpool_nhwc)(const pool_t *p, int64_t N, int64_t C, const T *x, T *y, int64_t *ind) {
    const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW;
#pragma omp parallel for schedule(static) collapse(2) if (N * OH * OW * C > 16384)
    for (int64_t n = 0; n < N; n++)
        for (int64_t q = 0; q < OH * OW; q++) {
            const int64_t oh = q / OW, ow = q % OW;
            int64_t ih0 = oh * p->sh - p->ph, iw0 = ow * p->sw - p->pw;
            int64_t ih1 = ih0 + (p->kh - 1) * p->dh + 1, iw1 = iw0 + (p->kw - 1) * p->dw + 1;
            if (ih1 > H) ih1 = H;
            if (iw1 > W) iw1 = W;
            while (ih0 < 0) ih0 += p->dh;
            while (iw0 < 0) iw0 += p->dw;
            T *mv = y + (n * OH * OW + q) * C;
            int64_t *mi = ind ? ind + (n * OH * OW + q) * C : NULL;
            for (int64_t c = 0; c < C; c++) mv[c] = -INFINITY;
            if (mi)
                for (int64_t c = 0; c < C; c++) mi[c] = ih0 * W + iw0;
            for (int64_t ih = ih0; ih < ih1; ih += p->dh)
                for (int64_t iw = iw0; iw < iw1; iw += p->dw) {
                    const T *src = x + ((n * H + ih) * W + iw) * C;
                    const int64_t at = ih * W + iw;
                    if (mi) {
#pragma omp simd
                        for (int64_t c = 0; c < C; c++) {
                            T v = src[c];
                            int take = (v > mv[c]) | (v != v);
                            mv[c] = take ? v : mv[c];
                            mi[c] = take ? at : mi[c];
                        }
                    } else {
#pragma omp simd
                        for (int64_t c = 0; c < C; c++) {
                            T v = src[c];
                            mv[c] = ((v > mv[c]) | (v != v)) ? v : mv[c];
                        }
                    }
                }
        }
}

static void F(maxpool_bwd)(const pool_t *p, const T *go, const int64_t *ind, T *gi) {
    const int64_t HW = p->H * p->W, P = p->OH * p->OW;
#pragma omp parallel for schedule(static) if (p->planes * (HW + P) > 16384)
    for (int64_t pl = 0; pl < p->planes; pl++) {
        T *g = gi + pl * HW;
        memset(g, 0, (size_t)HW * sizeof(T));
        const T *src = go + pl * P;
        const int64_t *ix = ind + pl * P;
        for (int64_t i = 0; i < P; i++) {
            int64_t k = ix[i];
            if (k >= 0 && k < HW) g[k] += src[i];
        }
    }
}

static inline int64_t F(avg_window)(const pool_t *p, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1, int64_t *w0,
                                   int64_t *w1) {
    int64_t ih0 = oh * p->sh - p->ph, iw0 = ow * p->sw - p->pw;
    int64_t ih1 = ih0 + p->kh, iw1 = iw0 + p->kw;
    if (ih1 > p->H + p->ph) ih1 = p->H + p->ph;
    if (iw1 > p->W + p->pw) iw1 = p->W + p->pw;
    int64_t pool_size = (ih1 - ih0) * (iw1 - iw0);
    if (ih0 < 0) ih0 = 0;
    if (iw0 < 0) iw0 = 0;
    if (ih1 > p->H) ih1 = p->H;
    if (iw1 > p->W) iw1 = p->W;
    *h0 = ih0; *h1 = ih1; *w0 = iw0; *w1 = iw1;
    if (ih0 >= ih1 || iw0 >= iw1) return 0;
    if (p->divisor) return p->divisor;
    return p->count_include_pad ? pool_size : (ih1 - ih0) * (iw1 - iw0);
}

static void F(avgpool_fwd)(const pool_t *p, const void *xv, void *yv) {
    const T *x = xv;
    T *y = yv;
    const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW;
#pragma omp parallel for schedule(static) collapse(2) if (p->planes * OH * OW > 4096)
    for (int64_t pl = 0; pl < p->planes; pl++)
        for (int64_t oh = 0; oh < OH; oh++) {
            const T *xp = x + pl * H * W;
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0, h1, w0, w1;
                int64_t div = F(avg_window)(p, oh, ow, &h0, &h1, &w0, &w1);
                T *o = y + (pl * OH + oh) * OW + ow;
                if (!div) { *o = 0; continue; }
                double s = 0.0;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) s += xp[ih * W + iw];
                *o = (T)(s / (double)div);
            }
        }
}

static void F(avgpool_bwd)(const pool_t *p, const void *gov, void *giv) {
    const T *go = gov;
    T *gi = giv;
    const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW;
#pragma omp parallel for schedule(static) if (p->planes * (H * W + OH * OW) > 16384)
    for (int64_t pl = 0; pl < p->planes; pl++) {
        T *g = gi + pl * H * W;
        memset(g, 0, (size_t)(H * W) * sizeof(T));
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0, h1, w0, w1;
                int64_t div = F(avg_window)(p, oh, ow, &h0, &h1, &w0, &w1);
                if (!div) continue;
                T v = (T)((double)go[(pl * OH + oh) * OW + ow] / (double)div);
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) g[ih * W + iw] += v;
            }
    }
}

static void F(adaptive_fwd)(const pool_t *p, const void *xv, void *yv) {
    const T *x = xv;
    T *y = yv;
    const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW;
    if (OH == 0 || OW == 0) return;
#pragma omp parallel for schedule(static) collapse(2) if (p->planes * H * W > 16384)
    for (int64_t pl = 0; pl < p->planes; pl++)
        for (int64_t oh = 0; oh < OH; oh++) {
            const T *xp = x + pl * H * W;
            int64_t h0 = start_index(oh, OH, H), h1 = end_index(oh, OH, H);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t w0 = start_index(ow, OW, W), w1 = end_index(ow, OW, W);
                double s = 0.0;
                for (int64_t ih = h0; ih < h1; ih++) {
                    const T *r = xp + ih * W;
                    double a = 0.0;
#pragma omp simd reduction(+ : a)
                    for (int64_t iw = w0; iw < w1; iw++) a += r[iw];
                    s += a;
                }
                int64_t cnt = (h1 - h0) * (w1 - w0);
                y[(pl * OH + oh) * OW + ow] = (T)(s / (double)(cnt > 0 ? cnt : 1));
            }
        }
}

static void F(adaptive_bwd)(const pool_t *p, const void *gov, void *giv) {
    const T *go = gov;
    T *gi = giv;
    const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW;
#pragma omp parallel for schedule(static) if (p->planes * H * W > 16384)
    for (int64_t pl = 0; pl < p->planes; pl++) {
        T *g = gi + pl * H * W;
        memset(g, 0, (size_t)(H * W) * sizeof(T));
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t h0 = start_index(oh, OH, H), h1 = end_index(oh, OH, H);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t w0 = start_index(ow, OW, W), w1 = end_index(ow, OW, W);
                int64_t cnt = (h1 - h0) * (w1 - w0);
                T v = (T)((double)go[(pl * OH + oh) * OW + ow] / (double)(cnt > 0 ? cnt : 1));
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) g[ih * W + iw] += v;
            }
        }
    }
}

#undef T
#undef F
#endif
