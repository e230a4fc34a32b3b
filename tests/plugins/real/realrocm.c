/* Stands in for a vendor's real "rocm" plugin (emulated = 0), to test that a
 * real plugin takes precedence over torch_fl's emulator of the same name.
 * Host memory, one kernel (aten::add.Tensor, contiguous float32). */
#include <stdlib.h>
#include <string.h>
#include "fl_plugin.h"

static char msg[128];
static int count(int *n) { *n = 1; return FL_OK; }
static int props(int d, fl_device_props_t *p) {
    if (d != 0) { strcpy(msg, "one device"); return FL_ERR_INVALID; }
    memset(p, 0, sizeof *p);
    strcpy(p->name, "stand-in for a real ROCm device");
    p->total_memory = 1u << 30;
    p->dtypes = FL_DTYPE_BIT(FL_FLOAT32);
    p->features = FL_FEATURE_HOST_ACCESSIBLE;
    return FL_OK;
}
static int dmalloc(int d, size_t n, void **p) { (void)d; *p = malloc(n ? n : 1); return *p ? FL_OK : FL_ERR_OOM; }
static int dfree(int d, void *p) { (void)d; free(p); return FL_OK; }
static int cp(int d, void *dst, const void *src, size_t n, fl_stream_t s) { (void)d; (void)s; memmove(dst, src, n); return FL_OK; }
static int add(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)no; (void)na;
    if (ni != 2 || a[2].kind != FL_ARG_INT || a[2].i != 1) return FL_ERR_UNSUPPORTED;
    int64_t n = 1;
    for (int k = 0; k < o->ndim; k++) n *= o->sizes[k];
    for (int t = 0; t < 2; t++) {  /* contiguous only */
        int64_t st = 1;
        for (int k = i[t].ndim - 1; k >= 0; k--) { if (i[t].sizes[k] != 1 && i[t].strides[k] != st) return FL_ERR_UNSUPPORTED; st *= i[t].sizes[k]; }
    }
    const float *x = (const float *)i[0].data + i[0].offset, *y = (const float *)i[1].data + i[1].offset;
    float *z = (float *)o->data + o->offset;
    for (int64_t k = 0; k < n; k++) z[k] = x[k] + y[k];
    return FL_OK;
}
static const fl_kernel_entry_t table[] = {{"aten::add.Tensor", FL_DTYPE_BIT(FL_FLOAT32), 0, add}};
static int kcount(int *n) { *n = 1; return FL_OK; }
static int kget(int i, fl_kernel_entry_t *e) { if (i != 0) return FL_ERR_INVALID; *e = table[0]; return FL_OK; }
static const char *last(void) { return msg; }

int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }
int fl_plugin_init(fl_plugin_t *p) {
    memset(p, 0, sizeof *p);
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = "rocm";
    p->vendor = "tests (stand-in for AMD)";
    p->version = "9.9";
    p->description = "test stand-in for a vendor's real rocm plugin";
    p->emulated = 0;
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
