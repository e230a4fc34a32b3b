/* Host kernels: nn. Reflection/replication padding, upsampling (nearest,
 * nearest-exact, linear/bilinear/trilinear, bicubic, antialiased bilinear and
 * bicubic), im2col/col2im, grid sampling, embedding bags, pairwise distances,
 * rrelu: forward and the backward ops their autograd formulas call. Pooling
 * is in k_pool.c, convolution in k_conv.c, normalisation in k_norm.c, losses
 * in k_loss.c.
 *
 * Layout: every spatial op sees its tensor as planes x (D, H, W): the leading
 * (batch, channel) dims flatten into planes and 1-D / 2-D ops get unit D (and
 * H). Tensors are read into contiguous float64 scratch and results converted
 * back on store (io_in / io_out / io_end), so one code path serves float32,
 * float64, float16 and bfloat16: values accumulate in double and round once.
 * The index math that decides WHICH input elements are used (upsampling
 * source indices; k_pool.c's fractional pooling intervals) runs in the precision
 * PyTorch's CPU kernels use -- float for float32 and the half types, emulated
 * by rounding each step to float (exact for + - * /), double for float64 --
 * so the chosen elements match PyTorch's. */
#include <stdlib.h>

#include "k_nn.h"

/* ======================================================================
 * Padding: reflection_pad{1,2,3}d, replication_pad{1,2,3}d (+ backward)
 * ====================================================================== */

/* ATen's source index for output position j of one padded dim (negative pads crop) */
static int64_t pad_src(int reflect, int64_t j, int64_t size, int64_t pad) {
    int64_t i_start = pad < 0 ? -pad : 0, o_start = pad > 0 ? pad : 0, i;
    if (j < pad) i = reflect ? 2 * pad - j : pad;
    else if (j < size + pad) i = j;
    else i = reflect ? 2 * (size + pad - 1) - j : size + pad - 1;
    return i - o_start + i_start;
}

/* source index tables for the three dims (unit dims map to 0); NULL + message on a bad pad */
static int64_t *pad_tables(int reflect, int k, const fl_arg_t *pa, const vol_t *iv, const vol_t *ov) {
    int64_t pads[6] = {0};
    if (pa->kind != FL_ARG_INT_LIST || pa->len != 2 * k) {
        fl_host_set_error("padding: expected %d padding values", 2 * k);
        return NULL;
    }
    for (int i = 0; i < 2 * k; i++) pads[i] = pa->list[i];
    const int64_t isz[3] = {iv->D, iv->H, iv->W}, osz[3] = {ov->D, ov->H, ov->W};
    int64_t *tab = malloc((size_t)(osz[0] + osz[1] + osz[2] + 1) * sizeof(int64_t)), *t = tab;
    if (!tab) { fl_host_set_error("padding: cannot allocate scratch"); return NULL; }
    for (int d = 0; d < 3; d++) {
        int kd = 2 - d; /* pads list runs from the last dim: (left, right) of W, then H, then D */
        int64_t lo = kd < k ? pads[2 * kd] : 0, hi = kd < k ? pads[2 * kd + 1] : 0;
        if (osz[d] != isz[d] + lo + hi) {
            fl_host_set_error("%s: padding (%ld, %ld) does not fit an input dim of size %ld",
                              reflect ? "reflection_pad" : "replication_pad", (long)lo, (long)hi, (long)isz[d]);
            free(tab);
            return NULL;
        }
        for (int64_t j = 0; j < osz[d]; j++) {
            int64_t s = pad_src(reflect, j, isz[d], lo);
            if (s < 0 || s >= isz[d]) {
                fl_host_set_error("padding: source index %ld out of range for size %ld", (long)s, (long)isz[d]);
                free(tab);
                return NULL;
            }
            *t++ = s;
        }
    }
    return tab;
}

static int pad_run(int reflect, int k, int bwd, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const char *what = reflect ? "reflection_pad" : "replication_pad";
    /* forward (self, padding) -> out; backward (grad_output, self, padding) -> grad_input */
    const fl_tensor_t *x = IN(0), *y = OUT(0);
    const fl_tensor_t *small = bwd ? y : x, *big = bwd ? x : y;
    vol_t iv, ov;
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    if (!vol_of(small, k, 1, 2, &iv) || !vol_of(big, k, 1, 2, &ov) || !same_planes(small, big, k))
        FL_FAIL(FL_ERR_INVALID, "%s%dd: expected a %dD or %dD input", what, k, k + 1, k + 2);
    int64_t *tab = pad_tables(reflect, k, &args[bwd ? 2 : 1], &iv, &ov);
    if (!tab) return FL_ERR_INVALID;
    const int64_t *sd = tab, *sh = sd + ov.D, *sw = sh + ov.H;
    io_t io = {0};
    const double *src = io_in(&io, x, FL_FLOAT64);
    double *dst = io_out(&io, y, FL_FLOAT64, bwd);
    if (!src || !dst) { free(tab); IO_OOM(&io, what); }
    const int64_t IN_ = vol_n(&iv), ON = vol_n(&ov);
    if (!bwd) {
#pragma omp parallel for schedule(static) if (iv.planes * ON > PAR_MIN)
        for (int64_t p = 0; p < iv.planes; p++)
            for (int64_t od = 0; od < ov.D; od++)
                for (int64_t oh = 0; oh < ov.H; oh++) {
                    const double *row = src + p * IN_ + (sd[od] * iv.H + sh[oh]) * iv.W;
                    double *o = dst + p * ON + (od * ov.H + oh) * ov.W;
                    for (int64_t ow = 0; ow < ov.W; ow++) o[ow] = row[sw[ow]];
                }
    } else { /* src is grad_output (big), dst grad_input (small); one thread per plane */
#pragma omp parallel for schedule(static) if (iv.planes * ON > PAR_MIN)
        for (int64_t p = 0; p < iv.planes; p++)
            for (int64_t od = 0; od < ov.D; od++)
                for (int64_t oh = 0; oh < ov.H; oh++) {
                    double *row = dst + p * IN_ + (sd[od] * iv.H + sh[oh]) * iv.W;
                    const double *g = src + p * ON + (od * ov.H + oh) * ov.W;
                    for (int64_t ow = 0; ow < ov.W; ow++) row[sw[ow]] += g[ow];
                }
    }
    free(tab);
    return io_end(&io, FL_OK);
}

#define PAD_KERNELS(k)                                                                                  \
    static int k_reflection_pad##k(FL_KERNEL_ARGS) { return pad_run(1, k, 0, stream, device, in, n_in, out, n_out, args, n_args); } \
    static int k_reflection_pad##k##_bwd(FL_KERNEL_ARGS) { return pad_run(1, k, 1, stream, device, in, n_in, out, n_out, args, n_args); } \
    static int k_replication_pad##k(FL_KERNEL_ARGS) { return pad_run(0, k, 0, stream, device, in, n_in, out, n_out, args, n_args); } \
    static int k_replication_pad##k##_bwd(FL_KERNEL_ARGS) { return pad_run(0, k, 1, stream, device, in, n_in, out, n_out, args, n_args); }
PAD_KERNELS(1)
PAD_KERNELS(2)
PAD_KERNELS(3)

/* ======================================================================
 * Upsampling. Every mode is separable: each output index of each spatial
 * dim reads a few input indices with weights (a "tap table"); the output is
 * the weighted sum over the product of the three dims' taps, and the
 * backward pass scatters with the same weights. Index math ported from
 * ATen's UpSample.h / cpu/UpSampleKernel.cpp.
 * ====================================================================== */

enum { UP_NEAREST, UP_NEAREST_EXACT, UP_LINEAR, UP_CUBIC, UP_AA_LINEAR, UP_AA_CUBIC };

/* n outputs x k taps (input index, weight); cnt[i] (antialiased modes only) taps used by output i */
typedef struct { int64_t n, k; int64_t *idx; double *w; int64_t *cnt; } taps_t;

/* compute_scales_value: 1/scale when a positive scale was given, else in/out */
static double scales_value(int single, const fl_arg_t *sc, int64_t in, int64_t out) {
    if (sc && sc->kind == FL_ARG_FLOAT && sc->f > 0.0) return rnd(single, 1.0 / sc->f);
    return rnd(single, (double)in / (double)out);
}
static double area_scale(int single, int ac, int64_t in, int64_t out, const fl_arg_t *sc) {
    if (ac) return out > 1 ? rnd(single, (double)(in - 1) / (double)(out - 1)) : 0.0;
    return scales_value(single, sc, in, out);
}
static double source_index(int single, double scale, int64_t i, int ac, int cubic) {
    if (ac) return rnd(single, scale * (double)i);
    double s = rnd(single, rnd(single, scale * rnd(single, (double)i + 0.5)) - 0.5);
    return (!cubic && s < 0.0) ? 0.0 : s;
}
/* guard_index_and_lambda (ATen floors through floorf for every dtype) */
static void guard_index(int single, double real, int64_t in, int64_t *idx, double *lambda) {
    int64_t i = (int64_t)floorf((float)real);
    if (i > in - 1) i = in - 1;
    double l = rnd(single, real - (double)i);
    *idx = i;
    *lambda = l < 0.0 ? 0.0 : l > 1.0 ? 1.0 : l;
}
static double cubic1(double x, double A) { return ((A + 2) * x - (A + 3)) * x * x + 1; }
static double cubic2(double x, double A) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; }
static double aa_filter(int cubic, double x) {
    x = fabs(x);
    if (!cubic) return x < 1.0 ? 1.0 - x : 0.0;
    return x < 1.0 ? cubic1(x, -0.5) : x < 2.0 ? cubic2(x, -0.5) : 0.0;
}

/* The tap table of one dim; 0 or FL_ERR_OOM. Nearest modes have two index
 * rules in ATen: the generic kernel's (scale in the input's precision, no
 * shortcuts) and nearest_idx / nearest_exact_idx (float scale; nearest_idx
 * maps out == in and out == 2*in exactly, whatever the scale). The backward
 * kernels and the 2-D nearest forward use the latter (`idx_rule`). */
static int taps_build(taps_t *t, int mode, int idx_rule, int single, int ac, int64_t in, int64_t out, const fl_arg_t *sc) {
    double scale = 0.0, support = 0.0;
    int64_t k;
    switch (mode) {
    case UP_NEAREST: case UP_NEAREST_EXACT: k = 1; break;
    case UP_LINEAR: k = 2; break;
    case UP_CUBIC: k = 4; break;
    default:
        scale = area_scale(single, ac, in, out, sc);
        support = rnd(single, (mode == UP_AA_CUBIC ? 2.0 : 1.0) * (scale >= 1.0 ? scale : 1.0));
        k = (int64_t)ceil(support) * 2 + 1;
    }
    t->n = out; t->k = k;
    t->idx = malloc((size_t)(out * k + 1) * sizeof(int64_t));
    t->w = malloc((size_t)(out * k + 1) * sizeof(double));
    t->cnt = mode >= UP_AA_LINEAR ? malloc((size_t)(out + 1) * sizeof(int64_t)) : NULL;
    if (!t->idx || !t->w || (mode >= UP_AA_LINEAR && !t->cnt)) return FL_ERR_OOM;
    if (mode != UP_AA_LINEAR && mode != UP_AA_CUBIC) scale = area_scale(single, ac, in, out, sc);
    for (int64_t i = 0; i < out; i++) {
        int64_t *ix = t->idx + i * k;
        double *w = t->w + i * k, lambda;
        switch (mode) {
        case UP_NEAREST: case UP_NEAREST_EXACT: {
            int64_t s;
            if (idx_rule) {
                float fs = (float)scales_value(1, sc, in, out);
                if (mode == UP_NEAREST_EXACT) s = (int64_t)floorf((float)(((double)i + 0.5) * (double)fs));
                else if (out == in) s = i;
                else if (out == 2 * in) s = i >> 1;
                else s = (int64_t)floorf((float)i * fs);
            } else if (mode == UP_NEAREST) {
                s = (int64_t)floorf((float)source_index(single, scale, i, 1, 0));
            } else {
                s = (int64_t)floorf((float)(source_index(single, scale, i, 0, 0) + 0.5));
            }
            ix[0] = s < in - 1 ? s : in - 1;
            w[0] = 1.0;
            break;
        }
        case UP_LINEAR: {
            if (in == out) { ix[0] = ix[1] = i; w[0] = 1.0; w[1] = 0.0; break; }
            guard_index(single, source_index(single, scale, i, ac, 0), in, &ix[0], &lambda);
            ix[1] = ix[0] + (ix[0] < in - 1 ? 1 : 0);
            w[0] = 1.0 - lambda; w[1] = lambda;
            break;
        }
        case UP_CUBIC: {
            int64_t base;
            guard_index(single, source_index(single, scale, i, ac, 1), in, &base, &lambda);
            const double A = -0.75;
            w[0] = cubic2(lambda + 1.0, A); w[1] = cubic1(lambda, A);
            w[2] = cubic1(1.0 - lambda, A); w[3] = cubic2(2.0 - lambda, A);
            for (int j = 0; j < 4; j++) {
                int64_t s = base - 1 + j;
                ix[j] = s < 0 ? 0 : s > in - 1 ? in - 1 : s;
            }
            break;
        }
        default: { /* antialiased: PIL's support window around the centre, normalised weights */
            double center = rnd(single, scale * ((double)i + 0.5));
            double invscale = scale >= 1.0 ? rnd(single, 1.0 / scale) : 1.0;
            int64_t xmin = (int64_t)(rnd(single, center - support) + 0.5);
            if (xmin < 0) xmin = 0;
            int64_t xmax = (int64_t)(rnd(single, center + support) + 0.5);
            int64_t xsize = (xmax < in ? xmax : in) - xmin;
            if (xsize < 0) xsize = 0;
            if (xsize > k) xsize = k;
            double total = 0.0;
            t->cnt[i] = xsize;
            for (int64_t j = 0; j < xsize; j++) {
                ix[j] = xmin + j;
                w[j] = aa_filter(mode == UP_AA_CUBIC,
                                 rnd(single, (rnd(single, (double)(j + xmin) - center) + 0.5) * invscale));
                total += w[j];
            }
            if (total != 0.0)
                for (int64_t j = 0; j < xsize; j++) w[j] /= total;
        }
        }
    }
    return FL_OK;
}

static void taps_identity(taps_t *t) {
    static int64_t zi[1] = {0};
    static double one[1] = {1.0};
    t->n = 1; t->k = 1; t->idx = zi; t->w = one; t->cnt = NULL;
}
static void taps_free(taps_t *t) { free(t->idx); free(t->w); free(t->cnt); }
#define TAPS(t, o) ((t)->cnt ? (t)->cnt[o] : (t)->k)

static void up_forward(const vol_t *iv, const vol_t *ov, const taps_t tp[3], const double *x, double *y) {
    const taps_t *td = &tp[0], *th = &tp[1], *tw = &tp[2];
    const int64_t IN_ = vol_n(iv), ON = vol_n(ov);
#pragma omp parallel for schedule(static) collapse(2) if (iv->planes * ON * tw->k > PAR_MIN)
    for (int64_t p = 0; p < iv->planes; p++)
        for (int64_t od = 0; od < ov->D; od++) {
            const double *xp = x + p * IN_;
            for (int64_t oh = 0; oh < ov->H; oh++) {
                double *o = y + p * ON + (od * ov->H + oh) * ov->W;
                for (int64_t ow = 0; ow < ov->W; ow++) {
                    const int64_t *iw = tw->idx + ow * tw->k;
                    const double *ww = tw->w + ow * tw->k;
                    const int64_t kw = TAPS(tw, ow);
                    double s = 0.0;
                    for (int64_t a = 0; a < TAPS(td, od); a++) {
                        double wd = td->w[od * td->k + a];
                        int64_t id = td->idx[od * td->k + a];
                        for (int64_t b = 0; b < TAPS(th, oh); b++) {
                            const double *row = xp + (id * iv->H + th->idx[oh * th->k + b]) * iv->W;
                            double r = 0.0;
                            for (int64_t c = 0; c < kw; c++) r += ww[c] * row[iw[c]];
                            s += wd * th->w[oh * th->k + b] * r;
                        }
                    }
                    o[ow] = s;
                }
            }
        }
}

static void up_backward(const vol_t *iv, const vol_t *ov, const taps_t tp[3], const double *go, double *gi) {
    const taps_t *td = &tp[0], *th = &tp[1], *tw = &tp[2];
    const int64_t IN_ = vol_n(iv), ON = vol_n(ov);
#pragma omp parallel for schedule(static) if (iv->planes * ON * tw->k > PAR_MIN)
    for (int64_t p = 0; p < iv->planes; p++) {
        double *gp = gi + p * IN_;
        for (int64_t od = 0; od < ov->D; od++)
            for (int64_t oh = 0; oh < ov->H; oh++) {
                const double *g = go + p * ON + (od * ov->H + oh) * ov->W;
                for (int64_t a = 0; a < TAPS(td, od); a++) {
                    double wd = td->w[od * td->k + a];
                    int64_t id = td->idx[od * td->k + a];
                    for (int64_t b = 0; b < TAPS(th, oh); b++) {
                        double wdh = wd * th->w[oh * th->k + b];
                        double *row = gp + (id * iv->H + th->idx[oh * th->k + b]) * iv->W;
                        for (int64_t ow = 0; ow < ov->W; ow++) {
                            const int64_t *iw = tw->idx + ow * tw->k;
                            const double *ww = tw->w + ow * tw->k;
                            double v = wdh * g[ow];
                            for (int64_t c = 0; c < TAPS(tw, ow); c++) row[iw[c]] += ww[c] * v;
                        }
                    }
                }
            }
    }
}

/* forward (self, output_size, [align_corners], scales...) -> out
 * backward (grad_output, output_size, input_size, [align_corners], scales...) -> grad_input */
static int upsample_run(int k, int mode, int has_ac, int bwd, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = IN(0), *y = OUT(0);
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *small = bwd ? y : x, *big = bwd ? x : y;
    vol_t iv, ov;
    if (!vol_of(small, k, 2, 2, &iv) || !vol_of(big, k, 2, 2, &ov) || !same_planes(small, big, k))
        FL_FAIL(FL_ERR_INVALID, "upsample: expected a %dD input (batch, channels and %d spatial dims)", k + 2, k);
    int a0 = bwd ? 3 : 2;
    if (n_args < a0 + has_ac + k) return FL_ERR_UNSUPPORTED;
    int ac = has_ac ? args[a0].i != 0 : 0;
    const fl_arg_t *sc = &args[a0 + has_ac];
    const int64_t isz[3] = {iv.D, iv.H, iv.W}, osz[3] = {ov.D, ov.H, ov.W};
    for (int d = 3 - k; d < 3; d++)
        if (isz[d] <= 0 && osz[d] > 0)
            FL_FAIL(FL_ERR_INVALID, "upsample: input and output sizes should be greater than 0, but got input "
                    "size %ld and output size %ld", (long)isz[d], (long)osz[d]);
    taps_t tp[3];
    int st = FL_OK, single = single_of(x->dtype);
    for (int d = 0; d < 3; d++) {
        if (d < 3 - k) { taps_identity(&tp[d]); continue; }
        tp[d].idx = NULL; tp[d].w = NULL; tp[d].cnt = NULL;
        int m = mode, idx_rule = bwd || (mode == UP_NEAREST && k == 2);
        /* ATen's antialiased forward leaves a dim whose size does not change untouched (its backward does not) */
        if (!bwd && mode >= UP_AA_LINEAR && isz[d] == osz[d]) m = UP_NEAREST, idx_rule = 1;
        if (!st) st = taps_build(&tp[d], m, idx_rule, single, ac, isz[d], osz[d], &sc[d - (3 - k)]);
    }
    io_t io = {0};
    if (!st) {
        const double *src = io_in(&io, x, FL_FLOAT64);
        double *dst = io_out(&io, y, FL_FLOAT64, bwd);
        if (!src || !dst) st = FL_ERR_OOM;
        else if (bwd) up_backward(&iv, &ov, tp, src, dst);
        else up_forward(&iv, &ov, tp, src, dst);
    }
    for (int d = 3 - k; d < 3; d++) taps_free(&tp[d]);
    io_end(&io, st);
    if (st) FL_FAIL(st, "upsample: cannot allocate scratch");
    return FL_OK;
}

#define UP_KERNELS(name, k, mode, ac)                                                                 \
    static int k_##name(FL_KERNEL_ARGS) { return upsample_run(k, mode, ac, 0, stream, device, in, n_in, out, n_out, args, n_args); } \
    static int k_##name##_bwd(FL_KERNEL_ARGS) { return upsample_run(k, mode, ac, 1, stream, device, in, n_in, out, n_out, args, n_args); }
UP_KERNELS(nearest1d, 1, UP_NEAREST, 0)
UP_KERNELS(nearest2d, 2, UP_NEAREST, 0)
UP_KERNELS(nearest3d, 3, UP_NEAREST, 0)
UP_KERNELS(nearest_exact1d, 1, UP_NEAREST_EXACT, 0)
UP_KERNELS(nearest_exact2d, 2, UP_NEAREST_EXACT, 0)
UP_KERNELS(nearest_exact3d, 3, UP_NEAREST_EXACT, 0)
UP_KERNELS(linear1d, 1, UP_LINEAR, 1)
UP_KERNELS(bilinear2d, 2, UP_LINEAR, 1)
UP_KERNELS(trilinear3d, 3, UP_LINEAR, 1)
UP_KERNELS(bicubic2d, 2, UP_CUBIC, 1)
UP_KERNELS(bilinear2d_aa, 2, UP_AA_LINEAR, 1)
UP_KERNELS(bicubic2d_aa, 2, UP_AA_CUBIC, 1)

/* ======================================================================
 * im2col(self, kernel_size, dilation, padding, stride) -> (N, C*kh*kw, L)
 * col2im(self, output_size, kernel_size, dilation, padding, stride) -> (N, C, H, W)
 * ====================================================================== */
static int unfold_run(int fold, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const char *what = fold ? "col2im" : "im2col";
    const fl_tensor_t *x = IN(0), *y = OUT(0);
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *img = fold ? y : x, *col = fold ? x : y;
    int a = fold ? 2 : 1;
    int64_t kk[2], dl[2], pd[2], st[2];
    if (n_args < a + 4 || !ints_arg(&args[a], 2, NULL, kk) || !ints_arg(&args[a + 1], 2, NULL, dl) ||
        !ints_arg(&args[a + 2], 2, NULL, pd) || !ints_arg(&args[a + 3], 2, NULL, st))
        return FL_ERR_UNSUPPORTED;
    if (kk[0] < 1 || kk[1] < 1 || dl[0] < 1 || dl[1] < 1 || pd[0] < 0 || pd[1] < 0 || st[0] < 1 || st[1] < 1)
        FL_FAIL(FL_ERR_INVALID, "%s: kernel_size, dilation and stride must be positive, padding non-negative", what);
    if ((img->ndim != 3 && img->ndim != 4) || col->ndim != img->ndim - 1)
        FL_FAIL(FL_ERR_INVALID, "%s: expected a 3D or 4D image and a 2D or 3D column tensor", what);
    int64_t N = img->ndim == 4 ? img->sizes[0] : 1, C = img->sizes[img->ndim - 3];
    int64_t H = img->sizes[img->ndim - 2], W = img->sizes[img->ndim - 1];
    int64_t OH = (H + 2 * pd[0] - (dl[0] * (kk[0] - 1) + 1)) / st[0] + 1;
    int64_t OW = (W + 2 * pd[1] - (dl[1] * (kk[1] - 1) + 1)) / st[1] + 1;
    int64_t K = C * kk[0] * kk[1];
    if (OH < 1 || OW < 1 || col->sizes[col->ndim - 2] != K || col->sizes[col->ndim - 1] != OH * OW)
        FL_FAIL(FL_ERR_INVALID, "%s: expected %ld columns of %ld blocks (%ldx%ld), got %ldx%ld", what, (long)K,
                (long)(OH * OW), (long)OH, (long)OW, (long)col->sizes[col->ndim - 2], (long)col->sizes[col->ndim - 1]);
    io_t io = {0};
    const double *src = io_in(&io, x, FL_FLOAT64);
    double *dst = io_out(&io, y, FL_FLOAT64, fold);
    if (!src || !dst) IO_OOM(&io, what);
    const int64_t L = OH * OW;
#pragma omp parallel for schedule(static) collapse(2) if (N * K * L > PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) { /* one (sample, channel) per iteration: col2im never races */
            const int64_t ib = (n * C + c) * H * W;
            for (int64_t i = 0; i < kk[0]; i++)
                for (int64_t j = 0; j < kk[1]; j++) {
                    const int64_t cb = (n * K + (c * kk[0] + i) * kk[1] + j) * L;
                    for (int64_t oh = 0; oh < OH; oh++) {
                        int64_t h = oh * st[0] - pd[0] + i * dl[0];
                        for (int64_t ow = 0; ow < OW; ow++) {
                            int64_t w = ow * st[1] - pd[1] + j * dl[1];
                            int inside = h >= 0 && h < H && w >= 0 && w < W;
                            if (fold) { if (inside) dst[ib + h * W + w] += src[cb + oh * OW + ow]; }
                            else dst[cb + oh * OW + ow] = inside ? src[ib + h * W + w] : 0.0;
                        }
                    }
                }
        }
    return io_end(&io, FL_OK);
}
static int k_im2col(FL_KERNEL_ARGS) { return unfold_run(0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_col2im(FL_KERNEL_ARGS) { return unfold_run(1, stream, device, in, n_in, out, n_out, args, n_args); }

/* ======================================================================
 * Grid sampling: grid_sampler_2d / grid_sampler_3d (+ backward). Each output
 * point reads a few input taps; a tap carries its weight and the weight's
 * derivative along each grid coordinate, so the forward sum, the input
 * gradient (scatter) and the grid gradient share one description. Modes:
 * interpolation 0 bilinear, 1 nearest, 2 bicubic (2-D only); padding
 * 0 zeros, 1 border, 2 reflection. Ported from ATen's GridSampler.h.
 * ====================================================================== */

enum { GS_BILINEAR, GS_NEAREST, GS_BICUBIC };
enum { GS_ZEROS, GS_BORDER, GS_REFLECTION };

/* std::min(limit - 1, std::max(v, 0)) with C++'s NaN behaviour (NaN -> limit - 1) */
static double gs_clip(double v, int64_t size) {
    double a = v < 0.0 ? 0.0 : v, lim = (double)(size - 1);
    return a < lim ? a : lim;
}
/* reflect_coordinates(_set_grad): *g = d(result)/d(in) */
static double gs_reflect(int single, double in, int64_t twice_low, int64_t twice_high, double *g) {
    if (twice_low == twice_high) { *g = 0.0; return 0.0; }
    double mn = rnd(single, (double)twice_low / 2), span = rnd(single, (double)(twice_high - twice_low) / 2);
    double mult = 1.0;
    in = rnd(single, in - mn);
    if (in < 0.0) { mult = -1.0; in = -in; }
    double extra = fmod(in, span);
    int flips = (int)floor(rnd(single, in / span));
    if (flips % 2 == 0) { *g = mult; return rnd(single, extra + mn); }
    *g = -mult;
    return rnd(single, rnd(single, span - extra) + mn);
}
/* compute_coordinates (padding) with its derivative */
static double gs_pad(int single, double c, int64_t size, int pad, int ac, double *g) {
    *g = 1.0;
    if (pad == GS_BORDER) {
        double r = gs_clip(c, size);
        *g = (c <= 0.0 || c >= (double)(size - 1)) ? 0.0 : 1.0;
        return r;
    }
    if (pad == GS_REFLECTION) {
        double gr;
        c = ac ? gs_reflect(single, c, 0, 2 * (size - 1), &gr) : gs_reflect(single, c, -1, 2 * size - 1, &gr);
        double r = gs_clip(c, size);
        *g = gr * ((c <= 0.0 || c >= (double)(size - 1)) ? 0.0 : 1.0);
        return r;
    }
    return c;
}
static double gs_unnormalize(int single, double c, int64_t size, int ac, double *g) {
    if (ac) { *g = rnd(single, (double)(size - 1) / 2); return rnd(single, rnd(single, rnd(single, c + 1) / 2) * (double)(size - 1)); }
    *g = rnd(single, (double)size / 2);
    return rnd(single, rnd(single, rnd(single, rnd(single, c + 1) * (double)size) - 1) / 2);
}
/* a float coordinate as an index; NaN and huge values land out of bounds */
static int64_t gs_index(double v) { return (v > -1e18 && v < 1e18) ? (int64_t)v : INT64_MIN / 2; }

typedef struct { int64_t off; double w, dw[3]; } gs_tap_t; /* dw: d w / d (x, y, z) in input pixels */

/* The taps of one grid point (coords x, y[, z] in [-1, 1]); returns the count and the
 * d(pixel coord)/d(grid coord) factors in mult[]. nd: 2 or 3; sizes {W, H, D}. */
static int gs_taps(int single, int nd, const double *coord, const int64_t *size, int mode, int pad, int ac,
                   gs_tap_t *taps, double *mult) {
    double pix[3], frac[3];
    int64_t base[3];
    for (int d = 0; d < nd; d++) {
        double gu, gp = 1.0;
        pix[d] = gs_unnormalize(single, coord[d], size[d], ac, &gu);
        if (mode != GS_BICUBIC) pix[d] = gs_pad(single, pix[d], size[d], pad, ac, &gp);
        mult[d] = gu * gp;
    }
    int n = 0;
    if (mode == GS_NEAREST) {
        int64_t off = 0, stride = 1, ok = 1;
        for (int d = 0; d < nd; d++) {
            int64_t i = gs_index(nearbyint(pix[d]));
            ok &= i >= 0 && i < size[d];
            off += i * stride;
            stride *= size[d];
        }
        if (ok) { taps[0].off = off; taps[0].w = 1.0; taps[0].dw[0] = taps[0].dw[1] = taps[0].dw[2] = 0.0; n = 1; }
        return n;
    }
    for (int d = 0; d < nd; d++) {
        double f = floor(pix[d]);
        base[d] = gs_index(f);
        frac[d] = rnd(single, pix[d] - f);
    }
    if (mode == GS_BILINEAR) {
        for (int c = 0; c < (1 << nd); c++) {
            double w[3], dw[3];
            int64_t off = 0, stride = 1, ok = 1;
            for (int d = 0; d < nd; d++) {
                int b = (c >> d) & 1;
                int64_t i = base[d] + b;
                ok &= i >= 0 && i < size[d];
                off += i * stride;
                stride *= size[d];
                w[d] = b ? rnd(single, pix[d] - (double)base[d]) : rnd(single, (double)(base[d] + 1) - pix[d]);
                dw[d] = b ? 1.0 : -1.0;
            }
            if (!ok) continue;
            gs_tap_t *t = &taps[n++];
            t->off = off;
            t->w = 1.0;
            for (int d = 0; d < nd; d++) t->w *= w[d];
            for (int d = 0; d < 3; d++) {
                t->dw[d] = 0.0;
                if (d >= nd) continue;
                double v = dw[d];
                for (int e = 0; e < nd; e++) if (e != d) v *= w[e];
                t->dw[d] = v;
            }
        }
        return n;
    }
    /* bicubic (2-D): 4x4 taps, each coordinate padded separately (get_value_bounded) */
    double cx[4], cy[4], gx[4], gy[4];
    const double A = -0.75;
    double tx = frac[0], ty = frac[1];
    cx[0] = cubic2(tx + 1.0, A); cx[1] = cubic1(tx, A); cx[2] = cubic1(1.0 - tx, A); cx[3] = cubic2(2.0 - tx, A);
    cy[0] = cubic2(ty + 1.0, A); cy[1] = cubic1(ty, A); cy[2] = cubic1(1.0 - ty, A); cy[3] = cubic2(2.0 - ty, A);
    /* get_cubic_coefficients_grad */
    double x;
    x = -1 - tx; gx[0] = (-3 * A * x - 10 * A) * x - 8 * A;
    x = -tx; gx[1] = (-3 * (A + 2) * x - 2 * (A + 3)) * x;
    x = 1 - tx; gx[2] = (3 * (A + 2) * x - 2 * (A + 3)) * x;
    x = 2 - tx; gx[3] = (3 * A * x - 10 * A) * x + 8 * A;
    x = -1 - ty; gy[0] = (-3 * A * x - 10 * A) * x - 8 * A;
    x = -ty; gy[1] = (-3 * (A + 2) * x - 2 * (A + 3)) * x;
    x = 1 - ty; gy[2] = (3 * (A + 2) * x - 2 * (A + 3)) * x;
    x = 2 - ty; gy[3] = (3 * A * x - 10 * A) * x + 8 * A;
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 4; i++) {
            double g;
            int64_t ix = gs_index(gs_pad(single, (double)(base[0] - 1 + i), size[0], pad, ac, &g));
            int64_t iy = gs_index(gs_pad(single, (double)(base[1] - 1 + j), size[1], pad, ac, &g));
            if (ix < 0 || ix >= size[0] || iy < 0 || iy >= size[1]) continue;
            gs_tap_t *t = &taps[n++];
            t->off = iy * size[0] + ix;
            t->w = cx[i] * cy[j];
            /* ATen: gix -= val * x_coeffs_grad * y_coeffs (the coefficients' t runs against the coordinate) */
            t->dw[0] = -gx[i] * cy[j];
            t->dw[1] = -gy[j] * cx[i];
            t->dw[2] = 0.0;
        }
    return n;
}

/* forward (input, grid, interpolation_mode, padding_mode, align_corners) -> out
 * backward (grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask)
 *   -> (grad_input, grad_grid) */
static int grid_run(int nd, int bwd, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const char *what = nd == 2 ? "grid_sampler_2d" : "grid_sampler_3d";
    const int a = bwd ? 1 : 0;
    const fl_tensor_t *go = bwd ? IN(0) : NULL, *x = IN(a), *grid = IN(a + 1);
    const fl_tensor_t *y = bwd ? NULL : OUT(0), *gi = bwd ? OUT(0) : NULL, *gg = bwd ? OUT(1) : NULL;
    if (!x || !grid || (!bwd && !y) || (bwd && !go) || !is_float(x->dtype) || grid->dtype != x->dtype ||
        n_args < a + 5)
        return FL_ERR_UNSUPPORTED;
    if ((y && y->dtype != x->dtype) || (go && go->dtype != x->dtype) || (gi && gi->dtype != x->dtype) ||
        (gg && gg->dtype != x->dtype))
        return FL_ERR_UNSUPPORTED;
    int mode = (int)args[a + 2].i, pad = (int)args[a + 3].i, ac = args[a + 4].i != 0;
    if (mode < 0 || mode > 2 || pad < 0 || pad > 2 || (mode == GS_BICUBIC && nd == 3))
        FL_FAIL(FL_ERR_INVALID, "%s: unsupported interpolation mode %d / padding mode %d", what, mode, pad);
    if (x->ndim != nd + 2 || grid->ndim != nd + 2 || grid->sizes[0] != x->sizes[0] || grid->sizes[nd + 1] != nd)
        FL_FAIL(FL_ERR_INVALID, "%s: expected input of %dD and grid of shape (N, ..., %d)", what, nd + 2, nd);
    const int64_t N = x->sizes[0], C = x->sizes[1];
    int64_t size[3] = {1, 1, 1}, osz = 1, isz = 1; /* size: W, H, D */
    for (int d = 0; d < nd; d++) {
        size[d] = x->sizes[x->ndim - 1 - d];
        isz *= size[d];
        osz *= grid->sizes[1 + d];
    }
    const fl_tensor_t *ot = bwd ? go : y;
    if (ot->ndim != nd + 2 || ot->sizes[0] != N || ot->sizes[1] != C || fl_numel(ot) != N * C * osz)
        FL_FAIL(FL_ERR_INVALID, "%s: output shape does not match (N, C) and the grid", what);
    io_t io = {0};
    const double *xp = io_in(&io, x, FL_FLOAT64), *gp = io_in(&io, grid, FL_FLOAT64);
    const double *gop = bwd ? io_in(&io, go, FL_FLOAT64) : NULL;
    double *yp = y ? io_out(&io, y, FL_FLOAT64, 0) : NULL;
    double *gip = gi ? io_out(&io, gi, FL_FLOAT64, 1) : NULL;
    double *ggp = gg ? io_out(&io, gg, FL_FLOAT64, 1) : NULL;
    if (!xp || !gp || (bwd && !gop) || (y && !yp) || (gi && !gip) || (gg && !ggp)) IO_OOM(&io, what);
    const int single = single_of(x->dtype);
    /* one thread per sample in the backward pass: grad_input of a sample is accumulated by one thread */
#pragma omp parallel for schedule(static) if (N * osz * C > 4096)
    for (int64_t n = 0; n < N; n++) {
        gs_tap_t taps[16];
        for (int64_t q = 0; q < osz; q++) {
            double coord[3], mult[3];
            const double *gc = gp + (n * osz + q) * nd;
            for (int d = 0; d < nd; d++) coord[d] = gc[d];
            int nt = gs_taps(single, nd, coord, size, mode, pad, ac, taps, mult);
            double gcoord[3] = {0.0, 0.0, 0.0};
            for (int64_t c = 0; c < C; c++) {
                const double *xc = xp + (n * C + c) * isz;
                if (!bwd) {
                    double s = 0.0;
                    for (int t = 0; t < nt; t++) s += taps[t].w * xc[taps[t].off];
                    yp[(n * C + c) * osz + q] = s;
                    continue;
                }
                double g = gop[(n * C + c) * osz + q];
                for (int t = 0; t < nt; t++) {
                    if (gip) gip[(n * C + c) * isz + taps[t].off] += taps[t].w * g;
                    double v = xc[taps[t].off] * g;
                    for (int d = 0; d < nd; d++) gcoord[d] += v * taps[t].dw[d];
                }
            }
            if (ggp)
                for (int d = 0; d < nd; d++) ggp[(n * osz + q) * nd + d] = mult[d] * gcoord[d];
        }
    }
    return io_end(&io, FL_OK);
}
static int k_grid_sampler_2d(FL_KERNEL_ARGS) { return grid_run(2, 0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_grid_sampler_3d(FL_KERNEL_ARGS) { return grid_run(3, 0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_grid_sampler_2d_bwd(FL_KERNEL_ARGS) { return grid_run(2, 1, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_grid_sampler_3d_bwd(FL_KERNEL_ARGS) { return grid_run(3, 1, stream, device, in, n_in, out, n_out, args, n_args); }

/* ======================================================================
 * Pairwise distances: _pdist_forward / _pdist_backward, _cdist_forward /
 * _cdist_backward (ATen's Distance kernels: p = 0, 1, 2, inf and general p)
 * ====================================================================== */

static double dist_row(const double *a, const double *b, int64_t m, double p) {
    double s = 0.0;
    if (p == 0.0) { for (int64_t i = 0; i < m; i++) s += a[i] != b[i]; return s; }
    if (isinf(p)) { for (int64_t i = 0; i < m; i++) { double d = fabs(a[i] - b[i]); s = (d > s || isnan(d)) ? d : s; } return s; }
    if (p == 1.0) { for (int64_t i = 0; i < m; i++) s += fabs(a[i] - b[i]); return s; }
    if (p == 2.0) { for (int64_t i = 0; i < m; i++) { double d = a[i] - b[i]; s += d * d; } return sqrt(s); }
    for (int64_t i = 0; i < m; i++) s += pow(fabs(a[i] - b[i]), p);
    return pow(s, 1.0 / p);
}
static inline double sgn(double v) { return (double)((v > 0) - (v < 0)); }
/* d dist / d a_i times the incoming gradient g, for diff = a_i - b_i */
static inline double dist_grad(double diff, double g, double dist, double p) {
    if (p == 0.0) return 0.0;
    if (p == 1.0) return g * sgn(diff);
    if (isinf(p)) return g * sgn(diff) * (fabs(diff) == dist ? 1.0 : 0.0);
    if (p == 2.0) return dist == 0.0 ? 0.0 : g * diff / dist;
    if (p < 2.0) return (dist == 0.0 || (diff == 0.0 && p < 1.0)) ? 0.0
                        : sgn(diff) * pow(fabs(diff), p - 1.0) * g / pow(dist, p - 1.0);
    return dist == 0.0 ? 0.0 : diff * pow(fabs(diff), p - 2.0) * g / pow(dist, p - 1.0);
}

static int p_arg(const fl_arg_t *a, double *p) {
    if (a->kind == FL_ARG_FLOAT) *p = a->f;
    else if (a->kind == FL_ARG_INT) *p = (double)a->i;
    else return 0;
    return 1;
}

/* _pdist_forward(self, p=2) / _pdist_backward(grad, self, p, pdist) */
static int pdist_run(int bwd, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = IN(bwd ? 1 : 0), *g = bwd ? IN(0) : NULL, *dst = bwd ? IN(3) : NULL, *y = OUT(0);
    double p;
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype || (bwd && (!g || !dst)) || n_args < (bwd ? 3 : 2) ||
        !p_arg(&args[bwd ? 2 : 1], &p))
        return FL_ERR_UNSUPPORTED;
    if (x->ndim != 2) FL_FAIL(FL_ERR_INVALID, "pdist only supports 2D tensors, got: %dD", x->ndim);
    if (!(p >= 0.0)) FL_FAIL(FL_ERR_INVALID, "pdist only supports non-negative p values");
    const int64_t N = x->sizes[0], M = x->sizes[1], P = N * (N - 1) / 2;
    if ((!bwd && fl_numel(y) != P) || (bwd && (fl_numel(g) != P || fl_numel(dst) != P || fl_numel(y) != N * M)))
        FL_FAIL(FL_ERR_INVALID, "pdist: expected %ld pair distances", (long)P);
    io_t io = {0};
    const double *xp = io_in(&io, x, FL_FLOAT64);
    const double *gp = bwd ? io_in(&io, g, FL_FLOAT64) : NULL, *dp = bwd ? io_in(&io, dst, FL_FLOAT64) : NULL;
    double *yp = io_out(&io, y, FL_FLOAT64, bwd);
    if (!xp || !yp || (bwd && (!gp || !dp))) IO_OOM(&io, "pdist");
    const int single = single_of(x->dtype); /* differences in the input's precision: p = inf compares |diff| == dist */
    if (!bwd) {
#pragma omp parallel for schedule(dynamic, 16) if (P * M > PAR_MIN)
        for (int64_t i = 0; i < N; i++) {
            int64_t k = i * N - i * (i + 1) / 2; /* pairs (i, j > i) are numbered row by row */
            for (int64_t j = i + 1; j < N; j++) yp[k++] = dist_row(xp + i * M, xp + j * M, M, p);
        }
    } else { /* row i gathers from every pair it belongs to: no two threads write one row */
#pragma omp parallel for schedule(dynamic, 16) if (N * N * M > PAR_MIN)
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < N; j++) {
                if (j == i) continue;
                int64_t a = i < j ? i : j, b = i < j ? j : i, k = a * N - a * (a + 1) / 2 + (b - a - 1);
                for (int64_t m = 0; m < M; m++)
                    yp[i * M + m] += dist_grad(rnd(single, xp[i * M + m] - xp[j * M + m]), gp[k], dp[k], p);
            }
    }
    return io_end(&io, FL_OK);
}
static int k_pdist(FL_KERNEL_ARGS) { return pdist_run(0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_pdist_bwd(FL_KERNEL_ARGS) { return pdist_run(1, stream, device, in, n_in, out, n_out, args, n_args); }

/* _cdist_forward(x1, x2, p, compute_mode) -> (..., P, R); _cdist_backward(grad, x1, x2, p, cdist) -> grad_x1.
 * Batch dims must already agree (the composite cdist expands them). */
static int cdist_run(int bwd, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const int a = bwd ? 1 : 0;
    const fl_tensor_t *x1 = IN(a), *x2 = IN(a + 1), *g = bwd ? IN(0) : NULL, *dst = bwd ? IN(4) : NULL, *y = OUT(0);
    double p;
    if (!x1 || !x2 || !y || !is_float(x1->dtype) || x2->dtype != x1->dtype || y->dtype != x1->dtype ||
        (bwd && (!g || !dst)) || n_args < a + 3 || !p_arg(&args[a + 2], &p))
        return FL_ERR_UNSUPPORTED;
    if (x1->ndim < 2 || x2->ndim != x1->ndim) FL_FAIL(FL_ERR_INVALID, "cdist only supports at least 2D tensors, got: %dD", x1->ndim);
    if (!(p >= 0.0)) FL_FAIL(FL_ERR_INVALID, "cdist only supports non-negative p values");
    const int nd = x1->ndim;
    int64_t B = 1;
    for (int d = 0; d < nd - 2; d++) {
        if (x1->sizes[d] != x2->sizes[d]) return FL_ERR_UNSUPPORTED;
        B *= x1->sizes[d];
    }
    const int64_t P = x1->sizes[nd - 2], R = x2->sizes[nd - 2], M = x1->sizes[nd - 1];
    if (x2->sizes[nd - 1] != M)
        FL_FAIL(FL_ERR_INVALID, "X1 and X2 must have the same number of columns. X1: %ld X2: %ld", (long)M,
                (long)x2->sizes[nd - 1]);
    if ((!bwd && fl_numel(y) != B * P * R) || (bwd && (fl_numel(g) != B * P * R || fl_numel(dst) != B * P * R)))
        FL_FAIL(FL_ERR_INVALID, "cdist: output shape does not match the inputs");
    io_t io = {0};
    const double *ap = io_in(&io, x1, FL_FLOAT64), *bp = io_in(&io, x2, FL_FLOAT64);
    const double *gp = bwd ? io_in(&io, g, FL_FLOAT64) : NULL, *dp = bwd ? io_in(&io, dst, FL_FLOAT64) : NULL;
    double *yp = io_out(&io, y, FL_FLOAT64, bwd);
    if (!ap || !bp || !yp || (bwd && (!gp || !dp))) IO_OOM(&io, "cdist");
    const int single = single_of(x1->dtype);
#pragma omp parallel for schedule(static) collapse(2) if (B * P * R * M > PAR_MIN)
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < P; i++) {
            const double *u = ap + (b * P + i) * M;
            for (int64_t j = 0; j < R; j++) {
                const double *v = bp + (b * R + j) * M;
                int64_t k = (b * P + i) * R + j;
                if (!bwd) { yp[k] = dist_row(u, v, M, p); continue; }
                for (int64_t m = 0; m < M; m++) yp[(b * P + i) * M + m] += dist_grad(rnd(single, u[m] - v[m]), gp[k], dp[k], p);
            }
        }
    return io_end(&io, FL_OK);
}
static int k_cdist(FL_KERNEL_ARGS) { return cdist_run(0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_cdist_bwd(FL_KERNEL_ARGS) { return cdist_run(1, stream, device, in, n_in, out, n_out, args, n_args); }

/* ======================================================================
 * rrelu_with_noise(self, noise(b!), lower, upper, training, generator).
 * Training: negative (and zero) inputs get a slope drawn uniformly from
 * [lower, upper], recorded in noise (1 elsewhere); eval: leaky_relu with
 * slope (lower + upper) / 2, noise untouched. The draws come from this
 * device's counter-based generator, so they are not CPU's numbers.
 * ====================================================================== */
static int k_rrelu_with_noise(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = IN(0), *noise = IN(1), *y = OUT(0);
    if (!x || !noise || !y || !is_float(x->dtype) || y->dtype != x->dtype || noise->dtype != x->dtype || n_args < 5)
        return FL_ERR_UNSUPPORTED;
    double lo, hi;
    if (!p_arg(&args[2], &lo) || !p_arg(&args[3], &hi)) return FL_ERR_UNSUPPORTED;
    int training = args[4].i != 0;
    if (x->ndim != y->ndim || fl_numel(x) != fl_numel(y)) return FL_ERR_UNSUPPORTED;
    if (training && (noise->ndim != x->ndim || fl_numel(noise) != fl_numel(x)))
        FL_FAIL(FL_ERR_INVALID, "rrelu_with_noise: noise must have the shape of the input");
    if (training && lo > hi)
        FL_FAIL(FL_ERR_INVALID, "Lower bound should be less than or equal to the upper bound");
    int64_t n = fl_numel(x);
    if (n == 0) return FL_OK;
    uint64_t seed = 0, start = training ? fl_host_rng_reserve(device, (uint64_t)n, &seed) : 0;
    const double slope = (lo + hi) / 2;
    fl_tensor_t nz = training ? *noise : *x; /* (eval: a stand-in the loop never writes) */
    for (int d = 0; d < nz.ndim && training; d++)
        if (nz.sizes[d] != x->sizes[d]) return FL_ERR_UNSUPPORTED;
    fl_iter_t it;
    fl_iter_init(&it, 3, (const fl_tensor_t *[]){y, x, &nz});
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++) {
            double v = fl_load_f64(x->dtype, fl_elem(x, b[1] + i * it.inner_stride[1])), o;
            if (training) {
                double k = 1.0;
                if (v <= 0.0) {
                    /* the slope in the input's precision, as CPU stores it in noise */
                    k = lo + (hi - lo) * fl_rand_uniform(seed, start + (uint64_t)(r * it.inner + i));
                    fl_store_f64(nz.dtype, fl_elem(&nz, b[2] + i * it.inner_stride[2]), k);
                    k = fl_load_f64(nz.dtype, fl_elem(&nz, b[2] + i * it.inner_stride[2]));
                } else {
                    fl_store_f64(nz.dtype, fl_elem(&nz, b[2] + i * it.inner_stride[2]), 1.0);
                }
                o = v * k;
            } else {
                o = v > 0.0 ? v : v * slope;
            }
            fl_store_f64(y->dtype, fl_elem(y, b[0] + i * it.inner_stride[0]), o);
        }
    }
    return FL_OK;
}

/* ======================================================================
 * Embedding bags: _embedding_bag(weight, indices, offsets, scale_grad_by_freq,
 * mode, sparse, per_sample_weights, include_last_offset, padding_idx)
 *   -> (output, offset2bag, bag_size, max_indices)
 * mode 0 sum, 1 mean, 2 max. Bag b covers indices [offsets[b], offsets[b+1])
 * (the last bag runs to the end of indices). Auxiliary outputs follow CPU:
 * offset2bag always filled, bag_size counts non-padding indices (0 for sum),
 * max_indices the arg-max row per (bag, feature) for max, bag_size for mean,
 * zeros for sum.
 * ====================================================================== */

/* offset2bag from offsets; checks them like ATen */
static int make_offset2bag(const int64_t *off, int64_t n_off, int64_t numel, int64_t bags, int64_t *o2b) {
    if (bags > 0 && numel > 0 && off[0] != 0)
        FL_FAIL(FL_ERR_INVALID, "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                "position 0. However, got %ld", (long)off[0]);
    for (int64_t b = 0; b < n_off; b++) {
        if (off[b] > numel)
            FL_FAIL(FL_ERR_INVALID, "offsets[%ld] can not be greater than input's length %ld, but got %ld", (long)b,
                    (long)numel, (long)off[b]);
        if (b > 0 && off[b] < off[b - 1])
            FL_FAIL(FL_ERR_INVALID, "embedding_bag: offsets must be non-decreasing, got %ld after %ld", (long)off[b],
                    (long)off[b - 1]);
    }
    for (int64_t b = 0; b < bags; b++) {
        int64_t end = b + 1 < bags ? off[b + 1] : numel;
        for (int64_t i = off[b]; i < end; i++) o2b[i] = b;
    }
    if (bags == 0)
        for (int64_t i = 0; i < numel; i++) o2b[i] = 0;
    return FL_OK;
}

static int k_embedding_bag(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *w = IN(0), *ix = IN(1), *of = IN(2), *psw = IN(6);
    const fl_tensor_t *y = OUT(0), *o2b = OUT(1), *bsz = OUT(2), *mxi = OUT(3);
    if (!w || !ix || !of || !y || !is_float(w->dtype) || y->dtype != w->dtype || n_args < 9 || w->ndim != 2 ||
        (psw && psw->dtype != w->dtype))
        return FL_ERR_UNSUPPORTED;
    if ((ix->dtype != FL_INT64 && ix->dtype != FL_INT32) || (of->dtype != FL_INT64 && of->dtype != FL_INT32))
        return FL_ERR_UNSUPPORTED;
    if ((o2b && o2b->dtype != FL_INT64 && o2b->dtype != FL_INT32) || (bsz && bsz->dtype != FL_INT64 && bsz->dtype != FL_INT32) ||
        (mxi && mxi->dtype != FL_INT64 && mxi->dtype != FL_INT32))
        return FL_ERR_UNSUPPORTED;
    const int mode = (int)args[4].i, last = args[7].i != 0;
    const int64_t pad = args[8].i, V = w->sizes[0], D = w->sizes[1], numel = fl_numel(ix), n_off = fl_numel(of);
    const int64_t bags = last ? n_off - 1 : n_off;
    if (ix->ndim != 1 || of->ndim != 1) FL_FAIL(FL_ERR_INVALID, "embedding_bag: input has to be 1D with offsets");
    if (mode < 0 || mode > 2) FL_FAIL(FL_ERR_INVALID, "embedding_bag: unknown mode %d", mode);
    if (psw && (mode != 0 || fl_numel(psw) != numel))
        FL_FAIL(FL_ERR_INVALID, "embedding_bag: per_sample_weights only supported with mode='sum' and one weight per index");
    if (bags < 0 || fl_numel(y) != bags * D) FL_FAIL(FL_ERR_INVALID, "embedding_bag: output shape does not match the bags");
    io_t io = {0};
    const double *wp = io_in(&io, w, FL_FLOAT64), *sp = psw ? io_in(&io, psw, FL_FLOAT64) : NULL;
    const int64_t *ip = io_in(&io, ix, FL_INT64), *op = io_in(&io, of, FL_INT64);
    double *yp = io_out(&io, y, FL_FLOAT64, 1);
    int64_t *o2 = malloc((size_t)(numel + 1) * sizeof(int64_t)), *cnt = calloc((size_t)(bags + 1), sizeof(int64_t));
    int64_t *mx = mode == 2 ? calloc((size_t)(bags * D + 1), sizeof(int64_t)) : NULL;
    if (!wp || (psw && !sp) || !ip || !op || !yp || !o2 || !cnt || (mode == 2 && !mx)) {
        free(o2); free(cnt); free(mx);
        IO_OOM(&io, "embedding_bag");
    }
    int st = make_offset2bag(op, n_off, numel, bags, o2);
    for (int64_t i = 0; i < numel && !st; i++)
        if (ip[i] < 0 || ip[i] >= V) {
            fl_host_set_error("embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be %ld", (long)ip[i]);
            st = FL_ERR_INVALID;
        }
    if (!st) {
        for (int64_t i = 0; i < numel && bags > 0; i++) {
            int64_t b = o2[i], r = ip[i];
            if (r == pad) continue;
            const double *row = wp + r * D;
            double *o = yp + b * D;
            if (mode == 2) {
                for (int64_t d = 0; d < D; d++)
                    if (cnt[b] == 0 || row[d] > o[d]) { o[d] = row[d]; mx[b * D + d] = r; }
            } else {
                double s = sp ? sp[i] : 1.0;
                for (int64_t d = 0; d < D; d++) o[d] += s * row[d];
            }
            cnt[b]++;
        }
        if (mode == 1)
            for (int64_t b = 0; b < bags; b++)
                if (cnt[b] > 0)
                    for (int64_t d = 0; d < D; d++) yp[b * D + d] /= (double)cnt[b];
        /* auxiliary outputs, as CPU fills them */
        const fl_tensor_t *aux[3] = {o2b, bsz, mxi};
        for (int k = 0; k < 3; k++) {
            const fl_tensor_t *t = aux[k];
            if (!t) continue;
            int64_t n = fl_numel(t), *buf = io_out(&io, t, FL_INT64, 1);
            if (!buf) { st = FL_ERR_OOM; break; }
            for (int64_t i = 0; i < n; i++) {
                int64_t v = 0;
                if (k == 0) v = i < numel ? o2[i] : 0;
                else if (k == 1 || mode == 1) v = (mode != 0 && i < bags) ? cnt[i] : 0;
                else if (mode == 2) v = i < bags * D ? mx[i] : 0;
                buf[i] = v;
            }
        }
    }
    free(o2); free(cnt); free(mx);
    io_end(&io, st);
    if (st == FL_ERR_OOM) FL_FAIL(st, "embedding_bag: cannot allocate scratch");
    return st;
}

/* scale_grad_by_freq divisors, as ATen's CPU kernel computes them: it sorts the
 * indices and, for the g-th group of equal indices, divides by the count of
 * sorted[g] (not of the group's own index). That is what CPU returns, so the
 * plugin reproduces it: count[] (occurrences per value) becomes the divisor
 * per value. */
static int freq_divisors(const int64_t *ip, int64_t numel, int64_t V, int64_t *count) {
    int64_t *sorted = malloc((size_t)(numel + 1) * sizeof(int64_t)), *div = malloc((size_t)(V + 1) * sizeof(int64_t));
    if (!sorted || !div) { free(sorted); free(div); FL_FAIL(FL_ERR_OOM, "embedding_bag_backward: cannot allocate scratch"); }
    memcpy(sorted, ip, (size_t)numel * sizeof(int64_t));
    qsort(sorted, (size_t)numel, sizeof(int64_t), fl_cmp_i64);
    for (int64_t v = 0; v < V; v++) div[v] = 1;
    for (int64_t i = 0, g = 0; i < numel; g++) {
        int64_t j = i;
        while (j < numel && sorted[j] == sorted[i]) j++;
        int64_t key = sorted[g];
        if (sorted[i] >= 0 && sorted[i] < V && key >= 0 && key < V) div[sorted[i]] = count[key];
        i = j;
    }
    memcpy(count, div, (size_t)V * sizeof(int64_t));
    free(sorted); free(div);
    return FL_OK;
}

/* _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
 *                               scale_grad_by_freq, mode, per_sample_weights, padding_idx) -> (num_weights, D) */
/* the dense weight gradient; offsets (may be NULL) rebuild an empty offset2bag */
static int emb_dense_bwd(const fl_tensor_t *g, const fl_tensor_t *ix, const fl_tensor_t *of, const fl_tensor_t *o2b,
                         const fl_tensor_t *bsz, const fl_tensor_t *mxi, const fl_tensor_t *psw, int64_t V, int freq,
                         int mode, int64_t pad, const fl_tensor_t *gw) {
    if (!g || !ix || !o2b || !bsz || !mxi || !gw || !is_float(g->dtype) || gw->dtype != g->dtype ||
        g->ndim != 2 || gw->ndim != 2 || (psw && psw->dtype != g->dtype))
        return FL_ERR_UNSUPPORTED;
    const int64_t numel = fl_numel(ix), B = g->sizes[0], D = g->sizes[1];
    int64_t *own = NULL;
    if (gw->sizes[0] != V || gw->sizes[1] != D) FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: grad_weight shape");
    if (mode != 2 && numel > 0 && fl_numel(o2b) == 0 && of) { /* CPU's sum fast path leaves offset2bag empty */
        io_t io0 = {0};
        const int64_t *op = io_in(&io0, of, FL_INT64);
        own = malloc((size_t)numel * sizeof(int64_t));
        int st0 = (!op || !own) ? FL_ERR_OOM : make_offset2bag(op, fl_numel(of), numel, fl_numel(of), own);
        io_end(&io0, st0);
        if (st0) { free(own); if (st0 == FL_ERR_OOM) FL_FAIL(st0, "embedding_bag_backward: cannot allocate scratch"); return st0; }
    }
    if (mode != 2 && numel > 0 && fl_numel(o2b) != numel && !own)
        FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: offset2bag has %ld entries for %ld indices",
                (long)fl_numel(o2b), (long)numel);
    if (mode == 2 && fl_numel(mxi) != B * D) FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: max_indices shape");
    io_t io = {0};
    const double *gp = io_in(&io, g, FL_FLOAT64), *sp = psw ? io_in(&io, psw, FL_FLOAT64) : NULL;
    const int64_t *ip = io_in(&io, ix, FL_INT64), *bp = own ? own : io_in(&io, o2b, FL_INT64);
    const int64_t *szp = io_in(&io, bsz, FL_INT64), *mp = io_in(&io, mxi, FL_INT64);
    double *wp = io_out(&io, gw, FL_FLOAT64, 1);
    int64_t *count = freq ? calloc((size_t)(V + 1), sizeof(int64_t)) : NULL;
    if (!gp || (psw && !sp) || !ip || !bp || !szp || !mp || !wp || (freq && !count)) {
        free(count); free(own);
        IO_OOM(&io, "embedding_bag_backward");
    }
    int st = FL_OK;
    if (mode == 2) {
        for (int64_t b = 0; b < B && !st; b++) {
            if (b < fl_numel(bsz) && szp[b] == 0) continue; /* ATen skips empty bags */
            for (int64_t d = 0; d < D; d++) {
                int64_t r = mp[b * D + d];
                if (r < 0 || r >= V) { fl_host_set_error("embedding_bag_backward: max index %ld out of range [0, %ld)", (long)r, (long)V); st = FL_ERR_INVALID; break; }
                wp[r * D + d] += gp[b * D + d];
            }
        }
    } else {
        for (int64_t i = 0; i < numel && freq; i++)
            if (ip[i] >= 0 && ip[i] < V) count[ip[i]]++;
        if (freq && !st) st = freq_divisors(ip, numel, V, count);
        for (int64_t i = 0; i < numel && !st; i++) {
            int64_t r = ip[i], b = bp[i];
            if (r == pad) continue;
            if (r < 0 || r >= V || b < 0 || b >= B) {
                fl_host_set_error("embedding_bag_backward: index %ld / bag %ld out of range", (long)r, (long)b);
                st = FL_ERR_INVALID;
                break;
            }
            double s = sp ? sp[i] : 1.0;
            if (mode == 1 && b < fl_numel(bsz) && szp[b] > 0) s /= (double)szp[b];
            if (freq) s /= (double)count[r]; /* count[] now holds the divisor per index value */
            for (int64_t d = 0; d < D; d++) wp[r * D + d] += s * gp[b * D + d];
        }
    }
    free(count); free(own);
    return io_end(&io, st);
}
static int k_embedding_bag_dense_bwd(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 10) return FL_ERR_UNSUPPORTED;
    return emb_dense_bwd(IN(0), IN(1), NULL, IN(2), IN(3), IN(4), IN(8), args[5].i, args[6].i != 0, (int)args[7].i,
                         args[9].i, OUT(0));
}
/* _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
 *                         scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx): dense only */
static int k_embedding_bag_bwd(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 12 || args[9].i != 0) return FL_ERR_UNSUPPORTED;
    return emb_dense_bwd(IN(0), IN(1), IN(2), IN(3), IN(4), IN(5), IN(10), args[6].i, args[7].i != 0, (int)args[8].i,
                         args[11].i, OUT(0));
}

/* _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx)
 *   -> (numel,): grad . weight[index] per index, 0 for padding */
static int k_embedding_bag_psw_bwd(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *g = IN(0), *w = IN(1), *ix = IN(2), *of = IN(3), *o2b = IN(4), *y = OUT(0);
    if (!g || !w || !ix || !of || !o2b || !y || !is_float(g->dtype) || w->dtype != g->dtype || y->dtype != g->dtype ||
        n_args < 7 || g->ndim != 2 || w->ndim != 2)
        return FL_ERR_UNSUPPORTED;
    if (args[5].i != 0) FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: per_sample_weights only supported for mode='sum'");
    const int64_t pad = args[6].i, numel = fl_numel(ix), B = g->sizes[0], D = g->sizes[1], V = w->sizes[0];
    if (fl_numel(y) != numel || w->sizes[1] != D) FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: shapes disagree");
    io_t io = {0};
    const double *gp = io_in(&io, g, FL_FLOAT64), *wp = io_in(&io, w, FL_FLOAT64);
    const int64_t *ip = io_in(&io, ix, FL_INT64), *op = io_in(&io, of, FL_INT64), *bp = io_in(&io, o2b, FL_INT64);
    double *yp = io_out(&io, y, FL_FLOAT64, 1);
    int64_t *own = NULL;
    if (!gp || !wp || !ip || !op || !bp || !yp) IO_OOM(&io, "embedding_bag_backward");
    int st = FL_OK;
    if (numel > 0 && fl_numel(o2b) == 0) { /* CPU's sum fast path leaves offset2bag empty: rebuild it */
        own = malloc((size_t)numel * sizeof(int64_t));
        if (!own) { io_end(&io, FL_ERR_OOM); FL_FAIL(FL_ERR_OOM, "embedding_bag_backward: cannot allocate scratch"); }
        st = make_offset2bag(op, fl_numel(of), numel, fl_numel(of), own);
        bp = own;
    }
    for (int64_t i = 0; i < numel && !st; i++) {
        int64_t r = ip[i], b = bp[i];
        if (r == pad) continue;
        if (r < 0 || r >= V || b < 0 || b >= B) {
            fl_host_set_error("embedding_bag_backward: index %ld / bag %ld out of range", (long)r, (long)b);
            st = FL_ERR_INVALID;
            break;
        }
        double s = 0.0;
        for (int64_t d = 0; d < D; d++) s += gp[b * D + d] * wp[r * D + d];
        yp[i] = s;
    }
    free(own);
    return io_end(&io, st);
}

/* ======================================================================
 * Table
 * ====================================================================== */
#define F3264 (FL_F32 | FL_F64)

static const fl_kernel_entry_t entries[] = {
    {"aten::reflection_pad1d", FL_FLOATS, 0, k_reflection_pad1},
    {"aten::reflection_pad2d", FL_FLOATS, 0, k_reflection_pad2},
    {"aten::reflection_pad3d", FL_FLOATS, 0, k_reflection_pad3},
    {"aten::reflection_pad1d_backward", FL_FLOATS, 0, k_reflection_pad1_bwd},
    {"aten::reflection_pad2d_backward", FL_FLOATS, 0, k_reflection_pad2_bwd},
    {"aten::reflection_pad3d_backward", FL_FLOATS, 0, k_reflection_pad3_bwd},
    {"aten::replication_pad1d", FL_FLOATS, 0, k_replication_pad1},
    {"aten::replication_pad2d", FL_FLOATS, 0, k_replication_pad2},
    {"aten::replication_pad3d", FL_FLOATS, 0, k_replication_pad3},
    {"aten::replication_pad1d_backward", FL_FLOATS, 0, k_replication_pad1_bwd},
    {"aten::replication_pad2d_backward", FL_FLOATS, 0, k_replication_pad2_bwd},
    {"aten::replication_pad3d_backward", FL_FLOATS, 0, k_replication_pad3_bwd},
    {"aten::upsample_nearest1d", FL_FLOATS, 0, k_nearest1d},
    {"aten::upsample_nearest2d", FL_FLOATS, 0, k_nearest2d},
    {"aten::upsample_nearest3d", FL_FLOATS, 0, k_nearest3d},
    {"aten::upsample_nearest1d_backward", FL_FLOATS, 0, k_nearest1d_bwd},
    {"aten::upsample_nearest2d_backward", FL_FLOATS, 0, k_nearest2d_bwd},
    {"aten::upsample_nearest3d_backward", FL_FLOATS, 0, k_nearest3d_bwd},
    {"aten::_upsample_nearest_exact1d", FL_FLOATS, 0, k_nearest_exact1d},
    {"aten::_upsample_nearest_exact2d", FL_FLOATS, 0, k_nearest_exact2d},
    {"aten::_upsample_nearest_exact3d", FL_FLOATS, 0, k_nearest_exact3d},
    {"aten::_upsample_nearest_exact1d_backward", FL_FLOATS, 0, k_nearest_exact1d_bwd},
    {"aten::_upsample_nearest_exact2d_backward", FL_FLOATS, 0, k_nearest_exact2d_bwd},
    {"aten::_upsample_nearest_exact3d_backward", FL_FLOATS, 0, k_nearest_exact3d_bwd},
    {"aten::upsample_linear1d", FL_FLOATS, 0, k_linear1d},
    {"aten::upsample_bilinear2d", FL_FLOATS, 0, k_bilinear2d},
    {"aten::upsample_trilinear3d", FL_FLOATS, 0, k_trilinear3d},
    {"aten::upsample_bicubic2d", FL_FLOATS, 0, k_bicubic2d},
    {"aten::upsample_linear1d_backward", FL_FLOATS, 0, k_linear1d_bwd},
    {"aten::upsample_bilinear2d_backward", FL_FLOATS, 0, k_bilinear2d_bwd},
    {"aten::upsample_trilinear3d_backward", FL_FLOATS, 0, k_trilinear3d_bwd},
    {"aten::upsample_bicubic2d_backward", FL_FLOATS, 0, k_bicubic2d_bwd},
    {"aten::_upsample_bilinear2d_aa", F3264, 0, k_bilinear2d_aa},
    {"aten::_upsample_bicubic2d_aa", F3264, 0, k_bicubic2d_aa},
    {"aten::_upsample_bilinear2d_aa_backward", F3264, 0, k_bilinear2d_aa_bwd},
    {"aten::_upsample_bicubic2d_aa_backward", F3264, 0, k_bicubic2d_aa_bwd},
    {"aten::im2col", FL_FLOATS, 0, k_im2col},
    {"aten::col2im", FL_FLOATS, 0, k_col2im},
    {"aten::grid_sampler_2d", F3264, 0, k_grid_sampler_2d},
    {"aten::grid_sampler_3d", F3264, 0, k_grid_sampler_3d},
    {"aten::grid_sampler_2d_backward", F3264, 0, k_grid_sampler_2d_bwd},
    {"aten::grid_sampler_3d_backward", F3264, 0, k_grid_sampler_3d_bwd},
    {"aten::_pdist_forward", F3264, 0, k_pdist},
    {"aten::_pdist_backward", F3264, 0, k_pdist_bwd},
    {"aten::_cdist_forward", F3264, 0, k_cdist},
    {"aten::_cdist_backward", F3264, 0, k_cdist_bwd},
    {"aten::rrelu_with_noise", FL_FLOATS, 0, k_rrelu_with_noise},
    {"aten::_embedding_bag", FL_FLOATS, 0, k_embedding_bag},
    {"aten::_embedding_bag_backward", FL_FLOATS, 0, k_embedding_bag_bwd},
    {"aten::_embedding_bag_dense_backward", FL_FLOATS, 0, k_embedding_bag_dense_bwd},
    {"aten::_embedding_bag_per_sample_weights_backward", FL_FLOATS, 0, k_embedding_bag_psw_bwd},
};

const fl_kernel_group_t fl_host_group_nn = {entries, (int)(sizeof entries / sizeof entries[0])};
