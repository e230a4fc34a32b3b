/* A test plugin "wrongdev" for the conformance checker: its add kernel
 * computes the wrong answer (a - b), its relu crashes the process, its mm
 * is listed twice, its memory accounting is honest, and its copies accept a
 * NULL pointer silently (a contract violation the checker must report). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "fl_plugin.h"

static char msg[256];
static size_t used;
static int count(int *n) { *n = 1; return FL_OK; }
static int props(int d, fl_device_props_t *p) {
    if (d != 0) { strcpy(msg, "wrongdev: one device"); return FL_ERR_INVALID; }
    memset(p, 0, sizeof *p);
    strcpy(p->name, "wrong answers device");
    p->total_memory = 64u << 20;
    p->dtypes = FL_DTYPE_BIT(FL_FLOAT32);
    return FL_OK;
}
static int dmalloc(int d, size_t n, void **p) {
    (void)d;
    if (used + n > (64u << 20)) { strcpy(msg, "wrongdev: out of memory"); return FL_ERR_OOM; }
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
    strcpy(msg, "wrongdev: mm unit offline");
    return FL_ERR_INTERNAL;
}
static const fl_kernel_entry_t table[] = {
    {"aten::add.Tensor", FL_DTYPE_BIT(FL_FLOAT32), 0, wrong_add},
    {"aten::relu", FL_DTYPE_BIT(FL_FLOAT32), 0, crashing},
    {"aten::mm", FL_DTYPE_BIT(FL_FLOAT32), 0, failing},
    {"aten::mm", FL_DTYPE_BIT(FL_FLOAT32), 0, failing},
};
static int kcount(int *n) { *n = 4; return FL_OK; }
static int kget(int i, fl_kernel_entry_t *e) { *e = table[i]; return FL_OK; }
static const char *last(void) { return msg; }

int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }
int fl_plugin_init(fl_plugin_t *p) {
    memset(p, 0, sizeof *p);
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = "wrongdev";
    p->vendor = "tests";
    p->version = "0";
    p->description = "test device whose kernels are wrong";
    p->device_count = count;
    p->device_props = props;
    p->malloc = dmalloc;
    p->free = dfree;
    p->memory_used = mem;
    p->copy_h2d = cp;
    p->copy_d2h = cp;
    p->copy_d2d = cp;
    p->mem_set = fill_one_too_many;
    p->rng_set_state = rset;
    p->rng_get_state = rget;
    p->kernel_count = kcount;
    p->kernel_get = kget;
    p->last_error = last;
    return FL_OK;
}
