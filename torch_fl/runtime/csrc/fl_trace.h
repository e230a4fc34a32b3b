// fl_trace.h — the kernel records torch.profiler's fl device events come from. fl_trace.cpp records every
// kernel the core or Python launches while a trace runs (device time from plugin events on an asynchronous device,
// else the host clock around the call, which is the device's there); fl_kineto.cpp is Kineto's side.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fl_trace {

struct Kernel {
  std::string name;         // the op that launched it ("aten::mm"), or what the core knows of it
  int device;               // fl index
  int64_t stream;           // torch stream id (0: the default stream)
  int64_t start_ns, end_ns; // Unix time in ns, as PyTorch's own profiler events
  uint64_t correlation;     // Kineto's correlation id of the CPU op that launched it (0: none)
  bool device_timed;        // from plugin events (an asynchronous device), not the host clock
};

void start();              // begin recording (a base event per asynchronous device)
std::vector<Kernel> stop();  // stop, wait for the recorded kernels, and hand their records over
void push_correlation(uint64_t id);  // the CPU op Kineto is in on this thread
void pop_correlation();

}  // namespace fl_trace
