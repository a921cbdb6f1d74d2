// ccgraph/ops/collective_ops.hpp: the one definition of each collective: its attributes (a
// Boost.Hana struct, so printing, hashing and equality are generic), and its shape/dtype
// inference with the validation messages users see. Eager dispatch, the backends and (later)
// the tracer and the cost model all read these.
#pragma once

#include <ccgraph/core/config.hpp>
#include <cstdint>
#include <algorithm>
#include <numeric>
#include <tuple>
#include <sstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/equal.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/size.hpp>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ops/op_traits.hpp>

namespace ccgraph::ops {

/// All-reduce: every member gets the reduction of all members' tensors.
struct all_reduce {
  BOOST_HANA_DEFINE_STRUCT(all_reduce, (reduce_op, op));
  static constexpr std::string_view name = "all_reduce";
};
/// All-gather on dim 0: members' tensors concatenated in group order.
struct all_gather_into_tensor {
  BOOST_HANA_DEFINE_STRUCT(all_gather_into_tensor, (int, group_size));
  static constexpr std::string_view name = "all_gather_into_tensor";
};
/// Reduce-scatter on dim 0: member i gets chunk i of the reduction.
struct reduce_scatter_tensor {
  BOOST_HANA_DEFINE_STRUCT(reduce_scatter_tensor, (reduce_op, op), (int, group_size));
  static constexpr std::string_view name = "reduce_scatter_tensor";
};
/// All-to-all on dim 0 with (possibly uneven) split sizes, in group order.
struct all_to_all_single {
  BOOST_HANA_DEFINE_STRUCT(all_to_all_single, (std::vector<std::int64_t>, output_split_sizes),
                           (std::vector<std::int64_t>, input_split_sizes));
  static constexpr std::string_view name = "all_to_all_single";
};
/// Broadcast of the tensor of global rank `src` to every member.
struct broadcast {
  BOOST_HANA_DEFINE_STRUCT(broadcast, (int, src));
  static constexpr std::string_view name = "broadcast";
};
/// all_reduce of several tensors in one launch.
struct all_reduce_coalesced {
  BOOST_HANA_DEFINE_STRUCT(all_reduce_coalesced, (reduce_op, op));
  static constexpr std::string_view name = "all_reduce_coalesced";
};
/// all_gather_into_tensor of several tensors in one launch.
struct all_gather_into_tensor_coalesced {
  BOOST_HANA_DEFINE_STRUCT(all_gather_into_tensor_coalesced, (int, group_size));
  static constexpr std::string_view name = "all_gather_into_tensor_coalesced";
};
/// reduce_scatter_tensor of several tensors in one launch.
struct reduce_scatter_tensor_coalesced {
  BOOST_HANA_DEFINE_STRUCT(reduce_scatter_tensor_coalesced, (reduce_op, op), (int, group_size));
  static constexpr std::string_view name = "reduce_scatter_tensor_coalesced";
};

/// Reduce to one member (c10d's reduce): global rank `dst` gets the reduction of all members'
/// tensors; every other member's output is its own input, unchanged.
struct reduce {
  BOOST_HANA_DEFINE_STRUCT(reduce, (reduce_op, op), (int, dst));
  static constexpr std::string_view name = "reduce";
};
/// One point-to-point transfer of a batch, as the issuing rank sees it: send a tensor of
/// `meta` to global rank `peer` (c10d's isend), or receive one of `meta` from it (irecv).
struct p2p_desc {
  bool is_send = true;
  int peer = 0;
  tensor_meta meta;
  friend bool operator==(const p2p_desc&, const p2p_desc&) = default;
};
/// Point-to-point transfers launched together (c10d's batch_isend_irecv: one NCCL group, so
/// their order within the batch cannot deadlock). Inputs: the sent tensors, in the order of the
/// sends; outputs: one tensor per receive, in order. A single send or recv is a batch of one.
struct batch_isend_irecv {
  BOOST_HANA_DEFINE_STRUCT(batch_isend_irecv, (std::vector<p2p_desc>, ops));
  static constexpr std::string_view name = "batch_isend_irecv";
};

/// One transfer of a batch as its pair of ranks runs it: a batch of that one transfer over the
/// group of the two ranks (same tag), and its position in the original batch.
struct p2p_transfer {
  group_info pair;
  batch_isend_irecv op;
  std::size_t index = 0;
};

/// `b`'s transfers as issued by `rank` of group `g`, in the order every rank derives alike: by
/// pair, then the lower rank's sends first, then batch order. Two ranks' batches holding the
/// same transfers thus meet whatever order each listed them in (as one NCCL group does), and
/// pairs come in one global order, which no set of batches can deadlock on. How the threads
/// backend runs a batch and how verify_collective_order compares it.
CCGRAPH_DECL std::vector<p2p_transfer> p2p_transfers(const batch_isend_irecv& b, int rank, const group_info& g);

/// Any collective, with its attributes.
using collective_op =
    std::variant<all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single,
                 broadcast, all_reduce_coalesced, all_gather_into_tensor_coalesced,
                 reduce_scatter_tensor_coalesced, batch_isend_irecv, reduce>;

namespace detail {

inline void print_attr(std::ostream& os, reduce_op v) { os << v; }
inline void print_attr(std::ostream& os, int v) { os << v; }
inline void print_attr(std::ostream& os, const std::vector<std::int64_t>& v) { os << list_str(v); }
CCGRAPH_DECL void print_attr(std::ostream& os, const std::vector<p2p_desc>& v);

/// Reduce ops a dtype accepts, as c10d/NCCL define them: bitwise ops on integers and bool
/// only, no avg of bools, premul_sum on floating (and complex) tensors only, and on complex
/// tensors (reduced as pairs of reals) only sum, avg and premul_sum (c10d's
/// complexViewAsRealAllowed).
CCGRAPH_DECL void check_reduce_dtype(std::string_view what, reduce_op op, dtype dt);

CCGRAPH_DECL void check_has_dim0(std::string_view what, const tensor_meta& m,
                           const std::string& suffix = {});

CCGRAPH_DECL tensor_meta gather_meta(std::string_view what, const tensor_meta& in, int n,
                               std::size_t index = 0, bool coalesced = false);

/// The sum of all_to_all split sizes `splits` (called `label` in errors): each >= 0, the sum
/// at most 2^63 - 1.
CCGRAPH_DECL std::int64_t sum_splits(std::string_view what, const std::vector<std::int64_t>& splits,
                               const char* label);

/// The one "multiple of group size" rule: `shape`'s dim `index` (called `dim` in the message, as
/// the caller named it) must exist and be a multiple of group_size `n`.
CCGRAPH_DECL void check_group_multiple(std::string_view what, std::int64_t dim, std::size_t index,
                                 const shape_t& shape, int n, std::string_view suffix = {});

CCGRAPH_DECL tensor_meta scatter_meta(std::string_view what, const tensor_meta& in, int n,
                                std::size_t index = 0, bool coalesced = false);

CCGRAPH_DECL void check_one_input(std::string_view what, std::size_t n);

/// The group a collective's inference needs.
CCGRAPH_DECL const group_info& group_of(std::string_view what, const infer_ctx& c);

CCGRAPH_DECL double bytes_of(const std::vector<tensor_meta>& ms);

/// What every collective declares alike: its category, and outputs in new buffers. The
/// gradient and sharding slots differ per collective, so each declares its own.
struct collective_traits_common {
  static constexpr op_category category = op_category::collective;
  static constexpr alias_kind aliasing = alias_kind::fresh;
};

/// Per-tensor inference of a coalesced collective.
template <class F>
std::vector<tensor_meta> infer_each(std::string_view what, const std::vector<tensor_meta>& in, F&& one) {
  CCGRAPH_CHECK(!in.empty(), what, ": expects at least one input tensor");
  std::vector<tensor_meta> out;
  for (std::size_t i = 0; i < in.size(); ++i) out.push_back(one(in[i], i));
  return out;
}

}  // namespace detail
}  // namespace ccgraph::ops

namespace ccgraph {

namespace ops::detail {
/// A collective's reduction is linear (sum, avg, premul_sum), so it has a gradient: the gradient
/// of the sum of every rank's loss. Others (product, min, max, bitwise) are an error naming it.
template <class C>
void require_linear_reduction(std::string_view what, reduce_op op, const C& c) {
  const reduce_kind k = op.kind();
  CCGRAPH_CHECK(k == reduce_kind::sum || k == reduce_kind::avg || k == reduce_kind::premul_sum, "grad: ", what,
                " with op ", to_string(op), " (node %", c.current().name(), ") is not differentiable (sum, avg and "
                "premul_sum are)");
}
/// The scale a member's input takes in a linear reduction over `n` members.
CCGRAPH_DECL double reduction_scale(reduce_op op, int n);
/// The gradients of every output of a collective node (zeros where none flows).
template <class C>
auto output_grads(const C& c) {
  std::vector<decltype(c.grad(0))> gs;
  for (int k = 0; k < c.num_outputs(); ++k) gs.push_back(c.grad(k));
  return gs;
}
}  // namespace ops::detail

// ---- the traits of each collective ----

template <>
struct op_traits<ops::all_reduce> : ops::detail::collective_traits_common {
  using O = ops::all_reduce;
  /// Linear reductions: the same all_reduce of the gradient (sum of every rank's loss).
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      ops::detail::require_linear_reduction(O::name, o.op, c);
      c.add_grad(0, c.collective(O{o.op}, ops::detail::output_grads(c))[0]);
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = true;  // output k may take input k's buffer when it dies
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    (void)ops::detail::group_of(O::name, c);
    ops::detail::check_one_input(O::name, in.size());
    ops::detail::check_reduce_dtype(O::name, o.op, in[0].dtype);
    return {in[0]};
  }
  template <class M>
  static void run_cpu(const O& o, const M& m) { m.reduce(0, o.op, 0); }
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::collective(nccl_coll::all_reduce, ops::detail::bytes_of(a.in));
  }
  static constexpr bucket_family family = bucket_family::all_reduce;
  using single_op = O;
  using coalesced_op = ops::all_reduce_coalesced;
  static coalesced_op coalesce(const O& o, int) { return {o.op}; }
  static std::optional<reduce_op> reduce(const O& o) { return o.op; }
};

template <>
struct op_traits<ops::all_reduce_coalesced> : ops::detail::collective_traits_common {
  using O = ops::all_reduce_coalesced;
  /// As all_reduce, for every tensor in one launch.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      ops::detail::require_linear_reduction(O::name, o.op, c);
      const auto gs = c.collective(O{o.op}, ops::detail::output_grads(c));
      for (std::size_t i = 0; i < gs.size(); ++i) c.add_grad(i, gs[i]);
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = true;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    (void)ops::detail::group_of(O::name, c);
    return ops::detail::infer_each(O::name, in, [&](const tensor_meta& m, std::size_t) {
      ops::detail::check_reduce_dtype(O::name, o.op, m.dtype);
      return m;
    });
  }
  template <class M>
  static void run_cpu(const O& o, const M& m) {
    for (std::size_t k = 0; k < m.tensors(); ++k) m.reduce(k, o.op, 0);
  }
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::collective(nccl_coll::all_reduce, ops::detail::bytes_of(a.in));
  }
  static constexpr bucket_family family = bucket_family::all_reduce;
  using single_op = ops::all_reduce;
  using coalesced_op = O;
  static coalesced_op coalesce(const O& o, int) { return o; }
  static std::optional<reduce_op> reduce(const O& o) { return o.op; }
};

template <>
struct op_traits<ops::all_gather_into_tensor> : ops::detail::collective_traits_common {
  using O = ops::all_gather_into_tensor;
  /// The transpose of a gather: reduce_scatter (sum) of the gradient on the same dim.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      c.add_grad(0, c.collective(ops::reduce_scatter_tensor{reduce_op::sum, o.group_size}, ops::detail::output_grads(c))[0]);
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    const int n = ops::detail::group_of(O::name, c).size();
    ops::detail::check_one_input(O::name, in.size());
    return {ops::detail::gather_meta(O::name, in[0], n)};
  }
  template <class M>
  static void run_cpu(const O&, const M& m) { m.gather(0); }
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::collective(nccl_coll::all_gather, ops::detail::bytes_of(a.in) * a.group_size);
  }
  static constexpr bucket_family family = bucket_family::all_gather;
  using single_op = O;
  using coalesced_op = ops::all_gather_into_tensor_coalesced;
  static coalesced_op coalesce(const O&, int n) { return {n}; }
  static std::optional<reduce_op> reduce(const O&) { return std::nullopt; }
};

template <>
struct op_traits<ops::all_gather_into_tensor_coalesced> : ops::detail::collective_traits_common {
  using O = ops::all_gather_into_tensor_coalesced;
  /// As all_gather_into_tensor, for every tensor in one launch.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      const auto gs = c.collective(ops::reduce_scatter_tensor_coalesced{reduce_op::sum, o.group_size}, ops::detail::output_grads(c));
      for (std::size_t i = 0; i < gs.size(); ++i) c.add_grad(i, gs[i]);
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    const int n = ops::detail::group_of(O::name, c).size();
    return ops::detail::infer_each(O::name, in, [&](const tensor_meta& m, std::size_t i) {
      return ops::detail::gather_meta(O::name, m, n, i, true);
    });
  }
  template <class M>
  static void run_cpu(const O&, const M& m) {
    for (std::size_t k = 0; k < m.tensors(); ++k) m.gather(k);
  }
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::collective(nccl_coll::all_gather, ops::detail::bytes_of(a.in) * a.group_size);
  }
  static constexpr bucket_family family = bucket_family::all_gather;
  using single_op = ops::all_gather_into_tensor;
  using coalesced_op = O;
  static coalesced_op coalesce(const O&, int n) { return {n}; }
  static std::optional<reduce_op> reduce(const O&) { return std::nullopt; }
};

template <>
struct op_traits<ops::reduce_scatter_tensor> : ops::detail::collective_traits_common {
  using O = ops::reduce_scatter_tensor;
  /// The transpose of a (linear) reduce_scatter: all_gather of the gradient on the same dim, scaled
  /// as the reduction scaled each input.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      ops::detail::require_linear_reduction(O::name, o.op, c);
      auto g = c.collective(ops::all_gather_into_tensor{o.group_size}, ops::detail::output_grads(c))[0];
      const double s = ops::detail::reduction_scale(o.op, o.group_size);
      c.add_grad(0, s == 1.0 ? g : decltype(g)(g * static_cast<typename C::value_type>(s)));
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    const int n = ops::detail::group_of(O::name, c).size();
    ops::detail::check_one_input(O::name, in.size());
    ops::detail::check_reduce_dtype(O::name, o.op, in[0].dtype);
    return {ops::detail::scatter_meta(O::name, in[0], n)};
  }
  template <class M>
  static void run_cpu(const O& o, const M& m) { m.reduce(0, o.op, m.me()); }
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::collective(nccl_coll::reduce_scatter, ops::detail::bytes_of(a.in));
  }
  static constexpr bucket_family family = bucket_family::reduce_scatter;
  using single_op = O;
  using coalesced_op = ops::reduce_scatter_tensor_coalesced;
  static coalesced_op coalesce(const O& o, int n) { return {o.op, n}; }
  static std::optional<reduce_op> reduce(const O& o) { return o.op; }
};

template <>
struct op_traits<ops::reduce_scatter_tensor_coalesced> : ops::detail::collective_traits_common {
  using O = ops::reduce_scatter_tensor_coalesced;
  /// As reduce_scatter_tensor, for every tensor in one launch.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      ops::detail::require_linear_reduction(O::name, o.op, c);
      const auto gs = c.collective(ops::all_gather_into_tensor_coalesced{o.group_size}, ops::detail::output_grads(c));
      const double s = ops::detail::reduction_scale(o.op, o.group_size);
      for (std::size_t i = 0; i < gs.size(); ++i)
        c.add_grad(i, s == 1.0 ? gs[i] : decltype(gs[i])(gs[i] * static_cast<typename C::value_type>(s)));
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    const int n = ops::detail::group_of(O::name, c).size();
    return ops::detail::infer_each(O::name, in, [&](const tensor_meta& m, std::size_t i) {
      ops::detail::check_reduce_dtype(O::name, o.op, m.dtype);
      return ops::detail::scatter_meta(O::name, m, n, i, true);
    });
  }
  template <class M>
  static void run_cpu(const O& o, const M& m) {
    for (std::size_t k = 0; k < m.tensors(); ++k) m.reduce(k, o.op, m.me());
  }
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::collective(nccl_coll::reduce_scatter, ops::detail::bytes_of(a.in));
  }
  static constexpr bucket_family family = bucket_family::reduce_scatter;
  using single_op = ops::reduce_scatter_tensor;
  using coalesced_op = O;
  static coalesced_op coalesce(const O& o, int n) { return {o.op, n}; }
  static std::optional<reduce_op> reduce(const O& o) { return o.op; }
};

template <>
struct op_traits<ops::broadcast> : ops::detail::collective_traits_common {
  using O = ops::broadcast;
  /// The gradients of every member's copy reduced (summed) to the source; the other members' inputs
  /// are not read: zeros. Every member issues the reduce.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      const auto r = c.collective(ops::reduce{reduce_op::sum, o.src}, ops::detail::output_grads(c))[0];
      c.add_grad(0, c.rank() == o.src ? r : c.zeros_like(c.input(0)));
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    const group_info& g = ops::detail::group_of(O::name, c);
    ops::detail::check_one_input(O::name, in.size());
    CCGRAPH_CHECK(g.index_of(o.src) >= 0, O::name, ": src rank ", o.src, " is not a member of group ",
                  list_str(g.ranks));
    return {in[0]};
  }
  template <class M>
  static void run_cpu(const O& o, const M& m) { m.copy(m.index_of(o.src), 0); }
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::collective(nccl_coll::broadcast, ops::detail::bytes_of(a.in));
  }
  static constexpr bucket_family family = bucket_family::none;
  using single_op = O;
  static std::optional<reduce_op> reduce(const O&) { return std::nullopt; }
};

template <>
struct op_traits<ops::all_to_all_single> : ops::detail::collective_traits_common {
  using O = ops::all_to_all_single;
  /// The transpose of an all-to-all: the all-to-all of the gradient with the split sizes swapped.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      c.add_grad(0, c.collective(O{o.input_split_sizes, o.output_split_sizes}, ops::detail::output_grads(c))[0]);
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    constexpr std::string_view what = O::name;
    const int n = ops::detail::group_of(what, c).size();
    ops::detail::check_one_input(what, in.size());
    ops::detail::check_has_dim0(what, in[0]);
    const auto& os = o.output_split_sizes;
    const auto& is = o.input_split_sizes;
    CCGRAPH_CHECK(static_cast<int>(is.size()) == n, what, ": input_split_sizes ", list_str(is), " has ",
                  is.size(), " entries for group_size ", n);
    CCGRAPH_CHECK(static_cast<int>(os.size()) == n, what, ": output_split_sizes ", list_str(os), " has ",
                  os.size(), " entries for group_size ", n);
    const auto isum = ops::detail::sum_splits(what, is, "input_split_sizes");
    const auto osum = ops::detail::sum_splits(what, os, "output_split_sizes");
    CCGRAPH_CHECK(isum == in[0].shape[0], what, ": input_split_sizes ", list_str(is), " sum to ", isum,
                  " but the input's dim 0 has size ", in[0].shape[0]);
    tensor_meta out = in[0];
    out.shape[0] = osum;
    CCGRAPH_CHECK(countable(out.shape), what, ": output_split_sizes ", list_str(os), " make an output of shape ",
                  shape_str(out.shape),
                  ", which has too many elements (the product of its sizes exceeds 2^63 - 1)");
    return {out};
  }
  /// Rows of dim 0 from each member in group order; throws when a member's send count does not
  /// match ours (only visible with every request in hand).
  template <class M>
  static void run_cpu(const O& o, const M& m) {
    const int me = m.me();
    std::int64_t dst = 0;
    for (int j = 0; j < m.size(); ++j) {
      const auto& peer = m.template op_of<O>(j);
      const std::int64_t want = o.output_split_sizes[static_cast<std::size_t>(j)];
      const std::int64_t sent = peer.input_split_sizes[static_cast<std::size_t>(me)];
      CCGRAPH_CHECK(want == sent, "all_to_all_single: rank ", m.rank_of(me), " expects ", want, " rows from rank ",
                    m.rank_of(j), " (output_split_sizes[", j, "]) but rank ", m.rank_of(j), " sends ", sent,
                    " (its input_split_sizes[", me, "])");
      std::int64_t src = 0;
      for (int i = 0; i < me; ++i) src += peer.input_split_sizes[static_cast<std::size_t>(i)];
      m.copy_rows(j, 0, src, dst, want);
      dst += want;
    }
  }
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::collective(nccl_coll::all_to_all, ops::detail::bytes_of(a.in));
  }
  static constexpr bucket_family family = bucket_family::none;
  using single_op = O;
  static std::optional<reduce_op> reduce(const O&) { return std::nullopt; }
};

template <>
struct op_traits<ops::reduce> : ops::detail::collective_traits_common {
  using O = ops::reduce;
  /// Linear reductions: the root's output gradient broadcast from the root to every member,
  /// scaled as the reduction scaled each input; a non-root member's output is its own input
  /// (run_cpu below), so that output's gradient adds to its input's. Every member issues the
  /// broadcast.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      ops::detail::require_linear_reduction(O::name, o.op, c);
      auto g = c.collective(ops::broadcast{o.dst}, ops::detail::output_grads(c))[0];
      using V = decltype(g);
      const double s = ops::detail::reduction_scale(o.op, c.group().size());
      if (s != 1.0) g = V(g * static_cast<typename C::value_type>(s));
      c.add_grad(0, c.rank() == o.dst ? g : V(g + c.grad(0)));
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    const group_info& g = ops::detail::group_of(O::name, c);
    ops::detail::check_one_input(O::name, in.size());
    ops::detail::check_reduce_dtype(O::name, o.op, in[0].dtype);
    CCGRAPH_CHECK(g.index_of(o.dst) >= 0, O::name, ": dst rank ", o.dst, " is not a member of group ",
                  list_str(g.ranks));
    return {in[0]};
  }
  /// The root reduces; every other member's output is its own input (as c10d's, where NCCL
  /// writes the root's buffer only).
  template <class M>
  static void run_cpu(const O& o, const M& m) {
    if (m.rank_of(m.me()) == o.dst) return m.reduce(0, o.op, 0);
    m.copy(m.me(), 0);
  }
  /// A ring reduce moves what a broadcast does (nccl_collective prices it so).
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::collective(nccl_coll::reduce, ops::detail::bytes_of(a.in));
  }
  static constexpr bucket_family family = bucket_family::none;  // never bucketed
  using single_op = O;
  static std::optional<reduce_op> reduce(const O& o) { return o.op; }
};

template <>
struct op_traits<ops::batch_isend_irecv> : ops::detail::collective_traits_common {
  using O = ops::batch_isend_irecv;
  /// The transposed batch: each received tensor's gradient is sent back to its sender, and each
  /// sent tensor's gradient received from its receiver (permute_tensor: the inverse permutation).
  /// Every rank runs it (a peer may need it even where this rank differentiates nothing).
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      O back;
      for (const auto& d : o.ops)
        if (!d.is_send) back.ops.push_back({true, d.peer, d.meta});
      std::size_t sends = 0;
      for (const auto& d : o.ops)
        if (d.is_send) {
          back.ops.push_back({false, d.peer, d.meta});
          ++sends;
        }
      const auto gs = c.collective(back, ops::detail::output_grads(c));
      for (std::size_t i = 0; i < sends; ++i) c.add_grad(i, gs.at(i));
    }
  };
  using sharding = sharding_todo;
  static constexpr bool in_place_input = false;
  /// Inputs are the sends' tensors in order (each must match its declared meta); outputs one
  /// per receive, of its declared meta.
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx& c) {
    constexpr std::string_view what = O::name;
    const group_info& g = ops::detail::group_of(what, c);
    CCGRAPH_CHECK(!o.ops.empty(), what, ": expects at least one isend or irecv");
    std::vector<tensor_meta> out;
    std::size_t sends = 0;
    for (std::size_t i = 0; i < o.ops.size(); ++i) {
      const ops::p2p_desc& d = o.ops[i];
      CCGRAPH_CHECK(g.index_of(d.peer) >= 0, what, ": peer rank ", d.peer, " of ", d.is_send ? "isend" : "irecv",
                    " at index ", i, " is not a member of group ", list_str(g.ranks));
      (void)checked_numel(d.meta.shape, what);
      if (!d.is_send) {
        out.push_back(d.meta);
        continue;
      }
      CCGRAPH_CHECK(sends < in.size() && in[sends] == d.meta, what, ": isend at index ", i, " is declared ",
                    d.meta.str(), " but its tensor is ", sends < in.size() ? in[sends].str() : std::string("missing"));
      ++sends;
    }
    CCGRAPH_CHECK(sends == in.size(), what, ": ", in.size(), " input tensors for ", sends, " isends");
    return out;
  }
  /// A CPU backend runs a batch one transfer at a time, each over the group of its pair
  /// (ops::p2p_transfers): the receiver copies the sender's input.
  template <class M>
  static void run_cpu(const O& o, const M& m) {
    if (!o.ops.at(0).is_send) m.copy(1 - m.me(), 0);
  }
  /// NCCL's send/recv are the all_to_all's pairwise steps: a two-rank exchange of the larger
  /// direction's bytes (the sends and receives run concurrently).
  static op_cost cost(const O& o, const cost_args&) {
    double sent = 0, received = 0;
    for (const auto& d : o.ops) (d.is_send ? sent : received) += ops::detail::bytes_of({d.meta});
    return op_cost::collective(nccl_coll::send_recv, 2 * std::max(sent, received));
  }
  static constexpr bucket_family family = bucket_family::none;  // never bucketed nor decomposed
  using single_op = O;
  static std::optional<reduce_op> reduce(const O&) { return std::nullopt; }
};

}  // namespace ccgraph

namespace ccgraph::ops {

/// Output metas of `op` on inputs `in` over group `g`, validating both: the same checks and
/// messages for eager calls, backends and traced graphs (op_traits<O>::infer).
CCGRAPH_DECL std::vector<tensor_meta> infer(const collective_op& op, const std::vector<tensor_meta>& in,
                                      const group_info& g);

/// The op's name ("all_reduce", ...).
CCGRAPH_DECL std::string_view name_of(const collective_op& op);

/// Call-shaped text for messages: "all_reduce(f32[4, 4], op=sum, group=[0, 1])". Attributes are
/// printed generically from the Hana struct.
CCGRAPH_DECL std::string describe(const collective_op& op, const std::vector<tensor_meta>& in,
                            const group_info& g);

/// What every member of one collective must agree on: the op and its attributes, the group
/// (ranks and tag), and the input metas, except for what legitimately differs per rank
/// (all_to_all_single's split sizes and dim 0). Compared structurally (Hana's generic
/// equality), formatted only for errors.
struct signature {
  collective_op op;
  std::vector<int> ranks;
  std::vector<tensor_meta> inputs;
  std::string tag;

  CCGRAPH_DECL signature(const collective_op& o, const std::vector<tensor_meta>& in, const group_info& g);
  /// Equal when the ranks' calls match (compares the op's attributes).
  friend CCGRAPH_DECL bool operator==(const signature& a, const signature& b);
  /// The call-shaped description, with "?" for the parts allowed to differ; a pair's transfer
  /// as "transfer of f32[4] from rank 0 to rank 1".
  CCGRAPH_DECL std::string str() const;
};

}  // namespace ccgraph::ops

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/collective_ops.ipp>
#endif
