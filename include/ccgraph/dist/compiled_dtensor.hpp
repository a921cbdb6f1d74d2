// ccgraph/dist/compiled_dtensor.hpp: dtensors across a compiled function's boundary
// (cg::compile_function, runtime/compiled_function.hpp), as torch.compile takes and returns
// DTensors:
//
//   auto f = cg::compile_function<cg::dtensor<float>, cg::dtensor<float>>(
//       [](auto x, auto w) { return cg::matmul(x + x, w); }, ctx, {.passes = {"sink_waits", "raise_comms"}});
//   cg::dtensor<float> y = f(x_partial, w_replicate);   // Partial, as traced: no collective added
//
// A cg::dtensor<T> argument enters the graph as its local tensor; the function is given the
// traced dtensor cg::dtensor<T>::from_local makes of the symbolic local value (the same
// placements, mesh, global shape and strides: what tracing a from_local program records, its
// gradient boundary included). A traced dtensor the function returns leaves the graph as its
// local value and comes back a cg::dtensor<T> with the traced placements, mesh and global shape:
// Shard stays Shard, Replicate Replicate, Partial Partial (the pending reduction is not done at
// the boundary). Each argument's layout is in the compiled function's guard: another placement,
// mesh (or mesh dim names), global or local shape traces again, as torch.compile recompiles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/dist/dtensor.hpp>
#include <ccgraph/dist/placement.hpp>
#include <ccgraph/group/device_mesh.hpp>
#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/runtime/compiled_function.hpp>
#include <ccgraph/trace/symbolic.hpp>

namespace ccgraph::detail {

/// What a dtensor is besides its local value: its mesh, placements (shard dims non-negative),
/// global shape and strides. The layout a compiled function is guarded on and returns dtensors
/// with.
struct dtensor_layout {
  device_mesh mesh{shape_t{1}};
  std::vector<placement> placements;
  shape_t shape;
  strides_t stride;

  /// The layout of `d`.
  template <class T, class L>
  static dtensor_layout of(const dtensor<T, L>& d) {
    return {d.mesh(), d.placements(), d.shape(), d.stride()};
  }
  friend bool operator==(const dtensor_layout& a, const dtensor_layout& b) {
    return a.mesh == b.mesh && a.placements == b.placements && a.shape == b.shape && a.stride == b.stride;
  }
  /// Consistent with ==: equal layouts hash equal (the mesh by its printed form and ranks).
  void hash(hasher& h) const {
    h.add(mesh.str());
    for (int r : mesh.ranks()) h.add(r);
    for (const placement& p : placements) {
      h.add(static_cast<std::int64_t>(p.type()));
      if (p.is_shard()) h.add(p.dim());
      if (p.is_partial()) h.add(p.reduce());
    }
    h.add(shape);
    h.add(static_cast<std::int64_t>(stride.size()));
    for (std::int64_t s : stride) h.add(s);
  }
};

/// A cg::dtensor<T> argument of a compiled function: its local tensor in the graph, its layout
/// in the guard, a traced dtensor (from_local of the symbolic local value) for the function.
template <class T>
  requires is_element_v<T>
struct arg_kind<dtensor<T>> {
  static constexpr bool is_tensor = true;
  using host_type = dtensor<T>;  // unused: named where a host kind's is (function_types)
  using element_type = T;
  using param_type = dtensor<T>;
  using layout_type = dtensor_layout;
  static const tensor<T>& local(const dtensor<T>& d) { return d.local_value(); }
  /// The layout of argument `index`, checked against the rank context: every rank of its mesh
  /// must be one of the world's (a mesh made for another world size would resolve its groups
  /// to ranks that are not there), and the calling rank one of the mesh's.
  static dtensor_layout layout(const dtensor<T>& d, std::size_t index, const rank_context& ctx) {
    const auto& ranks = d.mesh().ranks();
    for (int r : ranks)
      CCGRAPH_CHECK(r >= 0 && r < ctx.world_size(), "compile_function: argument ", index, " is a dtensor on ",
                    d.mesh().str(), " of ", ranks.size(), " ranks (rank ", r, "), but the rank context's world has ",
                    ctx.world_size(), " ranks; make the mesh for this world");
    CCGRAPH_CHECK(d.mesh().contains(ctx.rank()), "compile_function: argument ", index, " is a dtensor on ",
                  d.mesh().str(), ", which does not contain the calling rank ", ctx.rank());
    return dtensor_layout::of(d);
  }
  /// What the function is given: the dtensor from_local makes of the local value (no
  /// collective; a Replicate mesh dim's gradient boundary, as in a traced from_local program).
  static dtensor<T, symbolic<T>> traced(const symbolic<T>& s, const dtensor_layout& l) {
    return dtensor<T>::from_local(s, l.mesh, l.placements, {.shape = l.shape, .stride = l.stride});
  }
};

/// A traced dtensor a compiled function returns: the graph returns its local value; the call
/// returns a cg::dtensor<T> of that local tensor laid out as traced (a Partial stays Partial).
template <class T>
struct result_boundary<dtensor<T, symbolic<T>>> {
  using layout_type = dtensor_layout;
  static symbolic<T> lower(const dtensor<T, symbolic<T>>& d, dtensor_layout& l) {
    l = dtensor_layout::of(d);
    return d.local_value();
  }
  static dtensor<T> lift(tensor<T> local, const dtensor_layout& l) {
    return dtensor<T>(std::move(local), l.mesh, l.placements, l.shape, l.stride);
  }
};

}  // namespace ccgraph::detail
