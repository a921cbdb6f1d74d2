// ccgraph/ops/pointwise.hpp: pointwise math on tensors, as lazy expressions.
//
//   cg::tensor<float> c = cg::relu(a) + b * 2.f;   // one loop over c, no temporaries
//   auto e = a * b;                                 // nothing computed yet
//   cg::tensor<float> d = cg::gelu(e - 1);          // now: one loop for mul, sub and gelu
//
// Operands are tensors, expressions and scalars; shapes broadcast as in PyTorch (scalars, and
// trailing dimensions). Two tensor operands of different element types are a compile error
// ("mixing dtypes"); a scalar of any arithmetic type is converted to the tensor's element type.
#pragma once

#include <ostream>
#include <type_traits>
#include <utility>

#include <ccgraph/expr/expr.hpp>
#include <ccgraph/expr/functors.hpp>
#include <ccgraph/tensor/print.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

// The four arithmetic operators. Each gets its own static_assert so that the message names it.
#define CCGRAPH_DEFINE_POINTWISE_OPERATOR(sym, tag)                                                \
  template <class L, class R>                                                                      \
    requires pointwise_operand_pair<L, R>                                                          \
  auto operator sym(L&& l, R&& r) {                                                                \
    static_assert(is_same_dtype_v<L, R>,                                                           \
                  "operator" #sym ": mixing dtypes: both tensor operands must have the same "      \
                  "element type (a scalar of any arithmetic type is fine); convert one of them "   \
                  "with .to<U>()");                                                                \
    if constexpr (is_same_dtype_v<L, R>)                                                           \
      return detail::make_expr<ops::tag>(std::forward<L>(l), std::forward<R>(r));                  \
  }

/// a + b, lazily (tensors, expressions, scalars; broadcasting).
CCGRAPH_DEFINE_POINTWISE_OPERATOR(+, add)
/// a - b, lazily.
CCGRAPH_DEFINE_POINTWISE_OPERATOR(-, sub)
/// a * b, lazily.
CCGRAPH_DEFINE_POINTWISE_OPERATOR(*, mul)
/// a / b, lazily; integers truncate toward zero.
CCGRAPH_DEFINE_POINTWISE_OPERATOR(/, div)
#undef CCGRAPH_DEFINE_POINTWISE_OPERATOR

/// -a, lazily.
template <pointwise_operand X>
auto operator-(X&& x) {
  return detail::make_expr<ops::neg>(std::forward<X>(x));
}

// The named unary functions. Ops marked floating_only (gelu, sin, ...) refuse integer tensors
// at compile time instead of silently truncating their results.
#define CCGRAPH_DEFINE_POINTWISE_FUNCTION(fn)                                                      \
  template <pointwise_operand X>                                                                   \
  auto fn(X&& x) {                                                                                 \
    constexpr bool ok = !ops::fn::floating_only || is_floating(dtype_v<value_type_t<X>>);          \
    static_assert(ok, "ccgraph::" #fn ": needs a floating-point tensor (f32, f64, bf16, f16); "    \
                      "convert with .to<float>() first");                                          \
    if constexpr (ok) return detail::make_expr<ops::fn>(std::forward<X>(x));                       \
  }

/// -x, lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(neg)
/// |x|, lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(abs)
/// max(x, 0), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(relu)
/// GELU, exact erf form (PyTorch's default), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(gelu)
/// x * sigmoid(x), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(silu)
/// 1 / (1 + exp(-x)), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(sigmoid)
/// sin(x), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(sin)
/// cos(x), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(cos)
/// exp(x), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(exp)
/// Natural log of x, lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(log)
/// tanh(x), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(tanh)
/// Square root of x, lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(sqrt)
#undef CCGRAPH_DEFINE_POINTWISE_FUNCTION

/// Evaluates an expression into a new contiguous tensor (one loop); returns a tensor unchanged,
/// so generic code can call it on either. (Traced values have their own overload in
/// ccgraph/trace/ops.hpp.)
template <pointwise_operand X>
  requires(!is_traced_v<X>)
tensor<value_type_t<X>> eval(X&& x) {
  if constexpr (is_expression_v<X>)
    return x.eval();
  else
    return std::forward<X>(x);
}

/// Prints an expression's value like a tensor (evaluates it).
template <expression E>
  requires(!is_traced_v<E>)
std::ostream& operator<<(std::ostream& os, const E& e) {
  return os << e.eval();
}

}  // namespace ccgraph
