// tests/ops/test_loss_ops.cpp: cross_entropy and its backward kernel as graph ops
// (ccgraph/ops/loss_ops.hpp): eager equals the CPU kernels for every reduction, weight,
// ignore_index and label smoothing; traced nodes carry their attributes; the executor runs them
// after a collective bitwise like eager; errors are the kernels' eager and traced; cost. The
// kernels' arithmetic is tested in test_loss.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "ops/reduction_support.hpp"
#include "support.hpp"

namespace loss_ops_tests {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using ccgraph_test::contains;
using ccgraph_test::red::check_same_results;
using ccgraph_test::error_of;
using i64 = std::int64_t;

TEST_CASE("loss_ops.eager_equals_the_kernels") {
  const auto x = cg::uniform<float>({6, 5, 2}, -3, 3, 9);  // [N, C, d]
  const auto t = cg::tensor<i64>::from({0, 4, -100, 2, 1, 3, 3, 0, 2, -100, 4, 1}, {6, 2});
  const auto w = cg::uniform<float>({5}, 0.5, 2, 10);
  for (const auto red : {cg::loss_reduction::none, cg::loss_reduction::mean, cg::loss_reduction::sum})
    for (const double ls : {0.0, 0.1})
      for (const bool weighted : {false, true}) {
        CAPTURE(cg::to_string(red));
        CAPTURE(ls);
        CAPTURE(weighted);
        const std::optional<cg::tensor<float>> wt = weighted ? std::optional(w) : std::nullopt;
        auto loss = cg::tensor<float>::empty(red == cg::loss_reduction::none ? cg::shape_t{6, 2} : cg::shape_t{});
        auto lse = cg::tensor<float>::empty({6, 2});
        cd::cross_entropy_cpu(x, t, wt, red, -100, ls, loss, &lse);
        const auto [l, s] = cg::cross_entropy_with_lse(x, t, wt, -100, red, ls);
        CHECK(l.to_vector() == loss.to_vector());
        CHECK(s.to_vector() == lse.to_vector());
        CHECK(cg::cross_entropy(x, t, wt, -100, red, ls).to_vector() == loss.to_vector());
        const auto g = cg::uniform<float>(loss.shape(), 0.5, 1.5, 12);
        auto gi = cg::tensor<float>::empty(x.shape());
        cd::cross_entropy_backward_cpu(g, x, t, wt, red, -100, ls, lse, gi);
        CHECK(cg::cross_entropy_backward(g, x, t, s, wt, -100, red, ls).to_vector() == gi.to_vector());
      }
  // The defaults are PyTorch's (mean, ignore_index -100, no smoothing); reduction by name.
  const auto x2 = cg::uniform<float>({4, 3}, -1, 1, 13);
  const auto t2 = cg::tensor<i64>::from({2, 0, 1, 1}, {4});
  auto loss = cg::tensor<float>::empty({});
  cd::cross_entropy_cpu(x2, t2, std::nullopt, cg::loss_reduction::mean, -100, 0.0, loss);
  CHECK(cg::cross_entropy(x2, t2).item() == loss.item());
  cd::cross_entropy_cpu(x2, t2, std::nullopt, cg::loss_reduction::sum, 1, 0.0, loss);
  CHECK(cg::cross_entropy(x2, t2, std::nullopt, 1, "sum").item() == loss.item());
}

/// cross_entropy and its backward after an all_reduce of the logits.
auto loss_program(const cg::group& world) {
  return [world](auto x, auto t, auto w) {
    auto r = cg::wait_tensor(cg::all_reduce(x, "sum", world));
    auto [l, lse] = cg::cross_entropy_with_lse(r, t, w, 1, cg::loss_reduction::mean, 0.2);
    auto dx = cg::cross_entropy_backward(l * 0.f + 1.f, r, t, lse, w, 1, cg::loss_reduction::mean, 0.2);
    auto none = cg::cross_entropy(r, t, std::nullopt, -100, cg::loss_reduction::none);
    return std::make_tuple(l, lse, dx, none);
  };
}

TEST_CASE("loss_ops.traced_graph_runs_like_eager.world2") {
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    const auto program = loss_program(ctx.world());
    const auto rk = static_cast<std::uint64_t>(ctx.rank());
    const auto x = cg::uniform<float>({8, 5}, -2, 2, 51 + rk);
    const auto t = cg::tensor<i64>::from({0, 1, 2, 3, 4, 1, 1, 2}, {8});
    const auto w = cg::uniform<float>({5}, 0.5, 1.5, 61 + rk);
    const auto eager = program(x, t, w);
    auto g = cg::trace(program, cg::input<float>({8, 5}), cg::input<i64>({8}), cg::input<float>({5}));
    std::ostringstream os;
    os << g;
    const std::string text = os.str();
    CHECK(contains(text, ": (f32[], f32[8]) = cross_entropy(%wait_tensor, %arg_1, %arg_2, reduction=mean, "
                         "ignore_index=1, label_smoothing=0.2, has_weight=true)"));
    CHECK(contains(text, "cross_entropy(%wait_tensor, %arg_1, reduction=none, ignore_index=-100, label_smoothing=0, "
                         "has_weight=false)"));
    CHECK(contains(text, "f32[8, 5] = cross_entropy_backward("));
    CHECK(contains(text, "%cross_entropy.1, %arg_2, reduction=mean, ignore_index=1, label_smoothing=0.2, has_weight=true)"));
    g.lint();
    for (bool plan : {true, false}) {
      auto run = cg::compile(g, ctx, {.memory_plan = plan});
      for (int call = 0; call < 2; ++call) {
        check_same_results(run(x, t, w), eager);
      }
    }
  });
}

TEST_CASE("loss_ops.cost_grows_with_size") {
  const auto cost = [](std::int64_t n) {
    const cg::node_op op = cg::ops::cross_entropy{cg::loss_reduction::mean, -100, 0.0, false};
    const std::vector<cg::tensor_meta> in{{cg::dtype::f32, {n, 100}}, {cg::dtype::i64, {n}}};
    const auto c = cg::cost_of(op, in, cg::infer(op, in, {}));
    CHECK(c.k == cg::op_cost::kind::compute);
    return c.flops + c.bytes;
  };
  CHECK(cost(4) > 0);
  CHECK(cost(400) > cost(4));
}

TEST_CASE("loss_ops.errors_read_like_the_call_eager_and_traced") {
  const auto same = [](const std::string& eager, const std::string& traced, const std::string& part) {
    CHECK(contains(eager, part));
    CHECK(contains(traced, part));
  };
  const auto x = cg::ones<float>({4, 3});
  same(error_of([&] { (void)cg::cross_entropy(x, cg::tensor<std::int32_t>::from({0, 1, 2, 0}, {4})); }),
       error_of([] {
         (void)cg::trace([](auto a, auto t) { return cg::cross_entropy(a, t); }, cg::input<float>({4, 3}),
                         cg::input<std::int32_t>({4}));
       }),
       "cross_entropy: target dtype i32 must be i64");
  same(error_of([&] { (void)cg::cross_entropy(x, cg::tensor<i64>::from({0, 1, 2}, {3})); }),
       error_of([] {
         (void)cg::trace([](auto a, auto t) { return cg::cross_entropy(a, t); }, cg::input<float>({4, 3}),
                         cg::input<i64>({3}));
       }),
       "cross_entropy: input batch size 4 does not match target batch size 3");
  same(error_of([&] { (void)cg::cross_entropy(x, cg::tensor<i64>::from({0, 1, 2, 0}, {4}), std::nullopt, -100, "avg"); }),
       error_of([] { (void)cg::parse_loss_reduction("avg"); }),
       "cross_entropy: reduction 'avg' is not one of 'none', 'mean', 'sum'");
  // A bad target value is only seen when the kernel runs (eager now, traced when executed).
  CHECK(contains(error_of([&] { (void)cg::cross_entropy(x, cg::tensor<i64>::from({0, 1, 3, 0}, {4})); }),
                 "cross_entropy: target 3 at position 2 is out of bounds for 3 classes"));
  CHECK(contains(error_of([] {
                   (void)cg::infer(cg::ops::cross_entropy_backward{cg::loss_reduction::none, -100, 0.0, false},
                                   {{cg::dtype::f32, {4}}, {cg::dtype::f32, {4, 3}}, {cg::dtype::i64, {4}},
                                    {cg::dtype::f32, {3}}},
                                   {});
                 }),
                 "cross_entropy_backward: lse of shape [3] must have the target's shape [4]"));
}

}  // namespace loss_ops_tests
