/* Host kernels: solves with triangular factors: triangular systems (cblas trsm:
 * linalg_solve_triangular, triangular_solve) and LDL^T (sytrf/sytrs:
 * linalg_ldl_factor_ex, linalg_ldl_solve).
 * Shared helpers and LAPACK wrappers: k_lapack.h. */
#include "k_lapack.h"

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
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::linalg_solve_triangular", LP_F, 0, k_solve_triangular},
    {"aten::triangular_solve", LP_F, 0, k_triangular_solve},
    {"aten::linalg_ldl_factor_ex", LP_F, 0, k_ldl_factor_ex},
    {"aten::linalg_ldl_solve", LP_F, 0, k_ldl_solve},
};

const fl_kernel_group_t fl_host_group_triangular = {entries, (int)(sizeof entries / sizeof entries[0])};
