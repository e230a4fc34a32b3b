/* Internals shared by the nn kernel files that work on float64 scratch
 * (k_nn.c, k_pool.c): tensors read into contiguous float64 (or int64) arrays
 * and written back on store (io_in / io_out / io_end), argument helpers, and
 * the planes x (D, H, W) view of a spatial tensor. Not part of the ABI. */
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

#endif
