// ccgraph/group/device_mesh.hpp: an N-d arrangement of ranks with named dimensions (DeviceMesh).
#pragma once

#include <ccgraph/core/config.hpp>
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
  CCGRAPH_DECL device_mesh sub(const std::vector<std::string>& names) const;

  /// True for a sub-mesh (made by operator[] or sub), false for a mesh as constructed.
  bool is_sub_mesh() const { return kept_.size() != pshape_.size(); }

  /// Name of dimension `dim`, or its index as text when unnamed.
  CCGRAPH_DECL std::string dim_name(int dim) const;

  /// The ranks of the slice of this mesh containing `rank`, row-major (for a mesh that is not a
  /// sub-mesh: every rank).
  CCGRAPH_DECL std::vector<int> slice_of(int rank) const;

  /// Every slice of a sub-mesh: the rank lists that vary only in the kept coordinates, each
  /// row-major; one list (every rank) for a mesh that is not a sub-mesh.
  CCGRAPH_DECL std::vector<std::vector<int>> slices() const;

  /// Same layout of ranks, names and (for sub-meshes) the same dims kept.
  friend bool operator==(const device_mesh& a, const device_mesh& b) {
    return a.pshape_ == b.pshape_ && a.ranks_ == b.ranks_ && a.names_ == b.names_ && a.kept_ == b.kept_;
  }

  /// "device_mesh([2, 2], dims=(dp, tp))", a sub-mesh with its parent's dims.
  CCGRAPH_DECL std::string str() const;

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
  CCGRAPH_DECL int dim_index(std::string_view name) const;

  /// True if `rank` is in the mesh.
  bool contains(int rank) const { return std::find(ranks_.begin(), ranks_.end(), rank) != ranks_.end(); }

  /// Coordinates of `rank` on the mesh (on the kept dims, for a sub-mesh).
  CCGRAPH_DECL std::vector<std::int64_t> coordinate(int rank) const;

  /// Every group along `dim`: the rank lists that vary only in that coordinate, in mesh order.
  CCGRAPH_DECL std::vector<std::vector<int>> groups_along(int dim) const;

 private:
  CCGRAPH_DECL static std::vector<int> iota(std::int64_t n);
  CCGRAPH_DECL std::string names_str() const;
  CCGRAPH_DECL int check_dim(int dim) const;

  shape_t shape_;                  // the sizes of this mesh's dims (the kept ones of a sub-mesh)
  std::vector<int> ranks_;         // every rank of the parent, row-major over pshape_
  std::vector<std::string> names_; // names of this mesh's dims
  shape_t pshape_;                 // the parent's shape (shape_ unless a sub-mesh)
  std::vector<int> kept_;          // the parent dims this mesh's dims are
};

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/group/impl/device_mesh.ipp>
#endif
