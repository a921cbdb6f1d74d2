// ccgraph/dist/ops.hpp: ops on cg::dtensor<T> (PyTorch's DTensor op dispatch with sharding
// propagation). Each call reads its inputs' placements, asks the op's sharding rule
// (op_traits<O>::sharding, dist/sharding.hpp) for the candidate strategies, prices each by the
// collectives its inputs' redistributions need (cost_model, the same numbers on every rank),
// takes the cheapest (ties: the first in the rule's order), redistributes the inputs, runs the
// op on the local values (the op's own public function: eager on tensors, recorded inside
// cg::trace on symbolic values) and returns a dtensor with the strategy's output placements
// and the op's global shape (its own inference on the global shapes).
//
//   auto y = cg::matmul(x, w);          // x Shard(0), w Replicate -> y Shard(0), no collective
//   auto s = cg::sum(y, {0});           // Shard(0) reduced -> Partial(sum)
//   cg::choose_sharding(cg::ops::matmul{}, {cg::spec_of(x), cg::spec_of(w)}, mesh).best();
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/dist/dtensor.hpp>
#include <ccgraph/dist/placement.hpp>
#include <ccgraph/dist/redistribute.hpp>
#include <ccgraph/dist/sharding.hpp>
#include <ccgraph/ir/node_op.hpp>
#include <ccgraph/schedule/cost_model.hpp>

namespace ccgraph {

/// A rule's candidates for one call, each priced, and the one taken (`chosen`: the cheapest,
/// the first in the rule's order among equals).
struct sharding_choice {
  std::vector<sharding_strategy> strategies;
  /// Microseconds of the collectives each candidate's redistributions issue (infinity: a
  /// candidate its inputs can not be redistributed to).
  std::vector<double> costs;
  std::size_t chosen = 0;
  /// The strategy taken.
  const sharding_strategy& best() const { return strategies.at(chosen); }
};

/// The spec (global shape and placements) a sharding rule reads of `d`.
template <class T, class L>
dtensor_spec spec_of(const dtensor<T, L>& d) {
  return {d.shape(), d.placements()};
}

namespace detail {

/// The collectives' time, on `cm`, of redistributing a tensor of spec `s` (elements of
/// `elem_bytes`) to `dst` on `mesh`, step by step as redistribute does, sized for the mesh's
/// first rank (coordinate 0: every rank prices the same, so every rank chooses the same);
/// infinity when it can not be done: Shard -> Partial, a Partial's op changing, Replicate ->
/// Partial other than sum, or a Shard of a dim smaller than its shards (PyTorch's
/// is_tensor_shardable). A template only so that it compiles where it is used.
template <class CM = cost_model>
double redistribute_cost(const CM& cm, const device_mesh& mesh, const dtensor_spec& s,
                                const std::vector<placement>& dst, std::size_t elem_bytes) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (s.placements == dst) return 0;
  for (std::size_t d = 0; d < s.shape.size(); ++d) {
    std::int64_t n = 1;
    for (std::size_t m = 0; m < dst.size(); ++m)
      if (dst[m].is_shard(static_cast<std::int64_t>(d))) n *= mesh.size(static_cast<int>(m));
    if (n > 1 && s.shape[d] < n) return inf;
  }
  const std::vector<std::int64_t> origin(static_cast<std::size_t>(mesh.ndim()), 0);
  for (std::size_t m = 0; m < dst.size(); ++m) {
    const placement& a = s.placements[m];
    const placement& b = dst[m];
    if (b.is_partial() && !(a == b) && !(a.is_replicate() && b.is_partial(reduce_op::sum))) return inf;
  }
  std::vector<placement> cur = s.placements;
  double us = 0;
  for (const auto& step : plan_redistribute(mesh, origin, s.shape, s.placements, dst)) {
    const int n = mesh.size(step.mesh_dim);
    const double local = double(numel_of(local_shape_and_offset(s.shape, mesh, origin, cur).first)) * double(elem_bytes);
    cur[static_cast<std::size_t>(step.mesh_dim)] = step.to;
    if (step.from == step.to || n == 1) continue;
    if (step.to.is_replicate()) {
      us += step.from.is_partial() ? cm.nccl_collective(nccl_coll::all_reduce, local, n).us
                                   : cm.nccl_collective(nccl_coll::all_gather, local * n, n).us;
    } else if (step.to.is_shard()) {
      if (step.from.is_partial()) us += cm.nccl_collective(nccl_coll::reduce_scatter, local, n).us;
      else if (step.from.is_shard()) us += cm.nccl_collective(nccl_coll::all_to_all, local, n).us;
    }
  }
  return us;
}

/// The error of an op without a sharding rule called on dtensors.
template <class O>
void require_sharding_rule() {
  using rule = typename op_traits<O>::sharding;
  if constexpr (std::is_same_v<rule, sharding_todo>)
    CCGRAPH_THROW(error, O::name, ": no sharding rule for dtensor inputs yet (", sharding_todo::reason,
                  "); call it on to_local() values, or redistribute and use full_tensor()");
}

}  // namespace detail

/// The candidates op `o`'s sharding rule gives for inputs `in` on `mesh`, priced on `cm` (by
/// default an H100's NCCL model: only the ratios matter) for elements of `elem_bytes`, and the
/// one taken: the cheapest; among equal costs the first in the rule's order. The rule and
/// the costs see only global shapes and placements, so every rank takes the same.
template <class O>
sharding_choice choose_sharding(const O& o, std::vector<dtensor_spec> in, const device_mesh& mesh,
                                std::size_t elem_bytes = 4, const cost_model& cm = cost_model{}) {
  detail::require_sharding_rule<O>();
  for (auto& x : in) {  // the rules read non-negative shard dims, one placement per mesh dim
    CCGRAPH_CHECK(static_cast<int>(x.placements.size()) == mesh.ndim(), O::name, ": ", x.placements.size(),
                  " placements ", placements_str(x.placements), " for a ", mesh.ndim(), "-d mesh ", mesh.str());
    for (auto& p : x.placements) p = p.normalized(x.shape.size(), O::name.data());
  }
  sharding_choice c;
  if constexpr (!std::is_same_v<typename op_traits<O>::sharding, sharding_todo>) {
    std::vector<int> mesh_shape;
    for (int m = 0; m < mesh.ndim(); ++m) mesh_shape.push_back(mesh.size(m));
    c.strategies = op_traits<O>::sharding::strategies(o, sharding_args{in, mesh_shape});
    double best = std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < c.strategies.size(); ++k) {
      double us = 0;
      for (std::size_t i = 0; i < in.size(); ++i)
        us += detail::redistribute_cost(cm, mesh, in[i], c.strategies[k].in.at(i), elem_bytes);
      c.costs.push_back(us);
      if (us < best) {
        best = us;
        c.chosen = k;
      }
    }
    CCGRAPH_CHECK(best < std::numeric_limits<double>::infinity(), O::name, ": no sharding strategy fits inputs laid out as ",
                  [&] {
                    std::string s;
                    for (auto& x : in) s += placements_str(x.placements) + " ";
                    return s;
                  }());
  }
  return c;
}

namespace detail {

/// `d` laid out as `p` for an op (PyTorch's internal redistribute: Replicate -> Partial(sum)
/// allowed, the value divided by the mesh dim's size).
template <class T, class L>
dtensor<T, L> place_for(const dtensor<T, L>& d, const std::vector<placement>& p, const char* what) {
  if (d.placements() == p) return d;
  return d.redistribute_unchecked(p, what, true);
}

/// The calling rank's mesh check: every input on one mesh.
template <class D0, class... D>
void check_same_mesh(std::string_view what, const D0& d0, const D&... ds) {
  auto one = [&](const auto& d) {
    CCGRAPH_CHECK(d.mesh() == d0.mesh(), what, ": dtensors on different meshes ", d0.mesh().str(), " and ",
                  d.mesh().str());
  };
  (one(ds), ...);
  (void)one;  // no other input
}

/// The generic dtensor call of op `o`: choose, redistribute each input to the strategy's
/// placements, run `local(locals...)`, wrap the result with the strategy's output placements
/// and the global shape op_traits<O>::infer gives for the global input shapes.
template <class O, class F, class D0, class... D>
auto sharded_call(const O& o, F&& local, const D0& d0, const D&... ds) {
  const std::string what(O::name);
  check_same_mesh(what, d0, ds...);
  const auto choice = choose_sharding(o, {spec_of(d0), spec_of(ds)...}, d0.mesh(), sizeof(typename D0::value_type));
  const sharding_strategy& s = choice.best();
  auto placed = [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::tuple{place_for(d0, s.in[0], what.c_str()), place_for(ds, s.in[K + 1], what.c_str())...};
  }(std::index_sequence_for<D...>{});
  auto out = std::apply([&](const auto&... p) { return as_value(local(p.local_value()...)); }, placed);
  using R = typename decltype(out)::value_type;
  const shape_t shape =
      op_traits<O>::infer(o, {tensor_meta{dtype_v<typename D0::value_type>, d0.shape()},
                              tensor_meta{dtype_v<typename D::value_type>, ds.shape()}...},
                          infer_ctx{})
          .at(0)
          .shape;
  return dtensor<R, decltype(out)>(std::move(out), d0.mesh(), s.out, shape);
}

}  // namespace detail

/// Any op `o` (an ops:: struct with one output) on dtensors: its sharding rule, then the op on
/// the local values (`detail::apply_op_n`). An op without a rule is an error naming it.
template <class O, class T, class L, class... D>
auto dtensor_op(const O& o, const dtensor<T, L>& x, const D&... xs) {
  return detail::sharded_call(
      o, [&](const auto&... v) { return std::get<0>(detail::apply_op_n<T>(o, v...)); }, x, xs...);
}

// ---------------------------------------------------------------------------------------------
// Pointwise
// ---------------------------------------------------------------------------------------------

/// A pointwise function `f` of dtensors (applied to the local values: tensors, or symbolic
/// values when traced), named `name` for its sharding rule (sharding_rules::pointwise: "add",
/// "sub", "mul", "div" are linear in a Partial input as PyTorch's, "neg", "mul_scalar" and
/// "div_scalar" too; any other name reduces Partial inputs first).
template <class F, class T, class L, class... D>
auto pointwise(std::string_view name, F&& f, const dtensor<T, L>& x, const D&... xs) {
  const ops::pointwise o{std::string(name), std::string(name), nullptr};  // the rule reads the name only
  return detail::sharded_call(o, std::forward<F>(f), x, xs...);
}

/// a + b (broadcasting).
template <class T, class L>
dtensor<T, L> operator+(const dtensor<T, L>& a, const dtensor<T, L>& b) {
  return pointwise("add", [](const L& x, const L& y) { return x + y; }, a, b);
}
/// a - b (broadcasting).
template <class T, class L>
dtensor<T, L> operator-(const dtensor<T, L>& a, const dtensor<T, L>& b) {
  return pointwise("sub", [](const L& x, const L& y) { return x - y; }, a, b);
}
/// a * b (broadcasting).
template <class T, class L>
dtensor<T, L> operator*(const dtensor<T, L>& a, const dtensor<T, L>& b) {
  return pointwise("mul", [](const L& x, const L& y) { return x * y; }, a, b);
}
/// a / b (broadcasting).
template <class T, class L>
dtensor<T, L> operator/(const dtensor<T, L>& a, const dtensor<T, L>& b) {
  return pointwise("div", [](const L& x, const L& y) { return x / y; }, a, b);
}
/// -a (linear: a Partial stays Partial).
template <class T, class L>
dtensor<T, L> operator-(const dtensor<T, L>& a) {
  return pointwise("neg", [](const L& x) { return -x; }, a);
}
/// a * s (linear: a Partial stays Partial).
template <class T, class L>
dtensor<T, L> operator*(const dtensor<T, L>& a, T s) {
  return pointwise("mul_scalar", [s](const L& x) { return x * s; }, a);
}
/// s * a.
template <class T, class L>
dtensor<T, L> operator*(T s, const dtensor<T, L>& a) {
  return a * s;
}
/// a / s (linear: a Partial stays Partial).
template <class T, class L>
dtensor<T, L> operator/(const dtensor<T, L>& a, T s) {
  return pointwise("div_scalar", [s](const L& x) { return x / s; }, a);
}
/// a + s (not linear: a Partial is reduced first).
template <class T, class L>
dtensor<T, L> operator+(const dtensor<T, L>& a, T s) {
  return pointwise("add_scalar", [s](const L& x) { return x + s; }, a);
}
/// a - s (not linear: a Partial is reduced first).
template <class T, class L>
dtensor<T, L> operator-(const dtensor<T, L>& a, T s) {
  return pointwise("sub_scalar", [s](const L& x) { return x - s; }, a);
}

// ---------------------------------------------------------------------------------------------
// Products
// ---------------------------------------------------------------------------------------------

/// torch.matmul on dtensors of 2 or more dims (sharding_rules::matmul). The seed's
/// Shard(0) x Shard(1) gathers the Shard(1) operand (output Shard(0)): the two one-gather
/// strategies cost the same and the Shard(m) one comes first.
template <class T, class L>
dtensor<T, L> matmul(const dtensor<T, L>& a, const dtensor<T, L>& b) {
  return detail::sharded_call(ops::matmul{}, [](const L& x, const L& y) { return matmul(x, y); }, a, b);
}
/// torch.bmm on dtensors (sharding_rules::bmm).
template <class T, class L>
dtensor<T, L> bmm(const dtensor<T, L>& a, const dtensor<T, L>& b) {
  return detail::sharded_call(ops::bmm{}, [](const L& x, const L& y) { return bmm(x, y); }, a, b);
}
/// linear(x, w[, bias], activation) on dtensors (sharding_rules::linear): column-wise (w
/// Shard(0)) gives Shard(-1), row-wise (x Shard(-1), w Shard(1)) Partial(sum).
template <class T, class L>
dtensor<T, L> linear(const dtensor<T, L>& x, const dtensor<T, L>& w,
                     const std::optional<dtensor<T, L>>& bias = std::nullopt,
                     linear_activation activation = linear_activation::none) {
  const ops::linear o{activation};
  if (bias)
    return detail::sharded_call(
        o, [activation](const L& a, const L& b, const L& c) { return linear(a, b, std::optional<L>(c), activation); },
        x, w, *bias);
  return detail::sharded_call(
      o, [activation](const L& a, const L& b) { return linear(a, b, std::optional<L>(), activation); }, x, w);
}

// ---------------------------------------------------------------------------------------------
// Reductions, normalisation, embedding
// ---------------------------------------------------------------------------------------------

/// torch.sum over `dims` (empty: all) on a dtensor (sharding_rules::reduction): a sharded
/// reduced dim gives Partial(sum).
template <class T, class L>
auto sum(const dtensor<T, L>& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false) {
  const ops::sum o{dims, keepdim};
  return detail::sharded_call(o, [&](const L& v) { return sum(v, dims, keepdim); }, x);
}
/// torch.mean over `dims` on a dtensor: a sharded reduced dim gives Partial(avg) when it divides
/// evenly, else it is gathered first.
template <class T, class L>
dtensor<T, L> mean(const dtensor<T, L>& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false) {
  const ops::mean o{dims, keepdim};
  return detail::sharded_call(o, [&](const L& v) { return mean(v, dims, keepdim); }, x);
}
/// torch.var over `dims` on a dtensor (sharding_rules::var): the reduced dims whole (gathered
/// when sharded), a Partial reduced first.
template <class T, class L>
dtensor<T, L> var(const dtensor<T, L>& x, const std::vector<std::int64_t>& dims = {}, double correction = 1.0,
                  bool keepdim = false) {
  const ops::var o{dims, correction, keepdim};
  return detail::sharded_call(o, [&](const L& v) { return var(v, dims, correction, keepdim); }, x);
}
/// torch.amax over `dims` (empty: all) on a dtensor (sharding_rules::extreme): a sharded reduced
/// dim gives Partial(max).
template <class T, class L>
dtensor<T, L> amax(const dtensor<T, L>& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false) {
  return detail::sharded_call(ops::amax{dims, keepdim}, [&](const L& v) { return amax(v, dims, keepdim); }, x);
}
/// torch.amin over `dims` on a dtensor: a sharded reduced dim gives Partial(min).
template <class T, class L>
dtensor<T, L> amin(const dtensor<T, L>& x, const std::vector<std::int64_t>& dims = {}, bool keepdim = false) {
  return detail::sharded_call(ops::amin{dims, keepdim}, [&](const L& v) { return amin(v, dims, keepdim); }, x);
}
/// torch.max(x), 0-d, on a dtensor: a sharded input gives Partial(max).
template <class T, class L>
dtensor<T, L> max(const dtensor<T, L>& x) {
  return detail::sharded_call(ops::max{}, [](const L& v) { return max(v); }, x);
}
/// torch.min(x), 0-d, on a dtensor: a sharded input gives Partial(min).
template <class T, class L>
dtensor<T, L> min(const dtensor<T, L>& x) {
  return detail::sharded_call(ops::min{}, [](const L& v) { return min(v); }, x);
}

namespace detail {
/// max(dim) / min(dim) on a dtensor: both outputs (values, indices) placed as the rule's output.
template <class O, class T, class L, class F>
auto extreme_dim(const O& o, const dtensor<T, L>& x, F&& local) {
  const auto choice = choose_sharding(o, {spec_of(x)}, x.mesh(), sizeof(T));
  const sharding_strategy& s = choice.best();
  auto [values, indices] = local(place_for(x, s.in.at(0), O::name.data()).local_value());
  const shape_t shape = op_traits<O>::infer(o, {tensor_meta{dtype_v<T>, x.shape()}}, infer_ctx{}).at(0).shape;
  using LI = decltype(as_value(indices));
  return std::tuple{dtensor<T, decltype(as_value(values))>(as_value(values), x.mesh(), s.out, shape),
                    dtensor<std::int64_t, LI>(as_value(indices), x.mesh(), s.out, shape)};
}
}  // namespace detail

/// torch.max(x, dim, keepdim) on a dtensor: {values, i64 indices}, `dim` whole (gathered when
/// sharded: local indices do not reduce across ranks), a Partial reduced first.
template <class T, class L>
auto max(const dtensor<T, L>& x, std::int64_t dim, bool keepdim = false) {
  return detail::extreme_dim(ops::max_dim{dim, keepdim}, x, [&](const L& v) { return max(v, dim, keepdim); });
}
/// torch.min(x, dim, keepdim) on a dtensor: as max(x, dim, keepdim).
template <class T, class L>
auto min(const dtensor<T, L>& x, std::int64_t dim, bool keepdim = false) {
  return detail::extreme_dim(ops::min_dim{dim, keepdim}, x, [&](const L& v) { return min(v, dim, keepdim); });
}
/// torch.argmax(x, dim, keepdim) on a dtensor (i64): `dim` (no dim: every dim) whole.
template <class T, class L>
auto argmax(const dtensor<T, L>& x, std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false) {
  return detail::sharded_call(ops::argmax{dim, keepdim}, [&](const L& v) { return argmax(v, dim, keepdim); }, x);
}
/// torch.argmin(x, dim, keepdim) on a dtensor (i64): `dim` (no dim: every dim) whole.
template <class T, class L>
auto argmin(const dtensor<T, L>& x, std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false) {
  return detail::sharded_call(ops::argmin{dim, keepdim}, [&](const L& v) { return argmin(v, dim, keepdim); }, x);
}
/// softmax along `dim` on a dtensor: that dim whole (gathered when sharded).
template <class T, class L>
dtensor<T, L> softmax(const dtensor<T, L>& x, std::int64_t dim) {
  return detail::sharded_call(ops::softmax{dim}, [dim](const L& v) { return softmax(v, dim); }, x);
}
/// log_softmax along `dim` on a dtensor: that dim whole (gathered when sharded).
template <class T, class L>
dtensor<T, L> log_softmax(const dtensor<T, L>& x, std::int64_t dim) {
  return detail::sharded_call(ops::log_softmax{dim}, [dim](const L& v) { return log_softmax(v, dim); }, x);
}
/// softmax's gradient on dtensors (sharding_rules::softmax_backward): grad and output laid out
/// as the more sharded of them, `dim` whole.
template <class T, class L>
dtensor<T, L> softmax_backward(const dtensor<T, L>& grad, const dtensor<T, L>& output, std::int64_t dim) {
  return detail::sharded_call(
      ops::softmax_backward{dim}, [dim](const L& g, const L& y) { return softmax_backward(g, y, dim); }, grad, output);
}
/// log_softmax's gradient on dtensors: as softmax_backward.
template <class T, class L>
dtensor<T, L> log_softmax_backward(const dtensor<T, L>& grad, const dtensor<T, L>& output, std::int64_t dim) {
  return detail::sharded_call(
      ops::log_softmax_backward{dim}, [dim](const L& g, const L& y) { return log_softmax_backward(g, y, dim); }, grad,
      output);
}
/// layer_norm's output on dtensors (F.layer_norm): the normalized dims whole, weight and bias
/// Replicate (sharding_rules::layer_norm).
template <class T, class L>
dtensor<T, L> layer_norm(const dtensor<T, L>& x, const std::vector<std::int64_t>& normalized_shape,
                         const std::optional<dtensor<T, L>>& weight = std::nullopt,
                         const std::optional<dtensor<T, L>>& bias = std::nullopt, double eps = 1e-5) {
  const ops::layer_norm o{normalized_shape, eps, weight.has_value(), bias.has_value()};
  auto run = [&](const L& v, std::optional<L> w, std::optional<L> b) {
    return std::get<0>(native_layer_norm(v, normalized_shape, w, b, eps));
  };
  if (weight && bias)
    return detail::sharded_call(o, [&](const L& v, const L& w, const L& b) { return run(v, w, b); }, x, *weight, *bias);
  if (weight) return detail::sharded_call(o, [&](const L& v, const L& w) { return run(v, w, std::nullopt); }, x, *weight);
  if (bias) return detail::sharded_call(o, [&](const L& v, const L& b) { return run(v, std::nullopt, b); }, x, *bias);
  return detail::sharded_call(o, [&](const L& v) { return run(v, std::nullopt, std::nullopt); }, x);
}
/// layer_norm(x, weight[, bias], eps) on dtensors (API.md's form): over the trailing dims of
/// weight's shape.
template <class T, class L>
dtensor<T, L> layer_norm(const dtensor<T, L>& x, const dtensor<T, L>& weight,
                         const std::optional<dtensor<T, L>>& bias = std::nullopt, double eps = 1e-5) {
  return layer_norm(x, std::vector<std::int64_t>(weight.shape().begin(), weight.shape().end()),
                    std::optional<dtensor<T, L>>(weight), bias, eps);
}
/// rms_norm's output on dtensors (F.rms_norm): as layer_norm, the normalized dims whole and the
/// weight Replicate (sharding_rules::layer_norm).
template <class T, class L>
dtensor<T, L> rms_norm(const dtensor<T, L>& x, const std::vector<std::int64_t>& normalized_shape,
                       const std::optional<std::type_identity_t<dtensor<T, L>>>& weight = std::nullopt,
                       std::optional<double> eps = std::nullopt) {
  // The op's eps attribute only matters for its traits; the local call passes `eps` itself.
  const ops::rms_norm o{normalized_shape, eps.value_or(0.0), weight.has_value()};
  if (weight)
    return detail::sharded_call(
        o, [&](const L& v, const L& w) { return rms_norm(v, normalized_shape, std::optional<L>(w), eps); }, x, *weight);
  return detail::sharded_call(o, [&](const L& v) { return rms_norm(v, normalized_shape, std::nullopt, eps); }, x);
}
/// cross_entropy(input, target[, weight], ...) on dtensors (sharding_rules::cross_entropy): a
/// batch dim sharded stays so with reduction "none", gives Partial(sum) with "sum"; the class
/// dim is whole; "mean" gathers the batch.
template <class T, class L, class LI>
dtensor<T, L> cross_entropy(const dtensor<T, L>& input, const dtensor<std::int64_t, LI>& target,
                            const std::optional<std::type_identity_t<dtensor<T, L>>>& weight = std::nullopt,
                            std::int64_t ignore_index = -100,
                            loss_reduction reduction = loss_reduction::mean, double label_smoothing = 0.0) {
  const ops::cross_entropy o{reduction, ignore_index, label_smoothing, weight.has_value()};
  if (weight)
    return detail::sharded_call(
        o,
        [&](const L& x, const LI& t, const L& w) {
          return cross_entropy(x, t, std::optional<L>(w), ignore_index, reduction, label_smoothing);
        },
        input, target, *weight);
  return detail::sharded_call(
      o, [&](const L& x, const LI& t) { return cross_entropy(x, t, std::nullopt, ignore_index, reduction, label_smoothing); },
      input, target);
}
/// scaled_dot_product_attention(q, k, v) on dtensors (sharding_rules::sdpa): the heads or a
/// batch dim sharded on q, k and v gives the output sharded likewise; else Replicate.
template <class T, class L>
dtensor<T, L> scaled_dot_product_attention(const dtensor<T, L>& q, const dtensor<T, L>& k, const dtensor<T, L>& v,
                                           double dropout_p = 0.0, bool is_causal = false,
                                           std::optional<double> scale = std::nullopt) {
  return detail::sharded_call(
      ops::scaled_dot_product_attention{dropout_p, is_causal, scale},
      [&](const L& a, const L& b, const L& c) { return scaled_dot_product_attention(a, b, c, dropout_p, is_causal, scale); },
      q, k, v);
}
/// scaled_dot_product_attention with a dtensor attn_mask: the mask sharded as the output where it
/// does not broadcast.
template <class T, class L, class M, class LM>
dtensor<T, L> scaled_dot_product_attention(const dtensor<T, L>& q, const dtensor<T, L>& k, const dtensor<T, L>& v,
                                           const dtensor<M, LM>& attn_mask, double dropout_p = 0.0,
                                           bool is_causal = false, std::optional<double> scale = std::nullopt) {
  return detail::sharded_call(
      ops::scaled_dot_product_attention{dropout_p, is_causal, scale},
      [&](const L& a, const L& b, const L& c, const LM& m) {
        return scaled_dot_product_attention(a, b, c, m, dropout_p, is_causal, scale);
      },
      q, k, v, attn_mask);
}
/// embedding(indices, weight) on dtensors (sharding_rules::embedding).
template <class I, class LI, class T, class L>
dtensor<T, L> embedding(const dtensor<I, LI>& indices, const dtensor<T, L>& weight,
                        std::optional<std::int64_t> padding_idx = std::nullopt) {
  const ops::embedding o{padding_idx};
  return detail::sharded_call(
      o, [&](const LI& i, const L& w) { return embedding(i, w, padding_idx); }, indices, weight);
}

/// index_select(input, dim, index) on dtensors (sharding_rules::index_select): input sharded on
/// another dim, or index sharded (input Replicate), or an input Partial, pass without collective.
template <class T, class L, class I, class LI>
dtensor<T, L> index_select(const dtensor<T, L>& input, std::int64_t dim, const dtensor<I, LI>& index) {
  return detail::sharded_call(
      ops::index_select{dim}, [&](const L& x, const LI& i) { return index_select(x, dim, i); }, input, index);
}
/// gather(input, dim, index) on dtensors (sharding_rules::gather).
template <class T, class L, class LI>
dtensor<T, L> gather(const dtensor<T, L>& input, std::int64_t dim, const dtensor<std::int64_t, LI>& index) {
  return detail::sharded_call(ops::gather{dim}, [&](const L& x, const LI& i) { return gather(x, dim, i); }, input,
                              index);
}
/// scatter_add(self, dim, index, src) on dtensors (sharding_rules::scatter_add).
template <class T, class L, class LI>
dtensor<T, L> scatter_add(const dtensor<T, L>& self, std::int64_t dim, const dtensor<std::int64_t, LI>& index,
                          const dtensor<T, L>& src) {
  return detail::sharded_call(
      ops::scatter_add{dim}, [&](const L& x, const LI& i, const L& y) { return scatter_add(x, dim, i, y); }, self, index,
      src);
}

// ---------------------------------------------------------------------------------------------
// Views and cat
// ---------------------------------------------------------------------------------------------

/// x.transpose(dim0, dim1) on a dtensor: a Shard's dim follows. No communication.
template <class T, class L>
dtensor<T, L> transpose(const dtensor<T, L>& x, std::int64_t dim0, std::int64_t dim1) {
  return detail::sharded_call(ops::transpose{dim0, dim1}, [&](const L& v) { return v.transpose(dim0, dim1); }, x);
}
/// x.permute(dims) on a dtensor: a Shard's dim follows. No communication.
template <class T, class L>
dtensor<T, L> permute(const dtensor<T, L>& x, const std::vector<std::int64_t>& dims) {
  return detail::sharded_call(ops::permute{dims}, [&](const L& v) { return v.permute(dims); }, x);
}
/// x.reshape(shape) on a dtensor (sharding_rules::reshape): a Shard maps where the reshape
/// keeps, flattens or splits its dim evenly; otherwise that mesh dim is gathered first.
template <class T, class L>
dtensor<T, L> reshape(const dtensor<T, L>& x, const std::vector<std::int64_t>& shape) {
  const ops::reshape o{shape};
  const shape_t global = sharding_rules::reshape::resolve(x.shape(), shape);
  auto local = [&](const L& v) {
    const int me = detail::collective_backend<L>::rank("reshape");
    const auto piece = local_shape_and_offset(
        global, x.mesh(), x.mesh().coordinate(me),
        choose_sharding(o, {spec_of(x)}, x.mesh(), sizeof(T)).best().out).first;
    return v.reshape(std::vector<std::int64_t>(piece.begin(), piece.end()));
  };
  return detail::sharded_call(o, local, x);
}
namespace detail {
/// An op over a list of dtensors (cat, stack): the cheapest of its rule's strategies, each input
/// placed as the strategy says, `join` over the local pieces, the global shape from the op's
/// infer.
template <class O, class T, class L, class Join>
dtensor<T, L> sharded_list_call(const O& o, const std::vector<dtensor<T, L>>& xs, const char* name, Join join) {
  CCGRAPH_CHECK(!xs.empty(), name, ": no dtensors");
  std::vector<dtensor_spec> specs;
  for (const auto& x : xs) {
    check_same_mesh(name, xs.front(), x);
    specs.push_back(spec_of(x));
  }
  const sharding_strategy s = choose_sharding(o, specs, xs.front().mesh(), sizeof(T)).best();
  std::vector<L> locals;
  std::vector<tensor_meta> metas;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    locals.push_back(place_for(xs[i], s.in[i], name).local_value());
    metas.push_back({dtype_v<T>, xs[i].shape()});
  }
  L out = join(locals);
  const shape_t shape = op_traits<O>::infer(o, metas, infer_ctx{}).at(0).shape;
  return dtensor<T, L>(std::move(out), xs.front().mesh(), s.out, shape);
}
}  // namespace detail

/// cat(xs, dim) on dtensors (sharding_rules::cat): a Shard of `dim` is gathered first.
template <class T, class L>
dtensor<T, L> cat(const std::vector<dtensor<T, L>>& xs, std::int64_t dim = 0) {
  return detail::sharded_list_call(ops::cat{dim}, xs, "cat", [dim](const std::vector<L>& ls) { return cat(ls, dim); });
}

/// x.narrow(dim, start, length) on a dtensor (sharding_rules::narrow): a Shard of `dim` is
/// gathered first unless the narrow keeps all of it.
template <class T, class L>
dtensor<T, L> narrow(const dtensor<T, L>& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  const int d = normalize_dim(dim, x.shape().size(), "narrow");
  const bool whole = start == 0 && length == x.shape()[static_cast<std::size_t>(d)];
  return detail::sharded_call(
      ops::narrow{dim, start, length},
      [&](const L& v) { return whole ? v.narrow(d, 0, v.shape()[static_cast<std::size_t>(d)]) : v.narrow(d, start, length); },
      x);
}
/// x.select(dim, index) on a dtensor (sharding_rules::select): a Shard of `dim` is gathered
/// first; later Shards move down one.
template <class T, class L>
dtensor<T, L> select(const dtensor<T, L>& x, std::int64_t dim, std::int64_t index) {
  return detail::sharded_call(ops::select{dim, index}, [&](const L& v) { return v.select(dim, index); }, x);
}
/// x.unsqueeze(dim) on a dtensor: Shards of `dim` and later move up one. No communication.
template <class T, class L>
dtensor<T, L> unsqueeze(const dtensor<T, L>& x, std::int64_t dim) {
  return detail::sharded_call(ops::unsqueeze{dim}, [&](const L& v) { return v.unsqueeze(dim); }, x);
}
/// x.squeeze(dim) on a dtensor: drops `dim` when its global size is 1 (a local piece of size 1
/// of a longer dim stays). No communication.
template <class T, class L>
dtensor<T, L> squeeze(const dtensor<T, L>& x, std::int64_t dim) {
  const bool drops =
      !x.shape().empty() && x.shape()[static_cast<std::size_t>(normalize_dim(dim, x.shape().size(), "squeeze"))] == 1;
  return detail::sharded_call(ops::squeeze{dim}, [&](const L& v) { return drops ? squeeze(v, dim) : v; }, x);
}
/// x.contiguous() on a dtensor: placements kept.
template <class T, class L>
dtensor<T, L> contiguous(const dtensor<T, L>& x) {
  return detail::sharded_call(ops::contiguous{}, [](const L& v) { return v.contiguous(); }, x);
}
/// x.repeat(repeats) on a dtensor (sharding_rules::repeat): a Shard of a dim repeated more than
/// once is gathered first.
template <class T, class L>
dtensor<T, L> repeat(const dtensor<T, L>& x, const std::vector<std::int64_t>& repeats) {
  return detail::sharded_call(ops::repeat{repeats}, [&](const L& v) { return v.repeat(repeats); }, x);
}
/// copy_(dst, src) made functional on dtensors: a new dtensor of dst's shape holding src
/// (broadcast), laid out as pointwise over (dst, src) (sharding_rules::copy).
template <class T, class L>
dtensor<T, L> copy(const dtensor<T, L>& dst, const dtensor<T, L>& src) {
  return detail::sharded_call(
      ops::copy{},
      [](const L& d, const L& s) {
        if constexpr (is_traced_v<L>) {
          return copy(d, s);
        } else {
          L r = d.clone();
          r.copy_(s);
          return r;
        }
      },
      dst, src);
}
/// stack(xs, dim) on dtensors (sharding_rules::stack): the inputs follow one merged placement.
template <class T, class L>
dtensor<T, L> stack(const std::vector<dtensor<T, L>>& xs, std::int64_t dim = 0) {
  return detail::sharded_list_call(ops::stack{dim}, xs, "stack",
                                   [dim](const std::vector<L>& ls) { return stack(ls, dim); });
}

}  // namespace ccgraph
