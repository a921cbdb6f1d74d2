// ccgraph/core/log.hpp: what ccgraph prints about itself, and how much: $CCGRAPH_LOG_LEVEL
// (off, error, warn, info, debug; docs/environment.md says what each level prints), or
// cg::set_log_level. Lines go to std::cerr (or cg::set_log_stream's stream), one write per line
// under a lock, so ranks running as threads do not interleave within a line:
//   [ccgraph info] store: rank 0 serves world_size 2 at 127.0.0.1:29500
#pragma once

#include <ccgraph/core/config.hpp>
#include <atomic>
#include <iosfwd>
#include <string>
#include <string_view>

#include <ccgraph/core/error.hpp>

namespace ccgraph {

/// How much ccgraph prints: each level prints its own lines and those of the levels before it.
enum class log_level : int {
  off = 0,    ///< nothing
  error = 1,  ///< failures that cannot be thrown (a store server that stops, a destructor's)
  warn = 2,   ///< (the default) what may surprise: a CCGRAPH_* setting that is ignored here
  info = 3,   ///< set-up: stores served and joined, worlds started and aborted, calibration
  debug = 4,  ///< per step of work: each schedule pass (nodes, collectives, time), store retries
};

/// The level in force: set_log_level's, else $CCGRAPH_LOG_LEVEL (read on first use; a value
/// other than off, error, warn, info, debug is an error naming the variable and the choices),
/// else warn.
CCGRAPH_DECL log_level get_log_level();

/// Sets the level for the whole process, over $CCGRAPH_LOG_LEVEL.
CCGRAPH_DECL void set_log_level(log_level level);

/// Where log lines go: `os`, or std::cerr when null (the default). The stream must outlive
/// every later log line.
CCGRAPH_DECL void set_log_stream(std::ostream* os);

/// "off", "error", "warn", "info" or "debug".
CCGRAPH_DECL std::string_view log_level_name(log_level level);

namespace detail {

/// $CCGRAPH_LOG_LEVEL: warn when unset or empty; off, error, warn, info or debug; anything else
/// is an error naming the variable, its text and the choices.
CCGRAPH_DECL log_level env_log_level();

/// Forgets set_log_level's level and the environment's, so the next get_log_level reads
/// $CCGRAPH_LOG_LEVEL again (for tests).
CCGRAPH_DECL void reset_log_level();

/// True when a line at `level` is printed.
inline bool log_enabled(log_level level) {
  return level != log_level::off && static_cast<int>(level) <= static_cast<int>(get_log_level());
}

/// Writes "[ccgraph <level>] <component>: <message>\n" to the log stream, in one write.
CCGRAPH_DECL void write_log(log_level level, std::string_view component, const std::string& message);

/// Logs `parts` (concatenated as detail::concat does) at `level` from `component` ("store",
/// "schedule"); nothing is formatted when the level is off.
template <class... Parts>
void log(log_level level, std::string_view component, const Parts&... parts) {
  if (log_enabled(level)) write_log(level, component, concat(parts...));
}

}  // namespace detail
}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/core/impl/log.ipp>
#endif
