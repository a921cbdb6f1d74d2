// tests/autograd/dp_mlp.hpp: the small MLP that the data-parallel training tests train (CPU
// threads in autograd/test_optim.cpp, GPUs over NCCL in gpu/test_data_parallel.cu) and its
// traced training step, for any value type (tensors, traced values) and element type.
#pragma once

#include <ccgraph/ccgraph.hpp>

#include <type_traits>
#include <vector>

namespace ccgraph_test::dp {

namespace cg = ccgraph;

/// The MLP's loss on a batch: mse of linear(tanh(linear(x, w1, b1)), w2, b2) against y.
struct mlp_loss {
  template <class V>
  auto operator()(const V& x, const V& y, const V& w1, const V& b1, const V& w2, const V& b2) const {
    const V h = cg::tanh(cg::linear(x, w1, b1));
    const V d = cg::linear(h, w2, b2) - y;
    return cg::mean(d * d);
  }
};

/// The state type for value type V of a state S of tensors.
template <class S, class V>
struct state_of;
template <class W, class V>
struct state_of<cg::optim::sgd_state<W>, V> {
  using type = cg::optim::sgd_state<V>;
};
template <class W, class V>
struct state_of<cg::optim::adamw_state<W>, V> {
  using type = cg::optim::adamw_state<V>;
};

/// One data-parallel training step traced as one graph of (x, y, w1, b1, w2, b2, state...):
/// forward, backward, the gradients all_reduced (avg) over `g`, the optimizer. Returns the
/// global loss (the local one averaged), the new parameters and the new state's tensors.
template <class State, class Opt>
auto dp_train_step(Opt o, cg::group g) {
  return [o, g](const auto& x, const auto& y, const auto& w1, const auto& b1, const auto& w2, const auto& b2,
                const auto&... st) {
    using V = std::decay_t<decltype(x)>;
    auto [loss, g1, g2, g3, g4] = cg::value_and_grad(mlp_loss{}, {2, 3, 4, 5})(x, y, w1, b1, w2, b2);
    std::vector<V> grads;
    for (const V& gr : {g1, g2, g3, g4}) grads.push_back(cg::all_reduce(gr, "avg", g));
    const auto r = cg::optim::step(std::vector<V>{w1, b1, w2, b2}, grads,
                                   state_of<State, V>::type::from_tensors({st...}), o);
    std::vector<V> out{cg::all_reduce(loss, "avg", g)};
    for (const V& p : r.params) out.push_back(p);
    for (const V& t : r.state.tensors()) out.push_back(t);
    return out;
  };
}

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
/// then the in-place step, `steps` times from `params` (copied). What every data-parallel rank
/// must match step by step.
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

}  // namespace ccgraph_test::dp
