// ccgraph/cuda/stream_memops.hpp: 32-bit flag writes and waits queued on a stream and run by
// the GPU's front end (CUDA's stream memory operations), not by a kernel. They take no SM, so a
// wait queued beside a GEMM that fills every SM does not queue behind it, and a CUDA Graph
// records them like any other stream work. They are driver-API calls, reached through the
// runtime's entry-point query so that nothing links libcuda.
#pragma once

#include <cstdint>

#include <ccgraph/core/error.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace ccgraph::cuda::detail {

/// The driver's cuStreamWaitValue32 / cuStreamWriteValue32, or nulls where the driver lacks
/// them (then `available()` is false).
class stream_memops {
 public:
  using fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

  /// The process's entry points, looked up once.
  static const stream_memops& get() {
    static const stream_memops m;
    return m;
  }

  /// Both entry points were found.
  bool available() const { return wait_ && write_; }

  /// Queues on `s` a wait until the 32-bit word at `addr` (device or peer memory) equals `v`.
  void wait_eq(cudaStream_t s, const std::uint32_t* addr, std::uint32_t v, const char* what) const {
    check(wait_(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), v, CU_STREAM_WAIT_VALUE_EQ),
          "cuStreamWaitValue32", what);
  }

  /// Queues on `s` a write of `v` to the 32-bit word at `addr`, ordered after the stream's
  /// earlier work and its memory writes.
  void write(cudaStream_t s, std::uint32_t* addr, std::uint32_t v, const char* what) const {
    check(write_(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), v, CU_STREAM_WRITE_VALUE_DEFAULT),
          "cuStreamWriteValue32", what);
  }

 private:
  stream_memops() {
    wait_ = lookup("cuStreamWaitValue32");
    write_ = lookup("cuStreamWriteValue32");
  }

  static fn lookup(const char* name) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    // 12000: the 64-bit-address (_v2) forms of CUDA 12 and later.
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<fn>(p);
  }

  static void check(CUresult r, const char* call, const char* what) {
    if (r != CUDA_SUCCESS)
      CCGRAPH_THROW(::ccgraph::cuda_error, what, ": ", call, " failed: CUresult ", static_cast<int>(r));
  }

  fn wait_ = nullptr;
  fn write_ = nullptr;
};

}  // namespace ccgraph::cuda::detail
