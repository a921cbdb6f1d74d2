// Tests of ccgraph/core/shape.hpp (and tensor_meta / device printing, which build on it).
#include <doctest/doctest.h>

#include <cstdint>
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
