// bench_gpu_timeline: the kernel timeline of PERF.md's GPU programs in each execution mode,
// from CUPTI's activity records (kernel, copy and set start/end stamps taken by the GPU), so
// that a difference between two modes' times can be read kernel by kernel: which kernel got
// slower, which ran beside which, where the GPU sat idle. nsys is not on the lent machines;
// CUPTI ships with the toolkit.
//
// For GPU 0 (the other GPUs run the same program as their ranks), per program and mode: one
// summary row per recorded step (span from the first kernel's start to the last one's end,
// time with nothing running, summed kernel time per category) and the kernels of the last
// step. Those steps are synchronised before and after, so each step's records are its own (and
// the host's issue time after a synchronisation shows as idle time); a last row runs the steps
// back to back, as the benchmarks do, and divides by their number.
//
//   bench_gpu_timeline [N ...]    (seed program sizes; default 8192)
// This program calls no op with a CUDA kernel of its own (cuda_impl): skip compiling them all
// (the in-tree build passes the macro already: bench/CMakeLists.txt).
#ifndef CCGRAPH_CUDA_NO_OP_KERNELS
#define CCGRAPH_CUDA_NO_OP_KERNELS
#endif
#include <ccgraph/cuda.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "bench_args.hpp"
#include "cupti_timeline.hpp"

#include "../examples/programs.hpp"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace cg = ccgraph;

namespace {

using bench::cupti::trace_steps;
using ccgraph::examples::seed_program;
using ccgraph::examples::tp_mlp;

void programs(int n, const std::vector<std::int64_t>& sizes) {
  std::vector<int> all(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
  const cg::group world = all;
  cg::cuda::run_gpus(n, [&](cg::rank_context& ctx) {
    const int r = ctx.rank();
    cg::schedule_options opt;
    opt.model = cg::cost_model(cg::device_spec::h200());
    const std::vector<std::string> passes = {"sink_waits", "raise_comms", "reorder_compute_for_overlap"};
    for (std::int64_t size : sizes) {
      std::vector<cg::tensor<cg::bf16>> in{
          cg::uniform<cg::bf16>({size, size}, -1, 1, 10 + static_cast<std::uint64_t>(r)),
          cg::uniform<cg::bf16>({size, size}, -1, 1, 20 + static_cast<std::uint64_t>(r))};
      auto pick = [&](int i) -> const cg::tensor<cg::bf16>& { return in[static_cast<std::size_t>(i % 2)]; };
      const std::string w = "seed program N = " + std::to_string(size);
      trace_steps(ctx, w + ", eager", 3, true, [&](int i) { (void)seed_program(world)(pick(i)); });
      auto g = cg::trace(seed_program(world), cg::input<cg::bf16>({size, size}));
      auto s = cg::schedule(g, passes, opt);
      {
        auto plain = cg::compile(g, ctx);
        trace_steps(ctx, w + ", graph runner, unscheduled", 3, false, [&](int i) { (void)plain(pick(i)); });
      }
      {
        auto runner = cg::compile(s, ctx);
        trace_steps(ctx, w + ", graph runner, scheduled", 3, true, [&](int i) { (void)runner(pick(i)); });
      }
      {
        auto replayed = cg::compile(s, ctx, {.cuda_graph = true, .static_outputs = true});
        trace_steps(ctx, w + ", CUDA Graph, scheduled", 3, true, [&](int i) { (void)replayed(pick(i)); });
      }
      {
        auto replayed = cg::compile(g, ctx, {.cuda_graph = true, .static_outputs = true});
        trace_steps(ctx, w + ", CUDA Graph, unscheduled", 3, false, [&](int i) { (void)replayed(pick(i)); });
      }
    }
    {
      const std::int64_t T = 8192, H = 8192, F = 4 * H / n;
      auto x = cg::uniform<cg::bf16>({T, H}, -1, 1, 30 + static_cast<std::uint64_t>(r));
      auto w1 = cg::uniform<cg::bf16>({H, F}, -0.02, 0.02, 40 + static_cast<std::uint64_t>(r));
      auto w2 = cg::uniform<cg::bf16>({F, H}, -0.02, 0.02, 50 + static_cast<std::uint64_t>(r));
      const std::string w = "TP MLP T = H = 8192, F = " + std::to_string(F);
      trace_steps(ctx, w + ", eager", 3, true, [&](int) { (void)tp_mlp(world)(x, w1, w2); });
      auto g = cg::trace(tp_mlp(world), cg::input<cg::bf16>({T, H}), cg::input<cg::bf16>({H, F}),
                         cg::input<cg::bf16>({F, H}));
      auto replayed = cg::compile(g, ctx, {.cuda_graph = true, .static_outputs = true});
      trace_steps(ctx, w + ", CUDA Graph", 3, true, [&](int) { (void)replayed(x, w1, w2); });
      opt.decompose_chunks = 4;
      auto d = cg::compile(cg::schedule(g, {"decompose_matmul_collectives", "overlap"}, opt), ctx,
                           {.cuda_graph = true, .static_outputs = true});
      trace_steps(ctx, w + ", CUDA Graph, decomposed into 4", 3, true, [&](int) { (void)d(x, w1, w2); });
    }
    {
      auto x = cg::uniform<float>({1024}, -1, 1, 2);
      auto chain = cg::trace(ccgraph::examples::all_reduce_chain(world, 64), cg::input<float>({1024}));
      auto exe = cg::compile(chain, ctx, {.cuda_graph = true, .static_outputs = true});
      (void)exe(x);
      auto bound = cg::get_tensor<float>(exe.exec().static_inputs().at(0), "bench_gpu_timeline");
      trace_steps(ctx, "64 all_reduces of 4 KiB f32 in one CUDA Graph", 3, true, [&](int) { (void)exe(bound); });
      trace_steps(ctx, "64 eager all_reduces of 4 KiB f32, each waited", 3, false, [&](int) {
        for (int i = 0; i < 64; ++i) cg::all_reduce(x, "sum", world).wait();
      });
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  const bench::args args(argc, argv, "[N ...]  (seed program sizes; default 8192)", {}, {}, 16);
  const int n = cg::cuda::device_count();
  if (n < 1) {
    std::printf("bench_gpu_timeline: no CUDA device; nothing to record\n");
    return 0;
  }
  std::vector<std::int64_t> sizes;
  for (std::size_t i = 0; i < args.positional().size(); ++i) sizes.push_back(args.integer(i, 0));
  if (sizes.empty()) sizes = {8192};
  cudaDeviceProp prop{};
  CCGRAPH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("# bench_gpu_timeline on %d x %s, NCCL %d.%d.%d; CUPTI activity records of GPU 0\n", n, prop.name,
              NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  try {
    bench::cupti::start();
    programs(n, sizes);
    bench::cupti::flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_timeline: %s\n", e.what());
    return 1;
  }
  return 0;
}
