// bench_gpu_train: issue 15 item 6, a data-parallel training step on the GPUs of one host (2 at
// most), the workload of PERF.md's training table and of ../shared/bench/torch_train_anchor.py:
//
//   x[T, H] -> linear(w1[F, H]) -> gelu -> linear(w2[H, F]) -> mean(y^2)     bf16, no bias
//   backward; the two weight gradients all_reduced (avg) over NCCL; AdamW (lr 1e-4)
//
// traced into one graph (cg::value_and_grad, cg::all_reduce, cg::optim::step), scheduled with the
// overlap passes and replayed as one CUDA Graph per step. Two ways:
//   in_place    compile_options::update_inputs: the replay writes the new weights and AdamW state
//               into the tensors passed in (the same every step), as torch's fused AdamW does;
//   functional  each step's new weights and state are the next step's inputs: every replay first
//               copies them into the recording's static buffers.
// Timing as the anchor's: CUDA events around one step on rank 0's stream, 4 warm-up steps, the
// median of 10. Inputs are random (randn / nn.Linear's uniform init). Prints a table and one
// `RESULT <workload> <impl> <ms> ms` line per row; bench/torch_train_reference.py is the same step in PyTorch.
//
// Usage: bench_gpu_train [--quick] [--timeline] [--decompose] [--aligned] [--world N] [--passes P,Q,...]
//   --world N    N GPUs (default: 2, or 1 where there is one)
//   --passes     the scheduling passes of every row (default sink_waits,raise_comms,
//                reorder_compute_for_overlap; an unknown name is cg::schedule's error)
//   --quick      T = 2048, for a smoke run
//   --decompose  two more rows: in place, with decompose_matmul_collectives (4 row chunks)
//                before the overlap passes, so that the last weight gradient's all_reduce (the
//                step's exposed tail) overlaps its own GEMM's remaining chunks: every gradient
//                split, and only those the cost model predicts exposed (decompose_only_exposed)
//   --aligned    each row timed once more with every rank starting each step at once (a
//                barrier of the rank threads before each step's first event): the step
//                without the ranks' skew, a diagnostic (PyTorch's side has no such row)
//   --timeline   after timing, GPU 0's kernels of the in-place step from CUPTI (cupti_timeline.hpp):
//                where the step's time goes, to read beside torch_train_reference.py --profile
#include <ccgraph/cuda.hpp>

#include "bench_args.hpp"
#include "cupti_timeline.hpp"
#include "step_timer.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace cg = ccgraph;
using i64 = std::int64_t;
using bf = cg::bf16;
using T = cg::tensor<bf>;

namespace {

/// The MLP's loss: mean of the squared output (the anchor's `(y.float() ** 2).mean()`).
struct mlp_loss {
  template <class V>
  auto operator()(const V& x, const V& w1, const V& w2) const {
    const V y = cg::matmul(cg::gelu(cg::matmul(x, w1.transpose(0, 1))), w2.transpose(0, 1));
    return cg::mean(y * y);
  }
};

/// One step as a traced function of (x, w1, w2, exp_avg x2, exp_avg_sq x2, AdamW's step (f32:
/// bf16 parameters count their steps in f32)): returns the loss, the new weights, the new
/// averages and the new step, in the inputs' order.
auto train_step(cg::optim::adamw_options o, cg::group world) {
  return [o, world](const auto& x, const auto& w1, const auto& w2, const auto& m1, const auto& m2, const auto& v1,
                    const auto& v2, const auto& t) {
    using V = std::decay_t<decltype(x)>;
    auto [loss, g1, g2] = cg::value_and_grad(mlp_loss{}, {1, 2})(x, w1, w2);
    // In the order the backward produces them (w2's first), as DDP issues its buckets: the
    // passes keep the collectives' order, so w2's all_reduce then runs beside w1's gradient.
    const std::vector<V> grads = cg::all_reduce_gradients(std::vector<V>{g1, g2}, "avg", world);
    const auto r = cg::optim::step(std::vector<V>{w1, w2}, grads,
                                   cg::optim::adamw_state<V>::from_averages(t, {m1, m2, v1, v2}), o);
    const std::vector<V> a = r.state.averages();
    return std::make_tuple(V(loss), r.params[0], r.params[1], a[0], a[1], a[2], a[3], r.state.step);
  };
}
constexpr std::size_t n_inputs = 3 + 5;

}  // namespace

int main(int argc, char** argv) {
  const bench::args args(argc, argv, "[--quick] [--timeline] [--decompose] [--aligned] [--world N] [--passes P,Q,...]",
                         {"--quick", "--timeline", "--decompose", "--aligned"}, {"--world", "--passes"});
  // The scheduling passes every row runs (decompose_matmul_collectives goes first where a row adds it).
  std::vector<std::string> overlap_passes{"sink_waits", "raise_comms", "reorder_compute_for_overlap"};
  if (const auto p = args.value("--passes")) {
    overlap_passes.clear();
    for (std::size_t at = 0; at <= p->size();) {
      const std::size_t comma = std::min(p->find(',', at), p->size());
      if (comma > at) overlap_passes.push_back(p->substr(at, comma - at));
      at = comma + 1;
    }
  }
  const bool timeline = args.has("--timeline");
  const bool decompose = args.has("--decompose");
  // Each row timed once more with every rank starting each step at once (bench::step_ms's
  // `align`): whether the ranks' skew is part of a step's time.
  const bool aligned_rows = args.has("--aligned");
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::printf("bench_gpu_train: no GPU\n");
    return 0;
  }
  // Two GPUs unless --world says otherwise (the workload's shapes are per rank or split evenly
  // over 1, 2, 4 or 8 ranks).
  const int world = static_cast<int>(args.flag_integer("--world", std::min(gpus, 2)));
  if (world > gpus) args.fail("--world " + std::to_string(world) + " needs as many GPUs; " + std::to_string(gpus) + " visible");
  const i64 t_rows = args.has("--quick") ? 2048 : 8192, h = 4096, f = 16384;
  const cg::optim::adamw_options opt{.lr = 1e-4};
  const std::string workload = "dp_mlp_T" + std::to_string(t_rows) + "_H" + std::to_string(h) + "_F" + std::to_string(f);
  const char* names[] = {"in_place", "functional", "in_place_decomposed", "in_place_decomposed_exposed"};
  const int rows = decompose ? 4 : 2;
  std::vector<double> ms(4, 0.0), host(4, 0.0), aligned(4, 0.0);
  std::barrier<> align(world);  // bench::step_ms's diagnostic: every rank starts each step at once
  std::vector<double> loss(4, 0.0);
  if (timeline) bench::cupti::start();
  cg::cuda::run_gpus(world, [&](cg::rank_context& ctx) {
    cg::generator gen(1234, static_cast<std::uint64_t>(ctx.rank()));  // each rank its own batch
    const T x = cg::randn<bf>({t_rows, h}, gen);
    const double b1 = 1 / std::sqrt(double(h)), b2 = 1 / std::sqrt(double(f));
    for (int row = 0; row < rows; ++row) {
      const bool in_place = row != 1;
      cg::generator wgen(99);  // the same weights on every rank
      std::vector<T> w{cg::uniform<bf>({f, h}, -b1, b1, wgen), cg::uniform<bf>({h, f}, -b2, b2, wgen)};
      const auto st0 = cg::optim::init(w, opt);
      std::vector<T> st = st0.averages();
      cg::tensor<float> count = st0.step;
      cg::compile_options co{.cuda_graph = true, .static_outputs = true};
      if (in_place) co.update_inputs = cg::update_inputs_range(1, 1, n_inputs - 1);
      std::vector<std::string> passes = overlap_passes;
      if (row >= 2) passes.insert(passes.begin(), "decompose_matmul_collectives");  // (cg::schedule's order)
      cg::schedule_options so;
      so.decompose_only_exposed = row == 3;
      auto step = cg::compile_function<bf, bf, bf, bf, bf, bf, bf, float>(
          train_step(opt, ctx.world()), ctx,
          {.passes = passes, .schedule = so, .compile = co, .guard = cg::function_guard::arguments});
      T last_loss;
      auto one = [&] {
        auto out = step(x, w[0], w[1], st[0], st[1], st[2], st[3], count);
        last_loss = std::get<0>(out);
        if (!in_place) {  // the next step starts from this one's results
          w = {std::get<1>(out), std::get<2>(out)};
          st = {std::get<3>(out), std::get<4>(out), std::get<5>(out), std::get<6>(out)};
          count = std::get<7>(out);
        }
      };
      double host_us = 0;
      const double t = bench::step_ms(one, 4, 10, &host_us);
      const double t_aligned = aligned_rows ? bench::step_ms(one, 2, 10, nullptr, &align) : 0.0;
      if (timeline && row != 1)
        bench::cupti::trace_steps(ctx, workload + ", CUDA Graph, " + names[row], 2, true, [&](int) { one(); });
      if (ctx.rank() == 0) {
        ms[row] = t;
        host[row] = host_us;
        aligned[row] = t_aligned;
        loss[row] = static_cast<double>(static_cast<float>(last_loss.cpu().to_vector().at(0)));
      }
    }
  });
  // GEMMs: 2 forward, 3 backward (x takes no gradient: dW2, dA, dW1), 2 T H F FLOPs each.
  const double tflop = 5.0 * 2.0 * double(t_rows) * double(h) * double(f) / 1e12;
  char dev[256] = {0};
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) std::snprintf(dev, sizeof dev, "%s", prop.name);
  std::printf("# bench_gpu_train: %d x %s, %s, bf16, fwd + bwd + all_reduce(avg) + AdamW, one CUDA Graph per step\n",
              world, dev, workload.c_str());
  std::printf("| workload | ccgraph | ms/step | GEMM TFLOP/s | loss after %d steps | host us/call | ms/step, ranks aligned |\n"
              "|---|---|---|---|---|---|---|\n", aligned_rows ? 26 : 14);
  for (int k = 0; k < rows; ++k) {
    char cell[32] = "-";
    if (aligned_rows) std::snprintf(cell, sizeof cell, "%.3f", aligned[k]);
    std::printf("| %s | %s | %.3f | %.0f | %.6g | %.0f | %s |\n", workload.c_str(), names[k], ms[k],
                tflop / (ms[k] / 1e3), loss[k], host[k], cell);
  }
  for (int k = 0; k < rows; ++k) std::printf("RESULT %s ccgraph_%s %.3f ms\n", workload.c_str(), names[k], ms[k]);
  if (timeline) bench::cupti::flush();
  return 0;
}
