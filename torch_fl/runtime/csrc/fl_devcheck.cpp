// fl_devcheck.cpp — cross-device errors that say which backend each fl device is.
//
// `a + b` with a on fl:3 (rocm) and b on fl:2 (minimal) fails in PyTorch's own code before torch_fl sees the
// call: add.Tensor, mul, eq, pow, ... (the functional and in-place forms of PyTorch's structured ops) have a
// CompositeExplicitAutogradNonFunctional kernel shared by every backend, whose TensorIterator says only
// "found at least two devices, fl:3 and fl:2!". Which fl device is which backend is what a user mixing
// backends needs to know, so each of those ops gets an fl kernel here that calls the very same composite
// kernel and, only when that fails with PyTorch's device-mismatch error, raises it again with each fl
// device's backend named. The path of a call that succeeds is unchanged (one boxed hop more).

#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>

#include <array>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "fl_core.h"

namespace {

constexpr int kMaxLabels = 64;
std::array<std::string, kMaxLabels> g_labels;  // fl index -> "rocm"
std::mutex g_mu;
std::unique_ptr<torch::Library> g_lib;

// "fl:3" -> "fl:3 (rocm)" for every fl device the message names
std::string name_devices(const std::string& msg) {
  static const std::regex fl_device("fl:([0-9]+)");
  std::string out;
  auto begin = std::sregex_iterator(msg.begin(), msg.end(), fl_device);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    int index = std::stoi(m[1].str());
    size_t end = static_cast<size_t>(m.position(0) + m.length(0));
    out += msg.substr(last, end - last);
    if (index >= 0 && index < kMaxLabels && !g_labels[index].empty() && msg.compare(end, 2, " (") != 0)
      out += " (" + g_labels[index] + ")";
    last = end;
  }
  return out + msg.substr(last);
}

void composite_with_named_devices(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  try {
    op.callBoxedForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional, *stack);
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    // another op's error, or one this file already named (an op composed of wrapped ops)
    if (msg.find("Expected all tensors to be on the same device") == std::string::npos ||
        msg.find("when checking arguments for") != std::string::npos)
      throw;
    // an fl tensor and a host one: say which way to move (as torch_fl's own check does)
    static const std::regex pair("devices, (fl:[0-9]+) and ([a-z]+(?::[0-9]+)?)!");
    std::smatch m;
    std::string fix = "Move one with .to() first.";
    if (std::regex_search(msg, m, pair) && m[2].str().rfind("fl:", 0) != 0)
      fix = "Move the " + m[2].str() + " tensor with .to('" + m[1].str() + "') first.";
    TORCH_CHECK(false, name_devices(msg), " (when checking arguments for ", op.operator_name(), "). ", fix);
  }
}

}  // namespace

// The backend behind fl:index, for the messages above.
extern "C" void fl_devcheck_label(int index, const char* backend) {
  if (index < 0 || index >= kMaxLabels || backend == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_labels[index] = backend;
}

// Gives every aten op whose only kernel for fl is the shared composite one an fl kernel calling it as above.
// Returns how many ops, or -1 when PyTorch refused a registration.
extern "C" int fl_devcheck_install(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_lib) return 0;
  try {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                                __FILE__, __LINE__);
    int n = 0;
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
        continue;
      std::string full = name.name.substr(6);
      if (!name.overload_name.empty()) full += "." + name.overload_name;
      lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&composite_with_named_devices>());
      n++;
    }
    g_lib = std::move(lib);
    return n;
  } catch (const std::exception&) {
    return -1;
  }
}
