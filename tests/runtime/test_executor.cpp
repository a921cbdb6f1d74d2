// tests/runtime/test_executor.cpp: what the graph runner (ccgraph/runtime/executor.hpp) tells a
// backend about each collective it launches.
#include <doctest/doctest.h>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "../../examples/programs.hpp"
#include "support.hpp"

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

TEST_CASE("executor.graph_of_another_world_or_rank_is_refused_at_compile") {
  // issue 21 item 1: a graph traced for 8 ranks run on 2 read the backend's peer table out of
  // bounds; one traced as rank 0 over MPMD {{0, 1}, {2, 3}} run by ranks 2 and 3 wrote before
  // a slot. Both are errors at compile, naming the node, the group, the world and the rank.
  const std::vector<int> eight{0, 1, 2, 3, 4, 5, 6, 7};
  auto g8 = cg::trace(cg::trace_options{.world_size = 8},
                      [&](auto a) { return cg::wait_tensor(cg::all_reduce(a, "sum", cg::group{eight})); },
                      cg::input<float>({4}));
  std::string node;
  for (const auto& n : g8.nodes())
    if (n->is_collective()) node = n->name();
  std::vector<std::string> msgs(2);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    try {
      (void)cg::compile(g8, ctx);
    } catch (const cg::error& e) {
      msgs[static_cast<std::size_t>(ctx.rank())] = e.what();
    }
    // The world is untouched: nothing was issued.
    CHECK(cg::all_reduce(cg::ones<float>({1}), "sum", ctx.world()).item() == 2.f);
  });
  for (int r = 0; r < 2; ++r)
    CHECK(msgs[static_cast<std::size_t>(r)] == "compile: %" + node +
                                                   " = all_reduce: group [0, 1, 2, 3, 4, 5, 6, 7] does not fit a "
                                                   "world of 2 ranks (rank " + std::to_string(r) + ")");

  const cg::group halves = std::vector<std::vector<int>>{{0, 1}, {2, 3}};
  auto as_rank0 = cg::trace(cg::trace_options{.rank = 0, .world_size = 4},
                            [&](auto a) { return cg::wait_tensor(cg::all_reduce(a, "sum", halves)); },
                            cg::input<float>({4}));
  std::vector<std::string> mpmd(4);
  cg::run_threads(4, [&](cg::rank_context& ctx) {
    const auto r = static_cast<std::size_t>(ctx.rank());
    if (ctx.rank() < 2) {  // the ranks it was traced for run it
      auto run = cg::compile(as_rank0, ctx);
      CHECK(run(cg::ones<float>({4})).to_vector() == std::vector<float>(4, 2.f));
      return;
    }
    try {
      (void)cg::compile(as_rank0, ctx);
    } catch (const cg::error& e) {
      mpmd[r] = e.what();
    }
  });
  CHECK_MESSAGE(ccgraph_test::contains(mpmd[2], " = all_reduce: rank 2 is not a member of group [0, 1] (world of 4 ranks)"), mpmd[2]);
  CHECK_MESSAGE(ccgraph_test::contains(mpmd[3], " = all_reduce: rank 3 is not a member of group [0, 1] (world of 4 ranks)"), mpmd[3]);

  // A mesh dimension traced on 8 ranks, run on 4: rank 0's group fits, its partition does not.
  const cg::group quarters = std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}};
  auto split8 = cg::trace(cg::trace_options{.rank = 0, .world_size = 8},
                          [&](auto a) { return cg::wait_tensor(cg::all_reduce(a, "sum", quarters)); },
                          cg::input<float>({4}));
  std::string part;
  cg::run_threads(4, [&](cg::rank_context& ctx) {
    if (ctx.rank() != 0) return;
    try {
      (void)cg::compile(split8, ctx);
    } catch (const cg::error& e) {
      part = e.what();
    }
  });
  CHECK_MESSAGE(ccgraph_test::contains(part, " = all_reduce: the partition [[0, 1, 2, 3], [4, 5, 6, 7]] of group "
                                             "[0, 1, 2, 3] does not split a world of 4 ranks (rank 0)"),
                part);
}
