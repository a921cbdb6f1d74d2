// ccgraph/autograd/checkpoint.hpp: activation checkpointing (torch.utils.checkpoint). The
// forward of a checkpointed function is recorded as usual, but the backward does not read the
// values it computed inside: the gradient rules of its nodes read recomputed copies, recorded
// into the backward right where a rule first needs them. So the joint graph keeps only the
// region's inputs alive between the forward and the backward, and the memory planner frees
// every value inside the region after its last forward use.
//
// Recomputation is lazy and minimal: a value is recomputed when a rule of the region reads it,
// with the values it needs (recursively) and nothing else. A collective inside the region is
// recomputed with its waits, in the order the (rank-independent) backward asks for it, so every
// rank issues the same recomputed collectives in the same order. A node that draws random
// numbers (dropout) is refused: its recomputation would draw another mask (PyTorch restores the
// generator's state instead; ccgraph does not yet).
//
// Everything here is a template instantiated where a checkpoint is traced.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/expr/expr.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/tensor/tensor.hpp>
#include <ccgraph/trace/ops.hpp>
#include <ccgraph/trace/symbolic.hpp>
#include <ccgraph/trace/trace_state.hpp>

namespace ccgraph {
namespace detail {

/// A checkpointed function's result as traced values: an expression materialised inside the
/// region (so its node belongs to it), a tuple element by element.
template <class R>
auto checkpoint_values(R&& r) {
  using X = std::remove_cvref_t<R>;
  if constexpr (is_expression_v<X>)
    return symbolic<typename X::value_type>(std::forward<R>(r));
  else if constexpr (is_symbolic_v<X>)
    return X(std::forward<R>(r));
  else if constexpr (requires { std::tuple_size<X>::value; })
    return std::apply([](auto&&... x) { return std::tuple{checkpoint_values(x)...}; }, std::forward<R>(r));
  else {
    static_assert(std::is_same_v<X, std::vector<symbolic<typename X::value_type::value_type>>>,
                  "checkpoint: the function must return traced values (a tensor, an expression, a tuple or a "
                  "std::vector of them)");
    return X(std::forward<R>(r));
  }
}

}  // namespace detail

/// What cg::checkpoint returns: calls the function; traced, its nodes form a checkpoint region.
template <class F>
class checkpoint_fn {
 public:
  explicit checkpoint_fn(F f) : f_(std::move(f)) {}

  /// Traced: records f and marks its nodes as recomputed for the backward.
  template <class... Ts>
  auto operator()(const symbolic<Ts>&... xs) const {
    static_assert(sizeof...(Ts) > 0, "checkpoint: the function needs at least one traced input");
    detail::trace_state* st = std::get<0>(std::forward_as_tuple(xs...)).state();
    const std::vector<node*> before_list = st->g.nodes();
    const std::unordered_set<const node*> before(before_list.begin(), before_list.end());
    auto r = detail::checkpoint_values(f_(xs...));
    std::vector<const node*> region;
    for (const node* n : st->g.nodes())
      if (!before.count(n)) region.push_back(n);
    st->checkpoints.push_back(std::move(region));
    return r;
  }

  /// Lazy expressions as inputs: materialised first (before the region, so they are kept).
  template <class... Xs>
    requires((is_expression_v<std::remove_cvref_t<Xs>> || ...))
  auto operator()(const Xs&... xs) const {
    return (*this)(::ccgraph::eval(xs)...);
  }

  /// Eager: f's values (no backward is recorded eagerly, so nothing is saved either way).
  template <class... Ts>
  auto operator()(const tensor<Ts>&... xs) const {
    return f_(xs...);
  }

 private:
  F f_;
};

/// cg::checkpoint(f): f with activation checkpointing (torch.utils.checkpoint, use_reentrant =
/// False). Traced and differentiated (cg::grad, cg::value_and_grad), the backward recomputes the
/// values of f it needs instead of keeping them from the forward; the gradients are the same, bit
/// for bit. Collectives inside f are recomputed too, identically on every rank; a dropout inside
/// f is refused when the backward would recompute it.
template <class F>
auto checkpoint(F f) {
  return checkpoint_fn<F>(std::move(f));
}

}  // namespace ccgraph
