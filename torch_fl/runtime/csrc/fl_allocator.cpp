// fl_allocator.cpp — the caching allocator over the plugins' malloc/free (REGISTER_ALLOCATOR for PrivateUse1).
//
// Blocks are cached per (allocation stream, size class) up to a cap on cached bytes, with stats and an
// out-of-memory message that says what the pool held. A block used on other streams (Tensor.record_stream)
// joins the cache only once their work at the free is done; a block an async host copy still writes into
// (fl_core_set_pending) waits for that copy before it is reused.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>

#include "fl_core_internal.h"

namespace fl_core {

std::atomic<int> g_pending_total{0};

// Blocks are cached and reused by size class: multiples of 16 bytes up to 512,
// of 512 bytes up to 1 MiB, then eight classes per power of two (at most
// 12.5 % slack), so tensors of nearby sizes share blocks.
size_t size_class(size_t n) {
  constexpr size_t kAlign = 16;
  if (n <= 512) return (n + kAlign - 1) / kAlign * kAlign;
  if (n <= (size_t(1) << 20)) return (n + 511) / 512 * 512;
  int bits = 64 - __builtin_clzll(static_cast<unsigned long long>(n));
  size_t step = size_t(1) << (bits - 4);
  return (n + step - 1) / step * step;
}

}  // namespace fl_core

using namespace fl_core;

namespace {

std::atomic<bool> g_pool_enabled{true};

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

struct Block {
  void* ptr;
  int device;
  size_t size;
  c10::StreamId stream;             // the stream it was allocated on
  std::vector<c10::StreamId> uses;  // other streams that use it (record_stream)
};

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

void noop_delete(void*) {}

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

}  // namespace

namespace fl_core {

c10::Allocator* device_allocator() { return &g_allocator; }

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

// Waits for every async copy still writing into the device's memory (what synchronize promises).
void settle_all_pending(Device& d) {
  std::lock_guard<std::mutex> lock(d.pool.mu);
  std::vector<void*> ptrs;
  for (auto& kv : d.pool.pending) ptrs.push_back(kv.first);
  for (void* p : ptrs) settle_pending_locked(d, p);
}

}  // namespace fl_core

// ------------------------------------------------------------------ C API ---

FL_API void fl_core_set_pool_enabled(int enabled) { g_pool_enabled = enabled != 0; }

FL_API int fl_core_set_pool_limit(int index, int64_t nbytes) {
  Device* d = find_device(index);
  if (d == nullptr) return -1;
  std::lock_guard<std::mutex> lock(d->pool.mu);
  d->pool.limit = nbytes;
  if (d->pool.cached > d->pool.limit) free_cached_locked(*d);
  return 0;
}

FL_API int fl_core_empty_cache(int index) {
  Device* d = find_device(index);
  if (d == nullptr) return -1;
  std::lock_guard<std::mutex> lock(d->pool.mu);
  free_cached_locked(*d);
  return 0;
}

FL_API int fl_core_memory_stats(int index, fl_core_memory_stats_t* out) {
  Device* d = find_device(index);
  if (d == nullptr || out == nullptr) return -1;
  std::lock_guard<std::mutex> lock(d->pool.mu);
  const Pool& p = d->pool;
  *out = {p.allocated, p.peak, p.cached, p.allocations, p.hits, p.misses, p.limit, p.device_allocs, p.device_frees,
          p.ooms};
  return 0;
}

// The peak becomes max(value, allocated): reset with 0, restore a saved figure after a profile.
FL_API int fl_core_set_peak(int index, int64_t value) {
  Device* d = find_device(index);
  if (d == nullptr) return -1;
  std::lock_guard<std::mutex> lock(d->pool.mu);
  d->pool.peak = std::max(value, d->pool.allocated);
  return 0;
}

FL_API uint64_t fl_core_size_class(uint64_t nbytes) { return size_class(nbytes); }

// An async copy into the block at ptr is in flight until event completes:
// freeing the block first waits for it (the Python side waits before any use).
FL_API int fl_core_set_pending(int index, void* ptr, fl_event_t event) {
  Device* d = find_device(index);
  if (d == nullptr) return -1;
  std::lock_guard<std::mutex> lock(d->pool.mu);
  settle_pending_locked(*d, ptr);
  d->pool.pending[ptr] = event;
  g_pending_total++;
  return 0;
}

// 1 if an async copy into the block at ptr is still registered (0 once settled or freed).
FL_API int fl_core_is_pending(int index, void* ptr) {
  Device* d = find_device(index);
  if (d == nullptr) return 0;
  std::lock_guard<std::mutex> lock(d->pool.mu);
  return d->pool.pending.count(ptr) > 0 ? 1 : 0;
}

// Settles the copy into ptr, if one is in flight. Returns 1 if there was one.
FL_API int fl_core_wait_pending(int index, void* ptr) {
  Device* d = find_device(index);
  if (d == nullptr) return -1;
  std::lock_guard<std::mutex> lock(d->pool.mu);
  bool had = d->pool.pending.count(ptr) > 0;
  settle_pending_locked(*d, ptr);
  return had ? 1 : 0;
}
