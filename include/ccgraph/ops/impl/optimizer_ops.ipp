// ccgraph/ops/impl/optimizer_ops.ipp: the non-template functions of
// <ccgraph/ops/optimizer_ops.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/optimizer_ops.hpp>

namespace ccgraph::detail {

CCGRAPH_DECL void check_fused_adamw_inputs(const std::vector<tensor_meta>& in) {
  constexpr const char* what = "fused_adamw";
  ops::detail::expect_inputs(what, in, 6);
  static constexpr const char* names[] = {"param", "grad", "exp_avg", "exp_avg_sq", "step_size", "bias_sqrt2"};
  require_floating(in[0].dtype, what);
  for (std::size_t k = 1; k < 4; ++k)
    CCGRAPH_CHECK(in[k] == in[0], what, ": ", names[k], " is ", in[k].str(), " but param is ", in[0].str());
  const dtype s = adamw_scalar_dtype(in[0].dtype);
  for (std::size_t k = 4; k < 6; ++k)
    CCGRAPH_CHECK(in[k].dtype == s && in[k].shape.empty(), what, ": ", names[k], " must be a 0-d ", to_string(s),
                  " value for ", to_string(in[0].dtype), " parameters, got ", in[k].str());
}

}  // namespace ccgraph::detail
