// bench_gpu_norms: the fused row-wise kernels (softmax, log_softmax, layer_norm, rms_norm, their
// backward, cross_entropy) and the reductions along dims on one GPU, at a transformer's sizes,
// bf16 and f32. Prints a table (time, effective bandwidth, fraction of the H100's ~3.35 TB/s HBM3)
// and one `RESULT <workload> ccgraph_kernel <us> us` line per workload, the format of
// bench/torch_norms.py, which times PyTorch's same ops: bench/compare_norms.sh runs both and
// merges them (bench/compare_table.py).
//
// Timing: CUDA events around each call on the current stream after warm-up, median of the
// iterations; inputs are random (never zeros) and rotated through enough copies that they never
// sit in L2 (50 MB) from one call to the next.
//
// Usage: bench_gpu_norms [--quick] [--only SUBSTR]
#include <ccgraph/cuda.hpp>

#include "bench_args.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <utility>
#include <string>
#include <vector>

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using i64 = std::int64_t;

namespace {

constexpr double hbm_peak_gbs = 3350.0;  // H100 SXM HBM3
constexpr double l2_bytes = 50e6;

/// Uniform values in [lo, hi) from a counter hash: fast fills of large device tensors.
template <class T>
__global__ void fill_uniform_kernel(T* p, i64 n, std::uint64_t seed, float lo, float hi) {
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    std::uint64_t z = seed + static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    p[i] = cg::cuda::detail::from_acc<T>(lo + (hi - lo) * u);
  }
}

template <class T>
cg::tensor<T> random_device(const cg::shape_t& shape, std::uint64_t seed, float lo = -2.f, float hi = 2.f) {
  auto t = cg::tensor<T>::empty(shape, cg::device::cuda(0));
  const i64 n = t.numel();
  if (n > 0) fill_uniform_kernel<T><<<1024, 256, 0, cg::cuda::current_stream()>>>(t.data(), n, seed, lo, hi);
  return t;
}

/// Random class indices in [0, classes).
__global__ void fill_targets_kernel(i64* p, i64 n, i64 classes, std::uint64_t seed) {
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    std::uint64_t z = seed + static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31;
    p[i] = static_cast<i64>(z % static_cast<std::uint64_t>(classes));
  }
}

struct options {
  bool quick = false;
  std::string only;
};

/// Median microseconds of `f(k)` (k: the input copy to use), one event pair per call.
double time_us(const std::function<void(int)>& f, int copies, int warmup, int iters) {
  const cudaStream_t s = cg::cuda::current_stream();
  for (int i = 0; i < warmup; ++i) f(i % copies);
  std::vector<cudaEvent_t> ev(static_cast<std::size_t>(iters) + 1);
  for (auto& e : ev) CCGRAPH_CHECK_CUDA(cudaEventCreate(&e));
  CCGRAPH_CHECK_CUDA(cudaEventRecord(ev[0], s));
  for (int i = 0; i < iters; ++i) {
    f(i % copies);
    CCGRAPH_CHECK_CUDA(cudaEventRecord(ev[static_cast<std::size_t>(i) + 1], s));
  }
  CCGRAPH_CHECK_CUDA(cudaEventSynchronize(ev.back()));
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    CCGRAPH_CHECK_CUDA(cudaEventElapsedTime(&ms, ev[static_cast<std::size_t>(i)], ev[static_cast<std::size_t>(i) + 1]));
    us.push_back(1e3 * ms);
  }
  for (auto& e : ev) (void)cudaEventDestroy(e);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

/// Copies of an input of `bytes` so that consecutive calls never find theirs in L2.
int copies_for(double bytes) { return std::clamp(static_cast<int>(2 * l2_bytes / std::max(bytes, 1.0)) + 1, 1, 8); }

struct row {
  std::string workload;
  double us, bytes;
};

std::vector<row> rows_out;

void report(const options& o, const std::string& workload, double bytes, const std::function<void(int)>& f, int copies) {
  const int iters = o.quick ? 20 : 100;
  const double us = time_us(f, copies, o.quick ? 3 : 10, iters);
  rows_out.push_back({workload, us, bytes});
  std::printf("%-40s %10.2f us %9.1f GB/s %6.1f%% of HBM\n", workload.c_str(), us, bytes / us / 1e3,
              100.0 * bytes / us / 1e3 / hbm_peak_gbs);
  std::printf("RESULT %s ccgraph_kernel %.4f us\n", workload.c_str(), us);
  std::fflush(stdout);
}

bool wanted(const options& o, const std::string& w) { return o.only.empty() || w.find(o.only) != std::string::npos; }

std::string dims_str(i64 m, i64 n) { return std::to_string(m) + "x" + std::to_string(n); }

template <class T>
const char* tname() {
  return std::is_same_v<T, float> ? "f32" : std::is_same_v<T, cg::bf16> ? "bf16" : "f16";
}

template <class T>
void bench_rowwise(const options& o, i64 m, i64 n) {
  const std::string shape = std::string(tname<T>()) + "_" + dims_str(m, n);
  const double elems = static_cast<double>(m) * static_cast<double>(n);
  const double tb = elems * sizeof(T);
  const int copies = copies_for(tb);
  std::vector<cg::tensor<T>> x, g;
  for (int k = 0; k < copies; ++k) {
    x.push_back(random_device<T>({m, n}, 10 + k));
    g.push_back(random_device<T>({m, n}, 50 + k));
  }
  auto y = cg::tensor<T>::empty({m, n}, cg::device::cuda(0));
  auto dx = cg::tensor<T>::empty({m, n}, cg::device::cuda(0));
  const auto w = random_device<T>({n}, 90), b = random_device<T>({n}, 91);
  auto mean = cg::tensor<float>::empty({m, 1}, cg::device::cuda(0));
  auto rstd = cg::tensor<float>::empty({m, 1}, cg::device::cuda(0));
  auto dw = cg::tensor<T>::empty({n}, cg::device::cuda(0)), db = cg::tensor<T>::empty({n}, cg::device::cuda(0));
  if (wanted(o, "softmax_" + shape))
    report(o, "softmax_" + shape, 2 * tb, [&](int k) { cd::softmax_cuda(x[static_cast<std::size_t>(k)], -1, y); }, copies);
  if (wanted(o, "log_softmax_" + shape))
    report(o, "log_softmax_" + shape, 2 * tb, [&](int k) { cd::log_softmax_cuda(x[static_cast<std::size_t>(k)], -1, y); }, copies);
  if (wanted(o, "softmax_backward_" + shape)) {
    cd::softmax_cuda(x[0], -1, y);
    report(o, "softmax_backward_" + shape, 3 * tb,
           [&](int k) { cd::softmax_backward_cuda(g[static_cast<std::size_t>(k)], y, -1, dx); }, copies);
  }
  if (wanted(o, "layer_norm_" + shape))
    report(o, "layer_norm_" + shape, 2 * tb,
           [&](int k) { cd::layer_norm_cuda(x[static_cast<std::size_t>(k)], {n}, w, b, 1e-5, y, &mean, &rstd); }, copies);
  if (wanted(o, "rms_norm_" + shape))
    report(o, "rms_norm_" + shape, 2 * tb,
           [&](int k) { cd::rms_norm_cuda(x[static_cast<std::size_t>(k)], {n}, w, std::nullopt, y, &rstd); }, copies);
  if (wanted(o, "layer_norm_backward_" + shape)) {
    cd::layer_norm_cuda(x[0], {n}, w, b, 1e-5, y, &mean, &rstd);
    report(o, "layer_norm_backward_" + shape, 3 * tb,
           [&](int k) { cd::layer_norm_backward_cuda(g[static_cast<std::size_t>(k)], x[0], {n}, mean, rstd, w, &dx, &dw, &db); },
           copies);
  }
  if (wanted(o, "rms_norm_backward_" + shape)) {
    cd::rms_norm_cuda(x[0], {n}, w, std::nullopt, y, &rstd);
    report(o, "rms_norm_backward_" + shape, 3 * tb,
           [&](int k) { cd::rms_norm_backward_cuda(g[static_cast<std::size_t>(k)], x[0], {n}, rstd, w, &dx, &dw); },
           copies);
  }
}

template <class T>
void bench_reductions(const options& o, i64 m, i64 n) {
  const std::string shape = std::string(tname<T>()) + "_" + dims_str(m, n);
  const double tb = static_cast<double>(m) * static_cast<double>(n) * sizeof(T);
  const int copies = copies_for(tb);
  std::vector<cg::tensor<T>> x;
  for (int k = 0; k < copies; ++k) x.push_back(random_device<T>({m, n}, 200 + k));
  auto rm = cg::tensor<T>::empty({m}, cg::device::cuda(0));
  auto rn = cg::tensor<T>::empty({n}, cg::device::cuda(0));
  auto im = cg::tensor<i64>::empty({m}, cg::device::cuda(0));
  if (wanted(o, "sum_lastdim_" + shape))
    report(o, "sum_lastdim_" + shape, tb, [&](int k) { cd::sum_cuda(x[static_cast<std::size_t>(k)], {-1}, false, rm); }, copies);
  if (wanted(o, "sum_dim0_" + shape))
    report(o, "sum_dim0_" + shape, tb, [&](int k) { cd::sum_cuda(x[static_cast<std::size_t>(k)], {0}, false, rn); }, copies);
  if (wanted(o, "amax_lastdim_" + shape))
    report(o, "amax_lastdim_" + shape, tb, [&](int k) { cd::amax_cuda(x[static_cast<std::size_t>(k)], {-1}, false, rm); }, copies);
  if (wanted(o, "argmax_lastdim_" + shape))
    report(o, "argmax_lastdim_" + shape, tb, [&](int k) { cd::argmax_cuda(x[static_cast<std::size_t>(k)], -1, false, im); }, copies);
  if (wanted(o, "var_lastdim_" + shape))
    report(o, "var_lastdim_" + shape, tb, [&](int k) { cd::var_cuda(x[static_cast<std::size_t>(k)], {-1}, 1.0, false, rm); }, copies);
  if (wanted(o, "var_dim0_" + shape))
    report(o, "var_dim0_" + shape, tb, [&](int k) { cd::var_cuda(x[static_cast<std::size_t>(k)], {0}, 1.0, false, rn); }, copies);
  if (wanted(o, "sum_all_" + shape)) {
    auto s = cg::tensor<T>::empty({}, cg::device::cuda(0));
    report(o, "sum_all_" + shape, tb, [&](int k) { cd::sum_cuda(x[static_cast<std::size_t>(k)], {}, false, s); }, copies);
  }
}

template <class T>
void bench_cross_entropy(const options& o, i64 tokens, i64 vocab) {
  const std::string shape = std::string(tname<T>()) + "_" + dims_str(tokens, vocab);
  const double tb = static_cast<double>(tokens) * static_cast<double>(vocab) * sizeof(T);
  const int copies = copies_for(tb);
  std::vector<cg::tensor<T>> x;
  for (int k = 0; k < copies; ++k) x.push_back(random_device<T>({tokens, vocab}, 300 + k, -4.f, 4.f));
  auto t = cg::tensor<i64>::empty({tokens}, cg::device::cuda(0));
  fill_targets_kernel<<<256, 256, 0, cg::cuda::current_stream()>>>(t.data(), tokens, vocab, 7);
  auto loss = cg::tensor<T>::empty({}, cg::device::cuda(0));
  auto lse = cg::tensor<float>::empty({tokens}, cg::device::cuda(0));
  auto dx = cg::tensor<T>::empty({tokens, vocab}, cg::device::cuda(0));
  const auto one = cg::full<T>({}, T(1.0f)).to(cg::device::cuda(0));
  if (wanted(o, "cross_entropy_" + shape))
    report(o, "cross_entropy_" + shape, tb,
           [&](int k) {
             cd::cross_entropy_cuda(x[static_cast<std::size_t>(k)], t, std::nullopt, cg::loss_reduction::mean, -100, 0.0, loss, &lse);
           },
           copies);
  if (wanted(o, "cross_entropy_backward_" + shape)) {
    cd::cross_entropy_cuda(x[0], t, std::nullopt, cg::loss_reduction::mean, -100, 0.0, loss, &lse);
    report(o, "cross_entropy_backward_" + shape, 2 * tb,
           [&](int k) {
             cd::cross_entropy_backward_cuda(one, x[static_cast<std::size_t>(k)], t, std::nullopt, cg::loss_reduction::mean, -100,
                                             0.0, lse, dx);
           },
           copies);
  }
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  const bench::args args(argc, argv, "[--quick] [--only SUBSTR]", {"--quick"}, {"--only"});
  o.quick = args.has("--quick");
  o.only = args.value("--only").value_or("");
  try {
    cudaDeviceProp prop{};
    CCGRAPH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("# bench_gpu_norms on %s (%d SMs), CUDA Graphs off, medians of %d calls\n", prop.name,
                prop.multiProcessorCount, o.quick ? 20 : 100);
    // Transformer sizes: hidden 4096 / 8192 rows of 8192 / 4096 tokens; attention-score rows of
    // 128 (32 heads x 4096 queries); a vocabulary of 32000 and 50257 (odd: element loads).
    for (auto [m, n] : {std::pair<i64, i64>{8192, 4096}, {4096, 8192}, {32 * 4096, 128}}) {
      bench_rowwise<float>(o, m, n);
      bench_rowwise<cg::bf16>(o, m, n);
    }
    bench_reductions<float>(o, 8192, 4096);
    bench_reductions<cg::bf16>(o, 8192, 4096);
    bench_cross_entropy<cg::bf16>(o, 8192, 32000);
    bench_cross_entropy<cg::bf16>(o, 4096, 50257);
    bench_cross_entropy<float>(o, 4096, 32000);
    cg::cuda::synchronize();
  } catch (const std::exception& e) {
    std::printf("# error: %s\n", e.what());
    return 1;
  }
  return 0;
}
