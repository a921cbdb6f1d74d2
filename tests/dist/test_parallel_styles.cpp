// tests/dist/test_parallel_styles.cpp: gradients of dtensor programs (cg::value_and_grad through
// from_local, redistribute and to_local) on the threads backend at 2 and 4 ranks: each equal to
// the same program on one device, forward and backward, with the collectives each phase issues.
//
// Inputs are small integers and the meshes powers of two, so every sum is exact in float and
// the sharded programs equal the single-device ones bitwise.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/dtensor.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/schedule/verify.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using cg::shape_t;
using i64 = std::int64_t;
using dt = cg::dtensor<float>;

/// A whole tensor of `shape`: (i * 7 + seed) % 11 - 5, small integers.
cg::tensor<float> whole(const shape_t& shape, int seed = 0) {
  std::vector<float> v(static_cast<std::size_t>(cg::numel_of(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((static_cast<int>(i) * 7 + seed) % 11 - 5);
  return cg::tensor<float>::from(v, shape);
}

/// Chunk `index` of `n` of `t` along `dim`, contiguous.
cg::tensor<float> chunk_of(const cg::tensor<float>& t, int n, int index, int dim) {
  const i64 len = t.shape()[static_cast<std::size_t>(dim)] / n;
  return t.narrow(dim, len * index, len).contiguous();
}

/// Equal shapes and values.
void check_equal(const cg::tensor<float>& got, const cg::tensor<float>& want) {
  REQUIRE(got.shape() == want.shape());
  CHECK(got.contiguous().to_vector() == want.contiguous().to_vector());
}

/// relu of a dtensor (a pointwise op its sharding rule keeps laid out).
template <class D>
D relu_of(const D& h) {
  return cg::pointwise("relu", [](const auto& v) { return cg::relu(v); }, h);
}

/// The Megatron MLP's loss on one device: sum(linear(relu(linear(x, w1)), w2)).
struct mlp_loss {
  template <class X, class W1, class W2>
  auto operator()(const X& x, const W1& w1, const W2& w2) const {
    const X h = cg::relu(cg::linear(x, w1));
    return cg::sum(cg::linear(h, w2));
  }
};

constexpr i64 tokens = 8, hidden = 8, ffn = 16;

}  // namespace

// ============================ gradients of dtensor programs ============================

TEST_CASE("dtensor.grad.megatron_by_hand.world2_world4") {
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n}, {"tp"});
      const auto x = whole({tokens, hidden}), w1 = whole({ffn, hidden}, 3), w2 = whole({hidden, ffn}, 5);
      const auto [ref_loss, ref_g1, ref_g2] = cg::value_and_grad(mlp_loss{}, {1, 2})(x, w1, w2);
      const int r = ctx.rank();
      const auto w1l = chunk_of(w1, n, r, 0), w2l = chunk_of(w2, n, r, 1);
      // Local tensors in, dtensors inside: column-parallel w1, row-parallel w2, the Partial(sum)
      // result redistributed to Replicate (one all_reduce), a Replicate loss.
      auto loss = [&](auto xl, auto a, auto b) {
        const auto xd = dt::from_local(xl, mesh, {cg::replicate()});
        const auto h = relu_of(cg::linear(xd, dt::from_local(a, mesh, {cg::shard(0)})));
        CHECK(h.placements() == std::vector{cg::shard(1)});
        const auto y = cg::linear(h, dt::from_local(b, mesh, {cg::shard(1)}));
        CHECK(y.placements() == std::vector{cg::partial()});
        return cg::sum(y.redistribute(mesh, {cg::replicate()}));
      };
      cg::comm_counter c;
      const auto [value, g1, g2] = cg::value_and_grad(loss, {1, 2})(x, w1l, w2l);
      check_equal(value, ref_loss);
      check_equal(g1, chunk_of(ref_g1, n, r, 0));
      check_equal(g2, chunk_of(ref_g2, n, r, 1));
      // Forward: the one all_reduce; backward: its transpose (an all_reduce of the loss's
      // gradient; x is not differentiated, so no all_reduce of its gradient).
      CHECK(c.count("all_reduce", "forward") == 1);
      CHECK(c.count("all_reduce", "backward") == 1);
      CHECK(c.total() == 2);

      // Differentiating x too: its gradient is whole on every rank (one more all_reduce, the
      // from_local boundary of a Replicate input), equal to one device's.
      const auto [ref_l2, ref_gx] = cg::value_and_grad(mlp_loss{}, 0)(x, w1, w2);
      (void)ref_l2;
      cg::comm_counter c2;
      const auto [v2, gx] = cg::value_and_grad(loss, 0)(x, w1l, w2l);
      (void)v2;
      check_equal(gx, ref_gx);
      CHECK(c2.count("all_reduce", "backward") == 2);

      // Traced: one joint graph whose collectives are ordinary nodes, compiled and scheduled.
      auto g = cg::trace(cg::value_and_grad(loss, {1, 2}), cg::input<float>(x.shape()), cg::input<float>(w1l.shape()),
                         cg::input<float>(w2l.shape()));
      CHECK(g.count("all_reduce") == 2);
      g.lint();
      cg::verify_collective_order(g, ctx);
      auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
      const auto [v3, h1, h2] = cg::compile(s, ctx)(x, w1l, w2l);
      check_equal(v3, ref_loss);
      check_equal(h1, chunk_of(ref_g1, n, r, 0));
      check_equal(h2, chunk_of(ref_g2, n, r, 1));
    });
  }
}

TEST_CASE("dtensor.grad.replicate_param_and_partial_loss.world2_world4") {
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n}, {"sp"});
      const auto x = whole({tokens, hidden}), w = whole({hidden}, 4);
      auto ref = [](auto xv, auto wv) {
        using V = decltype(xv);
        return cg::sum(V(xv * wv));
      };
      const auto [ref_loss, ref_gx, ref_gw] = cg::value_and_grad(ref, {0, 1})(x, w);
      const int r = ctx.rank();
      // x sharded on rows, w replicated: the loss is Partial(sum) (each rank's term); w's
      // gradient is every rank's term summed (the from_local boundary's all_reduce).
      auto loss = [&](auto xl, auto wl) {
        const auto xd = dt::from_local(xl, mesh, {cg::shard(0)});
        const auto wd = dt::from_local(wl, mesh, {cg::replicate()});
        const auto l = cg::sum(xd * wd);
        CHECK(l.placements() == std::vector{cg::partial()});
        return l;
      };
      cg::comm_counter c;
      const auto [term, gx, gw] = cg::value_and_grad(loss, {0, 1})(chunk_of(x, n, r, 0), w);
      check_equal(gx, chunk_of(ref_gx, n, r, 0));
      check_equal(gw, ref_gw);
      CHECK(c.count("all_reduce", "forward") == 0);
      CHECK(c.count("all_reduce", "backward") == 1);
      CHECK(c.total() == 1);
      // The value is this rank's term: the terms add up to the loss.
      check_equal(cg::all_reduce(term, "sum", cg::group(mesh)), ref_loss);
    });
  }
}

TEST_CASE("dtensor.grad.to_local_grad_placements.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2}, {"tp"});
    const auto x = whole({tokens, hidden}), w1 = whole({ffn, hidden}, 3), w2 = whole({hidden, ffn}, 5);
    const auto [ref_loss, ref_g1] = cg::value_and_grad(mlp_loss{}, 1)(x, w1, w2);
    (void)ref_loss;
    const auto w1l = chunk_of(w1, 2, ctx.rank(), 0);
    // The loss computed on local values: y.to_local() of a Replicate y is one value held by
    // every rank (its gradient counted once, as PyTorch's default grad_placements); with
    // grad_placements Partial(sum) each rank's local loss is a term of a sum over ranks.
    auto loss = [&](std::optional<std::vector<cg::placement>> gp) {
      return [&, gp](auto xl, auto a, auto w2full) {
        const auto xd = dt::from_local(xl, mesh, {cg::replicate()});
        const auto w2d = dt::from_local(w2full, mesh, {cg::replicate()});
        const auto h = relu_of(cg::linear(xd, dt::from_local(a, mesh, {cg::shard(0)})));
        const auto y = cg::linear(h, w2d.redistribute(mesh, {cg::shard(1)}));
        return cg::sum(y.redistribute(mesh, {cg::replicate()}).to_local(gp));
      };
    };
    const auto [v1, g1] = cg::value_and_grad(loss(std::nullopt), 1)(x, w1l, w2);
    (void)v1;
    check_equal(g1, chunk_of(ref_g1, 2, ctx.rank(), 0));
    const auto [v2, g2] = cg::value_and_grad(loss(std::vector{cg::partial()}), 1)(x, w1l, w2);
    (void)v2;
    check_equal(g2, cg::eval(chunk_of(ref_g1, 2, ctx.rank(), 0) * 2.f));
    // A grad placement per mesh dim, or a clear error.
    const auto d = dt::from_local(x, mesh, {cg::replicate()});
    CHECK(contains(error_of([&] { (void)d.to_local(std::vector{cg::replicate(), cg::replicate()}); }), "placements"));
  });
}

