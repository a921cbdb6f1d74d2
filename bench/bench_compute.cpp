// bench_compute: CPU compute on one core: matmul GFLOP/s (ccgraph/ops/matmul.hpp) and the
// memory throughput of fused pointwise expressions (ccgraph/ops/pointwise.hpp).
//
// Medians of several runs after a warm-up, random data, wall-clock time. Pointwise GB/s count
// the bytes the fused loop must move (every operand read once, the output written once); the
// unfused row runs the same math as one op per loop, with temporaries, for comparison.
#include <ccgraph/ops/matmul.hpp>
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/tensor/random.hpp>

#include "bench_args.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace cg = ccgraph;

namespace {

template <class F>
double median_seconds(int runs, F&& f) {
  f();  // warm-up: page faults, caches
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void row(const std::string& what, const std::string& size, double seconds, double rate,
         const char* unit) {
  std::printf("| %-34s | %-16s | %10.3f | %8.2f %-7s |\n", what.c_str(), size.c_str(), seconds * 1e3,
              rate, unit);
}

template <class T>
void bench_matmul(const char* dtype, std::int64_t n, int runs) {
  const auto a = cg::uniform<T>({n, n}, -1, 1, 1);
  const auto b = cg::uniform<T>({n, n}, -1, 1, 2);
  const double s = median_seconds(runs, [&] { (void)cg::matmul(a, b); });
  const std::string size = std::to_string(n) + "x" + std::to_string(n) + "x" + std::to_string(n);
  row(std::string("matmul ") + dtype, size, s, cg::detail::matmul_flops(n, n, n) / s / 1e9, "GFLOP/s");
}

}  // namespace

int main(int argc, char** argv) {
  const bench::args args(argc, argv, "(no arguments)");
  std::printf("| %-34s | %-16s | %10s | %-16s |\n", "workload", "size", "median ms", "rate");
  std::printf("|%s|%s|%s|%s|\n", std::string(36, '-').c_str(), std::string(18, '-').c_str(),
              std::string(12, '-').c_str(), std::string(18, '-').c_str());
  bench_matmul<float>("f32", 128, 21);
  bench_matmul<float>("f32", 256, 11);
  bench_matmul<float>("f32", 512, 7);
  bench_matmul<float>("f32", 1024, 3);
  bench_matmul<cg::bf16>("bf16", 512, 5);
  bench_matmul<double>("f64", 512, 5);
  {  // A transposed (column-major) operand: packing absorbs the strides.
    const auto a = cg::uniform<float>({512, 512}, -1, 1, 1);
    const auto b = cg::uniform<float>({512, 512}, -1, 1, 2).transpose(0, 1);
    const double s = median_seconds(7, [&] { (void)cg::matmul(a, b); });
    row("matmul f32, b transposed view", "512x512x512", s, cg::detail::matmul_flops(512, 512, 512) / s / 1e9,
        "GFLOP/s");
  }

  constexpr std::int64_t n = std::int64_t{1} << 24;  // 16M elements, 64 MiB per f32 tensor
  const auto a = cg::uniform<float>({n}, -1, 1, 1);
  const auto b = cg::uniform<float>({n}, -1, 1, 2);
  const auto c = cg::uniform<float>({n}, -1, 1, 3);
  auto out = cg::tensor<float>::empty({n});
  const double bytes4 = 4.0 * n * sizeof(float);  // 3 reads + 1 write
  const double fused = median_seconds(7, [&] { cg::detail::evaluate_into(cg::relu(a) * b + c, out); });
  row("relu(a) * b + c, fused", "16M f32", fused, bytes4 / fused / 1e9, "GB/s");
  const double unfused = median_seconds(7, [&] {
    cg::tensor<float> t1 = cg::relu(a);
    cg::tensor<float> t2 = t1 * b;
    cg::tensor<float> t3 = t2 + c;
  });
  row("relu(a) * b + c, op by op", "16M f32", unfused, bytes4 / unfused / 1e9, "GB/s");
  const double bcast = median_seconds(7, [&] {
    cg::detail::evaluate_into(cg::relu(a.reshape({4096, 4096})) * b.reshape({4096, 4096}).narrow(0, 0, 1) + 1.f,
                              out.reshape({4096, 4096}));
  });
  row("relu(a) * row + 1, broadcast path", "4096x4096 f32", bcast, 2.0 * n * 4 / bcast / 1e9, "GB/s");
  const double gelu = median_seconds(5, [&] { cg::detail::evaluate_into(cg::gelu(a) + b, out); });
  row("gelu(a) + b, fused", "16M f32", gelu, 3.0 * n * 4 / gelu / 1e9, "GB/s");
}
