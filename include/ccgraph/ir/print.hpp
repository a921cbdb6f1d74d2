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
/// An enum attribute by its to_string (found by ADL beside the enum): "activation=gelu_tanh".
template <class E>
  requires std::is_enum_v<E>
void print_attr_value(std::ostream& os, E v) {
  os << to_string(v);
}
/// An optional attribute: its value, or "none" (PyTorch's None).
template <class T>
void print_attr_value(std::ostream& os, const std::optional<T>& v) {
  if (v)
    print_attr_value(os, *v);
  else
    os << "none";
}

/// "%name" or "%name.i" for output i of a multi-output node.
inline std::string ref_str(const value_ref& r) {
  std::string s = "%" + r.src->name();
  if (r.src->num_outputs() > 1) s += "." + std::to_string(r.index);
  return s;
}

/// The meta part of a listing line: "f32[4, 4]" or "(f32[4], f32[8])".
inline std::string metas_str(const node& n) {
  if (n.num_outputs() == 1) return n.meta().str();
  std::string s = "(";
  for (int i = 0; i < n.num_outputs(); ++i) s += (i ? ", " : "") + n.meta(i).str();
  return s + ")";
}

/// The call part of a listing line: "all_reduce(%z, op=sum, group=0)".
inline std::string call_str(const node& n) {
  std::ostringstream os;
  bool first = true;
  auto sep = [&] {
    if (!first) os << ", ";
    first = false;
  };
  std::visit(
      [&](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (op_traits<O>::category == op_category::pointwise) {  // printed as its fused chain
          os << o.fused << '(';
          for (auto& a : n.args()) sep(), os << ref_str(a);
          sep();
          os << "expr=" << o.expr;
        } else {
          os << O::name << '(';
          for (auto& a : n.args()) sep(), os << ref_str(a);
          boost::hana::for_each(boost::hana::accessors<O>(), [&](auto acc) {
            const std::string_view key = boost::hana::to<char const*>(boost::hana::first(acc));
            const auto& value = boost::hana::second(acc)(o);
            if constexpr (op_traits<O>::category == op_category::input) {
              if (key == "index" || (key == "pending" && !value)) return;
            }
            sep();
            os << key << '=';
            print_attr_value(os, value);
          });
        }
      },
      n.kind());
  if (n.group()) sep(), os << "group=" << n.group()->label();
  os << ')';
  return os.str();
}

}  // namespace detail

/// One SSA line: `%ar : f32[8, 4] = all_reduce(%z, op=sum, group=0)`.
inline std::string to_string(const node& n) {
  if (n.category() == op_category::output) {
    std::string s = "return ";
    if (n.args().size() == 1) return s + detail::ref_str(n.args()[0]);
    s += '(';
    for (std::size_t i = 0; i < n.args().size(); ++i) s += (i ? ", " : "") + detail::ref_str(n.args()[i]);
    return s + ')';
  }
  return "%" + n.name() + " : " + detail::metas_str(n) + " = " + detail::call_str(n);
}

/// The FX-like listing of a graph, one node per line.
inline std::ostream& operator<<(std::ostream& os, const graph& g) {
  os << "graph():\n";
  for (const node* n : g.nodes()) os << "    " << to_string(*n) << '\n';
  return os;
}

/// The listing as a string.
inline std::string to_string(const graph& g) {
  std::ostringstream os;
  os << g;
  return os.str();
}

/// A table view: position, name, op, output meta, arguments and users of every node. A value
/// longer than its column pushes the rest of its row right, always by at least one space.
inline std::string to_table(const graph& g) {
  std::ostringstream os;
  auto cell = [&](const std::string& s, std::size_t width) {
    os << s << std::string(s.size() < width ? width - s.size() : 1, ' ');
  };
  cell("#", 5), cell("name", 18), cell("op", 34), cell("meta", 24), cell("args", 30);
  os << "users" << '\n';
  std::size_t i = 0;
  for (const node* n : g.nodes()) {
    std::string args, users;
    for (auto& a : n->args()) args += (args.empty() ? "" : " ") + detail::ref_str(a);
    for (auto* u : n->users()) users += (users.empty() ? "" : " ") + ("%" + u->name());
    std::string op(n->op());
    if (auto* p = std::get_if<ops::pointwise>(&n->kind())) op = p->fused;
    cell(std::to_string(i++), 5), cell("%" + n->name(), 18), cell(op, 34);
    cell(n->num_outputs() ? detail::metas_str(*n) : std::string("-"), 24);
    cell(args.empty() ? "-" : args, 30);
    os << (users.empty() ? "-" : users) << '\n';
  }
  return os.str();
}

/// Graphviz DOT: one box per node (collectives and waits coloured), one edge per argument.
inline std::string to_dot(const graph& g) {
  std::ostringstream os;
  os << "digraph ccgraph {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n";
  for (const node* n : g.nodes()) {
    std::string op(n->op());
    if (auto* p = std::get_if<ops::pointwise>(&n->kind())) op = p->fused;
    const char* color = n->is_collective() ? "lightsalmon"
                        : n->is_wait()     ? "khaki"
                        : n->category() == op_category::input || n->category() == op_category::output
                            ? "lightgrey"
                            : "lightblue";
    os << "  \"" << n->name() << "\" [label=\"%" << n->name() << "\\n" << op;
    if (n->num_outputs()) os << "\\n" << detail::metas_str(*n);
    if (n->group()) os << "\\ngroup=" << n->group()->label();
    os << "\", style=filled, fillcolor=" << color << "];\n";
  }
  for (const node* n : g.nodes())
    for (auto& a : n->args())
      os << "  \"" << a.src->name() << "\" -> \"" << n->name() << "\""
         << (a.src->num_outputs() > 1 ? " [label=\"" + std::to_string(a.index) + "\"]" : std::string())
         << ";\n";
  os << "}\n";
  return os.str();
}

}  // namespace ccgraph
