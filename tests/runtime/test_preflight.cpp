// tests/runtime/test_preflight.cpp: cg::preflight of ccgraph/runtime/preflight.hpp traces every
// rank's program on this thread and checks that the ranks issue the same collectives in the
// same order (a different order, shape or group, a missing collective, subgroups, a cycle of
// groups), naming the file:line of each rank's call; reports each rank's memory plan peak and
// writes one Chrome trace with a process per rank; preflight_main is its command. Also: the
// call site of a collective reaches the runtime mismatch errors (threads backend, verify).
#include <doctest/doctest.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/runtime/preflight.hpp>
#include <ccgraph/runtime/verify.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace preflight_test {

/// "test_preflight.cpp:<line>": how a call site reads in messages (the path before it is the
/// compiler's).
std::string site(int line) { return "test_preflight.cpp:" + std::to_string(line); }

/// A strict JSON reader, enough to validate the trace: returns false on any syntax error, and
/// collects every value of a "pid" key.
struct json_reader {
  explicit json_reader(std::string text) : s(std::move(text)) {}

  std::string s;
  std::size_t i = 0;
  std::set<long> pids;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  bool lit(const char* w) {
    const std::string t(w);
    if (s.compare(i, t.size(), t) != 0) return false;
    i += t.size();
    return true;
  }
  bool string(std::string* out = nullptr) {
    if (i >= s.size() || s[i] != '"') return false;
    ++i;
    while (i < s.size() && s[i] != '"') {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c < 0x20) return false;  // JSON forbids raw control characters in strings
      if (c == '\\') {
        ++i;
        if (i >= s.size()) return false;
        if (s[i] == 'u') {
          for (int k = 0; k < 4; ++k)
            if (++i >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
        } else if (std::string("\"\\/bfnrt").find(s[i]) == std::string::npos) {
          return false;
        }
      }
      if (out) *out += s[i];
      ++i;
    }
    if (i >= s.size()) return false;
    ++i;
    return true;
  }
  bool number(double* out) {
    const std::size_t b = i;
    if (i < s.size() && s[i] == '-') ++i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' || s[i] == 'e' ||
                            s[i] == 'E' || s[i] == '+' || s[i] == '-'))
      ++i;
    if (i == b) return false;
    *out = std::stod(s.substr(b, i - b));
    return true;
  }
  bool value(const std::string& key = {}) {
    ws();
    if (i >= s.size()) return false;
    if (s[i] == '{') {
      ++i;
      ws();
      if (i < s.size() && s[i] == '}') return ++i, true;
      for (;;) {
        ws();
        std::string k;
        if (!string(&k)) return false;
        ws();
        if (i >= s.size() || s[i++] != ':') return false;
        if (!value(k)) return false;
        ws();
        if (i < s.size() && s[i] == ',') { ++i; continue; }
        if (i < s.size() && s[i] == '}') return ++i, true;
        return false;
      }
    }
    if (s[i] == '[') {
      ++i;
      ws();
      if (i < s.size() && s[i] == ']') return ++i, true;
      for (;;) {
        if (!value()) return false;
        ws();
        if (i < s.size() && s[i] == ',') { ++i; continue; }
        if (i < s.size() && s[i] == ']') return ++i, true;
        return false;
      }
    }
    if (s[i] == '"') return string();
    if (lit("true") || lit("false") || lit("null")) return true;
    double d = 0;
    if (!number(&d)) return false;
    if (key == "pid") pids.insert(static_cast<long>(d));
    return true;
  }
  bool document() {
    if (!value()) return false;
    ws();
    return i == s.size();
  }
};

/// A program with several kinds of collectives on `g`.
auto mixed(const cg::group& g) {
  return [g](auto a, auto b) {
    auto r = cg::all_reduce(a, "sum", g);
    auto s = cg::reduce_scatter_tensor(cg::matmul(r, b), "avg", 0, g);
    auto t = cg::all_gather_tensor(s, 0, g);
    return cg::broadcast(t + b, 0, g);
  };
}

cg::graph mixed_on(cg::rank_context& ctx) {
  return cg::trace(mixed(ctx.world()), cg::input<float>({8, 8}), cg::input<float>({8, 8}));
}

}  // namespace preflight_test

using namespace preflight_test;

TEST_CASE("preflight.agree.report_memory_and_trace") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    const cg::preflight_report rep = cg::preflight(world, mixed_on);
    REQUIRE(rep.ok());
    CHECK_NOTHROW(rep.check());
    CHECK(rep.world_size == world);
    REQUIRE(rep.ranks.size() == static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      const cg::graph g = cg::trace(cg::trace_options{.rank = r, .world_size = world}, mixed(cg::group(std::string("0"))),
                                    cg::input<float>({8, 8}), cg::input<float>({8, 8}));
      const cg::memory_plan plan = cg::plan_memory(g);
      const cg::preflight_rank& pr = rep.ranks[static_cast<std::size_t>(r)];
      CHECK(pr.rank == r);
      CHECK(pr.peak_bytes == plan.arena_bytes);
      CHECK(pr.live_peak_bytes == plan.live_peak_bytes);
      CHECK(pr.peak_bytes > 0);
      CHECK(pr.collectives == 4);
      CHECK(pr.predicted_us > 0);
    }
    // One valid JSON document, one process per rank.
    json_reader j{rep.trace_json};
    CHECK(j.document());
    std::set<long> expected;
    for (int r = 0; r < world; ++r) expected.insert(r);
    CHECK(j.pids == expected);
    CHECK(contains(rep.trace_json, "\"rank " + std::to_string(world - 1) + "\""));
    CHECK(contains(rep.trace_json, "\"source\":\""));  // each collective's call site
    CHECK(contains(rep.str(), "issue the same collectives"));
  }
}

TEST_CASE("preflight.agree.mpmd_subgroups_and_passes") {
  // Ranks {0, 1} and {2, 3} run different programs on their own halves: they agree.
  auto program = [](cg::rank_context& ctx) -> cg::graph {
    const cg::group halves(std::vector<std::vector<int>>{{0, 1}, {2, 3}});
    if (ctx.rank() < 2)
      return cg::trace([&](auto a) { return cg::all_reduce(a, "sum", halves); }, cg::input<float>({4}));
    return cg::trace([&](auto a) { return cg::all_gather_tensor(cg::all_reduce(a, "max", halves) * 2.f, 0, halves); },
                     cg::input<float>({4}));
  };
  CHECK(cg::preflight(4, program).ok());
  // Scheduled as a run would be, with passes that merge collectives (agreeing through a
  // threads world) and reorder them.
  cg::preflight_options opt;
  opt.passes = {"bucket_collectives", "sink_waits", "raise_comms", "reorder_compute_for_overlap"};
  const auto rep = cg::preflight(4, program, opt);
  CHECK(rep.ok());
  CHECK(rep.ranks.size() == 4);
  CHECK(cg::preflight(4, mixed_on, opt).ok());
}

TEST_CASE("preflight.mismatch.order_names_each_call_site") {
  std::atomic<int> line_ar{0}, line_ag{0};  // written by the ranks' threads
  auto program = [&](cg::rank_context& ctx) -> cg::graph {
    const cg::group w = ctx.world();
    const bool swap = ctx.rank() == 1;  // a rank-dependent branch
    return cg::trace(
        [&](auto a) {
          if (!swap) {
            line_ar = __LINE__ + 1;
            auto x = cg::all_reduce(a, "sum", w);
            return cg::all_gather_tensor(x, 0, w);
          }
          line_ag = __LINE__ + 1;
          auto x = cg::all_gather_tensor(a, 0, w);
          return cg::all_reduce(x, "sum", w);
        },
        cg::input<float>({4}));
  };
  const auto rep = cg::preflight(2, program);
  REQUIRE_FALSE(rep.ok());
  CHECK(contains(rep.problem, "collective mismatch at collective #0 of group [0, 1]"));
  CHECK(contains(rep.problem, "rank 0 issues all_reduce(f32[4], op=sum, group=[0, 1]) (its collective #"));
  CHECK(contains(rep.problem, site(line_ar)));
  CHECK(contains(rep.problem, "rank 1 issues all_gather_into_tensor("));
  CHECK(contains(rep.problem, site(line_ag)));
  REQUIRE(rep.at.size() == 2);
  CHECK(rep.at[0].rank == 0);
  CHECK(contains(rep.at[0].site, site(line_ar)));
  CHECK(contains(rep.at[1].site, site(line_ag)));
  CHECK(rep.trace_json.empty());
  CHECK(contains(error_of<cg::collective_mismatch_error>([&] { rep.check(); }), site(line_ag)));
  CHECK(contains(rep.str(), "FAILED"));
}

TEST_CASE("preflight.mismatch.shape") {
  std::atomic<int> line{0};  // written by every rank's thread
  auto program = [&](cg::rank_context& ctx) -> cg::graph {
    const std::int64_t n = ctx.rank() == 2 ? 6 : 4;
    return cg::trace(
        [&](auto a) {
          line = __LINE__ + 1;
          return cg::all_reduce(a * 2.f, "sum", ctx.world());
        },
        cg::input<float>({n}));
  };
  const auto rep = cg::preflight(3, program);
  REQUIRE_FALSE(rep.ok());
  CHECK(contains(rep.problem, "rank 2 issues all_reduce(f32[6], op=sum, group=[0, 1, 2]) (its collective #"));
  CHECK(contains(rep.problem, "rank 0 issues all_reduce(f32[4]"));
  CHECK(contains(rep.problem, site(line)));
}

TEST_CASE("preflight.mismatch.missing_collective") {
  std::atomic<int> line{0};  // written by every rank's thread
  auto program = [&](cg::rank_context& ctx) -> cg::graph {
    const bool skip = ctx.rank() == 1;
    return cg::trace(
        [&](auto a) {
          auto x = cg::all_reduce(a, "sum", ctx.world());
          if (skip) return x;
          line = __LINE__ + 1;
          return cg::all_reduce(x, "max", ctx.world());
        },
        cg::input<float>({4}));
  };
  const auto rep = cg::preflight(2, program);
  REQUIRE_FALSE(rep.ok());
  CHECK(contains(rep.problem, "rank 0 issues all_reduce(f32[4], op=max, group=[0, 1]) (its collective #1) at "));
  CHECK(contains(rep.problem, site(line)));
  CHECK(contains(rep.problem, "collective #1 of group [0, 1], but rank 1 issues no more collectives (it issues 1 in all)"));
}

TEST_CASE("preflight.mismatch.subgroup") {
  // Only the group {2, 3} disagrees (a reduce op); {0, 1} is fine and not named.
  auto program = [](cg::rank_context& ctx) -> cg::graph {
    const cg::group halves(std::vector<std::vector<int>>{{0, 1}, {2, 3}});
    const char* op = ctx.rank() == 3 ? "max" : "sum";
    return cg::trace([&](auto a) { return cg::all_reduce(a, op, halves); }, cg::input<float>({4}));
  };
  const auto rep = cg::preflight(4, program);
  REQUIRE_FALSE(rep.ok());
  CHECK(contains(rep.problem, "of group [2, 3]"));
  CHECK(contains(rep.problem, "rank 2 issues all_reduce(f32[4], op=sum, group=[2, 3])"));
  CHECK(contains(rep.problem, "rank 3 issues all_reduce(f32[4], op=max, group=[2, 3])"));
  CHECK_FALSE(contains(rep.problem, "rank 0"));
}

TEST_CASE("preflight.mismatch.cycle_of_groups") {
  // Each pair's own order agrees, but 0 -> {0,1} waits for 1, in {1,2} waiting for 2, in {0,2}
  // waiting for 0: a deadlock no pairwise comparison sees.
  auto program = [](cg::rank_context& ctx) -> cg::graph {
    const std::vector<std::vector<int>> order[3] = {{{0, 1}, {0, 2}}, {{1, 2}, {0, 1}}, {{0, 2}, {1, 2}}};
    const auto& mine = order[ctx.rank()];
    return cg::trace(
        [&](auto a) {
          auto x = cg::all_reduce(a, "sum", cg::group(mine[0]));
          return cg::all_reduce(x, "sum", cg::group(mine[1]));
        },
        cg::input<float>({4}));
  };
  const auto rep = cg::preflight(3, program);
  REQUIRE_FALSE(rep.ok());
  CHECK(contains(rep.problem, "wait on each other"));
  CHECK(contains(rep.problem, "rank 0 waits in all_reduce(f32[4], op=sum, group=[0, 1]) (its collective #"));
  CHECK(contains(rep.problem, "for rank 1"));
  CHECK(rep.at.size() == 3);
}

TEST_CASE("preflight.program_errors") {
  // A program that runs collectives on data: preflight says it only traces.
  const auto eager = cg::preflight(2, [](cg::rank_context& ctx) -> cg::graph {
    (void)cg::all_reduce(cg::zeros<float>({4}), "sum", ctx.world());
    return {};
  });
  REQUIRE_FALSE(eager.ok());
  CHECK(contains(eager.problem, "rank 0's program failed while tracing"));
  CHECK(contains(eager.problem, "preflight only traces"));
  CHECK(contains(eager.problem, "test_preflight.cpp:"));
  // A program that throws on one rank.
  const auto thrown = cg::preflight(4, [](cg::rank_context& ctx) -> cg::graph {
    if (ctx.rank() == 2) throw cg::error("no model for rank 2");
    return mixed_on(ctx);
  });
  CHECK(contains(thrown.problem, "rank 2's program failed while tracing: no model for rank 2"));
  CHECK(contains(error_of([] { (void)cg::preflight(0, mixed_on); }), "world size must be in [1, 4096], got 0"));
}

TEST_CASE("preflight.main.command_line") {
  std::ostringstream out, err;
  auto run_main = [&](std::vector<std::string> args, auto program) {
    out.str({});
    err.str({});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return cg::preflight_main(static_cast<int>(argv.size()), argv.data(), program, out, err);
  };
  const std::string path = "test_preflight_trace.json";
  std::remove(path.c_str());
  CHECK(run_main({"pf", "--world", "4", "--trace", path, "--passes", "sink_waits,raise_comms"}, mixed_on) == 0);
  CAPTURE(out.str());
  CHECK(contains(out.str(), "preflight: 4 ranks issue the same collectives"));
  CHECK(contains(out.str(), "rank 3: 4 collectives"));
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  json_reader j{text.str()};
  CHECK(j.document());
  CHECK(j.pids == std::set<long>{0, 1, 2, 3});
  std::remove(path.c_str());

  auto bad = [](cg::rank_context& ctx) -> cg::graph {
    const std::int64_t n = ctx.rank() == 0 ? 4 : 8;
    return cg::trace([&](auto a) { return cg::all_reduce(a, "sum", ctx.world()); }, cg::input<float>({n}));
  };
  CHECK(run_main({"pf"}, bad) == 1);
  CHECK(contains(out.str(), "FAILED"));
  CHECK(run_main({"pf", "--world", "0"}, mixed_on) == 2);
  CHECK(contains(err.str(), "--world='0' is not a whole number from 1 to 4096"));
  CHECK(contains(err.str(), "usage: pf"));
  CHECK(run_main({"pf", "--frobnicate"}, mixed_on) == 2);
  CHECK(contains(err.str(), "unknown argument '--frobnicate'"));
  CHECK(run_main({"pf", "--passes", "sink_waits,nope"}, mixed_on) == 2);
  CHECK(contains(err.str(), "unknown pass 'nope'"));
  CHECK(run_main({"pf", "--help"}, mixed_on) == 0);
  CHECK(contains(out.str(), "--world N"));
}

TEST_CASE("preflight.runtime_errors_name_call_sites") {
  // The threads backend's own mismatch check: both ranks' calls, with their lines.
  std::atomic<int> line0{0}, line1{0};  // written by the ranks' threads
  std::vector<std::string> msgs(2);
  try {
    cg::run_threads(2, [&](cg::rank_context& ctx) {
      try {
        if (ctx.rank() == 0) {
          line0 = __LINE__ + 1;
          (void)cg::all_reduce(cg::zeros<float>({4}), "sum", ctx.world()).to_vector();
        } else {
          line1 = __LINE__ + 1;
          (void)cg::all_reduce(cg::zeros<float>({4}), "max", ctx.world()).to_vector();
        }
      } catch (const cg::collective_mismatch_error& e) {
        msgs[static_cast<std::size_t>(ctx.rank())] = e.what();
        throw;
      }
    }, threads_opts(std::chrono::seconds(20)));
  } catch (const cg::collective_mismatch_error&) {
  }
  for (const auto& m : msgs) {
    CAPTURE(m);
    CHECK(contains(m, site(line0)));
    CHECK(contains(m, site(line1)));
  }
  // verify_collective_order on traced graphs: the call sites are the traced calls.
  std::atomic<int> vline{0};  // written by both ranks' threads
  std::vector<std::string> vmsgs(2);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    const std::int64_t n = ctx.rank() == 0 ? 4 : 8;
    const cg::graph g = cg::trace(
        [&](auto a) {
          vline = __LINE__ + 1;
          return cg::all_reduce(a, "sum", ctx.world());
        },
        cg::input<float>({n}));
    try {
      cg::verify_collective_order(g, ctx);
    } catch (const cg::collective_mismatch_error& e) {
      vmsgs[static_cast<std::size_t>(ctx.rank())] = e.what();
    }
  }, threads_opts(std::chrono::seconds(20)));
  for (const auto& m : vmsgs) {
    CAPTURE(m);
    CHECK(contains(m, "rank 0 issues all_reduce(f32[4], op=sum, group=[0, 1]) (its collective #"));
    CHECK(contains(m, site(vline)));
  }
  // A compiled graph names the traced call too: the executor passes the node's site on.
  std::atomic<int> cline{0};  // written by both ranks' threads
  std::vector<std::string> cmsgs(2);
  try {
    cg::run_threads(2, [&](cg::rank_context& ctx) {
      const bool other = ctx.rank() == 1;
      auto g = cg::trace(
          [&](auto a) {
            cline = __LINE__ + 1;
            return cg::all_reduce(a, other ? "max" : "sum", ctx.world());
          },
          cg::input<float>({4}));
      auto exe = cg::compile(g, ctx);
      try {
        (void)exe(cg::zeros<float>({4})).to_vector();
      } catch (const cg::collective_mismatch_error& e) {
        cmsgs[static_cast<std::size_t>(ctx.rank())] = e.what();
        throw;
      }
    }, threads_opts(std::chrono::seconds(20)));
  } catch (const cg::collective_mismatch_error&) {
  }
  for (const auto& m : cmsgs) {
    CAPTURE(m);
    CHECK(contains(m, site(cline)));
  }
}
