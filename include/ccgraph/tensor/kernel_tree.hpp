// ccgraph/tensor/kernel_tree.hpp: the leaves of element-wise kernel trees, and the launch of a
// tree on a device. Expressions (expr.hpp) build trees of these; tensor copies, fills and casts
// use them directly, so one device kernel serves every element-wise op.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/device.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/tensor/device_runtime.hpp>
#include <ccgraph/tensor/strided.hpp>

namespace ccgraph::detail {

// Kernel trees: an expression with every tensor replaced by a raw pointer. They are small
// trivially copyable structs with host/device members, so the CPU loops and a CUDA kernel
// evaluate the very same tree. `load(offsets, i)` reads tensor leaf I at offsets[I] + i: the
// flat path passes zero offsets and the flat index, the row path each row's start offsets and
// the index in the row, the general strided path each element's offsets and 0.

/// Kernel leaf for tensor operand number I (outputs take index 0, so leaves start at 1).
template <class T, std::size_t I>
struct tensor_kernel {
  const T* p;
  CCGRAPH_HOST_DEVICE T load(const std::int64_t* offsets, std::int64_t i) const { return p[offsets[I] + i]; }
};

/// Kernel leaf for a scalar operand.
template <class T>
struct scalar_kernel {
  T v;
  CCGRAPH_HOST_DEVICE T load(const std::int64_t*, std::int64_t) const { return v; }
};

/// Kernel node converting its operand to U (tensor::to<U>, copies between element types).
template <class U, class K>
struct cast_kernel {
  K a;
  CCGRAPH_HOST_DEVICE U load(const std::int64_t* o, std::int64_t i) const { return cast<U>(a.load(o, i)); }
};

/// Runs kernel tree `k` over `shape` on `dev`, writing `out` (strides[0]) from N-1 tensor
/// operands (strides[1..]); `what` names the op in errors. The kernel itself comes from
/// <ccgraph/cuda/pointwise.cuh>, so the calling translation unit must be compiled by nvcc.
template <class K, class T, std::size_t N>
void launch_device_pointwise(const char* what, device dev, const K& k, T* out, const shape_t& shape,
                             const std::array<strides_t, N>& strides) {
  if constexpr (has_device_pointwise<K, T, N>) {
    (void)require_device_runtime(what, dev);
    CCGRAPH_CHECK(shape.size() <= static_cast<std::size_t>(max_device_dims), what, ": shape ",
                  shape_str(shape), " has more than ", max_device_dims, " dimensions on ", dev);
    device_layout<N> layout;
    layout.ndim = static_cast<int>(shape.size());
    layout.numel = numel_of(shape);
    const strides_t contiguous = contiguous_strides(shape);
    for (std::size_t d = 0; d < shape.size(); ++d) {
      layout.shape[d] = shape[d];
      for (std::size_t j = 0; j < N; ++j) {
        layout.strides[j][d] = strides[j][d];
        // A dimension of size 1 is never stepped along, so its stride does not matter.
        if (shape[d] != 1 && strides[j][d] != contiguous[d]) layout.flat = false;
      }
    }
    if (layout.numel == 0) return;
    device_pointwise<K, T, N>::run(k, out, layout);
  } else {
    (void)k, (void)out, (void)strides;
    CCGRAPH_THROW(error, what, ": tensor of shape ", shape_str(shape), " on ", dev,
                  " needs a device kernel: compile this translation unit with nvcc and include "
                  "<ccgraph/cuda.hpp>");
  }
}

}  // namespace ccgraph::detail
