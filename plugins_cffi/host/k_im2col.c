/* Host kernels: im2col and col2im (the sliding-window unfold and fold).
 * Scratch I/O, argument helpers and the planes x (D, H, W) layout: k_nn.h. */
#include "k_nn.h"

/* ======================================================================
 * im2col(self, kernel_size, dilation, padding, stride) -> (N, C*kh*kw, L)
 * col2im(self, output_size, kernel_size, dilation, padding, stride) -> (N, C, H, W)
 * ====================================================================== */
static int unfold_run(int fold, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const char *what = fold ? "col2im" : "im2col";
    const fl_tensor_t *x = IN(0), *y = OUT(0);
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *img = fold ? y : x, *col = fold ? x : y;
    int a = fold ? 2 : 1;
    int64_t kk[2], dl[2], pd[2], st[2];
    if (n_args < a + 4 || !ints_arg(&args[a], 2, NULL, kk) || !ints_arg(&args[a + 1], 2, NULL, dl) ||
        !ints_arg(&args[a + 2], 2, NULL, pd) || !ints_arg(&args[a + 3], 2, NULL, st))
        return FL_ERR_UNSUPPORTED;
    if (kk[0] < 1 || kk[1] < 1 || dl[0] < 1 || dl[1] < 1 || pd[0] < 0 || pd[1] < 0 || st[0] < 1 || st[1] < 1)
        FL_FAIL(FL_ERR_INVALID, "%s: kernel_size, dilation and stride must be positive, padding non-negative", what);
    if ((img->ndim != 3 && img->ndim != 4) || col->ndim != img->ndim - 1)
        FL_FAIL(FL_ERR_INVALID, "%s: expected a 3D or 4D image and a 2D or 3D column tensor", what);
    int64_t N = img->ndim == 4 ? img->sizes[0] : 1, C = img->sizes[img->ndim - 3];
    int64_t H = img->sizes[img->ndim - 2], W = img->sizes[img->ndim - 1];
    int64_t OH = (H + 2 * pd[0] - (dl[0] * (kk[0] - 1) + 1)) / st[0] + 1;
    int64_t OW = (W + 2 * pd[1] - (dl[1] * (kk[1] - 1) + 1)) / st[1] + 1;
    int64_t K = C * kk[0] * kk[1];
    if (OH < 1 || OW < 1 || col->sizes[col->ndim - 2] != K || col->sizes[col->ndim - 1] != OH * OW)
        FL_FAIL(FL_ERR_INVALID, "%s: expected %ld columns of %ld blocks (%ldx%ld), got %ldx%ld", what, (long)K,
                (long)(OH * OW), (long)OH, (long)OW, (long)col->sizes[col->ndim - 2], (long)col->sizes[col->ndim - 1]);
    io_t io = {0};
    const double *src = io_in(&io, x, FL_FLOAT64);
    double *dst = io_out(&io, y, FL_FLOAT64, fold);
    if (!src || !dst) IO_OOM(&io, what);
    const int64_t L = OH * OW;
#pragma omp parallel for schedule(static) collapse(2) if (N * K * L > PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) { /* one (sample, channel) per iteration: col2im never races */
            const int64_t ib = (n * C + c) * H * W;
            for (int64_t i = 0; i < kk[0]; i++)
                for (int64_t j = 0; j < kk[1]; j++) {
                    const int64_t cb = (n * K + (c * kk[0] + i) * kk[1] + j) * L;
                    for (int64_t oh = 0; oh < OH; oh++) {
                        int64_t h = oh * st[0] - pd[0] + i * dl[0];
                        for (int64_t ow = 0; ow < OW; ow++) {
                            int64_t w = ow * st[1] - pd[1] + j * dl[1];
                            int inside = h >= 0 && h < H && w >= 0 && w < W;
                            if (fold) { if (inside) dst[ib + h * W + w] += src[cb + oh * OW + ow]; }
                            else dst[cb + oh * OW + ow] = inside ? src[ib + h * W + w] : 0.0;
                        }
                    }
                }
        }
    return io_end(&io, FL_OK);
}
static int k_im2col(FL_KERNEL_ARGS) { return unfold_run(0, stream, device, in, n_in, out, n_out, args, n_args); }
static int k_col2im(FL_KERNEL_ARGS) { return unfold_run(1, stream, device, in, n_in, out, n_out, args, n_args); }

/* ======================================================================
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::im2col", FL_FLOATS, 0, k_im2col},
    {"aten::col2im", FL_FLOATS, 0, k_col2im},
};

const fl_kernel_group_t fl_host_group_im2col = {entries, (int)(sizeof entries / sizeof entries[0])};
