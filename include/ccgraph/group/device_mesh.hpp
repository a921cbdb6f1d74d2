// ccgraph/group/device_mesh.hpp: an N-d arrangement of ranks with named dimensions (DeviceMesh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>

namespace ccgraph {

/// Ranks laid out row-major on an N-d grid, with optional dimension names ("dp", "tp"). A mesh
/// dimension names a family of groups: the ranks that differ only in that coordinate.
class device_mesh {
 public:
  /// A mesh over ranks 0..prod(shape)-1 in row-major order.
  explicit device_mesh(shape_t shape, std::vector<std::string> dim_names = {})
      : device_mesh(shape, iota(numel_of(shape)), std::move(dim_names)) {}

  /// A mesh over the given ranks, listed row-major.
  device_mesh(shape_t shape, std::vector<int> ranks, std::vector<std::string> dim_names = {})
      : shape_(std::move(shape)), ranks_(std::move(ranks)), names_(std::move(dim_names)) {
    CCGRAPH_CHECK(!shape_.empty(), "device_mesh: the shape must have at least one dimension");
    for (auto s : shape_) CCGRAPH_CHECK(s > 0, "device_mesh: invalid shape ", shape_str(shape_));
    CCGRAPH_CHECK(numel_of(shape_) == static_cast<std::int64_t>(ranks_.size()), "device_mesh: ",
                  ranks_.size(), " ranks do not fill shape ", shape_str(shape_));
    auto sorted = ranks_;
    std::sort(sorted.begin(), sorted.end());
    CCGRAPH_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                  "device_mesh: rank listed twice in ", list_str(ranks_));
    CCGRAPH_CHECK(names_.empty() || names_.size() == shape_.size(), "device_mesh: ", names_.size(),
                  " dim names for a ", shape_.size(), "-d mesh");
  }

  /// Number of dimensions.
  int ndim() const { return static_cast<int>(shape_.size()); }
  /// Sizes of the dimensions.
  const shape_t& shape() const { return shape_; }
  /// Size of dimension `dim`.
  int size(int dim) const { return static_cast<int>(shape_[check_dim(dim)]); }
  /// Number of ranks in the mesh.
  int size() const { return static_cast<int>(ranks_.size()); }
  /// All ranks, row-major.
  const std::vector<int>& ranks() const { return ranks_; }
  /// Dimension names (empty when unnamed).
  const std::vector<std::string>& dim_names() const { return names_; }

  /// Index of the dimension called `name`; an unknown name is an error listing the names.
  int dim_index(std::string_view name) const {
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) return static_cast<int>(i);
    std::string all;
    for (auto& n : names_) all += (all.empty() ? "" : ", ") + n;
    CCGRAPH_THROW(error, "device_mesh: no dimension named '", name, "' (dims: ",
                  all.empty() ? std::string("unnamed") : all, ")");
  }

  /// True if `rank` is in the mesh.
  bool contains(int rank) const { return std::find(ranks_.begin(), ranks_.end(), rank) != ranks_.end(); }

  /// Coordinates of `rank` on the mesh.
  std::vector<std::int64_t> coordinate(int rank) const {
    auto it = std::find(ranks_.begin(), ranks_.end(), rank);
    CCGRAPH_CHECK(it != ranks_.end(), "device_mesh: rank ", rank, " is not in the mesh ",
                  list_str(ranks_));
    std::int64_t flat = it - ranks_.begin();
    std::vector<std::int64_t> c(shape_.size());
    for (std::size_t d = shape_.size(); d-- > 0;) {
      c[d] = flat % shape_[d];
      flat /= shape_[d];
    }
    return c;
  }

  /// Every group along `dim`: the rank lists that vary only in that coordinate, in mesh order.
  std::vector<std::vector<int>> groups_along(int dim) const {
    const int d = check_dim(dim);
    const auto st = contiguous_strides(shape_);
    std::vector<std::vector<int>> out;
    for (std::int64_t flat = 0; flat < static_cast<std::int64_t>(ranks_.size()); ++flat) {
      if ((flat / st[d]) % shape_[d] != 0) continue;  // not the first along dim
      std::vector<int> g;
      for (std::int64_t k = 0; k < shape_[d]; ++k) g.push_back(ranks_[flat + k * st[d]]);
      out.push_back(std::move(g));
    }
    return out;
  }

 private:
  static std::vector<int> iota(std::int64_t n) {
    std::vector<int> r(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = static_cast<int>(i);
    return r;
  }
  int check_dim(int dim) const {
    CCGRAPH_CHECK(dim >= 0 && dim < ndim(), "device_mesh: dim ", dim, " out of range for a ",
                  ndim(), "-d mesh");
    return dim;
  }

  shape_t shape_;
  std::vector<int> ranks_;
  std::vector<std::string> names_;
};

}  // namespace ccgraph
