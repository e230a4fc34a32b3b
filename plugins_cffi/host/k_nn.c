/* Host kernels: nn (see the group's header comment once it has kernels). */
#include "fl_host.h"

static const fl_kernel_entry_t entries[] = {
    {NULL, 0, 0, NULL},
};

const fl_kernel_group_t fl_host_group_nn = {entries, 0};
