// Example 06: data-parallel training of a small MLP on 4 ranks of the threads backend. Each
// rank holds the same parameters and its own shard of the batch; one training step
//
//   loss = mse(linear(tanh(linear(x, w1, b1)), w2, b2), y)          forward
//   grads = value_and_grad(loss)                                      backward
//   grads = all_reduce(grads, avg)                                    DDP's gradient average
//   params, state = AdamW(params, grads, state)                       one fused update per tensor
//
// (examples/data_parallel_mlp.hpp) is traced into ONE graph (forward, backward, collectives,
// optimizer), scheduled with the overlap passes and compiled (cg::compile_function); each call
// updates the parameters and the optimizer state in place (compile_options::update_inputs), so
// the loop passes the same tensors every step. The program prints the loss going down
// and checks, step by step, that every rank's parameters equal one rank trained eagerly on the
// concatenated batch (double precision); it exits non-zero on a mismatch.
#include <ccgraph/ccgraph.hpp>

#include "data_parallel_mlp.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <utility>
#include <vector>

namespace cg = ccgraph;

namespace {

using T = cg::tensor<double>;
constexpr std::int64_t ranks = 4, per_rank = 16, in_dim = 8, hidden = 32, out_dim = 4, steps = 10;
using example_dp::mlp_loss;
using example_dp::n_inputs;

/// Deterministic values in [lo, hi).
T values(cg::shape_t shape, double lo, double hi, int seed) {
  std::vector<double> v(static_cast<std::size_t>(cg::numel_of(shape)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = lo + (hi - lo) * std::fmod(0.6180339887 * double(i * 7 + static_cast<std::size_t>(seed) * 13 + 3), 1.0);
  return T::from(v, shape);
}

}  // namespace

int main() {
  const cg::optim::adamw_options opt{.lr = 0.01, .weight_decay = 0.01};
  // The whole batch (rank r's shard: rows [r * per_rank, (r + 1) * per_rank)); the targets are
  // a smooth function of the inputs, so there is something to learn.
  const T x = values({ranks * per_rank, in_dim}, -1, 1, 1);
  const T a = values({in_dim, out_dim}, -1, 1, 2);
  const T y = cg::sin(cg::matmul(x, a));
  const std::vector<T> init = {values({hidden, in_dim}, -0.3, 0.3, 3), values({hidden}, -0.1, 0.1, 4),
                               values({out_dim, hidden}, -0.3, 0.3, 5), values({out_dim}, -0.1, 0.1, 6)};

  // One rank, the concatenated batch, eagerly: value_and_grad, then AdamW in place.
  const auto ref = example_dp::train_one_rank(x, y, init, opt, static_cast<int>(steps));
  const std::vector<double>& ref_loss = ref.loss;

  // 4 ranks, each its shard, the whole step as one compiled graph.
  std::mutex mu;
  double worst = 0;  // largest relative difference from the single rank, any rank, any step
  std::atomic<bool> in_place{true};  // every call returned the parameter tensors it updated
  std::vector<double> dp_loss(steps);
  std::vector<std::size_t> summary;  // nodes, all_reduces, fused pointwise nodes, linear + matmul
  cg::run_threads(static_cast<int>(ranks), [&](cg::rank_context& ctx) {
    const std::int64_t r = ctx.rank();
    const T xs = x.narrow(0, r * per_rank, per_rank).contiguous();
    const T ys = y.narrow(0, r * per_rank, per_rank).contiguous();
    auto step = example_dp::train_step(opt, ctx.world());
    auto compiled = example_dp::compile_step<double>(opt, ctx, {});
    std::vector<T> params;
    for (const T& t : init) params.push_back(T::from(t.to_vector(), t.shape()));  // updated in place
    std::vector<T> state = cg::optim::init(params, opt).tensors();
    std::vector<T> args{xs, ys};
    args.insert(args.end(), params.begin(), params.end());
    args.insert(args.end(), state.begin(), state.end());
    for (std::int64_t s = 0; s < steps; ++s) {
      const std::vector<T> out = example_dp::call(compiled, args);  // writes params and state
      if (out[1].data() != params[0].data()) in_place = false;  // must be the parameter tensor itself
      double diff = 0;
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto v = params[i].to_vector();
        const auto w = ref.params[static_cast<std::size_t>(s)][i].to_vector();
        for (std::size_t j = 0; j < v.size(); ++j) diff = std::max(diff, std::abs(v[j] - w[j]) / (1 + std::abs(w[j])));
      }
      std::lock_guard lk(mu);
      worst = std::max(worst, diff);
      if (r == 0) dp_loss[static_cast<std::size_t>(s)] = out[0].to_vector()[0];
    }
    if (r == 0) {
      // What one step's graph holds (the same program every step).
      const auto g = [&]<std::size_t... I>(std::index_sequence<I...>) {
        return cg::trace(step, cg::input<double>(args[I].shape())...);
      }(std::make_index_sequence<n_inputs>{});
      summary = {g.size(), g.count("all_reduce"), g.count("pointwise"), g.count("linear") + g.count("matmul")};
    }
  });

  std::cout << "data-parallel MLP, " << ranks << " ranks x " << per_rank << " rows, AdamW lr " << opt.lr << "\n";
  std::cout << "one training step = one graph of " << summary[0] << " nodes: " << summary[3]
            << " linear/matmul, " << summary[1] << " all_reduce (4 gradients + the loss), " << summary[2]
            << " fused pointwise (forward, backward and AdamW's 1 for the step count + 3 per parameter)\n";
  std::cout << "step   loss (" << ranks << " ranks)   loss (1 rank)\n";
  for (std::int64_t s = 0; s < steps; ++s)
    std::cout << std::setw(4) << s << "   " << std::setprecision(10) << std::fixed << dp_loss[static_cast<std::size_t>(s)]
              << "     " << ref_loss[static_cast<std::size_t>(s)] << "\n";
  std::cout << std::scientific << std::setprecision(2) << "largest relative parameter difference from one rank: " << worst
            << "\n";

  bool ok = true;
  for (std::int64_t s = 1; s < steps; ++s)
    if (!(ref_loss[static_cast<std::size_t>(s)] < ref_loss[static_cast<std::size_t>(s - 1)])) {
      std::cout << "FAIL: the loss did not go down at step " << s << "\n";
      ok = false;
    }
  for (std::int64_t s = 0; s < steps; ++s)
    if (std::abs(dp_loss[static_cast<std::size_t>(s)] - ref_loss[static_cast<std::size_t>(s)]) >
        1e-12 * (1 + ref_loss[static_cast<std::size_t>(s)])) {
      std::cout << "FAIL: step " << s << ": the ranks' loss differs from one rank's\n";
      ok = false;
    }
  if (!(worst <= 1e-12)) {
    std::cout << "FAIL: the parameters differ from one rank's\n";
    ok = false;
  }
  std::cout << "parameters and AdamW state updated in place by each call (update_inputs): " << (in_place ? "yes" : "NO")
            << "\n";
  if (!in_place) {
    std::cout << "FAIL: a call returned new parameter tensors instead of updating the inputs\n";
    ok = false;
  }
  std::cout << (ok ? "OK: 4 ranks train exactly as one rank on the whole batch\n" : "FAILED\n");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
