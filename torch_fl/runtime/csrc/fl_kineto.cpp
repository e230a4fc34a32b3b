// fl_kineto.cpp — fl kernels in torch.profiler's traces.
//
// torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1]) asks Kineto for the device's
// activities. PyTorch (2.10 and later: torch/csrc/profiler/standalone/privateuse1_profiler.h) lets a
// PrivateUse1 backend register a Kineto IActivityProfiler for that; this is torch_fl's. Its session turns on
// the core's kernel recorder (fl_trace.h) while the trace runs and hands each recorded launch to Kineto as a
// device kernel activity: the op that launched it, its fl device and stream, its device time (plugin events
// on an asynchronous device), and the correlation id of the CPU op it ran under, which PyTorch uses to book
// device time on that op. With an older torch this file compiles to nothing and fl.profile remains.

#include "fl_core.h"

#if __has_include(<torch/csrc/profiler/standalone/privateuse1_profiler.h>) && __has_include(<IActivityProfiler.h>)
#define USE_KINETO 1
#define FMT_HEADER_ONLY 1  // GenericTraceActivity formats with fmt, which libtorch does not export
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>

#include "fl_trace.h"

namespace {

using libkineto::ActivityType;

class FlSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    fl_trace::start();
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    kernels_ = fl_trace::stop();
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return {}; }
  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }
  // getLinkedActivity maps a correlation id to the CPU op Kineto recorded: linking a kernel to it is how
  // PyTorch books the kernel's device time on the op (key_averages' "Self FL").
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback getLinkedActivity,
                    int64_t, int64_t) override {
    span_ = std::make_unique<libkineto::TraceSpan>(0, 0, "fl");
    activities_.clear();
    for (const fl_trace::Kernel& k : kernels_) {
      activities_.emplace_back(*span_, ActivityType::CONCURRENT_KERNEL, k.name);
      libkineto::GenericTraceActivity& a = activities_.back();
      a.startTime = k.start_ns;
      a.endTime = k.end_ns;
      a.id = static_cast<int32_t>(k.correlation);
      a.device = k.device;
      a.resource = static_cast<int32_t>(k.stream);
      if (getLinkedActivity && k.correlation) a.linked = getLinkedActivity(static_cast<int32_t>(k.correlation));
      a.addMetadataQuoted("device", "fl:" + std::to_string(k.device));
      a.addMetadata("stream", k.stream);
      a.addMetadata("correlation", k.correlation);
      a.addMetadataQuoted("timing", k.device_timed ? "device events" : "host clock around a synchronous kernel");
      a.log(logger);
    }
    status_ = libkineto::TraceStatus::READY;
  }
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return nullptr; }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }
  void pushCorrelationId(uint64_t id) override { fl_trace::push_correlation(id); }
  void popCorrelationId() override { fl_trace::pop_correlation(); }

 private:
  std::vector<fl_trace::Kernel> kernels_;
  std::unique_ptr<libkineto::TraceSpan> span_;
  std::deque<libkineto::GenericTraceActivity> activities_;  // they must outlive the logger's use of them
};

class FlActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return activities_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    return wanted(types) ? std::make_unique<FlSession>() : nullptr;
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  bool wanted(const std::set<ActivityType>& types) const {
    for (ActivityType t : types)
      if (activities_.count(t)) return true;
    return false;
  }
  std::string name_{"torch_fl"};
  std::set<ActivityType> activities_{ActivityType::CONCURRENT_KERNEL, ActivityType::PRIVATEUSE1_RUNTIME,
                                     ActivityType::PRIVATEUSE1_DRIVER};
};

}  // namespace

// Registered when the core is loaded (once per process: the core is loaded once).
REGISTER_PRIVATEUSE1_PROFILER(FlActivityProfiler);

extern "C" int fl_core_kineto(void) { return 1; }
#else
extern "C" int fl_core_kineto(void) { return 0; }
#endif
