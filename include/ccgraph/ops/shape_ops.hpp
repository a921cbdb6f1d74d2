// ccgraph/ops/shape_ops.hpp: ops that move elements without arithmetic: cat, stack, split, copy,
// repeat. stack's public function is the graph op's (ops/compute_ops.hpp); split is views.
#pragma once

#include <algorithm>
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

/// The shape of stack(tensors of these shapes, dim): every shape equal, with a new dim of size
/// tensors.size() inserted at `dim` (in [-(rank+1), rank], as torch.stack). Returns the
/// normalised dim through `dim_out`.
inline shape_t stack_shape(const std::vector<shape_t>& shapes, std::int64_t dim, int* dim_out = nullptr) {
  CCGRAPH_CHECK(!shapes.empty(), "stack: expected a non-empty list of tensors");
  const shape_t& first = shapes.front();
  for (std::size_t i = 1; i < shapes.size(); ++i)
    CCGRAPH_CHECK(shapes[i] == first, "stack: expects each tensor to be equal size, but got ", shape_str(first),
                  " at entry 0 and ", shape_str(shapes[i]), " at entry ", i);
  const int d = normalize_dim(dim, first.size() + 1, "stack");
  shape_t out = first;
  out.insert(out.begin() + d, static_cast<std::int64_t>(shapes.size()));
  if (dim_out) *dim_out = d;
  return out;
}

/// The piece sizes of split(t, split_size, dim) on a tensor of `shape`: split_size each, the
/// last one smaller when the size does not divide (one empty piece for a dim of size 0).
inline std::vector<std::int64_t> split_sizes(const shape_t& shape, std::int64_t split_size, std::int64_t dim) {
  CCGRAPH_CHECK(!shape.empty(), "split: dim ", dim, " is out of range for a tensor of rank 0");
  const int d = normalize_dim(dim, shape.size(), "split");
  const std::int64_t n = shape[static_cast<std::size_t>(d)];
  CCGRAPH_CHECK(split_size >= 0, "split: split_size must be non-negative, got ", split_size);
  CCGRAPH_CHECK(split_size > 0 || n == 0, "split: split_size can only be 0 if dim ", d,
                " has size 0, but it has size ", n);
  if (n == 0) return {0};
  std::vector<std::int64_t> sizes;
  for (std::int64_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  return sizes;
}

/// Checks split(t, sizes, dim)'s sizes (torch.split_with_sizes) against a tensor of `shape`:
/// non-negative, summing to the size of `dim`. Returns them.
inline std::vector<std::int64_t> split_sizes(const shape_t& shape, const std::vector<std::int64_t>& sizes,
                                             std::int64_t dim) {
  CCGRAPH_CHECK(!shape.empty(), "split: dim ", dim, " is out of range for a tensor of rank 0");
  const int d = normalize_dim(dim, shape.size(), "split");
  std::int64_t total = 0;
  for (const auto s : sizes) {
    CCGRAPH_CHECK(s >= 0, "split: negative size in split_sizes ", list_str(sizes));
    total += s;
  }
  CCGRAPH_CHECK(total == shape[static_cast<std::size_t>(d)], "split: split_sizes ", list_str(sizes),
                " must sum exactly to ", shape[static_cast<std::size_t>(d)], " (the size of dim ", d,
                " of the input of shape ", shape_str(shape), ")");
  return sizes;
}

/// cat's kernel, on any device (the copies run on the tensors' device): writes the inputs one
/// after the other along `dim` into `out` (any strides; of cat_shape's shape).
template <element T>
void cat_kernel(const std::vector<tensor<T>>& tensors, std::int64_t dim, const tensor<T>& out) {
  std::vector<shape_t> shapes;
  shapes.reserve(tensors.size());
  for (const auto& t : tensors) shapes.push_back(t.shape());
  int d = 0;
  const shape_t out_shape = cat_shape(shapes, dim, &d);
  CCGRAPH_CHECK(out.shape() == out_shape, "cat: output of shape ", shape_str(out.shape()),
                " for a result of shape ", shape_str(out_shape));
  for (const auto& t : tensors)
    CCGRAPH_CHECK(t.device() == out.device(), "cat: tensors on ", out.device(), " and ", t.device());
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    out.narrow(d, offset, t.shape()[static_cast<std::size_t>(d)]).copy_(t);
    offset += t.shape()[static_cast<std::size_t>(d)];
  }
}

/// t.repeat(times) into `out` (contiguous, of the result's shape): the same copy tensor::repeat
/// makes, a view of the source with stride 0 over each repeat count.
template <class T>
void repeat_into(tensor<T> out, const tensor<T>& t, const std::vector<std::int64_t>& times) {
  t.wait();
  const std::size_t extra = times.size() - t.shape().size();
  shape_t in_shape(extra, 1);
  in_shape.insert(in_shape.end(), t.shape().begin(), t.shape().end());
  strides_t in_strides(extra, 0);
  in_strides.insert(in_strides.end(), t.strides().begin(), t.strides().end());
  shape_t split;
  strides_t src_split;
  for (std::size_t i = 0; i < times.size(); ++i) {
    split.push_back(times[i]);
    split.push_back(in_shape[i]);
    src_split.push_back(0);
    src_split.push_back(in_strides[i]);
  }
  out.reshape(split).copy_(tensor<T>(t.storage(), split, src_split, t.storage_offset()));
}

/// stack's kernel, on any device: input i goes to index i of the new dim of `out` (of
/// stack_shape's shape).
template <element T>
void stack_kernel(const std::vector<tensor<T>>& tensors, std::int64_t dim, const tensor<T>& out) {
  std::vector<shape_t> shapes;
  shapes.reserve(tensors.size());
  for (const auto& t : tensors) shapes.push_back(t.shape());
  int d = 0;
  const shape_t out_shape = stack_shape(shapes, dim, &d);
  CCGRAPH_CHECK(out.shape() == out_shape, "stack: output of shape ", shape_str(out.shape()),
                " for a result of shape ", shape_str(out_shape));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CCGRAPH_CHECK(tensors[i].device() == out.device(), "stack: tensors on ", out.device(), " and ",
                  tensors[i].device());
    out.select(d, static_cast<std::int64_t>(i)).copy_(tensors[i]);
  }
}

}  // namespace detail

/// Concatenates tensors along `dim` (negative counts from the end) into a new contiguous tensor,
/// like torch.cat. All tensors need the same rank and the same sizes except along `dim`; any
/// strides are fine. Waits on pending inputs. On a GPU each input is one strided copy kernel.
template <element T>
tensor<T> cat(const std::vector<tensor<T>>& tensors, std::int64_t dim = 0) {
  std::vector<shape_t> shapes;
  shapes.reserve(tensors.size());
  for (const auto& t : tensors) shapes.push_back(t.shape());
  const shape_t out_shape = detail::cat_shape(shapes, dim);
  const device dev = tensors.front().device();
  auto out = tensor<T>::empty(out_shape, dev);
  detail::cat_kernel(tensors, dim, out);
  return out;
}

/// cat for a braced list: `cg::cat({a, b}, 1)`.
template <element T>
tensor<T> cat(std::initializer_list<tensor<T>> tensors, std::int64_t dim = 0) {
  return cat(std::vector<tensor<T>>(tensors), dim);
}

/// Splits `t` along `dim` into views of `split_size` elements each (the last smaller when the
/// size does not divide), like torch.split with an int. Never copies, never waits. On traced
/// values it records one `narrow` view per piece: the pieces alias the input, as PyTorch's do,
/// so the graph has no split node that would copy (stack, which must copy, is one: ops::stack).
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
std::vector<V> split(const V& t, std::int64_t split_size, std::int64_t dim = 0) {
  const std::vector<std::int64_t> sizes = detail::split_sizes(t.shape(), split_size, dim);
  std::vector<V> out;
  std::int64_t start = 0;
  for (const auto n : sizes) {
    out.push_back(t.narrow(dim, start, n));
    start += n;
  }
  return out;
}

/// Splits `t` along `dim` into views of the given sizes, which must add up to the dim's size,
/// like torch.split with a list (split_with_sizes). Never copies, never waits; on traced values,
/// narrow views as above.
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
std::vector<V> split(const V& t, const std::vector<std::int64_t>& sizes, std::int64_t dim = 0) {
  (void)detail::split_sizes(t.shape(), sizes, dim);
  std::vector<V> out;
  std::int64_t start = 0;
  for (const auto n : sizes) {
    out.push_back(t.narrow(dim, start, n));
    start += n;
  }
  return out;
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
