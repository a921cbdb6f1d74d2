// ccgraph/schedule/recompute.hpp: recompute_pointwise, the pass that trades a little compute for
// memory the way PyTorch's min-cut partitioner does for cheap pointwise ops: a pointwise node
// whose value is read early and again much later (an activation its gradient rule reads in the
// backward) is computed a second time right before its late readers, from inputs that are alive
// there anyway, so its own buffer is free in between. It is done only where the memory
// planner's live peak (schedule/memory_plan.hpp) goes down, within a budget of estimated time.
//
// What may be recomputed, read from the op traits: a node of category pointwise (pure: one
// output written into a fresh buffer) that draws no random numbers (a dropout would draw
// another mask). Collectives, waits, views and every other op are never copied. Recomputing a
// pointwise node runs the same kernel on the same inputs, so the results are the same bits.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ir/node_op.hpp>
#include <ccgraph/schedule/memory_plan.hpp>
#include <ccgraph/schedule/rewrite.hpp>
#include <ccgraph/schedule/timeline.hpp>

namespace ccgraph {

/// Options of the recompute_pointwise pass.
struct recompute_options {
  /// The most estimated time the recomputed nodes may add, as a fraction of the estimated time
  /// of the graph's nodes (collectives excluded: they run on the other stream). 0 recomputes
  /// nothing (a node read only late is still moved next to its readers: that adds no work).
  double max_added_time = 0.1;
  /// How memory is measured: the planner's alignment (and steals) give the live peak.
  memory_plan_options memory{};
};

namespace detail {

/// Positions with a value each: add a number over a range, find the largest value and its
/// first position. O(log n) each (a segment tree with lazy additions).
class range_max_tree {
 public:
  explicit range_max_tree(const std::vector<std::int64_t>& v) : n_(std::max<std::size_t>(v.size(), 1)) {
    max_.assign(4 * n_, std::numeric_limits<std::int64_t>::min());
    add_.assign(4 * n_, 0);
    build(1, 0, n_ - 1, v);
  }
  /// Adds `d` to every position of [lo, hi].
  void add(std::size_t lo, std::size_t hi, std::int64_t d) { add(1, 0, n_ - 1, lo, hi, d); }
  /// The largest value.
  std::int64_t max() const { return max_[1]; }
  /// The first position holding the largest value.
  std::size_t argmax() const {
    std::size_t k = 1, l = 0, r = n_ - 1;
    std::int64_t want = max_[1];
    while (l < r) {
      want -= add_[k];
      const std::size_t m = (l + r) / 2;
      if (max_[2 * k] == want) k = 2 * k, r = m;
      else k = 2 * k + 1, l = m + 1;
    }
    return l;
  }

 private:
  void build(std::size_t k, std::size_t l, std::size_t r, const std::vector<std::int64_t>& v) {
    if (l == r) {
      max_[k] = l < v.size() ? v[l] : 0;
      return;
    }
    const std::size_t m = (l + r) / 2;
    build(2 * k, l, m, v);
    build(2 * k + 1, m + 1, r, v);
    max_[k] = std::max(max_[2 * k], max_[2 * k + 1]);
  }
  void add(std::size_t k, std::size_t l, std::size_t r, std::size_t lo, std::size_t hi, std::int64_t d) {
    if (hi < l || r < lo) return;
    if (lo <= l && r <= hi) {
      max_[k] += d;
      add_[k] += d;
      return;
    }
    const std::size_t m = (l + r) / 2;
    add(2 * k, l, m, lo, hi, d);
    add(2 * k + 1, m + 1, r, lo, hi, d);
    max_[k] = std::max(max_[2 * k], max_[2 * k + 1]) + add_[k];
  }

  std::size_t n_;
  std::vector<std::int64_t> max_, add_;  // max_[k] includes add_[k], which applies to all of k
};

/// A pointwise node that may be recomputed: its readers from `late` on read a copy made right
/// before `late`; its buffer is then free over positions [lo, hi] (of the current order).
struct recompute_candidate {
  node* n = nullptr;
  node* late = nullptr;                  // the first late reader
  std::vector<node*> late_readers;       // every late reader (not a view of n)
  std::vector<node*> views;              // n's views and waits (its aliases but itself)
  int value = -1;                        // its producer (memory_plan's value numbering)
  std::vector<int> inputs;               // the producers of its inputs (graph inputs left out)
  std::size_t lo = 0, hi = 0;
  std::int64_t bytes = 0;
  double cost = 0;                       // 0 when nothing reads n early (it is moved, not copied)
};

/// The candidates of `g` under the plan `vp` (made with `live` for g's current order).
CCGRAPH_DECL std::vector<recompute_candidate> recompute_candidates(const graph& g, const liveness_info& live,
                                                             const value_plan& vp, const runtime_estimator& estimate);

/// Makes the late readers of each chosen candidate read a copy of its node (and of its views)
/// placed right before the first of them; removes the views, and the node, nothing reads any
/// more.
CCGRAPH_DECL void apply_recompute(graph& g, const std::vector<const recompute_candidate*>& chosen);

}  // namespace detail

/// Recomputes cheap pointwise values instead of keeping them alive (see the file comment): for
/// each pointwise node (no random numbers) read early and again after a stretch of positions
/// where it is only kept, whose inputs are all graph inputs or still read at or after its first
/// late reader, a copy placed right before that reader serves the late readers (views of the
/// value are copied along). Chosen greedily where the memory planner's live peak is: while each
/// position at the peak is covered by a candidate's free stretch (the larger, the cheaper, the
/// longer first), within `opt.max_added_time` of added estimated time; candidates that would
/// not lower the peak together are dropped, and if the planner's peak of the result is not
/// lower the graph is left as it was. Deterministic (positions, sizes and estimates only: every
/// rank that holds the same graph makes the same choice); collectives are never moved or
/// copied. Returns the number of nodes recomputed (or moved). O((V + E) log V + K^2) for K
/// candidates.
CCGRAPH_DECL std::size_t recompute_pointwise(graph& g, const runtime_estimator& estimate, const recompute_options& opt = {});

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/recompute.ipp>
#endif
