// ccgraph/cuda/compat.hpp: the one place that knows about CUDA runtime API drift (12.x vs 13.x).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#if !defined(CUDART_VERSION) || CUDART_VERSION < 12000
#error "ccgraph needs CUDA 12.0 or newer"
#endif

/// 1 when compiling against a CUDA runtime older than 13.0, else 0. CUDA 13 added an edge-data
/// parameter to the graph topology queries (the CUDA 12.3+ `_v2` forms became the only forms).
/// Test it with `#if CCGRAPH_CUDA_PRE13`; keep every use inside this header.
#if CUDART_VERSION < 13000
#define CCGRAPH_CUDA_PRE13 1
#else
#define CCGRAPH_CUDA_PRE13 0
#endif

namespace ccgraph::cuda::detail {

/// Number of dependency edges of `graph` (cudaGraphGetEdges, either signature).
inline cudaError_t graph_num_edges(cudaGraph_t graph, std::size_t* count) noexcept {
#if CCGRAPH_CUDA_PRE13
  return cudaGraphGetEdges(graph, nullptr, nullptr, count);
#else
  return cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, count);
#endif
}

/// Number of nodes `node` depends on (cudaGraphNodeGetDependencies, either signature).
inline cudaError_t graph_node_num_dependencies(cudaGraphNode_t node, std::size_t* count) noexcept {
#if CCGRAPH_CUDA_PRE13
  return cudaGraphNodeGetDependencies(node, nullptr, count);
#else
  return cudaGraphNodeGetDependencies(node, nullptr, nullptr, count);
#endif
}

/// The capture status of `s` and, while it records, the graph nodes its next work will depend
/// on (cudaStreamGetCaptureInfo, either signature). `deps` stays valid until the next call
/// on `s`.
inline cudaError_t capture_dependencies(cudaStream_t s, cudaStreamCaptureStatus* status,
                                        const cudaGraphNode_t** deps, std::size_t* count) noexcept {
#if CCGRAPH_CUDA_PRE13 && CUDART_VERSION < 12030
  return cudaStreamGetCaptureInfo_v2(s, status, nullptr, nullptr, deps, count);
#elif CCGRAPH_CUDA_PRE13
  return cudaStreamGetCaptureInfo_v3(s, status, nullptr, nullptr, deps, nullptr, count);
#else
  return cudaStreamGetCaptureInfo(s, status, nullptr, nullptr, deps, nullptr, count);
#endif
}

/// The device stream `s` belongs to, in `*device` (cudaStreamGetDevice, CUDA 12.8 and newer).
/// Before 12.8: the current device when `s` is one of its streams, else -1 (another device,
/// found by recording an event of the current device there, which CUDA refuses).
inline cudaError_t stream_device(cudaStream_t s, int* device) noexcept {
#if CUDART_VERSION >= 12080
  return cudaStreamGetDevice(s, device);
#else
  cudaError_t st = cudaGetDevice(device);
  if (st != cudaSuccess) return st;
  cudaEvent_t e = nullptr;
  if ((st = cudaEventCreateWithFlags(&e, cudaEventDisableTiming)) != cudaSuccess) return st;
  st = cudaEventRecord(e, s);
  (void)cudaEventDestroy(e);
  if (st == cudaErrorInvalidResourceHandle) {
    (void)cudaGetLastError();
    *device = -1;
    return cudaSuccess;
  }
  return st;
#endif
}

}  // namespace ccgraph::cuda::detail
