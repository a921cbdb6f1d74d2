// tests/autograd/dp_mlp.hpp: the small MLP that the data-parallel training tests train (CPU
// threads in autograd/test_optim.cpp, GPUs over NCCL in gpu/test_data_parallel.cu), example 06's,
// and its traced training step for any optimizer, value type and element type.
#pragma once

#include <ccgraph/ccgraph.hpp>

#include "../../examples/data_parallel_mlp.hpp"

#include <type_traits>
#include <vector>

namespace ccgraph_test::dp {

namespace cg = ccgraph;

// The MLP, its loss and the one-rank reference training: example 06's (examples/data_parallel_mlp.hpp).
using example_dp::deep_copies;
using example_dp::mlp_loss;
using example_dp::reference_run;
using example_dp::train_one_rank;

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
    const std::vector<V> grads = cg::all_reduce_gradients(std::vector<V>{g1, g2, g3, g4}, "avg", g);
    const auto r = cg::optim::step(std::vector<V>{w1, b1, w2, b2}, grads,
                                   state_of<State, V>::type::from_tensors({st...}), o);
    std::vector<V> out{cg::all_reduce(loss, "avg", g)};
    for (const V& p : r.params) out.push_back(p);
    for (const V& t : r.state.tensors()) out.push_back(t);
    return out;
  };
}

}  // namespace ccgraph_test::dp
