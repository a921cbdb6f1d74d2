// ccgraph/schedule/rewrite.hpp: what the passes that rewrite a graph (bucket_collectives,
// decompose_matmul_collectives) share to stay O((V + E) log V): new nodes are added at the end
// and placed once, by one final order, instead of being inserted one at a time (each insertion
// or erasure renumbers the nodes after it).
#pragma once

#include <ccgraph/core/config.hpp>
#include <cstddef>
#include <functional>
#include <queue>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/ir/graph.hpp>

namespace ccgraph::detail {

/// Puts `g` in the topological order closest to `preferred` (every node of `g` once): among the
/// nodes whose inputs are placed, the earliest in `preferred` goes first, so `preferred` itself
/// when it is topological. O((V + E) log V).
CCGRAPH_DECL void restore_topological_order(graph& g, const std::vector<node*>& preferred);

}  // namespace ccgraph::detail

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/rewrite.ipp>
#endif
