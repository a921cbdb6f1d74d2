// tests/ops/test_index_ops.cpp: embedding (and its backward), index_select, gather and
// scatter_add (ccgraph/ops/index_ops.hpp): the shape functions' errors, and the CPU kernels
// against references written here with plain loops (double precision), for every element type,
// strided inputs, negative dims and 0-d tensors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <ccgraph/ops/index_ops.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace index_ops_test {

using i64 = std::int64_t;

/// Random indices in [lo, hi] of shape `shape`.
template <class I>
cg::tensor<I> random_index(cg::shape_t shape, i64 lo, i64 hi, std::uint64_t seed) {
  auto t = cg::uniform<double>(shape, 0, 1, seed);
  std::vector<I> v;
  for (double x : t.to_vector()) v.push_back(static_cast<I>(lo + static_cast<i64>(x * static_cast<double>(hi - lo + 1))));
  return cg::tensor<I>::from(v, shape);
}

/// Row-major coordinates of linear index `i` in `shape`.
inline std::vector<i64> coords(i64 i, const cg::shape_t& shape) {
  std::vector<i64> c(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    c[d] = i % shape[d];
    i /= shape[d];
  }
  return c;
}

/// Linear row-major index of `c` in `shape`.
inline i64 linear(const std::vector<i64>& c, const cg::shape_t& shape) {
  i64 i = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + c[d];
  return i;
}

template <class T>
double tol() {
  if constexpr (std::is_same_v<T, cg::bf16>) return 1.0 / 128;
  if constexpr (std::is_same_v<T, cg::f16>) return 1.0 / 1024;
  if constexpr (std::is_same_v<T, float>) return 1e-6;
  return 1e-13;
}

template <class T, class I>
void check_embedding() {
  auto weight = cg::uniform<T>({11, 6}, -2, 2, 1);
  auto idx = random_index<I>({3, 5}, 0, 10, 2);
  auto out = cg::tensor<T>::empty(cg::detail::embedding_shape(idx.shape(), cg::dtype_v<I>, weight.shape()));
  REQUIRE(out.shape() == cg::shape_t{3, 5, 6});
  cg::detail::embedding_cpu(idx, weight, out);
  const auto iv = idx.to_vector();
  for (i64 r = 0; r < 15; ++r)
    for (i64 c = 0; c < 6; ++c)
      CHECK(out.at({r / 5, r % 5, c}) == weight.at({static_cast<i64>(iv[static_cast<std::size_t>(r)]), c}));
  // A transposed index view and a strided (column-sliced) table.
  auto wide = cg::uniform<T>({11, 9}, -2, 2, 3);
  const auto wn = wide.narrow(1, 2, 6);
  const auto it = idx.transpose(0, 1);  // [5, 3]
  auto out2 = cg::tensor<T>::empty({5, 3, 6});
  cg::detail::embedding_cpu(it, wn, out2);
  for (i64 a = 0; a < 5; ++a)
    for (i64 b = 0; b < 3; ++b)
      for (i64 c = 0; c < 6; ++c) CHECK(out2.at({a, b, c}) == wide.at({static_cast<i64>(it.at({a, b})), c + 2}));
}

template <class T, class I>
void check_embedding_backward(std::optional<i64> padding_idx) {
  const i64 V = 7, D = 5;
  auto idx = random_index<I>({4, 6}, 0, V - 1, 11);
  auto grad = cg::uniform<T>({4, 6, D}, -1, 1, 12);
  auto gw = cg::tensor<T>::empty({V, D});
  gw.fill_(T(99));  // every element must be written
  cg::detail::embedding_backward_cpu(grad, idx, padding_idx, gw);
  const i64 pad = padding_idx ? (*padding_idx < 0 ? *padding_idx + V : *padding_idx) : -1;
  std::vector<double> ref(static_cast<std::size_t>(V * D), 0.0), scale(ref.size(), 0.0);
  const auto iv = idx.to_vector();
  const auto gv = grad.to_vector();
  for (std::size_t n = 0; n < iv.size(); ++n) {
    const i64 r = static_cast<i64>(iv[n]);
    if (r == pad) continue;
    for (i64 c = 0; c < D; ++c) {
      ref[static_cast<std::size_t>(r * D + c)] += to_d(gv[n * D + static_cast<std::size_t>(c)]);
      scale[static_cast<std::size_t>(r * D + c)] += std::abs(to_d(gv[n * D + static_cast<std::size_t>(c)]));
    }
  }
  const auto ov = gw.to_vector();
  for (std::size_t i = 0; i < ref.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(to_d(ov[i]) - ref[i]) <= tol<T>() * (scale[i] + 1e-30));
    if (static_cast<i64>(i) / D == pad) CHECK(to_d(ov[i]) == 0.0);
  }
}

}  // namespace index_ops_test

// The test cases live in the namespace too: in a unity batch, a using-directive would reach
// the next file and make helpers of the same name (tol, ...) ambiguous.
namespace index_ops_test {

TEST_CASE("embedding.shape_and_errors") {
  using cg::detail::embedding_shape;
  CHECK(embedding_shape({2, 3}, cg::dtype::i64, {10, 4}) == cg::shape_t{2, 3, 4});
  CHECK(embedding_shape({}, cg::dtype::i32, {10, 4}) == cg::shape_t{4});
  CHECK(contains(error_of([] { (void)embedding_shape({2}, cg::dtype::f32, {10, 4}); }),
                 "embedding: expected an index tensor of dtype i64 or i32, got f32"));
  CHECK(contains(error_of([] { (void)embedding_shape({2}, cg::dtype::i64, {10}); }),
                 "embedding: weight must be 2-D [num_embeddings, embedding_dim], got shape [10]"));
  CHECK(contains(error_of([] { (void)embedding_shape({2}, cg::dtype::i64, {10, 4}, 10); }),
                 "embedding: padding_idx 10 must be within num_embeddings 10"));
  CHECK(contains(error_of([] { (void)embedding_shape({2}, cg::dtype::i64, {10, 4}, -11); }),
                 "embedding: padding_idx -11 must be within num_embeddings 10"));
  CHECK(cg::detail::embedding_padding_idx(-1, 10) == 9);
  CHECK(cg::detail::embedding_padding_idx(std::nullopt, 10) == -1);
  CHECK(cg::detail::embedding_backward_shape({2, 3, 4}, {2, 3}, cg::dtype::i64, 9) == cg::shape_t{9, 4});
  CHECK(contains(error_of([] { (void)cg::detail::embedding_backward_shape({2, 4}, {2, 3}, cg::dtype::i64, 9); }),
                 "embedding_backward: grad of shape [2, 4] must be the indices' shape [2, 3] plus the embedding dim"));
}

TEST_CASE("embedding.cpu.f32.i64") { check_embedding<float, std::int64_t>(); }
TEST_CASE("embedding.cpu.f64.i32") { check_embedding<double, std::int32_t>(); }
TEST_CASE("embedding.cpu.bf16.i64") { check_embedding<cg::bf16, std::int64_t>(); }
TEST_CASE("embedding.cpu.f16.i32") { check_embedding<cg::f16, std::int32_t>(); }

TEST_CASE("embedding.cpu.index_out_of_range") {
  auto w = cg::uniform<float>({5, 3}, -1, 1, 1);
  auto out = cg::tensor<float>::empty({2, 3});
  auto bad = cg::tensor<std::int64_t>::from({1, 5}, {2});
  CHECK(contains(error_of([&] { cg::detail::embedding_cpu(bad, w, out); }),
                 "embedding: index 5 is out of bounds for dimension 0 with size 5"));
  auto neg = cg::tensor<std::int32_t>::from({-1, 0}, {2});
  CHECK(contains(error_of([&] { cg::detail::embedding_cpu(neg, w, out); }),
                 "embedding: index -1 is out of bounds for dimension 0 with size 5"));
  auto wrong = cg::tensor<float>::empty({2, 4});
  auto ok = cg::tensor<std::int64_t>::from({1, 2}, {2});
  CHECK(contains(error_of([&] { cg::detail::embedding_cpu(ok, w, wrong); }),
                 "embedding: output of shape [2, 4] for a result of shape [2, 3]"));
}

TEST_CASE("embedding_backward.cpu.f32") { check_embedding_backward<float, std::int64_t>(std::nullopt); }
TEST_CASE("embedding_backward.cpu.f64.padding") { check_embedding_backward<double, std::int32_t>(3); }
TEST_CASE("embedding_backward.cpu.bf16.negative_padding") { check_embedding_backward<cg::bf16, std::int64_t>(-2); }
TEST_CASE("embedding_backward.cpu.f16") { check_embedding_backward<cg::f16, std::int32_t>(0); }

TEST_CASE("embedding_backward.cpu.bf16.accumulates_in_float") {
  // 300 lookups of row 1 with gradient 1: a bf16 accumulator would stop at 256.
  auto idx = cg::full<std::int64_t>({300}, 1);
  auto grad = cg::ones<cg::bf16>({300, 2});
  auto gw = cg::tensor<cg::bf16>::empty({3, 2});
  cg::detail::embedding_backward_cpu(grad, idx, std::nullopt, gw);
  CHECK(static_cast<float>(gw.at({1, 0})) == 300.f);
  CHECK(static_cast<float>(gw.at({0, 1})) == 0.f);
}

TEST_CASE("index_select.shape_and_errors") {
  using cg::detail::index_select_shape;
  CHECK(index_select_shape({4, 5, 6}, 1, {3}, cg::dtype::i64) == cg::shape_t{4, 3, 6});
  CHECK(index_select_shape({4, 5, 6}, -1, {}, cg::dtype::i32) == cg::shape_t{4, 5, 1});
  CHECK(index_select_shape({4, 5}, 0, {0}, cg::dtype::i64) == cg::shape_t{0, 5});
  CHECK(index_select_shape({}, 0, {1}, cg::dtype::i64) == cg::shape_t{});
  CHECK(contains(error_of([] { (void)index_select_shape({4, 5}, 0, {2, 2}, cg::dtype::i64); }),
                 "index_select: index is supposed to be a vector, got shape [2, 2]"));
  CHECK(contains(error_of([] { (void)index_select_shape({4, 5}, 2, {2}, cg::dtype::i64); }),
                 "index_select: dim 2 is out of range for a tensor of rank 2"));
  CHECK(contains(error_of([] { (void)index_select_shape({4, 5}, 0, {2}, cg::dtype::f32); }),
                 "index_select: expected an index tensor of dtype i64 or i32, got f32"));
  CHECK(contains(error_of([] { (void)index_select_shape({}, 0, {2}, cg::dtype::i64); }),
                 "index_select: index to a 0-d input can have only 1 value, got 2"));
}

TEST_CASE("index_select.cpu.every_dim_and_strides") {
  auto base = cg::uniform<double>({6, 5, 4}, -1, 1, 1);
  const auto input = base.transpose(0, 2);  // [4, 5, 6], strided
  auto idx = cg::tensor<std::int32_t>::from({2, 0, 2, 5}, {4});
  for (i64 dim : {0, 1, 2, -1}) {
    CAPTURE(dim);
    const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
    const std::vector<std::int32_t> iv = d == 2 ? std::vector<std::int32_t>{2, 0, 2, 5}
                                                : std::vector<std::int32_t>{2, 0, 2, 3};
    auto ix = cg::tensor<std::int32_t>::from(iv, {4});
    auto out = cg::tensor<double>::empty(cg::detail::index_select_shape(input.shape(), dim, ix.shape(), cg::dtype::i32));
    cg::detail::index_select_cpu(input, dim, ix, out);
    const auto os = out.shape();
    for (i64 i = 0; i < out.numel(); ++i) {
      auto c = coords(i, os);
      auto src = c;
      src[static_cast<std::size_t>(d)] = iv[static_cast<std::size_t>(c[static_cast<std::size_t>(d)])];
      CHECK(out.to_vector()[static_cast<std::size_t>(i)] == input.at({src[0], src[1], src[2]}));
    }
  }
  (void)idx;
  // A 0-d input and index.
  auto scalar = cg::tensor<float>::from({7.f}, {});
  auto out0 = cg::tensor<float>::empty({});
  cg::detail::index_select_cpu(scalar, 0, cg::tensor<std::int64_t>::from({0}, {}), out0);
  CHECK(out0.item() == 7.f);
  CHECK(contains(error_of([&] {
                   auto o = cg::tensor<double>::empty({4, 1, 6});
                   cg::detail::index_select_cpu(input, 1, cg::tensor<std::int64_t>::from({5}, {1}), o);
                 }),
                 "index_select: index 5 is out of bounds for dimension 1 with size 5"));
}

TEST_CASE("gather.shape_and_errors") {
  using cg::detail::gather_shape;
  CHECK(gather_shape({4, 5}, 1, {2, 7}, cg::dtype::i64) == cg::shape_t{2, 7});
  CHECK(gather_shape({}, 0, {}, cg::dtype::i64) == cg::shape_t{});
  CHECK(contains(error_of([] { (void)gather_shape({4, 5}, 1, {2, 7}, cg::dtype::i32); }),
                 "gather: expected dtype i64 for index, got i32"));
  CHECK(contains(error_of([] { (void)gather_shape({4, 5}, 1, {2, 7, 1}, cg::dtype::i64); }),
                 "gather: index [2, 7, 1] must have the same number of dimensions as input [4, 5]"));
  CHECK(contains(error_of([] { (void)gather_shape({4, 5}, 1, {5, 2}, cg::dtype::i64); }),
                 "gather: size does not match at dimension 0: expected index [5, 2] to be smaller than input "
                 "[4, 5] apart from dimension 1"));
  CHECK(contains(error_of([] { (void)gather_shape({4, 5}, -3, {2, 2}, cg::dtype::i64); }),
                 "gather: dim -3 is out of range for a tensor of rank 2"));
}

template <class T>
void check_gather() {
  auto input = cg::uniform<T>({4, 5, 6}, -3, 3, 1);
  for (i64 dim : {0, 1, -1}) {
    CAPTURE(dim);
    const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
    const cg::shape_t ishape{3, 4, 6};  // <= input in every dim but d (where it may exceed)
    cg::shape_t is = ishape;
    is[static_cast<std::size_t>(d)] = 7;
    auto base = random_index<std::int64_t>({is[2], is[1], is[0]}, 0, input.shape()[static_cast<std::size_t>(d)] - 1, 5);
    const auto index = base.permute({2, 1, 0});  // strided index
    auto out = cg::tensor<T>::empty(cg::detail::gather_shape(input.shape(), dim, index.shape(), cg::dtype::i64));
    cg::detail::gather_cpu(input, dim, index, out);
    const auto ov = out.to_vector();
    for (i64 i = 0; i < out.numel(); ++i) {
      auto c = coords(i, is);
      auto src = c;
      src[static_cast<std::size_t>(d)] = index.at({c[0], c[1], c[2]});
      CHECK(ov[static_cast<std::size_t>(i)] == input.at({src[0], src[1], src[2]}));
    }
  }
  auto out = cg::tensor<T>::empty({1, 1, 1});
  CHECK(contains(error_of([&] { cg::detail::gather_cpu(input, 1, cg::tensor<std::int64_t>::from({-1}, {1, 1, 1}), out); }),
                 "gather: index -1 is out of bounds for dimension 1 with size 5"));
}

TEST_CASE("gather.cpu.f32") { check_gather<float>(); }
TEST_CASE("gather.cpu.bf16") { check_gather<cg::bf16>(); }
TEST_CASE("gather.cpu.i32") { check_gather<std::int32_t>(); }
TEST_CASE("gather.cpu.0d") {
  auto s = cg::tensor<double>::from({2.5}, {});
  auto o = cg::tensor<double>::empty({});
  cg::detail::gather_cpu(s, 0, cg::tensor<std::int64_t>::from({0}, {}), o);
  CHECK(o.item() == 2.5);
}

TEST_CASE("scatter_add.shape_and_errors") {
  using cg::detail::scatter_add_shape;
  const auto f = cg::dtype::f32, i = cg::dtype::i64;
  CHECK(scatter_add_shape({4, 5}, 0, {3, 5}, i, {3, 6}, f, f) == cg::shape_t{4, 5});
  CHECK(contains(error_of([&] { (void)scatter_add_shape({4, 5}, 0, {3, 5}, i, {3, 6}, f, cg::dtype::f64); }),
                 "scatter_add: self (f32) and src (f64) must have the same dtype"));
  CHECK(contains(error_of([&] { (void)scatter_add_shape({4, 5}, 0, {3}, i, {3, 6}, f, f); }),
                 "scatter_add: index [3] must have the same number of dimensions as self [4, 5]"));
  CHECK(contains(error_of([&] { (void)scatter_add_shape({4, 5}, 0, {3, 5}, i, {3}, f, f); }),
                 "scatter_add: index [3, 5] must have the same number of dimensions as src [3]"));
  CHECK(contains(error_of([&] { (void)scatter_add_shape({4, 5}, 0, {3, 6}, i, {3, 6}, f, f); }),
                 "scatter_add: expected index [3, 6] to be smaller than self [4, 5] apart from dimension 0 and to "
                 "be smaller size than src [3, 6]"));
  CHECK(contains(error_of([&] { (void)scatter_add_shape({4, 5}, 0, {5, 5}, i, {4, 5}, f, f); }),
                 "to be smaller size than src [4, 5]"));
  CHECK(contains(error_of([&] { (void)scatter_add_shape({4, 5}, 0, {3, 5}, cg::dtype::i32, {3, 5}, f, f); }),
                 "scatter_add: expected dtype i64 for index, got i32"));
}

template <class T>
void check_scatter_add() {
  auto self = cg::uniform<T>({5, 4, 3}, -2, 2, 1);
  auto src_base = cg::uniform<T>({6, 5, 7}, -2, 2, 2);
  for (i64 dim : {0, 1, -1}) {
    CAPTURE(dim);
    const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
    const auto src = src_base.permute({1, 0, 2});  // [5, 6, 7], strided
    cg::shape_t is{4, 3, 2};                        // <= self except at d, <= src everywhere
    is[static_cast<std::size_t>(d)] = 5;
    auto index = random_index<std::int64_t>(is, 0, self.shape()[static_cast<std::size_t>(d)] - 1, 3 + static_cast<std::uint64_t>(d));
    auto out = cg::tensor<T>::empty(self.shape());
    cg::detail::scatter_add_cpu(self, dim, index, src, out);
    std::vector<double> ref, scale;
    for (auto v : self.to_vector()) {
      ref.push_back(to_d(v));
      scale.push_back(std::abs(to_d(v)));
    }
    const auto iv = index.to_vector();
    for (i64 i = 0; i < index.numel(); ++i) {
      auto c = coords(i, is);
      auto dst = c;
      dst[static_cast<std::size_t>(d)] = iv[static_cast<std::size_t>(i)];
      const double s = to_d(src.at({c[0], c[1], c[2]}));
      ref[static_cast<std::size_t>(linear(dst, self.shape()))] += s;
      scale[static_cast<std::size_t>(linear(dst, self.shape()))] += std::abs(s);
    }
    const auto ov = out.to_vector();
    for (std::size_t k = 0; k < ref.size(); ++k) {
      CAPTURE(k);
      if constexpr (std::is_integral_v<T>)
        CHECK(to_d(ov[k]) == ref[k]);
      else
        CHECK(std::abs(to_d(ov[k]) - ref[k]) <= index_ops_test::tol<T>() * (scale[k] + 1e-30));
    }
  }
}

TEST_CASE("scatter_add.cpu.f32") { check_scatter_add<float>(); }
TEST_CASE("scatter_add.cpu.f64") { check_scatter_add<double>(); }
TEST_CASE("scatter_add.cpu.bf16") { check_scatter_add<cg::bf16>(); }
TEST_CASE("scatter_add.cpu.f16") { check_scatter_add<cg::f16>(); }
TEST_CASE("scatter_add.cpu.i32") { check_scatter_add<std::int32_t>(); }

TEST_CASE("scatter_add.cpu.bf16.accumulates_in_float") {
  auto self = cg::zeros<cg::bf16>({2});
  auto index = cg::full<std::int64_t>({300}, 1);
  auto src = cg::ones<cg::bf16>({300});
  auto out = cg::tensor<cg::bf16>::empty({2});
  cg::detail::scatter_add_cpu(self, 0, index, src, out);
  CHECK(static_cast<float>(out.at({1})) == 300.f);
  CHECK(static_cast<float>(out.at({0})) == 0.f);
}

TEST_CASE("scatter_add.cpu.out_of_bounds_and_self_as_out") {
  auto self = cg::tensor<float>::from({1, 2, 3}, {3});
  auto out = cg::tensor<float>::empty({3});
  CHECK(contains(error_of([&] {
                   cg::detail::scatter_add_cpu(self, 0, cg::tensor<std::int64_t>::from({3}, {1}),
                                               cg::tensor<float>::from({1}, {1}), out);
                 }),
                 "scatter_add: index 3 is out of bounds for dimension 0 with size 3"));
  // The executor may hand self's own buffer as the output (it dies there).
  cg::detail::scatter_add_cpu(self, 0, cg::tensor<std::int64_t>::from({2, 2, 0}, {3}),
                              cg::tensor<float>::from({10, 20, 30}, {3}), self);
  CHECK(self.to_vector() == std::vector<float>{31, 2, 33});
}

}  // namespace index_ops_test
