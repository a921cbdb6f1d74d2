// tests/schedule/test_bucketing.cpp: bucket_collectives of ccgraph/schedule/bucketing.hpp: runs
// of adjacent compatible collectives become one coalesced collective under the byte cap, never
// across a dependency, a different group, reduce op, dtype or kind, and never reordering
// collectives; the graph still lints and computes bitwise the same results on 2 and 4 ranks.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/bucketing.hpp>

#include "support.hpp"
#include "schedule/same_results.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

/// The collectives of `g` in order, coalesced ones flattened into one signature per tensor.
std::vector<std::string> flat_collectives(const cg::graph& g) {
  std::vector<std::string> out;
  for (const cg::node* n : g.nodes()) {
    if (!n->is_collective()) continue;
    const auto c = *n->collective();
    for (std::size_t k = 0; k < n->args().size(); ++k) {
      const cg::tensor_meta m = n->args()[k].src->meta(n->args()[k].index);
      cg::ops::collective_op base = c;
      if (auto* ar = std::get_if<cg::ops::all_reduce_coalesced>(&c)) base = cg::ops::all_reduce{ar->op};
      if (auto* ag = std::get_if<cg::ops::all_gather_into_tensor_coalesced>(&c))
        base = cg::ops::all_gather_into_tensor{ag->group_size};
      if (auto* rs = std::get_if<cg::ops::reduce_scatter_tensor_coalesced>(&c))
        base = cg::ops::reduce_scatter_tensor{rs->op, rs->group_size};
      out.push_back(cg::ops::signature(base, {m}, *n->group()).str());
    }
  }
  return out;
}

/// Every node's transitive inputs, by name.
std::map<std::string, std::set<std::string>> ancestors(const cg::graph& g) {
  std::map<std::string, std::set<std::string>> anc;
  for (const cg::node* n : g.nodes()) {
    auto& s = anc[n->name()];
    for (auto& a : n->args()) {
      s.insert(a.src->name());
      const auto& up = anc[a.src->name()];
      s.insert(up.begin(), up.end());
    }
  }
  return anc;
}

/// Every dependency between non-collective nodes that both graphs have is still there.
void check_dependencies_kept(const cg::graph& before, const cg::graph& after) {
  const auto a0 = ancestors(before), a1 = ancestors(after);
  auto kept = [&](const std::string& name) {
    const cg::node* n0 = before.find(name);
    const cg::node* n1 = after.find(name);
    return n0 && n1 && !n0->is_collective() && !n1->is_collective() && n0->op() == n1->op();
  };
  for (const auto& [name, anc] : a0) {
    if (!kept(name)) continue;
    for (const auto& x : anc)
      if (kept(x)) CHECK_MESSAGE(a1.at(name).count(x), "%", name, " no longer depends on %", x);
  }
}

/// A structural check after every pass: lint, collective order, dependencies.
void check_structure(const cg::graph& before, const cg::graph& after) {
  CHECK_NOTHROW(cg::lint(after));
  CHECK(flat_collectives(after) == flat_collectives(before));
  check_dependencies_kept(before, after);
}

/// Three independent all_reduces and an all_gather, the gradient-bucketing shape.
template <class G>
auto three_all_reduces(const G& grp) {
  return [grp](auto a, auto b, auto c) {
    auto ra = cg::all_reduce(a * 2.f, "sum", grp);
    auto rb = cg::all_reduce(b, "sum", grp);
    auto rc = cg::all_reduce(c + 1.f, "sum", grp);
    auto gc = cg::all_gather_tensor(c, 0, grp);
    return std::make_tuple(ra + 1.f, rb, rc * rc, gc);
  };
}

}  // namespace

TEST_CASE("bucketing.all_reduce.adjacent_merge") {
  for (int world : {2, 4}) {
    const auto g = cg::trace(ccgraph_test::world(world), three_all_reduces(cg::group{iota_ranks(world)}),
                             cg::input<float>({4, 4}), cg::input<float>({8}), cg::input<float>({2, 3}));
    auto b = g;
    cg::bucket_collectives(b, 1 << 20);
    check_structure(g, b);
    CHECK(b.count("all_reduce") == 0);
    REQUIRE(b.count("all_reduce_coalesced") == 1);
    CHECK(b.count("all_gather_into_tensor") == 1);
    CHECK(b.count("wait_tensor") == 4);  // one per output of the coalesced node, and gc's
    const cg::node* m = b.find("all_reduce_coalesced");
    CHECK(m->num_outputs() == 3);
    CHECK(m->args().size() == 3);
    // The rb output is returned through its wait, which now reads the coalesced node.
    const cg::node* rb = b.output_node()->inputs()[1];
    CHECK(rb->op() == "wait_tensor");
    CHECK(rb->args()[0] == cg::value_ref{const_cast<cg::node*>(m), 1});
    CHECK(same_results(g, b, world));
  }
}

TEST_CASE("bucketing.tagged_groups_stay_apart") {
  // Groups over the same ranks with different tags are different groups (communicators): their
  // collectives never share a launch; those of one tag still do.
  const auto g = cg::trace(ccgraph_test::world(2), [](auto a, auto b, auto c) {
    const std::vector<int> ranks{0, 1};
    auto ra = cg::all_reduce(a, "sum", cg::group{ranks, "x"});
    auto rb = cg::all_reduce(b, "sum", cg::group{ranks, "x"});
    auto rc = cg::all_reduce(c, "sum", cg::group{ranks, "y"});
    return std::make_tuple(ra, rb, rc);
  }, cg::input<float>({4}), cg::input<float>({4}), cg::input<float>({4}));
  auto b = g;
  cg::bucket_collectives(b, 1 << 20);
  CHECK(b.count("all_reduce_coalesced") == 1);
  CHECK(b.count("all_reduce") == 1);
  for (const cg::node* n : b.nodes()) {
    if (n->op() == "all_reduce") CHECK(n->group()->tag == "y");
    if (n->op() == "all_reduce_coalesced") CHECK(n->group()->tag == "x");
  }
  CHECK(same_results(g, b, 2));
}

TEST_CASE("bucketing.cap.respected") {
  const auto g = cg::trace(ccgraph_test::world(2), three_all_reduces(cg::group{std::vector<int>{0, 1}}),
                           cg::input<float>({4, 4}), cg::input<float>({8}), cg::input<float>({2, 3}));
  // 64 + 32 bytes fit under 100, the third (24 bytes) does not.
  auto b = g;
  cg::bucket_collectives(b, 100);
  check_structure(g, b);
  CHECK(b.count("all_reduce") == 1);
  REQUIRE(b.count("all_reduce_coalesced") == 1);
  CHECK(b.find("all_reduce_coalesced")->num_outputs() == 2);
  for (const cg::node* n : b.nodes())
    if (n->is_collective()) CHECK(cg::detail::input_bytes(*n) <= 100);
  CHECK(same_results(g, b, 2));
  // A cap below each collective merges nothing (and changes nothing).
  auto none = g;
  cg::bucket_collectives(none, 16);
  CHECK(cg::to_string(none) == cg::to_string(g));
  // The exact total fits.
  auto all = g;
  cg::bucket_collectives(all, 64 + 32 + 24);
  CHECK(all.count("all_reduce") == 0);
  CHECK(all.count("all_reduce_coalesced") == 1);
}

TEST_CASE("bucketing.never.across_dependency") {
  const cg::group grp{std::vector<int>{0, 1}};
  const auto g = cg::trace(ccgraph_test::world(2), [&](auto a, auto b) {
    auto ra = cg::all_reduce(a, "sum", grp);
    auto x = cg::matmul(ra, b);               // reads ra's wait
    auto rx = cg::all_reduce(x, "sum", grp);  // depends on ra: must not merge with it
    auto rb = cg::all_reduce(b, "sum", grp);  // independent of rx: merges with it
    return std::make_tuple(rx, rb);
  }, cg::input<float>({4, 4}), cg::input<float>({4, 4}));
  auto b = g;
  cg::bucket_collectives(b, 1 << 20);
  check_structure(g, b);
  CHECK(b.count("all_reduce") == 1);
  REQUIRE(b.count("all_reduce_coalesced") == 1);
  const cg::node* m = b.find("all_reduce_coalesced");
  CHECK(m->args()[0].src->op() == "matmul");
  CHECK(b.position(b.find("all_reduce")) < b.position(m));
  CHECK(same_results(g, b, 2));
}

TEST_CASE("bucketing.reader.moves_after_merged") {
  // The first max all_reduce's wait comes before the second max all_reduce; merging puts the
  // coalesced node at the second one's place, so the wait moves after it.
  const cg::group grp{std::vector<int>{0, 1}};
  const auto g = cg::trace(ccgraph_test::world(2), [&](auto a, auto b) {
    auto ra = cg::all_reduce(a, "sum", grp);
    auto y = cg::matmul(ra, a);
    auto bb = cg::matmul(b, b);
    auto rb = cg::all_reduce(bb, "max", grp);
    auto rc = cg::all_reduce(b, "max", grp);
    return std::make_tuple(y + rb, rc);
  }, cg::input<float>({4, 4}), cg::input<float>({4, 4}));
  auto b = g;
  cg::bucket_collectives(b, 1 << 20);
  check_structure(g, b);
  // sum and max never share a bucket; the two max ones do.
  CHECK(b.count("all_reduce") == 1);
  REQUIRE(b.count("all_reduce_coalesced") == 1);
  CHECK(std::get<cg::ops::all_reduce_coalesced>(b.find("all_reduce_coalesced")->kind()).op == cg::reduce_op::max);
  CHECK(same_results(g, b, 2));
}

TEST_CASE("bucketing.never.across_group_op_dtype_kind") {
  const auto g = cg::trace(cg::trace_options{.rank = 0, .world_size = 4}, [](auto a, auto b, auto d) {
    const cg::group pair{std::vector<int>{0, 1}}, all{std::vector<int>{0, 1, 2, 3}};
    auto r1 = cg::all_reduce(a, "sum", pair);
    auto r2 = cg::all_reduce(b, "sum", all);        // other group
    auto r3 = cg::all_reduce(b, "avg", all);        // other op
    auto r4 = cg::all_reduce(d, "avg", all);        // other dtype
    auto r5 = cg::broadcast(a, 0, all);              // other kind: ends the run
    auto r6 = cg::all_reduce(a, "avg", all);
    auto r7 = cg::all_gather_tensor(a, 0, all);      // other kind
    auto r8 = cg::all_reduce(b, "avg", all);
    return std::make_tuple(r1, r2, r3, r4, r5, r6, r7, r8);
  }, cg::input<float>({4, 4}), cg::input<float>({4, 4}), cg::input<double>({4, 4}));
  auto b = g;
  cg::bucket_collectives(b, 1 << 20);
  check_structure(g, b);
  CHECK(cg::to_string(b) == cg::to_string(g));
  CHECK(b.count("all_reduce_coalesced") == 0);
}

TEST_CASE("bucketing.all_gather.reduce_scatter.and_coalesced") {
  for (int world : {2, 4}) {
    const auto g = cg::trace(ccgraph_test::world(world), [world](auto a, auto b, auto c) {
      const cg::group all{iota_ranks(world)};
      auto g1 = cg::all_gather_tensor(a, 0, all);
      auto g2 = cg::all_gather_into_tensor_coalesced(std::vector<decltype(a)>{b, c}, all);
      auto s1 = cg::reduce_scatter_tensor(a, "sum", 0, all);
      auto s2 = cg::reduce_scatter_tensor(b, "sum", 0, all);
      auto r1 = cg::all_reduce_coalesced(std::vector<decltype(a)>{a, b}, "sum", all);
      auto r2 = cg::all_reduce(c, "sum", all);
      return std::make_tuple(g1 * 2.f, g2[0], g2[1], s1, s2, r1[0], r1[1], r2 + 1.f);
    }, cg::input<float>({4, 4}), cg::input<float>({8, 2}), cg::input<float>({4}));
    auto b = g;
    cg::bucket_collectives(b, 1 << 20);
    check_structure(g, b);
    CHECK(b.count("all_gather_into_tensor") == 0);
    CHECK(b.count("reduce_scatter_tensor") == 0);
    CHECK(b.count("all_reduce") == 0);
    CHECK(b.count("all_gather_into_tensor_coalesced") == 1);
    CHECK(b.count("reduce_scatter_tensor_coalesced") == 1);
    CHECK(b.count("all_reduce_coalesced") == 1);
    for (const cg::node* n : b.nodes())
      if (n->is_collective()) CHECK(n->num_outputs() == (n->op() == "reduce_scatter_tensor_coalesced" ? 2 : 3));
    CHECK(same_results(g, b, world));
  }
}

TEST_CASE("bucketing.gradients.mixed_program") {
  // Layer-by-layer gradients: each all_reduce independent of the others, a chain of compute in
  // between, plus one all_reduce that reads an earlier result (a bucket boundary).
  const cg::group grp{std::vector<int>{0, 1, 2, 3}};
  const auto g = cg::trace(ccgraph_test::world(4), [&](auto x, auto w1, auto w2, auto w3) {
    auto h1 = cg::matmul(x, w1);
    auto g1 = cg::all_reduce(h1, "avg", grp);
    auto h2 = cg::matmul(cg::relu(h1), w2);
    auto g2 = cg::all_reduce(h2, "avg", grp);
    auto h3 = cg::matmul(cg::relu(h2), w3);
    auto g3 = cg::all_reduce(h3, "avg", grp);
    auto n1 = cg::all_reduce(g1 * g1, "avg", grp);  // depends on g1
    auto g4 = cg::all_reduce(w3, "avg", grp);
    return std::make_tuple(g1 + g2, g3, n1, g4);
  }, cg::input<float>({8, 8}), cg::input<float>({8, 8}), cg::input<float>({8, 8}), cg::input<float>({8, 8}));
  auto b = g;
  cg::bucket_collectives(b, 3 * 8 * 8 * 4);
  check_structure(g, b);
  // [g1 g2 g3] then [n1 g4]: n1 reads g1, which is in the closed bucket, so it may start one.
  CHECK(b.count("all_reduce") == 0);
  CHECK(b.count("all_reduce_coalesced") == 2);
  CHECK(same_results(g, b, 4));
  // Bucketing is deterministic and idempotent on what it made.
  auto again = b;
  cg::bucket_collectives(again, 3 * 8 * 8 * 4);
  CHECK(cg::to_string(again) == cg::to_string(b));
}
