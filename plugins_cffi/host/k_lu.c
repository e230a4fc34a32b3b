/* Host kernels: LU factorisation (getrf/getrs): linalg_lu_factor_ex, linalg_lu, lu_unpack,
 * linalg_lu_solve, _linalg_solve_ex, linalg_inv_ex, _linalg_det, _linalg_slogdet.
 * Shared helpers and LAPACK wrappers: k_lapack.h. */
#include "k_lapack.h"

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
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::linalg_lu_factor_ex", LP_F, 0, k_lu_factor_ex},
    {"aten::linalg_lu", LP_F, 0, k_linalg_lu},
    {"aten::lu_unpack", LP_F, 0, k_lu_unpack},
    {"aten::linalg_lu_solve", LP_F, 0, k_lu_solve},
    {"aten::_linalg_solve_ex", LP_F, 0, k_solve_ex},
    {"aten::linalg_inv_ex", LP_F, 0, k_inv_ex},
    {"aten::_linalg_det", LP_F, 0, k_det},
    {"aten::_linalg_slogdet", LP_F, 0, k_slogdet},
};

const fl_kernel_group_t fl_host_group_lu = {entries, (int)(sizeof entries / sizeof entries[0])};
