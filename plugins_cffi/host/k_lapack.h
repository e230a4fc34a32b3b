/* Internals shared by the host plugin's LAPACK kernel files. Not part of the ABI.
 *
 * The files: dense factorisations and solvers on float32/float64,
 * backed by the LAPACK that ships with scipy-openblas32 (the same routines
 * PyTorch's CPU kernels call, so results and sign conventions agree); each exports its own
 * kernel group, listed in common.c in this order:
 *   k_lu.c          LU        getrf/getrs        linalg_lu_factor_ex, linalg_lu, lu_unpack, linalg_lu_solve,
 *                                                 _linalg_solve_ex, linalg_inv_ex, _linalg_det, _linalg_slogdet
 *   k_cholesky.c    Cholesky  potrf/potrs/potri  linalg_cholesky_ex, cholesky, cholesky_solve, cholesky_inverse
 *   k_eigh_svd.c    eigen     syevd              _linalg_eigh
 *                   SVD       gesdd              _linalg_svd, linalg_pinv.atol_rtol_tensor (also via syevd)
 *   k_qr.c          QR        geqrf/orgqr/ormqr  linalg_qr, linalg_householder_product, ormqr (aten::geqrf
 *                                                 itself has no meta function, so the runtime could not size
 *                                                 its outputs)
 *   k_triangular.c  triangular (cblas trsm)      linalg_solve_triangular, triangular_solve
 *                   LDL       sytrf/sytrs        linalg_ldl_factor_ex, linalg_ldl_solve
 *   k_matrix_exp.c  linalg_matrix_exp: Pade 13 with scaling and squaring (Higham 2005), in double.
 *
 * Every op is batched over leading dimensions (broadcast where PyTorch
 * broadcasts). Each matrix is copied into a column-major scratch buffer, the
 * routine runs there, and results are written back through the output's own
 * strides (the runtime allocates outputs from PyTorch's meta functions, which
 * are often column-major). Workspace sizes come from LAPACK's lwork = -1 query
 * once per call, since every matrix of a batch has the same shape.
 * No OpenMP here: OpenBLAS decides its own threading inside LAPACK.
 * This header: the helpers (errors, element access, batches, strided matrix
 * copies) and the typed LAPACK wrappers every file uses. */
#ifndef FL_K_LAPACK_H
#define FL_K_LAPACK_H

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

/* aten::_linalg_check_errors is not a kernel: the runtime runs PyTorch's own check on a host copy
 * of the small info tensor (torch_fl/dispatch/decompositions/general.py), for PyTorch's exact messages. */

#define LP_F (FL_F32 | FL_F64)

#endif
