// Example 09: a transformer block written with public ops only, tensor-parallel over 2 ranks
// of the threads backend as Megatron-LM shards it (examples/transformer_block.hpp):
//
//   embedding -> layer_norm -> q, k, v (column shards: half the heads per rank)
//     -> scaled_dot_product_attention (causal) -> output projection (row shard) -> all_reduce
//     -> + residual -> rms_norm -> SwiGLU MLP (column shards, then a row shard)
//     -> reduce_scatter over the tokens, + residual on this rank's rows, all_gather
//     -> layer_norm -> head (vocabulary columns per rank) -> all_gather -> cross_entropy
//
// It runs eagerly, traced and compiled, scheduled by every pass and compiled, and through
// cg::compile_function; every run must give the eager bits, and the eager loss, hidden state and
// logits must equal the single-rank model (the same program on a world of one with the whole
// weights) in float and in double within rounding. Exits non-zero on a mismatch.
#include <ccgraph/ccgraph.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "transformer_block.hpp"

namespace cg = ccgraph;
namespace ex = ccgraph::examples;

namespace {

using i64 = std::int64_t;
constexpr int tp = 2;

/// The largest |a - b| over the three outputs (loss, hidden state, logits).
template <class A, class B>
double worst_diff(const A& a, const B& b) {
  double worst = 0;
  auto one = [&](const auto& x, const auto& y) {
    const auto vx = x.to_vector();
    const auto vy = y.to_vector();
    if (vx.size() != vy.size()) worst = INFINITY;
    for (std::size_t i = 0; i < std::min(vx.size(), vy.size()); ++i) {
      const double d = std::abs(static_cast<double>(vx[i]) - static_cast<double>(vy[i]));
      worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
  };
  one(std::get<0>(a), std::get<0>(b));
  one(std::get<1>(a), std::get<1>(b));
  one(std::get<2>(a), std::get<2>(b));
  return worst;
}

/// Whether two results are the same bits (the same values, NaN never being equal).
template <class A>
bool same(const A& a, const A& b) {
  return std::get<0>(a).to_vector() == std::get<0>(b).to_vector() &&
         std::get<1>(a).to_vector() == std::get<1>(b).to_vector() &&
         std::get<2>(a).to_vector() == std::get<2>(b).to_vector();
}

}  // namespace

int main() {
  const ex::block_config c;  // batch 2, sequence 8, model 16, 4 heads, MLP 32, vocabulary 24
  const auto full = ex::block_params<float>::random(c, 1);
  const auto tokens = ex::block_tokens(c, 7), targets = ex::block_tokens(c, 5);

  // The single-rank model, in float and in double.
  std::tuple<cg::tensor<float>, cg::tensor<float>, cg::tensor<float>> ref;
  std::tuple<cg::tensor<double>, cg::tensor<double>, cg::tensor<double>> ref64;
  cg::run_threads(1, [&](cg::rank_context& ctx) {
    const auto one = ex::transformer_block(c, ctx.world(), 0, 1);
    ref = ex::call_block(one, tokens, targets, full);
    ref64 = ex::call_block(one, tokens, targets, full.to<double>());
  });
  const double float_vs_double = worst_diff(ref, ref64);
  std::cout << "single rank: loss " << std::get<0>(ref).to_vector()[0] << " (double "
            << std::get<0>(ref64).to_vector()[0] << "), float vs double max |diff| " << float_vs_double << "\n\n";
  bool ok = float_vs_double < 2e-5;

  std::vector<std::string> passes;
  for (auto p : cg::schedule_pass_names()) passes.emplace_back(p);

  std::mutex mu;
  cg::run_threads(tp, [&](cg::rank_context& ctx) {
    const auto p = full.shard(ctx.rank(), tp);
    const auto block = ex::transformer_block(c, ctx.world(), ctx.rank(), tp);
    const auto eager = ex::call_block(block, tokens, targets, p);

    // Traced on this rank's shard shapes: one node per op, a wait after each collective.
    auto g = std::apply(
        [&](const auto&... w) {
          return cg::trace(block, cg::input<i64>({c.batch, c.seq}), cg::input<i64>({c.batch, c.seq}),
                           cg::input<float>(w.shape())...);
        },
        p.tuple());
    const auto traced = ex::call_block(cg::compile(g, ctx), tokens, targets, p);
    const auto scheduled_graph = cg::schedule(g, passes);
    const auto scheduled = ex::call_block(cg::compile(scheduled_graph, ctx), tokens, targets, p);
    auto fn = cg::compile_function<i64, i64, float, float, float, float, float, float, float, float, float, float,
                                   float, float, float, float>(block, ctx, {.passes = passes});
    const auto function = ex::call_block(fn, tokens, targets, p);

    const double vs_ref = worst_diff(eager, ref), vs_ref64 = worst_diff(eager, ref64);
    const bool rank_ok = same(traced, eager) && same(scheduled, eager) && same(function, eager) && vs_ref < 2e-5 &&
                         vs_ref64 < 3e-5;
    std::lock_guard lk(mu);
    ok = ok && rank_ok;
    if (ctx.rank() == 0) {
      std::map<std::string, int> ops;
      for (const cg::node* n : g.nodes()) ++ops[std::string(n->op())];
      std::cout << "rank 0's traced block: " << g.size() << " nodes:";
      for (const auto& [op, k] : ops) std::cout << ' ' << op << " x" << k;
      std::cout << "\n\nscheduled by every pass (" << passes.size() << "), the collectives and their waits:\n";
      for (const cg::node* n : scheduled_graph.nodes())
        if (n->is_collective() || n->op() == "wait_tensor") std::cout << "  " << cg::to_string(*n) << '\n';
      std::cout << '\n';
    }
    std::cout << "rank " << ctx.rank() << ": loss " << std::get<0>(eager).to_vector()[0]
              << "; traced, scheduled, compile_function == eager: "
              << (same(traced, eager) && same(scheduled, eager) && same(function, eager) ? "yes" : "NO")
              << "; vs single rank max |diff| " << vs_ref << " (double " << vs_ref64 << ")\n";
  });
  std::cout << (ok ? "OK: the tensor-parallel block equals the single-rank model, eager, traced, scheduled and "
                     "compiled\n"
                   : "MISMATCH\n");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
