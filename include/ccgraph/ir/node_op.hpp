// ccgraph/ir/node_op.hpp: the closed set of graph node kinds, each one of the op definitions in
// ops/ with its op_traits, the check that every one is complete, and the visits that read them.
#pragma once

#include <optional>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/visit.hpp>
#include <ccgraph/ops/attention.hpp>
#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/ops/index_ops.hpp>
#include <ccgraph/ops/linear.hpp>
#include <ccgraph/ops/loss_ops.hpp>
#include <ccgraph/ops/normalization_ops.hpp>
#include <ccgraph/ops/optimizer_ops.hpp>
#include <ccgraph/ops/reduction_ops.hpp>
#include <ccgraph/ops/squeeze.hpp>
#include <ccgraph/ops/user_op.hpp>

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
    // compute: reductions, norms, loss (ops/reduction_ops.hpp, normalization_ops.hpp, loss_ops.hpp)
    ops::sum, ops::mean, ops::var, ops::amax, ops::amin, ops::max, ops::min, ops::max_dim, ops::min_dim,
    ops::argmax, ops::argmin, ops::softmax, ops::log_softmax, ops::layer_norm, ops::rms_norm, ops::cross_entropy,
    // compute: their backward kernels
    ops::amax_backward, ops::max_backward, ops::max_dim_backward, ops::var_backward, ops::softmax_backward,
    ops::log_softmax_backward, ops::layer_norm_backward, ops::rms_norm_backward, ops::cross_entropy_backward,
    // compute: index, stacking, linear algebra, attention (ops/index_ops.hpp, shape_ops.hpp, linear.hpp, attention.hpp)
    ops::stack,
    ops::embedding, ops::embedding_backward, ops::index_select, ops::gather, ops::scatter_add,
    ops::bmm, ops::linear,
    ops::scaled_dot_product_attention, ops::scaled_dot_product_attention_backward,
    // compute: fused optimizer updates (ops/optimizer_ops.hpp)
    ops::fused_adamw,
    // views
    ops::reshape, ops::narrow, ops::transpose, ops::permute, ops::select, ops::unsqueeze,
    ops::contiguous, ops::squeeze,
    // a user's op (ops/user_op.hpp)
    ops::user>;

namespace detail {
template <class O, class V>
inline constexpr bool variant_has_v = false;
template <class O, class... Ts>
inline constexpr bool variant_has_v<O, std::variant<Ts...>> = (std::is_same_v<O, Ts> || ...);

/// Every op of the closed set has every behaviour its category needs (ops/op_traits.hpp): a
/// forgotten one fails to compile here, naming the behaviour, with the op in the backtrace.
template <class... Os>
constexpr bool check_ops(const std::variant<Os...>*) {
  return (check_op<Os>() && ...);
}
static_assert(check_ops(static_cast<const node_op*>(nullptr)));
static_assert(check_ops(static_cast<const ops::collective_op*>(nullptr)));
}  // namespace detail

/// Visits the op's type: `f(o)` with `o` the op struct. Every dispatcher is one such visit that
/// reads op_traits<O>, so it has no default branch.
template <class F>
decltype(auto) visit_op(const node_op& op, F&& f) {
  return ::ccgraph::detail::visit(std::forward<F>(f), op);
}

/// True for op types that are collectives.
template <class O>
inline constexpr bool is_collective_op_v = op_traits<O>::category == op_category::collective;

/// True for the view ops (results alias their input, or copy it when its layout forces one:
/// reshape, contiguous).
template <class O>
inline constexpr bool is_view_op_v = op_traits<O>::category == op_category::view;

/// The op's name: "all_reduce", "matmul", "pointwise", ...
CCGRAPH_DECL std::string_view name_of(const node_op& op);

/// The op's category.
CCGRAPH_DECL op_category category_of(const node_op& op);

/// Where the op's outputs live.
CCGRAPH_DECL alias_kind aliasing_of(const node_op& op);

/// True when the op may write output k into input k's buffer when that input dies there.
CCGRAPH_DECL bool in_place_input_of(const node_op& op);

/// True when the op is elementwise (detail::op_elementwise): each output may be computed
/// straight into an input of its meta whose old value nothing else reads any more.
CCGRAPH_DECL bool elementwise_of(const node_op& op);

/// True when each run of `op` draws new random numbers (op_traits<O>::draws_random; false for
/// an op without it).
CCGRAPH_DECL bool draws_random(const node_op& op);

/// What the cost model prices for `op` on inputs `in` giving `out` (group_size for collectives).
CCGRAPH_DECL op_cost cost_of(const node_op& op, const std::vector<tensor_meta>& in, const std::vector<tensor_meta>& out,
                             int group_size = 1);

/// The collective in `op`, if it is one.
CCGRAPH_DECL std::optional<ops::collective_op> as_collective(const node_op& op);

/// A collective as a node op.
CCGRAPH_DECL node_op to_node_op(const ops::collective_op& c);

/// Output metas of `op` on inputs `in` (`group` for collectives), validating with the same
/// messages as the eager calls: op_traits<O>::infer.
CCGRAPH_DECL std::vector<tensor_meta> infer(const node_op& op, const std::vector<tensor_meta>& in,
                                            const std::optional<group_info>& group);

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ir/impl/node_op.ipp>
#endif
