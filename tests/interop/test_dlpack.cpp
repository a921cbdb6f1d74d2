// tests/interop/test_dlpack.cpp: interop/dlpack.hpp (to_dlpack, from_dlpack) and
// tensor/from_blob.hpp: zero-copy views both ways, lifetimes (each owner released exactly once,
// after the last view), strides and offsets, every dtype's DLPack type, and the errors.
#include <ccgraph/ccgraph.hpp>
#include <ccgraph/interop/dlpack.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

namespace dlpack_test {
namespace cg = ccgraph;

TEST_CASE("from_blob.views_foreign_memory_and_runs_the_deleter_once_after_the_last_view") {
  std::vector<float> buf{1, 2, 3, 4, 5, 6};
  int deleted = 0;
  {
    cg::tensor<float> v;
    {
      auto t = cg::from_blob(buf.data(), {2, 3}, [&](float* p) {
        CHECK(p == buf.data());
        ++deleted;
      });
      CHECK(t.data() == buf.data());
      CHECK(t.device().is_cpu());
      CHECK(t.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
      buf[4] = 50;  // no copy: the tensor sees the caller's writes
      CHECK(t.at({1, 1}) == 50);
      v = t.transpose(0, 1);  // a view keeps the memory
    }
    CHECK(deleted == 0);
    CHECK(v.to_vector() == std::vector<float>{1, 4, 2, 50, 3, 6});
  }
  CHECK(deleted == 1);
}

TEST_CASE("from_blob.strided_and_errors") {
  std::vector<std::int64_t> buf{0, 1, 2, 3, 4, 5, 6, 7};
  // Every other element: shape [2, 2], strides [4, 2].
  auto t = cg::from_blob(buf.data(), {2, 2}, {4, 2}, [](std::int64_t*) {});
  CHECK(t.to_vector() == std::vector<std::int64_t>{0, 2, 4, 6});
  CHECK(t.storage()->bytes() == 7 * sizeof(std::int64_t));  // the extent reached, not more
  int deleted = 0;
  auto del = [&](std::int64_t*) { ++deleted; };
  CHECK_THROWS_WITH(cg::from_blob(buf.data(), {2, 2}, {-1, 1}, del), doctest::Contains("stride -1 of dim 0 is negative"));
  CHECK_THROWS_WITH(cg::from_blob(buf.data(), {2, 2}, {1}, del), doctest::Contains("1 strides for a shape of rank 2"));
  CHECK_THROWS_WITH(cg::from_blob(static_cast<std::int64_t*>(nullptr), {3}, del), doctest::Contains("from_blob: null pointer"));
  CHECK_THROWS_WITH(cg::from_blob(buf.data(), {-2}, del), doctest::Contains("from_blob"));
  CHECK(deleted == 0);  // on an error the caller keeps the memory
  auto empty = cg::from_blob(static_cast<std::int64_t*>(nullptr), {0, 3}, del);
  CHECK(empty.numel() == 0);
}

TEST_CASE("dlpack.export_views_the_same_memory_and_outlives_the_tensor") {
  DLManagedTensor* m = nullptr;
  const float* data = nullptr;
  {
    auto t = cg::tensor<float>::from({1, 2, 3, 4, 5, 6}, {2, 3});
    data = t.data();
    m = cg::to_dlpack(t.transpose(0, 1));
  }
  REQUIRE(m != nullptr);
  const DLTensor& d = m->dl_tensor;
  CHECK(d.data == data);
  CHECK(d.device.device_type == kDLCPU);
  CHECK(d.ndim == 2);
  CHECK(d.shape[0] == 3);
  CHECK(d.shape[1] == 2);
  CHECK(d.strides[0] == 1);
  CHECK(d.strides[1] == 3);
  CHECK(d.dtype.code == kDLFloat);
  CHECK(d.dtype.bits == 32);
  CHECK(d.dtype.lanes == 1);
  CHECK(d.byte_offset == 0);
  CHECK(static_cast<const float*>(d.data)[5] == 6);  // the storage outlived the tensor
  m->deleter(m);
}

TEST_CASE("dlpack.round_trip_shares_memory_and_releases_once") {
  auto t = cg::tensor<double>::from({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  auto n = t.narrow(1, 1, 2);  // an offset view: [[2, 3], [6, 7]]
  auto u = cg::from_dlpack<double>(cg::to_dlpack(n));
  CHECK(u.data() == n.data());
  CHECK(u.shape() == cg::shape_t{2, 2});
  CHECK(u.strides() == cg::strides_t{4, 1});
  CHECK(u.to_vector() == std::vector<double>{2, 3, 6, 7});
  t.fill_(0);
  CHECK(u.to_vector() == std::vector<double>{0, 0, 0, 0});  // one memory
}

// A producer's tensor: counts its deleter's calls.
struct producer {
  std::vector<std::int64_t> shape, strides;
  std::vector<unsigned char> bytes;
  DLManagedTensor m{};
  int deleted = 0;
  DLManagedTensor* make(DLDataType type, std::vector<std::int64_t> sh, std::vector<std::int64_t> st = {},
                        std::uint64_t byte_offset = 0) {
    shape = std::move(sh);
    strides = std::move(st);
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    bytes.assign(static_cast<std::size_t>(n) * type.bits / 8 + byte_offset + 64, 0);
    m.dl_tensor.data = bytes.data();
    m.dl_tensor.device = {kDLCPU, 0};
    m.dl_tensor.ndim = static_cast<std::int32_t>(shape.size());
    m.dl_tensor.dtype = type;
    m.dl_tensor.shape = shape.data();
    m.dl_tensor.strides = strides.empty() ? nullptr : strides.data();
    m.dl_tensor.byte_offset = byte_offset;
    m.manager_ctx = this;
    m.deleter = [](DLManagedTensor* p) { ++static_cast<producer*>(p->manager_ctx)->deleted; };
    return &m;
  }
};

TEST_CASE("dlpack.import_of_a_foreign_producer") {
  producer p;
  {
    // Compact (null strides, as DLPack allows) with a byte offset.
    DLManagedTensor* m = p.make({kDLInt, 32, 1}, {2, 3}, {}, 8);
    auto* q = reinterpret_cast<std::int32_t*>(p.bytes.data() + 8);
    for (int i = 0; i < 6; ++i) q[i] = i * 10;
    auto t = cg::from_dlpack<std::int32_t>(m);
    CHECK(t.data() == q);
    CHECK(t.to_vector() == std::vector<std::int32_t>{0, 10, 20, 30, 40, 50});
    auto v = t.transpose(0, 1);
    t = {};
    CHECK(p.deleted == 0);
    CHECK(v.at({2, 1}) == 50);
  }
  CHECK(p.deleted == 1);
}

TEST_CASE("dlpack.every_dtype_round_trips_its_type") {
  auto check = [](auto tag) {
    using T = decltype(tag);
    auto t = cg::zeros<T>({3});
    DLManagedTensor* m = cg::to_dlpack(t);
    CHECK(cg::detail::dtype_of_dl(m->dl_tensor.dtype) == cg::dtype_v<T>);
    auto u = cg::from_dlpack<T>(m);
    CHECK(u.data() == t.data());
  };
  check(float{});
  check(double{});
  check(std::int32_t{});
  check(std::int64_t{});
  check(std::uint8_t{});
  check(bool{});
  check(cg::bf16{});
  check(cg::f16{});
  check(std::complex<float>{});
  check(std::complex<double>{});
  CHECK(cg::detail::dl_dtype_of(cg::dtype::boolean).code == 6);  // kDLBool, as PyTorch exports
}

TEST_CASE("dlpack.import_errors_leave_ownership_with_the_caller") {
  producer p;
  CHECK_THROWS_WITH(cg::from_dlpack<float>(p.make({kDLFloat, 64, 1}, {2})),
                    doctest::Contains("from_dlpack: the DLPack tensor is f64, not f32"));
  CHECK_THROWS_WITH(cg::from_dlpack<float>(p.make({kDLInt, 8, 1}, {2})),
                    doctest::Contains("DLPack type int8 has no ccgraph dtype"));
  CHECK_THROWS_WITH(cg::from_dlpack<float>(p.make({kDLFloat, 32, 4}, {2})),
                    doctest::Contains("float32x4 has no ccgraph dtype"));
  CHECK_THROWS_WITH(cg::from_dlpack<float>(p.make({kDLFloat, 32, 1}, {2, 2}, {-2, 1})),
                    doctest::Contains("is negative"));
  CHECK_THROWS_WITH(cg::from_dlpack<float>(p.make({kDLFloat, 32, 1}, {2}, {}, 2)),
                    doctest::Contains("byte_offset 2 is not a multiple of 4"));
  DLManagedTensor* m = p.make({kDLFloat, 32, 1}, {2});
  m->dl_tensor.device = {kDLVulkan, 0};
  CHECK_THROWS_WITH(cg::from_dlpack<float>(m), doctest::Contains("device type 7 is neither host nor CUDA"));
  m->dl_tensor.device = {kDLCUDA, 0};
  if (cg::detail::device_runtime_slot() == nullptr)
    CHECK_THROWS_WITH(cg::from_dlpack<float>(m), doctest::Contains("no device backend is installed"));
  CHECK_THROWS_WITH(cg::from_dlpack<float>(nullptr), doctest::Contains("null DLManagedTensor"));
  CHECK(p.deleted == 0);
}
}  // namespace dlpack_test
