// tests/ops/test_user_op.cpp: user ops (ccgraph/ops/user_op.hpp): registered at run time, called on
// tensors and traced values, planned, scheduled, costed and run by the executor like built-in ops.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/cost_model.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

std::atomic<int> cpu_calls{0};

/// out = x + attrs[0] * y (same shapes, floating), and a second output: the row sums of out.
cg::user_op_def scaled_add_def(std::string name) {
  cg::user_op_def d;
  d.name = std::move(name);
  d.infer = [n = d.name](const std::vector<cg::tensor_meta>& in, const std::vector<double>& attrs) {
    CCGRAPH_CHECK(in.size() == 2, n, ": expected 2 inputs, got ", in.size());
    CCGRAPH_CHECK(in[0] == in[1], n, ": x is ", in[0].str(), " but y is ", in[1].str());
    CCGRAPH_CHECK(in[0].shape.size() == 2, n, ": expected a 2-d x, got ", in[0].str());
    CCGRAPH_CHECK(attrs.size() == 1, n, ": expected one attribute (the scale), got ", attrs.size());
    return std::vector<cg::tensor_meta>{in[0], {in[0].dtype, {in[0].shape[0]}}};
  };
  d.cpu = [](const cg::user_op_call& c) {
    ++cpu_calls;
    const auto& x = std::get<cg::tensor<float>>(c.inputs[0]);
    const auto& y = std::get<cg::tensor<float>>(c.inputs[1]);
    const auto& out = std::get<cg::tensor<float>>(c.outputs[0]);
    const auto& rows = std::get<cg::tensor<float>>(c.outputs[1]);
    const auto xs = x.to_vector(), ys = y.to_vector();  // any strides
    const std::int64_t n = x.shape()[0], m = x.shape()[1];
    float* o = out.data();
    float* r = rows.data();
    for (std::int64_t i = 0; i < n; ++i) {
      float s = 0;
      for (std::int64_t j = 0; j < m; ++j) {
        o[i * m + j] = xs[i * m + j] + static_cast<float>(c.attrs[0]) * ys[i * m + j];
        s += o[i * m + j];
      }
      r[i] = s;
    }
  };
  d.cost = [](const cg::cost_args& a, const std::vector<double>&) {
    const double elems = static_cast<double>(cg::numel_of(a.in[0].shape));
    return cg::op_cost::compute(3 * elems, 4 * 4 * elems, cg::peak_class::vector);
  };
  return d;
}

const cg::user_op& scaled_add() {
  static const cg::user_op op = cg::register_op(scaled_add_def("test::scaled_add"));
  return op;
}

}  // namespace

TEST_CASE("user_op.eager.runs_the_cpu_callable") {
  auto x = cg::tensor<float>::from({1, 2, 3, 4, 5, 6}, {2, 3});
  auto y = cg::tensor<float>::from({10, 20, 30, 40, 50, 60}, {2, 3});
  const auto [out, rows] = scaled_add().with({0.5}).call<float, float>(x, y);
  CHECK(out.to_vector() == std::vector<float>{6, 12, 18, 24, 30, 36});
  CHECK(rows.to_vector() == std::vector<float>{36, 90});
  // Strided inputs reach the callable as they are; it reads them through to_vector.
  auto xt = cg::tensor<float>::from({1, 4, 2, 5, 3, 6}, {3, 2}).transpose(0, 1);
  const auto [o2, r2] = scaled_add().with({0.5}).call<float, float>(xt, y);
  CHECK(o2.to_vector() == out.to_vector());
  CHECK(scaled_add().name() == "test::scaled_add");
}

TEST_CASE("user_op.errors_name_the_op_eager_and_traced") {
  auto x = cg::ones<float>({2, 3});
  auto y = cg::ones<float>({3, 2});
  const std::string eager = error_of([&] { (void)scaled_add().with({1.0})(x, y); });
  CHECK(contains(eager, "test::scaled_add: x is f32[2, 3] but y is f32[3, 2]"));
  const std::string traced = error_of([&] {
    (void)cg::trace([&](auto a, auto b) { return scaled_add().with({1.0})(a, b); }, cg::input<float>({2, 3}),
                    cg::input<float>({3, 2}));
  });
  CHECK(contains(traced, "test::scaled_add: x is f32[2, 3] but y is f32[3, 2]"));
  CHECK(contains(error_of([&] { (void)scaled_add()(x, x); }), "expected one attribute"));
  // A call asking for the wrong number of outputs is refused, not truncated.
  CHECK(contains(error_of([&] { (void)scaled_add().with({1.0}).call<float>(x, x); }),
                 "user_op: expected 1 outputs, the op gave 2"));
}

TEST_CASE("user_op.register_op_checks_the_definition") {
  CHECK(contains(error_of([] { (void)cg::register_op(scaled_add_def("test::scaled_add")); }),
                 "register_op: an op named test::scaled_add is already registered"));
  auto d = scaled_add_def("test::no_cost");
  d.cost = nullptr;
  CHECK(contains(error_of([&] { (void)cg::register_op(d); }), "register_op: test::no_cost has no cost"));
  d = scaled_add_def("test::no_cpu");
  d.cpu = nullptr;
  CHECK(contains(error_of([&] { (void)cg::register_op(d); }), "register_op: test::no_cpu has no cpu callable"));
  d = scaled_add_def("test::no_infer");
  d.infer = nullptr;
  CHECK(contains(error_of([&] { (void)cg::register_op(d); }), "has no infer"));
  d = scaled_add_def("");
  CHECK(contains(error_of([&] { (void)cg::register_op(d); }), "needs a name"));
}

TEST_CASE("user_op.traced_prints_plans_costs_and_runs_like_eager.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::group world = ctx.world();
    auto program = [&](auto a, auto b) {
      auto s = cg::wait_tensor(cg::all_reduce(cg::matmul(a, b), "sum", world));
      auto [o, rows] = scaled_add().with({0.25}).template call<float, float>(s, a);
      return std::tuple{o + 1.f, rows};
    };
    auto a = cg::uniform<float>({8, 8}, -1, 1, 11 + static_cast<std::uint64_t>(ctx.rank()));
    auto b = cg::uniform<float>({8, 8}, -1, 1, 21 + static_cast<std::uint64_t>(ctx.rank()));
    const auto [eo, er] = program(a, b);
    auto g = cg::trace(program, cg::input<float>({8, 8}), cg::input<float>({8, 8}));
    std::ostringstream os;
    os << g;
    CHECK(contains(os.str(), "%scaled_add : (f32[8, 8], f32[8]) = test::scaled_add(%wait_tensor, %arg, attrs=[0.25])"));
    const cg::node* u = nullptr;
    for (const cg::node* n : g.nodes())
      if (n->op() == "user_op") u = n;
    REQUIRE(u != nullptr);
    CHECK(u->num_outputs() == 2);
    CHECK(cg::category_of(u->kind()) == cg::op_category::compute);
    // The cost model prices it by its cost hook: 3 flops and 16 bytes per element.
    CHECK(cg::cost_model(cg::device_spec::h100()).compute_us(*u) > 0.0);
    const auto c = cg::cost_of(u->kind(), {u->args()[0].src->meta(u->args()[0].index)}, u->metas());
    CHECK(c.flops == doctest::Approx(3 * 64));
    // The planner gives both outputs buffers; the executor runs it with and without a plan, and
    // after the schedule passes, equal to eager bitwise.
    const auto plan = cg::plan_memory(g);
    CHECK(plan.buffer_of[g.position(u)].size() == 2);
    auto scheduled = cg::schedule(g, {std::string(cg::schedule_pass_names().begin()[0]), "sink_waits", "raise_comms",
                                                     "reorder_compute_for_overlap", "overlap"});
    for (bool use_plan : {true, false})
      for (const auto* gr : {&g, &scheduled}) {
        auto run = cg::compile(*gr, ctx, {.memory_plan = use_plan});
        const auto [o, rows] = run(a, b);
        CHECK(o.to_vector() == eo.to_vector());
        CHECK(rows.to_vector() == er.to_vector());
      }
  });
}

TEST_CASE("user_op.compile_function_keys_on_the_attributes") {
  run(1, [](cg::rank_context& ctx) {
    auto x = cg::ones<float>({2, 2});
    double scale = 1.0;
    auto f = cg::compile_function<float>(
        [&](auto a) { return std::get<0>(scaled_add().with({scale}).template call<float, float>(a, a)); }, ctx);
    CHECK(f(x).to_vector() == std::vector<float>{2, 2, 2, 2});
    scale = 3.0;  // a new attribute is a new graph, never the cached one
    CHECK(f(x).to_vector() == std::vector<float>{4, 4, 4, 4});
  });
}
