/* A test plugin "sloppydev" for the conformance checker: its add and mul kernels compute the right
 * values but write 4 and 64 floats past the end of their output (heap corruption in a real run),
 * its relu never returns, its neg is correct, and it leaves the optional RNG entry points NULL.
 * Kernels serve contiguous float32 tensors of one shape and decline anything else. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "fl_plugin.h"

static char msg[256];
static int count(int *n) { *n = 1; return FL_OK; }
static int props(int d, fl_device_props_t *p) {
    if (d != 0) { strcpy(msg, "sloppydev: one device"); return FL_ERR_INVALID; }
    memset(p, 0, sizeof *p);
    strcpy(p->name, "sloppy test device");
    p->total_memory = 64u << 20;
    p->dtypes = FL_DTYPE_BIT(FL_FLOAT32);
    return FL_OK;
}
static int dmalloc(int d, size_t n, void **p) {
    (void)d;
    if (n > (64u << 20)) { strcpy(msg, "sloppydev: out of memory"); return FL_ERR_OOM; }
    *p = malloc(n ? n : 1);
    return FL_OK;
}
static int dfree(int d, void *p) { (void)d; free(p); return FL_OK; }
static int cp(int d, void *dst, const void *src, size_t n, fl_stream_t s) {
    (void)d; (void)s;
    if (n && (!dst || !src)) { strcpy(msg, "sloppydev: NULL pointer"); return FL_ERR_INVALID; }
    memmove(dst, src, n);
    return FL_OK;
}

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
static int kcount(int *n) { *n = 4; return FL_OK; }
static int kget(int i, fl_kernel_entry_t *e) {
    if (i < 0 || i >= 4) { strcpy(msg, "sloppydev: no such kernel"); return FL_ERR_INVALID; }
    *e = table[i];
    return FL_OK;
}
static const char *last(void) { return msg; }

int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }
int fl_plugin_init(fl_plugin_t *p) {
    memset(p, 0, sizeof *p);
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = "sloppydev";
    p->vendor = "tests";
    p->version = "0";
    p->description = "test device whose kernels write out of bounds or hang";
    p->emulated = 1; /* never the "auto" choice of a test that points FL_PLUGIN_PATH at this folder */
    p->device_count = count;
    p->device_props = props;
    p->malloc = dmalloc;
    p->free = dfree;
    p->copy_h2d = cp;
    p->copy_d2h = cp;
    p->copy_d2d = cp;
    p->kernel_count = kcount;
    p->kernel_get = kget;
    p->last_error = last; /* rng_set_state / rng_get_state stay NULL: optional */
    return FL_OK;
}
