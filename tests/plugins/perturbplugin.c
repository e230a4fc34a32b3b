/* A test plugin "perturbdev": host memory and one kernel, aten::gelu (float32,
 * contiguous), whose result is 1 % too large. Everything else takes the CPU
 * fallback, so a model differs from CPU exactly where it applies GELU: the
 * alignment tool must name that layer. */
#include <math.h>

#include "stub_device.h"

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
static const stub_spec_t spec = {
    .name = "perturbdev", .description = "test device whose gelu is 1% off", .device_name = "perturbed gelu device",
    .memory = 1u << 30,
    .dtypes = FL_DTYPE_BIT(FL_FLOAT32) | FL_DTYPE_BIT(FL_FLOAT64) | FL_DTYPE_BIT(FL_INT64) | FL_DTYPE_BIT(FL_BOOL),
    .features = FL_FEATURE_HOST_ACCESSIBLE, .kernels = table, .n_kernels = 1,
};

int fl_plugin_init(fl_plugin_t *p) { return stub_init(p, &spec); }
