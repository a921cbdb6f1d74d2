// ccgraph/ops/pointwise.hpp: pointwise math on tensors, as lazy expressions.
//
//   cg::tensor<float> c = cg::relu(a) + b * 2.f;   // one loop over c, no temporaries
//   auto e = a * b;                                 // nothing computed yet
//   cg::tensor<float> d = cg::gelu(e - 1);          // now: one loop for mul, sub and gelu
//   cg::tensor<float> m = cg::where(a > 0, a, 0.1f * a);            // comparisons are bool
//   cg::tensor<float> y = cg::dropout(cg::clamp(a, -1, 1), 0.1);   // still one loop
//
// Operands are tensors, expressions and scalars; shapes broadcast as in PyTorch (scalars, and
// trailing dimensions). Two tensor operands of different element types are a compile error
// ("mixing dtypes"); a scalar of any arithmetic type is converted to the tensor's element type
// (the ops added with comparisons, where, clamp, pow, maximum and minimum refuse a
// floating-point scalar with an integer tensor at compile time, where PyTorch would promote).
// Comparisons give bool expressions; `x.to<U>()` of an expression, and `cg::cast<U>(x)` of any
// operand, convert inside the loop.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <type_traits>
#include <utility>

#include <ccgraph/expr/expr.hpp>
#include <ccgraph/expr/functors.hpp>
#include <ccgraph/tensor/print.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

// The operators live in ccgraph::pointwise_operators, which argument-dependent lookup reaches
// through the operand_tag base of tensors, expressions and symbolic values (expr/fwd.hpp).
namespace pointwise_operators {

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

}  // namespace pointwise_operators

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
/// 1 / sqrt(x), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(rsqrt)
/// The error function of x, lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(erf)
/// -1, 0 or 1 by the sign of x, lazily (0 for NaN, as torch.sign).
CCGRAPH_DEFINE_POINTWISE_FUNCTION(sign)
/// x rounded down, lazily (integers unchanged).
CCGRAPH_DEFINE_POINTWISE_FUNCTION(floor)
/// x rounded up, lazily (integers unchanged).
CCGRAPH_DEFINE_POINTWISE_FUNCTION(ceil)
/// x rounded to the nearest whole number, ties to even (torch.round), lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(round)
/// x rounded toward zero, lazily.
CCGRAPH_DEFINE_POINTWISE_FUNCTION(trunc)
#undef CCGRAPH_DEFINE_POINTWISE_FUNCTION

namespace detail {
/// True for floating-point scalar types (float, double, bf16, f16).
template <class X>
inline constexpr bool is_floating_scalar_v =
    is_scalar_operand_v<X> && (std::is_floating_point_v<std::remove_cvref_t<X>> ||
                               std::is_same_v<std::remove_cvref_t<X>, bf16> || std::is_same_v<std::remove_cvref_t<X>, f16>);

/// True when a floating-point scalar among Xs would be converted to the integer type T: the
/// new ops refuse it, where PyTorch would promote the result to floating point.
template <class T, class... Xs>
inline constexpr bool float_scalar_for_integer_v = is_integral_element_v<T> && (is_floating_scalar_v<Xs> || ...);

/// A tensor, expression, symbolic value or scalar.
template <class X>
inline constexpr bool is_operand_or_scalar_v = is_pointwise_operand_v<X> || is_scalar_operand_v<X>;
}  // namespace detail

// Binary ops under the dtype rule of the arithmetic operators, with a static_assert naming the
// call. `fn` is a function name (cg::maximum) or an operator (operator<).
#define CCGRAPH_POINTWISE_BINARY_BODY(what, tag)                                                   \
  static_assert(is_same_dtype_v<L, R>,                                                             \
                what ": mixing dtypes: both tensor operands must have the same element type (a "  \
                "scalar of any arithmetic type is fine); convert one of them with .to<U>()");      \
  constexpr bool float_for_int =                                                                   \
      detail::float_scalar_for_integer_v<typename detail::operands_value<L, R>::type, L, R>;       \
  static_assert(!float_for_int, what ": a floating-point scalar with an integer tensor (PyTorch "  \
                                     "would promote to floating point): convert the tensor with "  \
                                     ".to<float>() or pass an integer scalar");                    \
  if constexpr (is_same_dtype_v<L, R> && !float_for_int)                                           \
    return detail::make_expr<ops::tag>(std::forward<L>(l), std::forward<R>(r));

#define CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION(fn)                                               \
  template <class L, class R>                                                                      \
    requires pointwise_operand_pair<L, R>                                                          \
  auto fn(L&& l, R&& r) {                                                                          \
    CCGRAPH_POINTWISE_BINARY_BODY("ccgraph::" #fn, fn)                                             \
  }

/// max(a, b) element by element, NaN if either is NaN (torch.maximum), lazily.
CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION(maximum)
/// min(a, b) element by element, NaN if either is NaN (torch.minimum), lazily.
CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION(minimum)
/// a == b element by element: a bool expression.
CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION(eq)
/// a != b element by element (true where either is NaN): a bool expression.
CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION(ne)
/// a < b element by element (false where either is NaN): a bool expression.
CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION(lt)
/// a <= b element by element: a bool expression.
CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION(le)
/// a > b element by element: a bool expression.
CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION(gt)
/// a >= b element by element: a bool expression.
CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION(ge)
#undef CCGRAPH_DEFINE_POINTWISE_BINARY_FUNCTION

namespace pointwise_operators {

#define CCGRAPH_DEFINE_POINTWISE_COMPARISON(sym, tag)                                              \
  template <class L, class R>                                                                      \
    requires pointwise_operand_pair<L, R>                                                          \
  auto operator sym(L&& l, R&& r) {                                                                \
    CCGRAPH_POINTWISE_BINARY_BODY("operator" #sym, tag)                                            \
  }

/// a == b, lazily: a bool expression (element by element, as torch.eq).
CCGRAPH_DEFINE_POINTWISE_COMPARISON(==, eq)
/// a != b, lazily: a bool expression.
CCGRAPH_DEFINE_POINTWISE_COMPARISON(!=, ne)
/// a < b, lazily: a bool expression.
CCGRAPH_DEFINE_POINTWISE_COMPARISON(<, lt)
/// a <= b, lazily: a bool expression.
CCGRAPH_DEFINE_POINTWISE_COMPARISON(<=, le)
/// a > b, lazily: a bool expression.
CCGRAPH_DEFINE_POINTWISE_COMPARISON(>, gt)
/// a >= b, lazily: a bool expression.
CCGRAPH_DEFINE_POINTWISE_COMPARISON(>=, ge)
#undef CCGRAPH_DEFINE_POINTWISE_COMPARISON

}  // namespace pointwise_operators

/// a to the power b, lazily (torch.pow): tensor^scalar, scalar^tensor or tensor^tensor of one
/// element type. Integer types raise exactly (wrapping on overflow); an integer tensor to a
/// negative integer scalar is an error, as in PyTorch.
template <class L, class R>
  requires pointwise_operand_pair<L, R>
auto pow(L&& l, R&& r) {
  if constexpr (scalar_operand<R> && std::is_integral_v<std::remove_cvref_t<R>> &&
                is_integral_element_v<value_type_t<L>>) {
    if constexpr (std::is_signed_v<std::remove_cvref_t<R>>)
      CCGRAPH_CHECK(r >= 0, "pow: integers to negative integer powers are not allowed (exponent ", r, ")");
  }
  CCGRAPH_POINTWISE_BINARY_BODY("ccgraph::pow", pow)
}
#undef CCGRAPH_POINTWISE_BINARY_BODY

/// cond ? a : b element by element, lazily (torch.where): `cond` a bool tensor or expression
/// (a comparison), a and b of one element type or scalars (both scalars: their common type);
/// all three broadcast together.
template <class C, class A, class B>
  requires pointwise_operand<C> && detail::is_operand_or_scalar_v<A> && detail::is_operand_or_scalar_v<B>
auto where(C&& cond, A&& a, B&& b) {
  constexpr bool bool_cond = std::is_same_v<value_type_t<C>, bool>;
  static_assert(bool_cond, "ccgraph::where: the condition must be a bool tensor or expression (a "
                           "comparison such as a > 0, or x.to<bool>())");
  static_assert(is_same_dtype_v<A, B>, "ccgraph::where: mixing dtypes: a and b must have the same element type "
                                       "(a scalar of any arithmetic type is fine); convert one with .to<U>()");
  using T = typename std::conditional_t<
      is_pointwise_operand_v<A> || is_pointwise_operand_v<B>, detail::operands_value<A, B>,
      std::common_type<std::remove_cvref_t<A>, std::remove_cvref_t<B>>>::type;
  static_assert(is_element_v<T>, "ccgraph::where: two scalars of no common element type");
  constexpr bool float_for_int = detail::float_scalar_for_integer_v<T, A, B>;
  static_assert(!float_for_int, "ccgraph::where: a floating-point scalar with an integer tensor (PyTorch would "
                                "promote to floating point): convert the tensor with .to<float>()");
  if constexpr (bool_cond && is_same_dtype_v<A, B> && is_element_v<T> && !float_for_int)
    return detail::make_expr_as<ops::where, T>(std::forward<C>(cond), std::forward<A>(a), std::forward<B>(b));
}

/// min(max(x, lo), hi) element by element, lazily (torch.clamp): bounds are scalars or tensors
/// of x's element type; NaN anywhere gives NaN, and lo > hi gives hi.
template <class X, class L, class H>
  requires pointwise_operand<X> && detail::is_operand_or_scalar_v<L> && detail::is_operand_or_scalar_v<H>
auto clamp(X&& x, L&& lo, H&& hi) {
  constexpr bool same = is_same_dtype_v<X, L> && is_same_dtype_v<X, H>;
  static_assert(same, "ccgraph::clamp: mixing dtypes: the bounds must have the tensor's element type (a scalar "
                      "of any arithmetic type is fine)");
  constexpr bool float_for_int = detail::float_scalar_for_integer_v<value_type_t<X>, L, H>;
  static_assert(!float_for_int, "ccgraph::clamp: a floating-point bound for an integer tensor (PyTorch would "
                                "promote to floating point): convert the tensor with .to<float>()");
  if constexpr (same && !float_for_int)
    return detail::make_expr_as<ops::clamp, value_type_t<X>>(std::forward<X>(x), std::forward<L>(lo),
                                                             std::forward<H>(hi));
}
/// max(x, lo), lazily (torch.clamp_min; a NaN bound gives NaN).
template <class X, class L>
  requires pointwise_operand<X> && detail::is_operand_or_scalar_v<L>
auto clamp_min(X&& x, L&& lo) {
  return maximum(std::forward<X>(x), std::forward<L>(lo));
}
/// min(x, hi), lazily (torch.clamp_max).
template <class X, class H>
  requires pointwise_operand<X> && detail::is_operand_or_scalar_v<H>
auto clamp_max(X&& x, H&& hi) {
  return minimum(std::forward<X>(x), std::forward<H>(hi));
}
/// clamp with no lower bound: clamp_max.
template <class X, class H>
  requires pointwise_operand<X> && detail::is_operand_or_scalar_v<H>
auto clamp(X&& x, std::nullopt_t, H&& hi) {
  return clamp_max(std::forward<X>(x), std::forward<H>(hi));
}
/// clamp with no upper bound: clamp_min.
template <class X, class L>
  requires pointwise_operand<X> && detail::is_operand_or_scalar_v<L>
auto clamp(X&& x, L&& lo, std::nullopt_t) {
  return clamp_min(std::forward<X>(x), std::forward<L>(lo));
}
/// clamp with neither bound is refused, as in PyTorch.
template <pointwise_operand X>
void clamp(X&&, std::nullopt_t, std::nullopt_t) {
  static_assert(sizeof(X) == 0, "ccgraph::clamp: at least one of min and max must be given");
}
/// clamp with bounds known only at run time: a missing bound is no bound (an error when both
/// are missing, as in PyTorch).
template <pointwise_operand X, scalar_operand S>
auto clamp(X&& x, std::optional<S> lo, std::optional<S> hi) {
  using T = value_type_t<X>;
  CCGRAPH_CHECK(lo || hi, "clamp: at least one of min and max must be given");
  constexpr bool float_for_int = detail::float_scalar_for_integer_v<T, S>;
  static_assert(!float_for_int, "ccgraph::clamp: a floating-point bound for an integer tensor (PyTorch would "
                                "promote to floating point): convert the tensor with .to<float>()");
  T l, h;
  if constexpr (is_integral_element_v<T>) {
    l = std::numeric_limits<T>::lowest();
    h = std::numeric_limits<T>::max();
  } else {
    l = detail::cast<T>(-std::numeric_limits<float>::infinity());
    h = detail::cast<T>(std::numeric_limits<float>::infinity());
  }
  if (lo) l = detail::cast<T>(*lo);
  if (hi) h = detail::cast<T>(*hi);
  return clamp(std::forward<X>(x), l, h);
}

/// x converted to element type U inside the expression's loop (tensor::to<U>()'s conversion).
template <element U, pointwise_operand X>
auto cast(X&& x) {
  return detail::make_expr<ops::to<U>>(std::forward<X>(x));
}

namespace detail {

template <class X>
auto dropout_expr(X&& x, double p, const generator* gen, bool training) {
  using T = value_type_t<X>;
  constexpr bool floating = is_floating(dtype_v<T>);
  static_assert(floating, "ccgraph::dropout: needs a floating-point tensor (f32, f64, bf16, f16)");
  if constexpr (floating) {
    using C = compute_t<T>;
    // PyTorch's semantics: p = 0 or eval mode keep everything at scale 1 (and draw nothing),
    // p = 1 drops everything (x * 0); else keep with probability threshold / 2^32 ~ 1 - p.
    CCGRAPH_CHECK(p >= 0 && p <= 1, "dropout: dropout probability has to be between 0 and 1, but got ", p);
    keep_dist d;
    C scale = C(1);
    if (training && p == 1) {
      d.threshold = 0;
      scale = C(0);
    } else if (training && p > 0) {
      d.threshold = std::min<std::uint64_t>(std::uint64_t{1} << 32,
                                            static_cast<std::uint64_t>(std::floor((1.0 - p) * 4294967296.0)));
      scale = static_cast<C>(1.0 / (1.0 - p));
    }
    random_leaf<keep_dist> leaf{d, x.shape(), {}, std::nullopt, next_random_id()};
    if (gen) leaf.gen = *gen;
    if constexpr (!is_traced_v<X>) {
      // Eagerly the mask is drawn now: evaluating the expression twice gives one mask.
      if (leaf.draws()) leaf.at = (gen ? *gen : default_generator()).reserve(counters_for<keep_dist>(numel_of(leaf.shape_)));
    }
    return pointwise_expr<ops::dropout, operand_node_t<T, X>, random_leaf<keep_dist>, scalar_leaf<C>>(
        to_operand<T>(std::forward<X>(x)), std::move(leaf), scalar_leaf<C>{scale});
  }
}

}  // namespace detail

/// Dropout (torch.nn.functional.dropout), lazily: each element kept with probability 1 - p and
/// scaled by 1 / (1 - p), else 0, with a mask from `gen`. Eagerly the mask is drawn when this is
/// called (evaluating the result twice gives one mask); traced, every run of the compiled graph
/// draws a new one. `training = false` (or p = 0) returns x's values and draws nothing; p = 1
/// gives x * 0.
template <pointwise_operand X>
auto dropout(X&& x, double p, const generator& gen, bool training = true) {
  return detail::dropout_expr(std::forward<X>(x), p, &gen, training);
}
/// dropout with the calling rank's default generator (traced: the default generator of the
/// thread that runs the graph).
template <pointwise_operand X>
auto dropout(X&& x, double p = 0.5, bool training = true) {
  return detail::dropout_expr(std::forward<X>(x), p, nullptr, training);
}

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
