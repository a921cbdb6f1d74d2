// ccgraph/ops/kernel_checks.hpp: the argument checks every op kernel (CPU or CUDA) repeats
// before it writes: the output is the buffer the shape function asked for, and every operand
// lives on the output's device. Host-only and light: the kernel headers of each op family
// include it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph::detail {

/// Checks that `out` (a kernel's pre-allocated output) has shape `expected` and is contiguous,
/// as the executors' planned buffers are; `what` names the op, `name` the output.
template <element T>
void check_kernel_output(const tensor<T>& out, const shape_t& expected, const char* what,
                         const char* name = "output") {
  CCGRAPH_CHECK(out.shape() == expected, what, ": ", name, " of shape ", shape_str(out.shape()),
                " for a result of shape ", shape_str(expected));
  CCGRAPH_CHECK(out.is_contiguous(), what, ": ", name, " of shape ", shape_str(out.shape()),
                " must be contiguous (strides ", list_str(out.strides()), ")");
}

/// The metadata of a tensor (what the shape functions take).
template <element T>
tensor_meta meta_of(const tensor<T>& t) {
  return {dtype_v<T>, t.shape()};
}

/// The metadata of an optional tensor (a weight, a bias, a mask), or std::nullopt. One
/// definition for every op family: two templates of this signature that differ only in their
/// constraints mangle alike (GCC 12), and a translation unit instantiating both fails to assemble.
template <element T>
std::optional<tensor_meta> meta_of(const std::optional<tensor<T>>& t) {
  if (!t) return std::nullopt;
  return meta_of(*t);
}

/// Checks that every device in `devices` is `dev`; `what` names the op.
inline void check_same_device(const char* what, device dev, std::initializer_list<device> devices) {
  for (const device d : devices)
    CCGRAPH_CHECK(d == dev, what, ": tensors on ", dev, " and ", d,
                  "; move them to one device with .to(device) first");
}

/// Normalises an op's `dim` against a tensor of `rank` dims, with PyTorch's convention that a
/// 0-d tensor has one dim of size 1 for indexing ops (gather, scatter_add, index_select).
inline int index_op_dim(std::int64_t dim, std::size_t rank, const char* what) {
  return normalize_dim(dim, rank == 0 ? 1 : rank, what);
}

/// `shape`, or [1] for a 0-d shape (PyTorch's ensure_nonempty for indexing ops).
inline shape_t nonempty_shape(const shape_t& shape) { return shape.empty() ? shape_t{1} : shape; }

/// `t` viewed with nonempty_shape: a 0-d tensor as [1].
template <element T>
tensor<T> nonempty_view(const tensor<T>& t) {
  return t.dim() == 0 ? t.unsqueeze(0) : t;
}

}  // namespace ccgraph::detail
