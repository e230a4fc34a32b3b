/* Claims an ABI version torch_fl does not speak. */
#include "fl_plugin.h"
int fl_plugin_abi_version(void) { return 99; }
int fl_plugin_init(fl_plugin_t *p) { (void)p; return FL_OK; }
