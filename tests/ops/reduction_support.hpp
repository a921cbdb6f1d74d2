// tests/ops/reduction_support.hpp: what the reduction / normalization / loss tests share, on the
// CPU (tests/ops/test_{reduction,normalization,loss}.cpp) and on the GPU (tests/gpu/test_*.cu):
// random tensors, strided views of them, double-precision values, per-dtype tolerances, and an
// element-wise comparison that reports the first mismatch (NaN matches NaN, inf matches inf).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph_test::red {

namespace cg = ccgraph;
using i64 = std::int64_t;

/// `v` as a double (bf16 / f16 through float).
template <class T>
double dbl(T v) {
  return static_cast<double>(static_cast<cg::compute_t<T>>(v));
}

/// The values of `t` in row-major order, as doubles.
template <class T>
std::vector<double> values(const cg::tensor<T>& t) {
  std::vector<double> out;
  for (const T& v : t.to_vector()) out.push_back(dbl(v));
  return out;
}

/// Relative precision of T's results (a few units in the last place; 0 for integers: exact).
template <class T>
double tol() {
  if constexpr (std::is_same_v<T, double>) return 1e-11;
  if constexpr (std::is_same_v<T, float>) return 2e-5;
  if constexpr (std::is_same_v<T, cg::bf16>) return 1.6e-2;
  if constexpr (std::is_same_v<T, cg::f16>) return 2e-3;
  return 0;
}

/// A host tensor of `shape` with values uniform in [lo, hi) (integers: whole numbers).
template <class T>
cg::tensor<T> rnd(const cg::shape_t& shape, std::uint64_t seed, double lo = -2.0, double hi = 2.0) {
  const cg::device_guard host(cg::device::cpu());
  return cg::uniform<T>(shape, lo, hi, seed);
}

/// A view of `shape` that is not contiguous: the dims of a random tensor reversed and
/// permuted back, then narrowed along dim 0 out of a larger one (for rank >= 1).
template <class T>
cg::tensor<T> rnd_strided(const cg::shape_t& shape, std::uint64_t seed, double lo = -2.0, double hi = 2.0) {
  if (shape.empty()) return rnd<T>(shape, seed, lo, hi);
  cg::shape_t rev(shape.rbegin(), shape.rend());
  rev.back() += 3;  // the reversed last dim is the view's dim 0: narrowed below
  const cg::tensor<T> base = rnd<T>(rev, seed, lo, hi);
  std::vector<std::int64_t> order;
  for (std::size_t d = shape.size(); d-- > 0;) order.push_back(static_cast<std::int64_t>(d));
  return base.permute(order).narrow(0, 2, shape[0]);
}

/// The input linear indices (row-major) of each output of a reduction over `mask`, each list in
/// reduced row-major order: the naive definition the reference reductions loop over.
inline std::vector<std::vector<i64>> reduce_groups(const cg::shape_t& shape, const std::vector<bool>& mask) {
  i64 outputs = 1;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (!mask[d]) outputs *= shape[d];
  std::vector<std::vector<i64>> groups(static_cast<std::size_t>(outputs));
  const i64 n = cg::numel_of(shape);
  std::vector<i64> coord(shape.size());
  for (i64 e = 0; e < n; ++e) {
    i64 rest = e;
    for (std::size_t d = shape.size(); d-- > 0;) {
      coord[d] = rest % shape[d];
      rest /= shape[d];
    }
    i64 q = 0;
    for (std::size_t d = 0; d < shape.size(); ++d)
      if (!mask[d]) q = q * shape[d] + coord[d];
    groups[static_cast<std::size_t>(q)].push_back(e);
  }
  return groups;
}

/// True when `got` equals `want` within atol + rtol * |want| (NaN matches NaN, inf matches inf
/// of the same sign).
inline bool close(double got, double want, double atol, double rtol) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::abs(got - want) <= atol + rtol * std::abs(want);
}

/// Compares every element of `got` with `want`; one CHECK, naming the first mismatch.
template <class T>
void check_close(const cg::tensor<T>& got, const std::vector<double>& want, double atol, double rtol,
                 const std::string& what) {
  const std::vector<double> g = values(got);
  REQUIRE_MESSAGE(g.size() == want.size(), what, ": ", g.size(), " values, expected ", want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!close(g[i], want[i], atol, rtol)) {
      if (bad++ == 0) first = i;
    }
  std::ostringstream msg;
  if (bad) msg << what << ": " << bad << " of " << g.size() << " differ; first at " << first << ": got " << g[first]
               << ", expected " << want[first];
  CHECK_MESSAGE(bad == 0, msg.str());
}

/// Compares two tensors element by element (see check_close).
template <class T, class U>
void check_same(const cg::tensor<T>& got, const cg::tensor<U>& want, double atol, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(got.shape() == want.shape(), what, ": shape ", cg::shape_str(got.shape()), ", expected ",
                  cg::shape_str(want.shape()));
  check_close(got, values(want), atol, rtol, what);
}

/// Central finite differences of L(x) = sum(w * f(x)) for an f64 `x`: the reference gradient of a
/// backward kernel given grad_out = w. `x` is perturbed in place one element at a time (it must
/// own contiguous memory) and restored.
inline std::vector<double> numeric_grad(cg::tensor<double> x,
                                        const std::function<std::vector<double>(const cg::tensor<double>&)>& f,
                                        const std::vector<double>& w, double h = 1e-6) {
  x = x.clone();
  std::vector<double> grad(static_cast<std::size_t>(x.numel()));
  for (i64 i = 0; i < x.numel(); ++i) {
    const double keep = x.data()[i];
    x.data()[i] = keep + h;
    const auto fp = f(x);
    x.data()[i] = keep - h;
    const auto fm = f(x);
    x.data()[i] = keep;
    double d = 0;
    for (std::size_t k = 0; k < w.size(); ++k) d += w[k] * (fp[k] - fm[k]);
    grad[static_cast<std::size_t>(i)] = d / (2 * h);
  }
  return grad;
}

/// A short name per element type, for messages.
template <class T>
std::string type_name() {
  return std::string(cg::to_string(cg::dtype_v<T>));
}

/// Checks that result k of `got` equals result k of `want` bitwise (what a graph run must give
/// compared with eager): tuples of tensors of the same types.
template <class... Ts>
void check_same_results(const std::tuple<Ts...>& got, const std::tuple<Ts...>& want) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    const auto one = [](std::size_t k, const auto& g, const auto& w) {
      CAPTURE(k);
      CHECK(g.shape() == w.shape());
      CHECK(g.to_vector() == w.to_vector());
    };
    (one(K, std::get<K>(got), std::get<K>(want)), ...);
  }(std::index_sequence_for<Ts...>{});
}

}  // namespace ccgraph_test::red
