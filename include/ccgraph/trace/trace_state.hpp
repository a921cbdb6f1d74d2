// ccgraph/trace/trace_state.hpp: the recording a trace is building, and the fake world its
// collectives resolve their groups against (any rank of any world size, no backend).
#pragma once

#include <ccgraph/core/config.hpp>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ir/graph.hpp>

namespace ccgraph {

/// The rank a trace plays. With no rank context on the thread the defaults are rank 0 and a
/// world known only through explicit rank lists; inside run_threads the rank's own context is
/// used unless these are set.
struct trace_options {
  /// The rank whose program is recorded (MPMD groups resolve for it); -1: the thread's rank.
  int rank = -1;
  /// World size for the group "0" and range checks; 0: the thread's world, else unknown.
  int world_size = 0;
};

namespace detail {

/// A gradient hook (PyTorch's Tensor.register_hook, for the traced backward): when reverse mode
/// reaches the node of value `at`, the gradient accumulated for `at` is replaced by fn(gradient)
/// before the node's own rule reads it. The dtensor boundaries (from_local, to_local) use it
/// to convert between local gradients and dtensor gradients (dist/dtensor.hpp).
struct grad_hook {
  value_ref at;
  std::function<value_ref(value_ref)> fn;
};

/// The graph being recorded and what recording needs. One per active trace, per thread.
struct trace_state {
  graph g;
  int rank = 0;
  std::shared_ptr<group_registry> registry;
  /// Materialised pointwise expressions by (expression text, inputs): a value used by several
  /// consumers becomes one node.
  std::unordered_map<std::string, value_ref> pointwise_memo;
  /// The nodes of each cg::checkpoint region, in recording order (autograd/checkpoint.hpp):
  /// the backward reads recomputed copies of their values.
  std::vector<std::vector<const node*>> checkpoints;
  /// The nodes of each resharded region (FSDP's unshard, dist/fsdp.hpp): like a checkpoint
  /// region, but every gradient rule that reads one of its values, inside or outside it, reads
  /// a recomputed copy, so the region's values (a full parameter) live in the forward only.
  std::vector<std::vector<const node*>> reshards;
  /// Gradient hooks, in registration order (applied in that order to one value).
  std::vector<grad_hook> grad_hooks;

  /// Steps run on the finished graph (its output set) before cg::trace returns it, in the order
  /// first asked, each name once: what taking a gradient asks of the whole joint graph
  /// (autograd/grad.hpp: recompute_pointwise).
  std::vector<std::pair<std::string, std::function<void(graph&)>>> finish;

  /// Asks for `step` on the finished graph, unless a step of this name is asked for already.
  CCGRAPH_DECL void finish_with(std::string name, std::function<void(graph&)> step);

  /// The canonical group of `g` for the traced rank ("the fake communicator").
  CCGRAPH_DECL group_info resolve(const group& grp, const char* what) const;
};

/// The calling thread's active trace, or null.
CCGRAPH_DECL trace_state*& current_trace_ptr();

}  // namespace detail
}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/trace/impl/trace_state.ipp>
#endif
