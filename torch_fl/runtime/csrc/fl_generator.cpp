// fl_generator.cpp — torch.Generator("fl") and each device's default generator.
//
// A generator is a (seed, offset) pair of the plugin's counter-based RNG (fl_plugin.h, rng_set_state). A
// device's default generator IS the plugin's own state, read and written through, so torch.manual_seed,
// torch.fl.manual_seed and torch.fl.default_generators agree. A generator made by torch.Generator("fl")
// keeps a pair of its own: the Python dispatcher swaps it into the plugin around a kernel it was passed to
// (dispatch/plan.py), then stores the advanced offset back with set_offset. get_state()/set_state() use
// torch.fl.get_rng_state()'s 24-byte layout: int64 {seed & (2^63 - 1), seed >> 63, offset}.
#include <cstring>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GeneratorImpl.h>

#include "fl_core_internal.h"

using namespace fl_core;

namespace {

constexpr uint64_t kDefaultSeed = 67280421310721ull;  // c10's default_rng_seed_val

struct FlGenerator final : public c10::GeneratorImpl {
  FlGenerator(c10::DeviceIndex index, bool is_default)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        is_default_(is_default) {}

  void set_current_seed(uint64_t seed) override { put(seed, 0); }
  uint64_t current_seed() const override { return get().first; }
  void set_offset(uint64_t offset) override { put(get().first, offset); }
  uint64_t get_offset() const override { return get().second; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    put(s, 0);
    return s;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == 24 &&
                    state.device().is_cpu(),
                "the fl generator state must be a CPU uint8 tensor of 24 bytes, as get_state() returns "
                "(got ", state.dtype().name(), " with ", state.numel(), " elements on ", state.device(), ")");
    int64_t v[3];
    std::memcpy(v, static_cast<const char*>(state.data()), sizeof v);
    put(static_cast<uint64_t>(v[0]) | (static_cast<uint64_t>(v[1]) << 63), static_cast<uint64_t>(v[2]));
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto [seed, offset] = get();
    at::Tensor t = at::detail::empty_cpu({24}, c10::ScalarType::Byte, std::nullopt, std::nullopt, std::nullopt,
                                         std::nullopt);
    int64_t v[3] = {static_cast<int64_t>(seed & 0x7FFFFFFFFFFFFFFFull), static_cast<int64_t>(seed >> 63),
                    static_cast<int64_t>(offset)};
    std::memcpy(t.data_ptr(), v, sizeof v);
    return t.getIntrusivePtr();
  }

 private:
  FlGenerator* clone_impl() const override {
    auto* g = new FlGenerator(device().index(), false);
    auto [seed, offset] = get();
    g->put(seed, offset);
    return g;
  }
  const fl_plugin_t* rng_plugin(int* local) const {
    if (!is_default_) return nullptr;
    Device& d = device_at(device().index());
    *local = d.local;
    return d.plugin->rng_get_state && d.plugin->rng_set_state ? d.plugin : nullptr;
  }
  std::pair<uint64_t, uint64_t> get() const {
    int local = 0;
    if (const fl_plugin_t* p = rng_plugin(&local)) {
      uint64_t seed = 0, offset = 0;
      check_status(device_at(device().index()), p->rng_get_state(local, &seed, &offset), "rng_get_state");
      return {seed, offset};
    }
    return {seed_, offset_};
  }
  void put(uint64_t seed, uint64_t offset) {
    int local = 0;
    if (const fl_plugin_t* p = rng_plugin(&local)) {
      check_status(device_at(device().index()), p->rng_set_state(local, seed, offset), "rng_set_state");
      return;
    }
    seed_ = seed;
    offset_ = offset;
  }

  bool is_default_;
  uint64_t seed_ = kDefaultSeed, offset_ = 0;
};

std::mutex g_gen_mu;
std::vector<at::Generator> g_default_gens;

}  // namespace

namespace fl_core {

const at::Generator& default_generator(c10::DeviceIndex index) {
  int i = index < 0 ? current_index() : index;
  device_at(i);  // says which devices exist
  std::lock_guard<std::mutex> lock(g_gen_mu);
  if (g_default_gens.size() < static_cast<size_t>(kMaxDevices)) g_default_gens.resize(kMaxDevices);
  if (!g_default_gens[i].defined()) {
    g_default_gens[i] = at::make_generator<FlGenerator>(static_cast<c10::DeviceIndex>(i), true);
  }
  return g_default_gens[i];
}

at::Generator new_generator(c10::DeviceIndex index) {
  int i = index < 0 ? current_index() : index;
  device_at(i);
  return at::make_generator<FlGenerator>(static_cast<c10::DeviceIndex>(i), false);
}

}  // namespace fl_core
