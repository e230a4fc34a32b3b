/* rocm: an AMD Instinct-class GPU, emulated. Broad native coverage (every
 * host kernel, backward ops included) in fp32/fp64/fp16/bf16, fp16 autocast
 * declared stable, a fused flash-style attention kernel (also with dropout),
 * GEMM epilogue kernels (bias + ReLU/GELU (+ dropout), as hipBLASLt's; bias +
 * dropout + residual add + LayerNorm, as MIOpen's AddLayerNorm), two devices, and
 * collectives between local processes over POSIX shared memory (comm_shm.c). */
#include "../emu.h"

static const fl_kernel_group_t *const fused[] = {&fl_emu_group_attention, &fl_emu_group_attention_dropout,
                                                 &fl_emu_group_linear_act, &fl_emu_group_add_layer_norm, NULL};

const fl_emu_profile_t fl_emu_profile = {
    .name = "rocm",
    .vendor = "torch_fl (emulator)",
    .description = "emulated AMD Instinct-class GPU (host CPU computes; device memory kept apart, copies explicit)",
    .device_name = "AMD Instinct-class GPU",
    .env_prefix = "ROCM",
    .default_memory = 16ull << 30,
    .default_devices = 2,
    .dtypes = FL_ALL_DTYPES | FL_COMPLEX,
    .features = FL_FEATURE_FP16_STABLE | FL_FEATURE_COLLECTIVES | FL_FEATURE_ASYNC_COPY,
    .compute_units = 304,
    .only = NULL,
    .without = NULL,
    .fused = fused,
    .collectives = 1,
};
