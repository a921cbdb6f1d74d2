// ccgraph/schedule/impl/bucketing.ipp: the non-template functions of
// <ccgraph/schedule/bucketing.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/bucketing.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL bucket_family bucket_family_of(const ops::collective_op& c) {
  return ::ccgraph::detail::visit(
      [](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        require_bucketing<O>();
        return op_traits<O>::family;
      },
      c);
}

CCGRAPH_DECL std::optional<reduce_op> reduce_op_of(const ops::collective_op& c) {
  return ::ccgraph::detail::visit(
      [](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        require_bucketing<O>();
        return op_traits<O>::reduce(o);
      },
      c);
}

CCGRAPH_DECL std::int64_t input_bytes(const node& n) {
  std::int64_t b = 0;
  for (auto& a : n.args()) {
    const tensor_meta& m = a.src->meta(a.index);
    b += numel_of(m.shape) * static_cast<std::int64_t>(element_size(m.dtype));
  }
  return b;
}

CCGRAPH_DECL std::optional<dtype> input_dtype(const node& n) {
  if (n.args().empty()) return std::nullopt;
  const dtype d = n.args().front().src->dtype(n.args().front().index);
  for (auto& a : n.args())
    if (a.src->dtype(a.index) != d) return std::nullopt;
  return d;
}

CCGRAPH_DECL bool bucket_compatible(const node& a, const node& b) {
  const auto ca = *a.collective(), cb = *b.collective();
  const bucket_family fa = bucket_family_of(ca);
  return fa != bucket_family::none && fa == bucket_family_of(cb) && *a.group() == *b.group() &&
         reduce_op_of(ca) == reduce_op_of(cb) && input_dtype(a) && input_dtype(a) == input_dtype(b);
}

CCGRAPH_DECL node_op coalesced_op_for(const node& first) {
  const int n = first.group()->size();
  return ::ccgraph::detail::visit(
      [&](const auto& o) -> node_op {
        using O = std::decay_t<decltype(o)>;
        if constexpr (op_traits<O>::family != bucket_family::none) {
          require_coalesce<O>();
          return op_traits<O>::coalesce(o, n);
        } else {
          CCGRAPH_THROW(error, "bucket_collectives: ", O::name, " has no coalesced form");
        }
      },
      *first.collective());
}

}  // namespace detail

CCGRAPH_DECL void bucket_collectives(graph& g, std::int64_t cap_bytes, rank_context* ctx) {
  const std::vector<node*> nodes = g.nodes();
  const std::size_t n = nodes.size();
  std::vector<node*> comms;
  std::vector<std::int64_t> comm_index(n, -1);  // by position
  for (std::size_t i = 0; i < n; ++i)
    if (nodes[i]->is_collective()) {
      comm_index[i] = static_cast<std::int64_t>(comms.size());
      comms.push_back(nodes[i]);
    }
  // Every group then has at most one collective: nothing to propose, on any member.
  if (comms.size() < 2) return;
  // The latest collective (by comms index) each node depends on, -1 for none.
  std::vector<std::int64_t> latest(n, -1);
  for (std::size_t i = 0; i < n; ++i)
    for (auto& a : nodes[i]->args()) {
      const std::size_t j = g.position(a.src);
      latest[i] = std::max({latest[i], latest[j], comm_index[j]});
    }

  std::vector<detail::group_facts> groups = detail::groups_of(comms);
  std::vector<std::size_t> group_of(comms.size()), index_in_group(comms.size());
  for (std::size_t k = 0; k < groups.size(); ++k)
    for (std::size_t j = 0; j < groups[k].members.size(); ++j) {
      group_of[groups[k].members[j]] = k;
      index_in_group[groups[k].members[j]] = j;
    }
  for (std::size_t k = 0; k < groups.size(); ++k) {
    detail::group_facts& gf = groups[k];
    const std::vector<std::size_t>& m = gf.members;
    for (std::size_t j = 1; j < m.size(); ++j)
      gf.proposes = gf.proposes || detail::bucket_compatible(*comms[m[j - 1]], *comms[m[j]]);
    if (!gf.proposes) continue;
    // Per member j, the latest member it may not share a bucket with: the one before it when a
    // collective of another group comes between them, else the latest member it depends on.
    // A bucket from member s on takes j only while this is below s.
    gf.facts.assign(m.size(), -1);
    for (std::size_t j = 0; j < m.size(); ++j) {
      const std::int64_t dep = latest[g.position(comms[m[j]])];
      if (dep >= 0 && group_of[static_cast<std::size_t>(dep)] == k)
        gf.facts[j] = static_cast<std::int64_t>(index_in_group[static_cast<std::size_t>(dep)]);
      if (j > 0 && m[j] != m[j - 1] + 1) gf.facts[j] = std::max<std::int64_t>(gf.facts[j], static_cast<std::int64_t>(j) - 1);
    }
    if (ctx) gf.hash = detail::collectives_hash(comms, m, "bucket_collectives", {cap_bytes});
  }
  detail::agree_on_groups(ctx, "bucket_collectives", groups);

  // Each group's runs, greedily in program order, from the agreed facts.
  std::vector<std::vector<node*>> buckets;
  for (const detail::group_facts& gf : groups) {
    if (!gf.proposes || !gf.agreed) continue;
    const std::vector<std::size_t>& m = gf.members;
    std::size_t start = 0;
    std::vector<node*> open;
    std::int64_t open_bytes = 0;
    for (std::size_t j = 0; j < m.size(); ++j) {
      node* v = comms[m[j]];
      const std::int64_t bytes = detail::input_bytes(*v);
      if (!open.empty() && gf.facts[j] < static_cast<std::int64_t>(start) &&
          detail::bucket_compatible(*open.front(), *v) && open_bytes + bytes <= cap_bytes) {
        open.push_back(v);
        open_bytes += bytes;
        continue;
      }
      if (open.size() >= 2) buckets.push_back(open);
      open.clear();
      if (detail::bucket_family_of(*v->collective()) != bucket_family::none && detail::input_dtype(*v) && bytes <= cap_bytes) {
        open.push_back(v);
        open_bytes = bytes;
        start = j;
      }
    }
    if (open.size() >= 2) buckets.push_back(open);
  }
  if (buckets.empty()) return;
  // Merged nodes are made in program order (their names follow it).
  std::sort(buckets.begin(), buckets.end(),
            [&](const auto& a, const auto& b) { return g.position(a.front()) < g.position(b.front()); });

  std::vector<node*> merged_after(n, nullptr);  // by position: the merged node of the bucket ending there
  std::vector<node*> members;
  for (const auto& bucket : buckets) {
    std::vector<value_ref> args;
    for (node* c : bucket) args.insert(args.end(), c->args().begin(), c->args().end());
    const node_op op = detail::coalesced_op_for(*bucket.front());
    node* merged = g.add(op, std::move(args), bucket.front()->group(), name_of(op));
    g.set_source(merged, bucket.front()->source());  // the first member's call names the bucket
    merged_after[g.position(bucket.back())] = merged;
    int k = 0;
    for (node* c : bucket)
      for (int o = 0; o < c->num_outputs(); ++o) g.replace_all_uses({c, o}, {merged, k++});
    members.insert(members.end(), bucket.begin(), bucket.end());
  }
  // The merged nodes where their runs' last collectives were; readers of a member that ran
  // before that now follow the merged node.
  std::vector<char> gone(n, 0);
  for (node* c : members) gone[g.position(c)] = 1;
  std::vector<node*> preferred;
  preferred.reserve(g.size() - members.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (!gone[i]) preferred.push_back(nodes[i]);
    if (merged_after[i]) preferred.push_back(merged_after[i]);
  }
  g.erase(members);
  detail::restore_topological_order(g, preferred);
}

}  // namespace ccgraph
