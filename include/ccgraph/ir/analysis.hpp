// ccgraph/ir/analysis.hpp: what is computed from a graph without running it: op_sequence, the
// structural hash (the cache key of compiled graphs), lint and dead-code elimination.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/equal.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ir/print.hpp>

namespace ccgraph {

/// One entry per node except placeholders and the output: the op name, with fused pointwise
/// nodes as their "fused_<op>_<op>" name (what PyTorch's tests compare schedules with).
inline std::vector<std::string> op_sequence(const graph& g) {
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

namespace detail {

/// FNV-1a, 64 bits: stable across runs and platforms, unlike std::hash.
struct hasher {
  std::uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, std::size_t n) {
    auto* c = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= c[i];
      h *= 1099511628211ull;
    }
  }
  void add(std::int64_t v) { bytes(&v, sizeof v); }
  void add(std::string_view s) {
    add(static_cast<std::int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void add(const std::string& s) { add(std::string_view(s)); }
  void add(bool v) { add(static_cast<std::int64_t>(v)); }
  void add(int v) { add(static_cast<std::int64_t>(v)); }
  void add(double v) {  // 0.0 and -0.0 compare equal, so they hash alike
    if (v == 0) v = 0;
    bytes(&v, sizeof v);
  }
  void add(reduce_op v) {  // with premul_sum's factor: two factors are two programs
    add(static_cast<std::int64_t>(v.kind()));
    add(std::bit_cast<std::int64_t>(v.factor()));
  }
  template <class T>
  void add(const std::vector<T>& v) {
    add(static_cast<std::int64_t>(v.size()));
    for (const auto& x : v) add(x);
  }
  void add(const tensor_meta& m) {
    add(static_cast<std::int64_t>(m.dtype));
    add(m.shape);
  }
  void add(const ops::p2p_desc& d) {
    add(d.is_send);
    add(d.peer);
    add(d.meta);
  }
};

}  // namespace detail

/// Equal for equal programs with equal shapes and dtypes (node names do not matter), different
/// otherwise: the cache key of compiled graphs.
inline std::uint64_t structural_hash(const graph& g) {
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

/// True when `a` and `b` are the same program: node for node the same op with equal attributes,
/// the same arguments (by position), metas and groups (ranks and tag); node names do not
/// matter. What structural_hash hashes, compared exactly (no collisions): a cache that finds a
/// graph by its hash confirms the hit with this.
inline bool structurally_equal(const graph& a, const graph& b) {
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

/// Checks what FX's lint checks (arguments defined before use and owned by the graph, unique
/// names, users lists consistent with arguments, metas equal to what inference gives) and what
/// collectives need: every collective output read by exactly one wait_tensor (or returned
/// un-waited), nothing but waits and the output reading a collective directly, placeholders
/// first and one output node last. Throws ccgraph::error carrying the printed graph.
inline void lint(const graph& g) {
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

inline void graph::lint() const { ccgraph::lint(*this); }

/// Removes nodes whose results nobody reads, except placeholders, the output, collectives and
/// waits (which have effects on other ranks). Returns how many nodes were removed.
inline std::size_t eliminate_dead_code(graph& g) {
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

}  // namespace ccgraph
