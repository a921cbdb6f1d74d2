// ccgraph/runtime/verify.hpp: verify_collective_order, the cross-rank safety check. Every rank
// passes the graph it is about to run; the ranks exchange their sequences of collectives through
// the backend and all reach the same verdict, so a program that would hang or mismatch at run
// time (a rank-dependent shape, an extra collective, a pass that looked at rank-local data) is
// reported before it runs, naming the first difference.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {
namespace detail {

/// One collective as verify_collective_order compares it: its group's (global) ranks, the
/// call-shaped text of its ops::signature (equal texts for equal signatures, "?" where ranks may
/// legitimately differ), and its position among its rank's collectives.
struct collective_entry {
  std::vector<int> ranks;
  std::string text;
  std::int64_t index = 0;
  /// Where the rank's program called it ("file:line"), or "" when unknown.
  std::string site;
};

/// The collectives of `g`, run by `rank`, in program order; a batch of point-to-point
/// transfers as its transfers, each over its pair (ops::p2p_transfers), as the backends match them.
CCGRAPH_DECL std::vector<collective_entry> collective_entries(const graph& g, int rank);

/// Bytes of a sequence: per entry the rank count, the ranks, the text length and the text, the
/// site's length and the site
/// (native 64-bit integers: every rank of one world runs this same code on one kind of host).
CCGRAPH_DECL std::vector<std::uint8_t> serialize_entries(const std::vector<collective_entry>& es);

/// The inverse of serialize_entries on `size` bytes at `p` (rank `rank`'s, for errors).
CCGRAPH_DECL std::vector<collective_entry> deserialize_entries(const std::uint8_t* p, std::int64_t size, int rank);

/// `seq`'s collectives whose group contains rank `peer`.
CCGRAPH_DECL std::vector<const collective_entry*> with_peer(const std::vector<collective_entry>& seq, int peer);

}  // namespace detail

/// Checks that the graphs every rank of `ctx`'s world passes issue matching collectives: for
/// each pair of ranks (a, b), the k-th collective a issues in a group containing b must be the
/// k-th one b issues in a group containing a, equal as ops::signature defines (op, attributes,
/// group, input dtypes and shapes; all_to_all_single's split sizes may differ). Groups that do
/// not contain both (MPMD subgroups, collectives of other ranks) are not compared. Collective:
/// every rank of the world must call it. The sequences travel as all_gathers over the world on
/// the calling rank's backend, so every rank sees all of them and reaches the same verdict; on a
/// difference every rank throws ccgraph::collective_mismatch_error naming the pair of ranks,
/// the position and both collectives of the earliest difference (smallest position, then the
/// lowest pair), each with the file and line its rank's program called it at (node::source).
CCGRAPH_DECL void verify_collective_order(const graph& g, rank_context& ctx);

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/runtime/impl/verify.ipp>
#endif
