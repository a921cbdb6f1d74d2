// ccgraph/ir/analysis.hpp: what is computed from a graph without running it: op_sequence, the
// structural hash (the cache key of compiled graphs), lint and dead-code elimination.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/equal.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/visit.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ir/print.hpp>

namespace ccgraph {

/// One entry per node except placeholders and the output: the op name, with fused pointwise
/// nodes as their "fused_<op>_<op>" name (what PyTorch's tests compare schedules with).
CCGRAPH_DECL std::vector<std::string> op_sequence(const graph& g);

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
  void add(reduce_op v) {  // with premul_sum's factor: two factors are two programs
    add(static_cast<std::int64_t>(v.kind()));
    add(std::bit_cast<std::int64_t>(v.factor()));
  }
  void add(double v) {  // by its bits, with -0.0 as 0.0: values that compare equal hash equal
    if (v == 0) v = 0;
    std::int64_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    add(b);
  }
  template <class E>
    requires std::is_enum_v<E>
  void add(E v) {
    add(static_cast<std::int64_t>(v));
  }
  template <class T>
  void add(const std::optional<T>& v) {
    add(v.has_value());
    if (v) add(*v);
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
CCGRAPH_DECL std::uint64_t structural_hash(const graph& g);

/// True when `a` and `b` are the same program: node for node the same op with equal attributes,
/// the same arguments (by position), metas and groups (ranks and tag); node names do not
/// matter. What structural_hash hashes, compared exactly (no collisions): a cache that finds a
/// graph by its hash confirms the hit with this.
CCGRAPH_DECL bool structurally_equal(const graph& a, const graph& b);

/// Checks what FX's lint checks (arguments defined before use and owned by the graph, unique
/// names, users lists consistent with arguments, metas equal to what inference gives) and what
/// collectives need: every collective output read by exactly one wait_tensor (or returned
/// un-waited), nothing but waits and the output reading a collective directly, placeholders
/// first and one output node last. Throws ccgraph::error carrying the printed graph.
CCGRAPH_DECL void lint(const graph& g);


/// Removes nodes whose results nobody reads, except placeholders, the output, collectives and
/// waits (which have effects on other ranks). Returns how many nodes were removed.
CCGRAPH_DECL std::size_t eliminate_dead_code(graph& g);

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ir/impl/analysis.ipp>
#endif
