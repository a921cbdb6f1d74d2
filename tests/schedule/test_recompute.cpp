// tests/schedule/test_recompute.cpp: the recompute_pointwise pass (schedule/recompute.hpp) and
// its default use on joint graphs (cg::grad_options). A two-block MLP's training step keeps
// one T x F activation less at its planned live peak, with the same loss and gradients bit for
// bit (unscheduled, compiled, scheduled by every pass, compile_function, eager); a forward
// program where a value read late is recomputed from inputs alive anyway; and the cases where
// nothing may be recomputed: an input not alive at the late read, a dropout, a collective, no
// time budget. (Random programs run the pass through tests/schedule/test_random_graph_ops.cpp,
// which schedules them with every pass of cg::schedule_pass_names().)
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/memory_plan.hpp>
#include <ccgraph/schedule/recompute.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "support.hpp"

namespace cg = ccgraph;

namespace recompute_test {

constexpr std::int64_t T = 64, H = 16, F = 128;
constexpr std::int64_t tf_bytes = T * F * 4;  // one f32 T x F activation (a multiple of 64)

/// Two MLP blocks, each matmul(gelu(matmul(x, w_in)), w_out): the loss of a training step.
struct mlp_loss {
  template <class V>
  V operator()(const V& x, const V& w1, const V& w2, const V& w3, const V& w4) const {
    const V a1 = cg::gelu(cg::matmul(x, w1));
    const V y1 = cg::matmul(a1, w2);
    const V a2 = cg::gelu(cg::matmul(y1, w3));
    const V y2 = cg::matmul(a2, w4);
    return cg::mean(y2 * y2);
  }
};

/// The step: the loss and the gradients of the four weights, as one list.
struct mlp_step {
  cg::grad_options opt;
  template <class V>
  std::vector<V> operator()(const V& x, const V& w1, const V& w2, const V& w3, const V& w4) const {
    auto [l, g1, g2, g3, g4] = cg::value_and_grad(mlp_loss{}, {1, 2, 3, 4}, opt)(x, w1, w2, w3, w4);
    return {l, g1, g2, g3, g4};
  }
};

template <class S>
auto trace_step(const S& step) {
  return cg::trace(step, cg::input<float>({T, H}), cg::input<float>({H, F}), cg::input<float>({F, H}),
                   cg::input<float>({H, F}), cg::input<float>({F, H}));
}

using ccgraph_test::bits_of;

std::int64_t live_peak(const cg::graph& g) { return cg::plan_memory(g).live_peak_bytes; }

/// The estimator cg::schedule uses by default.
cg::runtime_estimator default_estimator() { return cg::schedule_options{}.estimator(); }

/// A forward program: h = x w1, a = f(h) read by the next matmul and again after a second block
/// (whose T x F values make the peak); h itself read at the end when `h_late`.
template <class A>
struct forward {
  A act;
  bool h_late = true;
  template <class V>
  V operator()(const V& x, const V& w1, const V& w2) const {
    const V h = cg::matmul(x, w1);
    const V a = act(h);
    const V y = cg::matmul(a, w2);
    const V h2 = cg::matmul(y, w1);
    const V a2 = cg::tanh(h2);
    const V y2 = cg::matmul(a2, w2);
    const V late = cg::matmul(a, w2);
    if (!h_late) return cg::eval(y2 + late);
    return cg::eval(y2 + late + cg::matmul(h, w2));
  }
};
struct tanh_of {
  template <class V>
  V operator()(const V& h) const { return cg::tanh(h) * 0.5f; }
};
struct dropout_of {
  template <class V>
  V operator()(const V& h) const { return cg::dropout(h, 0.5); }
};
/// A collective result in a's place: all_reduce over the world of 2.
struct all_reduce_of {
  template <class V>
  V operator()(const V& h) const { return cg::all_reduce(h, "sum", cg::group("0")); }
};

template <class A>
auto trace_forward(const forward<A>& f) {
  return cg::trace(cg::trace_options{.rank = 0, .world_size = 2}, f, cg::input<float>({T, H}),
                   cg::input<float>({H, F}), cg::input<float>({F, H}));
}

}  // namespace recompute_test

using namespace recompute_test;

TEST_CASE("schedule.recompute.mlp_step_keeps_one_activation_less_same_bits") {
  const auto g_off = trace_step(mlp_step{{.recompute_pointwise = false}});
  const auto g_on = trace_step(mlp_step{});  // the default
  cg::lint(g_on);
  // The first block's gelu is computed again for its weight's gradient, from the matmul result
  // that gelu's own gradient keeps anyway; nothing else changes.
  CHECK(g_on.count("pointwise") == g_off.count("pointwise") + 1);
  CHECK(g_on.count("matmul") == g_off.count("matmul"));
  const std::int64_t peak_off = live_peak(g_off), peak_on = live_peak(g_on);
  INFO("planned live peak: as recorded ", peak_off, " B, recomputed ", peak_on, " B");
  CHECK(peak_off - peak_on == tf_bytes);
  // The pass by name on the recorded graph does what the default did.
  const auto by_name = cg::schedule(g_off, {"recompute_pointwise"});
  CHECK(cg::structurally_equal(by_name, g_on));
  // Without a time budget nothing is recomputed.
  cg::schedule_options none;
  none.recompute.max_added_time = 0;
  CHECK(cg::structurally_equal(cg::schedule(g_off, {"recompute_pointwise"}, none), g_off));
  const auto g_none = trace_step(mlp_step{{.recompute = {.max_added_time = 0}}});
  CHECK(cg::structurally_equal(g_none, g_off));

  // The same bits: recorded, recomputed, scheduled by every pass, compile_function, eager.
  std::vector<std::string> every;
  for (auto p : cg::schedule_pass_names()) every.emplace_back(p);
  ccgraph_test::run(1, [&](cg::rank_context& ctx) {
    const auto x = cg::uniform<float>({T, H}, -1, 1, 1), w1 = cg::uniform<float>({H, F}, -0.5, 0.5, 2),
               w2 = cg::uniform<float>({F, H}, -0.5, 0.5, 3), w3 = cg::uniform<float>({H, F}, -0.5, 0.5, 4),
               w4 = cg::uniform<float>({F, H}, -0.5, 0.5, 5);
    const std::string want = bits_of(cg::compile(g_off, ctx)(x, w1, w2, w3, w4));
    CHECK(bits_of(cg::compile(g_on, ctx)(x, w1, w2, w3, w4)) == want);
    CHECK(bits_of(cg::compile(g_on, ctx, {.memory_plan = false})(x, w1, w2, w3, w4)) == want);
    CHECK(bits_of(cg::compile(cg::schedule(g_on, every), ctx)(x, w1, w2, w3, w4)) == want);
    CHECK(bits_of(cg::compile(cg::schedule(g_off, every), ctx)(x, w1, w2, w3, w4)) == want);
    auto cf = cg::compile_function<float, float, float, float, float>(mlp_step{}, ctx, {.passes = every});
    for (int call = 0; call < 2; ++call) CHECK(bits_of(cf(x, w1, w2, w3, w4)) == want);
    auto [l, g1, g2, g3, g4] = cg::value_and_grad(mlp_loss{}, {1, 2, 3, 4})(x, w1, w2, w3, w4);
    CHECK(bits_of(std::vector<cg::tensor<float>>{l, g1, g2, g3, g4}) == want);
  });
}

TEST_CASE("schedule.recompute.forward_value_read_late") {
  const auto g = trace_forward(forward<tanh_of>{});
  // Eight kernels, about a launch each: one more is past the default budget of 10%.
  auto s = g;
  CHECK(cg::recompute_pointwise(s, default_estimator()) == 0);
  CHECK(cg::structurally_equal(s, g));
  const cg::recompute_options half{.max_added_time = 0.5};
  CHECK(cg::recompute_pointwise(s, default_estimator(), half) == 1);
  cg::lint(s);
  CHECK(s.count("pointwise") == g.count("pointwise") + 1);
  // The copy (named after the original, with "_re") sits right before the late matmul, which
  // reads it; the original keeps its first reader only.
  const cg::node* copy = nullptr;
  for (const cg::node* nd : s.nodes())
    if (nd->name().size() > 3 && nd->name().ends_with("_re")) copy = nd;
  REQUIRE(copy != nullptr);
  const cg::node* orig = s.find(copy->name().substr(0, copy->name().size() - 3));
  REQUIRE(orig != nullptr);
  CHECK(orig->op() == "pointwise");
  CHECK(orig->users().size() == 1);
  REQUIRE(copy->users().size() == 1);
  CHECK(copy->users()[0]->op() == "matmul");
  CHECK(s.position(copy->users()[0]) == s.position(copy) + 1);
  CHECK(live_peak(g) - live_peak(s) == tf_bytes);
  // A second run finds nothing more to do.
  auto again = s;
  CHECK(cg::recompute_pointwise(again, default_estimator(), half) == 0);
  CHECK(cg::structurally_equal(again, s));
  ccgraph_test::run(1, [&](cg::rank_context& ctx) {
    const auto x = cg::uniform<float>({T, H}, -1, 1, 7), w1 = cg::uniform<float>({H, F}, -0.5, 0.5, 8),
               w2 = cg::uniform<float>({F, H}, -0.5, 0.5, 9);
    const auto eager = forward<tanh_of>{}(x, w1, w2).to_vector();
    CHECK(cg::compile(s, ctx)(x, w1, w2).to_vector() == eager);
    CHECK(cg::compile(g, ctx)(x, w1, w2).to_vector() == eager);
  });
}

TEST_CASE("schedule.recompute.not_when_it_would_keep_an_input_alive") {
  // h is read by nothing after a: recomputing a at its late reader would keep h alive there.
  const auto g = trace_forward(forward<tanh_of>{{}, false});
  auto s = g;
  CHECK(cg::recompute_pointwise(s, default_estimator(), {.max_added_time = 0.5}) == 0);
  CHECK(cg::structurally_equal(s, g));
}

TEST_CASE("schedule.recompute.never_a_dropout_or_a_collective") {
  // A dropout draws another mask when run again: never recomputed, though its input is alive.
  const auto gd = trace_forward(forward<dropout_of>{});
  REQUIRE(gd.count("pointwise") >= 1);
  auto sd = gd;
  CHECK(cg::recompute_pointwise(sd, default_estimator(), {.max_added_time = 0.5}) == 0);
  CHECK(cg::structurally_equal(sd, gd));
  // An all_reduce's result in a's place: collectives and waits are never copied or moved.
  const auto gc = trace_forward(forward<all_reduce_of>{});
  REQUIRE(gc.count("all_reduce") == 1);
  cg::schedule_options half;
  half.recompute.max_added_time = 0.5;
  auto sc = cg::schedule(gc, {"recompute_pointwise"}, half);
  CHECK(sc.count("all_reduce") == 1);
  CHECK(sc.count("wait_tensor") == gc.count("wait_tensor"));
  CHECK(cg::structurally_equal(sc, gc));
}

TEST_CASE("schedule.recompute.bad_budget_is_an_error") {
  auto g = trace_forward(forward<tanh_of>{});
  const std::string msg = ccgraph_test::error_of([&] {
    cg::recompute_pointwise(g, default_estimator(), {.max_added_time = -1});
  });
  CHECK(ccgraph_test::contains(msg, "recompute_pointwise: max_added_time must be at least 0, got -1"));
}
