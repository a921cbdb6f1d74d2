// tests/ops/test_reduction_ops.cpp: the reductions as graph ops (ccgraph/ops/reduction_ops.hpp):
// the public functions equal the CPU kernels eagerly, record one node with its attributes when
// traced, run through the executor (after a collective, memory plan on and off) bitwise like
// eager, give the kernels' errors eager and traced, are priced by the cost model and planned by
// the memory planner. The kernels' own arithmetic is tested in test_reduction.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/cost_model.hpp>
#include <ccgraph/schedule/memory_plan.hpp>

#include "ops/reduction_support.hpp"
#include "support.hpp"

namespace reduction_ops_tests {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using ccgraph_test::contains;
using ccgraph_test::red::check_same_results;
using ccgraph_test::error_of;
using i64 = std::int64_t;

/// The kernel's result into a new tensor of `shape`.
template <class U, class F>
cg::tensor<U> kernel_out(const cg::shape_t& shape, F&& f) {
  auto out = cg::tensor<U>::empty(shape);
  f(out);
  return out;
}

/// The listing of `g`.
std::string listing(const cg::graph& g) {
  std::ostringstream os;
  os << g;
  return os.str();
}

/// The node of `g` whose op is `op` (the first).
const cg::node* node_of(const cg::graph& g, std::string_view op) {
  for (const cg::node* n : g.nodes())
    if (n->op() == op) return n;
  return nullptr;
}

TEST_CASE("reduction_ops.eager_equals_the_kernels") {
  // A strided input: the kernels read any strides; the op passes the tensor as it is.
  const auto base = cg::uniform<float>({6, 4, 5}, -2, 2, 3);
  const auto x = base.transpose(0, 2).narrow(0, 1, 3);  // [3, 4, 6], not contiguous
  const std::vector<i64> dims{0, -1};
  CHECK(cg::sum(x, dims, true).to_vector() ==
        kernel_out<float>({1, 4, 1}, [&](auto& o) { cd::sum_cpu(x, dims, true, o); }).to_vector());
  CHECK(cg::mean(x, 1).to_vector() == kernel_out<float>({3, 6}, [&](auto& o) { cd::mean_cpu(x, {1}, false, o); }).to_vector());
  CHECK(cg::var(x, dims, 0.0).to_vector() ==
        kernel_out<float>({4}, [&](auto& o) { cd::var_cpu(x, dims, 0.0, false, o); }).to_vector());
  CHECK(cg::amax(x, {1, 2}).to_vector() ==
        kernel_out<float>({3}, [&](auto& o) { cd::amax_cpu(x, {1, 2}, false, o); }).to_vector());
  CHECK(cg::amin(x, -2, true).to_vector() ==
        kernel_out<float>({3, 1, 6}, [&](auto& o) { cd::amin_cpu(x, {-2}, true, o); }).to_vector());
  CHECK(cg::max(x).item() == kernel_out<float>({}, [&](auto& o) { cd::max_cpu(x, o); }).item());
  CHECK(cg::min(x).item() == kernel_out<float>({}, [&](auto& o) { cd::min_cpu(x, o); }).item());
  auto values = cg::tensor<float>::empty({3, 6});
  auto indices = cg::tensor<i64>::empty({3, 6});
  cd::max_dim_cpu(x, 1, false, values, indices);
  const auto [v, i] = cg::max(x, 1);
  CHECK(v.to_vector() == values.to_vector());
  CHECK(i.to_vector() == indices.to_vector());
  cd::min_dim_cpu(x, 1, false, values, indices);
  const auto [vn, in] = cg::min(x, 1);
  CHECK(vn.to_vector() == values.to_vector());
  CHECK(in.to_vector() == indices.to_vector());
  CHECK(cg::argmax(x).item() == kernel_out<i64>({}, [&](auto& o) { cd::argmax_cpu(x, std::nullopt, false, o); }).item());
  CHECK(cg::argmin(x, 2, true).to_vector() ==
        kernel_out<i64>({3, 4, 1}, [&](auto& o) { cd::argmin_cpu(x, 2, true, o); }).to_vector());
}

TEST_CASE("reduction_ops.dtype_rules") {
  // PyTorch's: sums of integers and bools are i64 (bools count); max and argmax keep / give i64.
  const auto xi = cg::tensor<std::int32_t>::from({1, -5, 3, 4, 2, 6}, {2, 3});
  const cg::tensor<i64> s = cg::sum(xi, 0);
  CHECK(s.to_vector() == std::vector<i64>{5, -3, 9});
  const auto b = cg::tensor<bool>::from({true, false, true, true}, {4});
  CHECK(cg::sum(b).item() == 3);
  static_assert(std::is_same_v<decltype(cg::sum(b)), cg::tensor<i64>>);
  static_assert(std::is_same_v<decltype(cg::amax(xi)), cg::tensor<std::int32_t>>);
  CHECK(cg::amax(xi).item() == 6);
  CHECK(cg::max(xi).item() == 6);
  const auto [v, i] = cg::max(xi, 1, true);
  CHECK(v.shape() == cg::shape_t{2, 1});
  CHECK(v.to_vector() == std::vector<std::int32_t>{3, 6});
  CHECK(i.to_vector() == std::vector<i64>{2, 2});
  CHECK(cg::argmin(xi).item() == 1);
  // Traced, the node's dtype follows the same rule.
  auto g = cg::trace([](auto a) { return cg::sum(a, {1}); }, cg::input<std::int32_t>({2, 3}));
  CHECK(node_of(g, "sum")->dtype() == cg::dtype::i64);
  // A pointwise expression is evaluated first (one fused node when traced).
  CHECK(cg::sum(xi * 2).item() == 22);
  auto ge = cg::trace([](auto a) { return cg::mean(a * 2.f, -1); }, cg::input<float>({2, 3}));
  CHECK(contains(listing(ge), "fused_mul"));
  CHECK(contains(listing(ge), "mean(%mul, dims=[-1], keepdim=false)"));
}

TEST_CASE("reduction_ops.names_do_not_hide_std") {
  // ccgraph::max / min take tensors and traced values only: with both namespaces open,
  // max(1, 2) still means std::max.
  using namespace ccgraph;
  using std::max;
  using std::min;
  CHECK(max(1, 2) == 2);
  CHECK(min(3.0, -1.0) == -1.0);
  CHECK(max(tensor<float>::from({1, 7, 3}, {3})).item() == 7.f);
}

/// Every forward and backward reduction of one input, after an all_reduce (so the memory
/// planner places their outputs among the collective's buffers).
auto reduction_program(const cg::group& world) {
  return [world](auto a) {
    auto r = cg::wait_tensor(cg::all_reduce(a, "sum", world));
    auto [mv, mi] = cg::max(r, 1, true);
    auto [nv, ni] = cg::min(r, 0);
    auto am = cg::amax(r, {1});
    auto v = cg::var(r, {0}, 1.0, true);
    return std::make_tuple(cg::sum(r, {0, 1}), cg::mean(r, -1), v, am, cg::amin(r), cg::max(r), cg::min(r), mv, mi, nv,
                           ni, cg::argmax(r), cg::argmin(r, 1),
                           cg::amax_backward(am * 0.5f, r, am, {1}), cg::max_backward(cg::max(r), r, cg::max(r)),
                           cg::max_dim_backward(mv, mi, 1, true, r.shape()), cg::var_backward(v, r, {0}, 1.0, true));
  };
}

TEST_CASE("reduction_ops.traced_graph_runs_like_eager.world2") {
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    const cg::group world = ctx.world();
    const auto program = reduction_program(world);
    // Ties: values on a grid of 0.5 make max/argmax pick among equals by the first index.
    const auto a = cg::uniform<float>({4, 6}, -2, 2, 11 + static_cast<std::uint64_t>(ctx.rank()));
    const auto eager = program(a);
    auto g = cg::trace(program, cg::input<float>({4, 6}));
    const std::string text = listing(g);
    CHECK(contains(text, "sum(%wait_tensor, dims=[0, 1], keepdim=false)"));
    CHECK(contains(text, "mean(%wait_tensor, dims=[-1], keepdim=false)"));
    CHECK(contains(text, "var(%wait_tensor, dims=[0], correction=1, keepdim=true)"));
    CHECK(contains(text, "amin(%wait_tensor, dims=[], keepdim=false)"));
    CHECK(contains(text, ": (f32[4, 1], i64[4, 1]) = max_dim(%wait_tensor, dim=1, keepdim=true)"));
    CHECK(contains(text, "min_dim(%wait_tensor, dim=0, keepdim=false)"));
    CHECK(contains(text, "argmax(%wait_tensor, dim=None, keepdim=false)"));
    CHECK(contains(text, "argmin(%wait_tensor, dim=1, keepdim=false)"));
    CHECK(contains(text, "max(%wait_tensor)"));
    CHECK(contains(text, "amax_backward("));
    CHECK(contains(text, "max_dim_backward(%max_dim.0, %max_dim.1, dim=1, keepdim=true, input_shape=[4, 6])"));
    CHECK(contains(text, "var_backward("));
    g.lint();
    for (bool plan : {true, false}) {
      auto run = cg::compile(g, ctx, {.memory_plan = plan});
      for (int call = 0; call < 2; ++call) check_same_results(run(a), eager);
    }
  });
}

TEST_CASE("reduction_ops.traits_drive_the_passes") {
  auto g = cg::trace(
      [](auto a) {
        auto [v, i] = cg::max(a * 2.f, 0);
        return std::make_tuple(cg::sum(v) + 1.f, i);
      },
      cg::input<float>({8, 16}));
  const cg::node* md = node_of(g, "max_dim");
  REQUIRE(md != nullptr);
  CHECK(cg::category_of(md->kind()) == cg::op_category::compute);
  CHECK(cg::aliasing_of(md->kind()) == cg::alias_kind::fresh);
  CHECK(md->num_outputs() == 2);
  // The memory planner gives both outputs a buffer of their own.
  const auto plan = cg::plan_memory(g);
  const auto& bufs = plan.buffer_of[g.position(md)];
  REQUIRE(bufs.size() == 2);
  CHECK(bufs[0] >= 0);
  CHECK(bufs[1] >= 0);
  CHECK(bufs[0] != bufs[1]);
  // The cost model prices it, more for more data.
  CHECK(cg::cost_model(cg::device_spec::h100()).compute_us(*md) > 0.0);
  const auto cost = [](const cg::node_op& op, const cg::shape_t& s, const cg::shape_t& out) {
    const auto c = cg::cost_of(op, {{cg::dtype::f32, s}}, {{cg::dtype::f32, out}});
    CHECK(c.k == cg::op_cost::kind::compute);
    return c.flops + c.bytes;
  };
  for (const cg::node_op& op : {cg::node_op(cg::ops::sum{{0}, false}), cg::node_op(cg::ops::mean{{0}, false}),
                                cg::node_op(cg::ops::var{{0}, 1.0, false}), cg::node_op(cg::ops::amax{{0}, false}),
                                cg::node_op(cg::ops::argmax{0, false})}) {
    const double small = cost(op, {64, 32}, {32});
    CHECK(small > 0);
    CHECK(cost(op, {1024, 32}, {32}) > small);
  }
}

TEST_CASE("reduction_ops.errors_read_like_the_call_eager_and_traced") {
  const auto xi = cg::tensor<std::int32_t>::from({1, 2}, {2});
  const auto x = cg::ones<float>({2, 0});
  // The same message eager, traced (the node's inference) and from infer alone.
  const auto same = [](const std::string& eager, const std::string& traced, const std::string& part) {
    CHECK(contains(eager, part));
    CHECK(contains(traced, part));
  };
  same(error_of([&] { (void)cg::mean(xi); }),
       error_of([] { (void)cg::trace([](auto a) { return cg::mean(a); }, cg::input<std::int32_t>({2})); }),
       "mean: input dtype i32 is not a floating point type");
  same(error_of([&] { (void)cg::sum(x, {1, -1}); }),
       error_of([] { (void)cg::trace([](auto a) { return cg::sum(a, {1, -1}); }, cg::input<float>({2, 0})); }),
       "sum: dim 1 appears multiple times in the list of dims [1, -1]");
  same(error_of([&] { (void)cg::amax(x, 1); }),
       error_of([] { (void)cg::trace([](auto a) { return cg::amax(a, 1); }, cg::input<float>({2, 0})); }),
       "amax: cannot reduce dim 1 of size 0");
  same(error_of([&] { (void)cg::max(x, 1); }),
       error_of([] { (void)cg::trace([](auto a) { return std::get<0>(cg::max(a, 1)); }, cg::input<float>({2, 0})); }),
       "max: cannot reduce dim 1 of size 0");
  same(error_of([&] { (void)cg::min(x); }),
       error_of([] { (void)cg::trace([](auto a) { return cg::min(a); }, cg::input<float>({2, 0})); }),
       "min: input of shape [2, 0] has no elements");
  same(error_of([&] { (void)cg::argmin(x, 3); }),
       error_of([] { (void)cg::trace([](auto a) { return cg::argmin(a, 3); }, cg::input<float>({2, 0})); }),
       "argmin");
  same(error_of([&] { (void)cg::var(cg::ones<float>({3}), {}, std::nan("")); }),
       error_of([] { (void)cg::infer(cg::ops::var{{}, std::nan(""), false}, {{cg::dtype::f32, {3}}}, {}); }),
       "var: correction must be finite");
  same(error_of([&] { (void)cg::var_backward(cg::ones<float>({3}), cg::ones<float>({3}), {0}); }),
       error_of([] { (void)cg::infer(cg::ops::var_backward{{0}, 1.0, false}, {{cg::dtype::f32, {3}}, {cg::dtype::f32, {3}}}, {}); }),
       "var_backward: grad of shape [3] must have the reduced shape [] of input [3]");
  CHECK(contains(error_of([] { (void)cg::infer(cg::ops::max_dim_backward{0, false, {3}},
                                               {{cg::dtype::f32, {}}, {cg::dtype::i32, {}}}, {}); }),
                 "max_backward: indices dtype i32 must be i64"));
}

}  // namespace reduction_ops_tests
