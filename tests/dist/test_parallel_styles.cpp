// tests/dist/test_parallel_styles.cpp: gradients of dtensor programs (cg::value_and_grad through
// from_local, redistribute and to_local) and the tensor-parallel styles (dist/parallel.hpp) on
// the threads backend at 2 and 4 ranks: each equal to the same program on one device, forward
// and backward, with the collectives each phase issues.
//
// Inputs are small integers and the meshes powers of two, so every sum is exact in float and
// the sharded programs equal the single-device ones bitwise.
#include <doctest/doctest.h>

#include <boost/hana/define_struct.hpp>

#include <cmath>
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

// One named namespace for the whole file: in a unity batch beside test_sharding.cpp, whose
// anonymous namespace has helpers of the same names.
namespace parallel_styles_test {

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

// ================================ parallel styles ================================



/// The Megatron MLP's parameters: w1 (ffn, hidden), w2 (hidden, ffn).
template <class V>
struct mlp_params {
  BOOST_HANA_DEFINE_STRUCT(mlp_params, (V, w1), (V, w2));
};

/// Colwise w1, rowwise w2: PyTorch's Megatron plan.
const cg::parallelize_plan megatron_plan{{"w1", cg::colwise_parallel{}}, {"w2", cg::rowwise_parallel{}}};

/// The sequence-parallel MLP on (tokens, hidden) activations sharded on tokens: layer_norm on
/// the shards, all_gather before the column-parallel w1, reduce_scatter after the row-parallel w2.
const cg::parallelize_plan sp_plan{{"ln_w", cg::sequence_parallel{.sequence_dim = 0}},
                                   {"ln_b", cg::sequence_parallel{.sequence_dim = 0}},
                                   {"w1", cg::colwise_parallel{.input_layouts = cg::shard(0)}},
                                   {"w2", cg::rowwise_parallel{.output_layouts = cg::shard(0)}}};

/// The sequence-parallel MLP's loss on one device.
struct sp_mlp_loss {
  template <class V>
  auto operator()(const V& x, const V& g, const V& b, const V& w1, const V& w2) const {
    const V n = cg::layer_norm(x, g, b, 1e-5);
    const V h = cg::relu(cg::linear(n, w1));
    return cg::sum(cg::linear(h, w2));
  }
};

/// `a` and `b` equal in shape and within `tol` relative.
void check_close(const cg::tensor<float>& a, const cg::tensor<float>& b, double tol = 1e-4) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  for (std::size_t i = 0; i < x.size(); ++i)
    CHECK(std::abs(double(x[i]) - double(y[i])) <= tol * (1 + std::abs(double(y[i]))));
}



TEST_CASE("parallel.megatron_mlp.forward_backward.world2_world4") {
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n}, {"tp"});
      const auto x = whole({tokens, hidden}), w1 = whole({ffn, hidden}, 3), w2 = whole({hidden, ffn}, 5);
      const auto [ref_loss, ref_g1, ref_g2] = cg::value_and_grad(mlp_loss{}, {1, 2})(x, w1, w2);
      const int r = ctx.rank();

      // Eagerly: the whole weights sharded by the plan (no communication).
      const auto m = cg::parallelize_module(mlp_params<cg::tensor<float>>{w1, w2}, mesh, megatron_plan);
      CHECK(m["w1"].placements() == std::vector{cg::shard(0)});
      CHECK(m["w2"].placements() == std::vector{cg::shard(1)});
      check_equal(m["w1"].to_local(), chunk_of(w1, n, r, 0));
      check_equal(m["w2"].to_local(), chunk_of(w2, n, r, 1));
      {
        cg::comm_counter c;
        const auto h = cg::relu(m.linear("w1", x).to_local());
        const auto y = m.linear("w2", cg::tensor<float>(h));
        CHECK(y.placements() == std::vector{cg::replicate()});
        check_equal(y.to_local(), cg::linear(cg::tensor<float>(cg::relu(cg::linear(x, w1))), w2));
        CHECK(c.count("all_reduce") == 1);
        CHECK(c.total() == 1);
      }

      // Differentiated: the step takes the local shards, the module is rebuilt from them.
      auto step = cg::value_and_grad(
          [&](auto xl, auto a, auto b) {
            using V = decltype(xl);
            const auto tp = cg::parallelize_module(mlp_params<V>{a, b}, mesh, megatron_plan, {.local_shards = true});
            const V h = cg::relu(tp.linear("w1", xl).to_local());
            return cg::sum(tp.linear("w2", h));
          },
          {1, 2});
      cg::comm_counter c;
      const auto [loss, g1, g2] = step(x, m["w1"].to_local(), m["w2"].to_local());
      check_equal(loss, ref_loss);
      check_equal(g1, chunk_of(ref_g1, n, r, 0));
      check_equal(g2, chunk_of(ref_g2, n, r, 1));
      // The gradients of the whole weights assembled from the shards equal one device's.
      check_equal(cg::all_gather_tensor(g1, 0, cg::group(mesh)), ref_g1);
      check_equal(cg::all_gather_tensor(g2, 1, cg::group(mesh)), ref_g2);
      CHECK(c.count("all_reduce", "forward") == 1);
      CHECK(c.count("all_reduce", "backward") == 1);
    });
  }
}

TEST_CASE("parallel.sequence_parallel_mlp.forward_backward.world2_world4") {
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n}, {"tp"});
      const auto x = whole({tokens, hidden}), lw = whole({hidden}, 1), lb = whole({hidden}, 2);
      const auto w1 = whole({ffn, hidden}, 3), w2 = whole({hidden, ffn}, 5);
      const auto [ref_loss, ref_gw, ref_gb, ref_g1, ref_g2] =
          cg::value_and_grad(sp_mlp_loss{}, {1, 2, 3, 4})(x, lw, lb, w1, w2);
      const int r = ctx.rank();
      using map = std::map<std::string, cg::tensor<float>>;
      const auto m = cg::parallelize_module(map{{"ln_w", lw}, {"ln_b", lb}, {"w1", w1}, {"w2", w2}}, mesh, sp_plan);
      CHECK(m["ln_w"].placements() == std::vector{cg::replicate()});
      CHECK(m["w1"].placements() == std::vector{cg::shard(0)});
      CHECK(m["w2"].placements() == std::vector{cg::shard(1)});
      // partial: the replicated norm's gradients stay each rank's term (parallelize_options::
      // partial_grads, as PyTorch leaves them): no all_reduce in the backward, and their sum
      // over the ranks is the whole gradient.
      for (const bool partial : {false, true}) {
        INFO("partial_grads ", partial);
        auto step = cg::value_and_grad(
            [&](auto xl, auto g, auto b, auto a, auto c) {
              using V = decltype(xl);
              const auto tp = cg::parallelize_module(std::map<std::string, V>{{"ln_w", g}, {"ln_b", b}, {"w1", a}, {"w2", c}},
                                                     mesh, sp_plan, {.local_shards = true, .partial_grads = partial});
              const auto normed = tp.layer_norm("ln_w", xl, "ln_b");  // on the token shards
              CHECK(normed.placements() == std::vector{cg::shard(0)});
              const V h = cg::relu(tp.linear("w1", normed).to_local());  // all_gather first
              const auto y = tp.linear("w2", h);                          // reduce_scatter last
              CHECK(y.placements() == std::vector{cg::shard(0)});
              return cg::sum(y);  // Partial(sum): each rank's tokens
            },
            {1, 2, 3, 4});
        cg::comm_counter c;
        const auto [term, gw, gb, g1, g2] =
            step(chunk_of(x, n, r, 0), m["ln_w"].to_local(), m["ln_b"].to_local(), m["w1"].to_local(), m["w2"].to_local());
        const auto counts = c.counts_by_phase();
        const i64 total = c.total();
        const i64 ag_fwd = c.count("all_gather", "forward"), rs_fwd = c.count("reduce_scatter", "forward");
        const i64 ar_fwd = c.count("all_reduce", "forward"), ag_bwd = c.count("all_gather", "backward");
        const i64 rs_bwd = c.count("reduce_scatter", "backward"), ar_bwd = c.count("all_reduce", "backward");
        check_close(cg::all_reduce(term, "sum", cg::group(mesh)), ref_loss);
        if (partial) {  // each rank's term: summed here
          check_close(cg::all_reduce(gw, "sum", cg::group(mesh)), ref_gw);
          check_close(cg::all_reduce(gb, "sum", cg::group(mesh)), ref_gb);
        } else {  // replicated: summed over the ranks in the backward
          check_close(gw, ref_gw);
          check_close(gb, ref_gb);
        }
        check_close(g1, chunk_of(ref_g1, n, r, 0));
        check_close(g2, chunk_of(ref_g2, n, r, 1));
        CHECK(ag_fwd == 1);
        CHECK(rs_fwd == 1);
        CHECK(ar_fwd == 0);
        // Backward: the transposes (all_gather of the output's gradient, reduce_scatter of the
        // input's), and one all_reduce per replicated parameter unless they stay partial.
        CHECK(ag_bwd == 1);
        CHECK(rs_bwd == 1);
        CHECK(ar_bwd == (partial ? 0 : 2));
        CHECK(counts.size() == 2);
        CHECK(total == (partial ? 4 : 6));
      }
    });
  }
}

TEST_CASE("parallel.tp_block.one_all_gather_shared_reduce_scatter_last.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2}, {"tp"});
    const cg::parallelize_plan plan{
        {"block", cg::prepare_module_input{.input_layouts = {cg::shard(0)}, .desired_input_layouts = {cg::replicate()}}},
        {"w_gate", cg::colwise_parallel{}},
        {"w_up", cg::colwise_parallel{}},
        {"w_down", cg::rowwise_parallel{.output_layouts = cg::shard(0)}}};
    const auto x = whole({tokens, hidden}), wg = whole({ffn, hidden}, 3), wu = whole({ffn, hidden}, 4),
               wd = whole({hidden, ffn}, 5);
    using map = std::map<std::string, cg::tensor<float>>;
    const auto m = cg::parallelize_module(map{{"w_gate", wg}, {"w_up", wu}, {"w_down", wd}}, mesh, plan);
    auto block = [&](auto xl, auto a, auto b, auto c) {
      using V = decltype(xl);
      const auto tp = cg::parallelize_module(std::map<std::string, V>{{"w_gate", a}, {"w_up", b}, {"w_down", c}}, mesh,
                                             plan, {.local_shards = true});
      const auto xr = tp.prepare_input("block", xl);  // the one all_gather
      const V gate = cg::relu(tp.linear("w_gate", xr).to_local());
      const V up = tp.linear("w_up", xr).to_local();
      const V h = gate * up;
      return tp.linear("w_down", h).to_local();  // reduce_scatter to the token shards
    };
    const int r = ctx.rank();
    const auto xl = chunk_of(x, 2, r, 0);
    auto g = cg::trace(block, cg::input<float>(xl.shape()), cg::input<float>(m["w_gate"].to_local().shape()),
                       cg::input<float>(m["w_up"].to_local().shape()), cg::input<float>(m["w_down"].to_local().shape()));
    CHECK(g.count("all_gather_into_tensor") == 1);
    CHECK(g.count("reduce_scatter_tensor") == 1);
    CHECK(g.count("all_reduce") == 0);
    auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
    const auto ops = cg::op_sequence(s);
    std::ptrdiff_t gather = -1, gather_wait = -1, first_linear = -1, scatter = -1, last_collective = -1;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const auto k = static_cast<std::ptrdiff_t>(i);
      if (ops[i] == "all_gather_into_tensor") gather = k;
      if (ops[i] == "wait_tensor" && gather >= 0 && gather_wait < 0) gather_wait = k;
      if (ops[i].find("linear") != std::string::npos && first_linear < 0) first_linear = k;
      if (ops[i] == "reduce_scatter_tensor") scatter = k;
      if (ops[i] == "all_gather_into_tensor" || ops[i] == "reduce_scatter_tensor") last_collective = k;
    }
    INFO(s);
    CHECK(gather >= 0);
    CHECK(gather_wait > gather);
    CHECK(first_linear > gather_wait);  // the shared gather is waited on before the first matmul
    CHECK(scatter == last_collective);  // the reduce_scatter is the last collective
    // The same values as one device: this rank's tokens of the block's output.
    const auto ref = [&] {
      const cg::tensor<float> gate = cg::relu(cg::linear(x, wg));
      const cg::tensor<float> h = gate * cg::linear(x, wu);
      return cg::linear(h, wd);
    }();
    check_equal(cg::compile(s, ctx)(xl, m["w_gate"].to_local(), m["w_up"].to_local(), m["w_down"].to_local()),
                chunk_of(ref, 2, r, 0));
  });
}

TEST_CASE("parallel.errors.world2") {
  run(2, [](cg::rank_context&) {
    const cg::device_mesh mesh({2}, {"tp"});
    const auto w = whole({4, 6}), odd = whole({3, 6}), cube = whole({2, 2, 2});
    using map = std::map<std::string, cg::tensor<float>>;
    // A plan naming no parameter.
    auto e = error_of([&] { (void)cg::parallelize_module(map{{"w1", w}}, mesh, {{"w3", cg::colwise_parallel{}}}); });
    CHECK(contains(e, "parallelize_module: the plan names 'w3' (colwise_parallel), which is not a parameter"));
    CHECK(contains(e, "'w1'"));
    // A style on a tensor of the wrong rank, a dim the mesh does not divide, a 2-d mesh.
    e = error_of([&] { (void)cg::parallelize_module(map{{"w", cube}}, mesh, {{"w", cg::rowwise_parallel{}}}); });
    CHECK(contains(e, "'w' (rowwise_parallel) has shape [2, 2, 2]"));
    e = error_of([&] { (void)cg::parallelize_module(map{{"w", odd}}, mesh, {{"w", cg::colwise_parallel{}}}); });
    CHECK(contains(e, "dim 0 (size 3) must be a multiple of the mesh size 2"));
    e = error_of([&] {
      (void)cg::parallelize_module(map{{"w", w}}, cg::device_mesh({1, 2}, {"dp", "tp"}), {{"w", cg::colwise_parallel{}}});
    });
    CHECK(contains(e, "takes a 1-d mesh"));
    e = error_of([&] {
      (void)cg::parallelize_module(map{{"w", w}}, mesh, {{"w", cg::colwise_parallel{}}, {"w", cg::rowwise_parallel{}}});
    });
    CHECK(contains(e, "names 'w' twice"));
    // Calls that do not fit the style.
    const auto m = cg::parallelize_module(map{{"w", w}, {"g", whole({6})}}, mesh,
                                          {{"w", cg::colwise_parallel{}}, {"g", cg::sequence_parallel{}}});
    e = error_of([&] { (void)m.linear("g", whole({2, 6})); });
    CHECK(contains(e, "parallel_module::linear: 'g' is sequence_parallel"));
    e = error_of([&] { (void)m.param("v"); });
    CHECK(contains(e, "no parameter 'v'"));
    e = error_of([&] { (void)m.prepare_input("nothing", w); });
    CHECK(contains(e, "the plan has no entry 'nothing'"));
  });
}

}  // namespace parallel_styles_test
