/* Host kernels: 2-D max pooling (with indices), average pooling and adaptive
 * average pooling, forward and backward, on (N, C, H, W) or (C, H, W) inputs.
 * Every (plane, output row) pair is independent, so the loops run over them
 * in parallel; the backward passes run over planes (a plane's gradient is
 * accumulated by one thread). Non-contiguous tensors go through packed
 * copies. Semantics mirror ATen's CPU kernels (NaN wins in max pooling; the
 * first maximum's flat index h*W + w within its plane).
 *
 * This file includes itself once per element type for the typed section. */
#ifndef LIN_T

#include "k_linalg.h"

typedef struct {
    int64_t planes, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int count_include_pad;
    int64_t divisor; /* 0: none */
} pool_t;

static inline int64_t start_index(int64_t a, int64_t b, int64_t c) { return (a * c) / b; }
static inline int64_t end_index(int64_t a, int64_t b, int64_t c) { return ((a + 1) * c + b - 1) / b; }

#define LIN_SELF "k_linalg_pool.c"
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
    const fl_tensor_t *x = T_(0), *y = fl_lin_out(out, n_out, 0), *ind = fl_lin_out(out, n_out, 1);
    if (!x || !y || !fl_lin_float_dt(x->dtype) || y->dtype != x->dtype || (ind && ind->dtype != FL_INT64)) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, x, y);
    if (!st) st = window_args(&p, args, n_args, 1, 1);
    if (st) return st;
    if (ind && fl_numel(ind) != fl_numel(y)) return FL_ERR_UNSUPPORTED;
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
    const fl_tensor_t *go = T_(0), *x = T_(1), *ind = T_(7), *gi = fl_lin_out(out, n_out, 0);
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

/* avg_pool2d(self, kernel_size, stride=[], padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None) */
int fl_lin_avg_pool2d(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = T_(0), *y = fl_lin_out(out, n_out, 0);
    if (!x || !y || !fl_lin_float_dt(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, x, y);
    if (!st) st = avg_args(&p, args, n_args, 1);
    if (st) return st;
    void *xo, *yo;
    const void *xp = fl_lin_pack(x, &xo);
    void *yp = fl_lin_out_buf(y, &yo);
    if (!xp || !yp) { free(xo); free(yo); FL_FAIL(FL_ERR_OOM, "avg_pool2d: cannot allocate scratch"); }
    if (x->dtype == FL_FLOAT32) avgpool_fwd_f32(&p, xp, yp);
    else avgpool_fwd_f64(&p, xp, yp);
    free(xo);
    fl_lin_unpack(y, yo);
    return FL_OK;
}

/* avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override) */
int fl_lin_avg_pool2d_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *go = T_(0), *gi = fl_lin_out(out, n_out, 0);
    if (!go || !gi || !fl_lin_float_dt(go->dtype) || gi->dtype != go->dtype) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, gi, go);
    if (!st) st = avg_args(&p, args, n_args, 2);
    if (st) return st;
    void *goo, *gio;
    const void *gop = fl_lin_pack(go, &goo);
    void *gip = fl_lin_out_buf(gi, &gio);
    if (!gop || !gip) { free(goo); free(gio); FL_FAIL(FL_ERR_OOM, "avg_pool2d_backward: cannot allocate scratch"); }
    if (go->dtype == FL_FLOAT32) avgpool_bwd_f32(&p, gop, gip);
    else avgpool_bwd_f64(&p, gop, gip);
    free(goo);
    fl_lin_unpack(gi, gio);
    return FL_OK;
}

/* _adaptive_avg_pool2d(self, output_size) */
int fl_lin_adaptive_avg_pool2d(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = T_(0), *y = fl_lin_out(out, n_out, 0);
    if (!x || !y || !fl_lin_float_dt(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, x, y);
    if (st) return st;
    void *xo, *yo;
    const void *xp = fl_lin_pack(x, &xo);
    void *yp = fl_lin_out_buf(y, &yo);
    if (!xp || !yp) { free(xo); free(yo); FL_FAIL(FL_ERR_OOM, "adaptive_avg_pool2d: cannot allocate scratch"); }
    if (x->dtype == FL_FLOAT32) adaptive_fwd_f32(&p, xp, yp);
    else adaptive_fwd_f64(&p, xp, yp);
    free(xo);
    fl_lin_unpack(y, yo);
    return FL_OK;
}

/* _adaptive_avg_pool2d_backward(grad_output, self) */
int fl_lin_adaptive_avg_pool2d_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *go = T_(0), *gi = fl_lin_out(out, n_out, 0);
    if (!go || !gi || !fl_lin_float_dt(go->dtype) || gi->dtype != go->dtype) return FL_ERR_UNSUPPORTED;
    pool_t p;
    int st = geom(&p, gi, go);
    if (st) return st;
    void *goo, *gio;
    const void *gop = fl_lin_pack(go, &goo);
    void *gip = fl_lin_out_buf(gi, &gio);
    if (!gop || !gip) { free(goo); free(gio); FL_FAIL(FL_ERR_OOM, "adaptive_avg_pool2d_backward: cannot allocate scratch"); }
    if (go->dtype == FL_FLOAT32) adaptive_bwd_f32(&p, gop, gip);
    else adaptive_bwd_f64(&p, gop, gip);
    free(goo);
    fl_lin_unpack(gi, gio);
    return FL_OK;
}

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

static void F(avgpool_fwd)(const pool_t *p, const T *x, T *y) {
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

static void F(avgpool_bwd)(const pool_t *p, const T *go, T *gi) {
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

static void F(adaptive_fwd)(const pool_t *p, const T *x, T *y) {
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

static void F(adaptive_bwd)(const pool_t *p, const T *go, T *gi) {
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
