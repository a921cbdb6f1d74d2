// ccgraph/cuda/attention.cuh: scaled dot-product attention on CUDA devices, forward and
// backward, with the semantics of ccgraph/ops/attention.hpp (its CPU kernels are the reference).
//
// Forward, two kernels:
//  - fused (flash-attention 2 style) for bf16/f16 with head dims E = Ev = 64 or 128: a block of
//    4 warps takes 32 query rows per warp (16 when that leaves SMs idle), and streams 64-key
//    tiles of K and V through shared memory (cp.async, the next tile loading while the current
//    one is used); each K/V fragment read from shared memory serves both 16-row tiles, which
//    halves the shared-memory traffic that bounds 16 rows per warp. Q Kᵀ and P V run on the
//    tensor cores (mma.sync m16n8k16, float accumulation) with an online softmax in float
//    between them (scores in the log2 domain, exp2). Causal blocks stop at the diagonal and run
//    longest first; tiles with no masked score run a copy of the loop without the masking.
//    Any strides with a unit last dim and 16-byte aligned rows; otherwise the inputs are
//    copied first.
//  - SIMT for everything else (f32, f64, other head dims up to 256; masks of any broadcast):
//    one warp per query row, a lane per key of a 32-key tile staged in shared memory, the same
//    online softmax in float (double for f64).
// Backward, recomputing the probabilities from the forward's lse (no [L, S] matrix is ever
// stored), deterministic (no atomics: dQ and dK/dV are separate kernels):
//  - tensor-core kernels for bf16/f16 with E = Ev = 64 or 128: delta = rowsum(dO ∘ O) per row;
//    dK/dV per 64 keys, a pair of warps per 32 keys: per 64-query step each warp computes Sᵀ =
//    K Qᵀ and dPᵀ = V dOᵀ for its pair's keys and half the queries, Pᵀ and dSᵀ go through
//    shared memory, and each warp accumulates dV += Pᵀ dO and dK += dSᵀ Q for its pair's keys
//    and half the head dim; dQ per 128 queries (64 when that leaves SMs idle; S, dP
//    recomputed, dQ += dS K). dS and P are rounded to T before their products, as
//    flash attention does.
//  - SIMT kernels for everything else: the same two passes, a warp per row, a lane per column
//    of a 32-wide tile.
//
// Compile with nvcc: <ccgraph/cuda.hpp> includes this header only under nvcc.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/attention.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/element.cuh>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/pointwise.cuh>  // contiguous copies of strided device inputs
#include <ccgraph/cuda/runtime.hpp>
#include <ccgraph/ops/attention.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

namespace ccgraph::cuda::detail {

// CUDA's min(int, int) for the kernels below: ccgraph::min (the reduction) would hide it.
using ::min;

/// The additive score term of a mask element (MaskKind 1: bool, 2: additive in T).
template <int MaskKind, class A, class M>
__device__ __forceinline__ A attn_mask_term(const M* p) {
  if constexpr (MaskKind == 1)
    return *reinterpret_cast<const bool*>(p) ? A(0) : -std::numeric_limits<A>::infinity();
  else
    return device_load<A>(p);
}

// ---- kernel arguments ------------------------------------------------------------------------

/// One operand: its base pointer (at this launch's outer batch index) and element strides over
/// the two inner batch dims (b, h) and the rows; the last dim has stride 1 (c: the mask's).
struct attn_operand {
  void* p = nullptr;
  long long sb = 0, sh = 0, sr = 0, sc = 1;
};

/// Everything a forward or backward launch reads: operands (unused ones null), sizes, scale.
struct attn_args {
  attn_operand q, k, v, o, lse, mask, dout, dq, dk, dv, delta;
  int H = 1;                   ///< size of the inner batch dim h; a launch covers B * H heads
  int BH = 1;                  ///< B * H
  int L = 0, S = 0, E = 0, Ev = 0;
  double scale = 1.0;
};

template <class T>
__device__ __forceinline__ T* attn_ptr(const attn_operand& x, int b, int h) {
  return static_cast<T*>(x.p) + static_cast<long long>(b) * x.sb + static_cast<long long>(h) * x.sh;
}

template <class A>
__device__ __forceinline__ A attn_warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

template <class A>
__device__ __forceinline__ A attn_warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class A>
__device__ __forceinline__ A attn_exp(A x) {
  if constexpr (std::is_same_v<A, double>)
    return ::exp(x);
  else
    return ::expf(x);
}

template <class A>
__device__ __forceinline__ A attn_log(A x) {
  if constexpr (std::is_same_v<A, double>)
    return ::log(x);
  else
    return ::logf(x);
}

/// Largest head dim (E and Ev) of the SIMT kernels: each lane keeps up to 8 columns of a row.
inline constexpr int attn_simt_max_dim = 256;
/// Query (or key) rows per warp and warps per block of the SIMT kernels.
inline constexpr int attn_simt_rows = 4;
inline constexpr int attn_simt_warps = 4;
/// Keys (or queries) per shared-memory tile of the SIMT kernels: one per lane.
inline constexpr int attn_simt_tile = 32;

// ---- SIMT forward ------------------------------------------------------------------------------

/// Shared memory of the SIMT forward: K tile [32][E+1] (padded: lanes read different rows), V
/// tile [32][Ev], the block's query rows [16][E].
template <class A>
constexpr std::size_t attn_fwd_simt_smem(int E, int Ev) {
  return sizeof(A) * (static_cast<std::size_t>(attn_simt_tile) * (E + 1) + static_cast<std::size_t>(attn_simt_tile) * Ev +
                      static_cast<std::size_t>(attn_simt_rows * attn_simt_warps) * E);
}

template <class T, class A, class M, int MaskKind, bool Causal>
__global__ void __launch_bounds__(32 * attn_simt_warps) attn_fwd_simt_kernel(const attn_args a) {
  constexpr int rows = attn_simt_rows * attn_simt_warps, tile = attn_simt_tile, per_lane = attn_simt_max_dim / 32;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  A* sk = reinterpret_cast<A*>(attn_smem);
  A* sv = sk + tile * (a.E + 1);
  A* sq = sv + tile * a.Ev;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int num_m = (a.L + rows - 1) / rows;
  const int bh = static_cast<int>(blockIdx.x) / num_m, mb = static_cast<int>(blockIdx.x) % num_m;
  const int b = bh / a.H, h = bh % a.H;
  const int m0 = mb * rows;
  const T* q = attn_ptr<const T>(a.q, b, h);
  const T* k = attn_ptr<const T>(a.k, b, h);
  const T* v = attn_ptr<const T>(a.v, b, h);
  const M* mask = MaskKind ? attn_ptr<const M>(a.mask, b, h) : nullptr;
  const A scale = static_cast<A>(a.scale);
  const A ninf = -std::numeric_limits<A>::infinity();

  for (int i = tid; i < rows * a.E; i += blockDim.x) {
    const int r = i / a.E, e = i % a.E, row = m0 + r;
    sq[i] = row < a.L ? device_load<A>(q + row * a.q.sr + e) : A(0);
  }
  A m[attn_simt_rows], l[attn_simt_rows], o[attn_simt_rows][per_lane];
#pragma unroll
  for (int rr = 0; rr < attn_simt_rows; ++rr) {
    m[rr] = ninf;
    l[rr] = 0;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) o[rr][i] = 0;
  }
  const int n_end = Causal ? min(a.S, m0 + rows) : a.S;
  for (int n0 = 0; n0 < n_end; n0 += tile) {
    __syncthreads();  // the previous tile is no longer read
    for (int i = tid; i < tile * a.E; i += blockDim.x) {
      const int j = i / a.E, e = i % a.E, key = n0 + j;
      sk[j * (a.E + 1) + e] = key < a.S ? device_load<A>(k + key * a.k.sr + e) : A(0);
    }
    for (int i = tid; i < tile * a.Ev; i += blockDim.x) {
      const int j = i / a.Ev, d = i % a.Ev, key = n0 + j;
      sv[i] = key < a.S ? device_load<A>(v + key * a.v.sr + d) : A(0);
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < attn_simt_rows; ++rr) {
      const int r = warp * attn_simt_rows + rr, row = m0 + r;
      if (row >= a.L) break;  // uniform across the warp
      const int key = n0 + lane;
      A x = ninf;
      if (key < a.S && (!Causal || key <= row)) {
        A dot = 0;
        const A* qr = sq + r * a.E;
        const A* kr = sk + lane * (a.E + 1);
        for (int e = 0; e < a.E; ++e) dot += qr[e] * kr[e];
        x = dot * scale;
        if constexpr (MaskKind != 0) x += attn_mask_term<MaskKind, A>(mask + row * a.mask.sr + key * a.mask.sc);
      }
      const A tile_max = attn_warp_max(x);
      const A m_new = tile_max > m[rr] ? tile_max : m[rr];
      const A base = m_new == ninf ? A(0) : m_new;  // a row masked so far: exp(-inf - 0) = 0
      const A alpha = attn_exp(m[rr] - base);
      const A p = attn_exp(x - base);
      l[rr] = l[rr] * alpha + attn_warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int i = 0; i < per_lane; ++i) o[rr][i] *= alpha;
      for (int j = 0; j < tile; ++j) {
        const A pj = __shfl_sync(0xffffffffu, p, j);
        const A* vr = sv + j * a.Ev;
#pragma unroll
        for (int i = 0; i < per_lane; ++i) {
          const int d = lane + 32 * i;
          if (d < a.Ev) o[rr][i] += pj * vr[d];
        }
      }
    }
  }
  T* out = attn_ptr<T>(a.o, b, h);
#pragma unroll
  for (int rr = 0; rr < attn_simt_rows; ++rr) {
    const int row = m0 + warp * attn_simt_rows + rr;
    if (row >= a.L) break;
    const A inv = l[rr] == A(0) ? A(0) : A(1) / l[rr];  // l = 0: every key masked, PyTorch gives 0
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
      const int d = lane + 32 * i;
      if (d < a.Ev) out[row * a.o.sr + d] = device_value<T>(o[rr][i] * inv);
    }
    if (a.lse.p && lane == 0) {
      A* lse = attn_ptr<A>(a.lse, b, h);
      lse[row] = m[rr] == ninf ? ninf : m[rr] + attn_log(l[rr]);
    }
  }
}

// ---- fused tensor-core forward (bf16 / f16) --------------------------------------------------

/// Tile sizes of the fused forward for head dim D with W warps of R 16-row query tiles each,
/// 64-key tiles, shared-memory rows padded by 16 bytes (ldmatrix's eight row addresses then fall
/// in eight different bank groups). R = 2 reads each K/V fragment from shared memory once for
/// two row tiles, halving the shared-memory traffic per product, which bounds R = 1 on Hopper.
template <int D, int W, int R = 1>
struct flash_config {
  static constexpr int block_m = 16 * R * W;
  static constexpr int block_n = 64;
  static constexpr int threads = 32 * W;
  static constexpr int pitch = D + 8;  // elements
  static constexpr int smem_bytes = (block_m + 2 * block_n) * pitch * 2;
};

__device__ __forceinline__ unsigned attn_smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared, asynchronously; `valid` false writes zeros and reads nothing.
__device__ __forceinline__ void attn_cp_async16(unsigned dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void attn_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void attn_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

/// Four 8x8 b16 matrices from shared memory (lanes 8i..8i+7 give matrix i's row addresses).
__device__ __forceinline__ void attn_ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
/// The same, each matrix transposed.
__device__ __forceinline__ void attn_ldsm_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                                   unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

/// c += a · b on a 16x8x16 tile: a row-major 16x16 (4 registers), b 16x8 (2), c 16x8 float.
template <class T>
__device__ __forceinline__ void attn_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<T, ::ccgraph::bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// c[r][j] += a[r] · (b0, b1) and c[r][j + 1] += a[r] · (b2, b3) for each of the R row tiles:
/// one ldmatrix.x4 of B (two 8-column blocks) serves every row tile.
template <class T, int R, int N>
__device__ __forceinline__ void attn_mma_x2(float (&c)[R][N][4], const unsigned (&a)[R][4], int j, unsigned b0,
                                            unsigned b1, unsigned b2, unsigned b3) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    attn_mma<T>(c[r][j], a[r], b0, b1);
    attn_mma<T>(c[r][j + 1], a[r], b2, b3);
  }
}

/// 2^x by the special-function unit (ex2.approx: about 2 ulp; -inf gives +0, NaN stays NaN).
__device__ __forceinline__ float attn_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Two floats rounded to T and packed in one register (lo in the low half).
template <class T>
__device__ __forceinline__ unsigned attn_pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, ::ccgraph::bf16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  }
}

/// Copies `rows` rows of D elements (row stride `stride`) into shared memory at `dst` (pitch
/// D + 8), zero-filling rows from `valid` on.
template <int D, int Threads, class T>
__device__ __forceinline__ void attn_load_tile(T* dst, const T* src, long long stride, int rows, int valid,
                                               int tid) {
  constexpr int chunks = D / 8;  // 16-byte chunks per row
  const unsigned base = attn_smem_addr(dst);
  for (int c = tid; c < rows * chunks; c += Threads) {
    const int r = c / chunks, col = (c % chunks) * 8;
    const bool ok = r < valid;
    attn_cp_async16(base + static_cast<unsigned>((r * (D + 8) + col) * 2), ok ? src + r * stride + col : src, ok);
  }
}

template <class T, class M, int D, int W, int R, int MaskKind, bool Causal>
__global__ void __launch_bounds__(32 * W) attn_fwd_flash_kernel(const attn_args a) {
  using cfg = flash_config<D, W, R>;
  constexpr int BM = cfg::block_m, BN = cfg::block_n, P = cfg::pitch;
  // One row tile keeps its Q fragments in registers; two would not fit beside their outputs, so
  // they read Q from shared memory at each step of the k loop.
  constexpr bool q_in_regs = R == 1;
  constexpr float log2e = 1.4426950408889634f, ln2 = 0.6931471805599453f;
  const float ninf = -std::numeric_limits<float>::infinity();
  extern __shared__ __align__(16) unsigned char attn_smem[];
  T* sq = reinterpret_cast<T*>(attn_smem);
  T* sk = sq + BM * P;
  T* sv = sk + BN * P;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int num_m = (a.L + BM - 1) / BM;
  // Causal blocks run longest first over all heads (the tail of the grid is then short ones);
  // otherwise a head's blocks run together, sharing its K and V in L2.
  const int bh = Causal ? static_cast<int>(blockIdx.x) % a.BH : static_cast<int>(blockIdx.x) / num_m;
  const int mb = num_m - 1 - (Causal ? static_cast<int>(blockIdx.x) / a.BH : static_cast<int>(blockIdx.x) % num_m);
  const int b = bh / a.H, h = bh % a.H;
  const int m0 = mb * BM;
  const int wrow = m0 + warp * 16 * R;  // this warp's first row
  const T* q = attn_ptr<const T>(a.q, b, h);
  const T* k = attn_ptr<const T>(a.k, b, h);
  const T* v = attn_ptr<const T>(a.v, b, h);
  const M* mask = MaskKind ? attn_ptr<const M>(a.mask, b, h) : nullptr;
  const float sl2 = static_cast<float>(a.scale) * log2e;

  const int n_end = Causal ? min(a.S, m0 + BM) : a.S;
  const int num_n = (n_end + BN - 1) / BN;
  attn_load_tile<D, cfg::threads>(sq, q + static_cast<long long>(m0) * a.q.sr, a.q.sr, BM, min(BM, a.L - m0), tid);
  if (num_n > 0) attn_load_tile<D, cfg::threads>(sk, k, a.k.sr, BN, min(BN, a.S), tid);
  attn_cp_async_commit();

  unsigned qf[q_in_regs ? D / 16 : 1][4];
  float o[R][D / 8][4];
  float m_row[R][2], l_row[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int d = 0; d < D / 8; ++d) o[r][d][0] = o[r][d][1] = o[r][d][2] = o[r][d][3] = 0.f;
    m_row[r][0] = m_row[r][1] = ninf;
    l_row[r][0] = l_row[r][1] = 0.f;
  }
  unsigned pf[R][BN / 16][4];

  // One K/V tile; Edge: a tile that may hold masked scores (an explicit mask, past S, or right
  // of some row's diagonal). Interior tiles are compiled without the masking, which keeps the
  // registers of the hot loop down.
  auto tile = [&](const int nb, auto edge_c) {
    constexpr bool Edge = decltype(edge_c)::value;
    const int n0 = nb * BN;
    attn_cp_async_wait_all();
    __syncthreads();  // K tile nb landed; every warp is done with V tile nb - 1
    if constexpr (q_in_regs) {
      if (nb == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          attn_ldsm_x4(attn_smem_addr(sq + (warp * 16 + (lane & 15)) * P + kk * 16 + ((lane >> 4) << 3)), qf[kk][0],
                       qf[kk][1], qf[kk][2], qf[kk][3]);
      }
    }
    attn_load_tile<D, cfg::threads>(sv, v + static_cast<long long>(n0) * a.v.sr, a.v.sr, BN, min(BN, a.S - n0), tid);
    attn_cp_async_commit();

    // A causal tile wholly right of this warp's last row adds nothing to its rows: skip its
    // products (the warp still loads and synchronises with the block).
    const bool active = !Edge || !Causal || n0 <= wrow + 16 * R - 1;
    if (active) {
      // S = Q Kᵀ: this warp's 16 R rows x BN keys, n-blocks of 8 keys.
      float s[R][BN / 8][4];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) s[r][j][0] = s[r][j][1] = s[r][j][2] = s[r][j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        unsigned qa[R][4];
        if constexpr (q_in_regs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[0][e] = qf[kk][e];
        } else {
#pragma unroll
          for (int r = 0; r < R; ++r)
            attn_ldsm_x4(attn_smem_addr(sq + ((warp * R + r) * 16 + (lane & 15)) * P + kk * 16 + ((lane >> 4) << 3)),
                         qa[r][0], qa[r][1], qa[r][2], qa[r][3]);
        }
#pragma unroll
        for (int j = 0; j < BN / 8; j += 2) {
          unsigned b0, b1, b2, b3;
          attn_ldsm_x4(attn_smem_addr(sk + (j * 8 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 + (((lane >> 3) & 1) << 3)),
                       b0, b1, b2, b3);
          attn_mma_x2<T>(s, qa, j, b0, b1, b2, b3);
        }
      }
      // Scale into the log2 domain; mask (explicit, causal, past S) with -inf.
      const bool edge = Edge && (n0 + BN > a.S || (Causal && n0 + BN - 1 > wrow));
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row0 = wrow + r * 16 + g;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int rr = row0 + (e >> 1) * 8, c = n0 + j * 8 + 2 * t + (e & 1);
            float x = s[r][j][e] * sl2;
            if constexpr (Edge && MaskKind != 0) {
              if (rr < a.L && c < a.S)
                x += attn_mask_term<MaskKind, float>(mask + rr * a.mask.sr + c * a.mask.sc) * log2e;
            }
            if (edge && (c >= a.S || (Causal && c > rr))) x = ninf;
            s[r][j][e] = x;
          }
        }
        // Online softmax: the row max over the tile (a row's BN values are spread over the 4
        // threads of a quad), rescale the running sum and output.
        float mx[2] = {m_row[r][0], m_row[r][1]};
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          mx[0] = fmaxf(mx[0], fmaxf(s[r][j][0], s[r][j][1]));
          mx[1] = fmaxf(mx[1], fmaxf(s[r][j][2], s[r][j][3]));
        }
        float base[2], alpha[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
          base[i] = mx[i] == ninf ? 0.f : mx[i];
          alpha[i] = attn_exp2(m_row[r][i] - base[i]);
          m_row[r][i] = mx[i];
        }
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          s[r][j][0] = attn_exp2(s[r][j][0] - base[0]);
          s[r][j][1] = attn_exp2(s[r][j][1] - base[0]);
          s[r][j][2] = attn_exp2(s[r][j][2] - base[1]);
          s[r][j][3] = attn_exp2(s[r][j][3] - base[1]);
          rs[0] += s[r][j][0] + s[r][j][1];
          rs[1] += s[r][j][2] + s[r][j][3];
        }
        l_row[r][0] = l_row[r][0] * alpha[0] + rs[0];
        l_row[r][1] = l_row[r][1] * alpha[1] + rs[1];
#pragma unroll
        for (int d = 0; d < D / 8; ++d) {
          o[r][d][0] *= alpha[0];
          o[r][d][1] *= alpha[0];
          o[r][d][2] *= alpha[1];
          o[r][d][3] *= alpha[1];
        }
        // P as A operands: the accumulator layout of two 8-key blocks is the A layout of 16 keys.
#pragma unroll
        for (int kb = 0; kb < BN / 16; ++kb) {
          pf[r][kb][0] = attn_pack2<T>(s[r][2 * kb][0], s[r][2 * kb][1]);
          pf[r][kb][1] = attn_pack2<T>(s[r][2 * kb][2], s[r][2 * kb][3]);
          pf[r][kb][2] = attn_pack2<T>(s[r][2 * kb + 1][0], s[r][2 * kb + 1][1]);
          pf[r][kb][3] = attn_pack2<T>(s[r][2 * kb + 1][2], s[r][2 * kb + 1][3]);
        }
      }
    }
    attn_cp_async_wait_all();
    __syncthreads();  // V tile nb landed; every warp is done with K tile nb
    if (nb + 1 < num_n) {
      attn_load_tile<D, cfg::threads>(sk, k + static_cast<long long>(n0 + BN) * a.k.sr, a.k.sr, BN,
                                      min(BN, a.S - n0 - BN), tid);
      attn_cp_async_commit();
    }
    if (active) {
      // O += P V: V read transposed by ldmatrix (keys are V's rows, the k dim of this product).
#pragma unroll
      for (int kb = 0; kb < BN / 16; ++kb) {
#pragma unroll
        for (int d = 0; d < D / 8; d += 2) {
          unsigned b0, b1, b2, b3;
          attn_ldsm_x4_trans(
              attn_smem_addr(sv + (kb * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)) * P + d * 8 + ((lane >> 4) << 3)), b0,
              b1, b2, b3);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            attn_mma<T>(o[r][d], pf[r][kb], b0, b1);
            attn_mma<T>(o[r][d + 1], pf[r][kb], b2, b3);
          }
        }
      }
    }
  };
  // Tiles with no masked score: below every row's diagonal and inside S, with no explicit mask.
  const int n_full = MaskKind != 0 ? 0 : min(num_n, Causal ? min(a.S, m0) / BN : a.S / BN);
  for (int nb = 0; nb < n_full; ++nb) tile(nb, std::false_type{});
  for (int nb = n_full; nb < num_n; ++nb) tile(nb, std::true_type{});
  attn_cp_async_wait_all();

  // The row sums over the quad, then out = o / l (0 for a fully masked row) and lse.
  T* out = attn_ptr<T>(a.o, b, h);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row0 = wrow + r * 16 + g;  // this thread's rows: row0 and row0 + 8
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_row[r][i] += __shfl_xor_sync(0xffffffffu, l_row[r][i], 1);
      l_row[r][i] += __shfl_xor_sync(0xffffffffu, l_row[r][i], 2);
    }
    const float inv0 = l_row[r][0] == 0.f ? 0.f : 1.f / l_row[r][0];
    const float inv1 = l_row[r][1] == 0.f ? 0.f : 1.f / l_row[r][1];
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      const int col = d * 8 + 2 * t;
      if (row0 < a.L)
        *reinterpret_cast<unsigned*>(out + row0 * a.o.sr + col) = attn_pack2<T>(o[r][d][0] * inv0, o[r][d][1] * inv0);
      if (row0 + 8 < a.L)
        *reinterpret_cast<unsigned*>(out + (row0 + 8) * a.o.sr + col) =
            attn_pack2<T>(o[r][d][2] * inv1, o[r][d][3] * inv1);
    }
    if (a.lse.p && t == 0) {
      float* lse = attn_ptr<float>(a.lse, b, h);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = row0 + 8 * i;
        if (row < a.L) lse[row] = m_row[r][i] == ninf ? ninf : (m_row[r][i] + ::log2f(l_row[r][i])) * ln2;
      }
    }
  }
}

// ---- SIMT backward -------------------------------------------------------------------------------

/// Shared memory of the dQ kernel: K and V tiles [32][E+1], [32][Ev+1]; the block's q and dO
/// rows [16][E], [16][Ev].
template <class A>
constexpr std::size_t attn_bwd_dq_smem(int E, int Ev) {
  const std::size_t rows = attn_simt_rows * attn_simt_warps, tile = attn_simt_tile;
  return sizeof(A) * (tile * (E + 1) + tile * (Ev + 1) + rows * E + rows * Ev);
}

/// dQ (and delta = rowsum(dO ∘ O), kept for the dK/dV kernel): a warp per query row, a lane per
/// key of each 32-key tile.
template <class T, class A, class M, int MaskKind, bool Causal>
__global__ void __launch_bounds__(32 * attn_simt_warps) attn_bwd_dq_simt_kernel(const attn_args a) {
  constexpr int rows = attn_simt_rows * attn_simt_warps, tile = attn_simt_tile, per_lane = attn_simt_max_dim / 32;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  A* sk = reinterpret_cast<A*>(attn_smem);
  A* sv = sk + tile * (a.E + 1);
  A* sq = sv + tile * (a.Ev + 1);
  A* sg = sq + rows * a.E;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int num_m = (a.L + rows - 1) / rows;
  const int bh = static_cast<int>(blockIdx.x) / num_m, mb = static_cast<int>(blockIdx.x) % num_m;
  const int b = bh / a.H, h = bh % a.H;
  const int m0 = mb * rows;
  const T* q = attn_ptr<const T>(a.q, b, h);
  const T* k = attn_ptr<const T>(a.k, b, h);
  const T* v = attn_ptr<const T>(a.v, b, h);
  const T* o = attn_ptr<const T>(a.o, b, h);
  const T* dout = attn_ptr<const T>(a.dout, b, h);
  const A* lse = attn_ptr<const A>(a.lse, b, h);
  A* delta = attn_ptr<A>(a.delta, b, h);
  const M* mask = MaskKind ? attn_ptr<const M>(a.mask, b, h) : nullptr;
  const A scale = static_cast<A>(a.scale);
  const A ninf = -std::numeric_limits<A>::infinity();

  for (int i = tid; i < rows * a.E; i += blockDim.x) {
    const int row = m0 + i / a.E;
    sq[i] = row < a.L ? device_load<A>(q + row * a.q.sr + i % a.E) : A(0);
  }
  for (int i = tid; i < rows * a.Ev; i += blockDim.x) {
    const int row = m0 + i / a.Ev;
    sg[i] = row < a.L ? device_load<A>(dout + row * a.dout.sr + i % a.Ev) : A(0);
  }
  __syncthreads();
  A dlt[attn_simt_rows], ls[attn_simt_rows], dq[attn_simt_rows][per_lane];
#pragma unroll
  for (int rr = 0; rr < attn_simt_rows; ++rr) {
    const int r = warp * attn_simt_rows + rr, row = m0 + r;
    A part = 0;
    if (row < a.L)
      for (int d = lane; d < a.Ev; d += 32) part += sg[r * a.Ev + d] * device_load<A>(o + row * a.o.sr + d);
    dlt[rr] = attn_warp_sum(part);
    ls[rr] = row < a.L ? lse[row] : ninf;
    if (row < a.L && lane == 0) delta[row] = dlt[rr];
#pragma unroll
    for (int i = 0; i < per_lane; ++i) dq[rr][i] = 0;
  }
  const int n_end = Causal ? min(a.S, m0 + rows) : a.S;
  for (int n0 = 0; n0 < n_end; n0 += tile) {
    __syncthreads();
    for (int i = tid; i < tile * a.E; i += blockDim.x) {
      const int j = i / a.E, e = i % a.E, key = n0 + j;
      sk[j * (a.E + 1) + e] = key < a.S ? device_load<A>(k + key * a.k.sr + e) : A(0);
    }
    for (int i = tid; i < tile * a.Ev; i += blockDim.x) {
      const int j = i / a.Ev, d = i % a.Ev, key = n0 + j;
      sv[j * (a.Ev + 1) + d] = key < a.S ? device_load<A>(v + key * a.v.sr + d) : A(0);
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < attn_simt_rows; ++rr) {
      const int r = warp * attn_simt_rows + rr, row = m0 + r;
      if (row >= a.L) break;
      const int key = n0 + lane;
      A ds = 0;
      if (key < a.S && (!Causal || key <= row) && ls[rr] != ninf) {
        A dot = 0, dp = 0;
        for (int e = 0; e < a.E; ++e) dot += sq[r * a.E + e] * sk[lane * (a.E + 1) + e];
        A x = dot * scale;
        if constexpr (MaskKind != 0) x += attn_mask_term<MaskKind, A>(mask + row * a.mask.sr + key * a.mask.sc);
        const A p = attn_exp(x - ls[rr]);
        for (int d = 0; d < a.Ev; ++d) dp += sg[r * a.Ev + d] * sv[lane * (a.Ev + 1) + d];
        ds = p * (dp - dlt[rr]);
      }
      for (int j = 0; j < tile; ++j) {
        const A dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int i = 0; i < per_lane; ++i) {
          const int e = lane + 32 * i;
          if (e < a.E) dq[rr][i] += dsj * sk[j * (a.E + 1) + e];
        }
      }
    }
  }
  T* dqp = attn_ptr<T>(a.dq, b, h);
#pragma unroll
  for (int rr = 0; rr < attn_simt_rows; ++rr) {
    const int row = m0 + warp * attn_simt_rows + rr;
    if (row >= a.L) break;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
      const int e = lane + 32 * i;
      if (e < a.E) dqp[row * a.dq.sr + e] = device_value<T>(dq[rr][i] * scale);
    }
  }
}

/// Shared memory of the dK/dV kernel: the block's k and v rows [16][E], [16][Ev]; q and dO
/// tiles [32][E+1], [32][Ev+1]; lse and delta of the tile's rows.
template <class A>
constexpr std::size_t attn_bwd_dkv_smem(int E, int Ev) {
  const std::size_t rows = attn_simt_rows * attn_simt_warps, tile = attn_simt_tile;
  return sizeof(A) * (rows * E + rows * Ev + tile * (E + 1) + tile * (Ev + 1) + 2 * tile);
}

/// dK and dV: a warp per key row, a lane per query of each 32-query tile.
template <class T, class A, class M, int MaskKind, bool Causal>
__global__ void __launch_bounds__(32 * attn_simt_warps) attn_bwd_dkv_simt_kernel(const attn_args a) {
  constexpr int rows = attn_simt_rows * attn_simt_warps, tile = attn_simt_tile, per_lane = attn_simt_max_dim / 32;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  A* sk = reinterpret_cast<A*>(attn_smem);
  A* sv = sk + rows * a.E;
  A* sq = sv + rows * a.Ev;
  A* sg = sq + tile * (a.E + 1);
  A* sl = sg + tile * (a.Ev + 1);
  A* sd = sl + tile;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int num_n = (a.S + rows - 1) / rows;
  const int bh = static_cast<int>(blockIdx.x) / num_n, nb = static_cast<int>(blockIdx.x) % num_n;
  const int b = bh / a.H, h = bh % a.H;
  const int n0 = nb * rows;
  const T* q = attn_ptr<const T>(a.q, b, h);
  const T* k = attn_ptr<const T>(a.k, b, h);
  const T* v = attn_ptr<const T>(a.v, b, h);
  const T* dout = attn_ptr<const T>(a.dout, b, h);
  const A* lse = attn_ptr<const A>(a.lse, b, h);
  const A* delta = attn_ptr<const A>(a.delta, b, h);
  const M* mask = MaskKind ? attn_ptr<const M>(a.mask, b, h) : nullptr;
  const A scale = static_cast<A>(a.scale);
  const A ninf = -std::numeric_limits<A>::infinity();

  for (int i = tid; i < rows * a.E; i += blockDim.x) {
    const int key = n0 + i / a.E;
    sk[i] = key < a.S ? device_load<A>(k + key * a.k.sr + i % a.E) : A(0);
  }
  for (int i = tid; i < rows * a.Ev; i += blockDim.x) {
    const int key = n0 + i / a.Ev;
    sv[i] = key < a.S ? device_load<A>(v + key * a.v.sr + i % a.Ev) : A(0);
  }
  A dk[attn_simt_rows][per_lane], dv[attn_simt_rows][per_lane];
#pragma unroll
  for (int rr = 0; rr < attn_simt_rows; ++rr)
#pragma unroll
    for (int i = 0; i < per_lane; ++i) dk[rr][i] = dv[rr][i] = 0;
  const int i_begin = Causal ? (n0 / tile) * tile : 0;  // queries before the block's first key see none of it
  for (int i0 = i_begin; i0 < a.L; i0 += tile) {
    __syncthreads();
    for (int i = tid; i < tile * a.E; i += blockDim.x) {
      const int j = i / a.E, e = i % a.E, row = i0 + j;
      sq[j * (a.E + 1) + e] = row < a.L ? device_load<A>(q + row * a.q.sr + e) : A(0);
    }
    for (int i = tid; i < tile * a.Ev; i += blockDim.x) {
      const int j = i / a.Ev, d = i % a.Ev, row = i0 + j;
      sg[j * (a.Ev + 1) + d] = row < a.L ? device_load<A>(dout + row * a.dout.sr + d) : A(0);
    }
    for (int j = tid; j < tile; j += blockDim.x) {
      const int row = i0 + j;
      sl[j] = row < a.L ? lse[row] : ninf;
      sd[j] = row < a.L ? delta[row] : A(0);
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < attn_simt_rows; ++rr) {
      const int r = warp * attn_simt_rows + rr, key = n0 + r;
      if (key >= a.S) break;
      const int row = i0 + lane;
      A p = 0, ds = 0;
      if (row < a.L && (!Causal || key <= row) && sl[lane] != ninf) {
        A dot = 0, dp = 0;
        for (int e = 0; e < a.E; ++e) dot += sq[lane * (a.E + 1) + e] * sk[r * a.E + e];
        A x = dot * scale;
        if constexpr (MaskKind != 0) x += attn_mask_term<MaskKind, A>(mask + row * a.mask.sr + key * a.mask.sc);
        p = attn_exp(x - sl[lane]);
        for (int d = 0; d < a.Ev; ++d) dp += sg[lane * (a.Ev + 1) + d] * sv[r * a.Ev + d];
        ds = p * (dp - sd[lane]);
      }
      for (int j = 0; j < tile; ++j) {
        const A pj = __shfl_sync(0xffffffffu, p, j);
        const A dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int i = 0; i < per_lane; ++i) {
          const int c = lane + 32 * i;
          if (c < a.Ev) dv[rr][i] += pj * sg[j * (a.Ev + 1) + c];
          if (c < a.E) dk[rr][i] += dsj * sq[j * (a.E + 1) + c];
        }
      }
    }
  }
  T* dkp = attn_ptr<T>(a.dk, b, h);
  T* dvp = attn_ptr<T>(a.dv, b, h);
#pragma unroll
  for (int rr = 0; rr < attn_simt_rows; ++rr) {
    const int key = n0 + warp * attn_simt_rows + rr;
    if (key >= a.S) break;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
      const int c = lane + 32 * i;
      if (c < a.E) dkp[key * a.dk.sr + c] = device_value<T>(dk[rr][i] * scale);
      if (c < a.Ev) dvp[key * a.dv.sr + c] = device_value<T>(dv[rr][i]);
    }
  }
}

// ---- tensor-core backward (bf16 / f16) -----------------------------------------------------

/// delta[row] = Σ_d dO[row][d] · O[row][d] in float, a warp per row: the backward's rowsum.
template <class T>
__global__ void __launch_bounds__(256) attn_bwd_delta_kernel(const attn_args a) {
  const int warps = static_cast<int>(blockDim.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const long long rg = static_cast<long long>(blockIdx.x) * warps + static_cast<int>(threadIdx.x) / 32;
  if (rg >= static_cast<long long>(a.BH) * a.L) return;
  const int bh = static_cast<int>(rg / a.L), row = static_cast<int>(rg % a.L);
  const int b = bh / a.H, h = bh % a.H;
  const T* o = attn_ptr<const T>(a.o, b, h) + row * a.o.sr;
  const T* g = attn_ptr<const T>(a.dout, b, h) + row * a.dout.sr;
  float part = 0;
  for (int d = lane; d < a.Ev; d += 32) part += device_load<float>(o + d) * device_load<float>(g + d);
  part = attn_warp_sum(part);
  if (lane == 0) attn_ptr<float>(a.delta, b, h)[row] = part;
}

/// Tiles of the tensor-core dQ kernel for head dim D (E = Ev = D): 4 warps of 16 R query rows,
/// stepping over 32 keys at a time through double-buffered shared memory.
template <int D>
struct flash_bwd_config {
  static constexpr int threads = 128;
  static constexpr int rows = 64;
  static constexpr int tile = 32;
  static constexpr int pitch = D + 8;
  /// dQ with R row tiles per warp: the block's Q and dO rows, two buffers of a K and a V tile.
  template <int R>
  static constexpr int dq_smem = (2 * rows * R + 4 * tile) * pitch * 2;
};

/// Tiles of the paired dK/dV kernel for head dim D: 64 keys per block, two pairs of warps of 32
/// keys each, 64 queries per step (single-buffered: two blocks share an SM and hide each
/// other's loads), and Pᵀ / dSᵀ of the step exchanged through shared memory.
template <int D>
struct flash_bwd_dkv_pair_config {
  static constexpr int threads = 128;
  static constexpr int keys = 64;
  static constexpr int tile = 64;
  static constexpr int pitch = D + 8;
  static constexpr int ppitch = tile + 8;  // Pᵀ / dSᵀ rows: 8 rows' stores fall in 8 bank groups
  static constexpr int smem = (2 * keys + 2 * tile) * pitch * 2 + 2 * keys * ppitch * 2 + 2 * tile * 4;
};

/// dK and dV for 64 keys, a pair of warps per 32 keys. Per 64-query step each warp computes Sᵀ =
/// K Qᵀ and dPᵀ = V dOᵀ for its pair's 32 keys and one half of the queries (each Q/dO fragment
/// then serves two key tiles), writes Pᵀ and dSᵀ to shared memory, and after a barrier
/// accumulates dV += Pᵀ dO and dK += dSᵀ Q for its pair's 32 keys and one half of the head dim
/// over all 64 queries. Against one warp per 16 keys over the whole head dim, this reads about
/// 30% fewer shared-memory fragments per product, which bound that kernel.
template <class T, class M, int D, int MaskKind, bool Causal>
__global__ void __launch_bounds__(128) attn_bwd_dkv_pair_kernel(const attn_args a) {
  using cfg = flash_bwd_dkv_pair_config<D>;
  constexpr int BK = cfg::keys, TQ = cfg::tile, P = cfg::pitch, PP = cfg::ppitch, NT = cfg::threads, DH = D / 2;
  constexpr float log2e = 1.4426950408889634f;
  const float ninf = -std::numeric_limits<float>::infinity(), pinf = std::numeric_limits<float>::infinity();
  extern __shared__ __align__(16) unsigned char attn_smem[];
  T* sk = reinterpret_cast<T*>(attn_smem);
  T* sv = sk + BK * P;
  T* sq = sv + BK * P;
  T* sdo = sq + TQ * P;
  T* sp = sdo + TQ * P;
  T* sds = sp + BK * PP;
  float* sst = reinterpret_cast<float*>(sds + BK * PP);  // lse (log2, +inf: none) then delta
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int wkey = (warp >> 1) * 32;  // the pair's first key in the block
  const int half = warp & 1;          // queries half * 32.. in the S step, dims half * DH.. after
  const int num_n = (a.S + BK - 1) / BK;
  // Causal blocks run longest first (the first keys) over all heads; otherwise a head's blocks
  // run together, sharing its Q and dO in L2.
  const int bh = Causal ? static_cast<int>(blockIdx.x) % a.BH : static_cast<int>(blockIdx.x) / num_n;
  const int nb = Causal ? static_cast<int>(blockIdx.x) / a.BH : static_cast<int>(blockIdx.x) % num_n;
  const int b = bh / a.H, h = bh % a.H;
  const int k0 = nb * BK;
  const T* q = attn_ptr<const T>(a.q, b, h);
  const T* k = attn_ptr<const T>(a.k, b, h);
  const T* v = attn_ptr<const T>(a.v, b, h);
  const T* dout = attn_ptr<const T>(a.dout, b, h);
  const float* lse = attn_ptr<const float>(a.lse, b, h);
  const float* delta = attn_ptr<const float>(a.delta, b, h);
  const M* mask = MaskKind ? attn_ptr<const M>(a.mask, b, h) : nullptr;
  const float sl2 = static_cast<float>(a.scale) * log2e;

  attn_load_tile<D, NT>(sk, k + static_cast<long long>(k0) * a.k.sr, a.k.sr, BK, min(BK, a.S - k0), tid);
  attn_load_tile<D, NT>(sv, v + static_cast<long long>(k0) * a.v.sr, a.v.sr, BK, min(BK, a.S - k0), tid);
  const int i_begin = Causal ? (k0 / TQ) * TQ : 0;  // earlier queries see none of these keys
  const int num_i = i_begin < a.L ? (a.L - i_begin + TQ - 1) / TQ : 0;
  auto load_tile = [&](int it) {
    const int i0 = i_begin + it * TQ;
    attn_load_tile<D, NT>(sq, q + static_cast<long long>(i0) * a.q.sr, a.q.sr, TQ, min(TQ, a.L - i0), tid);
    attn_load_tile<D, NT>(sdo, dout + static_cast<long long>(i0) * a.dout.sr, a.dout.sr, TQ, min(TQ, a.L - i0), tid);
    for (int j = tid; j < TQ; j += NT) {
      const int row = i0 + j;
      float l = pinf, dl = 0.f;
      if (row < a.L) {
        const float x = lse[row];
        l = x == ninf ? pinf : x * log2e;  // a fully masked row: P = 0 there
        dl = delta[row];
      }
      sst[j] = l;
      sst[TQ + j] = dl;
    }
  };
  if (num_i > 0) load_tile(0);
  attn_cp_async_commit();

  float dk[2][DH / 8][4], dv[2][DH / 8][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int d = 0; d < DH / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[m][d][e] = dv[m][d][e] = 0.f;

  // One 64-query step; Edge: a step that may hold masked scores (an explicit mask, or queries
  // before some of the block's keys).
  auto step = [&](const int it, auto edge_c) {
    constexpr bool Edge = decltype(edge_c)::value;
    const int i0 = i_begin + it * TQ;
    attn_cp_async_wait_all();
    __syncthreads();  // Q/dO step it and its lse/delta landed
    // Sᵀ and dPᵀ for the pair's 32 keys (2 row tiles) x this warp's 32 queries (4 column blocks).
    // Queries all before the pair's first key see none of its keys: P = dS = 0.
    const bool none = Edge && Causal && i0 + half * 32 + 31 < k0 + wkey;
    float s[2][4][4], dp[2][4][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[m][j][e] = dp[m][j][e] = 0.f;
    if (!none) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        unsigned ka[2][4], va[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const int arow = (wkey + m * 16 + (lane & 15)) * P + kk * 16 + ((lane >> 4) << 3);
          attn_ldsm_x4(attn_smem_addr(sk + arow), ka[m][0], ka[m][1], ka[m][2], ka[m][3]);
          attn_ldsm_x4(attn_smem_addr(sv + arow), va[m][0], va[m][1], va[m][2], va[m][3]);
        }
#pragma unroll
        for (int j = 0; j < 4; j += 2) {
          const int brow = (half * 32 + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 + (((lane >> 3) & 1) << 3);
          unsigned b0, b1, b2, b3;
          attn_ldsm_x4(attn_smem_addr(sq + brow), b0, b1, b2, b3);
          attn_mma_x2<T>(s, ka, j, b0, b1, b2, b3);
          attn_ldsm_x4(attn_smem_addr(sdo + brow), b0, b1, b2, b3);
          attn_mma_x2<T>(dp, va, j, b0, b1, b2, b3);
        }
      }
      // Pᵀ and dSᵀ = Pᵀ ∘ (dPᵀ - delta), element (key r, query c).
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = k0 + wkey + m * 16 + g + (e >> 1) * 8, cl = half * 32 + j * 8 + 2 * t + (e & 1), c = i0 + cl;
            float x = s[m][j][e] * sl2;
            if constexpr (Edge && MaskKind != 0) {
              if (c < a.L && r < a.S) x += attn_mask_term<MaskKind, float>(mask + c * a.mask.sr + r * a.mask.sc) * log2e;
            }
            if (Edge && Causal && r > c) x = ninf;
            const float p = attn_exp2(x - sst[cl]);
            s[m][j][e] = p;
            dp[m][j][e] = p * (dp[m][j][e] - sst[TQ + cl]);
          }
        }
      }
    }
    // Rounded to T (as the products use them) into the step's Pᵀ and dSᵀ rows.
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = wkey + m * 16 + g, col = half * 32 + j * 8 + 2 * t;
        *reinterpret_cast<unsigned*>(sp + row * PP + col) = attn_pack2<T>(s[m][j][0], s[m][j][1]);
        *reinterpret_cast<unsigned*>(sp + (row + 8) * PP + col) = attn_pack2<T>(s[m][j][2], s[m][j][3]);
        *reinterpret_cast<unsigned*>(sds + row * PP + col) = attn_pack2<T>(dp[m][j][0], dp[m][j][1]);
        *reinterpret_cast<unsigned*>(sds + (row + 8) * PP + col) = attn_pack2<T>(dp[m][j][2], dp[m][j][3]);
      }
    }
    __syncthreads();  // the step's Pᵀ and dSᵀ are complete
    // dV += Pᵀ dO and dK += dSᵀ Q for the pair's 32 keys x this warp's DH dims, over the step's
    // 64 queries (the k dim); Q and dO read transposed by ldmatrix. A pair whose keys no query of
    // the step sees adds nothing.
    if (!(Edge && Causal && i0 + TQ - 1 < k0 + wkey)) {
#pragma unroll
      for (int kq = 0; kq < TQ / 16; ++kq) {
        unsigned pa[2][4], da[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const int arow = (wkey + m * 16 + (lane & 15)) * PP + kq * 16 + ((lane >> 4) << 3);
          attn_ldsm_x4(attn_smem_addr(sp + arow), pa[m][0], pa[m][1], pa[m][2], pa[m][3]);
          attn_ldsm_x4(attn_smem_addr(sds + arow), da[m][0], da[m][1], da[m][2], da[m][3]);
        }
#pragma unroll
        for (int d = 0; d < DH / 8; d += 2) {
          const int trow = (kq * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)) * P + half * DH + d * 8 + ((lane >> 4) << 3);
          unsigned b0, b1, b2, b3;
          attn_ldsm_x4_trans(attn_smem_addr(sdo + trow), b0, b1, b2, b3);
          attn_mma_x2<T>(dv, pa, d, b0, b1, b2, b3);
          attn_ldsm_x4_trans(attn_smem_addr(sq + trow), b0, b1, b2, b3);
          attn_mma_x2<T>(dk, da, d, b0, b1, b2, b3);
        }
      }
    }
    __syncthreads();  // every warp is done with Q, dO, Pᵀ and dSᵀ of this step
    if (it + 1 < num_i) {
      load_tile(it + 1);
      attn_cp_async_commit();
    }
  };
  // Query steps at or after the block's last key (every score unmasked) come after the edge ones.
  const int it_edge = MaskKind != 0 ? num_i : Causal ? min(num_i, (k0 + BK - 1 - i_begin + TQ - 1) / TQ) : 0;
  for (int it = 0; it < it_edge; ++it) step(it, std::true_type{});
  for (int it = it_edge; it < num_i; ++it) step(it, std::false_type{});
  attn_cp_async_wait_all();

  T* dkp = attn_ptr<T>(a.dk, b, h);
  T* dvp = attn_ptr<T>(a.dv, b, h);
  const float scale = static_cast<float>(a.scale);
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int key = k0 + wkey + m * 16 + g;  // this thread's keys: key and key + 8
#pragma unroll
    for (int d = 0; d < DH / 8; ++d) {
      const int col = half * DH + d * 8 + 2 * t;
      if (key < a.S) {
        *reinterpret_cast<unsigned*>(dkp + key * a.dk.sr + col) = attn_pack2<T>(dk[m][d][0] * scale, dk[m][d][1] * scale);
        *reinterpret_cast<unsigned*>(dvp + key * a.dv.sr + col) = attn_pack2<T>(dv[m][d][0], dv[m][d][1]);
      }
      if (key + 8 < a.S) {
        *reinterpret_cast<unsigned*>(dkp + (key + 8) * a.dk.sr + col) =
            attn_pack2<T>(dk[m][d][2] * scale, dk[m][d][3] * scale);
        *reinterpret_cast<unsigned*>(dvp + (key + 8) * a.dv.sr + col) = attn_pack2<T>(dv[m][d][2], dv[m][d][3]);
      }
    }
  }
}

/// dQ for 64 R queries: each warp owns R 16-row tiles of queries, keeps their dQ in registers
/// and, per 32-key tile, recomputes S = Q Kᵀ and dP = dO Vᵀ, then dQ += dS K. With R = 1 the
/// warp's Q and dO fragments stay in registers; with R = 2 they are read from shared memory at
/// each step (they would not fit beside dQ), and each K/V fragment serves two row tiles.
template <class T, class M, int D, int R, int MaskKind, bool Causal>
__global__ void __launch_bounds__(128) attn_bwd_dq_flash_kernel(const attn_args a) {
  using cfg = flash_bwd_config<D>;
  constexpr int BM = cfg::rows * R, TK = cfg::tile, P = cfg::pitch, NT = cfg::threads;
  constexpr bool in_regs = R == 1;
  constexpr float log2e = 1.4426950408889634f;
  const float ninf = -std::numeric_limits<float>::infinity(), pinf = std::numeric_limits<float>::infinity();
  extern __shared__ __align__(16) unsigned char attn_smem[];
  T* sq = reinterpret_cast<T*>(attn_smem);
  T* sdo = sq + BM * P;
  T* skv = sdo + BM * P;  // buffer i: K tile at skv + i * 2 * TK * P, V tile right after it
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int num_m = (a.L + BM - 1) / BM;
  // Causal blocks run longest first over all heads; otherwise a head's blocks run together.
  const int bh = Causal ? static_cast<int>(blockIdx.x) % a.BH : static_cast<int>(blockIdx.x) / num_m;
  const int mb = num_m - 1 - (Causal ? static_cast<int>(blockIdx.x) / a.BH : static_cast<int>(blockIdx.x) % num_m);
  const int b = bh / a.H, h = bh % a.H;
  const int m0 = mb * BM;
  const int wrow = m0 + warp * 16 * R;  // this warp's first row
  const T* q = attn_ptr<const T>(a.q, b, h);
  const T* k = attn_ptr<const T>(a.k, b, h);
  const T* v = attn_ptr<const T>(a.v, b, h);
  const T* dout = attn_ptr<const T>(a.dout, b, h);
  const float* lse = attn_ptr<const float>(a.lse, b, h);
  const float* delta = attn_ptr<const float>(a.delta, b, h);
  const M* mask = MaskKind ? attn_ptr<const M>(a.mask, b, h) : nullptr;
  const float sl2 = static_cast<float>(a.scale) * log2e;

  attn_load_tile<D, NT>(sq, q + static_cast<long long>(m0) * a.q.sr, a.q.sr, BM, min(BM, a.L - m0), tid);
  attn_load_tile<D, NT>(sdo, dout + static_cast<long long>(m0) * a.dout.sr, a.dout.sr, BM, min(BM, a.L - m0), tid);
  const int n_end = Causal ? min(a.S, m0 + BM) : a.S;
  const int num_n = (n_end + TK - 1) / TK;
  auto load_tile = [&](int nt, int buf) {
    const int n0 = nt * TK;
    T* skb = skv + buf * 2 * TK * P;
    attn_load_tile<D, NT>(skb, k + static_cast<long long>(n0) * a.k.sr, a.k.sr, TK, min(TK, a.S - n0), tid);
    attn_load_tile<D, NT>(skb + TK * P, v + static_cast<long long>(n0) * a.v.sr, a.v.sr, TK, min(TK, a.S - n0), tid);
  };
  if (num_n > 0) load_tile(0, 0);
  attn_cp_async_commit();

  float lse2[R][2], dl[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = wrow + r * 16 + g + 8 * i;
      lse2[r][i] = pinf;
      dl[r][i] = 0.f;
      if (row < a.L) {
        const float x = lse[row];
        lse2[r][i] = x == ninf ? pinf : x * log2e;
        dl[r][i] = delta[row];
      }
    }
  }
  unsigned qf[in_regs ? D / 16 : 1][4], gf[in_regs ? D / 16 : 1][4];
  float dq[R][D / 8][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int d = 0; d < D / 8; ++d) dq[r][d][0] = dq[r][d][1] = dq[r][d][2] = dq[r][d][3] = 0.f;

  // One K/V tile; Edge: a tile that may hold masked scores (see the forward).
  auto tile = [&](const int nt, auto edge_c) {
    constexpr bool Edge = decltype(edge_c)::value;
    const int buf = nt & 1, n0 = nt * TK;
    attn_cp_async_wait_all();
    __syncthreads();  // tile nt landed; every warp is done with tile nt - 1 (the other buffer)
    if constexpr (in_regs) {
      if (nt == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const int arow = (warp * 16 + (lane & 15)) * P + kk * 16 + ((lane >> 4) << 3);
          attn_ldsm_x4(attn_smem_addr(sq + arow), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
          attn_ldsm_x4(attn_smem_addr(sdo + arow), gf[kk][0], gf[kk][1], gf[kk][2], gf[kk][3]);
        }
      }
    }
    if (nt + 1 < num_n) {
      load_tile(nt + 1, buf ^ 1);
      attn_cp_async_commit();
    }
    // A causal key tile wholly right of this warp's last row adds nothing to its rows.
    if (Edge && Causal && n0 > wrow + 16 * R - 1) return;
    const T* skb = skv + buf * 2 * TK * P;
    const T* svb = skb + TK * P;
    float s[R][TK / 8][4], dp[R][TK / 8][4];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < TK / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[r][j][e] = dp[r][j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      unsigned qa[R][4], ga[R][4];
      if constexpr (in_regs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          qa[0][e] = qf[kk][e];
          ga[0][e] = gf[kk][e];
        }
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int arow = ((warp * R + r) * 16 + (lane & 15)) * P + kk * 16 + ((lane >> 4) << 3);
          attn_ldsm_x4(attn_smem_addr(sq + arow), qa[r][0], qa[r][1], qa[r][2], qa[r][3]);
          attn_ldsm_x4(attn_smem_addr(sdo + arow), ga[r][0], ga[r][1], ga[r][2], ga[r][3]);
        }
      }
#pragma unroll
      for (int j = 0; j < TK / 8; j += 2) {
        const int brow = (j * 8 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 + (((lane >> 3) & 1) << 3);
        unsigned b0, b1, b2, b3;
        attn_ldsm_x4(attn_smem_addr(skb + brow), b0, b1, b2, b3);
        attn_mma_x2<T>(s, qa, j, b0, b1, b2, b3);
        attn_ldsm_x4(attn_smem_addr(svb + brow), b0, b1, b2, b3);
        attn_mma_x2<T>(dp, ga, j, b0, b1, b2, b3);
      }
    }
    // dS = P ∘ (dP - delta), element (query row, key c).
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int j = 0; j < TK / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = wrow + r * 16 + g + (e >> 1) * 8, c = n0 + j * 8 + 2 * t + (e & 1);
          float x = s[r][j][e] * sl2;
          if constexpr (Edge && MaskKind != 0) {
            if (row < a.L && c < a.S)
              x += attn_mask_term<MaskKind, float>(mask + row * a.mask.sr + c * a.mask.sc) * log2e;
          }
          if (Edge && (c >= a.S || (Causal && c > row))) x = ninf;
          const float p = attn_exp2(x - lse2[r][e >> 1]);
          s[r][j][e] = p * (dp[r][j][e] - dl[r][e >> 1]);
        }
      }
    }
    // dQ += dS K over the tile's 32 keys (the k dim), K read transposed by ldmatrix.
#pragma unroll
    for (int kb = 0; kb < TK / 16; ++kb) {
      unsigned da[R][4];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        da[r][0] = attn_pack2<T>(s[r][2 * kb][0], s[r][2 * kb][1]);
        da[r][1] = attn_pack2<T>(s[r][2 * kb][2], s[r][2 * kb][3]);
        da[r][2] = attn_pack2<T>(s[r][2 * kb + 1][0], s[r][2 * kb + 1][1]);
        da[r][3] = attn_pack2<T>(s[r][2 * kb + 1][2], s[r][2 * kb + 1][3]);
      }
#pragma unroll
      for (int d = 0; d < D / 8; d += 2) {
        unsigned b0, b1, b2, b3;
        attn_ldsm_x4_trans(
            attn_smem_addr(skb + (kb * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)) * P + d * 8 + ((lane >> 4) << 3)), b0,
            b1, b2, b3);
        attn_mma_x2<T>(dq, da, d, b0, b1, b2, b3);
      }
    }
  };
  const int n_full = MaskKind != 0 ? 0 : min(num_n, Causal ? min(a.S, m0) / TK : a.S / TK);
  for (int nt = 0; nt < n_full; ++nt) tile(nt, std::false_type{});
  for (int nt = n_full; nt < num_n; ++nt) tile(nt, std::true_type{});
  attn_cp_async_wait_all();
  T* dqp = attn_ptr<T>(a.dq, b, h);
  const float scale = static_cast<float>(a.scale);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row0 = wrow + r * 16 + g;  // this thread's rows: row0 and row0 + 8
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      const int col = d * 8 + 2 * t;
      if (row0 < a.L)
        *reinterpret_cast<unsigned*>(dqp + row0 * a.dq.sr + col) =
            attn_pack2<T>(dq[r][d][0] * scale, dq[r][d][1] * scale);
      if (row0 + 8 < a.L)
        *reinterpret_cast<unsigned*>(dqp + (row0 + 8) * a.dq.sr + col) =
            attn_pack2<T>(dq[r][d][2] * scale, dq[r][d][3] * scale);
    }
  }
}

// ---- launching -------------------------------------------------------------------------------

/// Raises a kernel's dynamic shared-memory limit to `bytes` on the current device, once per
/// device and kernel (cudaFuncSetAttribute is a host-side setting, safe during graph capture).
template <auto Kernel>
void attn_allow_smem(std::size_t bytes) {
  if (bytes <= 48 * 1024) return;
  static std::array<std::atomic<std::size_t>, 64> done{};
  int dev = 0;
  CCGRAPH_CHECK_CUDA(cudaGetDevice(&dev));
  auto& slot = done[static_cast<std::size_t>(dev) % done.size()];
  if (slot.load(std::memory_order_relaxed) >= bytes) return;
  CCGRAPH_CHECK_CUDA(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  slot.store(bytes, std::memory_order_relaxed);
}

/// Whether BH heads of L rows in blocks of `rows` give every SM of the current device at least
/// two blocks (the residency of the 32-rows-per-warp kernels): below that, blocks of half the
/// rows finish sooner by using more SMs.
inline bool attn_fills_gpu(int BH, int L, int rows) {
  const long long blocks = static_cast<long long>(BH) * ((L + rows - 1) / rows);
  return blocks >= 2ll * pointwise_sm_count();
}

/// Throws cuda_error when the launch just issued failed.
inline void attn_check_launch(const char* what, const char* file, int line) {
  const cudaError_t st = cudaGetLastError();
  if (st != cudaSuccess) throw_cuda_error(st, what, file, line);
}

/// Calls f(std::integral_constant<int, MaskKind>, std::bool_constant<Causal>, MaskElement*) for
/// the call's mask (M: bool gives kind 1, the query's type kind 2) and causality; without a
/// mask the element type is bool, so masked and unmasked calls share their kernels.
template <class M, class F>
void attn_visit_mask(bool has_mask, bool causal, F&& f) {
  if (has_mask) {
    f(std::integral_constant<int, std::is_same_v<M, bool> ? 1 : 2>{}, std::false_type{}, static_cast<M*>(nullptr));
  } else if (causal) {
    f(std::integral_constant<int, 0>{}, std::true_type{}, static_cast<bool*>(nullptr));
  } else {
    f(std::integral_constant<int, 0>{}, std::false_type{}, static_cast<bool*>(nullptr));
  }
}

}  // namespace ccgraph::cuda::detail

namespace ccgraph::detail {

/// Which kernel sdpa_cuda runs: the automatic choice, or one forced (tests, benchmarks): the fused
/// tensor-core kernel with 64-row blocks (4 warps of 16 rows), 128-row blocks of 8 warps of 16
/// rows, or 128-row blocks of 4 warps of 32 rows (flash4x2), or the SIMT one. In the backward,
/// flash4 and flash8 run the dQ kernel with 16 rows per warp, flash4x2 with 32.
enum class sdpa_cuda_kernel { automatic, flash4, flash8, simt, flash4x2 };

/// The pieces of one attention launch set: operand tensors' batch layouts split into the outer
/// dims (looped on the host) and the two inner ones (b, h) of each launch.
struct sdpa_launch_plan {
  shape_t outer;
  int B = 1, H = 1;
};

/// Splits `batch` into outer dims + [B, H] (missing inner dims are 1).
inline sdpa_launch_plan sdpa_plan(const shape_t& batch) {
  sdpa_launch_plan p;
  const std::size_t n = batch.size();
  if (n >= 1) p.H = static_cast<int>(batch[n - 1]);
  if (n >= 2) p.B = static_cast<int>(batch[n - 2]);
  if (n > 2) p.outer.assign(batch.begin(), batch.end() - 2);
  return p;
}

/// An operand's (b, h, row) strides from its full strides (rank = batch dims + 2) and its
/// outer batch strides.
inline ::ccgraph::cuda::detail::attn_operand sdpa_operand(void* p, const strides_t& st, std::size_t nbatch,
                                                          strides_t* outer) {
  ::ccgraph::cuda::detail::attn_operand x;
  x.p = p;
  x.sh = nbatch >= 1 ? st[nbatch - 1] : 0;
  x.sb = nbatch >= 2 ? st[nbatch - 2] : 0;
  x.sr = st.size() > nbatch ? st[nbatch] : 0;
  x.sc = st.size() > nbatch + 1 ? st[nbatch + 1] : 1;
  if (outer) outer->assign(st.begin(), st.begin() + static_cast<std::ptrdiff_t>(nbatch > 2 ? nbatch - 2 : 0));
  return x;
}

/// `t` with a unit stride in its last dim (a contiguous copy when it has not).
template <element T>
tensor<T> sdpa_unit_last(const tensor<T>& t) {
  return t.shape().back() <= 1 || t.strides().back() == 1 ? t : t.contiguous();
}

/// The forward on a CUDA device, forcing a kernel (see sdpa_cuda_kernel); same contract as
/// sdpa_cpu. Queued on the calling thread's current stream.
template <element T, element M = bool>
  requires sdpa_mask_element<M, T>
void sdpa_cuda_with(sdpa_cuda_kernel which, const tensor<T>& q_in, const tensor<T>& k_in, const tensor<T>& v_in,
                    const std::optional<tensor<std::type_identity_t<M>>>& mask, const sdpa_options& opt, const tensor<T>& out,
                    const std::optional<tensor<sdpa_lse_t<T>>>& lse = std::nullopt) {
  namespace cd = ::ccgraph::cuda::detail;
  using A = sdpa_lse_t<T>;
  constexpr const char* what = "scaled_dot_product_attention";
  static_assert(!std::is_same_v<T, bool> && is_floating(dtype_v<T>), "scaled_dot_product_attention: floating-point tensors only");
  const sdpa_sizes s = sdpa_check(meta_of(q_in), meta_of(k_in), meta_of(v_in), meta_of(mask), opt);
  shape_t out_shape = s.batch, lse_shape = s.batch;
  out_shape.push_back(s.L);
  out_shape.push_back(s.Ev);
  lse_shape.push_back(s.L);
  check_kernel_output(out, out_shape, what);
  if (lse) check_kernel_output(*lse, lse_shape, what, "lse");
  const device dev = out.device();
  CCGRAPH_CHECK(dev.is_cuda(), what, ": output on ", dev, ", not a CUDA device");
  check_same_device(what, dev, {q_in.device(), k_in.device(), v_in.device()});
  if (mask) check_same_device(what, dev, {mask->device()});
  if (lse) check_same_device(what, dev, {lse->device()});
  if (numel_of(out_shape) == 0) return;
  CCGRAPH_CHECK(s.L < (std::int64_t{1} << 31) && s.S < (std::int64_t{1} << 31), what, ": sequence lengths L=", s.L,
                " and S=", s.S, " must be below 2^31 on CUDA");
  const cuda::detail::device_scope on_device(dev.index);
  const tensor<T> q = sdpa_unit_last(q_in), k = sdpa_unit_last(k_in), v = sdpa_unit_last(v_in);

  bool flash = false;
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    auto aligned = [](const tensor<T>& t) {
      if (reinterpret_cast<std::uintptr_t>(t.data_unsynced()) % 16 != 0) return false;
      for (std::size_t i = 0; i + 1 < t.strides().size(); ++i)
        if (t.shape()[i] > 1 && t.strides()[i] % 8 != 0) return false;
      return true;
    };
    const bool dims = s.E == s.Ev && (s.E == 64 || s.E == 128);
    const bool out_ok = reinterpret_cast<std::uintptr_t>(out.data_unsynced()) % 4 == 0;  // pair stores
    const bool forced = which == sdpa_cuda_kernel::flash4 || which == sdpa_cuda_kernel::flash8 ||
                        which == sdpa_cuda_kernel::flash4x2;
    flash = forced || (which == sdpa_cuda_kernel::automatic && dims && out_ok);
    CCGRAPH_CHECK(!flash || (dims && out_ok), what,
                  ": the fused kernel needs E == Ev in {64, 128} and a 4-byte aligned output, got E=", s.E,
                  " Ev=", s.Ev);
    if (flash && !(aligned(q) && aligned(k) && aligned(v))) {
      // cp.async moves 16-byte aligned rows: fresh (aligned, contiguous) copies of the inputs.
      sdpa_cuda_with<T, M>(which, q.clone(), k.clone(), v.clone(), mask, opt, out, lse);
      return;
    }
  } else {
    CCGRAPH_CHECK(which == sdpa_cuda_kernel::automatic || which == sdpa_cuda_kernel::simt, what,
                  ": the fused kernel takes bf16 or f16, not ", dtype_v<T>);
  }
  if (!flash)
    CCGRAPH_CHECK(s.E <= cd::attn_simt_max_dim && s.Ev <= cd::attn_simt_max_dim, what, ": head dims E=", s.E,
                  " and Ev=", s.Ev, " must be at most ", cd::attn_simt_max_dim, " on CUDA");

  const std::size_t nb = s.batch.size();
  const sdpa_launch_plan plan = sdpa_plan(s.batch);
  strides_t oq, ok_, ov, oo, ol, om;
  cd::attn_args args;
  args.q = sdpa_operand(const_cast<T*>(q.data()), q.strides(), nb, &oq);
  args.k = sdpa_operand(const_cast<T*>(k.data()), k.strides(), nb, &ok_);
  args.v = sdpa_operand(const_cast<T*>(v.data()), v.strides(), nb, &ov);
  args.o = sdpa_operand(out.data(), out.strides(), nb, &oo);
  if (lse) {
    args.lse = sdpa_operand(lse->data(), lse->strides(), nb, &ol);
  } else {
    ol.assign(plan.outer.size(), 0);
  }
  int mask_kind = 0;
  if (mask) {
    mask_kind = std::is_same_v<M, bool> ? 1 : 2;
    args.mask = sdpa_operand(const_cast<M*>(mask->data()), sdpa_mask_strides(mask, s), nb, &om);
  } else {
    om.assign(plan.outer.size(), 0);
  }
  args.H = plan.H;
  args.BH = plan.B * plan.H;
  args.L = static_cast<int>(s.L);
  args.S = static_cast<int>(s.S);
  args.E = static_cast<int>(s.E);
  args.Ev = static_cast<int>(s.Ev);
  args.scale = s.scale;
  const cudaStream_t stream = ::ccgraph::cuda::current_stream();

  auto launch_one = [&](const cd::attn_args& la) {
    cd::attn_visit_mask<M>(mask_kind != 0, opt.is_causal, [&](auto mk, auto causal, auto* mask_elem) {
      constexpr int MK = decltype(mk)::value;
      constexpr bool C = decltype(causal)::value;
      using ME = std::remove_pointer_t<decltype(mask_elem)>;
      if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
        if (flash) {
          auto run = [&](auto d_c, auto w_c, auto r_c) {
            constexpr int D = decltype(d_c)::value, W = decltype(w_c)::value, R = decltype(r_c)::value;
            using cfg = cd::flash_config<D, W, R>;
            constexpr auto kernel = cd::attn_fwd_flash_kernel<T, ME, D, W, R, MK, C>;
            cd::attn_allow_smem<kernel>(cfg::smem_bytes);
            const long long blocks = static_cast<long long>(la.BH) * ((la.L + cfg::block_m - 1) / cfg::block_m);
            CCGRAPH_CHECK(blocks < (1ll << 31), what, ": too many blocks (", blocks, ")");
            kernel<<<static_cast<unsigned>(blocks), cfg::threads, cfg::smem_bytes, stream>>>(la);
          };
          using i1 = std::integral_constant<int, 1>;
          using i2 = std::integral_constant<int, 2>;
          using i4 = std::integral_constant<int, 4>;
          using i8 = std::integral_constant<int, 8>;
          auto by_kernel = [&](auto d_c) {
            // The automatic choice: 4 warps of 32 rows where that fills the GPU, otherwise 4 of
            // 16 (twice the blocks). 32 rows per warp ran 1.2-1.5x faster on every large shape
            // of bench_gpu_index, 16 rows 1.4x faster on 24 blocks (H200, 2026-11-28,
            // bench/RESULTS.md); 8 warps of 16 rows were slower than both.
            switch (which) {
              case sdpa_cuda_kernel::flash8: run(d_c, i8{}, i1{}); break;
              case sdpa_cuda_kernel::flash4: run(d_c, i4{}, i1{}); break;
              case sdpa_cuda_kernel::flash4x2: run(d_c, i4{}, i2{}); break;
              default:
                if (cd::attn_fills_gpu(la.BH, la.L, 128))
                  run(d_c, i4{}, i2{});
                else
                  run(d_c, i4{}, i1{});
            }
          };
          if (la.E == 64) by_kernel(std::integral_constant<int, 64>{});
          else by_kernel(std::integral_constant<int, 128>{});
          return;
        }
      }
      constexpr auto kernel = cd::attn_fwd_simt_kernel<T, A, ME, MK, C>;
      const std::size_t smem = cd::attn_fwd_simt_smem<A>(la.E, la.Ev);
      cd::attn_allow_smem<kernel>(smem);
      constexpr int rows = cd::attn_simt_rows * cd::attn_simt_warps;
      const long long blocks = static_cast<long long>(la.BH) * ((la.L + rows - 1) / rows);
      CCGRAPH_CHECK(blocks < (1ll << 31), what, ": too many blocks (", blocks, ")");
      kernel<<<static_cast<unsigned>(blocks), 32 * cd::attn_simt_warps, smem, stream>>>(la);
    });
    cd::attn_check_launch("scaled_dot_product_attention: kernel launch", __FILE__, __LINE__);
  };
  if (args.BH == 0 || args.L == 0) return;
  for_each_offset<6>(plan.outer, {&oq, &ok_, &ov, &oo, &ol, &om}, [&](const auto& off) {
    cd::attn_args la = args;
    la.q.p = static_cast<T*>(la.q.p) + off[0];
    la.k.p = static_cast<T*>(la.k.p) + off[1];
    la.v.p = static_cast<T*>(la.v.p) + off[2];
    la.o.p = static_cast<T*>(la.o.p) + off[3];
    if (la.lse.p) la.lse.p = static_cast<A*>(la.lse.p) + off[4];
    if (la.mask.p) la.mask.p = static_cast<M*>(la.mask.p) + off[5];
    launch_one(la);
  });
}

/// scaled_dot_product_attention's forward on a CUDA device (the fused kernel where it applies,
/// see the top of this file); same contract as sdpa_cpu. Queued on the current stream.
template <element T, element M = bool>
  requires sdpa_mask_element<M, T>
void sdpa_cuda(const tensor<T>& q, const tensor<T>& k, const tensor<T>& v, const std::optional<tensor<std::type_identity_t<M>>>& mask,
               const sdpa_options& opt, const tensor<T>& out,
               const std::optional<tensor<sdpa_lse_t<T>>>& lse = std::nullopt) {
  sdpa_cuda_with<T, M>(sdpa_cuda_kernel::automatic, q, k, v, mask, opt, out, lse);
}

/// The backward on a CUDA device, forcing a kernel family (automatic, a flash variant for the
/// tensor-core kernels, or simt); same contract as sdpa_backward_cpu. Queued on the current
/// stream.
template <element T, element M = bool>
  requires sdpa_mask_element<M, T>
void sdpa_backward_cuda_with(sdpa_cuda_kernel which, const tensor<T>& grad_out_in, const tensor<T>& q_in,
                             const tensor<T>& k_in, const tensor<T>& v_in, const tensor<T>& out_in,
                             const tensor<sdpa_lse_t<T>>& lse, const std::optional<tensor<std::type_identity_t<M>>>& mask,
                             const sdpa_options& opt, const tensor<T>& grad_q, const tensor<T>& grad_k,
                             const tensor<T>& grad_v) {
  namespace cd = ::ccgraph::cuda::detail;
  using A = sdpa_lse_t<T>;
  constexpr const char* what = "scaled_dot_product_attention_backward";
  const sdpa_sizes s =
      sdpa_backward_check(grad_out_in, q_in, k_in, v_in, out_in, lse, mask, opt, grad_q, grad_k, grad_v);
  const device dev = grad_q.device();
  CCGRAPH_CHECK(dev.is_cuda(), what, ": grad_q on ", dev, ", not a CUDA device");
  check_same_device(what, dev,
                    {grad_out_in.device(), q_in.device(), k_in.device(), v_in.device(), out_in.device(),
                     lse.device(), grad_k.device(), grad_v.device()});
  if (mask) check_same_device(what, dev, {mask->device()});
  CCGRAPH_CHECK(s.E <= cd::attn_simt_max_dim && s.Ev <= cd::attn_simt_max_dim, what, ": head dims E=", s.E,
                " and Ev=", s.Ev, " must be at most ", cd::attn_simt_max_dim, " on CUDA");
  CCGRAPH_CHECK(s.L < (std::int64_t{1} << 31) && s.S < (std::int64_t{1} << 31), what, ": sequence lengths L=", s.L,
                " and S=", s.S, " must be below 2^31 on CUDA");
  const cuda::detail::device_scope on_device(dev.index);
  const std::int64_t BH = numel_of(s.batch);
  if (BH == 0) return;
  if (s.L == 0 || s.S == 0) {  // no pair attends: every gradient is 0
    for (const tensor<T>* g : {&grad_q, &grad_k, &grad_v}) tensor<T>(*g).fill_(cast<T>(0.0));
    return;
  }
  tensor<T> q = sdpa_unit_last(q_in), k = sdpa_unit_last(k_in), v = sdpa_unit_last(v_in);
  tensor<T> go = sdpa_unit_last(grad_out_in);
  const tensor<T> o = sdpa_unit_last(out_in);
  const tensor<A> l = lse.strides().back() == 1 || s.L <= 1 ? lse : lse.contiguous();
  const tensor<A> delta = tensor<A>::empty(lse.shape(), dev);
  bool flash = false;
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    auto aligned = [](const tensor<T>& t) {
      if (reinterpret_cast<std::uintptr_t>(t.data_unsynced()) % 16 != 0) return false;
      for (std::size_t i = 0; i + 1 < t.strides().size(); ++i)
        if (t.shape()[i] > 1 && t.strides()[i] % 8 != 0) return false;
      return true;
    };
    auto pairs = [](const tensor<T>& t) { return reinterpret_cast<std::uintptr_t>(t.data_unsynced()) % 4 == 0; };
    const bool dims = s.E == s.Ev && (s.E == 64 || s.E == 128);
    const bool outs = pairs(grad_q) && pairs(grad_k) && pairs(grad_v);
    flash = dims && outs && which != sdpa_cuda_kernel::simt;
    CCGRAPH_CHECK(flash || which == sdpa_cuda_kernel::automatic || which == sdpa_cuda_kernel::simt, what,
                  ": the fused backward needs E == Ev in {64, 128} and 4-byte aligned gradients, got E=", s.E,
                  " Ev=", s.Ev);
    if (flash) {  // 16-byte aligned rows for cp.async: copies where the inputs lack them
      if (!aligned(q)) q = q.clone();
      if (!aligned(k)) k = k.clone();
      if (!aligned(v)) v = v.clone();
      if (!aligned(go)) go = go.clone();
    }
  } else {
    CCGRAPH_CHECK(which == sdpa_cuda_kernel::automatic || which == sdpa_cuda_kernel::simt, what,
                  ": the fused backward takes bf16 or f16, not ", dtype_v<T>);
  }

  const std::size_t nb = s.batch.size();
  const sdpa_launch_plan plan = sdpa_plan(s.batch);
  strides_t oq, ok_, ov, oo, ol, om, og, odq, odk, odv, od;
  cd::attn_args args;
  args.q = sdpa_operand(const_cast<T*>(q.data()), q.strides(), nb, &oq);
  args.k = sdpa_operand(const_cast<T*>(k.data()), k.strides(), nb, &ok_);
  args.v = sdpa_operand(const_cast<T*>(v.data()), v.strides(), nb, &ov);
  args.o = sdpa_operand(const_cast<T*>(o.data()), o.strides(), nb, &oo);
  args.lse = sdpa_operand(const_cast<A*>(l.data()), l.strides(), nb, &ol);
  args.dout = sdpa_operand(const_cast<T*>(go.data()), go.strides(), nb, &og);
  args.dq = sdpa_operand(grad_q.data(), grad_q.strides(), nb, &odq);
  args.dk = sdpa_operand(grad_k.data(), grad_k.strides(), nb, &odk);
  args.dv = sdpa_operand(grad_v.data(), grad_v.strides(), nb, &odv);
  args.delta = sdpa_operand(delta.data(), delta.strides(), nb, &od);
  int mask_kind = 0;
  if (mask) {
    mask_kind = std::is_same_v<M, bool> ? 1 : 2;
    args.mask = sdpa_operand(const_cast<M*>(mask->data()), sdpa_mask_strides(mask, s), nb, &om);
  } else {
    om.assign(plan.outer.size(), 0);
  }
  args.H = plan.H;
  args.BH = plan.B * plan.H;
  args.L = static_cast<int>(s.L);
  args.S = static_cast<int>(s.S);
  args.E = static_cast<int>(s.E);
  args.Ev = static_cast<int>(s.Ev);
  args.scale = s.scale;
  const cudaStream_t stream = ::ccgraph::cuda::current_stream();
  constexpr int rows = cd::attn_simt_rows * cd::attn_simt_warps;

  auto launch_one = [&](const cd::attn_args& la) {
    cd::attn_visit_mask<M>(mask_kind != 0, opt.is_causal, [&](auto mk, auto causal, auto* mask_elem) {
      constexpr int MK = decltype(mk)::value;
      constexpr bool C = decltype(causal)::value;
      using ME = std::remove_pointer_t<decltype(mask_elem)>;
      if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
        if (flash) {
          {
            constexpr int warps = 8;
            const long long blocks = (static_cast<long long>(la.BH) * la.L + warps - 1) / warps;
            CCGRAPH_CHECK(blocks < (1ll << 31), what, ": too many blocks (", blocks, ")");
            cd::attn_bwd_delta_kernel<T><<<static_cast<unsigned>(blocks), 32 * warps, 0, stream>>>(la);
            cd::attn_check_launch("scaled_dot_product_attention_backward: delta kernel launch", __FILE__, __LINE__);
          }
          auto run = [&](auto d_c) {
            constexpr int D = decltype(d_c)::value;
            using cfg = cd::flash_bwd_config<D>;
            {
              using kv = cd::flash_bwd_dkv_pair_config<D>;
              constexpr auto kernel = cd::attn_bwd_dkv_pair_kernel<T, ME, D, MK, C>;
              cd::attn_allow_smem<kernel>(kv::smem);
              const long long blocks = static_cast<long long>(la.BH) * ((la.S + kv::keys - 1) / kv::keys);
              CCGRAPH_CHECK(blocks < (1ll << 31), what, ": too many blocks (", blocks, ")");
              kernel<<<static_cast<unsigned>(blocks), kv::threads, kv::smem, stream>>>(la);
              cd::attn_check_launch("scaled_dot_product_attention_backward: dk/dv kernel launch", __FILE__, __LINE__);
            }
            auto dq = [&](auto r_c) {
              constexpr int R = decltype(r_c)::value;
              constexpr auto kernel = cd::attn_bwd_dq_flash_kernel<T, ME, D, R, MK, C>;
              constexpr int smem = cfg::template dq_smem<R>;
              cd::attn_allow_smem<kernel>(smem);
              const long long blocks = static_cast<long long>(la.BH) * ((la.L + R * cfg::rows - 1) / (R * cfg::rows));
              CCGRAPH_CHECK(blocks < (1ll << 31), what, ": too many blocks (", blocks, ")");
              kernel<<<static_cast<unsigned>(blocks), cfg::threads, smem, stream>>>(la);
              cd::attn_check_launch("scaled_dot_product_attention_backward: dq kernel launch", __FILE__, __LINE__);
            };
            // Two row tiles per warp (as in the forward) where their blocks fill the GPU.
            const bool two = which == sdpa_cuda_kernel::flash4x2 ||
                             (which == sdpa_cuda_kernel::automatic && cd::attn_fills_gpu(la.BH, la.L, 2 * cfg::rows));
            if (two)
              dq(std::integral_constant<int, 2>{});
            else
              dq(std::integral_constant<int, 1>{});
          };
          if (la.E == 64)
            run(std::integral_constant<int, 64>{});
          else
            run(std::integral_constant<int, 128>{});
          return;
        }
      }
      {
        constexpr auto kernel = cd::attn_bwd_dq_simt_kernel<T, A, ME, MK, C>;
        const std::size_t smem = cd::attn_bwd_dq_smem<A>(la.E, la.Ev);
        cd::attn_allow_smem<kernel>(smem);
        const long long blocks = static_cast<long long>(la.BH) * ((la.L + rows - 1) / rows);
        CCGRAPH_CHECK(blocks < (1ll << 31), what, ": too many blocks (", blocks, ")");
        kernel<<<static_cast<unsigned>(blocks), 32 * cd::attn_simt_warps, smem, stream>>>(la);
        cd::attn_check_launch("scaled_dot_product_attention_backward: dq kernel launch", __FILE__, __LINE__);
      }
      {
        constexpr auto kernel = cd::attn_bwd_dkv_simt_kernel<T, A, ME, MK, C>;
        const std::size_t smem = cd::attn_bwd_dkv_smem<A>(la.E, la.Ev);
        cd::attn_allow_smem<kernel>(smem);
        const long long blocks = static_cast<long long>(la.BH) * ((la.S + rows - 1) / rows);
        CCGRAPH_CHECK(blocks < (1ll << 31), what, ": too many blocks (", blocks, ")");
        kernel<<<static_cast<unsigned>(blocks), 32 * cd::attn_simt_warps, smem, stream>>>(la);
        cd::attn_check_launch("scaled_dot_product_attention_backward: dk/dv kernel launch", __FILE__, __LINE__);
      }
    });
  };
  for_each_offset<11>(plan.outer, {&oq, &ok_, &ov, &oo, &ol, &om, &og, &odq, &odk, &odv, &od}, [&](const auto& off) {
    cd::attn_args la = args;
    la.q.p = static_cast<T*>(la.q.p) + off[0];
    la.k.p = static_cast<T*>(la.k.p) + off[1];
    la.v.p = static_cast<T*>(la.v.p) + off[2];
    la.o.p = static_cast<T*>(la.o.p) + off[3];
    la.lse.p = static_cast<A*>(la.lse.p) + off[4];
    if (la.mask.p) la.mask.p = static_cast<M*>(la.mask.p) + off[5];
    la.dout.p = static_cast<T*>(la.dout.p) + off[6];
    la.dq.p = static_cast<T*>(la.dq.p) + off[7];
    la.dk.p = static_cast<T*>(la.dk.p) + off[8];
    la.dv.p = static_cast<T*>(la.dv.p) + off[9];
    la.delta.p = static_cast<A*>(la.delta.p) + off[10];
    launch_one(la);
  });
}

/// scaled_dot_product_attention's backward on a CUDA device (the tensor-core kernels where they
/// apply, see the top of this file); same contract as sdpa_backward_cpu. Queued on the current
/// stream.
template <element T, element M = bool>
  requires sdpa_mask_element<M, T>
void sdpa_backward_cuda(const tensor<T>& grad_out, const tensor<T>& q, const tensor<T>& k, const tensor<T>& v,
                        const tensor<T>& out, const tensor<sdpa_lse_t<T>>& lse,
                        const std::optional<tensor<std::type_identity_t<M>>>& mask, const sdpa_options& opt,
                        const tensor<T>& grad_q, const tensor<T>& grad_k, const tensor<T>& grad_v) {
  sdpa_backward_cuda_with<T, M>(sdpa_cuda_kernel::automatic, grad_out, q, k, v, out, lse, mask, opt, grad_q, grad_k,
                                grad_v);
}

}  // namespace ccgraph::detail

// ---- the graph ops' CUDA runs (ops::scaled_dot_product_attention[_backward], ops/attention.hpp) --

namespace ccgraph {
namespace detail {
/// The CUDA kernels, for attention_op_runs (the dispatch the CPU run shares).
struct attention_cuda_kernels {
  template <class T, class M>
  static void forward(const tensor<T>& q, const tensor<T>& k, const tensor<T>& v, const std::optional<tensor<M>>& mask,
                      const sdpa_options& opt, const tensor<T>& out, const std::optional<tensor<sdpa_lse_t<T>>>& lse) {
    sdpa_cuda<T, M>(q, k, v, mask, opt, out, lse);
  }
  template <class T, class M>
  static void backward(const tensor<T>& grad_out, const tensor<T>& q, const tensor<T>& k, const tensor<T>& v,
                       const tensor<T>& out, const tensor<sdpa_lse_t<T>>& lse, const std::optional<tensor<M>>& mask,
                       const sdpa_options& opt, const tensor<T>& grad_q, const tensor<T>& grad_k,
                       const tensor<T>& grad_v) {
    sdpa_backward_cuda<T, M>(grad_out, q, k, v, out, lse, mask, opt, grad_q, grad_k, grad_v);
  }
};
}  // namespace detail

template <>
struct cuda_impl<ops::scaled_dot_product_attention> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::scaled_dot_product_attention& o, const Args& a) { return detail::attention_op_runs<detail::attention_cuda_kernels>::run(o, a); }
};
template <>
struct cuda_impl<ops::scaled_dot_product_attention_backward> {
  template <class Args = run_args>  // a template: its kernels compile only where it is installed
  static std::vector<any_tensor> run(const ops::scaled_dot_product_attention_backward& o, const Args& a) { return detail::attention_op_runs<detail::attention_cuda_kernels>::run(o, a); }
};

}  // namespace ccgraph
