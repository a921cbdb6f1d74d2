// ccgraph/ops/impl/collectives.ipp: the non-template functions of <ccgraph/ops/collectives.hpp>.
// Included by that header when header-only, compiled once by <ccgraph/impl/src.hpp> under
// CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/collectives.hpp>

namespace ccgraph {

// Out of line: it instantiates launch_collective<std::uint8_t>.
CCGRAPH_DECL void barrier(const group& g, std::source_location loc) {
  detail::call_site_scope site(loc);
  rank_context& ctx = detail::current_rank("barrier");
  const auto one = tensor<std::uint8_t>::from({1}, {1}).to(ctx.device());
  (void)detail::launch_collective<std::uint8_t>(ctx, "barrier", ops::all_reduce{reduce_op::sum},
                                                ctx.resolve(g, "barrier"), {one})
      .front()
      .wait();
}

}  // namespace ccgraph
