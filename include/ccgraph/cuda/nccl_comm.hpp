// ccgraph/cuda/nccl_comm.hpp: a move-only owner of an NCCL communicator.
#pragma once

#include <ccgraph/cuda/error.hpp>

#include <nccl.h>

#include <memory>
#include <type_traits>
#include <vector>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "ccgraph needs NCCL 2.18 or newer (ncclCommSplit, ncclCommFinalize)"
#endif

namespace ccgraph::cuda {

/// An NCCL communicator owned for its lifetime: ncclCommDestroy in the destructor, abort() to
/// tear it down without waiting for peers. Move-only; may be empty.
class nccl_comm {
 public:
  nccl_comm() noexcept = default;

  /// Takes ownership of `c`.
  explicit nccl_comm(ncclComm_t c) noexcept : handle_(c) {}

  /// A new id for init_rank(); made on one rank and sent to all others (store, MPI...).
  [[nodiscard]] static ncclUniqueId unique_id() {
    ncclUniqueId id{};
    CCGRAPH_CHECK_NCCL(ncclGetUniqueId(&id));
    return id;
  }

  /// Joins communicator `id` as `rank` of `nranks`, on the current CUDA device. Blocks until
  /// all ranks have joined: call it from one thread (or process) per rank.
  [[nodiscard]] static nccl_comm init_rank(int nranks, const ncclUniqueId& id, int rank) {
    ncclComm_t c = nullptr;
    CCGRAPH_CHECK_NCCL(ncclCommInitRank(&c, nranks, id, rank));
    return nccl_comm(c);
  }

  /// One communicator per device of `devices` (rank i on devices[i]), from a single thread.
  [[nodiscard]] static std::vector<nccl_comm> init_all(const std::vector<int>& devices) {
    std::vector<ncclComm_t> raw(devices.size(), nullptr);
    CCGRAPH_CHECK_NCCL(
        ncclCommInitAll(raw.data(), static_cast<int>(devices.size()), devices.data()));
    std::vector<nccl_comm> comms;
    comms.reserve(raw.size());
    for (ncclComm_t c : raw) comms.emplace_back(c);
    return comms;
  }

  [[nodiscard]] ncclComm_t get() const noexcept { return handle_.get(); }
  [[nodiscard]] ncclComm_t release() noexcept { return handle_.release(); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  /// This communicator's rank.
  [[nodiscard]] int rank() const {
    int r = 0;
    CCGRAPH_CHECK_NCCL(ncclCommUserRank(get(), &r));
    return r;
  }

  /// Number of ranks.
  [[nodiscard]] int size() const {
    int n = 0;
    CCGRAPH_CHECK_NCCL(ncclCommCount(get(), &n));
    return n;
  }

  /// The CUDA device this rank runs on.
  [[nodiscard]] int device() const {
    int d = 0;
    CCGRAPH_CHECK_NCCL(ncclCommCuDevice(get(), &d));
    return d;
  }

  /// An error raised by in-flight operations (a peer failed, a network error), or ncclSuccess.
  /// Polled by watchdogs, since a failed collective otherwise just never completes.
  [[nodiscard]] ncclResult_t async_error() const {
    ncclResult_t status = ncclSuccess;
    CCGRAPH_CHECK_NCCL(ncclCommGetAsyncError(get(), &status));
    return status;
  }

  /// A sub-communicator of the ranks that pass the same `color`, ordered by `key` (device-mesh
  /// dimensions and sub-groups). Collective over all ranks of this communicator. A rank that
  /// passes NCCL_SPLIT_NOCOLOR gets an empty nccl_comm.
  [[nodiscard]] nccl_comm split(int color, int key) const {
    ncclComm_t c = nullptr;
    CCGRAPH_CHECK_NCCL(ncclCommSplit(get(), color, key, &c, nullptr));
    return nccl_comm(c);
  }

  /// Flushes all queued operations and waits until every rank is done with them; a clean
  /// shutdown calls this before the destructor, which then frees only local resources.
  void finalize() const { CCGRAPH_CHECK_NCCL(ncclCommFinalize(get())); }

  /// Tears the communicator down now, cancelling in-flight operations instead of waiting for
  /// peers that may never come (a failed rank, a timeout). Leaves this object empty.
  void abort() {
    if (ncclComm_t c = handle_.release()) CCGRAPH_CHECK_NCCL(ncclCommAbort(c));
  }

 private:
  struct deleter {
    void operator()(ncclComm_t c) const noexcept { (void)ncclCommDestroy(c); }
  };
  std::unique_ptr<std::remove_pointer_t<ncclComm_t>, deleter> handle_;
};

}  // namespace ccgraph::cuda
