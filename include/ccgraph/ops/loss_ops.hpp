// ccgraph/ops/loss_ops.hpp: cross_entropy and its backward kernel (ops/loss.hpp) as graph ops:
// op structs, op_traits and the public functions, the same way as ops/reduction_ops.hpp. The
// op gives [loss, lse] (lse: each position's logsumexp, what the backward op takes); the public
// function returns the loss. On the GPU a target that is neither a class nor ignore_index cannot
// throw without waiting for the kernel: its loss is NaN there (the CPU throws the error).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/ops/loss.hpp>
#include <ccgraph/ops/normalization_ops.hpp>
#include <ccgraph/ops/reduction_ops.hpp>

namespace ccgraph {

namespace ops {
/// torch.nn.functional.cross_entropy with class-index targets: (input, i64 target[, weight])
/// -> [loss, lse].
struct cross_entropy {
  BOOST_HANA_DEFINE_STRUCT(cross_entropy, (loss_reduction, reduction), (std::int64_t, ignore_index),
                           (double, label_smoothing), (bool, has_weight));
  static constexpr std::string_view name = "cross_entropy";
};
/// cross_entropy's gradient with respect to the input: (grad, input, target, lse[, weight]) ->
/// grad_input.
struct cross_entropy_backward {
  BOOST_HANA_DEFINE_STRUCT(cross_entropy_backward, (loss_reduction, reduction), (std::int64_t, ignore_index),
                           (double, label_smoothing), (bool, has_weight));
  static constexpr std::string_view name = "cross_entropy_backward";
};
}  // namespace ops

template <>
struct op_traits<ops::cross_entropy> : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::cross_entropy;
  /// cross_entropy_backward from the saved logsumexp; the target carries no gradient, and the
  /// class weights are not differentiated (an error when asked).
  struct gradient {
    template <class C>
    static void backward(const ops::cross_entropy& o, C& c) {
      using T = typename C::value_type;
      using S = detail::norm_stat_t<T>;
      CCGRAPH_CHECK(!c.has_grad(1), "grad: cross_entropy (node %", c.current().name(), "): its lse output is not differentiated");
      CCGRAPH_CHECK(!o.has_weight || !c.needs_grad(2), "grad: cross_entropy (node %", c.current().name(),
                    "): the gradient with respect to the class weights is not supported");
      std::optional<decltype(c.input(0))> w;
      if (o.has_weight) w = c.input(2);
      c.add_grad(0, cross_entropy_backward(c.grad(), c.input(0), c.template input<std::int64_t>(1), c.template output<S>(1),
                                           w, o.ignore_index, o.reduction, o.label_smoothing));
    }
  };
  using O = ops::cross_entropy;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, o.has_weight ? 3 : 2);
    return detail::cross_entropy_meta(in[0], in[1], detail::optional_meta(in, o.has_weight, 2), o.reduction,
                                      o.ignore_index, o.label_smoothing);
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto loss = ops::detail::out_at<T>(O::name, a, 0);
      auto lse = ops::detail::out_at<detail::norm_stat_t<T>>(O::name, a, 1);
      kernel(ops::detail::in_at<T>(O::name, a, 0), ops::detail::in_at<std::int64_t>(O::name, a, 1),
             detail::optional_in<T>(O::name, a, o.has_weight, 2), o.reduction, o.ignore_index, o.label_smoothing, loss,
             &lse);
      return {loss, lse};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::cross_entropy_cpu(xs...); });
  }
  /// A log-sum-exp per position: a few operations per logit.
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 4); }
};

template <>
struct op_traits<ops::cross_entropy_backward> : ops::detail::kernel_op_traits {
  using O = ops::cross_entropy_backward;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, o.has_weight ? 5 : 4);  // grad, input, target, lse[, weight]
    const std::optional<tensor_meta> w = detail::optional_meta(in, o.has_weight, 4);
    tensor_meta out = detail::cross_entropy_backward_meta(in[0], in[1], in[2], w, o.reduction, o.label_smoothing);
    const detail::cross_entropy_extent e = detail::cross_entropy_check(in[1], in[2], w, o.label_smoothing);
    CCGRAPH_CHECK(in[3].shape == e.positions, "cross_entropy_backward: lse of shape ", shape_str(in[3].shape),
                  " must have the target's shape ", shape_str(e.positions));
    CCGRAPH_CHECK(in[3].dtype == detail::norm_stat_dtype(in[1].dtype), "cross_entropy_backward: lse dtype ",
                  in[3].dtype, " must be ", detail::norm_stat_dtype(in[1].dtype), " for a ", in[1].dtype, " input");
    return {out};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 1, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto out = ops::detail::out_at<T>(O::name, a, 0);
      kernel(ops::detail::in_at<T>(O::name, a, 0), ops::detail::in_at<T>(O::name, a, 1),
             ops::detail::in_at<std::int64_t>(O::name, a, 2), detail::optional_in<T>(O::name, a, o.has_weight, 4),
             o.reduction, o.ignore_index, o.label_smoothing, ops::detail::in_at<detail::norm_stat_t<T>>(O::name, a, 3),
             out);
      return {out};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::cross_entropy_backward_cpu(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 4); }
};

/// cross_entropy with its saved logsumexp: std::tuple{loss, lse} (lse: float, or double for
/// f64, of the target's shape). Arguments as cross_entropy's.
template <op_value X, op_value I>
auto cross_entropy_with_lse(const X& input, const I& target, const detail::optional_arg<X>& weight = std::nullopt,
                            std::int64_t ignore_index = -100, loss_reduction reduction = loss_reduction::mean,
                            double label_smoothing = 0.0) {
  using T = detail::op_value_element_t<X>;
  using S = detail::norm_stat_t<T>;
  const ops::cross_entropy o{reduction, ignore_index, label_smoothing, weight.has_value()};
  const auto& x = detail::op_value_of(input);
  const auto& t = detail::op_value_of(target);
  if (weight) return detail::apply_op_n<T, S>(o, x, t, *weight);
  return detail::apply_op_n<T, S>(o, x, t);
}

/// torch.nn.functional.cross_entropy(input, target, weight, ignore_index=, reduction=,
/// label_smoothing=) for class-index targets: input [N, C] or [N, C, d...] (or [C]) of logits,
/// i64 target [N, d...]; reduction mean divides by the summed weights of the positions not
/// ignored. PyTorch's argument order without its deprecated size_average / reduce.
template <op_value X, op_value I>
auto cross_entropy(const X& input, const I& target, const detail::optional_arg<X>& weight = std::nullopt,
                   std::int64_t ignore_index = -100, loss_reduction reduction = loss_reduction::mean,
                   double label_smoothing = 0.0) {
  return std::get<0>(cross_entropy_with_lse(input, target, weight, ignore_index, reduction, label_smoothing));
}
/// cross_entropy with the reduction by name: "none", "mean" or "sum".
template <op_value X, op_value I>
auto cross_entropy(const X& input, const I& target, const detail::optional_arg<X>& weight, std::int64_t ignore_index,
                   std::string_view reduction, double label_smoothing = 0.0) {
  return ::ccgraph::cross_entropy(input, target, weight, ignore_index, parse_loss_reduction(reduction), label_smoothing);
}

/// cross_entropy's gradient with respect to `input`, from the forward's `lse`; `grad` has the
/// loss's shape. Arguments as cross_entropy's.
template <op_value G, op_value X, op_value I, op_value S>
auto cross_entropy_backward(const G& grad, const X& input, const I& target, const S& lse,
                            const detail::optional_arg<X>& weight = std::nullopt, std::int64_t ignore_index = -100,
                            loss_reduction reduction = loss_reduction::mean, double label_smoothing = 0.0) {
  using T = detail::op_value_element_t<X>;
  const ops::cross_entropy_backward o{reduction, ignore_index, label_smoothing, weight.has_value()};
  const auto& g = detail::op_value_of(grad);
  const auto& x = detail::op_value_of(input);
  const auto& t = detail::op_value_of(target);
  const auto& l = detail::op_value_of(lse);
  if (weight) return std::get<0>(detail::apply_op_n<T>(o, g, x, t, l, *weight));
  return std::get<0>(detail::apply_op_n<T>(o, g, x, t, l));
}

}  // namespace ccgraph
