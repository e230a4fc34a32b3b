/* A test plugin "perturbdev": host memory and one kernel, aten::gelu (float32,
 * contiguous), whose result is 1 % too large. Everything else takes the CPU
 * fallback, so a model differs from CPU exactly where it applies GELU: the
 * alignment tool must name that layer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "fl_plugin.h"

static char msg[128];
static int count(int *n) { *n = 1; return FL_OK; }
static int props(int d, fl_device_props_t *p) {
    if (d != 0) { strcpy(msg, "one device"); return FL_ERR_INVALID; }
    memset(p, 0, sizeof *p);
    strcpy(p->name, "perturbed gelu device");
    p->total_memory = 1u << 30;
    p->dtypes = FL_DTYPE_BIT(FL_FLOAT32) | FL_DTYPE_BIT(FL_FLOAT64) | FL_DTYPE_BIT(FL_INT64) | FL_DTYPE_BIT(FL_BOOL);
    p->features = FL_FEATURE_HOST_ACCESSIBLE;
    return FL_OK;
}
static int dmalloc(int d, size_t n, void **p) { (void)d; *p = malloc(n ? n : 1); return *p ? FL_OK : FL_ERR_OOM; }
static int dfree(int d, void *p) { (void)d; free(p); return FL_OK; }
static int cp(int d, void *dst, const void *src, size_t n, fl_stream_t s) { (void)d; (void)s; memmove(dst, src, n); return FL_OK; }
static int gelu(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)no;
    if (ni != 1 || na < 2 || a[1].i != 0) return FL_ERR_UNSUPPORTED; /* exact gelu only */
    int64_t n = 1, st = 1;
    for (int k = i->ndim - 1; k >= 0; k--) {
        if (i->sizes[k] != 1 && (i->strides[k] != st || o->strides[k] != st)) return FL_ERR_UNSUPPORTED;
        st *= i->sizes[k];
        n *= i->sizes[k];
    }
    const float *x = (const float *)i->data + i->offset;
    float *y = (float *)o->data + o->offset;
    for (int64_t k = 0; k < n; k++) y[k] = 1.01f * 0.5f * x[k] * (1.0f + erff(x[k] * 0.70710678f));
    return FL_OK;
}
static const fl_kernel_entry_t table[] = {{"aten::gelu", FL_DTYPE_BIT(FL_FLOAT32), 0, gelu}};
static int kcount(int *n) { *n = 1; return FL_OK; }
static int kget(int i, fl_kernel_entry_t *e) { if (i != 0) return FL_ERR_INVALID; *e = table[0]; return FL_OK; }
static const char *last(void) { return msg; }

int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }
int fl_plugin_init(fl_plugin_t *p) {
    memset(p, 0, sizeof *p);
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = "perturbdev";
    p->vendor = "tests";
    p->version = "0";
    p->description = "test device whose gelu is 1% off";
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
