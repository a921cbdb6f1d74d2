// ccgraph/ops/impl/reduction_ops.ipp: the non-template functions of
// <ccgraph/ops/reduction_ops.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/reduction_ops.hpp>

namespace ccgraph {

namespace ops::detail {

CCGRAPH_DECL op_cost rowwise_cost(const cost_args& a, double flops_per_elem) {
  const double n = a.in.empty() ? 0.0 : double(numel_of(a.in[0].shape));
  return op_cost::compute(flops_per_elem * n, meta_bytes(a.in) + meta_bytes(a.out), peak_class::vector);
}

CCGRAPH_DECL void expect_floating_grads(std::string_view what, const std::vector<tensor_meta>& in) {
  ::ccgraph::detail::require_floating(in.at(0).dtype, what.data());
  expect_same_dtype(what, in);
}

}  // namespace ops::detail

}  // namespace ccgraph
