// tests/schedule/test_memory_plan.cpp: the memory planner (schedule/memory_plan.hpp) and the
// executor running over its plan (runtime/executor.hpp).
//
// The seeds (test_inductor_collectives.py): an intermediate that dies at an all_reduce is
// reduced in place (test_inductor_steal_buffer); a graph input, or a value read after the
// all_reduce, never is (test_inductor_doesnt_mutate_shared). And the properties: buffers are
// reused, the planned peak is never above the unplanned one, no two live values share a byte
// (after every scheduling pass), and running over the plan gives the same bits as running
// without it, call after call, whether the arena is reused or not; and a valid plan for a graph
// of over 20,000 nodes.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/memory_plan.hpp>
#include <ccgraph/schedule/reorder.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "support.hpp"
#include "../../examples/programs.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using cg::shape_t;

/// Position of the first node whose op is `op`.
std::size_t pos_of(const cg::graph& g, std::string_view op) {
  for (std::size_t i = 0; i < g.size(); ++i)
    if (g.nodes()[i]->op() == op) return i;
  FAIL("no node ", op);
  return 0;
}

bool plan_ok(const cg::memory_plan& p, const cg::graph& g) {
  std::string why;
  const bool ok = p.check(g, &why);
  if (!ok) MESSAGE(why, "\n", cg::to_string(g), cg::to_string(p));
  return ok;
}

// The seeds' functions.
auto steal_buffer = [](auto inp) {
  auto x = cg::eval(inp + 1.f);
  auto ar = cg::wait_tensor(cg::all_reduce(x, "sum", "0"));
  auto other = cg::eval(inp * 0.f + 23.f);
  return std::make_tuple(ar, other);
};
auto doesnt_mutate_shared = [](auto inp) {
  auto x = cg::eval(inp + 1.f);
  auto ar = cg::all_reduce(x, "sum", "0");
  auto y = cg::eval(x + 2.f);
  auto other = cg::eval(inp * 0.f + 23.f);
  return std::make_tuple(cg::wait_tensor(ar), y, other);
};

}  // namespace

TEST_CASE("memory_plan.steal.intermediate_dying_at_all_reduce") {
  auto g = cg::trace(world(2), steal_buffer, cg::input<float>({4, 4}));
  const auto p = cg::plan_memory(g);
  CHECK(plan_ok(p, g));
  const std::size_t add = pos_of(g, "pointwise"), ar = pos_of(g, "all_reduce");
  CHECK(p.num_steals() == 1);
  CHECK(p.is_stolen(ar));
  CHECK(p.buffer_at(ar) == p.buffer_at(add));
  CHECK(p.buffer_at(ar)->is_output);  // the all_reduce result is returned from x's buffer
  CHECK(contains(cg::to_string(p), "%all_reduce  in place, stolen from %add"));
  // `other` must not land on the returned buffer.
  const auto* other = p.buffer_at(pos_of(g, "pointwise") + 3);
  REQUIRE(other != nullptr);
  CHECK(other != p.buffer_at(ar));
  CHECK(p.arena_bytes == 128);
  CHECK(p.unplanned_peak_bytes == 128);
  CHECK(p.total_bytes == 192);
  // Without steals x and the all_reduce result are two buffers.
  CHECK(cg::plan_memory(g, {.steal = false}).num_steals() == 0);

  cg::run_threads(2, [&](cg::rank_context& ctx) {
    auto exe = cg::compile(g, ctx);
    REQUIRE(exe.exec().plan() != nullptr);
    for (int call = 0; call < 3; ++call) {
      auto inp = cg::full<float>({4, 4}, 1.f + float(ctx.rank()));
      auto [a, other] = exe(inp);
      CHECK(a.to_vector() == std::vector<float>(16, 5.f));  // (1+1) + (2+1)
      CHECK(other.to_vector() == std::vector<float>(16, 23.f));
      CHECK(inp.to_vector() == std::vector<float>(16, 1.f + float(ctx.rank())));
    }
    CHECK(exe.exec().arena_allocations() == 1);  // the results were dropped: reused
  }, threads_opts());
}

TEST_CASE("memory_plan.steal.never_a_graph_input") {
  auto g = cg::trace(world(2), [](auto inp) { return cg::wait_tensor(cg::all_reduce(inp, "sum", "0")); },
                     cg::input<float>({4, 4}));
  const auto p = cg::plan_memory(g);
  CHECK(plan_ok(p, g));
  CHECK(p.num_steals() == 0);
  // Nor a view of one, nor a value derived from one without a copy.
  auto v = cg::trace(world(2), [](auto inp) {
    return cg::wait_tensor(cg::all_reduce(inp.reshape({16}).contiguous(), "sum", "0"));
  }, cg::input<float>({4, 4}));
  CHECK(cg::plan_memory(v).num_steals() == 0);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    auto exe = cg::compile(g, ctx);
    auto exe_v = cg::compile(v, ctx);
    for (int call = 0; call < 2; ++call) {
      auto inp = cg::full<float>({4, 4}, 1.f + float(ctx.rank()));
      CHECK(exe(inp).to_vector() == std::vector<float>(16, 3.f));
      CHECK(exe_v(inp).to_vector() == std::vector<float>(16, 3.f));
      CHECK(inp.to_vector() == std::vector<float>(16, 1.f + float(ctx.rank())));
    }
  }, threads_opts());
}

TEST_CASE("memory_plan.steal.never_a_value_read_later") {
  auto g = cg::trace(world(2), doesnt_mutate_shared, cg::input<float>({4, 4}));
  const auto p = cg::plan_memory(g);
  CHECK(plan_ok(p, g));
  CHECK(p.num_steals() == 0);
  CHECK(p.buffer_at(pos_of(g, "all_reduce")) != p.buffer_at(pos_of(g, "pointwise")));

  // A value that is also returned, or read (asynchronously) by a collective waited later, or
  // read twice by one coalesced all_reduce, is not reduced in place either.
  auto returned = cg::trace(world(2), [](auto inp) {
    auto x = cg::eval(inp + 1.f);
    return std::make_tuple(cg::wait_tensor(cg::all_reduce(x, "sum", "0")), x);
  }, cg::input<float>({4, 4}));
  CHECK(cg::plan_memory(returned).num_steals() == 0);
  auto gathered = cg::trace(world(2), [](auto inp) {
    auto x = cg::eval(inp + 1.f);
    auto ag = cg::all_gather_tensor(x, 0, "0");
    auto ar = cg::all_reduce(x, "sum", "0");
    return std::make_tuple(cg::eval(ar * 2.f), cg::eval(ag * 2.f));
  }, cg::input<float>({4, 4}));
  // As traced, the all_gather is waited before the all_reduce is issued: x may be stolen.
  CHECK(cg::plan_memory(gathered).num_steals() == 1);
  auto sunk = gathered;
  cg::sink_waits(sunk);  // now the all_gather may still be reading x when the all_reduce runs
  const cg::node* ag = sunk.nodes()[pos_of(sunk, "all_gather_into_tensor")];
  REQUIRE(ag->users().size() == 1);
  CHECK(sunk.position(ag->users()[0]) > pos_of(sunk, "all_reduce"));
  CHECK(cg::plan_memory(sunk).num_steals() == 0);
  auto twice = cg::trace(world(2), [](auto inp) {
    auto x = cg::eval(inp + 1.f);
    auto outs = cg::all_reduce_coalesced(std::vector{x, x}, "sum", "0");
    return cg::eval(outs[0] + outs[1]);
  }, cg::input<float>({4, 4}));
  CHECK(cg::plan_memory(twice).num_steals() == 0);
  // One coalesced all_reduce reduces in place per input: x dies there, the graph input does not.
  auto coalesced = cg::trace(world(2), [](auto inp) {
    auto x = cg::eval(inp + 1.f);
    auto outs = cg::all_reduce_coalesced(std::vector{x, inp}, "sum", "0");
    return cg::eval(outs[0] - outs[1]);
  }, cg::input<float>({4, 4}));
  const auto pc = cg::plan_memory(coalesced);
  CHECK(plan_ok(pc, coalesced));
  CHECK(pc.num_steals() == 1);
  CHECK(pc.is_stolen(pos_of(coalesced, "all_reduce_coalesced"), 0));
  CHECK(!pc.is_stolen(pos_of(coalesced, "all_reduce_coalesced"), 1));

  cg::run_threads(2, [&](cg::rank_context& ctx) {
    auto exe = cg::compile(g, ctx);
    auto exe_c = cg::compile(coalesced, ctx);
    auto exe_g = cg::compile(gathered, ctx);
    auto exe_s = cg::compile(sunk, ctx);
    for (int call = 0; call < 2; ++call) {
      auto inp = cg::full<float>({4, 4}, 1.f + float(ctx.rank()));
      auto [a, y, other] = exe(inp);
      CHECK(a.to_vector() == std::vector<float>(16, 5.f));
      CHECK(y.to_vector() == std::vector<float>(16, 4.f + float(ctx.rank())));  // x + 2, x unmutated
      CHECK(other.to_vector() == std::vector<float>(16, 23.f));
      CHECK(exe_c(inp).to_vector() == std::vector<float>(16, 2.f));  // (2 + 3) - (1 + 2)
      for (auto* e : {&exe_g, &exe_s}) {
        auto [r, ag] = (*e)(inp);
        CHECK(r.to_vector() == std::vector<float>(16, 10.f));
        CHECK(ag.to_vector()[0] == 4.f);
        CHECK(ag.to_vector()[31] == 6.f);
      }
      CHECK(inp.to_vector() == std::vector<float>(16, 1.f + float(ctx.rank())));
    }
  }, threads_opts());
}

TEST_CASE("memory_plan.cat.inputs_computed_into_their_slices") {
  // A decomposed matmul's pattern: row chunks, each all_reduced (in place) and joined by a cat.
  // The chunks and their all_reduces are computed into the cat's slices; the cat copies nothing.
  auto f = [](auto x, auto w) {
    using V = decltype(x);
    std::vector<V> parts;
    for (int i = 0; i < 3; ++i)
      parts.push_back(V(cg::wait_tensor(cg::all_reduce(cg::matmul(x.narrow(0, 4 * i, 4), w), "sum", "0"))));
    return cg::eval(cg::cat(parts, 0) * 2.f);
  };
  auto g = cg::trace(world(2), f, cg::input<float>({12, 8}), cg::input<float>({8, 16}));
  const auto p = cg::plan_memory(g);
  REQUIRE(plan_ok(p, g));
  REQUIRE(p.elided_cats.size() == 1);
  const std::size_t cat = pos_of(g, "cat");
  CHECK(p.elided_cats[0].position == cat);
  CHECK(p.elided_cats[0].slices == std::vector<std::int64_t>{0, 256, 512});
  CHECK(p.elided_at(cat) == &p.elided_cats[0]);
  CHECK(p.elided_at(cat + 1) == nullptr);
  CHECK(p.num_steals() == 3);  // each all_reduce in its matmul's slice
  const cg::planned_buffer* whole = p.buffer_at(cat);
  REQUIRE(whole != nullptr);
  std::size_t inside = 0;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (g.nodes()[i]->op() == "matmul") {
      const cg::planned_buffer* b = p.buffer_at(i);
      REQUIRE(b != nullptr);
      CHECK(b->parent == static_cast<int>(whole - p.buffers.data()));
      CHECK(b->offset == whole->offset + b->offset_in_parent);
      CHECK(b->offset_in_parent == 256 * static_cast<std::int64_t>(inside++));
      CHECK(p.buffer_at(i + 1) == b);  // the all_reduce reduces in place into its slice
    }
  CHECK(inside == 3);
  CHECK(whole->first < cat);  // live from the first chunk's write
  CHECK(contains(cg::to_string(p), "1 elided cat"));
  CHECK(contains(cg::to_string(p), " at +256"));
  // Without elision the chunks need their own bytes beside the cat's.
  const auto apart = cg::plan_memory(g, {.elide_cats = false});
  CHECK(plan_ok(apart, g));
  CHECK(apart.elided_cats.empty());
  CHECK(p.arena_bytes <= apart.arena_bytes);

  cg::run_threads(2, [&](cg::rank_context& ctx) {
    auto plain = cg::compile(g, ctx, {.memory_plan = false});
    auto planned = cg::compile(g, ctx);
    REQUIRE(planned.exec().plan() != nullptr);
    CHECK(planned.exec().plan()->elided_cats.size() == 1);
    for (int call = 0; call < 3; ++call) {
      const auto x = cg::uniform<float>({12, 8}, -1, 1, 5 + static_cast<std::uint64_t>(ctx.rank() + 2 * call));
      const auto w = cg::uniform<float>({8, 16}, -1, 1, 40 + static_cast<std::uint64_t>(call));
      CHECK(planned(x, w).to_vector() == plain(x, w).to_vector());
    }
  }, threads_opts());
}

TEST_CASE("memory_plan.cat.kept_when_its_inputs_cannot_move") {
  auto elided = [](auto f, auto... in) {
    auto g = cg::trace(world(2), f, in...);
    const auto p = cg::plan_memory(g);
    CHECK(plan_ok(p, g));
    return p.elided_cats.size();
  };
  const auto a = cg::input<float>({4, 16}), b = cg::input<float>({4, 16});
  // The baseline: two computed blocks of whole 64-byte multiples.
  CHECK(elided([](auto x, auto y) { return cg::eval(cg::cat({cg::eval(x + 1.f), cg::eval(y + 1.f)}, 0) * 2.f); }, a, b) == 1);
  // An input read after the cat keeps its own bytes (and the cat its copy).
  CHECK(elided([](auto x, auto y) {
    auto u = cg::eval(x + 1.f);
    auto joined = cg::eval(cg::cat({u, cg::eval(y + 1.f)}, 0) * 2.f);
    auto later = cg::eval(u * 3.f);  // traced after the cat
    return std::make_tuple(joined, later);
  }, a, b) == 0);
  // A graph input is the caller's memory.
  CHECK(elided([](auto x, auto y) { return cg::eval(cg::cat({x, cg::eval(y + 1.f)}, 0) * 2.f); }, a, b) == 0);
  // A view of part of a value is not its buffer.
  CHECK(elided([](auto x, auto y) {
    auto u = cg::eval(x + 1.f);
    return cg::eval(cg::cat({u.narrow(0, 0, 2), cg::eval(y + 1.f)}, 0) * 2.f);
  }, a, b) == 0);
  // The same value twice would need two places.
  CHECK(elided([](auto x, auto) {
    auto u = cg::eval(x + 1.f);
    return cg::eval(cg::cat({u, u}, 0) * 2.f);
  }, a, b) == 0);
  // Along an inner dim the inputs interleave in the output.
  CHECK(elided([](auto x, auto y) { return cg::eval(cg::cat({cg::eval(x + 1.f), cg::eval(y + 1.f)}, 1) * 2.f); }, a, b) == 0);
  // ... unless every dim before it has one element.
  CHECK(elided([](auto x, auto y) {
    return cg::eval(cg::cat({cg::eval(x + 1.f).reshape({1, 4, 16}).contiguous(), cg::eval(y + 1.f).reshape({1, 4, 16}).contiguous()}, 1) * 2.f);
  }, a, b) == 1);
  // A slice that would start inside a 64-byte block (3 floats of 4 bytes).
  CHECK(elided([](auto x, auto y) { return cg::eval(cg::cat({cg::eval(x + 1.f), cg::eval(y + 1.f)}, 0) * 2.f); },
               cg::input<float>({1, 3}), cg::input<float>({1, 3})) == 0);
  // A cat of an elided cat nests: the inner one lies in the outer's buffer.
  auto nested = cg::trace(world(2), [](auto x, auto y) {
    auto inner = cg::cat({cg::eval(x + 1.f), cg::eval(y + 1.f)}, 0);
    return cg::eval(cg::cat({inner, cg::eval(x * 3.f)}, 0) * 2.f);
  }, a, b);
  const auto np = cg::plan_memory(nested);
  CHECK(plan_ok(np, nested));
  CHECK(np.elided_cats.size() == 2);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    const auto x = cg::uniform<float>({4, 16}, -1, 1, 3), y = cg::uniform<float>({4, 16}, -1, 1, 4);
    CHECK(cg::compile(nested, ctx)(x, y).to_vector() == cg::compile(nested, ctx, {.memory_plan = false})(x, y).to_vector());
  }, threads_opts());
}

TEST_CASE("memory_plan.cat.check_refuses_a_wrong_layout") {
  auto g = cg::trace(world(2), [](auto x, auto y) {
    return cg::eval(cg::cat({cg::eval(x + 1.f), cg::eval(y + 1.f)}, 0) * 2.f);
  }, cg::input<float>({4, 16}), cg::input<float>({4, 16}));
  auto p = cg::plan_memory(g);
  REQUIRE(p.elided_cats.size() == 1);
  std::string why;
  auto swapped = p;
  std::swap(swapped.elided_cats[0].slices[0], swapped.elided_cats[0].slices[1]);
  CHECK_FALSE(swapped.check(g, &why));
  CHECK(contains(why, "is elided but its input 0"));
  auto moved = p;
  for (auto& b : moved.buffers)
    if (b.parent >= 0) b.offset += 64;
  CHECK_FALSE(moved.check(g, &why));
  CHECK(contains(why, "is not inside its parent buffer"));
  auto orphan = p;
  orphan.elided_cats.clear();
  CHECK_FALSE(orphan.check(g, &why));
  CHECK(contains(why, "but no elided cat reads it"));
}

TEST_CASE("executor.laid_out_in") {
  auto arena = cg::detail::storage::allocate(cg::device::cpu(), 1024);
  const cg::tensor_meta whole{cg::dtype::f32, {8, 4}}, half{cg::dtype::f32, {4, 4}};
  const auto out = cg::detail::arena_tensor(arena, whole, 128);
  const auto a = cg::detail::arena_tensor(arena, half, 128), b = cg::detail::arena_tensor(arena, half, 192);
  CHECK(cg::detail::laid_out_in(out, {a, b}, {0, 64}));
  CHECK_FALSE(cg::detail::laid_out_in(out, {b, a}, {0, 64}));
  CHECK_FALSE(cg::detail::laid_out_in(out, {a}, {0, 64}));
  // Elsewhere (another storage) or strided: the cat must run.
  const auto other = cg::detail::arena_tensor(cg::detail::storage::allocate(cg::device::cpu(), 1024), half, 192);
  CHECK_FALSE(cg::detail::laid_out_in(out, {a, other}, {0, 64}));
  const cg::tensor<float> t = std::get<cg::tensor<float>>(b);
  CHECK_FALSE(cg::detail::laid_out_in(out, {a, cg::any_tensor(t.transpose(0, 1))}, {0, 64}));
}

TEST_CASE("memory_plan.reuse.pointwise_chain") {
  auto g = cg::trace(world(1), [](auto a) {
    auto x = cg::eval(a + 1.f);
    for (int i = 0; i < 6; ++i) x = cg::eval(cg::relu(x) * 2.f);
    return x;
  }, cg::input<float>({16, 16}));
  const auto p = cg::plan_memory(g);
  CHECK(plan_ok(p, g));
  CHECK(p.buffers.size() == 7);
  CHECK(p.total_bytes == 7 * 1024);
  CHECK(p.arena_bytes == 2 * 1024);  // ping-pong: each step reads one buffer and writes the other
  CHECK(p.unplanned_peak_bytes == 2 * 1024);
  CHECK(p.arena_bytes < p.total_bytes);
  cg::run_threads(1, [&](cg::rank_context& ctx) {
    auto exe = cg::compile(g, ctx);
    for (int call = 0; call < 2; ++call)
      CHECK(exe(cg::full<float>({16, 16}, 1.f)).to_vector() == std::vector<float>(256, 128.f));
  }, threads_opts());
}

TEST_CASE("memory_plan.lifetime.collective_input_until_its_wait") {
  // x feeds an all_gather whose wait comes after a matmul: x is read by the communication
  // worker until the wait, so the matmul's output must not take x's bytes, though the matmul
  // does not read x.
  auto g = cg::trace(world(2), [](auto a, auto b) {
    auto x = cg::eval(a + 1.f);
    auto ag = cg::all_gather_tensor(x, 0, "0");
    auto m = cg::matmul(b, b);
    return cg::eval(ag.narrow(0, 0, 4) + m);
  }, cg::input<float>({4, 4}), cg::input<float>({4, 4}));
  cg::sink_waits(g);
  const std::size_t wait = pos_of(g, "wait_tensor"), mm = pos_of(g, "matmul");
  REQUIRE(mm < wait);
  const auto p = cg::plan_memory(g);
  CHECK(plan_ok(p, g));
  const auto* x = p.buffer_at(pos_of(g, "pointwise"));
  REQUIRE(x != nullptr);
  CHECK(x->last == wait);
  CHECK(p.buffer_at(mm)->offset != x->offset);
  CHECK(p.buffer_at(pos_of(g, "all_gather_into_tensor"))->first == pos_of(g, "all_gather_into_tensor"));

  // check() catches a plan that puts two live buffers on the same bytes.
  auto bad = p;
  bad.buffers[static_cast<std::size_t>(bad.buffer_of[mm][0])].offset = x->offset;
  std::string why;
  CHECK_FALSE(bad.check(g, &why));
  CHECK(contains(why, "overlap"));
  // ... and one whose interval ends before a reader.
  auto short_lived = p;
  short_lived.buffers[static_cast<std::size_t>(short_lived.buffer_of[pos_of(g, "pointwise")][0])].last = mm;
  CHECK_FALSE(short_lived.check(g, &why));
  CHECK(contains(why, "all_gather_into_tensor"));
}

TEST_CASE("memory_plan.views_and_copies") {
  // A transposed view extends its base's life; reshape/contiguous of a non-contiguous
  // intermediate copy into buffers of their own; of a graph input they are not planned.
  auto g = cg::trace(world(1), [](auto a) {
    auto x = cg::eval(a * 2.f);
    auto t = x.transpose(0, 1);
    auto r = t.reshape({16});           // copies
    auto c = t.contiguous();            // copies
    auto f = x.reshape({4, 4}).flatten();  // views
    auto ia = a.transpose(0, 1).contiguous();  // the caller's: not planned
    return std::make_tuple(cg::eval(r + f), c, ia, cg::eval(cg::cat({c, ia}, 1).narrow(1, 2, 4) * 1.f));
  }, cg::input<float>({4, 4}));
  const auto p = cg::plan_memory(g);
  CHECK(plan_ok(p, g));
  int reshape_copies = 0, contiguous_copies = 0, unplanned_contiguous = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto op = g.nodes()[i]->op();
    if (op == "reshape" && p.buffer_at(i)) ++reshape_copies;
    if (op == "contiguous") (p.buffer_at(i) ? contiguous_copies : unplanned_contiguous)++;
    if (op == "transpose") CHECK(p.buffer_at(i) == nullptr);
  }
  CHECK(reshape_copies == 1);
  CHECK(contiguous_copies == 1);
  CHECK(unplanned_contiguous == 1);
  cg::run_threads(1, [&](cg::rank_context& ctx) {
    auto planned = cg::compile(g, ctx);
    auto plain = cg::compile(g, ctx, {.memory_plan = false});
    CHECK(plain.exec().plan() == nullptr);
    auto a = cg::arange<float>(16).reshape({4, 4});
    for (int call = 0; call < 2; ++call) {
      auto x = planned(a);
      auto y = plain(a);
      CHECK(std::get<0>(x).to_vector() == std::get<0>(y).to_vector());
      CHECK(std::get<1>(x).to_vector() == std::get<1>(y).to_vector());
      CHECK(std::get<2>(x).to_vector() == std::get<2>(y).to_vector());
      CHECK(std::get<3>(x).to_vector() == std::get<3>(y).to_vector());
    }
  }, threads_opts());
}

// ---------------------------------------------------------------------------------------------
// The properties, on random traced graphs after every scheduling pass
// ---------------------------------------------------------------------------------------------

namespace {

/// A random program over 8x8 floats: pointwise chains, matmuls, views and copies, and
/// collectives over the world, their inputs often fresh values that die there (steals).
template <class V>
std::vector<V> random_program(std::uint64_t seed, const V& a, const V& b) {
  std::mt19937_64 rng(seed);
  std::vector<V> pool{a, b};
  auto pick = [&] { return pool[pool.size() - 1 - rng() % std::min<std::size_t>(pool.size(), 4)]; };
  const int steps = 6 + static_cast<int>(rng() % 10);
  for (int s = 0; s < steps; ++s) {
    const V x = pick(), y = pick();
    switch (rng() % 11) {
      case 0: pool.push_back(cg::eval(cg::tanh(x) + y * 0.5f)); break;
      case 1: pool.push_back(cg::eval(cg::relu(x) - cg::sigmoid(y))); break;
      case 2: pool.push_back(cg::eval(cg::matmul(rng() % 2 ? x : x.transpose(0, 1), y) * 0.125f)); break;
      case 3: pool.push_back(cg::matmul(x, y.transpose(0, 1))); break;
      case 4:
        switch (rng() % 4) {
          case 0: pool.push_back(x.transpose(0, 1)); break;
          case 1: pool.push_back(x.transpose(0, 1).reshape({64}).reshape({8, 8})); break;
          case 2: pool.push_back(x.transpose(0, 1).contiguous()); break;
          default: pool.push_back(x.narrow(1, 4, 4).repeat({1, 2})); break;
        }
        break;
      case 5: pool.push_back(cg::cat({x.narrow(0, 0, 4), y.narrow(0, 4, 4)}, 0)); break;
      case 6: {  // all_reduce of a fresh value (stealable) or of a pool value
        const V in = rng() % 2 ? V(cg::eval(x * 0.5f)) : x;
        pool.push_back(cg::all_reduce(in, rng() % 2 ? "sum" : "max", "0"));
        break;
      }
      case 7: {
        auto outs = cg::all_reduce_coalesced(std::vector<V>{cg::eval(x + 1.f), y}, "avg", "0");
        pool.push_back(outs[0]);
        pool.push_back(outs[1]);
        break;
      }
      case 8: pool.push_back(cg::all_gather_tensor(x, static_cast<std::int64_t>(rng() % 2), "0").narrow(0, 0, 8).narrow(1, 0, 8)); break;
      case 9: pool.push_back(cg::reduce_scatter_tensor(x, "sum", 0, "0").repeat({2, 1})); break;
      default: pool.push_back(cg::all_to_all_single(cg::eval(x - y), std::nullopt, std::nullopt, "0")); break;
    }
  }
  std::vector<V> out{pool.back()};
  if (rng() % 2) out.push_back(pool[pool.size() / 2]);
  if (rng() % 4 == 0) out.push_back(a);
  return out;
}

const std::vector<std::string> pass_names = {"none", "sink_waits", "raise_comms", "reorder_compute_for_overlap",
                                             "overlap"};

double estimate(const cg::node& n) {
  if (n.is_collective()) return 20.0;
  if (n.op() == "matmul") return 8.0;
  if (n.is_wait() || n.is_view()) return 0.0;
  return 2.0;
}

void run_pass(cg::graph& g, const std::string& pass) {
  if (pass == "sink_waits") cg::sink_waits(g);
  else if (pass == "raise_comms") cg::raise_comms(g);
  else if (pass == "reorder_compute_for_overlap") cg::reorder_compute_for_overlap(g, estimate);
  else if (pass == "overlap") cg::overlap(g, estimate);
  cg::lint(g);
}

auto traced(std::uint64_t seed, cg::trace_options opt) {
  return cg::trace(opt, [seed](auto a, auto b) { return random_program(seed, a, b); }, cg::input<float>({8, 8}),
                   cg::input<float>({8, 8}));
}

std::vector<std::vector<float>> values(const std::vector<cg::tensor<float>>& ts) {
  std::vector<std::vector<float>> v;
  for (auto& t : ts) v.push_back(t.to_vector());
  return v;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

}  // namespace

TEST_CASE("memory_plan.random.no_two_live_values_share_bytes") {
  std::size_t steals = 0, reused = 0;
  for (std::uint64_t seed = 0; seed < 150; ++seed)
    for (const auto& pass : pass_names) {
      CAPTURE(seed);
      CAPTURE(pass);
      auto g = traced(seed, world(2));
      run_pass(g, pass);
      const auto p = cg::plan_memory(g);
      REQUIRE(plan_ok(p, g));
      CHECK(p.arena_bytes <= p.unplanned_peak_bytes);
      if (p.arena_bytes > p.unplanned_peak_bytes) MESSAGE(cg::to_string(p));
      CHECK(p.live_peak_bytes <= p.arena_bytes);
      CHECK(p.unplanned_peak_bytes <= p.total_bytes);
      steals += p.num_steals();
      reused += p.arena_bytes < p.total_bytes;
    }
  CHECK(steals > 50);   // the generator does exercise in-place all_reduce
  CHECK(reused > 500);  // and reuse
}

TEST_CASE("memory_plan.random.planned_execution_is_bitwise_unplanned") {
  // Two ranks; each call of the planned graph must give the bits of the unplanned one, whether
  // the arena is reused (call 2: the results of call 1 were dropped) or is still referred to by
  // results held by the caller (call 3 runs while call 2's results are kept, and must not
  // change them).
  for (std::uint64_t seed = 0; seed < 16; ++seed)
    for (const auto& pass : pass_names) {
      CAPTURE(seed);
      CAPTURE(pass);
      cg::run_threads(2, [&](cg::rank_context& ctx) {
        auto g = traced(seed, cg::trace_options{});
        run_pass(g, pass);
        auto plain = cg::compile(g, ctx, {.memory_plan = false});
        auto planned = cg::compile(g, ctx);
        auto in_a = cg::uniform<float>({8, 8}, -1, 1, 100 + seed * 7 + static_cast<std::uint64_t>(ctx.rank()));
        auto in_b = cg::uniform<float>({8, 8}, -1, 1, 900 + seed * 7 + static_cast<std::uint64_t>(ctx.rank()));
        const auto a_before = in_a.to_vector(), b_before = in_b.to_vector();
        const auto expected = values(plain(in_a, in_b));
        CHECK(same_bits(values(planned(in_a, in_b)), expected));
        auto held = planned(in_a, in_b);
        CHECK(same_bits(values(held), expected));
        CHECK(same_bits(values(planned(in_a, in_b)), expected));
        CHECK(same_bits(values(held), expected));
        CHECK(planned.exec().arena_allocations() <= 2);  // 2 when a result lives in the arena
        CHECK(in_a.to_vector() == a_before);
        CHECK(in_b.to_vector() == b_before);
      }, threads_opts());
    }
}

TEST_CASE("memory_plan.large_graph.valid_plan") {
  // Packing finds each buffer's neighbours in time through an interval index, and check() too
  // (no pass over all pairs): a graph of over 20,000 nodes, scheduled by `overlap`, still gets a
  // valid plan that reuses memory and reduces in place.
  auto g = cg::trace(world(2), [](auto a) {
    auto h = a;
    for (int i = 0; i < 5000; ++i) {
      auto z = cg::eval(cg::relu(cg::matmul(h, a)) * 0.5f + h);
      if (i % 2 == 0) z = cg::all_reduce(cg::eval(z * 0.5f), "sum", "0");  // its input dies there
      h = i % 3 == 0 ? z.transpose(0, 1).contiguous() : z;
    }
    return h;
  }, cg::input<float>({8, 8}));
  REQUIRE(g.size() >= 20000);
  cg::overlap(g, estimate);
  const auto p = cg::plan_memory(g);
  CHECK(p.check(g));
  CHECK(p.num_steals() > 1000);
  CHECK(p.live_peak_bytes <= p.arena_bytes);
  CHECK(p.arena_bytes <= p.unplanned_peak_bytes);
  CHECK(p.arena_bytes < p.total_bytes / 100);
}

TEST_CASE("memory_plan.sweep.equals_pack_in_start_order") {
  // The sweep that plans graphs with thousands of buffers live at once gives exactly what the
  // general packer gives for the same order with best fit (forward: by first position, larger
  // first; backward: by last position from the end), on random intervals.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t m = 1 + rng() % 60, positions = 1 + rng() % 80;
    std::vector<cg::detail::pack_item> items;
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t first = rng() % positions;
      const std::size_t last = std::min(positions - 1, first + rng() % 30);
      const std::int64_t bytes = (rng() % 7 == 0 ? 0 : 1 + static_cast<std::int64_t>(rng() % 6)) * 64;
      items.push_back({bytes, first, last});
    }
    const cg::detail::interval_index index(items);
    for (bool backward : {false, true}) {
      std::vector<std::size_t> order(m);
      for (std::size_t i = 0; i < m; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        const auto sa = backward ? positions - items[a].last : items[a].first;
        const auto sb = backward ? positions - items[b].last : items[b].first;
        if (sa != sb) return sa < sb;
        return items[a].bytes > items[b].bytes;
      });
      const auto want = cg::detail::pack(items, index, order, true, 64);
      const auto got = cg::detail::pack_sweep(items, backward, 64);
      CAPTURE(trial);
      CAPTURE(backward);
      CHECK(got.second == want.second);
      CHECK(got.first == want.first);
    }
  }
}

namespace {

/// `width` all_reduced matmul results, all live until a sum reaches them (bench_schedule's
/// table of graphs with many values live at once).
auto wide_sum(int width) {
  return [width](auto x) {
    std::vector<decltype(cg::wait_tensor(cg::all_reduce(x, "sum", "0")))> rs;
    for (int i = 0; i < width; ++i)
      rs.push_back(cg::wait_tensor(cg::all_reduce(cg::eval(cg::matmul(x, x) * float(i + 1)), "sum", "0")));
    auto acc = rs.front();
    for (int i = 1; i < width; ++i) acc = cg::eval(acc + rs[static_cast<std::size_t>(i)]);
    return acc;
  };
}

}  // namespace

TEST_CASE("memory_plan.large_graph.thousands_live_at_once") {
  // 4,000 values live at once (and, bucketed, one all_reduce_coalesced of 4,000 inputs, each
  // reduced in place): past the packer's budget, planned by the sweep, still valid and at the
  // live peak; the unbucketed graph also runs over its plan with eager's bits.
  const auto g = cg::trace(world(2), wide_sum(4000), cg::input<float>({8, 8}));
  REQUIRE(g.size() >= 20000);
  for (bool bucketed : {false, true}) {
    CAPTURE(bucketed);
    auto s = g;
    if (bucketed) cg::bucket_collectives(s, std::int64_t{1} << 30, nullptr);
    CHECK(s.count("all_reduce_coalesced") == (bucketed ? 1 : 0));
    const auto p = cg::plan_memory(s);
    REQUIRE(plan_ok(p, s));
    CHECK(p.num_steals() == 4000);
    CHECK(p.arena_bytes == p.live_peak_bytes);
    CHECK(p.live_peak_bytes >= 4000 * 256);
  }
  const auto small = cg::trace(world(2), wide_sum(300), cg::input<float>({8, 8}));
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    const auto x = cg::uniform<float>({8, 8}, -1, 1, 5 + static_cast<std::uint64_t>(ctx.rank()));
    CHECK(cg::compile(small, ctx)(x).to_vector() == cg::compile(small, ctx, {.memory_plan = false})(x).to_vector());
  }, threads_opts());
}

TEST_CASE("memory_plan.benchmark_graphs.arena_at_live_peak") {
  // bench_schedule's graphs, as traced and after the passes it times: the planner before the
  // sweep (commit 0d13b47) packed every one of them into its live peak, the lower bound; so
  // does this one, whichever way it packs (the wide ones go past the packer's budget).
  const cg::trace_options two = world(2);
  const cg::group pair{std::vector<int>{0, 1}};
  auto layered = [&](int layers) {
    return [layers, pair](auto x) {
      auto h = x;
      for (int i = 0; i < layers; ++i) {
        auto y = cg::matmul(h, x);
        auto z = cg::eval(cg::relu(y) * 0.5f + h);
        if (i % 2 == 0) z = cg::all_reduce(z, "sum", pair);
        h = z.reshape({-1}).reshape(z.shape());
      }
      return h;
    };
  };
  const std::vector<cg::graph> graphs = {
      cg::trace(two, layered(200), cg::input<float>({8, 8})),
      cg::trace(two, layered(2000), cg::input<float>({8, 8})),
      cg::trace(two, cg::examples::seed_program(pair), cg::input<cg::bf16>({4096, 4096})),
      cg::trace(two, cg::examples::tp_mlp(pair), cg::input<cg::bf16>({8192, 8192}), cg::input<cg::bf16>({8192, 8192}),
                cg::input<cg::bf16>({8192, 8192})),
      cg::trace(two, wide_sum(200), cg::input<float>({8, 8})),
      cg::trace(two, wide_sum(2000), cg::input<float>({8, 8}))};
  for (std::size_t k = 0; k < graphs.size(); ++k)
    for (const char* pass : {"", "overlap", "sink_waits", "bucket_collectives"}) {
      CAPTURE(k);
      CAPTURE(pass);
      const cg::graph s = *pass ? cg::schedule(graphs[k], {pass}) : graphs[k];
      const auto p = cg::plan_memory(s);
      CHECK(plan_ok(p, s));
      CHECK(p.arena_bytes == p.live_peak_bytes);
    }
}

namespace memory_plan_update_test {

/// The position of the node computing result k of `g`.
inline std::size_t result_pos(const cg::graph& g, std::size_t k) { return g.position(g.output_node()->args().at(k).src); }

}  // namespace memory_plan_update_test

TEST_CASE("memory_plan.update_inputs.written_into_the_input_after_every_old_read") {
  using memory_plan_update_test::result_pos;
  // p's new value is one pointwise node after every other read of the old p: written into p.
  // q's is read-after: q + 1 comes before sum(q). r's node reads a transposed view of r (another
  // element than the one it writes). s's old value is returned too (the output node reads it
  // to the end). u's update reads a view of u taken before and read after it. A view of w's
  // new value is returned too (it would hand out w's memory).
  auto g = cg::trace([](auto p, auto q, auto r, auto s, auto u, auto w) {
    using V = decltype(p);
    const V ps = cg::sum(p);
    const V pn = p * 0.5f + 1.f;
    const V qn = q + 1.f;
    const V qs = cg::sum(q);
    const V rn = r + r.transpose(0, 1);
    const V sn = s * 2.f;
    const auto uv = u.reshape({4});
    const V un = u - 1.f;
    const V us = cg::sum(uv);
    const V wn = w * 3.f;
    return std::vector<V>{pn, qn, rn, sn, un, wn, ps, qs, s, us, wn.reshape({4})};
  }, cg::input<float>({2, 2}), cg::input<float>({2, 2}), cg::input<float>({2, 2}), cg::input<float>({2, 2}),
     cg::input<float>({2, 2}), cg::input<float>({2, 2}));
  const std::vector<cg::input_update> updates = cg::update_inputs_range(0, 0, 6);
  const auto p = cg::plan_memory(g, {.update_inputs = updates});
  CHECK(plan_ok(p, g));
  REQUIRE(p.updates_in_place.size() == 1);
  CHECK(p.updates_in_place[0].update == cg::input_update{0, 0});
  CHECK(p.updates_in_place[0].value.position == result_pos(g, 0));
  CHECK(p.buffer_at(result_pos(g, 0)) == nullptr);  // p's memory, no buffer of its own
  REQUIRE(p.input_written_at(result_pos(g, 0)) != nullptr);
  CHECK(p.input_written_at(result_pos(g, 0))->input == 0);
  for (std::size_t k = 1; k < 6; ++k) {
    INFO("result ", k);
    CHECK(p.buffer_at(result_pos(g, k)) != nullptr);
    CHECK(p.input_written_at(result_pos(g, k)) == nullptr);
  }
  CHECK(contains(cg::to_string(p), "written into input 0 (result 0)"));
  // Without update_inputs the same value has a buffer, and the arena is larger by it.
  const auto plain = cg::plan_memory(g);
  CHECK(plan_ok(plain, g));
  CHECK(plain.updates_in_place.empty());
  CHECK(plain.buffer_at(result_pos(g, 0)) != nullptr);
  CHECK(plain.total_bytes == p.total_bytes + 64);
  // The rule, update by update.
  const cg::detail::liveness_info live(g);
  const auto sites = cg::detail::in_place_update_sites(g, live, updates);
  CHECK(sites == std::vector<std::size_t>{result_pos(g, 0), g.size(), g.size(), g.size(), g.size(), g.size()});
  // check() refuses a plan that writes q's new value into q while sum(q) still reads the old q.
  auto bad = p;
  bad.updates_in_place.push_back({{result_pos(g, 1), 0, "%qn"}, {1, 1}});
  std::string why;
  CHECK_FALSE(bad.check(g, &why));
  CHECK(contains(why, "is written into input 1 (result 1)"));

  // Run: every old-value reader sees the old value, memory plan on or off, bit for bit.
  for (const bool planned : {true, false})
    ccgraph_test::run(1, [&](cg::rank_context& ctx) {
      INFO("memory_plan ", planned);
      auto step = cg::compile(g, ctx, {.memory_plan = planned, .update_inputs = updates});
      CHECK(step.exec().update_in_place(0));
      for (std::size_t k = 1; k < 6; ++k) CHECK_FALSE(step.exec().update_in_place(k));
      std::vector<cg::tensor<float>> in;
      for (int i = 0; i < 6; ++i) in.push_back(cg::tensor<float>::from({1.f + i, 2.f, 3.f, 4.f - i}, {2, 2}));
      const auto out = step(in[0], in[1], in[2], in[3], in[4], in[5]);
      CHECK(in[0].to_vector() == std::vector<float>{1.5f, 2, 2.5f, 3});
      CHECK(in[1].to_vector() == std::vector<float>{3, 3, 4, 4});
      CHECK(in[2].to_vector() == std::vector<float>{6, 5, 5, 4});
      CHECK(in[3].to_vector() == std::vector<float>{8, 4, 6, 2});
      CHECK(in[4].to_vector() == std::vector<float>{4, 1, 2, -1});
      CHECK(in[5].to_vector() == std::vector<float>{18, 6, 9, -3});
      CHECK(out[6].to_vector() == std::vector<float>{10});  // old p
      CHECK(out[7].to_vector() == std::vector<float>{10});  // old q
      CHECK(out[9].to_vector() == std::vector<float>{10});  // old u, through its view
      CHECK(out[10].to_vector() == std::vector<float>{18, 6, 9, -3});
    });
}
