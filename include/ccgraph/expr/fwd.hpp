// ccgraph/expr/fwd.hpp: what tensor.hpp needs to know about expressions without including them.
#pragma once

#include <type_traits>

namespace ccgraph::detail {
/// Base class of every lazy pointwise expression type (see ccgraph/expr/expr.hpp).
struct expr_base {};
}  // namespace ccgraph::detail

namespace ccgraph {
/// True for lazy pointwise expression types.
template <class E>
inline constexpr bool is_expression_v = std::is_base_of_v<detail::expr_base, std::remove_cvref_t<E>>;

/// A lazy pointwise expression: has `value_type`, `shape()` and `eval()`.
template <class E>
concept expression = is_expression_v<E>;
}  // namespace ccgraph
