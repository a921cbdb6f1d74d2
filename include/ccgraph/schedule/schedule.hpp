// ccgraph/schedule/schedule.hpp: cg::schedule, which applies named passes to a copy of a graph.
// Passes never look at tensor values. The reordering passes keep the relative order of
// collectives; the two that merge or split collectives let the members of each group agree
// (schedule/agreement.hpp), so every member of a group issues the same collectives in the same
// order, also where ranks run different programs.
#pragma once

#include <ccgraph/core/config.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/log.hpp>
#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/schedule/agreement.hpp>
#include <ccgraph/schedule/bucketing.hpp>
#include <ccgraph/schedule/cost_model.hpp>
#include <ccgraph/schedule/decompose.hpp>
#include <ccgraph/schedule/recompute.hpp>
#include <ccgraph/schedule/reorder.hpp>
#include <ccgraph/schedule/timeline.hpp>

namespace ccgraph {

/// How cg::schedule orders a graph.
struct schedule_options {
  /// Overrides the cost model per node, in microseconds (Inductor's estimate_op_runtime).
  runtime_estimator estimate_runtime;
  /// The analytical (and optionally calibrated) cost model used when estimate_runtime is unset.
  cost_model model;
  /// Caps for the `overlap` pass.
  overlap_options overlap;
  /// Largest coalesced collective `bucket_collectives` builds, in bytes.
  std::int64_t bucket_cap_bytes = 25 << 20;
  /// Row chunks `decompose_matmul_collectives` splits a matmul + collective into.
  int decompose_chunks = 4;
  /// `decompose_matmul_collectives` splits only collectives the estimator predicts exposed
  /// (decompose_options::only_exposed): not those the compute before their first reader hides.
  bool decompose_only_exposed = false;
  /// The time budget and memory measure of `recompute_pointwise`.
  recompute_options recompute{};
  /// How `bucket_collectives` and `decompose_matmul_collectives` keep each group's collectives
  /// the same on all its members: by default they agree through the rank context, when there
  /// is one (docs/scheduling.md, "Every member of a group issues the same collectives").
  collective_agreement agreement = collective_agreement::automatic;
  /// The rank whose graph is scheduled, to agree through; null: the calling thread's rank
  /// context (inside run_threads or run_gpus), if any.
  rank_context* context = nullptr;

  /// The estimator the passes use: estimate_runtime if set, else the cost model.
  runtime_estimator estimator() const {
    if (estimate_runtime) return estimate_runtime;
    const cost_model m = model;
    return [m](const node& n) { return m.estimate_us(n); };
  }
};

/// The passes cg::schedule knows, in the order they are usually run. Bucketing goes before
/// decomposition: afterwards it would merge the chunks' collectives back into one.
/// recompute_pointwise measures memory on the order it is given, so it goes after reordering.
CCGRAPH_DECL const std::vector<std::string_view>& schedule_pass_names();

/// Applies one named pass to `g` in place; an unknown name is an error listing the known ones.
/// With a rank context (see schedule_options::agreement), bucket_collectives and
/// decompose_matmul_collectives communicate with the other members of the groups they change:
/// every member must then schedule its graph with the same passes at the same point.
CCGRAPH_DECL void apply_pass(graph& g, std::string_view pass, const schedule_options& opt);

/// A copy of `g` with `passes` applied in order (the list may be empty). Returns g's own type,
/// so a typed graph stays typed. The result is linted.
template <class G>
  requires std::is_base_of_v<graph, G>
G schedule(const G& g, const std::vector<std::string>& passes, const schedule_options& opt = {}) {
  G out = g;
  for (const auto& p : passes) apply_pass(out, p, opt);
  lint(out);
  return out;
}

/// The predicted timeline of `g` under `opt`'s estimator.
CCGRAPH_DECL timeline predict(const graph& g, const schedule_options& opt = {});

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/schedule.ipp>
#endif
