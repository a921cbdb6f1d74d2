// Traced graphs on GPUs: eager, the graph runner (scheduled), and CUDA Graph replay give the
// CPU backend's results; the seeds' CUDA Graph case. Skipped without a GPU (two-rank cases
// without two).
#include <ccgraph/cuda.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "../../examples/programs.hpp"

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace cg = ccgraph;

namespace {

template <class T>
std::vector<double> values(const cg::tensor<T>& t) {
  std::vector<double> out;
  for (auto v : t.to_vector()) out.push_back(static_cast<double>(static_cast<float>(v)));
  return out;
}

/// ‖got − want‖ / ‖want‖.
double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

using ccgraph::examples::seed_program;

/// The seeds' CUDA Graph case (test_inductor_collectives' cudagraph test).
auto cudagraph_program(const cg::group& g) {
  return [g](auto x) {
    auto y = cg::eval(x * x);
    auto r = cg::all_reduce(y, "sum", g);
    auto s = cg::silu(x);
    return cg::eval(s * r);
  };
}

std::vector<int> world_ranks(int n) {
  std::vector<int> r(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) r[static_cast<std::size_t>(i)] = i;
  return r;
}

/// Runs the seed program on n ranks: eager on the threads backend (the reference, in float on
/// the host), then on GPUs eagerly, through the scheduled graph runner, and as a CUDA Graph
/// (three calls with different inputs each); all must agree within float tolerance.
void seed_program_all_modes(int n, std::int64_t size) {
  const cg::group world = world_ranks(n);
  std::vector<std::vector<std::vector<double>>> ref(static_cast<std::size_t>(n));
  auto input = [&](int rank, int call) {
    return cg::uniform<float>({size, size}, -1, 1, 100 * static_cast<std::uint64_t>(call) + static_cast<std::uint64_t>(rank));
  };
  cg::run_threads(n, [&](cg::rank_context& ctx) {
    for (int call = 0; call < 3; ++call)
      ref[static_cast<std::size_t>(ctx.rank())].push_back(values(seed_program(world)(input(ctx.rank(), call))));
  });
  cg::cuda::run_gpus(n, [&](cg::rank_context& ctx) {
    const auto& want = ref[static_cast<std::size_t>(ctx.rank())];
    auto g = cg::trace(seed_program(world), cg::input<float>({size, size}));
    auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
    auto graph_runner = cg::compile(s, ctx);
    auto replayed = cg::compile(s, ctx, {.cuda_graph = true});
    auto replayed_static = cg::compile(g, ctx, {.cuda_graph = true, .static_outputs = true});
    for (int call = 0; call < 3; ++call) {
      const auto x = input(ctx.rank(), call).cuda(ctx.rank());
      const auto& w = want[static_cast<std::size_t>(call)];
      INFO("rank " << ctx.rank() << " of " << n << ", call " << call);
      CHECK(rel_error(values(seed_program(world)(x)), w) < 1e-5);
      CHECK(rel_error(values(graph_runner(x)), w) < 1e-5);
      CHECK(rel_error(values(replayed(x)), w) < 1e-5);
      CHECK(rel_error(values(replayed_static(x)), w) < 1e-5);
      CHECK(replayed.exec().captured());
    }
  });
}

}  // namespace

TEST_CASE("gpu_graphs.seed_program.all_modes.1_gpu" * doctest::skip(ccgraph_test::gpu_count() < 1)) {
  seed_program_all_modes(1, 96);
}

TEST_CASE("gpu_graphs.seed_program.all_modes.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  seed_program_all_modes(2, 96);
  seed_program_all_modes(2, 257);  // odd sizes: unaligned rows for the GEMM and the kernels
}

TEST_CASE("gpu_graphs.seed_cudagraph_case.bf16" * doctest::skip(ccgraph_test::gpu_count() < 1)) {
  // bf16, n in {1024, 2048, 4096}, three calls each: `y = x*x; all_reduce(y); x = silu(x);
  // return x*y`, against the CPU backend in float over the same bf16 inputs.
  const int ranks = ccgraph_test::gpu_count() >= 2 ? 2 : 1;
  const cg::group world = world_ranks(ranks);
  for (std::int64_t n : {1024, 2048, 4096}) {
    std::vector<std::vector<std::vector<double>>> ref(static_cast<std::size_t>(ranks));
    auto input = [&](int rank, int call) {
      return cg::uniform<cg::bf16>({n}, -2, 2, 7 * static_cast<std::uint64_t>(call) + static_cast<std::uint64_t>(rank) + static_cast<std::uint64_t>(n));
    };
    cg::run_threads(ranks, [&](cg::rank_context& ctx) {
      for (int call = 0; call < 3; ++call)
        ref[static_cast<std::size_t>(ctx.rank())].push_back(
            values(cudagraph_program(world)(input(ctx.rank(), call))));
    });
    cg::cuda::run_gpus(ranks, [&](cg::rank_context& ctx) {
      auto g = cg::trace(cudagraph_program(world), cg::input<cg::bf16>({n}));
      auto exe = cg::compile(g, ctx, {.cuda_graph = true});
      for (int call = 0; call < 3; ++call) {
        INFO("n " << n << ", rank " << ctx.rank() << ", call " << call);
        const auto got = values(exe(input(ctx.rank(), call).cuda(ctx.rank())));
        CHECK(rel_error(got, ref[static_cast<std::size_t>(ctx.rank())][static_cast<std::size_t>(call)]) < 1e-2);
      }
    });
  }
}

TEST_CASE("gpu_graphs.static_inputs_are_bound_by_pointer" * doctest::skip(ccgraph_test::gpu_count() < 1)) {
  cg::cuda::run_gpus(1, [](cg::rank_context& ctx) {
    auto g = cg::trace([](auto a) { return cg::eval(cg::relu(a) * 2.f); }, cg::input<float>({1000}));
    auto exe = cg::compile(g, ctx, {.cuda_graph = true});
    (void)exe(cg::full<float>({1000}, -1.f));  // records
    auto in = cg::get_tensor<float>(exe.exec().static_inputs().at(0), "test");
    in.fill_(3.f);
    CHECK(exe(in).to_vector() == std::vector<float>(1000, 6.f));
    CHECK(exe(cg::full<float>({1000}, 5.f)).to_vector() == std::vector<float>(1000, 10.f));
    CHECK_THROWS_AS((void)cg::compile(g, ctx, {.cuda_graph = true})(cg::full<float>({999}, 1.f)), cg::error);
  });
}

TEST_CASE("gpu_graphs.cuda_graph_on_a_cpu_rank_is_an_error") {
  cg::run_threads(1, [](cg::rank_context& ctx) {
    auto g = cg::trace([](auto a) { return cg::eval(a + 1.f); }, cg::input<float>({4}));
    CHECK_THROWS_WITH_AS((void)cg::compile(g, ctx, {.cuda_graph = true}), doctest::Contains("cuda_graph"),
                         cg::error);
  });
}
