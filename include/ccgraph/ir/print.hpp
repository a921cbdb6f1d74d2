// ccgraph/ir/print.hpp: how a graph is shown: an FX-like SSA listing (operator<<), a table view,
// and Graphviz DOT. Attributes are printed generically from each op's Hana struct.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/visit.hpp>
#include <ccgraph/ir/graph.hpp>

namespace ccgraph {
namespace detail {

inline void print_attr_value(std::ostream& os, bool v) { os << (v ? "true" : "false"); }
inline void print_attr_value(std::ostream& os, int v) { os << v; }
inline void print_attr_value(std::ostream& os, std::int64_t v) { os << v; }
inline void print_attr_value(std::ostream& os, reduce_op v) { os << v; }
inline void print_attr_value(std::ostream& os, const std::string& v) { os << v; }
inline void print_attr_value(std::ostream& os, const std::vector<std::int64_t>& v) { os << list_str(v); }
inline void print_attr_value(std::ostream& os, const std::vector<ops::p2p_desc>& v) { ops::detail::print_attr(os, v); }
inline void print_attr_value(std::ostream& os, double v) { os << v; }
inline void print_attr_value(std::ostream& os, const std::vector<double>& v) {
  os << '[';
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}
/// An enum attribute by its to_string (loss_reduction: "mean").
template <class E>
  requires std::is_enum_v<E>
void print_attr_value(std::ostream& os, E v) {
  os << to_string(v);
}
/// An optional attribute: its value, or None (argmax's dim).
template <class T>
void print_attr_value(std::ostream& os, const std::optional<T>& v) {
  if (v)
    print_attr_value(os, *v);
  else
    os << "None";
}

/// "%name" or "%name.i" for output i of a multi-output node.
CCGRAPH_DECL std::string ref_str(const value_ref& r);

/// The meta part of a listing line: "f32[4, 4]" or "(f32[4], f32[8])".
CCGRAPH_DECL std::string metas_str(const node& n);

/// The call part of a listing line: "all_reduce(%z, op=sum, group=0)".
CCGRAPH_DECL std::string call_str(const node& n);

}  // namespace detail

/// One SSA line: `%ar : f32[8, 4] = all_reduce(%z, op=sum, group=0)`.
CCGRAPH_DECL std::string to_string(const node& n);

/// The FX-like listing of a graph, one node per line.
CCGRAPH_DECL std::ostream& operator<<(std::ostream& os, const graph& g);

/// The listing as a string.
CCGRAPH_DECL std::string to_string(const graph& g);

/// A table view: position, name, op, output meta, arguments and users of every node. A value
/// longer than its column pushes the rest of its row right, always by at least one space.
CCGRAPH_DECL std::string to_table(const graph& g);

/// Graphviz DOT: one box per node (collectives and waits coloured), one edge per argument.
CCGRAPH_DECL std::string to_dot(const graph& g);

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ir/impl/print.ipp>
#endif
