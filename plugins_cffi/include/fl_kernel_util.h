/*
 * fl_kernel_util.h — helpers for writing torch_fl kernels in C.
 *
 * Shipped beside fl_plugin.h (torch_fl.get_include() returns the folder) and
 * header-only: every function is static inline, so a plugin compiles it in
 * with no library to link. torch_fl's own kernels (the host plugin, the
 * emulated devices), the template plugin and the C the JIT generates all use
 * these, so a vendor kernel walks tensors exactly as the bundled ones do.
 *
 *   dtypes        fl_itemsize, fl_is_floating, fl_is_complex, fl_elem, fl_numel, fl_is_contiguous,
 *                 fl_is_channels_last
 *   conversion    fl_bf16_to_f32, fl_f32_to_bf16, fl_f16_to_f32, fl_f32_to_f16
 *   arguments     fl_tensor_ok, fl_out_at, fl_out_ok, fl_arg_tensor, fl_arg_is_num, fl_arg_num, fl_arg_int, fl_arg_int_or,
 *                 fl_arg_code, fl_wrap_dim
 *   broadcasting  fl_bcast
 *   iteration     fl_iter_t (rows of a coalesced strided walk), fl_walk_t (element by element, with
 *                 coordinates; fl_walk_flat: whether a plain q loop may replace it), fl_rows_t (the lines along one dimension: softmax, scans, sorting)
 *   math          fl_vexpf (a float exp the compiler can vectorise)
 *   sizes         fl_parse_size ("512M", "2 GiB")
 *
 * Offsets and strides count elements, never bytes, and already include the
 * tensor's own offset, as in fl_tensor_t. Needs C11 (GCC or Clang:
 * fl_f16_to_f32 uses _Float16 and fl_parse_size unsigned __int128).
 */
#ifndef FL_KERNEL_UTIL_H
#define FL_KERNEL_UTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef FL_PLUGIN_H /* already pasted in (the JIT prelude) or included */
#include "fl_plugin.h"
#endif

/* ---- dtypes ---- */
static inline size_t fl_itemsize(int dtype) {
    switch (dtype) {
    case FL_FLOAT32: case FL_INT32: return 4;
    case FL_FLOAT64: case FL_INT64: case FL_COMPLEX64: return 8;
    case FL_COMPLEX128: return 16;
    case FL_FLOAT16: case FL_BFLOAT16: case FL_INT16: return 2;
    default: return 1;
    }
}
static inline int fl_is_floating(int dtype) {
    return dtype == FL_FLOAT32 || dtype == FL_FLOAT64 || dtype == FL_FLOAT16 || dtype == FL_BFLOAT16;
}
static inline int fl_is_complex(int dtype) { return dtype == FL_COMPLEX64 || dtype == FL_COMPLEX128; }

/* Address of the element at element offset `off` (which already includes t->offset). */
static inline char *fl_elem(const fl_tensor_t *t, int64_t off) {
    return (char *)t->data + off * (int64_t)fl_itemsize(t->dtype);
}
static inline int64_t fl_numel(const fl_tensor_t *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
    return n;
}
static inline int fl_is_contiguous(const fl_tensor_t *t) {
    int64_t expected = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->sizes[d] != 1 && t->strides[d] != expected) return 0;
        expected *= t->sizes[d];
    }
    return 1;
}

/* 4-D and dense in channels-last order (N, H, W, C), size-1 dims ignored as PyTorch does: what
 * torch.channels_last gives, and what a kernel flagged FL_KERNEL_ANY_OUT_LAYOUT may be handed */
static inline int fl_is_channels_last(const fl_tensor_t *t) {
    if (t->ndim != 4) return 0;
    static const int order[4] = {1, 3, 2, 0};
    int64_t expect = 1;
    for (int k = 0; k < 4; k++) {
        int d = order[k];
        if (t->sizes[d] != 1 && t->strides[d] != expect) return 0;
        expect *= t->sizes[d];
    }
    return 1;
}

/* ---- bfloat16 / float16 <-> float ---- */
static inline float fl_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t fl_f32_to_bf16(float f) { /* round to nearest even, NaN kept */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float fl_f16_to_f32(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t fl_f32_to_f16(float f) { _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h; }

/* ---- arguments (fl_plugin.h: one fl_arg_t per schema argument) ---- */
/* A defined tensor of a rank the ABI allows, with storage unless it has no elements. */
static inline int fl_tensor_ok(const fl_tensor_t *t) {
    if (t->ndim < 0 || t->ndim > FL_MAX_DIMS) return 0;
    return t->data != NULL || fl_numel(t) == 0;
}
/* Output k, or NULL when there is none or the op leaves it undefined (ndim -1, data NULL). */
static inline const fl_tensor_t *fl_out_at(const fl_tensor_t *out, int n_out, int k) {
    return k < n_out && fl_tensor_ok(&out[k]) ? &out[k] : NULL;
}
/* The first output is defined. */
static inline int fl_out_ok(const fl_tensor_t *out, int n_out) { return fl_out_at(out, n_out, 0) != NULL; }
/* The tensor of argument k, or NULL when it is absent, None, not a tensor or undefined. */
static inline const fl_tensor_t *fl_arg_tensor(const fl_arg_t *args, int n_args, int k, const fl_tensor_t *in,
                                               int n_in) {
    if (k >= n_args || args[k].kind != FL_ARG_TENSOR || args[k].i < 0 || args[k].i >= n_in) return NULL;
    const fl_tensor_t *t = &in[args[k].i];
    return fl_tensor_ok(t) ? t : NULL;
}
/* A Python number: int, float or bool. */
static inline int fl_arg_is_num(const fl_arg_t *a) {
    return a->kind == FL_ARG_INT || a->kind == FL_ARG_FLOAT || a->kind == FL_ARG_BOOL;
}
static inline double fl_arg_num(const fl_arg_t *a) { return a->kind == FL_ARG_FLOAT ? a->f : (double)a->i; }
static inline int64_t fl_arg_int(const fl_arg_t *a) { return a->kind == FL_ARG_FLOAT ? (int64_t)a->f : a->i; }
/* An int or bool argument k, or dflt when it is absent or of another kind (None). */
static inline int64_t fl_arg_int_or(const fl_arg_t *args, int n_args, int k, int64_t dflt) {
    if (k >= n_args || (args[k].kind != FL_ARG_INT && args[k].kind != FL_ARG_BOOL)) return dflt;
    return args[k].i;
}
/* The fl_string_code_t of string argument k: FL_STR_UNKNOWN for a string the ABI has no code
 * for, -2 when argument k is not a string. */
static inline int64_t fl_arg_code(const fl_arg_t *args, int n_args, int k) {
    if (k >= n_args || args[k].kind != FL_ARG_OTHER) return -2;
    return args[k].i;
}
/* dim in [-ndim, ndim) -> [0, ndim) in *out (a 0-dim tensor takes -1 and 0); -1 when out of range. */
static inline int fl_wrap_dim(int64_t d, int ndim, int *out) {
    int n = ndim > 0 ? ndim : 1;
    if (d < -n || d >= n) return -1;
    *out = (int)(d < 0 ? d + n : d);
    return 0;
}

/* ---- broadcasting ----
 * *r = t viewed with shape[0..nd) (right-aligned, NumPy rules): broadcast dims
 * get stride 0. Returns 0, or -1 when t does not broadcast to the shape. */
static inline int fl_bcast(const fl_tensor_t *t, int nd, const int64_t *shape, fl_tensor_t *r) {
    if (t->ndim < 0 || t->ndim > nd || nd > FL_MAX_DIMS) return -1;
    fl_tensor_t v = *t;
    int lead = nd - t->ndim;
    v.ndim = nd;
    for (int d = 0; d < nd; d++) {
        int64_t sz = d < lead ? 1 : t->sizes[d - lead];
        int64_t st = d < lead ? 0 : t->strides[d - lead];
        if (sz == shape[d]) v.strides[d] = sz == 1 ? 0 : st;
        else if (sz == 1) v.strides[d] = 0;
        else return -1;
        v.sizes[d] = shape[d];
    }
    *r = v;
    return 0;
}

/* ---- fl_iter_t: a strided walk over up to FL_ITER_MAX tensors of one shape ----
 * Dimensions are coalesced where every tensor allows it, so contiguous
 * tensors become one long row. Usage:
 *   fl_iter_t it; fl_iter_init(&it, 2, (const fl_tensor_t *[]){out, in});
 *   for (int64_t o = 0; o < it.outer; o++) {
 *       int64_t base[FL_ITER_MAX]; fl_iter_row(&it, o, base);
 *       for (int64_t i = 0; i < it.inner; i++) ... base[k] + i * it.inner_stride[k]
 *   }
 * Rows are independent: a parallel loop over o is safe. */
#define FL_ITER_MAX 6
typedef struct {
    int ntensor;
    int ndim;                               /* coalesced rank of the outer dims */
    int64_t sizes[FL_MAX_DIMS];             /* outer dims (without the inner one) */
    int64_t strides[FL_ITER_MAX][FL_MAX_DIMS];
    int64_t offset[FL_ITER_MAX];
    int64_t inner;                          /* length of a row */
    int64_t inner_stride[FL_ITER_MAX];
    int64_t outer;                          /* number of rows (0 when numel is 0) */
} fl_iter_t;

/* ts[0] gives the shape; every other tensor has it too (fl_bcast one that does not). */
static inline void fl_iter_init(fl_iter_t *it, int ntensor, const fl_tensor_t *const *ts) {
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
    int m = 0; /* coalesce from the innermost dim outwards */
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
/* base[k] = element offset of the first element of row `row` in tensor k. */
static inline void fl_iter_row(const fl_iter_t *it, int64_t row, int64_t *base) {
    for (int k = 0; k < it->ntensor; k++) base[k] = it->offset[k];
    for (int d = it->ndim - 1; d >= 0 && row; d--) {
        int64_t idx = row % it->sizes[d];
        row /= it->sizes[d];
        for (int k = 0; k < it->ntensor; k++) base[k] += idx * it->strides[k][d];
    }
}

/* ---- fl_walk_t: element by element in row-major order, with the coordinates ----
 * For loops that need each element's index (nonzero, scatter along a dim) or
 * more tensors than fl_iter_t takes. Tensors are added with fl_walk_add and
 * must have the walk's shape (or be a view built for it: fl_bcast).
 *   fl_walk_t w; fl_walk_init(&w, o->ndim, o->sizes); int a = fl_walk_add(&w, o), b = fl_walk_add(&w, x);
 *   int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
 *   fl_walk_seek(&w, 0, ctr, off);
 *   for (int64_t q = 0; q < w.numel; q++, fl_walk_next(&w, ctr, off)) ... off[a], off[b], ctr[d] */
#define FL_WALK_MAX (FL_MAX_DIMS + 3)
typedef struct {
    int nd, nt;
    int64_t size[FL_MAX_DIMS];
    int64_t st[FL_WALK_MAX][FL_MAX_DIMS];
    int64_t base[FL_WALK_MAX];
    int64_t numel;
} fl_walk_t;
static inline void fl_walk_init(fl_walk_t *w, int nd, const int64_t *size) {
    memset(w, 0, sizeof *w);
    w->nd = nd;
    w->numel = 1;
    for (int d = 0; d < nd; d++) { w->size[d] = size[d]; w->numel *= size[d]; }
}
/* adds tensor t; returns its slot in off[] */
static inline int fl_walk_add(fl_walk_t *w, const fl_tensor_t *t) {
    int k = w->nt++;
    w->base[k] = t->offset;
    for (int d = 0; d < w->nd; d++) w->st[k][d] = t->strides[d];
    return k;
}
/* ctr and off of the element with row-major index lin */
static inline void fl_walk_seek(const fl_walk_t *w, int64_t lin, int64_t *ctr, int64_t *off) {
    for (int k = 0; k < w->nt; k++) off[k] = w->base[k];
    for (int d = w->nd - 1; d >= 0; d--) {
        ctr[d] = lin % w->size[d];
        lin /= w->size[d];
        for (int k = 0; k < w->nt; k++) off[k] += ctr[d] * w->st[k][d];
    }
}
static inline void fl_walk_next(const fl_walk_t *w, int64_t *ctr, int64_t *off) {
    for (int d = w->nd - 1; d >= 0; d--) {
        if (++ctr[d] < w->size[d]) {
            for (int k = 0; k < w->nt; k++) off[k] += w->st[k][d];
            return;
        }
        ctr[d] = 0;
        for (int k = 0; k < w->nt; k++) off[k] -= w->st[k][d] * (w->size[d] - 1);
    }
}

/* 1 when every tensor of the walk has the first one's strides and those are dense (a permutation
 * of a contiguous layout: NCHW, channels-last, a transpose): each tensor's elements are then
 * base[k] + q for q in [0, numel), in the same order for all of them, and an elementwise loop may
 * run over q directly (and in parallel) instead of stepping through the coordinates. */
static inline int fl_walk_flat(const fl_walk_t *w) {
    int used[FL_MAX_DIMS] = {0}, big = 0, placed = 0;
    for (int d = 0; d < w->nd; d++) {
        if (w->size[d] == 1) continue;
        big++;
        for (int k = 1; k < w->nt; k++)
            if (w->st[k][d] != w->st[0][d]) return 0;
    }
    for (int64_t expect = 1; placed < big; placed++) {
        int found = -1;
        for (int d = 0; d < w->nd && found < 0; d++)
            if (!used[d] && w->size[d] != 1 && w->st[0][d] == expect) found = d;
        if (found < 0) return 0;
        used[found] = 1;
        expect *= w->size[found];
    }
    return 1;
}

/* ---- fl_rows_t: the lines along one dimension ----
 * Row r of tensor k starts at off[k] (fl_rows_at) and steps by st[k]; len is
 * ts[0]'s size along dim (1 for a 0-dim tensor). Every tensor has ts[0]'s
 * rank and sizes outside dim (its own size along dim may differ: topk's
 * output, a scan's input). Returns 0, or -1 when the shapes disagree.
 *   fl_rows_t r; fl_rows_init(&r, ts, 2, dim);
 *   for (int64_t row = 0; row < r.nrows; row++) { int64_t off[FL_ROWS_MAX]; fl_rows_at(&r, ts, row, off); ... } */
#define FL_ROWS_MAX 4
typedef struct {
    int no, n;                                    /* outer rank, tensor count */
    int64_t osz[FL_MAX_DIMS], ost[FL_ROWS_MAX][FL_MAX_DIMS];
    int64_t len, st[FL_ROWS_MAX], nrows;
} fl_rows_t;
static inline int fl_rows_init(fl_rows_t *r, const fl_tensor_t *const *ts, int n, int dim) {
    const fl_tensor_t *t0 = ts[0];
    memset(r, 0, sizeof *r);
    if (n > FL_ROWS_MAX) return -1;
    r->n = n;
    r->nrows = 1;
    r->len = t0->ndim ? t0->sizes[dim] : 1;
    for (int k = 0; k < n; k++) {
        if (ts[k]->ndim != t0->ndim) return -1;
        for (int d = 0; d < t0->ndim; d++)
            if (d != dim && ts[k]->sizes[d] != t0->sizes[d]) return -1;
        r->st[k] = t0->ndim ? ts[k]->strides[dim] : 0;
    }
    for (int d = 0; d < t0->ndim; d++) {
        if (d == dim) continue;
        r->osz[r->no] = t0->sizes[d];
        for (int k = 0; k < n; k++) r->ost[k][r->no] = ts[k]->strides[d];
        r->nrows *= t0->sizes[d];
        r->no++;
    }
    return 0;
}
static inline void fl_rows_at(const fl_rows_t *r, const fl_tensor_t *const *ts, int64_t row, int64_t *off) {
    for (int k = 0; k < r->n; k++) off[k] = ts[k]->offset;
    for (int d = r->no - 1; d >= 0 && row; d--) {
        int64_t i = row % r->osz[d];
        row /= r->osz[d];
        for (int k = 0; k < r->n; k++) off[k] += i * r->ost[k][d];
    }
}

/* ---- math ----
 * exp for float (Cephes polynomial, ~1 ulp), branch-free so that GCC
 * vectorises the loops that call it (libm's expf is a scalar call). Overflow
 * gives inf, underflow goes through denormals to 0, NaN propagates. */
static inline float fl_vexpf(float x) {
    x = x < -104.0f ? -104.0f : x;
    x = x > 89.0f ? 89.0f : x;
    float t = x * 1.44269504088896341f + 12582912.0f;
    float k = t - 12582912.0f;
    float r = x - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float r2 = r * r;
    float p = ((((1.9875691500E-4f * r + 1.3981999507E-3f) * r + 8.3334519073E-3f) * r + 4.1665795894E-2f) * r +
               1.6666665459E-1f) * r + 5.0000001201E-1f;
    p = p * r2 + r + 1.0f;
    int32_t n = (int32_t)k, n1 = n / 2, n2 = n - n1;
    union { uint32_t u; float f; } s1, s2;
    s1.u = (uint32_t)(n1 + 127) << 23;
    s2.u = (uint32_t)(n2 + 127) << 23;
    return p * s1.f * s2.f;
}

/* ---- sizes: the grammar torch_fl's FL_* variables use ----
 * A number of bytes with an optional binary K/M/G/T suffix and optional B/iB
 * ("4096", "512M", "1.5G", "2 GiB"). Returns 0 with *out set, or -1. */
static inline int fl_parse_size(const char *text, uint64_t *out) {
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
    uint64_t unit = 1;
    switch (*p) {
    case 'k': case 'K': unit = 1ull << 10; break;
    case 'm': case 'M': unit = 1ull << 20; break;
    case 'g': case 'G': unit = 1ull << 30; break;
    case 't': case 'T': unit = 1ull << 40; break;
    }
    if (unit > 1) p++;
    if (unit > 1 && (*p == 'i' || *p == 'I')) p++;
    if (*p == 'b' || *p == 'B') p++;
    while (*p == ' ' || *p == '\t') p++;
    if (*p) return -1;
    unsigned __int128 v = whole * unit + frac * unit / scale;
    if (v > UINT64_MAX) return -1;
    *out = (uint64_t)v;
    return 0;
}

#endif /* FL_KERNEL_UTIL_H */
