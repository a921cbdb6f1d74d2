// tests/ops/test_matmul.cpp: cg::matmul (ccgraph/ops/matmul.hpp) against a naive
// double-precision reference: shapes that are not multiples of the blocking, views with any
// strides, torch.matmul's 1-d and batched rules, every element type, and its error messages.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <ccgraph/ops/matmul.hpp>
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using i64 = std::int64_t;

/// Naive 2-d reference in double: values and the sum of |terms| (the scale of rounding errors).
struct reference {
  std::vector<double> value, scale;
};
template <class T>
reference naive(const cg::tensor<T>& a, const cg::tensor<T>& b) {
  const i64 m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  reference r{std::vector<double>(m * n, 0.0), std::vector<double>(m * n, 0.0)};
  const auto av = a.to_vector(), bv = b.to_vector();
  for (i64 i = 0; i < m; ++i)
    for (i64 p = 0; p < k; ++p)
      for (i64 j = 0; j < n; ++j) {
        const double t = to_d(av[i * k + p]) * to_d(bv[p * n + j]);
        r.value[i * n + j] += t;
        r.scale[i * n + j] += std::abs(t);
      }
  return r;
}

/// Relative precision of accumulating in T's compute type and rounding to T.
template <class T>
double eps() {
  if constexpr (std::is_same_v<T, double>) return 1e-13;
  if constexpr (std::is_same_v<T, float>) return 2e-6;
  if constexpr (std::is_same_v<T, cg::bf16>) return 1.0 / 128;
  if constexpr (std::is_same_v<T, cg::f16>) return 1.0 / 1024;
  return 0;
}

/// Checks a 2-d product against the reference: integers exactly (wrapping like T), floats
/// within T's precision of the terms' scale.
template <class T>
void check_product(const cg::tensor<T>& c, const cg::tensor<T>& a, const cg::tensor<T>& b) {
  const i64 m = a.shape()[0], n = b.shape()[1];
  REQUIRE(c.shape() == cg::shape_t{m, n});
  const auto ref = naive(a, b);
  const auto cv = c.to_vector();
  int bad = 0;
  for (i64 i = 0; i < m * n && bad < 5; ++i) {
    bool ok;
    if constexpr (std::is_integral_v<T>)
      ok = cv[i] == static_cast<T>(static_cast<std::int64_t>(ref.value[i]));
    else
      ok = std::abs(to_d(cv[i]) - ref.value[i]) <= eps<T>() * (ref.scale[i] + std::abs(ref.value[i])) + 1e-30;
    if (!ok) {
      ++bad;
      CAPTURE(i);
      CAPTURE(to_d(cv[i]));
      CAPTURE(ref.value[i]);
      CHECK(ok);
    }
  }
  CHECK(bad == 0);
}

// Sizes around the blocking: MR = 6, NR = 8 or 16, KC = 256, MC = 72, NC = 128 * NR.
const std::vector<std::array<i64, 3>> shapes_mnk = {
    {1, 1, 1},   {1, 7, 1},  {5, 1, 3},    {6, 8, 4},    {7, 9, 13},  {13, 17, 31},
    {37, 23, 256}, {12, 16, 257}, {73, 35, 300}, {150, 33, 19}, {3, 2100, 5}, {64, 64, 64}};

template <class T>
void check_random_shapes(double lo, double hi) {
  std::uint64_t seed = 100;
  for (const auto& mnk : shapes_mnk) {
    const i64 m = mnk[0], n = mnk[1], k = mnk[2];
    CAPTURE(m);
    CAPTURE(n);
    CAPTURE(k);
    auto a = cg::uniform<T>({m, k}, lo, hi, ++seed);
    auto b = cg::uniform<T>({k, n}, lo, hi, ++seed);
    check_product(cg::matmul(a, b), a, b);
  }
}

}  // namespace

TEST_CASE("matmul.f32.random_shapes") { check_random_shapes<float>(-1, 1); }
TEST_CASE("matmul.f64.random_shapes") { check_random_shapes<double>(-1, 1); }
TEST_CASE("matmul.bf16.random_shapes") { check_random_shapes<cg::bf16>(-1, 1); }
TEST_CASE("matmul.f16.random_shapes") { check_random_shapes<cg::f16>(-1, 1); }
TEST_CASE("matmul.i32.random_shapes") { check_random_shapes<std::int32_t>(-8, 8); }
TEST_CASE("matmul.i64.random_shapes") { check_random_shapes<std::int64_t>(-8, 8); }
TEST_CASE("matmul.u8.random_shapes") { check_random_shapes<std::uint8_t>(0, 16); }  // wraps mod 256

TEST_CASE("matmul.bf16.accumulates_in_float") {
  // 1024 ones: a bf16 accumulator would stop at 256 (256 + 1 rounds back to 256).
  auto a = cg::ones<cg::bf16>({2, 1024});
  auto b = cg::ones<cg::bf16>({1024, 3});
  for (auto v : cg::matmul(a, b).to_vector()) CHECK(static_cast<float>(v) == 1024.f);
  auto h = cg::ones<cg::f16>({1, 4096});
  auto hb = cg::ones<cg::f16>({4096, 1});
  CHECK(static_cast<float>(cg::matmul(h, hb).item()) == 4096.f);
}

TEST_CASE("matmul.f32.strided_views") {
  auto base_a = cg::uniform<float>({40, 90}, -1, 1, 1);
  auto base_b = cg::uniform<float>({70, 50}, -1, 1, 2);
  const auto at = base_a.transpose(0, 1);                 // [90, 40], column-major
  const auto bt = base_b.transpose(0, 1);                 // [50, 70]
  const auto an = base_a.narrow(1, 3, 70);                // [40, 70], row stride 90, offset 3
  const auto bn = base_b.narrow(0, 20, 40).narrow(1, 1, 49);  // [40, 49] with an offset
  check_product(cg::matmul(an, base_b), an.contiguous(), base_b);
  check_product(cg::matmul(at, base_a), at.contiguous(), base_a);
  check_product(cg::matmul(bt, bt.transpose(0, 1)), bt.contiguous(), base_b);
  check_product(cg::matmul(at.narrow(0, 0, 50), bn), at.narrow(0, 0, 50).contiguous(), bn.contiguous());
  // Stride-0 (expanded) operand: a row repeated via a broadcast view.
  auto row = cg::uniform<float>({1, 70}, -1, 1, 3);
  cg::tensor<float> rows(row.storage(), {5, 70}, {0, 1}, 0);
  check_product(cg::matmul(rows, base_b), rows.contiguous(), base_b);
}

TEST_CASE("matmul.expressions_as_operands") {
  auto a = cg::uniform<float>({9, 11}, -1, 1, 1);
  auto b = cg::uniform<float>({11, 4}, -1, 1, 2);
  cg::tensor<float> ra = cg::relu(a);
  cg::tensor<float> rb = b * 2 + 1;
  const auto want = cg::matmul(ra, rb).to_vector();
  CHECK(cg::matmul(cg::relu(a), b * 2 + 1).to_vector() == want);
  CHECK(cg::matmul(ra, b * 2 + 1).to_vector() == want);
  // One expression object as both operands (evaluated once) and two equal ones (twice).
  auto sq = cg::uniform<float>({6, 6}, -1, 1, 3);
  const auto c = cg::relu(sq) * 0.5f;
  cg::tensor<float> tc = c;
  const auto want_sq = cg::matmul(tc, tc).to_vector();
  CHECK(cg::matmul(c, c).to_vector() == want_sq);
  CHECK(cg::matmul(c, cg::relu(sq) * 0.5f).to_vector() == want_sq);
}

TEST_CASE("matmul.vector_and_batched_rules") {
  auto v = cg::uniform<double>({6}, -1, 1, 1);
  auto w = cg::uniform<double>({6}, -1, 1, 2);
  auto m = cg::uniform<double>({4, 6}, -1, 1, 3);
  auto mt = cg::uniform<double>({6, 5}, -1, 1, 4);
  // 1-d . 1-d: a 0-d dot product.
  const auto dot = cg::matmul(v, w);
  CHECK(dot.shape() == cg::shape_t{});
  double want = 0;
  for (i64 i = 0; i < 6; ++i) want += v.at({i}) * w.at({i});
  CHECK(dot.item() == doctest::Approx(want).epsilon(1e-12));
  // 2-d . 1-d and 1-d . 2-d.
  const auto mv = cg::matmul(m, v);
  CHECK(mv.shape() == cg::shape_t{4});
  check_product(mv.reshape({4, 1}), m, v.reshape({6, 1}));
  const auto vm = cg::matmul(v, mt);
  CHECK(vm.shape() == cg::shape_t{5});
  check_product(vm.reshape({1, 5}), v.reshape({1, 6}), mt);
  // Batched, with batch broadcasting: [2,1,4,6] x [3,6,5] -> [2,3,4,5].
  auto ba = cg::uniform<double>({2, 1, 4, 6}, -1, 1, 5);
  auto bb = cg::uniform<double>({3, 6, 5}, -1, 1, 6);
  const auto bc = cg::matmul(ba, bb);
  REQUIRE(bc.shape() == cg::shape_t{2, 3, 4, 5});
  for (i64 i = 0; i < 2; ++i)
    for (i64 j = 0; j < 3; ++j)
      check_product(bc.select(0, i).select(0, j).contiguous(), ba.select(0, i).select(0, 0).contiguous(),
                    bb.select(0, j).contiguous());
  // 3-d x 2-d (the weight shared by every batch), and a 3-d x 1-d.
  const auto b2 = cg::matmul(bb.transpose(1, 2), mt);  // [3,5,6] x [6,5]
  REQUIRE(b2.shape() == cg::shape_t{3, 5, 5});
  for (i64 j = 0; j < 3; ++j)
    check_product(b2.select(0, j).contiguous(), bb.select(0, j).transpose(0, 1).contiguous(), mt);
  CHECK(cg::matmul(ba, v).shape() == cg::shape_t{2, 1, 4});
  CHECK(cg::matmul(v, bb).shape() == cg::shape_t{3, 5});
}

TEST_CASE("matmul.empty_dims") {
  // Empty K: an empty sum is zero (on random-filled output memory).
  auto a = cg::tensor<float>::empty({3, 0});
  auto b = cg::tensor<float>::empty({0, 4});
  const auto c = cg::matmul(a, b);
  CHECK(c.shape() == cg::shape_t{3, 4});
  for (auto x : c.to_vector()) CHECK(x == 0.f);
  CHECK(cg::matmul(cg::tensor<cg::bf16>::empty({2, 0}), cg::tensor<cg::bf16>::empty({0, 2})).to_vector() ==
        std::vector<cg::bf16>(4, cg::bf16(0.f)));
  CHECK(cg::matmul(cg::tensor<float>::empty({0, 5}), cg::uniform<float>({5, 4})).shape() == cg::shape_t{0, 4});
  CHECK(cg::matmul(cg::uniform<float>({2, 5}), cg::tensor<float>::empty({5, 0})).shape() == cg::shape_t{2, 0});
  CHECK(cg::matmul(cg::tensor<float>::empty({0, 2, 3}), cg::uniform<float>({3, 4})).shape() ==
        cg::shape_t{0, 2, 4});
}

TEST_CASE("matmul.into_strided_output") {
  auto a = cg::uniform<float>({10, 20}, -1, 1, 1);
  auto b = cg::uniform<float>({20, 30}, -1, 1, 2);
  auto out_t = cg::tensor<float>::empty({30, 10});
  cg::detail::matmul_into(out_t.transpose(0, 1), a, b);  // writes column-major
  check_product(out_t.transpose(0, 1).contiguous(), a, b);
  auto hb = cg::uniform<cg::bf16>({20, 30}, -1, 1, 3);
  auto ha = cg::uniform<cg::bf16>({10, 20}, -1, 1, 4);
  auto out_h = cg::tensor<cg::bf16>::empty({30, 10});
  cg::detail::matmul_into(out_h.transpose(0, 1), ha, hb);
  check_product(out_h.transpose(0, 1).contiguous(), ha, hb);
  CHECK(error_of([&] { cg::detail::matmul_into(out_t, a, b); }) ==
        "matmul: output of shape [30, 10] for a result of shape [10, 30]");
}

TEST_CASE("matmul.pending_operand_waits") {
  auto work = std::make_shared<cg::detail::work>();
  cg::tensor<float> pending(cg::detail::storage::host(4 * sizeof(float)), {2, 2}, {2, 1}, 0, work);
  auto eye = cg::tensor<float>::from({1, 0, 0, 1}, {2, 2});
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    float* p = pending.data_unsynced();
    for (int i = 0; i < 4; ++i) p[i] = static_cast<float>(i + 1);
    work->complete();
  });
  const auto c = cg::matmul(pending, eye);
  writer.join();
  CHECK(c.to_vector() == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("matmul.errors") {
  auto a = cg::uniform<float>({2, 3});
  auto b = cg::uniform<float>({4, 5});
  CHECK(error_of([&] { (void)cg::matmul(a, b); }) ==
        "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  CHECK(error_of([&] { (void)cg::matmul(cg::uniform<float>({3}), cg::uniform<float>({4})); }) ==
        "matmul: shapes [3] and [4] cannot be multiplied (3 != 4)");
  CHECK(error_of([&] { (void)cg::matmul(cg::full<float>({}, 1.f), a); }) ==
        "matmul: both arguments need at least 1 dimension, got shapes [] and [2, 3]");
  CHECK(error_of([&] { (void)cg::matmul(cg::uniform<float>({2, 4, 3}), cg::uniform<float>({5, 3, 2})); }) ==
        "matmul: batch dimensions of shapes [2, 4, 3] and [5, 3, 2] cannot be broadcast together");
  // The checks run before any work, so a bad expression operand is reported too.
  CHECK(error_of([&] { (void)cg::matmul(a * 2, b + 1); }).find("cannot be multiplied") != std::string::npos);
}

TEST_CASE("matmul.meta_and_flops") {
  CHECK(cg::detail::matmul_shape({2, 3}, {3, 4}) == cg::shape_t{2, 4});
  CHECK(cg::detail::matmul_shape({7, 1, 2, 3}, {5, 3, 4}) == cg::shape_t{7, 5, 2, 4});
  CHECK(cg::detail::matmul_shape({3}, {3}) == cg::shape_t{});
  static_assert(cg::detail::matmul_flops(512, 512, 512) == 2LL * 512 * 512 * 512);
  CHECK(cg::detail::matmul_flops({2, 3}, {3, 4}) == 2 * 2 * 4 * 3);
  CHECK(cg::detail::matmul_flops({5, 2, 3}, {3, 4}) == 5 * 2 * 2 * 4 * 3);
  static_assert(std::is_same_v<decltype(cg::matmul(cg::tensor<cg::bf16>{}, cg::tensor<cg::bf16>{})),
                               cg::tensor<cg::bf16>>);
  static_assert(std::is_same_v<cg::detail::matmul_acc_t<cg::f16>, float>);
}

TEST_CASE("matmul.f32.512_well_under_100ms_on_one_core") {
  // The foundation's performance bar: a 512x512 float matmul well under 100 ms on one core
  // (bench/RESULTS.md: about 12 ms; 7 ms on the 2-core CI machine under load). The bound is half
  // the target: a textbook i-j-k triple loop (about 80 ms there) fails it. Only an optimised,
  // uninstrumented build can be timed: the sanitizer builds (-O0/-O1, no NDEBUG) skip it. Best of 5,
  // so that a loaded machine (other tests run beside this one) does not fail it.
#if defined(NDEBUG) && defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  auto a = cg::uniform<float>({512, 512}, -1, 1, 11);
  auto b = cg::uniform<float>({512, 512}, -1, 1, 12);
  double best_ms = 1e9;
  cg::tensor<float> c;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    c = cg::matmul(a, b);
    best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  MESSAGE("512x512x512 f32 matmul: best of 5 = ", best_ms, " ms");
  CHECK(best_ms < 50.0);
  // The timed product is a real one: spot-check a few entries against the naive sum.
  const auto av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector();
  for (const std::array<i64, 2> ij : {std::array<i64, 2>{0, 0}, {511, 511}, {17, 300}, {400, 3}}) {
    double want = 0, scale = 0;
    for (i64 k = 0; k < 512; ++k) {
      const double t = double(av[static_cast<std::size_t>(ij[0] * 512 + k)]) * bv[static_cast<std::size_t>(k * 512 + ij[1])];
      want += t;
      scale += std::abs(t);
    }
    CHECK(std::abs(cv[static_cast<std::size_t>(ij[0] * 512 + ij[1])] - want) <= 1e-5 * scale + 1e-6);
  }
#else
  MESSAGE("not timed: an unoptimised or sanitized build");
#endif
}
