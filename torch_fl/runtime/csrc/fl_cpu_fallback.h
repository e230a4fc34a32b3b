// fl_cpu_fallback.h — what the boxed fallback (fl_fallback.cpp) and the CPU fallback's fast path
// (fl_cpu_fallback.cpp) ask of each other. Not an API: the C entry points are fl_core.h's.
//
// The boxed fallback offers every call to fl_cpu_fallback::serve after its native fast path missed; serve reads
// the key of the call Python is serving (to commit a plan for it) with pending_key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#pragma GCC visibility push(hidden)
namespace fl_cpu_fallback {

// Serves the call on the stack (n arguments) from a committed CPU-fallback plan, as a device-to-device memory
// copy (aten::_copy_from of one dtype and layout on one device) or as a memory fill (zero_). key: the call's
// fast-path key, or null when it has none. Returns false, the stack untouched, when the call is not one it serves.
bool serve(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n, const std::vector<int64_t>* key);

// fl_fallback.cpp's side: the key of the innermost fallback call in flight on this thread when it is the op
// `name` ("aten::add.out") and has one; else null.
const std::vector<int64_t>* pending_key(const char* name);
// and the values its key leaves out (float bits, numbers given as 0-dim CPU tensors), for the decomposition plans
const std::vector<int64_t>* pending_values(const char* name);
// One call served under Python's counter slot (backend, op, path), as the native fast path counts its own.
void count(int64_t slot);

}  // namespace fl_cpu_fallback
#pragma GCC visibility pop
