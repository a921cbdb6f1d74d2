// The consumer tests' program (tests/consumers/*, scripts/consumers.sh, test_package/): what a
// user writes after `find_package(ccgraph)`, `add_subdirectory(ccgraph)` or
// `pkg-config --cflags ccgraph`. Two ranks all_reduce a tensor; every rank checks the sum.
// Built with -DCCGRAPH_CONSUMER_CUDA (find_package consumer, where the `cuda` component is
// found), it also includes <ccgraph/cuda.hpp>, links ccgraph::cuda and asks NCCL its version:
// no GPU is needed for that.
#include <ccgraph/ccgraph.hpp>
#ifdef CCGRAPH_CONSUMER_CUDA
#include <ccgraph/cuda.hpp>
#endif

#include <cstdio>
#include <stdexcept>
#include <string>

namespace cg = ccgraph;

int main() {
  cg::run_threads(2, [](cg::rank_context& ctx) {
    // rank 0: 1 2 3 4 5 6, rank 1: 11 12 13 14 15 16; the sum: 12 14 16 18 20 22.
    cg::tensor<float> t = cg::arange<float>(6).reshape({2, 3}) + float(1 + 10 * ctx.rank());
    cg::tensor<float> sum = cg::all_reduce(t, "sum", ctx.world());
    const auto v = sum.to_vector();
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] != float(12 + 2 * i))
        throw std::runtime_error("rank " + std::to_string(ctx.rank()) + ": element " + std::to_string(i) +
                                 " is " + std::to_string(v[i]) + ", expected " + std::to_string(12 + 2 * i));
    if (ctx.rank() == 0) std::printf("all_reduce over %d ranks: [%g, ..., %g]\n", ctx.world_size(), v.front(), v.back());
  });
#ifdef CCGRAPH_CONSUMER_CUDA
  int nccl = 0;
  CCGRAPH_CHECK_NCCL(ncclGetVersion(&nccl));
  std::printf("ccgraph::cuda linked: NCCL %d\n", nccl);
#endif
  std::printf("ccgraph %d.%d.%d consumer: ok\n", CCGRAPH_VERSION_MAJOR, CCGRAPH_VERSION_MINOR, CCGRAPH_VERSION_PATCH);
}
