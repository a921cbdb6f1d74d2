// tests/runtime/test_executor.cpp: what the graph runner (ccgraph/runtime/executor.hpp) tells a
// backend about each collective it launches, and what a profiled call measures.
#include <doctest/doctest.h>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "../../examples/programs.hpp"
#include "support.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

namespace cg = ccgraph;

namespace {

using hint = cg::detail::overlap_hint;

/// The collectives of `g` in order, each with what runs beside it.
std::vector<hint> overlaps(const cg::graph& g) {
  const auto all = cg::detail::collective_overlaps(g);
  std::vector<hint> out;
  for (std::size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i]->is_collective()) out.push_back(all[i]);
  return out;
}

}  // namespace

TEST_CASE("executor.collective_overlaps.follow_the_schedule") {
  const cg::group world = std::vector<int>{0, 1};
  // The seeds' reorder program: traced, each collective is followed by its wait, so nothing
  // runs beside it; scheduled, matmuls move between the collectives and their waits.
  auto g = cg::trace(cg::examples::seed_program(world), cg::input<float>({8, 8}));
  CHECK(overlaps(g) == std::vector<hint>{hint::none, hint::none});
  const auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
  const auto h = overlaps(s);
  REQUIRE(h.size() == 2);
  CHECK(h[0] == hint::matmul);  // the first all_reduce's wait sinks below the matmuls that do not need it
  // Only pointwise compute between a collective and its wait is no matmul to overlap.
  auto pointwise_only = cg::trace(
      [&](auto a) {
        auto ar = cg::all_reduce(a, "sum", world);
        auto b = cg::eval(cg::relu(a) + 1.f);
        return cg::eval(cg::wait_tensor(ar) + b);
      },
      cg::input<float>({8, 8}));
  CHECK(overlaps(cg::schedule(pointwise_only, {"sink_waits"})) == std::vector<hint>{hint::compute});
  // Collectives issued back to back before their waits overlap nothing but each other.
  auto two = cg::trace(
      [&](auto a) {
        auto x = cg::all_reduce(a, "sum", world);
        auto y = cg::all_reduce(a, "max", world);
        return cg::eval(cg::wait_tensor(x) + cg::wait_tensor(y));
      },
      cg::input<float>({8, 8}));
  CHECK(overlaps(cg::schedule(two, {"sink_waits", "raise_comms"})) == std::vector<hint>{hint::none, hint::none});
  // A chain of collectives, each waited at once.
  CHECK(overlaps(cg::trace(cg::examples::all_reduce_chain(world, 3), cg::input<float>({4}))) ==
        std::vector<hint>(3, hint::none));
  // A collective never waited (its result returned pending, as compile_options::
  // pending_outputs compiles it) overlaps whatever follows it.
  cg::graph unwaited = cg::trace(
      [&](auto a) {
        auto x = cg::all_reduce(a, "sum", world);
        return std::tuple{x, cg::eval(cg::relu(a))};
      },
      cg::input<float>({8, 8}));
  CHECK(overlaps(unwaited) == std::vector<hint>{hint::none});  // traced: waited at once
  cg::detail::return_pending(unwaited);
  CHECK(overlaps(unwaited) == std::vector<hint>{hint::compute});
}

TEST_CASE("executor.overlap_hint_reaches_the_backend_without_changing_results") {
  // On the threads backend the hint changes nothing: a scheduled run equals eager.
  cg::run_threads(2, [](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0, 1};
    auto program = [&](auto a) {
      auto ar = cg::all_reduce(a, "sum", world);
      auto m = cg::matmul(a, a);
      return cg::eval(cg::wait_tensor(ar) + m);
    };
    const auto a = cg::full<float>({4, 4}, static_cast<float>(ctx.rank() + 1));
    const auto eager = program(a).to_vector();
    auto s = cg::schedule(cg::trace(program, cg::input<float>({4, 4})), {"sink_waits", "raise_comms"});
    REQUIRE(overlaps(s) == std::vector<hint>{hint::matmul});
    auto run = cg::compile(s, ctx);
    CHECK(run(a).to_vector() == eager);
  });
}

TEST_CASE("executor.graph_of_another_world_or_rank_is_refused_at_compile") {
  // issue 21 item 1: a graph traced for 8 ranks run on 2 read the backend's peer table out of
  // bounds; one traced as rank 0 over MPMD {{0, 1}, {2, 3}} run by ranks 2 and 3 wrote before
  // a slot. Both are errors at compile, naming the node, the group, the world and the rank.
  const std::vector<int> eight{0, 1, 2, 3, 4, 5, 6, 7};
  auto g8 = cg::trace(cg::trace_options{.world_size = 8},
                      [&](auto a) { return cg::wait_tensor(cg::all_reduce(a, "sum", cg::group{eight})); },
                      cg::input<float>({4}));
  std::string node;
  for (const auto& n : g8.nodes())
    if (n->is_collective()) node = n->name();
  std::vector<std::string> msgs(2);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    try {
      (void)cg::compile(g8, ctx);
    } catch (const cg::error& e) {
      msgs[static_cast<std::size_t>(ctx.rank())] = e.what();
    }
    // The world is untouched: nothing was issued.
    CHECK(cg::all_reduce(cg::ones<float>({1}), "sum", ctx.world()).item() == 2.f);
  });
  for (int r = 0; r < 2; ++r)
    CHECK(msgs[static_cast<std::size_t>(r)] == "compile: %" + node +
                                                   " = all_reduce: group [0, 1, 2, 3, 4, 5, 6, 7] does not fit a "
                                                   "world of 2 ranks (rank " + std::to_string(r) + ")");

  const cg::group halves = std::vector<std::vector<int>>{{0, 1}, {2, 3}};
  auto as_rank0 = cg::trace(cg::trace_options{.rank = 0, .world_size = 4},
                            [&](auto a) { return cg::wait_tensor(cg::all_reduce(a, "sum", halves)); },
                            cg::input<float>({4}));
  std::vector<std::string> mpmd(4);
  cg::run_threads(4, [&](cg::rank_context& ctx) {
    const auto r = static_cast<std::size_t>(ctx.rank());
    if (ctx.rank() < 2) {  // the ranks it was traced for run it
      auto run = cg::compile(as_rank0, ctx);
      CHECK(run(cg::ones<float>({4})).to_vector() == std::vector<float>(4, 2.f));
      return;
    }
    try {
      (void)cg::compile(as_rank0, ctx);
    } catch (const cg::error& e) {
      mpmd[r] = e.what();
    }
  });
  CHECK_MESSAGE(ccgraph_test::contains(mpmd[2], " = all_reduce: rank 2 is not a member of group [0, 1] (world of 4 ranks)"), mpmd[2]);
  CHECK_MESSAGE(ccgraph_test::contains(mpmd[3], " = all_reduce: rank 3 is not a member of group [0, 1] (world of 4 ranks)"), mpmd[3]);

  // A mesh dimension traced on 8 ranks, run on 4: rank 0's group fits, its partition does not.
  const cg::group quarters = std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}};
  auto split8 = cg::trace(cg::trace_options{.rank = 0, .world_size = 8},
                          [&](auto a) { return cg::wait_tensor(cg::all_reduce(a, "sum", quarters)); },
                          cg::input<float>({4}));
  std::string part;
  cg::run_threads(4, [&](cg::rank_context& ctx) {
    if (ctx.rank() != 0) return;
    try {
      (void)cg::compile(split8, ctx);
    } catch (const cg::error& e) {
      part = e.what();
    }
  });
  CHECK_MESSAGE(ccgraph_test::contains(part, " = all_reduce: the partition [[0, 1, 2, 3], [4, 5, 6, 7]] of group "
                                             "[0, 1, 2, 3] does not split a world of 4 ranks (rank 0)"),
                part);
}

TEST_CASE("executor.update_inputs.results_are_written_into_their_inputs") {
  // compile_options::update_inputs: result 0 (p minus half the averaged g) is written into
  // input p once the graph has run; result 1 reads the old p, so the write must come last.
  auto fn = [](auto p, auto g) {
    using V = decltype(p);
    const V avg = cg::wait_tensor(cg::all_reduce(g, "avg", cg::group{std::vector<int>{0, 1}}));
    return std::vector<V>{p - avg * 0.5f, cg::sum(p)};
  };
  auto tg = cg::trace(cg::trace_options{.world_size = 2}, fn, cg::input<float>({3}), cg::input<float>({3}));
  for (const bool plan : {true, false})
    for (const bool pending : {false, true})
      cg::run_threads(2, [&](cg::rank_context& ctx) {
        INFO("memory_plan ", plan, ", pending_outputs ", pending);
        auto step = cg::compile(tg, ctx, {.memory_plan = plan, .pending_outputs = pending, .update_inputs = {{0, 0}}});
        auto p = cg::tensor<float>::from({1, 2, 3}, {3});
        const float r1 = float(ctx.rank() + 1);
        const auto g = cg::tensor<float>::from({2 * r1, 0, -2 * r1}, {3});  // average {3, 0, -3}
        const float* where = p.data();
        std::vector<float> want{1, 2, 3};
        for (int s = 0; s < 3; ++s) {
          const float old_sum = want[0] + want[1] + want[2];
          const auto out = step(p, g);
          for (std::size_t i = 0; i < 3; ++i) want[i] -= 0.5f * std::vector<float>{3, 0, -3}[i];
          CHECK(out[0].data() == where);  // the input tensor itself
          CHECK(p.to_vector() == want);
          CHECK(out[1].to_vector() == std::vector<float>{old_sum});
        }
        CHECK(step.exec().updated_inputs() == std::vector<cg::input_update>{{0, 0}});
      });
}

TEST_CASE("executor.update_inputs.errors") {
  auto tg = cg::trace([](auto p, auto q) { return std::vector<decltype(p)>{p + 1.f, q * 2.f, cg::sum(p)}; },
                      cg::input<float>({4}), cg::input<float>({4}));
  auto compile_error = [&](std::vector<cg::input_update> u) {
    std::string msg;
    ccgraph_test::run(1, [&](cg::rank_context& ctx) {
      try {
        (void)cg::compile(tg, ctx, {.update_inputs = u});
      } catch (const cg::error& e) {
        msg = e.what();
      }
    });
    return msg;
  };
  CHECK(compile_error({{2, 0}}) == "compile: update_inputs[0] = {input 2, output 0}: the graph has 2 inputs");
  CHECK(compile_error({{0, 3}}) == "compile: update_inputs[0] = {input 0, output 3}: the graph has 3 results");
  CHECK(ccgraph_test::contains(compile_error({{0, 2}}), "compile: update_inputs[0] = {input 0, output 2}: the result is "));
  CHECK(compile_error({{0, 0}, {0, 1}}) ==
        "compile: update_inputs[1] = {input 0, output 1}: input 0 is already updated by update_inputs[0]");
  CHECK(compile_error({{0, 0}, {1, 0}}) ==
        "compile: update_inputs[1] = {input 1, output 0}: result 0 already updates input 0");

  ccgraph_test::run(1, [&](cg::rank_context& ctx) {
    auto step = cg::compile(tg, ctx, {.update_inputs = {{0, 0}, {1, 1}}});
    const auto base = cg::tensor<float>::from({1, 2, 3, 4, 5, 6, 7, 8}, {8});
    const auto q = cg::tensor<float>::from({1, 1, 1, 1}, {4});
    auto error_of = [&](const cg::tensor<float>& a, const cg::tensor<float>& b) {
      try {
        (void)step(a, b);
      } catch (const cg::error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    // elements sharing memory (an expanded tensor): refused, nothing written
    std::vector<float> one{5};
    const auto shared = cg::from_blob(one.data(), {4}, {0}, [](float*) {});
    CHECK(ccgraph_test::contains(error_of(shared, q),
                                 "compiled graph: input 0 is updated in place (compile_options::update_inputs) but its "
                                 "elements share memory"));
    CHECK(one == std::vector<float>{5});
    // overlapping inputs: the same tensor twice, and two views of one storage that overlap
    CHECK(error_of(q, q) == "compiled graph: input 0 is updated in place (compile_options::update_inputs) but shares "
                            "memory with input 1; pass a tensor of its own");
    CHECK(ccgraph_test::contains(error_of(base.narrow(0, 0, 4), base.narrow(0, 3, 4)), "shares memory with input 1"));
    CHECK(q.to_vector() == std::vector<float>(4, 1.f));
    CHECK(base.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
    // disjoint views of one storage are fine
    const auto lo = base.narrow(0, 0, 4), hi = base.narrow(0, 4, 4);
    (void)step(lo, hi);
    CHECK(base.to_vector() == std::vector<float>{2, 3, 4, 5, 10, 12, 14, 16});
  });

  // A result that is another updated input: writing it would read what the call overwrites.
  auto swap = cg::trace([](auto p, auto q) { return std::vector<decltype(p)>{q, p}; }, cg::input<float>({2}),
                        cg::input<float>({2}));
  ccgraph_test::run(1, [&](cg::rank_context& ctx) {
    auto step = cg::compile(swap, ctx, {.memory_plan = false, .update_inputs = {{0, 0}, {1, 1}}});
    const auto p = cg::tensor<float>::from({1, 2}, {2}), q = cg::tensor<float>::from({3, 4}, {2});
    std::string msg;
    try {
      (void)step(p, q);
    } catch (const cg::error& e) {
      msg = e.what();
    }
    CHECK(msg == "compiled graph: result 0, written into input 0 (compile_options::update_inputs), is a view of "
                 "input 1, which the call also updates; return a copy");
    CHECK(p.to_vector() == std::vector<float>{1, 2});
    CHECK(q.to_vector() == std::vector<float>{3, 4});
  });
}

namespace executor_in_place_test {

/// p (input 0) becomes p * 0.5 + g after sum(p) has read it: one pointwise node after every
/// other read of the old p, so it is written straight into p. q (input 1) becomes q + 1 but
/// sum(q) reads the old q afterwards: q's new value is computed apart and copied in.
inline auto step_fn = [](auto p, auto q, auto g) {
  using V = decltype(p);
  const V s = cg::sum(p);
  const V pn = p * 0.5f + g;
  const V qn = q + 1.f;
  const V t = cg::sum(q);
  return std::vector<V>{pn, qn, s, t};
};

inline float total(const std::vector<float>& v) {
  float s = 0;
  for (float x : v) s += x;
  return s;
}

}  // namespace executor_in_place_test

TEST_CASE("executor.update_inputs.in_place_after_every_old_read") {
  using namespace executor_in_place_test;
  auto tg = cg::trace(step_fn, cg::input<float>({2, 3}), cg::input<float>({2, 3}), cg::input<float>({2, 3}));
  const std::vector<cg::input_update> updates{{0, 0}, {1, 1}};
  for (const bool plan : {true, false})
    ccgraph_test::run(1, [&](cg::rank_context& ctx) {
      INFO("memory_plan ", plan);
      auto step = cg::compile(tg, ctx, {.memory_plan = plan, .update_inputs = updates});
      CHECK(step.exec().update_in_place(0));
      CHECK_FALSE(step.exec().update_in_place(1));  // sum(q) reads the old q after q + 1
      CHECK_FALSE(step.exec().update_in_place(2));  // not an updated result
      const auto g = cg::tensor<float>::from({2, 4, 6, 8, 10, 12}, {2, 3});
      // contiguous p: the node writes p itself (the interpreter's own result is p's memory)
      {
        auto p = cg::tensor<float>::from({1, 2, 3, 4, 5, 6}, {2, 3});
        auto q = cg::tensor<float>::from({0, 0, 0, 1, 1, 1}, {2, 3});
        std::vector<float> want_p = p.to_vector(), want_q = q.to_vector();
        for (int s = 0; s < 3; ++s) {
          const float old_p = total(want_p), old_q = total(want_q);
          const auto out = step(p, q, g);
          for (std::size_t i = 0; i < 6; ++i) {
            want_p[i] = want_p[i] * 0.5f + float(2 * (i + 1));
            want_q[i] += 1.f;
          }
          CHECK(out[0].data() == p.data());
          CHECK(out[1].data() == q.data());
          CHECK(p.to_vector() == want_p);
          CHECK(q.to_vector() == want_q);
          CHECK(out[2].to_vector() == std::vector<float>{old_p});  // read before the write
          CHECK(out[3].to_vector() == std::vector<float>{old_q});  // read after q + 1: the old q
        }
        const auto direct = step.exec().interpret({p, q, g});
        CHECK(cg::get_tensor<float>(direct[0], "test").data() == p.data());
        CHECK(cg::get_tensor<float>(direct[1], "test").data() != q.data());
      }
      // a non-contiguous p (a transposed view): computed apart and copied in, the same values
      {
        auto base = cg::tensor<float>::from({1, 4, 2, 5, 3, 6}, {3, 2});
        auto p = base.transpose(0, 1);  // {{1, 2, 3}, {4, 5, 6}}
        auto q = cg::tensor<float>::from({0, 0, 0, 1, 1, 1}, {2, 3});
        const auto out = step(p, q, g);
        CHECK(p.to_vector() == std::vector<float>{2.5f, 5, 7.5f, 10, 12.5f, 15});
        CHECK(base.to_vector() == std::vector<float>{2.5f, 10, 5, 12.5f, 7.5f, 15});
        CHECK(out[2].to_vector() == std::vector<float>{21});
        const auto direct = step.exec().interpret({p, q, g});
        CHECK(cg::get_tensor<float>(direct[0], "test").data() != p.data());
      }
    });
}

TEST_CASE("executor.update_inputs.old_value_read_by_a_collective_until_its_wait") {
  // p's all_reduce reads p on the communication worker until its wait. Traced, the wait follows
  // the all_reduce at once, so p - g may be written into p; with the wait sunk below p - g
  // (sink_waits), the all_reduce still reads p there: p - g is computed apart and copied in.
  auto fn = [](auto p, auto g) {
    using V = decltype(p);
    auto ar = cg::all_reduce(p, "sum", cg::group{std::vector<int>{0, 1}});
    const V pn = p - g;
    return std::vector<V>{pn, cg::wait_tensor(ar)};
  };
  const auto traced = cg::trace(cg::trace_options{.world_size = 2}, fn, cg::input<float>({4}), cg::input<float>({4}));
  for (const bool sunk : {false, true}) {
    const auto tg = sunk ? cg::schedule(traced, {"sink_waits"}) : traced;
    for (const bool plan : {true, false})
      cg::run_threads(2, [&](cg::rank_context& ctx) {
        INFO("sunk ", sunk, ", memory_plan ", plan, "\n", cg::to_string(tg));
        auto step = cg::compile(tg, ctx, {.memory_plan = plan, .update_inputs = {{0, 0}}});
        CHECK(step.exec().update_in_place(0) == !sunk);
        const float r = float(ctx.rank());
        auto p = cg::tensor<float>::from({1 + r, 2 + r, 3 + r, 4 + r}, {4});
        const auto g = cg::tensor<float>::from({1, 1, 1, 1}, {4});
        for (int s = 0; s < 2; ++s) {
          const auto out = step(p, g);
          const float sf = float(s);
          // the sum of both ranks' old p: (1 + 2 + ...) each element, less 2 per finished step
          CHECK(out[1].to_vector() == std::vector<float>{3 - 2 * sf, 5 - 2 * sf, 7 - 2 * sf, 9 - 2 * sf});
          CHECK(p.to_vector() == std::vector<float>{r - sf, 1 + r - sf, 2 + r - sf, 3 + r - sf});
        }
      });
  }
}

// --- profiled calls: the measured timeline (basic_executor::run_profiled) --------------------

namespace {

/// out = x after sleeping attrs[0] milliseconds: a node whose time is known.
const cg::user_op& profile_sleepy() {
  static const cg::user_op op = [] {
    cg::user_op_def d;
    d.name = "test::profile_sleepy";
    d.infer = [](const std::vector<cg::tensor_meta>& in, const std::vector<double>&) {
      return std::vector<cg::tensor_meta>{in.at(0)};
    };
    d.cpu = [](const cg::user_op_call& c) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(c.attrs.at(0)));
      cg::tensor<float>(std::get<cg::tensor<float>>(c.outputs[0])).copy_(std::get<cg::tensor<float>>(c.inputs[0]));
    };
    d.cost = [](const cg::cost_args& a, const std::vector<double>&) {
      const double elems = static_cast<double>(cg::numel_of(a.in[0].shape));
      return cg::op_cost::compute(elems, 8 * elems, cg::peak_class::vector);
    };
    return cg::register_op(d);
  }();
  return op;
}

/// A strict JSON (RFC 8259) recogniser, enough to tell that a trace parses.
struct profile_json_reader {
  const std::string& s;
  std::size_t i = 0;
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  bool lit(const char* w) {
    const std::size_t n = std::strlen(w);
    if (s.compare(i, n, w) != 0) return false;
    i += n;
    return true;
  }
  bool string() {
    if (i >= s.size() || s[i] != '"') return false;
    for (++i; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c == '"') return ++i, true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (++i >= s.size()) return false;
        if (s[i] == 'u') {
          for (int k = 0; k < 4; ++k)
            if (++i >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
        } else if (std::string("\"\\/bfnrt").find(s[i]) == std::string::npos) {
          return false;
        }
      }
    }
    return false;
  }
  bool number() {
    const std::size_t b = i;
    if (i < s.size() && s[i] == '-') ++i;
    const std::size_t d = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i == d || (s[d] == '0' && i - d > 1)) return false;
    if (i < s.size() && s[i] == '.') {
      const std::size_t f = ++i;
      while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
      if (i == f) return false;
    }
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      ++i;
      if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
      const std::size_t e = i;
      while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
      if (i == e) return false;
    }
    return i > b;
  }
  bool value() {
    ws();
    if (i >= s.size()) return false;
    bool ok = false;
    if (s[i] == '{') {
      ++i, ws();
      if (i < s.size() && s[i] == '}') return ++i, true;
      do {
        ws();
        if (!string()) return false;
        ws();
        if (i >= s.size() || s[i++] != ':' || !value()) return false;
        ws();
      } while (i < s.size() && s[i] == ',' && ++i);
      ok = i < s.size() && s[i++] == '}';
    } else if (s[i] == '[') {
      ++i, ws();
      if (i < s.size() && s[i] == ']') return ++i, true;
      do {
        if (!value()) return false;
        ws();
      } while (i < s.size() && s[i] == ',' && ++i);
      ok = i < s.size() && s[i++] == ']';
    } else if (s[i] == '"') {
      ok = string();
    } else {
      ok = lit("true") || lit("false") || lit("null") || number();
    }
    ws();
    return ok;
  }
  static bool valid(const std::string& text) {
    profile_json_reader r{text};
    return r.value() && r.i == text.size();
  }
};

/// Every node of `g` once, in order; intervals ordered, non-negative and inside the call;
/// collectives alone on the communication track, one at a time; the compute track in order;
/// the totals what the events add up to.
void check_measured(const cg::graph& g, const cg::timeline& tl) {
  REQUIRE(tl.events.size() == g.nodes().size());
  double compute_free = 0, comm_free = 0, compute = 0, comm = 0, stalls = 0, last = 0;
  for (std::size_t i = 0; i < tl.events.size(); ++i) {
    const cg::timeline_event& ev = tl.events[i];
    CAPTURE(i);
    CHECK(ev.n == g.nodes()[i]);
    CHECK(ev.on_comm_stream == ev.n->is_collective());
    CHECK(ev.start_us >= 0);
    CHECK(ev.end_us >= ev.start_us);
    CHECK(ev.end_us <= tl.total_us);
    CHECK(ev.stall_us >= 0);
    if (!ev.n->is_wait()) CHECK(ev.stall_us == 0);
    if (ev.on_comm_stream) {
      CHECK(ev.start_us >= comm_free);
      comm_free = ev.end_us;
      comm += ev.end_us - ev.start_us;
    } else {
      CHECK(ev.start_us - ev.stall_us >= compute_free);
      compute_free = ev.end_us;
      compute += ev.end_us - ev.start_us;
      stalls += ev.stall_us;
    }
    last = std::max(last, ev.end_us);
  }
  CHECK(tl.total_us == doctest::Approx(last));
  CHECK(tl.compute_us == doctest::Approx(compute));
  CHECK(tl.comm_us == doctest::Approx(comm));
  CHECK(tl.exposed_comm_us == doctest::Approx(stalls + std::max(0.0, comm_free - compute_free)));
}

}  // namespace

TEST_CASE("executor.profile.threads.every_node_once_and_the_slow_one_longest") {
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0, 1};
    auto program = [&](auto a) {
      auto ar = cg::all_reduce(a, "sum", world);
      auto m = cg::matmul(a, a);
      auto slow = profile_sleepy().with({30.0})(m);
      return cg::eval(cg::wait_tensor(ar) + slow);
    };
    const auto a = cg::full<float>({8, 8}, static_cast<float>(ctx.rank() + 1));
    auto s = cg::schedule(cg::trace(program, cg::input<float>({8, 8})), {"sink_waits", "raise_comms"});
    auto run = cg::compile(s, ctx);
    const auto plain = run(a).to_vector();
    const cg::profiled<cg::tensor<float>> p = run.profile(a);
    CHECK(p.result.to_vector() == plain);  // measuring changes nothing
    const cg::graph& g = run.exec().graph_ref();
    check_measured(g, p.measured);
    const cg::timeline_event* slowest = nullptr;
    int collectives = 0;
    for (const auto& ev : p.measured.events) {
      collectives += ev.on_comm_stream;
      if (!slowest || ev.end_us - ev.start_us > slowest->end_us - slowest->start_us) slowest = &ev;
    }
    CHECK(collectives == 1);
    REQUIRE(slowest != nullptr);
    CHECK(std::holds_alternative<cg::ops::user>(slowest->n->kind()));  // test::profile_sleepy
    CHECK(slowest->end_us - slowest->start_us >= 30000 * 0.99);  // sleep_for sleeps at least that
    CHECK(p.measured.compute_us >= 30000 * 0.99);
    CHECK(p.measured.comm_us > 0);
    // Run again: each call measures from its own start.
    const auto again = run.profile(a);
    check_measured(g, again.measured);
    CHECK(again.measured.total_us < 30 * 1e6);
  });
}

TEST_CASE("executor.profile.threads.a_late_peer_is_exposed_at_the_wait") {
  // Rank 1 reaches the all_reduce 40 ms late: rank 0's wait stands still for it, which its
  // measured timeline shows as exposed communication; rank 1 waits for nothing much.
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0, 1};
    const double late_ms = ctx.rank() == 1 ? 40.0 : 0.0;
    auto program = [&](auto a) {
      auto x = profile_sleepy().with({late_ms})(a);
      return cg::eval(cg::wait_tensor(cg::all_reduce(x, "sum", world)) * 2.f);
    };
    auto run = cg::compile(cg::trace(program, cg::input<float>({4})), ctx);
    const auto p = run.profile(cg::ones<float>({4}));
    CHECK(p.result.to_vector() == std::vector<float>(4, 4.f));
    check_measured(run.exec().graph_ref(), p.measured);
    double stall = 0, comm = 0;
    for (const auto& ev : p.measured.events) {
      if (ev.n->is_wait()) stall = ev.stall_us;
      if (ev.on_comm_stream) comm = ev.end_us - ev.start_us;
    }
    if (ctx.rank() == 0) {
      CHECK(stall >= 30000);  // 40 ms late, less what rank 0's own launch took
      CHECK(comm >= 30000);   // taken up at once, complete once rank 1 came
      CHECK(p.measured.exposed_comm_us >= 30000);
    } else {
      CHECK(p.measured.compute_us >= 40000 * 0.99);
    }
  });
}

TEST_CASE("executor.profile.predicted_and_measured_in_one_chrome_trace") {
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0, 1};
    auto g = cg::schedule(cg::trace(cg::examples::seed_program(world), cg::input<float>({8, 8})),
                          {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
    const cg::executor exec(g, ctx);
    const auto p = exec.run_profiled({cg::any_tensor(cg::ones<float>({8, 8}))});
    check_measured(exec.graph_ref(), p.measured);
    const cg::timeline predicted = cg::predict(g);
    const std::string json = cg::predicted_vs_measured_trace(predicted, p.measured);
    CHECK(json == cg::to_chrome_trace({predicted, p.measured}, {"predicted", "measured"}));
    CHECK(profile_json_reader::valid(json));
    CHECK_FALSE(profile_json_reader::valid(json.substr(0, json.size() - 3)));  // the reader does reject
    CHECK(ccgraph_test::contains(json, "\"args\":{\"name\":\"predicted\"}"));
    CHECK(ccgraph_test::contains(json, "\"args\":{\"name\":\"measured\"}"));
    // Each compute or collective node appears once per process, under the same label.
    for (const cg::node* n : g.nodes()) {
      if (n->category() == cg::op_category::input || n->category() == cg::op_category::output) continue;
      const std::string label = "{\"name\":\"" + cg::detail::json_escape(cg::detail::node_label(*n)) + "\"";
      std::size_t count = 0;
      for (std::size_t at = json.find(label); at != std::string::npos; at = json.find(label, at + 1)) ++count;
      CHECK_MESSAGE(count == 2, label);
    }
    CHECK(cg::overlap_report(p.measured).find("total ") != std::string::npos);
  });
}

TEST_CASE("executor.profile.pending_outputs_and_sends_only") {
  // A result returned pending: its collective is measured to its completion, and what runs
  // past the compute is exposed.
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0, 1};
    auto program = [&](auto a) { return std::tuple{cg::all_reduce(a, "sum", world), cg::eval(cg::relu(a))}; };
    auto run = cg::compile(cg::trace(program, cg::input<float>({16})), ctx, {.pending_outputs = true});
    const auto p = run.profile(cg::ones<float>({16}));
    CHECK(std::get<0>(p.result).to_vector() == std::vector<float>(16, 2.f));
    check_measured(run.exec().graph_ref(), p.measured);
    // Unprofiled calls after a profiled one run as before.
    CHECK(std::get<0>(run(cg::ones<float>({16}))).to_vector() == std::vector<float>(16, 2.f));
  });
}

TEST_CASE("executor.profile.compile_function") {
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0, 1};
    auto f = cg::compile_function<float>(
        [&](auto a) { return cg::eval(cg::wait_tensor(cg::all_reduce(a, "sum", world)) + cg::relu(a)); }, ctx,
        {.passes = {"sink_waits", "raise_comms"}});
    const auto x = cg::ones<float>({8});
    const auto p = f.profile(x);
    CHECK(p.result.to_vector() == f(x).to_vector());
    CHECK(f.compiles() == 1);  // the profiled call compiled it, the plain one reused it
    const auto* c = f.compiled_for({{8}});
    REQUIRE(c != nullptr);
    check_measured(c->exec().graph_ref(), p.measured);
  });
}
