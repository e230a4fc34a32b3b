/* Host kernels: grid_sampler_2d / grid_sampler_3d, forward and backward.
 * Scratch I/O, argument helpers and the planes x (D, H, W) layout: k_nn.h. */
#include "k_nn.h"

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
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::grid_sampler_2d", F3264, 0, k_grid_sampler_2d},
    {"aten::grid_sampler_3d", F3264, 0, k_grid_sampler_3d},
    {"aten::grid_sampler_2d_backward", F3264, 0, k_grid_sampler_2d_bwd},
    {"aten::grid_sampler_3d_backward", F3264, 0, k_grid_sampler_3d_bwd},
};

const fl_kernel_group_t fl_host_group_grid_sample = {entries, (int)(sizeof entries / sizeof entries[0])};
