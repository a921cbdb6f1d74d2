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

CCGRAPH_DECL group_info group::resolve(int rank, const group_registry& reg, const char* what) const {
  std::vector<int> ranks;
  if (auto* r = std::get_if<std::vector<int>>(&desc_)) {
    ranks = group_registry::canonical_ranks(*r, reg.world_size(), what);
  } else if (auto* lists = std::get_if<std::vector<std::vector<int>>>(&desc_)) {
    std::size_t covered = 0;
    bool in_world = true;
    for (auto& l : *lists) {
      if (std::find(l.begin(), l.end(), rank) != l.end())
        ranks = group_registry::canonical_ranks(l, reg.world_size(), what);
      covered += l.size();
      for (int r : l) in_world = in_world && r >= 0 && r < reg.world_size();
    }
    CCGRAPH_CHECK(!ranks.empty(), what, ": rank ", rank, " is in none of the groups ",
                  lists_str(*lists));
    // Lists hold distinct ranks (check_mpmd): as many ranks as the world, all in it, is all
    // of it.
    if (in_world && covered == static_cast<std::size_t>(reg.world_size())) {
      std::vector<std::vector<int>> parts;
      for (auto& l : *lists) parts.push_back(group_registry::canonical_ranks(l, reg.world_size(), what));
      std::string name = reg.name_of(ranks);
      return {std::move(name), std::move(ranks), std::move(parts), tag_};
    }
  } else {
    ranks = reg.find(std::get<std::string>(desc_));
  }
  CCGRAPH_CHECK(std::find(ranks.begin(), ranks.end(), rank) != ranks.end(), what, ": rank ",
                rank, " is not a member of group ", list_str(ranks));
  std::string name = reg.name_of(ranks);
  return {std::move(name), std::move(ranks), {}, tag_};
}

CCGRAPH_DECL int group::size() const {
  if (auto* r = std::get_if<std::vector<int>>(&desc_)) return static_cast<int>(r->size());
  if (auto* l = std::get_if<std::vector<std::vector<int>>>(&desc_))
    return static_cast<int>(l->front().size());
  return -1;
}

CCGRAPH_DECL std::string group::lists_str(const lists_t& lists) {
  std::string s = "[";
  for (std::size_t i = 0; i < lists.size(); ++i) s += (i ? ", " : "") + list_str(lists[i]);
  return s + "]";
}

CCGRAPH_DECL group::lists_t group::check_mpmd(lists_t lists) {
  CCGRAPH_CHECK(!lists.empty(), "group: an MPMD group needs at least one rank list");
  for (auto& l : lists)
    CCGRAPH_CHECK(l.size() == lists.front().size(), "group sizes must be identical found ",
                  lists.front().size(), " and ", l.size());
  std::vector<int> all;
  for (auto& l : lists) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  CCGRAPH_CHECK(std::adjacent_find(all.begin(), all.end()) == all.end(),
                "group: a rank appears in more than one list of ", lists_str(lists));
  return lists;
}

CCGRAPH_DECL group_registry::group_registry(int world_size) : world_size_(world_size) {
  if (world_size <= 0) return;
  std::vector<int> all(static_cast<std::size_t>(world_size));
  for (int i = 0; i < world_size; ++i) all[static_cast<std::size_t>(i)] = i;
  by_name_.emplace("0", all);
}

CCGRAPH_DECL void group_registry::add(const std::string& name, std::vector<int> ranks) {
  ranks = canonical_ranks(std::move(ranks), world_size_, "register_group");
  std::lock_guard lk(mu_);
  auto [it, inserted] = by_name_.emplace(name, ranks);
  CCGRAPH_CHECK(inserted || it->second == ranks, "register_group: name '", name,
                "' is already registered for ranks ", list_str(it->second), ", not ",
                list_str(ranks));
}

CCGRAPH_DECL std::vector<int> group_registry::find(const std::string& name) const {
  CCGRAPH_CHECK(name != "0" || world_size_ > 0,
                "group: the world group '0' needs a world size; trace inside run_threads or "
                "pass cg::trace_options{.world_size = N}");
  std::lock_guard lk(mu_);
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  std::string known;
  for (auto& [n, r] : by_name_) known += (known.empty() ? "'" : ", '") + n + "'";
  CCGRAPH_THROW(error, "group: no group named '", name, "' is registered (known: ", known, ")");
}

CCGRAPH_DECL void group_registry::copy_names_from(const group_registry& other) {
  std::scoped_lock lk(mu_, other.mu_);
  for (auto& [n, r] : other.by_name_) by_name_.insert_or_assign(n, r);
}

CCGRAPH_DECL std::string group_registry::name_of(const std::vector<int>& ranks) const {
  std::lock_guard lk(mu_);
  for (auto& [n, r] : by_name_)
    if (r == ranks) return n;
  return list_str(ranks);
}

CCGRAPH_DECL std::vector<int> group_registry::canonical_ranks(std::vector<int> ranks, int world_size, const char* what) {
  CCGRAPH_CHECK(!ranks.empty(), what, ": a group needs at least one rank");
  std::sort(ranks.begin(), ranks.end());
  CCGRAPH_CHECK(std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end(), what,
                ": rank listed twice in group ", list_str(ranks));
  for (int r : ranks)
    CCGRAPH_CHECK(r >= 0 && (world_size <= 0 || r < world_size), what, ": rank ", r,
                  " is out of range for world size ", world_size);
  return ranks;
}

CCGRAPH_DECL group group::tagged(std::string tag) const {
  group g = *this;
  g.tag_ = std::move(tag);
  return g;
}

}  // namespace ccgraph
