// fl_guard.cpp — the device guard (C10_REGISTER_GUARD_IMPL's interface): current device, streams, events.
//
// A stream id is what PyTorch's c10::Stream carries; the guard maps it to the plugin's handle. The current
// stream is per thread and per device, as CUDA's is: kernels, copies and fills go to it. An event is the
// plugin's (when it has events) and the host time it was recorded at.
#include <chrono>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "fl_core_internal.h"

using namespace fl_core;

// Streams made through the guard, all devices: while none is, every current stream is the default one,
// which Python's kernel calls read from here without a call into the core.
extern "C" {
volatile int64_t fl_core_streams_made = 0;
}

namespace {

constexpr size_t kStreamPool = 8;  // streams torch.Stream() hands out per device, in turn (CUDA keeps 32)
thread_local c10::StreamId t_stream[kMaxDevices] = {};

}  // namespace

namespace fl_core {

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

// A device whose kernels complete within their call (no FL_FEATURE_ASYNC_KERNELS) runs the next kernel at
// once, so a copy it queued on a stream must land first.
int copy_d2d_on(Device& d, void* dst, const void* src, size_t n, fl_stream_t s) {
  int status = d.plugin->copy_d2d(d.local, dst, src, n, s);
  if (status == FL_OK && s != nullptr && !(d.features & FL_FEATURE_ASYNC_KERNELS) && d.plugin->stream_synchronize)
    status = d.plugin->stream_synchronize(d.local, s);
  return status;
}

void copy_on_current(int index, CopyKind kind, void* dst, const void* src, size_t n) {
  Device& d = device_at(index);
  fl_stream_t s = current_stream(d, index);
  if (kind == CopyKind::kDeviceToDevice) {
    check_status(d, copy_d2d_on(d, dst, src, n, s), "copy_d2d");
    return;
  }
  const bool h2d = kind == CopyKind::kHostToDevice;
  int status = h2d ? d.plugin->copy_h2d(d.local, dst, src, n, s) : d.plugin->copy_d2h(d.local, dst, src, n, s);
  if (status == FL_OK && s != nullptr && d.plugin->stream_synchronize) status = d.plugin->stream_synchronize(d.local, s);
  check_status(d, status, h2d ? "copy_h2d" : "copy_d2h");
}

void zero_on_current(int index, void* dst, size_t n) {
  Device& d = device_at(index);
  fl_stream_t s = current_stream(d, index);
  int status = d.plugin->mem_set(d.local, dst, 0, n, s);
  if (status == FL_OK && s != nullptr && !(d.features & FL_FEATURE_ASYNC_KERNELS) && d.plugin->stream_synchronize)
    status = d.plugin->stream_synchronize(d.local, s);  // a kernel called next runs at once: land first
  check_status(d, status, "mem_set");
}

}  // namespace fl_core

namespace {

// elapsed_time asks the plugin (event_elapsed: device time, what an asynchronous device must give); a plugin
// without it runs its kernels before their call returns, so the host times are the device's.
struct FlEvent {
  void* plugin_event = nullptr;
  int device = 0;
  std::chrono::steady_clock::time_point when{};
};

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

}  // namespace

c10::impl::DeviceGuardImplInterface* fl_core::guard_impl() { return &g_guard; }

// The plugin handle of this thread's current stream on fl:index (NULL: the default stream), where Python's
// kernel calls, copies and fills go.
FL_API fl_stream_t fl_core_current_stream(int index) {
  Device* d = find_device(index);
  return d == nullptr ? nullptr : current_stream(*d, index);
}
