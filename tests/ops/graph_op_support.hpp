// tests/ops/graph_op_support.hpp: what the tests of the kernel-backed graph ops share (index,
// linear, attention, stack): a program run eagerly and as a compiled graph on a threads world of
// one, compared bit for bit; the bytes of results; the op's nodes, their plan and their cost.
#pragma once

#include <doctest/doctest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/memory_plan.hpp>

#include "support.hpp"

namespace ccgraph_test::graph_ops {

/// The bytes of a tensor's values in row-major order (bitwise comparisons, NaN included).
template <class T>
std::vector<unsigned char> bytes_of(const ccgraph::tensor<T>& t) {
  const std::vector<T> v = t.to_vector();
  std::vector<unsigned char> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}
/// The bytes of every tensor of a tuple, one after the other, each preceded by its size.
template <class... Ts>
std::vector<unsigned char> bytes_of(const std::tuple<ccgraph::tensor<Ts>...>& ts) {
  std::vector<unsigned char> all;
  std::apply(
      [&](const auto&... t) {
        (
            [&] {
              const auto b = bytes_of(t);
              all.push_back(static_cast<unsigned char>(b.size() % 251));
              all.insert(all.end(), b.begin(), b.end());
            }(),
            ...);
      },
      ts);
  return all;
}

/// The graph's nodes whose op is `op`.
inline std::vector<const ccgraph::node*> nodes_of(const ccgraph::graph& g, std::string_view op) {
  std::vector<const ccgraph::node*> out;
  for (const ccgraph::node* n : g.nodes())
    if (n->op() == op) out.push_back(n);
  return out;
}

/// Runs `make(world)`'s program on `xs` eagerly, then traces it and runs the compiled graph on a
/// threads world of one, with and without the memory plan: every run gives the eager bits.
/// When `op` is given, checks that the graph has such a node and that the memory plan gives
/// each of its outputs a buffer (make the program run the op after a collective, whose result
/// is planned). Returns the printed graph.
template <class Make, class... Ts>
std::string check_graph_matches_eager(Make make, std::string_view op, const ccgraph::tensor<Ts>&... xs) {
  std::string printed;
  run(1, [&](ccgraph::rank_context& ctx) {
    auto program = make(ctx.world());
    const auto eager = bytes_of(program(xs...));
    auto g = ccgraph::trace(program, ccgraph::input<Ts>(xs.shape())...);
    std::ostringstream os;
    os << g;
    printed = os.str();
    if (!op.empty()) {
      const auto found = nodes_of(g, op);
      REQUIRE(!found.empty());
      const auto plan = ccgraph::plan_memory(g);
      for (const ccgraph::node* n : found)
        for (int k = 0; k < n->num_outputs(); ++k) {
          INFO("output " << k << " of " << ccgraph::to_string(*n));
          CHECK(plan.buffer_at(g.position(n), k) != nullptr);
        }
    }
    for (bool plan : {true, false}) {
      INFO("memory_plan " << plan);
      auto exe = ccgraph::compile(g, ctx, {.memory_plan = plan});
      CHECK(bytes_of(exe(xs...)) == eager);
      CHECK(bytes_of(exe(xs...)) == eager);  // a second run reuses the arena
    }
  });
  return printed;
}

/// The error `program(xs...)` throws eagerly, and the one tracing it throws: they must agree
/// (inference runs the eager call's checks). Returns the message.
template <class F, class... Ts>
std::string same_error_eager_and_traced(F program, const ccgraph::tensor<Ts>&... xs) {
  const std::string eager = error_of([&] { (void)program(xs...); });
  const std::string traced = error_of([&] { (void)ccgraph::trace(program, ccgraph::input<Ts>(xs.shape())...); });
  CHECK(!eager.empty());
  CHECK(contains(traced, eager));
  return eager;
}

/// The cost model's price of the first `op` node of the graph `program` traces on inputs of
/// these metas.
template <class F, class... Ins>
ccgraph::op_cost cost_in(F program, std::string_view op, const Ins&... ins) {
  auto g = ccgraph::trace(program, ins...);
  const auto found = nodes_of(g, op);
  REQUIRE(!found.empty());
  const ccgraph::node* n = found.front();
  std::vector<ccgraph::tensor_meta> in;
  for (const auto& a : n->args()) in.push_back(a.src->meta(a.index));
  return ccgraph::cost_of(n->kind(), in, n->metas());
}

/// A cost's total: FLOPs plus bytes (each grows with the problem).
inline double cost_size(const ccgraph::op_cost& c) { return c.flops + c.bytes; }

}  // namespace ccgraph_test::graph_ops
