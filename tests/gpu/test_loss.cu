// The fused CUDA cross_entropy and its backward (ccgraph/cuda/loss.cuh) against the CPU kernels
// on the same inputs: class counts from 1 to a large vocabulary (16-byte and element loads,
// groups of every size), spatial dims, unbatched inputs, reductions none / mean / sum, class
// weights, ignore_index, label smoothing, and bad targets (NaN result, the first bad position
// reported, the CPU's error raised from it; without that report, as in the graph ops, the
// kernel traps: checked in a child process). Cases are skipped without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"
#include "reduction_gpu_support.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_loss {

namespace gpu_loss_tests {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using namespace ccgraph_test::red;

struct ce_gcase {
  cg::shape_t shape;
  bool weighted;
  double smoothing;
};

cg::shape_t targets_of(const cg::shape_t& shape) {
  if (shape.size() == 1) return {};
  cg::shape_t t{shape[0]};
  t.insert(t.end(), shape.begin() + 2, shape.end());
  return t;
}

template <class T>
void run_ce(const ce_gcase& c, layout l, std::uint64_t seed) {
  const cg::device gpu = cg::device::cuda(0);
  const i64 classes = c.shape.size() == 1 ? c.shape[0] : c.shape[1];
  const i64 ignore = classes > 2 ? 2 : -100;
  const auto [h, d] = host_and_device<T>(c.shape, seed, l, -4, 4);
  auto t = rnd<i64>(targets_of(c.shape), seed + 1, 0, static_cast<double>(classes) - 1e-9);
  for (i64 i = 0; i < t.numel(); ++i)
    if (i % 4 == 3) t.data()[i] = ignore;
  const auto dt = t.to(gpu);
  const std::optional<cg::tensor<T>> hw = c.weighted ? std::optional(rnd<T>({classes}, seed + 2, 0.2, 2)) : std::nullopt;
  const std::optional<cg::tensor<T>> dw = hw ? std::optional(hw->to(gpu)) : std::nullopt;
  using S = cd::norm_stat_t<T>;
  for (cg::loss_reduction red : {cg::loss_reduction::none, cg::loss_reduction::mean, cg::loss_reduction::sum}) {
    const cg::shape_t ls = red == cg::loss_reduction::none ? targets_of(c.shape) : cg::shape_t{};
    auto hl = cg::tensor<T>::empty(ls);
    auto dl = dev_empty<T>(ls);
    auto hlse = cg::tensor<S>::empty(targets_of(c.shape));
    auto dlse = dev_empty<S>(targets_of(c.shape));
    auto bad = dev_empty<i64>({1});
    cd::cross_entropy_cpu(h, t, hw, red, ignore, c.smoothing, hl, &hlse);
    cd::cross_entropy_cuda(d, dt, dw, red, ignore, c.smoothing, dl, &dlse, &bad);
    const std::string name = "cross_entropy " + type_name<T>() + " " + cg::shape_str(c.shape) +
                             (c.weighted ? " weighted" : "") + " ls " + std::to_string(c.smoothing) + " " +
                             std::string(cg::to_string(red)) + " " + layout_name(l);
    const double n = static_cast<double>(std::max<i64>(1, t.numel()));
    check_gpu(dl, hl, red == cg::loss_reduction::sum ? 1e-5 * n : 1e-5, 4 * tol<T>(), name);
    check_gpu(dlse, hlse, 1e-5, 1e-5, name + " lse");
    CHECK_MESSAGE(bad.cpu().item() == -1, name, ": no bad target expected");
    // Backward.
    const auto g = rnd<T>(ls, seed + 3);
    auto hdx = cg::tensor<T>::empty(c.shape);
    auto ddx = dev_empty<T>(c.shape);
    cd::cross_entropy_backward_cpu(g, h, t, hw, red, ignore, c.smoothing, hlse, hdx);
    cd::cross_entropy_backward_cuda(g.to(gpu), d, dt, dw, red, ignore, c.smoothing, dlse, ddx, &bad);
    check_gpu(ddx, hdx, 1e-6, 4 * tol<T>(), name + " backward");
    CHECK_MESSAGE(bad.cpu().item() == -1, name, " backward: no bad target expected");
  }
}

const std::vector<ce_gcase>& ce_gcases() {
  static const std::vector<ce_gcase> cases = {
      {{64, 1}, false, 0.0},      {{300, 5}, true, 0.0},     {{300, 10}, false, 0.1},   {{40, 1000}, true, 0.2},
      {{16, 32000}, false, 0.0},  {{8, 50257}, true, 0.1},   {{4, 128000}, false, 0.0}, {{3, 7, 4, 5}, true, 0.3},
      {{6, 3, 100}, false, 0.0},  {{9}, false, 0.1},         {{0, 6}, false, 0.0},
  };
  return cases;
}

GPU_TEST_CASE("cuda.cross_entropy.f32") {
  std::uint64_t seed = 6000;
  for (const ce_gcase& c : ce_gcases())
    for (layout l : {layout::contiguous, layout::misaligned, layout::strided}) run_ce<float>(c, l, seed += 4);
}
GPU_TEST_CASE("cuda.cross_entropy.bf16") {
  std::uint64_t seed = 7000;
  for (const ce_gcase& c : ce_gcases()) run_ce<cg::bf16>(c, layout::contiguous, seed += 4);
}
GPU_TEST_CASE("cuda.cross_entropy.f16_f64") {
  std::uint64_t seed = 8000;
  for (const ce_gcase& c : ce_gcases()) {
    run_ce<cg::f16>(c, layout::contiguous, seed += 4);
    run_ce<double>(c, layout::contiguous, seed += 4);
  }
}

GPU_TEST_CASE("cuda.cross_entropy.bad_targets") {
  const cg::device gpu = cg::device::cuda(0);
  for (const cg::shape_t& shape : {cg::shape_t{6, 10}, cg::shape_t{2, 10, 3}}) {
    const auto x = rnd<float>(shape, 1).to(gpu);
    const cg::shape_t ts = targets_of(shape);
    auto t = rnd<i64>(ts, 2, 0, 9.99);
    t.data()[4] = 10;  // out of bounds
    t.data()[5] = -7;  // out of bounds too, later
    const auto dt = t.to(gpu);
    auto bad = dev_empty<i64>({1});
    auto loss = dev_empty<float>(ts);
    cd::cross_entropy_cuda(x, dt, std::nullopt, cg::loss_reduction::none, -100, 0.0, loss, nullptr, &bad);
    CHECK(bad.cpu().item() == 4);
    const auto lv = loss.cpu().to_vector();
    CHECK(std::isnan(lv[4]));
    CHECK(std::isnan(lv[5]));
    CHECK(std::isfinite(lv[0]));
    std::string message;
    try {
      cd::cross_entropy_raise_bad_target(bad, dt, 10);
    } catch (const cg::error& e) {
      message = e.what();
    }
    CHECK(message.find("cross_entropy: target 10 at position 4 is out of bounds for 10 classes") != std::string::npos);
    auto mean = dev_empty<float>({});
    cd::cross_entropy_cuda(x, dt, std::nullopt, cg::loss_reduction::mean, -100, 0.0, mean, nullptr, &bad);
    CHECK(std::isnan(mean.cpu().item()));
    auto lse = dev_empty<float>(ts);
    cd::cross_entropy_cuda(x, dt, std::nullopt, cg::loss_reduction::sum, -100, 0.0, mean, &lse, &bad);
    auto dx = dev_empty<float>(shape);
    bad.fill_(0);
    cd::cross_entropy_backward_cuda(cg::tensor<float>::from({1.0f}, {}).to(gpu), x, dt, std::nullopt,
                                    cg::loss_reduction::sum, -100, 0.0, lse, dx, &bad);
    CHECK(bad.cpu().item() == 4);
    // Valid targets leave the flag at -1.
    const auto ok = rnd<i64>(ts, 3, 0, 9.99).to(gpu);
    cd::cross_entropy_cuda(x, ok, std::nullopt, cg::loss_reduction::mean, -100, 0.0, mean, nullptr, &bad);
    CHECK(bad.cpu().item() == -1);
    CHECK_NOTHROW(cd::cross_entropy_raise_bad_target(bad, ok, 10));
  }
}

// The graph op (eager here; a CUDA Graph replays the same kernel) has no bad_target to fill: an
// out-of-range target must stop the kernel with the target and its position, not return a NaN
// loss. A trap poisons the CUDA context, so a child process (this binary, this case alone) runs
// it, and the parent checks that it failed and what it printed.
GPU_TEST_CASE("cuda.cross_entropy.graph_op_bad_target_traps") {
  const cg::device gpu = cg::device::cuda(0);
  const auto bad = cg::tensor<i64>::from({1, 7, 2, 3}, {4});  // 7 classes: target 7 at position 1
  const auto good = cg::tensor<i64>::from({1, 6, 2, 3}, {4});
  const auto x = rnd<float>({4, 7}, 5).to(gpu);
  if (std::getenv("CCGRAPH_TEST_TRAP_CHILD")) {
    const auto loss = cg::cross_entropy(x, bad.to(gpu), std::nullopt, -100, cg::loss_reduction::mean);
    std::printf("child: loss %f (the kernel did not stop)\n", static_cast<double>(loss.cpu().item()));
    std::exit(0);  // the parent's check fails on this exit status
  }
  // A valid target first: the same call runs and matches the CPU.
  const auto ok = cg::cross_entropy(x, good.to(gpu), std::nullopt, -100, cg::loss_reduction::mean).cpu().item();
  CHECK(ok == doctest::Approx(cg::cross_entropy(x.cpu(), good, std::nullopt, -100, cg::loss_reduction::mean).item()));
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  REQUIRE(n > 0);
  self[n] = 0;
  const std::string cmd = std::string("CCGRAPH_TEST_TRAP_CHILD=1 '") + self +
                          "' --test-case=cuda.cross_entropy.graph_op_bad_target_traps --no-intro 2>&1";
  FILE* child = popen(cmd.c_str(), "r");
  REQUIRE(child != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), child)) out += buf;
  const int status = pclose(child);
  INFO("child output:\n", out);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) != 0);
  CHECK(out.find("ccgraph cross_entropy: target 7 at position 1 is out of bounds for 7 classes") != std::string::npos);
  CHECK(out.find("did not stop") == std::string::npos);
}

}  // namespace gpu_loss_tests
}  // namespace gpu_test_loss
