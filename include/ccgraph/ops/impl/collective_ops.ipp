// ccgraph/ops/impl/collective_ops.ipp: the non-template functions of
// <ccgraph/ops/collective_ops.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/collective_ops.hpp>

namespace ccgraph::ops {

CCGRAPH_DECL std::vector<p2p_transfer> p2p_transfers(const batch_isend_irecv& b, int rank, const group_info& g) {
  std::vector<p2p_transfer> out;
  for (std::size_t i = 0; i < b.ops.size(); ++i) {
    const p2p_desc& d = b.ops[i];
    CCGRAPH_CHECK(d.peer != rank, "batch_isend_irecv: rank ", rank, " ", d.is_send ? "sends to" : "receives from",
                  " itself; the peer must be another rank");
    const int lo = std::min(d.peer, rank), hi = std::max(d.peer, rank);
    out.push_back({group_info{list_str(std::vector<int>{lo, hi}), {lo, hi}, {}, g.tag}, batch_isend_irecv{{d}}, i});
  }
  std::stable_sort(out.begin(), out.end(), [&](const p2p_transfer& x, const p2p_transfer& y) {
    const auto& dx = x.op.ops[0];
    const auto& dy = y.op.ops[0];
    const int sx = dx.is_send ? rank : dx.peer, sy = dy.is_send ? rank : dy.peer;
    return std::tie(x.pair.ranks, sx) < std::tie(y.pair.ranks, sy);
  });
  return out;
}

namespace detail {

CCGRAPH_DECL void print_attr(std::ostream& os, const std::vector<p2p_desc>& v) {
  os << '[';
  for (std::size_t i = 0; i < v.size(); ++i)
    os << (i ? ", " : "") << (v[i].is_send ? "isend(" : "irecv(") << v[i].meta.str() << ", peer=" << v[i].peer << ')';
  os << ']';
}

CCGRAPH_DECL void check_reduce_dtype(std::string_view what, reduce_op op, dtype dt) {
  CCGRAPH_CHECK(!is_complex(dt) || op.kind() == reduce_kind::sum || op.kind() == reduce_kind::avg ||
                    op.kind() == reduce_kind::premul_sum,
                what, " does not support ", op, " on complex tensors (", dt, "; it supports sum, avg and premul_sum)");
  if (is_bitwise(op))
    CCGRAPH_CHECK(!is_floating(dt), what, ": reduce op ", op,
                  " needs an integer or bool tensor, got ", dt);
  if (dt == dtype::boolean)
    CCGRAPH_CHECK(op != reduce_op::avg, what, ": reduce op avg is not supported for bool tensors");
  if (op.kind() == reduce_kind::premul_sum)
    CCGRAPH_CHECK(is_floating(dt) || is_complex(dt), what, ": reduce op ", op,
                  " needs a floating or complex tensor (f16, bf16, f32, f64, c64, c128), got ", dt);
}

CCGRAPH_DECL void check_has_dim0(std::string_view what, const tensor_meta& m,
                           const std::string& suffix) {
  CCGRAPH_CHECK(!m.shape.empty(), what, ": the input must have at least one dimension, got ",
                m.str(), suffix);
}

CCGRAPH_DECL tensor_meta gather_meta(std::string_view what, const tensor_meta& in, int n,
                               std::size_t index, bool coalesced) {
  check_has_dim0(what, in, coalesced ? " for tensor at index " + std::to_string(index) : std::string());
  tensor_meta out = in;
  CCGRAPH_CHECK(checked_mul(in.shape[0], n, out.shape[0]), what, ": dim 0 (size ", in.shape[0],
                ") times group_size ", n, " exceeds 2^63 - 1");
  (void)checked_numel(out.shape, what);
  return out;
}

CCGRAPH_DECL std::int64_t sum_splits(std::string_view what, const std::vector<std::int64_t>& splits,
                               const char* label) {
  std::int64_t sum = 0;
  for (auto v : splits) {
    CCGRAPH_CHECK(v >= 0, what, ": negative split in ", list_str(splits));
    CCGRAPH_CHECK(checked_add(sum, v, sum), what, ": ", label, " ", list_str(splits),
                  " sum past 2^63 - 1");
  }
  return sum;
}

CCGRAPH_DECL void check_group_multiple(std::string_view what, std::int64_t dim, std::size_t index,
                                 const shape_t& shape, int n, std::string_view suffix) {
  const std::int64_t size = index < shape.size() ? shape[index] : 0;
  CCGRAPH_CHECK(index < shape.size() && size % n == 0, what, ": dim ", dim, " (size ", size,
                ") must be a multiple of group_size ", n, suffix);
}

CCGRAPH_DECL tensor_meta scatter_meta(std::string_view what, const tensor_meta& in, int n,
                                std::size_t index, bool coalesced) {
  check_has_dim0(what, in);
  check_group_multiple(what, 0, 0, in.shape, n,
                       coalesced ? " for tensor at index " + std::to_string(index) : std::string());
  tensor_meta out = in;
  out.shape[0] /= n;
  return out;
}

CCGRAPH_DECL void check_one_input(std::string_view what, std::size_t n) {
  CCGRAPH_CHECK(n == 1, what, ": expects one input, got ", n);
}

CCGRAPH_DECL const group_info& group_of(std::string_view what, const infer_ctx& c) {
  CCGRAPH_CHECK(c.group != nullptr, what, ": a collective node needs a group");
  return *c.group;
}

CCGRAPH_DECL double bytes_of(const std::vector<tensor_meta>& ms) {
  double b = 0;
  for (const auto& m : ms) b += double(numel_of(m.shape)) * double(element_size(m.dtype));
  return b;
}

}  // namespace detail

}  // namespace ccgraph::ops

namespace ccgraph {

namespace ops::detail {

CCGRAPH_DECL double reduction_scale(reduce_op op, int n) {
  return op.kind() == reduce_kind::avg ? 1.0 / n : op.kind() == reduce_kind::premul_sum ? op.factor() : 1.0;
}

}  // namespace ops::detail

}  // namespace ccgraph

namespace ccgraph::ops {

CCGRAPH_DECL std::vector<tensor_meta> infer(const collective_op& op, const std::vector<tensor_meta>& in,
                                      const group_info& g) {
  return ::ccgraph::detail::visit(
      [&](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        ::ccgraph::detail::require_infer<O>();
        return op_traits<O>::infer(o, in, infer_ctx{&g});
      },
      op);
}

CCGRAPH_DECL std::string_view name_of(const collective_op& op) {
  return ::ccgraph::detail::visit([](const auto& o) { return std::decay_t<decltype(o)>::name; }, op);
}

CCGRAPH_DECL std::string describe(const collective_op& op, const std::vector<tensor_meta>& in,
                            const group_info& g) {
  std::ostringstream os;
  ::ccgraph::detail::visit(
      [&](const auto& o) {
        os << std::decay_t<decltype(o)>::name << '(';
        for (std::size_t i = 0; i < in.size(); ++i) os << (i ? ", " : "") << in[i].str();
        boost::hana::for_each(boost::hana::accessors<std::decay_t<decltype(o)>>(), [&](auto acc) {
          os << ", " << boost::hana::to<char const*>(boost::hana::first(acc)) << '=';
          detail::print_attr(os, boost::hana::second(acc)(o));
        });
      },
      op);
  os << ", group=" << list_str(g.ranks) << (g.tag.empty() ? "" : ":") << g.tag << ')';
  return os.str();
}

CCGRAPH_DECL signature::signature(const collective_op& o, const std::vector<tensor_meta>& in, const group_info& g)
    : op(o), ranks(g.ranks), inputs(in), tag(g.tag) {
  if (std::holds_alternative<all_to_all_single>(op)) {
    op = all_to_all_single{};
    for (auto& m : inputs)
      if (!m.shape.empty()) m.shape[0] = -1;
  } else if (auto* b = std::get_if<batch_isend_irecv>(&op); b && b->ops.size() == 1 && ranks.size() == 2) {
    // One transfer of a pair (how a backend matches point-to-point): the sender's isend and
    // the receiver's irecv agree once both are written as the sender's isend. The pair's
    // other member is the issuing rank.
    p2p_desc& d = b->ops[0];
    if (!d.is_send) d = {true, d.peer == ranks[0] ? ranks[1] : ranks[0], d.meta};
    inputs.clear();
  }
}
CCGRAPH_DECL bool operator==(const signature& a, const signature& b) {
  if (a.op.index() != b.op.index() || a.ranks != b.ranks || a.tag != b.tag || a.inputs != b.inputs)
    return false;
  return ::ccgraph::detail::visit(
      [&](const auto& x) {
        return bool(boost::hana::equal(x, std::get<std::decay_t<decltype(x)>>(b.op)));
      },
      a.op);
}
CCGRAPH_DECL std::string signature::str() const {
  if (auto* b = std::get_if<batch_isend_irecv>(&op); b && b->ops.size() == 1 && ranks.size() == 2) {
    const p2p_desc& d = b->ops[0];
    return "transfer of " + d.meta.str() + " from rank " + std::to_string(d.peer == ranks[0] ? ranks[1] : ranks[0]) +
           " to rank " + std::to_string(d.peer) + (tag.empty() ? "" : " (tag " + tag + ")");
  }
  auto s = describe(op, inputs, group_info{"", ranks, {}, tag});
  if (!std::holds_alternative<all_to_all_single>(op)) return s;  // only its dims were blanked (a factor may be -1)
  for (std::string::size_type p; (p = s.find("-1")) != std::string::npos;) s.replace(p, 2, "?");
  return s;
}

}  // namespace ccgraph::ops
