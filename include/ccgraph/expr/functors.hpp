// ccgraph/expr/functors.hpp: the pointwise ops, one tag each. A tag is the single definition of
// its op: the name the printer, tracer and op_sequence show, its arity, and the scalar math that
// the CPU loop and the CUDA kernels both run.
#pragma once

#include <cmath>
#include <string_view>
#include <type_traits>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/tensor/strided.hpp>

namespace ccgraph::detail {

/// Common part of every pointwise tag: `apply` converts the operands to compute_t<T> (float for
/// bf16/f16), runs `Op::compute` there and rounds the result back to T once, as one eager
/// PyTorch op does. So a fused chain gives bit-for-bit the results of running its ops one by one.
template <class Op, int Arity, bool FloatingOnly = false>
struct pointwise_tag {
  /// Number of operands.
  static constexpr int arity = Arity;
  /// True for ops that only make sense on floating-point tensors (gelu, sin, exp, ...).
  static constexpr bool floating_only = FloatingOnly;

  /// The op on one element of type T.
  template <class T>
    requires(Arity == 1)
  CCGRAPH_HOST_DEVICE static T apply(T x) {
    using C = compute_t<T>;
    return cast<T>(Op::compute(static_cast<C>(x)));
  }
  /// The op on one element of each operand, of type T.
  template <class T>
    requires(Arity == 2)
  CCGRAPH_HOST_DEVICE static T apply(T x, T y) {
    using C = compute_t<T>;
    return cast<T>(Op::compute(static_cast<C>(x), static_cast<C>(y)));
  }
};

}  // namespace ccgraph::detail

/// The pointwise op tags. `ccgraph::relu(x)` builds an expression node whose op is `ops::relu`;
/// `count_ops_v<E, ops::relu>` counts them.
namespace ccgraph::ops {

// Integer results wrap like C++ (and PyTorch) unsigned/two's-complement arithmetic; the explicit
// casts keep bool/u8 arithmetic (promoted to int by C++) in the compute type.

/// a + b
struct add : ::ccgraph::detail::pointwise_tag<add, 2> {
  static constexpr std::string_view name = "add";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a, C b) { return static_cast<C>(a + b); }
};
/// a - b
struct sub : ::ccgraph::detail::pointwise_tag<sub, 2> {
  static constexpr std::string_view name = "sub";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a, C b) { return static_cast<C>(a - b); }
};
/// a * b
struct mul : ::ccgraph::detail::pointwise_tag<mul, 2> {
  static constexpr std::string_view name = "mul";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a, C b) { return static_cast<C>(a * b); }
};
/// a / b. Integer division truncates toward zero (PyTorch's rounding_mode="trunc"); an integer
/// division by zero is undefined, as in C++.
struct div : ::ccgraph::detail::pointwise_tag<div, 2> {
  static constexpr std::string_view name = "div";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a, C b) { return static_cast<C>(a / b); }
};
/// -a (wraps for unsigned types).
struct neg : ::ccgraph::detail::pointwise_tag<neg, 1> {
  static constexpr std::string_view name = "neg";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return static_cast<C>(-a); }
};
/// |a|
struct abs : ::ccgraph::detail::pointwise_tag<abs, 1> {
  static constexpr std::string_view name = "abs";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) {
    if constexpr (std::is_floating_point_v<C>)
      return std::fabs(a);  // clears the sign of -0 and keeps NaN, like torch.abs
    else if constexpr (std::is_unsigned_v<C>)
      return a;
    else
      return a < C(0) ? static_cast<C>(-a) : a;
  }
};
/// max(a, 0); NaN stays NaN, as in torch.relu.
struct relu : ::ccgraph::detail::pointwise_tag<relu, 1> {
  static constexpr std::string_view name = "relu";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) {
    if constexpr (std::is_unsigned_v<C>)
      return a;
    else
      return a < C(0) ? C(0) : a;
  }
};
/// a * Φ(a), the exact erf form (torch.nn.functional.gelu's default approximate="none").
struct gelu : ::ccgraph::detail::pointwise_tag<gelu, 1, true> {
  static constexpr std::string_view name = "gelu";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) {
    return C(0.5) * a * (C(1) + std::erf(a * C(0.70710678118654752440)));
  }
};
/// a * sigmoid(a) (also called swish).
struct silu : ::ccgraph::detail::pointwise_tag<silu, 1, true> {
  static constexpr std::string_view name = "silu";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return a / (C(1) + std::exp(-a)); }
};
/// 1 / (1 + exp(-a))
struct sigmoid : ::ccgraph::detail::pointwise_tag<sigmoid, 1, true> {
  static constexpr std::string_view name = "sigmoid";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return C(1) / (C(1) + std::exp(-a)); }
};
/// sin(a)
struct sin : ::ccgraph::detail::pointwise_tag<sin, 1, true> {
  static constexpr std::string_view name = "sin";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return std::sin(a); }
};
/// cos(a)
struct cos : ::ccgraph::detail::pointwise_tag<cos, 1, true> {
  static constexpr std::string_view name = "cos";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return std::cos(a); }
};
/// e^a
struct exp : ::ccgraph::detail::pointwise_tag<exp, 1, true> {
  static constexpr std::string_view name = "exp";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return std::exp(a); }
};
/// Natural logarithm.
struct log : ::ccgraph::detail::pointwise_tag<log, 1, true> {
  static constexpr std::string_view name = "log";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return std::log(a); }
};
/// tanh(a)
struct tanh : ::ccgraph::detail::pointwise_tag<tanh, 1, true> {
  static constexpr std::string_view name = "tanh";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return std::tanh(a); }
};
/// Square root (NaN for negative a).
struct sqrt : ::ccgraph::detail::pointwise_tag<sqrt, 1, true> {
  static constexpr std::string_view name = "sqrt";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return std::sqrt(a); }
};

}  // namespace ccgraph::ops

namespace ccgraph {

/// True for pointwise op tags: a `name`, an `arity` of 1 or 2 and an `apply`.
template <class Op>
inline constexpr bool is_pointwise_op_v =
    requires {
      { Op::name } -> std::convertible_to<std::string_view>;
      { Op::arity } -> std::convertible_to<int>;
      { Op::floating_only } -> std::convertible_to<bool>;
    } && (Op::arity == 1 || Op::arity == 2);

/// A pointwise op tag (see ccgraph::ops).
template <class Op>
concept pointwise_op = is_pointwise_op_v<Op>;

}  // namespace ccgraph
