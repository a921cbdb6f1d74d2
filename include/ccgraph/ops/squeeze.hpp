// ccgraph/ops/squeeze.hpp: Tensor.squeeze(dim), added as docs/concepts.md "Adding an op" shows:
// the op's struct, its op_traits and its public function, in one file (plus its line in the op
// set, ir/node_op.hpp, and its tests). No dispatcher names it: inference, the tracer, the
// memory planner, the executors, the cost model and the printer read its traits.
#pragma once

#include <cstdint>
#include <string_view>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/ops/op_traits.hpp>

namespace ccgraph {
namespace ops {
/// Tensor.squeeze(dim): drops dimension `dim` when its size is 1 (a view); any other size gives
/// the input itself, as in PyTorch.
struct squeeze {
  BOOST_HANA_DEFINE_STRUCT(squeeze, (std::int64_t, dim));
  static constexpr std::string_view name = "squeeze";
};
}  // namespace ops

/// A view: category, aliasing, inference (apply_view on a storage-less tensor) and cost (none)
/// come from view_traits_common; the op says how it views, and declares its rule slots.
template <>
struct op_traits<ops::squeeze> : view_traits_common<ops::squeeze> {
  template <class T>
  static tensor<T> apply_view(const ops::squeeze& o, const tensor<T>& t) {
    if (t.shape().empty()) {  // a 0-d tensor has dims -1 and 0, as in PyTorch
      CCGRAPH_CHECK(o.dim == 0 || o.dim == -1, "squeeze: dim ", o.dim,
                    " is out of range for a 0-d tensor (expected -1 or 0)");
      return t;
    }
    const int d = normalize_dim(o.dim, t.shape().size(), "squeeze");
    return t.shape()[static_cast<std::size_t>(d)] == 1 ? t.select(d, 0) : t;  // select drops the dim
  }
  /// The gradient reshaped back.
  struct gradient {
    template <class C>
    static void backward(const ops::squeeze&, C& c) { c.add_grad(0, c.grad().reshape(c.input(0).shape())); }
  };
  using sharding = sharding_rules::squeeze;
};

/// Drops dimension `dim` of `x` when its size is 1 (torch.squeeze(x, dim)); a view. On tensors
/// it runs now, on traced values it records a `squeeze` node.
template <class V>
V squeeze(const V& x, std::int64_t dim) {
  return detail::apply_op(ops::squeeze{dim}, x);
}

}  // namespace ccgraph
