// ccgraph/cuda/block_cache.hpp: a rank's host-side cache of the small device blocks freed on
// its compute stream, handed to the next allocations of the same size on that stream.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <ccgraph/cuda/current.hpp>

#include <cuda_runtime_api.h>

namespace ccgraph::cuda {

/// What a rank's block cache did so far (block_cache_stats(); for tests and benchmarks).
struct block_cache_counters {
  std::uint64_t hits = 0;        ///< allocations served from the cache
  std::uint64_t misses = 0;      ///< cacheable allocations that went to the pool
  std::size_t cached_bytes = 0;  ///< bytes held unused now
  std::size_t owned_blocks = 0;  ///< blocks it allocated that are not back in the pool
};

namespace detail {

/// Why: a cudaMallocAsync + cudaFreeAsync pair costs 1.0-2.1 us of host time even when the
/// pool serves it from memory it already holds (bench_gpu_probe), as much as launching the
/// small kernel or collective the tensor is for. Eager ops on small tensors are host-bound, so
/// each rank keeps what its stream freed and reuses it, like PyTorch's caching allocator.
///
/// Safety is the stream-ordered rule CUDA's own pools follow: a block freed on a stream may be
/// reused by later work on the same stream without synchronisation, since the stream runs the
/// old users first. So a cache serves one stream (the rank's compute stream), for the thread
/// that runs the rank (`active()`). It keeps only blocks it allocated itself (of the rounded
/// size it hands out), nothing while the stream records a CUDA Graph (allocations there must
/// become graph nodes), and nothing above `max_block` bytes, where the call's cost is small
/// next to the work on the block. A block it allocated that is freed anywhere else (another
/// thread or stream) goes to the pool and the cache forgets it (`forget_everywhere`), so an
/// address the pool hands out again is never mistaken for one of its blocks. It gives
/// everything back to the pool, in the stream's order, when destroyed (before the stream) or
/// when an allocation fails.
class block_cache {
 public:
  /// Largest block kept (bytes); larger ones go straight to the pool.
  static constexpr std::size_t max_block = std::size_t{4} << 20;
  /// Most bytes held unused; a block freed beyond it goes back to the pool.
  static constexpr std::size_t max_cached = std::size_t{256} << 20;
  /// Sizes are rounded up to this, so nearby sizes share blocks.
  static constexpr std::size_t granule = 512;

  using stats = block_cache_counters;

  /// Serves allocations on `s` (of device `device`) made by the calling thread, which becomes
  /// the cache's thread until destruction. One per thread at a time.
  block_cache(cudaStream_t s, int device) : stream_(s), device_(device), prev_(slot()) {
    slot() = this;
    std::lock_guard lk(registry_mutex());
    registry().push_back(this);
    live().fetch_add(1, std::memory_order_relaxed);
  }
  block_cache(const block_cache&) = delete;
  block_cache& operator=(const block_cache&) = delete;
  /// Gives the unused blocks back to the pool in `s`'s order; blocks still in use go back
  /// there when their tensors free them. Destroy it on its thread, before its stream.
  ~block_cache() {
    {
      std::lock_guard lk(registry_mutex());
      auto& r = registry();
      r.erase(std::remove(r.begin(), r.end(), this), r.end());
      live().fetch_sub(1, std::memory_order_relaxed);
    }
    flush();
    slot() = prev_;
  }

  /// The calling thread's cache when it serves stream `s` of `device`, else null.
  static block_cache* active(cudaStream_t s, int device) noexcept {
    block_cache* c = slot();
    return c && c->stream_ == s && c->device_ == device ? c : nullptr;
  }

  /// The size a cacheable request of `bytes` is allocated with.
  static constexpr std::size_t rounded(std::size_t bytes) noexcept {
    return bytes == 0 ? granule : (bytes + granule - 1) / granule * granule;
  }
  /// Whether a request of `bytes` may be served by a cache.
  static constexpr bool cacheable(std::size_t bytes) noexcept { return bytes <= max_block; }

  /// A cached block of `size` (a rounded() size), or null. The caller checks recording()
  /// first: nothing is handed out while the stream records.
  void* take(std::size_t size) {
    std::lock_guard lk(mu_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) {
      ++stats_.misses;
      return nullptr;
    }
    void* p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    ++stats_.hits;
    return p;
  }

  /// Records that `p` of `size` bytes was just allocated for this cache (outside a recording).
  void adopt(void* p, std::size_t size) {
    std::lock_guard lk(mu_);
    owned_[p] = size;
  }

  /// True when this cache allocated `p` (a block of `size` bytes, rounded) and keeps it for
  /// reuse; false: the caller gives it to the pool (and the cache has forgotten it).
  bool give(void* p, std::size_t size) {
    const bool rec = recording();
    std::lock_guard lk(mu_);
    auto it = owned_.find(p);
    if (it == owned_.end()) return false;
    if (it->second != size || rec || stats_.cached_bytes + size > max_cached) {
      owned_.erase(it);
      return false;  // freed by the caller (as a graph node while recording)
    }
    free_[size].push_back(p);
    stats_.cached_bytes += size;
    return true;
  }

  /// Called for a block freed outside its cache's stream or thread: whichever cache
  /// allocated `p` forgets it (the pool owns it again).
  static void forget_everywhere(void* p) {
    if (live().load(std::memory_order_relaxed) == 0) return;  // no rank, no cache: no lock
    std::lock_guard lk(registry_mutex());
    for (block_cache* c : registry()) {
      std::lock_guard clk(c->mu_);
      c->owned_.erase(p);
    }
  }

  /// Gives every unused block back to the pool (ordered after the stream's queued work), so
  /// an allocation that failed can retry with that memory.
  void flush() noexcept {
    std::lock_guard lk(mu_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) {
        (void)cudaFreeAsync(p, stream_);
        owned_.erase(p);
      }
    free_.clear();
    stats_.cached_bytes = 0;
  }

  /// Whether the stream is recording a CUDA Graph now (checked per call: users may record
  /// with their own cudaStreamBeginCapture).
  bool recording() const noexcept {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &st) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;  // unknown: do not cache
    }
    return st != cudaStreamCaptureStatusNone;
  }

  /// Counters and sizes so far.
  stats statistics() const {
    std::lock_guard lk(mu_);
    stats s = stats_;
    s.owned_blocks = owned_.size();
    return s;
  }

 private:
  static block_cache*& slot() noexcept {
    thread_local block_cache* c = nullptr;
    return c;
  }
  // Every live cache, for forget_everywhere (frees on other threads are rare; it is not on
  // the hot path).
  static std::vector<block_cache*>& registry() {
    static std::vector<block_cache*> r;
    return r;
  }
  static std::mutex& registry_mutex() {
    static std::mutex m;
    return m;
  }
  // Number of live caches. A cache is made before, and ends after, any free of its blocks
  // on its own thread; a free on another thread of a block still owned happens while its
  // cache lives, so that thread sees it counted.
  static std::atomic<int>& live() {
    static std::atomic<int> n{0};
    return n;
  }

  cudaStream_t stream_;
  int device_;
  block_cache* prev_;
  // Taken by the cache's thread (uncontended) and by forget_everywhere from other threads.
  mutable std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // rounded size -> unused blocks
  std::unordered_map<void*, std::size_t> owned_;              // every block it allocated
  stats stats_;
};

}  // namespace detail

/// The counters of the calling thread's block cache for its current stream and device (all
/// zero when it has none: outside a rank, or on another stream).
inline block_cache_counters block_cache_stats() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  const detail::block_cache* c = detail::block_cache::active(current_stream(), dev);
  return c ? c->statistics() : block_cache_counters{};
}

}  // namespace ccgraph::cuda
