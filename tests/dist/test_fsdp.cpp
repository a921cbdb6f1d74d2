// tests/dist/test_fsdp.cpp: FSDP (dist/fsdp.hpp, cg::fully_shard) on the threads backend at 2
// and 4 ranks, and 2-D FSDP on "dp" x tensor parallel on "tp" on a 2 x 2 mesh: parameters laid
// out Shard(0) as torch.chunk pieces, forward and backward equal to one device (eager, through
// cg::value_and_grad, and compiled), the collectives each phase issues, the traced schedule
// (all_gathers raised ahead of the compute, reduce_scatters for the gradients) and the full
// parameters' lifetimes in the memory plan.
//
// Inputs are small integers and the meshes powers of two, so sums are exact in float; the
// comparisons still allow 1e-4 relative (check_close), for sums reassociated across ranks.
#include <doctest/doctest.h>

#include <boost/hana/define_struct.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/dtensor.hpp>
#include <ccgraph/schedule/memory_plan.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/schedule/verify.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

// A named namespace: CI unity-builds the tests in batches, beside files whose anonymous
// namespaces have helpers of the same names.
namespace fsdp_test {

using cg::shape_t;
using i64 = std::int64_t;
using map = std::map<std::string, cg::tensor<float>>;

/// A whole tensor of `shape`: (i * 7 + seed) % 11 - 5, small integers.
cg::tensor<float> whole(const shape_t& shape, int seed = 0) {
  std::vector<float> v(static_cast<std::size_t>(cg::numel_of(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((static_cast<int>(i) * 7 + seed) % 11 - 5);
  return cg::tensor<float>::from(v, shape);
}

/// torch.chunk(t, n, dim)[index], contiguous: pieces of ceil(size / n), the last ones shorter
/// or empty.
cg::tensor<float> torch_chunk(const cg::tensor<float>& t, int n, int index, int dim) {
  const i64 size = t.shape()[static_cast<std::size_t>(dim)];
  const i64 step = (size + n - 1) / n;
  const i64 start = std::min<i64>(step * index, size);
  return t.narrow(dim, start, std::min<i64>(step, size - start)).contiguous();
}

/// `a` and `b` equal in shape and within `tol` relative (the test's stated tolerance).
void check_close(const cg::tensor<float>& a, const cg::tensor<float>& b, double tol = 1e-4) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  for (std::size_t i = 0; i < x.size(); ++i)
    CHECK(std::abs(double(x[i]) - double(y[i])) <= tol * (1 + std::abs(double(y[i]))));
}

/// check_close with the caller's line in the failure's message.
#define FSDP_CHECK_CLOSE(...)        \
  do {                               \
    INFO("checked at line ", __LINE__); \
    check_close(__VA_ARGS__);        \
  } while (0)

/// The MLP's parameters: w1 (ffn, hidden), w2 (hidden, ffn).
template <class V>
struct mlp_params {
  BOOST_HANA_DEFINE_STRUCT(mlp_params, (V, w1), (V, w2));
};

/// The MLP on one device: linear(relu(linear(x, w1)), w2).
struct mlp_out {
  template <class X, class W1, class W2>
  auto operator()(const X& x, const W1& w1, const W2& w2) const {
    const X h = cg::relu(cg::linear(x, w1));
    return cg::linear(h, w2);
  }
};

/// Its loss: the sum of the output.
struct mlp_loss {
  template <class X, class W1, class W2>
  auto operator()(const X& x, const W1& w1, const W2& w2) const {
    return cg::sum(mlp_out{}(x, w1, w2));
  }
};

/// Colwise w1, rowwise w2: PyTorch's Megatron plan.
const cg::parallelize_plan megatron_plan{{"w1", cg::colwise_parallel{}}, {"w2", cg::rowwise_parallel{}}};

// ffn = 14 rows: torch.chunk pieces of 4, 4, 4, 2 on 4 ranks (uneven), 7, 7 on 2.
constexpr i64 tokens = 8, hidden = 8, ffn = 14;

/// The FSDP step on this rank's batch: w1 and w2 unsharded where they are used.
struct fsdp_step {
  cg::device_mesh dp;
  std::map<std::string, shape_t> shapes;
  bool reshard = true;
  template <class V>
  auto operator()(const V& xl, const V& a, const V& b) const {
    const auto m = cg::fully_shard(std::map<std::string, V>{{"w1", a}, {"w2", b}}, dp,
                                   {.local_shards = true, .shapes = shapes, .reshard_after_forward = reshard});
    const V h = cg::relu(cg::linear(xl, m.unshard("w1")));
    return cg::sum(cg::linear(h, m.unshard("w2")));  // this rank's batch: a term of the loss
  }
};

// ================================ layout ================================

/// The joint graph of `step` (its value and the gradients of w1 and w2) traced at the local
/// pieces' shapes, linted and checked for the ranks' collective order, with its 3 all_gathers
/// (two forward, w2 again for the backward) and 2 reduce_scatters.
template <class Step, class Module>
auto traced_step(const Step& step, const cg::tensor<float>& xl, const Module& fs, cg::rank_context& ctx) {
  auto g = cg::trace(cg::value_and_grad(step, {1, 2}), cg::input<float>(xl.shape()),
                     cg::input<float>(fs["w1"].to_local().shape()), cg::input<float>(fs["w2"].to_local().shape()));
  g.lint();
  cg::verify_collective_order(g, ctx);
  CHECK(g.count("all_gather_into_tensor") == 3);
  CHECK(g.count("reduce_scatter_tensor") == 2);
  return g;
}

TEST_CASE("fsdp.fully_shard.layout_and_unshard.world2_world4") {
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n}, {"dp"});
      const int r = ctx.rank();
      const auto w1 = whole({ffn, hidden}, 3), w2 = whole({hidden, ffn}, 5), b = whole({5}, 1);
      cg::comm_counter c;
      const auto fs = cg::fully_shard(map{{"w1", w1}, {"w2", w2}, {"b", b}}, mesh);
      CHECK(c.total() == 0);  // each rank keeps its piece of the whole: no communication
      CHECK(fs.names() == std::vector<std::string>{"b", "w1", "w2"});
      for (const auto& name : fs.names()) CHECK(fs[name].placements() == std::vector{cg::shard(0)});
      CHECK(fs.shapes().at("w1") == shape_t{ffn, hidden});
      CHECK(fs.shapes().at("b") == shape_t{5});
      // torch.chunk pieces: w1's 14 rows are 7, 7 or 4, 4, 4, 2; b's 5 are 3, 2 or 2, 2, 1, 0.
      FSDP_CHECK_CLOSE(fs["w1"].to_local(), torch_chunk(w1, n, r, 0));
      FSDP_CHECK_CLOSE(fs["w2"].to_local(), torch_chunk(w2, n, r, 0));
      CHECK(fs["b"].to_local().shape() == torch_chunk(b, n, r, 0).shape());
      // Eager unshard: one all_gather each, the whole parameter on every rank.
      FSDP_CHECK_CLOSE(fs.unshard("w1"), w1);
      FSDP_CHECK_CLOSE(fs.unshard("b"), b);
      CHECK(c.count("all_gather") == 2);
      const auto all = fs.unshard_all();
      FSDP_CHECK_CLOSE(all.at("w2"), w2);
      CHECK(c.count("all_gather") == 5);
      CHECK(c.total() == 5);
      // The pieces taken back, with their global shapes: the same layout.
      const auto back = cg::fully_shard(fs.local_params(), mesh, {.local_shards = true, .shapes = fs.shapes()});
      CHECK(back.shapes() == fs.shapes());
      FSDP_CHECK_CLOSE(back.unshard("w1"), w1);
      // A struct of named parameters, as parallelize_module takes.
      const auto st = cg::fully_shard(mlp_params<cg::tensor<float>>{w1, w2}, mesh);
      CHECK(st.names() == std::vector<std::string>{"w1", "w2"});
      FSDP_CHECK_CLOSE(st["w2"].to_local(), torch_chunk(w2, n, r, 0));
    });
  }
}

// ============================ forward and backward ============================

TEST_CASE("fsdp.mlp.forward_backward.world2_world4") {
  for (int n : {2, 4}) {
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n}, {"dp"});
      const int r = ctx.rank();
      const auto x = whole({tokens, hidden}), w1 = whole({ffn, hidden}, 3), w2 = whole({hidden, ffn}, 5);
      const auto [ref_loss, ref_g1, ref_g2] = cg::value_and_grad(mlp_loss{}, {1, 2})(x, w1, w2);
      const auto fs = cg::fully_shard(mlp_params<cg::tensor<float>>{w1, w2}, mesh);
      const auto xl = torch_chunk(x, n, r, 0);  // this rank's batch

      // Eager forward: the parameters gathered where used; the output is this rank's rows.
      {
        cg::comm_counter c;
        const cg::tensor<float> h = cg::relu(cg::linear(xl, fs.unshard("w1")));
        FSDP_CHECK_CLOSE(cg::linear(h, fs.unshard("w2")), torch_chunk(mlp_out{}(x, w1, w2), n, r, 0));
        CHECK(c.count("all_gather") == 2);
        CHECK(c.total() == 2);
      }

      // Differentiated (cg::value_and_grad): the gradients are the pieces of one device's.
      const fsdp_step step{mesh, fs.shapes()};
      cg::comm_counter c;
      const auto [term, g1, g2] = cg::value_and_grad(step, {1, 2})(xl, fs["w1"].to_local(), fs["w2"].to_local());
      FSDP_CHECK_CLOSE(cg::all_reduce(term, "sum", cg::group(mesh)), ref_loss);
      FSDP_CHECK_CLOSE(g1, torch_chunk(ref_g1, n, r, 0));
      FSDP_CHECK_CLOSE(g2, torch_chunk(ref_g2, n, r, 0));
      // Forward: one all_gather per parameter. Backward: each gradient reduce_scattered (the
      // all_gather's transpose), and w2 gathered again (resharded after the forward; the
      // backward reads it for h's gradient). w1's full value is read by no gradient rule (x is
      // not differentiated), so it is not gathered again.
      CHECK(c.count("all_gather", "forward") == 2);
      CHECK(c.count("all_gather", "backward") == 1);
      CHECK(c.count("reduce_scatter", "backward") == 2);
      CHECK(c.count("reduce_scatter", "forward") == 0);
      CHECK(c.count("all_reduce") == 1);  // the check's all_reduce of the loss above
      CHECK(c.total() == 6);

      // Without resharding: no second all_gather, the same gradients.
      const fsdp_step kept{mesh, fs.shapes(), false};
      cg::comm_counter c2;
      const auto [term2, k1, k2] = cg::value_and_grad(kept, {1, 2})(xl, fs["w1"].to_local(), fs["w2"].to_local());
      FSDP_CHECK_CLOSE(term2, term);
      FSDP_CHECK_CLOSE(k1, g1);
      FSDP_CHECK_CLOSE(k2, g2);
      CHECK(c2.count("all_gather") == 2);
      CHECK(c2.count("reduce_scatter") == 2);

      // Traced and compiled: one joint graph, scheduled, the same values.
      auto g = traced_step(step, xl, fs, ctx);
      auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
      const auto [v3, h1, h2] = cg::compile(s, ctx)(xl, fs["w1"].to_local(), fs["w2"].to_local());
      FSDP_CHECK_CLOSE(v3, term);
      FSDP_CHECK_CLOSE(h1, torch_chunk(ref_g1, n, r, 0));
      FSDP_CHECK_CLOSE(h2, torch_chunk(ref_g2, n, r, 0));
    });
  }
}

// ============================ schedule and memory ============================

/// Position in `g`'s order of each node whose op is `op`.
std::vector<std::size_t> positions(const cg::graph& g, std::string_view op) {
  std::vector<std::size_t> out;
  const auto nodes = g.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i]->op() == op) out.push_back(i);
  return out;
}

/// Position of the first node whose op name contains `part`.
std::size_t first_position(const cg::graph& g, std::string_view part) {
  const auto nodes = g.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i]->op().find(part) != std::string_view::npos) return i;
  return nodes.size();
}

TEST_CASE("fsdp.schedule.prefetch_reduce_scatter_and_reshard.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2}, {"dp"});
    // Even pieces (16 rows over 2), so each all_gather is the gathered parameter itself.
    const auto w1 = whole({16, hidden}, 3), w2 = whole({hidden, 16}, 5);
    const auto fs = cg::fully_shard(mlp_params<cg::tensor<float>>{w1, w2}, mesh);
    const shape_t xs{tokens / 2, hidden}, s1 = fs["w1"].to_local().shape(), s2 = fs["w2"].to_local().shape();
    auto g = cg::trace(cg::value_and_grad(fsdp_step{mesh, fs.shapes()}, {1, 2}), cg::input<float>(xs),
                       cg::input<float>(s1), cg::input<float>(s2));
    const auto ag = positions(g, "all_gather_into_tensor");
    REQUIRE(ag.size() == 3);  // w1, w2 in the forward; w2 again in the backward
    CHECK(positions(g, "reduce_scatter_tensor").size() == 2);

    // The memory plan of the traced order: each forward full parameter's buffer is free by the
    // loss (the forward's last node: nothing of the backward reads it); the backward reads the
    // re-gathered one.
    {
      const auto plan = cg::plan_memory(g);
      const std::size_t loss = positions(g, "sum").front();
      CHECK(ag[2] > loss);
      for (std::size_t k = 0; k < 2; ++k) {
        const cg::planned_buffer* b = plan.buffer_at(ag[k]);
        REQUIRE(b != nullptr);
        CHECK(b->last < loss);
      }
    }
    // Without resharding, w2's full value lives into the backward.
    {
      auto kept = cg::trace(cg::value_and_grad(fsdp_step{mesh, fs.shapes(), false}, {1, 2}), cg::input<float>(xs),
                            cg::input<float>(s1), cg::input<float>(s2));
      const auto kag = positions(kept, "all_gather_into_tensor");
      REQUIRE(kag.size() == 2);
      const auto plan = cg::plan_memory(kept);
      const cg::planned_buffer* b = plan.buffer_at(kag[1]);
      REQUIRE(b != nullptr);
      CHECK(b->last > positions(kept, "sum").front());
    }

    // Scheduled: raise_comms issues both forward all_gathers before the first matmul (w2's is
    // prefetched ahead of layer 1's compute), the backward's re-gather ahead of the matmul that
    // reads it, and the gradients leave by reduce_scatter.
    auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
    INFO(s);
    const auto sag = positions(s, "all_gather_into_tensor");
    const auto srs = positions(s, "reduce_scatter_tensor");
    REQUIRE(sag.size() == 3);
    REQUIRE(srs.size() == 2);
    const std::size_t first_mm = std::min(first_position(s, "linear"), first_position(s, "matmul"));
    CHECK(sag[0] < first_mm);
    CHECK(sag[1] < first_mm);
    for (std::size_t p : srs) CHECK(p > first_mm);
    // The graph is well formed and the ranks agree on the collective order.
    s.lint();
    cg::verify_collective_order(s, ctx);
    const auto x = whole({tokens, hidden});
    const auto [ref_loss, ref_g1, ref_g2] = cg::value_and_grad(mlp_loss{}, {1, 2})(x, w1, w2);
    (void)ref_loss;
    const auto [v, g1, g2] =
        cg::compile(s, ctx)(torch_chunk(x, 2, ctx.rank(), 0), fs["w1"].to_local(), fs["w2"].to_local());
    (void)v;
    FSDP_CHECK_CLOSE(g1, torch_chunk(ref_g1, 2, ctx.rank(), 0));
    FSDP_CHECK_CLOSE(g2, torch_chunk(ref_g2, 2, ctx.rank(), 0));
  });
}

// ============================ 2-D: FSDP on dp x TP on tp ============================

TEST_CASE("fsdp.2d.dp_x_tp.forward_backward_counts.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    const auto dp = mesh["dp"], tp = mesh["tp"];
    const int r = ctx.rank();
    const auto coord = mesh.coordinate(r);
    const int di = static_cast<int>(coord[0]), ti = static_cast<int>(coord[1]);
    const auto x = whole({tokens, hidden}), w1 = whole({ffn, hidden}, 3), w2 = whole({hidden, ffn}, 5);
    const auto [ref_loss, ref_g1, ref_g2] = cg::value_and_grad(mlp_loss{}, {1, 2})(x, w1, w2);

    // Tensor parallel on tp (Megatron: w1 rows, w2 columns), then FSDP of each tp piece on dp:
    // w1's tp piece (7, 8) is 4, 3 rows over dp, w2's (8, 7) 4, 4.
    const auto tpm = cg::parallelize_module(mlp_params<cg::tensor<float>>{w1, w2}, tp, megatron_plan);
    const auto fs = cg::fully_shard(tpm.local_params(), dp);
    const auto want1 = torch_chunk(torch_chunk(w1, 2, ti, 0), 2, di, 0);
    FSDP_CHECK_CLOSE(fs["w1"].to_local(), want1);
    FSDP_CHECK_CLOSE(fs["w2"].to_local(), torch_chunk(torch_chunk(w2, 2, ti, 1), 2, di, 0));
    const auto xl = torch_chunk(x, 2, di, 0);  // the batch on dp, replicated on tp

    auto step = [&](auto xv, auto a, auto b) {
      using V = decltype(xv);
      const auto m = cg::fully_shard(std::map<std::string, V>{{"w1", a}, {"w2", b}}, dp,
                                     {.local_shards = true, .shapes = fs.shapes()});
      const auto t = cg::parallelize_module(m.unshard_all(), tp, megatron_plan, {.local_shards = true});
      const V h = cg::relu(t.linear("w1", xv).to_local());
      return cg::sum(t.linear("w2", h));  // Replicate on tp: this dp rank's batch's loss
    };

    // Eager forward.
    {
      cg::comm_counter c;
      const auto t = cg::parallelize_module(fs.unshard_all(), tp, megatron_plan, {.local_shards = true});
      const cg::tensor<float> h = cg::relu(t.linear("w1", xl).to_local());
      FSDP_CHECK_CLOSE(t.linear("w2", h).to_local(), torch_chunk(mlp_out{}(x, w1, w2), 2, di, 0));
      CHECK(c.count("all_gather") == 2);  // FSDP on dp
      CHECK(c.count("all_reduce") == 1);  // the row-parallel output on tp
      CHECK(c.total() == 3);
    }

    // Forward and backward: the gradients of the pieces are the pieces of one device's
    // gradients (within 1e-4 relative, check_close).
    cg::comm_counter c;
    const auto [term, g1, g2] = cg::value_and_grad(step, {1, 2})(xl, fs["w1"].to_local(), fs["w2"].to_local());
    const auto by_phase = c.counts_by_phase();
    const i64 total = c.total();
    FSDP_CHECK_CLOSE(cg::all_reduce(term, "sum", cg::group(mesh, "dp")), ref_loss);
    FSDP_CHECK_CLOSE(g1, torch_chunk(torch_chunk(ref_g1, 2, ti, 0), 2, di, 0));
    FSDP_CHECK_CLOSE(g2, torch_chunk(torch_chunk(ref_g2, 2, ti, 1), 2, di, 0));
    // Forward: FSDP's all_gather per parameter on dp, TP's all_reduce on tp. Backward: the
    // all_reduce's transpose on tp, w2 gathered again on dp (resharded), and each gradient
    // reduce_scattered on dp.
    CHECK(c.count("all_gather", "forward") == 2);
    CHECK(c.count("all_reduce", "forward") == 1);
    CHECK(c.count("reduce_scatter", "forward") == 0);
    CHECK(c.count("all_reduce", "backward") == 1);
    CHECK(c.count("all_gather", "backward") == 1);
    CHECK(c.count("reduce_scatter", "backward") == 2);
    CHECK(by_phase.size() == 2);
    CHECK(total == 7);

    // Traced and compiled: the same gradients; the all_gathers and reduce_scatters are on dp,
    // the all_reduces on tp.
    auto g = traced_step(step, xl, fs, ctx);
    CHECK(g.count("all_reduce") == 2);
    auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
    const auto [v, h1, h2] = cg::compile(s, ctx)(xl, fs["w1"].to_local(), fs["w2"].to_local());
    FSDP_CHECK_CLOSE(v, term);
    FSDP_CHECK_CLOSE(h1, g1);
    FSDP_CHECK_CLOSE(h2, g2);
  });
}

// ================================ errors ================================

TEST_CASE("fsdp.errors.world2") {
  run(2, [](cg::rank_context&) {
    const cg::device_mesh mesh({2}, {"dp"});
    const auto w = whole({4, 6});
    auto e = error_of([&] { (void)cg::fully_shard(map{{"w", w}}, cg::device_mesh({1, 2}, {"dp", "tp"})); });
    CHECK(contains(e, "fully_shard: the mesh"));
    CHECK(contains(e, "takes a 1-d mesh"));
    e = error_of([&] { (void)cg::fully_shard(map{{"s", whole({})}}, mesh); });
    CHECK(contains(e, "fully_shard: 's' has shape [] (a scalar)"));
    e = error_of([&] {
      (void)cg::fully_shard(map{{"w", w}}, mesh, {.local_shards = true, .shapes = {{"v", shape_t{8, 6}}}});
    });
    CHECK(contains(e, "options.shapes names 'v' ([8, 6]), which is not a parameter of the module"));
    CHECK(contains(e, "'w'"));
    e = error_of([&] { (void)cg::fully_shard(map{{"w", w}}, mesh, {.shapes = {{"w", shape_t{8, 6}}}}); });
    CHECK(contains(e, "only read with local_shards = true"));
    // A piece that is not this rank's piece of the global shape it is given.
    e = error_of([&] {
      (void)cg::fully_shard(map{{"w", w}}, mesh, {.local_shards = true, .shapes = {{"w", shape_t{3, 6}}}});
    });
    CHECK(contains(e, "is not its piece"));
    e = error_of([&] {
      (void)cg::fully_shard(map{{"w", w}}, mesh, {.local_shards = true, .shapes = {{"w", shape_t{8}}}});
    });
    CHECK(contains(e, "'w' has local shape [4, 6] but options.shapes gives it [8]"));
    const auto fs = cg::fully_shard(map{{"w", w}}, mesh);
    e = error_of([&] { (void)fs.unshard("v"); });
    CHECK(contains(e, "fsdp_module::param: no parameter 'v'; the module has ['w']"));
  });
}

}  // namespace fsdp_test
