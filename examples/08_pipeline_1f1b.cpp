// Example 08: pipeline parallelism with point-to-point transfers. A 4-layer MLP is split into
// 4 stages, one layer per rank of the threads backend, and trained for one step with the 1F1B
// schedule (one forward, one backward, as Megatron-LM's non-interleaved schedule): each stage
// receives activations from the previous stage and gradients from the next with cg::recv and
// cg::batch_isend_irecv, and sends its own on. The library has no autograd, so the backward is
// written out with matmul and pointwise ops:
//
//   forward   z = x @ W,  a = tanh(z)              (the last stage: a = z)
//   backward  gz = ga * (1 - a * a)                (the last stage: gz = ga)
//             gW += x^T @ gz,  gx = gz @ W^T
//   loss      sum over microbatches of 0.5 * |y - target|^2 / N, so ga = (y - target) / N
//
// The loss and every stage's weight gradient are checked against the whole MLP run on one
// rank, microbatch by microbatch in the same order: they must be equal.
#include <ccgraph/ccgraph.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

namespace cg = ccgraph;
using tensorf = cg::tensor<float>;

namespace {

constexpr int stages = 4;
constexpr int microbatches = 8;
constexpr std::int64_t mb = 4;   // rows per microbatch
constexpr std::int64_t width = 8;
constexpr float inv_n = 1.0f / (microbatches * mb);

tensorf weight(int s) { return cg::uniform<float>({width, width}, -0.6, 0.6, 100 + static_cast<std::uint64_t>(s)); }
tensorf input(int m) { return cg::uniform<float>({mb, width}, -1, 1, 200 + static_cast<std::uint64_t>(m)); }
tensorf target(int m) { return cg::uniform<float>({mb, width}, -1, 1, 300 + static_cast<std::uint64_t>(m)); }

/// One stage's layer: what its forward saves for its backward.
struct saved {
  tensorf x, a;
};

saved forward(const tensorf& x, const tensorf& w, bool last) {
  auto z = cg::matmul(x, w);
  return {x, last ? z : cg::tanh(z).eval()};
}

/// Returns the gradient for the previous stage; accumulates the weight gradient into `gw`.
tensorf backward(const saved& s, const tensorf& ga, const tensorf& w, bool last, tensorf& gw) {
  const tensorf gz = last ? ga : (ga * (1.0f - s.a * s.a)).eval();
  gw = (gw + cg::matmul(s.x.transpose(0, 1), gz)).eval();
  return cg::matmul(gz, w.transpose(0, 1));
}

/// The last stage's loss term and output gradient for microbatch `m`.
double loss_term(const tensorf& y, int m, tensorf& ga) {
  const tensorf diff = (y - target(m)).eval();
  ga = (diff * inv_n).eval();
  double l = 0;
  for (float d : diff.to_vector()) l += 0.5 * double(d) * double(d);
  return l * inv_n;
}

struct result {
  double loss = 0;
  std::vector<std::vector<float>> grads = std::vector<std::vector<float>>(stages);
};

/// The whole MLP on one rank: every microbatch forward and backward through all layers.
result reference() {
  result r;
  std::vector<tensorf> gw;
  for (int s = 0; s < stages; ++s) gw.push_back(cg::zeros<float>({width, width}));
  for (int m = 0; m < microbatches; ++m) {
    std::vector<saved> acts;
    tensorf x = input(m);
    for (int s = 0; s < stages; ++s) {
      acts.push_back(forward(x, weight(s), s == stages - 1));
      x = acts.back().a;
    }
    tensorf g;
    r.loss += loss_term(x, m, g);
    for (int s = stages - 1; s >= 0; --s) g = backward(acts[static_cast<std::size_t>(s)], g, weight(s), s == stages - 1, gw[static_cast<std::size_t>(s)]);
  }
  for (int s = 0; s < stages; ++s) r.grads[static_cast<std::size_t>(s)] = gw[static_cast<std::size_t>(s)].to_vector();
  return r;
}

}  // namespace

int main() {
  const result ref = reference();
  result pp;
  std::mutex mu;
  std::vector<std::string> timeline(stages);

  cg::run_threads(stages, [&](cg::rank_context& ctx) {
    const int s = ctx.rank();
    const bool first = s == 0, last = s == stages - 1;
    const cg::group world = std::vector<int>{0, 1, 2, 3};
    const tensorf w = weight(s);
    tensorf gw = cg::zeros<float>({width, width});
    const tensorf act_like = cg::zeros<float>({mb, width});
    std::deque<saved> in_flight;  // forwards whose backward is still to come, oldest first
    double loss = 0;
    int next_f = 0, next_b = 0;
    std::string& log = timeline[static_cast<std::size_t>(s)];

    // A forward: its input from the previous stage (or the data), its output kept.
    auto run_forward = [&](const tensorf& x) {
      const int m = next_f++;
      in_flight.push_back(forward(x, w, last));
      log += "F" + std::to_string(m) + " ";
      return in_flight.back().a;
    };
    // A backward of the oldest forward in flight; returns the gradient for the previous stage.
    auto run_backward = [&](tensorf ga) {
      const int m = next_b++;
      if (last) loss += loss_term(in_flight.front().a, m, ga);
      tensorf gx = backward(in_flight.front(), ga, w, last, gw);
      in_flight.pop_front();
      log += "B" + std::to_string(m) + " ";
      return gx;
    };
    auto recv_forward = [&] { return first ? input(next_f) : cg::recv(act_like, s - 1, world); };
    auto recv_backward = [&] { return last ? tensorf() : cg::recv(act_like, s + 1, world); };
    auto send_forward = [&](const tensorf& a) {
      if (!last) cg::send(a, s + 1, world);
    };
    auto send_backward = [&](const tensorf& g) {
      if (!first) cg::send(g, s - 1, world);
    };
    // The steady state's paired transfers, each one batch (one NCCL group on GPUs): the
    // neighbour runs the mirror image at the same time.
    auto send_forward_recv_backward = [&](const tensorf& a) {
      if (last) return tensorf();
      return cg::batch_isend_irecv({cg::isend(a, s + 1), cg::irecv(act_like, s + 1)}, world).front();
    };
    auto send_backward_recv_forward = [&](const tensorf& g) {
      if (first) return input(next_f);
      return cg::batch_isend_irecv({cg::isend(g, s - 1), cg::irecv(act_like, s - 1)}, world).front();
    };

    const int warmup = std::min(stages - s - 1, microbatches);
    const int steady = microbatches - warmup;
    for (int i = 0; i < warmup; ++i) send_forward(run_forward(recv_forward()));
    tensorf x = steady > 0 ? recv_forward() : tensorf();
    for (int i = 0; i < steady; ++i) {
      const tensorf ga = send_forward_recv_backward(run_forward(x));
      const tensorf gx = run_backward(ga);
      if (i + 1 == steady) send_backward(gx);
      else x = send_backward_recv_forward(gx);
    }
    for (int i = 0; i < warmup; ++i) send_backward(run_backward(recv_backward()));

    std::lock_guard lk(mu);
    pp.grads[static_cast<std::size_t>(s)] = gw.to_vector();
    if (last) pp.loss = loss;
  });

  std::cout << "1F1B schedule of a " << stages << "-stage MLP (" << microbatches << " microbatches of " << mb
            << " x " << width << "), one stage per threads-backend rank:\n";
  for (int s = 0; s < stages; ++s) std::cout << "  stage " << s << ": " << timeline[static_cast<std::size_t>(s)] << '\n';

  int failures = 0;
  std::cout << std::setprecision(9) << "loss: pipeline " << pp.loss << ", one rank " << ref.loss << '\n';
  if (pp.loss != ref.loss) {
    std::cout << "FAILED: the pipeline's loss differs from one rank's\n";
    ++failures;
  }
  for (int s = 0; s < stages; ++s) {
    const auto& a = pp.grads[static_cast<std::size_t>(s)];
    const auto& b = ref.grads[static_cast<std::size_t>(s)];
    float diff = 0, norm = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::abs(a[i] - b[i]));
      norm = std::max(norm, std::abs(b[i]));
    }
    std::cout << "grad W" << s << ": max |pipeline - one rank| = " << diff << " (max |grad| " << norm << ")\n";
    if (a != b || norm == 0) {
      std::cout << "FAILED: stage " << s << "'s gradient differs from one rank's\n";
      ++failures;
    }
  }
  std::cout << (failures == 0 ? "example 08: ok\n" : "example 08: FAILED\n");
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
