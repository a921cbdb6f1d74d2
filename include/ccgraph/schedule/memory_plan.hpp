// ccgraph/schedule/memory_plan.hpp: the memory planner. Over a graph's current (scheduled) order
// it computes when each intermediate value is live, lets an all_reduce reduce in place into an
// input that dies there (Inductor's "steal"), and packs every buffer into one arena so that no two
// values live at the same time share a byte. The executor runs a graph over this plan.
//
// What needs a buffer: every output of a compute node (matmul, pointwise, cat, repeat, copy; a
// reshape or contiguous that has to copy) and of a collective. What does not: graph inputs (the
// caller's), views and waits (they alias their input and extend its lifetime to their own last
// use), and whatever derives from a graph input without a copy the plan can foresee.
//
// A cat along its outermost dim whose inputs nothing else reads from the cat on has them computed
// straight into its output's slices (XLA's and TVM's in-place concatenation): the chunks of a
// decomposed matmul and their collectives then write where the cat would have copied them.
//
// Lifetimes are closed intervals of positions in the order. A collective reads its inputs and
// writes its outputs on the communication worker until its wait, so its inputs live until its
// last wait and its outputs from the collective on; an output returned un-waited (and the
// inputs of its collective) lives to the end of the graph.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ir/print.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

/// A value written into a planned buffer: output `index` of the node at `position` in the
/// order the plan was made for (`name` is its printed form, "%add" or "%arc.1").
struct planned_value {
  std::size_t position = 0;
  int index = 0;
  std::string name;
};

/// An input that a compiled graph's call updates in place: the graph's result `output` is
/// written into the tensor passed as input `input` (see compile_options::update_inputs).
struct input_update {
  std::size_t input;
  std::size_t output;
  friend bool operator==(const input_update&, const input_update&) = default;
};

/// How cg::plan_memory plans.
struct memory_plan_options {
  /// Every buffer starts at a multiple of this many bytes (and is rounded up to it); a power of
  /// two that is at least the largest element size.
  std::int64_t alignment = 64;
  /// Let an all_reduce write its result into an input that nothing reads afterwards.
  bool steal = true;
  /// Results that are written into graph inputs once the graph has run (compile_options::
  /// update_inputs). Each one that can be computed straight into its input's memory (see
  /// detail::in_place_update_sites) gets no buffer: memory_plan::updates_in_place lists it.
  std::vector<input_update> update_inputs{};
  /// Lay the inputs of a cat out inside its output when they can be (see plan_memory), so
  /// that the cat copies nothing: each input is computed straight into its slice.
  bool elide_cats = true;
};

/// An updated result (memory_plan_options::update_inputs) that its node writes straight into
/// the input's memory: output `value.index` of the node at `value.position`.
struct planned_update {
  planned_value value;
  input_update update;
};

/// One block of the arena: the bytes [offset, offset + bytes) during positions [first, last].
/// `values[0]` is the value that allocates it; any later entries are all_reduce outputs reduced
/// in place into it, each stealing it from the entry before.
struct planned_buffer {
  std::int64_t bytes = 0;   // rounded up to the alignment
  std::int64_t offset = 0;  // from the start of the arena
  std::size_t first = 0;    // the position that writes it first
  std::size_t last = 0;     // the last position that reads it (inclusive)
  std::vector<planned_value> values;
  bool is_output = false;   // a graph output aliases it (it outlives the run)
  /// A buffer laid out inside another: the slice of buffer `parent`'s elided cat that this
  /// buffer's value is (`offset` is then parent's offset + offset_in_parent, and the
  /// parent's interval covers this one's). -1: a block of the arena of its own.
  int parent = -1;
  std::int64_t offset_in_parent = 0;
};

/// A cat whose inputs were computed into its output's buffer (memory_plan_options::
/// elide_cats): the node at `position` copies nothing when input i is found at byte
/// `slices[i]` of its output.
struct elided_cat {
  std::size_t position = 0;
  std::vector<std::int64_t> slices;
};

/// Where every intermediate value of a graph lives: an arena of `arena_bytes` bytes, and for
/// each value that needs memory the buffer (offset and lifetime) it is written into.
struct memory_plan {
  /// The alignment the plan was made with.
  std::int64_t alignment = 64;
  /// The buffers, in the order of the positions that first write them.
  std::vector<planned_buffer> buffers;
  /// For each node position and output: the buffer it is written into, or -1 (graph inputs,
  /// views, waits, values derived from graph inputs, nodes without outputs).
  std::vector<std::vector<int>> buffer_of;
  /// Size of the arena: the planned peak.
  std::int64_t arena_bytes = 0;
  /// Largest sum of the sizes of the buffers live at one position: a lower bound of
  /// arena_bytes (equal when packing wastes nothing).
  std::int64_t live_peak_bytes = 0;
  /// The peak without the plan: each value its own allocation (no steals), freed after its last
  /// use (the same lifetimes); the largest sum of live value sizes at one position. It is at
  /// least live_peak_bytes, so arena_bytes stays at or below it whenever the packer reaches
  /// live_peak_bytes, which it does on every graph the tests generate (optimal packing is
  /// NP-hard, so this is what the packer aims for, not a theorem).
  std::int64_t unplanned_peak_bytes = 0;
  /// Sum of the sizes of every value that needs memory: the footprint with no reuse at all.
  std::int64_t total_bytes = 0;
  /// Number of nodes of the graph the plan was made for.
  std::size_t num_nodes = 0;
  /// The updated results (memory_plan_options::update_inputs) computed straight into their
  /// input's memory, by position: they have no buffer, and the executor writes them into the
  /// tensor passed as that input (when it is contiguous; else into memory of their own, and
  /// copies them after the run).
  std::vector<planned_update> updates_in_place;
  /// The cats whose inputs live in their output's buffer, by position.
  std::vector<elided_cat> elided_cats;

  /// The elided cat at `position`, or null.
  const elided_cat* elided_at(std::size_t position) const {
    const auto it = std::lower_bound(elided_cats.begin(), elided_cats.end(), position,
                                     [](const elided_cat& c, std::size_t p) { return c.position < p; });
    return it != elided_cats.end() && it->position == position ? &*it : nullptr;
  }

  /// The input that output `index` of the node at `position` is written into (an entry of
  /// updates_in_place), or null.
  const input_update* input_written_at(std::size_t position, int index = 0) const {
    for (const planned_update& u : updates_in_place)
      if (u.value.position == position && u.value.index == index) return &u.update;
    return nullptr;
  }

  /// The buffer output `index` of the node at `position` is written into, or null.
  const planned_buffer* buffer_at(std::size_t position, int index = 0) const {
    if (position >= buffer_of.size() || index < 0 || static_cast<std::size_t>(index) >= buffer_of[position].size())
      return nullptr;
    const int b = buffer_of[position][static_cast<std::size_t>(index)];
    return b < 0 ? nullptr : &buffers[static_cast<std::size_t>(b)];
  }
  /// True when output `index` of the node at `position` is an all_reduce result reduced in place
  /// into its input's buffer.
  bool is_stolen(std::size_t position, int index = 0) const {
    const planned_buffer* b = buffer_at(position, index);
    return b && (b->values.front().position != position || b->values.front().index != index);
  }
  /// Number of all_reduce outputs reduced in place.
  std::size_t num_steals() const {
    std::size_t s = 0;
    for (auto& b : buffers) s += b.values.size() - 1;
    return s;
  }

  /// Verifies the plan against `g` (the graph, in the order the plan was made for): every value
  /// that needs memory has a buffer large enough; each buffer's interval covers the lifetime of
  /// the values in it (uses through views and waits, collectives until their waits, graph
  /// outputs to the end); a value reduced in place is read by nothing but its all_reduce after
  /// that all_reduce is issued and is not a graph output; and no two buffers live at the same
  /// position share a byte, but for a buffer laid out inside an elided cat's, where it lies
  /// in its slice and is read by nothing after the cat. Returns false, with the reason in
  /// `*why`, if anything fails.
  bool check(const graph& g, std::string* why = nullptr) const;
};

namespace detail {

/// Liveness facts of a graph in its current order, shared by the planner and the checker, all
/// computed in one pass over the arguments (O(V + E)): each value's readers, and each node's
/// read_end.
struct liveness_info {
  const graph& g;
  std::size_t end = 0;  // the last position (the output node's)

  CCGRAPH_DECL explicit liveness_info(const graph& gr);

  /// Until when a node reading a value may still read it: its own position; for a collective,
  /// its last wait (the worker reads asynchronously), or the end when an output is not waited
  /// inside the graph; for the output node, the end (and past the run).
  std::size_t read_end(const node* r) const { return read_end_[g.position(r)]; }

  /// The nodes reading output `k` of the node at position `p`, each once, by position.
  CCGRAPH_DECL std::span<const node* const> readers(std::size_t p, int k) const;
  /// The nodes reading `v`, each once, by position.
  std::span<const node* const> readers(value_ref v) const { return readers(g.position(v.src), v.index); }

 private:
  std::size_t value_id(value_ref v) const { return value_begin_[g.position(v.src)] + static_cast<std::size_t>(v.index); }

  std::vector<std::size_t> value_begin_, reader_begin_, reader_end_, read_end_;
  std::vector<const node*> readers_;
};

inline std::int64_t align_up(std::int64_t v, std::int64_t a) { return (v + a - 1) / a * a; }

CCGRAPH_DECL std::int64_t value_bytes(const tensor_meta& m);

/// The layout of a value inside its buffer, in elements: what decides whether a reshape or a
/// contiguous copies. A storage-less tensor carries it through the tensor's own view methods.
using layout = tensor<float>;

inline layout contiguous_layout(const shape_t& s) { return layout(nullptr, s, contiguous_strides(s), 0); }

/// The layout of view node `n` applied to `in` (op_traits<O>::apply_view on a storage-less
/// tensor); `in` itself for a wait (identity).
CCGRAPH_DECL layout view_layout(const node& n, const layout& in);

/// True for nodes whose output 0 lives in input 0's buffer (views, waits), or would but for a
/// copy its layout forces (view_or_copy).
CCGRAPH_DECL bool aliases_input(const node& n);

/// How a node's outputs relate to memory.
enum class value_kind {
  external,  // a graph input, or derived from one without a foreseeable copy: never written
  alias,     // a view or wait of its first argument
  produced,  // written into a buffer of its own (or, for a stolen all_reduce output, its input's)
};

/// True for a view_or_copy node (reshape, contiguous) whose input layout forces a copy; only
/// meaningful when the input lives in a planned buffer (its layout is then known).
CCGRAPH_DECL bool copies(const node& n, const layout& in);

/// A buffer to pack: its size and its live interval.
struct pack_item {
  std::int64_t bytes;
  std::size_t first, last;
};

/// The items' live intervals, indexed by position so that finding the items live at the same
/// time as one costs O(log positions) plus what it finds, not a pass over every item: a segment
/// tree over the positions whose nodes list, in item order, the items that cover their whole
/// range (each item sits in O(log positions) nodes, and the items live at position t are those
/// on the path from leaf t to the root), and the items sorted by first position.
class interval_index {
 public:
  CCGRAPH_DECL explicit interval_index(const std::vector<pack_item>& items);
  /// Number of tree nodes (for `consumed` in take_live_at).
  std::size_t nodes() const { return 2 * leaves_; }
  /// Calls f(item) for every item live at position t.
  template <class F>
  void live_at(std::size_t t, F&& f) const {
    if (t >= leaves_) return;
    for (std::size_t k = t + leaves_; k >= 1; k /= 2)
      for (std::size_t p = begin_[k]; p < begin_[k + 1]; ++p) f(listed_[p]);
  }
  /// Calls f(item) for every item live at position t listed in a node not yet `consumed`, and
  /// marks those nodes consumed: over all t, each listing is visited once.
  template <class F>
  void take_live_at(std::size_t t, std::vector<char>& consumed, F&& f) const {
    if (t >= leaves_) return;
    for (std::size_t k = t + leaves_; k >= 1; k /= 2) {
      if (consumed[k]) continue;
      consumed[k] = 1;
      for (std::size_t p = begin_[k]; p < begin_[k + 1]; ++p) f(listed_[p]);
    }
  }
  /// Calls f(item) for every item whose first position is in (lo, hi]. With live_at(lo), every
  /// item live at some position of [lo, hi], each once.
  template <class F>
  void starting_in(std::size_t lo, std::size_t hi, F&& f) const {
    for (auto r = static_cast<std::size_t>(std::upper_bound(first_.begin(), first_.end(), lo) - first_.begin());
         r < first_.size() && first_[r] <= hi; ++r)
      f(by_first_[r]);
  }

 private:
  // The canonical nodes of [it.first, it.last].
  template <class F>
  void cover(const pack_item& it, F&& f) const {
    if (it.first > it.last) return;
    for (std::size_t l = it.first + leaves_, r = it.last + leaves_ + 1; l < r; l /= 2, r /= 2) {
      if (l & 1) f(l++);
      if (r & 1) f(--r);
    }
  }

  std::size_t leaves_ = 1;
  std::vector<std::size_t> begin_, listed_;  // node k lists listed_[begin_[k], begin_[k + 1])
  std::vector<std::size_t> by_first_, first_;  // items by first position, and those positions
};

/// Packs `items` into an arena: in `order`, each at the lowest offset (first fit) or in the
/// tightest gap (best fit) where it overlaps no placed item live at the same time. Returns the
/// offsets and the arena size. `index` indexes `items`; an item costs O(log positions +
/// k log k) for the k items live at some time with it (not a pass over every placed item).
CCGRAPH_DECL std::pair<std::vector<std::int64_t>, std::int64_t> pack(const std::vector<pack_item>& items,
                                                               const interval_index& index,
                                                               const std::vector<std::size_t>& order,
                                                               bool best_fit, std::int64_t alignment);

/// TensorFlow Lite's "greedy by breadth" order: positions by decreasing load, and at each the
/// items live there not yet ordered, largest first (ties in item order). `index` indexes
/// `items`; O(m log m + positions log positions) for m items.
CCGRAPH_DECL std::vector<std::size_t> breadth_order(const std::vector<pack_item>& items, const interval_index& index,
                                              std::size_t positions);

/// pack() for one order in one sweep over time: buffers placed as they start (by first
/// position, larger first on ties, then by index; or, `backward`, by last position from the
/// end), each in the tightest gap between the buffers live then, or on top of them. The
/// buffers live when an item starts are exactly the placed ones it overlaps, so this gives
/// pack()'s offsets for that order with best fit, in O(m log m) for m items, where pack()
/// costs O(m + k) per item for the k items live at some time with it.
CCGRAPH_DECL std::pair<std::vector<std::int64_t>, std::int64_t> pack_sweep(const std::vector<pack_item>& items,
                                                                     bool backward, std::int64_t alignment);

/// Pairs of items whose live intervals overlap (each item with itself included): what packing
/// in an arbitrary order costs. O(m log m).
CCGRAPH_DECL std::uint64_t overlapping_pairs(const std::vector<pack_item>& items);

/// The largest sum of the sizes of items live at one position.
CCGRAPH_DECL std::int64_t peak_load(const std::vector<pack_item>& items, std::size_t positions);

/// For each of `updates` (memory_plan_options::update_inputs), the position of the node that
/// can compute its result straight into the input's memory, or g.size() where the result must
/// be computed elsewhere and copied. It can when: the result is an output of an elementwise
/// node (detail::op_elementwise: a fused pointwise expression, fused_adamw; each reads element i
/// of its operands before it writes element i of its outputs) with the input's meta; the result
/// is returned once and no view of it is returned (nothing else hands out that memory); and
/// every read of the input's old value (through any view or wait of it, collectives until their
/// wait, the output node to the end) ends before that node, except that node's own reads of the
/// input itself (element i for element i; a view of the input read there could read another
/// element, so it refuses). Several outputs of one node may each be written into an input of
/// their own (fused_adamw's parameter and averages). Out-of-range indices give g.size() (the
/// executor reports them). O(V + E) for all updates together.
CCGRAPH_DECL std::vector<std::size_t> in_place_update_sites(const graph& g, const liveness_info& live,
                                                      const std::vector<input_update>& updates);

/// A value that allocates bytes (plan_values): the value, its meta, the buffer it is written
/// into, and its aliases (itself first, then the views and waits of it, in order).
struct planned_producer {
  planned_value value;
  tensor_meta meta;
  int buffer = -1;
  std::vector<value_ref> aliases;
};

/// What plan_memory decides before packing: the buffers with their lifetimes (offsets unset,
/// arena_bytes 0; live_peak_bytes, unplanned_peak_bytes and total_bytes set), each value's
/// producer, and the buffers as items to pack. The live peak is what the passes that trade
/// memory (schedule/recompute.hpp) measure. O(V + E) given `live` (made for `g`).
struct value_plan {
  memory_plan plan;
  std::vector<planned_producer> producers;
  /// Per node position and output: the producer whose bytes it is (or views), -1 external.
  std::vector<std::vector<int>> producer_of;
  /// Per buffer: its bytes and live interval.
  std::vector<pack_item> items;
};

/// Sets the offset of each buffer laid out in an elided cat's (planned_buffer::parent) from its
/// parent's, once the buffers without a parent are packed.
CCGRAPH_DECL void place_in_parents(memory_plan& plan);

/// The buffers, lifetimes and steals of plan_memory for `g` in its current order (see value_plan).
CCGRAPH_DECL value_plan plan_values(const graph& g, const liveness_info& live, const memory_plan_options& opt);

}  // namespace detail

/// Plans the memory of `g` in its current order (run it after the scheduling passes). Values
/// that need memory get buffers; an all_reduce (or each output of an all_reduce_coalesced)
/// whose input is an intermediate (not a graph input, not derived from one), read by nothing
/// else once the all_reduce is issued, read by the all_reduce once, laid out as its whole
/// buffer and not a graph output, reduces in place into that buffer. A cat along its outermost
/// dim of more than one element whose inputs are each the whole of a buffer of their own, of
/// its dtype, in no other cat, read by nothing else from the cat on and starting at a multiple
/// of the alignment, has them laid out in its own buffer (elided_cats). Graph inputs and values
/// still read elsewhere are never written. Buffers are packed into one arena, trying several
/// orders (largest first, earliest first, longest-lived first, largest area, TFLite's greedy by
/// breadth; best and first fit, then seeded random orders while above live_peak_bytes) and
/// keeping the smallest arena. When so many buffers are live at once that this would cost more
/// than O(m log m) for m buffers, the plan is the better of two sweeps over time (best fit as
/// buffers start, forward and backward). O((V + E) log V) in all.
CCGRAPH_DECL memory_plan plan_memory(const graph& g, const memory_plan_options& opt = {});

/// The plan as text: a summary line, then one line per buffer (its first value, bytes, offset,
/// live interval, whether it is a graph output) and one per value reduced in place into it.
CCGRAPH_DECL std::string to_string(const memory_plan& p);

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/memory_plan.ipp>
#endif
