// tests/ops/test_transformer_block.cpp: the new graph ops together. A pre-norm transformer block
// with an embedding, a causal attention, a SwiGLU MLP, a head and a cross-entropy loss
// (examples/transformer_block.hpp, public ops only), tensor-parallel over 2 and 4 thread ranks,
// run eagerly, traced and compiled, scheduled by every pass and compiled, and through
// cg::compile_function: the sharded runs give the same bits as each other and agree with the
// single-rank program (float and double) within rounding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "../../examples/transformer_block.hpp"
#include "graph_op_support.hpp"
#include "support.hpp"

namespace cg = ccgraph;
namespace ex = ccgraph::examples;
using namespace ccgraph_test;
using ccgraph_test::graph_ops::bytes_of;

namespace transformer_block_test {

using i64 = std::int64_t;
template <class T>
using block_out = std::tuple<cg::tensor<T>, cg::tensor<T>, cg::tensor<T>>;  // loss, x2, logits
constexpr const char* out_names[] = {"loss", "x2", "logits"};

/// The largest |a - b| over two tensors of one shape (b converted to a's type first).
template <class T, class U>
double max_abs_diff(const cg::tensor<T>& a, const cg::tensor<U>& b) {
  REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector();
  const auto vb = b.to_vector();
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double d = std::abs(static_cast<double>(va[i]) - static_cast<double>(vb[i]));
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

/// Every output of `got` within `tol` of `want`'s.
template <class T, class U>
void check_close(const block_out<T>& got, const block_out<U>& want, double tol, const std::string& what) {
  INFO(what);
  const double d[] = {max_abs_diff(std::get<0>(got), std::get<0>(want)), max_abs_diff(std::get<1>(got), std::get<1>(want)),
                      max_abs_diff(std::get<2>(got), std::get<2>(want))};
  for (int k = 0; k < 3; ++k) {
    INFO(out_names[k] << " differs by " << d[k]);
    CHECK(d[k] <= tol);
  }
}

/// Every output of `got` bit for bit `want`'s.
template <class T>
void check_same_bits(const block_out<T>& got, const block_out<T>& want, const std::string& what) {
  INFO(what);
  CHECK(bytes_of(got) == bytes_of(want));
}

/// The block traced on this rank's weights.
template <class T, class F>
auto trace_block(F program, const ex::block_config& c, const ex::block_params<T>& p) {
  return std::apply(
      [&](const auto&... w) {
        return cg::trace(program, cg::input<i64>({c.batch, c.seq}), cg::input<i64>({c.batch, c.seq}),
                         cg::input<T>(w.shape())...);
      },
      p.tuple());
}

/// cg::compile_function of the block: (i64 tokens, i64 targets, 14 weights of T).
template <class T, class F, std::size_t... I>
auto compile_block(F program, cg::rank_context& ctx, cg::function_options opt, std::index_sequence<I...>) {
  return cg::compile_function<i64, i64, std::conditional_t<(I < 14), T, void>...>(program, ctx, std::move(opt));
}

/// The single-rank model in T: a world of one, whole weights.
template <class T>
block_out<T> reference(const ex::block_config& c, const ex::block_params<float>& full, const cg::tensor<i64>& tok,
                       const cg::tensor<i64>& tgt) {
  block_out<T> out;
  cg::run_threads(1, [&](cg::rank_context& ctx) {
    out = ex::call_block(ex::transformer_block(c, ctx.world(), 0, 1), tok, tgt, full.to<T>());
  });
  return out;
}

/// Every pass alone, and all of them in cg::schedule's order.
std::vector<std::vector<std::string>> pass_lists() {
  std::vector<std::vector<std::string>> lists;
  std::vector<std::string> all;
  for (auto p : cg::schedule_pass_names()) {
    lists.push_back({std::string(p)});
    all.emplace_back(p);
  }
  lists.push_back(all);
  return lists;
}

/// The block on `tp` ranks: eager, traced and compiled (planned or not), scheduled by each pass
/// and compiled, and compile_function'ed with every pass; each against the eager sharded run
/// bit for bit, and that against the single-rank references.
void check_block(int tp, const ex::block_config& c) {
  const auto full = ex::block_params<float>::random(c, 1);
  const auto tok = ex::block_tokens(c, 7), tgt = ex::block_tokens(c, 5);
  const auto ref = reference<float>(c, full, tok, tgt);
  const auto ref64 = reference<double>(c, full, tok, tgt);
  // The float model is the double one within float rounding; the loss is of order log(vocab).
  check_close(ref, ref64, 2e-5, "single rank, float against double");
  CHECK(std::get<0>(ref64).to_vector()[0] > 1.0);

  std::mutex m;
  std::string printed;
  cg::run_threads(tp, [&](cg::rank_context& ctx) {
    const auto p = full.shard(ctx.rank(), tp);
    const auto program = ex::transformer_block(c, ctx.world(), ctx.rank(), tp);
    const auto eager = ex::call_block(program, tok, tgt, p);
    {
      std::lock_guard lk(m);
      check_close(eager, ref, 2e-5, "eager, tp " + std::to_string(tp) + ", against one rank");
      check_close(eager, ref64, 3e-5, "eager, tp " + std::to_string(tp) + ", against one rank in double");
    }

    const auto g = trace_block(program, c, p);
    if (ctx.rank() == 0) {
      std::ostringstream os;
      os << g;
      printed = os.str();
    }
    for (bool plan : {true, false}) {
      auto exe = cg::compile(g, ctx, {.memory_plan = plan});
      for (int call = 0; call < 2; ++call) {
        const auto got = ex::call_block(exe, tok, tgt, p);
        std::lock_guard lk(m);
        check_same_bits(got, eager, "traced and compiled, memory_plan " + std::to_string(plan));
      }
    }
    for (const auto& passes : pass_lists()) {
      std::string what = "scheduled by";
      for (const auto& s : passes) what += " " + s;
      auto s = cg::schedule(g, passes);
      const auto got = ex::call_block(cg::compile(s, ctx), tok, tgt, p);
      std::lock_guard lk(m);
      check_same_bits(got, eager, what);
    }
    auto all = pass_lists().back();
    auto fn = compile_block<float>(program, ctx, {.passes = all}, std::make_index_sequence<14>{});
    for (int call = 0; call < 2; ++call) {
      const auto got = ex::call_block(fn, tok, tgt, p);
      std::lock_guard lk(m);
      check_same_bits(got, eager, "compile_function with every pass");
    }
  });
  // The graph holds the ops of the block, the attention causal, and the three collectives.
  for (const char* op : {"= embedding(", "= layer_norm(", "= rms_norm(", "= linear(", "is_causal=true",
                         "= all_reduce(", "= reduce_scatter_tensor(", "= all_gather_into_tensor(", "= cross_entropy(",
                         "fused_silu_mul"}) {
    INFO(op);
    CHECK(contains(printed, op));
  }
}

TEST_CASE("transformer_block.tp2.eager_traced_scheduled_equal_single_rank") { check_block(2, {}); }

TEST_CASE("transformer_block.tp4.eager_traced_scheduled_equal_single_rank") {
  // One head, 8 MLP columns, 6 vocabulary columns and 4 token rows per rank.
  check_block(4, {});
}

TEST_CASE("transformer_block.tp2.longer_sequence_wider_model") {
  check_block(2, {.batch = 3, .seq = 16, .dim = 32, .heads = 8, .ffn = 64, .vocab = 40});
}

TEST_CASE("transformer_block.dp2_tp2_mesh") {
  // 4 ranks as a 2x2 mesh: tensor-parallel pairs along "tp", each pair on its own tokens;
  // each pair equals the single-rank model on its batch.
  const ex::block_config c;
  const auto full = ex::block_params<float>::random(c, 2);
  std::vector<cg::tensor<i64>> tok = {ex::block_tokens(c, 7), ex::block_tokens(c, 11)};
  std::vector<cg::tensor<i64>> tgt = {ex::block_tokens(c, 5), ex::block_tokens(c, 13)};
  std::vector<block_out<float>> ref = {reference<float>(c, full, tok[0], tgt[0]),
                                       reference<float>(c, full, tok[1], tgt[1])};
  std::mutex m;
  cg::run_threads(4, [&](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, std::vector<std::string>{"dp", "tp"});
    const int dp = ctx.rank() / 2, tp_rank = ctx.rank() % 2;
    const auto p = full.shard(tp_rank, 2);
    const auto program = ex::transformer_block(c, cg::group{mesh, "tp"}, tp_rank, 2);
    const auto d = static_cast<std::size_t>(dp);
    const auto eager = ex::call_block(program, tok[d], tgt[d], p);
    auto s = cg::schedule(trace_block(program, c, p), pass_lists().back());
    const auto got = ex::call_block(cg::compile(s, ctx), tok[d], tgt[d], p);
    std::lock_guard lk(m);
    check_close(eager, ref[d], 2e-5, "eager, dp " + std::to_string(dp));
    check_same_bits(got, eager, "scheduled by every pass, dp " + std::to_string(dp));
  });
  // The two batches give two different losses.
  CHECK(std::get<0>(ref[0]).to_vector()[0] != std::get<0>(ref[1]).to_vector()[0]);
}

}  // namespace transformer_block_test
