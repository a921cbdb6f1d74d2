// ccgraph/cuda/element.cuh: reading and writing ccgraph's element types in device code with the
// hardware conversions (bf16 and f16 through their bits and the cuda_bf16/cuda_fp16
// intrinsics), for the op kernels (index.cuh, attention.cuh, linear.cuh).
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/element.cuh> is device code: compile this translation unit with nvcc"
#endif

#include <ccgraph/core/half.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace ccgraph::cuda::detail {

/// Loads one element of T as A (bool as 0/1).
template <class A, class T>
__device__ __forceinline__ A device_load(const T* p) {
  if constexpr (std::is_same_v<T, ::ccgraph::bf16>)
    return static_cast<A>(__uint_as_float(static_cast<unsigned>(p->bits) << 16));
  else if constexpr (std::is_same_v<T, ::ccgraph::f16>)
    return static_cast<A>(__half2float(__ushort_as_half(p->bits)));
  else if constexpr (std::is_same_v<T, bool>)
    return *p ? A(1) : A(0);
  else
    return static_cast<A>(*p);
}

/// Converts an A to T, rounding to nearest even for bf16/f16 (bool: "not zero").
template <class T, class A>
__device__ __forceinline__ T device_value(A v) {
  if constexpr (std::is_same_v<T, ::ccgraph::bf16>) {
    T r;
    r.bits = __bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(v)));
    return r;
  } else if constexpr (std::is_same_v<T, ::ccgraph::f16>) {
    T r;
    r.bits = __half_as_ushort(__float2half_rn(static_cast<float>(v)));
    return r;
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != A(0);
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace ccgraph::cuda::detail
