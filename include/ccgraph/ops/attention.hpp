// ccgraph/ops/attention.hpp: scaled dot-product attention (torch.nn.functional.
// scaled_dot_product_attention), forward and backward: the shape function with PyTorch's errors
// and the CPU reference kernels. The fused CUDA kernels (same signatures, `_cuda`) are in
// <ccgraph/cuda/attention.cuh>.
//
// Semantics (PyTorch's math backend): query [..., L, E], key [..., S, E], value [..., S, Ev]
// with the same leading (batch) dims; out [..., L, Ev] = softmax(q kᵀ · scale + mask) v, scale =
// 1/sqrt(E) unless given. `is_causal` lets query i see keys j <= i (the upper-left aligned
// lower triangle, torch.ones(L, S).tril(), also when L != S); an explicit attn_mask is either
// bool (true = takes part) or additive in the query's dtype, broadcast to [..., L, S]. A row
// whose every score is -inf gives 0, not NaN (PyTorch's _safe_softmax). dropout_p must be 0.
// bf16/f16 compute in float (as PyTorch's math backend upcasts them), f64 in double.
//
// The forward also returns the log-sum-exp of each row's scaled scores, lse = m + log(Σ exp(s -
// m)) (-inf for a fully masked row; float, double for f64): what the backward needs to rebuild
// the probabilities without storing them (flash-attention's saved statistic).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/ops/kernel_checks.hpp>
#include <ccgraph/tensor/strided.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph::detail {

/// The attributes of scaled_dot_product_attention besides its tensors.
struct sdpa_options {
  bool is_causal = false;        ///< query i attends to keys j <= i
  std::optional<double> scale;   ///< multiplies q kᵀ; default 1/sqrt(E)
  double dropout_p = 0.0;        ///< must be 0 (dropout on the probabilities is not implemented)
};

/// The element type of the log-sum-exp statistic: double for f64, float otherwise.
template <class T>
using sdpa_lse_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// The sizes of one attention call, once checked: the batch dims and L, S, E, Ev.
struct sdpa_sizes {
  shape_t batch;
  std::int64_t L = 0, S = 0, E = 0, Ev = 0;
  double scale = 1.0;  ///< resolved (the option, or 1/sqrt(E))
};

/// Checks a scaled_dot_product_attention call (PyTorch's rules, errors naming the shapes) and
/// returns its sizes. `mask`: the attn_mask's dtype and shape, if any.
inline sdpa_sizes sdpa_check(const tensor_meta& q, const tensor_meta& k, const tensor_meta& v,
                             const std::optional<tensor_meta>& mask, const sdpa_options& opt) {
  constexpr const char* what = "scaled_dot_product_attention";
  CCGRAPH_CHECK(opt.dropout_p == 0.0, what, ": dropout_p ", opt.dropout_p,
                " is not supported yet (only 0)");
  CCGRAPH_CHECK(is_floating(q.dtype), what, ": query of dtype ", q.dtype,
                "; expected f32, f64, bf16 or f16");
  CCGRAPH_CHECK(q.dtype == k.dtype && q.dtype == v.dtype, what,
                ": expected query, key and value of the same dtype, got query ", q.dtype, ", key ",
                k.dtype, " and value ", v.dtype);
  CCGRAPH_CHECK(q.shape.size() >= 2 && k.shape.size() >= 2 && v.shape.size() >= 2, what,
                ": query ", shape_str(q.shape), ", key ", shape_str(k.shape), " and value ",
                shape_str(v.shape), " need at least 2 dims ([..., L, E])");
  const std::size_t r = q.shape.size();
  const shape_t batch(q.shape.begin(), q.shape.end() - 2);
  CCGRAPH_CHECK(k.shape.size() == r && v.shape.size() == r &&
                    shape_t(k.shape.begin(), k.shape.end() - 2) == batch &&
                    shape_t(v.shape.begin(), v.shape.end() - 2) == batch,
                what, ": query ", shape_str(q.shape), ", key ", shape_str(k.shape), " and value ",
                shape_str(v.shape), " must have the same batch dims (all but the last two)");
  sdpa_sizes s;
  s.batch = batch;
  s.L = q.shape[r - 2];
  s.E = q.shape[r - 1];
  s.S = k.shape[r - 2];
  s.Ev = v.shape[r - 1];
  CCGRAPH_CHECK(k.shape[r - 1] == s.E, what, ": query ", shape_str(q.shape), " and key ",
                shape_str(k.shape), " must have the same embedding dim (dim -1): ", s.E, " != ",
                k.shape[r - 1]);
  CCGRAPH_CHECK(v.shape[r - 2] == s.S, what, ": key ", shape_str(k.shape), " and value ",
                shape_str(v.shape), " must have the same sequence length (dim -2): ", s.S, " != ",
                v.shape[r - 2]);
  if (mask) {
    CCGRAPH_CHECK(!opt.is_causal, what, ": explicit attn_mask should not be set when is_causal=True");
    CCGRAPH_CHECK(mask->dtype == dtype::boolean || mask->dtype == q.dtype, what, ": attn_mask of dtype ",
                  mask->dtype, " must be bool or the query's dtype ", q.dtype);
    shape_t target = batch;
    target.push_back(s.L);
    target.push_back(s.S);
    bool fits = mask->shape.size() <= target.size();
    for (std::size_t i = 0; fits && i < mask->shape.size(); ++i) {
      const std::int64_t m = mask->shape[mask->shape.size() - 1 - i];
      fits = m == 1 || m == target[target.size() - 1 - i];
    }
    CCGRAPH_CHECK(fits, what, ": attn_mask of shape ", shape_str(mask->shape),
                  " cannot be broadcast to the attention weights' shape ", shape_str(target));
  }
  s.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(s.E));
  return s;
}

/// The shape of scaled_dot_product_attention's output: [..., L, Ev].
inline shape_t sdpa_shape(const tensor_meta& q, const tensor_meta& k, const tensor_meta& v,
                          const std::optional<tensor_meta>& mask, const sdpa_options& opt) {
  const sdpa_sizes s = sdpa_check(q, k, v, mask, opt);
  shape_t out = s.batch;
  out.push_back(s.L);
  out.push_back(s.Ev);
  return out;
}

/// The shape of the forward's log-sum-exp statistic: [..., L].
inline shape_t sdpa_lse_shape(const tensor_meta& q, const tensor_meta& k, const tensor_meta& v,
                              const std::optional<tensor_meta>& mask, const sdpa_options& opt) {
  const sdpa_sizes s = sdpa_check(q, k, v, mask, opt);
  shape_t out = s.batch;
  out.push_back(s.L);
  return out;
}

/// The mask element types: bool (true = attend) or the query's own type (added to the scores).
template <class M, class T>
concept sdpa_mask_element = std::is_same_v<M, bool> || std::is_same_v<M, T>;

/// The mask's strides broadcast to batch + [L, S] (0 along broadcast dims), or all 0 without one.
template <element M>
strides_t sdpa_mask_strides(const std::optional<tensor<M>>& mask, const sdpa_sizes& s) {
  shape_t target = s.batch;
  target.push_back(s.L);
  target.push_back(s.S);
  if (!mask) return strides_t(target.size(), 0);
  return tensor<M>::detail_broadcast_strides(*mask, target);
}

/// The additive value of a mask element: 0 / -inf for bool, the value otherwise.
template <class A, class M>
A sdpa_mask_value(M m) {
  if constexpr (std::is_same_v<M, bool>)
    return m ? A(0) : -std::numeric_limits<A>::infinity();
  else
    return static_cast<A>(static_cast<compute_t<M>>(m));
}

/// The batch strides of `t` (all dims but the last two).
template <element T>
strides_t sdpa_batch_strides(const tensor<T>& t) {
  return strides_t(t.strides().begin(), t.strides().end() - 2);
}

/// Copies rows x cols of `t` at `base` (strides rs, cs) into a row-major buffer of A.
template <class A, class T>
void sdpa_load(const T* base, std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs,
               std::vector<A>& dst) {
  dst.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      dst[static_cast<std::size_t>(i * cols + j)] = static_cast<A>(static_cast<compute_t<T>>(base[i * rs + j * cs]));
}

/// The forward's CPU kernel: out (contiguous [..., L, Ev]) and, when given, lse (contiguous
/// [..., L]). Inputs of any strides; the mask (bool or T) broadcasts. Scores, softmax and the
/// weighted sum in float (double for f64).
template <element T, element M = bool>
  requires sdpa_mask_element<M, T>
void sdpa_cpu(const tensor<T>& q, const tensor<T>& k, const tensor<T>& v, const std::optional<tensor<std::type_identity_t<M>>>& mask,
              const sdpa_options& opt, const tensor<T>& out,
              const std::optional<tensor<sdpa_lse_t<T>>>& lse = std::nullopt) {
  using A = sdpa_lse_t<T>;
  constexpr const char* what = "scaled_dot_product_attention";
  const sdpa_sizes s = sdpa_check(meta_of(q), meta_of(k), meta_of(v), meta_of(mask), opt);
  shape_t out_shape = s.batch, lse_shape = s.batch;
  out_shape.push_back(s.L);
  out_shape.push_back(s.Ev);
  lse_shape.push_back(s.L);
  check_kernel_output(out, out_shape, what);
  if (lse) check_kernel_output(*lse, lse_shape, what, "lse");
  check_same_device(what, device::cpu(), {q.device(), k.device(), v.device(), out.device()});
  if (mask) check_same_device(what, device::cpu(), {mask->device()});
  if (lse) check_same_device(what, device::cpu(), {lse->device()});

  const std::int64_t L = s.L, S = s.S, E = s.E, Ev = s.Ev;
  const A scale = static_cast<A>(s.scale);
  const A ninf = -std::numeric_limits<A>::infinity();
  const strides_t mst = sdpa_mask_strides(mask, s);
  const strides_t mbatch(mst.begin(), mst.end() - 2);
  const std::int64_t mrs = mst[mst.size() - 2], mcs = mst.back();
  const strides_t qb = sdpa_batch_strides(q), kb = sdpa_batch_strides(k), vb = sdpa_batch_strides(v);
  const strides_t ob = contiguous_strides(out_shape), lb = contiguous_strides(lse_shape);
  const strides_t obatch(ob.begin(), ob.end() - 2), lbatch(lb.begin(), lb.end() - 1);
  const std::size_t r = q.shape().size();
  const T* qp = q.data();
  const T* kp = k.data();
  const T* vp = v.data();
  const M* mp = mask ? mask->data() : nullptr;
  T* op = out.data();
  A* lp = lse ? lse->data() : nullptr;
  std::vector<A> kc, vc, qi, sc(static_cast<std::size_t>(S)), acc(static_cast<std::size_t>(Ev));
  for_each_offset<6>(s.batch, {&qb, &kb, &vb, &mbatch, &obatch, &lbatch}, [&](const auto& off) {
    sdpa_load<A>(kp + off[1], S, E, k.strides()[r - 2], k.strides()[r - 1], kc);
    sdpa_load<A>(vp + off[2], S, Ev, v.strides()[r - 2], v.strides()[r - 1], vc);
    for (std::int64_t i = 0; i < L; ++i) {
      sdpa_load<A>(qp + off[0] + i * q.strides()[r - 2], 1, E, 0, q.strides()[r - 1], qi);
      A m = ninf;
      for (std::int64_t j = 0; j < S; ++j) {
        A x = ninf;
        if (!opt.is_causal || j <= i) {
          A dot = 0;
          for (std::int64_t e = 0; e < E; ++e) dot += qi[static_cast<std::size_t>(e)] * kc[static_cast<std::size_t>(j * E + e)];
          x = dot * scale;
          if (mp) x += sdpa_mask_value<A>(mp[off[3] + i * mrs + j * mcs]);
        }
        sc[static_cast<std::size_t>(j)] = x;
        if (x > m || std::isnan(x)) m = std::isnan(m) ? m : x;
      }
      T* orow = op + off[4] + i * Ev;
      if (m == ninf) {  // every key masked: 0, as PyTorch's _safe_softmax
        for (std::int64_t d = 0; d < Ev; ++d) orow[d] = cast<T>(A(0));
        if (lp) lp[off[5] + i] = ninf;
        continue;
      }
      A l = 0;
      std::fill(acc.begin(), acc.end(), A(0));
      for (std::int64_t j = 0; j < S; ++j) {
        const A p = std::exp(sc[static_cast<std::size_t>(j)] - m);
        if (p == A(0)) continue;
        l += p;
        for (std::int64_t d = 0; d < Ev; ++d) acc[static_cast<std::size_t>(d)] += p * vc[static_cast<std::size_t>(j * Ev + d)];
      }
      for (std::int64_t d = 0; d < Ev; ++d) orow[d] = cast<T>(acc[static_cast<std::size_t>(d)] / l);
      if (lp) lp[off[5] + i] = m + std::log(l);
    }
  });
}

/// The backward's argument checks, shared by its CPU and CUDA kernels: the forward's checks,
/// grad_out / out / lse of the forward's output shapes, and grad_q/k/v of q/k/v's shapes.
template <element T, element M>
sdpa_sizes sdpa_backward_check(const tensor<T>& grad_out, const tensor<T>& q, const tensor<T>& k,
                               const tensor<T>& v, const tensor<T>& out, const tensor<sdpa_lse_t<T>>& lse,
                               const std::optional<tensor<M>>& mask, const sdpa_options& opt,
                               const tensor<T>& grad_q, const tensor<T>& grad_k, const tensor<T>& grad_v) {
  constexpr const char* what = "scaled_dot_product_attention_backward";
  const sdpa_sizes s = sdpa_check(meta_of(q), meta_of(k), meta_of(v), meta_of(mask), opt);
  shape_t out_shape = s.batch, lse_shape = s.batch;
  out_shape.push_back(s.L);
  out_shape.push_back(s.Ev);
  lse_shape.push_back(s.L);
  CCGRAPH_CHECK(grad_out.shape() == out_shape && out.shape() == out_shape, what, ": grad_out ",
                shape_str(grad_out.shape()), " and out ", shape_str(out.shape()),
                " must have the forward output's shape ", shape_str(out_shape));
  CCGRAPH_CHECK(lse.shape() == lse_shape, what, ": lse of shape ", shape_str(lse.shape()),
                " for a forward of lse shape ", shape_str(lse_shape));
  check_kernel_output(grad_q, q.shape(), what, "grad_q");
  check_kernel_output(grad_k, k.shape(), what, "grad_k");
  check_kernel_output(grad_v, v.shape(), what, "grad_v");
  return s;
}

/// The backward's CPU kernel: grad_q, grad_k, grad_v (contiguous, the shapes of q, k, v) from
/// grad_out ([..., L, Ev]) and the forward's out and lse, as flash-attention's backward does:
/// P = exp(q kᵀ · scale + mask - lse), dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - rowsum(dO ∘ O)),
/// dQ = dS K · scale, dK = dSᵀ Q · scale. No gradient for the mask.
template <element T, element M = bool>
  requires sdpa_mask_element<M, T>
void sdpa_backward_cpu(const tensor<T>& grad_out, const tensor<T>& q, const tensor<T>& k, const tensor<T>& v,
                       const tensor<T>& out, const tensor<sdpa_lse_t<T>>& lse,
                       const std::optional<tensor<std::type_identity_t<M>>>& mask, const sdpa_options& opt,
                       const tensor<T>& grad_q, const tensor<T>& grad_k, const tensor<T>& grad_v) {
  using A = sdpa_lse_t<T>;
  constexpr const char* what = "scaled_dot_product_attention_backward";
  const sdpa_sizes s = sdpa_backward_check(grad_out, q, k, v, out, lse, mask, opt, grad_q, grad_k, grad_v);
  check_same_device(what, device::cpu(),
                    {grad_out.device(), q.device(), k.device(), v.device(), out.device(), lse.device(),
                     grad_q.device(), grad_k.device(), grad_v.device()});
  if (mask) check_same_device(what, device::cpu(), {mask->device()});

  const std::int64_t L = s.L, S = s.S, E = s.E, Ev = s.Ev;
  const A scale = static_cast<A>(s.scale);
  const A ninf = -std::numeric_limits<A>::infinity();
  const strides_t mst = sdpa_mask_strides(mask, s);
  const strides_t mbatch(mst.begin(), mst.end() - 2);
  const std::int64_t mrs = mst[mst.size() - 2], mcs = mst.back();
  const std::size_t r = q.shape().size();
  const strides_t qb = sdpa_batch_strides(q), kb = sdpa_batch_strides(k), vb = sdpa_batch_strides(v);
  const strides_t gob = sdpa_batch_strides(grad_out), oub = sdpa_batch_strides(out);
  const strides_t lsb(lse.strides().begin(), lse.strides().end() - 1);
  // Outputs are contiguous: their batch offsets are the inputs' shapes' contiguous strides.
  const strides_t dqc = contiguous_strides(q.shape()), dkc = contiguous_strides(k.shape()),
                  dvc = contiguous_strides(v.shape());
  const strides_t dqb(dqc.begin(), dqc.end() - 2), dkb(dkc.begin(), dkc.end() - 2), dvb(dvc.begin(), dvc.end() - 2);
  const T* qp = q.data();
  const T* kp = k.data();
  const T* vp = v.data();
  const T* gp = grad_out.data();
  const T* opp = out.data();
  const A* lp = lse.data();
  const M* mp = mask ? mask->data() : nullptr;
  T* dqp = grad_q.data();
  T* dkp = grad_k.data();
  T* dvp = grad_v.data();
  std::vector<A> kc, vc, qi, gi, oi, dq(static_cast<std::size_t>(E));
  std::vector<A> dk(static_cast<std::size_t>(S * E)), dv(static_cast<std::size_t>(S * Ev));
  for_each_offset<10>(s.batch, {&qb, &kb, &vb, &gob, &oub, &lsb, &mbatch, &dqb, &dkb, &dvb}, [&](const auto& off) {
    sdpa_load<A>(kp + off[1], S, E, k.strides()[r - 2], k.strides()[r - 1], kc);
    sdpa_load<A>(vp + off[2], S, Ev, v.strides()[r - 2], v.strides()[r - 1], vc);
    std::fill(dk.begin(), dk.end(), A(0));
    std::fill(dv.begin(), dv.end(), A(0));
    for (std::int64_t i = 0; i < L; ++i) {
      sdpa_load<A>(qp + off[0] + i * q.strides()[r - 2], 1, E, 0, q.strides()[r - 1], qi);
      sdpa_load<A>(gp + off[3] + i * grad_out.strides()[r - 2], 1, Ev, 0, grad_out.strides()[r - 1], gi);
      sdpa_load<A>(opp + off[4] + i * out.strides()[r - 2], 1, Ev, 0, out.strides()[r - 1], oi);
      const A lse_i = lp[off[5] + i * lse.strides().back()];
      std::fill(dq.begin(), dq.end(), A(0));
      if (lse_i != ninf) {
        A delta = 0;  // rowsum(dO ∘ O)
        for (std::int64_t d = 0; d < Ev; ++d) delta += gi[static_cast<std::size_t>(d)] * oi[static_cast<std::size_t>(d)];
        for (std::int64_t j = 0; j < S; ++j) {
          if (opt.is_causal && j > i) continue;
          const A* kj = kc.data() + j * E;
          const A* vj = vc.data() + j * Ev;
          A dot = 0;
          for (std::int64_t e = 0; e < E; ++e) dot += qi[static_cast<std::size_t>(e)] * kj[e];
          A x = dot * scale;
          if (mp) x += sdpa_mask_value<A>(mp[off[6] + i * mrs + j * mcs]);
          const A p = std::exp(x - lse_i);
          if (p == A(0)) continue;
          A dp = 0;
          for (std::int64_t d = 0; d < Ev; ++d) {
            dv[static_cast<std::size_t>(j * Ev + d)] += p * gi[static_cast<std::size_t>(d)];
            dp += gi[static_cast<std::size_t>(d)] * vj[d];
          }
          const A ds = p * (dp - delta);
          for (std::int64_t e = 0; e < E; ++e) {
            dq[static_cast<std::size_t>(e)] += ds * kj[e];
            dk[static_cast<std::size_t>(j * E + e)] += ds * qi[static_cast<std::size_t>(e)];
          }
        }
      }
      T* dqrow = dqp + off[7] + i * E;
      for (std::int64_t e = 0; e < E; ++e) dqrow[e] = cast<T>(dq[static_cast<std::size_t>(e)] * scale);
    }
    for (std::int64_t j = 0; j < S; ++j) {
      for (std::int64_t e = 0; e < E; ++e)
        dkp[off[8] + j * E + e] = cast<T>(dk[static_cast<std::size_t>(j * E + e)] * scale);
      for (std::int64_t d = 0; d < Ev; ++d) dvp[off[9] + j * Ev + d] = cast<T>(dv[static_cast<std::size_t>(j * Ev + d)]);
    }
  });
}

}  // namespace ccgraph::detail
