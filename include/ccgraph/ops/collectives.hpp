// ccgraph/ops/collectives.hpp: the functional collectives of PyTorch's _functional_collectives,
// eagerly: inputs are never modified and results are pending tensors, waited at first use.
// Each call resolves its group, validates through the op's one definition (ops::infer) and
// launches on the calling rank's communicator.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/expr/fwd.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/runtime/rank_context.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {
namespace detail {

template <class T>
buffer to_buffer(const tensor<T>& t) {
  return {t.storage(), t.storage_offset(), {dtype_v<T>, t.shape()}};
}

/// Launches `op` on `inputs` over `g` from the calling rank; returns one pending output per
/// op output. Inputs that are not contiguous are copied first (as PyTorch requires contiguous
/// inputs); pending contiguous inputs are passed without waiting, since a rank's collectives
/// run in issue order.
template <class T>
std::vector<tensor<T>> launch_collective(const char* what, ops::collective_op op, const group& g,
                                         const std::vector<tensor<T>>& inputs) {
  rank_context& ctx = current_rank(what);
  auto req = std::make_shared<collective_request>();
  req->group = ctx.resolve(g, what);
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
  for (auto& m : out_metas) {
    outs.push_back(tensor<T>::empty(m.shape));
    req->outputs.push_back(to_buffer(outs.back()));
  }
  req->op = std::move(op);
  work_ptr w = ctx.comm().launch(std::move(req));
  for (auto& o : outs) o = tensor<T>(o.storage(), o.shape(), o.strides(), 0, w);
  return outs;
}

template <class T>
tensor<T> launch_one(const char* what, ops::collective_op op, const group& g, const tensor<T>& t) {
  return std::move(launch_collective<T>(what, std::move(op), g, {t}).front());
}

/// Group size as the calling rank sees `g` (needs the rank's registry for names).
inline int group_size_of(const group& g, const char* what) {
  rank_context& ctx = current_rank(what);
  return ctx.resolve(g, what).size();
}

/// Chunks `t` into `n` pieces along `dim` and concatenates them along dim 0 (or the reverse):
/// how gather and scatter on dim != 0 are built from the dim-0 collectives, as in PyTorch.
template <class T>
tensor<T> regroup(const tensor<T>& t, int n, int from_dim, int to_dim) {
  auto pieces = t.chunk(n, from_dim);
  shape_t shape = pieces.front().shape();
  shape[static_cast<std::size_t>(to_dim)] = 0;
  for (auto& p : pieces) shape[static_cast<std::size_t>(to_dim)] += p.shape()[static_cast<std::size_t>(to_dim)];
  auto out = tensor<T>::empty(shape);
  std::int64_t at = 0;
  for (auto& p : pieces) {
    const auto len = p.shape()[static_cast<std::size_t>(to_dim)];
    out.narrow(to_dim, at, len).copy_(p);
    at += len;
  }
  return out;
}

template <class X>
auto as_tensor(const X& x) {
  if constexpr (is_expression_v<X>) return x.eval();
  else return x;
}

}  // namespace detail

/// A tensor or a lazy expression (evaluated before the collective).
template <class X>
concept collective_input = tensor_type<X> || expression<X>;

/// Reduces `t` across the group; every member gets the result. The input is left unmodified;
/// the result is pending until first used.
template <collective_input X>
auto all_reduce(const X& t, reduce_op_arg op, const group& g) {
  return detail::launch_one("all_reduce", ops::all_reduce{op}, g, detail::as_tensor(t));
}

/// Gathers every member's `t` and concatenates along `gather_dim` (dim 0 natively; other dims
/// gather on dim 0, then chunk and concatenate, which waits).
template <collective_input X>
auto all_gather_tensor(const X& x, std::int64_t gather_dim, const group& g) {
  auto t = detail::as_tensor(x);
  const int dim = normalize_dim(gather_dim, t.shape().size(), "all_gather_tensor");
  const int n = detail::group_size_of(g, "all_gather_tensor");
  auto out = detail::launch_one("all_gather_into_tensor", ops::all_gather_into_tensor{n}, g, t);
  if (dim == 0) return out;
  return detail::regroup(out, n, 0, dim);
}

/// Reduces `t` across the group and gives member i chunk i along `scatter_dim`, whose size must
/// be a multiple of the group size.
template <collective_input X>
auto reduce_scatter_tensor(const X& x, reduce_op_arg op, std::int64_t scatter_dim, const group& g) {
  auto t = detail::as_tensor(x);
  CCGRAPH_CHECK(t.dim() > 0, "reduce_scatter_tensor: the input must have at least one dimension, "
                "got a 0-d tensor");
  const int dim = normalize_dim(scatter_dim, t.shape().size(), "reduce_scatter_tensor");
  const int n = detail::group_size_of(g, "reduce_scatter_tensor");
  CCGRAPH_CHECK(t.shape()[static_cast<std::size_t>(dim)] % n == 0, "reduce_scatter_tensor: dim ",
                scatter_dim, " (size ", t.shape()[static_cast<std::size_t>(dim)],
                ") must be a multiple of group_size ", n);
  auto in = dim == 0 ? t : detail::regroup(t, n, dim, 0);
  return detail::launch_one("reduce_scatter_tensor", ops::reduce_scatter_tensor{op, n}, g, in);
}

/// Splits `t` along dim 0 by `input_split_sizes` and sends piece j to member j; receives
/// `output_split_sizes[j]` rows from member j. Both sizes are given or neither (even split).
template <collective_input X>
auto all_to_all_single(const X& x, std::optional<std::vector<std::int64_t>> output_split_sizes,
                       std::optional<std::vector<std::int64_t>> input_split_sizes, const group& g) {
  auto t = detail::as_tensor(x);
  CCGRAPH_CHECK(output_split_sizes.has_value() == input_split_sizes.has_value(),
                "all_to_all_single: output_split_sizes and input_split_sizes must either be "
                "specified together or both set to None (got ",
                output_split_sizes ? list_str(*output_split_sizes) : std::string("None"), " and ",
                input_split_sizes ? list_str(*input_split_sizes) : std::string("None"), ")");
  if (!output_split_sizes) {
    const int n = detail::group_size_of(g, "all_to_all_single");
    CCGRAPH_CHECK(!t.shape().empty() && t.shape()[0] % n == 0, "all_to_all_single: dim 0 (size ",
                  t.shape().empty() ? 0 : t.shape()[0], ") must be a multiple of group_size ", n,
                  " when no split sizes are given");
    std::vector<std::int64_t> even(static_cast<std::size_t>(n), t.shape()[0] / n);
    output_split_sizes = even;
    input_split_sizes = even;
  }
  return detail::launch_one(
      "all_to_all_single",
      ops::all_to_all_single{std::move(*output_split_sizes), std::move(*input_split_sizes)}, g, t);
}

/// Every member gets the tensor of global rank `src`.
template <collective_input X>
auto broadcast(const X& t, int src, const group& g) {
  return detail::launch_one("broadcast", ops::broadcast{src}, g, detail::as_tensor(t));
}

/// Sends this rank's tensor to member `src_dst[i]` where i is this rank's index in the group,
/// and receives from the member that maps to it. `src_dst` must be a permutation of the group
/// indices. Built on all_to_all_single, as in PyTorch.
template <collective_input X>
auto permute_tensor(const X& x, const std::vector<int>& src_dst, const group& g) {
  auto t = detail::as_tensor(x);
  rank_context& ctx = detail::current_rank("permute_tensor");
  const group_info gi = ctx.resolve(g, "permute_tensor");
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
  const int me = gi.index_of(ctx.rank());
  const std::int64_t numel = t.numel();
  std::vector<std::int64_t> out_splits(static_cast<std::size_t>(n), 0), in_splits(static_cast<std::size_t>(n), 0);
  for (int src = 0; src < n; ++src) {
    if (src == me) in_splits[static_cast<std::size_t>(src_dst[static_cast<std::size_t>(src)])] = numel;
    if (src_dst[static_cast<std::size_t>(src)] == me) out_splits[static_cast<std::size_t>(src)] = numel;
  }
  auto flat = t.reshape({numel});
  return detail::launch_one("permute_tensor", ops::all_to_all_single{out_splits, in_splits}, g, flat)
      .reshape(t.shape());
}

/// all_reduce of several tensors in one launch; one pending output per input.
template <element T>
std::vector<tensor<T>> all_reduce_coalesced(const std::vector<tensor<T>>& ts, reduce_op_arg op,
                                            const group& g) {
  return detail::launch_collective<T>("all_reduce_coalesced", ops::all_reduce_coalesced{op}, g, ts);
}

/// all_gather (dim 0) of several tensors in one launch; one pending output per input.
template <element T>
std::vector<tensor<T>> all_gather_into_tensor_coalesced(const std::vector<tensor<T>>& ts, const group& g) {
  const int n = detail::group_size_of(g, "all_gather_into_tensor_coalesced");
  return detail::launch_collective<T>("all_gather_into_tensor_coalesced",
                                      ops::all_gather_into_tensor_coalesced{n}, g, ts);
}

/// reduce_scatter of several tensors in one launch, tensor i scattered along `scatter_dims[i]`.
template <element T>
std::vector<tensor<T>> reduce_scatter_tensor_coalesced(const std::vector<tensor<T>>& ts,
                                                       reduce_op_arg op,
                                                       const std::vector<std::int64_t>& scatter_dims,
                                                       const group& g) {
  const char* what = "reduce_scatter_tensor_coalesced";
  CCGRAPH_CHECK(scatter_dims.size() == ts.size(), what, ": ", scatter_dims.size(),
                " scatter dims for ", ts.size(), " tensors");
  const int n = detail::group_size_of(g, what);
  std::vector<tensor<T>> ins;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    CCGRAPH_CHECK(ts[i].dim() > 0, what, ": the input must have at least one dimension, got a "
                  "0-d tensor at index ", i);
    const int dim = normalize_dim(scatter_dims[i], ts[i].shape().size(), what);
    CCGRAPH_CHECK(ts[i].shape()[static_cast<std::size_t>(dim)] % n == 0, what, ": dim ", scatter_dims[i],
                  " (size ", ts[i].shape()[static_cast<std::size_t>(dim)],
                  ") must be a multiple of group_size ", n, " for tensor at index ", i);
    ins.push_back(dim == 0 ? ts[i] : detail::regroup(ts[i], n, dim, 0));
  }
  return detail::launch_collective<T>(what, ops::reduce_scatter_tensor_coalesced{op, n}, g, ins);
}

/// Waits until `t` is computed and returns it; a no-op on a tensor that is not pending.
template <element T>
const tensor<T>& wait_tensor(const tensor<T>& t) {
  t.wait();
  return t;
}

// ---- in-place, c10d style: the functional op, its wait, and a copy ----

namespace detail {
template <class T>
void check_out_shape(const char* what, const tensor<T>& out, const shape_t& expected) {
  CCGRAPH_CHECK(out.shape() == expected, what, ": output shape ", shape_str(out.shape()),
                " does not match the expected shape ", shape_str(expected));
}
}  // namespace detail

/// Reduces `t` across the group in place (c10d's all_reduce); returns when done.
template <element T>
tensor<T> all_reduce_(tensor<T> t, reduce_op_arg op, const group& g) {
  auto r = all_reduce(t, op, g);
  t.copy_(r);
  return t;
}

/// Gathers every member's `in` along dim 0 into `out` (c10d's all_gather_into_tensor).
template <element T>
tensor<T> all_gather_into_tensor(tensor<T> out, const tensor<T>& in, const group& g) {
  shape_t expected = in.shape();
  CCGRAPH_CHECK(!expected.empty(), "all_gather_into_tensor: the input must have at least one dimension");
  expected[0] *= detail::group_size_of(g, "all_gather_into_tensor");
  detail::check_out_shape("all_gather_into_tensor", out, expected);  // before launching: no peer is left waiting
  auto r = all_gather_tensor(in, 0, g);
  out.copy_(r);
  return out;
}

/// Reduce-scatters `in` along dim 0 into `out` (c10d's reduce_scatter_tensor).
template <element T>
tensor<T> reduce_scatter_tensor_(tensor<T> out, const tensor<T>& in, reduce_op_arg op, const group& g) {
  shape_t expected = in.shape();
  const int n = detail::group_size_of(g, "reduce_scatter_tensor");
  CCGRAPH_CHECK(!expected.empty() && expected[0] % n == 0, "reduce_scatter_tensor: dim 0 (size ",
                expected.empty() ? 0 : expected[0], ") must be a multiple of group_size ", n);
  expected[0] /= n;
  detail::check_out_shape("reduce_scatter_tensor", out, expected);
  auto r = reduce_scatter_tensor(in, op, 0, g);
  out.copy_(r);
  return out;
}

/// All-to-all of `in` into `out` (c10d's all_to_all_single).
template <element T>
tensor<T> all_to_all_single_(tensor<T> out, const tensor<T>& in,
                             std::optional<std::vector<std::int64_t>> output_split_sizes,
                             std::optional<std::vector<std::int64_t>> input_split_sizes,
                             const group& g) {
  if (output_split_sizes) {
    shape_t expected = in.shape();
    CCGRAPH_CHECK(!expected.empty(), "all_to_all_single: the input must have at least one dimension");
    expected[0] = 0;
    for (auto v : *output_split_sizes) expected[0] += v;
    detail::check_out_shape("all_to_all_single", out, expected);
  } else {
    detail::check_out_shape("all_to_all_single", out, in.shape());
  }
  auto r = all_to_all_single(in, std::move(output_split_sizes), std::move(input_split_sizes), g);
  out.copy_(r);
  return out;
}

}  // namespace ccgraph
