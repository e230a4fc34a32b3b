/* Host kernels: the symmetric eigenproblem (syevd) and the SVD (gesdd): _linalg_eigh,
 * _linalg_svd, linalg_pinv.atol_rtol_tensor.
 * Shared helpers and LAPACK wrappers: k_lapack.h. */
#include "k_lapack.h"

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
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::_linalg_eigh", LP_F, 0, k_eigh},
    {"aten::_linalg_svd", LP_F, 0, k_svd},
    {"aten::linalg_pinv.atol_rtol_tensor", LP_F, 0, k_pinv},
};

const fl_kernel_group_t fl_host_group_eigh_svd = {entries, (int)(sizeof entries / sizeof entries[0])};
