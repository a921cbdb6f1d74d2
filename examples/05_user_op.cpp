// Example 05: an op the library does not have, registered by the user. A tensor-parallel SwiGLU
// MLP block needs `swiglu(h) = silu(h[:, :F]) * h[:, F:]`; here it is one user op with a CPU
// callable (a GPU program would add a `cuda` callable launching its own kernel on the given
// stream), a shape function and a cost. The block
//
//   h = x @ W1 (column shard)   ->  a = swiglu(h)  ->  y = a @ W2 (row shard)  ->  all_reduce(y)
//
// is run eagerly on 2 ranks of the threads backend, traced (the user op is a graph node like
// matmul), scheduled with the overlap passes (which price it by its cost hook), compiled over a
// memory plan and run again. Every result is checked against the same block written with
// built-in ops, and the program exits non-zero on a mismatch.
#include <ccgraph/ccgraph.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace cg = ccgraph;

namespace {

constexpr std::int64_t tokens = 16, hidden = 32, ffn = 64, ranks = 2, shard = ffn / ranks;

/// swiglu over the last dim of a [T, 2F] tensor: [T, F].
const cg::user_op& swiglu() {
  static const cg::user_op op = [] {
    cg::user_op_def d;
    d.name = "example::swiglu";
    d.infer = [](const std::vector<cg::tensor_meta>& in, const std::vector<double>&) {
      CCGRAPH_CHECK(in.size() == 1, "example::swiglu: expected one input, got ", in.size());
      const cg::tensor_meta& h = in[0];
      CCGRAPH_CHECK(h.dtype == cg::dtype::f32 && h.shape.size() == 2 && h.shape[1] % 2 == 0,
                    "example::swiglu: expected an f32 [T, 2F] tensor, got ", h.str());
      return std::vector<cg::tensor_meta>{{h.dtype, {h.shape[0], h.shape[1] / 2}}};
    };
    d.cpu = [](const cg::user_op_call& c) {
      const auto& h = std::get<cg::tensor<float>>(c.inputs[0]);
      const std::vector<float> v = h.to_vector();  // any layout, row-major values
      const std::int64_t t = h.shape()[0], f = h.shape()[1] / 2;
      float* out = std::get<cg::tensor<float>>(c.outputs[0]).data();
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t j = 0; j < f; ++j) {
          const float g = v[static_cast<std::size_t>(i * 2 * f + j)];
          const float u = v[static_cast<std::size_t>(i * 2 * f + f + j)];
          out[i * f + j] = g / (1.0f + std::exp(-g)) * u;
        }
    };
    // One pass over the input and the output; an exp, a divide and two multiplies per output.
    d.cost = [](const cg::cost_args& a, const std::vector<double>&) {
      const double out = static_cast<double>(cg::numel_of(a.out[0].shape));
      return cg::op_cost::compute(6 * out, 4.0 * (2 * out + out), cg::peak_class::vector);
    };
    return cg::register_op(std::move(d));
  }();
  return op;
}

}  // namespace

int main() {
  std::mutex mu;
  bool ok = true;
  cg::run_threads(static_cast<int>(ranks), [&](cg::rank_context& ctx) {
    const cg::group world = ctx.world();
    const auto r = static_cast<std::uint64_t>(ctx.rank());
    // The rank's shards: W1 [H, 2 * shard] holds its gate and up columns side by side.
    const auto x = cg::uniform<float>({tokens, hidden}, -1, 1, 1);
    const auto w1 = cg::uniform<float>({hidden, 2 * shard}, -0.3, 0.3, 10 + r);
    const auto w2 = cg::uniform<float>({shard, hidden}, -0.3, 0.3, 20 + r);

    auto block = [&](auto xs, auto a, auto b) {  // with the user op
      return cg::wait_tensor(cg::all_reduce(cg::matmul(swiglu()(cg::matmul(xs, a)), b), "sum", world));
    };
    auto block_builtin = [&](auto xs, auto a, auto b) {  // the same with built-in ops
      auto h = cg::matmul(xs, a);
      auto g = h.narrow(1, 0, shard), u = h.narrow(1, shard, shard);
      cg::tensor<float> act = cg::silu(g) * u;
      return cg::wait_tensor(cg::all_reduce(cg::matmul(act, b), "sum", world));
    };

    const auto eager = block(x, w1, w2).to_vector();
    const auto reference = block_builtin(x, w1, w2).to_vector();
    auto g = cg::trace(block, cg::input<float>({tokens, hidden}), cg::input<float>({hidden, 2 * shard}),
                       cg::input<float>({shard, hidden}));
    auto scheduled = cg::schedule(g, {"sink_waits", "raise_comms", "reorder_compute_for_overlap"});
    auto run = cg::compile(scheduled, ctx);
    const auto compiled = run(x, w1, w2).to_vector();

    double worst = 0;
    for (std::size_t i = 0; i < reference.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(eager[i] - reference[i])));
    const bool same = compiled == eager && worst < 1e-5;
    std::lock_guard lk(mu);
    ok = ok && same;
    if (ctx.rank() == 0) {
      std::cout << "The block, traced (the user op is one node):\n" << g << '\n';
      std::cout << "y[0, :4] = " << eager[0] << ' ' << eager[1] << ' ' << eager[2] << ' ' << eager[3] << '\n';
    }
    std::cout << "rank " << ctx.rank() << ": eager vs built-in ops max |diff| " << worst
              << ", compiled == eager: " << (compiled == eager ? "yes" : "NO") << '\n';
  });
  std::cout << (ok ? "OK: the user op ran eager, traced, scheduled and compiled, equal to built-in ops\n"
                   : "MISMATCH\n");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
