/* The emulated device classes: one runtime (device.c) and a profile per
 * device class (profiles/<name>.c). An emulator computes with the host
 * kernels, but behaves like the device it emulates where torch_fl can tell
 * the difference: its memory is not host-accessible (the runtime must use the
 * copy entry points, and every copy is counted), it has its own memory limit,
 * device count, dtypes, kernel coverage and fused kernels, and it says it is
 * an emulator (emulated = 1, and its description). */
#ifndef FL_EMU_H
#define FL_EMU_H

#include "fl_host.h"

typedef struct {
    const char *name;          /* backend name: "rocm", "ascend", "minimal" */
    const char *vendor;
    const char *description;   /* one line: what device class this emulates */
    const char *device_name;   /* per-device name prefix */
    const char *env_prefix;    /* FL_<PREFIX>_MEMORY_LIMIT, FL_<PREFIX>_DEVICES */
    uint64_t default_memory;   /* bytes per device */
    int default_devices;
    uint32_t dtypes;           /* dtypes the device computes in */
    uint32_t features;         /* FL_FEATURE_*; never HOST_ACCESSIBLE */
    int compute_units;
    const char *const *only;   /* NULL-terminated allow-list of host kernels, or NULL for all */
    const char *const *without;/* NULL-terminated host kernels left out, or NULL */
    const fl_kernel_group_t *const *fused; /* NULL-terminated fused kernel groups */
    int collectives;           /* 1: real inter-process collectives over POSIX shared memory
                                  (comm_shm.c); 0: comm_* entry points NULL (the runtime relays
                                  through the host) */
} fl_emu_profile_t;

extern const fl_emu_profile_t fl_emu_profile;

/* fused kernel groups (fused_*.c) */
extern const fl_kernel_group_t fl_emu_group_conv_bn_relu;  /* fused_conv.c */
extern const fl_kernel_group_t fl_emu_group_attention;     /* fused_attention.c */
extern const fl_kernel_group_t fl_emu_group_attention_dropout; /* fused_attention.c: fl::attention_dropout */
extern const fl_kernel_group_t fl_emu_group_linear_act;    /* fused_linear.c: GEMM + bias + activation (+ dropout) */
extern const fl_kernel_group_t fl_emu_group_add_layer_norm; /* fused_linear.c: (GEMM +) dropout + residual + LayerNorm */

/* comm_shm.c: fills p->comm_* (call after p->device_count is set) */
void fl_emu_comm_install(fl_plugin_t *p);

/* streams.c: real asynchronous streams, for profiles with FL_FEATURE_ASYNC_COPY */
int fl_emu_stream_create(int device, fl_stream_t *out);
int fl_emu_stream_destroy(int device, fl_stream_t stream);
int fl_emu_stream_synchronize(int device, fl_stream_t stream);
int fl_emu_copy_async(int device, void *dst, const void *src, size_t n, fl_stream_t stream);
int fl_emu_event_create(int device, fl_event_t *out);
int fl_emu_event_destroy(int device, fl_event_t event);
int fl_emu_event_record(int device, fl_event_t event, fl_stream_t stream);
int fl_emu_event_synchronize(int device, fl_event_t event);
int fl_emu_event_query(int device, fl_event_t event, int *done);
int fl_emu_synchronize_all(int device);

#endif
