// ccgraph/ops/impl/normalization_ops.ipp: the non-template functions of
// <ccgraph/ops/normalization_ops.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/normalization_ops.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL std::optional<tensor_meta> optional_meta(const std::vector<tensor_meta>& in, bool has, std::size_t k) {
  if (!has) return std::nullopt;
  return in.at(k);
}

}  // namespace detail

}  // namespace ccgraph
