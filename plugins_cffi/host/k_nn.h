/* Internals shared by the nn kernel files that work on float64 scratch. Not part of the ABI.
 *
 * Files (each exports its own kernel group, listed in common.c in this order):
 *   k_pad.c            reflection/replication padding (+ backward)
 *   k_upsample.c       upsampling: nearest, nearest-exact, linear/bilinear/trilinear, bicubic,
 *                      antialiased bilinear and bicubic (+ backward)
 *   k_im2col.c         im2col, col2im
 *   k_grid_sample.c    grid sampling (+ backward)
 *   k_distance.c       pairwise distances (pdist, cdist + backward)
 *   k_rrelu.c          rrelu_with_noise
 *   k_embedding_bag.c  embedding bags (+ backward)
 *   k_pool.c           every pooling and unpooling kernel
 * Convolution is in k_conv.c, normalisation in k_norm.c, losses in k_loss.c.
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
 * so the chosen elements match PyTorch's.
 *
 * This header: the scratch I/O, argument helpers, the planes x (D, H, W) view
 * of a spatial tensor, and the cubic convolution weights upsampling and grid
 * sampling share. */
#ifndef FL_K_NN_H
#define FL_K_NN_H

#include <stdlib.h>

#include "fl_host.h"

/* ======================================================================
 * Scratch I/O: tensors as contiguous float64 (or int64) arrays
 * ====================================================================== */

static double empty_dummy[1];

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
        fl_copy_strided(&d, t);
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
            fl_copy_strided(io->b[k].t, &d);
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

#define IN(k) fl_arg_tensor(args, n_args, (k), in, n_in)
#define OUT(k) fl_out_at(out, n_out, (k))

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

/* a number argument (p of a distance, rrelu's bounds) as a double; 0 when it is not a number */
static int p_arg(const fl_arg_t *a, double *p) {
    if (a->kind == FL_ARG_FLOAT) *p = a->f;
    else if (a->kind == FL_ARG_INT) *p = (double)a->i;
    else return 0;
    return 1;
}

/* Keys' cubic convolution weights (coefficient A): |x| < 1 and 1 <= |x| < 2 */
static double cubic1(double x, double A) { return ((A + 2) * x - (A + 3)) * x * x + 1; }
static double cubic2(double x, double A) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; }

#define F3264 (FL_F32 | FL_F64)

#endif
