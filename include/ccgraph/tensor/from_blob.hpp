// ccgraph/tensor/from_blob.hpp: tensors over memory ccgraph does not own (torch.from_blob): host
// or device memory, found by the pointer's attributes, kept alive by a deleter the last tensor
// viewing it runs.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/tensor/device_runtime.hpp>
#include <ccgraph/tensor/storage.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {
namespace detail {

/// The bytes a strided view of `shape` and `strides` (elements, non-negative) reaches from its
/// first element: what a storage over foreign memory must cover. `what` names the call.
inline std::size_t strided_extent_bytes(const shape_t& shape, const strides_t& strides, std::size_t elem,
                                        std::string_view what) {
  CCGRAPH_CHECK(strides.size() == shape.size(), what, ": ", strides.size(), " strides for a shape of rank ",
                shape.size(), " ", shape_str(shape));
  const std::int64_t n = checked_numel(shape, what);
  if (n == 0) return 0;
  std::int64_t last = 0;  // offset of the last element
  for (std::size_t d = 0; d < shape.size(); ++d) {
    CCGRAPH_CHECK(strides[d] >= 0, what, ": stride ", strides[d], " of dim ", d,
                  " is negative; ccgraph tensors take non-negative strides");
    last += (shape[d] - 1) * strides[d];
  }
  return static_cast<std::size_t>(last + 1) * elem;
}

/// The device `p` points into: asked of the device runtime when one is installed
/// (<ccgraph/cuda.hpp>), else host memory (a host-only program has no device memory to wrap).
inline device device_of_pointer(const void* p) {
  const device_runtime* rt = device_runtime_slot();
  return rt && rt->pointer_device ? rt->pointer_device(p) : device::cpu();
}

}  // namespace detail

/// A tensor over `ptr` with `shape` and element `strides`, on the device the pointer belongs to
/// (host memory, or a CUDA device's when <ccgraph/cuda.hpp> is in the program). `deleter(ptr)`
/// runs once, when the last tensor or view over the memory goes; pass `[](T*) {}` for memory the
/// caller keeps alive longer than every such tensor. On an error the deleter is not called:
/// the caller still owns the memory.
template <class T, class D>
  requires std::invocable<D&, T*>
tensor<T> from_blob(T* ptr, shape_t shape, strides_t strides, D deleter) {
  constexpr std::string_view what = "from_blob";
  const std::size_t bytes = detail::strided_extent_bytes(shape, strides, sizeof(T), what);
  CCGRAPH_CHECK(ptr != nullptr || bytes == 0, what, ": null pointer for a tensor of shape ", shape_str(shape));
  const device dev = detail::device_of_pointer(ptr);
  std::shared_ptr<void> owner(static_cast<void*>(ptr), [d = std::move(deleter)](void* p) mutable {
    d(static_cast<T*>(p));
  });
  auto st = std::make_shared<detail::storage>(static_cast<void*>(ptr), bytes, dev, std::move(owner));
  return tensor<T>(std::move(st), std::move(shape), std::move(strides), 0);
}

/// from_blob over a contiguous (row-major) `shape`.
template <class T, class D>
  requires std::invocable<D&, T*>
tensor<T> from_blob(T* ptr, shape_t shape, D deleter) {
  strides_t strides = contiguous_strides(shape);
  return from_blob(ptr, std::move(shape), std::move(strides), std::move(deleter));
}

}  // namespace ccgraph
