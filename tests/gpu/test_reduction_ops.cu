// The reduction, normalization and loss graph ops on a GPU (ops/reduction_ops.hpp,
// normalization_ops.hpp, loss_ops.hpp; their cuda_impl in cuda/*.cuh): a traced program of every
// op after an all_reduce, run eagerly on device tensors, through the graph runner (memory plan)
// and as a CUDA Graph replay, equals the threads backend's CPU result within float tolerance.
// Skipped without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_reduction_ops {

namespace reduction_ops_gpu_tests {

namespace cg = ccgraph;
using i64 = std::int64_t;

/// Result k of `got` (device) against `want` (host): |g - w| <= atol + rtol |w| element-wise,
/// equal shapes; i64 results exactly.
template <class... Ts, class... Us>
void check_close_results(const std::tuple<Ts...>& got, const std::tuple<Us...>& want, const std::string& what) {
  static_assert(sizeof...(Ts) == sizeof...(Us));
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    const auto one = [&](std::size_t k, const auto& g, const auto& w) {
      INFO(what << ", result " << k);
      REQUIRE(g.shape() == w.shape());
      const auto gv = g.to_vector();
      const auto wv = w.to_vector();
      int bad = 0;
      for (std::size_t i = 0; i < gv.size(); ++i) {
        const double a = static_cast<double>(gv[i]), b = static_cast<double>(wv[i]);
        const bool ok = std::isnan(b) ? std::isnan(a) : std::abs(a - b) <= 2e-5 + 2e-4 * std::abs(b);
        if (!ok && bad++ < 3) INFO("element " << i << ": " << a << " vs " << b);
        if (!ok) CHECK(a == b);
      }
    };
    (one(K, std::get<K>(got), std::get<K>(want)), ...);
  }(std::index_sequence_for<Ts...>{});
}

/// Every op of the three families (forward and backward) after an all_reduce of the input.
auto program(const cg::group& world) {
  return [world](auto a, auto t, auto w) {
    auto r = cg::wait_tensor(cg::all_reduce(a, "sum", world));
    auto [mv, mi] = cg::max(r, 1, true);
    auto [nv, ni] = cg::min(r, 0);
    auto am = cg::amax(r, {1});
    auto v = cg::var(r, {0}, 1.0, true);
    auto sm = cg::softmax(r, -1);
    auto ls = cg::log_softmax(r, 0);
    auto [ln, mean, rstd] = cg::native_layer_norm(r, {96}, w, w, 1e-5);
    auto [rn, rr] = cg::rms_norm_with_rstd(r, {96}, w, std::nullopt);
    auto [dx, dw, db] = cg::layer_norm_backward(sm, r, {96}, mean, rstd, w, true);
    auto [rdx, rdw] = cg::rms_norm_backward(ls, r, {96}, rr, w);
    auto [loss, lse] = cg::cross_entropy_with_lse(r, t, w, 3, cg::loss_reduction::mean, 0.1);
    auto dlogits = cg::cross_entropy_backward(loss * 0.f + 1.f, r, t, lse, w, 3, cg::loss_reduction::mean, 0.1);
    return std::make_tuple(cg::sum(r, {0, 1}), cg::mean(r, -1), v, am, cg::amin(r), cg::max(r), mv, mi, nv, ni,
                           cg::argmax(r), cg::argmin(r, 1), cg::amax_backward(am * 0.5f, r, am, {1}),
                           cg::max_dim_backward(mv, mi, 1, true, r.shape()), cg::var_backward(v, r, {0}, 1.0, true),
                           sm, ls, ln, rn, cg::softmax_backward(ln, sm, -1), cg::log_softmax_backward(rn, ls, 0), dx,
                           *dw, *db, rdx, *rdw, loss, dlogits,
                           cg::cross_entropy(r, t, std::nullopt, -100, cg::loss_reduction::none));
  };
}

GPU_TEST_CASE("gpu.reduction_ops.traced_graph_equals_cpu") {
  const cg::group world{std::vector<int>{0}};
  const auto a = cg::uniform<float>({64, 96}, -2, 2, 71);
  const auto w = cg::uniform<float>({96}, 0.5, 1.5, 72);
  auto tv = std::vector<i64>(64);
  for (std::size_t i = 0; i < tv.size(); ++i) tv[i] = static_cast<i64>((i * 37) % 96);
  const auto t = cg::tensor<i64>::from(tv, {64});
  using result_t = decltype(program(world)(a, t, w));
  std::optional<result_t> want;
  cg::run_threads(1, [&](cg::rank_context&) { want = program(world)(a, t, w); });
  cg::cuda::run_gpus(1, [&](cg::rank_context& ctx) {
    const auto da = a.cuda(0), dw = w.cuda(0);
    const auto dt = t.cuda(0);
    check_close_results(program(world)(da, dt, dw), *want, "eager on the GPU");
    auto g = cg::trace(program(world), cg::input<float>({64, 96}), cg::input<i64>({64}), cg::input<float>({96}));
    auto runner = cg::compile(g, ctx);
    auto replayed = cg::compile(g, ctx, {.cuda_graph = true});
    for (int call = 0; call < 2; ++call) {
      check_close_results(runner(da, dt, dw), *want, "graph runner");
      check_close_results(replayed(da, dt, dw), *want, "CUDA Graph replay");
    }
    CHECK(replayed.exec().captured());
  });
}

GPU_TEST_CASE("gpu.reduction_ops.cuda_runs_are_installed") {
  // The slot is installed: a device tensor reaches the CUDA kernel (no host fallback).
  const bool softmax_installed = cg::detail::device_run_slot<cg::ops::softmax> != nullptr;
  const bool loss_installed = cg::detail::device_run_slot<cg::ops::cross_entropy_backward> != nullptr;
  CHECK(softmax_installed);
  CHECK(loss_installed);
}

}  // namespace reduction_ops_gpu_tests
}  // namespace gpu_test_reduction_ops
