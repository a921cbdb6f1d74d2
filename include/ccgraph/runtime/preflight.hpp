// ccgraph/runtime/preflight.hpp: cg::preflight checks a distributed program before it runs, on
// one CPU and without data. It traces every rank's program (one after another, on the calling
// thread, each with a rank context of its own whose communicator refuses to run anything),
// optionally schedules each graph with the passes the real run uses, and then:
//  - checks that the ranks issue the same collectives in the same order, by replaying how a
//    backend matches them (each rank runs its collectives in order; a collective completes when
//    every member of its group has reached it): a difference is reported at the first collective
//    where members disagree, naming every member's collective and the file:line of the call;
//    a rank that stops early and a cycle of ranks waiting in different groups are found too;
//  - plans each rank's memory (plan_memory) and reports its peak;
//  - predicts each rank's timeline (predict) and merges them into one Chrome trace, one
//    process per rank.
// cg::preflight_main wraps this into a small command (--world N --trace out.json --passes ...).
#pragma once

#include <ccgraph/core/config.hpp>
#include <cstdint>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/comm/communicator.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/schedule/memory_plan.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/schedule/timeline.hpp>

namespace ccgraph {

/// What cg::preflight does besides the order check.
struct preflight_options {
  /// cg::schedule's passes, applied to every rank's graph before the checks, as the real run
  /// would (the passes that merge or split collectives agree across each group through a
  /// threads world on this CPU, as they would through the real backend). Empty: the traced order.
  std::vector<std::string> passes;
  /// The estimator, cost model and pass options for scheduling and for the predicted timeline.
  /// Its `context` and `agreement` are preflight's to set.
  schedule_options schedule;
  /// How each rank's memory is planned.
  memory_plan_options memory;
  /// Where to write the merged predicted timeline (Chrome trace JSON, open it in Perfetto or
  /// chrome://tracing); empty: not written (preflight_report::trace_json holds it anyway).
  std::string trace_path;
};

/// One rank's collective, as a preflight report names it.
struct preflight_collective {
  int rank = 0;
  /// Its position among the rank's collectives (a batch of point-to-point transfers counts one
  /// per transfer, as the backends match them).
  std::int64_t index = 0;
  /// Call-shaped text: "all_reduce(f32[8, 8], op=sum, group=[0, 1])".
  std::string text;
  /// The group's ranks.
  std::vector<int> group;
  /// Where the rank's program called it ("file:line"), or "" when unknown.
  std::string site;
};

/// What preflight found for one rank.
struct preflight_rank {
  int rank = 0;
  /// Nodes of the rank's (scheduled) graph, and how many of them are collectives.
  std::size_t nodes = 0;
  std::size_t collectives = 0;
  /// The memory plan's arena (memory_plan::arena_bytes): the rank's planned peak of intermediate
  /// values, graph inputs not included.
  std::int64_t peak_bytes = 0;
  /// The largest sum of values live at once (memory_plan::live_peak_bytes).
  std::int64_t live_peak_bytes = 0;
  /// The predicted run: its length and the communication it leaves exposed.
  double predicted_us = 0;
  double exposed_comm_us = 0;
};

/// The verdict of cg::preflight.
struct preflight_report {
  int world_size = 0;
  /// Empty when every rank's program agrees; else the first problem, in words, naming each
  /// rank's collective and the file and line of its call.
  std::string problem;
  /// The collectives the problem is about, one per rank involved.
  std::vector<preflight_collective> at;
  /// Per rank, in rank order (empty when a rank's program failed to trace).
  std::vector<preflight_rank> ranks;
  /// The merged predicted timeline (empty unless every rank agreed).
  std::string trace_json;

  /// True when the ranks agree.
  bool ok() const { return problem.empty(); }
  /// Throws collective_mismatch_error with `problem` unless ok().
  CCGRAPH_DECL void check() const;
  /// A few lines for a terminal: the verdict, then one line per rank.
  CCGRAPH_DECL std::string str() const;
};

namespace detail {

/// The communicator of preflight's rank contexts: it runs nothing, and says why.
class preflight_communicator final : public communicator {
 public:
  explicit preflight_communicator(int rank) : rank_(rank) {}
  CCGRAPH_DECL work_ptr launch(std::shared_ptr<collective_request> req) override;

 private:
  int rank_;
};

/// The checks and outputs of cg::preflight on every rank's traced graph (graphs[r] is rank r's).
CCGRAPH_DECL preflight_report preflight_graphs(std::vector<graph> graphs, const preflight_options& opt);

/// The first disagreement among the ranks' collectives, found by replaying how a backend
/// matches them; an empty problem when there is none.
CCGRAPH_DECL preflight_report match_collectives(const std::vector<graph>& graphs);

/// preflight_main's command line.
struct preflight_args {
  int world_size = 2;
  preflight_options options;
  bool help = false;
};

/// Parses `--world N`, `--trace PATH`, `--passes a,b,c` and `--help`; anything else is an
/// error naming the argument and the usage.
CCGRAPH_DECL preflight_args parse_preflight_args(int argc, const char* const* argv);

/// The usage text of preflight_main.
CCGRAPH_DECL std::string preflight_usage(const char* argv0);

/// Prints the report and writes the trace; 0 when the ranks agree, 1 when not.
CCGRAPH_DECL int finish_preflight_main(const preflight_report& r, const preflight_args& a, std::ostream& out);

}  // namespace detail

/// Traces `program` once per rank of a world of `world_size` ranks, on the calling thread, and
/// checks and predicts the result (see the file's comment). `program` is what a rank would run:
/// called with a rank_context (rank(), world_size(), world(), register_group() work as on a
/// real backend), it returns the rank's graph, usually `cg::trace(step, cg::input<float>(...))`.
/// Nothing is computed: a collective on real tensors is an error naming it. A program that
/// throws while tracing is reported as that rank's problem; bad arguments throw.
template <class Program>
preflight_report preflight(int world_size, Program&& program, const preflight_options& opt = {}) {
  CCGRAPH_CHECK(world_size >= 1 && world_size <= 4096, "preflight: world size must be in [1, 4096], got ",
                world_size);
  auto registry = std::make_shared<group_registry>(world_size);
  std::vector<graph> graphs;
  graphs.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    rank_context ctx(r, world_size, device::cpu(), registry, std::make_shared<detail::preflight_communicator>(r));
    detail::rank_scope scope(ctx);
    try {
      graphs.push_back(graph(program(ctx)));
    } catch (const std::exception& e) {
      preflight_report rep;
      rep.world_size = world_size;
      rep.problem = detail::concat("preflight: rank ", r, "'s program failed while tracing: ", e.what());
      return rep;
    }
  }
  return detail::preflight_graphs(std::move(graphs), opt);
}

/// A command around cg::preflight for `main`: `return cg::preflight_main(argc, argv, program);`
/// Options: `--world N` (default 2), `--trace PATH` (the merged predicted timeline),
/// `--passes a,b,c` (cg::schedule's pass names), `--help`. Prints the report; returns 0 when
/// the ranks agree, 1 when they do not, 2 for a bad command line.
template <class Program>
int preflight_main(int argc, char** argv, Program&& program, std::ostream& out, std::ostream& err) {
  detail::preflight_args a;
  try {
    a = detail::parse_preflight_args(argc, argv);
  } catch (const error& e) {
    err << e.what() << "\n" << detail::preflight_usage(argc > 0 ? argv[0] : "preflight");
    return 2;
  }
  if (a.help) {
    out << detail::preflight_usage(argc > 0 ? argv[0] : "preflight");
    return 0;
  }
  return detail::finish_preflight_main(preflight(a.world_size, program, a.options), a, out);
}

/// preflight_main printing to std::cout and std::cerr.
template <class Program>
int preflight_main(int argc, char** argv, Program&& program) {
  return preflight_main(argc, argv, program, std::cout, std::cerr);
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/runtime/impl/preflight.ipp>
#endif
