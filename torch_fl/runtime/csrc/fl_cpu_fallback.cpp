// fl_cpu_fallback.cpp — the CPU fallback's fast path, and same-device copies as device memory copies.
//
// Why: an op the device cannot compute (float64 on a float32 chip) is served by PyTorch's CPU kernel on host
// copies of its fl tensors. Done in Python that costs ~0.2 ms per call (dispatch, the host copies, a new fl
// tensor per result), which is all the time of a float64 gradcheck of a small LSTM: some 10^5 small ops.
// Once Python has served a call that way, it commits the call's signature here (fl_fallback_commit, the
// fast-path key fl_fallback.cpp built for it), and later calls with that key run without Python: the fl
// tensors copied to the host with the plugin's copies, the CPU kernel called (the op itself, or for an
// out= call the functional op Python called, then copied into the outputs), what the op wrote and what it
// returned copied back. The same bytes the Python path moves, the same CPU kernel: the same results.
//
// Plans are forgotten with the native fast path's (settings.clear_plans: the CPU-fallback switch, paths
// switched off); they are keyed by fl device, so another backend's device never meets them; the fast path
// steps aside while the profiler listens, while a kernel graph records and while an async copy is in flight
// (fl_fallback.cpp calls serve only then), inside a decomposition that must stay on the device (Python says
// so: fl_fallback_device_only), and under a TorchDispatchMode. Anything unusual (tensors that partly share
// memory, an output the CPU kernel resized, a list result, a CPU kernel that raised) goes back to Python,
// which serves or refuses the call as before: nothing is written to the device before the CPU kernel ran
// and every check passed.
//
// aten::_copy_from between two fl tensors of one device, one dtype and one dense layout (Tensor.copy_,
// clone) is one copy_d2d of the plugin: the bytes are the values. Python makes the same copy
// (dispatch/meta.py) and enables it here per device (fl_fallback_copy_commit). Likewise aten::zero_ of a
// dense tensor is one mem_set of the plugin where Python's decomposition made it so
// (dispatch/decompositions: autograd's zero gradients), enabled per device and dtype (fl_fallback_zero_commit).
//
// Device memory is never read on the host: every byte moves through the plugin's copies (fl_core::copy_on_current).
#include <atomic>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/strides.h>

#include "fl_core_internal.h"
#include "fl_cpu_fallback.h"

using fl_core::CopyKind;
using fl_core::copy_on_current;

namespace {

constexpr int kMaxDevices = fl_core::kMaxDevices;
constexpr int kScalarTypes = 64;  // c10::ScalarType codes
constexpr size_t kPlansMax = 16384;

// How a committed call runs: the op it arrived as, or another op Python called instead (the functional op of
// an out= call, copy_ for _copy_from), on host copies of the stack's values; which host copies go back; which
// results go into which out= tensors; what the arrived op returns. Indices are the arrived op's arguments.
struct Plan {
  int device = 0;                           // the fl index the committed call ran on
  std::optional<c10::OperatorHandle> call;  // the op to call (none: the arrived op itself)
  std::vector<int32_t> ins;                 // per argument of the called op: the stack value it takes
  std::vector<int32_t> writes;              // fl tensors the called op writes: their host copies go back
  std::vector<int32_t> outs;                // result k is copied into the out= tensor at outs[k]
  std::vector<int32_t> rets;                // per return: a stack value (>= 0), or result k as a new fl tensor (-1 - k)
  int64_t slot = -1;                        // Python's counter slot (backend, op, "fallback")
};

std::mutex g_mu;
std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Plan>, fl_core::KeyHash> g_plans;
std::atomic<int64_t> g_copy_slot[kMaxDevices];  // per fl device: the counter slot of its copies, -1: not enabled
std::atomic<int64_t> g_zero_slot[kMaxDevices][kScalarTypes];  // per fl device and dtype: zero_'s slot, or -1
std::atomic<int64_t> g_hits{0}, g_copies{0}, g_fills{0}, g_bytes{0};
thread_local int t_device_only = 0;

void disable_memory_ops() {
  for (auto& s : g_copy_slot) s = -1;
  for (auto& row : g_zero_slot)
    for (auto& s : row) s = -1;
}

struct SlotsInit {
  SlotsInit() { disable_memory_ops(); }
} g_slots_init;

bool is_fl(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

// Non-overlapping and dense (runtime.tensor.is_dense): the strides are a permutation of a contiguous layout.
bool is_dense(const at::Tensor& t) {
  if (t.numel() <= 1) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size != 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (auto [st, s] : dims) {
    if (st != expected) return false;
    expected *= s;
  }
  return true;
}

// No two elements share a memory location (a sufficient test: sorted by stride, each stride passes the
// farthest element the smaller ones reach).
bool no_internal_overlap(const at::Tensor& t) {
  if (t.numel() <= 1) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;
  for (auto [st, s] : dims) {
    if (st <= reach) return false;
    reach += (s - 1) * st;
  }
  return true;
}

bool plain(const at::Tensor& t) { return !t.is_conj() && !t.is_neg() && t.layout() == c10::Layout::Strided; }

size_t nbytes_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// A host copy of an fl tensor: the span of storage it touches, copied, viewed with its strides.
struct Mirror {
  at::Tensor fl, host;
  int64_t lo = 0, hi = 0;  // the span, in elements of the storage
  const void* buffer = nullptr;
};

// A CPU tensor of t's sizes and strides over a fresh buffer of `elems` elements (no dispatcher call).
at::Tensor host_strided(const at::Tensor& t, int64_t elems) {
  at::Tensor h = at::detail::empty_cpu({elems}, t.scalar_type(), std::nullopt, std::nullopt, std::nullopt,
                                       std::nullopt);
  h.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), 0);
  return h;
}

Mirror mirror_of(const at::Tensor& t, int index) {
  Mirror m;
  m.fl = t;
  m.lo = m.hi = t.storage_offset();
  if (t.numel() > 0) {
    m.hi = m.lo + 1;
    for (int64_t d = 0; d < t.dim(); ++d) m.hi += (t.size(d) - 1) * t.stride(d);
  }
  m.host = host_strided(t, m.hi - m.lo);
  m.buffer = m.host.storage().data();
  const size_t n = static_cast<size_t>(m.hi - m.lo) * t.element_size();
  if (n == 0) return m;
  copy_on_current(index, CopyKind::kDeviceToHost, m.host.storage().mutable_data(),
               static_cast<const char*>(t.storage().data()) + m.lo * t.element_size(), n);
  g_bytes += static_cast<int64_t>(n);
  return m;
}

// Writes a mirror's span back: the elements the op wrote, the bytes between them as they were read.
void write_back(const Mirror& m, int index) {
  const size_t n = static_cast<size_t>(m.hi - m.lo) * m.fl.element_size();
  if (n == 0) return;
  copy_on_current(index, CopyKind::kHostToDevice, static_cast<char*>(const_cast<void*>(m.fl.storage().data())) + m.lo * m.fl.element_size(),
               m.host.storage().data(), n);
  g_bytes += static_cast<int64_t>(n);
}

// A host result as a new fl tensor, laid out as runtime.transfers.cpu_to_new_fl lays it (its strides where
// they are dense, else contiguous).
at::Tensor to_new_fl(const at::Tensor& h, int index) {
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
  const bool dense = is_dense(h);
  const c10::DimVector contiguous = c10::contiguous_strides(h.sizes());
  at::Tensor t = at::detail::empty_strided_generic(h.sizes(), dense ? h.strides() : c10::IntArrayRef(contiguous),
                                                   c10::GetAllocator(c10::DeviceType::PrivateUse1),
                                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), h.scalar_type());
  if (h.numel() == 0) return t;
  at::Tensor src = dense ? h : h.contiguous();
  copy_on_current(index, CopyKind::kHostToDevice, t.data_ptr(), src.data_ptr(), nbytes_of(t));
  g_bytes += static_cast<int64_t>(nbytes_of(t));
  return t;
}

// A host result's values into an fl out= tensor of the same dtype and sizes: its bytes where the layouts
// match, else through a host copy of the output's span (the bytes between its elements kept).
void write_into(const at::Tensor& out, const at::Tensor& r, int index) {
  if (out.numel() == 0) return;
  if (is_dense(out) && (out.numel() == 1 || out.strides() == r.strides())) {
    copy_on_current(index, CopyKind::kHostToDevice, out.data_ptr(), r.data_ptr(), nbytes_of(out));
    g_bytes += static_cast<int64_t>(nbytes_of(out));
    return;
  }
  Mirror m = mirror_of(out, index);
  m.host.copy_(r);
  write_back(m, index);
}

void note_written(const at::Tensor& t) {
  if (fl_core::g_watch_n.load(std::memory_order_relaxed) != 0) fl_core::note_write(t.storage().data());
}

// Host copies of a call's fl tensors: one per distinct tensor, shared by arguments that are the same view
// (x.add_(x) sees one tensor, as on the CPU); tensors that otherwise share memory are not for this path.
struct Mirrors {
  int index;
  std::vector<Mirror> all;
  bool ok = true;

  const at::Tensor& host(const at::Tensor& t) {
    const void* base = t.storage().data();
    for (const Mirror& m : all) {
      if (base == nullptr || m.fl.storage().data() != base) continue;
      if (m.fl.unsafeGetTensorImpl() == t.unsafeGetTensorImpl() ||
          (m.fl.storage_offset() == t.storage_offset() && m.fl.sizes() == t.sizes() && m.fl.strides() == t.strides() &&
           m.fl.scalar_type() == t.scalar_type()))
        return m.host;
      ok = false;
      return t;
    }
    if (t.device().index() != index || !plain(t)) {
      ok = false;
      return t;
    }
    all.push_back(mirror_of(t, index));
    return all.back().host;
  }

  c10::IValue value(const c10::IValue& v) {
    if (!ok) return v;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      return is_fl(t) ? c10::IValue(host(t)) : v;
    }
    if (v.isTensorList()) {
      c10::List<at::Tensor> l = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(l.size());
      for (const at::Tensor& t : l) out.push_back(is_fl(t) ? host(t) : t);
      return out;
    }
    return v;
  }

  const Mirror* of(const at::Tensor& t) const {
    for (const Mirror& m : all)
      if (m.fl.unsafeGetTensorImpl() == t.unsafeGetTensorImpl() ||
          (m.fl.storage().data() == t.storage().data() && m.fl.storage_offset() == t.storage_offset() &&
           m.fl.sizes() == t.sizes() && m.fl.strides() == t.strides()))
        return &m;
    return nullptr;
  }
};

bool serve_copy(torch::jit::Stack* stack, size_t n) {
  const size_t base = stack->size() - n;
  const c10::IValue& a = (*stack)[base];
  const c10::IValue& b = (*stack)[base + 1];
  if (!a.isTensor() || !b.isTensor()) return false;
  const at::Tensor& src = a.toTensor();
  const at::Tensor& dst = b.toTensor();
  if (!is_fl(src) || !is_fl(dst) || src.device() != dst.device() || !plain(src) || !plain(dst)) return false;
  const int index = dst.device().index();
  if (index < 0 || index >= kMaxDevices) return false;
  const int64_t slot = g_copy_slot[index].load();
  if (slot < 0 || src.scalar_type() != dst.scalar_type() || src.sizes() != dst.sizes() ||
      src.strides() != dst.strides() || dst.numel() == 0 || !is_dense(dst) ||
      src.storage().data() == dst.storage().data())
    return false;
  copy_on_current(index, CopyKind::kDeviceToDevice, dst.data_ptr(), src.data_ptr(), nbytes_of(dst));
  note_written(dst);
  c10::IValue result = b;
  torch::jit::drop(*stack, n);
  stack->push_back(std::move(result));
  fl_cpu_fallback::count(slot);
  g_copies++;
  return true;
}

// zero_ of a dense fl tensor, on a device and dtype whose zero_ Python served as one mem_set.
bool serve_zero(torch::jit::Stack* stack, size_t n) {
  const c10::IValue& a = (*stack)[stack->size() - n];
  if (!a.isTensor()) return false;
  const at::Tensor& t = a.toTensor();
  if (!is_fl(t) || !plain(t) || t.numel() == 0 || !is_dense(t)) return false;
  const int index = t.device().index();
  const int code = static_cast<int>(t.scalar_type());
  if (index < 0 || index >= kMaxDevices || code < 0 || code >= kScalarTypes) return false;
  const int64_t slot = g_zero_slot[index][code].load();
  if (slot < 0) return false;
  fl_core::zero_on_current(index, t.data_ptr(), nbytes_of(t));
  note_written(t);
  fl_cpu_fallback::count(slot);
  g_fills++;
  return true;  // the stack holds self, which is what zero_ returns
}

bool is_named(const c10::OperatorHandle& op, const char* name) {
  const c10::OperatorName& op_name = op.operator_name();
  return op_name.overload_name.empty() && op_name.name == name;
}

bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// A committed plan on the stack; false (stack untouched, device unwritten) where the call is not one it serves.
bool run(const Plan& plan, const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n) {
  const size_t base = stack->size() - n;
  auto arg = [&](int32_t i) -> const c10::IValue& { return (*stack)[base + i]; };
  for (int32_t i : plan.ins)
    if (i < 0 || static_cast<size_t>(i) >= n) return false;
  // what is written: fl tensors of the plan's device whose elements can be written back one for one
  for (const auto* written : {&plan.writes, &plan.outs}) {
    for (int32_t i : *written) {
      if (i < 0 || static_cast<size_t>(i) >= n || !arg(i).isTensor()) return false;
      const at::Tensor& t = arg(i).toTensor();
      if (!is_fl(t) || t.device().index() != plan.device || !plain(t) || !no_internal_overlap(t)) return false;
    }
  }
  Mirrors mirrors{plan.device, {}};
  torch::jit::Stack call;
  call.reserve(plan.ins.size());
  for (int32_t i : plan.ins) call.push_back(mirrors.value(arg(i)));
  for (int32_t i : plan.writes)  // a written tensor is one the call reads as well (self, out=)
    if (mirrors.ok && mirrors.of(arg(i).toTensor()) == nullptr) mirrors.ok = false;
  for (int32_t i : plan.outs) {  // an out= tensor sharing memory with an input: Python's business
    const at::Tensor& o = arg(i).toTensor();
    for (const Mirror& m : mirrors.all)
      if (o.numel() > 0 && m.fl.storage().data() == o.storage().data()) mirrors.ok = false;
  }
  if (!mirrors.ok) return false;
  try {
    if (plan.call)
      plan.call->callBoxed(&call);
    else
      op.callBoxed(&call);
  } catch (const std::exception&) {
    return false;  // Python calls it again, and reports what it raises as the Python path does
  }
  // every check before the first byte goes back to the device
  if (call.size() < plan.outs.size()) return false;
  for (size_t k = 0; k < plan.outs.size(); ++k) {
    const at::Tensor& o = arg(plan.outs[k]).toTensor();
    if (!call[k].isTensor()) return false;
    const at::Tensor& r = call[k].toTensor();
    if (!r.defined() || r.scalar_type() != o.scalar_type() || r.sizes() != o.sizes() || !plain(r)) return false;
  }
  for (int32_t src : plan.rets) {
    if (src >= 0) continue;
    const size_t k = static_cast<size_t>(-1 - src);
    if (k >= call.size()) return false;
    const c10::IValue& v = call[k];
    if (v.isTensor()) {
      if (v.toTensor().defined() && !plain(v.toTensor())) return false;
    } else if (!(v.isNone() || v.isInt() || v.isDouble() || v.isBool())) {
      return false;  // lists and other results: the Python path
    }
  }
  std::vector<const Mirror*> written;
  for (int32_t i : plan.writes) {
    const Mirror* m = mirrors.of(arg(i).toTensor());
    if (m->host.sizes() != m->fl.sizes() || m->host.strides() != m->fl.strides() || m->host.storage().data() != m->buffer)
      return false;  // the CPU kernel resized an output: Python gives it new storage
    if (std::find(written.begin(), written.end(), m) == written.end()) written.push_back(m);
  }
  for (const Mirror* m : written) {
    write_back(*m, plan.device);
    note_written(m->fl);
  }
  for (size_t k = 0; k < plan.outs.size(); ++k) {
    const at::Tensor& o = arg(plan.outs[k]).toTensor();
    write_into(o, call[k].toTensor(), plan.device);
    note_written(o);
  }
  std::vector<c10::IValue> results;
  results.reserve(plan.rets.size());
  for (int32_t src : plan.rets) {
    if (src >= 0) {
      results.push_back(arg(src));
      continue;
    }
    const c10::IValue& v = call[static_cast<size_t>(-1 - src)];
    if (v.isTensor() && v.toTensor().defined())
      results.emplace_back(to_new_fl(v.toTensor(), plan.device));
    else
      results.push_back(v);
  }
  torch::jit::drop(*stack, n);
  for (auto& v : results) stack->push_back(std::move(v));
  fl_cpu_fallback::count(plan.slot);
  g_hits++;
  return true;
}

std::optional<c10::OperatorHandle> find_op(const char* qualified) {
  std::string full(qualified);
  size_t sep = full.find("::");
  size_t dot = full.find('.', sep == std::string::npos ? 0 : sep);
  c10::OperatorName name(dot == std::string::npos ? full : full.substr(0, dot),
                         dot == std::string::npos ? std::string() : full.substr(dot + 1));
  return c10::Dispatcher::singleton().findOp(name);
}

}  // namespace

namespace fl_cpu_fallback {

bool serve(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n, const std::vector<int64_t>* key) {
  if (is_named(op, "aten::_copy_from") && serve_copy(stack, n)) return true;
  if (n == 1 && is_named(op, "aten::zero_") && serve_zero(stack, n)) return true;
  if (key == nullptr || t_device_only > 0 || c10::impl::TorchDispatchModeTLS::any_modes_set()) return false;
  std::shared_ptr<const Plan> plan;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_plans.empty()) return false;
    auto it = g_plans.find(*key);
    if (it == g_plans.end()) return false;
    plan = it->second;
  }
  return run(*plan, op, stack, n);
}

}  // namespace fl_cpu_fallback

// ------------------------------------------------------------------ C API ---

// Python served the call in flight with a CPU kernel: later calls with its key run here (Plan; fl_core.h).
FL_API int fl_fallback_commit(const fl_fallback_plan_t* p) {
  if (p == nullptr) return 0;
  const std::vector<int64_t>* key = fl_cpu_fallback::pending_key(p->name);
  if (key == nullptr || p->device < 0 || p->device >= kMaxDevices) return 0;
  auto plan = std::make_shared<Plan>();
  plan->device = p->device;
  plan->slot = p->slot;
  if (p->call != nullptr) {
    plan->call = find_op(p->call);
    if (!plan->call) return 0;
  }
  plan->ins = fl_core::copy_of(p->inputs, p->n_inputs);
  plan->writes = fl_core::copy_of(p->writes, p->n_writes);
  plan->outs = fl_core::copy_of(p->outs, p->n_outs);
  plan->rets = fl_core::copy_of(p->returns, p->n_returns);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_plans.size() >= kPlansMax) g_plans.clear();
  g_plans[*key] = std::move(plan);
  return 1;
}

// Same-device copies of one dtype and dense layout on fl:device are device memory copies (counted in slot).
FL_API void fl_fallback_copy_commit(int device, int64_t slot) {
  if (device >= 0 && device < kMaxDevices) g_copy_slot[device] = slot;
}

// zero_ of dense tensors of dtype `scalar_type` (c10's code) on fl:device is one mem_set (counted in slot).
FL_API void fl_fallback_zero_commit(int device, int scalar_type, int64_t slot) {
  if (device >= 0 && device < kMaxDevices && scalar_type >= 0 && scalar_type < kScalarTypes)
    g_zero_slot[device][scalar_type] = slot;
}

FL_API void fl_fallback_clear(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_plans.clear();
  disable_memory_ops();
}

FL_API int64_t fl_fallback_size(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<int64_t>(g_plans.size());
}

// Calls served from committed plans, copies served as device copies, zero_ served as mem_set, since the
// process began.
FL_API int64_t fl_fallback_hits(void) { return g_hits.load(); }
FL_API int64_t fl_fallback_copies(void) { return g_copies.load(); }
FL_API int64_t fl_fallback_fills(void) { return g_fills.load(); }
// Bytes this path moved between host and device (the runtime's transfer tally counts them too).
FL_API int64_t fl_fallback_bytes(void) { return g_bytes.load(); }

// This thread is inside a decomposition that must stay on the device (depth > 0): no CPU kernel serves.
FL_API void fl_fallback_device_only(int depth) { t_device_only = depth; }
