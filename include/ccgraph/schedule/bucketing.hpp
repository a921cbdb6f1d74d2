// ccgraph/schedule/bucketing.hpp: bucket_collectives, which merges runs of adjacent collectives
// of one kind (same group, reduce op and dtype) into one coalesced collective under a byte cap,
// as DDP/FSDP gradient bucketing and Inductor's bucketing passes do. It never merges across a
// dependency and never changes the relative order of collectives, and it decides from shapes,
// dtypes and groups only, so every rank derives the same buckets from the same program.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/ir/graph.hpp>

namespace ccgraph {
namespace detail {

/// The coalesced family a collective merges into: 0 all_reduce, 1 all_gather_into_tensor,
/// 2 reduce_scatter_tensor (each with its coalesced form); -1 for collectives that never merge.
inline int bucket_family(const ops::collective_op& c) {
  return std::visit(
      [](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, ops::all_reduce> || std::is_same_v<O, ops::all_reduce_coalesced>)
          return 0;
        else if constexpr (std::is_same_v<O, ops::all_gather_into_tensor> ||
                           std::is_same_v<O, ops::all_gather_into_tensor_coalesced>)
          return 1;
        else if constexpr (std::is_same_v<O, ops::reduce_scatter_tensor> ||
                           std::is_same_v<O, ops::reduce_scatter_tensor_coalesced>)
          return 2;
        else
          return -1;
      },
      c);
}

/// The reduce op of a reducing collective (all_reduce, reduce_scatter and their coalesced forms).
inline std::optional<reduce_op> reduce_op_of(const ops::collective_op& c) {
  return std::visit(
      [](const auto& o) -> std::optional<reduce_op> {
        if constexpr (requires { o.op; }) return o.op;
        else return std::nullopt;
      },
      c);
}

/// Bytes a node reads through its arguments.
inline std::int64_t input_bytes(const node& n) {
  std::int64_t b = 0;
  for (auto& a : n.args()) {
    const tensor_meta& m = a.src->meta(a.index);
    b += numel_of(m.shape) * static_cast<std::int64_t>(element_size(m.dtype));
  }
  return b;
}

/// The one dtype of a collective's inputs, or nullopt when they mix dtypes (never bucketed).
inline std::optional<dtype> input_dtype(const node& n) {
  if (n.args().empty()) return std::nullopt;
  const dtype d = n.args().front().src->dtype(n.args().front().index);
  for (auto& a : n.args())
    if (a.src->dtype(a.index) != d) return std::nullopt;
  return d;
}

/// True when collectives `a` and `b` may share one coalesced launch: same family, group (ranks
/// and tag), reduce op and dtype.
inline bool bucket_compatible(const node& a, const node& b) {
  const auto ca = *a.collective(), cb = *b.collective();
  const int fa = bucket_family(ca);
  return fa >= 0 && fa == bucket_family(cb) && *a.group() == *b.group() &&
         reduce_op_of(ca) == reduce_op_of(cb) && input_dtype(a) && input_dtype(a) == input_dtype(b);
}

/// The coalesced collective a bucket led by `first` becomes.
inline node_op coalesced_op_for(const node& first) {
  const auto c = *first.collective();
  const int n = first.group()->size();
  switch (bucket_family(c)) {
    case 0: return ops::all_reduce_coalesced{*reduce_op_of(c)};
    case 1: return ops::all_gather_into_tensor_coalesced{n};
    default: return ops::reduce_scatter_tensor_coalesced{*reduce_op_of(c), n};
  }
}

/// Reorders `g` into a topological order that changes the current one as little as possible:
/// among the nodes whose inputs are placed, the earliest in the current order goes first. A
/// graph already in topological order is left as it is. Used after a pass put a node after
/// some of its readers.
inline void restore_topological_order(graph& g) {
  const std::vector<node*>& nodes = g.nodes();
  const std::size_t n = nodes.size();
  bool sorted = true;
  std::vector<int> indeg(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<const node*> seen;
    for (auto& a : nodes[i]->args()) {
      if (std::find(seen.begin(), seen.end(), a.src) != seen.end()) continue;
      seen.push_back(a.src);
      ++indeg[i];
      sorted = sorted && g.position(a.src) < i;
    }
  }
  if (sorted) return;
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) ready.push(i);
  std::vector<node*> order;
  order.reserve(n);
  while (!ready.empty()) {
    const std::size_t i = ready.top();
    ready.pop();
    order.push_back(nodes[i]);
    for (node* u : nodes[i]->users())
      if (--indeg[g.position(u)] == 0) ready.push(g.position(u));
  }
  CCGRAPH_CHECK(order.size() == n, "restore_topological_order: the graph has a cycle");
  g.reorder(order);
}

}  // namespace detail

/// Merges runs of adjacent collectives into coalesced ones (Inductor's and DDP's bucketing).
/// Looking at collectives only, in program order, a run of all_reduce (or all_gather_into_tensor,
/// or reduce_scatter_tensor) nodes, or their coalesced forms, with the same group, reduce op
/// and dtype becomes one all_reduce_coalesced (all_gather_into_tensor_coalesced,
/// reduce_scatter_tensor_coalesced) node, as long as their inputs total at most `cap_bytes` and
/// no member depends, even through other nodes, on another member's result. A collective of
/// another kind, or one larger than the cap, ends the run and stays as it is; a run of one is
/// left as it is. The merged node takes the place of the run's last collective (where every
/// member's inputs exist), so collectives keep their relative order; each original output is
/// read through its own output of the merged node (one wait each, as before), and readers that
/// came before the merged node move just after it.
inline void bucket_collectives(graph& g, std::int64_t cap_bytes) {
  const std::vector<node*> nodes = g.nodes();
  const std::size_t n = nodes.size();

  // One scan: `tainted` marks what depends on the open bucket's members, so a collective that
  // reads a tainted node would merge across a dependency.
  std::vector<std::vector<node*>> buckets;
  std::vector<node*> open;
  std::int64_t open_bytes = 0;
  std::vector<char> tainted(n, 0);
  std::vector<std::size_t> tainted_list;
  auto taint = [&](std::size_t i) {
    tainted[i] = 1;
    tainted_list.push_back(i);
  };
  auto close = [&] {
    if (open.size() >= 2) buckets.push_back(open);
    open.clear();
    open_bytes = 0;
    for (std::size_t i : tainted_list) tainted[i] = 0;
    tainted_list.clear();
  };
  for (std::size_t i = 0; i < n; ++i) {
    node* v = nodes[i];
    bool depends = false;
    // (g itself changes only after the scan, when the buckets merge)
    for (auto& a : v->args()) depends = depends || tainted[g.position(a.src)];
    if (!v->is_collective()) {
      if (depends) taint(i);
      continue;
    }
    const std::int64_t bytes = detail::input_bytes(*v);
    if (!open.empty() && !depends && detail::bucket_compatible(*open.front(), *v) &&
        open_bytes + bytes <= cap_bytes) {
      open.push_back(v);
      open_bytes += bytes;
      taint(i);
      continue;
    }
    close();
    if (detail::bucket_family(*v->collective()) >= 0 && detail::input_dtype(*v) && bytes <= cap_bytes) {
      open.push_back(v);
      open_bytes = bytes;
      taint(i);
    }
  }
  close();
  if (buckets.empty()) return;

  for (const auto& bucket : buckets) {
    std::vector<value_ref> args;
    for (node* c : bucket) args.insert(args.end(), c->args().begin(), c->args().end());
    const node_op op = detail::coalesced_op_for(*bucket.front());
    node* merged = g.insert_after(bucket.back(), op, std::move(args), bucket.front()->group(), name_of(op));
    int k = 0;
    for (node* c : bucket)
      for (int o = 0; o < c->num_outputs(); ++o) g.replace_all_uses({c, o}, {merged, k++});
    for (node* c : bucket) g.erase(c);
  }
  // Readers of a member that ran before the run's last collective now follow the merged node.
  detail::restore_topological_order(g);
}

}  // namespace ccgraph
