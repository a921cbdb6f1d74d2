// ccgraph/cuda/reduction.cuh: the CUDA kernels of the reductions along dims (sum, mean, var, max /
// min with and without dim, amax / amin, argmax / argmin) and of their backward kernels, plus the
// device helpers the row-wise kernels (<ccgraph/cuda/normalization.cuh>, <ccgraph/cuda/loss.cuh>)
// share: 16-byte packs, 16-bit float conversions, warp / group all-reduces.
//
// The arithmetic is the reducers' of <ccgraph/ops/reduction.hpp> (one definition for the CPU and
// the GPU); this file only decides how threads walk the input. The input is seen as
// [outer, reduced, inner] with element strides (so, sr, si) after dropping size-1 dims and
// merging adjacent ones; the output index is q = o * inner + i. Then:
//   - row kernel     (sr == 1: the reduced elements are contiguous): a group of `tpr` threads
//                    per output walks its row with 16-byte loads, four in flight per thread, and
//                    all-reduces through shuffles (and shared memory past a warp);
//   - column kernel  (the outputs are contiguous): each thread owns 16 bytes of consecutive
//                    outputs, threads of a block column split the reduced dim, shared memory
//                    merges them: coalesced however long the reduced stride is;
//   - split          when there are too few outputs to fill the GPU, the reduced dim is cut into
//                    chunks over blockIdx.y whose states go to a workspace, merged by a second
//                    kernel (deterministic: no atomics);
//   - anything else (reduced dims apart, or neither layout coalesced) is first copied into a
//     contiguous [kept..., reduced...] tensor, then reduced by the row kernel.
// Every kernel runs on the calling thread's current stream (ccgraph::cuda::current_stream()) and
// returns without waiting. Inputs are waited on (pending collectives) through tensor::data().
//
// Compile with nvcc: this header defines __global__ functions.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/reduction.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/pointwise.cuh>
#include <ccgraph/ops/reduction.hpp>
#include <ccgraph/ops/reduction_ops.hpp>
#include <ccgraph/tensor/storage.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

namespace ccgraph::cuda::detail {

using ::ccgraph::detail::gpu_acc_t;
using ::ccgraph::detail::max_device_dims;

// =============================================================================================
// Device helpers shared by the reduction, normalization and loss kernels
// =============================================================================================

/// Elements of T in one 16-byte access.
template <class T>
inline constexpr int vec_elems = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));

/// N consecutive elements loaded or stored as one access (16 bytes when N == vec_elems<T>).
template <class T, int N>
struct alignas(sizeof(T) * N) vpack {
  T v[N];
};

/// Loads N elements at `p` (aligned to the pack) as one access.
template <int N, class T>
__device__ __forceinline__ vpack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const vpack<T, N>*>(p);
}
/// Stores N elements at `p` (aligned to the pack) as one access.
template <int N, class T>
__device__ __forceinline__ void store_pack(T* p, const vpack<T, N>& v) {
  *reinterpret_cast<vpack<T, N>*>(p) = v;
}

/// An element widened to its compute type with the hardware conversions (bf16 / f16 to float).
template <class T>
__device__ __forceinline__ compute_t<T> to_acc(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return __uint_as_float(static_cast<unsigned>(v.bits) << 16);
  else if constexpr (std::is_same_v<T, f16>)
    return __half2float(__ushort_as_half(v.bits));
  else
    return v;
}

/// A float / double rounded to T with the hardware conversions (round to nearest even).
template <class T, class A>
__device__ __forceinline__ T from_acc(A v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16::from_bits(__bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(v))));
  else if constexpr (std::is_same_v<T, f16>)
    return f16::from_bits(__half_as_ushort(__float2half_rn(static_cast<float>(v))));
  else
    return static_cast<T>(v);
}

/// __shfl_xor_sync of any trivially copyable value: directly for the types the intrinsic takes,
/// else word by word through a union (a memcpy into a local array would live in local memory).
template <class X>
__device__ __forceinline__ X shfl_xor_any(const X& v, int lane_mask) {
  if constexpr (std::is_same_v<X, float> || std::is_same_v<X, double> || std::is_same_v<X, int> ||
                std::is_same_v<X, unsigned> || std::is_same_v<X, long long> || std::is_same_v<X, unsigned long long>) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
  } else if constexpr (std::is_same_v<X, long>) {
    return static_cast<long>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v), lane_mask));
  } else {
    constexpr int words = static_cast<int>((sizeof(X) + 3) / 4);
    union {
      X x;
      unsigned w[words];
    } u{};
    u.x = v;
#pragma unroll
    for (int k = 0; k < words; ++k) u.w[k] = __shfl_xor_sync(0xffffffffu, u.w[k], lane_mask);
    return u.x;
  }
}

/// All-reduces `v` with `f` over each group of `tpr` consecutive threads (a power of two; a
/// group larger than a warp is made of whole warps and goes through `smem`, 32 entries). Every
/// thread of the block must call it (it synchronises the block when tpr > 32); each thread of a
/// group gets the same result.
template <class X, class F>
__device__ __forceinline__ X group_allreduce(X v, int tpr, F f, X* smem) {
  const int width = tpr < 32 ? tpr : 32;
  for (int o = width >> 1; o > 0; o >>= 1) v = f(v, shfl_xor_any(v, o));
  if (tpr <= 32) return v;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  if ((threadIdx.x & 31) == 0) smem[warp] = v;
  __syncthreads();
  const int per = tpr >> 5;
  const int first = static_cast<int>(threadIdx.x) / tpr * per;
  X r = smem[first];
  for (int k = 1; k < per; ++k) r = f(r, smem[first + k]);
  __syncthreads();  // smem is reused by the next call
  return r;
}

/// The smallest power of two >= v (v >= 1).
inline std::int64_t next_pow2(std::int64_t v) {
  std::int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

/// Throws cuda_error naming `what` when the launch just issued failed.
inline void check_launch(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw_cuda_error(status, what, __FILE__, __LINE__);
}

/// Device scratch memory for one call, freed (stream-ordered) when the owner goes out of scope.
template <class X>
struct workspace {
  std::shared_ptr<::ccgraph::detail::storage> st;
  X* get() const { return static_cast<X*>(st->data()); }
};
template <class X>
workspace<X> make_workspace(device dev, std::int64_t count) {
  return {::ccgraph::detail::storage::allocate(dev, static_cast<std::size_t>(std::max<std::int64_t>(count, 1)) * sizeof(X))};
}

/// Blocks of the given size that fill the device once (at most `per_sm` per SM).
inline std::int64_t full_wave_blocks(int block_threads, int per_sm_cap = 32) {
  const int per_sm = std::max(1, std::min(per_sm_cap, 2048 / std::max(block_threads, 1)));
  return static_cast<std::int64_t>(pointwise_sm_count()) * per_sm;
}

/// Index arithmetic of an element-wise kernel over a shape of at most max_device_dims dims: the
/// linear (row-major) index to one offset per stride set. Dims are stored innermost first.
template <int K>
struct nd_index {
  int ndim = 0;
  std::int64_t numel = 0;
  std::int64_t shape[max_device_dims] = {};
  std::int64_t strides[K][max_device_dims] = {};

  __device__ __forceinline__ void offsets(std::int64_t e, std::int64_t (&o)[K]) const {
#pragma unroll
    for (int a = 0; a < K; ++a) o[a] = 0;
    for (int d = 0; d < ndim; ++d) {
      const std::int64_t q = e / shape[d];
      const std::int64_t c = e - q * shape[d];
      e = q;
#pragma unroll
      for (int a = 0; a < K; ++a) o[a] += c * strides[a][d];
    }
  }
};

/// The nd_index of `shape` with K stride sets; `what` names the call when there are too many dims.
template <int K>
nd_index<K> make_nd_index(const shape_t& shape, const std::array<strides_t, K>& st, const char* what) {
  shape_t s;
  std::array<strides_t, K> t;
  for (std::size_t d = 0; d < shape.size(); ++d) {  // size-1 dims never step
    if (shape[d] == 1) continue;
    s.push_back(shape[d]);
    for (int a = 0; a < K; ++a) t[static_cast<std::size_t>(a)].push_back(st[static_cast<std::size_t>(a)][d]);
  }
  CCGRAPH_CHECK(s.size() <= static_cast<std::size_t>(max_device_dims), what, ": shape ", shape_str(shape),
                " has more than ", max_device_dims, " dims (of size > 1) on the GPU");
  nd_index<K> ix;
  ix.ndim = static_cast<int>(s.size());
  ix.numel = numel_of(shape);
  for (int d = 0; d < ix.ndim; ++d) {
    const auto src = static_cast<std::size_t>(ix.ndim - 1 - d);
    ix.shape[d] = s[src];
    for (int a = 0; a < K; ++a) ix.strides[a][d] = t[static_cast<std::size_t>(a)][src];
  }
  return ix;
}

/// Grid for an element-wise grid-stride kernel over n items with 256 threads per block.
inline unsigned elementwise_grid(std::int64_t n) { return pointwise_grid(n, 256); }

// =============================================================================================
// The reduction engine
// =============================================================================================

/// A reduction's input as [outer, red, inner] with element strides; outputs q = o * inner + i.
struct reduce_geometry {
  std::int64_t outer = 1, red = 1, inner = 1;
  std::int64_t so = 0, sr = 0, si = 0;
};

/// Merges runs of adjacent dims (outermost first) into one (size, stride) when they nest;
/// false when they do not.
inline bool merge_dims(const std::vector<std::pair<std::int64_t, std::int64_t>>& dims, std::int64_t& size,
                       std::int64_t& stride) {
  size = 1;
  stride = 0;
  if (dims.empty()) return true;
  size = dims.back().first;
  stride = dims.back().second;
  for (std::size_t k = dims.size() - 1; k-- > 0;) {
    if (dims[k].second != dims[k + 1].second * dims[k + 1].first) return false;
    size *= dims[k].first;
  }
  return true;
}

/// The [outer, red, inner] view of a reduction of `shape` / `strides` over `mask`, or false when
/// the reduced dims are not adjacent (size-1 dims aside) or a group's dims do not nest.
inline bool plan_reduce(const shape_t& shape, const strides_t& strides, const std::vector<bool>& mask,
                        reduce_geometry& g) {
  std::vector<std::pair<std::int64_t, std::int64_t>> before, red, after;
  int state = 0;  // 0: kept dims before the reduced ones, 1: reduced, 2: kept after
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (mask[d]) {
      if (state == 2) return false;
      state = 1;
      red.push_back({shape[d], strides[d]});
    } else if (state == 0) {
      before.push_back({shape[d], strides[d]});
    } else {
      state = 2;
      after.push_back({shape[d], strides[d]});
    }
  }
  return merge_dims(before, g.outer, g.so) && merge_dims(red, g.red, g.sr) && merge_dims(after, g.inner, g.si);
}

struct reduce_rows_params {
  std::int64_t outputs, inner, so, si, red, chunk;
  int tpr;
};

/// The row kernel: a group of p.tpr threads per output q, over the chunk blockIdx.y of its
/// contiguous reduced elements, VEC elements per load (VEC > 1 only when every row start is
/// aligned to the pack), 4 loads in flight per thread. With one chunk the group stores the output,
/// else its state goes to partial[blockIdx.y][q].
template <class R, class T, int VEC>
__global__ void __launch_bounds__(512) reduce_rows_kernel(const R red, const T* __restrict__ in,
                                                           const reduce_rows_params p,
                                                           typename R::acc_type* __restrict__ partial) {
  using Acc = typename R::acc_type;
  __shared__ Acc smem[32];
  const int tpr = p.tpr;
  const int lane = static_cast<int>(threadIdx.x) % tpr;
  const int group = static_cast<int>(threadIdx.x) / tpr;
  const int groups = static_cast<int>(blockDim.x) / tpr;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * p.chunk;
  const std::int64_t r1 = r0 + p.chunk < p.red ? r0 + p.chunk : p.red;
  const std::int64_t step = static_cast<std::int64_t>(tpr) * VEC;
  const auto merge = [red](const Acc& a, const Acc& b) { return red.merge(a, b); };  // by value: no local copy of the parameter
  for (std::int64_t qb = static_cast<std::int64_t>(blockIdx.x) * groups; qb < p.outputs;
       qb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t q = qb + group;
    const bool valid = q < p.outputs;
    Acc a = red.init();
    if (valid) {
      const std::int64_t o = q / p.inner, i = q - o * p.inner;
      const T* base = in + o * p.so + i * p.si;
      std::int64_t k = r0 + static_cast<std::int64_t>(lane) * VEC;
      constexpr int U = 4;
      for (; k + (U - 1) * step + VEC <= r1; k += U * step) {
        vpack<T, VEC> v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = load_pack<VEC>(base + k + u * step);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int j = 0; j < VEC; ++j) red.combine(a, to_acc(v[u].v[j]), k + u * step + j);
      }
      for (; k < r1; k += step) {
        if (k + VEC <= r1) {
          const vpack<T, VEC> v = load_pack<VEC>(base + k);
#pragma unroll
          for (int j = 0; j < VEC; ++j) red.combine(a, to_acc(v.v[j]), k + j);
        } else {
          for (std::int64_t j = k; j < r1; ++j) red.combine(a, to_acc(base[j]), j);
        }
      }
    }
    a = group_allreduce(a, tpr, merge, smem);
    if (valid && lane == 0) {
      if (gridDim.y == 1)
        red.store(q, a, p.red);
      else
        partial[static_cast<std::int64_t>(blockIdx.y) * p.outputs + q] = a;
    }
  }
}

struct reduce_cols_params {
  std::int64_t outputs, inner, so, si, red, sr, chunk;
};

/// The column kernel: thread (x, y) of a block owns VEC consecutive outputs (contiguous in memory
/// when VEC > 1) and the reduced indices y, y + blockDim.y, ... of chunk blockIdx.y; shared memory
/// (blockDim.x * blockDim.y * VEC states, dynamic) merges the column of threads.
template <class R, class T, int VEC>
__global__ void __launch_bounds__(256) reduce_cols_kernel(const R red, const T* __restrict__ in,
                                                           const reduce_cols_params p,
                                                           typename R::acc_type* __restrict__ partial) {
  using Acc = typename R::acc_type;
  extern __shared__ __align__(16) unsigned char reduce_cols_smem[];
  Acc* smem = reinterpret_cast<Acc*>(reduce_cols_smem);
  const std::int64_t q0 = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * p.chunk;
  const std::int64_t r1 = r0 + p.chunk < p.red ? r0 + p.chunk : p.red;
  const std::int64_t st = blockDim.y;
  Acc a[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) a[j] = red.init();
  if (q0 < p.outputs) {
    const std::int64_t o = q0 / p.inner, i = q0 - o * p.inner;
    const T* base = in + o * p.so + i * p.si;
    std::int64_t k = r0 + threadIdx.y;
    if constexpr (VEC > 1) {
      for (; k + 3 * st < r1; k += 4 * st) {
        vpack<T, VEC> v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = load_pack<VEC>(base + (k + u * st) * p.sr);
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int j = 0; j < VEC; ++j) red.combine(a[j], to_acc(v[u].v[j]), k + u * st);
      }
      for (; k < r1; k += st) {
        const vpack<T, VEC> v = load_pack<VEC>(base + k * p.sr);
#pragma unroll
        for (int j = 0; j < VEC; ++j) red.combine(a[j], to_acc(v.v[j]), k);
      }
    } else {
      for (; k + 3 * st < r1; k += 4 * st) {
        T v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = base[(k + u * st) * p.sr];
#pragma unroll
        for (int u = 0; u < 4; ++u) red.combine(a[0], to_acc(v[u]), k + u * st);
      }
      for (; k < r1; k += st) red.combine(a[0], to_acc(base[k * p.sr]), k);
    }
  }
  const unsigned slot = (threadIdx.y * blockDim.x + threadIdx.x) * VEC;
#pragma unroll
  for (int j = 0; j < VEC; ++j) smem[slot + j] = a[j];
  __syncthreads();
  for (unsigned s = blockDim.y >> 1; s > 0; s >>= 1) {
    if (threadIdx.y < s) {
      const unsigned other = slot + s * blockDim.x * VEC;
#pragma unroll
      for (int j = 0; j < VEC; ++j) smem[slot + j] = red.merge(smem[slot + j], smem[other + j]);
    }
    __syncthreads();
  }
  if (threadIdx.y == 0) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const std::int64_t q = q0 + j;
      if (q >= p.outputs) break;
      if (gridDim.y == 1)
        red.store(q, smem[slot + j], p.red);
      else
        partial[static_cast<std::int64_t>(blockIdx.y) * p.outputs + q] = smem[slot + j];
    }
  }
}

/// Merges the chunks' states of each output (in chunk order) and stores it.
template <class R>
__global__ void __launch_bounds__(256) reduce_finalize_kernel(const R red, const typename R::acc_type* __restrict__ partial,
                                                               std::int64_t outputs, int splits, std::int64_t n) {
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < outputs;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    typename R::acc_type a = partial[q];
    for (int s = 1; s < splits; ++s) a = red.merge(a, partial[static_cast<std::int64_t>(s) * outputs + q]);
    red.store(q, a, n);
  }
}

/// Stores every output of an empty reduction (the reducer's identity: 0 for sums, NaN for means).
template <class R>
__global__ void __launch_bounds__(256) reduce_empty_kernel(const R red, std::int64_t outputs) {
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < outputs;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    red.store(q, red.init(), 0);
}

/// Runs the row kernel over `g` (g.sr == 1 or g.red == 1).
template <class T, class R>
void reduce_rows_launch(const R& red, const T* in, const reduce_geometry& g, device dev, cudaStream_t stream) {
  using Acc = typename R::acc_type;
  constexpr int vec = vec_elems<T>;
  const std::int64_t outputs = g.outer * g.inner;
  const bool aligned = reinterpret_cast<std::uintptr_t>(in) % 16 == 0 && (g.outer == 1 || g.so % vec == 0) &&
                       (g.inner == 1 || g.si % vec == 0) && g.red >= vec;
  const int v = aligned ? vec : 1;
  const std::int64_t nvec = (g.red + v - 1) / v;
  const int tpr = static_cast<int>(std::clamp<std::int64_t>(next_pow2((nvec + 7) / 8), 1, 512));
  const int threads = std::max(256, tpr);
  const int groups = threads / tpr;
  const std::int64_t out_blocks = (outputs + groups - 1) / groups;
  const std::int64_t wave = full_wave_blocks(threads);
  std::int64_t splits = 1, chunk = g.red;
  if (out_blocks < wave && nvec > static_cast<std::int64_t>(tpr) * 16) {
    splits = std::min<std::int64_t>({(wave + out_blocks - 1) / out_blocks, nvec / (static_cast<std::int64_t>(tpr) * 8), 65535});
    chunk = ((g.red + splits - 1) / splits + v - 1) / v * v;
    splits = (g.red + chunk - 1) / chunk;
  }
  const reduce_rows_params p{outputs, g.inner, g.so, g.si, g.red, chunk, tpr};
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(out_blocks, 1 << 30)), static_cast<unsigned>(splits));
  workspace<Acc> ws;
  if (splits > 1) ws = make_workspace<Acc>(dev, splits * outputs);
  Acc* partial = splits > 1 ? ws.get() : nullptr;
  if (v > 1)
    reduce_rows_kernel<R, T, vec><<<grid, threads, 0, stream>>>(red, in, p, partial);
  else
    reduce_rows_kernel<R, T, 1><<<grid, threads, 0, stream>>>(red, in, p, partial);
  check_launch("reduction: row kernel launch");
  if (splits > 1) {
    reduce_finalize_kernel<R><<<elementwise_grid(outputs), 256, 0, stream>>>(red, partial, outputs,
                                                                             static_cast<int>(splits), g.red);
    check_launch("reduction: finalize kernel launch");
  }
}

/// Runs the column kernel over `g` (the outputs contiguous: inner > 1 with si == 1, or inner == 1
/// with so == 1).
template <class T, class R>
void reduce_cols_launch(const R& red, const T* in, const reduce_geometry& g, device dev, cudaStream_t stream) {
  using Acc = typename R::acc_type;
  constexpr int vec = vec_elems<T>;
  const std::int64_t outputs = g.outer * g.inner;
  const bool aligned = reinterpret_cast<std::uintptr_t>(in) % 16 == 0 && outputs % vec == 0 && g.sr % vec == 0 &&
                       (g.inner > 1 ? g.inner % vec == 0 && (g.outer == 1 || g.so % vec == 0) : true);
  const int v = aligned ? vec : 1;
  const std::int64_t qvecs = (outputs + v - 1) / v;
  const int tx = static_cast<int>(std::min<std::int64_t>(32, next_pow2(qvecs)));
  const int ty = 256 / tx;
  const std::int64_t col_blocks = (qvecs + tx - 1) / tx;
  const std::int64_t wave = full_wave_blocks(256);
  std::int64_t splits = 1, chunk = g.red;
  if (col_blocks < wave && g.red > static_cast<std::int64_t>(ty) * 16) {
    splits = std::min<std::int64_t>({(wave + col_blocks - 1) / col_blocks, g.red / (static_cast<std::int64_t>(ty) * 8), 65535});
    chunk = (g.red + splits - 1) / splits;
    splits = (g.red + chunk - 1) / chunk;
  }
  const reduce_cols_params p{outputs, g.inner, g.so, g.si, g.red, g.sr, chunk};
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits));
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  CCGRAPH_CHECK(col_blocks < (std::int64_t{1} << 31), "reduction: ", outputs, " outputs are too many for one grid");
  workspace<Acc> ws;
  if (splits > 1) ws = make_workspace<Acc>(dev, splits * outputs);
  Acc* partial = splits > 1 ? ws.get() : nullptr;
  const std::size_t smem = static_cast<std::size_t>(256) * v * sizeof(Acc);
  if (v > 1) {
    auto kernel = reduce_cols_kernel<R, T, vec>;
    if (smem > 48 * 1024)
      CCGRAPH_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<grid, block, smem, stream>>>(red, in, p, partial);
  } else {
    reduce_cols_kernel<R, T, 1><<<grid, block, smem, stream>>>(red, in, p, partial);
  }
  check_launch("reduction: column kernel launch");
  if (splits > 1) {
    reduce_finalize_kernel<R><<<elementwise_grid(outputs), 256, 0, stream>>>(red, partial, outputs,
                                                                             static_cast<int>(splits), g.red);
    check_launch("reduction: finalize kernel launch");
  }
}

/// Runs reducer `red` over the device tensor `in`, reduced over `mask` (see the header comment).
template <class T, class R>
void reduce_cuda_run(const tensor<T>& in, const std::vector<bool>& mask, const R& red) {
  const shape_t& shape = in.shape();
  std::int64_t outputs = 1;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (!mask[d]) outputs *= shape[d];
  const std::int64_t n = ::ccgraph::detail::reduce_count(shape, mask);
  if (outputs == 0) return;
  const cudaStream_t stream = current_stream();
  if (n == 0) {
    reduce_empty_kernel<R><<<elementwise_grid(outputs), 256, 0, stream>>>(red, outputs);
    check_launch("reduction: empty-reduction kernel launch");
    return;
  }
  reduce_geometry g;
  const bool planned = plan_reduce(shape, in.strides(), mask, g);
  const bool rows = planned && (g.sr == 1 || g.red == 1);
  const bool cols = planned && !rows && (g.inner > 1 ? g.si == 1 : g.so == 1);
  if (rows) return reduce_rows_launch(red, in.data(), g, in.device(), stream);
  if (cols) return reduce_cols_launch(red, in.data(), g, in.device(), stream);
  // Reduced dims apart or nothing coalesced: copy as [kept..., reduced...], each group in its
  // own order (so q and the reduced index keep their meaning), then reduce rows.
  std::vector<std::int64_t> order;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (!mask[d]) order.push_back(static_cast<std::int64_t>(d));
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (mask[d]) order.push_back(static_cast<std::int64_t>(d));
  const tensor<T> packed = in.permute(order).clone();
  const reduce_geometry flat{outputs, n, 1, n, 1, 0};
  reduce_rows_launch(red, packed.data(), flat, in.device(), stream);
}

// =============================================================================================
// Backward kernels
// =============================================================================================

/// count[q] += elements of slice q that match its result (extreme_grad rules). Index sets:
/// 0 the input, 1 the result (0 along reduced dims), 2 q.
template <class T>
__global__ void __launch_bounds__(256) extreme_count_kernel(const T* __restrict__ x, const T* __restrict__ res,
                                                             unsigned long long* __restrict__ count,
                                                             const nd_index<3> ix, ::ccgraph::detail::extreme_grad mode) {
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < ix.numel;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t o[3];
    ix.offsets(e, o);
    if (::ccgraph::detail::extreme_grad_match(mode, to_acc(x[o[0]]), to_acc(res[o[1]]))) atomicAdd(count + o[2], 1ull);
  }
}

/// grad_in[e] from the counts. Index sets: 0 input, 1 result, 2 q, 3 grad.
template <class T>
__global__ void __launch_bounds__(256) extreme_grad_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                                            const T* __restrict__ res,
                                                            const unsigned long long* __restrict__ count,
                                                            T* __restrict__ dx, const nd_index<4> ix,
                                                            ::ccgraph::detail::extreme_grad mode) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < ix.numel;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t o[4];
    ix.offsets(e, o);
    const bool m = ::ccgraph::detail::extreme_grad_match(mode, to_acc(x[o[0]]), to_acc(res[o[1]]));
    dx[e] = from_acc<T>(::ccgraph::detail::extreme_grad_value(mode, static_cast<A>(to_acc(g[o[3]])),
                                                              static_cast<std::int64_t>(count[o[2]]), m));
  }
}

/// grad_in[e] = grad at e's slice when e's coordinate along dim is the slice's index, else 0.
/// Index sets: 0 grad, 1 indices, 2 the coordinate along dim. An index out of range selects
/// nothing (the forward never makes one; the CPU kernel checks).
template <class T>
__global__ void __launch_bounds__(256) max_dim_grad_kernel(const T* __restrict__ g, const std::int64_t* __restrict__ idx,
                                                            T* __restrict__ dx, const nd_index<3> ix) {
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < ix.numel;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t o[3];
    ix.offsets(e, o);
    dx[e] = idx[o[1]] == o[2] ? g[o[0]] : T(0);
  }
}

/// var's gradient. Index sets: 0 input, 1 grad, 2 q (into `mean`).
template <class T, class A>
__global__ void __launch_bounds__(256) var_grad_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                                        const A* __restrict__ mean, T* __restrict__ dx,
                                                        const nd_index<3> ix, A scale, bool degenerate) {
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < ix.numel;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t o[3];
    ix.offsets(e, o);
    dx[e] = from_acc<T>(::ccgraph::detail::var_grad_value(static_cast<A>(to_acc(g[o[1]])), static_cast<A>(to_acc(x[o[0]])),
                                                          mean[o[2]], scale, degenerate));
  }
}

}  // namespace ccgraph::cuda::detail

namespace ccgraph::detail {

// =============================================================================================
// The CUDA kernels of the reductions: same signatures as the _cpu ones, device tensors
// =============================================================================================

/// sum(in, dims, keepdim) on the GPU (see sum_cpu).
template <class T>
void sum_cuda(const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim, const tensor<sum_t<T>>& out) {
  const std::vector<bool> mask = reduce_mask(in.shape(), dims, "sum");
  check_input("sum", "input", in, false);
  check_output("sum", "output", out, reduce_shape(in.shape(), mask, keepdim), false);
  cuda::detail::reduce_cuda_run(in, mask, sum_reducer<gpu_acc_t<T>, sum_t<T>>{out.data()});
}

/// mean(in, dims, keepdim) on the GPU (see mean_cpu).
template <class T>
void mean_cuda(const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& out) {
  (void)mean_meta({dtype_v<T>, in.shape()}, dims, keepdim);
  if constexpr (is_floating_element_v<T>) {
    const std::vector<bool> mask = reduce_mask(in.shape(), dims, "mean");
    check_input("mean", "input", in, false);
    check_output("mean", "output", out, reduce_shape(in.shape(), mask, keepdim), false);
    cuda::detail::reduce_cuda_run(in, mask, mean_reducer<gpu_acc_t<T>, T>{out.data()});
  }
}

/// var(in, dims, correction, keepdim) on the GPU (see var_cpu).
template <class T>
void var_cuda(const tensor<T>& in, const std::vector<std::int64_t>& dims, double correction, bool keepdim,
              const tensor<T>& out) {
  (void)var_meta({dtype_v<T>, in.shape()}, dims, correction, keepdim);
  if constexpr (is_floating_element_v<T>) {
    using A = gpu_acc_t<T>;
    const std::vector<bool> mask = reduce_mask(in.shape(), dims, "var");
    check_input("var", "input", in, false);
    check_output("var", "output", out, reduce_shape(in.shape(), mask, keepdim), false);
    cuda::detail::reduce_cuda_run(in, mask, var_reducer<A, T>{out.data(), static_cast<A>(correction)});
  }
}

/// amax (Max) / amin on the GPU.
template <bool Max, class T>
void extreme_cuda(const char* what, const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim,
                  const tensor<T>& out) {
  const tensor_meta m = amax_meta({dtype_v<T>, in.shape()}, dims, keepdim, what);
  check_input(what, "input", in, false);
  check_output(what, "output", out, m.shape, false);
  cuda::detail::reduce_cuda_run(in, reduce_mask(in.shape(), dims, what), extreme_reducer<compute_t<T>, T, Max>{out.data()});
}
/// amax(in, dims, keepdim) on the GPU.
template <class T>
void amax_cuda(const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& out) {
  extreme_cuda<true>("amax", in, dims, keepdim, out);
}
/// amin(in, dims, keepdim) on the GPU.
template <class T>
void amin_cuda(const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& out) {
  extreme_cuda<false>("amin", in, dims, keepdim, out);
}

/// max(in) / min(in) over every element on the GPU.
template <bool Max, class T>
void extreme_all_cuda(const tensor<T>& in, const tensor<T>& out) {
  const char* what = Max ? "max" : "min";
  (void)max_all_meta({dtype_v<T>, in.shape()}, what);
  check_input(what, "input", in, false);
  check_output(what, "output", out, {}, false);
  cuda::detail::reduce_cuda_run(in, std::vector<bool>(in.shape().size(), true),
                                extreme_reducer<compute_t<T>, T, Max>{out.data()});
}
/// max(in) on the GPU.
template <class T>
void max_cuda(const tensor<T>& in, const tensor<T>& out) {
  extreme_all_cuda<true>(in, out);
}
/// min(in) on the GPU.
template <class T>
void min_cuda(const tensor<T>& in, const tensor<T>& out) {
  extreme_all_cuda<false>(in, out);
}

/// max(in, dim) / min(in, dim) on the GPU.
template <bool Max, class T>
void extreme_dim_cuda(const tensor<T>& in, std::int64_t dim, bool keepdim, const tensor<T>& values,
                      const tensor<std::int64_t>& indices) {
  const char* what = Max ? "max" : "min";
  const auto m = max_dim_meta({dtype_v<T>, in.shape()}, dim, keepdim, what);
  check_input(what, "input", in, false);
  check_output(what, "values", values, m[0].shape, false);
  check_output(what, "indices", indices, m[1].shape, false);
  cuda::detail::reduce_cuda_run(in, reduce_mask(in.shape(), {dim}, what),
                                arg_reducer<compute_t<T>, T, Max>{values.data(), indices.data()});
}
/// max(in, dim, keepdim) on the GPU: values and first indices.
template <class T>
void max_dim_cuda(const tensor<T>& in, std::int64_t dim, bool keepdim, const tensor<T>& values,
                  const tensor<std::int64_t>& indices) {
  extreme_dim_cuda<true>(in, dim, keepdim, values, indices);
}
/// min(in, dim, keepdim) on the GPU: values and first indices.
template <class T>
void min_dim_cuda(const tensor<T>& in, std::int64_t dim, bool keepdim, const tensor<T>& values,
                  const tensor<std::int64_t>& indices) {
  extreme_dim_cuda<false>(in, dim, keepdim, values, indices);
}

/// argmax (Max) / argmin on the GPU.
template <bool Max, class T>
void arg_cuda(const tensor<T>& in, std::optional<std::int64_t> dim, bool keepdim, const tensor<std::int64_t>& out) {
  const char* what = Max ? "argmax" : "argmin";
  const tensor_meta m = argmax_meta({dtype_v<T>, in.shape()}, dim, keepdim, what);
  check_input(what, "input", in, false);
  check_output(what, "output", out, m.shape, false);
  cuda::detail::reduce_cuda_run(in, arg_mask(in.shape(), dim, what), arg_reducer<compute_t<T>, T, Max>{nullptr, out.data()});
}
/// argmax(in, dim, keepdim) on the GPU.
template <class T>
void argmax_cuda(const tensor<T>& in, std::optional<std::int64_t> dim, bool keepdim, const tensor<std::int64_t>& out) {
  arg_cuda<true>(in, dim, keepdim, out);
}
/// argmin(in, dim, keepdim) on the GPU.
template <class T>
void argmin_cuda(const tensor<T>& in, std::optional<std::int64_t> dim, bool keepdim, const tensor<std::int64_t>& out) {
  arg_cuda<false>(in, dim, keepdim, out);
}

/// extreme_backward_cpu on the GPU.
template <class T>
void extreme_backward_cuda(extreme_grad mode, const tensor<T>& grad, const tensor<T>& in, const tensor<T>& result,
                           const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& grad_in) {
  namespace cd = cuda::detail;
  static_assert(is_floating_element_v<T>, "extreme_backward_cuda: gradients need a floating type");
  const char* what = mode == extreme_grad::by_count ? "amax_backward" : "max_backward";
  const std::vector<bool> mask = extreme_backward_mask(what, in.shape(), grad.shape(), result.shape(), dims, keepdim);
  check_input(what, "grad", grad, false);
  check_input(what, "input", in, false);
  check_input(what, "result", result, false);
  check_output(what, "grad_input", grad_in, in.shape(), false);
  if (in.numel() == 0) return;
  const strides_t gs = restore_reduced_strides(grad.strides(), mask, keepdim);
  const strides_t rs = restore_reduced_strides(result.strides(), mask, keepdim);
  const strides_t qs = subspace_strides(in.shape(), mask, false);
  const std::int64_t outputs = numel_of(reduce_shape(in.shape(), mask, false));
  const cudaStream_t stream = cuda::current_stream();
  auto count = cd::make_workspace<unsigned long long>(in.device(), outputs);
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(count.get(), 0, static_cast<std::size_t>(outputs) * sizeof(unsigned long long), stream));
  const auto i3 = cd::make_nd_index<3>(in.shape(), {in.strides(), rs, qs}, what);
  const auto i4 = cd::make_nd_index<4>(in.shape(), {in.strides(), rs, qs, gs}, what);
  cd::extreme_count_kernel<T><<<cd::elementwise_grid(in.numel()), 256, 0, stream>>>(in.data(), result.data(), count.get(), i3, mode);
  cd::check_launch("amax_backward: count kernel launch");
  cd::extreme_grad_kernel<T><<<cd::elementwise_grid(in.numel()), 256, 0, stream>>>(grad.data(), in.data(), result.data(),
                                                                                 count.get(), grad_in.data(), i4, mode);
  cd::check_launch("amax_backward: gradient kernel launch");
}

/// amax_backward_cpu on the GPU.
template <class T>
void amax_backward_cuda(const tensor<T>& grad, const tensor<T>& in, const tensor<T>& result,
                        const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& grad_in) {
  extreme_backward_cuda(extreme_grad::by_count, grad, in, result, dims, keepdim, grad_in);
}

/// max_backward_cpu on the GPU.
template <class T>
void max_backward_cuda(const tensor<T>& grad, const tensor<T>& in, const tensor<T>& result, const tensor<T>& grad_in) {
  extreme_backward_cuda(extreme_grad::nan_matches, grad, in, result, {}, false, grad_in);
}

/// max_dim_backward_cpu on the GPU.
template <class T>
void max_dim_backward_cuda(const tensor<T>& grad, const tensor<std::int64_t>& indices, std::int64_t dim, bool keepdim,
                           const tensor<T>& grad_in) {
  namespace cd = cuda::detail;
  const shape_t& in_shape = grad_in.shape();
  const int d = max_dim_backward_check(in_shape, grad.shape(), indices.shape(), dim, keepdim);
  check_input("max_backward", "grad", grad, false);
  check_input("max_backward", "indices", indices, false);
  check_output("max_backward", "grad_input", grad_in, in_shape, false);
  if (grad_in.numel() == 0) return;
  std::vector<bool> mask(in_shape.size(), false);
  if (!in_shape.empty()) mask[static_cast<std::size_t>(d)] = true;
  const strides_t gs = restore_reduced_strides(grad.strides(), mask, keepdim);
  const strides_t is = restore_reduced_strides(indices.strides(), mask, keepdim);
  const strides_t red = subspace_strides(in_shape, mask, true);
  const auto ix = cd::make_nd_index<3>(in_shape, {gs, is, red}, "max_backward");
  const cudaStream_t stream = cuda::current_stream();
  cd::max_dim_grad_kernel<T><<<cd::elementwise_grid(grad_in.numel()), 256, 0, stream>>>(grad.data(), indices.data(),
                                                                                       grad_in.data(), ix);
  cd::check_launch("max_backward: kernel launch");
}

/// var_backward_cpu on the GPU.
template <class T>
void var_backward_cuda(const tensor<T>& grad, const tensor<T>& in, const std::vector<std::int64_t>& dims,
                       double correction, bool keepdim, const tensor<T>& grad_in) {
  namespace cd = cuda::detail;
  static_assert(is_floating_element_v<T>, "var_backward_cuda: gradients need a floating type");
  using A = gpu_acc_t<T>;
  const std::vector<bool> mask = reduce_mask(in.shape(), dims, "var_backward");
  const shape_t s = reduce_shape(in.shape(), mask, keepdim);
  CCGRAPH_CHECK(grad.shape() == s, "var_backward: grad of shape ", shape_str(grad.shape()),
                " must have the reduced shape ", shape_str(s), " of input ", shape_str(in.shape()));
  check_input("var_backward", "grad", grad, false);
  check_input("var_backward", "input", in, false);
  check_output("var_backward", "grad_input", grad_in, in.shape(), false);
  if (in.numel() == 0) return;
  const std::int64_t outputs = numel_of(reduce_shape(in.shape(), mask, false));
  auto mean = cd::make_workspace<A>(in.device(), outputs);
  cd::reduce_cuda_run(in, mask, mean_reducer<A, A>{mean.get()});
  const var_grad_scale sc = var_backward_scale(in.shape(), mask, dims.empty() || in.shape().empty(), correction);
  const strides_t gs = restore_reduced_strides(grad.strides(), mask, keepdim);
  const strides_t qs = subspace_strides(in.shape(), mask, false);
  const auto ix = cd::make_nd_index<3>(in.shape(), {in.strides(), gs, qs}, "var_backward");
  const cudaStream_t stream = cuda::current_stream();
  cd::var_grad_kernel<T, A><<<cd::elementwise_grid(in.numel()), 256, 0, stream>>>(
      grad.data(), in.data(), mean.get(), grad_in.data(), ix, static_cast<A>(sc.scale), sc.degenerate);
  cd::check_launch("var_backward: kernel launch");
}

}  // namespace ccgraph::detail

// =============================================================================================
// The graph ops' CUDA runs (ops/reduction_ops.hpp): each op's run_with with its `_cuda` kernel
// =============================================================================================

/// Defines cuda_impl<ops::OP>: op_traits<ops::OP>::run_with (the outputs and the dtype dispatch
/// the CPU run uses) calling `kernel` (a `_cuda` function) instead of the `_cpu` one. Used by
/// <ccgraph/cuda/normalization.cuh> and <ccgraph/cuda/loss.cuh> too.
#define CCGRAPH_CUDA_IMPL_VIA(OP, kernel)                                                        \
  template <>                                                                                  \
  struct cuda_impl<ops::OP> {                                                                  \
    template <class Args = run_args> /* compiled only where installed */                       \
    static std::vector<any_tensor> run(const ops::OP& o, const Args& a) {                      \
      return op_traits<ops::OP>::run_with(o, a, [](const auto&... xs) { kernel(xs...); });     \
    }                                                                                          \
  };

namespace ccgraph {
CCGRAPH_CUDA_IMPL_VIA(sum, detail::sum_cuda)
CCGRAPH_CUDA_IMPL_VIA(mean, detail::mean_cuda)
CCGRAPH_CUDA_IMPL_VIA(var, detail::var_cuda)
CCGRAPH_CUDA_IMPL_VIA(amax, detail::amax_cuda)
CCGRAPH_CUDA_IMPL_VIA(amin, detail::amin_cuda)
CCGRAPH_CUDA_IMPL_VIA(max, detail::max_cuda)
CCGRAPH_CUDA_IMPL_VIA(min, detail::min_cuda)
CCGRAPH_CUDA_IMPL_VIA(max_dim, detail::max_dim_cuda)
CCGRAPH_CUDA_IMPL_VIA(min_dim, detail::min_dim_cuda)
CCGRAPH_CUDA_IMPL_VIA(argmax, detail::argmax_cuda)
CCGRAPH_CUDA_IMPL_VIA(argmin, detail::argmin_cuda)
CCGRAPH_CUDA_IMPL_VIA(amax_backward, detail::amax_backward_cuda)
CCGRAPH_CUDA_IMPL_VIA(max_backward, detail::max_backward_cuda)
CCGRAPH_CUDA_IMPL_VIA(max_dim_backward, detail::max_dim_backward_cuda)
CCGRAPH_CUDA_IMPL_VIA(var_backward, detail::var_backward_cuda)
}  // namespace ccgraph
