// tests/ops/test_optimizer_ops.cpp: fused_adamw (ccgraph/ops/optimizer_ops.hpp), the op
// cg::optim's AdamW records. Its values against torch.optim's formulas are tests/autograd/
// test_optim.cpp's; here: the errors, strided operands, and the memory planner writing several
// outputs of one elementwise node straight into the inputs they replace, or refusing where an
// old value is still read or a result is returned twice.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "autograd/values.hpp"
#include "support.hpp"

namespace cg = ccgraph;
using ccgraph_test::contains;
using ccgraph_test::error_of;

namespace {

using T = cg::tensor<double>;

T spread(const cg::shape_t& shape, double lo, double hi, int seed) {
  return ccgraph_test::spread_values(shape, lo, hi, seed);
}

const cg::ops::fused_adamw adamw_op{0.9, 0.99, 1e-8, 1 - 0.01 * 0.1};

/// fused_adamw on tensors, functional: (param', exp_avg', exp_avg_sq').
template <class E, class C>
auto fused(const cg::tensor<E>& p, const cg::tensor<E>& g, const cg::tensor<E>& m, const cg::tensor<E>& v,
           const cg::tensor<C>& step_size, const cg::tensor<C>& bias_sqrt2) {
  return cg::detail::apply_op_n<E, E, E>(adamw_op, p, g, m, v, step_size, bias_sqrt2);
}

}  // namespace

TEST_CASE("fused_adamw.errors") {
  const T p = spread({2}, -1, 1, 1), s = cg::full<double>({}, 0.5);
  // operands of another shape or dtype than the parameter
  std::string e = error_of([&] { (void)fused(p, p, spread({3}, 0, 1, 2), p, s, s); });
  CHECK(e == "fused_adamw: exp_avg is f64[3] but param is f64[2]");
  // the scalars: 0-d, of the compute type (f32 for bf16 parameters)
  e = error_of([&] { (void)fused(p, p, p, p, cg::full<double>({1}, 0.5), s); });
  CHECK(e == "fused_adamw: step_size must be a 0-d f64 value for f64 parameters, got f64[1]");
  const auto b = p.to<cg::bf16>();
  e = error_of([&] { (void)fused(b, b, b, b, cg::full<cg::bf16>({}, 0.5), cg::full<cg::bf16>({}, 0.5)); });
  CHECK(e == "fused_adamw: step_size must be a 0-d f32 value for bf16 parameters, got bf16[]");
  // integer parameters
  const auto i = cg::full<std::int32_t>({2}, 1);
  e = error_of([&] { (void)fused(i, i, i, i, cg::full<std::int32_t>({}, 1), cg::full<std::int32_t>({}, 1)); });
  CHECK(contains(e, "fused_adamw"));
  CHECK(contains(e, "i32"));
  // an optimizer step is not differentiated
  e = error_of([&] {
    cg::grad([](const auto& x) {
      using V = std::decay_t<decltype(x)>;
      const auto st = cg::optim::adamw_state<V>::from_averages(cg::sum(x) * 0.0, {x * 0.0, x * 0.0});
      return cg::sum(cg::optim::step(std::vector<V>{x}, std::vector<V>{x * 2.0}, st, cg::optim::adamw_options{}).params[0]);
    })(p);
  });
  CHECK(contains(e, "grad: fused_adamw"));
  CHECK(contains(e, "is not differentiable"));
}

TEST_CASE("fused_adamw.strided_operands") {
  // A transposed parameter (and state) updated in place: read through contiguous copies, the
  // results written back through the strides; the same values as on contiguous tensors.
  const T base_p = spread({3, 4}, -1, 1, 3), g = spread({4, 3}, -0.5, 0.5, 4);
  const T base_m = spread({3, 4}, -0.1, 0.1, 5), base_v = spread({3, 4}, 0, 0.2, 6);
  const T s = cg::full<double>({}, 0.01), b = cg::full<double>({}, 0.3);
  auto [want_p, want_m, want_v] =
      fused(base_p.transpose(0, 1).contiguous(), g, base_m.transpose(0, 1).contiguous(), base_v.transpose(0, 1).contiguous(), s, b);
  const T p = base_p.clone(), m = base_m.clone(), v = base_v.clone();
  const T pt = p.transpose(0, 1), mt = m.transpose(0, 1), vt = v.transpose(0, 1);
  REQUIRE(!pt.is_contiguous());
  cg::detail::fused_adamw_into(adamw_op, pt, g, mt, vt, s, b);
  CHECK(pt.contiguous().to_vector() == want_p.to_vector());
  CHECK(mt.contiguous().to_vector() == want_m.to_vector());
  CHECK(vt.contiguous().to_vector() == want_v.to_vector());
  // functional on the strided views: the inputs are left as they were
  const auto before = p.to_vector();
  auto [p2, m2, v2] = fused(pt, g, mt, vt, s, b);
  CHECK(p.to_vector() == before);
  CHECK(p2.is_contiguous());
}

TEST_CASE("fused_adamw.update_inputs") {
  // One AdamW step traced as (p, g, t, m, v) -> (p', t', m', v'[, extra]): the fused node's three
  // outputs are each written straight into their input, unless an old value is read after it
  // or a result is returned twice; then that result alone is computed apart and copied, and
  // the values are the same.
  const cg::optim::adamw_options o{.lr = 0.01, .weight_decay = 0.1};
  auto step = [o](int extra) {
    return [o, extra](const auto& p, const auto& g, const auto& t, const auto& m, const auto& v) {
      using V = std::decay_t<decltype(p)>;
      const auto r = cg::optim::step(std::vector<V>{p}, std::vector<V>{g}, cg::optim::adamw_state<V>::from_averages(t, {m, v}), o);
      std::vector<V> out{r.params[0], r.state.step, r.state.exp_avg[0], r.state.exp_avg_sq[0]};
      if (extra == 1) out.push_back(V(m * 2.0));       // the old exp_avg, read after the update
      if (extra == 2) out.push_back(r.state.exp_avg_sq[0]);  // exp_avg_sq' returned twice
      return out;
    };
  };
  const cg::shape_t shape{5, 3};
  const std::vector<cg::input_update> updates{{0, 0}, {2, 1}, {3, 2}, {4, 3}};
  for (const int extra : {0, 1, 2}) {
    INFO("extra result ", extra);
    const auto g = cg::trace(step(extra), cg::input<double>(shape), cg::input<double>(shape), cg::input<double>({}),
                             cg::input<double>(shape), cg::input<double>(shape));
    REQUIRE(g.count("fused_adamw") == 1);
    for (const bool plan : {true, false})
      ccgraph_test::run(1, [&](cg::rank_context& ctx) {
        INFO("memory_plan ", plan);
        auto c = cg::compile(g, ctx, {.memory_plan = plan, .update_inputs = updates});
        CHECK(c.exec().update_in_place(0));                // p'
        CHECK(c.exec().update_in_place(1));                // the step count
        CHECK(c.exec().update_in_place(2) == (extra != 1));  // m'
        CHECK(c.exec().update_in_place(3) == (extra != 2));  // v'
        if (plan) {
          const cg::memory_plan* mp = c.exec().plan();
          REQUIRE(mp != nullptr);
          std::string why;
          CHECK_MESSAGE(mp->check(c.exec().graph_ref(), &why), why);
        }
        // Two steps against the functional eager step.
        T p = spread(shape, -1, 1, 7), m = spread(shape, -0.1, 0.1, 8), v = spread(shape, 0, 0.1, 9);
        T t = cg::full<double>({}, 0.0);
        std::vector<T> ref_p{p.clone()};
        auto ref_state = cg::optim::adamw_state<T>::from_averages(t.clone(), {m.clone(), v.clone()});
        const double* where[] = {p.data(), m.data(), v.data()};
        for (int s = 0; s < 2; ++s) {
          const T grad = spread(shape, -0.5, 0.5, 10 + s);
          const T old_m = ref_state.exp_avg[0].clone();
          auto r = cg::optim::step(ref_p, std::vector<T>{grad}, ref_state, o);
          const auto out = c(p, grad, t, m, v);
          ref_p = r.params;
          ref_state = r.state;
          CHECK(p.to_vector() == ref_p[0].to_vector());
          CHECK(m.to_vector() == ref_state.exp_avg[0].to_vector());
          CHECK(v.to_vector() == ref_state.exp_avg_sq[0].to_vector());
          CHECK(t.to_vector() == ref_state.step.to_vector());
          CHECK(out[0].data() == where[0]);
          CHECK(out[2].data() == where[1]);
          CHECK(out[3].data() == where[2]);
          if (extra == 1) CHECK(out[4].to_vector() == T(old_m * 2.0).to_vector());
          if (extra == 2) CHECK(out[4].to_vector() == v.to_vector());
        }
      });
  }
}

TEST_CASE("fused_adamw.sharding") {
  // The sharding rule (sharding_rules::elementwise): a parameter sharded on a mesh dim updates
  // its shard, the state and gradient laid out alike, the 0-d scalars replicated; a Partial
  // gradient is reduced first (the update is not linear in it).
  const cg::device_mesh mesh({2}, {"dp"});
  const cg::shape_t w{4, 6};
  const auto s0 = cg::shard(0), r = cg::replicate(), p = cg::partial();
  auto choose = [&](cg::placement grad) {
    return cg::choose_sharding(adamw_op, {{w, {s0}}, {w, {grad}}, {w, {s0}}, {w, {s0}}, {{}, {r}}, {{}, {r}}}, mesh).best();
  };
  const auto sharded = choose(s0);
  CHECK(sharded.out == std::vector{s0});
  for (std::size_t i = 0; i < 4; ++i) CHECK(sharded.in[i] == std::vector{s0});
  CHECK(sharded.in[4] == std::vector{r});
  CHECK(sharded.in[5] == std::vector{r});
  // A Partial(sum) gradient: reduce-scattered to the parameter's shard, never kept Partial.
  const auto reduced = choose(p);
  CHECK(reduced.out == std::vector{s0});
  CHECK(reduced.in[1] == std::vector{s0});
}
