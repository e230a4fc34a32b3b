// torch_fl's C++ core: makes fl tensors real PyTorch tensors on the PrivateUse1
// device whose storage is plugin memory.
//
// What lives here, and why in C++: the pieces PyTorch calls on every tensor
// without going through an operator, or so often that Python would dominate:
//   - the device table (global fl index -> plugin, local device), filled by Python;
//   - the device guard and PrivateUse1 hooks (current device, device count,
//     streams and events over the plugin's, pinned host memory, storage resize);
//   - a caching allocator over the plugin's malloc/free (size classes, a cap on
//     cached bytes, stats, an out-of-memory message that says what the pool held);
//   - the metadata ops every backend must provide (empty, empty_strided,
//     as_strided, view, _reshape_alias, resize_, set_, ...), which never touch
//     device memory except resize_ growing a storage;
//   - the boxed fallback for every other op: a call whose plan is a native
//     kernel runs from a per-signature cache without entering Python (the fast
//     path); everything else is handed to torch_fl's Python dispatcher, which
//     PyTorch reaches through the PrivateUse3 key (see fl_core_fallback).
// Plain C entry points (extern "C") are what Python calls, through ctypes; no
// Python API is used here, so the library depends on libtorch only.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/library.h>
#include <torch/version.h>

#include "fl_fallback.h"
#include "fl_plugin.h"
#include "fl_trace.h"

#define FL_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kAlign = 16;

// ---------------------------------------------------------------- devices ---

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

Device* g_devices[kMaxDevices] = {};
std::atomic<int> g_count{0};
std::atomic<int> g_default{0};
std::atomic<bool> g_pool_enabled{true};
thread_local int t_current = -1;

Device& device_at(int index) {
  TORCH_CHECK(index >= 0 && index < g_count.load() && g_devices[index] != nullptr,
              "fl:", index, " does not exist: ", g_count.load(), " fl device(s) are available "
              "(torch.fl.device_count()); pick one of them");
  return *g_devices[index];
}

int current_index() {
  int i = t_current >= 0 ? t_current : g_default.load();
  return i;
}

std::string plugin_error(const Device& d) {
  const char* msg = d.plugin->last_error ? d.plugin->last_error() : nullptr;
  return msg && *msg ? std::string(msg) : std::string("(the plugin left no message)");
}

void check_status(const Device& d, int status, const char* what) {
  TORCH_CHECK(status == FL_OK, "fl plugin ", d.label, " failed in ", what, " (status ", status, "): ",
              plugin_error(d));
}

std::string fmt_bytes(double n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(n) >= 1024 && u < 4) {
    n /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", n);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", n, units[u]);
  return buf;
}

// Blocks are cached and reused by size class: multiples of 16 bytes up to 512,
// of 512 bytes up to 1 MiB, then eight classes per power of two (at most
// 12.5 % slack), so tensors of nearby sizes share blocks.
size_t size_class(size_t n) {
  if (n <= 512) return (n + kAlign - 1) / kAlign * kAlign;
  if (n <= (size_t(1) << 20)) return (n + 511) / 512 * 512;
  int bits = 64 - __builtin_clzll(static_cast<unsigned long long>(n));
  size_t step = size_t(1) << (bits - 4);
  return (n + step - 1) / step * step;
}

// --------------------------------------------------------------- streams ---
// A stream id is what PyTorch's c10::Stream carries; the core maps it to the plugin's handle. The current
// stream is per thread and per device, as CUDA's is: kernels, copies and fills go to it.

constexpr size_t kStreamPool = 8;  // streams torch.Stream() hands out per device, in turn (CUDA keeps 32)
thread_local c10::StreamId t_stream[kMaxDevices] = {};
}  // namespace
// Streams made through the guard, all devices: while none is, every current stream is the default one,
// which Python's kernel calls read from here without a call into the core.
extern "C" {
__attribute__((visibility("default"))) volatile int64_t fl_core_streams_made = 0;
}
namespace {

fl_stream_t stream_handle(Device& d, c10::StreamId id) {
  if (id <= 0) return nullptr;
  std::lock_guard<std::mutex> lock(d.stream_mu);
  size_t k = static_cast<size_t>(id) - 1;
  return k < d.streams.size() ? d.streams[k] : nullptr;
}

c10::StreamId current_stream_id(int index) { return index >= 0 && index < kMaxDevices ? t_stream[index] : 0; }

fl_stream_t current_stream(Device& d, int index) {
  c10::StreamId id = current_stream_id(index);
  return id == 0 ? nullptr : stream_handle(d, id);
}

// A device-to-device copy on a stream. A device whose kernels complete within their call (no
// FL_FEATURE_ASYNC_KERNELS) runs the next kernel at once, so a copy it queued on a stream must land first.
int copy_d2d_on(Device& d, void* dst, const void* src, size_t n, fl_stream_t s) {
  int status = d.plugin->copy_d2d(d.local, dst, src, n, s);
  if (status == FL_OK && s != nullptr && !(d.features & FL_FEATURE_ASYNC_KERNELS) && d.plugin->stream_synchronize)
    status = d.plugin->stream_synchronize(d.local, s);
  return status;
}

// ------------------------------------------------------------- allocator ---

struct Block {
  void* ptr;
  int device;
  size_t size;
  c10::StreamId stream;             // the stream it was allocated on
  std::vector<c10::StreamId> uses;  // other streams that use it (record_stream)
};

std::atomic<int> g_pending_total{0};  // async copies in flight: the fast path steps aside while any is

void settle_pending_locked(Device& d, void* ptr) {
  auto it = d.pool.pending.find(ptr);
  if (it == d.pool.pending.end()) return;
  void* ev = it->second;
  d.pool.pending.erase(it);
  g_pending_total--;
  if (d.plugin->event_synchronize) d.plugin->event_synchronize(d.local, ev);
  if (d.plugin->event_destroy) d.plugin->event_destroy(d.local, ev);
}

// Gives a block back to the plugin. The plugin's free waits only for NULL-stream work (fl_plugin.h), so
// the block's own stream is drained first when it is another one.
void plugin_free_locked(Device& d, void* ptr, c10::StreamId stream) {
  fl_stream_t s = stream_handle(d, stream);
  if (s != nullptr && d.plugin->stream_synchronize) d.plugin->stream_synchronize(d.local, s);
  d.plugin->free(d.local, ptr);  // a failure here leaks the block: a deleter cannot throw
  d.pool.device_frees++;
}

void cache_or_free_locked(Device& d, void* ptr, size_t size, c10::StreamId stream) {
  if (g_pool_enabled.load() && d.pool.cached + static_cast<int64_t>(size) <= d.pool.limit) {
    d.pool.free_blocks[{stream, size}].push_back(ptr);
    d.pool.cached += static_cast<int64_t>(size);
  } else {
    plugin_free_locked(d, ptr, stream);
  }
}

void destroy_events_locked(Device& d, const std::vector<void*>& events) {
  if (d.plugin->event_destroy)
    for (void* ev : events) d.plugin->event_destroy(d.local, ev);
}

// Moves the deferred blocks whose streams are done into the cache (wait: waits for all of them).
void settle_deferred_locked(Device& d, bool wait) {
  if (d.pool.deferred.empty()) return;
  std::vector<Deferred> keep;
  for (Deferred& df : d.pool.deferred) {
    bool done = true;
    for (void* ev : df.events) {
      if (wait) {
        if (d.plugin->event_synchronize) d.plugin->event_synchronize(d.local, ev);
      } else if (d.plugin->event_query) {
        int finished = 1;
        if (d.plugin->event_query(d.local, ev, &finished) != FL_OK) finished = 1;  // a failed stream holds nothing
        if (!finished) {
          done = false;
          break;
        }
      }
    }
    if (!done) {
      keep.push_back(std::move(df));
      continue;
    }
    destroy_events_locked(d, df.events);
    d.pool.cached -= static_cast<int64_t>(df.size);
    cache_or_free_locked(d, df.ptr, df.size, df.stream);
  }
  d.pool.deferred = std::move(keep);
}

void free_cached_locked(Device& d) {
  settle_deferred_locked(d, true);
  for (auto& kv : d.pool.free_blocks)
    for (void* p : kv.second) plugin_free_locked(d, p, kv.first.first);
  d.pool.free_blocks.clear();
  d.pool.cached = 0;
}

void release_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  Device* d = (b->device >= 0 && b->device < kMaxDevices) ? g_devices[b->device] : nullptr;
  if (d != nullptr) {
    std::lock_guard<std::mutex> lock(d->pool.mu);
    settle_pending_locked(*d, b->ptr);  // an async copy must land before the memory is reused
    d->pool.allocated -= static_cast<int64_t>(b->size);
    d->pool.allocations -= 1;
    if (b->uses.empty()) {
      cache_or_free_locked(*d, b->ptr, b->size, b->stream);
    } else {
      // other streams may still read or write it: an event on each marks where their use ends
      Deferred df{b->ptr, b->size, b->stream, {}};
      for (c10::StreamId id : b->uses) {
        fl_stream_t s = stream_handle(*d, id);
        void* ev = nullptr;
        bool marked = d->plugin->event_create && d->plugin->event_record && d->plugin->event_query &&
                      d->plugin->event_create(d->local, &ev) == FL_OK;
        if (marked && d->plugin->event_record(d->local, ev, s) == FL_OK) {
          df.events.push_back(ev);
          continue;
        }
        if (ev != nullptr && d->plugin->event_destroy) d->plugin->event_destroy(d->local, ev);
        if (d->plugin->stream_synchronize) d->plugin->stream_synchronize(d->local, s);  // no events: wait now
      }
      d->pool.cached += static_cast<int64_t>(b->size);  // reserved, not yet reusable
      d->pool.deferred.push_back(std::move(df));
    }
  }
  delete b;
}

// Tensor.record_stream(s): the block's memory is in use on s too, so freeing it waits for s's work.
void record_stream_on(const c10::DataPtr& ptr, c10::StreamId stream) {
  if (ptr.get_deleter() != &release_block) return;  // an empty tensor, or memory the pool does not own
  auto* b = static_cast<Block*>(ptr.get_context());
  Device* d = (b->device >= 0 && b->device < kMaxDevices) ? g_devices[b->device] : nullptr;
  if (d == nullptr) return;
  std::lock_guard<std::mutex> lock(d->pool.mu);
  if (stream == b->stream) return;
  for (c10::StreamId id : b->uses)
    if (id == stream) return;
  b->uses.push_back(stream);
}

void noop_delete(void*) {}

c10::DataPtr allocate_on(int index, size_t nbytes) {
  c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
  Device& d = device_at(index);
  if (nbytes == 0) return {nullptr, nullptr, &noop_delete, where};
  TORCH_CHECK(nbytes <= (size_t(1) << 62), "fl:", index, " cannot allocate ", nbytes, " bytes");
  size_t size = size_class(nbytes);
  c10::StreamId stream = current_stream_id(index);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(d.pool.mu);
    d.pool.alloc_requests++;
    settle_deferred_locked(d, false);
    auto it = d.pool.free_blocks.find({stream, size});
    if (it != d.pool.free_blocks.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      d.pool.cached -= static_cast<int64_t>(size);
      d.pool.hits++;
    } else {
      d.pool.misses++;
      int status = d.plugin->malloc(d.local, size, &ptr);
      int64_t flushed = 0;
      if (status == FL_ERR_OOM && d.pool.cached > 0) {  // cached blocks of other sizes may make room
        flushed = d.pool.cached;
        free_cached_locked(d);
        d.pool.retries++;
        status = d.plugin->malloc(d.local, size, &ptr);
      }
      if (status == FL_ERR_OOM) {
        d.pool.ooms++;
        std::string pool = flushed ? "the pool held " + fmt_bytes(flushed) +
                                         " of cached blocks and gave them back before retrying"
                                   : std::string("the pool held no cached blocks");
        TORCH_CHECK_WITH(OutOfMemoryError, false, d.label, " out of memory: tried to allocate ", fmt_bytes(size),
                         "; ", fmt_bytes(d.pool.allocated), " allocated by live tensors in ", d.pool.allocations,
                         " buffers; ", pool, "; device capacity ", fmt_bytes(d.total),
                         ". Free tensors (del, then gc.collect()) or use a smaller batch. Plugin said: ",
                         plugin_error(d));
      }
      check_status(d, status, "malloc");
      TORCH_CHECK(ptr != nullptr, "fl plugin ", d.label, " broke the malloc contract: it returned FL_OK with a NULL "
                  "pointer for ", size, " bytes (fl_plugin.h: malloc returns a valid pointer or an error status); "
                  "fix the plugin");
      d.pool.device_allocs++;
    }
    d.pool.allocated += static_cast<int64_t>(size);
    d.pool.allocations += 1;
    if (d.pool.allocated > d.pool.peak) d.pool.peak = d.pool.allocated;
  }
  return {ptr, new Block{ptr, index, size, stream, {}}, &release_block, where};
}

struct FlAllocator final : public c10::DeviceAllocator {
  c10::DataPtr allocate(size_t n) override { return allocate_on(current_index(), n); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count == 0) return;
    int i = current_index();
    Device& d = device_at(i);
    check_status(d, copy_d2d_on(d, dest, src, count, current_stream(d, i)), "copy_d2d");
  }
  bool initialized() override { return g_count.load() > 0; }
  void emptyCache(c10::MempoolId_t) override {
    for (int i = 0; i < g_count.load(); ++i) {
      if (!g_devices[i]) continue;
      std::lock_guard<std::mutex> lock(g_devices[i]->pool.mu);
      free_cached_locked(*g_devices[i]);
    }
  }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override { record_stream_on(ptr, stream.id()); }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    Device& d = device_at(index);
    std::lock_guard<std::mutex> lock(d.pool.mu);
    c10::CachingDeviceAllocator::DeviceStats s;
    auto set = [](c10::CachingAllocator::StatArray& a, int64_t cur, int64_t peak) {
      for (auto& st : a) {
        st.current = cur;
        st.peak = peak;
      }
    };
    set(s.allocated_bytes, d.pool.allocated, d.pool.peak);
    set(s.active_bytes, d.pool.allocated, d.pool.peak);
    set(s.requested_bytes, d.pool.allocated, d.pool.peak);
    set(s.reserved_bytes, d.pool.allocated + d.pool.cached, d.pool.peak + d.pool.cached);
    set(s.allocation, d.pool.allocations, d.pool.allocations);
    set(s.active, d.pool.allocations, d.pool.allocations);
    s.num_alloc_retries = d.pool.retries;
    s.num_ooms = d.pool.ooms;
    s.num_device_alloc = d.pool.device_allocs;
    s.num_device_free = d.pool.device_frees;
    return s;
  }
  void resetAccumulatedStats(c10::DeviceIndex index) override {
    Device& d = device_at(index);
    std::lock_guard<std::mutex> lock(d.pool.mu);
    d.pool.hits = d.pool.misses = d.pool.retries = d.pool.ooms = 0;
  }
  void resetPeakStats(c10::DeviceIndex index) override {
    Device& d = device_at(index);
    std::lock_guard<std::mutex> lock(d.pool.mu);
    d.pool.peak = d.pool.allocated;
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    Device& d = device_at(index);
    uint64_t used = 0;
    if (d.plugin->memory_used) check_status(d, d.plugin->memory_used(d.local, &used), "memory_used");
    uint64_t free_bytes = d.total > used ? d.total - used : 0;
    return {static_cast<size_t>(free_bytes), static_cast<size_t>(d.total)};
  }
};
FlAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

// Grows (or shrinks) a storage to nbytes on its device, keeping its first bytes:
// resize_ and UntypedStorage.resize_ (PyTorch's CPU version would memcpy device memory).
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  int index = storage.device().index();
  size_t old = storage.nbytes();
  c10::DataPtr fresh = allocate_on(index, nbytes);
  size_t keep = std::min(old, nbytes);
  if (keep > 0 && storage.data() != nullptr) {
    Device& d = device_at(index);
    check_status(d, copy_d2d_on(d, fresh.get(), storage.data(), keep, current_stream(d, index)), "copy_d2d (resize)");
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(nbytes);
}

// ----------------------------------------------------------------- guard ---

// An event: the plugin's (when it has events) and the host time it was recorded at. elapsed_time asks the
// plugin (event_elapsed: device time, what an asynchronous device must give); a plugin without it runs
// its kernels before their call returns, so the host times are the device's.
struct FlEvent {
  void* plugin_event = nullptr;
  int device = 0;
  std::chrono::steady_clock::time_point when{};
};

// Waits for every async copy still writing into the device's memory (what synchronize promises).
void settle_all_pending(Device& d) {
  std::lock_guard<std::mutex> lock(d.pool.mu);
  std::vector<void*> ptrs;
  for (auto& kv : d.pool.pending) ptrs.push_back(kv.first);
  for (void* p : ptrs) settle_pending_locked(d, p);
}


struct FlGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current_index()));
  }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) t_current = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) t_current = d.index();
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    int i = d.index() >= 0 ? d.index() : current_index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, i), current_stream_id(i));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  // torch.Stream(device="fl"): a stream of the device's pool, as torch.cuda.Stream() takes one of CUDA's. A
  // plugin stream may be a thread or a queue, so a loop that makes a stream per step reuses kStreamPool of
  // them in turn rather than making thousands.
  c10::Stream getNewStream(c10::Device dev, int priority = 0) const override {
    (void)priority;
    int i = dev.index() >= 0 ? dev.index() : current_index();
    Device& d = device_at(i);
    c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(i));
    std::lock_guard<std::mutex> lock(d.stream_mu);
    if (d.streams.size() >= kStreamPool)
      return c10::Stream(c10::Stream::UNSAFE, where,
                         static_cast<c10::StreamId>(d.next_stream++ % d.streams.size() + 1));
    fl_stream_t s = nullptr;  // a plugin without streams runs everything in order: a distinct id still
    if (d.plugin->stream_create) check_status(d, d.plugin->stream_create(d.local, &s), "stream_create");
    d.streams.push_back(s);
    fl_core_streams_made = fl_core_streams_made + 1;
    return c10::Stream(c10::Stream::UNSAFE, where, static_cast<c10::StreamId>(d.streams.size()));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority = false) const override {
    return getNewStream(d, high_priority ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    c10::Stream old = getStream(s.device());
    int i = s.device_index();
    if (i >= 0 && i < kMaxDevices) t_stream[i] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    int n = g_count.load();
    return static_cast<c10::DeviceIndex>(n > 0 ? n : 1);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    int i = device_index >= 0 ? device_index : stream.device_index();
    Device& d = device_at(i);
    auto* ev = static_cast<FlEvent*>(*event);
    if (ev == nullptr) {
      ev = new FlEvent();
      ev->device = i;
      if (d.plugin->event_create && d.plugin->event_record)
        check_status(d, d.plugin->event_create(d.local, &ev->plugin_event), "event_create");
      *event = ev;
    }
    if (ev->plugin_event)
      check_status(d, d.plugin->event_record(d.local, ev->plugin_event, stream_handle(d, stream.id())), "event_record");
    ev->when = std::chrono::steady_clock::now();
  }
  void wait_event(const FlEvent* ev) const {
    Device& d = device_at(ev->device);
    if (ev->plugin_event && d.plugin->event_synchronize)
      check_status(d, d.plugin->event_synchronize(d.local, ev->plugin_event), "event_synchronize");
  }
  // stream.wait_event(e), stream.wait_stream(other): later work on the stream waits for the event on the
  // device (ABI v2's stream_wait_event), the host going on at once; without that call the host waits, which
  // orders the work as well.
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    auto* ev = static_cast<FlEvent*>(event);
    Device& d = device_at(ev->device);
    if (ev->plugin_event && d.plugin->stream_wait_event && stream.device_index() == ev->device) {
      check_status(d, d.plugin->stream_wait_event(d.local, stream_handle(d, stream.id()), ev->plugin_event),
                   "stream_wait_event");
      return;
    }
    wait_event(ev);
  }
  bool queryEvent(void* event) const override {
    auto* ev = static_cast<FlEvent*>(event);
    if (ev == nullptr || ev->plugin_event == nullptr) return true;
    Device& d = device_at(ev->device);
    if (!d.plugin->event_query) return true;
    int done = 1;
    check_status(d, d.plugin->event_query(d.local, ev->plugin_event, &done), "event_query");
    return done != 0;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    auto* ev = static_cast<FlEvent*>(event);
    if (ev == nullptr) return;
    if (ev->plugin_event && ev->device >= 0 && ev->device < g_count.load() && g_devices[ev->device]) {
      Device& d = *g_devices[ev->device];
      if (d.plugin->event_destroy) d.plugin->event_destroy(d.local, ev->plugin_event);
    }
    delete ev;
  }
  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    auto* ev = static_cast<FlEvent*>(event);
    wait_event(ev);
    settle_all_pending(device_at(ev->device));
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<FlEvent*>(start);
    auto* b = static_cast<FlEvent*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr, "elapsed_time: both events must be recorded first");
    TORCH_CHECK(a->device == b->device, "elapsed_time: the events were recorded on different devices (fl:",
                a->device, " and fl:", b->device, "); time work on one device with events of that device");
    wait_event(a);
    wait_event(b);
    Device& d = device_at(a->device);
    if (d.plugin->event_elapsed && a->plugin_event && b->plugin_event) {
      double ms = 0;
      check_status(d, d.plugin->event_elapsed(d.local, a->plugin_event, b->plugin_event, &ms), "event_elapsed");
      return ms;
    }
    return std::chrono::duration<double, std::milli>(b->when - a->when).count();
  }
  // Whether the stream's work is done, without waiting: an event recorded at its end, queried.
  bool queryStream(const c10::Stream& stream) const override {
    Device& d = device_at(stream.device_index());
    // a device whose kernels run within their call: the runtime waits for any copy it queues on a stream
    if (!(d.features & FL_FEATURE_ASYNC_KERNELS)) return true;
    if (!(d.plugin->event_create && d.plugin->event_record && d.plugin->event_query && d.plugin->event_destroy))
      return true;  // no events: the plugin's work completes within its calls
    void* ev = nullptr;
    check_status(d, d.plugin->event_create(d.local, &ev), "event_create");
    int done = 1;
    int status = d.plugin->event_record(d.local, ev, stream_handle(d, stream.id()));
    if (status == FL_OK) status = d.plugin->event_query(d.local, ev, &done);
    std::string msg = status == FL_OK ? std::string() : plugin_error(d);
    d.plugin->event_destroy(d.local, ev);
    TORCH_CHECK(status == FL_OK, "fl plugin ", d.label, " failed in stream query (status ", status, "): ", msg);
    return done != 0;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    Device& d = device_at(stream.device_index());
    fl_stream_t s = stream_handle(d, stream.id());
    if (d.plugin->stream_synchronize) check_status(d, d.plugin->stream_synchronize(d.local, s), "stream_synchronize");
    settle_all_pending(d);
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    Device& d = device_at(index >= 0 ? index : current_index());
    settle_all_pending(d);
    if (d.plugin->synchronize) check_status(d, d.plugin->synchronize(d.local), "synchronize");
  }
  void recordDataPtrOnStream(const c10::DataPtr& ptr, const c10::Stream& stream) const override {
    record_stream_on(ptr, stream.id());
  }
};
FlGuard g_guard;

// ------------------------------------------------------ pinned host memory ---
// PyTorch asks the PrivateUse1 hooks for a host allocator (Tensor.pin_memory(),
// DataLoader(pin_memory=True)). Blocks come from the default device's plugin when it
// has host_alloc (page-locked memory its copies can use asynchronously; ABI v2), else
// they are 64-byte aligned host memory. The allocator remembers each block (its size
// and the plugin that gave it, which must take it back), so is_pinned() can answer;
// torch_fl copies from them asynchronously on devices that declare FL_FEATURE_ASYNC_COPY.

struct PinnedBlock {
  size_t size;
  int device;  // the fl device whose plugin's host_alloc gave it, or -1 for posix_memalign
};
std::mutex g_pin_mutex;
std::map<uintptr_t, PinnedBlock> g_pinned;

void pinned_free(void* p) {
  if (!p) return;
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(g_pin_mutex);
    auto it = g_pinned.find(reinterpret_cast<uintptr_t>(p));
    if (it != g_pinned.end()) {
      device = it->second.device;
      g_pinned.erase(it);
    }
  }
  if (device >= 0 && device < g_count.load() && g_devices[device] && g_devices[device]->plugin->host_free) {
    Device& d = *g_devices[device];
    d.plugin->host_free(d.local, p);  // a deleter cannot throw: a failure leaks the block
    return;
  }
  std::free(p);
}

struct PinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    int device = -1;
    if (n > 0) {
      int i = g_default.load();
      if (i >= 0 && i < g_count.load() && g_devices[i] && g_devices[i]->plugin->host_alloc) {
        Device& d = *g_devices[i];
        check_status(d, d.plugin->host_alloc(d.local, n, &p), "host_alloc");
        TORCH_CHECK(p != nullptr, "fl plugin ", d.label, " broke the host_alloc contract: FL_OK with a NULL "
                    "pointer; fix the plugin");
        device = i;
      } else {
        TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&p, 64, n) == 0, "torch_fl: cannot allocate ", n,
                         " bytes of pinned host memory");
      }
      std::lock_guard<std::mutex> lock(g_pin_mutex);
      g_pinned[reinterpret_cast<uintptr_t>(p)] = PinnedBlock{n, device};
    }
    return {p, p, &pinned_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &pinned_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};
PinnedAllocator g_pinned_allocator;

bool is_pinned(const void* data) {
  auto a = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(g_pin_mutex);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a >= it->first && a < it->first + it->second.size;
}

// ------------------------------------------------------------ generators ---
// A generator is a (seed, offset) pair of the plugin's counter-based RNG (fl_plugin.h, rng_set_state). A
// device's default generator IS the plugin's own state, read and written through, so torch.manual_seed,
// torch.fl.manual_seed and torch.fl.default_generators agree. A generator made by torch.Generator("fl")
// keeps a pair of its own: the Python dispatcher swaps it into the plugin around a kernel it was passed to
// (dispatch/plan.py), then stores the advanced offset back with set_offset. get_state()/set_state() use
// torch.fl.get_rng_state()'s 24-byte layout: int64 {seed & (2^63 - 1), seed >> 63, offset}.

constexpr uint64_t kDefaultSeed = 67280421310721ull;  // c10's default_rng_seed_val

struct FlGenerator final : public c10::GeneratorImpl {
  FlGenerator(c10::DeviceIndex index, bool is_default)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        is_default_(is_default) {}

  void set_current_seed(uint64_t seed) override { put(seed, 0); }
  uint64_t current_seed() const override { return get().first; }
  void set_offset(uint64_t offset) override { put(get().first, offset); }
  uint64_t get_offset() const override { return get().second; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    put(s, 0);
    return s;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == 24 &&
                    state.device().is_cpu(),
                "the fl generator state must be a CPU uint8 tensor of 24 bytes, as get_state() returns "
                "(got ", state.dtype().name(), " with ", state.numel(), " elements on ", state.device(), ")");
    int64_t v[3];
    std::memcpy(v, static_cast<const char*>(state.data()), sizeof v);
    put(static_cast<uint64_t>(v[0]) | (static_cast<uint64_t>(v[1]) << 63), static_cast<uint64_t>(v[2]));
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto [seed, offset] = get();
    at::Tensor t = at::detail::empty_cpu({24}, c10::ScalarType::Byte, std::nullopt, std::nullopt, std::nullopt,
                                         std::nullopt);
    int64_t v[3] = {static_cast<int64_t>(seed & 0x7FFFFFFFFFFFFFFFull), static_cast<int64_t>(seed >> 63),
                    static_cast<int64_t>(offset)};
    std::memcpy(t.data_ptr(), v, sizeof v);
    return t.getIntrusivePtr();
  }

 private:
  FlGenerator* clone_impl() const override {
    auto* g = new FlGenerator(device().index(), false);
    auto [seed, offset] = get();
    g->put(seed, offset);
    return g;
  }
  const fl_plugin_t* rng_plugin(int* local) const {
    if (!is_default_) return nullptr;
    Device& d = device_at(device().index());
    *local = d.local;
    return d.plugin->rng_get_state && d.plugin->rng_set_state ? d.plugin : nullptr;
  }
  std::pair<uint64_t, uint64_t> get() const {
    int local = 0;
    if (const fl_plugin_t* p = rng_plugin(&local)) {
      uint64_t seed = 0, offset = 0;
      check_status(device_at(device().index()), p->rng_get_state(local, &seed, &offset), "rng_get_state");
      return {seed, offset};
    }
    return {seed_, offset_};
  }
  void put(uint64_t seed, uint64_t offset) {
    int local = 0;
    if (const fl_plugin_t* p = rng_plugin(&local)) {
      check_status(device_at(device().index()), p->rng_set_state(local, seed, offset), "rng_set_state");
      return;
    }
    seed_ = seed;
    offset_ = offset;
  }

  bool is_default_;
  uint64_t seed_ = kDefaultSeed, offset_ = 0;
};

std::mutex g_gen_mu;
std::vector<at::Generator> g_default_gens;

const at::Generator& default_generator(c10::DeviceIndex index) {
  int i = index < 0 ? current_index() : index;
  device_at(i);  // says which devices exist
  std::lock_guard<std::mutex> lock(g_gen_mu);
  if (g_default_gens.size() < static_cast<size_t>(kMaxDevices)) g_default_gens.resize(kMaxDevices);
  if (!g_default_gens[i].defined()) {
    g_default_gens[i] = at::make_generator<FlGenerator>(static_cast<c10::DeviceIndex>(i), true);
  }
  return g_default_gens[i];
}

struct FlHooks final : public at::PrivateUse1HooksInterface {
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    int i = index < 0 ? current_index() : index;
    device_at(i);
    return at::make_generator<FlGenerator>(static_cast<c10::DeviceIndex>(i), false);
  }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_count.load() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return g_guard.deviceCount(); }
  c10::DeviceIndex getCurrentDevice() const override { return g_guard.getDevice().index(); }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    g_guard.setDevice(c10::Device(c10::DeviceType::PrivateUse1, d));
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    return g_guard.exchangeDevice(c10::Device(c10::DeviceType::PrivateUse1, d)).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
};
FlHooks* g_hooks = nullptr;

// ---------------------------------------------------------- metadata ops ---

constexpr c10::DispatchKeySet kFlKeys(c10::DispatchKey::PrivateUse1);

c10::Device target_device(std::optional<c10::Device> device_opt) {
  c10::Device d = c10::device_or_default(device_opt);
  if (d.index() < 0) d = g_guard.getDevice();
  return d;
}

void check_factory_options(std::optional<c10::Layout> layout_opt, std::optional<bool> pin_memory_opt) {
  TORCH_CHECK(c10::layout_or_default(layout_opt) == c10::Layout::Strided,
              "fl tensors are strided: create a ", c10::layout_or_default(layout_opt),
              " tensor on the CPU, or a strided one on fl");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory_opt),
              "pin_memory=True is for CPU tensors that will be copied to fl; fl tensors cannot be pinned");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype_opt,
                               std::optional<c10::Layout> layout_opt, std::optional<c10::Device> device_opt,
                               std::optional<bool> pin_memory_opt, std::optional<c10::MemoryFormat> memory_format_opt) {
  check_factory_options(layout_opt, pin_memory_opt);
  const c10::DeviceGuard guard(target_device(device_opt));
  return at::detail::empty_generic(size, &g_allocator, kFlKeys, c10::dtype_or_default(dtype_opt), memory_format_opt);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype_opt,
                         std::optional<c10::Layout> layout_opt, std::optional<c10::Device> device_opt,
                         std::optional<bool> pin_memory_opt) {
  check_factory_options(layout_opt, pin_memory_opt);
  const c10::DeviceGuard guard(target_device(device_opt));
  return at::detail::empty_strided_generic(size, stride, &g_allocator, kFlKeys, c10::dtype_or_default(dtype_opt));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// New sizes (contiguous in the given memory format); the storage grows on the
// device when it is too small, keeping its bytes, as resize_ does on CUDA.
// Tensor.record_stream(s): the caching pool then reuses the block only after s's work at the free is done.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1 && stream.device_index() == self.get_device(),
              "record_stream: the stream is on ", stream.device(), ", the tensor on ", self.device(),
              "; record a stream of the tensor's own device");
  if (self.storage().data_ptr().get() != nullptr) g_allocator.recordStream(self.storage().data_ptr(), stream);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  at::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(sizes);
  auto mf = memory_format.value_or(c10::MemoryFormat::Contiguous);
  if (mf != c10::MemoryFormat::Preserve) impl->empty_tensor_restride(mf);
  if (impl->numel() > 0) {
    size_t need = at::detail::computeStorageNbytes(sizes, impl->strides(), self.dtype().itemsize(),
                                                   impl->storage_offset());
    const c10::Storage& storage = impl->unsafe_storage();
    if (need > storage.nbytes()) resize_storage_bytes(storage, need);
  }
  return self;
}

void check_in_bounds(const c10::Storage& storage, int64_t offset, c10::IntArrayRef size, c10::IntArrayRef stride,
                     const caffe2::TypeMeta& dtype) {
  TORCH_CHECK(offset >= 0, "Tensor: invalid storage offset ", offset);
  bool empty = false;
  for (auto s : size) empty = empty || s == 0;
  if (empty) return;
  size_t need = at::detail::computeStorageNbytes(size, stride, dtype.itemsize(), offset);
  TORCH_CHECK(need <= storage.nbytes(), "setStorage: sizes ", size, ", strides ", stride, ", storage offset ", offset,
              ", and itemsize ", dtype.itemsize(), " requiring a storage size of ", need,
              " are out of bounds for storage of size ", storage.nbytes());
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "set_: an fl tensor can only take the storage of another fl tensor, not of a ", source.device(),
              " one");
  std::vector<int64_t> st;
  if (stride.data() == nullptr || stride.empty() != size.empty()) {
    st.resize(size.size());
    int64_t acc = 1;
    for (int64_t i = static_cast<int64_t>(size.size()) - 1; i >= 0; --i) {
      st[i] = acc;
      acc *= std::max<int64_t>(size[i], 1);
    }
    stride = st;
  }
  check_in_bounds(source, storage_offset, size, stride, self.dtype());
  at::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_sizes_and_strides(size, stride, storage_offset);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {1});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  TORCH_CHECK(self.dtype() == source.dtype(), "set_: expected the source tensor to have dtype ", self.dtype(),
              " but got ", source.dtype());
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage fresh(c10::Storage::use_byte_size_t(), 0, &g_allocator, true);
  return set_storage(self, std::move(fresh), 0, {0}, {1});
}

// Module conversion (nn.Module._apply) keeps a Parameter object, and so tied
// weights, only when the converted tensor's type is shallow-copy compatible:
// c10's list of dense backends leaves PrivateUse1 out, so say it here for
// strided CPU and fl tensors.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::Layout::Strided &&
           (t.device().type() == c10::DeviceType::CPU || t.device().type() == c10::DeviceType::PrivateUse1) &&
           !t.is_quantized();
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

// ----------------------------------------------------------- write watch ---
// A write generation per watched storage. Caches of values derived from weights (a folded Conv+BN, packed
// QKV weights, channels-last weight copies: torch_fl/compile) watch the weights' storages: every op that
// writes into an fl tensor bumps its storage's generation, through whichever alias it was written (p.data,
// a view), which a tensor's _version cannot see (p.data has a version counter of its own). The fast path
// bumps it here; the Python dispatcher through fl_core_note_write.
std::mutex g_watch_mu;
std::unordered_map<const void*, std::pair<int64_t, uint64_t>> g_watch;  // storage base -> (watchers, generation)
std::atomic<int64_t> g_watch_n{0};

}  // namespace
// Writes into any watched storage so far: a cache reads it (ctypes, no call) and looks at its own storages'
// generations only when it moved.
extern "C" {
__attribute__((visibility("default"))) volatile uint64_t fl_core_watched_writes = 0;
}
namespace {

void note_write(const void* base) {
  if (base == nullptr || g_watch_n.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(g_watch_mu);
  auto it = g_watch.find(base);
  if (it != g_watch.end()) {
    it->second.second++;
    fl_core_watched_writes = fl_core_watched_writes + 1;
  }
}

// ------------------------------------------------------------- fallback ---
// Every op without a kernel above reaches this boxed fallback. The Python
// dispatcher decides each op signature's plan once; when the plan was a native
// kernel called on the op's own arguments, Python commits the call's marshalling
// here (fl_core_fast_commit) and later calls with the same signature run from
// this cache: descriptors patched with the new data pointers and floats, fresh
// outputs allocated, the plugin kernel called, no Python. Everything else goes
// to the Python dispatcher, which Python registers as the fallback of the
// otherwise unused PrivateUse3 key (so no Python API is needed here).

// What a call's marshalling depends on besides the values the fast path patches
// (data pointers, storage offsets, floats): the op, each tensor's device, dtype,
// sizes, strides, math bits and which earlier argument it aliases, and the
// value of every other argument.
struct KeyBuilder {
  std::vector<int64_t> k;
  std::vector<const void*> bases;  // storage base of every tensor seen, in order
  std::vector<int64_t> offsets;    // and its storage offset
  bool ok = true;

  void tensor(const at::Tensor& t, int64_t tag) {
    if (!t.defined()) {
      k.push_back(-7);
      return;
    }
    k.push_back(tag);
    const auto dev = t.device();
    if (dev.type() == c10::DeviceType::PrivateUse1) {
      k.push_back(dev.index());
    } else if (dev.type() == c10::DeviceType::CPU && t.dim() == 0) {
      k.push_back(-1000 - static_cast<int64_t>(t.unsafeGetTensorImpl()->is_wrapped_number()));
    } else {
      ok = false;  // a CPU tensor in an fl op: the Python dispatcher says what is wrong
      return;
    }
    k.push_back(static_cast<int64_t>(t.scalar_type()));
    k.push_back(t.dim());
    for (auto s : t.sizes()) k.push_back(s);
    for (auto s : t.strides()) k.push_back(s);
    k.push_back((t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0));
    // aliasing: the index of an earlier tensor with the same storage, and the offset between them: the
    // same key then means the same overlap, which the Python path judged when it committed the plan
    const void* base = t.storage().data();
    int64_t alias = -1;
    if (base != nullptr && dev.type() == c10::DeviceType::PrivateUse1) {
      for (size_t i = 0; i < bases.size(); ++i) {
        if (bases[i] == base) {
          alias = static_cast<int64_t>(i);
          break;
        }
      }
    }
    k.push_back(alias);
    k.push_back(alias >= 0 ? t.storage_offset() - offsets[alias] : 0);
    bases.push_back(dev.type() == c10::DeviceType::PrivateUse1 ? base : nullptr);
    offsets.push_back(t.storage_offset());
  }

  void value(const c10::IValue& v) {
    if (v.isTensor()) {
      tensor(v.toTensor(), -1);
    } else if (v.isNone()) {
      k.push_back(-2);
    } else if (v.isDouble()) {
      k.push_back(-3);  // patched per call
    } else if (v.isInt()) {
      k.push_back(-4);
      k.push_back(v.toInt());
    } else if (v.isBool()) {
      k.push_back(-5);
      k.push_back(v.toBool());
    } else if (v.isIntList()) {
      auto l = v.toIntList();
      k.push_back(-6);
      k.push_back(static_cast<int64_t>(l.size()));
      for (auto x : l) k.push_back(x);
    } else if (v.isTensorList()) {
      auto l = v.toTensorList();
      k.push_back(-8);
      k.push_back(static_cast<int64_t>(l.size()));
      for (const at::Tensor& x : l) tensor(x, -9);
    } else if (v.isScalar()) {
      auto sc = v.toScalar();
      if (sc.isFloatingPoint()) {
        k.push_back(-10);
      } else if (sc.isBoolean()) {
        k.push_back(-11);
        k.push_back(sc.toBool());
      } else if (sc.isIntegral(false)) {
        k.push_back(-12);
        k.push_back(sc.toLong());
      } else {
        ok = false;
      }
    } else if (v.isString()) {
      k.push_back(-13);
      for (char c : v.toStringRef()) k.push_back(c);
      k.push_back(0);
    } else {
      ok = false;  // generators, devices, layouts ...: the Python path
    }
  }
};

struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) {
      h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

struct Patch {
  int32_t arg;    // index into the args array
  int32_t stack;  // the stack value it comes from
  int32_t kind;   // 0: double, 1: wrapped number (0-dim CPU tensor), 2: Scalar; | 4: a float rounded to float32
                  // (an op computing in complex64: PyTorch's kernels cast the scalar to complex<float>)
};

// -------------------------------------------------------------- tracing ---
// While torch.profiler records the fl device (fl_kineto.cpp), each kernel launch is recorded: on a device
// whose kernels run after their call returns, with plugin events around it on its stream (device time,
// resolved when the trace stops against a base event); elsewhere with the host clock around the call.

}  // namespace
extern "C" {
__attribute__((visibility("default"))) volatile int fl_core_tracing = 0;  // Python reads it
}
namespace {

std::mutex g_trace_mu;
std::vector<fl_trace::Kernel> g_traced;
std::vector<std::pair<void*, void*>> g_traced_events;  // per record: its plugin events (or nulls)
struct TraceBase {
  void* event = nullptr;
  int64_t host_ns = 0;
};
TraceBase g_trace_base[kMaxDevices];
thread_local std::vector<uint64_t> t_correlation;

int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool device_timed(const Device& d) {
  return (d.features & FL_FEATURE_ASYNC_KERNELS) && d.plugin->event_create && d.plugin->event_record &&
         d.plugin->event_elapsed && d.plugin->event_synchronize && d.plugin->event_destroy;
}

struct TraceSpan {
  bool on = false;
  int index = 0;
  c10::StreamId stream = 0;
  int64_t t0 = 0;
  void* ev0 = nullptr;
};

TraceSpan trace_begin(int index) {
  TraceSpan sp;
  if (!fl_core_tracing || index < 0 || index >= kMaxDevices || !g_devices[index]) return sp;
  Device& d = *g_devices[index];
  sp.on = true;
  sp.index = index;
  sp.stream = current_stream_id(index);
  if (device_timed(d) && g_trace_base[index].event && d.plugin->event_create(d.local, &sp.ev0) == FL_OK)
    d.plugin->event_record(d.local, sp.ev0, stream_handle(d, sp.stream));
  sp.t0 = unix_ns();
  return sp;
}

void trace_end(TraceSpan& sp, const std::string& name) {
  if (!sp.on) return;
  Device& d = *g_devices[sp.index];
  void* ev1 = nullptr;
  if (sp.ev0 && d.plugin->event_create(d.local, &ev1) == FL_OK)
    d.plugin->event_record(d.local, ev1, stream_handle(d, sp.stream));
  int64_t t1 = unix_ns();
  uint64_t corr = t_correlation.empty() ? 0 : t_correlation.back();
  std::lock_guard<std::mutex> lock(g_trace_mu);
  if (!fl_core_tracing) {  // the trace stopped meanwhile
    if (sp.ev0) d.plugin->event_destroy(d.local, sp.ev0);
    if (ev1) d.plugin->event_destroy(d.local, ev1);
    return;
  }
  g_traced.push_back({name, sp.index, sp.stream, sp.t0, t1, corr, sp.ev0 && ev1});
  g_traced_events.push_back({sp.ev0, ev1});
}

// A kernel as the fast path and kernel graphs call it: a plugin kernel or host-C JIT kernel is a
// function; a device JIT kernel is the plugin's jit_launch with the handle jit_build gave.
using fl_launch_fn = decltype(fl_plugin_t::jit_launch);
struct KernelRef {
  fl_kernel_fn fn = nullptr;
  fl_launch_fn launch = nullptr;
  void* handle = nullptr;
  KernelRef() = default;
  KernelRef(void* f, void* l, void* h)
      : fn(reinterpret_cast<fl_kernel_fn>(f)), launch(reinterpret_cast<fl_launch_fn>(l)), handle(h) {}
  bool valid() const { return handle != nullptr ? launch != nullptr : fn != nullptr; }
  int operator()(fl_stream_t stream, int local, const fl_tensor_t* in, int n_in, const fl_tensor_t* out,
                 int n_out, const fl_arg_t* args, int n_args) const {
    if (handle != nullptr) return launch(handle, stream, local, in, n_in, out, n_out, args, n_args);
    return fn(stream, local, in, n_in, out, n_out, args, n_args);
  }
};

struct FastPlan {
  KernelRef kernel;
  std::string name;  // the op, for traces
  int device = 0;  // fl index
  int local = 0;
  std::vector<fl_tensor_t> in, out;
  std::vector<fl_arg_t> args;
  std::vector<std::pair<int32_t, int32_t>> in_src;  // (stack index, list index or -1) per input
  std::vector<int32_t> out_src;                     // stack index, or -1 for a fresh output
  std::vector<c10::ScalarType> out_dtype;
  std::vector<int32_t> returns;                     // per return: index into out
  std::vector<Patch> patches;
  int64_t slot = -1;                                // Python's counter slot for this plan
};

std::mutex g_fast_mu;
std::unordered_map<std::vector<int64_t>, std::shared_ptr<FastPlan>, VecHash> g_fast;
std::atomic<bool> g_fast_enabled{true};
std::atomic<int64_t> g_fast_hits{0};
std::mutex g_counts_mu;
std::vector<int64_t> g_slot_counts;
constexpr size_t kFastMax = 16384;

struct InFlight {
  std::vector<int64_t> key;  // empty: this call cannot be keyed
  const c10::OperatorName* name;
  std::vector<const void*> fresh_outs;  // storages of out= tensors no Python object has seen (see below)
};

// The out= tensors of a call that Python has never seen: PyTorch's structured wrapper allocated them a moment
// ago for a functional call (add.Tensor reaches the device as add.out). The Python dispatcher may give such an
// output the result's storage instead of copying into it; a user's out= tensor keeps its memory, as PyTorch
// promises. Python objects of tensors live in the TensorImpl's PyObjectSlot (torch >= 2.13's API; older
// releases report no fresh outputs, which only costs the copy).
std::vector<const void*> fresh_out_storages(const c10::OperatorHandle& op, const torch::jit::Stack* stack,
                                            size_t n) {
  std::vector<const void*> fresh;
#if defined(TORCH_VERSION_MAJOR) && (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR >= 213)
  const auto& args = op.schema().arguments();
  const size_t base = stack->size() - n;
  for (size_t i = 0; i < n; ++i) {
    const auto& a = args[i];
    if (!a.kwarg_only() || a.alias_info() == nullptr || !a.alias_info()->isWrite()) continue;
    const c10::IValue& v = (*stack)[base + i];
    if (!v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj() == nullptr)
      fresh.push_back(t.storage().data());
  }
#else
  (void)op, (void)stack, (void)n;
#endif
  return fresh;
}
thread_local std::vector<InFlight> t_pending;  // the fallback calls in flight on this thread, innermost last

void fill_desc(fl_tensor_t& d, const at::Tensor& t) {
  d.data = const_cast<void*>(t.storage().data());
  d.offset = t.storage_offset();
}

// Runs a committed plan on the stack. Returns false (stack untouched) when the
// kernel declines or fails: the Python path then serves the call and reports.
bool run_fast(const FastPlan& plan, torch::jit::Stack* stack, size_t n_args_on_stack) {
  const size_t base = stack->size() - n_args_on_stack;
  auto arg = [&](int32_t i) -> const c10::IValue& { return (*stack)[base + i]; };
  std::vector<fl_tensor_t> in = plan.in;
  for (size_t j = 0; j < in.size(); ++j) {
    auto [si, li] = plan.in_src[j];
    if (si < 0) continue;  // an undefined entry of a Tensor?[]
    if (li < 0) {
      fill_desc(in[j], arg(si).toTensor());
    } else {
      auto l = arg(si).toTensorList();
      fill_desc(in[j], l.get(li));
    }
  }
  std::vector<fl_arg_t> args = plan.args;
  for (const Patch& p : plan.patches) {
    const c10::IValue& v = arg(p.stack);
    const int32_t kind = p.kind & 3;
    if (kind == 0) {
      args[p.arg].f = v.toDouble();
    } else if (kind == 2) {
      args[p.arg].f = v.toScalar().toDouble();
    } else {
      const at::Tensor& w = v.toTensor();
      if (args[p.arg].kind == FL_ARG_FLOAT)
        args[p.arg].f = w.item<double>();
      else
        args[p.arg].i = w.item<int64_t>();
    }
    if ((p.kind & 4) && args[p.arg].kind == FL_ARG_FLOAT)
      args[p.arg].f = static_cast<double>(static_cast<float>(args[p.arg].f));
  }
  std::vector<at::Tensor> fresh(plan.out.size());
  std::vector<fl_tensor_t> out = plan.out;
  c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(plan.device));
  for (size_t j = 0; j < out.size(); ++j) {
    int32_t si = plan.out_src[j];
    if (si >= 0) {
      fill_desc(out[j], arg(si).toTensor());
    } else if (out[j].ndim >= 0) {
      const c10::DeviceGuard guard(where);
      fresh[j] = at::detail::empty_strided_generic(
          c10::IntArrayRef(out[j].sizes, out[j].ndim), c10::IntArrayRef(out[j].strides, out[j].ndim), &g_allocator,
          kFlKeys, plan.out_dtype[j]);
      fill_desc(out[j], fresh[j]);
    }
  }
  TraceSpan span = trace_begin(plan.device);
  int status = plan.kernel(current_stream(*g_devices[plan.device], plan.device), plan.local, in.data(),
                           static_cast<int>(in.size()), out.data(), static_cast<int>(out.size()), args.data(),
                           static_cast<int>(args.size()));
  trace_end(span, plan.name);
  if (status != FL_OK) return false;
  std::vector<c10::IValue> results;
  results.reserve(plan.returns.size());
  for (int32_t r : plan.returns) {
    int32_t si = plan.out_src[r];
    results.emplace_back(si >= 0 ? arg(si) : c10::IValue(fresh[r]));
  }
  if (g_watch_n.load(std::memory_order_relaxed) != 0) {
    for (int32_t si : plan.out_src)
      if (si >= 0) note_write(arg(si).toTensor().storage().data());
  }
  torch::jit::drop(*stack, n_args_on_stack);
  for (auto& v : results) stack->push_back(std::move(v));
  if (plan.slot >= 0) {
    std::lock_guard<std::mutex> lock(g_counts_mu);
    if (static_cast<size_t>(plan.slot) < g_slot_counts.size()) g_slot_counts[plan.slot]++;
  }
  g_fast_hits++;
  return true;
}

// A TorchDispatchMode (a profiler, FakeTensor tracing, fl.align's op trace) sees the op at the Python
// key, above the backend: how the backend then serves it is not the mode's business, and PyTorch's
// Python kernels for backend keys would try to route through the mode's interpreter, which has no
// entry for a fallback. So the fallback runs with the mode stack set aside.
struct ModeStash {
  bool active;
  c10::impl::TorchDispatchModeTLS saved;
  ModeStash()
      : active(c10::impl::TorchDispatchModeTLS::any_modes_set()),
        saved(c10::impl::TorchDispatchModeTLS::get_state()) {
    if (active) c10::impl::TorchDispatchModeTLS::set_state(c10::impl::TorchDispatchModeTLS());
  }
  ~ModeStash() {
    if (active) c10::impl::TorchDispatchModeTLS::set_state(std::move(saved));
  }
};

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  bool try_fast = g_fast_enabled.load() && g_pending_total.load() == 0;
  KeyBuilder kb;
  if (try_fast) {
    kb.k.reserve(64);
    kb.k.push_back(reinterpret_cast<int64_t>(&op.operator_name()));
    for (size_t i = stack->size() - n; i < stack->size() && kb.ok; ++i) kb.value((*stack)[i]);
    if (kb.ok) {
      std::shared_ptr<FastPlan> plan;
      {
        std::lock_guard<std::mutex> lock(g_fast_mu);
        auto it = g_fast.find(kb.k);
        if (it != g_fast.end()) plan = it->second;
      }
      if (plan && run_fast(*plan, stack, n)) return;
    }
    if (fl_fallback::serve(op, stack, n, kb.ok ? &kb.k : nullptr)) return;  // hook: fl_fallback.cpp
  }
  t_pending.push_back({kb.ok && try_fast ? std::move(kb.k) : std::vector<int64_t>(), &op.operator_name(),
                       fresh_out_storages(op, stack, n)});
  ModeStash stash;
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse3), stack);
  } catch (...) {
    t_pending.pop_back();
    throw;
  }
  t_pending.pop_back();
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("record_stream", record_stream);
}

// Copies that involve a lazily conjugated or negated fl tensor reach torch_fl's copy with the flag set
// (it resolves the flag while copying): PyTorch's math-bit fallback would materialise the source with
// clone, which copies through _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

// An op PyTorch composes for every backend (CompositeExplicitAutograd: convolution, ...) never reaches the
// fallback above, so torch_fl registers a kernel for it at the fl key. Registering the fallback itself as
// that kernel gives the op the fast path too; on a miss it goes on to PrivateUse3 like any other op.
static std::vector<std::unique_ptr<torch::Library>> g_routed;
static std::mutex g_routed_mu;

FL_API int fl_core_route_to_fallback(const char* ns, const char* name) {
  try {
    std::lock_guard<std::mutex> lock(g_routed_mu);
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__,
                                                __LINE__);
    lib->impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
    g_routed.push_back(std::move(lib));
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}

// ------------------------------------------------------------------ C API ---

FL_API int fl_core_abi(void) { return FL_ABI_VERSION; }

// Installs the guard (replacing PyTorch's Python one) and the hooks.
// Returns 1 when torch_fl's hooks are in place, 0 when another extension's are.
FL_API int fl_core_install(void) {
  c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::PrivateUse1)].store(&g_guard);
  if (g_hooks) return 1;
  if (at::isPrivateUse1HooksRegistered()) return 0;
  g_hooks = new FlHooks();
  at::RegisterPrivateUse1HooksInterface(g_hooks);
  return 1;
}

// Device fl:index is the plugin's local device. Called before any tensor lives on it.
FL_API int fl_core_add_device(int index, const fl_plugin_t* plugin, int local, uint64_t total_memory,
                              uint32_t features, int64_t pool_limit, const char* label) {
  if (index < 0 || index >= kMaxDevices || plugin == nullptr) return -1;
  if (g_devices[index] == nullptr) g_devices[index] = new Device();
  Device& d = *g_devices[index];
  d.plugin = plugin;
  d.local = local;
  d.total = total_memory;
  d.features = features;
  d.label = label ? label : "fl";
  d.pool.limit = pool_limit;
  if (index + 1 > g_count.load()) g_count = index + 1;
  return 0;
}

FL_API void fl_core_set_default(int index) {
  g_default = index;
  t_current = -1;
}
FL_API int fl_core_current(void) { return current_index(); }

// The plugin handle of this thread's current stream on fl:index (NULL: the default stream), where Python's
// kernel calls, copies and fills go.
FL_API void* fl_core_current_stream(int index) {
  if (index < 0 || index >= g_count.load() || !g_devices[index]) return nullptr;
  return current_stream(*g_devices[index], index);
}

FL_API void fl_core_set_pool_enabled(int enabled) { g_pool_enabled = enabled != 0; }

FL_API int fl_core_set_pool_limit(int index, int64_t nbytes) {
  if (index < 0 || index >= g_count.load() || !g_devices[index]) return -1;
  Device& d = *g_devices[index];
  std::lock_guard<std::mutex> lock(d.pool.mu);
  d.pool.limit = nbytes;
  if (d.pool.cached > d.pool.limit) free_cached_locked(d);
  return 0;
}

FL_API int fl_core_empty_cache(int index) {
  if (index < 0 || index >= g_count.load() || !g_devices[index]) return -1;
  Device& d = *g_devices[index];
  std::lock_guard<std::mutex> lock(d.pool.mu);
  free_cached_locked(d);
  return 0;
}

// allocated, peak, cached, allocations, hits, misses, limit, device mallocs, device frees, ooms
FL_API int fl_core_memory_stats(int index, int64_t* out) {
  if (index < 0 || index >= g_count.load() || !g_devices[index]) return -1;
  Device& d = *g_devices[index];
  std::lock_guard<std::mutex> lock(d.pool.mu);
  int64_t v[] = {d.pool.allocated, d.pool.peak, d.pool.cached, d.pool.allocations, d.pool.hits,
                 d.pool.misses, d.pool.limit, d.pool.device_allocs, d.pool.device_frees, d.pool.ooms};
  std::memcpy(out, v, sizeof v);
  return 0;
}

// The peak becomes max(value, allocated): reset with 0, restore a saved figure after a profile.
FL_API int fl_core_set_peak(int index, int64_t value) {
  if (index < 0 || index >= g_count.load() || !g_devices[index]) return -1;
  Device& d = *g_devices[index];
  std::lock_guard<std::mutex> lock(d.pool.mu);
  d.pool.peak = std::max(value, d.pool.allocated);
  return 0;
}

FL_API uint64_t fl_core_size_class(uint64_t nbytes) { return size_class(nbytes); }

// An async copy into the block at ptr is in flight until event completes:
// freeing the block first waits for it (the Python side waits before any use).
FL_API int fl_core_set_pending(int index, void* ptr, void* event) {
  if (index < 0 || index >= g_count.load() || !g_devices[index]) return -1;
  Device& d = *g_devices[index];
  std::lock_guard<std::mutex> lock(d.pool.mu);
  settle_pending_locked(d, ptr);
  d.pool.pending[ptr] = event;
  g_pending_total++;
  return 0;
}

// 1 if an async copy into the block at ptr is still registered (0 once settled or freed).
FL_API int fl_core_is_pending(int index, void* ptr) {
  if (index < 0 || index >= g_count.load() || !g_devices[index]) return 0;
  Device& d = *g_devices[index];
  std::lock_guard<std::mutex> lock(d.pool.mu);
  return d.pool.pending.count(ptr) > 0 ? 1 : 0;
}

// Settles the copy into ptr, if one is in flight. Returns 1 if there was one.
FL_API int fl_core_wait_pending(int index, void* ptr) {
  if (index < 0 || index >= g_count.load() || !g_devices[index]) return -1;
  Device& d = *g_devices[index];
  std::lock_guard<std::mutex> lock(d.pool.mu);
  bool had = d.pool.pending.count(ptr) > 0;
  settle_pending_locked(d, ptr);
  return had ? 1 : 0;
}

// Whether `base` is the storage of an out= tensor of the innermost fallback call that no Python object had seen.
FL_API int fl_core_fresh_out(const void* base) {
  if (t_pending.empty() || base == nullptr) return 0;
  for (const void* p : t_pending.back().fresh_outs)
    if (p == base) return 1;
  return 0;
}

// ------------------------------------------------------ write watch (C API) ---

FL_API void fl_core_watch(const void* base, int on) {
  if (base == nullptr) return;
  std::lock_guard<std::mutex> lock(g_watch_mu);
  auto& entry = g_watch[base];
  entry.first += on ? 1 : -1;
  if (entry.first <= 0) g_watch.erase(base);
  g_watch_n = static_cast<int64_t>(g_watch.size());
}

FL_API uint64_t fl_core_write_generation(const void* base) {
  std::lock_guard<std::mutex> lock(g_watch_mu);
  auto it = g_watch.find(base);
  return it == g_watch.end() ? 0 : it->second.second;
}

FL_API void fl_core_note_write(const void* base) { note_write(base); }

FL_API int64_t fl_core_watched(void) { return g_watch_n.load(); }

// ------------------------------------------------------- fast path (C API) ---

FL_API void fl_core_fast_enable(int on) { g_fast_enabled = on != 0; }

FL_API void fl_core_fast_clear(void) {
  std::lock_guard<std::mutex> lock(g_fast_mu);
  g_fast.clear();
}

FL_API int64_t fl_core_fast_size(void) {
  std::lock_guard<std::mutex> lock(g_fast_mu);
  return static_cast<int64_t>(g_fast.size());
}

FL_API int64_t fl_core_fast_hits(void) { return g_fast_hits.load(); }

// 1 if the op Python is handling (its qualified name, "aten::add.out") is the innermost call the
// fallback handed over, with a signature the fast path can key.
bool pending_is(const char* name) {
  if (t_pending.empty() || t_pending.back().key.empty() || name == nullptr) return false;
  const c10::OperatorName& op = *t_pending.back().name;
  std::string full = op.name;
  if (!op.overload_name.empty()) full += "." + op.overload_name;
  return full == name;
}

FL_API int fl_core_fast_can_commit(const char* name) { return pending_is(name) ? 1 : 0; }

// ---- hooks for fl_fallback.cpp, the CPU-fallback fast path (declared in fl_fallback.h) ----
const std::vector<int64_t>* fl_core_pending_key(const char* name) {
  return pending_is(name) ? &t_pending.back().key : nullptr;
}

void fl_core_copy(int index, int kind, void* dst, const void* src, size_t n) {
  Device& d = device_at(index);
  fl_stream_t s = current_stream(d, index);
  if (kind == 2) {
    check_status(d, copy_d2d_on(d, dst, src, n, s), "copy_d2d");
    return;
  }
  int status = kind == 0 ? d.plugin->copy_h2d(d.local, dst, src, n, s) : d.plugin->copy_d2h(d.local, dst, src, n, s);
  if (status == FL_OK && s != nullptr && d.plugin->stream_synchronize) status = d.plugin->stream_synchronize(d.local, s);
  check_status(d, status, kind == 0 ? "copy_h2d" : "copy_d2h");
}

void fl_core_zero(int index, void* dst, size_t n) {
  Device& d = device_at(index);
  fl_stream_t s = current_stream(d, index);
  int status = d.plugin->mem_set(d.local, dst, 0, n, s);
  if (status == FL_OK && s != nullptr && !(d.features & FL_FEATURE_ASYNC_KERNELS) && d.plugin->stream_synchronize)
    status = d.plugin->stream_synchronize(d.local, s);  // a kernel called next runs at once: land first
  check_status(d, status, "mem_set");
}

void fl_core_count(int64_t slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_counts_mu);
  if (static_cast<size_t>(slot) >= g_slot_counts.size()) g_slot_counts.resize(slot + 1, 0);
  g_slot_counts[slot]++;
}
// ---- end of the hooks for fl_fallback.cpp ----

// The Python dispatcher ran the op now in flight as one native kernel call on
// its own arguments: remember the marshalling for this signature. in_src and
// out_src index the op's arguments (out_src -1: a fresh output with the
// descriptor's sizes, strides and out_dtypes' dtype); returns index out;
// patches are (arg, stack, kind) triples.
FL_API int fl_core_fast_commit(const char* name, void* fn, void* launch, void* handle, int device, int local, const fl_tensor_t* in, int n_in, const int32_t* in_src,
                               const fl_tensor_t* out, int n_out, const int32_t* out_src, const int32_t* out_dtypes,
                               const fl_arg_t* args, int n_args, const int32_t* patches, int n_patches,
                               const int32_t* returns, int n_returns, int64_t slot) {
  const KernelRef kernel(fn, launch, handle);
  if (!pending_is(name) || !kernel.valid()) return 0;
  auto plan = std::make_shared<FastPlan>();
  plan->kernel = kernel;
  plan->name = name;
  plan->device = device;
  plan->local = local;
  plan->in.assign(in, in + n_in);
  plan->out.assign(out, out + n_out);
  plan->args.assign(args, args + n_args);
  for (int j = 0; j < n_in; ++j) plan->in_src.emplace_back(in_src[2 * j], in_src[2 * j + 1]);
  plan->out_src.assign(out_src, out_src + n_out);
  for (int j = 0; j < n_out; ++j) plan->out_dtype.push_back(static_cast<c10::ScalarType>(out_dtypes[j]));
  for (int j = 0; j < n_patches; ++j) plan->patches.push_back({patches[3 * j], patches[3 * j + 1], patches[3 * j + 2]});
  plan->returns.assign(returns, returns + n_returns);
  plan->slot = slot;
  if (slot >= 0) {
    std::lock_guard<std::mutex> lock(g_counts_mu);
    if (static_cast<size_t>(slot) >= g_slot_counts.size()) g_slot_counts.resize(slot + 1, 0);
  }
  std::lock_guard<std::mutex> lock(g_fast_mu);
  if (g_fast.size() >= kFastMax) g_fast.clear();
  g_fast[t_pending.back().key] = std::move(plan);
  return 1;
}

// Calls each counter slot served from the fast path since the last read (the counters are reset).
FL_API int64_t fl_core_fast_take_counts(int64_t* out, int64_t n) {
  std::lock_guard<std::mutex> lock(g_counts_mu);
  int64_t m = std::min<int64_t>(n, static_cast<int64_t>(g_slot_counts.size()));
  for (int64_t i = 0; i < m; ++i) {
    out[i] = g_slot_counts[i];
    g_slot_counts[i] = 0;
  }
  return m;
}

// ------------------------------------------------------ graph replay (C API) ---
// A recorded kernel list (runtime/graph.py): every plugin kernel call a compiled
// graph made, with its descriptors and arguments as they were built (the data
// pointers are the recording's buffers, which Python keeps alive), replayed in
// one call: the inputs copied into the static input buffers, each kernel called
// in order, the static outputs copied out. The first failing status stops the
// replay and says which step failed; Python raises the plugin's error naming the op.

namespace {

struct GraphStep {
  KernelRef kernel;
  int local;
  int64_t slot;  // Python's counter slot for the op (-1: none)
  std::vector<fl_tensor_t> in, out;
  std::vector<fl_arg_t> args;
};

struct GraphCopy {
  void* ptr;
  size_t nbytes;
};

struct Graph {
  int device = 0;
  std::vector<GraphStep> steps;
  std::vector<GraphCopy> inputs;   // static input buffers: where each replay copies the caller's input
  std::vector<GraphCopy> outputs;  // static outputs: what each replay copies out
};

}  // namespace

FL_API void* fl_core_graph_new(int device) {
  if (device < 0 || device >= g_count.load() || !g_devices[device]) return nullptr;
  auto* g = new Graph();
  g->device = device;
  return g;
}

FL_API void fl_core_graph_free(void* graph) { delete static_cast<Graph*>(graph); }

FL_API int fl_core_graph_add_kernel(void* graph, void* fn, void* launch, void* handle, int local,
                                    const fl_tensor_t* in, int n_in, const fl_tensor_t* out, int n_out,
                                    const fl_arg_t* args, int n_args, int64_t slot) {
  const KernelRef kernel(fn, launch, handle);
  if (graph == nullptr || !kernel.valid()) return -1;
  auto* g = static_cast<Graph*>(graph);
  GraphStep s;
  s.kernel = kernel;
  s.local = local;
  s.slot = slot;
  s.in.assign(in, in + n_in);
  s.out.assign(out, out + n_out);
  s.args.assign(args, args + n_args);
  g->steps.push_back(std::move(s));
  if (slot >= 0) {
    std::lock_guard<std::mutex> lock(g_counts_mu);
    if (static_cast<size_t>(slot) >= g_slot_counts.size()) g_slot_counts.resize(slot + 1, 0);
  }
  return static_cast<int>(g->steps.size()) - 1;
}

FL_API int fl_core_graph_add_input(void* graph, void* dst, uint64_t nbytes) {
  if (graph == nullptr) return -1;
  static_cast<Graph*>(graph)->inputs.push_back({dst, static_cast<size_t>(nbytes)});
  return 0;
}

FL_API int fl_core_graph_add_output(void* graph, void* src, uint64_t nbytes) {
  if (graph == nullptr) return -1;
  static_cast<Graph*>(graph)->outputs.push_back({src, static_cast<size_t>(nbytes)});
  return 0;
}

FL_API int64_t fl_core_graph_size(void* graph) {
  return graph == nullptr ? -1 : static_cast<int64_t>(static_cast<Graph*>(graph)->steps.size());
}

// One replay. in_src[k]: the caller's bytes for static input k (skipped where it
// is the static buffer itself; NULL: no input copies); out_dst[k]: where static
// output k goes (NULL: no output copies); run_kernels 0 copies only. With
// step_ns, each kernel's own time (ns) is written there (what bench_fusion
// subtracts to get the host time per kernel). Returns FL_OK, or the failing
// status with *failed = the kernel step, or -1 - k for input copy k, or
// -1 - n_inputs - k for output copy k.
FL_API int fl_core_graph_replay(void* graph, void* const* in_src, void* const* out_dst, int run_kernels,
                                int64_t* failed, int64_t* step_ns) {
  if (graph == nullptr) return FL_ERR_INVALID;
  auto* g = static_cast<Graph*>(graph);
  Device& d = *g_devices[g->device];
  fl_stream_t stream = current_stream(d, g->device);  // a replay runs on the caller's current stream
  const int64_t n_in = static_cast<int64_t>(g->inputs.size());
  if (in_src != nullptr) {
    for (int64_t k = 0; k < n_in; ++k) {
      const GraphCopy& c = g->inputs[k];
      if (in_src[k] == c.ptr || c.nbytes == 0) continue;
      int status = copy_d2d_on(d, c.ptr, in_src[k], c.nbytes, stream);
      if (status != FL_OK) {
        *failed = -1 - k;
        return status;
      }
    }
  }
  if (run_kernels) {
    const int64_t n = static_cast<int64_t>(g->steps.size());
    for (int64_t k = 0; k < n; ++k) {
      const GraphStep& s = g->steps[k];
      std::chrono::steady_clock::time_point t0;
      if (step_ns) t0 = std::chrono::steady_clock::now();
      TraceSpan span = trace_begin(g->device);
      int status = s.kernel(stream, s.local, s.in.data(), static_cast<int>(s.in.size()), s.out.data(),
                            static_cast<int>(s.out.size()), s.args.data(), static_cast<int>(s.args.size()));
      if (span.on) trace_end(span, "kernel graph step " + std::to_string(k));
      if (step_ns)
        step_ns[k] = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      if (status != FL_OK) {
        *failed = k;
        return status;
      }
    }
    std::lock_guard<std::mutex> lock(g_counts_mu);
    for (const GraphStep& s : g->steps)
      if (s.slot >= 0 && static_cast<size_t>(s.slot) < g_slot_counts.size()) g_slot_counts[s.slot]++;
  }
  if (out_dst != nullptr) {
    for (size_t k = 0; k < g->outputs.size(); ++k) {
      const GraphCopy& c = g->outputs[k];
      if (c.nbytes == 0 || out_dst[k] == c.ptr) continue;
      int status = copy_d2d_on(d, out_dst[k], c.ptr, c.nbytes, stream);
      if (status != FL_OK) {
        *failed = -1 - n_in - static_cast<int64_t>(k);
        return status;
      }
    }
  }
  return FL_OK;
}

// ------------------------------------------------------------ fl_trace ---

namespace fl_trace {

void start() {
  std::lock_guard<std::mutex> lock(g_trace_mu);
  g_traced.clear();
  g_traced_events.clear();
  for (int i = 0; i < g_count.load() && i < kMaxDevices; ++i) {
    if (!g_devices[i] || !device_timed(*g_devices[i])) continue;
    Device& d = *g_devices[i];
    void* ev = nullptr;
    if (d.plugin->event_create(d.local, &ev) != FL_OK) continue;
    d.plugin->event_record(d.local, ev, nullptr);
    d.plugin->event_synchronize(d.local, ev);  // the base: when the work before the trace has run
    g_trace_base[i] = {ev, unix_ns()};
  }
  fl_core_tracing = 1;
}

std::vector<Kernel> stop() {
  std::vector<Kernel> out;
  std::vector<std::pair<void*, void*>> events;
  {
    std::lock_guard<std::mutex> lock(g_trace_mu);
    fl_core_tracing = 0;
    out.swap(g_traced);
    events.swap(g_traced_events);
  }
  for (size_t k = 0; k < out.size(); ++k) {
    Kernel& r = out[k];
    Device& d = *g_devices[r.device];
    auto [ev0, ev1] = events[k];
    const TraceBase& base = g_trace_base[r.device];
    double a = 0, b = 0;
    if (r.device_timed && base.event && d.plugin->event_synchronize(d.local, ev1) == FL_OK &&
        d.plugin->event_elapsed(d.local, base.event, ev0, &a) == FL_OK &&
        d.plugin->event_elapsed(d.local, base.event, ev1, &b) == FL_OK) {
      r.start_ns = base.host_ns + static_cast<int64_t>(a * 1e6);
      r.end_ns = base.host_ns + static_cast<int64_t>(b * 1e6);
    } else {
      r.device_timed = false;
    }
    if (ev0) d.plugin->event_destroy(d.local, ev0);
    if (ev1) d.plugin->event_destroy(d.local, ev1);
  }
  for (int i = 0; i < kMaxDevices; ++i) {
    if (g_trace_base[i].event && g_devices[i]) g_devices[i]->plugin->event_destroy(g_devices[i]->local, g_trace_base[i].event);
    g_trace_base[i] = {};
  }
  return out;
}

void push_correlation(uint64_t id) { t_correlation.push_back(id); }
void pop_correlation() {
  if (!t_correlation.empty()) t_correlation.pop_back();
}

}  // namespace fl_trace

// Python's kernel calls, while a trace runs (fl_core_tracing): begin before the call, end after it, on the
// same thread (a stack, so nested calls pair up).
namespace {
thread_local std::vector<TraceSpan> t_spans;
}

FL_API void fl_core_trace_begin(int index) { t_spans.push_back(trace_begin(index)); }

FL_API void fl_core_trace_end(const char* name) {
  if (t_spans.empty()) return;
  TraceSpan sp = t_spans.back();
  t_spans.pop_back();
  trace_end(sp, name ? name : "kernel");
}
