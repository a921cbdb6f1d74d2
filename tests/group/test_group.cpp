// tests/group/test_group.cpp: device_mesh (ccgraph/group/device_mesh.hpp) and the group forms of
// ccgraph/group/group.hpp, each resolved to its one canonical group_info.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/group/device_mesh.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/runtime/threads.hpp>

namespace cg = ccgraph;

namespace {
using lists = std::vector<std::vector<int>>;
using names = std::vector<std::string>;
using coord = std::vector<std::int64_t>;

/// The list in `ls` that contains `rank`.
std::vector<int> list_with(const lists& ls, int rank) {
  for (auto& l : ls)
    for (int r : l)
      if (r == rank) return l;
  return {};
}
}  // namespace

// ================================ device_mesh ================================

TEST_CASE("device_mesh.2x4.coordinates_and_groups") {
  const cg::device_mesh mesh({2, 4}, names{"dp", "tp"});
  CHECK(mesh.ndim() == 2);
  CHECK(mesh.shape() == cg::shape_t{2, 4});
  CHECK(mesh.size() == 8);
  CHECK(mesh.size(0) == 2);
  CHECK(mesh.size(1) == 4);
  CHECK(mesh.ranks() == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(mesh.dim_names() == names{"dp", "tp"});
  CHECK(mesh.dim_index("dp") == 0);
  CHECK(mesh.dim_index("tp") == 1);
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(mesh.contains(r));
    CHECK(mesh.coordinate(r) == coord{r / 4, r % 4});
  }
  CHECK_FALSE(mesh.contains(8));
  CHECK(mesh.groups_along(0) == lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(mesh.groups_along(1) == lists{{0, 1, 2, 3}, {4, 5, 6, 7}});
}

TEST_CASE("device_mesh.2x2x2.groups_along_each_dim") {
  const cg::device_mesh mesh({2, 2, 2}, names{"pp", "dp", "tp"});
  CHECK(mesh.ndim() == 3);
  for (int r = 0; r < 8; ++r) CHECK(mesh.coordinate(r) == coord{r / 4, (r / 2) % 2, r % 2});
  CHECK(mesh.groups_along(0) == lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(mesh.groups_along(1) == lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(mesh.groups_along(2) == lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(mesh.dim_index("tp") == 2);
  // Every dim's groups partition the mesh, each group varying only in that coordinate.
  for (int d = 0; d < 3; ++d) {
    int covered = 0;
    for (auto& g : mesh.groups_along(d)) {
      covered += static_cast<int>(g.size());
      for (int r : g)
        for (int e = 0; e < 3; ++e)
          if (e != d) CHECK(mesh.coordinate(r)[static_cast<std::size_t>(e)] == mesh.coordinate(g[0])[static_cast<std::size_t>(e)]);
    }
    CHECK(covered == 8);
  }
}

TEST_CASE("device_mesh.custom_rank_order_and_1d") {
  const cg::device_mesh mesh({2, 2}, std::vector<int>{3, 1, 2, 0});
  CHECK(mesh.dim_names().empty());
  CHECK(mesh.coordinate(3) == coord{0, 0});
  CHECK(mesh.coordinate(0) == coord{1, 1});
  CHECK(mesh.groups_along(0) == lists{{3, 2}, {1, 0}});
  CHECK(mesh.groups_along(1) == lists{{3, 1}, {2, 0}});

  const cg::device_mesh line({4}, names{"x"});
  CHECK(line.groups_along(0) == lists{{0, 1, 2, 3}});
  CHECK(line.coordinate(2) == coord{2});

  const cg::device_mesh sub({2}, std::vector<int>{4, 6});
  CHECK(sub.ranks() == std::vector<int>{4, 6});
  CHECK_FALSE(sub.contains(5));
}

TEST_CASE("device_mesh.errors") {
  CHECK_THROWS_WITH_AS(cg::device_mesh(cg::shape_t{}), "device_mesh: the shape must have at least one dimension",
                       cg::error);
  CHECK_THROWS_WITH_AS(cg::device_mesh(cg::shape_t{2, 0}), "device_mesh: invalid shape [2, 0]", cg::error);
  CHECK_THROWS_WITH_AS(cg::device_mesh({2, 2}, std::vector<int>{0, 1, 2}),
                       "device_mesh: 3 ranks do not fill shape [2, 2]", cg::error);
  CHECK_THROWS_WITH_AS(cg::device_mesh({2, 2}, std::vector<int>{0, 1, 1, 2}),
                       "device_mesh: rank listed twice in [0, 1, 1, 2]", cg::error);
  CHECK_THROWS_WITH_AS(cg::device_mesh({2, 2}, names{"dp"}), "device_mesh: 1 dim names for a 2-d mesh",
                       cg::error);
  const cg::device_mesh mesh({2, 4}, names{"dp", "tp"});
  CHECK_THROWS_WITH_AS(mesh.dim_index("pp"), "device_mesh: no dimension named 'pp' (dims: dp, tp)", cg::error);
  CHECK_THROWS_WITH_AS(cg::device_mesh({4}).dim_index("x"),
                       "device_mesh: no dimension named 'x' (dims: unnamed)", cg::error);
  CHECK_THROWS_WITH_AS(mesh.groups_along(2), "device_mesh: dim 2 out of range for a 2-d mesh", cg::error);
  CHECK_THROWS_WITH_AS(mesh.groups_along(-1), "device_mesh: dim -1 out of range for a 2-d mesh", cg::error);
  CHECK_THROWS_WITH_AS(mesh.size(5), "device_mesh: dim 5 out of range for a 2-d mesh", cg::error);
  CHECK_THROWS_WITH_AS(mesh.coordinate(8), "device_mesh: rank 8 is not in the mesh [0, 1, 2, 3, 4, 5, 6, 7]",
                       cg::error);
  CHECK_THROWS_WITH_AS(cg::group(mesh, "pp"), doctest::Contains("no dimension named 'pp'"), cg::error);
}

// =============================== group resolution ===============================

TEST_CASE("group.resolve.each_form_for_each_rank") {
  cg::group_registry reg(8);
  reg.add("tp_even", {0, 2, 4, 6});
  const cg::device_mesh mesh({2, 4}, names{"dp", "tp"});
  const auto dp = mesh.groups_along(0);
  const auto tp = mesh.groups_along(1);
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    // The world, in each of its spellings.
    for (const cg::group& g : {cg::group{"0"}, cg::group{std::vector<int>{7, 6, 5, 4, 3, 2, 1, 0}},
                               cg::group{mesh}, cg::group{lists{{0, 1, 2, 3, 4, 5, 6, 7}}}}) {
      const auto gi = g.resolve(r, reg, "test");
      CHECK(gi.ranks == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
      CHECK(gi.name == "0");
      CHECK(gi.size() == 8);
      CHECK(gi.index_of(r) == r);
    }
    // Mesh dims by index and by name, and the same lists as MPMD.
    for (const cg::group& g : {cg::group{mesh, 0}, cg::group{mesh, "dp"}, cg::group{dp}}) {
      const auto gi = g.resolve(r, reg, "test");
      CHECK(gi.ranks == list_with(dp, r));
      CHECK(gi.index_of(r) == r / 4);
    }
    for (const cg::group& g : {cg::group{mesh, 1}, cg::group{mesh, "tp"}, cg::group{tp}}) {
      const auto gi = g.resolve(r, reg, "test");
      CHECK(gi.ranks == list_with(tp, r));
      CHECK(gi.index_of(r) == r % 4);
    }
    // A registered name and its rank list resolve alike.
    if (r % 2 == 0) {
      CHECK(cg::group{"tp_even"}.resolve(r, reg, "test") == cg::group{std::vector<int>{6, 4, 2, 0}}.resolve(r, reg, "test"));
      CHECK(cg::group{"tp_even"}.resolve(r, reg, "test").index_of(r) == r / 2);
    }
  }
}

TEST_CASE("group.tag.is_part_of_the_identity") {
  // c10d's group tags (funcol's `tag`): two groups over the same ranks with different tags are
  // two groups. Every form keeps its tag; the label prints it after the name.
  cg::group_registry reg(4);
  reg.add("pair", {0, 1});
  const cg::device_mesh mesh({2, 2}, names{"dp", "tp"});
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto plain = cg::group{std::vector<int>{1, 0}}.resolve(r, reg, "test");
    const auto rs = cg::group{std::vector<int>{1, 0}, "fsdp_rs"}.resolve(r, reg, "test");
    const auto ag = cg::group{std::vector<int>{0, 1}, "fsdp_ag"}.resolve(r, reg, "test");
    CHECK(plain.tag.empty());
    CHECK(rs.tag == "fsdp_rs");
    CHECK(rs.ranks == plain.ranks);
    CHECK(rs.name == "pair");
    CHECK(rs.label() == "pair:fsdp_rs");
    CHECK(plain.label() == "pair");
    CHECK_FALSE(rs == plain);
    CHECK_FALSE(rs == ag);
    CHECK(rs == cg::group{"pair"}.tagged("fsdp_rs").resolve(r, reg, "test"));
    CHECK(rs == cg::group{mesh, "tp"}.tagged("fsdp_rs").resolve(r, reg, "test"));  // {0, 1} for ranks 0, 1
    CHECK(cg::group{mesh, "tp"}.tagged("x").resolve(r, reg, "test").partition == mesh.groups_along(1));
    CHECK(cg::group{lists{{0, 1}, {2, 3}}}.tagged("x").resolve(r, reg, "test").tag == "x");
    std::ostringstream os;
    os << cg::group{std::vector<int>{0, 1, 2, 3}, "t"}.resolve(r, reg, "test");
    CHECK(os.str() == "0:t");
  }
  CHECK(cg::group{std::vector<int>{2, 3}, "a"}.tag() == "a");
  CHECK(cg::group{std::vector<int>{2, 3}}.tagged("b").tag() == "b");
  CHECK(cg::group{std::vector<int>{2, 3}, "a"}.tagged("").tag().empty());
  CHECK(cg::group{std::vector<int>{2, 3}, "a"}.resolve(2, reg, "test").label() == "[2, 3]:a");
}

TEST_CASE("group.resolve.partition_of_the_world") {
  // A mesh dimension (or MPMD lists covering every rank) is one part of a partition of the
  // world: every rank calls at once, which lets a backend split the world's communicator.
  cg::group_registry reg(8);
  const cg::device_mesh mesh({2, 4}, names{"dp", "tp"});
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    for (int dim : {0, 1}) {
      const auto gi = cg::group{mesh, dim}.resolve(r, reg, "test");
      auto expected = mesh.groups_along(dim);
      for (auto& l : expected) std::sort(l.begin(), l.end());
      CHECK(gi.partition == expected);
      CHECK(std::find(gi.partition.begin(), gi.partition.end(), gi.ranks) != gi.partition.end());
    }
    const auto covering = cg::group{lists{{7, 5, 3, 1}, {6, 4, 2, 0}}}.resolve(r, reg, "test");
    CHECK(covering.partition == lists{{1, 3, 5, 7}, {0, 2, 4, 6}});
    // Lists that leave ranks out, plain rank lists, names and the world are no partition.
    if (r < 4) CHECK(cg::group{lists{{0, 1}, {2, 3}}}.resolve(r, reg, "test").partition.empty());
    if (r < 4) CHECK(cg::group{std::vector<int>{0, 1, 2, 3}}.resolve(r, reg, "test").partition.empty());
    CHECK(cg::group{"0"}.resolve(r, reg, "test").partition.empty());
  }
}

TEST_CASE("group.canonical_names") {
  cg::group_registry reg(4);
  const cg::group pair{std::vector<int>{1, 0}};
  CHECK(pair.resolve(0, reg, "test").name == "[0, 1]");
  CHECK(pair.resolve(0, reg, "test").ranks == std::vector<int>{0, 1});
  CHECK(cg::group{std::vector<int>{0, 1, 2, 3}}.resolve(2, reg, "test").name == "0");
  CHECK(cg::group{cg::device_mesh({2, 2})}.resolve(3, reg, "test").name == "0");
  CHECK(cg::group{cg::device_mesh({2, 2}), 1}.resolve(3, reg, "test").name == "[2, 3]");
  // Once registered, the rank list goes by its name, whichever form names it.
  reg.add("pair", {0, 1});
  CHECK(pair.resolve(1, reg, "test").name == "pair");
  CHECK(cg::group{"pair"}.resolve(1, reg, "test").name == "pair");
  CHECK(cg::group{lists{{0, 1}, {2, 3}}}.resolve(0, reg, "test").name == "pair");
  CHECK(cg::group{lists{{0, 1}, {2, 3}}}.resolve(2, reg, "test").name == "[2, 3]");
  // The world keeps "0" even when another name has its ranks.
  reg.add("everyone", {3, 2, 1, 0});
  CHECK(cg::group{"everyone"}.resolve(0, reg, "test").name == "0");
  CHECK(reg.find("everyone") == std::vector<int>{0, 1, 2, 3});
  CHECK(reg.name_of({0, 1, 2, 3}) == "0");
  CHECK(reg.name_of({1, 3}) == "[1, 3]");
  CHECK(reg.world_size() == 4);
  // Streaming a group_info prints its name.
  std::ostringstream os;
  os << pair.resolve(0, reg, "test");
  CHECK(os.str() == "pair");
}

TEST_CASE("group.size_without_a_rank") {
  CHECK(cg::group{std::vector<int>{0, 1, 2}}.size() == 3);
  CHECK(cg::group{lists{{0, 1}, {2, 3}}}.size() == 2);
  CHECK(cg::group{cg::device_mesh({2, 4})}.size() == 8);
  CHECK(cg::group{cg::device_mesh({2, 4}), 0}.size() == 2);
  CHECK(cg::group{"0"}.size() == -1);  // a name needs the registry
}

TEST_CASE("group.register_group_conflicts") {
  cg::group_registry reg(8);
  reg.add("tp", {0, 1});
  CHECK_NOTHROW(reg.add("tp", {1, 0}));  // the same ranks again: a no-op
  CHECK_THROWS_WITH_AS(reg.add("tp", {0, 2}),
                       "register_group: name 'tp' is already registered for ranks [0, 1], not [0, 2]",
                       cg::error);
  CHECK_THROWS_WITH_AS(reg.add("0", {0, 1}),
                       "register_group: name '0' is already registered for ranks [0, 1, 2, 3, 4, 5, 6, 7], "
                       "not [0, 1]",
                       cg::error);
  CHECK_NOTHROW(reg.add("0", {7, 6, 5, 4, 3, 2, 1, 0}));
  CHECK_THROWS_WITH_AS(reg.add("bad", {0, 8}), "register_group: rank 8 is out of range for world size 8",
                       cg::error);
  CHECK_THROWS_WITH_AS(reg.add("bad", {-1}), "register_group: rank -1 is out of range for world size 8",
                       cg::error);
  CHECK_THROWS_WITH_AS(reg.add("bad", {2, 2}), "register_group: rank listed twice in group [2, 2]", cg::error);
  CHECK_THROWS_WITH_AS(reg.add("bad", {}), "register_group: a group needs at least one rank", cg::error);
  CHECK(reg.find("tp") == std::vector<int>{0, 1});
  CHECK_THROWS_WITH_AS(reg.find("bad"), "group: no group named 'bad' is registered (known: '0', 'tp')",
                       cg::error);

  // Through the rank contexts of a world: every rank registering the same name is fine and
  // thread-safe; a rank registering it for other ranks is refused.
  std::atomic<int> refused{0};
  cg::run_threads(4, [&](cg::rank_context& ctx) {
    ctx.register_group("pairs", {0, 1});
    ctx.register_group("mine" + std::to_string(ctx.rank()), {ctx.rank()});
    try {
      ctx.register_group("pairs", {ctx.rank() < 2 ? 0 : 2, ctx.rank() < 2 ? 1 : 3});
    } catch (const cg::error& e) {
      if (std::string(e.what()).find("name 'pairs' is already registered for ranks [0, 1], not [2, 3]") !=
          std::string::npos)
        ++refused;
    }
    CHECK(ctx.registry().find("pairs") == std::vector<int>{0, 1});
    CHECK(ctx.registry().name_of({ctx.rank()}) == "mine" + std::to_string(ctx.rank()));
  });
  CHECK(refused == 2);
}

TEST_CASE("group.resolve_errors") {
  cg::group_registry reg(4);
  CHECK_THROWS_WITH_AS(cg::group(std::vector<int>{1, 3}).resolve(0, reg, "all_reduce"),
                       "all_reduce: rank 0 is not a member of group [1, 3]", cg::error);
  CHECK_THROWS_WITH_AS(cg::group(std::vector<int>{0, 4}).resolve(0, reg, "all_reduce"),
                       "all_reduce: rank 4 is out of range for world size 4", cg::error);
  CHECK_THROWS_WITH_AS(cg::group(std::vector<int>{0, 1, 0}).resolve(0, reg, "all_reduce"),
                       "all_reduce: rank listed twice in group [0, 0, 1]", cg::error);
  CHECK_THROWS_WITH_AS(cg::group{std::vector<int>{}}.resolve(0, reg, "all_reduce"),
                       "all_reduce: a group needs at least one rank", cg::error);
  CHECK_THROWS_WITH_AS(cg::group{"tp"}.resolve(0, reg, "all_reduce"),
                       "group: no group named 'tp' is registered (known: '0')", cg::error);
  const cg::device_mesh sub({2}, std::vector<int>{2, 3});
  CHECK_THROWS_WITH_AS(cg::group{sub}.resolve(0, reg, "all_reduce"),
                       "all_reduce: rank 0 is not a member of group [2, 3]", cg::error);
  CHECK_THROWS_WITH_AS(cg::group(sub, 0).resolve(0, reg, "all_reduce"),
                       "all_reduce: rank 0 is in none of the groups [[2, 3]]", cg::error);
  const cg::device_mesh too_big({2, 4});
  CHECK_THROWS_WITH_AS(cg::group{too_big}.resolve(0, reg, "all_reduce"),
                       "all_reduce: rank 4 is out of range for world size 4", cg::error);
}

TEST_CASE("group.mpmd_errors") {
  CHECK_THROWS_WITH_AS(cg::group(lists{{0, 1}, {2, 3, 4}}), "group sizes must be identical found 2 and 3",
                       cg::error);
  CHECK_THROWS_WITH_AS(cg::group(lists{{0, 1, 2}, {3, 4}}), "group sizes must be identical found 3 and 2",
                       cg::error);
  CHECK_THROWS_WITH_AS(cg::group(lists{{0, 1}, {1, 2}}),
                       "group: a rank appears in more than one list of [[0, 1], [1, 2]]", cg::error);
  CHECK_THROWS_WITH_AS(cg::group(lists{}), "group: an MPMD group needs at least one rank list", cg::error);
  cg::group_registry reg(6);
  CHECK_THROWS_WITH_AS(cg::group(lists{{0, 1}, {2, 3}}).resolve(5, reg, "broadcast"),
                       "broadcast: rank 5 is in none of the groups [[0, 1], [2, 3]]", cg::error);
  CHECK_THROWS_WITH_AS(cg::group(lists{{0, 1}, {2, 9}}).resolve(2, reg, "broadcast"),
                       "broadcast: rank 9 is out of range for world size 6", cg::error);
  // Valid lists resolve to the caller's own list.
  const cg::group g(lists{{4, 0}, {1, 5}, {2, 3}});
  CHECK(g.resolve(0, reg, "test").ranks == std::vector<int>{0, 4});
  CHECK(g.resolve(5, reg, "test").ranks == std::vector<int>{1, 5});
  CHECK(g.resolve(3, reg, "test").index_of(3) == 1);
}
