// ccgraph/cuda/graph.hpp: move-only owners of cudaGraph_t and cudaGraphExec_t, and stream
// capture helpers.
#pragma once

#include <ccgraph/cuda/compat.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/stream.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ccgraph::cuda {

/// A CUDA graph (the recorded work, not yet executable). Move-only; may be empty.
class graph {
 public:
  /// An empty owner (no graph); capture() or end_capture() produce real ones.
  graph() noexcept = default;

  /// Takes ownership of `g`.
  explicit graph(cudaGraph_t g) noexcept : handle_(g) {}

  /// A new graph with no nodes, for building by hand.
  [[nodiscard]] static graph create() {
    cudaGraph_t g = nullptr;
    CCGRAPH_CHECK_CUDA(cudaGraphCreate(&g, 0));
    return graph(g);
  }

  [[nodiscard]] cudaGraph_t get() const noexcept { return handle_.get(); }
  [[nodiscard]] cudaGraph_t release() noexcept { return handle_.release(); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  /// Number of nodes (kernels, copies, NCCL kernels, event records...).
  [[nodiscard]] std::size_t num_nodes() const {
    std::size_t n = 0;
    CCGRAPH_CHECK_CUDA(cudaGraphGetNodes(get(), nullptr, &n));
    return n;
  }

  /// Number of dependency edges.
  [[nodiscard]] std::size_t num_edges() const {
    std::size_t n = 0;
    CCGRAPH_CHECK_CUDA(detail::graph_num_edges(get(), &n));
    return n;
  }

  /// "64 nodes (64 kernel, 1 memcpy), 64 edges": what capture recorded, by node kind.
  [[nodiscard]] std::string summary() const { return summarize(get()); }

  /// summary() of a graph this object does not own.
  [[nodiscard]] static std::string summarize(cudaGraph_t g) {
    std::size_t n = 0, edges = 0;
    CCGRAPH_CHECK_CUDA(cudaGraphGetNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    if (n) CCGRAPH_CHECK_CUDA(cudaGraphGetNodes(g, nodes.data(), &n));
    CCGRAPH_CHECK_CUDA(detail::graph_num_edges(g, &edges));
    std::map<std::string, std::size_t> kinds;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType t{};
      CCGRAPH_CHECK_CUDA(cudaGraphNodeGetType(node, &t));
      switch (t) {
        case cudaGraphNodeTypeKernel: ++kinds["kernel"]; break;
        case cudaGraphNodeTypeMemcpy: ++kinds["memcpy"]; break;
        case cudaGraphNodeTypeMemset: ++kinds["memset"]; break;
        case cudaGraphNodeTypeHost: ++kinds["host"]; break;
        case cudaGraphNodeTypeGraph: ++kinds["child graph"]; break;
        case cudaGraphNodeTypeEmpty: ++kinds["empty"]; break;
        case cudaGraphNodeTypeWaitEvent: ++kinds["event wait"]; break;
        case cudaGraphNodeTypeEventRecord: ++kinds["event record"]; break;
        case cudaGraphNodeTypeMemAlloc: ++kinds["mem alloc"]; break;
        case cudaGraphNodeTypeMemFree: ++kinds["mem free"]; break;
        default: ++kinds["other"]; break;
      }
    }
    std::string out = std::to_string(n) + " nodes (";
    bool first = true;
    for (auto& [k, c] : kinds) {
      out += (first ? "" : ", ") + std::to_string(c) + " " + k;
      first = false;
    }
    return out + "), " + std::to_string(edges) + " edges";
  }

  /// Writes the graph as Graphviz DOT to `path` (debugging: shows what capture recorded).
  void write_dot(const std::string& path, unsigned flags = cudaGraphDebugDotFlagsVerbose) const {
    CCGRAPH_CHECK_CUDA(cudaGraphDebugDotPrint(get(), path.c_str(), flags));
  }

 private:
  detail::unique_handle<cudaGraph_t, cudaGraphDestroy> handle_;
};

/// An instantiated, launchable graph. Move-only; may be empty.
class graph_exec {
 public:
  graph_exec() noexcept = default;

  /// Takes ownership of `e`.
  explicit graph_exec(cudaGraphExec_t e) noexcept : handle_(e) {}

  /// Instantiates `g` (the expensive step; replay with launch() is cheap).
  explicit graph_exec(const graph& g, unsigned long long flags = 0) {
    cudaGraphExec_t e = nullptr;
    CCGRAPH_CHECK_CUDA(cudaGraphInstantiate(&e, g.get(), flags));
    handle_.reset(e);
  }

  [[nodiscard]] cudaGraphExec_t get() const noexcept { return handle_.get(); }
  [[nodiscard]] cudaGraphExec_t release() noexcept { return handle_.release(); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  /// Uploads the graph's resources to the device ahead of time, so the first launch() is as
  /// fast as the later ones.
  void upload(cudaStream_t s) const { CCGRAPH_CHECK_CUDA(cudaGraphUpload(get(), s)); }
  void upload(const stream& s) const { upload(s.get()); }

  /// Queues one replay of the whole graph on `s`.
  void launch(cudaStream_t s) const { CCGRAPH_CHECK_CUDA(cudaGraphLaunch(get(), s)); }
  void launch(const stream& s) const { launch(s.get()); }

  /// Updates the parameters (pointers, sizes, launch arguments) from `g` in place when the
  /// topology is unchanged, which is much cheaper than a new instantiation. Returns false when
  /// CUDA refuses the update; the caller then instantiates a new graph_exec.
  [[nodiscard]] bool update(const graph& g) {
    cudaGraphExecUpdateResultInfo info{};
    const cudaError_t status = cudaGraphExecUpdate(get(), g.get(), &info);
    if (status == cudaErrorGraphExecUpdateFailure) {
      (void)cudaGetLastError();  // an expected outcome, not an error for the next check
      return false;
    }
    CCGRAPH_CHECK_CUDA(status);
    return true;
  }

 private:
  detail::unique_handle<cudaGraphExec_t, cudaGraphExecDestroy> handle_;
};

/// True while `s` is being captured into a graph.
[[nodiscard]] inline bool is_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CCGRAPH_CHECK_CUDA(cudaStreamIsCapturing(s, &status));
  return status == cudaStreamCaptureStatusActive;
}

/// Starts recording the work queued on `s` (and on streams that join it through events) into a
/// graph instead of running it. Thread-local mode by default: with one thread per GPU, another
/// thread's unrelated unsafe call (cudaMalloc, say) must not invalidate this capture.
inline void begin_capture(cudaStream_t s,
                          cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
  CCGRAPH_CHECK_CUDA(cudaStreamBeginCapture(s, mode));
}

/// Ends the capture started by begin_capture() on `s` and returns the recorded graph.
[[nodiscard]] inline graph end_capture(cudaStream_t s) {
  cudaGraph_t g = nullptr;
  CCGRAPH_CHECK_CUDA(cudaStreamEndCapture(s, &g));
  return graph(g);
}

/// Captures what `fn()` queues on `s` into a graph. If `fn` throws, the capture is ended and its
/// partial graph discarded before the exception propagates, so `s` is usable again.
template <class Fn>
[[nodiscard]] graph capture(cudaStream_t s, Fn&& fn,
                            cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
  begin_capture(s, mode);
  try {
    std::forward<Fn>(fn)();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(s, &partial) == cudaSuccess && partial != nullptr)
      (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();
    throw;
  }
  return end_capture(s);
}

/// capture() on a ccgraph::cuda::stream.
template <class Fn>
[[nodiscard]] graph capture(const stream& s, Fn&& fn,
                            cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
  return capture(s.get(), std::forward<Fn>(fn), mode);
}

}  // namespace ccgraph::cuda
