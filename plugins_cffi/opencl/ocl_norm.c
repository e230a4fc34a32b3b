/* The OpenCL plugin: softmax, log_softmax (+ backward) and layer norm (+ backward).
 * Shared declarations: ocl.h. */
#include "ocl.h"

/* ------------------------------------------------------------------ softmax family */
typedef struct { int64_t osize[8], ost[3][8], off[3], ondim, nrows, L, lst[3]; } rows_t;
static int softmax_run(dev_t_ *D, fl_stream_t s, const fl_tensor_t *o, const fl_tensor_t *x, const fl_tensor_t *y, int dim, int kind) {
    if (!is_flt(o->dtype) || !dt_ok(D, o->dtype) || x->dtype != o->dtype || (y && y->dtype != o->dtype)) return UNSUP;
    if (x->ndim != o->ndim || (y && y->ndim != o->ndim)) return UNSUP;
    for (int d = 0; d < o->ndim; d++) if (x->sizes[d] != o->sizes[d] || (y && y->sizes[d] != o->sizes[d])) return UNSUP;
    dt_t od, xd, yd = {0, 0};
    int st;
    if ((st = tres(D, o, &od)) || (st = tres(D, x, &xd)) || (y && (st = tres(D, y, &yd)))) return st;
    if (!fl_numel(o)) return FL_OK;
    rows_t r;
    memset(&r, 0, sizeof r);
    const fl_tensor_t *ts[3] = {o, x, y ? y : x};
    int64_t base[3] = {od.off, xd.off, y ? yd.off : xd.off};
    r.nrows = 1;
    r.L = o->ndim ? o->sizes[dim] : 1;
    int on = 0;
    for (int d = 0; d < o->ndim; d++) {
        if (d == dim) { for (int k = 0; k < 3; k++) r.lst[k] = ts[k]->strides[d]; continue; }
        if (o->sizes[d] == 1) continue;
        r.osize[on] = o->sizes[d];
        for (int k = 0; k < 3; k++) r.ost[k][on] = ts[k]->strides[d];
        r.nrows *= o->sizes[d];
        on++;
    }
    r.ondim = on;
    for (int k = 0; k < 3; k++) r.off[k] = base[k] + ts[k]->offset;
    cl_mem ym = y ? yd.m : xd.m;
    int kd = kind;
    char prog[16];
    snprintf(prog, sizeof prog, "nn:%s", tname(o->dtype));
    karg_t a[5] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &xd.m}, {sizeof(cl_mem), &ym}, KA(r), KA(kd)};
    return launch1(D, s, prog, "softmax", 5, a, r.nrows);
}
static int softmax_k(KARGS, int kind) {
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || !fl_out_ok(out, n_out) || n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    if (n_args > 2 && args[2].kind == FL_ARG_BOOL && args[2].i) return UNSUP; /* half_to_float */
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) return fail(FL_ERR_INVALID, "softmax: dimension out of range");
    return softmax_run(D, stream, &out[0], x, NULL, dim, kind);
}
static int softmax_bw_k(KARGS, int kind) { /* (grad_output, output, dim, input_dtype) */
    DEV(device);
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *y = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!g || !y || !fl_out_ok(out, n_out) || n_args < 3 || args[2].kind != FL_ARG_INT) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[2].i, g->ndim, &dim)) return fail(FL_ERR_INVALID, "softmax backward: dimension out of range");
    return softmax_run(D, stream, &out[0], g, y, dim, kind);
}
int k_softmax(KARGS) { return softmax_k(PASS, 0); }
int k_log_softmax(KARGS) { return softmax_k(PASS, 1); }
int k_softmax_bw(KARGS) { return softmax_bw_k(PASS, 3); }
int k_log_softmax_bw(KARGS) { return softmax_bw_k(PASS, 4); }

/* ------------------------------------------------------------------ layer norm */
static int contig_of(dev_t_ *D, const fl_tensor_t *t, int dt, int64_t numel, dt_t *r) {
    if (!t) { r->m = NULL; r->off = 0; return FL_OK; }
    if (t->dtype != dt || !fl_is_contiguous(t) || fl_numel(t) != numel) return UNSUP;
    int st = tres(D, t, r);
    r->off += t->offset;
    return st;
}
int k_layer_norm(KARGS) { /* native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd) */
    DEV(device);
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in);
    if (!x || n_out < 3 || n_args < 5 || args[1].kind != FL_ARG_INT_LIST || !fl_arg_is_num(&args[4])) return UNSUP;
    int T = x->dtype;
    if (!is_flt(T) || !dt_ok(D, T)) return UNSUP;
    int nn = args[1].len;
    if (nn > x->ndim) return UNSUP;
    int64_t N = 1, total = fl_numel(x);
    for (int k = 0; k < nn; k++) N *= args[1].list[k];
    if (N == 0 || total % N) return UNSUP;
    int64_t M = total / N;
    const fl_tensor_t *w = fl_arg_tensor(args, n_args, 2, in, n_in), *b = fl_arg_tensor(args, n_args, 3, in, n_in);
    dt_t xd, od, md, rd, wd, bd;
    int st;
    if ((st = contig_of(D, x, T, total, &xd)) || (st = contig_of(D, &out[0], T, total, &od)) ||
        (st = contig_of(D, fl_out_at(out, n_out, 1), T, M, &md)) || (st = contig_of(D, fl_out_at(out, n_out, 2), T, M, &rd)) ||
        (st = contig_of(D, w, T, N, &wd)) || (st = contig_of(D, b, T, N, &bd)))
        return st;
    if (!M) return FL_OK;
    int flags = (w ? 1 : 0) | (b ? 2 : 0) | (md.m && rd.m ? 4 : 0);
    cl_mem mm = md.m ? md.m : od.m, rm = rd.m ? rd.m : od.m, wm = w ? wd.m : od.m, bm = b ? bd.m : od.m;
    real_t re;
    char prog[16];
    snprintf(prog, sizeof prog, "nn:%s", tname(T));
    karg_t a[16] = {{sizeof(cl_mem), &od.m}, {sizeof(cl_mem), &mm}, {sizeof(cl_mem), &rm}, {sizeof(cl_mem), &xd.m},
                    {sizeof(cl_mem), &wm}, {sizeof(cl_mem), &bm}, KA(xd.off), KA(od.off), KA(md.off), KA(rd.off),
                    KA(wd.off), KA(bd.off), KA(M), KA(N), ka_real(D, &re, fl_arg_num(&args[4])), KA(flags)};
    return launch1(D, stream, prog, "ln_fwd", 16, a, M);
}
int k_layer_norm_bw(KARGS) {
    /* native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask) */
    DEV(device);
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *x = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *mean = fl_arg_tensor(args, n_args, 3, in, n_in), *rstd = fl_arg_tensor(args, n_args, 4, in, n_in);
    const fl_tensor_t *w = fl_arg_tensor(args, n_args, 5, in, n_in);
    if (!g || !x || !mean || !rstd || n_args < 3 || args[2].kind != FL_ARG_INT_LIST) return UNSUP;
    int T = x->dtype;
    if (!is_flt(T) || !dt_ok(D, T) || g->dtype != T) return UNSUP;
    int64_t N = 1, total = fl_numel(x);
    for (int k = 0; k < args[2].len; k++) N *= args[2].list[k];
    if (N == 0 || total % N) return UNSUP;
    int64_t M = total / N;
    const fl_tensor_t *gi = fl_out_at(out, n_out, 0), *gw = fl_out_at(out, n_out, 1), *gb = fl_out_at(out, n_out, 2);
    dt_t gd, xd, md, rd, wd, gid, gwd, gbd;
    int st;
    if ((st = contig_of(D, g, T, total, &gd)) || (st = contig_of(D, x, T, total, &xd)) || (st = contig_of(D, mean, T, M, &md)) ||
        (st = contig_of(D, rstd, T, M, &rd)) || (st = contig_of(D, w, T, N, &wd)) || (st = contig_of(D, gi, T, total, &gid)) ||
        (st = contig_of(D, gw, T, N, &gwd)) || (st = contig_of(D, gb, T, N, &gbd)))
        return st;
    char prog[16];
    snprintf(prog, sizeof prog, "nn:%s", tname(T));
    if (gi && M) {
        int flags = w ? 1 : 0;
        cl_mem wm = w ? wd.m : gd.m;
        karg_t a[15] = {{sizeof(cl_mem), &gid.m}, {sizeof(cl_mem), &gd.m}, {sizeof(cl_mem), &xd.m}, {sizeof(cl_mem), &md.m},
                        {sizeof(cl_mem), &rd.m}, {sizeof(cl_mem), &wm}, KA(gid.off), KA(gd.off), KA(xd.off), KA(md.off),
                        KA(rd.off), KA(wd.off), KA(M), KA(N), KA(flags)};
        if ((st = launch1(D, stream, prog, "ln_bwd_in", 15, a, M))) return st;
    }
    if (gw || gb) {
        if (!M) { /* sums over no rows */
            if (gw && (st = fill_bits(D, stream, gw, 0))) return st;
            if (gb && (st = fill_bits(D, stream, gb, 0))) return st;
            return FL_OK;
        }
        int flags = (gw ? 1 : 0) | (gb ? 2 : 0);
        cl_mem wm = gw ? gwd.m : gbd.m, bm = gb ? gbd.m : gwd.m;
        karg_t a[15] = {{sizeof(cl_mem), &wm}, {sizeof(cl_mem), &bm}, {sizeof(cl_mem), &gd.m}, {sizeof(cl_mem), &xd.m},
                        {sizeof(cl_mem), &md.m}, {sizeof(cl_mem), &rd.m}, KA(gwd.off), KA(gbd.off), KA(gd.off), KA(xd.off),
                        KA(md.off), KA(rd.off), KA(M), KA(N), KA(flags)};
        if ((st = launch1(D, stream, prog, "ln_bwd_wb", 15, a, N))) return st;
    }
    return FL_OK;
}
