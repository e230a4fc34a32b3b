/* Host kernels: nn. Reflection/replication padding, upsampling (nearest,
 * nearest-exact, linear/bilinear/trilinear, bicubic, antialiased bilinear and
 * bicubic), 3-D / adaptive / fractional max pooling, 3-D and adaptive 3-D
 * average pooling, max unpooling, im2col/col2im, grid sampling, embedding
 * bags, pairwise distances, rrelu: forward and the backward ops their autograd
 * formulas call.
 *
 * Layout: every spatial op sees its tensor as planes x (D, H, W): the leading
 * (batch, channel) dims flatten into planes and 1-D / 2-D ops get unit D (and
 * H). Tensors are read into contiguous float64 scratch and results converted
 * back on store (io_in / io_out / io_end), so one code path serves float32,
 * float64, float16 and bfloat16: values accumulate in double and round once.
 * The index math that decides WHICH input elements are used (upsampling
 * source indices, fractional pooling intervals) runs in the precision
 * PyTorch's CPU kernels use -- float for float32 and the half types, emulated
 * by rounding each step to float (exact for + - * /), double for float64 --
 * so the chosen elements match PyTorch's. Max pooling follows ATen: the first
 * maximum in window order wins, a NaN wins, indices are flat within a plane
 * (d*H*W + h*W + w). */
#include <stdlib.h>

#include "fl_host.h"

/* ======================================================================
 * Scratch I/O: tensors as contiguous float64 (or int64) arrays
 * ====================================================================== */

static double empty_dummy[1];

/* dst = src (same shape), converting dtypes, any strides */
static void nn_convert(const fl_tensor_t *dst, const fl_tensor_t *src) {
    fl_iter_t it;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){dst, src});
    for (int64_t o = 0; o < it.outer; o++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, o, b);
        fl_cvt_row(dst->dtype, fl_elem(dst, b[0]), it.inner_stride[0], src->dtype, fl_elem(src, b[1]),
                   it.inner_stride[1], it.inner);
    }
}

static void contig_desc(fl_tensor_t *d, const fl_tensor_t *t, int dt, void *p) {
    *d = *t;
    d->data = p;
    d->dtype = dt;
    d->offset = 0;
    int64_t s = 1;
    for (int k = t->ndim - 1; k >= 0; k--) { d->strides[k] = s; s *= t->sizes[k]; }
}

/* The buffers one kernel call reads and writes; io_end copies outputs back and frees. */
#define IO_MAX 8
typedef struct {
    int n;
    struct { const fl_tensor_t *t; int dt; void *owned; int out; } b[IO_MAX];
} io_t;

static void *io_get(io_t *io, const fl_tensor_t *t, int dt, int out, int zero) {
    int64_t n = fl_numel(t);
    if (n == 0) return empty_dummy;
    size_t bytes = (size_t)n * fl_itemsize(dt);
    void *p;
    if (t->dtype == dt && fl_is_contiguous(t)) {
        p = fl_elem(t, t->offset);
        if (zero) memset(p, 0, bytes);
        return p;
    }
    if (io->n == IO_MAX) return NULL;
    p = zero ? calloc(1, bytes) : malloc(bytes);
    if (!p) return NULL;
    io->b[io->n].t = t; io->b[io->n].dt = dt; io->b[io->n].owned = p; io->b[io->n].out = out;
    io->n++;
    if (!out) {
        fl_tensor_t d;
        contig_desc(&d, t, dt, p);
        nn_convert(&d, t);
    }
    return p;
}
/* t as a contiguous array of dtype dt (t's own memory when it already is one) */
static void *io_in(io_t *io, const fl_tensor_t *t, int dt) { return io_get(io, t, dt, 0, 0); }
/* where to write t's contents as a contiguous dt array (zero-filled when asked) */
static void *io_out(io_t *io, const fl_tensor_t *t, int dt, int zero) { return io_get(io, t, dt, 1, zero); }

static int io_end(io_t *io, int st) {
    for (int k = 0; k < io->n; k++) {
        if (st == FL_OK && io->b[k].out) {
            fl_tensor_t d;
            contig_desc(&d, io->b[k].t, io->b[k].dt, io->b[k].owned);
            nn_convert(io->b[k].t, &d);
        }
        free(io->b[k].owned);
    }
    io->n = 0;
    return st;
}
#define IO_OOM(io, what) do { io_end(io, FL_ERR_OOM); FL_FAIL(FL_ERR_OOM, "%s: cannot allocate scratch", what); } while (0)

/* ======================================================================
 * Arguments and geometry
 * ====================================================================== */

static const fl_tensor_t *in_arg(const fl_tensor_t *in, int n_in, const fl_arg_t *args, int n_args, int k) {
    if (k >= n_args || args[k].kind != FL_ARG_TENSOR || args[k].i < 0 || args[k].i >= n_in) return NULL;
    return &in[args[k].i];
}
static const fl_tensor_t *out_at(const fl_tensor_t *out, int n_out, int k) {
    if (k >= n_out || out[k].ndim < 0 || (out[k].data == NULL && fl_numel(&out[k]) != 0)) return NULL;
    return &out[k];
}
#define IN(k) in_arg(in, n_in, args, n_args, (k))
#define OUT(k) out_at(out, n_out, (k))

static int is_float(int dt) { return fl_is_floating(dt); }
/* PyTorch's index math runs in float for float32 and the half types, in double for float64 */
static int single_of(int dt) { return dt != FL_FLOAT64; }
static inline double rnd(int single, double v) { return single ? (double)(float)v : v; }

/* an int[n] argument: [] -> dflt (may be NULL: then invalid), [a] -> a repeated, or n values */
static int ints_arg(const fl_arg_t *a, int n, const int64_t *dflt, int64_t *v) {
    if (a->kind == FL_ARG_INT) { for (int i = 0; i < n; i++) v[i] = a->i; return 1; }
    if (a->kind != FL_ARG_INT_LIST) return 0;
    if (a->len == 0) { if (!dflt) return 0; for (int i = 0; i < n; i++) v[i] = dflt[i]; return 1; }
    if (a->len == 1) { for (int i = 0; i < n; i++) v[i] = a->list[0]; return 1; }
    if (a->len != n) return 0;
    for (int i = 0; i < n; i++) v[i] = a->list[i];
    return 1;
}

typedef struct { int64_t planes, D, H, W; } vol_t;

/* t seen as planes x (D, H, W) with k spatial dims; batch dims: nb_min..nb_max leading dims */
static int vol_of(const fl_tensor_t *t, int k, int nb_min, int nb_max, vol_t *v) {
    if (t->ndim < k + nb_min || t->ndim > k + nb_max) return 0;
    int64_t s[3] = {1, 1, 1};
    v->planes = 1;
    for (int d = 0; d < t->ndim - k; d++) v->planes *= t->sizes[d];
    for (int i = 0; i < k; i++) s[3 - k + i] = t->sizes[t->ndim - k + i];
    v->D = s[0]; v->H = s[1]; v->W = s[2];
    return 1;
}
static int same_planes(const fl_tensor_t *a, const fl_tensor_t *b, int k) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim - k; d++)
        if (a->sizes[d] != b->sizes[d]) return 0;
    return 1;
}
static inline int64_t vol_n(const vol_t *v) { return v->D * v->H * v->W; }

#define PAR_MIN 16384

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
    if (fl_numel(rs) != iv.planes * k)
        FL_FAIL(FL_ERR_INVALID, "fractional_max_pool%dd: random_samples has %ld values, expected %ld", k,
                (long)fl_numel(rs), (long)(iv.planes * k));
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
    {"aten::max_pool3d_with_indices", FL_FLOATS, 0, k_max_pool3d},
    {"aten::max_pool3d_with_indices_backward", FL_FLOATS, 0, k_max_pool3d_bwd},
    {"aten::adaptive_max_pool2d", FL_FLOATS, 0, k_adaptive_max_pool2d},
    {"aten::adaptive_max_pool2d_backward", FL_FLOATS, 0, k_adaptive_max_pool2d_bwd},
    {"aten::adaptive_max_pool3d", FL_FLOATS, 0, k_adaptive_max_pool3d},
    {"aten::adaptive_max_pool3d_backward", FL_FLOATS, 0, k_adaptive_max_pool3d_bwd},
    {"aten::fractional_max_pool2d", F3264, 0, k_fractional_max_pool2d},
    {"aten::fractional_max_pool2d_backward", F3264, 0, k_fractional_max_pool2d_bwd},
    {"aten::fractional_max_pool3d", F3264, 0, k_fractional_max_pool3d},
    {"aten::fractional_max_pool3d_backward", F3264, 0, k_fractional_max_pool3d_bwd},
    {"aten::avg_pool3d", FL_FLOATS, 0, k_avg_pool3d},
    {"aten::avg_pool3d_backward", FL_FLOATS, 0, k_avg_pool3d_bwd},
    {"aten::_adaptive_avg_pool3d", FL_FLOATS, 0, k_adaptive_avg_pool3d},
    {"aten::_adaptive_avg_pool3d_backward", FL_FLOATS, 0, k_adaptive_avg_pool3d_bwd},
    {"aten::max_unpool2d", FL_FLOATS, 0, k_max_unpool2d},
    {"aten::max_unpool3d", FL_FLOATS, 0, k_max_unpool3d},
    {"aten::im2col", FL_FLOATS, 0, k_im2col},
    {"aten::col2im", FL_FLOATS, 0, k_col2im},
};

const fl_kernel_group_t fl_host_group_nn = {entries, (int)(sizeof entries / sizeof entries[0])};
