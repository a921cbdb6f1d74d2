// Tests of ccgraph/tensor/: tensor<T> factories, metadata, views, copies, conversion, printing,
// random tensors, and pending (async) tensors.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/tensor/async.hpp>
#include <ccgraph/tensor/print.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

/// The values of `t` in row-major order, printed as "[a, b, c]" (through double, so halves, u8
/// and bool print as numbers): readable both in the CHECK and in its failure message.
template <class T>
std::string vals(const cg::tensor<T>& t) {
  std::vector<double> v;
  for (const T& x : t.to_vector()) v.push_back(static_cast<double>(static_cast<cg::compute_t<T>>(x)));
  return cg::list_str(v);
}

template <class T>
std::string str(const cg::tensor<T>& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

/// 0, 1, ..., numel-1 in the given shape.
cg::tensor<float> iota(cg::shape_t shape) {
  const auto n = cg::numel_of(shape);
  return cg::arange<float>(n).reshape(std::move(shape));
}

}  // namespace

// ---- factories --------------------------------------------------------------------------------

TEST_CASE("tensor.from") {
  auto a = cg::tensor<float>::from({1, 2, 3, 4}, {2, 2});
  CHECK(a.shape() == cg::shape_t{2, 2});
  CHECK(vals(a) == "[1, 2, 3, 4]");
  CHECK(a.is_contiguous());
  CHECK(a.storage_offset() == 0);

  const std::vector<std::int32_t> v{5, 6, 7, 8, 9, 10};
  auto b = cg::tensor<std::int32_t>::from(v, {3, 2});
  CHECK(b.shape() == cg::shape_t{3, 2});
  CHECK(b.to_vector() == v);

  auto c = cg::tensor<double>::from(std::vector<double>{0.5, -1.5, 2});  // 1-d
  CHECK(c.shape() == cg::shape_t{3});
  CHECK(vals(c) == "[0.5, -1.5, 2]");

  auto s = cg::tensor<float>::from({7}, {});  // scalar shape
  CHECK(s.dim() == 0);
  CHECK(s.item() == 7.0f);

  auto e = cg::tensor<float>::from(std::vector<float>{});  // empty 1-d
  CHECK(e.shape() == cg::shape_t{0});
  CHECK(e.numel() == 0);

  auto h = cg::tensor<cg::bf16>::from({1, 2.5, -3}, {3});
  CHECK(vals(h) == "[1, 2.5, -3]");
  auto bo = cg::tensor<bool>::from({true, false}, {2});
  CHECK(bo.to_vector() == std::vector<bool>{true, false});

  // A wrong count names both the count and the shape.
  CHECK(error_of([] { (void)cg::tensor<float>::from({1, 2, 3}, {2, 2}); }) ==
        "tensor::from: 3 values do not fill shape [2, 2] (4 elements)");
  CHECK(contains(error_of([] { (void)cg::tensor<float>::from(std::vector<float>(5), {2, 3}); }),
                 "5 values do not fill shape [2, 3]"));
  CHECK_THROWS_AS((void)cg::tensor<float>::from({1}, {0}), cg::error);
  CHECK_THROWS_AS((void)cg::tensor<float>::from({}, {}), cg::error);  // a scalar needs one value
  CHECK(contains(error_of([] { (void)cg::tensor<float>::from({}, {-1}); }), "[-1]"));
}

TEST_CASE("tensor.full_zeros_ones_empty") {
  auto f = cg::full<float>({2, 3}, 1.5f);
  CHECK(f.shape() == cg::shape_t{2, 3});
  CHECK(vals(f) == "[1.5, 1.5, 1.5, 1.5, 1.5, 1.5]");
  CHECK(vals(cg::zeros<std::int64_t>({4})) == "[0, 0, 0, 0]");
  CHECK(vals(cg::ones<cg::f16>({2, 2})) == "[1, 1, 1, 1]");
  CHECK(cg::ones<bool>({3}).to_vector() == std::vector<bool>{true, true, true});
  CHECK(vals(cg::zeros<std::uint8_t>({2})) == "[0, 0]");
  CHECK(vals(cg::full<float>({}, 2.0f)) == "[2]");
  CHECK(cg::zeros<float>({0, 3}).numel() == 0);

  auto e = cg::empty<double>({3, 0, 2});
  CHECK(e.shape() == cg::shape_t{3, 0, 2});
  CHECK(e.numel() == 0);
  CHECK(e.to_vector().empty());
  auto e2 = cg::tensor<float>::empty({4, 5});
  CHECK(e2.numel() == 20);
  CHECK(e2.is_contiguous());
  CHECK(e2.strides() == cg::strides_t{5, 1});
  CHECK(error_of([] { (void)cg::empty<float>({2, -1}); }) == "empty: negative size in shape [2, -1]");
  CHECK(error_of([] { (void)cg::tensor<float>::empty({-3}); }) == "tensor: negative size in shape [-3]");
  CHECK(error_of([] { (void)cg::zeros<float>({-1}); }) == "zeros: negative size in shape [-1]");

  cg::tensor<float> d;  // default: empty 1-d
  CHECK(d.shape() == cg::shape_t{0});
  CHECK(d.numel() == 0);
  CHECK(d.to_vector().empty());
}

TEST_CASE("tensor.sizes_past_int64_are_errors") {
  // issue 21: a shape whose element count overflowed was accepted with 0 bytes, and indexing
  // it wrote anywhere. Every way of making a shape counts it with overflow checks and names it.
  using i64 = std::int64_t;
  const i64 g = i64{1} << 32;
  const std::string too_many = " has too many elements (the product of its sizes exceeds 2^63 - 1)";
  CHECK(error_of([&] { (void)cg::zeros<float>({g, g}); }) == "zeros: shape [4294967296, 4294967296]" + too_many);
  CHECK(error_of([&] { (void)cg::ones<float>({g, g}); }) == "ones: shape [4294967296, 4294967296]" + too_many);
  CHECK(error_of([&] { (void)cg::full<float>({g, g}, 1.f); }) == "full: shape [4294967296, 4294967296]" + too_many);
  CHECK(error_of([&] { (void)cg::empty<float>({g, g, 0}); }) == "empty: shape [4294967296, 4294967296, 0]" + too_many);
  CHECK(error_of([&] { (void)cg::tensor<float>::empty({g, g}); }) == "tensor: shape [4294967296, 4294967296]" + too_many);
  CHECK(error_of([&] { (void)cg::uniform<float>({g, g}); }) == "uniform: shape [4294967296, 4294967296]" + too_many);
  // Countable, but not in bytes.
  CHECK(error_of([] { (void)cg::zeros<double>({i64{1} << 61}); }) ==
        "zeros: f64[2305843009213693952] needs 2305843009213693952 x 8 bytes, more than 2^63 - 1");
  // reshape, with and without an inferred size, of an empty tensor (0 elements either way).
  const auto none = cg::zeros<float>({0});
  CHECK(error_of([&] { (void)none.reshape({0, g, g}); }) == "reshape: shape [0, 4294967296, 4294967296]" + too_many);
  CHECK(error_of([&] { (void)none.reshape({-1, g, g}); }) == "reshape: shape [-1, 4294967296, 4294967296]" + too_many);
  CHECK(none.reshape({0, g}).shape() == cg::shape_t{0, g});  // empty and countable: fine
  // repeat: a size, and the element count.
  const auto two = cg::zeros<float>({2});
  CHECK(error_of([&] { (void)two.repeat({i64{1} << 62}); }) ==
        "repeat: [4611686018427387904] times shape [2] has a size past 2^63 - 1");
  CHECK(error_of([&] { (void)two.repeat({g, g}); }) == "repeat: shape [4294967296, 8589934592]" + too_many);
  // arange's count, and cat's summed dim.
  CHECK(contains(error_of([] { (void)cg::arange<float>(0, 1e30); }), "arange: [0, 1e+30) in steps of 1 has too many elements"));
  CHECK(contains(error_of([] { (void)cg::arange<float>(0, std::numeric_limits<double>::infinity()); }), "has too many elements"));
  const i64 big = std::numeric_limits<i64>::max();
  CHECK(error_of([&] { (void)cg::detail::cat_shape({{big}, {1}}, 0); }) ==
        "cat: dim 0 of the result exceeds 2^63 - 1 at tensor 1 ([1])");
}

TEST_CASE("tensor.arange") {
  auto a = cg::arange<float>(5);
  CHECK(a.shape() == cg::shape_t{5});
  CHECK(vals(a) == "[0, 1, 2, 3, 4]");
  CHECK(vals(cg::arange<std::int64_t>(4)) == "[0, 1, 2, 3]");
  CHECK(vals(cg::arange<float>(2, 5)) == "[2, 3, 4]");
  CHECK(vals(cg::arange<float>(1, 2, 0.25)) == "[1, 1.25, 1.5, 1.75]");
  CHECK(vals(cg::arange<std::int32_t>(0, 10, 3)) == "[0, 3, 6, 9]");
  CHECK(vals(cg::arange<double>(0, 1, 0.3)) == "[0, 0.3, 0.6, 0.9]");  // partial last step
  CHECK(vals(cg::arange<cg::bf16>(3)) == "[0, 1, 2]");
  // Negative step.
  CHECK(vals(cg::arange<float>(5, 0, -1)) == "[5, 4, 3, 2, 1]");
  CHECK(vals(cg::arange<std::int32_t>(3, -3, -2)) == "[3, 1, -1]");
  CHECK(vals(cg::arange<float>(1, 0, -0.5)) == "[1, 0.5]");
  // Empty ranges.
  CHECK(cg::arange<float>(0).shape() == cg::shape_t{0});
  CHECK(cg::arange<float>(3, 3).numel() == 0);
  CHECK(cg::arange<float>(5, 0).numel() == 0);     // positive step, end < start
  CHECK(cg::arange<float>(0, 5, -1).numel() == 0);  // negative step, end > start
  CHECK(cg::arange<float>(-4).numel() == 0);
  CHECK(error_of([] { (void)cg::arange<float>(0, 1, 0); }) == "arange: step must be nonzero");
}

// ---- metadata ---------------------------------------------------------------------------------

TEST_CASE("tensor.metadata") {
  auto t = iota({2, 3, 4});
  CHECK(t.shape() == cg::shape_t{2, 3, 4});
  CHECK(t.numel() == 24);
  CHECK(t.dim() == 3);
  CHECK(t.size(0) == 2);
  CHECK(t.size(-1) == 4);
  CHECK(t.size(-3) == 2);
  CHECK(t.strides() == cg::strides_t{12, 4, 1});
  CHECK(t.is_contiguous());
  CHECK(t.device() == cg::device::cpu());
  CHECK(t.dtype() == cg::dtype::f32);
  static_assert(cg::tensor<cg::bf16>::dtype() == cg::dtype::bf16);
  static_assert(std::is_same_v<cg::tensor<std::int32_t>::value_type, std::int32_t>);
  static_assert(cg::is_tensor_v<cg::tensor<float>> && !cg::is_tensor_v<float>);
  static_assert(cg::tensor_type<const cg::tensor<bool>&> && !cg::tensor_type<std::vector<float>>);
  CHECK_FALSE(t.is_pending());
  CHECK(t.pending_work() == nullptr);
  CHECK(contains(error_of([&] { (void)t.size(3); }), "size: dim 3 is out of range for a tensor of rank 3"));

  auto tt = t.transpose(1, 2);
  CHECK(tt.shape() == cg::shape_t{2, 4, 3});
  CHECK(tt.strides() == cg::strides_t{12, 1, 4});
  CHECK_FALSE(tt.is_contiguous());
  // Size-1 dims do not break contiguity whatever their stride.
  CHECK(t.unsqueeze(1).is_contiguous());
  CHECK(cg::tensor<float>(t.storage(), {2, 1, 12}, {12, 999, 1}, 0).is_contiguous());
  CHECK(t.narrow(0, 1, 1).is_contiguous());   // a contiguous block with an offset
  CHECK_FALSE(t.narrow(2, 0, 2).is_contiguous());

  // Copies of a tensor are handles on the same memory.
  auto alias = t;
  alias.fill_(3.0f);
  CHECK(t.at({1, 2, 3}) == 3.0f);
  CHECK(alias.storage() == t.storage());
}

TEST_CASE("tensor.at_item_to_vector") {
  auto t = iota({2, 3});
  CHECK(t.at({0, 0}) == 0.0f);
  CHECK(t.at({1, 2}) == 5.0f);
  t.at({1, 0}) = 42.0f;  // a reference into the storage
  CHECK(vals(t) == "[0, 1, 2, 42, 4, 5]");
  auto tt = t.transpose(0, 1);
  CHECK(tt.at({2, 1}) == 5.0f);
  CHECK(vals(tt) == "[0, 42, 1, 4, 2, 5]");  // to_vector follows the view's row-major order

  CHECK(error_of([&] { (void)t.at({1}); }) == "tensor::at: 1 indices for a tensor of shape [2, 3]");
  CHECK(error_of([&] { (void)t.at({0, 3}); }) == "tensor::at: index 3 out of range for dim 1 of size 3");
  CHECK(contains(error_of([&] { (void)t.at({-1, 0}); }), "index -1 out of range for dim 0"));

  CHECK(cg::full<float>({1, 1}, 2.5f).item() == 2.5f);
  CHECK(cg::full<std::int64_t>({}, -3).item() == -3);
  CHECK(t.select(0, 1).select(0, 2).item() == 5.0f);
  CHECK(error_of([&] { (void)t.item(); }) == "tensor::item: tensor of shape [2, 3] has 6 elements, not 1");
  CHECK_THROWS_AS((void)cg::zeros<float>({0}).item(), cg::error);

  auto s = cg::full<float>({}, 9.0f);
  CHECK(s.at({}) == 9.0f);
  CHECK(s.to_vector() == std::vector<float>{9.0f});
}

// ---- views --------------------------------------------------------------------------------------

TEST_CASE("tensor.reshape") {
  auto t = iota({2, 6});
  auto r = t.reshape({3, 4});
  CHECK(r.shape() == cg::shape_t{3, 4});
  CHECK(vals(r) == vals(t));
  CHECK(r.storage() == t.storage());  // a view: shares storage
  CHECK(r.data() == t.data());
  r.at({0, 1}) = -1.0f;
  CHECK(t.at({0, 1}) == -1.0f);

  CHECK(t.reshape({-1}).shape() == cg::shape_t{12});
  CHECK(t.reshape({4, -1}).shape() == cg::shape_t{4, 3});
  CHECK(t.reshape({-1, 2, 3}).shape() == cg::shape_t{2, 2, 3});
  CHECK(t.reshape({1, -1, 1}).shape() == cg::shape_t{1, 12, 1});
  CHECK(cg::full<float>({}, 1.0f).reshape({1, 1}).shape() == cg::shape_t{1, 1});
  CHECK(cg::full<float>({1}, 1.0f).reshape({}).shape() == cg::shape_t{});
  CHECK(cg::full<float>({}, 1.0f).reshape({-1}).shape() == cg::shape_t{1});
  CHECK(cg::zeros<float>({0, 4}).reshape({2, 0, 5}).shape() == cg::shape_t{2, 0, 5});

  // A view of an offset block keeps its offset.
  auto row = t.narrow(0, 1, 1);
  auto rr = row.reshape({2, 3});
  CHECK(rr.storage() == t.storage());
  CHECK(rr.storage_offset() == 6);
  CHECK(vals(rr) == "[6, 7, 8, 9, 10, 11]");

  // Not contiguous: a copy, with the view's values.
  auto tt = t.transpose(0, 1);  // [6, 2]
  auto c = tt.reshape({12});
  CHECK(c.storage() != t.storage());
  CHECK(vals(c) == vals(tt));
  CHECK(c.is_contiguous());
  c.fill_(0.0f);
  CHECK(t.at({1, 1}) == 7.0f);  // untouched

  // Errors name the shapes.
  CHECK(error_of([&] { (void)t.reshape({5, 2}); }) ==
        "reshape: shape [5, 2] is invalid for input of size 12 (shape [2, 6])");
  CHECK(error_of([&] { (void)t.reshape({-1, 5}); }) == "reshape: shape [-1, 5] is invalid for input of size 12");
  CHECK(error_of([&] { (void)t.reshape({-1, -1}); }) == "reshape: only one dimension can be -1 in [-1, -1]");
  CHECK(contains(error_of([&] { (void)t.reshape({-2, -6}); }), "invalid size -2 in [-2, -6]"));
  CHECK_THROWS_AS((void)cg::zeros<float>({0, 4}).reshape({0, -1}), cg::error);  // -1 is ambiguous
}

TEST_CASE("tensor.view_and_flatten") {
  auto t = iota({2, 3});
  auto v = t.view({3, 2});
  CHECK(v.storage() == t.storage());
  CHECK(v.shape() == cg::shape_t{3, 2});
  CHECK(vals(v) == "[0, 1, 2, 3, 4, 5]");
  CHECK(t.view({-1}).shape() == cg::shape_t{6});
  CHECK(error_of([&] { (void)t.transpose(0, 1).view({6}); }) ==
        "view: tensor of shape [3, 2] is not contiguous; use reshape");
  CHECK_THROWS_AS((void)t.view({4}), cg::error);

  auto f = iota({2, 3, 2}).flatten();
  CHECK(f.shape() == cg::shape_t{12});
  CHECK(vals(iota({2, 2}).transpose(0, 1).flatten()) == "[0, 2, 1, 3]");
  CHECK(cg::full<float>({}, 4.0f).flatten().shape() == cg::shape_t{1});
}

TEST_CASE("tensor.chunk") {
  auto t = cg::arange<float>(10);
  // ceil(10/3) = 4: pieces of 4, 4, 2.
  auto c = t.chunk(3);
  REQUIRE(c.size() == 3);
  CHECK(vals(c[0]) == "[0, 1, 2, 3]");
  CHECK(vals(c[1]) == "[4, 5, 6, 7]");
  CHECK(vals(c[2]) == "[8, 9]");
  for (auto& p : c) CHECK(p.storage() == t.storage());  // views
  CHECK(c[1].storage_offset() == 4);
  // ceil(10/4) = 3: 3, 3, 3, 1.
  auto c4 = t.chunk(4);
  REQUIRE(c4.size() == 4);
  CHECK(c4[3].numel() == 1);
  // ceil(6/4) = 2: only three pieces (PyTorch returns fewer chunks when it must).
  auto c6 = cg::arange<float>(6).chunk(4);
  REQUIRE(c6.size() == 3);
  CHECK(vals(c6[2]) == "[4, 5]");
  // More chunks than elements: one element each.
  auto c3 = cg::arange<float>(3).chunk(5);
  REQUIRE(c3.size() == 3);
  CHECK(vals(c3[2]) == "[2]");
  CHECK(t.chunk(1).size() == 1);
  CHECK(t.chunk(1)[0].shape() == cg::shape_t{10});
  // Exact division.
  for (auto& p : t.chunk(5)) CHECK(p.numel() == 2);
  // Empty dim: `chunks` empty pieces (PyTorch splits 0 into chunks sizes of 0).
  auto ce = cg::zeros<float>({0, 2}).chunk(3);
  REQUIRE(ce.size() == 3);
  for (auto& p : ce) CHECK(p.shape() == cg::shape_t{0, 2});
  CHECK(cg::zeros<float>({2, 0}).chunk(2, 1).size() == 2);

  // Along dim 1 and along a negative dim.
  auto m = iota({2, 5});
  auto d1 = m.chunk(2, 1);
  REQUIRE(d1.size() == 2);
  CHECK(d1[0].shape() == cg::shape_t{2, 3});
  CHECK(d1[1].shape() == cg::shape_t{2, 2});
  CHECK(vals(d1[0]) == "[0, 1, 2, 5, 6, 7]");
  CHECK(vals(d1[1]) == "[3, 4, 8, 9]");
  CHECK_FALSE(d1[0].is_contiguous());
  auto dn = m.chunk(2, -1);
  REQUIRE(dn.size() == 2);
  CHECK(vals(dn[1]) == "[3, 4, 8, 9]");
  auto d0 = m.chunk(2, 0);
  REQUIRE(d0.size() == 2);
  CHECK(vals(d0[1]) == "[5, 6, 7, 8, 9]");
  CHECK(d0[1].is_contiguous());
  auto dm2 = m.chunk(2, -2);
  CHECK(vals(dm2[0]) == "[0, 1, 2, 3, 4]");

  CHECK(error_of([&] { (void)m.chunk(0); }) == "chunk: chunks must be positive, got 0");
  CHECK_THROWS_AS((void)m.chunk(-1), cg::error);
  CHECK(error_of([&] { (void)m.chunk(2, 2); }) == "chunk: dim 2 is out of range for a tensor of rank 2");
}

TEST_CASE("tensor.narrow") {
  auto t = iota({3, 4});
  auto n = t.narrow(1, 1, 2);
  CHECK(n.shape() == cg::shape_t{3, 2});
  CHECK(vals(n) == "[1, 2, 5, 6, 9, 10]");
  CHECK(n.storage() == t.storage());
  CHECK(n.storage_offset() == 1);
  CHECK(n.strides() == t.strides());
  CHECK(vals(t.narrow(0, 2, 1)) == "[8, 9, 10, 11]");
  CHECK(vals(t.narrow(-1, -1, 1)) == "[3, 7, 11]");  // negative dim and start
  CHECK(vals(t.narrow(0, -2, 2)) == "[4, 5, 6, 7, 8, 9, 10, 11]");
  CHECK(t.narrow(1, 4, 0).shape() == cg::shape_t{3, 0});  // empty at the end is fine
  CHECK(t.narrow(1, 0, 4).shape() == cg::shape_t{3, 4});
  n.fill_(-1.0f);  // writes through
  CHECK(vals(t) == "[0, -1, -1, 3, 4, -1, -1, 7, 8, -1, -1, 11]");
  // Narrow of a narrow composes offsets.
  CHECK(vals(iota({10}).narrow(0, 2, 6).narrow(0, 1, 2)) == "[3, 4]");

  CHECK(error_of([&] { (void)t.narrow(1, 3, 2); }) == "narrow: start 3 + length 2 exceeds dim 1 of size 4");
  CHECK_THROWS_AS((void)t.narrow(1, 0, -1), cg::error);
  CHECK_THROWS_AS((void)t.narrow(1, -5, 1), cg::error);
  CHECK_THROWS_AS((void)t.narrow(1, 5, 0), cg::error);
  CHECK(contains(error_of([&] { (void)t.narrow(2, 0, 1); }), "narrow: dim 2 is out of range"));
}

TEST_CASE("tensor.select") {
  auto t = iota({2, 3, 4});
  auto s = t.select(1, 2);
  CHECK(s.shape() == cg::shape_t{2, 4});
  CHECK(vals(s) == "[8, 9, 10, 11, 20, 21, 22, 23]");
  CHECK(s.storage() == t.storage());
  CHECK(vals(t.select(-1, -1)) == "[3, 7, 11, 15, 19, 23]");
  CHECK(vals(t.select(0, 1).select(0, 0)) == "[12, 13, 14, 15]");
  auto e = t.select(0, 0).select(0, 0).select(0, 3);
  CHECK(e.dim() == 0);
  CHECK(e.item() == 3.0f);
  CHECK(error_of([&] { (void)t.select(1, 3); }) == "select: index 3 out of range for dim 1 of size 3");
  CHECK_THROWS_AS((void)t.select(1, -4), cg::error);
  CHECK_THROWS_AS((void)t.select(3, 0), cg::error);
}

TEST_CASE("tensor.transpose_and_permute") {
  auto t = iota({2, 3});
  auto tt = t.transpose(0, 1);
  CHECK(tt.shape() == cg::shape_t{3, 2});
  CHECK(tt.strides() == cg::strides_t{1, 3});
  CHECK(vals(tt) == "[0, 3, 1, 4, 2, 5]");
  CHECK(tt.storage() == t.storage());
  CHECK(vals(t.transpose(-1, -2)) == vals(tt));
  CHECK(vals(t.transpose(1, 1)) == vals(t));
  CHECK(vals(tt.transpose(0, 1)) == vals(t));
  CHECK(tt.transpose(0, 1).is_contiguous());

  auto u = iota({2, 3, 4});
  auto p = u.permute({2, 0, 1});
  CHECK(p.shape() == cg::shape_t{4, 2, 3});
  CHECK(p.strides() == cg::strides_t{1, 12, 4});
  CHECK(p.at({3, 1, 2}) == u.at({1, 2, 3}));
  CHECK(p.storage() == u.storage());
  CHECK(u.permute({-3, -2, -1}).strides() == u.strides());
  CHECK(vals(u.permute({0, 2, 1})) == vals(u.transpose(1, 2)));
  CHECK(u.permute({1, 2, 0}).permute({2, 0, 1}).is_contiguous());  // inverse permutation

  CHECK(error_of([&] { (void)u.permute({0, 1}); }) == "permute: 2 dims given for a tensor of rank 3");
  CHECK(error_of([&] { (void)u.permute({0, 1, 1}); }) == "permute: dim 1 repeated in [0, 1, 1]");
  CHECK(contains(error_of([&] { (void)u.permute({0, -2, 1}); }), "repeated"));
  CHECK(contains(error_of([&] { (void)u.permute({0, 1, 3}); }), "permute: dim 3 is out of range"));
  CHECK(contains(error_of([&] { (void)t.transpose(0, 2); }), "transpose: dim 2 is out of range"));
}

TEST_CASE("tensor.unsqueeze") {
  auto t = iota({2, 3});
  CHECK(t.unsqueeze(0).shape() == cg::shape_t{1, 2, 3});
  CHECK(t.unsqueeze(1).shape() == cg::shape_t{2, 1, 3});
  CHECK(t.unsqueeze(2).shape() == cg::shape_t{2, 3, 1});
  CHECK(t.unsqueeze(-1).shape() == cg::shape_t{2, 3, 1});
  CHECK(t.unsqueeze(-3).shape() == cg::shape_t{1, 2, 3});
  CHECK(t.unsqueeze(1).strides() == cg::strides_t{3, 3, 1});
  CHECK(t.unsqueeze(2).strides() == cg::strides_t{3, 1, 1});
  CHECK(t.unsqueeze(0).strides() == cg::strides_t{6, 3, 1});
  CHECK(vals(t.unsqueeze(1)) == vals(t));
  CHECK(t.unsqueeze(1).storage() == t.storage());
  auto tt = t.transpose(0, 1).unsqueeze(1);  // [3, 1, 2]
  CHECK(tt.shape() == cg::shape_t{3, 1, 2});
  CHECK(vals(tt) == "[0, 3, 1, 4, 2, 5]");
  auto s = cg::full<float>({}, 1.0f);
  CHECK(s.unsqueeze(0).shape() == cg::shape_t{1});
  CHECK(s.unsqueeze(-1).shape() == cg::shape_t{1});
  CHECK(contains(error_of([&] { (void)t.unsqueeze(3); }), "unsqueeze: dim 3 is out of range"));
  CHECK_THROWS_AS((void)t.unsqueeze(-4), cg::error);
}

// A 0-d tensor has no dimension to index: PyTorch refuses size(0), chunk, narrow and select on
// it, and allows transpose(0, 0) / transpose(-1, -1) as a no-op.
TEST_CASE("tensor.scalar_dim_ops") {
  auto s = cg::full<float>({}, 5.0f);
  CHECK(error_of([&] { (void)s.size(0); }) == "size: dim 0 is out of range for a tensor of rank 0");
  CHECK(error_of([&] { (void)s.narrow(-1, 0, 1); }) == "narrow: dim -1 is out of range for a tensor of rank 0");
  CHECK_THROWS_AS((void)s.size(0), cg::error);
  CHECK_THROWS_AS((void)s.chunk(2), cg::error);
  CHECK_THROWS_AS((void)s.narrow(0, 0, 1), cg::error);
  CHECK_THROWS_AS((void)s.select(0, 0), cg::error);
  CHECK(s.transpose(0, -1).dim() == 0);
  CHECK(s.transpose(0, 0).item() == 5.0f);
  CHECK(s.permute({}).item() == 5.0f);
}

// ---- copies ---------------------------------------------------------------------------------------

TEST_CASE("tensor.contiguous_and_clone") {
  auto t = iota({2, 3});
  auto c = t.contiguous();
  CHECK(c.storage() == t.storage());  // already contiguous: no copy
  CHECK(c.data() == t.data());
  auto tt = t.transpose(0, 1);
  auto tc = tt.contiguous();
  CHECK(tc.storage() != t.storage());  // copy
  CHECK(tc.is_contiguous());
  CHECK(tc.shape() == cg::shape_t{3, 2});
  CHECK(tc.strides() == cg::strides_t{2, 1});
  CHECK(vals(tc) == "[0, 3, 1, 4, 2, 5]");

  auto k = t.clone();
  CHECK(k.storage() != t.storage());  // clone always copies
  CHECK(vals(k) == vals(t));
  k.fill_(0.0f);
  CHECK(vals(t) == "[0, 1, 2, 3, 4, 5]");
  auto nk = t.narrow(1, 1, 2).clone();
  CHECK(nk.is_contiguous());
  CHECK(nk.storage_offset() == 0);
  CHECK(vals(nk) == "[1, 2, 4, 5]");
  CHECK(cg::full<float>({}, 3.0f).clone().item() == 3.0f);
  CHECK(cg::zeros<float>({0, 2}).clone().shape() == cg::shape_t{0, 2});
}

TEST_CASE("tensor.copy_and_fill") {
  auto d = cg::zeros<float>({2, 3});
  d.copy_(iota({2, 3}).transpose(0, 1).contiguous().transpose(0, 1));  // non-contiguous source
  CHECK(vals(d) == "[0, 1, 2, 3, 4, 5]");
  d.copy_(cg::tensor<float>::from({7, 8, 9}, {3}));  // broadcast a row
  CHECK(vals(d) == "[7, 8, 9, 7, 8, 9]");
  d.copy_(cg::tensor<float>::from({1, 2}, {2, 1}));  // broadcast a column
  CHECK(vals(d) == "[1, 1, 1, 2, 2, 2]");
  d.copy_(cg::full<float>({}, 4.0f));  // broadcast a scalar
  CHECK(vals(d) == "[4, 4, 4, 4, 4, 4]");
  d.copy_(cg::tensor<float>::from({5, 6, 7}, {1, 1, 3}).reshape({1, 3}));
  CHECK(vals(d) == "[5, 6, 7, 5, 6, 7]");

  // Into a non-contiguous destination: writes through to the base.
  auto base = cg::zeros<float>({2, 3});
  base.transpose(0, 1).copy_(iota({3, 2}));
  CHECK(vals(base) == "[0, 2, 4, 1, 3, 5]");
  base.narrow(1, 1, 1).copy_(cg::full<float>({1}, -1.0f));
  CHECK(vals(base) == "[0, -1, 4, 1, -1, 5]");
  // copy_ returns the destination.
  CHECK(&d.copy_(iota({2, 3})) == &d);

  // Errors: not broadcastable, or would need the destination to grow.
  CHECK(error_of([&] { d.copy_(iota({4})); }) ==
        "copy_: shapes [2, 3] and [4] cannot be broadcast together (dim 1: 3 vs 4)");
  CHECK(error_of([&] { cg::zeros<float>({3}).copy_(iota({2, 3})); }) ==
        "copy_: source of shape [2, 3] cannot be broadcast to destination shape [3]");
  CHECK_THROWS_AS(cg::zeros<float>({2, 1}).copy_(iota({2, 3})), cg::error);

  auto f = iota({2, 3});
  f.narrow(1, 0, 2).fill_(9.0f);
  CHECK(vals(f) == "[9, 9, 2, 9, 9, 5]");
  CHECK(&f.fill_(1.0f) == &f);
  CHECK(vals(f) == "[1, 1, 1, 1, 1, 1]");
  auto s = cg::full<float>({}, 0.0f);
  s.fill_(2.0f);
  CHECK(s.item() == 2.0f);
}

namespace {
/// out[i0, ..., ik] = in[i_{extra} % s_0, ...]: PyTorch's repeat, computed one index at a time.
std::vector<float> repeat_ref(const cg::tensor<float>& in, const std::vector<std::int64_t>& times,
                              cg::shape_t* out_shape) {
  const std::size_t extra = times.size() - in.shape().size();
  cg::shape_t in_shape(extra, 1);
  in_shape.insert(in_shape.end(), in.shape().begin(), in.shape().end());
  cg::shape_t os(times.size());
  for (std::size_t i = 0; i < times.size(); ++i) os[i] = in_shape[i] * times[i];
  *out_shape = os;
  const auto flat = in.contiguous().to_vector();
  const auto in_strides = cg::contiguous_strides(in_shape);
  std::vector<float> out;
  const auto n = cg::numel_of(os);
  std::vector<std::int64_t> idx(os.size(), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t rem = k, off = 0;
    for (std::size_t d = os.size(); d-- > 0;) {
      idx[d] = rem % os[d];
      rem /= os[d];
      off += (idx[d] % in_shape[d]) * in_strides[d];
    }
    out.push_back(flat[static_cast<std::size_t>(off)]);
  }
  return out;
}
}  // namespace

TEST_CASE("tensor.repeat") {
  auto t = iota({2, 3});
  auto r = t.repeat({2, 2});
  CHECK(r.shape() == cg::shape_t{4, 6});
  CHECK(vals(r) == "[0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5, 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]");
  CHECK(r.storage() != t.storage());
  CHECK(vals(cg::tensor<float>::from({1, 2}, {2}).repeat({3})) == "[1, 2, 1, 2, 1, 2]");
  CHECK(vals(cg::tensor<float>::from({1, 2}, {2}).repeat({2, 2})) == "[1, 2, 1, 2, 1, 2, 1, 2]");

  const std::vector<std::pair<cg::tensor<float>, std::vector<std::int64_t>>> cases = {
      {iota({2, 3}), {1, 1}},
      {iota({2, 3}), {3, 1}},
      {iota({2, 3}), {1, 4}},
      {iota({2, 3}), {2, 1, 3}},     // an extra leading dim
      {iota({3}), {2, 2, 2}},        // two extra leading dims
      {iota({2, 3, 2}), {2, 1, 2}},
      {iota({2, 3}).transpose(0, 1), {2, 3}},  // non-contiguous input
      {iota({4, 3}).narrow(0, 1, 2), {1, 2}},  // offset input
      {iota({2, 3}), {0, 2}},        // zero repeats: empty
      {cg::full<float>({}, 7.0f), {3}},
      {cg::full<float>({}, 7.0f), {}},
  };
  for (const auto& c : cases) {
    const cg::tensor<float>& in = c.first;  // not a structured binding: CAPTURE's lambda uses it
    const std::vector<std::int64_t>& times = c.second;
    CAPTURE(cg::shape_str(in.shape()));
    CAPTURE(cg::list_str(times));
    cg::shape_t expect_shape;
    const auto expect = repeat_ref(in, times, &expect_shape);
    const auto got = in.repeat(times);
    CHECK(got.shape() == expect_shape);
    CHECK(got.to_vector() == expect);
    CHECK(got.is_contiguous());
  }

  CHECK(error_of([&] { (void)t.repeat({2}); }) ==
        "repeat: 1 repeat counts for a tensor of rank 2; need at least one per dimension");
  CHECK_THROWS_AS((void)t.repeat({}), cg::error);
  CHECK(error_of([&] { (void)t.repeat({1, -1}); }) == "repeat: negative count in [1, -1]");
}

// ---- conversion -------------------------------------------------------------------------------

namespace {
using all_elements = std::tuple<float, double, std::int32_t, std::int64_t, std::uint8_t, bool, cg::bf16, cg::f16>;

template <class T>
cg::tensor<T> sample() {
  // Exact in every element type: 0, 1, 2, 100 (bool: 0 and non-zero).
  if constexpr (std::is_same_v<T, bool>)
    return cg::tensor<bool>::from({false, true, true, true}, {2, 2});
  else
    return cg::tensor<T>::from({T(0), T(1), T(2), T(100)}, {2, 2});
}

template <class T, class U>
void check_to() {
  CAPTURE(cg::to_string(cg::dtype_v<T>));
  CAPTURE(cg::to_string(cg::dtype_v<U>));
  const cg::tensor<U> out = sample<T>().template to<U>();
  CHECK(out.shape() == cg::shape_t{2, 2});
  CHECK(out.dtype() == cg::dtype_v<U>);
  const bool to_bool = std::is_same_v<U, bool>, from_bool = std::is_same_v<T, bool>;
  const char* expect = to_bool ? "[0, 1, 1, 1]" : from_bool ? "[0, 1, 1, 1]" : "[0, 1, 2, 100]";
  CHECK(vals(out) == expect);
  // A transposed source converts in the view's order.
  CHECK(vals(sample<T>().transpose(0, 1).template to<U>()) ==
        (to_bool || from_bool ? "[0, 1, 1, 1]" : "[0, 2, 1, 100]"));
}

template <class T, class... Us>
void check_to_all(std::tuple<Us...>*) {
  (check_to<T, Us>(), ...);
}
template <class... Ts>
void check_all_pairs(std::tuple<Ts...>*) {
  (check_to_all<Ts>(static_cast<all_elements*>(nullptr)), ...);
}
}  // namespace

TEST_CASE("tensor.to_all_dtype_pairs") {
  check_all_pairs(static_cast<all_elements*>(nullptr));
  // Fractions truncate toward zero into integers, round to nearest even into halves, and any
  // non-zero is true.
  auto f = cg::tensor<float>::from({2.75f, -1.5f, 0.25f, 0.0f}, {4});
  CHECK(vals(f.to<std::int32_t>()) == "[2, -1, 0, 0]");
  CHECK(f.to<bool>().to_vector() == std::vector<bool>{true, true, true, false});
  CHECK(vals(cg::tensor<float>::from({1.00390625f}, {1}).to<cg::bf16>()) == "[1]");
  CHECK(vals(cg::tensor<double>::from({0.1}, {1}).to<cg::f16>()) == "[0.0999756]");
  auto same = f.to<float>();  // a copy even for the same type
  CHECK(same.storage() != f.storage());
  CHECK(vals(same) == vals(f));
  CHECK(cg::full<float>({}, 3.0f).to<std::int64_t>().item() == 3);
}

// ---- printing ---------------------------------------------------------------------------------

TEST_CASE("tensor.print") {
  CHECK(str(cg::tensor<float>::from({1, 2, 3, 4}, {2, 2})) ==
        "tensor([[1., 2.],\n"
        "        [3., 4.]], dtype=f32)");
  CHECK(str(cg::tensor<float>::from({1, 2.5, -3, 0.125}, {2, 2})) ==
        "tensor([[1., 2.5],\n"
        "        [-3., 0.125]], dtype=f32)");
  CHECK(str(cg::arange<std::int32_t>(6).reshape({2, 3})) ==
        "tensor([[0, 1, 2],\n"
        "        [3, 4, 5]], dtype=i32)");
  CHECK(str(cg::tensor<std::int64_t>::from({-7, 8}, {2})) == "tensor([-7, 8], dtype=i64)");
  CHECK(str(cg::tensor<std::uint8_t>::from({0, 255}, {2})) == "tensor([0, 255], dtype=u8)");
  CHECK(str(cg::tensor<bool>::from({true, false, true}, {3})) == "tensor([True, False, True], dtype=bool)");
  CHECK(str(cg::full<float>({}, 3.5f)) == "tensor(3.5, dtype=f32)");
  CHECK(str(cg::full<float>({}, 3.0f)) == "tensor(3., dtype=f32)");
  CHECK(str(cg::full<bool>({}, false)) == "tensor(False, dtype=bool)");
  CHECK(str(cg::tensor<double>::from({0.1, 1e-5}, {2})) == "tensor([0.1, 1e-05], dtype=f64)");
  CHECK(str(cg::tensor<cg::bf16>::from({0.1f, 2}, {2})) == "tensor([0.1001, 2.], dtype=bf16)");
  CHECK(str(cg::tensor<cg::f16>::from({-0.5f}, {1})) == "tensor([-0.5], dtype=f16)");
  CHECK(str(cg::tensor<float>::from({std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(),
                                     std::numeric_limits<float>::quiet_NaN()},
                                    {3})) == "tensor([inf, -inf, nan], dtype=f32)");
  CHECK(str(cg::tensor<double>::from({1e20, -2.5e16}, {2})) == "tensor([1e+20, -2.5e+16], dtype=f64)");
  // A transposed view prints its own row-major order.
  CHECK(str(iota({2, 3}).transpose(0, 1)) ==
        "tensor([[0., 3.],\n"
        "        [1., 4.],\n"
        "        [2., 5.]], dtype=f32)");
  CHECK(str(iota({2, 1, 2})) ==
        "tensor([[[0., 1.]],\n"
        "        [[2., 3.]]], dtype=f32)");
  CHECK(str(cg::zeros<float>({0})) == "tensor([], dtype=f32)");

  // Over 1000 elements: three entries at each end of each long dimension.
  CHECK(str(cg::arange<float>(2000)) == "tensor([0., 1., 2., ..., 1997., 1998., 1999.], dtype=f32)");
  CHECK(str(iota({100, 11})) ==
        "tensor([[0., 1., 2., ..., 8., 9., 10.],\n"
        "        [11., 12., 13., ..., 19., 20., 21.],\n"
        "        [22., 23., 24., ..., 30., 31., 32.],\n"
        "        ...,\n"
        "        [1067., 1068., 1069., ..., 1075., 1076., 1077.],\n"
        "        [1078., 1079., 1080., ..., 1086., 1087., 1088.],\n"
        "        [1089., 1090., 1091., ..., 1097., 1098., 1099.]], dtype=f32)");
  // A short dim of a big tensor is printed whole.
  CHECK(str(cg::arange<std::int32_t>(1002).reshape({2, 501})) ==
        "tensor([[0, 1, 2, ..., 498, 499, 500],\n"
        "        [501, 502, 503, ..., 999, 1000, 1001]], dtype=i32)");
  // Exactly 1000 elements: no elision.
  const std::string thousand = str(cg::arange<std::int32_t>(1000));
  CHECK_FALSE(contains(thousand, "..."));
  CHECK(contains(thousand, "499, 500, 501"));
}

// ---- random -------------------------------------------------------------------------------------

TEST_CASE("tensor.uniform") {
  auto a = cg::uniform<float>({64, 16}, -2.0, 3.0, 42);
  auto b = cg::uniform<float>({64, 16}, -2.0, 3.0, 42);
  auto c = cg::uniform<float>({64, 16}, -2.0, 3.0, 43);
  CHECK(a.shape() == cg::shape_t{64, 16});
  CHECK(a.to_vector() == b.to_vector());  // reproducible from the seed
  CHECK(a.to_vector() != c.to_vector());
  int zeros = 0, negatives = 0;
  float lo = 1e9f, hi = -1e9f;
  for (float v : a.to_vector()) {
    zeros += v == 0.0f;
    negatives += v < 0.0f;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  CHECK(zeros == 0);
  CHECK(lo >= -2.0f);
  CHECK(hi < 3.0f);
  CHECK(negatives > 100);  // about 40% of 1024
  CHECK(negatives < 700);
  CHECK(hi - lo > 4.5f);   // spread over the range

  // The default range [-1, 1). Without a seed, uniform draws from the rank's default generator
  // (API.md): two draws differ, and manual_seed makes them reproducible.
  cg::manual_seed(7);
  auto d = cg::uniform<double>({100});
  CHECK(d.to_vector() != cg::uniform<double>({100}).to_vector());
  cg::manual_seed(7);
  CHECK(d.to_vector() == cg::uniform<double>({100}).to_vector());
  for (double v : d.to_vector()) CHECK((v >= -1.0 && v < 1.0));

  // Integers: values drawn from [lo, hi) rounded down.
  auto i = cg::uniform<std::int32_t>({1000}, 0, 10, 1);
  int seen[10] = {};
  for (auto v : i.to_vector()) {
    REQUIRE(v >= 0);
    REQUIRE(v < 10);
    ++seen[v];
  }
  for (int k = 0; k < 10; ++k) CHECK(seen[k] > 0);
  auto u8 = cg::uniform<std::uint8_t>({200}, 0, 256, 5);
  int big = 0;
  for (auto v : u8.to_vector()) big += v >= 128;
  CHECK(big > 50);
  CHECK(big < 150);

  // The default range with an unsigned type: -1 wraps (no undefined float-to-unsigned cast).
  auto u8d = cg::uniform<std::uint8_t>({100});
  for (auto v : u8d.to_vector()) CHECK((v == 0 || v == 255));

  // Bool: a fair coin.
  auto coin = cg::uniform<bool>({1000}, -1.0, 1.0, 3);
  int heads = 0;
  for (bool v : coin.to_vector()) heads += v;
  CHECK(heads > 400);
  CHECK(heads < 600);

  // Halves: rounded to the format, so the upper bound may be reached.
  auto h = cg::uniform<cg::bf16>({500}, 0.0, 1.0, 9);
  int hz = 0;
  for (auto v : h.to_vector()) {
    CHECK((float(v) >= 0.0f && float(v) <= 1.0f));
    hz += float(v) == 0.0f;
  }
  CHECK(hz < 5);
}

// ---- pending tensors ----------------------------------------------------------------------------

namespace {
/// Completes `w` from another thread if the test body has not signalled `done()` within a few
/// seconds, so a view that wrongly blocks fails the test instead of hanging it.
class rescuer {
 public:
  explicit rescuer(cg::detail::work_ptr w)
      : thread_([this, w] {
          std::unique_lock lk(mu_);
          if (!cv_.wait_for(lk, std::chrono::seconds(10), [&] { return done_; })) {
            rescued_ = true;
            lk.unlock();
            w->complete();
          }
        }) {}
  void done() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  bool rescued() const { return rescued_; }
  ~rescuer() {
    if (thread_.joinable()) done();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> rescued_{false};
  std::thread thread_;
};

/// A [3, 4] float tensor over fresh storage whose producer has not finished.
cg::tensor<float> pending_tensor(const cg::detail::work_ptr& w) {
  auto backing = cg::zeros<float>({3, 4});
  return cg::tensor<float>(backing.storage(), {3, 4}, {4, 1}, 0, w);
}
}  // namespace

TEST_CASE("tensor.pending.views_do_not_wait") {
  auto w = std::make_shared<cg::detail::work>();
  auto t = pending_tensor(w);
  CHECK(t.is_pending());
  CHECK(t.pending_work() == w);
  rescuer guard(w);
  // Metadata and views never wait, and keep the pending state.
  CHECK(t.shape() == cg::shape_t{3, 4});
  CHECK(t.numel() == 12);
  CHECK(t.is_contiguous());
  CHECK(t.data_unsynced() != nullptr);
  std::vector<cg::tensor<float>> views = {
      t.reshape({4, 3}), t.reshape({-1}), t.view({2, 6}), t.flatten(),
      t.narrow(1, 1, 2), t.narrow(0, -1, 1), t.select(0, 1), t.select(1, -1),
      t.transpose(0, 1), t.permute({1, 0}), t.unsqueeze(0), t.unsqueeze(-1),
      t.contiguous(),  // already contiguous: no copy, no wait
  };
  for (auto& c : t.chunk(2)) views.push_back(c);
  for (auto& c : t.chunk(3, 1)) views.push_back(c);
  views.push_back(t.transpose(0, 1).unsqueeze(1).select(2, 0).narrow(0, 1, 2));  // chained
  auto copy = t;  // a handle copy
  views.push_back(copy);
  CHECK(views.size() == 19);
  for (auto& v : views) {
    CHECK(v.pending_work() == w);
    CHECK(v.is_pending());
    CHECK(v.storage() == t.storage());
  }
  guard.done();
  CHECK_FALSE(guard.rescued());
  CHECK_FALSE(w->ready());  // nothing above completed or waited on it
  w->complete();
  CHECK(w->ready());
  for (auto& v : views) CHECK_FALSE(v.is_pending());  // ready work: no longer pending
}

TEST_CASE("tensor.pending.reads_wait_for_the_producer") {
  using namespace std::chrono_literals;
  auto w = std::make_shared<cg::detail::work>();
  auto t = pending_tensor(w);
  auto row = t.select(0, 2);
  auto col = t.transpose(0, 1).narrow(0, 1, 1);
  std::atomic<bool> written{false};
  float* p = t.data_unsynced();  // what a communication worker writes through
  std::thread producer([&] {
    std::this_thread::sleep_for(100ms);
    for (int i = 0; i < 12; ++i) p[i] = static_cast<float>(10 * i);
    written = true;
    w->complete();
  });
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> v = t.to_vector();  // blocks until complete()
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(written.load());
  CHECK(waited >= 50ms);
  CHECK(v == std::vector<float>{0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110});
  producer.join();
  // After the first wait the tensor is no longer pending, and drops its completion.
  CHECK_FALSE(t.is_pending());
  CHECK(t.pending_work() == nullptr);
  // Views made before still hold the (completed) work; reading them does not block.
  CHECK(row.pending_work() == w);
  CHECK_FALSE(row.is_pending());
  CHECK(vals(row) == "[80, 90, 100, 110]");
  CHECK(row.pending_work() == nullptr);
  CHECK(vals(col) == "[10, 50, 90]");
  t.wait();  // a no-op now
  // Views taken after the wait are not pending.
  CHECK(t.reshape({12}).pending_work() == nullptr);
}

TEST_CASE("tensor.pending.data_and_other_reads_wait") {
  using namespace std::chrono_literals;
  // data(), item(), at(), printing, clone, copies and conversions all wait.
  auto run = [](auto read) {
    auto w = std::make_shared<cg::detail::work>();
    auto t = pending_tensor(w);
    std::atomic<bool> completed{false};
    float* p = t.data_unsynced();
    std::thread producer([&] {
      std::this_thread::sleep_for(30ms);
      p[5] = 7.0f;
      completed = true;
      w->complete();
    });
    read(t);
    const bool ok = completed.load();
    producer.join();
    return ok && !t.is_pending();
  };
  CHECK(run([](const cg::tensor<float>& t) { CHECK(t.data()[5] == 7.0f); }));
  CHECK(run([](const cg::tensor<float>& t) { CHECK(t.at({1, 1}) == 7.0f); }));
  CHECK(run([](const cg::tensor<float>& t) { CHECK(t.select(0, 1).select(0, 1).item() == 7.0f); }));
  CHECK(run([](const cg::tensor<float>& t) { CHECK(t.clone().at({1, 1}) == 7.0f); }));
  CHECK(run([](const cg::tensor<float>& t) { CHECK(t.to<double>().at({1, 1}) == 7.0); }));
  CHECK(run([](const cg::tensor<float>& t) { CHECK(t.repeat({1, 1}).at({1, 1}) == 7.0f); }));
  CHECK(run([](const cg::tensor<float>& t) { CHECK(t.transpose(0, 1).contiguous().at({1, 1}) == 7.0f); }));
  CHECK(run([](const cg::tensor<float>& t) { CHECK(contains(str(t), "7.")); }));
  CHECK(run([](const cg::tensor<float>& t) { t.wait(); }));
  CHECK(run([](cg::tensor<float> t) {
    auto dst = cg::zeros<float>({3, 4});
    dst.copy_(t);
    CHECK(dst.at({1, 1}) == 7.0f);
    t.wait();
  }));
}

TEST_CASE("tensor.pending.failed_work_rethrows") {
  auto w = std::make_shared<cg::detail::work>();
  auto t = pending_tensor(w);
  auto v = t.narrow(0, 0, 2);
  std::thread producer([&] { w->fail(std::make_exception_ptr(cg::error("all_reduce: rank 1 failed"))); });
  producer.join();
  CHECK(w->ready());
  CHECK_FALSE(t.is_pending());  // finished, though with an error
  CHECK_THROWS_WITH_AS(t.data(), "all_reduce: rank 1 failed", cg::error);
  CHECK_THROWS_WITH_AS(t.wait(), "all_reduce: rank 1 failed", cg::error);  // every time
  CHECK(t.pending_work() == w);  // the failure stays attached
  CHECK_THROWS_AS((void)t.to_vector(), cg::error);
  CHECK_THROWS_AS((void)v.to_vector(), cg::error);  // views share the failure
  CHECK_THROWS_AS((void)str(v), cg::error);
  // The first finish wins: completing afterwards changes nothing.
  w->complete();
  CHECK_THROWS_AS(t.wait(), cg::error);

  // Non-ccgraph exceptions travel too.
  auto w2 = std::make_shared<cg::detail::work>();
  auto t2 = pending_tensor(w2);
  w2->fail(std::make_exception_ptr(std::logic_error("boom")));
  CHECK_THROWS_WITH_AS(t2.wait(), "boom", std::logic_error);
}

TEST_CASE("tensor.pending.many_waiters") {
  // Several threads wait on views of one pending tensor; one completion releases them all.
  auto w = std::make_shared<cg::detail::work>();
  auto t = pending_tensor(w);
  auto chunks = t.chunk(3);
  std::atomic<int> released{0};
  std::vector<std::thread> waiters;
  for (auto& c : chunks)
    waiters.emplace_back([c, &released] {
      c.wait();
      ++released;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(released.load() == 0);
  w->complete();
  for (auto& th : waiters) th.join();
  CHECK(released.load() == 3);
  CHECK(t.is_pending() == false);
}
