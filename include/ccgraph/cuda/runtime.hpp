// ccgraph/cuda/runtime.hpp: the CUDA device runtime behind device tensors: stream-ordered
// caching allocation (CUDA's memory pools, and each rank's cache of small blocks), copies,
// synchronisation with a watchdog, GEMM.
// Including this header installs it (see detail::device_runtime in tensor/device_runtime.hpp).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/env.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/cuda/blas.hpp>
#include <ccgraph/cuda/block_cache.hpp>
#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/graph.hpp>
#include <ccgraph/cuda/nvtx.hpp>
#include <ccgraph/tensor/device_runtime.hpp>

#include <cuda_runtime_api.h>

namespace ccgraph::cuda {

namespace detail {

/// Makes `dev` the current CUDA device for the scope (a no-op when it already is).
class device_scope {
 public:
  explicit device_scope(int dev) {
    CCGRAPH_CHECK_CUDA(cudaGetDevice(&prev_));
    if (prev_ != dev) CCGRAPH_CHECK_CUDA(cudaSetDevice(dev));
    set_ = prev_ != dev;
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
    if (set_) (void)cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool set_ = false;
};

/// What a blocking wait on this thread checks while it polls: a rank's backend installs a
/// hook that fails fast on a communicator error and aborts after its timeout, so a peer that
/// died or never arrived gives an error instead of a hang. Null: wait without one.
struct wait_watchdog {
  /// Called while polling with the time waited so far; throws to give up.
  std::function<void(std::chrono::steady_clock::duration, const char* what)> check;
};
inline wait_watchdog*& current_watchdog() {
  thread_local wait_watchdog* w = nullptr;
  return w;
}

/// Blocks until `query()` stops returning cudaErrorNotReady. Polls (rather than a CUDA
/// synchronize, which cannot be interrupted) so the rank's watchdog can abort a collective that
/// never ends; with no watchdog installed, `block()` waits instead.
template <class Query, class Block>
void wait_polled(Query&& query, Block&& block, const char* what) {
  wait_watchdog* w = current_watchdog();
  if (!w) {
    CCGRAPH_CHECK_CUDA(block());
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    const cudaError_t st = query();
    if (st == cudaSuccess) return;
    if (st != cudaErrorNotReady) CCGRAPH_CHECK_CUDA(st);
    w->check(std::chrono::steady_clock::now() - start, what);
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

/// Blocks until everything queued on `s` has run, under the rank's watchdog (wait_polled).
inline void wait_stream(cudaStream_t s, const char* what) {
  wait_polled([&] { return cudaStreamQuery(s); }, [&] { return cudaStreamSynchronize(s); }, what);
}

/// Keeps freed blocks in CUDA's default memory pool of each device used (the pool's release
/// threshold at its maximum), so steady-state allocation never reaches the driver: the
/// stream-ordered equivalent of PyTorch's caching allocator, and capturable in CUDA Graphs.
inline void configure_pool(int dev) {
  static constexpr int max_devices = 64;
  thread_local bool seen[max_devices] = {};  // this thread's fast path: no lock per allocation
  if (dev >= 0 && dev < max_devices && seen[dev]) return;
  static bool done[max_devices] = {};
  static std::mutex mu;
  std::lock_guard lk(mu);
  if (dev < 0 || dev >= max_devices) return;
  if (!done[dev]) {
    cudaMemPool_t pool = nullptr;
    CCGRAPH_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
    std::uint64_t threshold = UINT64_MAX;
    CCGRAPH_CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    done[dev] = true;
  }
  seen[dev] = true;
}

inline void* allocate(device dev, std::size_t bytes) {
  device_scope scope(dev.index);
  configure_pool(dev.index);
  const cudaStream_t s = current_stream();
  // Small blocks on the rank's stream come from its cache (see block_cache for why and when).
  block_cache* cache = block_cache::cacheable(bytes) ? block_cache::active(s, dev.index) : nullptr;
  if (cache && cache->recording()) cache = nullptr;  // allocations there are graph nodes
  const std::size_t size = cache ? block_cache::rounded(bytes) : bytes;
  if (cache)
    if (void* p = cache->take(size)) return p;
  void* p = nullptr;
  cudaError_t st = cudaMallocAsync(&p, size, s);
  if (st == cudaErrorMemoryAllocation && cache) {
    (void)cudaGetLastError();
    cache->flush();  // what the cache holds may be what is missing
    st = cudaMallocAsync(&p, size, s);
  }
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    CCGRAPH_THROW(::ccgraph::cuda_error, "tensor allocation: cudaMallocAsync of ", bytes,
                  " bytes on ", dev, " failed: ", cudaGetErrorName(st), " (",
                  cudaGetErrorString(st), ")");
  }
  if (cache) cache->adopt(p, size);
  return p;
}

inline void deallocate(device dev, void* p, std::size_t bytes) {
  // Freed in the order of this thread's stream: blocks go back to the pool (or the rank's
  // cache) once the work queued so far (the last users) has run. Errors are dropped:
  // destructors cannot throw, and at exit the context may be gone.
  if (block_cache::cacheable(bytes)) {
    block_cache* cache = block_cache::active(current_stream(), dev.index);
    if (cache && cache->give(p, block_cache::rounded(bytes))) return;
    block_cache::forget_everywhere(p);  // a rank's block freed elsewhere, if it is one
  }
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) return;
  if (cur != dev.index) (void)cudaSetDevice(dev.index);
  (void)cudaFreeAsync(p, current_stream());
  if (cur != dev.index) (void)cudaSetDevice(cur);
}

inline void copy(void* dst, device dst_dev, const void* src, device src_dev, std::size_t bytes) {
  const device on = dst_dev.is_cuda() ? dst_dev : src_dev;
  device_scope scope(on.index);
  // A copy to or from pageable host memory can block the host inside the driver until the
  // stream reaches it (to host, always): behind a collective whose peer never comes, a wait
  // no watchdog can end. So on a rank (a watchdog is installed) the stream is drained first,
  // polling under the watchdog, and the copy then finds it idle. (Not while recording a CUDA
  // Graph: a query would end the recording, and nothing runs then anyway.)
  const bool host_side = dst_dev.is_cpu() || src_dev.is_cpu();
  if (host_side && current_watchdog() && !::ccgraph::cuda::is_capturing(current_stream()))
    wait_stream(current_stream(), "copy to or from host");
  CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, current_stream()));
  if (dst_dev.is_cpu()) wait_stream(current_stream(), "copy to host");
}

inline void synchronize(device dev) {
  device_scope scope(dev.index);
  wait_stream(current_stream(), "synchronize");
}

inline void gemm_entry(device dev, dtype dt, std::int64_t m, std::int64_t n, std::int64_t k,
                       const void* a, std::int64_t lda, bool ta, const void* b, std::int64_t ldb,
                       bool tb, void* c, std::int64_t ldc) {
  device_scope scope(dev.index);
  gemm(dev, dt, m, n, k, a, lda, ta, b, ldb, tb, c, ldc);
}

inline void gemm_batched_entry(device dev, dtype dt, std::int64_t m, std::int64_t n, std::int64_t k,
                               const void* a, std::int64_t lda, bool ta, const void* b, std::int64_t ldb,
                               bool tb, void* c, std::int64_t ldc, std::int64_t batch, std::int64_t stride_a,
                               std::int64_t stride_b, std::int64_t stride_c) {
  device_scope scope(dev.index);
  gemm_batched(dev, dt, m, n, k, a, lda, ta, b, ldb, tb, c, ldc, batch, stride_a, stride_b, stride_c);
}

inline void capture_begin(device dev) {
  // A bad CCGRAPH_GRAPH_SUMMARY is an error before anything is recorded, not after.
  (void)::ccgraph::detail::env_flag("CCGRAPH_GRAPH_SUMMARY", false);
  device_scope scope(dev.index);
  CCGRAPH_CHECK(current_stream() != cudaStreamPerThread && current_stream() != nullptr,
                "CUDA Graph capture needs the rank's own stream (run it under cuda::run_gpus or "
                "init_from_env, or set one with cuda::stream_guard)");
  // Thread-local mode: only this thread's unsafe calls break the capture; other ranks' threads
  // go on with their own work (and their own captures).
  CCGRAPH_CHECK_CUDA(cudaStreamBeginCapture(current_stream(), cudaStreamCaptureModeThreadLocal));
}

inline void* capture_end(device dev, bool keep) {
  device_scope scope(dev.index);
  cudaGraph_t graph = nullptr;
  const cudaError_t st = cudaStreamEndCapture(current_stream(), &graph);
  if (!keep || st != cudaSuccess) {
    if (graph) (void)cudaGraphDestroy(graph);
    if (keep) CCGRAPH_CHECK_CUDA(st);
    (void)cudaGetLastError();
    return nullptr;
  }
  // CCGRAPH_GRAPH_SUMMARY=1: say what each recording holds (finding what a replay pays for).
  bool summary = false;
  try {
    summary = ::ccgraph::detail::env_flag("CCGRAPH_GRAPH_SUMMARY", false);  // checked at capture_begin
  } catch (...) {
  }
  if (summary) {
    try {
      std::fprintf(stderr, "ccgraph: recorded CUDA Graph on %s: %s\n", dev.str().c_str(),
                   ::ccgraph::cuda::graph::summarize(graph).c_str());
    } catch (...) {
      (void)cudaGetLastError();  // a diagnostic only
    }
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  CCGRAPH_CHECK_CUDA(inst);
  CCGRAPH_CHECK_CUDA(cudaGraphUpload(exec, current_stream()));
  return exec;
}

inline void replay(device dev, void* graph) {
  device_scope scope(dev.index);
  CCGRAPH_CHECK_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), current_stream()));
}

inline void destroy_graph(void* graph) {
  if (graph) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

inline void* stream_entry(device dev) {
  (void)dev;  // one current stream per thread, whichever device it runs on
  return static_cast<void*>(current_stream());
}

/// The device `p` points into: cudaPointerGetAttributes' device for device and managed memory,
/// cpu for host memory (pinned, or pageable and unknown to CUDA).
inline device pointer_device(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes fail on pageable host memory: it is host memory
    return device::cpu();
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return device::cuda(attr.device);
  return device::cpu();
}

/// A timing event recorded now on the calling thread's stream (a profiled executor call).
inline void* record_event(device dev) {
  device_scope scope(dev.index);
  cudaEvent_t e = nullptr;
  CCGRAPH_CHECK_CUDA(cudaEventCreate(&e));  // timing on: only profiled calls make these
  const cudaError_t st = cudaEventRecord(e, current_stream());
  if (st != cudaSuccess) (void)cudaEventDestroy(e);
  CCGRAPH_CHECK_CUDA(st);
  return static_cast<void*>(e);
}

/// Blocks until `e` has completed, under the rank's watchdog (wait_polled).
inline void wait_event(cudaEvent_t e, const char* what) {
  wait_polled([&] { return cudaEventQuery(e); }, [&] { return cudaEventSynchronize(e); }, what);
}

/// The time from event `from` to event `to` in microseconds, once both completed (they may be
/// on different streams of the device).
inline double elapsed_us(device dev, void* from, void* to) {
  device_scope scope(dev.index);
  wait_event(static_cast<cudaEvent_t>(from), "profile");
  wait_event(static_cast<cudaEvent_t>(to), "profile");
  float ms = 0;
  CCGRAPH_CHECK_CUDA(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)));
  return 1000.0 * static_cast<double>(ms);
}

inline void destroy_event(void* e) {
  if (e) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

inline const ::ccgraph::detail::device_runtime runtime_table{
    &allocate,     &deallocate,     &copy,           &synchronize,   &gemm_entry, &capture_begin,
    &capture_end,  &replay,         &destroy_graph,  &gemm_batched_entry, &stream_entry, &pointer_device,
    &record_event, &elapsed_us,     &destroy_event,  &nvtx_register, &nvtx_push,  &nvtx_pop};

/// Installs the CUDA runtime for device tensors (at static initialisation of every translation
/// unit that includes this header; idempotent).
inline const bool runtime_installed = [] {
  ::ccgraph::detail::device_runtime_slot() = &runtime_table;
  return true;
}();

}  // namespace detail

/// Blocks until all work this thread queued on its current stream has run (with the rank's
/// watchdog under run_gpus / init_from_env).
inline void synchronize() { detail::wait_stream(current_stream(), "cuda::synchronize"); }

/// Gives the memory that device tensors freed back to the driver, like
/// torch.cuda.empty_cache(): the calling rank's cached blocks return to the current device's
/// pool, the thread's stream is waited for (so that what it freed is no longer in use), and
/// the pool releases everything unused. Tensors still alive keep their memory. For making room
/// for another library's allocations; ccgraph itself never needs it.
inline void empty_cache() {
  int dev = 0;
  CCGRAPH_CHECK_CUDA(cudaGetDevice(&dev));
  if (detail::block_cache* c = detail::block_cache::active(current_stream(), dev)) c->flush();
  detail::wait_stream(current_stream(), "cuda::empty_cache");
  // The pool sees stream-ordered frees complete only through a synchronising call (measured:
  // after a cudaStreamQuery loop it trims nothing); the stream is idle now, so this one
  // returns at once.
  CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(current_stream()));
  cudaMemPool_t pool = nullptr;
  CCGRAPH_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  CCGRAPH_CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
}

/// Number of CUDA devices visible (0 when there is no GPU or no driver).
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace ccgraph::cuda
