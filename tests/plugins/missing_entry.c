/* Right ABI, but leaves required entry points NULL. */
#include <string.h>
#include "fl_plugin.h"
int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }
int fl_plugin_init(fl_plugin_t *p) {
    memset(p, 0, sizeof *p);
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = "halfdone";
    return FL_OK;
}
