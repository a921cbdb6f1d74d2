// ccgraph/ir/impl/print.ipp: the printers of ir/print.hpp (a visit over the closed op set).
// Included by that header when header-only, compiled once by <ccgraph/impl/src.hpp> under
// CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ir/print.hpp>

namespace ccgraph {
namespace detail {

CCGRAPH_DECL std::string ref_str(const value_ref& r) {
  std::string s = "%" + r.src->name();
  if (r.src->num_outputs() > 1) s += "." + std::to_string(r.index);
  return s;
}

CCGRAPH_DECL std::string metas_str(const node& n) {
  if (n.num_outputs() == 1) return n.meta().str();
  std::string s = "(";
  for (int i = 0; i < n.num_outputs(); ++i) s += (i ? ", " : "") + n.meta(i).str();
  return s + ")";
}

CCGRAPH_DECL std::string call_str(const node& n) {
  std::ostringstream os;
  bool first = true;
  auto sep = [&] {
    if (!first) os << ", ";
    first = false;
  };
  ::ccgraph::detail::visit(
      [&](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (op_traits<O>::category == op_category::pointwise) {  // printed as its fused chain
          os << o.fused << '(';
          for (auto& a : n.args()) sep(), os << ref_str(a);
          sep();
          os << "expr=" << o.expr;
        } else if constexpr (std::is_same_v<O, ops::user>) {  // printed under its registered name
          os << o.op << '(';
          for (auto& a : n.args()) sep(), os << ref_str(a);
          if (!o.attrs.empty()) sep(), os << "attrs=", print_attr_value(os, o.attrs);
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

CCGRAPH_DECL std::string to_string(const node& n) {
  if (n.category() == op_category::output) {
    std::string s = "return ";
    if (n.args().size() == 1) return s + detail::ref_str(n.args()[0]);
    s += '(';
    for (std::size_t i = 0; i < n.args().size(); ++i) s += (i ? ", " : "") + detail::ref_str(n.args()[i]);
    return s + ')';
  }
  return "%" + n.name() + " : " + detail::metas_str(n) + " = " + detail::call_str(n);
}

CCGRAPH_DECL std::ostream& operator<<(std::ostream& os, const graph& g) {
  os << "graph():\n";
  for (const node* n : g.nodes()) os << "    " << to_string(*n) << '\n';
  return os;
}

CCGRAPH_DECL std::string to_string(const graph& g) {
  std::ostringstream os;
  os << g;
  return os.str();
}

CCGRAPH_DECL std::string to_table(const graph& g) {
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

CCGRAPH_DECL std::string to_dot(const graph& g) {
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
