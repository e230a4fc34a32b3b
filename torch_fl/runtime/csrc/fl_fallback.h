// fl_fallback.h — what fl_core.cpp and fl_fallback.cpp (the CPU-fallback fast path) ask of each other.
//
// fl_core.cpp's boxed fallback offers every keyable call to fl_fallback::serve after its native fast path
// missed; fl_fallback.cpp reads the key of the call Python is serving (to commit a plan for it) and moves
// bytes through the device's plugin with fl_core_copy. Nothing else crosses between the two files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace fl_fallback {

// Serves the call on the stack (n arguments) from a committed CPU-fallback plan, as a device-to-device
// memory copy (aten::_copy_from of one dtype and layout on one device) or as a memory fill (zero_). key:
// the call's fast-path key, or null when it has none. Returns false, the stack untouched, when the call is
// not one it serves.
bool serve(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n, const std::vector<int64_t>* key);

}  // namespace fl_fallback

// fl_core.cpp's side.
// The key of the innermost fallback call in flight on this thread when it is the op `name`
// ("aten::add.out") and has one; else null.
const std::vector<int64_t>* fl_core_pending_key(const char* name);
// Copies n bytes on fl:index's current stream (kind: 0 host to device, 1 device to host, 2 device to
// device), done when it returns as the runtime's copies are; raises the plugin's error.
void fl_core_copy(int index, int kind, void* dst, const void* src, size_t n);
// Zero-fills n bytes at dst on fl:index's current stream with the plugin's mem_set (ABI v2: the caller knows
// the plugin has one), ordered as the runtime's fills are; raises the plugin's error.
void fl_core_zero(int index, void* dst, size_t n);
// One call served under Python's counter slot (backend, op, path), as the native fast path counts its own.
void fl_core_count(int64_t slot);
