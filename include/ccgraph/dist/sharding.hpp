// ccgraph/dist/sharding.hpp: the sharding rules ops name in their op_traits `sharding` slot
// (PyTorch's DTensor op strategies, torch/distributed/tensor/_ops/). A rule lists, for an op
// and its inputs' global shapes and placements, the candidate strategies: the output's
// placements and the placements each input must be redistributed to. dist/ops.hpp prices each
// candidate by its redistributions and runs the cheapest.
//
// Most rules are written per mesh dim (a list of options on one mesh dim) and expanded to the
// whole mesh as PyTorch's expand_to_full_mesh_op_strategy: the cartesian product, mesh dim 0
// outermost. The order of the list is the tie-break (docs/concepts.md "Sharding propagation").
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/dist/placement.hpp>
#include <ccgraph/ops/op_traits.hpp>

namespace ccgraph {

/// What a sharding rule sees of one input (PyTorch's DTensorSpec): its global shape and one
/// placement per mesh dim (shard dims non-negative).
struct dtensor_spec {
  shape_t shape;
  std::vector<placement> placements;
};

/// One candidate of an op's sharding rule (PyTorch's OpSpec): the output's placements and the
/// placements each input must have.
struct sharding_strategy {
  std::vector<placement> out;
  std::vector<std::vector<placement>> in;
  /// Same output and input placements.
  friend bool operator==(const sharding_strategy&, const sharding_strategy&) = default;
};

/// What a rule reads: the inputs and the mesh's shape.
struct sharding_args {
  const std::vector<dtensor_spec>& in;
  std::vector<int> mesh_shape;
  /// Number of mesh dims.
  int mesh_ndim() const { return static_cast<int>(mesh_shape.size()); }
};

namespace detail::sharding {

/// One option on one mesh dim: the output's placement and each input's.
struct dim_option {
  placement out;
  std::vector<placement> in;
  friend bool operator==(const dim_option&, const dim_option&) = default;
};

/// Appends `o` unless the list has it (the first occurrence keeps its rank in the order).
inline void add_unique(std::vector<dim_option>& list, dim_option o) {
  if (std::find(list.begin(), list.end(), o) == list.end()) list.push_back(std::move(o));
}

/// All-Replicate for `n` inputs.
inline dim_option all_replicate(std::size_t n) { return {replicate(), std::vector<placement>(n, replicate())}; }

/// The cartesian product of per-mesh-dim options (`options_of(m)` for mesh dim m), mesh dim 0
/// outermost, as itertools.product in PyTorch's expand_to_full_mesh_op_strategy.
template <class F>
std::vector<sharding_strategy> expand(const sharding_args& a, std::size_t n_inputs, F&& options_of) {
  std::vector<std::vector<dim_option>> per;
  for (int m = 0; m < a.mesh_ndim(); ++m) per.push_back(options_of(m));
  std::vector<sharding_strategy> out;
  std::vector<std::size_t> idx(per.size(), 0);
  for (const auto& p : per)
    if (p.empty()) return out;
  while (true) {
    sharding_strategy s;
    s.in.assign(n_inputs, {});
    for (std::size_t m = 0; m < per.size(); ++m) {
      const dim_option& o = per[m][idx[m]];
      s.out.push_back(o.out);
      for (std::size_t i = 0; i < n_inputs; ++i) s.in[i].push_back(o.in.at(i));
    }
    out.push_back(std::move(s));
    std::size_t m = per.size();
    while (m > 0) {
      --m;
      if (++idx[m] < per[m].size()) break;
      idx[m] = 0;
      if (m == 0) return out;
    }
    if (per.empty()) return out;
  }
}

/// Product of the mesh sizes of the mesh dims that shard tensor dim `d` in `ps`.
inline std::int64_t shards_of(const sharding_args& a, const std::vector<placement>& ps, std::int64_t d) {
  std::int64_t n = 1;
  for (std::size_t m = 0; m < ps.size(); ++m)
    if (ps[m].is_shard(d)) n *= a.mesh_shape[m];
  return n;
}

/// Whether every rank's piece of tensor dim `d` (laid out as `ps`) holds an element: a max or
/// min of an empty piece has no identity to give.
inline bool no_empty_piece(const sharding_args& a, const dtensor_spec& x, std::int64_t d) {
  std::vector<std::int64_t> sizes{x.shape[static_cast<std::size_t>(d)]};
  for (std::size_t m = 0; m < x.placements.size(); ++m) {
    if (!x.placements[m].is_shard(d)) continue;
    std::vector<std::int64_t> next;
    for (auto s : sizes)
      for (int i = 0; i < a.mesh_shape[m]; ++i) next.push_back(local_shard_size_and_offset(s, a.mesh_shape[m], i).first);
    sizes = std::move(next);
  }
  return std::all_of(sizes.begin(), sizes.end(), [](std::int64_t s) { return s > 0; });
}

/// A reduction whose Partial inputs pass through linear ops (sum, avg).
inline bool linear_partial(const placement& p) {
  return p.is_partial(reduce_op::sum) || p.is_partial(reduce_op::avg);
}

/// Which dims of an `n`-d input `dims` reduce (empty: every dim), for `what`'s errors.
inline std::vector<bool> reduced_dims(const std::vector<std::int64_t>& dims, std::size_t n, const char* what) {
  std::vector<bool> reduced(n, dims.empty());
  for (auto d : dims) reduced[static_cast<std::size_t>(normalize_dim(d, n, what))] = true;
  return reduced;
}

/// The output dim of kept input dim `d` of a reduction over `reduced` (dims before it removed
/// unless `keepdim`).
inline std::int64_t kept_dim(const std::vector<bool>& reduced, bool keepdim, std::int64_t d) {
  std::int64_t od = d;
  if (!keepdim)
    for (std::int64_t e = 0; e < d; ++e) od -= reduced[static_cast<std::size_t>(e)] ? 1 : 0;
  return od;
}

/// The options of a reduction of one input over `reduced` on a mesh dim where the input is `p`
/// (PyTorch's common_reduction_strategy): a Shard of a kept dim moves with the removed dims; a
/// Shard of a reduced dim gives `reduced_shard` when it has one (the Partial of a reduction
/// that is linear: f(f(a), f(b)) = f(a, b)), else it is gathered; a Partial passes where
/// `partial_passes` says so, else it is reduced; then all-Replicate.
template <class F>
std::vector<dim_option> reduction_options(const std::vector<bool>& reduced, bool keepdim, const placement& p,
                                          const std::optional<placement>& reduced_shard, F&& partial_passes) {
  std::vector<dim_option> opts;
  if (p.is_shard()) {
    if (!reduced[static_cast<std::size_t>(p.dim())]) opts.push_back({shard(kept_dim(reduced, keepdim, p.dim())), {p}});
    else if (reduced_shard) opts.push_back({*reduced_shard, {p}});
  } else if (p.is_partial() && partial_passes(p)) {
    opts.push_back({p, {p}});
  }
  add_unique(opts, all_replicate(1));
  return opts;
}

/// A single-input op that moves dims without reading across them (views): each mesh dim's
/// placement kept, a Shard's dim mapped by `map_dim` (-1: that dim must be whole, the input
/// gathered on that mesh dim). Partial and Replicate pass: these ops are linear.
template <class F>
std::vector<sharding_strategy> follow_dims(const sharding_args& a, F&& map_dim) {
  return expand(a, 1, [&](int m) {
    const placement p = a.in.at(0).placements[static_cast<std::size_t>(m)];
    if (!p.is_shard()) return std::vector<dim_option>{{p, {p}}};
    const std::int64_t d = map_dim(p.dim());
    if (d < 0) return std::vector<dim_option>{{replicate(), {replicate()}}};
    return std::vector<dim_option>{{shard(d), {p}}};
  });
}

}  // namespace detail::sharding

namespace sharding_rules {

/// Pointwise ops (a fused expression named by `fused`), with broadcasting, as PyTorch's
/// pointwise_strategy: on each mesh dim, one option following each input's placement in input
/// order, then all-Replicate. Following Shard(d): the output and every input sharded on the
/// same (broadcast-aligned) dim, an input broadcast on it Replicate. Following Partial: kept
/// only where the op is linear in that input (PyTorch's linear_pointwise_ops): "add"/"sub" of
/// two tensors (every input Partial, a Replicate one turned Partial), "mul" (the other inputs
/// Replicate), "div" (the numerator only), "neg", "mul_scalar", "div_scalar"; otherwise the
/// Partial is reduced (Replicate).
struct pointwise {
  /// The candidates for op `o` (its `fused` name decides linearity) on `a`.
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    return strategies_named(o.fused, a);
  }
  /// The candidates for the pointwise op `name` on `a` (a template only so that it compiles
  /// where it is used, not in every translation unit of the umbrella).
  template <class A = sharding_args>
  static std::vector<sharding_strategy> strategies_named(std::string_view name, const A& a) {
    using namespace detail::sharding;
    const auto& in = a.in;
    shape_t common = in.at(0).shape;
    for (const auto& s : in) common = broadcast_shapes(common, s.shape, "pointwise");
    const auto cn = static_cast<std::int64_t>(common.size());
    const bool additive = in.size() > 1 && (name == "add" || name == "sub");
    const bool unary_linear = in.size() == 1 && (name == "neg" || name == "mul_scalar" || name == "div_scalar");
    return expand(a, in.size(), [&](int m) {
      std::vector<dim_option> opts;
      for (std::size_t i = 0; i < in.size(); ++i) {
        const placement p = in[i].placements[static_cast<std::size_t>(m)];
        dim_option o = all_replicate(in.size());
        if (p.is_shard()) {
          const std::int64_t od = cn - static_cast<std::int64_t>(in[i].shape.size()) + p.dim();
          o.out = shard(od);
          for (std::size_t j = 0; j < in.size(); ++j) {
            const std::int64_t jd = od - (cn - static_cast<std::int64_t>(in[j].shape.size()));
            const bool broadcast = jd < 0 || (in[j].shape[static_cast<std::size_t>(jd)] == 1 &&
                                              common[static_cast<std::size_t>(od)] != 1);
            o.in[j] = broadcast ? replicate() : shard(jd);
          }
        } else if (p.is_partial() && linear_partial(p)) {
          if (additive) {
            o.out = p;
            for (auto& q : o.in) q = p;
          } else if (unary_linear || (name == "mul" && in.size() > 1) || (name == "div" && i == 0 && in.size() > 1)) {
            o.out = p;
            o.in[i] = p;
          }
        }
        add_unique(opts, std::move(o));
      }
      add_unique(opts, all_replicate(in.size()));
      return opts;
    });
  }
};

/// An elementwise op that is not linear in any input (fused_adamw): the pointwise rule of a
/// non-linear op, so a Shard of any input shards every full-shaped input and the outputs alike,
/// a 0-d input stays Replicate, and a Partial input is reduced first.
struct elementwise {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O&, const sharding_args& a) {
    return pointwise::strategies_named(O::name, a);
  }
};

/// The einsum-like strategies of a product of `a` [..., m, k] and `b` [..., k, n] (or, with
/// `b_transposed`, b [n, k]), as PyTorch's gen_einsum_strategies, in its order: all-Replicate;
/// each batch dim sharded on both; the contracting dim sharded on both (output Partial(sum));
/// m sharded on a (output Shard(m), b Replicate); n sharded on b (output Shard(n), a
/// Replicate). `extra` inputs (a bias of n) follow the output: Shard(n) with it, Partial(sum)
/// (a Replicate one divided) with a Partial output, else Replicate.
struct product_rule {
  /// The candidates (a template only so that it compiles where it is used).
  template <class A = sharding_args>
  static std::vector<sharding_strategy> make(const A& a, bool b_transposed, std::size_t extra, bool allow_contracting) {
    using namespace detail::sharding;
    const auto an = static_cast<std::int64_t>(a.in.at(0).shape.size());
    const auto bn = static_cast<std::int64_t>(a.in.at(1).shape.size());
    CCGRAPH_CHECK(an >= 2 && bn >= 2, "sharding: a matmul on dtensors needs operands of 2 or more dims, got ",
                  shape_str(a.in[0].shape), " and ", shape_str(a.in[1].shape));
    const std::int64_t on = std::max(an, b_transposed ? 2 : bn);
    const std::size_t n_in = 2 + extra;
    auto with_extra = [&](dim_option o) {
      for (std::size_t e = 0; e < extra; ++e)
        o.in[2 + e] = o.out.is_shard(on - 1) ? shard(0) : o.out.is_partial() ? partial() : replicate();
      return o;
    };
    return expand(a, n_in, [&](int) {
      std::vector<dim_option> opts;
      opts.push_back(all_replicate(n_in));
      for (std::int64_t d = 0; d < on - 2; ++d) {  // batch dims (aligned from the right)
        dim_option o = all_replicate(n_in);
        o.out = shard(d);
        const std::int64_t ad = d - (on - an), bd = d - (on - bn);
        if (ad < 0 || a.in[0].shape[static_cast<std::size_t>(ad)] == 1) continue;
        o.in[0] = shard(ad);
        if (!b_transposed && bd >= 0 && a.in[1].shape[static_cast<std::size_t>(bd)] != 1) o.in[1] = shard(bd);
        opts.push_back(with_extra(o));
      }
      if (allow_contracting) {
        dim_option o = all_replicate(n_in);
        o.out = partial();
        o.in[0] = shard(an - 1);
        o.in[1] = shard(b_transposed ? 1 : bn - 2);
        opts.push_back(with_extra(o));
      }
      {
        dim_option o = all_replicate(n_in);
        o.out = shard(on - 2);
        o.in[0] = shard(an - 2);
        opts.push_back(with_extra(o));
      }
      {
        dim_option o = all_replicate(n_in);
        o.out = shard(on - 1);
        o.in[1] = shard(b_transposed ? 0 : bn - 1);
        opts.push_back(with_extra(o));
      }
      return opts;
    });
  }
};

/// torch.matmul of operands of 2 or more dims (batch dims broadcast): product_rule.
struct matmul {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O&, const sharding_args& a) {
    return product_rule::make(a, false, 0, true);
  }
};
/// torch.bmm: product_rule (batch dim 0).
struct bmm {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O&, const sharding_args& a) {
    return product_rule::make(a, false, 0, true);
  }
};
/// linear(x, w[, bias]): product_rule with w [out, in] transposed; the contracting strategy
/// (output Partial) only without an activation (an epilogue is not linear).
struct linear {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    return product_rule::make(a, true, a.in.size() - 2, o.activation == decltype(o.activation){});
  }
};

/// sum / mean over `dims` (PyTorch's common_reduction_strategy): on each mesh dim, the input's
/// own placement kept (a Shard of a reduced dim gives Partial: sum for sum, avg for mean, the
/// latter only when the dim divides evenly; a Shard of a kept dim moves with the dims removed;
/// a Partial(sum/avg) stays), then all-Replicate.
struct reduction {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const dtensor_spec& x = a.in.at(0);
    const std::vector<bool> reduced = reduced_dims(o.dims, x.shape.size(), O::name.data());
    const bool is_mean = O::name == "mean";
    return expand(a, 1, [&](int m) {
      const placement p = x.placements[static_cast<std::size_t>(m)];
      std::optional<placement> on_reduced = partial(reduce_op::sum);
      if (is_mean) {  // local means average to the mean only over equal pieces
        on_reduced = partial(reduce_op::avg);
        if (p.is_shard() && x.shape[static_cast<std::size_t>(p.dim())] % shards_of(a, x.placements, p.dim()) != 0)
          on_reduced.reset();
      }
      return reduction_options(reduced, o.keepdim, p, on_reduced, linear_partial);
    });
  }
};

/// var over `dims` (PyTorch's std_var_reduction_strategy, reduction_linear=False): a Shard of
/// a kept dim moves with the removed dims; a reduced dim must be whole (a Shard of it
/// gathered), a Partial reduced; then all-Replicate.
struct var {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const dtensor_spec& x = a.in.at(0);
    const std::vector<bool> reduced = reduced_dims(o.dims, x.shape.size(), O::name.data());
    return expand(a, 1, [&](int m) {
      return reduction_options(reduced, o.keepdim, x.placements[static_cast<std::size_t>(m)], std::nullopt,
                               [](const placement&) { return false; });
    });
  }
};

/// amax / amin over `dims`, max() / min() over every dim (PyTorch's linear_reduction_strategy
/// with "max" / "min"): a Shard of a reduced dim gives Partial(max) / Partial(min) (the
/// extreme of the local extremes; gathered where a rank's piece is empty), a Partial of the
/// same op stays, another Partial is reduced;
/// a Shard of a kept dim moves with the removed dims; then all-Replicate.
struct extreme {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const dtensor_spec& x = a.in.at(0);
    const reduce_op op = (O::name == "amax" || O::name == "max") ? reduce_op::max : reduce_op::min;
    std::vector<bool> reduced(x.shape.size(), true);
    bool keepdim = false;
    if constexpr (requires { o.dims; }) {
      reduced = reduced_dims(o.dims, x.shape.size(), O::name.data());
      keepdim = o.keepdim;
    }
    return expand(a, 1, [&](int m) {
      const placement p = x.placements[static_cast<std::size_t>(m)];
      std::optional<placement> on_reduced = partial(op);
      if (p.is_shard() && !no_empty_piece(a, x, p.dim())) on_reduced.reset();  // gathered instead
      return reduction_options(reduced, keepdim, p, on_reduced, [op](const placement& q) { return q.is_partial(op); });
    });
  }
};

/// max(dim) / min(dim) (values and indices) and argmax / argmin (over `dim`, or the flattened
/// input): the reduced dim must be whole, as for var (PyTorch reduces the values to
/// Partial(max), but local indices do not reduce so; its argmax gathers too); a Shard of a kept
/// dim moves with the removed dim; then all-Replicate.
struct select_reduction {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const dtensor_spec& x = a.in.at(0);
    std::vector<bool> reduced(x.shape.size(), true);
    const std::optional<std::int64_t> dim = o.dim;  // argmax's may be absent: every dim
    if (dim && !x.shape.empty()) reduced = reduced_dims({*dim}, x.shape.size(), O::name.data());
    return expand(a, 1, [&](int m) {
      return reduction_options(reduced, o.keepdim, x.placements[static_cast<std::size_t>(m)], std::nullopt,
                               [](const placement&) { return false; });
    });
  }
};

/// softmax / log_softmax along `dim` (PyTorch's softmax_strategy): the input's placement kept
/// where it is a Shard of another dim, else Replicate (the softmax dim must be whole, a
/// Partial reduced); then all-Replicate.
struct softmax {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const dtensor_spec& x = a.in.at(0);
    const std::int64_t dim = normalize_dim(o.dim, x.shape.size(), O::name.data());
    return expand(a, 1, [&](int m) {
      std::vector<dim_option> opts;
      const placement p = x.placements[static_cast<std::size_t>(m)];
      if (p.is_shard() && p.dim() != dim) opts.push_back({p, {p}});
      add_unique(opts, all_replicate(1));
      return opts;
    });
  }
};

/// softmax_backward / log_softmax_backward(grad, output) along `dim` (PyTorch's
/// softmax_backward_strategy): both inputs and the result follow the placements of whichever
/// input has more shards (grad on a tie), with `dim` whole and Partials reduced; then
/// all-Replicate.
struct softmax_backward {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    const dtensor_spec& g = a.in.at(0);
    const dtensor_spec& y = a.in.at(1);
    const std::int64_t dim = normalize_dim(o.dim, g.shape.size(), O::name.data());
    auto shards = [&](const dtensor_spec& s) {
      std::int64_t n = 1;
      for (std::size_t m = 0; m < s.placements.size(); ++m)
        if (s.placements[m].is_shard()) n *= a.mesh_shape[m];
      return n;
    };
    std::vector<placement> t;
    for (const auto& p : (shards(g) >= shards(y) ? g : y).placements)
      t.push_back(p.is_partial() || p.is_shard(dim) ? replicate() : p);
    std::vector<sharding_strategy> out{{t, {t, t}}};
    const std::vector<placement> r(t.size(), replicate());
    if (t != r) out.push_back({r, {r, r}});
    return out;
  }
};

/// layer_norm over the last `normalized_shape.size()` dims (PyTorch's layer_norm_strategy): x
/// keeps a Shard of a leading dim, the normalized dims must be whole (Replicate, a Partial
/// reduced); weight and bias Replicate. The output (and its statistics) lie as x.
struct layer_norm {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const dtensor_spec& x = a.in.at(0);
    const auto axis = static_cast<std::int64_t>(x.shape.size() - o.normalized_shape.size());
    return expand(a, a.in.size(), [&](int m) {
      std::vector<dim_option> opts;
      const placement p = x.placements[static_cast<std::size_t>(m)];
      if (p.is_shard() && p.dim() < axis) {
        dim_option opt = all_replicate(a.in.size());
        opt.out = p;
        opt.in[0] = p;
        opts.push_back(opt);
      }
      add_unique(opts, all_replicate(a.in.size()));
      return opts;
    });
  }
};

/// embedding(indices, weight [V, D]) (PyTorch's embedding_strategy, without its row-wise
/// MaskPartial): all-Replicate; indices sharded on a dim (weight Replicate, output sharded
/// likewise); weight sharded column-wise, Shard(1) (indices Replicate, output sharded on D).
/// A row-wise sharded weight is gathered.
struct embedding {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O&, const sharding_args& a) {
    using namespace detail::sharding;
    const auto in_nd = static_cast<std::int64_t>(a.in.at(0).shape.size());
    return expand(a, 2, [&](int) {
      std::vector<dim_option> opts;
      opts.push_back(all_replicate(2));
      for (std::int64_t d = 0; d < in_nd; ++d) opts.push_back({shard(d), {shard(d), replicate()}});
      opts.push_back({shard(in_nd), {replicate(), shard(1)}});
      return opts;
    });
  }
};

/// transpose(dim0, dim1): the input's placement, a Shard's dim swapped. No communication.
struct transpose {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const auto n = a.in.at(0).shape.size();
    const std::int64_t d0 = normalize_dim(o.dim0, n, "transpose"), d1 = normalize_dim(o.dim1, n, "transpose");
    return expand(a, 1, [&](int m) {
      const placement p = a.in[0].placements[static_cast<std::size_t>(m)];
      if (!p.is_shard()) return std::vector<dim_option>{{p, {p}}};
      const std::int64_t d = p.dim() == d0 ? d1 : p.dim() == d1 ? d0 : p.dim();
      return std::vector<dim_option>{{shard(d), {p}}};
    });
  }
};

/// permute(dims): the input's placement, a Shard of dim dims[j] becoming Shard(j).
struct permute {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const auto n = a.in.at(0).shape.size();
    CCGRAPH_CHECK(o.dims.size() == n, "permute: ", o.dims.size(), " dims for a ", n, "-d dtensor");
    return expand(a, 1, [&](int m) {
      const placement p = a.in[0].placements[static_cast<std::size_t>(m)];
      if (!p.is_shard()) return std::vector<dim_option>{{p, {p}}};
      std::int64_t j = 0;
      for (std::size_t k = 0; k < n; ++k)
        if (normalize_dim(o.dims[k], n, "permute") == p.dim()) j = static_cast<std::int64_t>(k);
      return std::vector<dim_option>{{shard(j), {p}}};
    });
  }
};

/// reshape(shape) (PyTorch's view_groups, simplified): input and output dims are paired in
/// groups of equal element counts. A Shard of a group's first input dim maps to the group's
/// first output dim when the group is one dim to one dim, or when it flattens dims whose first
/// is sharded evenly, or splits one dim whose first piece divides evenly by the shards;
/// otherwise the input is gathered (Replicate) on that mesh dim. Partial and Replicate pass.
struct reshape {
  /// The output shape: `shape` with a -1 inferred from `in`.
  static shape_t resolve(const shape_t& in, const std::vector<std::int64_t>& shape) {
    shape_t out(shape.begin(), shape.end());
    std::int64_t known = 1;
    int infer = -1;
    for (std::size_t i = 0; i < out.size(); ++i)
      if (out[i] == -1) infer = static_cast<int>(i);
      else known *= out[i];
    if (infer >= 0) out[static_cast<std::size_t>(infer)] = known == 0 ? 0 : numel_of(in) / known;
    CCGRAPH_CHECK(numel_of(out) == numel_of(in), "reshape: shape ", list_str(shape), " is invalid for a dtensor of shape ",
                  shape_str(in));
    return out;
  }
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const shape_t& in = a.in.at(0).shape;
    const shape_t out = resolve(in, o.shape);
    // The group of each input dim: [first in, end in) x [first out, end out).
    struct group { std::size_t i0, i1, j0, j1; };
    std::vector<group> groups;
    std::size_t i = 0, j = 0;
    while (i < in.size() || j < out.size()) {
      group g{i, i, j, j};
      std::int64_t pi = 1, po = 1;
      if (i < in.size()) pi *= in[i++];
      if (j < out.size()) po *= out[j++];
      while (pi != po && (i < in.size() || j < out.size())) {
        if ((pi < po && i < in.size()) || j >= out.size()) pi *= in[i++];
        else po *= out[j++];
      }
      g.i1 = i;
      g.j1 = j;
      groups.push_back(g);
    }
    const auto& ps = a.in[0].placements;
    return expand(a, 1, [&](int m) {
      const placement p = ps[static_cast<std::size_t>(m)];
      if (!p.is_shard()) return std::vector<dim_option>{{p, {p}}};
      const auto d = static_cast<std::size_t>(p.dim());
      const std::int64_t n = shards_of(a, ps, p.dim());
      for (const auto& g : groups) {
        if (d < g.i0 || d >= g.i1) continue;
        const bool one_to_one = g.i1 - g.i0 == 1 && g.j1 - g.j0 == 1;
        const bool flatten = d == g.i0 && g.j1 - g.j0 == 1 && in[d] % n == 0;
        const bool split = d == g.i0 && g.i1 - g.i0 == 1 && g.j1 > g.j0 && out[g.j0] % n == 0;
        if (d == g.i0 && (one_to_one || flatten || split))
          return std::vector<dim_option>{{shard(static_cast<std::int64_t>(g.j0)), {p}}};
      }
      return std::vector<dim_option>{{replicate(), {replicate()}}};
    });
  }
};

/// cat(xs, dim) (PyTorch's cat_strategy): on each mesh dim, one option following each input's
/// placement in order (a Shard of another dim kept on every input, a Shard of `dim` gathered,
/// Partial(sum/avg) kept on every input, a Replicate one turned Partial: cat is linear), then
/// all-Replicate.
struct cat {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const std::int64_t dim = normalize_dim(o.dim, a.in.at(0).shape.size(), "cat");
    const std::size_t n = a.in.size();
    return expand(a, n, [&](int m) {
      std::vector<dim_option> opts;
      for (std::size_t i = 0; i < n; ++i) {
        const placement p = a.in[i].placements[static_cast<std::size_t>(m)];
        if ((p.is_shard() && p.dim() != dim) || (p.is_partial() && linear_partial(p)))
          add_unique(opts, {p, std::vector<placement>(n, p)});
      }
      add_unique(opts, all_replicate(n));
      return opts;
    });
  }
};

/// narrow(dim, start, length) (PyTorch's gen_slice_strategy): every placement kept, but a
/// Shard of `dim` is gathered unless the narrow keeps all of it (start 0, the whole length).
struct narrow {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    const shape_t& x = a.in.at(0).shape;
    const std::int64_t dim = normalize_dim(o.dim, x.size(), "narrow");
    const bool whole = o.start == 0 && o.length == x[static_cast<std::size_t>(dim)];
    return detail::sharding::follow_dims(a, [&](std::int64_t d) { return d == dim && !whole ? -1 : d; });
  }
};

/// select(dim, index) (PyTorch's select_int_strategy): a Shard of `dim` gathered, a Shard of a
/// later dim moves down one; Partial and Replicate kept.
struct select {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    const std::int64_t dim = normalize_dim(o.dim, a.in.at(0).shape.size(), "select");
    return detail::sharding::follow_dims(a, [&](std::int64_t d) { return d == dim ? -1 : d > dim ? d - 1 : d; });
  }
};

/// unsqueeze(dim) (PyTorch's dim_unsqueeze view rule): a Shard of `dim` or later moves up one.
struct unsqueeze {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    const std::int64_t dim = normalize_dim(o.dim, a.in.at(0).shape.size() + 1, "unsqueeze");
    return detail::sharding::follow_dims(a, [&](std::int64_t d) { return d >= dim ? d + 1 : d; });
  }
};

/// squeeze(dim) (PyTorch's dim_squeeze): when `dim` has size 1 it goes, a Shard of a later dim
/// moving down one (a Shard of the size-1 dim itself is gathered); otherwise nothing moves.
struct squeeze {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    const shape_t& x = a.in.at(0).shape;
    if (x.empty()) return detail::sharding::follow_dims(a, [](std::int64_t d) { return d; });
    const std::int64_t dim = normalize_dim(o.dim, x.size(), "squeeze");
    const bool drops = x[static_cast<std::size_t>(dim)] == 1;
    return detail::sharding::follow_dims(
        a, [&](std::int64_t d) { return !drops ? d : d == dim ? -1 : d > dim ? d - 1 : d; });
  }
};

/// Ops whose output lies exactly as their one input (contiguous; PyTorch's
/// propagate_single_input_strategy): every placement kept.
struct same_as_input {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O&, const sharding_args& a) {
    return detail::sharding::follow_dims(a, [](std::int64_t d) { return d; });
  }
};

/// repeat(repeats) (PyTorch's dim_repeat view rule): the new leading dims shift every Shard; a
/// Shard of a dim repeated more than once is gathered (the copies would interleave); Partial
/// and Replicate kept (repeat is linear).
struct repeat {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    const auto n = static_cast<std::int64_t>(a.in.at(0).shape.size());
    const auto pad = static_cast<std::int64_t>(o.repeats.size()) - n;
    CCGRAPH_CHECK(pad >= 0, "repeat: ", o.repeats.size(), " repeats for a ", n, "-d dtensor");
    return detail::sharding::follow_dims(
        a, [&](std::int64_t d) { return o.repeats[static_cast<std::size_t>(pad + d)] == 1 ? pad + d : -1; });
  }
};

/// stack(xs, dim) (PyTorch's stack_strategy): one placement per mesh dim all inputs follow,
/// merged over the inputs in order (a Partial gives way to a Shard; two different Shards, or
/// two different Partials, give Replicate; Replicate gives way to anything), then all-Replicate.
/// The output's Shards of `dim` or later move up one.
struct stack {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const std::size_t n = a.in.size();
    const std::int64_t dim = normalize_dim(o.dim, a.in.at(0).shape.size() + 1, "stack");
    return expand(a, n, [&](int m) {
      placement follow = a.in[0].placements[static_cast<std::size_t>(m)];
      for (std::size_t i = 1; i < n; ++i) {
        const placement p = a.in[i].placements[static_cast<std::size_t>(m)];
        if (p == follow || p.is_replicate()) continue;
        if (follow.is_replicate() || (follow.is_partial() && p.is_shard())) follow = p;
        else if (!(follow.is_shard() && p.is_partial())) follow = replicate();
      }
      std::vector<dim_option> opts;
      const placement out = follow.is_shard() && follow.dim() >= dim ? shard(follow.dim() + 1) : follow;
      opts.push_back({out, std::vector<placement>(n, follow)});
      add_unique(opts, all_replicate(n));
      return opts;
    });
  }
};

/// copy(dst, src) (copy_ made functional: src broadcast to dst's shape): pointwise over (dst,
/// src) as PyTorch's copy_ (a pointwise op), not linear: a Partial is reduced.
struct copy {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O&, const sharding_args& a) {
    return pointwise::strategies_named("copy", a);
  }
};

/// index_select(input, dim, index [k]) (PyTorch's index_select single-dim strategy): all-Replicate;
/// input Shard(d) of another dim (index Replicate) gives Shard(d); index Shard(0) (input
/// Replicate) gives Shard(dim); an input Partial passes (index Replicate).
struct index_select {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const auto n = static_cast<std::int64_t>(a.in.at(0).shape.size());
    const std::int64_t dim = normalize_dim(o.dim, static_cast<std::size_t>(n), "index_select");
    return expand(a, 2, [&](int m) {
      std::vector<dim_option> opts{all_replicate(2)};
      for (std::int64_t d = 0; d < n; ++d)
        if (d != dim) opts.push_back({shard(d), {shard(d), replicate()}});
      if (!a.in.at(1).shape.empty()) opts.push_back({shard(dim), {replicate(), shard(0)}});
      const placement p = a.in[0].placements[static_cast<std::size_t>(m)];
      if (p.is_partial()) opts.push_back({p, {p, replicate()}});
      return opts;
    });
  }
};

/// gather(input, dim, index) (PyTorch's gather_strategy, without its MaskPartial):
/// all-Replicate; index Shard(dim) (input Replicate) gives Shard(dim); input and index both
/// Shard(d) of another dim, where they have the same size, gives Shard(d).
struct gather {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const shape_t& x = a.in.at(0).shape;
    const shape_t& idx = a.in.at(1).shape;
    const std::int64_t dim = normalize_dim(o.dim, x.size(), "gather");
    return expand(a, 2, [&](int) {
      std::vector<dim_option> opts{all_replicate(2)};
      opts.push_back({shard(dim), {replicate(), shard(dim)}});
      if (x.size() == idx.size())
        for (std::size_t d = 0; d < x.size(); ++d)
          if (static_cast<std::int64_t>(d) != dim && x[d] == idx[d]) {
            const placement s = shard(static_cast<std::int64_t>(d));
            opts.push_back({s, {s, s}});
          }
      return opts;
    });
  }
};

/// scatter_add(self, dim, index, src) (PyTorch's scatter_add_strategy): all-Replicate; all
/// three Shard(d) of another dim where self, index and src have the same size (PyTorch checks
/// self and index; a larger src would be cut at other offsets) gives Shard(d).
struct scatter_add {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const shape_t& x = a.in.at(0).shape;
    const shape_t& idx = a.in.at(1).shape;
    const shape_t& src = a.in.at(2).shape;
    const std::int64_t dim = normalize_dim(o.dim, x.size(), "scatter_add");
    return expand(a, 3, [&](int) {
      std::vector<dim_option> opts{all_replicate(3)};
      if (x.size() == idx.size() && x.size() == src.size())
        for (std::size_t d = 0; d < x.size(); ++d)
          if (static_cast<std::int64_t>(d) != dim && x[d] == idx[d] && x[d] == src[d]) {
            const placement s = shard(static_cast<std::int64_t>(d));
            opts.push_back({s, {s, s, s}});
          }
      return opts;
    });
  }
};

/// cross_entropy(input [N, C, d...] or [C], target [N, d...][, weight [C]]) -> loss (PyTorch's
/// log_softmax + nll_loss_forward strategies): the input's placement followed where it is a
/// Shard of a dim other than the class dim, the target sharded on the matching dim, the weight
/// Replicate; the loss Shard of that dim without reduction, Partial(sum) with "sum". With
/// "mean" the batch is gathered: PyTorch's Partial(avg) is wrong where the pieces' summed
/// weights differ (ignored targets, class weights). Then all-Replicate.
struct cross_entropy {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O& o, const sharding_args& a) {
    using namespace detail::sharding;
    const std::size_t n_in = a.in.size();
    const auto nd = static_cast<std::int64_t>(a.in.at(0).shape.size());
    const std::int64_t cls = nd >= 2 ? 1 : 0;
    return expand(a, n_in, [&](int m) {
      std::vector<dim_option> opts;
      const placement p = a.in[0].placements[static_cast<std::size_t>(m)];
      if (p.is_shard() && p.dim() != cls && o.reduction != decltype(o.reduction)::mean) {
        dim_option opt = all_replicate(n_in);
        const std::int64_t td = p.dim() > cls ? p.dim() - 1 : p.dim();
        opt.in[0] = p;
        opt.in[1] = shard(td);
        opt.out = o.reduction == decltype(o.reduction)::none ? shard(td) : partial(reduce_op::sum);
        opts.push_back(opt);
      }
      add_unique(opts, all_replicate(n_in));
      return opts;
    });
  }
};

/// scaled_dot_product_attention(q, k, v[, mask]) (PyTorch's SDPA strategies): all-Replicate;
/// then the heads dim (-3), then each batch dim before it: q, k, v and the output sharded on it
/// (where k and v have q's size there), the mask sharded on its matching dim, or Replicate where
/// it broadcasts. The sequence and feature dims stay whole.
struct sdpa {
  template <class O>
  static std::vector<sharding_strategy> strategies(const O&, const sharding_args& a) {
    using namespace detail::sharding;
    const std::size_t n_in = a.in.size();
    const shape_t& q = a.in.at(0).shape;
    const auto nd = static_cast<std::int64_t>(q.size());
    return expand(a, n_in, [&](int) {
      std::vector<dim_option> opts{all_replicate(n_in)};
      for (std::int64_t d = nd - 3; d >= 0; --d) {
        const auto ud = static_cast<std::size_t>(d);
        if (a.in[1].shape.size() != q.size() || a.in[2].shape.size() != q.size() || a.in[1].shape[ud] != q[ud] ||
            a.in[2].shape[ud] != q[ud])
          continue;
        dim_option opt{shard(d), {shard(d), shard(d), shard(d)}};
        if (n_in == 4) {
          const shape_t& mask = a.in[3].shape;
          const std::int64_t md = d - (nd - static_cast<std::int64_t>(mask.size()));
          opt.in.push_back(md < 0 || mask[static_cast<std::size_t>(md)] == 1 ? replicate() : shard(md));
        }
        opts.push_back(opt);
      }
      return opts;
    });
  }
};

}  // namespace sharding_rules
}  // namespace ccgraph
