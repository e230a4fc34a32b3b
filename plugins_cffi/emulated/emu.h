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
extern const fl_kernel_group_t fl_emu_group_conv2d_nhwc;   /* fused_conv.c: fl::conv2d_nhwc and its backward */
extern const fl_kernel_group_t fl_emu_group_attention;     /* fused_attention.c */
extern const fl_kernel_group_t fl_emu_group_attention_dropout; /* fused_attention.c: fl::attention_dropout */
extern const fl_kernel_group_t fl_emu_group_linear_act;    /* fused_linear.c: GEMM + bias + activation (+ dropout) */
extern const fl_kernel_group_t fl_emu_group_add_layer_norm; /* fused_linear.c: (GEMM +) dropout + residual + LayerNorm */

/* comm_shm.c: fills p->comm_* (call after p->device_count is set) */
void fl_emu_comm_install(fl_plugin_t *p);

#define FL_EMU_MAX_DEVICES 8

/* streams.c: real asynchronous streams, for profiles with FL_FEATURE_ASYNC_COPY and for the asynchronous
 * mode (async.c), where the NULL stream is each device's default stream */
typedef int (*fl_emu_job_fn)(void *arg); /* runs on a stream's worker; owns and frees arg */
int fl_emu_default_streams_start(int n_devices);
int fl_emu_submit(int device, fl_stream_t stream, fl_emu_job_fn job, void *arg, int wait);
int fl_emu_fill(int device, void *dst, int value, size_t n, fl_stream_t stream);
int fl_emu_copy_async_on(int device, void *dst, const void *src, size_t n, fl_stream_t stream);
int fl_emu_event_elapsed(int device, fl_event_t start, fl_event_t end, double *ms);
int fl_emu_stream_create(int device, fl_stream_t *out);
int fl_emu_stream_destroy(int device, fl_stream_t stream);
int fl_emu_stream_synchronize(int device, fl_stream_t stream);
int fl_emu_copy_async(int device, void *dst, const void *src, size_t n, fl_stream_t stream);
int fl_emu_event_create(int device, fl_event_t *out);
int fl_emu_event_destroy(int device, fl_event_t event);
int fl_emu_event_record(int device, fl_event_t event, fl_stream_t stream);
int fl_emu_event_synchronize(int device, fl_event_t event);
int fl_emu_event_query(int device, fl_event_t event, int *done);
int fl_emu_stream_wait_event(int device, fl_stream_t stream, fl_event_t event);
int fl_emu_synchronize_all(int device);

/* async.c: the asynchronous mode (FL_EMU_ASYNC=1). Kernels run on the device's default stream after their
 * call returns, and device memory is unreadable from the host: it lives in a shared-memory arena mapped
 * twice, PROT_NONE at the addresses the runtime gets and read-write at a second address only the
 * plugin's own workers use. */
int fl_emu_async_configure(int n_devices, uint64_t mem_limit); /* reads FL_EMU_ASYNC; 1 when on */
int fl_emu_async_on(void);
int fl_emu_far_alloc(int device, size_t nbytes, void **ptr);
int fl_emu_far_free(int device, void *ptr, size_t *nbytes); /* queued after the work before it */
void *fl_emu_far_host(const void *device_ptr);     /* the plugin-side address of device memory */
fl_kernel_fn fl_emu_async_wrap(const char *op, fl_kernel_fn fn); /* NULL when no launch slot is left */
void fl_emu_async_wrap_comm(fl_plugin_t *p);

#endif
