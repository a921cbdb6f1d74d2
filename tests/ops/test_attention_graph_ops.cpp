// tests/ops/test_attention_graph_ops.cpp: scaled_dot_product_attention (with its log-sum-exp)
// and its backward as graph ops (ccgraph/ops/attention.hpp): eager calls equal the CPU kernels,
// traced calls record one node with its attributes, the compiled graph gives the eager bits,
// errors are the same eager and traced, the cost grows with size and the planner plans every
// output.
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "graph_op_support.hpp"
#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;
using namespace ccgraph_test::graph_ops;

namespace attention_graph_ops_test {

template <class T>
void check_forward() {
  const auto q = cg::uniform<T>({2, 3, 4, 8}, -1, 1, 1);
  const auto k = cg::uniform<T>({2, 3, 6, 8}, -1, 1, 2);
  const auto v = cg::uniform<T>({2, 3, 6, 5}, -1, 1, 3);
  using L = cg::detail::sdpa_lse_t<T>;
  cg::detail::sdpa_options opt;
  opt.scale = 0.25;
  auto out = cg::tensor<T>::empty({2, 3, 4, 5});
  auto lse = cg::tensor<L>::empty({2, 3, 4});
  cg::detail::sdpa_cpu<T>(q, k, v, std::nullopt, opt, out, lse);
  const auto [o, l] = cg::scaled_dot_product_attention_with_lse(q, k, v, 0.0, false, 0.25);
  CHECK(bytes_of(o) == bytes_of(out));
  CHECK(bytes_of(l) == bytes_of(lse));
  CHECK(bytes_of(cg::scaled_dot_product_attention(q, k, v, 0.0, false, 0.25)) == bytes_of(out));
  // Causal, and the default scale 1/sqrt(E).
  opt = {};
  opt.is_causal = true;
  cg::detail::sdpa_cpu<T>(q, k, v, std::nullopt, opt, out, lse);
  CHECK(bytes_of(cg::scaled_dot_product_attention(q, k, v, 0.0, true)) == bytes_of(out));
  // A bool mask and an additive one (broadcast over the batch).
  const cg::tensor<bool> keep = cg::uniform<float>({4, 6}, 0, 1, 4) > 0.3f;
  const auto add = cg::uniform<T>({1, 3, 4, 6}, -2, 0, 5);
  opt = {};
  cg::detail::sdpa_cpu<T, bool>(q, k, v, keep, opt, out, lse);
  CHECK(bytes_of(cg::scaled_dot_product_attention(q, k, v, keep)) == bytes_of(out));
  cg::detail::sdpa_cpu<T, T>(q, k, v, add, opt, out, lse);
  CHECK(bytes_of(cg::scaled_dot_product_attention(q, k, v, add)) == bytes_of(out));

  // Traced: one node with two outputs, both planned after a collective; the graph gives the bits.
  const std::string g = check_graph_matches_eager(
      [](const cg::group& world) {
        return [world](auto q_, auto k_, auto v_, auto m_) {
          return cg::scaled_dot_product_attention_with_lse(cg::wait_tensor(cg::all_reduce(q_, "sum", world)), k_, v_,
                                                           m_, 0.0, false, 0.5);
        };
      },
      "scaled_dot_product_attention", q, k, v, keep);
  CHECK(contains(g, "scaled_dot_product_attention(%"));
  CHECK(contains(g, "dropout_p=0, is_causal=false, scale=0.5"));
  CHECK(contains(g, std::string("(") + std::string(cg::to_string(cg::dtype_v<T>)) + "[2, 3, 4, 5], " +
                        std::string(cg::to_string(cg::dtype_v<L>)) + "[2, 3, 4])"));
  const std::string causal = check_graph_matches_eager(
      [](const cg::group&) {
        return [](auto q_, auto k_, auto v_) { return cg::scaled_dot_product_attention(q_, k_, v_, 0.0, true); };
      },
      "", q, k, v);
  CHECK(contains(causal, "is_causal=true, scale=None"));
}

TEST_CASE("sdpa.graph.f32") { check_forward<float>(); }
TEST_CASE("sdpa.graph.f64") { check_forward<double>(); }
TEST_CASE("sdpa.graph.bf16") { check_forward<cg::bf16>(); }

TEST_CASE("sdpa.graph.errors_eager_and_traced") {
  const auto q = cg::uniform<float>({2, 4, 8}, -1, 1, 1);
  const auto k = cg::uniform<float>({2, 6, 8}, -1, 1, 2);
  const auto v = cg::uniform<float>({2, 6, 5}, -1, 1, 3);
  auto f = [](auto a, auto b, auto c) { return cg::scaled_dot_product_attention(a, b, c); };
  CHECK(contains(same_error_eager_and_traced(f, q, k.narrow(2, 0, 4), v),
                 "scaled_dot_product_attention: query [2, 4, 8] and key [2, 6, 4] must have the same embedding dim"));
  CHECK(contains(same_error_eager_and_traced(f, q, k, v.narrow(1, 0, 5)),
                 "scaled_dot_product_attention: key [2, 6, 8] and value [2, 5, 5] must have the same sequence length"));
  CHECK(contains(same_error_eager_and_traced([](auto a, auto b, auto c) {
                   return cg::scaled_dot_product_attention(a, b, c, 0.1);
                 }, q, k, v),
                 "scaled_dot_product_attention: dropout_p 0.1 is not supported yet (only 0)"));
  CHECK(contains(same_error_eager_and_traced([](auto a, auto b, auto c, auto m) {
                   return cg::scaled_dot_product_attention(a, b, c, m, 0.0, true);
                 }, q, k, v, cg::ones<bool>({4, 6})),
                 "scaled_dot_product_attention: explicit attn_mask should not be set when is_causal=True"));
  CHECK(contains(same_error_eager_and_traced([](auto a, auto b, auto c, auto m) {
                   return cg::scaled_dot_product_attention(a, b, c, m);
                 }, q, k, v, cg::ones<bool>({3, 6})),
                 "scaled_dot_product_attention: attn_mask of shape [3, 6] cannot be broadcast to the attention weights' "
                 "shape [2, 4, 6]"));
  CHECK(contains(same_error_eager_and_traced(f, cg::ones<std::int32_t>({2, 4, 8}), cg::ones<std::int32_t>({2, 6, 8}),
                                             cg::ones<std::int32_t>({2, 6, 5})),
                 "scaled_dot_product_attention: query of dtype i32; expected f32, f64, bf16 or f16"));
}

template <class T>
void check_backward() {
  const auto q = cg::uniform<T>({2, 4, 8}, -1, 1, 1);
  const auto k = cg::uniform<T>({2, 6, 8}, -1, 1, 2);
  const auto v = cg::uniform<T>({2, 6, 5}, -1, 1, 3);
  const auto go = cg::uniform<T>({2, 4, 5}, -1, 1, 4);
  const cg::tensor<bool> keep = cg::uniform<float>({2, 1, 6}, 0, 1, 5) > 0.3f;
  for (bool masked : {false, true}) {
    INFO("masked " << masked);
    cg::tensor<T> o;
    cg::tensor<cg::detail::sdpa_lse_t<T>> l;
    if (masked)
      std::tie(o, l) = cg::scaled_dot_product_attention_with_lse(q, k, v, keep);
    else
      std::tie(o, l) = cg::scaled_dot_product_attention_with_lse(q, k, v, 0.0, false);
    auto dq = cg::tensor<T>::empty(q.shape()), dk = cg::tensor<T>::empty(k.shape()), dv = cg::tensor<T>::empty(v.shape());
    const cg::detail::sdpa_options opt;
    if (masked)
      cg::detail::sdpa_backward_cpu<T, bool>(go, q, k, v, o, l, keep, opt, dq, dk, dv);
    else
      cg::detail::sdpa_backward_cpu<T>(go, q, k, v, o, l, std::nullopt, opt, dq, dk, dv);
    const auto got = masked ? cg::scaled_dot_product_attention_backward(go, q, k, v, o, l, keep)
                            : cg::scaled_dot_product_attention_backward(go, q, k, v, o, l);
    CHECK(bytes_of(std::get<0>(got)) == bytes_of(dq));
    CHECK(bytes_of(std::get<1>(got)) == bytes_of(dk));
    CHECK(bytes_of(std::get<2>(got)) == bytes_of(dv));
  }
  // Forward and backward in one graph: five outputs, all planned (after a collective).
  const std::string g = check_graph_matches_eager(
      [](const cg::group& world) {
        return [world](auto q_, auto k_, auto v_, auto go_) {
          auto qr = cg::wait_tensor(cg::all_reduce(q_, "sum", world));
          auto [o_, l_] = cg::scaled_dot_product_attention_with_lse(qr, k_, v_, 0.0, true);
          auto [dq_, dk_, dv_] = cg::scaled_dot_product_attention_backward(go_, qr, k_, v_, o_, l_, 0.0, true);
          return std::make_tuple(o_, dq_, dk_, dv_);
        };
      },
      "scaled_dot_product_attention_backward", q, k, v, go);
  CHECK(contains(g, "scaled_dot_product_attention_backward(%"));
  CHECK(contains(g, "is_causal=true"));
}

TEST_CASE("sdpa_backward.graph.f32") { check_backward<float>(); }
TEST_CASE("sdpa_backward.graph.f64") { check_backward<double>(); }

TEST_CASE("sdpa_backward.graph.errors_eager_and_traced") {
  const auto q = cg::uniform<float>({2, 4, 8}, -1, 1, 1);
  const auto k = cg::uniform<float>({2, 6, 8}, -1, 1, 2);
  const auto v = cg::uniform<float>({2, 6, 5}, -1, 1, 3);
  const auto [o, l] = cg::scaled_dot_product_attention_with_lse(q, k, v);
  auto bw = [](auto go, auto a, auto b, auto c, auto out, auto lse) {
    return std::get<0>(cg::scaled_dot_product_attention_backward(go, a, b, c, out, lse));
  };
  CHECK(contains(same_error_eager_and_traced(bw, o.narrow(1, 0, 3), q, k, v, o, l),
                 "scaled_dot_product_attention_backward: grad_out [2, 3, 5] and out [2, 4, 5] must have the forward "
                 "output's shape [2, 4, 5]"));
  CHECK(contains(same_error_eager_and_traced(bw, o, q, k, v, o, l.narrow(1, 0, 2)),
                 "scaled_dot_product_attention_backward: lse of shape [2, 2] for a forward of lse shape [2, 4]"));
  CHECK(contains(same_error_eager_and_traced(bw, o, q, k, v, o, l.to<double>()),
                 "scaled_dot_product_attention_backward: lse of dtype f64; expected f32 for a query of dtype f32"));
}

TEST_CASE("sdpa.graph.cost_grows_with_size") {
  auto f = [](auto a, auto b, auto c) { return cg::scaled_dot_product_attention(a, b, c); };
  auto fc = [](auto a, auto b, auto c) { return cg::scaled_dot_product_attention(a, b, c, 0.0, true); };
  const auto small = cost_in(f, "scaled_dot_product_attention", cg::input<float>({2, 16, 8}), cg::input<float>({2, 16, 8}),
                             cg::input<float>({2, 16, 8}));
  const auto large = cost_in(f, "scaled_dot_product_attention", cg::input<float>({2, 64, 8}), cg::input<float>({2, 64, 8}),
                             cg::input<float>({2, 64, 8}));
  const auto causal = cost_in(fc, "scaled_dot_product_attention", cg::input<float>({2, 64, 8}),
                              cg::input<float>({2, 64, 8}), cg::input<float>({2, 64, 8}));
  CHECK(small.peak == cg::peak_class::matmul);
  CHECK(small.flops == 2.0 * 2 * 16 * 16 * (8 + 8));
  CHECK(large.flops > small.flops);
  CHECK(causal.flops < large.flops);
  auto bw = [](auto a, auto b, auto c, auto o, auto l) {
    return std::get<0>(cg::scaled_dot_product_attention_backward(o, a, b, c, o, l));
  };
  const auto back = cost_in(bw, "scaled_dot_product_attention_backward", cg::input<float>({2, 64, 8}),
                            cg::input<float>({2, 64, 8}), cg::input<float>({2, 64, 8}), cg::input<float>({2, 64, 8}),
                            cg::input<float>({2, 64}));
  CHECK(back.flops > large.flops);
}

}  // namespace attention_graph_ops_test
