// ccgraph/cuda/peer_channel.hpp: an all_reduce of two GPUs that runs on their copy engines.
// NCCL's all_reduce kernels need SMs; beside a GEMM that fills every SM they wait for it, so a
// schedule that overlaps the two gains little (bench_gpu_probe on 2 x H100: a 128 MiB all_reduce
// beside an 8192^3 GEMM hides 180 of its 490 us). A copy engine moves data without SMs: each
// rank copies its input into a scratch buffer on its peer, the two ranks signal each other with
// stream memory operations (no SMs either), and a short kernel adds the two halves locally.
// NCCL 2.28's zero-CTA collectives cannot stand in: their local part queues behind the GEMM.
//
// The protocol, per all_reduce, on rank r's stream (two flags of r's: `ready` = "the peer's
// data is in my scratch", `free` = "my data may go into the peer's scratch"):
//   wait free == 1, free = 0;  copy input -> peer's scratch;  peer.ready = 1;
//   wait ready == 1, ready = 0;  out = slot0 (op) slot1;  peer.free = 1.
// Each write follows the wait it answers in both ranks' stream order, so the flags need no
// counters and a CUDA Graph that records the sequence replays it as often as it likes. Both
// ranks compute the same (commutative) expression on the same two values, so their results are
// bitwise equal, and equal to NCCL's two-rank sum. The flags live in pinned host memory (shared
// memory both processes map, when the ranks are processes): after an abort the host sets them
// with plain stores, which no queued GPU work can hold up, so a rank's streams always drain.
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

/// Launches `out[i] = a[i] (op) b[i]` for `n` elements of `dt` on `s` (fp32 arithmetic for 16-bit
/// types, rounded once). Defined by <ccgraph/cuda/peer_reduce.cuh>, which nvcc-compiled
/// translation units including <ccgraph/cuda.hpp> get: it sets the slot when the program
/// starts. Null in a program without one, where the copy-engine all_reduce is not used.
using pair_reduce_fn = void (*)(const void* a, const void* b, void* out, std::size_t n, dtype dt, reduce_op op,
                                cudaStream_t s);

/// The program's pair_reduce kernel launcher (see pair_reduce_fn).
inline pair_reduce_fn& pair_reduce_slot() {
  static pair_reduce_fn f = nullptr;
  return f;
}

/// The element types and reductions the pair_reduce kernel has (no premul_sum, no complex:
/// those all_reduces go to NCCL).
inline bool pair_reduce_supports(dtype dt, reduce_op op) {
  const bool type_ok = dt == dtype::f32 || dt == dtype::bf16 || dt == dtype::f16;
  const bool op_ok = op == reduce_op::sum || op == reduce_op::avg || op == reduce_op::product ||
                     op == reduce_op::min || op == reduce_op::max;
  return type_ok && op_ok;
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

/// The copy-engine all_reduce channel between the two ranks of a two-rank communicator: two
/// flags and a scratch buffer on each GPU, each mapped on the other. Made and grown by calls
/// both ranks make at the same point of their programs (they exchange addresses through the
/// communicator), never while a CUDA Graph records. A grown channel keeps its earlier scratch
/// buffers until it ends: recorded graphs still copy into them.
class peer_channel {
 public:
  peer_channel(const peer_channel&) = delete;
  peer_channel& operator=(const peer_channel&) = delete;

  /// Sets up the channel of `comm` (this rank at index `me`, on `device`) with room for
  /// `bytes`, exchanging addresses through `comm` on stream `s`. Null on both ranks when either
  /// cannot take part: no peer access between the GPUs, no stream memory operations, no
  /// pair_reduce kernel in the program, or an allocation failed.
  static std::unique_ptr<peer_channel> open(ncclComm_t comm, int me, int device, std::size_t bytes,
                                            cudaStream_t s) {
    std::unique_ptr<peer_channel> ch(new peer_channel(me, device));
    device_scope scope(device);
    bool ok = stream_memops::get().available() && pair_reduce_slot() != nullptr;
    if (ok) ok = ch->allocate_flags() && ch->allocate_scratch(bytes);
    endpoint mine = ch->describe(ok);
    const endpoint theirs = exchange(comm, me, mine, s);
    bool attached = ok && theirs.ok != 0 && ch->attach(theirs, true);
    const bool both = agree(comm, me, attached, s);
    ch->flags_.unlink();  // the peer has mapped it, or never will
    if (!both) return nullptr;
    return ch;
  }

  /// Bytes an all_reduce may have.
  std::size_t capacity() const { return capacity_; }

  /// Grows the scratch to hold `bytes` (collective, like open). False on both ranks when
  /// either failed; the channel must not be used then.
  bool reserve(ncclComm_t comm, std::size_t bytes, cudaStream_t s) {
    device_scope scope(device_);
    const bool ok = allocate_scratch(std::max(bytes, 2 * capacity_));
    const endpoint theirs = exchange(comm, me_, describe(ok), s);
    const bool attached = ok && theirs.ok != 0 && attach(theirs, false);
    return agree(comm, me_, attached, s);
  }

  /// Queues on `s` the all_reduce of the `n` elements of `dt` at `in` into `out` (which may be
  /// `in`), reduced by `op`, both contiguous on this rank's GPU.
  void all_reduce(const void* in, void* out, std::size_t n, dtype dt, reduce_op op, cudaStream_t s) const {
    const std::size_t bytes = n * element_size(dt);
    CCGRAPH_CHECK(bytes <= capacity_, "copy-engine all_reduce: ", bytes, " bytes, but the channel holds ", capacity_);
    const stream_memops& m = stream_memops::get();
    static constexpr const char* what = "copy-engine all_reduce";
    m.wait_eq(s, flags_.device + free_flag, 1, what);
    m.write(s, flags_.device + free_flag, 0, what);
    CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(peer_scratch_, in, bytes, cudaMemcpyDefault, s));
    m.write(s, peer_flags_.device + ready_flag, 1, what);
    m.wait_eq(s, flags_.device + ready_flag, 1, what);
    m.write(s, flags_.device + ready_flag, 0, what);
    const void* mine = in;
    const void* theirs = scratch_.back();
    pair_reduce_slot()(me_ == 0 ? mine : theirs, me_ == 0 ? theirs : mine, out, n, dt, op, s);
    m.write(s, peer_flags_.device + free_flag, 1, what);
  }

  /// Lets every wait of this rank's queued all_reduces pass (their results are garbage): after
  /// an abort, so that the rank's streams drain instead of waiting for a peer that is gone.
  /// Call it repeatedly while they drain: each all_reduce resets the flags it waited on.
  /// Its memory is then kept until the process ends: the peer may still copy into it.
  void release() noexcept {
    abandoned_ = true;
    if (!flags_.host) return;
    flags_.host[ready_flag] = 1;
    flags_.host[free_flag] = 1;
  }

  ~peer_channel() {
    if (abandoned_) return;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = device_;
    (void)cudaSetDevice(device_);
    for (void* p : opened_) (void)cudaIpcCloseMemHandle(p);
    for (void* p : scratch_) (void)cudaFree(p);
    peer_flags_.unmap();
    flags_.unmap();
    (void)cudaGetLastError();
    (void)cudaSetDevice(prev);
  }

 private:
  static constexpr int ready_flag = 0;
  static constexpr int free_flag = 1;

  /// What a rank tells its peer.
  struct endpoint {
    std::uint64_t process = 0;
    std::int32_t device = -1;
    std::uint32_t ok = 0;
    std::uint64_t flags = 0;    // addresses, for a peer in the same process
    std::uint64_t scratch = 0;
    char flags_shm[48] = {};          // the flags' shared memory, for a peer in another process
    cudaIpcMemHandle_t scratch_ipc{};  // the scratch's IPC handle, likewise
  };

  /// A pair of flags in pinned host memory: a POSIX shared-memory page registered with CUDA.
  struct host_flags {
    volatile std::uint32_t* host = nullptr;
    std::uint32_t* device = nullptr;  // the address GPU work uses
    std::string name;                 // the shared-memory object, while it exists

    /// Creates (`create`) or opens the page `name` and registers it; false on failure.
    bool map(const std::string& n, bool create) {
      const int fd = ::shm_open(n.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
      if (fd < 0) return false;
      if (create) name = n;
      const std::size_t size = 4096;
      void* p = (!create || ::ftruncate(fd, static_cast<off_t>(size)) == 0)
                    ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
      ::close(fd);
      if (p == MAP_FAILED) return false;
      if (cudaHostRegister(p, size, cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        ::munmap(p, size);
        return false;
      }
      host = static_cast<volatile std::uint32_t*>(p);
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
      if (!host) return;
      void* p = const_cast<std::uint32_t*>(host);
      (void)cudaHostUnregister(p);
      (void)cudaGetLastError();
      ::munmap(p, 4096);
      host = nullptr;
      device = nullptr;
    }
  };

  peer_channel(int me, int device) : me_(me), device_(device) {}

  bool allocate_flags() {
    static std::atomic<unsigned> serial{0};
    const std::string n = "/ccgraph-" + std::to_string(::getpid()) + "-" + std::to_string(device_) + "-" +
                          std::to_string(serial++);
    if (!flags_.map(n, true)) {
      flags_.unmap();
      return false;
    }
    flags_.host[ready_flag] = 0;  // nothing arrived
    flags_.host[free_flag] = 1;   // the peer's scratch is free
    return true;
  }

  bool allocate_scratch(std::size_t bytes) {
    bytes = (bytes + (std::size_t{2} << 20) - 1) / (std::size_t{2} << 20) * (std::size_t{2} << 20);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
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
    std::strncpy(e.flags_shm, flags_.name.c_str(), sizeof e.flags_shm - 1);
    if (cudaIpcGetMemHandle(&e.scratch_ipc, scratch_.back()) != cudaSuccess)
      (void)cudaGetLastError();  // a same-process peer does not need it
    return e;
  }

  /// Maps the peer's flags (the first time) and newest scratch.
  bool attach(const endpoint& peer, bool first) {
    if (peer.process == process_token()) {
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, device_, peer.device) != cudaSuccess || !can) {
        (void)cudaGetLastError();
        return false;
      }
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer.device, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        return false;
      }
      (void)cudaGetLastError();
      if (first) peer_flags_.device = reinterpret_cast<std::uint32_t*>(peer.flags);  // (not ours to unmap)
      peer_scratch_ = reinterpret_cast<void*>(peer.scratch);
    } else {
      void* sc = nullptr;
      if (first && !peer_flags_.map(std::string(peer.flags_shm, strnlen(peer.flags_shm, sizeof peer.flags_shm)), false))
        return false;
      if (cudaIpcOpenMemHandle(&sc, peer.scratch_ipc, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      opened_.push_back(sc);
      peer_scratch_ = sc;
    }
    capacity_ = pending_bytes_;
    return true;
  }

  /// All-gathers one plain struct through `comm` on `s` (host values, both ranks).
  template <class T>
  static std::vector<T> all_gather_host(ncclComm_t comm, int me, const T& mine, cudaStream_t s, const char* what) {
    void* d = nullptr;
    CCGRAPH_CHECK_CUDA(cudaMalloc(&d, 2 * sizeof(T)));
    std::vector<T> out(2);
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
      CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(out.data(), d, 2 * sizeof(T), cudaMemcpyDeviceToHost, s));
      wait_stream(s, what);
    } catch (...) {
      (void)cudaFree(d);
      throw;
    }
    CCGRAPH_CHECK_CUDA(cudaFree(d));
    return out;
  }

  static endpoint exchange(ncclComm_t comm, int me, const endpoint& mine, cudaStream_t s) {
    return all_gather_host(comm, me, mine, s, "copy-engine all_reduce set-up")[static_cast<std::size_t>(1 - me)];
  }

  /// True on both ranks when both say `ok`.
  static bool agree(ncclComm_t comm, int me, bool ok, cudaStream_t s) {
    const std::uint32_t v = ok ? 1 : 0;
    const auto all = all_gather_host(comm, me, v, s, "copy-engine all_reduce set-up");
    return all[0] == 1 && all[1] == 1;
  }

  int me_;
  int device_;
  host_flags flags_;       // [ready, free], this rank's
  host_flags peer_flags_;  // the peer's (mapped here when it is another process)
  std::vector<void*> scratch_;           // this GPU's, newest last (the peer copies into it)
  void* peer_scratch_ = nullptr;         // the peer's newest, mapped here
  std::vector<void*> opened_;            // IPC mappings of another process's memory
  std::size_t capacity_ = 0;
  std::size_t pending_bytes_ = 0;
  bool abandoned_ = false;  // released after an abort: never freed
};

}  // namespace ccgraph::cuda::detail
