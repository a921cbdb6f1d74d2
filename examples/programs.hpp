// examples/programs.hpp: the programs of the design documents, written once for the examples,
// benchmarks, tests and documentation figures that run them (not installed: these are
// workloads, not library code). Each returns a generic callable: it runs eagerly on tensors and
// is recorded by cg::trace on symbolic values.
#pragma once

#include <ccgraph/ccgraph.hpp>

namespace ccgraph::examples {

/// The seeds' reorder program (test_reorder_compute_for_overlap; PERF.md's "seed overlap
/// pattern") over group `g`: two all_reduces, three matmuls, fused pointwise in between.
inline auto seed_program(const group& g) {
  return [g](auto a) {
    auto ar = all_reduce(a, "sum", g);
    auto gm = matmul(a, a);
    auto c = relu(a);
    auto d = matmul(c, c);
    auto f = eval(d * c * ar);
    auto fr = all_reduce(f, "sum", g);
    return matmul(d + ar + fr, gm);
  };
}

/// PERF.md's tensor-parallel MLP, one rank's shard over group `g`:
/// x @ w1 -> gelu -> @ w2 -> all_reduce(sum), waited.
inline auto tp_mlp(const group& g) {
  return [g](auto x, auto w1, auto w2) {
    auto h = gelu(matmul(x, w1));
    return wait_tensor(all_reduce(matmul(h, w2), "sum", g));
  };
}

}  // namespace ccgraph::examples
