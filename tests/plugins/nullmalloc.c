/* A test plugin "nulldev" whose malloc breaks the contract: it returns FL_OK with a NULL pointer
 * for any non-empty request. torch_fl must raise PluginError naming the plugin, never write
 * through the NULL. */
#include "stub_device.h"

static int null_malloc(int d, size_t n, void **p) { (void)d; (void)n; *p = NULL; return FL_OK; }
static int no_free(int d, void *p) { (void)d; (void)p; return FL_OK; }
static const stub_spec_t spec = {
    .name = "nulldev", .description = "test device whose malloc returns NULL with FL_OK",
    .device_name = "null malloc test device", .memory = 1 << 20, .dtypes = FL_DTYPE_BIT(FL_FLOAT32),
    .emulated = 1, /* never the "auto" choice of a test that points FL_PLUGIN_PATH at this folder */
};

int fl_plugin_init(fl_plugin_t *p) {
    stub_init(p, &spec);
    p->malloc = null_malloc;
    p->free = no_free;
    return FL_OK;
}
