// tests/autograd/test_checkpoint.cpp: cg::checkpoint (ccgraph/autograd/checkpoint.hpp). The
// gradients with a checkpointed block equal those without, bit for bit; the backward recomputes
// the block's values (more nodes) and the memory plan keeps fewer bytes alive; a collective
// inside the block is recomputed the same way on every rank; a dropout inside is refused; eager
// calls are the function itself.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/memory_plan.hpp>

#include "autograd/values.hpp"
#include "support.hpp"

namespace cg = ccgraph;
using ccgraph_test::contains;
using ccgraph_test::error_of;

namespace checkpoint_test {

using T = cg::tensor<double>;

/// Deterministic values in [lo, hi) (tests/autograd/values.hpp).
inline T values(const cg::shape_t& shape, double lo, double hi, int seed) {
  return ccgraph_test::spread_values(shape, lo, hi, seed);
}

/// One MLP block: x + w2 gelu(w1 x) (the activations a checkpoint drops).
struct block {
  template <class V>
  auto operator()(const V& x, const V& w1, const V& w2) const {
    const V h = cg::gelu(cg::matmul(x, w1));
    return cg::eval(x + cg::tanh(cg::matmul(h, w2)));
  }
};

/// The loss of `depth` blocks, each checkpointed or not.
template <bool Checkpointed>
struct deep_loss {
  int depth;
  template <class V>
  auto operator()(const V& x, const V& w1, const V& w2) const {
    V y = x;
    for (int i = 0; i < depth; ++i) {
      if constexpr (Checkpointed)
        y = cg::checkpoint(block{})(y, w1, w2);
      else
        y = block{}(y, w1, w2);
    }
    return cg::mean(y * y);
  }
};

template <class G>
std::int64_t planned_peak(const G& g) {
  return cg::plan_memory(g).live_peak_bytes;
}

}  // namespace checkpoint_test

TEST_CASE("checkpoint.gradients_equal_and_less_memory_is_kept") {
  using namespace checkpoint_test;
  const int depth = 4;
  const auto x = values({64, 32}, -1, 1, 1), w1 = values({32, 64}, -0.3, 0.3, 2), w2 = values({64, 32}, -0.3, 0.3, 3);
  // The plain step as recorded (no recompute_pointwise): every block's activations are kept.
  auto plain = cg::value_and_grad(deep_loss<false>{depth}, {1, 2}, {.recompute_pointwise = false});
  auto ckpt = cg::value_and_grad(deep_loss<true>{depth}, {1, 2});
  const auto gp = cg::trace(plain, cg::input<double>({64, 32}), cg::input<double>({32, 64}), cg::input<double>({64, 32}));
  const auto gc = cg::trace(ckpt, cg::input<double>({64, 32}), cg::input<double>({32, 64}), cg::input<double>({64, 32}));
  gc.lint();
  // 2 matmuls per block forward, 4 backward but for the first block's x (not differentiated);
  // the backward recomputes each block's first matmul (gelu's input) and its second (tanh's).
  CHECK(gp.count("matmul") == depth * 6 - 1);
  CHECK(gc.count("matmul") == gp.count("matmul") + depth * 2);
  // Only the blocks' inputs stay alive from the forward to the backward.
  const std::int64_t peak_plain = planned_peak(gp), peak_ckpt = planned_peak(gc);
  INFO("planned live peak: plain ", peak_plain, " B, checkpointed ", peak_ckpt, " B");
  CHECK(double(peak_ckpt) <= 0.6 * double(peak_plain));  // about half here
  // By default (recompute_pointwise) each block's gelu is computed again for w2's gradient
  // from the matmul its own gradient keeps: one activation per block less, still above the
  // checkpointed step.
  const auto gd = cg::trace(cg::value_and_grad(deep_loss<false>{depth}, {1, 2}), cg::input<double>({64, 32}),
                            cg::input<double>({32, 64}), cg::input<double>({64, 32}));
  CHECK(planned_peak(gd) < peak_plain);
  CHECK(peak_ckpt < planned_peak(gd));
  // The same numbers, bit for bit: compiled, scheduled, and eagerly.
  ccgraph_test::run(1, [&](cg::rank_context& ctx) {
    const auto want = cg::compile(gp, ctx)(x, w1, w2);
    const auto got = cg::compile(gc, ctx)(x, w1, w2);
    const auto sched = cg::compile(cg::schedule(gc, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"}), ctx)(x, w1, w2);
    for (const auto* r : {&got, &sched}) {
      CHECK(std::get<0>(*r).to_vector() == std::get<0>(want).to_vector());
      CHECK(std::get<1>(*r).to_vector() == std::get<1>(want).to_vector());
      CHECK(std::get<2>(*r).to_vector() == std::get<2>(want).to_vector());
    }
    const auto [l, g1, g2] = ckpt(x, w1, w2);
    CHECK(g1.to_vector() == std::get<1>(want).to_vector());
    CHECK(g2.to_vector() == std::get<2>(want).to_vector());
  });
  // Eagerly, checkpoint(f) is f.
  CHECK(cg::checkpoint(block{})(x, w1, w2).to_vector() == T(block{}(x, w1, w2)).to_vector());
}

TEST_CASE("checkpoint.collectives_are_recomputed_alike_on_every_rank") {
  using namespace checkpoint_test;
  // A row-parallel linear inside the checkpoint: matmul, all_reduce, gelu. The backward needs
  // gelu's input, the all_reduce's result: it is recomputed (one more all_reduce) on every rank,
  // and the gradients equal those without the checkpoint.
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    auto body = [&](const auto& x, const auto& w) { return cg::gelu(cg::all_reduce(cg::matmul(x, w), "sum", ctx.world())); };
    auto loss = [&](bool ck) {
      return [&, ck](const auto& x, const auto& w) {
        using V = std::decay_t<decltype(x)>;
        const V y = ck ? V(cg::checkpoint(body)(x, w)) : V(body(x, w));
        return cg::sum(y * y);
      };
    };
    const auto x = values({8, 6}, -1, 1, 10 + ctx.rank()), w = values({6, 5}, -1, 1, 20 + ctx.rank());
    const auto gp = cg::trace(cg::value_and_grad(loss(false), 1), cg::input<double>({8, 6}), cg::input<double>({6, 5}));
    const auto gc = cg::trace(cg::value_and_grad(loss(true), 1), cg::input<double>({8, 6}), cg::input<double>({6, 5}));
    gc.lint();
    CHECK(gc.count("all_reduce") == gp.count("all_reduce") + 1);
    const auto [lp, dp] = cg::compile(gp, ctx)(x, w);
    const auto [lc, dc] = cg::compile(gc, ctx)(x, w);
    CHECK(lc.to_vector() == lp.to_vector());
    CHECK(dc.to_vector() == dp.to_vector());
    // Every rank records the same collectives in the same order (the agreement the executor checks).
    std::vector<std::string> seq;
    for (const cg::node* n : gc.nodes())
      if (n->is_collective()) seq.emplace_back(n->op());
    CHECK(seq == std::vector<std::string>{"all_reduce", "all_reduce", "all_reduce"});
  });
}

TEST_CASE("checkpoint.dropout_inside_is_refused") {
  using namespace checkpoint_test;
  auto loss = [](const auto& x) {
    const auto y = cg::checkpoint([](const auto& a) { return cg::dropout(cg::gelu(a), 0.5) * a; })(x);
    return cg::sum(y * y);
  };
  const std::string e = error_of([&] {
    (void)cg::trace(cg::grad(loss), cg::input<double>({4}));
  });
  CHECK(contains(e, "checkpoint: node %"));
  CHECK(contains(e, "draws random numbers inside a checkpointed function"));
}
