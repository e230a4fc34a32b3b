/* Host kernels: searching and counting -- searchsorted, bucketize, isin, histc.
 * Shared helpers and conventions: k_index.h. */
#include "k_index.h"

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
/* table                                                               */
/* ================================================================== */
static const fl_kernel_entry_t entries[] = {
    /* search */
    E("aten::searchsorted.Tensor", NUM, k_searchsorted), E("aten::searchsorted.Scalar", NUM, k_searchsorted),
    E("aten::bucketize.Tensor", NUM, k_bucketize), E("aten::bucketize.Scalar", NUM, k_bucketize),
    E("aten::isin.Tensor_Tensor", NUM, k_isin), E("aten::isin.Tensor_Scalar", NUM, k_isin),
    E("aten::isin.Scalar_Tensor", NUM, k_isin),
    E("aten::histc", FLT, k_histc),
};

const fl_kernel_group_t fl_host_group_search = {entries, (int)(sizeof entries / sizeof entries[0])};
