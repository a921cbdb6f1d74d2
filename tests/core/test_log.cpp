// tests/core/test_log.cpp: ccgraph/core/log.hpp: $CCGRAPH_LOG_LEVEL through the one env parser
// (unset or empty is warn, a bad value an error naming the variable and the choices),
// set_log_level over it, and what each level prints (the stream captured), also from the
// library's own call sites (a schedule pass at debug, a threads world at info).
#include <doctest/doctest.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/core/log.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace log_test {

/// Captures the log at `level` while alive; puts back the default stream and the environment's
/// level afterwards.
struct captured_log {
  std::ostringstream os;
  explicit captured_log(cg::log_level level) {
    cg::set_log_stream(&os);
    cg::set_log_level(level);
  }
  ~captured_log() {
    cg::set_log_stream(nullptr);
    cg::detail::reset_log_level();
  }
  std::string text() const { return os.str(); }
};

/// The level $CCGRAPH_LOG_LEVEL=`text` gives (read afresh), or the error's message.
std::string level_from_env(const char* text) {
  ::setenv("CCGRAPH_LOG_LEVEL", text, 1);
  cg::detail::reset_log_level();
  std::string out;
  try {
    out = std::string(cg::log_level_name(cg::get_log_level()));
  } catch (const cg::error& e) {
    out = e.what();
  }
  ::unsetenv("CCGRAPH_LOG_LEVEL");
  cg::detail::reset_log_level();
  return out;
}

}  // namespace log_test

using namespace log_test;

TEST_CASE("log.level.from_env") {
  ::unsetenv("CCGRAPH_LOG_LEVEL");
  cg::detail::reset_log_level();
  CHECK(cg::get_log_level() == cg::log_level::warn);  // the default
  CHECK(level_from_env("") == "warn");
  for (const char* l : {"off", "error", "warn", "info", "debug"}) CHECK(level_from_env(l) == l);
  for (const char* bad : {"verbose", "INFO", "3", " info", "debug "}) {
    CAPTURE(bad);
    CHECK(level_from_env(bad) == std::string("CCGRAPH_LOG_LEVEL='") + bad +
                                     "' is not one of off, error, warn, info, debug");
  }
  // set_log_level wins over the environment.
  ::setenv("CCGRAPH_LOG_LEVEL", "debug", 1);
  cg::detail::reset_log_level();
  cg::set_log_level(cg::log_level::error);
  CHECK(cg::get_log_level() == cg::log_level::error);
  ::unsetenv("CCGRAPH_LOG_LEVEL");
  cg::detail::reset_log_level();
}

TEST_CASE("log.levels.print_what_they_include") {
  using L = cg::log_level;
  auto emit_all = [] {
    cg::detail::log(L::error, "test", "e", 1);
    cg::detail::log(L::warn, "test", "w", 2);
    cg::detail::log(L::info, "test", "i", 3);
    cg::detail::log(L::debug, "test", "d", 4);
  };
  const std::string all = "[ccgraph error] test: e1\n[ccgraph warn] test: w2\n[ccgraph info] test: i3\n"
                          "[ccgraph debug] test: d4\n";
  struct expect {
    L level;
    std::size_t lines;
  };
  for (auto [level, lines] : {expect{L::off, 0}, expect{L::error, 1}, expect{L::warn, 2}, expect{L::info, 3},
                              expect{L::debug, 4}}) {
    CAPTURE(cg::log_level_name(level));
    captured_log log(level);
    emit_all();
    std::size_t at = 0;
    for (std::size_t k = 0; k < lines; ++k) at = all.find('\n', at) + 1;
    CHECK(log.text() == all.substr(0, at));
  }
  // Nothing is formatted when the level is off: an argument whose printing would throw is fine.
  captured_log off(L::off);
  CHECK_FALSE(cg::detail::log_enabled(L::error));
}

TEST_CASE("log.library_sites") {
  auto program = [](auto a) { return cg::relu(cg::all_reduce(a, "sum", cg::group(std::vector<int>{0, 1}))); };
  const auto g = cg::trace(cg::trace_options{.rank = 0, .world_size = 2}, program, cg::input<float>({4}));
  {
    captured_log log(cg::log_level::info);
    (void)cg::schedule(g, {"sink_waits"});
    CHECK(log.text().find("schedule: ") == std::string::npos);  // pass summaries are debug
  }
  {
    captured_log log(cg::log_level::debug);
    (void)cg::schedule(g, {"sink_waits", "raise_comms"});
    CHECK(contains(log.text(), "[ccgraph debug] schedule: sink_waits: "));
    CHECK(contains(log.text(), "[ccgraph debug] schedule: raise_comms: "));
    CHECK(contains(log.text(), "1 collectives"));
  }
  {
    captured_log log(cg::log_level::info);
    cg::run_threads(2, [](cg::rank_context&) {});
    CHECK(contains(log.text(), "[ccgraph info] threads: world of 2 ranks"));
  }
  {
    captured_log log(cg::log_level::warn);
    cg::run_threads(2, [](cg::rank_context&) {});
    CHECK(log.text().empty());
  }
  {
    captured_log log(cg::log_level::info);
    CHECK_THROWS(cg::run_threads(2, [](cg::rank_context& ctx) {
      if (ctx.rank() == 1) throw cg::error("rank 1 gives up");
    }));
    CHECK(contains(log.text(), "[ccgraph info] threads: rank 1 failed, aborting the world: rank 1 gives up"));
  }
  {
    captured_log log(cg::log_level::warn);  // the default: a failure is thrown, not also printed
    CHECK_THROWS(cg::run_threads(2, [](cg::rank_context& ctx) {
      if (ctx.rank() == 1) throw cg::error("rank 1 gives up");
    }));
    CHECK(log.text().empty());
  }
}
