// ccgraph/core/error.hpp: the error types and the check macros every layer throws through.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ccgraph {

/// Base of every error ccgraph throws: bad input, failed collectives, backend failures.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A CUDA runtime or driver call failed; the message names the call and CUDA's error name.
class cuda_error : public error {
 public:
  using error::error;
};

/// An NCCL call failed; the message names the call and NCCL's error string.
class nccl_error : public error {
 public:
  using error::error;
};

/// A collective waited longer than the configured timeout; names the op and the missing ranks.
class timeout_error : public error {
 public:
  using error::error;
};

/// Ranks issued different collectives at the same position (op, group, dtype or shape differ).
class collective_mismatch_error : public error {
 public:
  using error::error;
};

/// Another rank failed and the world was aborted; names the failing rank and its error.
class aborted_error : public error {
 public:
  using error::error;
};

namespace detail {

/// The stream behind concat. Each argument goes through add, so `os << x` is resolved once per
/// argument type rather than once per call site's argument list: concat has hundreds of call
/// sites (string literals of every length among them), and that overload resolution, against
/// every operator<< in scope, was a measurable part of compiling the headers.
class message_builder {
 public:
  void add(const char* s) { os_ << s; }
  void add(const std::string& s) { os_ << s; }
  template <class T>
  void add(const T& x) {
    os_ << x;
  }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
};

/// Streams every argument into one string: the message builder behind the check macros.
template <class... Args>
std::string concat(const Args&... args) {
  message_builder b;
  (b.add(args), ...);
  return b.str();
}

[[noreturn]] inline void throw_error(const std::string& msg) { throw error(msg); }

}  // namespace detail
}  // namespace ccgraph

/// Throws ccgraph::error with the streamed message when `cond` is false. The message should read
/// like the call: "reduce_scatter_tensor: dim 1 (size 5) must be a multiple of group_size 2".
#define CCGRAPH_CHECK(cond, ...)                                              \
  do {                                                                        \
    if (!(cond)) ::ccgraph::detail::throw_error(::ccgraph::detail::concat(__VA_ARGS__)); \
  } while (0)

/// Throws an error of type `type` (derived from ccgraph::error) with the streamed message.
#define CCGRAPH_THROW(type, ...) throw type(::ccgraph::detail::concat(__VA_ARGS__))
