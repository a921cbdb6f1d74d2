// ccgraph/tensor/kernel_tree.hpp: the leaves of element-wise kernel trees, and the launch of a
// tree on a device. Expressions (expr.hpp) build trees of these; tensor copies, fills and casts
// use them directly, so one device kernel serves every element-wise op.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/device.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/tensor/device_runtime.hpp>
#include <ccgraph/tensor/strided.hpp>

namespace ccgraph::detail {

// Kernel trees: an expression with every tensor replaced by a raw pointer. They are small
// trivially copyable structs with host/device members, so the CPU loops and a CUDA kernel
// evaluate the very same tree. `load(offsets, i)` reads tensor leaf I at offsets[I] + i: the
// flat path passes zero offsets and the flat index, the row path each row's start offsets and
// the index in the row, the general strided path each element's offsets and 0.

//
// The flat device kernel (every operand laid out like the output) evaluates V consecutive
// elements at once through `load_pack<V, Vec>(i)`: each leaf loads its V elements together
// (Vec: as 16-byte vectors, when `aligned16()` said every leaf allows it) before any op uses
// them. Evaluated once per element instead, the tree's loads interleave with its ops and few
// are in flight; a per-leaf alignment test would be a branch between them that keeps the
// compiler from issuing a later leaf's load before an earlier leaf's arithmetic. The strided
// kernel does the same through `load_pack_off<V, Vec>(offsets)` (leaf I's elements offsets[I],
// ..., offsets[I] + V - 1) when every operand's innermost dim is contiguous.

/// V consecutive elements of one kernel-tree value (16-byte aligned, for vector loads).
template <class T, int V>
struct alignas(16) elem_pack {
  T v[V];
};

/// True when `p` may be read with 16-byte vector loads.
CCGRAPH_HOST_DEVICE inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// Loads p[0], ..., p[V-1]: as 16-byte vectors on a device when Vec (the caller checked that p
/// is 16-byte aligned) and the pack is a whole number of vectors, else element by element.
template <int V, bool Vec, class T>
CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack_at(const T* p) {
  elem_pack<T, V> r;
#if defined(__CUDA_ARCH__)
  if constexpr (Vec && V * sizeof(T) % 16 == 0) {
#pragma unroll
    for (std::size_t j = 0; j < V * sizeof(T) / 16; ++j)
      reinterpret_cast<uint4*>(r.v)[j] = reinterpret_cast<const uint4*>(p)[j];
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = p[j];
  }
#else
  for (int j = 0; j < V; ++j) r.v[j] = p[j];
#endif
  return r;
}

/// x with each element converted to T (as the scalar path's return converts it).
template <class T, class R, int V>
CCGRAPH_HOST_DEVICE elem_pack<T, V> to_pack(const elem_pack<R, V>& x) {
  if constexpr (std::is_same_v<T, R>) {
    return x;
  } else {
    elem_pack<T, V> r;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < V; ++j) r.v[j] = x.v[j];
    return r;
  }
}

/// A pack of V copies of v.
template <int V, class T>
CCGRAPH_HOST_DEVICE elem_pack<T, V> fill_pack(T v) {
  elem_pack<T, V> r;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < V; ++j) r.v[j] = v;
  return r;
}

/// Kernel leaf for tensor operand number I (outputs take index 0, so leaves start at 1).
template <class T, std::size_t I>
struct tensor_kernel {
  const T* p;
  CCGRAPH_HOST_DEVICE T load(const std::int64_t* offsets, std::int64_t i) const { return p[offsets[I] + i]; }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(std::int64_t i) const { return load_pack_at<V, Vec>(p + i); }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack_off(const std::int64_t* offsets) const {
    return load_pack_at<V, Vec>(p + offsets[I]);
  }
  CCGRAPH_HOST_DEVICE bool aligned16() const { return ::ccgraph::detail::aligned16(p); }
};

/// Kernel leaf for a scalar operand.
template <class T>
struct scalar_kernel {
  T v;
  CCGRAPH_HOST_DEVICE T load(const std::int64_t*, std::int64_t) const { return v; }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(std::int64_t) const { return fill_pack<V>(v); }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack_off(const std::int64_t*) const { return fill_pack<V>(v); }
  CCGRAPH_HOST_DEVICE bool aligned16() const { return true; }
};

/// Kernel node converting its operand to U (tensor::to<U>, copies between element types).
template <class U, class K>
struct cast_kernel {
  K a;
  CCGRAPH_HOST_DEVICE U load(const std::int64_t* o, std::int64_t i) const { return cast<U>(a.load(o, i)); }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<U, V> load_pack(std::int64_t i) const {
    return cast_pack(a.template load_pack<V, Vec>(i));
  }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<U, V> load_pack_off(const std::int64_t* o) const {
    return cast_pack(a.template load_pack_off<V, Vec>(o));
  }
  template <class R, int V>
  CCGRAPH_HOST_DEVICE static elem_pack<U, V> cast_pack(const elem_pack<R, V>& x) {
    elem_pack<U, V> r;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < V; ++j) r.v[j] = cast<U>(x.v[j]);
    return r;
  }
  CCGRAPH_HOST_DEVICE bool aligned16() const { return a.aligned16(); }
};

/// Runs kernel tree `k` over `shape` on `dev`, writing `out` (strides[0]) from N-1 tensor
/// operands (strides[1..]); `what` names the op in errors. The kernel itself comes from
/// <ccgraph/cuda/pointwise.cuh>, so the calling translation unit must be compiled by nvcc.
template <class K, class T, std::size_t N>
void launch_device_pointwise(const char* what, device dev, const K& k, T* out, const shape_t& shape,
                             const std::array<strides_t, N>& strides) {
  if constexpr (has_device_pointwise<K, T, N>) {
    (void)require_device_runtime(what, dev);
    CCGRAPH_CHECK(shape.size() <= static_cast<std::size_t>(max_device_dims), what, ": shape ",
                  shape_str(shape), " has more than ", max_device_dims, " dimensions on ", dev);
    device_layout<N> layout;
    layout.ndim = static_cast<int>(shape.size());
    layout.numel = numel_of(shape);
    const strides_t contiguous = contiguous_strides(shape);
    for (std::size_t d = 0; d < shape.size(); ++d) {
      layout.shape[d] = shape[d];
      for (std::size_t j = 0; j < N; ++j) {
        layout.strides[j][d] = strides[j][d];
        // A dimension of size 1 is never stepped along, so its stride does not matter.
        if (shape[d] != 1 && strides[j][d] != contiguous[d]) layout.flat = false;
      }
    }
    if (layout.numel == 0) return;
    device_pointwise<K, T, N>::run(k, out, layout);
  } else {
    (void)k, (void)out, (void)strides;
    CCGRAPH_THROW(error, what, ": tensor of shape ", shape_str(shape), " on ", dev,
                  " needs a device kernel: compile this translation unit with nvcc and include "
                  "<ccgraph/cuda.hpp>");
  }
}

}  // namespace ccgraph::detail
