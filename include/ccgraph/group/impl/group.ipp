// ccgraph/group/impl/group.ipp: the non-template functions of
// <ccgraph/group/group.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/group/group.hpp>

namespace ccgraph {

CCGRAPH_DECL std::ostream& operator<<(std::ostream& os, const group_info& g) {
  return os << g.label();
}

CCGRAPH_DECL void check_group_fits(std::string_view what, const group_info& g, int rank, int world_size) {
  CCGRAPH_CHECK(!g.ranks.empty(), what, ": empty group (rank ", rank, ", world of ", world_size, " ranks)");
  for (std::size_t i = 0; i < g.ranks.size(); ++i)
    CCGRAPH_CHECK(g.ranks[i] >= 0 && g.ranks[i] < world_size, what, ": group ", list_str(g.ranks),
                  " does not fit a world of ", world_size, " ranks (rank ", rank, ")");
  CCGRAPH_CHECK(std::adjacent_find(g.ranks.begin(), g.ranks.end(), std::greater_equal<>{}) == g.ranks.end(),
                what, ": group ", list_str(g.ranks), " is not a sorted list of distinct ranks (rank ",
                rank, ", world of ", world_size, " ranks)");
  CCGRAPH_CHECK(std::binary_search(g.ranks.begin(), g.ranks.end(), rank), what, ": rank ", rank,
                " is not a member of group ", list_str(g.ranks), " (world of ", world_size, " ranks)");
  if (g.partition.empty()) return;
  // Every rank of the world in exactly one part, and this group one of the parts.
  std::vector<char> seen(static_cast<std::size_t>(world_size), 0);
  std::size_t covered = 0;
  bool mine = false;
  auto parts = [&] {
    std::string p = "[";
    for (std::size_t i = 0; i < g.partition.size(); ++i) p += (i ? ", " : "") + list_str(g.partition[i]);
    return p + "]";
  };
  for (const auto& part : g.partition) {
    for (int r : part) {
      CCGRAPH_CHECK(r >= 0 && r < world_size && !seen[static_cast<std::size_t>(r)], what,
                    ": the partition ", parts(), " of group ", list_str(g.ranks),
                    " does not split a world of ", world_size, " ranks (rank ", rank, ")");
      seen[static_cast<std::size_t>(r)] = 1;
      ++covered;
    }
    mine = mine || part == g.ranks;
  }
  CCGRAPH_CHECK(covered == static_cast<std::size_t>(world_size) && mine, what, ": the partition ",
                parts(), " of group ", list_str(g.ranks), " does not split a world of ", world_size,
                " ranks (rank ", rank, ")");
}

}  // namespace ccgraph
