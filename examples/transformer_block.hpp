// examples/transformer_block.hpp: a pre-norm transformer block with an embedding, a language-
// model head and a cross-entropy loss, tensor-parallel over a group as Megatron-LM shards it,
// written once with public ops only for example 09, tests/ops/test_transformer_block.cpp and
// tests/gpu/test_transformer_block.cu (not installed: a workload, not library code). The program
// is a generic callable: it runs eagerly on tensors and is recorded by cg::trace on symbolic
// values; with a group of one rank and unsharded weights it is the single-rank reference.
//
//   x  = embedding(tokens, emb)                                  [B, L, D]   replicated
//   h  = layer_norm(x, ln1_w, ln1_b)
//   q, k, v = linear(h, wq | wk | wv)   column shards: this rank's H/tp heads
//   a  = scaled_dot_product_attention(q, k, v, causal)
//   x1 = x + all_reduce(linear(a, wo)) + bo                      row shard of wo, then the sum
//   m  = rms_norm(x1, ln2_w)
//   s  = silu(linear(m, w_gate)) * linear(m, w_up)               column shards (SwiGLU)
//   x2 = all_gather(x1 rows + reduce_scatter(linear(s, w_down)))  row shard; sequence-parallel pair
//   logits = all_gather(linear(layer_norm(x2, lnf_w), w_head), vocab dim)   column shard
//   loss = cross_entropy(logits, targets)
#pragma once

#include <ccgraph/ccgraph.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace ccgraph::examples {

/// The sizes of the block: batch, sequence, model dim, heads, MLP hidden dim, vocabulary.
struct block_config {
  std::int64_t batch = 2, seq = 8, dim = 16, heads = 4, ffn = 32, vocab = 24;
  double eps = 1e-5;
};

/// The block's weights in PyTorch's layouts (linear weights [out, in]).
template <class T>
struct block_params {
  tensor<T> emb, ln1_w, ln1_b, wq, wk, wv, wo, bo, ln2_w, w_gate, w_up, w_down, lnf_w, w_head;

  /// Every weight, in the order the program takes them.
  auto tuple() const { return std::tie(emb, ln1_w, ln1_b, wq, wk, wv, wo, bo, ln2_w, w_gate, w_up, w_down, lnf_w, w_head); }

  /// Random weights of `c`'s sizes, from `seed` (the same on every rank), scaled like an
  /// initialised model so that activations stay of order one.
  static block_params random(const block_config& c, std::uint64_t seed) {
    auto u = [&](shape_t s, double a, std::uint64_t k) { return uniform<T>(s, -a, a, seed * 100 + k); };
    const double wd = 1.0 / std::sqrt(static_cast<double>(c.dim)), wf = 1.0 / std::sqrt(static_cast<double>(c.ffn));
    return {u({c.vocab, c.dim}, 1.0, 1),
            eval(u({c.dim}, 0.2, 2) + T(1)),
            u({c.dim}, 0.2, 3),
            u({c.dim, c.dim}, wd, 4),
            u({c.dim, c.dim}, wd, 5),
            u({c.dim, c.dim}, wd, 6),
            u({c.dim, c.dim}, wd, 7),
            u({c.dim}, 0.2, 8),
            eval(u({c.dim}, 0.2, 9) + T(1)),
            u({c.ffn, c.dim}, wd, 10),
            u({c.ffn, c.dim}, wd, 11),
            u({c.dim, c.ffn}, wf, 12),
            eval(u({c.dim}, 0.2, 13) + T(1)),
            u({c.vocab, c.dim}, wd, 14)};
  }

  /// Rank `r`'s shard of `tp`: rows (output features) of the column-parallel weights, columns
  /// (input features) of the row-parallel ones; the rest replicated.
  block_params shard(int r, int tp) const {
    auto rows = [&](const tensor<T>& w) {
      const std::int64_t n = w.shape()[0] / tp;
      return w.narrow(0, r * n, n).contiguous();
    };
    auto cols = [&](const tensor<T>& w) {
      const std::int64_t n = w.shape()[1] / tp;
      return w.narrow(1, r * n, n).contiguous();
    };
    return {emb,       ln1_w,      ln1_b, rows(wq), rows(wk), rows(wv), cols(wo), bo, ln2_w, rows(w_gate),
            rows(w_up), cols(w_down), lnf_w, rows(w_head)};
  }

  /// The same weights in element type U (the double-precision reference).
  template <class U>
  block_params<U> to() const {
    return std::apply([](const auto&... w) { return block_params<U>{w.template to<U>()...}; }, tuple());
  }
};

/// Tokens [B, L] in [0, vocab) from a fixed pattern (`step` picks one of several).
inline tensor<std::int64_t> block_tokens(const block_config& c, std::int64_t step) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(c.batch * c.seq));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = (static_cast<std::int64_t>(i) * step + 3) % c.vocab;
  return tensor<std::int64_t>::from(v, {c.batch, c.seq});
}

/// The block on this rank, the `tp_rank`-th of `tp` ranks of group `g`, over weights sharded by
/// block_params::shard: (tokens, targets, weights...) -> (loss, x2 [B, L, D], logits [B*L, V]).
/// With tp = 1 (a group of one) and whole weights it is the single-rank model.
inline auto transformer_block(const block_config& c, const group& g, int tp_rank, int tp) {
  return [c, g, tp_rank, tp](auto tokens, auto targets, auto emb, auto ln1_w, auto ln1_b, auto wq, auto wk, auto wv,
                             auto wo, auto bo, auto ln2_w, auto w_gate, auto w_up, auto w_down, auto lnf_w,
                             auto w_head) {
    using V = decltype(emb);
    const std::int64_t B = c.batch, L = c.seq, D = c.dim, H = c.heads / tp, E = c.dim / c.heads, rows = B * L / tp;
    auto x = embedding(tokens, emb);  // [B, L, D]

    // Attention: this rank's H heads, causal; the output projection's partial sums all-reduced.
    auto h = layer_norm(x, ln1_w, ln1_b, c.eps);
    auto heads = [&](const V& w) { return linear(h, w).reshape({B, L, H, E}).transpose(1, 2).contiguous(); };
    auto a = scaled_dot_product_attention(heads(wq), heads(wk), heads(wv), 0.0, /*is_causal=*/true);  // [B, H, L, E]
    auto merged = a.transpose(1, 2).contiguous().reshape({B, L, H * E});
    V x1 = eval(x + all_reduce(linear(merged, wo), "sum", g) + bo);

    // SwiGLU MLP: its partial sums reduce-scattered over the tokens, the residual added on this
    // rank's rows, and the rows all-gathered back (all_reduce = reduce_scatter + all_gather).
    auto m = rms_norm(x1, ln2_w, c.eps);
    V s = eval(silu(linear(m, w_gate)) * linear(m, w_up));
    auto down = reduce_scatter_tensor(linear(s, w_down).reshape({B * L, D}), "sum", 0, g);  // [B*L/tp, D]
    V x2_rows = eval(x1.reshape({B * L, D}).narrow(0, tp_rank * rows, rows) + down);
    V x2 = all_gather_tensor(x2_rows, 0, g).reshape({B, L, D});

    // Head: this rank's vocabulary columns, gathered; the loss over every token.
    auto f = layer_norm(x2, lnf_w, std::nullopt, c.eps).reshape({B * L, D});
    V logits = all_gather_tensor(linear(f, w_head), 1, g);  // [B*L, vocab]
    auto loss = cross_entropy(logits, targets.reshape({B * L}));
    return std::make_tuple(loss, x2, logits);
  };
}

/// Calls `f` (the block, eager or compiled) on tokens, targets and every weight of `p`.
template <class F, class I, class T>
auto call_block(F&& f, const I& tokens, const I& targets, const block_params<T>& p) {
  return std::apply([&](const auto&... w) { return f(tokens, targets, w...); }, p.tuple());
}

}  // namespace ccgraph::examples
