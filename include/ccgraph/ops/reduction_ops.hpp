// ccgraph/ops/reduction_ops.hpp: the reductions of ops/reduction.hpp as graph ops (sum, mean,
// var, amax, amin, max / min over everything or along a dim, argmax, argmin, and the backward
// kernels of amax / max / var), each an op struct with its op_traits and its public function.
// Inference calls the kernels' `_meta` functions (the same errors eager and traced); `run` calls
// the `_cpu` kernel, the op's cuda_impl (<ccgraph/cuda/reduction.cuh>) the `_cuda` one, both
// through one `run_with`, so the outputs and the dtype dispatch are written once.
//
// Also the pieces the normalization and loss ops share (ops::detail): the output buffer of a
// run, the floating dtype dispatch, the row-wise cost, and `op_value`, what the public op
// functions take (a tensor, a traced value, or a pointwise expression over either).
#pragma once

#include <ccgraph/core/config.hpp>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/ops/op_traits.hpp>
#include <ccgraph/ops/reduction.hpp>

namespace ccgraph {

// =============================================================================================
// What the reduction, normalization and loss ops share
// =============================================================================================

/// What the op functions of reductions, norms and losses take: a tensor, a traced value, or a
/// pointwise expression over either (evaluated first, as an eager `tensor<T> t = expr;` would).
template <class X>
concept op_value = tensor_type<X> || is_symbolic_v<std::remove_cvref_t<X>> || expression<X>;

namespace detail {
/// `x` as a tensor or traced value: itself, or a pointwise expression materialised (a fused
/// pointwise node when traced).
template <class X>
decltype(auto) op_value_of(const X& x) {
  if constexpr (expression<X>) {
    using T = typename X::value_type;
    if constexpr (is_traced_v<X>)
      return symbolic<T>(x);
    else
      return tensor<T>(x);
  } else {
    return (x);
  }
}
/// The element type of op_value `X`.
template <class X>
using op_value_element_t = typename std::remove_cvref_t<X>::value_type;
}  // namespace detail

namespace ops::detail {

/// Output k of a run: the planned buffer, or a new tensor of its meta on the run's device.
template <class U>
tensor<U> out_at(std::string_view what, const run_args& a, std::size_t k) {
  return a.outs.empty() ? tensor<U>::empty(a.metas.at(k).shape, a.dev) : get_tensor<U>(a.outs.at(k), what.data());
}

/// Input k of a run as a tensor<U> (an error naming the op when it holds another dtype).
template <class U>
const tensor<U>& in_at(std::string_view what, const run_args& a, std::size_t k) {
  return get_tensor<U>(a.in.at(k), what.data());
}

/// Calls f(T{}) for floating dtype `d`; any other is require_floating's error naming `what`
/// (inference has refused it already: this only keeps the non-floating kernels uninstantiated).
template <class F>
decltype(auto) visit_floating(dtype d, const char* what, F&& f) {
  switch (d) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::bf16: return f(bf16{});
    case dtype::f16: return f(f16{});
    default: break;
  }
  ::ccgraph::detail::require_floating(d, what);
  return f(float{});  // not reached
}

/// Calls f(T{}) with input k's element type: any dtype, or (Floating) the floating ones only.
template <bool Floating, class F>
decltype(auto) visit_input(std::string_view what, const run_args& a, std::size_t k, F&& f) {
  const dtype d = meta_of(a.in.at(k)).dtype;
  if constexpr (Floating)
    return visit_floating(d, what.data(), f);
  else
    return visit_dtype(d, f);
}

/// The cost of an op that reads its inputs and writes its outputs once, doing `flops_per_elem`
/// vector operations per element of input 0 (reductions, softmax, norms, losses: memory-bound).
CCGRAPH_DECL op_cost rowwise_cost(const cost_args& a, double flops_per_elem);

/// The traits every kernel-backed compute op shares: new buffers, the CPU kernel in run and the
/// CUDA one in its cuda_impl, rule slots still to fill.
struct kernel_op_traits {
  static constexpr op_category category = op_category::compute;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::cuda_impl;
  using gradient = gradient_todo;
  using sharding = sharding_todo;
};

/// A reduction's element type rule: the input's own (amax, mean, ...).
template <class T>
using same_t = T;

/// run_with of a reduction of one input into one output of element type Out<T>:
/// kernel(x, attrs..., out). Floating: floating inputs only (mean, var).
template <template <class> class Out, bool Floating, class K, class... A>
std::vector<any_tensor> run_reduction(std::string_view what, const run_args& a, const K& kernel, const A&... attrs) {
  return visit_input<Floating>(what, a, 0, [&](auto tag) -> std::vector<any_tensor> {
    using T = decltype(tag);
    auto out = out_at<Out<T>>(what, a, 0);
    kernel(in_at<T>(what, a, 0), attrs..., out);
    return {out};
  });
}

}  // namespace ops::detail

// =============================================================================================
// The op structs
// =============================================================================================

namespace ops {
/// torch.sum(x, dims, keepdim): integer and bool inputs sum to i64. Empty dims: every dim.
struct sum {
  BOOST_HANA_DEFINE_STRUCT(sum, (std::vector<std::int64_t>, dims), (bool, keepdim));
  static constexpr std::string_view name = "sum";
};
/// torch.mean(x, dims, keepdim): floating inputs only.
struct mean {
  BOOST_HANA_DEFINE_STRUCT(mean, (std::vector<std::int64_t>, dims), (bool, keepdim));
  static constexpr std::string_view name = "mean";
};
/// torch.var(x, dims, correction=, keepdim=): floating inputs only.
struct var {
  BOOST_HANA_DEFINE_STRUCT(var, (std::vector<std::int64_t>, dims), (double, correction), (bool, keepdim));
  static constexpr std::string_view name = "var";
};
/// torch.amax(x, dims, keepdim).
struct amax {
  BOOST_HANA_DEFINE_STRUCT(amax, (std::vector<std::int64_t>, dims), (bool, keepdim));
  static constexpr std::string_view name = "amax";
};
/// torch.amin(x, dims, keepdim).
struct amin {
  BOOST_HANA_DEFINE_STRUCT(amin, (std::vector<std::int64_t>, dims), (bool, keepdim));
  static constexpr std::string_view name = "amin";
};
/// torch.max(x): the largest element, 0-d.
struct max {
  BOOST_HANA_DEFINE_STRUCT(max);
  static constexpr std::string_view name = "max";
};
/// torch.min(x): the smallest element, 0-d.
struct min {
  BOOST_HANA_DEFINE_STRUCT(min);
  static constexpr std::string_view name = "min";
};
/// torch.max(x, dim, keepdim): [values, i64 indices of the first maximum].
struct max_dim {
  BOOST_HANA_DEFINE_STRUCT(max_dim, (std::int64_t, dim), (bool, keepdim));
  static constexpr std::string_view name = "max_dim";
};
/// torch.min(x, dim, keepdim): [values, i64 indices of the first minimum].
struct min_dim {
  BOOST_HANA_DEFINE_STRUCT(min_dim, (std::int64_t, dim), (bool, keepdim));
  static constexpr std::string_view name = "min_dim";
};
/// torch.argmax(x, dim, keepdim): i64; without a dim, into the flattened input.
struct argmax {
  BOOST_HANA_DEFINE_STRUCT(argmax, (std::optional<std::int64_t>, dim), (bool, keepdim));
  static constexpr std::string_view name = "argmax";
};
/// torch.argmin(x, dim, keepdim).
struct argmin {
  BOOST_HANA_DEFINE_STRUCT(argmin, (std::optional<std::int64_t>, dim), (bool, keepdim));
  static constexpr std::string_view name = "argmin";
};
/// The gradient of amax and of amin (grad, input, result -> grad_input): grad split evenly
/// over the elements equal to the result.
struct amax_backward {
  BOOST_HANA_DEFINE_STRUCT(amax_backward, (std::vector<std::int64_t>, dims), (bool, keepdim));
  static constexpr std::string_view name = "amax_backward";
};
/// The gradient of max() and min() without a dim (grad, input, result -> grad_input).
struct max_backward {
  BOOST_HANA_DEFINE_STRUCT(max_backward);
  static constexpr std::string_view name = "max_backward";
};
/// The gradient of max(dim) and min(dim) (grad, indices -> grad_input of `input_shape`):
/// PyTorch's value_selecting_reduction_backward.
struct max_dim_backward {
  BOOST_HANA_DEFINE_STRUCT(max_dim_backward, (std::int64_t, dim), (bool, keepdim),
                           (std::vector<std::int64_t>, input_shape));
  static constexpr std::string_view name = "max_dim_backward";
};
/// The gradient of var (grad, input -> grad_input).
struct var_backward {
  BOOST_HANA_DEFINE_STRUCT(var_backward, (std::vector<std::int64_t>, dims), (double, correction), (bool, keepdim));
  static constexpr std::string_view name = "var_backward";
};
}  // namespace ops

// =============================================================================================
// Their traits
// =============================================================================================

template <>
struct op_traits<ops::sum> : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::reduction;
  /// The gradient broadcast back over the summed dims.
  struct gradient {
    template <class C>
    static void backward(const ops::sum& o, C& c) {
      const auto x = c.input(0);
      const shape_t kept = detail::sum_meta({x.dtype(), x.shape()}, o.dims, true).shape;
      c.add_grad(0, c.expand_as(c.grad().reshape(kept), x));
    }
  };
  using O = ops::sum;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return {detail::sum_meta(in[0], o.dims, o.keepdim)};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::run_reduction<detail::sum_t, false>(O::name, a, kernel, o.dims, o.keepdim);
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::sum_cpu(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 1); }
};

template <>
struct op_traits<ops::mean> : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::reduction;
  /// The gradient over the count, broadcast back over the averaged dims.
  struct gradient {
    template <class C>
    static void backward(const ops::mean& o, C& c) {
      const auto x = c.input(0);
      const shape_t kept = detail::sum_meta({x.dtype(), x.shape()}, o.dims, true).shape;
      const double count = double(x.numel()) / double(std::max<std::int64_t>(1, numel_of(kept)));
      c.add_grad(0, c.expand_as(decltype(x)(c.grad().reshape(kept) / count), x));
    }
  };
  using O = ops::mean;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return {detail::mean_meta(in[0], o.dims, o.keepdim)};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::run_reduction<ops::detail::same_t, true>(O::name, a, kernel, o.dims, o.keepdim);
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::mean_cpu(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 1); }
};

template <>
struct op_traits<ops::var> : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::var;
  /// var_backward (grad, input).
  struct gradient {
    template <class C>
    static void backward(const ops::var& o, C& c) {
      c.add_grad(0, var_backward(c.grad(), c.input(0), o.dims, o.correction, o.keepdim));
    }
  };
  using O = ops::var;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return {detail::var_meta(in[0], o.dims, o.correction, o.keepdim)};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::run_reduction<ops::detail::same_t, true>(O::name, a, kernel, o.dims, o.correction, o.keepdim);
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::var_cpu(xs...); });
  }
  /// Welford: a handful of operations per element.
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 5); }
};

namespace detail {
/// amax and amin: one definition, `Max` picks the kernel.
template <class O, bool Max>
struct extreme_op_traits : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::extreme;
  /// amax_backward: the gradient split evenly over the elements equal to the result.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      c.add_grad(0, amax_backward(c.grad(), c.input(0), c.output(0), o.dims, o.keepdim));
    }
  };
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return {detail::amax_meta(in[0], o.dims, o.keepdim, O::name.data())};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::run_reduction<ops::detail::same_t, false>(O::name, a, kernel, o.dims, o.keepdim);
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto& x, const auto&... xs) { detail::extreme_cpu<Max>(O::name.data(), x, xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 1); }
};
}  // namespace detail
template <>
struct op_traits<ops::amax> : detail::extreme_op_traits<ops::amax, true> {};
template <>
struct op_traits<ops::amin> : detail::extreme_op_traits<ops::amin, false> {};

namespace detail {
/// max() and min() over every element.
template <class O, bool Max>
struct extreme_all_op_traits : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::extreme;
  /// max_backward: the gradient split evenly over the elements equal to the result.
  struct gradient {
    template <class C>
    static void backward(const O&, C& c) { c.add_grad(0, max_backward(c.grad(), c.input(0), c.output(0))); }
  };
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return {detail::max_all_meta(in[0], O::name.data())};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O&, const run_args& a, const K& kernel) {
    return ops::detail::run_reduction<ops::detail::same_t, false>(O::name, a, kernel);
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::extreme_all_cpu<Max>(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 1); }
};
}  // namespace detail
template <>
struct op_traits<ops::max> : detail::extreme_all_op_traits<ops::max, true> {};
template <>
struct op_traits<ops::min> : detail::extreme_all_op_traits<ops::min, false> {};

namespace detail {
/// max(dim) and min(dim): values and i64 indices.
template <class O, bool Max>
struct extreme_dim_op_traits : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::select_reduction;
  /// max_dim_backward: the values' gradient at the selected indices (the indices carry none).
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      const auto x = c.input(0);
      c.add_grad(0, max_dim_backward(c.grad(0), c.template output<std::int64_t>(1), o.dim, o.keepdim, x.shape()));
    }
  };
  static constexpr const char* what = Max ? "max" : "min";  // the kernels' (PyTorch's) name
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return detail::max_dim_meta(in[0], o.dim, o.keepdim, what);
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<false>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto values = ops::detail::out_at<T>(O::name, a, 0);
      auto indices = ops::detail::out_at<std::int64_t>(O::name, a, 1);
      kernel(ops::detail::in_at<T>(O::name, a, 0), o.dim, o.keepdim, values, indices);
      return {values, indices};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::extreme_dim_cpu<Max>(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 1); }
};
}  // namespace detail
template <>
struct op_traits<ops::max_dim> : detail::extreme_dim_op_traits<ops::max_dim, true> {};
template <>
struct op_traits<ops::min_dim> : detail::extreme_dim_op_traits<ops::min_dim, false> {};

namespace detail {
/// argmax and argmin.
template <class O, bool Max>
struct arg_op_traits : ops::detail::kernel_op_traits {
  using sharding = sharding_rules::select_reduction;
  /// An index carries no gradient.
  using gradient = not_differentiable;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return {detail::argmax_meta(in[0], o.dim, o.keepdim, O::name.data())};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<false>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto out = ops::detail::out_at<std::int64_t>(O::name, a, 0);
      kernel(ops::detail::in_at<T>(O::name, a, 0), o.dim, o.keepdim, out);
      return {out};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::arg_cpu<Max>(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 1); }
};
}  // namespace detail
template <>
struct op_traits<ops::argmax> : detail::arg_op_traits<ops::argmax, true> {};
template <>
struct op_traits<ops::argmin> : detail::arg_op_traits<ops::argmin, false> {};

namespace ops::detail {
/// Checks that a backward op's inputs share input 0's dtype, a floating one.
CCGRAPH_DECL void expect_floating_grads(std::string_view what, const std::vector<tensor_meta>& in);
}  // namespace ops::detail

template <>
struct op_traits<ops::amax_backward> : ops::detail::kernel_op_traits {
  using O = ops::amax_backward;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 3);  // grad, input, result
    ops::detail::expect_floating_grads(O::name, in);
    (void)detail::extreme_backward_mask("amax_backward", in[1].shape, in[0].shape, in[2].shape, o.dims, o.keepdim);
    return {in[1]};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto out = ops::detail::out_at<T>(O::name, a, 0);
      kernel(ops::detail::in_at<T>(O::name, a, 0), ops::detail::in_at<T>(O::name, a, 1),
             ops::detail::in_at<T>(O::name, a, 2), o.dims, o.keepdim, out);
      return {out};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::amax_backward_cpu(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 2); }
};

template <>
struct op_traits<ops::max_backward> : ops::detail::kernel_op_traits {
  using O = ops::max_backward;
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 3);  // grad, input, result
    ops::detail::expect_floating_grads(O::name, in);
    (void)detail::extreme_backward_mask("max_backward", in[1].shape, in[0].shape, in[2].shape, {}, false);
    return {in[1]};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O&, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto out = ops::detail::out_at<T>(O::name, a, 0);
      kernel(ops::detail::in_at<T>(O::name, a, 0), ops::detail::in_at<T>(O::name, a, 1),
             ops::detail::in_at<T>(O::name, a, 2), out);
      return {out};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::max_backward_cpu(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 2); }
};

template <>
struct op_traits<ops::max_dim_backward> : ops::detail::kernel_op_traits {
  using O = ops::max_dim_backward;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 2);  // grad, indices
    detail::require_floating(in[0].dtype, "max_backward");
    CCGRAPH_CHECK(in[1].dtype == dtype::i64, "max_backward: indices dtype ", in[1].dtype, " must be i64");
    (void)detail::max_dim_backward_check(o.input_shape, in[0].shape, in[1].shape, o.dim, o.keepdim);
    return {{in[0].dtype, o.input_shape}};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto out = ops::detail::out_at<T>(O::name, a, 0);
      kernel(ops::detail::in_at<T>(O::name, a, 0), ops::detail::in_at<std::int64_t>(O::name, a, 1), o.dim, o.keepdim,
             out);
      return {out};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::max_dim_backward_cpu(xs...); });
  }
  /// Writes the input-sized gradient, reads the reduced grad and indices.
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::compute(double(numel_of(a.out.at(0).shape)),
                            ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::vector);
  }
};

template <>
struct op_traits<ops::var_backward> : ops::detail::kernel_op_traits {
  using O = ops::var_backward;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 2);  // grad, input
    ops::detail::expect_floating_grads(O::name, in);
    const shape_t s = detail::reduce_shape(in[1].shape, o.dims, o.keepdim, "var_backward");
    CCGRAPH_CHECK(in[0].shape == s, "var_backward: grad of shape ", shape_str(in[0].shape),
                  " must have the reduced shape ", shape_str(s), " of input ", shape_str(in[1].shape));
    return {in[1]};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      auto out = ops::detail::out_at<T>(O::name, a, 0);
      kernel(ops::detail::in_at<T>(O::name, a, 0), ops::detail::in_at<T>(O::name, a, 1), o.dims, o.correction,
             o.keepdim, out);
      return {out};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::var_backward_cpu(xs...); });
  }
  static op_cost cost(const O&, const cost_args& a) { return ops::detail::rowwise_cost(a, 4); }
};

// =============================================================================================
// The public functions: on tensors they run now, on traced values they record a node
// =============================================================================================

/// torch.sum(x, dims, keepdim): the sum over `dims` (empty: every dim); integer and bool inputs
/// give i64 (bool counts), floating ones keep their type.
template <op_value X>
auto sum(const X& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false) {
  using T = detail::op_value_element_t<X>;
  return std::get<0>(detail::apply_op_n<detail::sum_t<T>>(ops::sum{dims, keepdim}, detail::op_value_of(x)));
}
/// torch.sum(x, dim, keepdim) over one dim.
template <op_value X, std::integral I>
auto sum(const X& x, I dim, bool keepdim = false) {
  return ::ccgraph::sum(x, std::vector<std::int64_t>{static_cast<std::int64_t>(dim)}, keepdim);
}

/// torch.mean(x, dims, keepdim): floating inputs only (an integer one is an error naming it).
template <op_value X>
auto mean(const X& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false) {
  return detail::apply_op(ops::mean{dims, keepdim}, detail::op_value_of(x));
}
/// torch.mean(x, dim, keepdim) over one dim.
template <op_value X, std::integral I>
auto mean(const X& x, I dim, bool keepdim = false) {
  return ::ccgraph::mean(x, std::vector<std::int64_t>{static_cast<std::int64_t>(dim)}, keepdim);
}

/// torch.var(x, dims, correction=correction, keepdim=keepdim): the sum of squared deviations
/// over max(0, N - correction) (1: Bessel's correction, PyTorch's default).
template <op_value X>
auto var(const X& x, const std::vector<std::int64_t>& dims = {}, double correction = 1.0, bool keepdim = false) {
  return detail::apply_op(ops::var{dims, correction, keepdim}, detail::op_value_of(x));
}
/// torch.var(x, dim, correction, keepdim) over one dim.
template <op_value X, std::integral I>
auto var(const X& x, I dim, double correction = 1.0, bool keepdim = false) {
  return ::ccgraph::var(x, std::vector<std::int64_t>{static_cast<std::int64_t>(dim)}, correction, keepdim);
}

/// torch.amax(x, dims, keepdim): the largest value over `dims` (empty: every dim); NaN wins.
template <op_value X>
auto amax(const X& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false) {
  return detail::apply_op(ops::amax{dims, keepdim}, detail::op_value_of(x));
}
/// torch.amax(x, dim, keepdim) over one dim.
template <op_value X, std::integral I>
auto amax(const X& x, I dim, bool keepdim = false) {
  return ::ccgraph::amax(x, std::vector<std::int64_t>{static_cast<std::int64_t>(dim)}, keepdim);
}

/// torch.amin(x, dims, keepdim): the smallest value over `dims`; NaN wins.
template <op_value X>
auto amin(const X& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false) {
  return detail::apply_op(ops::amin{dims, keepdim}, detail::op_value_of(x));
}
/// torch.amin(x, dim, keepdim) over one dim.
template <op_value X, std::integral I>
auto amin(const X& x, I dim, bool keepdim = false) {
  return ::ccgraph::amin(x, std::vector<std::int64_t>{static_cast<std::int64_t>(dim)}, keepdim);
}

/// torch.max(x): the largest element (NaN if any is NaN), a 0-d tensor; an empty x is an error.
template <op_value X>
auto max(const X& x) {
  return detail::apply_op(ops::max{}, detail::op_value_of(x));
}
/// torch.max(x, dim, keepdim): std::tuple{values, i64 indices of the first maximum} along `dim`.
template <op_value X>
auto max(const X& x, std::int64_t dim, bool keepdim = false) {
  using T = detail::op_value_element_t<X>;
  return detail::apply_op_n<T, std::int64_t>(ops::max_dim{dim, keepdim}, detail::op_value_of(x));
}

/// torch.min(x): the smallest element (NaN if any is NaN), a 0-d tensor.
template <op_value X>
auto min(const X& x) {
  return detail::apply_op(ops::min{}, detail::op_value_of(x));
}
/// torch.min(x, dim, keepdim): std::tuple{values, i64 indices of the first minimum} along `dim`.
template <op_value X>
auto min(const X& x, std::int64_t dim, bool keepdim = false) {
  using T = detail::op_value_element_t<X>;
  return detail::apply_op_n<T, std::int64_t>(ops::min_dim{dim, keepdim}, detail::op_value_of(x));
}

/// torch.argmax(x, dim, keepdim): i64 index of the first maximum along `dim`; without a dim,
/// into the flattened input (keepdim then keeps every dim with size 1).
template <op_value X>
auto argmax(const X& x, std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false) {
  return std::get<0>(detail::apply_op_n<std::int64_t>(ops::argmax{dim, keepdim}, detail::op_value_of(x)));
}
/// torch.argmin(x, dim, keepdim): i64 index of the first minimum.
template <op_value X>
auto argmin(const X& x, std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false) {
  return std::get<0>(detail::apply_op_n<std::int64_t>(ops::argmin{dim, keepdim}, detail::op_value_of(x)));
}

/// The gradient of amax(input, dims, keepdim) (and of amin) given its `result` and the incoming
/// `grad`: grad / count where input equals the result, 0 elsewhere.
template <op_value G, op_value X, op_value R>
auto amax_backward(const G& grad, const X& input, const R& result, const std::vector<std::int64_t>& dims,
                   bool keepdim = false) {
  using T = detail::op_value_element_t<X>;
  return std::get<0>(detail::apply_op_n<T>(ops::amax_backward{dims, keepdim}, detail::op_value_of(grad),
                                           detail::op_value_of(input), detail::op_value_of(result)));
}
/// The gradient of max(input) / min(input) without a dim, given its `result`.
template <op_value G, op_value X, op_value R>
auto max_backward(const G& grad, const X& input, const R& result) {
  using T = detail::op_value_element_t<X>;
  return std::get<0>(detail::apply_op_n<T>(ops::max_backward{}, detail::op_value_of(grad), detail::op_value_of(input),
                                           detail::op_value_of(result)));
}
/// The gradient of max(input, dim, keepdim) / min(...) given its `indices`: grad at the
/// selected elements of a tensor of `input_shape`, 0 elsewhere.
template <op_value X, op_value I>
auto max_dim_backward(const X& grad, const I& indices, std::int64_t dim, bool keepdim,
                      const std::vector<std::int64_t>& input_shape) {
  using T = detail::op_value_element_t<X>;
  return std::get<0>(detail::apply_op_n<T>(ops::max_dim_backward{dim, keepdim, input_shape}, detail::op_value_of(grad),
                                           detail::op_value_of(indices)));
}
/// The gradient of var(input, dims, correction, keepdim).
template <op_value G, op_value X>
auto var_backward(const G& grad, const X& input, const std::vector<std::int64_t>& dims, double correction = 1.0,
                  bool keepdim = false) {
  using T = detail::op_value_element_t<X>;
  return std::get<0>(detail::apply_op_n<T>(ops::var_backward{dims, correction, keepdim}, detail::op_value_of(grad),
                                           detail::op_value_of(input)));
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/reduction_ops.ipp>
#endif
