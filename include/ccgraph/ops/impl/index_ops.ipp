// ccgraph/ops/impl/index_ops.ipp: the non-template functions of
// <ccgraph/ops/index_ops.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/index_ops.hpp>

namespace ccgraph::detail {

CCGRAPH_DECL void check_index_dtype(dtype dt, const char* what, bool int32_ok) {
  if (int32_ok) {
    CCGRAPH_CHECK(dt == dtype::i64 || dt == dtype::i32, what,
                  ": expected an index tensor of dtype i64 or i32, got ", dt);
  } else {
    CCGRAPH_CHECK(dt == dtype::i64, what, ": expected dtype i64 for index, got ", dt);
  }
}

CCGRAPH_DECL std::int64_t embedding_padding_idx(std::optional<std::int64_t> padding_idx,
                                          std::int64_t num_embeddings) {
  if (!padding_idx) return -1;
  const std::int64_t p = *padding_idx;
  CCGRAPH_CHECK(p < num_embeddings && p >= -num_embeddings, "embedding: padding_idx ", p,
                " must be within num_embeddings ", num_embeddings);
  return p < 0 ? p + num_embeddings : p;
}

CCGRAPH_DECL shape_t embedding_shape(const shape_t& indices, dtype index_dtype, const shape_t& weight,
                               std::optional<std::int64_t> padding_idx) {
  check_index_dtype(index_dtype, "embedding", true);
  CCGRAPH_CHECK(weight.size() == 2, "embedding: weight must be 2-D [num_embeddings, embedding_dim], got shape ",
                shape_str(weight));
  (void)embedding_padding_idx(padding_idx, weight[0]);
  shape_t out = indices;
  out.push_back(weight[1]);
  return out;
}

CCGRAPH_DECL shape_t embedding_backward_shape(const shape_t& grad, const shape_t& indices, dtype index_dtype,
                                        std::int64_t num_weights,
                                        std::optional<std::int64_t> padding_idx) {
  check_index_dtype(index_dtype, "embedding_backward", true);
  CCGRAPH_CHECK(num_weights >= 0, "embedding_backward: negative num_weights ", num_weights);
  CCGRAPH_CHECK(grad.size() == indices.size() + 1 &&
                    std::equal(indices.begin(), indices.end(), grad.begin()),
                "embedding_backward: grad of shape ", shape_str(grad),
                " must be the indices' shape ", shape_str(indices), " plus the embedding dim");
  (void)embedding_padding_idx(padding_idx, num_weights);
  return {num_weights, grad.back()};
}

CCGRAPH_DECL shape_t index_select_shape(const shape_t& input, std::int64_t dim, const shape_t& index,
                                  dtype index_dtype) {
  check_index_dtype(index_dtype, "index_select", true);
  CCGRAPH_CHECK(index.size() <= 1, "index_select: index is supposed to be a vector, got shape ",
                shape_str(index));
  const int d = index_op_dim(dim, input.size(), "index_select");
  if (input.empty()) {  // a 0-d input takes a one-element index and stays 0-d
    CCGRAPH_CHECK(numel_of(index) == 1, "index_select: index to a 0-d input can have only 1 value, got ",
                  numel_of(index));
    return {};
  }
  shape_t out = input;
  out[static_cast<std::size_t>(d)] = numel_of(index);
  return out;
}

CCGRAPH_DECL shape_t gather_shape(const shape_t& input, std::int64_t dim, const shape_t& index,
                            dtype index_dtype) {
  check_index_dtype(index_dtype, "gather", false);
  const int d = index_op_dim(dim, input.size(), "gather");
  const shape_t in = nonempty_shape(input), ix = nonempty_shape(index);
  CCGRAPH_CHECK(in.size() == ix.size(), "gather: index ", shape_str(index),
                " must have the same number of dimensions as input ", shape_str(input));
  for (std::size_t k = 0; k < in.size(); ++k)
    CCGRAPH_CHECK(static_cast<int>(k) == d || ix[k] <= in[k], "gather: size does not match at dimension ", k,
                  ": expected index ", shape_str(index), " to be smaller than input ",
                  shape_str(input), " apart from dimension ", d);
  return index;
}

CCGRAPH_DECL shape_t scatter_add_shape(const shape_t& self, std::int64_t dim, const shape_t& index,
                                 dtype index_dtype, const shape_t& src, dtype self_dtype,
                                 dtype src_dtype) {
  check_index_dtype(index_dtype, "scatter_add", false);
  CCGRAPH_CHECK(self_dtype == src_dtype, "scatter_add: self (", self_dtype, ") and src (",
                src_dtype, ") must have the same dtype");
  const int d = index_op_dim(dim, self.size(), "scatter_add");
  const shape_t s = nonempty_shape(self), ix = nonempty_shape(index), sr = nonempty_shape(src);
  CCGRAPH_CHECK(s.size() == ix.size(), "scatter_add: index ", shape_str(index),
                " must have the same number of dimensions as self ", shape_str(self));
  CCGRAPH_CHECK(sr.size() == ix.size(), "scatter_add: index ", shape_str(index),
                " must have the same number of dimensions as src ", shape_str(src));
  bool fits = true;
  for (std::size_t k = 0; k < s.size(); ++k)
    fits = fits && (static_cast<int>(k) == d || ix[k] <= s[k]) && ix[k] <= sr[k];
  CCGRAPH_CHECK(fits, "scatter_add: expected index ", shape_str(index), " to be smaller than self ",
                shape_str(self), " apart from dimension ", d, " and to be smaller size than src ",
                shape_str(src));
  return self;
}

CCGRAPH_DECL void check_index_bounds(std::int64_t i, std::int64_t size, int dim, const char* what) {
  CCGRAPH_CHECK(i >= 0 && i < size, what, ": index ", i, " is out of bounds for dimension ", dim,
                " with size ", size);
}

}  // namespace ccgraph::detail

namespace ccgraph {

namespace detail {

CCGRAPH_DECL double index_op_bytes(const cost_args& a, std::size_t index_at) {
  return 2 * ops::detail::meta_bytes(a.out) + ops::detail::meta_bytes(a.in.at(index_at));
}

}  // namespace detail

}  // namespace ccgraph
