// tests/gpu/test_gpu_agreement.cu: the rewriting passes' agreement across ranks
// (ccgraph/schedule/agreement.hpp) on the nccl backend, where it runs as all_reduces of int64
// device tensors: on 2 GPUs, programs that differ per rank (a subgroup one rank skips, a
// dependence or a second reader on one rank only) get the same collectives on both ranks, and
// the scheduled graphs compute what eager execution does. tests/schedule/test_agreement.cpp
// has the same cases, and many more, on the threads backend.
#include <ccgraph/cuda.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/runtime/verify.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_gpu_agreement {

namespace cg = ccgraph;

namespace {

/// True when `a` and `b` agree to a relative 1e-5 (cuBLAS may sum row chunks differently).
bool close(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::fabs(a[i] - b[i]) > 1e-5f * (1.f + std::fabs(b[i]))) return false;
  return true;
}

}  // namespace

GPUS_TEST_CASE("nccl.agreement.bucket.subgroup_skipped_by_one_rank.2_gpus", 2) {
  // a and c on the world, b on {0} between them: rank 1 alone would merge a and c, rank 0
  // cannot. With a dependence of c on a on rank 1 only, rank 0 alone would merge them.
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<int> merged(2, -1);
    std::vector<char> same(2, 0);
    cg::cuda::run_gpus(2, [&](cg::rank_context& ctx) {
      auto prog = [&](auto x, auto y) {
        auto a = cg::all_reduce(x, "sum", ctx.world());
        auto b = variant == 0 && ctx.rank() == 0 ? decltype(a)(cg::all_reduce(x, "sum", cg::group{std::vector<int>{0}})) : x;
        auto in = variant == 1 && ctx.rank() == 1 ? decltype(a)(cg::matmul(a, y)) : decltype(a)(cg::matmul(x, y));
        auto c = cg::all_reduce(in, "sum", ctx.world());
        return cg::eval(a + b + c);
      };
      const auto g = cg::trace(prog, cg::input<float>({8, 8}), cg::input<float>({8, 8}));
      const auto s = cg::schedule(g, {"bucket_collectives", "overlap"});
      merged[static_cast<std::size_t>(ctx.rank())] = static_cast<int>(s.count("all_reduce_coalesced"));
      cg::verify_collective_order(s, ctx);
      const auto x = cg::uniform<float>({8, 8}, -1, 1, 10 + static_cast<std::uint64_t>(ctx.rank()));
      const auto y = cg::uniform<float>({8, 8}, -1, 1, 20 + static_cast<std::uint64_t>(ctx.rank()));
      same[static_cast<std::size_t>(ctx.rank())] = close(cg::compile(s, ctx)(x, y).to_vector(), prog(x, y).to_vector());
    });
    CAPTURE(variant);
    CHECK(merged == std::vector<int>(2, variant == 2 ? 1 : 0));
    CHECK(same == std::vector<char>{1, 1});
  }
}

GPUS_TEST_CASE("nccl.agreement.decompose.second_reader_on_one_rank.2_gpus", 2) {
  // y = x @ w -> all_reduce: rank 1 also reads y and cannot split it, so neither rank does;
  // without that reader both split into the same 4 chunks.
  for (bool blocked : {true, false}) {
    std::vector<int> all_reduces(2, -1);
    std::vector<char> same(2, 0);
    cg::cuda::run_gpus(2, [&](cg::rank_context& ctx) {
      auto prog = [&](auto x, auto w) {
        auto y = cg::matmul(x, w);
        auto r = cg::wait_tensor(cg::all_reduce(y, "sum", ctx.world()));
        return blocked && ctx.rank() == 1 ? decltype(r)(cg::eval(r + y)) : r;
      };
      const auto g = cg::trace(prog, cg::input<float>({64, 32}), cg::input<float>({32, 32}));
      const auto s = cg::schedule(g, {"decompose_matmul_collectives", "overlap"});
      all_reduces[static_cast<std::size_t>(ctx.rank())] = static_cast<int>(s.count("all_reduce"));
      cg::verify_collective_order(s, ctx);
      const auto x = cg::uniform<float>({64, 32}, -1, 1, 30 + static_cast<std::uint64_t>(ctx.rank()));
      const auto w = cg::uniform<float>({32, 32}, -1, 1, 40 + static_cast<std::uint64_t>(ctx.rank()));
      same[static_cast<std::size_t>(ctx.rank())] = close(cg::compile(s, ctx)(x, w).to_vector(), prog(x, w).to_vector());
    });
    CAPTURE(blocked);
    CHECK(all_reduces == std::vector<int>(2, blocked ? 1 : 4));
    CHECK(same == std::vector<char>{1, 1});
  }
}
}  // namespace gpu_test_gpu_agreement
