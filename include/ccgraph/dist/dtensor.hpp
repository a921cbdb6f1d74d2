// ccgraph/dist/dtensor.hpp: cg::dtensor<T>, PyTorch's DTensor: a rank's local value, the
// device mesh, one placement per mesh dim, and the global shape.
//
//   cg::device_mesh mesh({2, 2}, {"dp", "tp"});
//   auto d = cg::dtensor<float>::from_local(local, mesh, {cg::shard(0), cg::replicate()});
//   auto r = d.redistribute(mesh, {cg::replicate(), cg::replicate()});  // one all_gather
//   r.to_local(); d.full_tensor(); d.placements(); d.shape();
//
// The local value is a tensor<T> (eager: collectives launch now and are pending until used) or,
// inside cg::trace, a symbolic<T> (from_local on a symbolic value gives dtensor<T, symbolic<T>>,
// whose redistributions record ordinary collective, wait, view and cat nodes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/dist/placement.hpp>
#include <ccgraph/dist/redistribute.hpp>
#include <ccgraph/group/device_mesh.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

/// Options of dtensor::from_local (PyTorch's keyword arguments).
struct from_local_options {
  /// Broadcast each Replicate mesh dim's value from its first rank, and (eagerly) check that
  /// every rank's local shape agrees with the global shape: one all_gather of the shapes.
  bool run_check = false;
  /// The global shape, for uneven shards (else each shard is taken as full: local size times
  /// the mesh dim's size).
  std::optional<shape_t> shape{};
  /// The global strides (only with `shape`; default: contiguous).
  std::optional<strides_t> stride{};
  /// Traced (inside cg::value_and_grad): leave the local value's gradient on each Replicate mesh
  /// dim as this rank's term of it, Partial(sum), instead of summing the terms over the mesh dim
  /// in the backward (one all_reduce per dim). That is what a PyTorch DTensor parameter laid out
  /// Replicate holds after a backward through sharded activations (a sequence-parallel norm's
  /// weight): the caller sums the terms where it needs the whole gradient (in the optimizer, or
  /// bucketed with other gradients). Eager tensors carry no gradient: it changes nothing there.
  bool partial_grads = false;
};

/// A tensor laid out on a device mesh: the calling rank's local value, one placement per mesh
/// dim, and the global shape it is a piece of. Local is tensor<T> (eager) or symbolic<T>
/// (traced). Values are immutable: redistribute returns a new dtensor.
template <class T, class Local = tensor<T>>
class dtensor {
 public:
  /// The element type.
  using value_type = T;
  /// The local value's type: tensor<T> or symbolic<T>.
  using local_type = Local;

  /// A dtensor from each rank's local value (PyTorch's DTensor.from_local). Shard dims may be
  /// negative. Without a global shape, shards are taken as even: the global size of a sharded
  /// dim is the local size times the mesh dim's size; with one, the local shape must be this
  /// rank's piece of it. Errors name the call and the values.
  template <class L>
  static dtensor<T, L> from_local(const L& local, const ccgraph::device_mesh& mesh, std::vector<placement> placements,
                                  from_local_options opts = {}) {
    static_assert(std::is_same_v<typename L::value_type, T>,
                  "dtensor<T>::from_local: the local value's element type must be T");
    return dtensor<T, L>::make_from_local(local, mesh, std::move(placements), std::move(opts));
  }

  /// The local value from its parts, checked: `placements` normalised, `global_shape` consistent
  /// with the local shape on the calling rank.
  dtensor(Local local, ccgraph::device_mesh mesh, std::vector<placement> placements, shape_t global_shape,
          std::optional<strides_t> stride = std::nullopt)
      : local_(std::move(local)), mesh_(std::move(mesh)), placements_(std::move(placements)),
        shape_(std::move(global_shape)) {
    placements_ = normalize(placements_, mesh_, shape_.size(), "dtensor");
    stride_ = stride ? *stride : contiguous_strides(shape_);
    CCGRAPH_CHECK(stride_.size() == shape_.size(), "dtensor: stride ", list_str(stride_), " for global shape ",
                  shape_str(shape_));
    check_local_shape("dtensor");
  }

  /// The calling rank's local value (PyTorch's to_local). Inside a differentiated function
  /// (cg::value_and_grad, traced) it is where local gradients become the dtensor's:
  /// `grad_placements` (default: this dtensor's placements) says how the gradient of the local
  /// value is laid out, as in PyTorch. A gradient placed Replicate on a mesh dim is one value
  /// held by every rank (so it is counted once, not once per rank: scaled by 1 / the dim's
  /// size in the backward, which sums every rank's terms), Partial(sum) and Shard are each
  /// rank's own term or piece (as they are), Partial(avg) a term of a mean (1 / size). Eager
  /// tensors carry no gradient: there it is the local value.
  Local to_local(std::optional<std::vector<placement>> grad_placements = std::nullopt) const {
    constexpr const char* what = "dtensor::to_local";
    std::vector<placement> gp = grad_placements ? normalize(*grad_placements, mesh_, shape_.size(), what) : placements_;
    if constexpr (is_traced_v<Local>) {
      double scale = 1;
      bool any = false;
      for (std::size_t i = 0; i < gp.size(); ++i) {
        const int n = mesh_.size(static_cast<int>(i));
        if (n == 1 || gp[i].is_shard() || gp[i].is_partial(reduce_op::sum)) continue;
        any = true;
        if (gp[i].is_replicate() || gp[i].is_partial(reduce_op::avg)) scale /= n;
      }
      if (!any) return local_;
      // A distinct value (a reshape view, free) carries the hook, so other uses of the local
      // value keep their gradients as they are.
      Local out = local_.reshape(local_.shape());
      auto* st = out.state();
      st->grad_hooks.push_back({out.ref(), [st, scale, gp](auto g) {
                                  for (const placement& p : gp)
                                    CCGRAPH_CHECK(!p.is_partial() || p.is_partial(reduce_op::sum) ||
                                                      p.is_partial(reduce_op::avg),
                                                  "dtensor::to_local: the gradient of a local value laid out as ",
                                                  placements_str(gp),
                                                  " is not defined: Partial(sum), Partial(avg), Shard and Replicate "
                                                  "gradients are; pass grad_placements");
                                  return Local(Local(st, g) * static_cast<T>(scale)).ref();
                                }});
      return out;
    } else {
      (void)gp;
      return local_;
    }
  }
  /// The local value as stored, with no gradient boundary (what the dtensor ops compute on).
  const Local& local_value() const { return local_; }
  /// The dtensor whose local value is `g`, the gradient of this dtensor's local value in a
  /// differentiated function (cg::value_and_grad over traced dtensors): laid out as this
  /// dtensor, a Partial mesh dim Replicate (every term of a sum has the whole gradient; PyTorch's
  /// backward of a redistribution normalises a Partial target to Replicate likewise).
  dtensor grad_from_local(Local g) const {
    std::vector<placement> gp = placements_;
    for (placement& p : gp)
      if (p.is_partial()) p = replicate();
    return dtensor(std::move(g), mesh_, std::move(gp), shape_, stride_);
  }
  /// The mesh (PyTorch's device_mesh).
  const ccgraph::device_mesh& device_mesh() const { return mesh_; }
  /// The mesh (PyTorch's device_mesh).
  const ccgraph::device_mesh& mesh() const { return mesh_; }
  /// One placement per mesh dim, shard dims non-negative.
  const std::vector<placement>& placements() const { return placements_; }
  /// The global shape.
  const shape_t& shape() const { return shape_; }
  /// Global size of dim `d` (negative counts from the end).
  std::int64_t size(std::int64_t d) const { return shape_[static_cast<std::size_t>(normalize_dim(d, shape_.size(), "dtensor::size"))]; }
  /// The global strides (contiguous unless given to from_local).
  const strides_t& stride() const { return stride_; }
  /// Number of dims of the global tensor.
  int ndim() const { return static_cast<int>(shape_.size()); }
  /// Number of dims of the global tensor.
  int dim() const { return ndim(); }
  /// Number of elements of the global tensor.
  std::int64_t numel() const { return numel_of(shape_); }

  /// This tensor laid out by `placements` on `mesh` (which must be this dtensor's mesh: PyTorch
  /// supports no cross-mesh redistribution either). One collective per mesh dim that changes, in
  /// PyTorch's order. A target Partial must already be the placement of its mesh dim, as
  /// PyTorch requires ("redistributing to Partial is for internal use only").
  dtensor redistribute(const ccgraph::device_mesh& mesh, std::vector<placement> placements) const {
    constexpr const char* what = "dtensor::redistribute";
    CCGRAPH_CHECK(mesh == mesh_, what, ": target mesh ", mesh.str(), " is not the dtensor's mesh ", mesh_.str(),
                  "; redistributing across meshes is not supported");
    std::vector<placement> dst = normalize(placements, mesh_, shape_.size(), what);
    for (std::size_t i = 0; i < dst.size(); ++i)
      CCGRAPH_CHECK(!dst[i].is_partial() || dst[i] == placements_[i], what, ": can not redistribute from ",
                    placements_[i].str(), " to ", dst[i].str(), " on mesh dim ", i,
                    ": redistributing to Partial is for internal use only");
    return redistribute_unchecked(std::move(dst), what, false);
  }
  /// redistribute on this dtensor's own mesh.
  dtensor redistribute(std::vector<placement> placements) const { return redistribute(mesh_, std::move(placements)); }

  /// The whole tensor on every rank (PyTorch's full_tensor): redistribute to Replicate on every
  /// mesh dim, then the local value.
  /// `grad_placements` as to_local's (default: Replicate on every mesh dim).
  Local full_tensor(std::optional<std::vector<placement>> grad_placements = std::nullopt) const {
    return redistribute_unchecked(std::vector<placement>(static_cast<std::size_t>(mesh_.ndim()), replicate()),
                                  "dtensor::full_tensor", false)
        .to_local(std::move(grad_placements));
  }

  /// The plan redistribute follows from these placements to `placements` on the calling rank:
  /// one step per mesh dim that changes, in order (for inspection and tests).
  std::vector<redistribute_step> redistribute_plan(std::vector<placement> placements) const {
    std::vector<placement> dst = normalize(placements, mesh_, shape_.size(), "dtensor::redistribute_plan");
    return detail::plan_redistribute(mesh_, coordinate("dtensor::redistribute_plan"), shape_, placements_, dst);
  }

  /// redistribute without the public check on Partial targets: with `allow_to_partial`, the
  /// internal Replicate -> Partial(sum) of PyTorch (for gradients: the value divided by the
  /// mesh dim's size); Shard -> Partial and Partial(a) -> Partial(b) stay errors.
  dtensor redistribute_unchecked(std::vector<placement> dst, const char* what, bool allow_to_partial) const {
    dst = normalize(dst, mesh_, shape_.size(), what);
    const auto coord = coordinate(what);
    for (std::size_t i = 0; i < dst.size(); ++i)
      CCGRAPH_CHECK(!(placements_[i].is_partial() && dst[i].is_partial()) || placements_[i] == dst[i], what,
                    ": can not redistribute from ", placements_[i].str(), " to ", dst[i].str(), " on mesh dim ", i,
                    ": a Partial's reduce op can not change");
    const auto steps = detail::plan_redistribute(mesh_, coord, shape_, placements_, dst);
    Local out = detail::redistribute_local(local_, mesh_, coord, steps, what, allow_to_partial);
    return dtensor(std::move(out), mesh_, std::move(dst), shape_, stride_);
  }

 private:
  template <class, class>
  friend class dtensor;

  static dtensor make_from_local(const Local& local, const ccgraph::device_mesh& mesh, std::vector<placement> placements,
                                 from_local_options opts) {
    constexpr const char* what = "dtensor::from_local";
    placements = normalize(placements, mesh, local.shape().size(), what);
    CCGRAPH_CHECK(opts.shape || !opts.stride, what, ": a stride ", list_str(*opts.stride),
                  " was given without the global shape; pass both");
    shape_t global = local.shape();
    if (opts.shape) {
      global = *opts.shape;
      CCGRAPH_CHECK(global.size() == local.shape().size(), what, ": global shape ", shape_str(global), " has ",
                    global.size(), " dims but the local tensor ", shape_str(local.shape()), " has ",
                    local.shape().size());
    } else {
      for (std::size_t i = 0; i < placements.size(); ++i)
        if (placements[i].is_shard()) global[static_cast<std::size_t>(placements[i].dim())] *= mesh.size(static_cast<int>(i));
    }
    Local x = local;
    if (opts.run_check) x = run_check(x, mesh, placements, !opts.shape.has_value());
    if constexpr (is_traced_v<Local>)
      if (!opts.partial_grads) x = replicate_grad_boundary(x, mesh, placements);
    return dtensor(std::move(x), mesh, std::move(placements), std::move(global), opts.stride);
  }

  /// Traced from_local on Replicate mesh dims: the gradient of the local value is the dtensor
  /// gradient's local value (PyTorch's from_local backward redistributes it to the placements
  /// given): every rank's term of it summed, one all_reduce per Replicate mesh dim, in the
  /// backward of a differentiated function (a gradient hook on a reshape view of `x`). Shard
  /// and Partial dims need nothing: a shard's gradient is the gradient's shard, and a Partial
  /// term's gradient is the whole gradient.
  static Local replicate_grad_boundary(const Local& x, const ccgraph::device_mesh& mesh,
                                       const std::vector<placement>& placements) {
    std::vector<int> dims;
    for (std::size_t i = 0; i < placements.size(); ++i)
      if (placements[i].is_replicate() && mesh.size(static_cast<int>(i)) > 1) dims.push_back(static_cast<int>(i));
    if (dims.empty()) return x;
    Local out = x.reshape(x.shape());
    auto* st = out.state();
    st->grad_hooks.push_back({out.ref(), [st, mesh, dims](auto g) {
                                Local v(st, g);
                                for (int i : dims) v = all_reduce(v, reduce_op::sum, group(mesh, i));
                                return v.ref();
                              }});
    return out;
  }

  /// from_local's run_check: every rank's local shape equal (eager, when the global shape is
  /// inferred), then each Replicate mesh dim broadcast from its first rank.
  static Local run_check(Local x, const ccgraph::device_mesh& mesh, const std::vector<placement>& placements,
                         bool check_shapes) {
    constexpr const char* what = "dtensor::from_local";
    const int me = detail::collective_backend<Local>::rank(what);
    if constexpr (is_tensor_v<Local>) {
      if (check_shapes) {
        std::vector<std::int64_t> mine(x.shape().begin(), x.shape().end());
        mine.push_back(static_cast<std::int64_t>(x.shape().size()));
        const auto n = static_cast<std::int64_t>(mine.size());
        const auto all = all_gather_tensor(tensor<std::int64_t>::from(mine, {n}).to(x.device()), 0, group(mesh))
                             .to(device::cpu()).to_vector();
        const auto ranks = mesh.slice_of(me);
        for (std::size_t r = 0; r * static_cast<std::size_t>(n) < all.size(); ++r) {
          const std::vector<std::int64_t> theirs(all.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(n)),
                                                 all.begin() + static_cast<std::ptrdiff_t>((r + 1) * static_cast<std::size_t>(n)));
          CCGRAPH_CHECK(theirs == mine, what, ": run_check: rank ", ranks[r], " has local shape ",
                        shape_str(shape_t(theirs.begin(), theirs.end() - 1)), " but rank ", me, " has ",
                        shape_str(x.shape()), "; pass the global shape for uneven shards");
        }
      }
    }
    for (std::size_t i = 0; i < placements.size(); ++i) {
      if (!placements[i].is_replicate() || mesh.size(static_cast<int>(i)) == 1) continue;
      int src = -1;
      for (const auto& g : mesh.groups_along(static_cast<int>(i)))
        if (std::find(g.begin(), g.end(), me) != g.end()) src = g.front();
      x = broadcast(x.contiguous(), src, group(mesh, static_cast<int>(i)));
    }
    return x;
  }

  /// `ps` with shard dims normalised; the count must be the mesh's dims.
  static std::vector<placement> normalize(const std::vector<placement>& ps, const ccgraph::device_mesh& mesh,
                                          std::size_t ndim, const char* what) {
    CCGRAPH_CHECK(static_cast<int>(ps.size()) == mesh.ndim(), what, ": ", ps.size(), " placements ",
                  placements_str(ps), " for a ", mesh.ndim(), "-d mesh ", mesh.str(), "; give one per mesh dim");
    std::vector<placement> out;
    for (const auto& p : ps) out.push_back(p.normalized(ndim, what));
    return out;
  }

  /// The calling rank's coordinate on the mesh (an error when it is not in it).
  std::vector<std::int64_t> coordinate(const char* what) const {
    const int me = detail::collective_backend<Local>::rank(what);
    CCGRAPH_CHECK(mesh_.contains(me), what, ": rank ", me, " is not in the mesh ", mesh_.str());
    return mesh_.coordinate(me);
  }

  void check_local_shape(const char* what) const {
    const auto [expected, offset] = local_shape_and_offset(shape_, mesh_, coordinate(what), placements_);
    (void)offset;
    CCGRAPH_CHECK(local_.shape() == expected, what, ": the local shape ", shape_str(local_.shape()), " on rank ",
                  detail::collective_backend<Local>::rank(what), " is not its piece ", shape_str(expected),
                  " of the global shape ", shape_str(shape_), " laid out as ", placements_str(placements_), " on ",
                  mesh_.str());
  }

  Local local_;
  ccgraph::device_mesh mesh_;
  std::vector<placement> placements_;
  shape_t shape_;
  strides_t stride_;
};

}  // namespace ccgraph
