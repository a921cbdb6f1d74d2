// tests/schedule/test_agreement.cpp: the passes that merge or split collectives agree across the
// members of each group (ccgraph/schedule/agreement.hpp), so every member issues the same
// collectives even where ranks run different programs: the repro (a subgroup some
// ranks skip between two world collectives), dependences and producers that differ per rank,
// MPMD partitions, options that differ per rank, and random programs with skipped subgroups
// through every pass and many pass sequences on 2, 3 and 4 ranks, each rank's scheduled graph
// run and compared with eager execution. The reordering passes keep each rank's collective
// order. Without agreement (collective_agreement::spmd) the same programs mismatch.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/runtime/verify.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

/// Collectives fail within seconds, not the default 300 s, if a schedule ever mismatches.
cg::threads_options short_timeout() { return threads_opts(std::chrono::seconds(10)); }

/// The collectives of `g`, in order, as call-shaped text.
std::vector<std::string> collectives_of(const cg::graph& g) {
  std::vector<std::string> out;
  for (const cg::node* n : g.nodes())
    if (n->is_collective()) {
      std::vector<cg::tensor_meta> in;
      for (auto& a : n->args()) in.push_back(a.src->meta(a.index));
      out.push_back(cg::ops::signature(*n->collective(), in, *n->group()).str());
    }
  return out;
}

/// The repro on 3 ranks: a and c on the world, b on {0, 1} between them, which rank 2
/// skips. Alone, rank 2 would merge a and c (nothing lies between them in its graph).
auto repro(int rank) {
  return [rank](auto x) {
    auto a = cg::all_reduce(x, "sum", cg::group{std::vector<int>{0, 1, 2}});
    auto b = rank < 2 ? decltype(a)(cg::all_reduce(x, "sum", cg::group{std::vector<int>{0, 1}})) : x;
    auto c = cg::all_reduce(x, "sum", cg::group{std::vector<int>{0, 1, 2}});
    return cg::eval(a + b * 2.f + c * 3.f);
  };
}

}  // namespace

TEST_CASE("agreement.repro.skipped_subgroup_between_world_collectives") {
  std::vector<int> merged(3, -1);
  std::vector<char> same(3, 0);
  cg::run_threads(3, [&](cg::rank_context& ctx) {
    const auto prog = repro(ctx.rank());
    const auto g = cg::trace(prog, cg::input<float>({4}));
    const auto s = cg::schedule(g, {"bucket_collectives"});
    merged[static_cast<std::size_t>(ctx.rank())] = static_cast<int>(s.count("all_reduce_coalesced"));
    const auto x = cg::full<float>({4}, static_cast<float>(ctx.rank() + 1));
    cg::verify_collective_order(s, ctx);
    same[static_cast<std::size_t>(ctx.rank())] = cg::compile(s, ctx)(x).to_vector() == prog(x).to_vector();
  }, short_timeout());
  CHECK(merged == std::vector<int>{0, 0, 0});  // rank 2 would merge a and c alone
  CHECK(same == std::vector<char>{1, 1, 1});

  // Each rank deciding alone (what every rank did before): rank 2 issues a coalesced
  // all_reduce where ranks 0 and 1 issue a plain one.
  const std::string msg = error_of<cg::collective_mismatch_error>([] {
    cg::run_threads(3, [](cg::rank_context& ctx) {
      cg::schedule_options spmd;
      spmd.agreement = cg::collective_agreement::spmd;
      const auto s = cg::schedule(cg::trace(repro(ctx.rank()), cg::input<float>({4})), {"bucket_collectives"}, spmd);
      (void)cg::compile(s, ctx)(cg::full<float>({4}, 1.f)).to_vector();
    }, short_timeout());
  });
  CHECK(contains(msg, "all_reduce_coalesced"));
}

TEST_CASE("agreement.bucket.dependence_on_one_rank_only") {
  // On rank 1 the second all_reduce reads the first one's result: the two cannot share a
  // bucket there, so they share none anywhere. With the dependence on no rank they merge.
  for (bool dependent : {true, false}) {
    std::vector<int> merged(2, -1);
    std::vector<char> same(2, 0);
    cg::run_threads(2, [&](cg::rank_context& ctx) {
      auto prog = [&](auto x, auto y) {
        auto a = cg::all_reduce(x, "sum", ctx.world());
        auto in = dependent && ctx.rank() == 1 ? decltype(a)(cg::matmul(a, y)) : decltype(a)(cg::matmul(x, y));
        auto c = cg::all_reduce(in, "sum", ctx.world());
        return cg::eval(a + c);
      };
      const auto g = cg::trace(prog, cg::input<float>({4, 4}), cg::input<float>({4, 4}));
      const auto s = cg::schedule(g, {"bucket_collectives", "overlap"});
      merged[static_cast<std::size_t>(ctx.rank())] = static_cast<int>(s.count("all_reduce_coalesced"));
      const auto x = cg::uniform<float>({4, 4}, -1, 1, 10 + static_cast<std::uint64_t>(ctx.rank()));
      const auto y = cg::uniform<float>({4, 4}, -1, 1, 20 + static_cast<std::uint64_t>(ctx.rank()));
      same[static_cast<std::size_t>(ctx.rank())] = cg::compile(s, ctx)(x, y).to_vector() == prog(x, y).to_vector();
    }, short_timeout());
    CHECK(merged == std::vector<int>(2, dependent ? 0 : 1));
    CHECK(same == std::vector<char>{1, 1});
  }
}

TEST_CASE("agreement.decompose.producer_read_elsewhere_on_one_rank") {
  // y = x @ w -> all_reduce: rank 1 also reads y, so it cannot split the matmul; no rank
  // splits. Where every rank can, every rank splits into the same 4 chunks.
  for (bool blocked : {true, false}) {
    std::vector<int> all_reduces(2, -1);
    std::vector<char> same(2, 0);
    cg::run_threads(2, [&](cg::rank_context& ctx) {
      auto prog = [&](auto x, auto w) {
        auto y = cg::matmul(x, w);
        auto r = cg::wait_tensor(cg::all_reduce(y, "sum", ctx.world()));
        return blocked && ctx.rank() == 1 ? decltype(r)(cg::eval(r + y)) : r;
      };
      const auto g = cg::trace(prog, cg::input<float>({16, 8}), cg::input<float>({8, 8}));
      const auto s = cg::schedule(g, {"decompose_matmul_collectives", "overlap"});
      all_reduces[static_cast<std::size_t>(ctx.rank())] = static_cast<int>(s.count("all_reduce"));
      const auto x = cg::uniform<float>({16, 8}, -1, 1, 30 + static_cast<std::uint64_t>(ctx.rank()));
      const auto w = cg::uniform<float>({8, 8}, -1, 1, 40 + static_cast<std::uint64_t>(ctx.rank()));
      same[static_cast<std::size_t>(ctx.rank())] = cg::compile(s, ctx)(x, w).to_vector() == prog(x, w).to_vector();
    }, short_timeout());
    CHECK(all_reduces == std::vector<int>(2, blocked ? 1 : 4));
    CHECK(same == std::vector<char>{1, 1});
  }
}

TEST_CASE("agreement.mpmd_partition.parts_decide_apart") {
  // Pairs {0, 1} and {2, 3} each reduce among themselves (one partition of the world); on
  // rank 3 the second reduction depends on the first. Pair {0, 1} merges, pair {2, 3} does not.
  std::vector<int> merged(4, -1);
  std::vector<char> same(4, 0);
  cg::run_threads(4, [&](cg::rank_context& ctx) {
    const cg::group pairs{std::vector<std::vector<int>>{{0, 1}, {2, 3}}};
    auto prog = [&](auto x) {
      auto a = cg::all_reduce(x, "sum", pairs);
      auto in = ctx.rank() == 3 ? decltype(a)(a * 2.f) : decltype(a)(x * 2.f);
      auto c = cg::all_reduce(in, "sum", pairs);
      auto d = cg::all_reduce(c, "max", ctx.world());
      return cg::eval(a + d);
    };
    const auto g = cg::trace(prog, cg::input<float>({4}));
    const auto s = cg::schedule(g, {"bucket_collectives", "sink_waits"});
    merged[static_cast<std::size_t>(ctx.rank())] = static_cast<int>(s.count("all_reduce_coalesced"));
    const auto x = cg::uniform<float>({4}, -1, 1, 50 + static_cast<std::uint64_t>(ctx.rank()));
    same[static_cast<std::size_t>(ctx.rank())] = cg::compile(s, ctx)(x).to_vector() == prog(x).to_vector();
  }, short_timeout());
  CHECK(merged == std::vector<int>{1, 1, 0, 0});
  CHECK(same == std::vector<char>{1, 1, 1, 1});
}

TEST_CASE("agreement.options_that_differ_per_rank.change_nothing") {
  // Rank 1 asks for a smaller bucket cap (or other chunks): the members' hashes differ, so the
  // pass changes nothing in that group, on every rank, and nothing mismatches.
  std::vector<int> collectives(2, -1);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    auto prog = [&](auto x, auto w) {
      auto a = cg::all_reduce(x, "sum", ctx.world());
      auto b = cg::all_reduce(cg::matmul(x, w), "sum", ctx.world());
      return cg::eval(a + b);
    };
    const auto g = cg::trace(prog, cg::input<float>({8, 8}), cg::input<float>({8, 8}));
    cg::schedule_options opt;
    opt.bucket_cap_bytes = ctx.rank() == 1 ? 1 << 10 : 1 << 20;
    opt.decompose_chunks = ctx.rank() == 1 ? 2 : 4;
    const auto s = cg::schedule(g, {"decompose_matmul_collectives", "bucket_collectives"}, opt);
    collectives[static_cast<std::size_t>(ctx.rank())] = static_cast<int>(collectives_of(s).size());
    const auto x = cg::uniform<float>({8, 8}, -1, 1, 60 + static_cast<std::uint64_t>(ctx.rank()));
    CHECK(cg::compile(s, ctx)(x, x).to_vector() == prog(x, x).to_vector());
  }, short_timeout());
  CHECK(collectives == std::vector<int>{2, 2});
}

TEST_CASE("agreement.only_some_ranks_agreeing.is_a_mismatch_not_a_hang") {
  // Rank 0 agrees, rank 1 decides alone (spmd): rank 0's agreement all_reduce meets rank 1's
  // first program collective, which the threads backend reports at once.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of<cg::collective_mismatch_error>([] {
    cg::run_threads(2, [](cg::rank_context& ctx) {
      auto prog = [&](auto x) {
        auto a = cg::all_reduce(x, "sum", ctx.world());
        auto b = cg::all_reduce(x * 2.f, "sum", ctx.world());
        return cg::eval(a + b);
      };
      cg::schedule_options opt;
      if (ctx.rank() == 1) opt.agreement = cg::collective_agreement::spmd;
      const auto s = cg::schedule(cg::trace(prog, cg::input<float>({4})), {"bucket_collectives"}, opt);
      (void)cg::compile(s, ctx)(cg::full<float>({4}, 1.f)).to_vector();
    }, threads_opts(std::chrono::seconds(60)));
  });
  CHECK(!msg.empty());
  CHECK(contains(msg, "i64[2]"));  // the agreement's all_reduce is named
  CHECK(seconds_since(t0) < 30);
}

TEST_CASE("agreement.graph_of_another_rank.is_an_error") {
  // Rank 0's thread schedules the graph rank 1 would run: it cannot agree for rank 1.
  std::string msg;
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    if (ctx.rank() != 0) return;
    const auto g = cg::trace(world(2, 1), [](auto x) {
      auto a = cg::all_reduce(x, "sum", cg::group{std::vector<int>{1}});
      auto b = cg::all_reduce(x, "sum", cg::group{std::vector<int>{1}});
      return cg::eval(a + b);
    }, cg::input<float>({4}));
    msg = error_of([&] { (void)cg::schedule(g, {"bucket_collectives"}); });
    // Deciding from the graph alone is always possible.
    cg::schedule_options spmd;
    spmd.agreement = cg::collective_agreement::spmd;
    CHECK(cg::schedule(g, {"bucket_collectives"}, spmd).count("all_reduce_coalesced") == 1);
  }, short_timeout());
  CHECK(contains(msg, "bucket_collectives: the graph has a collective on group [1], which rank 0"));
  CHECK(contains(msg, "collective_agreement::spmd"));
}

namespace {

/// A random program on [8, 8] values over the world and three random subgroups (singletons
/// included, so even 2 ranks skip some), which ranks outside a group skip (taking a value
/// they already have instead), with dependences and extra readers that differ per rank: a
/// valid program (each group's members issue the same collectives), different on every rank.
/// Every rank draws the same numbers.
template <class V>
V skipping_program(V x, V w, std::uint32_t seed, int rank, int world) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int>> groups{iota_ranks(world)};
  for (int k = 0; k < 3; ++k) {
    std::vector<int> g;
    const std::uint32_t bits = rng();
    for (int r = 0; r < world; ++r)
      if (bits >> r & 1u) g.push_back(r);
    if (g.empty()) g.push_back(static_cast<int>(bits % static_cast<std::uint32_t>(world)));
    groups.push_back(g);
  }
  std::vector<V> vals{x, w};
  for (int step = 0; step < 20; ++step) {
    const std::uint32_t op = rng() % 11, ia = rng(), ib = rng(), ig = rng(), ir = rng();
    const V a = vals[ia % vals.size()];
    const V b = vals[ib % vals.size()];
    const std::vector<int>& grp = groups[ig % groups.size()];
    const cg::group G{grp};
    const auto size = static_cast<std::int64_t>(grp.size());
    const bool member = std::find(grp.begin(), grp.end(), rank) != grp.end();
    const bool odd = (static_cast<std::uint32_t>(rank) + ir) % 3 == 0;  // differs per rank
    switch (op) {
      case 0: vals.push_back(V(cg::relu(a) * 0.5f + b)); break;
      case 1: vals.push_back(V(cg::matmul(a, b) * 0.125f)); break;
      case 2: vals.push_back(member ? V(cg::all_reduce(a, "sum", G)) : a); break;
      case 3: {  // a matmul all_reduced: split unless the product has another reader
        const V y = cg::matmul(a, b);
        if (!member) {
          vals.push_back(y);
          break;
        }
        const V r = cg::all_reduce(y, "sum", G);
        vals.push_back(odd ? V(r + y) : r);
        break;
      }
      case 4: vals.push_back(member ? V(cg::all_gather_tensor(a, 0, G).narrow(0, 0, 8)) : a); break;
      case 5: {  // all_gather -> matmul: split unless the gathered value has another reader
        if (!member) {
          vals.push_back(V(cg::matmul(a, b)));
          break;
        }
        const V gathered = cg::all_gather_tensor(a, 0, G);
        const V m = V(cg::matmul(gathered, b)).narrow(0, 0, 8);
        vals.push_back(odd ? V(m + gathered.narrow(0, 0, 8)) : m);
        break;
      }
      case 6:
        if (member && 8 % size == 0) {
          const V rs = cg::reduce_scatter_tensor(a, "sum", 0, G);
          vals.push_back(cg::cat(std::vector<V>(static_cast<std::size_t>(size), rs), 0));
        } else {
          vals.push_back(V(a * 0.25f));
        }
        break;
      case 7: vals.push_back(odd ? V(cg::matmul(a, b)) : V(a - b)); break;  // per-rank dependences
      case 8: vals.push_back(member ? V(cg::all_reduce(a, "max", G)) : a); break;
      case 9: vals.push_back(member ? V(cg::broadcast(a, grp.front(), G)) : a); break;
      default: vals.push_back(a.transpose(0, 1).contiguous()); break;
    }
  }
  return V(vals.back() + vals[vals.size() / 2]);
}

const std::vector<std::string> reordering_passes = {"sink_waits", "raise_comms", "reorder_compute_for_overlap", "overlap"};

/// Every pass alone; each rewriting pass followed and preceded by each reordering pass; both
/// rewriting passes in both orders, and with a reordering pipeline after them.
std::vector<std::vector<std::string>> agreement_pass_lists() {
  std::vector<std::vector<std::string>> out;
  for (const auto& p : cg::schedule_pass_names()) out.push_back({std::string(p)});
  for (const char* rewrite : {"bucket_collectives", "decompose_matmul_collectives"})
    for (const auto& r : reordering_passes) {
      out.push_back({rewrite, r});
      out.push_back({r, rewrite});
    }
  out.push_back({"bucket_collectives", "decompose_matmul_collectives"});
  out.push_back({"decompose_matmul_collectives", "bucket_collectives"});
  out.push_back({"decompose_matmul_collectives", "bucket_collectives", "overlap"});
  out.push_back({"bucket_collectives", "decompose_matmul_collectives", "sink_waits", "raise_comms",
                 "reorder_compute_for_overlap"});
  return out;
}

bool rewrites_collectives(const std::vector<std::string>& passes) {
  return std::find_if(passes.begin(), passes.end(), [](const std::string& p) {
           return p == "bucket_collectives" || p == "decompose_matmul_collectives";
         }) != passes.end();
}

}  // namespace

TEST_CASE("agreement.random_programs.skipped_subgroups_every_pass") {
  const auto lists = agreement_pass_lists();
  // Over all programs: schedules that merged or split something, members whose own graph
  // alone would have decided otherwise (so the agreement mattered), and programs whose
  // rank-by-rank (spmd) schedules mismatch.
  std::atomic<int> changed{0}, vetoed{0}, spmd_mismatches{0};
  for (int world : {2, 3, 4}) {
    for (std::uint32_t seed = 1; seed <= 8; ++seed) {
      std::vector<int> failures(static_cast<std::size_t>(world), 0);
      std::vector<std::string> first_failure(static_cast<std::size_t>(world));
      cg::run_threads(world, [&](cg::rank_context& ctx) {
        const int rank = ctx.rank();
        auto prog = [&](auto x, auto w) { return skipping_program(x, w, seed, rank, world); };
        const auto g = cg::trace(prog, cg::input<float>({8, 8}), cg::input<float>({8, 8}));
        const auto x = cg::uniform<float>({8, 8}, -1, 1, seed * 100 + static_cast<std::uint64_t>(rank));
        const auto w = cg::uniform<float>({8, 8}, -1, 1, seed * 100 + 50 + static_cast<std::uint64_t>(rank));
        const auto expected = prog(x, w).to_vector();
        const auto comms = collectives_of(g);
        auto fail = [&](const std::vector<std::string>& passes, const std::string& what) {
          auto& n = failures[static_cast<std::size_t>(rank)];
          if (n++ == 0) {
            std::string p;
            for (auto& s : passes) p += s + " ";
            first_failure[static_cast<std::size_t>(rank)] = "passes [" + p + "]: " + what;
          }
        };
        cg::schedule_options spmd;
        spmd.agreement = cg::collective_agreement::spmd;
        for (const auto& passes : lists) {
          const auto s = cg::schedule(g, passes);
          if (!rewrites_collectives(passes) && collectives_of(s) != comms) fail(passes, "collective order changed");
          if (rewrites_collectives(passes) && s.size() != g.size()) ++changed;
          if (rewrites_collectives(passes) && cg::to_string(cg::schedule(g, passes, spmd)) != cg::to_string(s)) ++vetoed;
          try {
            cg::verify_collective_order(s, ctx);
          } catch (const cg::collective_mismatch_error& e) {
            fail(passes, e.what());
          }
          if (cg::compile(s, ctx)(x, w).to_vector() != expected) fail(passes, "results differ from eager");
        }
        // Each rank deciding alone, through both rewriting passes.
        const auto alone = cg::schedule(g, {"decompose_matmul_collectives", "bucket_collectives"}, spmd);
        try {
          cg::verify_collective_order(alone, ctx);
        } catch (const cg::collective_mismatch_error&) {
          if (rank == 0) ++spmd_mismatches;
        }
      }, short_timeout());
      for (int r = 0; r < world; ++r) {
        INFO("world ", world, ", seed ", seed, ", rank ", r, ": ", first_failure[static_cast<std::size_t>(r)]);
        CHECK(failures[static_cast<std::size_t>(r)] == 0);
      }
    }
  }
  // The programs exercise what the agreement is for.
  CHECK(changed > 0);
  CHECK(vetoed > 0);
  CHECK(spmd_mismatches > 0);
}
