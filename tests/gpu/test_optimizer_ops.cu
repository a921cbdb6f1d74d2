// fused_adamw's CUDA kernel (ccgraph/cuda/optimizer.cuh) against its CPU loop
// (ccgraph/ops/optimizer_ops.hpp) on the same inputs: f64, f32, bf16 and f16; lengths that
// leave no tail, a tail, and fewer elements than one 16-byte pack; contiguous operands (the
// vector path), operands starting one element into their allocation (the element path) and
// strided ones (read through contiguous copies, written back through the strides); functional
// (new outputs) and in place (the outputs are the inputs). The two may differ where nvcc
// contracts a multiply and an add into one rounding: by a few ulps of the operands (all within
// [-1, 1] here), which for an exp_avg that cancels to near zero is far more than a few ulps of
// the result, hence an absolute part of the tolerance. Skipped without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"
#include "reduction_gpu_support.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_optimizer_ops {

namespace cg = ccgraph;
namespace cd = ccgraph::detail;
using namespace ccgraph_test::red;

template <class E>
void check_fused_adamw() {
  using C = cg::compute_t<E>;
  // beta1 0.9 and 0.3: torch.lerp's two formulas.
  for (const double beta1 : {0.9, 0.3}) {
    const cg::ops::fused_adamw o{beta1, 0.999, 1e-8, 1 - 1e-3 * 0.1};
    std::uint64_t seed = 500;
    for (const i64 n : {i64{3}, i64{64}, i64{1000}, i64{4099}, i64{100003}})
      for (const layout l : {layout::contiguous, layout::misaligned, layout::strided})
        for (const bool in_place : {false, true}) {
          const cg::shape_t shape = l == layout::strided && n % 2 == 0 ? cg::shape_t{2, n / 2} : cg::shape_t{n};
          auto [hp, dp] = host_and_device<E>(shape, seed++, l, -1, 1);
          auto [hg, dg] = host_and_device<E>(shape, seed++, l, -0.5, 0.5);
          auto [hm, dm] = host_and_device<E>(shape, seed++, l, -0.1, 0.1);
          auto [hv, dv] = host_and_device<E>(shape, seed++, l, 0, 0.05);
          const auto hs = cg::full<C>({}, C(1e-3 / (1 - beta1 * beta1))), hb = cg::full<C>({}, C(0.0447));
          const auto ds = hs.to(cg::device::cuda(0)), db = hb.to(cg::device::cuda(0));
          const std::string name = std::string("fused_adamw ") + type_name<E>() + " " + cg::shape_str(shape) + " " +
                                   layout_name(l) + (in_place ? " in place" : "") + " beta1 " + std::to_string(beta1);
          INFO(name);
          // The CPU on its own copies: the expected values.
          const auto wp = cg::tensor<E>::empty(shape), wm = cg::tensor<E>::empty(shape), wv = cg::tensor<E>::empty(shape);
          cd::fused_adamw_cpu<E>(o, hp, hg, hm, hv, hs, hb, wp, wm, wv);
          // 8 ulps of E, relative to the result and absolute (the operands' scale is 1)
          const double t = 8 * (std::is_same_v<E, cg::bf16> ? 0x1p-7 : std::is_same_v<E, cg::f16> ? 0x1p-10
                                                                                                  : double(std::numeric_limits<E>::epsilon()));
          if (in_place) {
            cd::fused_adamw_cuda<E>(o, dp, dg, dm, dv, ds, db, dp, dm, dv);
            check_gpu(dp, wp, t, t, name + " param");
            check_gpu(dm, wm, t, t, name + " exp_avg");
            check_gpu(dv, wv, t, t, name + " exp_avg_sq");
          } else {
            const auto before = values(dp.cpu());
            auto op = dev_empty<E>(shape), om = dev_empty<E>(shape), ov = dev_empty<E>(shape);
            cd::fused_adamw_cuda<E>(o, dp, dg, dm, dv, ds, db, op, om, ov);
            check_gpu(op, wp, t, t, name + " param");
            check_gpu(om, wm, t, t, name + " exp_avg");
            check_gpu(ov, wv, t, t, name + " exp_avg_sq");
            CHECK(values(dp.cpu()) == before);  // the inputs are not written
          }
        }
  }
}

GPU_TEST_CASE("cuda.fused_adamw.f64") { check_fused_adamw<double>(); }
GPU_TEST_CASE("cuda.fused_adamw.f32") { check_fused_adamw<float>(); }
GPU_TEST_CASE("cuda.fused_adamw.bf16") { check_fused_adamw<cg::bf16>(); }
GPU_TEST_CASE("cuda.fused_adamw.f16") { check_fused_adamw<cg::f16>(); }

}  // namespace gpu_test_optimizer_ops
