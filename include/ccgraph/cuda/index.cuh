// ccgraph/cuda/index.cuh: the CUDA kernels of ccgraph/ops/index_ops.hpp (embedding and its
// backward, index_select, gather, scatter_add), same signatures as the CPU kernels with `_cuda`,
// queued on the calling thread's current stream.
//
//  - index_select and embedding: one kernel copying rows by index, in the widest unit (up to 16
//    bytes) that the row length and the pointers allow.
//  - gather: one thread per output element, any strides.
//  - scatter_add: one thread per source element adding with atomics into the output (f32, f64,
//    i32, i64), or into a float (bf16, f16) / int32 (u8) copy rounded once at the end. Floating-
//    point sums therefore depend on the order the atomics land in: results may differ in their
//    last bits from run to run and from the CPU (like PyTorch's CUDA scatter_add, which
//    torch.use_deterministic_algorithms rejects for that reason). Integer sums are exact.
//  - embedding_backward is deterministic instead (a training step must be reproducible): the
//    indices are sorted with their positions (CUB's stable radix sort), and one block per
//    distinct index sums its rows of grad in position order in float; the same additions in
//    the same order as embedding_backward_cpu, so the two agree bit for bit.
// An index out of range stops the kernel with a message (printf) and a trap, like PyTorch's
// device-side assert: the error surfaces at the next synchronisation as a CUDA error and the
// context is unusable afterwards. Nothing is written past a tensor.
//
// Compile with nvcc: <ccgraph/cuda.hpp> includes this header only under nvcc.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/index.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/element.cuh>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/pointwise.cuh>  // contiguous copies of strided device inputs
#include <ccgraph/cuda/runtime.hpp>
#include <ccgraph/ops/index_ops.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <type_traits>

namespace ccgraph::cuda::detail {

/// Threads per block of the index kernels.
inline constexpr int index_block_threads = 256;

/// Grid for `n` items, one per thread, at most `max_blocks` (the kernels loop grid-stride).
inline unsigned index_grid(long long n) {
  const long long blocks = (n + index_block_threads - 1) / index_block_threads;
  return static_cast<unsigned>(std::clamp<long long>(blocks, 1, 1 << 20));
}

/// Reports an index out of range and stops the kernel (see the top of this file).
__device__ __noinline__ inline void index_out_of_range(const char* what, long long i, long long size) {
  printf("ccgraph %s: index %lld is out of bounds for size %lld\n", what, i, size);
  __trap();
}

inline void index_check_launch(const char* what, const char* file, int line) {
  const cudaError_t st = cudaGetLastError();
  if (st != cudaSuccess) throw_cuda_error(st, what, file, line);
}

// ---- index_select / embedding: rows by index -----------------------------------------------

/// out[o][j][:] = in[o][index[j]][:] for `outer` blocks of `size` rows of `inner` units U (a
/// unit is 1 to 16 bytes: rows are plain bytes to this kernel). N is the type the index
/// arithmetic runs in: 32-bit division is several times cheaper than 64-bit.
template <class U, class I, class N>
__global__ void __launch_bounds__(index_block_threads)
    index_rows_kernel(const U* __restrict__ in, const I* __restrict__ index, U* __restrict__ out, N outer, N size,
                      N n, N inner, const char* what) {
  const N total = outer * n * inner;
  for (N i = static_cast<N>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += static_cast<N>(gridDim.x) * blockDim.x) {
    const N k = i % inner, rest = i / inner;
    const N j = rest % n, o = rest / n;
    const long long r = static_cast<long long>(index[j]);
    if (r < 0 || r >= static_cast<long long>(size)) index_out_of_range(what, r, static_cast<long long>(size));
    out[i] = in[(static_cast<long long>(o) * static_cast<long long>(size) + r) * static_cast<long long>(inner) + k];
  }
}

// ---- gather / scatter_add: element by index, any strides ------------------------------------

/// The index tensor's shape (innermost first) and, per dim, the strides of the index and of
/// two more operands (a: the one `dim` indexes, its stride along dim zeroed; b: the other).
struct index_layout {
  int ndim = 0;
  long long numel = 0;
  long long shape[::ccgraph::detail::max_device_dims] = {};
  long long st_index[::ccgraph::detail::max_device_dims] = {};
  long long st_a[::ccgraph::detail::max_device_dims] = {};
  long long st_b[::ccgraph::detail::max_device_dims] = {};
  long long dim_stride = 0;  ///< a's stride along dim
  long long dim_size = 0;    ///< a's size along dim (the bound of the index values)
};

/// The offsets of element `i` of the index's shape in the index and operands a and b; N is the
/// type the divisions run in (32-bit where the shape allows: several times cheaper).
template <class N>
__device__ __forceinline__ void index_offsets(const index_layout& p, N i, long long& oi, long long& oa, long long& ob) {
  oi = oa = ob = 0;
#pragma unroll
  for (int d = 0; d < ::ccgraph::detail::max_device_dims; ++d) {
    if (d >= p.ndim) break;
    const N size = static_cast<N>(p.shape[d]);
    const N q = i / size;
    const long long c = static_cast<long long>(i - q * size);
    i = q;
    oi += c * p.st_index[d];
    oa += c * p.st_a[d];
    ob += c * p.st_b[d];
  }
}

/// gather: out (b, contiguous) [i] = input (a) [at index along dim].
template <class T, class N>
__global__ void __launch_bounds__(index_block_threads)
    gather_kernel(const T* __restrict__ in, const long long* __restrict__ index, T* __restrict__ out,
                  const index_layout p) {
  for (N i = static_cast<N>(blockIdx.x) * blockDim.x + threadIdx.x; i < static_cast<N>(p.numel);
       i += static_cast<N>(gridDim.x) * blockDim.x) {
    long long oi, oa, ob;
    index_offsets<N>(p, i, oi, oa, ob);
    const long long r = index[oi];
    if (r < 0 || r >= p.dim_size) index_out_of_range("gather", r, p.dim_size);
    out[ob] = in[oa + r * p.dim_stride];
  }
}

/// atomicAdd for the accumulation types of scatter_add.
template <class A>
__device__ __forceinline__ void index_atomic_add(A* p, A v) {
  if constexpr (std::is_same_v<A, long long> || std::is_same_v<A, std::int64_t>)
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  else
    atomicAdd(p, v);
}

/// scatter_add: acc (a) [at index along dim] += src (b) [i], atomically.
template <class A, class T, class N>
__global__ void __launch_bounds__(index_block_threads)
    scatter_add_kernel(A* acc, const long long* __restrict__ index, const T* __restrict__ src, const index_layout p) {
  for (N i = static_cast<N>(blockIdx.x) * blockDim.x + threadIdx.x; i < static_cast<N>(p.numel);
       i += static_cast<N>(gridDim.x) * blockDim.x) {
    long long oi, oa, ob;
    index_offsets<N>(p, i, oi, oa, ob);
    const long long r = index[oi];
    if (r < 0 || r >= p.dim_size) index_out_of_range("scatter_add", r, p.dim_size);
    index_atomic_add(acc + oa + r * p.dim_stride, device_load<A>(src + ob));
  }
}

/// out[i] = To(in[i]) over n contiguous elements.
template <class To, class From>
__global__ void __launch_bounds__(index_block_threads) index_convert_kernel(To* out, const From* in, long long n) {
  using C = std::conditional_t<std::is_floating_point_v<To> || std::is_floating_point_v<From> ||
                                   std::is_same_v<To, ::ccgraph::bf16> || std::is_same_v<To, ::ccgraph::f16> ||
                                   std::is_same_v<From, ::ccgraph::bf16> || std::is_same_v<From, ::ccgraph::f16>,
                               float, long long>;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] = device_value<To>(device_load<C>(in + i));
}

// ---- embedding backward: sorted, deterministic ---------------------------------------------

/// keys[i] = index[i] (checked against num_weights), positions[i] = i.
template <class I>
__global__ void __launch_bounds__(index_block_threads)
    embedding_keys_kernel(const I* __restrict__ index, int* __restrict__ keys, int* __restrict__ positions, long long n,
                          long long num_weights) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = static_cast<long long>(index[i]);
    if (r < 0 || r >= num_weights) index_out_of_range("embedding_backward", r, num_weights);
    keys[i] = static_cast<int>(r);
    positions[i] = static_cast<int>(i);
  }
}

/// Block s starts a run of equal sorted keys (or returns): it writes that table row, the sum of
/// the grad rows at the run's positions (ascending: the radix sort is stable), in A.
template <class T, class A>
__global__ void __launch_bounds__(index_block_threads)
    embedding_backward_rows_kernel(const T* __restrict__ grad, const int* __restrict__ keys,
                                   const int* __restrict__ positions, T* __restrict__ grad_weight, long long n,
                                   long long dim, long long padding_idx) {
  const long long s = blockIdx.x;
  const int key = keys[s];
  if (s > 0 && keys[s - 1] == key) return;
  if (key == padding_idx) return;  // its row keeps the zeros it was cleared to
  long long end = s + 1;
  while (end < n && keys[end] == key) ++end;
  for (long long c = threadIdx.x; c < dim; c += blockDim.x) {
    A acc = 0;
    for (long long j = s; j < end; ++j) acc += device_load<A>(grad + static_cast<long long>(positions[j]) * dim + c);
    grad_weight[static_cast<long long>(key) * dim + c] = device_value<T>(acc);
  }
}

}  // namespace ccgraph::cuda::detail

namespace ccgraph::detail {

/// The device type that scatter_add accumulates T in: float for bf16/f16, int32 for u8 (no
/// byte atomics; the sum wraps the same), long long for i64, T otherwise.
template <class T>
using scatter_acc_t = std::conditional_t<
    std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float,
    std::conditional_t<std::is_same_v<T, std::uint8_t>, int,
                       std::conditional_t<std::is_same_v<T, std::int64_t>, long long, T>>>;

/// Copies rows of `in` (contiguous [outer, size, inner]) picked by `index` (contiguous, n) into
/// `out` (contiguous [outer, n, inner]), in 16-, 8-, 4- or 2-byte units where row length and
/// alignment allow.
template <element T, index_element I>
void index_rows_cuda(const T* in, const I* index, T* out, std::int64_t outer, std::int64_t size, std::int64_t n,
                     std::int64_t inner, const char* what) {
  namespace cd = ::ccgraph::cuda::detail;
  const std::int64_t total_bytes = outer * n * inner * static_cast<std::int64_t>(sizeof(T));
  if (total_bytes == 0) return;
  const std::int64_t row_bytes = inner * static_cast<std::int64_t>(sizeof(T));
  const auto addr_bits = reinterpret_cast<std::uintptr_t>(in) | reinterpret_cast<std::uintptr_t>(out);
  int unit = 16;
  while (unit > static_cast<int>(sizeof(T)) && (row_bytes % unit != 0 || addr_bits % static_cast<unsigned>(unit) != 0))
    unit /= 2;
  const cudaStream_t stream = ::ccgraph::cuda::current_stream();
  const std::int64_t units = row_bytes / unit;
  const unsigned blocks = cd::index_grid(outer * n * units);
  // 32-bit index arithmetic when every index fits (with room for the grid-stride step).
  const bool narrow = outer * n * units < (std::int64_t{1} << 31) && size < (std::int64_t{1} << 31);
  auto run = [&](auto* u) {
    using U = std::remove_pointer_t<decltype(u)>;
    if (narrow)
      cd::index_rows_kernel<U, I, unsigned><<<blocks, cd::index_block_threads, 0, stream>>>(
          reinterpret_cast<const U*>(in), index, reinterpret_cast<U*>(out), static_cast<unsigned>(outer),
          static_cast<unsigned>(size), static_cast<unsigned>(n), static_cast<unsigned>(units), what);
    else
      cd::index_rows_kernel<U, I, unsigned long long><<<blocks, cd::index_block_threads, 0, stream>>>(
          reinterpret_cast<const U*>(in), index, reinterpret_cast<U*>(out), static_cast<unsigned long long>(outer),
          static_cast<unsigned long long>(size), static_cast<unsigned long long>(n),
          static_cast<unsigned long long>(units), what);
  };
  switch (unit) {
    case 16: run(static_cast<uint4*>(nullptr)); break;
    case 8: run(static_cast<uint2*>(nullptr)); break;
    case 4: run(static_cast<unsigned*>(nullptr)); break;
    case 2: run(static_cast<unsigned short*>(nullptr)); break;
    default: run(static_cast<unsigned char*>(nullptr)); break;
  }
  cd::index_check_launch(what, __FILE__, __LINE__);
}

/// index_select on a CUDA device; same contract as index_select_cpu (an index out of range
/// traps: see the top of this file).
template <element T, index_element I>
void index_select_cuda(const tensor<T>& input, std::int64_t dim, const tensor<I>& index, const tensor<T>& out) {
  const shape_t shape = index_select_shape(input.shape(), dim, index.shape(), dtype_v<I>);
  check_kernel_output(out, shape, "index_select");
  const device dev = out.device();
  CCGRAPH_CHECK(dev.is_cuda(), "index_select: output on ", dev, ", not a CUDA device");
  check_same_device("index_select", dev, {input.device(), index.device()});
  const cuda::detail::device_scope on_device(dev.index);
  const int d = index_op_dim(dim, input.dim(), "index_select");
  const tensor<T> in = nonempty_view(input).contiguous();
  const tensor<I> ix = index.contiguous();
  const shape_t& s = in.shape();
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= s[static_cast<std::size_t>(i)];
  for (std::size_t i = static_cast<std::size_t>(d) + 1; i < s.size(); ++i) inner *= s[i];
  index_rows_cuda(in.data(), ix.data(), out.data(), outer, s[static_cast<std::size_t>(d)], ix.numel(), inner,
                  "index_select");
}

/// embedding on a CUDA device; same contract as embedding_cpu (an index out of range traps).
template <element T, index_element I>
void embedding_cuda(const tensor<I>& indices, const tensor<T>& weight, const tensor<T>& out) {
  const shape_t shape = embedding_shape(indices.shape(), dtype_v<I>, weight.shape());
  check_kernel_output(out, shape, "embedding");
  const device dev = out.device();
  CCGRAPH_CHECK(dev.is_cuda(), "embedding: output on ", dev, ", not a CUDA device");
  check_same_device("embedding", dev, {indices.device(), weight.device()});
  const cuda::detail::device_scope on_device(dev.index);
  const tensor<T> w = weight.contiguous();
  const tensor<I> ix = indices.contiguous();
  index_rows_cuda(w.data(), ix.data(), out.data(), 1, w.shape()[0], ix.numel(), w.shape()[1], "embedding");
}

/// embedding's backward on a CUDA device; same contract as embedding_backward_cpu and the same
/// bits (deterministic: see the top of this file). Indices and rows are counted in int32.
template <element T, index_element I>
void embedding_backward_cuda(const tensor<T>& grad, const tensor<I>& indices, std::optional<std::int64_t> padding_idx,
                             const tensor<T>& grad_weight) {
  namespace cd = ::ccgraph::cuda::detail;
  static_assert(std::is_floating_point_v<compute_t<T>>,
                "embedding_backward: gradients are floating point (f32, f64, bf16, f16)");
  constexpr const char* what = "embedding_backward";
  CCGRAPH_CHECK(grad_weight.dim() == 2, what, ": grad_weight must be 2-D, got shape ", shape_str(grad_weight.shape()));
  const std::int64_t num_weights = grad_weight.shape()[0];
  const shape_t shape = embedding_backward_shape(grad.shape(), indices.shape(), dtype_v<I>, num_weights, padding_idx);
  check_kernel_output(grad_weight, shape, what, "grad_weight");
  const device dev = grad_weight.device();
  CCGRAPH_CHECK(dev.is_cuda(), what, ": grad_weight on ", dev, ", not a CUDA device");
  check_same_device(what, dev, {grad.device(), indices.device()});
  const std::int64_t pad = embedding_padding_idx(padding_idx, num_weights);
  const std::int64_t n = indices.numel(), dim = shape[1];
  CCGRAPH_CHECK(n < (std::int64_t{1} << 31) && num_weights < (std::int64_t{1} << 31), what, ": ", n,
                " indices into ", num_weights, " rows; at most 2^31 - 1 of each on CUDA");
  const cuda::detail::device_scope on_device(dev.index);
  const cudaStream_t stream = ::ccgraph::cuda::current_stream();
  T* gw = grad_weight.data();
  if (numel_of(shape) > 0)
    CCGRAPH_CHECK_CUDA(cudaMemsetAsync(gw, 0, static_cast<std::size_t>(numel_of(shape)) * sizeof(T), stream));
  if (n == 0 || dim == 0) return;
  const tensor<T> g = grad.reshape({n, dim}).contiguous();
  const tensor<I> ix = indices.contiguous();
  const int end_bit = std::max(1, static_cast<int>(std::bit_width(static_cast<std::uint64_t>(std::max<std::int64_t>(num_weights - 1, 1)))));
  std::size_t temp_bytes = 0;
  CCGRAPH_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int*>(nullptr),
                                                     static_cast<int*>(nullptr), static_cast<const int*>(nullptr),
                                                     static_cast<int*>(nullptr), static_cast<std::int64_t>(n), 0, end_bit,
                                                     stream));
  // CUB's scratch first (the allocation is 256-byte aligned), then keys and positions, in and out.
  const std::int64_t temp_ints = static_cast<std::int64_t>((temp_bytes + 255) / 256 * 256 / sizeof(int));
  const tensor<std::int32_t> scratch = tensor<std::int32_t>::empty({temp_ints + 4 * n}, dev);
  void* temp = scratch.data();
  int* keys_in = scratch.data() + temp_ints;
  int* pos_in = keys_in + n;
  int* keys_out = pos_in + n;
  int* pos_out = keys_out + n;
  cd::embedding_keys_kernel<I><<<cd::index_grid(n), cd::index_block_threads, 0, stream>>>(ix.data(), keys_in, pos_in, n,
                                                                                        num_weights);
  cd::index_check_launch("embedding_backward: keys kernel launch", __FILE__, __LINE__);
  CCGRAPH_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, pos_in, pos_out,
                                                     static_cast<std::int64_t>(n), 0, end_bit, stream));
  cd::embedding_backward_rows_kernel<T, compute_t<T>>
      <<<static_cast<unsigned>(n), 128, 0, stream>>>(g.data(), keys_out, pos_out, gw, n, dim, pad);
  cd::index_check_launch("embedding_backward: rows kernel launch", __FILE__, __LINE__);
}

/// The index_layout of gather/scatter_add over `index`'s shape: operand a (indexed along `d`),
/// operand b (read or written at the index's own coordinates).
inline ::ccgraph::cuda::detail::index_layout index_layout_of(const shape_t& index_shape, const strides_t& index_strides,
                                                             const shape_t& a_shape, const strides_t& a_strides,
                                                             const strides_t& b_strides, int d, const char* what) {
  ::ccgraph::cuda::detail::index_layout p;
  CCGRAPH_CHECK(index_shape.size() <= static_cast<std::size_t>(max_device_dims), what, ": index of shape ",
                shape_str(index_shape), " has more than ", max_device_dims, " dimensions on CUDA");
  p.ndim = static_cast<int>(index_shape.size());
  p.numel = numel_of(index_shape);
  for (int i = 0; i < p.ndim; ++i) {
    const auto src = static_cast<std::size_t>(p.ndim - 1 - i);  // innermost first
    p.shape[i] = index_shape[src];
    p.st_index[i] = index_strides[src];
    p.st_a[i] = static_cast<int>(src) == d ? 0 : a_strides[src];
    p.st_b[i] = b_strides[src];
  }
  p.dim_stride = a_strides[static_cast<std::size_t>(d)];
  p.dim_size = a_shape[static_cast<std::size_t>(d)];
  return p;
}

/// gather on a CUDA device; same contract as gather_cpu (an index out of range traps).
template <element T>
void gather_cuda(const tensor<T>& input, std::int64_t dim, const tensor<std::int64_t>& index, const tensor<T>& out) {
  namespace cd = ::ccgraph::cuda::detail;
  const shape_t shape = gather_shape(input.shape(), dim, index.shape(), dtype::i64);
  check_kernel_output(out, shape, "gather");
  const device dev = out.device();
  CCGRAPH_CHECK(dev.is_cuda(), "gather: output on ", dev, ", not a CUDA device");
  check_same_device("gather", dev, {input.device(), index.device()});
  if (numel_of(shape) == 0) return;
  const cuda::detail::device_scope on_device(dev.index);
  const int d = index_op_dim(dim, input.dim(), "gather");
  const tensor<T> in = nonempty_view(input);
  const tensor<std::int64_t> ix = nonempty_view(index);
  const tensor<T> o = nonempty_view(out);
  const cd::index_layout p = index_layout_of(ix.shape(), ix.strides(), in.shape(), in.strides(), o.strides(), d, "gather");
  const cudaStream_t stream = ::ccgraph::cuda::current_stream();
  if (p.numel < (std::int64_t{1} << 31))
    cd::gather_kernel<T, unsigned><<<cd::index_grid(p.numel), cd::index_block_threads, 0, stream>>>(
        in.data(), reinterpret_cast<const long long*>(ix.data()), o.data(), p);
  else
    cd::gather_kernel<T, unsigned long long><<<cd::index_grid(p.numel), cd::index_block_threads, 0, stream>>>(
        in.data(), reinterpret_cast<const long long*>(ix.data()), o.data(), p);
  cd::index_check_launch("gather: kernel launch", __FILE__, __LINE__);
}

/// scatter_add on a CUDA device; same contract as scatter_add_cpu except for the order of the
/// floating-point additions (atomics: see the top of this file). An index out of range traps.
template <element T>
void scatter_add_cuda(const tensor<T>& self, std::int64_t dim, const tensor<std::int64_t>& index, const tensor<T>& src,
                      const tensor<T>& out) {
  namespace cd = ::ccgraph::cuda::detail;
  static_assert(!std::is_same_v<T, bool>, "scatter_add: bool tensors are not supported; convert with .to<U>()");
  const shape_t shape = scatter_add_shape(self.shape(), dim, index.shape(), dtype::i64, src.shape(), dtype_v<T>,
                                          dtype_v<T>);
  check_kernel_output(out, shape, "scatter_add");
  const device dev = out.device();
  CCGRAPH_CHECK(dev.is_cuda(), "scatter_add: output on ", dev, ", not a CUDA device");
  check_same_device("scatter_add", dev, {self.device(), index.device(), src.device()});
  const cuda::detail::device_scope on_device(dev.index);
  const cudaStream_t stream = ::ccgraph::cuda::current_stream();
  const int d = index_op_dim(dim, self.dim(), "scatter_add");
  using A = scatter_acc_t<T>;
  const std::int64_t n = numel_of(shape);
  if (n == 0) return;
  // The accumulator: out itself, or a wider copy of self.
  tensor<T> o = nonempty_view(out);
  tensor<std::uint8_t> wide;  // keeps the A buffer alive
  A* acc = nullptr;
  if constexpr (std::is_same_v<A, T> || sizeof(A) == sizeof(T)) {
    tensor<T>(o).copy_(nonempty_view(self));  // copy_ reads any strides and orders itself on the stream
    acc = reinterpret_cast<A*>(o.data());
  } else {
    const tensor<T> s = self.contiguous();
    wide = tensor<std::uint8_t>::empty({n * static_cast<std::int64_t>(sizeof(A))}, dev);
    acc = reinterpret_cast<A*>(wide.data());
    cd::index_convert_kernel<A, T><<<cd::index_grid(n), cd::index_block_threads, 0, stream>>>(acc, s.data(), n);
    cd::index_check_launch("scatter_add: conversion kernel launch", __FILE__, __LINE__);
  }
  const tensor<std::int64_t> ix = nonempty_view(index);
  const tensor<T> sr = nonempty_view(src);
  const cd::index_layout p = index_layout_of(ix.shape(), ix.strides(), o.shape(), o.strides(), sr.strides(), d, "scatter_add");
  if (p.numel > 0) {
    if (p.numel < (std::int64_t{1} << 31))
      cd::scatter_add_kernel<A, T, unsigned><<<cd::index_grid(p.numel), cd::index_block_threads, 0, stream>>>(
          acc, reinterpret_cast<const long long*>(ix.data()), sr.data(), p);
    else
      cd::scatter_add_kernel<A, T, unsigned long long><<<cd::index_grid(p.numel), cd::index_block_threads, 0, stream>>>(
          acc, reinterpret_cast<const long long*>(ix.data()), sr.data(), p);
    cd::index_check_launch("scatter_add: kernel launch", __FILE__, __LINE__);
  }
  if constexpr (!(std::is_same_v<A, T> || sizeof(A) == sizeof(T))) {
    cd::index_convert_kernel<T, A><<<cd::index_grid(n), cd::index_block_threads, 0, stream>>>(o.data(), acc, n);
    cd::index_check_launch("scatter_add: conversion kernel launch", __FILE__, __LINE__);
  }
}

}  // namespace ccgraph::detail

// ---- the graph ops' CUDA runs (ops::embedding, ... in ops/index_ops.hpp) ------------------------

namespace ccgraph {
namespace detail {
/// The CUDA kernels, for index_op_runs (the dispatch the CPU run shares).
struct index_cuda_kernels {
  template <class... A>
  static void embedding(const A&... a) { embedding_cuda(a...); }
  template <class... A>
  static void embedding_backward(const A&... a) { embedding_backward_cuda(a...); }
  template <class... A>
  static void index_select(const A&... a) { index_select_cuda(a...); }
  template <class... A>
  static void gather(const A&... a) { gather_cuda(a...); }
  template <class... A>
  static void scatter_add(const A&... a) { scatter_add_cuda(a...); }
};
}  // namespace detail

template <>
struct cuda_impl<ops::embedding> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::embedding& o, const Args& a) { return detail::index_op_runs<detail::index_cuda_kernels>::run(o, a); }
};
template <>
struct cuda_impl<ops::embedding_backward> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::embedding_backward& o, const Args& a) { return detail::index_op_runs<detail::index_cuda_kernels>::run(o, a); }
};
template <>
struct cuda_impl<ops::index_select> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::index_select& o, const Args& a) { return detail::index_op_runs<detail::index_cuda_kernels>::run(o, a); }
};
template <>
struct cuda_impl<ops::gather> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::gather& o, const Args& a) { return detail::index_op_runs<detail::index_cuda_kernels>::run(o, a); }
};
template <>
struct cuda_impl<ops::scatter_add> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::scatter_add& o, const Args& a) { return detail::index_op_runs<detail::index_cuda_kernels>::run(o, a); }
};

}  // namespace ccgraph
