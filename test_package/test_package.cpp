// Conan test_package: two ranks (threads) all_reduce a tensor; every rank checks the sum.
#include <ccgraph/ccgraph.hpp>
#ifdef TEST_PACKAGE_CUDA
#include <ccgraph/cuda.hpp>
#endif

#include <cstdio>
#include <stdexcept>

namespace cg = ccgraph;

int main() {
  cg::run_threads(2, [](cg::rank_context& ctx) {
    cg::tensor<float> t = cg::full<float>({4}, float(ctx.rank() + 1));  // 1s on rank 0, 2s on rank 1
    cg::tensor<float> sum = cg::all_reduce(t, "sum", ctx.world());
    for (float v : sum.to_vector())
      if (v != 3.f) throw std::runtime_error("all_reduce: expected 3 on every element");
  });
#ifdef TEST_PACKAGE_CUDA
  int nccl = 0;
  CCGRAPH_CHECK_NCCL(ncclGetVersion(&nccl));
  std::printf("ccgraph::cuda: NCCL %d\n", nccl);
#endif
  std::printf("ccgraph %d.%d.%d: two-rank all_reduce ok\n", CCGRAPH_VERSION_MAJOR, CCGRAPH_VERSION_MINOR,
              CCGRAPH_VERSION_PATCH);
}
