// bench/bench_args.hpp: the benches' command lines. A bench names its flags (with or without a
// value) and how many positional arguments it takes (numbers or words); anything else, a flag
// without its value or a number that does not parse prints the usage and exits with status 2,
// so a typo never runs a long benchmark with the defaults.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace bench {

/// A parsed command line: `has(flag)`, `value(flag)`, and the positional arguments in order.
class args {
 public:
  /// Parses argv. `usage` is printed (after "usage: <program> ") on a bad command line;
  /// `flags` take no value, `valued` take the next argument; at most `max_positional`
  /// positional arguments.
  args(int argc, char** argv, std::string usage, std::initializer_list<const char*> flags = {},
       std::initializer_list<const char*> valued = {}, std::size_t max_positional = 0)
      : program_(argc > 0 ? argv[0] : "bench"), usage_(std::move(usage)) {
    std::map<std::string, bool> known;  // flag -> takes a value
    for (const char* f : flags) known[f] = false;
    for (const char* f : valued) known[f] = true;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "-h" || a == "--help") fail("");
      if (a.size() > 1 && a[0] == '-' && !is_number(a)) {
        const auto it = known.find(a);
        if (it == known.end()) fail("unknown flag '" + a + "'");
        if (it->second) {
          if (i + 1 >= argc) fail("flag '" + a + "' needs a value");
          values_[a] = argv[++i];
        } else {
          values_[a] = "";
        }
      } else {
        if (positional_.size() >= max_positional) fail("unexpected argument '" + a + "'");
        positional_.push_back(a);
      }
    }
  }

  /// True when `flag` was given.
  bool has(const std::string& flag) const { return values_.count(flag) != 0; }

  /// The value given to `flag`, if it was given.
  std::optional<std::string> value(const std::string& flag) const {
    const auto it = values_.find(flag);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }

  /// The positional arguments, in order.
  const std::vector<std::string>& positional() const { return positional_; }

  /// Positional argument `i` as an integer, `fallback` when absent; a word that is not one
  /// integer (or is below `min`) is a usage error naming it.
  std::int64_t integer(std::size_t i, std::int64_t fallback, std::int64_t min = 1) const {
    return i < positional_.size() ? parse_integer(positional_[i], min) : fallback;
  }

  /// The value of `flag` as an integer, `fallback` when the flag was not given; a value that
  /// is not one integer (or is below `min`) is a usage error naming it.
  std::int64_t flag_integer(const std::string& flag, std::int64_t fallback, std::int64_t min = 1) const {
    const auto v = value(flag);
    return v ? parse_integer(*v, min, flag + " ") : fallback;
  }

  /// Prints `why` and the usage to stderr and exits with status 2.
  [[noreturn]] void fail(const std::string& why) const {
    if (!why.empty()) std::fprintf(stderr, "%s: %s\n", program_.c_str(), why.c_str());
    std::fprintf(stderr, "usage: %s %s\n", program_.c_str(), usage_.c_str());
    std::exit(2);
  }

 private:
  std::int64_t parse_integer(const std::string& s, std::int64_t min, const std::string& what = "") const {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno == ERANGE || v < min)
      fail(what + "'" + s + "' is not an integer >= " + std::to_string(min));
    return v;
  }

  static bool is_number(const std::string& s) {
    return s.size() > 1 && s[0] == '-' && (std::isdigit(static_cast<unsigned char>(s[1])) != 0);
  }

  std::string program_, usage_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace bench
