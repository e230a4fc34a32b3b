// fl_meta_ops.cpp — the metadata ops every backend provides (TORCH_LIBRARY_IMPL(aten, PrivateUse1)).
//
// empty, empty_strided, as_strided, view, _reshape_alias, resize_, the four set_, record_stream and
// _has_compatible_shallow_copy_type: they never touch device memory, except resize_ growing a storage (on the
// device, keeping its bytes). Every other op reaches the boxed fallback (fl_fallback.cpp).
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "fl_core_internal.h"

using namespace fl_core;

namespace {

c10::Device target_device(std::optional<c10::Device> device_opt) {
  c10::Device d = c10::device_or_default(device_opt);
  if (d.index() < 0) d = guard_impl()->getDevice();
  return d;
}

void check_factory_options(std::optional<c10::Layout> layout_opt, std::optional<bool> pin_memory_opt) {
  TORCH_CHECK(c10::layout_or_default(layout_opt) == c10::Layout::Strided,
              "fl tensors are strided: create a ", c10::layout_or_default(layout_opt),
              " tensor on the CPU, or a strided one on fl");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory_opt),
              "pin_memory=True is for CPU tensors that will be copied to fl; fl tensors cannot be pinned");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype_opt,
                               std::optional<c10::Layout> layout_opt, std::optional<c10::Device> device_opt,
                               std::optional<bool> pin_memory_opt, std::optional<c10::MemoryFormat> memory_format_opt) {
  check_factory_options(layout_opt, pin_memory_opt);
  const c10::DeviceGuard guard(target_device(device_opt));
  return at::detail::empty_generic(size, device_allocator(), kFlKeys, c10::dtype_or_default(dtype_opt), memory_format_opt);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype_opt,
                         std::optional<c10::Layout> layout_opt, std::optional<c10::Device> device_opt,
                         std::optional<bool> pin_memory_opt) {
  check_factory_options(layout_opt, pin_memory_opt);
  const c10::DeviceGuard guard(target_device(device_opt));
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kFlKeys, c10::dtype_or_default(dtype_opt));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// Tensor.record_stream(s): the caching pool then reuses the block only after s's work at the free is done.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1 && stream.device_index() == self.get_device(),
              "record_stream: the stream is on ", stream.device(), ", the tensor on ", self.device(),
              "; record a stream of the tensor's own device");
  if (self.storage().data_ptr().get() != nullptr) record_stream_on(self.storage().data_ptr(), stream.id());
}

// New sizes (contiguous in the given memory format); the storage grows on the
// device when it is too small, keeping its bytes, as resize_ does on CUDA.
const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  at::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(sizes);
  auto mf = memory_format.value_or(c10::MemoryFormat::Contiguous);
  if (mf != c10::MemoryFormat::Preserve) impl->empty_tensor_restride(mf);
  if (impl->numel() > 0) {
    size_t need = at::detail::computeStorageNbytes(sizes, impl->strides(), self.dtype().itemsize(),
                                                   impl->storage_offset());
    const c10::Storage& storage = impl->unsafe_storage();
    if (need > storage.nbytes()) resize_storage_bytes(storage, need);
  }
  return self;
}

void check_in_bounds(const c10::Storage& storage, int64_t offset, c10::IntArrayRef size, c10::IntArrayRef stride,
                     const caffe2::TypeMeta& dtype) {
  TORCH_CHECK(offset >= 0, "Tensor: invalid storage offset ", offset);
  bool empty = false;
  for (auto s : size) empty = empty || s == 0;
  if (empty) return;
  size_t need = at::detail::computeStorageNbytes(size, stride, dtype.itemsize(), offset);
  TORCH_CHECK(need <= storage.nbytes(), "setStorage: sizes ", size, ", strides ", stride, ", storage offset ", offset,
              ", and itemsize ", dtype.itemsize(), " requiring a storage size of ", need,
              " are out of bounds for storage of size ", storage.nbytes());
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "set_: an fl tensor can only take the storage of another fl tensor, not of a ", source.device(),
              " one");
  std::vector<int64_t> st;
  if (stride.data() == nullptr || stride.empty() != size.empty()) {
    st.resize(size.size());
    int64_t acc = 1;
    for (int64_t i = static_cast<int64_t>(size.size()) - 1; i >= 0; --i) {
      st[i] = acc;
      acc *= std::max<int64_t>(size[i], 1);
    }
    stride = st;
  }
  check_in_bounds(source, storage_offset, size, stride, self.dtype());
  at::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_sizes_and_strides(size, stride, storage_offset);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {1});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  TORCH_CHECK(self.dtype() == source.dtype(), "set_: expected the source tensor to have dtype ", self.dtype(),
              " but got ", source.dtype());
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage fresh(c10::Storage::use_byte_size_t(), 0, device_allocator(), true);
  return set_storage(self, std::move(fresh), 0, {0}, {1});
}

// Module conversion (nn.Module._apply) keeps a Parameter object, and so tied
// weights, only when the converted tensor's type is shallow-copy compatible:
// c10's list of dense backends leaves PrivateUse1 out, so say it here for
// strided CPU and fl tensors.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::Layout::Strided &&
           (t.device().type() == c10::DeviceType::CPU || t.device().type() == c10::DeviceType::PrivateUse1) &&
           !t.is_quantized();
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("record_stream", record_stream);
}

// Copies that involve a lazily conjugated or negated fl tensor reach torch_fl's copy with the flag set
// (it resolves the flag while copying): PyTorch's math-bit fallback would materialise the source with
// clone, which copies through _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
