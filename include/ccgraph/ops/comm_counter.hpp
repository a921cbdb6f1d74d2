// ccgraph/ops/comm_counter.hpp: cg::comm_counter, PyTorch's CommDebugMode for ccgraph: counts the
// collectives the calling rank issues while it is alive, by kind and by phase label.
//
// Collectives are counted where every functional collective is issued (detail::issue in
// ops/collectives.hpp, plus batch_isend_irecv), on tensors and on symbolic values alike: an eager
// program and the same program traced count the same. A compiled graph's replays are not
// counted (count its nodes: g.count("all_reduce")), nor internal collectives (barrier, the
// scheduler's agreement check). Counting is per thread, so per rank on the threads backend.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ccgraph {

class comm_counter;

namespace detail {
/// The counters alive on this thread, innermost last.
inline std::vector<comm_counter*>& active_comm_counters() {
  thread_local std::vector<comm_counter*> active;
  return active;
}
}  // namespace detail

/// Counts the collectives this thread (rank) issues between its construction and destruction
/// (RAII; nested counters all count). Kinds are the graph's op names ("all_reduce",
/// "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast",
/// "all_reduce_coalesced", ..., "batch_isend_irecv"); `count` also takes the short family
/// names "all_gather", "reduce_scatter" and "all_to_all" for the first three of those.
///
///   cg::comm_counter c;
///   { auto p = c.phase("forward"); y = d.redistribute(mesh, {cg::replicate()}); }
///   CHECK(c.count("all_gather") == 1);  CHECK(c.count("all_gather", "forward") == 1);
class comm_counter {
 public:
  /// Starts counting on the calling thread.
  comm_counter() { detail::active_comm_counters().push_back(this); }
  ~comm_counter() {
    auto& a = detail::active_comm_counters();
    a.erase(std::remove(a.begin(), a.end(), this), a.end());
  }
  comm_counter(const comm_counter&) = delete;
  comm_counter& operator=(const comm_counter&) = delete;

  /// Collectives of `kind` counted, every phase together.
  CCGRAPH_DECL std::int64_t count(std::string_view kind) const;
  /// Collectives of `kind` counted in phase `phase` ("" is the unlabelled phase).
  CCGRAPH_DECL std::int64_t count(std::string_view kind, std::string_view phase) const;
  /// Every collective counted.
  CCGRAPH_DECL std::int64_t total() const;
  /// Counts by kind, every phase together (CommDebugMode.get_comm_counts()).
  CCGRAPH_DECL std::map<std::string, std::int64_t> counts() const;
  /// Counts by phase, then kind.
  const std::map<std::string, std::map<std::string, std::int64_t>>& counts_by_phase() const { return by_phase_; }
  /// Forgets every count.
  void reset() { by_phase_.clear(); }

  /// The phase label collectives are counted under until the returned scope ends (RAII; the
  /// previous label comes back then).
  class phase_scope {
   public:
    phase_scope(comm_counter& c, std::string label) : c_(&c), previous_(std::exchange(c.phase_, std::move(label))) {}
    ~phase_scope() {
      if (c_) c_->phase_ = std::move(previous_);
    }
    phase_scope(phase_scope&& o) noexcept : c_(std::exchange(o.c_, nullptr)), previous_(std::move(o.previous_)) {}
    phase_scope(const phase_scope&) = delete;
    phase_scope& operator=(const phase_scope&) = delete;
    phase_scope& operator=(phase_scope&&) = delete;

   private:
    comm_counter* c_;
    std::string previous_;
  };
  /// Counts under `label` until the returned scope ends: `auto p = c.phase("backward");`.
  [[nodiscard]] phase_scope phase(std::string label) { return phase_scope(*this, std::move(label)); }
  /// The current phase label ("" when none).
  const std::string& current_phase() const { return phase_; }

  /// Counts one collective of `kind` (called where collectives are issued).
  CCGRAPH_DECL void add(std::string_view kind);

 private:
  CCGRAPH_DECL static std::string canonical(std::string_view kind);

  std::map<std::string, std::map<std::string, std::int64_t>> by_phase_;
  std::string phase_;
};

namespace detail {
/// Records one collective of `kind` with every counter alive on this thread.
inline void note_collective(std::string_view kind) {
  for (comm_counter* c : active_comm_counters()) c->add(kind);
}
}  // namespace detail

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/comm_counter.ipp>
#endif
