// fl_core_internal.h — what the core's seams share (not an API: the C entry points are fl_core.h's).
//
// One file per PyTorch seam, as PyTorch's OpenReg backend lays its runtime out:
//   fl_device.cpp     the device table (fl index -> plugin, local device) and the PrivateUse1 hooks
//   fl_generator.cpp  torch.Generator("fl"): the plugin's counter-based RNG
//   fl_allocator.cpp  the caching allocator over the plugins' malloc/free, async copies in flight
//   fl_guard.cpp      the device guard: current device, streams, events
//   fl_pinned.cpp     pinned host memory (pin_memory=True)
//   fl_meta_ops.cpp   the metadata ops every backend provides (empty, view, resize_, set_, ...)
//   fl_fallback.cpp   the boxed fallback and its fast path (a committed native plan, no Python)
//   fl_cpu_fallback.cpp  the CPU fallback's fast path (fl_cpu_fallback.h); device copies and fills
//   fl_rnn.cpp        the fused LSTM/GRU cells as C++ composites (the fl_rnn ops)
//   fl_watch.cpp      the write watch (caches of values derived from weights)
//   fl_trace.cpp      the kernel recorder torch.profiler reads (fl_trace.h; fl_kineto.cpp is Kineto's side)
//   fl_graph.cpp      kernel graph replay (runtime/graph.py)
//   fl_decomp_plans.cpp  decompositions replayed as kernel graphs per signature (fl_decomp_plans.h)
//   fl_devcheck.cpp   cross-device errors that name each fl device's backend
// Only light c10 headers here: each seam includes the ATen it needs, so the files compile apart, in parallel.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>

#include "fl_core.h"
#include "fl_plugin.h"

// A definition of an entry point fl_core.h declares: a definition that strays from the declaration fails to compile.
#define FL_API extern "C" FL_CORE_API

namespace at {
struct Generator;
}
namespace c10::impl {
struct DeviceGuardImplInterface;
}

// Shared between files, never exported (the library exports its C API alone).
#pragma GCC visibility push(hidden)
namespace fl_core {

constexpr int kMaxDevices = 64;
constexpr c10::DispatchKeySet kFlKeys(c10::DispatchKey::PrivateUse1);

// ------------------------------------------------------------ devices (fl_device.cpp) ---

// A block freed while streams other than its own may still use it (Tensor.record_stream): it waits for the
// events recorded on those streams at the free, then joins the cache.
struct Deferred {
  void* ptr;
  size_t size;
  c10::StreamId stream;
  std::vector<void*> events;
};

struct Pool {
  std::mutex mu;
  // (allocation stream, size class) -> blocks. A block goes back only to the stream it was allocated on:
  // that stream's order makes the reuse safe without waiting (CUDA's caching allocator does the same).
  std::map<std::pair<c10::StreamId, size_t>, std::vector<void*>> free_blocks;
  std::vector<Deferred> deferred;
  std::unordered_map<void*, void*> pending;                    // block -> plugin event of an async copy into it
  int64_t allocated = 0, peak = 0, cached = 0, allocations = 0;
  int64_t hits = 0, misses = 0, device_allocs = 0, device_frees = 0, ooms = 0, retries = 0;
  int64_t alloc_requests = 0;
  int64_t limit = 0;
};

struct Device {
  const fl_plugin_t* plugin = nullptr;
  int local = 0;
  uint64_t total = 0;
  uint32_t features = 0;
  std::string label;  // "fl:1 (rocm)"
  Pool pool;
  std::mutex stream_mu;
  std::vector<fl_stream_t> streams;  // stream id k >= 1 is streams[k - 1]; id 0 is the default (NULL) stream
  size_t next_stream = 0;  // once kStreamPool streams exist, torch.Stream() hands them out in turn
};

extern Device* g_devices[kMaxDevices];
extern std::atomic<int> g_count;
extern std::atomic<int> g_default;
extern thread_local int t_current;

Device& device_at(int index);     // raises PyTorch's error naming the devices there are
Device* find_device(int index);   // nullptr when fl:index does not exist (the C API's -1)
int current_index();
std::string plugin_error(const Device& d);
void check_status(const Device& d, int status, const char* what);

// ----------------------------------------------------------- streams (fl_guard.cpp) ---
// A stream id is what PyTorch's c10::Stream carries; the core maps it to the plugin's handle. The current
// stream is per thread and per device, as CUDA's is: kernels, copies and fills go to it.

c10::impl::DeviceGuardImplInterface* guard_impl();  // the guard PyTorch asks (fl_core_install registers it)
fl_stream_t stream_handle(Device& d, c10::StreamId id);
c10::StreamId current_stream_id(int index);
fl_stream_t current_stream(Device& d, int index);
// A device-to-device copy on a stream; on a device whose kernels complete within their call, it has landed
// when this returns.
int copy_d2d_on(Device& d, void* dst, const void* src, size_t n, fl_stream_t s);
// Copies n bytes on fl:index's current stream, landed when it returns (the source or destination on the host
// may go at once); raises the plugin's error.
enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
void copy_on_current(int index, CopyKind kind, void* dst, const void* src, size_t n);
// Zero-fills n bytes at dst on fl:index's current stream with the plugin's mem_set (the caller knows the plugin
// has one), ordered as the runtime's fills are; raises the plugin's error.
void zero_on_current(int index, void* dst, size_t n);

// -------------------------------------------------------- allocator (fl_allocator.cpp) ---

size_t size_class(size_t n);
c10::Allocator* device_allocator();
c10::DataPtr allocate_on(int index, size_t nbytes);
void record_stream_on(const c10::DataPtr& ptr, c10::StreamId stream);
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);
void settle_all_pending(Device& d);       // waits for every async copy still writing into d's memory
extern std::atomic<int> g_pending_total;  // async copies in flight: the fast path steps aside while any is

// ------------------------------------------- generators, pinned memory (fl_generator.cpp, fl_pinned.cpp) ---

const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
c10::Allocator* pinned_allocator();
bool is_pinned(const void* data);

// ----------------------------------------------------------- write watch (fl_watch.cpp) ---

extern std::atomic<int64_t> g_watch_n;  // watched storages: while none, a write costs nothing
void note_write(const void* base);

// --------------------------------------------------------- kernel recorder (fl_trace.cpp) ---

struct TraceSpan {
  bool on = false;
  int index = 0;
  c10::StreamId stream = 0;
  int64_t t0 = 0;
  void* ev0 = nullptr;
};
TraceSpan trace_begin(int index);
void trace_end(TraceSpan& sp, const std::string& name);

// ------------------------------------------- kernels (fl_fallback.cpp's fast path, fl_graph.cpp) ---

// A kernel as the fast path and kernel graphs call it: a plugin kernel or host-C JIT kernel is a
// function; a device JIT kernel is the plugin's jit_launch with the handle jit_build gave.
static_assert(std::is_same_v<fl_core_launch_fn, decltype(fl_plugin_t::jit_launch)>,
              "fl_core.h's fl_core_launch_fn is fl_plugin.h's jit_launch");
struct KernelRef {
  fl_kernel_fn fn = nullptr;
  fl_core_launch_fn launch = nullptr;
  void* handle = nullptr;
  KernelRef() = default;
  KernelRef(fl_kernel_fn f, fl_core_launch_fn l, void* h) : fn(f), launch(l), handle(h) {}
  bool valid() const { return handle != nullptr ? launch != nullptr : fn != nullptr; }
  int operator()(fl_stream_t stream, int local, const fl_tensor_t* in, int n_in, const fl_tensor_t* out,
                 int n_out, const fl_arg_t* args, int n_args) const {
    if (handle != nullptr) return launch(handle, stream, local, in, n_in, out, n_out, args, n_args);
    return fn(stream, local, in, n_in, out, n_out, args, n_args);
  }
};

template <typename T>
std::vector<T> copy_of(const T* items, int32_t n) {
  return items != nullptr && n > 0 ? std::vector<T>(items, items + n) : std::vector<T>();
}

// A kernel call the core keeps (a fast-path plan, a graph step): fl_core.h's fl_core_kernel_call_t with its
// arrays copied.
struct KernelCall {
  KernelRef kernel;
  int local = 0;
  int64_t slot = -1;  // Python's counter slot for the op (-1: none)
  std::vector<fl_tensor_t> in, out;
  std::vector<fl_arg_t> args;
  explicit KernelCall(const fl_core_kernel_call_t& c)
      : kernel(c.fn, c.launch, c.handle),
        local(c.local),
        slot(c.slot),
        in(copy_of(c.inputs, c.n_inputs)),
        out(copy_of(c.outputs, c.n_outputs)),
        args(copy_of(c.args, c.n_args)) {}
};

// fl_graph.cpp: one replay of a kernel graph whose bound static inputs (fl_core_graph_bind_input) read the
// caller's tensors in place: base[k] is the storage data of the tensor for static input k, offset[k] its first
// byte in that storage; the other inputs are copied in from there. out_dst and *failed as fl_core_graph_replay's.
int graph_replay_in_place(fl_core_graph_t* graph, void* const* base, const int64_t* offset, void* const* out_dst,
                          int64_t* failed);

// The hash of a fast-path key (fl_fallback.cpp's KeyBuilder): the committed plans of every fast path are
// looked up by it.
struct KeyHash {
  size_t operator()(const std::vector<int64_t>& v) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

// Calls served without Python, per counter slot Python handed out (fl_core_fast_take_counts reads them).
struct CallCounts {
  std::mutex mu;
  std::vector<int64_t> per_slot;
  void reserve(int64_t slot) {
    if (slot < 0) return;
    std::lock_guard<std::mutex> lock(mu);
    grow(slot);
  }
  // One call served under each slot given (-1: none); every path served without Python counts here.
  void add(const int64_t* slots, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < n; ++i) {
      if (slots[i] < 0) continue;
      grow(slots[i]);
      per_slot[slots[i]]++;
    }
  }
  void add(int64_t slot) { add(&slot, 1); }

 private:
  void grow(int64_t slot) {
    if (static_cast<size_t>(slot) >= per_slot.size()) per_slot.resize(slot + 1, 0);
  }
};
extern CallCounts g_call_counts;

}  // namespace fl_core
#pragma GCC visibility pop
