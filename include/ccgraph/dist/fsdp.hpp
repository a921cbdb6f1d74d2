// ccgraph/dist/fsdp.hpp: fully sharded data parallelism (PyTorch's FSDP2, fully_shard) on a
// 1-d data-parallel mesh: each parameter laid out Shard(0) (torch.chunk pieces, uneven allowed),
// all_gathered where it is used and freed after, its gradient reduce_scattered back to Shard(0)
// (the all_gather's transpose).
//
//   template <class V> struct mlp { BOOST_HANA_DEFINE_STRUCT(mlp, (V, w1), (V, w2)); };
//   auto fs = cg::fully_shard(mlp<cg::tensor<float>>{w1, w2}, mesh["dp"]);  // each rank keeps its rows
//   auto step = cg::value_and_grad([&](auto x, auto a, auto b) {            // a, b: this rank's shards
//     using V = decltype(x);
//     auto m = cg::fully_shard(std::map<std::string, V>{{"w1", a}, {"w2", b}}, mesh["dp"],
//                              {.local_shards = true, .shapes = fs.shapes()});
//     V h = cg::relu(cg::linear(x, m.unshard("w1")));   // all_gather, then the matmul
//     return cg::sum(cg::linear(h, m.unshard("w2")));   // this rank's batch: a term of the loss
//   }, {1, 2});
//   auto [loss, g1, g2] = step(x_shard, fs["w1"].to_local(), fs["w2"].to_local());  // g: Shard(0) pieces
//
// Traced, an unshard is a resharded region (trace_state::reshards): the backward reads a
// recomputed all_gather instead of the forward's full parameter, so the memory planner frees the
// full parameter after its last forward use (PyTorch's reshard_after_forward = True). Prefetch
// is the scheduler's: the all_gathers depend only on the step's inputs, so raise_comms issues
// them ahead of the previous layers' compute. 2-D (FSDP on "dp" x tensor parallel on "tp"):
// fully_shard the tensor-parallel pieces (a parallel_module's local_params()) over mesh["dp"],
// and parallelize_module the unsharded pieces with {.local_shards = true} inside the step.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/dist/dtensor.hpp>
#include <ccgraph/dist/parallel.hpp>
#include <ccgraph/dist/placement.hpp>
#include <ccgraph/group/device_mesh.hpp>

namespace ccgraph {

/// Options of fully_shard.
struct fully_shard_options {
  /// The module's tensors are this rank's Shard(0) pieces already (an fsdp_module's
  /// local_params()); inside a differentiated step, this is how the pieces become its inputs.
  bool local_shards = false;
  /// With local_shards: each parameter's global shape (an fsdp_module's shapes()); needed
  /// where dim 0 does not divide evenly. A parameter not named is taken as evenly sharded (its
  /// dim 0 the local size times the mesh size).
  std::map<std::string, shape_t> shapes{};
  /// Traced: the backward re-gathers a full parameter it reads instead of keeping the
  /// forward's (PyTorch's reshard_after_forward). Off: the full parameter stays alive from the
  /// forward's all_gather to its last use in the backward (no second all_gather).
  bool reshard_after_forward = true;
};

/// A module's parameters fully sharded on a 1-d data-parallel mesh: each one a dtensor laid out
/// Shard(0), unsharded (all_gathered) where it is used. L is tensor<T> (eager) or symbolic<T>
/// (traced). Made by cg::fully_shard.
template <class T, class L = tensor<T>>
class fsdp_module : public detail::named_dtensors<T, L> {
 public:
  /// The local value type.
  using local_type = L;
  /// The parameters' type.
  using dtensor_type = dtensor<T, L>;

  /// The parts, as fully_shard checked them.
  fsdp_module(ccgraph::device_mesh mesh, std::vector<std::pair<std::string, dtensor_type>> params,
              bool reshard_after_forward)
      : detail::named_dtensors<T, L>("fsdp_module", std::move(params)), mesh_(std::move(mesh)),
        reshard_(reshard_after_forward) {}

  /// The data-parallel mesh.
  const ccgraph::device_mesh& mesh() const { return mesh_; }
  /// Whether a traced unshard is re-gathered for the backward.
  bool reshard_after_forward() const { return reshard_; }
  // param(name) (a dtensor laid out Shard(0) on the mesh), operator[], names() and
  // local_params() (each rank's Shard(0) piece; fully_shard takes them back with
  // {.local_shards = true, .shapes = shapes()}): detail::named_dtensors.
  /// Each parameter's global (unsharded) shape.
  std::map<std::string, shape_t> shapes() const {
    std::map<std::string, shape_t> out;
    for (const auto& [k, v] : this->params_) out.emplace(k, v.shape());
    return out;
  }

  /// The whole parameter `name` on every rank of the mesh (PyTorch's unshard, per parameter):
  /// one all_gather of the Shard(0) pieces (uneven pieces padded and narrowed). Traced, its
  /// gradient is this rank's term of the whole parameter's (each rank differentiates its own
  /// batch), reduce_scattered back to the piece: the all_gather's transpose. With
  /// reshard_after_forward, the gather is a resharded region: the backward reads a re-gathered
  /// copy, so the full parameter is freed after its last forward use.
  L unshard(std::string_view name) const {
    const dtensor_type& p = this->param(name);
    if constexpr (is_traced_v<L>) {
      if (!reshard_) return gather(p);
      // (auto: the tracer's types are named only where a traced L instantiates this.)
      auto* st = p.local_value().state();
      const auto before_list = st->g.nodes();
      using region_t = typename std::remove_reference_t<decltype(st->reshards)>::value_type;
      const std::unordered_set<typename region_t::value_type> before(before_list.begin(), before_list.end());
      L full = gather(p);
      region_t region;
      for (const auto* n : st->g.nodes())
        if (!before.count(n)) region.push_back(n);
      st->reshards.push_back(std::move(region));
      return full;
    } else {
      return gather(p);
    }
  }
  /// Every parameter unsharded (unshard of each, in the module's order), by name: the module
  /// parallelize_module takes for 2-D FSDP x tensor parallel.
  std::map<std::string, L> unshard_all() const {
    std::map<std::string, L> out;
    for (const auto& [k, v] : this->params_) out.emplace(k, unshard(k));
    return out;
  }

 private:
  static L gather(const dtensor_type& p) {
    // Partial(sum) gradient: each rank's term of the whole parameter's gradient, as it is (no
    // 1 / size scaling); the all_gather's rule reduce_scatters the terms.
    return p.redistribute(p.mesh(), {replicate()}).to_local(std::vector<placement>{partial()});
  }

  ccgraph::device_mesh mesh_;
  bool reshard_;
};

/// PyTorch's fully_shard (FSDP2): lays `module`'s parameters out Shard(0) on the 1-d mesh
/// `mesh` (mesh["dp"] of a larger one), as torch.chunk pieces (the last ones shorter or
/// empty). By default each rank holds the whole parameters and keeps its piece (no
/// communication); with `{.local_shards = true}` they are this rank's pieces already (and
/// `.shapes` gives the global shapes of uneven ones). `module`: a Boost.Hana struct (its tensor
/// members, by name) or a map from names to tensors, as parallelize_module takes. Errors name
/// the call and the values: a mesh that is not 1-d, a parameter of no dims, a shape for no
/// parameter, a piece that is not this rank's piece of its global shape.
template <class M>
auto fully_shard(const M& module, const device_mesh& mesh, fully_shard_options opts = {}) {
  using L = typename detail::module_local<M>::type;
  using T = typename L::value_type;
  constexpr const char* what = "fully_shard";
  CCGRAPH_CHECK(mesh.ndim() == 1, what, ": the mesh ", mesh.str(), " has ", mesh.ndim(),
                " dims; FSDP takes a 1-d mesh (pass its data-parallel dim: mesh[\"dp\"])");
  const auto params = detail::named_params<L>(module);
  const int n = mesh.size(0);
  for (const auto& [name, s] : opts.shapes) {
    bool found = false;
    for (const auto& [k, v] : params) found = found || k == name;
    if (!found) {
      std::string have;
      for (const auto& [k, v] : params) have += (have.empty() ? "'" : ", '") + k + "'";
      CCGRAPH_THROW(error, what, ": options.shapes names '", name, "' (", shape_str(s),
                    "), which is not a parameter of the module; its parameters are [", have, "]");
    }
    CCGRAPH_CHECK(opts.local_shards, what, ": options.shapes (for '", name,
                  "') is only read with local_shards = true; without it each rank holds the whole parameter");
  }
  std::vector<std::pair<std::string, dtensor<T, L>>> out;
  for (const auto& [name, value] : params) {
    CCGRAPH_CHECK(!value.shape().empty(), what, ": '", name, "' has shape ", shape_str(value.shape()),
                  " (a scalar); FSDP shards dim 0, so a parameter needs at least one dim");
    if (opts.local_shards) {
      shape_t global = value.shape();
      if (const auto it = opts.shapes.find(name); it != opts.shapes.end()) global = it->second;
      else global[0] *= n;
      CCGRAPH_CHECK(global.size() == value.shape().size(), what, ": '", name, "' has local shape ",
                    shape_str(value.shape()), " but options.shapes gives it ", shape_str(global));
      out.emplace_back(name, dtensor<T, L>::from_local(value, mesh, {shard(0)}, {.shape = global}));
    } else {
      // Every rank holds the whole parameter: its piece is a local chunk (no communication).
      const auto whole = dtensor<T, L>::from_local(value, mesh, {replicate()});
      out.emplace_back(name, whole.redistribute(mesh, {shard(0)}));
    }
  }
  return fsdp_module<T, L>(mesh, std::move(out), opts.reshard_after_forward);
}

}  // namespace ccgraph
