// ccgraph/schedule/impl/agreement.ipp: the non-template functions of
// <ccgraph/schedule/agreement.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/agreement.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL std::vector<group_facts> groups_of(const std::vector<node*>& collectives) {
  std::vector<group_facts> out;
  std::map<std::vector<int>, std::size_t> index;
  for (std::size_t i = 0; i < collectives.size(); ++i) {
    const group_info& grp = *collectives[i]->group();
    auto [it, fresh] = index.emplace(grp.ranks, out.size());
    if (fresh) out.push_back({grp, {}, false, 0, {}, true});
    out[it->second].members.push_back(i);
  }
  return out;
}

CCGRAPH_DECL std::uint64_t collectives_hash(const std::vector<node*>& collectives, const std::vector<std::size_t>& members,
                                      std::string_view pass, const std::vector<std::int64_t>& extra) {
  hasher h;
  h.add(pass);
  h.add(extra);
  std::vector<tensor_meta> in;
  for (std::size_t i : members) {
    const node& c = *collectives[i];
    in.clear();
    for (auto& a : c.args()) in.push_back(a.src->meta(a.index));
    h.add(ops::signature(*c.collective(), in, *c.group()).str());
  }
  return h.h;
}

CCGRAPH_DECL std::vector<std::vector<int>> agreement_key(const group_info& g) {
  return g.partition.empty() ? std::vector<std::vector<int>>{g.ranks} : g.partition;
}

CCGRAPH_DECL std::vector<std::int64_t> max_over_group(rank_context& ctx, const group_info& grp,
                                                const std::vector<std::int64_t>& values) {
  if (grp.size() == 1 || values.empty()) return values;
  rank_scope scope(ctx);
  const auto in = tensor<std::int64_t>::from(values, {static_cast<std::int64_t>(values.size())}).to(ctx.device());
  auto out = launch_collective<std::int64_t>(ctx, "schedule", ops::all_reduce{reduce_op::max}, grp, {in});
  return out.front().to_vector();
}

CCGRAPH_DECL void agree_on_groups(rank_context* ctx, std::string_view pass, std::vector<group_facts>& groups) {
  if (!ctx) return;
  for (const group_facts& g : groups)
    CCGRAPH_CHECK(g.group.index_of(ctx->rank()) >= 0, pass, ": the graph has a collective on group ",
                  list_str(g.group.ranks), ", which rank ", ctx->rank(),
                  " (the rank context it agrees through) is not in: schedule each rank's graph on that rank, "
                  "or pass schedule_options{.agreement = collective_agreement::spmd}");
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < groups.size(); ++i)
    if (groups[i].proposes && groups[i].group.size() > 1) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return agreement_key(groups[a].group) < agreement_key(groups[b].group);
  });
  for (std::size_t i : order) {
    group_facts& g = groups[i];
    // 62 bits, so that negating cannot overflow: max(h) == -max(-h) exactly when all are equal.
    const auto h = static_cast<std::int64_t>(g.hash >> 2);
    const std::vector<std::int64_t> hs = max_over_group(*ctx, g.group, {h, -h});
    g.agreed = hs[0] == -hs[1];
    if (g.agreed) g.facts = max_over_group(*ctx, g.group, g.facts);
  }
}

}  // namespace detail

}  // namespace ccgraph
