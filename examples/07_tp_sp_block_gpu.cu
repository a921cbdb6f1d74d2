// Example 07 on GPUs: the TP + SP GPT block of 07_tp_sp_block.cpp (examples/gpt_block.hpp) in
// bf16 on up to 2 GPUs over NCCL, forward and backward: each GPU its sequence shard and its
// pieces of the parameters; the joint graph (cg::value_and_grad through the dtensor styles)
// scheduled by the overlap passes and replayed as one CUDA Graph per step (cg::compile_function),
// and the same eagerly. The loss and every gradient piece are checked against the single-device
// block in f32 on the CPU (same values, rounded to bf16 first): the normwise relative error of
// each must be under 3e-2 (bf16 keeps 8 bits; the GPU sums in other orders). Head dim 64, so
// attention runs the fused tensor-core kernels. bench/bench_gpu_block.cu times it at GPT sizes
// against PyTorch. Without a GPU it says so and exits 0.
#include <ccgraph/cuda.hpp>

#include "gpt_block.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace cg = ccgraph;
namespace ex = ccgraph::examples;

namespace {

using bf = cg::bf16;
using F = cg::tensor<float>;
constexpr int wrt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

/// f(x, p[0], ..., p[9]) as f32 tensors on the host: the loss, then the 10 gradients.
template <class Fn, class X, class P>
std::vector<F> call_block(Fn&& f, const X& x, const std::vector<P>& p) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto r = f(x, p[I]...);
    return std::apply([](const auto&... t) { return std::vector<F>{t.cpu().template to<float>()...}; }, r);
  }(std::make_index_sequence<10>{});
}

/// ||a - b|| / ||b|| (infinity when the shapes differ or a value is not finite).
double normwise(const F& a, const F& b) {
  if (a.shape() != b.shape()) return INFINITY;
  const auto x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - double(y[i])) * (double(x[i]) - double(y[i]));
    den += double(y[i]) * double(y[i]);
  }
  const double r = std::sqrt(num / std::max(den, 1e-30));
  return std::isfinite(r) ? r : INFINITY;
}

}  // namespace

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::cout << "no GPU: nothing to run on (07_tp_sp_block.cpp runs the block on CPU threads)\n";
    return EXIT_SUCCESS;
  }
  const int tp = std::min(gpus, 2);
  const ex::gpt_config c{.batch = 2, .seq = 128, .dim = 256, .heads = 4, .ffn = 1024};
  // bf16 parameters and input; the reference reads the same values in f32.
  const auto whole = ex::gpt_random_params<bf>(c, cg::generator(7));
  const auto x = cg::randn<bf>({c.batch, c.seq, c.dim}, cg::generator(11));
  std::vector<F> whole_f;
  for (const auto& p : whole) whole_f.push_back(p.to<float>());
  std::vector<F> ref;
  cg::run_threads(1, [&](cg::rank_context&) {
    const cg::device_mesh one({1}, {"tp"});
    ref = call_block(cg::value_and_grad(ex::gpt_block_loss(c, one), wrt), x.to<float>(), whole_f);
  });
  const std::vector<F> ref_grads(ref.begin() + 1, ref.end());
  std::cout << std::setprecision(5) << "GPT block, bf16: B " << c.batch << ", L " << c.seq << ", D " << c.dim << ", "
            << c.heads << " heads, MLP " << c.ffn << "; TP + SP over " << tp << " GPU(s)\n"
            << "single device, f32 on the CPU: loss " << ref[0].to_vector()[0] << "\n";

  std::mutex mu;
  bool ok = true;
  cg::cuda::run_gpus(tp, [&](cg::rank_context& ctx) {
    const int r = ctx.rank();
    const cg::device_mesh mesh({tp}, {"tp"});
    std::vector<cg::tensor<bf>> params;
    for (const auto& p : ex::gpt_shards(whole, mesh)) params.push_back(p.cuda(r));
    const auto want = ex::gpt_shards(ref_grads, mesh);
    const auto xl = ex::gpt_sequence_shard(x, r, tp).cuda(r);
    const auto step = cg::value_and_grad(ex::gpt_block_loss(c, mesh), wrt);
    auto replay = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return cg::compile_function<bf, std::conditional_t<(I < 10), bf, void>...>(
          step, ctx,
          {.passes = {"sink_waits", "raise_comms", "reorder_compute_for_overlap"}, .compile = {.cuda_graph = true}});
    }(std::make_index_sequence<10>{});
    for (const bool graph : {false, true}) {
      for (int call = 0; call < (graph ? 2 : 1); ++call) {
        const auto got = graph ? call_block(replay, xl, params) : call_block(step, xl, params);
        const F loss = cg::all_reduce(got[0].cuda(r), "sum", ctx.world()).cpu();
        double worst = normwise(loss, ref[0]);
        std::string where = "loss";
        for (std::size_t i = 0; i < want.size(); ++i) {
          const double e = normwise(got[i + 1], want[i]);
          if (e > worst) worst = e, where = std::string("grad ") + ex::gpt_names[i];
        }
        const std::lock_guard lock(mu);
        const std::string what = graph ? "CUDA Graph replay " + std::to_string(call) : std::string("eager");
        if (r == 0 || worst >= 3e-2)
          std::cout << "  GPU " << r << ", " << what << ": loss " << loss.to_vector()[0]
                    << ", worst normwise error " << worst << " (" << where << ")\n";
        if (!(worst < 3e-2)) ok = false;
      }
    }
  });
  std::cout << (ok ? "OK: the bf16 TP + SP block on GPUs follows the f32 single device, forward and backward\n"
                   : "FAILED\n");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
