// ccgraph/ops/optimizer_ops.hpp: fused optimizer updates as graph ops. `fused_adamw` updates a
// parameter and AdamW's two running averages in one pass over their elements:
//
//   (param, grad, exp_avg, exp_avg_sq, step_size, bias_sqrt2) -> (param', exp_avg', exp_avg_sq')
//
// reading 4 and writing 3 tensors per element (PyTorch's fused AdamW), where three pointwise
// nodes of one output each (exp_avg', exp_avg_sq', then param' reading both) move 10. cg::optim
// (autograd/optim.hpp) records it eagerly and traced. The element update (adamw_element) is the
// one definition the CPU loop here and the CUDA kernel (<ccgraph/cuda/optimizer.cuh>) share.
//
// It is elementwise (op_traits::elementwise): output k's element i depends only on element i of
// each input (the 0-d scalars broadcast), and a run reads all of element i before writing any of
// it. So the memory planner may write each result straight into the tensor it replaces
// (compile_options::update_inputs), and an eager in-place step passes the parameter and its
// state as the outputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/ops/op_traits.hpp>
#include <ccgraph/ops/reduction_ops.hpp>

namespace ccgraph {

namespace ops {
/// One AdamW step of one parameter (torch.optim.AdamW, amsgrad and maximize off), its inputs
/// (param, grad, exp_avg, exp_avg_sq, step_size, bias_sqrt2): the last two are 0-d values of the
/// compute type (f32 for bf16, f16 and f32 parameters, f64 for f64) holding lr / (1 - beta1^t)
/// and sqrt(1 - beta2^t), so that one recorded graph serves every step. `decay` is
/// 1 - lr * weight_decay. Outputs: the new param, exp_avg and exp_avg_sq.
struct fused_adamw {
  BOOST_HANA_DEFINE_STRUCT(fused_adamw, (double, beta1), (double, beta2), (double, eps), (double, decay));
  static constexpr std::string_view name = "fused_adamw";
};
}  // namespace ops

namespace detail {

/// fused_adamw's attributes in the compute type C, computed once per run.
template <class C>
struct adamw_constants {
  C w;                // 1 - beta1: lerp's weight
  C one_minus_w;      // beta1
  C beta2;
  C one_minus_beta2;  // 1 - beta2
  C eps;
  C decay;            // 1 - lr * weight_decay
  bool lerp_low;      // torch.lerp's formula for a weight below 0.5
};

/// The constants of `o` in C (each rounded once from the double attribute).
template <class C>
adamw_constants<C> adamw_constants_of(const ops::fused_adamw& o) {
  const double w = 1 - o.beta1;
  return {C(w), C(1 - w), C(o.beta2), C(1 - o.beta2), C(o.eps), C(o.decay), w < 0.5};
}

/// One element's AdamW update, computed in C and each stored value rounded to E once:
/// exp_avg' = lerp(exp_avg, g, 1 - beta1) (torch.lerp's two formulas), exp_avg_sq' = beta2 *
/// exp_avg_sq + (1 - beta2) * g * g (addcmul), param' = param * decay - step_size * exp_avg' /
/// (sqrt(exp_avg_sq') / bias_sqrt2 + eps) (addcdiv), reading the rounded averages as PyTorch's
/// fused kernel stores and rereads them. Every input is read before any output is written.
template <class E, class C>
CCGRAPH_HOST_DEVICE inline void adamw_element(E& p, const E g_in, E& m, E& v, const C step_size, const C bias_sqrt2,
                                              const adamw_constants<C>& k) {
  const C g = static_cast<C>(g_in);
  const C mc = static_cast<C>(m);
  const C vc = static_cast<C>(v);
  const E m1 = static_cast<E>(k.lerp_low ? mc + (g - mc) * k.w : g - (g - mc) * k.one_minus_w);
  const E v1 = static_cast<E>(vc * k.beta2 + g * k.one_minus_beta2 * g);
  using std::sqrt;
  const C denom = sqrt(static_cast<C>(v1)) / bias_sqrt2 + k.eps;
  p = static_cast<E>(static_cast<C>(p) * k.decay - step_size * static_cast<C>(m1) / denom);
  m = m1;
  v = v1;
}

/// The dtype fused_adamw's step_size and bias_sqrt2 have for parameters of dtype `d`.
constexpr dtype adamw_scalar_dtype(dtype d) { return d == dtype::f64 ? dtype::f64 : dtype::f32; }

/// Runs `dense(p, g, m, v, step_size, bias_sqrt2, p_out, m_out, v_out, n)` (element pointers of
/// dense operands) for fused_adamw on tensors of any layout: strided inputs are read through a
/// contiguous copy, a strided output is computed apart and copied into. The outputs may be the
/// inputs themselves (an in-place step): each element is read before it is written.
template <class E, class F>
void fused_adamw_dense(const tensor<E>& p, const tensor<E>& g, const tensor<E>& m, const tensor<E>& v,
                       const tensor<compute_t<E>>& step_size, const tensor<compute_t<E>>& bias_sqrt2,
                       const tensor<E>& p_out, const tensor<E>& m_out, const tensor<E>& v_out, const F& dense) {
  const device dev = p_out.device();
  const auto same_device = [&](const auto& t, const char* name) {
    CCGRAPH_CHECK(t.device() == dev, "fused_adamw: ", name, " is on ", t.device(), " but the result is on ", dev);
  };
  same_device(p, "param"), same_device(g, "grad"), same_device(m, "exp_avg"), same_device(v, "exp_avg_sq");
  same_device(step_size, "step_size"), same_device(bias_sqrt2, "bias_sqrt2");
  same_device(m_out, "the exp_avg result"), same_device(v_out, "the exp_avg_sq result");
  const auto dense_in = [](const tensor<E>& t) { return t.is_contiguous() ? t : t.contiguous(); };
  const auto dense_out = [](const tensor<E>& t) {
    return t.is_contiguous() ? t : tensor<E>::empty(t.shape(), t.device());
  };
  const tensor<E> pi = dense_in(p), gi = dense_in(g), mi = dense_in(m), vi = dense_in(v);
  tensor<E> po = dense_out(p_out), mo = dense_out(m_out), vo = dense_out(v_out);
  // data() orders a device stream after work still writing the tensor (a collective's result).
  dense(pi.data(), gi.data(), mi.data(), vi.data(), step_size.data(), bias_sqrt2.data(), po.data(), mo.data(),
        vo.data(), p.numel());
  const auto back = [](const tensor<E>& dst, const tensor<E>& computed) {
    if (dst.is_contiguous()) return;
    tensor<E> d = dst;
    d.copy_(computed);
  };
  back(p_out, po), back(m_out, mo), back(v_out, vo);
}

/// fused_adamw on the CPU: adamw_element over every element, in order.
template <class E>
void fused_adamw_cpu(const ops::fused_adamw& o, const tensor<E>& p, const tensor<E>& g, const tensor<E>& m,
                     const tensor<E>& v, const tensor<compute_t<E>>& step_size, const tensor<compute_t<E>>& bias_sqrt2,
                     const tensor<E>& p_out, const tensor<E>& m_out, const tensor<E>& v_out) {
  using C = compute_t<E>;
  const adamw_constants<C> k = adamw_constants_of<C>(o);
  fused_adamw_dense(p, g, m, v, step_size, bias_sqrt2, p_out, m_out, v_out,
                    [&](const E* pp, const E* gp, const E* mp, const E* vp, const C* ss, const C* bs, E* po, E* mo,
                        E* vo, std::int64_t n) {
                      const C s = *ss, b = *bs;
                      for (std::int64_t i = 0; i < n; ++i) {
                        E pe = pp[i], me = mp[i], ve = vp[i];
                        adamw_element<E, C>(pe, gp[i], me, ve, s, b, k);
                        po[i] = pe, mo[i] = me, vo[i] = ve;
                      }
                    });
}

/// Checks fused_adamw's inputs (the errors name the op and the values): four of one floating
/// dtype and shape, then two 0-d scalars of adamw_scalar_dtype.
CCGRAPH_DECL void check_fused_adamw_inputs(const std::vector<tensor_meta>& in);

}  // namespace detail

template <>
struct op_traits<ops::fused_adamw> : ops::detail::kernel_op_traits {
  using O = ops::fused_adamw;
  /// Output k's element i reads element i of each input only, all of it before any write: the
  /// planner may compute a result straight into the input it replaces.
  static constexpr bool elementwise = true;
  /// An optimizer step is not differentiated: grad through it is an error naming it.
  using gradient = not_differentiable;
  /// The parameter's placement for every result (a sharded parameter updates its shard).
  using sharding = sharding_rules::elementwise;
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    detail::check_fused_adamw_inputs(in);
    return {in[0], in[0], in[0]};
  }
  template <class K>
  static std::vector<any_tensor> run_with(const O& o, const run_args& a, const K& kernel) {
    return ops::detail::visit_input<true>(O::name, a, 0, [&](auto tag) -> std::vector<any_tensor> {
      using E = decltype(tag);
      using C = compute_t<E>;
      auto p = ops::detail::out_at<E>(O::name, a, 0);
      auto m = ops::detail::out_at<E>(O::name, a, 1);
      auto v = ops::detail::out_at<E>(O::name, a, 2);
      kernel(o, ops::detail::in_at<E>(O::name, a, 0), ops::detail::in_at<E>(O::name, a, 1),
             ops::detail::in_at<E>(O::name, a, 2), ops::detail::in_at<E>(O::name, a, 3),
             ops::detail::in_at<C>(O::name, a, 4), ops::detail::in_at<C>(O::name, a, 5), p, m, v);
      return {p, m, v};
    });
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return run_with(o, a, [](const auto&... xs) { detail::fused_adamw_cpu(xs...); });
  }
  /// Memory-bound: 4 tensors read and 3 written, about a dozen vector operations per element.
  static op_cost cost(const O&, const cost_args& a) {
    const double n = double(numel_of(a.in.at(0).shape));
    return op_cost::compute(12 * n, ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::vector);
  }
};

namespace detail {
/// fused_adamw evaluated into `p`, `m` and `v` themselves (an eager in-place step): inference
/// first (its errors, before anything is written), then the op's run with them as outputs.
template <class E>
void fused_adamw_into(const ops::fused_adamw& o, const tensor<E>& p, const tensor<E>& g, const tensor<E>& m,
                      const tensor<E>& v, const tensor<compute_t<E>>& step_size, const tensor<compute_t<E>>& bias_sqrt2) {
  const std::vector<any_tensor> in{p, g, m, v, step_size, bias_sqrt2};
  std::vector<tensor_meta> in_metas;
  for (const any_tensor& t : in) in_metas.push_back(meta_of(t));
  const std::vector<tensor_meta> metas = op_traits<ops::fused_adamw>::infer(o, in_metas, infer_ctx{});
  const std::vector<any_tensor> outs{p, m, v};
  (void)run_op(o, run_args{in, outs, metas, p.device()});
}
}  // namespace detail

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/optimizer_ops.ipp>
#endif
