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

/// A reduction whose Partial inputs pass through linear ops (sum, avg).
inline bool linear_partial(const placement& p) {
  return p.is_partial(reduce_op::sum) || p.is_partial(reduce_op::avg);
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
    std::vector<bool> reduced(x.shape.size(), o.dims.empty());
    for (auto d : o.dims) reduced[static_cast<std::size_t>(normalize_dim(d, x.shape.size(), O::name.data()))] = true;
    const bool is_mean = O::name == "mean";
    return expand(a, 1, [&](int m) {
      std::vector<dim_option> opts;
      const placement p = x.placements[static_cast<std::size_t>(m)];
      if (p.is_shard()) {
        const std::int64_t d = p.dim();
        if (reduced[static_cast<std::size_t>(d)]) {
          if (!is_mean) opts.push_back({partial(reduce_op::sum), {p}});
          else if (x.shape[static_cast<std::size_t>(d)] % shards_of(a, x.placements, d) == 0)
            opts.push_back({partial(reduce_op::avg), {p}});
        } else {
          std::int64_t od = d;
          if (!o.keepdim)
            for (std::int64_t e = 0; e < d; ++e) od -= reduced[static_cast<std::size_t>(e)] ? 1 : 0;
          opts.push_back({shard(od), {p}});
        }
      } else if (p.is_partial() && linear_partial(p)) {
        opts.push_back({p, {p}});
      }
      add_unique(opts, all_replicate(1));
      return opts;
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

}  // namespace sharding_rules
}  // namespace ccgraph
