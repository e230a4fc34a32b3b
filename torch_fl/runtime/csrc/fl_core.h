/*
 * fl_core.h — the C API of torch_fl's C++ core (csrc/, built by torch_fl/runtime/core.py).
 *
 * The core makes fl tensors real PyTorch tensors on the PrivateUse1 device (allocator, guard, hooks,
 * metadata ops, the boxed fallback and its fast path); these plain C entry points are how torch_fl's Python
 * side drives it. Python binds them through cffi in ABI mode: core.py hands this header's text to ffi.cdef
 * (after fl_plugin.h, whose types it uses) and dlopens the library torch.ops.load_library loaded, so this
 * header is the one declaration of the API (tests/runtime/test_core_header.py checks the library exports each name).
 *
 * Rules that hold for every entry point:
 *   - A failure is a return value (-1 for an fl index that names no device, 0 for "not done"); no entry
 *     point reports one by throwing a C++ exception across the C boundary.
 *   - Devices are global fl indices (fl:index, as torch.device("fl", index) has them), added by
 *     fl_core_add_device before any tensor lives on them.
 *   - Threads: every entry point may be called from any thread; the core locks what it shares. The current
 *     device and the current stream are per thread, as CUDA's are.
 *   - Ownership: pointers passed in are borrowed for the call and copied when kept, unless an entry point
 *     says otherwise; the core never frees what it did not allocate.
 */
#ifndef FL_CORE_H
#define FL_CORE_H

#include <stdint.h>

#include "fl_plugin.h"

#ifndef FL_CORE_API
#define FL_CORE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* a device JIT kernel's launch: fl_plugin_t's jit_launch, called with the handle jit_build gave */
typedef int (*fl_core_launch_fn)(void *handle, fl_stream_t stream, int device, const fl_tensor_t *inputs,
                                 int n_inputs, const fl_tensor_t *outputs, int n_outputs, const fl_arg_t *args,
                                 int n_args);

/* A kernel call as the fast path and kernel graphs keep it (they copy every array). */
typedef struct {
    fl_kernel_fn fn;            /* a plugin kernel or a host-C JIT kernel ... */
    fl_core_launch_fn launch;   /* ... or, when handle is not NULL, launch(handle, ...): a device JIT kernel */
    void *handle;
    int32_t local;              /* the plugin's device */
    int32_t n_inputs;
    const fl_tensor_t *inputs;
    int32_t n_outputs;
    const fl_tensor_t *outputs;
    int32_t n_args;
    const fl_arg_t *args;
    int64_t slot;               /* the counter slot its calls count in (fl_core_fast_take_counts; -1: none) */
} fl_core_kernel_call_t;

/* ---- devices and hooks (fl_device.cpp) ---- */

/* the FL_ABI_VERSION the core was built against (Python refuses a cached core of another) */
FL_CORE_API int fl_core_abi(void);
/* installs the device guard (replacing PyTorch's Python one) and the PrivateUse1 hooks: 1 when torch_fl's
 * hooks are in place, 0 when another extension's already are */
FL_CORE_API int fl_core_install(void);
/* An fl device as the core learns it. */
typedef struct {
    const fl_plugin_t *plugin;  /* borrowed for the life of the process (Python keeps the plugin loaded) */
    int32_t local;              /* the plugin's device */
    uint32_t features;          /* FL_FEATURE_* of fl_device_props_t */
    uint64_t total_memory;      /* bytes, for out-of-memory messages and memory info */
    int64_t pool_limit;         /* the most cached bytes the pool keeps */
    const char *label;          /* "fl:1 (rocm)", for messages (copied) */
} fl_core_device_t;

/* fl:index is device->plugin's local device. -1: index out of range (the core has room for 64 devices) or
 * no plugin */
FL_CORE_API int fl_core_add_device(int index, const fl_core_device_t *device);
/* the device a bare "fl" means, for every thread; resets the calling thread's own choice */
FL_CORE_API void fl_core_set_default(int index);
/* the calling thread's current device */
FL_CORE_API int fl_core_current(void);

/* ---- the device guard: streams (fl_guard.cpp) ---- */

/* the plugin handle of the calling thread's current stream on fl:index (NULL: the default stream), where
 * Python's kernel calls, copies and fills go */
FL_CORE_API fl_stream_t fl_core_current_stream(int index);
/* streams made through the guard so far, all devices: while 0, every current stream is the default one
 * (Python reads it without a call) */
FL_CORE_API extern volatile int64_t fl_core_streams_made;

/* ---- the caching allocator (fl_allocator.cpp) ---- */

/* caching on (1) or off (0: every free goes back to the plugin), all devices */
FL_CORE_API void fl_core_set_pool_enabled(int enabled);
/* the most cached bytes fl:index keeps; cached blocks beyond it are freed now */
FL_CORE_API int fl_core_set_pool_limit(int index, int64_t nbytes);
/* frees fl:index's cached blocks (waiting for the streams that still use deferred ones) */
FL_CORE_API int fl_core_empty_cache(int index);
/* A device's pool, as torch.fl.memory_stats() reports it. */
typedef struct {
    int64_t allocated;      /* bytes held by live tensors (size classes) */
    int64_t peak;           /* the most allocated since the last reset */
    int64_t cached;         /* bytes of freed blocks kept for reuse */
    int64_t allocations;    /* live blocks */
    int64_t hits;           /* requests served from the cache */
    int64_t misses;         /* requests that went to the plugin */
    int64_t limit;          /* the most cached bytes kept */
    int64_t device_allocs;  /* plugin mallocs */
    int64_t device_frees;   /* plugin frees */
    int64_t ooms;           /* requests the device could not serve */
} fl_core_memory_stats_t;

/* fl:index's pool figures */
FL_CORE_API int fl_core_memory_stats(int index, fl_core_memory_stats_t *out);
/* the peak becomes max(value, allocated): 0 resets it, a saved figure restores it after a profile */
FL_CORE_API int fl_core_set_peak(int index, int64_t value);
/* the size class a request of nbytes is served from (what the pool reserves) */
FL_CORE_API uint64_t fl_core_size_class(uint64_t nbytes);
/* an async copy into the block at ptr is in flight until event completes: freeing the block first waits for
 * it. The core takes ownership of event (a plugin event of fl:index) and destroys it once settled */
FL_CORE_API int fl_core_set_pending(int index, void *ptr, fl_event_t event);
/* 1 while an async copy into the block at ptr is registered (0 once settled or freed) */
FL_CORE_API int fl_core_is_pending(int index, void *ptr);
/* waits for the copy into ptr, if one is in flight, and destroys its event: 1 if there was one */
FL_CORE_API int fl_core_wait_pending(int index, void *ptr);

/* ---- the boxed fallback and its fast path (fl_fallback.cpp) ---- */

/* gives the op ns::name (an op PyTorch composes for every backend) an fl kernel that is the fallback, so it
 * gets the fast path too: 0, or -1 when PyTorch refused the registration */
FL_CORE_API int fl_core_route_to_fallback(const char *ns, const char *name);
/* 1 when base is the storage of an out= tensor of the calling thread's innermost fallback call that no
 * Python object had seen (PyTorch allocated it for a functional call: its storage may be replaced) */
FL_CORE_API int fl_core_fresh_out(const void *base);
/* the fast path on (1) or off (0: every call goes to Python; the plans are kept) */
FL_CORE_API void fl_core_fast_enable(int on);
/* forgets every committed plan (decomposition plans too) */
FL_CORE_API void fl_core_fast_clear(void);
/* committed plans */
FL_CORE_API int64_t fl_core_fast_size(void);
/* calls the fast path served, ever */
FL_CORE_API int64_t fl_core_fast_hits(void);
/* 1 when the op Python is handling on this thread (its qualified name, "aten::add.out") is the innermost
 * call the fallback handed over, with a signature the fast path can key */
FL_CORE_API int fl_core_fast_can_commit(const char *name);
/* Where an input descriptor's tensor is found in a later call: the op's argument arg (-1: an undefined entry
 * of a Tensor?[]), and its index in that tensor list (-1: the argument is a tensor). */
typedef struct {
    int32_t arg;
    int32_t list;
} fl_core_input_src_t;

/* A value the fast path reads per call: the op's argument arg, into the kernel's args[kernel_arg]. kind 0: a
 * float, 1: a wrapped number (a 0-dim CPU tensor), 2: a Scalar; | 4: a float rounded to float32 first (an op
 * computing in complex64: PyTorch's kernels cast the scalar to complex<float>). */
typedef struct {
    int32_t kernel_arg;
    int32_t arg;
    int32_t kind;
} fl_core_patch_t;

/* The marshalling of a native call, as the fast path replays it for later calls of the same signature. */
typedef struct {
    const char *name;                      /* the op, "aten::add.out" (must be the call in flight) */
    int32_t device;                        /* fl index */
    fl_core_kernel_call_t call;            /* the descriptors and arguments as this call built them */
    const fl_core_input_src_t *input_src;  /* call.n_inputs entries */
    const int32_t *output_src;             /* call.n_outputs: the op's argument each output is, or -1: a fresh
                                              output with the descriptor's sizes and strides ..., or -2: an
                                              int the op returns there, output_ints[k] */
    const int32_t *output_dtypes;          /* ... and this c10::ScalarType (call.n_outputs entries) */
    int32_t n_patches;
    const fl_core_patch_t *patches;
    int32_t n_returns;
    const int32_t *returns;                /* per return of the op: the output it is */
    const int64_t *output_ints;            /* call.n_outputs, or NULL when no output_src is -2: the ints the op
                                              returns (its meta function's, from the shapes the key fixes:
                                              SDPA's max_q and max_k) */
} fl_core_fast_plan_t;

/* The Python dispatcher ran the op now in flight on this thread as one native kernel call on its own
 * arguments: the core keeps the plan for this signature (everything is copied). 1 if kept, 0 when the call
 * in flight is another op or cannot be keyed, or the plan names no kernel */
FL_CORE_API int fl_core_fast_commit(const fl_core_fast_plan_t *plan);
/* the calls each counter slot served without Python since the last read, into out[0..n); the counters are
 * reset. Returns how many slots were written */
FL_CORE_API int64_t fl_core_fast_take_counts(int64_t *out, int64_t n);

/* ---- the CPU fallback's fast path (fl_cpu_fallback.cpp) ---- */

/* A call the Python dispatcher served with PyTorch's CPU kernel on host copies of its fl tensors, as the
 * core replays it for later calls with the same fast-path key. Indices are the arrived op's arguments. */
typedef struct {
    const char *name;       /* the op in flight, "aten::add.out" (must be the call in flight on this thread) */
    int32_t device;         /* the fl index it ran on */
    const char *call;       /* the op Python called on the host copies ("aten::add.Tensor"); NULL: the op itself */
    int32_t n_inputs;
    const int32_t *inputs;  /* per argument of the called op: the arrived op's argument it takes */
    int32_t n_writes;
    const int32_t *writes;  /* fl tensors the called op writes in place: their host copies go back */
    int32_t n_outs;
    const int32_t *outs;    /* result k of the called op is copied into the out= tensor at outs[k] */
    int32_t n_returns;
    const int32_t *returns; /* per return: an argument (>= 0), or result k as a new fl tensor (-1 - k) */
    int64_t slot;           /* Python's counter slot (backend, op, "fallback") */
} fl_fallback_plan_t;

/* commits the plan for the call in flight's key: 1 if kept (0: another op in flight, no key, unknown call) */
FL_CORE_API int fl_fallback_commit(const fl_fallback_plan_t *plan);
/* same-device copies of one dtype and dense layout on fl:device are one device memory copy each (counted in
 * slot; -1 switches it off) */
FL_CORE_API void fl_fallback_copy_commit(int device, int64_t slot);
/* zero_ of dense tensors of dtype scalar_type (c10's code) on fl:device is one mem_set (counted in slot) */
FL_CORE_API void fl_fallback_zero_commit(int device, int scalar_type, int64_t slot);
/* forgets every committed plan and switches the copies and fills off */
FL_CORE_API void fl_fallback_clear(void);
/* committed plans */
FL_CORE_API int64_t fl_fallback_size(void);
/* calls served from committed plans, copies served as device copies, zero_ served as mem_set, ever */
FL_CORE_API int64_t fl_fallback_hits(void);
FL_CORE_API int64_t fl_fallback_copies(void);
FL_CORE_API int64_t fl_fallback_fills(void);
/* bytes this path moved between host and device, ever */
FL_CORE_API int64_t fl_fallback_bytes(void);
/* the calling thread is inside a decomposition that must stay on the device (depth > 0): no CPU kernel serves */
FL_CORE_API void fl_fallback_device_only(int depth);

/* ---- the write watch (fl_watch.cpp) ---- */

/* watches (on 1) or stops watching (on 0) the storage whose base is base; watches are counted */
FL_CORE_API void fl_core_watch(const void *base, int on);
/* how many writes the watched storage at base has had (0 when not watched) */
FL_CORE_API uint64_t fl_core_write_generation(const void *base);
/* a write into the storage at base (the Python dispatcher's writes; the fast path notes its own) */
FL_CORE_API void fl_core_note_write(const void *base);
/* watched storages */
FL_CORE_API int64_t fl_core_watched(void);
/* writes into any watched storage so far: a cache reads it without a call, and looks at its own storages'
 * generations only when it moved */
FL_CORE_API extern volatile uint64_t fl_core_watched_writes;

/* ---- the kernel recorder for torch.profiler (fl_trace.cpp, fl_kineto.cpp) ---- */

/* 1 when this torch has PyTorch's PrivateUse1 profiler registry and the core registered fl kernels there */
FL_CORE_API int fl_core_kineto(void);
/* 1 while torch.profiler records fl kernels: Python's kernel calls then report theirs (no call to read it) */
FL_CORE_API extern volatile int fl_core_tracing;
/* around a kernel call Python makes while tracing, on the same thread (nested calls pair up): begin on
 * fl:index before it, end after it under name (copied; NULL: "kernel") */
FL_CORE_API void fl_core_trace_begin(int index);
FL_CORE_API void fl_core_trace_end(const char *name);

/* ---- kernel graph replay (fl_graph.cpp) ---- */

/* A recorded kernel list (runtime/graph.py) replayed in one call. The graph owns copies of the descriptors
 * and arguments; the buffers they point at are the recording's, which the caller keeps alive as long as the
 * graph. A graph is used by one thread at a time. */
typedef struct fl_core_graph fl_core_graph_t;
/* an empty graph on fl:index (NULL: no such device); fl_core_graph_free releases it */
FL_CORE_API fl_core_graph_t *fl_core_graph_new(int device);
FL_CORE_API void fl_core_graph_free(fl_core_graph_t *graph);
/* appends a kernel call (copied): its step index, or -1 */
FL_CORE_API int fl_core_graph_add_kernel(fl_core_graph_t *graph, const fl_core_kernel_call_t *call);
/* a static input buffer (nbytes at dst) each replay copies the caller's input into */
FL_CORE_API int fl_core_graph_add_input(fl_core_graph_t *graph, void *dst, uint64_t nbytes);
/* Static input k may be read in place: fl_graph::replay points the kernel arguments that read its buffer at the
 * caller's tensor for the call instead of copying that tensor in (fl_core_graph_replay still copies). 1: bound;
 * 0: a kernel writes into the buffer, so it stays a copy (the caller's tensor must not see the write); -1: no
 * such input. */
FL_CORE_API int fl_core_graph_bind_input(fl_core_graph_t *graph, int64_t k);
/* a static output (nbytes at src) each replay copies out */
FL_CORE_API int fl_core_graph_add_output(fl_core_graph_t *graph, void *src, uint64_t nbytes);
/* Static output k may be written where the caller wants it: fl_graph::replay (and the decomposition plans) point
 * the kernel arguments inside its bytes at the call's fresh result instead of copying the result out
 * (fl_core_graph_replay still copies). 1: bound; 0: it stays a copy (the first kernel to touch it does not write
 * all of it densely, or reads it; an argument lies partly inside it; another output shares its bytes; no kernel
 * writes it); -1: no such output. */
FL_CORE_API int fl_core_graph_bind_output(fl_core_graph_t *graph, int64_t k);
/* kernel steps (-1: no graph) */
FL_CORE_API int64_t fl_core_graph_size(fl_core_graph_t *graph);
/* One replay on the calling thread's current stream. in_src[k]: the caller's bytes for static input k
 * (skipped where it is the static buffer itself; NULL: no input copies); out_dst[k]: where static output k
 * goes (NULL: no output copies); run_kernels 0 copies only. With step_ns, each kernel's own time (ns) is
 * written there. Returns FL_OK, or the failing status with *failed = the kernel step, or -1 - k for input
 * copy k, or -1 - n_inputs - k for output copy k. */
FL_CORE_API int fl_core_graph_replay(fl_core_graph_t *graph, void *const *in_src, void *const *out_dst,
                                     int run_kernels, int64_t *failed, int64_t *step_ns);
/* The fl_graph::replay op's view of the graph (compile/replay.py): one tensor argument of the call, in order
 * (copied: its bytes go to the next static input; else a parameter used in place, at data), with the layout
 * and c10::ScalarType the call must match; one fresh result, in order (own: a tensor of its own, whose bytes
 * are static output `region`; else a view at `offset` elements into that region, which results share). */
typedef struct {
    int32_t ndim;
    const int64_t *sizes;
    const int64_t *strides;
    int32_t dtype; /* c10::ScalarType */
} fl_core_layout_t;
FL_CORE_API int fl_core_graph_guard_tensor(fl_core_graph_t *graph, int copied, void *data,
                                           const fl_core_layout_t *layout);
FL_CORE_API int fl_core_graph_out_tensor(fl_core_graph_t *graph, int region, int own, const fl_core_layout_t *layout,
                                         int64_t offset);
/* the next result is a view of the call's tensor argument `arg` (declared by fl_core_graph_guard_tensor), with
 * this layout, `offset` elements past that tensor's storage offset: an output of the graph that views an input */
FL_CORE_API int fl_core_graph_out_view(fl_core_graph_t *graph, int arg, const fl_core_layout_t *layout, int64_t offset);
/* the next result is None (a backward graph's gradient for an input that needs none) */
FL_CORE_API int fl_core_graph_out_none(fl_core_graph_t *graph);
/* The latest fl_graph::replay call: its status (FL_OK where it ran or missed), *missed 1 where a guard did not
 * match (nothing ran), *failed the step that failed (as fl_core_graph_replay's). */
FL_CORE_API int fl_core_graph_last_call(fl_core_graph_t *graph, int *missed, int64_t *failed);

/* ---- decomposition plans (fl_decomp_plans.cpp) ---- */

/* A call the Python dispatcher served by a decomposition, recorded as a kernel graph over private static buffers
 * (dispatch/decomp_replay.py): later calls with the same fast-path key copy their tensors into the static
 * inputs, replay the graph and copy the static outputs out, without Python. Indices are the arrived op's
 * arguments. The plans are forgotten with the fast path's (fl_core_fast_clear). */
typedef struct {
    const char *name;                  /* the op in flight, "aten::addmm.out" (must be the call in flight on this thread) */
    int32_t device;                    /* the fl index the graph runs on */
    fl_core_graph_t *graph;            /* handed over: the core frees it with the plan (at once when not kept) */
    int32_t n_inputs;
    const int32_t *inputs;             /* per static input of graph: the dense tensor argument copied in */
    int32_t n_outputs;
    const int32_t *output_src;         /* per static output: the out= argument it is copied into, or -1: a fresh
                                          tensor with this descriptor's sizes and strides ... */
    const fl_tensor_t *output_layouts;
    const int32_t *output_dtypes;      /* ... and this c10::ScalarType */
    int32_t n_returns;
    const int32_t *returns;            /* per return: an argument (>= 0), or static output k (-1 - k) */
    int32_t n_slots;
    const int64_t *slots;              /* Python's counter slots, each bumped once per call served (what the Python
                                          path counted: the op and its sub-ops) */
    int32_t n_keep;
    void *const *keep;                 /* c10::StorageImpl * of the buffers the graph uses (UntypedStorage._cdata): the
                                          plan holds a reference to each, released when it is forgotten */
    int64_t nbytes;                    /* the bytes of those buffers (fl_core_decomp_bytes) */
} fl_core_decomp_plan_t;

/* keeps the plan for the key of the call in flight, replacing one kept for that key: 1 if kept, 0 when another
 * op is in flight, the call cannot be keyed or its buffers alone pass the bound on all plans' memory (256 MiB);
 * a plan that would pass the bounds (that memory, 4096 plans) forgets the others first */
FL_CORE_API int fl_core_decomp_commit(const fl_core_decomp_plan_t *plan);
/* committed plans, and the bytes their buffers hold */
FL_CORE_API int64_t fl_core_decomp_size(void);
FL_CORE_API int64_t fl_core_decomp_bytes(void);
/* calls served from decomposition plans, and the kernels those replays launched, ever */
FL_CORE_API int64_t fl_core_decomp_hits(void);
FL_CORE_API int64_t fl_core_decomp_kernels(void);

/* ---- cross-device errors (fl_devcheck.cpp) ---- */

/* the backend behind fl:index ("rocm", copied), for PyTorch's device-mismatch messages */
FL_CORE_API void fl_devcheck_label(int index, const char *backend);
/* gives every aten op whose only fl kernel is PyTorch's shared composite one a kernel that names each fl
 * device's backend when the devices mismatch: how many ops, or -1 when PyTorch refused a registration */
FL_CORE_API int fl_devcheck_install(void);

#ifdef __cplusplus
}
#endif

#endif /* FL_CORE_H */
