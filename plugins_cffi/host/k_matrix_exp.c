/* Host kernels: linalg_matrix_exp, Pade 13 with scaling and squaring (Higham 2005).
 * Shared helpers and LAPACK wrappers: k_lapack.h. */
#include "k_lapack.h"

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

/* ======================================================================
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::linalg_matrix_exp", LP_F, 0, k_matrix_exp},
};

const fl_kernel_group_t fl_host_group_matrix_exp = {entries, (int)(sizeof entries / sizeof entries[0])};
