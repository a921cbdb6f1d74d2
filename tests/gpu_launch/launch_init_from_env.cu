// One process per GPU: started by scripts/ccgraph-launch (CTest label gpu), each process joins
// through init_from_env (tcp_store rendezvous on MASTER_ADDR:MASTER_PORT), runs collectives on
// its GPU and checks them; exits non-zero on a wrong result.
#include <ccgraph/cuda.hpp>

#include <cstdio>
#include <exception>
#include <vector>

namespace cg = ccgraph;

int main() {
  try {
    auto rank = cg::cuda::init_from_env();
    cg::rank_context& ctx = rank->context();
    const int r = ctx.rank(), n = ctx.world_size();
    auto x = cg::full<float>({1000}, static_cast<float>(r + 1));
    const float want = static_cast<float>(n * (n + 1) / 2);
    const auto sum = cg::all_reduce(x, "sum", ctx.world()).to_vector();
    const auto gathered = cg::all_gather_tensor(cg::full<float>({2}, static_cast<float>(r)), 0, ctx.world()).to_vector();
    bool ok = sum == std::vector<float>(1000, want) && gathered.size() == static_cast<std::size_t>(2 * n);
    for (int i = 0; ok && i < 2 * n; ++i) ok = gathered[static_cast<std::size_t>(i)] == static_cast<float>(i / 2);
    cg::barrier(rank->rendezvous(), "end", r, n);
    std::printf("rank %d of %d on %s: %s\n", r, n, ctx.device().str().c_str(), ok ? "OK" : "WRONG");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch_init_from_env: %s\n", e.what());
    return 1;
  }
}
