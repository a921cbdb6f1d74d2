// tests/ops/test_linear_graph_ops.cpp: bmm and linear as graph ops (ccgraph/ops/linear.hpp):
// eager calls equal the CPU kernels, traced calls record one node with its attributes, the
// compiled graph gives the eager bits, errors are the same eager and traced, the cost grows with
// size and the planner plans the outputs.
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "graph_op_support.hpp"
#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;
using namespace ccgraph_test::graph_ops;

namespace linear_graph_ops_test {

TEST_CASE("bmm.graph") {
  const auto a = cg::uniform<float>({3, 4, 5}, -1, 1, 1);
  const auto b = cg::uniform<float>({3, 5, 2}, -1, 1, 2);
  auto want = cg::tensor<float>::empty({3, 4, 2});
  cg::detail::bmm_cpu(a, b, want);
  CHECK(bytes_of(cg::bmm(a, b)) == bytes_of(want));
  const std::string g = check_graph_matches_eager(
      [](const cg::group& world) {
        return [world](auto x, auto y) { return cg::bmm(cg::wait_tensor(cg::all_reduce(x, "sum", world)), y); };
      },
      "bmm", a, b);
  CHECK(contains(g, "bmm(%"));
  CHECK(contains(g, "f32[3, 4, 2]"));
  CHECK(contains(same_error_eager_and_traced([](auto x, auto y) { return cg::bmm(x, y); }, a, b.transpose(1, 2)),
                 "bmm: expected batch2's first two dims to be [3, 5] for batch1 of shape [3, 4, 5], got batch2 of shape "
                 "[3, 2, 5]"));
  CHECK(contains(same_error_eager_and_traced([](auto x, auto y) { return cg::bmm(x, y); }, a.select(0, 0), b),
                 "bmm: batch1 must be a 3-d tensor, got shape [4, 5]"));
  // Integer bmm runs the same kernel; bool is refused eager and traced.
  const auto ai = cg::tensor<std::int32_t>::from({1, 2, 3, 4}, {1, 2, 2});
  CHECK(cg::bmm(ai, ai).to_vector() == std::vector<std::int32_t>{7, 10, 15, 22});
  CHECK(contains(same_error_eager_and_traced([](auto x, auto y) { return cg::bmm(x, y); }, ai.to<bool>(), ai.to<bool>()),
                 "bmm: bool tensors are not supported"));
}

template <class T>
void check_linear() {
  const auto x = cg::uniform<T>({2, 3, 8}, -1, 1, 3);
  const auto w = cg::uniform<T>({5, 8}, -1, 1, 4);
  const auto b = cg::uniform<T>({5}, -1, 1, 5);
  for (auto act : {cg::linear_activation::none, cg::linear_activation::gelu_tanh}) {
    INFO("activation " << cg::detail::to_string(act));
    auto want = cg::tensor<T>::empty({2, 3, 5});
    cg::detail::linear_cpu(x, w, std::optional<cg::tensor<T>>(b), act, want);
    CHECK(bytes_of(cg::linear(x, w, b, act)) == bytes_of(want));
    cg::detail::linear_cpu(x, w, std::optional<cg::tensor<T>>(), act, want);
    CHECK(bytes_of(cg::linear(x, w, std::nullopt, act)) == bytes_of(want));
    const std::string g = check_graph_matches_eager(
        [act](const cg::group& world) {
          return [world, act](auto x_, auto w_, auto b_) {
            auto h = cg::linear(cg::wait_tensor(cg::all_reduce(x_, "sum", world)), w_, b_, act);
            return cg::linear(h, w_.narrow(1, 0, 5));  // no bias
          };
        },
        "linear", x, w, b);
    CHECK(contains(g, "activation=" + std::string(cg::detail::to_string(act))));
    CHECK(contains(g, "activation=none"));
  }
  // The weight transposed in memory (a view) gives the same values.
  CHECK(bytes_of(cg::linear(x, w.transpose(0, 1).contiguous().transpose(0, 1), b)) == bytes_of(cg::linear(x, w, b)));
}

TEST_CASE("linear.graph.f32") { check_linear<float>(); }
TEST_CASE("linear.graph.bf16") { check_linear<cg::bf16>(); }

TEST_CASE("linear.graph.errors_eager_and_traced") {
  const auto x = cg::uniform<float>({4, 8}, -1, 1, 1);
  const auto w = cg::uniform<float>({3, 8}, -1, 1, 2);
  CHECK(contains(same_error_eager_and_traced([](auto a, auto b) { return cg::linear(a, b); }, x, w.transpose(0, 1)),
                 "linear: input of shape [4, 8] and weight of shape [8, 3] cannot be multiplied (in_features 8 != 3)"));
  CHECK(contains(same_error_eager_and_traced([](auto a, auto b, auto c) { return cg::linear(a, b, c); }, x, w,
                                             cg::ones<float>({4})),
                 "linear: bias of shape [4] for out_features 3; expected [3]"));
  CHECK(contains(same_error_eager_and_traced([](auto a, auto b) { return cg::linear(a, b); },
                                             cg::ones<std::int32_t>({4, 8}), cg::ones<std::int32_t>({3, 8})),
                 "linear: floating-point tensors only (f32, f64, bf16, f16), got i32"));
}

TEST_CASE("linear_bmm.graph.cost_grows_with_size") {
  auto lin = [](auto a, auto b, auto c) { return cg::linear(a, b, c, cg::linear_activation::gelu_tanh); };
  const auto small = cost_in(lin, "linear", cg::input<float>({4, 8}), cg::input<float>({16, 8}), cg::input<float>({16}));
  const auto large = cost_in(lin, "linear", cg::input<float>({64, 8}), cg::input<float>({16, 8}), cg::input<float>({16}));
  CHECK(small.peak == cg::peak_class::matmul);
  CHECK(small.flops >= 2.0 * 4 * 8 * 16);
  CHECK(large.flops > small.flops);
  CHECK(large.bytes > small.bytes);
  auto mm = [](auto a, auto b) { return cg::bmm(a, b); };
  const auto b1 = cost_in(mm, "bmm", cg::input<float>({2, 4, 8}), cg::input<float>({2, 8, 3}));
  const auto b2 = cost_in(mm, "bmm", cg::input<float>({4, 4, 8}), cg::input<float>({4, 8, 3}));
  CHECK(b1.flops == 2.0 * 2 * 4 * 8 * 3);
  CHECK(b2.flops > b1.flops);
}

}  // namespace linear_graph_ops_test
