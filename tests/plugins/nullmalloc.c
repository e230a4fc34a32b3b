/* A test plugin "nulldev" whose malloc breaks the contract: it returns FL_OK with a NULL pointer
 * for any non-empty request. torch_fl must raise PluginError naming the plugin, never write
 * through the NULL. */
#include <stdlib.h>
#include <string.h>
#include "fl_plugin.h"

static char msg[256];
static int count(int *n) { *n = 1; return FL_OK; }
static int props(int d, fl_device_props_t *p) {
    memset(p, 0, sizeof *p);
    strcpy(p->name, "null malloc test device");
    p->total_memory = 1 << 20;
    p->dtypes = FL_DTYPE_BIT(FL_FLOAT32);
    return d == 0 ? FL_OK : FL_ERR_INVALID;
}
static int dmalloc(int d, size_t n, void **p) { (void)d; (void)n; *p = NULL; return FL_OK; }
static int dfree(int d, void *p) { (void)d; (void)p; return FL_OK; }
static int cp(int d, void *dst, const void *src, size_t n, fl_stream_t s) { (void)d; (void)s; memmove(dst, src, n); return FL_OK; }
static int kcount(int *n) { *n = 0; return FL_OK; }
static int kget(int i, fl_kernel_entry_t *e) { (void)i; (void)e; strcpy(msg, "nulldev: no kernels"); return FL_ERR_INVALID; }
static const char *last(void) { return msg; }

int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }
int fl_plugin_init(fl_plugin_t *p) {
    memset(p, 0, sizeof *p);
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = "nulldev";
    p->vendor = "tests";
    p->version = "0";
    p->description = "test device whose malloc returns NULL with FL_OK";
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
    p->last_error = last;
    return FL_OK;
}
