// ccgraph/ir/node_op.hpp: the closed set of graph node kinds, each one of the op definitions in
// ops/, and the inference that dispatches to them.
#pragma once

#include <optional>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/ops/compute_ops.hpp>

namespace ccgraph {

/// What a node does, with its attributes: one alternative per op kind.
using node_op = std::variant<
    ops::placeholder, ops::output, ops::wait_tensor,
    // collectives (same order as ops::collective_op)
    ops::all_reduce, ops::all_gather_into_tensor, ops::reduce_scatter_tensor,
    ops::all_to_all_single, ops::broadcast, ops::all_reduce_coalesced,
    ops::all_gather_into_tensor_coalesced, ops::reduce_scatter_tensor_coalesced, ops::batch_isend_irecv, ops::reduce,
    // compute
    ops::matmul, ops::pointwise, ops::cat, ops::repeat, ops::copy,
    // views
    ops::reshape, ops::narrow, ops::transpose, ops::permute, ops::select, ops::unsqueeze,
    ops::contiguous>;

namespace detail {
template <class O, class V>
inline constexpr bool variant_has_v = false;
template <class O, class... Ts>
inline constexpr bool variant_has_v<O, std::variant<Ts...>> = (std::is_same_v<O, Ts> || ...);
}  // namespace detail

/// True for op types that are collectives.
template <class O>
inline constexpr bool is_collective_op_v = detail::variant_has_v<O, ops::collective_op>;

/// True for the view ops (results alias their input).
template <class O>
inline constexpr bool is_view_op_v =
    std::is_same_v<O, ops::reshape> || std::is_same_v<O, ops::narrow> ||
    std::is_same_v<O, ops::transpose> || std::is_same_v<O, ops::permute> ||
    std::is_same_v<O, ops::select> || std::is_same_v<O, ops::unsqueeze>;

/// The op's name: "all_reduce", "matmul", "pointwise", ...
inline std::string_view name_of(const node_op& op) {
  return std::visit([](const auto& o) { return std::decay_t<decltype(o)>::name; }, op);
}

/// The collective in `op`, if it is one.
inline std::optional<ops::collective_op> as_collective(const node_op& op) {
  return std::visit(
      [](const auto& o) -> std::optional<ops::collective_op> {
        if constexpr (is_collective_op_v<std::decay_t<decltype(o)>>) return ops::collective_op(o);
        else return std::nullopt;
      },
      op);
}

/// A collective as a node op.
inline node_op to_node_op(const ops::collective_op& c) {
  return std::visit([](const auto& o) { return node_op(o); }, c);
}

/// Output metas of `op` on inputs `in` (`group` for collectives), validating with the same
/// messages as the eager calls.
inline std::vector<tensor_meta> infer(const node_op& op, const std::vector<tensor_meta>& in,
                                      const std::optional<group_info>& group) {
  auto out = std::visit(
      [&](const auto& o) -> std::vector<tensor_meta> {
        using O = std::decay_t<decltype(o)>;
        if constexpr (is_collective_op_v<O>) {
          CCGRAPH_CHECK(group.has_value(), O::name, ": a collective node needs a group");
          return ops::infer(ops::collective_op(o), in, *group);
        } else if constexpr (std::is_same_v<O, ops::placeholder> || std::is_same_v<O, ops::output>) {
          return {};
        } else if constexpr (std::is_same_v<O, ops::pointwise>) {
          CCGRAPH_CHECK(!in.empty(), "pointwise: needs at least one tensor input");
          // The recorded expression knows its element types (it may mix them: comparisons,
          // where); without one, every input and the result share one.
          if (o.kernel)
            o.kernel->check_inputs(in, o.fused);
          else
            ops::detail::expect_same_dtype("pointwise", in);
          shape_t s = in[0].shape;
          for (auto& m : in) s = broadcast_shapes(s, m.shape, o.fused.c_str());
          return {{o.kernel ? o.kernel->result_dtype(in[0].dtype) : in[0].dtype, s}};
        } else {
          return ops::infer_compute(o, in);
        }
      },
      op);
  // Every value a graph holds has a countable shape (a broadcast or matmul can outgrow its
  // inputs), so sizes and plans computed from it never overflow.
  for (const auto& m : out)
    (void)checked_numel(m.shape, std::visit([](const auto& o) { return std::decay_t<decltype(o)>::name; }, op));
  return out;
}

}  // namespace ccgraph
