// ccgraph/schedule/bucketing.hpp: bucket_collectives, which merges runs of adjacent collectives
// of one kind (same group, reduce op and dtype) into one coalesced collective under a byte cap,
// as DDP/FSDP gradient bucketing and Inductor's bucketing passes do. It never merges across a
// dependency or another group's collective and never changes the relative order of
// collectives; the members of each group agree on its buckets (schedule/agreement.hpp), so
// they issue the same collectives even where their programs differ.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/schedule/agreement.hpp>
#include <ccgraph/schedule/rewrite.hpp>

namespace ccgraph {
namespace detail {

/// The coalesced family a collective merges into (op_traits<O>::family): none for collectives
/// that never merge.
CCGRAPH_DECL bucket_family bucket_family_of(const ops::collective_op& c);

/// The reduce op of a reducing collective (op_traits<O>::reduce), nullopt for the others.
CCGRAPH_DECL std::optional<reduce_op> reduce_op_of(const ops::collective_op& c);

/// Bytes a node reads through its arguments.
CCGRAPH_DECL std::int64_t input_bytes(const node& n);

/// The one dtype of a collective's inputs, or nullopt when they mix dtypes (never bucketed).
CCGRAPH_DECL std::optional<dtype> input_dtype(const node& n);

/// True when collectives `a` and `b` may share one coalesced launch: same family, group (ranks
/// and tag), reduce op and dtype.
CCGRAPH_DECL bool bucket_compatible(const node& a, const node& b);

/// The coalesced collective a bucket led by `first` becomes.
CCGRAPH_DECL node_op coalesced_op_for(const node& first);

}  // namespace detail

/// Merges runs of adjacent collectives into coalesced ones (Inductor's and DDP's bucketing).
/// Looking at each group's collectives, in program order, a run of all_reduce (or
/// all_gather_into_tensor, or reduce_scatter_tensor) nodes, or their coalesced forms, with the
/// same reduce op and dtype becomes one all_reduce_coalesced (all_gather_into_tensor_coalesced,
/// reduce_scatter_tensor_coalesced) node, as long as their inputs total at most `cap_bytes`, no
/// collective of another group comes between two of them and no member depends, even through
/// other nodes, on another member's result. A collective of another kind, or one larger than
/// the cap, ends the run and stays as it is; a run of one is left as it is. The merged node
/// takes the place of the run's last collective (where every member's inputs exist), so
/// collectives keep their relative order; each original output is read through its own output
/// of the merged node (one wait each, as before), and readers that came before the merged node
/// move just after it.
///
/// Runs are proposed from each group's collectives alone, which every member sees alike; what
/// a member's own graph forbids (another group's collective in between, a dependence) the
/// members agree on through `ctx` (see schedule/agreement.hpp), so every member of each group
/// merges the same collectives. Inside run_threads or run_gpus that is the calling thread's
/// rank context, and `g` must be that rank's graph; with `ctx` null the pass decides from `g`
/// alone, which is right when every rank schedules the same program (collective_agreement).
/// O((V + E) log V).
CCGRAPH_DECL void bucket_collectives(graph& g, std::int64_t cap_bytes, rank_context* ctx = detail::current_rank_ptr());

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/bucketing.ipp>
#endif
