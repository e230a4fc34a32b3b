// fl_trace.cpp — the kernel recorder torch.profiler's fl device events come from (fl_trace.h).
//
// While torch.profiler records the fl device (fl_kineto.cpp), each kernel launch is recorded: on a device
// whose kernels run after their call returns, with plugin events around it on its stream (device time,
// resolved when the trace stops against a base event); elsewhere with the host clock around the call. The
// fast path and kernel graphs record their launches here; Python's kernel calls through fl_core_trace_begin
// and fl_core_trace_end.
#include <chrono>

#include "fl_core_internal.h"
#include "fl_trace.h"

using namespace fl_core;

extern "C" {
volatile int fl_core_tracing = 0;  // Python reads it
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
// Python's kernel calls, while a trace runs: begin before the call, end after it, on the same thread (a
// stack, so nested calls pair up).
thread_local std::vector<TraceSpan> t_spans;

int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool device_timed(const Device& d) {
  return (d.features & FL_FEATURE_ASYNC_KERNELS) && d.plugin->event_create && d.plugin->event_record &&
         d.plugin->event_elapsed && d.plugin->event_synchronize && d.plugin->event_destroy;
}

}  // namespace

namespace fl_core {

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

}  // namespace fl_core

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

// ------------------------------------------------------------------ C API ---

FL_API void fl_core_trace_begin(int index) { t_spans.push_back(trace_begin(index)); }

FL_API void fl_core_trace_end(const char* name) {
  if (t_spans.empty()) return;
  TraceSpan sp = t_spans.back();
  t_spans.pop_back();
  trace_end(sp, name ? name : "kernel");
}
