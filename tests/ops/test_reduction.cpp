// tests/ops/test_reduction.cpp: the reductions of ccgraph/ops/reduction.hpp on the CPU against
// naive double-precision references: every dtype, dims given or not, negative and repeated dims,
// keepdim, strided inputs, empty reductions, NaN / tie rules, the backward kernels (against
// analytic values and central finite differences), and every error message.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <ccgraph/ops/reduction.hpp>

#include "ops/reduction_support.hpp"
#include "support.hpp"

// A named namespace: test files are compiled in unity batches, so nothing here may leak into
// the next file's scope (the using-directive included).
namespace reduction_tests {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using namespace ccgraph_test::red;
using ccgraph_test::contains;
using ccgraph_test::error_of;

namespace {

/// A reduction case: input shape and dims (empty: all).
struct reduce_case {
  cg::shape_t shape;
  std::vector<i64> dims;
};

const std::vector<reduce_case>& reduce_cases() {
  static const std::vector<reduce_case> cases = {
      {{3, 4, 5}, {}},     {{3, 4, 5}, {0}},    {{3, 4, 5}, {1}},  {{3, 4, 5}, {-1}},
      {{3, 4, 5}, {0, 2}}, {{3, 4, 5}, {2, 0}}, {{3, 4, 5}, {0, 1, 2}}, {{3, 4, 5}, {-2, -3}},
      {{7}, {0}},          {{}, {}},            {{}, {0}},         {{2, 0, 3}, {1}},
      {{2, 0, 3}, {0}},    {{2, 1, 3}, {1}},    {{1, 6}, {0}},     {{5, 2, 2, 3}, {1, 3}}};
  return cases;
}

std::string case_name(const reduce_case& c, bool keepdim, bool strided) {
  return cg::shape_str(c.shape) + " dims " + cg::list_str(c.dims) + (keepdim ? " keepdim" : "") +
         (strided ? " strided" : "");
}

/// Runs `f(input, case, keepdim, name)` for every case, keepdim on and off, contiguous and
/// strided inputs (integers in [lo, hi)).
template <class T, class F>
void for_each_reduce_case(F&& f, double lo = -2.0, double hi = 2.0) {
  std::uint64_t seed = 1;
  for (const reduce_case& c : reduce_cases())
    for (bool keepdim : {false, true})
      for (bool strided : {false, true}) {
        const cg::tensor<T> x = strided ? rnd_strided<T>(c.shape, seed, lo, hi) : rnd<T>(c.shape, seed, lo, hi);
        ++seed;
        f(x, c, keepdim, type_name<T>() + " " + case_name(c, keepdim, strided));
      }
}

/// The reduced shape of a case, as the naive definition has it.
cg::shape_t expected_shape(const reduce_case& c, bool keepdim) {
  const std::vector<bool> mask = cd::reduce_mask(c.shape, c.dims, "test");
  cg::shape_t s;
  for (std::size_t d = 0; d < c.shape.size(); ++d) {
    if (!mask[d]) s.push_back(c.shape[d]);
    else if (keepdim) s.push_back(1);
  }
  return s;
}

template <class T>
void check_sum() {
  using U = cd::sum_t<T>;
  for_each_reduce_case<T>([](const cg::tensor<T>& x, const reduce_case& c, bool keepdim, const std::string& name) {
    const auto groups = reduce_groups(c.shape, cd::reduce_mask(c.shape, c.dims, "sum"));
    const std::vector<double> v = values(x);
    std::vector<double> want;
    double scale = 0;
    for (const auto& g : groups) {
      double s = 0;
      for (i64 e : g) {
        s += v[static_cast<std::size_t>(e)];
        scale = std::max(scale, std::abs(v[static_cast<std::size_t>(e)]) * static_cast<double>(g.size()));
      }
      want.push_back(s);
    }
    const auto out = cg::tensor<U>::empty(expected_shape(c, keepdim));
    cd::sum_cpu(x, c.dims, keepdim, out);
    check_close(out, want, 1e-6 * scale, tol<U>(), "sum " + name);
  });
}

template <class T>
void check_mean_var() {
  for_each_reduce_case<T>([](const cg::tensor<T>& x, const reduce_case& c, bool keepdim, const std::string& name) {
    const auto groups = reduce_groups(c.shape, cd::reduce_mask(c.shape, c.dims, "mean"));
    const std::vector<double> v = values(x);
    for (double correction : {1.0, 0.0, 2.5}) {
      std::vector<double> want_mean, want_var;
      for (const auto& g : groups) {
        double s = 0;
        for (i64 e : g) s += v[static_cast<std::size_t>(e)];
        const double n = static_cast<double>(g.size());
        const double mean = s / n;  // 0 / 0 = NaN for an empty group, as PyTorch
        double ss = 0;
        for (i64 e : g) ss += (v[static_cast<std::size_t>(e)] - mean) * (v[static_cast<std::size_t>(e)] - mean);
        want_mean.push_back(mean);
        want_var.push_back(ss / std::max(0.0, n - correction));
      }
      const auto mean = cg::tensor<T>::empty(expected_shape(c, keepdim));
      const auto var = cg::tensor<T>::empty(expected_shape(c, keepdim));
      cd::mean_cpu(x, c.dims, keepdim, mean);
      cd::var_cpu(x, c.dims, correction, keepdim, var);
      check_close(mean, want_mean, 1e-6, tol<T>(), "mean " + name);
      check_close(var, want_var, 1e-5, 4 * tol<T>(), "var(correction " + std::to_string(correction) + ") " + name);
    }
  });
}

/// The index of the first extreme of `v` at `g` (NaN first), and the extreme.
std::pair<i64, double> ref_extreme(const std::vector<double>& v, const std::vector<i64>& g, bool max) {
  i64 best = 0;
  for (i64 r = 0; r < static_cast<i64>(g.size()); ++r) {
    const double x = v[static_cast<std::size_t>(g[static_cast<std::size_t>(r)])];
    const double b = v[static_cast<std::size_t>(g[static_cast<std::size_t>(best)])];
    if (std::isnan(b)) break;
    if (std::isnan(x) || (max ? x > b : x < b)) best = r;
  }
  return {best, v[static_cast<std::size_t>(g[static_cast<std::size_t>(best)])]};
}

template <class T>
void check_extremes(double lo, double hi) {
  for_each_reduce_case<T>(
      [](const cg::tensor<T>& x, const reduce_case& c, bool keepdim, const std::string& name) {
        const std::vector<bool> mask = cd::reduce_mask(c.shape, c.dims, "amax");
        if (cd::reduce_count(c.shape, mask) == 0 && cg::numel_of(expected_shape(c, false)) > 0) return;  // errors
        const auto groups = reduce_groups(c.shape, mask);
        const std::vector<double> v = values(x);
        for (bool max : {true, false}) {
          std::vector<double> want;
          for (const auto& g : groups) want.push_back(ref_extreme(v, g, max).second);
          const auto out = cg::tensor<T>::empty(expected_shape(c, keepdim));
          (max ? cd::amax_cpu<T> : cd::amin_cpu<T>)(x, c.dims, keepdim, out);
          check_close(out, want, 0, 0, (max ? "amax " : "amin ") + name);
        }
        // max(dim) / min(dim) / argmax / argmin for single dims.
        if (c.dims.size() != 1) return;
        for (bool max : {true, false}) {
          std::vector<double> want_v, want_i;
          for (const auto& g : groups) {
            const auto [i, val] = ref_extreme(v, g, max);
            want_i.push_back(static_cast<double>(i));
            want_v.push_back(val);
          }
          const cg::shape_t s = expected_shape(c, keepdim);
          const auto values_out = cg::tensor<T>::empty(s);
          const auto indices = cg::tensor<i64>::empty(s);
          const auto arg = cg::tensor<i64>::empty(s);
          (max ? cd::max_dim_cpu<T> : cd::min_dim_cpu<T>)(x, c.dims[0], keepdim, values_out, indices);
          (max ? cd::argmax_cpu<T> : cd::argmin_cpu<T>)(x, c.dims[0], keepdim, arg);
          check_close(values_out, want_v, 0, 0, (max ? "max(dim) values " : "min(dim) values ") + name);
          check_close(indices, want_i, 0, 0, (max ? "max(dim) indices " : "min(dim) indices ") + name);
          check_close(arg, want_i, 0, 0, (max ? "argmax(dim) " : "argmin(dim) ") + name);
        }
      },
      lo, hi);
}

/// argmax / max over every element: the flattened (logical row-major) index.
template <class T>
void check_full_extremes() {
  for (bool strided : {false, true}) {
    const cg::shape_t shape{4, 3, 5};
    const cg::tensor<T> x = strided ? rnd_strided<T>(shape, 77, -3, 3) : rnd<T>(shape, 77, -3, 3);
    const std::vector<double> v = values(x);
    std::vector<i64> all(v.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<i64>(i);
    for (bool max : {true, false}) {
      const auto [i, val] = ref_extreme(v, all, max);
      const auto m = cg::tensor<T>::empty({});
      (max ? cd::max_cpu<T> : cd::min_cpu<T>)(x, m);
      CHECK(dbl(m.item()) == val);
      for (bool keepdim : {false, true}) {
        const auto a = cg::tensor<i64>::empty(keepdim ? cg::shape_t{1, 1, 1} : cg::shape_t{});
        (max ? cd::argmax_cpu<T> : cd::argmin_cpu<T>)(x, std::nullopt, keepdim, a);
        CHECK(a.to_vector()[0] == i);
      }
    }
  }
}

}  // namespace

TEST_CASE("reduction.shape.keepdim_and_dims") {
  CHECK(cd::reduce_shape({3, 4, 5}, std::vector<i64>{1}, false, "sum") == cg::shape_t{3, 5});
  CHECK(cd::reduce_shape({3, 4, 5}, std::vector<i64>{1}, true, "sum") == cg::shape_t{3, 1, 5});
  CHECK(cd::reduce_shape({3, 4, 5}, std::vector<i64>{}, false, "sum") == cg::shape_t{});
  CHECK(cd::reduce_shape({3, 4, 5}, std::vector<i64>{}, true, "sum") == cg::shape_t{1, 1, 1});
  CHECK(cd::reduce_shape({3, 4, 5}, std::vector<i64>{-1, 0}, false, "sum") == cg::shape_t{4});
  CHECK(cd::reduce_shape({}, std::vector<i64>{0}, true, "sum") == cg::shape_t{});
  CHECK(cd::reduce_shape({}, std::vector<i64>{-1}, false, "sum") == cg::shape_t{});
}

TEST_CASE("reduction.meta.dtypes") {
  // PyTorch: integer and bool sums promote to i64; floats keep their dtype.
  static_assert(std::is_same_v<cd::sum_t<std::int32_t>, std::int64_t>);
  static_assert(std::is_same_v<cd::sum_t<bool>, std::int64_t>);
  static_assert(std::is_same_v<cd::sum_t<std::uint8_t>, std::int64_t>);
  static_assert(std::is_same_v<cd::sum_t<cg::bf16>, cg::bf16>);
  CHECK(cd::sum_meta({cg::dtype::i32, {2, 3}}, {1}, false) == cg::tensor_meta{cg::dtype::i64, {2}});
  CHECK(cd::sum_meta({cg::dtype::boolean, {2, 3}}, {}, true) == cg::tensor_meta{cg::dtype::i64, {1, 1}});
  CHECK(cd::sum_meta({cg::dtype::bf16, {2, 3}}, {0}, false) == cg::tensor_meta{cg::dtype::bf16, {3}});
  CHECK(cd::mean_meta({cg::dtype::f16, {2, 3}}, {0}, true) == cg::tensor_meta{cg::dtype::f16, {1, 3}});
  CHECK(cd::var_meta({cg::dtype::f64, {2, 3}}, {1}, 0.0, false) == cg::tensor_meta{cg::dtype::f64, {2}});
  CHECK(cd::amax_meta({cg::dtype::u8, {2, 3}}, {0, 1}, false) == cg::tensor_meta{cg::dtype::u8, {}});
  const auto md = cd::max_dim_meta({cg::dtype::f32, {2, 3}}, -1, true);
  CHECK(md[0] == cg::tensor_meta{cg::dtype::f32, {2, 1}});
  CHECK(md[1] == cg::tensor_meta{cg::dtype::i64, {2, 1}});
  CHECK(cd::max_all_meta({cg::dtype::i32, {2, 3}}) == cg::tensor_meta{cg::dtype::i32, {}});
  CHECK(cd::argmax_meta({cg::dtype::f32, {2, 3}}, std::nullopt, false) == cg::tensor_meta{cg::dtype::i64, {}});
  CHECK(cd::argmax_meta({cg::dtype::f32, {2, 3}}, std::nullopt, true) == cg::tensor_meta{cg::dtype::i64, {1, 1}});
  CHECK(cd::argmax_meta({cg::dtype::f32, {2, 3}}, 0, false) == cg::tensor_meta{cg::dtype::i64, {3}});
}

TEST_CASE("reduction.errors") {
  CHECK(contains(error_of([] { (void)cd::sum_meta({cg::dtype::f32, {2, 3}}, {2}, false); }),
                 "sum: dim 2 is out of range for a tensor of rank 2"));
  CHECK(contains(error_of([] { (void)cd::sum_meta({cg::dtype::f32, {2, 3}}, {-3}, false); }),
                 "sum: dim -3 is out of range for a tensor of rank 2"));
  CHECK(contains(error_of([] { (void)cd::sum_meta({cg::dtype::f32, {2, 3}}, {1, -1}, false); }),
                 "sum: dim 1 appears multiple times in the list of dims [1, -1]"));
  CHECK(contains(error_of([] { (void)cd::mean_meta({cg::dtype::i32, {2, 3}}, {}, false); }),
                 "mean: input dtype i32 is not a floating point type"));
  CHECK(contains(error_of([] { (void)cd::var_meta({cg::dtype::i64, {2, 3}}, {}, 1.0, false); }),
                 "var: input dtype i64 is not a floating point type"));
  CHECK(contains(error_of([] { (void)cd::var_meta({cg::dtype::f32, {2, 3}}, {}, INFINITY, false); }),
                 "var: correction must be finite"));
  CHECK(contains(error_of([] { (void)cd::amax_meta({cg::dtype::f32, {2, 0, 3}}, {1}, false); }),
                 "amax: cannot reduce dim 1 of size 0 (input shape [2, 0, 3])"));
  CHECK(contains(error_of([] { (void)cd::amax_meta({cg::dtype::f32, {0, 3}}, {}, false, "amin"); }),
                 "amin: cannot reduce dim 0 of size 0"));
  CHECK(contains(error_of([] { (void)cd::max_dim_meta({cg::dtype::f32, {0, 3}}, 0, false); }),
                 "max: cannot reduce dim 0 of size 0"));
  CHECK(contains(error_of([] { (void)cd::max_dim_meta({cg::dtype::f32, {2, 3}}, 2, false, "min"); }),
                 "min: dim 2 is out of range for a tensor of rank 2"));
  CHECK(contains(error_of([] { (void)cd::max_all_meta({cg::dtype::f32, {0, 3}}); }),
                 "max: input of shape [0, 3] has no elements; give a dim to reduce over"));
  CHECK(contains(error_of([] { (void)cd::argmax_meta({cg::dtype::f32, {2, 0}}, std::nullopt, false); }),
                 "argmax: input of shape [2, 0] has no elements"));
  CHECK(contains(error_of([] { (void)cd::argmax_meta({cg::dtype::f32, {2, 0}}, 1, false, "argmin"); }),
                 "argmin: cannot reduce dim 1 of size 0"));
  // Reducing a non-empty dim of a tensor with no elements is fine: an empty result.
  CHECK(cd::amax_meta({cg::dtype::f32, {2, 0, 3}}, {0}, false).shape == cg::shape_t{0, 3});
  // The kernels check the outputs they are handed.
  const auto x = rnd<float>({2, 3}, 1);
  CHECK(contains(error_of([&] { cd::sum_cpu(x, {1}, false, cg::tensor<float>::empty({3})); }),
                 "sum: output has shape [3], expected [2]"));
  CHECK(contains(error_of([&] { cd::mean_cpu(x, {1}, false, cg::tensor<float>::empty({2, 2}).narrow(1, 0, 1).select(1, 0)); }),
                 "mean: output of shape [2] must be contiguous"));
}

TEST_CASE("reduction.sum.every_dtype") {
  check_sum<float>();
  check_sum<double>();
  check_sum<cg::bf16>();
  check_sum<cg::f16>();
  check_sum<std::int32_t>();
  check_sum<std::int64_t>();
  check_sum<std::uint8_t>();
  check_sum<bool>();
}

TEST_CASE("reduction.sum.bool_counts_and_int_promotes") {
  const auto b = cg::tensor<bool>::from({true, false, true, true, false, true}, {2, 3});
  auto out = cg::tensor<i64>::empty({3});
  cd::sum_cpu(b, {0}, false, out);
  CHECK(out.to_vector() == std::vector<i64>{2, 0, 2});
  // i32 sums past 2^31 do not wrap: they are i64 (PyTorch's promotion).
  const auto big = cg::full<std::int32_t>({4}, 2'000'000'000);
  auto s = cg::tensor<i64>::empty({});
  cd::sum_cpu(big, {}, false, s);
  CHECK(s.item() == 8'000'000'000);
}

TEST_CASE("reduction.mean_var.floating_dtypes") {
  check_mean_var<float>();
  check_mean_var<double>();
  check_mean_var<cg::bf16>();
  check_mean_var<cg::f16>();
}

TEST_CASE("reduction.var.known_values") {
  // torch.var([1, 2, 3, 4]) = 1.6667; correction 0: 1.25; one element: NaN (0 / 0).
  const auto x = cg::tensor<double>::from({1, 2, 3, 4}, {4});
  auto v = cg::tensor<double>::empty({});
  cd::var_cpu(x, {}, 1.0, false, v);
  CHECK(v.item() == doctest::Approx(5.0 / 3.0).epsilon(1e-14));
  cd::var_cpu(x, {}, 0.0, false, v);
  CHECK(v.item() == doctest::Approx(1.25).epsilon(1e-14));
  cd::var_cpu(cg::tensor<double>::from({3}, {1}), {}, 1.0, false, v);
  CHECK(std::isnan(v.item()));
  // correction larger than the count: positive / 0 = inf.
  cd::var_cpu(x, {}, 4.0, false, v);
  CHECK(std::isinf(v.item()));
  // A large offset: Welford keeps the digits a naive sum of squares loses.
  const auto shifted = cg::tensor<float>::from({1e4f + 1, 1e4f + 2, 1e4f + 3, 1e4f + 4}, {4});
  auto vf = cg::tensor<float>::empty({});
  cd::var_cpu(shifted, {}, 1.0, false, vf);
  CHECK(vf.item() == doctest::Approx(5.0 / 3.0).epsilon(1e-6));
}

TEST_CASE("reduction.extremes.every_dtype") {
  check_extremes<float>(-2, 2);
  check_extremes<double>(-2, 2);
  check_extremes<cg::bf16>(-2, 2);
  check_extremes<cg::f16>(-2, 2);
  check_extremes<std::int32_t>(-3, 3);  // few distinct values: many ties
  check_extremes<std::int64_t>(-1e12, 1e12);
  check_extremes<std::uint8_t>(0, 4);
  check_extremes<bool>(0, 1);
  check_full_extremes<float>();
  check_full_extremes<cg::bf16>();
  check_full_extremes<std::int32_t>();
}

TEST_CASE("reduction.extremes.nan_and_ties") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Row 0: a tie (first index wins); row 1: NaN propagates with its first index; row 2: -inf.
  const auto x = cg::tensor<float>::from({1, 5, 5, 2, 3, nan, 1, nan, -INFINITY, -INFINITY, -INFINITY, -INFINITY}, {3, 4});
  auto v = cg::tensor<float>::empty({3});
  auto i = cg::tensor<i64>::empty({3});
  cd::max_dim_cpu(x, 1, false, v, i);
  CHECK(v.to_vector()[0] == 5);
  CHECK(std::isnan(v.to_vector()[1]));
  CHECK(v.to_vector()[2] == -INFINITY);
  CHECK(i.to_vector() == std::vector<i64>{1, 1, 0});
  cd::min_dim_cpu(x, 1, false, v, i);
  CHECK(v.to_vector()[0] == 1);
  CHECK(std::isnan(v.to_vector()[1]));
  CHECK(i.to_vector() == std::vector<i64>{0, 1, 0});
  cd::amax_cpu(x, {1}, false, v);
  CHECK(std::isnan(v.to_vector()[1]));
  auto a = cg::tensor<i64>::empty({});
  cd::argmax_cpu(x, std::nullopt, false, a);
  CHECK(a.item() == 5);  // the first NaN, flattened
  auto m = cg::tensor<float>::empty({});
  cd::min_cpu(x, m);
  CHECK(std::isnan(m.item()));
  // 0-d input: dim 0 / -1 reduce the single element.
  const auto s = cg::tensor<float>::from({7}, {});
  auto sv = cg::tensor<float>::empty({});
  auto si = cg::tensor<i64>::empty({});
  cd::max_dim_cpu(s, -1, true, sv, si);
  CHECK(sv.item() == 7);
  CHECK(si.item() == 0);
}

TEST_CASE("reduction.empty_reductions") {
  const auto x = cg::tensor<float>::empty({2, 0, 3});
  auto s = cg::tensor<float>::empty({2, 3});
  cd::sum_cpu(x, {1}, false, s);
  CHECK(s.to_vector() == std::vector<float>(6, 0.0f));
  cd::mean_cpu(x, {1}, false, s);
  for (float v : s.to_vector()) CHECK(std::isnan(v));
  cd::var_cpu(x, {1}, 1.0, false, s);
  for (float v : s.to_vector()) CHECK(std::isnan(v));
  auto e = cg::tensor<float>::empty({0, 3});
  cd::amax_cpu(x, {0}, false, e);  // an empty result: nothing to compute
  CHECK(e.numel() == 0);
}

// ---- backward -------------------------------------------------------------------------------


TEST_CASE("reduction.backward.amax_splits_ties_evenly") {
  // amax over dim 1: row 0 has a three-way tie, row 1 a single max, row 2 NaN (NaN everywhere,
  // as PyTorch's scale_grad_by_count gives).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto x = cg::tensor<double>::from({4, 1, 4, 4, 0, 9, 3, 2, nan, 1}, {2, 5});
  const auto res = cg::tensor<double>::empty({2, 1});
  cd::amax_cpu(x, {1}, true, res);
  const auto g = cg::tensor<double>::from({6, 10}, {2, 1});
  auto dx = cg::tensor<double>::empty({2, 5});
  cd::amax_backward_cpu(g, x, res, {1}, true, dx);
  const auto d = dx.to_vector();
  CHECK(d[0] == 2);
  CHECK(d[1] == 0);
  CHECK(d[2] == 2);
  CHECK(d[3] == 2);
  CHECK(d[4] == 0);
  for (int k = 5; k < 10; ++k) CHECK(std::isnan(d[static_cast<std::size_t>(k)]));
  // max() without dim: ties split too; a NaN result sends the gradient to the NaN elements only.
  auto m = cg::tensor<double>::empty({});
  const auto x2 = cg::tensor<double>::from({3, 7, 7, nan, 1, nan}, {2, 3});
  cd::max_cpu(x2, m);
  auto d2 = cg::tensor<double>::empty({2, 3});
  cd::max_backward_cpu(cg::tensor<double>::from({4}, {}), x2, m, d2);
  CHECK(d2.to_vector() == std::vector<double>{0, 0, 0, 2, 0, 2});
  const auto x3 = cg::tensor<double>::from({3, 7, 7, 1, 1, 0}, {2, 3});
  cd::max_cpu(x3, m);
  cd::max_backward_cpu(cg::tensor<double>::from({4}, {}), x3, m, d2);
  CHECK(d2.to_vector() == std::vector<double>{0, 2, 2, 0, 0, 0});
}

TEST_CASE("reduction.backward.amax_dims_not_kept_and_strided") {
  for (bool keepdim : {false, true}) {
    const auto x = rnd_strided<float>({3, 4, 5}, 11, -3, 3).to<cg::bf16>();  // bf16: ties happen
    const cg::shape_t s = keepdim ? cg::shape_t{3, 1, 1} : cg::shape_t{3};
    auto res = cg::tensor<cg::bf16>::empty(s);
    cd::amax_cpu(x, {1, 2}, keepdim, res);
    const auto g = rnd<cg::bf16>(s, 12);
    auto dx = cg::tensor<cg::bf16>::empty({3, 4, 5});
    cd::amax_backward_cpu(g, x, res, {1, 2}, keepdim, dx);
    const auto xv = values(x), gv = values(g), rv = values(res);
    std::vector<double> want(60);
    for (int a = 0; a < 3; ++a) {
      int count = 0;
      for (int k = 0; k < 20; ++k) count += xv[static_cast<std::size_t>(a * 20 + k)] == rv[static_cast<std::size_t>(a)];
      for (int k = 0; k < 20; ++k)
        want[static_cast<std::size_t>(a * 20 + k)] =
            xv[static_cast<std::size_t>(a * 20 + k)] == rv[static_cast<std::size_t>(a)] ? gv[static_cast<std::size_t>(a)] / count : 0;
    }
    check_close(dx, want, 0, tol<cg::bf16>(), "amax_backward bf16");
  }
}

TEST_CASE("reduction.backward.max_dim_routes_to_the_index") {
  for (bool keepdim : {false, true}) {
    const auto x = rnd<float>({3, 4, 2}, 5);
    const cg::shape_t s = keepdim ? cg::shape_t{3, 1, 2} : cg::shape_t{3, 2};
    auto v = cg::tensor<float>::empty(s);
    auto i = cg::tensor<i64>::empty(s);
    cd::max_dim_cpu(x, 1, keepdim, v, i);
    const auto g = rnd<float>(s, 6);
    auto dx = cg::tensor<float>::empty({3, 4, 2});
    cd::max_dim_backward_cpu(g, i, 1, keepdim, dx);
    const auto iv = i.to_vector();
    const auto gv = g.to_vector();
    const auto d = dx.to_vector();
    for (int a = 0; a < 3; ++a)
      for (int k = 0; k < 4; ++k)
        for (int b = 0; b < 2; ++b) {
          const auto q = static_cast<std::size_t>(a * 2 + b);
          CHECK(d[static_cast<std::size_t>((a * 4 + k) * 2 + b)] == (iv[q] == k ? gv[q] : 0.0f));
        }
  }
  const auto bad = cg::tensor<i64>::from({0, 4}, {2});
  CHECK(contains(error_of([&] {
                   cd::max_dim_backward_cpu(rnd<float>({2}, 1), bad, 1, false, cg::tensor<float>::empty({2, 3}));
                 }),
                 "max_backward: index 4 out of range for dim 1 of size 3"));
}

TEST_CASE("reduction.backward.var_matches_finite_differences") {
  const auto x = rnd<double>({3, 4, 5}, 21);
  struct vcase {
    std::vector<i64> dims;
    double correction;
    bool keepdim;
  };
  for (const vcase& c : std::vector<vcase>{{{1}, 1.0, false}, {{0, 2}, 0.0, true}, {{}, 1.0, false}, {{-1}, 2.5, true}}) {
    const cg::shape_t s = cd::reduce_shape(x.shape(), c.dims, c.keepdim, "var");
    const auto g = rnd<double>(s, 22);
    const auto f = [&](const cg::tensor<double>& in) {
      auto out = cg::tensor<double>::empty(s);
      cd::var_cpu(in, c.dims, c.correction, c.keepdim, out);
      return out.to_vector();
    };
    auto dx = cg::tensor<double>::empty(x.shape());
    cd::var_backward_cpu(g, x, c.dims, c.correction, c.keepdim, dx);
    check_close(dx, numeric_grad(x, f, g.to_vector()), 1e-7, 1e-6, "var_backward dims " + cg::list_str(c.dims));
    // f32 and bf16 against the f64 gradient.
    auto df = cg::tensor<float>::empty(x.shape());
    cd::var_backward_cpu(g.to<float>(), x.to<float>(), c.dims, c.correction, c.keepdim, df);
    check_close(df, dx.to_vector(), 1e-5, 1e-4, "var_backward f32");
    auto db = cg::tensor<cg::bf16>::empty(x.shape());
    cd::var_backward_cpu(g.to<cg::bf16>(), x.to<cg::bf16>(), c.dims, c.correction, c.keepdim, db);
    check_close(db, dx.to_vector(), 0.05, 0.05, "var_backward bf16");
  }
  // dim=None with N - correction <= 0: grad * (x == mean ? NaN : inf), PyTorch's rule.
  const auto one = cg::tensor<double>::from({2.0, 2.0}, {2});
  auto d1 = cg::tensor<double>::empty({2});
  cd::var_backward_cpu(cg::tensor<double>::from({1}, {}), one, {}, 2.0, false, d1);
  CHECK(std::isnan(d1.to_vector()[0]));
  cd::var_backward_cpu(cg::tensor<double>::from({1}, {}), cg::tensor<double>::from({1, 3}, {2}), {}, 2.0, false, d1);
  CHECK(std::isinf(d1.to_vector()[0]));
}

}  // namespace reduction_tests
