// tests/ops/test_normalization.cpp: softmax, log_softmax, layer_norm, rms_norm and their backward
// kernels (ccgraph/ops/normalization.hpp) on the CPU against naive double-precision references
// and central finite differences: every floating dtype, last and inner dims, strided inputs,
// -inf / NaN / +inf rows, optional weight and bias, and every error message.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <ccgraph/ops/normalization.hpp>

#include "ops/reduction_support.hpp"
#include "support.hpp"

namespace normalization_tests {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using namespace ccgraph_test::red;
using ccgraph_test::contains;
using ccgraph_test::error_of;

/// softmax / log_softmax of row-major `v` of `shape` along `dim`, in double.
std::vector<double> ref_softmax(const std::vector<double>& v, const cg::shape_t& shape, int dim, bool log) {
  i64 outer = 1, n = 1, inner = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (static_cast<int>(d) < dim) outer *= shape[d];
    else if (static_cast<int>(d) == dim) n = shape[d];
    else inner *= shape[d];
  }
  std::vector<double> out(v.size());
  for (i64 o = 0; o < outer; ++o)
    for (i64 i = 0; i < inner; ++i) {
      const auto at = [&](i64 k) { return static_cast<std::size_t>((o * n + k) * inner + i); };
      double m = -INFINITY;
      bool nan = false;
      for (i64 k = 0; k < n; ++k) {
        nan = nan || std::isnan(v[at(k)]);
        m = std::max(m, v[at(k)]);
      }
      if (nan) m = NAN;
      double s = 0;
      for (i64 k = 0; k < n; ++k) s += std::exp(v[at(k)] - m);
      for (i64 k = 0; k < n; ++k) out[at(k)] = log ? v[at(k)] - m - std::log(s) : std::exp(v[at(k)] - m) / s;
    }
  return out;
}

struct softmax_case {
  cg::shape_t shape;
  i64 dim;
};

const std::vector<softmax_case>& softmax_cases() {
  static const std::vector<softmax_case> cases = {{{4, 7}, -1}, {{3, 4, 5}, 1}, {{3, 4, 5}, 0}, {{3, 4, 5}, 2},
                                                  {{6}, 0},     {{}, 0},        {{}, -1},      {{2, 0, 3}, 1},
                                                  {{2, 3, 0}, -1}, {{1, 33}, 1}, {{2, 1, 3}, 1}};
  return cases;
}

template <class T>
void check_softmax() {
  std::uint64_t seed = 100;
  for (const softmax_case& c : softmax_cases())
    for (bool strided : {false, true})
      for (bool log : {false, true}) {
        const auto x = strided ? rnd_strided<T>(c.shape, seed, -4, 4) : rnd<T>(c.shape, seed, -4, 4);
        ++seed;
        const int d = cg::normalize_dim(c.dim, c.shape.size(), "test");
        const auto want = ref_softmax(values(x), c.shape, d, log);
        auto out = cg::tensor<T>::empty(c.shape);
        (log ? cd::log_softmax_cpu<T> : cd::softmax_cpu<T>)(x, c.dim, out);
        check_close(out, want, tol<T>() * 0.05, tol<T>(),
                    std::string(log ? "log_softmax " : "softmax ") + type_name<T>() + " " + cg::shape_str(c.shape) +
                        " dim " + std::to_string(c.dim) + (strided ? " strided" : ""));
      }
}

TEST_CASE("softmax.every_dtype") {
  check_softmax<float>();
  check_softmax<double>();
  check_softmax<cg::bf16>();
  check_softmax<cg::f16>();
}

TEST_CASE("softmax.special_values") {
  const float inf = INFINITY, nan = NAN;
  // Rows: all -inf (NaN, as PyTorch), some -inf (0 there), a NaN (all NaN), +inf (all NaN),
  // large values (stable: no overflow).
  const auto x = cg::tensor<float>::from({-inf, -inf, -inf, 0, -inf, 0, 1, nan, 2, inf, 1, 2, 1000, 1001, 999}, {5, 3});
  auto y = cg::tensor<float>::empty({5, 3});
  cd::softmax_cpu(x, 1, y);
  const auto v = y.to_vector();
  for (int k = 0; k < 3; ++k) CHECK(std::isnan(v[static_cast<std::size_t>(k)]));
  CHECK(v[3] == doctest::Approx(0.5));
  CHECK(v[4] == 0.0f);
  CHECK(v[5] == doctest::Approx(0.5));
  for (int k = 6; k < 12; ++k) CHECK(std::isnan(v[static_cast<std::size_t>(k)]));
  CHECK(v[13] == doctest::Approx(std::exp(1.0) / (1 + std::exp(1.0) + std::exp(-1.0))));
  cd::log_softmax_cpu(x, 1, y);
  const auto l = y.to_vector();
  for (int k = 0; k < 3; ++k) CHECK(std::isnan(l[static_cast<std::size_t>(k)]));
  CHECK(l[4] == -inf);
  CHECK(l[3] == doctest::Approx(-std::log(2.0)));
  for (int k = 6; k < 12; ++k) CHECK(std::isnan(l[static_cast<std::size_t>(k)]));
  CHECK(l[12] == doctest::Approx(-1 - std::log(1 + std::exp(-1.0) + std::exp(-2.0))));
}

TEST_CASE("softmax.errors") {
  CHECK(contains(error_of([] { (void)cd::softmax_meta({cg::dtype::i64, {2, 3}}, 1); }),
                 "softmax: input dtype i64 is not a floating point type"));
  CHECK(contains(error_of([] { (void)cd::softmax_meta({cg::dtype::f32, {2, 3}}, 2, "log_softmax"); }),
                 "log_softmax: dim 2 is out of range for a tensor of rank 2"));
  CHECK(contains(error_of([] { (void)cd::softmax_backward_meta({cg::dtype::f32, {2, 3}}, {cg::dtype::f32, {3, 2}}, 1); }),
                 "softmax_backward: grad f32[2, 3] and output f32[3, 2] must have the same shape and dtype"));
  CHECK(contains(error_of([] { cd::softmax_cpu(rnd<float>({2, 3}, 1), 1, cg::tensor<float>::empty({3, 2})); }),
                 "softmax: output has shape [3, 2], expected [2, 3]"));
  CHECK(cd::softmax_meta({cg::dtype::bf16, {2, 3}}, -2) == cg::tensor_meta{cg::dtype::bf16, {2, 3}});
}

TEST_CASE("softmax.backward.finite_differences") {
  for (const softmax_case& c : softmax_cases()) {
    if (cg::numel_of(c.shape) == 0) continue;
    for (bool log : {false, true}) {
      const auto x = rnd<double>(c.shape, 7, -2, 2);
      const auto g = rnd<double>(c.shape, 8);
      const auto f = [&](const cg::tensor<double>& in) {
        auto out = cg::tensor<double>::empty(c.shape);
        (log ? cd::log_softmax_cpu<double> : cd::softmax_cpu<double>)(in, c.dim, out);
        return out.to_vector();
      };
      auto y = cg::tensor<double>::empty(c.shape);
      (log ? cd::log_softmax_cpu<double> : cd::softmax_cpu<double>)(x, c.dim, y);
      auto dx = cg::tensor<double>::empty(c.shape);
      (log ? cd::log_softmax_backward_cpu<double> : cd::softmax_backward_cpu<double>)(g, y, c.dim, dx);
      const std::string name = std::string(log ? "log_softmax" : "softmax") + "_backward " + cg::shape_str(c.shape);
      check_close(dx, numeric_grad(x, f, g.to_vector()), 1e-7, 1e-6, name);
      // bf16 / f32, with strided grad and output, against the f64 gradient.
      auto yb = cg::tensor<cg::bf16>::empty(c.shape);
      (log ? cd::log_softmax_cpu<cg::bf16> : cd::softmax_cpu<cg::bf16>)(x.to<cg::bf16>(), c.dim, yb);
      auto db = cg::tensor<cg::bf16>::empty(c.shape);
      (log ? cd::log_softmax_backward_cpu<cg::bf16> : cd::softmax_backward_cpu<cg::bf16>)(g.to<cg::bf16>(), yb, c.dim, db);
      check_close(db, dx.to_vector(), 0.03, 0.03, name + " bf16");
      if (c.shape.size() >= 2) {
        const auto gs = g.to<float>().transpose(0, 1).contiguous().transpose(0, 1);  // same values, strided
        auto df = cg::tensor<float>::empty(c.shape);
        (log ? cd::log_softmax_backward_cpu<float> : cd::softmax_backward_cpu<float>)(gs, y.to<float>(), c.dim, df);
        check_close(df, dx.to_vector(), 1e-5, 1e-4, name + " f32 strided grad");
      }
    }
  }
}

// ---- layer_norm / rms_norm ------------------------------------------------------------------

/// The reference norm: rows of `cols` trailing elements; y, mean and rstd (rstd from eps).
struct norm_ref {
  std::vector<double> y, mean, rstd;
};
norm_ref ref_norm(const std::vector<double>& x, i64 cols, const std::vector<double>* w, const std::vector<double>* b,
                  double eps, bool rms) {
  norm_ref r;
  const i64 rows = cols ? static_cast<i64>(x.size()) / cols : 0;
  r.y.resize(x.size());
  for (i64 i = 0; i < rows; ++i) {
    double mu = 0;
    if (!rms) {
      for (i64 c = 0; c < cols; ++c) mu += x[static_cast<std::size_t>(i * cols + c)];
      mu /= static_cast<double>(cols);
    }
    double ss = 0;
    for (i64 c = 0; c < cols; ++c) ss += (x[static_cast<std::size_t>(i * cols + c)] - mu) * (x[static_cast<std::size_t>(i * cols + c)] - mu);
    const double rs = 1 / std::sqrt(ss / static_cast<double>(cols) + eps);
    for (i64 c = 0; c < cols; ++c) {
      double v = (x[static_cast<std::size_t>(i * cols + c)] - mu) * rs;
      if (w) v *= (*w)[static_cast<std::size_t>(c)];
      if (b) v += (*b)[static_cast<std::size_t>(c)];
      r.y[static_cast<std::size_t>(i * cols + c)] = v;
    }
    r.mean.push_back(mu);
    r.rstd.push_back(rs);
  }
  return r;
}

struct norm_case {
  cg::shape_t shape;
  cg::shape_t normalized;
};

const std::vector<norm_case>& norm_cases() {
  static const std::vector<norm_case> cases = {{{4, 8}, {8}},       {{2, 3, 5}, {5}},  {{2, 3, 5}, {3, 5}},
                                               {{7}, {7}},          {{3, 1}, {1}},     {{0, 4}, {4}},
                                               {{5, 33}, {33}},     {{2, 2, 2, 6}, {2, 6}}};
  return cases;
}

template <class T>
void check_norms() {
  std::uint64_t seed = 300;
  for (const norm_case& c : norm_cases())
    for (int affine = 0; affine < 4; ++affine)  // bit 0: weight, bit 1: bias
      for (bool strided : {false, true})
        for (bool rms : {false, true}) {
          if (rms && (affine & 2)) continue;  // rms_norm has no bias
          const auto x = strided ? rnd_strided<T>(c.shape, seed, -3, 5) : rnd<T>(c.shape, seed, -3, 5);
          const std::optional<cg::tensor<T>> w = affine & 1 ? std::optional(rnd<T>(c.normalized, seed + 1)) : std::nullopt;
          const std::optional<cg::tensor<T>> b = affine & 2 ? std::optional(rnd<T>(c.normalized, seed + 2)) : std::nullopt;
          seed += 3;
          const i64 cols = cg::numel_of(c.normalized);
          const std::vector<double> wv = w ? values(*w) : std::vector<double>{};
          const std::vector<double> bv = b ? values(*b) : std::vector<double>{};
          const double eps = rms ? static_cast<double>(std::numeric_limits<float>::epsilon()) : 1e-5;
          const norm_ref want = ref_norm(values(x), cols, w ? &wv : nullptr, b ? &bv : nullptr,
                                         std::is_same_v<T, double> && rms ? std::numeric_limits<double>::epsilon() : eps, rms);
          cg::shape_t stat = c.shape;
          for (std::size_t d = c.shape.size() - c.normalized.size(); d < c.shape.size(); ++d) stat[d] = 1;
          auto y = cg::tensor<T>::empty(c.shape);
          auto mean = cg::tensor<cd::norm_stat_t<T>>::empty(stat);
          auto rstd = cg::tensor<cd::norm_stat_t<T>>::empty(stat);
          const std::string name = std::string(rms ? "rms_norm " : "layer_norm ") + type_name<T>() + " " +
                                   cg::shape_str(c.shape) + " affine " + std::to_string(affine) + (strided ? " strided" : "");
          if (rms)
            cd::rms_norm_cpu(x, c.normalized, w, std::nullopt, y, &rstd);  // eps: the default
          else
            cd::layer_norm_cpu(x, c.normalized, w, b, 1e-5, y, &mean, &rstd);
          check_close(y, want.y, 4 * tol<T>(), 4 * tol<T>(), name);
          if (!rms) check_close(mean, want.mean, 1e-6, 1e-5, name + " mean");
          check_close(rstd, want.rstd, 1e-6, 1e-5, name + " rstd");
        }
}

TEST_CASE("layer_norm.rms_norm.every_dtype") {
  check_norms<float>();
  check_norms<double>();
  check_norms<cg::bf16>();
  check_norms<cg::f16>();
}

TEST_CASE("layer_norm.meta_and_defaults") {
  const auto m = cd::layer_norm_meta({cg::dtype::bf16, {2, 3, 4}}, {3, 4}, cg::tensor_meta{cg::dtype::bf16, {3, 4}},
                                     std::nullopt, 1e-5);
  REQUIRE(m.size() == 3);
  CHECK(m[0] == cg::tensor_meta{cg::dtype::bf16, {2, 3, 4}});
  CHECK(m[1] == cg::tensor_meta{cg::dtype::f32, {2, 1, 1}});
  CHECK(m[2] == cg::tensor_meta{cg::dtype::f32, {2, 1, 1}});
  const auto r = cd::rms_norm_meta({cg::dtype::f64, {5}}, {5}, std::nullopt, std::nullopt);
  CHECK(r[1] == cg::tensor_meta{cg::dtype::f64, {1}});
  // eps=None: the epsilon of the type rms_norm computes in (float for the 16-bit types).
  CHECK(cd::rms_norm_default_eps(cg::dtype::bf16) == static_cast<double>(std::numeric_limits<float>::epsilon()));
  CHECK(cd::rms_norm_default_eps(cg::dtype::f64) == std::numeric_limits<double>::epsilon());
  // An explicit eps is used as given.
  const auto x = cg::tensor<double>::from({3, 4}, {1, 2});
  auto y = cg::tensor<double>::empty({1, 2});
  cd::rms_norm_cpu(x, {2}, std::nullopt, 0.5, y);
  CHECK(y.to_vector()[0] == doctest::Approx(3 / std::sqrt(12.5 + 0.5)).epsilon(1e-14));
}

TEST_CASE("layer_norm.errors") {
  const cg::tensor_meta in{cg::dtype::f32, {2, 3, 4}};
  CHECK(contains(error_of([&] { (void)cd::layer_norm_meta(in, {}, std::nullopt, std::nullopt, 1e-5); }),
                 "layer_norm: normalized_shape must have at least one dim, got []"));
  CHECK(contains(error_of([&] { (void)cd::layer_norm_meta(in, {3}, std::nullopt, std::nullopt, 1e-5); }),
                 "layer_norm: input of shape [2, 3, 4] does not end with normalized_shape [3] (expected [*, 3])"));
  CHECK(contains(error_of([&] { (void)cd::layer_norm_meta(in, {2, 3, 4, 5}, std::nullopt, std::nullopt, 1e-5); }),
                 "does not end with normalized_shape [2, 3, 4, 5]"));
  CHECK(contains(error_of([&] {
                   (void)cd::layer_norm_meta(in, {3, 4}, cg::tensor_meta{cg::dtype::f32, {4}}, std::nullopt, 1e-5);
                 }),
                 "layer_norm: weight of shape [4] must have normalized_shape [3, 4]"));
  CHECK(contains(error_of([&] {
                   (void)cd::layer_norm_meta(in, {4}, std::nullopt, cg::tensor_meta{cg::dtype::f64, {4}}, 1e-5);
                 }),
                 "layer_norm: bias dtype f64 differs from input dtype f32"));
  CHECK(contains(error_of([&] { (void)cd::layer_norm_meta(in, {4}, std::nullopt, std::nullopt, -1.0); }),
                 "layer_norm: eps must be finite and >= 0, got -1"));
  CHECK(contains(error_of([&] { (void)cd::rms_norm_meta({cg::dtype::i32, {2, 4}}, {4}, std::nullopt, std::nullopt); }),
                 "rms_norm: input dtype i32 is not a floating point type"));
  CHECK(contains(error_of([&] { (void)cd::rms_norm_meta(in, {4}, cg::tensor_meta{cg::dtype::f32, {3}}, 1e-6); }),
                 "rms_norm: weight of shape [3] must have normalized_shape [4]"));
  CHECK(contains(error_of([&] {
                   const auto x = rnd<float>({2, 4}, 1);
                   auto y = cg::tensor<float>::empty({2, 4});
                   auto bad = cg::tensor<float>::empty({2});
                   cd::layer_norm_cpu(x, {4}, std::nullopt, std::nullopt, 1e-5, y, &bad);
                 }),
                 "layer_norm: mean has shape [2], expected [2, 1]"));
}

/// The gradients of a norm with respect to x, weight and bias, by finite differences (f64).
struct norm_grads {
  std::vector<double> dx, dw, db;
};
norm_grads numeric_norm_grads(const cg::tensor<double>& x, const cg::shape_t& normalized,
                              const std::optional<cg::tensor<double>>& w, const std::optional<cg::tensor<double>>& b,
                              bool rms, const cg::tensor<double>& g) {
  const auto run = [&](const cg::tensor<double>& xi, const std::optional<cg::tensor<double>>& wi,
                       const std::optional<cg::tensor<double>>& bi) {
    auto y = cg::tensor<double>::empty(xi.shape());
    if (rms)
      cd::rms_norm_cpu(xi, normalized, wi, 1e-5, y);
    else
      cd::layer_norm_cpu(xi, normalized, wi, bi, 1e-5, y);
    return y.to_vector();
  };
  norm_grads r;
  const auto gv = g.to_vector();
  r.dx = numeric_grad(x, [&](const cg::tensor<double>& xi) { return run(xi, w, b); }, gv);
  if (w) r.dw = numeric_grad(*w, [&](const cg::tensor<double>& wi) { return run(x, wi, b); }, gv);
  if (b) r.db = numeric_grad(*b, [&](const cg::tensor<double>& bi) { return run(x, w, bi); }, gv);
  return r;
}

TEST_CASE("layer_norm.rms_norm.backward.finite_differences") {
  for (const norm_case& c : norm_cases()) {
    if (cg::numel_of(c.shape) == 0) continue;
    for (int affine = 0; affine < 4; ++affine)
      for (bool rms : {false, true}) {
        if (rms && (affine & 2)) continue;
        const auto x = rnd<double>(c.shape, 41, -2, 3);
        const auto g = rnd<double>(c.shape, 42);
        const std::optional<cg::tensor<double>> w = affine & 1 ? std::optional(rnd<double>(c.normalized, 43)) : std::nullopt;
        const std::optional<cg::tensor<double>> b = affine & 2 ? std::optional(rnd<double>(c.normalized, 44)) : std::nullopt;
        cg::shape_t stat = c.shape;
        for (std::size_t d = c.shape.size() - c.normalized.size(); d < c.shape.size(); ++d) stat[d] = 1;
        auto y = cg::tensor<double>::empty(c.shape);
        auto mean = cg::tensor<double>::empty(stat);
        auto rstd = cg::tensor<double>::empty(stat);
        if (rms)
          cd::rms_norm_cpu(x, c.normalized, w, 1e-5, y, &rstd);
        else
          cd::layer_norm_cpu(x, c.normalized, w, b, 1e-5, y, &mean, &rstd);
        auto dx = cg::tensor<double>::empty(c.shape);
        auto dw = cg::tensor<double>::empty(c.normalized);
        auto db = cg::tensor<double>::empty(c.normalized);
        if (rms)
          cd::rms_norm_backward_cpu(g, x, c.normalized, rstd, w, &dx, w ? &dw : nullptr);
        else
          cd::layer_norm_backward_cpu(g, x, c.normalized, mean, rstd, w, &dx, w ? &dw : nullptr, b ? &db : nullptr);
        const norm_grads want = numeric_norm_grads(x, c.normalized, w, b, rms, g);
        const std::string name = std::string(rms ? "rms_norm" : "layer_norm") + "_backward " + cg::shape_str(c.shape) +
                                 " affine " + std::to_string(affine);
        check_close(dx, want.dx, 1e-6, 1e-5, name + " dx");
        if (w) check_close(dw, want.dw, 1e-6, 1e-5, name + " dweight");
        if (b) check_close(db, want.db, 1e-6, 1e-5, name + " dbias");
        // bf16 with a strided grad, against the f64 gradients.
        const auto xb = x.to<cg::bf16>();
        const std::optional<cg::tensor<cg::bf16>> wb = w ? std::optional(w->to<cg::bf16>()) : std::nullopt;
        const std::optional<cg::tensor<cg::bf16>> bb = b ? std::optional(b->to<cg::bf16>()) : std::nullopt;
        auto yb = cg::tensor<cg::bf16>::empty(c.shape);
        auto mb = cg::tensor<float>::empty(stat);
        auto rb = cg::tensor<float>::empty(stat);
        if (rms)
          cd::rms_norm_cpu(xb, c.normalized, wb, 1e-5, yb, &rb);
        else
          cd::layer_norm_cpu(xb, c.normalized, wb, bb, 1e-5, yb, &mb, &rb);
        auto dxb = cg::tensor<cg::bf16>::empty(c.shape);
        auto dwb = cg::tensor<cg::bf16>::empty(c.normalized);
        if (rms)
          cd::rms_norm_backward_cpu(g.to<cg::bf16>(), xb, c.normalized, rb, wb, &dxb, wb ? &dwb : nullptr);
        else
          cd::layer_norm_backward_cpu(g.to<cg::bf16>(), xb, c.normalized, mb, rb, wb, &dxb, wb ? &dwb : nullptr, nullptr);
        check_close(dxb, want.dx, 0.1, 0.05, name + " bf16 dx");
        if (w) check_close(dwb, want.dw, 0.1, 0.05, name + " bf16 dweight");
      }
  }
}

TEST_CASE("layer_norm.backward.no_rows_gives_zero_parameter_grads") {
  const auto x = cg::tensor<float>::empty({0, 4});
  const auto w = rnd<float>({4}, 1);
  auto dw = cg::full<float>({4}, 7.0f);
  auto db = cg::full<float>({4}, 7.0f);
  cd::layer_norm_backward_cpu(x, x, {4}, cg::tensor<float>::empty({0, 1}), cg::tensor<float>::empty({0, 1}), w, nullptr,
                              &dw, &db);
  CHECK(dw.to_vector() == std::vector<float>(4, 0.0f));
  CHECK(db.to_vector() == std::vector<float>(4, 0.0f));
  CHECK(contains(error_of([&] {
                   cd::layer_norm_backward_cpu(x, x, {4}, cg::tensor<float>::empty({0, 1}), cg::tensor<float>::empty({0, 1}),
                                               std::nullopt, nullptr, &dw, nullptr);
                 }),
                 "layer_norm_backward: a weight gradient was asked for without a weight"));
}

}  // namespace normalization_tests
