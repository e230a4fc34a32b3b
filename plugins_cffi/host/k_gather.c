/* Host kernels: gathers and concatenation -- embedding(_dense_backward),
 * index_select, gather, scatter_add, cat, stack, flip, arange (a factory).
 * Shared helpers and conventions: k_index.h. */
#include "k_index.h"

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
            /* no negative index: PyTorch's gather, scatter and index_select refuse them (only advanced indexing wraps) */
            if (v < 0 || v >= n) FL_FAIL(FL_ERR_INVALID, "%s: index %lld is out of bounds for size %lld", what, (long long)v, (long long)n);
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
};

const fl_kernel_group_t fl_host_group_gather = {entries, (int)(sizeof entries / sizeof entries[0])};
