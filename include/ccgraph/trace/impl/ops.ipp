// ccgraph/trace/impl/ops.ipp: the non-template functions of
// <ccgraph/trace/ops.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/trace/ops.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL std::string value_key(const value_ref& r) {
  return "%" + std::to_string(reinterpret_cast<std::uintptr_t>(r.src)) + "." + std::to_string(r.index);
}

CCGRAPH_DECL std::vector<value_ref> record_collective(trace_state& st, const ops::collective_op& op,
                                                      std::vector<value_ref> args, const group_info& gi) {
  node* c = st.g.add(to_node_op(op), std::move(args), gi, ops::name_of(op));
  st.g.set_source(c, current_call_site());
  std::vector<value_ref> waits;
  for (int k = 0; k < c->num_outputs(); ++k)
    waits.push_back({add_wait(st.g, {c, k}), 0});
  return waits;
}

}  // namespace detail

}  // namespace ccgraph
