// ccgraph/ops/impl/attention.ipp: the non-template functions of <ccgraph/ops/attention.hpp>.
// Included by that header when header-only, compiled once by <ccgraph/impl/src.hpp> under
// CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/attention.hpp>

namespace ccgraph {

// Out of line: the check instantiates sdpa_backward_check for every floating dtype, which is
// compiled here once rather than in every unit.
CCGRAPH_DECL std::vector<tensor_meta> op_traits<ops::scaled_dot_product_attention_backward>::infer(
    const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
  CCGRAPH_CHECK(in.size() == 6 || in.size() == 7, O::name,
                ": expects 6 or 7 input(s) (grad_out, query, key, value, out, lse, attn_mask), got ", in.size());
  const auto opt = detail::sdpa_options_of(o);
  const auto mask = detail::optional_meta(in, 6);
  (void)detail::sdpa_check(in[1], in[2], in[3], mask, opt);  // q, k, v and the mask, first
  const dtype dt = in[1].dtype;
  CCGRAPH_CHECK(in[0].dtype == dt && in[4].dtype == dt, O::name, ": grad_out (", in[0].dtype, ") and out (",
                in[4].dtype, ") must have the query's dtype ", dt);
  CCGRAPH_CHECK(in[5].dtype == detail::sdpa_lse_dtype(dt), O::name, ": lse of dtype ", in[5].dtype, "; expected ",
                detail::sdpa_lse_dtype(dt), " for a query of dtype ", dt);
  visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      using ccgraph::detail::meta_tensor;
      const auto q = meta_tensor<T>(in[1]), k = meta_tensor<T>(in[2]), v = meta_tensor<T>(in[3]);
      (void)detail::sdpa_backward_check(meta_tensor<T>(in[0]), q, k, v, meta_tensor<T>(in[4]),
                                        meta_tensor<detail::sdpa_lse_t<T>>(in[5]), std::optional<tensor<bool>>(),
                                        opt, q, k, v);
    }
  });
  return {in[1], in[2], in[3]};
}

}  // namespace ccgraph
