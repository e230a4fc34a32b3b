// torch_fl's device guard for PrivateUse1 ("fl"), replacing the Python device
// guard of torch >= 2.9, whose getDevice() is fixed to index 0 and whose
// deviceCount() is fixed to 1 (torch/csrc/acc/Module.cpp). The autograd engine
// sizes its per-device ready queues from deviceCount() at the first backward of
// the process, so with that guard any fl device but fl:0 fails backward with
// an internal assert. Plain C entry points; no Python inside.
#include <atomic>
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
}  // namespace

extern "C" {
__attribute__((visibility("default"))) int fl_guard_install(int count) {
  g_count = count > 0 ? count : 1;
  c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::PrivateUse1)].store(&g_guard);
  return 0;
}
__attribute__((visibility("default"))) void fl_guard_set_count(int count) { g_count = count > 0 ? count : 1; }
__attribute__((visibility("default"))) void fl_guard_set_default(int index) { g_default = index; t_current = -1; }
__attribute__((visibility("default"))) int fl_guard_current(void) { return g_guard.getDevice().index(); }
}
