// tests/autograd/test_optim.cpp: cg::optim (ccgraph/autograd/optim.hpp). SGD and AdamW against
// double-precision references written as plain loops (torch.optim's formulas), over several
// steps: eager functional, eager in place and traced through compile_function, which must agree
// bit for bit; one fused pointwise node per output; the errors; and data-parallel training of a
// small MLP on 4 ranks (gradients all_reduced inside the traced step) against one rank on the
// concatenated batch, step by step.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ccgraph/ccgraph.hpp>  // includes autograd/optim.hpp

#include "autograd/dp_mlp.hpp"
#include "autograd/values.hpp"
#include "support.hpp"

namespace cg = ccgraph;
using ccgraph_test::contains;
using ccgraph_test::error_of;

namespace optim_test {

using ccgraph_test::dp::deep_copies;
using ccgraph_test::dp::dp_train_step;
using ccgraph_test::dp::mlp_loss;
using ccgraph_test::dp::state_of;

using T = cg::tensor<double>;
using vec = std::vector<double>;

/// A tensor of `shape` with values spread over [lo, hi) (deterministic).
inline T uniform_values(const cg::shape_t& shape, double lo, double hi, int seed) {
  return ccgraph_test::spread_values(shape, lo, hi, seed);
}

/// The parameters of the tests: two of different shapes.
inline std::vector<T> params0() { return {uniform_values({3, 4}, -1, 1, 1), uniform_values({4}, -1, 1, 2)}; }
/// The gradients of step `s` (different each step, some negative, some tiny).
inline std::vector<T> grads_at(int s) {
  return {uniform_values({3, 4}, -0.5, 0.7, 10 + s), uniform_values({4}, -1e-3, 2e-3, 20 + s)};
}
constexpr int steps = 5;

/// torch.optim.SGD (dampening 0) as loops: returns the parameters after `steps` steps.
inline std::vector<vec> sgd_reference(const cg::optim::sgd_options& o) {
  std::vector<vec> p, b;
  for (const T& x : params0()) p.push_back(x.to_vector()), b.emplace_back();
  for (int s = 0; s < steps; ++s) {
    const auto gs = grads_at(s);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const vec g = gs[i].to_vector();
      if (b[i].empty()) b[i].assign(g.size(), 0.0);
      for (std::size_t j = 0; j < g.size(); ++j) {
        double d = g[j];
        if (o.weight_decay != 0) d += o.weight_decay * p[i][j];
        if (o.momentum != 0) {
          b[i][j] = s == 0 ? d : o.momentum * b[i][j] + d;  // PyTorch clones d on the first step
          d = o.nesterov ? d + o.momentum * b[i][j] : b[i][j];
        }
        p[i][j] -= o.lr * d;
      }
    }
  }
  return p;
}

/// torch.optim.AdamW as loops: returns the parameters after `steps` steps.
inline std::vector<vec> adamw_reference(const cg::optim::adamw_options& o) {
  std::vector<vec> p, m, v;
  for (const T& x : params0()) {
    p.push_back(x.to_vector());
    m.emplace_back(p.back().size(), 0.0);
    v.emplace_back(p.back().size(), 0.0);
  }
  for (int s = 1; s <= steps; ++s) {
    const auto gs = grads_at(s - 1);
    const double bc1 = 1 - std::pow(o.beta1, s), bc2 = 1 - std::pow(o.beta2, s);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const vec g = gs[i].to_vector();
      for (std::size_t j = 0; j < g.size(); ++j) {
        p[i][j] *= 1 - o.lr * o.weight_decay;
        m[i][j] = o.beta1 * m[i][j] + (1 - o.beta1) * g[j];
        v[i][j] = o.beta2 * v[i][j] + (1 - o.beta2) * g[j] * g[j];
        p[i][j] -= o.lr / bc1 * m[i][j] / (std::sqrt(v[i][j]) / std::sqrt(bc2) + o.eps);
      }
    }
  }
  return p;
}

/// Checks `got` against the reference to a tight relative tolerance.
inline void check_close(const std::vector<T>& got, const std::vector<vec>& want, double tol = 1e-13) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const vec g = got[i].to_vector();
    REQUIRE(g.size() == want[i].size());
    for (std::size_t j = 0; j < g.size(); ++j) {
      INFO("param ", i, " element ", j, ": got ", g[j], ", want ", want[i][j]);
      CHECK(std::abs(g[j] - want[i][j]) <= tol * (1 + std::abs(want[i][j])));
    }
  }
}

/// Bit-for-bit equality of two lists of tensors.
inline void check_equal(const std::vector<T>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].to_vector() == b[i].to_vector());
}

/// The optimizer's step traced as one graph of (p0, p1, g0, g1, state...) returning the new
/// parameters then the new state's tensors.
template <class State, class Opt>
auto traced_step(Opt o) {
  return [o](const auto& p0, const auto& p1, const auto& g0, const auto& g1, const auto&... st) {
    using V = std::decay_t<decltype(p0)>;
    const auto r = cg::optim::step(std::vector<V>{p0, p1}, std::vector<V>{g0, g1},
                                   state_of<State, V>::type::from_tensors({st...}), o);
    std::vector<V> out = r.params;
    for (const V& t : r.state.tensors()) out.push_back(t);
    return out;
  };
}

/// Calls `f` with the tensors of `args` as separate arguments (N of them).
template <std::size_t N, class F>
auto call_with(F& f, const std::vector<T>& args) {
  REQUIRE(args.size() == N);
  return [&]<std::size_t... I>(std::index_sequence<I...>) { return f(args[I]...); }(std::make_index_sequence<N>{});
}

/// compile_function of `fn` over N double tensors.
template <std::size_t N, class F>
auto compile_n(F fn, cg::rank_context& ctx, cg::function_options opt = {}) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return cg::compile_function<std::conditional_t<(I < N), double, void>...>(fn, ctx, opt);
  }(std::make_index_sequence<N>{});
}

/// Runs the optimizer `steps` steps three ways — eager functional, eager in place, traced through
/// compile_function — checks they agree bit for bit, and returns the final parameters. A traced
/// step has `pointwise_per_step` pointwise nodes and `fused_per_step` fused_adamw nodes.
template <std::size_t StateTensors, class Opt>
std::vector<T> run_three_ways(const Opt& o, std::size_t pointwise_per_step, std::size_t fused_per_step = 0) {
  // eager, functional
  std::vector<T> p = params0();
  auto st = cg::optim::init(p, o);
  const std::vector<T> p_start = deep_copies(p);
  for (int s = 0; s < steps; ++s) {
    const auto before = deep_copies(p);
    auto r = cg::optim::step(p, grads_at(s), st, o);
    check_equal(p, before);  // functional: the inputs are not written
    p = r.params;
    st = r.state;
  }
  // eager, in place: the same tensors are updated
  std::vector<T> q = deep_copies(p_start);
  auto qs = cg::optim::init(q, o);
  const double* q0 = q[0].data();
  for (int s = 0; s < steps; ++s) cg::optim::step_(q, grads_at(s), qs, o);
  CHECK(q[0].data() == q0);
  check_equal(q, p);
  check_equal(qs.tensors(), st.tensors());
  // traced: one graph per step, run through compile_function
  using State = decltype(st);
  ccgraph_test::run(1, [&](cg::rank_context& ctx) {
    auto fn = traced_step<State>(o);
    constexpr std::size_t n = 4 + StateTensors;
    auto cf = compile_n<n>(fn, ctx);
    std::vector<T> tp = deep_copies(p_start);
    auto ts = cg::optim::init(tp, o);
    std::vector<T> tst = ts.tensors();
    REQUIRE(tst.size() == StateTensors);
    for (int s = 0; s < steps; ++s) {
      std::vector<T> args = tp;
      for (const T& g : grads_at(s)) args.push_back(g);
      for (const T& x : tst) args.push_back(x);
      const std::vector<T> out = call_with<n>(cf, args);
      tp.assign(out.begin(), out.begin() + 2);
      tst.assign(out.begin() + 2, out.end());
    }
    check_equal(tp, p);
    check_equal(tst, st.tensors());
    // traced and updating its inputs in place (compile_options::update_inputs): the same
    // tensors are passed every step, and each call returns them
    std::vector<cg::input_update> updates{{0, 0}, {1, 1}};  // (p0, p1, g0, g1, state...) -> (p0, p1, state...)
    for (const cg::input_update& u : cg::update_inputs_range(4, 2, StateTensors)) updates.push_back(u);
    auto cf_in_place = compile_n<n>(fn, ctx, {.compile = {.update_inputs = updates}});
    std::vector<T> ip = deep_copies(p_start);
    std::vector<T> ist = cg::optim::init(ip, o).tensors();
    std::vector<const double*> where;
    for (const T& x : ip) where.push_back(x.data());
    for (const T& x : ist) where.push_back(x.data());
    for (int s = 0; s < steps; ++s) {
      std::vector<T> args = {ip[0], ip[1]};
      for (const T& g : grads_at(s)) args.push_back(g);
      for (const T& x : ist) args.push_back(x);
      const std::vector<T> out = call_with<n>(cf_in_place, args);
      REQUIRE(out.size() == n - 2);
      for (std::size_t k = 0; k < out.size(); ++k) CHECK(out[k].data() == where[k]);
    }
    for (std::size_t k = 0; k < ip.size(); ++k) CHECK(ip[k].data() == where[k]);
    check_equal(ip, p);
    check_equal(ist, st.tensors());
    // SGD: one fused pointwise node per output; AdamW: its per-step scalars, then one
    // fused_adamw node per parameter
    const auto g = [&]<std::size_t... I>(std::index_sequence<I...>) {
      std::vector<T> shapes = params0();
      for (const T& x : grads_at(0)) shapes.push_back(x);
      for (const T& x : ts.tensors()) shapes.push_back(x);
      return cg::trace(fn, cg::input<double>(shapes[I].shape())...);
    }(std::make_index_sequence<n>{});
    CHECK(g.count("pointwise") == pointwise_per_step);
    CHECK(g.count("fused_adamw") == fused_per_step);
    // every parameter and state tensor is computed straight into its input (no copy after the
    // run): each is an output of one elementwise node that runs after every other read of the
    // old value (fused_adamw writes three inputs at once)
    auto direct = cg::compile(g, ctx, {.update_inputs = updates});
    for (const cg::input_update& u : updates) {
      INFO("update {input ", u.input, ", output ", u.output, "}\n", cg::to_string(g));
      CHECK(direct.exec().update_in_place(u.output));
    }
  });
  return p;
}

// ---- data-parallel training of a small MLP ----------------------------------------------------

constexpr std::int64_t in_dim = 3, hidden = 6, out_dim = 2, per_rank = 2, world = 4, train_steps = 4;

/// The whole batch: rows [r * per_rank, (r + 1) * per_rank) are rank r's shard.
inline T batch_x() { return uniform_values({world * per_rank, in_dim}, -1, 1, 101); }
inline T batch_y() { return uniform_values({world * per_rank, out_dim}, -1, 1, 102); }
inline std::vector<T> mlp_params() {
  return {uniform_values({hidden, in_dim}, -0.8, 0.8, 111), uniform_values({hidden}, -0.2, 0.2, 112),
          uniform_values({out_dim, hidden}, -0.8, 0.8, 113), uniform_values({out_dim}, -0.2, 0.2, 114)};
}

/// Trains `train_steps` steps on `world` ranks (each its shard, the traced step through
/// compile_function, scheduled for overlap) and on one rank (eagerly, the whole batch,
/// value_and_grad then step_ in place), and checks every rank's loss and parameters against the
/// single rank's after every step.
template <std::size_t StateTensors, class Opt>
void check_data_parallel(const Opt& o, bool in_place = false) {
  // one rank, the concatenated batch
  const auto ref = ccgraph_test::dp::train_one_rank(batch_x(), batch_y(), mlp_params(), o, train_steps);
  const std::vector<double>& ref_loss = ref.loss;
  const std::vector<std::vector<T>>& ref_params = ref.params;
  CHECK(ref_loss.back() < ref_loss.front());  // it trains
  using State = decltype(cg::optim::init(std::vector<T>{}, o));
  ccgraph_test::run(world, [&](cg::rank_context& ctx) {
    const auto r = ctx.rank();
    const T x = batch_x().narrow(0, r * per_rank, per_rank).contiguous();
    const T y = batch_y().narrow(0, r * per_rank, per_rank).contiguous();
    constexpr std::size_t n = 6 + StateTensors;
    // In place: the parameters and the state (inputs 2..) are results 1.. written back.
    cg::compile_options co;
    if (in_place) co.update_inputs = cg::update_inputs_range(2, 1, 4 + StateTensors);
    auto cf = compile_n<n>(dp_train_step<State>(o, ctx.world()), ctx,
                           {.passes = {"sink_waits", "raise_comms", "reorder_compute_for_overlap"}, .compile = co});
    std::vector<T> p = deep_copies(mlp_params());
    std::vector<T> st = cg::optim::init(p, o).tensors();
    const double* p0 = p[0].data();
    for (int s = 0; s < train_steps; ++s) {
      std::vector<T> args{x, y};
      for (const T& t : p) args.push_back(t);
      for (const T& t : st) args.push_back(t);
      const std::vector<T> out = call_with<n>(cf, args);
      REQUIRE(out.size() == 5 + StateTensors);
      if (in_place) {
        CHECK(out[1].data() == p0);  // the parameter tensor itself, updated
      } else {
        p.assign(out.begin() + 1, out.begin() + 5);
        st.assign(out.begin() + 5, out.end());
      }
      INFO("rank ", r, " step ", s);
      CHECK(out[0].to_vector().at(0) == doctest::Approx(ref_loss[static_cast<std::size_t>(s)]).epsilon(1e-12));
      check_close(p, [&] {
        std::vector<vec> w;
        for (const T& t : ref_params[static_cast<std::size_t>(s)]) w.push_back(t.to_vector());
        return w;
      }(), 1e-12);
    }
    if (in_place) {
      // the scheduled step (overlap passes) writes every parameter and state tensor straight
      // into its input: each update runs after every other read of the old value
      std::vector<cg::shape_t> shapes{x.shape(), y.shape()};
      for (const T& t : p) shapes.push_back(t.shape());
      for (const T& t : st) shapes.push_back(t.shape());
      const auto* c = cf.compiled_for(shapes);
      REQUIRE(c != nullptr);
      for (std::size_t k = 1; k < 5 + StateTensors; ++k) {
        INFO("result ", k);
        CHECK(c->exec().update_in_place(k));
      }
    }
  });
}

}  // namespace optim_test

TEST_CASE("optim.sgd.momentum_nesterov_weight_decay") {
  using namespace optim_test;
  for (const bool nesterov : {false, true})
    for (const double wd : {0.0, 0.05}) {
      INFO("nesterov ", nesterov, ", weight_decay ", wd);
      const cg::optim::sgd_options o{.lr = 0.1, .momentum = 0.9, .weight_decay = wd, .nesterov = nesterov};
      // per parameter: the new buffer and the new parameter
      check_close(run_three_ways<2>(o, 4), sgd_reference(o));
    }
}

TEST_CASE("optim.sgd.plain") {
  using namespace optim_test;
  const cg::optim::sgd_options o{.lr = 0.3, .momentum = 0.0, .weight_decay = 0.01};
  check_close(run_three_ways<0>(o, 2), sgd_reference(o));
}

TEST_CASE("optim.adamw.bias_correction") {
  using namespace optim_test;
  // beta1 0.9 and 0.3: torch.lerp's two formulas; weight decay on and off
  for (const double beta1 : {0.9, 0.3})
    for (const double wd : {0.0, 0.1}) {
      INFO("beta1 ", beta1, ", weight_decay ", wd);
      const cg::optim::adamw_options o{.lr = 0.01, .beta1 = beta1, .beta2 = 0.99, .eps = 1e-6, .weight_decay = wd};
      // the step count and its two bias corrections (computed once per step), then per
      // parameter one fused_adamw giving the parameter, exp_avg and exp_avg_sq
      check_close(run_three_ways<5>(o, 3, 2), adamw_reference(o), 1e-12);
    }
}

TEST_CASE("optim.adamw.float") {
  // f32: the same graph; against the double reference to f32 accuracy
  const cg::optim::adamw_options o{.lr = 0.01};
  std::vector<cg::tensor<float>> p;
  for (const auto& x : optim_test::params0()) {
    std::vector<float> v;
    for (double d : x.to_vector()) v.push_back(static_cast<float>(d));
    p.push_back(cg::tensor<float>::from(v, x.shape()));
  }
  auto st = cg::optim::init(p, o);
  for (int s = 0; s < optim_test::steps; ++s) {
    std::vector<cg::tensor<float>> g;
    for (const auto& x : optim_test::grads_at(s)) {
      std::vector<float> v;
      for (double d : x.to_vector()) v.push_back(static_cast<float>(d));
      g.push_back(cg::tensor<float>::from(v, x.shape()));
    }
    cg::optim::step_(p, g, st, o);
  }
  CHECK(st.step.to_vector() == std::vector<float>{5.0f});
  const auto want = optim_test::adamw_reference(o);
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto v = p[i].to_vector();
    for (std::size_t j = 0; j < v.size(); ++j) CHECK(v[j] == doctest::Approx(want[i][j]).epsilon(1e-5));
  }
}

TEST_CASE("optim.data_parallel.mlp_sgd_momentum.world4") {
  optim_test::check_data_parallel<4>(cg::optim::sgd_options{.lr = 0.2, .momentum = 0.9, .weight_decay = 1e-3});
}

TEST_CASE("optim.data_parallel.mlp_sgd_nesterov.world4") {
  optim_test::check_data_parallel<4>(cg::optim::sgd_options{.lr = 0.1, .momentum = 0.8, .nesterov = true});
}

TEST_CASE("optim.data_parallel.mlp_adamw.world4") {
  optim_test::check_data_parallel<9>(cg::optim::adamw_options{.lr = 0.02, .weight_decay = 0.05});
}

TEST_CASE("optim.data_parallel.mlp_adamw_in_place.world4") {
  // the step updates the parameters and AdamW's state in place (compile_options::update_inputs)
  optim_test::check_data_parallel<9>(cg::optim::adamw_options{.lr = 0.02, .weight_decay = 0.05}, true);
}

TEST_CASE("optim.adamw.bf16_parameters_follow_the_double_update") {
  // bf16 parameters (pure-bf16 training): the update is computed in f32 and rounded once per
  // stored value, as PyTorch's fused AdamW. With beta2 = 0.999 rounded to bf16 (1) the update
  // would be lost, or NaN where the second moment is 0; with a bf16 step count it would stop at
  // 256. Checked against the same optimizer in double on the same (bf16) numbers, eager in place,
  // eager functional and traced, which agree bit for bit.
  using namespace optim_test;
  using bf = cg::bf16;
  using B = cg::tensor<bf>;
  const cg::optim::adamw_options o{.lr = 0.02, .weight_decay = 0.1};
  auto to_bf = [](const T& x) { return x.to<bf>(); };
  std::vector<B> p{to_bf(uniform_values({3, 4}, -1, 1, 1)), to_bf(uniform_values({4}, -1, 1, 2))};
  std::vector<T> d{p[0].to<double>(), p[1].to<double>()};
  const std::vector<B> p_start = deep_copies(p);
  auto grads = [&](int s) { return std::vector<B>{to_bf(grads_at(s)[0]), to_bf(grads_at(s)[1])}; };
  auto st = cg::optim::init(p, o);
  auto dst = cg::optim::init(d, o);
  static_assert(std::is_same_v<decltype(st.step), cg::tensor<float>>, "a bf16 step count stops at 256");
  constexpr int n = 40;
  for (int s = 0; s < n; ++s) {
    const std::vector<B> g = grads(s);
    cg::optim::step_(p, g, st, o);
    cg::optim::step_(d, std::vector<T>{g[0].to<double>(), g[1].to<double>()}, dst, o);
  }
  CHECK(st.step.to_vector() == std::vector<float>{float(n)});
  double moved = 0, worst = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto got = p[i].to<double>().to_vector(), want = d[i].to_vector(), start = p_start[i].to<double>().to_vector();
    for (std::size_t j = 0; j < got.size(); ++j) {
      REQUIRE(std::isfinite(got[j]));
      moved = std::max(moved, std::abs(want[j] - start[j]));
      worst = std::max(worst, std::abs(got[j] - want[j]));
    }
  }
  INFO("largest move ", moved, ", largest difference from double ", worst);
  CHECK(moved > 0.3);      // 40 steps of lr 0.02 move some parameter far
  CHECK(worst < 0.03);     // bf16 rounding of the stored values, step after step
  // eager functional and traced give the in-place values bit for bit
  std::vector<B> q = deep_copies(p_start);
  auto qs = cg::optim::init(q, o);
  ccgraph_test::run(1, [&](cg::rank_context& ctx) {
    auto fn = [o](const auto& t, const auto& p0, const auto& p1, const auto& g0, const auto& g1, const auto&... avg) {
      using V = std::decay_t<decltype(p0)>;
      const auto r = cg::optim::step(std::vector<V>{p0, p1}, std::vector<V>{g0, g1},
                                     cg::optim::adamw_state<V>::from_averages(t, {avg...}), o);
      std::vector<V> out = r.params;
      for (const V& x : r.state.averages()) out.push_back(x);
      return out;
    };
    auto cf = cg::compile_function<float, bf, bf, bf, bf, bf, bf, bf, bf>(fn, ctx);
    std::vector<B> tq = deep_copies(p_start);
    std::vector<B> avg = qs.averages();
    cg::tensor<float> t = qs.step;
    for (int s = 0; s < n; ++s) {
      const std::vector<B> g = grads(s);
      auto r = cg::optim::step(q, g, qs, o);
      q = r.params;
      qs = r.state;
      const std::vector<B> out = cf(t, tq[0], tq[1], g[0], g[1], avg[0], avg[1], avg[2], avg[3]);
      tq = {out[0], out[1]};
      avg = {out.begin() + 2, out.end()};
      t = qs.step;
    }
    for (std::size_t i = 0; i < p.size(); ++i) CHECK(tq[i].to_vector() == p[i].to_vector());
  });
  for (std::size_t i = 0; i < p.size(); ++i) CHECK(q[i].to_vector() == p[i].to_vector());
  CHECK(qs.step.to_vector() == st.step.to_vector());
}

TEST_CASE("optim.traced_updates_follow_the_gradients") {
  // Traced, the parameters are updated in the order their gradients are computed (here the
  // second's first), and the results still come back in parameter order.
  const auto g = cg::trace(ccgraph_test::world(1), [](auto a, auto b, auto ga, auto gb, auto ma, auto mb, auto va, auto vb, auto t) {
    using V = decltype(a);
    const V db(cg::eval(gb * 3.0));  // b's gradient computed first
    const V da(cg::eval(ga * 2.0));
    const auto r = cg::optim::step(std::vector<V>{a, b}, std::vector<V>{da, db},
                                   cg::optim::adamw_state<V>::from_averages(t, {ma, mb, va, vb}), cg::optim::adamw_options{});
    const auto s = cg::optim::step(std::vector<V>{a, b}, std::vector<V>{da, db}, cg::optim::sgd_state<V>{},
                                   cg::optim::sgd_options{.lr = 0.5});
    return std::make_tuple(r.params[0], r.params[1], s.params[0], s.params[1]);
  }, cg::input<double>({3}), cg::input<double>({4}), cg::input<double>({3}), cg::input<double>({4}), cg::input<double>({3}),
     cg::input<double>({4}), cg::input<double>({3}), cg::input<double>({4}), cg::input<double>({}));
  const cg::node* out = g.output_node();
  REQUIRE(out != nullptr);
  const std::vector<cg::value_ref>& res = out->args();
  REQUIRE(res.size() == 4);
  CHECK(res[0].src->shape() == cg::shape_t{3});  // a's new value first, as the parameters
  CHECK(res[1].src->shape() == cg::shape_t{4});
  CHECK(g.position(res[1].src) < g.position(res[0].src));  // b's update computed before a's
  CHECK(g.position(res[3].src) < g.position(res[2].src));
  // Eagerly the same values as updating in parameter order.
  const auto a = cg::full<double>({3}, 1.0), b = cg::full<double>({4}, 2.0);
  const auto s = cg::optim::step(std::vector<cg::tensor<double>>{a, b}, std::vector<cg::tensor<double>>{a, b},
                                 cg::optim::sgd_state<cg::tensor<double>>{}, cg::optim::sgd_options{.lr = 0.5});
  CHECK(s.params[0].to_vector() == std::vector<double>(3, 0.5));
  CHECK(s.params[1].to_vector() == std::vector<double>(4, 1.0));
}

TEST_CASE("optim.errors") {
  using namespace optim_test;
  auto p = params0();
  auto g = grads_at(0);
  auto sgd = cg::optim::init(p, cg::optim::sgd_options{.momentum = 0.9});
  // a gradient of the wrong shape
  std::vector<T> bad{g[0], uniform_values({5}, -1, 1, 3)};
  std::string e = error_of([&] { cg::optim::step(p, bad, sgd, {.momentum = 0.9}); });
  CHECK(contains(e, "optim::step(sgd)"));
  CHECK(contains(e, "grads[1] has shape [5]"));
  CHECK(contains(e, "params[1] has shape [4]"));
  // one gradient too few
  e = error_of([&] { cg::optim::step_(p, std::vector<T>{g[0]}, sgd, {.momentum = 0.9}); });
  CHECK(contains(e, "optim::step_(sgd)"));
  CHECK(contains(e, "2 params but 1 grads"));
  // a state without buffers for momentum
  cg::optim::sgd_state<T> none;
  e = error_of([&] { cg::optim::step(p, g, none, {.momentum = 0.5}); });
  CHECK(contains(e, "2 params but 0 momentum buffers"));
  // nesterov without momentum
  e = error_of([&] { cg::optim::step(p, g, none, {.nesterov = true}); });
  CHECK(contains(e, "nesterov needs momentum > 0"));
  // AdamW: bad beta, a state of other params, a step that is not 0-d
  auto ad = cg::optim::init(p, cg::optim::adamw_options{});
  e = error_of([&] { cg::optim::step(p, g, ad, {.beta2 = 1.0}); });
  CHECK(contains(e, "optim::step(adamw): beta2 must be in [0, 1), got 1"));
  auto other = ad;
  other.exp_avg_sq[0] = uniform_values({4, 3}, -1, 1, 4);
  e = error_of([&] { cg::optim::step_(p, g, other, {}); });
  CHECK(contains(e, "exp_avg_sq[0] has shape [4, 3] but params[0] has shape [3, 4]"));
  other = ad;
  other.step = uniform_values({1}, 0, 1, 5);
  e = error_of([&] { cg::optim::step(p, g, other, {}); });
  CHECK(contains(e, "step must be 0-d, got shape [1]"));
  e = error_of([] { cg::optim::adamw_state<T>::from_tensors({uniform_values({}, 0, 1, 1), uniform_values({2}, 0, 1, 1)}); });
  CHECK(contains(e, "from_tensors"));
  CHECK(contains(e, "got 2 tensors"));
  // in place into a tensor whose rows share memory (stride 0, as an expanded tensor imported
  // with from_blob has): refused, and the memory is left as it was
  std::vector<double> row{1, 2, 3, 4};
  const T shared = cg::from_blob(row.data(), {3, 4}, {0, 1}, [](double*) {});
  std::vector<T> ps{p[1].clone(), shared};  // the bad one last: nothing may be written before the check
  const auto before = ps[0].to_vector();
  std::vector<T> gs{g[1], uniform_values({3, 4}, -1, 1, 6)};
  auto sg = cg::optim::init(ps, cg::optim::sgd_options{});
  e = error_of([&] { cg::optim::step_(ps, gs, sg, {.lr = 0.1}); });
  CHECK(contains(e, "optim::step_(sgd): cannot update params[1] (shape [3, 4]) in place: dim 0 has stride 0"));
  CHECK(row == std::vector<double>{1, 2, 3, 4});
  CHECK(ps[0].to_vector() == before);
}
