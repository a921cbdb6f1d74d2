// tests/ops/test_attention.cpp: scaled_dot_product_attention's shape function and CPU kernels
// (ccgraph/ops/attention.hpp) against a softmax written here in double precision, the
// backward against both the analytic gradient (computed here) and finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <ccgraph/ops/attention.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace attention_test {

using i64 = std::int64_t;
using cg::detail::sdpa_options;

/// A [B, H, L, S] mask broadcast value: +0 or -inf for bool, the value for additive.
struct mask_view {
  std::vector<double> add;  // [B*H*L*S], 0 without a mask
};

/// Reads `t` (any rank up to 4, broadcast to [B, H, L, S]) into additive doubles.
template <class M>
mask_view expand_mask(const std::optional<cg::tensor<M>>& mask, i64 B, i64 H, i64 L, i64 S) {
  mask_view mv{std::vector<double>(static_cast<std::size_t>(B * H * L * S), 0.0)};
  if (!mask) return mv;
  const cg::shape_t target{B, H, L, S};
  const auto st = cg::tensor<M>::detail_broadcast_strides(*mask, target);
  const M* p = mask->data();
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h)
      for (i64 i = 0; i < L; ++i)
        for (i64 j = 0; j < S; ++j) {
          const M m = p[b * st[0] + h * st[1] + i * st[2] + j * st[3]];
          double v;
          if constexpr (std::is_same_v<M, bool>)
            v = m ? 0.0 : -std::numeric_limits<double>::infinity();
          else
            v = to_d(m);
          mv.add[static_cast<std::size_t>(((b * H + h) * L + i) * S + j)] = v;
        }
  return mv;
}

/// The reference forward in double: probabilities P [B,H,L,S], out [B,H,L,Ev], lse [B,H,L].
struct reference {
  std::vector<double> p, out, lse;
};

template <class T>
double at4(const cg::tensor<T>& t, i64 a, i64 b, i64 c, i64 d) {
  return to_d(t.at({a, b, c, d}));
}

template <class T>
reference forward_ref(const cg::tensor<T>& q, const cg::tensor<T>& k, const cg::tensor<T>& v, const mask_view& mv,
                      bool causal, double scale) {
  const i64 B = q.shape()[0], H = q.shape()[1], L = q.shape()[2], E = q.shape()[3], S = k.shape()[2],
            Ev = v.shape()[3];
  const double ninf = -std::numeric_limits<double>::infinity();
  reference r{std::vector<double>(static_cast<std::size_t>(B * H * L * S)),
              std::vector<double>(static_cast<std::size_t>(B * H * L * Ev)),
              std::vector<double>(static_cast<std::size_t>(B * H * L))};
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h)
      for (i64 i = 0; i < L; ++i) {
        std::vector<double> s(static_cast<std::size_t>(S));
        double m = ninf;
        for (i64 j = 0; j < S; ++j) {
          double x = 0;
          for (i64 e = 0; e < E; ++e) x += at4(q, b, h, i, e) * at4(k, b, h, j, e);
          x = x * scale + mv.add[static_cast<std::size_t>(((b * H + h) * L + i) * S + j)];
          if (causal && j > i) x = ninf;
          s[static_cast<std::size_t>(j)] = x;
          m = std::max(m, x);
        }
        double sum = 0;
        for (auto& x : s) sum += (x = m == ninf ? 0.0 : std::exp(x - m));
        const std::size_t row = static_cast<std::size_t>((b * H + h) * L + i);
        r.lse[row] = m == ninf ? ninf : m + std::log(sum);
        for (i64 j = 0; j < S; ++j) r.p[row * S + j] = m == ninf ? 0.0 : s[static_cast<std::size_t>(j)] / sum;
        for (i64 d = 0; d < Ev; ++d) {
          double acc = 0;
          for (i64 j = 0; j < S; ++j) acc += r.p[row * S + j] * at4(v, b, h, j, d);
          r.out[row * Ev + d] = acc;
        }
      }
  return r;
}

template <class T>
double tol() {
  if constexpr (std::is_same_v<T, cg::bf16>) return 2e-2;
  if constexpr (std::is_same_v<T, cg::f16>) return 3e-3;
  if constexpr (std::is_same_v<T, float>) return 2e-5;
  return 1e-11;
}

/// Runs sdpa_cpu on [B, H, L, E] inputs (read as given: views allowed) and checks out and lse.
template <class T, class M = bool>
void check_forward(const cg::tensor<T>& q, const cg::tensor<T>& k, const cg::tensor<T>& v,
                   const std::optional<cg::tensor<std::type_identity_t<M>>>& mask, sdpa_options opt) {
  const i64 B = q.shape()[0], H = q.shape()[1], L = q.shape()[2], S = k.shape()[2], Ev = v.shape()[3];
  const auto sizes = cg::detail::sdpa_check(cg::detail::meta_of(q), cg::detail::meta_of(k), cg::detail::meta_of(v),
                                            cg::detail::meta_of(mask), opt);
  auto out = cg::tensor<T>::empty({B, H, L, Ev});
  auto lse = cg::tensor<cg::detail::sdpa_lse_t<T>>::empty({B, H, L});
  cg::detail::sdpa_cpu<T, M>(q, k, v, mask, opt, out, lse);
  const auto ref = forward_ref(q, k, v, expand_mask(mask, B, H, L, S), opt.is_causal, sizes.scale);
  const auto ov = out.to_vector();
  const auto lv = lse.to_vector();
  for (std::size_t i = 0; i < ov.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(to_d(ov[i]) - ref.out[i]) <= tol<T>() * (1 + std::abs(ref.out[i])));
  }
  for (std::size_t i = 0; i < lv.size(); ++i) {
    CAPTURE(i);
    if (std::isinf(ref.lse[i]))
      CHECK(lv[i] == -std::numeric_limits<cg::detail::sdpa_lse_t<T>>::infinity());
    else
      CHECK(std::abs(static_cast<double>(lv[i]) - ref.lse[i]) <= tol<T>() * (1 + std::abs(ref.lse[i])));
  }
}

}  // namespace attention_test

// The test cases live in the namespace too: in a unity batch, a using-directive would reach
// the next file and make helpers of the same name (tol, ...) ambiguous.
namespace attention_test {

TEST_CASE("sdpa.shape_and_errors") {
  using cg::detail::sdpa_shape;
  const cg::tensor_meta q{cg::dtype::f32, {2, 4, 8, 16}}, k{cg::dtype::f32, {2, 4, 10, 16}},
      v{cg::dtype::f32, {2, 4, 10, 12}};
  CHECK(sdpa_shape(q, k, v, std::nullopt, {}) == cg::shape_t{2, 4, 8, 12});
  CHECK(cg::detail::sdpa_lse_shape(q, k, v, std::nullopt, {}) == cg::shape_t{2, 4, 8});
  CHECK(cg::detail::sdpa_check(q, k, v, std::nullopt, {}).scale == doctest::Approx(0.25));
  CHECK(cg::detail::sdpa_check(q, k, v, std::nullopt, {false, 0.5, 0.0}).scale == 0.5);
  CHECK(sdpa_shape({cg::dtype::f32, {8, 16}}, {cg::dtype::f32, {3, 16}}, {cg::dtype::f32, {3, 5}}, std::nullopt, {}) ==
        cg::shape_t{8, 5});
  CHECK(sdpa_shape(q, k, v, cg::tensor_meta{cg::dtype::boolean, {8, 10}}, {}) == cg::shape_t{2, 4, 8, 12});
  CHECK(sdpa_shape(q, k, v, cg::tensor_meta{cg::dtype::f32, {2, 1, 1, 10}}, {}) == cg::shape_t{2, 4, 8, 12});
  const std::string w = "scaled_dot_product_attention: ";
  CHECK(contains(error_of([&] { (void)sdpa_shape(q, k, v, std::nullopt, {false, std::nullopt, 0.1}); }),
                 w + "dropout_p 0.1 is not supported yet (only 0)"));
  CHECK(contains(error_of([&] { (void)sdpa_shape({cg::dtype::i32, {2, 3}}, {cg::dtype::i32, {2, 3}}, {cg::dtype::i32, {2, 3}}, std::nullopt, {}); }),
                 w + "query of dtype i32; expected f32, f64, bf16 or f16"));
  CHECK(contains(error_of([&] { (void)sdpa_shape(q, {cg::dtype::bf16, {2, 4, 10, 16}}, v, std::nullopt, {}); }),
                 w + "expected query, key and value of the same dtype, got query f32, key bf16 and value f32"));
  CHECK(contains(error_of([&] { (void)sdpa_shape({cg::dtype::f32, {16}}, k, v, std::nullopt, {}); }),
                 w + "query [16], key [2, 4, 10, 16] and value [2, 4, 10, 12] need at least 2 dims ([..., L, E])"));
  CHECK(contains(error_of([&] { (void)sdpa_shape(q, {cg::dtype::f32, {2, 3, 10, 16}}, v, std::nullopt, {}); }),
                 w + "query [2, 4, 8, 16], key [2, 3, 10, 16] and value [2, 4, 10, 12] must have the same batch dims"));
  CHECK(contains(error_of([&] { (void)sdpa_shape(q, {cg::dtype::f32, {2, 4, 10, 8}}, v, std::nullopt, {}); }),
                 w + "query [2, 4, 8, 16] and key [2, 4, 10, 8] must have the same embedding dim (dim -1): 16 != 8"));
  CHECK(contains(error_of([&] { (void)sdpa_shape(q, k, {cg::dtype::f32, {2, 4, 9, 12}}, std::nullopt, {}); }),
                 w + "key [2, 4, 10, 16] and value [2, 4, 9, 12] must have the same sequence length (dim -2): 10 != 9"));
  CHECK(contains(error_of([&] { (void)sdpa_shape(q, k, v, cg::tensor_meta{cg::dtype::boolean, {8, 10}}, {true, std::nullopt, 0.0}); }),
                 w + "explicit attn_mask should not be set when is_causal=True"));
  CHECK(contains(error_of([&] { (void)sdpa_shape(q, k, v, cg::tensor_meta{cg::dtype::f64, {8, 10}}, {}); }),
                 w + "attn_mask of dtype f64 must be bool or the query's dtype f32"));
  CHECK(contains(error_of([&] { (void)sdpa_shape(q, k, v, cg::tensor_meta{cg::dtype::boolean, {8, 9}}, {}); }),
                 w + "attn_mask of shape [8, 9] cannot be broadcast to the attention weights' shape [2, 4, 8, 10]"));
  CHECK(contains(error_of([&] { (void)sdpa_shape(q, k, v, cg::tensor_meta{cg::dtype::boolean, {1, 2, 4, 8, 10}}, {}); }),
                 w + "attn_mask of shape [1, 2, 4, 8, 10] cannot be broadcast"));
}

template <class T>
void forward_cases() {
  auto q = cg::uniform<T>({2, 3, 5, 8}, -1, 1, 1);
  auto k = cg::uniform<T>({2, 3, 7, 8}, -1, 1, 2);
  auto v = cg::uniform<T>({2, 3, 7, 6}, -1, 1, 3);
  SUBCASE("plain") { check_forward<T>(q, k, v, std::nullopt, {}); }
  SUBCASE("scale") { check_forward<T>(q, k, v, std::nullopt, {false, 1.7, 0.0}); }
  SUBCASE("causal.L_less_than_S") { check_forward<T>(q, k, v, std::nullopt, {true, std::nullopt, 0.0}); }
  SUBCASE("causal.L_greater_than_S") {
    auto q2 = cg::uniform<T>({2, 3, 9, 8}, -1, 1, 4);
    check_forward<T>(q2, k, v, std::nullopt, {true, std::nullopt, 0.0});
  }
  SUBCASE("bool_mask.broadcast") {
    auto m = cg::uniform<bool>({5, 7}, -1, 1, 5);
    check_forward<T, bool>(q, k, v, m, {});
    auto m2 = cg::uniform<bool>({2, 1, 5, 7}, -1, 1, 6);
    check_forward<T, bool>(q, k, v, m2, {});
  }
  SUBCASE("additive_mask") {
    auto m = cg::uniform<T>({3, 1, 7}, -2, 2, 7);
    check_forward<T, T>(q, k, v, m, {});
  }
  SUBCASE("strided_inputs") {
    // [B, L, H, E] storage read as [B, H, L, E] (how attention heads are laid out in practice).
    auto qs = cg::uniform<T>({2, 5, 3, 8}, -1, 1, 8).transpose(1, 2);
    auto ks = cg::uniform<T>({2, 7, 3, 8}, -1, 1, 9).transpose(1, 2);
    auto vs = cg::uniform<T>({2, 7, 3, 12}, -1, 1, 10).transpose(1, 2).narrow(3, 2, 6);
    check_forward<T>(qs, ks, vs, std::nullopt, {true, std::nullopt, 0.0});
  }
}

TEST_CASE("sdpa.cpu.f32") { forward_cases<float>(); }
TEST_CASE("sdpa.cpu.f64") { forward_cases<double>(); }
TEST_CASE("sdpa.cpu.bf16") { forward_cases<cg::bf16>(); }
TEST_CASE("sdpa.cpu.f16") { forward_cases<cg::f16>(); }

TEST_CASE("sdpa.cpu.fully_masked_rows_give_zero") {
  auto q = cg::uniform<float>({1, 1, 3, 4}, -1, 1, 1);
  auto k = cg::uniform<float>({1, 1, 2, 4}, -1, 1, 2);
  auto v = cg::uniform<float>({1, 1, 2, 4}, -1, 1, 3);
  // Row 1 masked everywhere (bool), as PyTorch's _safe_softmax: zeros, not NaN.
  auto m = cg::tensor<bool>::from({true, false, false, false, true, true}, {3, 2});
  auto out = cg::tensor<float>::empty({1, 1, 3, 4});
  auto lse = cg::tensor<float>::empty({1, 1, 3});
  cg::detail::sdpa_cpu<float, bool>(q, k, v, m, {}, out, lse);
  for (i64 d = 0; d < 4; ++d) CHECK(out.at({0, 0, 1, d}) == 0.f);
  CHECK(lse.at({0, 0, 1}) == -std::numeric_limits<float>::infinity());
  CHECK(out.at({0, 0, 0, 0}) == doctest::Approx(v.at({0, 0, 0, 0})));  // one key: its value
  // An additive -inf mask does the same; a NaN in q propagates.
  auto minf = cg::full<float>({3, 2}, 0.f);
  minf.at({2, 0}) = minf.at({2, 1}) = -std::numeric_limits<float>::infinity();
  cg::detail::sdpa_cpu<float, float>(q, k, v, minf, {}, out, lse);
  CHECK(out.at({0, 0, 2, 3}) == 0.f);
  q.at({0, 0, 0, 1}) = std::numeric_limits<float>::quiet_NaN();
  cg::detail::sdpa_cpu<float>(q, k, v, std::nullopt, {}, out);
  CHECK(std::isnan(out.at({0, 0, 0, 0})));
  CHECK(!std::isnan(out.at({0, 0, 1, 0})));
}

TEST_CASE("sdpa.cpu.empty_and_rank2") {
  auto q = cg::uniform<double>({4, 3}, -1, 1, 1);
  auto k = cg::tensor<double>::empty({0, 3});
  auto v = cg::tensor<double>::empty({0, 5});
  auto out = cg::tensor<double>::empty({4, 5});
  cg::detail::sdpa_cpu<double>(q, k, v, std::nullopt, {}, out);
  for (double x : out.to_vector()) CHECK(x == 0.0);  // no key: an empty weighted sum
  auto wrong = cg::tensor<double>::empty({4, 4});
  CHECK(contains(error_of([&] { cg::detail::sdpa_cpu<double>(q, k, v, std::nullopt, {}, wrong); }),
                 "scaled_dot_product_attention: output of shape [4, 4] for a result of shape [4, 5]"));
}


/// The analytic gradient in double from the reference forward: dV = Pᵀ dO, dP = dO Vᵀ,
/// dS = P ∘ (dP - rowsum(P ∘ dP)), dQ = dS K scale, dK = dSᵀ Q scale.
template <class T>
void check_backward(const cg::tensor<T>& q, const cg::tensor<T>& k, const cg::tensor<T>& v,
                    const std::optional<cg::tensor<bool>>& mask, sdpa_options opt, double tolerance) {
  const i64 B = q.shape()[0], H = q.shape()[1], L = q.shape()[2], E = q.shape()[3], S = k.shape()[2],
            Ev = v.shape()[3];
  const double scale = cg::detail::sdpa_check(cg::detail::meta_of(q), cg::detail::meta_of(k), cg::detail::meta_of(v),
                                              cg::detail::meta_of(mask), opt)
                           .scale;
  auto out = cg::tensor<T>::empty({B, H, L, Ev});
  auto lse = cg::tensor<cg::detail::sdpa_lse_t<T>>::empty({B, H, L});
  cg::detail::sdpa_cpu<T, bool>(q, k, v, mask, opt, out, lse);
  auto dout = cg::uniform<T>({B, H, L, Ev}, -1, 1, 77);
  auto dq = cg::tensor<T>::empty(q.shape()), dk = cg::tensor<T>::empty(k.shape()), dv = cg::tensor<T>::empty(v.shape());
  cg::detail::sdpa_backward_cpu<T, bool>(dout, q, k, v, out, lse, mask, opt, dq, dk, dv);
  const auto ref = forward_ref(q, k, v, expand_mask(mask, B, H, L, S), opt.is_causal, scale);
  std::vector<double> rdq(static_cast<std::size_t>(B * H * L * E), 0), rdk(static_cast<std::size_t>(B * H * S * E), 0),
      rdv(static_cast<std::size_t>(B * H * S * Ev), 0);
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h)
      for (i64 i = 0; i < L; ++i) {
        const std::size_t row = static_cast<std::size_t>((b * H + h) * L + i);
        std::vector<double> dp(static_cast<std::size_t>(S));
        double rowsum = 0;
        for (i64 j = 0; j < S; ++j) {
          double x = 0;
          for (i64 d = 0; d < Ev; ++d) x += at4(dout, b, h, i, d) * at4(v, b, h, j, d);
          dp[static_cast<std::size_t>(j)] = x;
          rowsum += ref.p[row * S + j] * x;
        }
        for (i64 j = 0; j < S; ++j) {
          const double p = ref.p[row * S + j];
          const double ds = p * (dp[static_cast<std::size_t>(j)] - rowsum);
          for (i64 d = 0; d < Ev; ++d) rdv[static_cast<std::size_t>(((b * H + h) * S + j) * Ev + d)] += p * at4(dout, b, h, i, d);
          for (i64 e = 0; e < E; ++e) {
            rdq[static_cast<std::size_t>(row * E + e)] += ds * at4(k, b, h, j, e) * scale;
            rdk[static_cast<std::size_t>(((b * H + h) * S + j) * E + e)] += ds * at4(q, b, h, i, e) * scale;
          }
        }
      }
  auto cmp = [&](const cg::tensor<T>& got, const std::vector<double>& want, const char* name) {
    CAPTURE(name);
    const auto gv = got.to_vector();
    REQUIRE(gv.size() == want.size());
    for (std::size_t i = 0; i < gv.size(); ++i) {
      CAPTURE(i);
      CHECK(std::abs(to_d(gv[i]) - want[i]) <= tolerance * (1 + std::abs(want[i])));
    }
  };
  cmp(dq, rdq, "dq");
  cmp(dk, rdk, "dk");
  cmp(dv, rdv, "dv");
}


TEST_CASE("sdpa_backward.cpu.f64.analytic") {
  auto q = cg::uniform<double>({2, 2, 5, 4}, -1, 1, 1);
  auto k = cg::uniform<double>({2, 2, 6, 4}, -1, 1, 2);
  auto v = cg::uniform<double>({2, 2, 6, 3}, -1, 1, 3);
  check_backward<double>(q, k, v, std::nullopt, {}, 1e-10);
  check_backward<double>(q, k, v, std::nullopt, {true, std::nullopt, 0.0}, 1e-10);
  check_backward<double>(q, k, v, cg::uniform<bool>({5, 6}, -1, 1, 4), {false, 0.3, 0.0}, 1e-10);
  // Strided q and k.
  auto qs = cg::uniform<double>({2, 5, 2, 4}, -1, 1, 5).transpose(1, 2);
  check_backward<double>(qs, k, v, std::nullopt, {true, std::nullopt, 0.0}, 1e-10);
}

TEST_CASE("sdpa_backward.cpu.low_precision") {
  check_backward<float>(cg::uniform<float>({1, 2, 6, 8}, -1, 1, 1), cg::uniform<float>({1, 2, 9, 8}, -1, 1, 2),
                        cg::uniform<float>({1, 2, 9, 8}, -1, 1, 3), std::nullopt, {true, std::nullopt, 0.0}, 2e-5);
  check_backward<cg::bf16>(cg::uniform<cg::bf16>({1, 2, 6, 8}, -1, 1, 1), cg::uniform<cg::bf16>({1, 2, 9, 8}, -1, 1, 2),
                           cg::uniform<cg::bf16>({1, 2, 9, 8}, -1, 1, 3), std::nullopt, {}, 3e-2);
  check_backward<cg::f16>(cg::uniform<cg::f16>({1, 2, 6, 8}, -1, 1, 1), cg::uniform<cg::f16>({1, 2, 9, 8}, -1, 1, 2),
                          cg::uniform<cg::f16>({1, 2, 9, 8}, -1, 1, 3), cg::uniform<bool>({6, 9}, -1, 1, 5), {}, 5e-3);
}

TEST_CASE("sdpa_backward.cpu.f64.finite_differences") {
  // The loss l = sum(out ∘ dO): its derivative along each input element by central differences.
  auto q = cg::uniform<double>({1, 1, 3, 4}, -1, 1, 1);
  auto k = cg::uniform<double>({1, 1, 4, 4}, -1, 1, 2);
  auto v = cg::uniform<double>({1, 1, 4, 2}, -1, 1, 3);
  auto dout = cg::uniform<double>({1, 1, 3, 2}, -1, 1, 4);
  const sdpa_options opt{true, 0.7, 0.0};
  auto loss = [&] {
    auto out = cg::tensor<double>::empty({1, 1, 3, 2});
    cg::detail::sdpa_cpu<double>(q, k, v, std::nullopt, opt, out);
    double l = 0;
    const auto ov = out.to_vector(), gv = dout.to_vector();
    for (std::size_t i = 0; i < ov.size(); ++i) l += ov[i] * gv[i];
    return l;
  };
  auto out = cg::tensor<double>::empty({1, 1, 3, 2});
  auto lse = cg::tensor<double>::empty({1, 1, 3});
  cg::detail::sdpa_cpu<double>(q, k, v, std::nullopt, opt, out, lse);
  auto dq = cg::tensor<double>::empty(q.shape()), dk = cg::tensor<double>::empty(k.shape()),
       dv = cg::tensor<double>::empty(v.shape());
  cg::detail::sdpa_backward_cpu<double>(dout, q, k, v, out, lse, std::nullopt, opt, dq, dk, dv);
  for (auto [t, g] : {std::pair{&q, &dq}, std::pair{&k, &dk}, std::pair{&v, &dv}}) {
    double* p = t->data();
    const auto gv = g->to_vector();
    for (i64 i = 0; i < t->numel(); ++i) {
      const double x = p[i], h = 1e-6;
      p[i] = x + h;
      const double up = loss();
      p[i] = x - h;
      const double down = loss();
      p[i] = x;
      CAPTURE(i);
      CHECK(gv[static_cast<std::size_t>(i)] == doctest::Approx((up - down) / (2 * h)).epsilon(1e-6));
    }
  }
}

}  // namespace attention_test
