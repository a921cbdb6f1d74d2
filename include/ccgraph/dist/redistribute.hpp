// ccgraph/dist/redistribute.hpp: how a dtensor's local value moves from one list of
// placements to another, one collective per mesh dim (PyTorch's _redistribute.py, greedy plan).
//
// Each step is written once over the functional collectives, so it runs on tensors (eager:
// launched now, pending until used) and on symbolic values (inside cg::trace: the collectives
// and their waits become graph nodes, the padding and re-layout ordinary view/cat nodes).
//
//   Shard(d)   -> Replicate  all_gather on d (dim 0 natively; other dims re-laid out)
//   Partial    -> Replicate  all_reduce
//   Partial    -> Shard(d)   reduce_scatter on d (pre-permuted for d != 0)
//   Shard(a)   -> Shard(b)   one all_to_all_single (gathers a, scatters b)
//   Replicate  -> Shard(d)   the local chunk, no communication
//   Replicate  -> Partial    (internal: sum only, the value divided by the mesh dim's size)
//   Shard      -> Partial, Partial(a) -> Partial(b): errors
// Uneven shards (torch.chunk sizes) are padded to the full chunk before the collective and
// narrowed after it, as PyTorch does, so local shapes and values are PyTorch's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/dist/placement.hpp>
#include <ccgraph/group/device_mesh.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/ops/reduction_ops.hpp>
#include <ccgraph/ops/shape_ops.hpp>

namespace ccgraph {

/// One step of a redistribution: mesh dim `mesh_dim` goes from `from` to `to`; `logical_shape`
/// is the tensor's shape as seen on that mesh dim (the global shape narrowed by the shards of
/// the mesh dims before it), which sizes uneven shards (PyTorch's _TransformInfo).
struct redistribute_step {
  int mesh_dim = 0;
  placement from;
  placement to;
  shape_t logical_shape;
};

/// The local shape and the global offset of the calling rank's piece of a tensor of
/// `global_shape` laid out by `placements` on `mesh`, for the rank at `coordinate` (PyTorch's
/// compute_local_shape_and_global_offset: mesh dims in order, each shard a torch.chunk of what
/// the earlier ones left).
inline std::pair<shape_t, shape_t> local_shape_and_offset(const shape_t& global_shape, const device_mesh& mesh,
                                                          const std::vector<std::int64_t>& coordinate,
                                                          const std::vector<placement>& placements) {
  shape_t local = global_shape, offset(global_shape.size(), 0);
  for (std::size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    const auto d = static_cast<std::size_t>(placements[i].dim());
    const auto [size, off] = local_shard_size_and_offset(local[d], mesh.size(static_cast<int>(i)), coordinate[i]);
    local[d] = size;
    offset[d] += off;
  }
  return {local, offset};
}

namespace detail {

/// The steps from `src` to `dst` placements (normalised, one per mesh dim) for a tensor of
/// `global_shape`, for the rank at `coordinate`: PyTorch's greedy plan. On a 1-d mesh one step.
/// On N-d meshes first, from the innermost mesh dim out, a target Shard(d) whose shards of d on
/// the earlier mesh dims differ from the source's (nested sharding out of order) goes through
/// Replicate; then, from the outermost dim in, every dim that still differs.
inline std::vector<redistribute_step> plan_redistribute(const device_mesh& mesh,
                                                        const std::vector<std::int64_t>& coordinate,
                                                        const shape_t& global_shape,
                                                        const std::vector<placement>& src,
                                                        const std::vector<placement>& dst) {
  const int nd = mesh.ndim();
  std::vector<redistribute_step> steps;
  if (nd == 1) {
    if (!(src[0] == dst[0])) steps.push_back({0, src[0], dst[0], global_shape});
    return steps;
  }
  std::vector<shape_t> logical{global_shape};
  for (int i = 0; i < nd - 1; ++i) {
    shape_t next = logical.back();
    const auto& p = src[static_cast<std::size_t>(i)];
    if (p.is_shard()) {
      const auto d = static_cast<std::size_t>(p.dim());
      next[d] = local_shard_size_and_offset(next[d], mesh.size(i), coordinate[static_cast<std::size_t>(i)]).first;
    }
    logical.push_back(std::move(next));
  }
  std::vector<placement> cur = src;
  std::int64_t shards = 1;
  for (int i = 0; i < nd; ++i)
    if (src[static_cast<std::size_t>(i)].is_shard()) shards *= mesh.size(i);
  if (shards > 1) {
    for (int m = nd - 1; m >= 0; --m) {
      placement target = dst[static_cast<std::size_t>(m)];
      if (target.is_shard()) {
        const std::int64_t d = target.dim();
        std::vector<int> cur_on_d, dst_on_d;
        for (int i = 0; i < m; ++i) {
          if (cur[static_cast<std::size_t>(i)].is_shard(d)) cur_on_d.push_back(i);
          if (dst[static_cast<std::size_t>(i)].is_shard(d)) dst_on_d.push_back(i);
        }
        if (cur_on_d != dst_on_d) target = replicate();
      }
      if (!(cur[static_cast<std::size_t>(m)] == target)) {
        steps.push_back({m, cur[static_cast<std::size_t>(m)], target, logical[static_cast<std::size_t>(m)]});
        cur[static_cast<std::size_t>(m)] = target;
      }
    }
  }
  for (int m = 0; m < nd; ++m) {
    const auto k = static_cast<std::size_t>(m);
    if (!(cur[k] == dst[k])) {
      steps.push_back({m, cur[k], dst[k], logical[k]});
      cur[k] = dst[k];
    }
  }
  return steps;
}

/// The element type of a tensor or symbolic value.
template <class V>
using dvalue_t = typename V::value_type;

/// Zeros shaped like `x` but `p` long on `dim`: a keepdim sum over an empty slice of `x` (zeros,
/// one long on dim) repeated. Built from ops that exist on tensors and in graphs alike (a graph
/// has no constant nodes), so the padding is written once.
template <class V>
V zeros_along(const V& x, int dim, std::int64_t p) {
  using T = dvalue_t<V>;
  auto z = ::ccgraph::sum(x.narrow(dim, 0, 0), std::vector<std::int64_t>{dim}, true);
  std::vector<std::int64_t> times(x.shape().size(), 1);
  times[static_cast<std::size_t>(dim)] = p;
  if constexpr (std::is_same_v<typename decltype(z)::value_type, T>) return z.repeat(times);
  else return V(z.template to<T>()).repeat(times);
}

/// `x` padded with `p` zeros at the end of `dim` (PyTorch's pad_tensor); `x` itself when p = 0.
template <class V>
V pad_dim(const V& x, int dim, std::int64_t p) {
  if (p <= 0) return x;
  return cat(std::vector<V>{x, zeros_along(x, dim, p)}, dim);
}

/// The first `size` elements of `x` along `dim` (PyTorch's unpad_tensor); `x` when whole.
template <class V>
V keep_first(const V& x, int dim, std::int64_t size) {
  if (x.shape()[static_cast<std::size_t>(dim)] == size) return x;
  return x.narrow(dim, 0, size);
}

/// Shard(dim) -> Replicate on the group `g` of `n` ranks: all_gather, padded when the logical
/// size does not divide.
template <class V>
V shard_to_replicate(const V& local, int dim, int n, const shape_t& logical, const group& g) {
  const std::int64_t size = logical[static_cast<std::size_t>(dim)];
  const std::int64_t full = (size + n - 1) / n;
  const bool padded = size % n != 0;
  const V in = padded ? pad_dim(local, dim, full - local.shape()[static_cast<std::size_t>(dim)]) : local;
  V out = all_gather_tensor(in, dim, g);
  return padded ? keep_first(out, dim, size) : out;
}

/// Partial(op) -> Shard(dim): reduce_scatter; an uneven dim has each of its torch.chunk pieces
/// padded to the full chunk first, and this rank's piece narrowed after.
template <class V>
V partial_to_shard(const V& local, reduce_op op, int dim, int n, std::int64_t index, const group& g) {
  const std::int64_t size = local.shape()[static_cast<std::size_t>(dim)];
  if (size % n == 0) return reduce_scatter_tensor(local, op, dim, g);
  const std::int64_t full = (size + n - 1) / n;
  std::vector<V> pieces;
  for (int i = 0; i < n; ++i) {
    const auto [len, off] = local_shard_size_and_offset(size, n, i);
    pieces.push_back(pad_dim(local.narrow(dim, off, len), dim, full - len));
  }
  V out = reduce_scatter_tensor(cat(pieces, dim), op, dim, g);
  return keep_first(out, dim, local_shard_size_and_offset(size, n, index).first);
}

/// Replicate -> Shard(dim): this rank's torch.chunk, a copy (as PyTorch's clone) for tensors.
template <class V>
V replicate_to_shard(const V& local, int dim, int n, std::int64_t index) {
  const std::int64_t size = local.shape()[static_cast<std::size_t>(dim)];
  const auto [len, off] = local_shard_size_and_offset(size, n, index);
  V piece = local.narrow(dim, off, len);
  if constexpr (is_tensor_v<V>) return piece.clone();
  else return piece;
}

/// Shard(from) -> Shard(to): one all_to_all_single. Chunk i of dim `to` goes to rank i (the
/// chunks stacked on dim 0 first when to != 0), and the pieces received are concatenated on
/// `from` in rank order. Both dims padded when uneven, and narrowed after, as PyTorch does.
template <class V>
V shard_to_shard(const V& local, int from, int to, int n, std::int64_t index, const shape_t& logical,
                 const group& g) {
  const auto f = static_cast<std::size_t>(from), t = static_cast<std::size_t>(to);
  const std::int64_t from_size = logical[f], to_size = logical[t];
  const std::int64_t from_full = (from_size + n - 1) / n, to_full = (to_size + n - 1) / n;
  const bool from_padded = from_size % n != 0, to_padded = to_size % n != 0;
  V x = local;
  if (from_padded) x = pad_dim(x, from, from_full - x.shape()[f]);
  if (to_padded) x = pad_dim(x, to, to_full * n - x.shape()[t]);
  const V in = to == 0 ? x : detail::regroup(x, n, to, 0);
  const V got = all_to_all_single(in, std::nullopt, std::nullopt, g);
  V out = from == 0 ? got : detail::regroup(got, n, 0, from);
  if (from_padded) out = keep_first(out, from, from_size);
  if (to_padded) out = keep_first(out, to, local_shard_size_and_offset(to_size, n, index).first);
  return out;
}

/// Runs the steps of a plan on the local value `local` of the rank at `coordinate`. `what`
/// names the calling API in errors. `allow_to_partial`: PyTorch's internal Replicate ->
/// Partial(sum) (the value divided by the mesh dim's size); the public redistribute refuses.
template <class V>
V redistribute_local(const V& local, const device_mesh& mesh, const std::vector<std::int64_t>& coordinate,
                     const std::vector<redistribute_step>& steps, const char* what, bool allow_to_partial = false) {
  using T = dvalue_t<V>;
  V x = local;
  for (const auto& s : steps) {
    const int i = s.mesh_dim;
    const int n = mesh.size(i);
    const std::int64_t index = coordinate[static_cast<std::size_t>(i)];
    if (s.from == s.to || n == 1) continue;
    const group g(mesh, i);
    if (s.to.is_replicate()) {
      if (s.from.is_partial()) x = all_reduce(x, s.from.reduce(), g);
      else x = shard_to_replicate(x, static_cast<int>(s.from.dim()), n, s.logical_shape, g);
    } else if (s.to.is_shard()) {
      const int d = static_cast<int>(s.to.dim());
      if (s.from.is_partial()) x = partial_to_shard(x, s.from.reduce(), d, n, index, g);
      else if (s.from.is_replicate()) x = replicate_to_shard(x, d, n, index);
      else x = shard_to_shard(x, static_cast<int>(s.from.dim()), d, n, index, s.logical_shape, g);
    } else {  // to Partial
      CCGRAPH_CHECK(s.from.is_replicate() && allow_to_partial && s.to.reduce() == reduce_op::sum, what,
                    ": can not redistribute from ", s.from.str(), " to ", s.to.str(), " on mesh dim ", i,
                    s.from.is_replicate() && allow_to_partial ? " (only Replicate -> Partial(sum) is supported)"
                                                              : ": redistributing to Partial is for internal use only");
      x = as_value(x / static_cast<T>(n));
    }
  }
  return x;
}

}  // namespace detail
}  // namespace ccgraph
