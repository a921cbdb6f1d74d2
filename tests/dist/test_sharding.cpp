// tests/dist/test_sharding.cpp: sharding propagation (dist/sharding.hpp, dist/ops.hpp): ops
// called on dtensors on the threads backend at 2 and 4 ranks (and a 2x2 mesh): each output's
// placements, its full_tensor() against the op on the whole tensors, the collectives issued
// (comm_counter), the strategy chosen and its determinism, eagerly and traced.
//
// Inputs are small integers (exact in float). A Partial(sum) mesh dim holds on its first rank
// the piece minus (n - 1), on the others ones: the terms add up to the piece.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/dtensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using cg::shape_t;
using i64 = std::int64_t;
using places = std::vector<cg::placement>;
using dt = cg::dtensor<float>;

/// A whole tensor of `shape`: (i * 7 + seed) % 11 - 5, small integers.
cg::tensor<float> whole(const shape_t& shape, int seed = 0) {
  std::vector<float> v(static_cast<std::size_t>(cg::numel_of(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((static_cast<int>(i) * 7 + seed) % 11 - 5);
  return cg::tensor<float>::from(v, shape);
}

/// This rank's dtensor of `full` laid out as `ps` on `mesh` (at most one Partial mesh dim).
template <class T>
cg::dtensor<T> layout(const cg::rank_context& ctx, const cg::device_mesh& mesh, const cg::tensor<T>& full,
                      const places& ps) {
  const auto coord = mesh.coordinate(ctx.rank());
  const auto [shape, offset] = cg::local_shape_and_offset(full.shape(), mesh, coord, ps);
  cg::tensor<T> t = full;
  for (std::size_t d = 0; d < shape.size(); ++d) t = t.narrow(static_cast<i64>(d), offset[d], shape[d]);
  t = t.contiguous();
  for (std::size_t m = 0; m < ps.size(); ++m) {
    if (!ps[m].is_partial()) continue;
    const T n1 = static_cast<T>(mesh.size(static_cast<int>(m)) - 1);
    t = coord[m] == 0 ? cg::eval(t - n1) : cg::eval(t * T(0) + T(1));
  }
  return cg::dtensor<T>::from_local(t, mesh, ps, {.shape = full.shape()});
}

/// `a` and `b` equal in shape and values (within `tol`).
void check_close(const cg::tensor<float>& a, const cg::tensor<float>& b, double tol = 1e-4) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::abs(double(x[i]) - double(y[i])) <= tol * (1 + std::abs(double(y[i]))));
}

/// Runs `op` (dtensors -> dtensor) under a comm_counter; checks the output's placements and
/// collective counts, and its full tensor against `want`.
template <class F>
void expect(F&& op, const places& out_places, const std::map<std::string, i64>& counts, const cg::tensor<float>& want) {
  std::optional<dt> out;
  {
    cg::comm_counter c;
    out.emplace(op());
    for (const auto& [kind, n] : counts) CHECK_MESSAGE(c.count(kind) == n, kind);
    i64 total = 0;
    for (const auto& [kind, n] : counts) total += n;
    CHECK(c.total() == total);
  }
  CHECK(cg::placements_str(out->placements()) == cg::placements_str(out_places));
  CHECK(out->shape() == want.shape());
  check_close(out->full_tensor(), want);
}

const std::map<std::string, i64> none{};

}  // namespace

// ================================ pointwise ================================

TEST_CASE("sharding.pointwise.shard_partial_replicate.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    const auto A = whole({4, 6}, 1), B = whole({4, 6}, 3);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
    auto a = [&](cg::placement p) { return layout(ctx, mesh, A, {p}); };
    auto b = [&](cg::placement p) { return layout(ctx, mesh, B, {p}); };
    const auto sum = cg::eval(A + B), prod = cg::eval(A * B);
    expect([&] { return a(S0) + b(R); }, {S0}, none, sum);        // R -> its chunk
    expect([&] { return a(R) + b(S1); }, {S1}, none, sum);
    expect([&] { return a(P) + b(P); }, {P}, none, sum);          // additive: Partial stays
    expect([&] { return a(P) + b(R); }, {P}, none, sum);          // R -> Partial: divided, no collective
    expect([&] { return a(P) * b(R); }, {P}, none, prod);         // mul is linear in one Partial
    expect([&] { return a(R) * b(P); }, {P}, none, prod);
    expect([&] { return a(P) * b(P); }, {P}, {{"all_reduce", 1}}, prod);  // the second reduced
    expect([&] { return a(P) * 2.0f; }, {P}, none, cg::eval(A * 2.0f));
    expect([&] { return -a(P); }, {P}, none, cg::eval(-A));
    expect([&] { return a(P) + 1.0f; }, {R}, {{"all_reduce", 1}}, cg::eval(A + 1.0f));  // not linear
    expect([&] { return cg::pointwise("relu", [](const auto& x) { return cg::relu(x); }, a(P)); }, {R},
           {{"all_reduce", 1}}, cg::eval(cg::relu(A)));
    expect([&] { return cg::pointwise("relu", [](const auto& x) { return cg::relu(x); }, a(S1)); }, {S1}, none,
           cg::eval(cg::relu(A)));
    // Shard(0) + Shard(1): both one all_to_all away; the first input's is kept (order).
    expect([&] { return a(S0) + b(S1); }, {S0}, {{"all_to_all", 1}}, sum);
    expect([&] { return a(S1) + b(S0); }, {S1}, {{"all_to_all", 1}}, sum);
    // div is linear in its numerator only.
    const auto B1 = cg::eval(B * B + 1.0f);
    auto b1 = [&](cg::placement p) { return layout(ctx, mesh, B1, {p}); };
    expect([&] { return a(P) / b1(R); }, {P}, none, cg::eval(A / B1));
    expect([&] { return a(R) / b1(P); }, {R}, {{"all_reduce", 1}}, cg::eval(A / B1));
  });
}

TEST_CASE("sharding.pointwise.broadcast_and_uneven.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({4});
    const auto X = whole({5, 6}, 2), row = whole({6}, 5), col = whole({5, 1}, 7), W = whole({6}, 4);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate();
    // A [6] row broadcast over Shard(0) stays Replicate; over Shard(1) it is cut as Shard(0).
    expect([&] { return layout(ctx, mesh, X, {S0}) + layout(ctx, mesh, row, {R}); }, {S0}, none, cg::eval(X + row));
    expect([&] { return layout(ctx, mesh, X, {S1}) + layout(ctx, mesh, row, {S0}); }, {S1}, none, cg::eval(X + row));
    // A [5, 1] column is broadcast on dim 1: Replicate there.
    expect([&] { return layout(ctx, mesh, X, {S1}) * layout(ctx, mesh, col, {R}); }, {S1}, none, cg::eval(X * col));
    // W [6] sharded on its only dim (dim 1 of the result): following X's Shard(0) gathers W
    // (broadcast on dim 0, so Replicate), following W's re-shards X (an all_to_all); the
    // all_gather of 6 elements is the cheaper.
    expect([&] { return layout(ctx, mesh, X, {S0}) - layout(ctx, mesh, W, {S0}); }, {S0}, {{"all_gather", 1}},
           cg::eval(X - W));
  });
}

// ================================ matmul / linear / bmm ================================

TEST_CASE("sharding.matmul.strategies.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    const auto A = whole({4, 6}, 1), B = whole({6, 8}, 2);
    const auto AB = cg::matmul(A, B);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
    auto a = [&](cg::placement p) { return layout(ctx, mesh, A, {p}); };
    auto b = [&](cg::placement p) { return layout(ctx, mesh, B, {p}); };
    expect([&] { return cg::matmul(a(S0), b(R)); }, {S0}, none, AB);
    expect([&] { return cg::matmul(a(R), b(S1)); }, {S1}, none, AB);
    expect([&] { return cg::matmul(a(S1), b(S0)); }, {P}, none, AB);
    expect([&] { return cg::matmul(a(R), b(R)); }, {R}, none, AB);
    // matmul has no linearity rule (PyTorch's mm_strategy): a Partial operand is reduced. The
    // cheapest way is the contracting strategy: A reduce_scattered to Shard(1) (cheaper than an
    // all_reduce), B cut locally to Shard(0), the product Partial again.
    expect([&] { return cg::matmul(a(P), b(R)); }, {P}, {{"reduce_scatter", 1}}, AB);
    const auto c = cg::choose_sharding(cg::ops::matmul{}, {{A.shape(), {P}}, {B.shape(), {R}}}, mesh);
    CHECK(c.costs[1] < c.costs[0]);  // reduce_scatter < all_reduce
    CHECK(c.chosen == 1);
  });
}

TEST_CASE("sharding.matmul.seed_gathers_the_shard1_operand.world2") {
  // test_dtensor_compile.py's test_compile_dtensor_redistribute_backward: x [2n, 4] Shard(0),
  // y [4, 2n] Shard(1): gathering either costs one all_gather of the same bytes; the Shard(m)
  // strategy comes first, so y (the Shard(1) operand) is gathered and the output is Shard(0).
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto X = whole({2 * n, 4}, 1), Y = whole({4, 2 * n}, 2);
      const auto x = layout(ctx, mesh, X, {cg::shard(0)}), y = layout(ctx, mesh, Y, {cg::shard(1)});
      const auto choice = cg::choose_sharding(cg::ops::matmul{}, {cg::spec_of(x), cg::spec_of(y)}, mesh);
      // PyTorch's order: all-Replicate, contracting (Partial), Shard(m), Shard(n).
      REQUIRE(choice.strategies.size() == 4);
      CHECK(choice.strategies[2].out == places{cg::shard(0)});
      CHECK(choice.strategies[3].out == places{cg::shard(1)});
      CHECK(choice.costs[2] == choice.costs[3]);
      CHECK(choice.costs[2] < choice.costs[0]);
      CHECK(choice.costs[2] < choice.costs[1]);
      CHECK(choice.chosen == 2);
      CHECK(choice.best().in == std::vector<places>{{cg::shard(0)}, {cg::replicate()}});
      // Deterministic: the same call, and negative shard dims, give the same choice.
      const auto again = cg::choose_sharding(cg::ops::matmul{}, {{X.shape(), {cg::shard(-2)}}, {Y.shape(), {cg::shard(-1)}}}, mesh);
      CHECK(again.strategies == choice.strategies);
      CHECK(again.costs == choice.costs);
      CHECK(again.chosen == choice.chosen);
      expect([&] { return cg::matmul(x, y); }, {cg::shard(0)}, {{"all_gather", 1}}, cg::matmul(X, Y));
    });
}

TEST_CASE("sharding.matmul.2d_mesh.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    const auto A = whole({4, 6}, 1), B = whole({6, 8}, 2);
    const auto AB = cg::matmul(A, B);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
    // dp shards rows, tp shards columns: no communication.
    expect([&] { return cg::matmul(layout(ctx, mesh, A, {S0, R}), layout(ctx, mesh, B, {R, S1})); }, {S0, S1}, none,
           AB);
    // tp row-parallel: contracting dim sharded on tp -> Partial on tp.
    expect([&] { return cg::matmul(layout(ctx, mesh, A, {S0, S1}), layout(ctx, mesh, B, {R, S0})); }, {S0, P}, none,
           AB);
    // The same strategy on every rank (the rule and the costs see global specs only), uneven
    // shards included (each rank's own pieces differ in size).
    const auto choice = cg::choose_sharding(
        cg::ops::matmul{}, {{{5, 7}, {S1, S0}}, {{7, 3}, {S1, R}}}, mesh);
    const auto all = cg::all_gather_tensor(cg::tensor<i64>::from({static_cast<i64>(choice.chosen)}, {1}), 0,
                                           cg::group(mesh))
                         .to_vector();
    for (auto c : all) CHECK(c == static_cast<i64>(choice.chosen));
  });
}

TEST_CASE("sharding.nested_and_2d.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    const auto X = whole({8, 6}, 1), Y = whole({8, 6}, 2);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
    auto x = [&](places ps) { return layout(ctx, mesh, X, ps); };
    // Dim 0 sharded on both mesh dims (nested): reduced, Partial on both.
    expect([&] { return cg::sum(x({S0, S0}), {0}); }, {P, P}, none, cg::sum(X, {0}));
    expect([&] { return cg::mean(x({S0, S0}), {0}); }, {cg::partial("avg"), cg::partial("avg")}, none,
           cg::mean(X, {0}));
    expect([&] { return x({S0, S1}) + layout(ctx, mesh, Y, {R, R}); }, {S0, S1}, none, cg::eval(X + Y));
    // On tp: following X's Shard(1) reduce_scatters Y's Partial; following Y's Partial (mul is
    // linear in it) would gather X. The reduce_scatter (a quarter of the bytes out) is cheaper.
    expect([&] { return x({S0, S1}) * layout(ctx, mesh, Y, {R, P}); }, {S0, S1}, {{"reduce_scatter", 1}},
           cg::eval(X * Y));
    expect([&] { return cg::softmax(x({S0, S1}), 1); }, {S0, R}, {{"all_gather", 1}}, cg::softmax(X, 1));
    expect([&] { return cg::transpose(x({S0, S1}), 0, 1); }, {S1, S0}, none, X.transpose(0, 1));
    expect([&] { return cg::reshape(x({S0, S1}), {48}); }, {S0, R}, {{"all_gather", 1}}, X.reshape({48}));
    const auto g = whole({6}, 3);
    expect([&] { return cg::layer_norm(x({S0, R}), layout(ctx, mesh, g, {R, R})); }, {S0, R}, none,
           cg::layer_norm(X, g));
  });
}

TEST_CASE("sharding.linear_and_bmm.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    const auto X = whole({3, 4, 6}, 1), Wt = whole({8, 6}, 2), bias = whole({8}, 3);
    const auto want = cg::linear(X, Wt, bias);
    const auto S0 = cg::shard(0), R = cg::replicate(), P = cg::partial();
    auto x = [&](cg::placement p) { return layout(ctx, mesh, X, {p}); };
    auto w = [&](cg::placement p) { return layout(ctx, mesh, Wt, {p}); };
    auto b = [&](cg::placement p) { return std::optional<dt>(layout(ctx, mesh, bias, {p})); };
    // Column-wise: w Shard(0), bias Shard(0) -> output Shard(-1).
    expect([&] { return cg::linear(x(R), w(S0), b(S0)); }, {cg::shard(2)}, none, want);
    // Row-wise: x Shard(-1), w Shard(1) -> Partial(sum), the bias divided in.
    expect([&] { return cg::linear(x(cg::shard(2)), w(cg::shard(1)), b(R)); }, {P}, none, want);
    // Batch rows sharded.
    expect([&] { return cg::linear(x(S0), w(R), b(R)); }, {S0}, none, want);
    const auto A = whole({4, 3, 5}, 1), B = whole({4, 5, 2}, 2);
    expect([&] { return cg::bmm(layout(ctx, mesh, A, {S0}), layout(ctx, mesh, B, {S0})); }, {S0}, none,
           cg::bmm(A, B));
    expect([&] { return cg::bmm(layout(ctx, mesh, A, {cg::shard(2)}), layout(ctx, mesh, B, {cg::shard(1)})); }, {P},
           none, cg::bmm(A, B));
  });
}

// ================================ reductions, softmax, layer_norm ================================

TEST_CASE("sharding.reductions.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    const auto X = whole({4, 6}, 1), U = whole({5, 6}, 2);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
    auto x = [&](cg::placement p) { return layout(ctx, mesh, X, {p}); };
    expect([&] { return cg::sum(x(S0), {0}); }, {P}, none, cg::sum(X, {0}));
    expect([&] { return cg::sum(x(S0), {1}); }, {S0}, none, cg::sum(X, {1}));
    expect([&] { return cg::sum(x(S1), {0}); }, {S0}, none, cg::sum(X, {0}));  // dim 1 becomes dim 0
    expect([&] { return cg::sum(x(S1), {0}, true); }, {S1}, none, cg::sum(X, {0}, true));
    expect([&] { return cg::sum(x(S0)); }, {P}, none, cg::sum(X));
    expect([&] { return cg::sum(x(P), {1}); }, {P}, none, cg::sum(X, {1}));
    expect([&] { return cg::mean(x(S0), {0}); }, {cg::partial("avg")}, none, cg::mean(X, {0}));
    expect([&] { return cg::mean(x(P), {0}); }, {P}, none, cg::mean(X, {0}));
    // Uneven (5 rows on 2): local means are not averageable; the dim is gathered first.
    expect([&] { return cg::mean(layout(ctx, mesh, U, {S0}), {0}); }, {R}, {{"all_gather", 1}}, cg::mean(U, {0}));
    expect([&] { return cg::sum(layout(ctx, mesh, U, {S0}), {0}); }, {P}, none, cg::sum(U, {0}));
  });
}

TEST_CASE("sharding.softmax_layer_norm.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({4});
    const auto X = whole({8, 6}, 1), g = whole({6}, 2), b = whole({6}, 3);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
    auto x = [&](cg::placement p) { return layout(ctx, mesh, X, {p}); };
    expect([&] { return cg::softmax(x(S0), 1); }, {S0}, none, cg::softmax(X, 1));
    expect([&] { return cg::softmax(x(S1), -1); }, {R}, {{"all_gather", 1}}, cg::softmax(X, 1));
    expect([&] { return cg::log_softmax(x(S1), 0); }, {S1}, none, cg::log_softmax(X, 0));
    expect([&] { return cg::log_softmax(x(P), 0); }, {R}, {{"all_reduce", 1}}, cg::log_softmax(X, 0));
    const auto want = std::get<0>(cg::native_layer_norm(X, {6}, g, b, 1e-5));
    const auto gw = std::optional<dt>(layout(ctx, mesh, g, {R})), bb = std::optional<dt>(layout(ctx, mesh, b, {R}));
    expect([&] { return cg::layer_norm(x(S0), {6}, gw, bb); }, {S0}, none, want);
    expect([&] { return cg::layer_norm(x(S1), {6}, gw, bb); }, {R}, {{"all_gather", 1}}, want);
    // A sharded weight is gathered (the normalized dim must be whole everywhere).
    expect([&] { return cg::layer_norm(x(S0), {6}, std::optional<dt>(layout(ctx, mesh, g, {S0})), bb); }, {S0},
           {{"all_gather", 1}}, want);
  });
}

// ================================ embedding, views, cat ================================

TEST_CASE("sharding.embedding.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    std::vector<i64> ids{0, 3, 9, 2, 2, 7, 5, 1};
    const auto I = cg::tensor<i64>::from(ids, {4, 2});
    const auto W = whole({10, 6}, 1);
    const auto want = cg::embedding(I, W);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate();
    auto idx = [&](cg::placement p) { return layout(ctx, mesh, I, {p}); };
    auto w = [&](cg::placement p) { return layout(ctx, mesh, W, {p}); };
    expect([&] { return cg::embedding(idx(S0), w(R)); }, {S0}, none, want);
    expect([&] { return cg::embedding(idx(S1), w(R)); }, {S1}, none, want);
    expect([&] { return cg::embedding(idx(R), w(S1)); }, {cg::shard(2)}, none, want);  // column-wise
    expect([&] { return cg::embedding(idx(R), w(R)); }, {R}, none, want);
  });
}

TEST_CASE("sharding.views.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    const auto X = whole({4, 6}, 1), Y = whole({2, 4, 6}, 2);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), S2 = cg::shard(2), R = cg::replicate(), P = cg::partial();
    auto x = [&](cg::placement p) { return layout(ctx, mesh, X, {p}); };
    auto y = [&](cg::placement p) { return layout(ctx, mesh, Y, {p}); };
    expect([&] { return cg::transpose(x(S0), 0, 1); }, {S1}, none, X.transpose(0, 1));
    expect([&] { return cg::transpose(x(P), 0, 1); }, {P}, none, X.transpose(0, 1));
    expect([&] { return cg::permute(y(S2), {2, 0, 1}); }, {S0}, none, Y.permute({2, 0, 1}));
    expect([&] { return cg::permute(y(S0), {2, 0, 1}); }, {S1}, none, Y.permute({2, 0, 1}));
    expect([&] { return cg::reshape(x(S0), {24}); }, {S0}, none, X.reshape({24}));         // flatten
    expect([&] { return cg::reshape(x(S0), {2, 2, 6}); }, {S0}, none, X.reshape({2, 2, 6}));  // split
    expect([&] { return cg::reshape(y(S1), {2, 24}); }, {S1}, none, Y.reshape({2, 24}));
    expect([&] { return cg::reshape(y(S0), {-1, 6}); }, {S0}, none, Y.reshape({8, 6}));
    expect([&] { return cg::reshape(x(S1), {24}); }, {R}, {{"all_gather", 1}}, X.reshape({24}));  // not first
    expect([&] { return cg::reshape(x(S0), {6, 4}); }, {R}, {{"all_gather", 1}}, X.reshape({6, 4}));
    expect([&] { return cg::reshape(x(P), {3, 8}); }, {P}, none, X.reshape({3, 8}));
  });
}

TEST_CASE("sharding.cat.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    const auto A = whole({4, 6}, 1), B = whole({4, 2}, 2);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
    auto a = [&](cg::placement p) { return layout(ctx, mesh, A, {p}); };
    auto b = [&](cg::placement p) { return layout(ctx, mesh, B, {p}); };
    const auto want = cg::cat({A, B}, 1);
    expect([&] { return cg::cat(std::vector<dt>{a(S0), b(S0)}, 1); }, {S0}, none, want);
    expect([&] { return cg::cat(std::vector<dt>{a(S0), b(R)}, 1); }, {S0}, none, want);
    expect([&] { return cg::cat(std::vector<dt>{a(P), b(P)}, 1); }, {P}, none, want);
    expect([&] { return cg::cat(std::vector<dt>{a(S1), b(S1)}, 1); }, {R}, {{"all_gather", 2}}, want);
  });
}

// ================================ traced, errors ================================

TEST_CASE("sharding.traced_equal_to_eager.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    const auto X = whole({4, 6}, 1), W = whole({6, 8}, 2);
    const auto Bias = whole({8}, 3);
    const auto xl = layout(ctx, mesh, X, {cg::shard(1)}).to_local();
    const auto wl = layout(ctx, mesh, W, {cg::shard(0)}).to_local();
    auto program = [&](auto x, auto w, auto b) {
      using T = typename decltype(x)::value_type;
      auto dx = cg::dtensor<T>::from_local(x, mesh, {cg::shard(1)}, {.shape = X.shape()});
      auto dw = cg::dtensor<T>::from_local(w, mesh, {cg::shard(0)}, {.shape = W.shape()});
      auto db = cg::dtensor<T>::from_local(b, mesh, {cg::replicate()});
      auto h = cg::matmul(dx, dw) + db;       // Partial(sum) plus the bias divided: no collective
      CHECK(h.placements() == places{cg::partial()});
      auto s = cg::softmax(h * 0.25f, 1);     // the Partial reduced: one all_reduce
      return cg::sum(s, {1}).full_tensor();   // Replicate already
    };
    std::optional<cg::comm_counter> eager_count(std::in_place);
    const auto eager = program(xl, wl, Bias);
    const auto eager_counts = eager_count->counts();
    eager_count.reset();
    CHECK(eager_counts.at("all_reduce") == 1);
    cg::comm_counter traced_count;
    auto g = cg::trace(program, cg::input<float>(xl.shape()), cg::input<float>(wl.shape()),
                       cg::input<float>(Bias.shape()));
    CHECK(traced_count.counts() == eager_counts);
    CHECK(traced_count.total() == 1);
    CHECK(g.count("all_reduce") == 1);
    g.lint();
    const auto want = cg::sum(cg::softmax(cg::eval((cg::matmul(X, W) + Bias) * 0.25f), 1), {1});
    check_close(eager, want);
    check_close(cg::compile(g, ctx)(xl, wl, Bias), want);
  });
}

TEST_CASE("sharding.op_without_rule_is_an_error.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    const auto x = layout(ctx, mesh, whole({4, 6}), {cg::shard(0)});
    CHECK_THROWS_WITH_AS(cg::dtensor_op(cg::ops::var_backward{{0}, 1.0, false}, x, x),
                         doctest::Contains("var_backward: no sharding rule for dtensor inputs yet"), cg::error);
    // An op with a rule through the same generic entry point.
    const auto s = cg::dtensor_op(cg::ops::softmax{1}, x);
    CHECK(s.placements() == places{cg::shard(0)});
    check_close(s.full_tensor(), cg::softmax(whole({4, 6}), 1));
  });
}

// ================================ rules of issue 16 item 3 ================================
// Each op below on dtensors laid out several ways (Shard of each dim, Replicate, Partial where it
// passes), eagerly and inside cg::trace: the output's placements, and its full tensor against the
// op on the whole tensors. Shapes of 5 rows leave uneven shards on 2 and 4 ranks.

namespace test_sharding_rules {

/// One input: its whole tensor, the placements it is laid out as, and the test line naming it
/// (shown with a failure).
template <class T>
struct in {
  cg::tensor<T> full;
  places ps;
  unsigned line;
};
template <class T>
in<T> at(const cg::tensor<T>& full, places ps, std::source_location loc = std::source_location::current()) {
  return {full, std::move(ps), static_cast<unsigned>(loc.line())};
}

/// A whole tensor of `shape` whose elements are distinct integers (no ties for max/argmax).
cg::tensor<float> distinct(const shape_t& shape, int seed = 0) {
  const auto n = cg::numel_of(shape);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (i64 i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>((i * 37 + seed) % n - n / 2);
  return cg::tensor<float>::from(v, shape);
}

/// i64 indices of `shape` in [0, bound): (i * 5 + seed) % bound.
cg::tensor<i64> indices(const shape_t& shape, i64 bound, int seed = 0) {
  std::vector<i64> v(static_cast<std::size_t>(cg::numel_of(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = (static_cast<i64>(i) * 5 + seed) % bound;
  return cg::tensor<i64>::from(v, shape);
}

template <class U>
void same_values(const cg::tensor<U>& got, const cg::tensor<U>& want) {
  if constexpr (std::is_floating_point_v<U>) {
    check_close(got, want);
  } else {
    REQUIRE(got.shape() == want.shape());
    CHECK(got.contiguous().to_vector() == want.contiguous().to_vector());
  }
}

/// `op` (dtensors -> dtensor) on `ins` laid out on `mesh`: eagerly, then traced (the inputs as
/// symbolic local values, the graph compiled and run): both give placements `out` and the full
/// tensor `want`.
template <class F, class U, class... T>
void both(cg::rank_context& ctx, const cg::device_mesh& mesh, F&& op, const places& out,
          const cg::tensor<U>& want, const in<T>&... ins) {
  const unsigned lines[] = {ins.line...};
  const unsigned line = lines[sizeof...(ins) - 1];  // the last input's: the case's call
  INFO("the case at line ", line);
  {
    const auto r = op(layout(ctx, mesh, ins.full, ins.ps)...);
    CHECK(cg::placements_str(r.placements()) == cg::placements_str(out));
    CHECK(r.shape() == want.shape());
    same_values(r.full_tensor(), want);
  }
  auto program = [&](const auto&... xs) {
    const auto r = op(cg::dtensor<typename std::remove_cvref_t<decltype(xs)>::value_type>::from_local(
        xs, mesh, ins.ps, {.shape = ins.full.shape()})...);
    CHECK(cg::placements_str(r.placements()) == cg::placements_str(out));
    return r.full_tensor();
  };
  auto g = cg::trace(program, cg::input<T>(layout(ctx, mesh, ins.full, ins.ps).to_local().shape())...);
  g.lint();
  same_values(cg::compile(g, ctx)(layout(ctx, mesh, ins.full, ins.ps).to_local()...), want);
}

}  // namespace test_sharding_rules

TEST_CASE("sharding.views.narrow_select.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto X = whole({5, 6}, 1);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
      auto nar = [](i64 d, i64 s, i64 l) { return [=](const auto& x) { return cg::narrow(x, d, s, l); }; };
      both(ctx, mesh, nar(1, 1, 3), {S0}, X.narrow(1, 1, 3), at(X, {S0}));        // another dim: kept
      both(ctx, mesh, nar(1, 1, 3), {R}, X.narrow(1, 1, 3), at(X, {S1}));         // the narrowed dim: gathered
      both(ctx, mesh, nar(1, 0, 6), {S1}, X.narrow(1, 0, 6), at(X, {S1}));        // all of it: kept
      both(ctx, mesh, nar(0, 2, 3), {R}, X.narrow(0, 2, 3), at(X, {S0}));         // uneven rows gathered
      both(ctx, mesh, nar(0, 1, 2), {P}, X.narrow(0, 1, 2), at(X, {P}));          // linear: Partial kept
      both(ctx, mesh, nar(-1, 1, 2), {R}, X.narrow(1, 1, 2), at(X, {R}));
      auto sel = [](i64 d, i64 i) { return [=](const auto& x) { return cg::select(x, d, i); }; };
      both(ctx, mesh, sel(0, 3), {R}, X.select(0, 3), at(X, {S0}));               // selected dim: gathered
      both(ctx, mesh, sel(0, 3), {S0}, X.select(0, 3), at(X, {S1}));              // a later Shard moves down
      both(ctx, mesh, sel(1, -2), {S0}, X.select(1, 4), at(X, {S0}));             // an earlier one stays
      both(ctx, mesh, sel(1, 2), {P}, X.select(1, 2), at(X, {P}));
      const auto c = cg::choose_sharding(cg::ops::select{1, 0}, {{X.shape(), {S1}}}, mesh);
      REQUIRE(c.strategies.size() == 1);
      CHECK(c.best().in == std::vector<places>{{R}});
    });
}

TEST_CASE("sharding.views.unsqueeze_squeeze_contiguous_repeat.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto X = whole({5, 6}, 2), Y = whole({5, 1, 6}, 3);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), S2 = cg::shard(2), R = cg::replicate(), P = cg::partial();
      auto unsq = [](i64 d) { return [=](const auto& x) { return cg::unsqueeze(x, d); }; };
      both(ctx, mesh, unsq(0), {S2}, X.unsqueeze(0), at(X, {S1}));
      both(ctx, mesh, unsq(1), {S0}, X.unsqueeze(1), at(X, {S0}));
      both(ctx, mesh, unsq(-1), {S1}, X.unsqueeze(2), at(X, {S1}));
      both(ctx, mesh, unsq(1), {S2}, X.unsqueeze(1), at(X, {S1}));               // at the Shard's own dim
      both(ctx, mesh, unsq(1), {P}, X.unsqueeze(1), at(X, {P}));
      auto sq = [](i64 d) { return [=](const auto& x) { return cg::squeeze(x, d); }; };
      both(ctx, mesh, sq(1), {S1}, cg::squeeze(Y, 1), at(Y, {S2}));               // later Shard moves down
      both(ctx, mesh, sq(1), {S0}, cg::squeeze(Y, 1), at(Y, {S0}));
      // dim 0 has 5 rows: not squeezed, though a rank's piece may hold one row (4 ranks).
      both(ctx, mesh, sq(0), {S0}, cg::squeeze(Y, 0), at(Y, {S0}));
      both(ctx, mesh, sq(-2), {P}, cg::squeeze(Y, 1), at(Y, {P}));
      auto cont = [](const auto& x) { return cg::contiguous(cg::transpose(x, 0, 1)); };
      both(ctx, mesh, cont, {S1}, X.transpose(0, 1).contiguous(), at(X, {S0}));
      both(ctx, mesh, cont, {P}, X.transpose(0, 1).contiguous(), at(X, {P}));
      both(ctx, mesh, [](const auto& x) { return cg::contiguous(x); }, {S0}, X, at(X, {S0}));
      auto rep = [](std::vector<i64> r) { return [=](const auto& x) { return cg::repeat(x, r); }; };
      both(ctx, mesh, rep({1, 2}), {S0}, X.repeat({1, 2}), at(X, {S0}));          // dim 0 not repeated
      both(ctx, mesh, rep({1, 2}), {R}, X.repeat({1, 2}), at(X, {S1}));           // repeated: gathered
      both(ctx, mesh, rep({2, 1}), {R}, X.repeat({2, 1}), at(X, {S0}));
      both(ctx, mesh, rep({3, 1, 1}), {S1}, X.repeat({3, 1, 1}), at(X, {S0}));    // a new leading dim
      both(ctx, mesh, rep({2, 2}), {P}, X.repeat({2, 2}), at(X, {P}));            // linear
    });
}

TEST_CASE("sharding.stack_copy.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto A = whole({5, 6}, 1), B = whole({5, 6}, 4);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), S2 = cg::shard(2), R = cg::replicate(), P = cg::partial();
      auto st = [](i64 d) { return [=](const auto& a, const auto& b) { return cg::stack(std::vector{a, b}, d); }; };
      both(ctx, mesh, st(0), {S1}, cg::stack({A, B}, 0), at(A, {S0}), at(B, {S0}));
      both(ctx, mesh, st(1), {S2}, cg::stack({A, B}, 1), at(A, {S1}), at(B, {R}));   // R follows the Shard
      both(ctx, mesh, st(2), {S0}, cg::stack({A, B}, 2), at(A, {R}), at(B, {S0}));
      both(ctx, mesh, st(0), {P}, cg::stack({A, B}, 0), at(A, {P}), at(B, {R}));     // R divided into Partial
      both(ctx, mesh, st(-1), {S0}, cg::stack({A, B}, 2), at(A, {P}), at(B, {S0}));  // Partial gives way
      both(ctx, mesh, st(0), {R}, cg::stack({A, B}, 0), at(A, {S0}), at(B, {S1}));   // two Shards: Replicate
      {
        cg::comm_counter c;
        const auto r = cg::stack(std::vector{layout(ctx, mesh, A, {S0}), layout(ctx, mesh, B, {S1})}, 0);
        CHECK(c.count("all_gather") == 2);
        CHECK(c.total() == 2);
      }
      const auto D = whole({5, 6}, 2), row = whole({6}, 5);
      const auto want = cg::eval(D * 0.0f + row);
      auto cp = [](const auto& d, const auto& s) { return cg::copy(d, s); };
      both(ctx, mesh, cp, {S0}, want, at(D, {S0}), at(row, {R}));
      both(ctx, mesh, cp, {S1}, want, at(D, {S1}), at(row, {S0}));  // the row cut as dst's columns
      both(ctx, mesh, cp, {R}, want, at(D, {R}), at(row, {P}));     // not linear: the Partial reduced
      both(ctx, mesh, cp, {S0}, cg::eval(D + 1.0f), at(D, {S0}), at(cg::eval(D + 1.0f), {S0}));
    });
}

TEST_CASE("sharding.var_amax_amin_max_min.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto X = distinct({5, 6}, 3);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
      const auto PMax = cg::partial("max"), PMin = cg::partial("min");
      // 5 rows (6 columns) on 4 ranks leave one rank an empty piece, whose max has no identity:
      // that dim is gathered there instead.
      const auto pmax = n == 2 ? PMax : R, pmin = n == 2 ? PMin : R;
      auto vr = [](std::vector<i64> d, bool k) { return [=](const auto& x) { return cg::var(x, d, 1.0, k); }; };
      both(ctx, mesh, vr({0}, false), {S0}, cg::var(X, {0}), at(X, {S1}));       // kept dim 1 becomes 0
      both(ctx, mesh, vr({0}, true), {S1}, cg::var(X, {0}, 1.0, true), at(X, {S1}));
      both(ctx, mesh, vr({0}, false), {R}, cg::var(X, {0}), at(X, {S0}));        // reduced dim: gathered
      both(ctx, mesh, vr({}, false), {R}, cg::var(X), at(X, {S1}));
      both(ctx, mesh, vr({1}, false), {R}, cg::var(X, {1}), at(X, {P}));         // not linear: reduced
      auto am = [](std::vector<i64> d, bool k) { return [=](const auto& x) { return cg::amax(x, d, k); }; };
      auto an = [](std::vector<i64> d) { return [=](const auto& x) { return cg::amin(x, d); }; };
      both(ctx, mesh, am({0}, false), {pmax}, cg::amax(X, {0}), at(X, {S0}));
      const auto X8 = distinct({8, 3}, 5);  // 8 rows: no empty piece on 2 or 4 ranks
      both(ctx, mesh, am({0}, false), {PMax}, cg::amax(X8, {0}), at(X8, {S0}));
      both(ctx, mesh, an({0}), {PMin}, cg::amin(X8, {0}), at(X8, {S0}));
      both(ctx, mesh, am({0}, false), {S0}, cg::amax(X, {0}), at(X, {S1}));
      both(ctx, mesh, am({}, false), {pmax}, cg::amax(X), at(X, {S1}));
      both(ctx, mesh, am({1}, true), {S0}, cg::amax(X, {1}, true), at(X, {S0}));
      both(ctx, mesh, am({1}, false), {R}, cg::amax(X, {1}), at(X, {P}));        // a sum's terms: reduced
      // A Partial(max) passes through another amax.
      auto am2 = [](const auto& x) { return cg::amax(cg::amax(x, {0}, true), {1}); };
      both(ctx, mesh, am2, {PMax}, cg::amax(cg::amax(X8, {0}, true), {1}), at(X8, {S0}));
      both(ctx, mesh, an({0}), {pmin}, cg::amin(X, {0}), at(X, {S0}));
      both(ctx, mesh, an({0}), {S0}, cg::amin(X, {0}), at(X, {S1}));
      both(ctx, mesh, [](const auto& x) { return cg::max(x); }, {pmax}, cg::max(X), at(X, {S0}));
      both(ctx, mesh, [](const auto& x) { return cg::min(x); }, {pmin}, cg::min(X), at(X, {S1}));
      both(ctx, mesh, [](const auto& x) { return cg::max(x); }, {PMax}, cg::max(X8), at(X8, {S0}));
      both(ctx, mesh, [](const auto& x) { return cg::min(x); }, {R}, cg::min(X), at(X, {R}));
    });
}

TEST_CASE("sharding.max_dim_argmax.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto X = distinct({5, 6}, 1);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
      const auto [v0, i0] = cg::max(X, 0);
      const auto [v1, i1] = cg::min(X, 1, true);
      auto mx_v = [](i64 d) { return [=](const auto& x) { return std::get<0>(cg::max(x, d)); }; };
      auto mx_i = [](i64 d) { return [=](const auto& x) { return std::get<1>(cg::max(x, d)); }; };
      both(ctx, mesh, mx_v(0), {R}, v0, at(X, {S0}));  // the reduced dim gathered: local indices
      both(ctx, mesh, mx_i(0), {R}, i0, at(X, {S0}));  // would not reduce across ranks
      both(ctx, mesh, mx_v(0), {S0}, v0, at(X, {S1}));
      both(ctx, mesh, mx_i(0), {S0}, i0, at(X, {S1}));
      both(ctx, mesh, mx_i(0), {R}, i0, at(X, {P}));
      auto mn_i = [](const auto& x) { return std::get<1>(cg::min(x, 1, true)); };
      auto mn_v = [](const auto& x) { return std::get<0>(cg::min(x, 1, true)); };
      both(ctx, mesh, mn_i, {S0}, i1, at(X, {S0}));
      both(ctx, mesh, mn_v, {R}, v1, at(X, {S1}));
      auto amx = [](std::optional<i64> d) { return [=](const auto& x) { return cg::argmax(x, d); }; };
      both(ctx, mesh, amx(1), {S0}, cg::argmax(X, 1), at(X, {S0}));
      both(ctx, mesh, amx(0), {R}, cg::argmax(X, 0), at(X, {S0}));
      both(ctx, mesh, amx(std::nullopt), {R}, cg::argmax(X), at(X, {S1}));
      both(ctx, mesh, [](const auto& x) { return cg::argmin(x, 0, true); }, {S1}, cg::argmin(X, 0, true),
           at(X, {S1}));
    });
}

TEST_CASE("sharding.rms_norm.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto X = whole({5, 6}, 1), W = whole({6}, 2);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
      const auto want = cg::rms_norm(X, {6}, W, 1e-5);
      auto rn = [](const auto& x, const auto& w) { return cg::rms_norm(x, {6}, std::optional(w), 1e-5); };
      both(ctx, mesh, rn, {S0}, want, at(X, {S0}), at(W, {R}));
      both(ctx, mesh, rn, {R}, want, at(X, {S1}), at(W, {R}));   // the normalized dim gathered
      both(ctx, mesh, rn, {S0}, want, at(X, {S0}), at(W, {S0}));  // the weight gathered
      both(ctx, mesh, rn, {R}, want, at(X, {P}), at(W, {R}));     // a Partial reduced
      both(ctx, mesh, [](const auto& x) { return cg::rms_norm(x, {6}); }, {S0}, cg::rms_norm(X, {6}), at(X, {S0}));
    });
}

TEST_CASE("sharding.softmax_backward.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto X = cg::eval(whole({5, 6}, 1) * 0.25f), G = whole({5, 6}, 2);
      const auto Y = cg::softmax(X, 1), LY = cg::log_softmax(X, 1);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
      auto sb = [](i64 d) { return [=](const auto& g, const auto& y) { return cg::softmax_backward(g, y, d); }; };
      const auto want = cg::softmax_backward(G, Y, 1);
      both(ctx, mesh, sb(1), {S0}, want, at(G, {S0}), at(Y, {S0}));
      both(ctx, mesh, sb(1), {S0}, want, at(G, {R}), at(Y, {S0}));   // the output has more shards
      both(ctx, mesh, sb(-1), {R}, want, at(G, {S1}), at(Y, {R}));   // `dim` gathered
      both(ctx, mesh, sb(1), {R}, want, at(G, {P}), at(Y, {R}));     // a Partial reduced
      both(ctx, mesh, sb(0), {S1}, cg::softmax_backward(G, cg::softmax(X, 0), 0), at(G, {S1}),
           at(cg::softmax(X, 0), {S0}));                             // a tie: grad's, y gathered
      both(ctx, mesh, [](const auto& g, const auto& y) { return cg::log_softmax_backward(g, y, 1); }, {S0},
           cg::log_softmax_backward(G, LY, 1), at(G, {S0}), at(LY, {R}));
    });
}

TEST_CASE("sharding.index_select_gather_scatter_add.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto X = whole({5, 6}, 1);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
      const auto I = indices({7}, 5, 2);
      auto is = [](const auto& x, const auto& i) { return cg::index_select(x, 0, i); };
      const auto want = cg::index_select(X, 0, I);
      both(ctx, mesh, is, {S1}, want, at(X, {S1}), at(I, {R}));  // another dim: kept
      both(ctx, mesh, is, {S0}, want, at(X, {R}), at(I, {S0}));  // the index sharded: rows of the output
      both(ctx, mesh, is, {P}, want, at(X, {P}), at(I, {R}));    // selection is linear
      both(ctx, mesh, is, {R}, want, at(X, {R}), at(I, {R}));
      const auto G = indices({5, 3}, 6, 1);
      auto ga = [](const auto& x, const auto& i) { return cg::gather(x, 1, i); };
      const auto gwant = cg::gather(X, 1, G);
      both(ctx, mesh, ga, {S0}, gwant, at(X, {S0}), at(G, {S0}));  // rows on both
      both(ctx, mesh, ga, {S1}, gwant, at(X, {R}), at(G, {S1}));   // the index sharded on the gather dim
      // The gathered-from dim must be whole: gathered (on the cost model an all_gather of these
      // few bytes is cheaper than the all_to_all re-sharding by rows would be).
      both(ctx, mesh, ga, {R}, gwant, at(X, {S1}), at(G, {R}));
      both(ctx, mesh, ga, {R}, gwant, at(X, {R}), at(G, {R}));
      const auto Src = whole({5, 3}, 4);
      auto sa = [](const auto& s, const auto& i, const auto& y) { return cg::scatter_add(s, 1, i, y); };
      const auto swant = cg::scatter_add(X, 1, G, Src);
      both(ctx, mesh, sa, {S0}, swant, at(X, {S0}), at(G, {S0}), at(Src, {S0}));
      both(ctx, mesh, sa, {R}, swant, at(X, {S1}), at(G, {R}), at(Src, {R}));  // the scatter dim gathered
      both(ctx, mesh, sa, {S0}, swant, at(X, {P}), at(G, {R}), at(Src, {R}));   // a reduce_scatter
      both(ctx, mesh, sa, {R}, swant, at(X, {R}), at(G, {R}), at(Src, {R}));
      // index rows fewer than self's: no Shard(0) strategy (the pieces would not line up).
      const auto G4 = indices({4, 3}, 6, 3);
      const auto Src4 = whole({4, 3}, 5);
      both(ctx, mesh, sa, {R}, cg::scatter_add(X, 1, G4, Src4), at(X, {S0}), at(G4, {S0}), at(Src4, {S0}));
    });
}

TEST_CASE("sharding.cross_entropy.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto X = whole({5, 4}, 1), Wt = cg::eval(whole({4}, 2) * 0.0f + 1.5f);
      const auto T = indices({5}, 4, 1);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
      auto ce = [](cg::loss_reduction r) {
        return [=](const auto& x, const auto& t) { return cg::cross_entropy(x, t, std::nullopt, -100, r); };
      };
      using lr = cg::loss_reduction;
      both(ctx, mesh, ce(lr::none), {S0}, cg::cross_entropy(X, T, std::nullopt, -100, lr::none), at(X, {S0}), at(T, {S0}));
      both(ctx, mesh, ce(lr::sum), {P}, cg::cross_entropy(X, T, std::nullopt, -100, lr::sum), at(X, {S0}), at(T, {R}));
      both(ctx, mesh, ce(lr::mean), {R}, cg::cross_entropy(X, T), at(X, {S0}), at(T, {S0}));  // mean: gathered
      both(ctx, mesh, ce(lr::none), {R}, cg::cross_entropy(X, T, std::nullopt, -100, lr::none), at(X, {S1}), at(T, {R}));
      both(ctx, mesh, ce(lr::sum), {R}, cg::cross_entropy(X, T, std::nullopt, -100, lr::sum), at(X, {P}), at(T, {R}));
      // Class weights (Replicate) and an ignored target.
      const auto T2 = cg::tensor<i64>::from({1, -100, 3, 0, 2}, {5});
      auto cew = [](const auto& x, const auto& t, const auto& w) {
        return cg::cross_entropy(x, t, std::optional(w), -100, cg::loss_reduction::sum, 0.1);
      };
      both(ctx, mesh, cew, {P}, cg::cross_entropy(X, T2, Wt, -100, lr::sum, 0.1), at(X, {S0}), at(T2, {S0}), at(Wt, {S0}));
      // [N, C, d]: the spatial dim 2 of the input is the target's dim 1.
      const auto X3 = whole({3, 4, 5}, 2);
      const auto T3 = indices({3, 5}, 4, 2);
      both(ctx, mesh, ce(lr::none), {S1}, cg::cross_entropy(X3, T3, std::nullopt, -100, lr::none), at(X3, {cg::shard(2)}),
           at(T3, {R}));
    });
}

TEST_CASE("sharding.sdpa.world2_world4") {
  using namespace test_sharding_rules;
  for (int n : {2, 4})
    run(n, [n](cg::rank_context& ctx) {
      const cg::device_mesh mesh({n});
      const auto Q = cg::eval(whole({2, 4, 3, 2}, 1) * 0.25f), K = cg::eval(whole({2, 4, 5, 2}, 2) * 0.25f),
                 V = whole({2, 4, 5, 3}, 3);
      const auto S0 = cg::shard(0), S1 = cg::shard(1), S2 = cg::shard(2), R = cg::replicate();
      const auto want = cg::scaled_dot_product_attention(Q, K, V);
      auto at3 = [](const auto& q, const auto& k, const auto& v) { return cg::scaled_dot_product_attention(q, k, v); };
      both(ctx, mesh, at3, {S1}, want, at(Q, {S1}), at(K, {S1}), at(V, {S1}));  // heads
      both(ctx, mesh, at3, {S1}, want, at(Q, {S1}), at(K, {R}), at(V, {R}));    // k, v cut locally
      both(ctx, mesh, at3, {R}, want, at(Q, {S2}), at(K, {R}), at(V, {R}));     // the sequence gathered
      both(ctx, mesh, at3, {R}, want, at(Q, {R}), at(K, {R}), at(V, {R}));
      if (n == 2) both(ctx, mesh, at3, {S0}, want, at(Q, {S0}), at(K, {S0}), at(V, {S0}));  // batch (2 rows)
      // A mask [L, S] broadcasts over batch and heads: Replicate; a full one is cut as the output.
      const auto Mb = cg::eval(whole({3, 5}, 4) * 0.5f), Mf = cg::eval(whole({2, 4, 3, 5}, 5) * 0.5f);
      auto atm = [](const auto& q, const auto& k, const auto& v, const auto& m) {
        return cg::scaled_dot_product_attention(q, k, v, m);
      };
      both(ctx, mesh, atm, {S1}, cg::scaled_dot_product_attention(Q, K, V, Mb), at(Q, {S1}), at(K, {S1}), at(V, {S1}),
           at(Mb, {S0}));
      both(ctx, mesh, atm, {S1}, cg::scaled_dot_product_attention(Q, K, V, Mf), at(Q, {S1}), at(K, {S1}), at(V, {S1}),
           at(Mf, {R}));
      const auto c = cg::choose_sharding(cg::ops::scaled_dot_product_attention{0.0, false, std::nullopt},
                                         {{Q.shape(), {S1}}, {K.shape(), {S1}}, {V.shape(), {S1}}, {Mb.shape(), {R}}},
                                         mesh);
      // PyTorch's order: all-Replicate, heads, batch.
      REQUIRE(c.strategies.size() == 3);
      CHECK(c.strategies[1].out == places{S1});
      CHECK(c.strategies[1].in == std::vector<places>{{S1}, {S1}, {S1}, {R}});
      CHECK(c.strategies[2].out == places{S0});
      CHECK(c.chosen == 1);
    });
}

TEST_CASE("sharding.rules.2d_mesh.world4") {
  using namespace test_sharding_rules;
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    const auto X = distinct({5, 6}, 2);
    const auto S0 = cg::shard(0), S1 = cg::shard(1), R = cg::replicate(), P = cg::partial();
    const auto PMax = cg::partial("max");
    both(ctx, mesh, [](const auto& x) { return cg::narrow(x, 1, 2, 3); }, {S0, R}, X.narrow(1, 2, 3), at(X, {S0, S1}));
    both(ctx, mesh, [](const auto& x) { return cg::select(x, 0, 4); }, {R, S0}, X.select(0, 4), at(X, {S0, S1}));
    both(ctx, mesh, [](const auto& x) { return cg::unsqueeze(x, 1); }, {S0, cg::shard(2)}, X.unsqueeze(1),
         at(X, {S0, S1}));
    both(ctx, mesh, [](const auto& x) { return cg::amax(x, {1}); }, {S0, PMax}, cg::amax(X, {1}), at(X, {S0, S1}));
    both(ctx, mesh, [](const auto& x) { return cg::amax(x, {}); }, {PMax, PMax}, cg::amax(X), at(X, {S0, S0}));
    both(ctx, mesh, [](const auto& x) { return cg::var(x, {1}); }, {S0, R}, cg::var(X, {1}), at(X, {S0, S1}));
    both(ctx, mesh, [](const auto& x) { return cg::argmax(x, 0); }, {R, S0}, cg::argmax(X, 0), at(X, {S0, S1}));
    both(ctx, mesh, [](const auto& x) { return cg::repeat(x, {1, 2}); }, {S0, R}, X.repeat({1, 2}), at(X, {S0, S1}));
    const auto B = whole({5, 6}, 7);
    both(ctx, mesh, [](const auto& a, const auto& b) { return cg::stack(std::vector{a, b}, 1); }, {S0, P},
         cg::stack({X, B}, 1), at(X, {S0, P}), at(B, {R, R}));
    const auto Q = cg::eval(whole({2, 4, 3, 2}, 1) * 0.25f), K = cg::eval(whole({2, 4, 5, 2}, 2) * 0.25f),
               V = whole({2, 4, 5, 3}, 3);
    both(ctx, mesh, [](const auto& q, const auto& k, const auto& v) { return cg::scaled_dot_product_attention(q, k, v); },
         {S0, S1}, cg::scaled_dot_product_attention(Q, K, V), at(Q, {S0, S1}), at(K, {S0, S1}), at(V, {S0, S1}));
    const auto Xc = whole({4, 3}, 1);
    const auto T = indices({4}, 3, 1);
    both(ctx, mesh,
         [](const auto& x, const auto& t) { return cg::cross_entropy(x, t, std::nullopt, -100, cg::loss_reduction::sum); },
         {P, P}, cg::cross_entropy(Xc, T, std::nullopt, -100, cg::loss_reduction::sum), at(Xc, {S0, S0}),
         at(T, {S0, S0}));
  });
}
