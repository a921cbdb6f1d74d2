// tests/dist/test_dtensor.cpp: placements, dtensor<T> and every redistribution
// (ccgraph/dist/), on the threads backend at 2 and 4 ranks, eagerly and traced.
//
// The reference: the global tensor G (1, 2, 3, ... row-major, exact in float) and, for a list of
// placements, each rank's piece of it cut as torch.chunk does, mesh dim by mesh dim. A Partial
// mesh dim holds the term (coordinate + 1) * G's piece, so the reduced tensor is S * G with
// S = 1 + 2 + ... + n; every value stays a small integer, so results compare exactly.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/dtensor.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/schedule/verify.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using cg::shape_t;
using i64 = std::int64_t;
using places = std::vector<cg::placement>;

/// G: 1, 2, ..., numel, row-major.
cg::tensor<float> global_of(const shape_t& shape) {
  return cg::eval(cg::arange<float>(cg::numel_of(shape)).reshape(shape) + 1.0f);
}

/// The piece of `full` the rank at `coord` holds under `ps` (shards cut mesh dim by mesh dim).
cg::tensor<float> piece_of(const cg::tensor<float>& full, const cg::device_mesh& mesh, const std::vector<i64>& coord,
                           const places& ps) {
  const auto [shape, offset] = cg::local_shape_and_offset(full.shape(), mesh, coord, ps);
  cg::tensor<float> t = full;
  for (std::size_t d = 0; d < shape.size(); ++d) t = t.narrow(static_cast<i64>(d), offset[d], shape[d]);
  return t.contiguous();
}

/// The factor a Partial mesh dim of `n` ranks multiplies the global tensor by: 1 + ... + n.
i64 partial_sum(int n) { return static_cast<i64>(n) * (n + 1) / 2; }

/// This rank's local value of G laid out by `ps` (Partial dims holding their terms).
cg::tensor<float> local_of(const shape_t& shape, const cg::device_mesh& mesh, const std::vector<i64>& coord,
                           const places& ps) {
  float factor = 1;
  for (std::size_t i = 0; i < ps.size(); ++i)
    if (ps[i].is_partial()) factor *= static_cast<float>(coord[i] + 1);
  return cg::eval(piece_of(global_of(shape), mesh, coord, ps) * factor);
}

/// The global tensor a dtensor laid out as `src` stands for: S * G per Partial dim.
cg::tensor<float> meant_of(const shape_t& shape, const cg::device_mesh& mesh, const places& src) {
  float factor = 1;
  for (std::size_t i = 0; i < src.size(); ++i)
    if (src[i].is_partial()) factor *= static_cast<float>(partial_sum(mesh.size(static_cast<int>(i))));
  return cg::eval(global_of(shape) * factor);
}

/// The collective one step of a plan issues ("" for none), PyTorch's lowering.
std::string kind_of(const cg::redistribute_step& s, int n) {
  if (s.from == s.to || n == 1) return "";
  if (s.to.is_replicate()) return s.from.is_partial() ? "all_reduce" : "all_gather_into_tensor";
  if (s.to.is_shard()) {
    if (s.from.is_partial()) return "reduce_scatter_tensor";
    if (s.from.is_replicate()) return "";
    return "all_to_all_single";
  }
  return "";
}

constexpr const char* collective_kinds[] = {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                                            "all_to_all_single", "broadcast"};

/// Redistributes G laid out as `src` to `dst` on `mesh`, eagerly and traced (compiled and run),
/// on the calling rank, and checks: the local shape and values are dst's piece of the meant
/// tensor; the collectives issued are one per communicating plan step, of its kind; the traced
/// graph has the same collective nodes and gives the same values.
void check_transition(cg::rank_context& ctx, const cg::device_mesh& mesh, const shape_t& shape, const places& src,
                      const places& dst) {
  INFO("shape ", cg::shape_str(shape), " ", cg::placements_str(src), " -> ", cg::placements_str(dst), " on ",
       mesh.str(), " rank ", ctx.rank());
  const auto coord = mesh.coordinate(ctx.rank());
  const auto local = local_of(shape, mesh, coord, src);
  const auto d = cg::dtensor<float>::from_local(local, mesh, src, {.shape = shape});
  CHECK(d.shape() == shape);

  // The plan, and the collectives it must issue.
  const auto plan = d.redistribute_plan(dst);
  std::map<std::string, i64> want;
  for (const auto& s : plan)
    if (auto k = kind_of(s, mesh.size(s.mesh_dim)); !k.empty()) ++want[k];

  cg::comm_counter counter;
  const auto r = d.redistribute(mesh, dst);
  const auto got = r.to_local();
  CHECK(r.placements() == dst);
  CHECK(r.shape() == shape);
  const auto expected = piece_of(meant_of(shape, mesh, src), mesh, coord, dst);
  CHECK(got.shape() == expected.shape());
  CHECK(got.contiguous().to_vector() == expected.to_vector());
  for (const char* k : collective_kinds) CHECK_MESSAGE(counter.count(k) == want[k], k);

  // Traced: the same collectives as graph nodes, the same values.
  auto program = [&](auto x) {
    return cg::dtensor<float>::from_local(x, mesh, src, {.shape = shape}).redistribute(mesh, dst).to_local();
  };
  cg::comm_counter traced_counter;
  auto g = cg::trace(program, cg::input<float>(local.shape()));
  for (const char* k : collective_kinds) {
    CHECK_MESSAGE(g.count(k) == want[k], k);
    CHECK_MESSAGE(traced_counter.count(k) == want[k], k);
  }
  const auto out = cg::compile(g, ctx)(local);
  CHECK(out.shape() == expected.shape());
  CHECK(out.to_vector() == expected.to_vector());
}

const places one_d_sources[] = {{cg::shard(0)}, {cg::shard(1)}, {cg::replicate()}, {cg::partial()}};
const places one_d_targets[] = {{cg::shard(0)}, {cg::shard(1)}, {cg::replicate()}};
// Even for 2 and 4 ranks; uneven (5 rows: 3+2, 2+2+1+0; 3 columns: 2+1, 1+1+1+0); fewer rows
// than ranks (empty shards on 4 ranks).
const shape_t shapes[] = {{8, 4}, {5, 3}, {2, 6}};

}  // namespace

// ================================ placements ================================

TEST_CASE("dtensor.placement.kinds_and_names") {
  CHECK(cg::shard(0).is_shard());
  CHECK(cg::shard(0).is_shard(0));
  CHECK_FALSE(cg::shard(0).is_shard(1));
  CHECK_FALSE(cg::shard(0).is_replicate());
  CHECK_FALSE(cg::shard(0).is_partial());
  CHECK(cg::replicate().is_replicate());
  CHECK_FALSE(cg::replicate().is_shard());
  CHECK(cg::partial().is_partial());
  CHECK(cg::partial().is_partial(cg::reduce_op::sum));
  CHECK_FALSE(cg::partial("max").is_partial(cg::reduce_op::sum));
  CHECK(cg::partial("AVG").reduce() == cg::reduce_op::avg);
  CHECK(cg::partial(cg::reduce_op::min) == cg::partial("min"));
  CHECK_FALSE(cg::partial("sum") == cg::partial("max"));
  CHECK_FALSE(cg::shard(0) == cg::shard(1));
  CHECK(cg::shard(0).str() == "Shard(dim=0)");
  CHECK(cg::replicate().str() == "Replicate()");
  CHECK(cg::partial().str() == "Partial(sum)");
  CHECK(cg::placements_str({cg::shard(-1), cg::replicate()}) == "[Shard(dim=-1), Replicate()]");
  // Negative dims normalise against the tensor's rank.
  CHECK(cg::shard(-1).normalized(3, "t") == cg::shard(2));
  CHECK(cg::shard(-3).normalized(3, "t") == cg::shard(0));
  CHECK(error_of([] { (void)cg::shard(3).normalized(3, "from_local"); }) ==
        "from_local: Shard(dim=3) is out of range for a 3-d tensor");
  CHECK(error_of([] { (void)cg::shard(-4).normalized(3, "from_local"); }) ==
        "from_local: Shard(dim=-4) is out of range for a 3-d tensor");
  CHECK(contains(error_of([] { (void)cg::partial("band"); }), "partial: reduce op band is not an element-wise"));
  CHECK(contains(error_of([] { (void)cg::replicate().dim(); }), "placement::dim: Replicate() is not a Shard"));
}

TEST_CASE("dtensor.placement.torch_chunk_sizes") {
  auto sizes = [](i64 size, i64 n) {
    std::vector<i64> s, o;
    for (i64 i = 0; i < n; ++i) {
      const auto [len, off] = cg::local_shard_size_and_offset(size, n, i);
      s.push_back(len);
      o.push_back(off);
    }
    return std::pair{s, o};
  };
  CHECK(sizes(8, 4).first == std::vector<i64>{2, 2, 2, 2});
  CHECK(sizes(8, 4).second == std::vector<i64>{0, 2, 4, 6});
  CHECK(sizes(5, 2).first == std::vector<i64>{3, 2});
  CHECK(sizes(5, 4).first == std::vector<i64>{2, 2, 1, 0});
  CHECK(sizes(5, 4).second == std::vector<i64>{0, 2, 4, 5});
  CHECK(sizes(2, 4).first == std::vector<i64>{1, 1, 0, 0});
  CHECK(sizes(7, 4).first == std::vector<i64>{2, 2, 2, 1});
  CHECK(sizes(0, 2).first == std::vector<i64>{0, 0});
  // Agrees with the chunks tensor::chunk makes (torch.chunk), padded with empty ones.
  for (i64 size : {1, 2, 3, 5, 6, 7, 9}) {
    for (i64 n : {2, 3, 4}) {
      const auto chunks = cg::arange<float>(size).chunk(n, 0);
      for (i64 i = 0; i < n; ++i) {
        const i64 want = i < static_cast<i64>(chunks.size()) ? chunks[static_cast<std::size_t>(i)].numel() : 0;
        CHECK(cg::local_shard_size_and_offset(size, n, i).first == want);
      }
    }
  }
}

// ================================ device_mesh by name ================================

TEST_CASE("dtensor.device_mesh.sub_mesh_by_name") {
  const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
  const auto tp = mesh["tp"];
  const auto dp = mesh["dp"];
  CHECK(tp.ndim() == 1);
  CHECK(tp.size() == 2);
  CHECK(tp.size(0) == 2);
  CHECK(tp.dim_names() == std::vector<std::string>{"tp"});
  CHECK(tp.is_sub_mesh());
  CHECK_FALSE(mesh.is_sub_mesh());
  CHECK(tp.groups_along(0) == mesh.groups_along(1));
  CHECK(dp.groups_along(0) == mesh.groups_along(0));
  CHECK(tp.slice_of(3) == std::vector<int>{2, 3});
  CHECK(dp.slice_of(3) == std::vector<int>{1, 3});
  CHECK(tp.coordinate(3) == std::vector<i64>{1});
  CHECK(dp.coordinate(2) == std::vector<i64>{1});
  CHECK(tp.slices() == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  CHECK(mesh.slices() == std::vector<std::vector<int>>{{0, 1, 2, 3}});
  CHECK(tp == mesh["tp"]);
  CHECK_FALSE(tp == dp);
  CHECK_FALSE(tp == mesh);
  CHECK(mesh.sub({"dp", "tp"}).shape() == mesh.shape());
  CHECK(contains(error_of([&] { (void)mesh["pp"]; }), "device_mesh: no dimension named 'pp' (dims: dp, tp)"));
  CHECK(contains(error_of([&] { (void)mesh.sub({"tp", "dp"}); }), "in the mesh's order"));
  CHECK(contains(error_of([] { (void)cg::device_mesh({2, 2}, {"x", "x"}); }), "dim name 'x' given twice"));
  // A 3-d mesh: the slice through a rank of two of its dims.
  const cg::device_mesh m3({2, 2, 2}, {"pp", "dp", "tp"});
  CHECK(m3.sub({"pp", "tp"}).slice_of(0) == std::vector<int>{0, 1, 4, 5});
  CHECK(m3.sub({"pp", "tp"}).slice_of(2) == std::vector<int>{2, 3, 6, 7});
  CHECK(m3.sub({"pp", "tp"}).coordinate(5) == std::vector<i64>{1, 1});
  CHECK(m3.sub({"pp", "tp"}).groups_along(1) == m3.groups_along(2));
}

TEST_CASE("dtensor.device_mesh.sub_mesh_groups.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    CHECK(ctx.resolve(cg::group{mesh["tp"], 0}, "t") == ctx.resolve(cg::group{mesh, "tp"}, "t"));
    CHECK(ctx.resolve(cg::group{mesh["dp"]}, "t").ranks == mesh["dp"].slice_of(ctx.rank()));
    CHECK(ctx.resolve(cg::group{mesh}, "t").ranks == std::vector<int>{0, 1, 2, 3});
    // A collective over a sub-mesh reduces within the calling rank's slice only.
    const auto x = cg::tensor<float>::from({static_cast<float>(ctx.rank())}, {1});
    const float want = ctx.rank() < 2 ? 1.f : 5.f;  // tp slices {0, 1} and {2, 3}
    CHECK(cg::all_reduce(x, "sum", mesh["tp"]).to_vector() == std::vector<float>{want});
  });
}

// ================================ every transition, 1-d mesh ================================

TEST_CASE("dtensor.redistribute.every_transition.1d.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2}, {"tp"});
    for (const auto& shape : shapes)
      for (const auto& src : one_d_sources)
        for (const auto& dst : one_d_targets) check_transition(ctx, mesh, shape, src, dst);
  });
}

TEST_CASE("dtensor.redistribute.every_transition.1d.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({4});
    for (const auto& shape : shapes)
      for (const auto& src : one_d_sources)
        for (const auto& dst : one_d_targets) check_transition(ctx, mesh, shape, src, dst);
  });
}

TEST_CASE("dtensor.redistribute.3d_tensor_and_negative_dims.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    for (const shape_t& shape : {shape_t{3, 5, 4}, shape_t{4, 2, 3}}) {
      check_transition(ctx, mesh, shape, {cg::shard(0)}, {cg::shard(2)});
      check_transition(ctx, mesh, shape, {cg::shard(2)}, {cg::shard(1)});
      check_transition(ctx, mesh, shape, {cg::shard(1)}, {cg::replicate()});
      check_transition(ctx, mesh, shape, {cg::partial()}, {cg::shard(2)});
      check_transition(ctx, mesh, shape, {cg::replicate()}, {cg::shard(1)});
    }
    // shard(-1) is shard(ndim - 1): same plan, same placements after.
    const auto d = cg::dtensor<float>::from_local(local_of({4, 6}, mesh, mesh.coordinate(ctx.rank()), {cg::shard(0)}),
                                                  mesh, {cg::shard(0)});
    CHECK(d.redistribute({cg::shard(-1)}).placements() == places{cg::shard(1)});
    CHECK(d.redistribute({cg::shard(-1)}).to_local().to_vector() == d.redistribute({cg::shard(1)}).to_local().to_vector());
  });
}

// ================================ 2-d meshes ================================

TEST_CASE("dtensor.redistribute.every_transition.2d.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    const cg::placement kinds[] = {cg::shard(0), cg::shard(1), cg::replicate(), cg::partial()};
    const cg::placement targets[] = {cg::shard(0), cg::shard(1), cg::replicate()};
    for (const shape_t& shape : {shape_t{8, 4}, shape_t{5, 3}})
      for (const auto& a : kinds)
        for (const auto& b : kinds)
          for (const auto& c : targets)
            for (const auto& e : targets) check_transition(ctx, mesh, shape, {a, b}, {c, e});
  });
}

TEST_CASE("dtensor.redistribute.plans.2d") {
  // PyTorch's greedy plans, and so the number and kind of collectives.
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    auto plan = [&](const places& src, const places& dst) {
      const auto d = cg::dtensor<float>::from_local(local_of({8, 8}, mesh, mesh.coordinate(ctx.rank()), src), mesh, src);
      std::string s;
      for (const auto& st : d.redistribute_plan(dst))
        s += (s.empty() ? "" : "; ") + std::to_string(st.mesh_dim) + ": " + st.from.str() + " -> " + st.to.str();
      return s;
    };
    // One collective per mesh dim that changes; from a sharded source, inner mesh dim first
    // (PyTorch's first pass runs from the innermost dim out), else outer first.
    CHECK(plan({cg::shard(0), cg::shard(1)}, {cg::replicate(), cg::replicate()}) ==
          "1: Shard(dim=1) -> Replicate(); 0: Shard(dim=0) -> Replicate()");
    CHECK(plan({cg::partial(), cg::partial()}, {cg::replicate(), cg::replicate()}) ==
          "0: Partial(sum) -> Replicate(); 1: Partial(sum) -> Replicate()");
    CHECK(plan({cg::shard(0), cg::replicate()}, {cg::shard(1), cg::replicate()}) == "0: Shard(dim=0) -> Shard(dim=1)");
    CHECK(plan({cg::replicate(), cg::replicate()}, {cg::shard(0), cg::shard(1)}) ==
          "0: Replicate() -> Shard(dim=0); 1: Replicate() -> Shard(dim=1)");
    CHECK(plan({cg::shard(0), cg::shard(1)}, {cg::shard(0), cg::shard(1)}).empty());
    // Nested shards of dim 0 out of order: the inner dim goes through Replicate first.
    CHECK(plan({cg::shard(0), cg::shard(0)}, {cg::replicate(), cg::shard(0)}) ==
          "1: Shard(dim=0) -> Replicate(); 0: Shard(dim=0) -> Replicate(); 1: Replicate() -> Shard(dim=0)");
    CHECK(plan({cg::replicate(), cg::shard(0)}, {cg::shard(0), cg::shard(0)}) ==
          "1: Shard(dim=0) -> Replicate(); 0: Replicate() -> Shard(dim=0); 1: Replicate() -> Shard(dim=0)");
    // Counted: two all_gathers for (S0, S1) -> (R, R), nothing else.
    const auto d = cg::dtensor<float>::from_local(
        local_of({8, 8}, mesh, mesh.coordinate(ctx.rank()), {cg::shard(0), cg::shard(1)}), mesh,
        {cg::shard(0), cg::shard(1)});
    cg::comm_counter c;
    const auto full = d.full_tensor();
    CHECK(c.count("all_gather") == 2);
    CHECK(c.total() == 2);
    CHECK(full.to_vector() == global_of({8, 8}).to_vector());
  });
}

TEST_CASE("dtensor.redistribute.nested_uneven_shards.2d.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    for (const shape_t& shape : {shape_t{7, 3}, shape_t{3, 5}, shape_t{2, 2}}) {
      check_transition(ctx, mesh, shape, {cg::shard(0), cg::shard(0)}, {cg::replicate(), cg::replicate()});
      check_transition(ctx, mesh, shape, {cg::shard(0), cg::shard(0)}, {cg::replicate(), cg::shard(0)});
      check_transition(ctx, mesh, shape, {cg::replicate(), cg::shard(0)}, {cg::shard(0), cg::shard(0)});
      check_transition(ctx, mesh, shape, {cg::shard(1), cg::shard(1)}, {cg::shard(0), cg::shard(0)});
      check_transition(ctx, mesh, shape, {cg::partial(), cg::shard(0)}, {cg::shard(0), cg::shard(1)});
    }
  });
}

TEST_CASE("dtensor.redistribute.sub_mesh.world4") {
  // A dtensor on mesh["tp"]: each tp slice is its own 1-d mesh.
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    const auto tp = mesh["tp"];
    check_transition(ctx, tp, {5, 4}, {cg::shard(0)}, {cg::replicate()});
    check_transition(ctx, tp, {5, 4}, {cg::partial()}, {cg::shard(1)});
    check_transition(ctx, mesh["dp"], {4, 3}, {cg::shard(1)}, {cg::shard(0)});
  });
}

// ================================ Partial ops ================================

TEST_CASE("dtensor.redistribute.partial_ops.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({4});
    const float k = static_cast<float>(ctx.rank());
    const auto g = global_of({5, 2});
    // Terms G + k: max is G + 3, min is G; terms (k + 1) * G: avg is 2.5 * G.
    const auto plus_k = cg::tensor<float>(cg::eval(g + k));
    const auto times = cg::tensor<float>(cg::eval(g * (k + 1)));
    auto check = [&](const cg::tensor<float>& local, const char* op, const cg::tensor<float>& want) {
      INFO(op);
      const auto d = cg::dtensor<float>::from_local(local, mesh, {cg::partial(op)});
      CHECK(d.full_tensor().to_vector() == want.to_vector());
      const auto s = d.redistribute({cg::shard(0)}).to_local();
      CHECK(s.contiguous().to_vector() == piece_of(want, mesh, {ctx.rank()}, {cg::shard(0)}).to_vector());
    };
    check(plus_k, "max", cg::eval(g + 3.f));
    check(plus_k, "min", g);
    check(times, "avg", cg::eval(g * 2.5f));
    check(times, "sum", cg::eval(g * 10.f));
  });
}

TEST_CASE("dtensor.redistribute.to_partial.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2});
    const auto g = global_of({4, 2});
    const auto r = cg::dtensor<float>::from_local(g, mesh, {cg::replicate()});
    // PyTorch refuses a new Partial in the public redistribute.
    CHECK(error_of([&] { (void)r.redistribute({cg::partial()}); }) ==
          "dtensor::redistribute: can not redistribute from Replicate() to Partial(sum) on mesh dim 0: "
          "redistributing to Partial is for internal use only");
    const auto s = cg::dtensor<float>::from_local(piece_of(g, mesh, {ctx.rank()}, {cg::shard(0)}), mesh, {cg::shard(0)});
    CHECK(contains(error_of([&] { (void)s.redistribute({cg::partial()}); }), "from Shard(dim=0) to Partial(sum)"));
    const auto p = cg::dtensor<float>::from_local(g, mesh, {cg::partial()});
    CHECK(contains(error_of([&] { (void)p.redistribute({cg::partial("max")}); }),
                   "can not redistribute from Partial(sum) to Partial(max) on mesh dim 0"));
    CHECK(contains(error_of([&] { (void)p.redistribute_unchecked({cg::partial("max")}, "t", true); }),
                   "a Partial's reduce op can not change"));
    // To the same Partial: nothing to do.
    cg::comm_counter c;
    CHECK(p.redistribute({cg::partial()}).to_local().to_vector() == g.to_vector());
    CHECK(c.total() == 0);
    // The internal Replicate -> Partial(sum) (PyTorch's _partition_value): the value divided by
    // the mesh dim's size, so reducing it gives the value back; no collective.
    const auto q = r.redistribute_unchecked({cg::partial()}, "t", true);
    CHECK(c.total() == 0);
    CHECK(q.placements() == places{cg::partial()});
    CHECK(q.to_local().to_vector() == cg::tensor<float>(cg::eval(g * 0.5f)).to_vector());
    CHECK(q.full_tensor().to_vector() == g.to_vector());
    CHECK(contains(error_of([&] { (void)r.redistribute_unchecked({cg::partial("max")}, "t", true); }),
                   "only Replicate -> Partial(sum) is supported"));
    CHECK(contains(error_of([&] { (void)s.redistribute_unchecked({cg::partial()}, "t", true); }),
                   "can not redistribute from Shard(dim=0) to Partial(sum)"));
  });
}

// ================================ from_local, attributes, errors ================================

TEST_CASE("dtensor.from_local.attributes_and_global_shape.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2}, {"tp"});
    const auto local = cg::full<float>({3, 4}, 1.f);
    const auto d = cg::dtensor<float>::from_local(local, mesh, {cg::shard(-1)});
    CHECK(d.placements() == places{cg::shard(1)});
    CHECK(d.shape() == shape_t{3, 8});
    CHECK(d.stride() == cg::strides_t{8, 1});
    CHECK(d.ndim() == 2);
    CHECK(d.numel() == 24);
    CHECK(d.size(-1) == 8);
    CHECK(d.device_mesh() == mesh);
    CHECK(d.to_local().shape() == shape_t{3, 4});
    CHECK(d.placements()[0].is_shard(1));
    // Replicate and Partial keep the local shape.
    CHECK(cg::dtensor<float>::from_local(local, mesh, {cg::replicate()}).shape() == shape_t{3, 4});
    CHECK(cg::dtensor<float>::from_local(local, mesh, {cg::partial()}).shape() == shape_t{3, 4});
    // An uneven global shape: each rank gives its piece.
    const auto u = cg::dtensor<float>::from_local(cg::full<float>({ctx.rank() == 0 ? 3 : 2, 4}, 1.f), mesh,
                                                  {cg::shard(0)}, {.shape = shape_t{5, 4}});
    CHECK(u.shape() == shape_t{5, 4});
    CHECK(u.full_tensor().shape() == shape_t{5, 4});
    // Explicit strides are kept.
    CHECK(cg::dtensor<float>::from_local(local, mesh, {cg::shard(0)}, {.shape = shape_t{6, 4}, .stride = cg::strides_t{1, 6}})
              .stride() == cg::strides_t{1, 6});
  });
}

TEST_CASE("dtensor.from_local.errors.world2") {
  run(2, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2}, {"tp"});
    const cg::device_mesh mesh2({1, 2}, {"dp", "tp"});
    const auto local = cg::full<float>({3, 4}, 1.f);
    CHECK(contains(error_of([&] { (void)cg::dtensor<float>::from_local(local, mesh2, {cg::shard(0)}); }),
                   "dtensor::from_local: 1 placements [Shard(dim=0)] for a 2-d mesh device_mesh([1, 2], dims=(dp, tp)"));
    CHECK(error_of([&] { (void)cg::dtensor<float>::from_local(local, mesh, {cg::shard(2)}); }) ==
          "dtensor::from_local: Shard(dim=2) is out of range for a 2-d tensor");
    CHECK(contains(error_of([&] {
                     (void)cg::dtensor<float>::from_local(local, mesh, {cg::shard(0)}, {.shape = shape_t{8, 4}});
                   }),
                   "dtensor: the local shape [3, 4] on rank " + std::to_string(ctx.rank()) +
                       " is not its piece [4, 4] of the global shape [8, 4] laid out as [Shard(dim=0)]"));
    CHECK(contains(error_of([&] { (void)cg::dtensor<float>::from_local(local, mesh, {cg::shard(0)}, {.shape = shape_t{6}}); }),
                   "global shape [6] has 1 dims but the local tensor [3, 4] has 2"));
    CHECK(contains(error_of([&] {
                     (void)cg::dtensor<float>::from_local(local, mesh, {cg::shard(0)}, {.stride = cg::strides_t{4, 1}});
                   }),
                   "without the global shape"));
    const auto d = cg::dtensor<float>::from_local(local, mesh, {cg::shard(0)});
    CHECK(contains(error_of([&] { (void)d.redistribute(mesh2, {cg::replicate(), cg::replicate()}); }),
                   "dtensor::redistribute: target mesh device_mesh([1, 2], dims=(dp, tp), ranks [0, 1]) is not the "
                   "dtensor's mesh device_mesh([2], dims=(tp), ranks [0, 1])"));
    CHECK(contains(error_of([&] { (void)d.redistribute({cg::replicate(), cg::replicate()}); }),
                   "dtensor::redistribute: 2 placements"));
    CHECK(contains(error_of([&] { (void)d.redistribute({cg::shard(-3)}); }),
                   "dtensor::redistribute: Shard(dim=-3) is out of range for a 2-d tensor"));
    // A rank outside the mesh.
    const cg::device_mesh only0({1}, std::vector<int>{0});
    if (ctx.rank() == 1)
      CHECK(contains(error_of([&] { (void)cg::dtensor<float>::from_local(local, only0, {cg::replicate()}); }),
                     "rank 1 is not in the mesh"));
  });
}

TEST_CASE("dtensor.from_local.run_check.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    // Replicate dims are broadcast from their first rank: (Shard(0), Replicate()) takes tp
    // coordinate 0's value on each dp row.
    const auto mine = cg::full<float>({2, 3}, static_cast<float>(ctx.rank()));
    const auto d = cg::dtensor<float>::from_local(mine, mesh, {cg::shard(0), cg::replicate()}, {.run_check = true});
    const float row_first = static_cast<float>(ctx.rank() / 2 * 2);
    CHECK(d.to_local().to_vector() == std::vector<float>(6, row_first));
    CHECK(d.full_tensor().to_vector() ==
          std::vector<float>{0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2});
    // Shapes that differ between ranks: an error on every rank, never a hang.
    const auto uneven = cg::full<float>({ctx.rank() == 3 ? 1 : 2, 3}, 1.f);
    const std::string want = ctx.rank() == 3
                                 ? "run_check: rank 0 has local shape [2, 3] but rank 3 has [1, 3]"
                                 : "run_check: rank 3 has local shape [1, 3] but rank " + std::to_string(ctx.rank()) +
                                       " has [2, 3]";
    CHECK(contains(error_of([&] {
                     (void)cg::dtensor<float>::from_local(uneven, mesh, {cg::shard(0), cg::shard(1)}, {.run_check = true});
                   }),
                   want));
  });
}

// ================================ traced == eager, counted ================================

TEST_CASE("dtensor.traced.equal_to_eager_with_counts.world4") {
  run(4, [](cg::rank_context& ctx) {
    const cg::device_mesh mesh({2, 2}, {"dp", "tp"});
    const auto coord = mesh.coordinate(ctx.rank());
    const shape_t shape{6, 5};
    const auto x = local_of(shape, mesh, coord, {cg::partial(), cg::shard(1)});
    auto program = [&](auto local) {
      auto d = cg::dtensor<float>::from_local(local, mesh, {cg::partial(), cg::shard(1)}, {.shape = shape});
      auto a = d.redistribute(mesh, {cg::shard(0), cg::shard(1)});          // reduce_scatter on dp
      auto b = a.redistribute(mesh, {cg::shard(0), cg::shard(0)});          // all_to_all on tp
      auto c = b.redistribute(mesh, {cg::replicate(), cg::replicate()});    // 2 all_gathers (nested)
      return c.to_local();
    };
    std::optional<cg::comm_counter> eager_count(std::in_place);
    const auto eager = program(x);
    const auto eager_counts = eager_count->counts();
    eager_count.reset();  // counters nest: it would count the trace too
    cg::comm_counter traced_count;
    auto g = cg::trace(program, cg::input<float>(x.shape()));
    CHECK(traced_count.counts() == eager_counts);
    CHECK(traced_count.count("reduce_scatter") == 1);
    CHECK(traced_count.count("all_to_all") == 1);
    CHECK(traced_count.count("all_gather") == 2);
    CHECK(traced_count.total() == 4);
    CHECK(g.count("reduce_scatter_tensor") == 1);
    CHECK(g.count("all_to_all_single") == 1);
    CHECK(g.count("all_gather_into_tensor") == 2);
    CHECK(g.count("wait_tensor") == 4);
    g.lint();
    cg::verify_collective_order(g, ctx);
    const auto want = meant_of(shape, mesh, {cg::partial(), cg::shard(1)}).to_vector();
    CHECK(eager.to_vector() == want);
    CHECK(cg::compile(g, ctx)(x).to_vector() == want);
    // Scheduled for overlap, still the same.
    auto s = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
    CHECK(cg::compile(s, ctx)(x).to_vector() == want);
  });
}

// ================================ comm_counter ================================

TEST_CASE("dtensor.comm_counter.phases_nesting_reset.world2") {
  run(2, [](cg::rank_context&) {
    const cg::group w = iota_ranks(2);
    const auto x = cg::full<float>({4}, 1.f);
    cg::comm_counter outer;
    {
      cg::comm_counter inner;
      {
        auto p = inner.phase("forward");
        (void)cg::all_reduce(x, "sum", w);
        (void)cg::all_gather_tensor(x, 0, w);
        CHECK(inner.current_phase() == "forward");
        {
          auto q = inner.phase("inner");
          (void)cg::all_reduce(x, "sum", w);
        }
        CHECK(inner.current_phase() == "forward");
      }
      CHECK(inner.current_phase().empty());
      (void)cg::reduce_scatter_tensor(x, "sum", 0, w);
      (void)cg::all_to_all_single(x, std::nullopt, std::nullopt, w);
      (void)cg::all_reduce_coalesced(std::vector<cg::tensor<float>>{x, x}, "sum", w);
      CHECK(inner.count("all_reduce") == 2);
      CHECK(inner.count("all_reduce", "forward") == 1);
      CHECK(inner.count("all_reduce", "inner") == 1);
      CHECK(inner.count("all_reduce", "") == 0);
      CHECK(inner.count("all_gather", "forward") == 1);
      CHECK(inner.count("all_gather_into_tensor") == 1);
      CHECK(inner.count("reduce_scatter") == 1);
      CHECK(inner.count("all_to_all_single") == 1);
      CHECK(inner.count("all_reduce_coalesced") == 1);
      CHECK(inner.count("broadcast") == 0);
      CHECK(inner.total() == 6);
      CHECK(inner.counts_by_phase().at("forward").at("all_reduce") == 1);
      inner.reset();
      CHECK(inner.total() == 0);
    }
    // The outer counter saw everything; after the inner one ended, only it counts.
    CHECK(outer.total() == 6);
    (void)cg::broadcast(x, 0, w);
    CHECK(outer.count("broadcast") == 1);
  });
}
