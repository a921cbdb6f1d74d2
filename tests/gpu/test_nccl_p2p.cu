// tests/gpu/test_nccl_p2p.cu: point-to-point (batch_isend_irecv as one NCCL group, send, recv)
// and the rest of c10d (reduce, gather, scatter, barrier, list all_gather and all_to_all) on
// the nccl backend, every result compared with the threads backend's on the same program, plus
// a traced pipeline step compiled on the GPUs. On 2 and 4 GPUs (each skipped without enough):
// on 4 the batches go around a ring and send/recv between the pairs (0, 1) and (2, 3).
#include <ccgraph/cuda.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/runtime/verify.hpp>
#include <doctest/doctest.h>
#include "gpu_test.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_nccl_p2p {

namespace cg = ccgraph;

namespace p2p_gpu_test {

using results = std::map<std::string, std::vector<double>>;

template <class T>
std::vector<double> values(const cg::tensor<T>& t) {
  std::vector<double> out;
  for (const T& v : t.to_vector()) out.push_back(static_cast<double>(static_cast<cg::compute_t<T>>(v)));
  return out;
}

/// Runs `fn` on n ranks of the threads backend and of the nccl backend; every named result of
/// every rank must be equal.
template <class F>
void same_as_threads(int n, F fn) {
  std::vector<results> cpu(static_cast<std::size_t>(n)), gpu(static_cast<std::size_t>(n));
  cg::run_threads(n, [&](cg::rank_context& ctx) { cpu[static_cast<std::size_t>(ctx.rank())] = fn(ctx); });
  cg::cuda::run_gpus(n, [&](cg::rank_context& ctx) { gpu[static_cast<std::size_t>(ctx.rank())] = fn(ctx); });
  for (int r = 0; r < n; ++r) {
    const auto& c = cpu[static_cast<std::size_t>(r)];
    const auto& g = gpu[static_cast<std::size_t>(r)];
    REQUIRE(c.size() == g.size());
    for (auto& [name, want] : c) {
      REQUIRE(g.count(name) == 1);
      CHECK_MESSAGE(g.at(name) == want, "rank ", r, ": ", name);
    }
  }
}

/// Rank r's input of `shape`, small integers every dtype holds exactly, on the rank's device.
template <class T>
cg::tensor<T> input_of(cg::rank_context& ctx, int r, const cg::shape_t& shape, std::uint64_t seed) {
  auto h = std::is_same_v<T, bool> ? cg::uniform<bool>(shape, 0, 1, seed * 31 + static_cast<std::uint64_t>(r)).template to<T>()
                                   : cg::uniform<std::int64_t>(shape, 1, 4, seed * 31 + static_cast<std::uint64_t>(r)).template to<T>();
  return h.to(ctx.device());
}

constexpr cg::dtype dtypes[] = {cg::dtype::f32, cg::dtype::f64, cg::dtype::i32, cg::dtype::i64,
                                cg::dtype::u8,  cg::dtype::boolean, cg::dtype::bf16, cg::dtype::f16};

results p2p_suite(cg::rank_context& ctx) {
  results out;
  // Each rank sends to the next rank of a ring and receives from the previous one (on 2 ranks
  // both are the other rank).
  const int r = ctx.rank(), n = ctx.world_size(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const auto w = ctx.world();
  for (cg::dtype d : dtypes)
    cg::visit_dtype(d, [&](auto tag) {
      using T = decltype(tag);
      const std::string dt(cg::to_string(d));
      const auto a = input_of<T>(ctx, r, {5, 3}, 1), b = input_of<T>(ctx, r, {7}, 2);
      // Both ranks exchange two tensors in one batch, sends and receives interleaved differently
      // on each rank. Transfers between one sender and one receiver meet in the order each lists
      // them (NCCL matches a peer's sends and receives in order: a batch whose orders differ there
      // is refused, tests/ops/test_p2p.cpp).
      auto got = r % 2 == 0 ? cg::batch_isend_irecv({cg::isend(a, next), cg::irecv(a, prev), cg::isend(b, next), cg::irecv(b, prev)}, w)
                            : cg::batch_isend_irecv({cg::irecv(a, prev), cg::irecv(b, prev), cg::isend(a, next), cg::isend(b, next)}, w);
      out["batch0." + dt] = values(got[0]);
      out["batch1." + dt] = values(got[1]);
      if (r % 2 == 0) cg::send(a, r + 1, w);  // n is even
      else out["recv." + dt] = values(cg::recv(a, r - 1, w));
      for (auto op : {cg::reduce_op::sum, cg::reduce_op::product, cg::reduce_op::max})
        out["reduce." + std::string(cg::to_string(op)) + "." + dt] = values(cg::reduce(a, 1, op, w));
      const auto parts = cg::gather(a, 0, w);
      for (std::size_t k = 0; k < parts.size(); ++k) out["gather" + std::to_string(k) + "." + dt] = values(parts[k]);
      out["scatter." + dt] = values(cg::scatter(input_of<T>(ctx, 0, {2 * n, 3}, 3), 0, w));
      const auto ag = cg::all_gather(a, w);
      for (std::size_t k = 0; k < ag.size(); ++k) out["all_gather" + std::to_string(k) + "." + dt] = values(ag[k]);
      std::vector<cg::tensor<T>> ins, likes;
      for (int j = 0; j < n; ++j) {
        ins.push_back(input_of<T>(ctx, 10 * r + j, {j + r + 1, 2}, 4));
        likes.push_back(cg::zeros<T>({j + r + 1, 2}).to(ctx.device()));
      }
      const auto a2a = cg::all_to_all(likes, ins, w);
      for (std::size_t k = 0; k < a2a.size(); ++k) out["all_to_all" + std::to_string(k) + "." + dt] = values(a2a[k]);
    });
  cg::barrier(w);
  return out;
}

}  // namespace p2p_gpu_test

using namespace p2p_gpu_test;

GPUS_TEST_CASE("nccl.p2p_and_c10d_rest_match_threads_backend.2_gpus", 2) { same_as_threads(2, p2p_suite); }
GPUS_TEST_CASE("nccl.p2p_and_c10d_rest_match_threads_backend.4_gpus", 4) { same_as_threads(4, p2p_suite); }

GPUS_TEST_CASE("nccl.p2p_traced_pipeline_step_matches_eager.2_gpus", 2) {
  cg::cuda::run_gpus(2, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    const cg::group w = std::vector<int>{0, 1};
    auto program = [r, w](auto x) {
      if (r == 0) {
        auto h = cg::eval(x * 2.0f);
        cg::send(h, 1, w);
        return cg::recv(h, 1, w);
      }
      auto y = cg::eval(cg::recv(x, 0, w) + 1.0f);
      (void)cg::batch_isend_irecv({cg::isend(y, 0)}, w);
      return cg::eval(y * 3.0f);
    };
    const auto x = cg::full<float>({64, 32}, static_cast<float>(r + 1)).to(ctx.device());
    const auto eager = program(x).to_vector();
    auto g = cg::trace(program, cg::input<float>({64, 32}));
    cg::verify_collective_order(g, ctx);
    CHECK(cg::compile(g, ctx)(x).to_vector() == eager);
    CHECK(cg::compile(cg::schedule(g, {"overlap"}), ctx)(x).to_vector() == eager);
  });
}
}  // namespace gpu_test_nccl_p2p
