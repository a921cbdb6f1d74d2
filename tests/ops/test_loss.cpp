// tests/ops/test_loss.cpp: cross_entropy and its backward (ccgraph/ops/loss.hpp) on the CPU
// against a double-precision reference written as PyTorch composes it (log_softmax, nll_loss,
// the label-smoothing term, the weighted mean), and central finite differences: [N, C],
// [N, C, d...] and unbatched inputs, reductions none / mean / sum, class weights, ignore_index,
// label smoothing, every floating dtype, and every error message.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <ccgraph/ops/loss.hpp>

#include "ops/reduction_support.hpp"
#include "support.hpp"

namespace loss_tests {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using namespace ccgraph_test::red;
using ccgraph_test::contains;
using ccgraph_test::error_of;

/// A cross_entropy case: logits shape (target shape follows), weights, ignore_index, smoothing.
struct ce_case {
  cg::shape_t shape;
  bool weighted;
  double smoothing;
};

/// The target shape of logits `shape`: [N, d...] ([] for unbatched [C]).
cg::shape_t target_shape(const cg::shape_t& shape) {
  if (shape.size() == 1) return {};
  cg::shape_t t{shape[0]};
  t.insert(t.end(), shape.begin() + 2, shape.end());
  return t;
}

/// Random targets in [0, classes), with every third position set to `ignore`.
cg::tensor<i64> make_targets(const cg::shape_t& shape, i64 classes, i64 ignore, std::uint64_t seed) {
  auto t = rnd<i64>(shape, seed, 0, static_cast<double>(classes) - 1e-9);
  i64* p = t.data();
  for (i64 i = 0; i < t.numel(); ++i)
    if (i % 3 == 1) p[i] = ignore;
  return t;
}

/// PyTorch's composition in double: per-position losses (reduction none) and the reduced value.
struct ce_ref {
  std::vector<double> per_position, lse;
  double mean = 0, sum = 0;
};
ce_ref reference(const std::vector<double>& x, const cg::shape_t& shape, const std::vector<i64>& t,
                 const std::vector<double>* w, i64 ignore, double ls) {
  const i64 classes = shape.size() == 1 ? shape[0] : shape[1];
  const i64 batch = shape.size() == 1 ? 1 : shape[0];
  i64 inner = 1;
  for (std::size_t d = 2; d < shape.size(); ++d) inner *= shape[d];
  ce_ref r;
  double nll_sum = 0, smooth_sum = 0, wsum = 0;
  for (i64 n = 0; n < batch; ++n)
    for (i64 s = 0; s < inner; ++s) {
      const auto at = [&](i64 c) { return x[static_cast<std::size_t>((n * classes + c) * inner + s)]; };
      double m = -INFINITY;
      for (i64 c = 0; c < classes; ++c) m = std::max(m, at(c));
      double se = 0;
      for (i64 c = 0; c < classes; ++c) se += std::exp(at(c) - m);
      const double lse = m + std::log(se);
      r.lse.push_back(lse);
      const i64 tt = t[static_cast<std::size_t>(n * inner + s)];
      double nll = 0, smooth = 0;
      if (tt != ignore) {
        const double wt = w ? (*w)[static_cast<std::size_t>(tt)] : 1.0;
        nll = -wt * (at(tt) - lse);
        for (i64 c = 0; c < classes; ++c) smooth -= (w ? (*w)[static_cast<std::size_t>(c)] : 1.0) * (at(c) - lse);
        wsum += wt;
      }
      nll_sum += nll;
      smooth_sum += smooth;
      r.per_position.push_back((1 - ls) * nll + ls / static_cast<double>(classes) * smooth);
    }
  r.sum = (1 - ls) * nll_sum + ls / static_cast<double>(classes) * smooth_sum;
  r.mean = (1 - ls) * (nll_sum / wsum) + ls / static_cast<double>(classes) * (smooth_sum / wsum);
  return r;
}

const std::vector<ce_case>& ce_cases() {
  static const std::vector<ce_case> cases = {
      {{5, 7}, false, 0.0}, {{5, 7}, true, 0.0},  {{5, 7}, false, 0.1},   {{5, 7}, true, 0.25},
      {{3, 4, 2, 3}, false, 0.0}, {{3, 4, 2, 3}, true, 0.3}, {{6}, false, 0.0}, {{6}, true, 0.2},
      {{4, 1}, false, 0.0}, {{2, 33}, false, 1.0}};
  return cases;
}

template <class T>
void check_cross_entropy() {
  std::uint64_t seed = 500;
  for (const ce_case& c : ce_cases())
    for (bool strided : {false, true})
      for (cg::loss_reduction red : {cg::loss_reduction::none, cg::loss_reduction::mean, cg::loss_reduction::sum}) {
        const i64 classes = c.shape.size() == 1 ? c.shape[0] : c.shape[1];
        const i64 ignore = classes > 2 ? 2 : -100;  // a class index (ignored anyway) or PyTorch's default
        const auto x = strided ? rnd_strided<T>(c.shape, seed, -3, 3) : rnd<T>(c.shape, seed, -3, 3);
        const auto t = make_targets(target_shape(c.shape), classes, ignore, seed + 1);
        const std::optional<cg::tensor<T>> w = c.weighted ? std::optional(rnd<T>({classes}, seed + 2, 0.2, 2)) : std::nullopt;
        seed += 3;
        const std::vector<double> wv = w ? values(*w) : std::vector<double>{};
        const ce_ref want = reference(values(x), c.shape, t.to_vector(), w ? &wv : nullptr, ignore, c.smoothing);
        const cg::shape_t ls = red == cg::loss_reduction::none ? target_shape(c.shape) : cg::shape_t{};
        auto loss = cg::tensor<T>::empty(ls);
        auto lse = cg::tensor<cd::norm_stat_t<T>>::empty(target_shape(c.shape));
        cd::cross_entropy_cpu(x, t, w, red, ignore, c.smoothing, loss, &lse);
        const std::string name = "cross_entropy " + type_name<T>() + " " + cg::shape_str(c.shape) +
                                 (c.weighted ? " weighted" : "") + " ls " + std::to_string(c.smoothing) + " " +
                                 std::string(cg::to_string(red)) + (strided ? " strided" : "");
        const std::vector<double> w_loss = red == cg::loss_reduction::none ? want.per_position
                                           : red == cg::loss_reduction::mean ? std::vector<double>{want.mean}
                                                                             : std::vector<double>{want.sum};
        check_close(loss, w_loss, 4 * tol<T>(), 4 * tol<T>(), name);
        check_close(lse, want.lse, 1e-5, 1e-5, name + " lse");
      }
}

TEST_CASE("cross_entropy.every_dtype") {
  check_cross_entropy<float>();
  check_cross_entropy<double>();
  check_cross_entropy<cg::bf16>();
  check_cross_entropy<cg::f16>();
}

TEST_CASE("cross_entropy.known_value_and_edge_cases") {
  // torch.nn.functional.cross_entropy(torch.tensor([[1., 5., 3.], [5., 2., 0.]]), torch.tensor([1, 2]))
  // = (0.1429316 + 5.0549852) / 2 = 2.5989584
  const auto x = cg::tensor<double>::from({1, 5, 3, 5, 2, 0}, {2, 3});
  const auto t = cg::tensor<i64>::from({1, 2}, {2});
  auto l = cg::tensor<double>::empty({});
  cd::cross_entropy_cpu(x, t, std::nullopt, cg::loss_reduction::mean, -100, 0.0, l);
  CHECK(l.item() == doctest::Approx(2.5989584319).epsilon(1e-9));
  // Every position ignored: the mean is 0 / 0 = NaN (PyTorch), the sum 0.
  const auto all_ignored = cg::tensor<i64>::from({-100, -100}, {2});
  cd::cross_entropy_cpu(x, all_ignored, std::nullopt, cg::loss_reduction::mean, -100, 0.0, l);
  CHECK(std::isnan(l.item()));
  cd::cross_entropy_cpu(x, all_ignored, std::nullopt, cg::loss_reduction::sum, -100, 0.0, l);
  CHECK(l.item() == 0.0);
  // An empty batch: the mean is NaN, `none` is empty.
  auto e = cg::tensor<float>::empty({0});
  cd::cross_entropy_cpu(cg::tensor<float>::empty({0, 4}), cg::tensor<i64>::empty({0}), std::nullopt,
                        cg::loss_reduction::none, -100, 0.0, e);
  CHECK(e.numel() == 0);
  // Its backward, every reduction: `none` has an empty grad, which must never be read (it was
  // read as the one incoming gradient of mean / sum: a crash).
  for (cg::loss_reduction red : {cg::loss_reduction::none, cg::loss_reduction::mean, cg::loss_reduction::sum}) {
    const auto g = red == cg::loss_reduction::none ? cg::tensor<float>::empty({0}) : cg::tensor<float>::from({1.0f}, {});
    auto dx = cg::tensor<float>::empty({0, 4});
    CHECK_NOTHROW(cd::cross_entropy_backward_cpu(g, cg::tensor<float>::empty({0, 4}), cg::tensor<i64>::empty({0}),
                                                 std::nullopt, red, -100, 0.0, cg::tensor<float>::empty({0}), dx));
    CHECK(dx.numel() == 0);
  }
  // Large logits stay finite (max subtracted).
  const auto big = cg::tensor<float>::from({1000, 1001, 999}, {1, 3});
  auto lb = cg::tensor<float>::empty({});
  cd::cross_entropy_cpu(big, cg::tensor<i64>::from({1}, {1}), std::nullopt, cg::loss_reduction::sum, -100, 0.0, lb);
  CHECK(lb.item() == doctest::Approx(std::log(1 + std::exp(-1.0) + std::exp(-2.0))).epsilon(1e-5));
  CHECK(cg::parse_loss_reduction("sum") == cg::loss_reduction::sum);
  CHECK(cg::to_string(cg::loss_reduction::none) == "none");
}

TEST_CASE("cross_entropy.errors") {
  const cg::tensor_meta x{cg::dtype::f32, {4, 5}};
  const cg::tensor_meta t{cg::dtype::i64, {4}};
  const auto meta = [](const cg::tensor_meta& in, const cg::tensor_meta& tg, std::optional<cg::tensor_meta> w = std::nullopt,
                       double ls = 0.0) { (void)cd::cross_entropy_meta(in, tg, w, cg::loss_reduction::mean, -100, ls); };
  CHECK(contains(error_of([&] { meta({cg::dtype::i32, {4, 5}}, t); }), "cross_entropy: input dtype i32 is not a floating point type"));
  CHECK(contains(error_of([&] { meta(x, {cg::dtype::i32, {4}}); }),
                 "cross_entropy: target dtype i32 must be i64 (class indices; probability targets are not supported)"));
  CHECK(contains(error_of([&] { meta({cg::dtype::f32, {}}, {cg::dtype::i64, {}}); }),
                 "cross_entropy: input must have a class dim, got a 0-d tensor"));
  CHECK(contains(error_of([&] { meta({cg::dtype::f32, {5}}, t); }),
                 "cross_entropy: unbatched input of shape [5] needs a 0-d target, got shape [4]"));
  CHECK(contains(error_of([&] { meta(x, {cg::dtype::i64, {3}}); }),
                 "cross_entropy: input batch size 4 does not match target batch size 3"));
  CHECK(contains(error_of([&] { meta({cg::dtype::f32, {4, 5, 2}}, {cg::dtype::i64, {4, 3}}); }),
                 "cross_entropy: target of shape [4, 3] does not match input of shape [4, 5, 2] (expected target shape [4, 2])"));
  CHECK(contains(error_of([&] { meta(x, t, cg::tensor_meta{cg::dtype::f32, {4}}); }),
                 "cross_entropy: weight of shape [4] must have one value per class (5)"));
  CHECK(contains(error_of([&] { meta(x, t, cg::tensor_meta{cg::dtype::f64, {5}}); }),
                 "cross_entropy: weight dtype f64 differs from input dtype f32"));
  CHECK(contains(error_of([&] { meta(x, t, std::nullopt, 1.5); }),
                 "cross_entropy: label_smoothing must be between 0.0 and 1.0, got 1.5"));
  CHECK(contains(error_of([&] { meta({cg::dtype::f32, {4, 0}}, t); }), "cross_entropy: input of shape [4, 0] has no classes"));
  CHECK(contains(error_of([] { (void)cg::parse_loss_reduction("avg"); }),
                 "cross_entropy: reduction 'avg' is not one of 'none', 'mean', 'sum'"));
  // Out-of-bounds targets (not ignore_index) are an error naming the value and the position.
  const auto logits = rnd<float>({3, 4}, 1);
  auto l = cg::tensor<float>::empty({});
  CHECK(contains(error_of([&] {
                   cd::cross_entropy_cpu(logits, cg::tensor<i64>::from({0, 4, 1}, {3}), std::nullopt,
                                         cg::loss_reduction::mean, -100, 0.0, l);
                 }),
                 "cross_entropy: target 4 at position 1 is out of bounds for 4 classes"));
  CHECK(contains(error_of([&] {
                   cd::cross_entropy_cpu(logits, cg::tensor<i64>::from({-1, 0, 1}, {3}), std::nullopt,
                                         cg::loss_reduction::mean, -100, 0.0, l);
                 }),
                 "cross_entropy: target -1 at position 0 is out of bounds"));
  CHECK(contains(error_of([&] {
                   (void)cd::cross_entropy_backward_meta({cg::dtype::f32, {4}}, x, t, std::nullopt, cg::loss_reduction::mean, 0.0);
                 }),
                 "cross_entropy_backward: grad f32[4] must match the loss f32[]"));
}

TEST_CASE("cross_entropy.backward.finite_differences") {
  for (const ce_case& c : ce_cases())
    for (cg::loss_reduction red : {cg::loss_reduction::none, cg::loss_reduction::mean, cg::loss_reduction::sum}) {
      const i64 classes = c.shape.size() == 1 ? c.shape[0] : c.shape[1];
      const i64 ignore = classes > 2 ? 2 : -100;
      const auto x = rnd<double>(c.shape, 61, -3, 3);
      const auto t = make_targets(target_shape(c.shape), classes, ignore, 62);
      const std::optional<cg::tensor<double>> w = c.weighted ? std::optional(rnd<double>({classes}, 63, 0.2, 2)) : std::nullopt;
      const cg::shape_t ls = red == cg::loss_reduction::none ? target_shape(c.shape) : cg::shape_t{};
      const auto g = rnd<double>(ls, 64);
      const auto f = [&](const cg::tensor<double>& xi) {
        auto loss = cg::tensor<double>::empty(ls);
        cd::cross_entropy_cpu(xi, t, w, red, ignore, c.smoothing, loss);
        return loss.to_vector();
      };
      auto loss = cg::tensor<double>::empty(ls);
      auto lse = cg::tensor<double>::empty(target_shape(c.shape));
      cd::cross_entropy_cpu(x, t, w, red, ignore, c.smoothing, loss, &lse);
      auto dx = cg::tensor<double>::empty(c.shape);
      cd::cross_entropy_backward_cpu(g, x, t, w, red, ignore, c.smoothing, lse, dx);
      const std::string name = "cross_entropy_backward " + cg::shape_str(c.shape) + (c.weighted ? " weighted" : "") +
                               " ls " + std::to_string(c.smoothing) + " " + std::string(cg::to_string(red));
      check_close(dx, numeric_grad(x, f, g.to_vector()), 1e-7, 1e-6, name);
      // bf16 against the f64 gradient.
      const std::optional<cg::tensor<cg::bf16>> wb = w ? std::optional(w->to<cg::bf16>()) : std::nullopt;
      auto lb = cg::tensor<cg::bf16>::empty(ls);
      auto lseb = cg::tensor<float>::empty(target_shape(c.shape));
      cd::cross_entropy_cpu(x.to<cg::bf16>(), t, wb, red, ignore, c.smoothing, lb, &lseb);
      auto db = cg::tensor<cg::bf16>::empty(c.shape);
      cd::cross_entropy_backward_cpu(g.to<cg::bf16>(), x.to<cg::bf16>(), t, wb, red, ignore, c.smoothing, lseb, db);
      check_close(db, dx.to_vector(), 0.02, 0.05, name + " bf16");
    }
}

}  // namespace loss_tests
