// fl_graph.cpp — kernel graph replay (runtime/graph.py, compile/replay.py).
//
// A recorded kernel list (runtime/graph.py): every plugin kernel call a compiled
// graph made, with its descriptors and arguments as they were built (the data
// pointers are the recording's buffers, which Python keeps alive), replayed in
// one call: the inputs copied into the static input buffers, each kernel called
// in order, the static outputs copied out. The first failing status stops the
// replay and says which step failed; Python raises the plugin's error naming the op.
#include <chrono>
#include <string>

#include "fl_core_internal.h"

using namespace fl_core;

namespace {

struct GraphCopy {
  void* ptr;
  size_t nbytes;
};

}  // namespace

struct fl_core_graph {
  int device = 0;
  std::vector<KernelCall> steps;
  std::vector<GraphCopy> inputs;   // static input buffers: where each replay copies the caller's input
  std::vector<GraphCopy> outputs;  // static outputs: what each replay copies out
};

FL_API fl_core_graph_t* fl_core_graph_new(int device) {
  if (find_device(device) == nullptr) return nullptr;
  auto* g = new fl_core_graph_t();
  g->device = device;
  return g;
}

FL_API void fl_core_graph_free(fl_core_graph_t* graph) { delete graph; }

FL_API int fl_core_graph_add_kernel(fl_core_graph_t* graph, const fl_core_kernel_call_t* call) {
  if (graph == nullptr || call == nullptr) return -1;
  KernelCall step(*call);
  if (!step.kernel.valid()) return -1;
  graph->steps.push_back(std::move(step));
  g_call_counts.reserve(call->slot);
  return static_cast<int>(graph->steps.size()) - 1;
}

FL_API int fl_core_graph_add_input(fl_core_graph_t* graph, void* dst, uint64_t nbytes) {
  if (graph == nullptr) return -1;
  graph->inputs.push_back({dst, static_cast<size_t>(nbytes)});
  return 0;
}

FL_API int fl_core_graph_add_output(fl_core_graph_t* graph, void* src, uint64_t nbytes) {
  if (graph == nullptr) return -1;
  graph->outputs.push_back({src, static_cast<size_t>(nbytes)});
  return 0;
}

FL_API int64_t fl_core_graph_size(fl_core_graph_t* graph) {
  return graph == nullptr ? -1 : static_cast<int64_t>(graph->steps.size());
}

// One replay. in_src[k]: the caller's bytes for static input k (skipped where it
// is the static buffer itself; NULL: no input copies); out_dst[k]: where static
// output k goes (NULL: no output copies); run_kernels 0 copies only. With
// step_ns, each kernel's own time (ns) is written there (what bench_fusion
// subtracts to get the host time per kernel). Returns FL_OK, or the failing
// status with *failed = the kernel step, or -1 - k for input copy k, or
// -1 - n_inputs - k for output copy k.
FL_API int fl_core_graph_replay(fl_core_graph_t* graph, void* const* in_src, void* const* out_dst, int run_kernels,
                                int64_t* failed, int64_t* step_ns) {
  if (graph == nullptr) return FL_ERR_INVALID;
  fl_core_graph_t* g = graph;
  Device& d = *g_devices[g->device];
  fl_stream_t stream = current_stream(d, g->device);  // a replay runs on the caller's current stream
  const int64_t n_in = static_cast<int64_t>(g->inputs.size());
  if (in_src != nullptr) {
    for (int64_t k = 0; k < n_in; ++k) {
      const GraphCopy& c = g->inputs[k];
      if (in_src[k] == c.ptr || c.nbytes == 0) continue;
      int status = copy_d2d_on(d, c.ptr, in_src[k], c.nbytes, stream);
      if (status != FL_OK) {
        *failed = -1 - k;
        return status;
      }
    }
  }
  if (run_kernels) {
    const int64_t n = static_cast<int64_t>(g->steps.size());
    for (int64_t k = 0; k < n; ++k) {
      const KernelCall& s = g->steps[k];
      std::chrono::steady_clock::time_point t0;
      if (step_ns) t0 = std::chrono::steady_clock::now();
      TraceSpan span = trace_begin(g->device);
      int status = s.kernel(stream, s.local, s.in.data(), static_cast<int>(s.in.size()), s.out.data(),
                            static_cast<int>(s.out.size()), s.args.data(), static_cast<int>(s.args.size()));
      if (span.on) trace_end(span, "kernel graph step " + std::to_string(k));
      if (step_ns)
        step_ns[k] = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      if (status != FL_OK) {
        *failed = k;
        return status;
      }
    }
    std::lock_guard<std::mutex> lock(g_call_counts.mu);
    std::vector<int64_t>& counts = g_call_counts.per_slot;
    for (const KernelCall& s : g->steps)
      if (s.slot >= 0 && static_cast<size_t>(s.slot) < counts.size()) counts[s.slot]++;
  }
  if (out_dst != nullptr) {
    for (size_t k = 0; k < g->outputs.size(); ++k) {
      const GraphCopy& c = g->outputs[k];
      if (c.nbytes == 0 || out_dst[k] == c.ptr) continue;
      int status = copy_d2d_on(d, out_dst[k], c.ptr, c.nbytes, stream);
      if (status != FL_OK) {
        *failed = -1 - n_in - static_cast<int64_t>(k);
        return status;
      }
    }
  }
  return FL_OK;
}
