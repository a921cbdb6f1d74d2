// bench_gpu_block: issue 16 item 7, the GPT-style block of examples/gpt_block.hpp (pre-norm,
// causal attention + GELU MLP, bf16) with tensor + sequence parallelism over the GPUs of one host
// (2 at most), laid out by cg::parallelize_module with PyTorch's plan:
//
//   B x L tokens, model dim D, H heads, MLP F; each rank its L/tp tokens; forward + backward of
//   sum(x2²) / (B L D), every parameter's gradient (the norms' all-reduced)
//
// traced into one joint graph (cg::value_and_grad through the dtensor styles), scheduled and
// replayed as one CUDA Graph per step. Rows: with the overlap passes (sink_waits, raise_comms,
// reorder_compute_for_overlap), without any pass, and with every pass (bucketing and
// decompose_matmul_collectives too); TP only, the overlap passes with the norms' gradients left
// each rank's Partial term (parallelize_options::partial_grads), as PyTorch's parallelize_module
// leaves them: its step reduces them nowhere. bench/torch_block_reference.py is PyTorch's
// side (parallelize_module, eager and torch.compile) to run in the same lease.
// Timing as bench_gpu_train: CUDA events around one step on rank 0's stream, 4 warm-up steps, the
// median of 10. Prints a table and one `RESULT <workload> <impl> <ms> ms` line per row.
//
// Usage: bench_gpu_block [--quick] [--timeline] [--fsdp] [--world N]
//   --world N    N GPUs (default: 2, or 1 where there is one)
//   --quick      B = 1 (B = 2 with --fsdp)
//   --timeline   after timing, GPU 0's kernels of the overlapped step from CUPTI
//   --fsdp       the same block under FSDP instead (cg::fully_shard, examples/gpt_block.hpp's
//                gpt_fsdp_block_loss): each rank B/2 of the batch, every parameter's dim-0 piece,
//                all_gathered where the block reads it (again in the backward) and its gradient
//                reduce_scattered; torch_block_reference.py --fsdp is PyTorch's FSDP2 side
#include <ccgraph/cuda.hpp>

#include "../examples/gpt_block.hpp"
#include "bench_args.hpp"
#include "cupti_timeline.hpp"
#include "step_timer.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace cg = ccgraph;
namespace ex = ccgraph::examples;
using i64 = std::int64_t;
using bf = cg::bf16;
using T = cg::tensor<bf>;

namespace {

constexpr int wrt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

/// cg::compile_function of the step: (x, 10 parameters), all bf16.
template <class F, std::size_t... I>
auto compile_step(F step, cg::rank_context& ctx, cg::function_options opt, std::index_sequence<I...>) {
  return cg::compile_function<bf, std::conditional_t<(I < 10), bf, void>...>(step, ctx, std::move(opt));
}

}  // namespace

int main(int argc, char** argv) {
  const bench::args args(argc, argv, "[--quick] [--timeline] [--fsdp] [--world N]", {"--quick", "--timeline", "--fsdp"},
                         {"--world"});
  const bool timeline = args.has("--timeline");
  const bool fsdp = args.has("--fsdp");
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::printf("bench_gpu_block: no GPU\n");
    return 0;
  }
  // Two GPUs unless --world says otherwise (the workload's shapes are per rank or split evenly
  // over 1, 2, 4 or 8 ranks).
  const int world = static_cast<int>(args.flag_integer("--world", std::min(gpus, 2)));
  if (world > gpus) args.fail("--world " + std::to_string(world) + " needs as many GPUs; " + std::to_string(gpus) + " visible");
  const ex::gpt_config c{.batch = args.has("--quick") ? (fsdp ? 2 : 1) : 4, .seq = 2048, .dim = 4096, .heads = 32, .ffn = 16384};
  if ((fsdp ? c.batch : c.seq) % world != 0 || c.heads % world != 0)
    args.fail("--world " + std::to_string(world) + " must divide the " + (fsdp ? "batch (" + std::to_string(c.batch) : "sequence (" + std::to_string(c.seq)) +
              ") and the heads (" + std::to_string(c.heads) + ")");
  const std::string workload = "gpt_block_" + std::string(fsdp ? "fsdp" : "tp") + std::to_string(world) +
                               (fsdp ? "" : "_sp") + "_B" + std::to_string(c.batch) + "_L" + std::to_string(c.seq) +
                               "_D" + std::to_string(c.dim) + "_H" + std::to_string(c.heads) + "_F" + std::to_string(c.ffn);
  std::vector<std::string> every_pass;
  for (const auto p : cg::schedule_pass_names()) every_pass.emplace_back(p);
  // name, passes, and (TP only) whether the norms' gradients stay each rank's Partial term, as
  // PyTorch's parallelize_module leaves them (torch_block_reference.py's step reduces nothing
  // after the backward), instead of being all_reduced in the backward.
  struct mode {
    std::string name;
    std::vector<std::string> passes;
    bool partial_norm_grads = false;
  };
  const std::vector<std::string> overlap{"sink_waits", "raise_comms", "reorder_compute_for_overlap"};
  std::vector<mode> modes{{"overlap_passes", overlap}, {"no_passes", {}},
                          {"every_pass", every_pass}};  // bucketing and the matmul/collective decomposition included
  if (!fsdp) modes.push_back({"overlap_passes_partial_norm_grads", overlap, true});
  std::vector<double> ms(modes.size(), 0.0), loss(modes.size(), 0.0);
  // Collectives rank 0 ran on the copy engines per mode: the first call's (eager) and the
  // recording's (a replay is not counted).
  std::vector<std::uint64_t> on_copy_engine(modes.size(), 0);
  if (timeline) bench::cupti::start();
  cg::cuda::run_gpus(world, [&](cg::rank_context& ctx) {
    const int d = ctx.rank();
    // TP + SP over every rank, or FSDP over every rank ("tp" of one rank: no TP collectives).
    const cg::device_mesh mesh = fsdp ? cg::device_mesh({world, 1}, {"dp", "tp"}) : cg::device_mesh({world}, {"tp"});
    // The same whole parameters on every rank (generated on the host), this rank's pieces on its GPU.
    const auto whole = ex::gpt_random_params<bf>(c, cg::generator(99));
    std::vector<T> params;
    for (const T& p : fsdp ? ex::gpt_fsdp_shards(whole, mesh) : ex::gpt_shards(whole, mesh)) params.push_back(p.cuda(d));
    cg::generator gen(1234, static_cast<std::uint64_t>(d));
    const T x = (fsdp ? cg::randn<bf>({c.batch / world, c.seq, c.dim}, gen) : cg::randn<bf>({c.batch, c.seq / world, c.dim}, gen)).cuda(d);
    // Every mode of one loss (the two losses are lambdas of different types).
    auto time_modes = [&](const auto& loss_and_grads, bool partial_norm_grads) {
      for (std::size_t k = 0; k < modes.size(); ++k) {
        if (modes[k].partial_norm_grads != partial_norm_grads) continue;
        auto step = compile_step(loss_and_grads, ctx,
                                 {.passes = modes[k].passes,
                                  .compile = {.cuda_graph = true, .static_outputs = true},
                                  .guard = cg::function_guard::arguments},
                                 std::make_index_sequence<10>{});
        T last_loss;
        auto* nr = dynamic_cast<cg::cuda::detail::nccl_rank*>(&ctx.comm());
        const std::uint64_t ce_before = nr ? nr->copy_engine_launched() : 0;
        auto one = [&] {
          auto out = [&]<std::size_t... I>(std::index_sequence<I...>) {
            return step(x, params[I]...);
          }(std::make_index_sequence<10>{});
          last_loss = std::get<0>(out);
        };
        const double t = bench::step_ms(one);
        if (timeline && (k == 0 || modes[k].partial_norm_grads))
          bench::cupti::trace_steps(ctx, workload + ", CUDA Graph, " + modes[k].name, 2, true, [&](int) { one(); });
        if (d == 0) {
          ms[k] = t;
          on_copy_engine[k] = (nr ? nr->copy_engine_launched() : 0) - ce_before;
          loss[k] = static_cast<double>(static_cast<float>(last_loss.cpu().to_vector().at(0)));
        }
      }
    };
    if (fsdp) {
      time_modes(cg::value_and_grad(ex::gpt_fsdp_block_loss(c, mesh), wrt), false);
    } else {
      time_modes(cg::value_and_grad(ex::gpt_block_loss(c, mesh), wrt), false);
      time_modes(cg::value_and_grad(ex::gpt_block_loss(c, mesh, true), wrt), true);
    }
  });
  // GEMMs per rank: forward 2 B L (4 D² + 2 D F) / tp FLOPs; backward twice that (x's gradient
  // flows through every linear: the norms' parameters need it).
  const double tflop = 3.0 * 2.0 * double(c.batch * c.seq) *
                       (4.0 * double(c.dim) * double(c.dim) + 2.0 * double(c.dim) * double(c.ffn)) / world / 1e12;
  char dev[256] = {0};
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) std::snprintf(dev, sizeof dev, "%s", prop.name);
  std::printf("# bench_gpu_block: %d x %s, %s, bf16, %s, fwd + bwd, one CUDA Graph per step\n", world, dev,
              workload.c_str(), fsdp ? "FSDP" : "TP + SP");
  std::printf("| workload | ccgraph | ms/step | GEMM TFLOP/s per GPU | loss term, rank 0 |\n|---|---|---|---|---|\n");
  for (std::size_t k = 0; k < modes.size(); ++k)
    std::printf("| %s | %s | %.3f | %.0f | %.6g |\n", workload.c_str(), modes[k].name.c_str(), ms[k],
                tflop / (ms[k] / 1e3), loss[k]);
  for (std::size_t k = 0; k < modes.size(); ++k)
    std::printf("# %s: %llu collectives on the copy engines (rank 0: first call and recording)\n", modes[k].name.c_str(),
                static_cast<unsigned long long>(on_copy_engine[k]));
  for (std::size_t k = 0; k < modes.size(); ++k)
    std::printf("RESULT %s ccgraph_%s %.3f ms\n", workload.c_str(), modes[k].name.c_str(), ms[k]);
  if (timeline) bench::cupti::flush();
  return 0;
}
