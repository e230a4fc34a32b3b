/* Host kernels: the elementwise engine -- strided copies with dtype conversion
 * (copy_, fill_, zero_) and the chunked operand driver every pointwise kernel
 * runs through (fl_ew_run, fl_ew_simple). How it works, and the other files of
 * the family: k_elementwise.h. */
#pragma GCC optimize("no-math-errno") /* as in every file of the family (k_elementwise.h) */
#include "k_elementwise.h"

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
 * next-outer dim. Moves 32x32 tiles so both sides stream through cache. From
 * BLOCKS_MIN elements on, each tile goes as 8x8 blocks through a local array
 * (contiguous reads of 8, contiguous writes of 8): 2-3x faster once the data
 * is out of cache (1M floats 1827 -> 636 us, one thread), slower while it is
 * in, hence the threshold (bench_small.py --kernels --kernel-ops copy_T). */
#define TILE 32
#define BLOCKS_MIN ((int64_t)1 << 17)
#define TILE_LOOP(T)                                                                          \
    {                                                                                         \
        T *d_ = (T *)j->dst->data;                                                            \
        const T *s_ = (const T *)j->src->data;                                                \
        for (int64_t a = a0; a < a1; a++)                                                     \
            for (int64_t b = b0; b < b1; b++) d_[db + a * das + b] = s_[sb + a + b * sbs];    \
    }                                                                                         \
    break;
#define BLOCK_LOOP(T)                                                                         \
    {                                                                                         \
        T *d_ = (T *)j->dst->data + db;                                                       \
        const T *s_ = (const T *)j->src->data + sb;                                           \
        int64_t a8 = a0 + (a1 - a0) / 8 * 8, b8 = b0 + (b1 - b0) / 8 * 8;                     \
        for (int64_t a = a0; a < a8; a += 8)                                                  \
            for (int64_t b = b0; b < b8; b += 8) {                                            \
                T t_[8][8];                                                                   \
                for (int y = 0; y < 8; y++)                                                   \
                    for (int x = 0; x < 8; x++) t_[x][y] = s_[a + x + (b + y) * sbs];         \
                for (int x = 0; x < 8; x++)                                                   \
                    for (int y = 0; y < 8; y++) d_[(a + x) * das + b + y] = t_[x][y];         \
            }                                                                                 \
        for (int64_t a = a0; a < a1; a++) /* the edges: rows past a8, columns past b8 */       \
            for (int64_t b = a < a8 ? b8 : b0; b < b1; b++) d_[a * das + b] = s_[a + b * sbs]; \
    }                                                                                         \
    break;
typedef struct {
    const fl_tensor_t *dst, *src;
    const fl_iter_t *it;
    int64_t A, B, das, sbs, ta, tb;
    size_t isz;
} tiled_job_t;

/* tile u of a tiled copy: its rows [a0, a1) and columns [b0, b1), and its plane's first elements in dst, src */
static inline void tile_of(const tiled_job_t *j, int64_t u, int64_t *a0, int64_t *a1, int64_t *b0, int64_t *b1,
                           int64_t *db, int64_t *sb) {
    int64_t pl = u / (j->ta * j->tb), rem = u % (j->ta * j->tb);
    *a0 = (rem / j->tb) * TILE;
    *b0 = (rem % j->tb) * TILE;
    *a1 = *a0 + TILE < j->A ? *a0 + TILE : j->A;
    *b1 = *b0 + TILE < j->B ? *b0 + TILE : j->B;
    int64_t base[FL_ITER_MAX];
    fl_iter_row(j->it, pl * j->A, base);
    *db = base[0];
    *sb = base[1];
}

static void tiled_units(void *job, int64_t u0, int64_t u1) {
    const tiled_job_t *j = job;
    int64_t das = j->das, sbs = j->sbs;
    for (int64_t u = u0; u < u1; u++) {
        int64_t a0, a1, b0, b1, db, sb;
        tile_of(j, u, &a0, &a1, &b0, &b1, &db, &sb);
        switch (j->isz) {
        case 2: TILE_LOOP(uint16_t)
        case 4: TILE_LOOP(uint32_t)
        default: TILE_LOOP(uint64_t)
        }
    }
}

static void block_units(void *job, int64_t u0, int64_t u1) { /* tiled_units' tiles as 8x8 blocks */
    const tiled_job_t *j = job;
    int64_t das = j->das, sbs = j->sbs;
    for (int64_t u = u0; u < u1; u++) {
        int64_t a0, a1, b0, b1, db, sb;
        tile_of(j, u, &a0, &a1, &b0, &b1, &db, &sb);
        switch (j->isz) {
        case 2: BLOCK_LOOP(uint16_t)
        case 4: BLOCK_LOOP(uint32_t)
        default: BLOCK_LOOP(uint64_t)
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
    fl_par_for(units, fl_par_grain(units, numel, PAR_MIN, PAR_CHUNK), numel >= BLOCKS_MIN ? block_units : tiled_units,
               &job);
    return 0;
}

/* Same-dtype copy whose rows are short (an im2col's kernel windows, rows of 3 elements): the rows walked
 * with an odometer instead of a division per dim per row, the elements moved at their width instead of
 * through the converting row copy (bench_small.py --kernels --kernel-ops copy_win). */
#define SHORT_ROW 16
#define ROWS_LOOP(T)                                                                      \
    {                                                                                     \
        T *d_ = (T *)j->dst->data;                                                        \
        const T *s_ = (const T *)j->src->data;                                            \
        for (int64_t r = r0; r < r1; r++) {                                               \
            for (int64_t i = 0; i < n; i++) d_[bd + i * ids] = s_[bs + i * iss];          \
            for (int d = nd - 1; d >= 0; d--) {                                           \
                bd += it->strides[0][d];                                                  \
                bs += it->strides[1][d];                                                  \
                if (++idx[d] < it->sizes[d]) break;                                       \
                bd -= it->strides[0][d] * it->sizes[d];                                   \
                bs -= it->strides[1][d] * it->sizes[d];                                   \
                idx[d] = 0;                                                               \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    break;
typedef struct {
    const fl_tensor_t *dst, *src;
    const fl_iter_t *it;
    size_t isz;
} rows_job_t;

static void rows_units(void *job, int64_t r0, int64_t r1) { /* rows [r0, r1) */
    const rows_job_t *j = job;
    const fl_iter_t *it = j->it;
    int nd = it->ndim;
    int64_t n = it->inner, ids = it->inner_stride[0], iss = it->inner_stride[1];
    int64_t idx[FL_MAX_DIMS], base[FL_ITER_MAX], rem = r0;
    fl_iter_row(it, r0, base);
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = rem % it->sizes[d];
        rem /= it->sizes[d];
    }
    int64_t bd = base[0], bs = base[1];
    switch (j->isz) {
    case 1: ROWS_LOOP(uint8_t)
    case 2: ROWS_LOOP(uint16_t)
    case 4: ROWS_LOOP(uint32_t)
    default: ROWS_LOOP(uint64_t)
    }
}

static int copy_short_rows(const fl_tensor_t *dst, const fl_tensor_t *src, const fl_iter_t *it, int64_t numel) {
    size_t isz = fl_itemsize(dst->dtype);
    if (it->ndim < 1 || it->inner > SHORT_ROW || (isz != 1 && isz != 2 && isz != 4 && isz != 8) ||
        dst->dtype == FL_BOOL)
        return -1;
    rows_job_t job = {dst, src, it, isz};
    fl_par_for(it->outer, fl_par_grain(it->outer, numel, PAR_MIN, PAR_CHUNK), rows_units, &job);
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
void fl_ew_copy_strided(const fl_tensor_t *dst, const fl_tensor_t *src) {
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
    if (dst->dtype == src->dtype && copy_short_rows(dst, src, &it, numel) == 0) return;
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
    fl_ew_copy_strided(&tmp, src);
    fl_ew_copy_strided(dst, &tmp);
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
        fl_ew_copy_strided(dst, &src);
        return FL_OK;
    }
    if (fl_arg_is_num(&args[1])) {
        int64_t buf[2]; /* a complex128 is 16 bytes */
        fl_tensor_t s = {.data = buf, .offset = 0, .dtype = dst->dtype, .ndim = 0};
        scalar_to(&args[1], dst->dtype, buf);
        if (fl_bcast(&s, dst->ndim, dst->sizes, &src)) return UNSUP;
        fl_ew_copy_strided(dst, &src);
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
    fl_ew_copy_strided(dst, &src);
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
int fl_ew_opnd_add(opnds_t *o, const fl_tensor_t *in, int n_in, const fl_arg_t *a, const fl_tensor_t *out, int ct) {
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

/* The operands with their dims in the output's memory order, outermost first (a stable sort by the output's
 * strides): a channels-last or transposed output is then walked along its memory, so the iterator's inner
 * loop has unit stride as for a row-major one (fl_iter_init coalesces only in the order it is given: an NHWC
 * tensor read in NCHW order has an inner stride of C). Elementwise, every element is independent, so the
 * order is free; every operand is broadcast to the output's shape already (fl_bcast). */
static void ew_memory_order(const fl_tensor_t *out, const opnds_t *ops, fl_tensor_t *pout, opnds_t *pops) {
    int nd = out->ndim, perm[FL_MAX_DIMS];
    for (int d = 0; d < nd; d++) perm[d] = d;
    for (int a = 1; a < nd; a++) {
        int v = perm[a], b = a - 1;
        while (b >= 0 && out->strides[perm[b]] < out->strides[v]) { perm[b + 1] = perm[b]; b--; }
        perm[b + 1] = v;
    }
    *pout = *out;
    *pops = *ops;
    for (int d = 0; d < nd; d++) {
        pout->sizes[d] = out->sizes[perm[d]];
        pout->strides[d] = out->strides[perm[d]];
        for (int k = 0; k < ops->n; k++) {
            pops->t[k].sizes[d] = ops->t[k].sizes[perm[d]];
            pops->t[k].strides[d] = ops->t[k].strides[perm[d]];
        }
    }
}

int fl_ew_run(const fl_tensor_t *out, const opnds_t *ops, int ct, ewfn fn, const kp_t *p) {
    if (!fn) return UNSUP;
    fl_tensor_t pout;
    opnds_t pops;
    if (out->ndim > 1 && !fl_is_contiguous(out)) {
        ew_memory_order(out, ops, &pout, &pops);
        out = &pout;
        ops = &pops;
    }
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

int fl_ew_simple(const fl_tensor_t *in, int n_in, const fl_tensor_t *out, int n_out, const fl_arg_t *args,
                     int n_args, int nop, const int *opi, const ewfn *tab, const kp_t *p, int ct) {
    if (!fl_out_ok(out, n_out)) return UNSUP;
    if (ct < 0) ct = ct_of(out[0].dtype);
    opnds_t o;
    o.n = 0;
    for (int k = 0; k < nop; k++) {
        if (opi[k] >= n_args) return UNSUP;
        int st = fl_ew_opnd_add(&o, in, n_in, &args[opi[k]], &out[0], ct);
        if (st) return st;
    }
    return fl_ew_run(&out[0], &o, ct, tab[ct], p);
}

int fl_ew_set_param(kp_t *p, int k, const fl_arg_t *a, int ct) {
    if (!fl_arg_is_num(a)) return UNSUP;
    p->d[k] = fl_arg_num(a);
    p->i[k] = a->kind == FL_ARG_FLOAT ? (int64_t)a->f : a->i;
    if (ct == CT_I && a->kind == FL_ARG_FLOAT && a->f != (double)p->i[k]) return UNSUP;
    return FL_OK;
}

/* ------------------------------------------------------------------ */
/* table                                                               */
/* ------------------------------------------------------------------ */
static const fl_kernel_entry_t entries[] = {
    E("aten::copy_", ALL | CPX, k_copy_),
    E("aten::fill_.Scalar", ALL | CPX, k_fill_),
    E("aten::fill_.Tensor", ALL | CPX, k_fill_),
    E("aten::zero_", ALL | CPX, k_zero_),
};

const fl_kernel_group_t fl_host_group_elementwise = {entries, (int)(sizeof entries / sizeof entries[0])};
