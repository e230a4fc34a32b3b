/* A test plugin "wrongdev" for the conformance checker: its add kernel
 * computes the wrong answer (a - b), its relu crashes the process, its mm
 * is listed twice, its memory accounting is honest, and its copies accept a
 * NULL pointer silently (a contract violation the checker must report). */
#include "stub_device.h"

static size_t used;
static int dmalloc(int d, size_t n, void **p) {
    (void)d;
    if (used + n > (64u << 20)) return stub_fail(FL_ERR_OOM, "out of memory");
    size_t *b = malloc(n + 16);
    b[0] = n;
    used += n;
    *p = b + 2;
    return FL_OK;
}
static int dfree(int d, void *p) { (void)d; if (p) { size_t *b = (size_t *)p - 2; used -= b[0]; free(b); } return FL_OK; }
static int mem(int d, uint64_t *b) { (void)d; *b = used; return FL_OK; }
static int cp(int d, void *dst, const void *src, size_t n, fl_stream_t s) {
    (void)d; (void)s;
    if (!dst || !src) return FL_OK; /* wrong: must be an error */
    memmove(dst, src, n);
    return FL_OK;
}
/* ABI v2's mem_set, one byte too far: the checker must see it */
static int fill_one_too_many(int d, void *dst, int value, size_t n, fl_stream_t s) {
    (void)d; (void)s;
    memset(dst, value, n + 1);
    return FL_OK;
}
static uint64_t seed, off;
static int rset(int d, uint64_t s, uint64_t o) { (void)d; seed = s; off = o; return FL_OK; }
static int rget(int d, uint64_t *s, uint64_t *o) { (void)d; *s = seed; *o = off; return FL_OK; }

static float *at(const fl_tensor_t *t) { return (float *)t->data + t->offset; }
/* add.Tensor for contiguous float32 of equal shape, computed wrong */
static int wrong_add(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)no; (void)a; (void)na;
    if (ni != 2) return FL_ERR_UNSUPPORTED;
    int64_t n = 1;
    for (int k = 0; k < o->ndim; k++) n *= o->sizes[k];
    for (int64_t k = 0; k < n; k++) {
        int64_t r = k, ia = 0, ib = 0, io = 0;
        for (int dd = o->ndim - 1; dd >= 0; dd--) {
            int64_t idx = r % o->sizes[dd];
            r /= o->sizes[dd];
            ia += idx * i[0].strides[dd]; ib += idx * i[1].strides[dd]; io += idx * o->strides[dd];
        }
        at(o)[io] = at(&i[0])[ia] - at(&i[1])[ib];
    }
    return FL_OK;
}
static int crashing(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)i; (void)ni; (void)o; (void)no; (void)a; (void)na;
    volatile int *null = NULL;
    return *null;
}
static int failing(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)i; (void)ni; (void)o; (void)no; (void)a; (void)na;
    return stub_fail(FL_ERR_INTERNAL, "mm unit offline");
}
static const fl_kernel_entry_t table[] = {
    {"aten::add.Tensor", FL_DTYPE_BIT(FL_FLOAT32), 0, wrong_add},
    {"aten::relu", FL_DTYPE_BIT(FL_FLOAT32), 0, crashing},
    {"aten::mm", FL_DTYPE_BIT(FL_FLOAT32), 0, failing},
    {"aten::mm", FL_DTYPE_BIT(FL_FLOAT32), 0, failing},
};
static const stub_spec_t spec = {
    .name = "wrongdev", .description = "test device whose kernels are wrong", .device_name = "wrong answers device",
    .memory = 64u << 20, .dtypes = FL_DTYPE_BIT(FL_FLOAT32), .kernels = table, .n_kernels = 4,
};

int fl_plugin_init(fl_plugin_t *p) {
    stub_init(p, &spec);
    p->malloc = dmalloc;
    p->free = dfree;
    p->memory_used = mem;
    p->copy_h2d = cp;
    p->copy_d2h = cp;
    p->copy_d2d = cp;
    p->mem_set = fill_one_too_many;
    p->rng_set_state = rset;
    p->rng_get_state = rget;
    return FL_OK;
}
