// tests/schedule/test_verify.cpp: verify_collective_order of ccgraph/runtime/verify.hpp: every
// rank checks every rank's sequence of collectives through the backend; consistent programs
// (MPMD subgroups and per-rank all_to_all splits included) pass, and a rank that traced a
// different program (another shape, an extra collective) makes every rank fail promptly with
// the same message naming the first difference.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/bucketing.hpp>
#include <ccgraph/schedule/decompose.hpp>
#include <ccgraph/runtime/verify.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

/// Runs `trace_on(ctx)` (the graph rank ctx.rank() would run) and verify_collective_order on
/// each of `world` ranks; returns each rank's collective_mismatch_error message, or nullopt
/// where it passed.
template <class F>
std::vector<std::optional<std::string>> verify_on(int world, F trace_on) {
  std::vector<std::optional<std::string>> out(static_cast<std::size_t>(world));
  cg::run_threads(world, [&](cg::rank_context& ctx) {
    const cg::graph g = trace_on(ctx);
    try {
      cg::verify_collective_order(g, ctx);
    } catch (const cg::collective_mismatch_error& e) {
      out[static_cast<std::size_t>(ctx.rank())] = e.what();
    }
  }, threads_opts(std::chrono::seconds(20)));
  return out;
}

bool all_pass(const std::vector<std::optional<std::string>>& v) {
  for (auto& m : v)
    if (m) return false;
  return true;
}

/// The one message every rank got (empty if some rank passed or ranks disagree).
std::string common_failure(const std::vector<std::optional<std::string>>& v) {
  for (auto& m : v)
    if (!m || *m != *v.front()) return {};
  return *v.front();
}

/// A program with every kind of collective on the world.
auto mixed_program(const cg::group& g) {
  return [g](auto a, auto b) {
    auto r = cg::all_reduce(a, "sum", g);
    auto s = cg::reduce_scatter_tensor(cg::matmul(r, b), "avg", 0, g);
    auto t = cg::all_gather_tensor(s, 0, g);
    auto u = cg::broadcast(t, 0, g);
    auto v = cg::all_reduce_coalesced(std::vector<decltype(a)>{u, b}, "max", g);
    return std::make_tuple(v[0], v[1]);
  };
}

}  // namespace

TEST_CASE("verify.consistent.passes") {
  for (int world : {2, 4}) {
    const auto res = verify_on(world, [](cg::rank_context& ctx) -> cg::graph {
      return cg::trace(mixed_program(ctx.world()), cg::input<float>({8, 8}), cg::input<float>({8, 8}));
    });
    CHECK(all_pass(res));
  }
  // A graph without collectives, on every rank.
  CHECK(all_pass(verify_on(2, [](cg::rank_context&) -> cg::graph {
    return cg::trace([](auto a) { return a * 2.f; }, cg::input<float>({2}));
  })));
}

TEST_CASE("verify.consistent.after_passes") {
  const auto res = verify_on(4, [](cg::rank_context& ctx) -> cg::graph {
    cg::graph g = cg::trace([&](auto x, auto w1, auto w2) {
      auto y = cg::matmul(cg::gelu(cg::matmul(x, w1)), w2);
      return cg::wait_tensor(cg::all_reduce(y, "sum", ctx.world()));
    }, cg::input<float>({16, 8}), cg::input<float>({8, 8}), cg::input<float>({8, 8}));
    cg::decompose_matmul_collectives(g, 3);
    cg::bucket_collectives(g, 1 << 20);
    return g;
  });
  CHECK(all_pass(res));
}

TEST_CASE("verify.mpmd_and_per_rank_splits.pass") {
  const auto res = verify_on(4, [](cg::rank_context& ctx) -> cg::graph {
    const int r = ctx.rank();
    return cg::trace([&](auto a) {
      // Each pair reduces among itself: the groups differ per rank, legitimately.
      auto p = cg::all_reduce(a, "sum", cg::group{std::vector<std::vector<int>>{{0, 1}, {2, 3}}});
      // Only ranks 0 and 1 talk once more; 2 and 3 do not.
      auto q = r < 2 ? cg::all_reduce(p, "sum", cg::group{std::vector<int>{0, 1}}) : p;
      // all_to_all with split sizes (and input rows) that differ per rank.
      const std::int64_t rows = 4 + r;
      std::vector<std::int64_t> in_splits{1, 1, 1, 1 + r}, out_splits{r, 1, 2, 1};
      auto t = cg::all_to_all_single(q.reshape({16}).narrow(0, 0, rows), out_splits, in_splits, ctx.world());
      auto u = cg::permute_tensor(t, {1, 2, 3, 0}, ctx.world());
      return u;
    }, cg::input<float>({4, 4}));
  });
  CHECK(all_pass(res));
}

TEST_CASE("verify.different_shape.fails_on_every_rank") {
  for (int world : {2, 4}) {
    const auto res = verify_on(world, [](cg::rank_context& ctx) -> cg::graph {
      const std::int64_t rows = ctx.rank() == 1 ? 8 : 4;
      return cg::trace(mixed_program(ctx.world()), cg::input<float>({rows, 8}), cg::input<float>({8, 8}));
    });
    const std::string msg = common_failure(res);
    INFO(msg);
    REQUIRE(!msg.empty());
    CHECK(contains(msg, "verify_collective_order: ranks 0 and 1 differ at their collective #0 with each other"));
    CHECK(contains(msg, "rank 0 issues all_reduce(f32[4, 8], op=sum"));
    CHECK(contains(msg, "rank 1 issues all_reduce(f32[8, 8], op=sum"));
  }
}

TEST_CASE("verify.extra_collective.fails_naming_it") {
  const auto res = verify_on(2, [](cg::rank_context& ctx) -> cg::graph {
    const bool extra = ctx.rank() == 1;
    return cg::trace([&](auto a) {
      auto r = cg::all_reduce(a, "sum", ctx.world());
      auto x = extra ? cg::all_reduce(r * 2.f, "max", ctx.world()) : r;
      return cg::all_gather_tensor(x, 0, ctx.world());
    }, cg::input<float>({2, 2}));
  });
  const std::string msg = common_failure(res);
  INFO(msg);
  REQUIRE(!msg.empty());
  CHECK(contains(msg, "ranks 0 and 1 differ at their collective #1 with each other"));
  CHECK(contains(msg, "rank 0 issues all_gather_into_tensor(f32[2, 2], group_size=2, group=[0, 1]) (its collective #1)"));
  CHECK(contains(msg, "rank 1 issues all_reduce(f32[2, 2], op=max, group=[0, 1]) (its collective #1)"));

  // An extra collective at the end: the other rank has none left.
  const auto tail = verify_on(2, [](cg::rank_context& ctx) -> cg::graph {
    const bool extra = ctx.rank() == 0;
    return cg::trace([&](auto a) {
      auto r = cg::all_reduce(a, "sum", ctx.world());
      return extra ? cg::all_reduce(r, "sum", ctx.world()) : r;
    }, cg::input<float>({2}));
  });
  const std::string m2 = common_failure(tail);
  INFO(m2);
  REQUIRE(!m2.empty());
  CHECK(contains(m2, "ranks 0 and 1 differ at their collective #1 with each other"));
  CHECK(contains(m2, "rank 0 issues all_reduce(f32[2], op=sum, group=[0, 1]) (its collective #1)"));
  CHECK(contains(m2, "rank 1 issues no more collectives with rank 0 (it has 1)"));
}

TEST_CASE("verify.subgroup_difference.names_the_pair") {
  // Ranks 2 and 3 disagree inside their own pair; ranks 0 and 1 are consistent, yet every rank
  // reports the same difference.
  const auto res = verify_on(4, [](cg::rank_context& ctx) -> cg::graph {
    const cg::group pairs{std::vector<std::vector<int>>{{0, 1}, {2, 3}}};
    const auto op = ctx.rank() == 3 ? cg::reduce_op::max : cg::reduce_op::sum;
    return cg::trace([&](auto a) {
      auto r = cg::all_reduce(a, "sum", ctx.world());
      return cg::all_reduce(r, op, pairs);
    }, cg::input<float>({3}));
  });
  const std::string msg = common_failure(res);
  INFO(msg);
  REQUIRE(!msg.empty());
  CHECK(contains(msg, "ranks 2 and 3 differ at their collective #1 with each other"));
  CHECK(contains(msg, "op=sum, group=[2, 3]"));
  CHECK(contains(msg, "op=max, group=[2, 3]"));
}
