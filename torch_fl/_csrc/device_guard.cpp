// torch_fl's device guard for PrivateUse1 ("fl"), replacing the Python device
// guard of torch >= 2.9, whose getDevice() is fixed to index 0 and whose
// deviceCount() is fixed to 1 (torch/csrc/acc/Module.cpp). The autograd engine
// sizes its per-device ready queues from deviceCount() at the first backward of
// the process, so with that guard any fl device but fl:0 fails backward with
// an internal assert. It also keeps PyTorch's stream and event bookkeeping
// (the autograd engine records events on the streams its nodes were made on
// and waits on them; torch.Stream / torch.Event / torch.accelerator use the
// same calls). Plain C entry points; no Python inside except the sync hook.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {
std::atomic<int> g_count{1};
std::atomic<int> g_default{0};
thread_local int t_current = -1;

// Streams. fl kernels run synchronously with respect to the host: a kernel's
// work is done when its call returns, and torch_fl waits for an asynchronous
// copy before anything reads its destination. A stream is therefore an
// ordering domain (PyTorch's bookkeeping: current stream per thread and
// device, streams recorded in autograd nodes), and an event recorded on it is
// complete at once. What PyTorch relies on holds: getStream() is the calling
// thread's current stream of that device, exchangeStream() sets it and returns
// the previous one, new streams are distinct, record() marks an event (with
// its time, for elapsed_time), block() orders nothing that is not already
// done, query() is true once recorded, and the synchronize calls wait for the
// device's in-flight copies through torch_fl (a hook set from Python).
constexpr int kMaxDevices = 64;
thread_local c10::StreamId t_stream[kMaxDevices] = {};
std::atomic<c10::StreamId> g_next_stream{1};
using SyncHook = void (*)(int);
std::atomic<SyncHook> g_sync_hook{nullptr};

struct FlEvent {
  bool recorded = false;
  c10::DeviceIndex device = -1;
  std::chrono::steady_clock::time_point when;
};

void run_sync_hook(c10::DeviceIndex index) {
  if (auto hook = g_sync_hook.load()) hook(static_cast<int>(index));
}

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
  // a device without an index ("fl") means the current one
  c10::Device resolve(c10::Device d) const { return d.index() >= 0 ? d : getDevice(); }
  static c10::StreamId& slot(c10::DeviceIndex index) {
    TORCH_CHECK(index >= 0 && index < kMaxDevices, "torch_fl: fl device index ", int(index), " out of range");
    return t_stream[index];
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    d = resolve(d);
    c10::StreamId id = d.index() >= 0 && d.index() < kMaxDevices ? t_stream[d.index()] : 0;
    return c10::Stream(c10::Stream::UNSAFE, d, id);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, resolve(d)); }
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override {
    (void)priority;
    return c10::Stream(c10::Stream::UNSAFE, resolve(d), g_next_stream.fetch_add(1));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority = false) const override {
    return getNewStream(d, high_priority ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    c10::Device d = resolve(s.device());
    c10::Stream old = getStream(d);
    if (d.index() >= 0 && d.index() < kMaxDevices) t_stream[d.index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(g_count.load()); }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "torch_fl: event of fl:",
                int(device_index), " recorded on a stream of fl:", int(stream.device_index()));
    auto* e = static_cast<FlEvent*>(*event);
    if (!e) *event = e = new FlEvent();
    TORCH_CHECK(e->device < 0 || e->device == stream.device_index(), "torch_fl: event of fl:", int(e->device),
                " recorded on a stream of fl:", int(stream.device_index()));
    e->device = stream.device_index();
    e->recorded = true;
    e->when = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}  // complete when recorded: nothing to wait for
  bool queryEvent(void*) const override { return true; }  // never recorded, or recorded and complete
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete static_cast<FlEvent*>(event); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override { run_sync_hook(s.device_index()); }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<FlEvent*>(event);
    if (e && e->recorded) run_sync_hook(e->device);
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    run_sync_hook(index >= 0 ? index : getDevice().index());
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<FlEvent*>(start);
    auto* b = static_cast<FlEvent*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded,
                "elapsed_time: both events must be recorded before calculating elapsed time");
    return std::chrono::duration<double, std::milli>(b->when - a->when).count();
  }
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
}  // namespace

extern "C" {
__attribute__((visibility("default"))) int fl_guard_install(int count) {
  g_count = count > 0 ? count : 1;
  c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::PrivateUse1)].store(&g_guard);
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
// What Stream/Event/device synchronize calls run: torch_fl's own wait for the device's in-flight work.
__attribute__((visibility("default"))) void fl_guard_set_sync_hook(void (*hook)(int)) { g_sync_hook = hook; }
__attribute__((visibility("default"))) void fl_guard_set_default(int index) { g_default = index; t_current = -1; }
__attribute__((visibility("default"))) int fl_guard_current(void) { return g_guard.getDevice().index(); }
}
