// ccgraph/expr/fwd.hpp: what tensor.hpp and the tracer need to know about expressions without
// including them: the expression base, and the hooks through which traced (symbolic) values
// become expression operands.
#pragma once

#include <type_traits>

namespace ccgraph::pointwise_operators {
/// Empty base of tensors, expressions and symbolic values. The pointwise operators (+, <, ==,
/// ...; ccgraph/ops/pointwise.hpp) live in this namespace, so argument-dependent lookup finds
/// them for these types only: == and < on every other ccgraph type (dtype, device, ...) do not
/// try a dozen more templates, which every translation unit would pay for in compile time.
struct operand_tag {};
}  // namespace ccgraph::pointwise_operators

namespace ccgraph::detail {
/// Base class of every lazy pointwise expression type (see ccgraph/expr/expr.hpp).
struct expr_base : pointwise_operators::operand_tag {};

/// Customisation point: the expression leaf a non-tensor operand type becomes (the tracer
/// specialises it for its symbolic values).
template <class X>
struct leaf_type_of {};
}  // namespace ccgraph::detail

namespace ccgraph {
template <class T>
class symbolic;  // ccgraph/trace/symbolic.hpp

/// True for lazy pointwise expression types.
template <class E>
inline constexpr bool is_expression_v = std::is_base_of_v<detail::expr_base, std::remove_cvref_t<E>>;

/// A lazy pointwise expression: has `value_type`, `shape()` and `eval()`.
template <class E>
concept expression = is_expression_v<E>;

/// True for the tracer's symbolic tensors (specialised in ccgraph/trace/symbolic.hpp).
template <class X>
inline constexpr bool is_symbolic_v = false;

/// True for the expression leaves that stand for symbolic tensors.
template <class X>
inline constexpr bool is_symbolic_leaf_v = false;

namespace detail {
/// True for expressions with a symbolic leaf (specialised in expr/expr.hpp).
template <class X>
struct expr_is_traced : std::false_type {};
}  // namespace detail

/// True for values being traced: symbolic tensors and expressions over them. Ops dispatch on
/// this: traced operands record graph nodes, the others compute.
template <class X>
inline constexpr bool is_traced_v =
    is_symbolic_v<std::remove_cvref_t<X>> || detail::expr_is_traced<std::remove_cvref_t<X>>::value;
}  // namespace ccgraph
