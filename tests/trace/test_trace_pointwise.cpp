// tests/trace/test_trace_pointwise.cpp: the new pointwise ops traced (ccgraph/trace/ops.hpp):
// mixed element types in one fused node (comparisons, where, casts), traced + compiled equal to
// eager bit for bit, and dropout in graphs: a new mask on every call of a compiled graph, the
// same mask as eagerly from the same generator state, one mask for every reader of one dropout.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/decompose.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using i64 = std::int64_t;

template <class T>
bool tp_same(const cg::tensor<T>& a, const cg::tensor<T>& b) {
  if (a.shape() != b.shape()) return false;
  const auto x = a.to_vector(), y = b.to_vector();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const T xi = x[i], yi = y[i];  // vector<bool> has no element addresses
    if (std::memcmp(&xi, &yi, sizeof(T)) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("trace_pointwise.mixed_dtypes.one_node_equals_eager") {
  // A bool condition from int32, float operands, a cast, a bool result: each output one node
  // (named first: the arguments of make_tuple are evaluated in no set order).
  auto fn = [](auto i, auto f, auto g) {
    auto sel = cg::eval(cg::where(i > 0, cg::clamp(f * 2.f, -1, 1), cg::pow(g, 2)) + cg::cast<float>(i));
    auto mask = cg::eval(cg::abs(f - g) <= 0.5f);
    auto rounded = cg::eval((cg::round(f * 8.f) / 8.f).template to<cg::bf16>());
    auto special = cg::eval(cg::erf(f) * cg::rsqrt(cg::abs(g) + 1.f) - cg::sign(f) + cg::maximum(f, g));
    return std::make_tuple(sel, mask, rounded, special);
  };
  auto g = cg::trace(world(1), fn, cg::input<std::int32_t>({5, 7}), cg::input<float>({5, 7}), cg::input<float>({7}));
  CHECK(cg::op_sequence(g) == std::vector<std::string>{"fused_gt_mul_clamp_pow_where_to_f32_add", "fused_sub_abs_le",
                                                      "fused_mul_round_div_to_bf16",
                                                      "fused_erf_abs_add_rsqrt_mul_sign_sub_maximum"});
  // Node metas carry the result types; the where node reads an i32 and two f32 inputs.
  const auto& nodes = g.nodes();
  CHECK(nodes[3]->dtype() == cg::dtype::f32);
  CHECK(nodes[4]->dtype() == cg::dtype::boolean);
  CHECK(nodes[5]->dtype() == cg::dtype::bf16);
  CHECK(nodes[3]->inputs()[0]->dtype() == cg::dtype::i32);
  cg::lint(g);
  run(1, [&](cg::rank_context& ctx) {
    const auto i = cg::uniform<std::int32_t>({5, 7}, -3, 3, 1);
    const auto f = cg::uniform<float>({5, 7}, -2, 2, 2);
    const auto h = cg::uniform<float>({7}, -2, 2, 3);
    auto exe = cg::compile(g, ctx);
    const auto [s1, m1, r1, p1] = exe(i, f, h);
    const auto [s2, m2, r2, p2] = fn(i, f, h);
    CHECK(tp_same(s1, s2));
    CHECK(tp_same(m1, m2));
    CHECK(tp_same(r1, r2));
    CHECK(tp_same(p1, p2));
    // Strided inputs (the interpreter broadcasts and copies them).
    const auto ft = cg::uniform<float>({7, 5}, -2, 2, 4).transpose(0, 1);
    const auto [s3, m3, r3, p3] = exe(i, ft, h);
    const auto [s4, m4, r4, p4] = fn(i, ft, h);
    CHECK(tp_same(s3, s4));
    CHECK(tp_same(m3, m4));
    CHECK(tp_same(p3, p4));
  });
}

TEST_CASE("trace_pointwise.scalars_of_two_types_are_two_nodes") {
  // where(c, 1.f, 0.f) and where(c, 1., 0.) print alike but differ in type: the memo keeps them
  // apart.
  auto g = cg::trace(world(1), [](auto a) {
    auto f = cg::eval(cg::where(a > 0, 1.f, 0.f));
    auto d = cg::eval(cg::where(a > 0, 1.0, 0.0));
    return std::make_tuple(f, d);
  }, cg::input<float>({3}));
  REQUIRE(g.count("pointwise") == 2);
  CHECK(g.nodes()[1]->dtype() == cg::dtype::f32);
  CHECK(g.nodes()[2]->dtype() == cg::dtype::f64);
  run(1, [&](cg::rank_context& ctx) {
    const auto [x, y] = cg::compile(g, ctx)(cg::tensor<float>::from({-1, 2, 0}, {3}));
    CHECK(x.to_vector() == std::vector<float>{0, 1, 0});
    CHECK(y.to_vector() == std::vector<double>{0, 1, 0});
  });
}

TEST_CASE("trace_pointwise.bf16_scalars_keep_their_precision") {
  // A bf16 expression's scalars are f32 in the traced node too (the interpreter's registers and
  // the device tree): traced, compiled and eager agree bit for bit, and 1 - 0.999 is not 0.
  auto fn = [](auto a) {
    return cg::eval((a - 0.999) * 1000.0 + cg::where(a > 0.5, 0.1, a) + cg::cast<cg::bf16>(a < 0) * 0.999);
  };
  auto g = cg::trace(world(1), fn, cg::input<cg::bf16>({6}));
  CHECK(cg::to_string(g).find("0.999") != std::string::npos);  // printed unrounded
  run(1, [&](cg::rank_context& ctx) {
    const auto a = cg::tensor<float>::from({1.f, 0.25f, -0.5f, 1.f, 0.75f, -1.f}, {6}).to<cg::bf16>();
    const cg::tensor<cg::bf16> traced = cg::compile(g, ctx)(a);
    const cg::tensor<cg::bf16> eager = fn(a);
    CHECK(tp_same(traced, eager));
    // a = 1: bf16(bf16(bf16(bf16(0.001f) * 1000) + bf16(0.1)) + 0), about 1.1 (rounding 0.999 to
    // bf16 first gave 0.1)
    auto r = [](float x) { return float(cg::bf16(x)); };
    const float want = r(r(r(r(1.f - 0.999f) * 1000.f) + r(0.1f)) + r(0.f * 0.999f));
    CHECK(float(eager.to_vector()[0]) == want);
    CHECK(want > 1.f);
  });
}

TEST_CASE("trace_pointwise.infer_checks_the_inputs_types") {
  auto g = cg::trace(world(1), [](auto c, auto a) { return cg::eval(cg::where(c, a, 0.f)); }, cg::input<bool>({4}),
                     cg::input<float>({4}));
  const cg::node* pw = g.nodes()[2];
  REQUIRE(pw->op() == "pointwise");
  // Re-adding the node over inputs of other types fails with the node's own message.
  cg::graph h;
  cg::node* a = h.add_placeholder({cg::dtype::f32, {4}});
  cg::node* b = h.add_placeholder({cg::dtype::f32, {4}});
  CHECK(error_of([&] { (void)h.add(pw->kind(), {{a, 0}, {b, 0}}); }) ==
        "fused_where: input 0 is f32[4] but the expression reads bool");
}

TEST_CASE("trace_pointwise.dropout.new_mask_per_call_same_as_eager") {
  auto fn = [](auto x, auto b) { return cg::eval(cg::dropout(cg::relu(x) + b, 0.5) * 3.f); };
  auto g = cg::trace(world(1), fn, cg::input<float>({32, 16}), cg::input<float>({16}));
  // The dropout and its producers are one node; its reader is another (see one_mask below).
  CHECK(cg::op_sequence(g) == std::vector<std::string>{"fused_relu_add_dropout", "fused_mul"});
  run(1, [&](cg::rank_context& ctx) {
    const auto x = cg::uniform<float>({32, 16}, 0.5, 1, 5);  // relu(x) + b > 0: a zero is a drop
    const auto b = cg::uniform<float>({16}, 0, 1, 6);
    auto exe = cg::compile(g, ctx);
    cg::manual_seed(11);
    const cg::tensor<float> c1 = exe(x, b);
    const cg::tensor<float> c2 = exe(x, b);
    CHECK(!tp_same(c1, c2));  // the generator moved on: a new mask
    // The same generator state gives the same mask as the eager call, bit for bit.
    cg::manual_seed(11);
    CHECK(tp_same(c1, fn(x, b)));
    CHECK(tp_same(c2, fn(x, b)));
    CHECK(cg::default_generator().offset() == 2 * 32 * 16 / 4);
  });
}

TEST_CASE("trace_pointwise.dropout.explicit_generator_and_eval_mode") {
  cg::generator gen(123);
  auto g = cg::trace(world(1), [&](auto x) {
    auto d = cg::eval(cg::dropout(x, 0.2, gen));
    auto e = cg::eval(cg::dropout(x, 0.2, gen, false) + 1.f);
    return std::make_tuple(d, e);
  }, cg::input<float>({64}));
  CHECK(gen.offset() == 0);  // tracing draws nothing
  const auto& nodes = g.nodes();
  REQUIRE(nodes[1]->op() == "pointwise");
  const auto& k1 = std::get<cg::ops::pointwise>(nodes[1]->kind()).kernel;
  const auto& k2 = std::get<cg::ops::pointwise>(nodes[2]->kind()).kernel;  // dropout(eval mode)
  CHECK(k1->draws_random());
  CHECK(!k2->draws_random());  // eval mode: the identity, nothing drawn
  run(1, [&](cg::rank_context& ctx) {
    const auto x = cg::uniform<float>({64}, 1, 2, 7);
    auto exe = cg::compile(g, ctx);
    const auto [d, e] = exe(x);
    CHECK(gen.offset() == 16);  // the explicit generator, not the default one
    CHECK(tp_same(e, cg::tensor<float>(x + 1.f)));
    cg::generator replay(123);
    CHECK(tp_same(d, cg::tensor<float>(cg::dropout(x, 0.2, replay))));
  });
}

TEST_CASE("trace_pointwise.dropout.one_mask_for_all_readers") {
  // Eagerly one dropout expression is one draw; traced, its readers read one node.
  auto fn = [](auto x) {
    auto d = cg::dropout(x, 0.5);
    auto a = cg::eval(d * 2.f);
    auto b = cg::eval(d + d);
    auto c = cg::eval(d - 1.f);
    return std::make_tuple(a, b, c);
  };
  auto g = cg::trace(world(1), fn, cg::input<float>({200}));
  CHECK(cg::op_sequence(g) == std::vector<std::string>{"fused_dropout", "fused_mul", "fused_add", "fused_sub"});
  run(1, [&](cg::rank_context& ctx) {
    const auto x = cg::uniform<float>({200}, 1, 2, 8);
    cg::manual_seed(3);
    const auto [a, b, c] = cg::compile(g, ctx)(x);
    const auto av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector();
    for (std::size_t i = 0; i < av.size(); ++i) {
      CHECK(av[i] == bv[i]);
      CHECK((av[i] == 0) == (cv[i] == -1.f));
    }
    cg::manual_seed(3);
    const auto [ea, eb, ec] = fn(x);
    CHECK(tp_same(a, cg::tensor<float>(ea)));
    CHECK(tp_same(c, cg::tensor<float>(ec)));
  });
}

TEST_CASE("trace_pointwise.dropout.not_decomposed") {
  // decompose_matmul_collectives splits row-wise nodes into chunks; a node that draws random
  // numbers stays whole (its chunks would draw apart).
  auto g = cg::trace(world(2), [](auto x, auto w) {
    auto h = cg::matmul(x, w);
    return cg::all_reduce(cg::eval(cg::dropout(h, 0.1) + 1.f), "sum", "0");
  }, cg::input<float>({8, 4}), cg::input<float>({4, 4}));
  const cg::node* drop = nullptr;
  for (const cg::node* n : g.nodes())
    if (const auto* pw = std::get_if<cg::ops::pointwise>(&n->kind()); pw && pw->kernel->draws_random()) drop = n;
  REQUIRE(drop != nullptr);
  CHECK(!cg::detail::row_args(*drop).has_value());
  auto plain = cg::trace(world(2), [](auto x, auto w) {
    return cg::all_reduce(cg::eval(cg::matmul(x, w) + 1.f), "sum", "0");
  }, cg::input<float>({8, 4}), cg::input<float>({4, 4}));
  for (const cg::node* n : plain.nodes())
    if (n->op() == "pointwise") CHECK(cg::detail::row_args(*n).has_value());
}
