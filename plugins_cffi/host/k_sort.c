/* Host kernels: sorting and scans along a dimension -- sort, topk, kthvalue,
 * median, nanmedian, mode; cumprod, cummax, cummin, logcumsumexp (cumsum is
 * with the row-wise reductions in k_reduce.c). The ordering keys and the
 * conventions shared with the other indexing files: k_index.h. */
#include "k_index.h"

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
/* table                                                               */
/* ================================================================== */
static const fl_kernel_entry_t entries[] = {
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
};

const fl_kernel_group_t fl_host_group_sort = {entries, (int)(sizeof entries / sizeof entries[0])};
