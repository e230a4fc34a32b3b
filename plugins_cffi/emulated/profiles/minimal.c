/* minimal: a brand-new chip, emulated. fp32 and bf16 (no fp16, no fp64) and
 * a few dozen primitive kernels; everything else takes a decomposition into
 * them, a JIT kernel, or the CPU fallback. This is the bring-up case the
 * adaptation layer exists for. */
#include "../emu.h"

static const char *const only[] = {
    "aten::add.Tensor", "aten::add_.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::mul_.Tensor",
    "aten::div.Tensor", "aten::neg", "aten::exp", "aten::log", "aten::sqrt", "aten::rsqrt", "aten::tanh",
    "aten::erf", "aten::abs", "aten::sigmoid", "aten::pow.Tensor_Scalar", "aten::maximum", "aten::minimum",
    "aten::where.self", "aten::eq.Tensor", "aten::gt.Scalar", "aten::lt.Scalar", "aten::sum.dim_IntList",
    "aten::amax", "aten::mm", "aten::bmm", "aten::fill_.Scalar", "aten::copy_", "aten::cat", "aten::uniform_",
    "aten::normal_", "aten::bernoulli_.float", "aten::arange.start_step", NULL,
};

const fl_emu_profile_t fl_emu_profile = {
    .name = "minimal",
    .vendor = "torch_fl (emulator)",
    .description = "emulated brand-new chip: 33 primitive kernels, fp32 and bf16 only (host CPU computes)",
    .device_name = "minimal bring-up chip",
    .env_prefix = "MINIMAL",
    .default_memory = 8ull << 30,
    .default_devices = 1,
    .dtypes = FL_F32 | FL_BF16 | FL_DTYPE_BIT(FL_INT64) | FL_DTYPE_BIT(FL_INT32) | FL_DTYPE_BIT(FL_BOOL),
    .features = 0,
    .compute_units = 8,
    .only = only,
    .without = NULL,
    .fused = NULL,
};
