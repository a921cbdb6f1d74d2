// ccgraph/ops/shape_ops.hpp: ops that move elements without arithmetic: cat, copy, repeat.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/expr/expr.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {
namespace detail {

/// The shape of cat(tensors of these shapes, dim): sizes add up along `dim`, every other size
/// must match. Throws naming the offending shapes. Returns the normalised dim through `dim_out`.
inline shape_t cat_shape(const std::vector<shape_t>& shapes, std::int64_t dim, int* dim_out = nullptr) {
  CCGRAPH_CHECK(!shapes.empty(), "cat: expected a non-empty list of tensors");
  const shape_t& first = shapes.front();
  const int d = normalize_dim(dim, first.size(), "cat");
  shape_t out = first;
  out[d] = 0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const shape_t& s = shapes[i];
    CCGRAPH_CHECK(s.size() == first.size(), "cat: tensors must have the same number of dimensions: ",
                  shape_str(first), " (tensor 0) and ", shape_str(s), " (tensor ", i, ")");
    for (std::size_t k = 0; k < s.size(); ++k)
      CCGRAPH_CHECK(static_cast<int>(k) == d || s[k] == first[k],
                    "cat: sizes of tensors must match except in dim ", d, ": ", shape_str(first),
                    " (tensor 0) and ", shape_str(s), " (tensor ", i, ") differ in dim ", k);
    CCGRAPH_CHECK(checked_add(out[d], s[d], out[d]), "cat: dim ", d, " of the result exceeds 2^63 - 1 at tensor ", i,
                  " (", shape_str(s), ")");
  }
  (void)checked_numel(out, "cat");
  if (dim_out) *dim_out = d;
  return out;
}

}  // namespace detail

/// Concatenates tensors along `dim` (negative counts from the end) into a new contiguous tensor,
/// like torch.cat. All tensors need the same rank and the same sizes except along `dim`; any
/// strides are fine. Waits on pending inputs.
template <element T>
tensor<T> cat(const std::vector<tensor<T>>& tensors, std::int64_t dim = 0) {
  std::vector<shape_t> shapes;
  shapes.reserve(tensors.size());
  for (const auto& t : tensors) shapes.push_back(t.shape());
  int d = 0;
  const shape_t out_shape = detail::cat_shape(shapes, dim, &d);
  const device dev = tensors.front().device();
  for (const auto& t : tensors)
    CCGRAPH_CHECK(t.device() == dev, "cat: tensors on ", dev, " and ", t.device());
  auto out = tensor<T>::empty(out_shape, dev);
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    out.narrow(d, offset, t.shape()[d]).copy_(t);
    offset += t.shape()[d];
  }
  return out;
}

/// cat for a braced list: `cg::cat({a, b}, 1)`.
template <element T>
tensor<T> cat(std::initializer_list<tensor<T>> tensors, std::int64_t dim = 0) {
  return cat(std::vector<tensor<T>>(tensors), dim);
}

/// Copies `src` into `dst` in place and returns `dst` (a handle to the same memory), like
/// `dst.copy_(src)` in PyTorch: `src` may be a tensor, an expression (evaluated first, so it may
/// read `dst` itself) or a scalar (fills), and broadcasts to dst's shape. A tensor of another
/// element type is converted.
template <element T, class S>
  requires(pointwise_operand<S> || scalar_operand<S>) && (!is_traced_v<S>)
tensor<T> copy(tensor<T> dst, const S& src) {
  if constexpr (scalar_operand<S>) {
    dst.fill_(detail::cast<T>(src));
  } else {
    using U = value_type_t<S>;
    const tensor<U> s = src;  // evaluates an expression
    if constexpr (std::is_same_v<U, T>)
      dst.copy_(s);
    else
      dst.copy_(s.template to<T>());
  }
  return dst;
}

/// Tiles `t`: dim i repeated `times[i]` times; extra leading counts add dimensions (torch's
/// Tensor.repeat; same as `t.repeat(times)`). Returns a new contiguous tensor.
template <element T>
tensor<T> repeat(const tensor<T>& t, const std::vector<std::int64_t>& times) {
  return t.repeat(times);
}

}  // namespace ccgraph
