// tests/gpu/reduction_gpu_support.hpp: what the GPU tests of the reduction, normalization and loss
// kernels share: the same random input on the host and on the GPU (contiguous, strided or
// misaligned views built by the same view ops on both), device outputs, and the host
// comparison helpers of tests/ops/reduction_support.hpp.
#pragma once

#include <ccgraph/cuda.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../ops/reduction_support.hpp"

namespace ccgraph_test::red {

/// How a test input is laid out in memory.
enum class layout { contiguous, strided, misaligned };

inline const char* layout_name(layout l) {
  switch (l) {
    case layout::contiguous: return "contiguous";
    case layout::strided: return "strided";
    case layout::misaligned: return "misaligned";
  }
  return "?";
}

/// The same random values of `shape` on the host and on GPU 0, laid out as `l` on both:
/// strided = the dims of a larger tensor reversed and narrowed (see rnd_strided); misaligned =
/// contiguous but starting one element into its allocation (no 16-byte alignment).
template <class T>
std::pair<cg::tensor<T>, cg::tensor<T>> host_and_device(const cg::shape_t& shape, std::uint64_t seed, layout l,
                                                        double lo = -2.0, double hi = 2.0) {
  const cg::device gpu = cg::device::cuda(0);
  if (l == layout::contiguous || shape.empty()) {
    const auto h = rnd<T>(shape, seed, lo, hi);
    return {h, h.to(gpu)};
  }
  if (l == layout::misaligned) {
    const auto base = rnd<T>({cg::numel_of(shape) + 1}, seed, lo, hi);
    const auto d = base.to(gpu);
    return {base.narrow(0, 1, cg::numel_of(shape)).reshape(shape), d.narrow(0, 1, cg::numel_of(shape)).view(shape)};
  }
  cg::shape_t rev(shape.rbegin(), shape.rend());
  rev.back() += 3;
  const auto base = rnd<T>(rev, seed, lo, hi);
  const auto dbase = base.to(gpu);
  std::vector<std::int64_t> order;
  for (std::size_t d = shape.size(); d-- > 0;) order.push_back(static_cast<std::int64_t>(d));
  return {base.permute(order).narrow(0, 2, shape[0]), dbase.permute(order).narrow(0, 2, shape[0])};
}

/// An uninitialised tensor on GPU 0.
template <class T>
cg::tensor<T> dev_empty(const cg::shape_t& shape) {
  return cg::tensor<T>::empty(shape, cg::device::cuda(0));
}

/// Compares a device result with the host kernel's (see check_close).
template <class T, class U>
void check_gpu(const cg::tensor<T>& gpu, const cg::tensor<U>& cpu, double atol, double rtol, const std::string& what) {
  check_same(gpu.cpu(), cpu, atol, rtol, what);
}

}  // namespace ccgraph_test::red
