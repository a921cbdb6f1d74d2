// embedding (and its backward), index_select, gather and scatter_add on the GPU
// (ccgraph/cuda/index.cuh), and cat / stack / split of device tensors, against the CPU kernels
// (ccgraph/ops/index_ops.hpp, checked against loops in tests/ops/test_index_ops.cpp) on the
// same random inputs: copies exactly, embedding_backward bit for bit (deterministic),
// scatter_add within the rounding of a reordered float sum (integers exactly). Skipped without
// a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"
#include "op_test.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_index_ops {

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace index_gpu_test {

using i64 = std::int64_t;

/// Random indices in [lo, hi] of `shape` on the host.
template <class I>
cg::tensor<I> random_index(cg::shape_t shape, i64 lo, i64 hi, std::uint64_t seed) {
  auto t = cg::uniform<double>(shape, 0, 1, seed);
  std::vector<I> v;
  for (double x : t.to_vector()) v.push_back(static_cast<I>(lo + static_cast<i64>(x * static_cast<double>(hi - lo + 1))));
  return cg::tensor<I>::from(v, shape);
}

template <class T, class I>
void check_embedding(i64 V, i64 D, cg::shape_t idx_shape, bool strided_table) {
  CAPTURE(V);
  CAPTURE(D);
  auto table = strided_table ? cg::uniform<T>({V, D + 3}, -2, 2, 1).narrow(1, 1, D) : cg::uniform<T>({V, D}, -2, 2, 1);
  auto idx = random_index<I>(idx_shape, 0, V - 1, 2);
  cg::shape_t out_shape = idx_shape;
  out_shape.push_back(D);
  auto want = cg::tensor<T>::empty(out_shape);
  cg::detail::embedding_cpu(idx, table, want);
  auto got = device_poisoned<T>(out_shape);
  cg::detail::embedding_cuda(idx.cuda(0), device_view(table), got);
  check_bitwise(got, want, "embedding");
}

template <class T, class I>
void check_embedding_backward(i64 V, i64 D, i64 N, std::optional<i64> padding_idx, i64 hot) {
  CAPTURE(V);
  CAPTURE(D);
  CAPTURE(N);
  auto idx = random_index<I>({N}, 0, V - 1, 3);
  // A heavily repeated index (a frequent token) and the padding index mixed in.
  for (i64 i = 0; i < N; i += 3) idx.at({i}) = static_cast<I>(hot);
  if (padding_idx)
    for (i64 i = 1; i < N; i += 7) idx.at({i}) = static_cast<I>(*padding_idx < 0 ? *padding_idx + V : *padding_idx);
  auto grad = cg::uniform<T>({N, D}, -1, 1, 4);
  auto want = cg::tensor<T>::empty({V, D});
  cg::detail::embedding_backward_cpu(grad, idx, padding_idx, want);
  auto got = device_poisoned<T>({V, D});
  cg::detail::embedding_backward_cuda(grad.cuda(0), idx.cuda(0), padding_idx, got);
  check_bitwise(got, want, "embedding_backward (same additions in the same order)");
}

template <class T>
void check_gather_scatter(double atol, double rtol) {
  auto input = cg::uniform<T>({6, 7, 5}, -3, 3, 1);
  for (i64 dim : {0, 1, 2, -1}) {
    CAPTURE(dim);
    const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
    cg::shape_t is{4, 5, 3};
    is[static_cast<std::size_t>(d)] = 9;
    auto index = random_index<std::int64_t>({is[2], is[1], is[0]}, 0, input.shape()[static_cast<std::size_t>(d)] - 1,
                                            5 + static_cast<std::uint64_t>(d))
                     .permute({2, 1, 0});  // strided
    auto want = cg::tensor<T>::empty(is);
    cg::detail::gather_cpu(input, dim, index, want);
    auto got = device_poisoned<T>(is);
    cg::detail::gather_cuda(input.cuda(0), dim, device_view(index), got);
    check_bitwise(got, want, "gather");
    // scatter_add of a src at least as large as the index, into self (the input).
    auto src = cg::uniform<T>({is[0] + 1, is[1], is[2] + 2}, -2, 2, 9);
    const i64 size = input.shape()[static_cast<std::size_t>(d)];
    auto sidx = random_index<std::int64_t>(is, 0, size - 1, 11);
    auto swant = cg::tensor<T>::empty(input.shape());
    cg::detail::scatter_add_cpu(input, dim, sidx, src, swant);
    auto sgot = device_poisoned<T>(input.shape());
    cg::detail::scatter_add_cuda(input.cuda(0), dim, sidx.cuda(0), src.cuda(0), sgot);
    check_close(sgot, swant, atol, rtol, "scatter_add");
  }
}

}  // namespace index_gpu_test

using namespace index_gpu_test;

GPU_TEST_CASE("embedding.cuda.copies_rows") {
  // Row lengths of 16-, 8-, 4- and 2-byte units, and a strided table.
  check_embedding<float, std::int64_t>(100, 64, {4, 33}, false);
  check_embedding<float, std::int32_t>(17, 3, {50}, false);
  check_embedding<cg::bf16, std::int64_t>(1000, 4096, {2, 8}, false);
  check_embedding<cg::bf16, std::int32_t>(31, 5, {3, 3, 3}, false);
  check_embedding<cg::f16, std::int64_t>(31, 6, {7}, true);
  check_embedding<double, std::int64_t>(9, 10, {4, 4}, true);
  check_embedding<float, std::int64_t>(9, 10, {}, false);  // 0-d indices
}

GPU_TEST_CASE("embedding_backward.cuda.bitwise_equal_to_cpu") {
  check_embedding_backward<float, std::int64_t>(50, 33, 2000, std::nullopt, 7);
  check_embedding_backward<float, std::int32_t>(1000, 128, 4096, 0, 999);
  check_embedding_backward<cg::bf16, std::int64_t>(300, 256, 3000, -1, 5);
  check_embedding_backward<cg::f16, std::int32_t>(40, 7, 500, 3, 2);
  check_embedding_backward<double, std::int64_t>(2, 5, 100, std::nullopt, 1);
  // No indices: all zeros.
  auto got = device_poisoned<float>({4, 3});
  cg::detail::embedding_backward_cuda(cg::tensor<float>::empty({0, 3}, cg::device::cuda(0)),
                                      cg::tensor<std::int64_t>::empty({0}, cg::device::cuda(0)), std::nullopt, got);
  for (float x : got.to_vector()) CHECK(x == 0.f);
}

GPU_TEST_CASE("index_select.cuda.every_dim") {
  auto input = cg::uniform<cg::bf16>({5, 6, 7}, -1, 1, 1);
  for (i64 dim : {0, 1, 2, -2}) {
    CAPTURE(dim);
    const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
    auto idx = random_index<std::int32_t>({11}, 0, input.shape()[static_cast<std::size_t>(d)] - 1, 2);
    const auto shape = cg::detail::index_select_shape(input.shape(), dim, idx.shape(), cg::dtype::i32);
    auto want = cg::tensor<cg::bf16>::empty(shape);
    cg::detail::index_select_cpu(input, dim, idx, want);
    auto got = device_poisoned<cg::bf16>(shape);
    cg::detail::index_select_cuda(input.cuda(0), dim, idx.cuda(0), got);
    check_bitwise(got, want, "index_select");
  }
  // A strided device input (copied) and int64 indices.
  auto base = cg::uniform<float>({7, 5}, -1, 1, 3);
  auto idx = cg::tensor<std::int64_t>::from({4, 0, 4}, {3});
  auto want = cg::tensor<float>::empty({5, 3});
  cg::detail::index_select_cpu(base.transpose(0, 1), 1, idx, want);
  auto got = device_poisoned<float>({5, 3});
  cg::detail::index_select_cuda(base.cuda(0).transpose(0, 1), 1, idx.cuda(0), got);
  check_bitwise(got, want, "index_select strided");
}

GPU_TEST_CASE("gather_scatter_add.cuda.f32") { check_gather_scatter<float>(1e-5, 1e-5); }
GPU_TEST_CASE("gather_scatter_add.cuda.f64") { check_gather_scatter<double>(1e-12, 1e-12); }
GPU_TEST_CASE("gather_scatter_add.cuda.bf16") { check_gather_scatter<cg::bf16>(1e-2, 8e-3); }
GPU_TEST_CASE("gather_scatter_add.cuda.f16") { check_gather_scatter<cg::f16>(2e-3, 1e-3); }
GPU_TEST_CASE("gather_scatter_add.cuda.integers_exact") {
  check_gather_scatter<std::int32_t>(0, 0);
  check_gather_scatter<std::int64_t>(0, 0);
  check_gather_scatter<std::uint8_t>(0, 0);
}

GPU_TEST_CASE("scatter_add.cuda.bf16.accumulates_in_float") {
  auto self = cg::zeros<cg::bf16>({2}).cuda(0);
  auto index = cg::full<std::int64_t>({300}, 1).cuda(0);
  auto src = cg::ones<cg::bf16>({300}).cuda(0);
  auto out = device_poisoned<cg::bf16>({2});
  cg::detail::scatter_add_cuda(self, 0, index, src, out);
  const auto v = out.to_vector();
  CHECK(static_cast<float>(v[1]) == 300.f);
  CHECK(static_cast<float>(v[0]) == 0.f);
}

GPU_TEST_CASE("cat_stack_split.cuda") {
  auto a = device_uniform<float>({3, 4}, -1, 1, 1);
  auto b = device_uniform<float>({3, 2}, -1, 1, 2);
  const auto c = cg::cat({a, b.contiguous()}, 1);
  CHECK(c.device() == cg::device::cuda(0));
  check_bitwise(c, cg::cat({a.cpu(), b.cpu()}, 1), "cat");
  const auto s = cg::stack({a, a.transpose(0, 1).contiguous().transpose(0, 1)}, 1);
  check_bitwise(s, cg::stack({a.cpu(), a.cpu()}, 1), "stack");
  const auto pieces = cg::split(c, std::vector<std::int64_t>{4, 2}, 1);
  REQUIRE(pieces.size() == 2);
  check_bitwise(pieces[1].contiguous(), b, "split");
}

GPU_TEST_CASE("index_ops.cuda.errors") {
  auto w = device_uniform<float>({5, 3}, -1, 1, 1);
  auto idx = cg::tensor<std::int64_t>::from({1, 2}, {2});
  auto out = device_poisoned<float>({2, 3});
  CHECK(op_contains(op_error_of([&] { cg::detail::embedding_cuda(idx, w, out); }),
                    "embedding: tensors on cuda:0 and cpu"));
  auto wrong = device_poisoned<float>({2, 4});
  CHECK(op_contains(op_error_of([&] { cg::detail::embedding_cuda(idx.cuda(0), w, wrong); }),
                    "embedding: output of shape [2, 4] for a result of shape [2, 3]"));
  auto host = cg::tensor<float>::empty({2, 3});
  CHECK(op_contains(op_error_of([&] { cg::detail::embedding_cuda(idx, w.cpu(), host); }), "not a CUDA device"));
}
}  // namespace gpu_test_index_ops
