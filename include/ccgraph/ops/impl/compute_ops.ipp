// ccgraph/ops/impl/compute_ops.ipp: the non-template functions of
// <ccgraph/ops/compute_ops.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/compute_ops.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL std::size_t expr_op_count(std::string_view expr) {
  std::size_t n = 0;
  for (std::size_t i = 1; i < expr.size(); ++i) {
    const char c = expr[i - 1];
    if (expr[i] == '(' && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      ++n;
  }
  return n;
}

}  // namespace detail

namespace ops {

namespace detail {

CCGRAPH_DECL void expect_inputs(std::string_view what, const std::vector<tensor_meta>& in, std::size_t n) {
  CCGRAPH_CHECK(in.size() == n, what, ": expects ", n, " input(s), got ", in.size());
}

CCGRAPH_DECL void expect_same_dtype(std::string_view what, const std::vector<tensor_meta>& in) {
  for (auto& m : in)
    CCGRAPH_CHECK(m.dtype == in.front().dtype, what, ": mixing dtypes: ", in.front().str(),
                  " and ", m.str());
}

CCGRAPH_DECL double meta_bytes(const std::vector<tensor_meta>& ms) {
  double b = 0;
  for (const auto& m : ms) b += meta_bytes(m);
  return b;
}

}  // namespace detail

}  // namespace ops

}  // namespace ccgraph
