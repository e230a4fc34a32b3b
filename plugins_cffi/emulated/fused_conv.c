/* fl::conv_bn_relu — convolution, inference batch norm and ReLU in one kernel.
 *
 * Schema (registered by torch_fl/fused/conv_bn.py):
 *   fl::conv_bn_relu(Tensor input, Tensor weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias,
 *                    Tensor running_mean, Tensor running_var, float eps, int[] stride, int[] padding,
 *                    int[] dilation, int groups) -> Tensor
 * The convolution writes the output once; the normalisation and the ReLU are
 * applied per channel in the same pass over it, so the two intermediate
 * tensors (and two kernel launches) of conv -> bn -> relu never exist.
 * The output may be NCHW or channels-last (FL_KERNEL_ANY_OUT_LAYOUT): the host
 * convolution writes either layout directly. */
#include "emu.h"
#include "k_linalg.h"

static double at(const fl_tensor_t *t, int64_t i) {
    if (t->dtype == FL_FLOAT32) return ((const float *)t->data)[t->offset + i * t->strides[0]];
    return ((const double *)t->data)[t->offset + i * t->strides[0]];
}

static int conv_bn_relu(FL_KERNEL_ARGS) {
    if (n_args < 12 || n_out < 1) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in), *w = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *b = fl_arg_tensor(args, n_args, 2, in, n_in), *g = fl_arg_tensor(args, n_args, 3, in, n_in);
    const fl_tensor_t *beta = fl_arg_tensor(args, n_args, 4, in, n_in), *mean = fl_arg_tensor(args, n_args, 5, in, n_in);
    const fl_tensor_t *var = fl_arg_tensor(args, n_args, 6, in, n_in), *y = &out[0];
    if (!x || !w || !mean || !var || args[7].kind != FL_ARG_FLOAT) return FL_ERR_UNSUPPORTED;
    int dt = x->dtype;
    if (dt != FL_FLOAT32 && dt != FL_FLOAT64) return FL_ERR_UNSUPPORTED;
    const fl_tensor_t *per_channel[4] = {g, beta, mean, var};
    int64_t C = y->ndim >= 2 ? y->sizes[1] : -1;
    for (int k = 0; k < 4; k++) {
        const fl_tensor_t *t = per_channel[k];
        if (t && (t->dtype != dt || t->ndim != 1 || t->sizes[0] != C)) return FL_ERR_UNSUPPORTED;
    }
    /* the epilogue walks the output as (N, C, P) or, channels-last, as (N*P, C): it must be one of the two */
    int nhwc = !fl_is_contiguous(y);
    if (nhwc && !fl_is_channels_last(y)) return FL_ERR_UNSUPPORTED;
    /* convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups) */
    fl_tensor_t cin[3] = {*x, *w};
    fl_arg_t cargs[9];
    memset(cargs, 0, sizeof cargs);
    cargs[0].kind = FL_ARG_TENSOR; cargs[0].i = 0;
    cargs[1].kind = FL_ARG_TENSOR; cargs[1].i = 1;
    int nc = 2;
    if (b) { cin[2] = *b; cargs[2].kind = FL_ARG_TENSOR; cargs[2].i = 2; nc = 3; }
    else cargs[2].kind = FL_ARG_NONE;
    cargs[3] = args[8]; cargs[4] = args[9]; cargs[5] = args[10];
    cargs[6].kind = FL_ARG_BOOL; cargs[6].i = 0;
    cargs[7].kind = FL_ARG_INT_LIST; cargs[7].len = x->ndim - 2;
    cargs[8] = args[11];
    int st = fl_lin_convolution(stream, device, cin, nc, y, 1, cargs, 9);
    if (st) return st;
    int64_t N = y->sizes[0], P = 1;
    for (int d = 2; d < y->ndim; d++) P *= y->sizes[d];
    double eps = args[7].f, *sc = malloc((size_t)(2 * C + 1) * sizeof(double)), *sh = sc + C;
    if (!sc) FL_FAIL(FL_ERR_OOM, "conv_bn_relu: cannot allocate scratch");
    for (int64_t c = 0; c < C; c++) {
        double s = 1.0 / sqrt(at(var, c) + eps), shift = -at(mean, c) * s;
        if (g) { s *= at(g, c); shift *= at(g, c); }
        if (beta) shift += at(beta, c);
        sc[c] = s; sh[c] = shift;
    }
    /* rows of P (NCHW: one per sample and channel) or rows of C (NHWC: one per pixel) */
    int64_t rows = nhwc ? N * P : N * C, len = nhwc ? C : P;
#pragma omp parallel for schedule(static) if (N * C * P > 32768)
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = y->offset + r * len;
        if (dt == FL_FLOAT32) {
            float *p = (float *)y->data + base;
            if (nhwc)
                for (int64_t c = 0; c < C; c++) { float v = p[c] * (float)sc[c] + (float)sh[c]; p[c] = v > 0.0f ? v : 0.0f; }
            else {
                float fs = (float)sc[r % C], fh = (float)sh[r % C];
                for (int64_t i = 0; i < P; i++) { float v = p[i] * fs + fh; p[i] = v > 0.0f ? v : 0.0f; }
            }
        } else {
            double *p = (double *)y->data + base;
            if (nhwc)
                for (int64_t c = 0; c < C; c++) { double v = p[c] * sc[c] + sh[c]; p[c] = v > 0.0 ? v : 0.0; }
            else
                for (int64_t i = 0; i < P; i++) { double v = p[i] * sc[r % C] + sh[r % C]; p[i] = v > 0.0 ? v : 0.0; }
        }
    }
    free(sc);
    return FL_OK;
}

/* fl::conv2d_nhwc(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, int[2] dilation,
 *                 int groups) -> Tensor  (registered by torch_fl/fused/conv_nhwc.py)
 * A 2-D convolution into the channels-last output the runtime allocates (the op's fake implementation gives
 * it). The host convolution reads the weight through its strides, so an NCHW weight needs no converting copy
 * first (the op's decomposition elsewhere makes one). The tensor arguments sit where aten::convolution's do. */
static int conv2d_nhwc(FL_KERNEL_ARGS) {
    if (n_args < 7 || n_out < 1 || !fl_is_channels_last(&out[0])) return FL_ERR_UNSUPPORTED;
    fl_arg_t cargs[9];
    memset(cargs, 0, sizeof cargs);
    for (int k = 0; k < 6; k++) cargs[k] = args[k];  /* input, weight, bias?, stride, padding, dilation */
    cargs[6].kind = FL_ARG_BOOL; cargs[6].i = 0;    /* transposed */
    cargs[7].kind = FL_ARG_INT_LIST; cargs[7].len = 2; /* output_padding: unused when not transposed */
    cargs[8] = args[6];                             /* groups */
    return fl_lin_convolution(stream, device, in, n_in, out, n_out, cargs, 9);
}

/* fl::conv2d_nhwc_backward(Tensor grad, Tensor input, Tensor weight, int[]? bias_sizes, int[2] stride,
 *                          int[2] padding, int[2] dilation, int groups, bool[3] output_mask)
 *                          -> (Tensor, Tensor, Tensor)
 * aten::convolution_backward's kernel, writing the input gradient into its channels-last output; an output
 * the mask leaves out is an empty tensor the kernel does not touch. */
static int conv2d_nhwc_backward(FL_KERNEL_ARGS) {
    if (n_args < 9 || n_out < 3) return FL_ERR_UNSUPPORTED;
    fl_arg_t cargs[11];
    memset(cargs, 0, sizeof cargs);
    for (int k = 0; k < 7; k++) cargs[k] = args[k];  /* grad, input, weight, bias_sizes?, stride, padding, dilation */
    cargs[7].kind = FL_ARG_BOOL; cargs[7].i = 0;     /* transposed */
    cargs[8].kind = FL_ARG_INT_LIST; cargs[8].len = 2; /* output_padding */
    cargs[9] = args[7];                              /* groups */
    cargs[10] = args[8];                             /* output_mask */
    return fl_lin_convolution_backward(stream, device, in, n_in, out, n_out, cargs, 11);
}

static const fl_kernel_entry_t entries[] = {
    {"fl::conv_bn_relu", FL_F32 | FL_F64, FL_KERNEL_FUSED | FL_KERNEL_ANY_OUT_LAYOUT, conv_bn_relu},
};
static const fl_kernel_entry_t nhwc_entries[] = {
    {"fl::conv2d_nhwc", FL_F32 | FL_F64, FL_KERNEL_FUSED, conv2d_nhwc},
    {"fl::conv2d_nhwc_backward", FL_F32 | FL_F64, FL_KERNEL_FUSED, conv2d_nhwc_backward},
};
const fl_kernel_group_t fl_emu_group_conv2d_nhwc = {nhwc_entries, (int)(sizeof nhwc_entries / sizeof nhwc_entries[0])};
const fl_kernel_group_t fl_emu_group_conv_bn_relu = {entries, (int)(sizeof entries / sizeof entries[0])};
