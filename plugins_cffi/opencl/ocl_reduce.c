/* The OpenCL plugin: reductions: sum, mean, amax/amin, max/min, argmax/argmin, var/std, cumsum,
 * sort.stable, topk.
 * Shared declarations: ocl.h. */
#include "ocl.h"

/* ------------------------------------------------------------------ reductions */
typedef struct { int64_t osize[8], ost_o[8], ost_i[8], rsize[8], rst[8]; int64_t ooff, ioff, ondim, rndim, nout, nred, chunk, nchunk; } red_t;

static int parse_dims(const fl_arg_t *a, int nd, uint32_t *mask) {
    *mask = 0;
    if (!a || a->kind == FL_ARG_NONE || (a->kind == FL_ARG_INT_LIST && a->len == 0)) { *mask = nd ? (1u << nd) - 1 : 0; return FL_OK; }
    if (a->kind == FL_ARG_INT) { int d; if (fl_wrap_dim(a->i, nd, &d)) return UNSUP; if (nd) *mask = 1u << d; return FL_OK; }
    if (a->kind != FL_ARG_INT_LIST) return UNSUP;
    for (int k = 0; k < a->len; k++) { int d; if (fl_wrap_dim(a->list[k], nd, &d)) return UNSUP; if (nd) *mask |= 1u << d; }
    return FL_OK;
}
/* op 0 sum (scale: 1, or 1/n for mean), 1 max */
/* op 0 sum (scale: 1, or 1/n for mean), 1 max, 2 min, 3 arg max/min (rx: flags 1 min, 2 values, 4 indices;
 * o2 the int64 indices), 4 var/std (rx: flags 1 sqrt, 2 mean in o2; corr) */
typedef struct { const fl_tensor_t *o2; int flags; double corr; } rx_t;
typedef struct { int64_t st[8]; int64_t off; } ist_t;
static int reduce_x(dev_t_ *D, fl_stream_t s, const fl_tensor_t *x0, const fl_arg_t *dims, int keepdim, const fl_tensor_t *o, int op,
                    int mean, const rx_t *rx) {
    int ext = op == 1 || op == 2 || op == 3;
    if (!dt_ok(D, o->dtype) || !dt_ok(D, x0->dtype) || (o->dtype == FL_BOOL && !(op == 1 || op == 2))) return UNSUP;
    if (op >= 1 && x0->dtype != o->dtype) return UNSUP;
    if ((mean || op == 4) && !is_flt(o->dtype)) return UNSUP;
    const fl_tensor_t *o2 = rx ? rx->o2 : NULL;
    if (op == 3 && o2 && (o2->dtype != FL_INT64 || o2->ndim != o->ndim)) return UNSUP;
    if (op == 4 && o2 && (o2->dtype != o->dtype || o2->ndim != o->ndim)) return UNSUP;
    if (o2) for (int d = 0; d < o->ndim; d++) if (o2->sizes[d] != o->sizes[d]) return UNSUP;
    uint32_t mask;
    if (parse_dims(dims, x0->ndim, &mask)) return UNSUP;
    int nkeep = 0;
    for (int d = 0; d < x0->ndim; d++) if (!(mask >> d & 1)) nkeep++;
    if (o->ndim != (keepdim ? x0->ndim : nkeep)) return UNSUP;
    int64_t nred = 1;
    for (int d = 0; d < x0->ndim; d++) if (mask >> d & 1) nred *= x0->sizes[d];
    if (ext && nred == 0) return UNSUP;
    for (int d = 0, k = 0; d < x0->ndim; d++) { /* kept dims match the output (decided before anything is queued) */
        if ((mask >> d & 1) && !keepdim) continue;
        if (!(mask >> d & 1) && o->sizes[k] != x0->sizes[d]) return UNSUP;
        k++;
    }
    dt_t od, xd, o2d = {0, 0};
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x0, &xd)) || (o2 && (st = tres(D, o2, &o2d)))) return st;
    int64_t nout = fl_numel(o);
    if (!nout) return FL_OK;
    fl_tensor_t x = *x0;
    cl_mem tmpx = NULL;
    if (x0->dtype != o->dtype && fl_numel(x0) > 0) { /* sum(int32) -> int64 etc.: convert first */
        x.dtype = o->dtype; x.offset = 0;
        contig_strides(&x);
        dt_t td = {tmpbuf(D, (size_t)fl_numel(x0) * fl_itemsize(o->dtype), &st), 0};
        if (!td.m) return st;
        if ((st = copy_view(D, s, &x, &td, x0, &xd))) { cl.clReleaseMemObject(td.m); return st; }
        tmpx = td.m; xd = td;
    }
    red_t r;
    ist_t is2;
    memset(&r, 0, sizeof r);
    memset(&is2, 0, sizeof is2);
    int od_i = 0, on = 0, rn = 0;
    for (int d = 0; d < x.ndim; d++) {
        int red = mask >> d & 1;
        int oi = keepdim ? d : (red ? -1 : od_i++);
        if (red) {
            if (x.sizes[d] == 1) continue;
            if (rn > 0 && r.rst[rn - 1] == x.strides[d] * x.sizes[d]) { r.rsize[rn - 1] *= x.sizes[d]; r.rst[rn - 1] = x.strides[d]; continue; }
            r.rsize[rn] = x.sizes[d]; r.rst[rn] = x.strides[d]; rn++;
        } else {
            if (o->sizes[oi] != x.sizes[d]) { if (tmpx) cl.clReleaseMemObject(tmpx); return UNSUP; }
            if (x.sizes[d] == 1) continue;
            r.osize[on] = x.sizes[d]; r.ost_o[on] = o->strides[oi]; r.ost_i[on] = x.strides[d];
            if (o2) is2.st[on] = o2->strides[oi];
            on++;
        }
    }
    if (o2) is2.off = o2d.off + o2->offset;
    if (rn == 0) { r.rsize[0] = 1; r.rst[0] = 0; rn = 1; }
    if (nred == 0) { r.rsize[0] = 0; }
    r.ondim = on; r.rndim = rn; r.nout = nout; r.nred = nred;
    r.ooff = od.off + o->offset; r.ioff = xd.off + x.offset;
    r.nchunk = 1; r.chunk = nred > 0 ? nred : 1;
    if (op <= 2 && nout < 4096 && nred > 8192) {
        int64_t want = (8192 + nout - 1) / nout, bych = (nred + 4095) / 4096;
        r.nchunk = want < bych ? want : bych;
        if (r.nchunk < 1) r.nchunk = 1;
        r.chunk = (nred + r.nchunk - 1) / r.nchunk;
        r.nchunk = (nred + r.chunk - 1) / r.chunk;
    }
    if (nred == 0) { r.chunk = 0; }
    char prog[16];
    snprintf(prog, sizeof prog, "red:%s", tname(o->dtype));
    if (op == 3 || op == 4) {
        cl_mem m2 = o2 ? o2d.m : od.m, xm = xd.m ? xd.m : od.m;
        int flags = rx ? rx->flags : 0;
        if (op == 3) {
            karg_t a[6] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &m2}, {sizeof(cl_mem), &xm}, KA(r), KA(is2), KA(flags)};
            st = launch1(D, s, prog, "r_arg", 6, a, nout);
        } else {
            real_t rc;
            karg_t a[7] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &m2}, {sizeof(cl_mem), &xm}, KA(r), KA(is2),
                           ka_real(D, &rc, rx ? rx->corr : 1.0), KA(flags)};
            st = launch1(D, s, prog, "r_var", 7, a, nout);
        }
        if (tmpx) cl.clReleaseMemObject(tmpx);
        return st;
    }
    size_t accsz = op ? fl_itemsize(o->dtype) : 8;
    if (op == 0 && o->dtype == FL_FLOAT32 && !D->fp64) accsz = 4;
    cl_mem part = r.nchunk > 1 ? tmpbuf(D, (size_t)(r.nchunk * nout) * accsz, &st) : NULL;
    if (r.nchunk > 1 && !part) { if (tmpx) cl.clReleaseMemObject(tmpx); return st; }
    double scale = mean ? 1.0 / (double)nred : 1.0;
    real_t rs;
    cl_mem pm = part ? part : od.m;
    karg_t a[5] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &pm}, {sizeof(cl_mem), &xd.m}, KA(r), ka_real(D, &rs, scale)};
    if (!xd.m) a[2] = (karg_t){sizeof(cl_mem), &od.m};
    static const char *const rk[3] = {"r_sum", "r_max", "r_min"}, *const fk[3] = {"f_sum", "f_max", "f_min"};
    st = launch1(D, s, prog, rk[op], 5, a, nout * r.nchunk);
    if (!st && r.nchunk > 1) {
        karg_t b[4] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &pm}, KA(r), ka_real(D, &rs, scale)};
        st = launch1(D, s, prog, fk[op], 4, b, nout);
    }
    if (part) cl.clReleaseMemObject(part);
    if (tmpx) cl.clReleaseMemObject(tmpx);
    return st;
}
int reduce(dev_t_ *D, fl_stream_t s, const fl_tensor_t *x0, const fl_arg_t *dims, int keepdim, const fl_tensor_t *o, int op, int mean) {
    return reduce_x(D, s, x0, dims, keepdim, o, op, mean, NULL);
}
int bool_at(const fl_arg_t *args, int n_args, int k) {
    return k < n_args && (args[k].kind == FL_ARG_BOOL || args[k].kind == FL_ARG_INT) ? (int)args[k].i : 0;
}
int k_sum_dim(KARGS) { /* sum.dim_IntList(self, dim?, keepdim, dtype?) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 2), &out[0], 0, 0);
}
int k_sum(KARGS) { /* sum(self, dtype?) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, NULL, 0, &out[0], 0, 0);
}
int k_mean_dim(KARGS) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 2), &out[0], 0, 1);
}
int k_mean(KARGS) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, NULL, 0, &out[0], 0, 1);
}
int k_amax(KARGS) { /* amax(self, dim[], keepdim) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 2), &out[0], 1, 0);
}

int k_amin(KARGS) { /* amin(self, dim[], keepdim) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    return reduce(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 2), &out[0], 2, 0);
}
static int maxmin_all(KARGS, int op) { /* max(self) / min(self): the whole tensor */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out)) return UNSUP;
    if (!fl_numel(x))
        return fail(FL_ERR_INVALID, "%s(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim "
                    "with the 'dim' argument.", op == 1 ? "max" : "min");
    return reduce(D, stream, x, NULL, 0, &out[0], op, 0);
}
int k_max_all(KARGS) { return maxmin_all(PASS, 1); }
int k_min_all(KARGS) { return maxmin_all(PASS, 2); }
static int empty_red(const fl_tensor_t *x, const fl_arg_t *dims) {
    uint32_t mask;
    if (fl_numel(x)) return 0;
    if (parse_dims(dims, x->ndim, &mask)) return 0;
    if (!dims || dims->kind == FL_ARG_NONE) return 1;
    for (int d = 0; d < x->ndim; d++) if ((mask >> d & 1) && x->sizes[d] == 0) return 1;
    return 0;
}
static int maxmin_dim(KARGS, int mn) { /* max.dim(self, dim, keepdim) -> (values, indices) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_out_ok(out, n_out) || !fl_out_at(out, n_out, 1) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    if (empty_red(x, &args[1]))
        return fail(FL_ERR_INVALID, "%s(): Expected reduction dim %lld to have non-zero size.", mn ? "min" : "max", (long long)args[1].i);
    rx_t rx = {&out[1], (mn ? 1 : 0) | 2 | 4, 0};
    return reduce_x(D, stream, x, &args[1], bool_at(args, n_args, 2), &out[0], 3, 0, &rx);
}
int k_max_dim(KARGS) { return maxmin_dim(PASS, 0); }
int k_min_dim(KARGS) { return maxmin_dim(PASS, 1); }
static int argext(KARGS, int mn) { /* argmax(self, dim?, keepdim) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out) || out[0].dtype != FL_INT64) return UNSUP;
    const fl_arg_t *dims = n_args > 1 ? &args[1] : NULL;
    if (dims && dims->kind != FL_ARG_NONE && dims->kind != FL_ARG_INT) return UNSUP;
    if (empty_red(x, dims))
        return fail(FL_ERR_INVALID, "%s(): Expected reduction dim to be specified for input.numel() == 0.", mn ? "argmin" : "argmax");
    int all = !dims || dims->kind == FL_ARG_NONE;
    int keep = bool_at(args, n_args, 2);
    /* the values go nowhere: r_arg writes only the indices (out is passed as both, flags 4) */
    fl_tensor_t ov = out[0];
    ov.dtype = x->dtype;
    if (all && keep) { /* argmax(keepdim=True) without dim: a [1]*ndim output */
        rx_t rx = {&out[0], (mn ? 1 : 0) | 4, 0};
        return reduce_x(D, stream, x, NULL, 1, &ov, 3, 0, &rx);
    }
    rx_t rx = {&out[0], (mn ? 1 : 0) | 4, 0};
    return reduce_x(D, stream, x, all ? NULL : dims, all ? 0 : keep, &ov, 3, 0, &rx);
}
int k_argmax(KARGS) { return argext(PASS, 0); }
int k_argmin(KARGS) { return argext(PASS, 1); }
static int varstd(KARGS, int flags, int nouts) { /* var.correction(self, dim?, *, correction?, keepdim) ; var_mean -> (var, mean) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out) || n_out < nouts || (nouts == 2 && !fl_out_at(out, n_out, 1))) return UNSUP;
    if (!is_flt(x->dtype) || out[0].dtype != x->dtype) return UNSUP;
    double corr = (n_args > 2 && fl_arg_is_num(&args[2])) ? fl_arg_num(&args[2]) : 1.0;
    rx_t rx = {nouts == 2 ? &out[1] : NULL, flags | (nouts == 2 ? 2 : 0), corr};
    return reduce_x(D, stream, x, n_args > 1 ? &args[1] : NULL, bool_at(args, n_args, 3), &out[0], 4, 0, &rx);
}
int k_var(KARGS) { return varstd(PASS, 0, 1); }
int k_std(KARGS) { return varstd(PASS, 1, 1); }
int k_var_mean(KARGS) { return varstd(PASS, 0, 2); }
int k_std_mean(KARGS) { return varstd(PASS, 1, 2); }
/* cumsum(self, dim, dtype?): integer inputs accumulate in int64 (the output's dtype), floats in double */
typedef struct { int64_t osize[8], ost[2][8], off[2], ondim, nrows, L, lst[2]; } crow_t;
int k_cumsum(KARGS) {
    DEV(device);
    const fl_tensor_t *x0 = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x0 || !fl_out_ok(out, n_out) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!dt_ok(D, o->dtype) || !dt_ok(D, x0->dtype) || o->dtype == FL_BOOL || o->ndim != x0->ndim) return UNSUP;
    for (int d = 0; d < o->ndim; d++) if (o->sizes[d] != x0->sizes[d]) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x0->ndim, &dim)) return fail(FL_ERR_INVALID, "cumsum: dimension out of range");
    dt_t od, xd;
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x0, &xd))) return st;
    int64_t n = fl_numel(o);
    if (!n) return FL_OK;
    fl_tensor_t x = *x0;
    cl_mem tmpx = NULL;
    if (x0->dtype != o->dtype) {
        x.dtype = o->dtype; x.offset = 0;
        contig_strides(&x);
        dt_t td = {tmpbuf(D, (size_t)n * fl_itemsize(o->dtype), &st), 0};
        if (!td.m) return st;
        if ((st = copy_view(D, stream, &x, &td, x0, &xd))) { cl.clReleaseMemObject(td.m); return st; }
        tmpx = td.m; xd = td;
    }
    crow_t r;
    memset(&r, 0, sizeof r);
    const fl_tensor_t *ts[2] = {o, &x};
    r.nrows = 1;
    r.L = o->ndim ? o->sizes[dim] : 1;
    int on = 0;
    for (int d = 0; d < o->ndim; d++) {
        if (d == dim) { for (int k = 0; k < 2; k++) r.lst[k] = ts[k]->strides[d]; continue; }
        if (o->sizes[d] == 1) continue;
        r.osize[on] = o->sizes[d];
        for (int k = 0; k < 2; k++) r.ost[k][on] = ts[k]->strides[d];
        r.nrows *= o->sizes[d];
        on++;
    }
    r.ondim = on;
    r.off[0] = od.off + o->offset; r.off[1] = xd.off + x.offset;
    char prog[16];
    snprintf(prog, sizeof prog, "red:%s", tname(o->dtype));
    karg_t a[3] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &xd.m}, KA(r)};
    st = launch1(D, stream, prog, "cumsum", 3, a, r.nrows);
    if (tmpx) cl.clReleaseMemObject(tmpx);
    return st;
}

/* sort / topk: (values, int64 indices) along dim, by rank (stable) */
typedef struct { int64_t osize[8], ost[3][8], off[3], ondim, nrows, L, lst[3]; } srow_t;
static int sort_run(dev_t_ *D, fl_stream_t s, const fl_tensor_t *x, int dim, int64_t K, int desc, const fl_tensor_t *vo, const fl_tensor_t *io) {
    if (!dt_ok(D, x->dtype) || vo->dtype != x->dtype || io->dtype != FL_INT64 || vo->ndim != x->ndim || io->ndim != x->ndim) return UNSUP;
    for (int d = 0; d < x->ndim; d++)
        if (vo->sizes[d] != (d == dim ? K : x->sizes[d]) || io->sizes[d] != vo->sizes[d]) return UNSUP;
    dt_t vd, id, xd;
    int st;
    if ((st = tres(D, vo, &vd)) || (st = tres(D, io, &id)) || (st = tres(D, x, &xd))) return st;
    if (!fl_numel(vo)) return FL_OK;
    srow_t r;
    memset(&r, 0, sizeof r);
    const fl_tensor_t *ts[3] = {vo, io, x};
    r.nrows = 1;
    r.L = x->ndim ? x->sizes[dim] : 1;
    int on = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (d == dim) { for (int k = 0; k < 3; k++) r.lst[k] = ts[k]->strides[d]; continue; }
        if (x->sizes[d] == 1) continue;
        r.osize[on] = x->sizes[d];
        for (int k = 0; k < 3; k++) r.ost[k][on] = ts[k]->strides[d];
        r.nrows *= x->sizes[d];
        on++;
    }
    r.ondim = on;
    r.off[0] = vd.off + vo->offset; r.off[1] = id.off + io->offset; r.off[2] = xd.off + x->offset;
    char prog[16];
    snprintf(prog, sizeof prog, "red:%s", tname(x->dtype));
    if (r.L <= 1024) { /* short rows: every element finds its rank (O(L^2) per row, one pass) */
        karg_t a[6] = {{sizeof(cl_mem), &vd.m}, {sizeof(cl_mem), &id.m}, {sizeof(cl_mem), &xd.m}, KA(r), KA(K), KA(desc)};
        return launch1(D, s, prog, "sort_rank", 6, a, r.nrows * r.L);
    }
    int64_t P = 1;
    while (P < r.L) P <<= 1;
    cl_mem km = tmpbuf(D, (size_t)(r.nrows * P) * fl_itemsize(x->dtype), &st);
    if (!km) return st;
    cl_mem im = tmpbuf(D, (size_t)(r.nrows * P) * 8, &st);
    if (!im) { cl.clReleaseMemObject(km); return st; }
    karg_t a[5] = {{sizeof(cl_mem), &km}, {sizeof(cl_mem), &im}, {sizeof(cl_mem), &xd.m}, KA(r), KA(P)};
    st = launch1(D, s, prog, "bs_init", 5, a, r.nrows * P);
    for (int64_t kk = 2; kk <= P && !st; kk <<= 1)
        for (int64_t j = kk >> 1; j > 0 && !st; j >>= 1) {
            karg_t b[8] = {{sizeof(cl_mem), &km}, {sizeof(cl_mem), &im}, KA(r.nrows), KA(P), KA(r.L), KA(j), KA(kk), KA(desc)};
            st = launch1(D, s, prog, "bs_step", 8, b, r.nrows * P);
        }
    if (!st) {
        karg_t c[7] = {{sizeof(cl_mem), &vd.m}, {sizeof(cl_mem), &id.m}, {sizeof(cl_mem), &km}, {sizeof(cl_mem), &im}, KA(r), KA(P), KA(K)};
        st = launch1(D, s, prog, "bs_out", 7, c, r.nrows * K);
    }
    cl.clReleaseMemObject(km); /* OpenCL keeps them until the queued kernels are done */
    cl.clReleaseMemObject(im);
    return st;
}
static int sort_k(KARGS, int stable) { /* sort(self, dim, descending) ; sort.stable(self, *, stable?, dim, descending) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_out_ok(out, n_out) || !fl_out_at(out, n_out, 1)) return UNSUP;
    int dk = stable ? 2 : 1;
    int64_t d0 = fl_arg_int_or(args, n_args, dk, -1);
    int desc = (int)fl_arg_int_or(args, n_args, dk + 1, 0);
    int dim;
    if (fl_wrap_dim(d0, x->ndim, &dim)) return fail(FL_ERR_INVALID, "sort: dimension out of range");
    return sort_run(D, stream, x, dim, x->ndim ? x->sizes[dim] : 1, desc, &out[0], &out[1]);
}
int k_sort_stable(KARGS) { return sort_k(PASS, 1); }
int k_topk(KARGS) { /* topk(self, k, dim, largest, sorted) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 2 || !fl_out_ok(out, n_out) || !fl_out_at(out, n_out, 1) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    int dim;
    if (fl_wrap_dim(fl_arg_int_or(args, n_args, 2, -1), x->ndim, &dim)) return fail(FL_ERR_INVALID, "topk: dimension out of range");
    int64_t K = args[1].i, L = x->ndim ? x->sizes[dim] : 1;
    if (K < 0 || K > L) return fail(FL_ERR_INVALID, "selected index k out of range");
    /* sorted=False: PyTorch leaves the order unspecified; these are sorted */
    return sort_run(D, stream, x, dim, K, (int)fl_arg_int_or(args, n_args, 3, 1), &out[0], &out[1]);
}
