// ccgraph/cuda/blas.hpp: GEMM on row-major operands through cuBLASLt (the GEMM entries of
// detail::device_runtime: single, strided-batched, and with bias / bias+GELU epilogues), and
// CCGRAPH_CHECK_CUBLAS. Plain C++: needs cuBLAS's headers and
// libraries (CUDA::cublasLt, CUDA::cublas; ccgraph::cuda links both), not nvcc.
#pragma once

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/error.hpp>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace ccgraph::cuda::detail {

/// Throws cuda_error for a failed cuBLAS / cuBLASLt call: "file:line: call failed:
/// CUBLAS_STATUS_X (text)". A failed GEMM can leave a CUDA error behind (an execution failure
/// is reported by both): it is cleared, as throw_cuda_error does, so the next check is not
/// blamed for it.
[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  (void)cudaGetLastError();
  throw ::ccgraph::cuda_error(::ccgraph::detail::concat(file, ":", line, ": ", call, " failed: ",
                                                        cublasGetStatusName(status), " (",
                                                        cublasGetStatusString(status), ")"));
}

}  // namespace ccgraph::cuda::detail

/// Evaluates a cuBLAS or cuBLASLt call once; throws ccgraph::cuda_error naming the call, the
/// place and cuBLAS's status name and text unless it returned CUBLAS_STATUS_SUCCESS.
#define CCGRAPH_CHECK_CUBLAS(call)                                                        \
  do {                                                                                    \
    const ::cublasStatus_t ccgraph_cublas_status_ = (call);                               \
    if (ccgraph_cublas_status_ != ::CUBLAS_STATUS_SUCCESS)                                \
      ::ccgraph::cuda::detail::throw_cublas_error(ccgraph_cublas_status_, #call, __FILE__, \
                                                  __LINE__);                              \
  } while (0)

namespace ccgraph::cuda::detail {

/// Workspace given to every GEMM (per handle set and stream). cuBLAS(Lt) would otherwise
/// allocate its own on first use, which breaks CUDA Graph capture; 32 MiB is what PyTorch
/// gives cuBLAS on Hopper, enough for the split-K and stream-K kernels it picks.
inline constexpr std::size_t gemm_workspace_bytes = std::size_t{32} << 20;

/// unique_ptr deleter calling a cuBLAS(Lt) destroy function; errors are dropped (a destructor
/// cannot throw, and at exit the context may already be gone).
template <class Handle, cublasStatus_t (*Destroy)(Handle)>
struct cublas_deleter {
  void operator()(Handle h) const noexcept { (void)Destroy(h); }
};

/// Owning pointer to the struct behind a cuBLAS(Lt) handle or descriptor.
template <class Handle, cublasStatus_t (*Destroy)(Handle)>
using unique_cublas = std::unique_ptr<std::remove_pointer_t<Handle>, cublas_deleter<Handle, Destroy>>;

/// Owns device memory from cudaMalloc.
struct blas_workspace_deleter {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};
using blas_workspace = std::unique_ptr<void, blas_workspace_deleter>;

/// Makes `dev` the calling thread's current device for the guard's lifetime: cuBLAS works on
/// the current device, and the caller may have another one current.
class blas_device_guard {
 public:
  explicit blas_device_guard(int dev) {
    CCGRAPH_CHECK_CUDA(cudaGetDevice(&prev_));
    if (prev_ == dev) {
      prev_ = -1;
    } else {
      CCGRAPH_CHECK_CUDA(cudaSetDevice(dev));
    }
  }
  blas_device_guard(const blas_device_guard&) = delete;
  blas_device_guard& operator=(const blas_device_guard&) = delete;
  ~blas_device_guard() {
    if (prev_ >= 0) (void)cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

/// Lets this thread make capture-unsafe calls (cudaMalloc, handle creation) for the guard's
/// lifetime, also while one of its streams is being captured into a CUDA Graph. What is made
/// under it (handles, workspaces) outlives every graph that uses it, so no captured work
/// depends on it being replayed; without the guard, the first GEMM of a thread inside a capture
/// would invalidate that capture.
class blas_relaxed_capture_guard {
 public:
  blas_relaxed_capture_guard() { CCGRAPH_CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  blas_relaxed_capture_guard(const blas_relaxed_capture_guard&) = delete;
  blas_relaxed_capture_guard& operator=(const blas_relaxed_capture_guard&) = delete;
  ~blas_relaxed_capture_guard() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

/// The cuBLAS types of one ccgraph dtype: data, scale (alpha/beta) and compute type.
struct gemm_types {
  cudaDataType_t data;
  cudaDataType_t scale;
  cublasComputeType_t compute;
};

/// The cuBLAS types for `dt`. f32 computes in plain fp32 (CUBLAS_COMPUTE_32F: no TF32, as
/// PyTorch's default allow_tf32=False); bf16 and f16 read and write their own type and
/// accumulate in fp32 with float alpha/beta. Other dtypes throw, naming gemm and the dtype.
inline gemm_types gemm_types_of(dtype dt) {
  switch (dt) {
    case dtype::f32: return {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case dtype::f64: return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case dtype::bf16: return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case dtype::f16: return {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    default: break;
  }
  CCGRAPH_THROW(::ccgraph::error, "gemm: dtype ", dt,
                " is not supported on CUDA devices (f32, f64, bf16 and f16 are)");
}

/// Largest power of two up to 256 that divides the address: what cuBLASLt's heuristic must be
/// told (it assumes 256 by default and may pick a kernel that faults on a view's offset pointer).
inline std::uint32_t pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

/// What a GEMM applies to its product before writing C: nothing, a bias vector broadcast over
/// the rows of C, the bias and then GELU, or GELU alone (cuBLASLt's GELU: the tanh
/// approximation, PyTorch's gelu(approximate="tanh")).
enum class gemm_epilogue : std::uint8_t { none, bias, gelu_bias, gelu };

/// What a cuBLASLt plan depends on: sizes, leading dims, batch count and strides, types,
/// transposes, epilogue and the operands' alignment (the pointers themselves are not part of it).
struct gemm_key {
  std::int64_t m, n, k, lda, ldb, ldc;
  dtype dt;
  bool ta, tb;
  std::uint32_t align_a, align_b, align_c;
  std::int32_t sm_target;  // 0: every SM
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  gemm_epilogue epilogue = gemm_epilogue::none;
  std::uint32_t align_bias = 0;
  friend bool operator==(const gemm_key&, const gemm_key&) = default;
};

/// Hash of a gemm_key (boost::hash_combine's mixing).
struct gemm_key_hash {
  std::size_t operator()(const gemm_key& key) const noexcept {
    std::size_t h = 0;
    auto mix = [&h](std::uint64_t v) {
      h ^= std::hash<std::uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(static_cast<std::uint64_t>(key.m));
    mix(static_cast<std::uint64_t>(key.n));
    mix(static_cast<std::uint64_t>(key.k));
    mix(static_cast<std::uint64_t>(key.lda));
    mix(static_cast<std::uint64_t>(key.ldb));
    mix(static_cast<std::uint64_t>(key.ldc));
    mix((static_cast<std::uint64_t>(key.dt) << 2) | (key.ta ? 2u : 0u) | (key.tb ? 1u : 0u));
    mix((static_cast<std::uint64_t>(key.align_a) << 40) |
        (static_cast<std::uint64_t>(key.align_b) << 20) | key.align_c);
    mix(static_cast<std::uint64_t>(key.sm_target));
    mix(static_cast<std::uint64_t>(key.batch));
    mix(static_cast<std::uint64_t>(key.stride_a));
    mix(static_cast<std::uint64_t>(key.stride_b));
    mix(static_cast<std::uint64_t>(key.stride_c));
    mix((static_cast<std::uint64_t>(key.epilogue) << 32) | key.align_bias);
    return h;
  }
};

/// A cuBLASLt matmul for one gemm_key: the operation descriptor, the three matrix layouts and
/// the algorithm the heuristic chose (none: the GEMM falls back to cublasGemmEx). In cuBLAS's
/// column-major terms the operands are swapped (see gemm): `cu_a` describes our B, `cu_b` our A.
struct gemm_plan {
  unique_cublas<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> desc;
  unique_cublas<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> cu_a, cu_b, cu_c;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
};

/// Most plans kept per handle set; past it the cache starts over (a program with ever-changing
/// shapes must not grow it without bound; rebuilding a plan costs a heuristic query, ~10 µs).
inline constexpr std::size_t gemm_plan_cache_limit = 1024;

/// One thread's cuBLAS state on one device: a cuBLASLt handle (and a cuBLAS handle, made only if
/// a fallback needs it), a workspace per stream and the plan cache. Per thread, so no call
/// locks; per stream workspaces, because two streams of one thread may run GEMMs at once
/// (eager work and a replayed graph, say) and must not share scratch memory.
class blas_context {
 public:
  /// Creates the cuBLASLt handle for device `dev`, which must be current.
  explicit blas_context(int dev) : device_(dev) {
    blas_relaxed_capture_guard relaxed;
    cublasLtHandle_t h = nullptr;
    CCGRAPH_CHECK_CUBLAS(cublasLtCreate(&h));
    lt_.reset(h);
    CCGRAPH_CHECK_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev));
  }

  /// The device this state belongs to.
  int device_index() const noexcept { return device_; }

  /// The device's multiprocessor count.
  int sm_count() const noexcept { return sm_count_; }

  /// The cuBLASLt handle.
  cublasLtHandle_t lt() const noexcept { return lt_.get(); }

  /// The cuBLAS handle, created on first use (it holds more device state than a Lt handle).
  cublasHandle_t classic() {
    if (!classic_) {
      blas_relaxed_capture_guard relaxed;
      cublasHandle_t h = nullptr;
      CCGRAPH_CHECK_CUBLAS(cublasCreate(&h));
      classic_.reset(h);
    }
    return classic_.get();
  }

  /// The gemm_workspace_bytes workspace for GEMMs queued on `s`, allocated on its first use.
  void* workspace(cudaStream_t s) {
    auto it = workspaces_.find(s);
    if (it == workspaces_.end()) {
      blas_relaxed_capture_guard relaxed;
      void* p = nullptr;
      CCGRAPH_CHECK_CUDA(cudaMalloc(&p, gemm_workspace_bytes));
      it = workspaces_.emplace(s, blas_workspace(p)).first;
    }
    return it->second.get();
  }

  /// The plan for `key`, made (descriptors plus a heuristic query) on first use.
  const gemm_plan& plan(const gemm_key& key) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    if (plans_.size() >= gemm_plan_cache_limit) plans_.clear();
    return plans_.emplace(key, make_plan(key)).first->second;
  }

 private:
  gemm_plan make_plan(const gemm_key& key) const {
    const gemm_types t = gemm_types_of(key.dt);
    gemm_plan plan;
    cublasLtMatmulDesc_t desc = nullptr;
    CCGRAPH_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, t.compute, t.scale));
    plan.desc.reset(desc);
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS's A is our B, its B our A, and
    // the row-major storage of each is already the transpose cuBLAS wants unless tb / ta.
    const cublasOperation_t op_a = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CCGRAPH_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                        sizeof(op_a)));
    CCGRAPH_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                        sizeof(op_b)));
    if (key.sm_target > 0)
      CCGRAPH_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                          &key.sm_target, sizeof(key.sm_target)));
    // Layouts describe the stored (column-major) matrices, before the op.
    auto layout = [&](std::int64_t rows, std::int64_t cols, std::int64_t ld) {
      cublasLtMatrixLayout_t l = nullptr;
      CCGRAPH_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l, t.data, static_cast<std::uint64_t>(rows),
                                                      static_cast<std::uint64_t>(cols), ld));
      return unique_cublas<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>(l);
    };
    plan.cu_a = key.tb ? layout(key.k, key.n, key.ldb) : layout(key.n, key.k, key.ldb);
    plan.cu_b = key.ta ? layout(key.m, key.k, key.lda) : layout(key.k, key.m, key.lda);
    plan.cu_c = layout(key.n, key.m, key.ldc);
    if (key.batch > 1) {  // strided batches (a stride of 0 broadcasts that operand)
      const std::int32_t count = static_cast<std::int32_t>(key.batch);
      auto batched = [&](cublasLtMatrixLayout_t l, std::int64_t stride) {
        CCGRAPH_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                              sizeof(count)));
        CCGRAPH_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                              sizeof(stride)));
      };
      batched(plan.cu_a.get(), key.stride_b);
      batched(plan.cu_b.get(), key.stride_a);
      batched(plan.cu_c.get(), key.stride_c);
    }
    if (key.epilogue != gemm_epilogue::none) {
      // In cuBLAS's column-major view C is [n, m]: the bias runs along its rows, n long.
      const cublasLtEpilogue_t epi = key.epilogue == gemm_epilogue::bias        ? CUBLASLT_EPILOGUE_BIAS
                                     : key.epilogue == gemm_epilogue::gelu_bias ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                                                : CUBLASLT_EPILOGUE_GELU;
      CCGRAPH_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      if (key.epilogue != gemm_epilogue::gelu) {
        // The heuristic reads only the bias pointer's alignment: a stand-in with the real one's
        // (each call sets the real pointer).
        const void* stand_in = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(key.align_bias));
        CCGRAPH_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &stand_in,
                                                            sizeof(stand_in)));
      }
    }

    cublasLtMatmulPreference_t pref_raw = nullptr;
    CCGRAPH_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref_raw));
    const unique_cublas<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> pref(pref_raw);
    const std::uint64_t workspace = gemm_workspace_bytes;
    CCGRAPH_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    const std::uint32_t align_cu_a = key.align_b, align_cu_b = key.align_a, align_c = key.align_c;
    CCGRAPH_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_cu_a, sizeof(align_cu_a)));
    CCGRAPH_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_cu_b, sizeof(align_cu_b)));
    CCGRAPH_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
    CCGRAPH_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        lt(), desc, plan.cu_a.get(), plan.cu_b.get(), plan.cu_c.get(), plan.cu_c.get(), pref_raw,
        1, &result, &found);
    if (status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      plan.algo = result.algo;
      plan.has_algo = true;
    } else if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
      throw_cublas_error(status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    }
    return plan;
  }

  int device_;
  int sm_count_ = 0;
  // Destroyed bottom-up: plans, then workspaces (cudaFree waits for the GEMMs using them), then
  // the handles.
  unique_cublas<cublasLtHandle_t, cublasLtDestroy> lt_;
  unique_cublas<cublasHandle_t, cublasDestroy> classic_;
  std::unordered_map<cudaStream_t, blas_workspace> workspaces_;
  std::unordered_map<gemm_key, gemm_plan, gemm_key_hash> plans_;
};

/// The calling thread's cuBLAS state for device `dev` (which must be current), created on first use
/// and destroyed when the thread exits.
inline blas_context& blas_context_for(int dev) {
  thread_local std::vector<std::unique_ptr<blas_context>> contexts;
  const auto i = static_cast<std::size_t>(dev);
  if (contexts.size() <= i) contexts.resize(i + 1);
  if (!contexts[i]) contexts[i] = std::make_unique<blas_context>(dev);
  return *contexts[i];
}

/// SMs that GEMMs issued by the calling thread leave free for other kernels (0: none). The
/// nccl backend sets it while a collective it launched may still be running, so that the
/// collective's kernels find SMs beside a GEMM that would otherwise fill the device (cuBLASLt's
/// SM-count target); see nccl_options::gemm_sm_carveout.
inline int& gemm_sm_carveout() noexcept {
  thread_local int sms = 0;
  return sms;
}

/// Which cuBLAS entry point a GEMM uses: cuBLASLt with its heuristic's algorithm (falling back
/// to cublasGemmEx when it offers none), or either one alone (tests compare them).
enum class gemm_backend { automatic, lt, gemm_ex };

/// One GEMM call, row-major: C[m,n] = A[m,k] · B[k,n] (+ epilogue), `batch` times with the
/// pointers advanced by stride_a / stride_b / stride_c elements each time (0: the same matrix
/// for every batch, a broadcast). A has row stride lda (ta: stored transposed, as [k,m]), B
/// likewise (tb: stored as [n,k]), C has row stride ldc. `bias`: n elements of dt added to every
/// row of C (every batch) by the bias epilogues.
struct gemm_call {
  device dev;
  dtype dt = dtype::f32;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  bool ta = false;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  bool tb = false;
  void* c = nullptr;
  std::int64_t ldc = 0;
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  gemm_epilogue epilogue = gemm_epilogue::none;
  const void* bias = nullptr;
};

/// Runs `call` through a chosen backend: the one implementation behind gemm(). Returns false,
/// having queued nothing, only when an epilogue was asked and cuBLASLt offers no algorithm for
/// it (f64, say; the caller then adds the bias itself); every other failure throws.
inline bool gemm_run(gemm_backend backend, const gemm_call& g) {
  // Argument checks first, before any CUDA call: they read like the call and need no GPU.
  const gemm_types t = gemm_types_of(g.dt);
  const std::int64_t m = g.m, n = g.n, k = g.k, lda = g.lda, ldb = g.ldb, ldc = g.ldc;
  const bool ta = g.ta, tb = g.tb;
  CCGRAPH_CHECK(g.dev.is_cuda(), "gemm: operands on ", g.dev, ", not a CUDA device");
  CCGRAPH_CHECK(m >= 0 && n >= 0 && k >= 0 && g.batch >= 0, "gemm: negative size (m=", m, ", n=", n, ", k=", k,
                ", batch=", g.batch, ")");
  CCGRAPH_CHECK(g.batch < (std::int64_t{1} << 31), "gemm: batch count ", g.batch, " exceeds 2^31 - 1");
  const bool has_bias = g.epilogue == gemm_epilogue::bias || g.epilogue == gemm_epilogue::gelu_bias;
  CCGRAPH_CHECK(!has_bias || g.bias != nullptr, "gemm: a bias epilogue without a bias");
  if (m == 0 || n == 0 || g.batch == 0) return true;
  if (k > 0) {
    CCGRAPH_CHECK(lda >= (ta ? m : k), "gemm: lda ", lda, " is less than the row length ",
                  ta ? m : k, " of A stored as ", ta ? "[k,m]" : "[m,k]", " (m=", m, ", k=", k,
                  ")");
    CCGRAPH_CHECK(ldb >= (tb ? k : n), "gemm: ldb ", ldb, " is less than the row length ",
                  tb ? k : n, " of B stored as ", tb ? "[n,k]" : "[k,n]", " (k=", k, ", n=", n,
                  ")");
  }
  CCGRAPH_CHECK(ldc >= n, "gemm: ldc ", ldc, " is less than the row length ", n, " of C [m,n]");

  const blas_device_guard on_device(g.dev.index);
  const cudaStream_t stream = ::ccgraph::cuda::current_stream();
  if (k == 0 && g.epilogue == gemm_epilogue::none) {
    // An empty sum: C = 0. Done here because cuBLASLt may reject k = 0.
    const std::size_t es = element_size(g.dt);
    for (std::int64_t i = 0; i < g.batch; ++i)
      CCGRAPH_CHECK_CUDA(cudaMemset2DAsync(static_cast<char*>(g.c) + static_cast<std::size_t>(i * g.stride_c) * es,
                                           static_cast<std::size_t>(ldc) * es, 0, static_cast<std::size_t>(n) * es,
                                           static_cast<std::size_t>(m), stream));
    return true;
  }
  if (k == 0) return false;  // an epilogue of an empty sum: the caller's fallback writes it

  blas_context& ctx = blas_context_for(g.dev.index);
  void* workspace = ctx.workspace(stream);
  const float one_f = 1.f, zero_f = 0.f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = t.scale == CUDA_R_64F;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
  const void* beta = f64 ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f);
  const std::int64_t batch = g.batch;
  // One batch entry needs no batch attributes (and its strides do not matter).
  const std::int64_t sa = batch > 1 ? g.stride_a : 0, sb = batch > 1 ? g.stride_b : 0, sc = batch > 1 ? g.stride_c : 0;

  if (backend != gemm_backend::gemm_ex) {
    const int carveout = gemm_sm_carveout();
    const std::int32_t sm_target = carveout > 0 && carveout < ctx.sm_count() ? ctx.sm_count() - carveout : 0;
    const gemm_key key{m,
                       n,
                       k,
                       lda,
                       ldb,
                       ldc,
                       g.dt,
                       ta,
                       tb,
                       pointer_alignment(g.a),
                       pointer_alignment(g.b),
                       pointer_alignment(g.c),
                       sm_target,
                       batch,
                       sa,
                       sb,
                       sc,
                       g.epilogue,
                       has_bias ? pointer_alignment(g.bias) : 0u};
    const gemm_plan& plan = ctx.plan(key);
    if (plan.has_algo) {
      if (has_bias)
        CCGRAPH_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                            &g.bias, sizeof(g.bias)));
      CCGRAPH_CHECK_CUBLAS(cublasLtMatmul(ctx.lt(), plan.desc.get(), alpha, g.b, plan.cu_a.get(), g.a,
                                          plan.cu_b.get(), beta, g.c, plan.cu_c.get(), g.c,
                                          plan.cu_c.get(), &plan.algo, workspace,
                                          gemm_workspace_bytes, stream));
      return true;
    }
    if (g.epilogue != gemm_epilogue::none) return false;
    CCGRAPH_CHECK(backend == gemm_backend::automatic, "gemm: cuBLASLt has no algorithm for ", g.dt,
                  " m=", m, " n=", n, " k=", k, " lda=", lda, " ldb=", ldb, " ldc=", ldc,
                  " ta=", ta, " tb=", tb, " batch=", batch);
  }
  if (g.epilogue != gemm_epilogue::none) return false;

  // cublasGemmEx: the same column-major swap. cublasSetStream resets the handle's workspace to
  // cuBLAS's own pool, so the workspace is set again after it, every call.
  const cublasHandle_t h = ctx.classic();
  CCGRAPH_CHECK_CUBLAS(cublasSetStream(h, stream));
  CCGRAPH_CHECK_CUBLAS(cublasSetWorkspace(h, workspace, gemm_workspace_bytes));
  if (batch == 1) {
    CCGRAPH_CHECK_CUBLAS(cublasGemmEx_64(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         n, m, k, alpha, g.b, t.data, ldb, g.a, t.data, lda, beta, g.c,
                                         t.data, ldc, t.compute, CUBLAS_GEMM_DEFAULT));
  } else {
    CCGRAPH_CHECK_CUBLAS(cublasGemmStridedBatchedEx_64(
        h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, alpha, g.b, t.data, ldb, sb, g.a,
        t.data, lda, sa, beta, g.c, t.data, ldc, sc, batch, t.compute, CUBLAS_GEMM_DEFAULT));
  }
  return true;
}

/// gemm() through a chosen backend (tests compare them).
inline void gemm_with(gemm_backend backend, device dev, dtype dt, std::int64_t m, std::int64_t n,
                      std::int64_t k, const void* a, std::int64_t lda, bool ta, const void* b,
                      std::int64_t ldb, bool tb, void* c, std::int64_t ldc) {
  gemm_call g;
  g.dev = dev;
  g.dt = dt;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.lda = lda, g.ta = ta;
  g.b = b, g.ldb = ldb, g.tb = tb;
  g.c = c, g.ldc = ldc;
  (void)gemm_run(backend, g);
}

/// Row-major GEMM on the current stream of the calling thread: C[m,n] = A[m,k] · B[k,n], where A
/// has row stride lda (ta: A is stored transposed, as [k,m] with row stride lda), B likewise
/// (tb: stored as [n,k]), and C has row stride ldc. f32 computes in full fp32 (no TF32); bf16
/// and f16 accumulate in fp32; f64 in fp64; other dtypes throw ccgraph::error. Asynchronous
/// like a kernel launch, and capturable into a CUDA Graph (fixed workspace, no allocation after
/// a thread's first GEMM on a stream). Pointers may be any element-aligned views.
/// This is the `gemm` entry of ccgraph::detail::device_runtime.
inline void gemm(device dev, dtype dt, std::int64_t m, std::int64_t n, std::int64_t k,
                 const void* a, std::int64_t lda, bool ta, const void* b, std::int64_t ldb,
                 bool tb, void* c, std::int64_t ldc) {
  gemm_with(gemm_backend::automatic, dev, dt, m, n, k, a, lda, ta, b, ldb, tb, c, ldc);
}

/// gemm() over `batch` matrices at element strides stride_a / stride_b / stride_c (0
/// broadcasts an operand): one cuBLASLt strided-batched call (cublasGemmStridedBatchedEx when
/// cuBLASLt has no algorithm). The `gemm_batched` entry of ccgraph::detail::device_runtime.
inline void gemm_batched(device dev, dtype dt, std::int64_t m, std::int64_t n, std::int64_t k,
                         const void* a, std::int64_t lda, bool ta, const void* b, std::int64_t ldb,
                         bool tb, void* c, std::int64_t ldc, std::int64_t batch, std::int64_t stride_a,
                         std::int64_t stride_b, std::int64_t stride_c) {
  gemm_call g;
  g.dev = dev;
  g.dt = dt;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.lda = lda, g.ta = ta;
  g.b = b, g.ldb = ldb, g.tb = tb;
  g.c = c, g.ldc = ldc;
  g.batch = batch, g.stride_a = stride_a, g.stride_b = stride_b, g.stride_c = stride_c;
  (void)gemm_run(gemm_backend::automatic, g);
}

}  // namespace ccgraph::cuda::detail
