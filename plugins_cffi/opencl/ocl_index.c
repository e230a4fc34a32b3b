/* The OpenCL plugin: indexing: gather, scatter, index_select, embedding (+ backward).
 * Shared declarations: ocl.h. */
#include "ocl.h"

/* ------------------------------------------------------------------ indexing
 * Every kernel that reads indices checks them on the device and sets the error flag; the call reads it
 * back at once (these kernels are synchronous) and raises PyTorch's message. */
static int idx_error(int code, int64_t v, const char *op, int dim, int64_t size) {
    if (code == 1) {
        if (!op) return fail(FL_ERR_INVALID, "index out of range in self");
        return fail(FL_ERR_INVALID, "index %lld is out of bounds for dimension %d with size %lld", (long long)v, dim,
                    (long long)size); /* PyTorch's words (gather, scatter*) */
    }
    return fail(FL_ERR_INVALID, "%s: device error %d", op ? op : "index", code);
}
/* out[w] = x[xv(w) + idx[iv(w)] * xs] over out's shape; xv and iv are views of x and idx in out's shape */
static int gather_run(dev_t_ *D, fl_stream_t s, const fl_tensor_t *o, const dt_t *od, const fl_tensor_t *xv, const dt_t *xd,
                      const fl_tensor_t *iv, const dt_t *id, int64_t xs, int64_t xn, const char *op, int dim) {
    int64_t n = fl_numel(o);
    if (!n) return FL_OK;
    if (xn == 0) return idx_error(1, 0, op, dim, 0); /* any index is out of range (checked at the call, as PyTorch) */
    const fl_tensor_t *ts[3] = {o, iv, xv};
    int64_t base[3] = {od->off, id->off, xd->off};
    walk_t w;
    mkwalk(&w, o->ndim, o->sizes, 3, ts, base);
    cl_mem xm = xd->m ? xd->m : od->m, em;
    int st = err_begin(D, &em);
    if (st) return st;
    karg_t a[7] = {{sizeof(cl_mem), &od->m}, {sizeof(cl_mem), &xm}, {sizeof(cl_mem), &id->m}, KA(w), KA(xs), KA(xn), {sizeof(cl_mem), &em}};
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(o->dtype));
    st = launch1(D, s, prog, "x_gather", 7, a, n);
    int code; int64_t v;
    if ((st = err_end(D, s, st, &code, &v))) return st;
    return code ? idx_error(code, v, op, dim, xn) : FL_OK;
}
/* gather(self, dim, index, sparse_grad): out has index's shape */
int k_gather(KARGS) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !ix || !fl_out_ok(out, n_out) || n_args < 3 || args[1].kind != FL_ARG_INT) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (ix->dtype != FL_INT64 || x->dtype != o->dtype || !dt_ok(D, o->dtype) || o->ndim != ix->ndim || x->ndim != ix->ndim || !x->ndim) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) return UNSUP;
    for (int d = 0; d < o->ndim; d++) if (o->sizes[d] != ix->sizes[d] || (d != dim && ix->sizes[d] > x->sizes[d])) return UNSUP;
    dt_t od, xd, id;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x, &xd)) || (st = tres(D, ix, &id))) return st;
    fl_tensor_t xv = *x;
    for (int d = 0; d < o->ndim; d++) xv.sizes[d] = o->sizes[d];
    xv.strides[dim] = 0;
    return gather_run(D, stream, o, &od, &xv, &xd, ix, &id, x->strides[dim], x->sizes[dim], "gather", dim);
}
/* index_select(self, dim, index): out = self with dim indexed by the 1-D index */
int k_index_select(KARGS) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !ix || !fl_out_ok(out, n_out) || n_args < 3 || args[1].kind != FL_ARG_INT) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (ix->dtype != FL_INT64 || ix->ndim > 1 || x->dtype != o->dtype || !dt_ok(D, o->dtype) || o->ndim != x->ndim) return UNSUP;
    if (x->ndim == 0) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) return UNSUP;
    int64_t ni = ix->ndim ? ix->sizes[0] : 1;
    for (int d = 0; d < o->ndim; d++) if (o->sizes[d] != (d == dim ? ni : x->sizes[d])) return UNSUP;
    dt_t od, xd, id;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x, &xd)) || (st = tres(D, ix, &id))) return st;
    fl_tensor_t xv = *x, iv = *o;
    xv.strides[dim] = 0; xv.sizes[dim] = ni;
    iv.dtype = FL_INT64; iv.data = ix->data; iv.offset = ix->offset;
    for (int d = 0; d < o->ndim; d++) iv.strides[d] = d == dim && ix->ndim ? ix->strides[0] : 0;
    return gather_run(D, stream, o, &od, &xv, &xd, &iv, &id, x->strides[dim], x->sizes[dim], NULL, dim);
}
/* embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse): out = indices.shape + [D] */
int k_embedding(KARGS) {
    DEV(device);
    const fl_tensor_t *wt = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!wt || !ix || !fl_out_ok(out, n_out)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (ix->dtype != FL_INT64 || wt->ndim != 2 || wt->dtype != o->dtype || !dt_ok(D, o->dtype) || o->ndim != ix->ndim + 1) return UNSUP;
    for (int d = 0; d < ix->ndim; d++) if (o->sizes[d] != ix->sizes[d]) return UNSUP;
    if (o->sizes[o->ndim - 1] != wt->sizes[1]) return UNSUP;
    dt_t od, xd, id;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, wt, &xd)) || (st = tres(D, ix, &id))) return st;
    fl_tensor_t xv = *o, iv = *o;
    int last = o->ndim - 1;
    xv.dtype = wt->dtype; xv.data = wt->data; xv.offset = wt->offset;
    iv.dtype = FL_INT64; iv.data = ix->data; iv.offset = ix->offset;
    for (int d = 0; d < last; d++) { xv.strides[d] = 0; iv.strides[d] = ix->strides[d]; }
    xv.strides[last] = wt->strides[1]; iv.strides[last] = 0;
    return gather_run(D, stream, o, &od, &xv, &xd, &iv, &id, wt->strides[0], wt->sizes[0], NULL, 0);
}
/* embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq) */
int k_embedding_bw(KARGS) {
    DEV(device);
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!g || !ix || !fl_out_ok(out, n_out) || n_args < 5 || args[2].kind != FL_ARG_INT) return UNSUP;
    if (bool_at(args, n_args, 4)) return UNSUP; /* scale_grad_by_freq */
    const fl_tensor_t *o = &out[0];
    if (ix->dtype != FL_INT64 || !is_flt(o->dtype) || !dt_ok(D, o->dtype) || g->dtype != o->dtype || o->ndim != 2) return UNSUP;
    if (g->ndim != ix->ndim + 1 || o->sizes[0] != args[2].i || g->sizes[g->ndim - 1] != o->sizes[1]) return UNSUP;
    for (int d = 0; d < ix->ndim; d++) if (g->sizes[d] != ix->sizes[d]) return UNSUP;
    int64_t pad = args[3].kind == FL_ARG_INT ? args[3].i : -1;
    dt_t od, gd, id;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, g, &gd)) || (st = tres(D, ix, &id))) return st;
    if ((st = fill_bits(D, stream, o, 0))) return st;
    int64_t Dm = o->sizes[1], nw = o->sizes[0];
    if (!Dm || !fl_numel(ix)) return FL_OK;
    fl_tensor_t gv = *g;
    gv.ndim = ix->ndim;
    const fl_tensor_t *ts[2] = {ix, &gv};
    int64_t base[2] = {id.off, gd.off};
    walk_t w;
    mkwalk(&w, ix->ndim, ix->sizes, 2, ts, base);
    int64_t gsl = g->strides[g->ndim - 1], ooff = od.off + o->offset, os0 = o->strides[0], os1 = o->strides[1];
    cl_mem em;
    if ((st = err_begin(D, &em))) return st;
    karg_t a[12] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &id.m}, {sizeof(cl_mem), &gd.m}, KA(w), KA(Dm), KA(gsl),
                    KA(ooff), KA(os0), KA(os1), KA(nw), KA(pad), {sizeof(cl_mem), &em}};
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(o->dtype));
    st = launch1(D, stream, prog, "x_embbw", 12, a, Dm);
    int code; int64_t v;
    if ((st = err_end(D, stream, st, &code, &v))) return st;
    return code ? idx_error(code, v, NULL, 0, nw) : FL_OK;
}
/* scatter family: (self, dim, index, src|value[, reduce]); out = self, then the indexed writes.
 * mode 0 src, 1 value, 2 add src */
static int scatter_k(KARGS, int mode) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *ix = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!x || !ix || !fl_out_ok(out, n_out) || n_args < 4 || args[1].kind != FL_ARG_INT) return UNSUP;
    if (n_args > 4 && args[4].kind != FL_ARG_NONE) return UNSUP; /* reduce= */
    const fl_tensor_t *o = &out[0], *src = NULL;
    if (ix->dtype != FL_INT64 || x->dtype != o->dtype || !dt_ok(D, o->dtype) || !o->ndim || x->ndim != o->ndim) return UNSUP;
    for (int d = 0; d < o->ndim; d++) if (x->sizes[d] != o->sizes[d]) return UNSUP;
    prm_t p;
    memset(&p, 0, sizeof p);
    if (mode == 1) {
        if (!fl_arg_is_num(&args[3])) return UNSUP;
        if (!is_flt(o->dtype) && args[3].kind == FL_ARG_FLOAT) return UNSUP;
        p.si[0] = fl_arg_int(&args[3]);
        if (o->dtype == FL_BOOL) p.si[0] = fl_arg_num(&args[3]) != 0;
        prm_real(D, &p, 0, 0, fl_arg_num(&args[3]));
    } else {
        src = fl_arg_tensor(args, n_args, 3, in, n_in);
        if (!src || src->dtype != o->dtype || src->ndim != o->ndim) return UNSUP;
    }
    int dim;
    if (fl_wrap_dim(args[1].i, o->ndim, &dim)) return UNSUP;
    if (ix->ndim != o->ndim && fl_numel(ix)) return UNSUP;
    for (int d = 0; d < ix->ndim; d++)
        if ((d != dim && ix->sizes[d] > o->sizes[d]) || (src && ix->sizes[d] > src->sizes[d])) return UNSUP;
    dt_t od, id, sd = {0, 0};
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, ix, &id)) || (src && (st = tres(D, src, &sd)))) return st;
    if ((st = copy_any(D, stream, o, x))) return st;
    if (!fl_numel(ix)) return FL_OK;
    int64_t L = ix->sizes[dim];
    fl_tensor_t ov = *o, iv = *ix, sv = src ? *src : *ix;
    for (int d = 0; d < o->ndim; d++) ov.sizes[d] = iv.sizes[d] = sv.sizes[d] = d == dim ? 1 : ix->sizes[d];
    const fl_tensor_t *ts[3] = {&ov, &iv, &sv};
    int64_t base[3] = {od.off, id.off, src ? sd.off : id.off};
    walk_t w;
    mkwalk(&w, o->ndim, iv.sizes, 3, ts, base);
    int64_t os = o->strides[dim], on = o->sizes[dim], is = ix->strides[dim], ss = src ? src->strides[dim] : 0;
    cl_mem sm = src ? sd.m : id.m, em;
    if ((st = err_begin(D, &em))) return st;
    karg_t a[12] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &id.m}, {sizeof(cl_mem), &sm}, KA(w), KA(L), KA(os), KA(on),
                    KA(is), KA(ss), {prm_size(D), &p}, KA(mode), {sizeof(cl_mem), &em}};
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(o->dtype));
    st = launch1(D, stream, prog, "x_scat", 12, a, w.n);
    int code; int64_t v;
    if ((st = err_end(D, stream, st, &code, &v))) return st;
    return code ? idx_error(code, v, mode == 2 ? "scatter_add" : "scatter", dim, on) : FL_OK;
}
int k_scatter_src(KARGS) { return scatter_k(PASS, 0); }
int k_scatter_value(KARGS) { return scatter_k(PASS, 1); }
int k_scatter_add(KARGS) { return scatter_k(PASS, 2); }
