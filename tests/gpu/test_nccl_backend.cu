// The nccl backend and device tensors: every result is compared with the CPU (threads)
// backend's on the same inputs, on 1, 2 and 4 GPUs. Cases that need a GPU (or two, or four) are
// skipped without them.
#include <ccgraph/cuda.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include <doctest/doctest.h>

#include "../../examples/programs.hpp"
#include "gpu_test.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <memory>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_nccl_backend {

namespace cg = ccgraph;

namespace {

/// Host values of a tensor as doubles (any element type).
template <class T>
std::vector<double> values(const cg::tensor<T>& t) {
  std::vector<double> out;
  for (auto v : t.to_vector()) out.push_back(static_cast<double>(static_cast<float>(v)));
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
  }
}

/// Named results of one rank.
using results = std::map<std::string, std::vector<double>>;

/// Runs `fn` on n ranks of the threads backend and of the nccl backend and compares every
/// named result of every rank.
template <class F>
void same_as_threads(int n, F fn, double tol = 0) {
  std::vector<results> cpu(static_cast<std::size_t>(n)), gpu(static_cast<std::size_t>(n));
  cg::run_threads(n, [&](cg::rank_context& ctx) { cpu[static_cast<std::size_t>(ctx.rank())] = fn(ctx); });
  cg::cuda::run_gpus(n, [&](cg::rank_context& ctx) {
    CHECK(ctx.device() == cg::device::cuda(ctx.rank()));
    gpu[static_cast<std::size_t>(ctx.rank())] = fn(ctx);
  });
  for (int r = 0; r < n; ++r) {
    const auto& c = cpu[static_cast<std::size_t>(r)];
    const auto& g = gpu[static_cast<std::size_t>(r)];
    REQUIRE(c.size() == g.size());
    for (auto& [name, want] : c) {
      REQUIRE(g.count(name) == 1);
      check_close(g.at(name), want, tol, "rank " + std::to_string(r) + " of " + std::to_string(n) + ": " + name);
    }
  }
}

/// Every functional collective on float inputs that differ per rank.
results collective_suite(cg::rank_context& ctx) {
  const int r = ctx.rank(), n = ctx.world_size();
  const auto w = ctx.world();
  results out;
  auto x = cg::arange<float>(0, 8 * n) .reshape({2 * n, 4});
  x = x + static_cast<float>(100 * r);
  out["all_reduce.sum"] = values(cg::all_reduce(x, "sum", w));
  out["all_reduce.max"] = values(cg::all_reduce(x, "max", w));
  out["all_reduce.avg"] = values(cg::all_reduce(x, cg::reduce_op::avg, w));
  out["all_reduce.expr"] = values(cg::all_reduce(cg::relu(x) * 0.5f, "sum", w));
  out["all_gather.dim0"] = values(cg::all_gather_tensor(x, 0, w));
  out["all_gather.dim1"] = values(cg::all_gather_tensor(x, 1, w));
  out["reduce_scatter.dim0"] = values(cg::reduce_scatter_tensor(x, "sum", 0, w));
  out["reduce_scatter.dim1"] = values(cg::reduce_scatter_tensor(x.transpose(0, 1).contiguous(), "sum", 1, w));
  out["all_to_all.equal"] = values(cg::all_to_all_single(x, std::nullopt, std::nullopt, w));
  {
    // Uneven splits: rank r sends r+1 rows to each peer... sizes agree pairwise.
    std::vector<std::int64_t> in_splits(static_cast<std::size_t>(n)), out_splits(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) {
      in_splits[static_cast<std::size_t>(j)] = 1 + j;  // what I send to j: j+1 rows
      out_splits[static_cast<std::size_t>(j)] = 1 + r;  // what j sends me: r+1 rows
    }
    std::int64_t rows = 0;
    for (auto s : in_splits) rows += s;
    auto y = cg::arange<float>(0, static_cast<double>(rows * 3)).reshape({rows, 3}) + static_cast<float>(10 * r);
    out["all_to_all.uneven"] = values(cg::all_to_all_single(cg::tensor<float>(y), out_splits, in_splits, w));
  }
  out["broadcast.src0"] = values(cg::broadcast(x, 0, w));
  out["broadcast.srclast"] = values(cg::broadcast(x, n - 1, w));
  {
    std::vector<int> shift(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) shift[static_cast<std::size_t>(i)] = (i + 1) % n;
    out["permute.shift"] = values(cg::permute_tensor(x, shift, w));
  }
  {
    std::vector<cg::tensor<float>> ts{x, x * 2.f, cg::tensor<float>(x.narrow(0, 0, n) + 1.f)};
    auto rs = cg::all_reduce_coalesced(ts, "sum", w);
    for (std::size_t i = 0; i < rs.size(); ++i) out["all_reduce_coalesced." + std::to_string(i)] = values(rs[i]);
    auto gs = cg::all_gather_into_tensor_coalesced(ts, w);
    for (std::size_t i = 0; i < gs.size(); ++i) out["all_gather_coalesced." + std::to_string(i)] = values(gs[i]);
  }
  {
    auto y = cg::tensor<float>(x * 1.f);
    cg::all_reduce_(y, "sum", w);
    out["all_reduce_.in_place"] = values(y);
  }
  {
    // bf16: small integers whose partial sums stay integers below 256 (exact in bf16) on up to
    // 8 ranks, so every summation order gives the same bits. (With x's values, x.to<bf16>(),
    // NCCL's ring on 4 GPUs rounded its partial sums differently from the threads backend: 600
    // for 604, 4 = one bf16 step apart.)
    std::vector<double> small(static_cast<std::size_t>(8 * n));
    for (std::size_t i = 0; i < small.size(); ++i) small[i] = static_cast<double>(i % 16 + static_cast<std::size_t>(r));
    const auto xb = cg::tensor<double>::from(small, {2 * n, 4}).to<cg::bf16>();
    out["all_reduce.bf16"] = values(cg::all_reduce(xb, "sum", w));
    auto xi = x.to<std::int32_t>();
    out["all_reduce.i32.min"] = values(cg::all_reduce(xi, "min", w));
  }
  // A group of one rank (each rank its own), by MPMD lists.
  {
    std::vector<std::vector<int>> singles;
    for (int i = 0; i < n; ++i) singles.push_back({i});
    out["all_reduce.singleton_groups"] = values(cg::all_reduce(x, "sum", cg::group{singles}));
  }
  return out;
}

}  // namespace

TEST_CASE("nccl.device_present") {
  if (ccgraph_test::gpu_count() < 1) MESSAGE("no CUDA device: the nccl backend cases are skipped");
  if (ccgraph_test::gpu_count() == 1) MESSAGE("one CUDA device: the two-rank cases are skipped");
}

GPU_TEST_CASE("device_tensor.round_trip_and_factories") {
  cg::device_guard on(cg::device::cuda(0));
  auto a = cg::tensor<float>::from({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(a.device() == cg::device::cuda(0));
  CHECK(a.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
  auto h = a.cpu();
  CHECK(h.device().is_cpu());
  auto z = cg::zeros<float>({3});
  CHECK(z.to_vector() == std::vector<float>{0, 0, 0});
  auto r = cg::arange<std::int64_t>(5);
  CHECK(r.to_vector() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  CHECK(cg::full<float>({1}, 7.f).item() == 7.f);
  CHECK_THROWS_AS((void)a.at({0, 0}), cg::error);
}

GPU_TEST_CASE("device_tensor.pointwise_views_and_casts_match_cpu") {
  const auto ha = cg::uniform<float>({33, 65}, -2, 2, 1);
  const auto hb = cg::uniform<float>({65}, -2, 2, 2);
  cg::device_guard on(cg::device::cuda(0));
  const auto a = ha.cuda(0), b = hb.cuda(0);
  // flat, broadcast row, transposed operand, scalar mix
  check_close(values(cg::tensor<float>(cg::gelu(a) * 2.f - cg::relu(a))),
              values(cg::tensor<float>(cg::gelu(ha) * 2.f - cg::relu(ha))), 1e-6, "flat");
  check_close(values(cg::tensor<float>(a + b)), values(cg::tensor<float>(ha + hb)), 0, "broadcast");
  check_close(values(cg::tensor<float>(cg::silu(a.transpose(0, 1)))),
              values(cg::tensor<float>(cg::silu(ha.transpose(0, 1)))), 1e-6, "transposed");
  check_close(values(a.transpose(0, 1).contiguous()), values(ha.transpose(0, 1).contiguous()), 0, "contiguous");
  check_close(values(a.to<cg::bf16>()), values(ha.to<cg::bf16>()), 0, "to bf16");
  check_close(values(a.repeat({2, 1})), values(ha.repeat({2, 1})), 0, "repeat");
  check_close(values(cg::cat({a, cg::tensor<float>(a * 3.f)}, 1)), values(cg::cat({ha, cg::tensor<float>(ha * 3.f)}, 1)), 0, "cat");
  auto c = cg::zeros<float>({33, 65});
  cg::copy(c, a.narrow(0, 0, 1));
  check_close(values(c), values(ha.narrow(0, 0, 1).repeat({33, 1})), 0, "copy broadcast");
  const auto ab = a.to<cg::bf16>();
  const auto hab = ha.to<cg::bf16>();
  check_close(values(cg::tensor<cg::bf16>(cg::silu(ab) * ab)), values(cg::tensor<cg::bf16>(cg::silu(hab) * hab)),
              1e-2, "bf16 chain");
}

GPU_TEST_CASE("device_tensor.matmul_matches_cpu") {
  const auto ha = cg::uniform<float>({37, 61}, -1, 1, 3);
  const auto hb = cg::uniform<float>({61, 53}, -1, 1, 4);
  const auto hc = cg::uniform<float>({3, 37, 61}, -1, 1, 5);
  const auto hv = cg::uniform<float>({61}, -1, 1, 6);
  cg::device_guard on(cg::device::cuda(0));  // factories below create on the GPU
  const auto a = ha.cuda(0), b = hb.cuda(0);
  check_close(values(cg::matmul(a, b)), values(cg::matmul(ha, hb)), 1e-4, "f32");
  check_close(values(cg::matmul(b.transpose(0, 1), a.transpose(0, 1))),
              values(cg::matmul(hb.transpose(0, 1), ha.transpose(0, 1))), 1e-4, "transposed operands");
  check_close(values(cg::matmul(a.to<cg::bf16>(), b.to<cg::bf16>())),
              values(cg::matmul(ha.to<cg::bf16>(), hb.to<cg::bf16>())), 2e-2, "bf16");
  // batched with a broadcast batch dim, and a vector operand
  check_close(values(cg::matmul(hc.cuda(0), b)), values(cg::matmul(hc, hb)), 1e-4, "batched");
  check_close(values(cg::matmul(a, hv.cuda(0))), values(cg::matmul(ha, hv)), 1e-4, "matrix-vector");
}

GPU_TEST_CASE("device_tensor.mixed_devices_are_errors") {
  cg::device_guard on(cg::device::cuda(0));
  auto a = cg::ones<float>({4});
  auto h = cg::tensor<float>::empty({4}, cg::device::cpu());
  CHECK_THROWS_WITH_AS((void)cg::tensor<float>(a + h), doctest::Contains("on cpu"), cg::error);
  CHECK_THROWS_AS(h.copy_(a), cg::error);
}

GPU_TEST_CASE("device_tensor.block_cache_reuses_small_blocks_on_the_rank_stream") {
  cg::cuda::run_gpus(1, [&](cg::rank_context& ctx) {
    using cache = cg::cuda::detail::block_cache;
    const auto s0 = cg::cuda::block_cache_stats();
    const void* first = nullptr;
    {
      auto a = cg::full<float>({1000}, 2.f);  // 4000 bytes: a 4096-byte block
      first = a.storage()->data();
      CHECK(a.to_vector() == std::vector<float>(1000, 2.f));
    }
    CHECK(cg::cuda::block_cache_stats().cached_bytes == s0.cached_bytes + 4096);
    auto b = cg::full<float>({1024}, 3.f);  // 4096 bytes: the same size class, the same block
    CHECK(b.storage()->data() == first);
    CHECK(b.to_vector() == std::vector<float>(1024, 3.f));
    const auto s1 = cg::cuda::block_cache_stats();
    CHECK(s1.hits == s0.hits + 1);
    CHECK(s1.cached_bytes == s0.cached_bytes);

    // Above max_block: straight to the pool, never held.
    { auto big = cg::tensor<float>::empty({static_cast<std::int64_t>(cache::max_block / 4 + 1)}); }
    CHECK(cg::cuda::block_cache_stats().cached_bytes == s1.cached_bytes);
    CHECK(cg::cuda::block_cache_stats().owned_blocks == s1.owned_blocks);

    // A result computed into a reused block is right, even with the old user still queued.
    for (int i = 0; i < 20; ++i) {
      auto x = cg::full<float>({256}, static_cast<float>(i));
      auto y = cg::tensor<float>(x * 2.f + 1.f);
      CHECK(y.to_vector() == std::vector<float>(256, 2.f * static_cast<float>(i) + 1.f));
    }
    CHECK(cg::cuda::block_cache_stats().hits > s1.hits);

    // While the stream records a CUDA Graph the cache neither hands out nor keeps blocks.
    { auto c = cg::tensor<float>::empty({1024}); }  // one 4096-byte block held
    const auto s2 = cg::cuda::block_cache_stats();
    CHECK(s2.cached_bytes >= 4096);
    const cudaStream_t st = cg::cuda::current_stream();
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    {
      auto in_graph = cg::tensor<float>::empty({1024});
      CHECK(in_graph.storage()->data() != b.storage()->data());
    }
    REQUIRE(cudaStreamEndCapture(st, &graph) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
    const auto s3 = cg::cuda::block_cache_stats();
    CHECK(s3.hits == s2.hits);
    CHECK(s3.cached_bytes == s2.cached_bytes);
    CHECK(s3.owned_blocks == s2.owned_blocks);

    // A block freed on another thread goes to the pool, and the cache forgets it (the pool may
    // hand the address out again).
    {
      auto t = cg::full<float>({300}, 4.f);
      CHECK(t.to_vector() == std::vector<float>(300, 4.f));  // (its users are done)
      const auto held = cg::cuda::block_cache_stats();
      std::thread([moved = std::move(t)]() mutable { auto last = std::move(moved); }).join();
      CHECK(cg::cuda::block_cache_stats().owned_blocks == held.owned_blocks - 1);
      CHECK(cg::cuda::block_cache_stats().cached_bytes == held.cached_bytes);
    }

    // Another stream of the same thread has no cache: its blocks go to the pool.
    cg::cuda::stream other;
    {
      cg::cuda::stream_guard on(other.get());
      CHECK(cg::cuda::block_cache_stats().owned_blocks == 0);
      auto d = cg::full<float>({1024}, 1.f);
      CHECK(d.to_vector() == std::vector<float>(1024, 1.f));
    }
    CHECK(cg::cuda::block_cache_stats().hits == s3.hits);
    CHECK(ctx.rank() == 0);

    // empty_cache gives the cached blocks and the pool's unused memory back to the driver.
    cudaMemPool_t pool = nullptr;
    REQUIRE(cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess);
    auto reserved = [&] {
      std::uint64_t v = 0;
      REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v) == cudaSuccess);
      return v;
    };
    { auto big = cg::full<float>({std::int64_t{64} << 20}, 1.f); }  // 256 MiB, back in the pool
    const std::uint64_t before = reserved();
    CHECK(before >= (std::uint64_t{256} << 20));
    CHECK(cg::cuda::block_cache_stats().cached_bytes > 0);
    cg::cuda::empty_cache();
    CHECK(cg::cuda::block_cache_stats().cached_bytes == 0);
    CHECK(reserved() + (std::uint64_t{256} << 20) <= before);
    CHECK(cg::full<float>({1024}, 2.f).to_vector() == std::vector<float>(1024, 2.f));  // still works
  });
  // Outside a rank there is no cache at all.
  CHECK(cg::cuda::block_cache_stats().owned_blocks == 0);
}

GPU_TEST_CASE("nccl.collectives_match_threads_backend.1_gpu") { same_as_threads(1, collective_suite); }

TEST_CASE("nccl.collectives_match_threads_backend.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  same_as_threads(2, collective_suite);
}

TEST_CASE("nccl.subgroups_and_mesh_dims.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  same_as_threads(2, [](cg::rank_context& ctx) {
    results out;
    auto x = cg::full<float>({4}, static_cast<float>(ctx.rank() + 1));
    cg::device_mesh mesh({1, 2});
    out["mesh.dim1"] = values(cg::all_reduce(x, "sum", cg::group{mesh, 1}));
    out["mesh.dim0"] = values(cg::all_reduce(x, "sum", cg::group{mesh, 0}));
    ctx.register_group("pair", {1, 0});
    out["named.reversed"] = values(cg::all_gather_tensor(x, 0, cg::group{std::string("pair")}));
    return out;
  });
}

TEST_CASE("nccl.tagged_groups_get_their_own_communicators.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  // Two groups over the same ranks with different tags (FSDP's all_gather and reduce_scatter
  // groups) are two communicators, as two c10d process groups are; the same tag again reuses
  // its communicator. Results match the threads backend's.
  same_as_threads(2, [](cg::rank_context& ctx) {
    results out;
    auto x = cg::full<float>({8}, static_cast<float>(ctx.rank() + 1));
    const cg::group ag{std::vector<int>{0, 1}, "fsdp_ag"}, rs{std::vector<int>{0, 1}, "fsdp_rs"};
    for (int step = 0; step < 2; ++step) {
      const std::string s = std::to_string(step);
      out["ag." + s] = values(cg::all_gather_tensor(x, 0, ag));
      out["rs." + s] = values(cg::reduce_scatter_tensor(x, "sum", 0, rs));
      out["world." + s] = values(cg::all_reduce(x, "sum", ctx.world()));
      out["world_tagged." + s] = values(cg::all_reduce(x, "max", ctx.world().tagged("fsdp_ag")));
    }
    if (auto* r = dynamic_cast<cg::cuda::detail::nccl_rank*>(&ctx.comm())) {
      using key = std::pair<std::vector<int>, std::string>;
      const auto comms = r->communicators();
      CHECK(comms.size() == 3);  // the world's, and one per tag (the tagged world is [0, 1] "fsdp_ag")
      CHECK(std::count(comms.begin(), comms.end(), key{{0, 1}, ""}) == 1);
      CHECK(std::count(comms.begin(), comms.end(), key{{0, 1}, "fsdp_ag"}) == 1);
      CHECK(std::count(comms.begin(), comms.end(), key{{0, 1}, "fsdp_rs"}) == 1);
    }
    return out;
  });
}

namespace {

/// What one rank got from every (collective, reduce op, dtype): the values, or the error.
struct reduction_outcome {
  std::map<std::string, std::vector<double>> values;
  std::map<std::string, std::string> errors;
};

/// Every reduce op on every element type, through all_reduce and reduce_scatter_tensor, on the
/// calling rank. Inputs are small integers (exact in every type, so every float result is
/// exact too); bool inputs hold every pair of values across two ranks, so true + true occurs
/// and must come back true (a byte sum gives 2, and wraps to false at 256 ranks).
reduction_outcome reduction_suite(cg::rank_context& ctx) {
  const int r = ctx.rank(), n = ctx.world_size();
  const auto w = ctx.world();
  reduction_outcome out;
  const std::int64_t rows = 4 * n;
  std::vector<double> base(static_cast<std::size_t>(rows * 4));
  for (std::size_t i = 0; i < base.size(); ++i) base[i] = static_cast<double>(static_cast<int>(i % 7) - 3 + r);
  std::vector<double> bits(base.size()), small(base.size());
  for (std::size_t i = 0; i < base.size(); ++i) {
    bits[i] = static_cast<double>((i >> static_cast<unsigned>(r)) & 1u);
    small[i] = static_cast<double>(i % 4 + static_cast<std::size_t>(r));
  }
  for (cg::dtype dt : {cg::dtype::f32, cg::dtype::f64, cg::dtype::i32, cg::dtype::i64, cg::dtype::u8,
                       cg::dtype::boolean, cg::dtype::bf16, cg::dtype::f16}) {
    cg::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      const auto& src = std::is_same_v<T, bool> ? bits : std::is_same_v<T, std::uint8_t> ? small : base;
      const auto x = cg::tensor<double>::from(src, {rows, 4}).template to<T>();
      for (cg::reduce_op op : {cg::reduce_op::sum, cg::reduce_op::avg, cg::reduce_op::product, cg::reduce_op::min,
                               cg::reduce_op::max, cg::reduce_op::band, cg::reduce_op::bor, cg::reduce_op::bxor}) {
        const std::string key = cg::detail::concat(dt, ".", op);
        try {
          out.values["all_reduce." + key] = values(cg::all_reduce(x, op, w));
        } catch (const cg::error& e) {
          out.errors["all_reduce." + key] = e.what();
        }
        try {
          out.values["reduce_scatter." + key] = values(cg::reduce_scatter_tensor(x, op, 0, w));
        } catch (const cg::error& e) {
          out.errors["reduce_scatter." + key] = e.what();
        }
      }
    });
  }
  return out;
}

/// reduction_suite on n ranks of both backends: NCCL must give the threads backend's values bit
/// for bit, or, for a reduction NCCL does not have (band, bor, bxor on numbers; bxor on bool),
/// an error saying so; never another result.
void reduction_matrix_case(int n) {
  std::vector<reduction_outcome> cpu(static_cast<std::size_t>(n)), gpu(static_cast<std::size_t>(n));
  cg::run_threads(n, [&](cg::rank_context& ctx) { cpu[static_cast<std::size_t>(ctx.rank())] = reduction_suite(ctx); });
  cg::cuda::run_gpus(n, [&](cg::rank_context& ctx) { gpu[static_cast<std::size_t>(ctx.rank())] = reduction_suite(ctx); });
  for (int r = 0; r < n; ++r) {
    const auto& c = cpu[static_cast<std::size_t>(r)];
    const auto& g = gpu[static_cast<std::size_t>(r)];
    CHECK(c.values.size() + c.errors.size() == 2 * 8 * 8);
    for (auto& [key, want] : c.values) {
      CAPTURE(key);
      if (g.errors.count(key)) {
        const std::string& e = g.errors.at(key);
        CAPTURE(e);
        CHECK(e.find("not supported by NCCL") != std::string::npos);
        const bool bitwise = key.find(".band") != std::string::npos || key.find(".bor") != std::string::npos ||
                             key.find(".bxor") != std::string::npos;
        CHECK(bitwise);  // nothing else may be refused
        CHECK((key.find(".bool.") == std::string::npos || key.find(".bxor") != std::string::npos));
        continue;
      }
      REQUIRE(g.values.count(key) == 1);
      check_close(g.values.at(key), want, 0, "rank " + std::to_string(r) + " of " + std::to_string(n) + ": " + key);
    }
    for (auto& [key, e] : c.errors) {  // rejected by the op itself: the same error on both
      CAPTURE(key);
      REQUIRE(g.errors.count(key) == 1);
      CHECK(g.errors.at(key) == e);
    }
  }
}

/// GEMMs leave nccl_options::gemm_sm_carveout SMs free while a collective is out, on n ranks.
void gemm_carveout_case(int n) {
  cg::cuda::nccl_options opt;
  opt.gemm_sm_carveout = 16;
  cg::cuda::run_gpus(
      n,
      [](cg::rank_context& ctx) {
        auto& carveout = cg::cuda::detail::gemm_sm_carveout();
        CHECK(carveout == 0);
        const auto a = cg::uniform<float>({64, 64}, -1, 1, 7);
        const auto plain = cg::matmul(a, a).to_vector();
        auto y1 = cg::all_reduce(a, "sum", ctx.world());
        auto y2 = cg::all_reduce(a, "max", ctx.world());
        CHECK(carveout == 16);  // two collectives may be running
        const auto beside = cg::matmul(a, a).to_vector();
        REQUIRE(beside.size() == plain.size());
        for (std::size_t i = 0; i < plain.size(); ++i)  // fewer SMs (maybe another algorithm): same result
          CHECK(std::fabs(beside[i] - plain[i]) <= 1e-4f * (1.f + std::fabs(plain[i])));
        y1.wait();
        CHECK(carveout == 16);  // y2 is still out
        y2.wait();
        CHECK(carveout == 0);
        {
          auto y3 = cg::all_reduce(a, "sum", ctx.world());
          CHECK(carveout == 16);
        }  // dropped unwaited: its destructor joins it
        CHECK(carveout == 0);
      },
      opt);
}

/// The program whose all_reduce a schedule (sink_waits, raise_comms) overlaps with a matmul,
/// compiled for the graph runner and as a CUDA Graph, three calls each, against its eager
/// result on this rank. `after_eager` runs after the eager run, `after_mode(replay)` after each
/// mode's calls.
void overlapped_program_matches_eager(cg::rank_context& ctx, const std::function<void()>& after_eager = {},
                                      const std::function<void(bool)>& after_mode = {}) {
  const cg::group world = ctx.world();
  auto program = [&](auto a) {
    auto ar = cg::all_reduce(a, "sum", world);
    auto m = cg::matmul(a, a);
    return cg::eval(cg::wait_tensor(ar) + m);
  };
  const auto a = cg::uniform<float>({64, 64}, -1, 1, 3 + static_cast<std::uint64_t>(ctx.rank()));
  const auto eager = program(a).to_vector();
  if (after_eager) after_eager();
  auto s = cg::schedule(cg::trace(program, cg::input<float>({64, 64})), {"sink_waits", "raise_comms"});
  for (bool replay : {false, true}) {
    auto run = cg::compile(s, ctx, {.cuda_graph = replay});
    for (int call = 0; call < 3; ++call) {
      const auto got = run(a).to_vector();
      REQUIRE(got.size() == eager.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        CHECK(std::fabs(got[i] - eager[i]) <= 1e-4f * (1.f + std::fabs(eager[i])));
    }
    if (after_mode) after_mode(replay);
  }
}

/// A schedule that runs a matmul before an all_reduce's wait marks it overlapped: with
/// overlap_sms it runs on the group's capped communicator (split on first use) while GEMMs
/// leave SMs to it, with the eager results, on n ranks.
void overlapped_case(int n) {
  cg::cuda::nccl_options opt;
  opt.overlap_sms = 8;
  cg::cuda::run_gpus(
      n,
      [](cg::rank_context& ctx) {
        overlapped_program_matches_eager(ctx);
        CHECK(cg::cuda::detail::gemm_sm_carveout() == 0);  // every collective was waited
      },
      opt);
}

/// Collectives this rank launched on its communication stream ([0]) and the caller's ([1]).
std::array<std::uint64_t, 2> launched(cg::rank_context& ctx) {
  auto* r = dynamic_cast<cg::cuda::detail::nccl_rank*>(&ctx.comm());
  REQUIRE(r != nullptr);
  return r->launched();
}

/// Where collectives run (nccl_options::placement), on n ranks. `automatic` runs a compiled
/// graph's collectives that overlap nothing on the caller's stream and the others (and eager
/// ones) on the communication stream; `caller` runs all on the caller's stream, `separate` none.
/// Every placement gives the exact results in eager, graph runner and CUDA Graph modes.
void placement_case(int n, cg::cuda::collective_stream placement) {
  using cs = cg::cuda::collective_stream;
  cg::cuda::nccl_options opt;
  opt.placement = placement;
  cg::cuda::run_gpus(
      n,
      [&](cg::rank_context& ctx) {
        const cg::group world = ctx.world();
        const int k = 4;
        const auto x = cg::full<float>({1000}, static_cast<float>(ctx.rank() + 1));
        const float sum = static_cast<float>(n * (n + 1) / 2);
        auto before = launched(ctx);
        auto moved = [&](std::uint64_t comm, std::uint64_t caller) {
          const auto now = launched(ctx);
          CHECK(now[0] - before[0] == comm);
          CHECK(now[1] - before[1] == caller);
          before = now;
        };
        // Eager: the caller may overlap anything with it.
        auto y = cg::all_reduce(x, "sum", world);
        CHECK(y.to_vector() == std::vector<float>(1000, sum));
        moved(placement == cs::caller ? 0 : 1, placement == cs::caller ? 1 : 0);
        // An eager one on the caller's stream, waited on another stream.
        {
          auto z = cg::all_reduce(cg::full<float>({1 << 20}, 1.f), "sum", world);
          cg::cuda::stream other(cudaStreamNonBlocking);
          cg::cuda::stream_guard on(other.get());
          z.wait();
          CHECK(z.to_vector() == std::vector<float>(std::size_t{1} << 20, static_cast<float>(n)));
          moved(placement == cs::caller ? 0 : 1, placement == cs::caller ? 1 : 0);
        }
        // A chain of collectives, each waited at once: nothing overlaps them.
        const auto chain = cg::trace(cg::examples::all_reduce_chain(world, k), cg::input<float>({1000}));
        float want = sum;
        for (int i = 1; i < k; ++i) want *= static_cast<float>(n);
        const bool inline_chain = placement != cs::separate;
        for (bool replay : {false, true}) {
          auto run = cg::compile(chain, ctx, {.cuda_graph = replay});
          for (int call = 0; call < 3; ++call) CHECK(run(x).to_vector() == std::vector<float>(1000, want));
          // The graph runner launches per call; in CUDA Graph mode the first call runs once
          // and records, and the others replay.
          const std::uint64_t per = replay ? 2 : 3;
          moved(inline_chain ? 0 : per * k, inline_chain ? per * k : 0);
        }
        // A recording replayed while an eager collective of the same communicator is still out:
        // the replay waits for it first (NCCL orders its own launches, not a replay's kernels).
        {
          auto rec = cg::compile(chain, ctx, {.cuda_graph = true});
          CHECK(rec(x).to_vector() == std::vector<float>(1000, want));  // runs once and records
          before = launched(ctx);
          auto out = cg::all_reduce(cg::full<float>({1 << 20}, 2.f), "sum", world);  // not waited
          for (int call = 0; call < 2; ++call) CHECK(rec(x).to_vector() == std::vector<float>(1000, want));
          CHECK(out.to_vector() == std::vector<float>(std::size_t{1} << 20, 2.f * static_cast<float>(n)));
          moved(placement == cs::caller ? 0 : 1, placement == cs::caller ? 1 : 0);
        }
        // Many of both kinds in turns, results kept: the backend drops finished collectives of
        // two streams in batches (nccl_rank::reap), and an input dropped right after its launch
        // is not reused before the collective ran.
        {
          auto run = cg::compile(chain, ctx);
          std::vector<cg::tensor<float>> kept;
          for (int i = 0; i < 40; ++i) {
            kept.push_back(cg::all_reduce(cg::full<float>({1000}, static_cast<float>(i)), "sum", world));
            kept.push_back(run(cg::full<float>({1000}, static_cast<float>(ctx.rank() + 1))));
          }
          for (int i = 0; i < 40; ++i) {
            CHECK(kept[2 * static_cast<std::size_t>(i)].to_vector() ==
                  std::vector<float>(1000, static_cast<float>(i * n)));
            CHECK(kept[2 * static_cast<std::size_t>(i) + 1].to_vector() == std::vector<float>(1000, want));
          }
          moved(placement == cs::caller ? (inline_chain ? 0 : 40 * k) : 40 + (inline_chain ? 0 : 40 * k),
                (placement == cs::caller ? 40 : 0) + (inline_chain ? 40 * k : 0));
        }
        // A collective the schedule overlaps with a matmul.
        overlapped_program_matches_eager(
            ctx, [&] { before = launched(ctx); },
            [&](bool replay) {
              const std::uint64_t per = replay ? 2 : 3;
              moved(placement == cs::caller ? 0 : per, placement == cs::caller ? per : 0);
            });
        CHECK(cg::cuda::detail::gemm_sm_carveout() == 0);
      },
      opt);
}

/// All_reduces the rank ran on its copy-engine channel.
std::uint64_t copy_engine_launched(cg::rank_context& ctx) {
  auto* r = dynamic_cast<cg::cuda::detail::nccl_rank*>(&ctx.comm());
  REQUIRE(r != nullptr);
  return r->copy_engine_launched();
}

/// Every all_reduce of the copy-engine suite, per rank: each reduction of f32, bf16 and f16
/// (an odd count, so the kernel's tail runs), one misaligned by an element (the kernel's
/// element-wise path), eight launched before any is waited, growing sizes (the channel grows),
/// small ones between (NCCL runs those), and a CUDA Graph of an all_reduce overlapped with a
/// matmul replayed on new inputs. Returns the results and counts the copy-engine launches.
results copy_engine_suite(cg::rank_context& ctx, std::uint64_t& on_copy_engine) {
  const cg::group world = ctx.world();
  const auto seed = [&](std::uint64_t k) { return 100 * k + static_cast<std::uint64_t>(ctx.rank()); };
  const std::int64_t n = (1 << 19) + 3;  // > 1 MiB in 16-bit types
  results out;
  const std::uint64_t before = copy_engine_launched(ctx);
  std::uint64_t k = 0;
  for (const char* op : {"sum", "avg", "product", "min", "max"}) {
    out[std::string("f32 ") + op] = values(cg::all_reduce(cg::uniform<float>({n}, -2, 2, seed(++k)), op, world));
    out[std::string("bf16 ") + op] = values(cg::all_reduce(cg::uniform<cg::bf16>({n}, -2, 2, seed(++k)), op, world));
    out[std::string("f16 ") + op] = values(cg::all_reduce(cg::uniform<cg::f16>({n}, -2, 2, seed(++k)), op, world));
  }
  {
    const auto x = cg::uniform<cg::bf16>({n + 1}, -2, 2, seed(++k)).narrow(0, 1, n);
    out["bf16 misaligned"] = values(cg::all_reduce(x, "sum", world));
  }
  {
    std::vector<cg::tensor<float>> pending;
    for (int i = 0; i < 8; ++i) {
      pending.push_back(cg::all_reduce(cg::uniform<float>({n}, -1, 1, seed(++k)), "sum", world));
      pending.push_back(cg::all_reduce(cg::full<float>({100}, static_cast<float>(i)), "sum", world));
    }
    for (std::size_t i = 0; i < pending.size(); ++i) out["pending " + std::to_string(i)] = values(pending[i]);
  }
  for (std::int64_t m : {n, 4 * n, 16 * n})
    out["grown " + std::to_string(m)] = values(cg::all_reduce(cg::uniform<cg::bf16>({m}, -1, 1, seed(++k)), "sum", world));
  // A chain of all_reduces, each waited at once: the schedule overlaps nothing with them, so
  // `overlapped` leaves them to NCCL (on the caller's stream) and `always` runs them on the
  // copy engines, on the communication stream like every other.
  {
    const auto chain = cg::trace(cg::examples::all_reduce_chain(world, 2), cg::input<float>({1 << 18}));
    const auto x = cg::uniform<float>({1 << 18}, -1, 1, seed(++k));
    for (bool replay : {false, true}) {
      auto run = cg::compile(chain, ctx, {.cuda_graph = replay});
      for (int call = 0; call < 2; ++call)
        out["chain " + std::to_string(replay) + " " + std::to_string(call)] = values(run(x));
    }
  }
  // A schedule that overlaps the all_reduce with a matmul, recorded and replayed.
  auto program = [&](auto a) {
    auto ar = cg::all_reduce(a, "sum", world);
    auto m = cg::matmul(a, a);
    return cg::eval(cg::wait_tensor(ar) * 0.5f + m);
  };
  auto s = cg::schedule(cg::trace(program, cg::input<float>({512, 512})), {"sink_waits", "raise_comms"});
  for (bool replay : {false, true}) {
    auto run = cg::compile(s, ctx, {.cuda_graph = replay});
    for (int call = 0; call < 3; ++call)
      out["program " + std::to_string(replay) + " " + std::to_string(call)] =
          values(run(cg::uniform<float>({512, 512}, -1, 1, seed(++k))));
  }
  on_copy_engine = copy_engine_launched(ctx) - before;
  return out;
}

/// The copy-engine suite under `policy` on two GPUs: per rank, its results and launches.
std::pair<std::vector<results>, std::vector<std::uint64_t>> copy_engine_run(cg::cuda::copy_engine_all_reduce policy) {
  cg::cuda::nccl_options opt;
  opt.copy_engine = policy;
  std::vector<results> res(2);
  std::vector<std::uint64_t> launches(2);
  cg::cuda::run_gpus(
      2,
      [&](cg::rank_context& ctx) {
        const auto r = static_cast<std::size_t>(ctx.rank());
        res[r] = copy_engine_suite(ctx, launches[r]);
      },
      opt);
  return {res, launches};
}

/// Every all_gather and reduce_scatter of the copy-engine gather/scatter suite on group `g`
/// (this rank at index `me` of `n`), per rank: all_gathers of f32, bf16, f16, f64 and i32 (an
/// odd count per rank), one misaligned by an element, one along dim 1 (re-laid out after the
/// gather); reduce_scatters by each reduction of f32, bf16 and f16, one misaligned, one along
/// dim 1; four of each launched before any is waited, with small ones between (NCCL runs
/// those); growing sizes (the channel grows); and a schedule that overlaps an all_gather and a
/// reduce_scatter with a matmul, run in the graph runner and replayed as a CUDA Graph. `sums`
/// false leaves out the reductions that are NCCL's bits only with two ranks. Counts the
/// copy-engine launches of its eager part in `eager_on_copy_engine`, of the whole in
/// `on_copy_engine`.
results gather_scatter_suite(cg::rank_context& ctx, const cg::group& g, int me, int n, bool sums,
                             std::uint64_t& eager_on_copy_engine, std::uint64_t& on_copy_engine) {
  const auto seed = [&](std::uint64_t k) { return 1000 * k + static_cast<std::uint64_t>(ctx.rank()); };
  const std::int64_t m = (1 << 18) + 3;  // per rank: > 1 MiB gathered, scattered from, in 16-bit types
  results out;
  const std::uint64_t before = copy_engine_launched(ctx);
  std::uint64_t k = 0;
  out["ag f32"] = values(cg::all_gather_tensor(cg::uniform<float>({m}, -2, 2, seed(++k)), 0, g));
  out["ag bf16"] = values(cg::all_gather_tensor(cg::uniform<cg::bf16>({m}, -2, 2, seed(++k)), 0, g));
  out["ag f16"] = values(cg::all_gather_tensor(cg::uniform<cg::f16>({m}, -2, 2, seed(++k)), 0, g));
  out["ag f64"] = values(cg::all_gather_tensor(cg::uniform<double>({m}, -2, 2, seed(++k)), 0, g));
  {
    std::vector<std::int32_t> v(static_cast<std::size_t>(m));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>((i * 7 + 1000 * static_cast<std::size_t>(me)) % 100003);
    out["ag i32"] = values(cg::all_gather_tensor(cg::tensor<std::int32_t>::from(v), 0, g));
  }
  out["ag misaligned"] =
      values(cg::all_gather_tensor(cg::uniform<cg::bf16>({2 * m + 1}, -2, 2, seed(++k)).narrow(0, 1, 2 * m), 0, g));
  out["ag dim 1"] = values(cg::all_gather_tensor(cg::uniform<cg::bf16>({512, 1031}, -2, 2, seed(++k)), 1, g));
  std::vector<const char*> reductions{"min", "max"};
  if (sums) reductions.insert(reductions.begin(), {"sum", "avg", "product"});
  for (const char* op : reductions) {
    out[std::string("rs f32 ") + op] = values(cg::reduce_scatter_tensor(cg::uniform<float>({n * m}, -2, 2, seed(++k)), op, 0, g));
    out[std::string("rs bf16 ") + op] =
        values(cg::reduce_scatter_tensor(cg::uniform<cg::bf16>({2 * n * m}, -2, 2, seed(++k)), op, 0, g));
    out[std::string("rs f16 ") + op] =
        values(cg::reduce_scatter_tensor(cg::uniform<cg::f16>({2 * n * m}, -2, 2, seed(++k)), op, 0, g));
  }
  const char* red = sums ? "sum" : "max";
  {
    const auto x = cg::uniform<cg::bf16>({2 * n * m + 1}, -2, 2, seed(++k)).narrow(0, 1, 2 * n * m);
    out["rs misaligned"] = values(cg::reduce_scatter_tensor(x, red, 0, g));
    out["rs dim 1"] = values(cg::reduce_scatter_tensor(cg::uniform<cg::bf16>({1031, 512 * n}, -2, 2, seed(++k)), red, 1, g));
  }
  {
    std::vector<cg::tensor<cg::bf16>> pending;
    for (int i = 0; i < 4; ++i) {
      pending.push_back(cg::all_gather_tensor(cg::uniform<cg::bf16>({2 * m}, -1, 1, seed(++k)), 0, g));
      pending.push_back(cg::all_gather_tensor(cg::full<cg::bf16>({100}, cg::bf16(static_cast<float>(i))), 0, g));
      pending.push_back(cg::reduce_scatter_tensor(cg::uniform<cg::bf16>({2 * n * m}, -1, 1, seed(++k)), red, 0, g));
      pending.push_back(cg::reduce_scatter_tensor(cg::full<cg::bf16>({100 * n}, cg::bf16(1.f)), red, 0, g));
    }
    for (std::size_t i = 0; i < pending.size(); ++i) out["pending " + std::to_string(i)] = values(pending[i]);
  }
  for (std::int64_t s : {4 * m, 16 * m}) {
    out["ag grown " + std::to_string(s)] = values(cg::all_gather_tensor(cg::uniform<cg::bf16>({s}, -1, 1, seed(++k)), 0, g));
    out["rs grown " + std::to_string(s)] =
        values(cg::reduce_scatter_tensor(cg::uniform<cg::bf16>({n * s}, -1, 1, seed(++k)), red, 0, g));
  }
  eager_on_copy_engine = copy_engine_launched(ctx) - before;
  // A schedule that overlaps both with a matmul, run and recorded.
  auto program = [&](auto a, auto b) {
    auto ag = cg::all_gather_tensor(a, 0, g);
    auto rs = cg::reduce_scatter_tensor(b, red, 0, g);
    auto mm = cg::matmul(a, a);
    return std::make_tuple(cg::eval(cg::wait_tensor(ag) * 0.5f), cg::eval(cg::wait_tensor(rs) + mm));
  };
  auto s = cg::schedule(cg::trace(program, cg::input<float>({512, 512}), cg::input<float>({512 * n, 512})),
                        {"sink_waits", "raise_comms"});
  for (bool replay : {false, true}) {
    auto run = cg::compile(s, ctx, {.cuda_graph = replay});
    for (int call = 0; call < 3; ++call) {
      const std::uint64_t ka = ++k, kb = ++k;  // (two ++k in one call's arguments: unsequenced)
      const auto [a, b] = run(cg::uniform<float>({512, 512}, -1, 1, seed(ka)),
                              cg::uniform<float>({512 * n, 512}, -1, 1, seed(kb)));
      out["program ag " + std::to_string(replay) + " " + std::to_string(call)] = values(a);
      out["program rs " + std::to_string(replay) + " " + std::to_string(call)] = values(b);
    }
  }
  on_copy_engine = copy_engine_launched(ctx) - before;
  return out;
}

/// The gather/scatter suite on `ranks` GPUs' world under `opt`: per rank, results and eager and
/// total copy-engine launches.
struct gather_scatter_run {
  std::vector<results> res;
  std::vector<std::uint64_t> eager, total;
};
gather_scatter_run gather_scatter_on(int ranks, const cg::cuda::nccl_options& opt, bool sums) {
  gather_scatter_run out{std::vector<results>(static_cast<std::size_t>(ranks)),
                         std::vector<std::uint64_t>(static_cast<std::size_t>(ranks)),
                         std::vector<std::uint64_t>(static_cast<std::size_t>(ranks))};
  cg::cuda::run_gpus(
      ranks,
      [&](cg::rank_context& ctx) {
        const auto r = static_cast<std::size_t>(ctx.rank());
        out.res[r] = gather_scatter_suite(ctx, ctx.world(), ctx.rank(), ranks, sums, out.eager[r], out.total[r]);
      },
      opt);
  return out;
}

/// The suite under `off`, `always` and `overlapped` on `ranks` GPUs: bit for bit NCCL's values
/// on every rank; `always` runs every large one of the eager part on the copy engines (7
/// all_gathers, 3 per reduction, 2, 8 pending, 4 grown), `overlapped` none of those, and both
/// run the scheduled program's.
void gather_scatter_equals_nccl(int ranks, bool sums) {
  using ce = cg::cuda::copy_engine_all_reduce;
  cg::cuda::nccl_options opt;
  opt.copy_engine = ce::off;
  const auto nccl = gather_scatter_on(ranks, opt, sums);
  opt.copy_engine = ce::always;
  const auto copy = gather_scatter_on(ranks, opt, sums);
  opt.copy_engine = ce::overlapped;
  const auto sched = gather_scatter_on(ranks, opt, sums);
  const std::uint64_t eager = 7 + 3 * (sums ? 5 : 2) + 2 + 8 + 4;
  for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r) {
    CAPTURE(r);
    CHECK(nccl.total[r] == 0);
    CHECK(copy.eager[r] == eager);
    CHECK(copy.total[r] > copy.eager[r]);
    CHECK(sched.eager[r] == 0);
    CHECK(sched.total[r] > 0);
    REQUIRE(copy.res[r].size() == nccl.res[r].size());
    for (const auto& [name, want] : nccl.res[r]) {
      CAPTURE(name);
      CHECK(copy.res[r].at(name) == want);
      CHECK(sched.res[r].at(name) == want);
    }
  }
}

}  // namespace

GPU_TEST_CASE("nccl.collective_stream_placement.1_gpu") {
  for (auto p : {cg::cuda::collective_stream::automatic, cg::cuda::collective_stream::caller,
                 cg::cuda::collective_stream::separate}) {
    CAPTURE(static_cast<int>(p));
    placement_case(1, p);
  }
}
GPUS_TEST_CASE("nccl.collective_stream_placement.2_gpus", 2) {
  for (auto p : {cg::cuda::collective_stream::automatic, cg::cuda::collective_stream::caller,
                 cg::cuda::collective_stream::separate}) {
    CAPTURE(static_cast<int>(p));
    placement_case(2, p);
  }
}

TEST_CASE("nccl.counts_and_switches_from_the_environment") {
  // No GPU needed: CCGRAPH_OVERLAP_SMS / CCGRAPH_GEMM_SM_CARVEOUT were read with strtol, and
  // anything else ("32k", "-1", "abc") silently became 0.
  for (const char* var : {"CCGRAPH_OVERLAP_SMS", "CCGRAPH_GEMM_SM_CARVEOUT"}) {
    CAPTURE(var);
    ::setenv(var, "32", 1);
    const cg::cuda::nccl_options o;
    CHECK((std::string(var) == "CCGRAPH_OVERLAP_SMS" ? o.overlap_sms : o.gemm_sm_carveout) == 32);
    for (const char* bad : {"32k", "-1", "abc", "2000"}) {
      ::setenv(var, bad, 1);
      CHECK_THROWS_WITH_AS(cg::cuda::nccl_options{}, doctest::Contains((std::string(var) + "='" + bad + "'").c_str()), cg::error);
    }
    ::unsetenv(var);
    CHECK(cg::cuda::nccl_options{}.overlap_sms == 0);
  }
}

TEST_CASE("nccl.collective_stream_from_the_environment") {
  // No GPU needed: the option's default reads $CCGRAPH_COLLECTIVE_STREAM.
  ::setenv("CCGRAPH_COLLECTIVE_STREAM", "caller", 1);
  CHECK(cg::cuda::nccl_options{}.placement == cg::cuda::collective_stream::caller);
  ::setenv("CCGRAPH_COLLECTIVE_STREAM", "sideways", 1);
  CHECK_THROWS_WITH_AS(cg::cuda::nccl_options{}, doctest::Contains("CCGRAPH_COLLECTIVE_STREAM='sideways' is not one of automatic, separate, caller"),
                       cg::error);
  ::unsetenv("CCGRAPH_COLLECTIVE_STREAM");
  CHECK(cg::cuda::nccl_options{}.placement == cg::cuda::collective_stream::automatic);
}

GPU_TEST_CASE("nccl.every_reduce_op_and_dtype_matches_threads_backend.1_gpu") { reduction_matrix_case(1); }
GPUS_TEST_CASE("nccl.every_reduce_op_and_dtype_matches_threads_backend.2_gpus", 2) { reduction_matrix_case(2); }

GPU_TEST_CASE("nccl.gemm_leaves_sms_to_unwaited_collectives.1_gpu") { gemm_carveout_case(1); }
GPUS_TEST_CASE("nccl.gemm_leaves_sms_to_unwaited_collectives.2_gpus", 2) { gemm_carveout_case(2); }
GPU_TEST_CASE("nccl.overlapped_collectives_run_capped_with_same_results.1_gpu") { overlapped_case(1); }
GPUS_TEST_CASE("nccl.overlapped_collectives_run_capped_with_same_results.2_gpus", 2) { overlapped_case(2); }

TEST_CASE("nccl.missing_rank_times_out.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  cg::cuda::nccl_options opt;
  opt.timeout = std::chrono::milliseconds(3000);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(cg::cuda::run_gpus(
                           2,
                           [](cg::rank_context& ctx) {
                             if (ctx.rank() == 1) return;  // never issues the all_reduce
                             auto y = cg::all_reduce(cg::ones<float>({1024}), "sum", ctx.world());
                             (void)y.to_vector();
                           },
                           opt),
                       doctest::Contains("all_reduce"), cg::timeout_error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
}

TEST_CASE("nccl.rank_missing_at_setup_times_out.1_gpu" * doctest::skip(ccgraph_test::gpu_count() < 1)) {
  // Rank 0 of a job of 2 whose rank 1 never starts: setting up the world communicator (NCCL's
  // non-blocking init, polled under the timeout) ends in a timeout_error that says so, and the
  // rank's communicator, store and streams are torn down without hanging.
  cg::env_config cfg;
  cfg.rank = 0;
  cfg.world_size = 2;
  cfg.local_world_size = 2;
  cfg.master_port = 0;  // the store's server picks a free port
  cg::cuda::nccl_options opt;
  opt.timeout = std::chrono::milliseconds(2000);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS((void)std::make_unique<cg::cuda::process_rank>(cfg, opt),
                       doctest::Contains("a peer never arrived"), cg::timeout_error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  // The GPU is still usable afterwards.
  CHECK(cg::full<float>({4}, 2.f).cuda(0).to_vector() == std::vector<float>(4, 2.f));
}

TEST_CASE("nccl.failing_rank_aborts_its_peers.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  std::string peer;
  std::mutex mu;
  CHECK_THROWS_WITH_AS(cg::cuda::run_gpus(2,
                                          [&](cg::rank_context& ctx) {
                                            if (ctx.rank() == 1) throw std::runtime_error("rank one broke");
                                            try {
                                              auto y = cg::all_reduce(cg::ones<float>({8}), "sum", ctx.world());
                                              (void)y.to_vector();
                                            } catch (const cg::error& e) {
                                              std::lock_guard lk(mu);
                                              peer = e.what();
                                              throw;
                                            }
                                          }),
                       "rank one broke", std::runtime_error);
  CHECK(peer.find("rank 1") != std::string::npos);
}

TEST_CASE("nccl.copy_engine_all_reduce_policy") {
  // No GPU needed: the option's default reads $CCGRAPH_COPY_ENGINE_ALL_REDUCE, and which
  // requests may take the copy engines follows from the request alone.
  using ce = cg::cuda::copy_engine_all_reduce;
  ::setenv("CCGRAPH_COPY_ENGINE_ALL_REDUCE", "always", 1);
  CHECK(cg::cuda::nccl_options{}.copy_engine == ce::always);
  ::setenv("CCGRAPH_COPY_ENGINE_ALL_REDUCE", "off", 1);
  CHECK(cg::cuda::nccl_options{}.copy_engine == ce::off);
  ::setenv("CCGRAPH_COPY_ENGINE_ALL_REDUCE", "sometimes", 1);
  CHECK_THROWS_WITH_AS(cg::cuda::nccl_options{},
                       doctest::Contains("CCGRAPH_COPY_ENGINE_ALL_REDUCE='sometimes' is not one of overlapped, off, always"), cg::error);
  ::unsetenv("CCGRAPH_COPY_ENGINE_ALL_REDUCE");
  cg::cuda::nccl_options opt;
  CHECK(opt.copy_engine == ce::overlapped);

  using hint = cg::detail::overlap_hint;
  auto request = [](cg::ops::collective_op op, cg::dtype dt, std::int64_t numel, int ranks, hint h) {
    cg::detail::collective_request req;
    req.op = op;
    for (int r = 0; r < ranks; ++r) req.group.ranks.push_back(r);
    cg::detail::buffer b;
    b.meta = {dt, {numel}};
    req.inputs.push_back(b);
    req.outputs.push_back(b);
    req.overlap = h;
    return req;
  };
  const cg::ops::collective_op sum = cg::ops::all_reduce{cg::reduce_op::sum};
  const std::int64_t mib_f32 = 1 << 18;
  using cg::cuda::detail::copy_engine_eligible;
  CHECK(copy_engine_eligible(opt, request(sum, cg::dtype::f32, mib_f32, 2, hint::matmul)));
  CHECK(copy_engine_eligible(opt, request(sum, cg::dtype::bf16, 2 * mib_f32, 2, hint::compute)));
  CHECK_FALSE(copy_engine_eligible(opt, request(sum, cg::dtype::f32, mib_f32, 2, hint::none)));     // overlaps nothing
  CHECK_FALSE(copy_engine_eligible(opt, request(sum, cg::dtype::f32, mib_f32, 2, hint::unknown)));  // eager
  CHECK_FALSE(copy_engine_eligible(opt, request(sum, cg::dtype::f32, mib_f32 - 1, 2, hint::matmul)));  // small
  CHECK_FALSE(copy_engine_eligible(opt, request(sum, cg::dtype::f32, mib_f32, 4, hint::matmul)));  // four ranks
  CHECK_FALSE(copy_engine_eligible(opt, request(sum, cg::dtype::i32, mib_f32, 2, hint::matmul)));  // no kernel
  CHECK_FALSE(copy_engine_eligible(opt, request(cg::ops::all_reduce{cg::reduce_op::bxor}, cg::dtype::f32, mib_f32, 2,
                                                hint::matmul)));
  opt.copy_engine = ce::always;
  CHECK(copy_engine_eligible(opt, request(sum, cg::dtype::f32, mib_f32, 2, hint::unknown)));
  opt.copy_engine = ce::off;
  CHECK_FALSE(copy_engine_eligible(opt, request(sum, cg::dtype::f32, mib_f32, 2, hint::matmul)));

  // All_gathers and reduce_scatters: any group of 2 to 8 ranks; the size is nccl-tests' (the
  // gathered output, the scattered input); a reduction only where its bits are NCCL's.
  opt.copy_engine = ce::overlapped;
  auto shaped = [](cg::ops::collective_op op, cg::dtype dt, std::int64_t in, std::int64_t out, int ranks, hint h) {
    cg::detail::collective_request req;
    req.op = op;
    for (int r = 0; r < ranks; ++r) req.group.ranks.push_back(r);
    cg::detail::buffer i, o;
    i.meta = {dt, {in}};
    o.meta = {dt, {out}};
    req.inputs.push_back(i);
    req.outputs.push_back(o);
    req.overlap = h;
    return req;
  };
  auto gather = [&](cg::dtype dt, std::int64_t per_rank, int ranks, hint h = hint::matmul) {
    return copy_engine_eligible(opt, shaped(cg::ops::all_gather_into_tensor{ranks}, dt, per_rank, per_rank * ranks, ranks, h));
  };
  auto scatter = [&](const char* op, cg::dtype dt, std::int64_t in, int ranks, hint h = hint::matmul) {
    return copy_engine_eligible(opt, shaped(cg::ops::reduce_scatter_tensor{cg::parse_reduce_op(op), ranks}, dt, in, in / ranks, ranks, h));
  };
  CHECK(gather(cg::dtype::f32, mib_f32 / 2, 2));                 // 1 MiB gathered
  CHECK_FALSE(gather(cg::dtype::f32, mib_f32 / 2 - 1, 2));       // just under
  CHECK(gather(cg::dtype::f32, mib_f32 / 4, 4));
  CHECK(gather(cg::dtype::i32, mib_f32, 8));                     // a copy: any type
  CHECK(gather(cg::dtype::f64, mib_f32, 3));
  CHECK_FALSE(gather(cg::dtype::f32, mib_f32, 9));               // more ranks than the kernel takes
  CHECK_FALSE(gather(cg::dtype::f32, mib_f32, 2, hint::none));
  CHECK(scatter("sum", cg::dtype::bf16, 2 * mib_f32, 2));
  CHECK(scatter("avg", cg::dtype::f16, 2 * mib_f32, 2));
  CHECK_FALSE(scatter("sum", cg::dtype::bf16, 2 * mib_f32 - 2, 2));  // under 1 MiB scattered
  CHECK_FALSE(scatter("sum", cg::dtype::f32, mib_f32, 4));         // not NCCL's bits with 4
  CHECK(scatter("max", cg::dtype::f32, mib_f32, 4));                // exact in any order
  CHECK(scatter("min", cg::dtype::bf16, 2 * mib_f32, 8));
  CHECK_FALSE(scatter("sum", cg::dtype::i32, mib_f32, 2));          // no kernel
  CHECK_FALSE(scatter("max", cg::dtype::f32, mib_f32, 4, hint::unknown));  // eager
  opt.copy_engine_reassociates = true;
  CHECK(scatter("sum", cg::dtype::f32, mib_f32, 4));
  CHECK(scatter("product", cg::dtype::bf16, 2 * mib_f32, 3));
  CHECK_FALSE(copy_engine_eligible(opt, request(sum, cg::dtype::f32, mib_f32, 4, hint::matmul)));  // all_reduce: pairs
  CHECK_FALSE(copy_engine_eligible(opt, request(cg::ops::all_to_all_single{}, cg::dtype::f32, mib_f32, 2, hint::matmul)));
  CHECK(cg::cuda::detail::copy_engine_slot_bytes(shaped(cg::ops::reduce_scatter_tensor{cg::reduce_op::sum, 4},
                                                        cg::dtype::bf16, 400, 100, 4, hint::matmul)) == 200);
  CHECK(cg::cuda::detail::copy_engine_slot_bytes(shaped(cg::ops::all_gather_into_tensor{4}, cg::dtype::bf16, 100,
                                                        400, 4, hint::matmul)) == 200);
}

TEST_CASE("nccl.copy_engine_all_reduce_equals_nccl.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  using ce = cg::cuda::copy_engine_all_reduce;
  const auto [nccl, nccl_launches] = copy_engine_run(ce::off);
  const auto [copy, copy_launches] = copy_engine_run(ce::always);
  const auto [sched, sched_launches] = copy_engine_run(ce::overlapped);
  for (int r = 0; r < 2; ++r) {
    const auto i = static_cast<std::size_t>(r);
    CAPTURE(r);
    CHECK(nccl_launches[i] == 0);
    // always: 15 reductions, the misaligned one, 8 pending, 3 grown, the chain's (2 calls of 2
    // in the graph runner; in CUDA Graph mode 2 run eagerly and 2 recorded, then a replay), and
    // the program's: 3 in the graph runner, 4 in CUDA Graph mode (a call runs eagerly and
    // records, twice: the second call's new input tensor is copied into a static buffer).
    CHECK(copy_launches[i] == 15 + 1 + 8 + 3 + (4 + 4) + (3 + 4));
    CHECK(sched_launches[i] == 3 + 4);  // only the scheduled program's
    REQUIRE(copy[i].size() == nccl[i].size());
    for (const auto& [name, want] : nccl[i]) {
      CAPTURE(name);
      // Bitwise: the same values NCCL's all_reduce gives, on both ranks.
      CHECK(copy[i].at(name) == want);
      CHECK(sched[i].at(name) == want);
      if (name.rfind("program", 0) != 0) CHECK(copy[i].at(name) == copy[0].at(name));  // (its matmul is the rank's)
    }
  }
}

/// Rank 1 fails after the copy-engine channel is set up by `first` (one collective on the copy
/// engines, checked); rank 0's `again` then waits on the copy engines for data that never comes,
/// until the abort lets its stream drain: it ends with an error naming rank 1, never a hang.
void copy_engine_failed_peer_case(const std::function<void(cg::rank_context&)>& first,
                                  const std::function<void(cg::rank_context&)>& again) {
  cg::cuda::nccl_options opt;
  opt.copy_engine = cg::cuda::copy_engine_all_reduce::always;
  std::string peer;
  std::mutex mu;
  CHECK_THROWS_WITH_AS(cg::cuda::run_gpus(
                           2,
                           [&](cg::rank_context& ctx) {
                             first(ctx);
                             CHECK(copy_engine_launched(ctx) == 1);
                             if (ctx.rank() == 1) throw std::runtime_error("rank one broke");
                             try {
                               again(ctx);
                             } catch (const cg::error& e) {
                               std::lock_guard lk(mu);
                               peer = e.what();
                               throw;
                             }
                           },
                           opt),
                       "rank one broke", std::runtime_error);
  CHECK(peer.find("rank 1") != std::string::npos);
}

TEST_CASE("nccl.copy_engine_all_reduce_of_a_failed_peer_ends.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  const auto x = [] { return cg::ones<float>({1 << 20}); };
  copy_engine_failed_peer_case(
      [&](cg::rank_context& ctx) {
        CHECK(cg::all_reduce(x(), "sum", ctx.world()).to_vector() == std::vector<float>(std::size_t{1} << 20, 2.f));
      },
      [&](cg::rank_context& ctx) { (void)cg::all_reduce(x(), "sum", ctx.world()).to_vector(); });
}

GPUS_TEST_CASE("nccl.copy_engine_gather_scatter_equals_nccl.2_gpus", 2) { gather_scatter_equals_nccl(2, true); }

TEST_CASE("nccl.copy_engine_gather_of_a_failed_peer_ends.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  const auto x = [](cg::rank_context& ctx) { return cg::full<float>({1 << 20}, static_cast<float>(ctx.rank())); };
  copy_engine_failed_peer_case(
      [&](cg::rank_context& ctx) {
        const auto g = cg::all_gather_tensor(x(ctx), 0, ctx.world()).to_vector();
        CHECK(g[0] == 0.f);
        CHECK(g[std::size_t{1} << 20] == 1.f);
      },
      [&](cg::rank_context& ctx) { (void)cg::all_gather_tensor(x(ctx), 0, ctx.world()).to_vector(); });
}

TEST_CASE("nccl.run_gpus_rejects_more_ranks_than_gpus") {
  CHECK_THROWS_WITH_AS(cg::cuda::run_gpus(ccgraph_test::gpu_count() + 1, [](cg::rank_context&) {}),
                       doctest::Contains("CUDA device"), cg::error);
}

TEST_CASE("nccl.timeout.zero_is_an_error.1_gpu" * doctest::skip(ccgraph_test::gpu_count() < 1)) {
  for (const auto t : {std::chrono::milliseconds(0), std::chrono::milliseconds(-5)}) {
    cg::cuda::nccl_options opt;
    opt.timeout = t;
    const std::string expect =
        "nccl_options::timeout: the timeout must be positive, got " + std::to_string(t.count()) + " ms";
    CHECK_THROWS_WITH_AS(cg::cuda::run_gpus(1, [](cg::rank_context&) {}, opt),
                         doctest::Contains(expect.c_str()), cg::error);
  }
}

TEST_CASE("nccl.timeout.max_waits_forever.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) {
  // milliseconds::max() used to overflow in the watchdog's `waited <= timeout` (nanoseconds)
  // and in the finish barrier's wait_for: a late rank failed its peer at once.
  cg::cuda::nccl_options opt;
  opt.timeout = std::chrono::milliseconds::max();
  cg::cuda::run_gpus(
      2,
      [](cg::rank_context& ctx) {
        if (ctx.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        CHECK(cg::all_reduce(cg::ones<float>({1024}), "sum", ctx.world()).to_vector() ==
              std::vector<float>(1024, 2.f));
      },
      opt);
}

GPU_TEST_CASE("nccl.group_of_another_world_is_refused.1_gpu") {
  // issue 21 item 1 on the nccl backend: the same check as the threads backend's, before NCCL
  // sees the group (a graph traced for 8 ranks, a hand-made group, a partition of 8 ranks).
  const std::vector<int> eight{0, 1, 2, 3, 4, 5, 6, 7};
  auto g8 = cg::trace(cg::trace_options{.world_size = 8},
                      [&](auto a) { return cg::wait_tensor(cg::all_reduce(a, "sum", cg::group{eight})); },
                      cg::input<float>({4}));
  std::string compiled, launched, split;
  cg::cuda::run_gpus(1, [&](cg::rank_context& ctx) {
    try {
      (void)cg::compile(g8, ctx);
    } catch (const cg::error& e) {
      compiled = e.what();
    }
    auto launch = [&](cg::group_info gi) {
      return cg::detail::launch_collective<float>(ctx, "all_reduce", cg::ops::all_reduce{cg::reduce_op::sum},
                                                  std::move(gi), {cg::ones<float>({4})});
    };
    try {
      (void)launch({"", eight, {}});
    } catch (const cg::error& e) {
      launched = e.what();
    }
    try {
      (void)launch({"", {0}, {{0}, {1}}});
    } catch (const cg::error& e) {
      split = e.what();
    }
    // Nothing reached NCCL: the world still works.
    CHECK(cg::all_reduce(cg::ones<float>({4}), "sum", ctx.world()).to_vector() == std::vector<float>(4, 1.f));
  });
  CHECK(compiled.find("= all_reduce: group [0, 1, 2, 3, 4, 5, 6, 7] does not fit a world of 1 ranks (rank 0)") !=
        std::string::npos);
  CHECK(launched == "all_reduce: group [0, 1, 2, 3, 4, 5, 6, 7] does not fit a world of 1 ranks (rank 0)");
  CHECK(split == "all_reduce: the partition [[0], [1]] of group [0] does not split a world of 1 ranks (rank 0)");
}
// ---------------------------------------------------------------------------------------------
// Four GPUs (issue 20): the world-4 meaning of the cases above, a 2 x 2 (dp x tp) mesh whose
// dimensions are communicators of their own, and failures among more than two ranks.
// ---------------------------------------------------------------------------------------------

GPUS_TEST_CASE("nccl.collectives_match_threads_backend.4_gpus", 4) { same_as_threads(4, collective_suite); }

GPUS_TEST_CASE("nccl.subgroups_and_2x2_mesh.4_gpus", 4) {
  // A 2 x 2 (dp x tp) mesh: each dimension's two groups, an MPMD partition across them, the
  // world named in another order, and a group of three that rank 0 is not in (only its members
  // issue it). Every subgroup is a communicator of its own, made from an id its first member
  // publishes; the world named in another order is the world's.
  same_as_threads(4, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    results out;
    const auto x = cg::arange<float>(0, 16).reshape({4, 4}) + static_cast<float>(100 * r);
    const cg::device_mesh mesh({2, 2}, std::vector<std::string>{"dp", "tp"});  // dp {0, 2} {1, 3}; tp {0, 1} {2, 3}
    out["mesh.dp.sum"] = values(cg::all_reduce(x, "sum", cg::group{mesh, "dp"}));
    out["mesh.tp.sum"] = values(cg::all_reduce(x, "sum", cg::group{mesh, "tp"}));
    out["mesh.tp.all_gather"] = values(cg::all_gather_tensor(x, 1, cg::group{mesh, 1}));
    out["mesh.dp.reduce_scatter"] = values(cg::reduce_scatter_tensor(x, "sum", 0, cg::group{mesh, 0}));
    out["mesh.tp.all_to_all"] = values(cg::all_to_all_single(x, std::nullopt, std::nullopt, cg::group{mesh, "tp"}));
    out["mesh.dp.broadcast"] = values(cg::broadcast(x, r % 2 + 2, cg::group{mesh, "dp"}));  // the dp group's second member
    out["mesh.all.max"] = values(cg::all_reduce(x, "max", cg::group{mesh}));
    out["mpmd.crossed"] = values(cg::all_reduce(x, "sum", cg::group{std::vector<std::vector<int>>{{0, 3}, {1, 2}}}));
    ctx.register_group("reversed", {3, 2, 1, 0});
    out["named.reversed"] = values(cg::all_gather_tensor(x, 0, cg::group{std::string("reversed")}));
    if (r != 0) {
      const cg::group three{std::vector<int>{1, 2, 3}};
      out["three.sum"] = values(cg::all_reduce(x, "sum", three));
      out["three.broadcast"] = values(cg::broadcast(x, 3, three));
    }
    out["mesh.dp.again"] = values(cg::all_reduce(x * 2.f, "sum", cg::group{mesh, 0}));  // its communicator reused
    if (auto* nr = dynamic_cast<cg::cuda::detail::nccl_rank*>(&ctx.comm())) {
      using key = std::pair<std::vector<int>, std::string>;
      const auto comms = nr->communicators();
      CAPTURE(r);
      const std::vector<int> dp{r % 2, r % 2 + 2}, tp{r - r % 2, r - r % 2 + 1};
      const std::vector<int> crossed = r == 0 || r == 3 ? std::vector<int>{0, 3} : std::vector<int>{1, 2};
      for (const auto& ranks : {std::vector<int>{0, 1, 2, 3}, dp, tp, crossed})
        CHECK(std::count(comms.begin(), comms.end(), key{ranks, ""}) == 1);
      CHECK(std::count(comms.begin(), comms.end(), key{{1, 2, 3}, ""}) == (r == 0 ? 0 : 1));
      CHECK(comms.size() == (r == 0 ? 4u : 5u));
    }
    return out;
  });
}

GPUS_TEST_CASE("nccl.tagged_groups_on_a_2x2_mesh.4_gpus", 4) {
  // FSDP on the dp dimension of a 2 x 2 mesh: its all_gather and reduce_scatter groups carry
  // their own tags, so each rank holds two communicators for its dp pair beside the world's.
  same_as_threads(4, [](cg::rank_context& ctx) {
    results out;
    const cg::device_mesh mesh({2, 2}, std::vector<std::string>{"dp", "tp"});
    const auto x = cg::full<float>({8}, static_cast<float>(ctx.rank() + 1));
    const cg::group ag = cg::group{mesh, "dp"}.tagged("fsdp_ag"), rs = cg::group{mesh, "dp"}.tagged("fsdp_rs");
    for (int step = 0; step < 2; ++step) {
      const std::string s = std::to_string(step);
      out["ag." + s] = values(cg::all_gather_tensor(x, 0, ag));
      out["rs." + s] = values(cg::reduce_scatter_tensor(x, "sum", 0, rs));
      out["world." + s] = values(cg::all_reduce(x, "sum", ctx.world()));
    }
    if (auto* nr = dynamic_cast<cg::cuda::detail::nccl_rank*>(&ctx.comm())) {
      using key = std::pair<std::vector<int>, std::string>;
      const auto comms = nr->communicators();
      const std::vector<int> dp{ctx.rank() % 2, ctx.rank() % 2 + 2};
      CHECK(comms.size() == 3);
      CHECK(std::count(comms.begin(), comms.end(), key{dp, "fsdp_ag"}) == 1);
      CHECK(std::count(comms.begin(), comms.end(), key{dp, "fsdp_rs"}) == 1);
    }
    return out;
  });
}

GPUS_TEST_CASE("nccl.every_reduce_op_and_dtype_matches_threads_backend.4_gpus", 4) { reduction_matrix_case(4); }

// Eight GPUs: written for the 8-GPU machines, which were not lent when these were added (so
// never run yet). reduction_matrix_case is left at 4: its products of 8 ranks' values are not
// exact in bf16/f16/f32, which its bitwise comparison needs.
GPUS_TEST_CASE("nccl.collectives_match_threads_backend.8_gpus", 8) { same_as_threads(8, collective_suite); }

GPUS_TEST_CASE("nccl.subgroups_and_2x4_mesh.8_gpus", 8) {
  // A 2 x 4 (dp x tp) mesh: dp groups are the columns {c, c + 4}, tp groups the rows.
  same_as_threads(8, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    results out;
    const auto x = cg::arange<float>(0, 32).reshape({8, 4}) + static_cast<float>(100 * r);
    const cg::device_mesh mesh({2, 4}, std::vector<std::string>{"dp", "tp"});
    out["mesh.dp.sum"] = values(cg::all_reduce(x, "sum", cg::group{mesh, "dp"}));
    out["mesh.tp.sum"] = values(cg::all_reduce(x, "sum", cg::group{mesh, "tp"}));
    out["mesh.tp.all_gather"] = values(cg::all_gather_tensor(x, 1, cg::group{mesh, 1}));
    out["mesh.tp.reduce_scatter"] = values(cg::reduce_scatter_tensor(x, "sum", 0, cg::group{mesh, "tp"}));
    out["mesh.dp.reduce_scatter"] = values(cg::reduce_scatter_tensor(x, "sum", 0, cg::group{mesh, 0}));
    out["mesh.tp.all_to_all"] = values(cg::all_to_all_single(x, std::nullopt, std::nullopt, cg::group{mesh, "tp"}));
    out["mesh.tp.broadcast"] = values(cg::broadcast(x, r - r % 4 + 3, cg::group{mesh, "tp"}));  // the row's last
    out["mesh.all.max"] = values(cg::all_reduce(x, "max", cg::group{mesh}));
    return out;
  });
}
GPUS_TEST_CASE("nccl.gemm_leaves_sms_to_unwaited_collectives.4_gpus", 4) { gemm_carveout_case(4); }
GPUS_TEST_CASE("nccl.overlapped_collectives_run_capped_with_same_results.4_gpus", 4) { overlapped_case(4); }
GPUS_TEST_CASE("nccl.collective_stream_placement.4_gpus", 4) {
  for (auto p : {cg::cuda::collective_stream::automatic, cg::cuda::collective_stream::caller,
                 cg::cuda::collective_stream::separate}) {
    CAPTURE(static_cast<int>(p));
    placement_case(4, p);
  }
}

GPUS_TEST_CASE("nccl.copy_engine_all_reduce_on_mesh_pairs.4_gpus", 4) {
  // The copy-engine all_reduce serves groups of two: on a 2 x 2 mesh the tp pairs {0, 1}, {2, 3}
  // and the dp pairs {0, 2}, {1, 3} each get a channel of their own (two at once per rank), and
  // the world's all_reduce of four ranks stays with NCCL. Bitwise the values NCCL gives.
  using ce = cg::cuda::copy_engine_all_reduce;
  const std::int64_t n = (1 << 19) + 3;  // > 1 MiB in f32 and bf16
  auto run = [&](ce policy, std::vector<results>& res, std::vector<std::uint64_t>& launches) {
    cg::cuda::nccl_options opt;
    opt.copy_engine = policy;
    cg::cuda::run_gpus(
        4,
        [&](cg::rank_context& ctx) {
          const auto r = static_cast<std::size_t>(ctx.rank());
          const cg::device_mesh mesh({2, 2}, std::vector<std::string>{"dp", "tp"});
          const std::uint64_t before = copy_engine_launched(ctx);
          const auto x = cg::uniform<float>({n}, -2, 2, 70 + r);
          const auto xb = cg::uniform<cg::bf16>({n}, -2, 2, 80 + r);
          auto tp = cg::all_reduce(x, "sum", cg::group{mesh, "tp"});
          auto dp = cg::all_reduce(xb, "max", cg::group{mesh, "dp"});  // both pairs out at once
          res[r]["tp f32 sum"] = values(tp);
          res[r]["dp bf16 max"] = values(dp);
          res[r]["world f32 sum"] = values(cg::all_reduce(x, "sum", ctx.world()));
          res[r]["tp again"] = values(cg::all_reduce(cg::tensor<float>(x * 3.f), "avg", cg::group{mesh, 1}));
          launches[r] = copy_engine_launched(ctx) - before;
        },
        opt);
  };
  std::vector<results> nccl(4), copy(4);
  std::vector<std::uint64_t> nccl_launches(4), copy_launches(4);
  run(ce::off, nccl, nccl_launches);
  run(ce::always, copy, copy_launches);
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(nccl_launches[r] == 0);
    CHECK(copy_launches[r] == 3);  // tp, dp, tp again; not the world's
    REQUIRE(copy[r].size() == nccl[r].size());
    for (const auto& [name, want] : nccl[r]) {
      CAPTURE(name);
      CHECK(copy[r].at(name) == want);
    }
  }
}

GPUS_TEST_CASE("nccl.copy_engine_gather_scatter_equals_nccl.4_gpus", 4) {
  // Four ranks: the all_gathers and the min/max reduce_scatters (NCCL's bits in any order) run
  // on the copy engines; sums are NCCL's unless copy_engine_reassociates says otherwise.
  gather_scatter_equals_nccl(4, false);
}

GPUS_TEST_CASE("nccl.copy_engine_reassociated_sums.4_gpus", 4) {
  // With copy_engine_reassociates a reduce_scatter of four ranks sums on the copy engines, in
  // rank order in f32, rounded once: within half a unit in the last place of the exact sum
  // (bf16), within f32's rounding of four terms (f32), and the same on every call.
  cg::cuda::nccl_options opt;
  opt.copy_engine = cg::cuda::copy_engine_all_reduce::always;
  opt.copy_engine_reassociates = true;
  const std::int64_t m = (1 << 18) + 3;
  cg::cuda::run_gpus(
      4,
      [&](cg::rank_context& ctx) {
        const int me = ctx.rank();
        const std::uint64_t before = copy_engine_launched(ctx);
        const auto input = [&](int r, int k) { return cg::uniform<cg::bf16>({4 * m}, -2, 2, 500 + 10 * static_cast<std::uint64_t>(k) + static_cast<std::uint64_t>(r)); };
        const auto inputf = [&](int r) { return cg::uniform<float>({4 * m}, -2, 2, 600 + static_cast<std::uint64_t>(r)); };
        const auto sum_b = values(cg::reduce_scatter_tensor(input(me, 0), "sum", 0, ctx.world()));
        const auto avg_b = values(cg::reduce_scatter_tensor(input(me, 1), "avg", 0, ctx.world()));
        const auto sum_f = values(cg::reduce_scatter_tensor(inputf(me), "sum", 0, ctx.world()));
        const auto again = values(cg::reduce_scatter_tensor(input(me, 0), "sum", 0, ctx.world()));
        CHECK(copy_engine_launched(ctx) - before == 4);
        CHECK(again == sum_b);
        std::vector<std::vector<double>> xb0, xb1, xf;
        for (int r = 0; r < 4; ++r) {
          xb0.push_back(values(input(r, 0)));
          xb1.push_back(values(input(r, 1)));
          xf.push_back(values(inputf(r)));
        }
        for (std::int64_t i = 0; i < m; ++i) {
          const auto j = static_cast<std::size_t>(me * m + i);
          const auto o = static_cast<std::size_t>(i);
          double sb0 = 0, sb1 = 0, sf = 0, af = 0;
          for (int r = 0; r < 4; ++r) {
            const auto rr = static_cast<std::size_t>(r);
            sb0 += xb0[rr][j];
            sb1 += xb1[rr][j];
            sf += xf[rr][j];
            af += std::abs(xf[rr][j]);
          }
          const double half_ulp = std::ldexp(1.0, -8);  // bf16: half an ulp is at most 2^-8 of the value
          if (std::abs(sum_b[o] - sb0) > half_ulp * std::abs(sb0) + 1e-6 ||
              std::abs(avg_b[o] - sb1 / 4) > half_ulp * std::abs(sb1 / 4) + 1e-6 ||
              std::abs(sum_f[o] - sf) > 4 * 6e-8 * af) {
            FAIL_CHECK("rank " << me << " element " << i << ": sum " << sum_b[o] << " vs " << sb0 << ", avg " << avg_b[o]
                               << " vs " << sb1 / 4 << ", f32 " << sum_f[o] << " vs " << sf);
            break;
          }
        }
      },
      opt);
}

GPUS_TEST_CASE("nccl.missing_rank_times_out.4_gpus", 4) {
  // The last of four ranks never issues the all_reduce: the other three time out, naming it.
  cg::cuda::nccl_options opt;
  opt.timeout = std::chrono::milliseconds(3000);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(cg::cuda::run_gpus(
                           4,
                           [](cg::rank_context& ctx) {
                             if (ctx.rank() == 3) return;
                             auto y = cg::all_reduce(cg::ones<float>({1024}), "sum", ctx.world());
                             (void)y.to_vector();
                           },
                           opt),
                       doctest::Contains("all_reduce"), cg::timeout_error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
}

GPUS_TEST_CASE("nccl.failing_rank_aborts_its_peers.4_gpus", 4) {
  // Rank 2 of four throws; the three others, inside a world all_reduce or a dp-pair one, are
  // aborted with an error that names rank 2.
  std::vector<std::string> peers(4);
  CHECK_THROWS_WITH_AS(cg::cuda::run_gpus(4,
                                          [&](cg::rank_context& ctx) {
                                            const int r = ctx.rank();
                                            if (r == 2) throw std::runtime_error("rank two broke");
                                            try {
                                              const cg::group g = r == 0 ? cg::group{std::vector<int>{0, 2}} : ctx.world();
                                              auto y = cg::all_reduce(cg::ones<float>({8}), "sum", g);
                                              (void)y.to_vector();
                                            } catch (const cg::error& e) {
                                              peers[static_cast<std::size_t>(r)] = e.what();
                                              throw;
                                            }
                                          }),
                       "rank two broke", std::runtime_error);
  for (int r : {0, 1, 3}) {
    CAPTURE(r);
    CAPTURE(peers[static_cast<std::size_t>(r)]);
    CHECK(peers[static_cast<std::size_t>(r)].find("rank 2") != std::string::npos);
  }
}

GPUS_TEST_CASE("nccl.timeout.max_waits_forever.4_gpus", 4) {
  cg::cuda::nccl_options opt;
  opt.timeout = std::chrono::milliseconds::max();
  cg::cuda::run_gpus(
      4,
      [](cg::rank_context& ctx) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100 * ctx.rank()));
        CHECK(cg::all_reduce(cg::ones<float>({1024}), "sum", ctx.world()).to_vector() == std::vector<float>(1024, 4.f));
      },
      opt);
}
}  // namespace gpu_test_nccl_backend
