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
//
// Graph ops (the end of this file): ops::scaled_dot_product_attention (outputs out and lse) and
// its backward, with their op_traits (inference by sdpa_check, runs by the CPU kernels here and
// the fused CUDA ones through cuda_impl in cuda/attention.cuh), and the public functions, generic
// over tensors and traced values.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/ops/compute_ops.hpp>
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

// ---- graph ops ---------------------------------------------------------------------------------

namespace ccgraph {
namespace ops {
/// torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
/// scale). Inputs: q, k, v and the mask when there is one (bool or q's dtype). Outputs: out
/// [..., L, Ev] and the log-sum-exp [..., L] (f32; f64 for f64) the backward reads.
struct scaled_dot_product_attention {
  BOOST_HANA_DEFINE_STRUCT(scaled_dot_product_attention, (double, dropout_p), (bool, is_causal),
                           (std::optional<double>, scale));
  static constexpr std::string_view name = "scaled_dot_product_attention";
};
/// Its backward. Inputs: grad_out, q, k, v, out, lse and the mask when there is one. Outputs:
/// grad_q, grad_k, grad_v (no gradient for the mask).
struct scaled_dot_product_attention_backward {
  BOOST_HANA_DEFINE_STRUCT(scaled_dot_product_attention_backward, (double, dropout_p), (bool, is_causal),
                           (std::optional<double>, scale));
  static constexpr std::string_view name = "scaled_dot_product_attention_backward";
};
}  // namespace ops

namespace detail {

/// The kernels' options from either op's attributes.
template <class O>
sdpa_options sdpa_options_of(const O& o) {
  sdpa_options opt;
  opt.is_causal = o.is_causal;
  opt.scale = o.scale;
  opt.dropout_p = o.dropout_p;
  return opt;
}

/// Calls `f(mask)` with input `at` as a std::optional<tensor<M>> (M bool or T), or an empty
/// std::optional<tensor<bool>> when the node has no input `at`.
template <class T, class F>
void visit_sdpa_mask(const run_args& a, std::size_t at, const char* what, F&& f) {
  if (a.in.size() <= at) {
    f(std::optional<tensor<bool>>());
  } else if (::ccgraph::meta_of(a.in[at]).dtype == dtype::boolean) {
    f(std::optional<tensor<bool>>(get_tensor<bool>(a.in[at], what)));
  } else {
    f(std::optional<tensor<T>>(get_tensor<T>(a.in[at], what)));
  }
}

/// The metadata of input `at`, if the node has it.
inline std::optional<tensor_meta> optional_meta(const std::vector<tensor_meta>& in, std::size_t at) {
  return in.size() > at ? std::optional<tensor_meta>(in[at]) : std::nullopt;
}

/// The element type of the log-sum-exp for inputs of dtype `dt`.
inline dtype sdpa_lse_dtype(dtype dt) { return dt == dtype::f64 ? dtype::f64 : dtype::f32; }

/// The runs of attention's forward and backward given their kernels (`Kernels::forward(q, k, v,
/// mask, opt, out, lse)`, `Kernels::backward(...)`, the kernels' own argument lists): the CPU
/// ones below, the CUDA ones in cuda/attention.cuh.
template <class Kernels>
struct attention_op_runs {
  static std::vector<any_tensor> run(const ops::scaled_dot_product_attention& o, const run_args& a) {
    using O = ops::scaled_dot_product_attention;
    return visit_dtype(a.metas.at(0).dtype, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      if constexpr (!std::is_floating_point_v<compute_t<T>>) {
        CCGRAPH_THROW(error, O::name, ": query of dtype ", dtype_v<T>, "; expected f32, f64, bf16 or f16");
      } else {
        const char* what = O::name.data();
        auto out = ops::detail::out_or_new<T>(O::name, a, 0);
        auto lse = ops::detail::out_or_new<sdpa_lse_t<T>>(O::name, a, 1);
        visit_sdpa_mask<T>(a, 3, what, [&](const auto& mask) {
          Kernels::forward(get_tensor<T>(a.in.at(0), what), get_tensor<T>(a.in.at(1), what),
                           get_tensor<T>(a.in.at(2), what), mask, sdpa_options_of(o), out,
                           std::optional<tensor<sdpa_lse_t<T>>>(lse));
        });
        return {out, lse};
      }
    });
  }
  static std::vector<any_tensor> run(const ops::scaled_dot_product_attention_backward& o, const run_args& a) {
    using O = ops::scaled_dot_product_attention_backward;
    return visit_dtype(a.metas.at(0).dtype, [&](auto tag) -> std::vector<any_tensor> {
      using T = decltype(tag);
      if constexpr (!std::is_floating_point_v<compute_t<T>>) {
        CCGRAPH_THROW(error, O::name, ": query of dtype ", dtype_v<T>, "; expected f32, f64, bf16 or f16");
      } else {
        const char* what = O::name.data();
        auto gq = ops::detail::out_or_new<T>(O::name, a, 0);
        auto gk = ops::detail::out_or_new<T>(O::name, a, 1);
        auto gv = ops::detail::out_or_new<T>(O::name, a, 2);
        visit_sdpa_mask<T>(a, 6, what, [&](const auto& mask) {
          Kernels::backward(get_tensor<T>(a.in.at(0), what), get_tensor<T>(a.in.at(1), what),
                            get_tensor<T>(a.in.at(2), what), get_tensor<T>(a.in.at(3), what),
                            get_tensor<T>(a.in.at(4), what), get_tensor<sdpa_lse_t<T>>(a.in.at(5), what), mask,
                            sdpa_options_of(o), gq, gk, gv);
        });
        return {gq, gk, gv};
      }
    });
  }
};

/// The CPU kernels, for attention_op_runs.
struct attention_cpu_kernels {
  template <class T, class M>
  static void forward(const tensor<T>& q, const tensor<T>& k, const tensor<T>& v, const std::optional<tensor<M>>& mask,
                      const sdpa_options& opt, const tensor<T>& out, const std::optional<tensor<sdpa_lse_t<T>>>& lse) {
    sdpa_cpu<T, M>(q, k, v, mask, opt, out, lse);
  }
  template <class T, class M>
  static void backward(const tensor<T>& grad_out, const tensor<T>& q, const tensor<T>& k, const tensor<T>& v,
                       const tensor<T>& out, const tensor<sdpa_lse_t<T>>& lse, const std::optional<tensor<M>>& mask,
                       const sdpa_options& opt, const tensor<T>& grad_q, const tensor<T>& grad_k,
                       const tensor<T>& grad_v) {
    sdpa_backward_cpu<T, M>(grad_out, q, k, v, out, lse, mask, opt, grad_q, grad_k, grad_v);
  }
};

/// What both attention ops' traits share: compute ops writing new tensors, run by the CPU
/// kernels here and by cuda_impl on devices.
struct attention_traits_common {
  static constexpr op_category category = op_category::compute;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::cuda_impl;  // cuda/attention.cuh
  template <class O>
  static std::vector<any_tensor> run(const O& o, const run_args& a) {
    return attention_op_runs<attention_cpu_kernels>::run(o, a);
  }
  using gradient = gradient_todo;
  using sharding = sharding_todo;
};

/// The FLOPs of attention's two products (q kᵀ and p v) over the keys each query sees (half of
/// them, about, when causal), for sizes `s`.
inline double sdpa_flops(const sdpa_sizes& s, bool causal, double e_factor, double ev_factor) {
  const double pairs = double(numel_of(s.batch)) * double(s.L) * double(s.S) * (causal ? 0.5 : 1.0);
  return 2.0 * pairs * (e_factor * double(s.E) + ev_factor * double(s.Ev));
}

}  // namespace detail

template <>
struct op_traits<ops::scaled_dot_product_attention> : detail::attention_traits_common {
  using sharding = sharding_rules::sdpa;
  using O = ops::scaled_dot_product_attention;
  /// scaled_dot_product_attention_backward from the saved out and lse (flash attention's
  /// recomputation: no [L, S] matrix is kept). The lse carries no gradient; neither does the
  /// mask (as PyTorch's flash and memory-efficient kernels): a differentiated mask is an error.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      using T = typename C::value_type;
      using S = detail::sdpa_lse_t<T>;
      CCGRAPH_CHECK(!c.has_grad(1), "grad: scaled_dot_product_attention (node %", c.current().name(),
                    "): its lse output is not differentiated");
      const bool masked = c.num_inputs() == 4;
      CCGRAPH_CHECK(!masked || !c.needs_grad(3), "grad: scaled_dot_product_attention (node %", c.current().name(),
                    "): attn_mask takes no gradient; pass a mask that does not depend on a differentiated input");
      const auto q = c.input(0), k = c.input(1), v = c.input(2), out = c.output(0);
      const auto lse = c.template output<S>(1);
      const auto [gq, gk, gv] = [&] {
        if (!masked) return scaled_dot_product_attention_backward(c.grad(), q, k, v, out, lse, o.dropout_p, o.is_causal, o.scale);
        const auto& m = c.current().args()[3];
        if (m.src->meta(m.index).dtype == dtype::boolean)
          return scaled_dot_product_attention_backward(c.grad(), q, k, v, out, lse, c.template input<bool>(3),
                                                       o.dropout_p, o.is_causal, o.scale);
        return scaled_dot_product_attention_backward(c.grad(), q, k, v, out, lse, c.input(3), o.dropout_p,
                                                     o.is_causal, o.scale);
      }();
      c.add_grad(0, gq);
      c.add_grad(1, gk);
      c.add_grad(2, gv);
    }
  };
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    CCGRAPH_CHECK(in.size() == 3 || in.size() == 4, O::name,
                  ": expects 3 or 4 input(s) (query, key, value, attn_mask), got ", in.size());
    const auto opt = detail::sdpa_options_of(o);
    const auto mask = detail::optional_meta(in, 3);
    return {{in[0].dtype, detail::sdpa_shape(in[0], in[1], in[2], mask, opt)},
            {detail::sdpa_lse_dtype(in[0].dtype), detail::sdpa_lse_shape(in[0], in[1], in[2], mask, opt)}};
  }
  /// The two products' FLOPs at the dtype's matmul peak; inputs and outputs as bytes (a fused
  /// kernel never writes the scores).
  static op_cost cost(const O& o, const cost_args& a) {
    const auto s = detail::sdpa_check(a.in.at(0), a.in.at(1), a.in.at(2), detail::optional_meta(a.in, 3),
                                      detail::sdpa_options_of(o));
    return op_cost::compute(detail::sdpa_flops(s, o.is_causal, 1, 1),
                            ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::matmul,
                            a.in[0].dtype);
  }
};

template <>
struct op_traits<ops::scaled_dot_product_attention_backward> : detail::attention_traits_common {
  using O = ops::scaled_dot_product_attention_backward;
  /// sdpa_backward_check's rules (the kernels' own), run on storage-less tensors of the metas.
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&);
  /// Five products (q kᵀ again, dV, dP, dQ, dK) at the dtype's matmul peak; inputs and outputs
  /// as bytes.
  static op_cost cost(const O& o, const cost_args& a) {
    const auto s = detail::sdpa_check(a.in.at(1), a.in.at(2), a.in.at(3), detail::optional_meta(a.in, 6),
                                      detail::sdpa_options_of(o));
    return op_cost::compute(detail::sdpa_flops(s, o.is_causal, 3, 2),
                            ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::matmul,
                            a.in[1].dtype);
  }
};

/// scaled_dot_product_attention with its log-sum-exp: (out [..., L, Ev], lse [..., L]), lse
/// f32 (f64 for f64), what the backward reads. See scaled_dot_product_attention.
template <detail::op_value V>
auto scaled_dot_product_attention_with_lse(const V& q, const V& k, const V& v, double dropout_p = 0.0,
                                           bool is_causal = false, std::optional<double> scale = std::nullopt) {
  using T = typename V::value_type;
  return detail::apply_op_n<T, detail::sdpa_lse_t<T>>(ops::scaled_dot_product_attention{dropout_p, is_causal, scale},
                                                      q, k, v);
}

/// scaled_dot_product_attention_with_lse with an attn_mask (bool, true = attends, or additive
/// in q's dtype; broadcast to [..., L, S]).
template <detail::op_value V, detail::op_value M>
auto scaled_dot_product_attention_with_lse(const V& q, const V& k, const V& v, const M& attn_mask,
                                           double dropout_p = 0.0, bool is_causal = false,
                                           std::optional<double> scale = std::nullopt) {
  using T = typename V::value_type;
  return detail::apply_op_n<T, detail::sdpa_lse_t<T>>(ops::scaled_dot_product_attention{dropout_p, is_causal, scale},
                                                      q, k, v, attn_mask);
}

/// softmax(q kᵀ · scale) v for q [..., L, E], k [..., S, E], v [..., S, Ev]: [..., L, Ev]
/// (torch.nn.functional.scaled_dot_product_attention; scale 1/sqrt(E) unless given; is_causal:
/// query i sees keys j <= i; dropout_p must be 0). On tensors it runs now, on traced values it
/// records a `scaled_dot_product_attention` node (whose second output is the log-sum-exp).
template <detail::op_value V>
V scaled_dot_product_attention(const V& q, const V& k, const V& v, double dropout_p = 0.0, bool is_causal = false,
                               std::optional<double> scale = std::nullopt) {
  return std::get<0>(scaled_dot_product_attention_with_lse(q, k, v, dropout_p, is_causal, scale));
}

/// scaled_dot_product_attention with an attn_mask (bool, true = attends, or additive in q's
/// dtype; broadcast to [..., L, S]; not with is_causal).
template <detail::op_value V, detail::op_value M>
V scaled_dot_product_attention(const V& q, const V& k, const V& v, const M& attn_mask, double dropout_p = 0.0,
                               bool is_causal = false, std::optional<double> scale = std::nullopt) {
  return std::get<0>(scaled_dot_product_attention_with_lse(q, k, v, attn_mask, dropout_p, is_causal, scale));
}

/// scaled_dot_product_attention's backward: (grad_q, grad_k, grad_v) from grad_out and the
/// forward's inputs, out and lse (flash-attention's recomputation; same options as the forward).
template <detail::op_value V, detail::op_value L>
auto scaled_dot_product_attention_backward(const V& grad_out, const V& q, const V& k, const V& v, const V& out,
                                           const L& lse, double dropout_p = 0.0, bool is_causal = false,
                                           std::optional<double> scale = std::nullopt) {
  using T = typename V::value_type;
  return detail::apply_op_n<T, T, T>(ops::scaled_dot_product_attention_backward{dropout_p, is_causal, scale},
                                     grad_out, q, k, v, out, lse);
}

/// The backward of a masked forward (the same attn_mask).
template <detail::op_value V, detail::op_value L, detail::op_value M>
auto scaled_dot_product_attention_backward(const V& grad_out, const V& q, const V& k, const V& v, const V& out,
                                           const L& lse, const M& attn_mask, double dropout_p = 0.0,
                                           bool is_causal = false, std::optional<double> scale = std::nullopt) {
  using T = typename V::value_type;
  return detail::apply_op_n<T, T, T>(ops::scaled_dot_product_attention_backward{dropout_p, is_causal, scale},
                                     grad_out, q, k, v, out, lse, attn_mask);
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/attention.ipp>
#endif
