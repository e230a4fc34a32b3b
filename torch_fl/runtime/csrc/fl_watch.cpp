// fl_watch.cpp — the write watch: a write generation per watched storage.
//
// Caches of values derived from weights (a folded Conv+BN, packed QKV weights, channels-last weight copies:
// torch_fl/compile) watch the weights' storages: every op that writes into an fl tensor bumps its storage's
// generation, through whichever alias it was written (p.data, a view), which a tensor's _version cannot see
// (p.data has a version counter of its own). The fast path bumps it here; the Python dispatcher through
// fl_core_note_write.
#include "fl_core_internal.h"

using namespace fl_core;

// Writes into any watched storage so far: a cache reads it (no call) and looks at its own storages'
// generations only when it moved.
extern "C" {
volatile uint64_t fl_core_watched_writes = 0;
}

namespace {

std::mutex g_watch_mu;
std::unordered_map<const void*, std::pair<int64_t, uint64_t>> g_watch;  // storage base -> (watchers, generation)

}  // namespace

namespace fl_core {

std::atomic<int64_t> g_watch_n{0};

void note_write(const void* base) {
  if (base == nullptr || g_watch_n.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(g_watch_mu);
  auto it = g_watch.find(base);
  if (it != g_watch.end()) {
    it->second.second++;
    fl_core_watched_writes = fl_core_watched_writes + 1;
  }
}

}  // namespace fl_core

// ------------------------------------------------------------------ C API ---

FL_API void fl_core_watch(const void* base, int on) {
  if (base == nullptr) return;
  std::lock_guard<std::mutex> lock(g_watch_mu);
  auto& entry = g_watch[base];
  entry.first += on ? 1 : -1;
  if (entry.first <= 0) g_watch.erase(base);
  g_watch_n = static_cast<int64_t>(g_watch.size());
}

FL_API uint64_t fl_core_write_generation(const void* base) {
  std::lock_guard<std::mutex> lock(g_watch_mu);
  auto it = g_watch.find(base);
  return it == g_watch.end() ? 0 : it->second.second;
}

FL_API void fl_core_note_write(const void* base) { note_write(base); }

FL_API int64_t fl_core_watched(void) { return g_watch_n.load(); }
