// ccgraph/trace/impl/trace_state.ipp: the non-template functions of
// <ccgraph/trace/trace_state.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/trace/trace_state.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL trace_state*& current_trace_ptr() {
  thread_local trace_state* st = nullptr;
  return st;
}

}  // namespace detail

}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL void trace_state::finish_with(std::string name, std::function<void(graph&)> step) {
  for (const auto& f : finish)
    if (f.first == name) return;
  finish.emplace_back(std::move(name), std::move(step));
}

CCGRAPH_DECL group_info trace_state::resolve(const group& grp, const char* what) const {
  return grp.resolve(rank, *registry, what);
}

}  // namespace detail
}  // namespace ccgraph
