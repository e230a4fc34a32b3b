/* A test plugin "sloppydev" for the conformance checker: its add and mul kernels compute the right
 * values but write 4 and 64 floats past the end of their output (heap corruption in a real run),
 * its relu never returns, its neg is correct, and it leaves the optional RNG entry points NULL.
 * Kernels serve contiguous float32 tensors of one shape and decline anything else. */
#include <unistd.h>

#include "stub_device.h"

static int64_t numel(const fl_tensor_t *t) {
    int64_t n = 1;
    for (int k = 0; k < t->ndim; k++) n *= t->sizes[k];
    return n;
}
static int contiguous(const fl_tensor_t *t) {
    int64_t acc = 1;
    for (int k = t->ndim - 1; k >= 0; k--) {
        if (t->sizes[k] != 1 && t->strides[k] != acc) return 0;
        acc *= t->sizes[k];
    }
    return t->dtype == FL_FLOAT32;
}
static float *at(const fl_tensor_t *t) { return (float *)t->data + t->offset; }
/* the shared body: out = f(a, b) elementwise, then `extra` floats written past the end */
static int elementwise(const fl_tensor_t *i, int ni, const fl_tensor_t *o, int op, int extra) {
    if (ni < 1 || !contiguous(o)) return FL_ERR_UNSUPPORTED;
    int64_t n = numel(o);
    for (int k = 0; k < ni; k++)
        if (!contiguous(&i[k]) || numel(&i[k]) != n) return FL_ERR_UNSUPPORTED;
    for (int64_t k = 0; k < n; k++) {
        float a = at(&i[0])[k], b = ni > 1 ? at(&i[1])[k] : 0.0f;
        at(o)[k] = op == 0 ? a + b : (op == 1 ? a * b : -a);
    }
    for (int k = 0; k < extra; k++) at(o)[n + k] = 12345.0f; /* the bug under test */
    return FL_OK;
}
static int add_over4(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no,
                     const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)no; (void)na;
    if (na > 2 && a[2].kind == FL_ARG_FLOAT && a[2].f != 1.0) return FL_ERR_UNSUPPORTED; /* alpha */
    if (na > 2 && a[2].kind == FL_ARG_INT && a[2].i != 1) return FL_ERR_UNSUPPORTED;
    return elementwise(i, ni, o, 0, 4);
}
static int mul_over64(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no,
                      const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)no; (void)a; (void)na;
    return elementwise(i, ni, o, 1, 64);
}
static int neg_ok(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no,
                  const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)no; (void)a; (void)na;
    return elementwise(i, ni, o, 2, 0);
}
static int relu_hangs(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no,
                      const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)i; (void)ni; (void)o; (void)no; (void)a; (void)na;
    for (;;) sleep(1);
    return FL_OK; /* never reached */
}
static const fl_kernel_entry_t table[] = {
    {"aten::add.Tensor", FL_DTYPE_BIT(FL_FLOAT32), 0, add_over4},
    {"aten::mul.Tensor", FL_DTYPE_BIT(FL_FLOAT32), 0, mul_over64},
    {"aten::relu", FL_DTYPE_BIT(FL_FLOAT32), 0, relu_hangs},
    {"aten::neg", FL_DTYPE_BIT(FL_FLOAT32), 0, neg_ok},
};
static const stub_spec_t spec = {
    .name = "sloppydev", .description = "test device whose kernels write out of bounds or hang",
    .device_name = "sloppy test device", .memory = 64u << 20, .dtypes = FL_DTYPE_BIT(FL_FLOAT32),
    .emulated = 1, /* never the "auto" choice of a test that points FL_PLUGIN_PATH at this folder */
    .kernels = table, .n_kernels = 4,
};

/* rng_set_state / rng_get_state stay NULL: optional */
int fl_plugin_init(fl_plugin_t *p) { return stub_init(p, &spec); }
