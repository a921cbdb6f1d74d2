// ccgraph/cuda/peer_channel.hpp: collectives that run on the GPUs' copy engines.
// NCCL's kernels need SMs; beside a GEMM that fills every SM they wait for it, so a schedule
// that overlaps the two gains little (bench_gpu_probe on 2 x H100: a 128 MiB all_reduce beside
// an 8192^3 GEMM hides 180 of its 490 us). A copy engine moves data without SMs: each rank
// copies what a peer needs into a scratch slot on that peer, the ranks signal each other with
// stream memory operations (no SMs either), and each rank finishes locally: a short kernel
// reduces the slots (all_reduce, reduce_scatter), or copies put them in place (all_gather).
// NCCL 2.28's zero-CTA collectives cannot stand in: their local part queues behind the GEMM.
//
// The protocol, per collective, on rank r's stream. Rank r's flag page has two flags per peer
// q: `ready[q]` = "q's data is in my slot for q", `free[q]` = "my slot on q is free again":
//   for each peer p:  wait free[p] == 1, free[p] = 0;  copy -> p's slot for r;  p.ready[r] = 1;
//   for each peer q:  wait ready[q] == 1, ready[q] = 0;
//   finish from my own data and my slots;  for each peer p: p.free[r] = 1.
// Each write follows the wait it answers in both ranks' stream order, so the flags need no
// counters and a CUDA Graph that records the sequence replays it as often as it likes. Every
// rank reduces the same values in the same (rank) order, so an all_reduce's ranks agree bit for
// bit; with two ranks that is NCCL's sum (a + b rounded once), with more it is a sum in rank
// order in f32, rounded once (NCCL's ring rounds after each step, in its own order), which is
// why more than two ranks reduce here only on request (nccl_options::copy_engine_reassociates).
// The flags live in pinned host memory (shared memory every process maps, when the ranks are
// processes): after an abort the host sets them with plain stores, which no queued GPU work can
// hold up, so a rank's streams always drain.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/runtime.hpp>
#include <ccgraph/cuda/stream_memops.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace ccgraph::cuda::detail {

/// A stream waiting on a flag holds its hardware queue, and CUDA's default of 8 queues per
/// device puts several streams on one: a compute stream behind a waiting communication stream
/// stood still until the peer's data came (bench_gpu_timeline, 2 x H100). So the program asks
/// for CUDA's maximum of 32 when it starts, before any CUDA context exists; a value the user
/// set is kept.
inline const bool cuda_max_connections_set = [] {
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  return true;
}();

/// The most ranks a copy-engine channel joins: the reduce kernel takes one pointer per rank.
inline constexpr int peer_channel_max_ranks = 8;

/// The sources of a reduction in rank order: `count` of the `ptr`s (at most
/// peer_channel_max_ranks).
struct peer_reduce_sources {
  const void* ptr[peer_channel_max_ranks] = {};
  int count = 0;
};

/// Launches `out[i] = src0[i] (op) src1[i] (op) ...` (sources in order, f32 arithmetic for
/// 16-bit types, rounded once; avg divides the sum by the count) for `n` elements of `dt` on
/// `s`. Defined by <ccgraph/cuda/peer_reduce.cuh>, which nvcc-compiled translation units
/// including <ccgraph/cuda.hpp> get: it sets the slot when the program starts. Null in a
/// program without one, where the copy-engine collectives are not used.
using peer_reduce_fn = void (*)(const peer_reduce_sources& src, void* out, std::size_t n, dtype dt, reduce_op op,
                                cudaStream_t s);

/// The program's peer_reduce kernel launcher (see peer_reduce_fn).
inline peer_reduce_fn& peer_reduce_slot() {
  static peer_reduce_fn f = nullptr;
  return f;
}

/// The element types and reductions the peer_reduce kernel has (no premul_sum, no complex:
/// those reductions go to NCCL).
inline bool peer_reduce_supports(dtype dt, reduce_op op) {
  const bool type_ok = dt == dtype::f32 || dt == dtype::bf16 || dt == dtype::f16;
  const bool op_ok = op == reduce_op::sum || op == reduce_op::avg || op == reduce_op::product ||
                     op == reduce_op::min || op == reduce_op::max;
  return type_ok && op_ok;
}

/// Whether reducing `ranks` values by `op` in rank order, rounded once, gives NCCL's bits: with
/// two ranks any reduction (one rounding of a commutative operation), with more only min and
/// max (exact in any order).
inline bool peer_reduce_matches_nccl(reduce_op op, int ranks) {
  return ranks == 2 || op == reduce_op::min || op == reduce_op::max;
}

/// This process among the ranks of a job: ranks with equal tokens are threads of one process
/// and share device pointers; the others exchange CUDA IPC handles.
inline std::uint64_t process_token() {
  static const std::uint64_t t = [] {
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd();
  }();
  return t;
}

/// The copy-engine channel of a communicator's ranks (2 to peer_channel_max_ranks): a flag page
/// and a scratch buffer of `ranks - 1` slots (one per peer) on each GPU, each mapped on every
/// peer. Made and grown by calls every rank makes at the same point of its program (they
/// exchange addresses through the communicator), never while a CUDA Graph records. A grown
/// channel keeps its earlier scratch buffers until it ends: recorded graphs still copy into
/// them. Every collective of a channel runs on one stream per rank, in the same order on all.
class peer_channel {
 public:
  peer_channel(const peer_channel&) = delete;
  peer_channel& operator=(const peer_channel&) = delete;

  /// Sets up the channel of `comm` (`ranks` ranks, this one at index `me`, on `device`) with
  /// slots of at least `bytes`, exchanging addresses through `comm` on stream `s`. Null on
  /// every rank when any cannot take part: too many ranks, no peer access between two of the
  /// GPUs, no stream memory operations, no peer_reduce kernel in the program, or an allocation
  /// failed.
  static std::unique_ptr<peer_channel> open(ncclComm_t comm, int me, int ranks, int device, std::size_t bytes,
                                            cudaStream_t s) {
    std::unique_ptr<peer_channel> ch(new peer_channel(me, ranks, device));
    device_scope scope(device);
    bool ok = ranks >= 2 && ranks <= peer_channel_max_ranks && stream_memops::get().available() &&
              peer_reduce_slot() != nullptr;
    if (ok) ok = ch->allocate_flags() && ch->allocate_scratch(bytes);
    const std::vector<endpoint> all = exchange(comm, me, ranks, ch->describe(ok), s);
    const bool attached = ok && ch->attach(all, true);
    const bool every = agree(comm, me, ranks, attached, s);
    ch->flags_.unlink();  // every peer has mapped it, or never will
    if (!every) return nullptr;
    return ch;
  }

  /// Bytes a slot holds: what one rank may send one peer per collective.
  std::size_t capacity() const { return capacity_; }

  /// Grows the slots to hold `bytes` (collective, like open). False on every rank when any
  /// failed; the channel must not be used then.
  bool reserve(ncclComm_t comm, std::size_t bytes, cudaStream_t s) {
    device_scope scope(device_);
    const bool ok = allocate_scratch(std::max(bytes, 2 * capacity_));
    const std::vector<endpoint> all = exchange(comm, me_, ranks_, describe(ok), s);
    const bool attached = ok && attach(all, false);
    return agree(comm, me_, ranks_, attached, s);
  }

  /// Queues on `s` the all_reduce of the `n` elements of `dt` at `in` into `out` (which may be
  /// `in`), reduced by `op` in rank order, both contiguous on this rank's GPU: every peer gets
  /// the whole input ((ranks - 1) x the bytes leave each GPU: meant for two ranks).
  void all_reduce(const void* in, void* out, std::size_t n, dtype dt, reduce_op op, cudaStream_t s) const {
    static constexpr const char* what = "copy-engine all_reduce";
    const std::size_t bytes = n * element_size(dt);
    check_fits(bytes, what);
    send(s, what, [&](int) { return in; }, bytes);
    receive(s, what);
    peer_reduce_slot()(sources(in, 0), out, n, dt, op, s);
    release_slots(s, what);
  }

  /// Queues on `s` the all_gather of `n` elements of `dt` per rank: `in` (this rank's) into
  /// `out` (every rank's in rank order; `in` may be its slice), contiguous on this GPU.
  void all_gather(const void* in, void* out, std::size_t n, dtype dt, cudaStream_t s) const {
    static constexpr const char* what = "copy-engine all_gather";
    const std::size_t bytes = n * element_size(dt);
    check_fits(bytes, what);
    send(s, what, [&](int) { return in; }, bytes);
    char* o = static_cast<char*>(out);
    if (in != o + static_cast<std::size_t>(me_) * bytes)
      CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(o + static_cast<std::size_t>(me_) * bytes, in, bytes, cudaMemcpyDeviceToDevice, s));
    receive(s, what);
    for (int q = 0; q < ranks_; ++q)
      if (q != me_)
        CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(o + static_cast<std::size_t>(q) * bytes, slot(q), bytes,
                                           cudaMemcpyDeviceToDevice, s));
    release_slots(s, what);
  }

  /// Queues on `s` the reduce_scatter of `in` (`ranks` chunks of `n` elements of `dt`, in rank
  /// order) into `out` (`n` elements: this rank's chunk reduced by `op` in rank order, which
  /// may be that chunk of `in`), contiguous on this GPU.
  void reduce_scatter(const void* in, void* out, std::size_t n, dtype dt, reduce_op op, cudaStream_t s) const {
    static constexpr const char* what = "copy-engine reduce_scatter";
    const std::size_t bytes = n * element_size(dt);
    check_fits(bytes, what);
    const char* i = static_cast<const char*>(in);
    send(s, what, [&](int p) { return i + static_cast<std::size_t>(p) * bytes; }, bytes);
    receive(s, what);
    peer_reduce_slot()(sources(in, bytes), out, n, dt, op, s);
    release_slots(s, what);
  }

  /// Lets every wait of this rank's queued collectives pass (their results are garbage): after
  /// an abort, so that the rank's streams drain instead of waiting for a peer that is gone.
  /// Call it repeatedly while they drain: each collective resets the flags it waited on.
  /// Its memory is then kept until the process ends: a peer may still copy into it.
  void release() noexcept {
    abandoned_ = true;
    if (!flags_.host) return;
    for (int q = 0; q < ranks_; ++q) {
      flags_.host[ready_flag(q)] = 1;
      flags_.host[free_flag(q)] = 1;
    }
  }

  ~peer_channel() {
    if (abandoned_) return;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = device_;
    (void)cudaSetDevice(device_);
    for (void* p : opened_) (void)cudaIpcCloseMemHandle(p);
    for (void* p : scratch_) (void)cudaFree(p);
    for (auto& pf : peers_) pf.flags.unmap();
    flags_.unmap();
    (void)cudaGetLastError();
    (void)cudaSetDevice(prev);
  }

 private:
  static constexpr std::size_t page_bytes = 4096;
  static constexpr std::size_t ready_flag(int q) { return 2 * static_cast<std::size_t>(q); }
  static constexpr std::size_t free_flag(int q) { return 2 * static_cast<std::size_t>(q) + 1; }

  /// What a rank tells its peers.
  struct endpoint {
    std::uint64_t process = 0;
    std::int32_t device = -1;
    std::uint32_t ok = 0;
    std::uint64_t flags = 0;    // addresses, for a peer in the same process
    std::uint64_t scratch = 0;
    std::uint64_t slot_bytes = 0;
    char flags_shm[48] = {};          // the flags' shared memory, for a peer in another process
    cudaIpcMemHandle_t scratch_ipc{};  // the scratch's IPC handle, likewise
  };

  /// A rank's flag page in pinned host memory: a POSIX shared-memory page registered with CUDA.
  struct host_flags {
    volatile std::uint32_t* host = nullptr;
    std::uint32_t* device = nullptr;  // the address GPU work uses
    std::string name;                 // the shared-memory object, while it exists
    bool owned = false;               // mapped here (else a same-process peer's, not ours to unmap)

    /// Creates (`create`) or opens the page `name` and registers it; false on failure.
    bool map(const std::string& n, bool create) {
      const int fd = ::shm_open(n.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
      if (fd < 0) return false;
      if (create) name = n;
      void* p = (!create || ::ftruncate(fd, static_cast<off_t>(page_bytes)) == 0)
                    ? ::mmap(nullptr, page_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
      ::close(fd);
      if (p == MAP_FAILED) return false;
      if (cudaHostRegister(p, page_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        ::munmap(p, page_bytes);
        return false;
      }
      host = static_cast<volatile std::uint32_t*>(p);
      owned = true;
      void* d = nullptr;
      if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      device = static_cast<std::uint32_t*>(d);
      return true;
    }
    /// Removes the shared-memory object's name (the mappings stay).
    void unlink() {
      if (!name.empty()) ::shm_unlink(name.c_str());
      name.clear();
    }
    void unmap() {
      unlink();
      if (!owned || !host) return;
      void* p = const_cast<std::uint32_t*>(host);
      (void)cudaHostUnregister(p);
      (void)cudaGetLastError();
      ::munmap(p, page_bytes);
      host = nullptr;
      device = nullptr;
      owned = false;
    }
  };

  /// A peer as this rank sees it: its flag page and its newest scratch, mapped here.
  struct peer {
    host_flags flags;
    char* scratch = nullptr;
    std::size_t slot_bytes = 0;
  };

  peer_channel(int me, int ranks, int device)
      : me_(me), ranks_(ranks), device_(device), peers_(static_cast<std::size_t>(std::max(ranks, 0))) {}

  void check_fits(std::size_t bytes, const char* what) const {
    CCGRAPH_CHECK(bytes <= capacity_, what, ": ", bytes, " bytes per peer, but the channel's slots hold ", capacity_);
  }

  /// This rank's slot for data from peer `q`.
  const void* slot(int q) const {
    return static_cast<const char*>(scratch_.back()) + slot_index(me_, q) * slot_bytes_;
  }
  /// Where, in the scratch of rank `owner`, the slot for data from rank `from` is.
  std::size_t slot_index(int owner, int from) const {
    return static_cast<std::size_t>((from - owner - 1 + ranks_) % ranks_);
  }

  /// The first half of the protocol: `data(p)` (bytes of this GPU) into each peer p's slot for
  /// this rank, once p has freed it, each followed by p.ready[me] = 1. Peers in the order
  /// me + 1, me + 2, ...: the ranks do not all write to the same peer first.
  template <class Data>
  void send(cudaStream_t s, const char* what, Data&& data, std::size_t bytes) const {
    const stream_memops& m = stream_memops::get();
    for (int k = 1; k < ranks_; ++k) {
      const int p = (me_ + k) % ranks_;
      const peer& to = peers_[static_cast<std::size_t>(p)];
      m.wait_eq(s, flags_.device + free_flag(p), 1, what);
      m.write(s, flags_.device + free_flag(p), 0, what);
      CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(to.scratch + slot_index(p, me_) * to.slot_bytes, data(p), bytes,
                                         cudaMemcpyDefault, s));
      m.write(s, to.flags.device + ready_flag(me_), 1, what);
    }
  }
  /// Waits until every peer's data is in this rank's slots.
  void receive(cudaStream_t s, const char* what) const {
    const stream_memops& m = stream_memops::get();
    for (int k = 1; k < ranks_; ++k) {
      const int q = (me_ - k + ranks_) % ranks_;
      m.wait_eq(s, flags_.device + ready_flag(q), 1, what);
      m.write(s, flags_.device + ready_flag(q), 0, what);
    }
  }
  /// Tells every peer this rank is done with its slot.
  void release_slots(cudaStream_t s, const char* what) const {
    const stream_memops& m = stream_memops::get();
    for (int k = 1; k < ranks_; ++k) {
      const int p = (me_ + k) % ranks_;
      m.write(s, peers_[static_cast<std::size_t>(p)].flags.device + free_flag(me_), 1, what);
    }
  }
  /// The reduction's sources in rank order: this rank's own at `mine` + `offset x me`, the
  /// others in their slots.
  peer_reduce_sources sources(const void* mine, std::size_t offset) const {
    peer_reduce_sources src;
    src.count = ranks_;
    for (int q = 0; q < ranks_; ++q)
      src.ptr[q] = q == me_ ? static_cast<const char*>(mine) + offset * static_cast<std::size_t>(me_) : slot(q);
    return src;
  }

  bool allocate_flags() {
    static std::atomic<unsigned> serial{0};
    const std::string n = "/ccgraph-" + std::to_string(::getpid()) + "-" + std::to_string(device_) + "-" +
                          std::to_string(serial++);
    if (!flags_.map(n, true)) {
      flags_.unmap();
      return false;
    }
    for (int q = 0; q < ranks_; ++q) {
      flags_.host[ready_flag(q)] = 0;  // nothing arrived
      flags_.host[free_flag(q)] = 1;   // my slot on q is free
    }
    return true;
  }

  bool allocate_scratch(std::size_t bytes) {
    bytes = (bytes + (std::size_t{2} << 20) - 1) / (std::size_t{2} << 20) * (std::size_t{2} << 20);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes * static_cast<std::size_t>(ranks_ - 1)) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    scratch_.push_back(p);
    pending_bytes_ = bytes;
    return true;
  }

  endpoint describe(bool ok) const {
    endpoint e;
    e.process = process_token();
    e.device = device_;
    e.ok = ok ? 1 : 0;
    if (!ok) return e;
    e.flags = reinterpret_cast<std::uint64_t>(flags_.device);
    e.scratch = reinterpret_cast<std::uint64_t>(scratch_.back());
    e.slot_bytes = pending_bytes_;
    std::strncpy(e.flags_shm, flags_.name.c_str(), sizeof e.flags_shm - 1);
    if (cudaIpcGetMemHandle(&e.scratch_ipc, scratch_.back()) != cudaSuccess)
      (void)cudaGetLastError();  // a same-process peer does not need it
    return e;
  }

  /// Maps every peer's flags (the first time) and newest scratch; the slots' capacity is then
  /// the smallest any rank has.
  bool attach(const std::vector<endpoint>& all, bool first) {
    std::size_t cap = pending_bytes_;
    for (int q = 0; q < ranks_; ++q) {
      if (q == me_) continue;
      const endpoint& e = all[static_cast<std::size_t>(q)];
      peer& pr = peers_[static_cast<std::size_t>(q)];
      if (e.ok == 0) return false;
      if (e.process == process_token()) {
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, device_, e.device) != cudaSuccess || !can) {
          (void)cudaGetLastError();
          return false;
        }
        const cudaError_t err = cudaDeviceEnablePeerAccess(e.device, 0);
        if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) {
          (void)cudaGetLastError();
          return false;
        }
        (void)cudaGetLastError();
        if (first) pr.flags.device = reinterpret_cast<std::uint32_t*>(e.flags);  // (not ours to unmap)
        pr.scratch = reinterpret_cast<char*>(e.scratch);
      } else {
        void* sc = nullptr;
        if (first && !pr.flags.map(std::string(e.flags_shm, strnlen(e.flags_shm, sizeof e.flags_shm)), false))
          return false;
        if (cudaIpcOpenMemHandle(&sc, e.scratch_ipc, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
          (void)cudaGetLastError();
          return false;
        }
        opened_.push_back(sc);
        pr.scratch = static_cast<char*>(sc);
      }
      pr.slot_bytes = static_cast<std::size_t>(e.slot_bytes);
      cap = std::min(cap, pr.slot_bytes);
    }
    slot_bytes_ = pending_bytes_;
    capacity_ = cap;
    return true;
  }

  /// All-gathers one plain struct through `comm` on `s` (host values, every rank).
  template <class T>
  static std::vector<T> all_gather_host(ncclComm_t comm, int me, int ranks, const T& mine, cudaStream_t s,
                                        const char* what) {
    const auto n = static_cast<std::size_t>(ranks);
    void* d = nullptr;
    CCGRAPH_CHECK_CUDA(cudaMalloc(&d, n * sizeof(T)));
    std::vector<T> out(n);
    try {
      auto* slot = static_cast<char*>(d) + static_cast<std::size_t>(me) * sizeof(T);
      CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(slot, &mine, sizeof(T), cudaMemcpyHostToDevice, s));
      // In a group: `comm` may be non-blocking (an adopted communicator, cuda::adopt), whose
      // calls outside one may return ncclInProgress; its launch then ends in the background.
      CCGRAPH_CHECK_NCCL(ncclGroupStart());
      const ncclResult_t ag = ncclAllGather(slot, d, sizeof(T), ncclUint8, comm, s);
      ncclResult_t r = ncclGroupEnd();
      CCGRAPH_CHECK_NCCL(ag);
      while (r == ncclInProgress) CCGRAPH_CHECK_NCCL(ncclCommGetAsyncError(comm, &r));
      CCGRAPH_CHECK_NCCL(r);
      CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(out.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s));
      wait_stream(s, what);
    } catch (...) {
      (void)cudaFree(d);
      throw;
    }
    CCGRAPH_CHECK_CUDA(cudaFree(d));
    return out;
  }

  static std::vector<endpoint> exchange(ncclComm_t comm, int me, int ranks, const endpoint& mine, cudaStream_t s) {
    return all_gather_host(comm, me, ranks, mine, s, "copy-engine channel set-up");
  }

  /// True on every rank when every rank says `ok`.
  static bool agree(ncclComm_t comm, int me, int ranks, bool ok, cudaStream_t s) {
    const std::uint32_t v = ok ? 1 : 0;
    const auto all = all_gather_host(comm, me, ranks, v, s, "copy-engine channel set-up");
    return std::all_of(all.begin(), all.end(), [](std::uint32_t x) { return x == 1; });
  }

  int me_;
  int ranks_;
  int device_;
  host_flags flags_;                // this rank's page: ready[q], free[q] per peer q
  std::vector<peer> peers_;         // indexed by rank in the channel (this rank's entry unused)
  std::vector<void*> scratch_;      // this GPU's, newest last (the peers copy into it)
  std::vector<void*> opened_;       // IPC mappings of another process's memory
  std::size_t slot_bytes_ = 0;      // a slot of this rank's newest scratch
  std::size_t capacity_ = 0;        // the smallest slot of any rank's newest scratch
  std::size_t pending_bytes_ = 0;
  bool abandoned_ = false;  // released after an abort: never freed
};

}  // namespace ccgraph::cuda::detail
