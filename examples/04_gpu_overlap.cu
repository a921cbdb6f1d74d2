// Example 04: the seeds' overlap program on every GPU of this machine, eagerly and as a
// scheduled, replayed CUDA Graph. Prints the time per call of each and checks that both give
// the same result (and that it matches the CPU backend on a small size).
//
//   ar = all_reduce(a); g = a @ a; c = relu(a); d = c @ c; f = d * c * ar
//   fr = all_reduce(f); e = (d + ar + fr) @ g
#include <ccgraph/cuda.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "programs.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = ccgraph;

using ccgraph::examples::seed_program;

/// Median milliseconds per call of f() on the rank's stream.
template <class F>
double ms_per_call(F&& f, int iters) {
  for (int i = 0; i < 3; ++i) (void)f();
  cudaStream_t s = cg::cuda::current_stream();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    auto a = cg::cuda::event::timed(), b = cg::cuda::event::timed();
    a.record(s);
    (void)f();
    b.record(s);
    b.synchronize();
    ms.push_back(cg::cuda::elapsed_ms(a, b));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

int main(int argc, char** argv) {
  const int n = cg::cuda::device_count();
  if (n < 1) {
    std::printf("example 04: no CUDA device, nothing to show\n");
    return EXIT_SUCCESS;
  }
  const std::int64_t size = argc > 1 ? std::atoll(argv[1]) : 4096;
  std::vector<int> ranks;
  for (int i = 0; i < n; ++i) ranks.push_back(i);
  const cg::group world = ranks;
  std::atomic<int> failures{0};

  // 1. Correctness at a small size: eager GPU, the CUDA Graph and the CPU backend agree.
  {
    std::vector<std::vector<float>> cpu(static_cast<std::size_t>(n));
    auto input = [](int r) { return cg::uniform<float>({128, 128}, -1, 1, 40 + static_cast<std::uint64_t>(r)); };
    cg::run_threads(n, [&](cg::rank_context& ctx) {
      cpu[static_cast<std::size_t>(ctx.rank())] = seed_program(world)(input(ctx.rank())).to_vector();
    });
    std::vector<double> err(static_cast<std::size_t>(n));
    cg::cuda::run_gpus(n, [&](cg::rank_context& ctx) {
      auto g = cg::schedule(cg::trace(seed_program(world), cg::input<float>({128, 128})),
                            {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
      auto exe = cg::compile(g, ctx, {.cuda_graph = true});
      const auto x = input(ctx.rank()).cuda(ctx.rank());
      (void)exe(x);  // records
      const auto& want = cpu[static_cast<std::size_t>(ctx.rank())];
      err[static_cast<std::size_t>(ctx.rank())] =
          std::max(rel_error(exe(x).to_vector(), want), rel_error(seed_program(world)(x).to_vector(), want));
    });
    for (int r = 0; r < n; ++r) {
      std::printf("rank %d: eager GPU and CUDA Graph vs the CPU backend at 128x128 f32: rel. error %.2e\n", r,
                  err[static_cast<std::size_t>(r)]);
      if (!(err[static_cast<std::size_t>(r)] < 1e-5)) ++failures;
    }
  }

  // 2. Time per call at size x size bf16.
  cg::cuda::run_gpus(n, [&](cg::rank_context& ctx) {
    const auto a = cg::uniform<cg::bf16>({size, size}, -1, 1, 7 + static_cast<std::uint64_t>(ctx.rank()));
    cg::schedule_options opt;
    opt.model = cg::cost_model(cg::device_spec::h200());
    auto g = cg::trace(seed_program(world), cg::input<cg::bf16>({size, size}));
    auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"}, opt);
    auto exe = cg::compile(s, ctx, {.cuda_graph = true});
    const double eager = ms_per_call([&] { return seed_program(world)(a); }, 10);
    const double graph = ms_per_call([&] { return exe(a); }, 10);
    const double err = rel_error(exe(a).to<float>().to_vector(), seed_program(world)(a).to<float>().to_vector());
    if (ctx.rank() == 0) {
      std::printf("\n%d GPU(s), N = %lld bf16, median ms per call:\n", n, static_cast<long long>(size));
      std::printf("  eager                              %8.3f\n", eager);
      std::printf("  scheduled graph, CUDA Graph replay %8.3f\n", graph);
    }
    std::printf("rank %d: CUDA Graph vs eager, rel. error %.2e\n", ctx.rank(), err);
    if (!(err < 1e-2)) ++failures;
  });
  std::printf(failures == 0 ? "example 04: ok\n" : "example 04: FAILED\n");
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
