// ccgraph/autograd/optim.hpp: optimizers as graph ops. SGD (momentum, weight decay, Nesterov)
// and AdamW with torch.optim's semantics, written once over a value type V that is either a
// tensor<T> (eager) or a symbolic<T> (inside cg::trace). Each new parameter and each new state
// tensor is one fused pointwise expression: eagerly one loop (one kernel on a GPU) per output,
// traced one pointwise node per output, so forward + backward (cg::value_and_grad) + the update
// trace to one graph that cg::schedule, cg::compile and cg::compile_function take.
//
// In place or not: cg::optim::step is functional (it returns new parameters and a new state),
// eagerly and traced. cg::optim::step_ updates tensors in place, eagerly: each fused expression
// is evaluated straight into the parameter's (or state tensor's) own memory. A traced step
// returns new values; compile it with compile_options::update_inputs to have the compiled graph
// write them into the tensors passed in (runtime/executor.hpp): each update's node runs after
// every other read of the value it replaces, so the memory planner has it write there directly.
//
// AdamW updates each parameter with one fused_adamw op (ops/optimizer_ops.hpp: one kernel
// reading param, grad and both averages and writing the three new tensors, 7 accesses per
// element where three single-output pointwise nodes make 10, as PyTorch's fused AdamW), after
// three 0-d pointwise nodes per step for the step count and its two bias corrections. Eagerly
// in place, the op writes straight into the parameter and its state.
//
// bf16 and f16 parameters: AdamW's update is computed in f32 per element and rounded once when
// stored (as PyTorch's fused AdamW), and its step count is an f32 tensor (a bf16 count stops at
// 256). SGD runs op by op in the parameters' type, its scalars in f32, as torch's foreach SGD.
//
// Everything here is a template instantiated where an optimizer runs: including this header
// compiles no update.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/expr/expr.hpp>
#include <ccgraph/ops/optimizer_ops.hpp>
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/tensor/tensor.hpp>
#include <ccgraph/trace/ops.hpp>
#include <ccgraph/trace/symbolic.hpp>

namespace ccgraph::optim {

/// A value the optimizers update: a tensor<T> (eager) or a symbolic<T> (traced).
template <class V>
concept value = is_tensor_v<V> || is_symbolic_v<V>;

/// torch.optim.SGD's options (dampening 0, maximize off): with weight decay wd, momentum mu and
/// buffer b (zeros before the first step, which equals PyTorch's b = d on the first step),
/// d = g + wd * p; b = mu * b + d; p -= lr * (nesterov ? d + mu * b : b). Momentum 0 keeps no
/// buffer: p -= lr * d.
struct sgd_options {
  /// Learning rate.
  double lr = 1e-3;
  /// Momentum factor (0: plain SGD, no buffer).
  double momentum = 0.0;
  /// L2 penalty added to the gradient (coupled, as torch.optim.SGD).
  double weight_decay = 0.0;
  /// Nesterov momentum (needs momentum > 0).
  bool nesterov = false;
};

/// torch.optim.AdamW's options (amsgrad and maximize off). Step t counts from 1:
/// m = lerp(m, g, 1 - beta1); v = beta2 * v + (1 - beta2) * g * g;
/// p = p * (1 - lr * weight_decay) - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
struct adamw_options {
  /// Learning rate.
  double lr = 1e-3;
  /// Decay of the first moment's running average.
  double beta1 = 0.9;
  /// Decay of the second moment's running average.
  double beta2 = 0.999;
  /// Added to the bias-corrected sqrt of the second moment (outside the sqrt, as PyTorch).
  double eps = 1e-8;
  /// Decoupled weight decay: p is scaled by 1 - lr * weight_decay before the Adam update.
  double weight_decay = 1e-2;
};

/// SGD's state: one momentum buffer per parameter (none when momentum is 0).
template <value V>
struct sgd_state {
  /// torch's momentum_buffer of each parameter, in parameter order.
  std::vector<V> momentum_buffer;

  /// The state's tensors in order (the momentum buffers), e.g. to pass them to a traced step.
  std::vector<V> tensors() const { return momentum_buffer; }
  /// The state from tensors() (e.g. a traced step's inputs).
  static sgd_state from_tensors(std::vector<V> ts) { return {std::move(ts)}; }
};

namespace detail {
template <class V, class U>
struct rebind_value;
template <class T, class U>
struct rebind_value<tensor<T>, U> {
  using type = tensor<U>;
};
template <class T, class U>
struct rebind_value<symbolic<T>, U> {
  using type = symbolic<U>;
};
}  // namespace detail

/// The type of AdamW's step count for parameters of value type V: V's kind (tensor or symbolic)
/// of compute_t of their element type, so f32 for bf16/f16 parameters (a bf16 count would stop
/// at 256, the last integer after which bf16 cannot add 1) and the parameters' own type else.
template <value V>
using step_value_t = typename detail::rebind_value<V, compute_t<typename V::value_type>>::type;

/// AdamW's state: the step count (a 0-d tensor, so a traced step reads it and one graph serves
/// every step) and the two running averages of each parameter.
template <value V>
struct adamw_state {
  /// The step count's type (step_value_t: f32 for bf16/f16 parameters).
  using step_type = step_value_t<V>;
  /// Steps taken so far (0-d; PyTorch's `step`).
  step_type step;
  /// First moment running average of each parameter, in parameter order.
  std::vector<V> exp_avg;
  /// Second moment running average of each parameter, in parameter order.
  std::vector<V> exp_avg_sq;

  /// The state's tensors in order: step, then exp_avg, then exp_avg_sq (when step has the
  /// parameters' type; for bf16/f16 parameters use step and averages()).
  std::vector<V> tensors() const
    requires std::is_same_v<step_type, V>
  {
    std::vector<V> out{step};
    out.insert(out.end(), exp_avg.begin(), exp_avg.end());
    out.insert(out.end(), exp_avg_sq.begin(), exp_avg_sq.end());
    return out;
  }
  /// The state from tensors() (e.g. a traced step's inputs): step, n exp_avg, n exp_avg_sq.
  static adamw_state from_tensors(const std::vector<V>& ts)
    requires std::is_same_v<step_type, V>
  {
    CCGRAPH_CHECK(ts.size() % 2 == 1, "optim::adamw_state::from_tensors: expected step and two tensors per "
                  "parameter (an odd count), got ", ts.size(), " tensors");
    return from_averages(ts[0], std::vector<V>(ts.begin() + 1, ts.end()));
  }
  /// The running averages in order: exp_avg, then exp_avg_sq.
  std::vector<V> averages() const {
    std::vector<V> out(exp_avg);
    out.insert(out.end(), exp_avg_sq.begin(), exp_avg_sq.end());
    return out;
  }
  /// The state from a step count and averages() (n exp_avg, then n exp_avg_sq).
  static adamw_state from_averages(step_type step, const std::vector<V>& avgs) {
    CCGRAPH_CHECK(avgs.size() % 2 == 0, "optim::adamw_state::from_averages: expected two tensors per parameter "
                  "(an even count), got ", avgs.size(), " tensors");
    const auto n = static_cast<std::ptrdiff_t>(avgs.size() / 2);
    return {std::move(step), std::vector<V>(avgs.begin(), avgs.begin() + n), std::vector<V>(avgs.begin() + n, avgs.end())};
  }
};

/// What cg::optim::step returns: the new parameters (in order) and the new state.
template <value V, class State>
struct step_result {
  /// The updated parameters.
  std::vector<V> params;
  /// The updated state.
  State state;
};

namespace detail {

/// Zeros of x's shape and type, on x's device.
template <element T>
tensor<T> zeros_like(const tensor<T>& x) {
  auto z = tensor<T>::empty(x.shape(), x.device());
  z.fill_(T(0));
  return z;
}

/// Checks the options of `what` ("optim::sgd", "optim::adamw").
inline void check_options(const sgd_options& o, std::string_view what) {
  CCGRAPH_CHECK(o.lr >= 0, what, ": lr must be >= 0, got ", o.lr);
  CCGRAPH_CHECK(o.momentum >= 0, what, ": momentum must be >= 0, got ", o.momentum);
  CCGRAPH_CHECK(o.weight_decay >= 0, what, ": weight_decay must be >= 0, got ", o.weight_decay);
  CCGRAPH_CHECK(!o.nesterov || o.momentum > 0, what, ": nesterov needs momentum > 0, got momentum ", o.momentum);
}
inline void check_options(const adamw_options& o, std::string_view what) {
  CCGRAPH_CHECK(o.lr >= 0, what, ": lr must be >= 0, got ", o.lr);
  CCGRAPH_CHECK(o.beta1 >= 0 && o.beta1 < 1, what, ": beta1 must be in [0, 1), got ", o.beta1);
  CCGRAPH_CHECK(o.beta2 >= 0 && o.beta2 < 1, what, ": beta2 must be in [0, 1), got ", o.beta2);
  CCGRAPH_CHECK(o.eps >= 0, what, ": eps must be >= 0, got ", o.eps);
  CCGRAPH_CHECK(o.weight_decay >= 0, what, ": weight_decay must be >= 0, got ", o.weight_decay);
}

/// Checks that `xs` (named `name`) has one tensor per parameter, each of its parameter's shape.
template <class V>
void check_like(std::string_view what, const std::vector<V>& params, const std::vector<V>& xs, std::string_view name) {
  CCGRAPH_CHECK(xs.size() == params.size(), what, ": ", params.size(), " params but ", xs.size(), " ", name);
  for (std::size_t i = 0; i < xs.size(); ++i)
    CCGRAPH_CHECK(xs[i].shape() == params[i].shape(), what, ": ", name, "[", i, "] has shape ", shape_str(xs[i].shape()),
                  " but params[", i, "] has shape ", shape_str(params[i].shape()));
}

/// Where an update's results go. `functional` makes each a new value (a fused node when traced);
/// `in_place` evaluates each into the tensor it replaces (eager only).
struct functional {
  template <class V, class E>
  V operator()(const V&, const E& e) const {
    return V(e);
  }
};
struct in_place {
  template <element T, class E>
  tensor<T> operator()(const tensor<T>& dst, const E& e) const {
    ::ccgraph::detail::evaluate_into(e, dst);
    return dst;
  }
};

/// One SGD step over every parameter; each result goes through `store(old, expression)`.
template <class V, class Store>
step_result<V, sgd_state<V>> sgd(const std::vector<V>& params, const std::vector<V>& grads, const sgd_state<V>& state,
                                 const sgd_options& o, Store store, std::string_view what) {
  check_options(o, what);
  check_like(what, params, grads, "grads");
  if (o.momentum > 0) check_like(what, params, state.momentum_buffer, "momentum buffers");
  // Parameters in the order their gradients are computed (production_order): traced, each
  // update can run as soon as its gradient exists, beside the collectives of later ones.
  std::vector<std::optional<V>> np(params.size()), nb(params.size());
  for (const std::size_t i : production_order(grads)) {
    const V& p = params[i];
    // d: the gradient plus the weight decay, inlined into each update's expression (weight decay
    // 0 adds nothing, as PyTorch skips it).
    auto update = [&](const auto& d) {
      if (o.momentum == 0) {
        np[i].emplace(store(p, p - d * o.lr));
        return;
      }
      const V& b = state.momentum_buffer[i];
      nb[i].emplace(store(b, b * o.momentum + d));
      // (in place, p's update reads the buffer just written, as PyTorch's does)
      if (o.nesterov)
        np[i].emplace(store(p, p - (d + *nb[i] * o.momentum) * o.lr));
      else
        np[i].emplace(store(p, p - *nb[i] * o.lr));
    };
    if (o.weight_decay != 0)
      update(grads[i] + p * o.weight_decay);
    else
      update(grads[i]);
  }
  step_result<V, sgd_state<V>> r;
  for (std::size_t i = 0; i < params.size(); ++i) {
    r.params.push_back(std::move(*np[i]));
    if (o.momentum != 0) r.state.momentum_buffer.push_back(std::move(*nb[i]));
  }
  return r;
}

/// One AdamW step over every parameter: the step count through `store(old, expression)`, each
/// parameter's update as one fused_adamw (into the tensors themselves when `Store` is in_place).
template <class V, class Store>
step_result<V, adamw_state<V>> adamw(const std::vector<V>& params, const std::vector<V>& grads,
                                     const adamw_state<V>& state, const adamw_options& o, Store store,
                                     std::string_view what) {
  check_options(o, what);
  check_like(what, params, grads, "grads");
  check_like(what, params, state.exp_avg, "exp_avg");
  check_like(what, params, state.exp_avg_sq, "exp_avg_sq");
  CCGRAPH_CHECK(state.step.shape().empty(), what, ": the state's step must be 0-d, got shape ",
                shape_str(state.step.shape()));
  const auto t = store(state.step, state.step + 1.0);
  step_result<V, adamw_state<V>> r{{}, {t, {}, {}}};  // (a symbolic value has no default)
  // The step's scalars, lr / (1 - beta1^t) and sqrt(1 - beta2^t), computed once as 0-d values of
  // the compute type (f32 for bf16 parameters): inside the update they were two pows per
  // element, which made it compute-bound (0.9 ms for 67M bf16 elements on an H200).
  using S = std::decay_t<decltype(state.step)>;
  const S step_size(o.lr / (1.0 - ::ccgraph::pow(o.beta1, t)));
  const S bias_sqrt2(::ccgraph::sqrt(1.0 - ::ccgraph::pow(o.beta2, t)));
  const ops::fused_adamw op{o.beta1, o.beta2, o.eps, 1 - o.lr * o.weight_decay};
  // Parameters in the order their gradients are computed (production_order): traced, each
  // update can run as soon as its gradient exists, beside the collectives of later ones.
  std::vector<std::optional<V>> np(params.size()), nm(params.size()), nv(params.size());
  for (const std::size_t i : production_order(grads)) {
    const V &p = params[i], &m = state.exp_avg[i], &v = state.exp_avg_sq[i];
    if constexpr (std::is_same_v<Store, in_place>) {
      ::ccgraph::detail::fused_adamw_into(op, p, grads[i], m, v, step_size, bias_sqrt2);
      np[i].emplace(p), nm[i].emplace(m), nv[i].emplace(v);
    } else {
      using E = typename V::value_type;
      auto [p1, m1, v1] = ::ccgraph::detail::apply_op_n<E, E, E>(op, p, grads[i], m, v, step_size, bias_sqrt2);
      np[i].emplace(std::move(p1)), nm[i].emplace(std::move(m1)), nv[i].emplace(std::move(v1));
    }
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    r.params.push_back(std::move(*np[i]));
    r.state.exp_avg.push_back(std::move(*nm[i]));
    r.state.exp_avg_sq.push_back(std::move(*nv[i]));
  }
  return r;
}

}  // namespace detail

/// Zero momentum buffers for `params` (none when momentum is 0), on each parameter's device.
template <element T>
sgd_state<tensor<T>> init(const std::vector<tensor<T>>& params, const sgd_options& o) {
  detail::check_options(o, "optim::init(sgd)");
  sgd_state<tensor<T>> s;
  if (o.momentum > 0)
    for (const auto& p : params) s.momentum_buffer.push_back(detail::zeros_like(p));
  return s;
}

/// AdamW's initial state for `params`: step 0 and zero running averages, on the parameters'
/// device (the first parameter's for step; at least one parameter is needed).
template <element T>
adamw_state<tensor<T>> init(const std::vector<tensor<T>>& params, const adamw_options& o) {
  detail::check_options(o, "optim::init(adamw)");
  CCGRAPH_CHECK(!params.empty(), "optim::init(adamw): no params");
  adamw_state<tensor<T>> s{tensor<compute_t<T>>::empty({}, params[0].device()), {}, {}};
  s.step.fill_(0);
  for (const auto& p : params) {
    s.exp_avg.push_back(detail::zeros_like(p));
    s.exp_avg_sq.push_back(detail::zeros_like(p));
  }
  return s;
}

/// One SGD step, functional: the new parameters and state (the inputs are not written). With
/// tensors it runs at once; with symbolic values (inside cg::trace) it records one fused
/// pointwise node per new parameter and per new momentum buffer.
template <value V>
step_result<V, sgd_state<V>> step(const std::vector<V>& params, const std::vector<V>& grads,
                                  const sgd_state<V>& state, const sgd_options& o) {
  return detail::sgd(params, grads, state, o, detail::functional{}, "optim::step(sgd)");
}

/// One AdamW step, functional: the new parameters and state (step + 1, the new averages). With
/// tensors it runs at once; with symbolic values (inside cg::trace) it records three 0-d
/// pointwise nodes (the step count and its two bias corrections) and one fused_adamw node per
/// parameter, giving its new value and averages.
template <value V>
step_result<V, adamw_state<V>> step(const std::vector<V>& params, const std::vector<V>& grads,
                                    const adamw_state<V>& state, const adamw_options& o) {
  return detail::adamw(params, grads, state, o, detail::functional{}, "optim::step(adamw)");
}

namespace detail {
/// Checks, before anything is written, that every tensor step_ overwrites can take its update:
/// one whose elements share memory (stride 0 on a dim of several elements, as an expanded
/// tensor imported with from_blob or DLPack has) would take every write at once.
template <element T>
void check_writable(const std::vector<tensor<T>>& xs, std::string_view what, std::string_view name) {
  for (std::size_t i = 0; i < xs.size(); ++i)
    for (std::size_t d = 0; d < xs[i].shape().size(); ++d)
      CCGRAPH_CHECK(xs[i].shape()[d] <= 1 || xs[i].strides()[d] != 0, what, ": cannot update ", name, "[", i,
                    "] (shape ", shape_str(xs[i].shape()), ") in place: dim ", d,
                    " has stride 0, so its elements share memory; pass a contiguous copy");
}
}  // namespace detail

/// One SGD step in place (eager): each parameter and momentum buffer is overwritten by its
/// fused update, evaluated straight into its memory (no copy). Same values as step().
template <element T>
void step_(std::vector<tensor<T>>& params, const std::vector<tensor<T>>& grads, sgd_state<tensor<T>>& state,
           const sgd_options& o) {
  detail::check_writable(params, "optim::step_(sgd)", "params");
  detail::check_writable(state.momentum_buffer, "optim::step_(sgd)", "momentum_buffer");
  detail::sgd(params, grads, state, o, detail::in_place{}, "optim::step_(sgd)");
}

/// One AdamW step in place (eager): the step count, then each parameter with its running
/// averages, are overwritten by their fused update (one fused_adamw per parameter), evaluated
/// straight into their memory. Same values as step().
template <element T>
void step_(std::vector<tensor<T>>& params, const std::vector<tensor<T>>& grads, adamw_state<tensor<T>>& state,
           const adamw_options& o) {
  detail::check_writable(params, "optim::step_(adamw)", "params");
  detail::check_writable(state.exp_avg, "optim::step_(adamw)", "exp_avg");
  detail::check_writable(state.exp_avg_sq, "optim::step_(adamw)", "exp_avg_sq");
  detail::adamw(params, grads, state, o, detail::in_place{}, "optim::step_(adamw)");
}

}  // namespace ccgraph::optim
