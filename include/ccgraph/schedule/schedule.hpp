// ccgraph/schedule/schedule.hpp: cg::schedule, which applies named passes to a copy of a graph.
// Passes never look at rank-local data, so every rank that traces the same program gets the
// same schedule and the same collective order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/schedule/bucketing.hpp>
#include <ccgraph/schedule/cost_model.hpp>
#include <ccgraph/schedule/decompose.hpp>
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

  /// The estimator the passes use: estimate_runtime if set, else the cost model.
  runtime_estimator estimator() const {
    if (estimate_runtime) return estimate_runtime;
    const cost_model m = model;
    return [m](const node& n) { return m.estimate_us(n); };
  }
};

/// The passes cg::schedule knows, in the order they are usually run. Bucketing goes before
/// decomposition: afterwards it would merge the chunks' collectives back into one.
inline const std::vector<std::string_view>& schedule_pass_names() {
  static const std::vector<std::string_view> names = {
      "bucket_collectives", "decompose_matmul_collectives", "sink_waits", "raise_comms",
      "reorder_compute_for_overlap", "overlap"};
  return names;
}

/// Applies one named pass to `g` in place; an unknown name is an error listing the known ones.
inline void apply_pass(graph& g, std::string_view pass, const schedule_options& opt) {
  if (pass == "sink_waits") return sink_waits(g);
  if (pass == "raise_comms") return raise_comms(g);
  if (pass == "reorder_compute_for_overlap") return reorder_compute_for_overlap(g, opt.estimator());
  if (pass == "overlap") return overlap(g, opt.estimator(), opt.overlap);
  if (pass == "bucket_collectives") return bucket_collectives(g, opt.bucket_cap_bytes);
  if (pass == "decompose_matmul_collectives") return decompose_matmul_collectives(g, opt.decompose_chunks);
  std::string known;
  for (auto n : schedule_pass_names()) known += (known.empty() ? "" : ", ") + std::string(n);
  CCGRAPH_THROW(error, "schedule: unknown pass '", pass, "'; known passes are ", known);
}

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
inline timeline predict(const graph& g, const schedule_options& opt = {}) {
  return simulate(g, opt.estimator());
}

}  // namespace ccgraph
