// tests/runtime/test_executor.cpp: what the graph runner (ccgraph/runtime/executor.hpp) tells a
// backend about each collective it launches.
#include <doctest/doctest.h>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "../../examples/programs.hpp"

#include <string>
#include <vector>

namespace cg = ccgraph;

namespace {

/// The collectives of `g` in order, each with its overlapped flag.
std::vector<bool> overlap_flags(const cg::graph& g) {
  const auto flags = cg::detail::overlapped_collectives(g);
  std::vector<bool> out;
  for (std::size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i]->is_collective()) out.push_back(flags[i]);
  return out;
}

}  // namespace

TEST_CASE("executor.overlapped_collectives.follow_the_schedule") {
  const cg::group world = std::vector<int>{0, 1};
  // The seeds' reorder program: traced, each collective is followed by its wait, so nothing
  // runs beside it; scheduled, matmuls move between the collectives and their waits.
  auto g = cg::trace(cg::examples::seed_program(world), cg::input<float>({8, 8}));
  CHECK(overlap_flags(g) == std::vector<bool>{false, false});
  const auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
  const auto flags = overlap_flags(s);
  REQUIRE(flags.size() == 2);
  CHECK(flags[0]);  // the first all_reduce's wait sinks below the matmuls that do not need it
  // Only pointwise compute between a collective and its wait is no matmul to overlap.
  auto pointwise_only = cg::trace(
      [&](auto a) {
        auto ar = cg::all_reduce(a, "sum", world);
        auto b = cg::eval(cg::relu(a) + 1.f);
        return cg::eval(cg::wait_tensor(ar) + b);
      },
      cg::input<float>({8, 8}));
  CHECK(overlap_flags(cg::schedule(pointwise_only, {"sink_waits"})) == std::vector<bool>{false});
}

TEST_CASE("executor.overlapped_flag_reaches_the_backend_without_changing_results") {
  // On the threads backend the flag changes nothing: a scheduled run equals eager.
  cg::run_threads(2, [](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0, 1};
    auto program = [&](auto a) {
      auto ar = cg::all_reduce(a, "sum", world);
      auto m = cg::matmul(a, a);
      return cg::eval(cg::wait_tensor(ar) + m);
    };
    const auto a = cg::full<float>({4, 4}, static_cast<float>(ctx.rank() + 1));
    const auto eager = program(a).to_vector();
    auto s = cg::schedule(cg::trace(program, cg::input<float>({4, 4})), {"sink_waits", "raise_comms"});
    REQUIRE(overlap_flags(s) == std::vector<bool>{true});
    auto run = cg::compile(s, ctx);
    CHECK(run(a).to_vector() == eager);
  });
}
