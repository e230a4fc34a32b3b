// fl_fallback.cpp — the boxed PrivateUse1 fallback and its fast path.
//
// Every op without a kernel of its own (fl_meta_ops.cpp) reaches this boxed fallback. The Python dispatcher
// decides each op signature's plan once; when the plan was a native kernel called on the op's own arguments,
// Python commits the call's marshalling here (fl_core_fast_commit) and later calls with the same signature run
// from this cache: descriptors patched with the new data pointers and floats, fresh outputs allocated, the
// plugin kernel called, no Python. A call served by a decomposition may be replayed from its recorded kernel
// graph the same way (fl_decomp_plans.cpp). Everything else goes to the Python dispatcher, which Python registers
// as the fallback of the otherwise unused PrivateUse3 key (so no Python API is needed here).
#include <algorithm>
#include <cstring>
#include <memory>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/library.h>
#include <torch/version.h>

#include "fl_core_internal.h"
#include "fl_cpu_fallback.h"
#include "fl_decomp_plans.h"

using namespace fl_core;

namespace fl_core {
CallCounts g_call_counts;
}

namespace {

// Every op without a kernel above reaches this boxed fallback. The Python
// dispatcher decides each op signature's plan once; when the plan was a native
// kernel called on the op's own arguments, Python commits the call's marshalling
// here (fl_core_fast_commit) and later calls with the same signature run from
// this cache: descriptors patched with the new data pointers and floats, fresh
// outputs allocated, the plugin kernel called, no Python. Everything else goes
// to the Python dispatcher, which Python registers as the fallback of the
// otherwise unused PrivateUse3 key (so no Python API is needed here).

// What a call's marshalling depends on besides the values the fast path patches
// (data pointers, storage offsets, floats): the op, each tensor's device, dtype,
// sizes, strides, math bits and which earlier argument it aliases, and the
// value of every other argument.
//
// The values the native fast path patches per call are kept aside in `values` (a float's bits, the value of a
// number given as a 0-dim CPU tensor): a decomposition may bake them into its kernels (leaky_relu's slope,
// layer_norm's eps), so its plans are keyed on them too (fl_decomp_plans.cpp).
struct KeyBuilder {
  std::vector<int64_t> k;
  std::vector<int64_t> values;
  std::vector<const void*> bases;  // storage base of every tensor seen, in order
  std::vector<int64_t> offsets;    // and its storage offset
  bool ok = true;

  void bits(double d) {
    int64_t b;
    std::memcpy(&b, &d, sizeof b);
    values.push_back(b);
  }

  // the value of a 0-dim CPU tensor (a Python number an op promoted to a tensor): integers exactly, floats by
  // their bits, complex numbers as two floats. Read from its memory: this runs on every call that has one.
  void number(const at::Tensor& t) {
    const void* p = t.const_data_ptr();
    switch (t.scalar_type()) {
      case c10::ScalarType::Double: bits(*static_cast<const double*>(p)); break;
      case c10::ScalarType::Float: bits(*static_cast<const float*>(p)); break;
      case c10::ScalarType::Long: values.push_back(*static_cast<const int64_t*>(p)); break;
      case c10::ScalarType::Int: values.push_back(*static_cast<const int32_t*>(p)); break;
      case c10::ScalarType::Bool: values.push_back(*static_cast<const bool*>(p)); break;
      case c10::ScalarType::ComplexDouble: {
        const auto* z = static_cast<const c10::complex<double>*>(p);
        bits(z->real());
        bits(z->imag());
        break;
      }
      default:
        try {
          if (c10::isComplexType(t.scalar_type())) {
            auto z = t.item<c10::complex<double>>();
            bits(z.real());
            bits(z.imag());
          } else if (c10::isFloatingType(t.scalar_type())) {
            bits(t.item<double>());
          } else {
            values.push_back(t.item<int64_t>());
          }
        } catch (const std::exception&) {
          ok = false;  // a number item() cannot read (a quantized dtype ...): the Python path says what it is
        }
    }
  }

  void tensor(const at::Tensor& t, int64_t tag) {
    if (!t.defined()) {
      k.push_back(-7);
      return;
    }
    k.push_back(tag);
    const auto dev = t.device();
    if (dev.type() == c10::DeviceType::PrivateUse1) {
      k.push_back(dev.index());
    } else if (dev.type() == c10::DeviceType::CPU && t.dim() == 0) {
      k.push_back(-1000 - static_cast<int64_t>(t.unsafeGetTensorImpl()->is_wrapped_number()));
      number(t);
    } else {
      ok = false;  // a CPU tensor in an fl op: the Python dispatcher says what is wrong
      return;
    }
    k.push_back(static_cast<int64_t>(t.scalar_type()));
    k.push_back(t.dim());
    for (auto s : t.sizes()) k.push_back(s);
    for (auto s : t.strides()) k.push_back(s);
    k.push_back((t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0));
    // aliasing: the index of an earlier tensor with the same storage, and the offset between them: the
    // same key then means the same overlap, which the Python path judged when it committed the plan
    const void* base = t.storage().data();
    int64_t alias = -1;
    if (base != nullptr && dev.type() == c10::DeviceType::PrivateUse1) {
      for (size_t i = 0; i < bases.size(); ++i) {
        if (bases[i] == base) {
          alias = static_cast<int64_t>(i);
          break;
        }
      }
    }
    k.push_back(alias);
    k.push_back(alias >= 0 ? t.storage_offset() - offsets[alias] : 0);
    bases.push_back(dev.type() == c10::DeviceType::PrivateUse1 ? base : nullptr);
    offsets.push_back(t.storage_offset());
  }

  void value(const c10::IValue& v) {
    if (v.isTensor()) {
      tensor(v.toTensor(), -1);
    } else if (v.isNone()) {
      k.push_back(-2);
    } else if (v.isDouble()) {
      k.push_back(-3);  // patched per call
      bits(v.toDouble());
    } else if (v.isInt()) {
      k.push_back(-4);
      k.push_back(v.toInt());
    } else if (v.isBool()) {
      k.push_back(-5);
      k.push_back(v.toBool());
    } else if (v.isIntList()) {
      auto l = v.toIntList();
      k.push_back(-6);
      k.push_back(static_cast<int64_t>(l.size()));
      for (auto x : l) k.push_back(x);
    } else if (v.isBoolList()) {  // native_layer_norm_backward's output_mask
      auto l = v.toBoolList();
      k.push_back(-15);
      k.push_back(static_cast<int64_t>(l.size()));
      for (bool x : l) k.push_back(x);
    } else if (v.isTensorList()) {
      auto l = v.toTensorList();
      k.push_back(-8);
      k.push_back(static_cast<int64_t>(l.size()));
      for (const at::Tensor& x : l) tensor(x, -9);
    } else if (v.isScalar()) {
      auto sc = v.toScalar();
      if (sc.isFloatingPoint()) {
        k.push_back(-10);
        bits(sc.toDouble());
      } else if (sc.isBoolean()) {
        k.push_back(-11);
        k.push_back(sc.toBool());
      } else if (sc.isIntegral(false)) {
        k.push_back(-12);
        k.push_back(sc.toLong());
      } else {
        ok = false;
      }
    } else if (v.isString()) {
      k.push_back(-13);
      for (char c : v.toStringRef()) k.push_back(c);
      k.push_back(0);
    } else {
      ok = false;  // generators, devices, layouts ...: the Python path
    }
  }
};

struct Patch {
  int32_t arg;    // index into the args array
  int32_t stack;  // the stack value it comes from
  int32_t kind;   // 0: double, 1: wrapped number (0-dim CPU tensor), 2: Scalar; | 4: a float rounded to float32
                  // (an op computing in complex64: PyTorch's kernels cast the scalar to complex<float>)
};

// A committed call: the kernel call (kernel, local device, descriptors, arguments, counter slot) and where
// each value that changes per call is found.
struct FastPlan : KernelCall {
  explicit FastPlan(const fl_core_kernel_call_t& call) : KernelCall(call) {}
  std::string name;  // the op, for traces
  int device = 0;  // fl index
  std::vector<std::pair<int32_t, int32_t>> in_src;  // (stack index, list index or -1) per input
  std::vector<int32_t> out_src;                     // stack index, -1 for a fresh output, -2 for an int
  std::vector<int64_t> out_ints;                    // the int returned where out_src is -2
  std::vector<c10::ScalarType> out_dtype;
  std::vector<int32_t> returns;                     // per return: index into out
  std::vector<Patch> patches;
};

std::mutex g_fast_mu;
std::unordered_map<std::vector<int64_t>, std::shared_ptr<FastPlan>, KeyHash> g_fast;
std::atomic<bool> g_fast_enabled{true};
std::atomic<int64_t> g_fast_hits{0};
constexpr size_t kFastMax = 16384;

struct InFlight {
  std::vector<int64_t> key;  // empty: this call cannot be keyed
  std::vector<int64_t> values;  // KeyBuilder's values
  const c10::OperatorName* name;
  std::vector<const void*> fresh_outs;  // storages of out= tensors no Python object has seen (see below)
};

// The out= tensors of a call that Python has never seen: PyTorch's structured wrapper allocated them a moment
// ago for a functional call (add.Tensor reaches the device as add.out). The Python dispatcher may give such an
// output the result's storage instead of copying into it; a user's out= tensor keeps its memory, as PyTorch
// promises. Python objects of tensors live in the TensorImpl's PyObjectSlot (torch >= 2.13's API; older
// releases report no fresh outputs, which only costs the copy).
std::vector<const void*> fresh_out_storages(const c10::OperatorHandle& op, const torch::jit::Stack* stack,
                                            size_t n) {
  std::vector<const void*> fresh;
#if defined(TORCH_VERSION_MAJOR) && (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR >= 213)
  const auto& args = op.schema().arguments();
  const size_t base = stack->size() - n;
  for (size_t i = 0; i < n; ++i) {
    const auto& a = args[i];
    if (!a.kwarg_only() || a.alias_info() == nullptr || !a.alias_info()->isWrite()) continue;
    const c10::IValue& v = (*stack)[base + i];
    if (!v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj() == nullptr)
      fresh.push_back(t.storage().data());
  }
#else
  (void)op, (void)stack, (void)n;
#endif
  return fresh;
}
thread_local std::vector<InFlight> t_pending;  // the fallback calls in flight on this thread, innermost last

void fill_desc(fl_tensor_t& d, const at::Tensor& t) {
  d.data = const_cast<void*>(t.storage().data());
  d.offset = t.storage_offset();
}

// Runs a committed plan on the stack. Returns false (stack untouched) when the
// kernel declines or fails: the Python path then serves the call and reports.
bool run_fast(const FastPlan& plan, torch::jit::Stack* stack, size_t n_args_on_stack) {
  const size_t base = stack->size() - n_args_on_stack;
  auto arg = [&](int32_t i) -> const c10::IValue& { return (*stack)[base + i]; };
  std::vector<fl_tensor_t> in = plan.in;
  for (size_t j = 0; j < in.size(); ++j) {
    auto [si, li] = plan.in_src[j];
    if (si < 0) continue;  // an undefined entry of a Tensor?[]
    if (li < 0) {
      fill_desc(in[j], arg(si).toTensor());
    } else {
      auto l = arg(si).toTensorList();
      fill_desc(in[j], l.get(li));
    }
  }
  std::vector<fl_arg_t> args = plan.args;
  for (const Patch& p : plan.patches) {
    const c10::IValue& v = arg(p.stack);
    const int32_t kind = p.kind & 3;
    if (kind == 0) {
      args[p.arg].f = v.toDouble();
    } else if (kind == 2) {
      args[p.arg].f = v.toScalar().toDouble();
    } else {
      const at::Tensor& w = v.toTensor();
      if (args[p.arg].kind == FL_ARG_FLOAT)
        args[p.arg].f = w.item<double>();
      else
        args[p.arg].i = w.item<int64_t>();
    }
    if ((p.kind & 4) && args[p.arg].kind == FL_ARG_FLOAT)
      args[p.arg].f = static_cast<double>(static_cast<float>(args[p.arg].f));
  }
  std::vector<at::Tensor> fresh(plan.out.size());
  std::vector<fl_tensor_t> out = plan.out;
  c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(plan.device));
  for (size_t j = 0; j < out.size(); ++j) {
    int32_t si = plan.out_src[j];
    if (si >= 0) {
      fill_desc(out[j], arg(si).toTensor());
    } else if (out[j].ndim >= 0) {
      const c10::DeviceGuard guard(where);
      fresh[j] = at::detail::empty_strided_generic(
          c10::IntArrayRef(out[j].sizes, out[j].ndim), c10::IntArrayRef(out[j].strides, out[j].ndim), device_allocator(),
          kFlKeys, plan.out_dtype[j]);
      fill_desc(out[j], fresh[j]);
    }
  }
  TraceSpan span = trace_begin(plan.device);
  int status = plan.kernel(current_stream(*g_devices[plan.device], plan.device), plan.local, in.data(),
                           static_cast<int>(in.size()), out.data(), static_cast<int>(out.size()), args.data(),
                           static_cast<int>(args.size()));
  trace_end(span, plan.name);
  if (status != FL_OK) return false;
  std::vector<c10::IValue> results;
  results.reserve(plan.returns.size());
  for (int32_t r : plan.returns) {
    int32_t si = plan.out_src[r];
    if (si == -2)
      results.emplace_back(plan.out_ints[r]);
    else
      results.emplace_back(si >= 0 ? arg(si) : c10::IValue(fresh[r]));
  }
  if (g_watch_n.load(std::memory_order_relaxed) != 0) {
    for (int32_t si : plan.out_src)
      if (si >= 0) note_write(arg(si).toTensor().storage().data());
  }
  torch::jit::drop(*stack, n_args_on_stack);
  for (auto& v : results) stack->push_back(std::move(v));
  g_call_counts.add(plan.slot);
  g_fast_hits++;
  return true;
}

// A TorchDispatchMode (a profiler, FakeTensor tracing, fl.align's op trace) sees the op at the Python
// key, above the backend: how the backend then serves it is not the mode's business, and PyTorch's
// Python kernels for backend keys would try to route through the mode's interpreter, which has no
// entry for a fallback. So the fallback runs with the mode stack set aside.
struct ModeStash {
  bool active;
  c10::impl::TorchDispatchModeTLS saved;
  ModeStash()
      : active(c10::impl::TorchDispatchModeTLS::any_modes_set()),
        saved(c10::impl::TorchDispatchModeTLS::get_state()) {
    if (active) c10::impl::TorchDispatchModeTLS::set_state(c10::impl::TorchDispatchModeTLS());
  }
  ~ModeStash() {
    if (active) c10::impl::TorchDispatchModeTLS::set_state(std::move(saved));
  }
};

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  bool try_fast = g_fast_enabled.load() && g_pending_total.load() == 0;
  KeyBuilder kb;
  if (try_fast) {
    kb.k.reserve(64);
    kb.k.push_back(reinterpret_cast<int64_t>(&op.operator_name()));
    for (size_t i = stack->size() - n; i < stack->size() && kb.ok; ++i) kb.value((*stack)[i]);
    if (kb.ok) {
      std::shared_ptr<FastPlan> plan;
      {
        std::lock_guard<std::mutex> lock(g_fast_mu);
        auto it = g_fast.find(kb.k);
        if (it != g_fast.end()) plan = it->second;
      }
      if (plan && run_fast(*plan, stack, n)) return;
      // a decomposition's kernel graph (fl_decomp_plans.cpp)
      if (!plan && fl_decomp::serve(kb.k, kb.values, stack, n)) return;
    }
    // the CPU fallback's committed plans, device copies and fills (fl_cpu_fallback.cpp)
    if (fl_cpu_fallback::serve(op, stack, n, kb.ok ? &kb.k : nullptr)) return;
  }
  const bool keyed = kb.ok && try_fast;
  t_pending.push_back({keyed ? std::move(kb.k) : std::vector<int64_t>(),
                       keyed ? std::move(kb.values) : std::vector<int64_t>(), &op.operator_name(),
                       fresh_out_storages(op, stack, n)});
  ModeStash stash;
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse3), stack);
  } catch (...) {
    t_pending.pop_back();
    throw;
  }
  t_pending.pop_back();
}

// 1 if the op Python is handling (its qualified name, "aten::add.out") is the innermost call the
// fallback handed over, with a signature the fast path can key.
bool pending_is(const char* name) {
  if (t_pending.empty() || t_pending.back().key.empty() || name == nullptr) return false;
  const c10::OperatorName& op = *t_pending.back().name;
  std::string full = op.name;
  if (!op.overload_name.empty()) full += "." + op.overload_name;
  return full == name;
}

}  // namespace

namespace fl_cpu_fallback {

const std::vector<int64_t>* pending_key(const char* name) { return pending_is(name) ? &t_pending.back().key : nullptr; }

const std::vector<int64_t>* pending_values(const char* name) {
  return pending_is(name) ? &t_pending.back().values : nullptr;
}

void count(int64_t slot) { g_call_counts.add(slot); }

}  // namespace fl_cpu_fallback

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

// An op PyTorch composes for every backend (CompositeExplicitAutograd: convolution, ...) never reaches the
// fallback above, so torch_fl registers a kernel for it at the fl key. Registering the fallback itself as
// that kernel gives the op the fast path too; on a miss it goes on to PrivateUse3 like any other op.
static std::vector<std::unique_ptr<torch::Library>> g_routed;
static std::mutex g_routed_mu;

FL_API int fl_core_route_to_fallback(const char* ns, const char* name) {
  try {
    std::lock_guard<std::mutex> lock(g_routed_mu);
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__,
                                                __LINE__);
    lib->impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
    g_routed.push_back(std::move(lib));
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}

// ------------------------------------------------------------------ C API ---

// Whether `base` is the storage of an out= tensor of the innermost fallback call that no Python object had seen.
FL_API int fl_core_fresh_out(const void* base) {
  if (t_pending.empty() || base == nullptr) return 0;
  for (const void* p : t_pending.back().fresh_outs)
    if (p == base) return 1;
  return 0;
}


FL_API void fl_core_fast_enable(int on) { g_fast_enabled = on != 0; }

FL_API void fl_core_fast_clear(void) {
  {
    std::lock_guard<std::mutex> lock(g_fast_mu);
    g_fast.clear();
  }
  fl_decomp::clear();
}

FL_API int64_t fl_core_fast_size(void) {
  std::lock_guard<std::mutex> lock(g_fast_mu);
  return static_cast<int64_t>(g_fast.size());
}

FL_API int64_t fl_core_fast_hits(void) { return g_fast_hits.load(); }

FL_API int fl_core_fast_can_commit(const char* name) { return pending_is(name) ? 1 : 0; }

// The Python dispatcher ran the op now in flight as one native kernel call on its own arguments: remember the
// marshalling for this signature (fl_core.h, fl_core_fast_plan_t).
FL_API int fl_core_fast_commit(const fl_core_fast_plan_t* p) {
  if (p == nullptr || !pending_is(p->name)) return 0;
  auto plan = std::make_shared<FastPlan>(p->call);
  if (!plan->kernel.valid()) return 0;
  plan->name = p->name;
  plan->device = p->device;
  for (const fl_core_input_src_t& src : copy_of(p->input_src, p->call.n_inputs))
    plan->in_src.emplace_back(src.arg, src.list);
  plan->out_src = copy_of(p->output_src, p->call.n_outputs);
  if (p->output_ints != nullptr) plan->out_ints = copy_of(p->output_ints, p->call.n_outputs);
  for (int32_t si : plan->out_src)
    if (si == -2 && plan->out_ints.empty()) return 0;
  for (int32_t dtype : copy_of(p->output_dtypes, p->call.n_outputs))
    plan->out_dtype.push_back(static_cast<c10::ScalarType>(dtype));
  for (const fl_core_patch_t& patch : copy_of(p->patches, p->n_patches))
    plan->patches.push_back({patch.kernel_arg, patch.arg, patch.kind});
  plan->returns = copy_of(p->returns, p->n_returns);
  g_call_counts.reserve(plan->slot);
  std::lock_guard<std::mutex> lock(g_fast_mu);
  if (g_fast.size() >= kFastMax) g_fast.clear();
  g_fast[t_pending.back().key] = std::move(plan);
  return 1;
}

// Calls each counter slot served from the fast path since the last read (the counters are reset).
FL_API int64_t fl_core_fast_take_counts(int64_t* out, int64_t n) {
  std::lock_guard<std::mutex> lock(g_call_counts.mu);
  std::vector<int64_t>& counts = g_call_counts.per_slot;
  int64_t m = std::min<int64_t>(n, static_cast<int64_t>(counts.size()));
  for (int64_t i = 0; i < m; ++i) {
    out[i] = counts[i];
    counts[i] = 0;
  }
  return m;
}
