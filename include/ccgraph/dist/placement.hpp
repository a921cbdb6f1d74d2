// ccgraph/dist/placement.hpp: how a dtensor lies on one mesh dimension (PyTorch's Shard,
// Replicate and Partial placements), and the torch.chunk arithmetic of uneven shards.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/core/shape.hpp>

namespace ccgraph {

/// One mesh dimension's placement of a dtensor: `shard(d)` (each rank along the mesh dim holds
/// chunk i of tensor dim d, torch.chunk's sizes), `replicate()` (each holds the whole tensor) or
/// `partial(op)` (each holds a term; the tensor is their reduction by op, pending).
class placement {
 public:
  /// The three kinds.
  enum class kind : unsigned char { shard, replicate, partial };

  /// Replicate(), the default.
  placement() = default;

  /// Shard(dim): dim may be negative until normalised against a tensor's rank.
  static placement make_shard(std::int64_t dim) { return placement(kind::shard, dim, reduce_op::sum); }
  /// Replicate().
  static placement make_replicate() { return placement(kind::replicate, 0, reduce_op::sum); }
  /// Partial(op): sum, avg, max or min (PyTorch's element-wise reductions; product too).
  static placement make_partial(reduce_op op) {
    CCGRAPH_CHECK(op.kind() == reduce_kind::sum || op.kind() == reduce_kind::avg || op.kind() == reduce_kind::max ||
                      op.kind() == reduce_kind::min || op.kind() == reduce_kind::product,
                  "partial: reduce op ", op, " is not an element-wise reduction of sum, avg, product, max, min");
    return placement(kind::partial, 0, op);
  }

  /// The kind.
  kind type() const { return kind_; }
  /// True for Shard(any dim), or Shard(`dim`) when given (PyTorch's is_shard(dim=None)).
  bool is_shard(std::optional<std::int64_t> dim = std::nullopt) const {
    return kind_ == kind::shard && (!dim || *dim == dim_);
  }
  /// True for Replicate().
  bool is_replicate() const { return kind_ == kind::replicate; }
  /// True for Partial(any op), or Partial(`op`) when given.
  bool is_partial(std::optional<reduce_op> op = std::nullopt) const {
    return kind_ == kind::partial && (!op || *op == op_);
  }
  /// The sharded tensor dim (Shard only; PyTorch's Shard.dim).
  std::int64_t dim() const {
    CCGRAPH_CHECK(kind_ == kind::shard, "placement::dim: ", str(), " is not a Shard");
    return dim_;
  }
  /// The pending reduction (Partial only; PyTorch's Partial.reduce_op).
  reduce_op reduce() const {
    CCGRAPH_CHECK(kind_ == kind::partial, "placement::reduce: ", str(), " is not a Partial");
    return op_;
  }

  /// This placement with a negative shard dim made positive for a tensor of `ndim` dims; a dim
  /// out of range is an error naming `what`: "from_local: Shard(dim=2) out of range for a 2-d tensor".
  placement normalized(std::size_t ndim, const char* what) const {
    if (kind_ != kind::shard) return *this;
    const auto n = static_cast<std::int64_t>(ndim);
    CCGRAPH_CHECK(dim_ >= -n && dim_ < n, what, ": ", str(), " is out of range for a ", ndim, "-d tensor");
    return make_shard(dim_ < 0 ? dim_ + n : dim_);
  }

  /// "Shard(dim=0)", "Replicate()", "Partial(sum)" (PyTorch's repr).
  std::string str() const {
    switch (kind_) {
      case kind::shard: return "Shard(dim=" + std::to_string(dim_) + ")";
      case kind::replicate: return "Replicate()";
      case kind::partial: return "Partial(" + to_string(op_) + ")";
    }
    return "?";
  }

  /// Same kind, dim (Shard) and op (Partial).
  friend bool operator==(const placement& a, const placement& b) {
    if (a.kind_ != b.kind_) return false;
    if (a.kind_ == kind::shard) return a.dim_ == b.dim_;
    if (a.kind_ == kind::partial) return a.op_ == b.op_;
    return true;
  }
  friend std::ostream& operator<<(std::ostream& os, const placement& p) { return os << p.str(); }

 private:
  placement(kind k, std::int64_t d, reduce_op op) : kind_(k), dim_(d), op_(op) {}

  kind kind_ = kind::replicate;
  std::int64_t dim_ = 0;
  reduce_op op_ = reduce_op::sum;
};

/// Shard(dim): each rank along the mesh dim holds one torch.chunk of tensor dim `dim` (negative
/// counts from the end, normalised against the tensor's rank).
inline placement shard(std::int64_t dim) { return placement::make_shard(dim); }
/// Replicate(): each rank along the mesh dim holds the whole tensor.
inline placement replicate() { return placement::make_replicate(); }
/// Partial(op): each rank along the mesh dim holds a term of the tensor, reduced by `op`
/// ("sum", "avg", "max", "min", "product", case-insensitive, or a reduce_op) when redistributed.
inline placement partial(reduce_op_arg op = reduce_op::sum) { return placement::make_partial(op.value); }

/// "[Shard(dim=0), Replicate()]".
inline std::string placements_str(const std::vector<placement>& ps) {
  std::string s = "[";
  for (std::size_t i = 0; i < ps.size(); ++i) s += (i ? ", " : "") + ps[i].str();
  return s + "]";
}

/// Size and offset of chunk `index` of `size` elements split in `chunks` as torch.chunk does
/// (PyTorch's Shard.local_shard_size_and_offset): chunks of ceil(size / chunks), the last ones
/// shorter or empty (offset `size` then).
inline std::pair<std::int64_t, std::int64_t> local_shard_size_and_offset(std::int64_t size, std::int64_t chunks,
                                                                          std::int64_t index) {
  CCGRAPH_CHECK(chunks > 0 && index >= 0 && index < chunks, "local_shard_size_and_offset: chunk ", index, " of ",
                chunks);
  if (size % chunks == 0) return {size / chunks, size / chunks * index};
  const std::int64_t full = (size + chunks - 1) / chunks;
  const std::int64_t start = full * index;
  if (start >= size) return {0, size};
  return {std::min(size, start + full) - start, start};
}

}  // namespace ccgraph
