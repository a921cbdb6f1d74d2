// Tests of the reordering passes (schedule/reorder.hpp) through cg::schedule: the orders
// PyTorch's own tests expect (seeds/002_*), and on random programs that every pass keeps every
// dependency and the collective order and computes what the unscheduled graph computes; and,
// on a generated graph of over 20,000 nodes, that every pass still gives a valid order.
#include <doctest/doctest.h>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "../../examples/programs.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace cg = ccgraph;

namespace {

const cg::trace_options two_ranks{.rank = 0, .world_size = 2};
const cg::group pair = std::vector<int>{0, 1};

// get_snode_runtime_for_reorder_compute_test in the seed: collectives 100, waits 0, extern
// (matmul) kernels 5, everything else 1.
double seed_estimator(const cg::node& n) {
  if (n.is_collective()) return 100;
  if (n.is_wait()) return 0;
  if (n.op() == "matmul") return 5;
  return 1;
}

// True when `want` appears in `seq` in this order (FileCheck's check().check()...).
bool in_order(const std::vector<std::string>& seq, const std::vector<std::string>& want) {
  std::size_t k = 0;
  for (const auto& s : seq)
    if (k < want.size() && s == want[k]) ++k;
  return k == want.size();
}

auto sink_program = [](auto a) {
  auto ar = cg::all_reduce(a, "sum", pair);
  auto c = cg::relu(a);
  auto d = cg::matmul(c, c);
  return cg::eval(d + ar);
};
auto raise_program = [](auto a) {
  auto c = cg::relu(a);
  auto d = cg::matmul(c, c);
  auto ar = cg::all_reduce(a, "sum", pair);
  return cg::eval(d + ar);
};
// The seeds' test_reorder_compute_for_overlap program.
const auto reorder_program = cg::examples::seed_program(pair);

std::vector<std::string> collective_sequence(const cg::graph& g) {
  std::vector<std::string> out;
  for (const cg::node* n : g.nodes())
    if (n->is_collective()) out.push_back(cg::to_string(*n).substr(cg::to_string(*n).find('=')));
  return out;
}

}  // namespace

TEST_CASE("schedule.seed.sink_waits") {
  auto g = cg::trace(two_ranks, sink_program, cg::input<float>({4, 4}));
  auto s = cg::schedule(g, {"sink_waits"});
  const auto seq = cg::op_sequence(s);
  CHECK(seq == std::vector<std::string>{"all_reduce", "fused_relu", "matmul", "wait_tensor", "fused_add"});
  CHECK(in_order(seq, {"all_reduce", "fused_relu", "wait_tensor"}));  // the seed's FileCheck
}

TEST_CASE("schedule.seed.raise_comms") {
  auto g = cg::trace(two_ranks, raise_program, cg::input<float>({4, 4}));
  CHECK(cg::op_sequence(g).front() == "fused_relu");
  auto s = cg::schedule(g, {"raise_comms"});
  // The collective rises above the compute it does not need; its wait stays where it was.
  CHECK(cg::op_sequence(s) ==
        std::vector<std::string>{"all_reduce", "fused_relu", "matmul", "wait_tensor", "fused_add"});
}

TEST_CASE("schedule.seed.sink_waits_raise_comms") {
  auto g = cg::trace(two_ranks, raise_program, cg::input<float>({4, 4}));
  auto s = cg::schedule(g, {"sink_waits", "raise_comms"});
  // The seed checks all_reduce, relu, wait, then the kernel that reads the wait (addmm there,
  // fused_add here).
  CHECK(in_order(cg::op_sequence(s), {"all_reduce", "fused_relu", "wait_tensor", "fused_add"}));
}

TEST_CASE("schedule.seed.reorder_compute_for_overlap") {
  auto g = cg::trace(two_ranks, reorder_program, cg::input<float>({4, 4}));
  const std::vector<std::string> expected = {"all_reduce", "fused_relu", "matmul", "matmul", "wait_tensor",
                                             "fused_mul", "all_reduce", "wait_tensor", "fused_add", "matmul"};
  SUBCASE("custom estimator") {
    cg::schedule_options opt;
    opt.estimate_runtime = seed_estimator;
    CHECK(cg::op_sequence(cg::schedule(g, {"reorder_compute_for_overlap"}, opt)) == expected);
  }
  SUBCASE("cost model") {
    CHECK(cg::op_sequence(cg::schedule(g, {"reorder_compute_for_overlap"})) == expected);
  }
}

TEST_CASE("schedule.reorder_compute_for_overlap.waits_stay_at_their_readers") {
  // An FSDP forward: four weights gathered up front, each read by one matmul of a chain. The
  // walk takes the gathers' waits as free fillers; a wait placed before compute that does not
  // read it held that compute back on the GPU (the first projection of an FSDP block waited for
  // every weight's gather). After the pass each wait sits just before its first reader.
  auto fsdp = [](auto x, auto w1, auto w2, auto w3, auto w4) {
    auto g1 = cg::all_gather_tensor(w1, 0, pair);
    auto g2 = cg::all_gather_tensor(w2, 0, pair);
    auto g3 = cg::all_gather_tensor(w3, 0, pair);
    auto g4 = cg::all_gather_tensor(w4, 0, pair);
    auto h = cg::eval(cg::relu(x));
    auto a = cg::matmul(h, cg::wait_tensor(g1));
    auto b = cg::matmul(a, cg::wait_tensor(g2));
    auto c = cg::matmul(b, cg::wait_tensor(g3));
    return cg::matmul(c, cg::wait_tensor(g4));
  };
  const auto in = cg::input<float>({8, 8}), w = cg::input<float>({4, 8});
  auto g = cg::trace(two_ranks, fsdp, in, w, w, w, w);
  cg::schedule_options opt;
  opt.estimate_runtime = [](const cg::node& n) {
    if (n.is_collective()) return 100.0;
    if (n.is_wait()) return 0.0;
    if (n.op() == "matmul") return 300.0;
    return 10.0;
  };
  for (const auto& passes : std::vector<std::vector<std::string>>{
           {"reorder_compute_for_overlap"}, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"}}) {
    auto s = cg::schedule(g, passes, opt);
    INFO(s);
    const auto nodes = s.nodes();
    std::size_t waits = 0;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (!nodes[i]->is_wait()) continue;
      ++waits;
      // Only other waits stand between a wait and its first reader.
      std::size_t first = nodes.size();
      for (const cg::node* u : nodes[i]->users()) first = std::min(first, s.position(u));
      REQUIRE(first < nodes.size());
      for (std::size_t k = i + 1; k < first; ++k) CHECK(nodes[k]->is_wait());
    }
    CHECK(waits == 4);
    // The gathers all go before the first matmul, each waited only where it is read.
    const auto seq = cg::op_sequence(s);
    CHECK(in_order(seq, {"all_gather_into_tensor", "all_gather_into_tensor", "all_gather_into_tensor",
                         "all_gather_into_tensor", "wait_tensor", "matmul", "wait_tensor", "matmul", "wait_tensor",
                         "matmul", "wait_tensor", "matmul"}));
    const auto t = cg::predict(s, opt);
    CHECK(t.exposed_comm_us <= 100.0 + 1e-9);  // at most the first gather, which nothing precedes
  }
}

TEST_CASE("schedule.overlap.hides_second_all_reduce_behind_independent_matmul") {
  // The first all_reduce (600) is longer than relu + d (340), so Inductor's pass spends the
  // independent matmul g on it and leaves the second all_reduce fully exposed; ours waits 260
  // for the first and keeps g (300) to hide half of the second.
  auto est = [](const cg::node& n) {
    if (n.is_collective()) return 600.0;
    if (n.is_wait()) return 0.0;
    if (n.op() == "matmul") return 300.0;
    return 40.0;
  };
  cg::schedule_options opt;
  opt.estimate_runtime = est;
  auto g = cg::trace(two_ranks, reorder_program, cg::input<float>({4, 4}));
  auto inductor = cg::schedule(g, {"reorder_compute_for_overlap"}, opt);
  auto ours = cg::schedule(g, {"overlap"}, opt);
  const auto ti = cg::predict(inductor, opt), to = cg::predict(ours, opt);
  INFO("inductor:\n" << cg::overlap_report(ti) << "ours:\n" << cg::overlap_report(to));
  CHECK(to.exposed_comm_us < ti.exposed_comm_us);
  CHECK(to.total_us < ti.total_us);
  // g runs while the second all_reduce is in flight.
  const auto seq = cg::op_sequence(ours);
  CHECK(in_order(seq, {"all_reduce", "fused_relu", "matmul", "wait_tensor", "fused_mul", "all_reduce", "matmul",
                       "wait_tensor", "fused_add", "matmul"}));
}

TEST_CASE("schedule.unknown_pass") {
  auto g = cg::trace(two_ranks, sink_program, cg::input<float>({4, 4}));
  CHECK_THROWS_WITH_AS(cg::schedule(g, {"sink_wait"}),
                       doctest::Contains("unknown pass 'sink_wait'; known passes are"), cg::error);
  CHECK(cg::op_sequence(cg::schedule(g, {})) == cg::op_sequence(g));
}

TEST_CASE("schedule.estimates_must_be_finite_and_not_negative") {
  // The passes add and compare estimates: a negative, infinite or NaN one is refused, naming
  // the node, instead of silently giving some order.
  auto g = cg::trace(two_ranks, reorder_program, cg::input<float>({4, 4}));
  for (double bad : {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    cg::schedule_options opt;
    opt.estimate_runtime = [bad](const cg::node& n) { return n.op() == "matmul" ? bad : 1.0; };
    for (const std::string pass : {"reorder_compute_for_overlap", "overlap"}) {
      INFO(pass << ", estimate " << bad);
      const std::string want = pass + ": the run-time estimate of %matmul (matmul) is ";
      CHECK_THROWS_WITH_AS(cg::schedule(g, {pass}, opt), doctest::Contains(want.c_str()), cg::error);
    }
  }
}

TEST_CASE("schedule.timeline.chrome_trace_and_report") {
  cg::schedule_options opt;
  opt.estimate_runtime = seed_estimator;
  auto g = cg::schedule(cg::trace(two_ranks, reorder_program, cg::input<float>({4, 4})), {"sink_waits"}, opt);
  const auto tl = cg::predict(g, opt);
  CHECK(tl.comm_us == doctest::Approx(200));
  CHECK(tl.total_us >= tl.compute_us);
  const std::string json = cg::to_chrome_trace(tl);
  CHECK(json.find("\"traceEvents\"") != std::string::npos);
  CHECK(json.find("comm stream") != std::string::npos);
  CHECK(json.find("%all_reduce all_reduce") != std::string::npos);
  const std::string report = cg::overlap_report(tl);
  CHECK(report.find("exposed communication") != std::string::npos);
}

TEST_CASE("schedule.timeline.json_escape_writes_valid_json_strings") {
  // A user op's name or a process name may hold any character; JSON forbids raw control
  // characters in strings (RFC 8259), so a newline must come out as \n.
  CHECK(cg::detail::json_escape("plain %mm matmul") == "plain %mm matmul");
  CHECK(cg::detail::json_escape("a\"b\\c") == "a\\\"b\\\\c");
  CHECK(cg::detail::json_escape("line\nnext\r\ttab") == "line\\nnext\\r\\ttab");
  CHECK(cg::detail::json_escape(std::string("\x01\x1f\b\f", 4)) == "\\u0001\\u001f\\b\\f");
  CHECK(cg::detail::json_escape("caf\xc3\xa9") == "caf\xc3\xa9");  // UTF-8 passes through
  cg::schedule_options opt;
  opt.estimate_runtime = seed_estimator;
  auto g = cg::schedule(cg::trace(two_ranks, reorder_program, cg::input<float>({4, 4})), {"sink_waits"}, opt);
  const std::string json = cg::to_chrome_trace(cg::predict(g, opt), "rank 0\n\"main\"");
  CHECK(json.find("rank 0\\n\\\"main\\\"") != std::string::npos);
  CHECK(json.find("rank 0\n") == std::string::npos);  // never the raw newline
}

namespace {

// A random program over [8, 8] values, written once for tensors and symbolic values.
template <class V>
V random_program(V x, std::uint32_t seed, const cg::group& g, int world) {
  std::mt19937 rng(seed);
  std::vector<V> vals{x};
  const char* reduce_ops[] = {"sum", "max", "min", "avg"};
  for (int step = 0; step < 14; ++step) {
    const V& a = vals[rng() % vals.size()];
    const V& b = vals[rng() % vals.size()];
    switch (rng() % 8) {
      case 0: vals.push_back(cg::eval(cg::relu(a) * 0.5f + b)); break;
      case 1: vals.push_back(cg::matmul(a, b) * 0.125f); break;
      case 2: vals.push_back(cg::all_reduce(a, reduce_ops[rng() % 4], g)); break;
      case 3: vals.push_back(cg::all_gather_tensor(a, 0, g).narrow(0, 8, 8)); break;
      case 4: {
        auto rs = cg::reduce_scatter_tensor(a, "sum", 0, g);
        vals.push_back(cg::cat(std::vector<V>(static_cast<std::size_t>(world), rs), 0));
        break;
      }
      case 5: vals.push_back(cg::eval(cg::tanh(a - b))); break;
      case 6: vals.push_back(a.transpose(0, 1).contiguous()); break;
      default: vals.push_back(cg::all_to_all_single(a, std::nullopt, std::nullopt, g)); break;
    }
  }
  return cg::eval(vals.back() + vals[vals.size() / 2]);
}

}  // namespace

TEST_CASE("schedule.random_programs.passes_keep_dependencies_order_and_results") {
  const std::vector<std::vector<std::string>> pass_lists = {
      {"sink_waits"}, {"raise_comms"}, {"sink_waits", "raise_comms"}, {"reorder_compute_for_overlap"},
      {"overlap"}, {"raise_comms", "overlap"}};
  for (int world : {2, 4}) {
    for (std::uint32_t seed = 1; seed <= 4; ++seed) {
      std::vector<int> failures(static_cast<std::size_t>(world), 0);
      cg::run_threads(world, [&](cg::rank_context& ctx) {
        auto prog = [&](auto x) { return random_program(x, seed, ctx.world(), world); };
        auto g = cg::trace(prog, cg::input<float>({8, 8}));
        auto x = cg::uniform<float>({8, 8}, -1, 1, seed * 100 + static_cast<std::uint64_t>(ctx.rank()));
        const auto expected = prog(x).to_vector();
        const auto comms = collective_sequence(g);
        for (const auto& passes : pass_lists) {
          auto s = cg::schedule(g, passes);  // lints: every dependency is before its reader
          if (collective_sequence(s) != comms) ++failures[static_cast<std::size_t>(ctx.rank())];
          if (cg::compile(s, ctx)(x).to_vector() != expected) ++failures[static_cast<std::size_t>(ctx.rank())];
        }
      });
      for (int f : failures) CHECK(f == 0);
    }
  }
}

namespace {

// A generated program of `steps` random steps over [8, 8] values, each reading among the eight
// latest values: about 1.9 nodes a step, several chains wide, with collectives whose results
// are read late or only through views.
template <class V>
V generated_program(V x, int steps, const cg::group& g) {
  std::mt19937 rng(2026);
  std::vector<V> vals{x};
  auto recent = [&]() -> const V& { return vals[vals.size() - 1 - rng() % std::min<std::size_t>(vals.size(), 8)]; };
  for (int step = 0; step < steps; ++step) {
    const V& a = recent();
    const V& b = recent();
    switch (rng() % 6) {
      case 0: vals.push_back(cg::matmul(a, b)); break;
      case 1: vals.push_back(cg::eval(cg::relu(a) * 0.5f + b)); break;
      case 2: vals.push_back(cg::all_reduce(a, "sum", g)); break;
      case 3: vals.push_back(a.transpose(0, 1).contiguous()); break;
      case 4: vals.push_back(cg::all_gather_tensor(a, 0, g).narrow(0, 8, 8)); break;
      default: vals.push_back(a.reshape({-1}).reshape(a.shape())); break;
    }
  }
  return cg::eval(vals.back() + vals[vals.size() / 2]);
}

// What is wrong with `s` as an order of `g`'s nodes (empty when nothing): each node once, every
// input before its reader, the output last.
std::string order_problem(const cg::graph& g, const cg::graph& s) {
  if (s.size() != g.size())
    return "the schedule has " + std::to_string(s.size()) + " nodes, not " + std::to_string(g.size());
  std::unordered_map<std::string, std::size_t> at;
  for (std::size_t i = 0; i < s.size(); ++i)
    if (!at.emplace(s.nodes()[i]->name(), i).second) return "%" + s.nodes()[i]->name() + " is listed twice";
  for (const cg::node* n : g.nodes())
    if (!at.count(n->name())) return "%" + n->name() + " is missing";
  for (std::size_t i = 0; i < s.size(); ++i)
    for (const auto& a : s.nodes()[i]->args())
      if (at.at(a.src->name()) >= i)
        return "%" + s.nodes()[i]->name() + " comes before its input %" + a.src->name();
  if (s.output_node() == nullptr) return "the output node is not last";
  return {};
}

}  // namespace

TEST_CASE("schedule.large_graph.passes_give_valid_orders") {
  // The passes are O((V + E) log V) (PERF.md's host-side target; bench/bench_schedule times
  // them, no test does): on a graph of over 20,000 nodes each still gives a valid order, and
  // the reordering passes keep the collective order, also under the overlap pass's caps (which
  // switch it to its memory order).
  auto g = cg::trace(two_ranks, [](auto x) { return generated_program(x, 11000, pair); }, cg::input<float>({8, 8}));
  REQUIRE(g.size() >= 20000);
  const auto comms = collective_sequence(g);
  cg::schedule_options capped;
  capped.overlap.max_bytes_in_flight = 4 * 8 * 8 * 4;  // four [8, 8] f32 results
  capped.overlap.memory_limit_bytes = 24 * 8 * 8 * 4;
  struct run {
    std::vector<std::string> passes;
    cg::schedule_options opt;
  };
  const std::vector<run> runs = {
      {{"sink_waits"}, {}}, {{"raise_comms"}, {}}, {{"reorder_compute_for_overlap"}, {}}, {{"overlap"}, {}},
      {{"overlap"}, capped}, {{"sink_waits", "raise_comms", "overlap"}, capped}, {{"bucket_collectives"}, {}}};
  for (const auto& r : runs) {
    const auto s = cg::schedule(g, r.passes, r.opt);
    const bool bucketing = r.passes.back() == "bucket_collectives";
    const std::string what =
        r.passes.back() + (r.opt.overlap.memory_limit_bytes == capped.overlap.memory_limit_bytes ? " (capped)" : "");
    INFO(what);
    // Bucketing merges collectives (a new graph, checked against itself); the reordering passes
    // keep every node and the collective order.
    CHECK(order_problem(bucketing ? s : g, s) == "");
    if (!bucketing) CHECK(collective_sequence(s) == comms);
  }
}
