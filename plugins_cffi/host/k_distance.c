/* Host kernels: pairwise distances -- _pdist_forward/_backward, _cdist_forward/_backward.
 * Scratch I/O, argument helpers and the planes x (D, H, W) layout: k_nn.h. */
#include "k_nn.h"

/* ======================================================================
 * Pairwise distances: _pdist_forward / _pdist_backward, _cdist_forward /
 * _cdist_backward (ATen's Distance kernels: p = 0, 1, 2, inf and general p)
 * ====================================================================== */

static double dist_row(const double *a, const double *b, int64_t m, double p) {
    double s = 0.0;
    if (p == 0.0) { for (int64_t i = 0; i < m; i++) s += a[i] != b[i]; return s; }
    if (isinf(p)) { for (int64_t i = 0; i < m; i++) { double d = fabs(a[i] - b[i]); s = (d > s || isnan(d)) ? d : s; } return s; }
    if (p == 1.0) { for (int64_t i = 0; i < m; i++) s += fabs(a[i] - b[i]); return s; }
    if (p == 2.0) { for (int64_t i = 0; i < m; i++) { double d = a[i] - b[i]; s += d * d; } return sqrt(s); }
    for (int64_t i = 0; i < m; i++) s += pow(fabs(a[i] - b[i]), p);
    return pow(s, 1.0 / p);
}
static inline double sgn(double v) { return (double)((v > 0) - (v < 0)); }
/* d dist / d a_i times the incoming gradient g, for diff = a_i - b_i */
static inline double dist_grad(double diff, double g, double dist, double p) {
    if (p == 0.0) return 0.0;
    if (p == 1.0) return g * sgn(diff);
    if (isinf(p)) return g * sgn(diff) * (fabs(diff) == dist ? 1.0 : 0.0);
    if (p == 2.0) return dist == 0.0 ? 0.0 : g * diff / dist;
    if (p < 2.0) return (dist == 0.0 || (diff == 0.0 && p < 1.0)) ? 0.0
                        : sgn(diff) * pow(fabs(diff), p - 1.0) * g / pow(dist, p - 1.0);
    return dist == 0.0 ? 0.0 : diff * pow(fabs(diff), p - 2.0) * g / pow(dist, p - 1.0);
}

/* _pdist_forward(self, p=2) / _pdist_backward(grad, self, p, pdist) */
static int pdist_run(int bwd, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = IN(bwd ? 1 : 0), *g = bwd ? IN(0) : NULL, *dst = bwd ? IN(3) : NULL, *y = OUT(0);
    double p;
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype || (bwd && (!g || !dst)) || n_args < (bwd ? 3 : 2) ||
        !p_arg(&args[bwd ? 2 : 1], &p))
        return FL_ERR_UNSUPPORTED;
    if (x->ndim != 2) FL_FAIL(FL_ERR_INVALID, "pdist only supports 2D tensors, got: %dD", x->ndim);
    if (!(p >= 0.0)) FL_FAIL(FL_ERR_INVALID, "pdist only supports non-negative p values");
    const int64_t N = x->sizes[0], M = x->sizes[1], P = N * (N - 1) / 2;
    if ((!bwd && fl_numel(y) != P) || (bwd && (fl_numel(g) != P || fl_numel(dst) != P || fl_numel(y) != N * M)))
        FL_FAIL(FL_ERR_INVALID, "pdist: expected %ld pair distances", (long)P);
    io_t io = {0};
    const double *xp = io_in(&io, x, FL_FLOAT64);
    const double *gp = bwd ? io_in(&io, g, FL_FLOAT64) : NULL, *dp = bwd ? io_in(&io, dst, FL_FLOAT64) : NULL;
    double *yp = io_out(&io, y, FL_FLOAT64, bwd);
    if (!xp || !yp || (bwd && (!gp || !dp))) IO_OOM(&io, "pdist");
    const int single = single_of(x->dtype); /* differences in the input's precision: p = inf compares |diff| == dist */
    if (!bwd) {
#pragma omp parallel for schedule(dynamic, 16) if (P * M > PAR_MIN)
        for (int64_t i = 0; i < N; i++) {
            int64_t k = i * N - i * (i + 1) / 2; /* pairs (i, j > i) are numbered row by row */
            for (int64_t j = i + 1; j < N; j++) yp[k++] = dist_row(xp + i * M, xp + j * M, M, p);
        }
    } else { /* row i gathers from every pair it belongs to: no two threads write one row */
#pragma omp parallel for schedule(dynamic, 16) if (N * N * M > PAR_MIN)
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < N; j++) {
                if (j == i) continue;
                int64_t a = i < j ? i : j, b = i < j ? j : i, k = a * N - a * (a + 1) / 2 + (b - a - 1);
                for (int64_t m = 0; m < M; m++)
                    yp[i * M + m] += dist_grad(rnd(single, xp[i * M + m] - xp[j * M + m]), gp[k], dp[k], p);
            }
    }
    return io_end(&io, FL_OK);
}
static int k_pdist(FL_KERNEL_ARGS) { return pdist_run(0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_pdist_bwd(FL_KERNEL_ARGS) { return pdist_run(1, stream, device, in, n_in, out, n_out, args, n_args); }

/* _cdist_forward(x1, x2, p, compute_mode) -> (..., P, R); _cdist_backward(grad, x1, x2, p, cdist) -> grad_x1.
 * Batch dims must already agree (the composite cdist expands them). */
static int cdist_run(int bwd, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const int a = bwd ? 1 : 0;
    const fl_tensor_t *x1 = IN(a), *x2 = IN(a + 1), *g = bwd ? IN(0) : NULL, *dst = bwd ? IN(4) : NULL, *y = OUT(0);
    double p;
    if (!x1 || !x2 || !y || !is_float(x1->dtype) || x2->dtype != x1->dtype || y->dtype != x1->dtype ||
        (bwd && (!g || !dst)) || n_args < a + 3 || !p_arg(&args[a + 2], &p))
        return FL_ERR_UNSUPPORTED;
    if (x1->ndim < 2 || x2->ndim != x1->ndim) FL_FAIL(FL_ERR_INVALID, "cdist only supports at least 2D tensors, got: %dD", x1->ndim);
    if (!(p >= 0.0)) FL_FAIL(FL_ERR_INVALID, "cdist only supports non-negative p values");
    const int nd = x1->ndim;
    int64_t B = 1;
    for (int d = 0; d < nd - 2; d++) {
        if (x1->sizes[d] != x2->sizes[d]) return FL_ERR_UNSUPPORTED;
        B *= x1->sizes[d];
    }
    const int64_t P = x1->sizes[nd - 2], R = x2->sizes[nd - 2], M = x1->sizes[nd - 1];
    if (x2->sizes[nd - 1] != M)
        FL_FAIL(FL_ERR_INVALID, "X1 and X2 must have the same number of columns. X1: %ld X2: %ld", (long)M,
                (long)x2->sizes[nd - 1]);
    if ((!bwd && fl_numel(y) != B * P * R) || (bwd && (fl_numel(g) != B * P * R || fl_numel(dst) != B * P * R)))
        FL_FAIL(FL_ERR_INVALID, "cdist: output shape does not match the inputs");
    io_t io = {0};
    const double *ap = io_in(&io, x1, FL_FLOAT64), *bp = io_in(&io, x2, FL_FLOAT64);
    const double *gp = bwd ? io_in(&io, g, FL_FLOAT64) : NULL, *dp = bwd ? io_in(&io, dst, FL_FLOAT64) : NULL;
    double *yp = io_out(&io, y, FL_FLOAT64, bwd);
    if (!ap || !bp || !yp || (bwd && (!gp || !dp))) IO_OOM(&io, "cdist");
    const int single = single_of(x1->dtype);
#pragma omp parallel for schedule(static) collapse(2) if (B * P * R * M > PAR_MIN)
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < P; i++) {
            const double *u = ap + (b * P + i) * M;
            for (int64_t j = 0; j < R; j++) {
                const double *v = bp + (b * R + j) * M;
                int64_t k = (b * P + i) * R + j;
                if (!bwd) { yp[k] = dist_row(u, v, M, p); continue; }
                for (int64_t m = 0; m < M; m++) yp[(b * P + i) * M + m] += dist_grad(rnd(single, u[m] - v[m]), gp[k], dp[k], p);
            }
        }
    return io_end(&io, FL_OK);
}
static int k_cdist(FL_KERNEL_ARGS) { return cdist_run(0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_cdist_bwd(FL_KERNEL_ARGS) { return cdist_run(1, stream, device, in, n_in, out, n_out, args, n_args); }

/* ======================================================================
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::_pdist_forward", F3264, 0, k_pdist},
    {"aten::_pdist_backward", F3264, 0, k_pdist_bwd},
    {"aten::_cdist_forward", F3264, 0, k_cdist},
    {"aten::_cdist_backward", F3264, 0, k_cdist_bwd},
};

const fl_kernel_group_t fl_host_group_distance = {entries, (int)(sizeof entries / sizeof entries[0])};
