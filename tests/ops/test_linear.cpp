// tests/ops/test_linear.cpp: bmm and linear (ccgraph/ops/linear.hpp): their shape functions'
// errors and CPU kernels against double-precision loops written here, with strided operands,
// bias and the tanh-GELU activation.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <ccgraph/ops/linear.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace linear_test {

using i64 = std::int64_t;

template <class T>
double eps() {
  if constexpr (std::is_same_v<T, double>) return 1e-13;
  if constexpr (std::is_same_v<T, float>) return 2e-6;
  if constexpr (std::is_same_v<T, cg::bf16>) return 1.0 / 128;
  return 1.0 / 1024;
}

double gelu_tanh_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

/// linear's reference: rows of x (flattened to [m, k]) times wᵀ plus bias, then GELU.
template <class T>
void check_linear(const cg::tensor<T>& x, const cg::tensor<T>& w, const std::optional<cg::tensor<T>>& bias,
                  cg::detail::linear_activation act) {
  const i64 n = w.shape()[0], k = w.shape()[1];
  const auto shape = cg::detail::linear_shape(x.shape(), w.shape(),
                                              bias ? std::optional<cg::shape_t>(bias->shape()) : std::nullopt);
  auto out = cg::tensor<T>::empty(shape);
  cg::detail::linear_cpu(x, w, bias, act, out);
  const auto xv = x.contiguous().to_vector();
  const i64 m = static_cast<i64>(xv.size()) / k;
  const auto ov = out.to_vector();
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < n; ++j) {
      double acc = 0, scale = 0;
      for (i64 p = 0; p < k; ++p) {
        const double t = to_d(xv[static_cast<std::size_t>(i * k + p)]) * to_d(w.at({j, p}));
        acc += t;
        scale += std::abs(t);
      }
      if (bias) {
        acc += to_d(bias->at({j}));
        scale += std::abs(to_d(bias->at({j})));
      }
      if (act == cg::detail::linear_activation::gelu_tanh) acc = gelu_tanh_ref(acc);
      CAPTURE(i);
      CAPTURE(j);
      CHECK(std::abs(to_d(ov[static_cast<std::size_t>(i * n + j)]) - acc) <= eps<T>() * (scale + std::abs(acc)) + 1e-30);
    }
}

template <class T>
void linear_cases() {
  using cg::detail::linear_activation;
  auto x = cg::uniform<T>({2, 3, 20}, -1, 1, 1);
  auto w = cg::uniform<T>({7, 20}, -1, 1, 2);
  auto b = cg::uniform<T>({7}, -1, 1, 3);
  check_linear<T>(x, w, std::nullopt, linear_activation::none);
  check_linear<T>(x, w, b, linear_activation::none);
  check_linear<T>(x, w, b, linear_activation::gelu_tanh);
  check_linear<T>(x, w, std::nullopt, linear_activation::gelu_tanh);
  // 1-d input, a transposed weight view, a strided input and a strided bias.
  check_linear<T>(cg::uniform<T>({20}, -1, 1, 4), w, b, linear_activation::none);
  auto wt = cg::uniform<T>({20, 7}, -1, 1, 5).transpose(0, 1);
  auto xs = cg::uniform<T>({20, 6}, -1, 1, 6).transpose(0, 1);
  auto bs = cg::uniform<T>({14}, -1, 1, 7);
  check_linear<T>(xs, wt, cg::tensor<T>(bs.storage(), {7}, {2}, 1), linear_activation::gelu_tanh);
}

}  // namespace linear_test

// The test cases live in the namespace too: in a unity batch, a using-directive would reach
// the next file and make helpers of the same name (tol, ...) ambiguous.
namespace linear_test {

TEST_CASE("bmm.shape_and_errors") {
  using cg::detail::bmm_shape;
  CHECK(bmm_shape({3, 4, 5}, {3, 5, 6}) == cg::shape_t{3, 4, 6});
  CHECK(contains(error_of([] { (void)bmm_shape({4, 5}, {3, 5, 6}); }), "bmm: batch1 must be a 3-d tensor, got shape [4, 5]"));
  CHECK(contains(error_of([] { (void)bmm_shape({3, 4, 5}, {5, 6}); }), "bmm: batch2 must be a 3-d tensor, got shape [5, 6]"));
  CHECK(contains(error_of([] { (void)bmm_shape({3, 4, 5}, {2, 5, 6}); }),
                 "bmm: expected batch2's first two dims to be [3, 5] for batch1 of shape [3, 4, 5], got batch2 of "
                 "shape [2, 5, 6]"));
}

TEST_CASE("bmm.cpu.f32_and_bf16") {
  auto a = cg::uniform<float>({3, 5, 4}, -1, 1, 1).transpose(1, 2);  // [3, 4, 5], strided
  auto b = cg::uniform<float>({3, 5, 6}, -1, 1, 2);
  auto out = cg::tensor<float>::empty({3, 4, 6});
  cg::detail::bmm_cpu(a, b, out);
  for (i64 z = 0; z < 3; ++z)
    for (i64 i = 0; i < 4; ++i)
      for (i64 j = 0; j < 6; ++j) {
        double acc = 0;
        for (i64 p = 0; p < 5; ++p) acc += static_cast<double>(a.at({z, i, p})) * b.at({z, p, j});
        CHECK(out.at({z, i, j}) == doctest::Approx(acc).epsilon(1e-5));
      }
  auto ah = cg::ones<cg::bf16>({2, 1, 512});
  auto bh = cg::ones<cg::bf16>({2, 512, 1});
  auto oh = cg::tensor<cg::bf16>::empty({2, 1, 1});
  cg::detail::bmm_cpu(ah, bh, oh);
  CHECK(static_cast<float>(oh.at({1, 0, 0})) == 512.f);  // float accumulation
  auto wrong = cg::tensor<float>::empty({3, 4, 5});
  CHECK(contains(error_of([&] { cg::detail::bmm_cpu(a, b, wrong); }), "bmm: output of shape [3, 4, 5] for a result of shape [3, 4, 6]"));
}

TEST_CASE("linear.shape_and_errors") {
  using cg::detail::linear_shape;
  CHECK(linear_shape({2, 3, 8}, {5, 8}) == cg::shape_t{2, 3, 5});
  CHECK(linear_shape({8}, {5, 8}, cg::shape_t{5}) == cg::shape_t{5});
  CHECK(contains(error_of([] { (void)linear_shape({}, {5, 8}); }), "linear: input must have at least 1 dim, got a 0-d tensor"));
  CHECK(contains(error_of([] { (void)linear_shape({2, 8}, {8}); }),
                 "linear: weight must be 2-d [out_features, in_features], got shape [8]"));
  CHECK(contains(error_of([] { (void)linear_shape({2, 7}, {5, 8}); }),
                 "linear: input of shape [2, 7] and weight of shape [5, 8] cannot be multiplied (in_features 7 != 8)"));
  CHECK(contains(error_of([] { (void)linear_shape({2, 8}, {5, 8}, cg::shape_t{4}); }),
                 "linear: bias of shape [4] for out_features 5; expected [5]"));
}

TEST_CASE("linear.cpu.f32") { linear_cases<float>(); }
TEST_CASE("linear.cpu.f64") { linear_cases<double>(); }
TEST_CASE("linear.cpu.bf16") { linear_cases<cg::bf16>(); }
TEST_CASE("linear.cpu.f16") { linear_cases<cg::f16>(); }

TEST_CASE("linear.cpu.bf16.bias_before_the_one_rounding") {
  // 256 + 1 (product) + 1 (bias) = 258 exactly: rounding the product to bf16 first would give
  // 256 + 1 -> 256, then 256 + 1 -> 256.
  auto x = cg::full<cg::bf16>({1, 2}, cg::bf16(1.f));
  auto w = cg::tensor<cg::bf16>::from({cg::bf16(256.f), cg::bf16(1.f)}, {1, 2});
  auto b = cg::full<cg::bf16>({1}, cg::bf16(1.f));
  auto out = cg::tensor<cg::bf16>::empty({1, 1});
  cg::detail::linear_cpu<cg::bf16>(x, w, b, cg::detail::linear_activation::none, out);
  CHECK(static_cast<float>(out.item()) == 258.f);
}

}  // namespace linear_test
