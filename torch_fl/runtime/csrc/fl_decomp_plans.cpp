// fl_decomp_plans.cpp — decomposition plans: an op the Python dispatcher serves by a decomposition, replayed
// per signature as the kernel graph of its first call.
//
// On narrow chips many ops (addmm, gelu, log_softmax, nll_loss, ...) are decompositions: a few cheap kernels
// behind a few hundred microseconds of Python (torch._refs and the dispatcher). Python records such a call once
// (dispatch/decomp_replay.py): the decomposition runs on private copies of the op's tensors while a kernel graph
// records (runtime/graph.py), and the graph, its static buffers and what Python counted are committed here
// under the call's fast-path key and the values that key leaves out (floats, numbers given as 0-dim CPU tensors:
// a decomposition may bake them into its kernels). A later call with the same key and values (same op, layouts,
// dtypes and every value) replays the graph (fl_graph.cpp), its kernels reading the call's tensors in place
// where none writes into them (the others are copied into the static inputs first), and copies the static
// outputs into fresh tensors or the call's out= tensors. The plan
// owns its graph and holds a reference to every buffer the graph uses: forgetting it gives the memory back.
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>

#include "fl_core_internal.h"
#include "fl_cpu_fallback.h"
#include "fl_decomp_plans.h"

using namespace fl_core;

namespace {

struct GraphDeleter {
  void operator()(fl_core_graph_t* g) const { fl_core_graph_free(g); }
};

struct Output {
  int32_t arg;  // the out= argument it is copied into, or -1: a fresh tensor of this layout
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype;
};

struct DecompPlan {
  std::unique_ptr<fl_core_graph_t, GraphDeleter> graph;
  int device = 0;
  c10::StreamId stream = 0;  // the stream it was recorded on: its static buffers are used in that stream's order
  int64_t kernels = 0;
  int64_t nbytes = 0;
  std::vector<int32_t> inputs;
  std::vector<Output> outputs;
  std::vector<int32_t> returns;
  std::vector<int64_t> slots;
  std::vector<c10::Storage> keep;
  // process-wide settings a decomposition may read and the key does not hold: a replay under others is Python's
  c10::ScalarType default_dtype = c10::ScalarType::Float;
  bool deterministic = false;
  std::mutex busy;  // one replay at a time: the static buffers are the plan's
};

// Bounds on what the plans hold: a plan that would pass them forgets the others first (as the native fast
// path's cache does), so a working set that changes does not leave its new signatures in Python.
constexpr size_t kPlansMax = 4096;
constexpr int64_t kBytesMax = int64_t(256) << 20;

std::mutex g_mu;
std::unordered_map<std::vector<int64_t>, std::shared_ptr<DecompPlan>, KeyHash> g_plans;
int64_t g_bytes = 0;  // under g_mu
std::atomic<int64_t> g_hits{0}, g_kernels{0};

void* data_of(const at::Tensor& t) {
  return static_cast<char*>(const_cast<void*>(t.storage().data())) + t.storage_offset() * t.itemsize();
}

// A plan's key: the fast-path key, then the values it leaves out after a marker no key element takes.
std::vector<int64_t> with_values(const std::vector<int64_t>& key, const std::vector<int64_t>& values) {
  std::vector<int64_t> k;
  k.reserve(key.size() + 1 + values.size());
  k.insert(k.end(), key.begin(), key.end());
  k.push_back(-14);
  k.insert(k.end(), values.begin(), values.end());
  return k;
}

c10::ScalarType default_dtype() { return c10::typeMetaToScalarType(c10::get_default_dtype()); }

bool run(DecompPlan& plan, torch::jit::Stack* stack, size_t n) {
  if (default_dtype() != plan.default_dtype || at::globalContext().deterministicAlgorithms() != plan.deterministic)
    return false;
  std::unique_lock<std::mutex> busy(plan.busy, std::try_to_lock);
  if (!busy.owns_lock() || current_stream_id(plan.device) != plan.stream) return false;
  const size_t base = stack->size() - n;
  auto arg = [&](int32_t i) -> const c10::IValue& { return (*stack)[base + i]; };
  std::vector<void*> in(plan.inputs.size()), out(plan.outputs.size());
  std::vector<int64_t> offset(plan.inputs.size());
  for (size_t j = 0; j < in.size(); ++j) {  // the storage and byte offset: a bound input is read where it is
    const at::Tensor& t = arg(plan.inputs[j]).toTensor();
    in[j] = const_cast<void*>(t.storage().data());
    offset[j] = t.storage_offset() * static_cast<int64_t>(t.itemsize());
  }
  std::vector<at::Tensor> fresh(plan.outputs.size());
  c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(plan.device));
  for (size_t k = 0; k < out.size(); ++k) {
    const Output& o = plan.outputs[k];
    if (o.arg >= 0) {
      out[k] = data_of(arg(o.arg).toTensor());
      continue;
    }
    const c10::DeviceGuard guard(where);
    fresh[k] = at::detail::empty_strided_generic(o.sizes, o.strides, device_allocator(), kFlKeys, o.dtype);
    out[k] = data_of(fresh[k]);
  }
  int64_t failed = 0;
  if (graph_replay_in_place(plan.graph.get(), in.data(), offset.data(), out.data(), &failed) != FL_OK) return false;
  std::vector<c10::IValue> results;
  results.reserve(plan.returns.size());
  for (int32_t r : plan.returns) results.emplace_back(r >= 0 ? arg(r) : c10::IValue(fresh[-1 - r]));
  if (g_watch_n.load(std::memory_order_relaxed) != 0) {
    for (const Output& o : plan.outputs)
      if (o.arg >= 0) note_write(arg(o.arg).toTensor().storage().data());
  }
  torch::jit::drop(*stack, n);
  for (auto& v : results) stack->push_back(std::move(v));
  g_call_counts.add(plan.slots.data(), plan.slots.size());
  g_hits++;
  g_kernels += plan.kernels;
  return true;
}

}  // namespace

namespace fl_decomp {

bool serve(const std::vector<int64_t>& key, const std::vector<int64_t>& values, torch::jit::Stack* stack, size_t n) {
  std::shared_ptr<DecompPlan> plan;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_plans.empty()) return false;
    auto it = values.empty() ? g_plans.find(key) : g_plans.find(with_values(key, values));
    if (it == g_plans.end()) return false;
    plan = it->second;
  }
  return run(*plan, stack, n);
}

void clear() {
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<DecompPlan>, KeyHash> gone;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    gone.swap(g_plans);
    g_bytes = 0;
  }
  // the buffers go back here, outside the lock (a storage's deleter may take other locks)
}

}  // namespace fl_decomp

// ------------------------------------------------------------------ C API ---

FL_API int fl_core_decomp_commit(const fl_core_decomp_plan_t* p) {
  if (p == nullptr) return 0;
  auto plan = std::make_shared<DecompPlan>();
  plan->graph.reset(p->graph);  // the core's from now on, kept or not
  const std::vector<int64_t>* pending = fl_cpu_fallback::pending_key(p->name);
  const std::vector<int64_t>* values = fl_cpu_fallback::pending_values(p->name);
  if (pending == nullptr || values == nullptr || plan->graph == nullptr || find_device(p->device) == nullptr) return 0;
  const std::vector<int64_t> key = values->empty() ? *pending : with_values(*pending, *values);
  plan->device = p->device;
  plan->stream = current_stream_id(p->device);
  plan->default_dtype = default_dtype();
  plan->deterministic = at::globalContext().deterministicAlgorithms();
  plan->kernels = fl_core_graph_size(p->graph);
  plan->nbytes = p->nbytes;
  plan->inputs = copy_of(p->inputs, p->n_inputs);
  for (int32_t k = 0; k < p->n_outputs; ++k) {
    const fl_tensor_t& d = p->output_layouts[k];
    if (d.ndim < 0 || d.ndim > FL_MAX_DIMS) return 0;
    plan->outputs.push_back({p->output_src[k], std::vector<int64_t>(d.sizes, d.sizes + d.ndim),
                             std::vector<int64_t>(d.strides, d.strides + d.ndim),
                             static_cast<c10::ScalarType>(p->output_dtypes[k])});
  }
  plan->returns = copy_of(p->returns, p->n_returns);
  for (int32_t r : plan->returns)
    if (r < 0 && -1 - r >= p->n_outputs) return 0;
  plan->slots = copy_of(p->slots, p->n_slots);
  for (int64_t slot : plan->slots) g_call_counts.reserve(slot);
  for (int32_t i = 0; i < p->n_keep; ++i) {
    auto* impl = static_cast<c10::StorageImpl*>(p->keep[i]);
    if (impl != nullptr) plan->keep.emplace_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
  }
  if (plan->nbytes > kBytesMax) return 0;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<DecompPlan>, KeyHash> gone;  // freed after the lock
  std::shared_ptr<DecompPlan> replaced;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_plans.find(key);
  if (it != g_plans.end()) {  // the signature recorded again (on another stream): the new plan replaces it
    g_bytes -= it->second->nbytes;
    replaced = std::move(it->second);
    g_plans.erase(it);
  }
  if (g_plans.size() >= kPlansMax || g_bytes + plan->nbytes > kBytesMax) {
    gone.swap(g_plans);
    g_bytes = 0;
  }
  g_bytes += plan->nbytes;
  g_plans.emplace(key, std::move(plan));
  return 1;
}

FL_API int64_t fl_core_decomp_size(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<int64_t>(g_plans.size());
}

FL_API int64_t fl_core_decomp_bytes(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_bytes;
}

FL_API int64_t fl_core_decomp_hits(void) { return g_hits.load(); }

FL_API int64_t fl_core_decomp_kernels(void) { return g_kernels.load(); }
