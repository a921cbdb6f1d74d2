// ccgraph/ops/matmul.hpp: matrix products on the CPU, with torch.matmul's shape rules.
//
// The kernel is the classic GotoBLAS/BLIS layering: the operands are copied block by block into
// packed panels (converting to the accumulation type on the way, and reading any strides, so a
// transposed view costs nothing extra), and a small register-blocked micro-kernel multiplies an
// MR-row panel of A by an NR-column panel of B. Its loops have compile-time trip counts, so g++
// -O2 keeps the MR x NR accumulators in vector registers without intrinsics.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <type_traits>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/expr/expr.hpp>
#include <ccgraph/tensor/device_runtime.hpp>
#include <ccgraph/tensor/strided.hpp>
#include <ccgraph/tensor/tensor.hpp>

#if defined(__CUDACC__)
#define CCGRAPH_DETAIL_UNROLL  // nvcc's front end rejects GCC's pragma; the host compiler unrolls anyway
#elif defined(__clang__)
#define CCGRAPH_DETAIL_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define CCGRAPH_DETAIL_UNROLL _Pragma("GCC unroll 16")
#else
#define CCGRAPH_DETAIL_UNROLL
#endif

namespace ccgraph {
namespace detail {

/// Width in bytes of the vectors g++ vectorises with here: 16 for SSE2 (plain x86-64), 32 with
/// AVX (also under AVX-512, where g++ prefers 256-bit vectors by default). It sizes the
/// micro-kernel and is a template argument of every kernel below, so translation units built
/// with different -march flags instantiate differently named kernels: the linker may at worst
/// pick the other (correct) variant, never mix the packing of one with the kernel of another.
inline constexpr int native_simd_bytes =
#if defined(__AVX__)
    32;
#else
    16;
#endif

/// FLOPs of an M x K by K x N product (a multiply and an add per term): the cost model's input.
constexpr std::int64_t matmul_flops(std::int64_t m, std::int64_t n, std::int64_t k) { return 2 * m * n * k; }

/// The element type a matmul of T accumulates in: float for bf16/f16, T otherwise.
template <class T>
using matmul_acc_t = compute_t<T>;

/// Register and cache blocking for accumulation type A. MR x NR accumulators fill 12 vector
/// registers (two vectors per row), leaving room for the B panel row and the broadcast A value.
/// An A block (MC x KC) stays in L2, a B micro-panel (KC x NR) in L1.
///
/// `splat`: SSE2 has no broadcast load, and the shuffle that replaces it is the kernel's
/// bottleneck, so there A is packed with each value repeated across a vector (splat copies) and
/// the kernel multiplies whole vectors. With AVX the broadcast load is free: splat = 1.
template <class A, int SimdBytes>
struct gemm_blocking {
  static constexpr int lanes = std::max(1, SimdBytes / static_cast<int>(sizeof(A)));
  static constexpr int mr = 6;
  static constexpr int nr = std::clamp(2 * lanes, 4, 32);
  static constexpr int splat = SimdBytes == 16 && std::is_floating_point_v<A> ? lanes : 1;
  static constexpr std::int64_t kc = 256;
  static constexpr std::int64_t mc = 12 * mr;
  static constexpr std::int64_t nc = 128 * nr;
};

/// Packs `extent` lines (rows of A or columns of B) of a `kc`-long slice into panels of R lines:
/// panel p holds, for each k, the R values of lines p*R .. p*R+R-1 next to each other (each
/// repeated S times), converted to A and padded with zeros past `extent`. `line_stride` steps
/// between lines, `k_stride` along k.
template <int R, int S, class A, class T>
void gemm_pack(std::int64_t extent, std::int64_t kc, const T* src, std::int64_t line_stride,
               std::int64_t k_stride, A* dst) {
  for (std::int64_t l0 = 0; l0 < extent; l0 += R) {
    const std::int64_t n = std::min<std::int64_t>(R, extent - l0);
    const T* base = src + l0 * line_stride;
    for (std::int64_t k = 0; k < kc; ++k, dst += R * S) {
      const T* p = base + k * k_stride;
      for (std::int64_t l = 0; l < R; ++l) {
        const A v = l < n ? cast<A>(p[l * line_stride]) : A(0);
        for (int s = 0; s < S; ++s) dst[l * S + s] = v;
      }
    }
  }
}

/// C[0:m, 0:n] (+)= A-panel x B-panel over kc terms; C has strides (rsc, csc). The accumulators
/// are a local MR x NR array that the compiler keeps in registers; S is the A panel's splat.
template <int MR, int NR, int S, class A>
void gemm_micro_kernel(std::int64_t kc, const A* ap, const A* bp, A* c, std::int64_t rsc,
                       std::int64_t csc, std::int64_t m, std::int64_t n, bool accumulate) {
  A acc[MR][NR] = {};
  for (std::int64_t k = 0; k < kc; ++k, ap += MR * S, bp += NR) {
    CCGRAPH_DETAIL_UNROLL
    for (int i = 0; i < MR; ++i) {
      if constexpr (S == 1) {
        const A ai = ap[i];
        for (int j = 0; j < NR; ++j) acc[i][j] += ai * bp[j];
      } else {  // vector-wide multiplies of the splat A value; the j loop is written per vector
        CCGRAPH_DETAIL_UNROLL
        for (int jv = 0; jv < NR / S; ++jv)
          for (int s = 0; s < S; ++s) acc[i][jv * S + s] += ap[i * S + s] * bp[jv * S + s];
      }
    }
  }
  if (m == MR && n == NR && csc == 1) {
    for (int i = 0; i < MR; ++i) {
      A* row = c + i * rsc;
      if (accumulate)
        for (int j = 0; j < NR; ++j) row[j] += acc[i][j];
      else
        for (int j = 0; j < NR; ++j) row[j] = acc[i][j];
    }
    return;
  }
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      A& dst = c[i * rsc + j * csc];
      dst = accumulate ? A(dst + acc[i][j]) : acc[i][j];
    }
}

/// Packing buffers of one matmul call, reused across its blocks and batches.
template <class A, int SimdBytes>
struct gemm_workspace {
  using blk = gemm_blocking<A, SimdBytes>;
  std::unique_ptr<A[]> a_pack{new A[blk::mc * blk::kc * blk::splat]};
  std::unique_ptr<A[]> b_pack;
  explicit gemm_workspace(std::int64_t n)
      : b_pack(new A[blk::kc * ((std::min(n, blk::nc) + blk::nr - 1) / blk::nr) * blk::nr]) {}
};

/// C (m x n, accumulation type A, strides rsc/csc) = A (m x k) x B (k x n), operands of element
/// type T with arbitrary strides.
template <class T, class A, int SimdBytes>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t rsa,
          std::int64_t csa, const T* b, std::int64_t rsb, std::int64_t csb, A* c, std::int64_t rsc,
          std::int64_t csc, gemm_workspace<A, SimdBytes>& ws) {
  using blk = gemm_blocking<A, SimdBytes>;
  if (k == 0) {  // an empty sum
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * rsc + j * csc] = A(0);
    return;
  }
  for (std::int64_t jc = 0; jc < n; jc += blk::nc) {
    const std::int64_t nc = std::min(blk::nc, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += blk::kc) {
      const std::int64_t kc = std::min(blk::kc, k - pc);
      gemm_pack<blk::nr, 1>(nc, kc, b + pc * rsb + jc * csb, csb, rsb, ws.b_pack.get());
      for (std::int64_t ic = 0; ic < m; ic += blk::mc) {
        const std::int64_t mc = std::min(blk::mc, m - ic);
        gemm_pack<blk::mr, blk::splat>(mc, kc, a + ic * rsa + pc * csa, rsa, csa, ws.a_pack.get());
        for (std::int64_t jr = 0; jr < nc; jr += blk::nr)
          for (std::int64_t ir = 0; ir < mc; ir += blk::mr)
            gemm_micro_kernel<blk::mr, blk::nr, blk::splat>(
                kc, ws.a_pack.get() + ir * kc * blk::splat, ws.b_pack.get() + jr * kc,
                c + (ic + ir) * rsc + (jc + jr) * csc, rsc, csc, std::min<std::int64_t>(blk::mr, mc - ir),
                std::min<std::int64_t>(blk::nr, nc - jr), pc > 0);
      }
    }
  }
}

/// The shape of matmul(a, b) under torch.matmul's rules (1-d operands gain and then lose a
/// dimension; batch dimensions broadcast); throws naming both shapes when they do not fit.
inline shape_t matmul_shape(const shape_t& a, const shape_t& b) {
  CCGRAPH_CHECK(!a.empty() && !b.empty(), "matmul: both arguments need at least 1 dimension, got shapes ",
                shape_str(a), " and ", shape_str(b));
  const std::int64_t ka = a.back();
  const std::int64_t kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  CCGRAPH_CHECK(ka == kb, "matmul: shapes ", shape_str(a), " and ", shape_str(b),
                " cannot be multiplied (", ka, " != ", kb, ")");
  const shape_t batch_a(a.begin(), a.end() - std::min<std::ptrdiff_t>(2, std::ssize(a)));
  const shape_t batch_b(b.begin(), b.end() - std::min<std::ptrdiff_t>(2, std::ssize(b)));
  shape_t out;
  try {
    out = broadcast_shapes(batch_a, batch_b, "matmul");
  } catch (const error&) {
    CCGRAPH_THROW(error, "matmul: batch dimensions of shapes ", shape_str(a), " and ",
                  shape_str(b), " cannot be broadcast together");
  }
  if (a.size() >= 2) out.push_back(a[a.size() - 2]);
  if (b.size() >= 2) out.push_back(b.back());
  return out;
}

/// FLOPs of matmul on operands of these shapes (checked as matmul_shape does).
inline std::int64_t matmul_flops(const shape_t& a, const shape_t& b) {
  const shape_t out = matmul_shape(a, b);
  return 2 * numel_of(out) * a.back();
}

/// matmul on a device: the batch as one strided-batched library GEMM where its strides allow
/// (else one per entry of the dims outside that run), reading each operand in place when one
/// of its last two strides is 1 (row-major or transposed), else from a contiguous copy.
/// `o`, `a`, `b` are the [batch..., rows, cols] forms matmul_into builds.
template <element T>
void matmul_into_device(const tensor<T>& o, tensor<T> a, tensor<T> b, const shape_t& batch,
                        strides_t sa, strides_t sb, const strides_t& so) {
  const device dev = o.device();
  CCGRAPH_CHECK(a.device() == dev && b.device() == dev, "matmul: operands on ", a.device(), " and ",
                b.device(), " but the result is on ", dev);
  const device_runtime& rt = require_device_runtime("matmul", dev);
  CCGRAPH_CHECK(rt.gemm != nullptr, "matmul: the device backend has no GEMM for ", dev);
  // A matrix view the GEMM reads in place: unit stride along one of its last two dims.
  auto layout = [](const tensor<T>& t, bool& trans, std::int64_t& ld) {
    const auto r = t.strides().size();
    const std::int64_t rs = t.strides()[r - 2], cs = t.strides()[r - 1];
    const std::int64_t rows = t.shape()[r - 2], cols = t.shape()[r - 1];
    if (cs == 1 || cols == 1) {
      trans = false;
      ld = std::max<std::int64_t>(rows == 1 ? cols : rs, std::max<std::int64_t>(cols, 1));
      return true;
    }
    if (rs == 1 || rows == 1) {
      trans = true;
      ld = std::max<std::int64_t>(cols == 1 ? rows : cs, std::max<std::int64_t>(rows, 1));
      return true;
    }
    return false;
  };
  bool ta = false, tb = false, to = false;
  std::int64_t lda = 0, ldb = 0, ldo = 0;
  const shape_t bshape(batch);
  auto repack = [&](tensor<T>& t, strides_t& st) {
    t = t.contiguous();
    const shape_t s(t.shape().begin(), t.shape().end() - 2);
    const strides_t ts(t.strides().begin(), t.strides().end() - 2);
    st = tensor<T>::detail_broadcast_strides(tensor<T>(nullptr, s, ts, 0), bshape);
  };
  if (!layout(a, ta, lda)) repack(a, sa), layout(a, ta, lda);
  if (!layout(b, tb, ldb)) repack(b, sb), layout(b, tb, ldb);
  if (!layout(o, to, ldo) || to) {
    // The GEMM writes row-major rows: compute into a contiguous buffer and copy.
    tensor<T> tmp = tensor<T>::empty(o.shape(), dev);
    const shape_t s(tmp.shape().begin(), tmp.shape().end() - 2);
    const strides_t ts(tmp.strides().begin(), tmp.strides().end() - 2);
    matmul_into_device(tmp, a, b, batch, sa, sb,
                       tensor<T>::detail_broadcast_strides(tensor<T>(nullptr, s, ts, 0), bshape));
    tensor<T>(o).copy_(tmp);
    return;
  }
  const auto r = o.shape().size();
  const std::int64_t m = o.shape()[r - 2], n = o.shape()[r - 1], k = a.shape().back();
  const T* pa = a.data();
  const T* pb = b.data();
  T* po = o.data();
  // Batch dims of size 1 step nothing. Of the rest, the innermost run that steps all three
  // operands evenly (each dim's stride = the run's stride x the run's count so far) becomes one
  // strided-batched call; the dims outside it loop here.
  shape_t dims;
  strides_t da, db, dout;
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (batch[i] != 1) {
      dims.push_back(batch[i]);
      da.push_back(sa[i]);
      db.push_back(sb[i]);
      dout.push_back(so[i]);
    }
  std::int64_t count = 1, stride_a = 0, stride_b = 0, stride_o = 0;
  std::size_t run = dims.size();  // dims [run, end) fold into the batched call
  if (!dims.empty() && rt.gemm_batched != nullptr) {
    run = dims.size() - 1;
    count = dims[run];
    stride_a = da[run], stride_b = db[run], stride_o = dout[run];
    while (run > 0 && da[run - 1] == stride_a * count && db[run - 1] == stride_b * count &&
           dout[run - 1] == stride_o * count) {
      --run;
      count *= dims[run];
    }
  }
  const shape_t outer(dims.begin(), dims.begin() + static_cast<std::ptrdiff_t>(run));
  const strides_t oa(da.begin(), da.begin() + static_cast<std::ptrdiff_t>(run)),
      ob(db.begin(), db.begin() + static_cast<std::ptrdiff_t>(run)),
      oo(dout.begin(), dout.begin() + static_cast<std::ptrdiff_t>(run));
  // A batch that shares one B (broadcast, stride 0) and stacks A's and C's rows evenly is one
  // GEMM of count * m rows (torch.matmul folds [batch, m, k] x [k, n] the same way).
  const bool fold_rows = count > 1 && stride_b == 0 && !ta && stride_a == m * lda && stride_o == m * ldo;
  for_each_offset<3>(outer, {&oa, &ob, &oo}, [&](const auto& off) {
    if (count == 1 || fold_rows) {
      rt.gemm(dev, dtype_v<T>, fold_rows ? count * m : m, n, k, pa + off[0], lda, ta, pb + off[1], ldb, tb,
              po + off[2], ldo);
    } else {
      rt.gemm_batched(dev, dtype_v<T>, m, n, k, pa + off[0], lda, ta, pb + off[1], ldb, tb, po + off[2], ldo,
                      count, stride_a, stride_b, stride_o);
    }
  });
}

/// Writes matmul(a, b) into `out`, which has shape matmul_shape(a, b) and any strides (an
/// executor's planned buffer). `out` must not overlap `a` or `b`. Waits on pending operands.
template <element T, int SimdBytes = native_simd_bytes>
void matmul_into(const tensor<T>& out, const tensor<T>& a, const tensor<T>& b) {
  static_assert(!std::is_same_v<T, bool>,
                "matmul: bool tensors are not supported (as in PyTorch); convert with .to<float>()");
  using A = matmul_acc_t<T>;
  const shape_t out_shape = matmul_shape(a.shape(), b.shape());
  CCGRAPH_CHECK(out.shape() == out_shape, "matmul: output of shape ", shape_str(out.shape()),
                " for a result of shape ", shape_str(out_shape));
  // Bring both operands to [batch..., rows, cols] and the output along with them.
  const tensor<T> a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const tensor<T> b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  tensor<T> o = out;
  if (b.dim() == 1) o = o.unsqueeze(o.dim());
  if (a.dim() == 1) o = o.unsqueeze(o.dim() - 1);
  const auto r = static_cast<std::size_t>(o.dim());
  const std::int64_t m = o.shape()[r - 2], n = o.shape()[r - 1], k = a2.shape().back();
  const shape_t batch(o.shape().begin(), o.shape().end() - 2);
  // Batch strides, 0 along broadcast dims; a view without storage only carries the metadata.
  auto batch_strides = [&](const tensor<T>& t) {
    const shape_t s(t.shape().begin(), t.shape().end() - 2);
    const strides_t st(t.strides().begin(), t.strides().end() - 2);
    return tensor<T>::detail_broadcast_strides(tensor<T>(nullptr, s, st, 0), batch);
  };
  const strides_t sa = batch_strides(a2), sb = batch_strides(b2), so = batch_strides(o);
  const auto ar = a2.strides()[a2.strides().size() - 2], ac = a2.strides().back();
  const auto br = b2.strides()[b2.strides().size() - 2], bc = b2.strides().back();
  const auto orow = o.strides()[r - 2], ocol = o.strides()[r - 1];
  if (numel_of(o.shape()) == 0) return;
  if (!out.device().is_cpu()) {
    matmul_into_device(o, a2, b2, batch, sa, sb, so);
    return;
  }
  const T* pa = a2.data();
  const T* pb = b2.data();
  T* po = o.data();
  gemm_workspace<A, SimdBytes> ws(n);
  // Accumulation type wider than T (bf16/f16): accumulate one matrix in A, round once.
  std::unique_ptr<A[]> acc;
  if constexpr (!std::is_same_v<A, T>) acc.reset(new A[m * n]);
  for_each_offset<3>(batch, {&sa, &sb, &so}, [&](const auto& off) {
    if constexpr (std::is_same_v<A, T>) {
      gemm(m, n, k, pa + off[0], ar, ac, pb + off[1], br, bc, po + off[2], orow, ocol, ws);
    } else {
      gemm(m, n, k, pa + off[0], ar, ac, pb + off[1], br, bc, acc.get(), n, std::int64_t{1}, ws);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j)
          po[off[2] + i * orow + j * ocol] = cast<T>(acc[i * n + j]);
    }
  });
}

}  // namespace detail

/// Matrix product with torch.matmul's rules: 2-d x 2-d, 1-d operands (vector products), and
/// batched operands whose leading dimensions broadcast. Operands may be tensors (any strides,
/// e.g. transposed views) or expressions (evaluated first, once when both operands are the same
/// object). bf16/f16 accumulate in float and
/// round once. Returns a new contiguous tensor. (Traced operands record a matmul node instead:
/// ccgraph/trace/ops.hpp.)
template <pointwise_operand A, pointwise_operand B>
  requires(!is_traced_v<A> && !is_traced_v<B>)
tensor<value_type_t<A>> matmul(const A& a, const B& b) {
  static_assert(is_same_dtype_v<A, B>,
                "matmul: mixing dtypes: both operands must have the same element type; convert "
                "one of them with .to<U>()");
  static_assert(!is_complex_v<value_type_t<A>>,
                "matmul: complex tensors (c64, c128) are not supported: compute ops take real dtypes");
  if constexpr (is_same_dtype_v<A, B> && !is_complex_v<value_type_t<A>>) {
    using T = value_type_t<A>;
    const tensor<T> ta = a;  // evaluates an expression; shares a tensor
    // matmul(c, c) of one expression evaluates it once.
    bool same = false;
    if constexpr (std::is_same_v<A, B>) same = static_cast<const void*>(&a) == static_cast<const void*>(&b);
    const tensor<T> tb = same ? ta : tensor<T>(b);
    CCGRAPH_CHECK(ta.device() == tb.device(), "matmul: operands on ", ta.device(), " and ",
                  tb.device());
    auto out = tensor<T>::empty(detail::matmul_shape(ta.shape(), tb.shape()), ta.device());
    detail::matmul_into(out, ta, tb);
    return out;
  } else {
    return {};
  }
}

}  // namespace ccgraph

#undef CCGRAPH_DETAIL_UNROLL
