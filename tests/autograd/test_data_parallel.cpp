// tests/autograd/test_data_parallel.cpp: cg::all_reduce_gradients (ccgraph/autograd/
// data_parallel.hpp). Traced, the gradients' all_reduces are issued in the order the backward
// produces them, so after the schedule passes the last layer's all_reduce runs behind the rest
// of the backward (less exposed communication than issuing them in parameter order), with the
// same values; eagerly it is one all_reduce per gradient.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "autograd/dp_mlp.hpp"
#include "autograd/values.hpp"
#include "support.hpp"

namespace cg = ccgraph;

namespace dp_order_test {

using T = cg::tensor<double>;

/// Deterministic values in [lo, hi) (tests/autograd/values.hpp).
inline T values(const cg::shape_t& shape, double lo, double hi, int seed) {
  return ccgraph_test::spread_values(shape, lo, hi, seed);
}

/// The gradients of the MLP's loss all_reduced (avg) over `g`: in parameter order (w1, b1, w2,
/// b2) when `ddp` is false, else through all_reduce_gradients.
inline auto grads_step(bool ddp, cg::group g) {
  return [ddp, g](const auto& x, const auto& y, const auto& w1, const auto& b1, const auto& w2, const auto& b2) {
    using V = std::decay_t<decltype(x)>;
    auto [loss, g1, g2, g3, g4] =
        cg::value_and_grad(ccgraph_test::dp::mlp_loss{}, {2, 3, 4, 5})(x, y, w1, b1, w2, b2);
    const std::vector<V> grads{g1, g2, g3, g4};
    if (ddp) return cg::all_reduce_gradients(grads, "avg", g);
    std::vector<V> out;
    for (const V& gr : grads) out.push_back(V(cg::all_reduce(gr, "avg", g)));
    return out;
  };
}

/// Shapes of the all_reduces' inputs, in graph order.
inline std::vector<cg::shape_t> collective_shapes(const cg::graph& g) {
  std::vector<cg::shape_t> s;
  for (const cg::node* n : g.nodes())
    if (n->is_collective()) s.push_back(n->args().at(0).src->meta(n->args()[0].index).shape);
  return s;
}

}  // namespace dp_order_test

TEST_CASE("data_parallel.all_reduce_gradients.backward_order_overlaps") {
  using namespace dp_order_test;
  ccgraph_test::run(2, [](cg::rank_context& ctx) {
    const cg::shape_t sx{16, 8}, sy{16, 4}, sw1{32, 8}, sb1{32}, sw2{4, 32}, sb2{4};
    auto trace_of = [&](bool ddp) {
      return cg::trace(grads_step(ddp, ctx.world()), cg::input<double>(sx), cg::input<double>(sy),
                       cg::input<double>(sw1), cg::input<double>(sb1), cg::input<double>(sw2), cg::input<double>(sb2));
    };
    const auto naive = trace_of(false), ddp = trace_of(true);
    ddp.lint();
    // Issued last layer first: w2's and b2's gradients, then b1's and w1's (b before w or not:
    // the order the rules produce them in).
    const auto shapes = collective_shapes(ddp);
    REQUIRE(shapes.size() == 4);
    CHECK((shapes[0] == sw2 || shapes[0] == sb2));
    CHECK((shapes[1] == sw2 || shapes[1] == sb2));
    CHECK((shapes[2] == sw1 || shapes[2] == sb1));
    CHECK((shapes[3] == sw1 || shapes[3] == sb1));
    CHECK(collective_shapes(naive) == std::vector<cg::shape_t>{sw1, sb1, sw2, sb2});
    // Scheduled: the first all_reduce now starts before the backward's last matmul (w1's
    // gradient), and the cost model predicts less exposed communication.
    cg::schedule_options opt;
    opt.estimate_runtime = [](const cg::node& n) {
      if (n.is_collective()) return 80.0;
      if (n.is_wait()) return 0.0;
      if (n.op() == "matmul" || n.op() == "linear") return 50.0;
      return 5.0;
    };
    const std::vector<std::string> passes{"sink_waits", "raise_comms"};
    const auto sn = cg::schedule(naive, passes, opt), sd = cg::schedule(ddp, passes, opt);
    sd.lint();
    std::size_t first_comm = 0, last_matmul = 0;
    for (const cg::node* n : sd.nodes()) {
      if (n->is_collective() && first_comm == 0) first_comm = sd.position(n);
      if (n->op() == "matmul") last_matmul = sd.position(n);
    }
    CHECK(first_comm < last_matmul);
    const auto tn = cg::predict(sn, opt), td = cg::predict(sd, opt);
    INFO("parameter order:\n" << cg::overlap_report(tn) << "backward order:\n" << cg::overlap_report(td));
    CHECK(td.exposed_comm_us < tn.exposed_comm_us);
    // The same gradients, bit for bit, compiled and eagerly.
    const auto x = values(sx, -1, 1, 1 + ctx.rank()), y = values(sy, -1, 1, 3 + ctx.rank());
    const auto w1 = values(sw1, -0.5, 0.5, 5), b1 = values(sb1, -0.1, 0.1, 6), w2 = values(sw2, -0.5, 0.5, 7),
               b2 = values(sb2, -0.1, 0.1, 8);
    const auto want = cg::compile(naive, ctx)(x, y, w1, b1, w2, b2);
    const auto got = cg::compile(sd, ctx)(x, y, w1, b1, w2, b2);
    const auto eager = grads_step(true, ctx.world())(x, y, w1, b1, w2, b2);
    REQUIRE(got.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(got[i].to_vector() == want[i].to_vector());
      CHECK(eager[i].to_vector() == want[i].to_vector());
    }
  });
}
