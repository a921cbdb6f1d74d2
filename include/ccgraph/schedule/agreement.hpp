// ccgraph/schedule/agreement.hpp: how the passes that change the collectives themselves
// (bucket_collectives merges them, decompose_matmul_collectives splits them) keep every member
// of a group issuing the same ones.
//
// A rank's graph holds its own program only: a rank that skips a subgroup collective cannot
// see it, and which collectives may merge or split also depends on data dependences and
// producers that differ per rank. So each pass proposes changes from what every member of a
// group sees alike: the group's own collectives, in program order, with their signatures
// (equal on all members of a valid program). What a rank's own graph forbids (another group's
// collective in between, a dependence, a producer that cannot be split) each member reports
// as numbers, and the members take the elementwise max: one all_reduce over the group, issued
// by each member for each group it has a proposal in, groups in one canonical order. Every
// member then decides from the same numbers. A first, fixed-size all_reduce compares a hash of
// the group's collectives and the pass's options, so members whose graphs differ there change
// nothing on that group instead of exchanging vectors of different lengths.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

/// How bucket_collectives and decompose_matmul_collectives, which change the sequence of
/// collectives, keep it the same on every member of each group (docs/scheduling.md).
enum class collective_agreement {
  /// Agree with the other members of each group through the rank context
  /// (schedule_options::context, else the calling thread's, inside run_threads or run_gpus);
  /// without one, decide as `spmd` does.
  automatic,
  /// Decide from this graph alone, without communicating: the same collectives on every member
  /// of each group only when every member schedules a graph with the same collectives and the
  /// same dependences among them, as when every rank runs one program (SPMD).
  spmd,
};

namespace detail {

/// One group's part in a pass's agreement: what this rank proposes there and what it knows.
struct group_facts {
  /// The group, as its first collective in the graph has it.
  group_info group;
  /// The pass's indices of the group's collectives, in program order.
  std::vector<std::size_t> members;
  /// The pass may change something in this group: decided from the group's collectives alone
  /// (op, attributes, dtypes, never the options), so every member decides alike.
  bool proposes = false;
  /// A hash of what the members' facts must share to line up: the group's collectives and the
  /// pass's options.
  std::uint64_t hash = 0;
  /// Per proposal, what this rank's graph allows; the agreed value is the max over members.
  std::vector<std::int64_t> facts;
  /// False when the members' hashes differ: then the pass changes nothing in this group.
  bool agreed = true;
};

/// The groups of `collectives` (nodes of one graph, in program order), one entry per rank list,
/// in order of first appearance, with their members filled in.
CCGRAPH_DECL std::vector<group_facts> groups_of(const std::vector<node*>& collectives);

/// The hash of a group's collectives as every member sees them (their signatures), and of
/// `extra` (the pass's name and options).
CCGRAPH_DECL std::uint64_t collectives_hash(const std::vector<node*>& collectives, const std::vector<std::size_t>& members,
                                      std::string_view pass, const std::vector<std::int64_t>& extra);

/// The order groups agree in: by partition for a group that is part of one (all of whose parts
/// agree at once, as they run their collectives), else by rank list. The same on every rank,
/// so no two ranks wait on each other in opposite orders.
CCGRAPH_DECL std::vector<std::vector<int>> agreement_key(const group_info& g);

/// The elementwise max of `values` over the members of `grp`, each member passing its own (of
/// one length), by an all_reduce on `ctx`'s backend: an int64 tensor on the rank's device.
CCGRAPH_DECL std::vector<std::int64_t> max_over_group(rank_context& ctx, const group_info& grp,
                                                const std::vector<std::int64_t>& values);

/// Makes each proposing group's facts the max over its members, through `ctx`; without a
/// context the facts stay this rank's own (the SPMD assumption). Every rank of `ctx` must be a
/// member of every group (it is its own graph); groups agree in agreement_key order.
CCGRAPH_DECL void agree_on_groups(rank_context* ctx, std::string_view pass, std::vector<group_facts>& groups);

}  // namespace detail
}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/agreement.ipp>
#endif
