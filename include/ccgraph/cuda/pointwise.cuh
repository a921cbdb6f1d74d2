// ccgraph/cuda/pointwise.cuh: the CUDA kernels behind element-wise expressions. One kernel per
// kernel tree (see expr.hpp's make_kernel) evaluates the whole fused tree per element, so a
// chain like `relu(a) * b + c` reads each operand once and writes the output once.
//
// Compile with nvcc: this header defines __global__ functions. <ccgraph/cuda.hpp> includes it
// only under nvcc, and host code reaches it through detail::device_pointwise, declared in
// <ccgraph/tensor/device_runtime.hpp>.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/pointwise.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/expr/expr.hpp>
#include <ccgraph/tensor/device_runtime.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ccgraph::cuda::detail {

/// Threads per block of the element-wise kernels: 8 warps, enough to hide latency with a few
/// blocks per SM while leaving the register file to deep kernel trees.
inline constexpr int pointwise_block_threads = 256;

/// Resident blocks per SM the grid is sized for (2048 threads per SM on Hopper / 256): a full
/// wave when registers allow it. Larger inputs loop (grid-stride) instead of adding blocks, so
/// the per-block set-up is paid once per resident block.
inline constexpr int pointwise_blocks_per_sm = 8;

/// Elements one thread handles per iteration of either kernel: 16 bytes of output, so that
/// their operand loads are all in flight together (and the flat kernel stores them as one
/// 16-byte vector).
template <class T>
inline constexpr int pointwise_vec = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));

/// Number of SMs of the calling thread's current device, read once per device. Ranks run one
/// thread per GPU, so the cache is shared by threads; a race only computes the same value twice.
inline int pointwise_sm_count() {
  constexpr int max_devices = 64;
  static std::array<std::atomic<int>, max_devices> cache{};  // 0: not read yet
  int dev = 0;
  CCGRAPH_CHECK_CUDA(cudaGetDevice(&dev));
  if (dev >= 0 && dev < max_devices) {
    const int cached = cache[static_cast<std::size_t>(dev)].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  // The attribute query reads one field; cudaGetDeviceProperties fills the whole struct (slow).
  int sms = 0;
  CCGRAPH_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  sms = std::max(sms, 1);
  if (dev >= 0 && dev < max_devices)
    cache[static_cast<std::size_t>(dev)].store(sms, std::memory_order_relaxed);
  return sms;
}

/// Blocks for `n` items of `per_block` each: enough to cover them, at most one full wave.
inline unsigned pointwise_grid(std::int64_t n, std::int64_t per_block) {
  const std::int64_t needed = (n + per_block - 1) / per_block;
  const std::int64_t wave = static_cast<std::int64_t>(pointwise_sm_count()) * pointwise_blocks_per_sm;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(needed, wave)));
}

/// Throws cuda_error when the launch just issued failed (bad configuration, no kernel image for
/// this GPU, ...), naming the launcher instead of the bare cudaGetLastError() call.
inline void check_pointwise_launch(const char* file, int line) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw_cuda_error(status, "device_pointwise: kernel launch (cudaGetLastError())", file, line);
}

/// The strided kernel's parameters: plain arrays (no std::array calls in device code), dims
/// stored innermost first so that the index decomposition walks them in order.
template <std::size_t N>
struct pointwise_strided_params {
  int ndim;
  /// Every operand's innermost dim is contiguous, a whole number of 16-byte chunks of the
  /// output long, and every row starts 16-byte aligned in every operand: each chunk is then one
  /// row's piece, read and written as 16-byte vectors.
  bool vector_rows;
  std::int64_t numel;
  std::int64_t shape[::ccgraph::detail::max_device_dims];  // shape[0]: the innermost (last) dim
  std::int64_t strides[N][::ccgraph::detail::max_device_dims];  // [operand][dim], same order
};

// `out` is not __restrict__: evaluating in place (out is one of the operands, same layout) is
// allowed, and each element is read before the same thread writes it.

/// The loop of pointwise_flat_kernel, with vector loads (Vec) or element loads for the leaves.
template <bool Vec, class K, class T, std::size_t N>
__device__ __forceinline__ void pointwise_flat_loop(const K& k, T* out, const std::int64_t n, const bool vector_store) {
  constexpr int vec = pointwise_vec<T>;
  const std::int64_t zero[N] = {};  // every operand starts where the output does
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x * vec;
  for (std::int64_t base = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * vec;
       base < n; base += step) {
    if (base + vec <= n) {
      alignas(16) T v[vec];
      const auto x = k.template load_pack<vec, Vec>(base);
#pragma unroll
      for (int j = 0; j < vec; ++j) v[j] = x.v[j];
      if (vector_store) {
        if constexpr (vec > 1)
          *reinterpret_cast<uint4*>(out + base) = *reinterpret_cast<const uint4*>(v);
      } else {
#pragma unroll
        for (int j = 0; j < vec; ++j) out[base + j] = v[j];
      }
    } else {
      for (std::int64_t i = base; i < n; ++i) out[i] = k.load(zero, i);
    }
  }
}

/// out[i] = k(0, i) over contiguous operands. Each thread takes 16 bytes of output per
/// iteration, evaluated as one pack (kernel_tree.hpp): every leaf loads its part of the chunk
/// at once, as 16-byte vectors when every operand is 16-byte aligned (decided once, so the
/// tree's loads have no branch between them), before the first use; a full chunk leaves as one
/// 16-byte store when `out` is 16-byte aligned (every chunk then is: chunks start at multiples
/// of 16 bytes). The last, partial chunk is written element by element.
template <class K, class T, std::size_t N>
__global__ void __launch_bounds__(pointwise_block_threads)
    pointwise_flat_kernel(const K k, T* out, const std::int64_t n) {
  const bool vector_store = (reinterpret_cast<std::uintptr_t>(out) % 16 == 0) && pointwise_vec<T> > 1;
  if (k.aligned16())
    pointwise_flat_loop<true, K, T, N>(k, out, n, vector_store);
  else
    pointwise_flat_loop<false, K, T, N>(k, out, n, vector_store);
}

/// Splits linear index `i` into per-operand offsets (o[0] the output's) and returns its
/// coordinate along the innermost dim. Index is the type the divisions run in: 32-bit division
/// is several times cheaper than 64-bit, and most tensors have fewer than 2^32 elements.
template <class Index, std::size_t N>
__device__ __forceinline__ std::int64_t pointwise_offsets(const pointwise_strided_params<N>& p,
                                                          Index i, std::int64_t (&o)[N]) {
  std::int64_t inner = 0;
#pragma unroll
  for (std::size_t a = 0; a < N; ++a) o[a] = 0;
#pragma unroll
  for (int d = 0; d < ::ccgraph::detail::max_device_dims; ++d) {
    if (d >= p.ndim) break;
    const Index size = static_cast<Index>(p.shape[d]);
    const Index q = i / size;
    const std::int64_t coord = static_cast<std::int64_t>(i - q * size);
    i = q;
    if (d == 0) inner = coord;
#pragma unroll
    for (std::size_t a = 0; a < N; ++a) o[a] += coord * p.strides[a][d];
  }
  return inner;
}

/// out[o[0]] = k(o, 0) with offsets from the linear index: broadcast (stride 0), transposed and
/// sliced operands, and non-contiguous outputs. Like the flat kernel, each thread takes a chunk
/// of 16 bytes of output per iteration: when the chunk lies within one innermost row, the
/// offsets are divided out once and stepped by the innermost strides for the rest, and all of
/// the chunk's loads are issued before its stores. A chunk that crosses a row (or the end)
/// computes each element's offsets on its own. With `vector_rows` (a permutation or slice of
/// outer dims: the heads' transposes, a gather's re-layout) each chunk is one pack loaded and
/// stored as 16-byte vectors, four chunks in flight per thread: about twice the bandwidth of
/// element accesses (an H200: 1.08-1.13x of a device memcpy's time, element accesses 2.3-2.5x).
template <class K, class T, std::size_t N>
__global__ void __launch_bounds__(pointwise_block_threads)
    pointwise_strided_kernel(const K k, T* out, const pointwise_strided_params<N> p) {
  constexpr int chunk = pointwise_vec<T>;
  const bool narrow = p.numel <= static_cast<std::int64_t>(UINT32_MAX);  // uniform branch
  const std::int64_t inner = p.ndim > 0 ? p.shape[0] : 1;
  auto offsets = [&](std::int64_t i, std::int64_t(&o)[N]) {
    return narrow ? pointwise_offsets(p, static_cast<std::uint32_t>(i), o)
                  : pointwise_offsets(p, static_cast<std::uint64_t>(i), o);
  };
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x * chunk;
  if (p.vector_rows) {  // uniform: every chunk is a whole, aligned piece of one row
    // U chunks per thread per iteration, all loaded before any is stored: U loads in flight.
    constexpr int U = 4;
    for (std::int64_t base = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * chunk;
         base < p.numel; base += step * U) {
      ::ccgraph::detail::elem_pack<T, chunk> x[U];
      std::int64_t at[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (base + u * step < p.numel) {
          std::int64_t o[N];
          offsets(base + u * step, o);
          x[u] = k.template load_pack_off<chunk, true>(o);
          at[u] = o[0];
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (base + u * step >= p.numel) break;
        if constexpr (chunk * sizeof(T) % 16 == 0) {
#pragma unroll
          for (std::size_t j = 0; j < chunk * sizeof(T) / 16; ++j)
            reinterpret_cast<uint4*>(out + at[u])[j] = reinterpret_cast<const uint4*>(x[u].v)[j];
        } else {
#pragma unroll
          for (int j = 0; j < chunk; ++j) out[at[u] + j] = x[u].v[j];
        }
      }
    }
    return;
  }
  for (std::int64_t base = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * chunk;
       base < p.numel; base += step) {
    std::int64_t o[N];
    const std::int64_t c0 = offsets(base, o);
    if (c0 + chunk <= inner) {  // one row, so also below numel
      T v[chunk];
#pragma unroll
      for (int j = 0; j < chunk; ++j) {
        std::int64_t oj[N];
#pragma unroll
        for (std::size_t a = 0; a < N; ++a) oj[a] = o[a] + j * p.strides[a][0];
        v[j] = k.load(oj, 0);
      }
#pragma unroll
      for (int j = 0; j < chunk; ++j) out[o[0] + j * p.strides[0][0]] = v[j];
    } else {
      const std::int64_t end = base + chunk < p.numel ? base + chunk : p.numel;
      out[o[0]] = k.load(o, 0);
      for (std::int64_t i = base + 1; i < end; ++i) {
        offsets(i, o);
        out[o[0]] = k.load(o, 0);
      }
    }
  }
}

}  // namespace ccgraph::cuda::detail

namespace ccgraph::detail {

/// The CUDA kernel for kernel tree K writing T, with N = tensor operands + 1 (index 0 of the
/// layout's strides is the output; tensor leaf I of K reads offsets[I]). `run` launches it on
/// the calling thread's current stream (ccgraph::cuda::current_stream()) and returns without
/// waiting; an empty layout launches nothing. A flat layout runs the vectorised flat kernel,
/// anything else the strided one (at most max_device_dims dims). Both take 16 bytes of output
/// per thread per iteration over a grid of at most one wave.
template <class K, class T, std::size_t N>
struct device_pointwise {
  static_assert(std::is_trivially_copyable_v<K>,
                "device_pointwise: the kernel tree is passed to the kernel by value and must be "
                "trivially copyable (pointers and scalars)");
  static_assert(N >= 1, "device_pointwise: N counts the output, so it is at least 1");

  /// Launches `k` over `layout` into `out` (device memory of the current device).
  static void run(const K& k, T* out, const device_layout<N>& layout) {
    namespace cd = ::ccgraph::cuda::detail;
    if (layout.numel <= 0) return;
    CCGRAPH_CHECK(layout.ndim >= 0 && layout.ndim <= max_device_dims, "device_pointwise: ",
                  layout.ndim, " dims; device kernels index at most ", max_device_dims);
    const cudaStream_t stream = ::ccgraph::cuda::current_stream();
    constexpr int threads = cd::pointwise_block_threads;
    if (layout.flat) {
      const unsigned blocks =
          cd::pointwise_grid(layout.numel, static_cast<std::int64_t>(threads) * cd::pointwise_vec<T>);
      cd::pointwise_flat_kernel<K, T, N><<<blocks, threads, 0, stream>>>(k, out, layout.numel);
    } else {
      cd::pointwise_strided_params<N> p{};
      p.ndim = layout.ndim;
      p.numel = layout.numel;
      for (int d = 0; d < layout.ndim; ++d) {
        const auto src = static_cast<std::size_t>(layout.ndim - 1 - d);
        p.shape[d] = layout.shape[src];
        for (std::size_t a = 0; a < N; ++a) p.strides[a][d] = layout.strides[a][src];
      }
      // Whole aligned chunks per row in every operand (a leaf's own type may be narrower or
      // wider than T: its pack is chunk elements at a multiple of chunk, so 16-byte aligned
      // whenever the pack is a whole number of 16-byte vectors, and read element-wise if not).
      constexpr std::int64_t chunk = cd::pointwise_vec<T>;
      bool rows = chunk > 1 && layout.ndim >= 1 && p.shape[0] % chunk == 0 && ::ccgraph::detail::aligned16(out) &&
                  k.aligned16();
      for (std::size_t a = 0; a < N && rows; ++a) {
        rows = p.strides[a][0] == 1;
        for (int d = 1; d < layout.ndim && rows; ++d) rows = p.strides[a][d] % chunk == 0;
      }
      p.vector_rows = rows;
      const unsigned blocks =
          cd::pointwise_grid(layout.numel, static_cast<std::int64_t>(threads) * cd::pointwise_vec<T>);
      cd::pointwise_strided_kernel<K, T, N><<<blocks, threads, 0, stream>>>(k, out, p);
    }
    cd::check_pointwise_launch(__FILE__, __LINE__);
  }
};

}  // namespace ccgraph::detail
