// The transformer block of examples/transformer_block.hpp (public ops only) on GPUs: on one GPU
// eagerly on device tensors and as a cg::compile_function recorded into a CUDA Graph (scheduled
// by every pass) and replayed; on two and four GPUs tensor-parallel over NCCL, and on four as a
// 2 x 2 (dp x tp) mesh whose tp pairs each run their own batch, eagerly and replayed. Each
// against the CPU threads backend's single-rank result on that batch, within float rounding
// (the GPU kernels sum in other orders). Skipped without enough GPUs.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"
#include "op_test.hpp"

#include "../../examples/transformer_block.hpp"

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_transformer_block {

namespace cg = ccgraph;
namespace ex = ccgraph::examples;
using namespace ccgraph_test;

namespace transformer_block_gpu_test {

using i64 = std::int64_t;
using block_out = std::tuple<cg::tensor<float>, cg::tensor<float>, cg::tensor<float>>;
constexpr double tol = 1e-4;

/// The weights on GPU `d`.
ex::block_params<float> on_gpu(const ex::block_params<float>& p, int d) {
  return std::apply([d](const auto&... w) { return ex::block_params<float>{w.cuda(d)...}; }, p.tuple());
}

/// The single-rank block on the CPU threads backend.
block_out cpu_reference(const ex::block_config& c, const ex::block_params<float>& full, const cg::tensor<i64>& tok,
                        const cg::tensor<i64>& tgt) {
  block_out out;
  cg::run_threads(1, [&](cg::rank_context& ctx) {
    out = ex::call_block(ex::transformer_block(c, ctx.world(), 0, 1), tok, tgt, full);
  });
  return out;
}

void check_block(const block_out& got, const block_out& want, const std::string& what) {
  CHECK(std::get<1>(got).device().is_cuda());
  check_close(std::get<0>(got), std::get<0>(want), tol, tol, what + ": loss");
  check_close(std::get<1>(got), std::get<1>(want), tol, tol, what + ": hidden state");
  check_close(std::get<2>(got), std::get<2>(want), tol, tol, what + ": logits");
}

/// cg::compile_function of the block: (i64 tokens, i64 targets, 14 float weights).
template <class F, std::size_t... I>
auto compile_block(F program, cg::rank_context& ctx, cg::function_options opt, std::index_sequence<I...>) {
  return cg::compile_function<i64, i64, std::conditional_t<(I < 14), float, void>...>(program, ctx, std::move(opt));
}

std::vector<std::string> every_pass() {
  std::vector<std::string> all;
  for (auto p : cg::schedule_pass_names()) all.emplace_back(p);
  return all;
}

/// The block on dp x tp GPUs (one rank each; rank = dp_index x tp + tp_index): tensor-parallel
/// over the world when dp = 1, else over the tp dimension of a dp x tp mesh, each tp group on
/// its own batch. Eager on device tensors, then compile_function'ed with every pass into a CUDA
/// Graph and replayed twice; each against the CPU reference on that batch.
void check_on_gpus(int tp, int dp = 1) {
  const ex::block_config c;
  const auto full = ex::block_params<float>::random(c, 1);
  std::vector<cg::tensor<i64>> tok, tgt;
  std::vector<block_out> want;
  for (int b = 0; b < dp; ++b) {
    tok.push_back(ex::block_tokens(c, 7 + 4 * static_cast<std::int64_t>(b)));
    tgt.push_back(ex::block_tokens(c, 5 + 8 * static_cast<std::int64_t>(b)));
    want.push_back(cpu_reference(c, full, tok.back(), tgt.back()));
  }
  cg::cuda::run_gpus(tp * dp, [&](cg::rank_context& ctx) {
    const int d = ctx.rank(), tp_rank = d % tp;
    const auto b = static_cast<std::size_t>(d / tp);
    const cg::device_mesh mesh({dp, tp}, std::vector<std::string>{"dp", "tp"});
    const cg::group tp_group = dp == 1 ? ctx.world() : cg::group{mesh, "tp"};
    const auto p = on_gpu(full.shard(tp_rank, tp), d);
    const auto tok_d = tok[b].cuda(d), tgt_d = tgt[b].cuda(d);
    const auto program = ex::transformer_block(c, tp_group, tp_rank, tp);
    const std::string where =
        "dp " + std::to_string(dp) + " x tp " + std::to_string(tp) + ", rank " + std::to_string(ctx.rank());
    check_block(ex::call_block(program, tok_d, tgt_d, p), want[b], where + ", eager");
    auto replayed =
        compile_block(program, ctx, {.passes = every_pass(), .compile = {.cuda_graph = true}}, std::make_index_sequence<14>{});
    for (int call = 0; call < 2; ++call)
      check_block(ex::call_block(replayed, tok_d, tgt_d, p), want[b], where + ", CUDA Graph replay " + std::to_string(call));
  });
  if (dp > 1) CHECK(std::get<0>(want[0]).to_vector()[0] != std::get<0>(want[1]).to_vector()[0]);  // two batches
}

}  // namespace transformer_block_gpu_test

using namespace transformer_block_gpu_test;

GPU_TEST_CASE("transformer_block.cuda.one_gpu.eager_and_cuda_graph") { check_on_gpus(1); }

GPUS_TEST_CASE("transformer_block.cuda.tp2.eager_and_cuda_graph", 2) { check_on_gpus(2); }

GPUS_TEST_CASE("transformer_block.cuda.tp4.eager_and_cuda_graph", 4) { check_on_gpus(4); }

GPUS_TEST_CASE("transformer_block.cuda.dp2_x_tp2_mesh.eager_and_cuda_graph", 4) { check_on_gpus(2, 2); }

// (not run yet: no 8-GPU machine lent; the block's 4 heads allow tp up to 4)
GPUS_TEST_CASE("transformer_block.cuda.dp2_x_tp4_mesh.eager_and_cuda_graph", 8) { check_on_gpus(4, 2); }
}  // namespace gpu_test_transformer_block
