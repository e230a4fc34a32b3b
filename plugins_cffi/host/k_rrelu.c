/* Host kernels: rrelu_with_noise, the randomized leaky ReLU.
 * Scratch I/O, argument helpers and the planes x (D, H, W) layout: k_nn.h. */
#include "k_nn.h"

/* ======================================================================
 * rrelu_with_noise(self, noise(b!), lower, upper, training, generator).
 * Training: negative (and zero) inputs get a slope drawn uniformly from
 * [lower, upper], recorded in noise (1 elsewhere); eval: leaky_relu with
 * slope (lower + upper) / 2, noise untouched. The draws come from this
 * device's counter-based generator, so they are not CPU's numbers.
 * ====================================================================== */
static int k_rrelu_with_noise(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *x = IN(0), *noise = IN(1), *y = OUT(0);
    if (!x || !noise || !y || !is_float(x->dtype) || y->dtype != x->dtype || noise->dtype != x->dtype || n_args < 5)
        return FL_ERR_UNSUPPORTED;
    double lo, hi;
    if (!p_arg(&args[2], &lo) || !p_arg(&args[3], &hi)) return FL_ERR_UNSUPPORTED;
    int training = args[4].i != 0;
    if (x->ndim != y->ndim || fl_numel(x) != fl_numel(y)) return FL_ERR_UNSUPPORTED;
    if (training && (noise->ndim != x->ndim || fl_numel(noise) != fl_numel(x)))
        FL_FAIL(FL_ERR_INVALID, "rrelu_with_noise: noise must have the shape of the input");
    if (training && lo > hi)
        FL_FAIL(FL_ERR_INVALID, "Lower bound should be less than or equal to the upper bound");
    int64_t n = fl_numel(x);
    if (n == 0) return FL_OK;
    uint64_t seed = 0, start = training ? fl_host_rng_reserve(device, (uint64_t)n, &seed) : 0;
    const double slope = (lo + hi) / 2;
    fl_tensor_t nz = training ? *noise : *x; /* (eval: a stand-in the loop never writes) */
    for (int d = 0; d < nz.ndim && training; d++)
        if (nz.sizes[d] != x->sizes[d]) return FL_ERR_UNSUPPORTED;
    fl_iter_t it;
    fl_iter_init(&it, 3, (const fl_tensor_t *[]){y, x, &nz});
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t b[FL_ITER_MAX];
        fl_iter_row(&it, r, b);
        for (int64_t i = 0; i < it.inner; i++) {
            double v = fl_load_f64(x->dtype, fl_elem(x, b[1] + i * it.inner_stride[1])), o;
            if (training) {
                double k = 1.0;
                if (v <= 0.0) {
                    /* the slope in the input's precision, as CPU stores it in noise */
                    k = lo + (hi - lo) * fl_rand_uniform(seed, start + (uint64_t)(r * it.inner + i));
                    fl_store_f64(nz.dtype, fl_elem(&nz, b[2] + i * it.inner_stride[2]), k);
                    k = fl_load_f64(nz.dtype, fl_elem(&nz, b[2] + i * it.inner_stride[2]));
                } else {
                    fl_store_f64(nz.dtype, fl_elem(&nz, b[2] + i * it.inner_stride[2]), 1.0);
                }
                o = v * k;
            } else {
                o = v > 0.0 ? v : v * slope;
            }
            fl_store_f64(y->dtype, fl_elem(y, b[0] + i * it.inner_stride[0]), o);
        }
    }
    return FL_OK;
}

/* ======================================================================
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::rrelu_with_noise", FL_FLOATS, 0, k_rrelu_with_noise},
};

const fl_kernel_group_t fl_host_group_rrelu = {entries, (int)(sizeof entries / sizeof entries[0])};
