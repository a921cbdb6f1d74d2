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

#include <ccgraph/core/config.hpp>
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
CCGRAPH_DECL void apply_order(graph& g, const dep_graph& d, const std::vector<std::size_t>& order);

CCGRAPH_DECL bool is_fixed(const node* n);

/// Each node's estimated run time (0 for graph inputs and the output). The passes add and
/// compare estimates, so an estimate must be a finite number of microseconds, not negative.
CCGRAPH_DECL std::vector<double> node_costs(const dep_graph& d, const runtime_estimator& estimate, const char* pass);

/// For each node, the index in `comms` (the collectives' positions, ascending) of the first
/// collective that depends on it, directly or not; comms.size() when none does. This is what
/// the passes ask of per-collective ancestor sets: Inductor's "earliest collective that needs
/// the node"; and, for a node not yet scheduled while collectives are issued in program order,
/// "is it an ancestor of the next collective" (it cannot be one of an issued collective, whose
/// ancestors are all scheduled, so the answer is first == next). One pass over the users.
CCGRAPH_DECL std::vector<std::size_t> first_dependent_collective(const dep_graph& d,
                                                           const std::vector<std::size_t>& comms);

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
CCGRAPH_DECL void sink_waits(graph& g);

/// Moves every collective as early as possible: just after the last node it reads (Inductor's
/// raise_comms). Collectives keep their relative order.
CCGRAPH_DECL void raise_comms(graph& g);

/// Inductor's reorder_compute_for_overlap: for each collective in order, first the compute the
/// next collective needs that does not depend on this one; then, while this collective is not
/// yet covered by the estimated compute, other ready compute that does not depend on it, the
/// nodes needed by the earliest collective first (skipping a node when less than half of it
/// would overlap); then the rest of the next collective's inputs and the next collective.
/// `estimate` gives each node's run time (Inductor's estimate_op_runtime): a finite number of
/// microseconds, not negative.
///
/// Each group of nodes goes in program order (the original order is topological, so that is
/// the order Inductor's repeated sweeps over a group produce). Finally every wait moves just
/// before its first reader (sink_waits): the walk may take a wait as a free filler, and a wait
/// placed before compute that does not read it would hold that compute back.
CCGRAPH_DECL void reorder_compute_for_overlap(graph& g, const runtime_estimator& estimate);

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
CCGRAPH_DECL void overlap(graph& g, const runtime_estimator& estimate, const overlap_options& opt = {});

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/reorder.ipp>
#endif
