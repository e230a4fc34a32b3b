/* Host kernels: QR (geqrf/orgqr/ormqr): linalg_qr, linalg_householder_product, ormqr.
 * Shared helpers and LAPACK wrappers: k_lapack.h. */
#include "k_lapack.h"

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
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::linalg_qr", LP_F, 0, k_qr},
    {"aten::linalg_householder_product", LP_F, 0, k_householder},
    {"aten::ormqr", LP_F, 0, k_ormqr},
};

const fl_kernel_group_t fl_host_group_qr = {entries, (int)(sizeof entries / sizeof entries[0])};
