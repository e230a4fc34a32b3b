/* rocm: an AMD Instinct-class GPU, emulated. Broad native coverage (every
 * host kernel, backward ops included) in fp32/fp64/fp16/bf16, fp16 autocast
 * declared stable, a fused flash-style attention kernel, two devices, and
 * collectives between local processes over POSIX shared memory (comm_shm.c). */
#include "../emu.h"

static const fl_kernel_group_t *const fused[] = {&fl_emu_group_attention, NULL};

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
