// ccgraph/core/visit.hpp: a visit over one std::variant that is cheap to compile. libstdc++'s
// std::visit builds its jump table through deep recursive templates, and ccgraph visits variants of
// 30-60 ops and 8 tensor types in dozens of places: that machinery was most of the umbrella
// header's compile time. Same semantics for one variant: f is called with the active alternative;
// every alternative's result must convert to the first one's.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>
#include <variant>

namespace ccgraph::detail {

template <class F, class V, std::size_t... I>
decltype(auto) visit_one_impl(F& f, V& v, std::index_sequence<I...>) {
  using R = decltype(f(*std::get_if<0>(&v)));
  using fn = R (*)(F&, V&);
  // One small function per alternative; the table is a plain array indexed by v.index().
  static constexpr fn table[] = {+[](F& g, V& w) -> R { return g(*std::get_if<I>(&w)); }...};
  if (v.valueless_by_exception()) throw std::bad_variant_access();
  return table[v.index()](f, v);
}

/// ::ccgraph::detail::visit(f, v) for one variant `v`, compiled through a flat table.
template <class F, class V>
decltype(auto) visit(F&& f, V&& v) {
  using Var = std::remove_reference_t<V>;
  return visit_one_impl(f, v, std::make_index_sequence<std::variant_size_v<std::remove_cv_t<Var>>>{});
}

}  // namespace ccgraph::detail
