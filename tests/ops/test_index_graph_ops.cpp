// tests/ops/test_index_graph_ops.cpp: embedding, embedding_backward, index_select, gather and
// scatter_add as graph ops (ccgraph/ops/index_ops.hpp): eager calls equal the CPU kernels, traced
// calls record one node with its attributes, the compiled graph gives the eager bits, errors are
// the same eager and traced, the cost grows with size and the planner plans the outputs.
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "graph_op_support.hpp"
#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;
using namespace ccgraph_test::graph_ops;

namespace index_graph_ops_test {

using i64 = std::int64_t;

/// Indices in [0, n) from a fixed pattern.
template <class I>
cg::tensor<I> indices(cg::shape_t shape, i64 n, i64 step = 7) {
  std::vector<I> v;
  for (i64 i = 0; i < cg::numel_of(shape); ++i) v.push_back(static_cast<I>((i * step + 3) % n));
  return cg::tensor<I>::from(v, shape);
}

template <class I>
void check_embedding() {
  const auto w = cg::uniform<float>({11, 6}, -1, 1, 3);
  const auto idx = indices<I>({3, 4}, 11);
  const auto got = cg::embedding(idx, w);
  auto want = cg::tensor<float>::empty({3, 4, 6});
  cg::detail::embedding_cpu(idx, w, want);
  CHECK(bytes_of(got) == bytes_of(want));
  // padding_idx only shapes the backward: the forward is the same rows.
  CHECK(bytes_of(cg::embedding(idx, w, -1)) == bytes_of(want));
  const std::string g = check_graph_matches_eager(
      [](const cg::group& world) {
        return [world](auto i, auto table) {
          return cg::embedding(i, cg::wait_tensor(cg::all_reduce(table, "sum", world)), 2);
        };
      },
      "embedding", idx, w);
  CHECK(contains(g, "embedding(%"));
  CHECK(contains(g, "padding_idx=2"));
  CHECK(contains(g, "f32[3, 4, 6]"));
}

TEST_CASE("embedding.graph.i64") { check_embedding<i64>(); }
TEST_CASE("embedding.graph.i32") { check_embedding<std::int32_t>(); }

TEST_CASE("embedding.graph.bf16_table_and_no_padding_printed_none") {
  const auto w = cg::uniform<cg::bf16>({5, 8}, -1, 1, 4);
  const auto idx = indices<i64>({7}, 5);
  const std::string g = check_graph_matches_eager(
      [](const cg::group&) { return [](auto i, auto table) { return cg::embedding(i, table); }; }, "", idx, w);
  CHECK(contains(g, "padding_idx=None"));
  CHECK(contains(g, "bf16[7, 8]"));
}

TEST_CASE("embedding.graph.errors_eager_and_traced") {
  const auto w = cg::uniform<float>({5, 3}, -1, 1, 1);
  CHECK(contains(same_error_eager_and_traced([](auto i, auto t) { return cg::embedding(i, t, 5); },
                                             indices<i64>({2}, 5), w),
                 "embedding: padding_idx 5 must be within num_embeddings 5"));
  CHECK(contains(same_error_eager_and_traced([](auto i, auto t) { return cg::embedding(i, t); },
                                             cg::tensor<float>::from({1, 2}, {2}), w),
                 "embedding: expected an index tensor of dtype i64 or i32, got f32"));
  CHECK(contains(same_error_eager_and_traced([](auto i, auto t) { return cg::embedding(i, t); }, indices<i64>({2}, 5),
                                             w.reshape({15})),
                 "embedding: weight must be 2-D [num_embeddings, embedding_dim], got shape [15]"));
  // An index out of range is a value, not a shape: the kernel refuses it when the graph runs.
  const auto bad = cg::tensor<i64>::from({0, 5}, {2});
  CHECK(contains(error_of([&] { (void)cg::embedding(bad, w); }), "embedding: index 5 is out of bounds for dimension 0 with size 5"));
}

TEST_CASE("embedding_backward.graph.sums_rows_and_skips_padding") {
  const auto idx = indices<i64>({4, 3}, 6, 5);
  const auto grad = cg::uniform<float>({4, 3, 5}, -1, 1, 8);
  const auto got = cg::embedding_backward(grad, idx, 6, 3);
  auto want = cg::tensor<float>::empty({6, 5});
  cg::detail::embedding_backward_cpu(grad, idx, std::optional<i64>(3), want);
  CHECK(bytes_of(got) == bytes_of(want));
  // Row 3 (the padding row) gets no gradient; another looked-up row does.
  const auto row3 = got.select(0, 3).to_vector();
  CHECK(row3 == std::vector<float>(5, 0.f));
  CHECK(got.select(0, 0).to_vector() != std::vector<float>(5, 0.f));
  const std::string g = check_graph_matches_eager(
      [](const cg::group& world) {
        return [world](auto gr, auto i) {
          return cg::embedding_backward(cg::wait_tensor(cg::all_reduce(gr, "sum", world)), i, 6, 3);
        };
      },
      "embedding_backward", grad, idx);
  CHECK(contains(g, "embedding_backward(%"));
  CHECK(contains(g, "num_weights=6, padding_idx=3"));
  CHECK(contains(same_error_eager_and_traced([](auto gr, auto i) { return cg::embedding_backward(gr, i, 6); },
                                             grad.reshape({12, 5}), idx),
                 "embedding_backward: grad of shape [12, 5] must be the indices' shape [4, 3] plus the embedding dim"));
  CHECK(contains(same_error_eager_and_traced([](auto gr, auto i) { return cg::embedding_backward(gr, i, 6); },
                                             cg::tensor<i64>::from({1, 2}, {1, 2}), idx.narrow(1, 0, 1).reshape({4})),
                 "embedding_backward: grad of shape [1, 2] must be the indices' shape [4]"));
  CHECK(contains(same_error_eager_and_traced([](auto gr, auto i) { return cg::embedding_backward(gr, i, 6); },
                                             cg::tensor<i64>::from({1, 2, 3, 4}, {4, 1}), idx.narrow(1, 0, 1).reshape({4})),
                 "embedding_backward: grad of dtype i64; gradients are floating point"));
}

TEST_CASE("index_select.graph.every_dim_and_i32") {
  const auto x = cg::uniform<double>({4, 5, 3}, -1, 1, 9);
  for (i64 dim : {0, 1, -1}) {
    INFO("dim " << dim);
    const auto ix = indices<std::int32_t>({6}, x.size(dim), 3);
    auto want = cg::tensor<double>::empty(cg::detail::index_select_shape(x.shape(), dim, ix.shape(), cg::dtype::i32));
    cg::detail::index_select_cpu(x, dim, ix, want);
    CHECK(bytes_of(cg::index_select(x, dim, ix)) == bytes_of(want));
    CHECK(bytes_of(cg::index_select(x.transpose(0, 2).contiguous().transpose(0, 2), dim, ix)) == bytes_of(want));  // strided
    const std::string g = check_graph_matches_eager(
        [dim](const cg::group& world) {
          return [world, dim](auto t, auto i) { return cg::index_select(cg::wait_tensor(cg::all_reduce(t, "sum", world)), dim, i); };
        },
        "index_select", x, ix);
    CHECK(contains(g, "index_select(%"));
    CHECK(contains(g, "dim=" + std::to_string(dim)));
  }
  CHECK(contains(same_error_eager_and_traced([](auto t, auto i) { return cg::index_select(t, 3, i); }, x,
                                             indices<i64>({2}, 3)),
                 "index_select"));
  CHECK(contains(same_error_eager_and_traced([](auto t, auto i) { return cg::index_select(t, 0, i); }, x,
                                             indices<i64>({2, 2}, 3)),
                 "index_select: index is supposed to be a vector, got shape [2, 2]"));
}

TEST_CASE("gather_scatter_add.graph") {
  const auto x = cg::uniform<float>({4, 5}, -1, 1, 10);
  const auto ix = indices<i64>({3, 5}, 4, 3);
  {
    auto want = cg::tensor<float>::empty({3, 5});
    cg::detail::gather_cpu(x, 0, ix, want);
    CHECK(bytes_of(cg::gather(x, 0, ix)) == bytes_of(want));
    const std::string g = check_graph_matches_eager(
        [](const cg::group& world) {
          return [world](auto t, auto i) { return cg::gather(cg::wait_tensor(cg::all_reduce(t, "sum", world)), 0, i); };
        },
        "gather", x, ix);
    CHECK(contains(g, "gather(%"));
    CHECK(contains(g, "dim=0"));
  }
  {
    const auto src = cg::uniform<float>({3, 5}, -1, 1, 11);
    auto want = cg::tensor<float>::empty({4, 5});
    cg::detail::scatter_add_cpu(x, 0, ix, src, want);
    const auto got = cg::scatter_add(x, 0, ix, src);
    CHECK(bytes_of(got) == bytes_of(want));
    CHECK(bytes_of(got) != bytes_of(x));  // it added something (out of place: x unchanged)
    const std::string g = check_graph_matches_eager(
        [](const cg::group& world) {
          return [world](auto t, auto i, auto s) {
            return cg::scatter_add(cg::wait_tensor(cg::all_reduce(t, "sum", world)), 0, i, s);
          };
        },
        "scatter_add", x, ix, src);
    CHECK(contains(g, "scatter_add(%"));
    CHECK(contains(g, "dim=0"));
    CHECK(contains(same_error_eager_and_traced([](auto t, auto i, auto s) { return cg::scatter_add(t, 0, i, s); }, x,
                                               ix.to<std::int32_t>(), src),
                   "scatter_add: expected dtype i64 for index, got i32"));
    CHECK(contains(same_error_eager_and_traced([](auto t, auto i, auto s) { return cg::scatter_add(t, 0, i, s); },
                                               x.to<bool>(), ix, src.to<bool>()),
                   "scatter_add: bool tensors are not supported"));
  }
  CHECK(contains(same_error_eager_and_traced([](auto t, auto i) { return cg::gather(t, 0, i); }, x,
                                             ix.to<std::int32_t>()),
                 "gather: expected dtype i64 for index, got i32"));
  CHECK(contains(same_error_eager_and_traced([](auto t, auto i) { return cg::gather(t, 1, i); }, x, indices<i64>({5, 2}, 4)),
                 "gather: size does not match at dimension 0"));
}

TEST_CASE("index_ops.graph.cost_grows_with_size") {
  auto embed = [](auto i, auto t) { return cg::embedding(i, t); };
  const auto small = cost_in(embed, "embedding", cg::input<i64>({8}), cg::input<float>({100, 16}));
  const auto large = cost_in(embed, "embedding", cg::input<i64>({64}), cg::input<float>({100, 16}));
  CHECK(small.k == cg::op_cost::kind::compute);
  CHECK(cost_size(small) > 0);
  CHECK(cost_size(large) > cost_size(small));
  auto sa = [](auto t, auto i, auto s) { return cg::scatter_add(t, 0, i, s); };
  const auto s1 = cost_in(sa, "scatter_add", cg::input<float>({8, 4}), cg::input<i64>({4, 4}), cg::input<float>({4, 4}));
  const auto s2 = cost_in(sa, "scatter_add", cg::input<float>({8, 4}), cg::input<i64>({8, 4}), cg::input<float>({8, 4}));
  CHECK(s1.flops > 0);
  CHECK(s2.flops > s1.flops);
  auto eb = [](auto g, auto i) { return cg::embedding_backward(g, i, 10); };
  CHECK(cost_size(cost_in(eb, "embedding_backward", cg::input<float>({4, 8}), cg::input<i64>({4}))) <
        cost_size(cost_in(eb, "embedding_backward", cg::input<float>({16, 8}), cg::input<i64>({16}))));
  auto gat = [](auto t, auto i) { return cg::gather(t, 1, i); };
  CHECK(cost_size(cost_in(gat, "gather", cg::input<float>({4, 8}), cg::input<i64>({4, 2}))) <
        cost_size(cost_in(gat, "gather", cg::input<float>({4, 8}), cg::input<i64>({4, 6}))));
  auto sel = [](auto t, auto i) { return cg::index_select(t, 0, i); };
  CHECK(cost_size(cost_in(sel, "index_select", cg::input<float>({4, 8}), cg::input<i64>({2}))) <
        cost_size(cost_in(sel, "index_select", cg::input<float>({4, 8}), cg::input<i64>({6}))));
}

TEST_CASE("index_ops.graph.gather_of_a_collective_group_still_resolves") {
  // cg::gather(input, dim, index) beside c10d's cg::gather(t, dst, group): both resolve.
  run(1, [](cg::rank_context& ctx) {
    const auto x = cg::uniform<float>({3, 2}, -1, 1, 12);
    const auto got = cg::gather(x, 0, ctx.world());
    REQUIRE(got.size() == 1);
    CHECK(bytes_of(got[0]) == bytes_of(x));
    CHECK(cg::gather(x, 1, cg::tensor<i64>::from({1, 0, 0}, {3, 1})).to_vector() == std::vector<float>{
                                                                                          x.to_vector()[1], x.to_vector()[2],
                                                                                          x.to_vector()[4]});
  });
}

}  // namespace index_graph_ops_test
