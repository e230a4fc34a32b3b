/* Host kernels: Cholesky (potrf/potrs/potri): linalg_cholesky_ex, cholesky, cholesky_solve,
 * cholesky_inverse.
 * Shared helpers and LAPACK wrappers: k_lapack.h. */
#include "k_lapack.h"

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
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::linalg_cholesky_ex", LP_F, 0, k_cholesky_ex},
    {"aten::cholesky", LP_F, 0, k_cholesky},
    {"aten::cholesky_solve", LP_F, 0, k_cholesky_solve},
    {"aten::cholesky_inverse", LP_F, 0, k_cholesky_inverse},
};

const fl_kernel_group_t fl_host_group_cholesky = {entries, (int)(sizeof entries / sizeof entries[0])};
