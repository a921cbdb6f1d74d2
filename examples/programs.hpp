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

/// `n` all_reduces over group `g`, each on the previous one's waited result: PERF.md's
/// per-collective cost in a CUDA Graph ("64 captured").
inline auto all_reduce_chain(const group& g, int n) {
  return [g, n](auto x) {
    for (int i = 0; i < n; ++i) x = wait_tensor(all_reduce(x, "sum", g));
    return x;
  };
}

/// bench_trace's long program over the world group "0", `steps` steps on a 1-element value:
/// per 16 steps 12 pointwise nodes (relu, mul and add fused), 5 view nodes and one all_reduce
/// with its wait (19 nodes).
template <class V>
V long_chain(V x, int steps) {
  for (int i = 0; i < steps; ++i) {
    switch (i % 16) {
      case 3: x = x.reshape({1, 1}); break;
      case 4: x = x.select(0, 0); break;
      case 8: x = x.unsqueeze(0).transpose(0, 1).reshape({1}); break;
      case 12: x = all_reduce(x, "sum", "0"); break;
      default: x = V(relu(x) * 0.5f + 1.f); break;
    }
  }
  return x;
}

}  // namespace ccgraph::examples
