// ccgraph/group/impl/device_mesh.ipp: the non-template functions of <ccgraph/group/device_mesh.hpp>. Included by
// that header when header-only, compiled once by <ccgraph/impl/src.hpp> under
// CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/group/device_mesh.hpp>

namespace ccgraph {

CCGRAPH_DECL device_mesh device_mesh::sub(const std::vector<std::string>& names) const {
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

CCGRAPH_DECL std::string device_mesh::dim_name(int dim) const {
  check_dim(dim);
  return names_.empty() ? std::to_string(dim) : names_[static_cast<std::size_t>(dim)];
}

CCGRAPH_DECL std::vector<int> device_mesh::slice_of(int rank) const {
  for (auto& s : slices())
    if (std::find(s.begin(), s.end(), rank) != s.end()) return s;
  CCGRAPH_THROW(error, "device_mesh: rank ", rank, " is not in the mesh ", list_str(ranks_));
}

CCGRAPH_DECL std::vector<std::vector<int>> device_mesh::slices() const {
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


CCGRAPH_DECL std::string device_mesh::str() const {
  std::string s = "device_mesh(" + shape_str(shape_);
  if (!names_.empty()) s += ", dims=(" + names_str() + ")";
  if (is_sub_mesh()) s += ", of " + shape_str(pshape_) + " ranks " + list_str(ranks_);
  else s += ", ranks " + list_str(ranks_);
  return s + ")";
}

CCGRAPH_DECL int device_mesh::dim_index(std::string_view name) const {
  for (std::size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return static_cast<int>(i);
  CCGRAPH_THROW(error, "device_mesh: no dimension named '", name, "' (dims: ", names_str(), ")");
}

CCGRAPH_DECL std::vector<std::int64_t> device_mesh::coordinate(int rank) const {
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

CCGRAPH_DECL std::vector<std::vector<int>> device_mesh::groups_along(int dim) const {
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

CCGRAPH_DECL std::vector<int> device_mesh::iota(std::int64_t n) {
  std::vector<int> r(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = static_cast<int>(i);
  return r;
}

CCGRAPH_DECL std::string device_mesh::names_str() const {
  std::string all;
  for (auto& n : names_) all += (all.empty() ? "" : ", ") + n;
  return all.empty() ? std::string("unnamed") : all;
}

CCGRAPH_DECL int device_mesh::check_dim(int dim) const {
  CCGRAPH_CHECK(dim >= 0 && dim < ndim(), "device_mesh: dim ", dim, " out of range for a ",
                ndim(), "-d mesh");
  return dim;
}

}  // namespace ccgraph
