// ccgraph/cuda/error.hpp: CCGRAPH_CHECK_CUDA / CCGRAPH_CHECK_NCCL, which turn CUDA and NCCL
// status codes into ccgraph::cuda_error / ccgraph::nccl_error exceptions.
#pragma once

#include <ccgraph/core/error.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace ccgraph::cuda::detail {

/// Throws cuda_error for a failed CUDA call: "file:line: call failed: cudaErrorX (text)".
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                          int line) {
  // Reset the thread's last-error slot so the next, unrelated check does not report this failure
  // again. (Truly sticky errors, such as an illegal address, persist until the context is reset.)
  (void)cudaGetLastError();
  throw ::ccgraph::cuda_error(::ccgraph::detail::concat(
      file, ":", line, ": ", call, " failed: ", cudaGetErrorName(status), " (",
      cudaGetErrorString(status), ")"));
}

/// Throws nccl_error for a failed NCCL call, with NCCL's last error message when it has one
/// (it names the actual cause, e.g. which peer or which argument).
[[noreturn]] inline void throw_nccl_error(ncclResult_t status, const char* call, const char* file,
                                          int line) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* last = ncclGetLastError(nullptr);
#else
  const char* last = nullptr;
#endif
  throw ::ccgraph::nccl_error(::ccgraph::detail::concat(
      file, ":", line, ": ", call, " failed: ", ncclGetErrorString(status),
      (last != nullptr && *last != '\0') ? " - " : "", (last != nullptr) ? last : ""));
}

}  // namespace ccgraph::cuda::detail

/// Evaluates a CUDA runtime call once; throws ccgraph::cuda_error naming the call, the place
/// and CUDA's error name and text unless it returned cudaSuccess.
#define CCGRAPH_CHECK_CUDA(call)                                                        \
  do {                                                                                  \
    const ::cudaError_t ccgraph_cuda_status_ = (call);                                  \
    if (ccgraph_cuda_status_ != ::cudaSuccess)                                          \
      ::ccgraph::cuda::detail::throw_cuda_error(ccgraph_cuda_status_, #call, __FILE__,  \
                                                __LINE__);                              \
  } while (0)

/// Evaluates an NCCL call once; throws ccgraph::nccl_error naming the call, the place and
/// NCCL's error text unless it returned ncclSuccess (ncclInProgress is an error here too: the
/// RAII layer uses blocking communicators).
#define CCGRAPH_CHECK_NCCL(call)                                                        \
  do {                                                                                  \
    const ::ncclResult_t ccgraph_nccl_status_ = (call);                                 \
    if (ccgraph_nccl_status_ != ::ncclSuccess)                                          \
      ::ccgraph::cuda::detail::throw_nccl_error(ccgraph_nccl_status_, #call, __FILE__,  \
                                                __LINE__);                              \
  } while (0)
