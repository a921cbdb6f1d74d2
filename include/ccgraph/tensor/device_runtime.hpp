// ccgraph/tensor/device_runtime.hpp: what host headers need from a device backend, without
// including it. <ccgraph/cuda.hpp> installs the CUDA implementation; host-only programs never
// see a device tensor, and one that reaches here without it gets an error saying what to include.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>

namespace ccgraph {

/// The device new tensors are created on by this thread (factories, `tensor::empty`, `from`, ...):
/// cpu unless a backend that runs ranks on GPUs (`cg::cuda::run_gpus`, `init_from_env`) or a
/// `device_guard` sets it, like torch.set_default_device.
inline device& default_device() {
  thread_local device d = device::cpu();
  return d;
}

/// Sets this thread's default device for the guard's lifetime.
class device_guard {
 public:
  explicit device_guard(device d) : prev_(default_device()) { default_device() = d; }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() { default_device() = prev_; }

 private:
  device prev_;
};

namespace detail {

/// Most dimensions a device kernel indexes (strided/broadcast operands); more is an error.
inline constexpr int max_device_dims = 8;

/// Everything host code asks of a device: memory, copies, ordering, and the library kernels
/// (GEMM). All calls run on the calling thread's current stream for the device (see
/// `current_stream`), so work stays ordered exactly as the host issued it.
struct device_runtime {
  /// Stream-ordered allocation of `bytes` on `dev` (a caching pool; never synchronises).
  void* (*allocate)(device dev, std::size_t bytes);
  /// Returns memory from `allocate`; reuse is ordered after the work already queued.
  void (*deallocate)(device dev, void* p, std::size_t bytes);
  /// Copies `bytes` between any two of host and device memory. Returns after the copy is
  /// complete when the destination is host memory (so the host can read it), else enqueues it.
  void (*copy)(void* dst, device dst_dev, const void* src, device src_dev, std::size_t bytes);
  /// Blocks until all work this thread queued on `dev` has finished.
  void (*synchronize)(device dev);
  /// GEMM on row-major operands: C[m,n] = A[m,k] · B[k,n] with leading
  /// dimensions (row strides) lda, ldb, ldc and optional transposed reads (ta: A is stored as
  /// [k,m]; tb: B as [n,k]), fp32 accumulation, for f32, bf16 and f16 (and f64). Null when the
  /// backend has no GEMM.
  void (*gemm)(device dev, dtype dt, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
               std::int64_t lda, bool ta, const void* b, std::int64_t ldb, bool tb, void* c,
               std::int64_t ldc);
  /// Starts recording the calling thread's stream into a graph (CUDA Graph capture).
  void (*capture_begin)(device dev);
  /// Ends the recording; with `keep`, instantiates it and returns an owned handle for
  /// `replay` (else discards it: an error happened while recording, and returns null).
  void* (*capture_end)(device dev, bool keep);
  /// Launches a recorded graph on the calling thread's stream.
  void (*replay)(device dev, void* graph);
  /// Frees a recorded graph.
  void (*destroy_graph)(void* graph);
  /// `gemm` over `batch` matrices, the pointers advanced by stride_a / stride_b / stride_c
  /// elements per batch (0: the same matrix for every batch); one library call (cuBLASLt's
  /// strided batches). Null when the backend has none (matmul then calls `gemm` per batch).
  void (*gemm_batched)(device dev, dtype dt, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
                       std::int64_t lda, bool ta, const void* b, std::int64_t ldb, bool tb, void* c,
                       std::int64_t ldc, std::int64_t batch, std::int64_t stride_a, std::int64_t stride_b,
                       std::int64_t stride_c);
  /// The calling thread's current stream for `dev` (a cudaStream_t), where every call above and
  /// every ccgraph kernel is queued: what a user op's CUDA callable launches on (ops/user_op.hpp).
  void* (*stream)(device dev);
  /// Where `p` points: the CUDA device that owns it (device or managed memory), or cpu for host
  /// memory (pageable or pinned). For from_blob and from_dlpack checks.
  device (*pointer_device)(const void* p);
  /// Profiling (a profiled executor call): a new timing event recorded now on the calling
  /// thread's stream for `dev`; an owned handle for elapsed_us and destroy_event.
  void* (*record_event)(device dev);
  /// Microseconds from event `from` to event `to` (both from record_event or a backend's
  /// work::device_events, on `dev`), after waiting for `to` to complete.
  double (*elapsed_us)(device dev, void* from, void* to);
  /// Frees an event from record_event.
  void (*destroy_event)(void* event);
  /// NVTX: `label` registered once in ccgraph's NVTX domain, for nvtx_push; null when no tool
  /// (Nsight Systems) listens, and then ranges need not be pushed at all.
  void* (*nvtx_register)(const char* label);
  /// Opens a range in ccgraph's NVTX domain named by a handle from nvtx_register.
  void (*nvtx_push)(void* name);
  /// Closes the innermost range nvtx_push opened on this thread.
  void (*nvtx_pop)();
};

/// The installed device runtime, or null (host-only program).
inline const device_runtime*& device_runtime_slot() {
  static const device_runtime* rt = nullptr;
  return rt;
}

/// The device runtime for work on `dev`; `what` names the caller in the error when there is none.
inline const device_runtime& require_device_runtime(const char* what, device dev) {
  const device_runtime* rt = device_runtime_slot();
  CCGRAPH_CHECK(rt != nullptr, what, ": tensor on ", dev,
                " but no device backend is installed; include <ccgraph/cuda.hpp> and link "
                "ccgraph::cuda");
  return *rt;
}

/// The strided layout of an element-wise device kernel: the iteration shape and, for the output
/// (index 0) and each of N tensor operands, element strides (0 along broadcast dims). `flat`
/// means every operand is contiguous with the output's shape: a kernel then indexes by the
/// linear element index alone.
template <std::size_t N>
struct device_layout {
  int ndim = 0;
  std::int64_t numel = 0;
  bool flat = true;
  std::array<std::int64_t, max_device_dims> shape{};
  std::array<std::array<std::int64_t, max_device_dims>, N> strides{};
};

/// The CUDA kernel for one element-wise kernel tree K (see expr.hpp's make_kernel) writing T:
/// `run(k, out, layout)` launches it on the current stream. Declared here, defined only in
/// <ccgraph/cuda/pointwise.cuh> (compiled by nvcc); `has_device_pointwise` tells which.
template <class K, class T, std::size_t N>
struct device_pointwise;

/// True when the translation unit has the device kernel for K (it includes <ccgraph/cuda.hpp>
/// and is compiled by nvcc).
template <class K, class T, std::size_t N>
concept has_device_pointwise = requires { sizeof(device_pointwise<K, T, N>); };

}  // namespace detail
}  // namespace ccgraph
