// tests/runtime/test_threads.cpp: the threads backend of ccgraph/runtime/threads.hpp: ranks as
// threads, real asynchrony through per-rank communication workers, and failures that end the
// world promptly with a message naming who did what (abort, mismatch, timeout, early exit).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ccgraph/core/error.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/runtime/threads.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// Spins (politely) until `pred` holds or `limit` passes; returns `pred()`.
template <class P>
bool eventually(P pred, milliseconds limit = milliseconds(5000)) {
  const auto deadline = clock_type::now() + limit;
  while (!pred() && clock_type::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
  return pred();
}

/// What one rank saw: the kind of error it got and its message.
struct outcome {
  enum kind_t { none, mismatch, aborted, timeout, other } kind = none;
  std::string message;
};

/// Runs `body` on `n` ranks, recording each rank's error (and rethrowing it), and returns the
/// outcomes and the exception run_threads rethrew (checked by the caller).
template <class F>
std::vector<outcome> run_recording(int n, F body, std::exception_ptr& thrown,
                                   cg::threads_options o = threads_opts()) {
  std::vector<outcome> out(static_cast<std::size_t>(n));
  try {
    cg::run_threads(
        n,
        [&](cg::rank_context& ctx) {
          auto& me = out[static_cast<std::size_t>(ctx.rank())];
          try {
            body(ctx);
          } catch (const cg::collective_mismatch_error& e) {
            me = {outcome::mismatch, e.what()};
            throw;
          } catch (const cg::aborted_error& e) {
            me = {outcome::aborted, e.what()};
            throw;
          } catch (const cg::timeout_error& e) {
            me = {outcome::timeout, e.what()};
            throw;
          } catch (const std::exception& e) {
            me = {outcome::other, e.what()};
            throw;
          }
        },
        o);
  } catch (...) {
    thrown = std::current_exception();
  }
  return out;
}

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "<not a std::exception>";
  }
}

}  // namespace

// ================================== basics ==================================

TEST_CASE("run_threads.basics.world_sizes_1_to_16") {
  for (int n = 1; n <= 16; ++n) {
    std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
    std::atomic<int> bad{0};
    cg::run_threads(
        n,
        [&](cg::rank_context& ctx) {
          if (ctx.world_size() != n || ctx.rank() < 0 || ctx.rank() >= n) {
            ++bad;
            return;
          }
          ++seen[static_cast<std::size_t>(ctx.rank())];
          if (!ctx.device().is_cpu() || ctx.device() != cg::device::cpu()) ++bad;
          const auto w = ctx.resolve(ctx.world(), "test");
          std::vector<int> all(static_cast<std::size_t>(n));
          std::iota(all.begin(), all.end(), 0);
          if (w.name != "0" || w.ranks != all) ++bad;
          // The context is this thread's: collectives find it without being handed it.
          if (&cg::detail::current_rank("test") != &ctx) ++bad;
        },
        threads_opts());
    CAPTURE(n);
    CHECK(bad == 0);
    for (auto& s : seen) CHECK(s == 1);  // each rank ran exactly once
  }
  // No context leaks to the calling thread.
  CHECK(cg::detail::current_rank_ptr() == nullptr);
  CHECK_THROWS_WITH_AS(cg::run_threads(0, [](cg::rank_context&) {}),
                       "run_threads: world size must be in [1, 4096], got 0", cg::error);
}

TEST_CASE("run_threads.default_timeout_from_env") {
  ::setenv("CCGRAPH_TIMEOUT_MS", "1234", 1);
  CHECK(cg::threads_options::default_timeout() == milliseconds(1234));
  // A value that does not parse is an error naming the variable, not the default.
  ::setenv("CCGRAPH_TIMEOUT_MS", "nonsense", 1);
  CHECK_THROWS_WITH_AS(cg::threads_options{}, doctest::Contains("CCGRAPH_TIMEOUT_MS='nonsense'"),
                       cg::error);
  ::unsetenv("CCGRAPH_TIMEOUT_MS");
  CHECK(cg::threads_options::default_timeout() == milliseconds(300000));
  CHECK(cg::threads_options{}.timeout == milliseconds(300000));
}

TEST_CASE("run_threads.results_bitwise_identical_on_every_rank") {
  constexpr int n = 8;
  constexpr std::int64_t len = 1000;
  // Real-valued data, so the result depends on the summation order.
  std::array<std::vector<float>, n> f32;
  std::array<std::vector<cg::bf16>, n> bf;
  std::array<std::vector<double>, n> f64;
  cg::run_threads(
      n,
      [&](cg::rank_context& ctx) {
        const auto seed = static_cast<std::uint64_t>(ctx.rank());
        const auto r = static_cast<std::size_t>(ctx.rank());
        f32[r] = cg::all_reduce(cg::uniform<float>({len}, -1, 1, seed), "sum", ctx.world()).to_vector();
        bf[r] = cg::all_reduce(cg::uniform<cg::bf16>({len}, -1, 1, seed), "avg", ctx.world()).to_vector();
        f64[r] = cg::all_reduce(cg::uniform<double>({len}, -1, 1, seed), "sum", ctx.world()).to_vector();
      },
      threads_opts());
  for (std::size_t r = 1; r < n; ++r) {
    CAPTURE(r);
    CHECK(std::memcmp(f32[r].data(), f32[0].data(), len * sizeof(float)) == 0);
    CHECK(std::memcmp(bf[r].data(), bf[0].data(), len * sizeof(cg::bf16)) == 0);
    CHECK(std::memcmp(f64[r].data(), f64[0].data(), len * sizeof(double)) == 0);
  }
  // And it is the sum in rank order, accumulated in float.
  std::vector<float> want(len, 0.f);
  for (int r = 0; r < n; ++r) {
    const auto in = cg::uniform<float>({len}, -1, 1, static_cast<std::uint64_t>(r)).to_vector();
    for (std::int64_t i = 0; i < len; ++i) want[static_cast<std::size_t>(i)] += in[static_cast<std::size_t>(i)];
  }
  CHECK(std::memcmp(f32[0].data(), want.data(), len * sizeof(float)) == 0);
}

// ============================ asynchrony and ordering ============================

TEST_CASE("async.compute_overlaps_a_pending_collective") {
  // Rank 1 joins only after rank 0 has computed, so rank 0's result is provably pending while
  // its own thread computes.
  std::atomic<bool> computed{false};
  cg::run_threads(
      2,
      [&](cg::rank_context& ctx) {
        auto in = cg::full<float>({64}, static_cast<float>(ctx.rank() + 1));
        if (ctx.rank() == 1) {
          CHECK(eventually([&] { return computed.load(); }));
          CHECK(cg::all_reduce(in, "sum", ctx.world()).to_vector() == std::vector<float>(64, 3.f));
          return;
        }
        auto r = cg::all_reduce(in, "sum", ctx.world());
        CHECK(r.is_pending());
        double acc = 0;  // compute on the rank thread while the collective is outstanding
        for (int i = 1; i <= 100000; ++i) acc += 1.0 / i;
        CHECK(acc > 12.0);
        CHECK(r.is_pending());
        computed = true;
        CHECK(r.to_vector() == std::vector<float>(64, 3.f));
        CHECK_FALSE(r.is_pending());
      },
      threads_opts());
}

TEST_CASE("async.progress_without_waiting") {
  // Every rank issues and then only polls: the workers complete the collective by themselves.
  cg::run_threads(
      4,
      [&](cg::rank_context& ctx) {
        auto r = cg::all_reduce(cg::full<std::int64_t>({8}, ctx.rank()), "sum", ctx.world());
        std::int64_t busy = 0;
        const bool done = eventually([&] {
          for (int i = 0; i < 1000; ++i) busy += i;  // the rank thread keeps working
          return !r.is_pending();
        });
        CHECK(done);
        CHECK(busy > 0);
        CHECK(r.to_vector() == std::vector<std::int64_t>(8, 6));
      },
      threads_opts());
}

TEST_CASE("async.chained_collectives_on_pending_inputs") {
  cg::run_threads(
      4,
      [&](cg::rank_context& ctx) {
        const int me = ctx.rank();
        auto x = cg::full<std::int32_t>({2, 3}, me + 1);
        auto a = cg::all_reduce(x, "sum", ctx.world());                         // 10
        auto b = cg::all_reduce(a, "sum", ctx.world());                         // 40, a still pending
        auto pair = cg::group{std::vector<std::vector<int>>{{0, 1}, {2, 3}}};
        auto c = cg::all_reduce(b, "max", pair);                                // 40
        auto d = cg::all_gather_tensor(c.reshape({6}), 0, ctx.world());         // [24] of 40
        auto e = cg::reduce_scatter_tensor(d, "sum", 0, ctx.world());           // [6] of 160
        auto f = cg::broadcast(e, 3, ctx.world());
        CHECK(a.pending_work() != nullptr);  // nothing above waited on a
        CHECK(f.to_vector() == std::vector<std::int32_t>(6, 160));
        CHECK(d.to_vector() == std::vector<std::int32_t>(24, 40));
        CHECK(b.to_vector() == std::vector<std::int32_t>(6, 40));
        CHECK(a.to_vector() == std::vector<std::int32_t>(6, 10));
        CHECK(x.to_vector() == std::vector<std::int32_t>(6, me + 1));
      },
      threads_opts());
}

TEST_CASE("async.many_back_to_back_collectives") {
  constexpr int count = 200;
  cg::run_threads(
      4,
      [&](cg::rank_context& ctx) {
        std::vector<cg::tensor<std::int64_t>> results;
        for (int i = 0; i < count; ++i)
          results.push_back(cg::all_reduce(cg::full<std::int64_t>({1}, ctx.rank() + i), "sum", ctx.world()));
        int wrong = 0;
        for (int i = 0; i < count; ++i)
          if (results[static_cast<std::size_t>(i)].item() != 4 * i + 6) ++wrong;
        CHECK(wrong == 0);
      },
      threads_opts());
}

TEST_CASE("async.unwaited_results_are_completed_before_run_threads_returns") {
  std::array<cg::tensor<float>, 3> kept;
  cg::run_threads(
      3,
      [&](cg::rank_context& ctx) {
        kept[static_cast<std::size_t>(ctx.rank())] =
            cg::all_reduce(cg::full<float>({4}, 1.f), "sum", ctx.world());  // never waited here
      },
      threads_opts());
  for (auto& t : kept) {
    CHECK_FALSE(t.is_pending());
    CHECK(t.to_vector() == std::vector<float>(4, 3.f));
  }
}

TEST_CASE("stress.world16_mixed_collectives") {
  constexpr int n = 16;
  constexpr int iterations = 8;
  cg::run_threads(
      n,
      [&](cg::rank_context& ctx) {
        const int me = ctx.rank();
        const cg::group halves{std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5, 6, 7},
                                                              {8, 9, 10, 11, 12, 13, 14, 15}}};
        const cg::device_mesh mesh({4, 4});
        int wrong = 0;
        for (int it = 0; it < iterations; ++it) {
          auto x = cg::full<std::int64_t>({n}, me + it);
          auto sum = cg::all_reduce(x, "sum", ctx.world());                     // 120 + 16 it
          auto half = cg::all_reduce(x, "max", halves);                          // 7|15 + it
          auto col = cg::all_reduce(x, "sum", cg::group{mesh, 0});               // 4 (me%4) + 24 + 4 it
          auto gathered = cg::all_gather_tensor(x.narrow(0, 0, 1), 0, ctx.world());  // [r + it]
          auto a2a = cg::all_to_all_single(cg::arange<std::int64_t>(n), std::nullopt, std::nullopt,
                                           ctx.world());                         // all = me
          auto bc = cg::broadcast(x, it % n, ctx.world());                       // it % n + it
          if (sum.to_vector() != std::vector<std::int64_t>(n, 120 + 16 * it)) ++wrong;
          if (half.to_vector() != std::vector<std::int64_t>(n, (me < 8 ? 7 : 15) + it)) ++wrong;
          if (col.to_vector() != std::vector<std::int64_t>(n, 4 * (me % 4) + 24 + 4 * it)) ++wrong;
          auto g = gathered.to_vector();
          for (int r = 0; r < n; ++r)
            if (g[static_cast<std::size_t>(r)] != r + it) ++wrong;
          if (a2a.to_vector() != std::vector<std::int64_t>(n, me)) ++wrong;
          if (bc.to_vector() != std::vector<std::int64_t>(n, it % n + it)) ++wrong;
        }
        CHECK(wrong == 0);
      },
      threads_opts());
}

TEST_CASE("collectives.every_world_size_1_to_16") {
  // The reference sweeps (tests/ops/test_collectives.cpp) use world sizes 1, 2, 3, 4, 8 and the
  // stress test 16; this covers every size in between, odd ones and primes included, where an
  // off-by-one in splitting, slot assignment or rendezvous would show. Each result has a closed
  // form in (n, rank).
  for (int n = 1; n <= 16; ++n) {
    CAPTURE(n);
    std::atomic<int> wrong{0}, ranks_done{0};
    cg::run_threads(
        n,
        [&](cg::rank_context& ctx) {
          const int me = ctx.rank();
          const std::int64_t nn = n;
          auto expect = [&](bool ok) { wrong += ok ? 0 : 1; };
          // all_reduce: sum of (r + 1) over the ranks, and max.
          const auto x = cg::full<std::int64_t>({3}, me + 1);
          expect(cg::all_reduce(x, "sum", ctx.world()).to_vector() ==
                 std::vector<std::int64_t>(3, nn * (nn + 1) / 2));
          expect(cg::all_reduce(x, "max", ctx.world()).to_vector() == std::vector<std::int64_t>(3, nn));
          // all_gather_tensor on dim 1: column r holds r.
          std::vector<std::int64_t> cols(static_cast<std::size_t>(2 * n));
          for (int r = 0; r < n; ++r) cols[static_cast<std::size_t>(r)] = cols[static_cast<std::size_t>(n + r)] = r;
          expect(cg::all_gather_tensor(cg::full<std::int64_t>({2, 1}, me), 1, ctx.world()).to_vector() == cols);
          // reduce_scatter_tensor: element i of every rank's input is i + r; rank me keeps
          // elements 2 me and 2 me + 1, each summed over the ranks.
          std::vector<std::int64_t> ramp(static_cast<std::size_t>(2 * n));
          std::iota(ramp.begin(), ramp.end(), std::int64_t{me});
          auto rs = cg::reduce_scatter_tensor(cg::tensor<std::int64_t>::from(ramp, {2 * nn}), "sum", 0, ctx.world());
          const std::int64_t base = nn * (nn - 1) / 2;
          expect(rs.to_vector() == std::vector<std::int64_t>{nn * 2 * me + base, nn * (2 * me + 1) + base});
          // all_to_all_single, even splits: element j of rank r's input goes to rank j.
          std::vector<std::int64_t> from_each(static_cast<std::size_t>(n));
          std::iota(from_each.begin(), from_each.end(), 0);
          expect(cg::all_to_all_single(cg::full<std::int64_t>({nn}, me), std::nullopt, std::nullopt, ctx.world())
                     .to_vector() == from_each);
          // broadcast from the last rank; permute_tensor by a rotation (rank i sends to i + 1).
          expect(cg::broadcast(cg::full<float>({2}, float(me)), n - 1, ctx.world()).to_vector() ==
                 std::vector<float>(2, float(n - 1)));
          std::vector<int> rotation(static_cast<std::size_t>(n));
          for (int i = 0; i < n; ++i) rotation[static_cast<std::size_t>(i)] = (i + 1) % n;
          expect(cg::permute_tensor(cg::full<float>({2}, float(me)), rotation, ctx.world()).to_vector() ==
                 std::vector<float>(2, float((me + n - 1) % n)));
          // A subgroup of the first ceil(n / 2) ranks: only its members call.
          const int half = (n + 1) / 2;
          if (me < half) {
            std::vector<int> members(static_cast<std::size_t>(half));
            std::iota(members.begin(), members.end(), 0);
            expect(cg::all_reduce(x, "sum", cg::group{members}).to_vector() ==
                   std::vector<std::int64_t>(3, std::int64_t{half} * (half + 1) / 2));
          }
          ++ranks_done;
        },
        threads_opts());
    CHECK(ranks_done == n);
    CHECK(wrong == 0);
  }
}

// ================================ failures ================================

TEST_CASE("abort.exception_on_one_rank_fails_every_other_rank") {
  // Ranks 0, 1, 3 issue an all_reduce that needs rank 2; rank 2 throws instead.
  std::latch issued(3);
  std::array<std::string, 4> pending_msg, future_msg;
  std::array<int, 4> pending_kind{}, future_kind{};
  auto body = [&](cg::rank_context& ctx) {
    const auto r = static_cast<std::size_t>(ctx.rank());
    if (ctx.rank() == 2) {
      issued.wait();
      throw std::logic_error("boom on rank 2");
    }
    auto t = cg::all_reduce(cg::ones<float>({4}), "sum", ctx.world());
    issued.count_down();
    try {
      t.wait();
    } catch (const cg::aborted_error& e) {
      pending_kind[r] = 1;
      pending_msg[r] = e.what();
    }
    try {  // a collective issued after the abort fails at once
      cg::all_reduce(cg::ones<float>({4}), "sum", cg::group{std::vector<int>{0, 1, 3}}).wait();
    } catch (const cg::aborted_error& e) {
      future_kind[r] = 1;
      future_msg[r] = e.what();
    }
  };
  const auto t0 = clock_type::now();
  CHECK_THROWS_WITH_AS(cg::run_threads(4, body, threads_opts()), "boom on rank 2", std::logic_error);
  CHECK(seconds_since(t0) < 10.0);
  for (std::size_t r : {0u, 1u, 3u}) {
    CAPTURE(r);
    CHECK(pending_kind[r] == 1);
    CHECK(future_kind[r] == 1);
    const std::string want = "rank " + std::to_string(r) + ": aborted because rank 2 failed: boom on rank 2";
    CHECK_MESSAGE(contains(pending_msg[r], want), pending_msg[r]);
    CHECK_MESSAGE(contains(future_msg[r], want), future_msg[r]);
  }
}

namespace {
struct custom_failure : std::exception {
  const char* what() const noexcept override { return "custom failure"; }
};
}  // namespace

TEST_CASE("abort.rethrows_the_original_exception_of_the_first_failing_rank") {
  // Custom exception types come back as themselves.
  CHECK_THROWS_AS(cg::run_threads(
                      3,
                      [](cg::rank_context& ctx) {
                        if (ctx.rank() == 1) throw custom_failure{};
                      },
                      threads_opts()),
                  custom_failure);
  // So do exceptions that are not std::exceptions; peers read "unknown exception".
  std::string peer_msg;
  CHECK_THROWS_AS(cg::run_threads(
                      2,
                      [&](cg::rank_context& ctx) {
                        if (ctx.rank() == 1) throw 42;
                        try {
                          cg::all_reduce(cg::ones<float>({1}), "sum", ctx.world()).wait();
                        } catch (const cg::aborted_error& e) {
                          peer_msg = e.what();
                        }
                      },
                      threads_opts()),
                  int);
  CHECK_MESSAGE(contains(peer_msg, "aborted because rank 1 failed: unknown exception"), peer_msg);
  // When several ranks fail, the first failure wins: rank 3 fails only after seeing rank 1's.
  auto body = [](cg::rank_context& ctx) {
    if (ctx.rank() == 1) throw std::runtime_error("first failure on rank 1");
    try {
      cg::all_reduce(cg::ones<float>({1}), "sum", ctx.world()).wait();
    } catch (const cg::aborted_error&) {
      if (ctx.rank() == 3) throw std::invalid_argument("second failure on rank 3");
      throw;
    }
  };
  CHECK_THROWS_WITH_AS(cg::run_threads(4, body, threads_opts()), "first failure on rank 1", std::runtime_error);
}

namespace {
/// Runs a program whose ranks disagree; checks it fails fast (the default 300 s timeout is in
/// force) with a collective_mismatch_error naming both calls (`a` and `b`), which every rank
/// gets, with the same message. Returns the message.
template <class F>
std::string expect_mismatch(int n, F body, const std::string& a, const std::string& b,
                            const std::string& between = "collective mismatch between rank ") {
  std::exception_ptr thrown;
  const auto t0 = clock_type::now();
  const auto outcomes = run_recording(n, body, thrown, cg::threads_options{});
  CHECK(seconds_since(t0) < 10.0);
  REQUIRE(thrown);
  const std::string msg = what_of(thrown);
  CHECK_THROWS_AS(std::rethrow_exception(thrown), cg::collective_mismatch_error);
  CHECK_MESSAGE(contains(msg, between), msg);
  CHECK_MESSAGE(contains(msg, a), msg, "\n  expected to contain: ", a);
  CHECK_MESSAGE(contains(msg, b), msg, "\n  expected to contain: ", b);
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(outcomes[r].kind == outcome::mismatch, outcomes[r].message);
    CHECK(outcomes[r].message == msg);
  }
  return msg;
}
}  // namespace

TEST_CASE("mismatch.different_op") {
  expect_mismatch(
      2,
      [](cg::rank_context& ctx) {
        auto t = cg::ones<float>({4});
        if (ctx.rank() == 0) cg::all_reduce(t, "sum", ctx.world()).wait();
        else cg::all_gather_tensor(t, 0, ctx.world()).wait();
      },
      "all_reduce(f32[4], op=sum, group=[0, 1])",
      "all_gather_into_tensor(f32[4], group_size=2, group=[0, 1])");
}

TEST_CASE("mismatch.different_reduce_op") {
  expect_mismatch(
      3,
      [](cg::rank_context& ctx) {
        auto t = cg::ones<float>({2, 2});
        cg::all_reduce(t, ctx.rank() == 1 ? "max" : "sum", ctx.world()).wait();
      },
      "all_reduce(f32[2, 2], op=sum, group=[0, 1, 2])", "all_reduce(f32[2, 2], op=max, group=[0, 1, 2])");
}

TEST_CASE("mismatch.different_group") {
  // Rank 1 waits in [0, 1] for rank 0, which waits in the world for rank 1: found when the
  // second of them blocks, and reported with what each waits in.
  const std::string msg = expect_mismatch(
      3,
      [](cg::rank_context& ctx) {
        auto t = cg::ones<float>({4});
        if (ctx.rank() == 1) cg::all_reduce(t, "sum", cg::group{std::vector<int>{0, 1}}).wait();
        else cg::all_reduce(t, "sum", ctx.world()).wait();
      },
      "all_reduce(f32[4], op=sum, group=[0, 1])", "all_reduce(f32[4], op=sum, group=[0, 1, 2])");
  const int line = __LINE__ - 4;  // rank 1's call; the others' is on the next line
  CHECK(msg ==
        "collective mismatch between rank 0 and rank 1, which issued their collectives in orders "
        "that wait on each other: rank 0 waits in all_reduce(f32[4], op=sum, group=[0, 1, 2]) "
        "(collective #0 on its group) for rank 1; rank 1 waits in all_reduce(f32[4], op=sum, "
        "group=[0, 1]) (collective #0 on its group) for rank 0; none of these can complete (called from rank 0 at " +
            std::string(__FILE__) + ":" + std::to_string(line + 1) + ", rank 1 at " + std::string(__FILE__) + ":" +
            std::to_string(line) + ")");
}

TEST_CASE("mismatch.shared_groups_in_swapped_order") {
  // Ranks 0 and 1 are in both groups; rank 1 issues them the other way round (what the old
  // pairwise check caught at issue): their workers wait on each other.
  expect_mismatch(
      3,
      [](cg::rank_context& ctx) {
        const cg::group pair = std::vector<int>{0, 1};
        if (ctx.rank() == 0) {
          auto x = cg::all_reduce(cg::ones<float>({2}), "sum", pair);
          auto y = cg::all_gather_tensor(cg::ones<float>({3}), 0, ctx.world());
          x.wait();
          y.wait();
        } else if (ctx.rank() == 1) {
          auto y = cg::all_gather_tensor(cg::ones<float>({3}), 0, ctx.world());
          auto x = cg::all_reduce(cg::ones<float>({2}), "sum", pair);
          y.wait();
          x.wait();
        } else {
          cg::all_gather_tensor(cg::ones<float>({3}), 0, ctx.world()).wait();
        }
      },
      "rank 0 waits in all_reduce(f32[2], op=sum, group=[0, 1]) (collective #0 on its group) for rank 1",
      "rank 1 waits in all_gather_into_tensor(f32[3], group_size=3, group=[0, 1, 2]) (collective #0 on its "
      "group) for rank 0");
}

TEST_CASE("mismatch.cycle_of_three_found_when_it_forms") {
  // Rank r first issues on {r, r + 1 mod 3}, then on {r - 1 mod 3, r}: every pair agrees on
  // its own group's order, but each worker waits for a rank whose worker waits for the next.
  // The default 300 s timeout is in force: only the cycle can end this quickly.
  const std::string msg = expect_mismatch(
      3,
      [](cg::rank_context& ctx) {
        const int r = ctx.rank();
        auto pair = [](int a, int b) { return cg::group{std::vector<int>{std::min(a, b), std::max(a, b)}}; };
        auto x = cg::all_reduce(cg::ones<float>({4}), "sum", pair(r, (r + 1) % 3));
        auto y = cg::all_reduce(cg::ones<float>({4}), "sum", pair((r + 2) % 3, r));
        x.wait();
        y.wait();
      },
      "rank 0 waits in all_reduce(f32[4], op=sum, group=[0, 1]) (collective #0 on its group) for rank 1",
      "rank 1 waits in all_reduce(f32[4], op=sum, group=[1, 2]) (collective #0 on its group) for rank 2",
      "collective mismatch between ranks 0, 1 and 2, which issued their collectives in orders that wait on each other");
  CHECK_MESSAGE(contains(msg, "rank 2 waits in all_reduce(f32[4], op=sum, group=[0, 2]) (collective #0 on its "
                              "group) for rank 0; none of these can complete"),
                msg);
}

TEST_CASE("mismatch.longer_cycle_behind_a_chain") {
  // Ranks 0..4 wait on each other in a ring; rank 5 waits on rank 0 from outside it (a chain
  // into the cycle, not part of it). Every rank, rank 5 included, gets the mismatch.
  constexpr int n = 6, ring = 5;
  const std::string msg = expect_mismatch(
      n,
      [](cg::rank_context& ctx) {
        const int r = ctx.rank();
        auto pair = [](int a, int b) { return cg::group{std::vector<int>{std::min(a, b), std::max(a, b)}}; };
        if (r == ring) {
          cg::all_reduce(cg::ones<float>({1}), "sum", pair(0, ring)).wait();
          return;
        }
        auto x = cg::all_reduce(cg::ones<float>({1}), "sum", pair(r, (r + 1) % ring));
        auto y = cg::all_reduce(cg::ones<float>({1}), "sum", pair((r + ring - 1) % ring, r));
        x.wait();
        y.wait();
        cg::all_reduce(cg::ones<float>({1}), "sum", pair(0, ring)).wait();
      },
      "rank 4 waits in all_reduce(f32[1], op=sum, group=[0, 4]) (collective #0 on its group) for rank 0",
      "; none of these can complete", "collective mismatch between ranks 0, 1, 2, 3 and 4, which");
  CHECK_FALSE(contains(msg, "rank 5 waits"));
}

TEST_CASE("mismatch.no_false_positive_from_idle_busy_or_late_members") {
  // Chains of waits that end at a rank whose worker is idle (its thread sleeps before issuing)
  // or busy on a collective that will complete are no deadlock, however long they wait.
  cg::run_threads(
      4,
      [](cg::rank_context& ctx) {
        const int r = ctx.rank();
        auto g = [](std::vector<int> v) { return cg::group{std::move(v)}; };
        std::vector<cg::tensor<float>> outs;
        if (r == 0) {  // waits for 1 (idle), then for 2
          outs.push_back(cg::all_reduce(cg::ones<float>({1}), "sum", g({0, 1})));
          outs.push_back(cg::all_reduce(cg::ones<float>({1}), "sum", g({0, 2})));
        } else if (r == 1) {  // issues late; first waits on rank 3, which issues later still
          std::this_thread::sleep_for(milliseconds(50));
          outs.push_back(cg::all_reduce(cg::ones<float>({1}), "sum", g({1, 3})));
          outs.push_back(cg::all_reduce(cg::ones<float>({1}), "sum", g({0, 1})));
        } else if (r == 2) {  // waits for 0, which waits for 1
          outs.push_back(cg::all_reduce(cg::ones<float>({1}), "sum", g({0, 2})));
        } else {
          std::this_thread::sleep_for(milliseconds(100));
          outs.push_back(cg::all_reduce(cg::ones<float>({1}), "sum", g({1, 3})));
        }
        for (auto& o : outs) CHECK(o.item() == 2.f);
      },
      threads_opts());
}

TEST_CASE("mismatch.no_false_positive_random_groups_in_one_global_order") {
  // Collectives on random subgroups, every rank issuing those it is in, in one global order:
  // always deadlock-free, however the workers interleave, so no cycle may ever be reported.
  constexpr int n = 8, count = 300;
  std::vector<std::vector<int>> groups;
  std::uint64_t state = 12345;
  auto next = [&] { return (state = state * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
  for (int i = 0; i < count; ++i) {
    std::vector<int> members;
    for (int r = 0; r < n; ++r)
      if (next() % 2) members.push_back(r);
    if (members.size() < 2) members = {static_cast<int>(next() % 4), 4 + static_cast<int>(next() % 4)};
    std::sort(members.begin(), members.end());
    groups.push_back(members);
  }
  std::atomic<int> wrong{0};
  cg::run_threads(
      n,
      [&](cg::rank_context& ctx) {
        std::vector<std::pair<cg::tensor<std::int64_t>, std::int64_t>> outs;
        for (int i = 0; i < count; ++i) {
          const auto& m = groups[static_cast<std::size_t>(i)];
          if (!std::binary_search(m.begin(), m.end(), ctx.rank())) continue;
          std::int64_t want = 0;
          for (int r : m) want += r * 1000 + i;
          outs.emplace_back(cg::all_reduce(cg::full<std::int64_t>({2}, ctx.rank() * 1000 + i), "sum", cg::group{m}),
                            want);
          if (i % 7 == ctx.rank()) outs.back().first.wait();  // some waits, at different places per rank
        }
        for (auto& [t, want] : outs)
          if (t.to_vector() != std::vector<std::int64_t>(2, want)) ++wrong;
      },
      threads_opts());
  CHECK(wrong == 0);
}

TEST_CASE("mismatch.different_tag") {
  // A group tag is part of the group: the same ranks under another tag are another group (on
  // NCCL another communicator), so pairing these two would hide a hang on GPUs.
  expect_mismatch(
      2,
      [](cg::rank_context& ctx) {
        auto t = cg::ones<float>({4});
        cg::all_reduce(t, "sum", ctx.rank() == 0 ? ctx.world() : ctx.world().tagged("fsdp_rs")).wait();
      },
      "all_reduce(f32[4], op=sum, group=[0, 1])", "all_reduce(f32[4], op=sum, group=[0, 1]:fsdp_rs)");
}

TEST_CASE("mismatch.tagged_groups_issued_in_different_orders") {
  // Two tagged groups over the same ranks have their own sequences of collectives, but every
  // rank must still issue them in one order: NCCL runs a rank's communicators on its
  // communication stream, and two communicators used in different orders on two ranks can
  // deadlock (NCCL requires one order for communicators used concurrently). So the threads
  // backend refuses it at once, naming both calls, instead of running it.
  expect_mismatch(
      2,
      [](cg::rank_context& ctx) {
        const cg::group ag{std::vector<int>{0, 1}, "ag"}, rs{std::vector<int>{0, 1}, "rs"};
        auto t = cg::ones<float>({4});
        if (ctx.rank() == 0) {
          auto a = cg::all_gather_tensor(t, 0, ag);
          cg::reduce_scatter_tensor(t, "sum", 0, rs).wait();
          a.wait();
        } else {
          auto b = cg::reduce_scatter_tensor(t, "sum", 0, rs);
          cg::all_gather_tensor(t, 0, ag).wait();
          b.wait();
        }
      },
      "all_gather_into_tensor(f32[4], group_size=2, group=[0, 1]:ag)",
      "reduce_scatter_tensor(f32[4], op=sum, group_size=2, group=[0, 1]:rs)");
}

TEST_CASE("mismatch.different_dtype") {
  expect_mismatch(
      2,
      [](cg::rank_context& ctx) {
        if (ctx.rank() == 0) cg::all_reduce(cg::ones<float>({4}), "sum", ctx.world()).wait();
        else cg::all_reduce(cg::ones<std::int32_t>({4}), "sum", ctx.world()).wait();
      },
      "all_reduce(f32[4], op=sum, group=[0, 1])", "all_reduce(i32[4], op=sum, group=[0, 1])");
}

TEST_CASE("mismatch.different_shape_at_a_later_position") {
  expect_mismatch(
      2,
      [](cg::rank_context& ctx) {
        cg::all_reduce(cg::ones<float>({3}), "sum", ctx.world()).wait();  // #0 agrees
        cg::all_reduce(cg::ones<float>({ctx.rank() == 0 ? 4 : 5}), "sum", ctx.world()).wait();
      },
      "all_reduce(f32[4], op=sum, group=[0, 1])", "all_reduce(f32[5], op=sum, group=[0, 1])");
}

TEST_CASE("mismatch.all_to_all_rows_may_differ_but_not_trailing_dims") {
  // dim 0 legitimately differs per rank with uneven splits: no mismatch.
  cg::run_threads(
      2,
      [](cg::rank_context& ctx) {
        const std::int64_t rows = ctx.rank() == 0 ? 1 : 3;
        auto t = cg::full<float>({rows, 2}, static_cast<float>(ctx.rank()));
        const std::vector<std::int64_t> in = ctx.rank() == 0 ? std::vector<std::int64_t>{0, 1}
                                                             : std::vector<std::int64_t>{2, 1};
        const std::vector<std::int64_t> out = ctx.rank() == 0 ? std::vector<std::int64_t>{0, 2}
                                                              : std::vector<std::int64_t>{1, 1};
        auto r = cg::all_to_all_single(t, out, in, ctx.world());
        CHECK(r.to_vector() == (ctx.rank() == 0 ? std::vector<float>{1, 1, 1, 1}
                                                : std::vector<float>{0, 0, 1, 1}));
      },
      threads_opts());
  expect_mismatch(
      2,
      [](cg::rank_context& ctx) {
        auto t = cg::ones<float>({2, ctx.rank() == 0 ? 2 : 3});
        cg::all_to_all_single(t, std::nullopt, std::nullopt, ctx.world()).wait();
      },
      "all_to_all_single(f32[?, 2]", "all_to_all_single(f32[?, 3]");
}

TEST_CASE("mismatch.broadcast_src") {
  expect_mismatch(
      2,
      [](cg::rank_context& ctx) { cg::broadcast(cg::ones<float>({2}), ctx.rank(), ctx.world()).wait(); },
      "broadcast(f32[2], src=0, group=[0, 1])", "broadcast(f32[2], src=1, group=[0, 1])");
}

TEST_CASE("timeout.names_the_op_and_the_missing_ranks") {
  // Rank 0 waits for ranks that are alive but never issue: after 100 ms it gets a timeout.
  for (int n : {2, 3}) {
    std::atomic<bool> rank0_done{false};
    std::string rank0_msg;
    bool rank0_timed_out = false;
    const auto t0 = clock_type::now();
    auto body = [&](cg::rank_context& ctx) {
      if (ctx.rank() != 0) {
        eventually([&] { return rank0_done.load(); });  // alive, but never issuing
        return;
      }
      try {
        cg::all_reduce(cg::ones<float>({4}), "sum", ctx.world()).wait();
      } catch (const cg::timeout_error& e) {
        rank0_timed_out = true;
        rank0_msg = e.what();
      }
      rank0_done = true;
    };
    CHECK_THROWS_AS(cg::run_threads(n, body, threads_opts(milliseconds(100))), cg::timeout_error);
    CHECK(seconds_since(t0) < 4.0);
    CHECK(rank0_timed_out);
    const std::string group = n == 2 ? "[0, 1]" : "[0, 1, 2]";
    const std::string missing = n == 2 ? "[1]" : "[1, 2]";
    CHECK_MESSAGE(contains(rank0_msg, "all_reduce(f32[4], op=sum, group=" + group + ")"), rank0_msg);
    CHECK_MESSAGE(contains(rank0_msg, "timed out after 100 ms on rank 0 waiting for ranks " + missing),
                  rank0_msg);
  }
}

TEST_CASE("exit.a_returned_rank_fails_its_peers_at_once") {
  // The default 300 s timeout is in force: the error must come from rank 1's exit, not a timeout.
  std::exception_ptr thrown;
  const auto t0 = clock_type::now();
  const auto outcomes = run_recording(
      2,
      [](cg::rank_context& ctx) {
        if (ctx.rank() == 1) return;  // never issues the all_reduce rank 0 waits on
        cg::all_reduce(cg::ones<float>({4}), "sum", ctx.world()).wait();
      },
      thrown, cg::threads_options{});
  CHECK(seconds_since(t0) < 5.0);
  REQUIRE(thrown);
  CHECK_THROWS_AS(std::rethrow_exception(thrown), cg::collective_mismatch_error);
  const std::string msg = what_of(thrown);
  // The message names where rank 0 called it (the lambda above, in this file).
  CHECK_MESSAGE(msg.starts_with("all_reduce(f32[4], op=sum, group=[0, 1]) (collective #0 on its group), issued by rank 0 "
                                "at "),
                msg);
  CHECK_MESSAGE(contains(msg, "test_threads.cpp:"), msg);
  CHECK_MESSAGE(msg.ends_with(", can never complete: rank 1 returned from its function without issuing it"), msg);
  CHECK(outcomes[0].kind == outcome::mismatch);
  CHECK(outcomes[1].kind == outcome::none);

  // Also when the collective is issued after the peer is long gone, and on a subgroup.
  const auto t1 = clock_type::now();
  CHECK_THROWS_WITH_AS(cg::run_threads(
                           3,
                           [](cg::rank_context& ctx) {
                             if (ctx.rank() != 0) return;
                             std::this_thread::sleep_for(milliseconds(20));
                             cg::all_reduce(cg::ones<float>({1}), "sum", cg::group{std::vector<int>{0, 2}}).wait();
                           },
                           cg::threads_options{}),
                       doctest::Contains("rank 2 returned from its function without issuing it"),
                       cg::collective_mismatch_error);
  CHECK(seconds_since(t1) < 5.0);
}

TEST_CASE("exit.returning_after_issuing_is_fine") {
  // A rank may return with its collective still pending: its worker finishes it.
  cg::run_threads(
      2,
      [](cg::rank_context& ctx) {
        auto r = cg::all_reduce(cg::ones<float>({1}), "sum", ctx.world());
        if (ctx.rank() == 0) {
          std::this_thread::sleep_for(milliseconds(20));  // rank 1 has most likely returned
          CHECK(r.item() == 2.f);
        }
      },
      threads_opts());
}

// ================================== scale ==================================

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(__OPTIMIZE__)
constexpr bool slow_build = true;
#else
constexpr bool slow_build = false;
#endif

TEST_CASE("scale.world_collectives_on_1024_ranks") {
  // Order checking is O(group size) per call: 1024 ranks (2048 threads) run two world
  // collectives in a fraction of a second, most of it starting threads (bench/RESULTS.md);
  // the old n x n table took 12 s and 1.7 GiB for one all_reduce here. Sanitized builds run
  // 256 ranks.
  const int n = slow_build ? 256 : 1024;
  std::atomic<int> wrong{0};
  const auto t0 = clock_type::now();
  cg::run_threads(
      n,
      [&](cg::rank_context& ctx) {
        const std::int64_t me = ctx.rank();
        auto sum = cg::all_reduce(cg::full<std::int64_t>({4}, me), "sum", ctx.world());
        auto all = cg::all_gather_tensor(cg::full<std::int32_t>({1}, ctx.rank()), 0, ctx.world());
        if (sum.to_vector() != std::vector<std::int64_t>(4, std::int64_t{n} * (n - 1) / 2)) ++wrong;
        const auto ranks = all.to_vector();
        for (int r = 0; r < n; ++r)
          if (ranks[static_cast<std::size_t>(r)] != r) ++wrong;
      },
      threads_opts());
  const double seconds = seconds_since(t0);
  MESSAGE(n, " ranks, two world collectives: ", seconds, " s");
  CHECK(wrong == 0);
  CHECK(seconds < (slow_build ? 60.0 : 5.0));  // release: 0.3-0.5 s on the loaded 2-core VM
}

TEST_CASE("scale.mismatch_on_256_ranks_reaches_every_rank") {
  constexpr int n = 256;
  expect_mismatch(
      n,
      [](cg::rank_context& ctx) {
        cg::all_reduce(cg::ones<float>({ctx.rank() == n - 1 ? 3 : 2}), "sum", ctx.world()).wait();
      },
      "issued all_reduce(f32[3], op=sum, group=[0, 1, 2,", "issued all_reduce(f32[2], op=sum, group=[0, 1, 2,");
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // they reserve the address space
TEST_CASE("run_threads.a_world_that_cannot_start_is_an_error") {
  // A child process whose address space has room for a few thread stacks only: the world's
  // 512 threads cannot all be created. run_threads must throw, run no rank's function, and
  // return (no rank left waiting for one that never started).
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    ::rlimit lim{};
    ::getrlimit(RLIMIT_AS, &lim);
    lim.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{256} << 20);
    if (pages == 0 || ::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(10);
    std::atomic<int> ran{0};
    int code = 2;  // no error at all
    try {
      cg::run_threads(256, [&](cg::rank_context&) { ++ran; });
    } catch (const cg::error& e) {
      const std::string m = e.what();
      const bool named = contains(m, "run_threads: cannot start a world of 256 ranks: creating thread ") &&
                         contains(m, " of its 512 threads failed (") && contains(m, "no rank's function was run");
      code = named && ran == 0 ? 0 : 3;
      if (code) std::fprintf(stderr, "ran %d: %s\n", ran.load(), m.c_str());
    } catch (...) {
      code = 4;
    }
    ::_exit(code);
  }
  int status = 0;
  const auto t0 = clock_type::now();
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && seconds_since(t0) < 60.0)
    std::this_thread::sleep_for(milliseconds(10));
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL("run_threads hung in a process that cannot create its threads");
  }
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
#endif
