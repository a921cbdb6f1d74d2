// ccgraph/schedule/reorder.hpp: the reordering passes. Inductor's three (sink_waits, raise_comms,
// reorder_compute_for_overlap, as torch/_inductor/comms.py defines them) and our own `overlap`
// list scheduler. Each is a small function that reorders a graph in place; none looks at
// rank-local data, and none changes the relative order of collectives, so every rank derives
// the same collective order from the same program.
//
// Host cost (PERF.md: trace + schedule of a 10,000-node graph well under 100 ms, growing close
// to linearly): each pass is O((V + E) log V) (`overlap` also walks, at a step, past the waits
// for the next collective still in flight: few in practice). The comments describe each pass
// as the plain algorithm does it (scan the ready list, build every collective's ancestor set);
// the code gets the same order, tie for tie, from structures built once: each node's first
// dependent collective (detail::first_dependent_collective) instead of per-collective sets,
// walks over unscheduled nodes only, and ordered sets or a tree instead of scans.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <span>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/schedule/timeline.hpp>

namespace ccgraph {
namespace detail {

/// Lists of node positions, one per node, stored flat (two allocations, not one per node):
/// `adj[i]` is node i's list.
struct adjacency {
  std::vector<std::size_t> begin{0};  // list i is at[begin[i], begin[i + 1])
  std::vector<std::size_t> at;
  std::span<const std::size_t> operator[](std::size_t i) const {
    return {at.data() + begin[i], begin[i + 1] - begin[i]};
  }
};

/// Dependency view of a graph by node position, in the order the pass started from (Inductor's
/// tie-break, `tuple_sorted`, is by name, which follows creation order): inputs (each once, in
/// argument order) and users (ascending). The passes rely on that order being topological:
/// every input before its reader.
struct dep_graph {
  const std::vector<node*>& nodes;
  adjacency inputs, users;

  explicit dep_graph(const graph& g) : nodes(g.nodes()) {
    const std::size_t n = nodes.size();
    std::size_t edges = 0;  // at most: a repeated argument counts once
    for (const node* v : nodes) edges += v->args().size();
    inputs.begin.reserve(n + 1);
    inputs.at.reserve(edges);
    std::vector<std::size_t> last_reader(n, n);  // last_reader[j] == i: j is already an input of i
    std::vector<std::size_t> readers(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      for (auto& a : nodes[i]->args()) {
        const std::size_t j = g.position(a.src);
        CCGRAPH_CHECK(j < i, "schedule: %", nodes[i]->name(), " comes before its input %", a.src->name(),
                      " (the graph is not in topological order)");
        if (last_reader[j] != i) {
          last_reader[j] = i;
          inputs.at.push_back(j);
          ++readers[j + 1];
        }
      }
      inputs.begin.push_back(inputs.at.size());
    }
    // Users are the inputs lists turned around (the graph's users lists, which are the distinct
    // readers), filled by increasing reader so each list comes out ascending.
    for (std::size_t j = 0; j < n; ++j) readers[j + 1] += readers[j];
    users.begin = readers;
    users.at.resize(inputs.at.size());
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j : inputs[i]) users.at[readers[j]++] = i;
  }
  std::size_t size() const { return nodes.size(); }
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

/// Each node's estimated run time (0 for graph inputs and the output). The passes add and
/// compare estimates, so an estimate must be a finite number of microseconds, not negative.
inline std::vector<double> node_costs(const dep_graph& d, const runtime_estimator& estimate, const char* pass) {
  std::vector<double> cost(d.size(), 0.0);
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (is_fixed(d.nodes[i])) continue;
    cost[i] = estimate(*d.nodes[i]);
    CCGRAPH_CHECK(std::isfinite(cost[i]) && cost[i] >= 0, pass, ": the run-time estimate of %", d.nodes[i]->name(),
                  " (", d.nodes[i]->op(), ") is ", cost[i], " us; estimates must be finite and not negative");
  }
  return cost;
}

/// For each node, the index in `comms` (the collectives' positions, ascending) of the first
/// collective that depends on it, directly or not; comms.size() when none does. This is what
/// the passes ask of per-collective ancestor sets: Inductor's "earliest collective that needs
/// the node"; and, for a node not yet scheduled while collectives are issued in program order,
/// "is it an ancestor of the next collective" (it cannot be one of an issued collective, whose
/// ancestors are all scheduled, so the answer is first == next). One pass over the users.
inline std::vector<std::size_t> first_dependent_collective(const dep_graph& d,
                                                           const std::vector<std::size_t>& comms) {
  const std::size_t n = d.size();
  std::vector<std::size_t> index(n, comms.size()), first(n, comms.size());
  for (std::size_t c = 0; c < comms.size(); ++c) index[comms[c]] = c;
  for (std::size_t k = n; k-- > 0;)
    for (std::size_t u : d.users[k]) first[k] = std::min({first[k], first[u], index[u]});
  return first;
}

/// A value per slot (+infinity when unset) and the first slot at or after `from` whose value is
/// below a bound, in O(log slots): reorder_compute_for_overlap's walk over its candidates,
/// skipping those too long for the time left.
class first_below_tree {
 public:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  explicit first_below_tree(std::size_t slots) {
    while (leaves_ < slots) leaves_ *= 2;
    min_.assign(2 * leaves_, unset);
  }
  void set(std::size_t slot, double v) {
    std::size_t k = slot + leaves_;
    min_[k] = v;
    for (k /= 2; k >= 1; k /= 2) min_[k] = std::min(min_[2 * k], min_[2 * k + 1]);
  }
  void clear(std::size_t slot) { set(slot, unset); }
  /// The first slot at or after `from` whose value is below `bound`, or npos.
  std::size_t find(std::size_t from, double bound) const { return find(1, 0, leaves_, from, bound); }

 private:
  static constexpr double unset = std::numeric_limits<double>::infinity();

  std::size_t find(std::size_t k, std::size_t lo, std::size_t hi, std::size_t from, double bound) const {
    if (hi <= from || !(min_[k] < bound)) return npos;
    if (hi - lo == 1) return lo;
    const std::size_t mid = lo + (hi - lo) / 2;
    const std::size_t r = find(2 * k, lo, mid, from, bound);
    return r != npos ? r : find(2 * k + 1, mid, hi, from, bound);
  }

  std::size_t leaves_ = 1;
  std::vector<double> min_;
};

}  // namespace detail

/// Moves every wait_tensor as late as possible: just before its first reader (Inductor's
/// sink_waits). Optimal for overlap when nothing else is reordered.
inline void sink_waits(graph& g) {
  detail::dep_graph d(g);
  const std::size_t n = d.size();
  std::vector<std::size_t> order;
  order.reserve(n);
  std::vector<char> pending(n, 0);  // a wait not placed yet
  std::vector<std::size_t> due;
  for (std::size_t i = 0; i < n; ++i) {
    if (d.nodes[i]->is_wait()) {
      pending[i] = 1;
      continue;
    }
    // The pending waits that i reads go just before it, by original position (tuple_sorted).
    due.clear();
    for (std::size_t j : d.inputs[i])
      if (pending[j]) due.push_back(j);
    std::sort(due.begin(), due.end());
    for (std::size_t w : due) {
      pending[w] = 0;
      order.push_back(w);
    }
    order.push_back(i);
  }
  std::vector<std::size_t> waits;  // nobody reads them
  for (std::size_t i = 0; i < n; ++i)
    if (pending[i]) waits.push_back(i);
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
  const std::size_t n = d.size();
  std::vector<std::size_t> reversed;
  reversed.reserve(n);
  std::deque<std::size_t> comms;  // pending, front = latest in program order
  std::vector<char> pending(n, 0);
  for (std::size_t k = n; k-- > 0;) {
    if (d.nodes[k]->is_collective()) {
      comms.push_back(k);
      pending[k] = 1;
      continue;
    }
    // Pending collectives that read k go right after it, with every pending one later in
    // program order (they keep their order): pop down to the earliest reader of k.
    std::size_t earliest = n;
    for (std::size_t u : d.users[k])  // ascending: the first pending one is the earliest
      if (pending[u]) {
        earliest = u;
        break;
      }
    while (earliest < n && !comms.empty() && comms.front() >= earliest) {
      pending[comms.front()] = 0;
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
/// `estimate` gives each node's run time (Inductor's estimate_op_runtime): a finite number of
/// microseconds, not negative.
///
/// Each group of nodes goes in program order (the original order is topological, so that is
/// the order Inductor's repeated sweeps over a group produce).
inline void reorder_compute_for_overlap(graph& g, const runtime_estimator& estimate) {
  detail::dep_graph d(g);
  const std::size_t n = d.size();
  std::vector<std::size_t> comms;
  for (std::size_t i = 0; i < n; ++i)
    if (d.nodes[i]->is_collective()) comms.push_back(i);
  if (comms.empty()) return;
  const std::vector<double> cost = detail::node_costs(d, estimate, "reorder_compute_for_overlap");

  // Step 2 visits ready compute by the first collective that needs it, then program order: a
  // fixed order of all nodes, so a tree over it holding half of each candidate's cost (the
  // skip test) finds the next candidate that fits the time left.
  const std::vector<std::size_t> first = detail::first_dependent_collective(d, comms);
  std::vector<std::size_t> by_need(n), rank(n);
  std::iota(by_need.begin(), by_need.end(), std::size_t{0});
  std::stable_sort(by_need.begin(), by_need.end(),
                   [&](std::size_t a, std::size_t b) { return first[a] < first[b]; });
  for (std::size_t r = 0; r < n; ++r) rank[by_need[r]] = r;
  detail::first_below_tree candidates(n);

  std::vector<std::size_t> order;
  order.reserve(n);
  std::vector<int> indeg(n, 0);
  std::vector<char> scheduled(n, 0);
  bool in_step2 = false;               // step 2 only considers nodes ready when it starts
  std::vector<std::size_t> ready_later;  // nodes that became ready during step 2
  auto make_ready = [&](std::size_t i) {
    if (d.nodes[i]->is_collective()) return;  // never a candidate
    if (in_step2) ready_later.push_back(i);
    else candidates.set(rank[i], cost[i] / 2);
  };
  for (std::size_t i = 0; i < n; ++i) {
    indeg[i] = static_cast<int>(d.inputs[i].size());
    if (indeg[i] == 0) make_ready(i);
  }
  auto schedule_node = [&](std::size_t i) {
    CCGRAPH_CHECK(indeg[i] == 0 && !scheduled[i], "reorder_compute_for_overlap: %", d.nodes[i]->name(),
                  " scheduled before its inputs");
    scheduled[i] = 1;
    candidates.clear(rank[i]);
    order.push_back(i);
    for (std::size_t u : d.users[i])
      if (--indeg[u] == 0) make_ready(u);
  };
  // The unscheduled ancestors of node c, ascending. Every ancestor of a scheduled node is
  // scheduled, so the walk stops at scheduled nodes and costs only what it finds.
  std::vector<std::size_t> visited(n, n);  // visited[k] == c: found by the walk from c
  std::vector<std::size_t> stack;
  auto unscheduled_ancestors = [&](std::size_t c) {
    std::vector<std::size_t> found;
    stack.assign(d.inputs[c].begin(), d.inputs[c].end());
    while (!stack.empty()) {
      const std::size_t k = stack.back();
      stack.pop_back();
      if (scheduled[k] || visited[k] == c) continue;
      visited[k] = c;
      found.push_back(k);
      for (std::size_t j : d.inputs[k])
        if (!scheduled[j] && visited[j] != c) stack.push_back(j);
    }
    std::sort(found.begin(), found.end());
    return found;
  };

  // Graph inputs stay first, as in Inductor (they are not nodes there); then the first
  // collective and what it needs.
  for (std::size_t i = 0; i < n; ++i)
    if (std::holds_alternative<ops::placeholder>(d.nodes[i]->kind())) schedule_node(i);
  for (std::size_t i : unscheduled_ancestors(comms[0])) schedule_node(i);
  schedule_node(comms[0]);

  std::vector<char> after_prev(n, 0);  // in step 1's set: depends on the previous collective
  double rolled_over = 0;
  for (std::size_t idx = 1; idx < comms.size(); ++idx) {
    const std::size_t prev = comms[idx - 1];
    // Step 1: what the next collective needs that does not depend on the previous one. The
    // previous collective is the last node scheduled, so no scheduled node depends on it: a
    // node of the set depends on it when it reads it or a node of the set that does.
    const std::vector<std::size_t> needs = unscheduled_ancestors(comms[idx]);
    for (std::size_t i : needs) {
      after_prev[i] = 0;
      for (std::size_t j : d.inputs[i])
        if (j == prev || (!scheduled[j] && after_prev[j])) after_prev[i] = 1;
    }
    double total = rolled_over;
    for (std::size_t i : needs)
      if (!after_prev[i]) {
        total += cost[i];
        schedule_node(i);
      }
    const double prev_comm = cost[prev];
    // Step 2: more ready compute to cover the previous collective, soonest-needed first. Ready
    // nodes depending on the previous collective read it (nothing scheduled depends on it),
    // so they are held out of the candidates meanwhile.
    const double step1 = total;
    if (step1 < prev_comm) {
      std::vector<std::size_t> held;
      for (std::size_t u : d.users[prev])
        if (indeg[u] == 0 && !scheduled[u] && !d.nodes[u]->is_collective()) {
          candidates.clear(rank[u]);
          held.push_back(u);
        }
      in_step2 = true;
      // Candidates are visited in order, each once: the next one is the first after the last
      // taken whose half cost is below the time left (a node is skipped when the time left is
      // at most half its cost).
      std::size_t from = 0;
      while (!(total >= prev_comm)) {
        const std::size_t r = candidates.find(from, prev_comm - total);
        if (r == detail::first_below_tree::npos) break;
        schedule_node(by_need[r]);
        total += cost[by_need[r]];
        from = r + 1;
      }
      in_step2 = false;
      for (std::size_t u : held) make_ready(u);
      for (std::size_t u : ready_later) make_ready(u);
      ready_later.clear();
    }
    const double rollable = total - step1;
    // Step 3: the rest of what the next collective needs (exactly the nodes of step 1's set
    // that depend on the previous collective), then the collective.
    bool blocking = false;
    for (std::size_t i : needs)
      if (!scheduled[i]) {
        blocking = true;
        schedule_node(i);
      }
    schedule_node(comms[idx]);
    rolled_over = blocking ? 0 : rollable;
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!scheduled[i]) schedule_node(i);
  detail::apply_order(g, d, order);
}

/// Options of our own `overlap` scheduler.
struct overlap_options {
  /// At most this many bytes of collective outputs in flight (issued, not yet waited).
  std::int64_t max_bytes_in_flight = std::numeric_limits<std::int64_t>::max();
  /// Above this many live bytes, prefer nodes that free memory over ones that allocate.
  std::int64_t memory_limit_bytes = std::numeric_limits<std::int64_t>::max();
};

namespace detail {

/// The `overlap` scheduler's priority: the longer path to the end first, then program order;
/// with `frees` (while live memory is above the limit) the node freeing the most bytes first.
struct overlap_priority {
  const std::vector<double>* level;
  const std::vector<std::int64_t>* frees;
  bool operator()(std::size_t a, std::size_t b) const {
    if (frees && (*frees)[a] != (*frees)[b]) return (*frees)[a] > (*frees)[b];
    if ((*level)[a] != (*level)[b]) return (*level)[a] > (*level)[b];
    return a < b;
  }
};

/// Ready nodes of one kind in both of the `overlap` scheduler's orders (the memory order is
/// kept only when a memory limit is set): picking the best is taking the first.
struct ready_set {
  std::set<std::size_t, overlap_priority> by_level, by_frees;
  bool memory_aware;

  ready_set(const std::vector<double>& level, const std::vector<std::int64_t>& frees, bool memory_aware_)
      : by_level(overlap_priority{&level, nullptr}), by_frees(overlap_priority{&level, &frees}),
        memory_aware(memory_aware_) {}
  void insert(std::size_t i) {
    by_level.insert(i);
    if (memory_aware) by_frees.insert(i);
  }
  void erase(std::size_t i) {
    by_level.erase(i);
    if (memory_aware) by_frees.erase(i);
  }
  const std::set<std::size_t, overlap_priority>& in_order(bool by_memory) const {
    return by_memory ? by_frees : by_level;
  }
};

/// A running sum of non-negative numbers with a bound on its distance from their exact sum.
/// The `overlap` scheduler compares the sum of a changing set of costs with a threshold, and
/// its reference algorithm adds the set up in program order each time; a running sum does not
/// reproduce that to the last bit, so below() answers only when the program-order sum is
/// certainly on the same side of the threshold, and the caller adds the set up otherwise.
struct bounded_sum {
  double sum = 0;
  double err = 0;         // |sum - exact sum| <= err
  std::size_t count = 0;  // terms
  std::size_t nonzero = 0;

  void add(double x) {
    ++count;
    nonzero += x != 0;
    sum += x;
    err += std::abs(sum) * rel;
  }
  void remove(double x) {
    --count;
    nonzero -= x != 0;
    if (count == 0) {
      sum = err = 0;
      return;
    }
    sum -= x;
    err += std::abs(sum) * rel;
  }
  /// Restarts from `s`, the program-order sum of the current terms.
  void reset(double s) {
    sum = s;
    err = static_cast<double>(count) * rel * s;
  }
  /// Whether x is below the program-order sum of the terms: true or false when certain, with
  /// `known` set; otherwise `known` is false. A sum of n non-negative terms in any order is
  /// within n * rel * (exact sum) of the exact sum (Higham, Accuracy and Stability, 4.2).
  bool below(double x, bool& known) const {
    const double margin = 2 * (err + static_cast<double>(count) * rel * (sum + err)) + 4 * rel * sum;
    known = x + margin < sum || x > sum + margin;
    return x + margin < sum;
  }

 private:
  static constexpr double rel = 0x1.0p-52;  // twice the unit roundoff
};

}  // namespace detail

/// Our list scheduler. It simulates the two streams while it orders the graph and at each step
/// takes, in this order: the next collective (in program order) once its inputs are ready and
/// the bytes-in-flight cap allows; a wait that costs nothing (its collective has finished) and
/// unblocks the next collective; compute the next collective needs (longest remaining path
/// first); when only a stalling wait blocks the next collective, the wait itself if its stall is
/// smaller than the overlap it buys (the next collective hidden behind the independent compute
/// that remains, added up in program order), else that compute; other compute; and last the
/// wait whose collective ends first. Deterministic: ties go to program order. `estimate` gives
/// each node's run time: a finite number of microseconds, not negative.
///
/// The ready nodes are kept in ordered sets by kind (compute, waits, and those of each the next
/// collective needs), so a step costs O(log V) plus, in the free-wait test, the waits for the
/// next collective still in flight that outrank the first finished one.
inline void overlap(graph& g, const runtime_estimator& estimate, const overlap_options& opt = {}) {
  detail::dep_graph d(g);
  const std::size_t n = d.size();
  const std::vector<double> cost = detail::node_costs(d, estimate, "overlap");
  std::vector<std::int64_t> out_bytes(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (auto& m : d.nodes[i]->metas())
      out_bytes[i] += numel_of(m.shape) * static_cast<std::int64_t>(element_size(m.dtype));
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
  // Collectives go in program order, so an unscheduled node is an ancestor of the next one
  // exactly when that is its first dependent collective.
  const std::vector<std::size_t> first = detail::first_dependent_collective(d, comms);
  std::vector<std::size_t> wait_of_comm(n, n);  // collective position of each wait
  for (std::size_t i = 0; i < n; ++i)
    if (d.nodes[i]->is_wait())
      for (std::size_t j : d.inputs[i])
        if (d.nodes[j]->is_collective()) wait_of_comm[i] = j;

  std::vector<int> indeg(n);
  std::vector<double> done(n, 0);
  std::vector<int> remaining_users(n);
  for (std::size_t i = 0; i < n; ++i) remaining_users[i] = static_cast<int>(d.users[i].size());
  double t_compute = 0, t_comm = 0;
  std::int64_t in_flight = 0, live = 0;
  std::size_t next_comm = 0;
  std::vector<std::size_t> order;
  order.reserve(n);
  const std::size_t output = n - 1;

  // Live memory above the limit switches to the memory order; live never exceeds the largest
  // int64, so without a limit only the level order is kept.
  const bool memory_aware = opt.memory_limit_bytes < std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> frees(n, 0);  // of ready nodes: bytes freed by running it, less its own
  auto compute_frees = [&](std::size_t i) {
    std::int64_t f = 0;
    for (std::size_t j : d.inputs[i])
      if (remaining_users[j] == 1) f += out_bytes[j];
    return f - out_bytes[i];
  };
  // Ready nodes by kind: compute (everything but collectives, waits and the output) and waits,
  // all of them and those the next collective needs (`for_next`); those a later collective
  // needs first wait in `needed_by` until it is next. The independent compute (ready, not
  // needed by the next collective) is also kept as a sum.
  detail::ready_set compute(level, frees, memory_aware), waits(level, frees, memory_aware),
      compute_next(level, frees, memory_aware), waits_next(level, frees, memory_aware);
  std::vector<char> ready(n, 0), for_next(n, 0), scheduled(n, 0);
  std::vector<std::vector<std::size_t>> needed_by(comms.size());
  detail::bounded_sum independent;
  auto is_compute = [&](std::size_t i) { return !d.nodes[i]->is_collective() && !d.nodes[i]->is_wait(); };
  auto add_for_next = [&](std::size_t i) {
    for_next[i] = 1;
    (is_compute(i) ? compute_next : waits_next).insert(i);
  };
  auto make_ready = [&](std::size_t i) {
    ready[i] = 1;
    if (i == output || d.nodes[i]->is_collective()) return;
    if (memory_aware) frees[i] = compute_frees(i);
    (is_compute(i) ? compute : waits).insert(i);
    if (first[i] == next_comm && next_comm < comms.size()) {
      add_for_next(i);
      return;
    }
    if (first[i] < comms.size()) needed_by[first[i]].push_back(i);
    if (is_compute(i)) independent.add(cost[i]);
  };
  auto leave_ready = [&](std::size_t i) {
    ready[i] = 0;
    if (i == output || d.nodes[i]->is_collective()) return;
    (is_compute(i) ? compute : waits).erase(i);
    if (for_next[i]) (is_compute(i) ? compute_next : waits_next).erase(i);
    else if (is_compute(i)) independent.remove(cost[i]);
    for_next[i] = 0;
  };
  // The program-order sum of the independent compute's costs, as the reference computes it.
  auto independent_in_order = [&] {
    std::vector<std::size_t> terms;
    for (std::size_t i : compute.by_level)
      if (!for_next[i]) terms.push_back(i);
    std::sort(terms.begin(), terms.end());
    double s = 0;
    for (std::size_t i : terms) s += cost[i];
    independent.reset(s);
    return s;
  };
  for (std::size_t i = 0; i < n; ++i) {
    indeg[i] = static_cast<int>(d.inputs[i].size());
    if (indeg[i] == 0) make_ready(i);
  }

  auto finish = [&](std::size_t i) {
    leave_ready(i);
    scheduled[i] = 1;
    order.push_back(i);
    double start = t_compute;
    for (std::size_t j : d.inputs[i]) start = std::max(start, done[j]);
    if (d.nodes[i]->is_collective()) {
      start = std::max(start, t_comm);
      done[i] = start + cost[i];
      t_comm = done[i];
      in_flight += out_bytes[i];
      // The next collective's unscheduled ancestors were all scheduled before it was ready, so
      // the `for_next` sets are empty; the ready nodes the new next one needs join them.
      ++next_comm;
      if (next_comm < comms.size()) {
        for (std::size_t u : needed_by[next_comm])
          if (ready[u]) {
            if (is_compute(u)) independent.remove(cost[u]);
            add_for_next(u);
          }
        needed_by[next_comm] = {};
      }
    } else {
      done[i] = start + cost[i];
      t_compute = done[i];
      if (wait_of_comm[i] < n) in_flight -= out_bytes[wait_of_comm[i]];
    }
    live += out_bytes[i];
    for (std::size_t j : d.inputs[i]) {
      if (--remaining_users[j] == 0) {
        live -= out_bytes[j];
      } else if (memory_aware && remaining_users[j] == 1) {
        // j's last reader now frees it: move that reader in the memory order if it is ready.
        for (std::size_t u : d.users[j])
          if (!scheduled[u]) {
            if (ready[u] && u != output && !d.nodes[u]->is_collective()) {
              detail::ready_set& kind = is_compute(u) ? compute : waits;
              detail::ready_set& next = is_compute(u) ? compute_next : waits_next;
              kind.by_frees.erase(u);
              if (for_next[u]) next.by_frees.erase(u);
              frees[u] += out_bytes[j];
              kind.by_frees.insert(u);
              if (for_next[u]) next.by_frees.insert(u);
            }
            break;
          }
      }
    }
    for (std::size_t u : d.users[i])
      if (--indeg[u] == 0) make_ready(u);
  };

  for (std::size_t i = 0; i < n; ++i)  // graph inputs stay first
    if (std::holds_alternative<ops::placeholder>(d.nodes[i]->kind())) finish(i);
  while (order.size() < n) {
    std::size_t choice = n;
    const bool have_next = next_comm < comms.size();
    const std::size_t nc = have_next ? comms[next_comm] : n;
    const bool by_memory = live > opt.memory_limit_bytes;
    auto best = [&](const detail::ready_set& s) { return s.by_level.empty() ? n : *s.in_order(by_memory).begin(); };
    auto finished_at = [&](std::size_t w) { return done[wait_of_comm[w] < n ? wait_of_comm[w] : w]; };
    // 1. The next collective, as soon as it can go.
    if (have_next && ready[nc] && (in_flight == 0 || in_flight + out_bytes[nc] <= opt.max_bytes_in_flight))
      choice = nc;
    // 2. A free wait that the next collective needs.
    if (choice == n && have_next)
      for (std::size_t w : waits_next.in_order(by_memory))
        if (finished_at(w) <= t_compute) {
          choice = w;
          break;
        }
    // 3. Compute the next collective needs.
    if (choice == n && have_next) choice = best(compute_next);
    // 4. Only a stalling wait blocks the next collective: take it if the stall buys more overlap.
    if (choice == n && have_next) {
      const std::size_t w = best(waits_next);
      if (w != n) {
        const double stall = std::max(0.0, finished_at(w) - t_compute);
        // The reference: gain = min(independent, cost[nc]); take w if stall < gain or
        // independent == 0 (a sum of non-negative costs is 0 only when every one is).
        bool take = independent.nonzero == 0;
        if (!take && stall < cost[nc]) {
          bool known = false;
          take = independent.below(stall, known);
          if (!known) take = stall < independent_in_order();
        }
        if (take) choice = w;
      }
    }
    // 5. Other compute.
    if (choice == n) choice = best(compute);
    // 6. The wait whose collective ends first (in issue order on one stream).
    if (choice == n) choice = best(waits);
    // 7. Anything else ready: with no compute or wait ready, a collective held back by the
    // in-flight cap, then the output.
    if (choice == n && have_next && ready[nc]) choice = nc;
    if (choice == n && ready[output]) choice = output;
    CCGRAPH_CHECK(choice != n, "overlap: no schedulable node (the graph has a cycle)");
    finish(choice);
  }
  detail::apply_order(g, d, order);
}

}  // namespace ccgraph
