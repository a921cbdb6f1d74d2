// ccgraph/ops/normalization.hpp: the row-wise ops of a transformer block with PyTorch's
// semantics: softmax and log_softmax along a dim, layer_norm and rms_norm over the trailing
// (normalized) dims, and their backward kernels. Shape/dtype inference with the user-facing
// errors, and the CPU kernels; the fused CUDA kernels are in <ccgraph/cuda/normalization.cuh>.
//
// Arithmetic: softmax subtracts the row's max before exponentiating (a row holding NaN, or only
// -inf, gives NaN, as PyTorch); statistics are two-pass (mean, then squared deviations). The
// 16-bit floats compute in float and round once at the end; the CPU computes f32 in double (the
// GPU in float).
//
// Saved statistics (what the backward kernels take): layer_norm's mean and rstd, rms_norm's rstd,
// of shape input.shape[:axis] + [1] * len(normalized_shape) (PyTorch's native_layer_norm) and of
// type norm_stat_t<T>: float for f32 / bf16 / f16, double for f64.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/ops/kernel_checks.hpp>
#include <ccgraph/ops/reduction.hpp>
#include <ccgraph/tensor/strided.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph::detail {

// =============================================================================================
// softmax / log_softmax
// =============================================================================================

/// softmax / log_softmax(input, dim) (`what` names which): the input's shape and (floating) dtype.
inline tensor_meta softmax_meta(const tensor_meta& in, std::int64_t dim, const char* what = "softmax") {
  require_floating(in.dtype, what);
  (void)normalize_dim(dim, in.shape.size(), what);
  return in;
}

/// softmax's backward (`what`: "softmax_backward" / "log_softmax_backward"): grad and the forward
/// output, same shape and dtype; the gradient has them too.
inline tensor_meta softmax_backward_meta(const tensor_meta& grad, const tensor_meta& out, std::int64_t dim,
                                         const char* what = "softmax_backward") {
  CCGRAPH_CHECK(grad == out, what, ": grad ", grad.str(), " and output ", out.str(),
                " must have the same shape and dtype");
  return softmax_meta(out, dim, what);
}

/// The rows along `dim` of a tensor of `shape`: their count, length, and (for each of N operands
/// with the given strides) the step between a row's elements. f(offsets) is called with each
/// row's first-element offsets.
template <std::size_t N, class F>
void for_each_row(const shape_t& shape, int dim, const std::array<const strides_t*, N>& strides, F&& f) {
  if (shape.empty()) {
    f(std::array<std::int64_t, N>{});
    return;
  }
  shape_t outer = shape;
  outer[static_cast<std::size_t>(dim)] = 1;
  for_each_offset<N>(outer, strides, f);
}

/// softmax (Log: log_softmax) of `in` along `dim` into `out` (contiguous, same shape).
template <bool Log, class T>
void softmax_cpu_impl(const tensor<T>& in, std::int64_t dim, const tensor<T>& out) {
  const char* what = Log ? "log_softmax" : "softmax";
  (void)softmax_meta({dtype_v<T>, in.shape()}, dim, what);
  check_input(what, "input", in, true);
  check_output(what, "output", out, in.shape(), true);
  if constexpr (is_floating_element_v<T>) {
    using A = cpu_acc_t<T>;  // double for f32: the reference the GPU kernels are tested against
    const int d = normalize_dim(dim, in.shape().size(), what);
    const std::int64_t n = in.shape().empty() ? 1 : in.shape()[static_cast<std::size_t>(d)];
    const std::int64_t is = in.shape().empty() ? 0 : in.strides()[static_cast<std::size_t>(d)];
    const strides_t os_all = out.strides();
    const std::int64_t os = in.shape().empty() ? 0 : os_all[static_cast<std::size_t>(d)];
    const T* x = in.data();
    T* y = out.data();
    std::vector<A> e(static_cast<std::size_t>(n));
    for_each_row<2>(in.shape(), d, {&in.strides(), &os_all}, [&](auto o) {
      A m = -std::numeric_limits<A>::infinity();
      for (std::int64_t k = 0; k < n; ++k) {
        const A v = static_cast<A>(x[o[0] + k * is]);
        e[static_cast<std::size_t>(k)] = v;
        if (beats<true>(v, m)) m = v;
      }
      A s = 0;
      for (std::int64_t k = 0; k < n; ++k) s += std::exp(e[static_cast<std::size_t>(k)] - m);
      if constexpr (Log) {
        const A ls = std::log(s);
        for (std::int64_t k = 0; k < n; ++k) y[o[1] + k * os] = cast<T>(e[static_cast<std::size_t>(k)] - m - ls);
      } else {
        for (std::int64_t k = 0; k < n; ++k)
          y[o[1] + k * os] = cast<T>(std::exp(e[static_cast<std::size_t>(k)] - m) / s);
      }
    });
  }
}

/// softmax(in, dim) into `out`: exp(x - max) / sum(exp(x - max)) along `dim`.
template <class T>
void softmax_cpu(const tensor<T>& in, std::int64_t dim, const tensor<T>& out) {
  softmax_cpu_impl<false>(in, dim, out);
}
/// log_softmax(in, dim) into `out`: x - max - log(sum(exp(x - max))) along `dim`.
template <class T>
void log_softmax_cpu(const tensor<T>& in, std::int64_t dim, const tensor<T>& out) {
  softmax_cpu_impl<true>(in, dim, out);
}

/// softmax's (Log: log_softmax's) backward from the forward output `y`:
/// softmax: grad_in = y * (g - sum(g * y)); log_softmax: grad_in = g - exp(y) * sum(g).
template <bool Log, class T>
void softmax_backward_cpu_impl(const tensor<T>& grad, const tensor<T>& y, std::int64_t dim, const tensor<T>& grad_in) {
  const char* what = Log ? "log_softmax_backward" : "softmax_backward";
  (void)softmax_backward_meta({dtype_v<T>, grad.shape()}, {dtype_v<T>, y.shape()}, dim, what);
  check_input(what, "grad", grad, true);
  check_input(what, "output", y, true);
  check_output(what, "grad_input", grad_in, y.shape(), true);
  if constexpr (is_floating_element_v<T>) {
    using A = cpu_acc_t<T>;  // double for f32: the reference the GPU kernels are tested against
    const int d = normalize_dim(dim, y.shape().size(), what);
    const bool scalar = y.shape().empty();
    const auto step = [&](const strides_t& s) { return scalar ? std::int64_t{0} : s[static_cast<std::size_t>(d)]; };
    const std::int64_t n = scalar ? 1 : y.shape()[static_cast<std::size_t>(d)];
    const strides_t dst = grad_in.strides();
    const std::int64_t gs = step(grad.strides()), ys = step(y.strides()), os = step(dst);
    const T* g = grad.data();
    const T* p = y.data();
    T* dx = grad_in.data();
    for_each_row<3>(y.shape(), d, {&grad.strides(), &y.strides(), &dst}, [&](auto o) {
      A s = 0;
      for (std::int64_t k = 0; k < n; ++k) {
        const A gk = static_cast<A>(g[o[0] + k * gs]);
        s += Log ? gk : gk * static_cast<A>(p[o[1] + k * ys]);
      }
      for (std::int64_t k = 0; k < n; ++k) {
        const A gk = static_cast<A>(g[o[0] + k * gs]);
        const A yk = static_cast<A>(p[o[1] + k * ys]);
        dx[o[2] + k * os] = cast<T>(Log ? gk - std::exp(yk) * s : yk * (gk - s));
      }
    });
  }
}

/// softmax's backward: grad_in = y * (grad - sum(grad * y)) along `dim` (y: softmax's output).
template <class T>
void softmax_backward_cpu(const tensor<T>& grad, const tensor<T>& y, std::int64_t dim, const tensor<T>& grad_in) {
  softmax_backward_cpu_impl<false>(grad, y, dim, grad_in);
}
/// log_softmax's backward: grad_in = grad - exp(y) * sum(grad) along `dim` (y: log_softmax's output).
template <class T>
void log_softmax_backward_cpu(const tensor<T>& grad, const tensor<T>& y, std::int64_t dim, const tensor<T>& grad_in) {
  softmax_backward_cpu_impl<true>(grad, y, dim, grad_in);
}

// =============================================================================================
// layer_norm / rms_norm
// =============================================================================================

/// The type of the norms' saved statistics: float, or double for f64.
template <class T>
using norm_stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// The runtime form of norm_stat_t.
constexpr dtype norm_stat_dtype(dtype d) { return d == dtype::f64 ? dtype::f64 : dtype::f32; }

/// rms_norm's eps when none is given: the machine epsilon of the type it computes in (float for
/// f32 / bf16 / f16, double for f64), what PyTorch's implementation uses.
constexpr double rms_norm_default_eps(dtype d) {
  return d == dtype::f64 ? std::numeric_limits<double>::epsilon()
                         : static_cast<double>(std::numeric_limits<float>::epsilon());
}

/// A norm's input seen as rows x cols: cols = the product of normalized_shape.
struct norm_extent {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  /// Shape of the saved statistics: input.shape[:axis] + [1, ...].
  shape_t stat_shape;
};

/// Checks a norm's input, normalized_shape and affine parameters (`what`: "layer_norm" or
/// "rms_norm"), with PyTorch's rules: normalized_shape is non-empty and ends the input's shape;
/// weight and bias have exactly normalized_shape and the input's dtype.
inline norm_extent norm_check(const char* what, const tensor_meta& in, const shape_t& normalized_shape,
                              const std::optional<tensor_meta>& weight, const std::optional<tensor_meta>& bias) {
  require_floating(in.dtype, what);
  CCGRAPH_CHECK(!normalized_shape.empty(), what, ": normalized_shape must have at least one dim, got []");
  const auto check_param = [&](const std::optional<tensor_meta>& p, const char* name) {
    if (!p) return;
    CCGRAPH_CHECK(p->shape == normalized_shape, what, ": ", name, " of shape ", shape_str(p->shape),
                  " must have normalized_shape ", shape_str(normalized_shape));
    CCGRAPH_CHECK(p->dtype == in.dtype, what, ": ", name, " dtype ", p->dtype, " differs from input dtype ", in.dtype);
  };
  check_param(weight, "weight");
  check_param(bias, "bias");
  const std::size_t k = normalized_shape.size();
  const bool ends = in.shape.size() >= k && std::equal(normalized_shape.begin(), normalized_shape.end(),
                                                       in.shape.end() - static_cast<std::ptrdiff_t>(k));
  if (!ends) {
    std::string expect = "[*";
    for (auto s : normalized_shape) expect += ", " + std::to_string(s);
    CCGRAPH_THROW(error, what, ": input of shape ", shape_str(in.shape), " does not end with normalized_shape ",
                  shape_str(normalized_shape), " (expected ", expect, "])");
  }
  norm_extent e;
  const std::size_t axis = in.shape.size() - k;
  e.rows = 1;
  e.cols = 1;
  for (std::size_t d = 0; d < in.shape.size(); ++d) {
    if (d < axis) {
      e.rows *= in.shape[d];
      e.stat_shape.push_back(in.shape[d]);
    } else {
      e.cols *= in.shape[d];
      e.stat_shape.push_back(1);
    }
  }
  return e;
}

/// layer_norm(input, normalized_shape, weight, bias, eps): [output, mean, rstd]. eps must be
/// finite and non-negative.
inline std::vector<tensor_meta> layer_norm_meta(const tensor_meta& in, const shape_t& normalized_shape,
                                                const std::optional<tensor_meta>& weight,
                                                const std::optional<tensor_meta>& bias, double eps) {
  const norm_extent e = norm_check("layer_norm", in, normalized_shape, weight, bias);
  CCGRAPH_CHECK(std::isfinite(eps) && eps >= 0, "layer_norm: eps must be finite and >= 0, got ", eps);
  const tensor_meta stat{norm_stat_dtype(in.dtype), e.stat_shape};
  return {in, stat, stat};
}

/// rms_norm(input, normalized_shape, weight, eps): [output, rstd]; eps defaults to
/// rms_norm_default_eps(input dtype).
inline std::vector<tensor_meta> rms_norm_meta(const tensor_meta& in, const shape_t& normalized_shape,
                                              const std::optional<tensor_meta>& weight,
                                              std::optional<double> eps) {
  const norm_extent e = norm_check("rms_norm", in, normalized_shape, weight, std::nullopt);
  if (eps) CCGRAPH_CHECK(std::isfinite(*eps) && *eps >= 0, "rms_norm: eps must be finite and >= 0, got ", *eps);
  return {in, {norm_stat_dtype(in.dtype), e.stat_shape}};
}

/// An optional parameter tensor (weight, bias) of element type T; T is deduced from the other
/// arguments, so `std::nullopt` can be passed.
template <class T>
using optional_tensor = std::optional<tensor<std::type_identity_t<T>>>;

/// An optional output (a gradient not asked for is null); T is deduced from the other arguments,
/// so `nullptr` can be passed.
template <class T>
using output_ptr = const tensor<std::type_identity_t<T>>*;

/// layer_norm (RMS: rms_norm) on the CPU: out = (x - mean) * rstd * weight + bias per row of the
/// normalized dims (rms_norm: x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps)). `mean` (not
/// for rms_norm) and `rstd` may be null; else they receive the statistics.
template <bool RMS, class T>
void norm_cpu_impl(const tensor<T>& in, const shape_t& normalized_shape, const optional_tensor<T>& weight,
                   const optional_tensor<T>& bias, double eps, const tensor<T>& out,
                   const tensor<norm_stat_t<T>>* mean, const tensor<norm_stat_t<T>>* rstd) {
  const char* what = RMS ? "rms_norm" : "layer_norm";
  const norm_extent e = norm_check(what, {dtype_v<T>, in.shape()}, normalized_shape, meta_of(weight), meta_of(bias));
  check_input(what, "input", in, true);
  if (weight) check_input(what, "weight", *weight, true);
  if (bias) check_input(what, "bias", *bias, true);
  check_output(what, "output", out, in.shape(), true);
  if (mean) check_output(what, "mean", *mean, e.stat_shape, true);
  if (rstd) check_output(what, "rstd", *rstd, e.stat_shape, true);
  if constexpr (is_floating_element_v<T>) {
    using A = cpu_acc_t<T>;
    using S = norm_stat_t<T>;
    const tensor<T> x = in.contiguous();
    const std::optional<tensor<T>> w = weight ? std::optional<tensor<T>>(weight->contiguous()) : std::nullopt;
    const std::optional<tensor<T>> b = bias ? std::optional<tensor<T>>(bias->contiguous()) : std::nullopt;
    const T* xp = x.data();
    const T* wp = w ? w->data() : nullptr;
    const T* bp = b ? b->data() : nullptr;
    T* yp = out.data();
    S* mp = mean ? mean->data() : nullptr;
    S* rp = rstd ? rstd->data() : nullptr;
    const std::int64_t n = e.cols;
    for (std::int64_t r = 0; r < e.rows; ++r) {
      const T* row = xp + r * n;
      A mu = 0;
      if constexpr (!RMS) {
        for (std::int64_t c = 0; c < n; ++c) mu += static_cast<A>(static_cast<compute_t<T>>(row[c]));
        mu /= static_cast<A>(n);
      }
      A ss = 0;
      for (std::int64_t c = 0; c < n; ++c) {
        const A dv = static_cast<A>(static_cast<compute_t<T>>(row[c])) - mu;
        ss += dv * dv;
      }
      const A rs = A(1) / std::sqrt(ss / static_cast<A>(n) + static_cast<A>(eps));
      for (std::int64_t c = 0; c < n; ++c) {
        A v = (static_cast<A>(static_cast<compute_t<T>>(row[c])) - mu) * rs;
        if (wp) v *= static_cast<A>(static_cast<compute_t<T>>(wp[c]));
        if (bp) v += static_cast<A>(static_cast<compute_t<T>>(bp[c]));
        yp[r * n + c] = cast<T>(v);
      }
      if (mp) mp[r] = static_cast<S>(mu);
      if (rp) rp[r] = static_cast<S>(rs);
    }
  }
}

/// layer_norm on the CPU into `out` (and the saved `mean` / `rstd` when given).
template <class T>
void layer_norm_cpu(const tensor<T>& in, const shape_t& normalized_shape, const optional_tensor<T>& weight,
                    const optional_tensor<T>& bias, double eps, const tensor<T>& out,
                    const tensor<norm_stat_t<T>>* mean = nullptr, const tensor<norm_stat_t<T>>* rstd = nullptr) {
  (void)layer_norm_meta({dtype_v<T>, in.shape()}, normalized_shape, meta_of(weight), meta_of(bias), eps);
  norm_cpu_impl<false>(in, normalized_shape, weight, bias, eps, out, mean, rstd);
}

/// rms_norm on the CPU into `out` (and the saved `rstd` when given); eps defaults as PyTorch's.
template <class T>
void rms_norm_cpu(const tensor<T>& in, const shape_t& normalized_shape, const optional_tensor<T>& weight,
                  std::optional<double> eps, const tensor<T>& out, const tensor<norm_stat_t<T>>* rstd = nullptr) {
  (void)rms_norm_meta({dtype_v<T>, in.shape()}, normalized_shape, meta_of(weight), eps);
  norm_cpu_impl<true>(in, normalized_shape, weight, std::nullopt, eps.value_or(rms_norm_default_eps(dtype_v<T>)),
                      out, nullptr, rstd);
}

/// Checks a norm backward's arguments: grad of the input's shape, statistics of the stat shape,
/// outputs of the input's / normalized shape. A weight gradient needs the weight.
template <class T>
norm_extent norm_backward_check(const char* what, const tensor<T>& grad, const tensor<T>& in,
                                const shape_t& normalized_shape, const tensor<norm_stat_t<T>>* mean,
                                const tensor<norm_stat_t<T>>& rstd, const optional_tensor<T>& weight,
                                output_ptr<T> grad_in, output_ptr<T> grad_weight, output_ptr<T> grad_bias,
                                bool on_cpu) {
  const norm_extent e = norm_check(what, {dtype_v<T>, in.shape()}, normalized_shape, meta_of(weight), std::nullopt);
  CCGRAPH_CHECK(grad.shape() == in.shape(), what, ": grad of shape ", shape_str(grad.shape()),
                " must have the input's shape ", shape_str(in.shape()));
  CCGRAPH_CHECK(rstd.shape() == e.stat_shape && (!mean || mean->shape() == e.stat_shape), what,
                ": saved statistics of shape ", shape_str(rstd.shape()), " must have shape ", shape_str(e.stat_shape));
  CCGRAPH_CHECK(rstd.is_contiguous() && (!mean || mean->is_contiguous()), what,
                ": saved statistics must be contiguous");
  CCGRAPH_CHECK(!grad_weight || weight, what, ": a weight gradient was asked for without a weight");
  check_input(what, "grad", grad, on_cpu);
  check_input(what, "input", in, on_cpu);
  check_input(what, "rstd", rstd, on_cpu);
  if (mean) check_input(what, "mean", *mean, on_cpu);
  if (weight) check_input(what, "weight", *weight, on_cpu);
  if (grad_in) check_output(what, "grad_input", *grad_in, in.shape(), on_cpu);
  if (grad_weight) check_output(what, "grad_weight", *grad_weight, normalized_shape, on_cpu);
  if (grad_bias) check_output(what, "grad_bias", *grad_bias, normalized_shape, on_cpu);
  return e;
}

/// layer_norm's (RMS: rms_norm's) backward on the CPU. Per row, with xhat = (x - mean) * rstd
/// (rms_norm: x * rstd) and dxhat = grad * weight:
///   grad_in     = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))   (rms_norm: no mean(dxhat))
///   grad_weight = sum over rows of grad * xhat;  grad_bias = sum over rows of grad.
/// Each output may be null (not wanted); a row count of 0 gives zero parameter gradients.
template <bool RMS, class T>
void norm_backward_cpu_impl(const tensor<T>& grad, const tensor<T>& in, const shape_t& normalized_shape,
                            const tensor<norm_stat_t<T>>* mean, const tensor<norm_stat_t<T>>& rstd,
                            const optional_tensor<T>& weight, output_ptr<T> grad_in,
                            output_ptr<T> grad_weight, output_ptr<T> grad_bias) {
  const char* what = RMS ? "rms_norm_backward" : "layer_norm_backward";
  CCGRAPH_CHECK(RMS || mean, what, ": the saved mean is required");
  CCGRAPH_CHECK(!RMS || !grad_bias, what, ": rms_norm has no bias");
  const norm_extent e = norm_backward_check(what, grad, in, normalized_shape, mean, rstd, weight, grad_in,
                                            grad_weight, grad_bias, true);
  if constexpr (is_floating_element_v<T>) {
    using A = cpu_acc_t<T>;
    const auto val = [](T v) { return static_cast<A>(static_cast<compute_t<T>>(v)); };
    const tensor<T> x = in.contiguous();
    const tensor<T> g = grad.contiguous();
    const std::optional<tensor<T>> w = weight ? std::optional<tensor<T>>(weight->contiguous()) : std::nullopt;
    const T* xp = x.data();
    const T* gp = g.data();
    const T* wp = w ? w->data() : nullptr;
    const norm_stat_t<T>* mp = mean ? mean->data() : nullptr;
    const norm_stat_t<T>* rp = rstd.data();
    const std::int64_t n = e.cols;
    std::vector<A> dw(static_cast<std::size_t>(n), A(0)), db(static_cast<std::size_t>(n), A(0));
    std::vector<A> xhat(static_cast<std::size_t>(n)), dxhat(static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < e.rows; ++r) {
      const A mu = RMS ? A(0) : static_cast<A>(mp[r]);
      const A rs = static_cast<A>(rp[r]);
      A sum_d = 0, sum_dx = 0;
      for (std::int64_t c = 0; c < n; ++c) {
        const auto i = static_cast<std::size_t>(c);
        const A gv = val(gp[r * n + c]);
        xhat[i] = (val(xp[r * n + c]) - mu) * rs;
        dxhat[i] = wp ? gv * val(wp[c]) : gv;
        sum_d += dxhat[i];
        sum_dx += dxhat[i] * xhat[i];
        dw[i] += gv * xhat[i];
        db[i] += gv;
      }
      if (grad_in) {
        T* dx = grad_in->data() + r * n;
        const A md = RMS ? A(0) : sum_d / static_cast<A>(n);
        const A mdx = sum_dx / static_cast<A>(n);
        for (std::int64_t c = 0; c < n; ++c) {
          const auto i = static_cast<std::size_t>(c);
          dx[c] = cast<T>(rs * (dxhat[i] - md - xhat[i] * mdx));
        }
      }
    }
    if (grad_weight)
      for (std::int64_t c = 0; c < n; ++c) grad_weight->data()[c] = cast<T>(dw[static_cast<std::size_t>(c)]);
    if (grad_bias)
      for (std::int64_t c = 0; c < n; ++c) grad_bias->data()[c] = cast<T>(db[static_cast<std::size_t>(c)]);
  }
}

/// layer_norm's backward on the CPU (see norm_backward_cpu_impl); outputs may be null.
template <class T>
void layer_norm_backward_cpu(const tensor<T>& grad, const tensor<T>& in, const shape_t& normalized_shape,
                             const tensor<norm_stat_t<T>>& mean, const tensor<norm_stat_t<T>>& rstd,
                             const optional_tensor<T>& weight, output_ptr<T> grad_in,
                             output_ptr<T> grad_weight, output_ptr<T> grad_bias) {
  norm_backward_cpu_impl<false, T>(grad, in, normalized_shape, &mean, rstd, weight, grad_in, grad_weight, grad_bias);
}

/// rms_norm's backward on the CPU (see norm_backward_cpu_impl); outputs may be null.
template <class T>
void rms_norm_backward_cpu(const tensor<T>& grad, const tensor<T>& in, const shape_t& normalized_shape,
                           const tensor<norm_stat_t<T>>& rstd, const optional_tensor<T>& weight,
                           output_ptr<T> grad_in, output_ptr<T> grad_weight) {
  norm_backward_cpu_impl<true, T>(grad, in, normalized_shape, nullptr, rstd, weight, grad_in, grad_weight, nullptr);
}

}  // namespace ccgraph::detail
