// tests/ir/test_graph.cpp: the IR of ccgraph/ir/: graph mutators (users kept consistent by one
// mutator, erase and reorder refusing what would break the graph, deep copies), dead-code
// elimination, the structural hash, lint on hand-broken graphs, the printers (listing snapshot,
// table, DOT), and the one inference of every op, which must fail with the eager messages.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ccgraph/group/device_mesh.hpp>
#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ir/node_op.hpp>
#include <ccgraph/ir/print.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/ops/matmul.hpp>
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/ops/shape_ops.hpp>
#include <ccgraph/runtime/threads.hpp>
#include <ccgraph/trace/trace.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using cg::shape_t;
using i64 = std::int64_t;
using metas = std::vector<cg::tensor_meta>;

cg::tensor_meta f32(shape_t s) { return {cg::dtype::f32, std::move(s)}; }
cg::tensor_meta i32(shape_t s) { return {cg::dtype::i32, std::move(s)}; }
const cg::group_info world2{"0", {0, 1}};

/// A small hand-built graph: a, b -> all_reduce(a) -> wait -> matmul(wait, wait) -> output.
struct small {
  cg::graph g;
  cg::node *a, *b, *ar, *w, *mm, *out;
  small() {
    a = g.add_placeholder(f32({4, 4}));
    b = g.add_placeholder(f32({4, 8}));
    ar = g.add(cg::ops::all_reduce{cg::reduce_op::sum}, {{a, 0}}, world2, "ar");
    w = g.add(cg::ops::wait_tensor{}, {{ar, 0}}, {}, "w");
    mm = g.add(cg::ops::matmul{}, {{w, 0}, {w, 0}}, {}, "mm");
    out = g.set_output({{mm, 0}});
  }
};

/// lint's message for `g`, checked to carry the printed graph.
std::string lint_error(const cg::graph& g) {
  const std::string msg = error_of([&] { cg::lint(g); });
  CHECK(msg.rfind("lint: ", 0) == 0);
  CHECK(contains(msg, "\n" + cg::to_string(g)));
  return msg;
}

/// The lines of `s` with runs of spaces collapsed and trailing spaces dropped.
std::vector<std::string> collapsed_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string line; std::getline(is, line);) {
    std::string c;
    for (char ch : line)
      if (ch != ' ' || (!c.empty() && c.back() != ' ')) c += ch;
    while (!c.empty() && c.back() == ' ') c.pop_back();
    out.push_back(c);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Mutators
// ---------------------------------------------------------------------------------------------

TEST_CASE("graph.add.infers_metas_and_unique_names") {
  small s;
  CHECK(s.g.size() == 6);
  CHECK(s.a->name() == "arg");
  CHECK(s.b->name() == "arg_1");
  CHECK(s.mm->shape() == shape_t{4, 4});
  CHECK(s.mm->dtype() == cg::dtype::f32);
  CHECK(s.ar->group()->ranks == std::vector<int>{0, 1});
  CHECK(s.ar->is_collective());
  CHECK(s.w->is_wait());
  CHECK(s.g.placeholders() == std::vector<cg::node*>{s.a, s.b});
  CHECK(s.g.output_node() == s.out);
  CHECK(s.g.find("mm") == s.mm);
  CHECK(s.g.find("nope") == nullptr);
  // A repeated hint gets a suffix.
  auto* w2 = s.g.add(cg::ops::wait_tensor{}, {{s.mm, 0}}, {}, "w");
  CHECK(w2->name() == "w_1");
  // Nodes are appended before the output node.
  CHECK(s.g.nodes().back() == s.out);
  CHECK(s.g.position(w2) == s.g.size() - 2);
  // insert_after puts the node right after its position.
  auto* t = s.g.insert_after(s.w, cg::ops::transpose{0, 1}, {{s.w, 0}});
  CHECK(s.g.position(t) == s.g.position(s.w) + 1);
  cg::lint(s.g);

  // A node the inference rejects is not added, with the eager message.
  const auto before = s.g.size();
  CHECK(error_of([&] { s.g.add(cg::ops::matmul{}, {{s.b, 0}, {s.b, 0}}); }) ==
        error_of([] { (void)cg::matmul(cg::zeros<float>({4, 8}), cg::zeros<float>({4, 8})); }));
  CHECK(s.g.size() == before);
  CHECK(error_of([&] { s.g.add(cg::ops::wait_tensor{}, {{s.a, 3}}); }) ==
        "node::meta: node %arg (placeholder) has 1 outputs, not 4");
  cg::graph other;
  CHECK(error_of([&] { other.add(cg::ops::wait_tensor{}, {{s.a, 0}}); }) ==
        "graph::add: node is not owned by this graph (%arg)");
}

TEST_CASE("graph.infer.values_past_int64_are_errors") {
  // A node's shape may outgrow its inputs' (broadcast, matmul, repeat): every one is counted
  // with overflow checks, so memory plans and sizes computed from the graph never overflow.
  const i64 g = i64{1} << 32;
  const std::string too_many = " has too many elements (the product of its sizes exceeds 2^63 - 1)";
  cg::ops::pointwise add{"add", "add(%0, %1)", nullptr};
  CHECK(error_of([&] { (void)cg::infer(cg::node_op(add), {f32({g, 1}), f32({1, g})}, std::nullopt); }) ==
        "pointwise: shape [4294967296, 4294967296]" + too_many);
  CHECK(error_of([&] { (void)cg::infer(cg::node_op(cg::ops::matmul{}), {f32({g, 2}), f32({2, g})}, std::nullopt); }) ==
        "matmul: shape [4294967296, 4294967296]" + too_many);
  CHECK(error_of([&] { (void)cg::infer(cg::node_op(cg::ops::repeat{{g, g}}), {f32({1})}, std::nullopt); }) ==
        "repeat: shape [4294967296, 4294967296]" + too_many);
  CHECK(cg::infer(cg::node_op(add), {f32({g, 1}), f32({1, 2})}, std::nullopt).at(0).shape == shape_t{g, 2});
}

TEST_CASE("graph.set_args.keeps_users_consistent") {
  small s;
  // matmul(w, w) lists w once among w's users; inputs() keeps the repeat.
  CHECK(s.w->users() == std::vector<cg::node*>{s.mm});
  CHECK(s.mm->inputs() == std::vector<cg::node*>{s.w, s.w});
  auto* t = s.g.add(cg::ops::transpose{0, 1}, {{s.w, 0}});
  CHECK(s.w->users() == std::vector<cg::node*>{s.mm, t});
  s.g.set_args(s.mm, {{t, 0}, {s.a, 0}});
  CHECK(s.w->users() == std::vector<cg::node*>{t});
  CHECK(t->users() == std::vector<cg::node*>{s.mm});
  CHECK(s.a->users() == std::vector<cg::node*>{s.ar, s.mm});
  s.g.set_args(s.mm, {{s.w, 0}, {s.w, 0}});
  CHECK(s.a->users() == std::vector<cg::node*>{s.ar});
  CHECK(t->users().empty());
  cg::lint(s.g);
  cg::graph other;
  CHECK(error_of([&] { other.set_args(s.mm, {}); }) == "graph::set_args: node is not owned by this graph (%mm)");
  CHECK(error_of([&] { s.g.set_args(s.mm, {{nullptr, 0}}); }) == "graph::set_args: node is not owned by this graph");
}

TEST_CASE("graph.replace_all_uses") {
  small s;
  auto* c = s.g.add(cg::ops::contiguous{}, {{s.a, 0}}, {}, "c");
  s.g.replace_all_uses({s.w, 0}, {c, 0});
  CHECK(s.w->users().empty());
  CHECK(s.mm->inputs() == std::vector<cg::node*>{c, c});
  CHECK(c->users() == std::vector<cg::node*>{s.mm});
  // The replacement itself is not made to read itself.
  auto* t = s.g.add(cg::ops::contiguous{}, {{c, 0}}, {}, "t");
  s.g.replace_all_uses({c, 0}, {t, 0});
  CHECK(t->inputs() == std::vector<cg::node*>{c});
  CHECK(s.mm->inputs() == std::vector<cg::node*>{t, t});
  CHECK(error_of([&] { s.g.replace_all_uses({s.a, 0}, {s.b, 0}); }) ==
        "replace_all_uses: %arg is f32[4, 4] but %arg_1 is f32[4, 8]");
}

TEST_CASE("graph.erase.refused_with_users") {
  small s;
  CHECK(error_of([&] { s.g.erase(s.w); }) == "erase: node %w (wait_tensor) still has 1 user(s), first %mm");
  CHECK(s.g.size() == 6);
  auto* t = s.g.add(cg::ops::transpose{0, 1}, {{s.a, 0}}, {}, "t");
  CHECK(s.a->users().size() == 2);
  s.g.erase(t);
  CHECK(s.g.size() == 6);
  CHECK(s.a->users() == std::vector<cg::node*>{s.ar});  // the erased node left its inputs' users
  CHECK(s.g.find("t") == nullptr);
  CHECK(s.g.add(cg::ops::transpose{0, 1}, {{s.a, 0}}, {}, "t")->name() == "t");  // the name is free again
  cg::lint(s.g);
}

TEST_CASE("graph.reorder.refuses_dependency_violations") {
  small s;
  const auto order = s.g.nodes();
  CHECK(error_of([&] { s.g.reorder({s.a, s.b, s.w, s.ar, s.mm, s.out}); }) ==
        "reorder: node %w would run before its input %ar");
  CHECK(error_of([&] { s.g.reorder({s.a, s.a, s.ar, s.w, s.mm, s.out}); }) == "reorder: node %arg listed twice");
  CHECK(error_of([&] { s.g.reorder({s.a, s.ar}); }) == "reorder: 2 nodes for a graph of 6");
  CHECK(s.g.nodes() == order);  // unchanged after every refusal, positions included
  for (std::size_t i = 0; i < order.size(); ++i) CHECK(s.g.position(order[i]) == i);
  // A valid order is taken, and positions follow.
  s.g.reorder({s.b, s.a, s.ar, s.w, s.mm, s.out});
  CHECK(s.g.nodes().front() == s.b);
  CHECK(s.g.position(s.a) == 1);
  CHECK(s.g.placeholders() == std::vector<cg::node*>{s.a, s.b});  // input order is by index
  cg::lint(s.g);
}

TEST_CASE("graph.copy_and_move") {
  small s;
  cg::graph copy = s.g;
  REQUIRE(copy.size() == s.g.size());
  for (std::size_t i = 0; i < copy.size(); ++i) {
    const cg::node* n = copy.nodes()[i];
    CHECK(n != s.g.nodes()[i]);
    CHECK(n->owner() == &copy);
    CHECK(n->name() == s.g.nodes()[i]->name());
    for (auto* in : n->inputs()) CHECK(in->owner() == &copy);
    for (auto* u : n->users()) CHECK(u->owner() == &copy);
  }
  CHECK(cg::to_string(copy) == cg::to_string(s.g));
  CHECK(cg::structural_hash(copy) == cg::structural_hash(s.g));
  cg::lint(copy);
  // Changing the copy leaves the original alone.
  copy.set_args(copy.find("mm"), {{copy.find("arg"), 0}, {copy.find("arg"), 0}});
  CHECK(s.w->users() == std::vector<cg::node*>{s.mm});
  CHECK(copy.find("w")->users().empty());
  // Assignment and move keep ownership right.
  cg::graph assigned;
  assigned = s.g;
  cg::lint(assigned);
  cg::graph moved = std::move(assigned);
  for (const cg::node* n : moved.nodes()) CHECK(n->owner() == &moved);
  cg::lint(moved);
  CHECK(cg::structural_hash(moved) == cg::structural_hash(s.g));
  // A traced graph is a graph: copies of it too.
  auto tg = cg::trace(world(2), [](auto x) { return cg::all_reduce(x, "sum", "0"); }, cg::input<float>({2}));
  cg::graph plain = tg;
  CHECK(cg::to_string(plain) == cg::to_string(tg));
}

// ---------------------------------------------------------------------------------------------
// Dead-code elimination
// ---------------------------------------------------------------------------------------------

TEST_CASE("dce.keeps_collectives_waits_inputs_and_outputs") {
  auto g = cg::trace(world(2), [](auto a, auto unused) {
    (void)unused;
    auto dead = cg::matmul(a, a);
    auto dead2 = cg::matmul(dead, a);                 // a dead chain
    (void)dead2;
    (void)a.transpose(0, 1);                          // a dead view
    (void)cg::eval(a * 3.f);                          // a dead pointwise node
    (void)cg::all_reduce(a, "sum", "0");              // collective and wait: never dropped
    auto parts = cg::all_gather_into_tensor_coalesced(std::vector{a, a}, "0");
    (void)parts;                                      // one collective, two unread waits
    return cg::eval(a + 1.f);
  }, cg::input<float>({4, 4}), cg::input<float>({4, 4}));
  CHECK(g.size() == 13);
  cg::lint(g);
  cg::graph d = g;
  CHECK(cg::eliminate_dead_code(d) == 4);
  CHECK(cg::op_sequence(d) == std::vector<std::string>{"all_reduce", "wait_tensor", "all_gather_into_tensor_coalesced",
                                                       "wait_tensor", "wait_tensor", "fused_add"});
  CHECK(d.placeholders().size() == 2);
  CHECK(d.output_node() != nullptr);
  cg::lint(d);
  CHECK(cg::eliminate_dead_code(d) == 0);
}

// ---------------------------------------------------------------------------------------------
// Structural hash
// ---------------------------------------------------------------------------------------------

TEST_CASE("structural_hash.equal_programs") {
  auto fn = [](auto a, auto b) {
    auto ar = cg::all_reduce(cg::relu(a) * b, "sum", "0");
    return cg::matmul(ar, b.transpose(0, 1));
  };
  const auto h = cg::structural_hash(cg::trace(world(2), fn, cg::input<float>({4, 4}), cg::input<float>({4, 4})));
  CHECK(cg::structural_hash(cg::trace(world(2), fn, cg::input<float>({4, 4}), cg::input<float>({4, 4}))) == h);
  // Another rank of the same group records the same program.
  CHECK(cg::structural_hash(cg::trace(world(2, 1), fn, cg::input<float>({4, 4}), cg::input<float>({4, 4}))) == h);

  // Names do not matter.
  auto build = [](const char* x, const char* y) {
    cg::graph g;
    auto* a = g.add_placeholder(f32({4}), false, x);
    auto* r = g.add(cg::ops::all_reduce{cg::reduce_op::max}, {{a, 0}}, world2, y);
    auto* w = g.add(cg::ops::wait_tensor{}, {{r, 0}}, {}, y);
    g.set_output({{w, 0}});
    return g;
  };
  const auto g1 = build("x", "y"), g2 = build("input", "reduce");
  CHECK(cg::to_string(g1) != cg::to_string(g2));
  CHECK(cg::structural_hash(g1) == cg::structural_hash(g2));
  // The printed group name does not matter either, only the ranks.
  cg::graph g3 = g1;
  cg::graph g4;
  {
    auto* a = g4.add_placeholder(f32({4}));
    auto* r = g4.add(cg::ops::all_reduce{cg::reduce_op::max}, {{a, 0}}, cg::group_info{"pair", {0, 1}});
    auto* w = g4.add(cg::ops::wait_tensor{}, {{r, 0}});
    g4.set_output({{w, 0}});
  }
  CHECK(cg::structural_hash(g4) == cg::structural_hash(g3));
}

TEST_CASE("structurally_equal.what_the_hash_tells_apart") {
  auto traced = [](auto fn, auto... in) { return cg::graph(cg::trace(world(4), fn, in...)); };
  auto ar = [](cg::group g, const char* op = "sum") { return [g, op](auto a) { return cg::all_reduce(a, op, g); }; };
  const cg::graph base = traced(ar(cg::group{"0"}), cg::input<float>({4, 4}));
  // Equal: the same program traced again, or written with another form of the group.
  CHECK(cg::structurally_equal(base, traced(ar(cg::group{"0"}), cg::input<float>({4, 4}))));
  CHECK(cg::structurally_equal(base, traced(ar(cg::group{std::vector<int>{3, 2, 1, 0}}), cg::input<float>({4, 4}))));
  // Different: every kind of difference structural_hash tells apart.
  const std::vector<cg::graph> others{
      traced(ar(cg::group{"0"}), cg::input<float>({4, 8})),
      traced(ar(cg::group{"0"}), cg::input<double>({4, 4})),
      traced(ar(cg::group{"0"}, "max"), cg::input<float>({4, 4})),
      traced(ar(cg::group{"0"}), cg::input<float>({4, 4}).as_pending()),
      traced(ar(cg::group{std::vector<int>{0, 1}}), cg::input<float>({4, 4})),
      traced(ar(cg::group{"0"}.tagged("t")), cg::input<float>({4, 4})),
      traced([](auto a) { return a * 0.f; }, cg::input<float>({4, 4})),
  };
  for (std::size_t i = 0; i < others.size(); ++i) {
    CAPTURE(i);
    CHECK_FALSE(cg::structurally_equal(base, others[i]));
    CHECK(cg::structurally_equal(others[i], others[i]));
  }
  CHECK(contains(cg::to_string(others[5]), "all_reduce(%arg, op=sum, group=0:t)"));
  CHECK_FALSE(cg::structurally_equal(traced([](auto a) { return a * 0.f; }, cg::input<float>({4})),
                                     traced([](auto a) { return a * -0.f; }, cg::input<float>({4}))));
  CHECK_FALSE(cg::structurally_equal(
      traced([](auto a) { return cg::all_to_all_single(a, std::vector<std::int64_t>{1, 1, 1, 1},
                                                       std::vector<std::int64_t>{1, 1, 1, 1}, "0"); },
             cg::input<float>({4})),
      traced([](auto a) { return cg::all_to_all_single(a, std::vector<std::int64_t>{1, 1, 1, 1},
                                                       std::vector<std::int64_t>{2, 0, 1, 1}, "0"); },
             cg::input<float>({4}))));
  CHECK_FALSE(cg::structurally_equal(
      traced([](auto a, auto b) { return cg::matmul(a, b); }, cg::input<float>({4, 4}), cg::input<float>({4, 4})),
      traced([](auto a, auto b) { return cg::matmul(b, a); }, cg::input<float>({4, 4}), cg::input<float>({4, 4}))));
}

TEST_CASE("structural_hash.different_programs") {
  auto hash = [](auto fn, auto... in) { return cg::structural_hash(cg::trace(world(4), fn, in...)); };
  auto ar = [](const char* op) {
    return [op](auto a) { return cg::all_reduce(a, op, "0"); };
  };
  const auto base = hash(ar("sum"), cg::input<float>({4, 4}));
  CHECK(hash(ar("sum"), cg::input<float>({4, 8})) != base);              // shape
  CHECK(hash(ar("sum"), cg::input<double>({4, 4})) != base);             // dtype
  CHECK(hash(ar("max"), cg::input<float>({4, 4})) != base);              // attribute
  CHECK(hash(ar("sum"), cg::input<float>({4, 4}).as_pending()) != base);  // a pending input
  CHECK(hash([](auto a) { return cg::all_reduce(a, "sum", std::vector<int>{0, 1}); }, cg::input<float>({4, 4})) !=
        base);  // group
  CHECK(hash([](auto a) { return cg::all_reduce(a, "sum", cg::group{"0"}.tagged("t")); }, cg::input<float>({4, 4})) !=
        base);  // group tag
  // Groups by ranks: the pair {0, 1} traced on rank 0 and {2, 3} on rank 2 differ.
  auto pairs = [](auto a) { return cg::all_reduce(a, "sum", std::vector<std::vector<int>>{{0, 1}, {2, 3}}); };
  CHECK(cg::structural_hash(cg::trace(world(4, 0), pairs, cg::input<float>({4}))) !=
        cg::structural_hash(cg::trace(world(4, 2), pairs, cg::input<float>({4}))));
  CHECK(cg::structural_hash(cg::trace(world(4, 0), pairs, cg::input<float>({4}))) ==
        cg::structural_hash(cg::trace(world(4, 1), pairs, cg::input<float>({4}))));
  // Attributes of views and compute ops.
  CHECK(hash([](auto a) { return a.narrow(0, 0, 2); }, cg::input<float>({4})) !=
        hash([](auto a) { return a.narrow(0, 1, 2); }, cg::input<float>({4})));
  CHECK(hash([](auto a) { return cg::cat({a, a}, 0); }, cg::input<float>({4, 4})) !=
        hash([](auto a) { return cg::cat({a, a}, 1); }, cg::input<float>({4, 4})));
  // Pointwise: the ops and every bit of the scalars.
  CHECK(hash([](auto a) { return cg::relu(a); }, cg::input<float>({4})) !=
        hash([](auto a) { return cg::gelu(a); }, cg::input<float>({4})));
  CHECK(hash([](auto a) { return a * 0.12345f; }, cg::input<float>({4})) !=
        hash([](auto a) { return a * 0.12346f; }, cg::input<float>({4})));
  CHECK(hash([](auto a) { return a * 0.f; }, cg::input<float>({4})) !=
        hash([](auto a) { return a * -0.f; }, cg::input<float>({4})));
  // Argument order and wiring.
  CHECK(hash([](auto a, auto b) { return cg::matmul(a, b); }, cg::input<float>({4, 4}), cg::input<float>({4, 4})) !=
        hash([](auto a, auto b) { return cg::matmul(b, a); }, cg::input<float>({4, 4}), cg::input<float>({4, 4})));
  // The order of independent nodes (a different schedule).
  small s;
  const auto before = cg::structural_hash(s.g);
  auto* t1 = s.g.add(cg::ops::transpose{0, 1}, {{s.a, 0}}, {}, "t1");
  auto* t2 = s.g.add(cg::ops::contiguous{}, {{s.b, 0}}, {}, "t2");
  CHECK(cg::structural_hash(s.g) != before);
  const auto h12 = cg::structural_hash(s.g);
  std::vector<cg::node*> order = s.g.nodes();
  std::swap(order[order.size() - 3], order[order.size() - 2]);
  REQUIRE(order[order.size() - 3] == t2);
  s.g.reorder(order);
  (void)t1;
  CHECK(cg::structural_hash(s.g) != h12);
}

// ---------------------------------------------------------------------------------------------
// lint on hand-broken graphs
// ---------------------------------------------------------------------------------------------

TEST_CASE("lint.accepts_well_formed_graphs") {
  small s;
  cg::lint(s.g);
  cg::lint(cg::trace(world(2), [](auto a) { return cg::all_reduce(a, "sum", "0"); }, cg::input<float>({4})));
  cg::lint(cg::trace(world(2), [](auto a) { return a; }, cg::input<float>({4}).as_pending()));
}

TEST_CASE("lint.collective_read_without_wait") {
  small s;
  s.g.set_args(s.mm, {{s.ar, 0}, {s.w, 0}});
  CHECK(contains(lint_error(s.g), "lint: %mm reads collective %ar without a wait_tensor\n"));
}

TEST_CASE("lint.two_waits_of_one_collective") {
  small s;
  auto* w2 = s.g.add(cg::ops::wait_tensor{}, {{s.ar, 0}}, {}, "w2");
  s.g.set_output({{s.mm, 0}, {w2, 0}});
  CHECK(contains(lint_error(s.g), "lint: collective %ar output 0 has 2 wait_tensor nodes (expected exactly one)\n"));
}

TEST_CASE("lint.collective_never_waited") {
  small s;
  s.g.set_args(s.mm, {{s.a, 0}, {s.a, 0}});
  s.g.erase(s.w);
  CHECK(contains(lint_error(s.g), "lint: collective %ar output 0 has 0 wait_tensor nodes (expected exactly one)\n"));
  // Returned un-waited is fine.
  s.g.set_output({{s.mm, 0}, {s.ar, 0}});
  cg::lint(s.g);
  // One output of a coalesced collective waited twice, the other never.
  cg::graph g;
  auto* a = g.add_placeholder(f32({2}));
  auto* c = g.add(cg::ops::all_reduce_coalesced{cg::reduce_op::sum}, {{a, 0}, {a, 0}}, world2, "c");
  auto* w0 = g.add(cg::ops::wait_tensor{}, {{c, 0}});
  auto* w1 = g.add(cg::ops::wait_tensor{}, {{c, 0}});
  g.set_output({{w0, 0}, {w1, 0}});
  CHECK(contains(lint_error(g), "lint: collective %c output 0 has 2 wait_tensor nodes"));
  g.set_args(w1, {{c, 1}});
  cg::lint(g);
}

TEST_CASE("lint.use_before_definition") {
  // reorder refuses such an order; insert_after does not check, lint does.
  small s;
  s.g.insert_after(s.a, cg::ops::matmul{}, {{s.w, 0}, {s.b, 0}}, {}, "early");
  CHECK(contains(lint_error(s.g), "lint: node %early reads %w before it is defined\n"));
}

TEST_CASE("lint.bad_output_index_and_stale_metas") {
  {
    small s;
    s.g.set_args(s.mm, {{s.w, 3}, {s.w, 0}});  // set_args does not re-run inference
    CHECK(contains(lint_error(s.g), "lint: node %mm reads output 3 of %w, which has 1\n"));
  }
  {
    small s;
    s.g.set_args(s.mm, {{s.w, 0}, {s.b, 0}});  // [4, 4] @ [4, 8] is [4, 8], recorded as [4, 4]
    CHECK(contains(lint_error(s.g), "lint: node %mm has metas that differ from what its inputs give\n"));
  }
  {
    small s;
    s.g.set_args(s.mm, {{s.b, 0}, {s.b, 0}});
    const std::string eager = error_of([] { (void)cg::matmul(cg::zeros<float>({4, 8}), cg::zeros<float>({4, 8})); });
    CHECK(contains(lint_error(s.g), "lint: node %mm is invalid: " + eager + "\n"));
  }
}

TEST_CASE("lint.placeholders_first_output_last") {
  {
    small s;
    s.g.reorder({s.a, s.ar, s.b, s.w, s.mm, s.out});
    CHECK(contains(lint_error(s.g), "lint: placeholder %arg_1 after other nodes\n"));
  }
  {
    cg::graph g;
    auto* a = g.add_placeholder(f32({2}));
    auto* t = g.add(cg::ops::contiguous{}, {{a, 0}});
    auto* out = g.set_output({{a, 0}});
    g.reorder({a, out, t});
    CHECK(contains(lint_error(g), "lint: output node %output is not last\n"));
  }
  {
    cg::graph g;
    auto* a = g.add_placeholder(f32({2}));
    g.add(cg::ops::contiguous{}, {{a, 0}});
    CHECK(contains(lint_error(g), "lint: the graph has no output node\n"));
  }
  // Not reachable through the public API (every mutator prevents them): duplicate names,
  // nodes of another graph, users lists out of step with arguments.
}

// ---------------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------------

namespace {
auto printed_program() {
  return cg::trace(world(2), [](auto a, auto b) {
    auto h = cg::relu(a) * 2.f;
    auto ar = cg::all_reduce(h, "sum", "0");
    auto parts = cg::all_gather_into_tensor_coalesced(std::vector{cg::eval(ar + b), b}, "0");
    auto m = cg::matmul(parts[0].transpose(0, 1), parts[1]);
    return std::make_tuple(m, ar);
  }, cg::input<float>({4, 4}), cg::input<float>({4, 4}).as_pending());
}
}  // namespace

TEST_CASE("print.listing.snapshot") {
  const auto g = printed_program();
  CHECK(cg::to_string(g) ==
        "graph():\n"
        "    %arg : f32[4, 4] = placeholder()\n"
        "    %arg_1 : f32[4, 4] = placeholder(pending=true)\n"
        "    %wait_tensor : f32[4, 4] = wait_tensor(%arg_1)\n"
        "    %mul : f32[4, 4] = fused_relu_mul(%arg, expr=mul(relu(%0), 2.))\n"
        "    %all_reduce : f32[4, 4] = all_reduce(%mul, op=sum, group=0)\n"
        "    %wait_tensor_1 : f32[4, 4] = wait_tensor(%all_reduce)\n"
        "    %add : f32[4, 4] = fused_add(%wait_tensor_1, %wait_tensor, expr=add(%0, %1))\n"
        "    %all_gather_into_tensor_coalesced : (f32[8, 4], f32[8, 4]) = "
        "all_gather_into_tensor_coalesced(%add, %wait_tensor, group_size=2, group=0)\n"
        "    %wait_tensor_2 : f32[8, 4] = wait_tensor(%all_gather_into_tensor_coalesced.0)\n"
        "    %wait_tensor_3 : f32[8, 4] = wait_tensor(%all_gather_into_tensor_coalesced.1)\n"
        "    %transpose : f32[4, 8] = transpose(%wait_tensor_2, dim0=0, dim1=1)\n"
        "    %matmul : f32[4, 4] = matmul(%transpose, %wait_tensor_3)\n"
        "    return (%matmul, %wait_tensor_1)\n");
  std::ostringstream os;
  os << g;
  CHECK(os.str() == cg::to_string(g));
  CHECK(cg::to_string(*g.nodes()[4]) == "%all_reduce : f32[4, 4] = all_reduce(%mul, op=sum, group=0)");
  // Every attribute of every collective, generically from its Hana struct.
  auto a2a = cg::trace(world(4, 1), [](auto t) {
    auto x = cg::all_to_all_single(t, std::vector<i64>{1, 0, 2, 1}, std::vector<i64>{0, 3, 1, 0}, std::vector<int>{0, 1, 2, 3});
    auto y = cg::reduce_scatter_tensor(x, "avg", 0, std::vector<std::vector<int>>{{0, 1}, {2, 3}});
    return cg::broadcast(y, 0, std::vector<int>{0, 1});
  }, cg::input<std::int32_t>({4, 2}));
  CHECK(cg::to_string(a2a) ==
        "graph():\n"
        "    %arg : i32[4, 2] = placeholder()\n"
        "    %all_to_all_single : i32[4, 2] = all_to_all_single(%arg, output_split_sizes=[1, 0, 2, 1], "
        "input_split_sizes=[0, 3, 1, 0], group=0)\n"
        "    %wait_tensor : i32[4, 2] = wait_tensor(%all_to_all_single)\n"
        "    %reduce_scatter_tensor : i32[2, 2] = reduce_scatter_tensor(%wait_tensor, op=avg, group_size=2, "
        "group=[0, 1])\n"
        "    %wait_tensor_1 : i32[2, 2] = wait_tensor(%reduce_scatter_tensor)\n"
        "    %broadcast : i32[2, 2] = broadcast(%wait_tensor_1, src=0, group=[0, 1])\n"
        "    %wait_tensor_2 : i32[2, 2] = wait_tensor(%broadcast)\n"
        "    return %wait_tensor_2\n");
  // An in-place call and a single returned value.
  auto inplace = cg::trace(world(2), [](auto t) {
    cg::all_reduce_(t, "bxor", "0");
    return t;
  }, cg::input<std::int64_t>({3}));
  CHECK(cg::to_string(inplace) ==
        "graph():\n"
        "    %arg : i64[3] = placeholder()\n"
        "    %all_reduce : i64[3] = all_reduce(%arg, op=bxor, group=0)\n"
        "    %wait_tensor : i64[3] = wait_tensor(%all_reduce)\n"
        "    %copy : i64[3] = copy(%arg, %wait_tensor)\n"
        "    return %copy\n");
}

TEST_CASE("print.table") {
  const auto g = printed_program();
  const auto lines = collapsed_lines(cg::to_table(g));
  REQUIRE(lines.size() == g.size() + 1);
  CHECK(lines[0] == "# name op meta args users");
  CHECK(lines[1] == "0 %arg placeholder f32[4, 4] - %mul");
  CHECK(lines[3] == "2 %wait_tensor wait_tensor f32[4, 4] %arg_1 %add %all_gather_into_tensor_coalesced");
  CHECK(lines[4] == "3 %mul fused_relu_mul f32[4, 4] %arg %all_reduce");
  CHECK(lines[8] ==
        "7 %all_gather_into_tensor_coalesced all_gather_into_tensor_coalesced (f32[8, 4], f32[8, 4]) %add "
        "%wait_tensor %wait_tensor_2 %wait_tensor_3");
  CHECK(lines[9] == "8 %wait_tensor_2 wait_tensor f32[8, 4] %all_gather_into_tensor_coalesced.0 %transpose");
  CHECK(lines[13] == "12 %output output - %matmul %wait_tensor_1 -");
  // A value longer than its column still leaves a space before the next one.
  CHECK(contains(cg::to_table(g), "%all_gather_into_tensor_coalesced all_gather_into_tensor_coalesced "));
}

TEST_CASE("print.dot") {
  const auto dot = cg::to_dot(printed_program());
  CHECK(dot.rfind("digraph ccgraph {\n", 0) == 0);
  CHECK(dot.size() >= 2);
  CHECK(dot.substr(dot.size() - 2) == "}\n");
  for (const char* line : {
           "  \"arg_1\" [label=\"%arg_1\\nplaceholder\\nf32[4, 4]\", style=filled, fillcolor=lightgrey];\n",
           "  \"mul\" [label=\"%mul\\nfused_relu_mul\\nf32[4, 4]\", style=filled, fillcolor=lightblue];\n",
           "  \"all_reduce\" [label=\"%all_reduce\\nall_reduce\\nf32[4, 4]\\ngroup=0\", style=filled, "
           "fillcolor=lightsalmon];\n",
           "  \"wait_tensor_1\" [label=\"%wait_tensor_1\\nwait_tensor\\nf32[4, 4]\", style=filled, fillcolor=khaki];\n",
           "  \"all_reduce\" -> \"wait_tensor_1\";\n",
           "  \"all_gather_into_tensor_coalesced\" -> \"wait_tensor_3\" [label=\"1\"];\n",
           "  \"wait_tensor_1\" -> \"output\";\n",
       }) {
    CAPTURE(line);
    CHECK(contains(dot, line));
  }
}

// ---------------------------------------------------------------------------------------------
// Inference: every op, with the eager messages
// ---------------------------------------------------------------------------------------------

namespace {
std::string infer_error(const cg::node_op& op, const metas& in, std::optional<cg::group_info> g = {}) {
  return error_of([&] { (void)cg::infer(op, in, g); });
}
}  // namespace

TEST_CASE("infer.compute_ops.metas") {
  using namespace cg::ops;
  CHECK(cg::infer(matmul{}, {f32({2, 3}), f32({3, 5})}, {}) == metas{f32({2, 5})});
  CHECK(cg::infer(matmul{}, {f32({7, 2, 3}), f32({3})}, {}) == metas{f32({7, 2})});
  CHECK(cg::infer(cat{1}, {i32({2, 3}), i32({2, 1})}, {}) == metas{i32({2, 4})});
  CHECK(cg::infer(cat{-1}, {f32({2}), f32({5})}, {}) == metas{f32({7})});
  CHECK(cg::infer(repeat{{2, 1, 3}}, {f32({4, 5})}, {}) == metas{f32({2, 4, 15})});
  CHECK(cg::infer(copy{}, {f32({2, 3}), f32({3})}, {}) == metas{f32({2, 3})});
  CHECK(cg::infer(reshape{{3, 4}}, {f32({2, 6})}, {}) == metas{f32({3, 4})});
  CHECK(cg::infer(narrow{1, 2, 3}, {f32({2, 6})}, {}) == metas{f32({2, 3})});
  CHECK(cg::infer(transpose{0, -1}, {f32({2, 6, 4})}, {}) == metas{f32({4, 6, 2})});
  CHECK(cg::infer(permute{{2, 0, 1}}, {f32({2, 6, 4})}, {}) == metas{f32({4, 2, 6})});
  CHECK(cg::infer(cg::ops::select{1, 5}, {f32({2, 6, 4})}, {}) == metas{f32({2, 4})});
  CHECK(cg::infer(unsqueeze{-1}, {f32({2, 6})}, {}) == metas{f32({2, 6, 1})});
  CHECK(cg::infer(contiguous{}, {f32({2, 6})}, {}) == metas{f32({2, 6})});
  CHECK(cg::infer(wait_tensor{}, {i32({2})}, {}) == metas{i32({2})});
  CHECK(cg::infer(placeholder{0, false}, {}, {}).empty());
  CHECK(cg::infer(output{}, {f32({1})}, {}).empty());
  CHECK(cg::infer(pointwise{"fused_add", "add(%0, %1)", nullptr}, {f32({2, 1}), f32({3})}, {}) == metas{f32({2, 3})});
}

TEST_CASE("infer.compute_ops.errors_as_eager") {
  using namespace cg::ops;
  auto t = [](shape_t s) { return cg::zeros<float>(std::move(s)); };
  CHECK(infer_error(matmul{}, {f32({2, 3}), f32({4, 5})}) == error_of([&] { (void)cg::matmul(t({2, 3}), t({4, 5})); }));
  CHECK(infer_error(matmul{}, {f32({}), f32({4, 5})}) == error_of([&] { (void)cg::matmul(t({}), t({4, 5})); }));
  CHECK(infer_error(matmul{}, {f32({2, 3}), i32({3, 2})}) == "matmul: mixing dtypes: f32[2, 3] and i32[3, 2]");
  CHECK(infer_error(matmul{}, {f32({2, 3})}) == "matmul: expects 2 input(s), got 1");
  CHECK(infer_error(cat{0}, {f32({2, 3}), f32({2, 4})}) == error_of([&] { (void)cg::cat({t({2, 3}), t({2, 4})}, 0); }));
  CHECK(infer_error(cat{2}, {f32({2, 3}), f32({2, 3})}) == error_of([&] { (void)cg::cat({t({2, 3}), t({2, 3})}, 2); }));
  CHECK(infer_error(cat{0}, {f32({2}), f32({2, 3})}) == error_of([&] { (void)cg::cat({t({2}), t({2, 3})}, 0); }));
  CHECK(infer_error(cat{0}, {}) == error_of([&] { (void)cg::cat(std::vector<cg::tensor<float>>{}, 0); }));
  CHECK(infer_error(cat{0}, {f32({2}), i32({2})}) == "cat: mixing dtypes: f32[2] and i32[2]");
  CHECK(infer_error(repeat{{2}}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).repeat({2}); }));
  CHECK(infer_error(repeat{{2, -1}}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).repeat({2, -1}); }));
  CHECK(infer_error(copy{}, {f32({2, 3}), f32({4})}) == error_of([&] { t({2, 3}).copy_(t({4})); }));
  CHECK(infer_error(copy{}, {f32({3}), f32({2, 3})}) == error_of([&] { t({3}).copy_(t({2, 3})); }));
  CHECK(infer_error(reshape{{5}}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).reshape({5}); }));
  CHECK(infer_error(reshape{{-1, -1}}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).reshape({-1, -1}); }));
  CHECK(infer_error(narrow{1, 2, 2}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).narrow(1, 2, 2); }));
  CHECK(infer_error(narrow{2, 0, 1}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).narrow(2, 0, 1); }));
  CHECK(infer_error(transpose{0, 2}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).transpose(0, 2); }));
  CHECK(infer_error(permute{{0, 0}}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).permute({0, 0}); }));
  CHECK(infer_error(permute{{0}}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).permute({0}); }));
  CHECK(infer_error(cg::ops::select{0, 2}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).select(0, 2); }));
  CHECK(infer_error(unsqueeze{3}, {f32({2, 3})}) == error_of([&] { (void)t({2, 3}).unsqueeze(3); }));
  CHECK(infer_error(wait_tensor{}, {f32({2}), f32({2})}) == "wait_tensor: expects 1 input(s), got 2");
  CHECK(infer_error(contiguous{}, {}) == "contiguous: expects 1 input(s), got 0");
  // Every one of these is a real message, never empty (no error).
  CHECK_FALSE(infer_error(narrow{1, 2, 2}, {f32({2, 3})}).empty());
  // Pointwise: broadcasting and dtypes. (A traced expression fails earlier, in its eager
  // constructor, with the op's own name; the node's inference names the fused node.)
  CHECK(infer_error(pointwise{"fused_add", "add(%0, %1)", nullptr}, {f32({2, 3}), f32({4})}) ==
        "fused_add: shapes [2, 3] and [4] cannot be broadcast together (dim 1: 3 vs 4)");
  CHECK(error_of([&] { (void)(t({2, 3}) + t({4})).eval(); }) ==
        "add: shapes [2, 3] and [4] cannot be broadcast together (dim 1: 3 vs 4)");
  CHECK(infer_error(pointwise{"fused_add", "add(%0, %1)", nullptr}, {f32({2}), i32({2})}) ==
        "pointwise: mixing dtypes: f32[2] and i32[2]");
  CHECK(infer_error(pointwise{"fused_relu", "relu(%0)", nullptr}, {}) == "pointwise: needs at least one tensor input");
}

TEST_CASE("infer.collectives.metas") {
  using namespace cg::ops;
  const cg::group_info g4{"0", {0, 1, 2, 3}};
  CHECK(cg::infer(all_reduce{cg::reduce_op::sum}, {f32({3, 2})}, g4) == metas{f32({3, 2})});
  CHECK(cg::infer(all_gather_into_tensor{4}, {f32({3, 2})}, g4) == metas{f32({12, 2})});
  CHECK(cg::infer(reduce_scatter_tensor{cg::reduce_op::max, 4}, {i32({8, 2})}, g4) == metas{i32({2, 2})});
  CHECK(cg::infer(all_to_all_single{{1, 2, 3, 4}, {0, 1, 1, 1}}, {f32({3, 2})}, g4) == metas{f32({10, 2})});
  CHECK(cg::infer(broadcast{2}, {f32({3})}, g4) == metas{f32({3})});
  CHECK(cg::infer(all_reduce_coalesced{cg::reduce_op::sum}, {f32({3}), i32({2, 2})}, g4) ==
        metas{f32({3}), i32({2, 2})});
  CHECK(cg::infer(all_gather_into_tensor_coalesced{4}, {f32({1}), f32({2, 2})}, g4) == metas{f32({4}), f32({8, 2})});
  CHECK(cg::infer(reduce_scatter_tensor_coalesced{cg::reduce_op::sum, 4}, {f32({4}), f32({8, 2})}, g4) ==
        metas{f32({1}), f32({2, 2})});
  CHECK(infer_error(all_reduce{cg::reduce_op::sum}, {f32({3})}) == "all_reduce: a collective node needs a group");
  CHECK(infer_error(all_reduce{cg::reduce_op::sum}, {f32({3}), f32({3})}, g4) == "all_reduce: expects one input, got 2");
}

TEST_CASE("infer.collectives.errors_as_eager") {
  using namespace cg::ops;
  std::vector<std::string> eager(7);
  cg::threads_options o;
  o.timeout = std::chrono::seconds(30);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    if (ctx.rank() != 0) return;  // every call below fails before reaching the communicator
    auto t = [](shape_t s) { return cg::zeros<float>(std::move(s)); };
    eager[0] = error_of([&] { (void)cg::all_reduce(t({3}), "band", "0"); });
    eager[1] = error_of([&] { (void)cg::reduce_scatter_tensor(t({5, 2}), "sum", 0, "0"); });
    eager[2] = error_of([&] { (void)cg::all_to_all_single(t({5}), std::vector<i64>{1, 1}, std::vector<i64>{2, 2}, "0"); });
    eager[3] = error_of([&] { (void)cg::all_to_all_single(t({5}), std::vector<i64>{1, 1, 1}, std::vector<i64>{2, 3}, "0"); });
    eager[4] = error_of([&] { (void)cg::broadcast(t({5}), 3, std::vector<int>{0, 1}); });
    eager[5] = error_of([&] { (void)cg::reduce_scatter_tensor_coalesced(std::vector{t({4}), t({3})}, "sum", {0, 0}, "0"); });
    eager[6] = error_of([&] { (void)cg::all_reduce(cg::zeros<bool>({2}), "avg", "0"); });
  });
  CHECK(eager[0] == "all_reduce: reduce op band needs an integer or bool tensor, got f32");
  CHECK(infer_error(all_reduce{cg::reduce_op::band}, {f32({3})}, world2) == eager[0]);
  CHECK(eager[1] == "reduce_scatter_tensor: dim 0 (size 5) must be a multiple of group_size 2");
  CHECK(infer_error(reduce_scatter_tensor{cg::reduce_op::sum, 2}, {f32({5, 2})}, world2) == eager[1]);
  CHECK(infer_error(all_to_all_single{{1, 1}, {2, 2}}, {f32({5})}, world2) == eager[2]);
  CHECK(contains(eager[2], "input_split_sizes [2, 2] sum to 4 but the input's dim 0 has size 5"));
  CHECK(infer_error(all_to_all_single{{1, 1, 1}, {2, 3}}, {f32({5})}, world2) == eager[3]);
  CHECK(contains(eager[3], "output_split_sizes [1, 1, 1] has 3 entries for group_size 2"));
  CHECK(eager[4] == "broadcast: src rank 3 is not a member of group [0, 1]");
  CHECK(infer_error(broadcast{3}, {f32({5})}, world2) == eager[4]);
  CHECK(eager[5] == "reduce_scatter_tensor_coalesced: dim 0 (size 3) must be a multiple of group_size 2 for tensor at index 1");
  CHECK(infer_error(reduce_scatter_tensor_coalesced{cg::reduce_op::sum, 2}, {f32({4}), f32({3})}, world2) == eager[5]);
  CHECK(eager[6] == "all_reduce: reduce op avg is not supported for bool tensors");
  CHECK(infer_error(all_reduce{cg::reduce_op::avg}, {{cg::dtype::boolean, {2}}}, world2) == eager[6]);
  CHECK(infer_error(all_gather_into_tensor{2}, {f32({})}, world2) ==
        "all_gather_into_tensor: the input must have at least one dimension, got f32[]");
  CHECK(infer_error(all_gather_into_tensor_coalesced{2}, {f32({2}), f32({})}, world2) ==
        "all_gather_into_tensor_coalesced: the input must have at least one dimension, got f32[] for tensor at index 1");
  CHECK(infer_error(all_reduce_coalesced{cg::reduce_op::sum}, {}, world2) ==
        "all_reduce_coalesced: expects at least one input tensor");
}
