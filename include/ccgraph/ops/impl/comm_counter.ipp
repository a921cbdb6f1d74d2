// ccgraph/ops/impl/comm_counter.ipp: the non-template functions of <ccgraph/ops/comm_counter.hpp>.
// Included by that header when header-only, compiled once by <ccgraph/impl/src.hpp> under
// CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/comm_counter.hpp>

namespace ccgraph {

CCGRAPH_DECL std::int64_t comm_counter::count(std::string_view kind) const {
  const std::string k = canonical(kind);
  std::int64_t n = 0;
  for (const auto& [phase, kinds] : by_phase_)
    if (auto it = kinds.find(k); it != kinds.end()) n += it->second;
  return n;
}

CCGRAPH_DECL std::int64_t comm_counter::count(std::string_view kind, std::string_view phase) const {
  auto p = by_phase_.find(std::string(phase));
  if (p == by_phase_.end()) return 0;
  auto it = p->second.find(canonical(kind));
  return it == p->second.end() ? 0 : it->second;
}

CCGRAPH_DECL std::int64_t comm_counter::total() const {
  std::int64_t n = 0;
  for (const auto& [phase, kinds] : by_phase_)
    for (const auto& [k, c] : kinds) n += c;
  return n;
}

CCGRAPH_DECL std::map<std::string, std::int64_t> comm_counter::counts() const {
  std::map<std::string, std::int64_t> out;
  for (const auto& [phase, kinds] : by_phase_)
    for (const auto& [k, c] : kinds) out[k] += c;
  return out;
}

CCGRAPH_DECL void comm_counter::add(std::string_view kind) { ++by_phase_[phase_][std::string(kind)]; }

CCGRAPH_DECL std::string comm_counter::canonical(std::string_view kind) {
  if (kind == "all_gather") return "all_gather_into_tensor";
  if (kind == "reduce_scatter") return "reduce_scatter_tensor";
  if (kind == "all_to_all") return "all_to_all_single";
  return std::string(kind);
}

}  // namespace ccgraph
