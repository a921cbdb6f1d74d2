// tests/ops/test_normalization_ops.cpp: softmax, log_softmax, layer_norm, rms_norm and their
// backward kernels as graph ops (ccgraph/ops/normalization_ops.hpp): eager equals the CPU
// kernels, traced nodes carry their attributes, the executor runs them after a collective
// bitwise like eager, errors are the kernels' eager and traced, cost and memory plan. The
// kernels' arithmetic is tested in test_normalization.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/memory_plan.hpp>

#include "ops/reduction_support.hpp"
#include "support.hpp"

namespace normalization_ops_tests {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using ccgraph_test::contains;
using ccgraph_test::red::check_same_results;
using ccgraph_test::error_of;

std::string listing(const cg::graph& g) {
  std::ostringstream os;
  os << g;
  return os.str();
}

TEST_CASE("normalization_ops.eager_equals_the_kernels") {
  const auto base = cg::uniform<float>({5, 8}, -3, 3, 5);
  const auto x = base.transpose(0, 1);  // [8, 5], strided
  auto out = cg::tensor<float>::empty({8, 5});
  cd::softmax_cpu(x, 0, out);
  CHECK(cg::softmax(x, 0).to_vector() == out.to_vector());
  cd::log_softmax_cpu(x, -1, out);
  CHECK(cg::log_softmax(x, -1).to_vector() == out.to_vector());
  const auto g = cg::uniform<float>({8, 5}, -1, 1, 6);
  const auto y = cg::softmax(x, 1);
  cd::softmax_backward_cpu(g, y, 1, out);
  CHECK(cg::softmax_backward(g, y, 1).to_vector() == out.to_vector());
  const auto ly = cg::log_softmax(x, 1);
  cd::log_softmax_backward_cpu(g, ly, 1, out);
  CHECK(cg::log_softmax_backward(g, ly, 1).to_vector() == out.to_vector());

  const auto w = cg::uniform<float>({5}, 0.5, 1.5, 7);
  const auto b = cg::uniform<float>({5}, -1, 1, 8);
  auto mean = cg::tensor<float>::empty({8, 1});
  auto rstd = cg::tensor<float>::empty({8, 1});
  cd::layer_norm_cpu(x, {5}, w, b, 1e-3, out, &mean, &rstd);
  CHECK(cg::layer_norm(x, {5}, w, b, 1e-3).to_vector() == out.to_vector());
  CHECK(cg::layer_norm(x, w, b, 1e-3).to_vector() == out.to_vector());  // API.md's form
  const auto [o3, m3, r3] = cg::native_layer_norm(x, {5}, w, b, 1e-3);
  CHECK(m3.to_vector() == mean.to_vector());
  CHECK(r3.to_vector() == rstd.to_vector());
  cd::layer_norm_cpu(x, {5}, std::nullopt, b, 1e-5, out);  // bias alone
  CHECK(cg::layer_norm(x, {5}, std::nullopt, b).to_vector() == out.to_vector());
  cd::layer_norm_cpu(x, {8, 5}, std::nullopt, std::nullopt, 1e-5, out);
  CHECK(cg::layer_norm(x, {8, 5}).to_vector() == out.to_vector());

  cd::rms_norm_cpu(x, {5}, w, std::nullopt, out, &rstd);
  CHECK(cg::rms_norm(x, {5}, w).to_vector() == out.to_vector());
  CHECK(cg::rms_norm(x, w).to_vector() == out.to_vector());
  CHECK(std::get<1>(cg::rms_norm_with_rstd(x, {5}, w, std::nullopt)).to_vector() == rstd.to_vector());
  cd::rms_norm_cpu(x, {5}, std::nullopt, 0.25, out);
  CHECK(cg::rms_norm(x, {5}, std::nullopt, 0.25).to_vector() == out.to_vector());

  // Backward: every combination of parameter gradients.
  auto gi = cg::tensor<float>::empty({8, 5});
  auto gw = cg::tensor<float>::empty({5});
  auto gb = cg::tensor<float>::empty({5});
  cd::layer_norm_backward_cpu(g, x, {5}, m3, r3, w, &gi, &gw, &gb);
  const auto [dx, dw, db] = cg::layer_norm_backward(g, x, {5}, m3, r3, w, true);
  CHECK(dx.to_vector() == gi.to_vector());
  REQUIRE(dw.has_value());
  REQUIRE(db.has_value());
  CHECK(dw->to_vector() == gw.to_vector());
  CHECK(db->to_vector() == gb.to_vector());
  const auto [dx2, dw2, db2] = cg::layer_norm_backward(g, x, {5}, m3, r3, std::nullopt, true);
  CHECK(!dw2.has_value());
  REQUIRE(db2.has_value());
  CHECK(db2->to_vector() == gb.to_vector());
  cd::layer_norm_backward_cpu(g, x, {5}, m3, r3, std::nullopt, &gi, nullptr, nullptr);
  CHECK(dx2.to_vector() == gi.to_vector());
  const auto [rx, rr] = cg::rms_norm_with_rstd(x, {5}, w, std::nullopt);
  (void)rx;
  cd::rms_norm_backward_cpu(g, x, {5}, rr, w, &gi, &gw);
  const auto [rdx, rdw] = cg::rms_norm_backward(g, x, {5}, rr, w);
  CHECK(rdx.to_vector() == gi.to_vector());
  REQUIRE(rdw.has_value());
  CHECK(rdw->to_vector() == gw.to_vector());
}

TEST_CASE("normalization_ops.rms_norm_eps_defaults_per_dtype") {
  // PyTorch's: the machine epsilon of the type it computes in, resolved into the node.
  auto gf = cg::trace([](auto a) { return cg::rms_norm(a, {4}); }, cg::input<float>({2, 4}));
  std::ostringstream want;
  want << "eps=" << double(std::numeric_limits<float>::epsilon());
  CHECK(contains(listing(gf), want.str()));
  auto gd = cg::trace([](auto a) { return cg::rms_norm(a, {4}); }, cg::input<double>({2, 4}));
  std::ostringstream wantd;
  wantd << "eps=" << std::numeric_limits<double>::epsilon();
  CHECK(contains(listing(gd), wantd.str()));
  // bf16 computes in float: float's epsilon, and float statistics.
  auto gb = cg::trace([](auto a) { return std::get<1>(cg::rms_norm_with_rstd(a, {4}, std::nullopt, std::nullopt)); },
                      cg::input<cg::bf16>({2, 4}));
  CHECK(contains(listing(gb), want.str()));
  CHECK(contains(listing(gb), "(bf16[2, 4], f32[2, 1]) = rms_norm("));
}

/// Every normalization op after an all_reduce, with and without parameters.
auto norm_program(const cg::group& world) {
  return [world](auto a, auto w, auto b) {
    auto r = cg::wait_tensor(cg::all_reduce(a, "sum", world));
    auto sm = cg::softmax(r, -1);
    auto ls = cg::log_softmax(r, 0);
    auto [ln, mean, rstd] = cg::native_layer_norm(r, {6}, w, b, 1e-5);
    auto [rn, rr] = cg::rms_norm_with_rstd(r, {6}, w, std::nullopt);
    auto [dx, dw, db] = cg::layer_norm_backward(sm, r, {6}, mean, rstd, w, true);
    auto [rdx, rdw] = cg::rms_norm_backward(ls, r, {6}, rr, std::nullopt);
    (void)rdw;
    return std::make_tuple(sm, ls, ln, cg::layer_norm(r, {4, 6}), rn, cg::rms_norm(r, {6}),
                           cg::softmax_backward(ln, sm, -1), cg::log_softmax_backward(rn, ls, 0), dx, *dw, *db, rdx);
  };
}

TEST_CASE("normalization_ops.traced_graph_runs_like_eager.world2") {
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    const auto program = norm_program(ctx.world());
    const auto r = static_cast<std::uint64_t>(ctx.rank());
    const auto a = cg::uniform<float>({4, 6}, -2, 2, 21 + r);
    const auto w = cg::uniform<float>({6}, 0.5, 1.5, 31 + r);
    const auto b = cg::uniform<float>({6}, -1, 1, 41 + r);
    const auto eager = program(a, w, b);
    auto g = cg::trace(program, cg::input<float>({4, 6}), cg::input<float>({6}), cg::input<float>({6}));
    const std::string text = listing(g);
    CHECK(contains(text, "softmax(%wait_tensor, dim=-1)"));
    CHECK(contains(text, "log_softmax(%wait_tensor, dim=0)"));
    CHECK(contains(text, ": (f32[4, 6], f32[4, 1], f32[4, 1]) = layer_norm(%wait_tensor, %arg_1, %arg_2, "
                         "normalized_shape=[6], eps=1e-05, has_weight=true, has_bias=true)"));
    CHECK(contains(text, "layer_norm(%wait_tensor, normalized_shape=[4, 6], eps=1e-05, has_weight=false, has_bias=false)"));
    CHECK(contains(text, "rms_norm(%wait_tensor, %arg_1, normalized_shape=[6]"));
    CHECK(contains(text, "= layer_norm_backward(%softmax, %wait_tensor, %layer_norm.1, %layer_norm.2, %arg_1, "
                         "normalized_shape=[6], has_weight=true, has_bias=true)"));
    CHECK(contains(text, "rms_norm_backward(%log_softmax, %wait_tensor, %rms_norm.1, normalized_shape=[6], has_weight=false)"));
    CHECK(contains(text, "softmax_backward(%layer_norm.0, %softmax, dim=-1)"));
    CHECK(contains(text, "log_softmax_backward(%rms_norm.0, %log_softmax, dim=0)"));
    g.lint();
    for (bool plan : {true, false}) {
      auto run = cg::compile(g, ctx, {.memory_plan = plan});
      for (int call = 0; call < 2; ++call) {
        check_same_results(run(a, w, b), eager);
      }
    }
    // Every output of the norms gets a planned buffer.
    const auto plan = cg::plan_memory(g);
    for (const cg::node* n : g.nodes())
      if (n->op() == "layer_norm" || n->op() == "layer_norm_backward")
        for (int b2 : plan.buffer_of[g.position(n)]) CHECK(b2 >= 0);
  });
}

TEST_CASE("normalization_ops.cost_grows_with_size") {
  const auto cost = [](const cg::node_op& op, std::int64_t rows) {
    const cg::tensor_meta m{cg::dtype::f32, {rows, 64}};
    const cg::tensor_meta s{cg::dtype::f32, {rows, 1}};
    const auto outs = cg::infer(op, {m}, {});
    const auto c = cg::cost_of(op, {m}, outs);
    CHECK(c.k == cg::op_cost::kind::compute);
    (void)s;
    return c.flops + c.bytes;
  };
  for (const cg::node_op& op : {cg::node_op(cg::ops::softmax{-1}), cg::node_op(cg::ops::log_softmax{0}),
                                cg::node_op(cg::ops::layer_norm{{64}, 1e-5, false, false}),
                                cg::node_op(cg::ops::rms_norm{{64}, 1e-6, false})}) {
    CHECK(cost(op, 8) > 0);
    CHECK(cost(op, 512) > cost(op, 8));
  }
}

TEST_CASE("normalization_ops.errors_read_like_the_call_eager_and_traced") {
  const auto same = [](const std::string& eager, const std::string& traced, const std::string& part) {
    CHECK(contains(eager, part));
    CHECK(contains(traced, part));
  };
  const auto xi = cg::tensor<std::int32_t>::from({1, 2}, {2});
  same(error_of([&] { (void)cg::softmax(xi, 0); }),
       error_of([] { (void)cg::trace([](auto a) { return cg::softmax(a, 0); }, cg::input<std::int32_t>({2})); }),
       "softmax: input dtype i32 is not a floating point type");
  const auto x = cg::ones<float>({2, 3});
  same(error_of([&] { (void)cg::log_softmax(x, 2); }),
       error_of([] { (void)cg::trace([](auto a) { return cg::log_softmax(a, 2); }, cg::input<float>({2, 3})); }),
       "log_softmax");
  same(error_of([&] { (void)cg::layer_norm(x, {2}); }),
       error_of([] { (void)cg::trace([](auto a) { return cg::layer_norm(a, {2}); }, cg::input<float>({2, 3})); }),
       "layer_norm: input of shape [2, 3] does not end with normalized_shape [2] (expected [*, 2])");
  const auto w4 = cg::ones<float>({4});
  same(error_of([&] { (void)cg::rms_norm(x, {3}, w4); }),
       error_of([] {
         (void)cg::trace([](auto a, auto w) { return cg::rms_norm(a, {3}, w); }, cg::input<float>({2, 3}),
                         cg::input<float>({4}));
       }),
       "rms_norm: weight of shape [4] must have normalized_shape [3]");
  same(error_of([&] { (void)cg::layer_norm(x, {3}, std::nullopt, std::nullopt, -1.0); }),
       error_of([] {
         (void)cg::trace([](auto a) { return cg::layer_norm(a, {3}, std::nullopt, std::nullopt, -1.0); },
                         cg::input<float>({2, 3}));
       }),
       "layer_norm: eps must be finite and >= 0, got -1");
  same(error_of([&] { (void)cg::softmax_backward(x, cg::ones<float>({3, 2}), 0); }),
       error_of([] { (void)cg::infer(cg::ops::softmax_backward{0}, {{cg::dtype::f32, {2, 3}}, {cg::dtype::f32, {3, 2}}}, {}); }),
       "softmax_backward: grad f32[2, 3] and output f32[3, 2] must have the same shape and dtype");
  // The backward ops check their statistics like the kernels.
  const auto st = cg::ones<float>({3, 1});
  same(error_of([&] { (void)cg::rms_norm_backward(x, x, {3}, st, std::nullopt); }),
       error_of([] {
         (void)cg::infer(cg::ops::rms_norm_backward{{3}, false},
                         {{cg::dtype::f32, {2, 3}}, {cg::dtype::f32, {2, 3}}, {cg::dtype::f32, {3, 1}}}, {});
       }),
       "rms_norm_backward: saved statistics of shape [3, 1] must have shape [2, 1]");
  CHECK(contains(error_of([] {
                   (void)cg::infer(cg::ops::layer_norm_backward{{3}, false, false},
                                   {{cg::dtype::f32, {2, 3}}, {cg::dtype::f32, {2, 3}}, {cg::dtype::f64, {2, 1}},
                                    {cg::dtype::f32, {2, 1}}},
                                   {});
                 }),
                 "layer_norm_backward: saved statistics of dtype f64 must be f32 for a f32 input"));
}

}  // namespace normalization_ops_tests
