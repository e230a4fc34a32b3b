// fl_graph.cpp — kernel graph replay (runtime/graph.py, compile/replay.py).
//
// A recorded kernel list (runtime/graph.py): every plugin kernel call a compiled
// graph made, with its descriptors and arguments as they were built (the data
// pointers are the recording's buffers, which Python keeps alive), replayed in
// one call: the inputs copied into the static input buffers, each kernel called
// in order, the static outputs copied out. The first failing status stops the
// replay and says which step failed; Python raises the plugin's error naming the op.
//
// The fl_graph::replay op is the whole call of a compiled graph's replay in C++ (compile/replay.py): the
// guards on the caller's tensors (the layout of each, the address of each parameter used in place), the
// fresh outputs' allocation and the replay, so that a replayed call costs one op call of Python, not a
// loop over its inputs and outputs.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "fl_core_internal.h"

using namespace fl_core;

namespace {

// A kernel argument that reads a static input buffer: where fl_graph::replay points it at the caller's tensor
// instead of copying that tensor into the buffer (fl_core_graph_bind_input).
struct Reader {
  size_t step, arg;    // steps[step].in[arg]
  int64_t offset;      // its element offset into the static buffer, as recorded
  int64_t itemsize;
};

// A kernel argument inside a static output's bytes: where fl_graph::replay points it at the call's fresh result
// instead of copying the result out of the static buffer (fl_core_graph_bind_output).
struct Access {
  size_t step, arg;  // steps[step].out[arg] (out) or .in[arg]
  bool out;
  int64_t rel;       // its first byte's distance from the output's first byte
  int64_t itemsize;
  void* data0;       // as recorded
  int64_t offset0;
};

struct GraphCopy {
  void* ptr;
  size_t nbytes;
  bool bound = false;            // read in place (its readers patched per call), not copied
  std::vector<Reader> readers;   // bound: every kernel argument that reads the buffer
  void* patched = nullptr;       // where the readers point now (nullptr: at the static buffer)
  bool direct = false;           // an output the kernels write into the call's result (its users patched per call)
  std::vector<Access> users;     // direct: every kernel argument inside the output's bytes
  void* redirected = nullptr;    // where the users point now (nullptr: at the static output)
};

// A tensor argument of the replayed call, as the recording saw it: its layout and, for a parameter used in
// place (static), its address; a copied input's bytes go into the next static input buffer.
struct GuardArg {
  bool copied;
  void* data;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype;
};

// A result of the replayed call: a fresh tensor of its own (own: the region is the tensor), or a view at
// `offset` elements into region `region`, which several outputs share (y and y.view(-1)); or (arg >= 0) a view
// of the call's tensor argument `arg`, `offset` elements past that tensor's own storage offset; or (arg == -2)
// None (an undefined tensor: a gradient the graph does not compute).
struct GraphOut {
  bool own;
  int32_t region;
  int32_t arg = -1;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype;
  int64_t offset;
};

}  // namespace

struct fl_core_graph {
  int device = 0;
  std::vector<KernelCall> steps;
  std::vector<GraphCopy> inputs;   // static input buffers: where each replay copies the caller's input
  std::vector<GraphCopy> outputs;  // static outputs: what each replay copies out (the fresh outputs' regions)
  std::vector<GuardArg> guard;     // fl_graph::replay's tensor arguments, in order
  std::vector<GraphOut> outs;      // fl_graph::replay's results, in order
  // the latest fl_graph::replay call: its guards missed (nothing ran), or its status and failed step
  bool missed = false;
  int status = FL_OK;
  int64_t failed = 0;
  std::mutex mu;  // a replay patches descriptors: one call at a time
  std::vector<void*> in_src;  // graph_replay_in_place's per-call sources, kept (under mu) to spare an allocation
};

namespace {

// The live graphs: fl_graph::replay takes a handle as an int (what Python holds), and a public op must not
// turn any int into a pointer it follows. Never destroyed: graphs owned by other statics (the decomposition
// plans) are freed during static destruction, in no set order.
struct LiveGraphs {
  std::mutex mu;
  std::unordered_set<const fl_core_graph_t*> set;
};

LiveGraphs& live() {
  static auto* graphs = new LiveGraphs();
  return *graphs;
}

bool is_live(const fl_core_graph_t* g) {
  LiveGraphs& l = live();
  std::lock_guard<std::mutex> lock(l.mu);
  return l.set.count(g) != 0;
}

}  // namespace

FL_API fl_core_graph_t* fl_core_graph_new(int device) {
  if (find_device(device) == nullptr) return nullptr;
  auto* g = new fl_core_graph_t();
  g->device = device;
  LiveGraphs& l = live();
  std::lock_guard<std::mutex> lock(l.mu);
  l.set.insert(g);
  return g;
}

FL_API void fl_core_graph_free(fl_core_graph_t* graph) {
  {
    LiveGraphs& l = live();
    std::lock_guard<std::mutex> lock(l.mu);
    l.set.erase(graph);
  }
  delete graph;
}

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

namespace {

int64_t fl_dtype_itemsize(int32_t dtype) {
  switch (dtype) {
    case FL_FLOAT32: case FL_INT32: return 4;
    case FL_FLOAT64: case FL_INT64: case FL_COMPLEX64: return 8;
    case FL_COMPLEX128: return 16;
    case FL_FLOAT16: case FL_BFLOAT16: case FL_INT16: return 2;
    case FL_INT8: case FL_UINT8: case FL_BOOL: return 1;
    default: return 0;
  }
}

// Static input k's readers point at `base` (a storage's data: what descriptors hold) `byte_offset` bytes in,
// or back at the static buffer (base nullptr). False where an offset is not a whole number of a reader's
// elements (nothing changed then: the input is copied this call).
bool point_readers(GraphCopy& c, std::vector<KernelCall>& steps, void* base, int64_t byte_offset) {
  if (base == nullptr && c.patched == nullptr) return true;
  if (base != nullptr)
    for (const Reader& r : c.readers)
      if (byte_offset % r.itemsize != 0) return false;
  for (const Reader& r : c.readers) {
    fl_tensor_t& t = steps[r.step].in[r.arg];
    t.data = base != nullptr ? base : c.ptr;
    t.offset = r.offset + (base != nullptr ? byte_offset / r.itemsize : 0);
  }
  c.patched = base;
  return true;
}

}  // namespace

FL_API int fl_core_graph_bind_input(fl_core_graph_t* graph, int64_t k) {
  if (graph == nullptr || k < 0 || static_cast<size_t>(k) >= graph->inputs.size()) return -1;
  GraphCopy& c = graph->inputs[k];
  std::vector<Reader> readers;
  for (size_t s = 0; s < graph->steps.size(); ++s) {
    const KernelCall& step = graph->steps[s];
    for (const fl_tensor_t& t : step.out)
      if (t.data == c.ptr) return 0;  // a kernel writes into it: the caller's tensor must not see that
    for (size_t a = 0; a < step.in.size(); ++a) {
      const fl_tensor_t& t = step.in[a];
      if (t.data != c.ptr) continue;
      const int64_t size = fl_dtype_itemsize(t.dtype);
      if (size == 0) return 0;
      readers.push_back({s, a, t.offset, size});
    }
  }
  c.readers = std::move(readers);
  c.bound = true;
  return 1;
}

FL_API int fl_core_graph_add_output(fl_core_graph_t* graph, void* src, uint64_t nbytes) {
  if (graph == nullptr) return -1;
  graph->outputs.push_back({src, static_cast<size_t>(nbytes)});
  return 0;
}

namespace {

// The bytes a kernel argument spans, [*lo, *hi), and whether it covers them without holes or overlaps (dense).
// 0: no elements; -1: a layout whose bytes this cannot tell (an unknown dtype, a negative stride); 1: ok.
int byte_range(const fl_tensor_t& t, char** lo, char** hi, int64_t* itemsize, bool* dense) {
  const int64_t size = fl_dtype_itemsize(t.dtype);
  if (size == 0 || t.ndim < 0 || t.ndim > FL_MAX_DIMS) return -1;
  int64_t numel = 1, span = 1;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that move
  for (int d = 0; d < t.ndim; ++d) {
    if (t.sizes[d] == 0) return 0;
    if (t.strides[d] < 0) return -1;
    numel *= t.sizes[d];
    span += (t.sizes[d] - 1) * t.strides[d];
    if (t.sizes[d] > 1) dims.emplace_back(t.strides[d], t.sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  *dense = true;
  for (const auto& [stride, n] : dims) {
    if (stride != expected) *dense = false;
    expected *= n;
  }
  *dense = *dense && numel == span;
  *lo = static_cast<char*>(t.data) + t.offset * size;
  *hi = *lo + span * size;
  *itemsize = size;
  return 1;
}

// Output k's users point at `dst` (the call's fresh result, its first byte) or back at the static output (nullptr).
void redirect(GraphCopy& c, std::vector<KernelCall>& steps, void* dst) {
  if (dst == c.redirected) return;
  for (const Access& a : c.users) {
    fl_tensor_t& t = a.out ? steps[a.step].out[a.arg] : steps[a.step].in[a.arg];
    t.data = dst != nullptr ? dst : a.data0;
    t.offset = dst != nullptr ? a.rel / a.itemsize : a.offset0;
  }
  c.redirected = dst;
}

}  // namespace

FL_API int fl_core_graph_bind_output(fl_core_graph_t* graph, int64_t k) {
  if (graph == nullptr || k < 0 || static_cast<size_t>(k) >= graph->outputs.size()) return -1;
  GraphCopy& c = graph->outputs[k];
  if (c.nbytes == 0) return 0;
  char* const lo = static_cast<char*>(c.ptr);
  char* const hi = lo + c.nbytes;
  for (size_t j = 0; j < graph->outputs.size(); ++j) {  // outputs sharing bytes: one result per byte, or copies
    const char* o = static_cast<const char*>(graph->outputs[j].ptr);
    if (j != static_cast<size_t>(k) && o < hi && o + graph->outputs[j].nbytes > lo) return 0;
  }
  std::vector<Access> users;
  for (size_t s = 0; s < graph->steps.size(); ++s) {
    const KernelCall& step = graph->steps[s];
    bool read = false, covered = false;
    for (int side = 0; side < 2; ++side) {
      const std::vector<fl_tensor_t>& args = side ? step.out : step.in;
      for (size_t a = 0; a < args.size(); ++a) {
        char *b = nullptr, *e = nullptr;
        int64_t size = 0;
        bool dense = false;
        const int r = byte_range(args[a], &b, &e, &size, &dense);
        if (r == 0) continue;
        if (r < 0) return 0;  // an argument whose bytes cannot be told may touch the output: it stays a copy
        if (b >= hi || e <= lo) continue;
        if (b < lo || e > hi || (b - lo) % size != 0) return 0;  // partly inside, or at an inexpressible offset
        users.push_back({s, a, side == 1, b - lo, size, args[a].data, args[a].offset});
        if (side == 0) read = true;
        else if (b == lo && e == hi && dense) covered = true;
      }
    }
    // the first kernel to touch the output must write all of it and read none of it: then no replay depends on
    // what the result's fresh memory held before (the recording's static output was fresh memory too)
    if (users.size() > 0 && users.front().step == s && (read || !covered)) return 0;
  }
  if (users.empty()) return 0;  // no kernel writes it (a value made before the graph): copied out
  c.users = std::move(users);
  c.direct = true;
  return 1;
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
namespace {

// The replay itself (the caller holds g->mu): a bound input's readers read wherever they point now.
int run_graph(fl_core_graph_t* g, void* const* in_src, void* const* out_dst, int run_kernels, int64_t* failed,
              int64_t* step_ns) {
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
      if (c.nbytes == 0 || out_dst[k] == c.ptr || (c.redirected != nullptr && c.redirected == out_dst[k])) continue;
      int status = copy_d2d_on(d, out_dst[k], c.ptr, c.nbytes, stream);
      if (status != FL_OK) {
        *failed = -1 - n_in - static_cast<int64_t>(k);
        return status;
      }
    }
  }
  return FL_OK;
}

}  // namespace

int fl_core::graph_replay_in_place(fl_core_graph_t* graph, void* const* base, const int64_t* offset,
                                   void* const* out_dst, int64_t* failed) {
  std::lock_guard<std::mutex> lock(graph->mu);
  std::vector<void*>& in_src = graph->in_src;
  in_src.resize(graph->inputs.size());
  for (size_t k = 0; k < in_src.size(); ++k) {
    GraphCopy& c = graph->inputs[k];
    if (c.bound && point_readers(c, graph->steps, base[k], offset[k])) {
      in_src[k] = c.ptr;  // read where it is: nothing to copy
    } else {
      point_readers(c, graph->steps, nullptr, 0);
      in_src[k] = static_cast<char*>(base[k]) + offset[k];
    }
  }
  for (size_t k = 0; k < graph->outputs.size(); ++k) {  // a direct output is written where the caller wants it
    GraphCopy& c = graph->outputs[k];
    if (c.direct) redirect(c, graph->steps, out_dst != nullptr ? out_dst[k] : nullptr);
  }
  return run_graph(graph, in_src.data(), out_dst, 1, failed, nullptr);
}

FL_API int fl_core_graph_replay(fl_core_graph_t* graph, void* const* in_src, void* const* out_dst, int run_kernels,
                                int64_t* failed, int64_t* step_ns) {
  if (graph == nullptr) return FL_ERR_INVALID;
  std::lock_guard<std::mutex> lock(graph->mu);
  for (GraphCopy& c : graph->inputs)  // readers the op pointed at a caller's tensor read the static buffer again
    point_readers(c, graph->steps, nullptr, 0);
  for (GraphCopy& c : graph->outputs)  // and the kernels write the static outputs, which this copies out
    redirect(c, graph->steps, nullptr);
  return run_graph(graph, in_src, out_dst, run_kernels, failed, step_ns);
}

FL_API int fl_core_graph_guard_tensor(fl_core_graph_t* graph, int copied, void* data, const fl_core_layout_t* layout) {
  if (graph == nullptr || layout == nullptr || layout->ndim < 0) return -1;
  const int n = layout->ndim;
  graph->guard.push_back({copied != 0, data, std::vector<int64_t>(layout->sizes, layout->sizes + n),
                          std::vector<int64_t>(layout->strides, layout->strides + n),
                          static_cast<c10::ScalarType>(layout->dtype)});
  return 0;
}

FL_API int fl_core_graph_out_tensor(fl_core_graph_t* graph, int region, int own, const fl_core_layout_t* layout,
                                    int64_t offset) {
  if (graph == nullptr || layout == nullptr || layout->ndim < 0 || region < 0 ||
      static_cast<size_t>(region) >= graph->outputs.size())
    return -1;
  const int n = layout->ndim;
  graph->outs.push_back({own != 0, region, -1, std::vector<int64_t>(layout->sizes, layout->sizes + n),
                         std::vector<int64_t>(layout->strides, layout->strides + n),
                         static_cast<c10::ScalarType>(layout->dtype), offset});
  return 0;
}

FL_API int fl_core_graph_out_view(fl_core_graph_t* graph, int arg, const fl_core_layout_t* layout, int64_t offset) {
  if (graph == nullptr || layout == nullptr || layout->ndim < 0 || arg < 0 ||
      static_cast<size_t>(arg) >= graph->guard.size())
    return -1;
  const int n = layout->ndim;
  graph->outs.push_back({false, -1, arg, std::vector<int64_t>(layout->sizes, layout->sizes + n),
                         std::vector<int64_t>(layout->strides, layout->strides + n),
                         static_cast<c10::ScalarType>(layout->dtype), offset});
  return 0;
}

FL_API int fl_core_graph_out_none(fl_core_graph_t* graph) {
  if (graph == nullptr) return -1;
  graph->outs.push_back({false, -1, -2, {}, {}, c10::ScalarType::Undefined, 0});
  return 0;
}

FL_API int fl_core_graph_last_call(fl_core_graph_t* graph, int* missed, int64_t* failed) {
  if (graph == nullptr) return FL_ERR_INVALID;
  *missed = graph->missed ? 1 : 0;
  *failed = graph->failed;
  return graph->status;
}

namespace {

void* data_of(const at::Tensor& t) {
  return static_cast<char*>(const_cast<void*>(t.storage().data())) + t.storage_offset() * t.itemsize();
}

// fl_graph::replay(graph, tensors): the graph's results, or an empty list where a guard missed (nothing ran)
// or the replay failed (fl_core_graph_last_call says which, and the failed step).
std::vector<at::Tensor> replay_op(int64_t handle, at::TensorList args) {
  auto* g = reinterpret_cast<fl_core_graph_t*>(handle);
  TORCH_CHECK(is_live(g), "fl_graph::replay: ", handle,
              " is not a live kernel graph (the op is torch_fl's graph replay, called by compiled graphs)");
  std::vector<at::Tensor> result;
  g->missed = true;
  g->status = FL_OK;
  g->failed = 0;
  if (args.size() != g->guard.size()) return result;
  std::vector<void*> base;
  std::vector<int64_t> offset;
  base.reserve(g->inputs.size());
  offset.reserve(g->inputs.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const GuardArg& a = g->guard[i];
    const at::Tensor& t = args[i];
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || t.device().index() != g->device ||
        t.scalar_type() != a.dtype || t.sizes() != c10::IntArrayRef(a.sizes) ||
        t.strides() != c10::IntArrayRef(a.strides))
      return result;
    if (!a.copied) {
      if (data_of(t) != a.data) return result;
      continue;
    }
    if (base.size() >= g->inputs.size()) return result;
    base.push_back(const_cast<void*>(t.storage().data()));
    offset.push_back(t.storage_offset() * static_cast<int64_t>(t.itemsize()));
  }
  if (base.size() != g->inputs.size()) return result;
  g->missed = false;
  const c10::DeviceGuard device_guard(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(g->device)));
  std::vector<void*> out_dst(g->outputs.size(), nullptr);
  std::vector<c10::Storage> regions(g->outputs.size());
  result.reserve(g->outs.size());
  for (const GraphOut& o : g->outs) {
    if (o.arg == -2) {
      result.emplace_back();
      continue;
    }
    if (o.arg >= 0) {  // the same view of the caller's tensor as the recording's output was of its input
      const at::Tensor& a = args[o.arg];
      result.push_back(a.as_strided(o.sizes, o.strides, a.storage_offset() + o.offset));
      continue;
    }
    if (o.own) {
      at::Tensor t = at::detail::empty_strided_generic(o.sizes, o.strides, device_allocator(), kFlKeys, o.dtype);
      out_dst[o.region] = data_of(t);
      result.push_back(std::move(t));
      continue;
    }
    c10::Storage& region = regions[o.region];
    if (!region) {
      const size_t nbytes = g->outputs[o.region].nbytes;
      region = c10::Storage(c10::Storage::use_byte_size_t(), nbytes, device_allocator(), /*resizable=*/true);
      out_dst[o.region] = region.mutable_data();
    }
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(region), kFlKeys,
                                                            c10::scalarTypeToTypeMeta(o.dtype));
    t.unsafeGetTensorImpl()->set_sizes_and_strides(o.sizes, o.strides, o.offset);
    result.push_back(std::move(t));
  }
  int64_t failed = 0;
  const int status = graph_replay_in_place(g, base.data(), offset.data(), out_dst.data(), &failed);
  if (status != FL_OK) {
    g->status = status;
    g->failed = failed;
    result.clear();
  }
  return result;
}

}  // namespace

TORCH_LIBRARY(fl_graph, m) { m.def("replay(int graph, Tensor[] args) -> Tensor[]"); }

// At the autograd level: the op makes fresh tensors and calls no other op, so nothing is recorded for autograd,
// whatever the grad mode (a compiled forward's parameters require grad).
TORCH_LIBRARY_IMPL(fl_graph, CompositeImplicitAutograd, m) { m.impl("replay", replay_op); }
