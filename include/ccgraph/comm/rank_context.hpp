// ccgraph/comm/rank_context.hpp: what a rank's function is handed: who it is, its world, its
// device, and the communicator its collectives go through.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/comm/communicator.hpp>

namespace ccgraph {

/// One rank's view of its world. Collectives called on this rank's thread go through it
/// (functional collectives take no context argument, like PyTorch's default process group).
class rank_context {
 public:
  rank_context(int rank, int world_size, ccgraph::device dev,
               std::shared_ptr<group_registry> registry,
               std::shared_ptr<detail::communicator> comm)
      : rank_(rank),
        world_size_(world_size),
        device_(dev),
        registry_(std::move(registry)),
        comm_(std::move(comm)) {}
  rank_context(const rank_context&) = delete;
  rank_context& operator=(const rank_context&) = delete;

  /// This rank's index in the world.
  int rank() const { return rank_; }
  /// Number of ranks in the world.
  int world_size() const { return world_size_; }
  /// The group of all ranks (named "0").
  group world() const { return group(std::string("0")); }
  /// Where this rank's tensors live: cpu on the threads backend, cuda:N on the nccl backend.
  ccgraph::device device() const { return device_; }
  /// Registers `name` for `ranks` with the world, so collectives can take the name as group.
  void register_group(const std::string& name, std::vector<int> ranks) {
    registry_->add(name, std::move(ranks));
  }
  /// The canonical form of `g` for this rank; `what` names the caller in errors.
  group_info resolve(const group& g, const char* what) const {
    return g.resolve(rank_, *registry_, what);
  }
  /// The world's group names.
  const group_registry& registry() const { return *registry_; }
  /// The communicator collectives are launched on.
  detail::communicator& comm() const { return *comm_; }

 private:
  int rank_;
  int world_size_;
  ccgraph::device device_;
  std::shared_ptr<group_registry> registry_;
  std::shared_ptr<detail::communicator> comm_;
};

namespace detail {

/// The rank context of the calling thread (set by the backend that runs the rank), or null.
inline rank_context*& current_rank_ptr() {
  thread_local rank_context* ctx = nullptr;
  return ctx;
}

/// The calling thread's rank context; `what` names the collective in the error when there is none.
inline rank_context& current_rank(const char* what) {
  rank_context* ctx = current_rank_ptr();
  CCGRAPH_CHECK(ctx != nullptr, what,
                ": no rank context on this thread; call collectives inside cg::run_threads "
                "(or cg::cuda::run_gpus / init_from_env)");
  return *ctx;
}

/// Makes `ctx` the calling thread's rank context for the scope's lifetime.
class rank_scope {
 public:
  explicit rank_scope(rank_context& ctx) : prev_(current_rank_ptr()) { current_rank_ptr() = &ctx; }
  rank_scope(const rank_scope&) = delete;
  rank_scope& operator=(const rank_scope&) = delete;
  ~rank_scope() { current_rank_ptr() = prev_; }

 private:
  rank_context* prev_;
};

}  // namespace detail
}  // namespace ccgraph
