// ccgraph/cuda/peer_reduce.cuh: the kernel of the copy-engine all_reduce and reduce_scatter
// (peer_channel.hpp), `out = src0 (op) src1 (op) ...` element by element. It installs its
// launcher in peer_reduce_slot() when the program starts; <ccgraph/cuda.hpp> includes it under
// nvcc.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/peer_reduce.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/peer_channel.hpp>
#include <ccgraph/cuda/pointwise.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ccgraph::cuda::detail {

/// One element of T as float, and back (rounded to nearest even).
template <class T>
__device__ inline float peer_load(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return v;
}
template <class T>
__device__ inline T peer_store(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return v;
}

template <reduce_kind Op>
__device__ inline float peer_apply(float a, float b) {
  if constexpr (Op == reduce_kind::sum || Op == reduce_kind::avg) return a + b;
  else if constexpr (Op == reduce_kind::product) return a * b;
  else if constexpr (Op == reduce_kind::min) return fminf(a, b);
  else return fmaxf(a, b);
}

/// The sources of peer_reduce_kernel, typed.
template <class T>
struct peer_reduce_args {
  const T* src[peer_channel_max_ranks];
  int count;
};

/// src[0] (op) src[1] (op) ... at one element (`v`: the count's first values), in f32, rounded
/// once; avg divides the sum by the count (for two ranks (a + b) / 2, what NCCL gives). Loops
/// run to the most ranks with the count as a guard, so that `v` stays in registers.
template <class T, reduce_kind Op>
__device__ inline T peer_combine(int count, const T* v) {
  float acc = peer_load(v[0]);
#pragma unroll
  for (int q = 1; q < peer_channel_max_ranks; ++q)
    if (q < count) acc = peer_apply<Op>(acc, peer_load(v[q]));
  if constexpr (Op == reduce_kind::avg) acc = acc / static_cast<float>(count);
  return peer_store<T>(acc);
}

/// out = src[0] (op) src[1] (op) ... over n elements; `vec` when every pointer is 16-byte
/// aligned: then each thread moves 16 bytes per operand at a time (the tail is done element by
/// element). An output that is one of the sources is fine: each element is read before it is
/// written, by the same thread.
template <class T, reduce_kind Op>
__global__ void peer_reduce_kernel(peer_reduce_args<T> a, T* out, std::size_t n, bool vec) {
  constexpr std::size_t per = 16 / sizeof(T);
  constexpr int most = peer_channel_max_ranks;
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  const std::size_t tid = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if (vec) {
    const std::size_t groups = n / per;
    for (std::size_t g = tid; g < groups; g += stride) {
      uint4 v[most];
#pragma unroll
      for (int q = 0; q < most; ++q)
        if (q < a.count) v[q] = reinterpret_cast<const uint4*>(a.src[q])[g];
      uint4 r;
      T* er = reinterpret_cast<T*>(&r);
#pragma unroll
      for (std::size_t k = 0; k < per; ++k) {
        T e[most];
#pragma unroll
        for (int q = 0; q < most; ++q)
          if (q < a.count) e[q] = reinterpret_cast<const T*>(&v[q])[k];
        er[k] = peer_combine<T, Op>(a.count, e);
      }
      reinterpret_cast<uint4*>(out)[g] = r;
    }
    done = groups * per;
  }
  for (std::size_t i = done + tid; i < n; i += stride) {
    T e[most];
#pragma unroll
    for (int q = 0; q < most; ++q)
      if (q < a.count) e[q] = a.src[q][i];
    out[i] = peer_combine<T, Op>(a.count, e);
  }
}

template <class T>
inline void launch_peer_reduce_typed(const peer_reduce_sources& src, void* out, std::size_t n, reduce_op op,
                                     cudaStream_t s) {
  CCGRAPH_CHECK(src.count >= 1 && src.count <= peer_channel_max_ranks, "copy-engine reduction: ", src.count,
                " sources, but the kernel takes 1 to ", peer_channel_max_ranks);
  peer_reduce_args<T> a{};
  a.count = src.count;
  bool vec = ::ccgraph::detail::aligned16(out);
  for (int q = 0; q < src.count; ++q) {
    a.src[q] = static_cast<const T*>(src.ptr[q]);
    vec = vec && ::ccgraph::detail::aligned16(src.ptr[q]);
  }
  // A few blocks per SM: it is memory-bound, and it should leave SMs free quickly.
  const int grid = pointwise_sm_count() * 4;
  auto* z = static_cast<T*>(out);
  // No premul_sum: peer_reduce_supports refuses it, so it goes to NCCL.
  switch (op.kind()) {
    case reduce_kind::sum: peer_reduce_kernel<T, reduce_kind::sum><<<grid, 256, 0, s>>>(a, z, n, vec); break;
    case reduce_kind::avg: peer_reduce_kernel<T, reduce_kind::avg><<<grid, 256, 0, s>>>(a, z, n, vec); break;
    case reduce_kind::product: peer_reduce_kernel<T, reduce_kind::product><<<grid, 256, 0, s>>>(a, z, n, vec); break;
    case reduce_kind::min: peer_reduce_kernel<T, reduce_kind::min><<<grid, 256, 0, s>>>(a, z, n, vec); break;
    case reduce_kind::max: peer_reduce_kernel<T, reduce_kind::max><<<grid, 256, 0, s>>>(a, z, n, vec); break;
    default: CCGRAPH_THROW(::ccgraph::error, "copy-engine reduction: reduce op ", op, " has no kernel");
  }
  CCGRAPH_CHECK_CUDA(cudaGetLastError());
}

/// The peer_reduce_fn this header installs.
inline void launch_peer_reduce(const peer_reduce_sources& src, void* out, std::size_t n, dtype dt, reduce_op op,
                               cudaStream_t s) {
  switch (dt) {
    case dtype::f32: return launch_peer_reduce_typed<float>(src, out, n, op, s);
    case dtype::bf16: return launch_peer_reduce_typed<__nv_bfloat16>(src, out, n, op, s);
    case dtype::f16: return launch_peer_reduce_typed<__half>(src, out, n, op, s);
    default: CCGRAPH_THROW(::ccgraph::error, "copy-engine reduction: dtype ", dt, " has no kernel");
  }
}

/// Installs launch_peer_reduce when the program starts (once, whichever translation unit).
inline const bool peer_reduce_installed = (peer_reduce_slot() = &launch_peer_reduce, true);

}  // namespace ccgraph::cuda::detail
