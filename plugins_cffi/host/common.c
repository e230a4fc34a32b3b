/* Helpers every plugin built from the host kernels links: the thread-local
 * error message and the strided iterator. The device entry points (memory,
 * copies, RNG, the kernel table) live in each plugin's own file: plugin.c for
 * the host plugin, ../emulated/device.c for the emulators. */
#include "fl_host.h"

static _Thread_local char last_error[512];

void fl_host_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}
const char *fl_host_last_error(void) { return last_error; }

/* ---- iterator ---- */
void fl_iter_init(fl_iter_t *it, int ntensor, const fl_tensor_t *const *ts) {
    const fl_tensor_t *t0 = ts[0];
    int64_t sizes[FL_MAX_DIMS], strides[FL_ITER_MAX][FL_MAX_DIMS];
    int nd = 0;
    int64_t numel = 1;
    it->ntensor = ntensor;
    for (int k = 0; k < ntensor; k++) it->offset[k] = ts[k]->offset;
    for (int d = 0; d < t0->ndim; d++) {
        numel *= t0->sizes[d];
        if (t0->sizes[d] == 1) continue; /* size-1 dims never move the pointer */
        sizes[nd] = t0->sizes[d];
        for (int k = 0; k < ntensor; k++) strides[k][nd] = ts[k]->strides[d];
        nd++;
    }
    /* coalesce from the innermost dim outwards */
    int m = 0;
    for (int d = 0; d < nd; d++) {
        if (m > 0) {
            int ok = 1;
            for (int k = 0; k < ntensor; k++)
                if (strides[k][m - 1] != strides[k][d] * sizes[d]) { ok = 0; break; }
            if (ok) {
                sizes[m - 1] *= sizes[d];
                for (int k = 0; k < ntensor; k++) strides[k][m - 1] = strides[k][d];
                continue;
            }
        }
        sizes[m] = sizes[d];
        for (int k = 0; k < ntensor; k++) strides[k][m] = strides[k][d];
        m++;
    }
    if (m == 0) { /* scalar or all size-1 */
        it->ndim = 0; it->inner = 1; it->outer = numel == 0 ? 0 : 1;
        for (int k = 0; k < ntensor; k++) it->inner_stride[k] = 0;
        return;
    }
    it->inner = sizes[m - 1];
    for (int k = 0; k < ntensor; k++) it->inner_stride[k] = strides[k][m - 1];
    it->ndim = m - 1;
    it->outer = numel == 0 ? 0 : 1;
    for (int d = 0; d < m - 1; d++) {
        it->sizes[d] = sizes[d];
        it->outer *= sizes[d];
        for (int k = 0; k < ntensor; k++) it->strides[k][d] = strides[k][d];
    }
    if (numel == 0) it->inner = 0;
}

