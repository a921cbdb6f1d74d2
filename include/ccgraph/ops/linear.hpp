// ccgraph/ops/linear.hpp: torch.bmm and torch.nn.functional.linear (with an optional GELU
// after the bias, the fusion a tensor-parallel MLP uses): shape functions with PyTorch's errors
// and CPU kernels. torch.matmul's batched broadcasting is matmul_shape / matmul_into
// (ops/matmul.hpp), which bmm reuses. The CUDA kernels (cuBLASLt, with its bias and bias+GELU
// epilogues for linear) are in <ccgraph/cuda/linear.cuh>.
//
// Graph ops (the end of this file): ops::bmm and ops::linear with their op_traits (inference by
// the shape functions, runs by the CPU kernels here and the cuBLASLt ones through cuda_impl in
// cuda/linear.cuh), and the public cg::bmm and cg::linear, generic over tensors and traced values.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/ops/kernel_checks.hpp>
#include <ccgraph/ops/matmul.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph::detail {

/// What linear applies after adding its bias: nothing, or GELU in its tanh approximation,
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))) (PyTorch's gelu(approximate="tanh"), and what
/// cuBLASLt's GELU epilogue computes; cg::gelu is the exact erf form).
enum class linear_activation : std::uint8_t { none, gelu_tanh };

/// "none" / "gelu_tanh".
constexpr std::string_view to_string(linear_activation a) {
  return a == linear_activation::none ? "none" : "gelu_tanh";
}

/// GELU's tanh approximation in A.
template <class A>
A gelu_tanh(A x) {
  const A k0 = A(0.7978845608028654), k1 = A(0.044715);
  return A(0.5) * x * (A(1) + std::tanh(k0 * (x + k1 * x * x * x)));
}

/// The shape of bmm(a, b): a [B, n, m] and b [B, m, p] give [B, n, p] (torch.bmm: both 3-d,
/// the same batch, no broadcasting).
inline shape_t bmm_shape(const shape_t& a, const shape_t& b) {
  CCGRAPH_CHECK(a.size() == 3, "bmm: batch1 must be a 3-d tensor, got shape ", shape_str(a));
  CCGRAPH_CHECK(b.size() == 3, "bmm: batch2 must be a 3-d tensor, got shape ", shape_str(b));
  CCGRAPH_CHECK(b[0] == a[0] && b[1] == a[2], "bmm: expected batch2's first two dims to be [", a[0], ", ", a[2],
                "] for batch1 of shape ", shape_str(a), ", got batch2 of shape ", shape_str(b));
  return {a[0], a[1], b[2]};
}

/// The shape of linear(x, w, bias): x [..., in] with w [out, in] (and bias [out]) gives
/// [..., out].
inline shape_t linear_shape(const shape_t& x, const shape_t& w, const std::optional<shape_t>& bias = std::nullopt) {
  CCGRAPH_CHECK(!x.empty(), "linear: input must have at least 1 dim, got a 0-d tensor");
  CCGRAPH_CHECK(w.size() == 2, "linear: weight must be 2-d [out_features, in_features], got shape ", shape_str(w));
  CCGRAPH_CHECK(x.back() == w[1], "linear: input of shape ", shape_str(x), " and weight of shape ", shape_str(w),
                " cannot be multiplied (in_features ", x.back(), " != ", w[1], ")");
  if (bias)
    CCGRAPH_CHECK(bias->size() == 1 && (*bias)[0] == w[0], "linear: bias of shape ", shape_str(*bias),
                  " for out_features ", w[0], "; expected [", w[0], "]");
  shape_t out(x.begin(), x.end() - 1);
  out.push_back(w[0]);
  return out;
}

/// bmm(a, b) into `out` (contiguous [B, n, p]).
template <element T>
void bmm_cpu(const tensor<T>& a, const tensor<T>& b, const tensor<T>& out) {
  check_kernel_output(out, bmm_shape(a.shape(), b.shape()), "bmm");
  check_same_device("bmm", device::cpu(), {a.device(), b.device(), out.device()});
  matmul_into(out, a, b);
}

/// linear(x, w, bias) then `act`, into `out` (contiguous [..., out]): y = act(x wᵀ + bias),
/// accumulated in float for bf16/f16 (double for f64) with the bias and activation applied
/// before the one rounding to T (as cuBLASLt's epilogues do).
template <element T, int SimdBytes = native_simd_bytes>
void linear_cpu(const tensor<T>& x, const tensor<T>& w, const std::optional<tensor<T>>& bias, linear_activation act,
                const tensor<T>& out) {
  static_assert(std::is_floating_point_v<compute_t<T>>, "linear: floating-point tensors only (f32, f64, bf16, f16)");
  using A = matmul_acc_t<T>;
  const shape_t shape =
      linear_shape(x.shape(), w.shape(), bias ? std::optional<shape_t>(bias->shape()) : std::nullopt);
  check_kernel_output(out, shape, "linear");
  check_same_device("linear", device::cpu(), {x.device(), w.device(), out.device()});
  if (bias) check_same_device("linear", device::cpu(), {bias->device()});
  const std::int64_t n = w.shape()[0], k = w.shape()[1];
  const std::int64_t m = n == 0 ? 0 : numel_of(shape) / n;
  if (m == 0 || n == 0) return;
  const tensor<T> x2 = x.reshape({m, k});  // a view when x's layout allows, else a copy
  std::unique_ptr<A[]> c(new A[static_cast<std::size_t>(m * n)]);
  gemm_workspace<A, SimdBytes> ws(n);
  // x2 [m, k] times wᵀ: B(p, j) = w[j][p], so B's row stride is w's column stride and back.
  gemm(m, n, k, x2.data(), x2.strides()[0], x2.strides()[1], w.data(), w.strides()[1], w.strides()[0], c.get(), n,
       std::int64_t{1}, ws);
  const T* bp = bias ? bias->data() : nullptr;
  const std::int64_t bs = bias ? bias->strides()[0] : 0;
  T* op = out.data();
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      A v = c[static_cast<std::size_t>(i * n + j)];
      if (bp) v += static_cast<A>(static_cast<compute_t<T>>(bp[j * bs]));
      if (act == linear_activation::gelu_tanh) v = gelu_tanh(v);
      op[i * n + j] = cast<T>(v);
    }
}

}  // namespace ccgraph::detail

// ---- graph ops ---------------------------------------------------------------------------------

namespace ccgraph {

/// What linear applies after its bias: linear_activation::none or ::gelu_tanh (see above).
using linear_activation = detail::linear_activation;

namespace ops {
/// torch.bmm(batch1, batch2).
struct bmm {
  BOOST_HANA_DEFINE_STRUCT(bmm);
  static constexpr std::string_view name = "bmm";
};
/// torch.nn.functional.linear(input, weight, bias), then `activation` (cuBLASLt's epilogue on
/// GPUs). Inputs: x, w, and the bias when there is one.
struct linear {
  BOOST_HANA_DEFINE_STRUCT(linear, (linear_activation, activation));
  static constexpr std::string_view name = "linear";
};
}  // namespace ops

namespace detail {

/// The runs of bmm and linear given their kernels (`Kernels::bmm(a, b, out)`, `Kernels::linear(x,
/// w, bias, act, out)`): the CPU ones below, the CUDA ones in cuda/linear.cuh.
template <class Kernels>
struct linear_op_runs {
  static std::vector<any_tensor> run(const ops::bmm&, const run_args& a) {
    return {visit_dtype(a.metas.at(0).dtype, [&](auto tag) -> any_tensor {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        CCGRAPH_THROW(error, "bmm: bool tensors are not supported");
      } else {
        auto out = ops::detail::out_or_new<T>(ops::bmm::name, a);
        Kernels::bmm(get_tensor<T>(a.in.at(0), "bmm"), get_tensor<T>(a.in.at(1), "bmm"), out);
        return out;
      }
    })};
  }
  static std::vector<any_tensor> run(const ops::linear& o, const run_args& a) {
    return {visit_dtype(a.metas.at(0).dtype, [&](auto tag) -> any_tensor {
      using T = decltype(tag);
      if constexpr (!std::is_floating_point_v<compute_t<T>>) {
        CCGRAPH_THROW(error, "linear: floating-point tensors only (f32, f64, bf16, f16), got ", dtype_v<T>);
      } else {
        auto out = ops::detail::out_or_new<T>(ops::linear::name, a);
        const std::optional<tensor<T>> bias =
            a.in.size() > 2 ? std::optional<tensor<T>>(get_tensor<T>(a.in[2], "linear")) : std::nullopt;
        Kernels::linear(get_tensor<T>(a.in.at(0), "linear"), get_tensor<T>(a.in.at(1), "linear"), bias, o.activation,
                        out);
        return out;
      }
    })};
  }
};

/// The CPU kernels, for linear_op_runs.
struct linear_cpu_kernels {
  template <class... A>
  static void bmm(const A&... a) { bmm_cpu(a...); }
  template <class... A>
  static void linear(const A&... a) { linear_cpu(a...); }
};

/// What bmm's and linear's traits share: compute ops writing a new tensor, run by the CPU
/// kernels here and by cuda_impl on devices.
struct linear_traits_common {
  static constexpr op_category category = op_category::compute;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::cuda_impl;  // cuda/linear.cuh
  template <class O>
  static std::vector<any_tensor> run(const O& o, const run_args& a) {
    return linear_op_runs<linear_cpu_kernels>::run(o, a);
  }
  using gradient = gradient_todo;
  using sharding = sharding_todo;
};

}  // namespace detail

template <>
struct op_traits<ops::bmm> : detail::linear_traits_common {
  using sharding = sharding_rules::bmm;
  /// dA = dC Bᵀ, dB = Aᵀ dC per batch.
  struct gradient {
    template <class C>
    static void backward(const ops::bmm&, C& c) {
      const auto a = c.input(0), b = c.input(1), g = c.grad();
      if (c.needs_grad(0)) c.add_grad(0, bmm(g, b.transpose(1, 2).contiguous()));
      if (c.needs_grad(1)) c.add_grad(1, bmm(a.transpose(1, 2).contiguous(), g));
    }
  };
  static std::vector<tensor_meta> infer(const ops::bmm&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(ops::bmm::name, in, 2);
    ops::detail::expect_same_dtype(ops::bmm::name, in);
    CCGRAPH_CHECK(in[0].dtype != dtype::boolean, "bmm: bool tensors are not supported");
    return {{in[0].dtype, detail::bmm_shape(in[0].shape, in[1].shape)}};
  }
  /// 2·B·n·m·p FLOPs at the dtype's matmul peak; operands and result as bytes.
  static op_cost cost(const ops::bmm&, const cost_args& a) {
    const shape_t& x = a.in.at(0).shape;
    const double flops = 2.0 * double(x.at(0)) * double(x.at(1)) * double(x.at(2)) * double(a.in.at(1).shape.at(2));
    return op_cost::compute(flops, ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::matmul,
                            a.in[0].dtype);
  }
};

template <>
struct op_traits<ops::linear> : detail::linear_traits_common {
  using sharding = sharding_rules::linear;
  /// y = x wᵀ + b: dx = dy w, dw = dyᵀ x over the flattened leading dims, db = dy summed over them.
  /// A fused activation (gelu_tanh) is not differentiated yet: an error.
  struct gradient {
    template <class C>
    static void backward(const ops::linear& o, C& c) {
      CCGRAPH_CHECK(o.activation == linear_activation::none, "grad: linear (node %", c.current().name(), ") with the fused ",
                    to_string(o.activation), " activation has no gradient rule yet");
      const auto x = c.input(0), w = c.input(1), g = c.grad();
      const std::int64_t out = w.size(0), in = w.size(1);
      if (c.needs_grad(0)) c.add_grad(0, matmul(g, w));
      const auto g2 = g.reshape({-1, out});
      if (c.needs_grad(1)) c.add_grad(1, matmul(g2.transpose(0, 1), x.reshape({-1, in})));
      if (c.num_inputs() > 2 && c.needs_grad(2)) c.add_grad(2, sum(g2, std::vector<std::int64_t>{0}));
    }
  };
  /// Inputs: x [..., in], w [out, in], and optionally bias [out]; one floating dtype.
  static std::vector<tensor_meta> infer(const ops::linear&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    CCGRAPH_CHECK(in.size() == 2 || in.size() == 3, "linear: expects 2 or 3 input(s) (x, weight, bias), got ",
                  in.size());
    ops::detail::expect_same_dtype(ops::linear::name, in);
    CCGRAPH_CHECK(is_floating(in[0].dtype), "linear: floating-point tensors only (f32, f64, bf16, f16), got ",
                  in[0].dtype);
    const std::optional<shape_t> bias = in.size() > 2 ? std::optional<shape_t>(in[2].shape) : std::nullopt;
    return {{in[0].dtype, detail::linear_shape(in[0].shape, in[1].shape, bias)}};
  }
  /// 2·M·N·K FLOPs (plus one per output element for the bias and for the activation) at the
  /// dtype's matmul peak; operands and result as bytes.
  static op_cost cost(const ops::linear& o, const cost_args& a) {
    const double out = double(numel_of(a.out.at(0).shape));
    const double k = double(a.in.at(1).shape.at(1));
    const double epilogue = (a.in.size() > 2 ? out : 0.0) + (o.activation != linear_activation::none ? out : 0.0);
    return op_cost::compute(2.0 * out * k + epilogue, ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out),
                            peak_class::matmul, a.in[0].dtype);
  }
};

/// Batched matrix product of a [B, n, m] and b [B, m, p]: [B, n, p] (torch.bmm; no
/// broadcasting). On tensors it runs now, on traced values it records a `bmm` node.
template <detail::op_value V>
V bmm(const V& a, const V& b) {
  return detail::apply_op(ops::bmm{}, a, b);
}

/// x [..., in] times wᵀ (w [out, in]) plus `bias` [out] when given, then `activation`:
/// [..., out] (torch.nn.functional.linear; the activation is the fused epilogue a tensor-
/// parallel MLP uses, cuBLASLt's on GPUs). Floating-point dtypes. On tensors it runs now, on
/// traced values it records a `linear` node.
template <detail::op_value V>
V linear(const V& x, const V& w, const std::optional<std::type_identity_t<V>>& bias = std::nullopt,
         linear_activation activation = linear_activation::none) {
  if (bias) return detail::apply_op(ops::linear{activation}, x, w, *bias);
  return detail::apply_op(ops::linear{activation}, x, w);
}

}  // namespace ccgraph
