// ccgraph/core/reduce_op.hpp: reduction operators of the collectives, and their parsing.
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include <ccgraph/core/error.hpp>

namespace ccgraph {

/// The reductions all_reduce and reduce_scatter apply (c10d's ReduceOp). band/bor/bxor accept
/// integer and bool tensors only.
enum class reduce_op : unsigned char { sum, avg, product, min, max, band, bor, bxor };

namespace detail {
inline constexpr std::array<std::pair<reduce_op, std::string_view>, 8> reduce_op_names{{
    {reduce_op::sum, "sum"},
    {reduce_op::avg, "avg"},
    {reduce_op::product, "product"},
    {reduce_op::min, "min"},
    {reduce_op::max, "max"},
    {reduce_op::band, "band"},
    {reduce_op::bor, "bor"},
    {reduce_op::bxor, "bxor"},
}};
}  // namespace detail

/// Lower-case name: "sum", "avg", ...
constexpr std::string_view to_string(reduce_op op) {
  for (auto& [o, n] : detail::reduce_op_names)
    if (o == op) return n;
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, reduce_op op) { return os << to_string(op); }

/// Parses a reduce op name case-insensitively ("SUM", "Avg"); an unknown name is an error that
/// lists the valid ones.
inline reduce_op parse_reduce_op(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (auto& [o, n] : detail::reduce_op_names)
    if (n == lower) return o;
  std::string valid;
  for (auto& [o, n] : detail::reduce_op_names) valid += (valid.empty() ? "" : ", ") + std::string(n);
  CCGRAPH_THROW(error, "reduce_op: unknown reduce op '", name, "'; valid ops are ", valid);
}

/// True for the bitwise reductions, which need integer or bool tensors.
constexpr bool is_bitwise(reduce_op op) {
  return op == reduce_op::band || op == reduce_op::bor || op == reduce_op::bxor;
}

/// The reduction over bytes that gives `op`'s result on bool values sent as bytes holding 0 or
/// 1 (NCCL has no bool type: bool travels as ncclUint8, as in c10d). sum and bor are "any"
/// (max), product and band are "all" (min): a byte sum would count the trues and wrap to false
/// at 256 of them (c10d maps sum to max; min for product also stays right for bytes other than
/// 0 and 1). min and max are themselves. avg (no mean of bools) and bxor (no byte reduction
/// gives parity) have none: std::nullopt.
constexpr std::optional<reduce_op> bool_reduce_as_bytes(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::max:
    case reduce_op::bor: return reduce_op::max;
    case reduce_op::product:
    case reduce_op::min:
    case reduce_op::band: return reduce_op::min;
    case reduce_op::avg:
    case reduce_op::bxor: break;
  }
  return std::nullopt;
}

/// A reduce op given as the enum or as a (case-insensitive) name: what collectives accept.
struct reduce_op_arg {
  reduce_op value;
  reduce_op_arg(reduce_op op) : value(op) {}                         // NOLINT: implicit
  reduce_op_arg(std::string_view name) : value(parse_reduce_op(name)) {}  // NOLINT: implicit
  reduce_op_arg(const char* name) : value(parse_reduce_op(name)) {}       // NOLINT: implicit
  reduce_op_arg(const std::string& name) : value(parse_reduce_op(name)) {}  // NOLINT: implicit
  operator reduce_op() const { return value; }                            // NOLINT: implicit
};

}  // namespace ccgraph
