/* Host kernels: lapack. Dense factorisations and solvers on float32/float64,
 * backed by the LAPACK that ships with scipy-openblas32 (the same routines
 * PyTorch's CPU kernels call, so results and sign conventions agree):
 *   LU       getrf/getrs     linalg_lu_factor_ex, linalg_lu, lu_unpack, linalg_lu_solve,
 *                            _linalg_solve_ex, linalg_inv_ex, _linalg_det, _linalg_slogdet
 *   Cholesky potrf/potrs/potri  linalg_cholesky_ex, cholesky, cholesky_solve, cholesky_inverse
 *   QR       geqrf/orgqr/ormqr  linalg_qr, linalg_householder_product, ormqr (aten::geqrf itself
 *                            has no meta function, so the runtime could not size its outputs)
 *   eigen    syevd           _linalg_eigh
 *   SVD      gesdd           _linalg_svd, linalg_pinv.atol_rtol_tensor (also via syevd)
 *   LDL      sytrf/sytrs     linalg_ldl_factor_ex, linalg_ldl_solve
 *   triangular (cblas trsm)  linalg_solve_triangular, triangular_solve
 *   linalg_matrix_exp: Pade 13 with scaling and squaring (Higham 2005), in double.
 *
 * Every op is batched over leading dimensions (broadcast where PyTorch
 * broadcasts). Each matrix is copied into a column-major scratch buffer, the
 * routine runs there, and results are written back through the output's own
 * strides (the runtime allocates outputs from PyTorch's meta functions, which
 * are often column-major). Workspace sizes come from LAPACK's lwork = -1 query
 * once per call, since every matrix of a batch has the same shape.
 * No OpenMP here: OpenBLAS decides its own threading inside LAPACK. */
#include <limits.h>
#include <stdlib.h>

#include "fl_host.h"

/* scipy-openblas exports the Fortran symbols with a scipy_ prefix
 * (scipy_sgetrf_); lapack.h takes the mangling from LAPACK_GLOBAL. */
#define LAPACK_GLOBAL(lcname, UCNAME) scipy_##lcname##_
#include <cblas.h>
#include <lapack.h>

/* ======================================================================
 * Small helpers: errors, element access, batches, strided matrix copies
 * ====================================================================== */

static int lp_err(int status, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fl_host_set_error("%s", msg);
    return status;
}

static int lp_oom(const char *op) { return lp_err(FL_ERR_OOM, "%s: out of host memory for LAPACK scratch", op); }

/* PyTorch prefixes errors of batched inputs with the batch element. */
static const char *lp_where(char *buf, size_t n, int batched, int64_t b) {
    if (!batched) return "";
    snprintf(buf, n, "(Batch element %lld): ", (long long)b);
    return buf;
}

static inline double lp_get(int dt, const void *p, int64_t i) {
    return dt == FL_FLOAT64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
static inline void lp_set(int dt, void *p, int64_t i, double v) {
    if (dt == FL_FLOAT64) ((double *)p)[i] = v;
    else ((float *)p)[i] = (float)v;
}

static void *lp_alloc(int dt, int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * fl_itemsize(dt)); }

/* An optional tensor argument (None -> NULL). */
static const fl_tensor_t *lp_opt(const fl_tensor_t *in, int n_in, const fl_arg_t *args, int n_args, int k) {
    if (k >= n_args || args[k].kind != FL_ARG_TENSOR || args[k].i < 0 || args[k].i >= n_in) return NULL;
    return &in[args[k].i];
}
static int lp_flag(const fl_arg_t *args, int n_args, int k, int dflt) {
    return k < n_args && (args[k].kind == FL_ARG_BOOL || args[k].kind == FL_ARG_INT) ? (int)args[k].i : dflt;
}

/* The dtype to compute in: that of `t` when float32/float64, else -1. */
static int lp_dtype(const fl_tensor_t *t) {
    return t->dtype == FL_FLOAT32 || t->dtype == FL_FLOAT64 ? t->dtype : -1;
}

/* Batch dims: the leading t->ndim - core dims of t. */
typedef struct {
    int nb;
    int64_t sizes[FL_MAX_DIMS];
    int64_t count;
} lp_batch_t;

static void lp_batch(lp_batch_t *b, const fl_tensor_t *t, int core) {
    b->nb = t->ndim - core > 0 ? t->ndim - core : 0;
    b->count = 1;
    for (int d = 0; d < b->nb; d++) {
        b->sizes[d] = t->sizes[d];
        b->count *= t->sizes[d];
    }
}

/* Element offset of batch element i of b in t, whose batch dims (the leading
 * t->ndim - core) broadcast against b's, aligned on the right. */
static int64_t lp_off(const fl_tensor_t *t, int core, const lp_batch_t *b, int64_t i) {
    int64_t off = t->offset;
    int tb = t->ndim - core;
    for (int d = b->nb - 1; d >= 0 && i; d--) {
        int64_t idx = i % b->sizes[d];
        i /= b->sizes[d];
        int td = d - (b->nb - tb);
        if (td >= 0 && t->sizes[td] != 1) off += idx * t->strides[td];
    }
    return off;
}

#define LP_RS(t) ((t)->strides[(t)->ndim - 2]) /* row stride of a matrix */
#define LP_CS(t) ((t)->strides[(t)->ndim - 1]) /* column stride (or a vector's stride) */
#define LP_ROWS(t) ((t)->sizes[(t)->ndim - 2])
#define LP_COLS(t) ((t)->sizes[(t)->ndim - 1])

/* buf[i + j*ld] = t[off + i*rs + j*cs]: a rows x cols block of t into a
 * column-major buffer (pass rs/cs swapped to load the transpose). */
static void lp_in(void *buf, int64_t ld, const fl_tensor_t *t, int64_t off, int64_t rs, int64_t cs, int64_t rows,
                  int64_t cols) {
    if (t->dtype == FL_FLOAT64 || t->dtype == FL_INT64) {
        const double *s = (const double *)t->data + off;
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < rows; i++) ((double *)buf)[i + j * ld] = s[i * rs + j * cs];
    } else {
        const float *s = (const float *)t->data + off;
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < rows; i++) ((float *)buf)[i + j * ld] = s[i * rs + j * cs];
    }
}

/* t[off + i*rs + j*cs] = buf[i + j*ld]. */
static void lp_out(const fl_tensor_t *t, int64_t off, int64_t rs, int64_t cs, const void *buf, int64_t ld,
                   int64_t rows, int64_t cols) {
    if (t->dtype == FL_FLOAT64) {
        double *d = (double *)t->data + off;
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < rows; i++) d[i * rs + j * cs] = ((const double *)buf)[i + j * ld];
    } else {
        float *d = (float *)t->data + off;
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < rows; i++) d[i * rs + j * cs] = ((const float *)buf)[i + j * ld];
    }
}

/* Matrix-shaped load/store of the whole trailing matrix of t. */
static void lp_load(void *buf, int64_t ld, const fl_tensor_t *t, int64_t off, int trans) {
    if (trans) lp_in(buf, ld, t, off, LP_CS(t), LP_RS(t), LP_COLS(t), LP_ROWS(t));
    else lp_in(buf, ld, t, off, LP_RS(t), LP_CS(t), LP_ROWS(t), LP_COLS(t));
}
static void lp_store(const fl_tensor_t *t, int64_t off, const void *buf, int64_t ld, int trans) {
    if (trans) lp_out(t, off, LP_CS(t), LP_RS(t), buf, ld, LP_COLS(t), LP_ROWS(t));
    else lp_out(t, off, LP_RS(t), LP_CS(t), buf, ld, LP_ROWS(t), LP_COLS(t));
}

static inline int32_t *lp_i32(const fl_tensor_t *t, int64_t off) { return (int32_t *)t->data + off; }

/* Keep one triangle of a column-major rows x cols buffer, zero the other
 * strict triangle; unit=1 also writes ones on the diagonal. */
static void lp_triangle(int dt, void *a, int64_t ld, int64_t rows, int64_t cols, int upper, int unit) {
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = 0; i < rows; i++) {
            if (i == j) {
                if (unit) lp_set(dt, a, i + j * ld, 1.0);
            } else if (upper ? i > j : i < j) {
                lp_set(dt, a, i + j * ld, 0.0);
            }
        }
}

static void lp_eye(int dt, void *a, int64_t ld, int64_t rows, int64_t cols) {
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = 0; i < rows; i++) lp_set(dt, a, i + j * ld, i == j ? 1.0 : 0.0);
}

/* Matrices larger than LAPACK's 32-bit indices are refused. */
static int lp_dims_ok(const char *op, int64_t a, int64_t b) {
    if (a > INT_MAX || b > INT_MAX) return lp_err(FL_ERR_INVALID, "%s: matrix of %lld x %lld is beyond LAPACK's 32-bit "
                                                  "indices", op, (long long)a, (long long)b);
    return FL_OK;
}

static inline int lp_ld(int64_t rows) { return rows > 1 ? (int)rows : 1; }

/* ======================================================================
 * Typed LAPACK wrappers: one entry per routine, float or double by dt.
 * Routines with a workspace take (work, lwork); lwork = -1 is the query,
 * whose answer lp_lwork reads back.
 * ====================================================================== */

#define LP_D(dt) ((dt) == FL_FLOAT64)

static int lp_getrf(int dt, int m, int n, void *a, int lda, int *ipiv) {
    int info = 0;
    if (LP_D(dt)) LAPACK_dgetrf(&m, &n, a, &lda, ipiv, &info);
    else LAPACK_sgetrf(&m, &n, a, &lda, ipiv, &info);
    return info;
}
static int lp_getrs(int dt, char tr, int n, int nrhs, const void *a, int lda, const int *ipiv, void *b, int ldb) {
    int info = 0;
    if (LP_D(dt)) scipy_LAPACK_dgetrs(&tr, &n, &nrhs, a, &lda, ipiv, b, &ldb, &info);
    else scipy_LAPACK_sgetrs(&tr, &n, &nrhs, a, &lda, ipiv, b, &ldb, &info);
    return info;
}
static int lp_potrf(int dt, char uplo, int n, void *a, int lda) {
    int info = 0;
    if (LP_D(dt)) scipy_LAPACK_dpotrf(&uplo, &n, a, &lda, &info);
    else scipy_LAPACK_spotrf(&uplo, &n, a, &lda, &info);
    return info;
}
static int lp_potrs(int dt, char uplo, int n, int nrhs, const void *a, int lda, void *b, int ldb) {
    int info = 0;
    if (LP_D(dt)) scipy_LAPACK_dpotrs(&uplo, &n, &nrhs, a, &lda, b, &ldb, &info);
    else scipy_LAPACK_spotrs(&uplo, &n, &nrhs, a, &lda, b, &ldb, &info);
    return info;
}
static int lp_potri(int dt, char uplo, int n, void *a, int lda) {
    int info = 0;
    if (LP_D(dt)) scipy_LAPACK_dpotri(&uplo, &n, a, &lda, &info);
    else scipy_LAPACK_spotri(&uplo, &n, a, &lda, &info);
    return info;
}
static int lp_geqrf(int dt, int m, int n, void *a, int lda, void *tau, void *work, int lwork) {
    int info = 0;
    if (LP_D(dt)) LAPACK_dgeqrf(&m, &n, a, &lda, tau, work, &lwork, &info);
    else LAPACK_sgeqrf(&m, &n, a, &lda, tau, work, &lwork, &info);
    return info;
}
static int lp_orgqr(int dt, int m, int n, int k, void *a, int lda, const void *tau, void *work, int lwork) {
    int info = 0;
    if (LP_D(dt)) LAPACK_dorgqr(&m, &n, &k, a, &lda, tau, work, &lwork, &info);
    else LAPACK_sorgqr(&m, &n, &k, a, &lda, tau, work, &lwork, &info);
    return info;
}
static int lp_ormqr(int dt, char side, char tr, int m, int n, int k, const void *a, int lda, const void *tau, void *c,
                    int ldc, void *work, int lwork) {
    int info = 0;
    if (LP_D(dt)) scipy_LAPACK_dormqr(&side, &tr, &m, &n, &k, a, &lda, tau, c, &ldc, work, &lwork, &info);
    else scipy_LAPACK_sormqr(&side, &tr, &m, &n, &k, a, &lda, tau, c, &ldc, work, &lwork, &info);
    return info;
}
static int lp_syevd(int dt, char jobz, char uplo, int n, void *a, int lda, void *w, void *work, int lwork, int *iwork,
                    int liwork) {
    int info = 0;
    if (LP_D(dt)) scipy_LAPACK_dsyevd(&jobz, &uplo, &n, a, &lda, w, work, &lwork, iwork, &liwork, &info);
    else scipy_LAPACK_ssyevd(&jobz, &uplo, &n, a, &lda, w, work, &lwork, iwork, &liwork, &info);
    return info;
}
static int lp_gesdd(int dt, char jobz, int m, int n, void *a, int lda, void *s, void *u, int ldu, void *vt, int ldvt,
                    void *work, int lwork, int *iwork) {
    int info = 0;
    if (LP_D(dt)) scipy_LAPACK_dgesdd(&jobz, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, &info);
    else scipy_LAPACK_sgesdd(&jobz, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, &info);
    return info;
}
static int lp_sytrf(int dt, char uplo, int n, void *a, int lda, int *ipiv, void *work, int lwork) {
    int info = 0;
    if (LP_D(dt)) scipy_LAPACK_dsytrf(&uplo, &n, a, &lda, ipiv, work, &lwork, &info);
    else scipy_LAPACK_ssytrf(&uplo, &n, a, &lda, ipiv, work, &lwork, &info);
    return info;
}
static int lp_sytrs(int dt, char uplo, int n, int nrhs, const void *a, int lda, const int *ipiv, void *b, int ldb) {
    int info = 0;
    if (LP_D(dt)) scipy_LAPACK_dsytrs(&uplo, &n, &nrhs, a, &lda, ipiv, b, &ldb, &info);
    else scipy_LAPACK_ssytrs(&uplo, &n, &nrhs, a, &lda, ipiv, b, &ldb, &info);
    return info;
}
static void lp_trsm(int dt, int left, int upper, int trans, int unit, int m, int n, const void *a, int lda, void *b,
                    int ldb) {
    if (m == 0 || n == 0) return;
    enum CBLAS_SIDE side = left ? CblasLeft : CblasRight;
    enum CBLAS_UPLO ul = upper ? CblasUpper : CblasLower;
    enum CBLAS_TRANSPOSE tr = trans ? CblasTrans : CblasNoTrans;
    enum CBLAS_DIAG dg = unit ? CblasUnit : CblasNonUnit;
    if (LP_D(dt)) scipy_cblas_dtrsm(CblasColMajor, side, ul, tr, dg, m, n, 1.0, a, lda, b, ldb);
    else scipy_cblas_strsm(CblasColMajor, side, ul, tr, dg, m, n, 1.0f, a, lda, b, ldb);
}
/* C (m x n) = op(A) op(B), column-major. */
static void lp_gemm(int dt, int ta, int tb, int m, int n, int k, const void *a, int lda, const void *b, int ldb,
                    void *c, int ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) lp_set(dt, c, i + j * ldc, 0.0);
        return;
    }
    enum CBLAS_TRANSPOSE A = ta ? CblasTrans : CblasNoTrans, B = tb ? CblasTrans : CblasNoTrans;
    if (LP_D(dt)) scipy_cblas_dgemm(CblasColMajor, A, B, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
    else scipy_cblas_sgemm(CblasColMajor, A, B, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}

/* The element count a workspace query answered (in the element type). */
static int lp_lwork(int dt, const double *q) {
    double v = LP_D(dt) ? q[0] : (double)((const float *)q)[0];
    return v < 1.0 ? 1 : (int)v + 1; /* +1: a float answer may round down */
}

/* ======================================================================
 * LU: getrf / getrs
 * ====================================================================== */

/* Row permutation of getrf's pivots as P with A = P L U: perm[i] is the row of
 * A that LAPACK moved to row i. */
static void lp_perm(int *perm, int64_t m, const int *piv, int64_t k) {
    for (int64_t i = 0; i < m; i++) perm[i] = (int)i;
    for (int64_t i = 0; i < k; i++) {
        int j = piv[i] - 1, t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* Write P (m x m), L (m x k, unit lower) and U (k x n) of a factored buffer;
 * P, L, U may each be NULL. perm: m ints of scratch. */
static void lp_lu_unpack1(int dt, const void *lu, int64_t ld, int64_t m, int64_t n, const int *piv, int *perm,
                          const fl_tensor_t *P, int64_t po, const fl_tensor_t *L, int64_t lo, const fl_tensor_t *U,
                          int64_t uo) {
    int64_t k = m < n ? m : n;
    if (P) {
        lp_perm(perm, m, piv, k);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < m; j++) fl_store_f64(P->dtype, fl_elem(P, po + i * LP_RS(P) + j * LP_CS(P)), 0.0);
        for (int64_t i = 0; i < m; i++) fl_store_f64(P->dtype, fl_elem(P, po + perm[i] * LP_RS(P) + i * LP_CS(P)), 1.0);
    }
    if (L)
        for (int64_t j = 0; j < k; j++)
            for (int64_t i = 0; i < m; i++)
                lp_set(dt, L->data, lo + i * LP_RS(L) + j * LP_CS(L),
                       i > j ? lp_get(dt, lu, i + j * ld) : (i == j ? 1.0 : 0.0));
    if (U)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < k; i++)
                lp_set(dt, U->data, uo + i * LP_RS(U) + j * LP_CS(U), i <= j ? lp_get(dt, lu, i + j * ld) : 0.0);
}

/* getrf on every matrix of A (of A^T when trans), writing LU, pivots and
 * (when given) info. When `api` is given a singular matrix fails with
 * PyTorch's lu_factor message. */
static int lp_lu_batch(const char *op, const fl_tensor_t *A, int trans, const fl_tensor_t *LU, const fl_tensor_t *piv,
                       const fl_tensor_t *info, const char *api) {
    int dt = A->dtype;
    int64_t m = LP_ROWS(A), n = LP_COLS(A), k = m < n ? m : n;
    if (lp_dims_ok(op, m, n)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, A, 2);
    void *a = lp_alloc(dt, m * n);
    int *ip = malloc((size_t)(k > 0 ? k : 1) * sizeof(int));
    int st = FL_OK;
    if (!a || !ip) { st = lp_oom(op); goto done; }
    int ld = lp_ld(m);
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), trans);
        int r = lp_getrf(dt, (int)m, (int)n, a, ld, ip);
        if (r < 0) { st = lp_err(FL_ERR_INTERNAL, "%s: getrf rejected argument %d", op, -r); goto done; }
        lp_store(LU, lp_off(LU, 2, &b, i), a, ld, 0);
        int32_t *p = lp_i32(piv, lp_off(piv, 1, &b, i));
        for (int64_t j = 0; j < k; j++) p[j * LP_CS(piv)] = ip[j];
        if (info) *lp_i32(info, lp_off(info, 0, &b, i)) = r;
        if (r > 0 && api) {
            char w[48];
            st = lp_err(FL_ERR_INVALID, "%s: %sU[%d,%d] is zero and using it on lu_solve would result in a division by "
                        "zero. If you still want to perform the factorization, consider calling linalg.lu(A, pivot) or "
                        "linalg.lu_factor_ex(A, pivot)", api, lp_where(w, sizeof w, A->ndim > 2, i), r, r);
            goto done;
        }
    }
done:
    free(a);
    free(ip);
    return st;
}

/* aten::linalg_lu_factor_ex(Tensor A, *, bool pivot=True, bool check_errors=False) -> (LU, pivots, info) */
static int k_lu_factor_ex(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 1 || n_out < 3 || lp_dtype(&in[0]) < 0) return FL_ERR_UNSUPPORTED;
    if (!lp_flag(args, n_args, 1, 1))
        FL_FAIL(FL_ERR_INVALID, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
    return lp_lu_batch("linalg_lu_factor_ex", &in[0], 0, &out[0], &out[1], &out[2],
                       lp_flag(args, n_args, 2, 0) ? "torch.linalg.lu_factor_ex" : NULL);
}

/* aten::linalg_lu(Tensor A, *, bool pivot=True) -> (P, L, U) */
static int k_linalg_lu(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0];
    int dt = lp_dtype(A);
    if (n_in < 1 || n_out < 3 || dt < 0) return FL_ERR_UNSUPPORTED;
    if (!lp_flag(args, n_args, 1, 1)) FL_FAIL(FL_ERR_INVALID, "linalg.lu: LU without pivoting is not implemented on the CPU");
    int64_t m = LP_ROWS(A), n = LP_COLS(A), k = m < n ? m : n;
    if (lp_dims_ok("linalg_lu", m, n)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, A, 2);
    void *a = lp_alloc(dt, m * n);
    int *ip = malloc((size_t)(k + m + 1) * sizeof(int));
    int st = FL_OK, ld = lp_ld(m);
    if (!a || !ip) { st = lp_oom("linalg_lu"); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), 0);
        int r = lp_getrf(dt, (int)m, (int)n, a, ld, ip);
        if (r < 0) { st = lp_err(FL_ERR_INTERNAL, "linalg_lu: getrf rejected argument %d", -r); goto done; }
        lp_lu_unpack1(dt, a, ld, m, n, ip, ip + k, &out[0], lp_off(&out[0], 2, &b, i), &out[1],
                      lp_off(&out[1], 2, &b, i), &out[2], lp_off(&out[2], 2, &b, i));
    }
done:
    free(a);
    free(ip);
    return st;
}

/* Pivots of getrf (1-based, each row index in 1..rows) read into ip; fails
 * like PyTorch when one is out of range (LAPACK would index outside A). */
static int lp_read_pivots(int *ip, const fl_tensor_t *piv, int64_t off, int64_t k, int64_t rows, const char *msg) {
    const int32_t *p = lp_i32(piv, off);
    for (int64_t j = 0; j < k; j++) {
        int v = p[j * LP_CS(piv)];
        if (v < 1 || v > rows) return lp_err(FL_ERR_INVALID, "%s (pivots[%lld] = %d, LU.size(-2) = %lld)", msg,
                                             (long long)j, v, (long long)rows);
        ip[j] = v;
    }
    return FL_OK;
}

/* aten::lu_unpack(Tensor LU_data, Tensor LU_pivots, bool unpack_data=True, bool unpack_pivots=True) -> (P, L, U) */
static int k_lu_unpack(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *piv = &in[1];
    int dt = lp_dtype(A);
    if (n_in < 2 || n_out < 3 || dt < 0) return FL_ERR_UNSUPPORTED;
    if (piv->dtype != FL_INT32) FL_FAIL(FL_ERR_INVALID, "lu_unpack: LU_pivots is expected to be a tensor of torch.int32");
    int data = lp_flag(args, n_args, 2, 1), pivots = lp_flag(args, n_args, 3, 1);
    int64_t m = LP_ROWS(A), n = LP_COLS(A), k = m < n ? m : n;
    if (piv->ndim < 1 || piv->sizes[piv->ndim - 1] != k)
        FL_FAIL(FL_ERR_INVALID, "lu_unpack: LU_pivots.size(-1) must be %lld (min of LU's last two sizes)", (long long)k);
    lp_batch_t b;
    lp_batch(&b, A, 2);
    void *a = lp_alloc(dt, m * n);
    int *ip = malloc((size_t)(k + m + 1) * sizeof(int));
    int st = FL_OK, ld = lp_ld(m);
    if (!a || !ip) { st = lp_oom("lu_unpack"); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), 0);
        if (pivots && (st = lp_read_pivots(ip, piv, lp_off(piv, 1, &b, i), k, m,
                                           "pivots passed to lu_unpack must be between 1 and LU.size(-2) inclusive. "
                                           "Did you properly pass the result of lu_factor?")))
            goto done;
        lp_lu_unpack1(dt, a, ld, m, n, ip, ip + k, pivots ? &out[0] : NULL, pivots ? lp_off(&out[0], 2, &b, i) : 0,
                      data ? &out[1] : NULL, data ? lp_off(&out[1], 2, &b, i) : 0, data ? &out[2] : NULL,
                      data ? lp_off(&out[2], 2, &b, i) : 0);
    }
done:
    free(a);
    free(ip);
    return st;
}

/* X = A^-1 B (left) or B A^-1 (right), with A given by its LU factors; the
 * adjoint solves with A^T. B and X are vectors (core 1) when vec. B's and
 * LU's batch dims broadcast to X's. */
static int lp_lu_solve(const char *op, const fl_tensor_t *LU, const fl_tensor_t *piv, const fl_tensor_t *B,
                       const fl_tensor_t *X, int left, int adjoint, int vec) {
    int dt = LU->dtype;
    int64_t n = LP_ROWS(LU);
    int core = vec ? 1 : 2;
    int64_t nrhs = vec ? 1 : (left ? LP_COLS(X) : LP_ROWS(X));
    if (lp_dims_ok(op, n, nrhs)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, X, core);
    void *a = lp_alloc(dt, n * n), *x = lp_alloc(dt, n * nrhs);
    int *ip = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    int st = FL_OK, ld = lp_ld(n);
    if (!a || !x || !ip) { st = lp_oom(op); goto done; }
    /* X A = B  <=>  A^T X^T = B^T: a right solve is a left solve of the transposes */
    char tr = (adjoint ^ !left) ? 'T' : 'N';
    for (int64_t i = 0; i < b.count; i++) {
        if ((st = lp_read_pivots(ip, piv, lp_off(piv, 1, &b, i), n, n,
                                 "Pivots given to lu_solve must all be smaller or equal to LU.size(-2) and at least "
                                 "1. Did you properly pass the result of lu_factor?")))
            goto done;
        lp_load(a, ld, LU, lp_off(LU, 2, &b, i), 0);
        int64_t bo = lp_off(B, core, &b, i), xo = lp_off(X, core, &b, i);
        if (vec) lp_in(x, ld, B, bo, LP_CS(B), 0, n, 1);
        else lp_load(x, ld, B, bo, !left);
        if (n > 0 && nrhs > 0) lp_getrs(dt, tr, (int)n, (int)nrhs, a, ld, ip, x, ld);
        if (vec) lp_out(X, xo, LP_CS(X), 0, x, ld, n, 1);
        else lp_store(X, xo, x, ld, !left);
    }
done:
    free(a);
    free(x);
    free(ip);
    return st;
}

/* aten::linalg_lu_solve(Tensor LU, Tensor pivots, Tensor B, *, bool left=True, bool adjoint=False) -> Tensor */
static int k_lu_solve(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int dt = lp_dtype(&in[0]);
    if (n_in < 3 || n_out < 1 || dt < 0 || in[2].dtype != dt) return FL_ERR_UNSUPPORTED;
    if (in[1].dtype != FL_INT32) FL_FAIL(FL_ERR_INVALID, "linalg.lu_solve: pivots should be a tensor of torch.int32");
    if (in[1].ndim < 1 || in[1].sizes[in[1].ndim - 1] != LP_ROWS(&in[0]) || LP_ROWS(&in[0]) != LP_COLS(&in[0]))
        FL_FAIL(FL_ERR_INVALID, "linalg.lu_solve: expected a square LU and pivots.size(-1) == LU.size(-1)");
    return lp_lu_solve("linalg_lu_solve", &in[0], &in[1], &in[2], &out[0], lp_flag(args, n_args, 3, 1),
                       lp_flag(args, n_args, 4, 0), 0);
}

/* aten::_linalg_solve_ex(Tensor A, Tensor B, *, bool left=True, bool check_errors=False)
 *   -> (result, LU, pivots, info): LU/pivots/info are A's own factorisation
 * (the backward reuses them); result broadcasts A against B. */
static int k_solve_ex(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int dt = lp_dtype(&in[0]);
    if (n_in < 2 || n_out < 4 || dt < 0 || in[1].dtype != dt) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *A = &in[0], *X = &out[0], *LU = &out[1], *piv = &out[2], *info = &out[3];
    int st = lp_lu_batch("_linalg_solve_ex", A, 0, LU, piv, info, NULL);
    if (st) return st;
    if (lp_flag(args, n_args, 3, 0)) {
        lp_batch_t b;
        lp_batch(&b, info, 0);
        for (int64_t i = 0; i < b.count; i++)
            if (*lp_i32(info, lp_off(info, 0, &b, i)) > 0) {
                char w[48];
                FL_FAIL(FL_ERR_INVALID, "torch.linalg.solve_ex: %sThe solver failed because the input matrix is singular.",
                        lp_where(w, sizeof w, A->ndim > 2, i));
            }
    }
    /* B is a (batch of) vector(s) exactly when the result has one dim fewer than A */
    return lp_lu_solve("_linalg_solve_ex", LU, piv, &in[1], X, lp_flag(args, n_args, 2, 1), 0, X->ndim == A->ndim - 1);
}

/* aten::linalg_inv_ex(Tensor A, *, bool check_errors=False) -> (inverse, info):
 * getrf, then getrs on the identity, as PyTorch's CPU kernel does. */
static int k_inv_ex(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *X = &out[0], *info = &out[1];
    int dt = lp_dtype(A);
    if (n_in < 1 || n_out < 2 || dt < 0) return FL_ERR_UNSUPPORTED;
    int check = lp_flag(args, n_args, 1, 0);
    int64_t n = LP_ROWS(A);
    if (lp_dims_ok("linalg_inv_ex", n, n)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, A, 2);
    void *a = lp_alloc(dt, n * n), *x = lp_alloc(dt, n * n);
    int *ip = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    int st = FL_OK, ld = lp_ld(n);
    if (!a || !x || !ip) { st = lp_oom("linalg_inv_ex"); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), 0);
        int r = lp_getrf(dt, (int)n, (int)n, a, ld, ip);
        if (r > 0 && check) {
            char w[48];
            st = lp_err(FL_ERR_INVALID, "linalg.inv_ex: %sThe diagonal element %d is zero, the inversion could not be "
                        "completed because the input matrix is singular.", lp_where(w, sizeof w, A->ndim > 2, i), r);
            goto done;
        }
        lp_eye(dt, x, ld, n, n);
        if (n > 0) lp_getrs(dt, 'N', (int)n, (int)n, a, ld, ip, x, ld);
        lp_store(X, lp_off(X, 2, &b, i), x, ld, 0);
        *lp_i32(info, lp_off(info, 0, &b, i)) = r;
    }
done:
    free(a);
    free(x);
    free(ip);
    return st;
}

/* det and slogdet of one matrix from its LU factors: the row swaps give the
 * permutation's sign, the diagonal the rest (a zero on it: sign 0, log -inf). */
static void lp_det1(int dt, const fl_tensor_t *LU, int64_t lo, const fl_tensor_t *piv, int64_t po, int64_t n,
                    double *sign, double *logabs, double *det) {
    double perm = 1.0, s = 1.0, la = 0.0, d = 1.0;
    const int32_t *p = lp_i32(piv, po);
    for (int64_t j = 0; j < n; j++) {
        double u = lp_get(dt, LU->data, lo + j * LP_RS(LU) + j * LP_CS(LU));
        if (p[j * LP_CS(piv)] != j + 1) perm = -perm;
        d *= u;
        s *= u > 0 ? 1.0 : (u < 0 ? -1.0 : 0.0);
        la += log(fabs(u));
    }
    *sign = s * perm;
    *logabs = la;
    *det = d * perm;
}

/* PyTorch factors A^T when A is contiguous (det(A^T) = det(A), and A^T is
 * then column-major); the LU and pivots it returns, which det's backward
 * reuses with the matching adjoint flag, are those of A^T. So do we. */
static int lp_det_trans(const fl_tensor_t *A) { return fl_numel(A) == 0 || fl_is_contiguous(A); }

/* aten::_linalg_det(Tensor A) -> (result, LU, pivots) */
static int k_det(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int dt = lp_dtype(&in[0]);
    if (n_in < 1 || n_out < 3 || dt < 0) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *A = &in[0], *D = &out[0], *LU = &out[1], *piv = &out[2];
    int st = lp_lu_batch("_linalg_det", A, lp_det_trans(A), LU, piv, NULL, NULL);
    if (st) return st;
    lp_batch_t b;
    lp_batch(&b, A, 2);
    for (int64_t i = 0; i < b.count; i++) {
        double s, la, d;
        lp_det1(dt, LU, lp_off(LU, 2, &b, i), piv, lp_off(piv, 1, &b, i), LP_ROWS(A), &s, &la, &d);
        lp_set(dt, D->data, lp_off(D, 0, &b, i), d);
    }
    return FL_OK;
}

/* aten::_linalg_slogdet(Tensor A) -> (sign, logabsdet, LU, pivots) */
static int k_slogdet(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int dt = lp_dtype(&in[0]);
    if (n_in < 1 || n_out < 4 || dt < 0) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *A = &in[0], *S = &out[0], *L = &out[1], *LU = &out[2], *piv = &out[3];
    int st = lp_lu_batch("_linalg_slogdet", A, lp_det_trans(A), LU, piv, NULL, NULL);
    if (st) return st;
    lp_batch_t b;
    lp_batch(&b, A, 2);
    for (int64_t i = 0; i < b.count; i++) {
        double s, la, d;
        lp_det1(dt, LU, lp_off(LU, 2, &b, i), piv, lp_off(piv, 1, &b, i), LP_ROWS(A), &s, &la, &d);
        lp_set(dt, S->data, lp_off(S, 0, &b, i), s);
        lp_set(dt, L->data, lp_off(L, 0, &b, i), la);
    }
    return FL_OK;
}

/* ======================================================================
 * Cholesky: potrf / potrs / potri
 * ====================================================================== */

/* potrf of every matrix (the `upper` triangle), the other triangle zeroed.
 * api != NULL: a matrix that is not positive-definite fails with PyTorch's
 * message; else its info goes to `info`. */
static int lp_chol(const char *op, const fl_tensor_t *A, const fl_tensor_t *L, const fl_tensor_t *info, int upper,
                   const char *api) {
    int dt = A->dtype;
    int64_t n = LP_ROWS(A);
    if (lp_dims_ok(op, n, n)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, A, 2);
    void *a = lp_alloc(dt, n * n);
    int st = FL_OK, ld = lp_ld(n);
    if (!a) return lp_oom(op);
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), 0);
        int r = n > 0 ? lp_potrf(dt, upper ? 'U' : 'L', (int)n, a, ld) : 0;
        if (r > 0 && api) {
            char w[48];
            st = lp_err(FL_ERR_INVALID, "%s: %sThe factorization could not be completed because the input is not "
                        "positive-definite (the leading minor of order %d is not positive-definite).", api,
                        lp_where(w, sizeof w, A->ndim > 2, i), r);
            break;
        }
        lp_triangle(dt, a, ld, n, n, upper, 0);
        lp_store(L, lp_off(L, 2, &b, i), a, ld, 0);
        if (info) *lp_i32(info, lp_off(info, 0, &b, i)) = r;
    }
    free(a);
    return st;
}

/* aten::linalg_cholesky_ex(Tensor self, *, bool upper=False, bool check_errors=False) -> (L, info) */
static int k_cholesky_ex(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 1 || n_out < 2 || lp_dtype(&in[0]) < 0) return FL_ERR_UNSUPPORTED;
    return lp_chol("linalg_cholesky_ex", &in[0], &out[0], &out[1], lp_flag(args, n_args, 1, 0),
                   lp_flag(args, n_args, 2, 0) ? "linalg.cholesky_ex" : NULL);
}

/* aten::cholesky(Tensor self, bool upper=False) -> Tensor */
static int k_cholesky(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_in < 1 || n_out < 1 || lp_dtype(&in[0]) < 0) return FL_ERR_UNSUPPORTED;
    return lp_chol("cholesky", &in[0], &out[0], NULL, lp_flag(args, n_args, 1, 0), "cholesky");
}

/* aten::cholesky_solve(Tensor self, Tensor input2, bool upper=False) -> Tensor: self is B, input2 the factor. */
static int k_cholesky_solve(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int dt = lp_dtype(&in[0]);
    if (n_in < 2 || n_out < 1 || dt < 0 || in[1].dtype != dt) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *B = &in[0], *L = &in[1], *X = &out[0];
    int upper = lp_flag(args, n_args, 2, 0);
    int64_t n = LP_ROWS(L), k = LP_COLS(X);
    if (LP_COLS(L) != n || LP_ROWS(X) != n)
        FL_FAIL(FL_ERR_INVALID, "cholesky_solve: expected a square factor matching B's rows");
    if (lp_dims_ok("cholesky_solve", n, k)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, X, 2);
    void *a = lp_alloc(dt, n * n), *x = lp_alloc(dt, n * k);
    int ld = lp_ld(n), st = FL_OK;
    if (!a || !x) { st = lp_oom("cholesky_solve"); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, L, lp_off(L, 2, &b, i), 0);
        lp_load(x, ld, B, lp_off(B, 2, &b, i), 0);
        if (n > 0 && k > 0) lp_potrs(dt, upper ? 'U' : 'L', (int)n, (int)k, a, ld, x, ld);
        lp_store(X, lp_off(X, 2, &b, i), x, ld, 0);
    }
done:
    free(a);
    free(x);
    return st;
}

/* aten::cholesky_inverse(Tensor self, bool upper=False) -> Tensor: potri, then
 * the computed triangle mirrored (potri writes one triangle only). */
static int k_cholesky_inverse(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int dt = lp_dtype(&in[0]);
    if (n_in < 1 || n_out < 1 || dt < 0) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *L = &in[0], *X = &out[0];
    int upper = lp_flag(args, n_args, 1, 0);
    int64_t n = LP_ROWS(L);
    if (lp_dims_ok("cholesky_inverse", n, n)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, L, 2);
    void *a = lp_alloc(dt, n * n);
    int ld = lp_ld(n), st = FL_OK;
    if (!a) return lp_oom("cholesky_inverse");
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, L, lp_off(L, 2, &b, i), 0);
        int r = n > 0 ? lp_potri(dt, upper ? 'U' : 'L', (int)n, a, ld) : 0;
        if (r > 0) {
            char w[48];
            st = lp_err(FL_ERR_INVALID, "cholesky_inverse: %sThe diagonal element %d is zero, the inversion could not "
                        "be completed because the input matrix is singular.", lp_where(w, sizeof w, L->ndim > 2, i), r);
            break;
        }
        for (int64_t j = 0; j < n; j++)
            for (int64_t c = j + 1; c < n; c++) {
                if (upper) lp_set(dt, a, c + j * ld, lp_get(dt, a, j + c * ld));
                else lp_set(dt, a, j + c * ld, lp_get(dt, a, c + j * ld));
            }
        lp_store(X, lp_off(X, 2, &b, i), a, ld, 0);
    }
    free(a);
    return st;
}

/* ======================================================================
 * Symmetric eigenproblem (syevd) and SVD (gesdd)
 * ====================================================================== */

/* Eigen-decomposition of one symmetric n x n buffer in place: w gets the
 * ascending eigenvalues, a the eigenvectors when jobz == 'V'. */
typedef struct {
    void *work;
    int *iwork;
    int lwork, liwork;
} lp_ws_t;

static int lp_syevd_ws(lp_ws_t *ws, int dt, char jobz, int n) {
    double q[2] = {0, 0};
    int iq = 0, ld = lp_ld(n);
    ws->work = NULL;
    ws->iwork = NULL;
    lp_syevd(dt, jobz, 'L', n, q, ld, q, q, -1, &iq, -1);
    ws->lwork = lp_lwork(dt, q);
    ws->liwork = iq > 1 ? iq : 1;
    ws->work = lp_alloc(dt, ws->lwork);
    ws->iwork = malloc((size_t)ws->liwork * sizeof(int));
    return ws->work && ws->iwork;
}

static int lp_eigh_fail(int r) {
    if (r < 0) return lp_err(FL_ERR_INTERNAL, "linalg.eigh: syevd rejected argument %d", -r);
    return lp_err(FL_ERR_INVALID, "linalg.eigh: The algorithm failed to converge because the input matrix is "
                  "ill-conditioned or has too many repeated eigenvalues (error code: %d).", r);
}

static int lp_symmetric(const fl_tensor_t *A, int64_t off) {
    int64_t n = LP_ROWS(A);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < i; j++)
            if (memcmp(fl_elem(A, off + i * LP_RS(A) + j * LP_CS(A)), fl_elem(A, off + j * LP_RS(A) + i * LP_CS(A)),
                       fl_itemsize(A->dtype)))
                return 0;
    return 1;
}

/* aten::_linalg_eigh(Tensor A, str UPLO="L", bool compute_v=True) -> (eigenvalues, eigenvectors) */
static int k_eigh(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *W = &out[0], *V = &out[1];
    int dt = lp_dtype(A);
    if (n_in < 1 || n_out < 2 || dt < 0) return FL_ERR_UNSUPPORTED;
    int64_t n = LP_ROWS(A);
    if (lp_dims_ok("_linalg_eigh", n, n)) return FL_ERR_INVALID;
    int vecs = lp_flag(args, n_args, 2, 1);
    lp_batch_t b;
    lp_batch(&b, A, 2);
    char uplo = 0;
    if (n_args > 1 && args[1].kind == FL_ARG_OTHER && args[1].i == FL_STR_L) uplo = 'L';
    else if (n_args > 1 && args[1].kind == FL_ARG_OTHER && args[1].i == FL_STR_U) uplo = 'U';
    if (!uplo) {
        /* The runtime did not say which triangle to read: that only does not
         * matter when every matrix is exactly symmetric. */
        for (int64_t i = 0; i < b.count; i++)
            if (!lp_symmetric(A, lp_off(A, 2, &b, i))) return FL_ERR_UNSUPPORTED;
        uplo = 'L';
    }
    int ld = lp_ld(n), st = FL_OK;
    lp_ws_t ws;
    void *a = lp_alloc(dt, n * n), *w = lp_alloc(dt, n);
    if (!a || !w || !lp_syevd_ws(&ws, dt, vecs ? 'V' : 'N', (int)n)) { st = lp_oom("_linalg_eigh"); goto done; }
    for (int64_t i = 0; i < b.count && n > 0; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), 0);
        int r = lp_syevd(dt, vecs ? 'V' : 'N', uplo, (int)n, a, ld, w, ws.work, ws.lwork, ws.iwork, ws.liwork);
        if (r) { st = lp_eigh_fail(r); goto done; }
        lp_out(W, lp_off(W, 1, &b, i), LP_CS(W), 0, w, n, n, 1);
        if (vecs) lp_store(V, lp_off(V, 2, &b, i), a, ld, 0);
    }
done:
    free(a);
    free(w);
    free(ws.work);
    free(ws.iwork);
    return st;
}

static int lp_svd_fail(int r) {
    if (r == -4) return lp_err(FL_ERR_INVALID, "linalg.svd: The algorithm failed to converge because the input matrix "
                               "contained non-finite values.");
    if (r < 0) return lp_err(FL_ERR_INTERNAL, "linalg.svd: gesdd rejected argument %d", -r);
    return lp_err(FL_ERR_INVALID, "linalg.svd: The algorithm failed to converge because the input matrix is "
                  "ill-conditioned or has too many repeated singular values (error code: %d).", r);
}

/* Scratch for gesdd on m x n matrices: U is m x ucols, VT vrows x n. */
typedef struct {
    void *a, *s, *u, *vt, *work;
    int *iwork;
    int lwork, ucols, vrows;
    char jobz;
} lp_svd_t;

static void lp_svd_free(lp_svd_t *w) {
    free(w->a);
    free(w->s);
    free(w->u);
    free(w->vt);
    free(w->work);
    free(w->iwork);
}

static int lp_svd_init(lp_svd_t *w, int dt, int64_t m, int64_t n, int full, int uv) {
    int64_t k = m < n ? m : n;
    memset(w, 0, sizeof *w);
    w->jobz = uv ? (full ? 'A' : 'S') : 'N';
    w->ucols = (int)(uv ? (full ? m : k) : 1);
    w->vrows = (int)(uv ? (full ? n : k) : 1);
    w->a = lp_alloc(dt, m * n);
    w->s = lp_alloc(dt, k);
    w->u = lp_alloc(dt, m * w->ucols);
    w->vt = lp_alloc(dt, (int64_t)w->vrows * n);
    w->iwork = malloc((size_t)(8 * k + 1) * sizeof(int));
    if (!w->a || !w->s || !w->u || !w->vt || !w->iwork) return 0;
    if (k == 0) { w->lwork = 1; w->work = lp_alloc(dt, 1); return w->work != NULL; }
    double q[2] = {0, 0};
    int r = lp_gesdd(dt, w->jobz, (int)m, (int)n, w->a, lp_ld(m), w->s, w->u, lp_ld(m), w->vt, lp_ld(w->vrows), q, -1,
                     w->iwork);
    w->lwork = r == 0 ? lp_lwork(dt, q) : 1;
    w->work = lp_alloc(dt, w->lwork);
    return w->work != NULL;
}

/* gesdd of the matrix at `off` of A into w (k == 0 leaves U/VT alone). */
static int lp_svd1(lp_svd_t *w, int dt, const fl_tensor_t *A, int64_t off) {
    int64_t m = LP_ROWS(A), n = LP_COLS(A);
    if (m == 0 || n == 0) return FL_OK;
    lp_load(w->a, lp_ld(m), A, off, 0);
    int r = lp_gesdd(dt, w->jobz, (int)m, (int)n, w->a, lp_ld(m), w->s, w->u, lp_ld(m), w->vt, lp_ld(w->vrows), w->work,
                     w->lwork, w->iwork);
    return r ? lp_svd_fail(r) : FL_OK;
}

/* aten::_linalg_svd(Tensor A, bool full_matrices=False, bool compute_uv=True, *, str? driver=None) -> (U, S, Vh) */
static int k_svd(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *U = &out[0], *S = &out[1], *Vh = &out[2];
    int dt = lp_dtype(A);
    if (n_in < 1 || n_out < 3 || dt < 0) return FL_ERR_UNSUPPORTED;
    if (n_args > 3 && args[3].kind != FL_ARG_NONE)
        FL_FAIL(FL_ERR_INVALID, "torch.linalg.svd: keyword argument `driver=` is only supported on CUDA inputs with "
                "cuSOLVER backend.");
    int full = lp_flag(args, n_args, 1, 0), uv = lp_flag(args, n_args, 2, 1);
    int64_t m = LP_ROWS(A), n = LP_COLS(A), k = m < n ? m : n;
    if (lp_dims_ok("_linalg_svd", m, n)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, A, 2);
    lp_svd_t w;
    int st = FL_OK;
    if (!lp_svd_init(&w, dt, m, n, full, uv)) { st = lp_oom("_linalg_svd"); goto done; }
    if (k == 0 && uv && full) { /* an empty matrix: U and Vh are identities, as on CPU */
        lp_eye(dt, w.u, lp_ld(m), m, m);
        lp_eye(dt, w.vt, lp_ld(n), n, n);
    }
    for (int64_t i = 0; i < b.count; i++) {
        if ((st = lp_svd1(&w, dt, A, lp_off(A, 2, &b, i)))) goto done;
        lp_out(S, lp_off(S, 1, &b, i), LP_CS(S), 0, w.s, k, k, 1);
        if (uv) {
            lp_out(U, lp_off(U, 2, &b, i), LP_RS(U), LP_CS(U), w.u, lp_ld(m), m, w.ucols);
            lp_out(Vh, lp_off(Vh, 2, &b, i), LP_RS(Vh), LP_CS(Vh), w.vt, lp_ld(w.vrows), w.vrows, n);
        }
    }
done:
    lp_svd_free(&w);
    return st;
}

/* aten::linalg_pinv.atol_rtol_tensor(Tensor self, *, Tensor? atol=None, Tensor? rtol=None, bool hermitian=False):
 * PyTorch's formula (LinearAlgebra.cpp linalg_pinv) on one SVD (or, for
 * hermitian, one eigen-decomposition) per matrix:
 *   tol = max(atol, rtol * largest |value|); values <= tol count as zero;
 *   rtol defaults to eps * max(m, n), or to 0 where an atol > 0 is given. */
static int k_pinv(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *P = &out[0];
    int dt = lp_dtype(A);
    if (n_in < 1 || n_out < 1 || dt < 0) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *atol = lp_opt(in, n_in, args, n_args, 1), *rtol = lp_opt(in, n_in, args, n_args, 2);
    int herm = lp_flag(args, n_args, 3, 0);
    int64_t m = LP_ROWS(A), n = LP_COLS(A), k = m < n ? m : n;
    if (lp_dims_ok("linalg_pinv", m, n)) return FL_ERR_INVALID;
    if (herm && m != n) FL_FAIL(FL_ERR_INVALID, "linalg.pinv: hermitian=True needs square matrices");
    double eps = dt == FL_FLOAT64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
    double rtol_default = eps * (double)(m > n ? m : n);
    lp_batch_t b;
    lp_batch(&b, P, 2);
    int st = FL_OK;
    lp_svd_t w;
    lp_ws_t ws = {0};
    void *p = lp_alloc(dt, n * m), *v2 = NULL;
    if (herm) {
        memset(&w, 0, sizeof w);
        w.a = lp_alloc(dt, n * n);
        w.s = lp_alloc(dt, n);
        v2 = lp_alloc(dt, n * n);
        if (!p || !w.a || !w.s || !v2 || !lp_syevd_ws(&ws, dt, 'V', (int)n)) { st = lp_oom("linalg_pinv"); goto done; }
    } else if (!p || !lp_svd_init(&w, dt, m, n, 0, 1)) {
        st = lp_oom("linalg_pinv");
        goto done;
    }
    for (int64_t i = 0; i < b.count && k > 0; i++) {
        int64_t ao = lp_off(A, 2, &b, i);
        double at = atol ? fl_load_f64(atol->dtype, fl_elem(atol, lp_off(atol, 0, &b, i))) : 0.0;
        double rt = rtol ? fl_load_f64(rtol->dtype, fl_elem(rtol, lp_off(rtol, 0, &b, i)))
                         : (atol && at > 0 ? 0.0 : rtol_default);
        if (herm) {
            int ld = lp_ld(n);
            lp_load(w.a, ld, A, ao, 0);
            int r = lp_syevd(dt, 'V', 'L', (int)n, w.a, ld, w.s, ws.work, ws.lwork, ws.iwork, ws.liwork);
            if (r) { st = lp_eigh_fail(r); goto done; }
            double big = 0.0;
            for (int64_t j = 0; j < n; j++) big = fmax(big, fabs(lp_get(dt, w.s, j)));
            double tol = fmax(at, rt * big);
            /* P = V diag(1/L) V^T over the eigenvalues above tol */
            for (int64_t j = 0; j < n; j++) {
                double l = lp_get(dt, w.s, j), inv = fabs(l) > tol ? 1.0 / l : 0.0;
                for (int64_t r2 = 0; r2 < n; r2++) lp_set(dt, v2, r2 + j * ld, lp_get(dt, w.a, r2 + j * ld) * inv);
            }
            lp_gemm(dt, 0, 1, (int)n, (int)n, (int)n, v2, ld, w.a, ld, p, ld);
        } else {
            if ((st = lp_svd1(&w, dt, A, ao))) goto done;
            double tol = fmax(at, rt * lp_get(dt, w.s, 0));
            /* P (n x m) = V diag(1/S) U^T: scale the rows of VT, then VT^T U^T */
            int ldv = lp_ld(k);
            for (int64_t j = 0; j < k; j++) {
                double s = lp_get(dt, w.s, j), inv = s > tol ? 1.0 / s : 0.0;
                for (int64_t c = 0; c < n; c++) lp_set(dt, w.vt, j + c * ldv, lp_get(dt, w.vt, j + c * ldv) * inv);
            }
            lp_gemm(dt, 1, 1, (int)n, (int)m, (int)k, w.vt, ldv, w.u, lp_ld(m), p, lp_ld(n));
        }
        lp_store(P, lp_off(P, 2, &b, i), p, lp_ld(n), 0);
    }
done:
    free(p);
    free(v2);
    free(ws.work);
    free(ws.iwork);
    lp_svd_free(&w);
    return st;
}

/* ======================================================================
 * QR: geqrf / orgqr / ormqr
 * ====================================================================== */

/* aten::linalg_qr(Tensor A, str mode="reduced") -> (Q, R). The mode is read
 * from the outputs the meta function made: Q is 1-d and empty for "r", and
 * Q's column count is m for "complete", min(m, n) for "reduced". */
static int k_qr(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *Q = &out[0], *R = &out[1];
    int dt = lp_dtype(A);
    if (n_in < 1 || n_out < 2 || dt < 0 || R->ndim != A->ndim) return FL_ERR_UNSUPPORTED;
    int64_t m = LP_ROWS(A), n = LP_COLS(A), k = m < n ? m : n;
    if (lp_dims_ok("linalg_qr", m, n)) return FL_ERR_INVALID;
    int want_q = Q->ndim == A->ndim;
    int64_t qc = want_q ? LP_COLS(Q) : 0, rr = LP_ROWS(R);
    lp_batch_t b;
    lp_batch(&b, A, 2);
    int ld = lp_ld(m), st = FL_OK;
    void *a = lp_alloc(dt, m * n), *q = lp_alloc(dt, m * qc), *tau = lp_alloc(dt, k), *work = NULL;
    if (!a || !q || !tau) { st = lp_oom("linalg_qr"); goto done; }
    double wq[2] = {0, 0}, wq2[2] = {0, 0};
    int lwork = 1;
    if (k > 0) {
        lp_geqrf(dt, (int)m, (int)n, a, ld, tau, wq, -1);
        lwork = lp_lwork(dt, wq);
        if (want_q) {
            lp_orgqr(dt, (int)m, (int)qc, (int)k, q, ld, tau, wq2, -1);
            int l2 = lp_lwork(dt, wq2);
            if (l2 > lwork) lwork = l2;
        }
    }
    if (!(work = lp_alloc(dt, lwork))) { st = lp_oom("linalg_qr"); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), 0);
        if (k > 0) lp_geqrf(dt, (int)m, (int)n, a, ld, tau, work, lwork);
        int64_t ro = lp_off(R, 2, &b, i);
        for (int64_t c = 0; c < n; c++)
            for (int64_t r = 0; r < rr; r++)
                lp_set(dt, R->data, ro + r * LP_RS(R) + c * LP_CS(R), r <= c ? lp_get(dt, a, r + c * ld) : 0.0);
        if (!want_q) continue;
        if (k == 0) {
            lp_eye(dt, q, ld, m, qc);
        } else {
            /* the reflectors sit in the first k columns; orgqr expands them to qc columns */
            memcpy(q, a, (size_t)(ld * k) * fl_itemsize(dt));
            lp_orgqr(dt, (int)m, (int)qc, (int)k, q, ld, tau, work, lwork);
        }
        lp_out(Q, lp_off(Q, 2, &b, i), LP_RS(Q), LP_CS(Q), q, ld, m, qc);
    }
done:
    free(a);
    free(q);
    free(tau);
    free(work);
    return st;
}

/* aten::linalg_householder_product(Tensor input, Tensor tau) -> Tensor: orgqr. */
static int k_householder(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *T = &in[1], *Q = &out[0];
    int dt = lp_dtype(A);
    if (n_in < 2 || n_out < 1 || dt < 0 || T->dtype != dt) return FL_ERR_UNSUPPORTED;
    int64_t m = LP_ROWS(A), n = LP_COLS(A), k = T->ndim ? T->sizes[T->ndim - 1] : 1;
    if (!(m >= n && n >= k))
        FL_FAIL(FL_ERR_INVALID, "torch.linalg.householder_product: expected input.shape[-2] >= input.shape[-1] >= "
                "tau.shape[-1], got %lld, %lld, %lld", (long long)m, (long long)n, (long long)k);
    if (lp_dims_ok("linalg_householder_product", m, n)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, Q, 2);
    int ld = lp_ld(m), st = FL_OK, lwork = 1;
    void *a = lp_alloc(dt, m * n), *tau = lp_alloc(dt, k), *work = NULL;
    double wq[2] = {0, 0};
    if (!a || !tau) { st = lp_oom("linalg_householder_product"); goto done; }
    if (n > 0) {
        lp_orgqr(dt, (int)m, (int)n, (int)k, a, ld, tau, wq, -1);
        lwork = lp_lwork(dt, wq);
    }
    if (!(work = lp_alloc(dt, lwork))) { st = lp_oom("linalg_householder_product"); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), 0);
        lp_in(tau, k, T, lp_off(T, 1, &b, i), T->ndim ? LP_CS(T) : 0, 0, k, 1);
        if (n > 0) lp_orgqr(dt, (int)m, (int)n, (int)k, a, ld, tau, work, lwork);
        lp_store(Q, lp_off(Q, 2, &b, i), a, ld, 0);
    }
done:
    free(a);
    free(tau);
    free(work);
    return st;
}

/* aten::ormqr(Tensor self, Tensor input2, Tensor input3, bool left=True, bool transpose=False) -> Tensor:
 * Q (from self's reflectors and tau input2) times input3. */
static int k_ormqr(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *T = &in[1], *C = &in[2], *X = &out[0];
    int dt = lp_dtype(A);
    if (n_in < 3 || n_out < 1 || dt < 0 || T->dtype != dt || C->dtype != dt) return FL_ERR_UNSUPPORTED;
    int left = lp_flag(args, n_args, 3, 1), trans = lp_flag(args, n_args, 4, 0);
    int64_t m = LP_ROWS(X), n = LP_COLS(X), nq = left ? m : n, k = T->ndim ? T->sizes[T->ndim - 1] : 1;
    if (LP_ROWS(A) != nq || LP_COLS(A) < k || k > nq)
        FL_FAIL(FL_ERR_INVALID, "ormqr: expected input of %lld rows and at least tau.shape[-1] = %lld columns, with "
                "tau.shape[-1] <= %lld", (long long)nq, (long long)k, (long long)nq);
    if (lp_dims_ok("ormqr", m, n) || lp_dims_ok("ormqr", nq, k)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, X, 2);
    int lda = lp_ld(nq), ldc = lp_ld(m), st = FL_OK, lwork = 1;
    void *a = lp_alloc(dt, nq * k), *tau = lp_alloc(dt, k), *c = lp_alloc(dt, m * n), *work = NULL;
    double wq[2] = {0, 0};
    char side = left ? 'L' : 'R', tr = trans ? 'T' : 'N';
    if (!a || !tau || !c) { st = lp_oom("ormqr"); goto done; }
    if (m > 0 && n > 0) {
        lp_ormqr(dt, side, tr, (int)m, (int)n, (int)k, a, lda, tau, c, ldc, wq, -1);
        lwork = lp_lwork(dt, wq);
    }
    if (!(work = lp_alloc(dt, lwork))) { st = lp_oom("ormqr"); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        lp_in(a, lda, A, lp_off(A, 2, &b, i), LP_RS(A), LP_CS(A), nq, k);
        lp_in(tau, k, T, lp_off(T, 1, &b, i), T->ndim ? LP_CS(T) : 0, 0, k, 1);
        lp_load(c, ldc, C, lp_off(C, 2, &b, i), 0);
        if (m > 0 && n > 0) lp_ormqr(dt, side, tr, (int)m, (int)n, (int)k, a, lda, tau, c, ldc, work, lwork);
        lp_store(X, lp_off(X, 2, &b, i), c, ldc, 0);
    }
done:
    free(a);
    free(tau);
    free(c);
    free(work);
    return st;
}

/* ======================================================================
 * Triangular solves (cblas trsm)
 * ====================================================================== */

/* X = op(A)^-1 B (left) or B op(A)^-1 (right) for triangular A, batched with
 * broadcasting; M, when given, receives A broadcast to its batch. */
static int lp_trisolve(const char *op, const fl_tensor_t *A, const fl_tensor_t *B, const fl_tensor_t *X,
                       const fl_tensor_t *M, int upper, int left, int trans, int unit) {
    int dt = A->dtype;
    int64_t n = LP_ROWS(A), rows = LP_ROWS(X), cols = LP_COLS(X);
    if (LP_COLS(A) != n || (left ? rows : cols) != n)
        return lp_err(FL_ERR_INVALID, "%s: expected a square A (got %lld x %lld) matching B", op, (long long)n,
                      (long long)LP_COLS(A));
    if (lp_dims_ok(op, rows, cols) || lp_dims_ok(op, n, n)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, X, 2);
    void *a = lp_alloc(dt, n * n), *x = lp_alloc(dt, rows * cols);
    int ld = lp_ld(n), ldx = lp_ld(rows), st = FL_OK;
    if (!a || !x) { st = lp_oom(op); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), 0);
        lp_load(x, ldx, B, lp_off(B, 2, &b, i), 0);
        lp_trsm(dt, left, upper, trans, unit, (int)rows, (int)cols, a, ld, x, ldx);
        lp_store(X, lp_off(X, 2, &b, i), x, ldx, 0);
        if (M) lp_store(M, lp_off(M, 2, &b, i), a, ld, 0);
    }
done:
    free(a);
    free(x);
    return st;
}

/* aten::linalg_solve_triangular(Tensor self, Tensor B, *, bool upper, bool left=True, bool unitriangular=False) */
static int k_solve_triangular(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int dt = lp_dtype(&in[0]);
    if (n_in < 2 || n_out < 1 || dt < 0 || in[1].dtype != dt) return FL_ERR_UNSUPPORTED;
    return lp_trisolve("linalg_solve_triangular", &in[0], &in[1], &out[0], NULL, lp_flag(args, n_args, 2, 0),
                       lp_flag(args, n_args, 3, 1), 0, lp_flag(args, n_args, 4, 0));
}

/* aten::triangular_solve(Tensor self, Tensor A, bool upper=True, bool transpose=False, bool unitriangular=False)
 *   -> (solution, cloned_coefficient) */
static int k_triangular_solve(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    int dt = lp_dtype(&in[0]);
    if (n_in < 2 || n_out < 2 || dt < 0 || in[1].dtype != dt) return FL_ERR_UNSUPPORTED;
    return lp_trisolve("triangular_solve", &in[1], &in[0], &out[0], &out[1], lp_flag(args, n_args, 2, 1), 1,
                       lp_flag(args, n_args, 3, 0), lp_flag(args, n_args, 4, 0));
}

/* ======================================================================
 * LDL^T (Bunch-Kaufman): sytrf / sytrs, lower triangle as PyTorch uses
 * ====================================================================== */

/* aten::linalg_ldl_factor_ex(Tensor self, *, bool hermitian=False, bool check_errors=False) -> (LD, pivots, info).
 * For real inputs hermitian and symmetric are the same factorisation. */
static int k_ldl_factor_ex(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *LD = &out[0], *piv = &out[1], *info = &out[2];
    int dt = lp_dtype(A);
    if (n_in < 1 || n_out < 3 || dt < 0) return FL_ERR_UNSUPPORTED;
    int check = lp_flag(args, n_args, 2, 0);
    int64_t n = LP_ROWS(A);
    if (lp_dims_ok("linalg_ldl_factor_ex", n, n)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, A, 2);
    int ld = lp_ld(n), st = FL_OK, lwork = 1;
    void *a = lp_alloc(dt, n * n), *work = NULL;
    int *ip = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    double wq[2] = {0, 0};
    if (!a || !ip) { st = lp_oom("linalg_ldl_factor_ex"); goto done; }
    if (n > 0) {
        int iq;
        lp_sytrf(dt, 'L', (int)n, a, ld, &iq, wq, -1);
        lwork = lp_lwork(dt, wq);
    }
    if (!(work = lp_alloc(dt, lwork))) { st = lp_oom("linalg_ldl_factor_ex"); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        lp_load(a, ld, A, lp_off(A, 2, &b, i), 0);
        int r = n > 0 ? lp_sytrf(dt, 'L', (int)n, a, ld, ip, work, lwork) : 0;
        if (r > 0 && check) {
            char w[48];
            st = lp_err(FL_ERR_INVALID, "torch.linalg.ldl_factor_ex: %sThe factorization could not be completed "
                        "because the input is singular (D[%d,%d] is exactly zero).",
                        lp_where(w, sizeof w, A->ndim > 2, i), r, r);
            goto done;
        }
        lp_triangle(dt, a, ld, n, n, 0, 0);
        lp_store(LD, lp_off(LD, 2, &b, i), a, ld, 0);
        int32_t *p = lp_i32(piv, lp_off(piv, 1, &b, i));
        for (int64_t j = 0; j < n; j++) p[j * LP_CS(piv)] = ip[j];
        *lp_i32(info, lp_off(info, 0, &b, i)) = r;
    }
done:
    free(a);
    free(ip);
    free(work);
    return st;
}

/* sytrf pivots of the lower factor: |p| in 1..n, and a negative p (a 2x2
 * block) repeated on the next row; sytrs reads past A otherwise. */
static int lp_read_ldl_pivots(int *ip, const fl_tensor_t *piv, int64_t off, int64_t n) {
    const int32_t *p = lp_i32(piv, off);
    for (int64_t j = 0; j < n; j++) ip[j] = p[j * LP_CS(piv)];
    for (int64_t j = 0; j < n; j++) {
        int v = ip[j];
        if (v == 0 || v > n || -v > n)
            return lp_err(FL_ERR_INVALID, "Pivots given to ldl_solve must all satisfy 1 <= |pivot| <= LD.size(-2) "
                          "(pivots[%lld] = %d). Did you properly pass the result of ldl_factor?", (long long)j, v);
        if (v < 0) {
            if (j + 1 >= n || ip[j + 1] != v)
                return lp_err(FL_ERR_INVALID, "linalg.ldl_solve: pivots[%lld] = %d starts a 2x2 block that pivots[%lld] "
                              "does not close. Did you properly pass the result of ldl_factor?", (long long)j, v,
                              (long long)(j + 1));
            j++;
        }
    }
    return FL_OK;
}

/* aten::linalg_ldl_solve(Tensor LD, Tensor pivots, Tensor B, *, bool hermitian=False) -> Tensor */
static int k_ldl_solve(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *LD = &in[0], *piv = &in[1], *B = &in[2], *X = &out[0];
    int dt = lp_dtype(LD);
    if (n_in < 3 || n_out < 1 || dt < 0 || B->dtype != dt) return FL_ERR_UNSUPPORTED;
    if (piv->dtype != FL_INT32) FL_FAIL(FL_ERR_INVALID, "linalg.ldl_solve: pivots should be a tensor of torch.int32");
    int64_t n = LP_ROWS(LD), k = LP_COLS(X);
    if (LP_COLS(LD) != n || LP_ROWS(X) != n || piv->ndim < 1 || piv->sizes[piv->ndim - 1] != n)
        FL_FAIL(FL_ERR_INVALID, "linalg.ldl_solve: expected a square LD, B with LD.size(-1) rows and as many pivots");
    if (lp_dims_ok("linalg_ldl_solve", n, k)) return FL_ERR_INVALID;
    lp_batch_t b;
    lp_batch(&b, X, 2);
    void *a = lp_alloc(dt, n * n), *x = lp_alloc(dt, n * k);
    int *ip = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    int ld = lp_ld(n), st = FL_OK;
    if (!a || !x || !ip) { st = lp_oom("linalg_ldl_solve"); goto done; }
    for (int64_t i = 0; i < b.count; i++) {
        if ((st = lp_read_ldl_pivots(ip, piv, lp_off(piv, 1, &b, i), n))) goto done;
        lp_load(a, ld, LD, lp_off(LD, 2, &b, i), 0);
        lp_load(x, ld, B, lp_off(B, 2, &b, i), 0);
        if (n > 0 && k > 0) lp_sytrs(dt, 'L', (int)n, (int)k, a, ld, ip, x, ld);
        lp_store(X, lp_off(X, 2, &b, i), x, ld, 0);
    }
done:
    free(a);
    free(x);
    free(ip);
    return st;
}

/* ======================================================================
 * Matrix exponential: Pade 13 with scaling and squaring (Higham 2005),
 * computed in double for both dtypes.
 * ====================================================================== */

/* r = sum_k c[k] * M[k] + c0 * I, all n x n column-major doubles */
static void lp_lincomb(double *r, int n, double c0, int nm, const double *c, const double *const *M) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < n; i++) {
            double v = i == j ? c0 : 0.0;
            for (int k = 0; k < nm; k++) v += c[k] * M[k][i + j * n];
            r[i + j * n] = v;
        }
}

/* exp(a) into e; t: 6 n*n doubles of scratch, ip: n ints. */
static void lp_expm1(double *a, double *e, int n, double *t, int *ip) {
    static const double b[14] = {64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0,
                                 129060195264000.0, 10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0,
                                 40840800.0, 960960.0, 16380.0, 182.0, 1.0};
    const double theta13 = 5.371920351148152;
    int64_t nn = (int64_t)n * n;
    double norm = 0.0;
    for (int64_t j = 0; j < n; j++) {
        double s = 0.0;
        for (int64_t i = 0; i < n; i++) s += fabs(a[i + j * n]);
        norm = fmax(norm, s);
    }
    if (!isfinite(norm)) { /* NaN or inf entries: no meaningful result */
        for (int64_t i = 0; i < nn; i++) e[i] = NAN;
        return;
    }
    int s = 0;
    if (norm > theta13) {
        s = (int)ceil(log2(norm / theta13));
        double f = ldexp(1.0, -s);
        for (int64_t i = 0; i < nn; i++) a[i] *= f;
    }
    double *A2 = t, *A4 = t + nn, *A6 = t + 2 * nn, *U = t + 3 * nn, *V = t + 4 * nn, *W = t + 5 * nn;
    scipy_cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, a, n, a, n, 0.0, A2, n);
    scipy_cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, A2, n, A2, n, 0.0, A4, n);
    scipy_cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, A4, n, A2, n, 0.0, A6, n);
    /* U = A [A6 (b13 A6 + b11 A4 + b9 A2) + b7 A6 + b5 A4 + b3 A2 + b1 I] */
    lp_lincomb(W, n, 0.0, 3, (const double[]){b[13], b[11], b[9]}, (const double *const[]){A6, A4, A2});
    lp_lincomb(V, n, b[1], 3, (const double[]){b[7], b[5], b[3]}, (const double *const[]){A6, A4, A2});
    scipy_cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, A6, n, W, n, 1.0, V, n);
    scipy_cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, a, n, V, n, 0.0, U, n);
    /* V = A6 (b12 A6 + b10 A4 + b8 A2) + b6 A6 + b4 A4 + b2 A2 + b0 I */
    lp_lincomb(W, n, 0.0, 3, (const double[]){b[12], b[10], b[8]}, (const double *const[]){A6, A4, A2});
    lp_lincomb(V, n, b[0], 3, (const double[]){b[6], b[4], b[2]}, (const double *const[]){A6, A4, A2});
    scipy_cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, A6, n, W, n, 1.0, V, n);
    /* (V - U) R = V + U */
    for (int64_t i = 0; i < nn; i++) {
        double u = U[i], v = V[i];
        W[i] = v - u;
        e[i] = v + u;
    }
    lp_getrf(FL_FLOAT64, n, n, W, n, ip);
    lp_getrs(FL_FLOAT64, 'N', n, n, W, n, ip, e, n);
    for (int k = 0; k < s; k++) {
        scipy_cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, e, n, e, n, 0.0, W, n);
        memcpy(e, W, (size_t)nn * sizeof(double));
    }
}

/* aten::linalg_matrix_exp(Tensor self) -> Tensor */
static int k_matrix_exp(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *A = &in[0], *E = &out[0];
    int dt = lp_dtype(A);
    if (n_in < 1 || n_out < 1 || dt < 0) return FL_ERR_UNSUPPORTED;
    int64_t n = LP_ROWS(A);
    if (LP_COLS(A) != n) FL_FAIL(FL_ERR_INVALID, "linalg.matrix_exp: A must be batches of square matrices");
    if (lp_dims_ok("linalg_matrix_exp", n, n)) return FL_ERR_INVALID;
    if (n == 0) return FL_OK;
    lp_batch_t b;
    lp_batch(&b, A, 2);
    int64_t nn = n * n;
    double *a = malloc((size_t)nn * 8 * sizeof(double));
    int *ip = malloc((size_t)n * sizeof(int));
    int st = FL_OK;
    if (!a || !ip) { st = lp_oom("linalg_matrix_exp"); goto done; }
    double *e = a + nn, *t = a + 2 * nn;
    for (int64_t i = 0; i < b.count; i++) {
        int64_t off = lp_off(A, 2, &b, i), eo = lp_off(E, 2, &b, i);
        for (int64_t c = 0; c < n; c++)
            for (int64_t r = 0; r < n; r++) a[r + c * n] = lp_get(dt, A->data, off + r * LP_RS(A) + c * LP_CS(A));
        lp_expm1(a, e, (int)n, t, ip);
        for (int64_t c = 0; c < n; c++)
            for (int64_t r = 0; r < n; r++) lp_set(dt, E->data, eo + r * LP_RS(E) + c * LP_CS(E), e[r + c * n]);
    }
done:
    free(a);
    free(ip);
    return st;
}

/* aten::_linalg_check_errors is not a kernel: the runtime runs PyTorch's own check on a host copy
 * of the small info tensor (torch_fl/dispatch/decompositions/general.py), for PyTorch's exact messages. */

#define LP_F (FL_F32 | FL_F64)

static const fl_kernel_entry_t entries[] = {
    {"aten::linalg_lu_factor_ex", LP_F, 0, k_lu_factor_ex},
    {"aten::linalg_lu", LP_F, 0, k_linalg_lu},
    {"aten::lu_unpack", LP_F, 0, k_lu_unpack},
    {"aten::linalg_lu_solve", LP_F, 0, k_lu_solve},
    {"aten::_linalg_solve_ex", LP_F, 0, k_solve_ex},
    {"aten::linalg_inv_ex", LP_F, 0, k_inv_ex},
    {"aten::_linalg_det", LP_F, 0, k_det},
    {"aten::_linalg_slogdet", LP_F, 0, k_slogdet},
    {"aten::linalg_cholesky_ex", LP_F, 0, k_cholesky_ex},
    {"aten::cholesky", LP_F, 0, k_cholesky},
    {"aten::cholesky_solve", LP_F, 0, k_cholesky_solve},
    {"aten::cholesky_inverse", LP_F, 0, k_cholesky_inverse},
    {"aten::_linalg_eigh", LP_F, 0, k_eigh},
    {"aten::_linalg_svd", LP_F, 0, k_svd},
    {"aten::linalg_pinv.atol_rtol_tensor", LP_F, 0, k_pinv},
    {"aten::linalg_qr", LP_F, 0, k_qr},
    {"aten::linalg_householder_product", LP_F, 0, k_householder},
    {"aten::ormqr", LP_F, 0, k_ormqr},
    {"aten::linalg_solve_triangular", LP_F, 0, k_solve_triangular},
    {"aten::triangular_solve", LP_F, 0, k_triangular_solve},
    {"aten::linalg_ldl_factor_ex", LP_F, 0, k_ldl_factor_ex},
    {"aten::linalg_ldl_solve", LP_F, 0, k_ldl_solve},
    {"aten::linalg_matrix_exp", LP_F, 0, k_matrix_exp},
};

const fl_kernel_group_t fl_host_group_lapack = {entries, (int)(sizeof entries / sizeof entries[0])};
