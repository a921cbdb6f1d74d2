// tests/ops/test_stack_split_graph_ops.cpp: stack as a graph op (ops/compute_ops.hpp) and split
// on traced values (narrow views, ops/shape_ops.hpp): eager equals the kernel, traced calls
// record their nodes, the compiled graph gives the eager bits, errors are the same eager and
// traced, the cost grows with size and the planner plans stack's output.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "graph_op_support.hpp"
#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;
using namespace ccgraph_test::graph_ops;

namespace stack_split_graph_ops_test {

TEST_CASE("stack.graph") {
  const auto a = cg::uniform<float>({2, 3}, -1, 1, 1);
  const auto b = cg::uniform<float>({3, 2}, -1, 1, 2).transpose(0, 1);  // strided
  auto want = cg::tensor<float>::empty({2, 2, 3});
  cg::detail::stack_kernel(std::vector<cg::tensor<float>>{a, b}, 1, want);
  CHECK(bytes_of(cg::stack({a, b}, 1)) == bytes_of(want));
  CHECK(bytes_of(cg::stack(std::vector<cg::tensor<float>>{a, b}, -2)) == bytes_of(want));
  const std::string g = check_graph_matches_eager(
      [](const cg::group& world) {
        return [world](auto x, auto y) {
          return cg::stack({cg::wait_tensor(cg::all_reduce(x, "sum", world)), y, x}, 1);
        };
      },
      "stack", a, b.contiguous());
  CHECK(contains(g, "stack(%"));
  CHECK(contains(g, "dim=1"));
  CHECK(contains(g, "f32[2, 3, 3]"));
  CHECK(contains(same_error_eager_and_traced([](auto x, auto y) { return cg::stack({x, y}, 0); }, a, a.reshape({3, 2})),
                 "stack: expects each tensor to be equal size, but got [2, 3] at entry 0 and [3, 2] at entry 1"));
  CHECK(contains(same_error_eager_and_traced([](auto x, auto y) { return cg::stack({x, y}, 3); }, a, a),
                 "stack: dim 3 is out of range for a tensor of rank 3"));
  CHECK(contains(error_of([] { (void)cg::stack(std::vector<cg::tensor<float>>{}, 0); }),
                 "stack: expected a non-empty list of tensors"));
}

TEST_CASE("stack.graph.cost_grows_with_size") {
  auto f = [](auto x, auto y) { return cg::stack({x, y}, 0); };
  const auto small = cost_in(f, "stack", cg::input<float>({4, 4}), cg::input<float>({4, 4}));
  const auto large = cost_in(f, "stack", cg::input<float>({8, 4}), cg::input<float>({8, 4}));
  CHECK(small.bytes == 2.0 * 2 * 16 * 4);
  CHECK(large.bytes > small.bytes);
}

TEST_CASE("split.graph.records_narrow_views") {
  const auto t = cg::uniform<float>({5, 4}, -1, 1, 3);
  auto program = [](auto x) {
    auto p = cg::split(x, 2, 0);                                // 2, 2, 1 rows
    auto q = cg::split(x, std::vector<std::int64_t>{1, 3}, -1);  // 1, 3 columns
    return cg::eval(cg::stack({p[0], p[1]}, 0) + cg::stack({q[1].narrow(0, 0, 2), q[1].narrow(0, 2, 2)}, 0).narrow(2, 0, 1) + p[2]);
  };
  const std::string g = check_graph_matches_eager([&](const cg::group&) { return program; }, "", t);
  CHECK(contains(g, "narrow(%arg, dim=0, start=4, length=1)"));
  CHECK(contains(g, "narrow(%arg, dim=-1, start=1, length=3)"));
  CHECK(!contains(g, "split"));
  // The pieces alias the input eagerly, as PyTorch's do.
  CHECK(cg::split(t, 2, 0)[1].storage() == t.storage());
  auto split_err = [](auto x) { return cg::split(x, std::vector<std::int64_t>{2, 3}, 1)[0]; };
  CHECK(contains(same_error_eager_and_traced(split_err, t),
                 "split: split_sizes [2, 3] must sum exactly to 4"));
}

}  // namespace stack_split_graph_ops_test
