// ccgraph/core/source_location.hpp: where the user called a collective. Every public collective
// (ops/collectives.hpp) takes a defaulted std::source_location; the outermost of them on the
// calling thread makes it the thread's call site for the duration of the call, so the tracer
// stores it on the collective's node and the eager path on the request a backend matches. A
// mismatch error then names the file and line of each rank's call, not a library line.
#pragma once

#include <source_location>
#include <string>

namespace ccgraph::detail {

/// The calling thread's call site, or null outside any public collective.
inline const std::source_location*& call_site_ptr() {
  thread_local const std::source_location* site = nullptr;
  return site;
}

/// Makes `loc` the thread's call site for the scope's lifetime unless one is set already: the
/// outermost call wins (cg::all_gather calls cg::all_gather_tensor, and the user called the
/// former). `force` replaces any outer one (the executor, running a node it knows the site of).
class call_site_scope {
 public:
  explicit call_site_scope(const std::source_location& loc, bool force = false) : prev_(call_site_ptr()) {
    if (force || !prev_) call_site_ptr() = &loc;
  }
  call_site_scope(const call_site_scope&) = delete;
  call_site_scope& operator=(const call_site_scope&) = delete;
  ~call_site_scope() { call_site_ptr() = prev_; }

 private:
  const std::source_location* prev_;
};

/// The thread's call site, or an unknown location (line 0).
inline std::source_location current_call_site() {
  const std::source_location* p = call_site_ptr();
  return p ? *p : std::source_location{};
}

/// True when `loc` names a place (a default-constructed location has line 0).
inline bool known_site(const std::source_location& loc) { return loc.line() != 0; }

/// "file:line", or "" when unknown.
inline std::string site_str(const std::source_location& loc) {
  if (!known_site(loc)) return {};
  return std::string(loc.file_name()) + ":" + std::to_string(loc.line());
}

/// " at file:line", or "" when unknown: appended to a collective's description in errors.
inline std::string at_site(const std::source_location& loc) {
  return known_site(loc) ? " at " + site_str(loc) : std::string();
}

}  // namespace ccgraph::detail
