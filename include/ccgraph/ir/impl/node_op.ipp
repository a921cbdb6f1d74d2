// ccgraph/ir/impl/node_op.ipp: the dispatchers of ir/node_op.hpp, each one visit over the closed
// op set. Included by that header when header-only, and compiled once by <ccgraph/impl/src.hpp>
// under CCGRAPH_SEPARATE_COMPILATION (each visit instantiates one function per op).
#pragma once

#include <ccgraph/ir/node_op.hpp>

namespace ccgraph {

CCGRAPH_DECL std::string_view name_of(const node_op& op) {
  return visit_op(op, [](const auto& o) { return std::decay_t<decltype(o)>::name; });
}

CCGRAPH_DECL op_category category_of(const node_op& op) {
  return visit_op(op, [](const auto& o) { return op_traits<std::decay_t<decltype(o)>>::category; });
}

CCGRAPH_DECL alias_kind aliasing_of(const node_op& op) {
  return visit_op(op, [](const auto& o) { return op_traits<std::decay_t<decltype(o)>>::aliasing; });
}

CCGRAPH_DECL bool in_place_input_of(const node_op& op) {
  return visit_op(op, [](const auto& o) { return op_traits<std::decay_t<decltype(o)>>::in_place_input; });
}

CCGRAPH_DECL bool elementwise_of(const node_op& op) {
  return visit_op(op, [](const auto& o) { return detail::op_elementwise<std::decay_t<decltype(o)>>(); });
}

CCGRAPH_DECL bool draws_random(const node_op& op) {
  return visit_op(op, [](const auto& o) {
    using O = std::decay_t<decltype(o)>;
    if constexpr (detail::op_has_draws_random<O>)
      return bool(op_traits<O>::draws_random(o));
    else
      return false;
  });
}

CCGRAPH_DECL op_cost cost_of(const node_op& op, const std::vector<tensor_meta>& in, const std::vector<tensor_meta>& out,
                       int group_size) {
  return visit_op(op, [&](const auto& o) {
    using O = std::decay_t<decltype(o)>;
    detail::require_cost<O>();
    return op_traits<O>::cost(o, cost_args{in, out, group_size});
  });
}

CCGRAPH_DECL std::optional<ops::collective_op> as_collective(const node_op& op) {
  return visit_op(op, [](const auto& o) -> std::optional<ops::collective_op> {
    if constexpr (is_collective_op_v<std::decay_t<decltype(o)>>) return ops::collective_op(o);
    else return std::nullopt;
  });
}

CCGRAPH_DECL node_op to_node_op(const ops::collective_op& c) {
  return ::ccgraph::detail::visit([](const auto& o) { return node_op(o); }, c);
}

CCGRAPH_DECL std::vector<tensor_meta> infer(const node_op& op, const std::vector<tensor_meta>& in,
                                      const std::optional<group_info>& group) {
  const infer_ctx ctx{group ? &*group : nullptr};
  auto out = visit_op(op, [&](const auto& o) {
    using O = std::decay_t<decltype(o)>;
    detail::require_infer<O>();
    detail::check_complex_inputs<O>(in);
    return op_traits<O>::infer(o, in, ctx);
  });
  // Every value a graph holds has a countable shape (a broadcast or matmul can outgrow its
  // inputs), so sizes and plans computed from it never overflow.
  for (const auto& m : out) (void)checked_numel(m.shape, name_of(op));
  return out;
}

}  // namespace ccgraph
