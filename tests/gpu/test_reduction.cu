// The CUDA reductions (ccgraph/cuda/reduction.cuh) against the CPU kernels on the same inputs:
// every dtype, and shapes chosen to reach each path of the engine: the row kernel with and
// without 16-byte loads, the column kernel with and without them, the split (two-kernel) form
// of both, the copy fallback for non-adjacent dims and uncoalesced layouts, empty reductions,
// 0-d inputs. Ties and NaNs must pick the same (first) index as the CPU whichever thread or chunk
// saw them. Then the backward kernels. Cases are skipped without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"
#include "reduction_gpu_support.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_reduction {

namespace gpu_reduction_tests {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using namespace ccgraph_test::red;

struct gcase {
  cg::shape_t shape;
  std::vector<i64> dims;
};

/// Shapes reaching every path (see the file comment).
const std::vector<gcase>& gpu_cases() {
  static const std::vector<gcase> cases = {
      {{64, 1000}, {1}},        // rows, 16-byte loads (f32 / bf16), one chunk
      {{33, 999}, {-1}},        // rows, odd length: element loads
      {{2, 1 << 20}, {1}},      // rows split across blocks
      {{1 << 21}, {}},          // a full reduction: one output, split
      {{1000, 64}, {0}},        // columns, 16-byte loads
      {{8, 300, 64}, {1}},      // columns with outer > 1
      {{1000, 63}, {0}},        // columns, element loads
      {{100000, 16}, {0}},      // columns split across blocks
      {{4, 5, 6}, {0, 2}},      // non-adjacent dims: the copy fallback
      {{3, 4, 5}, {}},          // everything
      {{7, 1, 9}, {1}},         // a size-1 reduced dim
      {{5, 7}, {0, 1}},         // both dims, adjacent
      {{3, 0, 4}, {1}},         // an empty reduced dim (sum / mean / var only)
      {{0, 5}, {1}},            // no outputs
      {{}, {}},                 // 0-d
  };
  return cases;
}

template <class T>
void run_sum_mean_var(const gcase& c, layout l, std::uint64_t seed) {
  for (bool keepdim : {false, true}) {
    const auto [h, d] = host_and_device<T>(c.shape, seed, l);
    const cg::shape_t s = cd::reduce_shape(c.shape, c.dims, keepdim, "sum");
    const std::string name = type_name<T>() + " " + cg::shape_str(c.shape) + " dims " + cg::list_str(c.dims) +
                             (keepdim ? " keepdim " : " ") + layout_name(l);
    const double n = static_cast<double>(std::max<i64>(1, cg::numel_of(c.shape) / std::max<i64>(1, cg::numel_of(s))));
    auto hs = cg::tensor<cd::sum_t<T>>::empty(s);
    auto ds = dev_empty<cd::sum_t<T>>(s);
    cd::sum_cpu(h, c.dims, keepdim, hs);
    cd::sum_cuda(d, c.dims, keepdim, ds);
    check_gpu(ds, hs, 2e-6 * n, 2 * tol<cd::sum_t<T>>(), "sum " + name);
    if constexpr (cd::is_floating_element_v<T>) {
      auto hm = cg::tensor<T>::empty(s);
      auto dm = dev_empty<T>(s);
      cd::mean_cpu(h, c.dims, keepdim, hm);
      cd::mean_cuda(d, c.dims, keepdim, dm);
      check_gpu(dm, hm, 2e-6, 2 * tol<T>(), "mean " + name);
      for (double correction : {1.0, 0.0}) {
        cd::var_cpu(h, c.dims, correction, keepdim, hm);
        cd::var_cuda(d, c.dims, correction, keepdim, dm);
        check_gpu(dm, hm, 1e-5, 4 * tol<T>(), "var " + name);
      }
    }
  }
}

template <class T>
void run_extremes(const gcase& c, layout l, std::uint64_t seed, double lo, double hi) {
  const std::vector<bool> mask = cd::reduce_mask(c.shape, c.dims, "amax");
  if (cd::reduce_count(c.shape, mask) == 0) return;  // max of nothing: an error (checked on the CPU)
  for (bool keepdim : {false, true}) {
    const auto [h, d] = host_and_device<T>(c.shape, seed, l, lo, hi);
    const std::string name = type_name<T>() + " " + cg::shape_str(c.shape) + " dims " + cg::list_str(c.dims) +
                             (keepdim ? " keepdim " : " ") + layout_name(l);
    const cg::shape_t s = cd::reduce_shape(c.shape, c.dims, keepdim, "amax");
    for (bool max : {true, false}) {
      auto hv = cg::tensor<T>::empty(s);
      auto dv = dev_empty<T>(s);
      (max ? cd::amax_cpu<T> : cd::amin_cpu<T>)(h, c.dims, keepdim, hv);
      (max ? cd::amax_cuda<T> : cd::amin_cuda<T>)(d, c.dims, keepdim, dv);
      check_gpu(dv, hv, 0, 0, (max ? "amax " : "amin ") + name);
    }
    // Single dims: max(dim) / min(dim) and argmax / argmin; no dim: argmax of the flattened input.
    std::vector<std::optional<i64>> arg_dims;
    if (c.dims.size() == 1) arg_dims.push_back(c.dims[0]);
    if (c.dims.empty() && cg::numel_of(c.shape) > 0) arg_dims.push_back(std::nullopt);
    for (const auto& dim : arg_dims)
      for (bool max : {true, false}) {
        const cg::shape_t as = cd::argmax_meta({cg::dtype_v<T>, c.shape}, dim, keepdim).shape;
        auto hi_ = cg::tensor<i64>::empty(as);
        auto di = dev_empty<i64>(as);
        (max ? cd::argmax_cpu<T> : cd::argmin_cpu<T>)(h, dim, keepdim, hi_);
        (max ? cd::argmax_cuda<T> : cd::argmin_cuda<T>)(d, dim, keepdim, di);
        check_gpu(di, hi_, 0, 0, (max ? "argmax " : "argmin ") + name);
        if (!dim) continue;
        auto hv = cg::tensor<T>::empty(as);
        auto dv = dev_empty<T>(as);
        (max ? cd::max_dim_cpu<T> : cd::min_dim_cpu<T>)(h, *dim, keepdim, hv, hi_);
        (max ? cd::max_dim_cuda<T> : cd::min_dim_cuda<T>)(d, *dim, keepdim, dv, di);
        check_gpu(dv, hv, 0, 0, (max ? "max(dim) values " : "min(dim) values ") + name);
        check_gpu(di, hi_, 0, 0, (max ? "max(dim) indices " : "min(dim) indices ") + name);
      }
    if (cg::numel_of(c.shape) > 0 && c.dims.empty() && keepdim) {
      for (bool max : {true, false}) {
        auto hv = cg::tensor<T>::empty({});
        auto dv = dev_empty<T>({});
        (max ? cd::max_cpu<T> : cd::min_cpu<T>)(h, hv);
        (max ? cd::max_cuda<T> : cd::min_cuda<T>)(d, dv);
        check_gpu(dv, hv, 0, 0, (max ? "max() " : "min() ") + name);
      }
    }
  }
}

template <class T>
void run_all_cases(double lo, double hi) {
  std::uint64_t seed = 1000;
  for (const gcase& c : gpu_cases())
    for (layout l : {layout::contiguous, layout::strided, layout::misaligned}) {
      run_sum_mean_var<T>(c, l, seed++);
      run_extremes<T>(c, l, seed++, lo, hi);
    }
}

}  // namespace gpu_reduction_tests

namespace gpu_reduction_tests {

GPU_TEST_CASE("cuda.reduction.f32") { run_all_cases<float>(-2, 2); }
GPU_TEST_CASE("cuda.reduction.bf16") { run_all_cases<cg::bf16>(-2, 2); }  // bf16: ties are common
GPU_TEST_CASE("cuda.reduction.f16") { run_all_cases<cg::f16>(-2, 2); }
GPU_TEST_CASE("cuda.reduction.f64") { run_all_cases<double>(-2, 2); }
GPU_TEST_CASE("cuda.reduction.i32") { run_all_cases<std::int32_t>(-3, 3); }  // few values: ties everywhere
GPU_TEST_CASE("cuda.reduction.i64") { run_all_cases<std::int64_t>(-1e12, 1e12); }
GPU_TEST_CASE("cuda.reduction.u8") { run_all_cases<std::uint8_t>(0, 255); }
GPU_TEST_CASE("cuda.reduction.bool") { run_all_cases<bool>(0, 1); }

GPU_TEST_CASE("cuda.reduction.nan_and_ties_across_threads") {
  // Rows long enough to be split over blocks; NaNs and ties placed so that the first one lies in
  // a different thread / chunk than later ones.
  const i64 n = 1 << 20;
  auto h = rnd<float>({4, n}, 5, 0, 1);
  float* p = h.data();
  p[0 * n + 777777] = NAN;  // row 0: one late NaN
  p[1 * n + 12] = NAN;      // row 1: an early NaN and a later one
  p[1 * n + 900000] = NAN;
  for (i64 k : {i64{5}, i64{300000}, n - 1}) p[2 * n + k] = 7.0f;  // row 2: a three-way tie for the max
  for (i64 k : {i64{400001}, i64{9}}) p[3 * n + k] = -3.0f;        // row 3: a tie for the min
  const auto d = h.to(cg::device::cuda(0));
  auto hv = cg::tensor<float>::empty({4});
  auto hi_ = cg::tensor<i64>::empty({4});
  auto dv = dev_empty<float>({4});
  auto di = dev_empty<i64>({4});
  cd::max_dim_cpu(h, 1, false, hv, hi_);
  cd::max_dim_cuda(d, 1, false, dv, di);
  CHECK(hi_.to_vector() == std::vector<i64>{777777, 12, 5, hi_.to_vector()[3]});
  check_gpu(di, hi_, 0, 0, "max(dim) indices with NaN / ties");
  check_gpu(dv, hv, 0, 0, "max(dim) values with NaN / ties");
  cd::min_dim_cpu(h, 1, false, hv, hi_);
  cd::min_dim_cuda(d, 1, false, dv, di);
  CHECK(hi_.to_vector()[3] == 9);
  check_gpu(di, hi_, 0, 0, "min(dim) indices with NaN / ties");
  // The same along dim 0 (the column kernel, split): transpose the data.
  const auto ht = h.transpose(0, 1).contiguous();
  const auto dt = ht.to(cg::device::cuda(0));
  auto hc = cg::tensor<i64>::empty({4});
  auto dc = dev_empty<i64>({4});
  cd::argmax_cpu(ht, 0, false, hc);
  cd::argmax_cuda(dt, 0, false, dc);
  check_gpu(dc, hc, 0, 0, "argmax dim 0 with NaN / ties");
  // amax: NaN propagates.
  auto da = dev_empty<float>({4});
  cd::amax_cuda(d, {1}, false, da);
  const auto av = da.cpu().to_vector();
  CHECK(std::isnan(av[0]));
  CHECK(std::isnan(av[1]));
  CHECK(av[2] == 7.0f);
}

GPU_TEST_CASE("cuda.reduction.transposed_layouts") {
  // A transposed input: reducing the dim of stride 1 with the kept dim strided (rows with
  // inner > 1), and the kept dim of stride 1 (columns with inner == 1).
  const auto base = rnd<float>({300, 200}, 9);
  const auto h = base.transpose(0, 1);  // [200, 300], strides [1, 200]
  const auto d = base.to(cg::device::cuda(0)).transpose(0, 1);
  for (i64 dim : {0, 1}) {
    const cg::shape_t s = cd::reduce_shape(h.shape(), {dim}, false, "sum");
    auto hs = cg::tensor<float>::empty(s);
    auto ds = dev_empty<float>(s);
    cd::sum_cpu(h, {dim}, false, hs);
    cd::sum_cuda(d, {dim}, false, ds);
    check_gpu(ds, hs, 1e-3, 1e-5, "sum of a transposed input, dim " + std::to_string(dim));
    auto hi_ = cg::tensor<i64>::empty(s);
    auto di = dev_empty<i64>(s);
    cd::argmin_cpu(h, dim, false, hi_);
    cd::argmin_cuda(d, dim, false, di);
    check_gpu(di, hi_, 0, 0, "argmin of a transposed input, dim " + std::to_string(dim));
  }
}

GPU_TEST_CASE("cuda.reduction.large_i32_sum_is_i64") {
  auto h = cg::full<std::int32_t>({1 << 20}, 4096);  // 2^32: past i32
  auto d = dev_empty<i64>({});
  cd::sum_cuda(h.to(cg::device::cuda(0)), {}, false, d);
  CHECK(d.cpu().item() == (i64{1} << 32));
}

GPU_TEST_CASE("cuda.reduction.backward") {
  for (layout l : {layout::contiguous, layout::strided}) {
    // bf16 in few distinct values: ties inside slices.
    const auto [h, d] = host_and_device<cg::bf16>({6, 50, 7}, 31, l, -2, 2);
    for (bool keepdim : {false, true}) {
      const std::vector<i64> dims{1, 2};
      const cg::shape_t s = cd::reduce_shape(h.shape(), dims, keepdim, "amax");
      auto hr = cg::tensor<cg::bf16>::empty(s);
      auto dr = dev_empty<cg::bf16>(s);
      cd::amax_cpu(h, dims, keepdim, hr);
      cd::amax_cuda(d, dims, keepdim, dr);
      const auto hg = rnd<cg::bf16>(s, 32);
      const auto dg = hg.to(cg::device::cuda(0));
      auto hdx = cg::tensor<cg::bf16>::empty(h.shape());
      auto ddx = dev_empty<cg::bf16>(h.shape());
      cd::amax_backward_cpu(hg, h, hr, dims, keepdim, hdx);
      cd::amax_backward_cuda(dg, d, dr, dims, keepdim, ddx);
      check_gpu(ddx, hdx, 0, tol<cg::bf16>(), std::string("amax_backward ") + layout_name(l));
      // max(dim) backward.
      const cg::shape_t s1 = cd::reduce_shape(h.shape(), {1}, keepdim, "max");
      auto hv = cg::tensor<cg::bf16>::empty(s1);
      auto hi_ = cg::tensor<i64>::empty(s1);
      cd::max_dim_cpu(h, 1, keepdim, hv, hi_);
      const auto hg1 = rnd<cg::bf16>(s1, 33);
      cd::max_dim_backward_cpu(hg1, hi_, 1, keepdim, hdx);
      cd::max_dim_backward_cuda(hg1.to(cg::device::cuda(0)), hi_.to(cg::device::cuda(0)), 1, keepdim, ddx);
      check_gpu(ddx, hdx, 0, 0, std::string("max_dim_backward ") + layout_name(l));
    }
    // max() backward with NaN matching.
    auto hn = h.clone();
    hn.data()[17] = cg::bf16(NAN);
    hn.data()[1000] = cg::bf16(NAN);
    auto hm = cg::tensor<cg::bf16>::empty({});
    cd::max_cpu(hn, hm);
    auto hdx = cg::tensor<cg::bf16>::empty(h.shape());
    auto ddx = dev_empty<cg::bf16>(h.shape());
    const auto g0 = cg::tensor<cg::bf16>::from({cg::bf16(3.0f)}, {});
    cd::max_backward_cpu(g0, hn, hm, hdx);
    cd::max_backward_cuda(g0.to(cg::device::cuda(0)), hn.to(cg::device::cuda(0)), hm.to(cg::device::cuda(0)), ddx);
    check_gpu(ddx, hdx, 0, 0, "max_backward with NaN");
    // var backward.
    const auto [hf, df] = host_and_device<float>({6, 50, 7}, 34, l);
    for (const std::vector<i64>& dims : {std::vector<i64>{1}, std::vector<i64>{0, 2}, std::vector<i64>{}}) {
      const cg::shape_t s = cd::reduce_shape(hf.shape(), dims, true, "var");
      const auto g = rnd<float>(s, 35);
      auto hdxf = cg::tensor<float>::empty(hf.shape());
      auto ddxf = dev_empty<float>(hf.shape());
      cd::var_backward_cpu(g, hf, dims, 1.0, true, hdxf);
      cd::var_backward_cuda(g.to(cg::device::cuda(0)), df, dims, 1.0, true, ddxf);
      check_gpu(ddxf, hdxf, 1e-6, 1e-4, "var_backward dims " + cg::list_str(dims) + " " + layout_name(l));
    }
  }
}

}  // namespace gpu_reduction_tests
}  // namespace gpu_test_reduction
