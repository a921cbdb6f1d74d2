// ccgraph/core/impl/log.ipp: the non-template functions of <ccgraph/core/log.hpp>. Included by
// that header when header-only, compiled once by <ccgraph/impl/src.hpp> under
// CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/core/log.hpp>

#include <iostream>
#include <mutex>

#include <ccgraph/core/env.hpp>

namespace ccgraph {

namespace detail {

/// The level in force, or -1 when not decided yet (the environment is read on first use).
CCGRAPH_DECL std::atomic<int>& log_level_state() {
  static std::atomic<int> level{-1};
  return level;
}

struct log_sink {
  std::mutex mu;
  std::ostream* os = nullptr;
};

CCGRAPH_DECL log_sink& the_log_sink() {
  static log_sink s;
  return s;
}

CCGRAPH_DECL log_level env_log_level() {
  const auto text = env_text("CCGRAPH_LOG_LEVEL");
  if (!text) return log_level::warn;
  return parse_env_choice<log_level>("CCGRAPH_LOG_LEVEL", *text,
                                     {{"off", log_level::off},
                                      {"error", log_level::error},
                                      {"warn", log_level::warn},
                                      {"info", log_level::info},
                                      {"debug", log_level::debug}});
}

CCGRAPH_DECL void reset_log_level() { log_level_state().store(-1); }

CCGRAPH_DECL void write_log(log_level level, std::string_view component, const std::string& message) {
  std::string line = concat("[ccgraph ", log_level_name(level), "] ", component, ": ", message, "\n");
  log_sink& s = the_log_sink();
  std::lock_guard lk(s.mu);
  std::ostream& os = s.os ? *s.os : std::cerr;
  os.write(line.data(), static_cast<std::streamsize>(line.size()));
  os.flush();
}

}  // namespace detail

CCGRAPH_DECL log_level get_log_level() {
  int v = detail::log_level_state().load(std::memory_order_relaxed);
  if (v < 0) {
    // Two threads may both read the environment: they read the same text.
    v = static_cast<int>(detail::env_log_level());
    int unset = -1;
    detail::log_level_state().compare_exchange_strong(unset, v);
    v = detail::log_level_state().load();
  }
  return static_cast<log_level>(v);
}

CCGRAPH_DECL void set_log_level(log_level level) {
  CCGRAPH_CHECK(static_cast<int>(level) >= 0 && static_cast<int>(level) <= 4, "set_log_level: ",
                static_cast<int>(level), " is not a log_level");
  detail::log_level_state().store(static_cast<int>(level));
}

CCGRAPH_DECL void set_log_stream(std::ostream* os) {
  detail::log_sink& s = detail::the_log_sink();
  std::lock_guard lk(s.mu);
  s.os = os;
}

CCGRAPH_DECL std::string_view log_level_name(log_level level) {
  switch (level) {
    case log_level::off: return "off";
    case log_level::error: return "error";
    case log_level::warn: return "warn";
    case log_level::info: return "info";
    case log_level::debug: return "debug";
  }
  return "?";
}

}  // namespace ccgraph
