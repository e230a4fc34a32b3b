/* Host kernels: scatters -- scatter (src/value, reduce), scatter_reduce and
 * index_add/copy/fill/reduce, accumulating in a fixed logical order.
 * Shared helpers and conventions: k_index.h. */
#include "k_index.h"

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
/* table                                                               */
/* ================================================================== */
static const fl_kernel_entry_t entries[] = {
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
};

const fl_kernel_group_t fl_host_group_scatter = {entries, (int)(sizeof entries / sizeof entries[0])};
