/* Host kernels: reflection_pad{1,2,3}d and replication_pad{1,2,3}d, forward and backward.
 * Scratch I/O, argument helpers and the planes x (D, H, W) layout: k_nn.h. */
#include "k_nn.h"

/* ======================================================================
 * Padding: reflection_pad{1,2,3}d, replication_pad{1,2,3}d (+ backward)
 * ====================================================================== */

/* ATen's source index for output position j of one padded dim (negative pads crop) */
static int64_t pad_src(int reflect, int64_t j, int64_t size, int64_t pad) {
    int64_t i_start = pad < 0 ? -pad : 0, o_start = pad > 0 ? pad : 0, i;
    if (j < pad) i = reflect ? 2 * pad - j : pad;
    else if (j < size + pad) i = j;
    else i = reflect ? 2 * (size + pad - 1) - j : size + pad - 1;
    return i - o_start + i_start;
}

/* source index tables for the three dims (unit dims map to 0); NULL + message on a bad pad */
static int64_t *pad_tables(int reflect, int k, const fl_arg_t *pa, const vol_t *iv, const vol_t *ov) {
    int64_t pads[6] = {0};
    if (pa->kind != FL_ARG_INT_LIST || pa->len != 2 * k) {
        fl_host_set_error("padding: expected %d padding values", 2 * k);
        return NULL;
    }
    for (int i = 0; i < 2 * k; i++) pads[i] = pa->list[i];
    const int64_t isz[3] = {iv->D, iv->H, iv->W}, osz[3] = {ov->D, ov->H, ov->W};
    int64_t *tab = malloc((size_t)(osz[0] + osz[1] + osz[2] + 1) * sizeof(int64_t)), *t = tab;
    if (!tab) { fl_host_set_error("padding: cannot allocate scratch"); return NULL; }
    for (int d = 0; d < 3; d++) {
        int kd = 2 - d; /* pads list runs from the last dim: (left, right) of W, then H, then D */
        int64_t lo = kd < k ? pads[2 * kd] : 0, hi = kd < k ? pads[2 * kd + 1] : 0;
        if (osz[d] != isz[d] + lo + hi) {
            fl_host_set_error("%s: padding (%ld, %ld) does not fit an input dim of size %ld",
                              reflect ? "reflection_pad" : "replication_pad", (long)lo, (long)hi, (long)isz[d]);
            free(tab);
            return NULL;
        }
        for (int64_t j = 0; j < osz[d]; j++) {
            int64_t s = pad_src(reflect, j, isz[d], lo);
            if (s < 0 || s >= isz[d]) {
                fl_host_set_error("padding: source index %ld out of range for size %ld", (long)s, (long)isz[d]);
                free(tab);
                return NULL;
            }
            *t++ = s;
        }
    }
    return tab;
}

static int pad_run(int reflect, int k, int bwd, FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const char *what = reflect ? "reflection_pad" : "replication_pad";
    /* forward (self, padding) -> out; backward (grad_output, self, padding) -> grad_input */
    const fl_tensor_t *x = IN(0), *y = OUT(0);
    const fl_tensor_t *small = bwd ? y : x, *big = bwd ? x : y;
    vol_t iv, ov;
    if (!x || !y || !is_float(x->dtype) || y->dtype != x->dtype) return FL_ERR_UNSUPPORTED;
    if (!vol_of(small, k, 1, 2, &iv) || !vol_of(big, k, 1, 2, &ov) || !same_planes(small, big, k))
        FL_FAIL(FL_ERR_INVALID, "%s%dd: expected a %dD or %dD input", what, k, k + 1, k + 2);
    int64_t *tab = pad_tables(reflect, k, &args[bwd ? 2 : 1], &iv, &ov);
    if (!tab) return FL_ERR_INVALID;
    const int64_t *sd = tab, *sh = sd + ov.D, *sw = sh + ov.H;
    io_t io = {0};
    const double *src = io_in(&io, x, FL_FLOAT64);
    double *dst = io_out(&io, y, FL_FLOAT64, bwd);
    if (!src || !dst) { free(tab); IO_OOM(&io, what); }
    const int64_t IN_ = vol_n(&iv), ON = vol_n(&ov);
    if (!bwd) {
#pragma omp parallel for schedule(static) if (iv.planes * ON > PAR_MIN)
        for (int64_t p = 0; p < iv.planes; p++)
            for (int64_t od = 0; od < ov.D; od++)
                for (int64_t oh = 0; oh < ov.H; oh++) {
                    const double *row = src + p * IN_ + (sd[od] * iv.H + sh[oh]) * iv.W;
                    double *o = dst + p * ON + (od * ov.H + oh) * ov.W;
                    for (int64_t ow = 0; ow < ov.W; ow++) o[ow] = row[sw[ow]];
                }
    } else { /* src is grad_output (big), dst grad_input (small); one thread per plane */
#pragma omp parallel for schedule(static) if (iv.planes * ON > PAR_MIN)
        for (int64_t p = 0; p < iv.planes; p++)
            for (int64_t od = 0; od < ov.D; od++)
                for (int64_t oh = 0; oh < ov.H; oh++) {
                    double *row = dst + p * IN_ + (sd[od] * iv.H + sh[oh]) * iv.W;
                    const double *g = src + p * ON + (od * ov.H + oh) * ov.W;
                    for (int64_t ow = 0; ow < ov.W; ow++) row[sw[ow]] += g[ow];
                }
    }
    free(tab);
    return io_end(&io, FL_OK);
}

#define PAD_KERNELS(k)                                                                                  \
    static int k_reflection_pad##k(FL_KERNEL_ARGS) { return pad_run(1, k, 0, stream, device, in, n_in, out, n_out, args, n_args); } \
    static int k_reflection_pad##k##_bwd(FL_KERNEL_ARGS) { return pad_run(1, k, 1, stream, device, in, n_in, out, n_out, args, n_args); } \
    static int k_replication_pad##k(FL_KERNEL_ARGS) { return pad_run(0, k, 0, stream, device, in, n_in, out, n_out, args, n_args); } \
    static int k_replication_pad##k##_bwd(FL_KERNEL_ARGS) { return pad_run(0, k, 1, stream, device, in, n_in, out, n_out, args, n_args); }
PAD_KERNELS(1)
PAD_KERNELS(2)
PAD_KERNELS(3)

/* ======================================================================
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::reflection_pad1d", FL_FLOATS, 0, k_reflection_pad1},
    {"aten::reflection_pad2d", FL_FLOATS, 0, k_reflection_pad2},
    {"aten::reflection_pad3d", FL_FLOATS, 0, k_reflection_pad3},
    {"aten::reflection_pad1d_backward", FL_FLOATS, 0, k_reflection_pad1_bwd},
    {"aten::reflection_pad2d_backward", FL_FLOATS, 0, k_reflection_pad2_bwd},
    {"aten::reflection_pad3d_backward", FL_FLOATS, 0, k_reflection_pad3_bwd},
    {"aten::replication_pad1d", FL_FLOATS, 0, k_replication_pad1},
    {"aten::replication_pad2d", FL_FLOATS, 0, k_replication_pad2},
    {"aten::replication_pad3d", FL_FLOATS, 0, k_replication_pad3},
    {"aten::replication_pad1d_backward", FL_FLOATS, 0, k_replication_pad1_bwd},
    {"aten::replication_pad2d_backward", FL_FLOATS, 0, k_replication_pad2_bwd},
    {"aten::replication_pad3d_backward", FL_FLOATS, 0, k_replication_pad3_bwd},
};

const fl_kernel_group_t fl_host_group_pad = {entries, (int)(sizeof entries / sizeof entries[0])};
