// The fused CUDA kernels of softmax, log_softmax, layer_norm, rms_norm and their backward
// (ccgraph/cuda/normalization.cuh) against the CPU kernels on the same inputs. Row lengths are
// chosen to reach every launch: the register path with 1, 2, 4 and 8 packs per thread, groups
// smaller than a warp, of one warp, of several warps and of 1024 threads; the looped path with
// 16-byte loads (rows too long for registers) and with element loads (odd lengths, misaligned
// inputs); softmax over an inner dim (the spatial kernel); -inf / NaN / +inf rows on each path.
// Cases are skipped without a GPU.
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
namespace gpu_test_normalization {

namespace gpu_normalization_tests {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using namespace ccgraph_test::red;

/// Row lengths and row counts: about a million elements at most per case.
struct row_case {
  i64 rows, n;
};
const std::vector<row_case>& row_cases() {
  static const std::vector<row_case> cases = {
      {7, 1},     {300, 3},   {300, 8},    {257, 32},   {64, 128},  {33, 1000}, {17, 1024},  {9, 4096},
      {5, 4099},  {4, 8192},  {3, 12288},  {2, 20000},  {2, 32768}, {2, 40000}, {1, 70000},  {1, 100003},
  };
  return cases;
}

template <class T>
void run_softmax(layout l) {
  std::uint64_t seed = 2000;
  for (const row_case& c : row_cases())
    for (bool log : {false, true}) {
      const cg::shape_t shape{c.rows, c.n};
      const auto [h, d] = host_and_device<T>(shape, seed++, l, -6, 6);
      auto hy = cg::tensor<T>::empty(shape);
      auto dy = dev_empty<T>(shape);
      (log ? cd::log_softmax_cpu<T> : cd::softmax_cpu<T>)(h, -1, hy);
      (log ? cd::log_softmax_cuda<T> : cd::softmax_cuda<T>)(d, -1, dy);
      const std::string name = std::string(log ? "log_softmax " : "softmax ") + type_name<T>() + " " +
                               cg::shape_str(shape) + " " + layout_name(l);
      check_gpu(dy, hy, log ? 1e-5 : 1e-7, 2 * tol<T>(), name);
      // Backward with a fresh incoming gradient, both kernels on the same y: the GPU's. The two
      // forwards may legitimately differ by one ulp of T (checked above), and log_softmax's
      // backward, dx = g - exp(y) * sum(g), turns that into a large error: at |y| ~ 10 a bf16
      // ulp is 1/16, so exp(y) moves by 6%, and dx cancels O(1) terms into results ~1e-3
      // (bf16 [1, 100003]: the CPU's float-accumulated log-sum-exp is 1.2e-4 off, which moved
      // 46 y's across a rounding midpoint, and exactly those 46 dx's differed).
      const auto hyd = dy.cpu();
      const auto g = rnd<T>(shape, seed++);
      auto hdx = cg::tensor<T>::empty(shape);
      auto ddx = dev_empty<T>(shape);
      (log ? cd::log_softmax_backward_cpu<T> : cd::softmax_backward_cpu<T>)(g, hyd, -1, hdx);
      (log ? cd::log_softmax_backward_cuda<T> : cd::softmax_backward_cuda<T>)(g.to(cg::device::cuda(0)), dy, -1, ddx);
      check_gpu(ddx, hdx, log ? 1e-4 : 1e-6, 4 * tol<T>(), name + " backward");
    }
}

GPU_TEST_CASE("cuda.softmax.rows.f32") {
  for (layout l : {layout::contiguous, layout::misaligned}) run_softmax<float>(l);
}
GPU_TEST_CASE("cuda.softmax.rows.bf16") {
  for (layout l : {layout::contiguous, layout::misaligned}) run_softmax<cg::bf16>(l);
}
GPU_TEST_CASE("cuda.softmax.rows.f16") { run_softmax<cg::f16>(layout::contiguous); }
GPU_TEST_CASE("cuda.softmax.rows.f64") { run_softmax<double>(layout::contiguous); }

GPU_TEST_CASE("cuda.softmax.inner_dims_and_strided") {
  struct c3 {
    cg::shape_t shape;
    i64 dim;
  };
  std::uint64_t seed = 3000;
  for (const c3& c : std::vector<c3>{{{8, 50, 33}, 1}, {{40, 6, 7}, 0}, {{3, 4, 5}, 2}, {{}, 0}, {{5}, 0}, {{4, 0, 3}, 1}})
    for (layout l : {layout::contiguous, layout::strided})
      for (bool log : {false, true}) {
        const auto [h, d] = host_and_device<float>(c.shape, seed++, l, -5, 5);
        auto hy = cg::tensor<float>::empty(c.shape);
        auto dy = dev_empty<float>(c.shape);
        (log ? cd::log_softmax_cpu<float> : cd::softmax_cpu<float>)(h, c.dim, hy);
        (log ? cd::log_softmax_cuda<float> : cd::softmax_cuda<float>)(d, c.dim, dy);
        const std::string name = std::string(log ? "log_softmax " : "softmax ") + cg::shape_str(c.shape) + " dim " +
                                 std::to_string(c.dim) + " " + layout_name(l);
        check_gpu(dy, hy, 1e-6, 1e-5, name);
        const auto [hg, dg] = host_and_device<float>(c.shape, seed++, l);
        auto hdx = cg::tensor<float>::empty(c.shape);
        auto ddx = dev_empty<float>(c.shape);
        (log ? cd::log_softmax_backward_cpu<float> : cd::softmax_backward_cpu<float>)(hg, hy, c.dim, hdx);
        (log ? cd::log_softmax_backward_cuda<float> : cd::softmax_backward_cuda<float>)(dg, dy, c.dim, ddx);
        check_gpu(ddx, hdx, 1e-5, 1e-4, name + " backward");
      }
}

GPU_TEST_CASE("cuda.softmax.special_values_on_every_path") {
  // Row 0 all -inf, row 1 some -inf, row 2 a NaN, row 3 a +inf, row 4 huge values, on rows that
  // take the register path (n = 64), the looped vector path (n = 40000) and the looped element
  // path (n = 999), and along an inner dim (spatial kernel).
  for (i64 n : {i64{64}, i64{999}, i64{40000}})
    for (bool log : {false, true}) {
      auto h = rnd<float>({5, n}, 11, -3, 3);
      float* p = h.data();
      for (i64 k = 0; k < n; ++k) p[k] = -INFINITY;
      for (i64 k = 0; k < n; k += 2) p[n + k] = -INFINITY;
      p[2 * n + n / 2] = NAN;
      p[3 * n + n - 1] = INFINITY;
      for (i64 k = 0; k < n; ++k) p[4 * n + k] += 1e4f;
      auto hy = cg::tensor<float>::empty({5, n});
      auto dy = dev_empty<float>({5, n});
      (log ? cd::log_softmax_cpu<float> : cd::softmax_cpu<float>)(h, 1, hy);
      (log ? cd::log_softmax_cuda<float> : cd::softmax_cuda<float>)(h.to(cg::device::cuda(0)), 1, dy);
      check_gpu(dy, hy, 1e-6, 1e-4, std::string(log ? "log_softmax" : "softmax") + " special rows, n = " + std::to_string(n));
      // The same rows along dim 0 (strided by 5 x ... no: transposed so the dim is inner).
      const auto ht = h.transpose(0, 1).contiguous();  // [n, 5]: softmax along dim 0, inner 5
      auto hty = cg::tensor<float>::empty({n, 5});
      auto dty = dev_empty<float>({n, 5});
      (log ? cd::log_softmax_cpu<float> : cd::softmax_cpu<float>)(ht, 0, hty);
      (log ? cd::log_softmax_cuda<float> : cd::softmax_cuda<float>)(ht.to(cg::device::cuda(0)), 0, dty);
      check_gpu(dty, hty, 1e-6, 1e-4, std::string(log ? "log_softmax" : "softmax") + " special columns, n = " + std::to_string(n));
    }
}

/// layer_norm / rms_norm forward and backward on GPU vs CPU for one row case.
template <class T>
void run_norm(const row_case& c, bool rms, int affine, layout l, std::uint64_t seed) {
  const cg::shape_t shape{c.rows, c.n};
  const cg::shape_t ns{c.n};
  const auto [h, d] = host_and_device<T>(shape, seed, l, -3, 5);
  const std::optional<cg::tensor<T>> hw = affine & 1 ? std::optional(rnd<T>(ns, seed + 1)) : std::nullopt;
  const std::optional<cg::tensor<T>> hb = affine & 2 ? std::optional(rnd<T>(ns, seed + 2)) : std::nullopt;
  const std::optional<cg::tensor<T>> dw = hw ? std::optional(hw->to(cg::device::cuda(0))) : std::nullopt;
  const std::optional<cg::tensor<T>> db = hb ? std::optional(hb->to(cg::device::cuda(0))) : std::nullopt;
  using S = cd::norm_stat_t<T>;
  const cg::shape_t ss{c.rows, 1};
  auto hy = cg::tensor<T>::empty(shape);
  auto dy = dev_empty<T>(shape);
  auto hm = cg::tensor<S>::empty(ss), hr = cg::tensor<S>::empty(ss);
  auto dm = dev_empty<S>(ss), dr = dev_empty<S>(ss);
  const std::string name = std::string(rms ? "rms_norm " : "layer_norm ") + type_name<T>() + " " + cg::shape_str(shape) +
                           " affine " + std::to_string(affine) + " " + layout_name(l);
  // The forward is checked against the f64 kernel on the same values (exact to ~1e-15), not the
  // T kernel: for bf16 / f16 the CPU kernel sums a row sequentially in float (PyTorch's
  // accumulation type), and on [1, 70000] its rstd is 2.1e-5 off (the GPU's per-thread Welford:
  // 4e-8). y = (x - mean) * rstd * w + b cancels terms of magnitude up to ~4 into results ~1e-4,
  // where that CPU error (4e-5) exceeded the tolerance. Against the exact result atol 2e-5 stays
  // ~5e-6 of the terms' magnitude: a real error in mean, rstd or the affine step fails it.
  const std::optional<cg::tensor<double>> rw = hw ? std::optional(hw->template to<double>()) : std::nullopt;
  const std::optional<cg::tensor<double>> rb = hb ? std::optional(hb->template to<double>()) : std::nullopt;
  const auto hx = h.template to<double>();
  auto ry = cg::tensor<double>::empty(shape);
  auto rm = cg::tensor<double>::empty(ss), rr = cg::tensor<double>::empty(ss);
  if (rms) {
    const double eps = cd::rms_norm_default_eps(cg::dtype_v<T>);
    cd::rms_norm_cpu(h, ns, hw, std::nullopt, hy, &hr);
    cd::rms_norm_cpu(hx, ns, rw, eps, ry, &rr);
    cd::rms_norm_cuda(d, ns, dw, std::nullopt, dy, &dr);
  } else {
    cd::layer_norm_cpu(h, ns, hw, hb, 1e-5, hy, &hm, &hr);
    cd::layer_norm_cpu(hx, ns, rw, rb, 1e-5, ry, &rm, &rr);
    cd::layer_norm_cuda(d, ns, dw, db, 1e-5, dy, &dm, &dr);
    check_gpu(dm, rm, 1e-5, 1e-5, name + " mean");
  }
  check_gpu(dr, rr, 1e-6, 1e-4, name + " rstd");
  check_gpu(dy, ry, 2e-5, 2 * tol<T>(), name);
  // Backward, every gradient asked for.
  const auto g = rnd<T>(shape, seed + 3);
  const auto dg = g.to(cg::device::cuda(0));
  auto hdx = cg::tensor<T>::empty(shape);
  auto ddx = dev_empty<T>(shape);
  auto hdw = cg::tensor<T>::empty(ns), hdb = cg::tensor<T>::empty(ns);
  auto ddw = dev_empty<T>(ns), ddb = dev_empty<T>(ns);
  if (rms) {
    cd::rms_norm_backward_cpu(g, h, ns, hr, hw, &hdx, hw ? &hdw : nullptr);
    cd::rms_norm_backward_cuda(dg, d, ns, dr, dw, &ddx, dw ? &ddw : nullptr);
  } else {
    cd::layer_norm_backward_cpu(g, h, ns, hm, hr, hw, &hdx, hw ? &hdw : nullptr, hb ? &hdb : nullptr);
    cd::layer_norm_backward_cuda(dg, d, ns, dm, dr, dw, &ddx, dw ? &ddw : nullptr, db ? &ddb : nullptr);
  }
  check_gpu(ddx, hdx, 1e-4, 4 * tol<T>(), name + " backward dx");
  const double rows = static_cast<double>(c.rows);
  if (hw) check_gpu(ddw, hdw, 1e-4 * rows, 4 * tol<T>(), name + " backward dweight");
  if (hb) check_gpu(ddb, hdb, 1e-4 * rows, 4 * tol<T>(), name + " backward dbias");
  // Parameter gradients only (no dx): the same values.
  if (hw) {
    auto ddw2 = dev_empty<T>(ns);
    if (rms)
      cd::rms_norm_backward_cuda(dg, d, ns, dr, dw, nullptr, &ddw2);
    else
      cd::layer_norm_backward_cuda(dg, d, ns, dm, dr, dw, nullptr, &ddw2, nullptr);
    check_gpu(ddw2, hdw, 1e-4 * rows, 4 * tol<T>(), name + " backward dweight without dx");
  }
}

template <class T>
void run_norms(layout l) {
  std::uint64_t seed = 4000;
  for (const row_case& c : row_cases())
    for (bool rms : {false, true})
      for (int affine : {0, 1, 3}) {
        if (rms && affine == 3) continue;
        run_norm<T>(c, rms, affine, l, seed);
        seed += 4;
      }
}

GPU_TEST_CASE("cuda.layer_norm.rms_norm.f32") {
  for (layout l : {layout::contiguous, layout::misaligned}) run_norms<float>(l);
}
GPU_TEST_CASE("cuda.layer_norm.rms_norm.bf16") {
  for (layout l : {layout::contiguous, layout::strided}) run_norms<cg::bf16>(l);
}
GPU_TEST_CASE("cuda.layer_norm.rms_norm.f16") { run_norms<cg::f16>(layout::contiguous); }
GPU_TEST_CASE("cuda.layer_norm.rms_norm.f64") { run_norms<double>(layout::contiguous); }

GPU_TEST_CASE("cuda.layer_norm.many_rows_and_multi_dim_shape") {
  // Many short rows: parameter gradients summed over many blocks, several rows per block.
  std::uint64_t seed = 5000;
  for (const row_case& c : std::vector<row_case>{{20000, 16}, {4096, 128}, {1000, 768}})
    for (bool rms : {false, true}) run_norm<float>(c, rms, rms ? 1 : 3, layout::contiguous, seed += 4);
  // normalized_shape of two dims.
  const auto [h, d] = host_and_device<float>({3, 4, 6, 8}, 77, layout::strided);
  const auto w = rnd<float>({6, 8}, 78), b = rnd<float>({6, 8}, 79);
  auto hy = cg::tensor<float>::empty({3, 4, 6, 8});
  auto dy = dev_empty<float>({3, 4, 6, 8});
  cd::layer_norm_cpu(h, {6, 8}, w, b, 1e-5, hy);
  cd::layer_norm_cuda(d, {6, 8}, w.to(cg::device::cuda(0)), b.to(cg::device::cuda(0)), 1e-5, dy);
  check_gpu(dy, hy, 1e-5, 1e-5, "layer_norm over [6, 8]");
}

GPU_TEST_CASE("cuda.layer_norm.no_rows") {
  auto dw = dev_empty<float>({4});
  auto db = dev_empty<float>({4});
  dw.fill_(5.0f);
  db.fill_(5.0f);
  const auto x = dev_empty<float>({0, 4});
  cd::layer_norm_backward_cuda(x, x, {4}, dev_empty<float>({0, 1}), dev_empty<float>({0, 1}),
                               rnd<float>({4}, 1).to(cg::device::cuda(0)), nullptr, &dw, &db);
  CHECK(dw.cpu().to_vector() == std::vector<float>(4, 0.0f));
  CHECK(db.cpu().to_vector() == std::vector<float>(4, 0.0f));
}

}  // namespace gpu_normalization_tests
}  // namespace gpu_test_normalization
