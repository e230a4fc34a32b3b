/* Helpers every plugin built from the host kernels links: the thread-local
 * error message and the strided iterator. The device entry points (memory,
 * copies, RNG, the kernel table) live in each plugin's own file: plugin.c for
 * the host plugin, ../emulated/device.c for the emulators. */
#include <errno.h>
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

/* ---- sizes and counts from the environment ----
 * torch_fl's Python side validates every FL_* variable before it loads a plugin and rewrites the
 * ones plugins read as plain integers (torch_fl/runtime/config.py), so in a torch_fl process these see
 * digits only. The grammar is the same as Python's for any other host: a number of bytes with an
 * optional binary K/M/G/T suffix and optional B/iB ("4096", "512M", "1.5G", "2 GiB"). A value
 * outside it is an error naming the variable, never a silent default. */
static int size_suffix(char c, uint64_t *unit) {
    switch (c) {
    case 'k': case 'K': *unit = 1ull << 10; return 1;
    case 'm': case 'M': *unit = 1ull << 20; return 1;
    case 'g': case 'G': *unit = 1ull << 30; return 1;
    case 't': case 'T': *unit = 1ull << 40; return 1;
    default: *unit = 1; return 0;
    }
}

int fl_host_parse_size(const char *text, uint64_t *out) {
    const char *p = text;
    unsigned __int128 whole = 0, frac = 0, scale = 1;
    int digits = 0;
    while (*p == ' ' || *p == '\t') p++;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        whole = whole * 10 + (unsigned)(*p - '0');
        if (whole > UINT64_MAX) return -1;
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, digits++)
            if (scale < 1000000000000000000ull) { frac = frac * 10 + (unsigned)(*p - '0'); scale *= 10; }
    }
    if (!digits) return -1;
    while (*p == ' ' || *p == '\t') p++;
    uint64_t unit;
    if (size_suffix(*p, &unit)) p++;
    if (unit > 1 && (*p == 'i' || *p == 'I')) p++;
    if (*p == 'b' || *p == 'B') p++;
    while (*p == ' ' || *p == '\t') p++;
    if (*p) return -1;
    unsigned __int128 v = whole * unit + frac * unit / scale;
    if (v > UINT64_MAX) return -1;
    *out = (uint64_t)v;
    return 0;
}

int fl_host_env_size(const char *name, uint64_t dflt, uint64_t *out) {
    const char *text = getenv(name);
    if (!text || !*text) { *out = dflt; return FL_OK; }
    if (fl_host_parse_size(text, out) || *out == 0)
        FL_FAIL(FL_ERR_INVALID, "%s='%s' is not a size: use a number of bytes greater than 0, optionally with a "
                "K, M, G or T suffix (512M, 2G)", name, text);
    return FL_OK;
}

int fl_host_env_count(const char *name, int dflt, int lo, int hi, const char *what, int *out) {
    const char *text = getenv(name);
    if (!text || !*text) { *out = dflt; return FL_OK; }
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    while (*end == ' ' || *end == '\t') end++;
    if (end == text || *end || errno || v < lo || v > hi)
        FL_FAIL(FL_ERR_INVALID, "%s='%s' is not valid: %s must be a whole number from %d to %d", name, text, what, lo,
                hi);
    *out = (int)v;
    return FL_OK;
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
