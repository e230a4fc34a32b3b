/* Host kernels: elementwise (copy, fill, unary, binary, ternary, pointwise
 * backward, random).
 *
 * Engine: every op is a small loop over contiguous arrays of one "compute
 * type" (float for f32/f16/bf16 results, double for f64, int64 for integer
 * and bool results). The driver walks the output with fl_iter_t in chunks of
 * CH elements; an operand that already has the compute dtype and a unit or
 * zero inner stride is used in place, any other operand is converted into a
 * per-chunk buffer (cvt_row), and so is the result on the way out. Scalars
 * become zero-stride tensors over a local of the compute dtype. Inputs are
 * broadcast to the output shape here too (a no-op for pointwise-tagged ops,
 * which the runtime broadcasts; needed for the untagged ones such as
 * hardtanh_backward, masked_fill_, rsub.Tensor, abs_).
 *
 * String arguments: the runtime passes gelu/gelu_backward's `approximate` as
 * FL_ARG_OTHER with i = FL_STR_none or FL_STR_tanh (fl_plugin.h). div with a
 * rounding_mode (div.Tensor_mode & co) has no kernel here: PyTorch's
 * decomposition into div and trunc/floor serves it.
 */
#pragma GCC optimize("no-math-errno")
#include <stdlib.h>

#include "fl_host.h"

#define CH 1024
#define PAR_MIN 32768
#define PAR_CHUNK 16384 /* elements a thread of fl_par_for gets at least */
#define UNSUP FL_ERR_UNSUPPORTED

/* ------------------------------------------------------------------ */
/* arguments                                                           */
/* ------------------------------------------------------------------ */



/* ------------------------------------------------------------------ */
/* dtype conversion of one strided row                                 */
/* ------------------------------------------------------------------ */
/* fl_cvt_row (one strided row, any dtype to any dtype) lives in common.c */

/* value of a scalar argument stored as dtype `dt` into buf (exact for ints) */
static void scalar_to(const fl_arg_t *a, int dt, void *buf) {
    if (a->kind == FL_ARG_FLOAT) fl_cvt_row(dt, buf, 1, FL_FLOAT64, &a->f, 0, 1);
    else fl_cvt_row(dt, buf, 1, FL_INT64, &a->i, 0, 1);
}

/* ------------------------------------------------------------------ */
/* copy_ / fill_ / zero_                                               */
/* ------------------------------------------------------------------ */
static void tensor_range(const fl_tensor_t *t, int64_t *lo, int64_t *hi) {
    int64_t a = t->offset, b = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        if (t->sizes[d] == 0) { *lo = 0; *hi = -1; return; }
        int64_t e = (t->sizes[d] - 1) * t->strides[d];
        if (e > 0) b += e; else a += e;
    }
    *lo = a; *hi = b;
}

/* Transposing copy: dst rows are contiguous, src is contiguous along dst's
 * next-outer dim. Moves 32x32 tiles so both sides stream through cache. */
#define TILE 32
#define TILE_LOOP(T)                                                                          \
    {                                                                                         \
        T *d_ = (T *)j->dst->data;                                                            \
        const T *s_ = (const T *)j->src->data;                                                \
        for (int64_t a = a0; a < a1; a++)                                                     \
            for (int64_t b = b0; b < b1; b++) d_[db + a * das + b] = s_[sb + a + b * sbs];    \
    }                                                                                         \
    break;
typedef struct {
    const fl_tensor_t *dst, *src;
    const fl_iter_t *it;
    int64_t A, B, das, sbs, ta, tb;
    size_t isz;
} tiled_job_t;

static void tiled_units(void *job, int64_t u0, int64_t u1) {
    const tiled_job_t *j = job;
    int64_t A = j->A, B = j->B, das = j->das, sbs = j->sbs, ta = j->ta, tb = j->tb;
    for (int64_t u = u0; u < u1; u++) {
        int64_t pl = u / (ta * tb), rem = u % (ta * tb);
        int64_t a0 = (rem / tb) * TILE, b0 = (rem % tb) * TILE;
        int64_t a1 = a0 + TILE < A ? a0 + TILE : A, b1 = b0 + TILE < B ? b0 + TILE : B;
        int64_t base[FL_ITER_MAX];
        fl_iter_row(j->it, pl * A, base);
        int64_t db = base[0], sb = base[1];
        switch (j->isz) {
        case 2: TILE_LOOP(uint16_t)
        case 4: TILE_LOOP(uint32_t)
        default: TILE_LOOP(uint64_t)
        }
    }
}

static int copy_tiled(const fl_tensor_t *dst, const fl_tensor_t *src, const fl_iter_t *it, int64_t numel) {
    size_t isz = fl_itemsize(dst->dtype);
    if (it->ndim < 1 || it->inner_stride[0] != 1 || it->strides[1][it->ndim - 1] != 1 || it->inner < 8 ||
        it->sizes[it->ndim - 1] < 8 || (isz != 2 && isz != 4 && isz != 8) || dst->dtype == FL_BOOL)
        return -1;
    int64_t A = it->sizes[it->ndim - 1], B = it->inner;
    int64_t das = it->strides[0][it->ndim - 1], sbs = it->inner_stride[1];
    int64_t planes = it->outer / A;
    int64_t ta = (A + TILE - 1) / TILE, tb = (B + TILE - 1) / TILE, units = planes * ta * tb;
    tiled_job_t job = {dst, src, it, A, B, das, sbs, ta, tb, isz};
    fl_par_for(units, fl_par_grain(units, numel, PAR_MIN, PAR_CHUNK), tiled_units, &job);
    return 0;
}

/* n elements of isz bytes at d, each a copy of the isz bytes at v */
static void fill_run(char *d, const char *v, size_t isz, int64_t n) {
#define FILL_AS(T)                                  \
    {                                               \
        T x_;                                       \
        memcpy(&x_, v, sizeof x_);                  \
        T *p_ = (T *)d;                             \
        for (int64_t i = 0; i < n; i++) p_[i] = x_; \
    }                                               \
    return;
    int zero = 1;
    for (size_t k = 0; k < isz; k++) zero &= v[k] == 0;
    if (zero) { memset(d, 0, (size_t)n * isz); return; }
    switch (isz) {
    case 1: memset(d, (unsigned char)v[0], (size_t)n); return;
    case 2: FILL_AS(uint16_t)
    case 4: FILL_AS(uint32_t)
    case 8: FILL_AS(uint64_t)
    default:
        for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)i * isz, v, isz);
    }
#undef FILL_AS
}

typedef struct {
    char *d;
    const char *v;
    size_t isz;
} fill_job_t;

static void fill_range(void *job, int64_t lo, int64_t hi) {
    const fill_job_t *j = job;
    fill_run(j->d + (size_t)lo * j->isz, j->v, j->isz, hi - lo);
}

typedef struct {
    char *d;
    const char *s;
} memcpy_job_t;

static void memcpy_range(void *job, int64_t lo, int64_t hi) { /* bytes [lo, hi) */
    const memcpy_job_t *j = job;
    memcpy(j->d + lo, j->s + lo, (size_t)(hi - lo));
}

/* dst, contiguous, filled with the one element of src (every stride 0, dst's dtype): fill_ and zero_ as
 * stores of one value, not an element-by-element conversion; 1 MiB and up in 256 KiB blocks across threads */
static int fill_contiguous(const fl_tensor_t *dst, const fl_tensor_t *src, int64_t numel) {
    if (dst->dtype != src->dtype || !fl_is_contiguous(dst)) return -1;
    for (int d = 0; d < src->ndim; d++)
        if (src->sizes[d] > 1 && src->strides[d] != 0) return -1;
    char *d = fl_elem(dst, dst->offset);
    const char *v = fl_elem(src, src->offset);
    size_t isz = fl_itemsize(dst->dtype), nb = (size_t)numel * isz;
    if (nb < ((size_t)1 << 20)) {
        fill_run(d, v, isz, numel);
        return 0;
    }
    fill_job_t job = {d, v, isz};
    fl_par_for(numel, (int64_t)((256 << 10) / isz), fill_range, &job);
    return 0;
}

typedef struct {
    const fl_tensor_t *dst, *src;
    const fl_iter_t *it;
    int64_t nchunk;
} cvt_job_t;

/* units [u0, u1) of a converting copy: unit u is chunk u % nchunk (4 CH elements) of row u / nchunk */
static void cvt_units(void *job, int64_t u0, int64_t u1) {
    const cvt_job_t *j = job;
    const fl_iter_t *it = j->it;
    for (int64_t u = u0; u < u1; u++) {
        int64_t row = u / j->nchunk, c0 = (u % j->nchunk) * 4 * CH;
        int64_t len = it->inner - c0 < 4 * CH ? it->inner - c0 : 4 * CH;
        int64_t base[FL_ITER_MAX];
        fl_iter_row(it, row, base);
        fl_cvt_row(j->dst->dtype, fl_elem(j->dst, base[0] + c0 * it->inner_stride[0]), it->inner_stride[0],
                   j->src->dtype, fl_elem(j->src, base[1] + c0 * it->inner_stride[1]), it->inner_stride[1], len);
    }
}

/* dst = convert(src), src already broadcast to dst's shape. */
static void copy_strided(const fl_tensor_t *dst, const fl_tensor_t *src) {
    int64_t numel = fl_numel(dst);
    if (numel == 0) return;
    if (fill_contiguous(dst, src, numel) == 0) return;
    if (dst->dtype == src->dtype && fl_is_contiguous(dst) && fl_is_contiguous(src)) {
        char *d = fl_elem(dst, dst->offset);
        const char *s = fl_elem(src, src->offset);
        size_t nb = (size_t)numel * fl_itemsize(dst->dtype);
        if (nb >= ((size_t)1 << 20)) {
            memcpy_job_t job = {d, s};
            fl_par_for((int64_t)nb, 256 << 10, memcpy_range, &job);
        } else {
            memmove(d, s, nb);
        }
        return;
    }
    fl_iter_t it;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){dst, src});
    if (dst->dtype == src->dtype && copy_tiled(dst, src, &it, numel) == 0) return;
    int64_t nchunk = (it.inner + 4 * CH - 1) / (4 * CH);
    int64_t units = it.outer * nchunk;
    cvt_job_t job = {dst, src, &it, nchunk};
    fl_par_for(units, fl_par_grain(units, numel, PAR_MIN, PAR_CHUNK), cvt_units, &job);
}

/* dst = src where the two views share memory (circular padding copies one part of a tensor into
 * another; a view copied onto a shifted view of itself): the source goes through a contiguous
 * scratch copy first, so no element is read after it was overwritten. */
static int copy_staged(const fl_tensor_t *dst, const fl_tensor_t *src) {
    int64_t n = fl_numel(dst);
    if (n == 0) return FL_OK;
    void *buf = malloc((size_t)n * fl_itemsize(src->dtype));
    if (!buf) FL_FAIL(FL_ERR_OOM, "copy_: cannot allocate %lld bytes to stage an overlapping copy",
                      (long long)(n * (int64_t)fl_itemsize(src->dtype)));
    fl_tensor_t tmp = *dst;
    tmp.data = buf;
    tmp.offset = 0;
    tmp.dtype = src->dtype;
    int64_t stride = 1;
    for (int d = dst->ndim - 1; d >= 0; d--) {
        tmp.strides[d] = stride;
        stride *= dst->sizes[d];
    }
    copy_strided(&tmp, src);
    copy_strided(dst, &tmp);
    free(buf);
    return FL_OK;
}

static int k_copy_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out) || n_args < 2) return UNSUP;
    const fl_tensor_t *dst = &out[0];
    fl_tensor_t src;
    if (args[1].kind == FL_ARG_TENSOR) {
        if (args[1].i < 0 || args[1].i >= n_in) return UNSUP;
        if (fl_bcast(&in[args[1].i], dst->ndim, dst->sizes, &src)) return UNSUP;
        if (src.data == dst->data) { /* overlapping copies with different layouts are declined */
            int64_t a0, a1, b0, b1;
            tensor_range(dst, &a0, &a1);
            tensor_range(&src, &b0, &b1);
            int same = src.offset == dst->offset;
            for (int d = 0; d < dst->ndim && same; d++)
                if (dst->sizes[d] > 1 && src.strides[d] != dst->strides[d]) same = 0;
            if (same) return FL_OK;
            if (a0 <= b1 && b0 <= a1) return copy_staged(dst, &src);
        }
        copy_strided(dst, &src);
        return FL_OK;
    }
    if (fl_arg_is_num(&args[1])) {
        int64_t buf[2]; /* a complex128 is 16 bytes */
        fl_tensor_t s = {.data = buf, .offset = 0, .dtype = dst->dtype, .ndim = 0};
        scalar_to(&args[1], dst->dtype, buf);
        if (fl_bcast(&s, dst->ndim, dst->sizes, &src)) return UNSUP;
        copy_strided(dst, &src);
        return FL_OK;
    }
    return UNSUP;
}

static int fill_value(const fl_tensor_t *dst, const fl_arg_t *a, const fl_tensor_t *in, int n_in) {
    int64_t buf[2] = {0, 0}; /* a complex128 is 16 bytes */
    fl_tensor_t s = {.data = buf, .offset = 0, .dtype = dst->dtype, .ndim = 0}, src;
    if (a->kind == FL_ARG_TENSOR) {
        if (a->i < 0 || a->i >= n_in) return UNSUP;
        const fl_tensor_t *v = &in[a->i];
        if (fl_numel(v) != 1 || v->ndim < 0) return UNSUP;
        fl_cvt_row(dst->dtype, buf, 1, v->dtype, fl_elem(v, v->offset), 0, 1);
    } else if (fl_arg_is_num(a)) {
        scalar_to(a, dst->dtype, buf);
    } else {
        return UNSUP;
    }
    if (fl_bcast(&s, dst->ndim, dst->sizes, &src)) return UNSUP;
    copy_strided(dst, &src);
    return FL_OK;
}

static int k_fill_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out) || n_args < 2) return UNSUP;
    return fill_value(&out[0], &args[1], in, n_in);
}

static int k_zero_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out)) return UNSUP;
    fl_arg_t z = {.kind = FL_ARG_INT, .i = 0};
    return fill_value(&out[0], &z, in, n_in);
}

/* ------------------------------------------------------------------ */
/* the elementwise engine                                              */
/* ------------------------------------------------------------------ */
enum { CT_F = 0, CT_D = 1, CT_I = 2 };
static const int ct_dtype[3] = {FL_FLOAT32, FL_FLOAT64, FL_INT64};
static int ct_of(int dtype) {
    if (dtype == FL_FLOAT32 || dtype == FL_FLOAT16 || dtype == FL_BFLOAT16) return CT_F;
    if (dtype == FL_FLOAT64) return CT_D;
    return CT_I;
}

typedef struct {
    double d[6];
    int64_t i[6];
} kp_t;
typedef void (*ewfn)(int64_t n, void *o, const void *const *x, const int64_t *xs, const kp_t *p);

#define MAXOP 5
typedef struct {
    fl_tensor_t t[MAXOP];
    int64_t sc[MAXOP]; /* scalar storage (8 bytes: float, double or int64) */
    int n;
} opnds_t;

/* Adds operand from argument a (tensor broadcast to out, or scalar stored in
 * the compute dtype). */
static int opnd_add(opnds_t *o, const fl_tensor_t *in, int n_in, const fl_arg_t *a, const fl_tensor_t *out, int ct) {
    if (o->n >= MAXOP) return UNSUP;
    fl_tensor_t *t = &o->t[o->n];
    if (a->kind == FL_ARG_TENSOR) {
        if (a->i < 0 || a->i >= n_in) return UNSUP;
        if (fl_bcast(&in[a->i], out->ndim, out->sizes, t)) return UNSUP;
    } else if (fl_arg_is_num(a)) {
        if (ct == CT_I && a->kind == FL_ARG_FLOAT && a->f != (double)(int64_t)a->f) return UNSUP;
        scalar_to(a, ct_dtype[ct], &o->sc[o->n]);
        fl_tensor_t s = {.data = &o->sc[o->n], .offset = 0, .dtype = ct_dtype[ct], .ndim = 0};
        if (fl_bcast(&s, out->ndim, out->sizes, t)) return UNSUP;
    } else {
        return UNSUP;
    }
    o->n++;
    return FL_OK;
}

typedef struct {
    const fl_iter_t *it;
    const fl_tensor_t *out;
    const opnds_t *ops;
    ewfn fn;
    const kp_t *p;
    int64_t nchunk;
    int nin, cd;
} ew_job_t;

/* units [u0, u1) of an elementwise op: unit u is chunk u % nchunk (CH elements) of row u / nchunk */
static void ew_units(void *job, int64_t u0, int64_t u1) {
    const ew_job_t *j = job;
    const fl_iter_t *it = j->it;
    const fl_tensor_t *out = j->out;
    int64_t nchunk = j->nchunk;
    int nin = j->nin, cd = j->cd;
    for (int64_t u = u0; u < u1; u++) {
        double bufs[MAXOP + 1][CH] __attribute__((aligned(64)));
        int64_t row = u / nchunk, c0 = (u % nchunk) * CH;
        int64_t len = it->inner - c0 < CH ? it->inner - c0 : CH;
        int64_t base[FL_ITER_MAX];
        fl_iter_row(it, row, base);
        const void *xp[MAXOP];
        int64_t xs[MAXOP];
        for (int k = 0; k < nin; k++) {
            const fl_tensor_t *t = &j->ops->t[k];
            int64_t st = it->inner_stride[k + 1];
            const char *ptr = fl_elem(t, base[k + 1] + c0 * st);
            if (t->dtype == cd && (st == 0 || st == 1)) {
                xp[k] = ptr; xs[k] = st;
            } else if (st == 0) {
                fl_cvt_row(cd, bufs[k + 1], 1, t->dtype, ptr, 0, 1);
                xp[k] = bufs[k + 1]; xs[k] = 0;
            } else {
                fl_cvt_row(cd, bufs[k + 1], 1, t->dtype, ptr, st, len);
                xp[k] = bufs[k + 1]; xs[k] = 1;
            }
        }
        int64_t ost = it->inner_stride[0];
        char *optr = fl_elem(out, base[0] + c0 * ost);
        if (out->dtype == cd && ost == 1) {
            j->fn(len, optr, xp, xs, j->p);
        } else {
            j->fn(len, bufs[0], xp, xs, j->p);
            fl_cvt_row(out->dtype, optr, ost, cd, bufs[0], 1, len);
        }
    }
}

static int ew_run(const fl_tensor_t *out, const opnds_t *ops, int ct, ewfn fn, const kp_t *p) {
    if (!fn) return UNSUP;
    const fl_tensor_t *ts[FL_ITER_MAX];
    int nin = ops->n;
    ts[0] = out;
    for (int k = 0; k < nin; k++) ts[k + 1] = &ops->t[k];
    fl_iter_t it;
    fl_iter_init(&it, nin + 1, ts);
    int64_t numel = it.outer * it.inner;
    if (numel == 0) return FL_OK;
    int64_t nchunk = (it.inner + CH - 1) / CH;
    int64_t units = it.outer * nchunk;
    ew_job_t job = {&it, out, ops, fn, p, nchunk, nin, ct_dtype[ct]};
    fl_par_for(units, fl_par_grain(units, numel, PAR_MIN, PAR_CHUNK), ew_units, &job);
    return FL_OK;
}

/* ---- loop generators ---- */
#define PL_F const float s0 = (float)p->d[0], s1 = (float)p->d[1], s2 = (float)p->d[2], s3 = (float)p->d[3];
#define PL_D const double s0 = p->d[0], s1 = p->d[1], s2 = p->d[2], s3 = p->d[3];
#define PL_I const int64_t s0 = p->i[0], s1 = p->i[1], s2 = p->i[2], s3 = p->i[3];
#define PL_USE (void)s0; (void)s1; (void)s2; (void)s3; (void)p;

#define U __attribute__((unused))
#define K1(fname, T, PL, EXPR)                                                              \
    FL_MV static void fname(int64_t n, void *o_, const void *const *x, const int64_t *xs, const kp_t *p) { \
        T *restrict o = (T *)o_;                                                            \
        const T *restrict A = (const T *)x[0];                                              \
        PL PL_USE                                                                           \
        if (xs[0]) {                                                                        \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; o[i] = (EXPR); }                  \
        } else {                                                                            \
            U T a = A[0]; T v_ = (EXPR);                                                      \
            for (int64_t i = 0; i < n; i++) o[i] = v_;                                      \
        }                                                                                   \
    }

#define K2(fname, T, PL, EXPR)                                                              \
    FL_MV static void fname(int64_t n, void *o_, const void *const *x, const int64_t *xs, const kp_t *p) { \
        T *restrict o = (T *)o_;                                                            \
        const T *restrict A = (const T *)x[0], *restrict B = (const T *)x[1];               \
        PL PL_USE                                                                           \
        if (xs[0] && xs[1]) {                                                               \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; U T b = B[i]; o[i] = (EXPR); }        \
        } else if (xs[0]) {                                                                 \
            U T b = B[0];                                                                     \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; o[i] = (EXPR); }                  \
        } else if (xs[1]) {                                                                 \
            U T a = A[0];                                                                     \
            for (int64_t i = 0; i < n; i++) { U T b = B[i]; o[i] = (EXPR); }                  \
        } else {                                                                            \
            U T a = A[0]; U T b = B[0]; T v_ = (EXPR);                                            \
            for (int64_t i = 0; i < n; i++) o[i] = v_;                                      \
        }                                                                                   \
    }

#define K3(fname, T, PL, EXPR)                                                              \
    FL_MV static void fname(int64_t n, void *o_, const void *const *x, const int64_t *xs, const kp_t *p) { \
        T *restrict o = (T *)o_;                                                            \
        const T *restrict A = (const T *)x[0], *restrict B = (const T *)x[1], *restrict C = (const T *)x[2]; \
        PL PL_USE                                                                           \
        if (xs[0] && xs[1] && xs[2]) {                                                      \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; U T b = B[i]; U T c = C[i]; o[i] = (EXPR); } \
        } else if (xs[0] && xs[1]) {                                                        \
            U T c = C[0];                                                                     \
            for (int64_t i = 0; i < n; i++) { U T a = A[i]; U T b = B[i]; o[i] = (EXPR); }        \
        } else {                                                                            \
            const int64_t sa = xs[0], sb = xs[1], sc = xs[2];                               \
            for (int64_t i = 0; i < n; i++) { U T a = A[i * sa]; U T b = B[i * sb]; U T c = C[i * sc]; o[i] = (EXPR); } \
        }                                                                                   \
    }

/* op tables: {float, double, int64} */
#define OP1(name, EF, ED, EI) K1(name##_f, float, PL_F, EF) K1(name##_d, double, PL_D, ED) K1(name##_i, int64_t, PL_I, EI) \
    static const ewfn name##_t[3] = {name##_f, name##_d, name##_i};
#define OP1F(name, EF, ED) K1(name##_f, float, PL_F, EF) K1(name##_d, double, PL_D, ED) \
    static const ewfn name##_t[3] = {name##_f, name##_d, NULL};
#define OP2(name, EF, ED, EI) K2(name##_f, float, PL_F, EF) K2(name##_d, double, PL_D, ED) K2(name##_i, int64_t, PL_I, EI) \
    static const ewfn name##_t[3] = {name##_f, name##_d, name##_i};
#define OP2F(name, EF, ED) K2(name##_f, float, PL_F, EF) K2(name##_d, double, PL_D, ED) \
    static const ewfn name##_t[3] = {name##_f, name##_d, NULL};
#define OP3(name, EF, ED, EI) K3(name##_f, float, PL_F, EF) K3(name##_d, double, PL_D, ED) K3(name##_i, int64_t, PL_I, EI) \
    static const ewfn name##_t[3] = {name##_f, name##_d, name##_i};
#define OP3F(name, EF, ED) K3(name##_f, float, PL_F, EF) K3(name##_d, double, PL_D, ED) \
    static const ewfn name##_t[3] = {name##_f, name##_d, NULL};

/* ---- scalar helpers ---- */

static inline float vtanhf(float x) {
    float ax = fabsf(x);
    float z = x * x;
    float small = ((((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z + 1.33314422036E-1f) * z -
                   3.33332819422E-1f) * z * x + x;
    float big = 1.0f - 2.0f / (fl_vexpf(2.0f * ax) + 1.0f);
    big = x < 0 ? -big : big;
    return ax < 0.625f ? (x == 0.0f ? x : small) : big; /* tanh(-0.0) is -0.0 */
}
static inline float sigm_f(float x) { return 1.0f / (1.0f + fl_vexpf(-x)); }
static inline double sigm_d(double x) { return 1.0 / (1.0 + exp(-x)); }
static inline int64_t ipow(int64_t b, int64_t e) {
    if (e < 0) return b == 1 ? 1 : (b == -1 ? ((e & 1) ? -1 : 1) : 0);
    uint64_t r = 1, bb = (uint64_t)b;
    while (e) { if (e & 1) r *= bb; bb *= bb; e >>= 1; }
    return (int64_t)r;
}
static inline int64_t irem(int64_t a, int64_t b) { /* python-style, b != 0 guarded */
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t ifmod(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }
static inline float remf_(float a, float b) { float m = fmodf(a, b); return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m; }
static inline double rem_(double a, double b) { double m = fmod(a, b); return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m; }
static inline float gelu_sf(float x) { return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2)); }
static inline double gelu_sd(double x) { return 0.5 * x * (1.0 + erf(x * M_SQRT1_2)); }
#define KBETA 0.7978845608028654 /* sqrt(2/pi) */
#define KKAPPA 0.044715
static inline float gelut_sf(float x) { return 0.5f * x * (1.0f + vtanhf((float)KBETA * (x + (float)KKAPPA * x * x * x))); }
static inline double gelut_sd(double x) { return 0.5 * x * (1.0 + tanh(KBETA * (x + KKAPPA * x * x * x))); }
static inline float gelu_bw_sf(float g, float x) {
    float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
    float pdf = fl_vexpf(-0.5f * x * x) * (float)(0.3989422804014327);
    return g * (cdf + x * pdf);
}
static inline double gelu_bw_sd(double g, double x) {
    double cdf = 0.5 * (1.0 + erf(x * M_SQRT1_2));
    double pdf = exp(-0.5 * x * x) * 0.3989422804014327;
    return g * (cdf + x * pdf);
}
static inline float gelut_bw_sf(float g, float x) {
    float xsq = x * x, inner = (float)KBETA * (x + (float)KKAPPA * xsq * x), t = vtanhf(inner);
    float left = 0.5f * x, right = 1.0f + t;
    float ld = 0.5f * right, rd = left * (1.0f - t * t) * (float)KBETA * (1.0f + 3.0f * (float)KKAPPA * xsq);
    return g * (ld + rd);
}
static inline double gelut_bw_sd(double g, double x) {
    double xsq = x * x, inner = KBETA * (x + KKAPPA * xsq * x), t = tanh(inner);
    double left = 0.5 * x, right = 1.0 + t;
    double ld = 0.5 * right, rd = left * (1.0 - t * t) * KBETA * (1.0 + 3.0 * KKAPPA * xsq);
    return g * (ld + rd);
}
#define SGN(a) ((a) > 0 ? 1 : ((a) < 0 ? -1 : 0))
/* as PyTorch: a NaN bound gives NaN (x != x is false for integers), x is kept when it equals a bound */
#define CLAMP_LO(a, lo) ((lo) != (lo) ? (lo) : ((a) < (lo) ? (lo) : (a)))
#define CLAMP_HI(a, hi) ((hi) != (hi) ? (hi) : ((a) > (hi) ? (hi) : (a)))
#define CLAMP(a, lo, hi) ({ __typeof__(a) t_ = CLAMP_LO(a, lo); CLAMP_HI(t_, hi); })

/* ---- unary ---- */
OP1(neg, -a, -a, (int64_t)(0ull - (uint64_t)a))
OP1(abs, fabsf(a), fabs(a), a < 0 ? (int64_t)(0ull - (uint64_t)a) : a)
OP1F(exp, fl_vexpf(a), exp(a))
OP1F(exp2, exp2f(a), exp2(a))
OP1F(log, logf(a), log(a))
OP1F(log2, log2f(a), log2(a))
OP1F(log10, log10f(a), log10(a))
OP1F(log1p, log1pf(a), log1p(a))
OP1F(expm1, expm1f(a), expm1(a))
OP1F(sqrt, sqrtf(a), sqrt(a))
OP1F(rsqrt, 1.0f / sqrtf(a), 1.0 / sqrt(a))
OP1F(recip, 1.0f / a, 1.0 / a)
OP1F(sin, sinf(a), sin(a))
OP1F(cos, cosf(a), cos(a))
OP1F(tan, tanf(a), tan(a))
OP1F(tanh, vtanhf(a), tanh(a))
OP1F(sigmoid, sigm_f(a), sigm_d(a))
OP1F(erf, erff(a), erf(a))
OP1(sign, (float)SGN(a), (double)SGN(a), SGN(a))
OP1(floor, floorf(a), floor(a), a)
OP1(ceil, ceilf(a), ceil(a), a)
OP1(round, nearbyintf(a), nearbyint(a), a)
OP1(trunc, truncf(a), trunc(a), a)
OP1(relu, a < 0 ? 0.0f : a, a < 0 ? 0.0 : a, a < 0 ? 0 : a)
OP1F(silu, a * sigm_f(a), a * sigm_d(a))
OP1F(gelu, gelu_sf(a), gelu_sd(a))
OP1F(gelut, gelut_sf(a), gelut_sd(a))
OP1(clamp, CLAMP(a, s0, s1), CLAMP(a, s0, s1), CLAMP(a, s0, s1))
OP1(clampmin, CLAMP_LO(a, s0), CLAMP_LO(a, s0), a < s0 ? s0 : a)
OP1(clampmax, CLAMP_HI(a, s0), CLAMP_HI(a, s0), a > s0 ? s0 : a)
OP1F(leaky, a > 0 ? a : a * s0, a > 0 ? a : a * s0)
OP1F(elu, a > 0 ? a * s1 : s0 * s1 * expm1f(a * s2), a > 0 ? a * s1 : s0 * s1 * expm1(a * s2)) /* elu(-0.0) = -0.0 */
OP1(threshold, a <= s0 ? s1 : a, a <= s0 ? s1 : a, a <= s0 ? s1 : a)
OP1(isnan, (float)(a != a), (double)(a != a), 0)
OP1(isinf, (float)(isinf(a) != 0), (double)(isinf(a) != 0), 0)
OP1(lnot, (float)(a == 0), (double)(a == 0), a == 0)
OP1(bnot, 0, 0, ~a)
OP1F(nan2num, a != a ? s0 : (a == INFINITY ? s1 : (a == -INFINITY ? s2 : a)),
     a != a ? s0 : (a == INFINITY ? s1 : (a == -INFINITY ? s2 : a)))
OP1F(powsc, powf(a, s0), pow(a, s0))
OP1F(powsq, a * a, a * a)
OP1F(powsqrt, sqrtf(a), sqrt(a))
OP1(powi, 0, 0, ipow(a, s0))

/* ---- binary ---- */
OP2(add, a + s0 * b, a + s0 * b, (int64_t)((uint64_t)a + (uint64_t)s0 * (uint64_t)b))
OP2(add1, a + b, a + b, (int64_t)((uint64_t)a + (uint64_t)b))
OP2(sub, a - s0 * b, a - s0 * b, (int64_t)((uint64_t)a - (uint64_t)s0 * (uint64_t)b))
OP2(sub1, a - b, a - b, (int64_t)((uint64_t)a - (uint64_t)b))
OP2(rsub, b - s0 * a, b - s0 * a, (int64_t)((uint64_t)b - (uint64_t)s0 * (uint64_t)a))
OP2(mul, a * b, a * b, (int64_t)((uint64_t)a * (uint64_t)b))
OP2F(tdiv, a / b, a / b)
OP2(maximum, (a != a) ? a : ((b != b) ? b : (a > b ? a : b)), (a != a) ? a : ((b != b) ? b : (a > b ? a : b)), a > b ? a : b)
OP2(minimum, (a != a) ? a : ((b != b) ? b : (a < b ? a : b)), (a != a) ? a : ((b != b) ? b : (a < b ? a : b)), a < b ? a : b)
OP2(pow, powf(a, b), pow(a, b), ipow(a, b))
OP2(eq, (float)(a == b), (double)(a == b), a == b)
OP2(ne, (float)(a != b), (double)(a != b), a != b)
OP2(lt, (float)(a < b), (double)(a < b), a < b)
OP2(le, (float)(a <= b), (double)(a <= b), a <= b)
OP2(gt, (float)(a > b), (double)(a > b), a > b)
OP2(ge, (float)(a >= b), (double)(a >= b), a >= b)
OP2(land, (float)(a != 0 && b != 0), (double)(a != 0 && b != 0), a != 0 && b != 0)
OP2(lor, (float)(a != 0 || b != 0), (double)(a != 0 || b != 0), a != 0 || b != 0)
OP2(lxor, (float)((a != 0) != (b != 0)), (double)((a != 0) != (b != 0)), (a != 0) != (b != 0))
OP2(rem, remf_(a, b), rem_(a, b), irem(a, b))
OP2(fmod, fmodf(a, b), fmod(a, b), ifmod(a, b))
OP2F(atan2, atan2f(a, b), atan2(a, b))
OP2(band, 0, 0, a & b)
OP2(bor, 0, 0, a | b)
OP2(bxor, 0, 0, a ^ b)
/* backward: a = grad, b = saved tensor */
OP2(thresh_bw, b <= s0 ? 0.0f : a, b <= s0 ? 0.0 : a, b <= s0 ? 0 : a)
OP2F(gelu_bw, gelu_bw_sf(a, b), gelu_bw_sd(a, b))
OP2F(gelut_bw, gelut_bw_sf(a, b), gelut_bw_sd(a, b))
OP2F(sigmoid_bw, a * (1.0f - b) * b, a * (1.0 - b) * b)
OP2F(tanh_bw, a * (1.0f - b * b), a * (1.0 - b * b))
OP2F(silu_bw, a * sigm_f(b) * (1.0f + b * (1.0f - sigm_f(b))), a * sigm_d(b) * (1.0 + b * (1.0 - sigm_d(b))))
OP2F(hardtanh_bw, (b <= s0 || b >= s1) ? 0.0f : a, (b <= s0 || b >= s1) ? 0.0 : a)
OP2F(leaky_bw, b > 0 ? a : a * s0, b > 0 ? a : a * s0)
/* elu_backward: s0 alpha, s1 scale, s2 input_scale, is_result in p->i[3] */
OP2F(elu_bw_res, b <= 0 ? a * s2 * (b + s0 * s1) : a * s1, b <= 0 ? a * s2 * (b + s0 * s1) : a * s1)
OP2F(elu_bw_in, b <= 0 ? a * s2 * s0 * s1 * expf(b * s2) : a * s1, b <= 0 ? a * s2 * s0 * s1 * exp(b * s2) : a * s1)
OP2F(dropout_bw, a * (b * s0), a * (b * s0))
OP2(masked_fill, b != 0 ? s0 : a, b != 0 ? s0 : a, b != 0 ? s0 : a)

/* ---- ternary ---- */
OP3(where, a != 0 ? b : c, a != 0 ? b : c, a != 0 ? b : c)
OP3(addcmul, a + s0 * b * c, a + s0 * b * c, (int64_t)((uint64_t)a + (uint64_t)s0 * (uint64_t)b * (uint64_t)c))
OP3F(addcdiv, a + s0 * b / c, a + s0 * b / c)
OP3F(lerp, fabsf(c) < 0.5f ? a + c * (b - a) : b - (b - a) * (1.0f - c), fabs(c) < 0.5 ? a + c * (b - a) : b - (b - a) * (1.0 - c))
OP2F(lerps, fabsf(s0) < 0.5f ? a + s0 * (b - a) : b - (b - a) * (1.0f - s0), fabs(s0) < 0.5 ? a + s0 * (b - a) : b - (b - a) * (1.0 - s0))
OP3(clampt, CLAMP(a, b, c), CLAMP(a, b, c), CLAMP(a, b, c))
OP3(clampt_max, (a != a) ? a : ((c != c) ? c : (a > c ? c : a)), (a != a) ? a : ((c != c) ? c : (a > c ? c : a)), a > c ? c : a)
OP3(clampt_min, (a != a) ? a : ((b != b) ? b : (a < b ? b : a)), (a != a) ? a : ((b != b) ? b : (a < b ? b : a)), a < b ? b : a)

/* ------------------------------------------------------------------ */
/* generic kernel bodies                                               */
/* ------------------------------------------------------------------ */
/* Operands are args[opi[k]] (k < nop); params p (already filled). */
static int ew_simple(const fl_tensor_t *in, int n_in, const fl_tensor_t *out, int n_out, const fl_arg_t *args,
                     int n_args, int nop, const int *opi, const ewfn *tab, const kp_t *p, int ct) {
    if (!fl_out_ok(out, n_out)) return UNSUP;
    if (ct < 0) ct = ct_of(out[0].dtype);
    opnds_t o;
    o.n = 0;
    for (int k = 0; k < nop; k++) {
        if (opi[k] >= n_args) return UNSUP;
        int st = opnd_add(&o, in, n_in, &args[opi[k]], &out[0], ct);
        if (st) return st;
    }
    return ew_run(&out[0], &o, ct, tab[ct], p);
}

/* param k from scalar argument a; declines a fractional value for int compute */
static int set_param(kp_t *p, int k, const fl_arg_t *a, int ct) {
    if (!fl_arg_is_num(a)) return UNSUP;
    p->d[k] = fl_arg_num(a);
    p->i[k] = a->kind == FL_ARG_FLOAT ? (int64_t)a->f : a->i;
    if (ct == CT_I && a->kind == FL_ARG_FLOAT && a->f != (double)p->i[k]) return UNSUP;
    return FL_OK;
}

#define OUTCT (fl_out_ok(out, n_out) ? ct_of(out[0].dtype) : CT_F)
#define CHECK_OUT if (!fl_out_ok(out, n_out)) return UNSUP;

/* unary, no params */
#define DEF_UNARY(kname, tab)                                                          \
    static int kname(FL_KERNEL_ARGS) {                                                 \
        FL_UNUSED_KERNEL_ARGS;                                                         \
        kp_t p = {{0}};                                                                \
        return ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, tab, &p, -1); \
    }
DEF_UNARY(k_neg_real, neg_t)
DEF_UNARY(k_abs, abs_t)
DEF_UNARY(k_exp, exp_t)
DEF_UNARY(k_exp2, exp2_t)
DEF_UNARY(k_log, log_t)
DEF_UNARY(k_log2, log2_t)
DEF_UNARY(k_log10, log10_t)
DEF_UNARY(k_log1p, log1p_t)
DEF_UNARY(k_expm1, expm1_t)
DEF_UNARY(k_sqrt, sqrt_t)
DEF_UNARY(k_rsqrt, rsqrt_t)
DEF_UNARY(k_recip, recip_t)
DEF_UNARY(k_sin, sin_t)
DEF_UNARY(k_cos, cos_t)
DEF_UNARY(k_tan, tan_t)
DEF_UNARY(k_tanh, tanh_t)
DEF_UNARY(k_sigmoid, sigmoid_t)
DEF_UNARY(k_erf, erf_t)
DEF_UNARY(k_sign, sign_t)
DEF_UNARY(k_floor, floor_t)
DEF_UNARY(k_ceil, ceil_t)
DEF_UNARY(k_round, round_t)
DEF_UNARY(k_trunc, trunc_t)
DEF_UNARY(k_relu, relu_t)
DEF_UNARY(k_silu, silu_t)
DEF_UNARY(k_bnot, bnot_t)

/* unary whose result is bool but computed in the input's type */
static int unary_pred(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    if (!fl_out_ok(out, n_out) || n_args < 1 || args[0].kind != FL_ARG_TENSOR || args[0].i >= n_in) return UNSUP;
    kp_t p = {{0}};
    int ct = in[args[0].i].dtype == FL_FLOAT64 ? CT_D : (fl_is_floating(in[args[0].i].dtype) ? CT_F : CT_I);
    if (tab == lnot_t) ct = fl_is_floating(in[args[0].i].dtype) ? CT_D : CT_I;
    return ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, tab, &p, ct);
}
static int k_isnan(FL_KERNEL_ARGS) { return unary_pred(stream, device, in, n_in, out, n_out, args, n_args, isnan_t); }
static int k_isinf(FL_KERNEL_ARGS) { return unary_pred(stream, device, in, n_in, out, n_out, args, n_args, isinf_t); }
static int k_lnot(FL_KERNEL_ARGS) { return unary_pred(stream, device, in, n_in, out, n_out, args, n_args, lnot_t); }

static int approx_mode(const fl_arg_t *a) { /* 0 none, 1 tanh, -1 unknown */
    if (a->kind == FL_ARG_OTHER && (a->i == FL_STR_none || a->i == FL_STR_tanh)) return a->i == FL_STR_tanh;
    return -1;
}

static int k_gelu(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int m = n_args >= 2 ? approx_mode(&args[1]) : 0;
    if (m < 0) return UNSUP;
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, m ? gelut_t : gelu_t, &p, -1);
}

/* unary with scalar params at args[pi[k]] */
static int unary_params(FL_KERNEL_ARGS, const ewfn *tab, int np, const int *pi, const double *defaults) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    for (int k = 0; k < np; k++) {
        if (pi[k] < n_args && fl_arg_is_num(&args[pi[k]])) {
            int st = set_param(&p, k, &args[pi[k]], ct);
            if (st) return st;
        } else if (defaults) {
            p.d[k] = defaults[k]; p.i[k] = (int64_t)defaults[k];
        } else {
            return UNSUP;
        }
    }
    return ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, tab, &p, ct);
}
static int k_hardtanh(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clamp_t, 2, (int[]){1, 2}, (double[]){-1, 1});
}
static int k_leaky(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, leaky_t, 1, (int[]){1}, (double[]){0.01});
}
static int k_elu(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, elu_t, 3, (int[]){1, 2, 3}, (double[]){1, 1, 1});
}
static int k_threshold(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, threshold_t, 2, (int[]){1, 2}, NULL);
}
static int k_clamp_min(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clampmin_t, 1, (int[]){1}, NULL);
}
static int k_clamp_max(FL_KERNEL_ARGS) {
    return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clampmax_t, 1, (int[]){1}, NULL);
}
static int k_clamp(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 3) return UNSUP;
    int hmin = args[1].kind != FL_ARG_NONE, hmax = args[2].kind != FL_ARG_NONE;
    if (hmin && hmax) return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clamp_t, 2, (int[]){1, 2}, NULL);
    if (hmin) return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clampmin_t, 1, (int[]){1}, NULL);
    if (hmax) return unary_params(stream, device, in, n_in, out, n_out, args, n_args, clampmax_t, 1, (int[]){2}, NULL);
    return UNSUP; /* PyTorch raises */
}
/* clamp.Tensor: min / max are tensors (or scalars) or None */
static int k_clamp_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 3) return UNSUP;
    int hmin = args[1].kind != FL_ARG_NONE, hmax = args[2].kind != FL_ARG_NONE;
    kp_t p = {{0}};
    if (hmin && hmax) return ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 2}, clampt_t, &p, -1);
    if (hmin) return ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 1}, clampt_min_t, &p, -1);
    if (hmax) return ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 2, 2}, clampt_max_t, &p, -1);
    return UNSUP;
}
static int k_clamp_min_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 1}, clampt_min_t, &p, -1);
}
static int k_clamp_max_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 1}, clampt_max_t, &p, -1);
}

static int k_nan_to_num(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 4) return UNSUP;
    int dt = out[0].dtype;
    if (!fl_is_floating(dt)) { /* integers have no NaN or infinity */
        opnds_t o;
        o.n = 0;
        int st = opnd_add(&o, in, n_in, &args[0], &out[0], CT_I);
        if (st) return st;
        copy_strided(&out[0], &o.t[0]);
        return FL_OK;
    }
    double big = dt == FL_FLOAT32 ? 3.4028234663852886e38 : dt == FL_FLOAT64 ? 1.7976931348623157e308
                 : dt == FL_FLOAT16 ? 65504.0 : 3.3895313892515355e38;
    kp_t p = {{0}};
    p.d[0] = args[1].kind == FL_ARG_NONE ? 0.0 : fl_arg_num(&args[1]);
    p.d[1] = args[2].kind == FL_ARG_NONE ? big : fl_arg_num(&args[2]);
    p.d[2] = args[3].kind == FL_ARG_NONE ? -big : fl_arg_num(&args[3]);
    return ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, nan2num_t, &p, -1);
}

/* ---- binary arithmetic ---- */
static int binary_alpha(FL_KERNEL_ARGS, const ewfn *tab, const ewfn *tab1) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    p.d[0] = 1; p.i[0] = 1;
    if (n_args >= 3 && args[2].kind != FL_ARG_NONE) {
        int st = set_param(&p, 0, &args[2], ct);
        if (st) return st;
    }
    if (p.d[0] == 1.0 && p.i[0] == 1 && tab1) tab = tab1;
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, ct);
}
/* a complex result goes to k_complex.c (the table names each op once) */
#define COMPLEX_TO(op)                                                                          \
    if (fl_out_ok(out, n_out) && fl_is_complex(out[0].dtype))                                      \
        return fl_host_complex_pointwise(op, stream, device, in, n_in, out, n_out, args, n_args)
static int k_add(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_ADD);
    return binary_alpha(stream, device, in, n_in, out, n_out, args, n_args, add_t, add1_t);
}
static int k_sub(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_SUB);
    if (fl_out_ok(out, n_out) && out[0].dtype == FL_BOOL) return UNSUP;
    return binary_alpha(stream, device, in, n_in, out, n_out, args, n_args, sub_t, sub1_t);
}
static int k_rsub(FL_KERNEL_ARGS) {
    if (fl_out_ok(out, n_out) && out[0].dtype == FL_BOOL) return UNSUP;
    return binary_alpha(stream, device, in, n_in, out, n_out, args, n_args, rsub_t, NULL);
}

#define DEF_BINARY(kname, tab)                                                            \
    static int kname(FL_KERNEL_ARGS) {                                                    \
        FL_UNUSED_KERNEL_ARGS;                                                            \
        kp_t p = {{0}};                                                                   \
        return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, -1); \
    }
DEF_BINARY(k_mul_real, mul_t)
static int k_mul(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_MUL);
    return k_mul_real(stream, device, in, n_in, out, n_out, args, n_args);
}
static int k_neg(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_NEG);
    return k_neg_real(stream, device, in, n_in, out, n_out, args, n_args);
}
static int k_conj_physical(FL_KERNEL_ARGS) {
    COMPLEX_TO(FL_CX_CONJ);
    return UNSUP; /* real: PyTorch's conj_physical is a copy, its decomposition serves it */
}
DEF_BINARY(k_maximum, maximum_t)
DEF_BINARY(k_minimum, minimum_t)
DEF_BINARY(k_atan2, atan2_t)
DEF_BINARY(k_sigmoid_bw, sigmoid_bw_t)
DEF_BINARY(k_tanh_bw, tanh_bw_t)
DEF_BINARY(k_silu_bw, silu_bw_t)

static int k_div(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args >= 3 && args[2].kind != FL_ARG_NONE) return UNSUP; /* rounding_mode given (string) */
    COMPLEX_TO(FL_CX_DIV);
    CHECK_OUT;
    if (!fl_is_floating(out[0].dtype)) return UNSUP;
    if (n_args >= 3 && args[2].kind != FL_ARG_NONE) return UNSUP; /* rounding_mode given (string) */
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tdiv_t, &p, -1);
}

/* scans operand for an integer zero (division guard) */
static int has_int_zero(const fl_tensor_t *in, int n_in, const fl_arg_t *a) {
    if (fl_arg_is_num(a)) return a->kind != FL_ARG_FLOAT && a->i == 0;
    if (a->kind != FL_ARG_TENSOR || a->i < 0 || a->i >= n_in) return 0;
    const fl_tensor_t *t = &in[a->i];
    if (fl_is_floating(t->dtype)) return 0;
    fl_iter_t it;
    fl_iter_init(&it, 1, (const fl_tensor_t *[]){t});
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++)
            if (fl_load_f64(t->dtype, fl_elem(t, b[0] + i * it.inner_stride[0])) == 0.0) return 1;
    }
    return 0;
}
static int int_divlike(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2) return UNSUP;
    if (ct_of(out[0].dtype) == CT_I && has_int_zero(in, n_in, &args[1]))
        FL_FAIL(FL_ERR_INVALID, "ZeroDivisionError"); /* PyTorch's words */
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, -1);
}
static int k_remainder(FL_KERNEL_ARGS) { return int_divlike(stream, device, in, n_in, out, n_out, args, n_args, rem_t); }
static int k_fmod(FL_KERNEL_ARGS) { return int_divlike(stream, device, in, n_in, out, n_out, args, n_args, fmod_t); }

static int bitwise(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (fl_is_floating(out[0].dtype)) return UNSUP;
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, CT_I);
}
static int k_band(FL_KERNEL_ARGS) { return bitwise(stream, device, in, n_in, out, n_out, args, n_args, band_t); }
static int k_bor(FL_KERNEL_ARGS) { return bitwise(stream, device, in, n_in, out, n_out, args, n_args, bor_t); }
static int k_bxor(FL_KERNEL_ARGS) { return bitwise(stream, device, in, n_in, out, n_out, args, n_args, bxor_t); }
static int k_bnot_chk(FL_KERNEL_ARGS) {
    if (!fl_out_ok(out, n_out) || fl_is_floating(out[0].dtype)) return UNSUP;
    if (out[0].dtype == FL_BOOL) return k_lnot(stream, device, in, n_in, out, n_out, args, n_args);
    return k_bnot(stream, device, in, n_in, out, n_out, args, n_args);
}

/* pow */
static int k_pow_ts(FL_KERNEL_ARGS) { /* pow.Tensor_Scalar, pow_.Scalar */
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2 || !fl_arg_is_num(&args[1])) return UNSUP;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    if (ct == CT_I) {
        if (args[1].kind == FL_ARG_FLOAT) return UNSUP;
        if (args[1].i < 0) FL_FAIL(FL_ERR_INVALID, "Integers to negative integer powers are not allowed.");
        p.i[0] = args[1].i;
        return ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, powi_t, &p, ct);
    }
    double e = fl_arg_num(&args[1]);
    p.d[0] = e;
    const ewfn *tab = powsc_t;
    if (e == 2.0) tab = powsq_t;
    else if (e == 0.5) tab = powsqrt_t;
    else if (e == 1.0) tab = NULL;
    else if (e == -1.0) tab = recip_t;
    if (!tab) { /* x ** 1: copy with conversion */
        opnds_t o;
        o.n = 0;
        int st = opnd_add(&o, in, n_in, &args[0], &out[0], ct);
        if (st) return st;
        copy_strided(&out[0], &o.t[0]);
        return FL_OK;
    }
    return ew_simple(in, n_in, out, n_out, args, n_args, 1, (int[]){0}, tab, &p, ct);
}
static int k_pow_tt(FL_KERNEL_ARGS) { /* pow.Tensor_Tensor, pow_.Tensor, pow.Scalar */
    FL_UNUSED_KERNEL_ARGS;
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, pow_t, &p, -1);
}

/* ---- comparisons: computed in the promoted input type, result converted ---- */
static int cmp_kernel(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2 || args[0].kind != FL_ARG_TENSOR || args[0].i >= n_in) return UNSUP;
    int da = in[args[0].i].dtype;
    int ct, common;
    if (args[1].kind == FL_ARG_TENSOR) {
        if (args[1].i >= n_in) return UNSUP;
        int db = in[args[1].i].dtype;
        int fa = fl_is_floating(da), fb = fl_is_floating(db);
        if (da == db) common = da;
        else if (!fa && !fb) common = FL_INT64;
        else if (fa && fb) return UNSUP; /* category tie: depends on dimensions */
        else {
            common = fa ? da : db;
            if (common == FL_FLOAT16 || common == FL_BFLOAT16) return UNSUP;
        }
        ct = ct_of(common);
        kp_t p = {{0}};
        return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, ct);
    }
    if (!fl_arg_is_num(&args[1])) return UNSUP;
    /* tensor vs wrapped number */
    if (fl_is_floating(da)) common = da;
    else if (args[1].kind == FL_ARG_FLOAT) common = FL_FLOAT32;
    else if (da == FL_BOOL && args[1].kind == FL_ARG_INT) common = FL_INT64;
    else common = da;
    ct = ct_of(common);
    /* the scalar rounded to the common dtype, then to the compute dtype */
    int64_t tmp = 0;
    fl_arg_t sa;
    scalar_to(&args[1], common, &tmp);
    double v = fl_load_f64(common, &tmp);
    if (ct == CT_I) {
        int64_t iv = 0;
        fl_cvt_row(FL_INT64, &iv, 1, common, &tmp, 0, 1);
        sa = (fl_arg_t){.kind = FL_ARG_INT, .i = iv};
    } else {
        sa = (fl_arg_t){.kind = FL_ARG_FLOAT, .f = v};
    }
    opnds_t o;
    o.n = 0;
    int st = opnd_add(&o, in, n_in, &args[0], &out[0], ct);
    if (st) return st;
    st = opnd_add(&o, in, n_in, &sa, &out[0], ct);
    if (st) return st;
    kp_t p = {{0}};
    return ew_run(&out[0], &o, ct, tab[ct], &p);
}
#define DEF_CMP(kname, tab) \
    static int kname(FL_KERNEL_ARGS) { return cmp_kernel(stream, device, in, n_in, out, n_out, args, n_args, tab); }
DEF_CMP(k_eq, eq_t)
DEF_CMP(k_ne, ne_t)
DEF_CMP(k_lt, lt_t)
DEF_CMP(k_le, le_t)
DEF_CMP(k_gt, gt_t)
DEF_CMP(k_ge, ge_t)

static int logical2(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    /* double holds every value's truthiness exactly */
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, tab, &p, CT_D);
}
static int k_land(FL_KERNEL_ARGS) { return logical2(stream, device, in, n_in, out, n_out, args, n_args, land_t); }
static int k_lor(FL_KERNEL_ARGS) { return logical2(stream, device, in, n_in, out, n_out, args, n_args, lor_t); }
static int k_lxor(FL_KERNEL_ARGS) { return logical2(stream, device, in, n_in, out, n_out, args, n_args, lxor_t); }

/* ---- pointwise backward ---- */
static int k_threshold_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    int ct = ct_of(out[0].dtype);
    if (n_args < 3 || set_param(&p, 0, &args[2], ct)) return UNSUP;
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, thresh_bw_t, &p, ct);
}
static int k_gelu_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int m = n_args >= 3 ? approx_mode(&args[2]) : 0;
    if (m < 0) return UNSUP;
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, m ? gelut_bw_t : gelu_bw_t, &p, -1);
}
static int k_hardtanh_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 4 || set_param(&p, 0, &args[2], CT_F) || set_param(&p, 1, &args[3], CT_F)) return UNSUP;
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, hardtanh_bw_t, &p, -1);
}
static int k_leaky_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 3 || set_param(&p, 0, &args[2], CT_F)) return UNSUP;
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, leaky_bw_t, &p, -1);
}
static int k_elu_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 6 || set_param(&p, 0, &args[1], CT_F) || set_param(&p, 1, &args[2], CT_F) ||
        set_param(&p, 2, &args[3], CT_F) || args[4].kind != FL_ARG_BOOL)
        return UNSUP;
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 5}, args[4].i ? elu_bw_res_t : elu_bw_in_t, &p, -1);
}
static int k_dropout_bw(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 3 || set_param(&p, 0, &args[2], CT_F)) return UNSUP;
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, dropout_bw_t, &p, -1);
}

/* ---- ternary ---- */
static int k_where(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 2}, where_t, &p, -1);
}
static int addc(FL_KERNEL_ARGS, const ewfn *tab) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    p.d[0] = 1; p.i[0] = 1;
    if (n_args >= 4 && args[3].kind != FL_ARG_NONE && set_param(&p, 0, &args[3], ct)) return UNSUP;
    return ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 2}, tab, &p, ct);
}
static int k_addcmul(FL_KERNEL_ARGS) { return addc(stream, device, in, n_in, out, n_out, args, n_args, addcmul_t); }
static int k_addcdiv(FL_KERNEL_ARGS) {
    if (fl_out_ok(out, n_out) && !fl_is_floating(out[0].dtype)) return UNSUP;
    return addc(stream, device, in, n_in, out, n_out, args, n_args, addcdiv_t);
}
static int k_lerp_s(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    kp_t p = {{0}};
    if (n_args < 3 || set_param(&p, 0, &args[2], CT_F)) return UNSUP;
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, lerps_t, &p, -1);
}
static int k_lerp_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args >= 3 && fl_arg_is_num(&args[2])) return k_lerp_s(stream, device, in, n_in, out, n_out, args, n_args);
    kp_t p = {{0}};
    return ew_simple(in, n_in, out, n_out, args, n_args, 3, (int[]){0, 1, 2}, lerp_t, &p, -1);
}
static int k_masked_fill(FL_KERNEL_ARGS) { /* .Scalar and .Tensor (0-dim value) */
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 3) return UNSUP;
    int ct = ct_of(out[0].dtype);
    kp_t p = {{0}};
    /* the value rounded to the output dtype first */
    int64_t tmp = 0;
    if (args[2].kind == FL_ARG_TENSOR) {
        if (args[2].i < 0 || args[2].i >= n_in) return UNSUP;
        const fl_tensor_t *v = &in[args[2].i];
        if (v->ndim != 0) return UNSUP;
        fl_cvt_row(out[0].dtype, &tmp, 1, v->dtype, fl_elem(v, v->offset), 0, 1);
    } else if (fl_arg_is_num(&args[2])) {
        scalar_to(&args[2], out[0].dtype, &tmp);
    } else {
        return UNSUP;
    }
    p.d[0] = fl_load_f64(out[0].dtype, &tmp);
    fl_cvt_row(FL_INT64, &p.i[0], 1, out[0].dtype, &tmp, 0, 1);
    return ew_simple(in, n_in, out, n_out, args, n_args, 2, (int[]){0, 1}, masked_fill_t, &p, ct);
}

/* ------------------------------------------------------------------ */
/* random                                                              */
/* ------------------------------------------------------------------ */
static inline uint64_t rand_bits(uint64_t seed, uint64_t counter) { return fl_splitmix64(seed ^ fl_splitmix64(counter)); }

enum { R_UNIFORM, R_NORMAL, R_BERN, R_INT, R_EXP };

/* out[k] (logical index k) = f(k); p: a, b parameters; ibase/irange for ints */
/* The largest value of a floating dtype at or below the integer v: random integers drawn in [from, to) stay
 * below `to` after the cast (rounding to nearest would turn to - 1 into `to` once the dtype's spacing
 * exceeds 1, as PyTorch's CPU kernel never does). */
static void store_int_floor(int dt, void *p, int64_t v) {
    if (dt != FL_FLOAT16 && dt != FL_BFLOAT16 && dt != FL_FLOAT32) {
        fl_store_f64(dt, p, (double)v);
        return;
    }
    float f = (float)v;
    if ((double)f > (double)v) f = nextafterf(f, -INFINITY);
    fl_store_f64(dt, p, f);
    if (dt == FL_FLOAT32 || fl_load_f64(dt, p) <= (double)v) return;
    uint16_t *h = (uint16_t *)p; /* one step down: magnitude down for positives, up for negatives */
    if (fl_load_f64(dt, p) > 0) *h -= 1; else *h += 1;
}

static int rand_fill(int device, const fl_tensor_t *t, int kind, double a, double b, int64_t ifrom, uint64_t irange) {
    int64_t n = fl_numel(t);
    if (n == 0) return FL_OK;
    uint64_t seed;
    uint64_t per = kind == R_NORMAL ? 2 : 1;
    uint64_t start = fl_host_rng_reserve(device, (uint64_t)n * per, &seed);
    fl_iter_t it;
    fl_iter_init(&it, 1, (const fl_tensor_t *[]){t});
    int64_t nchunk = (it.inner + CH - 1) / CH, units = it.outer * nchunk;
    int isint = kind == R_INT;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        double buf[CH];
        int64_t ibuf[CH];
        int64_t row = u / nchunk, c0 = (u % nchunk) * CH;
        int64_t len = it.inner - c0 < CH ? it.inner - c0 : CH;
        uint64_t k0 = (uint64_t)(row * it.inner + c0);
        for (int64_t i = 0; i < len; i++) {
            uint64_t k = k0 + (uint64_t)i;
            switch (kind) {
            case R_UNIFORM: buf[i] = a + (b - a) * fl_rand_uniform(seed, start + k); break;
            case R_NORMAL: {
                double u1 = fl_rand_uniform(seed, start + 2 * k), u2 = fl_rand_uniform(seed, start + 2 * k + 1);
                buf[i] = a + b * sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
                break;
            }
            case R_BERN: buf[i] = fl_rand_uniform(seed, start + k) < a ? 1.0 : 0.0; break;
            case R_EXP: buf[i] = -log1p(-fl_rand_uniform(seed, start + k)) / a; break;
            case R_INT: ibuf[i] = (int64_t)((uint64_t)ifrom + (irange ? rand_bits(seed, start + k) % irange : rand_bits(seed, start + k))); break;
            }
        }
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, row, base);
        if (isint && fl_is_floating(t->dtype)) {
            for (int64_t i = 0; i < len; i++)
                store_int_floor(t->dtype, fl_elem(t, base[0] + (c0 + i) * it.inner_stride[0]), ibuf[i]);
        } else if (isint) fl_cvt_row(t->dtype, fl_elem(t, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_INT64, ibuf, 1, len);
        else fl_cvt_row(t->dtype, fl_elem(t, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_FLOAT64, buf, 1, len);
    }
    return FL_OK;
}

static int k_uniform_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (!fl_is_floating(out[0].dtype) || n_args < 3) return UNSUP;
    double a = fl_arg_num(&args[1]), b = fl_arg_num(&args[2]);
    if (!(a <= b)) FL_FAIL(FL_ERR_INVALID, "uniform_ expects to return a [from, to) range, but found from=%g > to=%g", a, b);
    return rand_fill(device, &out[0], R_UNIFORM, a, b, 0, 0);
}
static int k_normal_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (!fl_is_floating(out[0].dtype) || n_args < 3) return UNSUP;
    double m = fl_arg_num(&args[1]), s = fl_arg_num(&args[2]);
    if (s < 0) FL_FAIL(FL_ERR_INVALID, "normal expects std >= 0.0, but found std %g", s);
    return rand_fill(device, &out[0], R_NORMAL, m, s, 0, 0);
}
static int k_exponential_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (!fl_is_floating(out[0].dtype) || n_args < 2) return UNSUP;
    double l = fl_arg_num(&args[1]);
    if (!(l > 0)) FL_FAIL(FL_ERR_INVALID, "exponential_ expects lambda > 0.0, but found lambda=%g", l);
    return rand_fill(device, &out[0], R_EXP, l, 0, 0, 0);
}
static int k_bernoulli_f(FL_KERNEL_ARGS) { /* bernoulli_.float(self, p), bernoulli.p(self, p) */
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2 || !fl_arg_is_num(&args[1])) return UNSUP;
    double p = fl_arg_num(&args[1]);
    if (!(p >= 0 && p <= 1)) FL_FAIL(FL_ERR_INVALID, "bernoulli_ expects p to be in [0, 1], but got p=%g", p);
    return rand_fill(device, &out[0], R_BERN, p, 0, 0, 0);
}
/* bernoulli(self) / bernoulli_.Tensor(self, p): probabilities from a tensor */
static int bern_tensor(int device, const fl_tensor_t *o, const fl_tensor_t *prob) {
    fl_tensor_t pb;
    if (fl_bcast(prob, o->ndim, o->sizes, &pb)) return UNSUP;
    int64_t n = fl_numel(o);
    if (n == 0) return FL_OK;
    uint64_t seed, start = fl_host_rng_reserve(device, (uint64_t)n, &seed);
    fl_iter_t it;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){o, &pb});
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, r, base);
        for (int64_t i = 0; i < it.inner; i++) {
            double pv = fl_load_f64(pb.dtype, fl_elem(&pb, base[1] + i * it.inner_stride[1]));
            double v = fl_rand_uniform(seed, start + (uint64_t)(r * it.inner + i)) < pv ? 1.0 : 0.0;
            fl_store_f64(o->dtype, fl_elem(o, base[0] + i * it.inner_stride[0]), v);
        }
    }
    return FL_OK;
}
static int k_bernoulli(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 1 || args[0].kind != FL_ARG_TENSOR || args[0].i >= n_in) return UNSUP;
    if (!fl_is_floating(in[args[0].i].dtype)) return UNSUP;
    return bern_tensor(device, &out[0], &in[args[0].i]);
}
static int k_bernoulli_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2) return UNSUP;
    if (fl_arg_is_num(&args[1])) return k_bernoulli_f(stream, device, in, n_in, out, n_out, args, n_args);
    if (args[1].kind != FL_ARG_TENSOR || args[1].i >= n_in) return UNSUP;
    return bern_tensor(device, &out[0], &in[args[1].i]);
}

static int dtype_int_range(int dt, int64_t *lo, int64_t *hi) {
    switch (dt) {
    case FL_INT64: *lo = INT64_MIN; *hi = INT64_MAX; return 0;
    case FL_INT32: *lo = INT32_MIN; *hi = INT32_MAX; return 0;
    case FL_INT16: *lo = INT16_MIN; *hi = INT16_MAX; return 0;
    case FL_INT8: *lo = INT8_MIN; *hi = INT8_MAX; return 0;
    case FL_UINT8: *lo = 0; *hi = 255; return 0;
    case FL_BOOL: *lo = 0; *hi = 1; return 0;
    case FL_FLOAT32: *lo = -(1ll << 24); *hi = 1ll << 24; return 0;
    case FL_FLOAT64: *lo = -(1ll << 53); *hi = 1ll << 53; return 0;
    case FL_FLOAT16: *lo = -(1ll << 11); *hi = 1ll << 11; return 0;
    case FL_BFLOAT16: *lo = -(1ll << 8); *hi = 1ll << 8; return 0;
    }
    return -1;
}
/* values in [from, to) ; to_incl: [from, hi] */
static int random_range(int device, const fl_tensor_t *t, int64_t from, int64_t to, int to_incl) {
    uint64_t range = to_incl ? (uint64_t)to - (uint64_t)from + 1 : (uint64_t)to - (uint64_t)from;
    if (!to_incl && to <= from) FL_FAIL(FL_ERR_INVALID, "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                                         (long long)from, (long long)to);
    return rand_fill(device, t, R_INT, 0, 0, from, range); /* range 0 means all 2^64 values */
}
static int k_random_from(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 3 || args[1].kind != FL_ARG_INT) return UNSUP;
    int64_t lo, hi;
    if (dtype_int_range(out[0].dtype, &lo, &hi)) return UNSUP;
    if (args[2].kind == FL_ARG_NONE) return random_range(device, &out[0], args[1].i, hi, 1);
    if (args[2].kind != FL_ARG_INT) return UNSUP;
    return random_range(device, &out[0], args[1].i, args[2].i, 0);
}
static int k_random_to(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    return random_range(device, &out[0], 0, args[1].i, 0);
}
static int k_random_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    int64_t lo, hi;
    if (dtype_int_range(out[0].dtype, &lo, &hi)) return UNSUP;
    return random_range(device, &out[0], 0, hi, 1);
}

/* native_dropout(input, p, train?) -> (output, mask) */
static int k_native_dropout(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_out < 2 || !fl_out_ok(out, n_out) || fl_out_ok(out + 1, 1) == 0 || out[1].ndim != out[0].ndim) return UNSUP;
    if (n_args < 3 || args[0].kind != FL_ARG_TENSOR || args[0].i >= n_in || !fl_arg_is_num(&args[1])) return UNSUP;
    if (!fl_is_floating(out[0].dtype)) return UNSUP;
    double p = fl_arg_num(&args[1]);
    int train = args[2].kind == FL_ARG_NONE ? 1 : (int)args[2].i;
    fl_tensor_t x;
    if (fl_bcast(&in[args[0].i], out[0].ndim, out[0].sizes, &x)) return UNSUP;
    for (int d = 0; d < out[0].ndim; d++)
        if (out[1].sizes[d] != out[0].sizes[d]) return UNSUP;
    int64_t n = fl_numel(&out[0]);
    if (!train || n == 0) {
        copy_strided(&out[0], &x);
        uint8_t one = 1;
        fl_tensor_t s = {.data = &one, .dtype = FL_BOOL, .ndim = 0}, sb;
        fl_bcast(&s, out[1].ndim, out[1].sizes, &sb);
        copy_strided(&out[1], &sb);
        return FL_OK;
    }
    if (!(p >= 0 && p <= 1)) FL_FAIL(FL_ERR_INVALID, "dropout probability has to be between 0 and 1, but got %g", p);
    double keep = 1.0 - p;
    float scale = keep > 0 ? (float)(1.0 / keep) : 0.0f;
    double dscale = keep > 0 ? 1.0 / keep : 0.0;
    uint64_t seed, start = fl_host_rng_reserve(device, (uint64_t)n, &seed);
    fl_iter_t it;
    fl_iter_init(&it, 3, (const fl_tensor_t *[]){&out[0], &out[1], &x});
    int64_t nchunk = (it.inner + CH - 1) / CH, units = it.outer * nchunk;
    int ct = ct_of(out[0].dtype);
    const fl_tensor_t *o0 = &out[0], *o1 = &out[1];
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        double xb[CH], ob[CH];
        uint8_t mb[CH];
        int64_t row = u / nchunk, c0 = (u % nchunk) * CH;
        int64_t len = it.inner - c0 < CH ? it.inner - c0 : CH;
        uint64_t k0 = (uint64_t)(row * it.inner + c0);
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, row, base);
        for (int64_t i = 0; i < len; i++) mb[i] = keep > 0 && fl_rand_uniform(seed, start + k0 + (uint64_t)i) < keep;
        if (ct == CT_F) {
            float *xf = (float *)xb, *of = (float *)ob;
            fl_cvt_row(FL_FLOAT32, xf, 1, x.dtype, fl_elem(&x, base[2] + c0 * it.inner_stride[2]), it.inner_stride[2], len);
            for (int64_t i = 0; i < len; i++) of[i] = mb[i] ? xf[i] * scale : 0.0f;
            fl_cvt_row(o0->dtype, fl_elem(o0, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_FLOAT32, of, 1, len);
        } else {
            fl_cvt_row(FL_FLOAT64, xb, 1, x.dtype, fl_elem(&x, base[2] + c0 * it.inner_stride[2]), it.inner_stride[2], len);
            for (int64_t i = 0; i < len; i++) ob[i] = mb[i] ? xb[i] * dscale : 0.0;
            fl_cvt_row(o0->dtype, fl_elem(o0, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_FLOAT64, ob, 1, len);
        }
        fl_cvt_row(o1->dtype, fl_elem(o1, base[1] + c0 * it.inner_stride[1]), it.inner_stride[1], FL_BOOL, mb, 1, len);
    }
    return FL_OK;
}

/* ------------------------------------------------------------------ */
/* table                                                               */
/* ------------------------------------------------------------------ */
#define ALL FL_ALL_DTYPES
#define FLT FL_FLOATS
#define NUM (FL_FLOATS | FL_INTS)
#define INTB (FL_INTS | FL_DTYPE_BIT(FL_BOOL))
#define CPX FL_COMPLEX
#define E(name, mask, fn) {name, mask, 0, fn}

static const fl_kernel_entry_t entries[] = {
    E("aten::copy_", ALL | CPX, k_copy_),
    E("aten::fill_.Scalar", ALL | CPX, k_fill_),
    E("aten::fill_.Tensor", ALL | CPX, k_fill_),
    E("aten::zero_", ALL | CPX, k_zero_),
    /* binary arithmetic (complex results: k_complex.c) */
    E("aten::add.Tensor", ALL | CPX, k_add), E("aten::add_.Tensor", ALL | CPX, k_add),
    E("aten::add.Scalar", ALL | CPX, k_add), E("aten::add_.Scalar", ALL | CPX, k_add),
    E("aten::sub.Tensor", NUM | CPX, k_sub), E("aten::sub_.Tensor", NUM | CPX, k_sub),
    E("aten::sub.Scalar", NUM | CPX, k_sub), E("aten::sub_.Scalar", NUM | CPX, k_sub),
    E("aten::rsub.Scalar", NUM, k_rsub), E("aten::rsub.Tensor", NUM, k_rsub),
    E("aten::mul.Tensor", ALL | CPX, k_mul), E("aten::mul_.Tensor", ALL | CPX, k_mul),
    E("aten::mul.Scalar", ALL | CPX, k_mul), E("aten::mul_.Scalar", ALL | CPX, k_mul),
    E("aten::div.Tensor", ALL | CPX, k_div), E("aten::div_.Tensor", ALL | CPX, k_div),
    E("aten::div.Scalar", ALL | CPX, k_div), E("aten::div_.Scalar", ALL | CPX, k_div),
    E("aten::maximum", ALL, k_maximum), E("aten::minimum", ALL, k_minimum),
    E("aten::pow.Tensor_Scalar", NUM, k_pow_ts), E("aten::pow_.Scalar", NUM, k_pow_ts),
    E("aten::pow.Tensor_Tensor", NUM, k_pow_tt), E("aten::pow_.Tensor", NUM, k_pow_tt),
    E("aten::remainder.Tensor", NUM, k_remainder), E("aten::remainder_.Tensor", NUM, k_remainder),
    E("aten::remainder.Scalar", NUM, k_remainder), E("aten::remainder_.Scalar", NUM, k_remainder),
    E("aten::fmod.Tensor", NUM, k_fmod), E("aten::fmod_.Tensor", NUM, k_fmod),
    E("aten::fmod.Scalar", NUM, k_fmod), E("aten::fmod_.Scalar", NUM, k_fmod),
    E("aten::atan2", ALL, k_atan2), E("aten::atan2_", ALL, k_atan2),
    E("aten::bitwise_and.Tensor", INTB, k_band), E("aten::bitwise_and_.Tensor", INTB, k_band),
    E("aten::bitwise_and.Scalar", INTB, k_band), E("aten::bitwise_and_.Scalar", INTB, k_band),
    E("aten::bitwise_or.Tensor", INTB, k_bor), E("aten::bitwise_or_.Tensor", INTB, k_bor),
    E("aten::bitwise_or.Scalar", INTB, k_bor), E("aten::bitwise_or_.Scalar", INTB, k_bor),
    E("aten::bitwise_xor.Tensor", INTB, k_bxor), E("aten::bitwise_xor_.Tensor", INTB, k_bxor),
    E("aten::bitwise_xor.Scalar", INTB, k_bxor), E("aten::bitwise_xor_.Scalar", INTB, k_bxor),
    E("aten::bitwise_not", INTB, k_bnot_chk), E("aten::bitwise_not_", INTB, k_bnot_chk),
    /* comparisons */
    E("aten::eq.Tensor", ALL, k_eq), E("aten::eq.Scalar", ALL, k_eq), E("aten::eq_.Tensor", ALL, k_eq), E("aten::eq_.Scalar", ALL, k_eq),
    E("aten::ne.Tensor", ALL, k_ne), E("aten::ne.Scalar", ALL, k_ne), E("aten::ne_.Tensor", ALL, k_ne), E("aten::ne_.Scalar", ALL, k_ne),
    E("aten::lt.Tensor", ALL, k_lt), E("aten::lt.Scalar", ALL, k_lt), E("aten::lt_.Tensor", ALL, k_lt), E("aten::lt_.Scalar", ALL, k_lt),
    E("aten::le.Tensor", ALL, k_le), E("aten::le.Scalar", ALL, k_le), E("aten::le_.Tensor", ALL, k_le), E("aten::le_.Scalar", ALL, k_le),
    E("aten::gt.Tensor", ALL, k_gt), E("aten::gt.Scalar", ALL, k_gt), E("aten::gt_.Tensor", ALL, k_gt), E("aten::gt_.Scalar", ALL, k_gt),
    E("aten::ge.Tensor", ALL, k_ge), E("aten::ge.Scalar", ALL, k_ge), E("aten::ge_.Tensor", ALL, k_ge), E("aten::ge_.Scalar", ALL, k_ge),
    E("aten::logical_and", ALL, k_land), E("aten::logical_and_", ALL, k_land),
    E("aten::logical_or", ALL, k_lor), E("aten::logical_or_", ALL, k_lor),
    E("aten::logical_xor", ALL, k_lxor), E("aten::logical_xor_", ALL, k_lxor),
    E("aten::logical_not", ALL, k_lnot), E("aten::logical_not_", ALL, k_lnot),
    E("aten::isnan", ALL, k_isnan), E("aten::isinf", ALL, k_isinf),
    /* unary */
    E("aten::neg", NUM | CPX, k_neg), E("aten::neg_", NUM | CPX, k_neg),
    E("aten::_conj_physical", CPX, k_conj_physical), E("aten::conj_physical_", CPX, k_conj_physical),
    E("aten::abs", NUM, k_abs), E("aten::abs_", NUM, k_abs),
    E("aten::exp", ALL, k_exp), E("aten::exp_", FLT, k_exp),
    E("aten::exp2", ALL, k_exp2), E("aten::exp2_", FLT, k_exp2),
    E("aten::log", ALL, k_log), E("aten::log_", FLT, k_log),
    E("aten::log2", ALL, k_log2), E("aten::log2_", FLT, k_log2),
    E("aten::log10", ALL, k_log10), E("aten::log10_", FLT, k_log10),
    E("aten::log1p", ALL, k_log1p), E("aten::log1p_", FLT, k_log1p),
    E("aten::expm1", ALL, k_expm1), E("aten::expm1_", FLT, k_expm1),
    E("aten::sqrt", ALL, k_sqrt), E("aten::sqrt_", FLT, k_sqrt),
    E("aten::rsqrt", ALL, k_rsqrt), E("aten::rsqrt_", FLT, k_rsqrt),
    E("aten::reciprocal", ALL, k_recip), E("aten::reciprocal_", FLT, k_recip),
    E("aten::sin", ALL, k_sin), E("aten::sin_", FLT, k_sin),
    E("aten::cos", ALL, k_cos), E("aten::cos_", FLT, k_cos),
    E("aten::tan", ALL, k_tan), E("aten::tan_", FLT, k_tan),
    E("aten::tanh", ALL, k_tanh), E("aten::tanh_", FLT, k_tanh),
    E("aten::sigmoid", ALL, k_sigmoid), E("aten::sigmoid_", FLT, k_sigmoid),
    E("aten::erf", ALL, k_erf), E("aten::erf_", FLT, k_erf),
    E("aten::sign", NUM, k_sign), E("aten::sign_", NUM, k_sign),
    E("aten::floor", NUM, k_floor), E("aten::floor_", NUM, k_floor),
    E("aten::ceil", NUM, k_ceil), E("aten::ceil_", NUM, k_ceil),
    E("aten::round", NUM, k_round), E("aten::round_", NUM, k_round),
    E("aten::trunc", NUM, k_trunc), E("aten::trunc_", NUM, k_trunc),
    E("aten::relu", NUM, k_relu), E("aten::relu_", NUM, k_relu),
    E("aten::silu", FLT, k_silu), E("aten::silu_", FLT, k_silu),
    E("aten::gelu", FLT, k_gelu), E("aten::gelu_", FLT, k_gelu),
    E("aten::hardtanh", NUM, k_hardtanh), E("aten::hardtanh_", NUM, k_hardtanh),
    E("aten::leaky_relu", FLT, k_leaky), E("aten::leaky_relu_", FLT, k_leaky),
    E("aten::elu", FLT, k_elu), E("aten::elu_", FLT, k_elu),
    E("aten::threshold", NUM, k_threshold), E("aten::threshold_", NUM, k_threshold),
    E("aten::clamp", NUM, k_clamp), E("aten::clamp_", NUM, k_clamp),
    E("aten::clamp.Tensor", NUM, k_clamp_t), E("aten::clamp_.Tensor", NUM, k_clamp_t),
    E("aten::clamp_min", NUM, k_clamp_min), E("aten::clamp_min_", NUM, k_clamp_min),
    E("aten::clamp_max", NUM, k_clamp_max), E("aten::clamp_max_", NUM, k_clamp_max),
    E("aten::clamp_min.Tensor", NUM, k_clamp_min_t), E("aten::clamp_min_.Tensor", NUM, k_clamp_min_t),
    E("aten::clamp_max.Tensor", NUM, k_clamp_max_t), E("aten::clamp_max_.Tensor", NUM, k_clamp_max_t),
    E("aten::nan_to_num", NUM, k_nan_to_num), E("aten::nan_to_num_", NUM, k_nan_to_num),
    /* pointwise backward */
    E("aten::threshold_backward", NUM, k_threshold_bw),
    E("aten::gelu_backward", FLT, k_gelu_bw),
    E("aten::sigmoid_backward", FLT, k_sigmoid_bw),
    E("aten::tanh_backward", FLT, k_tanh_bw),
    E("aten::silu_backward", FLT, k_silu_bw),
    E("aten::hardtanh_backward", FLT, k_hardtanh_bw),
    E("aten::leaky_relu_backward", FLT, k_leaky_bw),
    E("aten::elu_backward", FLT, k_elu_bw),
    E("aten::native_dropout_backward", FLT, k_dropout_bw),
    /* ternary */
    E("aten::where.self", ALL, k_where),
    E("aten::addcmul", NUM, k_addcmul), E("aten::addcmul_", NUM, k_addcmul),
    E("aten::addcdiv", FLT, k_addcdiv), E("aten::addcdiv_", FLT, k_addcdiv),
    E("aten::lerp.Scalar", FLT, k_lerp_s), E("aten::lerp_.Scalar", FLT, k_lerp_s),
    E("aten::lerp.Tensor", FLT, k_lerp_t), E("aten::lerp_.Tensor", FLT, k_lerp_t),
    E("aten::masked_fill.Scalar", ALL, k_masked_fill), E("aten::masked_fill_.Scalar", ALL, k_masked_fill),
    E("aten::masked_fill.Tensor", ALL, k_masked_fill), E("aten::masked_fill_.Tensor", ALL, k_masked_fill),
    /* random */
    E("aten::uniform_", FLT, k_uniform_),
    E("aten::normal_", FLT, k_normal_),
    E("aten::exponential_", FLT, k_exponential_),
    E("aten::bernoulli_.float", ALL, k_bernoulli_f),
    E("aten::bernoulli.p", ALL, k_bernoulli_f),
    E("aten::bernoulli_.Tensor", ALL, k_bernoulli_t),
    E("aten::bernoulli", FLT, k_bernoulli),
    E("aten::random_.from", ALL, k_random_from),
    E("aten::random_.to", ALL, k_random_to),
    E("aten::random_", ALL, k_random_),
    E("aten::native_dropout", FLT, k_native_dropout),
};

const fl_kernel_group_t fl_host_group_elementwise = {entries, (int)(sizeof entries / sizeof entries[0])};
