// ccgraph/cuda/linear.cuh: bmm and linear (ccgraph/ops/linear.hpp) on CUDA devices, same
// signatures as the CPU kernels with `_cuda`, queued on the calling thread's current stream.
//
// bmm is one cuBLASLt strided-batched GEMM (matmul_into's device path). linear is one cuBLASLt
// GEMM of the rows of x against wᵀ with the bias (and GELU) applied by its epilogue, in float
// before the one rounding to T; where cuBLASLt has no epilogue algorithm (f64) the GEMM writes
// T and a small kernel adds the bias and applies GELU afterwards.
//
// Compile with nvcc: <ccgraph/cuda.hpp> includes this header only under nvcc.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/linear.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/blas.hpp>
#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/element.cuh>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/pointwise.cuh>  // contiguous copies of strided device inputs
#include <ccgraph/cuda/runtime.hpp>
#include <ccgraph/ops/linear.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

namespace ccgraph::cuda::detail {

/// out[i][j] = act(out[i][j] + bias[j]) over an [m, n] row-major matrix (bias may be null).
template <class T, bool Gelu>
__global__ void __launch_bounds__(256) linear_epilogue_kernel(T* out, const T* bias, long long m, long long n) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    A v = device_load<A>(out + i);
    if (bias) v += device_load<A>(bias + i % n);
    if constexpr (Gelu) {
      const A k0 = A(0.7978845608028654), k1 = A(0.044715);
      v = A(0.5) * v * (A(1) + ::tanh(k0 * (v + k1 * v * v * v)));
    }
    out[i] = device_value<T>(v);
  }
}

}  // namespace ccgraph::cuda::detail

namespace ccgraph::detail {

/// bmm on a CUDA device (one strided-batched GEMM); same contract as bmm_cpu.
template <element T>
void bmm_cuda(const tensor<T>& a, const tensor<T>& b, const tensor<T>& out) {
  check_kernel_output(out, bmm_shape(a.shape(), b.shape()), "bmm");
  CCGRAPH_CHECK(out.device().is_cuda(), "bmm: output on ", out.device(), ", not a CUDA device");
  check_same_device("bmm", out.device(), {a.device(), b.device()});
  matmul_into(out, a, b);
}

/// Which way linear_cuda applies its bias and activation: the automatic choice (cuBLASLt's
/// epilogue where it has one), or always the separate kernel after a plain GEMM (tests).
enum class linear_cuda_path { automatic, separate_epilogue };

/// linear on a CUDA device through a chosen path; same contract as linear_cpu.
template <element T>
void linear_cuda_with(linear_cuda_path path, const tensor<T>& x, const tensor<T>& w, const std::optional<tensor<T>>& bias,
                      linear_activation act, const tensor<T>& out) {
  namespace cd = ::ccgraph::cuda::detail;
  static_assert(std::is_floating_point_v<compute_t<T>>, "linear: floating-point tensors only (f32, f64, bf16, f16)");
  const shape_t shape =
      linear_shape(x.shape(), w.shape(), bias ? std::optional<shape_t>(bias->shape()) : std::nullopt);
  check_kernel_output(out, shape, "linear");
  const device dev = out.device();
  CCGRAPH_CHECK(dev.is_cuda(), "linear: output on ", dev, ", not a CUDA device");
  check_same_device("linear", dev, {x.device(), w.device()});
  if (bias) check_same_device("linear", dev, {bias->device()});
  const std::int64_t n = w.shape()[0], k = w.shape()[1];
  const std::int64_t m = n == 0 ? 0 : numel_of(shape) / n;
  if (m == 0 || n == 0) return;
  const cuda::detail::device_scope on_device(dev.index);
  // x as [m, k] with unit column stride; w read in place when either of its strides is 1.
  tensor<T> x2 = x.reshape({m, k});
  if (x2.strides()[1] != 1 && k > 1) x2 = x2.contiguous();
  tensor<T> wt = w;
  bool tb = true;  // B = wᵀ: w stored [n, k] is B stored transposed
  std::int64_t ldb = std::max<std::int64_t>(wt.strides()[0], k);
  if (!(wt.strides()[1] == 1 || k == 1)) {
    if (wt.strides()[0] == 1 || n == 1) {  // w is a transposed view: B [k, n] row-major
      tb = false;
      ldb = std::max<std::int64_t>(wt.strides()[1], n);
    } else {
      wt = wt.contiguous();
      ldb = k;
    }
  }
  const std::optional<tensor<T>> b = bias ? std::optional<tensor<T>>(bias->contiguous()) : std::nullopt;
  ::ccgraph::cuda::detail::gemm_call g;
  g.dev = dev;
  g.dt = dtype_v<T>;
  g.m = m, g.n = n, g.k = k;
  g.a = x2.data(), g.lda = std::max<std::int64_t>(x2.strides()[0], k), g.ta = false;
  g.b = wt.data(), g.ldb = ldb, g.tb = tb;
  g.c = out.data(), g.ldc = n;
  const bool gelu = act == linear_activation::gelu_tanh;
  g.epilogue = b ? (gelu ? ::ccgraph::cuda::detail::gemm_epilogue::gelu_bias : ::ccgraph::cuda::detail::gemm_epilogue::bias)
                 : (gelu ? ::ccgraph::cuda::detail::gemm_epilogue::gelu : ::ccgraph::cuda::detail::gemm_epilogue::none);
  g.bias = b ? b->data() : nullptr;
  // cuBLASLt's GELU epilogue on f64 is not computed in double (2.6e-10 off on values of order 1,
  // measured on an H200): f64 takes the separate kernel, which is.
  const bool lt_epilogue_exact = !(gelu && std::is_same_v<T, double>);
  if (path == linear_cuda_path::automatic && lt_epilogue_exact &&
      ::ccgraph::cuda::detail::gemm_run(::ccgraph::cuda::detail::gemm_backend::automatic, g))
    return;
  const bool epilogue = g.epilogue != ::ccgraph::cuda::detail::gemm_epilogue::none;
  g.epilogue = ::ccgraph::cuda::detail::gemm_epilogue::none;
  (void)::ccgraph::cuda::detail::gemm_run(::ccgraph::cuda::detail::gemm_backend::automatic, g);
  if (!epilogue) return;
  const long long total = m * n;
  const unsigned blocks = static_cast<unsigned>(std::clamp<long long>((total + 255) / 256, 1, 1 << 20));
  const cudaStream_t stream = ::ccgraph::cuda::current_stream();
  const T* bp = b ? b->data() : nullptr;
  if (gelu)
    cd::linear_epilogue_kernel<T, true><<<blocks, 256, 0, stream>>>(out.data(), bp, m, n);
  else
    cd::linear_epilogue_kernel<T, false><<<blocks, 256, 0, stream>>>(out.data(), bp, m, n);
  const cudaError_t st = cudaGetLastError();
  if (st != cudaSuccess) ::ccgraph::cuda::detail::throw_cuda_error(st, "linear: epilogue kernel launch", __FILE__, __LINE__);
}

/// linear on a CUDA device: one cuBLASLt GEMM with the bias (and GELU) epilogue; same contract
/// as linear_cpu.
template <element T>
void linear_cuda(const tensor<T>& x, const tensor<T>& w, const std::optional<tensor<T>>& bias, linear_activation act,
                 const tensor<T>& out) {
  linear_cuda_with(linear_cuda_path::automatic, x, w, bias, act, out);
}

}  // namespace ccgraph::detail

// ---- the graph ops' CUDA runs (ops::bmm, ops::linear in ops/linear.hpp) --------------------------

namespace ccgraph {
namespace detail {
/// The CUDA kernels, for linear_op_runs (the dispatch the CPU run shares).
struct linear_cuda_kernels {
  template <class... A>
  static void bmm(const A&... a) { bmm_cuda(a...); }
  template <class... A>
  static void linear(const A&... a) { linear_cuda(a...); }
};
}  // namespace detail

template <>
struct cuda_impl<ops::bmm> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::bmm& o, const Args& a) { return detail::linear_op_runs<detail::linear_cuda_kernels>::run(o, a); }
};
template <>
struct cuda_impl<ops::linear> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::linear& o, const Args& a) { return detail::linear_op_runs<detail::linear_cuda_kernels>::run(o, a); }
};

}  // namespace ccgraph
