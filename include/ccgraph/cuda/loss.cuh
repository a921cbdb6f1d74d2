// ccgraph/cuda/loss.cuh: the fused CUDA kernels of cross_entropy and its backward (semantics,
// formulas and CPU kernels: <ccgraph/ops/loss.hpp>).
//
// Forward: one pass over the logits. A group of threads per position (logits [N, C]: 16-byte
// loads along the row; [N, C, d...]: one thread per position, coalesced over d) keeps an online
// log-sum-exp (and, with label smoothing, the weighted sum of the logits), then writes the
// position's loss and logsumexp. mean / sum reduce the per-position losses (and target weights)
// with the deterministic column reduction of <ccgraph/cuda/reduction.cuh>.
// Backward: one pass, logits in, gradient out, from the saved logsumexp.
//
// A target that is neither a class nor ignore_index cannot throw from a kernel. When the caller
// passes `bad_target` (a device i64 tensor of one element) it receives the first such position
// (-1: none), the position's loss (or gradient row) is NaN, and cross_entropy_raise_bad_target
// turns that into the CPU kernel's error. Without it (the graph ops, eager or in a CUDA Graph,
// where reading it back would wait for the kernel) the kernel prints the target and traps, as
// the index ops do and as PyTorch's device-side assert does: a NaN loss nobody asked about would
// be a silent wrong result.
//
// Compile with nvcc: this header defines __global__ functions.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/loss.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/normalization.cuh>
#include <ccgraph/cuda/reduction.cuh>
#include <ccgraph/ops/loss.hpp>
#include <ccgraph/ops/loss_ops.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <type_traits>

namespace ccgraph::cuda::detail {

/// What the cross_entropy kernels read and write; A is the accumulation type.
template <class T, class A>
struct ce_params {
  const T* x;                       // logits, contiguous [batch, classes, inner]
  const std::int64_t* target;       // [batch * inner]
  const T* weight;                  // [classes] or null
  T* loss_none;                     // reduction none: the per-position losses, else null
  A* loss_ws;                       // mean / sum: [2][positions] losses, then target weights
  A* lse;                           // [positions] or null
  unsigned long long* bad;          // the first bad target's position (atomicMin), or null
  const A* wsum;                    // the sum of the class weights (label smoothing), or null: classes
  std::int64_t positions, classes, inner, ignore_index;
  A ls;                             // label smoothing
};

/// A target out of bounds (see the top of this file): flagged in `bad` when the caller reads it
/// back, else reported and the kernel stopped.
__device__ __noinline__ inline void ce_bad_target(unsigned long long* bad, std::int64_t i, std::int64_t t,
                                                  std::int64_t classes) {
  if (bad) {
    atomicMin(bad, static_cast<unsigned long long>(i));
    return;
  }
  printf("ccgraph cross_entropy: target %lld at position %lld is out of bounds for %lld classes\n",
         static_cast<long long>(t), static_cast<long long>(i), static_cast<long long>(classes));
  __trap();
}

/// A position's online statistics: log-sum-exp state and sum_c w[c] * x[c] (label smoothing).
template <class A>
struct ce_state {
  lse_state<A> l;
  A sx;
};

template <class A>
__device__ __forceinline__ ce_state<A> ce_merge(const ce_state<A>& a, const ce_state<A>& b) {
  return {lse_merge(a.l, b.l), a.sx + b.sx};
}

/// Writes position i's outputs from its statistics; `row` points at its class 0, classes
/// `stride` apart.
template <class T, class A>
__device__ __forceinline__ void ce_finish(const ce_params<T, A>& p, std::int64_t i, const ce_state<A>& st,
                                          const T* row, std::int64_t stride) {
  const A l = lse_value(st.l);
  if (p.lse) p.lse[i] = l;
  const std::int64_t t = p.target[i];
  A li = 0, wt = 0;
  if (t != p.ignore_index) {
    if (t < 0 || t >= p.classes) {
      ce_bad_target(p.bad, i, t, p.classes);
      li = wt = std::numeric_limits<A>::quiet_NaN();
    } else {
      wt = p.weight ? static_cast<A>(to_acc(p.weight[t])) : A(1);
      li = (A(1) - p.ls) * wt * (l - static_cast<A>(to_acc(row[t * stride])));
      if (p.ls > A(0)) {
        const A wsum = p.wsum ? *p.wsum : static_cast<A>(p.classes);
        li += p.ls / static_cast<A>(p.classes) * (l * wsum - st.sx);
      }
    }
  }
  if (p.loss_none) {
    p.loss_none[i] = from_acc<T>(li);
  } else {
    p.loss_ws[i] = li;
    p.loss_ws[p.positions + i] = wt;
  }
}

/// cross_entropy forward over rows of contiguous logits (inner == 1): a group of tpr threads per
/// position, VEC elements per load.
template <class T, int VEC>
__global__ void __launch_bounds__(512) ce_rows_kernel(const ce_params<T, gpu_acc_t<T>> p, int tpr_) {
  using A = gpu_acc_t<T>;
  __shared__ ce_state<A> smem[32];
  const int tpr = tpr_;
  const int lane = static_cast<int>(threadIdx.x) % tpr;
  const int group = static_cast<int>(threadIdx.x) / tpr;
  const int groups = static_cast<int>(blockDim.x) / tpr;
  const std::int64_t n = p.classes;
  const std::int64_t step = static_cast<std::int64_t>(tpr) * VEC;
  const bool smooth = p.ls > A(0);
  for (std::int64_t rb = static_cast<std::int64_t>(blockIdx.x) * groups; rb < p.positions;
       rb += static_cast<std::int64_t>(gridDim.x) * groups) {
    const std::int64_t i = rb + group;
    const bool valid = i < p.positions;
    const T* row = p.x + i * n;
    ce_state<A> st{lse_init<A>(), A(0)};
    if (valid) {
      std::int64_t c = static_cast<std::int64_t>(lane) * VEC;
      for (; c + step < n; c += 2 * step) {  // two loads in flight
        const vpack<T, VEC> v0 = load_pack<VEC>(row + c);
        const vpack<T, VEC> v1 = load_pack<VEC>(row + c + step);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A e0 = static_cast<A>(to_acc(v0.v[j]));
          lse_add(st.l, e0);
          if (smooth) st.sx += (p.weight ? static_cast<A>(to_acc(p.weight[c + j])) : A(1)) * e0;
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A e1 = static_cast<A>(to_acc(v1.v[j]));
          lse_add(st.l, e1);
          if (smooth) st.sx += (p.weight ? static_cast<A>(to_acc(p.weight[c + step + j])) : A(1)) * e1;
        }
      }
      for (; c < n; c += step) {
        const vpack<T, VEC> v = load_pack<VEC>(row + c);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A e = static_cast<A>(to_acc(v.v[j]));
          lse_add(st.l, e);
          if (smooth) st.sx += (p.weight ? static_cast<A>(to_acc(p.weight[c + j])) : A(1)) * e;
        }
      }
    }
    st = group_allreduce(st, tpr, [](const ce_state<A>& a, const ce_state<A>& b) { return ce_merge(a, b); }, smem);
    if (valid && lane == 0) ce_finish(p, i, st, row, 1);
  }
}

/// cross_entropy forward with spatial dims (inner > 1): one thread per position.
template <class T>
__global__ void __launch_bounds__(256) ce_spatial_kernel(const ce_params<T, gpu_acc_t<T>> p) {
  using A = gpu_acc_t<T>;
  const bool smooth = p.ls > A(0);
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.positions;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = i / p.inner, s = i - b * p.inner;
    const T* row = p.x + b * p.classes * p.inner + s;
    ce_state<A> st{lse_init<A>(), A(0)};
    for (std::int64_t c = 0; c < p.classes; ++c) {
      const A e = static_cast<A>(to_acc(row[c * p.inner]));
      lse_add(st.l, e);
      if (smooth) st.sx += (p.weight ? static_cast<A>(to_acc(p.weight[c])) : A(1)) * e;
    }
    ce_finish(p, i, st, row, p.inner);
  }
}

/// loss = sums[0] / sums[1] (mean) or sums[0] (sum), rounded to T.
template <class T, class A>
__global__ void ce_reduce_finish_kernel(const A* __restrict__ sums, T* __restrict__ out, bool mean) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = from_acc<T>(mean ? sums[0] / sums[1] : sums[0]);
}

/// Per-position target weights of the mean's denominator (0 when ignored; NaN for a bad target).
template <class T, class A>
__global__ void __launch_bounds__(256) ce_target_weight_kernel(const std::int64_t* __restrict__ target,
                                                                const T* __restrict__ weight, A* __restrict__ out,
                                                                std::int64_t positions, std::int64_t classes,
                                                                std::int64_t ignore_index) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < positions;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = target[i];
    A w = 0;
    if (t != ignore_index)
      w = t < 0 || t >= classes ? std::numeric_limits<A>::quiet_NaN() : (weight ? static_cast<A>(to_acc(weight[t])) : A(1));
    out[i] = w;
  }
}

/// What the backward kernels read.
template <class T, class A>
struct ce_backward_params {
  const T* grad;                // [positions] (none) or [1]
  const T* x;
  const std::int64_t* target;
  const T* weight;
  const A* lse;
  const A* denom;               // mean: the sum of the target weights, else null
  const A* wsum;                // label smoothing with a weight: the sum of the class weights
  T* dx;
  unsigned long long* bad;
  std::int64_t positions, classes, inner, ignore_index;
  A ls;
  bool per_position;            // reduction none
};

/// One logit's gradient (see loss.hpp's header comment); `bad` marks a bad target.
template <class T, class A>
__device__ __forceinline__ A ce_grad(const ce_backward_params<T, A>& p, std::int64_t i, std::int64_t t, A gi, A wt,
                                     A l, std::int64_t c, A xc) {
  const A pc = dev_exp(xc - l);
  A d = (A(1) - p.ls) * wt * (pc - (c == t ? A(1) : A(0)));
  if (p.ls > A(0)) {
    const A wsum = p.wsum ? *p.wsum : static_cast<A>(p.classes);
    d += p.ls / static_cast<A>(p.classes) * (wsum * pc - (p.weight ? static_cast<A>(to_acc(p.weight[c])) : A(1)));
  }
  (void)i;
  return gi * d;
}

/// The per-position factors of the backward: the incoming gradient gi and the target weight wt,
/// or false when the position is ignored (zero gradient) or bad (NaN gradient, flagged).
template <class T, class A>
__device__ __forceinline__ int ce_position_factors(const ce_backward_params<T, A>& p, std::int64_t i, std::int64_t& t,
                                                   A& gi, A& wt) {
  t = p.target[i];
  if (t == p.ignore_index) return 0;
  if (t < 0 || t >= p.classes) {
    ce_bad_target(p.bad, i, t, p.classes);
    return -1;
  }
  gi = p.per_position ? static_cast<A>(to_acc(p.grad[i])) : static_cast<A>(to_acc(p.grad[0]));
  if (p.denom) gi /= *p.denom;
  wt = p.weight ? static_cast<A>(to_acc(p.weight[t])) : A(1);
  return 1;
}

/// cross_entropy backward over rows (inner == 1): a group of tpr threads per position.
template <class T, int VEC>
__global__ void __launch_bounds__(512) ce_backward_rows_kernel(const ce_backward_params<T, gpu_acc_t<T>> p, int tpr_) {
  using A = gpu_acc_t<T>;
  const int tpr = tpr_;
  const int lane = static_cast<int>(threadIdx.x) % tpr;
  const int group = static_cast<int>(threadIdx.x) / tpr;
  const int groups = static_cast<int>(blockDim.x) / tpr;
  const std::int64_t n = p.classes;
  const std::int64_t step = static_cast<std::int64_t>(tpr) * VEC;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * groups + group; i < p.positions;
       i += static_cast<std::int64_t>(gridDim.x) * groups) {
    std::int64_t t = 0;
    A gi = 0, wt = 0;
    const int kind = ce_position_factors(p, i, t, gi, wt);
    const A l = p.lse[i];
    const T* row = p.x + i * n;
    T* out = p.dx + i * n;
    for (std::int64_t c = static_cast<std::int64_t>(lane) * VEC; c < n; c += step) {
      vpack<T, VEC> o;
      if (kind == 1) {
        const vpack<T, VEC> v = load_pack<VEC>(row + c);
#pragma unroll
        for (int j = 0; j < VEC; ++j) o.v[j] = from_acc<T>(ce_grad(p, i, t, gi, wt, l, c + j, static_cast<A>(to_acc(v.v[j]))));
      } else {
        const A fill = kind == 0 ? A(0) : std::numeric_limits<A>::quiet_NaN();
#pragma unroll
        for (int j = 0; j < VEC; ++j) o.v[j] = from_acc<T>(fill);
      }
      store_pack<VEC>(out + c, o);
    }
  }
}

/// cross_entropy backward with spatial dims (inner > 1): one thread per logit.
template <class T>
__global__ void __launch_bounds__(256) ce_backward_spatial_kernel(const ce_backward_params<T, gpu_acc_t<T>> p) {
  using A = gpu_acc_t<T>;
  const std::int64_t total = p.positions * p.classes;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t s = e % p.inner;
    const std::int64_t bc = e / p.inner;
    const std::int64_t c = bc % p.classes, b = bc / p.classes;
    const std::int64_t i = b * p.inner + s;
    std::int64_t t = 0;
    A gi = 0, wt = 0;
    const int kind = ce_position_factors(p, i, t, gi, wt);
    A d = kind == 0 ? A(0) : std::numeric_limits<A>::quiet_NaN();
    if (kind == 1) d = ce_grad(p, i, t, gi, wt, p.lse[i], c, static_cast<A>(to_acc(p.x[e])));
    p.dx[e] = from_acc<T>(d);
  }
}

/// The sum of the class weights into `out` (one value), for label smoothing.
template <class T, class A>
void ce_weight_sum(const tensor<T>& weight, A* out) {
  reduce_cuda_run(weight, std::vector<bool>(weight.shape().size(), true), ::ccgraph::detail::sum_reducer<A, A>{out});
}

}  // namespace ccgraph::cuda::detail

namespace ccgraph::detail {

/// Sets `bad_target` (a device i64 tensor of one element, or null) to -1 before a kernel records
/// the first bad target's position in it.
inline void cross_entropy_reset_bad_target(const tensor<std::int64_t>* bad_target) {
  if (!bad_target) return;
  CCGRAPH_CHECK(bad_target->numel() == 1 && !bad_target->device().is_cpu() && bad_target->is_contiguous(),
                "cross_entropy: bad_target must be a contiguous device i64 tensor of one element, got shape ",
                shape_str(bad_target->shape()), " on ", bad_target->device());
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(bad_target->data(), 0xff, sizeof(std::int64_t), cuda::current_stream()));
}

/// Reads `bad_target` (waits for the kernels) and throws the CPU kernel's error when a target
/// was out of bounds: what eager callers do to report bad targets as the CPU does.
inline void cross_entropy_raise_bad_target(const tensor<std::int64_t>& bad_target, const tensor<std::int64_t>& target,
                                           std::int64_t classes) {
  const std::int64_t at = bad_target.item();
  if (at < 0) return;
  const tensor<std::int64_t> t = target.contiguous().flatten().narrow(0, at, 1);
  cross_entropy_bad_target(t.item(), classes, at);
}

/// cross_entropy on the GPU (see cross_entropy_cpu); `bad_target` as in the header comment.
template <class T>
void cross_entropy_cuda(const tensor<T>& input, const tensor<std::int64_t>& target, const optional_tensor<T>& weight,
                        loss_reduction reduction, std::int64_t ignore_index, double label_smoothing,
                        const tensor<T>& loss, const tensor<norm_stat_t<T>>* lse = nullptr,
                        const tensor<std::int64_t>* bad_target = nullptr) {
  namespace cd = cuda::detail;
  const auto metas = cross_entropy_meta({dtype_v<T>, input.shape()}, {dtype::i64, target.shape()}, meta_of(weight),
                                        reduction, ignore_index, label_smoothing);
  const cross_entropy_extent e = cross_entropy_check({dtype_v<T>, input.shape()}, {dtype::i64, target.shape()},
                                                     meta_of(weight), label_smoothing);
  check_input("cross_entropy", "input", input, false);
  check_input("cross_entropy", "target", target, false);
  if (weight) check_input("cross_entropy", "weight", *weight, false);
  check_output("cross_entropy", "loss", loss, metas[0].shape, false);
  if (lse) check_output("cross_entropy", "lse", *lse, metas[1].shape, false);
  cross_entropy_reset_bad_target(bad_target);
  if constexpr (is_floating_element_v<T>) {
    using A = gpu_acc_t<T>;
    const cudaStream_t stream = cuda::current_stream();
    const std::int64_t positions = e.batch * e.inner;
    const tensor<T> x = input.contiguous();
    const tensor<std::int64_t> tg = target.contiguous();
    const std::optional<tensor<T>> w = weight ? std::optional<tensor<T>>(weight->contiguous()) : std::nullopt;
    cd::workspace<A> wsum, ws, sums;
    if (w && label_smoothing > 0) {
      wsum = cd::make_workspace<A>(input.device(), 1);
      cd::ce_weight_sum(*w, wsum.get());
    }
    const bool none = reduction == loss_reduction::none;
    if (!none) ws = cd::make_workspace<A>(input.device(), 2 * positions);
    cd::ce_params<T, A> p{x.data(),
                          tg.data(),
                          w ? w->data() : nullptr,
                          none ? loss.data() : nullptr,
                          none ? nullptr : ws.get(),
                          lse ? lse->data() : nullptr,
                          bad_target ? reinterpret_cast<unsigned long long*>(bad_target->data()) : nullptr,
                          w && label_smoothing > 0 ? wsum.get() : nullptr,
                          positions,
                          e.classes,
                          e.inner,
                          ignore_index,
                          static_cast<A>(label_smoothing)};
    if (positions > 0) {
      if (e.inner > 1) {
        cd::ce_spatial_kernel<T><<<cd::elementwise_grid(positions), 256, 0, stream>>>(p);
      } else {
        const bool aligned = cd::aligned16(x.data());
        const int vec = aligned && e.classes % cd::vec_elems<T> == 0 ? cd::vec_elems<T> : 1;
        const std::int64_t nv = (e.classes + vec - 1) / vec;
        const int tpr = static_cast<int>(std::clamp<std::int64_t>(cd::next_pow2((nv + 7) / 8), 1, 512));
        const int threads = std::max(tpr, 256);
        const std::int64_t blocks = std::min<std::int64_t>((positions + threads / tpr - 1) / (threads / tpr), std::int64_t{1} << 30);
        if (vec > 1)
          cd::ce_rows_kernel<T, cd::vec_elems<T>><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p, tpr);
        else
          cd::ce_rows_kernel<T, 1><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p, tpr);
      }
      cd::check_launch("cross_entropy: kernel launch");
    }
    if (!none) {
      sums = cd::make_workspace<A>(input.device(), 2);
      if (positions > 0) {
        cd::reduce_cuda_run(cd::workspace_tensor(ws, 2, positions), {false, true}, sum_reducer<A, A>{sums.get()});
      } else {
        CCGRAPH_CHECK_CUDA(cudaMemsetAsync(sums.get(), 0, 2 * sizeof(A), stream));
      }
      cd::ce_reduce_finish_kernel<T, A><<<1, 32, 0, stream>>>(sums.get(), loss.data(), reduction == loss_reduction::mean);
      cd::check_launch("cross_entropy: reduction kernel launch");
    }
  }
}

/// cross_entropy's backward on the GPU (see cross_entropy_backward_cpu).
template <class T>
void cross_entropy_backward_cuda(const tensor<T>& grad, const tensor<T>& input, const tensor<std::int64_t>& target,
                                 const optional_tensor<T>& weight, loss_reduction reduction, std::int64_t ignore_index,
                                 double label_smoothing, const tensor<norm_stat_t<T>>& lse, const tensor<T>& grad_in,
                                 const tensor<std::int64_t>* bad_target = nullptr) {
  namespace cd = cuda::detail;
  (void)cross_entropy_backward_meta({dtype_v<T>, grad.shape()}, {dtype_v<T>, input.shape()},
                                    {dtype::i64, target.shape()}, meta_of(weight), reduction, label_smoothing);
  const cross_entropy_extent e = cross_entropy_check({dtype_v<T>, input.shape()}, {dtype::i64, target.shape()},
                                                     meta_of(weight), label_smoothing);
  CCGRAPH_CHECK(lse.shape() == e.positions, "cross_entropy_backward: lse of shape ", shape_str(lse.shape()),
                " must have the target's shape ", shape_str(e.positions));
  check_input("cross_entropy_backward", "grad", grad, false);
  check_input("cross_entropy_backward", "input", input, false);
  check_input("cross_entropy_backward", "target", target, false);
  check_input("cross_entropy_backward", "lse", lse, false);
  check_output("cross_entropy_backward", "grad_input", grad_in, input.shape(), false);
  cross_entropy_reset_bad_target(bad_target);
  if constexpr (is_floating_element_v<T>) {
    using A = gpu_acc_t<T>;
    const cudaStream_t stream = cuda::current_stream();
    const std::int64_t positions = e.batch * e.inner;
    if (positions == 0 || e.classes == 0) return;
    const tensor<T> x = input.contiguous();
    const tensor<std::int64_t> tg = target.contiguous();
    const tensor<norm_stat_t<T>> lc = lse.contiguous();
    const tensor<T> gc = grad.contiguous();
    const std::optional<tensor<T>> w = weight ? std::optional<tensor<T>>(weight->contiguous()) : std::nullopt;
    cd::workspace<A> wsum, denom, tw;
    if (w && label_smoothing > 0) {
      wsum = cd::make_workspace<A>(input.device(), 1);
      cd::ce_weight_sum(*w, wsum.get());
    }
    if (reduction == loss_reduction::mean) {
      tw = cd::make_workspace<A>(input.device(), positions);
      denom = cd::make_workspace<A>(input.device(), 1);
      cd::ce_target_weight_kernel<T, A><<<cd::elementwise_grid(positions), 256, 0, stream>>>(
          tg.data(), w ? w->data() : nullptr, tw.get(), positions, e.classes, ignore_index);
      cd::check_launch("cross_entropy_backward: target weight kernel launch");
      cd::reduce_cuda_run(cd::workspace_tensor(tw, 1, positions), {false, true}, sum_reducer<A, A>{denom.get()});
    }
    const cd::ce_backward_params<T, A> p{gc.data(),
                                         x.data(),
                                         tg.data(),
                                         w ? w->data() : nullptr,
                                         lc.data(),
                                         reduction == loss_reduction::mean ? denom.get() : nullptr,
                                         w && label_smoothing > 0 ? wsum.get() : nullptr,
                                         grad_in.data(),
                                         bad_target ? reinterpret_cast<unsigned long long*>(bad_target->data()) : nullptr,
                                         positions,
                                         e.classes,
                                         e.inner,
                                         ignore_index,
                                         static_cast<A>(label_smoothing),
                                         reduction == loss_reduction::none};
    if (e.inner > 1) {
      cd::ce_backward_spatial_kernel<T><<<cd::elementwise_grid(positions * e.classes), 256, 0, stream>>>(p);
    } else {
      const int vec = cd::aligned16(x.data()) && cd::aligned16(grad_in.data()) && e.classes % cd::vec_elems<T> == 0
                          ? cd::vec_elems<T>
                          : 1;
      const std::int64_t nv = (e.classes + vec - 1) / vec;
      const int tpr = static_cast<int>(std::clamp<std::int64_t>(cd::next_pow2((nv + 3) / 4), 1, 512));
      const int threads = std::max(tpr, 256);
      const std::int64_t blocks =
          std::min<std::int64_t>((positions + threads / tpr - 1) / (threads / tpr), std::int64_t{1} << 30);
      if (vec > 1)
        cd::ce_backward_rows_kernel<T, cd::vec_elems<T>><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p, tpr);
      else
        cd::ce_backward_rows_kernel<T, 1><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p, tpr);
    }
    cd::check_launch("cross_entropy_backward: kernel launch");
  }
}

}  // namespace ccgraph::detail

// The graph ops' CUDA runs (ops/loss_ops.hpp); CCGRAPH_CUDA_IMPL_VIA: cuda/reduction.cuh. An
// out-of-range target traps here (no bad_target: reading it would wait for the kernel).
namespace ccgraph {
CCGRAPH_CUDA_IMPL_VIA(cross_entropy, detail::cross_entropy_cuda)
CCGRAPH_CUDA_IMPL_VIA(cross_entropy_backward, detail::cross_entropy_backward_cuda)
}  // namespace ccgraph
