// ccgraph/cuda/normalization.cuh: the fused CUDA kernels of softmax, log_softmax, layer_norm and
// rms_norm and of their backward (semantics and CPU kernels: <ccgraph/ops/normalization.hpp>).
//
// Rows along the last dim (the common case) run one kernel each, a group of `tpr` threads per
// row (a power of two: part of a warp for short rows, up to 1024 threads for long ones):
//   - register path: the row is read once with 16-byte loads into registers (VPT packs per
//     thread, VPT in {1, 2, 4}), reduced through shuffles (and shared memory past a warp), and
//     written once: one pass over HBM. Taken when the row length is a multiple of the pack and
//     fits (up to 4 packs per thread of 1024 threads: 16K f32 / 32K bf16 elements forward, half
//     that for the backward kernels, which hold two rows);
//   - looped path: any other row; the group walks the row twice (statistics, then output), the
//     second pass mostly from L2. softmax's first pass is an online max / sum of exponentials.
// softmax along an inner dim (elements strided by `inner`) runs a kernel where each thread owns
// one (outer, inner) position: threads of a warp read consecutive positions (coalesced).
// Statistics accumulate in float (double for f64); 16-bit outputs round once.
//
// layer_norm / rms_norm backward compute dx in the same pass as each thread's share of the
// weight and bias gradients (the columns a thread owns are the same in every row); per-block
// partial sums go to a workspace that the column reduction of <ccgraph/cuda/reduction.cuh> sums
// (deterministic: no atomics).
//
// Every kernel runs on the calling thread's current stream and returns without waiting.
// Compile with nvcc: this header defines __global__ functions.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/normalization.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/reduction.cuh>
#include <ccgraph/ops/normalization.hpp>
#include <ccgraph/ops/normalization_ops.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace ccgraph::cuda::detail {

/// exp / log / 1/sqrt in the accumulation type (float or double), full precision.
template <class A>
__device__ __forceinline__ A dev_exp(A v) {
  if constexpr (std::is_same_v<A, double>) return ::exp(v); else return ::expf(v);
}
template <class A>
__device__ __forceinline__ A dev_log(A v) {
  if constexpr (std::is_same_v<A, double>) return ::log(v); else return ::logf(v);
}
template <class A>
__device__ __forceinline__ A dev_rsqrt(A v) {
  if constexpr (std::is_same_v<A, double>) return 1.0 / ::sqrt(v); else return ::rsqrtf(v);
}

/// The larger of two values, NaN propagating (the softmax's row max, as PyTorch's CPU): one
/// max.NaN instruction for float from sm_80.
template <class A>
__device__ __forceinline__ A max_nan(A a, A b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<A, float>) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
  }
#endif
  return ::ccgraph::detail::beats<true>(b, a) ? b : a;
}

/// A running log-sum-exp: m the max so far (-inf: no element that counts yet), s the sum of
/// exp(x - m). An element of -inf adds exp(-inf - m) = 0 and is skipped; a NaN or +inf element
/// turns the sum into NaN, as computing max first and then the sum would.
template <class A>
struct lse_state {
  A m, s;
};
template <class A>
__device__ __forceinline__ lse_state<A> lse_init() {
  return {-std::numeric_limits<A>::infinity(), A(0)};
}
template <class A>
__device__ __forceinline__ void lse_add(lse_state<A>& st, A v) {
  if (v == -std::numeric_limits<A>::infinity()) return;
  if (v > st.m) {  // a new max (rare after the first elements): rescale the sum
    // s * exp(-inf) = 0 for the first element; exp(v - v) is NaN for v = +inf (inf - inf).
    st.s = st.s * dev_exp(st.m - v) + dev_exp(v - v);
    st.m = v;
  } else {
    st.s += dev_exp(v - st.m);  // a NaN v (or v = m = +inf) makes the sum NaN
  }
}
template <class A>
__device__ __forceinline__ lse_state<A> lse_merge(const lse_state<A>& a, const lse_state<A>& b) {
  if (a.m == -std::numeric_limits<A>::infinity()) return b;
  if (b.m == -std::numeric_limits<A>::infinity()) return a;
  const A m = max_nan(a.m, b.m);
  return {m, a.s * dev_exp(a.m - m) + b.s * dev_exp(b.m - m)};
}
/// log(sum(exp(x))) of a row: NaN when no element counted (every element -inf), as the
/// max-first formula gives (exp(-inf - -inf) = NaN).
template <class A>
__device__ __forceinline__ A lse_value(const lse_state<A>& st) {
  return st.m == -std::numeric_limits<A>::infinity() ? std::numeric_limits<A>::quiet_NaN() : st.m + dev_log(st.s);
}

/// Two sums all-reduced together.
template <class A>
struct sum2 {
  A a, b;
};

/// How a row-wise op is launched: `tpr` threads per row, `vpt` packs per thread (register path),
/// `threads` per block, `blocks` in the grid.
struct row_launch {
  int tpr = 1, vpt = 1, threads = 256;
  std::int64_t blocks = 1;
  bool regs = false;  // the register path fits
  int vec = 1;        // elements per load of the looped path
};

/// The launch of a row-wise op over `rows` contiguous rows of `n` elements, `vec` to a pack;
/// `aligned`: every pointer the kernel reads or writes rows through is 16-byte aligned. Register
/// path: up to `max_vpt` packs and `max_elems` elements per thread, `max_tpr` threads per row.
inline row_launch pick_row_launch(std::int64_t rows, std::int64_t n, int vec, bool aligned, int max_vpt,
                                  int max_elems, int max_tpr) {
  row_launch L;
  if (aligned && n % vec == 0 && n > 0) {
    const std::int64_t nv = n / vec;
    std::int64_t tpr = std::clamp<std::int64_t>(next_pow2((nv + 3) / 4), 1, max_tpr);
    std::int64_t vpt = next_pow2((nv + tpr - 1) / tpr);
    while (vpt * vec > max_elems && tpr < max_tpr) {
      tpr *= 2;
      vpt = next_pow2((nv + tpr - 1) / tpr);
    }
    if (vpt <= max_vpt && vpt * vec <= max_elems) {
      L.regs = true;
      L.tpr = static_cast<int>(tpr);
      L.vpt = static_cast<int>(vpt);
    }
  }
  if (!L.regs) {
    L.vec = aligned && n % vec == 0 ? vec : 1;
    const std::int64_t nv = (n + L.vec - 1) / L.vec;
    L.tpr = static_cast<int>(std::clamp<std::int64_t>(next_pow2((nv + 7) / 8), 1, 512));
  }
  L.threads = std::max(L.tpr, 256);
  const std::int64_t groups = L.threads / L.tpr;
  L.blocks = std::max<std::int64_t>(1, std::min<std::int64_t>((rows + groups - 1) / groups, std::int64_t{1} << 30));
  return L;
}

/// True when `p` is aligned to 16 bytes (or null).
template <class T>
bool aligned16(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

/// The per-thread view of a row in a group: pack k of lane `lane` holds columns
/// (k * tpr + lane) * VEC ... + VEC - 1.
#define CCGRAPH_ROW_PROLOGUE                                                         \
  const int tpr = tpr_;                                                              \
  const int lane = static_cast<int>(threadIdx.x) % tpr;                              \
  const int group = static_cast<int>(threadIdx.x) / tpr;                             \
  const int groups = static_cast<int>(blockDim.x) / tpr

// ---- softmax / log_softmax ------------------------------------------------------------------

template <class T, int VPT, bool Log>
__global__ void __launch_bounds__(1024) softmax_rows_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                             std::int64_t rows, std::int64_t n, int tpr_) {
  constexpr int VEC = vec_elems<T>;
  using A = gpu_acc_t<T>;
  __shared__ A smem[32];
  CCGRAPH_ROW_PROLOGUE;
  const int ni = static_cast<int>(n);  // the register path holds rows far below 2^31
  for (std::int64_t rb = static_cast<std::int64_t>(blockIdx.x) * groups; rb < rows;
       rb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t row = rb + group;
    const bool valid = row < rows;
    vpack<T, VEC> v[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (valid && c < ni) v[k] = load_pack<VEC>(x + row * n + c);
    }
    A m = -std::numeric_limits<A>::infinity();
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (valid && (k * tpr + lane) * VEC < ni)
#pragma unroll
        for (int j = 0; j < VEC; ++j) m = max_nan(m, static_cast<A>(to_acc(v[k].v[j])));
    m = group_allreduce(m, tpr, [](A a, A b) { return max_nan(a, b); }, smem);
    A s = 0;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (valid && (k * tpr + lane) * VEC < ni)
#pragma unroll
        for (int j = 0; j < VEC; ++j) s += dev_exp(static_cast<A>(to_acc(v[k].v[j])) - m);
    s = group_allreduce(s, tpr, [](A a, A b) { return a + b; }, smem);
    const A ls = Log ? dev_log(s) : A(0);
    const A inv = A(1) / s;  // one division per row, a multiply per element
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (!valid || c >= ni) continue;
      vpack<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A e = static_cast<A>(to_acc(v[k].v[j])) - m;
        o.v[j] = from_acc<T>(Log ? e - ls : dev_exp(e) * inv);
      }
      store_pack<VEC>(y + row * n + c, o);
    }
  }
}

template <class T, int VEC, bool Log>
__global__ void __launch_bounds__(512) softmax_rows_looped_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                    std::int64_t rows, std::int64_t n, int tpr_) {
  using A = gpu_acc_t<T>;
  __shared__ lse_state<A> smem[32];
  CCGRAPH_ROW_PROLOGUE;
  const std::int64_t step = static_cast<std::int64_t>(tpr) * VEC;
  for (std::int64_t rb = static_cast<std::int64_t>(blockIdx.x) * groups; rb < rows;
       rb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t row = rb + group;
    const bool valid = row < rows;
    const T* xr = x + row * n;
    lse_state<A> st = lse_init<A>();
    if (valid)
      for (std::int64_t c = static_cast<std::int64_t>(lane) * VEC; c < n; c += step) {
        const vpack<T, VEC> v = load_pack<VEC>(xr + c);
#pragma unroll
        for (int j = 0; j < VEC; ++j) lse_add(st, static_cast<A>(to_acc(v.v[j])));
      }
    st = group_allreduce(st, tpr, [](const lse_state<A>& a, const lse_state<A>& b) { return lse_merge(a, b); }, smem);
    if (!valid) continue;
    const A ls = dev_log(st.s);
    const A inv = A(1) / st.s;
    for (std::int64_t c = static_cast<std::int64_t>(lane) * VEC; c < n; c += step) {
      const vpack<T, VEC> v = load_pack<VEC>(xr + c);
      vpack<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A e = static_cast<A>(to_acc(v.v[j])) - st.m;
        o.v[j] = from_acc<T>(Log ? e - ls : dev_exp(e) * inv);
      }
      store_pack<VEC>(y + row * n + c, o);
    }
  }
}

/// softmax along a dim with `inner` > 1 trailing elements: one thread per (outer, inner) position.
template <class T, bool Log>
__global__ void __launch_bounds__(256) softmax_spatial_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                               std::int64_t outer, std::int64_t n, std::int64_t inner) {
  using A = gpu_acc_t<T>;
  const std::int64_t positions = outer * inner;
  for (std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < positions;
       p += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t o = p / inner, i = p - o * inner;
    const T* xr = x + o * n * inner + i;
    T* yr = y + o * n * inner + i;
    lse_state<A> st = lse_init<A>();
    for (std::int64_t k = 0; k < n; ++k) lse_add(st, static_cast<A>(to_acc(xr[k * inner])));
    const A ls = dev_log(st.s);
    const A inv = A(1) / st.s;
    for (std::int64_t k = 0; k < n; ++k) {
      const A e = static_cast<A>(to_acc(xr[k * inner])) - st.m;
      yr[k * inner] = from_acc<T>(Log ? e - ls : dev_exp(e) * inv);
    }
  }
}

template <class T, int VPT, bool Log>
__global__ void __launch_bounds__(1024) softmax_backward_rows_kernel(const T* __restrict__ g, const T* __restrict__ y,
                                                                      T* __restrict__ dx, std::int64_t rows,
                                                                      std::int64_t n, int tpr_) {
  constexpr int VEC = vec_elems<T>;
  using A = gpu_acc_t<T>;
  __shared__ A smem[32];
  CCGRAPH_ROW_PROLOGUE;
  const int ni = static_cast<int>(n);  // the register path holds rows far below 2^31
  for (std::int64_t rb = static_cast<std::int64_t>(blockIdx.x) * groups; rb < rows;
       rb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t row = rb + group;
    const bool valid = row < rows;
    vpack<T, VEC> gv[VPT], yv[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (valid && c < ni) {
        gv[k] = load_pack<VEC>(g + row * n + c);
        yv[k] = load_pack<VEC>(y + row * n + c);
      }
    }
    A s = 0;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (valid && (k * tpr + lane) * VEC < ni)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A gk = static_cast<A>(to_acc(gv[k].v[j]));
          s += Log ? gk : gk * static_cast<A>(to_acc(yv[k].v[j]));
        }
    s = group_allreduce(s, tpr, [](A a, A b) { return a + b; }, smem);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (!valid || c >= ni) continue;
      vpack<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A gk = static_cast<A>(to_acc(gv[k].v[j]));
        const A yk = static_cast<A>(to_acc(yv[k].v[j]));
        o.v[j] = from_acc<T>(Log ? gk - dev_exp(yk) * s : yk * (gk - s));
      }
      store_pack<VEC>(dx + row * n + c, o);
    }
  }
}

template <class T, int VEC, bool Log>
__global__ void __launch_bounds__(512) softmax_backward_rows_looped_kernel(const T* __restrict__ g,
                                                                             const T* __restrict__ y,
                                                                             T* __restrict__ dx, std::int64_t rows,
                                                                             std::int64_t n, int tpr_) {
  using A = gpu_acc_t<T>;
  __shared__ A smem[32];
  CCGRAPH_ROW_PROLOGUE;
  const std::int64_t step = static_cast<std::int64_t>(tpr) * VEC;
  for (std::int64_t rb = static_cast<std::int64_t>(blockIdx.x) * groups; rb < rows;
       rb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t row = rb + group;
    const bool valid = row < rows;
    A s = 0;
    if (valid)
      for (std::int64_t c = static_cast<std::int64_t>(lane) * VEC; c < n; c += step) {
        const vpack<T, VEC> gk = load_pack<VEC>(g + row * n + c);
        const vpack<T, VEC> yk = load_pack<VEC>(y + row * n + c);
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          s += Log ? static_cast<A>(to_acc(gk.v[j])) : static_cast<A>(to_acc(gk.v[j])) * static_cast<A>(to_acc(yk.v[j]));
      }
    s = group_allreduce(s, tpr, [](A a, A b) { return a + b; }, smem);
    if (!valid) continue;
    for (std::int64_t c = static_cast<std::int64_t>(lane) * VEC; c < n; c += step) {
      const vpack<T, VEC> gk = load_pack<VEC>(g + row * n + c);
      const vpack<T, VEC> yk = load_pack<VEC>(y + row * n + c);
      vpack<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A gj = static_cast<A>(to_acc(gk.v[j]));
        const A yj = static_cast<A>(to_acc(yk.v[j]));
        o.v[j] = from_acc<T>(Log ? gj - dev_exp(yj) * s : yj * (gj - s));
      }
      store_pack<VEC>(dx + row * n + c, o);
    }
  }
}

template <class T, bool Log>
__global__ void __launch_bounds__(256) softmax_backward_spatial_kernel(const T* __restrict__ g, const T* __restrict__ y,
                                                                        T* __restrict__ dx, std::int64_t outer,
                                                                        std::int64_t n, std::int64_t inner) {
  using A = gpu_acc_t<T>;
  const std::int64_t positions = outer * inner;
  for (std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < positions;
       p += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t o = p / inner, i = p - o * inner;
    const std::int64_t base = o * n * inner + i;
    A s = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      const A gk = static_cast<A>(to_acc(g[base + k * inner]));
      s += Log ? gk : gk * static_cast<A>(to_acc(y[base + k * inner]));
    }
    for (std::int64_t k = 0; k < n; ++k) {
      const A gk = static_cast<A>(to_acc(g[base + k * inner]));
      const A yk = static_cast<A>(to_acc(y[base + k * inner]));
      dx[base + k * inner] = from_acc<T>(Log ? gk - dev_exp(yk) * s : yk * (gk - s));
    }
  }
}

// ---- layer_norm / rms_norm ------------------------------------------------------------------

template <class T, int VPT, bool RMS>
__global__ void __launch_bounds__(1024) norm_rows_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                          const T* __restrict__ b, T* __restrict__ y,
                                                          gpu_acc_t<T>* __restrict__ mean_out,
                                                          gpu_acc_t<T>* __restrict__ rstd_out, std::int64_t rows,
                                                          std::int64_t n, gpu_acc_t<T> eps, int tpr_) {
  constexpr int VEC = vec_elems<T>;
  using A = gpu_acc_t<T>;
  __shared__ A smem[32];
  CCGRAPH_ROW_PROLOGUE;
  const int ni = static_cast<int>(n);  // the register path holds rows far below 2^31
  const auto plus = [](A a, A c) { return a + c; };
  for (std::int64_t rb = static_cast<std::int64_t>(blockIdx.x) * groups; rb < rows;
       rb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t row = rb + group;
    const bool valid = row < rows;
    vpack<T, VEC> v[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (valid && c < ni) v[k] = load_pack<VEC>(x + row * n + c);
    }
    A mu = 0;
    if constexpr (!RMS) {
      A s = 0;
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (valid && (k * tpr + lane) * VEC < ni)
#pragma unroll
          for (int j = 0; j < VEC; ++j) s += static_cast<A>(to_acc(v[k].v[j]));
      mu = group_allreduce(s, tpr, plus, smem) / static_cast<A>(n);
    }
    A ss = 0;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (valid && (k * tpr + lane) * VEC < ni)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A d = static_cast<A>(to_acc(v[k].v[j])) - mu;
          ss += d * d;
        }
    const A rs = dev_rsqrt(group_allreduce(ss, tpr, plus, smem) / static_cast<A>(n) + eps);
    if (!valid) continue;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (c >= ni) continue;
      vpack<T, VEC> wv, bv, o;
      if (w) wv = load_pack<VEC>(w + c);
      if (b) bv = load_pack<VEC>(b + c);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        A e = (static_cast<A>(to_acc(v[k].v[j])) - mu) * rs;
        if (w) e *= static_cast<A>(to_acc(wv.v[j]));
        if (b) e += static_cast<A>(to_acc(bv.v[j]));
        o.v[j] = from_acc<T>(e);
      }
      store_pack<VEC>(y + row * n + c, o);
    }
    if (lane == 0) {
      if (mean_out) mean_out[row] = mu;
      if (rstd_out) rstd_out[row] = rs;
    }
  }
}

template <class T, int VEC, bool RMS>
__global__ void __launch_bounds__(512) norm_rows_looped_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                 const T* __restrict__ b, T* __restrict__ y,
                                                                 gpu_acc_t<T>* __restrict__ mean_out,
                                                                 gpu_acc_t<T>* __restrict__ rstd_out,
                                                                 std::int64_t rows, std::int64_t n,
                                                                 gpu_acc_t<T> eps, int tpr_) {
  using A = gpu_acc_t<T>;
  using W = ::ccgraph::detail::welford_state<A>;
  __shared__ W smem[32];
  CCGRAPH_ROW_PROLOGUE;
  const ::ccgraph::detail::var_reducer<A, A> welford{nullptr, A(0)};  // its combine / merge only
  const std::int64_t step = static_cast<std::int64_t>(tpr) * VEC;
  for (std::int64_t rb = static_cast<std::int64_t>(blockIdx.x) * groups; rb < rows;
       rb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t row = rb + group;
    const bool valid = row < rows;
    const T* xr = x + row * n;
    W st = welford.init();  // rms_norm: st.m2 sums x^2
    if (valid)
      for (std::int64_t c = static_cast<std::int64_t>(lane) * VEC; c < n; c += step) {
        const vpack<T, VEC> v = load_pack<VEC>(xr + c);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A e = static_cast<A>(to_acc(v.v[j]));
          if constexpr (RMS)
            st.m2 += e * e;
          else
            welford.combine(st, e, 0);
        }
      }
    st = group_allreduce(st, tpr, [&](const W& a, const W& c) {
      if constexpr (RMS) return W{A(0), A(0), a.m2 + c.m2};
      else return welford.merge(a, c);
    }, smem);
    if (!valid) continue;
    const A mu = RMS ? A(0) : (n > 0 ? st.mean : std::numeric_limits<A>::quiet_NaN());
    const A rs = dev_rsqrt(st.m2 / static_cast<A>(n) + eps);
    for (std::int64_t c = static_cast<std::int64_t>(lane) * VEC; c < n; c += step) {
      const vpack<T, VEC> v = load_pack<VEC>(xr + c);
      vpack<T, VEC> wv, bv, o;
      if (w) wv = load_pack<VEC>(w + c);
      if (b) bv = load_pack<VEC>(b + c);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        A e = (static_cast<A>(to_acc(v.v[j])) - mu) * rs;
        if (w) e *= static_cast<A>(to_acc(wv.v[j]));
        if (b) e += static_cast<A>(to_acc(bv.v[j]));
        o.v[j] = from_acc<T>(e);
      }
      store_pack<VEC>(y + row * n + c, o);
    }
    if (lane == 0) {
      if (mean_out) mean_out[row] = mu;
      if (rstd_out) rstd_out[row] = rs;
    }
  }
}

/// layer_norm / rms_norm backward, register path: dx per row, and each block's partial sums of
/// the weight / bias gradients (part_w / part_b: [gridDim.x][n], may be null).
template <class T, int VPT, bool RMS>
__global__ void __launch_bounds__(512) norm_backward_rows_kernel(
    const T* __restrict__ g, const T* __restrict__ x, const gpu_acc_t<T>* __restrict__ mean,
    const gpu_acc_t<T>* __restrict__ rstd, const T* __restrict__ w, T* __restrict__ dx,
    gpu_acc_t<T>* __restrict__ part_w, gpu_acc_t<T>* __restrict__ part_b, std::int64_t rows, std::int64_t n, int tpr_) {
  constexpr int VEC = vec_elems<T>;
  using A = gpu_acc_t<T>;
  __shared__ sum2<A> smem[32];
  __shared__ A cols[256 * VPT * VEC];  // cross-group sums when a block holds several rows
  CCGRAPH_ROW_PROLOGUE;
  const int ni = static_cast<int>(n);  // the register path holds rows far below 2^31
  A dw[VPT][VEC], db[VPT][VEC];
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[k][j] = db[k][j] = A(0);
  const A inv_n = A(1) / static_cast<A>(n);
  for (std::int64_t rb = static_cast<std::int64_t>(blockIdx.x) * groups; rb < rows;
       rb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t row = rb + group;
    const bool valid = row < rows;
    vpack<T, VEC> xv[VPT], gv[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (valid && c < ni) {
        xv[k] = load_pack<VEC>(x + row * n + c);
        gv[k] = load_pack<VEC>(g + row * n + c);
      }
    }
    const A mu = valid && !RMS ? mean[row] : A(0);
    const A rs = valid ? rstd[row] : A(0);
    sum2<A> s{A(0), A(0)};
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (!valid || c >= ni) continue;
      vpack<T, VEC> wv;
      if (w) wv = load_pack<VEC>(w + c);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A gj = static_cast<A>(to_acc(gv[k].v[j]));
        const A xh = (static_cast<A>(to_acc(xv[k].v[j])) - mu) * rs;
        const A dh = w ? gj * static_cast<A>(to_acc(wv.v[j])) : gj;
        s.a += dh;
        s.b += dh * xh;
        dw[k][j] += gj * xh;
        db[k][j] += gj;
      }
    }
    s = group_allreduce(s, tpr, [](const sum2<A>& p, const sum2<A>& q) { return sum2<A>{p.a + q.a, p.b + q.b}; }, smem);
    if (!valid || !dx) continue;
    const A md = RMS ? A(0) : s.a * inv_n;
    const A mdx = s.b * inv_n;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (c >= ni) continue;
      vpack<T, VEC> wv, o;
      if (w) wv = load_pack<VEC>(w + c);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A gj = static_cast<A>(to_acc(gv[k].v[j]));
        const A xh = (static_cast<A>(to_acc(xv[k].v[j])) - mu) * rs;
        const A dh = w ? gj * static_cast<A>(to_acc(wv.v[j])) : gj;
        o.v[j] = from_acc<T>(rs * (dh - md - xh * mdx));
      }
      store_pack<VEC>(dx + row * n + c, o);
    }
  }
  // Each block's column sums: straight from the registers with one row per block, else summed
  // over the block's groups through shared memory first. (A lambda per array, so that both stay
  // in registers: their indices are compile-time constants.)
  const auto write_part = [=](A* part, const A(&acc)[VPT][VEC]) {
    if (!part) return;  // uniform over the block
    if (groups == 1) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (k * tpr + lane) * VEC;
        if (c < ni)
#pragma unroll
          for (int j = 0; j < VEC; ++j) part[static_cast<std::int64_t>(blockIdx.x) * n + c + j] = acc[k][j];
      }
      return;
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (k * tpr + lane) * VEC;
      if (c < ni)
#pragma unroll
        for (int j = 0; j < VEC; ++j) cols[static_cast<std::int64_t>(group) * n + c + j] = acc[k][j];
    }
    __syncthreads();
    for (std::int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      A t = 0;
      for (int q = 0; q < groups; ++q) t += cols[static_cast<std::int64_t>(q) * n + c];
      part[static_cast<std::int64_t>(blockIdx.x) * n + c] = t;
    }
    __syncthreads();
  };
  write_part(part_w, dw);
  write_part(part_b, db);
}

/// layer_norm / rms_norm backward, looped path: dx only (two passes over the row).
template <class T, int VEC, bool RMS>
__global__ void __launch_bounds__(512) norm_backward_rows_looped_kernel(
    const T* __restrict__ g, const T* __restrict__ x, const gpu_acc_t<T>* __restrict__ mean,
    const gpu_acc_t<T>* __restrict__ rstd, const T* __restrict__ w, T* __restrict__ dx, std::int64_t rows,
    std::int64_t n, int tpr_) {
  using A = gpu_acc_t<T>;
  __shared__ sum2<A> smem[32];
  CCGRAPH_ROW_PROLOGUE;
  const std::int64_t step = static_cast<std::int64_t>(tpr) * VEC;
  const A inv_n = A(1) / static_cast<A>(n);
  for (std::int64_t rb = static_cast<std::int64_t>(blockIdx.x) * groups; rb < rows;
       rb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t row = rb + group;
    const bool valid = row < rows;
    const A mu = valid && !RMS ? mean[row] : A(0);
    const A rs = valid ? rstd[row] : A(0);
    sum2<A> s{A(0), A(0)};
    if (valid)
      for (std::int64_t c = static_cast<std::int64_t>(lane) * VEC; c < n; c += step) {
        const vpack<T, VEC> xv = load_pack<VEC>(x + row * n + c);
        const vpack<T, VEC> gv = load_pack<VEC>(g + row * n + c);
        vpack<T, VEC> wv;
        if (w) wv = load_pack<VEC>(w + c);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A gj = static_cast<A>(to_acc(gv.v[j]));
          const A dh = w ? gj * static_cast<A>(to_acc(wv.v[j])) : gj;
          s.a += dh;
          s.b += dh * (static_cast<A>(to_acc(xv.v[j])) - mu) * rs;
        }
      }
    s = group_allreduce(s, tpr, [](const sum2<A>& p, const sum2<A>& q) { return sum2<A>{p.a + q.a, p.b + q.b}; }, smem);
    if (!valid) continue;
    const A md = RMS ? A(0) : s.a * inv_n;
    const A mdx = s.b * inv_n;
    for (std::int64_t c = static_cast<std::int64_t>(lane) * VEC; c < n; c += step) {
      const vpack<T, VEC> xv = load_pack<VEC>(x + row * n + c);
      const vpack<T, VEC> gv = load_pack<VEC>(g + row * n + c);
      vpack<T, VEC> wv, o;
      if (w) wv = load_pack<VEC>(w + c);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A gj = static_cast<A>(to_acc(gv.v[j]));
        const A dh = w ? gj * static_cast<A>(to_acc(wv.v[j])) : gj;
        const A xh = (static_cast<A>(to_acc(xv.v[j])) - mu) * rs;
        o.v[j] = from_acc<T>(rs * (dh - md - xh * mdx));
      }
      store_pack<VEC>(dx + row * n + c, o);
    }
  }
}

/// The weight / bias gradient partial sums of the looped path: thread (column c, chunk blockIdx.y)
/// sums grad * xhat and grad over rows blockIdx.y, blockIdx.y + gridDim.y, ... into
/// part_*[blockIdx.y][c].
template <class T, bool RMS>
__global__ void __launch_bounds__(256) norm_param_grad_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                                               const gpu_acc_t<T>* __restrict__ mean,
                                                               const gpu_acc_t<T>* __restrict__ rstd,
                                                               gpu_acc_t<T>* __restrict__ part_w,
                                                               gpu_acc_t<T>* __restrict__ part_b, std::int64_t rows,
                                                               std::int64_t n) {
  using A = gpu_acc_t<T>;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  A sw = 0, sb = 0;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const A gj = static_cast<A>(to_acc(g[r * n + c]));
    const A mu = RMS ? A(0) : mean[r];
    sw += gj * (static_cast<A>(to_acc(x[r * n + c])) - mu) * rstd[r];
    sb += gj;
  }
  if (part_w) part_w[static_cast<std::int64_t>(blockIdx.y) * n + c] = sw;
  if (part_b) part_b[static_cast<std::int64_t>(blockIdx.y) * n + c] = sb;
}

#undef CCGRAPH_ROW_PROLOGUE

/// Calls f(std::integral_constant<int, VPT>) for the register path's packs per thread `vpt`
/// (1, 2, 4 or 8), instantiating only the VPT <= MaxVpt that a launch can pick.
template <int MaxVpt, class F>
void dispatch_vpt(int vpt, F&& f) {
  if (vpt == 1) {
    f(std::integral_constant<int, 1>{});
  } else if (vpt == 2) {
    if constexpr (MaxVpt >= 2) f(std::integral_constant<int, 2>{});
  } else if (vpt == 4) {
    if constexpr (MaxVpt >= 4) f(std::integral_constant<int, 4>{});
  } else {
    if constexpr (MaxVpt >= 8) f(std::integral_constant<int, 8>{});
  }
}

/// The largest packs per thread of a register path allowing `max_elems` elements per thread.
template <class T>
constexpr int max_vpt(int max_elems) {
  const int v = max_elems / vec_elems<T>;
  return v >= 8 ? 8 : v >= 4 ? 4 : v >= 2 ? 2 : 1;
}

/// A row-major device tensor of `rows` x `cols` elements of A over a workspace.
template <class A>
tensor<A> workspace_tensor(const workspace<A>& ws, std::int64_t rows, std::int64_t cols) {
  const shape_t s{rows, cols};
  return tensor<A>(ws.st, s, contiguous_strides(s), 0);
}

/// out[c] = sum over rows of part[r][c], rounded to T: the column reduction of reduction.cuh.
template <class T, class A>
void sum_partials(const workspace<A>& part, std::int64_t rows, std::int64_t n, T* out) {
  reduce_cuda_run(workspace_tensor(part, rows, n), {true, false}, ::ccgraph::detail::sum_reducer<A, T>{out});
}

}  // namespace ccgraph::cuda::detail

namespace ccgraph::detail {

/// The [outer, n, inner] view of a softmax of `shape` along `dim`.
struct softmax_extent {
  std::int64_t outer = 1, n = 1, inner = 1;
};
inline softmax_extent softmax_dims(const shape_t& shape, int dim) {
  softmax_extent e;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (static_cast<int>(d) < dim) e.outer *= shape[d];
    else if (static_cast<int>(d) == dim) e.n = shape[d];
    else e.inner *= shape[d];
  }
  return e;
}

/// softmax (Log: log_softmax) on the GPU: one fused kernel (see the header comment).
template <bool Log, class T>
void softmax_cuda_impl(const tensor<T>& in, std::int64_t dim, const tensor<T>& out) {
  namespace cd = cuda::detail;
  const char* what = Log ? "log_softmax" : "softmax";
  (void)softmax_meta({dtype_v<T>, in.shape()}, dim, what);
  check_input(what, "input", in, false);
  check_output(what, "output", out, in.shape(), false);
  if constexpr (is_floating_element_v<T>) {
    if (in.numel() == 0) return;
    const softmax_extent e = softmax_dims(in.shape(), normalize_dim(dim, in.shape().size(), what));
    const tensor<T> x = in.contiguous();
    const cudaStream_t stream = cuda::current_stream();
    if (e.inner > 1) {
      cd::softmax_spatial_kernel<T, Log><<<cd::elementwise_grid(e.outer * e.inner), 256, 0, stream>>>(
          x.data(), out.data(), e.outer, e.n, e.inner);
      return cd::check_launch("softmax: spatial kernel launch");
    }
    constexpr int vpt_cap = 4;  // 8 packs do not fit 64 registers (1024 threads) without spilling
    const cd::row_launch L = cd::pick_row_launch(e.outer, e.n, cd::vec_elems<T>,
                                                 cd::aligned16(x.data()) && cd::aligned16(out.data()), vpt_cap,
                                                 vpt_cap * cd::vec_elems<T>, 1024);
    if (L.regs) {
      cd::dispatch_vpt<vpt_cap>(L.vpt, [&](auto vpt) {
        cd::softmax_rows_kernel<T, decltype(vpt)::value, Log><<<static_cast<unsigned>(L.blocks), L.threads, 0, stream>>>(
            x.data(), out.data(), e.outer, e.n, L.tpr);
      });
    } else if (L.vec > 1) {
      cd::softmax_rows_looped_kernel<T, cd::vec_elems<T>, Log><<<static_cast<unsigned>(L.blocks), L.threads, 0, stream>>>(
          x.data(), out.data(), e.outer, e.n, L.tpr);
    } else {
      cd::softmax_rows_looped_kernel<T, 1, Log><<<static_cast<unsigned>(L.blocks), L.threads, 0, stream>>>(
          x.data(), out.data(), e.outer, e.n, L.tpr);
    }
    cd::check_launch("softmax: row kernel launch");
  }
}

/// softmax(in, dim) on the GPU (see softmax_cpu).
template <class T>
void softmax_cuda(const tensor<T>& in, std::int64_t dim, const tensor<T>& out) {
  softmax_cuda_impl<false>(in, dim, out);
}
/// log_softmax(in, dim) on the GPU (see log_softmax_cpu).
template <class T>
void log_softmax_cuda(const tensor<T>& in, std::int64_t dim, const tensor<T>& out) {
  softmax_cuda_impl<true>(in, dim, out);
}

/// softmax's (Log: log_softmax's) backward on the GPU.
template <bool Log, class T>
void softmax_backward_cuda_impl(const tensor<T>& grad, const tensor<T>& y, std::int64_t dim, const tensor<T>& grad_in) {
  namespace cd = cuda::detail;
  const char* what = Log ? "log_softmax_backward" : "softmax_backward";
  (void)softmax_backward_meta({dtype_v<T>, grad.shape()}, {dtype_v<T>, y.shape()}, dim, what);
  check_input(what, "grad", grad, false);
  check_input(what, "output", y, false);
  check_output(what, "grad_input", grad_in, y.shape(), false);
  if constexpr (is_floating_element_v<T>) {
    if (y.numel() == 0) return;
    const softmax_extent e = softmax_dims(y.shape(), normalize_dim(dim, y.shape().size(), what));
    const tensor<T> g = grad.contiguous();
    const tensor<T> yc = y.contiguous();
    const cudaStream_t stream = cuda::current_stream();
    if (e.inner > 1) {
      cd::softmax_backward_spatial_kernel<T, Log><<<cd::elementwise_grid(e.outer * e.inner), 256, 0, stream>>>(
          g.data(), yc.data(), grad_in.data(), e.outer, e.n, e.inner);
      return cd::check_launch("softmax_backward: spatial kernel launch");
    }
    const bool aligned = cd::aligned16(g.data()) && cd::aligned16(yc.data()) && cd::aligned16(grad_in.data());
    constexpr int max_elems = 16;  // two arrays of packs in registers
    const cd::row_launch L =
        cd::pick_row_launch(e.outer, e.n, cd::vec_elems<T>, aligned, cd::max_vpt<T>(max_elems), max_elems, 1024);
    if (L.regs) {
      cd::dispatch_vpt<cd::max_vpt<T>(max_elems)>(L.vpt, [&](auto vpt) {
        cd::softmax_backward_rows_kernel<T, decltype(vpt)::value, Log>
            <<<static_cast<unsigned>(L.blocks), L.threads, 0, stream>>>(g.data(), yc.data(), grad_in.data(), e.outer, e.n, L.tpr);
      });
    } else if (L.vec > 1) {
      cd::softmax_backward_rows_looped_kernel<T, cd::vec_elems<T>, Log>
          <<<static_cast<unsigned>(L.blocks), L.threads, 0, stream>>>(g.data(), yc.data(), grad_in.data(), e.outer, e.n, L.tpr);
    } else {
      cd::softmax_backward_rows_looped_kernel<T, 1, Log>
          <<<static_cast<unsigned>(L.blocks), L.threads, 0, stream>>>(g.data(), yc.data(), grad_in.data(), e.outer, e.n, L.tpr);
    }
    cd::check_launch("softmax_backward: row kernel launch");
  }
}

/// softmax's backward on the GPU (see softmax_backward_cpu).
template <class T>
void softmax_backward_cuda(const tensor<T>& grad, const tensor<T>& y, std::int64_t dim, const tensor<T>& grad_in) {
  softmax_backward_cuda_impl<false>(grad, y, dim, grad_in);
}
/// log_softmax's backward on the GPU (see log_softmax_backward_cpu).
template <class T>
void log_softmax_backward_cuda(const tensor<T>& grad, const tensor<T>& y, std::int64_t dim, const tensor<T>& grad_in) {
  softmax_backward_cuda_impl<true>(grad, y, dim, grad_in);
}

/// layer_norm (RMS: rms_norm) on the GPU: one fused kernel.
template <bool RMS, class T>
void norm_cuda_impl(const tensor<T>& in, const shape_t& normalized_shape, const optional_tensor<T>& weight,
                    const optional_tensor<T>& bias, double eps, const tensor<T>& out,
                    const tensor<norm_stat_t<T>>* mean, const tensor<norm_stat_t<T>>* rstd) {
  namespace cd = cuda::detail;
  const char* what = RMS ? "rms_norm" : "layer_norm";
  const norm_extent e = norm_check(what, {dtype_v<T>, in.shape()}, normalized_shape, meta_of(weight), meta_of(bias));
  check_input(what, "input", in, false);
  if (weight) check_input(what, "weight", *weight, false);
  if (bias) check_input(what, "bias", *bias, false);
  check_output(what, "output", out, in.shape(), false);
  if (mean) check_output(what, "mean", *mean, e.stat_shape, false);
  if (rstd) check_output(what, "rstd", *rstd, e.stat_shape, false);
  if constexpr (is_floating_element_v<T>) {
    using A = gpu_acc_t<T>;
    if (e.rows == 0) return;
    const tensor<T> x = in.contiguous();
    const std::optional<tensor<T>> w = weight ? std::optional<tensor<T>>(weight->contiguous()) : std::nullopt;
    const std::optional<tensor<T>> b = bias ? std::optional<tensor<T>>(bias->contiguous()) : std::nullopt;
    const T* wp = w ? w->data() : nullptr;
    const T* bp = b ? b->data() : nullptr;
    A* mp = mean ? mean->data() : nullptr;
    A* rp = rstd ? rstd->data() : nullptr;
    const bool aligned = cd::aligned16(x.data()) && cd::aligned16(out.data()) && cd::aligned16(wp) && cd::aligned16(bp);
    constexpr int vpt_cap = 4;  // 8 packs do not fit 64 registers (1024 threads) without spilling
    const cd::row_launch L = cd::pick_row_launch(e.rows, e.cols, cd::vec_elems<T>, aligned, vpt_cap,
                                                 vpt_cap * cd::vec_elems<T>, 1024);
    const cudaStream_t stream = cuda::current_stream();
    const auto grid = static_cast<unsigned>(L.blocks);
    if (L.regs) {
      cd::dispatch_vpt<vpt_cap>(L.vpt, [&](auto vpt) {
        cd::norm_rows_kernel<T, decltype(vpt)::value, RMS><<<grid, L.threads, 0, stream>>>(
            x.data(), wp, bp, out.data(), mp, rp, e.rows, e.cols, static_cast<A>(eps), L.tpr);
      });
    } else if (L.vec > 1) {
      cd::norm_rows_looped_kernel<T, cd::vec_elems<T>, RMS><<<grid, L.threads, 0, stream>>>(
          x.data(), wp, bp, out.data(), mp, rp, e.rows, e.cols, static_cast<A>(eps), L.tpr);
    } else {
      cd::norm_rows_looped_kernel<T, 1, RMS><<<grid, L.threads, 0, stream>>>(x.data(), wp, bp, out.data(), mp, rp, e.rows,
                                                                            e.cols, static_cast<A>(eps), L.tpr);
    }
    cd::check_launch(RMS ? "rms_norm: kernel launch" : "layer_norm: kernel launch");
  }
}

/// layer_norm on the GPU (see layer_norm_cpu).
template <class T>
void layer_norm_cuda(const tensor<T>& in, const shape_t& normalized_shape, const optional_tensor<T>& weight,
                     const optional_tensor<T>& bias, double eps, const tensor<T>& out,
                     const tensor<norm_stat_t<T>>* mean = nullptr, const tensor<norm_stat_t<T>>* rstd = nullptr) {
  (void)layer_norm_meta({dtype_v<T>, in.shape()}, normalized_shape, meta_of(weight), meta_of(bias), eps);
  norm_cuda_impl<false>(in, normalized_shape, weight, bias, eps, out, mean, rstd);
}

/// rms_norm on the GPU (see rms_norm_cpu).
template <class T>
void rms_norm_cuda(const tensor<T>& in, const shape_t& normalized_shape, const optional_tensor<T>& weight,
                   std::optional<double> eps, const tensor<T>& out, const tensor<norm_stat_t<T>>* rstd = nullptr) {
  (void)rms_norm_meta({dtype_v<T>, in.shape()}, normalized_shape, meta_of(weight), eps);
  norm_cuda_impl<true>(in, normalized_shape, weight, std::nullopt, eps.value_or(rms_norm_default_eps(dtype_v<T>)),
                       out, nullptr, rstd);
}

/// layer_norm's (RMS: rms_norm's) backward on the GPU: dx and the parameters' partial sums in
/// one kernel, then the partials' column sums.
template <bool RMS, class T>
void norm_backward_cuda_impl(const tensor<T>& grad, const tensor<T>& in, const shape_t& normalized_shape,
                             const tensor<norm_stat_t<T>>* mean, const tensor<norm_stat_t<T>>& rstd,
                             const optional_tensor<T>& weight, output_ptr<T> grad_in, output_ptr<T> grad_weight,
                             output_ptr<T> grad_bias) {
  namespace cd = cuda::detail;
  const char* what = RMS ? "rms_norm_backward" : "layer_norm_backward";
  CCGRAPH_CHECK(RMS || mean, what, ": the saved mean is required");
  CCGRAPH_CHECK(!RMS || !grad_bias, what, ": rms_norm has no bias");
  const norm_extent e = norm_backward_check(what, grad, in, normalized_shape, mean, rstd, weight, grad_in, grad_weight,
                                            grad_bias, false);
  if constexpr (is_floating_element_v<T>) {
    using A = gpu_acc_t<T>;
    const cudaStream_t stream = cuda::current_stream();
    if (e.rows == 0 || e.cols == 0) {  // no rows: zero parameter gradients, as PyTorch
      for (const tensor<T>* p : {grad_weight, grad_bias})
        if (p && p->numel() > 0)
          CCGRAPH_CHECK_CUDA(cudaMemsetAsync(p->data(), 0, static_cast<std::size_t>(p->numel()) * sizeof(T), stream));
      return;
    }
    const tensor<T> x = in.contiguous();
    const tensor<T> g = grad.contiguous();
    const std::optional<tensor<T>> w = weight ? std::optional<tensor<T>>(weight->contiguous()) : std::nullopt;
    const T* wp = w ? w->data() : nullptr;
    const A* mp = mean ? mean->data() : nullptr;
    const A* rp = rstd.data();
    T* dxp = grad_in ? grad_in->data() : nullptr;
    const bool aligned = cd::aligned16(x.data()) && cd::aligned16(g.data()) && cd::aligned16(wp) && cd::aligned16(dxp);
    constexpr int max_elems = 16;  // + as many float accumulators for each parameter gradient
    const cd::row_launch L =
        cd::pick_row_launch(e.rows, e.cols, cd::vec_elems<T>, aligned, cd::max_vpt<T>(max_elems), max_elems, 512);
    if (L.regs) {
      // Persistent: each block's partial sums are one row of the workspace.
      const std::int64_t blocks = std::min<std::int64_t>(L.blocks, cd::full_wave_blocks(L.threads, 2));
      cd::workspace<A> pw, pb;
      if (grad_weight) pw = cd::make_workspace<A>(in.device(), blocks * e.cols);
      if (grad_bias) pb = cd::make_workspace<A>(in.device(), blocks * e.cols);
      A* pwp = grad_weight ? pw.get() : nullptr;
      A* pbp = grad_bias ? pb.get() : nullptr;
      cd::dispatch_vpt<cd::max_vpt<T>(max_elems)>(L.vpt, [&](auto vpt) {
        cd::norm_backward_rows_kernel<T, decltype(vpt)::value, RMS><<<static_cast<unsigned>(blocks), L.threads, 0, stream>>>(
            g.data(), x.data(), mp, rp, wp, dxp, pwp, pbp, e.rows, e.cols, L.tpr);
      });
      cd::check_launch(RMS ? "rms_norm_backward: kernel launch" : "layer_norm_backward: kernel launch");
      if (grad_weight) cd::sum_partials(pw, blocks, e.cols, grad_weight->data());
      if (grad_bias) cd::sum_partials(pb, blocks, e.cols, grad_bias->data());
      return;
    }
    if (dxp) {
      const auto grid = static_cast<unsigned>(L.blocks);
      if (L.vec > 1)
        cd::norm_backward_rows_looped_kernel<T, cd::vec_elems<T>, RMS><<<grid, L.threads, 0, stream>>>(
            g.data(), x.data(), mp, rp, wp, dxp, e.rows, e.cols, L.tpr);
      else
        cd::norm_backward_rows_looped_kernel<T, 1, RMS><<<grid, L.threads, 0, stream>>>(g.data(), x.data(), mp, rp, wp,
                                                                                       dxp, e.rows, e.cols, L.tpr);
      cd::check_launch(RMS ? "rms_norm_backward: kernel launch" : "layer_norm_backward: kernel launch");
    }
    if (grad_weight || grad_bias) {
      const std::int64_t col_blocks = (e.cols + 255) / 256;
      const std::int64_t chunks = std::clamp<std::int64_t>(cd::full_wave_blocks(256) / col_blocks, 1, std::min<std::int64_t>(e.rows, 65535));
      cd::workspace<A> pw, pb;
      if (grad_weight) pw = cd::make_workspace<A>(in.device(), chunks * e.cols);
      if (grad_bias) pb = cd::make_workspace<A>(in.device(), chunks * e.cols);
      cd::norm_param_grad_kernel<T, RMS><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks)), 256, 0, stream>>>(
          g.data(), x.data(), mp, rp, grad_weight ? pw.get() : nullptr, grad_bias ? pb.get() : nullptr, e.rows, e.cols);
      cd::check_launch(RMS ? "rms_norm_backward: parameter kernel launch" : "layer_norm_backward: parameter kernel launch");
      if (grad_weight) cd::sum_partials(pw, chunks, e.cols, grad_weight->data());
      if (grad_bias) cd::sum_partials(pb, chunks, e.cols, grad_bias->data());
    }
  }
}

/// layer_norm's backward on the GPU (see layer_norm_backward_cpu); outputs may be null.
template <class T>
void layer_norm_backward_cuda(const tensor<T>& grad, const tensor<T>& in, const shape_t& normalized_shape,
                              const tensor<norm_stat_t<T>>& mean, const tensor<norm_stat_t<T>>& rstd,
                              const optional_tensor<T>& weight, output_ptr<T> grad_in, output_ptr<T> grad_weight,
                              output_ptr<T> grad_bias) {
  norm_backward_cuda_impl<false, T>(grad, in, normalized_shape, &mean, rstd, weight, grad_in, grad_weight, grad_bias);
}

/// rms_norm's backward on the GPU (see rms_norm_backward_cpu); outputs may be null.
template <class T>
void rms_norm_backward_cuda(const tensor<T>& grad, const tensor<T>& in, const shape_t& normalized_shape,
                            const tensor<norm_stat_t<T>>& rstd, const optional_tensor<T>& weight,
                            output_ptr<T> grad_in, output_ptr<T> grad_weight) {
  norm_backward_cuda_impl<true, T>(grad, in, normalized_shape, nullptr, rstd, weight, grad_in, grad_weight, nullptr);
}

}  // namespace ccgraph::detail

// The graph ops' CUDA runs (ops/normalization_ops.hpp); CCGRAPH_CUDA_IMPL_VIA: cuda/reduction.cuh.
namespace ccgraph {
CCGRAPH_CUDA_IMPL_VIA(softmax, detail::softmax_cuda)
CCGRAPH_CUDA_IMPL_VIA(log_softmax, detail::log_softmax_cuda)
CCGRAPH_CUDA_IMPL_VIA(softmax_backward, detail::softmax_backward_cuda)
CCGRAPH_CUDA_IMPL_VIA(log_softmax_backward, detail::log_softmax_backward_cuda)
CCGRAPH_CUDA_IMPL_VIA(layer_norm, detail::layer_norm_cuda)
CCGRAPH_CUDA_IMPL_VIA(rms_norm, detail::rms_norm_cuda)
CCGRAPH_CUDA_IMPL_VIA(layer_norm_backward, detail::layer_norm_backward_cuda)
CCGRAPH_CUDA_IMPL_VIA(rms_norm_backward, detail::rms_norm_backward_cuda)
}  // namespace ccgraph
