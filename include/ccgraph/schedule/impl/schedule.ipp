// ccgraph/schedule/impl/schedule.ipp: the non-template functions of
// <ccgraph/schedule/schedule.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/schedule.hpp>

#include <chrono>
#include <utility>

namespace ccgraph {

CCGRAPH_DECL const std::vector<std::string_view>& schedule_pass_names() {
  static const std::vector<std::string_view> names = {
      "bucket_collectives", "decompose_matmul_collectives", "sink_waits", "raise_comms",
      "reorder_compute_for_overlap", "overlap", "recompute_pointwise"};
  return names;
}

namespace detail {

CCGRAPH_DECL void apply_pass_unlogged(graph& g, std::string_view pass, const schedule_options& opt) {
  if (pass == "sink_waits") return sink_waits(g);
  if (pass == "raise_comms") return raise_comms(g);
  if (pass == "reorder_compute_for_overlap") return reorder_compute_for_overlap(g, opt.estimator());
  if (pass == "overlap") return overlap(g, opt.estimator(), opt.overlap);
  if (pass == "recompute_pointwise") return (void)recompute_pointwise(g, opt.estimator(), opt.recompute);
  rank_context* ctx = opt.agreement == collective_agreement::spmd ? nullptr
                     : opt.context                                ? opt.context
                                                                  : detail::current_rank_ptr();
  if (pass == "bucket_collectives") return bucket_collectives(g, opt.bucket_cap_bytes, ctx);
  if (pass == "decompose_matmul_collectives")
    return decompose_matmul_collectives(
        g, decompose_options{opt.decompose_chunks, opt.decompose_only_exposed ? opt.estimator() : runtime_estimator{}}, ctx);
  std::string known;
  for (auto n : schedule_pass_names()) known += (known.empty() ? "" : ", ") + std::string(n);
  CCGRAPH_THROW(error, "schedule: unknown pass '", pass, "'; known passes are ", known);
}

/// Nodes and collectives of `g`, for the pass summaries.
CCGRAPH_DECL std::pair<std::size_t, std::size_t> node_counts(const graph& g) {
  std::size_t c = 0;
  for (const node* n : g.nodes()) c += n->is_collective() ? 1 : 0;
  return {g.size(), c};
}

}  // namespace detail

CCGRAPH_DECL void apply_pass(graph& g, std::string_view pass, const schedule_options& opt) {
  // At debug, one line per pass: what it changed and what it cost on the host.
  if (!detail::log_enabled(log_level::debug)) return detail::apply_pass_unlogged(g, pass, opt);
  const auto before = detail::node_counts(g);
  const auto t0 = std::chrono::steady_clock::now();
  detail::apply_pass_unlogged(g, pass, opt);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto after = detail::node_counts(g);
  detail::log(log_level::debug, "schedule", pass, ": ", before.first, " -> ", after.first, " nodes, ", before.second,
              " -> ", after.second, " collectives, ", ms, " ms");
}

CCGRAPH_DECL timeline predict(const graph& g, const schedule_options& opt) {
  return simulate(g, opt.estimator());
}

}  // namespace ccgraph
