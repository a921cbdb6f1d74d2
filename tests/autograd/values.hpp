// tests/autograd/values.hpp: the deterministic values the autograd tests differentiate and
// train on, defined once (the test files are compiled in batches, several to one translation
// unit, so each file's own copy would be defined twice).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <ccgraph/core/shape.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph_test {

/// A double tensor of `shape` with values spread over [lo, hi) by golden-ratio steps: no two
/// neighbours alike, the same for the same seed on every rank.
inline ccgraph::tensor<double> spread_values(const ccgraph::shape_t& shape, double lo, double hi, int seed) {
  const std::int64_t n = ccgraph::numel_of(shape);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = lo + (hi - lo) * std::fmod(0.6180339887 * double(i * 7 + seed * 13 + 3), 1.0);
  return ccgraph::tensor<double>::from(v, shape);
}

}  // namespace ccgraph_test
