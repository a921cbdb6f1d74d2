// ccgraph/autograd/pointwise_grad.hpp: the gradient of a fused pointwise node. The node keeps its
// expression as text ("mul(relu(%0), 2.)"); its backward reads that text back into a tree,
// recomputes the intermediate values it needs from the node's inputs (cheap pointwise ops,
// recomputed rather than saved) and applies each op's derivative, pointwise_gradient<Op>
// (expr/functors.hpp), from the result back to the inputs.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/expr/functors.hpp>
#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/trace/ops.hpp>
#include <ccgraph/trace/symbolic.hpp>

namespace ccgraph::detail {

/// A tensor of `x`'s shape and type holding `v` everywhere (a pointwise node over x that reads
/// no value of it, so an inf or NaN in x does not leak in).
template <class U>
symbolic<U> filled_like(const symbolic<U>& x, double v) {
  return symbolic<U>(where(x != x, static_cast<U>(v), static_cast<U>(v)));
}

/// `v` broadcast to the shape of `like` (a copy node: the gradient of a broadcast's sum).
template <class U>
symbolic<U> expand_like(const symbolic<U>& like, const symbolic<U>& v) {
  if (v.shape() == like.shape()) return v;
  return copy(like, v);
}

/// `g` summed down to `shape` (the gradient of broadcasting a value of `shape` to g's shape):
/// leading dims summed away, dims of size 1 summed with keepdim.
template <class U>
symbolic<U> sum_to_shape(const symbolic<U>& g, const shape_t& shape) {
  if (g.shape() == shape) return g;
  const std::size_t lead = g.shape().size() - shape.size();
  std::vector<std::int64_t> dims;
  for (std::size_t d = 0; d < g.shape().size(); ++d)
    if (d < lead || (shape[d - lead] == 1 && g.shape()[d] != 1)) dims.push_back(static_cast<std::int64_t>(d));
  symbolic<U> s = dims.empty() ? g : sum(g, dims, true);
  return s.shape() == shape ? s : s.reshape(shape);
}

/// A pointwise node's expression read back from its text: an op over sub-trees, an input of
/// the node (%k), a scalar, or a random operand (a dropout mask).
struct pw_tree {
  enum class kind : std::uint8_t { op, input, scalar, random };
  kind k = kind::op;
  std::string name;  // op
  std::vector<pw_tree> args;
  int input = -1;     // input
  double scalar = 0;  // scalar
};

/// Parses a pointwise node's expression text (what record_expr wrote); `what` names the node.
inline pw_tree parse_pointwise_expr(std::string_view text, std::string_view what) {
  std::size_t i = 0;
  auto fail = [&](const char* why) {
    CCGRAPH_THROW(error, "grad: cannot read the expression of pointwise node ", what, " (\"", text, "\"): ", why,
                  " at offset ", i);
  };
  auto skip = [&] {
    while (i < text.size() && text[i] == ' ') ++i;
  };
  auto parse = [&](auto& self) -> pw_tree {
    skip();
    pw_tree t;
    if (i >= text.size()) fail("unexpected end");
    if (text[i] == '%') {
      ++i;
      const std::size_t start = i;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
      if (start == i) fail("an input without a number");
      t.k = pw_tree::kind::input;
      t.input = std::stoi(std::string(text.substr(start, i - start)));
      return t;
    }
    const std::size_t start = i;
    while (i < text.size() && text[i] != '(' && text[i] != ',' && text[i] != ')' && text[i] != ' ') ++i;
    const std::string word(text.substr(start, i - start));
    if (word.empty()) fail("an empty operand");
    if (i < text.size() && text[i] == '(') {
      ++i;
      if (word == "bernoulli" || word == "random") {
        while (i < text.size() && text[i] != ')') ++i;
        if (i >= text.size()) fail("an unclosed random operand");
        ++i;
        t.k = pw_tree::kind::random;
        t.name = word;
        return t;
      }
      t.k = pw_tree::kind::op;
      t.name = word;
      for (;;) {
        t.args.push_back(self(self));
        skip();
        if (i < text.size() && text[i] == ',') {
          ++i;
          continue;
        }
        if (i < text.size() && text[i] == ')') {
          ++i;
          break;
        }
        fail("expected ',' or ')'");
      }
      return t;
    }
    char* end = nullptr;
    const double v = std::strtod(word.c_str(), &end);
    if (end != word.c_str() + word.size()) fail("an operand that is neither an input, an op nor a number");
    t.k = pw_tree::kind::scalar;
    t.scalar = v;
    return t;
  };
  pw_tree root = parse(parse);
  skip();
  if (i != text.size()) fail("trailing text");
  return root;
}

/// A value met while differentiating a pointwise expression of element type T: a traced T
/// tensor, a traced bool tensor (a comparison) or a scalar. Arithmetic on these records nodes.
template <class T>
class pw_val {
 public:
  pw_val(double v) : s_(v) {}  // NOLINT: scalars mix in freely, as in expressions
  pw_val(symbolic<T> x) : t_(std::move(x)) {}  // NOLINT
  pw_val(symbolic<bool> x) : b_(std::move(x)) {}  // NOLINT

  bool is_scalar() const { return !t_ && !b_; }
  bool is_tensor() const { return t_.has_value(); }
  const symbolic<T>& tensor() const { return *t_; }
  /// Calls f with the value: a symbolic<T>, a symbolic<bool> or a scalar in compute_t<T> (the
  /// type expressions keep their scalars in: not rounded to bf16).
  template <class F>
  pw_val visit(F&& f) const {
    if (t_) return f(*t_);
    if (b_) return f(*b_);
    return f(static_cast<compute_t<T>>(s_));
  }

 private:
  std::optional<symbolic<T>> t_;
  std::optional<symbolic<bool>> b_;
  double s_ = 0;
};

/// The element type operand X has in a derivative of element type T: a scalar counts as a T.
template <class T, class X>
struct pw_elem {
  using type = T;  // a scalar
};
template <class T, class U>
struct pw_elem<T, symbolic<U>> {
  using type = U;
};

/// Op over operands (traced values or scalars), materialised as a node; an op that does not
/// take these operand types is an error naming it.
template <class Op, class T, class... X>
pw_val<T> pw_make(const X&... x) {
  constexpr bool traced = (is_symbolic_v<X> || ...);
  // Bool values are conditions: only where reads them (and casts); arithmetic on them is not
  // instantiated.
  constexpr bool takes_bool = std::is_same_v<Op, ops::where> || std::is_same_v<Op, ops::to<T>>;
  constexpr bool has_bool = (std::is_same_v<typename pw_elem<T, X>::type, bool> || ...);
  if constexpr (!traced) {
    // Scalars only (a derivative's constant, as b - 1 for pow's scalar exponent): computed here.
    if constexpr (Op::template accepts<typename pw_elem<T, X>::type...>) {
      using R = typename Op::template result<typename pw_elem<T, X>::type...>;
      if constexpr (std::is_same_v<R, T>) return pw_val<T>(static_cast<double>(Op::apply(x...)));
    }
  } else if constexpr ((takes_bool || !has_bool) && Op::template accepts<typename pw_elem<T, X>::type...>) {
    using R = typename decltype(make_expr_as<Op, T>(x...))::value_type;
    if constexpr (std::is_same_v<R, T> || std::is_same_v<R, bool>) {
      return pw_val<T>(symbolic<R>(make_expr_as<Op, T>(x...)));
    }
  }
  CCGRAPH_THROW(error, "grad: the derivative of a pointwise expression needs ", Op::name, " on operands of types (",
                ((std::string(to_string(dtype_v<typename pw_elem<T, X>::type>)) + " ") + ...),
                "), which it does not take");
}

/// Op(a, ...) on pointwise values.
template <class Op, class T>
pw_val<T> pw_call(const pw_val<T>& a) {
  return a.visit([](const auto& x) { return pw_make<Op, T>(x); });
}
template <class Op, class T>
pw_val<T> pw_call(const pw_val<T>& a, const pw_val<T>& b) {
  return a.visit([&](const auto& x) { return b.visit([&](const auto& y) { return pw_make<Op, T>(x, y); }); });
}
template <class Op, class T>
pw_val<T> pw_call(const pw_val<T>& a, const pw_val<T>& b, const pw_val<T>& c) {
  return a.visit([&](const auto& x) {
    return b.visit([&](const auto& y) { return c.visit([&](const auto& z) { return pw_make<Op, T>(x, y, z); }); });
  });
}

template <class T>
pw_val<T> operator+(const pw_val<T>& a, const pw_val<T>& b) { return pw_call<ops::add>(a, b); }
template <class T>
pw_val<T> operator-(const pw_val<T>& a, const pw_val<T>& b) { return pw_call<ops::sub>(a, b); }
template <class T>
pw_val<T> operator*(const pw_val<T>& a, const pw_val<T>& b) { return pw_call<ops::mul>(a, b); }
template <class T>
pw_val<T> operator/(const pw_val<T>& a, const pw_val<T>& b) { return pw_call<ops::div>(a, b); }
template <class T>
pw_val<T> operator-(const pw_val<T>& a) { return pw_call<ops::neg>(a); }
template <class T>
pw_val<T> operator+(const pw_val<T>& a, double b) { return a + pw_val<T>(b); }
template <class T>
pw_val<T> operator+(double a, const pw_val<T>& b) { return pw_val<T>(a) + b; }
template <class T>
pw_val<T> operator-(const pw_val<T>& a, double b) { return a - pw_val<T>(b); }
template <class T>
pw_val<T> operator-(double a, const pw_val<T>& b) { return pw_val<T>(a) - b; }
template <class T>
pw_val<T> operator*(const pw_val<T>& a, double b) { return a * pw_val<T>(b); }
template <class T>
pw_val<T> operator*(double a, const pw_val<T>& b) { return pw_val<T>(a) * b; }
template <class T>
pw_val<T> operator/(const pw_val<T>& a, double b) { return a / pw_val<T>(b); }
template <class T>
pw_val<T> operator/(double a, const pw_val<T>& b) { return pw_val<T>(a) / b; }

/// What pointwise_gradient<Op>::backward sees of one op of the expression (see functors.hpp).
template <class T>
class pw_grad_ctx {
 public:
  pw_grad_ctx(std::vector<pw_val<T>> args, pw_val<T> out, pw_val<T> g, std::vector<char> needs)
      : args_(std::move(args)), out_(std::move(out)), g_(std::move(g)), needs_(std::move(needs)) {}
  /// Operand i's value.
  const pw_val<T>& arg(std::size_t i) const { return args_.at(i); }
  /// The op's result.
  const pw_val<T>& out() const { return out_; }
  /// The gradient of the result.
  const pw_val<T>& g() const { return g_; }
  /// True when operand i needs a gradient.
  bool needs(std::size_t i) const { return needs_.at(i) != 0; }
  /// Gives operand i its gradient (ignored for an operand that needs none).
  void grad(std::size_t i, const pw_val<T>& v) {
    if (needs(i)) grads_.at(i).emplace(v);
  }
  /// Op(xs...) on values.
  template <class Op, class... V>
  pw_val<T> call(const V&... xs) const {
    return pw_call<Op, T>(pw_val<T>(xs)...);
  }
  /// where(c, a, b) on values.
  pw_val<T> where(const pw_val<T>& c, const pw_val<T>& a, const pw_val<T>& b) const {
    return pw_call<ops::where, T>(c, a, b);
  }
  std::vector<std::optional<pw_val<T>>> grads_ = std::vector<std::optional<pw_val<T>>>(3);

 private:
  std::vector<pw_val<T>> args_;
  pw_val<T> out_;
  pw_val<T> g_;
  std::vector<char> needs_;
};

/// Calls f.template operator()<Op>() for the pointwise op named `name` (casts to T or bool
/// included); false when no op has that name.
template <class T, class F>
bool with_pointwise_op(std::string_view name, F&& f) {
  using tags = std::tuple<ops::add, ops::sub, ops::mul, ops::div, ops::neg, ops::abs, ops::relu, ops::gelu, ops::silu,
                          ops::sigmoid, ops::sin, ops::cos, ops::exp, ops::log, ops::tanh, ops::sqrt, ops::rsqrt,
                          ops::erf, ops::sign, ops::floor, ops::ceil, ops::round, ops::trunc, ops::maximum,
                          ops::minimum, ops::pow, ops::clamp, ops::eq, ops::ne, ops::lt, ops::le, ops::gt, ops::ge,
                          ops::where, ops::to<T>, ops::to<bool>, ops::dropout, ops::gelu_backward,
                          ops::silu_backward>;
  bool found = false;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((!found && std::tuple_element_t<I, tags>::name == name
          ? (found = true, f.template operator()<std::tuple_element_t<I, tags>>(), 0)
          : 0),
     ...);
  }(std::make_index_sequence<std::tuple_size_v<tags>>{});
  return found;
}

/// The backward of one fused pointwise node (op_traits<ops::pointwise>::gradient).
template <class C>
void pointwise_backward(const ops::pointwise& o, C& c) {
  using T = typename C::value_type;
  const node& n = c.current();
  const std::string what = "%" + n.name() + " (" + o.expr + ")";
  const pw_tree root = parse_pointwise_expr(o.expr, what);

  // Does a sub-tree read an input that needs a gradient?
  auto needs = [&](auto& self, const pw_tree& t) -> bool {
    if (t.k == pw_tree::kind::input) return c.needs_grad(static_cast<std::size_t>(t.input));
    for (const auto& a : t.args)
      if (self(self, a)) return true;
    return false;
  };
  // The value of a sub-tree, recomputed from the node's inputs (the root is the node's output).
  auto value = [&](auto& self, const pw_tree& t) -> pw_val<T> {
    switch (t.k) {
      case pw_tree::kind::scalar: return pw_val<T>(t.scalar);
      case pw_tree::kind::random:
        CCGRAPH_THROW(error, "grad: pointwise node ", what, " draws random numbers (", t.name,
                      "): the gradient of dropout needs its mask, which is not kept yet");
      case pw_tree::kind::input: {
        const dtype d = n.args().at(static_cast<std::size_t>(t.input)).src->dtype(n.args()[static_cast<std::size_t>(t.input)].index);
        if (d == dtype_v<T>) return pw_val<T>(c.template input<T>(static_cast<std::size_t>(t.input)));
        if (d == dtype::boolean) return pw_val<T>(c.template input<bool>(static_cast<std::size_t>(t.input)));
        CCGRAPH_THROW(error, "grad: pointwise node ", what, " mixes ", dtype_v<T>, " with an input of ", d,
                      "; its gradient takes one floating type (and bool conditions)");
      }
      case pw_tree::kind::op: break;
    }
    // A cast to T of an input of another element type (an index as a float): the cast itself.
    if (t.name == cast_op_name(dtype_v<T>) && t.args.size() == 1 && t.args[0].k == pw_tree::kind::input) {
      const auto k = static_cast<std::size_t>(t.args[0].input);
      const dtype d = n.args().at(k).src->dtype(n.args()[k].index);
      if (d != dtype_v<T> && d != dtype::boolean)
        return visit_dtype(d, [&](auto tag) -> pw_val<T> {
          using U = decltype(tag);
          return pw_val<T>(c.template input<U>(k).template to<T>());
        });
    }
    std::vector<pw_val<T>> args;
    for (const auto& a : t.args) args.push_back(self(self, a));
    std::optional<pw_val<T>> r;
    const bool known = with_pointwise_op<T>(t.name, [&]<class Op>() {
      if constexpr (std::is_same_v<Op, ops::dropout>) {
        CCGRAPH_THROW(error, "grad: pointwise node ", what, " holds dropout, whose gradient needs its mask, "
                      "which is not kept yet");
      } else {
        CCGRAPH_CHECK(args.size() == static_cast<std::size_t>(Op::arity), "grad: ", t.name, " in ", what, " has ",
                      args.size(), " operands");
        if constexpr (Op::arity == 1) r = pw_call<Op, T>(args[0]);
        else if constexpr (Op::arity == 2) r = pw_call<Op, T>(args[0], args[1]);
        else r = pw_call<Op, T>(args[0], args[1], args[2]);
      }
    });
    CCGRAPH_CHECK(known, "grad: pointwise node ", what, ": unknown op ", t.name);
    return *r;
  };
  auto shape_of = [](const pw_val<T>& v) { return v.tensor().shape(); };

  // Back from the result: each op's derivative gives its operands' gradients.
  auto back = [&](auto& self, const pw_tree& t, const pw_val<T>& val, const symbolic<T>& g) -> void {
    if (t.k == pw_tree::kind::input) {
      const std::size_t i = static_cast<std::size_t>(t.input);
      c.add_grad(i, sum_to_shape(g, c.template input<T>(i).shape()));
      return;
    }
    if (t.k != pw_tree::kind::op) return;
    std::vector<pw_val<T>> args;
    std::vector<char> need;
    for (const auto& a : t.args) {
      args.push_back(value(value, a));
      need.push_back(needs(needs, a) && args.back().is_tensor() ? 1 : 0);
    }
    pw_grad_ctx<T> d(args, val, pw_val<T>(g), need);
    const bool known = with_pointwise_op<T>(t.name, [&]<class Op>() {
      if constexpr (requires { pointwise_gradient<Op>::template backward<pw_grad_ctx<T>>; }) {
        if constexpr (std::is_same_v<Op, ops::to<T>>) {
          d.grad(0, d.g());
        } else {
          pointwise_gradient<Op>::backward(d);
        }
      } else if constexpr (std::is_same_v<Op, ops::to<T>>) {
        d.grad(0, d.g());  // a cast from T to T, or from bool (needs no gradient)
      } else {
        CCGRAPH_THROW(error, "grad: ", Op::name, " in pointwise node ", what,
                      " is not differentiable, and a differentiated input reaches the result through it");
      }
    });
    CCGRAPH_CHECK(known, "grad: pointwise node ", what, ": unknown op ", t.name);
    for (std::size_t i = 0; i < t.args.size(); ++i) {
      if (!need[i]) continue;
      CCGRAPH_CHECK(d.grads_[i].has_value(), "grad: the derivative of ", t.name, " in ", what,
                    " gave no gradient for operand ", i);
      const pw_val<T>& gi = *d.grads_[i];
      CCGRAPH_CHECK(gi.is_tensor(), "grad: the derivative of ", t.name, " in ", what, " gave operand ", i,
                    " a gradient that is not a tensor");
      self(self, t.args[i], args[i], sum_to_shape(gi.tensor(), shape_of(args[i])));
    }
  };
  back(back, root, pw_val<T>(c.template output<T>(0)), c.template grad<T>(0));
}

}  // namespace ccgraph::detail
