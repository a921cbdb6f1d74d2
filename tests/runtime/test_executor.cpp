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

using hint = cg::detail::overlap_hint;

/// The collectives of `g` in order, each with what runs beside it.
std::vector<hint> overlaps(const cg::graph& g) {
  const auto all = cg::detail::collective_overlaps(g);
  std::vector<hint> out;
  for (std::size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i]->is_collective()) out.push_back(all[i]);
  return out;
}

}  // namespace

TEST_CASE("executor.collective_overlaps.follow_the_schedule") {
  const cg::group world = std::vector<int>{0, 1};
  // The seeds' reorder program: traced, each collective is followed by its wait, so nothing
  // runs beside it; scheduled, matmuls move between the collectives and their waits.
  auto g = cg::trace(cg::examples::seed_program(world), cg::input<float>({8, 8}));
  CHECK(overlaps(g) == std::vector<hint>{hint::none, hint::none});
  const auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
  const auto h = overlaps(s);
  REQUIRE(h.size() == 2);
  CHECK(h[0] == hint::matmul);  // the first all_reduce's wait sinks below the matmuls that do not need it
  // Only pointwise compute between a collective and its wait is no matmul to overlap.
  auto pointwise_only = cg::trace(
      [&](auto a) {
        auto ar = cg::all_reduce(a, "sum", world);
        auto b = cg::eval(cg::relu(a) + 1.f);
        return cg::eval(cg::wait_tensor(ar) + b);
      },
      cg::input<float>({8, 8}));
  CHECK(overlaps(cg::schedule(pointwise_only, {"sink_waits"})) == std::vector<hint>{hint::compute});
  // Collectives issued back to back before their waits overlap nothing but each other.
  auto two = cg::trace(
      [&](auto a) {
        auto x = cg::all_reduce(a, "sum", world);
        auto y = cg::all_reduce(a, "max", world);
        return cg::eval(cg::wait_tensor(x) + cg::wait_tensor(y));
      },
      cg::input<float>({8, 8}));
  CHECK(overlaps(cg::schedule(two, {"sink_waits", "raise_comms"})) == std::vector<hint>{hint::none, hint::none});
  // A chain of collectives, each waited at once.
  CHECK(overlaps(cg::trace(cg::examples::all_reduce_chain(world, 3), cg::input<float>({4}))) ==
        std::vector<hint>(3, hint::none));
  // A collective never waited (its result returned pending, as compile_options::
  // pending_outputs compiles it) overlaps whatever follows it.
  cg::graph unwaited = cg::trace(
      [&](auto a) {
        auto x = cg::all_reduce(a, "sum", world);
        return std::tuple{x, cg::eval(cg::relu(a))};
      },
      cg::input<float>({8, 8}));
  CHECK(overlaps(unwaited) == std::vector<hint>{hint::none});  // traced: waited at once
  cg::detail::return_pending(unwaited);
  CHECK(overlaps(unwaited) == std::vector<hint>{hint::compute});
}

TEST_CASE("executor.overlap_hint_reaches_the_backend_without_changing_results") {
  // On the threads backend the hint changes nothing: a scheduled run equals eager.
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
    REQUIRE(overlaps(s) == std::vector<hint>{hint::matmul});
    auto run = cg::compile(s, ctx);
    CHECK(run(a).to_vector() == eager);
  });
}
