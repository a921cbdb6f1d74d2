// ccgraph/group/group.hpp: the group forms collectives accept, and their one canonical form.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/group/device_mesh.hpp>

namespace ccgraph {

/// The canonical form every group description resolves to, for one calling rank: the sorted
/// member ranks, a name ("0" for the world, a registered name, or the rank list) and a tag.
/// The ranks and the tag are the group's identity: two groups over the same ranks with
/// different tags are two groups (two communicators on NCCL, as c10d's group tags give).
struct group_info {
  std::string name;
  std::vector<int> ranks;
  /// When the group is one part of a partition of the whole world (a mesh dimension, or MPMD
  /// lists that cover every rank), every part of it, canonical; else empty. Then every rank
  /// of the world calls the collective at once, each on its own part, which lets a backend
  /// split the world's communicator instead of setting up one from scratch.
  std::vector<std::vector<int>> partition{};
  /// The tag (funcol's `tag`): empty for the default group of these ranks; any other string
  /// names another group over the same ranks, with its own communicator and its own sequence
  /// of collectives.
  std::string tag{};

  /// Number of members.
  int size() const { return static_cast<int>(ranks.size()); }
  /// Position of `rank` among the members, or -1.
  int index_of(int rank) const {
    auto it = std::find(ranks.begin(), ranks.end(), rank);
    return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
  }
  /// The name as graphs and messages print it: "[0, 1]", or "[0, 1]:fsdp_rs" with a tag.
  std::string label() const { return tag.empty() ? name : name + ":" + tag; }
  /// Same ranks and same tag (the name is how it was written, not what it is).
  friend bool operator==(const group_info& a, const group_info& b) { return a.ranks == b.ranks && a.tag == b.tag; }
};

CCGRAPH_DECL std::ostream& operator<<(std::ostream& os, const group_info& g);

/// Checks that `rank` of a world of `world_size` ranks can issue a collective over `g`: the
/// members are canonical (sorted, distinct) ranks of the world, `rank` is one of them, and a
/// partition (MPMD lists, a mesh dimension) splits exactly this world, with `g` one of its
/// parts. A group resolved on this world always passes; a group recorded elsewhere (a graph
/// traced for another world or rank) may not, and a backend must never see it. `what` names
/// the collective: "all_reduce: group [0, 1, 2, 3] does not fit a world of 2 ranks (rank 1)".
CCGRAPH_DECL void check_group_fits(std::string_view what, const group_info& g, int rank, int world_size);

/// Names registered with a world: "0" is the world group. Shared by every rank of the world,
/// so registering is thread-safe and a name can only ever mean one rank list.
class group_registry {
 public:
  /// A registry for a world of `world_size` ranks (0: unknown, as in a trace without a world).
  CCGRAPH_DECL explicit group_registry(int world_size);
  /// Registers `name` for `ranks`; registering it again with the same ranks is a no-op, with
  /// other ranks an error.
  CCGRAPH_DECL void add(const std::string& name, std::vector<int> ranks);
  /// The ranks registered under `name`; an unknown name is an error.
  CCGRAPH_DECL std::vector<int> find(const std::string& name) const;
  /// Registers every name of `other` here (a trace's fake world copies its rank's names).
  CCGRAPH_DECL void copy_names_from(const group_registry& other);
  /// The canonical name of a rank list: "0" for the world, a registered name, or "[0, 1]".
  CCGRAPH_DECL std::string name_of(const std::vector<int>& ranks) const;
  /// Number of ranks in the world.
  int world_size() const { return world_size_; }

  /// Sorted, validated ranks: in [0, world_size), no duplicates, not empty.
  CCGRAPH_DECL static std::vector<int> canonical_ranks(std::vector<int> ranks, int world_size, const char* what);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::vector<int>> by_name_;
  int world_size_ = 0;
};

/// A group as users write it: a rank list, a list of rank lists (MPMD: each rank uses the list
/// it is in), a device mesh, a (mesh, dim) pair, or a registered name, each with an optional
/// tag. `resolve` turns any of them into the same canonical group_info, so every form of one
/// group behaves identically.
class group {
 public:
  /// The ranks in `ranks`.
  group(std::vector<int> ranks) : desc_(std::move(ranks)) {}  // NOLINT: implicit, like PyTorch
  /// The ranks in `ranks`, as the group tagged `tag`: another group than the untagged one (or
  /// one of another tag) over the same ranks, with its own communicator, like two c10d process
  /// groups over the same ranks:
  ///   cg::group{{0, 1}, "fsdp_ag"}, cg::group{{0, 1}, "fsdp_rs"}
  group(std::vector<int> ranks, std::string tag) : desc_(std::move(ranks)), tag_(std::move(tag)) {}
  /// MPMD: the sub-list containing the calling rank. All sub-lists must have one size.
  group(std::vector<std::vector<int>> lists) : desc_(check_mpmd(std::move(lists))) {}  // NOLINT
  /// All ranks of a mesh; of a sub-mesh (mesh["tp"]), the slice containing the calling rank.
  group(const device_mesh& mesh)  // NOLINT: implicit
      : desc_(mesh.is_sub_mesh() ? desc_t(check_mpmd(mesh.slices())) : desc_t(mesh.ranks())) {}
  /// The group along mesh dimension `dim` that contains the calling rank.
  group(const device_mesh& mesh, int dim) : desc_(check_mpmd(mesh.groups_along(dim))) {}
  /// The group along the mesh dimension called `dim_name`.
  group(const device_mesh& mesh, std::string_view dim_name)
      : group(mesh, mesh.dim_index(dim_name)) {}
  /// A name registered with the world ("0" is the world).
  group(std::string name) : desc_(std::move(name)) {}  // NOLINT: implicit
  /// A name registered with the world ("0" is the world).
  group(const char* name) : desc_(std::string(name)) {}  // NOLINT: implicit

  /// This group (in whatever form) with tag `tag` instead of its own:
  ///   cg::group{mesh, "dp"}.tagged("fsdp_rs")
  CCGRAPH_DECL group tagged(std::string tag) const;
  /// The tag (empty: the default group of its ranks).
  const std::string& tag() const noexcept { return tag_; }

  /// The canonical group for `rank`. `what` names the calling collective in errors, such as a
  /// rank calling a collective on a group it is not a member of.
  CCGRAPH_DECL group_info resolve(int rank, const group_registry& reg, const char* what) const;

  /// The group size, without a calling rank (every MPMD sub-list has the same size); -1 for a
  /// name, whose size needs the registry.
  CCGRAPH_DECL int size() const;

 private:
  using lists_t = std::vector<std::vector<int>>;
  CCGRAPH_DECL static std::string lists_str(const lists_t& lists);
  CCGRAPH_DECL static lists_t check_mpmd(lists_t lists);

  using desc_t = std::variant<std::vector<int>, lists_t, std::string>;
  desc_t desc_;
  std::string tag_;
};

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/group/impl/group.ipp>
#endif
