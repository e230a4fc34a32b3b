/* Host kernels: 1-D and 2-D convolution (plain and transposed, groups,
 * stride, padding, dilation) and its backward, as im2col / col2im + BLAS GEMM.
 *
 * Two spaces: the "conv input" space (C, H, W) and the "conv output" space
 * (O, OH, OW) of an ordinary convolution with weight (O, C/G, KH, KW).
 *   forward:          Y = W * im2col(X)
 *   backward data:    dX = col2im(W^T * dY)
 *   backward weight:  dW = dY * im2col(X)^T
 * A transposed convolution is the same three with the roles swapped: its
 * forward is "backward data", its grad_input is "forward", its grad_weight is
 * "backward weight" with X = grad_output and dY = input.
 *
 * Samples are processed in chunks: a chunk's columns sit side by side in one
 * (C*KH*KW) x (nb*P) matrix so that small images still give GEMMs with a long
 * N dimension; a 1x1 / stride 1 / no padding convolution of a single sample
 * uses the input directly, with no im2col at all.
 *
 * Channels-last: an ordinary 2-D convolution whose output is laid out NHWC
 * (what torch.compile's layout pass asks for on a device that prefers it)
 * runs in that layout: y (N*OH*OW, O) = patches (N*OH*OW, KH*KW*C/G) * w'^T
 * with w' the weight as (O, KH, KW, C/G). Each patch row is KH*KW runs of
 * contiguous channels; a 1x1 / stride 1 / no padding convolution is one GEMM
 * over the input itself. An NCHW input or weight is transposed once first.
 * Its backward, when the input gradient asked for is NHWC (or only the weight's
 * is, of an NHWC input), runs in that layout too: the GEMMs above transposed,
 * the patches scattered back (col2im) into the NHWC gradient.
 *
 * This file includes itself once per element type (float, double) for the
 * typed section below. */
#ifndef LIN_T

#include <limits.h>

#include "k_linalg.h"

typedef struct {
    int64_t N, C, H, W;   /* conv-input space */
    int64_t O, OH, OW;    /* conv-output space */
    int64_t KH, KW, sh, sw, ph, pw, dh, dw, G;
} geom_t;

/* Samples per chunk: enough columns for an efficient GEMM, bounded scratch. */
static int64_t chunk_of(const geom_t *g, size_t es, int nt) {
    int64_t P = g->OH * g->OW;
    if (P <= 0 || g->N <= 1) return 1;
    int64_t nb = P >= 1024 ? 1 : (2048 + P - 1) / P;
    if (nb > g->N) nb = g->N;
    if (nt > 1 && g->N >= nt && nb > (g->N + nt - 1) / nt) nb = (g->N + nt - 1) / nt; /* a chunk per thread at least */
    int64_t rows = g->C * g->KH * g->KW;
    int64_t big = rows > g->O ? rows : g->O;
    while (nb > 1 && (double)big * (double)(nb * P) * (double)es > 64.0 * 1024 * 1024) nb--;
    return nb;
}
static int trivial_1x1(const geom_t *g) {
    return g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 &&
           g->OH == g->H && g->OW == g->W;
}

#define LIN_SELF "k_conv.c"
#include "k_linalg_typed.h"

/* ---- argument parsing ---- */

static int list2(const fl_arg_t *a, int spatial, int64_t dflt, int64_t v[2]) {
    if (a->kind != FL_ARG_INT_LIST && a->kind != FL_ARG_INT) return 0;
    if (a->kind == FL_ARG_INT) { v[0] = v[1] = a->i; return 1; }
    if (a->len == 0) { v[0] = v[1] = dflt; return 1; }
    if (a->len == 1) { v[0] = v[1] = a->list[0]; return 1; }
    if (a->len == spatial) { v[0] = a->list[0]; v[1] = a->list[1]; return 1; }
    return 0;
}

/* Fills the geometry from the tensors in conv-input space (xin: N,C,...),
 * conv-output space (yout: N,O,...) and the weight. */
static int make_geom(geom_t *g, const fl_tensor_t *xin, const fl_tensor_t *yout, const fl_tensor_t *w,
                     const fl_arg_t *args, int a_stride, int64_t groups, int transposed) {
    int nd = xin->ndim;
    if (nd != 3 && nd != 4) return FL_ERR_UNSUPPORTED;
    if (yout->ndim != nd || w->ndim != nd) return FL_ERR_UNSUPPORTED;
    int spatial = nd - 2;
    int64_t st[2], pd[2], dl[2];
    if (!list2(&args[a_stride], spatial, 1, st) || !list2(&args[a_stride + 1], spatial, 0, pd) ||
        !list2(&args[a_stride + 2], spatial, 1, dl))
        return FL_ERR_UNSUPPORTED;
    g->N = xin->sizes[0]; g->C = xin->sizes[1];
    g->O = yout->sizes[1];
    g->G = groups;
    if (spatial == 1) {
        g->H = 1; g->W = xin->sizes[2]; g->OH = 1; g->OW = yout->sizes[2];
        g->KH = 1; g->KW = w->sizes[2];
        g->sh = 1; g->ph = 0; g->dh = 1;
        g->sw = st[0]; g->pw = pd[0]; g->dw = dl[0];
    } else {
        g->H = xin->sizes[2]; g->W = xin->sizes[3]; g->OH = yout->sizes[2]; g->OW = yout->sizes[3];
        g->KH = w->sizes[2]; g->KW = w->sizes[3];
        g->sh = st[0]; g->sw = st[1]; g->ph = pd[0]; g->pw = pd[1]; g->dh = dl[0]; g->dw = dl[1];
    }
    if (yout->sizes[0] != g->N) FL_FAIL(FL_ERR_INVALID, "convolution: batch sizes differ");
    if (g->G < 1 || g->C % g->G || g->O % g->G) FL_FAIL(FL_ERR_INVALID, "convolution: bad groups %lld", (long long)g->G);
    if (g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1 || g->ph < 0 || g->pw < 0)
        FL_FAIL(FL_ERR_INVALID, "convolution: bad stride/padding/dilation");
    if (w->sizes[0] != g->O || w->sizes[1] * g->G != g->C)
        FL_FAIL(FL_ERR_INVALID, "convolution: weight shape does not match the channels");
    /* the output extent an ordinary convolution would give */
    int64_t eh = (g->H + 2 * g->ph - g->dh * (g->KH - 1) - 1), ew = (g->W + 2 * g->pw - g->dw * (g->KW - 1) - 1);
    int64_t oh = eh < 0 ? 0 : eh / g->sh + 1, ow = ew < 0 ? 0 : ew / g->sw + 1;
    /* A transposed convolution's output_padding (< stride or dilation) can make its output one
     * ordinary-convolution step longer than needed: those rows receive no contributions. */
    int loose = transposed && g->OH <= oh && g->OW <= ow && g->OH + g->sh + g->dh > oh && g->OW + g->sw + g->dw > ow;
    if (g->N > 0 && (oh != g->OH || ow != g->OW) && !loose)
        FL_FAIL(FL_ERR_INVALID, "convolution: output extent %lldx%lld, expected %lldx%lld", (long long)g->OH,
                (long long)g->OW, (long long)oh, (long long)ow);
    /* BLAS dimensions are 32-bit */
    if ((g->C / g->G) * g->KH * g->KW > INT_MAX / 4 || g->OH * g->OW * g->N > INT_MAX / 4 || g->O > INT_MAX / 4)
        return FL_ERR_UNSUPPORTED;
    return FL_OK;
}


/* aten::convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups) */
int fl_lin_convolution(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 9 || n_out < 1) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *w = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *b = fl_arg_tensor(args, n_args, 2, in, n_in), *y = &out[0];
    if (!x || !w) return FL_ERR_UNSUPPORTED;
    int dt = x->dtype;
    if (!fl_lin_float_dt(dt) || w->dtype != dt || y->dtype != dt || (b && (b->dtype != dt || b->ndim != 1)))
        return FL_ERR_UNSUPPORTED;
    int transposed = (int)args[6].i;
    geom_t g;
    int st = transposed ? make_geom(&g, y, x, w, args, 3, args[8].i, 1) : make_geom(&g, x, y, w, args, 3, args[8].i, 0);
    if (st) return st;
    if (!transposed && x->ndim == 4 && fl_is_channels_last(y) && !fl_is_contiguous(y))
        return dt == FL_FLOAT32 ? conv_nhwc_f32(&g, x, w, b, y) : conv_nhwc_f64(&g, x, w, b, y);
    /* a transposed weight is (Cin, Cout/G, ...) = conv weight layout (O, C/G) with O = Cin */
    void *xo, *wo, *bo = NULL, *yo;
    const void *xp = fl_lin_pack(x, &xo), *wp = fl_lin_pack(w, &wo), *bp = NULL;
    void *yp = fl_lin_out_buf(y, &yo);
    if (b) bp = fl_lin_pack(b, &bo);
    if (!xp || !wp || !yp || (b && !bp)) {
        st = FL_ERR_OOM;
        fl_host_set_error("convolution: cannot allocate scratch");
    } else if (dt == FL_FLOAT32) {
        st = transposed ? conv_bwd_f32(&g, xp, wp, yp, NULL, NULL) : conv_fwd_f32(&g, xp, wp, yp);
        if (!st && bp) add_bias_f32(yp, bp, g.N, transposed ? g.C : g.O, transposed ? g.H * g.W : g.OH * g.OW);
    } else {
        st = transposed ? conv_bwd_f64(&g, xp, wp, yp, NULL, NULL) : conv_fwd_f64(&g, xp, wp, yp);
        if (!st && bp) add_bias_f64(yp, bp, g.N, transposed ? g.C : g.O, transposed ? g.H * g.W : g.OH * g.OW);
    }
    free(xo); free(wo); free(bo);
    if (st) { free(yo); return st; }
    fl_lin_unpack(y, yo);
    return FL_OK;
}

/* aten::convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
 *                            transposed, output_padding, groups, output_mask) */
int fl_lin_convolution_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 11 || n_out < 3) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *go = fl_arg_tensor(args, n_args, 0, in, n_in), *x = fl_arg_tensor(args, n_args, 1, in, n_in),
                      *w = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!go || !x || !w) return FL_ERR_UNSUPPORTED;
    int dt = go->dtype;
    if (!fl_lin_float_dt(dt) || x->dtype != dt || w->dtype != dt) return FL_ERR_UNSUPPORTED;
    const fl_arg_t *mask = &args[10];
    int m[3] = {1, 1, 1};
    if (mask->kind == FL_ARG_INT_LIST && mask->len == 3)
        for (int k = 0; k < 3; k++) m[k] = mask->list[k] != 0;
    const fl_tensor_t *gi = m[0] ? fl_out_at(out, n_out, 0) : NULL, *gw = m[1] ? fl_out_at(out, n_out, 1) : NULL,
                      *gb = m[2] ? fl_out_at(out, n_out, 2) : NULL;
    if ((gi && gi->dtype != dt) || (gw && gw->dtype != dt) || (gb && gb->dtype != dt)) return FL_ERR_UNSUPPORTED;
    int transposed = (int)args[7].i;
    geom_t g;
    int st = transposed ? make_geom(&g, go, x, w, args, 4, args[9].i, 1) : make_geom(&g, x, go, w, args, 4, args[9].i, 0);
    if (st) return st;
    if (gi && (gi->ndim != x->ndim || fl_numel(gi) != fl_numel(x))) FL_FAIL(FL_ERR_INVALID, "convolution_backward: grad_input shape");
    if (gw && fl_numel(gw) != fl_numel(w)) FL_FAIL(FL_ERR_INVALID, "convolution_backward: grad_weight shape");
    if (gb && fl_numel(gb) != go->sizes[1]) FL_FAIL(FL_ERR_INVALID, "convolution_backward: grad_bias shape");

    /* channels-last: an NHWC input gradient is asked for, or (weight gradient only) the input is NHWC; with
     * at least 8 channels a group (runs of fewer make the patch copies and the scatter cost more than the
     * transposing copies of the NCHW route: 54 against 31 us for a 3-channel 16x16 one, measured) */
    if (!transposed && x->ndim == 4 && (gw || gi) && g.C / g.G >= 8 && (!gw || gw->ndim == 4) && (!gb || gb->ndim == 1) &&
        ((gi && fl_is_channels_last(gi) && !fl_is_contiguous(gi)) ||
         (!gi && fl_is_channels_last(x) && !fl_is_contiguous(x))) &&
        (double)(g.N * g.OH * g.OW) * (double)(g.KH * g.KW * (g.C / g.G)) * 8.0 <= 256.0 * 1024 * 1024)
        return dt == FL_FLOAT32 ? conv_backward_nhwc_f32(&g, go, x, w, gi, gw, gb)
                                : conv_backward_nhwc_f64(&g, go, x, w, gi, gw, gb);
    void *goo, *xo = NULL, *wo = NULL, *gio = NULL, *gwo = NULL, *gbo = NULL;
    const void *gop = fl_lin_pack(go, &goo), *xp = NULL, *wp = NULL;
    void *gip = NULL, *gwp = NULL, *gbp = NULL;
    int oom = !gop;
    if (gw) { xp = fl_lin_pack(x, &xo); oom |= !xp; }
    if (gi) { wp = fl_lin_pack(w, &wo); gip = fl_lin_out_buf(gi, &gio); oom |= !wp || !gip; }
    if (gw) { gwp = fl_lin_out_buf(gw, &gwo); oom |= !gwp; }
    if (gb) { gbp = fl_lin_out_buf(gb, &gbo); oom |= !gbp; }
    if (oom) {
        st = FL_ERR_OOM;
        fl_host_set_error("convolution_backward: cannot allocate scratch");
        goto done;
    }
    int64_t gnc = g.N * go->sizes[1], gP = gnc > 0 ? fl_numel(go) / gnc : 0;
    /* ordinary: X = input, dY = grad_output; transposed: X = grad_output, dY = input */
    const void *X = transposed ? gop : xp, *dY = transposed ? xp : gop;
    if (dt == FL_FLOAT32) {
        if (transposed) {
            if (gi) st = conv_fwd_f32(&g, gop, wp, gip);
            if (!st && gw) st = conv_bwd_f32(&g, dY, NULL, NULL, X, gwp);
        } else {
            st = conv_bwd_f32(&g, dY, wp, gip, X, gwp);
        }
        if (!st && gb) bias_grad_f32(gop, gbp, g.N, go->sizes[1], gP);
    } else {
        if (transposed) {
            if (gi) st = conv_fwd_f64(&g, gop, wp, gip);
            if (!st && gw) st = conv_bwd_f64(&g, dY, NULL, NULL, X, gwp);
        } else {
            st = conv_bwd_f64(&g, dY, wp, gip, X, gwp);
        }
        if (!st && gb) bias_grad_f64(gop, gbp, g.N, go->sizes[1], gP);
    }
done:
    free(goo); free(xo); free(wo);
    return fl_lin_finish_grads(st, (const fl_tensor_t *const[3]){gi, gw, gb}, (void *[3]){gio, gwo, gbo});
}

#else /* ======================= typed section (LIN_T) ======================= */

#define T LIN_T
#define F(name) LIN_CAT(name, LIN_CAT(_, LIN_S))

/* One row of im2col: col[oh*OW + ow] = x[ih][iw] or 0, for kernel tap (ki, kj). */
LIN_CLONES static void F(im2col_row)(const geom_t *g, const T *xc, int64_t ki, int64_t kj, T *dst) {
    const int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW;
    const int64_t sw = g->sw, off_w = kj * g->dw - g->pw;
    /* valid ow range: 0 <= ow*sw + off_w < W */
    int64_t lo = off_w >= 0 ? 0 : (-off_w + sw - 1) / sw;
    int64_t hi = W - off_w <= 0 ? 0 : (W - off_w - 1) / sw + 1;
    if (hi > OW) hi = OW;
    if (lo > hi) lo = hi;
    for (int64_t oh = 0; oh < OH; oh++, dst += OW) {
        int64_t ih = oh * g->sh - g->ph + ki * g->dh;
        if (ih < 0 || ih >= H) { memset(dst, 0, (size_t)OW * sizeof(T)); continue; }
        const T *src = xc + ih * W;
        for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0;
        if (sw == 1) memcpy(dst + lo, src + lo + off_w, (size_t)(hi - lo) * sizeof(T));
        else
            for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow * sw + off_w];
        for (int64_t ow = hi; ow < OW; ow++) dst[ow] = 0;
    }
}

/* im2col for samples [n0, n0+nb): col is (C*KH*KW) x (nb*P), row stride nb*P. */
static void F(im2col)(const geom_t *g, const T *x, int64_t n0, int64_t nb, T *col, int par) {
    const int64_t KK = g->KH * g->KW, rows = g->C * KK, P = g->OH * g->OW, ld = nb * P, HW = g->H * g->W;
#pragma omp parallel for schedule(static) collapse(2) if (par)
    for (int64_t s = 0; s < nb; s++)
        for (int64_t r = 0; r < rows; r++) {
            int64_t c = r / KK, k = r % KK;
            F(im2col_row)(g, x + ((n0 + s) * g->C + c) * HW, k / g->KW, k % g->KW, col + r * ld + s * P);
        }
}

/* col2im of one channel plane: xc (H, W) = sum over taps of its col rows. */
LIN_CLONES static void F(col2im_plane)(const geom_t *g, const T *colc, int64_t ld, T *xc) {
    const int64_t KK = g->KH * g->KW, H = g->H, W = g->W, OH = g->OH, OW = g->OW, sw = g->sw;
    memset(xc, 0, (size_t)(H * W) * sizeof(T));
    for (int64_t k = 0; k < KK; k++) {
        int64_t ki = k / g->KW, kj = k % g->KW;
        const T *src = colc + k * ld;
        int64_t off_w = kj * g->dw - g->pw;
        int64_t lo = off_w >= 0 ? 0 : (-off_w + sw - 1) / sw;
        int64_t hi = W - off_w <= 0 ? 0 : (W - off_w - 1) / sw + 1;
        if (hi > OW) hi = OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t ih = oh * g->sh - g->ph + ki * g->dh;
            if (ih < 0 || ih >= H) continue;
            T *d = xc + ih * W;
            const T *sr = src + oh * OW;
            if (sw == 1) {
                T *dd = d + off_w;
#pragma omp simd
                for (int64_t ow = lo; ow < hi; ow++) dd[ow] += sr[ow];
            } else {
                for (int64_t ow = lo; ow < hi; ow++) d[ow * sw + off_w] += sr[ow];
            }
        }
    }
}

/* dx[n0+s] = col2im(col) for the chunk; col is (C*KH*KW) x (nb*P). */
static void F(col2im)(const geom_t *g, const T *col, int64_t n0, int64_t nb, T *dx, int par) {
    const int64_t KK = g->KH * g->KW, P = g->OH * g->OW, ld = nb * P, HW = g->H * g->W;
#pragma omp parallel for schedule(static) collapse(2) if (par)
    for (int64_t s = 0; s < nb; s++)
        for (int64_t c = 0; c < g->C; c++)
            F(col2im_plane)(g, col + c * KK * ld + s * P, ld, dx + ((n0 + s) * g->C + c) * HW);
}

static void F(add_bias)(T *y, const T *b, int64_t N, int64_t C, int64_t P) {
#pragma omp parallel for schedule(static) collapse(2) if (N * C * P > 32768)
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            T *p = y + (n * C + c) * P, v = b[c];
#pragma omp simd
            for (int64_t i = 0; i < P; i++) p[i] += v;
        }
}

static void F(bias_grad)(const T *go, T *gb, int64_t N, int64_t C, int64_t P) {
#pragma omp parallel for schedule(static) if (N * C * P > 32768)
    for (int64_t c = 0; c < C; c++) {
        double acc = 0.0;
        for (int64_t n = 0; n < N; n++) {
            const T *p = go + (n * C + c) * P;
            double a = 0.0;
#pragma omp simd reduction(+ : a)
            for (int64_t i = 0; i < P; i++) a += p[i];
            acc += a;
        }
        gb[c] = (T)acc;
    }
}

/* (O x nb*P) chunk matrix <-> rows of y (N, O, P) for samples [n0, n0+nb). */
static void F(scatter)(const T *tmp, T *y, int64_t n0, int64_t nb, int64_t O, int64_t P, int par) {
#pragma omp parallel for schedule(static) collapse(2) if (par)
    for (int64_t s = 0; s < nb; s++)
        for (int64_t o = 0; o < O; o++)
            memcpy(y + ((n0 + s) * O + o) * P, tmp + o * nb * P + s * P, (size_t)P * sizeof(T));
}
static void F(gather)(const T *y, T *tmp, int64_t n0, int64_t nb, int64_t O, int64_t P, int par) {
#pragma omp parallel for schedule(static) collapse(2) if (par)
    for (int64_t s = 0; s < nb; s++)
        for (int64_t o = 0; o < O; o++)
            memcpy(tmp + o * nb * P + s * P, y + ((n0 + s) * O + o) * P, (size_t)P * sizeof(T));
}

/* Scratch for one chunk of nb samples (this thread's cached slots 0 and 1). */
static int F(ws_alloc)(const geom_t *g, int64_t nb, int need_col, T **col, T **tmp) {
    const int64_t P = g->OH * g->OW;
    *col = NULL; *tmp = NULL;
    if (need_col) {
        *col = fl_lin_scratch(0, (size_t)(g->C * g->KH * g->KW * nb * P) * sizeof(T));
        if (!*col) return 0;
    }
    if (nb > 1) {
        *tmp = fl_lin_scratch(1, (size_t)(g->O * nb * P) * sizeof(T));
        if (!*tmp) return 0;
    }
    return 1;
}

/* forward of one chunk: y = W * im2col(x) */
static void F(fwd_chunk)(const geom_t *g, const T *x, const T *w, T *y, int64_t n0, int64_t nb, T *col, T *tmp,
                         int par) {
    const int64_t P = g->OH * g->OW, HW = g->H * g->W, Og = g->O / g->G, K = (g->C / g->G) * g->KH * g->KW;
    const int64_t ld = nb * P;
    const T *cp;
    if (trivial_1x1(g) && nb == 1) cp = x + n0 * g->C * HW;
    else { F(im2col)(g, x, n0, nb, col, par); cp = col; }
    T *dst = nb == 1 ? y + n0 * g->O * P : tmp;
    for (int64_t gr = 0; gr < g->G; gr++)
        fl_lin_gemm(LIN_DT, 0, 0, Og, ld, K, 1.0, w + gr * Og * K, K, cp + gr * K * ld, ld, 0.0, dst + gr * Og * ld, ld);
    if (nb > 1) F(scatter)(tmp, y, n0, nb, g->O, P, par);
}

/* backward of one chunk: dx = col2im(W^T dy) and/or dw_acc += dy im2col(x)^T */
static void F(bwd_chunk)(const geom_t *g, const T *dy, const T *w, T *dx, const T *x, T *dw, int64_t n0, int64_t nb,
                         T *col, T *tmp, int par) {
    const int64_t P = g->OH * g->OW, HW = g->H * g->W, Og = g->O / g->G, K = (g->C / g->G) * g->KH * g->KW;
    const int64_t ld = nb * P;
    const int direct = trivial_1x1(g) && nb == 1;
    const T *dyp;
    if (nb == 1) dyp = dy + n0 * g->O * P;
    else { F(gather)(dy, tmp, n0, nb, g->O, P, par); dyp = tmp; }
    if (dx) {
        T *cdst = direct ? dx + n0 * g->C * HW : col;
        for (int64_t gr = 0; gr < g->G; gr++)
            fl_lin_gemm(LIN_DT, 1, 0, K, ld, Og, 1.0, w + gr * Og * K, K, dyp + gr * Og * ld, ld, 0.0,
                        cdst + gr * K * ld, ld);
        if (!direct) F(col2im)(g, col, n0, nb, dx, par);
    }
    if (dw) {
        const T *cp;
        if (direct) cp = x + n0 * g->C * HW;
        else { F(im2col)(g, x, n0, nb, col, par); cp = col; }
        for (int64_t gr = 0; gr < g->G; gr++)
            fl_lin_gemm(LIN_DT, 0, 1, Og, K, ld, 1.0, dyp + gr * Og * ld, ld, cp + gr * K * ld, ld, 1.0,
                        dw + gr * Og * K, K);
    }
}

#define OOM_RET FL_FAIL(FL_ERR_OOM, "convolution: cannot allocate scratch")

/* y (N, O, OH, OW) = conv(x (N, C, H, W), w (O, C/G, KH, KW)) */
static int F(conv_fwd)(const geom_t *g, const T *x, const T *w, T *y) {
    const int64_t P = g->OH * g->OW;
    if (g->N == 0 || P == 0 || g->O == 0) return FL_OK;
    int nt = fl_lin_threads();
    const int64_t nb_max = chunk_of(g, sizeof(T), nt), nchunks = (g->N + nb_max - 1) / nb_max;
    const int need_col = !(trivial_1x1(g) && nb_max == 1);
    if (nt > 1 && nchunks >= nt) { /* whole chunks per thread */
        int fail = 0;
#pragma omp parallel
        {
            T *col, *tmp;
            int ok = F(ws_alloc)(g, nb_max, need_col, &col, &tmp);
            if (!ok) {
#pragma omp atomic write
                fail = 1;
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t ch = 0; ch < nchunks; ch++) {
                int64_t n0 = ch * nb_max, nb = g->N - n0 < nb_max ? g->N - n0 : nb_max;
                if (ok) F(fwd_chunk)(g, x, w, y, n0, nb, col, tmp, 0);
            }
            fl_lin_scratch_trim();
        }
        if (fail) OOM_RET;
        return FL_OK;
    }
    T *col, *tmp;
    if (!F(ws_alloc)(g, nb_max, need_col, &col, &tmp)) OOM_RET;
    for (int64_t n0 = 0; n0 < g->N; n0 += nb_max)
        F(fwd_chunk)(g, x, w, y, n0, g->N - n0 < nb_max ? g->N - n0 : nb_max, col, tmp, 1);
    fl_lin_scratch_trim();
    return FL_OK;
}

/* dx (N, C, H, W) = conv^T(dy (N, O, OH, OW), w) and/or dw = sum_n dy[n] im2col(x[n])^T */
static int F(conv_bwd)(const geom_t *g, const T *dy, const T *w, T *dx, const T *x, T *dw) {
    const int64_t P = g->OH * g->OW, HW = g->H * g->W, K = (g->C / g->G) * g->KH * g->KW, WN = g->O * K;
    if (dw) memset(dw, 0, (size_t)WN * sizeof(T));
    if (g->N == 0) return FL_OK;
    if (P == 0 || g->O == 0) {
        if (dx) memset(dx, 0, (size_t)(g->N * g->C * HW) * sizeof(T));
        return FL_OK;
    }
    if (dx && HW == 0) dx = NULL;
    if (!dx && !dw) return FL_OK;
    int nt = fl_lin_threads();
    const int64_t nb_max = chunk_of(g, sizeof(T), nt), nchunks = (g->N + nb_max - 1) / nb_max;
    const int need_col = !(trivial_1x1(g) && nb_max == 1);
    if (nt > 1 && nchunks >= nt) {
        int fail = 0;
        T **acc = calloc((size_t)nt, sizeof(T *));
        if (!acc) OOM_RET;
#pragma omp parallel num_threads(nt)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            T *col, *tmp;
            int ok = F(ws_alloc)(g, nb_max, need_col, &col, &tmp);
            T *mine = NULL;
            if (ok && dw) {
                mine = t == 0 ? dw : fl_lin_scratch(2, (size_t)WN * sizeof(T));
                if (mine && t != 0) memset(mine, 0, (size_t)WN * sizeof(T));
                if (!mine) ok = 0;
                acc[t] = mine;
            }
            if (!ok) {
#pragma omp atomic write
                fail = 1;
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t ch = 0; ch < nchunks; ch++) {
                int64_t n0 = ch * nb_max, nb = g->N - n0 < nb_max ? g->N - n0 : nb_max;
                if (ok) F(bwd_chunk)(g, dy, w, dx, x, mine, n0, nb, col, tmp, 0);
            }
            /* implicit barrier: every partial dw is complete */
            if (dw && !fail) {
#pragma omp for schedule(static)
                for (int64_t i = 0; i < WN; i++) {
                    T s = dw[i];
                    for (int k = 1; k < n; k++) s += acc[k][i];
                    dw[i] = s;
                }
            }
            fl_lin_scratch_trim();
        }
        free(acc);
        if (fail) OOM_RET;
        return FL_OK;
    }
    T *col, *tmp;
    if (!F(ws_alloc)(g, nb_max, need_col, &col, &tmp)) OOM_RET;
    for (int64_t n0 = 0; n0 < g->N; n0 += nb_max)
        F(bwd_chunk)(g, dy, w, dx, x, dw, n0, g->N - n0 < nb_max ? g->N - n0 : nb_max, col, tmp, 1);
    fl_lin_scratch_trim();
    return FL_OK;
}

/* ---- channels-last forward ---- */

/* t (4-D, sizes (A, B, C, D)) as a dense (A, C, D, B) array: the data itself when it is laid out
 * so, else a copy in *owned. NHWC for an activation, (O, KH, KW, C/G) for a weight. */
static const T *F(as_nhwc)(const fl_tensor_t *t, T **owned) {
    *owned = NULL;
    const T *src = (const T *)fl_elem(t, t->offset);
    if (fl_is_channels_last(t)) return src;
    const int64_t A = t->sizes[0], B = t->sizes[1], C = t->sizes[2], D = t->sizes[3];
    const int64_t s0 = t->strides[0], s1 = t->strides[1], s2 = t->strides[2], s3 = t->strides[3];
    T *dst = malloc((size_t)(A * B * C * D) * sizeof(T) + 1);
    if (!dst) return NULL;
#pragma omp parallel for schedule(static) collapse(2) if (A * B * C * D > 65536)
    for (int64_t a = 0; a < A; a++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t d = 0; d < D; d++) {
                T *row = dst + ((a * C + c) * D + d) * B;
                const T *from = src + a * s0 + c * s2 + d * s3;
                for (int64_t b = 0; b < B; b++) row[b] = from[b * s1];
            }
    *owned = dst;
    return dst;
}

/* One patch row: the KH*KW runs of Cg channels (from channel c0) output pixel p of sample n reads. */
LIN_CLONES static void F(patch_nhwc)(const geom_t *g, const T *x, int64_t r, int64_t c0, T *dst) {
    const int64_t P = g->OH * g->OW, n = r / P, p = r % P, oh = p / g->OW, ow = p % g->OW, Cg = g->C / g->G;
    const T *xn = x + n * g->H * g->W * g->C + c0;
    for (int64_t ki = 0; ki < g->KH; ki++) {
        const int64_t ih = oh * g->sh - g->ph + ki * g->dh;
        for (int64_t kj = 0; kj < g->KW; kj++, dst += Cg) {
            const int64_t iw = ow * g->sw - g->pw + kj * g->dw;
            if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) memset(dst, 0, (size_t)Cg * sizeof(T));
            else memcpy(dst, xn + (ih * g->W + iw) * g->C, (size_t)Cg * sizeof(T));
        }
    }
}

/* y rows [r0, r0+nr) of every group: patches (or the input itself, for a 1x1 / stride 1 / no padding
 * convolution without groups) times the weight, one single-threaded GEMM per group */
static void F(nhwc_rows)(const geom_t *g, const T *x, const T *w, T *y, int64_t r0, int64_t nr, T *col,
                         void (*gemm)(int, int, int, int64_t, int64_t, int64_t, double, const void *, int64_t,
                                      const void *, int64_t, double, void *, int64_t)) {
    const int64_t Og = g->O / g->G, Cg = g->C / g->G, K = g->KH * g->KW * Cg;
    if (!col) {
        gemm(LIN_DT, 0, 1, nr, g->O, g->C, 1.0, x + r0 * g->C, g->C, w, g->C, 0.0, y + r0 * g->O, g->O);
        return;
    }
    for (int64_t gr = 0; gr < g->G; gr++) {
        for (int64_t i = 0; i < nr; i++) F(patch_nhwc)(g, x, r0 + i, gr * Cg, col + i * K);
        gemm(LIN_DT, 0, 1, nr, Og, K, 1.0, col, K, w + gr * Og * K, K, 0.0, y + r0 * g->O + gr * Og, g->O);
    }
}

/* y (N, OH, OW, O) = conv(x (N, H, W, C), w (O, KH, KW, C/G)) + b; y is the output's dense NHWC data.
 * The output rows are split into chunks whose patches stay in a thread's cache; each thread takes
 * whole chunks (patches and GEMM), as the NCHW path takes whole samples. Too few rows for that (a
 * small late-stage map): one chunk, its GEMM split over the threads along the output channels. */
static int F(conv_fwd_nhwc)(const geom_t *g, const T *x, const T *w, const T *b, T *y) {
    const int64_t R = g->N * g->OH * g->OW, Cg = g->C / g->G, K = g->KH * g->KW * Cg;
    if (R == 0 || g->O == 0) return FL_OK;
    const int direct = trivial_1x1(g) && g->G == 1;
    int nt = fl_lin_threads();
    int64_t rb = (int64_t)((512.0 * 1024) / ((double)K * sizeof(T)));
    if (rb < 32) rb = 32;
    if (nt > 1 && rb > (R + nt - 1) / nt) rb = (R + nt - 1) / nt; /* a chunk per thread at least */
    if (rb < 1) rb = 1;
    const int64_t nchunks = (R + rb - 1) / rb;
    if (nt > 1 && R < 64 * nt) {
        T *col = direct ? NULL : fl_lin_scratch(0, (size_t)(R * K) * sizeof(T));
        if (!direct && !col) FL_FAIL(FL_ERR_OOM, "convolution: cannot allocate scratch");
        F(nhwc_rows)(g, x, w, y, 0, R, col, fl_lin_gemm);
        fl_lin_scratch_trim();
        goto bias;
    }
    int fail = 0;
#pragma omp parallel if (nt > 1 && nchunks > 1)
    {
        T *col = direct ? NULL : fl_lin_scratch(0, (size_t)(rb * K) * sizeof(T));
        if (!direct && !col) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t ch = 0; ch < nchunks; ch++) {
            const int64_t r0 = ch * rb, nr = R - r0 < rb ? R - r0 : rb;
            if (direct || col) F(nhwc_rows)(g, x, w, y, r0, nr, col, fl_lin_gemm1);
        }
        fl_lin_scratch_trim();
    }
    if (fail) FL_FAIL(FL_ERR_OOM, "convolution: cannot allocate scratch");
bias:
    if (b) {
#pragma omp parallel for schedule(static) if (R * g->O > 32768)
        for (int64_t r = 0; r < R; r++) {
            T *row = y + r * g->O;
#pragma omp simd
            for (int64_t o = 0; o < g->O; o++) row[o] += b[o];
        }
    }
    return FL_OK;
}

/* The kernel's channels-last route: x and w read through as_nhwc, y written in place. */
static int F(conv_nhwc)(const geom_t *g, const fl_tensor_t *x, const fl_tensor_t *w, const fl_tensor_t *b,
                        const fl_tensor_t *y) {
    if (fl_numel(y) == 0) return FL_OK;
    T *xo = NULL, *wo = NULL;
    void *bo = NULL;
    const T *xp = F(as_nhwc)(x, &xo), *wp = F(as_nhwc)(w, &wo), *bp = b ? fl_lin_pack(b, &bo) : NULL;
    int st;
    if (!xp || !wp || (b && !bp)) {
        st = FL_ERR_OOM;
        fl_host_set_error("convolution: cannot allocate scratch");
    } else {
        st = F(conv_fwd_nhwc)(g, xp, wp, bp, (T *)fl_elem(y, y->offset));
    }
    free(xo); free(wo); free(bo);
    return st;
}

/* ---- channels-last backward ---- */

/* The gradients of an ordinary 2-D convolution with NHWC operands, in that layout, no packing copies:
 *   cols (R, K) = dY_g (R, Og) * w'_g (Og, K), scattered back into dX (N, H, W, C)   (col2im)
 *   dW'_g (Og, K) = dY_g^T * patches_g (R, K)                                         (im2col)
 *   db = the column sums of dY (R, O)
 * with R = N*OH*OW rows, K = KH*KW*Cg, w' the weight as (O, KH, KW, Cg). dx: gi's dense NHWC data (or NULL),
 * dw: (O, K) scratch (or NULL), db: O values (or NULL). */
static int F(conv_bwd_nhwc)(const geom_t *g, const T *dy, const T *x, const T *w, T *dx, T *dw, T *db) {
    const int64_t R = g->N * g->OH * g->OW, Cg = g->C / g->G, Og = g->O / g->G, K = g->KH * g->KW * Cg;
    const int64_t HWC = g->H * g->W * g->C, P = g->OH * g->OW;
    if (dx && g->N * HWC != 0) memset(dx, 0, (size_t)(g->N * HWC) * sizeof(T));
    if (dw) memset(dw, 0, (size_t)(g->O * K) * sizeof(T));
    if (db) {
        for (int64_t o = 0; o < g->O; o++) db[o] = 0;
        for (int64_t r = 0; r < R; r++) {
            const T *row = dy + r * g->O;
#pragma omp simd
            for (int64_t o = 0; o < g->O; o++) db[o] += row[o];
        }
    }
    if (R == 0 || K == 0 || (!dx && !dw)) return FL_OK;
    T *col = malloc((size_t)(R * K) * sizeof(T) + 1);
    if (!col) FL_FAIL(FL_ERR_OOM, "convolution_backward: cannot allocate scratch");
    for (int64_t gr = 0; gr < g->G; gr++) {
        const T *dyg = dy + gr * Og;
        if (dw) {
#pragma omp parallel for schedule(static) if (R * K > 65536)
            for (int64_t r = 0; r < R; r++) F(patch_nhwc)(g, x, r, gr * Cg, col + r * K);
            fl_lin_gemm(LIN_DT, 1, 0, Og, K, R, 1.0, dyg, g->O, col, K, 0.0, dw + gr * Og * K, K);
        }
        if (dx) {
            fl_lin_gemm(LIN_DT, 0, 0, R, K, Og, 1.0, dyg, g->O, w + gr * Og * K, K, 0.0, col, K);
            /* col2im: samples are independent, a sample's patches overlap */
#pragma omp parallel for schedule(static) if (R * K > 65536 && g->N > 1)
            for (int64_t n = 0; n < g->N; n++) {
                T *dxn = dx + n * HWC + gr * Cg;
                for (int64_t p = 0; p < P; p++) {
                    const T *src = col + (n * P + p) * K;
                    const int64_t oh = p / g->OW, ow = p % g->OW;
                    for (int64_t ki = 0; ki < g->KH; ki++) {
                        const int64_t ih = oh * g->sh - g->ph + ki * g->dh;
                        for (int64_t kj = 0; kj < g->KW; kj++, src += Cg) {
                            const int64_t iw = ow * g->sw - g->pw + kj * g->dw;
                            if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) continue;
                            T *d = dxn + (ih * g->W + iw) * g->C;
#pragma omp simd
                            for (int64_t c = 0; c < Cg; c++) d[c] += src[c];
                        }
                    }
                }
            }
        }
    }
    free(col);
    return FL_OK;
}

/* convolution_backward's channels-last route: go, x, w read through as_nhwc, gi written in place (dense
 * NHWC), gw from (O, KH, KW, Cg) scratch through its strides, gb through its stride. */
static int F(conv_backward_nhwc)(const geom_t *g, const fl_tensor_t *go, const fl_tensor_t *x, const fl_tensor_t *w,
                                 const fl_tensor_t *gi, const fl_tensor_t *gw, const fl_tensor_t *gb) {
    T *goo = NULL, *xo = NULL, *wo = NULL, *dw = NULL, *db = NULL;
    const int64_t Cg = g->C / g->G, K = g->KH * g->KW * Cg;
    const T *dyp = F(as_nhwc)(go, &goo), *xp = gw ? F(as_nhwc)(x, &xo) : NULL, *wp = gi ? F(as_nhwc)(w, &wo) : NULL;
    if (gw) dw = malloc((size_t)(g->O * K) * sizeof(T) + 1);
    if (gb) db = malloc((size_t)g->O * sizeof(T) + 1);
    int st = FL_OK;
    /* (an empty tensor's data may be NULL: only a missing copy of a non-empty one is out of memory) */
    if ((!dyp && fl_numel(go)) || (gw && ((!xp && fl_numel(x)) || !dw)) || (gi && !wp && fl_numel(w)) || (gb && !db)) {
        st = FL_ERR_OOM;
        fl_host_set_error("convolution_backward: cannot allocate scratch");
    } else {
        st = F(conv_bwd_nhwc)(g, dyp, xp, wp, gi ? (T *)fl_elem(gi, gi->offset) : NULL, dw, db);
    }
    if (!st && gw) {
        T *o = (T *)fl_elem(gw, gw->offset);
        const int64_t *s = gw->strides;
        for (int64_t oc = 0; oc < g->O; oc++)
            for (int64_t ki = 0; ki < g->KH; ki++)
                for (int64_t kj = 0; kj < g->KW; kj++)
                    for (int64_t c = 0; c < Cg; c++)
                        o[oc * s[0] + c * s[1] + ki * s[2] + kj * s[3]] = dw[((oc * g->KH + ki) * g->KW + kj) * Cg + c];
    }
    if (!st && gb) {
        T *o = (T *)fl_elem(gb, gb->offset);
        for (int64_t oc = 0; oc < g->O; oc++) o[oc * gb->strides[0]] = db[oc];
    }
    free(goo); free(xo); free(wo); free(dw); free(db);
    return st;
}

#undef OOM_RET
#undef T
#undef F
#endif
