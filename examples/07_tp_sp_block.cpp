// Example 07: a GPT-style block (pre-norm, causal attention + GELU MLP) with tensor parallelism
// and sequence parallelism, laid out by PyTorch's plan through cg::parallelize_module
// (examples/gpt_block.hpp), forward and backward, on 2 and 4 ranks of the threads backend:
//
//   each rank holds its sequence shard of x; the norms run on the shards; one all_gather before
//   attention and one before the MLP; q, k, v and w1 are column shards (a rank's heads), wo and
//   w2 row shards whose partial sums are reduce-scattered back to the sequence shards.
//
// It shows and checks:
//  1. eagerly, cg::value_and_grad of the sharded block equals the single-device block (the same
//     code on a mesh of one): the loss (the sum of every rank's term) and each rank's pieces of
//     the gradients (the replicated norms' summed over the ranks), within float rounding;
//  2. the collectives each phase issues (cg::comm_counter): forward 2 all_gathers and 2
//     reduce_scatters, backward their transposes and one all_reduce per norm parameter;
//  3. the same step traced into one joint graph, scheduled by the overlap passes (printed: where
//     each collective and its wait landed), compiled, gives the eager values;
//  4. the block under FSDP on "dp" (cg::fully_shard), alone and 2-D with TP + SP on "tp", equals
//     one device too (each rank its part of the batch).
// The same block runs on GPUs in bf16 in 07_tp_sp_block_gpu.cu and is timed against PyTorch in
// bench/bench_gpu_block.cu. Exits non-zero on a mismatch.
#include <ccgraph/ccgraph.hpp>
#include <ccgraph/dtensor.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpt_block.hpp"

namespace cg = ccgraph;
namespace ex = ccgraph::examples;

namespace {

using F = cg::tensor<float>;
constexpr int wrt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

/// f(x, p[0], ..., p[9]) as a vector: the loss, then the 10 gradients.
template <class Fn, class X, class P>
auto call_block(Fn&& f, const X& x, const std::vector<P>& p) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto r = f(x, p[I]...);
    return std::apply([](const auto&... t) { return std::vector<F>{F(t)...}; }, r);
  }(std::make_index_sequence<10>{});
}

/// The largest |a - b| / (1 + |b|) over two tensors of one shape (infinity when they differ).
double rel_diff(const F& a, const F& b) {
  if (a.shape() != b.shape()) return INFINITY;
  const auto x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(double(x[i]) - double(y[i])) / (1 + std::abs(double(y[i])));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

/// Rank 0's report of an eager step: the loss beside one device's, the worst relative
/// difference, and the collectives of each phase.
template <class Counts>
void print_eager(const F& loss, const F& one_device, double worst, const Counts& counts) {
  std::cout << "  eager loss " << loss.to_vector()[0] << " (one device " << one_device.to_vector()[0]
            << "), worst relative difference over the loss and every gradient piece " << worst << "\n";
  for (const auto& [phase, kinds] : counts) {
    std::cout << "  " << phase << ":";
    for (const auto& [kind, n] : kinds) std::cout << " " << n << " " << kind;
    std::cout << "\n";
  }
}

}  // namespace

int main() {
  const ex::gpt_config c{.batch = 2, .seq = 8, .dim = 32, .heads = 4, .ffn = 64};
  const auto whole = ex::gpt_random_params<float>(c, cg::generator(7));
  const F x = cg::randn<float>({c.batch, c.seq, c.dim}, cg::generator(11));
  std::cout << std::setprecision(6) << "GPT block: B " << c.batch << ", L " << c.seq << ", D " << c.dim << ", "
            << c.heads << " heads, MLP " << c.ffn << "\n";

  // The single-device block: the same program on a mesh of one rank.
  std::vector<F> ref;
  cg::run_threads(1, [&](cg::rank_context&) {
    const cg::device_mesh one({1}, {"tp"});
    ref = call_block(cg::value_and_grad(ex::gpt_block_loss(c, one), wrt), x, whole);
  });
  const std::vector<F> ref_grads(ref.begin() + 1, ref.end());
  std::cout << "single device: loss " << ref[0].to_vector()[0] << "\n";

  bool ok = true;
  std::mutex mu;
  auto fail = [&](const std::string& what) {
    const std::lock_guard lock(mu);
    std::cout << "  MISMATCH: " << what << "\n";
    ok = false;
  };
  for (const int tp : {2, 4}) {
    std::cout << "\ntp = sp = " << tp << " ranks:\n";
    cg::run_threads(tp, [&](cg::rank_context& ctx) {
      const int r = ctx.rank();
      const cg::device_mesh mesh({tp}, {"tp"});
      const auto params = ex::gpt_shards(whole, mesh);
      const auto want = ex::gpt_shards(ref_grads, mesh);  // each rank's pieces of the gradients
      const F xl = ex::gpt_sequence_shard(x, r, tp);
      const auto step = cg::value_and_grad(ex::gpt_block_loss(c, mesh), wrt);

      // 1. Eagerly, against the single device.
      cg::comm_counter counter;
      const auto got = call_block(step, xl, params);
      const auto counts = counter.counts_by_phase();
      const F loss = cg::all_reduce(got[0], "sum", ctx.world());
      double worst = rel_diff(loss, ref[0]);
      for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, rel_diff(got[i + 1], want[i]));
      if (worst > 1e-4) fail("rank " + std::to_string(r) + ": eager differs from one device by " + std::to_string(worst));

      // 2. The collectives of each phase.
      const bool counts_ok =
          counter.count("all_gather", "forward") == 2 && counter.count("reduce_scatter", "forward") == 2 &&
          counter.count("all_reduce", "forward") == 0 && counter.count("all_gather", "backward") == 2 &&
          counter.count("reduce_scatter", "backward") == 2 && counter.count("all_reduce", "backward") == 4;
      if (!counts_ok) fail("rank " + std::to_string(r) + ": unexpected collective counts");

      // 3. Traced into one joint graph, scheduled for overlap, compiled.
      auto g = [&]<std::size_t... I>(std::index_sequence<I...>) {
        return cg::trace(step, cg::input<float>(xl.shape()), cg::input<float>(params[I].shape())...);
      }(std::make_index_sequence<10>{});
      const auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
      auto compiled = cg::compile(s, ctx);
      const auto traced = call_block(compiled, xl, params);
      double traced_worst = 0;
      for (std::size_t i = 0; i < traced.size(); ++i) traced_worst = std::max(traced_worst, rel_diff(traced[i], got[i]));
      if (traced_worst > 1e-5) fail("rank " + std::to_string(r) + ": compiled differs from eager by " + std::to_string(traced_worst));

      if (r == 0) {
        const std::lock_guard lock(mu);
        print_eager(loss, ref[0], worst, counts);
        const auto ops = cg::op_sequence(s);
        std::cout << "  joint graph: " << ops.size() << " nodes; after the overlap passes, collectives at:";
        for (std::size_t i = 0; i < ops.size(); ++i)
          if (ops[i].find("all_gather") != std::string::npos || ops[i].find("reduce_scatter") != std::string::npos)
            std::cout << " " << (ops[i].find("gather") != std::string::npos ? "AG" : "RS") << "@" << i;
        std::cout << "\n  compiled joint graph vs eager: worst relative difference " << traced_worst << "\n";
      }
    });
  }
  // 4. FSDP (cg::fully_shard) on "dp": each rank its half of the batch, each parameter's dim-0
  // piece, all_gathered where the block reads it and its gradient reduce_scattered back; alone
  // (a "tp" of one rank) and as 2-D FSDP x TP + SP on a 2 x 2 mesh.
  for (const int tp : {1, 2}) {
    const int dp = 2;
    std::cout << "\nFSDP on dp = " << dp << " x tp = sp = " << tp << (tp == 1 ? ", reshard after forward" : "") << ":\n";
    cg::run_threads(dp * tp, [&](cg::rank_context& ctx) {
      const int r = ctx.rank();
      const cg::device_mesh mesh({dp, tp}, {"dp", "tp"});
      const auto coord = mesh.coordinate(r);
      const auto params = ex::gpt_fsdp_shards(whole, mesh);
      const auto want = ex::gpt_fsdp_shards(ref_grads, mesh);
      const std::int64_t b = c.batch / dp;
      const F xl = ex::gpt_sequence_shard(F(x.narrow(0, coord[0] * b, b).contiguous()), static_cast<int>(coord[1]), tp);
      cg::comm_counter counter;
      const bool reshard = tp == 1;  // (both ways: the backward re-gathers, or keeps the forward's)
      const auto got = call_block(cg::value_and_grad(ex::gpt_fsdp_block_loss(c, mesh, reshard), wrt), xl, params);
      const auto counts = counter.counts_by_phase();  // (before the loss's own all_reduce)
      const F loss = cg::all_reduce(got[0], "sum", ctx.world());
      double worst = rel_diff(loss, ref[0]);
      for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, rel_diff(got[i + 1], want[i]));
      if (worst > 1e-4) fail("rank " + std::to_string(r) + ": FSDP differs from one device by " + std::to_string(worst));
      if (r == 0) {
        const std::lock_guard lock(mu);
        print_eager(loss, ref[0], worst, counts);
      }
    });
  }

  std::cout << (ok ? "\nOK: the TP + SP block and its FSDP versions equal one device, forward and backward\n"
                   : "\nFAILED\n");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
