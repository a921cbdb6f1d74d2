// ccgraph/expr/functors.hpp: the pointwise ops, one tag each. A tag is the single definition of
// its op: the name the printer, tracer and op_sequence show, its arity, its type rule (which
// element types its operands may have and what its result is), and the scalar math that the
// CPU loop and the CUDA kernels both run.
#pragma once

#include <cmath>
#include <string_view>
#include <type_traits>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/tensor/strided.hpp>

namespace ccgraph::detail {

/// True when every type of the pack is the first one.
template <class T, class... Ts>
inline constexpr bool all_same_v = (std::is_same_v<T, Ts> && ...);

/// The element type T of an op whose operands arrive as types A...: every operand is a T, or a
/// scalar already in compute_t<T> (expr.hpp's scalar_leaf), so T is the one 16-bit float among
/// them if there is one, else the first type. (An op whose operands are all such scalars,
/// where(c, 0.5, 1.0) of bf16, yields compute_t<T>: the kernel trees round each node's result
/// to the node's own type.)
template <class... A>
struct storage_of;
template <class A>
struct storage_of<A> {
  using type = A;
};
template <class A, class B, class... As>
struct storage_of<A, B, As...> {
  using type = std::conditional_t<std::is_same_v<compute_t<A>, A>, typename storage_of<B, As...>::type, A>;
};

/// Common part of most pointwise tags: `apply` converts the operands to compute_t<T> (float for
/// bf16/f16), runs `Op::compute` there and rounds the result back to T once, as one eager
/// PyTorch op does. So a fused chain gives bit-for-bit the results of running its ops one by one.
/// A scalar operand arrives in compute_t<T> already, unrounded (PyTorch's opmath scalars).
/// The type rule: every operand has one element type T, and so has the result.
template <class Op, int Arity, bool FloatingOnly = false>
struct pointwise_tag {
  /// Number of operands.
  static constexpr int arity = Arity;
  /// True for ops that only make sense on floating-point tensors (gelu, sin, exp, ...).
  static constexpr bool floating_only = FloatingOnly;
  /// True when operands of these element types are valid (here: all the same type).
  template <class... Ts>
  static constexpr bool accepts = sizeof...(Ts) == Arity && all_same_v<Ts...>;
  /// The result's element type for operands of these types.
  template <class T, class... Ts>
  using result = T;

  /// The op on one element of each operand (of type T, or a scalar in compute_t<T>).
  template <class... A>
    requires(sizeof...(A) == Arity)
  CCGRAPH_HOST_DEVICE static typename storage_of<A...>::type apply(A... x) {
    using T = typename storage_of<A...>::type;
    using C = compute_t<T>;
    return cast<T>(Op::compute(static_cast<C>(x)...));
  }
};

/// Common part of the comparisons: two operands of one element type, compared in compute_t<T>
/// (IEEE: every comparison with NaN is false but !=); the result is bool. A scalar operand
/// (which arrives in compute_t<T>) is rounded to T first, as PyTorch compares bf16 with 0.1.
template <class Op>
struct compare_tag {
  static constexpr int arity = 2;
  static constexpr bool floating_only = false;
  template <class... Ts>
  static constexpr bool accepts = sizeof...(Ts) == 2 && all_same_v<Ts...>;
  template <class T, class... Ts>
  using result = bool;
  template <class A, class B>
  CCGRAPH_HOST_DEVICE static bool apply(A x, B y) {
    using T = typename storage_of<A, B>::type;
    using C = compute_t<T>;
    return Op::compute(static_cast<C>(cast<T>(x)), static_cast<C>(cast<T>(y)));
  }
};

/// "to_f32", "to_bf16", ...: the name of the cast to element type d.
constexpr std::string_view cast_op_name(dtype d) {
  switch (d) {
    case dtype::f32: return "to_f32";
    case dtype::f64: return "to_f64";
    case dtype::i32: return "to_i32";
    case dtype::i64: return "to_i64";
    case dtype::u8: return "to_u8";
    case dtype::boolean: return "to_bool";
    case dtype::bf16: return "to_bf16";
    case dtype::f16: return "to_f16";
    case dtype::c64: return "to_c64";
    case dtype::c128: return "to_c128";
  }
  return "to";
}

/// a * b rounded on its own. nvcc contracts a product and a following sum into one fma
/// (--fmad=true) once the ops of a fused kernel are inlined together; the _rn intrinsics are
/// never contracted, so a fused chain keeps the roundings of the ops run one by one (and of the
/// CPU, which contracts nothing unless built for FMA with -ffp-contract=fast).
template <class C>
CCGRAPH_HOST_DEVICE C mul_rounded(C a, C b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>)
    return __fmul_rn(a, b);
  else if constexpr (std::is_same_v<C, double>)
    return __dmul_rn(a, b);
  else
    return static_cast<C>(a * b);
#else
  return static_cast<C>(a * b);
#endif
}

/// where's type rule: (bool, T, T).
template <class... Ts>
struct where_types : std::false_type {};
template <class C, class A, class B>
struct where_types<C, A, B> : std::bool_constant<std::is_same_v<C, bool> && std::is_same_v<A, B>> {};

/// dropout's type rule: (T, bool, compute_t<T>).
template <class... Ts>
struct dropout_types : std::false_type {};
template <class X, class K, class S>
struct dropout_types<X, K, S> : std::bool_constant<std::is_same_v<K, bool> && std::is_same_v<S, compute_t<X>>> {};

/// Integer power as PyTorch computes it (powi): repeated squaring, wrapping like two's
/// complement on overflow; a negative exponent gives 1 for base 1, +-1 for base -1, else 0.
template <class C>
CCGRAPH_HOST_DEVICE C int_pow(C a, C b) {
  if constexpr (std::is_same_v<C, bool>) {
    return b ? a : true;
  } else {
    if constexpr (std::is_signed_v<C>) {
      if (b < 0) {
        if (a == 1) return 1;
        if (a == -1) return (b % 2) != 0 ? C(-1) : C(1);
        return 0;
      }
    }
    using U = std::make_unsigned_t<C>;
    U result = 1, base = static_cast<U>(a);
    for (U e = static_cast<U>(b); e != 0; e /= 2) {
      if (e & 1u) result = static_cast<U>(result * base);
      base = static_cast<U>(base * base);
    }
    return static_cast<C>(result);
  }
}

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
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a, C b) { return ::ccgraph::detail::mul_rounded(a, b); }
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
/// gelu's derivative applied to a gradient: g (Φ(a) + a φ(a)) computed in compute_t<T> and
/// rounded once, as PyTorch's GeluBackward kernel. gelu's gradient rule records this one op
/// rather than the ten its formula has: one kernel, and one rounding in bf16 instead of ten.
struct gelu_backward : ::ccgraph::detail::pointwise_tag<gelu_backward, 2, true> {
  static constexpr std::string_view name = "gelu_backward";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C g, C a) {
    const C cdf = C(0.5) * (C(1) + std::erf(a * C(0.70710678118654752440)));
    const C pdf = C(0.39894228040143267794) * std::exp(C(-0.5) * a * a);
    return g * (cdf + a * pdf);
  }
};
/// silu's derivative applied to a gradient: g s (1 + a (1 - s)), s = sigmoid(a), in
/// compute_t<T> and rounded once (PyTorch's SiluBackward); silu's gradient rule records it.
struct silu_backward : ::ccgraph::detail::pointwise_tag<silu_backward, 2, true> {
  static constexpr std::string_view name = "silu_backward";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C g, C a) {
    const C s = C(1) / (C(1) + std::exp(-a));
    return g * s * (C(1) + a * (C(1) - s));
  }
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

/// 1 / sqrt(a) (two roundings in the compute type, as torch.rsqrt on the CPU).
struct rsqrt : ::ccgraph::detail::pointwise_tag<rsqrt, 1, true> {
  static constexpr std::string_view name = "rsqrt";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return C(1) / std::sqrt(a); }
};
/// The error function.
struct erf : ::ccgraph::detail::pointwise_tag<erf, 1, true> {
  static constexpr std::string_view name = "erf";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) { return std::erf(a); }
};
/// (a > 0) - (a < 0), as torch.sign computes it: -1, 0 or 1, and 0 for NaN and for -0.
struct sign : ::ccgraph::detail::pointwise_tag<sign, 1> {
  static constexpr std::string_view name = "sign";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) {
    if constexpr (std::is_same_v<C, bool> || std::is_unsigned_v<C>)
      return a > C(0) ? C(1) : C(0);
    else
      return a > C(0) ? C(1) : a < C(0) ? C(-1) : C(0);
  }
};
/// Largest whole number <= a (integers: a).
struct floor : ::ccgraph::detail::pointwise_tag<floor, 1> {
  static constexpr std::string_view name = "floor";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) {
    if constexpr (std::is_floating_point_v<C>) return std::floor(a);
    else return a;
  }
};
/// Smallest whole number >= a (integers: a).
struct ceil : ::ccgraph::detail::pointwise_tag<ceil, 1> {
  static constexpr std::string_view name = "ceil";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) {
    if constexpr (std::is_floating_point_v<C>) return std::ceil(a);
    else return a;
  }
};
/// Nearest whole number, ties to even (torch.round; integers: a).
struct round : ::ccgraph::detail::pointwise_tag<round, 1> {
  static constexpr std::string_view name = "round";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) {
    if constexpr (std::is_floating_point_v<C>) return std::nearbyint(a);
    else return a;
  }
};
/// a rounded toward zero (integers: a).
struct trunc : ::ccgraph::detail::pointwise_tag<trunc, 1> {
  static constexpr std::string_view name = "trunc";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a) {
    if constexpr (std::is_floating_point_v<C>) return std::trunc(a);
    else return a;
  }
};
/// The larger of a and b; NaN if either is NaN (torch.maximum).
struct maximum : ::ccgraph::detail::pointwise_tag<maximum, 2> {
  static constexpr std::string_view name = "maximum";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a, C b) {
    if constexpr (std::is_floating_point_v<C>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a < b ? b : a;
  }
};
/// The smaller of a and b; NaN if either is NaN (torch.minimum).
struct minimum : ::ccgraph::detail::pointwise_tag<minimum, 2> {
  static constexpr std::string_view name = "minimum";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a, C b) {
    if constexpr (std::is_floating_point_v<C>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return b < a ? b : a;
  }
};
/// a to the power b: std::pow for floating types, but an exponent of 0.5 or -0.5 is sqrt(a) or
/// 1 / sqrt(a), as torch.pow special-cases them (so pow(-0, 0.5) = -0, pow(-inf, 0.5) = NaN);
/// for integers PyTorch's integer power (exact, wrapping; a negative exponent gives 0 but for
/// bases 1 and -1).
struct pow : ::ccgraph::detail::pointwise_tag<pow, 2> {
  static constexpr std::string_view name = "pow";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a, C b) {
    if constexpr (std::is_floating_point_v<C>) {
      if (b == C(0.5)) return std::sqrt(a);
      if (b == C(-0.5)) return C(1) / std::sqrt(a);
      return std::pow(a, b);
    } else {
      return ::ccgraph::detail::int_pow(a, b);
    }
  }
};
/// min(max(a, lo), hi) (torch.clamp): NaN in any operand gives NaN; lo > hi gives hi.
struct clamp : ::ccgraph::detail::pointwise_tag<clamp, 3> {
  static constexpr std::string_view name = "clamp";
  template <class C> CCGRAPH_HOST_DEVICE static C compute(C a, C lo, C hi) {
    return minimum::compute(maximum::compute(a, lo), hi);  // each keeps a NaN of its first operand
  }
};

/// a == b (bool result).
struct eq : ::ccgraph::detail::compare_tag<eq> {
  static constexpr std::string_view name = "eq";
  template <class C> CCGRAPH_HOST_DEVICE static bool compute(C a, C b) { return a == b; }
};
/// a != b (bool result; true when either is NaN).
struct ne : ::ccgraph::detail::compare_tag<ne> {
  static constexpr std::string_view name = "ne";
  template <class C> CCGRAPH_HOST_DEVICE static bool compute(C a, C b) { return a != b; }
};
/// a < b (bool result).
struct lt : ::ccgraph::detail::compare_tag<lt> {
  static constexpr std::string_view name = "lt";
  template <class C> CCGRAPH_HOST_DEVICE static bool compute(C a, C b) { return a < b; }
};
/// a <= b (bool result).
struct le : ::ccgraph::detail::compare_tag<le> {
  static constexpr std::string_view name = "le";
  template <class C> CCGRAPH_HOST_DEVICE static bool compute(C a, C b) { return a <= b; }
};
/// a > b (bool result).
struct gt : ::ccgraph::detail::compare_tag<gt> {
  static constexpr std::string_view name = "gt";
  template <class C> CCGRAPH_HOST_DEVICE static bool compute(C a, C b) { return a > b; }
};
/// a >= b (bool result).
struct ge : ::ccgraph::detail::compare_tag<ge> {
  static constexpr std::string_view name = "ge";
  template <class C> CCGRAPH_HOST_DEVICE static bool compute(C a, C b) { return a >= b; }
};

/// cond ? a : b (torch.where): a bool condition and two operands of one element type.
struct where {
  static constexpr std::string_view name = "where";
  static constexpr int arity = 3;
  static constexpr bool floating_only = false;
  template <class... Ts>
  static constexpr bool accepts = ::ccgraph::detail::where_types<Ts...>::value;
  template <class C, class A, class... B>
  using result = A;
  /// (a scalar operand arrives in compute_t<T> and is rounded to T when chosen)
  template <class A, class B>
  CCGRAPH_HOST_DEVICE static typename ::ccgraph::detail::storage_of<A, B>::type apply(bool c, A a, B b) {
    using T = typename ::ccgraph::detail::storage_of<A, B>::type;
    return c ? ::ccgraph::detail::cast<T>(a) : ::ccgraph::detail::cast<T>(b);
  }
};

/// The conversion of a to element type U, as tensor::to<U>() converts (halves through float,
/// bool as "not zero"). Any element type converts.
template <class U>
struct to {
  static constexpr std::string_view name = ::ccgraph::detail::cast_op_name(dtype_v<U>);
  static constexpr int arity = 1;
  static constexpr bool floating_only = false;
  template <class... Ts>
  static constexpr bool accepts = sizeof...(Ts) == 1;
  template <class... Ts>
  using result = U;
  template <class T>
  CCGRAPH_HOST_DEVICE static U apply(T a) { return ::ccgraph::detail::cast<U>(a); }
};

/// x * (keep ? scale : 0) in compute_t<T>, rounded once (dropout: the mask from the generator,
/// scale = 1 / (1 - p); a dropped inf or NaN gives NaN, as PyTorch's x * mask does).
struct dropout {
  static constexpr std::string_view name = "dropout";
  static constexpr int arity = 3;
  static constexpr bool floating_only = true;
  template <class... Ts>
  static constexpr bool accepts = ::ccgraph::detail::dropout_types<Ts...>::value;
  template <class X, class... Ts>
  using result = X;
  template <class T>
  CCGRAPH_HOST_DEVICE static T apply(T x, bool keep, compute_t<T> scale) {
    using C = compute_t<T>;
    return ::ccgraph::detail::cast<T>(::ccgraph::detail::mul_rounded(static_cast<C>(x), keep ? scale : C(0)));
  }
};

}  // namespace ccgraph::ops

namespace ccgraph {

namespace detail {
template <bool Accepted, class Op, class T, class... Ts>
struct op_result {
  using type = T;
};
template <class Op, class T, class... Ts>
struct op_result<true, Op, T, Ts...> {
  using type = typename Op::template result<T, Ts...>;
};
}  // namespace detail

/// True for pointwise op tags: a `name`, an `arity` of 1 to 3, `floating_only`, and the type
/// rule (`accepts`, `result`) with the `apply` it guards.
template <class Op>
inline constexpr bool is_pointwise_op_v =
    requires {
      { Op::name } -> std::convertible_to<std::string_view>;
      { Op::arity } -> std::convertible_to<int>;
      { Op::floating_only } -> std::convertible_to<bool>;
    } && (Op::arity >= 1 && Op::arity <= 3);

/// The element type of Op's result on operands of element types Ts (the first operand's type
/// when Op does not accept them: the caller's static_assert names the problem).
template <class Op, class... Ts>
using op_result_t = typename detail::op_result<Op::template accepts<Ts...>, Op, Ts...>::type;

/// A pointwise op tag (see ccgraph::ops).
template <class Op>
concept pointwise_op = is_pointwise_op_v<Op>;

}  // namespace ccgraph

// ---------------------------------------------------------------------------------------------
// The derivative of each pointwise op (cg::grad differentiates a fused pointwise node through
// these, autograd/pointwise_grad.hpp). `pointwise_gradient<Op>::backward(d)` reads the operands
// `d.arg(i)`, the result `d.out()` and the result's gradient `d.g()`, and gives operand i's
// gradient with `d.grad(i, value)`. Values combine with + - * / (and doubles) and
// `d.template call<ops::X>(...)`, so a rule is written once in terms of the ops themselves and
// records graph nodes. Ops without a specialisation are not differentiable (comparisons give
// bool results, which carry no gradient; dropout's mask is not kept).
// ---------------------------------------------------------------------------------------------
namespace ccgraph {

/// The derivative of pointwise op Op (see above); not defined for ops without one.
template <class Op>
struct pointwise_gradient;

template <>
struct pointwise_gradient<ops::add> {
  template <class D>
  static void backward(D& d) {
    d.grad(0, d.g());
    d.grad(1, d.g());
  }
};
template <>
struct pointwise_gradient<ops::sub> {
  template <class D>
  static void backward(D& d) {
    d.grad(0, d.g());
    d.grad(1, -d.g());
  }
};
template <>
struct pointwise_gradient<ops::mul> {
  template <class D>
  static void backward(D& d) {
    d.grad(0, d.g() * d.arg(1));
    d.grad(1, d.g() * d.arg(0));
  }
};
template <>
struct pointwise_gradient<ops::div> {
  template <class D>
  static void backward(D& d) {
    d.grad(0, d.g() / d.arg(1));
    d.grad(1, -d.g() * d.out() / d.arg(1));  // -g a / b^2
  }
};
template <>
struct pointwise_gradient<ops::neg> {
  template <class D>
  static void backward(D& d) { d.grad(0, -d.g()); }
};
template <>
struct pointwise_gradient<ops::abs> {
  template <class D>
  static void backward(D& d) { d.grad(0, d.g() * d.template call<ops::sign>(d.arg(0))); }
};
template <>
struct pointwise_gradient<ops::relu> {
  template <class D>
  static void backward(D& d) { d.grad(0, d.where(d.template call<ops::gt>(d.arg(0), 0.0), d.g(), 0.0)); }
};
template <>
struct pointwise_gradient<ops::gelu> {
  // d/da a Φ(a) = Φ(a) + a φ(a), fused into one op
  template <class D>
  static void backward(D& d) { d.grad(0, d.template call<ops::gelu_backward>(d.g(), d.arg(0))); }
};
template <>
struct pointwise_gradient<ops::silu> {
  // s (1 + a (1 - s)), s = sigmoid(a), fused into one op
  template <class D>
  static void backward(D& d) { d.grad(0, d.template call<ops::silu_backward>(d.g(), d.arg(0))); }
};
template <>
struct pointwise_gradient<ops::gelu_backward> {
  // f = g gelu'(a): df/dg = gelu'(a), df/da = g φ(a) (2 - a²) (double backward)
  template <class D>
  static void backward(D& d) {
    const auto a = d.arg(1);
    d.grad(0, d.template call<ops::gelu_backward>(d.g(), a));
    d.grad(1, d.g() * d.arg(0) * (0.39894228040143267794 * d.template call<ops::exp>(-0.5 * a * a)) * (2.0 - a * a));
  }
};
template <>
struct pointwise_gradient<ops::silu_backward> {
  // f = g silu'(a): df/dg = silu'(a), df/da = g s (1 - s) (2 + a (1 - 2 s)), s = sigmoid(a)
  template <class D>
  static void backward(D& d) {
    const auto a = d.arg(1);
    const auto s = d.template call<ops::sigmoid>(a);
    d.grad(0, d.template call<ops::silu_backward>(d.g(), a));
    d.grad(1, d.g() * d.arg(0) * s * (1.0 - s) * (2.0 + a * (1.0 - 2.0 * s)));
  }
};
template <>
struct pointwise_gradient<ops::sigmoid> {
  template <class D>
  static void backward(D& d) { d.grad(0, d.g() * d.out() * (1.0 - d.out())); }
};
template <>
struct pointwise_gradient<ops::sin> {
  template <class D>
  static void backward(D& d) { d.grad(0, d.g() * d.template call<ops::cos>(d.arg(0))); }
};
template <>
struct pointwise_gradient<ops::cos> {
  template <class D>
  static void backward(D& d) { d.grad(0, -d.g() * d.template call<ops::sin>(d.arg(0))); }
};
template <>
struct pointwise_gradient<ops::exp> {
  template <class D>
  static void backward(D& d) { d.grad(0, d.g() * d.out()); }
};
template <>
struct pointwise_gradient<ops::log> {
  template <class D>
  static void backward(D& d) { d.grad(0, d.g() / d.arg(0)); }
};
template <>
struct pointwise_gradient<ops::tanh> {
  template <class D>
  static void backward(D& d) { d.grad(0, d.g() * (1.0 - d.out() * d.out())); }
};
template <>
struct pointwise_gradient<ops::sqrt> {
  template <class D>
  static void backward(D& d) { d.grad(0, d.g() * 0.5 / d.out()); }
};
template <>
struct pointwise_gradient<ops::rsqrt> {
  template <class D>
  static void backward(D& d) { d.grad(0, d.g() * -0.5 * d.out() * d.out() * d.out()); }
};
template <>
struct pointwise_gradient<ops::erf> {
  template <class D>
  static void backward(D& d) {
    d.grad(0, d.g() * 1.12837916709551257390 * d.template call<ops::exp>(-(d.arg(0) * d.arg(0))));
  }
};
/// Piecewise constant ops: a zero gradient almost everywhere (as PyTorch gives).
template <class Op>
struct pointwise_gradient_zero {
  template <class D>
  static void backward(D& d) { d.grad(0, d.g() * 0.0); }
};
template <>
struct pointwise_gradient<ops::sign> : pointwise_gradient_zero<ops::sign> {};
template <>
struct pointwise_gradient<ops::floor> : pointwise_gradient_zero<ops::floor> {};
template <>
struct pointwise_gradient<ops::ceil> : pointwise_gradient_zero<ops::ceil> {};
template <>
struct pointwise_gradient<ops::round> : pointwise_gradient_zero<ops::round> {};
template <>
struct pointwise_gradient<ops::trunc> : pointwise_gradient_zero<ops::trunc> {};
/// maximum / minimum: the gradient goes to the operand chosen, half each on a tie (PyTorch).
template <class Cmp>
struct pointwise_gradient_extreme {
  template <class D>
  static void backward(D& d) {
    const auto a = d.arg(0), b = d.arg(1), g = d.g();
    const auto tie = d.template call<ops::eq>(a, b);
    d.grad(0, d.where(tie, g * 0.5, d.where(d.template call<Cmp>(a, b), g, 0.0)));
    d.grad(1, d.where(tie, g * 0.5, d.where(d.template call<Cmp>(b, a), g, 0.0)));
  }
};
template <>
struct pointwise_gradient<ops::maximum> : pointwise_gradient_extreme<ops::gt> {};
template <>
struct pointwise_gradient<ops::minimum> : pointwise_gradient_extreme<ops::lt> {};
template <>
struct pointwise_gradient<ops::pow> {
  // d/da a^b = b a^(b-1); d/db a^b = a^b log a (0 where a == 0, as PyTorch masks it)
  template <class D>
  static void backward(D& d) {
    const auto a = d.arg(0), b = d.arg(1);
    d.grad(0, d.g() * b * d.template call<ops::pow>(a, b - 1.0));
    if (d.needs(1))
      d.grad(1, d.where(d.template call<ops::eq>(a, 0.0), 0.0, d.g() * d.out() * d.template call<ops::log>(a)));
  }
};
template <>
struct pointwise_gradient<ops::clamp> {
  // To a inside [lo, hi], to lo below it, to hi above it.
  template <class D>
  static void backward(D& d) {
    const auto a = d.arg(0), lo = d.arg(1), hi = d.arg(2), g = d.g();
    const auto below = d.template call<ops::lt>(a, lo), above = d.template call<ops::gt>(a, hi);
    d.grad(0, d.where(below, 0.0, d.where(above, 0.0, g)));
    if (d.needs(1)) d.grad(1, d.where(below, g, 0.0));
    if (d.needs(2)) d.grad(2, d.where(below, 0.0, d.where(above, g, 0.0)));
  }
};
template <>
struct pointwise_gradient<ops::where> {
  template <class D>
  static void backward(D& d) {
    d.grad(1, d.where(d.arg(0), d.g(), 0.0));
    d.grad(2, d.where(d.arg(0), 0.0, d.g()));
  }
};

}  // namespace ccgraph
