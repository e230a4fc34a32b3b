/* Helpers every plugin built from the host kernels links: the thread-local
 * error message and the strided iterator. The device entry points (memory,
 * copies, RNG, the kernel table) live in each plugin's own file: plugin.c for
 * the host plugin, ../emulated/device.c for the emulators. */
#include <stdlib.h>

#include "fl_host.h"

static _Thread_local char last_error[512];

void fl_host_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}
const char *fl_host_last_error(void) { return last_error; }

/* ---- "4G", "512M", "64K" or bytes, from an environment variable; dflt when unset or not positive ---- */
uint64_t fl_host_parse_bytes(const char *text, uint64_t dflt) {
    if (!text || !*text) return dflt;
    char *end;
    double v = strtod(text, &end);
    if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024.0 * 1024.0;
    else if (*end == 'M' || *end == 'm') v *= 1024.0 * 1024.0;
    else if (*end == 'K' || *end == 'k') v *= 1024.0;
    return v > 0 ? (uint64_t)v : dflt;
}

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


/* ---- dtype conversion of one strided row (the elementwise and reduction kernels' shared loop) ---- */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_MV __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FL_MV
#endif

#define LD_ID(v) (v)
#define ST_F32(x) ((float)(x))
#define ST_F64(x) ((double)(x))
#define ST_F16(x) fl_f32_to_f16((float)(x))
#define ST_BF16(x) fl_f32_to_bf16((float)(x))
#define ST_I64(x) ((int64_t)(x))
#define ST_I32(x) ((int32_t)(x))
#define ST_I16(x) ((int16_t)(x))
#define ST_I8(x) ((int8_t)(x))
#define ST_U8(x) ((uint8_t)(x))
#define ST_B(x) ((uint8_t)((x) != 0))

#define CVT_LOOP(DT, STORE, SRT, LOAD)                                              \
    {                                                                               \
        DT *restrict d_ = (DT *)dst;                                                \
        const SRT *restrict s_ = (const SRT *)src;                                  \
        if (ds == 1 && ss == 1) {                                                   \
            for (int64_t i = 0; i < n; i++) d_[i] = STORE(LOAD(s_[i]));             \
        } else if (ss == 0) {                                                       \
            DT v_ = STORE(LOAD(s_[0]));                                             \
            for (int64_t i = 0; i < n; i++) d_[i * ds] = v_;                        \
        } else {                                                                    \
            for (int64_t i = 0; i < n; i++) d_[i * ds] = STORE(LOAD(s_[i * ss]));   \
        }                                                                           \
    }                                                                               \
    break;

#define CVT_SRC_SWITCH(DT, STORE)                                        \
    switch (sd) {                                                        \
    case FL_FLOAT32: CVT_LOOP(DT, STORE, float, LD_ID)                   \
    case FL_FLOAT64: CVT_LOOP(DT, STORE, double, LD_ID)                  \
    case FL_FLOAT16: CVT_LOOP(DT, STORE, uint16_t, fl_f16_to_f32)        \
    case FL_BFLOAT16: CVT_LOOP(DT, STORE, uint16_t, fl_bf16_to_f32)      \
    case FL_INT64: CVT_LOOP(DT, STORE, int64_t, LD_ID)                   \
    case FL_INT32: CVT_LOOP(DT, STORE, int32_t, LD_ID)                   \
    case FL_INT16: CVT_LOOP(DT, STORE, int16_t, LD_ID)                   \
    case FL_INT8: CVT_LOOP(DT, STORE, int8_t, LD_ID)                     \
    case FL_UINT8: CVT_LOOP(DT, STORE, uint8_t, LD_ID)                   \
    case FL_BOOL: CVT_LOOP(DT, STORE, uint8_t, LD_ID)                    \
    }                                                                    \
    break;

/* dst[i*ds] = (dd) src[i*ss], i < n; strides in elements */
FL_MV void fl_cvt_row(int dd, void *dst, int64_t ds, int sd, const void *src, int64_t ss, int64_t n) {
    if (n <= 0) return;
    if (dd == sd && ds == 1 && ss == 1) { memmove(dst, src, (size_t)n * fl_itemsize(dd)); return; }
    if (dd == sd && dd != FL_BOOL) { /* same dtype, strided: move bits */
        switch (fl_itemsize(dd)) {
        case 8: { uint64_t *d_ = dst; const uint64_t *s_ = src; for (int64_t i = 0; i < n; i++) d_[i * ds] = s_[i * ss]; return; }
        case 4: { uint32_t *d_ = dst; const uint32_t *s_ = src; for (int64_t i = 0; i < n; i++) d_[i * ds] = s_[i * ss]; return; }
        case 16: { uint64_t *d_ = dst; const uint64_t *s_ = src;
                   for (int64_t i = 0; i < n; i++) { d_[2 * i * ds] = s_[2 * i * ss]; d_[2 * i * ds + 1] = s_[2 * i * ss + 1]; }
                   return; }
        case 2: { uint16_t *d_ = dst; const uint16_t *s_ = src; for (int64_t i = 0; i < n; i++) d_[i * ds] = s_[i * ss]; return; }
        default: { uint8_t *d_ = dst; const uint8_t *s_ = src; for (int64_t i = 0; i < n; i++) d_[i * ds] = s_[i * ss]; return; }
        }
    }
    if (fl_is_complex(dd) || fl_is_complex(sd)) { /* complex on either side: through a pair of doubles */
        size_t di = fl_itemsize(dd), si = fl_itemsize(sd);
        for (int64_t i = 0; i < n; i++)
            fl_store_cx(dd, (char *)dst + i * ds * (int64_t)di, fl_load_cx(sd, (const char *)src + i * ss * (int64_t)si));
        return;
    }
    switch (dd) {
    case FL_FLOAT32: CVT_SRC_SWITCH(float, ST_F32)
    case FL_FLOAT64: CVT_SRC_SWITCH(double, ST_F64)
    case FL_FLOAT16: CVT_SRC_SWITCH(uint16_t, ST_F16)
    case FL_BFLOAT16: CVT_SRC_SWITCH(uint16_t, ST_BF16)
    case FL_INT64: CVT_SRC_SWITCH(int64_t, ST_I64)
    case FL_INT32: CVT_SRC_SWITCH(int32_t, ST_I32)
    case FL_INT16: CVT_SRC_SWITCH(int16_t, ST_I16)
    case FL_INT8: CVT_SRC_SWITCH(int8_t, ST_I8)
    case FL_UINT8: CVT_SRC_SWITCH(uint8_t, ST_U8)
    case FL_BOOL: CVT_SRC_SWITCH(uint8_t, ST_B)
    }
}
