// tests/autograd/test_grad.cpp: cg::grad and cg::value_and_grad (ccgraph/autograd/grad.hpp).
// Every op with a gradient rule is checked against central finite differences in double
// precision (eager: trace, differentiate, run); the values, accumulation over reuse, zeros for
// unused inputs, the errors of non-differentiable paths, the joint graph traced, scheduled and
// compiled, and the collectives at world sizes 1-4 (the gradient of the sum of every rank's
// loss, against finite differences over every rank's input).
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using ccgraph_test::contains;
using ccgraph_test::error_of;

namespace autograd_test {

using T = cg::tensor<double>;

/// A tensor of `shape` with values spread over [lo, hi) (deterministic, no two equal).
inline T values(cg::shape_t shape, double lo = -1.0, double hi = 1.0, int seed = 1) {
  const std::int64_t n = cg::numel_of(shape);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double u = std::fmod(0.6180339887 * double(i * 7 + seed * 13 + 3), 1.0);
    v[static_cast<std::size_t>(i)] = lo + (hi - lo) * u;
  }
  return T::from(v, shape);
}

/// x with element i moved by d (a copy).
inline T moved(const T& x, std::int64_t i, double d) {
  auto v = x.to_vector();
  v[static_cast<std::size_t>(i)] += d;
  return T::from(v, x.shape());
}

/// The one value of a one-element tensor.
template <class X>
double scalar_of(const X& x) {
  const auto v = x.to_vector();
  REQUIRE(v.size() == 1);
  return static_cast<double>(v[0]);
}

/// Checks value_and_grad(f, {W...}) against f itself and central finite differences of f for
/// each differentiated input (which must be double tensors), element by element.
template <int... W, class F, class... Xs>
void gradcheck(F f, const Xs&... xs) {
  auto vg = cg::value_and_grad(f, {W...});
  const auto got = vg(xs...);
  CHECK(scalar_of(std::get<0>(got)) == doctest::Approx(scalar_of(f(xs...))).epsilon(1e-12));
  const std::tuple<Xs...> args{xs...};
  const double h = 1e-6;
  // The gradients, in wrt order, against finite differences.
  auto check_one = [&](auto wi, const auto& grad) {
    constexpr int I = decltype(wi)::value;
    const T x = std::get<I>(args);
    REQUIRE(grad.shape() == x.shape());
    const auto gv = grad.to_vector();
    double worst = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      auto plus = args, minus = args;
      std::get<I>(plus) = moved(x, i, h);
      std::get<I>(minus) = moved(x, i, -h);
      const double fp = scalar_of(std::apply(f, plus));
      const double fm = scalar_of(std::apply(f, minus));
      const double num = (fp - fm) / (2 * h);
      const double err = std::abs(num - gv[static_cast<std::size_t>(i)]) / (1e-4 + std::abs(num));
      if (err > worst) worst = err;
      INFO("input ", I, " element ", i, ": analytic ", gv[static_cast<std::size_t>(i)], ", numeric ", num);
      CHECK(err < 1e-5);
    }
  };
  [&]<std::size_t... J>(std::index_sequence<J...>) {
    constexpr int ws[] = {W...};
    (check_one(std::integral_constant<int, ws[J]>{}, std::get<1 + J>(got)), ...);
  }(std::make_index_sequence<sizeof...(W)>{});
}

/// Runs `fn(ctx)` on `n` ranks.
template <class F>
void ranks(int n, F&& fn) {
  ccgraph_test::run(n, std::forward<F>(fn));
}

/// For a rank function `loss(rank, x)` with collectives: value_and_grad of each rank's loss, run
/// on `n` ranks, against central finite differences of the sum of every rank's loss over every
/// rank's input (each rank's input `x0(rank)`).
template <class Loss, class X0>
void dist_gradcheck(int n, Loss loss, X0 x0) {
  std::vector<T> xs;
  for (int r = 0; r < n; ++r) xs.push_back(x0(r));
  auto total = [&](const std::vector<T>& in) {
    std::vector<double> l(static_cast<std::size_t>(n));
    ranks(n, [&](cg::rank_context& ctx) {
      const int r = ctx.rank();
      l[static_cast<std::size_t>(r)] = scalar_of(loss(r, in[static_cast<std::size_t>(r)]));
    });
    double s = 0;
    for (double v : l) s += v;
    return s;
  };
  std::vector<std::vector<double>> grads(static_cast<std::size_t>(n));
  std::vector<double> vals(static_cast<std::size_t>(n));
  ranks(n, [&](cg::rank_context& ctx) {
    const int r = ctx.rank();
    auto vg = cg::value_and_grad([r, &loss](const auto& x) { return loss(r, x); });
    auto [v, g] = vg(xs[static_cast<std::size_t>(r)]);
    vals[static_cast<std::size_t>(r)] = scalar_of(v);
    grads[static_cast<std::size_t>(r)] = g.to_vector();
  });
  double sum = 0;
  for (double v : vals) sum += v;
  CHECK(sum == doctest::Approx(total(xs)).epsilon(1e-12));
  const double h = 1e-6;
  for (int s = 0; s < n; ++s) {
    const T& x = xs[static_cast<std::size_t>(s)];
    REQUIRE(grads[static_cast<std::size_t>(s)].size() == static_cast<std::size_t>(x.numel()));
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      auto plus = xs, minus = xs;
      plus[static_cast<std::size_t>(s)] = moved(x, i, h);
      minus[static_cast<std::size_t>(s)] = moved(x, i, -h);
      const double num = (total(plus) - total(minus)) / (2 * h);
      const double got = grads[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)];
      INFO("world ", n, " rank ", s, " element ", i, ": analytic ", got, ", numeric ", num);
      CHECK(std::abs(num - got) / (1e-4 + std::abs(num)) < 1e-5);
    }
  }
}

}  // namespace autograd_test

using autograd_test::gradcheck;
using autograd_test::values;

// ---- pointwise ops (fused expressions) -----------------------------------------------------

TEST_CASE("grad.pointwise.arithmetic") {
  const auto x = values({3, 4}, 0.5, 2.0, 1), y = values({3, 4}, 0.5, 2.0, 2);
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(a * b + a / b - b * 3.0 + (-a) - 2.0 / a); }, x, y);
}

TEST_CASE("grad.pointwise.unary") {
  const auto x = values({2, 5}, 0.2, 1.5, 3);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::exp(a) + cg::log(a) + cg::tanh(a) + cg::sigmoid(a)); }, x);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::sin(a) * cg::cos(a) + cg::sqrt(a) + cg::rsqrt(a)); }, x);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::erf(a) + cg::abs(a - 0.8)); }, x);
  const auto z = values({2, 5}, -1.5, 1.5, 4);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::relu(a) * 2.0 + cg::gelu(a) + cg::silu(a)); }, z);
  // gelu's and silu's rules record one fused derivative op each; those have rules too (the
  // gradient of a gradient), checked here on the ops themselves.
  const auto w = values({2, 5}, -1.0, 1.0, 5);
  gradcheck<0, 1>([](const auto& g, const auto& a) {
    return cg::sum(cg::detail::make_expr<cg::ops::gelu_backward>(g, a) * 1.5 +
                   cg::detail::make_expr<cg::ops::silu_backward>(g, a));
  }, w, z);
}

TEST_CASE("grad.pointwise.gelu_silu_record_one_derivative_node") {
  // The backward of gelu (silu) is one pointwise node, not the ten (six) of its formula: one
  // kernel over the activation, and in bf16 one rounding.
  for (const bool silu : {false, true}) {
    const auto g = cg::trace([&](const auto& a) {
      auto [l, d] = cg::value_and_grad([&](const auto& x) {
        using V = std::decay_t<decltype(x)>;
        return cg::sum(silu ? V(cg::silu(x)) : V(cg::gelu(x)));
      })(a);
      return d;
    }, cg::input<double>({4, 8}));
    int pointwise = 0;
    for (const cg::node* n : g.nodes())
      if (std::holds_alternative<cg::ops::pointwise>(n->kind())) ++pointwise;
    CAPTURE(silu);
    CHECK(pointwise == 3);  // the forward, the loss's gradient (a fill of ones), the derivative
  }
}

TEST_CASE("grad.pointwise.pow_where_clamp_extremes") {
  const auto x = values({3, 3}, 0.5, 2.0, 5), y = values({3, 3}, -1.0, 2.0, 6);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::pow(a, 3.0) + cg::pow(a, -0.5)); }, x);
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::pow(a, b)); }, x, y);
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::where(b > 0.5, a * a, b * 3.0)); }, x, y);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::clamp(a, 0.8, 1.6) * a); }, x);
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::clamp(a, b, 1.6)); }, x, y);
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::maximum(a, b) + cg::minimum(a, b) * 2.0); }, x, y);
}

TEST_CASE("grad.pointwise.broadcast") {
  // b [4] and c [3, 1] broadcast against a [3, 4]: their gradients are summed back.
  const auto a = values({3, 4}, -1, 1, 7), b = values({4}, -1, 1, 8), c = values({3, 1}, -1, 1, 9);
  gradcheck<0, 1, 2>([](const auto& x, const auto& y, const auto& z) { return cg::sum(cg::tanh(x * y + z) * z); }, a, b, c);
}

// ---- matmul, bmm, linear --------------------------------------------------------------------

TEST_CASE("grad.matmul") {
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::tanh(cg::matmul(a, b))); }, values({3, 4}),
                  values({4, 2}, -1, 1, 2));
  // batched with a broadcast 2-d operand, and 1-d operands
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::sin(cg::matmul(a, b))); }, values({2, 3, 4}),
                  values({4, 2}, -1, 1, 3));
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::sin(cg::matmul(a, b))); }, values({4}),
                  values({4, 3}, -1, 1, 4));
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::sin(cg::matmul(a, b))); }, values({2, 4}),
                  values({4}, -1, 1, 5));
  // transposed operands (x @ w.T, a.T @ b, batched): their gradients are computed in the
  // layout of the tensor they were transposed from
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::tanh(cg::matmul(a, b.transpose(0, 1)))); },
                  values({3, 4}), values({2, 4}, -1, 1, 6));
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::tanh(cg::matmul(a.transpose(0, 1), b))); },
                  values({4, 3}), values({4, 2}, -1, 1, 7));
  gradcheck<0, 1>([](const auto& a, const auto& b) {
    return cg::sum(cg::sin(cg::matmul(a.transpose(-2, -1), b.transpose(-1, -2))));
  }, values({2, 4, 3}), values({2, 5, 4}, -1, 1, 8));
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::sin(cg::matmul(a, b.transpose(0, 1)))); },
                  values({2, 3, 4}), values({5, 4}, -1, 1, 9));  // broadcast batch: the general rule
}

TEST_CASE("grad.matmul.transposed_weight_gets_a_contiguous_gradient") {
  // y = x @ w.T: w's gradient is (dyᵀ x), contiguous in w's layout, not a transposed view of
  // (xᵀ dy) that the gradient's all_reduce and the optimizer would read strided.
  const auto x = values({6, 4}), w = values({5, 4}, -1, 1, 2);
  auto f = [](const auto& a, const auto& b) { return cg::sum(cg::tanh(cg::matmul(a, b.transpose(0, 1)))); };
  const auto [l, gx, gw] = cg::value_and_grad(f, {0, 1})(x, w);
  CHECK(gw.is_contiguous());
  CHECK(gx.is_contiguous());
}

TEST_CASE("grad.bf16_follows_the_double_gradient") {
  // bf16 values take bf16 gradients (PyTorch's mixed-precision training): an MLP's loss, eager
  // and traced, against the double gradient of the same (bf16) numbers, to bf16's precision.
  using bf = cg::bf16;
  auto mlp = [](const auto& x, const auto& w1, const auto& w2) {
    const auto y = cg::matmul(cg::gelu(cg::matmul(x, w1.transpose(0, 1))), w2.transpose(0, 1));
    return cg::mean(y * y);
  };
  cg::generator gen(5);
  const auto x = cg::uniform<bf>({8, 16}, -1, 1, gen), w1 = cg::uniform<bf>({32, 16}, -0.3, 0.3, gen),
             w2 = cg::uniform<bf>({16, 32}, -0.3, 0.3, gen);
  auto as_double = [](const cg::tensor<bf>& t) {
    std::vector<double> v;
    for (const bf e : t.to_vector()) v.push_back(static_cast<float>(e));
    return cg::tensor<double>::from(v, t.shape());
  };
  const auto [ld, d1, d2] = cg::value_and_grad(mlp, {1, 2})(as_double(x), as_double(w1), as_double(w2));
  auto rel = [](const cg::tensor<bf>& a, const cg::tensor<double>& b) {  // |a - b| / |b|
    double num = 0, den = 0;
    const auto va = a.to_vector();
    const auto vb = b.to_vector();
    for (std::size_t i = 0; i < va.size(); ++i) {
      num += std::pow(static_cast<float>(va[i]) - vb[i], 2);
      den += vb[i] * vb[i];
    }
    return std::sqrt(num / den);
  };
  const auto [l, g1, g2] = cg::value_and_grad(mlp, {1, 2})(x, w1, w2);
  CHECK(static_cast<float>(l.to_vector()[0]) == doctest::Approx(ld.to_vector()[0]).epsilon(1e-2));
  CHECK(rel(g1, d1) < 2e-2);
  CHECK(rel(g2, d2) < 2e-2);
  const auto traced = cg::trace([&](const auto& a, const auto& b, const auto& c) {
    auto [tl, t1, t2] = cg::value_and_grad(mlp, {1, 2})(a, b, c);
    return std::vector<std::decay_t<decltype(a)>>{tl, t1, t2};
  }, cg::input<bf>(x.shape()), cg::input<bf>(w1.shape()), cg::input<bf>(w2.shape()));
  ccgraph_test::run(1, [&](cg::rank_context& ctx) {
    const auto r = cg::compile(traced, ctx)(x, w1, w2);
    CHECK(rel(r[1], d1) < 2e-2);
    CHECK(rel(r[2], d2) < 2e-2);
  });
  // f16 is not differentiated yet: an error naming what is
  const auto h = cg::tensor<cg::f16>::from({cg::f16(1.0f), cg::f16(2.0f)}, {2});
  CHECK(contains(error_of([&] { cg::grad([](const auto& a) { return cg::sum(a * a); })(h); }),
                 "gradients are taken in f32, f64 and bf16"));
}

TEST_CASE("grad.bmm_linear") {
  gradcheck<0, 1>([](const auto& a, const auto& b) { return cg::sum(cg::sin(cg::bmm(a, b))); }, values({2, 3, 4}),
                  values({2, 4, 2}, -1, 1, 2));
  gradcheck<0, 1, 2>([](const auto& x, const auto& w, const auto& b) { return cg::sum(cg::tanh(cg::linear(x, w, b))); },
                     values({2, 3, 4}), values({5, 4}, -1, 1, 3), values({5}, -1, 1, 4));
}

// ---- views and shape ops ----------------------------------------------------------------------

TEST_CASE("grad.views") {
  const auto x = values({2, 3, 4});
  auto w = [](const auto& v) { return cg::sin(v) * v; };  // something not linear
  gradcheck<0>([&](const auto& a) { return cg::sum(w(a.reshape({6, 4}).transpose(0, 1))); }, x);
  gradcheck<0>([&](const auto& a) { return cg::sum(w(a.narrow(2, 1, 2))) + cg::sum(w(a.select(1, 2))); }, x);
  gradcheck<0>([&](const auto& a) { return cg::sum(w(a.permute({2, 0, 1}).contiguous()) * 2.0); }, x);
  gradcheck<0>([&](const auto& a) { return cg::sum(w(a.unsqueeze(1).narrow(3, 0, 3))); }, x);
  gradcheck<0>([&](const auto& a) { return cg::sum(w(cg::squeeze(a.narrow(0, 1, 1), 0))); }, x);
}

TEST_CASE("grad.cat_stack_repeat") {
  const auto a = values({2, 3}), b = values({2, 2}, -1, 1, 2), c = values({2, 3}, -1, 1, 3);
  gradcheck<0, 1>([](const auto& x, const auto& y) { return cg::sum(cg::sin(cg::cat({x, y, x}, 1))); }, a, b);
  gradcheck<0, 1>([](const auto& x, const auto& y) { return cg::sum(cg::sin(cg::stack({x, y, x}, 1))); }, a, c);
  gradcheck<0>([](const auto& x) { return cg::sum(cg::sin(x.repeat({2, 1, 2}))); }, a);
}

// ---- reductions, softmax, norms, losses, embedding -----------------------------------------

TEST_CASE("grad.reductions") {
  const auto x = values({3, 4}, -1, 1, 11);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::sin(cg::sum(a, std::vector<std::int64_t>{1}))); }, x);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::sin(cg::sum(a, std::vector<std::int64_t>{0}, true))); }, x);
  gradcheck<0>([](const auto& a) { return cg::mean(cg::sin(cg::mean(a, std::vector<std::int64_t>{1}, true) * a)); }, x);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::sin(cg::amax(a, std::vector<std::int64_t>{1}))); }, x);
  gradcheck<0>([](const auto& a) { return cg::max(a * a) + cg::min(a); }, x);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::var(a, std::vector<std::int64_t>{1}) * 3.0); }, x);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::sin(std::get<0>(cg::max(a, 1)))); }, x);
}

TEST_CASE("grad.softmax_norms") {
  const auto x = values({3, 5}, -2, 2, 12), w = values({5}, 0.5, 1.5, 13), b = values({5}, -1, 1, 14);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::softmax(a, 1) * cg::sin(a)); }, x);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::log_softmax(a, 0) * cg::cos(a)); }, x);
  gradcheck<0, 1, 2>([](const auto& a, const auto& ww, const auto& bb) {
    return cg::sum(cg::sin(cg::layer_norm(a, ww, bb, 1e-5)));
  }, x, w, b);
  gradcheck<0>([](const auto& a) { return cg::sum(cg::sin(cg::layer_norm(a, std::vector<std::int64_t>{5}))); }, x);
  gradcheck<0, 1>([](const auto& a, const auto& ww) { return cg::sum(cg::sin(cg::rms_norm(a, ww))); }, x, w);
}

TEST_CASE("grad.scaled_dot_product_attention") {
  // q [B, H, L, E], k and v [B, H, S, E]: every combination the rule reads (causal, a scale,
  // other key length, a bool and an additive mask), through a nonlinear loss.
  const auto q = values({2, 2, 3, 4}, -1, 1, 21), k = values({2, 2, 3, 4}, -1, 1, 22), v = values({2, 2, 3, 5}, -1, 1, 23);
  const auto k5 = values({1, 2, 5, 4}, -1, 1, 24), v5 = values({1, 2, 5, 3}, -1, 1, 25), q1 = values({1, 2, 3, 4}, -1, 1, 26);
  auto loss = [](const auto& o) { return cg::sum(cg::sin(o) * o); };
  gradcheck<0, 1, 2>([&](const auto& a, const auto& b, const auto& c) { return loss(cg::scaled_dot_product_attention(a, b, c)); },
                     q, k, v);
  gradcheck<0, 1, 2>([&](const auto& a, const auto& b, const auto& c) {
    return loss(cg::scaled_dot_product_attention(a, b, c, 0.0, /*is_causal=*/true));
  }, q, k, v);
  gradcheck<0, 1, 2>([&](const auto& a, const auto& b, const auto& c) {
    return loss(cg::scaled_dot_product_attention(a, b, c, 0.0, false, 0.7));
  }, q1, k5, v5);
  const auto keep = cg::tensor<bool>::from({true, false, true, true, false, true, true, true, false, true, true, false,
                                            true, true, true},
                                           {3, 5});
  auto masked = [&](const auto& a, const auto& b, const auto& c, const auto& m) {
    return loss(cg::scaled_dot_product_attention(a, b, c, m));
  };
  gradcheck<0, 1, 2>(masked, q1, k5, v5, keep);
  const auto bias = values({3, 5}, -2, 2, 27);
  gradcheck<0, 1, 2>(masked, q1, k5, v5, bias);
  // Only q differentiated: the rule gives k and v nothing.
  gradcheck<0>([&](const auto& a, const auto& b, const auto& c) { return loss(cg::scaled_dot_product_attention(a, b, c)); },
               q, k, v);
  // A differentiated additive mask is refused by name (no kernel computes its gradient).
  const std::string e = ccgraph_test::error_of([&] {
    cg::grad(masked, 3)(q1, k5, v5, bias);
  });
  CHECK(ccgraph_test::contains(e, "scaled_dot_product_attention"));
  CHECK(ccgraph_test::contains(e, "attn_mask takes no gradient"));
}

TEST_CASE("grad.index_select") {
  // Along every dim, an index that picks a row twice and skips one, i64 and i32.
  const auto x = values({3, 4, 2}, -1, 1, 31);
  const auto i64 = cg::tensor<std::int64_t>::from({2, 0, 2}, {3});
  const auto i32 = cg::tensor<std::int32_t>::from({1, 1, 3, 0, 3}, {5});
  auto f = [](std::int64_t dim) {
    return [dim](const auto& a, const auto& i) { return cg::sum(cg::sin(cg::index_select(a, dim, i)) * 1.5); };
  };
  gradcheck<0>(f(0), x, i64);
  gradcheck<0>(f(-1), x, cg::tensor<std::int64_t>::from({1, 1}, {2}));
  gradcheck<0>(f(1), x, i32);
  gradcheck<0>(f(1), x, cg::tensor<std::int64_t>::from({3}, {}));  // a 0-d index
  gradcheck<0>(f(0), values({4}, -1, 1, 32), i64);                 // a 1-d input
}

TEST_CASE("grad.cross_entropy_embedding_gather") {
  const auto logits = values({4, 5}, -2, 2, 15);
  const auto target = cg::tensor<std::int64_t>::from({1, 0, 4, 2}, {4});
  gradcheck<0>([](const auto& x, const auto& t) { return cg::cross_entropy(x, t); }, logits, target);
  gradcheck<0>([](const auto& x, const auto& t) {
    return cg::sum(cg::cross_entropy(x, t, std::nullopt, -100, cg::loss_reduction::none, 0.1) * 2.0);
  }, logits, target);
  const auto table = values({6, 3}, -1, 1, 16);
  const auto idx = cg::tensor<std::int64_t>::from({1, 3, 1, 5, 0}, {5});
  gradcheck<1>([](const auto& i, const auto& tb) { return cg::sum(cg::sin(cg::embedding(i, tb))); }, idx, table);
  // an index converted to a float inside a fused expression
  gradcheck<1>([](const auto& i, const auto& x) { return cg::sum(cg::sin(x * i.template to<double>())); }, idx,
               values({5}, -1, 1, 18));
  const auto gi = cg::tensor<std::int64_t>::from({0, 2, 1, 2, 0, 1}, {3, 2});
  gradcheck<0>([](const auto& x, const auto& i) { return cg::sum(cg::sin(cg::gather(x, 1, i))); },
               values({3, 3}, -1, 1, 17), gi);
}

// ---- value_and_grad's contract ----------------------------------------------------------------

TEST_CASE("grad.value_and_grad.values_reuse_unused") {
  const auto x = autograd_test::T::from({1, -2, 3}, {3});
  const auto y = autograd_test::T::from({0.5, 4, -1}, {3});
  // x used three times: the gradients add up (2x + 1 + y).
  auto f = [](const auto& a, const auto& b) { return cg::sum(a * a + a + a * b); };
  auto [v, gx, gy] = cg::value_and_grad(f, {0, 1})(x, y);
  CHECK(v.to_vector() == std::vector<double>{1 - 2 + 3 + 1 + 4 + 9 + 0.5 - 8 - 3});
  CHECK(gx.to_vector() == std::vector<double>{3.5, 1, 6});
  CHECK(gy.to_vector() == std::vector<double>{1, -2, 3});
  // grad(f, i): the one gradient; an input f does not use gets zeros of its shape.
  CHECK(cg::grad(f, 1)(x, y).to_vector() == std::vector<double>{1, -2, 3});
  auto [ga, gb] = cg::grad([](const auto& a, const auto&) { return cg::sum(a * 2.0); }, {0, 1})(x, y);
  CHECK(ga.to_vector() == std::vector<double>{2, 2, 2});
  CHECK(gb.to_vector() == std::vector<double>{0, 0, 0});
  // f32 too
  const auto xf = cg::tensor<float>::from({1, 2}, {2});
  CHECK(cg::grad([](const auto& a) { return cg::sum(a * a); })(xf).to_vector() == std::vector<float>{2, 4});
}

TEST_CASE("grad.errors") {
  const auto x = values({2, 3});
  // not a scalar
  CHECK(contains(error_of([&] { cg::grad([](const auto& a) { return a * 2.0; })(x); }), "one element"));
  // a wrt index out of range
  CHECK(contains(error_of([&] { cg::grad([](const auto& a) { return cg::sum(a); }, 3)(x); }), "wrt index 3"));
  // dropout inside a fused expression: its mask is not kept
  const std::string drop = error_of([&] {
    cg::grad([](const auto& a) { return cg::sum(cg::dropout(a * 2.0, 0.5)); })(x);
  });
  CHECK(contains(drop, "dropout"));
  // an integer value stops gradients (argmax): the loss through it has a zero gradient, no error
  CHECK(cg::grad([](const auto& a) { return cg::sum(a * 0.0) + cg::sum(cg::argmax(a).template to<double>()); })(x)
            .to_vector() == std::vector<double>(6, 0.0));
}

TEST_CASE("grad.errors.not_differentiable_collective") {
  autograd_test::ranks(2, [](cg::rank_context& ctx) {
    const auto x = values({3}, -1, 1, ctx.rank() + 1);
    const std::string e = error_of([&] {
      cg::grad([&](const auto& a) { return cg::sum(cg::all_reduce(a, "max", ctx.world()) * a); })(x);
    });
    CHECK(contains(e, "all_reduce"));
    CHECK(contains(e, "max"));
    CHECK(contains(e, "not differentiable"));
  });
}

// ---- the joint graph --------------------------------------------------------------------------

TEST_CASE("grad.trace.joint_graph_schedule_compile") {
  autograd_test::ranks(2, [](cg::rank_context& ctx) {
    // A data-parallel MLP step: local loss, gradients all_reduced (avg) inside the traced step.
    auto loss = [](const auto& x, const auto& w1, const auto& w2) {
      return cg::mean(cg::tanh(cg::matmul(cg::relu(cg::matmul(x, w1)), w2)));
    };
    auto step = [&](const auto& x, const auto& w1, const auto& w2) {
      auto [l, g1, g2] = cg::value_and_grad(loss, {1, 2})(x, w1, w2);
      return std::tuple{l, cg::all_reduce(g1, "avg", ctx.world()), cg::all_reduce(g2, "avg", ctx.world())};
    };
    auto g = cg::trace(step, cg::input<double>({4, 3}), cg::input<double>({3, 5}), cg::input<double>({5, 2}));
    g.lint();
    CHECK(g.count("all_reduce") == 2);
    CHECK(g.count("matmul") == 5);  // 2 forward; 3 backward (x is not differentiated)
    const auto x = values({4, 3}, -1, 1, 20 + ctx.rank()), w1 = values({3, 5}, -1, 1, 30), w2 = values({5, 2}, -1, 1, 31);
    const auto want = cg::compile(g, ctx)(x, w1, w2);
    const auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
    s.lint();
    const auto got = cg::compile(s, ctx)(x, w1, w2);
    CHECK(std::get<0>(got).to_vector() == std::get<0>(want).to_vector());
    CHECK(std::get<1>(got).to_vector() == std::get<1>(want).to_vector());
    CHECK(std::get<2>(got).to_vector() == std::get<2>(want).to_vector());
    // equal to eager value_and_grad, then the all_reduce
    auto [l, g1, g2] = cg::value_and_grad(loss, {1, 2})(x, w1, w2);
    CHECK(std::get<0>(want).to_vector() == l.to_vector());
    const auto r1 = cg::all_reduce(g1, "avg", ctx.world());
    const auto v1 = r1.to_vector(), w = std::get<1>(want).to_vector();
    REQUIRE(v1.size() == w.size());
    for (std::size_t i = 0; i < w.size(); ++i) CHECK(v1[i] == doctest::Approx(w[i]).epsilon(1e-12));
    // compile_function takes it too
    auto cf = cg::compile_function<double, double, double>(step, ctx);
    CHECK(std::get<2>(cf(x, w1, w2)).to_vector() == std::get<2>(want).to_vector());
  });
}

TEST_CASE("grad.trace.collective_without_gradient_reads_its_wait") {
  // A collective whose result gets no gradient (it reaches the loss only through argmax) still
  // runs its backward on every rank, with zeros for the missing gradient. Those zeros must read
  // the collective's wait_tensor, not its raw output, which lint refuses (found by the random
  // joint-graph programs of test_random_graph_ops.cpp).
  autograd_test::ranks(2, [](cg::rank_context& ctx) {
    auto f = [&](const auto& x) {
      const auto y = cg::all_reduce(x, "sum", ctx.world());
      return cg::sum(x * x) + cg::sum(cg::argmax(y).template to<double>()) * 0.0;
    };
    auto g = cg::trace([&](const auto& x) { return cg::grad(f)(x); }, cg::input<double>({3}));
    CHECK_NOTHROW(g.lint());
    const auto x = values({3}, -1, 1, 7 + ctx.rank());
    const auto got = cg::compile(g, ctx)(x).to_vector();
    const auto xv = x.to_vector();
    REQUIRE(got.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) CHECK(got[i] == doctest::Approx(2 * xv[i]).epsilon(1e-12));
  });
}

// ---- collectives: the gradient of the sum of every rank's loss, world sizes 1-4 ---------------

TEST_CASE("grad.collectives.all_reduce") {
  for (int n = 1; n <= 4; ++n) {
    autograd_test::dist_gradcheck(n, [n](int r, const auto& x) {
      const auto y = cg::all_reduce(x * double(r + 1), "sum", cg::group{ccgraph_test::iota_ranks(n)});
      const auto z = cg::all_reduce(cg::sin(y), "avg", cg::group{ccgraph_test::iota_ranks(n)});
      return cg::sum(z * x * double(r + 2));
    }, [](int r) { return values({3}, -1, 1, 40 + r); });
  }
}

TEST_CASE("grad.collectives.all_gather_reduce_scatter") {
  for (int n = 1; n <= 4; ++n) {
    const cg::group g{ccgraph_test::iota_ranks(n)};
    for (int dim = 0; dim <= 1; ++dim) {
      autograd_test::dist_gradcheck(n, [g, dim](int r, const auto& x) {
        const auto y = cg::all_gather_tensor(x, dim, g);
        return cg::sum(cg::sin(y) * double(r + 1));
      }, [](int r) { return values({2, 3}, -1, 1, 50 + r); });
      autograd_test::dist_gradcheck(n, [g, dim](int r, const auto& x) {
        const auto y = cg::reduce_scatter_tensor(cg::sin(x), "sum", dim, g);
        const auto z = cg::reduce_scatter_tensor(x * 1.0, "avg", dim, g);
        return cg::sum(y * y * double(r + 1) + z);
      }, [n](int r) { return values({2 * n, n}, -1, 1, 60 + r); });
    }
  }
}

TEST_CASE("grad.collectives.all_to_all_broadcast_permute") {
  for (int n = 1; n <= 4; ++n) {
    const cg::group g{ccgraph_test::iota_ranks(n)};
    autograd_test::dist_gradcheck(n, [g, n](int r, const auto& x) {
      using V = std::decay_t<decltype(x)>;
      // even splits
      const auto y = cg::all_to_all_single(x, std::nullopt, std::nullopt, g);
      // uneven splits: rank r sends 1 + ((r + j) % 2) rows to rank j
      std::vector<std::int64_t> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) {
        in[static_cast<std::size_t>(j)] = 1 + (r + j) % 2;
        out[static_cast<std::size_t>(j)] = 1 + (j + r) % 2;
      }
      std::int64_t rows = 0;
      for (auto v : in) rows += v;
      const auto u = cg::all_to_all_single(V(cg::sin(x)).narrow(0, 0, rows), out, in, g);
      return cg::sum(cg::sin(y) * double(r + 1)) + cg::sum(u * u);
    }, [n](int r) { return values({2 * n, 2}, -1, 1, 70 + r); });
    for (int src = 0; src < n; ++src)
      autograd_test::dist_gradcheck(n, [g, src](int r, const auto& x) {
        return cg::sum(cg::sin(cg::broadcast(x * 2.0, src, g)) * double(r + 1));
      }, [](int r) { return values({3}, -1, 1, 80 + r); });
    std::vector<int> perm(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) perm[static_cast<std::size_t>(i)] = (i + 1) % n;
    autograd_test::dist_gradcheck(n, [g, perm](int r, const auto& x) {
      return cg::sum(cg::sin(cg::permute_tensor(x, perm, g)) * double(r + 1) * x);
    }, [](int r) { return values({2, 2}, -1, 1, 90 + r); });
  }
}

TEST_CASE("grad.collectives.reduce") {
  // The root gets the reduction, every other member its own input back (as c10d's reduce), so
  // a non-root's input reaches the loss twice: through the root's output and its own.
  for (int n = 1; n <= 4; ++n) {
    const cg::group g{ccgraph_test::iota_ranks(n)};
    for (int dst = 0; dst < n; ++dst)
      for (const char* op : {"sum", "avg", "premul_sum(0.5)"})
        autograd_test::dist_gradcheck(n, [g, dst, op](int r, const auto& x) {
          const auto y = cg::reduce(x * 2.0, dst, op, g);
          return cg::sum(cg::sin(y) * double(r + 1) * x);
        }, [](int r) { return values({3}, -1, 1, 110 + r); });
  }
  autograd_test::ranks(2, [](cg::rank_context& ctx) {
    const auto x = values({3}, -1, 1, ctx.rank() + 1);
    const std::string e = error_of([&] {
      cg::grad([&](const auto& a) { return cg::sum(cg::reduce(a, 0, "max", ctx.world()) * a); })(x);
    });
    CHECK(contains(e, "reduce"));
    CHECK(contains(e, "max"));
    CHECK(contains(e, "not differentiable"));
  });
}

TEST_CASE("grad.collectives.coalesced") {
  for (int n = 1; n <= 3; ++n) {
    const cg::group g{ccgraph_test::iota_ranks(n)};
    autograd_test::dist_gradcheck(n, [g, n](int r, const auto& x) {
      using V = std::decay_t<decltype(x)>;
      const auto ys = cg::all_reduce_coalesced(std::vector<V>{x * 1.0, cg::sin(x)}, "sum", g);
      const auto zs = cg::all_gather_into_tensor_coalesced(std::vector<V>{x * 2.0}, g);
      const auto ws = cg::reduce_scatter_tensor_coalesced(std::vector<V>{V(x.repeat({n}) * 1.0)}, "sum", {0}, g);
      return cg::sum(ys[0] * ys[1] * double(r + 1)) + cg::sum(cg::sin(zs[0])) + cg::sum(ws[0] * ws[0]);
    }, [](int r) { return values({2}, -1, 1, 100 + r); });
  }
}

TEST_CASE("grad.errors.user_op") {
  // A user op has no gradient rule: differentiating through it is an error naming it.
  cg::user_op_def d;
  d.name = "autograd_test::twice";
  d.infer = [](const std::vector<cg::tensor_meta>& in, const std::vector<double>&) {
    return std::vector<cg::tensor_meta>{in.at(0)};
  };
  d.cpu = [](const cg::user_op_call& c) {
    const auto v = std::get<cg::tensor<double>>(c.inputs[0]).to_vector();
    double* o = std::get<cg::tensor<double>>(c.outputs[0]).data();
    for (std::size_t i = 0; i < v.size(); ++i) o[i] = 2 * v[i];
  };
  d.cost = [](const cg::cost_args&, const std::vector<double>&) { return cg::op_cost::none(); };
  static const cg::user_op twice = cg::register_op(d);
  const auto x = values({3});
  const std::string e = error_of([&] { cg::grad([](const auto& a) { return cg::sum(twice(a)); })(x); });
  CHECK(contains(e, "autograd_test::twice"));
  CHECK(contains(e, "no gradient rule"));
}
