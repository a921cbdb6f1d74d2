// tests/core/test_timeout.cpp: timeouts and deadlines (ccgraph/core/timeout.hpp) and their
// users: milliseconds::max() waits forever on the threads backend and in every store (it used
// to overflow now() + timeout), and zero or negative timeouts are rejected, naming the call.
// Run under UBSan, the forever cases are what catches an overflow.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/timeout.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/runtime/store.hpp>
#include <ccgraph/runtime/threads.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;
using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

TEST_CASE("timeout.deadline_after.saturates") {
  using cg::detail::deadline_after;
  const auto now = clock_type::now();
  CHECK(deadline_after(now, milliseconds(250)) == now + milliseconds(250));
  CHECK(deadline_after(now, milliseconds::max()) == clock_type::time_point::max());
  // Longer than the clock can count from now (~292 years of nanoseconds): forever too.
  CHECK(deadline_after(now, std::chrono::hours(24 * 365 * 300)) == clock_type::time_point::max());
  CHECK(deadline_after(now, std::chrono::hours(24 * 365 * 100)) < clock_type::time_point::max());
  CHECK(deadline_after(now, milliseconds(0)) == now);
  CHECK(deadline_after(now, milliseconds(-5)) == now);
  CHECK(deadline_after(clock_type::time_point::max(), milliseconds(1)) == clock_type::time_point::max());
  // A clock counting milliseconds: the same, at the edge of its own range.
  using ms_point = std::chrono::time_point<clock_type, milliseconds>;
  CHECK(deadline_after(ms_point(milliseconds(10)), milliseconds::max()) == ms_point::max());
  CHECK(deadline_after(ms_point(milliseconds(10)), milliseconds(5)) == ms_point(milliseconds(15)));
}

TEST_CASE("timeout.past_timeout_and_text") {
  using cg::detail::past_timeout;
  CHECK(past_timeout(std::chrono::nanoseconds(100'000'001), milliseconds(100)));
  CHECK_FALSE(past_timeout(std::chrono::nanoseconds(100'000'000), milliseconds(100)));
  CHECK_FALSE(past_timeout(std::chrono::nanoseconds::max(), milliseconds::max()));
  CHECK_FALSE(past_timeout(std::chrono::nanoseconds(std::chrono::hours(24 * 365)), milliseconds::max()));
  CHECK(cg::detail::waits_forever(milliseconds::max()));
  CHECK_FALSE(cg::detail::waits_forever(milliseconds(300000)));
  CHECK(cg::detail::timeout_text(milliseconds(300000)) == "300000 ms");
  CHECK(cg::detail::timeout_text(milliseconds::max()) == "forever");
  CHECK(cg::detail::timeout_text(milliseconds::max()).find("9223372036854775807") == std::string::npos);
}

TEST_CASE("timeout.check_rejects_zero_and_negative") {
  cg::detail::check_timeout("x", milliseconds(1));
  cg::detail::check_timeout("x", milliseconds::max());
  CHECK(error_of([] { cg::detail::check_timeout("run_threads: threads_options::timeout", milliseconds(0)); }) ==
        "run_threads: threads_options::timeout: the timeout must be positive, got 0 ms "
        "(std::chrono::milliseconds::max() waits forever)");
  CHECK(contains(error_of([] { cg::detail::check_timeout("x", milliseconds(-5)); }), "got -5 ms"));
}

TEST_CASE("timeout.threads.forever_waits_for_a_late_rank") {
  // The first late collective used to fail "after 9223372036854775807 ms" (and overflow).
  cg::threads_options opt;
  opt.timeout = milliseconds::max();
  std::vector<float> got[2];
  cg::run_threads(
      2,
      [&](cg::rank_context& ctx) {
        if (ctx.rank() == 1) std::this_thread::sleep_for(milliseconds(150));
        got[ctx.rank()] = cg::all_reduce(cg::full<float>({3}, float(ctx.rank() + 1)), "sum", ctx.world())
                              .to_vector();
      },
      opt);
  CHECK(got[0] == std::vector<float>{3, 3, 3});
  CHECK(got[1] == std::vector<float>{3, 3, 3});
}

TEST_CASE("timeout.threads.zero_and_negative_are_errors") {
  for (const auto t : {milliseconds(0), milliseconds(-5)}) {
    cg::threads_options opt;
    opt.timeout = t;
    bool ran = false;
    const std::string m = error_of([&] { cg::run_threads(2, [&](cg::rank_context&) { ran = true; }, opt); });
    CHECK(contains(m, "run_threads: threads_options::timeout: the timeout must be positive, got " +
                          std::to_string(t.count()) + " ms"));
    CHECK_FALSE(ran);
  }
}

namespace {

/// A get that a set on another thread satisfies 150 ms later, with the store waiting forever.
void forever_get(cg::store& getter, cg::store& setter) {
  CHECK(getter.timeout() == milliseconds::max());
  std::vector<std::uint8_t> got;
  std::thread t([&] { got = getter.get("late"); });
  std::this_thread::sleep_for(milliseconds(150));
  setter.set("late", {7});
  t.join();
  CHECK(got == std::vector<std::uint8_t>{7});
  std::thread w([&] { getter.wait({"later"}); });
  std::this_thread::sleep_for(milliseconds(50));
  setter.set("later", {8});
  w.join();
  cg::barrier(getter, "forever", 0, 1);
}

}  // namespace

TEST_CASE("timeout.stores.forever_and_invalid") {
  {
    cg::tcp_store server("127.0.0.1", 0, true, 2, milliseconds::max());
    cg::tcp_store client("127.0.0.1", server.port(), false, 2, milliseconds::max());
    forever_get(client, server);
    CHECK_THROWS_WITH_AS(client.set_timeout(milliseconds(0)),
                         doctest::Contains("store::set_timeout: the timeout must be positive, got 0 ms"),
                         cg::error);
    CHECK_THROWS_AS(client.set_timeout(milliseconds(-1)), cg::error);
    CHECK(client.timeout() == milliseconds::max());  // unchanged by the refused calls
  }
  {
    std::string dir = (std::filesystem::temp_directory_path() / "ccgraph-timeout-XXXXXX").string();
    REQUIRE(::mkdtemp(dir.data()) != nullptr);
    {
      cg::file_store a(dir + "/s", 2, milliseconds::max());
      cg::file_store b(dir + "/s", 2, milliseconds::max());
      forever_get(a, b);
    }
    std::filesystem::remove_all(dir);
  }
  CHECK_THROWS_WITH_AS(cg::tcp_store("127.0.0.1", 0, true, 1, milliseconds(0)),
                       doctest::Contains("the timeout must be positive, got 0 ms"), cg::error);
  CHECK_THROWS_WITH_AS(cg::file_store("/tmp/never-made", 1, milliseconds(-3)),
                       doctest::Contains("the timeout must be positive, got -3 ms"), cg::error);
}
