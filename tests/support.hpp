// tests/support.hpp: the helpers the CPU test files share, defined once. The test files are
// compiled in batches, several to one translation unit (CCGRAPH_UNITY_TESTS), so a helper two
// files defined for themselves would be defined twice.
#pragma once

#include <chrono>
#include <numeric>
#include <utility>
#include <string>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/runtime/threads.hpp>
#include <ccgraph/trace/trace_state.hpp>

namespace ccgraph_test {

/// Whether `part` occurs in `s`.
inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// The message of the `E` that `f` throws, or "" when it throws nothing (a CHECK on the message
/// then fails and shows it).
template <class E = ccgraph::error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

/// Seconds since `t0`.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// 0, 1, ..., n - 1.
inline std::vector<int> iota_ranks(int n) {
  std::vector<int> r(static_cast<std::size_t>(n));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

/// threads-backend options with `timeout`; the default is generous for tests that must not
/// time out (a bug fails in seconds, never hangs the binary).
inline ccgraph::threads_options threads_opts(
    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  ccgraph::threads_options o;
  o.timeout = timeout;
  return o;
}

/// Runs `fn` on `n` ranks of the threads backend with threads_opts().
template <class F>
void run(int n, F&& fn) {
  ccgraph::run_threads(n, std::forward<F>(fn), threads_opts());
}

/// Tracing options for rank `rank` of a world of `n`.
inline ccgraph::trace_options world(int n, int rank = 0) {
  return ccgraph::trace_options{.rank = rank, .world_size = n};
}

/// `v` as a double, through the type's compute type (bf16 and f16 through float).
template <class T>
double to_d(T v) {
  return static_cast<double>(static_cast<ccgraph::compute_t<T>>(v));
}

/// The bytes of every tensor's values, each preceded by its shape: a bitwise comparison of
/// results (NaN included).
template <class Tensor>
std::string bits_of(const std::vector<Tensor>& ts) {
  std::string s;
  for (const auto& t : ts) {
    for (auto d : t.shape()) s += std::to_string(d) + ",";
    const auto v = t.to_vector();
    s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(typename Tensor::value_type));
  }
  return s;
}

/// Every dtype a tensor can hold (the collectives' and p2p tests' loops).
inline constexpr ccgraph::dtype every_dtype[] = {ccgraph::dtype::f32, ccgraph::dtype::f64, ccgraph::dtype::i32,
                                                 ccgraph::dtype::i64, ccgraph::dtype::u8,  ccgraph::dtype::boolean,
                                                 ccgraph::dtype::bf16, ccgraph::dtype::f16};

}  // namespace ccgraph_test
