// ccgraph/ops/loss.hpp: cross_entropy with PyTorch's semantics for class-index targets: logits
// [N, C] or [N, C, d1, ...] (or unbatched [C]), i64 targets [N, d1, ...], optional per-class
// weight, reduction none / mean / sum, ignore_index and label_smoothing. Inference with the
// user-facing errors, the CPU kernels (forward and backward); the fused CUDA kernels are in
// <ccgraph/cuda/loss.cuh>.
//
// Per position i with target t (lp = log_softmax of the logits over the classes, w the class
// weights, 1 without a weight, W their sum):
//   loss_i = (1 - ls) * (-w[t] * lp[t]) + (ls / C) * (-sum_c w[c] * lp[c]),   0 where t == ignore_index
// reduction mean divides the sum by sum_i w[t_i] over the positions not ignored (NaN when every
// position is ignored), as PyTorch. The forward also returns each position's logsumexp (`lse`,
// float, or double for f64), which the backward takes instead of recomputing the row:
//   dlogits_i[c] = g_i * ((1 - ls) * w[t] * (p_c - [c == t]) + (ls / C) * (W * p_c - w[c])),
// p_c = exp(logit_c - lse_i), g_i the incoming gradient (divided by the mean's denominator).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/ops/normalization.hpp>
#include <ccgraph/ops/reduction.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

/// How a loss combines its per-position values, as PyTorch's `reduction=` argument.
enum class loss_reduction { none, mean, sum };

/// "none", "mean" or "sum".
constexpr std::string_view to_string(loss_reduction r) {
  switch (r) {
    case loss_reduction::none: return "none";
    case loss_reduction::mean: return "mean";
    case loss_reduction::sum: return "sum";
  }
  return "?";
}

/// Parses PyTorch's reduction names; anything else is an error naming the value.
inline loss_reduction parse_loss_reduction(std::string_view s) {
  if (s == "none") return loss_reduction::none;
  if (s == "mean") return loss_reduction::mean;
  if (s == "sum") return loss_reduction::sum;
  CCGRAPH_THROW(error, "cross_entropy: reduction '", std::string(s), "' is not one of 'none', 'mean', 'sum'");
}

}  // namespace ccgraph

namespace ccgraph::detail {

/// cross_entropy's input seen as [batch, classes, inner]: the class of position (n, s) is at
/// n * classes * inner + c * inner + s of the contiguous logits, its target at n * inner + s.
struct cross_entropy_extent {
  std::int64_t batch = 1;
  std::int64_t classes = 0;
  std::int64_t inner = 1;
  /// Shape of the per-position losses (the target's).
  shape_t positions;
};

/// Checks cross_entropy's arguments with PyTorch's rules.
inline cross_entropy_extent cross_entropy_check(const tensor_meta& input, const tensor_meta& target,
                                                const std::optional<tensor_meta>& weight, double label_smoothing) {
  require_floating(input.dtype, "cross_entropy");
  CCGRAPH_CHECK(target.dtype == dtype::i64, "cross_entropy: target dtype ", target.dtype,
                " must be i64 (class indices; probability targets are not supported)");
  const shape_t& in = input.shape;
  const shape_t& tg = target.shape;
  CCGRAPH_CHECK(!in.empty(), "cross_entropy: input must have a class dim, got a 0-d tensor");
  cross_entropy_extent e;
  if (in.size() == 1) {
    CCGRAPH_CHECK(tg.empty(), "cross_entropy: unbatched input of shape ", shape_str(in),
                  " needs a 0-d target, got shape ", shape_str(tg));
    e.classes = in[0];
  } else {
    shape_t expect{in[0]};
    expect.insert(expect.end(), in.begin() + 2, in.end());
    if (tg.size() == expect.size() && !tg.empty() && tg[0] != in[0])
      CCGRAPH_THROW(error, "cross_entropy: input batch size ", in[0], " does not match target batch size ", tg[0]);
    CCGRAPH_CHECK(tg == expect, "cross_entropy: target of shape ", shape_str(tg), " does not match input of shape ",
                  shape_str(in), " (expected target shape ", shape_str(expect), ")");
    e.batch = in[0];
    e.classes = in[1];
    for (std::size_t d = 2; d < in.size(); ++d) e.inner *= in[d];
  }
  CCGRAPH_CHECK(e.classes > 0 || e.batch * e.inner == 0, "cross_entropy: input of shape ", shape_str(in),
                " has no classes");
  if (weight) {
    CCGRAPH_CHECK(weight->shape == shape_t{e.classes}, "cross_entropy: weight of shape ", shape_str(weight->shape),
                  " must have one value per class (", e.classes, ")");
    CCGRAPH_CHECK(weight->dtype == input.dtype, "cross_entropy: weight dtype ", weight->dtype,
                  " differs from input dtype ", input.dtype);
  }
  CCGRAPH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
                "cross_entropy: label_smoothing must be between 0.0 and 1.0, got ", label_smoothing);
  e.positions = tg;
  return e;
}

/// cross_entropy(input, target, weight, reduction, ignore_index, label_smoothing):
/// [loss (the input's dtype; the target's shape for none, else 0-d), lse (float / double, the
/// target's shape)].
inline std::vector<tensor_meta> cross_entropy_meta(const tensor_meta& input, const tensor_meta& target,
                                                   const std::optional<tensor_meta>& weight, loss_reduction reduction,
                                                   std::int64_t ignore_index, double label_smoothing) {
  (void)ignore_index;
  const cross_entropy_extent e = cross_entropy_check(input, target, weight, label_smoothing);
  return {{input.dtype, reduction == loss_reduction::none ? e.positions : shape_t{}},
          {norm_stat_dtype(input.dtype), e.positions}};
}

/// The gradient's meta of cross_entropy_backward: the input's.
inline tensor_meta cross_entropy_backward_meta(const tensor_meta& grad, const tensor_meta& input,
                                               const tensor_meta& target, const std::optional<tensor_meta>& weight,
                                               loss_reduction reduction, double label_smoothing) {
  const cross_entropy_extent e = cross_entropy_check(input, target, weight, label_smoothing);
  const shape_t loss = reduction == loss_reduction::none ? e.positions : shape_t{};
  CCGRAPH_CHECK(grad.shape == loss && grad.dtype == input.dtype, "cross_entropy_backward: grad ", grad.str(),
                " must match the loss ", tensor_meta{input.dtype, loss}.str());
  return input;
}

/// The error for a target that is neither a class nor ignore_index.
[[noreturn]] inline void cross_entropy_bad_target(std::int64_t t, std::int64_t classes, std::int64_t at) {
  CCGRAPH_THROW(error, "cross_entropy: target ", t, " at position ", at, " is out of bounds for ", classes,
                " classes (and is not ignore_index)");
}

/// cross_entropy on the CPU into `loss` and, when given, the per-position logsumexp `lse`.
template <class T>
void cross_entropy_cpu(const tensor<T>& input, const tensor<std::int64_t>& target,
                       const optional_tensor<T>& weight, loss_reduction reduction, std::int64_t ignore_index,
                       double label_smoothing, const tensor<T>& loss, const tensor<norm_stat_t<T>>* lse = nullptr) {
  const auto metas = cross_entropy_meta({dtype_v<T>, input.shape()}, {dtype::i64, target.shape()}, meta_of(weight),
                                        reduction, ignore_index, label_smoothing);
  const cross_entropy_extent e = cross_entropy_check({dtype_v<T>, input.shape()}, {dtype::i64, target.shape()},
                                                     meta_of(weight), label_smoothing);
  check_input("cross_entropy", "input", input, true);
  check_input("cross_entropy", "target", target, true);
  if (weight) check_input("cross_entropy", "weight", *weight, true);
  check_output("cross_entropy", "loss", loss, metas[0].shape, true);
  if (lse) check_output("cross_entropy", "lse", *lse, metas[1].shape, true);
  if constexpr (is_floating_element_v<T>) {
    using A = cpu_acc_t<T>;
    const auto val = [](T v) { return static_cast<A>(static_cast<compute_t<T>>(v)); };
    const tensor<T> x = input.contiguous();
    const tensor<std::int64_t> tg = target.contiguous();
    const std::optional<tensor<T>> wt = weight ? std::optional<tensor<T>>(weight->contiguous()) : std::nullopt;
    const T* xp = x.data();
    const std::int64_t* tp = tg.data();
    const T* wp = wt ? wt->data() : nullptr;
    const std::int64_t c_n = e.classes, inner = e.inner;
    const A ls = static_cast<A>(label_smoothing);
    A wsum = 0;  // W: the sum of the class weights
    for (std::int64_t c = 0; c < c_n; ++c) wsum += wp ? val(wp[c]) : A(1);
    A total = 0, denom = 0;
    const std::int64_t positions = e.batch * inner;
    for (std::int64_t i = 0; i < positions; ++i) {
      const std::int64_t n = i / inner, s = i % inner;
      const T* row = xp + n * c_n * inner + s;
      A m = -std::numeric_limits<A>::infinity();
      for (std::int64_t c = 0; c < c_n; ++c)
        if (beats<true>(val(row[c * inner]), m)) m = val(row[c * inner]);
      A se = 0, sx = 0;
      for (std::int64_t c = 0; c < c_n; ++c) {
        const A v = val(row[c * inner]);
        se += std::exp(v - m);
        if (label_smoothing > 0) sx += (wp ? val(wp[c]) : A(1)) * v;
      }
      const A l = m + std::log(se);
      if (lse) lse->data()[i] = static_cast<norm_stat_t<T>>(l);
      const std::int64_t t = tp[i];
      A li = 0;
      if (t != ignore_index) {
        if (t < 0 || t >= c_n) cross_entropy_bad_target(t, c_n, i);
        const A w_t = wp ? val(wp[t]) : A(1);
        li = (A(1) - ls) * w_t * (l - val(row[t * inner]));
        if (label_smoothing > 0) li += ls / static_cast<A>(c_n) * (l * wsum - sx);
        denom += w_t;
      }
      if (reduction == loss_reduction::none) loss.data()[i] = cast<T>(li);
      total += li;
    }
    if (reduction == loss_reduction::sum) loss.data()[0] = cast<T>(total);
    if (reduction == loss_reduction::mean) loss.data()[0] = cast<T>(total / denom);
  }
}

/// cross_entropy's backward on the CPU: the gradient with respect to the logits, from the
/// forward's `lse` (see the header comment for the formula).
template <class T>
void cross_entropy_backward_cpu(const tensor<T>& grad, const tensor<T>& input, const tensor<std::int64_t>& target,
                                const optional_tensor<T>& weight, loss_reduction reduction,
                                std::int64_t ignore_index, double label_smoothing, const tensor<norm_stat_t<T>>& lse,
                                const tensor<T>& grad_in) {
  (void)cross_entropy_backward_meta({dtype_v<T>, grad.shape()}, {dtype_v<T>, input.shape()},
                                    {dtype::i64, target.shape()}, meta_of(weight), reduction, label_smoothing);
  const cross_entropy_extent e = cross_entropy_check({dtype_v<T>, input.shape()}, {dtype::i64, target.shape()},
                                                     meta_of(weight), label_smoothing);
  CCGRAPH_CHECK(lse.shape() == e.positions, "cross_entropy_backward: lse of shape ", shape_str(lse.shape()),
                " must have the target's shape ", shape_str(e.positions));
  check_input("cross_entropy_backward", "grad", grad, true);
  check_input("cross_entropy_backward", "input", input, true);
  check_input("cross_entropy_backward", "target", target, true);
  check_input("cross_entropy_backward", "lse", lse, true);
  check_output("cross_entropy_backward", "grad_input", grad_in, input.shape(), true);
  if constexpr (is_floating_element_v<T>) {
    using A = cpu_acc_t<T>;
    const auto val = [](T v) { return static_cast<A>(static_cast<compute_t<T>>(v)); };
    const tensor<T> x = input.contiguous();
    const tensor<std::int64_t> tg = target.contiguous();
    const tensor<norm_stat_t<T>> lc = lse.contiguous();
    const tensor<T> gc = grad.contiguous();
    const std::optional<tensor<T>> wt = weight ? std::optional<tensor<T>>(weight->contiguous()) : std::nullopt;
    const T* xp = x.data();
    const std::int64_t* tp = tg.data();
    const T* wp = wt ? wt->data() : nullptr;
    T* dx = grad_in.data();
    const std::int64_t c_n = e.classes, inner = e.inner, positions = e.batch * inner;
    const A ls = static_cast<A>(label_smoothing);
    A wsum = 0;
    for (std::int64_t c = 0; c < c_n; ++c) wsum += wp ? val(wp[c]) : A(1);
    // sum and mean: one incoming gradient; none: one per position, and an empty batch has none
    // (its grad's data may be null: never read it).
    A scale = reduction == loss_reduction::none ? A(0) : val(gc.data()[0]);
    if (reduction == loss_reduction::mean) {
      A denom = 0;
      for (std::int64_t i = 0; i < positions; ++i)
        if (tp[i] != ignore_index && tp[i] >= 0 && tp[i] < c_n) denom += wp ? val(wp[tp[i]]) : A(1);
      scale /= denom;
    }
    for (std::int64_t i = 0; i < positions; ++i) {
      const std::int64_t n = i / inner, s = i % inner;
      const std::int64_t base = n * c_n * inner + s;
      const std::int64_t t = tp[i];
      if (t == ignore_index) {
        for (std::int64_t c = 0; c < c_n; ++c) dx[base + c * inner] = T(0);
        continue;
      }
      if (t < 0 || t >= c_n) cross_entropy_bad_target(t, c_n, i);
      const A gi = reduction == loss_reduction::none ? val(gc.data()[i]) : scale;
      const A w_t = wp ? val(wp[t]) : A(1);
      const A l = static_cast<A>(lc.data()[i]);
      for (std::int64_t c = 0; c < c_n; ++c) {
        const A p = std::exp(val(xp[base + c * inner]) - l);
        A d = (A(1) - ls) * w_t * (p - (c == t ? A(1) : A(0)));
        if (label_smoothing > 0) d += ls / static_cast<A>(c_n) * (wsum * p - (wp ? val(wp[c]) : A(1)));
        dx[base + c * inner] = cast<T>(gi * d);
      }
    }
  }
}

}  // namespace ccgraph::detail
