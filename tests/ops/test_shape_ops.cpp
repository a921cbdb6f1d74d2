// tests/ops/test_shape_ops.cpp: cat, copy and repeat (ccgraph/ops/shape_ops.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <ccgraph/ops/compute_ops.hpp>  // stack
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/ops/shape_ops.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using i64 = std::int64_t;

}  // namespace

TEST_CASE("cat.dim0_and_dim1") {
  auto a = cg::tensor<float>::from({1, 2, 3, 4, 5, 6}, {2, 3});
  auto b = cg::tensor<float>::from({7, 8, 9}, {1, 3});
  const auto c0 = cg::cat({a, b}, 0);
  CHECK(c0.shape() == cg::shape_t{3, 3});
  CHECK(c0.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto d = cg::tensor<float>::from({10, 20}, {2, 1});
  const auto c1 = cg::cat({a, d}, 1);
  CHECK(c1.shape() == cg::shape_t{2, 4});
  CHECK(c1.to_vector() == std::vector<float>{1, 2, 3, 10, 4, 5, 6, 20});
  CHECK(cg::cat({a, d}, -1).to_vector() == c1.to_vector());  // negative dims count from the end
  CHECK(c0.is_contiguous());
}

TEST_CASE("cat.random_3d_every_dim") {
  auto a = cg::uniform<double>({2, 3, 4}, -1, 1, 1);
  auto b = cg::uniform<double>({2, 3, 4}, -1, 1, 2);
  auto c = cg::uniform<double>({2, 3, 4}, -1, 1, 3);
  for (int dim = 0; dim < 3; ++dim) {
    CAPTURE(dim);
    const auto r = cg::cat(std::vector<cg::tensor<double>>{a, b, c}, dim);
    cg::shape_t want = {2, 3, 4};
    want[dim] = 3 * want[dim];
    REQUIRE(r.shape() == want);
    const std::vector<cg::tensor<double>> parts = {a, b, c};
    for (i64 p = 0; p < 3; ++p)
      for (i64 i = 0; i < 2; ++i)
        for (i64 j = 0; j < 3; ++j)
          for (i64 k = 0; k < 4; ++k) {
            i64 idx[3] = {i, j, k};
            idx[dim] += p * cg::shape_t{2, 3, 4}[dim];
            CHECK(r.at({idx[0], idx[1], idx[2]}) == parts[p].at({i, j, k}));
          }
  }
}

TEST_CASE("cat.views_single_empty_and_dtypes") {
  auto base = cg::uniform<float>({4, 6}, -1, 1, 1);
  const auto t = base.transpose(0, 1);  // [6, 4], strided
  const auto r = cg::cat({t, t.narrow(0, 1, 2)}, 0);
  CHECK(r.shape() == cg::shape_t{8, 4});
  CHECK(r.narrow(0, 0, 6).contiguous().to_vector() == t.to_vector());
  CHECK(r.narrow(0, 6, 2).contiguous().to_vector() == t.narrow(0, 1, 2).to_vector());
  // One tensor: a contiguous copy.
  const auto one = cg::cat({t}, 1);
  CHECK(one.to_vector() == t.to_vector());
  CHECK(one.data_unsynced() != base.data_unsynced());
  // Empty pieces along the cat dim are fine.
  auto e = cg::tensor<float>::empty({0, 4});
  CHECK(cg::cat({e, t, e}, 0).to_vector() == t.to_vector());
  // Other element types.
  auto h = cg::uniform<cg::bf16>({2, 2}, -1, 1, 2);
  CHECK(cg::cat({h, h}, 0).to_vector().size() == 8);
  auto i = cg::tensor<std::int64_t>::from({1, 2}, {2});
  CHECK(cg::cat({i, i, i}, 0).to_vector() == std::vector<std::int64_t>{1, 2, 1, 2, 1, 2});
}

TEST_CASE("cat.errors") {
  auto a = cg::uniform<float>({2, 3});
  auto b = cg::uniform<float>({4, 2});
  CHECK(error_of([&] { (void)cg::cat({a, b}, 0); }) ==
        "cat: sizes of tensors must match except in dim 0: [2, 3] (tensor 0) and [4, 2] (tensor 1) "
        "differ in dim 1");
  CHECK(error_of([&] { (void)cg::cat({a, cg::uniform<float>({3})}, 0); }) ==
        "cat: tensors must have the same number of dimensions: [2, 3] (tensor 0) and [3] (tensor 1)");
  CHECK(error_of([&] { (void)cg::cat(std::vector<cg::tensor<float>>{}, 0); }) ==
        "cat: expected a non-empty list of tensors");
  CHECK(error_of([&] { (void)cg::cat({a, a}, 2); }).find("cat: dim 2 is out of range") == 0);
  CHECK(cg::detail::cat_shape({{2, 3}, {2, 5}}, 1) == cg::shape_t{2, 8});
}

TEST_CASE("copy.tensor_expression_scalar") {
  auto dst = cg::tensor<float>::empty({2, 3});
  auto src = cg::uniform<float>({2, 3}, -1, 1, 1);
  cg::copy(dst, src);
  CHECK(dst.to_vector() == src.to_vector());
  CHECK(dst.data_unsynced() != src.data_unsynced());
  // Broadcast a row; returns a handle to dst.
  auto row = cg::tensor<float>::from({1, 2, 3}, {3});
  auto same = cg::copy(dst, row);
  CHECK(same.data_unsynced() == dst.data_unsynced());
  CHECK(dst.to_vector() == std::vector<float>{1, 2, 3, 1, 2, 3});
  // An expression that reads dst itself (evaluated before the copy).
  cg::copy(dst, dst.transpose(0, 1).transpose(0, 1) * 2 + row);
  CHECK(dst.to_vector() == std::vector<float>{3, 6, 9, 3, 6, 9});
  // Into a view: only that part changes.
  cg::copy(dst.narrow(1, 1, 1), 0.5);
  CHECK(dst.to_vector() == std::vector<float>{3, 0.5, 9, 3, 0.5, 9});
  // Another element type is converted, as in PyTorch's copy_.
  cg::copy(dst, cg::tensor<std::int32_t>::from({-1, 2, 7}, {3}));
  CHECK(dst.to_vector() == std::vector<float>{-1, 2, 7, -1, 2, 7});
  CHECK(error_of([&] { cg::copy(dst, cg::uniform<float>({4})); }).find("copy_") == 0);
}

TEST_CASE("repeat.tiles") {
  auto a = cg::tensor<float>::from({1, 2, 3, 4}, {2, 2});
  const auto r = cg::repeat(a, {2, 1});
  CHECK(r.shape() == cg::shape_t{4, 2});
  CHECK(r.to_vector() == std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4});
  CHECK(cg::repeat(a, {1, 2}).to_vector() == std::vector<float>{1, 2, 1, 2, 3, 4, 3, 4});
  CHECK(cg::repeat(a, {2, 1, 1}).shape() == cg::shape_t{2, 2, 2});  // extra leading dims
  CHECK(cg::repeat(a.transpose(0, 1), {1, 2}).to_vector() == std::vector<float>{1, 3, 1, 3, 2, 4, 2, 4});
  CHECK(error_of([&] { (void)cg::repeat(a, {2}); }).find("repeat:") == 0);
}

TEST_CASE("stack.dims_and_errors") {
  auto a = cg::tensor<float>::from({1, 2, 3, 4, 5, 6}, {2, 3});
  auto b = cg::tensor<float>::from({7, 8, 9, 10, 11, 12}, {2, 3});
  const auto s0 = cg::stack({a, b}, 0);
  CHECK(s0.shape() == cg::shape_t{2, 2, 3});
  CHECK(s0.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const auto s1 = cg::stack({a, b}, 1);
  CHECK(s1.shape() == cg::shape_t{2, 2, 3});
  CHECK(s1.to_vector() == std::vector<float>{1, 2, 3, 7, 8, 9, 4, 5, 6, 10, 11, 12});
  const auto s2 = cg::stack({a, b.transpose(0, 1).contiguous().transpose(0, 1)}, -1);  // strided input
  CHECK(s2.shape() == cg::shape_t{2, 3, 2});
  CHECK(s2.to_vector() == std::vector<float>{1, 7, 2, 8, 3, 9, 4, 10, 5, 11, 6, 12});
  CHECK(cg::stack({a}, 2).shape() == cg::shape_t{2, 3, 1});
  CHECK(contains(error_of([&] { (void)cg::stack({a, b}, 3); }), "stack: dim 3 is out of range for a tensor of rank 3"));
  CHECK(contains(error_of([&] { (void)cg::stack({a, a.reshape({3, 2})}, 0); }),
                 "stack: expects each tensor to be equal size, but got [2, 3] at entry 0 and [3, 2] at entry 1"));
  CHECK(contains(error_of([] { (void)cg::detail::stack_shape({}, 0); }), "stack: expected a non-empty list of tensors"));
  // The kernel writes a planned buffer of any strides.
  auto planned = cg::tensor<float>::empty({3, 2, 2}).permute({1, 2, 0});  // [2, 2, 3] view
  cg::detail::stack_kernel(std::vector<cg::tensor<float>>{a, b}, 1, planned);
  CHECK(planned.to_vector() == s1.to_vector());
}

TEST_CASE("split.sizes_views_and_errors") {
  auto t = cg::arange<float>(20).reshape({4, 5});
  const auto pieces = cg::split(t, 2, 1);  // 2, 2, 1 columns
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[0].shape() == cg::shape_t{4, 2});
  CHECK(pieces[2].shape() == cg::shape_t{4, 1});
  CHECK(pieces[1].to_vector() == std::vector<float>{2, 3, 7, 8, 12, 13, 17, 18});
  CHECK(pieces[1].storage() == t.storage());  // views
  const auto rows = cg::split(t, std::vector<std::int64_t>{1, 0, 3}, -2);
  REQUIRE(rows.size() == 3);
  CHECK(rows[1].shape() == cg::shape_t{0, 5});
  CHECK(rows[2].to_vector().front() == 5.f);
  CHECK(cg::split(t, 5, 0).size() == 1);
  CHECK(cg::detail::split_sizes({0, 3}, 0, 0) == std::vector<std::int64_t>{0});
  CHECK(cg::detail::split_sizes({7}, 3, 0) == std::vector<std::int64_t>{3, 3, 1});
  CHECK(contains(error_of([&] { (void)cg::split(t, -1, 0); }), "split: split_size must be non-negative, got -1"));
  CHECK(contains(error_of([&] { (void)cg::split(t, 0, 0); }),
                 "split: split_size can only be 0 if dim 0 has size 0, but it has size 4"));
  CHECK(contains(error_of([&] { (void)cg::split(t, std::vector<std::int64_t>{2, 2}, 1); }),
                 "split: split_sizes [2, 2] must sum exactly to 5 (the size of dim 1 of the input of shape [4, 5])"));
  CHECK(contains(error_of([&] { (void)cg::split(t, std::vector<std::int64_t>{5, -1}, 1); }),
                 "split: negative size in split_sizes [5, -1]"));
  CHECK(contains(error_of([&] { (void)cg::split(t, 2, 2); }), "split: dim 2 is out of range for a tensor of rank 2"));
}

TEST_CASE("cat.kernel_into_planned_buffer") {
  auto a = cg::uniform<double>({2, 3}, -1, 1, 1);
  auto b = cg::uniform<double>({2, 4}, -1, 1, 2);
  auto planned = cg::tensor<double>::empty({7, 2}).transpose(0, 1);  // [2, 7], column-major
  cg::detail::cat_kernel(std::vector<cg::tensor<double>>{a, b}, 1, planned);
  CHECK(planned.to_vector() == cg::cat({a, b}, 1).to_vector());
  auto wrong = cg::tensor<double>::empty({2, 6});
  CHECK(contains(error_of([&] { cg::detail::cat_kernel(std::vector<cg::tensor<double>>{a, b}, 1, wrong); }),
                 "cat: output of shape [2, 6] for a result of shape [2, 7]"));
}
