// tests/runtime/test_compiled_function.cpp: a function compiled per program
// (ccgraph/runtime/compiled_function.hpp), on the threads backend: a new shape, host argument
// or captured host value that changes the program gets its own graph, never an old one.
#include <doctest/doctest.h>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/runtime/compiled_function.hpp>

#include "../../examples/programs.hpp"
#include "support.hpp"

#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace cg = ccgraph;
using namespace ccgraph_test;

TEST_CASE("compiled_function.one_graph_per_signature") {
  run(2, [](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0, 1};
    for (auto guard : {cg::function_guard::trace, cg::function_guard::arguments}) {
      CAPTURE(static_cast<int>(guard));
      int traced = 0;  // how often the function body ran (only while tracing)
      auto step = [&](auto x) {
        ++traced;
        return cg::examples::seed_program(world)(x);
      };
      auto f = cg::compile_function<float>(
          step, ctx, {.passes = {"sink_waits", "raise_comms", "reorder_compute_for_overlap"}, .guard = guard});
      std::set<std::int64_t> seen;
      for (std::int64_t n : {4, 6, 4, 6, 4}) {
        INFO("n " << n);
        const auto x = cg::uniform<float>({n, n}, -1, 1, static_cast<std::uint64_t>(n + 10 * ctx.rank()));
        const auto want = cg::examples::seed_program(world)(x).to_vector();
        const int before = traced;
        const std::size_t compiled = f.compiles();
        const auto got = f(x).to_vector();
        REQUIRE(got.size() == want.size());
        for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
        const bool is_new = seen.insert(n).second;
        CHECK(f.compiles() - compiled == (is_new ? 1u : 0u));  // scheduled and compiled for new shapes only
        // Traced on every call, or (arguments) for new shapes only.
        CHECK(traced - before == (guard == cg::function_guard::trace || is_new ? 1 : 0));
      }
      CHECK(f.signatures() == 2);
      CHECK(f.compiles() == 2);
      CHECK(f.traces() == (guard == cg::function_guard::trace ? 5u : 2u));
      CHECK(traced == static_cast<int>(f.traces()));
      REQUIRE(f.compiled_for({{4, 4}}) != nullptr);
      CHECK(f.compiled_for({{5, 5}}) == nullptr);
    }
  });
}

TEST_CASE("compiled_function.changed_split_sizes_recompile") {
  // Issue 17: MoE routing changes all_to_all_single's split sizes every step while the shapes
  // stay. The split sizes are traced into the graph; a call with new ones must not run the old
  // routing's graph (it once did: the cache was keyed on input shapes alone).
  run(2, [](cg::rank_context& ctx) {
    const int me = ctx.rank();
    std::vector<std::int64_t> send{1, 3};  // rows this rank sends to rank 0 and rank 1
    auto routed = [&](auto x) {
      // Every rank sends `send`; so rank j receives send[j] rows from each.
      const std::vector<std::int64_t> recv(2, send[static_cast<std::size_t>(me)]);
      return cg::all_to_all_single(x, recv, send, ctx.world());
    };
    auto f = cg::compile_function<float>(routed, ctx);
    const cg::tensor<float> x(cg::arange<float>(4).reshape({4, 1}) + float(10 * me));
    for (auto s : {std::vector<std::int64_t>{1, 3}, {3, 1}, {2, 2}, {3, 1}, {1, 3}}) {
      CAPTURE(s[0]);
      send = s;
      const auto want = routed(x).to_vector();
      CHECK(f(x).to_vector() == want);
    }
    CHECK(f.compiles() == 3);  // one per routing; the shapes never changed

    // The same with the split sizes passed as host arguments: they key the cache without a
    // trace on a hit (function_guard::arguments).
    auto g = cg::compile_function<float, std::vector<std::int64_t>>(
        [&](auto y, const std::vector<std::int64_t>& s) {
          return cg::all_to_all_single(y, std::vector<std::int64_t>(2, s[static_cast<std::size_t>(me)]), s, ctx.world());
        },
        ctx, {.guard = cg::function_guard::arguments});
    for (auto s : {std::vector<std::int64_t>{1, 3}, {3, 1}, {1, 3}, {3, 1}}) {
      send = s;
      CHECK(g(x, s).to_vector() == routed(x).to_vector());
    }
    CHECK(g.compiles() == 2);
    CHECK(g.traces() == 2);
  });
}

TEST_CASE("compiled_function.host_arguments") {
  run(2, [](cg::rank_context& ctx) {
    // Host values among the tensors, in the function's own order; numbers through host_arg.
    auto f = cg::compile_function<float, cg::host_arg<double>, float, std::optional<std::vector<std::int64_t>>>(
        [&](auto a, double k, auto b, const std::optional<std::vector<std::int64_t>>& splits) {
          auto moved = cg::all_to_all_single(a, splits, splits, ctx.world());
          return cg::eval(moved * static_cast<float>(k) + b);
        },
        ctx);
    static_assert(std::is_same_v<decltype(f)::result_type, cg::tensor<float>>);
    const auto a = cg::full<float>({4, 2}, float(ctx.rank() + 1)), b = cg::ones<float>({4, 2});
    const std::optional<std::vector<std::int64_t>> even, halves = std::vector<std::int64_t>{2, 2};
    for (double k : {1.0, 2.0, 1.0, 0.5}) {
      CAPTURE(k);
      const auto want = cg::tensor<float>(cg::all_to_all_single(a, even, even, ctx.world()) * static_cast<float>(k) + b);
      CHECK(f(a, k, b, even).to_vector() == want.to_vector());
      CHECK(f(a, k, b, halves).to_vector() == want.to_vector());  // the same program: one graph
    }
    CHECK(f.compiles() == 3);  // k = 1, 2, 0.5: the scalar is in the graph
    // A NaN scalar matches itself (bitwise), -0.0 is not 0.0.
    auto g = cg::compile_function<float, cg::host_arg<float>>([](auto x, float k) { return cg::eval(x * k); }, ctx,
                                                              {.guard = cg::function_guard::arguments});
    const auto x = cg::ones<float>({2});
    for (int i = 0; i < 3; ++i) CHECK(std::isnan(g(x, std::nanf("")).to_vector()[0]));
    CHECK(g.compiles() == 1);
    CHECK(std::signbit(g(x, -0.f).to_vector()[0]));
    CHECK_FALSE(std::signbit(g(x, 0.f).to_vector()[0]));
    CHECK(g.compiles() == 3);
  });
}

TEST_CASE("compiled_function.tuple_results_and_two_inputs") {
  run(1, [](cg::rank_context& ctx) {
    auto f = cg::compile_function<float, float>(
        [](auto a, auto b) { return std::make_tuple(cg::matmul(a, b), cg::eval(a * 2.f)); }, ctx);
    const auto a = cg::uniform<float>({3, 4}, -1, 1, 1), b = cg::uniform<float>({4, 2}, -1, 1, 2);
    static_assert(std::is_same_v<decltype(f(a, b)), std::tuple<cg::tensor<float>, cg::tensor<float>>>);
    auto [m, d] = f(a, b);
    CHECK(m.to_vector() == cg::matmul(a, b).to_vector());
    CHECK(d.to_vector() == cg::tensor<float>(a * 2.f).to_vector());
    // Another shape of one input is another signature.
    const auto b5 = cg::uniform<float>({4, 5}, -1, 1, 3);
    CHECK(std::get<0>(f(a, b5)).shape() == cg::shape_t{3, 5});
    CHECK(f.signatures() == 2);
  });
}

TEST_CASE("compiled_function.errors_keep_nothing_and_the_oldest_signature_goes") {
  run(1, [](cg::rank_context& ctx) {
    // An unknown pass: the first call throws naming it; nothing is kept, the next call retries.
    auto bad = cg::compile_function<float>([](auto x) { return cg::eval(x + 1.f); }, ctx, {.passes = {"no_such_pass"}});
    const auto x = cg::ones<float>({3});
    CHECK_THROWS_WITH_AS((void)bad(x), doctest::Contains("no_such_pass"), cg::error);
    CHECK(bad.signatures() == 0);
    CHECK_THROWS_AS((void)bad(x), cg::error);

    // A shape the function rejects while tracing: the function's own error.
    auto needs_square = cg::compile_function<float>([](auto m) { return cg::matmul(m, m); }, ctx);
    CHECK_THROWS_WITH_AS((void)needs_square(cg::ones<float>({2, 3})), doctest::Contains("matmul"), cg::error);
    CHECK(needs_square(cg::ones<float>({2, 2})).to_vector() == std::vector<float>(4, 2.f));

    CHECK_THROWS_WITH_AS((void)cg::compile_function<float>([](auto v) { return v; }, ctx, {.max_signatures = 0}),
                         doctest::Contains("max_signatures"), cg::error);

    auto small = cg::compile_function<float>([](auto v) { return cg::eval(v * 3.f); }, ctx, {.max_signatures = 2});
    for (std::int64_t n : {1, 2, 3}) CHECK(small(cg::ones<float>({n})).to_vector() == std::vector<float>(static_cast<std::size_t>(n), 3.f));
    CHECK(small.signatures() == 2);
    CHECK(small.compiled_for({{1}}) == nullptr);  // the oldest went
    CHECK(small(cg::ones<float>({1})).to_vector() == std::vector<float>{3.f});
    CHECK(small.compiles() == 4);
    CHECK(small.traces() == 4);
  });
}
