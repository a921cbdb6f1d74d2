// ccgraph/cuda/optimizer.cuh: the CUDA kernel of ccgraph/ops/optimizer_ops.hpp's fused_adamw.
// One pass over the parameter: each thread loads 16 bytes of param, grad, exp_avg and
// exp_avg_sq (16-byte vectors when every pointer allows), applies adamw_element, the update the
// CPU loop runs, and stores 16 bytes of each result. The outputs may be the inputs themselves
// (an in-place step): a thread reads its elements before it writes them, and no other thread
// touches them. Results may differ from the CPU's in the last bit where nvcc contracts a
// multiply and an add into one fused multiply-add (as PyTorch's CUDA kernels do).
//
// Compile with nvcc: <ccgraph/cuda.hpp> includes this header only under nvcc.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/optimizer.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/pointwise.cuh>  // pointwise_grid, pointwise_vec, check_pointwise_launch
#include <ccgraph/ops/optimizer_ops.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace ccgraph::cuda::detail {

/// fused_adamw over n contiguous elements (see the top of this file); `vec`: every operand is
/// 16-byte aligned, so full packs move as vectors.
template <class E, class C>
__global__ void __launch_bounds__(pointwise_block_threads)
    fused_adamw_kernel(const E* p, const E* g, const E* m, const E* v, const C* step_size, const C* bias_sqrt2, E* p_out,
                       E* m_out, E* v_out, const std::int64_t n, const ::ccgraph::detail::adamw_constants<C> k,
                       const bool vec) {
  constexpr int V = pointwise_vec<E>;
  using P = ::ccgraph::detail::elem_pack<E, V>;  // 16 bytes, stored as one vector
  const C s = *step_size, b = *bias_sqrt2;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x * V;
  for (std::int64_t base = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; base < n;
       base += step) {
    if (vec && base + V <= n) {
      P pp = ::ccgraph::detail::load_pack_at<V, true>(p + base);
      const P gg = ::ccgraph::detail::load_pack_at<V, true>(g + base);
      P mm = ::ccgraph::detail::load_pack_at<V, true>(m + base);
      P vv = ::ccgraph::detail::load_pack_at<V, true>(v + base);
#pragma unroll
      for (int j = 0; j < V; ++j) ::ccgraph::detail::adamw_element<E, C>(pp.v[j], gg.v[j], mm.v[j], vv.v[j], s, b, k);
      *reinterpret_cast<P*>(p_out + base) = pp;
      *reinterpret_cast<P*>(m_out + base) = mm;
      *reinterpret_cast<P*>(v_out + base) = vv;
    } else {
      const std::int64_t end = base + V < n ? base + V : n;
      for (std::int64_t i = base; i < end; ++i) {
        E pe = p[i], me = m[i], ve = v[i];
        ::ccgraph::detail::adamw_element<E, C>(pe, g[i], me, ve, s, b, k);
        p_out[i] = pe, m_out[i] = me, v_out[i] = ve;
      }
    }
  }
}

}  // namespace ccgraph::cuda::detail

namespace ccgraph {
namespace detail {

/// fused_adamw on a CUDA device, queued on the calling thread's current stream; same contract
/// as fused_adamw_cpu.
template <class E>
void fused_adamw_cuda(const ops::fused_adamw& o, const tensor<E>& p, const tensor<E>& g, const tensor<E>& m,
                      const tensor<E>& v, const tensor<compute_t<E>>& step_size, const tensor<compute_t<E>>& bias_sqrt2,
                      const tensor<E>& p_out, const tensor<E>& m_out, const tensor<E>& v_out) {
  namespace cd = ::ccgraph::cuda::detail;
  using C = compute_t<E>;
  const adamw_constants<C> k = adamw_constants_of<C>(o);
  fused_adamw_dense(p, g, m, v, step_size, bias_sqrt2, p_out, m_out, v_out,
                    [&](const E* pp, const E* gp, const E* mp, const E* vp, const C* ss, const C* bs, E* po, E* mo,
                        E* vo, std::int64_t n) {
                      if (n == 0) return;
                      using ::ccgraph::detail::aligned16;
                      const bool vec = aligned16(pp) && aligned16(gp) && aligned16(mp) && aligned16(vp) &&
                                       aligned16(po) && aligned16(mo) && aligned16(vo);
                      const unsigned blocks = cd::pointwise_grid(
                          n, static_cast<std::int64_t>(cd::pointwise_block_threads) * cd::pointwise_vec<E>);
                      cd::fused_adamw_kernel<E, C><<<blocks, cd::pointwise_block_threads, 0,
                                                     ::ccgraph::cuda::current_stream()>>>(pp, gp, mp, vp, ss, bs, po,
                                                                                          mo, vo, n, k, vec);
                      cd::check_pointwise_launch(__FILE__, __LINE__);
                    });
}

}  // namespace detail

template <>
struct cuda_impl<ops::fused_adamw> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::fused_adamw& o, const Args& a) {
    return op_traits<ops::fused_adamw>::run_with(o, a, [](const auto&... xs) { detail::fused_adamw_cuda(xs...); });
  }
};

}  // namespace ccgraph
