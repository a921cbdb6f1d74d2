// bmm, batched matmul (torch.matmul's broadcasting) and linear on the GPU: cuBLASLt's
// strided-batched GEMM and its bias / bias+GELU epilogues (ccgraph/cuda/blas.hpp,
// ccgraph/cuda/linear.cuh), against the CPU kernels (ccgraph/ops/linear.hpp, ops/matmul.hpp) on
// the same random inputs, every dtype, with strided operands; and the separate-epilogue path
// against the fused one. Skipped without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"
#include "op_test.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_linear {

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace linear_gpu_test {

using i64 = std::int64_t;
using cg::detail::linear_activation;
using cg::detail::linear_cuda_path;

/// GPU vs CPU of the same product: both accumulate in float (f64 in double) and round once;
/// the sums run in other orders, so the results may differ by a rounding of T (and by the
/// accumulated float error for long k).
template <class T>
double tol() {
  if constexpr (std::is_same_v<T, cg::bf16>) return 1.6e-2;
  if constexpr (std::is_same_v<T, cg::f16>) return 2e-3;
  if constexpr (std::is_same_v<T, float>) return 2e-5;
  return 1e-12;
}

template <class T>
void check_matmul(const cg::tensor<T>& a, const cg::tensor<T>& b, const std::string& what) {
  const auto want = cg::matmul(a, b);
  const auto got = cg::matmul(device_view(a), device_view(b));
  check_close(got, want, tol<T>(), tol<T>(), what);
}

template <class T>
void matmul_batched_cases() {
  // bmm: one strided-batched call.
  check_matmul<T>(cg::uniform<T>({5, 33, 40}, -1, 1, 1), cg::uniform<T>({5, 40, 17}, -1, 1, 2), "bmm");
  // The batch of a transposed operand, and batches laid out inside the rows ([m, B, k]).
  check_matmul<T>(cg::uniform<T>({5, 40, 33}, -1, 1, 3).transpose(1, 2), cg::uniform<T>({5, 40, 17}, -1, 1, 4),
                  "bmm transposed a");
  check_matmul<T>(cg::uniform<T>({33, 5, 40}, -1, 1, 5).transpose(0, 1), cg::uniform<T>({5, 17, 40}, -1, 1, 6).transpose(1, 2),
                  "bmm batch inside the rows");
  // [B, m, k] x [k, n]: B broadcast; rows fold into one GEMM.
  check_matmul<T>(cg::uniform<T>({4, 9, 24}, -1, 1, 7), cg::uniform<T>({24, 31}, -1, 1, 8), "3-d x 2-d");
  // Broadcast batch dims: [2, 1, m, k] x [3, k, n] -> [2, 3, m, n], and 4-d x 4-d.
  check_matmul<T>(cg::uniform<T>({2, 1, 7, 16}, -1, 1, 9), cg::uniform<T>({3, 16, 5}, -1, 1, 10), "broadcast batch");
  check_matmul<T>(cg::uniform<T>({2, 3, 7, 16}, -1, 1, 11), cg::uniform<T>({2, 3, 16, 5}, -1, 1, 12), "4-d");
  // A permuted batch that does not fold: the outer dim loops.
  check_matmul<T>(cg::uniform<T>({3, 2, 7, 16}, -1, 1, 13).transpose(0, 1), cg::uniform<T>({2, 3, 16, 5}, -1, 1, 14),
                  "non-folding batch");
  // bmm_cuda itself, and its errors.
  auto a = cg::uniform<T>({3, 8, 12}, -1, 1, 15), b = cg::uniform<T>({3, 12, 4}, -1, 1, 16);
  auto want = cg::tensor<T>::empty({3, 8, 4});
  cg::detail::bmm_cpu(a, b, want);
  auto got = device_poisoned<T>({3, 8, 4});
  cg::detail::bmm_cuda(a.cuda(0), b.cuda(0), got);
  check_close(got, want, tol<T>(), tol<T>(), "bmm_cuda");
}

template <class T>
void check_linear(const cg::tensor<T>& x, const cg::tensor<T>& w, const std::optional<cg::tensor<T>>& bias,
                  linear_activation act, linear_cuda_path path) {
  INFO("act=" << cg::detail::to_string(act) << " bias=" << bias.has_value()
              << " path=" << (path == linear_cuda_path::automatic ? "epilogue" : "separate"));
  const auto shape = cg::detail::linear_shape(x.shape(), w.shape(),
                                              bias ? std::optional<cg::shape_t>(bias->shape()) : std::nullopt);
  auto want = cg::tensor<T>::empty(shape);
  cg::detail::linear_cpu(x, w, bias, act, want);
  auto got = device_poisoned<T>(shape);
  std::optional<cg::tensor<T>> db;
  if (bias) db = device_view(*bias);
  cg::detail::linear_cuda_with(path, device_view(x), device_view(w), db, act, got);
  // cuBLASLt's GELU may use a faster tanh than std::tanh: a little more room in f32.
  const double t = std::is_same_v<T, float> && act == linear_activation::gelu_tanh ? 1e-4 : tol<T>();
  check_close(got, want, t, t, "linear");
}

template <class T>
void linear_cases() {
  auto x = cg::uniform<T>({4, 33, 96}, -1, 1, 1);
  auto w = cg::uniform<T>({80, 96}, -1, 1, 2);
  auto b = cg::uniform<T>({80}, -1, 1, 3);
  for (auto path : {linear_cuda_path::automatic, linear_cuda_path::separate_epilogue})
    for (auto act : {linear_activation::none, linear_activation::gelu_tanh}) {
      check_linear<T>(x, w, std::nullopt, act, path);
      check_linear<T>(x, w, b, act, path);
    }
  // A transposed weight, a strided input, a 1-d input, an odd bias offset (2-byte aligned).
  auto wt = cg::uniform<T>({96, 80}, -1, 1, 4).transpose(0, 1);
  auto xs = cg::uniform<T>({96, 10}, -1, 1, 5).transpose(0, 1);
  auto bb = cg::uniform<T>({81}, -1, 1, 6).narrow(0, 1, 80);
  check_linear<T>(xs, wt, bb, linear_activation::gelu_tanh, linear_cuda_path::automatic);
  check_linear<T>(cg::uniform<T>({96}, -1, 1, 7), w, b, linear_activation::none, linear_cuda_path::automatic);
}

}  // namespace linear_gpu_test

using namespace linear_gpu_test;

GPU_TEST_CASE("matmul.cuda.batched.f32") { matmul_batched_cases<float>(); }
GPU_TEST_CASE("matmul.cuda.batched.f64") { matmul_batched_cases<double>(); }
GPU_TEST_CASE("matmul.cuda.batched.bf16") { matmul_batched_cases<cg::bf16>(); }
GPU_TEST_CASE("matmul.cuda.batched.f16") { matmul_batched_cases<cg::f16>(); }

GPU_TEST_CASE("linear.cuda.f32") { linear_cases<float>(); }
GPU_TEST_CASE("linear.cuda.f64") { linear_cases<double>(); }
GPU_TEST_CASE("linear.cuda.bf16") { linear_cases<cg::bf16>(); }
GPU_TEST_CASE("linear.cuda.f16") { linear_cases<cg::f16>(); }

GPU_TEST_CASE("linear.cuda.bf16.bias_before_the_one_rounding") {
  // 256 + 1 (product) + 1 (bias) = 258 in bf16 only if the bias is added in float first.
  auto x = cg::full<cg::bf16>({1, 2}, cg::bf16(1.f)).cuda(0);
  auto w = cg::tensor<cg::bf16>::from({cg::bf16(256.f), cg::bf16(1.f)}, {1, 2}).cuda(0);
  auto b = cg::full<cg::bf16>({1}, cg::bf16(1.f)).cuda(0);
  auto out = device_poisoned<cg::bf16>({1, 1});
  cg::detail::linear_cuda<cg::bf16>(x, w, b, linear_activation::none, out);
  CHECK(static_cast<float>(out.cpu().item()) == 258.f);
}

GPU_TEST_CASE("gemm.cuda.strided_batched_backends_agree") {
  // The one gemm_run behind gemm() and gemm_batched(): cuBLASLt and cublasGemmStridedBatchedEx
  // give the same f64 products, with a broadcast (stride 0) B.
  const i64 B = 3, m = 5, n = 6, k = 7;
  auto a = device_uniform<double>({B, m, k}, -1, 1, 1);
  auto b = device_uniform<double>({k, n}, -1, 1, 2);
  auto want = cg::matmul(a.cpu(), b.cpu());
  for (auto backend : {cg::cuda::detail::gemm_backend::lt, cg::cuda::detail::gemm_backend::gemm_ex}) {
    auto c = device_poisoned<double>({B, m, n});
    cg::cuda::detail::gemm_call g;
    g.dev = cg::device::cuda(0);
    g.dt = cg::dtype::f64;
    g.m = m, g.n = n, g.k = k;
    g.a = a.data(), g.lda = k;
    g.b = b.data(), g.ldb = n;
    g.c = c.data(), g.ldc = n;
    g.batch = B, g.stride_a = m * k, g.stride_b = 0, g.stride_c = m * n;
    if (cg::cuda::detail::gemm_run(backend, g)) check_close(c, want, 1e-12, 1e-12, "gemm_run");
  }
}
}  // namespace gpu_test_linear
