// examples/gpt_block.hpp: a GPT-style block (pre-norm, causal attention + GELU MLP, no biases
// in the linears), tensor-parallel and sequence-parallel as PyTorch's parallelize_module lays
// out a Megatron/torchtitan block, written with the dtensor styles of <ccgraph/dtensor.hpp>:
//
//   x [B, L/tp, D] this rank's sequence shard
//   h  = layer_norm(x)                       sequence_parallel: on the shard, Shard(1)
//   hr = prepare_input("attention", h)       Shard(1) -> Replicate: one all_gather
//   q, k, v = linear(hr, wq | wk | wv)       colwise_parallel: this rank's H/tp heads
//   a  = sdpa(q, k, v, causal)               local heads
//   x1 = x + linear(a, wo)                   rowwise_parallel, output Shard(1): one reduce_scatter
//   m  = layer_norm(x1)                      sequence_parallel
//   y  = linear(gelu(linear(prepare_input("mlp", m), w1)), w2)   all_gather; colwise; rowwise -> RS
//   x2 = x1 + y;  loss term = sum(x2²) / (B L D)   (each rank's tokens; the loss is their sum)
//
// Shared by example 07 (CPU threads and GPUs) and bench/bench_gpu_block.cu, whose PyTorch side
// (bench/torch_block_reference.py) applies the same plan to the same module. Not installed: a
// workload, not library code. With a mesh of one rank it is the single-device block.
#pragma once

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/dtensor.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ccgraph::examples {

/// The block's sizes: batch, sequence, model dim, heads, MLP hidden dim.
struct gpt_config {
  std::int64_t batch = 2, seq = 8, dim = 16, heads = 4, ffn = 64;
  double eps = 1e-5;
};

/// The parameters' names, in the order the block takes them (PyTorch's module paths, flattened).
inline constexpr std::array<const char*, 10> gpt_names = {"ln1_w", "ln1_b", "wq", "wk", "wv",
                                                          "wo",    "ln2_w", "ln2_b", "w1", "w2"};

/// PyTorch's TP + SP plan of the block (torchtitan's): norms sequence-parallel, one all_gather
/// before each of attention and the MLP, their first linears colwise, their last rowwise with
/// a reduce_scatter back to the sequence shards.
inline parallelize_plan gpt_plan() {
  const prepare_module_input gather{.input_layouts = {shard(1)}, .desired_input_layouts = {replicate()}};
  return {{"ln1_w", sequence_parallel{}}, {"ln1_b", sequence_parallel{}},
          {"attention", gather},          {"wq", colwise_parallel{}},
          {"wk", colwise_parallel{}},     {"wv", colwise_parallel{}},
          {"wo", rowwise_parallel{.output_layouts = shard(1)}},
          {"ln2_w", sequence_parallel{}}, {"ln2_b", sequence_parallel{}},
          {"mlp", gather},                {"w1", colwise_parallel{}},
          {"w2", rowwise_parallel{.output_layouts = shard(1)}}};
}

/// Whole parameters in PyTorch's layouts (linear weights [out, in]), initialised as
/// nn.Linear / nn.LayerNorm would be (uniform ±1/sqrt(in); norms near one), from `gen`.
template <class T>
std::vector<tensor<T>> gpt_random_params(const gpt_config& c, const generator& gen) {
  const double bd = 1 / std::sqrt(double(c.dim)), bf = 1 / std::sqrt(double(c.ffn));
  auto u = [&](shape_t s, double a) { return uniform<T>(std::move(s), -a, a, gen); };
  const shape_t dd{c.dim, c.dim}, d{c.dim};
  return {eval(u(d, 0.1) + 1.0), u(d, 0.1), u(dd, bd), u(dd, bd), u(dd, bd), u(dd, bd),
          eval(u(d, 0.1) + 1.0), u(d, 0.1), u({c.ffn, c.dim}, bd), u({c.dim, c.ffn}, bf)};
}

/// The parameters by name.
template <class V>
std::map<std::string, V> gpt_named(const std::vector<V>& params) {
  std::map<std::string, V> m;
  for (std::size_t i = 0; i < gpt_names.size(); ++i) m.emplace(gpt_names[i], params.at(i));
  return m;
}

/// This rank's pieces of whole parameters under gpt_plan() on the 1-d mesh `mesh`, in order.
template <class T>
std::vector<tensor<T>> gpt_shards(const std::vector<tensor<T>>& whole, const device_mesh& mesh) {
  const auto m = parallelize_module(gpt_named(whole), mesh, gpt_plan());
  std::vector<tensor<T>> out;
  for (const char* n : gpt_names) out.push_back(m[n].to_local());
  return out;
}

/// This rank's sequence shard of whole activations [B, L, D] on a mesh of `tp` ranks.
template <class T>
tensor<T> gpt_sequence_shard(const tensor<T>& x, int rank, int tp) {
  const std::int64_t n = x.shape()[1] / tp;
  return x.narrow(1, rank * n, n).contiguous();
}

/// The block's loss term on this rank of the 1-d mesh `mesh`: (x [B, L/tp, D], the 10 local
/// parameters in gpt_names' order) -> sum over this rank's tokens of x2² / (B L D). The loss is
/// the sum of every rank's term; cg::value_and_grad gives each rank its parameters' gradients
/// (the replicated norms' summed over the ranks, or with `partial_norm_grads` each rank's term
/// of them, as PyTorch's parallelize_module leaves them: parallelize_options::partial_grads).
inline auto gpt_block_loss(const gpt_config& c, const device_mesh& mesh, bool partial_norm_grads = false) {
  return [c, mesh, partial_norm_grads](auto x, auto ln1_w, auto ln1_b, auto wq, auto wk, auto wv, auto wo, auto ln2_w,
                                       auto ln2_b, auto w1, auto w2) {
    using V = decltype(x);
    const std::int64_t tp = mesh.size(), B = c.batch, L = c.seq, H = c.heads / tp, E = c.dim / c.heads;
    const auto block = parallelize_module(
        gpt_named(std::vector<V>{ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, w1, w2}), mesh, gpt_plan(),
        {.local_shards = true, .partial_grads = partial_norm_grads});

    // Attention: the normed shards gathered once for the three projections, this rank's heads.
    const V h = block.layer_norm("ln1_w", x, "ln1_b", c.eps).to_local();
    const auto hr = block.prepare_input("attention", h);
    auto heads = [&](const char* w) { return block.linear(w, hr).to_local().reshape({B, L, H, E}).transpose(1, 2); };
    // One statement each: the order of a call's arguments is unspecified (g++ traces the last
    // first), and the projections' order is the order their weights' gathers are waited for.
    const V q = heads("wq");
    const V k = heads("wk");
    const V v = heads("wv");
    const V a = scaled_dot_product_attention(q, k, v, 0.0, /*is_causal=*/true);
    const V merged = a.transpose(1, 2).contiguous().reshape({B, L, H * E});
    const V x1 = eval(x + block.linear("wo", merged).to_local());  // reduce_scatter to the shards

    // MLP: gathered once more, GELU on this rank's columns, reduce-scattered back.
    const V m = block.layer_norm("ln2_w", x1, "ln2_b", c.eps).to_local();
    const V u = gelu(block.linear("w1", block.prepare_input("mlp", m)).to_local());
    const V x2 = eval(x1 + block.linear("w2", u).to_local());
    const double scale = 1.0 / double(B * L * c.dim);
    return V(sum(V(x2 * x2)) * scale);
  };
}

/// The block under FSDP on mesh["dp"] (cg::fully_shard, PyTorch's FSDP2) times tensor + sequence
/// parallelism on mesh["tp"] (gpt_plan(); a "tp" of one rank is plain FSDP): (x [B/dp, L/tp, D],
/// each of the 10 parameters' dim-0 piece on mesh["dp"] of its piece on mesh["tp"], in gpt_names'
/// order) -> this rank's term of the loss, scaled so that the terms of all ranks sum to the
/// single-device loss of the whole batch. Each parameter is all_gathered on "dp" just before the
/// block reads it (in gpt_names' order, its order of use), and its gradient reduce_scattered back.
/// `c` is the whole batch's config (c.batch divisible by the size of "dp"). `reshard_after_forward`
/// as fully_shard_options has it; off by default, as PyTorch's FSDP2 leaves the root module's
/// parameters unsharded between forward and backward (here the block is the whole model).
inline auto gpt_fsdp_block_loss(const gpt_config& c, const device_mesh& mesh, bool reshard_after_forward = false) {
  const device_mesh dp = mesh["dp"], tp = mesh["tp"];
  gpt_config local = c;
  local.batch = c.batch / dp.size();
  return [local, dp, tp, reshard_after_forward](auto x, auto ln1_w, auto ln1_b, auto wq, auto wk, auto wv, auto wo, auto ln2_w, auto ln2_b,
                         auto w1, auto w2) {
    using V = decltype(x);
    const auto fs = fully_shard(gpt_named(std::vector<V>{ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, w1, w2}), dp,
                                {.local_shards = true, .reshard_after_forward = reshard_after_forward});
    std::vector<V> full;
    for (const char* n : gpt_names) full.push_back(fs.unshard(n));
    const V term = gpt_block_loss(local, tp)(x, full[0], full[1], full[2], full[3], full[4], full[5], full[6], full[7],
                                             full[8], full[9]);
    return V(term * (1.0 / double(dp.size())));  // each rank's term over its B/dp of the batch
  };
}

/// This rank's pieces for gpt_fsdp_block_loss of whole parameters: the TP shards on mesh["tp"],
/// then their dim-0 pieces on mesh["dp"], in gpt_names' order.
template <class T>
std::vector<tensor<T>> gpt_fsdp_shards(const std::vector<tensor<T>>& whole, const device_mesh& mesh) {
  const auto fs = fully_shard(gpt_named(gpt_shards(whole, mesh["tp"])), mesh["dp"]);
  std::vector<tensor<T>> out;
  for (const char* n : gpt_names) out.push_back(fs[n].to_local());
  return out;
}

}  // namespace ccgraph::examples
