// tests/core/test_env.cpp: the one parser of CCGRAPH_* environment variables
// (ccgraph/core/env.hpp): unset or empty is the default, anything else parses completely or is
// an error naming the variable and its text.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <string>

#include <ccgraph/core/env.hpp>
#include <ccgraph/core/error.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;
using std::chrono::milliseconds;

namespace {

constexpr const char* var = "CCGRAPH_TEST_ENV_VALUE";

/// The error parsing `text` as `var` with `parse` gives ("" when none).
template <class F>
std::string error_with(const char* text, F parse) {
  ::setenv(var, text, 1);
  std::string m = error_of<cg::error>(parse);
  ::unsetenv(var);
  return m;
}

enum class color { red, green };

}  // namespace

TEST_CASE("env.milliseconds.strict") {
  const auto parse = [] { return cg::detail::env_milliseconds(var, milliseconds(42)); };
  ::unsetenv(var);
  CHECK(parse() == milliseconds(42));
  ::setenv(var, "", 1);
  CHECK(parse() == milliseconds(42));
  ::setenv(var, "1234", 1);
  CHECK(parse() == milliseconds(1234));
  ::setenv(var, "9223372036854775807", 1);  // milliseconds::max(): forever
  CHECK(parse() == milliseconds::max());
  ::unsetenv(var);
  // Each used to become 1 ms, 100 ms, the default, or the default (atoll and "> 0").
  for (const char* bad : {"1e3", "100ms", "abc", "-5", "0", " 5", "5 ", "+5", "0x10", "1.5",
                          "99999999999999999999"}) {
    CAPTURE(bad);
    const std::string m = error_with(bad, parse);
    CHECK(contains(m, std::string(var) + "='" + bad + "'"));
    CHECK(contains(m, "positive whole number of milliseconds"));
  }
}

TEST_CASE("env.seconds.strict") {
  const auto parse = [] { return cg::detail::env_seconds(var, milliseconds(7)); };
  ::unsetenv(var);
  CHECK(parse() == milliseconds(7));
  ::setenv(var, "0.25", 1);
  CHECK(parse() == milliseconds(250));
  ::setenv(var, "20", 1);
  CHECK(parse() == milliseconds(20000));
  ::setenv(var, "0.0001", 1);  // rounded up, never to 0
  CHECK(parse() == milliseconds(1));
  ::unsetenv(var);
  for (const char* bad : {"0", "-3", "soon", "1e3", "1e999", "nan", "inf", "2s", "1e10"}) {
    CAPTURE(bad);
    CHECK(contains(error_with(bad, parse), std::string(var) + "='" + bad + "'"));
  }
}

TEST_CASE("env.choice.names_the_choices") {
  const auto parse = [] {
    return cg::detail::env_choice<color>(var, {{"red", color::red}, {"green", color::green}});
  };
  ::unsetenv(var);
  CHECK(parse() == color::red);
  ::setenv(var, "green", 1);
  CHECK(parse() == color::green);
  ::unsetenv(var);
  const std::string m = error_with("Green", parse);
  CHECK(contains(m, std::string(var) + "='Green' is not one of red, green"));
}

TEST_CASE("env.integer.range_and_form") {
  using cg::detail::parse_env_integer;
  CHECK(parse_env_integer("X", "-7", -10, 10, "a small number") == -7);
  CHECK(contains(error_of<cg::error>([] { parse_env_integer("X", "11", -10, 10, "a small number"); }),
                 "X='11' is not a small number"));
  CHECK(contains(error_of<cg::error>([] { parse_env_integer("X", "", 0, 1, "a bit"); }),
                 "X='' is not a bit"));
}
