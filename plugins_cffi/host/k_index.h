/* Internals shared by the host plugin's indexing kernel files. Not part of the ABI.
 *
 * Files (each exports its own kernel group, listed in common.c in this order):
 *   k_gather.c   embedding(_dense_backward), index_select, gather, scatter_add, cat, stack, flip,
 *                arange (a factory)
 *   k_sort.c     sorting: sort, topk, kthvalue, median, nanmedian, mode;
 *                scans: cumprod, cummax, cummin, logcumsumexp (cumsum is with the row-wise
 *                reductions in k_reduce.c)
 *   k_scatter.c  scatter (src/value, reduce), scatter_reduce, index_add/copy/fill/reduce
 *   k_index.c    advanced indexing: index.Tensor, index_put, _unsafe_masked_index(_put_accumulate);
 *                flat / masked: take, put, masked_scatter(_backward), nonzero_static
 *   k_search.c   searchsorted, bucketize, isin, histc
 *   k_layout.c   layout: roll, slice_scatter, as_strided_scatter, repeat_interleave;
 *                segments: segment_reduce
 * This header: element load/store, index checks, the int64-or-double numbers of the
 * accumulating kernels (arguments, broadcasting and the walkers: fl_kernel_util.h).
 *
 * Conventions. Every order-sensitive loop (sorting ties, accumulating scatters)
 * runs in a fixed logical order, so results are deterministic. Sorting works on
 * 64-bit keys that order every dtype exactly (int64 beyond 2^53 included), with
 * NaN the largest value and -0.0 equal to 0.0, as PyTorch orders them. Indices
 * are bounds-checked before anything is written, with PyTorch's wording; they
 * wrap when negative only where PyTorch wraps them. float16/bfloat16 compute in
 * float or double and round on every store, as the other host kernels do.
 *
 * String arguments (reduce="amax", side="right") arrive as FL_ARG_OTHER with their
 * fl_string_code_t (fl_plugin.h: FL_STR_amax, FL_STR_right; FL_STR_UNKNOWN for a
 * string the ABI has no code for). A kernel that cannot tell which string it got
 * declines the call.
 */
#ifndef FL_K_INDEX_H
#define FL_K_INDEX_H

#include <omp.h>
#include <stdlib.h>

#include "fl_host.h"

#define UNSUP FL_ERR_UNSUPPORTED
#define PAR_MIN 32768

/* ================================================================== */
/* helpers                                                            */
/* ================================================================== */

static int is_int_index(int dtype) { return dtype == FL_INT64 || dtype == FL_INT32; }
static int is_mask(int dtype) { return dtype == FL_BOOL || dtype == FL_UINT8; }
/* rank >= 1 view of t (a 0-dim tensor becomes one element of size 1) */
static fl_tensor_t as1d(const fl_tensor_t *t) {
    fl_tensor_t v = *t;
    if (v.ndim == 0) { v.ndim = 1; v.sizes[0] = 1; v.strides[0] = 1; }
    return v;
}
/* o with a size-1 dim inserted at `dim` (keepdim=False outputs of per-row ops) */
static fl_tensor_t keep_dim(const fl_tensor_t *o, int ndim_in, int dim) {
    fl_tensor_t v = *o;
    if (o->ndim == ndim_in) return as1d(o);
    if (ndim_in == 0) return as1d(o);
    for (int d = ndim_in - 1; d > dim; d--) { v.sizes[d] = o->sizes[d - 1]; v.strides[d] = o->strides[d - 1]; }
    v.sizes[dim] = 1; v.strides[dim] = 0; v.ndim = ndim_in;
    return v;
}
static int same_sizes(const fl_tensor_t *a, const fl_tensor_t *b) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++) if (a->sizes[d] != b->sizes[d]) return 0;
    return 1;
}
static void store_i64(const fl_tensor_t *t, int64_t off, int64_t v) {
    char *p = fl_elem(t, off);
    if (t->dtype == FL_INT64) *(int64_t *)p = v;
    else fl_cvt_row(t->dtype, p, 1, FL_INT64, &v, 1, 1);
}
static void copy_elem(const fl_tensor_t *dst, int64_t doff, const fl_tensor_t *src, int64_t soff) {
    if (dst->dtype == src->dtype) memcpy(fl_elem(dst, doff), fl_elem(src, soff), fl_itemsize(dst->dtype));
    else fl_cvt_row(dst->dtype, fl_elem(dst, doff), 1, src->dtype, fl_elem(src, soff), 1, 1);
}
/* the functional form of an op writes into a fresh output: start it as a copy of self */
static void init_from_self(const fl_tensor_t *o, const fl_tensor_t *x) {
    if (o->data != x->data || o->offset != x->offset || !same_sizes(o, x)) fl_copy_strided(o, x);
}
/* offset of the element with logical (row-major) index lin */
static int64_t lin_off(const fl_tensor_t *t, int64_t lin) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0 && lin; d--) {
        off += (lin % t->sizes[d]) * t->strides[d];
        lin /= t->sizes[d];
    }
    return off;
}
static void shape_str(char *buf, size_t n, int nd, const int64_t *s) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < nd && k < n; d++) k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)s[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}


/* ---- numbers: int64 for integer/bool dtypes (exact), double for floats ---- */
typedef struct { double f; int64_t i; } num_t;
static inline num_t num_load(int dtype, const void *p) {
    num_t v = {0, 0};
    if (fl_is_floating(dtype)) v.f = fl_load_f64(dtype, p);
    else fl_cvt_row(FL_INT64, &v.i, 1, dtype, p, 1, 1);
    return v;
}
static inline void num_store(int dtype, void *p, num_t v) {
    if (fl_is_floating(dtype)) fl_store_f64(dtype, p, v.f);
    else fl_cvt_row(dtype, p, 1, FL_INT64, &v.i, 1, 1);
}
/* a scalar argument (or a one-element tensor) converted to `dtype` as a store would */
static int num_arg(int dtype, const fl_arg_t *a, const fl_tensor_t *in, int n_in, num_t *v) {
    char tmp[16]; /* room for any dtype fl_store_f64 can write (a complex128 is 16 bytes) */
    if (a->kind == FL_ARG_TENSOR) {
        if (a->i < 0 || a->i >= n_in || !fl_tensor_ok(&in[a->i]) || fl_numel(&in[a->i]) != 1) return -1;
        copy_elem(&(fl_tensor_t){.data = tmp, .dtype = dtype}, 0, &in[a->i], in[a->i].offset);
    } else if (a->kind == FL_ARG_FLOAT) {
        fl_store_f64(dtype, tmp, a->f);
    } else if (a->kind == FL_ARG_INT || a->kind == FL_ARG_BOOL) {
        fl_cvt_row(dtype, tmp, 1, FL_INT64, &a->i, 1, 1);
    } else {
        return -1;
    }
    *v = num_load(dtype, tmp);
    return 0;
}
enum { R_NONE, R_SUM, R_PROD, R_MEAN, R_MAX, R_MIN };
/* a (+)= b under reduction r; NaN propagates through max/min as in PyTorch */
static inline num_t num_combine(int r, int isint, num_t a, num_t b) {
    if (isint) {
        switch (r) {
        case R_SUM: case R_MEAN: a.i = (int64_t)((uint64_t)a.i + (uint64_t)b.i); break;
        case R_PROD: a.i = (int64_t)((uint64_t)a.i * (uint64_t)b.i); break;
        case R_MAX: if (b.i > a.i) a.i = b.i; break;
        case R_MIN: if (b.i < a.i) a.i = b.i; break;
        default: a = b;
        }
    } else {
        switch (r) {
        case R_SUM: case R_MEAN: a.f += b.f; break;
        case R_PROD: a.f *= b.f; break;
        case R_MAX: if (isnan(b.f) || b.f > a.f) a.f = b.f; break;
        case R_MIN: if (isnan(b.f) || b.f < a.f) a.f = b.f; break;
        default: a = b;
        }
    }
    return a;
}
/* mean's final division: true division for floats, floor division for integers */
static inline num_t num_div(int isint, num_t a, int64_t c) {
    if (isint) {
        int64_t q = a.i / c;
        if ((a.i % c != 0) && ((a.i < 0) != (c < 0))) q--;
        a.i = q;
    } else {
        a.f /= (double)c;
    }
    return a;
}
static void *xmalloc(size_t n) { return malloc(n ? n : 1); }

#define OOM(what) FL_FAIL(FL_ERR_OOM, "%s: out of host memory", what)
/* ATen's wording: an empty dimension is not named by its position */
#define OOB(idx, dim, size)                                                                                        \
    do {                                                                                                           \
        if ((size) == 0)                                                                                           \
            FL_FAIL(FL_ERR_INVALID, "index %lld is out of bounds for dimension with size 0", (long long)(idx));   \
        FL_FAIL(FL_ERR_INVALID, "index %lld is out of bounds for dimension %d with size %lld", (long long)(idx),    \
                (int)(dim), (long long)(size));                                                                    \
    } while (0)

/* a value rounded to dtype's precision and back (histc's and segment_reduce's arithmetic) */
static inline double rnd_to(int dtype, double v) {
    char tmp[16]; /* room for any dtype fl_store_f64 can write (a complex128 is 16 bytes) */
    fl_store_f64(dtype, tmp, v);
    return fl_load_f64(dtype, tmp);
}

/* table shorthands */
#define ALL FL_ALL_DTYPES
#define FLT FL_FLOATS
#define NUM (FL_FLOATS | FL_INTS)
#define E(name, mask, fn) {name, mask, 0, fn}

#endif
