// examples/data_parallel_mlp.hpp: the small MLP and its traced data-parallel training step that
// example 06 trains on the threads backend (06_data_parallel_training.cpp) and on every GPU
// (06_data_parallel_training_gpu.cu), and the one-rank reference both check against, which the
// data-parallel tests (tests/autograd/dp_mlp.hpp) use too. Not installed: a workload, not
// library code.
//
//   loss = mse(linear(tanh(linear(x, w1, b1)), w2, b2), y)          forward
//   grads = value_and_grad(loss)                                      backward
//   grads = all_reduce_gradients(grads, avg)                          DDP's gradient average
//   params, state = AdamW(params, grads, state)                       one fused update per tensor
#pragma once

#include <ccgraph/ccgraph.hpp>

#include <cstddef>
#include <type_traits>
#include <vector>

namespace example_dp {

namespace cg = ccgraph;

/// Inputs of the traced step: x, y, the 4 parameters, AdamW's step and 2 averages per parameter.
constexpr std::size_t n_inputs = 2 + 4 + 1 + 2 * 4;

/// The MLP's mean squared error on a batch.
struct mlp_loss {
  template <class V>
  auto operator()(const V& x, const V& y, const V& w1, const V& b1, const V& w2, const V& b2) const {
    const V h = cg::tanh(cg::linear(x, w1, b1));
    const V d = cg::linear(h, w2, b2) - y;
    return cg::mean(d * d);
  }
};

/// One data-parallel training step over `world` (a traced function of n_inputs tensors):
/// returns the global loss, the new parameters and the new AdamW state's tensors, in the
/// inputs' order, so that `in_place_updates()` can write them back into the inputs.
inline auto train_step(cg::optim::adamw_options opt, cg::group world) {
  return [opt, world](const auto& x, const auto& y, const auto& w1, const auto& b1, const auto& w2, const auto& b2,
                      const auto&... state) {
    using V = std::decay_t<decltype(x)>;
    auto [loss, g1, g2, g3, g4] = cg::value_and_grad(mlp_loss{}, {2, 3, 4, 5})(x, y, w1, b1, w2, b2);
    // DDP's order: the last layer's gradients (ready first) are all_reduced first, so their
    // all_reduce overlaps the rest of the backward once scheduled.
    const std::vector<V> grads = cg::all_reduce_gradients(std::vector<V>{g1, g2, g3, g4}, "avg", world);
    auto [params, st] = cg::optim::step(std::vector<V>{w1, b1, w2, b2}, grads,
                                        cg::optim::adamw_state<V>::from_tensors({state...}), opt);
    std::vector<V> out{cg::all_reduce(loss, "avg", world)};
    out.insert(out.end(), params.begin(), params.end());
    for (const V& t : st.tensors()) out.push_back(t);
    return out;
  };
}

/// The parameters and AdamW state (inputs 2..) updated in place from results 1.. by every call
/// (compile_options::update_inputs): the training loop passes the same tensors every step.
inline std::vector<cg::input_update> in_place_updates() { return cg::update_inputs_range(2, 1, n_inputs - 2); }

/// Deep copies of tensors (an in-place step must not write what another run starts from).
template <class T>
std::vector<T> deep_copies(const std::vector<T>& xs) {
  std::vector<T> out;
  for (const T& x : xs) out.push_back(T::from(x.to_vector(), x.shape()));
  return out;
}

/// Each step's loss and parameters of train_one_rank.
template <class T>
struct reference_run {
  std::vector<double> loss;
  std::vector<std::vector<T>> params;
};

/// One rank training on the whole batch, eagerly on CPU tensors: value_and_grad of mlp_loss,
/// then the optimizer's in-place step, `steps` times from `params` (copied). What every
/// data-parallel rank must match step by step.
template <class T, class Opt>
reference_run<T> train_one_rank(const T& x, const T& y, const std::vector<T>& params, const Opt& o, int steps) {
  reference_run<T> ref;
  std::vector<T> p = deep_copies(params);
  auto st = cg::optim::init(p, o);
  for (int s = 0; s < steps; ++s) {
    auto [loss, g1, g2, g3, g4] = cg::value_and_grad(mlp_loss{}, {2, 3, 4, 5})(x, y, p[0], p[1], p[2], p[3]);
    cg::optim::step_(p, {g1, g2, g3, g4}, st, o);
    ref.loss.push_back(static_cast<double>(loss.to_vector().at(0)));
    ref.params.push_back(deep_copies(p));
  }
  return ref;
}

/// `f` called with the n_inputs tensors of `args`.
template <class F, class T>
auto call(F& f, const std::vector<T>& args) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) { return f(args[I]...); }(std::make_index_sequence<n_inputs>{});
}

/// compile_function of train_step over n_inputs tensors of element type E.
template <class E>
auto compile_step(cg::optim::adamw_options opt, cg::rank_context& ctx, cg::compile_options co) {
  co.update_inputs = in_place_updates();
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return cg::compile_function<std::conditional_t<(I < n_inputs), E, void>...>(
        train_step(opt, ctx.world()), ctx,
        {.passes = {"sink_waits", "raise_comms", "reorder_compute_for_overlap"}, .compile = co});
  }(std::make_index_sequence<n_inputs>{});
}

}  // namespace example_dp
