// ccgraph/ops/normalization_ops.hpp: softmax, log_softmax, layer_norm and rms_norm (and their
// backward kernels) of ops/normalization.hpp as graph ops: op structs, op_traits and the public
// functions. As in ops/reduction_ops.hpp, inference calls the kernels' `_meta` / check functions
// and one `run_with` serves the CPU kernel (run) and the CUDA one (cuda_impl, in
// <ccgraph/cuda/normalization.cuh>).
//
// The norms are PyTorch's native forms: layer_norm gives [output, mean, rstd] and rms_norm
// [output, rstd] (the statistics the backward ops take); the public functions return the output.
// Optional weight and bias are inputs present or not, which the op's has_weight / has_bias say.
#pragma once

#include <ccgraph/core/config.hpp>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/ops/normalization.hpp>
#include <ccgraph/ops/reduction_ops.hpp>

namespace ccgraph {

namespace ops {
/// torch.softmax(x, dim).
struct softmax {
  BOOST_HANA_DEFINE_STRUCT(softmax, (std::int64_t, dim));
  static constexpr std::string_view name = "softmax";
};
/// torch.log_softmax(x, dim).
struct log_softmax {
  BOOST_HANA_DEFINE_STRUCT(log_softmax, (std::int64_t, dim));
  static constexpr std::string_view name = "log_softmax";
};
/// softmax's gradient (grad, softmax's output -> grad_input).
struct softmax_backward {
  BOOST_HANA_DEFINE_STRUCT(softmax_backward, (std::int64_t, dim));
  static constexpr std::string_view name = "softmax_backward";
};
/// log_softmax's gradient (grad, log_softmax's output -> grad_input).
struct log_softmax_backward {
  BOOST_HANA_DEFINE_STRUCT(log_softmax_backward, (std::int64_t, dim));
  static constexpr std::string_view name = "log_softmax_backward";
};
/// torch.native_layer_norm: (x[, weight][, bias]) -> [output, mean, rstd].
struct layer_norm {
  BOOST_HANA_DEFINE_STRUCT(layer_norm, (std::vector<std::int64_t>, normalized_shape), (double, eps),
                           (bool, has_weight), (bool, has_bias));
  static constexpr std::string_view name = "layer_norm";
};
/// rms_norm with its saved statistic: (x[, weight]) -> [output, rstd]. `eps` is resolved when
/// the op is made (PyTorch's default: the machine epsilon of the type it computes in).
struct rms_norm {
  BOOST_HANA_DEFINE_STRUCT(rms_norm, (std::vector<std::int64_t>, normalized_shape), (double, eps),
                           (bool, has_weight));
  static constexpr std::string_view name = "rms_norm";
};
/// layer_norm's gradient: (grad, input, mean, rstd[, weight]) -> [grad_input[, grad_weight]
/// [, grad_bias]]: grad_weight when has_weight, grad_bias when has_bias (the forward had them).
struct layer_norm_backward {
  BOOST_HANA_DEFINE_STRUCT(layer_norm_backward, (std::vector<std::int64_t>, normalized_shape), (bool, has_weight),
                           (bool, has_bias));
  static constexpr std::string_view name = "layer_norm_backward";
};
/// rms_norm's gradient: (grad, input, rstd[, weight]) -> [grad_input[, grad_weight]].
struct rms_norm_backward {
  BOOST_HANA_DEFINE_STRUCT(rms_norm_backward, (std::vector<std::int64_t>, normalized_shape), (bool, has_weight));
  static constexpr std::string_view name = "rms_norm_backward";
};
}  // namespace ops

namespace detail {

/// softmax and log_softmax.
template <class O, bool Log>
struct softmax_op_traits : ops::detail::kernel_op_traits {
  /// softmax_backward / log_softmax_backward from the output.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      if constexpr (Log)
        c.add_grad(0, log_softmax_backward(c.grad(), c.output(), o.dim));
      else
        c.add_grad(0, softmax_backward(c.grad(), c.output(), o.dim));
    }
  };
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return {softmax_meta(in[0], o.dim, O::name.data())};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::run_reduction<ops::detail::same_t, true>(O::name, a, kernel, o.dim);
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { softmax_cpu_impl<Log>(xs...); });
  }
  /// max, exp, sum, divide: a few operations per element.
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 5); }
};

/// softmax_backward and log_softmax_backward.
template <class O, bool Log>
struct softmax_backward_op_traits : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::softmax_backward;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 2);  // grad, output
    return {softmax_backward_meta(in[0], in[1], o.dim, O::name.data())};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto out = ops::detail::out_at<T>(O::name, a, 0);
      kernel(ops::detail::in_at<T>(O::name, a, 0), ops::detail::in_at<T>(O::name, a, 1), o.dim, out);
      return {out};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { softmax_backward_cpu_impl<Log>(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 4); }
};

/// Input k as an optional parameter tensor: present when `has`, else std::nullopt.
template <class T>
optional_tensor<T> optional_in(std::string_view what, const run_args& a, bool has, std::size_t k) {
  if (!has) return std::nullopt;
  return ops::detail::in_at<T>(what, a, k);
}

/// The optional parameter metas of a norm: weight at input 1 when present, then bias.
CCGRAPH_DECL std::optional<tensor_meta> optional_meta(const std::vector<tensor_meta>& in, bool has, std::size_t k);

/// Checks a norm backward's input dtypes (grad, input and weight one floating dtype; the
/// statistics norm_stat_dtype of it), then its shapes with the kernels' own check, run on
/// storage-less tensors of the metas.
template <bool RMS>
void norm_backward_infer_check(const char* what, const std::vector<tensor_meta>& in, const shape_t& normalized_shape,
                               bool has_weight, bool has_bias) {
  const std::size_t stats = RMS ? 1 : 2;
  ops::detail::expect_inputs(what, in, 2 + stats + (has_weight ? 1 : 0));
  const tensor_meta& grad = in[0];
  const tensor_meta& x = in[1];
  require_floating(x.dtype, what);
  CCGRAPH_CHECK(grad.dtype == x.dtype, what, ": grad dtype ", grad.dtype, " differs from input dtype ", x.dtype);
  for (std::size_t k = 2; k < 2 + stats; ++k)
    CCGRAPH_CHECK(in[k].dtype == norm_stat_dtype(x.dtype), what, ": saved statistics of dtype ", in[k].dtype,
                  " must be ", norm_stat_dtype(x.dtype), " for a ", x.dtype, " input");
  (void)ops::detail::visit_floating(x.dtype, what, [&](auto tag) {
    using T = decltype(tag);
    using S = norm_stat_t<T>;
    const tensor<S> mean = meta_tensor<S>(in[2]);
    const tensor<S> rstd = meta_tensor<S>(in[2 + stats - 1]);
    const optional_tensor<T> w =
        has_weight ? optional_tensor<T>(meta_tensor<T>(in[2 + stats])) : optional_tensor<T>(std::nullopt);
    const tensor<T> gi = meta_tensor<T>(x);
    const tensor<T> gw = meta_tensor<T>({x.dtype, normalized_shape});
    (void)norm_backward_check(what, meta_tensor<T>(grad), meta_tensor<T>(x), normalized_shape, RMS ? nullptr : &mean,
                              rstd, w, &gi, has_weight ? &gw : nullptr, has_bias ? &gw : nullptr, true);
    return 0;
  });
}

}  // namespace detail

template <>
struct op_traits<ops::softmax> : detail::softmax_op_traits<ops::softmax, false> {
  using sharding = sharding_rules::softmax;
};
template <>
struct op_traits<ops::log_softmax> : detail::softmax_op_traits<ops::log_softmax, true> {
  using sharding = sharding_rules::softmax;
};
template <>
struct op_traits<ops::softmax_backward> : detail::softmax_backward_op_traits<ops::softmax_backward, false> {};
template <>
struct op_traits<ops::log_softmax_backward> : detail::softmax_backward_op_traits<ops::log_softmax_backward, true> {};

template <>
struct op_traits<ops::layer_norm> : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::layer_norm;
  /// layer_norm_backward from the saved mean and rstd (the statistics carry no gradient).
  struct gradient {
    template <class C>
    static void backward(const ops::layer_norm& o, C& c) {
      using T = typename C::value_type;
      using S = detail::norm_stat_t<T>;
      CCGRAPH_CHECK(!c.has_grad(1) && !c.has_grad(2), "grad: layer_norm (node %", c.current().name(),
                    "): its mean and rstd outputs are not differentiated");
      std::optional<decltype(c.input(0))> w;
      if (o.has_weight) w = c.input(1);
      auto [gi, gw, gb] = layer_norm_backward(c.grad(), c.input(0), o.normalized_shape, c.template output<S>(1),
                                              c.template output<S>(2), w, o.has_bias);
      c.add_grad(0, gi);
      if (o.has_weight) c.add_grad(1, *gw);
      if (o.has_bias) c.add_grad(o.has_weight ? 2 : 1, *gb);
    }
  };
  using O = ops::layer_norm;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1 + (o.has_weight ? 1 : 0) + (o.has_bias ? 1 : 0));
    return detail::layer_norm_meta(in[0], o.normalized_shape, detail::optional_meta(in, o.has_weight, 1),
                                   detail::optional_meta(in, o.has_bias, o.has_weight ? 2 : 1), o.eps);
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      using S = detail::norm_stat_t<T>;
      auto out = ops::detail::out_at<T>(O::name, a, 0);
      auto mean = ops::detail::out_at<S>(O::name, a, 1);
      auto rstd = ops::detail::out_at<S>(O::name, a, 2);
      kernel(ops::detail::in_at<T>(O::name, a, 0), o.normalized_shape, detail::optional_in<T>(O::name, a, o.has_weight, 1),
             detail::optional_in<T>(O::name, a, o.has_bias, o.has_weight ? 2 : 1), o.eps, out, &mean, &rstd);
      return {out, mean, rstd};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::layer_norm_cpu(xs...); });
  }
  /// Two passes over each row, then the affine transform.
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 8); }
};

template <>
struct op_traits<ops::rms_norm> : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::layer_norm;
  /// rms_norm_backward from the saved rstd (which carries no gradient).
  struct gradient {
    template <class C>
    static void backward(const ops::rms_norm& o, C& c) {
      using T = typename C::value_type;
      using S = detail::norm_stat_t<T>;
      CCGRAPH_CHECK(!c.has_grad(1), "grad: rms_norm (node %", c.current().name(), "): its rstd output is not differentiated");
      std::optional<decltype(c.input(0))> w;
      if (o.has_weight) w = c.input(1);
      auto [gi, gw] = rms_norm_backward(c.grad(), c.input(0), o.normalized_shape, c.template output<S>(1), w);
      c.add_grad(0, gi);
      if (o.has_weight) c.add_grad(1, *gw);
    }
  };
  using O = ops::rms_norm;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1 + (o.has_weight ? 1 : 0));
    return detail::rms_norm_meta(in[0], o.normalized_shape, detail::optional_meta(in, o.has_weight, 1), o.eps);
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto out = ops::detail::out_at<T>(O::name, a, 0);
      auto rstd = ops::detail::out_at<detail::norm_stat_t<T>>(O::name, a, 1);
      kernel(ops::detail::in_at<T>(O::name, a, 0), o.normalized_shape, detail::optional_in<T>(O::name, a, o.has_weight, 1),
             std::optional<double>(o.eps), out, &rstd);
      return {out, rstd};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::rms_norm_cpu(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 5); }
};

template <>
struct op_traits<ops::layer_norm_backward> : ops::detail::kernel_op_traits {
  using O = ops::layer_norm_backward;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&);
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      using S = detail::norm_stat_t<T>;
      std::vector<any_tensor> outs{ops::detail::out_at<T>(O::name, a, 0)};
      if (o.has_weight) outs.push_back(ops::detail::out_at<T>(O::name, a, 1));
      if (o.has_bias) outs.push_back(ops::detail::out_at<T>(O::name, a, o.has_weight ? 2 : 1));
      const tensor<T>& gi = get_tensor<T>(outs[0], O::name.data());
      const tensor<T>* gw = o.has_weight ? &get_tensor<T>(outs[1], O::name.data()) : nullptr;
      const tensor<T>* gb = o.has_bias ? &get_tensor<T>(outs.back(), O::name.data()) : nullptr;
      kernel(ops::detail::in_at<T>(O::name, a, 0), ops::detail::in_at<T>(O::name, a, 1), o.normalized_shape,
             ops::detail::in_at<S>(O::name, a, 2), ops::detail::in_at<S>(O::name, a, 3),
             detail::optional_in<T>(O::name, a, o.has_weight, 4), &gi, gw, gb);
      return outs;
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::layer_norm_backward_cpu(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 10); }
};

template <>
struct op_traits<ops::rms_norm_backward> : ops::detail::kernel_op_traits {
  using O = ops::rms_norm_backward;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&);
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      using S = detail::norm_stat_t<T>;
      std::vector<any_tensor> outs{ops::detail::out_at<T>(O::name, a, 0)};
      if (o.has_weight) outs.push_back(ops::detail::out_at<T>(O::name, a, 1));
      const tensor<T>& gi = get_tensor<T>(outs[0], O::name.data());
      const tensor<T>* gw = o.has_weight ? &get_tensor<T>(outs[1], O::name.data()) : nullptr;
      kernel(ops::detail::in_at<T>(O::name, a, 0), ops::detail::in_at<T>(O::name, a, 1), o.normalized_shape,
             ops::detail::in_at<S>(O::name, a, 2), detail::optional_in<T>(O::name, a, o.has_weight, 3), &gi, gw);
      return outs;
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::rms_norm_backward_cpu(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 8); }
};

// ---- the public functions ----

/// torch.softmax(x, dim): exp(x - max) / sum(exp(x - max)) along `dim`; floating inputs only.
template <op_value X>
auto softmax(const X& x, std::int64_t dim) {
  return detail::apply_op(ops::softmax{dim}, detail::op_value_of(x));
}
/// torch.log_softmax(x, dim).
template <op_value X>
auto log_softmax(const X& x, std::int64_t dim) {
  return detail::apply_op(ops::log_softmax{dim}, detail::op_value_of(x));
}
/// softmax's gradient given softmax's `output`: output * (grad - sum(grad * output)) along dim.
template <op_value G, op_value Y>
auto softmax_backward(const G& grad, const Y& output, std::int64_t dim) {
  using T = detail::op_value_element_t<Y>;
  return std::get<0>(
      detail::apply_op_n<T>(ops::softmax_backward{dim}, detail::op_value_of(grad), detail::op_value_of(output)));
}
/// log_softmax's gradient given log_softmax's `output`: grad - exp(output) * sum(grad) along dim.
template <op_value G, op_value Y>
auto log_softmax_backward(const G& grad, const Y& output, std::int64_t dim) {
  using T = detail::op_value_element_t<Y>;
  return std::get<0>(
      detail::apply_op_n<T>(ops::log_softmax_backward{dim}, detail::op_value_of(grad), detail::op_value_of(output)));
}

namespace detail {
/// An optional argument of an op function: the value (a tensor, a traced value or an
/// expression, as the function's first argument) or std::nullopt.
template <class X>
using optional_arg = std::optional<std::remove_cvref_t<decltype(op_value_of(std::declval<const X&>()))>>;

}  // namespace detail

/// torch.native_layer_norm(x, normalized_shape, weight, bias, eps): std::tuple{output, mean,
/// rstd} (the statistics float, or double for f64; of shape x.shape[:axis] + [1, ...]).
template <op_value X>
auto native_layer_norm(const X& x, const std::vector<std::int64_t>& normalized_shape,
                       const detail::optional_arg<X>& weight, const detail::optional_arg<X>& bias, double eps) {
  using T = detail::op_value_element_t<X>;
  using S = detail::norm_stat_t<T>;
  const ops::layer_norm o{normalized_shape, eps, weight.has_value(), bias.has_value()};
  const auto& v = detail::op_value_of(x);
  if (weight && bias) return detail::apply_op_n<T, S, S>(o, v, *weight, *bias);
  if (weight) return detail::apply_op_n<T, S, S>(o, v, *weight);
  if (bias) return detail::apply_op_n<T, S, S>(o, v, *bias);
  return detail::apply_op_n<T, S, S>(o, v);
}

/// torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps): (x - mean) / sqrt(var
/// + eps) * weight + bias over the trailing `normalized_shape` dims.
template <op_value X>
auto layer_norm(const X& x, const std::vector<std::int64_t>& normalized_shape,
                const detail::optional_arg<X>& weight = std::nullopt, const detail::optional_arg<X>& bias = std::nullopt,
                double eps = 1e-5) {
  return std::get<0>(native_layer_norm(x, normalized_shape, weight, bias, eps));
}
/// layer_norm(x, weight, bias, eps) (API.md's form): over the trailing dims of weight's shape.
template <op_value X, op_value W>
auto layer_norm(const X& x, const W& weight, const detail::optional_arg<X>& bias = std::nullopt, double eps = 1e-5) {
  const auto& w = detail::op_value_of(weight);
  return ::ccgraph::layer_norm(x, w.shape(), detail::optional_arg<X>(w), bias, eps);
}

/// rms_norm with its saved statistic: std::tuple{output, rstd}. `eps` defaults to the machine
/// epsilon of the type it computes in (float, or double for f64), as PyTorch.
template <op_value X>
auto rms_norm_with_rstd(const X& x, const std::vector<std::int64_t>& normalized_shape,
                        const detail::optional_arg<X>& weight, std::optional<double> eps) {
  using T = detail::op_value_element_t<X>;
  using S = detail::norm_stat_t<T>;
  const ops::rms_norm o{normalized_shape, eps.value_or(detail::rms_norm_default_eps(dtype_v<T>)), weight.has_value()};
  const auto& v = detail::op_value_of(x);
  if (weight) return detail::apply_op_n<T, S>(o, v, *weight);
  return detail::apply_op_n<T, S>(o, v);
}

/// torch.nn.functional.rms_norm(x, normalized_shape, weight, eps): x / sqrt(mean(x^2) + eps) *
/// weight over the trailing `normalized_shape` dims.
template <op_value X>
auto rms_norm(const X& x, const std::vector<std::int64_t>& normalized_shape,
              const detail::optional_arg<X>& weight = std::nullopt, std::optional<double> eps = std::nullopt) {
  return std::get<0>(rms_norm_with_rstd(x, normalized_shape, weight, eps));
}
/// rms_norm(x, weight, eps): over the trailing dims of weight's shape.
template <op_value X, op_value W>
auto rms_norm(const X& x, const W& weight, std::optional<double> eps = std::nullopt) {
  const auto& w = detail::op_value_of(weight);
  return ::ccgraph::rms_norm(x, w.shape(), detail::optional_arg<X>(w), eps);
}

/// layer_norm's gradient from the saved `mean` and `rstd`: std::tuple{grad_input, grad_weight,
/// grad_bias}, the last two std::nullopt unless `weight` was given / `bias_grad` is asked for.
template <op_value G, op_value X, op_value S>
auto layer_norm_backward(const G& grad, const X& input, const std::vector<std::int64_t>& normalized_shape,
                         const S& mean, const S& rstd, const detail::optional_arg<X>& weight, bool bias_grad) {
  using T = detail::op_value_element_t<X>;
  using V = std::remove_cvref_t<decltype(detail::op_value_of(input))>;
  const ops::layer_norm_backward o{normalized_shape, weight.has_value(), bias_grad};
  const auto& g = detail::op_value_of(grad);
  const auto& x = detail::op_value_of(input);
  const auto& m = detail::op_value_of(mean);
  const auto& r = detail::op_value_of(rstd);
  using R = std::tuple<V, std::optional<V>, std::optional<V>>;
  if (weight && bias_grad) {
    auto [gi, gw, gb] = detail::apply_op_n<T, T, T>(o, g, x, m, r, *weight);
    return R{gi, gw, gb};
  }
  if (weight) {
    auto [gi, gw] = detail::apply_op_n<T, T>(o, g, x, m, r, *weight);
    return R{gi, gw, std::nullopt};
  }
  if (bias_grad) {
    auto [gi, gb] = detail::apply_op_n<T, T>(o, g, x, m, r);
    return R{gi, std::nullopt, gb};
  }
  return R{std::get<0>(detail::apply_op_n<T>(o, g, x, m, r)), std::nullopt, std::nullopt};
}

/// rms_norm's gradient from the saved `rstd`: std::tuple{grad_input, grad_weight} (std::nullopt
/// without a weight).
template <op_value G, op_value X, op_value S>
auto rms_norm_backward(const G& grad, const X& input, const std::vector<std::int64_t>& normalized_shape, const S& rstd,
                       const detail::optional_arg<X>& weight) {
  using T = detail::op_value_element_t<X>;
  using V = std::remove_cvref_t<decltype(detail::op_value_of(input))>;
  const ops::rms_norm_backward o{normalized_shape, weight.has_value()};
  const auto& g = detail::op_value_of(grad);
  const auto& x = detail::op_value_of(input);
  const auto& r = detail::op_value_of(rstd);
  if (weight) {
    auto [gi, gw] = detail::apply_op_n<T, T>(o, g, x, r, *weight);
    return std::tuple<V, std::optional<V>>{gi, gw};
  }
  return std::tuple<V, std::optional<V>>{std::get<0>(detail::apply_op_n<T>(o, g, x, r)), std::nullopt};
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/normalization_ops.ipp>
#endif
