// ccgraph/schedule/decompose.hpp: decompose_matmul_collectives, which splits a matmul feeding a
// collective (or fed by one) into row chunks, so that chunk i's communication overlaps chunk
// i+1's matmuls: XLA's collective-matmul decomposition and PyTorch's async-TP, as a graph pass.
// Each output row is computed by exactly the same arithmetic as before (matmul rows and
// pointwise elements are independent, collectives reduce element by element), so results are
// bitwise unchanged. The members of each group agree on which collectives split
// (schedule/agreement.hpp), so they issue the same chunks even where their programs differ.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/schedule/agreement.hpp>
#include <ccgraph/schedule/rewrite.hpp>
#include <ccgraph/schedule/timeline.hpp>

namespace ccgraph {
namespace detail {

/// Row ranges [start, start + length) of a 2-d value, taken in this order: the rows of one chunk.
using row_ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

/// torch.chunk's pieces of `rows` rows into at most `chunks` chunks: (start, length) each.
CCGRAPH_DECL row_ranges chunk_rows(std::int64_t rows, int chunks);

/// The family of collective node `c` (op_traits<O>::family), but only for single-tensor ops
/// (op_traits<O>::single_op is the op itself): none for the rest.
CCGRAPH_DECL bucket_family collective_family(const node& c);

/// For a node whose output row r is computed from row r of some arguments only (and from the
/// whole of the others), which arguments carry rows; nullopt for any other node. Such nodes are
/// a matmul of 2-d operands (the left one carries rows) and a pointwise node with a 2-d output
/// of at least two rows (its 2-d arguments with as many rows; the others broadcast along rows,
/// like a bias of shape [N] or [1, N], and stay whole).
CCGRAPH_DECL std::optional<std::vector<bool>> row_args(const node& v);

/// The nodes to recompute per row chunk when `top`'s rows are split, in descending position:
/// `top`, then, going up through row arguments, every row-wise node (see row_args) with the same
/// rows all of whose readers are in the set and read it as a row argument. What is left out
/// (a graph input, a node read elsewhere, a right matmul operand) is narrowed instead.
CCGRAPH_DECL std::vector<node*> row_region(const graph& g, node* top);

/// One decomposition, found on the graph before the pass changes it: the collective, its wait,
/// and the nodes recomputed per chunk (a row region, in descending position, for a collective
/// fed by rows; the chain after the wait, in order, for an all_gather).
struct decomposition {
  node* collective = nullptr;
  node* wait = nullptr;
  bool gather = false;
  std::vector<node*> nodes;

  /// Every node the decomposition replaces.
  template <class F>
  void for_each_replaced(F&& f) const {
    f(collective);
    f(wait);
    for (node* v : nodes) f(v);
  }
};

/// y = row-wise chain ending in a matmul -> all_reduce(y) or reduce_scatter_tensor(y) -> wait,
/// with at least `chunks` rows (per rank's block for reduce_scatter) and a matmul in the region.
CCGRAPH_DECL std::optional<decomposition> match_rows_then_collective(const graph& g, node* c, int chunks);

/// all_gather_into_tensor(x) -> wait -> matmul (-> further row-wise nodes, each the only reader
/// of the previous one), with at least `chunks` rows in x.
CCGRAPH_DECL std::optional<decomposition> match_gather_then_rows(node* ag, int chunks);

/// The nodes each decomposition places where an old node was.
struct placements {
  std::unordered_map<const node*, std::vector<node*>> after;  // after (in place of) the key
};

/// Per chunk, the region on the chunk's rows and the collective on the result (where the
/// collective was), then the waits and a cat where the wait was. For reduce_scatter over n
/// ranks, chunk i takes sub-rows i of each rank's block of y, so that it scatters to every rank
/// its own rows i.
CCGRAPH_DECL void decompose_rows_then_collective(graph& g, const decomposition& d, int chunks, placements& at);

/// Per chunk of x's rows, its all_gather where the all_gather was, then at the chain's end its
/// wait and the chain; the chunks' rows are put back in the gathered order (rank-major: rank
/// r's rows of chunk 0, of chunk 1, ...) with narrow and one cat.
CCGRAPH_DECL void decompose_gather_then_rows(graph& g, const decomposition& d, int chunks, placements& at);

/// The estimated compute (not collectives, waits or the output) before each position of `g`:
/// entry p sums the nodes at positions below p, so a stretch costs two lookups.
CCGRAPH_DECL std::vector<double> compute_before(const graph& g, const runtime_estimator& estimate);

/// Whether collective `c` can be hidden in `g`'s current order: the compute (by `before`,
/// compute_before of `g`) between the producer of its latest input (where raise_comms can issue
/// it) and the first node that reads its result (through its wait: where sink_waits waits for
/// it) takes at least as long as the collective itself by `estimate`. Such a collective gains
/// nothing from being split.
CCGRAPH_DECL bool hidden_by_compute_beside(const graph& g, const node& c, const std::vector<double>& before,
                                           const runtime_estimator& estimate);

/// The collectives decompose_matmul_collectives may split, from the collective alone (so every
/// member of its group sees alike): all_reduce, reduce_scatter_tensor and all_gather_into_tensor
/// of one 2-d input.
CCGRAPH_DECL bool decomposable(const node& c);

}  // namespace detail

/// Splits matmuls next to collectives into `chunks` row chunks (torch.chunk's sizes; fewer when
/// the rows do not allow more; nothing when there are fewer rows than chunks or chunks < 2), so
/// that one chunk's collective runs while the next chunk computes. Three patterns:
///  - y = matmul(..) -> all_reduce(y): the row split is pushed up through every row-wise node
///    only this chain reads (a matmul's left operand, pointwise nodes; right operands and
///    inputs broadcast along rows stay whole), so the TP MLP `x @ w1 -> gelu -> @ w2 ->
///    all_reduce` becomes `chunks` independent row pipelines, each ending in its all_reduce;
///    the waits and a cat of their results take the old wait's place.
///  - the same ending in reduce_scatter_tensor (dim 0 over n ranks): chunk i computes rows i
///    of every rank's block, so each rank still receives exactly its rows.
///  - all_gather_into_tensor(x) -> wait -> matmul (-> row-wise nodes only the chain reads): x's
///    rows are chunked, each chunk gathered (where the gather was) and run through the chain
///    (where the chain ended), and the rows put back in the gathered, rank-major order.
/// The patterns are found on the graph as it is; one that shares a node with an earlier one is
/// left alone. Collectives keep their relative order (a split collective becomes a run of
/// collectives in its place), and results are bitwise unchanged.
///
/// Whether a collective splits depends on its producers and readers, which are the rank's own:
/// the members of each group agree through `ctx` (see schedule/agreement.hpp) and split a
/// collective only where every member can, so they issue the same chunks. Inside run_threads
/// or run_gpus that is the calling thread's rank context, and `g` must be that rank's graph;
/// with `ctx` null the pass decides from `g` alone, which is right when every rank schedules the
/// same program (collective_agreement). O((V + E) log V).
CCGRAPH_DECL void decompose_matmul_collectives(graph& g, int chunks, rank_context* ctx = detail::current_rank_ptr());

/// How decompose_matmul_collectives chooses what to split.
struct decompose_options {
  /// Row chunks per split.
  int chunks = 4;
  /// When set, split only the collectives it predicts exposed: those that the compute between
  /// their input's producer and the first reader of their result (in the current order) would
  /// not hide (detail::hidden_by_compute_beside). A data-parallel step's earlier gradients, hidden
  /// behind the rest of the backward, then stay whole, and only the last one splits. Unset:
  /// every match splits.
  runtime_estimator only_exposed{};
};

/// decompose_matmul_collectives(g, opt.chunks, ctx), splitting only what `opt` selects. What a
/// rank selects is its own (its costs and order): the members of each group agree as for any
/// match, so a collective splits only where every member selects it.
CCGRAPH_DECL void decompose_matmul_collectives(graph& g, const decompose_options& opt,
                                               rank_context* ctx = detail::current_rank_ptr());

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/decompose.ipp>
#endif
