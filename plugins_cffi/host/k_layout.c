/* Host kernels: layout and segments -- roll, slice_scatter, as_strided_scatter,
 * repeat_interleave, segment_reduce. Shared helpers and conventions: k_index.h. */
#include "k_index.h"

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
/* table                                                               */
/* ================================================================== */
static const fl_kernel_entry_t entries[] = {
    /* layout */
    E("aten::roll", ALL, k_roll), E("aten::slice_scatter", ALL, k_slice_scatter),
    E("aten::as_strided_scatter", ALL, k_as_strided_scatter),
    E("aten::repeat_interleave.Tensor", FL_DTYPE_BIT(FL_INT64) | FL_DTYPE_BIT(FL_INT32), k_repeat_interleave),
    /* segments */
    E("aten::segment_reduce", FLT, k_segment_reduce),
};

const fl_kernel_group_t fl_host_group_layout = {entries, (int)(sizeof entries / sizeof entries[0])};
