/* A test plugin "errdev": host memory, one kernel that fails with a message,
 * one that declines every call. Used to test torch_fl's error paths. */
#include "stub_device.h"

static int failing(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)i; (void)ni; (void)o; (void)no; (void)a; (void)na;
    return stub_fail(FL_ERR_INTERNAL, "the multiplier unit is on fire");
}
static int declining(fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no, const fl_arg_t *a, int na) {
    (void)s; (void)d; (void)i; (void)ni; (void)o; (void)no; (void)a; (void)na;
    return FL_ERR_UNSUPPORTED;
}
static const fl_kernel_entry_t table[] = {
    {"aten::mul.Tensor", FL_DTYPE_BIT(FL_FLOAT32), 0, failing},
    {"aten::add.Tensor", FL_DTYPE_BIT(FL_FLOAT32), 0, declining},
};
static const stub_spec_t spec = {
    .name = "errdev", .description = "test device whose kernels fail", .device_name = "error test device",
    .memory = 1 << 20, .oom = "errdev holds 1 MiB", .dtypes = FL_DTYPE_BIT(FL_FLOAT32),
    .features = FL_FEATURE_HOST_ACCESSIBLE, .kernels = table, .n_kernels = 2,
};

int fl_plugin_init(fl_plugin_t *p) { return stub_init(p, &spec); }
