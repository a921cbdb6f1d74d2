// ccgraph/ir/impl/analysis.ipp: the analyses of ir/analysis.hpp (each visits the closed op set).
// Included by that header when header-only, compiled once by <ccgraph/impl/src.hpp> under
// CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ir/analysis.hpp>

namespace ccgraph {

CCGRAPH_DECL std::vector<std::string> op_sequence(const graph& g) {
  std::vector<std::string> seq;
  for (const node* n : g.nodes()) {
    if (n->category() == op_category::input || n->category() == op_category::output)
      continue;
    if (auto* p = std::get_if<ops::pointwise>(&n->kind()))
      seq.push_back(p->fused);
    else
      seq.emplace_back(n->op());
  }
  return seq;
}

CCGRAPH_DECL std::uint64_t structural_hash(const graph& g) {
  detail::hasher h;
  for (const node* n : g.nodes()) {
    h.add(n->op());
    ::ccgraph::detail::visit(
        [&](const auto& o) {
          boost::hana::for_each(boost::hana::accessors<std::decay_t<decltype(o)>>(),
                                [&](auto acc) { h.add(boost::hana::second(acc)(o)); });
        },
        n->kind());
    for (auto& a : n->args()) {
      h.add(static_cast<std::int64_t>(g.position(a.src)));
      h.add(a.index);
    }
    h.add(n->metas());
    if (n->group()) {
      h.add(n->group()->ranks);
      h.add(n->group()->tag);
    }
  }
  return h.h;
}

CCGRAPH_DECL bool structurally_equal(const graph& a, const graph& b) {
  const auto& na = a.nodes();
  const auto& nb = b.nodes();
  if (na.size() != nb.size()) return false;
  for (std::size_t i = 0; i < na.size(); ++i) {
    const node& x = *na[i];
    const node& y = *nb[i];
    if (x.kind().index() != y.kind().index() || x.args().size() != y.args().size() || x.metas() != y.metas() ||
        x.group().has_value() != y.group().has_value())
      return false;
    if (x.group() && (x.group()->ranks != y.group()->ranks || x.group()->tag != y.group()->tag)) return false;
    for (std::size_t k = 0; k < x.args().size(); ++k) {
      const value_ref& u = x.args()[k];
      const value_ref& v = y.args()[k];
      if (u.index != v.index || a.position(u.src) != b.position(v.src)) return false;
    }
    const bool same_attributes = ::ccgraph::detail::visit(
        [&](const auto& o) {
          using O = std::decay_t<decltype(o)>;
          return bool(boost::hana::equal(o, std::get<O>(y.kind())));
        },
        x.kind());
    if (!same_attributes) return false;
  }
  return true;
}

CCGRAPH_DECL void lint(const graph& g) {
  auto fail = [&](const std::string& msg) {
    CCGRAPH_THROW(error, "lint: ", msg, "\n", to_string(g));
  };
  std::unordered_set<std::string> names;
  const auto& nodes = g.nodes();
  bool seen_compute = false;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const node* n = nodes[i];
    if (n->owner() != &g) fail("node %" + n->name() + " is not owned by this graph");
    if (g.position(n) != i)
      fail("node %" + n->name() + " is at " + std::to_string(i) + " but records position " +
           std::to_string(g.position(n)));
    if (!names.insert(n->name()).second) fail("duplicate node name %" + n->name());
    const bool is_ph = n->category() == op_category::input;
    const bool is_out = n->category() == op_category::output;
    if (is_ph && seen_compute) fail("placeholder %" + n->name() + " after other nodes");
    if (!is_ph) seen_compute = true;
    if (is_out && i + 1 != nodes.size()) fail("output node %" + n->name() + " is not last");
    std::vector<tensor_meta> in;
    for (auto& a : n->args()) {
      if (!a.src || a.src->owner() != &g) fail("node %" + n->name() + " reads a node of another graph");
      if (g.position(a.src) >= i)
        fail("node %" + n->name() + " reads %" + a.src->name() + " before it is defined");
      if (a.index < 0 || a.index >= a.src->num_outputs())
        fail("node %" + n->name() + " reads output " + std::to_string(a.index) + " of %" + a.src->name() +
             ", which has " + std::to_string(a.src->num_outputs()));
      in.push_back(a.src->meta(a.index));
      const auto& users = a.src->users();
      if (std::find(users.begin(), users.end(), n) == users.end())
        fail("%" + a.src->name() + " does not list its user %" + n->name());
      if (a.src->is_collective() && !n->is_wait() && !is_out)
        fail("%" + n->name() + " reads collective %" + a.src->name() + " without a wait_tensor");
    }
    for (const node* u : n->users()) {
      bool reads = false;
      for (auto& a : u->args()) reads = reads || a.src == n;
      if (!reads) fail("%" + n->name() + " lists user %" + u->name() + ", which does not read it");
    }
    if (!is_ph && !is_out) {
      try {
        if (infer(n->kind(), in, n->group()) != n->metas())
          fail("node %" + n->name() + " has metas that differ from what its inputs give");
      } catch (const error& e) {
        fail("node %" + n->name() + " is invalid: " + e.what());
      }
    }
    if (n->is_collective()) {
      for (int k = 0; k < n->num_outputs(); ++k) {
        int waits = 0, returned = 0;
        for (const node* u : n->users())
          for (auto& a : u->args())
            if (a.src == n && a.index == k) {
              if (u->is_wait()) ++waits;
              else if (u->category() == op_category::output) ++returned;
            }
        if (waits > 1 || (waits == 0 && returned == 0))
          fail("collective %" + n->name() + " output " + std::to_string(k) + " has " +
               std::to_string(waits) + " wait_tensor nodes (expected exactly one)");
      }
    }
  }
  if (!g.output_node()) fail("the graph has no output node");
}

CCGRAPH_DECL std::size_t eliminate_dead_code(graph& g) {
  std::size_t removed = 0;
  const std::vector<node*> nodes = g.nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    node* n = *it;
    if (n->is_impure() || !n->users().empty()) continue;
    g.erase(n);
    ++removed;
  }
  return removed;
}

CCGRAPH_DECL void graph::lint() const { ccgraph::lint(*this); }

}  // namespace ccgraph
