// One process per GPU: started by scripts/ccgraph-launch (CTest label gpu), each process joins
// through init_from_env (tcp_store rendezvous on MASTER_ADDR:MASTER_PORT), runs collectives on
// its GPU and checks them; exits non-zero on a wrong result. With two processes the large
// all_reduces run on the copy engines between processes (CUDA IPC, shared-memory flags), and
// the large all_gathers and max reduce_scatters of every process do at any count (up to 8);
// with four or more, a 2-D mesh's pairs (copy engines again) and columns (NCCL) run too.
// This program calls no op with a CUDA kernel of its own (cuda_impl): skip compiling them all.
#define CCGRAPH_CUDA_NO_OP_KERNELS
#include <ccgraph/cuda.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace cg = ccgraph;

int main() {
  try {
    cg::cuda::nccl_options opt;
    opt.copy_engine = cg::cuda::copy_engine_all_reduce::always;
    auto rank = cg::cuda::init_from_env(opt);
    cg::rank_context& ctx = rank->context();
    const int r = ctx.rank(), n = ctx.world_size();
    auto x = cg::full<float>({1000}, static_cast<float>(r + 1));
    const float want = static_cast<float>(n * (n + 1) / 2);
    const auto sum = cg::all_reduce(x, "sum", ctx.world()).to_vector();
    const auto gathered = cg::all_gather_tensor(cg::full<float>({2}, static_cast<float>(r)), 0, ctx.world()).to_vector();
    bool ok = sum == std::vector<float>(1000, want) && gathered.size() == static_cast<std::size_t>(2 * n);
    for (int i = 0; ok && i < 2 * n; ++i) ok = gathered[static_cast<std::size_t>(i)] == static_cast<float>(i / 2);
    // Large ones, two in flight at once, then one twice as large (the channel grows).
    for (std::int64_t m : {std::int64_t{1} << 20, std::int64_t{1} << 21}) {
      auto a = cg::all_reduce(cg::full<float>({m}, static_cast<float>(r + 1)), "sum", ctx.world());
      auto b = cg::all_reduce(cg::full<cg::bf16>({m}, cg::bf16(static_cast<float>(2 * r))), "max", ctx.world());
      ok = ok && a.to_vector() == std::vector<float>(static_cast<std::size_t>(m), want);
      for (auto v : b.to_vector()) ok = ok && static_cast<float>(v) == static_cast<float>(2 * (n - 1));
    }
    // Large all_gathers and reduce_scatters of every process (copy engines at any count up
    // to 8: the max is NCCL's bits in any order; the sum only with two), twice the size the
    // second time.
    for (std::int64_t m : {std::int64_t{1} << 18, std::int64_t{1} << 19}) {
      const auto g = cg::all_gather_tensor(cg::full<cg::bf16>({m}, cg::bf16(static_cast<float>(r))), 0, ctx.world());
      const auto mx = cg::reduce_scatter_tensor(cg::full<float>({m * n}, static_cast<float>(r)), "max", 0, ctx.world());
      const auto sm = cg::reduce_scatter_tensor(cg::full<float>({m * n}, static_cast<float>(r + 1)), "sum", 0, ctx.world());
      const auto gv = g.to_vector();
      ok = ok && gv.size() == static_cast<std::size_t>(m * n);
      for (std::size_t i = 0; ok && i < gv.size(); ++i) ok = static_cast<float>(gv[i]) == static_cast<float>(i / static_cast<std::size_t>(m));
      ok = ok && mx.to_vector() == std::vector<float>(static_cast<std::size_t>(m), static_cast<float>(n - 1));
      ok = ok && sm.to_vector() == std::vector<float>(static_cast<std::size_t>(m), want);
    }
    // On 4 or more (an even number of) processes, a 2-D mesh (n/2 x 2): the pairs and the
    // columns are communicators of their own, their ids exchanged through the tcp_store.
    if (n >= 4 && n % 2 == 0) {
      const cg::device_mesh mesh({n / 2, 2}, std::vector<std::string>{"dp", "tp"});
      const auto pair = cg::all_reduce(cg::full<float>({1 << 20}, static_cast<float>(r + 1)), "sum", cg::group{mesh, "tp"});
      const float pair_sum = static_cast<float>(2 * (r - r % 2) + 3);  // (r - r%2 + 1) + (r - r%2 + 2)
      ok = ok && pair.to_vector() == std::vector<float>(std::size_t{1} << 20, pair_sum);
      const auto col = cg::all_reduce(cg::full<float>({1000}, static_cast<float>(r)), "sum", cg::group{mesh, "dp"});
      const float col_sum = static_cast<float>((r % 2) * (n / 2) + 2 * ((n / 2) * (n / 2 - 1) / 2));  // sum of r % 2 + 2k
      ok = ok && col.to_vector() == std::vector<float>(1000, col_sum);
    }
    auto* nr = dynamic_cast<cg::cuda::detail::nccl_rank*>(&ctx.comm());
    std::printf("rank %d: %llu collectives on the copy engines\n", r,
                static_cast<unsigned long long>(nr ? nr->copy_engine_launched() : 0));
    cg::barrier(rank->rendezvous(), "end", r, n);
    std::printf("rank %d of %d on %s: %s\n", r, n, ctx.device().str().c_str(), ok ? "OK" : "WRONG");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch_init_from_env: %s\n", e.what());
    return 1;
  }
}
