/* Host kernels: linalg. BLAS-backed matrix products (mm, addmm, bmm, baddbmm,
 * mv, addmv, dot), the helpers k_conv.c, k_norm.c and k_pool.c share, and the
 * group's kernel table, which also lists the convolution (k_conv.c) and
 * normalisation (k_norm.c) kernels with their float16/bfloat16 wrappers.
 *
 * Helpers with external linkage carry the fl_lin_ prefix; the library is built
 * with -fvisibility=hidden, so none of them leaves the shared object. */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <omp.h>

#include <cblas.h>

#include "k_linalg.h"

/* ======================================================================
 * Shared helpers (declared in k_linalg.h)
 * ====================================================================== */

/* A Scalar / float argument as a double (ints, floats and bools). */
double fl_lin_num(const fl_arg_t *a, double dflt) {
    if (!a) return dflt;
    switch (a->kind) {
    case FL_ARG_FLOAT: return a->f;
    case FL_ARG_INT: case FL_ARG_BOOL: return (double)a->i;
    default: return dflt;
    }
}

/* Strided copy between two tensors of one shape and one dtype. */
void fl_lin_copy(const fl_tensor_t *dst, const fl_tensor_t *src) {
    fl_iter_t it;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){dst, src});
    size_t es = fl_itemsize(dst->dtype);
    char *d = (char *)dst->data;
    const char *s = (const char *)src->data;
    if (it.outer == 0 || it.inner == 0) return;
#pragma omp parallel for schedule(static) if (it.outer * it.inner > 32768)
    for (int64_t o = 0; o < it.outer; o++) {
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, o, base);
        int64_t sd = it.inner_stride[0], ss = it.inner_stride[1];
        if (sd == 1 && ss == 1) {
            memcpy(d + base[0] * es, s + base[1] * es, (size_t)it.inner * es);
        } else if (es == 4) {
            float *dp = (float *)d + base[0];
            const float *sp = (const float *)s + base[1];
            for (int64_t i = 0; i < it.inner; i++) dp[i * sd] = sp[i * ss];
        } else if (es == 8) {
            double *dp = (double *)d + base[0];
            const double *sp = (const double *)s + base[1];
            for (int64_t i = 0; i < it.inner; i++) dp[i * sd] = sp[i * ss];
        } else {
            for (int64_t i = 0; i < it.inner; i++)
                memcpy(d + (base[0] + i * sd) * es, s + (base[1] + i * ss) * es, es);
        }
    }
}

/* A descriptor for contiguous memory at `p` with t's shape and dtype. */
void fl_lin_contig_desc(fl_tensor_t *d, const fl_tensor_t *t, void *p) {
    *d = *t;
    d->data = p;
    d->offset = 0;
    int64_t s = 1;
    for (int k = t->ndim - 1; k >= 0; k--) { d->strides[k] = s; s *= t->sizes[k]; }
}

/* Pointer to the first element of a contiguous copy of t: t itself when it is
 * contiguous (*owned = NULL), else a malloc'ed packed copy (*owned = it, the
 * caller frees). Returns NULL only when the allocation fails. */
static double empty_dummy[8];

void *fl_lin_pack(const fl_tensor_t *t, void **owned) {
    *owned = NULL;
    if (fl_numel(t) == 0) return empty_dummy; /* never dereferenced */
    if (fl_is_contiguous(t)) return fl_elem(t, t->offset);
    int64_t n = fl_numel(t);
    void *p = malloc((size_t)(n > 0 ? n : 1) * fl_itemsize(t->dtype));
    if (!p) return NULL;
    fl_tensor_t d;
    fl_lin_contig_desc(&d, t, p);
    fl_lin_copy(&d, t);
    *owned = p;
    return p;
}

/* Pointer to write t's contents contiguously: t itself when contiguous, else
 * a scratch buffer (*owned) that fl_lin_unpack copies back and frees. */
void *fl_lin_out_buf(const fl_tensor_t *t, void **owned) {
    *owned = NULL;
    if (fl_numel(t) == 0) return empty_dummy; /* never dereferenced */
    if (fl_is_contiguous(t)) return fl_elem(t, t->offset);
    int64_t n = fl_numel(t);
    void *p = malloc((size_t)(n > 0 ? n : 1) * fl_itemsize(t->dtype));
    *owned = p;
    return p;
}
void fl_lin_unpack(const fl_tensor_t *t, void *owned) {
    if (!owned) return;
    fl_tensor_t d;
    fl_lin_contig_desc(&d, t, owned);
    fl_lin_copy(t, &d);
    free(owned);
}

int fl_lin_finish_grads(int st, const fl_tensor_t *const g[3], void *packed[3]) {
    for (int k = 0; k < 3; k++) {
        if (st) free(packed[k]);
        else if (g[k]) fl_lin_unpack(g[k], packed[k]);
    }
    return st ? st : FL_OK;
}

/* Threading: every parallel loop of this plugin runs on its OpenMP pool, and
 * OpenBLAS is switched to one thread (once, on first use): a GEMM big enough
 * to share is split into per-thread blocks here, and the convolution kernels
 * give each thread whole samples (im2col + GEMM + col2im together). With a
 * single pool there is no hand-off between two sets of spinning workers,
 * which on a small machine costs whole scheduler quanta per call. */
static atomic_int blas_single;

void fl_lin_blas_init(void) {
    if (!atomic_load_explicit(&blas_single, memory_order_acquire)) {
        scipy_openblas_set_num_threads(1);
        atomic_store_explicit(&blas_single, 1, memory_order_release);
    }
}

int fl_lin_threads(void) {
#ifdef _OPENMP
    return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    return 1;
#endif
}

/* One BLAS call in the calling thread. */
void fl_lin_gemm1(int dtype, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha,
                  const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0) {
        for (int64_t i = 0; i < M; i++) {
            if (dtype == FL_FLOAT32) {
                float *c = (float *)C + i * ldc;
                if (beta == 0.0) memset(c, 0, (size_t)N * sizeof(float));
                else if (beta != 1.0) for (int64_t j = 0; j < N; j++) c[j] = (float)(beta * c[j]);
            } else {
                double *c = (double *)C + i * ldc;
                if (beta == 0.0) memset(c, 0, (size_t)N * sizeof(double));
                else if (beta != 1.0) for (int64_t j = 0; j < N; j++) c[j] *= beta;
            }
        }
        return;
    }
    fl_lin_blas_init();
    enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
    if (dtype == FL_FLOAT32)
        scipy_cblas_sgemm(CblasRowMajor, TA, TB, (blasint)M, (blasint)N, (blasint)K, (float)alpha, (const float *)A,
                          (blasint)lda, (const float *)B, (blasint)ldb, (float)beta, (float *)C, (blasint)ldc);
    else
        scipy_cblas_dgemm(CblasRowMajor, TA, TB, (blasint)M, (blasint)N, (blasint)K, alpha, (const double *)A,
                          (blasint)lda, (const double *)B, (blasint)ldb, beta, (double *)C, (blasint)ldc);
}

/* Per-thread scratch that outlives a call: convolution's im2col buffers are
 * megabytes, and a fresh malloc of that size is a fresh mmap whose pages fault
 * in on every call. Each thread keeps a few slots at their high-water size;
 * slots above 64 MiB are given back by fl_lin_scratch_trim. */
#define LIN_SLOTS 4
static _Thread_local struct { void *p; size_t n; } scratch[LIN_SLOTS];

void *fl_lin_scratch(int slot, size_t bytes) {
    if (slot < 0 || slot >= LIN_SLOTS) return NULL;
    if (bytes == 0) bytes = 1;
    if (scratch[slot].n < bytes) {
        free(scratch[slot].p);
        scratch[slot].p = malloc(bytes);
        scratch[slot].n = scratch[slot].p ? bytes : 0;
    }
    return scratch[slot].p;
}
void fl_lin_scratch_trim(void) {
    for (int k = 0; k < LIN_SLOTS; k++)
        if (scratch[k].n > ((size_t)64 << 20)) { free(scratch[k].p); scratch[k].p = NULL; scratch[k].n = 0; }
}

/* Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C (beta = 0
 * never reads C; k = 0 scales C), split over the OpenMP threads when it is
 * big enough and we are not inside a parallel region already. */
void fl_lin_gemm(int dtype, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha,
                 const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    int nt = fl_lin_threads();
    double work = (double)M * (double)N * (double)K;
    if (nt <= 1 || K <= 0 || work < 262144.0 || (M < 16 && N < 64)) {
        fl_lin_gemm1(dtype, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    fl_lin_blas_init();
    size_t es = fl_itemsize(dtype);
    int split_m = M >= N;
    int64_t len = split_m ? M : N, align = split_m ? 8 : 16;
    int64_t parts = nt;
    if (len / align < parts) parts = len / align > 0 ? len / align : 1;
#pragma omp parallel num_threads((int)parts)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        int64_t blocks = (len + align - 1) / align;
        int64_t b0 = blocks * t / n, b1 = blocks * (t + 1) / n;
        int64_t i0 = b0 * align, i1 = b1 * align < len ? b1 * align : len;
        if (i1 > i0) {
            if (split_m) {
                const char *a = (const char *)A + (ta ? i0 : i0 * lda) * (int64_t)es;
                fl_lin_gemm1(dtype, ta, tb, i1 - i0, N, K, alpha, a, lda, B, ldb, beta,
                             (char *)C + i0 * ldc * (int64_t)es, ldc);
            } else {
                const char *b = (const char *)B + (tb ? i0 * ldb : i0) * (int64_t)es;
                fl_lin_gemm1(dtype, ta, tb, M, i1 - i0, K, alpha, A, lda, b, ldb, beta,
                             (char *)C + i0 * (int64_t)es, ldc);
            }
        }
    }
}

/* ======================================================================
 * Strided matrices
 * ====================================================================== */

typedef struct {
    char *base;          /* address of element (0, 0) */
    int64_t rows, cols;
    int64_t sr, sc;      /* element strides */
} mat_t;

static mat_t mat_of(const fl_tensor_t *t, int64_t batch_off, int d0) {
    mat_t m;
    m.base = fl_elem(t, t->offset + batch_off);
    m.rows = t->sizes[d0];
    m.cols = t->sizes[d0 + 1];
    m.sr = t->strides[d0];
    m.sc = t->strides[d0 + 1];
    return m;
}
static mat_t mat_t_(mat_t m) { /* transpose view */
    mat_t r = m;
    r.rows = m.cols; r.cols = m.rows; r.sr = m.sc; r.sc = m.sr;
    return r;
}

#define BLAS_LD_OK(x) ((x) >= 1 && (x) <= INT_MAX)

/* Can BLAS read m directly? Sets trans and ld. */
static int mat_blas(mat_t m, int *trans, int64_t *ld) {
    int64_t r = m.rows, c = m.cols;
    /* row-major: unit column stride */
    if (c <= 1 || m.sc == 1) {
        int64_t l = r <= 1 ? (c > 1 ? c : 1) : m.sr;
        if (c <= 1 && r > 1) l = m.sr;
        if (l >= (c > 1 ? c : 1) && BLAS_LD_OK(l)) { *trans = 0; *ld = l; return 1; }
    }
    /* column-major: unit row stride */
    if (r <= 1 || m.sr == 1) {
        int64_t l = c <= 1 ? (r > 1 ? r : 1) : m.sc;
        if (l >= (r > 1 ? r : 1) && BLAS_LD_OK(l)) { *trans = 1; *ld = l; return 1; }
    }
    return 0;
}

static void mat_copy(int dtype, mat_t dst, mat_t src) {
    for (int64_t i = 0; i < src.rows; i++) {
        if (dtype == FL_FLOAT32) {
            float *d = (float *)dst.base + i * dst.sr;
            const float *s = (const float *)src.base + i * src.sr;
            for (int64_t j = 0; j < src.cols; j++) d[j * dst.sc] = s[j * src.sc];
        } else {
            double *d = (double *)dst.base + i * dst.sr;
            const double *s = (const double *)src.base + i * src.sr;
            for (int64_t j = 0; j < src.cols; j++) d[j * dst.sc] = s[j * src.sc];
        }
    }
}

/* An operand BLAS can read: the matrix itself or a packed row-major copy. */
typedef struct { const void *p; int trans; int64_t ld; void *owned; } operand_t;

static int operand(int dtype, mat_t m, operand_t *o) {
    o->owned = NULL;
    if (mat_blas(m, &o->trans, &o->ld)) { o->p = m.base; return FL_OK; }
    size_t es = fl_itemsize(dtype);
    int64_t n = m.rows * m.cols;
    void *p = malloc((size_t)(n > 0 ? n : 1) * es);
    if (!p) FL_FAIL(FL_ERR_OOM, "linalg: cannot allocate %lld bytes of scratch", (long long)(n * (int64_t)es));
    mat_t d = {(char *)p, m.rows, m.cols, m.cols, 1};
    mat_copy(dtype, d, m);
    o->p = p; o->trans = 0; o->ld = m.cols > 1 ? m.cols : 1; o->owned = p;
    return FL_OK;
}

/* C = alpha * A @ B + beta * C for strided matrices. */
static int gemm_strided(int dtype, mat_t C, mat_t A, mat_t B, double alpha, double beta) {
    int64_t M = C.rows, N = C.cols, K = A.cols;
    if (M == 0 || N == 0) return FL_OK;
    int ct;
    int64_t ldc;
    if (mat_blas(C, &ct, &ldc)) {
        if (ct) { /* C^T = B^T A^T, C^T is row-major */
            mat_t t = A;
            A = mat_t_(B); B = mat_t_(t); C = mat_t_(C);
            M = C.rows; N = C.cols;
        }
        operand_t a, b;
        int st = operand(dtype, A, &a);
        if (st) return st;
        st = operand(dtype, B, &b);
        if (st) { free(a.owned); return st; }
        fl_lin_gemm(dtype, a.trans, b.trans, M, N, K, alpha, a.p, a.ld, b.p, b.ld, beta, C.base, ldc);
        free(a.owned); free(b.owned);
        return FL_OK;
    }
    /* C with an odd layout: compute into a packed copy */
    size_t es = fl_itemsize(dtype);
    void *p = malloc((size_t)(M * N) * es);
    if (!p) FL_FAIL(FL_ERR_OOM, "linalg: cannot allocate scratch");
    mat_t T = {(char *)p, M, N, N, 1};
    if (beta != 0.0) mat_copy(dtype, T, C);
    int st = gemm_strided(dtype, T, A, B, alpha, beta);
    if (!st) mat_copy(dtype, C, T);
    free(p);
    return st;
}

static int same_view(const fl_tensor_t *a, const fl_tensor_t *b) {
    if (a->data != b->data || a->offset != b->offset || a->ndim != b->ndim || a->dtype != b->dtype) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->sizes[d] != b->sizes[d] || (a->sizes[d] > 1 && a->strides[d] != b->strides[d])) return 0;
    return 1;
}

/* out = beta * broadcast(self) (beta != 0); self's dims align to out's right. */
static int fill_broadcast(const fl_tensor_t *out, const fl_tensor_t *self, double beta) {
    if (self->ndim > out->ndim) FL_FAIL(FL_ERR_INVALID, "linalg: self of rank %d does not broadcast", self->ndim);
    fl_tensor_t b = *out;
    b.data = self->data; b.offset = self->offset;
    int shift = out->ndim - self->ndim;
    for (int d = 0; d < out->ndim; d++) {
        int sd = d - shift;
        if (sd < 0 || self->sizes[sd] == 1) b.strides[d] = 0;
        else if (self->sizes[sd] == out->sizes[d]) b.strides[d] = self->strides[sd];
        else FL_FAIL(FL_ERR_INVALID, "linalg: self does not broadcast to the output");
    }
    fl_iter_t it;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){out, &b});
    for (int64_t o = 0; o < it.outer; o++) {
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, o, base);
        if (out->dtype == FL_FLOAT32) {
            float *d = (float *)out->data + base[0];
            const float *s = (const float *)self->data + base[1];
            for (int64_t i = 0; i < it.inner; i++) d[i * it.inner_stride[0]] = (float)(beta * s[i * it.inner_stride[1]]);
        } else {
            double *d = (double *)out->data + base[0];
            const double *s = (const double *)self->data + base[1];
            for (int64_t i = 0; i < it.inner; i++) d[i * it.inner_stride[0]] = beta * s[i * it.inner_stride[1]];
        }
    }
    return FL_OK;
}

static int check_float(const fl_tensor_t *const *ts, int n) {
    int dt = ts[0]->dtype;
    if (dt != FL_FLOAT32 && dt != FL_FLOAT64) return 0;
    for (int k = 0; k < n; k++) {
        if (ts[k]->dtype != dt || ts[k]->ndim < 0 || ts[k]->ndim > FL_MAX_DIMS) return 0;
        for (int d = 0; d < ts[k]->ndim; d++)
            if (ts[k]->sizes[d] > INT_MAX / 2) return 0;
    }
    return 1;
}

/* ======================================================================
 * mm / addmm / bmm / baddbmm
 * ====================================================================== */

/* out[b] = alpha * A[b] @ B[b] + beta * self (self == NULL: beta ignored). */
static int batched_product(const fl_tensor_t *out, const fl_tensor_t *self, const fl_tensor_t *A,
                           const fl_tensor_t *B, double alpha, double beta, int batched) {
    const fl_tensor_t *ts[4] = {out, A, B, self};
    if (!check_float(ts, self ? 4 : 3)) return FL_ERR_UNSUPPORTED;
    int rank = batched ? 3 : 2;
    if (A->ndim != rank || B->ndim != rank || out->ndim != rank) return FL_ERR_UNSUPPORTED;
    int d0 = batched ? 1 : 0;
    int64_t nb = batched ? out->sizes[0] : 1;
    if (A->sizes[d0] != out->sizes[d0] || B->sizes[d0 + 1] != out->sizes[d0 + 1] || A->sizes[d0 + 1] != B->sizes[d0] ||
        (batched && (A->sizes[0] != nb || B->sizes[0] != nb)))
        FL_FAIL(FL_ERR_INVALID, "linalg: matrix shapes do not match");
    int dtype = out->dtype;
    double b = 0.0;
    if (self && beta != 0.0) {
        if (same_view(self, out)) b = beta;
        else {
            int st = fill_broadcast(out, self, beta);
            if (st) return st;
            b = 1.0;
        }
    }
    if (nb == 0) return FL_OK;
    int64_t M = out->sizes[d0], N = out->sizes[d0 + 1], K = A->sizes[d0 + 1];
    /* several products: one per thread at a time (BLAS single-threaded inside) */
    int nt = fl_lin_threads();
    if (batched && nt > 1 && nb >= nt && M * N * K < ((int64_t)1 << 27)) {
        int err = FL_OK;
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < nb; i++) {
            int st = gemm_strided(dtype, mat_of(out, i * out->strides[0], 1), mat_of(A, i * A->strides[0], 1),
                                  mat_of(B, i * B->strides[0], 1), alpha, b);
            if (st) {
#pragma omp atomic write
                err = st;
            }
        }
        if (err) fl_host_set_error("linalg: cannot allocate scratch");
        return err;
    }
    for (int64_t i = 0; i < nb; i++) {
        int64_t oa = batched ? i * A->strides[0] : 0, ob = batched ? i * B->strides[0] : 0,
                oc = batched ? i * out->strides[0] : 0;
        int st = gemm_strided(dtype, mat_of(out, oc, d0), mat_of(A, oa, d0), mat_of(B, ob, d0), alpha, b);
        if (st) return st;
    }
    return FL_OK;
}

static int k_mm(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 2 || n_out < 1) return FL_ERR_UNSUPPORTED;
    return batched_product(&out[0], NULL, &in[0], &in[1], 1.0, 0.0, 0);
}
static int k_bmm(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 2 || n_out < 1) return FL_ERR_UNSUPPORTED;
    return batched_product(&out[0], NULL, &in[0], &in[1], 1.0, 0.0, 1);
}
static int k_addmm(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 3 || n_out < 1 || n_args < 5) return FL_ERR_UNSUPPORTED;
    double beta = fl_lin_num(&args[3], 1.0), alpha = fl_lin_num(&args[4], 1.0);
    return batched_product(&out[0], &in[0], &in[1], &in[2], alpha, beta, 0);
}
static int k_baddbmm(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 3 || n_out < 1 || n_args < 5) return FL_ERR_UNSUPPORTED;
    double beta = fl_lin_num(&args[3], 1.0), alpha = fl_lin_num(&args[4], 1.0);
    return batched_product(&out[0], &in[0], &in[1], &in[2], alpha, beta, 1);
}

/* ======================================================================
 * mv / addmv / dot
 * ====================================================================== */

static int matvec(const fl_tensor_t *out, const fl_tensor_t *self, const fl_tensor_t *A, const fl_tensor_t *x,
                  double alpha, double beta) {
    const fl_tensor_t *ts[4] = {out, A, x, self};
    if (!check_float(ts, self ? 4 : 3)) return FL_ERR_UNSUPPORTED;
    if (A->ndim != 2 || x->ndim != 1 || out->ndim != 1) return FL_ERR_UNSUPPORTED;
    int64_t M = A->sizes[0], K = A->sizes[1];
    if (x->sizes[0] != K || out->sizes[0] != M) FL_FAIL(FL_ERR_INVALID, "linalg: mv shapes do not match");
    /* treat as gemm with N = 1: out[M,1] = A[M,K] @ x[K,1] */
    fl_tensor_t o2 = *out, x2 = *x;
    o2.ndim = 2; o2.sizes[1] = 1; o2.strides[1] = 1;
    x2.ndim = 2; x2.sizes[1] = 1; x2.strides[1] = 1;
    fl_tensor_t s2;
    const fl_tensor_t *sp = NULL;
    if (self) {
        s2 = *self;
        if (s2.ndim == 1) { s2.ndim = 2; s2.sizes[1] = 1; s2.strides[1] = 1; }
        sp = &s2;
    }
    double b = 0.0;
    if (sp && beta != 0.0) {
        if (same_view(self, out)) b = beta;
        else {
            int st = fill_broadcast(&o2, sp, beta);
            if (st) return st;
            b = 1.0;
        }
    }
    if (M == 0) return FL_OK;
    int dtype = out->dtype;
    int ta;
    int64_t lda;
    mat_t am = mat_of(A, 0, 0);
    if (K > 0 && alpha != 0.0 && mat_blas(am, &ta, &lda) && x->strides[0] != 0 && out->strides[0] != 0 &&
        llabs(x->strides[0]) <= INT_MAX && llabs(out->strides[0]) <= INT_MAX) {
        /* row-major A with trans: pass as col-major */
        int64_t rows = ta ? K : M, cols = ta ? M : K;
        enum CBLAS_TRANSPOSE T = ta ? CblasTrans : CblasNoTrans;
        if (dtype == FL_FLOAT32)
            scipy_cblas_sgemv(CblasRowMajor, T, (blasint)rows, (blasint)cols, (float)alpha, (const float *)am.base,
                              (blasint)lda, (const float *)fl_elem(x, x->offset), (blasint)x->strides[0], (float)b,
                              (float *)fl_elem(out, out->offset), (blasint)out->strides[0]);
        else
            scipy_cblas_dgemv(CblasRowMajor, T, (blasint)rows, (blasint)cols, alpha, (const double *)am.base,
                              (blasint)lda, (const double *)fl_elem(x, x->offset), (blasint)x->strides[0], b,
                              (double *)fl_elem(out, out->offset), (blasint)out->strides[0]);
        return FL_OK;
    }
    return gemm_strided(dtype, mat_of(&o2, 0, 0), am, mat_of(&x2, 0, 0), alpha, b);
}

static int k_mv(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 2 || n_out < 1) return FL_ERR_UNSUPPORTED;
    return matvec(&out[0], NULL, &in[0], &in[1], 1.0, 0.0);
}
static int k_addmv(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 3 || n_out < 1 || n_args < 5) return FL_ERR_UNSUPPORTED;
    return matvec(&out[0], &in[0], &in[1], &in[2], fl_lin_num(&args[4], 1.0), fl_lin_num(&args[3], 1.0));
}

static int k_dot(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 2 || n_out < 1) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *a = &in[0], *b = &in[1], *o = &out[0];
    const fl_tensor_t *ts[3] = {o, a, b};
    if (!check_float(ts, 3) || a->ndim != 1 || b->ndim != 1 || o->ndim != 0) return FL_ERR_UNSUPPORTED;
    int64_t n = a->sizes[0];
    if (b->sizes[0] != n) FL_FAIL(FL_ERR_INVALID, "dot: sizes %lld and %lld differ", (long long)n, (long long)b->sizes[0]);
    int64_t sa = a->strides[0], sb = b->strides[0];
    if (o->dtype == FL_FLOAT32) {
        const float *x = (const float *)fl_elem(a, a->offset), *y = (const float *)fl_elem(b, b->offset);
        float r;
        if (n > 0 && sa >= 1 && sb >= 1 && sa <= INT_MAX && sb <= INT_MAX && n <= INT_MAX)
            r = scipy_cblas_sdot((blasint)n, x, (blasint)sa, y, (blasint)sb);
        else {
            double acc = 0.0;
            for (int64_t i = 0; i < n; i++) acc += (double)x[i * sa] * y[i * sb];
            r = (float)acc;
        }
        *(float *)fl_elem(o, o->offset) = r;
    } else {
        const double *x = (const double *)fl_elem(a, a->offset), *y = (const double *)fl_elem(b, b->offset);
        double r;
        if (n > 0 && sa >= 1 && sb >= 1 && sa <= INT_MAX && sb <= INT_MAX && n <= INT_MAX)
            r = scipy_cblas_ddot((blasint)n, x, (blasint)sa, y, (blasint)sb);
        else {
            r = 0.0;
            for (int64_t i = 0; i < n; i++) r += x[i * sa] * y[i * sb];
        }
        *(double *)fl_elem(o, o->offset) = r;
    }
    return FL_OK;
}

/* ======================================================================
 * fp16 / bf16: run the float32 kernel on float32 copies
 * ====================================================================== */

static int is_half(int dt) { return dt == FL_FLOAT16 || dt == FL_BFLOAT16; }

static void convert_copy(const fl_tensor_t *dst, const fl_tensor_t *src) {
    fl_iter_t it;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){dst, src});
    size_t ed = fl_itemsize(dst->dtype), es = fl_itemsize(src->dtype);
#pragma omp parallel for schedule(static) if (it.outer * it.inner > 32768)
    for (int64_t o = 0; o < it.outer; o++) {
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, o, base);
        for (int64_t i = 0; i < it.inner; i++) {
            const char *s = (const char *)src->data + (base[1] + i * it.inner_stride[1]) * (int64_t)es;
            char *d = (char *)dst->data + (base[0] + i * it.inner_stride[0]) * (int64_t)ed;
            fl_store_f64(dst->dtype, d, fl_load_f64(src->dtype, s));
        }
    }
}

/* Every fp16/bf16 tensor becomes a contiguous float32 copy; the float32 kernel
 * runs on those; outputs (and, with write_inputs, the inputs) are converted
 * back. Other dtypes (int64 indices, float32 statistics) pass through. */
int fl_lin_via_f32(fl_kernel_fn fn, int write_inputs, FL_KERNEL_ARGS) {
    fl_tensor_t ci[16] = {0}, co[8] = {0};
    void *bufs[24] = {0};
    if (n_in > 16 || n_out > 8) return FL_ERR_UNSUPPORTED;
    int st = FL_OK;
    for (int k = 0; k < n_in + n_out; k++) {
        const fl_tensor_t *t = k < n_in ? &in[k] : &out[k - n_in];
        fl_tensor_t *c = k < n_in ? &ci[k] : &co[k - n_in];
        *c = *t;
        if (t->ndim < 0 || !is_half(t->dtype)) continue;
        int64_t n = fl_numel(t);
        bufs[k] = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
        if (!bufs[k]) { st = FL_ERR_OOM; fl_host_set_error("linalg: cannot allocate float32 scratch"); goto done; }
        fl_lin_contig_desc(c, t, bufs[k]);
        c->dtype = FL_FLOAT32;
        if (k < n_in) convert_copy(c, t);
    }
    st = fn(stream, device, ci, n_in, co, n_out, args, n_args);
    if (st == FL_OK) {
        for (int k = 0; k < n_out; k++)
            if (bufs[n_in + k]) convert_copy(&out[k], &co[k]);
        if (write_inputs)
            for (int k = 0; k < n_in; k++)
                if (bufs[k]) convert_copy(&in[k], &ci[k]);
    }
done:
    for (int k = 0; k < n_in + n_out; k++) free(bufs[k]);
    return st;
}

LIN_ANY_FLOAT(k_mm_any, k_mm)
LIN_ANY_FLOAT(k_addmm_any, k_addmm) /* addmm and addmm_ (out[0] aliases self) */
LIN_ANY_FLOAT(k_bmm_any, k_bmm)
LIN_ANY_FLOAT(k_baddbmm_any, k_baddbmm)

/* ======================================================================
 * Kernels from k_conv.c and k_norm.c (k_pool.c has its own table)
 * ====================================================================== */
/* (declared in k_linalg.h) */

LIN_ANY_FLOAT(d_convolution, fl_lin_convolution)
LIN_ANY_FLOAT(d_convolution_backward, fl_lin_convolution_backward)
LIN_ANY_FLOAT(d_layer_norm, fl_lin_native_layer_norm)
LIN_ANY_FLOAT(d_layer_norm_backward, fl_lin_native_layer_norm_backward)

#define F3264 (FL_F32 | FL_F64)

static const fl_kernel_entry_t entries[] = {
    {"aten::mm", FL_FLOATS, 0, k_mm_any},
    {"aten::addmm", FL_FLOATS, 0, k_addmm_any},
    {"aten::addmm_", FL_FLOATS, 0, k_addmm_any},
    {"aten::bmm", FL_FLOATS, 0, k_bmm_any},
    {"aten::baddbmm", FL_FLOATS, 0, k_baddbmm_any},
    {"aten::mv", F3264, 0, k_mv},
    {"aten::addmv", F3264, 0, k_addmv},
    {"aten::dot", F3264, 0, k_dot},
    {"aten::convolution", FL_FLOATS, FL_KERNEL_ANY_OUT_LAYOUT, d_convolution}, /* NCHW or channels-last */
    {"aten::convolution_backward", FL_FLOATS, FL_KERNEL_ANY_OUT_LAYOUT, d_convolution_backward}, /* grads of any layout */
    {"aten::native_batch_norm", F3264, 0, fl_lin_native_batch_norm},
    {"aten::native_batch_norm_backward", F3264, 0, fl_lin_native_batch_norm_backward},
    {"aten::_native_batch_norm_legit", F3264, 0, fl_lin_bn_legit},
    {"aten::_native_batch_norm_legit.no_stats", F3264, 0, fl_lin_bn_legit_no_stats},
    {"aten::_native_batch_norm_legit_no_training", F3264, 0, fl_lin_bn_legit_no_training},
    {"aten::_batch_norm_with_update", F3264, 0, fl_lin_bn_with_update},
    {"aten::_batch_norm_no_update", F3264, 0, fl_lin_bn_no_update},
    {"aten::batch_norm_backward", F3264, 0, fl_lin_batch_norm_backward},
    {"aten::native_layer_norm", FL_FLOATS, 0, d_layer_norm},
    {"aten::native_layer_norm_backward", FL_FLOATS, 0, d_layer_norm_backward},
    {"aten::native_group_norm", F3264, 0, fl_lin_native_group_norm},
    {"aten::native_group_norm_backward", F3264, 0, fl_lin_native_group_norm_backward},
};

const fl_kernel_group_t fl_host_group_linalg = {entries, (int)(sizeof entries / sizeof entries[0])};
