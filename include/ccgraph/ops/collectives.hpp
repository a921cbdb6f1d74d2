// ccgraph/ops/collectives.hpp: the functional collectives of PyTorch's _functional_collectives.
// Inputs are never modified and results are pending, waited at first use. Each function is
// written once for every kind of value: on tensors it launches on the calling rank's
// communicator; on symbolic values (inside cg::trace) it records the collective and its wait.
// Either way it validates through the op's one definition (ops::infer). Each takes a last,
// defaulted std::source_location: where the user called it, which the recorded node and the
// launched request carry, so that a mismatch names the file and line of every rank's call
// (core/source_location.hpp). Callers never pass it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <source_location>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/core/source_location.hpp>
#include <ccgraph/expr/fwd.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/ops/comm_counter.hpp>
#include <ccgraph/ops/shape_ops.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {
namespace detail {

template <class T>
buffer to_buffer(const tensor<T>& t) {
  return {t.storage(), t.storage_offset(), {dtype_v<T>, t.shape()}};
}

/// Launches `op` on `inputs` over the resolved group `gi` on `ctx`'s communicator; returns one
/// pending output per op output. Eager calls and the graph executor both launch through here.
/// Inputs that are not contiguous are copied first (as PyTorch requires contiguous inputs);
/// pending contiguous inputs are passed without waiting, since a rank's collectives run in
/// issue order. With `into` (one contiguous tensor per op output, of the inferred shapes: the
/// executor's planned buffers) the results are written there instead of into new tensors; an
/// output may share its bytes with its own input (an in-place all_reduce), which every backend
/// supports. `overlap`: see collective_request::overlap. `timed`: see collective_request::timed.
template <class T>
std::vector<tensor<T>> launch_collective(rank_context& ctx, const char* what, ops::collective_op op,
                                         group_info gi, const std::vector<tensor<T>>& inputs,
                                         const std::vector<tensor<T>>* into = nullptr,
                                         overlap_hint overlap = overlap_hint::unknown,
                                         work_ptr* launched = nullptr, bool timed = false) {
  // Before anything reaches a backend, which indexes its peers by the group's ranks: a graph
  // traced for another world or rank carries groups this rank cannot run.
  check_group_fits(what, gi, ctx.rank(), ctx.world_size());
  auto req = std::make_shared<collective_request>();
  req->group = std::move(gi);
  req->overlap = overlap;
  req->timed = timed;
  req->source = current_call_site();
  std::vector<tensor_meta> metas;
  metas.reserve(inputs.size());
  for (auto& t : inputs) {
    CCGRAPH_CHECK(t.device() == ctx.device(), what, ": input on ", t.device(), " but rank ",
                  ctx.rank(), " runs on ", ctx.device());
    auto c = t.contiguous();
    req->inputs.push_back(to_buffer(c));
    metas.push_back(req->inputs.back().meta);
  }
  const std::vector<tensor_meta> out_metas = ops::infer(op, metas, req->group);
  std::vector<tensor<T>> outs;
  outs.reserve(out_metas.size());
  if (into) {
    CCGRAPH_CHECK(into->size() == out_metas.size(), what, ": ", into->size(), " output buffers for ",
                  out_metas.size(), " outputs");
    for (std::size_t k = 0; k < out_metas.size(); ++k) {
      const tensor<T>& o = (*into)[k];
      CCGRAPH_CHECK(o.shape() == out_metas[k].shape && o.is_contiguous() && o.device() == ctx.device(), what,
                    ": output buffer ", k, " of shape ", shape_str(o.shape()),
                    " is not a contiguous tensor of the result's shape ", shape_str(out_metas[k].shape),
                    " on ", ctx.device());
      outs.push_back(o);
    }
  } else {
    for (std::size_t k = 0; k < out_metas.size(); ++k) {
      try {
        outs.push_back(tensor<T>::empty(out_metas[k].shape, ctx.device(), what));
      } catch (const error& e) {  // say which collective, with the attributes (split sizes) that sized it
        CCGRAPH_THROW(error, e.what(), " (output ", k, " of ", ops::describe(op, metas, req->group), ")");
      }
    }
  }
  for (auto& o : outs) req->outputs.push_back(to_buffer(o));
  req->op = std::move(op);
  work_ptr w = ctx.comm().launch(std::move(req));
  if (launched) *launched = w;
  for (auto& o : outs) o = tensor<T>(o.storage(), o.shape(), o.strides(), o.storage_offset(), w);
  return outs;
}

/// How values of type V take part in collectives: the calling rank's view of a group, and
/// issuing. Specialised for tensor<T> here (launch on the rank's communicator) and for
/// symbolic<T> by the tracer (record nodes against its fake world).
template <class V>
struct collective_backend;

template <class T>
struct collective_backend<tensor<T>> {
  static group_info resolve(const group& g, const char* what) { return current_rank(what).resolve(g, what); }
  static int rank(const char* what) { return current_rank(what).rank(); }
  static std::vector<tensor<T>> issue(const char* what, ops::collective_op op, const group_info& gi,
                                      const std::vector<tensor<T>>& inputs) {
    return launch_collective<T>(current_rank(what), what, std::move(op), gi, inputs);
  }
};

/// The value an operand stands for: a tensor or symbolic value as is; an expression evaluated
/// (or, when traced, materialised as one fused node).
template <class X>
auto as_value(const X& x) {
  using V = std::remove_cvref_t<X>;
  if constexpr (is_tensor_v<V> || is_symbolic_v<V>) return x;
  else if constexpr (is_traced_v<V>) return symbolic<typename V::value_type>(x);
  else return x.eval();
}

/// Issues a functional collective on tensors or symbolic values: the one place collectives are
/// counted (comm_counter), after the group resolved.
template <class V>
std::vector<V> issue(const char* what, ops::collective_op op, const group& g, const std::vector<V>& inputs) {
  const group_info gi = collective_backend<V>::resolve(g, what);
  note_collective(ops::name_of(op));
  return collective_backend<V>::issue(what, std::move(op), gi, inputs);
}

template <class V>
V issue_one(const char* what, ops::collective_op op, const group& g, const V& input) {
  return std::move(issue<V>(what, std::move(op), g, {input}).front());
}

template <class V>
int group_size_of(const group& g, const char* what) {
  return collective_backend<V>::resolve(g, what).size();
}

/// Chunks `t` into `n` pieces along `from_dim` and concatenates them along `to_dim`: how gather
/// and scatter on dim != 0 are built from the dim-0 collectives, as in PyTorch.
template <class V>
V regroup(const V& t, int n, int from_dim, int to_dim) {
  return cat(t.chunk(n, from_dim), to_dim);
}

}  // namespace detail

/// What collectives take: a tensor, a symbolic value, or a lazy expression of either.
template <class X>
concept collective_input =
    tensor_type<X> || expression<X> || is_symbolic_v<std::remove_cvref_t<X>>;

/// Reduces `t` across the group; every member gets the result. The input is left unmodified;
/// the result is pending until first used.
template <collective_input X>
auto all_reduce(const X& t, reduce_op_arg op, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  return detail::issue_one("all_reduce", ops::all_reduce{op}, g, detail::as_value(t));
}

/// Gathers every member's `t` and concatenates along `gather_dim` (dim 0 natively; other dims
/// gather on dim 0, then chunk and concatenate, which waits).
template <collective_input X>
auto all_gather_tensor(const X& x, std::int64_t gather_dim, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  auto t = detail::as_value(x);
  using V = decltype(t);
  const int dim = normalize_dim(gather_dim, t.shape().size(), "all_gather_tensor");
  const int n = detail::group_size_of<V>(g, "all_gather_tensor");
  auto out = detail::issue_one("all_gather_into_tensor", ops::all_gather_into_tensor{n}, g, t);
  if (dim == 0) return out;
  return detail::regroup(out, n, 0, dim);
}

/// Reduces `t` across the group and gives member i chunk i along `scatter_dim`, whose size must
/// be a multiple of the group size.
template <collective_input X>
auto reduce_scatter_tensor(const X& x, reduce_op_arg op, std::int64_t scatter_dim, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  auto t = detail::as_value(x);
  using V = decltype(t);
  CCGRAPH_CHECK(!t.shape().empty(), "reduce_scatter_tensor: the input must have at least one "
                "dimension, got a 0-d tensor");
  const int dim = normalize_dim(scatter_dim, t.shape().size(), "reduce_scatter_tensor");
  const int n = detail::group_size_of<V>(g, "reduce_scatter_tensor");
  ops::detail::check_group_multiple("reduce_scatter_tensor", scatter_dim, static_cast<std::size_t>(dim), t.shape(), n);
  auto in = dim == 0 ? t : detail::regroup(t, n, dim, 0);
  return detail::issue_one("reduce_scatter_tensor", ops::reduce_scatter_tensor{op, n}, g, in);
}

/// Splits `t` along dim 0 by `input_split_sizes` and sends piece j to member j; receives
/// `output_split_sizes[j]` rows from member j. Both sizes are given or neither (even split).
template <collective_input X>
auto all_to_all_single(const X& x, std::optional<std::vector<std::int64_t>> output_split_sizes,
                       std::optional<std::vector<std::int64_t>> input_split_sizes, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  auto t = detail::as_value(x);
  using V = decltype(t);
  CCGRAPH_CHECK(output_split_sizes.has_value() == input_split_sizes.has_value(),
                "all_to_all_single: output_split_sizes and input_split_sizes must either be "
                "specified together or both set to None (got ",
                output_split_sizes ? list_str(*output_split_sizes) : std::string("None"), " and ",
                input_split_sizes ? list_str(*input_split_sizes) : std::string("None"), ")");
  if (!output_split_sizes) {
    const int n = detail::group_size_of<V>(g, "all_to_all_single");
    ops::detail::check_group_multiple("all_to_all_single", 0, 0, t.shape(), n, " when no split sizes are given");
    std::vector<std::int64_t> even(static_cast<std::size_t>(n), t.shape()[0] / n);
    output_split_sizes = even;
    input_split_sizes = even;
  }
  return detail::issue_one(
      "all_to_all_single",
      ops::all_to_all_single{std::move(*output_split_sizes), std::move(*input_split_sizes)}, g, t);
}

/// Every member gets the tensor of global rank `src`.
template <collective_input X>
auto broadcast(const X& t, int src, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  return detail::issue_one("broadcast", ops::broadcast{src}, g, detail::as_value(t));
}

/// Sends this rank's tensor to member `src_dst[i]` where i is this rank's index in the group,
/// and receives from the member that maps to it. `src_dst` must be a permutation of the group
/// indices. Built on all_to_all_single, as in PyTorch.
template <collective_input X>
auto permute_tensor(const X& x, const std::vector<int>& src_dst, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  auto t = detail::as_value(x);
  using B = detail::collective_backend<decltype(t)>;
  const group_info gi = B::resolve(g, "permute_tensor");
  const int n = gi.size();
  CCGRAPH_CHECK(static_cast<int>(src_dst.size()) == n, "permute_tensor: src_dst ",
                list_str(src_dst), " has ", src_dst.size(), " entries for group_size ", n);
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  for (int d : src_dst) {
    CCGRAPH_CHECK(d >= 0 && d < n, "permute_tensor: destination ", d, " in ", list_str(src_dst),
                  " is out of range for group_size ", n);
    CCGRAPH_CHECK(!seen[static_cast<std::size_t>(d)], "permute_tensor: destination ", d,
                  " appears twice in ", list_str(src_dst), "; src_dst must be a permutation");
    seen[static_cast<std::size_t>(d)] = true;
  }
  const int me = gi.index_of(B::rank("permute_tensor"));
  const std::int64_t numel = t.numel();
  std::vector<std::int64_t> out_splits(static_cast<std::size_t>(n), 0), in_splits(static_cast<std::size_t>(n), 0);
  for (int src = 0; src < n; ++src) {
    if (src == me) in_splits[static_cast<std::size_t>(src_dst[static_cast<std::size_t>(src)])] = numel;
    if (src_dst[static_cast<std::size_t>(src)] == me) out_splits[static_cast<std::size_t>(src)] = numel;
  }
  const shape_t shape = t.shape();
  return detail::issue_one("permute_tensor", ops::all_to_all_single{out_splits, in_splits}, g,
                           t.reshape({numel}))
      .reshape(shape);
}

/// all_reduce of several tensors in one launch; one pending output per input.
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
std::vector<V> all_reduce_coalesced(const std::vector<V>& ts, reduce_op_arg op, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  return detail::issue<V>("all_reduce_coalesced", ops::all_reduce_coalesced{op}, g, ts);
}

/// all_gather (dim 0) of several tensors in one launch; one pending output per input.
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
std::vector<V> all_gather_into_tensor_coalesced(const std::vector<V>& ts, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  const int n = detail::group_size_of<V>(g, "all_gather_into_tensor_coalesced");
  return detail::issue<V>("all_gather_into_tensor_coalesced", ops::all_gather_into_tensor_coalesced{n}, g, ts);
}

/// reduce_scatter of several tensors in one launch, tensor i scattered along `scatter_dims[i]`.
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
std::vector<V> reduce_scatter_tensor_coalesced(const std::vector<V>& ts, reduce_op_arg op,
                                               const std::vector<std::int64_t>& scatter_dims,
                                               const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  const char* what = "reduce_scatter_tensor_coalesced";
  CCGRAPH_CHECK(scatter_dims.size() == ts.size(), what, ": ", scatter_dims.size(),
                " scatter dims for ", ts.size(), " tensors");
  const int n = detail::group_size_of<V>(g, what);
  std::vector<V> ins;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    CCGRAPH_CHECK(!ts[i].shape().empty(), what, ": the input must have at least one dimension, "
                  "got a 0-d tensor at index ", i);
    const int dim = normalize_dim(scatter_dims[i], ts[i].shape().size(), what);
    ops::detail::check_group_multiple(what, scatter_dims[i], static_cast<std::size_t>(dim), ts[i].shape(), n,
                                      " for tensor at index " + std::to_string(i));
    ins.push_back(dim == 0 ? ts[i] : detail::regroup(ts[i], n, dim, 0));
  }
  return detail::issue<V>(what, ops::reduce_scatter_tensor_coalesced{op, n}, g, ins);
}

// ---- point-to-point (c10d's isend/irecv, batch_isend_irecv, send, recv) ----

/// One transfer of a batch (c10d's P2POp): send `tensor` to global rank `peer`, or receive a
/// tensor shaped like `tensor` from it. Made by isend and irecv.
template <class V>
struct p2p_op {
  bool is_send = true;
  V tensor;
  int peer = 0;
};

/// Describes sending `t` to global rank `dst`, for batch_isend_irecv.
template <collective_input X>
auto isend(const X& t, int dst) {
  auto v = detail::as_value(t);
  return p2p_op<decltype(v)>{true, std::move(v), dst};
}

/// Describes receiving from global rank `src` a tensor of `like`'s shape and dtype (its values
/// are not read), for batch_isend_irecv.
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
p2p_op<V> irecv(const V& like, int src) {
  return p2p_op<V>{false, like, src};
}

/// Launches the transfers of `ops` over group `g` together (one NCCL group), so their order
/// within the batch cannot deadlock; every peer must be another member of `g`. Returns one
/// pending tensor per irecv, in order; they complete with the whole batch (its sends too). A
/// batch without an irecv is waited before returning. Every send must meet a receive of the
/// same shape and dtype on its peer (the k-th send from a to b meets the k-th receive on b from
/// a); a mismatch or a missing peer is an error on both ranks, never a hang.
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
std::vector<V> batch_isend_irecv(const std::vector<p2p_op<V>>& ops, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  const char* what = "batch_isend_irecv";
  using B = detail::collective_backend<V>;
  const group_info gi = B::resolve(g, what);
  const int me = B::rank(what);
  ops::batch_isend_irecv op;
  std::vector<V> inputs;
  bool any_recv = false;
  for (const auto& o : ops) {
    CCGRAPH_CHECK(o.peer != me, what, ": Invalid ", o.is_send ? "destination" : "source", " rank: ",
                  o.is_send ? "destination" : "source", " rank ", o.peer,
                  " should not be the same as the rank of the current process");
    op.ops.push_back({o.is_send, o.peer, {dtype_v<typename V::value_type>, o.tensor.shape()}});
    if (o.is_send) inputs.push_back(o.tensor);
    any_recv = any_recv || !o.is_send;
  }
  detail::note_collective(ops::batch_isend_irecv::name);  // not through detail::issue: see below
  if constexpr (is_tensor_v<V>) {
    detail::work_ptr w;
    auto outs = detail::launch_collective<typename V::value_type>(detail::current_rank(what), what, std::move(op), gi,
                                                                   inputs, nullptr, detail::overlap_hint::unknown, &w);
    if (!any_recv) w->wait();
    return outs;
  } else {
    return B::issue(what, std::move(op), gi, inputs);
  }
}

/// batch_isend_irecv of a braced list: `batch_isend_irecv({isend(x, 1), irecv(y, 1)}, g)`.
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
std::vector<V> batch_isend_irecv(std::initializer_list<p2p_op<V>> ops, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  return batch_isend_irecv(std::vector<p2p_op<V>>(ops), g);
}

/// Sends `t` to global rank `dst` of group `g` and returns once it is sent (c10d's send).
template <collective_input X>
void send(const X& t, int dst, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  auto v = detail::as_value(t);
  (void)batch_isend_irecv(std::vector<p2p_op<decltype(v)>>{{true, v, dst}}, g);
}

/// Receives from global rank `src` of group `g` a tensor of `like`'s shape and dtype (c10d's
/// recv, functional: `like` is not written); returns it received.
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
V recv(const V& like, int src, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  V r = std::move(batch_isend_irecv(std::vector<p2p_op<V>>{{false, like, src}}, g).front());
  if constexpr (is_tensor_v<V>) r.wait();
  return r;
}

// ---- the rest of c10d: reduce, gather, scatter, barrier, list forms ----

/// Reduces `t` across the group to global rank `dst` (c10d's reduce): `dst` gets the
/// reduction; every other member gets its own `t` back. Pending until first used.
template <collective_input X>
auto reduce(const X& t, int dst, reduce_op_arg op, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  return detail::issue_one("reduce", ops::reduce{op, dst}, g, detail::as_value(t));
}

namespace detail {
/// batch_isend_irecv, or nothing for an empty batch (a group of one).
template <class V>
std::vector<V> batch_or_nothing(const std::vector<p2p_op<V>>& ops, const group& g) {
  if (ops.empty()) return {};
  return batch_isend_irecv(ops, g);
}
}  // namespace detail

/// Gathers every member's `t` to global rank `dst` (c10d's gather, on NCCL its grouped
/// send/recv): on `dst` one tensor per member in group order (its own entry is its `t`), on
/// every other member an empty list once its `t` is sent. Every member's `t` must have the
/// same shape and dtype (else both ends of the transfer fail).
template <collective_input X>
auto gather(const X& x, int dst, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  auto t = detail::as_value(x);
  using V = decltype(t);
  using B = detail::collective_backend<V>;
  const group_info gi = B::resolve(g, "gather");
  const int me = B::rank("gather");
  CCGRAPH_CHECK(gi.index_of(dst) >= 0, "gather: dst rank ", dst, " is not a member of group ", list_str(gi.ranks));
  std::vector<p2p_op<V>> ops;
  if (me != dst) {
    ops.push_back(isend(t, dst));
    (void)detail::batch_or_nothing(ops, g);
    return std::vector<V>{};
  }
  for (int r : gi.ranks)
    if (r != me) ops.push_back(irecv(t, r));
  auto got = detail::batch_or_nothing(ops, g);
  std::vector<V> out;
  std::size_t k = 0;
  for (int r : gi.ranks) out.push_back(r == me ? t : std::move(got[k++]));
  return out;
}

/// Scatters global rank `src`'s `t` along dim 0 (c10d's scatter): member i gets chunk i of
/// `src`'s tensor. Every member passes a tensor of the same shape and dtype (elsewhere than on
/// `src` only its shape and dtype are read), whose dim 0 is a multiple of the group size.
template <collective_input X>
auto scatter(const X& x, int src, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  auto t = detail::as_value(x);
  using V = decltype(t);
  using B = detail::collective_backend<V>;
  const group_info gi = B::resolve(g, "scatter");
  const int me = B::rank("scatter"), n = gi.size();
  CCGRAPH_CHECK(gi.index_of(src) >= 0, "scatter: src rank ", src, " is not a member of group ", list_str(gi.ranks));
  CCGRAPH_CHECK(!t.shape().empty() && t.shape()[0] % n == 0, "scatter: dim 0 (size ",
                t.shape().empty() ? 0 : t.shape()[0], ") must be a multiple of group_size ", n);
  const std::vector<V> chunks = t.chunk(n, 0);
  const auto mine = static_cast<std::size_t>(gi.index_of(me));
  std::vector<p2p_op<V>> ops;
  if (me == src) {
    for (std::size_t i = 0; i < chunks.size(); ++i)
      if (i != mine) ops.push_back(isend(chunks[i], gi.ranks[i]));
    (void)detail::batch_or_nothing(ops, g);
    return chunks[mine];
  }
  ops.push_back(irecv(chunks[mine], src));
  return std::move(detail::batch_or_nothing(ops, g).front());
}

/// Gathers every member's `t` into a list, one tensor per member in group order (c10d's
/// all_gather into a tensor list): all_gather_into_tensor, then its chunks.
template <collective_input X>
auto all_gather(const X& x, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  auto t = detail::as_value(x);
  using V = decltype(t);
  const int n = detail::group_size_of<V>(g, "all_gather");
  CCGRAPH_CHECK(!t.shape().empty(), "all_gather: the input must have at least one dimension, got a 0-d tensor");
  return all_gather_tensor(t, 0, g).chunk(n, 0);
}

/// c10d's all_to_all of tensor lists: sends `inputs[j]` to member j and receives from member j a
/// tensor shaped like `outputs_like[j]` (both lists one entry per member, in group order; on
/// NCCL grouped send/recv). Returns the received tensors; this member's own entry is its
/// `inputs[j]`, which must then have `outputs_like[j]`'s shape.
template <class V>
  requires tensor_type<V> || is_symbolic_v<V>
std::vector<V> all_to_all(const std::vector<V>& outputs_like, const std::vector<V>& inputs, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  using B = detail::collective_backend<V>;
  const group_info gi = B::resolve(g, "all_to_all");
  const int me = B::rank("all_to_all"), n = gi.size();
  CCGRAPH_CHECK(static_cast<int>(inputs.size()) == n, "all_to_all: input_tensor_list has ", inputs.size(),
                " tensors for group_size ", n);
  CCGRAPH_CHECK(static_cast<int>(outputs_like.size()) == n, "all_to_all: output_tensor_list has ",
                outputs_like.size(), " tensors for group_size ", n);
  const auto mine = static_cast<std::size_t>(gi.index_of(me));
  CCGRAPH_CHECK(inputs[mine].shape() == outputs_like[mine].shape(), "all_to_all: rank ", me, " sends itself ",
                shape_str(inputs[mine].shape()), " but expects ", shape_str(outputs_like[mine].shape()));
  std::vector<p2p_op<V>> ops;
  for (std::size_t j = 0; j < inputs.size(); ++j)
    if (j != mine) {
      ops.push_back(isend(inputs[j], gi.ranks[j]));
      ops.push_back(irecv(outputs_like[j], gi.ranks[j]));
    }
  auto got = detail::batch_or_nothing(ops, g);
  std::vector<V> out;
  std::size_t k = 0;
  for (std::size_t j = 0; j < inputs.size(); ++j) out.push_back(j == mine ? inputs[j] : std::move(got[k++]));
  return out;
}

/// Blocks until every member of `g` has called it (c10d's barrier, which on NCCL is an
/// all_reduce of one element): an all_reduce of one byte on the calling rank's device, waited.
CCGRAPH_DECL void barrier(const group& g, std::source_location loc = std::source_location::current());

/// Waits until `t` is computed and returns it; a no-op on a tensor that is not pending.
template <element T>
const tensor<T>& wait_tensor(const tensor<T>& t) {
  t.wait();
  return t;
}

// ---- in-place, c10d style: the functional op, its wait, and a copy ----

namespace detail {
inline void check_out_shape(const char* what, const shape_t& out, const shape_t& expected) {
  CCGRAPH_CHECK(out == expected, what, ": output shape ", shape_str(out),
                " does not match the expected shape ", shape_str(expected));
}

/// dst.copy_(src) for tensors (a handle to dst's memory is returned); for symbolic values a
/// copy node, which a non-const lvalue `dst` then stands for (functionalised in-place update).
template <class D, class V>
std::remove_cvref_t<D> copy_into(D&& dst, const V& src) {
  using U = std::remove_cvref_t<D>;
  if constexpr (is_tensor_v<U>) {
    U h = dst;
    h.copy_(src);
    return h;
  } else {
    U result = copy(dst, src);
    if constexpr (std::is_lvalue_reference_v<D> && !std::is_const_v<std::remove_reference_t<D>>) dst = result;
    return result;
  }
}

/// Tensors and symbolic values, by any reference.
template <class D>
concept inplace_target = tensor_type<D> || is_symbolic_v<std::remove_cvref_t<D>>;
}  // namespace detail

/// Reduces `t` across the group in place (c10d's all_reduce); returns `t` when done.
template <detail::inplace_target D>
std::remove_cvref_t<D> all_reduce_(D&& t, reduce_op_arg op, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  auto r = all_reduce(t, op, g);
  return detail::copy_into(std::forward<D>(t), r);
}

/// Gathers every member's `in` along dim 0 into `out` (c10d's all_gather_into_tensor).
template <detail::inplace_target D>
std::remove_cvref_t<D> all_gather_into_tensor(D&& out, const std::remove_cvref_t<D>& in, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  using V = std::remove_cvref_t<D>;
  shape_t expected = in.shape();
  CCGRAPH_CHECK(!expected.empty(), "all_gather_into_tensor: the input must have at least one dimension");
  const int n = detail::group_size_of<V>(g, "all_gather_into_tensor");
  CCGRAPH_CHECK(checked_mul(in.shape()[0], n, expected[0]), "all_gather_into_tensor: dim 0 (size ",
                in.shape()[0], ") times group_size ", n, " exceeds 2^63 - 1");
  // Checked before launching, so no peer is left waiting on a collective we then abandon.
  detail::check_out_shape("all_gather_into_tensor", out.shape(), expected);
  auto r = all_gather_tensor(in, 0, g);
  return detail::copy_into(std::forward<D>(out), r);
}

/// Reduce-scatters `in` along dim 0 into `out` (c10d's reduce_scatter_tensor).
template <detail::inplace_target D>
std::remove_cvref_t<D> reduce_scatter_tensor_(D&& out, const std::remove_cvref_t<D>& in, reduce_op_arg op,
                                              const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  using V = std::remove_cvref_t<D>;
  shape_t expected = in.shape();
  const int n = detail::group_size_of<V>(g, "reduce_scatter_tensor");
  ops::detail::check_group_multiple("reduce_scatter_tensor", 0, 0, expected, n);
  expected[0] /= n;
  detail::check_out_shape("reduce_scatter_tensor", out.shape(), expected);
  auto r = reduce_scatter_tensor(in, op, 0, g);
  return detail::copy_into(std::forward<D>(out), r);
}

/// All-to-all of `in` into `out` (c10d's all_to_all_single).
template <detail::inplace_target D>
std::remove_cvref_t<D> all_to_all_single_(D&& out, const std::remove_cvref_t<D>& in, std::optional<std::vector<std::int64_t>> output_split_sizes,
                     std::optional<std::vector<std::int64_t>> input_split_sizes, const group& g,
    std::source_location loc = std::source_location::current()) {
  detail::call_site_scope site(loc);
  shape_t expected = in.shape();
  CCGRAPH_CHECK(!expected.empty(), "all_to_all_single: the input must have at least one dimension");
  if (output_split_sizes)
    expected[0] = ops::detail::sum_splits("all_to_all_single", *output_split_sizes, "output_split_sizes");
  detail::check_out_shape("all_to_all_single", out.shape(), expected);
  auto r = all_to_all_single(in, std::move(output_split_sizes), std::move(input_split_sizes), g);
  return detail::copy_into(std::forward<D>(out), r);
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/collectives.ipp>
#endif
