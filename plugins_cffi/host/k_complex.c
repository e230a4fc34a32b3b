/* Host kernels: pointwise arithmetic with a complex result (complex64 or complex128).
 *
 * k_elementwise.c's add/sub/mul/div/neg kernels hand a call here when their output is
 * complex (the kernel table names each op once); _conj_physical and conj_physical_ come
 * only here. Operands may be complex or real tensors of any dtype (a real one reads as
 * (x, 0), which is PyTorch's promotion) or real scalars; a complex Python scalar reaches
 * a kernel as FL_ARG_OTHER, which is declined (the runtime then takes another tier).
 * Values are computed in double and stored in the output's dtype.
 */
#include "fl_host.h"

#define UNSUP FL_ERR_UNSUPPORTED

static fl_cx_t cx_div(fl_cx_t a, fl_cx_t b) { /* Smith's algorithm: no overflow for large |b| */
    if (fabs(b.re) >= fabs(b.im)) {
        if (b.re == 0.0 && b.im == 0.0) return (fl_cx_t){a.re / 0.0, a.im / 0.0};
        double r = b.im / b.re, d = b.re + b.im * r;
        return (fl_cx_t){(a.re + a.im * r) / d, (a.im - a.re * r) / d};
    }
    double r = b.re / b.im, d = b.im + b.re * r;
    return (fl_cx_t){(a.re * r + a.im) / d, (a.im * r - a.re) / d};
}

/* Broadcast t to o's shape (right-aligned); -1 when it does not broadcast. */
static int bcast_to(const fl_tensor_t *t, const fl_tensor_t *o, fl_tensor_t *r) {
    if (t->ndim < 0 || t->ndim > o->ndim) return -1;
    *r = *t;
    r->ndim = o->ndim;
    int lead = o->ndim - t->ndim;
    for (int d = 0; d < o->ndim; d++) {
        int64_t sz = d < lead ? 1 : t->sizes[d - lead], st = d < lead ? 0 : t->strides[d - lead];
        if (sz == o->sizes[d]) r->strides[d] = sz == 1 ? 0 : st;
        else if (sz == 1) r->strides[d] = 0;
        else return -1;
        r->sizes[d] = o->sizes[d];
    }
    return 0;
}

/* An operand: a tensor broadcast to the output, or a real scalar as a zero-stride double. */
static int operand(const fl_arg_t *a, const fl_tensor_t *in, int n_in, const fl_tensor_t *out, double *scalar,
                   fl_tensor_t *t) {
    if (a->kind == FL_ARG_TENSOR) {
        if (a->i < 0 || a->i >= n_in || bcast_to(&in[a->i], out, t)) return -1;
        return 0;
    }
    if (a->kind == FL_ARG_INT || a->kind == FL_ARG_BOOL) *scalar = (double)a->i;
    else if (a->kind == FL_ARG_FLOAT) *scalar = a->f;
    else return -1; /* a complex scalar, or anything else */
    fl_tensor_t s = {.data = scalar, .offset = 0, .dtype = FL_FLOAT64, .ndim = 0};
    return bcast_to(&s, out, t);
}

int fl_host_complex_pointwise(int op, fl_stream_t stream, int device, const fl_tensor_t *in, int n_in,
                              const fl_tensor_t *out, int n_out, const fl_arg_t *args, int n_args) {
    (void)stream; (void)device;
    if (n_out < 1 || out[0].ndim < 0 || out[0].ndim > FL_MAX_DIMS || !fl_is_complex(out[0].dtype)) return UNSUP;
    const fl_tensor_t *o = &out[0];
    int binary = op == FL_CX_ADD || op == FL_CX_SUB || op == FL_CX_MUL || op == FL_CX_DIV;
    if (n_args < (binary ? 2 : 1)) return UNSUP;
    double sa = 0, sb = 0, alpha = 1.0;
    fl_tensor_t a, b;
    if (operand(&args[0], in, n_in, o, &sa, &a)) return UNSUP;
    if (binary && operand(&args[1], in, n_in, o, &sb, &b)) return UNSUP;
    if ((op == FL_CX_ADD || op == FL_CX_SUB) && n_args >= 3 && args[2].kind != FL_ARG_NONE) {
        if (args[2].kind == FL_ARG_FLOAT) alpha = args[2].f;
        else if (args[2].kind == FL_ARG_INT || args[2].kind == FL_ARG_BOOL) alpha = (double)args[2].i;
        else return UNSUP; /* complex alpha */
    }
    if (fl_numel(o) == 0) return FL_OK;
    fl_iter_t it;
    const fl_tensor_t *ts[3] = {o, &a, &b};
    fl_iter_init(&it, binary ? 3 : 2, ts);
    size_t io = fl_itemsize(o->dtype), ia = fl_itemsize(a.dtype), ib = binary ? fl_itemsize(b.dtype) : 0;
#pragma omp parallel for schedule(static) if (it.outer * it.inner >= 32768)
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, r, base);
        for (int64_t i = 0; i < it.inner; i++) {
            fl_cx_t x = fl_load_cx(a.dtype, (const char *)a.data + (base[1] + i * it.inner_stride[1]) * (int64_t)ia);
            fl_cx_t y = {0, 0}, z;
            if (binary)
                y = fl_load_cx(b.dtype, (const char *)b.data + (base[2] + i * it.inner_stride[2]) * (int64_t)ib);
            switch (op) {
            case FL_CX_ADD: z = (fl_cx_t){x.re + alpha * y.re, x.im + alpha * y.im}; break;
            case FL_CX_SUB: z = (fl_cx_t){x.re - alpha * y.re, x.im - alpha * y.im}; break;
            case FL_CX_MUL: z = (fl_cx_t){x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re}; break;
            case FL_CX_DIV: z = cx_div(x, y); break;
            case FL_CX_NEG: z = (fl_cx_t){-x.re, -x.im}; break;
            default: z = (fl_cx_t){x.re, -x.im}; break; /* FL_CX_CONJ */
            }
            fl_store_cx(o->dtype, (char *)o->data + (base[0] + i * it.inner_stride[0]) * (int64_t)io, z);
        }
    }
    return FL_OK;
}
