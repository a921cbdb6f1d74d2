// tests/schedule/test_decompose.cpp: decompose_matmul_collectives of
// ccgraph/schedule/decompose.hpp: the TP MLP (x @ w1 -> gelu -> @ w2 -> all_reduce) becomes
// independent row pipelines, each ending in its all_reduce; matmul -> reduce_scatter and
// all_gather -> matmul chains are chunked too; results stay bitwise equal to the undecomposed
// graph and to eager execution on 2 and 4 ranks, for divisible and non-divisible chunk counts.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/decompose.hpp>

#include "support.hpp"
#include "schedule/same_results.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

constexpr std::int64_t T = 64, H = 32;

/// The TP MLP of PERF.md, one rank's share: written once, traced and run eagerly.
auto tp_mlp(const cg::group& grp) {
  return [grp](const auto& x, const auto& w1, const auto& w2) {
    auto y = cg::matmul(cg::gelu(cg::matmul(x, w1)), w2);
    auto r = cg::all_reduce(y, "sum", grp);
    return cg::wait_tensor(r);
  };
}

auto trace_tp_mlp(int world, std::int64_t t = T) {
  return cg::trace(ccgraph_test::world(world), tp_mlp(cg::group{iota_ranks(world)}), cg::input<float>({t, H}),
                   cg::input<float>({H, 2 * H}), cg::input<float>({2 * H, H}));
}

/// The collectives' op names, in order.
std::vector<std::string> collective_ops(const cg::graph& g) {
  std::vector<std::string> out;
  for (const cg::node* n : g.nodes())
    if (n->is_collective()) out.emplace_back(n->op());
  return out;
}

/// Decomposed copy of `g`, linted.
template <class G>
G decomposed(const G& g, int chunks) {
  G d = g;
  cg::decompose_matmul_collectives(d, chunks);
  cg::lint(d);
  return d;
}

}  // namespace

TEST_CASE("decompose.tp_mlp.structure") {
  const auto g = trace_tp_mlp(2);
  const auto d = decomposed(g, 4);
  CHECK(d.count("matmul") == 8);
  CHECK(d.count("pointwise") == 4);
  CHECK(d.count("all_reduce") == 4);
  CHECK(d.count("wait_tensor") == 4);
  CHECK(d.count("narrow") == 4);
  CHECK(d.count("cat") == 1);
  // Four independent row pipelines, each ending in its all_reduce, then the waits and the cat.
  std::vector<std::string> expected;
  for (int i = 0; i < 4; ++i)
    for (const char* op : {"narrow", "matmul", "fused_gelu", "matmul", "all_reduce"}) expected.emplace_back(op);
  for (int i = 0; i < 4; ++i) expected.emplace_back("wait_tensor");
  expected.emplace_back("cat");
  CHECK(cg::op_sequence(d) == expected);
  // Rows of x, in order; the weights are read whole.
  int i = 0;
  for (const cg::node* n : d.nodes())
    if (auto* nw = std::get_if<cg::ops::narrow>(&n->kind())) {
      CHECK(n->args()[0].src == d.placeholders()[0]);
      CHECK(nw->dim == 0);
      CHECK(nw->start == 16 * i++);
      CHECK(nw->length == 16);
    }
  for (const cg::node* n : d.nodes())
    if (n->op() == "matmul") CHECK(n->args()[1].src->op() == "placeholder");
  // The result is returned through the cat.
  CHECK(d.output_node()->args()[0].src->op() == "cat");
  CHECK(d.output_node()->args()[0].src->shape() == cg::shape_t{T, H});
}

TEST_CASE("decompose.tp_mlp.results_match_undecomposed_and_eager") {
  for (int world : {2, 4}) {
    const auto g = trace_tp_mlp(world);
    std::vector<decltype(decomposed(g, 1))> ds;
    for (int chunks = 1; chunks <= 5; ++chunks) {
      ds.push_back(decomposed(g, chunks));
      // torch.chunk's pieces: 64 rows in 5 chunks are 13, 13, 13, 13, 12.
      CHECK(ds.back().count("all_reduce") == static_cast<std::size_t>(chunks));
      CHECK(collective_ops(ds.back()) == std::vector<std::string>(static_cast<std::size_t>(chunks), "all_reduce"));
    }
    CHECK(cg::to_string(ds[0]) == cg::to_string(g));  // one chunk: nothing to do
    std::vector<int> ok(static_cast<std::size_t>(world), 0);
    cg::run_threads(world, [&](cg::rank_context& ctx) {
      const auto seed = static_cast<std::uint64_t>(10 * ctx.rank());
      const auto x = cg::uniform<float>({T, H}, -1, 1, seed + 1);
      const auto w1 = cg::uniform<float>({H, 2 * H}, -1, 1, seed + 2);
      const auto w2 = cg::uniform<float>({2 * H, H}, -1, 1, seed + 3);
      const auto eager = tp_mlp(ctx.world())(x, w1, w2).to_vector();
      bool good = cg::compile(g, ctx)(x, w1, w2).to_vector() == eager;
      for (const auto& d : ds) good = good && cg::compile(d, ctx)(x, w1, w2).to_vector() == eager;
      ok[static_cast<std::size_t>(ctx.rank())] = good;
    });
    CHECK(std::count(ok.begin(), ok.end(), 1) == world);
  }
}

namespace {
/// A data-parallel step of a two-matmul MLP whose weights are used transposed: the loss, and
/// each weight's gradient all_reduced (w2's, the backward's first, traced first).
auto dp_step(cg::group world) {
  return [world](auto x, auto w1, auto w2) {
    using V = decltype(x);
    auto loss = [](const auto& xx, const auto& a, const auto& b) {
      return cg::sum(cg::matmul(cg::gelu(cg::matmul(xx, a.transpose(0, 1))), b.transpose(0, 1)));
    };
    auto [l, g1, g2] = cg::value_and_grad(loss, {1, 2})(x, w1, w2);
    auto r2 = V(cg::all_reduce(g2, "avg", world));
    auto r1 = V(cg::all_reduce(g1, "avg", world));
    return std::make_tuple(V(l), r1, r2);
  };
}
}  // namespace

TEST_CASE("decompose.weight_gradients_under_their_all_reduce") {
  // Data parallelism: a weight used as w.transpose(0, 1) gets its gradient from matmul's rule
  // as a transpose that the transpose's rule turns back (folded at trace time), so the
  // gradient's all_reduce reads the weight-gradient matmul itself and splits into row chunks.
  const std::int64_t t = 16, h = 8, f = 16;  // row chunks of whole 64-byte blocks: the cats elide
  std::vector<int> ok(2, 0);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    const auto g = cg::trace(dp_step(ctx.world()), cg::input<float>({t, h}), cg::input<float>({f, h}),
                             cg::input<float>({h, f}));
    auto d = g;
    cg::decompose_matmul_collectives(d, 4, &ctx);
    cg::lint(d);
    // Each gradient's chunks and their all_reduces are computed into the cat's slices.
    const bool split = d.count("all_reduce") == 8 && d.count("cat") == 2 && cg::plan_memory(d).elided_cats.size() == 2;
    const auto x = cg::uniform<float>({t, h}, -1, 1, 1 + static_cast<std::uint64_t>(ctx.rank()));
    const auto w1 = cg::uniform<float>({f, h}, -1, 1, 7), w2 = cg::uniform<float>({h, f}, -1, 1, 8);
    const auto [l0, a0, b0] = cg::compile(g, ctx)(x, w1, w2);
    const auto [l1, a1, b1] = cg::compile(d, ctx)(x, w1, w2);
    ok[static_cast<std::size_t>(ctx.rank())] = split && l0.to_vector() == l1.to_vector() &&
                                               a0.to_vector() == a1.to_vector() && b0.to_vector() == b1.to_vector();
  });
  CHECK(ok == std::vector<int>{1, 1});
}

TEST_CASE("decompose.only_exposed.the_last_gradient") {
  // A data-parallel step: w2's gradient (the backward's first) has its all_reduce traced first
  // and can run beside the rest of the backward (gelu's backward and w1's gradient matmul); w1's
  // beside nothing. With only_exposed, only w1's splits.
  const std::int64_t t = 16, h = 8, f = 16;
  // A matmul costs 20, an all_reduce 15, the rest 1.
  const cg::runtime_estimator cost = [](const cg::node& n) {
    return n.op() == "matmul" ? 20.0 : n.is_collective() ? 15.0 : 1.0;
  };
  std::vector<int> ok(2, 0);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    const auto g = cg::trace(dp_step(ctx.world()), cg::input<float>({t, h}), cg::input<float>({f, h}),
                             cg::input<float>({h, f}));
    std::vector<bool> hidden;
    const std::vector<double> before = cg::detail::compute_before(g, cost);
    for (const cg::node* n : g.nodes())
      if (n->op() == "all_reduce") hidden.push_back(cg::detail::hidden_by_compute_beside(g, *n, before, cost));
    auto d = g;
    cg::decompose_matmul_collectives(d, cg::decompose_options{.chunks = 4, .only_exposed = cost}, &ctx);
    cg::lint(d);
    const bool split = hidden == std::vector<bool>{true, false} && d.count("all_reduce") == 5 && d.count("cat") == 1;
    // Every cost high enough hides nothing: both split, as without the option.
    auto all = g;
    cg::decompose_matmul_collectives(all, cg::decompose_options{.chunks = 4, .only_exposed = [](const cg::node& n) {
      return n.is_collective() ? 1e9 : 1.0;
    }}, &ctx);
    const auto x = cg::uniform<float>({t, h}, -1, 1, 1 + static_cast<std::uint64_t>(ctx.rank()));
    const auto w1 = cg::uniform<float>({f, h}, -1, 1, 7), w2 = cg::uniform<float>({h, f}, -1, 1, 8);
    const auto [l0, a0, b0] = cg::compile(g, ctx)(x, w1, w2);
    const auto [l1, a1, b1] = cg::compile(d, ctx)(x, w1, w2);
    ok[static_cast<std::size_t>(ctx.rank())] = split && all.count("all_reduce") == 8 && l0.to_vector() == l1.to_vector() &&
                                               a0.to_vector() == a1.to_vector() && b0.to_vector() == b1.to_vector();
  });
  CHECK(ok == std::vector<int>{1, 1});
  // Through cg::schedule: the option with the schedule's estimator.
  const auto g = cg::trace(ccgraph_test::world(2), dp_step(cg::group{std::vector<int>{0, 1}}), cg::input<float>({t, h}),
                           cg::input<float>({f, h}), cg::input<float>({h, f}));
  cg::schedule_options so;
  so.estimate_runtime = cost;
  so.decompose_only_exposed = true;
  so.agreement = cg::collective_agreement::spmd;
  CHECK(cg::schedule(g, {"decompose_matmul_collectives"}, so).count("all_reduce") == 5);
  so.decompose_only_exposed = false;
  CHECK(cg::schedule(g, {"decompose_matmul_collectives"}, so).count("all_reduce") == 8);
}

TEST_CASE("decompose.row_broadcast_inputs.stay_whole") {
  const cg::group grp{std::vector<int>{0, 1}};
  const auto g = cg::trace(ccgraph_test::world(2), [&](auto x, auto w, auto bias, auto scale) {
    auto y = (cg::matmul(x, w) + bias) * scale;  // bias [N], scale [1, N]: broadcast along rows
    return cg::wait_tensor(cg::all_reduce(y, "sum", grp));
  }, cg::input<float>({10, 8}), cg::input<float>({8, 6}), cg::input<float>({6}), cg::input<float>({1, 6}));
  const auto d = decomposed(g, 3);  // 10 rows: 4, 4, 2
  CHECK(d.count("all_reduce") == 3);
  CHECK(d.count("narrow") == 3);
  for (const cg::node* n : d.nodes())
    if (n->op() == "narrow") CHECK(n->args()[0].src == d.placeholders()[0]);
  for (const cg::node* n : d.nodes())
    if (n->op() == "pointwise") {
      CHECK(n->args()[1].src == d.placeholders()[2]);
      CHECK(n->args()[2].src == d.placeholders()[3]);
    }
  CHECK(same_results(g, d, 2));
}

TEST_CASE("decompose.region.dag_and_shared_values") {
  const cg::group grp{std::vector<int>{0, 1}};
  // h is read by two nodes of the region: it is recomputed once per chunk.
  const auto dag = cg::trace(ccgraph_test::world(2), [&](auto x, auto w1, auto w2) {
    auto h = cg::matmul(x, w1);
    auto a = cg::eval(cg::gelu(h));
    auto y = cg::matmul(a * h, w2);
    return cg::wait_tensor(cg::all_reduce(y, "sum", grp));
  }, cg::input<float>({12, 8}), cg::input<float>({8, 8}), cg::input<float>({8, 4}));
  const auto d1 = decomposed(dag, 3);
  CHECK(d1.count("matmul") == 6);
  CHECK(d1.count("pointwise") == 6);
  CHECK(d1.count("narrow") == 3);
  CHECK(same_results(dag, d1, 2));
  // h is also returned: it is computed whole, and its rows are narrowed per chunk.
  const auto shared = cg::trace(ccgraph_test::world(2), [&](auto x, auto w1, auto w2) {
    auto h = cg::matmul(x, w1);
    auto y = cg::matmul(cg::relu(h), w2);
    return std::make_tuple(cg::wait_tensor(cg::all_reduce(y, "sum", grp)), h);
  }, cg::input<float>({12, 8}), cg::input<float>({8, 8}), cg::input<float>({8, 4}));
  const auto d2 = decomposed(shared, 3);
  CHECK(d2.count("matmul") == 4);
  CHECK(d2.count("all_reduce") == 3);
  for (const cg::node* n : d2.nodes())
    if (n->op() == "narrow") CHECK(n->args()[0].src->op() == "matmul");
  CHECK(same_results(shared, d2, 2));
}

TEST_CASE("decompose.reduce_scatter.rows_of_every_block") {
  for (int world : {2, 4}) {
    const auto g = cg::trace(ccgraph_test::world(world), [world](auto x, auto w) {
      auto y = cg::relu(cg::matmul(x, w));
      return cg::wait_tensor(cg::reduce_scatter_tensor(y, "sum", 0, cg::group{iota_ranks(world)}));
    }, cg::input<float>({10 * world, 8}), cg::input<float>({8, 6}));
    const auto d = decomposed(g, 3);  // 10 rows per rank: 4, 4, 2
    CHECK(collective_ops(d) == std::vector<std::string>(3, "reduce_scatter_tensor"));
    CHECK(d.count("matmul") == 3);
    CHECK(d.count("narrow") == static_cast<std::size_t>(3 * world));
    const auto d5 = decomposed(g, 5);  // 10 rows per rank: 2 each
    CHECK(d5.count("reduce_scatter_tensor") == 5);
    CHECK(same_results(g, {&d, &d5}, world));
  }
}

TEST_CASE("decompose.all_gather.matmul_chain") {
  for (int world : {2, 4}) {
    const cg::group grp{iota_ranks(world)};
    const auto g = cg::trace(ccgraph_test::world(world), [&](auto x, auto w1, auto w2) {
      auto full = cg::all_gather_tensor(x, 0, grp);
      return cg::matmul(cg::gelu(cg::matmul(full, w1)), w2);
    }, cg::input<float>({6, 8}), cg::input<float>({8, 12}), cg::input<float>({12, 5}));
    const auto d = decomposed(g, 4);  // 6 rows per rank: 2, 2, 2
    CHECK(collective_ops(d) == std::vector<std::string>(3, "all_gather_into_tensor"));
    CHECK(d.count("matmul") == 6);
    CHECK(d.count("pointwise") == 3);
    CHECK(d.count("narrow") == static_cast<std::size_t>(3 + 3 * world));
    // The gathers are issued first; each chunk's chain starts with its wait.
    const auto seq = cg::op_sequence(d);
    CHECK(seq[1] == "all_gather_into_tensor");
    CHECK(seq[5] == "all_gather_into_tensor");
    CHECK(seq[6] == "wait_tensor");
    const auto d5 = decomposed(g, 5);  // 6 rows in 5 chunks: 2, 2, 2
    const auto d6 = decomposed(g, 6);
    CHECK(d6.count("all_gather_into_tensor") == 6);
    const auto d7 = decomposed(g, 7);  // fewer rows than chunks: unchanged
    CHECK(cg::to_string(d7) == cg::to_string(g));
    CHECK(same_results(g, {&d, &d5, &d6}, world));

    // Sequence parallel into tensor parallel: gather, MLP, all_reduce. The gather side is
    // chunked; the all_reduce then reads the reassembled rows and stays whole.
    const auto sp = cg::trace(ccgraph_test::world(world), [&](auto x, auto w1, auto w2) {
      auto full = cg::all_gather_tensor(x, 0, grp);
      auto y = cg::matmul(cg::gelu(cg::matmul(full, w1)), w2);
      return cg::wait_tensor(cg::all_reduce(y, "sum", grp));
    }, cg::input<float>({6, 8}), cg::input<float>({8, 12}), cg::input<float>({12, 5}));
    const auto dsp = decomposed(sp, 3);
    std::vector<std::string> expected(3, "all_gather_into_tensor");
    expected.emplace_back("all_reduce");
    CHECK(collective_ops(dsp) == expected);
    CHECK(same_results(sp, dsp, world));
  }
}

TEST_CASE("decompose.collective_order.kept") {
  const cg::group grp{std::vector<int>{0, 1}};
  const auto g = cg::trace(ccgraph_test::world(2), [&](auto a, auto x, auto w1, auto w2) {
    auto r0 = cg::all_reduce(a, "max", grp);
    auto y = cg::matmul(cg::gelu(cg::matmul(x, w1)), w2);
    auto r1 = cg::all_reduce(y, "sum", grp);
    auto r2 = cg::all_gather_tensor(a * 2.f, 0, grp);
    return std::make_tuple(cg::wait_tensor(r0) + 1.f, cg::wait_tensor(r1), cg::wait_tensor(r2));
  }, cg::input<float>({4, 4}), cg::input<float>({T, H}), cg::input<float>({H, 2 * H}), cg::input<float>({2 * H, H}));
  const auto d = decomposed(g, 3);
  const std::vector<std::string> expected = {"all_reduce", "all_reduce", "all_reduce", "all_reduce",
                                             "all_gather_into_tensor"};
  CHECK(collective_ops(d) == expected);
  // The untouched collectives keep their attributes and inputs.
  std::vector<const cg::node*> cs;
  for (const cg::node* n : d.nodes())
    if (n->is_collective()) cs.push_back(n);
  CHECK(std::get<cg::ops::all_reduce>(cs.front()->kind()).op == cg::reduce_op::max);
  CHECK(cs.front()->args()[0].src == d.placeholders()[0]);
  CHECK(same_results(g, d, 2));
}

TEST_CASE("decompose.skips.what_it_cannot_split") {
  const cg::group grp{std::vector<int>{0, 1}};
  auto unchanged = [](const auto& g, int chunks) {
    auto d = g;
    cg::decompose_matmul_collectives(d, chunks);
    return cg::to_string(d) == cg::to_string(g);
  };
  // The matmul's result is also read elsewhere.
  const auto reused = cg::trace(ccgraph_test::world(2), [&](auto x, auto w) {
    auto y = cg::matmul(x, w);
    return std::make_tuple(cg::wait_tensor(cg::all_reduce(y, "sum", grp)), y);
  }, cg::input<float>({8, 4}), cg::input<float>({4, 4}));
  CHECK(unchanged(reused, 2));
  // Fewer rows than chunks, or fewer than two chunks.
  const auto small = trace_tp_mlp(2, 3);
  CHECK(unchanged(small, 4));
  CHECK(!unchanged(small, 3));
  CHECK(unchanged(trace_tp_mlp(2), 1));
  CHECK(unchanged(trace_tp_mlp(2), 0));
  // No matmul to split.
  const auto no_matmul = cg::trace(ccgraph_test::world(2), [&](auto x) {
    return cg::wait_tensor(cg::all_reduce(cg::relu(x), "sum", grp));
  }, cg::input<float>({8, 4}));
  CHECK(unchanged(no_matmul, 2));
  // The collective's result is returned un-waited (no wait to replace), as compile_options::
  // pending_outputs compiles it.
  auto unwaited = cg::trace(ccgraph_test::world(2), [&](auto x, auto w) {
    return cg::all_reduce(cg::matmul(x, w), "sum", grp);
  }, cg::input<float>({8, 4}), cg::input<float>({4, 4}));
  cg::detail::return_pending(unwaited);
  REQUIRE(unwaited.count("wait_tensor") == 0);
  CHECK(unchanged(unwaited, 2));
  // A batched (3-d) matmul.
  const auto batched = cg::trace(ccgraph_test::world(2), [&](auto x, auto w) {
    return cg::wait_tensor(cg::all_reduce(cg::matmul(x, w), "sum", grp));
  }, cg::input<float>({2, 8, 4}), cg::input<float>({4, 4}));
  CHECK(unchanged(batched, 2));
}
