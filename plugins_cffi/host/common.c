/* Helpers every plugin built from the host kernels links: the thread-local
 * error message, sizes and counts from the environment, and fl_cvt_row. The device entry points (memory,
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
 * digits only. The grammar is the same as Python's for any other host (fl_parse_size,
 * fl_kernel_util.h). A value outside it is an error naming the variable, never a silent default. */
int fl_host_env_size(const char *name, uint64_t dflt, uint64_t *out) {
    const char *text = getenv(name);
    if (!text || !*text) { *out = dflt; return FL_OK; }
    if (fl_parse_size(text, out) || *out == 0)
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

/* ---- dtype conversion of one strided row (the elementwise and reduction kernels' shared loop) ---- */
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

/* dst = src converted; src already has dst's shape (the indexing kernels' copies) */
void fl_copy_strided(const fl_tensor_t *dst, const fl_tensor_t *src) {
    int64_t numel = fl_numel(dst);
    if (numel == 0) return;
    fl_iter_t it;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){dst, src});
#pragma omp parallel for schedule(static) if (numel >= 32768 && it.outer > 1)
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        fl_cvt_row(dst->dtype, fl_elem(dst, b[0]), it.inner_stride[0], src->dtype, fl_elem(src, b[1]),
                   it.inner_stride[1], it.inner);
    }
}

void fl_zero_strided(const fl_tensor_t *dst) {
    int64_t z = 0;
    fl_iter_t it;
    fl_iter_init(&it, 1, (const fl_tensor_t *[]){dst});
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        fl_cvt_row(dst->dtype, fl_elem(dst, b[0]), it.inner_stride[0], FL_INT64, &z, 0, it.inner);
    }
}

const fl_kernel_group_t *const fl_host_groups[] = {
    &fl_host_group_elementwise, &fl_host_group_binary, &fl_host_group_unary, &fl_host_group_ternary,
    &fl_host_group_random, &fl_host_group_reduce, &fl_host_group_linalg, &fl_host_group_special,
    &fl_host_group_lu, &fl_host_group_cholesky, &fl_host_group_eigh_svd, &fl_host_group_qr,
    &fl_host_group_triangular, &fl_host_group_matrix_exp,
    &fl_host_group_gather, &fl_host_group_sort, &fl_host_group_scatter, &fl_host_group_index, &fl_host_group_search,
    &fl_host_group_layout,
    &fl_host_group_pad, &fl_host_group_upsample, &fl_host_group_im2col, &fl_host_group_grid_sample,
    &fl_host_group_distance, &fl_host_group_rrelu, &fl_host_group_embedding_bag,
    &fl_host_group_pool, &fl_host_group_loss,
    &fl_host_group_fft,
};
const int fl_host_ngroups = (int)(sizeof fl_host_groups / sizeof fl_host_groups[0]);
