// ccgraph/schedule/timeline.hpp: the predicted execution of a scheduled graph on two streams
// (compute and communication), from per-node cost estimates: exposed communication, the text
// overlap report, and a Chrome trace (JSON, viewable in Perfetto / chrome://tracing).
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ir/print.hpp>

namespace ccgraph {

/// Estimated run time of one node in microseconds.
using runtime_estimator = std::function<double(const node&)>;

/// One node's predicted interval on its stream.
struct timeline_event {
  const node* n = nullptr;
  bool on_comm_stream = false;
  double start_us = 0;
  double end_us = 0;
  double stall_us = 0;  // for waits: how long compute stood still waiting for the collective
};

/// The predicted execution: collectives run one after another on the communication stream,
/// each starting when issued (its position in the order) and the stream is free; everything
/// else runs in order on the compute stream, and a wait_tensor holds the compute stream until
/// its collective ends. Exposed communication is the sum of those holds.
struct timeline {
  std::vector<timeline_event> events;
  double total_us = 0;          // when the last stream finishes
  double compute_us = 0;        // busy time of the compute stream
  double comm_us = 0;           // busy time of the communication stream
  double exposed_comm_us = 0;   // waits' stalls, plus communication running past the compute

  /// Fraction of communication time not hidden behind compute (0 when there is none).
  double exposed_ratio() const { return comm_us > 0 ? exposed_comm_us / comm_us : 0.0; }
};

/// Simulates `g` in its current order with costs from `estimate`.
CCGRAPH_DECL timeline simulate(const graph& g, const runtime_estimator& estimate);

namespace detail {
CCGRAPH_DECL std::string node_label(const node& n);
/// `s` as the inside of a JSON string (RFC 8259): quotes and backslashes escaped, and every
/// control character (a newline in a user op's name, a tab) as an escape, which JSON requires.
CCGRAPH_DECL std::string json_escape(const std::string& s);
}  // namespace detail

/// The timeline as Chrome trace JSON: one track for the compute stream, one for communication;
/// waits that stall show their stall as a separate "exposed" slice.
CCGRAPH_DECL std::string to_chrome_trace(const timeline& tl, const std::string& process_name = "ccgraph");

/// Several timelines in one Chrome trace, timeline i as process (pid) i named `process_names[i]`
/// (its two tracks as in to_chrome_trace): every rank's predicted run side by side (cg::preflight).
/// `process_names` has one name per timeline.
CCGRAPH_DECL std::string to_chrome_trace(const std::vector<timeline>& tls, const std::vector<std::string>& process_names);

/// The predicted timeline of a graph (cg::predict) and the one measured running it
/// (executor::run_profiled, compiled_graph::profile) in one Chrome trace, as processes
/// "predicted" and "measured": to_chrome_trace({predicted, measured}, {"predicted", "measured"}).
CCGRAPH_DECL std::string predicted_vs_measured_trace(const timeline& predicted, const timeline& measured);

/// A text overlap report: one line per node with its stream and predicted interval, compute
/// that runs while a collective is in flight marked with '|', and the totals.
CCGRAPH_DECL std::string overlap_report(const timeline& tl);

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/timeline.ipp>
#endif
