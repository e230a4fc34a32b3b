/* ascend: an NPU-class device, emulated. fp32/fp16/bf16 but no fp64; a
 * narrower native set (many backward and activation kernels missing, so
 * those ops take PyTorch's decompositions or the CPU fallback); a fused
 * Conv+BN+ReLU kernel; channels-last convolution kernels (fl::conv2d_nhwc
 * and its backward); no fused attention; prefers channels-last convolutions (declared for the device
 * class, so torch.compile's layout pass runs its graphs NHWC; the emulator's own host kernels compute
 * NHWC at about NCHW speed: docs/fusion.md). */
#include "../emu.h"

static const char *const without[] = {
    /* backward kernels a young NPU stack lacks: decompositions cover most */
    "aten::native_layer_norm_backward", "aten::gelu_backward", "aten::_softmax_backward_data",
    "aten::_log_softmax_backward_data", "aten::embedding_dense_backward", "aten::silu_backward",
    "aten::elu_backward", "aten::leaky_relu_backward", "aten::hardtanh_backward", "aten::sigmoid_backward",
    "aten::tanh_backward", "aten::native_group_norm_backward", "aten::_adaptive_avg_pool2d_backward",
    "aten::native_dropout_backward",
    /* no decomposition in PyTorch: these take the CPU fallback */
    "aten::max_pool2d_with_indices_backward", "aten::cumsum", "aten::cumsum_", "aten::nll_loss2d_forward",
    "aten::nll_loss2d_backward",
    /* forward ops served by decomposition */
    "aten::addmm", "aten::addmm_", "aten::gelu", "aten::gelu_", "aten::silu", "aten::silu_", "aten::elu",
    "aten::elu_", "aten::hardtanh", "aten::hardtanh_", "aten::linalg_vector_norm", "aten::std.correction",
    "aten::var.correction", "aten::std_mean.correction", "aten::logsumexp", "aten::baddbmm", "aten::addmv",
    "aten::native_group_norm", NULL,
};

static const fl_kernel_group_t *const fused[] = {&fl_emu_group_conv_bn_relu, &fl_emu_group_conv2d_nhwc, NULL};

const fl_emu_profile_t fl_emu_profile = {
    .name = "ascend",
    .vendor = "torch_fl (emulator)",
    .description = "emulated Ascend-class NPU (host CPU computes; no fp64; narrower kernel set; device memory kept apart)",
    .device_name = "Ascend-class NPU",
    .env_prefix = "ASCEND",
    .default_memory = 16ull << 30,
    .default_devices = 1,
    .dtypes = FL_F32 | FL_F16 | FL_BF16 | FL_INTS | FL_DTYPE_BIT(FL_BOOL) | FL_C64, /* complex64, not complex128 */
    .features = FL_FEATURE_FP16_STABLE | FL_FEATURE_CHANNELS_LAST,
    .compute_units = 32,
    .only = NULL,
    .without = without,
    .fused = fused,
};
