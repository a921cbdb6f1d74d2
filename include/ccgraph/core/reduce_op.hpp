// ccgraph/core/reduce_op.hpp: reduction operators of the collectives, and their parsing.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <ccgraph/core/error.hpp>

namespace ccgraph {

/// The kind of a reduction, without its parameter: what a switch over reduce ops reads
/// (`switch (op.kind())`). premul_sum's factor lives in reduce_op.
enum class reduce_kind : unsigned char { sum, avg, product, min, max, band, bor, bxor, premul_sum };

namespace detail {
inline constexpr std::array<std::pair<reduce_kind, std::string_view>, 9> reduce_op_names{{
    {reduce_kind::sum, "sum"},
    {reduce_kind::avg, "avg"},
    {reduce_kind::product, "product"},
    {reduce_kind::min, "min"},
    {reduce_kind::max, "max"},
    {reduce_kind::band, "band"},
    {reduce_kind::bor, "bor"},
    {reduce_kind::bxor, "bxor"},
    {reduce_kind::premul_sum, "premul_sum"},
}};

[[noreturn]] inline void premul_sum_needs_factor(std::string_view what) {
  CCGRAPH_THROW(error, what, ": premul_sum needs its factor: pass cg::premul_sum(0.5) (or the string \"premul_sum(0.5)\")");
}
}  // namespace detail

/// Lower-case name of a kind: "sum", "avg", ..., "premul_sum".
constexpr std::string_view to_string(reduce_kind k) {
  for (auto& [o, n] : detail::reduce_op_names)
    if (o == k) return n;
  return "?";
}

/// The reductions all_reduce, reduce_scatter and reduce apply (c10d's ReduceOp): a kind, and
/// for premul_sum its scalar factor (c10d's `_make_nccl_premul_sum(factor)`: every input is
/// multiplied by the factor, then summed). Written `reduce_op::sum`, ..., `reduce_op::bxor`,
/// `reduce_op::premul_sum(0.5)` (or `cg::premul_sum(0.5)`). Two reduce ops are equal when
/// their kinds and factors (bit for bit) are: what caches, bucketing and the collective-order
/// check compare. band/bor/bxor accept integer and bool tensors only; premul_sum floating and
/// complex ones only.
class reduce_op {
 public:
  static const reduce_op sum, avg, product, min, max, band, bor, bxor;

  /// premul_sum with factor `factor`: sum over members of `factor * input` (the factor is cast
  /// to the tensor's dtype first, as NCCL's ncclRedOpCreatePreMulSum does).
  static constexpr reduce_op premul_sum(double factor) { return reduce_op(reduce_kind::premul_sum, factor); }

  /// reduce_op::sum.
  constexpr reduce_op() = default;
  /// The op of a kind that takes no parameter; reduce_kind::premul_sum is an error that says how
  /// to give its factor.
  constexpr reduce_op(reduce_kind k) : kind_(k) {  // NOLINT: implicit
    if (k == reduce_kind::premul_sum) detail::premul_sum_needs_factor("reduce_op");
  }

  /// The kind: what to switch on.
  constexpr reduce_kind kind() const { return kind_; }
  /// premul_sum's factor; 1 for the other kinds.
  constexpr double factor() const { return factor_; }

  /// Same kind and, bit for bit, the same factor.
  friend constexpr bool operator==(const reduce_op& a, const reduce_op& b) {
    return a.kind_ == b.kind_ && std::bit_cast<std::uint64_t>(a.factor_) == std::bit_cast<std::uint64_t>(b.factor_);
  }

 private:
  constexpr reduce_op(reduce_kind k, double f) : kind_(k), factor_(f) {}
  reduce_kind kind_ = reduce_kind::sum;
  double factor_ = 1.0;
};

inline constexpr reduce_op reduce_op::sum{reduce_kind::sum};
inline constexpr reduce_op reduce_op::avg{reduce_kind::avg};
inline constexpr reduce_op reduce_op::product{reduce_kind::product};
inline constexpr reduce_op reduce_op::min{reduce_kind::min};
inline constexpr reduce_op reduce_op::max{reduce_kind::max};
inline constexpr reduce_op reduce_op::band{reduce_kind::band};
inline constexpr reduce_op reduce_op::bor{reduce_kind::bor};
inline constexpr reduce_op reduce_op::bxor{reduce_kind::bxor};

/// premul_sum with factor `factor` (c10d's `_make_nccl_premul_sum`): each member's input is
/// multiplied by `factor` (cast to the tensor's dtype), then summed. Floating and complex
/// tensors only. `cg::all_reduce(t, cg::premul_sum(1.0 / n), g)` is avg by another name.
constexpr reduce_op premul_sum(double factor) { return reduce_op::premul_sum(factor); }

/// Printed name: "sum", "avg", ..., and "premul_sum(0.5)" with the factor in its shortest
/// round-trip form (so two different factors never print alike).
inline std::string to_string(reduce_op op) {
  std::string s(to_string(op.kind()));
  if (op.kind() != reduce_kind::premul_sum) return s;
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, op.factor());
  return s + '(' + std::string(buf, r.ptr) + ')';
}

inline std::ostream& operator<<(std::ostream& os, reduce_kind k) { return os << to_string(k); }
inline std::ostream& operator<<(std::ostream& os, reduce_op op) { return os << to_string(op); }

/// Parses a reduce op name case-insensitively ("SUM", "Avg", "premul_sum(0.5)"); an unknown name
/// is an error that lists the valid ones, and "premul_sum" without a factor an error saying
/// how to give one.
inline reduce_op parse_reduce_op(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  constexpr std::string_view premul = "premul_sum";
  if (lower == premul) detail::premul_sum_needs_factor("reduce_op '" + std::string(name) + "'");
  if (lower.size() > premul.size() + 2 && lower.starts_with(premul) && lower[premul.size()] == '(' &&
      lower.back() == ')') {
    double f = 0;
    const char* first = lower.data() + premul.size() + 1;
    const char* last = lower.data() + lower.size() - 1;
    const auto r = std::from_chars(first, last, f);
    CCGRAPH_CHECK(r.ec == std::errc() && r.ptr == last, "reduce_op: premul_sum factor '", std::string_view(first, last - first),
                  "' in '", name, "' is not a number");
    return premul_sum(f);
  }
  for (auto& [o, n] : detail::reduce_op_names)
    if (n == lower && o != reduce_kind::premul_sum) return o;
  std::string valid;
  for (auto& [o, n] : detail::reduce_op_names)
    valid += (valid.empty() ? "" : ", ") + std::string(n) + (o == reduce_kind::premul_sum ? "(<factor>)" : "");
  CCGRAPH_THROW(error, "reduce_op: unknown reduce op '", name, "'; valid ops are ", valid);
}

/// True for the bitwise reductions, which need integer or bool tensors.
constexpr bool is_bitwise(reduce_op op) {
  return op.kind() == reduce_kind::band || op.kind() == reduce_kind::bor || op.kind() == reduce_kind::bxor;
}

/// The reduction over bytes that gives `op`'s result on bool values sent as bytes holding 0 or
/// 1 (NCCL has no bool type: bool travels as ncclUint8, as in c10d). sum and bor are "any"
/// (max), product and band are "all" (min): a byte sum would count the trues and wrap to false
/// at 256 of them (c10d maps sum to max; min for product also stays right for bytes other than
/// 0 and 1). min and max are themselves. avg (no mean of bools), premul_sum (no factor of a
/// bool) and bxor (no byte reduction gives parity) have none: std::nullopt.
constexpr std::optional<reduce_op> bool_reduce_as_bytes(reduce_op op) {
  switch (op.kind()) {
    case reduce_kind::sum:
    case reduce_kind::max:
    case reduce_kind::bor: return reduce_op::max;
    case reduce_kind::product:
    case reduce_kind::min:
    case reduce_kind::band: return reduce_op::min;
    case reduce_kind::avg:
    case reduce_kind::premul_sum:
    case reduce_kind::bxor: break;
  }
  return std::nullopt;
}

/// A reduce op given as a reduce_op (`reduce_op::sum`, `cg::premul_sum(0.5)`) or as a
/// (case-insensitive) name: what collectives accept.
struct reduce_op_arg {
  reduce_op value;
  reduce_op_arg(reduce_op op) : value(op) {}                                  // NOLINT: implicit
  reduce_op_arg(reduce_kind k) : value(k) {}                                  // NOLINT: implicit
  reduce_op_arg(std::string_view name) : value(parse_reduce_op(name)) {}     // NOLINT: implicit
  reduce_op_arg(const char* name) : value(parse_reduce_op(name)) {}          // NOLINT: implicit
  reduce_op_arg(const std::string& name) : value(parse_reduce_op(name)) {}   // NOLINT: implicit
  operator reduce_op() const { return value; }                               // NOLINT: implicit
};

}  // namespace ccgraph
