// torch_fl's device guard for PrivateUse1 ("fl"), replacing the Python device
// guard of torch >= 2.9, whose getDevice() is fixed to index 0 and whose
// deviceCount() is fixed to 1 (torch/csrc/acc/Module.cpp). The autograd engine
// sizes its per-device ready queues from deviceCount() at the first backward of
// the process, so with that guard any fl device but fl:0 fails backward with
// an internal assert. Plain C entry points; no Python inside.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {
std::atomic<int> g_count{1};
std::atomic<int> g_default{0};
thread_local int t_current = -1;

struct FlGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device getDevice() const override {
    int i = t_current >= 0 ? t_current : g_default.load();
    return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(i));
  }
  void setDevice(c10::Device d) const override { if (d.index() >= 0) t_current = d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { if (d.index() >= 0) t_current = d.index(); }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override {
    (void)priority;
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(g_count.load()); }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
};
FlGuard g_guard;

// Pinned host memory for the fl device: PyTorch asks the PrivateUse1 hooks for
// an allocator (Tensor.pin_memory(), DataLoader(pin_memory=True)), which the
// Python hooks cannot provide. Blocks are 64-byte aligned host memory the
// allocator remembers, so is_pinned() can answer; torch_fl copies from them
// asynchronously on devices that declare FL_FEATURE_ASYNC_COPY.
std::mutex g_pin_mutex;
std::map<uintptr_t, size_t> g_pinned;

void pinned_free(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(g_pin_mutex);
    g_pinned.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}

struct PinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n > 0) {
      if (posix_memalign(&p, 64, n) != 0) TORCH_CHECK(false, "torch_fl: cannot allocate ", n, " bytes of pinned memory");
      std::lock_guard<std::mutex> lock(g_pin_mutex);
      g_pinned[reinterpret_cast<uintptr_t>(p)] = n;
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
  return a >= it->first && a < it->first + it->second;
}

struct FlHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(g_count.load()); }
  c10::DeviceIndex getCurrentDevice() const override { return g_guard.getDevice().index(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { g_guard.setDevice(c10::Device(c10::DeviceType::PrivateUse1, d)); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    return g_guard.exchangeDevice(c10::Device(c10::DeviceType::PrivateUse1, d)).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
};
FlHooks* g_hooks = nullptr;

// The allocator PyTorch uses for fl storage made outside torch_fl's factories:
// torch.UntypedStorage(n, device="fl"), and a DataLoader worker that collates fl
// tensors into shared memory. torch_fl's tensors own plugin buffers from Python
// (wrapper subclass, docs/runtime.md), so there is no C++ allocator to hand out;
// without one registered PyTorch calls through a null allocator and the process
// dies with SIGSEGV. This one refuses with an error that says what to do instead.
void refused_delete(void*) {}

struct RefusingAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    TORCH_CHECK(n == 0, "torch_fl: fl memory is allocated by fl tensors only (torch.empty(..., device='fl'), "
                "x.to('fl')); a raw fl storage of ", n, " bytes (torch.UntypedStorage(n, device='fl'), or fl tensors "
                "shared with another process such as a DataLoader worker or a multiprocessing child) is not "
                "supported. Keep data on the CPU there and move it with .to('fl') in the main process.");
    return {nullptr, nullptr, &refused_delete, c10::Device(c10::DeviceType::PrivateUse1)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &refused_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(count == 0, "torch_fl: fl storage cannot be copied as raw bytes; copy fl tensors instead");
    (void)dest;
    (void)src;
  }
};
RefusingAllocator g_refusing_allocator;
}  // namespace

extern "C" {
__attribute__((visibility("default"))) int fl_guard_install(int count) {
  g_count = count > 0 ? count : 1;
  c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::PrivateUse1)].store(&g_guard);
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_refusing_allocator);
  return 0;
}
// Registers the hooks (pinned memory, device count) when no other hooks are:
// returns 1 if ours are in place.
__attribute__((visibility("default"))) int fl_hooks_install(void) {
  if (g_hooks) return 1;
  if (at::isPrivateUse1HooksRegistered()) return 0;
  g_hooks = new FlHooks();
  at::RegisterPrivateUse1HooksInterface(g_hooks);
  return 1;
}
__attribute__((visibility("default"))) void fl_guard_set_count(int count) { g_count = count > 0 ? count : 1; }
__attribute__((visibility("default"))) void fl_guard_set_default(int index) { g_default = index; t_current = -1; }
__attribute__((visibility("default"))) int fl_guard_current(void) { return g_guard.getDevice().index(); }
}
