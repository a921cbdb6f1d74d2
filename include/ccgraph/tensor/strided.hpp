// ccgraph/tensor/strided.hpp: loops over strided index spaces, shared by views, copies and kernels.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/shape.hpp>

namespace ccgraph::detail {

/// Calls `f(offsets)` once per element of `shape`, in row-major order, where offsets[k] is the
/// element's offset under strides[k]. The innermost dimension runs as a plain loop, so strided
/// copies cost one increment per operand per element.
template <std::size_t N, class F>
void for_each_offset(const shape_t& shape, const std::array<const strides_t*, N>& strides, F&& f) {
  const std::size_t rank = shape.size();
  for (auto s : shape)
    if (s == 0) return;
  std::array<std::int64_t, N> off{};
  if (rank == 0) {
    f(off);
    return;
  }
  std::vector<std::int64_t> idx(rank, 0);
  const std::int64_t inner = shape[rank - 1];
  std::array<std::int64_t, N> inner_stride{};
  for (std::size_t k = 0; k < N; ++k) inner_stride[k] = (*strides[k])[rank - 1];
  while (true) {
    std::array<std::int64_t, N> o = off;
    for (std::int64_t i = 0; i < inner; ++i) {
      f(o);
      for (std::size_t k = 0; k < N; ++k) o[k] += inner_stride[k];
    }
    // Advance the outer index (odometer), updating offsets incrementally.
    std::size_t d = rank - 1;
    while (true) {
      if (d == 0) return;
      --d;
      ++idx[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += (*strides[k])[d];
      if (idx[d] < shape[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= (*strides[k])[d] * shape[d];
      idx[d] = 0;
    }
  }
}

/// Converts between element types the way PyTorch's `.to()` does: halves through float, bool
/// as "not zero".
template <class To, class From>
CCGRAPH_HOST_DEVICE To cast(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(v) != compute_t<From>(0);
  } else if constexpr (std::is_same_v<From, bf16> || std::is_same_v<From, f16>) {
    return cast<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bf16> || std::is_same_v<To, f16>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace ccgraph::detail
