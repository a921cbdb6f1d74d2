// tests/runtime/test_compiled_function.cpp: a function compiled per input signature
// (ccgraph/runtime/compiled_function.hpp), on the threads backend.
#include <doctest/doctest.h>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/runtime/compiled_function.hpp>

#include "../../examples/programs.hpp"
#include "support.hpp"

#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace cg = ccgraph;
using namespace ccgraph_test;

TEST_CASE("compiled_function.one_graph_per_signature") {
  run(2, [](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0, 1};
    int traced = 0;  // how often the function body ran (only while tracing)
    auto step = [&](auto x) {
      ++traced;
      return cg::examples::seed_program(world)(x);
    };
    auto f = cg::compile_function<float>(step, ctx, {.passes = {"sink_waits", "raise_comms", "reorder_compute_for_overlap"}});
    std::set<std::int64_t> seen;
    for (std::int64_t n : {4, 6, 4, 6, 4}) {
      INFO("n " << n);
      const auto x = cg::uniform<float>({n, n}, -1, 1, static_cast<std::uint64_t>(n + 10 * ctx.rank()));
      const auto want = cg::examples::seed_program(world)(x).to_vector();
      const int before = traced;
      const auto got = f(x).to_vector();
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
      CHECK(traced - before == (seen.insert(n).second ? 1 : 0));  // traced for new shapes only
    }
    CHECK(f.signatures() == 2);
    CHECK(f.traces() == 2);
    CHECK(traced == 2);
    REQUIRE(f.compiled_for({{4, 4}}) != nullptr);
    CHECK(f.compiled_for({{5, 5}}) == nullptr);
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
    CHECK(small.traces() == 4);
  });
}
