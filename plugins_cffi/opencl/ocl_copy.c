/* The OpenCL plugin: copy_, fill_, zero_, cat, arange, and the copies other files build on.
 * Shared declarations: ocl.h. */
#include "ocl.h"

/* ------------------------------------------------------------------ copy_, fill_, cat, arange */
static uint64_t val_bits(int dt, double v, int64_t iv, int isint) {
    uint64_t b = 0;
    switch (dt) {
    case FL_FLOAT32: { float f = isint ? (float)iv : (float)v; memcpy(&b, &f, 4); break; }
    case FL_FLOAT64: { double d = isint ? (double)iv : v; memcpy(&b, &d, 8); break; }
    case FL_INT64: { int64_t x = isint ? iv : (int64_t)v; memcpy(&b, &x, 8); break; }
    case FL_INT32: { int32_t x = (int32_t)(isint ? iv : (int64_t)v); memcpy(&b, &x, 4); break; }
    case FL_INT16: { int16_t x = (int16_t)(isint ? iv : (int64_t)v); memcpy(&b, &x, 2); break; }
    case FL_INT8: { int8_t x = (int8_t)(isint ? iv : (int64_t)v); memcpy(&b, &x, 1); break; }
    case FL_UINT8: { uint8_t x = (uint8_t)(isint ? iv : (int64_t)v); memcpy(&b, &x, 1); break; }
    case FL_BOOL: { uint8_t x = isint ? iv != 0 : v != 0; memcpy(&b, &x, 1); break; }
    case FL_FLOAT16: { uint16_t x = fl_f32_to_f16(isint ? (float)iv : (float)v); memcpy(&b, &x, 2); break; }
    }
    return b;
}
int fill_bits(dev_t_ *D, fl_stream_t s, const fl_tensor_t *o, uint64_t bits) {
    dt_t od;
    int st = tres(D, o, &od);
    if (st) return st;
    int64_t n = fl_numel(o);
    if (!n) return FL_OK;
    const fl_tensor_t *ts[1] = {o};
    int64_t base[1] = {od.off};
    walk_t w;
    mkwalk(&w, o->ndim, o->sizes, 1, ts, base);
    size_t isz = fl_itemsize(o->dtype);
    char kn[8];
    snprintf(kn, sizeof kn, "fl_%zu", isz);
    karg_t a[3] = {{sizeof(cl_mem), &od.m}, KA(w), {isz, &bits}};
    return launch1(D, s, "cvt", kn, 3, a, n);
}
int k_fill(KARGS) { /* fill_.Scalar(self, value) */
    (void)in; (void)n_in;
    DEV(device);
    const fl_tensor_t *o;
    int st = out0_store(D, out, n_out, &o);
    if (st) return st;
    if (n_args < 2 || !fl_arg_is_num(&args[1])) return UNSUP;
    return fill_bits(D, stream, o, val_bits(o->dtype, fl_arg_num(&args[1]), args[1].i, args[1].kind != FL_ARG_FLOAT));
}
int k_zero(KARGS) {
    (void)in; (void)n_in; (void)args; (void)n_args;
    DEV(device);
    const fl_tensor_t *o;
    int st = out0_store(D, out, n_out, &o);
    if (st) return st;
    return fill_bits(D, stream, o, 0);
}
/* dst = (dst dtype) src, src already broadcast to dst's shape; both resolved */
int copy_view(dev_t_ *D, fl_stream_t s, const fl_tensor_t *dst, const dt_t *dd, const fl_tensor_t *src, const dt_t *sd) {
    int64_t n = fl_numel(dst);
    if (!n) return FL_OK;
    const fl_tensor_t *ts[2] = {dst, src};
    int64_t base[2] = {dd->off, sd->off};
    walk_t w;
    mkwalk(&w, dst->ndim, dst->sizes, 2, ts, base);
    char kn[24];
    if (dst->dtype == src->dtype) snprintf(kn, sizeof kn, "cp_%zu", fl_itemsize(dst->dtype));
    else snprintf(kn, sizeof kn, "cv_%s_%s", tname(src->dtype), tname(dst->dtype));
    karg_t a[3] = {{sizeof(cl_mem), &dd->m}, {sizeof(cl_mem), &sd->m}, KA(w)};
    return launch1(D, s, "cvt", kn, 3, a, n);
}
void contig_strides(fl_tensor_t *t) {
    int64_t st = 1;
    for (int d = t->ndim - 1; d >= 0; d--) { t->strides[d] = st; st *= t->sizes[d]; }
}
int copy_any(dev_t_ *D, fl_stream_t s, const fl_tensor_t *dst, const fl_tensor_t *src0) {
    fl_tensor_t src;
    if (fl_bcast(src0, dst->ndim, dst->sizes, &src)) return UNSUP;
    if (!dt_store(D, dst->dtype) || !dt_store(D, src.dtype)) return UNSUP;
    dt_t dd, sd;
    int st;
    if ((st = tres(D, dst, &dd)) || (st = tres(D, &src, &sd))) return st;
    int64_t n = fl_numel(dst);
    if (!n) return FL_OK;
    if (dd.m == sd.m) {
        int same = dd.off + dst->offset == sd.off + src.offset;
        for (int d = 0; d < dst->ndim && same; d++) if (dst->sizes[d] > 1 && dst->strides[d] != src.strides[d]) same = 0;
        if (same && dst->dtype == src.dtype) return FL_OK;
        int64_t a0, a1, b0, b1;
        span_of(dst, &a0, &a1); span_of(&src, &b0, &b1);
        a0 += dd.off; a1 += dd.off; b0 += sd.off; b1 += sd.off;
        if (a0 <= b1 && b0 <= a1) { /* overlapping views: stage through a contiguous temporary */
            fl_tensor_t tmp = *dst;
            tmp.dtype = src.dtype; tmp.offset = 0;
            contig_strides(&tmp);
            dt_t td = {tmpbuf(D, (size_t)n * fl_itemsize(src.dtype), &st), 0};
            if (!td.m) return st;
            st = copy_view(D, s, &tmp, &td, &src, &sd);
            if (!st) st = copy_view(D, s, dst, &dd, &tmp, &td);
            cl.clReleaseMemObject(td.m);
            return st;
        }
    }
    return copy_view(D, s, dst, &dd, &src, &sd);
}
int k_copy(KARGS) { /* copy_(self, src, non_blocking) */
    DEV(device);
    const fl_tensor_t *o;
    int st = out0_store(D, out, n_out, &o);
    if (st) return st;
    if (n_args < 2) return UNSUP;
    if (fl_arg_is_num(&args[1])) return fill_bits(D, stream, o, val_bits(o->dtype, fl_arg_num(&args[1]), args[1].i, args[1].kind != FL_ARG_FLOAT));
    if (args[1].kind != FL_ARG_TENSOR || args[1].i < 0 || args[1].i >= n_in) return UNSUP;
    return copy_any(D, stream, o, &in[args[1].i]);
}
int k_cat(KARGS) { /* cat(tensors, dim) */
    DEV(device);
    if (n_args < 1 || args[0].kind != FL_ARG_TENSOR_LIST || !fl_out_ok(out, n_out)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (!dt_store(D, o->dtype) || o->ndim == 0) return UNSUP;
    int64_t first = args[0].i, cnt = args[0].len;
    if (first < 0 || first + cnt > n_in) return UNSUP;
    if (o->ndim == 1 && o->sizes[0] == 0) return FL_OK;
    int dim;
    if (fl_wrap_dim(n_args > 1 && args[1].kind == FL_ARG_INT ? args[1].i : 0, o->ndim, &dim)) return UNSUP;
    int64_t pos = 0;
    for (int64_t k = 0; k < cnt; k++) { /* check everything before queueing anything */
        const fl_tensor_t *t = &in[first + k];
        if (t->ndim == 1 && t->sizes[0] == 0 && o->ndim != 1) continue;
        if (t->ndim != o->ndim || !dt_store(D, t->dtype)) return UNSUP;
        for (int d = 0; d < o->ndim; d++) if (d != dim && t->sizes[d] != o->sizes[d]) return UNSUP;
        dt_t td; int st = tres(D, t, &td); if (st) return st;
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
        int st = copy_any(D, stream, &d, t);
        if (st) return st;
        pos += t->sizes[dim];
    }
    return FL_OK;
}
int k_arange(KARGS) { /* arange.start_step(start, end, step, dtype, layout, device, pin_memory) */
    (void)in; (void)n_in;
    DEV(device);
    const fl_tensor_t *o;
    int st = out0(D, out, n_out, &o);
    if (st) return st;
    if (o->ndim != 1 || n_args < 3 || !fl_arg_is_num(&args[0]) || !fl_arg_is_num(&args[2]) || o->dtype == FL_BOOL) return UNSUP;
    dt_t od;
    if ((st = tres(D, o, &od))) return st;
    int64_t n = o->sizes[0];
    const fl_tensor_t *ts[1] = {o};
    int64_t base[1] = {od.off};
    walk_t w;
    mkwalk(&w, 1, o->sizes, 1, ts, base);
    char prog[16];
    snprintf(prog, sizeof prog, "ew:%s", tname(o->dtype));
    if (is_flt(o->dtype)) {
        real_t r0, r1;
        karg_t a[4] = {{sizeof(cl_mem), &od.m}, KA(w), ka_real(D, &r0, fl_arg_num(&args[0])), ka_real(D, &r1, fl_arg_num(&args[2]))};
        return launch1(D, stream, prog, "a_arange", 4, a, n);
    }
    if (args[0].kind == FL_ARG_FLOAT || args[2].kind == FL_ARG_FLOAT) return UNSUP;
    int64_t s0 = args[0].i, s1 = args[2].i;
    karg_t a[4] = {{sizeof(cl_mem), &od.m}, KA(w), KA(s0), KA(s1)};
    return launch1(D, stream, prog, "a_arange", 4, a, n);
}
