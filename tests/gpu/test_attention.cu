// scaled_dot_product_attention on the GPU (ccgraph/cuda/attention.cuh) against the CPU kernels
// (ccgraph/ops/attention.hpp, themselves checked against double precision in
// tests/ops/test_attention.cpp), on the same random inputs: the fused tensor-core forward (every
// block shape: 16 and 32 rows per warp) and the SIMT forward for every dtype, head dims 64 and 128 and others, partial
// tiles, causal with L <= S and L > S, bool and additive masks (broadcast), fully masked rows,
// strided and misaligned inputs; the backward (tensor-core and SIMT) for every dtype. Skipped
// without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"
#include "op_test.hpp"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_attention {

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace attention_gpu_test {

using i64 = std::int64_t;
using cg::detail::sdpa_cuda_kernel;
using cg::detail::sdpa_options;

/// Tolerances of a GPU forward against the CPU one: the fused kernel rounds the probabilities
/// to T before P V (as flash attention does) and both round the output once.
template <class T>
double fwd_tol() {
  if constexpr (std::is_same_v<T, cg::bf16>) return 1.6e-2;
  if constexpr (std::is_same_v<T, cg::f16>) return 2.5e-3;
  if constexpr (std::is_same_v<T, float>) return 2e-5;
  return 1e-12;
}

struct fwd_case {
  i64 B, H, L, S, E, Ev;
  bool causal = false;
  int mask = 0;            // 0 none, 1 bool [L, S], 2 additive [B, 1, 1, S], 3 bool with fully masked rows
  bool strided = false;    // q, k, v stored [B, L, H, E] and viewed as [B, H, L, E]
  bool misaligned = false; // q narrowed by one element along E: rows not 16-byte aligned
  std::optional<double> scale = std::nullopt;
};

std::string describe(const fwd_case& c) {
  return "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " L=" + std::to_string(c.L) +
         " S=" + std::to_string(c.S) + " E=" + std::to_string(c.E) + " Ev=" + std::to_string(c.Ev) +
         (c.causal ? " causal" : "") + " mask=" + std::to_string(c.mask) + (c.strided ? " strided" : "") +
         (c.misaligned ? " misaligned" : "");
}

/// A host [B, H, rows, cols] input: contiguous, or stored [B, rows, H, cols] (strided), or
/// narrowed by one column (misaligned rows).
template <class T>
cg::tensor<T> make_input(const fwd_case& c, i64 rows, i64 cols, std::uint64_t seed, bool allow_misaligned) {
  if (allow_misaligned && c.misaligned) return cg::uniform<T>({c.B, c.H, rows, cols + 1}, -1, 1, seed).narrow(3, 1, cols);
  if (c.strided) return cg::uniform<T>({c.B, rows, c.H, cols}, -1, 1, seed).transpose(1, 2);
  return cg::uniform<T>({c.B, c.H, rows, cols}, -1, 1, seed);
}

template <class T>
void run_forward(const fwd_case& c, sdpa_cuda_kernel which) {
  INFO(describe(c));
  CAPTURE(static_cast<int>(which));
  const auto q = make_input<T>(c, c.L, c.E, 1, true);
  const auto k = make_input<T>(c, c.S, c.E, 2, false);
  const auto v = make_input<T>(c, c.S, c.Ev, 3, false);
  const sdpa_options opt{c.causal, c.scale, 0.0};
  cg::tensor<T> out_cpu = cg::tensor<T>::empty({c.B, c.H, c.L, c.Ev});
  using A = cg::detail::sdpa_lse_t<T>;
  cg::tensor<A> lse_cpu = cg::tensor<A>::empty({c.B, c.H, c.L});
  cg::tensor<T> out_gpu = device_poisoned<T>({c.B, c.H, c.L, c.Ev});
  cg::tensor<A> lse_gpu = device_poisoned<A>({c.B, c.H, c.L});
  const auto dq = device_view(q), dk = device_view(k), dv = device_view(v);
  if (c.mask == 1 || c.mask == 3) {
    auto m = cg::uniform<bool>({c.L, c.S}, -1, 1, 4);
    if (c.mask == 3)
      for (i64 i = 0; i < c.L; i += 3)
        for (i64 j = 0; j < c.S; ++j) m.at({i, j}) = false;
    cg::detail::sdpa_cpu<T, bool>(q, k, v, m, opt, out_cpu, lse_cpu);
    cg::detail::sdpa_cuda_with<T, bool>(which, dq, dk, dv, m.cuda(0), opt, out_gpu, lse_gpu);
  } else if (c.mask == 2) {
    auto m = cg::uniform<T>({c.B, 1, 1, c.S}, -3, 1, 5);
    cg::detail::sdpa_cpu<T, T>(q, k, v, m, opt, out_cpu, lse_cpu);
    cg::detail::sdpa_cuda_with<T, T>(which, dq, dk, dv, m.cuda(0), opt, out_gpu, lse_gpu);
  } else {
    cg::detail::sdpa_cpu<T>(q, k, v, std::nullopt, opt, out_cpu, lse_cpu);
    cg::detail::sdpa_cuda_with<T>(which, dq, dk, dv, std::nullopt, opt, out_gpu, lse_gpu);
  }
  const double tol = fwd_tol<T>();
  check_close(out_gpu, out_cpu, tol, tol, "out");
  check_close(lse_gpu, lse_cpu, std::is_same_v<T, double> ? 1e-12 : 1e-4, 1e-5, "lse");
}

const std::vector<fwd_case> flash_cases = {
    {1, 1, 1, 1, 64, 64},                       // one query, one key
    {2, 3, 100, 77, 64, 64},                     // partial tiles
    {1, 2, 256, 256, 128, 128},                  // several tiles
    {1, 2, 256, 256, 128, 128, true},            // causal, L == S
    {2, 2, 70, 130, 64, 64, true},               // causal, L < S
    {2, 2, 130, 70, 128, 128, true},             // causal, L > S
    {2, 2, 96, 200, 64, 64, false, 1},           // bool mask
    {2, 2, 96, 200, 128, 128, false, 2},         // additive mask, broadcast over heads and rows
    {1, 2, 64, 65, 64, 64, false, 3},            // fully masked rows
    {2, 3, 129, 65, 128, 128, true, 0, true},    // strided [B, L, H, E]
    {1, 2, 80, 80, 64, 64, false, 0, false, true},  // misaligned q: copied for the fused kernel
    {1, 1, 50, 60, 64, 64, false, 0, false, false, 0.3},
    {1, 2, 300, 200, 64, 64, true},              // causal, several unmasked tiles before the diagonal
    {1, 1, 200, 333, 128, 128, true},            // the same with L < S
    {1, 1, 260, 190, 128, 128},                  // unmasked tiles, then a partial one
};

const std::vector<fwd_case> simt_cases = {
    {1, 1, 1, 1, 8, 8},
    {2, 3, 37, 45, 40, 24},
    {1, 2, 70, 70, 64, 64, true},
    {2, 1, 33, 100, 16, 96, true},
    {1, 2, 40, 50, 256, 200, false, 1},
    {2, 2, 20, 33, 32, 32, false, 2},
    {1, 1, 30, 31, 24, 24, false, 3},
    {2, 2, 35, 40, 64, 48, true, 0, true},
};

}  // namespace attention_gpu_test

using namespace attention_gpu_test;

GPU_TEST_CASE("sdpa.cuda.flash.bf16") {
  for (const auto& c : flash_cases) {
    run_forward<cg::bf16>(c, sdpa_cuda_kernel::automatic);
    run_forward<cg::bf16>(c, sdpa_cuda_kernel::flash8);
    run_forward<cg::bf16>(c, sdpa_cuda_kernel::flash4x2);
  }
}

GPU_TEST_CASE("sdpa.cuda.flash.f16") {
  for (const auto& c : flash_cases) {
    run_forward<cg::f16>(c, sdpa_cuda_kernel::flash4);
    run_forward<cg::f16>(c, sdpa_cuda_kernel::flash8);
    run_forward<cg::f16>(c, sdpa_cuda_kernel::flash4x2);
  }
}

GPU_TEST_CASE("sdpa.cuda.simt.every_dtype") {
  for (const auto& c : simt_cases) {
    run_forward<float>(c, sdpa_cuda_kernel::automatic);
    run_forward<double>(c, sdpa_cuda_kernel::automatic);
    run_forward<cg::bf16>(c, sdpa_cuda_kernel::simt);
    run_forward<cg::f16>(c, sdpa_cuda_kernel::automatic);  // head dims other than 64/128: SIMT
  }
  for (const auto& c : flash_cases) run_forward<float>(c, sdpa_cuda_kernel::automatic);
  run_forward<cg::bf16>(flash_cases[3], sdpa_cuda_kernel::simt);
}

GPU_TEST_CASE("sdpa.cuda.automatic_runs_a_fused_kernel_on_large_batches") {
  // The automatic choice is the kernel of 32 rows per warp where its blocks give every SM two,
  // else the one of 16 rows per warp (bench/RESULTS.md): the result is that kernel's (checked
  // against the CPU above) bit for bit, and the kernels agree within a rounding of bf16. 512
  // blocks of 128 rows fill any GPU this runs on (an H200 has 132 SMs); 32 blocks of 64 do not.
  for (const i64 L : {2048, 64}) {
    CAPTURE(L);
    const i64 B = 2, H = 16, E = 64;
    auto q = device_uniform<cg::bf16>({B, H, L, E}, -1, 1, 31), k = device_uniform<cg::bf16>({B, H, L, E}, -1, 1, 32),
         v = device_uniform<cg::bf16>({B, H, L, E}, -1, 1, 33);
    auto run = [&](sdpa_cuda_kernel which) {
      auto out = device_poisoned<cg::bf16>({B, H, L, E});
      cg::detail::sdpa_cuda_with<cg::bf16>(which, q, k, v, std::nullopt, {true, std::nullopt, 0.0}, out);
      return out.cpu();
    };
    const auto automatic = run(sdpa_cuda_kernel::automatic);
    const auto expected = run(L == 2048 ? sdpa_cuda_kernel::flash4x2 : sdpa_cuda_kernel::flash4);
    check_bitwise(automatic, expected, "automatic vs the kernel it should pick");
    check_close(run(sdpa_cuda_kernel::flash8), run(sdpa_cuda_kernel::flash4), fwd_tol<cg::bf16>(),
                fwd_tol<cg::bf16>(), "flash8 vs flash4");
    check_close(run(sdpa_cuda_kernel::flash4x2), run(sdpa_cuda_kernel::flash4), fwd_tol<cg::bf16>(),
                fwd_tol<cg::bf16>(), "flash4x2 vs flash4");
  }
}

GPU_TEST_CASE("sdpa_backward.cuda.automatic_picks_the_dq_kernel_by_size") {
  // The dQ kernel's choice follows the forward's rule (32 rows per warp where the blocks fill
  // the GPU): bit for bit the forced kernel's result, and the two agree within bf16 rounding.
  for (const i64 L : {2048, 64}) {
    CAPTURE(L);
    const i64 B = 2, H = 16, E = 128;
    const cg::detail::sdpa_options opt{true, std::nullopt, 0.0};
    auto q = device_uniform<cg::bf16>({B, H, L, E}, -1, 1, 41), k = device_uniform<cg::bf16>({B, H, L, E}, -1, 1, 42),
         v = device_uniform<cg::bf16>({B, H, L, E}, -1, 1, 43), go = device_uniform<cg::bf16>({B, H, L, E}, -1, 1, 44);
    auto out = device_poisoned<cg::bf16>({B, H, L, E});
    auto lse = device_poisoned<float>({B, H, L});
    cg::detail::sdpa_cuda<cg::bf16>(q, k, v, std::nullopt, opt, out, lse);
    auto run = [&](sdpa_cuda_kernel which) {
      auto gq = device_poisoned<cg::bf16>(q.shape()), gk = device_poisoned<cg::bf16>(q.shape()),
           gv = device_poisoned<cg::bf16>(q.shape());
      cg::detail::sdpa_backward_cuda_with<cg::bf16>(which, go, q, k, v, out, lse, std::nullopt, opt, gq, gk, gv);
      return std::vector<cg::tensor<cg::bf16>>{gq.cpu(), gk.cpu(), gv.cpu()};
    };
    const auto automatic = run(sdpa_cuda_kernel::automatic);
    const auto expected = run(L == 2048 ? sdpa_cuda_kernel::flash4x2 : sdpa_cuda_kernel::flash4);
    const auto other = run(L == 2048 ? sdpa_cuda_kernel::flash4 : sdpa_cuda_kernel::flash4x2);
    for (int i = 0; i < 3; ++i) {
      check_bitwise(automatic[i], expected[i], "automatic vs the kernel it should pick");
      check_close(other[i], expected[i], 4e-2, 4e-2, "16 vs 32 rows per warp");
    }
  }
}

GPU_TEST_CASE("sdpa.cuda.rank3_and_rank5") {
  // Batch dims other than [B, H]: none beyond the sequence, and three (an outer loop).
  auto q = cg::uniform<cg::bf16>({3, 40, 64}, -1, 1, 1), k = cg::uniform<cg::bf16>({3, 50, 64}, -1, 1, 2),
       v = cg::uniform<cg::bf16>({3, 50, 64}, -1, 1, 3);
  auto out = cg::tensor<cg::bf16>::empty({3, 40, 64});
  cg::detail::sdpa_cpu<cg::bf16>(q, k, v, std::nullopt, {true, std::nullopt, 0.0}, out);
  auto dout = device_poisoned<cg::bf16>({3, 40, 64});
  cg::detail::sdpa_cuda<cg::bf16>(q.cuda(0), k.cuda(0), v.cuda(0), std::nullopt, {true, std::nullopt, 0.0}, dout);
  check_close(dout, out, fwd_tol<cg::bf16>(), fwd_tol<cg::bf16>(), "rank 3");
  auto q5 = cg::uniform<float>({2, 2, 3, 20, 16}, -1, 1, 4), k5 = cg::uniform<float>({2, 2, 3, 25, 16}, -1, 1, 5),
       v5 = cg::uniform<float>({2, 2, 3, 25, 8}, -1, 1, 6);
  auto m5 = cg::uniform<bool>({2, 1, 1, 20, 25}, -1, 1, 7);
  auto out5 = cg::tensor<float>::empty({2, 2, 3, 20, 8});
  auto lse5 = cg::tensor<float>::empty({2, 2, 3, 20});
  cg::detail::sdpa_cpu<float, bool>(q5, k5, v5, m5, {}, out5, lse5);
  auto dout5 = device_poisoned<float>({2, 2, 3, 20, 8});
  auto dlse5 = device_poisoned<float>({2, 2, 3, 20});
  cg::detail::sdpa_cuda<float, bool>(q5.cuda(0), k5.cuda(0), v5.cuda(0), m5.cuda(0), {}, dout5, dlse5);
  check_close(dout5, out5, 2e-5, 2e-5, "rank 5 out");
  check_close(dlse5, lse5, 1e-5, 1e-5, "rank 5 lse");
}

GPU_TEST_CASE("sdpa.cuda.errors") {
  auto q = device_uniform<float>({1, 1, 4, 8}, -1, 1, 1);
  auto out = device_poisoned<float>({1, 1, 4, 8});
  CHECK(op_contains(op_error_of([&] { cg::detail::sdpa_cuda_with<float>(sdpa_cuda_kernel::flash4, q, q, q, std::nullopt, {}, out); }),
                 "scaled_dot_product_attention: the fused kernel takes bf16 or f16, not f32"));
  auto h = device_uniform<cg::bf16>({1, 1, 4, 32}, -1, 1, 2);
  auto ho = device_poisoned<cg::bf16>({1, 1, 4, 32});
  CHECK(op_contains(op_error_of([&] { cg::detail::sdpa_cuda_with<cg::bf16>(sdpa_cuda_kernel::flash4, h, h, h, std::nullopt, {}, ho); }),
                 "the fused kernel needs E == Ev in {64, 128}"));
  auto big = device_uniform<float>({1, 1, 2, 300}, -1, 1, 3);
  auto bo = device_poisoned<float>({1, 1, 2, 300});
  CHECK(op_contains(op_error_of([&] { cg::detail::sdpa_cuda<float>(big, big, big, std::nullopt, {}, bo); }),
                 "head dims E=300 and Ev=300 must be at most 256 on CUDA"));
  auto host_out = cg::tensor<float>::empty({1, 1, 4, 8});
  CHECK(op_contains(op_error_of([&] { cg::detail::sdpa_cuda<float>(q, q, q, std::nullopt, {}, host_out); }), "not a CUDA device"));
}

namespace attention_gpu_test {

template <class T>
void run_backward(const fwd_case& c, sdpa_cuda_kernel which) {
  INFO(describe(c));
  CAPTURE(static_cast<int>(which));
  const auto q = make_input<T>(c, c.L, c.E, 11, false);
  const auto k = make_input<T>(c, c.S, c.E, 12, false);
  const auto v = make_input<T>(c, c.S, c.Ev, 13, false);
  const auto go = cg::uniform<T>({c.B, c.H, c.L, c.Ev}, -1, 1, 14);
  const sdpa_options opt{c.causal, c.scale, 0.0};
  using A = cg::detail::sdpa_lse_t<T>;
  std::optional<cg::tensor<bool>> mask;
  if (c.mask == 1 || c.mask == 3) {
    mask = cg::uniform<bool>({c.L, c.S}, -1, 1, 15);
    if (c.mask == 3)
      for (i64 j = 0; j < c.S; ++j) mask->at({0, j}) = false;
  }
  // The forward on the CPU gives out and lse for both backwards.
  auto out = cg::tensor<T>::empty({c.B, c.H, c.L, c.Ev});
  auto lse = cg::tensor<A>::empty({c.B, c.H, c.L});
  cg::detail::sdpa_cpu<T, bool>(q, k, v, mask, opt, out, lse);
  auto dq = cg::tensor<T>::empty(q.shape()), dk = cg::tensor<T>::empty(k.shape()), dv = cg::tensor<T>::empty(v.shape());
  cg::detail::sdpa_backward_cpu<T, bool>(go, q, k, v, out, lse, mask, opt, dq, dk, dv);
  auto gq = device_poisoned<T>(q.shape()), gk = device_poisoned<T>(k.shape()), gv = device_poisoned<T>(v.shape());
  std::optional<cg::tensor<bool>> dmask;
  if (mask) dmask = mask->cuda(0);
  cg::detail::sdpa_backward_cuda_with<T, bool>(which, device_view(go), device_view(q), device_view(k), device_view(v),
                                               out.cuda(0), lse.cuda(0), dmask, opt, gq, gk, gv);
  // Same formula, float sums in another order: the results differ by a rounding of T; the
  // tensor-core kernels also round P and dS to T before their products (as flash attention).
  const bool tc = which != sdpa_cuda_kernel::simt && (std::is_same_v<T, cg::bf16> || std::is_same_v<T, cg::f16>) &&
                  c.E == c.Ev && (c.E == 64 || c.E == 128);
  const double tol = std::is_same_v<T, cg::bf16> ? (tc ? 4e-2 : 1.6e-2)
                     : std::is_same_v<T, cg::f16> ? (tc ? 6e-3 : 2e-3)
                     : std::is_same_v<T, float> ? 1e-5 : 1e-12;
  check_close(gq, dq, tol, tol, "grad_q");
  check_close(gk, dk, tol, tol, "grad_k");
  check_close(gv, dv, tol, tol, "grad_v");
}

const std::vector<fwd_case> backward_cases = {
    {1, 1, 1, 1, 8, 8},
    {2, 3, 37, 45, 40, 24},
    {1, 2, 70, 70, 64, 64, true},
    {2, 1, 33, 100, 128, 96, true},
    {1, 2, 20, 50, 32, 32, false, 1},
    {1, 1, 30, 31, 24, 24, false, 3},
    {2, 2, 35, 40, 64, 64, true, 0, true},
};

/// Head dims 64 and 128 (E == Ev): the tensor-core backward's cases.
const std::vector<fwd_case> flash_backward_cases = {
    {1, 1, 1, 1, 64, 64},
    {2, 2, 100, 77, 128, 128},
    {1, 2, 130, 70, 64, 64, true},
    {1, 2, 70, 130, 128, 128, true},
    {1, 2, 64, 65, 64, 64, false, 1},
    {1, 2, 70, 64, 128, 128, false, 3},
    {2, 2, 35, 40, 64, 64, true, 0, true},
    {1, 1, 50, 60, 64, 64, false, 0, false, false, 0.3},
    {1, 1, 300, 300, 128, 128, true},            // causal, several unmasked tiles before the diagonal
    {1, 1, 260, 190, 64, 64},                    // unmasked tiles, then a partial one
};

}  // namespace attention_gpu_test

GPU_TEST_CASE("sdpa_backward.cuda.simt.every_dtype") {
  for (const auto& c : backward_cases) {
    run_backward<float>(c, sdpa_cuda_kernel::automatic);
    run_backward<double>(c, sdpa_cuda_kernel::automatic);
    run_backward<cg::bf16>(c, sdpa_cuda_kernel::automatic);
    run_backward<cg::f16>(c, sdpa_cuda_kernel::automatic);
  }
  for (const auto& c : flash_backward_cases) run_backward<cg::bf16>(c, sdpa_cuda_kernel::simt);
}

GPU_TEST_CASE("sdpa_backward.cuda.flash") {
  for (const auto& c : flash_backward_cases) {
    run_backward<cg::bf16>(c, sdpa_cuda_kernel::automatic);
    run_backward<cg::f16>(c, sdpa_cuda_kernel::flash4);
    run_backward<cg::bf16>(c, sdpa_cuda_kernel::flash4x2);
    run_backward<float>(c, sdpa_cuda_kernel::automatic);  // f32: the SIMT kernels
  }
}

GPU_TEST_CASE("sdpa.cuda.forward_then_backward_on_device") {
  // The device forward's lse feeds the device backward (what a training step does), bf16 with
  // the fused forward, against the CPU pair.
  const i64 B = 1, H = 2, L = 128, E = 64;
  auto q = cg::uniform<cg::bf16>({B, H, L, E}, -1, 1, 21), k = cg::uniform<cg::bf16>({B, H, L, E}, -1, 1, 22),
       v = cg::uniform<cg::bf16>({B, H, L, E}, -1, 1, 23), go = cg::uniform<cg::bf16>({B, H, L, E}, -1, 1, 24);
  auto out = cg::tensor<cg::bf16>::empty({B, H, L, E});
  auto lse = cg::tensor<float>::empty({B, H, L});
  cg::detail::sdpa_cpu<cg::bf16>(q, k, v, std::nullopt, {true, std::nullopt, 0.0}, out, lse);
  auto dq = cg::tensor<cg::bf16>::empty(q.shape()), dk = cg::tensor<cg::bf16>::empty(q.shape()),
       dv = cg::tensor<cg::bf16>::empty(q.shape());
  cg::detail::sdpa_backward_cpu<cg::bf16>(go, q, k, v, out, lse, std::nullopt, {true, std::nullopt, 0.0}, dq, dk, dv);
  auto qd = q.cuda(0), kd = k.cuda(0), vd = v.cuda(0);
  auto od = device_poisoned<cg::bf16>({B, H, L, E});
  auto ld = device_poisoned<float>({B, H, L});
  cg::detail::sdpa_cuda<cg::bf16>(qd, kd, vd, std::nullopt, {true, std::nullopt, 0.0}, od, ld);
  auto gq = device_poisoned<cg::bf16>(q.shape()), gk = device_poisoned<cg::bf16>(q.shape()),
       gv = device_poisoned<cg::bf16>(q.shape());
  cg::detail::sdpa_backward_cuda<cg::bf16>(go.cuda(0), qd, kd, vd, od, ld, std::nullopt, {true, std::nullopt, 0.0}, gq, gk, gv);
  check_close(gq, dq, 5e-2, 5e-2, "grad_q");
  check_close(gk, dk, 5e-2, 5e-2, "grad_k");
  check_close(gv, dv, 5e-2, 5e-2, "grad_v");
}
}  // namespace gpu_test_attention
