/* Host kernels: upsampling -- nearest, nearest-exact, linear/bilinear/trilinear,
 * bicubic, antialiased bilinear and bicubic -- forward and backward.
 * Scratch I/O, argument helpers and the planes x (D, H, W) layout: k_nn.h. */
#include "k_nn.h"

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
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
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
};

const fl_kernel_group_t fl_host_group_upsample = {entries, (int)(sizeof entries / sizeof entries[0])};
