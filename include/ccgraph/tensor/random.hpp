// ccgraph/tensor/random.hpp: seeded random tensors, for tests and benchmarks that must never run
// on zeros.
#pragma once

#include <cstdint>
#include <random>

#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

/// A tensor of values drawn uniformly from [lo, hi) (integers: [lo, hi] rounded down; bool: a
/// fair coin), reproducible from `seed`.
template <element T>
tensor<T> uniform(shape_t shape, double lo = -1.0, double hi = 1.0, std::uint64_t seed = 0) {
  auto t = tensor<T>::empty(std::move(shape), device::cpu(), "uniform");  // drawn on the host, then moved
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  T* d = t.data_unsynced();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double v = dist(gen);
    if constexpr (std::is_same_v<T, bool>)
      d[i] = v >= (lo + hi) / 2;
    else if constexpr (std::is_integral_v<T>)
      d[i] = static_cast<T>(static_cast<std::int64_t>(std::floor(v)));  // u8 from -1.: wraps, not UB
    else
      d[i] = detail::cast<T>(v);
  }
  return default_device().is_cpu() ? t : t.to(default_device());
}

}  // namespace ccgraph
