// ccgraph/runtime/impl/executor.ipp: the non-template functions of
// <ccgraph/runtime/executor.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/runtime/executor.hpp>

namespace ccgraph {

CCGRAPH_DECL std::vector<input_update> update_inputs_range(std::size_t first_input, std::size_t first_output,
                                                     std::size_t count) {
  std::vector<input_update> out;
  for (std::size_t j = 0; j < count; ++j) out.push_back({first_input + j, first_output + j});
  return out;
}

namespace detail {

CCGRAPH_DECL any_tensor empty_like(const any_tensor& t, device dev) {
  return ::ccgraph::detail::visit([&](const auto& x) -> any_tensor {
    using T = typename std::decay_t<decltype(x)>::value_type;
    return tensor<T>::empty(x.shape(), dev);
  }, t);
}

CCGRAPH_DECL void copy_any(const any_tensor& dst, const any_tensor& src) {
  ::ccgraph::detail::visit([&](const auto& d) {
    using X = std::decay_t<decltype(d)>;
    X(d).copy_(std::get<X>(src));
  }, dst);
}

CCGRAPH_DECL memory_span span_of(const any_tensor& t) {
  return ::ccgraph::detail::visit([](const auto& x) {
    memory_span s;
    using T = typename std::decay_t<decltype(x)>::value_type;
    if (x.numel() == 0 || !x.storage()) return s;
    std::int64_t lo = x.storage_offset(), hi = x.storage_offset();
    for (std::size_t d = 0; d < x.shape().size(); ++d) {
      const std::int64_t step = (x.shape()[d] - 1) * x.strides()[d];
      (step < 0 ? lo : hi) += step;
      s.self_overlapping = s.self_overlapping || (x.shape()[d] > 1 && x.strides()[d] == 0);
    }
    s.storage = x.storage().get();
    s.begin = lo * static_cast<std::int64_t>(sizeof(T));
    s.end = (hi + 1) * static_cast<std::int64_t>(sizeof(T));
    return s;
  }, t);
}

CCGRAPH_DECL any_tensor arena_tensor(const std::shared_ptr<storage>& arena, const tensor_meta& m, std::int64_t offset) {
  return visit_any_dtype(m.dtype, [&](auto tag) -> any_tensor {
    using T = decltype(tag);
    return tensor<T>(arena, m.shape, contiguous_strides(m.shape), offset / static_cast<std::int64_t>(sizeof(T)));
  });
}

CCGRAPH_DECL void return_pending(graph& g) {
  node* out = g.output_node();
  if (!out) return;
  std::vector<value_ref> results = out->args();
  std::vector<node*> dropped;
  for (auto& r : results) {
    node* w = r.src;
    if (!w->is_wait() || w->users().size() != 1) continue;  // users are distinct: the output alone
    r = w->args().front();
    if (std::find(dropped.begin(), dropped.end(), w) == dropped.end()) dropped.push_back(w);
  }
  if (dropped.empty()) return;
  g.set_args(out, std::move(results));
  for (node* w : dropped) g.erase(w);
}

CCGRAPH_DECL std::vector<overlap_hint> collective_overlaps(const graph& g) {
  const auto& nodes = g.nodes();
  std::vector<overlap_hint> out(nodes.size(), overlap_hint::unknown);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (!nodes[i]->is_collective()) continue;
    std::size_t first_wait = nodes.size();
    for (const node* u : nodes[i]->users())
      if (u->is_wait()) first_wait = std::min(first_wait, g.position(u));
    overlap_hint h = overlap_hint::none;
    for (std::size_t p = i + 1; p < first_wait && h != overlap_hint::matmul; ++p) {
      const node& n = *nodes[p];
      if (n.is_impure()) continue;
      // What the op's cost says it launches: a matmul-class kernel, another kernel, or nothing.
      std::vector<tensor_meta> ins;
      for (const auto& a : n.args()) ins.push_back(a.src->meta(a.index));
      const op_cost c = cost_of(n.kind(), ins, n.metas());
      if (c.k == op_cost::kind::compute) h = c.peak == peak_class::matmul ? overlap_hint::matmul : overlap_hint::compute;
    }
    out[i] = h;
  }
  return out;
}

}  // namespace detail

}  // namespace ccgraph
