/* Exports the version symbol but no fl_plugin_init. */
#include "fl_plugin.h"
int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }
