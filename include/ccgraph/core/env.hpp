// ccgraph/core/env.hpp: the one parser of ccgraph's environment variables (CCGRAPH_*). Unset or
// empty means "the default"; any other text must parse completely, or it is an error naming the
// variable, its text and what was expected: never a silent default, and never half a number
// ("100ms" is not 100, "1e3" is not 1).
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <ccgraph/core/error.hpp>

namespace ccgraph::detail {

/// The text of environment variable `name`, or nullopt when it is unset or empty.
inline std::optional<std::string> env_text(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

/// The value `text` (of environment variable `name`) names among `choices`; anything else is
/// an error naming the variable, the text and the choices.
template <class E>
E parse_env_choice(const char* name, std::string_view text,
                   std::initializer_list<std::pair<std::string_view, E>> choices) {
  std::string names;
  for (const auto& [n, e] : choices) {
    if (text == n) return e;
    names += (names.empty() ? "" : ", ") + std::string(n);
  }
  CCGRAPH_THROW(error, name, "='", text, "' is not one of ", names);
}

/// The value environment variable `name` names among `choices`; the first when it is unset or
/// empty.
template <class E>
E env_choice(const char* name, std::initializer_list<std::pair<std::string_view, E>> choices) {
  const auto text = env_text(name);
  return text ? parse_env_choice(name, *text, choices) : choices.begin()->second;
}

/// `text` (of environment variable `name`) as a decimal integer in [lo, hi]: the whole text,
/// digits with an optional leading '-', nothing else. Anything else is an error naming the
/// variable and the text; `what` says what was expected ("a positive number of milliseconds").
inline std::int64_t parse_env_integer(const char* name, std::string_view text, std::int64_t lo,
                                      std::int64_t hi, std::string_view what) {
  std::int64_t v = 0;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(text.data(), last, v);
  if (text.empty() || ec != std::errc() || end != last || v < lo || v > hi)
    CCGRAPH_THROW(error, name, "='", text, "' is not ", what);
  return v;
}

/// Environment variable `name` as a whole number of milliseconds, at least 1 (a number as large
/// as milliseconds::max(), 9223372036854775807, waits forever); `fallback` when it is unset or
/// empty. "1e3", "100ms", "abc", "0" and "-5" are errors naming the variable.
inline std::chrono::milliseconds env_milliseconds(const char* name, std::chrono::milliseconds fallback) {
  const auto text = env_text(name);
  if (!text) return fallback;
  return std::chrono::milliseconds(parse_env_integer(
      name, *text, 1, std::numeric_limits<std::int64_t>::max(),
      "a positive whole number of milliseconds (9223372036854775807 waits forever)"));
}

/// Environment variable `name` as a positive number of seconds, fractions allowed ("0.25",
/// "20"; no exponent, no unit), rounded up to whole milliseconds; `fallback` when it is unset or
/// empty. At most 1e9 s (about 31 years).
inline std::chrono::milliseconds env_seconds(const char* name, std::chrono::milliseconds fallback) {
  const auto text = env_text(name);
  if (!text) return fallback;
  double v = 0;
  const char* last = text->data() + text->size();
  const auto [end, ec] = std::from_chars(text->data(), last, v, std::chars_format::fixed);
  if (ec != std::errc() || end != last || !std::isfinite(v) || v <= 0 || v > 1e9)
    CCGRAPH_THROW(error, name, "='", *text, "' is not a positive number of seconds (at most 1e9)");
  return std::chrono::milliseconds(std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(v * 1000))));
}

}  // namespace ccgraph::detail
