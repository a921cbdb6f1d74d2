// tests/ops/test_squeeze.cpp: squeeze (ccgraph/ops/squeeze.hpp), the op docs/concepts.md "Adding
// an op" adds through one header: eager, traced, inferred, planned, executed and costed from its
// op_traits alone.
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/cost_model.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

TEST_CASE("squeeze.eager.drops_a_size_one_dim_as_a_view") {
  auto t = cg::tensor<float>::from({1, 2, 3, 4, 5, 6}, {2, 1, 3});
  const auto s = cg::squeeze(t, 1);
  CHECK(s.shape() == cg::shape_t{2, 3});
  CHECK(s.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(s.storage() == t.storage());  // a view: writes show through
  s.narrow(0, 1, 1).fill_(0.f);
  CHECK(t.to_vector() == std::vector<float>{1, 2, 3, 0, 0, 0});
  CHECK(cg::squeeze(t, -2).shape() == cg::shape_t{2, 3});  // negative dims count from the end
}

TEST_CASE("squeeze.eager.other_sizes_and_0d_are_unchanged") {
  auto t = cg::tensor<float>::from({1, 2, 3, 4, 5, 6}, {2, 1, 3});
  CHECK(cg::squeeze(t, 0).shape() == cg::shape_t{2, 1, 3});  // PyTorch: a no-op, not an error
  CHECK(cg::squeeze(t, 2).shape() == cg::shape_t{2, 1, 3});
  auto s = cg::tensor<float>::from({7}, {});
  CHECK(cg::squeeze(s, 0).shape().empty());
  CHECK(cg::squeeze(s, -1).to_vector() == std::vector<float>{7});
  // The transposed layout keeps its strides.
  auto tt = t.transpose(0, 2);  // [3, 1, 2]
  CHECK(cg::squeeze(tt, 1).to_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});
}

TEST_CASE("squeeze.errors_read_like_the_call_eager_and_traced") {
  auto t = cg::ones<float>({2, 1});
  const std::string eager = error_of([&] { (void)cg::squeeze(t, 2); });
  CHECK(contains(eager, "squeeze"));
  CHECK(contains(eager, "2"));
  // Inference of a graph node gives the same message (it runs the same apply_view).
  const std::string inferred =
      error_of([&] { (void)cg::infer(cg::node_op(cg::ops::squeeze{2}), {cg::tensor_meta{cg::dtype::f32, {2, 1}}}, {}); });
  CHECK(inferred == eager);
  CHECK(contains(error_of([&] { (void)cg::squeeze(cg::tensor<float>::from({1}, {}), 1); }),
                 "squeeze: dim 1 is out of range for a 0-d tensor (expected -1 or 0)"));
}

TEST_CASE("squeeze.traced_graph_runs_like_eager.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::group world = ctx.world();
    auto program = [&](auto a) {  // [4, 1, 4]: squeeze, matmul, all_reduce, a view back
      auto m = cg::squeeze(a, 1);
      auto r = cg::wait_tensor(cg::all_reduce(cg::matmul(m, m), "sum", world));
      return cg::squeeze(r.unsqueeze(0), 0);
    };
    auto a = cg::uniform<float>({4, 1, 4}, -1, 1, 7 + static_cast<std::uint64_t>(ctx.rank()));
    const auto eager = program(a).to_vector();
    auto g = cg::trace(program, cg::input<float>({4, 1, 4}));
    std::ostringstream os;
    os << g;
    CHECK(contains(os.str(), "squeeze(%"));
    CHECK(contains(os.str(), "dim=1"));
    for (bool plan : {true, false}) {
      auto run = cg::compile(g, ctx, {.memory_plan = plan});
      CHECK(run(a).to_vector() == eager);
    }
  });
}

TEST_CASE("squeeze.traits_drive_the_passes") {
  auto g = cg::trace([](auto a) { return cg::squeeze(a, 0) + 1.f; }, cg::input<float>({1, 8}));
  const cg::node* sq = nullptr;
  for (const cg::node* n : g.nodes())
    if (n->op() == "squeeze") sq = n;
  REQUIRE(sq != nullptr);
  CHECK(sq->is_view());
  CHECK(!sq->is_impure());
  CHECK(sq->shape() == cg::shape_t{8});
  CHECK(cg::category_of(sq->kind()) == cg::op_category::view);
  CHECK(cg::aliasing_of(sq->kind()) == cg::alias_kind::view);
  // A view launches nothing: the cost model prices it 0.
  CHECK(cg::cost_model(cg::device_spec::h100()).compute_us(*sq) == 0.0);
  // The memory plan aliases it to its input (a graph input: nothing planned for it).
  const auto plan = cg::plan_memory(g);
  CHECK(plan.buffer_of[g.position(sq)].at(0) == -1);
}
