/* Host kernels: indexing. Serves sorting, scans, gathers and scatters, advanced
 * indexing, searching, concatenation and the layout ops below (cumsum is with
 * the row-wise reductions in k_reduce.c).
 *
 * Sections:
 *   helpers        element load/store, index checks (arguments, broadcasting and the walkers:
 *                  fl_kernel_util.h)
 *   sorting        sort, topk, kthvalue, median, nanmedian, mode
 *   scans          cumprod, cummax, cummin, logcumsumexp
 *   scatter        scatter (src/value, reduce), scatter_reduce, index_add/copy/fill/reduce
 *   advanced index index.Tensor, index_put, _unsafe_masked_index(_put_accumulate)
 *   flat / masked  take, put, masked_scatter(_backward), nonzero_static
 *   search         searchsorted, bucketize, isin, histc
 *   layout         roll, slice_scatter, as_strided_scatter, repeat_interleave
 *   segments       segment_reduce
 *   gather         embedding(_dense_backward), index_select, gather, scatter_add, cat, stack, flip,
 *                  arange (a factory)
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
    char tmp[8];
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

/* ================================================================== */
/* sorting: sort, topk, kthvalue, median, nanmedian, mode             */
/* ================================================================== */

/* (key, index) pairs. Keys order values exactly as PyTorch compares them:
 * integers as int64; floats through their bits with -0.0 folded onto 0.0 and
 * every NaN onto one key above +inf. Descending order flips the key, so one
 * stable ascending sort serves both (ties keep their original order). */
typedef struct { uint64_t k; int64_t i; } kv_t;

static inline uint64_t key_of_double(double v) {
    if (v != v) return UINT64_MAX;
    if (v == 0.0) v = 0.0;
    uint64_t u;
    memcpy(&u, &v, 8);
    return (u >> 63) ? ~u : (u | (1ull << 63));
}
static inline uint64_t key_of_int(int64_t v) { return (uint64_t)v ^ (1ull << 63); }
static inline int key_is_nan(int dtype, uint64_t k) { return fl_is_floating(dtype) && k == UINT64_MAX; }

/* fills kv[0..n) from a strided row; buf holds n doubles or int64s */
static void load_keys(const fl_tensor_t *x, int64_t off, int64_t st, int64_t n, int desc, void *buf, kv_t *kv) {
    if (fl_is_floating(x->dtype)) {
        double *b = buf;
        fl_cvt_row(FL_FLOAT64, b, 1, x->dtype, fl_elem(x, off), st, n);
        for (int64_t j = 0; j < n; j++) kv[j].k = key_of_double(b[j]), kv[j].i = j;
    } else {
        int64_t *b = buf;
        fl_cvt_row(FL_INT64, b, 1, x->dtype, fl_elem(x, off), st, n);
        for (int64_t j = 0; j < n; j++) kv[j].k = key_of_int(b[j]), kv[j].i = j;
    }
    if (desc)
        for (int64_t j = 0; j < n; j++) kv[j].k = ~kv[j].k;
}

/* stable merge sort by key */
static void kv_sort(kv_t *a, kv_t *tmp, int64_t n) {
    if (n <= 16) {
        for (int64_t i = 1; i < n; i++) {
            kv_t v = a[i];
            int64_t j = i;
            while (j > 0 && a[j - 1].k > v.k) { a[j] = a[j - 1]; j--; }
            a[j] = v;
        }
        return;
    }
    int64_t h = n / 2;
    kv_sort(a, tmp, h);
    kv_sort(a + h, tmp, n - h);
    if (a[h - 1].k <= a[h].k) return;
    memcpy(tmp, a, sizeof(kv_t) * (size_t)h);
    int64_t i = 0, j = h, o = 0;
    while (i < h && j < n) a[o++] = (a[j].k < tmp[i].k) ? a[j++] : tmp[i++];
    while (i < h) a[o++] = tmp[i++];
}

/* PyTorch's quick_select_template (aten/src/ATen/native/SortingUtils.h), the
 * selection kthvalue uses: replaying it picks the same index among ties. */
static void kv_swap(kv_t *a, int64_t i, int64_t j) { kv_t t = a[i]; a[i] = a[j]; a[j] = t; }
static void kv_quickselect(kv_t *arr, int64_t n, int64_t k) {
    int64_t L = 0, R = n - 1, i, j, P;
    for (;;) {
        if (R <= L) return;
        if (R == L + 1) {
            if (arr[L].k > arr[R].k) kv_swap(arr, L, R);
            return;
        }
        P = L + (R - L) / 2;
        kv_swap(arr, P, L + 1);
        if (arr[L + 1].k > arr[R].k) kv_swap(arr, L + 1, R);
        if (arr[L].k > arr[R].k) kv_swap(arr, L, R);
        if (arr[L + 1].k > arr[L].k) kv_swap(arr, L + 1, L);
        i = L + 1;
        j = R;
        uint64_t piv = arr[L].k;
        for (;;) {
            do i++; while (piv > arr[i].k);
            do j--; while (arr[j].k > piv);
            if (j < i) break;
            kv_swap(arr, i, j);
        }
        kv_swap(arr, L, j);
        if (j <= k) L = i;
        if (j >= k) R = j - 1;
    }
}

/* libstdc++'s std::sort, std::nth_element and std::partial_sort, replayed step
 * for step (bits/stl_algo.h, stl_heap.h): PyTorch's CPU kernels call them for
 * unstable sort, topk, median and mode, and which of several equal values
 * comes first is whatever these algorithms leave. Replaying them gives the
 * same indices on ties as PyTorch on CPU. */
#define LESS(a, b) ((a).k < (b).k)
static void ls_push_heap(kv_t *f, int64_t hole, int64_t top, kv_t v) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && LESS(f[parent], v)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = v;
}
static void ls_adjust_heap(kv_t *f, int64_t hole, int64_t len, kv_t v) {
    int64_t top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (LESS(f[child], f[child - 1])) child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    ls_push_heap(f, hole, top, v);
}
static void ls_make_heap(kv_t *f, int64_t len) {
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        ls_adjust_heap(f, parent, len, f[parent]);
        if (parent == 0) return;
    }
}
static void ls_pop_heap(kv_t *f, int64_t len, kv_t *result) {
    kv_t v = *result;
    *result = f[0];
    ls_adjust_heap(f, 0, len, v);
}
static void ls_heap_select(kv_t *f, int64_t mid, int64_t n) {
    ls_make_heap(f, mid);
    for (int64_t i = mid; i < n; i++)
        if (LESS(f[i], f[0])) ls_pop_heap(f, mid, &f[i]);
}
static void ls_partial_sort(kv_t *f, int64_t mid, int64_t n) {
    ls_heap_select(f, mid, n);
    for (int64_t last = mid; last > 1; last--) ls_pop_heap(f, last - 1, &f[last - 1]);
}
static void ls_median_to_first(kv_t *f, int64_t r, int64_t a, int64_t b, int64_t c) {
    int64_t m;
    if (LESS(f[a], f[b])) m = LESS(f[b], f[c]) ? b : LESS(f[a], f[c]) ? c : a;
    else m = LESS(f[a], f[c]) ? a : LESS(f[b], f[c]) ? c : b;
    kv_swap(f, r, m);
}
static int64_t ls_partition_pivot(kv_t *f, int64_t first, int64_t last) {
    int64_t mid = first + (last - first) / 2;
    ls_median_to_first(f, first, first + 1, mid, last - 1);
    int64_t lo = first + 1, hi = last;
    for (;;) {
        while (LESS(f[lo], f[first])) lo++;
        hi--;
        while (LESS(f[first], f[hi])) hi--;
        if (!(lo < hi)) return lo;
        kv_swap(f, lo, hi);
        lo++;
    }
}
static void ls_insertion_sort(kv_t *f, int64_t first, int64_t last) {
    for (int64_t i = first + 1; i < last; i++) {
        kv_t v = f[i];
        if (LESS(v, f[first])) {
            memmove(&f[first + 1], &f[first], sizeof(kv_t) * (size_t)(i - first));
            f[first] = v;
        } else {
            int64_t j = i;
            while (LESS(v, f[j - 1])) { f[j] = f[j - 1]; j--; }
            f[j] = v;
        }
    }
}
static int64_t ls_lg(int64_t n) { int64_t k = 0; while (n >>= 1) k++; return k; }
static void ls_introsort(kv_t *f, int64_t first, int64_t last, int64_t depth) {
    while (last - first > 16) {
        if (depth == 0) { ls_partial_sort(f + first, last - first, last - first); return; }
        depth--;
        int64_t cut = ls_partition_pivot(f, first, last);
        ls_introsort(f, cut, last, depth);
        last = cut;
    }
}
static void ls_sort(kv_t *f, int64_t n) {
    if (n < 2) return;
    ls_introsort(f, 0, n, 2 * ls_lg(n));
    if (n > 16) {
        ls_insertion_sort(f, 0, 16);
        for (int64_t i = 16; i < n; i++) { /* unguarded: f[0..16) holds a smaller element */
            kv_t v = f[i];
            int64_t j = i;
            while (LESS(v, f[j - 1])) { f[j] = f[j - 1]; j--; }
            f[j] = v;
        }
    } else {
        ls_insertion_sort(f, 0, n);
    }
}
static void ls_nth_element(kv_t *f, int64_t n, int64_t nth) {
    if (n < 2 || nth >= n) return;
    int64_t first = 0, last = n, depth = 2 * ls_lg(n);
    while (last - first > 3) {
        if (depth == 0) {
            ls_heap_select(f + first, nth + 1 - first, last - first);
            kv_swap(f, first, nth);
            return;
        }
        depth--;
        int64_t cut = ls_partition_pivot(f, first, last);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    ls_insertion_sort(f, first, last);
}
#undef LESS

/* What a per-row selection writes for each row. */
enum { SEL_SORT, SEL_TOPK, SEL_KTH, SEL_MEDIAN, SEL_NANMEDIAN, SEL_MODE };

/* Runs `what` over every row of x along dim. vals/idx are shaped like x outside
 * dim (idx may be NULL); along dim they hold n (sort), k (topk) or 1 entries. */
static int select_rows(const char *name, int what, const fl_tensor_t *x0, int dim, int desc, int stable, int64_t k,
                       const fl_tensor_t *vals0, const fl_tensor_t *idx0) {
    fl_tensor_t x = as1d(x0), v = *vals0, ix = idx0 ? *idx0 : *vals0;
    if (x0->ndim == 0) { v = as1d(vals0); ix = as1d(idx0 ? idx0 : vals0); }
    if (v.ndim != x.ndim || ix.ndim != x.ndim || v.dtype != x.dtype) return UNSUP;
    if (idx0 && ix.dtype != FL_INT64) return UNSUP;
    const fl_tensor_t *ts[3] = {&x, &v, &ix};
    fl_rows_t L;
    if (fl_rows_init(&L, ts, 3, dim)) return UNSUP;
    int64_t n = x.sizes[dim], nout = v.sizes[dim];
    if (ix.sizes[dim] != nout) return UNSUP;
    if (L.nrows == 0 || nout == 0) return FL_OK;
    int err = 0;
#pragma omp parallel if (L.nrows * n >= PAR_MIN && L.nrows > 1)
    {
        kv_t *kv = xmalloc(sizeof(kv_t) * (size_t)n * 2);
        void *buf = xmalloc(8 * (size_t)n);
        if (!kv || !buf) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp for schedule(static)
        for (int64_t row = 0; row < L.nrows; row++) {
            if (!kv || !buf) continue;
            int64_t off[3];
            fl_rows_at(&L, ts, row, off);
            load_keys(&x, off[0], L.st[0], n, desc, buf, kv);
            int64_t pick = 0; /* position in kv of the single answer (kth, median, mode) */
            if (what == SEL_SORT) {
                if (stable) kv_sort(kv, kv + n, n);
                else ls_sort(kv, n);
            } else if (what == SEL_TOPK) { /* topk_impl_loop's choice of algorithm */
                if (nout * 64 <= n) {
                    ls_partial_sort(kv, nout, n);
                } else {
                    ls_nth_element(kv, n, nout - 1);
                    if (stable) ls_sort(kv, nout - 1); /* (stable carries `sorted` here) */
                }
            } else if (what == SEL_KTH) {
                kv_quickselect(kv, n, k - 1);
                pick = k - 1;
            } else if (what == SEL_MEDIAN) { /* any NaN: the median is NaN, at the first NaN's index; else the
                                                * middle of a stable sort, which picks CPU's index among ties */
                while (pick < n && !key_is_nan(x.dtype, kv[pick].k)) pick++;
                if (pick == n) {
                    pick = (n - 1) / 2;
                    kv_sort(kv, kv + n, n);
                }
            } else if (what == SEL_NANMEDIAN) {
                int64_t nnan = 0;
                for (int64_t j = 0; j < n; j++) nnan += key_is_nan(x.dtype, kv[j].k);
                pick = (n - nnan - 1) / 2; /* C division: 0 when every value is NaN, as in PyTorch */
                kv_sort(kv, kv + n, n);
            } else if (what == SEL_MODE) { /* most frequent value; on equal counts the smallest; end of its run
                                              * (NaNs count as one value here; CPU's std::sort has no order for them) */
                ls_sort(kv, n);
                int64_t best = 0, run = 0;
                for (int64_t j = 0; j < n; j++) {
                    run++;
                    if (j == n - 1 || kv[j].k != kv[j + 1].k) {
                        if (run > best) { best = run; pick = j; }
                        run = 0;
                    }
                }
            }
            if (what == SEL_SORT || what == SEL_TOPK) {
                for (int64_t j = 0; j < nout; j++) {
                    copy_elem(&v, off[1] + j * L.st[1], &x, off[0] + kv[j].i * L.st[0]);
                    if (idx0) *(int64_t *)fl_elem(&ix, off[2] + j * L.st[2]) = kv[j].i;
                }
            } else {
                copy_elem(&v, off[1], &x, off[0] + kv[pick].i * L.st[0]);
                if (idx0) *(int64_t *)fl_elem(&ix, off[2]) = kv[pick].i;
            }
        }
        free(kv);
        free(buf);
    }
    if (err) OOM(name);
    return FL_OK;
}

#define SORT_DTYPES FL_ALL_DTYPES
#define ORDER_DTYPES (FL_FLOATS | FL_INTS) /* topk, kthvalue, median: no bool in PyTorch */

/* sort(self, dim=-1, descending=False) -> (values, indices) */
static int k_sort(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_tensor_ok(&out[0]) || !fl_tensor_ok(&out[1])) return UNSUP;
    int dim;
    if (fl_wrap_dim(fl_arg_int_or(args, n_args, 1, -1), x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "sort: dimension out of range");
    return select_rows("sort", SEL_SORT, x, dim, (int)fl_arg_int_or(args, n_args, 2, 0), 0, 0, &out[0], &out[1]);
}
/* sort.stable(self, *, stable?, dim=-1, descending=False): stable=True keeps ties in order (merge sort);
 * otherwise ties end where std::sort leaves them, as on CPU */
static int k_sort_stable(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_tensor_ok(&out[0]) || !fl_tensor_ok(&out[1])) return UNSUP;
    int dim;
    if (fl_wrap_dim(fl_arg_int_or(args, n_args, 2, -1), x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "sort: dimension out of range");
    return select_rows("sort", SEL_SORT, x, dim, (int)fl_arg_int_or(args, n_args, 3, 0), (int)fl_arg_int_or(args, n_args, 1, 0), 0,
                       &out[0], &out[1]);
}
/* topk(self, k, dim=-1, largest=True, sorted=True): CPU's partial_sort / nth_element replayed */
static int k_topk(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_tensor_ok(&out[0]) || !fl_tensor_ok(&out[1]) || n_args < 2) return UNSUP;
    int dim;
    if (fl_wrap_dim(fl_arg_int_or(args, n_args, 2, -1), x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "topk: dimension out of range");
    int64_t k = args[1].i, n = x->ndim ? x->sizes[dim] : 1;
    if (k < 0 || k > n) FL_FAIL(FL_ERR_INVALID, "selected index k out of range");
    return select_rows("topk", SEL_TOPK, x, dim, (int)fl_arg_int_or(args, n_args, 3, 1), (int)fl_arg_int_or(args, n_args, 4, 1), k,
                       &out[0], &out[1]);
}
/* kthvalue(self, k, dim=-1, keepdim=False) */
static int k_kthvalue(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_tensor_ok(&out[0]) || !fl_tensor_ok(&out[1]) || n_args < 2) return UNSUP;
    int dim;
    if (fl_wrap_dim(fl_arg_int_or(args, n_args, 2, -1), x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "kthvalue: dimension out of range");
    int64_t k = args[1].i, n = x->ndim ? x->sizes[dim] : 1;
    if (k < 1 || k > n)
        FL_FAIL(FL_ERR_INVALID, "kthvalue(): selected number k out of range for dimension %d", dim);
    fl_tensor_t v = keep_dim(&out[0], x->ndim, dim), ix = keep_dim(&out[1], x->ndim, dim);
    return select_rows("kthvalue", SEL_KTH, x, dim, 0, 0, k, &v, &ix);
}
/* median.dim / nanmedian.dim / mode(self, dim, keepdim) */
static int per_row_pick(const char *name, int what, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_tensor_ok(&out[0]) || !fl_tensor_ok(&out[1])) return UNSUP;
    int dim;
    if (fl_wrap_dim(fl_arg_int_or(args, n_args, 1, -1), x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "%s: dimension out of range", name);
    if (x->ndim && x->sizes[dim] == 0)
        FL_FAIL(FL_ERR_INVALID, "%s(): Expected reduction dim %d to have non-zero size.", name, dim);
    fl_tensor_t v = keep_dim(&out[0], x->ndim, dim), ix = keep_dim(&out[1], x->ndim, dim);
    return select_rows(name, what, x, dim, 0, 0, 0, &v, &ix);
}
static int k_median_dim(FL_KERNEL_ARGS) { return per_row_pick("median", SEL_MEDIAN, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_nanmedian_dim(FL_KERNEL_ARGS) { return per_row_pick("nanmedian", SEL_NANMEDIAN, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_mode(FL_KERNEL_ARGS) { return per_row_pick("mode", SEL_MODE, stream, device, in, n_in, out, n_out, args, n_args); }

/* median(self) / nanmedian(self): the value over all elements (NaN when empty) */
static int whole_median(int what, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 1 || !fl_tensor_ok(&out[0]) || out[0].ndim != 0 || out[0].dtype != x->dtype) return UNSUP;
    int64_t n = fl_numel(x);
    if (n == 0) {
        if (!fl_is_floating(x->dtype)) FL_FAIL(FL_ERR_INVALID, "median() input tensor cannot be empty");
        fl_store_f64(out[0].dtype, fl_elem(&out[0], out[0].offset), NAN);
        return FL_OK;
    }
    /* a contiguous int64 / double copy of x, viewed as one row */
    void *flat = xmalloc(8 * (size_t)n);
    if (!flat) OOM("median");
    int wide = fl_is_floating(x->dtype) ? FL_FLOAT64 : FL_INT64;
    fl_tensor_t dst = *x;
    dst.data = flat; dst.offset = 0; dst.dtype = wide;
    for (int64_t d = x->ndim - 1, s = 1; d >= 0; d--) { dst.strides[d] = s; s *= x->sizes[d]; }
    fl_copy_strided(&dst, x);
    fl_tensor_t f = {.data = flat, .offset = 0, .dtype = wide, .ndim = 1, .sizes = {n}, .strides = {1}};
    char res[8];
    fl_tensor_t rv = {.data = res, .dtype = wide, .ndim = 1, .sizes = {1}, .strides = {1}};
    int st = select_rows("median", what, &f, 0, 0, 0, 0, &rv, NULL);
    if (st == FL_OK) fl_cvt_row(out[0].dtype, fl_elem(&out[0], out[0].offset), 1, wide, res, 1, 1);
    free(flat);
    return st;
}
static int k_median(FL_KERNEL_ARGS) { return whole_median(SEL_MEDIAN, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_nanmedian(FL_KERNEL_ARGS) { return whole_median(SEL_NANMEDIAN, stream, device, in, n_in, out, n_out, args, n_args); }

/* ================================================================== */
/* scans: cumprod, cummax, cummin, logcumsumexp                       */
/* (cumsum lives in k_reduce.c)                                       */
/* ================================================================== */

enum { SCAN_PROD, SCAN_MAX, SCAN_MIN, SCAN_LSE };

/* log(exp(a) + exp(b)) without overflow; equal infinities stay as they are */
static inline double log_add_exp(double a, double b) {
    double lo = a < b ? a : b, hi = a < b ? b : a;
    if (isnan(a) || isnan(b)) return NAN;
    if (lo != hi || isfinite(lo)) return hi + log1p(exp(lo - hi));
    return a;
}

/* One scan along dim. vals (and idx for cummax/cummin) are shaped like x.
 * Accumulates in double for floats (PyTorch's CPU accumulate type) and in
 * wrapping int64 for integers; cumprod first converts x to the output dtype
 * (its dtype= argument), as PyTorch does. */
static int scan_rows(const char *name, int what, const fl_tensor_t *x0, int dim, const fl_tensor_t *v0,
                     const fl_tensor_t *ix0) {
    fl_tensor_t x = as1d(x0), v = as1d(v0), ix = ix0 ? as1d(ix0) : v;
    if (!same_sizes(&x, &v) || (ix0 && (!same_sizes(&x, &ix) || ix.dtype != FL_INT64))) return UNSUP;
    if (what != SCAN_PROD && v.dtype != x.dtype) return UNSUP;
    const fl_tensor_t *ts[3] = {&x, &v, &ix};
    fl_rows_t L;
    if (fl_rows_init(&L, ts, 3, dim)) return UNSUP;
    int64_t n = x.sizes[dim];
    if (L.nrows == 0 || n == 0) return FL_OK;
    int isint = !fl_is_floating(v.dtype);
    int err = 0;
#pragma omp parallel if (L.nrows * n >= PAR_MIN && L.nrows > 1)
    {
        void *buf = xmalloc(8 * (size_t)n), *raw = xmalloc(8 * (size_t)n);
        if (!buf || !raw) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp for schedule(static)
        for (int64_t row = 0; row < L.nrows; row++) {
            if (!buf || !raw) continue;
            int64_t off[3];
            fl_rows_at(&L, ts, row, off);
            /* x's row in the output dtype, then widened */
            fl_cvt_row(v.dtype, raw, 1, x.dtype, fl_elem(&x, off[0]), L.st[0], n);
            if (isint) {
                int64_t *b = buf;
                fl_cvt_row(FL_INT64, b, 1, v.dtype, raw, 1, n);
                int64_t acc = b[0], at = 0;
                for (int64_t j = 0; j < n; j++) {
                    if (what == SCAN_PROD) {
                        if (j) acc = (int64_t)((uint64_t)acc * (uint64_t)b[j]);
                    } else if (what == SCAN_MAX ? b[j] >= acc : b[j] <= acc) { /* ties: the last index */
                        acc = b[j];
                        at = j;
                    }
                    b[j] = acc;
                    if (ix0) *(int64_t *)fl_elem(&ix, off[2] + j * L.st[2]) = at;
                }
                fl_cvt_row(v.dtype, fl_elem(&v, off[1]), L.st[1], FL_INT64, b, 1, n);
            } else {
                double *b = buf;
                fl_cvt_row(FL_FLOAT64, b, 1, v.dtype, raw, 1, n);
                double acc = b[0];
                int64_t at = 0;
                for (int64_t j = 0; j < n; j++) {
                    double y = b[j];
                    if (what == SCAN_PROD) {
                        if (j) acc *= y;
                    } else if (what == SCAN_LSE) {
                        if (j) acc = log_add_exp(acc, y);
                    } else if (isnan(y) || (!isnan(acc) && (what == SCAN_MAX ? y >= acc : y <= acc))) {
                        acc = y; /* NaN sticks, and each later NaN takes over the index */
                        at = j;
                    }
                    b[j] = acc;
                    if (ix0) *(int64_t *)fl_elem(&ix, off[2] + j * L.st[2]) = at;
                }
                fl_cvt_row(v.dtype, fl_elem(&v, off[1]), L.st[1], FL_FLOAT64, b, 1, n);
            }
        }
        free(buf);
        free(raw);
    }
    if (err) OOM(name);
    return FL_OK;
}
static int scan_kernel(const char *name, int what, int nres, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < nres || n_args < 2 || args[1].kind != FL_ARG_INT || !fl_tensor_ok(&out[0])) return UNSUP;
    if (nres == 2 && !fl_tensor_ok(&out[1])) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "%s: dimension out of range", name);
    return scan_rows(name, what, x, dim, &out[0], nres == 2 ? &out[1] : NULL);
}
/* cumprod(self, dim, *, dtype?) / cumprod_ */
static int k_cumprod(FL_KERNEL_ARGS) { return scan_kernel("cumprod", SCAN_PROD, 1, stream, device, in, n_in, out, n_out, args, n_args); }
/* cummax / cummin(self, dim) -> (values, indices) */
static int k_cummax(FL_KERNEL_ARGS) { return scan_kernel("cummax", SCAN_MAX, 2, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_cummin(FL_KERNEL_ARGS) { return scan_kernel("cummin", SCAN_MIN, 2, stream, device, in, n_in, out, n_out, args, n_args); }
/* logcumsumexp(self, dim) */
static int k_logcumsumexp(FL_KERNEL_ARGS) { return scan_kernel("logcumsumexp", SCAN_LSE, 1, stream, device, in, n_in, out, n_out, args, n_args); }

/* ================================================================== */
/* scatter: scatter, scatter_reduce, index_add/copy/fill/reduce       */
/* ================================================================== */

/* Per-target bookkeeping for reductions that need it: how many values each
 * output element received (mean divides by it; include_self=False replaces
 * the element on its first hit). Indexed by element offset from o's lowest. */
typedef struct {
    int32_t *count;
    int64_t lo;
} hits_t;
static int hits_init(hits_t *h, const fl_tensor_t *o, int need) {
    h->count = NULL;
    h->lo = o->offset;
    if (!need) return 0;
    int64_t span = 1;
    for (int d = 0; d < o->ndim; d++) {
        if (o->strides[d] < 0) return UNSUP;
        if (o->sizes[d] == 0) span = 0;
        else if (span) span += (o->sizes[d] - 1) * o->strides[d];
    }
    h->count = calloc((size_t)(span ? span : 1), sizeof(int32_t));
    return h->count ? 0 : FL_ERR_OOM;
}
/* one value v into the element at offset `at` of o */
static inline void reduce_into(const fl_tensor_t *o, int64_t at, num_t v, int red, int include_self, hits_t *h) {
    void *p = fl_elem(o, at);
    int isint = !fl_is_floating(o->dtype);
    if (red == R_NONE) { num_store(o->dtype, p, v); return; }
    int first = 0;
    if (h->count) first = h->count[at - h->lo]++ == 0 && !include_self;
    num_store(o->dtype, p, first ? v : num_combine(red, isint, num_load(o->dtype, p), v));
}
/* mean's last step over every element that received values */
static void hits_finish_mean(const fl_tensor_t *o, const hits_t *h, int include_self) {
    int isint = !fl_is_floating(o->dtype);
    fl_walk_t w;
    fl_walk_init(&w, o->ndim, o->sizes);
    fl_walk_add(&w, o);
    if (w.numel == 0) return;
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
        int64_t c = h->count[off[0] - h->lo];
        if (c == 0) continue;
        void *p = fl_elem(o, off[0]);
        num_store(o->dtype, p, num_div(isint, num_load(o->dtype, p), c + include_self));
    }
}

/* The reduction a string code names, for scatter.reduce ("add", "multiply"),
 * scatter_reduce / index_reduce ("sum", "prod", "mean", "amax", "amin");
 * -1 when the code is unknown. */
static int reduce_of(int64_t code, int legacy) {
    if (legacy) return code == FL_STR_add ? R_SUM : code == FL_STR_multiply ? R_PROD : -1;
    switch (code) {
    case FL_STR_sum: return R_SUM;
    case FL_STR_prod: return R_PROD;
    case FL_STR_mean: return R_MEAN;
    case FL_STR_amax: return R_MAX;
    case FL_STR_amin: return R_MIN;
    }
    return -1;
}

/* scatter family: o[..., index[p], ...] (+)= src[p] (or value) for every
 * position p of index, in index's logical order. o already holds self. */
static int scatter_run(const char *name, const fl_tensor_t *o, int dim, const fl_tensor_t *idx0,
                       const fl_tensor_t *src0, num_t value, int red, int include_self) {
    fl_tensor_t oo = as1d(o), idx = as1d(idx0), src = src0 ? as1d(src0) : idx;
    if (!is_int_index(idx.dtype)) FL_FAIL(FL_ERR_INVALID, "%s(): Expected dtype int64 for index", name);
    if (fl_numel(idx0) == 0) return FL_OK;
    if (idx.ndim != oo.ndim || (src0 && src.ndim != oo.ndim))
        FL_FAIL(FL_ERR_INVALID, "%s: Index tensor must have the same number of dimensions as self tensor", name);
    if (src0 && src.dtype != o->dtype)
        FL_FAIL(FL_ERR_INVALID, "%s(): Expected self.dtype to be equal to src.dtype", name);
    for (int d = 0; d < idx.ndim; d++) {
        if ((d != dim && idx.sizes[d] > oo.sizes[d]) || (src0 && idx.sizes[d] > src.sizes[d])) {
            char a[96], b[96], c[96];
            shape_str(a, sizeof a, idx.ndim, idx.sizes);
            shape_str(b, sizeof b, oo.ndim, oo.sizes);
            shape_str(c, sizeof c, src.ndim, src.sizes);
            FL_FAIL(FL_ERR_INVALID, "%s: Expected index %s to be no larger than self %s apart from dimension %d%s%s",
                    name, a, b, dim, src0 ? " and to be no larger than src " : "", src0 ? c : "");
        }
    }
    int64_t size = oo.sizes[dim];
    /* views over index's shape: src clipped to it, out with dim's stride taken by the index */
    fl_tensor_t sv = src, ov = oo;
    for (int d = 0; d < idx.ndim; d++) {
        sv.sizes[d] = idx.sizes[d];
        ov.sizes[d] = idx.sizes[d];
        if (d == dim) ov.strides[d] = 0;
    }
    fl_walk_t w;
    fl_walk_init(&w, idx.ndim, idx.sizes);
    fl_walk_add(&w, &idx);
    fl_walk_add(&w, &ov);
    fl_walk_add(&w, &sv);
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) { /* every index first: no partial writes */
        int64_t v = fl_load_i64(&idx, off[0]);
        if (v < 0 || v >= size) OOB(v, dim, size);
    }
    hits_t h;
    int st = hits_init(&h, &oo, red == R_MEAN || (red != R_NONE && !include_self));
    if (st == UNSUP) return UNSUP;
    if (st) OOM(name);
    int64_t dstride = oo.strides[dim];
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
        int64_t v = fl_load_i64(&idx, off[0]);
        num_t s = src0 ? num_load(src.dtype, fl_elem(&src, off[2])) : value;
        reduce_into(&oo, off[1] + v * dstride, s, red, include_self, &h);
    }
    if (red == R_MEAN) hits_finish_mean(&oo, &h, include_self);
    free(h.count);
    return FL_OK;
}

/* scatter.src / .value / .reduce / .value_reduce(self, dim, index, src|value, *, reduce) and scatter_ */
static int k_scatter(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *idx = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !idx || n_args < 4 || args[1].kind != FL_ARG_INT || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    const fl_tensor_t *o = &out[0], *src = NULL;
    if (!same_sizes(o, x) || o->dtype != x->dtype) return UNSUP;
    num_t value = {0, 0};
    if (args[3].kind == FL_ARG_TENSOR) src = fl_arg_tensor(args, n_args, 3, in, n_in);
    else if (num_arg(o->dtype, &args[3], in, n_in, &value)) return UNSUP;
    if (args[3].kind == FL_ARG_TENSOR && !src) return UNSUP;
    int red = R_NONE;
    if (n_args > 4 && args[4].kind != FL_ARG_NONE) {
        red = reduce_of(fl_arg_code(args, n_args, 4), 1);
        if (red < 0) return UNSUP; /* a reduce string the runtime could not name */
    }
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "scatter: dimension out of range");
    init_from_self(o, x);
    return scatter_run("scatter", o, dim, idx, src, value, red, 1);
}
/* scatter_reduce.two(self, dim, index, src, reduce, *, include_self=True) and scatter_reduce_ */
static int k_scatter_reduce(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *idx = fl_arg_tensor(args, n_args, 2, in, n_in),
                      *src = fl_arg_tensor(args, n_args, 3, in, n_in);
    if (!x || !idx || !src || n_args < 5 || args[1].kind != FL_ARG_INT || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!same_sizes(o, x) || o->dtype != x->dtype) return UNSUP;
    int red = reduce_of(fl_arg_code(args, n_args, 4), 0);
    if (red < 0) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "scatter_reduce: dimension out of range");
    init_from_self(o, x);
    return scatter_run("scatter_reduce", o, dim, idx, src, (num_t){0, 0}, red, (int)fl_arg_int_or(args, n_args, 5, 1));
}

/* index_* along one dim with a 1-D index: for each i, the slice index[i] of o
 * along dim (+)= the slice i of source (or a value). wrap: negative indices
 * count from the end (index_fill); the others reject them, as PyTorch does. */
static int index_dim_run(const char *name, const fl_tensor_t *o0, int dim, const fl_tensor_t *idx,
                         const fl_tensor_t *src0, num_t value, num_t alpha, int red, int include_self, int wrap) {
    fl_tensor_t o = as1d(o0);
    if (!is_int_index(idx->dtype)) FL_FAIL(FL_ERR_INVALID, "%s(): Expected a long tensor for index", name);
    if (idx->ndim > 1) FL_FAIL(FL_ERR_INVALID, "%s(): Index is supposed to be a vector", name);
    int64_t n = fl_numel(idx), size = o.sizes[dim], ist = idx->ndim ? idx->strides[0] : 0;
    fl_tensor_t src = src0 ? as1d(src0) : o;
    if (src0) {
        if (src.ndim != o.ndim || src.sizes[dim] != n)
            FL_FAIL(FL_ERR_INVALID, "%s(): Number of indices (%lld) should be equal to source.size(dim) (%lld)", name,
                    (long long)n, (long long)(src.ndim == o.ndim ? src.sizes[dim] : -1));
        for (int d = 0; d < o.ndim; d++)
            if (d != dim && src.sizes[d] != o.sizes[d])
                FL_FAIL(FL_ERR_INVALID, "%s(): source and self must have the same shape outside dimension %d", name, dim);
    }
    for (int64_t j = 0; j < n; j++) {
        int64_t v = fl_load_i64(idx, idx->offset + j * ist);
        if (v < (wrap ? -size : 0) || v >= size) OOB(v, dim, size);
    }
    hits_t h;
    int st = hits_init(&h, &o, red == R_MEAN || (red != R_NONE && !include_self));
    if (st == UNSUP) return UNSUP;
    if (st) OOM(name);
    int apply_alpha = src0 && red == R_SUM &&
                      (fl_is_floating(o.dtype) ? alpha.f != 1.0 : alpha.i != 1);
    int isint = !fl_is_floating(o.dtype);
    /* slices: o and src with dim collapsed to one element */
    fl_tensor_t os = o, ss = src;
    os.sizes[dim] = 1;
    ss.sizes[dim] = 1;
    fl_walk_t w;
    fl_walk_init(&w, o.ndim, os.sizes);
    fl_walk_add(&w, &os);
    fl_walk_add(&w, &ss);
    for (int64_t j = 0; j < n; j++) {
        int64_t v = fl_load_i64(idx, idx->offset + j * ist);
        if (v < 0) v += size;
        int64_t obase = v * o.strides[dim], sbase = j * src.strides[dim];
        int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
        fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
            num_t s = value;
            if (src0) {
                s = num_load(src.dtype, fl_elem(&src, off[1] + sbase));
                if (apply_alpha) s = num_combine(R_PROD, isint, s, alpha);
            }
            reduce_into(&o, off[0] + obase, s, red, include_self, &h);
        }
    }
    if (red == R_MEAN) hits_finish_mean(&o, &h, include_self);
    free(h.count);
    return FL_OK;
}
/* common argument handling: (self, dim, index, source|value, ...) */
static int index_dim_args(const fl_arg_t *args, int n_args, const fl_tensor_t *in, int n_in, const fl_tensor_t *out,
                          int n_out, const fl_tensor_t **x, const fl_tensor_t **idx, int *dim) {
    *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    *idx = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!*x || !*idx || n_args < 4 || args[1].kind != FL_ARG_INT || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    if (!same_sizes(&out[0], *x) || out[0].dtype != (*x)->dtype) return UNSUP;
    if (fl_wrap_dim(args[1].i, (*x)->ndim, dim)) FL_FAIL(FL_ERR_INVALID, "dimension out of range");
    return FL_OK;
}
/* index_add(self, dim, index, source, *, alpha=1) / index_add_ */
static int k_index_add(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x, *idx, *src = fl_arg_tensor(args, n_args, 3, in, n_in);
    int dim, st = index_dim_args(args, n_args, in, n_in, out, n_out, &x, &idx, &dim);
    if (st) return st;
    num_t alpha = {1.0, 1};
    if (!src || src->dtype != x->dtype || (n_args > 4 && num_arg(x->dtype, &args[4], in, n_in, &alpha))) return UNSUP;
    init_from_self(&out[0], x);
    return index_dim_run("index_add", &out[0], dim, idx, src, alpha, alpha, R_SUM, 1, 0);
}
/* index_copy(self, dim, index, source) / index_copy_ */
static int k_index_copy(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x, *idx, *src = fl_arg_tensor(args, n_args, 3, in, n_in);
    int dim, st = index_dim_args(args, n_args, in, n_in, out, n_out, &x, &idx, &dim);
    if (st) return st;
    if (!src || src->dtype != x->dtype) return UNSUP;
    init_from_self(&out[0], x);
    return index_dim_run("index_copy", &out[0], dim, idx, src, (num_t){0, 0}, (num_t){1, 1}, R_NONE, 1, 0);
}
/* index_fill.int_Scalar / .int_Tensor(self, dim, index, value) and index_fill_ */
static int k_index_fill(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x, *idx;
    int dim, st = index_dim_args(args, n_args, in, n_in, out, n_out, &x, &idx, &dim);
    if (st) return st;
    num_t value;
    if (args[3].kind == FL_ARG_TENSOR && args[3].i >= 0 && args[3].i < n_in && in[args[3].i].ndim != 0)
        FL_FAIL(FL_ERR_INVALID, "index_fill_ only supports a 0-dimensional value tensor, but got tensor with %d dimension(s).",
                in[args[3].i].ndim);
    if (num_arg(x->dtype, &args[3], in, n_in, &value)) return UNSUP;
    init_from_self(&out[0], x);
    return index_dim_run("index_fill", &out[0], dim, idx, NULL, value, (num_t){1, 1}, R_NONE, 1, 1);
}
/* index_reduce(self, dim, index, source, reduce, *, include_self=True) / index_reduce_ */
static int k_index_reduce(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x, *idx, *src = fl_arg_tensor(args, n_args, 3, in, n_in);
    int dim, st = index_dim_args(args, n_args, in, n_in, out, n_out, &x, &idx, &dim);
    if (st) return st;
    int red = reduce_of(fl_arg_code(args, n_args, 4), 0);
    if (!src || src->dtype != x->dtype || red < 0 || red == R_SUM) return UNSUP;
    init_from_self(&out[0], x);
    return index_dim_run("index_reduce", &out[0], dim, idx, src, (num_t){0, 0}, (num_t){1, 1}, red,
                         (int)fl_arg_int_or(args, n_args, 5, 1), 0);
}

/* ================================================================== */
/* advanced indexing: index.Tensor, index_put, _unsafe_masked_index   */
/* ================================================================== */

/* An index list (Tensor?[] indices) resolved against self. Entries arrive as a
 * FL_ARG_TENSOR_LIST; an entry with ndim -1 stands for None (a list holding
 * None cannot be marshalled today: such calls are declined). bool/uint8 masks
 * become one coordinate tensor per dim they cover, as PyTorch expands them. */
typedef struct {
    int n;                          /* index tensors (masks expanded) */
    int sdim[FL_MAX_DIMS];          /* the self dim each one indexes */
    fl_tensor_t t[FL_MAX_DIMS];     /* int32/int64 index tensors */
    int bnd, rnd, bpos;             /* broadcast rank, result rank, where the broadcast dims sit */
    int64_t bshape[FL_MAX_DIMS], rshape[FL_MAX_DIMS];
    fl_tensor_t selfv;              /* self over the result shape (stride 0 on broadcast dims) */
    fl_tensor_t tv[FL_MAX_DIMS];    /* index tensors over the result shape */
    int64_t *owned[FL_MAX_DIMS];    /* coordinate buffers of masks */
    int nowned;
} adv_t;

static void adv_free(adv_t *a) {
    for (int k = 0; k < a->nowned; k++) free(a->owned[k]);
    a->nowned = 0;
}
/* mask m covers self dims d0..d0+m.ndim: one coordinate tensor per covered dim */
static int adv_mask(adv_t *a, const fl_tensor_t *self, const fl_tensor_t *m, int d0, int pos) {
    if (m->ndim == 0 || d0 + m->ndim > self->ndim || a->n + m->ndim > FL_MAX_DIMS) return UNSUP;
    for (int d = 0; d < m->ndim; d++)
        if (m->sizes[d] != self->sizes[d0 + d]) {
            char ms[96], ss[96];
            shape_str(ms, sizeof ms, m->ndim, m->sizes);
            shape_str(ss, sizeof ss, self->ndim, self->sizes);
            FL_FAIL(FL_ERR_INVALID, "The shape of the mask %s at index %d does not match the shape of the indexed tensor %s "
                    "at index %d", ms, pos, ss, d0 + d);
        }
    fl_walk_t w;
    fl_walk_init(&w, m->ndim, m->sizes);
    fl_walk_add(&w, m);
    int64_t nnz = 0, ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    if (w.numel) {
        fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) nnz += *(const uint8_t *)fl_elem(m, off[0]) != 0;
    }
    int64_t *coords = xmalloc(sizeof(int64_t) * (size_t)(nnz * m->ndim));
    if (!coords) return FL_ERR_OOM;
    a->owned[a->nowned++] = coords;
    if (w.numel) {
        int64_t k = 0;
        fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
            if (!*(const uint8_t *)fl_elem(m, off[0])) continue;
            for (int d = 0; d < m->ndim; d++) coords[d * nnz + k] = ctr[d];
            k++;
        }
    }
    for (int d = 0; d < m->ndim; d++) {
        fl_tensor_t c = {.data = coords, .offset = d * nnz, .dtype = FL_INT64, .ndim = 1, .sizes = {nnz}, .strides = {1}};
        a->sdim[a->n] = d0 + d;
        a->t[a->n++] = c;
    }
    return FL_OK;
}

/* Parses the index list (argument k) against self and lays out the result. */
static int adv_build(adv_t *a, const fl_tensor_t *self, const fl_arg_t *args, int n_args, int k,
                     const fl_tensor_t *in, int n_in) {
    memset(a, 0, sizeof *a);
    if (k >= n_args || args[k].kind != FL_ARG_TENSOR_LIST) return UNSUP; /* e.g. a list holding None */
    int64_t first = args[k].i, len = args[k].len;
    if (first < 0 || first + len > n_in || len < 1) return UNSUP;
    int d = 0;
    for (int64_t j = 0; j < len; j++) {
        const fl_tensor_t *t = &in[first + j];
        if (t->ndim < 0) { d++; continue; } /* None: the dim is kept whole */
        if (!fl_tensor_ok(t)) return UNSUP;
        if (is_mask(t->dtype)) {
            int st = adv_mask(a, self, t, d, (int)j);
            if (st) return st;
            d += t->ndim;
        } else if (is_int_index(t->dtype)) {
            if (d >= self->ndim) break;
            a->sdim[a->n] = d++;
            a->t[a->n++] = *t;
        } else {
            FL_FAIL(FL_ERR_INVALID, "tensors used as indices must be long, int, byte or bool tensors");
        }
    }
    if (d > self->ndim || (len > self->ndim && a->n))
        FL_FAIL(FL_ERR_INVALID, "too many indices for tensor of dimension %d (got %lld)", self->ndim, (long long)len);
    if (a->n == 0) return UNSUP;
    /* broadcast shape of the index tensors */
    for (int j = 0; j < a->n; j++) if (a->t[j].ndim > a->bnd) a->bnd = a->t[j].ndim;
    for (int q = 0; q < a->bnd; q++) a->bshape[q] = 1;
    for (int j = 0; j < a->n; j++) {
        const fl_tensor_t *t = &a->t[j];
        for (int q = a->bnd - 1, s = t->ndim - 1; s >= 0; q--, s--) {
            if (t->sizes[s] == a->bshape[q] || t->sizes[s] == 1) continue;
            if (a->bshape[q] != 1) FL_FAIL(FL_ERR_INVALID, "shape mismatch: indexing tensors could not be broadcast together");
            a->bshape[q] = t->sizes[s];
        }
    }
    int adjacent = 1;
    for (int j = 1; j < a->n; j++) if (a->sdim[j] != a->sdim[j - 1] + 1) adjacent = 0;
    a->rnd = a->bnd + self->ndim - a->n;
    if (a->rnd > FL_MAX_DIMS) return UNSUP;
    /* result dims: self's kept dims in order, with the broadcast block where the
     * indexed dims were when they are adjacent, else first (numpy's rule) */
    a->selfv = *self;
    a->selfv.ndim = a->rnd;
    char indexed[FL_MAX_DIMS] = {0};
    for (int j = 0; j < a->n; j++) indexed[a->sdim[j]] = 1;
    int r = 0;
    for (int sd = 0; sd <= self->ndim; sd++) {
        if ((!adjacent && sd == 0) || (adjacent && sd == a->sdim[0])) {
            a->bpos = r;
            for (int q = 0; q < a->bnd; q++, r++) { a->rshape[r] = a->bshape[q]; a->selfv.strides[r] = 0; }
        }
        if (sd == self->ndim) break;
        if (indexed[sd]) continue;
        a->rshape[r] = self->sizes[sd];
        a->selfv.strides[r] = self->strides[sd];
        r++;
    }
    for (int q = 0; q < a->rnd; q++) a->selfv.sizes[q] = a->rshape[q];
    for (int j = 0; j < a->n; j++) {
        fl_tensor_t *v = &a->tv[j];
        *v = a->t[j];
        v->ndim = a->rnd;
        for (int q = 0; q < a->rnd; q++) { v->sizes[q] = a->rshape[q]; v->strides[q] = 0; }
        for (int q = a->bnd - 1, s = a->t[j].ndim - 1; s >= 0; q--, s--)
            v->strides[a->bpos + q] = a->t[j].sizes[s] == 1 ? 0 : a->t[j].strides[s];
    }
    return FL_OK;
}
/* every index within [-size, size) of the dim it indexes */
static int adv_check(const adv_t *a, const fl_tensor_t *self) {
    for (int j = 0; j < a->n; j++) {
        const fl_tensor_t *t = &a->t[j];
        int64_t size = self->sizes[a->sdim[j]];
        fl_walk_t w;
        fl_walk_init(&w, t->ndim, t->sizes);
        fl_walk_add(&w, t);
        if (!w.numel) continue;
        int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
        fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
            int64_t v = fl_load_i64(t, off[0]);
            if (v < -size || v >= size) OOB(v, a->sdim[j], size);
        }
    }
    return FL_OK;
}
/* clamp modes of the _unsafe_masked ops */
enum { IDX_CHECKED, IDX_CLAMPNEG };
/* self's element offset for the walk position off[] (off[1] is selfv's, off[2+j] index j's) */
static inline int64_t adv_self_off(const adv_t *a, const fl_tensor_t *self, const int64_t *off, int mode) {
    int64_t o = off[1];
    for (int j = 0; j < a->n; j++) {
        int64_t size = self->sizes[a->sdim[j]], v = fl_load_i64(&a->t[j], off[2 + j]);
        if (mode == IDX_CLAMPNEG) v = v < -size ? -size : v > size - 1 ? size - 1 : v;
        if (v < 0) v += size;
        o += v * self->strides[a->sdim[j]];
    }
    return o;
}
/* a walk over the result shape: slot 0 = res, 1 = self, 2.. = indices, last = mask (optional) */
static void adv_walk(const adv_t *a, const fl_tensor_t *res, const fl_tensor_t *mask, fl_walk_t *w) {
    fl_walk_init(w, a->rnd, a->rshape);
    fl_walk_add(w, res);
    fl_walk_add(w, &a->selfv);
    for (int j = 0; j < a->n; j++) fl_walk_add(w, &a->tv[j]);
    if (mask) fl_walk_add(w, mask);
}

/* gather: out = self[indices], optionally masked (where the mask is false: fill) */
static int adv_gather(const char *name, const fl_tensor_t *x, const fl_arg_t *args, int n_args, int k,
                      const fl_tensor_t *in, int n_in, const fl_tensor_t *o, const fl_tensor_t *mask, num_t fill,
                      int mode) {
    adv_t a;
    int st = adv_build(&a, x, args, n_args, k, in, n_in);
    if (st) { adv_free(&a); return st; }
    fl_tensor_t mv;
    if (o->ndim != a.rnd || o->dtype != x->dtype || (mask && fl_bcast(mask, a.rnd, a.rshape, &mv))) {
        adv_free(&a);
        return UNSUP;
    }
    for (int q = 0; q < a.rnd; q++)
        if (o->sizes[q] != a.rshape[q]) { adv_free(&a); return UNSUP; }
    int empty_self = fl_numel(x) == 0;
    if (mode == IDX_CHECKED && fl_numel(o) && (st = adv_check(&a, x))) { adv_free(&a); return st; }
    fl_walk_t w;
    adv_walk(&a, o, mask ? &mv : NULL, &w);
    int mslot = 2 + a.n;
    size_t es = fl_itemsize(o->dtype);
    int nth = w.numel >= PAR_MIN ? omp_get_max_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int c = 0; c < nth; c++) {
        int64_t lo = w.numel * c / nth, hi = w.numel * (c + 1) / nth;
        if (lo >= hi) continue;
        int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
        fl_walk_seek(&w, lo, ctr, off);
        for (int64_t q = lo; q < hi; q++, fl_walk_next(&w, ctr, off)) {
            if (mask && (empty_self || !*(const uint8_t *)fl_elem(&mv, off[mslot]))) {
                num_store(o->dtype, fl_elem(o, off[0]), fill);
                continue;
            }
            memcpy(fl_elem(o, off[0]), fl_elem(x, adv_self_off(&a, x, off, mode)), es);
        }
    }
    (void)name;
    adv_free(&a);
    return FL_OK;
}
/* scatter: o (holding self) [indices] = values (or += with accumulate), where the mask allows */
static int adv_put(const char *name, const fl_tensor_t *x, const fl_arg_t *args, int n_args, int k,
                   const fl_tensor_t *in, int n_in, const fl_tensor_t *o, const fl_tensor_t *vals,
                   const fl_tensor_t *mask, int accumulate, int mode) {
    /* the index list is laid out against o (self's shape, o's strides): offsets land in o */
    adv_t a;
    a.nowned = 0;
    int st = same_sizes(o, x) ? adv_build(&a, o, args, n_args, k, in, n_in) : UNSUP;
    if (st) { adv_free(&a); return st; }
    fl_tensor_t vv, mv;
    if (fl_bcast(vals, a.rnd, a.rshape, &vv)) { /* ATen checks the shapes before the dtypes */
        char vs[96], rs[96];
        shape_str(vs, sizeof vs, vals->ndim, vals->sizes);
        shape_str(rs, sizeof rs, a.rnd, a.rshape);
        adv_free(&a);
        FL_FAIL(FL_ERR_INVALID, "shape mismatch: value tensor of shape %s cannot be broadcast to indexing result of shape %s",
                vs, rs);
    }
    if (vals->dtype != x->dtype) {
        adv_free(&a);
        FL_FAIL(FL_ERR_INVALID, "%s: Index put requires the source and destination dtypes match", name);
    }
    if (mask && fl_bcast(mask, a.rnd, a.rshape, &mv)) { adv_free(&a); return UNSUP; }
    fl_walk_t w;
    adv_walk(&a, &vv, mask ? &mv : NULL, &w);
    if (w.numel && mode == IDX_CHECKED && (st = adv_check(&a, x))) { adv_free(&a); return st; }
    init_from_self(o, x);
    if (w.numel == 0 || fl_numel(x) == 0) { adv_free(&a); return FL_OK; }
    int isint = !fl_is_floating(o->dtype);
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    int mslot = 2 + a.n;
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) { /* in order: accumulation is deterministic */
        if (mask && !*(const uint8_t *)fl_elem(&mv, off[mslot])) continue;
        int64_t oo = adv_self_off(&a, o, off, mode);
        void *p = fl_elem(o, oo);
        num_t v = num_load(vv.dtype, fl_elem(&vv, off[0]));
        num_store(o->dtype, p, accumulate ? num_combine(R_SUM, isint, num_load(o->dtype, p), v) : v);
    }
    adv_free(&a);
    return FL_OK;
}

/* index.Tensor(self, Tensor?[] indices) and _unsafe_index.Tensor */
static int k_index(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    return adv_gather("index", x, args, n_args, 1, in, n_in, &out[0], NULL, (num_t){0, 0}, IDX_CHECKED);
}
/* index_put(self, indices, values, accumulate=False), index_put_, _index_put_impl_(.., unsafe), _unsafe_index_put */
static int k_index_put(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *v = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !v || n_out < 1 || !fl_tensor_ok(&out[0]) || out[0].dtype != x->dtype) return UNSUP;
    return adv_put("index_put", x, args, n_args, 1, in, n_in, &out[0], v, NULL, (int)fl_arg_int_or(args, n_args, 3, 0),
                   IDX_CHECKED);
}
/* _unsafe_masked_index(self, mask, indices, fill): self[indices] where mask, else fill; indices are
 * clamped to [-size, size) and then wrap, as PyTorch's CPU kernel reads them */
static int k_unsafe_masked_index(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *m = fl_arg_tensor(args, n_args, 1, in, n_in);
    num_t fill;
    if (!x || !m || n_args < 4 || n_out < 1 || !fl_tensor_ok(&out[0]) || m->dtype != FL_BOOL) return UNSUP;
    if (num_arg(x->dtype, &args[3], in, n_in, &fill)) return UNSUP;
    return adv_gather("_unsafe_masked_index", x, args, n_args, 2, in, n_in, &out[0], m, fill, IDX_CLAMPNEG);
}
/* _unsafe_masked_index_put_accumulate(self, mask, indices, values): indices clamped to [-size, size) */
static int k_unsafe_masked_index_put_acc(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *m = fl_arg_tensor(args, n_args, 1, in, n_in),
                      *v = fl_arg_tensor(args, n_args, 3, in, n_in);
    if (!x || !m || !v || n_out < 1 || !fl_tensor_ok(&out[0]) || m->dtype != FL_BOOL || out[0].dtype != x->dtype) return UNSUP;
    return adv_put("_unsafe_masked_index_put_accumulate", x, args, n_args, 2, in, n_in, &out[0], v, m, 1, IDX_CLAMPNEG);
}

/* ================================================================== */
/* flat and masked: take, put, masked_scatter, nonzero_static         */
/* ================================================================== */

static int flat_check(const fl_tensor_t *idx, int64_t n) {
    fl_walk_t w;
    fl_walk_init(&w, idx->ndim, idx->sizes);
    fl_walk_add(&w, idx);
    if (!w.numel) return FL_OK;
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
        int64_t v = fl_load_i64(idx, off[0]);
        if (v < -n || v >= n)
            FL_FAIL(FL_ERR_INVALID, "out of range: tried to access index %lld on a tensor of %lld elements.", (long long)v,
                    (long long)n);
    }
    return FL_OK;
}
/* take(self, index): out[i] = self.flatten()[index[i]] */
static int k_take(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *idx = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!x || !idx || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!is_int_index(idx->dtype) || !same_sizes(o, idx) || o->dtype != x->dtype) return UNSUP;
    int64_t n = fl_numel(x);
    int st = flat_check(idx, n);
    if (st) return st;
    fl_walk_t w;
    fl_walk_init(&w, o->ndim, o->sizes);
    fl_walk_add(&w, o);
    fl_walk_add(&w, idx);
    if (!w.numel) return FL_OK;
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
        int64_t v = fl_load_i64(idx, off[1]);
        copy_elem(o, off[0], x, lin_off(x, v < 0 ? v + n : v));
    }
    return FL_OK;
}
/* put(self, index, source, accumulate=False) / put_: self.flatten()[index[i]] (+)= source.flatten()[i] */
static int k_put(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *idx = fl_arg_tensor(args, n_args, 1, in, n_in),
                      *src = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !idx || !src || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!is_int_index(idx->dtype) || !same_sizes(o, x) || o->dtype != x->dtype || src->dtype != x->dtype) return UNSUP;
    if (fl_numel(idx) != fl_numel(src))
        FL_FAIL(FL_ERR_INVALID, "put_(): Expected source and index to have the same number of elements, but got source "
                "with %lld elements and index with %lld elements", (long long)fl_numel(src), (long long)fl_numel(idx));
    int64_t n = fl_numel(x);
    int st = flat_check(idx, n);
    if (st) return st;
    init_from_self(o, x);
    int acc = (int)fl_arg_int_or(args, n_args, 3, 0), isint = !fl_is_floating(o->dtype);
    fl_walk_t w;
    fl_walk_init(&w, idx->ndim, idx->sizes);
    fl_walk_add(&w, idx);
    if (!w.numel) return FL_OK;
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
        int64_t v = fl_load_i64(idx, off[0]);
        int64_t at = lin_off(o, v < 0 ? v + n : v), so = lin_off(src, q);
        if (!acc) { copy_elem(o, at, src, so); continue; }
        void *p = fl_elem(o, at);
        num_store(o->dtype, p, num_combine(R_SUM, isint, num_load(o->dtype, p), num_load(src->dtype, fl_elem(src, so))));
    }
    return FL_OK;
}
/* masked_scatter(self, mask, source) / masked_scatter_: where mask (broadcast to
 * the output), the next element of source in its logical order */
static int k_masked_scatter(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *m = fl_arg_tensor(args, n_args, 1, in, n_in),
                      *src = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !m || !src || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!is_mask(m->dtype) || o->dtype != x->dtype || src->dtype != x->dtype) return UNSUP;
    fl_tensor_t xv, mv;
    if (fl_bcast(x, o->ndim, o->sizes, &xv) || fl_bcast(m, o->ndim, o->sizes, &mv)) return UNSUP;
    fl_walk_t w;
    fl_walk_init(&w, o->ndim, o->sizes);
    fl_walk_add(&w, &mv);
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX], need = 0, have = fl_numel(src);
    if (w.numel) {
        fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) need += *(const uint8_t *)fl_elem(&mv, off[0]) != 0;
    }
    if (need > have) FL_FAIL(FL_ERR_INVALID, "masked_scatter: expected source to have at least %lld elements, got %lld",
                             (long long)need, (long long)have);
    init_from_self(o, &xv);
    fl_walk_add(&w, o);
    if (!w.numel) return FL_OK;
    int64_t k = 0;
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off))
        if (*(const uint8_t *)fl_elem(&mv, off[0])) copy_elem(o, off[1], src, lin_off(src, k++));
    return FL_OK;
}
/* masked_scatter_backward(grad_output, mask, sizes): grad at the mask's true
 * positions (in order), then zeros, shaped `sizes` */
static int k_masked_scatter_backward(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *m = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!g || !m || n_out < 1 || !fl_tensor_ok(&out[0]) || !is_mask(m->dtype) || out[0].dtype != g->dtype) return UNSUP;
    const fl_tensor_t *o = &out[0];
    int nd = g->ndim > m->ndim ? g->ndim : m->ndim;
    int64_t shape[FL_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) {
        int dg = d - (nd - g->ndim), dm = d - (nd - m->ndim);
        int64_t sg = dg >= 0 ? g->sizes[dg] : 1, sm = dm >= 0 ? m->sizes[dm] : 1;
        shape[d] = sg == 1 ? sm : sg;
    }
    fl_tensor_t gv, mv;
    if (fl_bcast(g, nd, shape, &gv) || fl_bcast(m, nd, shape, &mv)) return UNSUP;
    fl_walk_t w;
    fl_walk_init(&w, nd, shape);
    fl_walk_add(&w, &gv);
    fl_walk_add(&w, &mv);
    int64_t n = fl_numel(o), k = 0, ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    if (w.numel) {
        fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
            if (!*(const uint8_t *)fl_elem(&mv, off[1])) continue;
            if (k >= n) FL_FAIL(FL_ERR_INVALID, "masked_scatter_backward: the mask selects more than %lld elements", (long long)n);
            copy_elem(o, lin_off(o, k++), &gv, off[0]);
        }
    }
    for (; k < n; k++) num_store(o->dtype, fl_elem(o, lin_off(o, k)), (num_t){0, 0});
    return FL_OK;
}
/* nonzero_static(self, *, size, fill_value=-1): the first `size` coordinates of nonzeros, then fill rows */
static int k_nonzero_static(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 2) return UNSUP;
    const fl_tensor_t *o = &out[0];
    int64_t size = args[1].i, fill = fl_arg_int_or(args, n_args, 2, -1);
    if (o->ndim != 2 || o->sizes[0] != size || o->sizes[1] != x->ndim || o->dtype != FL_INT64) return UNSUP;
    fl_walk_t w;
    fl_walk_init(&w, x->ndim, x->sizes);
    fl_walk_add(&w, x);
    int64_t k = 0, ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    int isint = !fl_is_floating(x->dtype);
    if (w.numel) {
        fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < w.numel && k < size; q++, fl_walk_next(&w, ctr, off)) {
            num_t v = num_load(x->dtype, fl_elem(x, off[0]));
            if (isint ? v.i == 0 : v.f == 0.0) continue;
            for (int d = 0; d < x->ndim; d++) store_i64(o, o->offset + k * o->strides[0] + d * o->strides[1], ctr[d]);
            k++;
        }
    }
    for (; k < size; k++)
        for (int d = 0; d < x->ndim; d++) store_i64(o, o->offset + k * o->strides[0] + d * o->strides[1], fill);
    return FL_OK;
}

/* ================================================================== */
/* search: searchsorted, bucketize, isin, histc                       */
/* ================================================================== */

/* Values compare as int64 when both sides are integers, else as double. */
static inline int num_lt(int isint, num_t a, num_t b) { return isint ? a.i < b.i : a.f < b.f; }
static inline int num_ge(int isint, num_t a, num_t b) { return isint ? a.i >= b.i : a.f >= b.f; }
static inline int num_gt(int isint, num_t a, num_t b) { return isint ? a.i > b.i : a.f > b.f; }
static inline num_t num_as(int isint, int dtype, const void *p) { /* load, widened to the compare type */
    num_t v = num_load(dtype, p);
    if (!isint && !fl_is_floating(dtype)) v.f = (double)v.i;
    return v;
}

/* The bucket of each element of vals in the sorted rows of seq (PyTorch's
 * cus_lower_bound / cus_upper_bound, so NaN lands past the end). vals == NULL:
 * the one scalar `sv` (out is 0-dim). */
static int search_run(const char *name, const fl_tensor_t *seq, const fl_tensor_t *vals, num_t sv, int sv_float,
                      const fl_tensor_t *o, int right, const fl_tensor_t *sorter) {
    if (o->dtype != FL_INT64 && o->dtype != FL_INT32) return UNSUP;
    if (seq->ndim == 0) FL_FAIL(FL_ERR_INVALID, "%s(): boundaries tensor should have positive dimension", name);
    fl_tensor_t v0 = vals ? *vals : *o;
    if (!same_sizes(o, &v0)) return UNSUP;
    if (seq->ndim > 1) {
        int ok = vals && vals->ndim == seq->ndim;
        for (int d = 0; ok && d < seq->ndim - 1; d++) ok = seq->sizes[d] == vals->sizes[d];
        if (!ok) {
            char a[96], b[96];
            shape_str(a, sizeof a, seq->ndim, seq->sizes);
            shape_str(b, sizeof b, v0.ndim, v0.sizes);
            FL_FAIL(FL_ERR_INVALID, "%s(): boundaries tensor should be 1 dimension or the first N-1 dimensions of "
                    "boundaries tensor and input value tensor must match, but we got boundaries tensor %s and input "
                    "value tensor %s", name, a, b);
        }
    }
    int64_t n = seq->sizes[seq->ndim - 1], sst = seq->strides[seq->ndim - 1];
    if (sorter) {
        if (!same_sizes(sorter, seq) || sorter->dtype != FL_INT64)
            FL_FAIL(FL_ERR_INVALID, "%s(): sorter must be a long tensor of the boundaries' shape", name);
        fl_walk_t w;
        fl_walk_init(&w, sorter->ndim, sorter->sizes);
        fl_walk_add(&w, sorter);
        int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
        if (w.numel) fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
            int64_t v = fl_load_i64(sorter, off[0]);
            if (v < 0 || v >= n) FL_FAIL(FL_ERR_INVALID, "%s(): sorter index out of range", name);
        }
    }
    int isint = !fl_is_floating(seq->dtype) && (vals ? !fl_is_floating(vals->dtype) : !sv_float);
    if (!isint && !vals && !sv_float) sv.f = (double)sv.i;
    fl_walk_t w;
    fl_walk_init(&w, o->ndim, o->sizes);
    fl_walk_add(&w, o);
    if (vals) fl_walk_add(&w, vals);
    if (!w.numel) return FL_OK;
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
        num_t x = vals ? num_as(isint, vals->dtype, fl_elem(vals, off[1])) : sv;
        int64_t row = seq->offset, srow = sorter ? sorter->offset : 0;
        for (int d = 0; d < seq->ndim - 1; d++) {
            row += ctr[d] * seq->strides[d];
            if (sorter) srow += ctr[d] * sorter->strides[d];
        }
        int64_t lo = 0, hi = n;
        while (lo < hi) {
            int64_t mid = lo + ((hi - lo) >> 1);
            int64_t at = sorter ? fl_load_i64(sorter, srow + mid * sorter->strides[seq->ndim - 1]) : mid;
            num_t b = num_as(isint, seq->dtype, fl_elem(seq, row + at * sst));
            if (right ? !num_gt(isint, b, x) : !num_ge(isint, b, x)) lo = mid + 1;
            else hi = mid;
        }
        store_i64(o, off[0], lo);
    }
    return FL_OK;
}
/* right=, side= (side wins; an unknown side string is fine only when right already says "right") */
static int side_right(const fl_arg_t *args, int n_args, int kright, int kside, int *right) {
    *right = (int)fl_arg_int_or(args, n_args, kright, 0);
    int64_t side = fl_arg_code(args, n_args, kside);
    if (side == FL_STR_right) *right = 1;
    else if (side == FL_STR_left) {
        if (*right) FL_FAIL(FL_ERR_INVALID, "torch.searchsorted(): side and right can't be set to opposites, got side of "
                            "left while right was True");
    } else if (side == -1 && !*right) {
        return UNSUP;
    }
    return FL_OK;
}
/* searchsorted.Tensor / .Scalar(sorted_sequence, self, *, out_int32, right, side?, sorter?) */
static int k_searchsorted(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *seq = fl_arg_tensor(args, n_args, 0, in, n_in), *vals = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!seq || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 6) return UNSUP;
    num_t sv = {0, 0};
    int sv_float = 0;
    if (!vals) {
        if (!fl_arg_is_num(&args[1])) return UNSUP;
        sv_float = args[1].kind == FL_ARG_FLOAT;
        if (sv_float) sv.f = args[1].f; else sv.i = args[1].i;
    }
    const fl_tensor_t *sorter = NULL;
    if (args[5].kind == FL_ARG_TENSOR && !(sorter = fl_arg_tensor(args, n_args, 5, in, n_in))) return UNSUP;
    int right, st = side_right(args, n_args, 3, 4, &right);
    if (st) return st;
    return search_run("torch.searchsorted", seq, vals, sv, sv_float, &out[0], right, sorter);
}
/* bucketize.Tensor(self, boundaries, *, out_int32, right) / bucketize.Scalar(Scalar self, boundaries, ...) */
static int k_bucketize(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *vals = fl_arg_tensor(args, n_args, 0, in, n_in), *bd = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!bd || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 4) return UNSUP;
    if (bd->ndim != 1) FL_FAIL(FL_ERR_INVALID, "bucketize(): boundaries tensor must be 1 dimension, but got dim(%d)", bd->ndim);
    num_t sv = {0, 0};
    int sv_float = 0;
    if (!vals) {
        if (!fl_arg_is_num(&args[0])) return UNSUP;
        sv_float = args[0].kind == FL_ARG_FLOAT;
        if (sv_float) sv.f = args[0].f; else sv.i = args[0].i;
    }
    return search_run("bucketize", bd, vals, sv, sv_float, &out[0], (int)fl_arg_int_or(args, n_args, 3, 0), NULL);
}

/* isin: each element against the sorted test values (binary search; NaN never matches) */
static int cmp_f64(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static int isin_run(const fl_tensor_t *el, num_t esv, int es_float, const fl_tensor_t *te, num_t tsv, int ts_float,
                    const fl_tensor_t *o, int invert) {
    if (o->dtype != FL_BOOL) return UNSUP;
    int isint = (el ? !fl_is_floating(el->dtype) : !es_float) && (te ? !fl_is_floating(te->dtype) : !ts_float);
    int64_t nt = te ? fl_numel(te) : 1;
    void *tv = xmalloc(8 * (size_t)nt);
    if (!tv) OOM("isin");
    if (te) {
        fl_tensor_t flat = *te;
        flat.data = tv; flat.offset = 0; flat.dtype = isint ? FL_INT64 : FL_FLOAT64;
        for (int64_t d = te->ndim - 1, s = 1; d >= 0; d--) { flat.strides[d] = s; s *= te->sizes[d]; }
        fl_copy_strided(&flat, te);
    } else if (isint) {
        *(int64_t *)tv = tsv.i;
    } else {
        *(double *)tv = ts_float ? tsv.f : (double)tsv.i;
    }
    if (isint) {
        qsort(tv, (size_t)nt, 8, fl_cmp_i64);
    } else { /* NaN never equals anything: drop them, then sort */
        double *d = tv;
        int64_t k = 0;
        for (int64_t j = 0; j < nt; j++) if (d[j] == d[j]) d[k++] = d[j];
        nt = k;
        qsort(tv, (size_t)nt, 8, cmp_f64);
    }
    fl_tensor_t ev = el ? *el : *o;
    if (el && !same_sizes(o, el)) { free(tv); return UNSUP; }
    fl_walk_t w;
    fl_walk_init(&w, o->ndim, o->sizes);
    fl_walk_add(&w, o);
    if (el) fl_walk_add(&w, &ev);
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    if (w.numel) fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) {
        num_t x = el ? num_as(isint, el->dtype, fl_elem(el, off[1])) : esv;
        if (!el && !isint && !es_float) x.f = (double)x.i;
        int64_t lo = 0, hi = nt;
        while (lo < hi) {
            int64_t mid = lo + ((hi - lo) >> 1);
            if (isint ? ((int64_t *)tv)[mid] < x.i : ((double *)tv)[mid] < x.f) lo = mid + 1;
            else hi = mid;
        }
        int found = lo < nt && (isint ? ((int64_t *)tv)[lo] == x.i : ((double *)tv)[lo] == x.f);
        *(uint8_t *)fl_elem(o, off[0]) = (uint8_t)(found != invert);
    }
    free(tv);
    return FL_OK;
}
static int scalar_of(const fl_arg_t *a, num_t *v, int *isf) {
    if (!fl_arg_is_num(a)) return -1;
    *isf = a->kind == FL_ARG_FLOAT;
    v->f = a->f;
    v->i = a->i;
    return 0;
}
/* isin.Tensor_Tensor / Tensor_Scalar / Scalar_Tensor(elements, test_elements, *, assume_unique, invert) */
static int k_isin(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 4) return UNSUP;
    const fl_tensor_t *el = fl_arg_tensor(args, n_args, 0, in, n_in), *te = fl_arg_tensor(args, n_args, 1, in, n_in);
    num_t es = {0, 0}, ts = {0, 0};
    int ef = 0, tf = 0;
    if (!el && scalar_of(&args[0], &es, &ef)) return UNSUP;
    if (!te && scalar_of(&args[1], &ts, &tf)) return UNSUP;
    if (!el && !te) return UNSUP;
    return isin_run(el, es, ef, te, ts, tf, &out[0], (int)fl_arg_int_or(args, n_args, 3, 0));
}

/* histc(self, bins=100, min=0, max=0): PyTorch's linear binning, with the
 * arithmetic rounded to self's dtype at each step as its CPU kernel computes */
static inline double rnd_to(int dtype, double v) {
    char tmp[8];
    fl_store_f64(dtype, tmp, v);
    return fl_load_f64(dtype, tmp);
}
static int k_histc(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 4 || !fl_arg_is_num(&args[2]) || !fl_arg_is_num(&args[3])) return UNSUP;
    const fl_tensor_t *o = &out[0];
    int64_t bins = fl_arg_int_or(args, n_args, 1, 100);
    if (bins <= 0) FL_FAIL(FL_ERR_INVALID, "torch.histc: bins must be > 0, but got %lld for dimension 0", (long long)bins);
    if (!fl_is_floating(x->dtype) || o->dtype != x->dtype || o->ndim != 1 || o->sizes[0] != bins) return UNSUP;
    double lo = fl_arg_num(&args[2]), hi = fl_arg_num(&args[3]);
    int64_t n = fl_numel(x);
    fl_walk_t w;
    fl_walk_init(&w, x->ndim, x->sizes);
    fl_walk_add(&w, x);
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    if (lo == hi && n) { /* the data's own range */
        double mn = INFINITY, mx = -INFINITY;
        fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < n; q++, fl_walk_next(&w, ctr, off)) {
            double v = fl_load_f64(x->dtype, fl_elem(x, off[0]));
            if (isnan(v)) { mn = mx = NAN; break; }
            if (v < mn) mn = v;
            if (v > mx) mx = v;
        }
        lo = mn;
        hi = mx;
    }
    if (lo == hi) { lo -= 1; hi += 1; }
    if (isinf(lo) || isinf(hi) || isnan(lo) || isnan(hi))
        FL_FAIL(FL_ERR_INVALID, "torch.histc: range of [%g, %g] is not finite", lo, hi);
    if (!(lo < hi)) FL_FAIL(FL_ERR_INVALID, "torch.histc: max must be larger than min");
    int dt = x->dtype;
    lo = rnd_to(dt, lo);
    hi = rnd_to(dt, hi);
    double width = rnd_to(dt, hi - lo);
    int64_t *cnt = calloc((size_t)bins, sizeof(int64_t));
    if (!cnt) OOM("histc");
    if (n) {
        fl_walk_seek(&w, 0, ctr, off);
        for (int64_t q = 0; q < n; q++, fl_walk_next(&w, ctr, off)) {
            double v = fl_load_f64(dt, fl_elem(x, off[0]));
            if (!(v >= lo && v <= hi)) continue;
            double p = rnd_to(dt, rnd_to(dt, rnd_to(dt, v - lo) * (double)bins) / width);
            int64_t b = (int64_t)p;
            if (b >= bins) b = bins - 1;
            if (b < 0) b = 0;
            cnt[b]++;
        }
    }
    for (int64_t b = 0; b < bins; b++) fl_store_f64(o->dtype, fl_elem(o, o->offset + b * o->strides[0]), (double)cnt[b]);
    free(cnt);
    return FL_OK;
}

/* ================================================================== */
/* layout: roll, slice_scatter, as_strided_scatter, repeat_interleave */
/* ================================================================== */

static inline int64_t pmod(int64_t a, int64_t n) { int64_t r = a % n; return r < 0 ? r + n : r; }

/* roll(self, shifts, dims=[]): with no dims, the flattened tensor rolls */
static int k_roll(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 3 || args[1].kind != FL_ARG_INT_LIST ||
        args[2].kind != FL_ARG_INT_LIST)
        return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!same_sizes(o, x) || o->dtype != x->dtype) return UNSUP;
    int ns = args[1].len, nd = args[2].len;
    if (ns == 0) FL_FAIL(FL_ERR_INVALID, "`shifts` required");
    if (nd == 0 && ns != 1) FL_FAIL(FL_ERR_INVALID, "shifts and dimensions must align. shifts: %d, dims:%d", ns, nd);
    if (nd && ns != nd) FL_FAIL(FL_ERR_INVALID, "shifts and dimensions must align. shifts: %d, dims:%d", ns, nd);
    int64_t n = fl_numel(x);
    if (n == 0) return FL_OK;
    fl_walk_t w;
    fl_walk_init(&w, o->ndim, o->sizes);
    fl_walk_add(&w, o);
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    fl_walk_seek(&w, 0, ctr, off);
    if (nd == 0) {
        int64_t s = pmod(args[1].list[0], n);
        for (int64_t q = 0; q < n; q++, fl_walk_next(&w, ctr, off)) copy_elem(o, off[0], x, lin_off(x, pmod(q - s, n)));
        return FL_OK;
    }
    int64_t shift[FL_MAX_DIMS] = {0};
    for (int k = 0; k < nd; k++) {
        int d;
        if (fl_wrap_dim(args[2].list[k], x->ndim, &d) || x->ndim == 0)
            FL_FAIL(FL_ERR_INVALID, "roll: dimension %lld out of range", (long long)args[2].list[k]);
        shift[d] += args[1].list[k];
    }
    for (int64_t q = 0; q < n; q++, fl_walk_next(&w, ctr, off)) {
        int64_t so = x->offset;
        for (int d = 0; d < x->ndim; d++) so += pmod(ctr[d] - shift[d], x->sizes[d]) * x->strides[d];
        copy_elem(o, off[0], x, so);
    }
    return FL_OK;
}

/* slice_scatter(self, src, dim=0, start?, end?, step=1): self with self[start:end:step] (along dim) = src */
static int k_slice_scatter(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *src = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!x || !src || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 6 || x->ndim == 0) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!same_sizes(o, x) || o->dtype != x->dtype) return UNSUP;
    int dim;
    if (fl_wrap_dim(fl_arg_int_or(args, n_args, 2, 0), x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "slice_scatter: dimension out of range");
    int64_t size = x->sizes[dim], step = fl_arg_int_or(args, n_args, 5, 1);
    int64_t start = fl_arg_int_or(args, n_args, 3, 0), end = fl_arg_int_or(args, n_args, 4, size);
    if (step <= 0) FL_FAIL(FL_ERR_INVALID, "slice step must be positive");
    if (start < 0) start += size;
    if (end < 0) end += size;
    start = start < 0 ? 0 : start > size ? size : start;
    end = end < start ? start : end > size ? size : end;
    fl_tensor_t view = *o;
    view.offset += start * o->strides[dim];
    view.sizes[dim] = (end - start + step - 1) / step;
    view.strides[dim] *= step;
    if (!same_sizes(&view, src)) {
        char a[96], b[96];
        shape_str(a, sizeof a, src->ndim, src->sizes);
        shape_str(b, sizeof b, view.ndim, view.sizes);
        FL_FAIL(FL_ERR_INVALID, "slice_scatter: expected src to have a size equal to the slice of self. src size = %s, "
                "slice size = %s", a, b);
    }
    init_from_self(o, x);
    fl_copy_strided(&view, src);
    return FL_OK;
}

/* as_strided_scatter(self, src, size, stride, storage_offset?): the output is
 * self's clone (PyTorch's layout, from the meta function), and the as_strided
 * view of its storage takes src */
static int k_as_strided_scatter(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *src = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!x || !src || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 5 || args[2].kind != FL_ARG_INT_LIST ||
        args[3].kind != FL_ARG_INT_LIST || args[2].len != args[3].len)
        return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!same_sizes(o, x) || o->dtype != x->dtype) return UNSUP;
    /* the storage o owns: its span (o is a fresh dense tensor) */
    int64_t storage = fl_numel(o) ? o->offset + 1 : o->offset;
    for (int d = 0; d < o->ndim; d++) {
        if (o->strides[d] < 0) return UNSUP;
        if (fl_numel(o)) storage += (o->sizes[d] - 1) * o->strides[d];
    }
    fl_tensor_t view = {.data = o->data, .dtype = o->dtype, .ndim = args[2].len};
    view.offset = args[4].kind == FL_ARG_INT ? args[4].i : o->offset;
    int64_t need = view.offset + 1, numel = 1;
    for (int d = 0; d < view.ndim; d++) {
        view.sizes[d] = args[2].list[d];
        view.strides[d] = args[3].list[d];
        if (view.sizes[d] < 0 || view.strides[d] < 0) FL_FAIL(FL_ERR_INVALID, "as_strided_scatter: negative size or stride");
        numel *= view.sizes[d];
        need += (view.sizes[d] - 1) * view.strides[d];
    }
    if (numel && need > storage)
        FL_FAIL(FL_ERR_INVALID, "as_strided_scatter: the view (storage offset %lld) needs a storage of %lld elements, "
                "out of bounds for storage of size %lld", (long long)view.offset, (long long)need, (long long)storage);
    if (!same_sizes(&view, src)) {
        char a[96], b[96];
        shape_str(a, sizeof a, src->ndim, src->sizes);
        shape_str(b, sizeof b, view.ndim, view.sizes);
        FL_FAIL(FL_ERR_INVALID, "expected src to have a size equal to the slice of self. src size = %s, slice size = %s", a, b);
    }
    init_from_self(o, x);
    if (!numel) return FL_OK;
    /* in logical order, one element at a time: overlapping views end with the last write, as copy_ does on CPU */
    fl_walk_t w;
    fl_walk_init(&w, view.ndim, view.sizes);
    fl_walk_add(&w, &view);
    fl_walk_add(&w, src);
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
    fl_walk_seek(&w, 0, ctr, off);
    for (int64_t q = 0; q < numel; q++, fl_walk_next(&w, ctr, off)) copy_elem(&view, off[0], src, off[1]);
    return FL_OK;
}

/* repeat_interleave.Tensor(repeats, *, output_size?): [0]*repeats[0] ++ [1]*repeats[1] ...
 * Only with output_size given: the output's size otherwise depends on the data. */
static int k_repeat_interleave(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *r = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!r || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!is_int_index(r->dtype) || o->ndim != 1 || o->dtype != r->dtype) return UNSUP;
    if (r->ndim > 1) FL_FAIL(FL_ERR_INVALID, "repeat_interleave only accept 1D vector as repeat");
    int64_t n = fl_numel(r), st = r->ndim ? r->strides[0] : 0, total = 0;
    for (int64_t j = 0; j < n; j++) {
        int64_t v = fl_load_i64(r, r->offset + j * st);
        if (v < 0) FL_FAIL(FL_ERR_INVALID, "repeats can not be negative");
        total += v;
    }
    if (total != o->sizes[0])
        FL_FAIL(FL_ERR_INVALID, "repeat_interleave: output_size %lld does not match the sum of repeats %lld",
                (long long)o->sizes[0], (long long)total);
    int64_t k = 0;
    for (int64_t j = 0; j < n; j++)
        for (int64_t c = fl_load_i64(r, r->offset + j * st); c > 0; c--) store_i64(o, o->offset + (k++) * o->strides[0], j);
    return FL_OK;
}

/* ================================================================== */
/* segments: segment_reduce                                            */
/* ================================================================== */

/* segment_reduce(data, reduce, *, lengths?, indices?, offsets?, axis=0, unsafe=False, initial?)
 * Each segment reduces its run of data along axis; floats, accumulated in the
 * data's dtype as PyTorch does. Empty segments take `initial`, or the
 * reduction's identity (NaN for mean). */
static int k_segment_reduce(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 8 || !fl_is_floating(x->dtype)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    int64_t code = fl_arg_code(args, n_args, 1);
    int red = code == FL_STR_sum ? R_SUM : code == FL_STR_mean ? R_MEAN : code == FL_STR_prod ? R_PROD : code == FL_STR_max ? R_MAX
            : code == FL_STR_min ? R_MIN : -1;
    if (red < 0) return UNSUP;
    const fl_tensor_t *len = fl_arg_tensor(args, n_args, 2, in, n_in), *offs = fl_arg_tensor(args, n_args, 4, in, n_in);
    if (args[3].kind != FL_ARG_NONE) return UNSUP; /* indices: not supported by PyTorch either */
    if (!len == !offs) return UNSUP;
    const fl_tensor_t *seg = len ? len : offs;
    int axis;
    if (fl_wrap_dim(fl_arg_int_or(args, n_args, 5, 0), x->ndim, &axis) || x->ndim == 0) return UNSUP;
    if (!is_int_index(seg->dtype) || seg->ndim != axis + 1 || o->ndim != x->ndim || o->dtype != x->dtype) return UNSUP;
    int64_t nseg = seg->sizes[axis] - (offs ? 1 : 0);
    if (nseg < 0 || o->sizes[axis] != nseg) return UNSUP;
    for (int d = 0; d < x->ndim; d++) {
        if (d < axis && (seg->sizes[d] != x->sizes[d] || o->sizes[d] != x->sizes[d])) return UNSUP;
        if (d > axis && o->sizes[d] != x->sizes[d]) return UNSUP;
    }
    int has_init = args[7].kind == FL_ARG_INT || args[7].kind == FL_ARG_FLOAT || args[7].kind == FL_ARG_BOOL;
    double init = has_init ? fl_arg_num(&args[7]) : 0.0;
    int dt = x->dtype;
    /* outer: dims before axis; inner: dims after (walked as a view of one slice) */
    fl_tensor_t xo = *x, oo = *o, so = *seg;
    xo.ndim = oo.ndim = so.ndim = axis;
    fl_tensor_t xi = *x, oi = *o;
    xi.ndim = oi.ndim = x->ndim - axis - 1;
    for (int d = 0; d < xi.ndim; d++) {
        xi.sizes[d] = x->sizes[axis + 1 + d]; xi.strides[d] = x->strides[axis + 1 + d];
        oi.sizes[d] = o->sizes[axis + 1 + d]; oi.strides[d] = o->strides[axis + 1 + d];
    }
    fl_walk_t wo, wi;
    fl_walk_init(&wo, axis, x->sizes);
    fl_walk_add(&wo, &xo);
    fl_walk_add(&wo, &oo);
    fl_walk_add(&wo, &so);
    fl_walk_init(&wi, xi.ndim, xi.sizes);
    fl_walk_add(&wi, &xi);
    fl_walk_add(&wi, &oi);
    int64_t axlen = x->sizes[axis];
    if (!wo.numel) return FL_OK;
    int64_t c1[FL_MAX_DIMS], o1[FL_WALK_MAX], c2[FL_MAX_DIMS], o2[FL_WALK_MAX];
    fl_walk_seek(&wo, 0, c1, o1);
    for (int64_t q = 0; q < wo.numel; q++, fl_walk_next(&wo, c1, o1)) {
        /* the segment bounds of this outer row, checked */
        int64_t start = 0, sst = seg->strides[axis];
        for (int64_t s = 0; s < nseg; s++) {
            int64_t a, b;
            if (len) {
                int64_t l = fl_load_i64(seg, o1[2] + s * sst);
                if (l < 0) FL_FAIL(FL_ERR_INVALID, "lengths contains negative value!");
                a = start; b = start + l;
            } else {
                a = fl_load_i64(seg, o1[2] + s * sst);
                b = fl_load_i64(seg, o1[2] + (s + 1) * sst);
                if (a < 0 || b < a) FL_FAIL(FL_ERR_INVALID, "segment_reduce: offsets must be non-decreasing and non-negative");
            }
            if (b > axlen) FL_FAIL(FL_ERR_INVALID, "segment_reduce: segments cover %lld elements of an axis of size %lld",
                                   (long long)b, (long long)axlen);
            start = b;
            if (len && s == nseg - 1 && b != axlen && !fl_arg_int_or(args, n_args, 6, 0))
                FL_FAIL(FL_ERR_INVALID, "segment_reduce: lengths sum to %lld, but the axis has size %lld", (long long)b,
                        (long long)axlen);
            if (!wi.numel) continue;
            fl_walk_seek(&wi, 0, c2, o2);
            for (int64_t e = 0; e < wi.numel; e++, fl_walk_next(&wi, c2, o2)) {
                double acc = has_init ? init
                           : red == R_PROD ? 1.0 : red == R_MAX ? -INFINITY : red == R_MIN ? INFINITY : 0.0;
                acc = rnd_to(dt, acc);
                for (int64_t j = a; j < b; j++) {
                    double v = fl_load_f64(dt, fl_elem(x, o1[0] + o2[0] + j * x->strides[axis]));
                    num_t r = num_combine(red, 0, (num_t){acc, 0}, (num_t){v, 0});
                    acc = rnd_to(dt, r.f);
                }
                if (red == R_MEAN) acc = b > a ? acc / (double)(b - a) : (has_init ? acc : NAN);
                fl_store_f64(o->dtype, fl_elem(o, o1[1] + o2[1] + s * o->strides[axis]), acc);
            }
        }
    }
    return FL_OK;
}

/* ================================================================== */
/* gather / select / embedding, concatenation, flip, arange            */
/* ================================================================== */
static int check_indices(const fl_tensor_t *idx, int64_t n, const char *what) {
    fl_iter_t it;
    fl_iter_init(&it, 1, (const fl_tensor_t *[]){idx});
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t v = fl_load_i64(idx, b[0] + i * it.inner_stride[0]);
            if (v < -n || v >= n) FL_FAIL(FL_ERR_INVALID, "%s: index %lld is out of bounds for size %lld", what, (long long)v, (long long)n);
        }
    }
    return 0;
}

/* embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse) */
static int k_embedding(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *wt = fl_arg_tensor(args, n_args, 0, in, n_in), *idx = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!wt || !idx || n_out < 1 || !fl_tensor_ok(&out[0]) || wt->ndim != 2 || fl_is_floating(idx->dtype)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (o->ndim != idx->ndim + 1 || o->dtype != wt->dtype) return UNSUP;
    int64_t V = wt->sizes[0], D = wt->sizes[1];
    if (o->sizes[o->ndim - 1] != D) return UNSUP;
    int64_t n = fl_numel(idx);
    /* indices must be in [0, V) */
    fl_iter_t it;
    fl_tensor_t ov = *o; /* out without its last dim, to walk with the indices */
    ov.ndim = idx->ndim;
    for (int d = 0; d < idx->ndim; d++)
        if (ov.sizes[d] != idx->sizes[d]) return UNSUP;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){idx, &ov});
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t v = fl_load_i64(idx, b[0] + i * it.inner_stride[0]);
            if (v < 0 || v >= V) FL_FAIL(FL_ERR_INVALID, "embedding: index %lld out of range for %lld rows", (long long)v, (long long)V);
        }
    }
    int64_t os = o->strides[o->ndim - 1], ws = wt->strides[1];
#pragma omp parallel for schedule(static) if (n * D >= PAR_MIN)
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t v = fl_load_i64(idx, b[0] + i * it.inner_stride[0]);
            fl_cvt_row(o->dtype, fl_elem(o, b[1] + i * it.inner_stride[1]), os, wt->dtype,
                    fl_elem(wt, wt->offset + v * wt->strides[0]), ws, D);
        }
    }
    return FL_OK;
}

/* embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq) */
static int k_embedding_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *idx = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!g || !idx || n_args < 5 || n_out < 1 || !fl_tensor_ok(&out[0]) || fl_is_floating(idx->dtype)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (o->dtype != FL_FLOAT32 && o->dtype != FL_FLOAT64) return UNSUP;
    int64_t Vn = args[2].i, pad = args[3].i;
    int scale = (int)args[4].i;
    if (o->ndim != 2 || o->sizes[0] != Vn || g->ndim != idx->ndim + 1) return UNSUP;
    int64_t D = o->sizes[1];
    if (g->sizes[g->ndim - 1] != D) return UNSUP;
    int64_t n = fl_numel(idx);
    int64_t *iv = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    int64_t *goff = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    int64_t *cnt = scale ? calloc((size_t)(Vn ? Vn : 1), sizeof(int64_t)) : NULL;
    if (!iv || !goff || (scale && !cnt)) { free(iv); free(goff); free(cnt); FL_FAIL(FL_ERR_OOM, "embedding backward: out of host memory"); }
    fl_tensor_t gv = *g;
    gv.ndim = idx->ndim;
    fl_iter_t it;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){idx, &gv});
    int64_t k = 0;
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++, k++) {
            iv[k] = fl_load_i64(idx, b[0] + i * it.inner_stride[0]);
            goff[k] = b[1] + i * it.inner_stride[1];
            if (iv[k] < 0 || iv[k] >= Vn) {
                free(iv); free(goff); free(cnt);
                FL_FAIL(FL_ERR_INVALID, "embedding backward: index out of range");
            }
            if (cnt) cnt[iv[k]]++;
        }
    }
    fl_zero_strided(o);
    int64_t gs = g->strides[g->ndim - 1], os0 = o->strides[0], os1 = o->strides[1];
    int nth = omp_get_max_threads();
    int64_t nb = D < nth ? D : nth;
#pragma omp parallel for schedule(static) if (n * D >= PAR_MIN)
    for (int64_t blk = 0; blk < nb; blk++) {
        int64_t d0 = D * blk / nb, d1 = D * (blk + 1) / nb;
        for (int64_t q = 0; q < n; q++) {
            int64_t v = iv[q];
            if (v == pad) continue;
            double sc = cnt ? 1.0 / (double)cnt[v] : 1.0;
            if (o->dtype == FL_FLOAT32 && g->dtype == FL_FLOAT32) {
                float *dst = (float *)o->data + o->offset + v * os0;
                const float *src = (const float *)g->data + goff[q];
                float fs = (float)sc;
                if (os1 == 1 && gs == 1) for (int64_t d = d0; d < d1; d++) dst[d] += cnt ? src[d] * fs : src[d];
                else for (int64_t d = d0; d < d1; d++) dst[d * os1] += cnt ? src[d * gs] * fs : src[d * gs];
            } else {
                for (int64_t d = d0; d < d1; d++) {
                    char *pd = fl_elem(o, o->offset + v * os0 + d * os1);
                    fl_store_f64(o->dtype, pd, fl_load_f64(o->dtype, pd) + sc * fl_load_f64(g->dtype, fl_elem(g, goff[q] + d * gs)));
                }
            }
        }
    }
    free(iv); free(goff); free(cnt);
    return FL_OK;
}

/* index_select(self, dim, index) */
static int k_index_select(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *idx = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !idx || n_args < 3 || args[1].kind != FL_ARG_INT || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    if (fl_is_floating(idx->dtype) || idx->ndim > 1) return UNSUP;
    const fl_tensor_t *o = &out[0];
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "index_select: dimension out of range");
    int64_t n = fl_numel(idx), sz = x->ndim ? x->sizes[dim] : 1;
    if (o->ndim != x->ndim) return UNSUP;
    if (check_indices(idx, sz, "index_select")) return FL_ERR_INVALID;
    fl_tensor_t xs = *x, os = *o;
    if (x->ndim) { xs.sizes[dim] = 1; os.sizes[dim] = 1; }
    for (int d = 0; d < x->ndim; d++)
        if (d != dim && o->sizes[d] != x->sizes[d]) return UNSUP;
    int64_t slice = fl_numel(&xs);
    int64_t istride = idx->ndim ? idx->strides[0] : 0;
#pragma omp parallel for schedule(static) if (n * slice >= PAR_MIN && n > 1)
    for (int64_t j = 0; j < n; j++) {
        int64_t v = fl_load_i64(idx, idx->offset + j * istride);
        if (v < 0) v += sz;
        fl_tensor_t s = xs, d = os;
        if (x->ndim) { s.offset += v * x->strides[dim]; d.offset += j * o->strides[dim]; }
        fl_iter_t it;
        fl_iter_init(&it, 2, (const fl_tensor_t *[]){&d, &s});
        for (int64_t r = 0; r < it.outer; r++) {
            int64_t b[FL_ITER_MAX];
            fl_iter_row(&it, r, b);
            fl_cvt_row(d.dtype, fl_elem(&d, b[0]), it.inner_stride[0], s.dtype, fl_elem(&s, b[1]), it.inner_stride[1], it.inner);
        }
    }
    return FL_OK;
}

/* gather(self, dim, index, sparse_grad): out[i][j] = self[index[i][j]][j] */
static int k_gather(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *idx = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !idx || n_args < 3 || args[1].kind != FL_ARG_INT || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    if (fl_is_floating(idx->dtype)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "gather: dimension out of range");
    if (idx->ndim != x->ndim && !(idx->ndim <= 1 && x->ndim <= 1)) return UNSUP;
    if (o->ndim != idx->ndim) return UNSUP;
    int64_t sz = x->ndim ? x->sizes[dim] : 1;
    fl_tensor_t xv = *idx; /* self's strides over index's shape, dim stride 0 */
    xv.dtype = x->dtype; xv.data = x->data; xv.offset = x->offset;
    for (int d = 0; d < idx->ndim; d++) {
        if (d != dim && x->ndim && idx->sizes[d] > x->sizes[d]) FL_FAIL(FL_ERR_INVALID, "gather: index size exceeds self");
        xv.strides[d] = (d == dim || !x->ndim) ? 0 : x->strides[d];
    }
    int64_t dstride = x->ndim ? x->strides[dim] : 0;
    if (check_indices(idx, sz, "gather")) return FL_ERR_INVALID;
    fl_iter_t it;
    fl_iter_init(&it, 3, (const fl_tensor_t *[]){o, idx, &xv});
    int64_t numel = fl_numel(o);
    size_t isz = fl_itemsize(o->dtype);
    int same = o->dtype == x->dtype;
#pragma omp parallel for schedule(static) if (numel >= PAR_MIN && it.outer > 1)
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t v = fl_load_i64(idx, b[1] + i * it.inner_stride[1]);
            if (v < 0) v += sz;
            const char *src = fl_elem(x, b[2] + i * it.inner_stride[2] + v * dstride);
            char *dst = fl_elem(o, b[0] + i * it.inner_stride[0]);
            if (same) memcpy(dst, src, isz);
            else fl_cvt_row(o->dtype, dst, 1, x->dtype, src, 1, 1);
        }
    }
    return FL_OK;
}

/* scatter_add(self, dim, index, src) / scatter_add_ */
static int k_scatter_add(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *idx = fl_arg_tensor(args, n_args, 2, in, n_in),
                      *src = fl_arg_tensor(args, n_args, 3, in, n_in);
    if (!x || !idx || !src || args[1].kind != FL_ARG_INT || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    if (fl_is_floating(idx->dtype) || idx->ndim != x->ndim || src->ndim != x->ndim || src->dtype != x->dtype) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (o->ndim != x->ndim || o->dtype != x->dtype) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "scatter_add: dimension out of range");
    int64_t sz = x->ndim ? x->sizes[dim] : 1;
    if (check_indices(idx, sz, "scatter_add")) return FL_ERR_INVALID;
    for (int d = 0; d < x->ndim; d++)
        if (idx->sizes[d] > src->sizes[d] || (d != dim && idx->sizes[d] > x->sizes[d])) return UNSUP;
    if (o->data != x->data || o->offset != x->offset) fl_copy_strided(o, x);
    fl_tensor_t sv = *src, ov = *o;
    for (int d = 0; d < idx->ndim; d++) {
        sv.sizes[d] = idx->sizes[d];
        ov.sizes[d] = idx->sizes[d];
        if (d == dim) ov.strides[d] = 0;
    }
    int64_t dstride = x->ndim ? o->strides[dim] : 0;
    fl_iter_t it;
    fl_iter_init(&it, 3, (const fl_tensor_t *[]){idx, &sv, &ov});
    int intmode = !fl_is_floating(o->dtype);
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t v = fl_load_i64(idx, b[0] + i * it.inner_stride[0]);
            if (v < 0) v += sz;
            char *pd = fl_elem(o, b[2] + i * it.inner_stride[2] + v * dstride);
            const char *ps = fl_elem(&sv, b[1] + i * it.inner_stride[1]);
            if (intmode) {
                int64_t a, c;
                fl_cvt_row(FL_INT64, &a, 1, o->dtype, pd, 1, 1);
                fl_cvt_row(FL_INT64, &c, 1, o->dtype, ps, 1, 1);
                a = (int64_t)((uint64_t)a + (uint64_t)c);
                fl_cvt_row(o->dtype, pd, 1, FL_INT64, &a, 1, 1);
            } else if (o->dtype == FL_FLOAT32) {
                *(float *)pd += *(const float *)ps;
            } else {
                fl_store_f64(o->dtype, pd, fl_load_f64(o->dtype, pd) + fl_load_f64(o->dtype, ps));
            }
        }
    }
    return FL_OK;
}

/* cat(Tensor[] tensors, dim) */
/* aten::arange / arange.start / arange.start_step: a factory (no tensor input). out[i] = start + i * step,
 * computed in PyTorch's CPU accumulate type: double for floating outputs, int64 for integer ones (exact
 * beyond 2^53, wrapping as PyTorch's does; a float bound is truncated first, as Scalar::to<int64_t>). */
static int arange_fill_int(const fl_tensor_t *o, int64_t start, int64_t step) {
    int64_t n = o->sizes[0];
    for (int64_t i = 0; i < n; i++) {
        int64_t v = (int64_t)((uint64_t)start + (uint64_t)i * (uint64_t)step);
        fl_cvt_row(o->dtype, fl_elem(o, o->offset + i * o->strides[0]), 1, FL_INT64, &v, 0, 1);
    }
    return FL_OK;
}
static int arange_fill(const fl_tensor_t *o, const fl_arg_t *start, const fl_arg_t *step) {
    static const fl_arg_t zero = {.kind = FL_ARG_INT, .i = 0}, one = {.kind = FL_ARG_INT, .i = 1};
    if (o->ndim != 1) return UNSUP;
    if (!start) start = &zero;
    if (!step) step = &one;
    if (!fl_is_floating(o->dtype) && !fl_is_complex(o->dtype)) return arange_fill_int(o, fl_arg_int(start), fl_arg_int(step));
    int64_t n = o->sizes[0];
    double start_d = fl_arg_num(start), step_d = fl_arg_num(step);
    for (int64_t i = 0; i < n; i++) {
        double v = start_d + (double)i * step_d;
        char *p = fl_elem(o, o->offset + i * o->strides[0]);
        switch (o->dtype) {
        case FL_FLOAT32: *(float *)p = (float)v; break;
        case FL_FLOAT64: *(double *)p = v; break;
        case FL_INT64: *(int64_t *)p = (int64_t)v; break;
        case FL_INT32: *(int32_t *)p = (int32_t)v; break;
        default: fl_store_f64(o->dtype, p, v);
        }
    }
    return FL_OK;
}
static int k_arange(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_out < 1 || n_args < 1) return UNSUP;
    return arange_fill(&out[0], NULL, NULL);
}
static int k_arange_start(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_out < 1 || n_args < 2) return UNSUP;
    return arange_fill(&out[0], &args[0], NULL);
}
static int k_arange_start_step(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_out < 1 || n_args < 3) return UNSUP;
    return arange_fill(&out[0], &args[0], &args[2]);
}

/* aten::flip(Tensor self, int[] dims): out[i] = self[i with the listed dims reversed]; any dtype, any strides */
static int k_flip(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 1 || n_out < 1 || n_args < 2 || args[1].kind != FL_ARG_INT_LIST) return UNSUP;
    const fl_tensor_t *x = &in[0], *o = &out[0];
    if (x->dtype != o->dtype || x->ndim != o->ndim || x->ndim > FL_MAX_DIMS) return UNSUP;
    int nd = x->ndim, rev[FL_MAX_DIMS] = {0};
    for (int k = 0; k < args[1].len; k++) { /* a 0-dim tensor has dims 0 and -1, as in PyTorch */
        int d;
        if (fl_wrap_dim(args[1].list[k], nd, &d))
            FL_FAIL(FL_ERR_INVALID, "flip: dim %lld out of range", (long long)args[1].list[k]);
        if (d < nd) rev[d] = 1;
    }
    int64_t n = 1;
    for (int d = 0; d < nd; d++) {
        if (x->sizes[d] != o->sizes[d]) return UNSUP;
        n *= x->sizes[d];
    }
    size_t es = fl_itemsize(x->dtype);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t lin = 0; lin < n; lin++) {
        int64_t rem = lin, xo = x->offset, oo = o->offset;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t idx = rem % o->sizes[d];
            rem /= o->sizes[d];
            oo += idx * o->strides[d];
            xo += (rev[d] ? o->sizes[d] - 1 - idx : idx) * x->strides[d];
        }
        memcpy((char *)o->data + oo * (int64_t)es, (const char *)x->data + xo * (int64_t)es, es);
    }
    return FL_OK;
}

static int k_cat(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 1 || args[0].kind != FL_ARG_TENSOR_LIST || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    const fl_tensor_t *o = &out[0];
    int64_t first = args[0].i, cnt = args[0].len;
    if (first < 0 || first + cnt > n_in) return UNSUP;
    int dim;
    int64_t dimarg = n_args > 1 && args[1].kind == FL_ARG_INT ? args[1].i : 0;
    if (o->ndim == 0) return UNSUP;
    if (o->ndim == 1 && o->sizes[0] == 0) return FL_OK; /* every input a legacy empty: ATen ignores dim */
    if (fl_wrap_dim(dimarg, o->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "cat: dimension out of range");
    int64_t pos = 0;
    for (int64_t k = 0; k < cnt; k++) {
        const fl_tensor_t *t = &in[first + k];
        if (!fl_tensor_ok(t)) return UNSUP;
        if (t->ndim == 1 && t->sizes[0] == 0 && o->ndim != 1) continue; /* legacy empty */
        if (t->ndim != o->ndim) return UNSUP;
        for (int d = 0; d < o->ndim; d++)
            if (d != dim && t->sizes[d] != o->sizes[d]) return UNSUP;
        pos += t->sizes[dim];
    }
    if (pos != o->sizes[dim]) return UNSUP;
    pos = 0;
    for (int64_t k = 0; k < cnt; k++) {
        const fl_tensor_t *t = &in[first + k];
        if (t->ndim == 1 && t->sizes[0] == 0 && o->ndim != 1) continue;
        fl_tensor_t d = *o;
        d.sizes[dim] = t->sizes[dim];
        d.offset += pos * o->strides[dim];
        fl_copy_strided(&d, t);
        pos += t->sizes[dim];
    }
    return FL_OK;
}

/* stack(Tensor[] tensors, dim) */
static int k_stack(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 1 || args[0].kind != FL_ARG_TENSOR_LIST || n_out < 1 || !fl_tensor_ok(&out[0])) return UNSUP;
    const fl_tensor_t *o = &out[0];
    int64_t first = args[0].i, cnt = args[0].len;
    if (first < 0 || first + cnt > n_in || o->ndim < 1) return UNSUP;
    int dim;
    int64_t dimarg = n_args > 1 && args[1].kind == FL_ARG_INT ? args[1].i : 0;
    if (fl_wrap_dim(dimarg, o->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "stack: dimension out of range");
    if (o->sizes[dim] != cnt) return UNSUP;
    for (int64_t k = 0; k < cnt; k++) {
        const fl_tensor_t *t = &in[first + k];
        if (!fl_tensor_ok(t) || t->ndim != o->ndim - 1) return UNSUP;
        fl_tensor_t d;
        d.data = o->data; d.dtype = o->dtype; d.ndim = t->ndim;
        d.offset = o->offset + k * o->strides[dim];
        for (int q = 0, j = 0; q < o->ndim; q++) {
            if (q == dim) continue;
            if (o->sizes[q] != t->sizes[j]) return UNSUP;
            d.sizes[j] = o->sizes[q];
            d.strides[j] = o->strides[q];
            j++;
        }
        fl_copy_strided(&d, t);
    }
    return FL_OK;
}

/* ================================================================== */
/* table                                                               */
/* ================================================================== */
#define ALL FL_ALL_DTYPES
#define FLT FL_FLOATS
#define NUM (FL_FLOATS | FL_INTS)
#define E(name, mask, fn) {name, mask, 0, fn}

static const fl_kernel_entry_t entries[] = {
    /* gather / select / embedding, concatenation, flip, arange */
    E("aten::embedding", ALL, k_embedding),
    E("aten::embedding_dense_backward", FL_F32 | FL_F64, k_embedding_bw),
    E("aten::index_select", ALL, k_index_select),
    E("aten::gather", ALL, k_gather),
    E("aten::scatter_add", ALL, k_scatter_add),
    E("aten::scatter_add_", ALL, k_scatter_add),
    E("aten::cat", ALL, k_cat), E("aten::flip", ALL, k_flip), E("aten::arange", ALL, k_arange),
    E("aten::arange.start", ALL, k_arange_start), E("aten::arange.start_step", ALL, k_arange_start_step),
    E("aten::stack", ALL, k_stack),
    /* sorting */
    E("aten::sort", ALL, k_sort), E("aten::sort.stable", ALL, k_sort_stable),
    E("aten::topk", NUM, k_topk), E("aten::kthvalue", NUM, k_kthvalue),
    E("aten::median", NUM, k_median), E("aten::median.dim", NUM, k_median_dim),
    E("aten::nanmedian", NUM, k_nanmedian), E("aten::nanmedian.dim", NUM, k_nanmedian_dim),
    E("aten::mode", ALL, k_mode),
    /* scans */
    E("aten::cumprod", ALL, k_cumprod), E("aten::cumprod_", ALL, k_cumprod),
    E("aten::cummax", ALL, k_cummax), E("aten::cummin", ALL, k_cummin),
    E("aten::logcumsumexp", FLT, k_logcumsumexp),
    /* scatter */
    E("aten::scatter.src", ALL, k_scatter), E("aten::scatter_.src", ALL, k_scatter),
    E("aten::scatter.value", ALL, k_scatter), E("aten::scatter_.value", ALL, k_scatter),
    /* scatter.reduce / .value_reduce (reduce="add"|"multiply") and their in-place forms */
    E("aten::scatter.reduce", NUM, k_scatter), E("aten::scatter_.reduce", NUM, k_scatter),
    E("aten::scatter.value_reduce", NUM, k_scatter), E("aten::scatter_.value_reduce", NUM, k_scatter),
    E("aten::scatter_reduce.two", NUM, k_scatter_reduce), E("aten::scatter_reduce_.two", NUM, k_scatter_reduce),
    E("aten::index_add", ALL, k_index_add), E("aten::index_add_", ALL, k_index_add),
    E("aten::index_copy", ALL, k_index_copy), E("aten::index_copy_", ALL, k_index_copy),
    E("aten::index_fill.int_Scalar", ALL, k_index_fill), E("aten::index_fill_.int_Scalar", ALL, k_index_fill),
    E("aten::index_fill.int_Tensor", ALL, k_index_fill), E("aten::index_fill_.int_Tensor", ALL, k_index_fill),
    E("aten::index_reduce", NUM, k_index_reduce), E("aten::index_reduce_", NUM, k_index_reduce),
    /* advanced indexing */
    E("aten::index.Tensor", ALL, k_index), E("aten::_unsafe_index.Tensor", ALL, k_index),
    E("aten::index_put", ALL, k_index_put), E("aten::index_put_", ALL, k_index_put),
    E("aten::_index_put_impl_", ALL, k_index_put), E("aten::_unsafe_index_put", ALL, k_index_put),
    E("aten::_unsafe_masked_index", ALL, k_unsafe_masked_index),
    E("aten::_unsafe_masked_index_put_accumulate", ALL, k_unsafe_masked_index_put_acc),
    /* flat and masked */
    E("aten::take", ALL, k_take), E("aten::put", ALL, k_put), E("aten::put_", ALL, k_put),
    E("aten::masked_scatter", ALL, k_masked_scatter), E("aten::masked_scatter_", ALL, k_masked_scatter),
    E("aten::masked_scatter_backward", ALL, k_masked_scatter_backward),
    E("aten::nonzero_static", ALL, k_nonzero_static),
    /* search */
    E("aten::searchsorted.Tensor", NUM, k_searchsorted), E("aten::searchsorted.Scalar", NUM, k_searchsorted),
    E("aten::bucketize.Tensor", NUM, k_bucketize), E("aten::bucketize.Scalar", NUM, k_bucketize),
    E("aten::isin.Tensor_Tensor", NUM, k_isin), E("aten::isin.Tensor_Scalar", NUM, k_isin),
    E("aten::isin.Scalar_Tensor", NUM, k_isin),
    E("aten::histc", FLT, k_histc),
    /* layout */
    E("aten::roll", ALL, k_roll), E("aten::slice_scatter", ALL, k_slice_scatter),
    E("aten::as_strided_scatter", ALL, k_as_strided_scatter),
    E("aten::repeat_interleave.Tensor", FL_DTYPE_BIT(FL_INT64) | FL_DTYPE_BIT(FL_INT32), k_repeat_interleave),
    /* segments */
    E("aten::segment_reduce", FLT, k_segment_reduce),
};

const fl_kernel_group_t fl_host_group_index = {entries, (int)(sizeof entries / sizeof entries[0])};
