// fl_pinned.cpp — pinned host memory: the allocator the PrivateUse1 hooks hand PyTorch.
//
// PyTorch asks the hooks for a host allocator (Tensor.pin_memory(), DataLoader(pin_memory=True)). Blocks come
// from the default device's plugin when it has host_alloc (page-locked memory its copies can use
// asynchronously; ABI v2), else they are 64-byte aligned host memory. The allocator remembers each block (its
// size and the plugin that gave it, which must take it back), so is_pinned() can answer; torch_fl copies from
// them asynchronously on devices that declare FL_FEATURE_ASYNC_COPY.
#include <cstdlib>
#include <cstring>

#include "fl_core_internal.h"

using namespace fl_core;

namespace {

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

}  // namespace

namespace fl_core {

c10::Allocator* pinned_allocator() { return &g_pinned_allocator; }

bool is_pinned(const void* data) {
  auto a = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(g_pin_mutex);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a >= it->first && a < it->first + it->second.size;
}

}  // namespace fl_core
