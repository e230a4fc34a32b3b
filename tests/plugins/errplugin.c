/* A test plugin "errdev": host memory, one kernel that fails with a message,
 * one that declines every call. Used to test torch_fl's error paths. */
#include <stdlib.h>
#include <string.h>
#include "fl_plugin.h"

static char msg[256];
static int count(int *n) { *n = 1; return FL_OK; }
static int props(int d, fl_device_props_t *p) {
    memset(p, 0, sizeof *p);
    strcpy(p->name, "error test device");
    p->total_memory = 1 << 20;
    p->dtypes = FL_DTYPE_BIT(FL_FLOAT32);
    p->features = FL_FEATURE_HOST_ACCESSIBLE;
    return d == 0 ? FL_OK : FL_ERR_INVALID;
}
static int dmalloc(int d, size_t n, void **p) {
    (void)d;
    if (n > (1 << 20)) { strcpy(msg, "errdev holds 1 MiB"); return FL_ERR_OOM; }
    *p = calloc(1, n ? n : 1);
    return FL_OK;
}
static int dfree(int d, void *p) { (void)d; free(p); return FL_OK; }
static int cp(int d, void *dst, const void *src, size_t n, fl_stream_t s) { (void)d; (void)s; memmove(dst, src, n); return FL_OK; }
static int failing(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)i; (void)ni; (void)o; (void)no; (void)a; (void)na;
    strcpy(msg, "errdev: the multiplier unit is on fire");
    return FL_ERR_INTERNAL;
}
static int declining(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)i; (void)ni; (void)o; (void)no; (void)a; (void)na;
    return FL_ERR_UNSUPPORTED;
}
static const fl_kernel_entry_t table[] = {
    {"aten::mul.Tensor", FL_DTYPE_BIT(FL_FLOAT32), 0, failing},
    {"aten::add.Tensor", FL_DTYPE_BIT(FL_FLOAT32), 0, declining},
};
static int kcount(int *n) { *n = 2; return FL_OK; }
static int kget(int i, fl_kernel_entry_t *e) { *e = table[i]; return FL_OK; }
static const char *last(void) { return msg; }

int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }
int fl_plugin_init(fl_plugin_t *p) {
    memset(p, 0, sizeof *p);
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = "errdev";
    p->vendor = "tests";
    p->version = "0";
    p->description = "test device whose kernels fail";
    p->device_count = count;
    p->device_props = props;
    p->malloc = dmalloc;
    p->free = dfree;
    p->copy_h2d = cp;
    p->copy_d2h = cp;
    p->copy_d2d = cp;
    p->kernel_count = kcount;
    p->kernel_get = kget;
    p->last_error = last;
    return FL_OK;
}
