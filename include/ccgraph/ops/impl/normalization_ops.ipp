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

// Out of line: norm_backward_infer_check instantiates the kernels' shape checks for every
// floating dtype, which is compiled here once rather than in every unit.
CCGRAPH_DECL std::vector<tensor_meta> op_traits<ops::layer_norm_backward>::infer(const O& o, const std::vector<tensor_meta>& in,
                                                              const infer_ctx&) {
  detail::norm_backward_infer_check<false>("layer_norm_backward", in, o.normalized_shape, o.has_weight, o.has_bias);
  std::vector<tensor_meta> out{in[1]};
  if (o.has_weight) out.push_back({in[1].dtype, o.normalized_shape});
  if (o.has_bias) out.push_back({in[1].dtype, o.normalized_shape});
  return out;
}

CCGRAPH_DECL std::vector<tensor_meta> op_traits<ops::rms_norm_backward>::infer(const O& o, const std::vector<tensor_meta>& in,
                                                              const infer_ctx&) {
  detail::norm_backward_infer_check<true>("rms_norm_backward", in, o.normalized_shape, o.has_weight, false);
  std::vector<tensor_meta> out{in[1]};
  if (o.has_weight) out.push_back({in[1].dtype, o.normalized_shape});
  return out;
}

}  // namespace ccgraph
