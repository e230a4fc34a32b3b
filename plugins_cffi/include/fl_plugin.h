/*
 * fl_plugin.h — the torch_fl plugin ABI.
 *
 * A vendor implements this one header in plain C and ships a shared library.
 * torch_fl loads it with cffi (ABI mode, dlopen), checks the ABI version, and
 * maps every PyTorch aten operator onto the plugin's kernel table; ops the
 * plugin lacks are served by decomposition, JIT or a CPU fallback.
 *
 * Rules that hold for every entry point:
 *   - Every function returns an fl_status_t. FL_OK is 0. On any other status
 *     the plugin must leave a human-readable message for fl_last_error().
 *   - No entry point may abort, exit, or longjmp: a plugin error must never
 *     take down the Python process.
 *   - Memory returned by malloc belongs to the runtime until it calls free.
 *   - Kernels never allocate their outputs: the runtime allocates every
 *     output (and every in-place target) before the call and passes it in.
 *
 * The exported symbols (looked up by name, reported by name when missing):
 *   int fl_plugin_abi_version(void);            the FL_ABI_VERSION the plugin was built against
 *   int fl_plugin_init(fl_plugin_t *out);       fills the table below
 *
 * Versions. torch_fl loads plugins of every version from FL_ABI_VERSION_MIN to
 * FL_ABI_VERSION. A new version only appends fields to fl_plugin_t; the
 * plugin sets struct_size to sizeof(fl_plugin_t) as it was compiled, and the
 * fields past it are NULL/0 to the runtime. So a plugin built against version
 * 1 loads unchanged: it simply has none of version 2's entry points.
 *   version 1: everything up to last_error.
 *   version 2: asynchronous devices (FL_FEATURE_ASYNC_KERNELS), event_elapsed,
 *              mem_set, pinned host memory (host_alloc/host_free), an async
 *              device-to-host copy (copy_d2h_async), a device JIT
 *              (jit_language, jit_build, jit_launch), device-side waits
 *              between streams (stream_wait_event).
 *
 * Ordering and copies (the copy contract, every version):
 *   - Work on one stream runs in the order it was issued; work on different
 *     streams is unordered unless the runtime orders it (an event and
 *     stream_wait_event, or a wait on the host). The NULL stream is the
 *     device's default stream. The runtime issues kernels, fills and copies
 *     to the calling thread's current stream (torch.fl.current_stream()),
 *     which is the NULL stream unless the user picked another
 *     (`with torch.fl.stream(s):`), as CUDA code does.
 *   - copy_h2d, copy_d2h and copy_d2d with stream == NULL run after all work
 *     issued earlier to the NULL stream and have completed when they return
 *     (they block the host): after copy_d2h returns, dst holds the bytes;
 *     after copy_h2d returns, src may be reused.
 *   - copy_d2d handles overlapping source and destination ranges, as memmove
 *     does (OpenCL's clEnqueueCopyBuffer does not: stage through a temporary).
 *   - A copy on a non-NULL stream (FL_FEATURE_ASYNC_COPY) may return at once;
 *     the runtime keeps both buffers alive and untouched until an event
 *     recorded after it on that stream completes (or synchronizes the
 *     stream, as it does after host copies on a current stream that is not
 *     the NULL one).
 *   - free may be called while kernels that read the block are still queued on
 *     the NULL stream: the plugin releases the memory only when they are done
 *     (or waits for them). The runtime frees a block used on other streams
 *     only after their work on it is done (its caching pool reuses a block
 *     only on the stream it was allocated on, and after the streams named by
 *     Tensor.record_stream have passed the free).
 *
 * Asynchronous devices (version 2, FL_FEATURE_ASYNC_KERNELS in the device's
 * features). Kernels may return before they have run: FL_OK then means "the
 * call was valid and is queued". The runtime never reads device memory from
 * the host, waits on events or blocking copies where it needs results, and
 * times work with events (event_elapsed), never with the host clock. Such a
 * plugin must provide every stream/event entry point and event_elapsed.
 *   - A kernel decides FL_ERR_UNSUPPORTED and FL_ERR_INVALID from its
 *     descriptors before it queues anything.
 *   - An error found while the kernel runs (an index out of range in the
 *     data) is reported, as CUDA reports device-side errors, by the next call
 *     that waits for it (a NULL-stream copy, stream_synchronize,
 *     event_synchronize, synchronize) with FL_ERR_INTERNAL and a message
 *     naming the kernel that failed.
 *
 * Device JIT (version 2). torch_fl generates kernels for ops a plugin lacks
 * (pointwise chains, reductions, gather/scatter). Version 1's jit_compile takes
 * host C and returns a function the host calls; a chip compiles its own
 * language instead. A plugin sets jit_language and provides jit_build (source
 * -> a handle per device) and jit_launch (handle + the kernel calling
 * convention). The runtime, its C++ fast path and its kernel graphs keep
 * (jit_launch, handle) pairs and never call device code themselves.
 *
 * FL_JIT_OPENCL_C: the launch convention torch_fl's generators emit and an
 * OpenCL plugin implements (plugins_cffi/opencl/opencl.c is one):
 *   __kernel void SYMBOL(__global const long *meta, __global int *status,
 *                        __global uchar *t0, ..., __global uchar *tN_1)
 *   - t0..tN_1: one buffer per descriptor, inputs then outputs (N = n_inputs
 *     + n_outputs); the buffer holding the descriptor's data. An undefined
 *     output (ndim -1) gets any valid buffer. A plugin refuses (FL_ERR_INVALID)
 *     a launch whose N differs from the kernel's.
 *   - meta: FL_JIT_META_TENSOR longs per descriptor in the same order:
 *     [0] the byte offset of `data` in its buffer, [1] offset (elements),
 *     [2] dtype, [3] ndim, [4..12) sizes, [12..20) strides; then
 *     FL_JIT_META_ARG longs per argument: [0] kind, [1] len, [2] i, [3] the
 *     bits of f (as_double), [4..12) list.
 *   - The kernel runs over a 1-D range whose size and work-group size the
 *     plugin chooses (any size is correct: generated kernels share their work
 *     out by get_global_id(0) and get_global_size(0)).
 *   - status is zero at the start. A source that defines FL_JIT_CHECKED may
 *     store a nonzero fl_status_t in it (FL_ERR_INVALID: an index out of range,
 *     an integer division by zero); the plugin then waits for the kernel and
 *     returns that status from jit_launch, as a host kernel would. Other
 *     sources never store to it, and their launches may return at once.
 *   - Sources use double (cl_khr_fp64); a device without it fails the build,
 *     and the runtime uses its next tier.
 */
#ifndef FL_PLUGIN_H
#define FL_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#define FL_ABI_VERSION 2
#define FL_ABI_VERSION_MIN 1 /* the oldest version torch_fl still loads */
#define FL_MAX_DIMS 8

typedef enum {
    FL_OK = 0,
    FL_ERR_OOM = 1,          /* allocation beyond device memory */
    FL_ERR_INVALID = 2,      /* bad argument (shape, pointer, device index) */
    FL_ERR_UNSUPPORTED = 3,  /* this kernel declines this call (dtype mix, layout, rank):
                                the runtime then tries the next tier; not an error */
    FL_ERR_INTERNAL = 4      /* anything else; the message says what */
} fl_status_t;

/* Element types. The numbering is part of the ABI. */
typedef enum {
    FL_FLOAT32 = 0,
    FL_FLOAT64 = 1,
    FL_FLOAT16 = 2,
    FL_BFLOAT16 = 3,
    FL_INT64 = 4,
    FL_INT32 = 5,
    FL_INT16 = 6,
    FL_INT8 = 7,
    FL_UINT8 = 8,
    FL_BOOL = 9,
    FL_COMPLEX64 = 10,   /* two float32: real, imaginary (PyTorch's layout, 8 bytes) */
    FL_COMPLEX128 = 11,  /* two float64 (16 bytes) */
    FL_DTYPE_COUNT = 12
} fl_dtype_t;

#define FL_DTYPE_BIT(d) (1u << (d))

/* A strided view of device memory. `data` is the base of the allocation the
 * runtime got from malloc; the first element lives at data + offset*itemsize.
 * Strides are in elements and may be 0 (broadcast) or describe any
 * non-contiguous layout. ndim may be 0 (a scalar) and sizes may be 0. */
typedef struct {
    void *data;
    int64_t offset;
    int32_t dtype;
    int32_t ndim;
    int64_t sizes[FL_MAX_DIMS];
    int64_t strides[FL_MAX_DIMS];
} fl_tensor_t;

/* Non-tensor arguments. Every kernel receives one fl_arg_t per argument of
 * the aten schema, in schema order (defaults filled in), so a kernel for
 * "aten::add.Tensor" sees args[0]=self, args[1]=other, args[2]=alpha. */
typedef enum {
    FL_ARG_NONE = 0,        /* an optional argument given as None */
    FL_ARG_TENSOR = 1,      /* i = index into the inputs array */
    FL_ARG_TENSOR_LIST = 2, /* i = first index into inputs, len = count */
    FL_ARG_INT = 3,         /* i */
    FL_ARG_FLOAT = 4,       /* f */
    FL_ARG_BOOL = 5,        /* i (0 or 1) */
    FL_ARG_INT_LIST = 6,    /* list[0..len) ; len <= FL_MAX_DIMS */
    FL_ARG_DTYPE = 7,       /* i = fl_dtype_t */
    FL_ARG_OTHER = 8        /* a string (i = its fl_string_code_t), or something the ABI does
                               not describe (layout, memory format...) */
} fl_arg_kind_t;

/* The strings kernels read (reduce="amax", side="right", approximate="tanh",
 * UPLO="L") arrive as FL_ARG_OTHER with the string's code in `i`. The
 * constant's name is FL_STR_ followed by the string exactly as PyTorch spells
 * it: the runtime reads this enum to build its table, so the two can never
 * disagree. A string not listed arrives as FL_STR_UNKNOWN; a new one gets
 * the next code (the numbering is part of the ABI). */
typedef enum {
    FL_STR_UNKNOWN = -1,
    FL_STR_none = 0,      /* gelu approximate */
    FL_STR_tanh = 1,
    FL_STR_trunc = 2,     /* div rounding_mode */
    FL_STR_floor = 3,
    FL_STR_mean = 4,      /* scatter_reduce / index_reduce / segment_reduce reduce */
    FL_STR_sum = 5,
    FL_STR_L = 6,         /* eigh / eigvalsh UPLO */
    FL_STR_U = 7,
    FL_STR_prod = 8,
    FL_STR_amax = 9,
    FL_STR_amin = 10,
    FL_STR_add = 11,      /* scatter reduce */
    FL_STR_multiply = 12,
    FL_STR_left = 13,     /* searchsorted side */
    FL_STR_right = 14,
    FL_STR_max = 15,      /* segment_reduce reduce */
    FL_STR_min = 16
} fl_string_code_t;

typedef struct {
    int32_t kind;
    int32_t len;
    int64_t i;
    double f;
    int64_t list[FL_MAX_DIMS];
} fl_arg_t;

typedef void *fl_stream_t; /* NULL = the device's default stream */
typedef void *fl_event_t;

/* The kernel calling convention.
 *   inputs:  every tensor argument, in schema order (tensor lists flattened).
 *            A 0-dim CPU tensor holding a Python number is passed as a scalar
 *            argument (FL_ARG_INT/FLOAT/BOOL), not as a tensor.
 *   outputs: every tensor the op returns, allocated by the runtime with the
 *            shape, strides and dtype PyTorch's own shape rules give. For an
 *            in-place op the output aliases the mutated argument (out=
 *            overloads never reach a kernel: the runtime serves them from the
 *            functional op). An output the op leaves undefined
 *            (convolution_backward with output_mask false, say) and an int
 *            the op returns (fused attention's max_q) have data == NULL and
 *            ndim == -1. A written tensor never partly overlaps an input.
 *   args:    one per schema argument; an optional tensor given as None is
 *            FL_ARG_NONE and has no entry in inputs.
 *   For ops tagged pointwise (torch.Tag.pointwise), every tensor input is
 *   already broadcast to the output's shape (stride 0 in broadcast dims).
 * A kernel may return FL_ERR_UNSUPPORTED for a call it does not handle
 * (e.g. a mix of dtypes); the runtime then uses another tier for that call. */
typedef int (*fl_kernel_fn)(fl_stream_t stream, int device,
                            const fl_tensor_t *inputs, int n_inputs,
                            const fl_tensor_t *outputs, int n_outputs,
                            const fl_arg_t *args, int n_args);

/* One entry of the kernel table: aten overload name ("aten::mm",
 * "aten::add.Tensor", "aten::native_layer_norm_backward") and the dtypes it
 * serves (a mask of FL_DTYPE_BIT). The lookup dtype is that of the op's first
 * fl tensor argument. A factory (an op with no fl tensor argument, such as
 * "aten::arange.start_step") is looked up by its output's dtype: its kernel
 * gets no inputs, the op's scalar arguments and the output the runtime
 * allocated; a factory without a kernel is computed on the host and copied.
 * Each name appears once. */
typedef struct {
    const char *op;
    uint32_t dtypes;
    uint32_t flags; /* fl_kernel_flag_t bits, or 0 */
    fl_kernel_fn fn;
} fl_kernel_entry_t;

/* Kernel flags (fl_kernel_entry_t.flags). */
typedef enum {
    FL_KERNEL_FUSED = 1,           /* a fused kernel with an fl:: name (e.g. "fl::conv_bn_relu") */
    FL_KERNEL_ANY_OUT_LAYOUT = 2   /* writes an output of any dense layout it is given (e.g. channels-last),
                                      through its strides; without it an output always has the layout
                                      PyTorch's meta function gives the op */
} fl_kernel_flag_t;

/* Device feature flags (fl_device_props_t.features), a mask. */
typedef enum {
    FL_FEATURE_HOST_ACCESSIBLE = 1,   /* device pointers may be read by the host CPU */
    FL_FEATURE_ASYNC_COPY = 2,        /* copies on non-default streams overlap */
    FL_FEATURE_FP16_STABLE = 4,       /* fp16 autocast is numerically safe */
    FL_FEATURE_COLLECTIVES = 8,       /* the comm_* entry points are real collectives */
    FL_FEATURE_CHANNELS_LAST = 16,    /* convolutions run fastest on NHWC (channels-last) tensors */
    FL_FEATURE_ASYNC_KERNELS = 32,    /* version 2: kernels and NULL-stream work may complete after their call
                                         returns (see "Asynchronous devices" above) */
    FL_FEATURE_HOST_CPU = 64          /* version 2: the device is the host's own CPU cores (an OpenCL CPU
                                         device such as pocl): "auto" selection prefers the cpu backend */
} fl_feature_t;

/* Languages of the device JIT (fl_plugin_t.jit_language). */
typedef enum {
    FL_JIT_NONE = 0,      /* no device JIT (a version-1 jit_compile may still take host C) */
    FL_JIT_HOST_C = 1,    /* C99 for the host, with fl_plugin.h and fl_kernel_util.h pasted in */
    FL_JIT_OPENCL_C = 2,  /* OpenCL C 1.2, with the launch convention above */
    FL_JIT_CUDA_C = 3     /* CUDA C++ (nvrtc); no generator emits it yet */
} fl_jit_language_t;
#define FL_JIT_META_TENSOR 20
#define FL_JIT_META_ARG 12

typedef struct {
    char name[64];
    uint64_t total_memory;     /* bytes; allocations beyond it fail with FL_ERR_OOM */
    uint32_t dtypes;           /* mask of FL_DTYPE_BIT the device computes in */
    uint32_t features;         /* FL_FEATURE_* */
    int32_t compute_units;
    int32_t reserved;
} fl_device_props_t;

typedef enum { FL_REDUCE_SUM = 0, FL_REDUCE_PROD = 1, FL_REDUCE_MIN = 2, FL_REDUCE_MAX = 3, FL_REDUCE_AVG = 4 } fl_reduce_op_t;

typedef struct fl_plugin {
    uint32_t abi_version;   /* FL_ABI_VERSION */
    uint32_t struct_size;   /* sizeof(fl_plugin_t) as the plugin was compiled */
    const char *name;       /* backend name users type: "cpu", "rocm", ... */
    const char *vendor;
    const char *version;
    const char *description; /* one line; emulators say what device class they emulate */
    int32_t emulated;        /* 1 for an emulator of a device class */
    int32_t reserved;

    /* devices */
    int (*device_count)(int *count);
    int (*device_props)(int device, fl_device_props_t *props);

    /* memory: malloc of 0 bytes returns a valid unique pointer or NULL with FL_OK */
    int (*malloc)(int device, size_t nbytes, void **ptr);
    int (*free)(int device, void *ptr);
    int (*memory_used)(int device, uint64_t *bytes);

    /* copies (byte counts; pointers are base+byte offset already) */
    int (*copy_h2d)(int device, void *dst, const void *src, size_t nbytes, fl_stream_t stream);
    int (*copy_d2h)(int device, void *dst, const void *src, size_t nbytes, fl_stream_t stream);
    int (*copy_d2d)(int device, void *dst, const void *src, size_t nbytes, fl_stream_t stream);

    /* streams and events (may be NULL: the runtime then treats work as synchronous) */
    int (*stream_create)(int device, fl_stream_t *stream);
    int (*stream_destroy)(int device, fl_stream_t stream);
    int (*stream_synchronize)(int device, fl_stream_t stream);
    int (*event_create)(int device, fl_event_t *event);
    int (*event_destroy)(int device, fl_event_t event);
    int (*event_record)(int device, fl_event_t event, fl_stream_t stream);
    int (*event_synchronize)(int device, fl_event_t event);
    int (*event_query)(int device, fl_event_t event, int *done);
    int (*synchronize)(int device);

    /* random numbers: a counter-based generator per device (seed, offset) */
    int (*rng_set_state)(int device, uint64_t seed, uint64_t offset);
    int (*rng_get_state)(int device, uint64_t *seed, uint64_t *offset);

    /* kernel table */
    int (*kernel_count)(int *count);
    int (*kernel_get)(int index, fl_kernel_entry_t *entry);

    /* collectives (all NULL: the runtime is to relay through the host with gloo; not built yet).
     * A communicator joins the `world` processes that call comm_init with the
     * same unique_id (a short string the runtime makes and shares through
     * torch.distributed's store), one device each. Every call blocks until the
     * operation is complete on this rank; a peer that does not arrive within
     * timeout_ms makes the call fail with FL_ERR_INTERNAL and a message naming
     * the operation, never hang. Tensors are contiguous (the runtime ensures
     * it); all_reduce works in place; all_gather's out holds world * numel(in)
     * elements in rank order; reduce_scatter's in holds world * numel(out).
     * op is an fl_reduce_op_t. */
    int (*comm_init)(int device, const char *unique_id, int rank, int world, int timeout_ms, void **comm);
    int (*comm_destroy)(void *comm);
    int (*comm_all_reduce)(int device, const fl_tensor_t *t, int op, void *comm);
    int (*comm_broadcast)(int device, const fl_tensor_t *t, int root, void *comm);
    int (*comm_all_gather)(int device, const fl_tensor_t *in, const fl_tensor_t *out, void *comm);
    int (*comm_reduce_scatter)(int device, const fl_tensor_t *in, const fl_tensor_t *out, int op, void *comm);
    int (*comm_send)(int device, const fl_tensor_t *t, int peer, void *comm);
    int (*comm_recv)(int device, const fl_tensor_t *t, int peer, void *comm);
    int (*comm_barrier)(void *comm);

    /* optional JIT: compile C source and return the named kernel (may be NULL) */
    int (*jit_compile)(const char *source, const char *symbol, fl_kernel_fn *fn);

    /* the message of the last failed call on this thread */
    const char *(*last_error)(void);

    /* ---- version 2: present when struct_size reaches them; every one may be NULL, except that
     * a device with FL_FEATURE_ASYNC_KERNELS needs event_elapsed ---- */

    /* milliseconds of device time between two recorded events, both complete (the runtime waits
     * for them first); FL_ERR_INVALID for an event never recorded */
    int (*event_elapsed)(int device, fl_event_t start, fl_event_t end, double *ms);
    /* fill nbytes at dst with the byte value, ordered on the stream like a kernel */
    int (*mem_set)(int device, void *dst, int value, size_t nbytes, fl_stream_t stream);
    /* pinned (page-locked) host memory the device copies from and to asynchronously; the runtime
     * hands it out for pin_memory=True and frees it with host_free */
    int (*host_alloc)(int device, size_t nbytes, void **ptr);
    int (*host_free)(int device, void *ptr);
    /* device-to-host copy on a stream that may return at once (dst is pinned memory from host_alloc);
     * the runtime records an event after it and waits on that before the host reads dst */
    int (*copy_d2h_async)(int device, void *dst, const void *src, size_t nbytes, fl_stream_t stream);

    /* device JIT (see "Device JIT" above): the language jit_build compiles (fl_jit_language_t;
     * FL_JIT_NONE: no device JIT, the version-1 jit_compile alone serves host C) */
    int32_t jit_language;
    int32_t reserved2;
    /* build `source` for one device and find its kernel `symbol`; *handle stays valid for the life of
     * the process (the runtime keeps it per device). A compile error is FL_ERR_INTERNAL with the
     * compiler's log as the message: the runtime then serves the op with its next tier */
    int (*jit_build)(int device, const char *source, const char *symbol, void **handle);
    /* run a built kernel on the stream with the kernel calling convention (fl_kernel_fn's descriptors);
     * on an FL_FEATURE_ASYNC_KERNELS device it may return once the kernel is queued */
    int (*jit_launch)(void *handle, fl_stream_t stream, int device, const fl_tensor_t *inputs, int n_inputs,
                      const fl_tensor_t *outputs, int n_outputs, const fl_arg_t *args, int n_args);

    /* work issued to `stream` after this call starts only once `event` (as last recorded, on any stream of
     * the device) has completed; returns at once. Without it the runtime waits on the host (event_synchronize),
     * which orders the work as well but stalls the caller (stream.wait_event, stream.wait_stream) */
    int (*stream_wait_event)(int device, fl_stream_t stream, fl_event_t event);
} fl_plugin_t;

#if defined(_WIN32)
#define FL_EXPORT __declspec(dllexport)
#else
#define FL_EXPORT __attribute__((visibility("default")))
#endif
FL_EXPORT int fl_plugin_abi_version(void);
FL_EXPORT int fl_plugin_init(fl_plugin_t *out);

#endif /* FL_PLUGIN_H */
