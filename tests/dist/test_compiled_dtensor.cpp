// tests/dist/test_compiled_dtensor.cpp: dtensors across a compiled function's boundary
// (ccgraph/dist/compiled_dtensor.hpp: cg::compile_function with cg::dtensor<T> arguments and
// results), on the threads backend at 2 and 4 ranks. Each result is checked against the same
// dtensor program run eagerly and against one device's values; the layouts against what
// tracing gives (a Partial result stays Partial, as torch.compile's does); the guard by
// counting traces and compiles.
//
// Inputs are small integers and the meshes powers of two, so every sum is exact in float and
// the results compare bitwise.
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/dist/compiled_dtensor.hpp>
#include <ccgraph/schedule/verify.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

// One named namespace for the whole file: in a unity batch beside other dist tests, whose
// anonymous namespaces have helpers of the same names.
namespace compiled_dtensor_test {

using cg::shape_t;
using i64 = std::int64_t;
using dt = cg::dtensor<float>;
using places = std::vector<cg::placement>;

/// A whole tensor of `shape`: (i * 7 + seed) % 11 - 5, small integers.
cg::tensor<float> whole(const shape_t& shape, int seed = 0) {
  std::vector<float> v(static_cast<std::size_t>(cg::numel_of(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((static_cast<int>(i) * 7 + seed) % 11 - 5);
  return cg::tensor<float>::from(v, shape);
}

/// Chunk `index` of `n` of `t` along `dim`, cut as torch.chunk does (uneven: the last shorter
/// or empty), contiguous.
cg::tensor<float> torch_chunk(const cg::tensor<float>& t, int n, int index, int dim) {
  const auto [len, offset] = cg::local_shard_size_and_offset(t.shape()[static_cast<std::size_t>(dim)], n, index);
  return t.narrow(dim, offset, len).contiguous();
}

/// Equal shapes and values.
void check_equal(const cg::tensor<float>& got, const cg::tensor<float>& want) {
  REQUIRE(got.shape() == want.shape());
  CHECK(got.contiguous().to_vector() == want.contiguous().to_vector());
}

/// Equal layouts (mesh, placements, global shape) and local values.
void check_same_dtensor(const dt& got, const dt& want) {
  CHECK(got.mesh() == want.mesh());
  CHECK(got.placements() == want.placements());
  CHECK(got.shape() == want.shape());
  check_equal(got.to_local(), want.to_local());
}

/// relu of a dtensor (a pointwise op its sharding rule keeps laid out).
template <class D>
D relu_of(const D& h) {
  return cg::pointwise("relu", [](const auto& v) { return cg::relu(v); }, h);
}

/// Collective nodes of a graph.
i64 collectives_in(const cg::graph& g) {
  i64 n = 0;
  for (const cg::node* x : g.nodes()) n += x->is_collective() ? 1 : 0;
  return n;
}

// ================================ the seed: a Partial graph output ================================

TEST_CASE("compiled_dtensor.partial_graph_output.world2_world4") {
  // PyTorch's test_dtensor_partial_placement_graph_output: torch.compile(x + x) on a Partial
  // DTensor returns a Partial DTensor; matmul with a Replicate one and sum, then backward.
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      CAPTURE(n);
      const int r = ctx.rank();
      const cg::device_mesh mesh({n});
      const auto xl = whole({4, 4}, r + 1);  // this rank's term of x
      const auto y = whole({4, 4}, 7);
      cg::tensor<float> xfull = whole({4, 4}, 1);  // x on one device: the terms summed
      for (int k = 1; k < n; ++k) xfull = cg::eval(xfull + whole({4, 4}, k + 1));
      const auto xd = dt::from_local(xl, mesh, {cg::partial()});
      const auto yd = dt::from_local(y, mesh, {cg::replicate()});

      int traced = 0;
      auto twice = [&](auto x) {
        ++traced;
        return x + x;
      };
      auto f = cg::compile_function<dt>(twice, ctx);
      static_assert(std::is_same_v<decltype(f(xd)), dt>);
      const dt tmp = f(xd);
      // Partial as traced, its term twice this rank's; nothing reduced at the boundary.
      check_same_dtensor(tmp, xd + xd);
      CHECK(tmp.placements() == places{cg::partial()});
      const auto* c = f.compiled_for({{4, 4}});
      REQUIRE(c != nullptr);
      CHECK(collectives_in(c->exec().graph_ref()) == 0);
      check_equal(tmp.full_tensor(), cg::eval(xfull * 2.f));
      // Then eagerly, as the seed: matmul with the Replicate y (Partial still), summed.
      const auto out = cg::matmul(tmp, yd);
      CHECK(out.placements() == places{cg::partial()});
      const auto ref_out = cg::eval(cg::matmul(cg::eval(xfull * 2.f), y));
      check_equal(out.full_tensor(), ref_out);
      check_equal(cg::sum(out).full_tensor(), cg::eval(cg::sum(ref_out)));
      // profile gives the same dtensor.
      const auto p = f.profile(xd);
      check_same_dtensor(p.result, tmp);
      CHECK(traced == 2);
      CHECK(f.compiles() == 1);

      // The loss and gradients compiled: value_and_grad over the dtensors. The loss is each
      // rank's term (Partial); x's gradient is whole on every rank (a Partial input's gradient
      // is Replicate), y's gradient every rank's term summed (y's Replicate boundary).
      auto loss = [](auto x, auto w) { return cg::sum(cg::matmul(x + x, w)); };
      const auto [ref_loss, ref_gx, ref_gy] = cg::value_and_grad(loss, {0, 1})(xfull, y);
      auto vg = cg::compile_function<dt, dt>(cg::value_and_grad(loss, {0, 1}), ctx,
                                             {.passes = {"sink_waits", "raise_comms"}});
      const auto [value, gx, gy] = vg(xd, yd);
      static_assert(std::is_same_v<std::remove_cvref_t<decltype(gx)>, dt>);
      CHECK(value.placements() == places{cg::partial()});
      check_equal(value.full_tensor(), ref_loss);
      CHECK(gx.placements() == places{cg::replicate()});
      CHECK(gy.placements() == places{cg::replicate()});
      CHECK(gx.shape() == shape_t{4, 4});
      check_equal(gx.to_local(), ref_gx);
      check_equal(gy.to_local(), ref_gy);
      // What value_and_grad over dtensors gives without compile_function (local values in,
      // from_local inside): the same local gradients.
      auto by_hand = [&](auto a, auto b) {
        return loss(dt::from_local(a, mesh, {cg::partial()}), dt::from_local(b, mesh, {cg::replicate()}));
      };
      const auto [term, hx, hy] = cg::value_and_grad(by_hand, {0, 1})(xl, y);
      check_equal(value.to_local(), term);
      check_equal(gx.to_local(), hx);
      check_equal(gy.to_local(), hy);
      // And value_and_grad called eagerly on the dtensors: the same dtensors.
      const auto [ev, egx, egy] = cg::value_and_grad(loss, {0, 1})(xd, yd);
      check_same_dtensor(ev, value);
      check_same_dtensor(egx, gx);
      check_same_dtensor(egy, gy);
    });
  }
}

// ================================ uneven Shard(0) through pointwise and matmul ================================

TEST_CASE("compiled_dtensor.uneven_shard0_pointwise_matmul.world2_world4") {
  // 5 rows: 3 + 2 on 2 ranks, 2 + 2 + 1 + 0 on 4 (an empty shard).
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      CAPTURE(n);
      const int r = ctx.rank();
      const cg::device_mesh mesh({n}, {"sp"});
      const auto x = whole({5, 4}, 2), w = whole({4, 3}, 5);
      const auto xd = dt::from_local(torch_chunk(x, n, r, 0), mesh, {cg::shard(0)}, {.shape = shape_t{5, 4}});
      const auto wd = dt::from_local(w, mesh, {cg::replicate()});
      // A dtensor, a tensor and a vector of dtensors out: each as traced.
      auto program = [](auto a, auto b) {
        auto h = cg::matmul(relu_of(a * a - a), b);
        return std::tuple{h, h.full_tensor(), std::vector{h, h * 2.f}};
      };
      auto f = cg::compile_function<dt, dt>(program, ctx);
      const auto [h, full, hs] = f(xd, wd);
      static_assert(std::is_same_v<std::remove_cvref_t<decltype(full)>, cg::tensor<float>>);
      const auto [eh, efull, ehs] = program(xd, wd);
      CHECK(h.placements() == places{cg::shard(0)});
      CHECK(h.shape() == shape_t{5, 3});
      check_same_dtensor(h, eh);
      REQUIRE(hs.size() == 2);
      check_same_dtensor(hs[0], ehs[0]);
      check_same_dtensor(hs[1], ehs[1]);
      // One device's values: the shard of the whole result, and the whole of it.
      const auto ref = cg::eval(cg::matmul(cg::eval(cg::relu(x * x - x)), w));
      check_equal(h.to_local(), torch_chunk(ref, n, r, 0));
      check_equal(full, ref);
      check_equal(efull, ref);
      check_equal(hs[1].full_tensor(), cg::eval(ref * 2.f));
    });
  }
}

// ================================ a redistribution inside the graph ================================

TEST_CASE("compiled_dtensor.shard1_redistribute_replicate_in_graph.world2_world4") {
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      CAPTURE(n);
      const int r = ctx.rank();
      const cg::device_mesh mesh({n}, {"tp"});
      const auto x = whole({4, 8}, 3);
      const auto xd = dt::from_local(torch_chunk(x, n, r, 1), mesh, {cg::shard(1)});
      auto gathered = [&](auto a) { return (a * 3.f).redistribute(mesh, {cg::replicate()}); };
      auto f = cg::compile_function<dt>(gathered, ctx);
      cg::comm_counter counter;  // counts what tracing records (a compiled graph's runs are not counted)
      const dt y = f(xd);
      CHECK(counter.count("all_gather") == 1);
      CHECK(counter.total() == 1);
      CHECK(y.placements() == places{cg::replicate()});
      check_same_dtensor(y, gathered(xd));
      check_equal(y.to_local(), cg::eval(x * 3.f));
      const auto* c = f.compiled_for({{4, 8 / n}});
      REQUIRE(c != nullptr);
      CHECK(c->exec().graph_ref().count("all_gather_into_tensor") == 1);
      CHECK(c->exec().graph_ref().count("wait_tensor") == 1);
    });
  }
}

TEST_CASE("compiled_dtensor.2d_mesh_scheduled.world4") {
  // A [dp, tp] mesh: x [Shard(0), Shard(1)] gathered on tp inside the graph, matmul with a
  // Replicate w, a column sum (Partial on dp) out beside it; scheduled with sink_waits and
  // raise_comms, equal to the unscheduled graph, the eager program and one device.
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    const auto coord = mesh.coordinate(ctx.rank());
    const auto x = whole({8, 6}, 1), w = whole({6, 4}, 4);
    const auto xl = torch_chunk(torch_chunk(x, 2, static_cast<int>(coord[0]), 0), 2, static_cast<int>(coord[1]), 1);
    const auto xd = dt::from_local(xl, mesh, {cg::shard(0), cg::shard(1)});
    const auto wd = dt::from_local(w, mesh, {cg::replicate(), cg::replicate()});
    auto program = [&](auto a, auto b) {
      auto y = cg::matmul(a.redistribute(mesh, {cg::shard(0), cg::replicate()}), b);
      return std::tuple{y, cg::sum(y, {0})};
    };
    auto plain = cg::compile_function<dt, dt>(program, ctx);
    auto scheduled = cg::compile_function<dt, dt>(program, ctx, {.passes = {"sink_waits", "raise_comms"}});
    const auto [y0, s0] = plain(xd, wd);
    const auto [y1, s1] = scheduled(xd, wd);
    const auto [ey, es] = program(xd, wd);
    CHECK(y1.placements() == places{cg::shard(0), cg::replicate()});
    CHECK(s1.placements() == places{cg::partial(), cg::replicate()});
    check_same_dtensor(y1, ey);
    check_same_dtensor(s1, es);
    check_same_dtensor(y0, y1);
    check_same_dtensor(s0, s1);
    const auto ref = cg::eval(cg::matmul(x, w));
    check_equal(y1.full_tensor(), ref);
    check_equal(s1.full_tensor(), cg::eval(cg::sum(ref, {0})));
    const auto* c = scheduled.compiled_for({xl.shape(), w.shape()});
    REQUIRE(c != nullptr);
    const cg::graph& g = c->exec().graph_ref();
    CHECK(g.count("all_gather_into_tensor") == 1);
    g.lint();
    cg::verify_collective_order(g, ctx);
  });
}

// ================================ the guard ================================

TEST_CASE("compiled_dtensor.guard_retraces_on_layout_change.world2") {
  run(2, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    const cg::device_mesh tp({2}, {"tp"}), dp({2}, {"dp"});
    const auto x = whole({4, 4}, 6);
    const auto term = whole({4, 4}, r);
    for (auto guard : {cg::function_guard::trace, cg::function_guard::arguments}) {
      CAPTURE(static_cast<int>(guard));
      int traced = 0;
      // The same graph (one add node) for every layout below: only the guard tells them apart.
      auto twice = [&](auto a) {
        ++traced;
        return a + a;
      };
      auto f = cg::compile_function<dt>(twice, ctx, {.guard = guard});
      const bool every_call = guard == cg::function_guard::trace;
      // (argument, a new layout?) in call order. Partial and Replicate share a local and global
      // shape; Shard(0) of 4 x 4 and Replicate of 2 x 4 share the local shape; the meshes
      // differ in their dim name only.
      const std::vector<std::pair<dt, bool>> calls{
          {dt::from_local(term, tp, {cg::partial()}), true},
          {dt::from_local(term, tp, {cg::partial()}), false},  // the same layout again
          {dt::from_local(x, tp, {cg::replicate()}), true},
          {dt::from_local(term, tp, {cg::partial("max")}), true},
          {dt::from_local(torch_chunk(x, 2, r, 0), tp, {cg::shard(0)}), true},
          {dt::from_local(torch_chunk(x, 2, 0, 0), tp, {cg::replicate()}), true},
          {dt::from_local(x, dp, {cg::replicate()}), true},
          {dt::from_local(term, tp, {cg::partial()}), false},
          {dt::from_local(x, dp, {cg::replicate()}), false},
      };
      std::size_t compiles = 0;
      for (std::size_t i = 0; i < calls.size(); ++i) {
        CAPTURE(i);
        const auto& [d, fresh] = calls[i];
        const int before = traced;
        const dt got = f(d);
        compiles += fresh ? 1 : 0;
        CHECK(f.compiles() == compiles);
        CHECK(traced - before == (every_call || fresh ? 1 : 0));
        // As the eager program: laid out as the argument, values twice its local; but a
        // Partial(max) is reduced first (add is linear in a Partial(sum) only), so Replicate.
        check_same_dtensor(got, d + d);
        CHECK(got.placements() == (d.placements()[0].is_partial(cg::reduce_op::max) ? places{cg::replicate()}
                                                                                     : d.placements()));
        check_equal(got.to_local(), d.placements()[0].is_partial(cg::reduce_op::max)
                                        ? cg::eval(d.full_tensor() * 2.f)
                                        : cg::eval(d.to_local() * 2.f));
      }
      CHECK(f.signatures() == 6);
      CHECK(f.traces() == (every_call ? calls.size() : 6u));
    }
  });
}

// ================================ gradients ================================

TEST_CASE("compiled_dtensor.value_and_grad.megatron.world2_world4") {
  // Column-parallel w1 (Shard(0)), row-parallel w2 (Shard(1)), x Replicate: the gradients come
  // back laid out as their parameters, equal to one device's pieces and to what value_and_grad
  // gives on local values with from_local inside.
  constexpr i64 tokens = 8, hidden = 8, ffn = 16;
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      CAPTURE(n);
      const int r = ctx.rank();
      const cg::device_mesh mesh({n}, {"tp"});
      const auto x = whole({tokens, hidden}), w1 = whole({ffn, hidden}, 3), w2 = whole({hidden, ffn}, 5);
      auto one_device = [](auto xv, auto a, auto b) {
        using V = decltype(xv);
        const V h = cg::relu(cg::linear(xv, a));
        return cg::sum(cg::linear(h, b));
      };
      const auto [ref_loss, ref_gx, ref_g1, ref_g2] = cg::value_and_grad(one_device, {0, 1, 2})(x, w1, w2);
      auto loss = [&](auto xd, auto a, auto b) {
        const auto y = cg::linear(relu_of(cg::linear(xd, a)), b);  // Partial(sum)
        return cg::sum(y.redistribute(mesh, {cg::replicate()}));
      };
      const auto xd = dt::from_local(x, mesh, {cg::replicate()});
      const auto w1d = dt::from_local(torch_chunk(w1, n, r, 0), mesh, {cg::shard(0)});
      const auto w2d = dt::from_local(torch_chunk(w2, n, r, 1), mesh, {cg::shard(1)});
      auto step = cg::compile_function<dt, dt, dt>(cg::value_and_grad(loss, {0, 1, 2}), ctx,
                                                   {.passes = {"sink_waits", "raise_comms"}});
      const auto [value, gx, g1, g2] = step(xd, w1d, w2d);
      CHECK(value.placements() == places{cg::replicate()});
      CHECK(gx.placements() == places{cg::replicate()});
      CHECK(g1.placements() == places{cg::shard(0)});
      CHECK(g2.placements() == places{cg::shard(1)});
      CHECK(g1.shape() == w1.shape());
      check_equal(value.to_local(), ref_loss);
      check_equal(gx.to_local(), ref_gx);
      check_equal(g1.to_local(), torch_chunk(ref_g1, n, r, 0));
      check_equal(g2.to_local(), torch_chunk(ref_g2, n, r, 1));
      check_equal(g1.full_tensor(), ref_g1);
      check_equal(g2.full_tensor(), ref_g2);
      // The same as the local-value form (tensors in, from_local inside), eagerly.
      auto by_hand = [&](auto xl, auto a, auto b) {
        return loss(dt::from_local(xl, mesh, {cg::replicate()}), dt::from_local(a, mesh, {cg::shard(0)}),
                    dt::from_local(b, mesh, {cg::shard(1)}));
      };
      const auto [hv, hx, h1, h2] = cg::value_and_grad(by_hand, {0, 1, 2})(x, w1d.to_local(), w2d.to_local());
      check_equal(value.to_local(), hv);
      check_equal(gx.to_local(), hx);
      check_equal(g1.to_local(), h1);
      check_equal(g2.to_local(), h2);
      const auto [ev, egx, eg1, eg2] = cg::value_and_grad(loss, {0, 1, 2})(xd, w1d, w2d);  // eagerly
      check_same_dtensor(ev, value);
      check_same_dtensor(egx, gx);
      check_same_dtensor(eg1, g1);
      check_same_dtensor(eg2, g2);
      // One graph: the forward's all_reduce and the backward's two (the loss's gradient, x's
      // Replicate boundary); a second step runs it again.
      const auto* c = step.compiled_for({x.shape(), w1d.to_local().shape(), w2d.to_local().shape()});
      REQUIRE(c != nullptr);
      CHECK(c->exec().graph_ref().count("all_reduce") == 3);
      const auto [v2, gx2, g12, g22] = step(xd, w1d, w2d);
      check_same_dtensor(g12, g1);
      CHECK(step.compiles() == 1);
    });
  }
}

// ================================ errors ================================

TEST_CASE("compiled_dtensor.errors.world2") {
  run(2, [](cg::rank_context& ctx) {
    const auto x = whole({4, 4});
    // A mesh of 4 ranks in a world of 2: made for another world.
    const cg::device_mesh four({4});
    const auto d4 = dt::from_local(x, four, {cg::replicate()});
    auto f = cg::compile_function<dt>([](auto a) { return a + a; }, ctx);
    const std::string e0 = error_of([&] { (void)f(d4); });
    CHECK(contains(e0, "compile_function"));
    CHECK(contains(e0, "argument 0"));
    CHECK(contains(e0, four.str()));
    CHECK(contains(e0, "world has 2 ranks"));
    CHECK(f.signatures() == 0);  // nothing kept; a good call still compiles
    const cg::device_mesh two({2});
    CHECK(f(dt::from_local(x, two, {cg::replicate()})).placements() == places{cg::replicate()});
    // The index is the argument's own, host and tensor arguments counted.
    auto g = cg::compile_function<float, cg::host_arg<int>, dt>([](auto a, int, auto b) { return std::tuple{a, b}; },
                                                                ctx);
    const std::string e2 = error_of([&] { (void)g(x, 1, d4); });
    CHECK(contains(e2, "compile_function: argument 2"));
    // A plain tensor where a dtensor was declared (and the reverse) does not compile: no call
    // takes it (tests/compile_fail/compile_function_tensor_for_dtensor.cpp is the diagnostic).
    static_assert(!std::is_invocable_v<decltype(f)&, const cg::tensor<float>&>);
    static_assert(std::is_invocable_v<decltype(f)&, const dt&>);
    auto t = cg::compile_function<float>([](auto a) { return a; }, ctx);
    static_assert(!std::is_invocable_v<decltype(t)&, const dt&>);
    // value_and_grad over dtensors differentiates dtensors only; a tensor beside them is data.
    auto loss = [](auto a, auto b) {
      (void)a;
      return cg::sum(b);
    };
    auto mixed = cg::compile_function<float, dt>(cg::value_and_grad(loss, {0, 1}), ctx);
    const auto d2 = dt::from_local(x, two, {cg::replicate()});
    const std::string e3 = error_of([&] { (void)mixed(x, d2); });
    CHECK(contains(e3, "value_and_grad: input 0 is a tensor among dtensor inputs"));
    auto data = cg::compile_function<float, dt>(cg::value_and_grad(loss, 1), ctx);
    const auto [v, gb] = data(x, d2);
    CHECK(v.placements() == places{cg::replicate()});
    check_equal(v.to_local(), cg::eval(cg::sum(x)));
    CHECK(gb.placements() == places{cg::replicate()});
    check_equal(gb.to_local(), cg::full<float>({4, 4}, 1.f));
  });
}

}  // namespace compiled_dtensor_test
