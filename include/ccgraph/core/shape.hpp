// ccgraph/core/shape.hpp: shapes, strides and the dimension arithmetic every op validates with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <ccgraph/core/error.hpp>

namespace ccgraph {

/// Sizes of a tensor's dimensions, outermost first (PyTorch's `shape`).
using shape_t = std::vector<std::int64_t>;
/// Element strides of a tensor's dimensions.
using strides_t = std::vector<std::int64_t>;

/// Number of elements of a shape (1 for a scalar shape {}).
inline std::int64_t numel_of(const shape_t& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>{});
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
