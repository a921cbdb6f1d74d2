// tests/gpu/op_test.hpp: what the GPU tests of the op kernels share (index, attention,
// linear): random host tensors moved to the device, and element-wise comparisons of a device
// result with the CPU kernel's, with per-dtype tolerances and the first mismatches reported.
#pragma once

#include <ccgraph/cuda.hpp>
#include <ccgraph/tensor/random.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace ccgraph_test {

/// Whether `part` occurs in `s`.
inline bool op_contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The message of the ccgraph::error that `f` throws, or "" when it throws none.
template <class F>
std::string op_error_of(F&& f) {
  try {
    f();
  } catch (const ccgraph::error& e) {
    return e.what();
  }
  return "";
}

/// `v` as a double (bf16/f16 through float).
template <class T>
double op_to_d(T v) {
  return static_cast<double>(static_cast<ccgraph::compute_t<T>>(v));
}

/// A host tensor of uniform values in [lo, hi), copied to GPU 0 (contiguous).
template <class T>
ccgraph::tensor<T> device_uniform(ccgraph::shape_t shape, double lo, double hi, std::uint64_t seed) {
  return ccgraph::uniform<T>(std::move(shape), lo, hi, seed).cuda(0);
}

/// A host tensor's view with the same shape, strides and offset on GPU 0 (its whole storage
/// is copied), so that device kernels see strided and misaligned layouts too.
template <class T>
ccgraph::tensor<T> device_view(const ccgraph::tensor<T>& host) {
  const auto& st = host.storage();
  const auto elems = static_cast<std::int64_t>(st->bytes() / sizeof(T));
  const ccgraph::tensor<T> whole(st, {elems}, {1}, 0);
  const auto dev = whole.cuda(0);
  return ccgraph::tensor<T>(dev.storage(), host.shape(), host.strides(), host.storage_offset());
}

/// An empty (uninitialised: filled with 0xFF bytes, NaN for floats) tensor on GPU 0.
template <class T>
ccgraph::tensor<T> device_poisoned(ccgraph::shape_t shape) {
  auto t = ccgraph::tensor<T>::empty(std::move(shape), ccgraph::device::cuda(0));
  if (t.numel() > 0) CCGRAPH_CHECK_CUDA(cudaMemsetAsync(t.data(), 0xFF, static_cast<std::size_t>(t.numel()) * sizeof(T),
                                                        ccgraph::cuda::current_stream()));
  return t;
}

/// Checks |got - want| <= atol + rtol |want| element-wise (NaN only where want is NaN; equal
/// infinities), reporting the first five mismatches. `what` names the comparison.
template <class T, class U>
void check_close(const ccgraph::tensor<T>& got, const ccgraph::tensor<U>& want, double atol, double rtol,
                 const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector();
  const auto w = want.to_vector();
  int bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double a = op_to_d(g[i]), b = op_to_d(w[i]);
    bool ok;
    if (std::isnan(b))
      ok = std::isnan(a);
    else if (std::isinf(b))
      ok = a == b;
    else
      ok = std::abs(a - b) <= atol + rtol * std::abs(b);
    if (!ok) {
      worst = std::max(worst, std::isnan(a) ? INFINITY : std::abs(a - b));
      if (++bad <= 5) {
        CAPTURE(i);
        CAPTURE(a);
        CAPTURE(b);
        CHECK(ok);
      }
    }
  }
  CAPTURE(worst);
  CHECK(bad == 0);
}

/// Checks that two tensors hold the same bits.
template <class T>
void check_bitwise(const ccgraph::tensor<T>& got, const ccgraph::tensor<T>& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector();
  const auto w = want.to_vector();
  int bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (std::memcmp(&g[i], &w[i], sizeof(T)) != 0 && ++bad <= 5) {
      CAPTURE(i);
      CAPTURE(op_to_d(g[i]));
      CAPTURE(op_to_d(w[i]));
      CHECK(false);
    }
  CHECK(bad == 0);
}

}  // namespace ccgraph_test
