// ccgraph/core/timeout.hpp: the timeouts of every backend, store and option, checked and turned
// into deadlines in one place. A timeout must be positive; std::chrono::milliseconds::max() (or
// any timeout longer than the steady clock can count from now, about 292 years) waits forever:
// deadlines saturate at time_point::max() instead of overflowing, and messages say "forever"
// instead of printing the huge number.
#pragma once

#include <chrono>
#include <cstdint>
#include <ratio>
#include <string>
#include <string_view>
#include <type_traits>

#include <ccgraph/core/error.hpp>

namespace ccgraph::detail {

/// Whether `timeout` means "wait forever": it is longer than the steady clock can count.
constexpr bool waits_forever(std::chrono::milliseconds timeout) noexcept {
  return timeout >=
         std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::duration::max());
}

/// How messages name a timeout: "300000 ms", or "forever" for one that waits forever.
inline std::string timeout_text(std::chrono::milliseconds timeout) {
  if (waits_forever(timeout)) return "forever";
  return std::to_string(timeout.count()) + " ms";
}

/// Throws error unless `timeout` is positive; `what` names the call or option
/// ("run_threads: threads_options::timeout"). Zero and negative timeouts have no meaning
/// (c10d's negative "no timeout" is milliseconds::max() here).
inline void check_timeout(std::string_view what, std::chrono::milliseconds timeout) {
  CCGRAPH_CHECK(timeout.count() > 0, what, ": the timeout must be positive, got ", timeout.count(),
                " ms (std::chrono::milliseconds::max() waits forever)");
}

/// `now` + `timeout`, saturating at time_point::max() (which no clock reaches: a wait until it
/// is a wait forever); `now` for a timeout that is not positive. Never overflows, whatever the
/// timeout.
template <class Clock, class Dur>
constexpr std::chrono::time_point<Clock, Dur> deadline_after(std::chrono::time_point<Clock, Dur> now,
                                                            std::chrono::milliseconds timeout) noexcept {
  // Compared in milliseconds, the coarser unit: converting the timeout into the clock's unit
  // first is exactly the overflow this avoids.
  static_assert(std::ratio_less_equal_v<typename Dur::period, std::milli>,
                "deadline_after: the clock must count milliseconds or finer");
  using time_point = std::chrono::time_point<Clock, Dur>;
  if (timeout <= std::chrono::milliseconds::zero()) return now;
  const Dur left = now.time_since_epoch() < Dur::zero() ? Dur::max() : time_point::max() - now;
  if (timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(left)) return time_point::max();
  return now + std::chrono::duration_cast<Dur>(timeout);
}

/// Whether `waited` is longer than `timeout`, without converting a huge timeout into the
/// clock's unit (which overflows): never for a timeout that waits forever.
template <class Rep, class Period>
constexpr bool past_timeout(std::chrono::duration<Rep, Period> waited,
                            std::chrono::milliseconds timeout) noexcept {
  using waited_t = std::chrono::duration<Rep, Period>;
  static_assert(std::ratio_less_equal_v<Period, std::milli>,
                "past_timeout: `waited` must count milliseconds or finer");
  if (timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(waited_t::max())) return false;
  return waited > std::chrono::duration_cast<waited_t>(timeout);
}

}  // namespace ccgraph::detail
