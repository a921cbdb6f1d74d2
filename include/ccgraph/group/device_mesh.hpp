// ccgraph/group/device_mesh.hpp: an N-d arrangement of ranks with named dimensions (DeviceMesh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <iterator>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>

namespace ccgraph {

/// Ranks laid out row-major on an N-d grid, with optional dimension names ("dp", "tp"). A mesh
/// dimension names a family of groups: the ranks that differ only in that coordinate.
///
/// `mesh["tp"]` is a sub-mesh (PyTorch's DeviceMesh.__getitem__): the mesh dimensions named,
/// through the calling rank. A device_mesh holds no calling rank, so a sub-mesh keeps its parent
/// and stands for every slice of it at once; each rank uses the slice it is in (as an MPMD
/// group does): `cg::group{mesh["tp"], 0}` is `cg::group{mesh, "tp"}`.
class device_mesh {
 public:
  /// A mesh over ranks 0..prod(shape)-1 in row-major order.
  explicit device_mesh(shape_t shape, std::vector<std::string> dim_names = {})
      : device_mesh(shape, iota(numel_of(shape)), std::move(dim_names)) {}

  /// A mesh over ranks 0..prod(shape)-1 with the names of a braced list:
  /// `device_mesh({2, 2}, {"dp", "tp"})`. (With only the two constructors above, a list of two
  /// string literals is also a std::vector<int> iterator pair, and the call is ambiguous.)
  template <class S, std::size_t N>
    requires std::is_convertible_v<const S&, std::string_view> && (!std::is_arithmetic_v<S>)
  device_mesh(shape_t shape, const S (&dim_names)[N])
      : device_mesh(std::move(shape), std::vector<std::string>(std::begin(dim_names), std::end(dim_names))) {}

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
    for (std::size_t i = 0; i < names_.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        CCGRAPH_CHECK(names_[i] != names_[j], "device_mesh: dim name '", names_[i], "' given twice");
    pshape_ = shape_;
    kept_.resize(shape_.size());
    for (std::size_t i = 0; i < kept_.size(); ++i) kept_[i] = static_cast<int>(i);
  }

  /// The sub-mesh of the dimension called `name` (a 1-d mesh through the calling rank).
  device_mesh operator[](std::string_view name) const { return sub({std::string(name)}); }

  /// The sub-mesh of the dimensions called `names`, in that order (a sub-mesh keeps the
  /// parent's order of dimensions: "dp" before "tp" when the parent has them so).
  device_mesh sub(const std::vector<std::string>& names) const {
    CCGRAPH_CHECK(!names.empty(), "device_mesh: a sub-mesh needs at least one dimension name");
    std::vector<int> dims;
    for (const auto& n : names) {
      const int d = dim_index(n);
      CCGRAPH_CHECK(dims.empty() || d > dims.back(), "device_mesh[", n, "]: sub-mesh dims must be distinct and in "
                    "the mesh's order (", names_str(), ")");
      dims.push_back(d);
    }
    device_mesh m = *this;
    m.kept_.clear();
    m.shape_.clear();
    m.names_.clear();
    for (int d : dims) {
      m.kept_.push_back(kept_[static_cast<std::size_t>(d)]);
      m.shape_.push_back(shape_[static_cast<std::size_t>(d)]);
      m.names_.push_back(names_[static_cast<std::size_t>(d)]);
    }
    return m;
  }

  /// True for a sub-mesh (made by operator[] or sub), false for a mesh as constructed.
  bool is_sub_mesh() const { return kept_.size() != pshape_.size(); }

  /// Name of dimension `dim`, or its index as text when unnamed.
  std::string dim_name(int dim) const {
    check_dim(dim);
    return names_.empty() ? std::to_string(dim) : names_[static_cast<std::size_t>(dim)];
  }

  /// The ranks of the slice of this mesh containing `rank`, row-major (for a mesh that is not a
  /// sub-mesh: every rank).
  std::vector<int> slice_of(int rank) const {
    for (auto& s : slices())
      if (std::find(s.begin(), s.end(), rank) != s.end()) return s;
    CCGRAPH_THROW(error, "device_mesh: rank ", rank, " is not in the mesh ", list_str(ranks_));
  }

  /// Every slice of a sub-mesh: the rank lists that vary only in the kept coordinates, each
  /// row-major; one list (every rank) for a mesh that is not a sub-mesh.
  std::vector<std::vector<int>> slices() const {
    const auto st = contiguous_strides(pshape_);
    std::vector<std::vector<int>> out;
    for (std::int64_t flat = 0; flat < static_cast<std::int64_t>(ranks_.size()); ++flat) {
      bool first = true;  // coordinate 0 on every kept dim
      for (int d : kept_) first = first && (flat / st[static_cast<std::size_t>(d)]) % pshape_[static_cast<std::size_t>(d)] == 0;
      if (!first) continue;
      std::vector<int> s;
      for (std::int64_t k = 0; k < numel_of(shape_); ++k) {
        std::int64_t off = flat, rest = k;
        for (std::size_t i = kept_.size(); i-- > 0;) {
          const auto d = static_cast<std::size_t>(kept_[i]);
          off += (rest % pshape_[d]) * st[d];
          rest /= pshape_[d];
        }
        s.push_back(ranks_[static_cast<std::size_t>(off)]);
      }
      out.push_back(std::move(s));
    }
    return out;
  }

  /// Same layout of ranks, names and (for sub-meshes) the same dims kept.
  friend bool operator==(const device_mesh& a, const device_mesh& b) {
    return a.pshape_ == b.pshape_ && a.ranks_ == b.ranks_ && a.names_ == b.names_ && a.kept_ == b.kept_;
  }

  /// "device_mesh([2, 2], dims=(dp, tp))", a sub-mesh with its parent's dims.
  std::string str() const {
    std::string s = "device_mesh(" + shape_str(shape_);
    if (!names_.empty()) s += ", dims=(" + names_str() + ")";
    if (is_sub_mesh()) s += ", of " + shape_str(pshape_) + " ranks " + list_str(ranks_);
    else s += ", ranks " + list_str(ranks_);
    return s + ")";
  }

  /// Number of dimensions.
  int ndim() const { return static_cast<int>(shape_.size()); }
  /// Sizes of the dimensions.
  const shape_t& shape() const { return shape_; }
  /// Size of dimension `dim`.
  int size(int dim) const { return static_cast<int>(shape_[check_dim(dim)]); }
  /// Number of ranks in the mesh (of one slice, for a sub-mesh).
  int size() const { return static_cast<int>(numel_of(shape_)); }
  /// All ranks, row-major (of the parent, for a sub-mesh: see slice_of).
  const std::vector<int>& ranks() const { return ranks_; }
  /// Dimension names (empty when unnamed).
  const std::vector<std::string>& dim_names() const { return names_; }

  /// Index of the dimension called `name`; an unknown name is an error listing the names.
  int dim_index(std::string_view name) const {
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) return static_cast<int>(i);
    CCGRAPH_THROW(error, "device_mesh: no dimension named '", name, "' (dims: ", names_str(), ")");
  }

  /// True if `rank` is in the mesh.
  bool contains(int rank) const { return std::find(ranks_.begin(), ranks_.end(), rank) != ranks_.end(); }

  /// Coordinates of `rank` on the mesh (on the kept dims, for a sub-mesh).
  std::vector<std::int64_t> coordinate(int rank) const {
    auto it = std::find(ranks_.begin(), ranks_.end(), rank);
    CCGRAPH_CHECK(it != ranks_.end(), "device_mesh: rank ", rank, " is not in the mesh ",
                  list_str(ranks_));
    std::int64_t flat = it - ranks_.begin();
    std::vector<std::int64_t> c(pshape_.size());
    for (std::size_t d = pshape_.size(); d-- > 0;) {
      c[d] = flat % pshape_[d];
      flat /= pshape_[d];
    }
    std::vector<std::int64_t> kept;
    for (int d : kept_) kept.push_back(c[static_cast<std::size_t>(d)]);
    return kept;
  }

  /// Every group along `dim`: the rank lists that vary only in that coordinate, in mesh order.
  std::vector<std::vector<int>> groups_along(int dim) const {
    const auto d = static_cast<std::size_t>(kept_[static_cast<std::size_t>(check_dim(dim))]);
    const auto st = contiguous_strides(pshape_);
    std::vector<std::vector<int>> out;
    for (std::int64_t flat = 0; flat < static_cast<std::int64_t>(ranks_.size()); ++flat) {
      if ((flat / st[d]) % pshape_[d] != 0) continue;  // not the first along dim
      std::vector<int> g;
      for (std::int64_t k = 0; k < pshape_[d]; ++k) g.push_back(ranks_[static_cast<std::size_t>(flat + k * st[d])]);
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
  std::string names_str() const {
    std::string all;
    for (auto& n : names_) all += (all.empty() ? "" : ", ") + n;
    return all.empty() ? std::string("unnamed") : all;
  }
  int check_dim(int dim) const {
    CCGRAPH_CHECK(dim >= 0 && dim < ndim(), "device_mesh: dim ", dim, " out of range for a ",
                  ndim(), "-d mesh");
    return dim;
  }

  shape_t shape_;                  // the sizes of this mesh's dims (the kept ones of a sub-mesh)
  std::vector<int> ranks_;         // every rank of the parent, row-major over pshape_
  std::vector<std::string> names_; // names of this mesh's dims
  shape_t pshape_;                 // the parent's shape (shape_ unless a sub-mesh)
  std::vector<int> kept_;          // the parent dims this mesh's dims are
};

}  // namespace ccgraph
