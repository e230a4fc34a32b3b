// fl_device.cpp — the device table and the PrivateUse1 hooks.
//
// Python fills the table (fl_core_add_device: global fl index -> plugin, local device, capacity, features) before
// any tensor lives on a device, then installs the guard and the hooks (fl_core_install). The hooks are what
// PyTorch asks about the device outside an operator: generators, the current device, pinned host memory, and
// UntypedStorage.resize_.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "fl_core_internal.h"

namespace fl_core {

Device* g_devices[kMaxDevices] = {};
std::atomic<int> g_count{0};
std::atomic<int> g_default{0};
thread_local int t_current = -1;

Device& device_at(int index) {
  TORCH_CHECK(index >= 0 && index < g_count.load() && g_devices[index] != nullptr,
              "fl:", index, " does not exist: ", g_count.load(), " fl device(s) are available "
              "(torch.fl.device_count()); pick one of them");
  return *g_devices[index];
}

Device* find_device(int index) {
  if (index < 0 || index >= g_count.load()) return nullptr;
  return g_devices[index];
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

}  // namespace fl_core

using namespace fl_core;

namespace {

const c10::impl::DeviceGuardImplInterface& guard() { return *guard_impl(); }

struct FlHooks final : public at::PrivateUse1HooksInterface {
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return new_generator(index); }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_count.load() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return guard().deviceCount(); }
  c10::DeviceIndex getCurrentDevice() const override { return guard().getDevice().index(); }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    guard().setDevice(c10::Device(c10::DeviceType::PrivateUse1, d));
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    return guard().exchangeDevice(c10::Device(c10::DeviceType::PrivateUse1, d)).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
};
FlHooks* g_hooks = nullptr;

}  // namespace

FL_API int fl_core_abi(void) { return FL_ABI_VERSION; }

// Installs the guard (replacing PyTorch's Python one) and the hooks.
// Returns 1 when torch_fl's hooks are in place, 0 when another extension's are.
FL_API int fl_core_install(void) {
  c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::PrivateUse1)].store(guard_impl());
  if (g_hooks) return 1;
  if (at::isPrivateUse1HooksRegistered()) return 0;
  g_hooks = new FlHooks();
  at::RegisterPrivateUse1HooksInterface(g_hooks);
  return 1;
}

// Device fl:index is the plugin's local device. Called before any tensor lives on it.
FL_API int fl_core_add_device(int index, const fl_core_device_t* device) {
  if (index < 0 || index >= kMaxDevices || device == nullptr || device->plugin == nullptr) return -1;
  if (g_devices[index] == nullptr) g_devices[index] = new Device();
  Device& d = *g_devices[index];
  d.plugin = device->plugin;
  d.local = device->local;
  d.total = device->total_memory;
  d.features = device->features;
  d.label = device->label ? device->label : "fl";
  d.pool.limit = device->pool_limit;
  if (index + 1 > g_count.load()) g_count = index + 1;
  return 0;
}

FL_API void fl_core_set_default(int index) {
  g_default = index;
  t_current = -1;
}
FL_API int fl_core_current(void) { return current_index(); }
