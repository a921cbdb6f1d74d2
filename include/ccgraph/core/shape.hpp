// ccgraph/core/shape.hpp: shapes, strides and the dimension arithmetic every op validates with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <ccgraph/core/error.hpp>

namespace ccgraph {

/// Sizes of a tensor's dimensions, outermost first (PyTorch's `shape`).
using shape_t = std::vector<std::int64_t>;
/// Element strides of a tensor's dimensions.
using strides_t = std::vector<std::int64_t>;

/// Number of elements of a shape (1 for a scalar shape {}), for shapes that exist: every
/// tensor's and node's shape was validated by checked_numel when it was made.
inline std::int64_t numel_of(const shape_t& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>{});
}

/// `a * b` for sizes (both >= 0); false when the product exceeds 2^63 - 1 (`out` is then unset).
inline bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& out) {
  if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a) return false;
  out = a * b;
  return true;
}

/// `a + b` for sizes (both >= 0); false when the sum exceeds 2^63 - 1 (`out` is then unset).
inline bool checked_add(std::int64_t a, std::int64_t b, std::int64_t& out) {
  if (b > std::numeric_limits<std::int64_t>::max() - a) return false;
  out = a + b;
  return true;
}

/// Row-major (contiguous) strides of a shape.
inline strides_t contiguous_strides(const shape_t& s) {
  strides_t st(s.size());
  std::int64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

/// Prints a shape as PyTorch does in messages: [4, 4].
inline std::string shape_str(const shape_t& s) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

/// True when every size of `s` is >= 0 and the product of its nonzero sizes is at most
/// 2^63 - 1: a shape whose element count and contiguous strides are representable.
inline bool countable(const shape_t& s) {
  std::int64_t nonzero = 1;
  for (auto d : s)
    if (d < 0 || (d != 0 && !checked_mul(nonzero, d, nonzero))) return false;
  return true;
}

/// numel_of for a shape about to be created, validated: every size >= 0 and the product of
/// the nonzero sizes at most 2^63 - 1 (so the element count and every contiguous stride are
/// representable, even when a zero size makes the count 0). `what` names the call in the error,
/// which shows the shape.
inline std::int64_t checked_numel(const shape_t& s, std::string_view what) {
  std::int64_t nonzero = 1;
  bool empty = false;
  for (auto d : s) {
    CCGRAPH_CHECK(d >= 0, what, ": negative size in shape ", shape_str(s));
    if (d == 0) empty = true;
    else CCGRAPH_CHECK(checked_mul(nonzero, d, nonzero), what, ": shape ", shape_str(s),
                       " has too many elements (the product of its sizes exceeds 2^63 - 1)");
  }
  return empty ? 0 : nonzero;
}

/// Prints any vector of integers as [a, b, c].
template <class Int>
std::string list_str(const std::vector<Int>& v) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
  return os.str();
}

/// Normalises a possibly negative dim against `rank`; `what` names the call in the error.
inline int normalize_dim(std::int64_t dim, std::size_t rank, const char* what) {
  const auto r = static_cast<std::int64_t>(rank);
  CCGRAPH_CHECK((dim >= -r && dim < r) || (r == 0 && (dim == 0 || dim == -1)), what, ": dim ", dim,
                " is out of range for a tensor of rank ", r);
  return static_cast<int>(dim < 0 ? dim + (r == 0 ? 1 : r) : dim);
}

/// The shape two operands broadcast to: equal sizes, or 1, with trailing dims aligned
/// (NumPy/PyTorch rules). `what` names the call in the error, which shows both shapes.
inline shape_t broadcast_shapes(const shape_t& a, const shape_t& b, const char* what) {
  const std::size_t n = std::max(a.size(), b.size());
  shape_t out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    CCGRAPH_CHECK(da == db || da == 1 || db == 1, what, ": shapes ", shape_str(a), " and ",
                  shape_str(b), " cannot be broadcast together (dim ", i, ": ", da, " vs ", db,
                  ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace ccgraph
