// fl_decomp_plans.h — what the boxed fallback (fl_fallback.cpp) asks of the decomposition plans
// (fl_decomp_plans.cpp). Not an API: the C entry points are fl_core.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/stack.h>

#pragma GCC visibility push(hidden)
namespace fl_decomp {

// Serves the call on the stack (n arguments), whose fast-path key is key and values the values that key leaves
// out (fl_fallback.cpp's KeyBuilder), from a committed decomposition plan. Returns false, the stack untouched,
// when no plan serves it (Python then does).
bool serve(const std::vector<int64_t>& key, const std::vector<int64_t>& values, torch::jit::Stack* stack, size_t n);
// Forgets every plan (fl_core_fast_clear): their graphs and buffers are freed.
void clear();

}  // namespace fl_decomp
#pragma GCC visibility pop
