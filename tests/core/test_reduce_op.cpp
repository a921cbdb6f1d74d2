// Tests of ccgraph/core/reduce_op.hpp: names, case-insensitive parsing, reduce_op_arg.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ccgraph/core/reduce_op.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {
struct op_name {
  cg::reduce_op op;
  const char* lower;
  const char* upper;
  const char* mixed;
};
constexpr op_name named_ops[] = {
    {cg::reduce_op::sum, "sum", "SUM", "Sum"},
    {cg::reduce_op::avg, "avg", "AVG", "aVg"},
    {cg::reduce_op::product, "product", "PRODUCT", "Product"},
    {cg::reduce_op::min, "min", "MIN", "mIN"},
    {cg::reduce_op::max, "max", "MAX", "Max"},
    {cg::reduce_op::band, "band", "BAND", "bAnd"},
    {cg::reduce_op::bor, "bor", "BOR", "BoR"},
    {cg::reduce_op::bxor, "bxor", "BXOR", "bXor"},
};

// A function taking the argument type the collectives take.
cg::reduce_op accept(cg::reduce_op_arg op) { return op; }
}  // namespace

TEST_CASE("reduce_op.to_string") {
  static_assert(cg::to_string(cg::reduce_kind::sum) == "sum");
  static_assert(cg::to_string(cg::reduce_kind::avg) == "avg");
  static_assert(cg::to_string(cg::reduce_kind::product) == "product");
  static_assert(cg::to_string(cg::reduce_kind::min) == "min");
  static_assert(cg::to_string(cg::reduce_kind::max) == "max");
  static_assert(cg::to_string(cg::reduce_kind::band) == "band");
  static_assert(cg::to_string(cg::reduce_kind::bor) == "bor");
  static_assert(cg::to_string(cg::reduce_kind::bxor) == "bxor");
  for (const auto& n : named_ops) {
    CHECK(cg::to_string(n.op) == n.lower);
    std::ostringstream os;
    os << n.op;
    CHECK(os.str() == n.lower);
  }
}

TEST_CASE("reduce_op.parse_case_insensitive") {
  for (const auto& n : named_ops) {
    CAPTURE(n.lower);
    CHECK(cg::parse_reduce_op(n.lower) == n.op);
    CHECK(cg::parse_reduce_op(n.upper) == n.op);
    CHECK(cg::parse_reduce_op(n.mixed) == n.op);
    CHECK(cg::parse_reduce_op(std::string(n.upper)) == n.op);
    // Round trip through the printed name.
    CHECK(cg::parse_reduce_op(cg::to_string(n.op)) == n.op);
  }
}

TEST_CASE("reduce_op.parse_unknown_lists_valid_ops") {
  for (std::string_view bad : {"summ", "", " sum", "sum ", "mean", "prod", "and", "AVERAGE"}) {
    CAPTURE(bad);
    const std::string msg = error_of([&] { (void)cg::parse_reduce_op(bad); });
    REQUIRE_FALSE(msg.empty());
    CHECK(msg.find("'" + std::string(bad) + "'") != std::string::npos);  // names the input
    for (const auto& n : named_ops) CHECK(msg.find(n.lower) != std::string::npos);
  }
  CHECK(error_of([] { (void)cg::parse_reduce_op("mean"); }) ==
        "reduce_op: unknown reduce op 'mean'; valid ops are sum, avg, product, min, max, band, bor, bxor, premul_sum(<factor>)");
  // The error is a ccgraph::error, hence a std::runtime_error.
  CHECK_THROWS_AS((void)cg::parse_reduce_op("nope"), cg::error);
  CHECK_THROWS_AS((void)cg::parse_reduce_op("nope"), std::runtime_error);
  // A string_view that is not NUL-terminated is parsed by its length only.
  const std::string_view prefix = std::string_view("maxima").substr(0, 3);
  CHECK(cg::parse_reduce_op(prefix) == cg::reduce_op::max);
}

TEST_CASE("reduce_op.is_bitwise") {
  static_assert(cg::is_bitwise(cg::reduce_op::band));
  static_assert(cg::is_bitwise(cg::reduce_op::bor));
  static_assert(cg::is_bitwise(cg::reduce_op::bxor));
  static_assert(!cg::is_bitwise(cg::reduce_op::sum));
  static_assert(!cg::is_bitwise(cg::reduce_op::avg));
  static_assert(!cg::is_bitwise(cg::reduce_op::product));
  static_assert(!cg::is_bitwise(cg::reduce_op::min));
  static_assert(!cg::is_bitwise(cg::reduce_op::max));
  int bitwise = 0;
  for (const auto& n : named_ops) bitwise += cg::is_bitwise(n.op);
  CHECK(bitwise == 3);
}

TEST_CASE("reduce_op.arg_conversions") {
  static_assert(std::is_convertible_v<cg::reduce_op, cg::reduce_op_arg>);
  static_assert(std::is_convertible_v<const char*, cg::reduce_op_arg>);
  static_assert(std::is_convertible_v<std::string, cg::reduce_op_arg>);
  static_assert(std::is_convertible_v<const std::string&, cg::reduce_op_arg>);
  static_assert(std::is_convertible_v<std::string_view, cg::reduce_op_arg>);
  static_assert(std::is_convertible_v<cg::reduce_op_arg, cg::reduce_op>);
  static_assert(!std::is_convertible_v<int, cg::reduce_op_arg>);

  CHECK(accept(cg::reduce_op::bxor) == cg::reduce_op::bxor);
  CHECK(accept("Sum") == cg::reduce_op::sum);  // string literal
  const char* cstr = "AVG";
  CHECK(accept(cstr) == cg::reduce_op::avg);
  const std::string s = "product";
  CHECK(accept(s) == cg::reduce_op::product);
  CHECK(accept(std::string("MIN")) == cg::reduce_op::min);  // rvalue string
  CHECK(accept(std::string_view("max")) == cg::reduce_op::max);
  for (const auto& n : named_ops) {
    CHECK(accept(n.mixed) == n.op);
    CHECK(cg::reduce_op_arg(n.op).value == n.op);
  }
  const cg::reduce_op_arg arg = "bor";
  const cg::reduce_op back = arg;
  CHECK(back == cg::reduce_op::bor);
  // Unknown names fail at the conversion, with the same message.
  CHECK_THROWS_WITH_AS(accept("bogus"),
                       "reduce_op: unknown reduce op 'bogus'; valid ops are sum, avg, product, min, "
                       "max, band, bor, bxor, premul_sum(<factor>)",
                       cg::error);
  CHECK_THROWS_AS(accept(std::string("")), cg::error);
}

TEST_CASE("reduce_op.bool_as_bytes") {
  // NCCL has no bool type: bool travels as bytes holding 0 or 1 and is reduced as bytes. The
  // byte reduction bool_reduce_as_bytes picks must give the bool result for any number of
  // ranks; a plain byte sum counts the trues and wraps to 0 (false) at 256 of them.
  using R = cg::reduce_op;
  static_assert(cg::bool_reduce_as_bytes(R::sum) == R::max);
  static_assert(cg::bool_reduce_as_bytes(R::product) == R::min);
  static_assert(!cg::bool_reduce_as_bytes(R::avg).has_value());
  static_assert(!cg::bool_reduce_as_bytes(R::bxor).has_value());
  auto bool_reduce = [](R op, const std::vector<bool>& v) {
    bool any = false, all = true;
    for (bool b : v) {
      any = any || b;
      all = all && b;
    }
    return (op == R::sum || op == R::max || op == R::bor) ? any : all;
  };
  auto byte_reduce = [](R op, const std::vector<bool>& v) {
    std::uint8_t acc = v[0] ? 1 : 0;
    for (std::size_t i = 1; i < v.size(); ++i) {
      const std::uint8_t b = v[i] ? 1 : 0;
      switch (op.kind()) {
        case cg::reduce_kind::sum: acc = static_cast<std::uint8_t>(acc + b); break;
        case cg::reduce_kind::product: acc = static_cast<std::uint8_t>(acc * b); break;
        case cg::reduce_kind::min: acc = std::min(acc, b); break;
        case cg::reduce_kind::max: acc = std::max(acc, b); break;
        default: FAIL("no byte reduction for ", op);
      }
    }
    return acc != 0;
  };
  for (R op : {R::sum, R::product, R::min, R::max, R::band, R::bor}) {
    CAPTURE(op);
    const auto bytes = cg::bool_reduce_as_bytes(op);
    REQUIRE(bytes.has_value());
    for (std::size_t ranks : {1u, 2u, 3u, 255u, 256u, 257u, 512u})
      for (int pattern = 0; pattern < 4; ++pattern) {
        // all true, all false, one false, one true
        std::vector<bool> v(ranks, pattern == 0 || pattern == 2);
        if (pattern >= 2) v[ranks / 2] = !v[ranks / 2];
        CAPTURE(ranks);
        CAPTURE(pattern);
        CHECK(byte_reduce(*bytes, v) == bool_reduce(op, v));
      }
  }
  // What the mapping fixes: 256 trues summed as bytes are false.
  CHECK_FALSE(byte_reduce(R::sum, std::vector<bool>(256, true)));
}
