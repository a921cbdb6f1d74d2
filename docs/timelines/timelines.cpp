// The timelines of docs/scheduling.md: each scheduling pass, before and after, on the program it
// is for, as predicted by ccgraph's H200 cost model (cg::predict). Prints the listing of each
// program and the overlap report (cg::overlap_report) of both schedules, and writes their
// Chrome traces (cg::to_chrome_trace) to <dir>/<pass>.before.json and <pass>.after.json, which
// docs/timelines/render.py turns into docs/images/<pass>.png. scripts/docs.sh runs both.
//
//   docs_timelines [dir]
#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "../../examples/programs.hpp"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace cg = ccgraph;

namespace {

const cg::group pair = std::vector<int>{0, 1};

// The seeds' reorder program (PERF.md), as examples/03_schedule_overlap.cpp runs it.
auto seed_program() { return ccgraph::examples::seed_program(pair); }

// Data-parallel gradients: eight small layers, each all_reduces its (stand-in) gradient as soon
// as it exists; the step reads them all at the end. Small all_reduces are latency-bound.
auto gradients_program() {
  return [](auto x, auto w) {
    std::vector<decltype(cg::all_reduce(x, "sum", pair))> grads;
    auto h = x;
    for (int layer = 0; layer < 8; ++layer) {
      h = cg::eval(cg::relu(cg::matmul(h, w)));
      grads.push_back(cg::all_reduce(h, "sum", pair));
    }
    auto total = cg::eval(grads[0] + grads[1]);
    for (std::size_t i = 2; i < grads.size(); ++i) total = cg::eval(total + grads[i]);
    return total;
  };
}

// A program that issues its all_reduce late: where it is written, after compute that does not
// need it.
auto late_issue_program() {
  return [](auto a) {
    auto g = cg::matmul(a, a);
    auto c = cg::relu(a);
    auto d = cg::matmul(c, c);
    auto ar = cg::all_reduce(a, "sum", pair);
    return cg::eval(d + g + ar);
  };
}

// The tensor-parallel MLP of PERF.md, x @ w1 -> gelu -> @ w2 -> all_reduce, with its residual.
auto tp_mlp_program() {
  return [](auto x, auto w1, auto w2) {
    auto h = cg::eval(cg::gelu(cg::matmul(x, w1)));
    return cg::eval(cg::all_reduce(cg::matmul(h, w2), "sum", pair) + x);
  };
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return "[" + s + "]";
}

struct figure {
  std::string name;                 // file stem: the pass shown
  std::vector<std::string> before;  // passes of the "before" schedule
  std::vector<std::string> after;   // passes of the "after" schedule
};

template <class G>
void show(const std::string& title, const G& g, const std::vector<figure>& figures, const cg::schedule_options& opt,
          const std::string& dir) {
  std::cout << "## " << title << "\n\n```\n" << static_cast<const cg::graph&>(g) << "```\n\n";
  for (const auto& f : figures) {
    for (const auto* passes : {&f.before, &f.after}) {
      const bool after = passes == &f.after;
      auto s = cg::schedule(g, *passes, opt);
      const auto tl = cg::predict(s, opt);
      std::cout << "### " << f.name << ", " << (after ? "after" : "before") << ": passes " << joined(*passes)
                << "\n\n```\n" << cg::overlap_report(tl) << "```\n\n";
      if (!dir.empty())
        std::ofstream(dir + "/" + f.name + (after ? ".after.json" : ".before.json"))
            << cg::to_chrome_trace(tl, f.name + " " + (after ? "after" : "before") + ": " + joined(*passes));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "";
  cg::schedule_options opt;
  opt.model = cg::cost_model(cg::device_spec::h200());
  const cg::trace_options two_ranks{.rank = 0, .world_size = 2};

  std::cout << "# Predicted timelines (cost model: " << opt.model.device.name << ", 2 ranks)\n\n";

  auto seed = cg::trace(two_ranks, seed_program(), cg::input<cg::bf16>({8192, 8192}));
  show("The seeds' reorder program, N = 8192, bf16", seed,
       {{"sink_waits", {}, {"sink_waits"}},
        {"reorder_compute_for_overlap", {}, {"reorder_compute_for_overlap"}},
        {"overlap", {}, {"overlap"}}},
       opt, dir);

  auto late = cg::trace(two_ranks, late_issue_program(), cg::input<cg::bf16>({8192, 8192}));
  show("An all_reduce written after independent compute, N = 8192, bf16", late,
       {{"raise_comms", {}, {"raise_comms"}}}, opt, dir);

  auto grads = cg::trace(two_ranks, gradients_program(), cg::input<cg::bf16>({128, 256}),
                         cg::input<cg::bf16>({256, 256}));
  cg::schedule_options bucket_opt = opt;
  bucket_opt.bucket_cap_bytes = 2 * 128 * 256 * 2;  // two gradients a bucket
  std::cout << "(bucket_cap_bytes = " << bucket_opt.bucket_cap_bytes << ")\n\n";
  show("Eight gradient all_reduces of 64 KiB, bf16", grads,
       {{"bucket_collectives", {"sink_waits"}, {"bucket_collectives", "sink_waits"}}}, bucket_opt, dir);

  auto mlp = cg::trace(two_ranks, tp_mlp_program(), cg::input<cg::bf16>({8192, 8192}),
                       cg::input<cg::bf16>({8192, 16384}), cg::input<cg::bf16>({16384, 8192}));
  show("Tensor-parallel MLP, T = H = 8192, bf16", mlp,
       {{"decompose_matmul_collectives", {"overlap"}, {"decompose_matmul_collectives", "overlap"}}}, opt, dir);
  return EXIT_SUCCESS;
}
