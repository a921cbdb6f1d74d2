// ccgraph/schedule/reorder.hpp: the reordering passes. Inductor's three (sink_waits, raise_comms,
// reorder_compute_for_overlap, as torch/_inductor/comms.py defines them) and our own `overlap`
// list scheduler. Each is a small function that reorders a graph in place; none looks at
// rank-local data, and none changes the relative order of collectives, so every rank derives
// the same collective order from the same program.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <set>
#include <unordered_map>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/schedule/timeline.hpp>

namespace ccgraph {
namespace detail {

/// Dependency view of a graph by node position: inputs, users, and each node's position in
/// the order the pass started from (Inductor's tie-break, `tuple_sorted`, is by name, which
/// follows creation order).
struct dep_graph {
  const std::vector<node*>& nodes;
  std::unordered_map<const node*, std::size_t> pos;
  std::vector<std::vector<std::size_t>> inputs, users;

  explicit dep_graph(const graph& g) : nodes(g.nodes()) {
    const std::size_t n = nodes.size();
    for (std::size_t i = 0; i < n; ++i) pos[nodes[i]] = i;
    inputs.resize(n);
    users.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      for (auto& a : nodes[i]->args()) {
        const std::size_t j = pos.at(a.src);
        if (std::find(inputs[i].begin(), inputs[i].end(), j) == inputs[i].end()) inputs[i].push_back(j);
      }
      for (node* u : nodes[i]->users()) users[i].push_back(pos.at(u));
      std::sort(users[i].begin(), users[i].end());
    }
  }
  std::size_t size() const { return nodes.size(); }
  /// Every node `i` depends on, transitively (bit per position).
  std::vector<bool> ancestors(std::size_t i) const { return closure(i, inputs); }
  /// Every node that depends on `i`, transitively.
  std::vector<bool> descendants(std::size_t i) const { return closure(i, users); }

 private:
  std::vector<bool> closure(std::size_t start, const std::vector<std::vector<std::size_t>>& edges) const {
    std::vector<bool> seen(size(), false);
    std::vector<std::size_t> stack(edges[start].begin(), edges[start].end());
    while (!stack.empty()) {
      const std::size_t k = stack.back();
      stack.pop_back();
      if (seen[k]) continue;
      seen[k] = true;
      stack.insert(stack.end(), edges[k].begin(), edges[k].end());
    }
    return seen;
  }
};

/// Applies a pass's order. The output node reads only and nothing reads it, so it always goes
/// last (a pass may otherwise schedule it before a dead node or an unread wait).
inline void apply_order(graph& g, const dep_graph& d, const std::vector<std::size_t>& order) {
  std::vector<node*> nodes;
  nodes.reserve(order.size());
  for (std::size_t i : order) nodes.push_back(d.nodes[i]);
  std::stable_partition(nodes.begin(), nodes.end(),
                        [](const node* n) { return !std::holds_alternative<ops::output>(n->kind()); });
  g.reorder(nodes);
}

inline bool is_fixed(const node* n) {
  return std::holds_alternative<ops::placeholder>(n->kind()) || std::holds_alternative<ops::output>(n->kind());
}

}  // namespace detail

/// Moves every wait_tensor as late as possible: just before its first reader (Inductor's
/// sink_waits). Optimal for overlap when nothing else is reordered.
inline void sink_waits(graph& g) {
  detail::dep_graph d(g);
  std::vector<std::size_t> order;
  std::set<std::size_t> waits;  // ordered by original position, like tuple_sorted
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (d.nodes[i]->is_wait()) {
      waits.insert(i);
      continue;
    }
    for (auto it = waits.begin(); it != waits.end();) {
      if (std::binary_search(d.users[*it].begin(), d.users[*it].end(), i)) {
        order.push_back(*it);
        it = waits.erase(it);
      } else {
        ++it;
      }
    }
    order.push_back(i);
  }
  // Waits nobody reads stay before the output node.
  if (!waits.empty() && !order.empty() && detail::is_fixed(d.nodes[order.back()]) &&
      std::holds_alternative<ops::output>(d.nodes[order.back()]->kind())) {
    const std::size_t out = order.back();
    order.pop_back();
    order.insert(order.end(), waits.begin(), waits.end());
    order.push_back(out);
  } else {
    order.insert(order.end(), waits.begin(), waits.end());
  }
  detail::apply_order(g, d, order);
}

/// Moves every collective as early as possible: just after the last node it reads (Inductor's
/// raise_comms). Collectives keep their relative order.
inline void raise_comms(graph& g) {
  detail::dep_graph d(g);
  std::vector<std::size_t> reversed;
  std::deque<std::size_t> comms;  // pending, front = latest in program order
  for (std::size_t k = d.size(); k-- > 0;) {
    if (d.nodes[k]->is_collective()) {
      comms.push_back(k);
      continue;
    }
    auto needs = [&](std::size_t c) {
      return std::find(d.inputs[c].begin(), d.inputs[c].end(), k) != d.inputs[c].end();
    };
    while (!comms.empty() && std::any_of(comms.begin(), comms.end(), needs)) {
      reversed.push_back(comms.front());
      comms.pop_front();
    }
    reversed.push_back(k);
  }
  // Collectives with no inputs left (none read a node) go first.
  for (std::size_t c : comms) reversed.push_back(c);
  std::vector<std::size_t> order(reversed.rbegin(), reversed.rend());
  // Placeholders stay first.
  std::stable_partition(order.begin(), order.end(), [&](std::size_t i) {
    return std::holds_alternative<ops::placeholder>(d.nodes[i]->kind());
  });
  detail::apply_order(g, d, order);
}

/// Inductor's reorder_compute_for_overlap: for each collective in order, first the compute the
/// next collective needs that does not depend on this one; then, while this collective is not
/// yet covered by the estimated compute, other ready compute that does not depend on it, the
/// nodes needed by the earliest collective first (skipping a node when less than half of it
/// would overlap); then the rest of the next collective's inputs and the next collective.
/// `estimate` gives each node's run time (Inductor's estimate_op_runtime).
inline void reorder_compute_for_overlap(graph& g, const runtime_estimator& estimate) {
  detail::dep_graph d(g);
  const std::size_t n = d.size();
  std::vector<std::size_t> comms;
  for (std::size_t i = 0; i < n; ++i)
    if (d.nodes[i]->is_collective()) comms.push_back(i);
  if (comms.empty()) return;
  std::vector<std::vector<bool>> anc, desc;
  for (std::size_t c : comms) {
    anc.push_back(d.ancestors(c));
    desc.push_back(d.descendants(c));
  }
  std::vector<double> cost(n);
  for (std::size_t i = 0; i < n; ++i) cost[i] = detail::is_fixed(d.nodes[i]) ? 0.0 : estimate(*d.nodes[i]);

  std::vector<std::size_t> order;
  std::vector<int> indeg(n, 0);
  for (std::size_t i = 0; i < n; ++i) indeg[i] = static_cast<int>(d.inputs[i].size());
  std::set<std::size_t> ready, unscheduled;
  for (std::size_t i = 0; i < n; ++i) {
    unscheduled.insert(i);
    if (indeg[i] == 0) ready.insert(i);
  }
  auto schedule_node = [&](std::size_t i) {
    ready.erase(i);
    unscheduled.erase(i);
    order.push_back(i);
    for (std::size_t u : d.users[i])
      if (--indeg[u] == 0) ready.insert(u);
  };
  auto schedule_nodes = [&](std::set<std::size_t> todo) {
    while (!todo.empty()) {
      bool progress = false;
      for (auto it = todo.begin(); it != todo.end();) {
        if (ready.count(*it)) {
          schedule_node(*it);
          it = todo.erase(it);
          progress = true;
        } else {
          ++it;
        }
      }
      CCGRAPH_CHECK(progress, "reorder_compute_for_overlap: no schedulable node (the graph has a cycle)");
    }
  };
  auto members = [&](const std::vector<bool>& bits, const std::vector<bool>* minus) {
    std::set<std::size_t> s;
    for (std::size_t i : unscheduled)
      if (bits[i] && !(minus && (*minus)[i])) s.insert(i);
    return s;
  };

  {
    std::set<std::size_t> inputs;  // graph inputs stay first, as in Inductor (they are not nodes there)
    for (std::size_t i = 0; i < n; ++i)
      if (std::holds_alternative<ops::placeholder>(d.nodes[i]->kind())) inputs.insert(i);
    schedule_nodes(inputs);
    auto first = members(anc[0], nullptr);
    first.insert(comms[0]);
    schedule_nodes(first);
  }
  double rolled_over = 0;
  for (std::size_t idx = 1; idx < comms.size(); ++idx) {
    // Step 1: what the next collective needs that does not depend on the previous one.
    auto needed = members(anc[idx], &desc[idx - 1]);
    double total = rolled_over;
    for (std::size_t i : needed) total += cost[i];
    const double prev_comm = cost[comms[idx - 1]];
    schedule_nodes(needed);
    // Step 2: more ready compute to cover the previous collective, soonest-needed first.
    const double step1 = total;
    if (step1 < prev_comm) {
      std::vector<std::size_t> candidates;
      for (std::size_t i : ready)
        if (!desc[idx - 1][i] && !d.nodes[i]->is_collective()) candidates.push_back(i);
      auto earliest_comm = [&](std::size_t i) {
        for (std::size_t c = 0; c < comms.size(); ++c)
          if (anc[c][i]) return c;
        return comms.size();
      };
      std::stable_sort(candidates.begin(), candidates.end(),
                       [&](std::size_t a, std::size_t b) { return earliest_comm(a) < earliest_comm(b); });
      for (std::size_t i : candidates) {
        if (total >= prev_comm) break;
        if (prev_comm - total <= cost[i] / 2) continue;
        if (!ready.count(i)) continue;
        schedule_node(i);
        total += cost[i];
      }
    }
    const double rollable = total - step1;
    // Step 3: the rest of what the next collective needs, then the collective.
    auto rest = members(anc[idx], nullptr);
    const bool blocking = !rest.empty();
    schedule_nodes(rest);
    schedule_nodes({comms[idx]});
    rolled_over = blocking ? 0 : rollable;
  }
  schedule_nodes(unscheduled);
  detail::apply_order(g, d, order);
}

/// Options of our own `overlap` scheduler.
struct overlap_options {
  /// At most this many bytes of collective outputs in flight (issued, not yet waited).
  std::int64_t max_bytes_in_flight = std::numeric_limits<std::int64_t>::max();
  /// Above this many live bytes, prefer nodes that free memory over ones that allocate.
  std::int64_t memory_limit_bytes = std::numeric_limits<std::int64_t>::max();
};

/// Our list scheduler. It simulates the two streams while it orders the graph and at each step
/// takes, in this order: the next collective (in program order) once its inputs are ready and
/// the bytes-in-flight cap allows; a wait that costs nothing (its collective has finished) and
/// unblocks the next collective; compute the next collective needs (longest remaining path
/// first); when only a stalling wait blocks the next collective, the wait itself if its stall is
/// smaller than the overlap it buys (the next collective hidden behind the independent compute
/// that remains), else that compute; other compute; and last the wait whose collective ends
/// first. Deterministic: ties go to program order.
inline void overlap(graph& g, const runtime_estimator& estimate, const overlap_options& opt = {}) {
  detail::dep_graph d(g);
  const std::size_t n = d.size();
  std::vector<double> cost(n);
  std::vector<std::int64_t> out_bytes(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    cost[i] = detail::is_fixed(d.nodes[i]) ? 0.0 : estimate(*d.nodes[i]);
    for (auto& m : d.nodes[i]->metas())
      out_bytes[i] += numel_of(m.shape) * static_cast<std::int64_t>(element_size(m.dtype));
  }
  // Longest path (by cost) from each node to the end: the classic list-scheduling priority.
  std::vector<double> level(n, 0);
  for (std::size_t k = n; k-- > 0;) {
    double best = 0;
    for (std::size_t u : d.users[k]) best = std::max(best, level[u]);
    level[k] = cost[k] + best;
  }
  std::vector<std::size_t> comms;
  for (std::size_t i = 0; i < n; ++i)
    if (d.nodes[i]->is_collective()) comms.push_back(i);
  std::vector<std::vector<bool>> comm_anc;
  for (std::size_t c : comms) comm_anc.push_back(d.ancestors(c));
  std::vector<std::size_t> wait_of_comm(n, n);  // collective position of each wait
  for (std::size_t i = 0; i < n; ++i)
    if (d.nodes[i]->is_wait())
      for (std::size_t j : d.inputs[i])
        if (d.nodes[j]->is_collective()) wait_of_comm[i] = j;

  std::vector<int> indeg(n);
  std::set<std::size_t> ready;
  for (std::size_t i = 0; i < n; ++i) {
    indeg[i] = static_cast<int>(d.inputs[i].size());
    if (indeg[i] == 0) ready.insert(i);
  }
  std::vector<double> done(n, 0);
  std::vector<int> remaining_users(n);
  for (std::size_t i = 0; i < n; ++i) remaining_users[i] = static_cast<int>(d.users[i].size());
  double t_compute = 0, t_comm = 0;
  std::int64_t in_flight = 0, live = 0;
  std::size_t next_comm = 0;
  std::vector<std::size_t> order;
  const std::size_t output = n - 1;

  auto finish = [&](std::size_t i) {
    ready.erase(i);
    order.push_back(i);
    double start = t_compute;
    for (std::size_t j : d.inputs[i]) start = std::max(start, done[j]);
    if (d.nodes[i]->is_collective()) {
      start = std::max(start, t_comm);
      done[i] = start + cost[i];
      t_comm = done[i];
      in_flight += out_bytes[i];
      ++next_comm;
    } else {
      done[i] = start + cost[i];
      t_compute = done[i];
      if (wait_of_comm[i] < n) in_flight -= out_bytes[wait_of_comm[i]];
    }
    live += out_bytes[i];
    for (std::size_t j : d.inputs[i])
      if (--remaining_users[j] == 0) live -= out_bytes[j];
    for (std::size_t u : d.users[i])
      if (--indeg[u] == 0) ready.insert(u);
  };
  auto frees = [&](std::size_t i) {
    std::int64_t f = 0;
    for (std::size_t j : d.inputs[i])
      if (remaining_users[j] == 1) f += out_bytes[j];
    return f - out_bytes[i];
  };
  auto better = [&](std::size_t a, std::size_t b) {  // higher priority first
    if (live > opt.memory_limit_bytes && frees(a) != frees(b)) return frees(a) > frees(b);
    if (level[a] != level[b]) return level[a] > level[b];
    return a < b;
  };
  auto pick = [&](auto pred) {
    std::size_t best = n;
    for (std::size_t i : ready)
      if (i != output && pred(i) && (best == n || better(i, best))) best = i;
    return best;
  };
  auto is_compute = [&](std::size_t i) { return !d.nodes[i]->is_collective() && !d.nodes[i]->is_wait(); };

  for (std::size_t i = 0; i < n; ++i)  // graph inputs stay first
    if (std::holds_alternative<ops::placeholder>(d.nodes[i]->kind())) finish(i);
  while (order.size() < n) {
    std::size_t choice = n;
    const bool have_next = next_comm < comms.size();
    const std::size_t nc = have_next ? comms[next_comm] : n;
    // 1. The next collective, as soon as it can go.
    if (have_next && ready.count(nc) && (in_flight == 0 || in_flight + out_bytes[nc] <= opt.max_bytes_in_flight))
      choice = nc;
    // 2. A free wait that the next collective needs.
    if (choice == n && have_next)
      choice = pick([&](std::size_t i) {
        return d.nodes[i]->is_wait() && comm_anc[next_comm][i] && done[wait_of_comm[i] < n ? wait_of_comm[i] : i] <= t_compute;
      });
    // 3. Compute the next collective needs.
    if (choice == n && have_next)
      choice = pick([&](std::size_t i) { return is_compute(i) && comm_anc[next_comm][i]; });
    // 4. Only a stalling wait blocks the next collective: take it if the stall buys more overlap.
    if (choice == n && have_next) {
      const std::size_t w = pick([&](std::size_t i) { return d.nodes[i]->is_wait() && comm_anc[next_comm][i]; });
      if (w != n) {
        const double stall = std::max(0.0, done[wait_of_comm[w] < n ? wait_of_comm[w] : w] - t_compute);
        double independent = 0;
        for (std::size_t i : ready)
          if (is_compute(i) && !comm_anc[next_comm][i]) independent += cost[i];
        const double gain = std::min(independent, cost[nc]);
        if (stall < gain || independent == 0) choice = w;
      }
    }
    // 5. Other compute.
    if (choice == n) choice = pick(is_compute);
    // 6. The wait whose collective ends first (in issue order on one stream).
    if (choice == n)
      choice = pick([&](std::size_t i) { return d.nodes[i]->is_wait(); });
    // 7. Anything else ready (a collective held back by the in-flight cap, the output).
    if (choice == n) {
      for (std::size_t i : ready)
        if (i != output && (!d.nodes[i]->is_collective() || i == nc)) {
          choice = i;
          break;
        }
    }
    if (choice == n && ready.count(output)) choice = output;
    CCGRAPH_CHECK(choice != n, "overlap: no schedulable node (the graph has a cycle)");
    finish(choice);
  }
  detail::apply_order(g, d, order);
}

}  // namespace ccgraph
