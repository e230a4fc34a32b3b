/* Host kernels: indexing by tensors -- advanced indexing (index.Tensor, index_put,
 * _unsafe_masked_index(_put_accumulate)) and flat / masked indexing (take, put,
 * masked_scatter(_backward), nonzero_static). Shared helpers and conventions: k_index.h. */
#include "k_index.h"

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
/* table                                                               */
/* ================================================================== */
static const fl_kernel_entry_t entries[] = {
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
};

const fl_kernel_group_t fl_host_group_index = {entries, (int)(sizeof entries / sizeof entries[0])};
