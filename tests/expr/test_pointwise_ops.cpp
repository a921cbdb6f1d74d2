// tests/expr/test_pointwise_ops.cpp: the pointwise ops of a transformer block (ccgraph/ops/
// pointwise.hpp): rsqrt, erf, sign, floor/ceil/round/trunc, maximum/minimum, pow, clamp, the
// comparisons, where, casts inside expressions and dropout. Each against a double-precision
// reference computed here, with broadcasting, strided operands, PyTorch's NaN rules, mixed
// element types in one loop, and fused == op by op, bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <ccgraph/expr/expr.hpp>
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using i64 = std::int64_t;


/// Relative tolerance of a result rounded to T from a few float operations.
template <class T>
double pw_tol() {
  if constexpr (std::is_same_v<T, float>) return 4e-6;
  if constexpr (std::is_same_v<T, double>) return 1e-13;
  if constexpr (std::is_same_v<T, cg::bf16>) return 1.0 / 128;
  if constexpr (std::is_same_v<T, cg::f16>) return 1.0 / 1024;
  return 0;
}

bool pw_near(double got, double want, double rel) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::abs(got - want) <= rel * std::max(1.0, std::abs(want));
}

/// Same bits (so NaN == NaN and -0 != +0).
template <class T>
bool pw_same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
void pw_check_same_bits(const cg::tensor<T>& a, const cg::tensor<T>& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(i);
    CHECK(pw_same_bits<T>(x[i], y[i]));
  }
}

/// Checks unary op `op` on T against `ref` in double over uniform values in [lo, hi), on a
/// contiguous and on a transposed operand.
template <class T, class Op, class Ref>
void pw_check_unary(const char* name, Op op, Ref ref, double lo, double hi) {
  CAPTURE(name);
  const auto a = cg::uniform<T>({23, 9}, lo, hi, 31);
  for (const auto& x : {a, a.transpose(0, 1)}) {
    cg::tensor<T> r = op(x);
    REQUIRE(r.shape() == x.shape());
    const auto xv = x.contiguous().to_vector(), rv = r.to_vector();
    for (std::size_t i = 0; i < xv.size(); ++i) {
      CAPTURE(to_d(xv[i]));
      CHECK(pw_near(to_d(rv[i]), static_cast<double>(cg::detail::cast<T>(ref(to_d(xv[i])))), pw_tol<T>()));
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Unary ops
// ---------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("pointwise_ops.unary.matches_double", T, float, double, cg::bf16, cg::f16) {
  pw_check_unary<T>("rsqrt", [](auto x) { return cg::rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, 0.01, 20);
  pw_check_unary<T>("erf", [](auto x) { return cg::erf(x); }, [](double x) { return std::erf(x); }, -3, 3);
  pw_check_unary<T>("tanh", [](auto x) { return cg::tanh(x); }, [](double x) { return std::tanh(x); }, -5, 5);
  pw_check_unary<T>("sign", [](auto x) { return cg::sign(x); }, [](double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; },
                 -3, 3);
  // Rounding ops are exact: values of several magnitudes, negative ones included.
  pw_check_unary<T>("floor", [](auto x) { return cg::floor(x); }, [](double x) { return std::floor(x); }, -40, 40);
  pw_check_unary<T>("ceil", [](auto x) { return cg::ceil(x); }, [](double x) { return std::ceil(x); }, -40, 40);
  pw_check_unary<T>("round", [](auto x) { return cg::round(x); }, [](double x) { return std::nearbyint(x); }, -40, 40);
  pw_check_unary<T>("trunc", [](auto x) { return cg::trunc(x); }, [](double x) { return std::trunc(x); }, -40, 40);
}

TEST_CASE("pointwise_ops.unary.special_values") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto a = cg::tensor<float>::from({0.5f, 1.5f, 2.5f, -0.5f, -2.5f, -0.f, nan, inf}, {8});
  // torch.round rounds half to even.
  const auto r = cg::round(a).to_vector();
  CHECK(r[0] == 0.f);
  CHECK(r[1] == 2.f);
  CHECK(r[2] == 2.f);
  CHECK(r[3] == 0.f);
  CHECK(std::signbit(r[3]));  // -0.5 rounds to -0
  CHECK(r[4] == -2.f);
  CHECK(std::isnan(r[6]));
  CHECK(r[7] == inf);
  // torch.sign is (x > 0) - (x < 0): 0 for NaN, +0 for -0.
  const auto s = cg::sign(a).to_vector();
  CHECK(s[0] == 1.f);
  CHECK(s[3] == -1.f);
  CHECK(s[5] == 0.f);
  CHECK(!std::signbit(s[5]));
  CHECK(s[6] == 0.f);
  CHECK(s[7] == 1.f);
  const auto f = cg::floor(a).to_vector();
  CHECK(f[3] == -1.f);
  CHECK(std::signbit(cg::ceil(a).to_vector()[3]));  // ceil(-0.5) = -0
  const auto q = cg::rsqrt(cg::tensor<float>::from({0.f, -1.f, inf, 4.f}, {4})).to_vector();
  CHECK(q[0] == inf);
  CHECK(std::isnan(q[1]));
  CHECK(q[2] == 0.f);
  CHECK(q[3] == 0.5f);
  const auto e = cg::erf(cg::tensor<float>::from({-inf, inf, nan, 0.f}, {4})).to_vector();
  CHECK(e[0] == -1.f);
  CHECK(e[1] == 1.f);
  CHECK(std::isnan(e[2]));
  CHECK(e[3] == 0.f);
}

TEST_CASE("pointwise_ops.unary.integers") {
  auto i = cg::tensor<std::int32_t>::from({-7, 0, 5, std::numeric_limits<std::int32_t>::min()}, {4});
  CHECK(cg::sign(i).to_vector() == std::vector<std::int32_t>{-1, 0, 1, -1});
  CHECK(cg::floor(i).to_vector() == i.to_vector());
  CHECK(cg::ceil(i).to_vector() == i.to_vector());
  CHECK(cg::round(i).to_vector() == i.to_vector());
  CHECK(cg::trunc(i).to_vector() == i.to_vector());
  auto u = cg::tensor<std::uint8_t>::from({0, 3, 255}, {3});
  CHECK(cg::sign(u).to_vector() == std::vector<std::uint8_t>{0, 1, 1});
  static_assert(cg::ops::erf::floating_only && cg::ops::rsqrt::floating_only && cg::ops::tanh::floating_only);
  static_assert(!cg::ops::sign::floating_only && !cg::ops::floor::floating_only && !cg::ops::pow::floating_only);
}

// ---------------------------------------------------------------------------------------------
// Binary ops: maximum, minimum, pow
// ---------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("pointwise_ops.binary.matches_double", T, float, double, cg::bf16, cg::f16, std::int32_t, i64) {
  const auto a = cg::uniform<T>({7, 6}, -4, 4, 41);
  const auto b = cg::uniform<T>({6}, -4, 4, 42);  // a row, broadcast over a's rows
  auto check = [&](const char* name, const cg::tensor<T>& r, auto ref) {
    CAPTURE(name);
    REQUIRE(r.shape() == cg::shape_t{7, 6});
    for (i64 i = 0; i < 7; ++i)
      for (i64 j = 0; j < 6; ++j) {
        const double want = ref(to_d(a.at({i, j})), to_d(b.at({j})));
        if constexpr (std::is_integral_v<T>)
          CHECK(r.at({i, j}) == static_cast<T>(want));
        else
          CHECK(pw_near(to_d(r.at({i, j})), static_cast<double>(cg::detail::cast<T>(want)), pw_tol<T>()));
      }
  };
  check("maximum", cg::maximum(a, b), [](double x, double y) { return std::max(x, y); });
  check("minimum", cg::minimum(a, b), [](double x, double y) { return std::min(x, y); });
  check("clamp_min", cg::clamp_min(a, b), [](double x, double y) { return std::max(x, y); });
  check("clamp_max", cg::clamp_max(a, b), [](double x, double y) { return std::min(x, y); });
  if constexpr (std::is_integral_v<T>) {
    const auto e = cg::uniform<T>({6}, 0, 6, 43);
    cg::tensor<T> p = cg::pow(a, e);
    for (i64 i = 0; i < 7; ++i)
      for (i64 j = 0; j < 6; ++j) CHECK(p.at({i, j}) == static_cast<T>(std::pow(to_d(a.at({i, j})), to_d(e.at({j})))));
  } else {
    const auto pos = cg::uniform<T>({7, 6}, 0.1, 3, 44);
    cg::tensor<T> p = cg::pow(pos, b);
    for (i64 i = 0; i < 7; ++i)
      for (i64 j = 0; j < 6; ++j) {
        const double want = std::pow(to_d(pos.at({i, j})), to_d(b.at({j})));
        // pow's result is large where the exponent is: compare relative to it.
        CHECK(std::abs(to_d(p.at({i, j})) - want) <= 4 * pw_tol<T>() * std::abs(want));
      }
  }
}

TEST_CASE("pointwise_ops.maximum_minimum.nan_propagates") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto a = cg::tensor<float>::from({nan, 1.f, 2.f, nan}, {4});
  auto b = cg::tensor<float>::from({1.f, nan, 1.f, nan}, {4});
  const auto mx = cg::maximum(a, b).to_vector(), mn = cg::minimum(a, b).to_vector();
  for (int i : {0, 1, 3}) {
    CHECK(std::isnan(mx[static_cast<std::size_t>(i)]));
    CHECK(std::isnan(mn[static_cast<std::size_t>(i)]));
  }
  CHECK(mx[2] == 2.f);
  CHECK(mn[2] == 1.f);
  // Scalars on either side.
  CHECK(cg::maximum(a, 1.5f).to_vector()[2] == 2.f);
  CHECK(cg::minimum(1.5, b).to_vector()[0] == 1.f);
}

TEST_CASE("pointwise_ops.pow.forms_and_integer_semantics") {
  auto x = cg::tensor<float>::from({-2.f, 0.5f, 3.f}, {3});
  CHECK(cg::pow(x, 2).to_vector() == std::vector<float>{4.f, 0.25f, 9.f});
  CHECK(cg::pow(2.f, x).to_vector() == std::vector<float>{0.25f, std::pow(2.f, 0.5f), 8.f});
  CHECK(std::isnan(cg::pow(x, 0.5f).to_vector()[0]));  // a negative base to a fractional power
  // Exponents 0.5 and -0.5 are sqrt and rsqrt, as torch.pow's special cases: -0 and -inf differ
  // from std::pow's.
  auto edge = cg::tensor<float>::from({-0.f, -INFINITY, 4.f}, {3});
  const auto sq = cg::pow(edge, 0.5).to_vector(), rs = cg::pow(edge, -0.5).to_vector();
  CHECK((sq[0] == 0.f && std::signbit(sq[0])));
  CHECK(std::isnan(sq[1]));
  CHECK(sq[2] == 2.f);
  CHECK(rs[0] == -INFINITY);
  CHECK(std::isnan(rs[1]));
  CHECK(rs[2] == 0.5f);
  CHECK(cg::pow(x, x).to_vector()[2] == 27.f);
  // Integers: exact, repeated squaring; negative exponents as PyTorch's powi.
  auto base = cg::tensor<i64>::from({2, -2, 1, -1, -1, 3, 0}, {7});
  auto ex = cg::tensor<i64>::from({10, 3, -5, -3, -4, -1, 0}, {7});
  CHECK(cg::pow(base, ex).to_vector() == std::vector<i64>{1024, -8, 1, -1, 1, 0, 1});
  // Overflow wraps (two's complement), no undefined behaviour: 2^31 and 3^31 mod 2^32.
  auto big = cg::tensor<std::int32_t>::from({2, 3}, {2});
  CHECK(cg::pow(big, 31).to_vector() == std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), 1264544299});
  auto u = cg::tensor<std::uint8_t>::from({2, 3}, {2});
  CHECK(cg::pow(u, 8).to_vector() == std::vector<std::uint8_t>{0, 161});  // 256 and 6561 mod 256
  // An integer tensor to a negative integer scalar: PyTorch's error.
  CHECK(error_of([&] { (void)cg::pow(base, -1); }) ==
        "pow: integers to negative integer powers are not allowed (exponent -1)");
}

// ---------------------------------------------------------------------------------------------
// clamp
// ---------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("pointwise_ops.clamp.scalars_and_tensor_bounds", T, float, double, cg::bf16, cg::f16, std::int32_t) {
  const auto x = cg::uniform<T>({5, 8}, -6, 6, 51);
  const auto lo = cg::uniform<T>({8}, -4, 0, 52);
  const auto hi = cg::uniform<T>({5, 1}, 0, 4, 53);
  cg::tensor<T> s = cg::clamp(x, -2, 3);
  cg::tensor<T> t = cg::clamp(x, lo, hi);  // all three broadcast together
  cg::tensor<T> tt = cg::clamp(x.transpose(0, 1), -1, 1);
  for (i64 i = 0; i < 5; ++i)
    for (i64 j = 0; j < 8; ++j) {
      const double v = to_d(x.at({i, j}));
      CHECK(to_d(s.at({i, j})) == std::min(std::max(v, -2.0), 3.0));
      CHECK(to_d(t.at({i, j})) == std::min(std::max(v, to_d(lo.at({j}))), to_d(hi.at({i, 0}))));
      CHECK(to_d(tt.at({j, i})) == std::min(std::max(v, -1.0), 1.0));
    }
  // One bound only: std::nullopt, clamp_min / clamp_max, or run-time optionals.
  cg::tensor<T> only_lo = cg::clamp(x, 0, std::nullopt);
  cg::tensor<T> only_hi = cg::clamp(x, std::nullopt, 0);
  cg::tensor<T> rt = cg::clamp(x, std::optional<int>{}, std::optional<int>{1});
  for (i64 i = 0; i < 5; ++i)
    for (i64 j = 0; j < 8; ++j) {
      const double v = to_d(x.at({i, j}));
      CHECK(to_d(only_lo.at({i, j})) == std::max(v, 0.0));
      CHECK(to_d(only_hi.at({i, j})) == std::min(v, 0.0));
      CHECK(to_d(rt.at({i, j})) == std::min(v, 1.0));
    }
  CHECK(error_of([&] { (void)cg::clamp(x, std::optional<int>{}, std::optional<int>{}); }) ==
        "clamp: at least one of min and max must be given");
}

TEST_CASE("pointwise_ops.clamp.nan_and_crossed_bounds") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto x = cg::tensor<float>::from({nan, -5.f, 0.5f, 5.f}, {4});
  const auto r = cg::clamp(x, -1.f, 1.f).to_vector();
  CHECK(std::isnan(r[0]));  // NaN stays NaN
  CHECK(r[1] == -1.f);
  CHECK(r[2] == 0.5f);
  CHECK(r[3] == 1.f);
  // min > max: every element becomes max (torch.clamp's documented rule).
  CHECK(cg::clamp(x, 2.f, 1.f).to_vector()[1] == 1.f);
  CHECK(cg::clamp(x, 2.f, 1.f).to_vector()[2] == 1.f);
  // A NaN bound gives NaN.
  CHECK(std::isnan(cg::clamp(x, nan, 1.f).to_vector()[2]));
  CHECK(std::isnan(cg::clamp(x, -1.f, nan).to_vector()[2]));
}

// ---------------------------------------------------------------------------------------------
// Comparisons and where
// ---------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("pointwise_ops.compare.matches_double", T, float, double, cg::bf16, cg::f16, std::int32_t, i64,
                   std::uint8_t) {
  // Few distinct values so that ties (==) happen often.
  const auto a = cg::uniform<T>({6, 5}, 0, 4, 61);
  const auto b = cg::uniform<T>({5}, 0, 4, 62);
  auto check = [&](const char* name, const auto& e, auto ref) {
    CAPTURE(name);
    using E = std::remove_cvref_t<decltype(e)>;
    static_assert(std::is_same_v<typename E::value_type, bool>);
    cg::tensor<bool> r = e;
    for (i64 i = 0; i < 6; ++i)
      for (i64 j = 0; j < 5; ++j) CHECK(r.at({i, j}) == ref(to_d(a.at({i, j})), to_d(b.at({j}))));
  };
  check("==", a == b, [](double x, double y) { return x == y; });
  check("!=", a != b, [](double x, double y) { return x != y; });
  check("<", a < b, [](double x, double y) { return x < y; });
  check("<=", a <= b, [](double x, double y) { return x <= y; });
  check(">", a > b, [](double x, double y) { return x > y; });
  check(">=", a >= b, [](double x, double y) { return x >= y; });
  check("eq", cg::eq(a, b), [](double x, double y) { return x == y; });
  check("ne", cg::ne(a, b), [](double x, double y) { return x != y; });
  check("lt", cg::lt(a, b), [](double x, double y) { return x < y; });
  check("le", cg::le(a, b), [](double x, double y) { return x <= y; });
  check("gt", cg::gt(a, b), [](double x, double y) { return x > y; });
  check("ge", cg::ge(a, b), [](double x, double y) { return x >= y; });
  // Scalars on either side, converted to T.
  cg::tensor<bool> s = 2 < a;
  cg::tensor<bool> s2 = cg::ge(a, 2);
  for (i64 i = 0; i < 6; ++i)
    for (i64 j = 0; j < 5; ++j) {
      CHECK(s.at({i, j}) == (2 < to_d(a.at({i, j}))));
      CHECK(s2.at({i, j}) == (to_d(a.at({i, j})) >= 2));
    }
}

TEST_CASE("pointwise_ops.compare.nan_is_unordered") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto a = cg::tensor<float>::from({nan, nan, 1.f}, {3});
  auto b = cg::tensor<float>::from({nan, 1.f, nan}, {3});
  for (const auto& v : {(a == b).to_vector(), (a < b).to_vector(), (a <= b).to_vector(), (a > b).to_vector(),
                        (a >= b).to_vector()})
    CHECK(v == std::vector<bool>{false, false, false});
  CHECK((a != b).to_vector() == std::vector<bool>{true, true, true});
  // bf16 compares the bf16 values: the scalar is rounded to bf16 first, as in PyTorch.
  auto h = cg::full<cg::bf16>({1}, cg::bf16(0.1f));
  CHECK((h == 0.1).to_vector()[0]);
  CHECK(!(h < 0.1).to_vector()[0]);
}

TEST_CASE("pointwise_ops.where.broadcasts_all_three") {
  const auto c = cg::uniform<bool>({4, 1, 3}, 0, 1, 71);
  const auto a = cg::uniform<float>({5, 3}, -1, 1, 72);
  const auto b = cg::uniform<float>({3}, -1, 1, 73);
  cg::tensor<float> r = cg::where(c, a, b);
  REQUIRE(r.shape() == cg::shape_t{4, 5, 3});
  for (i64 i = 0; i < 4; ++i)
    for (i64 j = 0; j < 5; ++j)
      for (i64 k = 0; k < 3; ++k) CHECK(r.at({i, j, k}) == (c.at({i, 0, k}) ? a.at({j, k}) : b.at({k})));
  // Scalars for a or b (converted to the other's type), both scalars (their common type).
  cg::tensor<float> s = cg::where(a > 0, a, 0);
  cg::tensor<float> s2 = cg::where(a > 0, -1, a);
  auto both = cg::where(a > 0, 1.0, 0.0);
  static_assert(std::is_same_v<decltype(both)::value_type, double>);
  static_assert(std::is_same_v<decltype(cg::where(a > 0, 1, 2))::value_type, int>);
  const auto av = a.to_vector(), sv = s.to_vector(), s2v = s2.to_vector();
  const auto bv = both.to_vector();
  for (std::size_t i = 0; i < av.size(); ++i) {
    CHECK(sv[i] == (av[i] > 0 ? av[i] : 0.f));
    CHECK(s2v[i] == (av[i] > 0 ? -1.f : av[i]));
    CHECK(bv[i] == (av[i] > 0 ? 1.0 : 0.0));
  }
  // A strided condition and operands.
  const auto t = cg::uniform<float>({3, 5}, -1, 1, 74);
  cg::tensor<float> st = cg::where(t.transpose(0, 1) < a, a, t.transpose(0, 1));
  for (i64 j = 0; j < 5; ++j)
    for (i64 k = 0; k < 3; ++k) CHECK(st.at({j, k}) == std::max(t.at({k, j}), a.at({j, k})));
  // Shape errors name the op and both shapes.
  CHECK(contains(error_of([&] { (void)cg::where(cg::tensor<bool>::empty({2}), a, b); }),
                 "where: shapes [2] and [5, 3] cannot be broadcast together"));
}

TEST_CASE("pointwise_ops.mixed_dtypes_in_one_loop") {
  // A condition from integers selecting between float operands, a cast inside the loop, a bool
  // result of a float chain: one expression each, evaluated in one loop.
  const auto i = cg::uniform<std::int32_t>({4, 6}, -3, 3, 81);
  const auto f = cg::uniform<float>({4, 6}, -1, 1, 82);
  const auto g = cg::uniform<float>({6}, -1, 1, 83);
  auto e = cg::where(i > 0, f * 2.f, g) + cg::cast<float>(i);
  static_assert(std::is_same_v<decltype(e)::value_type, float>);
  static_assert(cg::count_ops_v<decltype(e), cg::ops::gt> == 1);
  static_assert(cg::count_ops_v<decltype(e), cg::ops::to<float>> == 1);
  static_assert(cg::fused_name_v<decltype(e)> == "fused_gt_mul_where_to_f32_add");
  cg::tensor<float> r = e;
  cg::tensor<bool> m = cg::abs(f - g) <= 0.5f;
  cg::tensor<cg::bf16> h = (f * 3.f).to<cg::bf16>();
  cg::tensor<i64> k = cg::cast<i64>(f * 10.f);
  for (i64 a = 0; a < 4; ++a)
    for (i64 b = 0; b < 6; ++b) {
      const float fv = f.at({a, b}), gv = g.at({b});
      const std::int32_t iv = i.at({a, b});
      CHECK(r.at({a, b}) == (iv > 0 ? fv * 2.f : gv) + static_cast<float>(iv));
      CHECK(m.at({a, b}) == (std::abs(fv - gv) <= 0.5f));
      CHECK(h.at({a, b}).bits == cg::bf16(fv * 3.f).bits);
      CHECK(k.at({a, b}) == static_cast<i64>(fv * 10.f));  // truncates toward zero, as .to<i64>()
    }
  // A bool expression to float counts: (a > 0).to<float>().
  cg::tensor<float> ones = (f > 0).to<float>();
  float count = 0;
  for (float v : ones.to_vector()) count += v;
  std::size_t want = 0;
  for (float v : f.to_vector()) want += v > 0 ? 1 : 0;
  CHECK(count == static_cast<float>(want));
}

TEST_CASE("pointwise_ops.scalars_keep_their_precision_in_16_bit_floats") {
  // An arithmetic op takes its scalar in f32 and rounds its result once, as PyTorch's opmath
  // scalars: 1 - 0.999 in bf16 is bf16(0.001f), where rounding 0.999 to bf16 (1) first gave 0
  // (and AdamW's 1 - beta2^t with it).
  const auto one = cg::full<cg::bf16>({2}, cg::bf16(1.f));
  const cg::tensor<cg::bf16> d = one - 0.999;
  CHECK(d.to_vector()[0].bits == cg::bf16(1.f - 0.999f).bits);
  CHECK(float(d.to_vector()[0]) > 0.f);
  const auto x = cg::uniform<cg::f16>({37}, -4, 4, 93);
  const cg::tensor<cg::f16> y = x * 0.999 + 1e-4;
  const auto xv = x.to_vector(), yv = y.to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const cg::f16 prod(float(xv[i]) * 0.999f);  // each op rounds once to f16
    CHECK(yv[i].bits == cg::f16(float(prod) + 1e-4f).bits);
  }
  // Comparisons still round the scalar to the tensor's type first (see compare.nan_is_unordered),
  // and where rounds the scalar it picks.
  const cg::tensor<cg::bf16> w = cg::where(one > 0.5, 0.999, one);
  CHECK(w.to_vector()[0].bits == cg::bf16(0.999f).bits);
}

TEST_CASE("pointwise_ops.fused_equals_op_by_op") {
  // One rounding per op: fusing a bf16 chain with the new ops changes nothing, bit for bit.
  const auto a = cg::uniform<cg::bf16>({19, 13}, -3, 3, 91);
  const auto b = cg::uniform<cg::bf16>({13}, 0.5, 2, 92);
  cg::tensor<cg::bf16> fused =
      cg::where(a > b, cg::pow(b, a) * cg::erf(a), cg::clamp(cg::rsqrt(b) - a, -1, 1)) + cg::round(a * 4) / 4;
  cg::tensor<bool> t1 = a > b;
  cg::tensor<cg::bf16> t2 = cg::pow(b, a);
  cg::tensor<cg::bf16> t3 = cg::erf(a);
  cg::tensor<cg::bf16> t4 = t2 * t3;
  cg::tensor<cg::bf16> t5 = cg::rsqrt(b);
  cg::tensor<cg::bf16> t6 = t5 - a;
  cg::tensor<cg::bf16> t7 = cg::clamp(t6, -1, 1);
  cg::tensor<cg::bf16> t8 = cg::where(t1, t4, t7);
  cg::tensor<cg::bf16> t9 = a * 4;
  cg::tensor<cg::bf16> t10 = cg::round(t9);
  cg::tensor<cg::bf16> t11 = t10 / 4;
  cg::tensor<cg::bf16> t12 = t8 + t11;
  pw_check_same_bits(fused, t12);
}

// ---------------------------------------------------------------------------------------------
// dropout
// ---------------------------------------------------------------------------------------------

TEST_CASE("pointwise_ops.dropout.edge_cases") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto x = cg::tensor<float>::from({1.f, -2.f, nan, -0.f, 3.f}, {5});
  cg::generator g(5);
  const auto before = g.state();
  // p = 0 and eval mode: the values themselves (NaN and -0 included), nothing drawn.
  pw_check_same_bits(cg::tensor<float>(cg::dropout(x, 0.0, g)), x);
  pw_check_same_bits(cg::tensor<float>(cg::dropout(x, 0.7, g, /*training=*/false)), x);
  CHECK(g.state() == before);
  // p = 1: x * 0 (a NaN stays NaN, as PyTorch's multiplication by zeros).
  const auto z = cg::tensor<float>(cg::dropout(x, 1.0, g)).to_vector();
  CHECK(z[0] == 0.f);
  CHECK(std::signbit(z[1]));
  CHECK(std::isnan(z[2]));
  CHECK(g.state() == before);
  // p outside [0, 1]: PyTorch's error.
  CHECK(error_of([&] { (void)cg::dropout(x, 1.5); }) == "dropout: dropout probability has to be between 0 and 1, but got 1.5");
  CHECK(error_of([&] { (void)cg::dropout(x, -0.1); }) == "dropout: dropout probability has to be between 0 and 1, but got -0.1");
}

TEST_CASE_TEMPLATE("pointwise_ops.dropout.keeps_and_scales", T, float, double, cg::bf16, cg::f16) {
  constexpr i64 n = 1 << 20;
  const double p = 0.3;
  const auto x = cg::uniform<T>({n}, 0.5, 2, 101);  // no zeros: a zero result means dropped
  cg::generator g(7);
  cg::tensor<T> y = cg::dropout(x, p, g);
  CHECK(g.offset() == static_cast<std::uint64_t>(n / 4));  // one 32-bit word per element
  using C = cg::compute_t<T>;
  const C scale = static_cast<C>(1.0 / (1.0 - p));
  const auto xv = x.to_vector(), yv = y.to_vector();
  i64 kept = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    if (to_d(yv[i]) == 0) continue;
    ++kept;
    // Kept values are x * (1 / (1 - p)) in the compute type, rounded once.
    if (!pw_same_bits(yv[i], cg::detail::cast<T>(static_cast<C>(xv[i]) * scale))) {
      FAIL_CHECK("kept element " << i << " is not x * scale");
      break;
    }
  }
  // The kept fraction is 1 - p within 5 standard deviations (sd = sqrt(p (1 - p) / n)).
  const double frac = static_cast<double>(kept) / n;
  CHECK(std::abs(frac - (1 - p)) < 5 * std::sqrt(p * (1 - p) / n));
}

TEST_CASE("pointwise_ops.dropout.reproducible_and_fresh") {
  const auto x = cg::uniform<float>({64, 33}, -1, 1, 111);
  cg::generator g(9);
  const auto s0 = g.state();
  auto d = cg::dropout(x, 0.5, g);
  // One expression is one draw: evaluating it twice gives one mask.
  pw_check_same_bits(cg::tensor<float>(d), cg::tensor<float>(d));
  // The next call draws a new mask; the same state draws the same one.
  cg::tensor<float> second = cg::dropout(x, 0.5, g);
  CHECK(cg::tensor<float>(d).to_vector() != second.to_vector());
  g.set_state(s0);
  pw_check_same_bits(cg::tensor<float>(cg::dropout(x, 0.5, g)), cg::tensor<float>(d));
  // Default generator: manual_seed makes it reproducible; two calls differ.
  cg::manual_seed(2024);
  cg::tensor<float> a1 = cg::dropout(x, 0.5);
  cg::tensor<float> a2 = cg::dropout(x, 0.5);
  cg::manual_seed(2024);
  cg::tensor<float> b1 = cg::dropout(x, 0.5);
  pw_check_same_bits(a1, b1);
  CHECK(a1.to_vector() != a2.to_vector());
}

TEST_CASE("pointwise_ops.dropout.fuses_and_broadcasts") {
  const auto a = cg::uniform<float>({16, 24}, -1, 1, 121);
  const auto b = cg::uniform<float>({24}, -1, 1, 122);
  // Fused with its producers and consumers: the mask equals dropout of the evaluated operand
  // from the same generator state, bit for bit.
  cg::generator g1(3), g2(3);
  auto e = cg::dropout(cg::relu(a) + b, 0.25, g1) * 2.f;
  static_assert(cg::random_count_v<decltype(e)> == 1);
  static_assert(cg::fused_name_v<decltype(e)> == "fused_relu_add_dropout_mul");
  cg::tensor<float> fused = e;
  cg::tensor<float> t1 = cg::relu(a) + b;
  cg::tensor<float> t2 = cg::dropout(t1, 0.25, g2);
  cg::tensor<float> t3 = t2 * 2.f;
  pw_check_same_bits(fused, t3);
  // The mask of dropout(row) broadcasts with the row: each column is kept or dropped in every
  // row alike.
  cg::generator g3(4);
  cg::tensor<float> r = cg::dropout(cg::full<float>({24}, 1.f), 0.5, g3) + cg::zeros<float>({16, 24});
  for (i64 j = 0; j < 24; ++j)
    for (i64 i = 1; i < 16; ++i) CHECK(r.at({i, j}) == r.at({0, j}));
  // A strided operand: the mask is indexed by the operand's own element order.
  cg::generator g4(6), g5(6);
  cg::tensor<float> strided = cg::dropout(a.transpose(0, 1), 0.5, g4);
  cg::tensor<float> contiguous = cg::dropout(a.transpose(0, 1).contiguous(), 0.5, g5);
  pw_check_same_bits(strided, contiguous);
}
