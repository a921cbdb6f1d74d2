// Tests of ccgraph/core/shape.hpp (and tensor_meta / device printing, which build on it).
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/core/tensor_meta.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {
}  // namespace

TEST_CASE("shape.numel_of") {
  CHECK(cg::numel_of({}) == 1);  // a scalar has one element
  CHECK(cg::numel_of({0}) == 0);
  CHECK(cg::numel_of({5}) == 5);
  CHECK(cg::numel_of({2, 3, 4}) == 24);
  CHECK(cg::numel_of({2, 0, 4}) == 0);
  CHECK(cg::numel_of({1, 1, 1}) == 1);
  CHECK(cg::numel_of({1 << 20, 1 << 20}) == std::int64_t{1} << 40);  // no 32-bit overflow
}

TEST_CASE("shape.checked_arithmetic_and_numel") {
  using i64 = std::int64_t;
  const i64 max = std::numeric_limits<i64>::max();
  i64 out = -1;
  CHECK(cg::checked_mul(3, 4, out));
  CHECK(out == 12);
  CHECK(cg::checked_mul(0, max, out));
  CHECK(out == 0);
  CHECK(cg::checked_mul(max, 1, out));
  CHECK(out == max);
  CHECK_FALSE(cg::checked_mul(i64{1} << 32, i64{1} << 31, out));
  CHECK_FALSE(cg::checked_mul(max, 2, out));
  CHECK(cg::checked_add(max - 1, 1, out));
  CHECK(out == max);
  CHECK_FALSE(cg::checked_add(max, 1, out));

  CHECK(cg::checked_numel({}, "f") == 1);
  CHECK(cg::checked_numel({2, 3}, "f") == 6);
  CHECK(cg::checked_numel({0, i64{1} << 40}, "f") == 0);
  CHECK(cg::checked_numel({max}, "f") == max);
  CHECK(cg::countable({max, 1, 0}));
  CHECK_FALSE(cg::countable({i64{1} << 32, i64{1} << 32}));
  CHECK_FALSE(cg::countable({0, i64{1} << 32, i64{1} << 32}));  // the strides would overflow
  CHECK_FALSE(cg::countable({2, -1}));
  CHECK(error_of([] { (void)cg::checked_numel({i64{1} << 32, i64{1} << 32}, "zeros"); }) ==
        "zeros: shape [4294967296, 4294967296] has too many elements (the product of its sizes exceeds 2^63 - 1)");
  // With a zero size the count is 0, but the contiguous strides are products of the others.
  CHECK(error_of([] { (void)cg::checked_numel({i64{1} << 32, 0, i64{1} << 32}, "empty"); }) ==
        "empty: shape [4294967296, 0, 4294967296] has too many elements (the product of its sizes exceeds 2^63 - 1)");
  CHECK(error_of([] { (void)cg::checked_numel({3, -2}, "reshape"); }) == "reshape: negative size in shape [3, -2]");
}

TEST_CASE("shape.contiguous_strides") {
  CHECK(cg::contiguous_strides({}) == cg::strides_t{});
  CHECK(cg::contiguous_strides({7}) == cg::strides_t{1});
  CHECK(cg::contiguous_strides({2, 3}) == cg::strides_t{3, 1});
  CHECK(cg::contiguous_strides({2, 3, 4}) == cg::strides_t{12, 4, 1});
  CHECK(cg::contiguous_strides({4, 1, 5}) == cg::strides_t{5, 5, 1});
  CHECK(cg::contiguous_strides({3, 0, 2}) == cg::strides_t{0, 2, 1});
}

TEST_CASE("shape.str") {
  CHECK(cg::shape_str({}) == "[]");
  CHECK(cg::shape_str({4}) == "[4]");
  CHECK(cg::shape_str({4, 4}) == "[4, 4]");
  CHECK(cg::list_str(std::vector<int>{1, -2, 3}) == "[1, -2, 3]");
  CHECK(cg::list_str(std::vector<std::int64_t>{}) == "[]");
}

TEST_CASE("shape.normalize_dim") {
  CHECK(cg::normalize_dim(0, 3, "f") == 0);
  CHECK(cg::normalize_dim(2, 3, "f") == 2);
  CHECK(cg::normalize_dim(-1, 3, "f") == 2);
  CHECK(cg::normalize_dim(-3, 3, "f") == 0);
  // Rank 0 accepts 0 and -1 (PyTorch's scalar wrapping).
  CHECK(cg::normalize_dim(0, 0, "f") == 0);
  CHECK(cg::normalize_dim(-1, 0, "f") == 0);

  // Errors name the call, the dim and the rank.
  const std::string hi = error_of([] { (void)cg::normalize_dim(3, 3, "transpose"); });
  CHECK(hi == "transpose: dim 3 is out of range for a tensor of rank 3");
  const std::string lo = error_of([] { (void)cg::normalize_dim(-4, 3, "chunk"); });
  CHECK(contains(lo, "chunk"));
  CHECK(contains(lo, "-4"));
  CHECK(contains(lo, "rank 3"));
  CHECK(contains(error_of([] { (void)cg::normalize_dim(1, 0, "sum"); }), "sum: dim 1"));
  CHECK(contains(error_of([] { (void)cg::normalize_dim(-2, 0, "sum"); }), "rank 0"));
  CHECK_THROWS_AS((void)cg::normalize_dim(5, 2, "x"), cg::error);
}

TEST_CASE("shape.broadcast_shapes") {
  CHECK(cg::broadcast_shapes({2, 3}, {2, 3}, "add") == cg::shape_t{2, 3});
  CHECK(cg::broadcast_shapes({2, 1}, {1, 3}, "add") == cg::shape_t{2, 3});
  CHECK(cg::broadcast_shapes({3}, {4, 3}, "add") == cg::shape_t{4, 3});
  CHECK(cg::broadcast_shapes({4, 3}, {3}, "add") == cg::shape_t{4, 3});
  CHECK(cg::broadcast_shapes({}, {2, 2}, "add") == cg::shape_t{2, 2});
  CHECK(cg::broadcast_shapes({5, 1, 4}, {3, 1}, "add") == cg::shape_t{5, 3, 4});
  CHECK(cg::broadcast_shapes({}, {}, "add") == cg::shape_t{});
  CHECK(cg::broadcast_shapes({0}, {1}, "add") == cg::shape_t{0});  // 1 broadcasts to 0
  CHECK(cg::broadcast_shapes({1, 0}, {3, 1}, "add") == cg::shape_t{3, 0});

  const std::string msg = error_of([] { (void)cg::broadcast_shapes({2, 3}, {4, 3}, "mul"); });
  CHECK(contains(msg, "mul"));
  CHECK(contains(msg, "[2, 3]"));
  CHECK(contains(msg, "[4, 3]"));
  CHECK(msg == "mul: shapes [2, 3] and [4, 3] cannot be broadcast together (dim 0: 2 vs 4)");
  const std::string msg2 = error_of([] { (void)cg::broadcast_shapes({3}, {2, 4}, "add"); });
  CHECK(contains(msg2, "[3]"));
  CHECK(contains(msg2, "[2, 4]"));
  CHECK_THROWS_AS((void)cg::broadcast_shapes({0}, {2}, "add"), cg::error);
}

TEST_CASE("shape.tensor_meta_and_device") {
  const cg::tensor_meta m{cg::dtype::bf16, {4, 4}};
  CHECK(m.str() == "bf16[4, 4]");
  CHECK(cg::tensor_meta{cg::dtype::f32, {}}.str() == "f32[]");
  std::ostringstream os;
  os << m;
  CHECK(os.str() == "bf16[4, 4]");
  CHECK(m == cg::tensor_meta{cg::dtype::bf16, {4, 4}});
  CHECK_FALSE(m == cg::tensor_meta{cg::dtype::f16, {4, 4}});
  CHECK_FALSE(m == cg::tensor_meta{cg::dtype::bf16, {4}});

  static_assert(cg::device::cpu().is_cpu() && !cg::device::cpu().is_cuda());
  static_assert(cg::device::cuda(1).is_cuda() && cg::device::cuda(1).index == 1);
  static_assert(cg::device::cuda(1) != cg::device::cuda(0));
  static_assert(cg::device{} == cg::device::cpu());
  CHECK(cg::device::cpu().str() == "cpu");
  CHECK(cg::device::cuda(3).str() == "cuda:3");
  std::ostringstream ds;
  ds << cg::device::cuda(0);
  CHECK(ds.str() == "cuda:0");
}
