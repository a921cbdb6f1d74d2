// ccgraph/schedule/impl/rewrite.ipp: the non-template functions of
// <ccgraph/schedule/rewrite.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/rewrite.hpp>

namespace ccgraph::detail {

CCGRAPH_DECL void restore_topological_order(graph& g, const std::vector<node*>& preferred) {
  const std::size_t n = preferred.size();
  CCGRAPH_CHECK(n == g.size(), "restore_topological_order: ", n, " nodes for a graph of ", g.size());
  std::vector<std::size_t> at(n);  // by current position: the index in `preferred`
  for (std::size_t i = 0; i < n; ++i) at[g.position(preferred[i])] = i;
  std::vector<int> indeg(n, 0);
  std::vector<std::size_t> counted(n, n);  // counted[j] == i: j already counted as an input of i
  bool sorted = true;
  for (std::size_t i = 0; i < n; ++i)
    for (auto& a : preferred[i]->args()) {
      const std::size_t j = at[g.position(a.src)];
      if (counted[j] == i) continue;
      counted[j] = i;
      ++indeg[i];
      sorted = sorted && j < i;
    }
  if (sorted) return g.reorder(preferred);
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) ready.push(i);
  std::vector<node*> order;
  order.reserve(n);
  while (!ready.empty()) {
    const std::size_t i = ready.top();
    ready.pop();
    order.push_back(preferred[i]);
    for (node* u : preferred[i]->users())
      if (--indeg[at[g.position(u)]] == 0) ready.push(at[g.position(u)]);
  }
  CCGRAPH_CHECK(order.size() == n, "restore_topological_order: the graph has a cycle");
  g.reorder(order);
}

}  // namespace ccgraph::detail
