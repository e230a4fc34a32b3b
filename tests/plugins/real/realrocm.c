/* Stands in for a vendor's real "rocm" plugin (emulated = 0), to test that a
 * real plugin takes precedence over torch_fl's emulator of the same name.
 * Host memory, one kernel (aten::add.Tensor, contiguous float32). */
#include "stub_device.h"

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
static const stub_spec_t spec = {
    .name = "rocm", .description = "test stand-in for a vendor's real rocm plugin",
    .device_name = "stand-in for a real ROCm device", .memory = 1u << 30, .dtypes = FL_DTYPE_BIT(FL_FLOAT32),
    .features = FL_FEATURE_HOST_ACCESSIBLE, .emulated = 0, .kernels = table, .n_kernels = 1,
};

int fl_plugin_init(fl_plugin_t *p) {
    stub_init(p, &spec);
    p->vendor = "tests (stand-in for AMD)";
    p->version = "9.9";
    return FL_OK;
}
