// The kernel-backed graph ops of a transformer block on the GPU: embedding (and its backward),
// index_select, gather, scatter_add, stack, split (views), bmm, linear and scaled dot-product
// attention (and its backward), traced into one graph, compiled on a CUDA rank (each op reaching
// its cuda_impl through detail::run_op), run plainly and as a CUDA Graph replay, and compared
// with the same graph run by the CPU executor; and the same ops called eagerly on device
// tensors. Skipped without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"
#include "op_test.hpp"

#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_transformer_graph_ops {

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace transformer_graph_gpu_test {

using i64 = std::int64_t;
constexpr i64 B = 2, L = 16, D = 32, V = 50, NSEL = 5;

/// Indices in [0, n) of `shape` from a fixed pattern (repeats included).
inline cg::tensor<i64> pattern_index(cg::shape_t shape, i64 n, i64 step) {
  std::vector<i64> v;
  for (i64 i = 0; i < cg::numel_of(shape); ++i) v.push_back((i * step + 3) % n);
  return cg::tensor<i64>::from(v, shape);
}

/// A block's forward pieces and two backward kernels, every op of the family once.
inline auto block_program() {
  return [](auto idx, auto table, auto wqkv, auto bqkv, auto wo, auto sel, auto gidx, auto go) {
    auto h = cg::embedding(idx, table, 0);                                     // [B, L, D]
    auto qkv = cg::linear(h, wqkv, bqkv);                                      // [B, L, 3D]
    auto parts = cg::split(qkv, D, -1);                                         // strided views
    auto q = parts[0].contiguous(), k = parts[1].contiguous(), v = parts[2].contiguous();
    auto [attn, lse] = cg::scaled_dot_product_attention_with_lse(q, k, v, 0.0, true);
    auto y = cg::linear(attn, wo, std::nullopt, cg::linear_activation::gelu_tanh);  // [B, L, D]
    auto s = cg::stack({y, attn}, 0);                                           // [2, B, L, D]
    auto z = cg::bmm(y, attn.transpose(1, 2).contiguous());                     // [B, L, L]
    auto picked = cg::index_select(z, 2, sel);                                  // [B, L, NSEL]
    auto gathered = cg::gather(z, 2, gidx);                                     // [B, L, 2]
    auto scattered = cg::scatter_add(z, 2, gidx, gathered);                     // [B, L, L]
    auto [dq, dk, dv] = cg::scaled_dot_product_attention_backward(go, q, k, v, attn, lse, 0.0, true);
    auto dtable = cg::embedding_backward(go, idx, V, 0);                        // [V, D]
    return std::make_tuple(s, lse, picked, gathered, scattered, dq, dk, dv, dtable);
  };
}

template <class T>
void check_block(double tol) {
  const auto idx = pattern_index({B, L}, V, 7);
  const auto table = cg::uniform<T>({V, D}, -1, 1, 1);
  const auto wqkv = cg::uniform<T>({3 * D, D}, -0.3, 0.3, 2);
  const auto bqkv = cg::uniform<T>({3 * D}, -0.3, 0.3, 3);
  const auto wo = cg::uniform<T>({D, D}, -0.3, 0.3, 4);
  const auto sel = pattern_index({NSEL}, L, 3);
  const auto gidx = pattern_index({B, L, 2}, L, 5);
  const auto go = cg::uniform<T>({B, L, D}, -1, 1, 5);
  auto g = cg::trace(block_program(), cg::input<i64>({B, L}), cg::input<T>({V, D}), cg::input<T>({3 * D, D}),
                     cg::input<T>({3 * D}), cg::input<T>({D, D}), cg::input<i64>({NSEL}), cg::input<i64>({B, L, 2}),
                     cg::input<T>({B, L, D}));
  // The CPU executor's results (bitwise the eager CPU calls: tests/ops/test_*_graph_ops.cpp).
  decltype(cg::compile(g, std::declval<cg::rank_context&>())(idx, table, wqkv, bqkv, wo, sel, gidx, go)) want;
  cg::run_threads(1, [&](cg::rank_context& ctx) { want = cg::compile(g, ctx)(idx, table, wqkv, bqkv, wo, sel, gidx, go); });
  cg::cuda::run_gpus(1, [&](cg::rank_context& ctx) {
    for (bool replay : {false, true}) {
      INFO("cuda_graph " << replay);
      auto exe = cg::compile(g, ctx, {.cuda_graph = replay});
      for (int call = 0; call < 2; ++call) {
        const auto got = exe(idx.cuda(0), table.cuda(0), wqkv.cuda(0), bqkv.cuda(0), wo.cuda(0), sel.cuda(0),
                             gidx.cuda(0), go.cuda(0));
        CHECK(std::get<0>(got).device().is_cuda());
        check_close(std::get<0>(got), std::get<0>(want), tol, tol, "stack of linear and attention");
        check_close(std::get<1>(got), std::get<1>(want), tol, tol, "lse");
        check_close(std::get<2>(got), std::get<2>(want), tol, tol, "index_select of bmm");
        check_close(std::get<3>(got), std::get<3>(want), tol, tol, "gather");
        check_close(std::get<4>(got), std::get<4>(want), tol, tol, "scatter_add");
        check_close(std::get<5>(got), std::get<5>(want), tol, tol, "grad_q");
        check_close(std::get<6>(got), std::get<6>(want), tol, tol, "grad_k");
        check_close(std::get<7>(got), std::get<7>(want), tol, tol, "grad_v");
        check_bitwise(std::get<8>(got), std::get<8>(want), "embedding_backward (deterministic)");
      }
    }
  });
}

}  // namespace transformer_graph_gpu_test

using namespace transformer_graph_gpu_test;

GPU_TEST_CASE("transformer_graph_ops.cuda.f32") { check_block<float>(2e-4); }
GPU_TEST_CASE("transformer_graph_ops.cuda.f64") { check_block<double>(1e-10); }

GPU_TEST_CASE("transformer_graph_ops.cuda.eager_on_device_tensors") {
  // Eager calls on device tensors reach the cuda_impl runs (detail::run_op's device slot).
  const auto idx = pattern_index({3, 4}, 9, 5);
  const auto table = cg::uniform<float>({9, 8}, -1, 1, 1);
  check_bitwise(cg::embedding(idx.cuda(0), table.cuda(0)), cg::embedding(idx, table), "embedding");
  check_bitwise(cg::index_select(table.cuda(0), 0, idx.flatten().cuda(0)), cg::index_select(table, 0, idx.flatten()),
                "index_select");
  const auto x = cg::uniform<float>({4, 8}, -1, 1, 2);
  const auto w = cg::uniform<float>({6, 8}, -1, 1, 3);
  const auto b = cg::uniform<float>({6}, -1, 1, 4);
  const auto lin = cg::linear(x.cuda(0), w.cuda(0), b.cuda(0));
  CHECK(lin.device().is_cuda());
  check_close(lin, cg::linear(x, w, b), 2e-5, 2e-5, "linear");
  const auto q = cg::uniform<cg::bf16>({2, 2, 16, 64}, -1, 1, 5);
  const auto k = cg::uniform<cg::bf16>({2, 2, 16, 64}, -1, 1, 6);
  const auto v = cg::uniform<cg::bf16>({2, 2, 16, 64}, -1, 1, 7);
  check_close(cg::scaled_dot_product_attention(q.cuda(0), k.cuda(0), v.cuda(0), 0.0, true),
              cg::scaled_dot_product_attention(q, k, v, 0.0, true), 1.6e-2, 1.6e-2, "sdpa bf16");
  check_bitwise(cg::stack({table.cuda(0), table.cuda(0)}, 1), cg::stack({table, table}, 1), "stack");
}
}  // namespace gpu_test_transformer_graph_ops
