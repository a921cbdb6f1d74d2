// bench_schedule: how long scheduling takes, and what it buys.
//
// Table 1: wall time of each pass on synthetic layered programs of ~1,000 and ~10,000 nodes
// (median of 5; growth from 1k to 10k should be close to 10x).
// Table 2: predicted exposed communication (H200 cost model, 2 ranks) for the seeds' reorder
// program at N = 4096 and 8192 (bf16) and the TP MLP of PERF.md (T = H = 8192, bf16), with and
// without decomposition into row chunks.
#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace cg = ccgraph;

namespace {

const cg::group pair = std::vector<int>{0, 1};

// `layers` blocks of: matmul, a fused pointwise chain, a view, and every other block an
// all_reduce: about 6 nodes per block.
auto layered(int layers) {
  return [layers](auto x) {
    auto h = x;
    for (int i = 0; i < layers; ++i) {
      auto y = cg::matmul(h, x);
      auto z = cg::eval(cg::relu(y) * 0.5f + h);
      if (i % 2 == 0) z = cg::all_reduce(z, "sum", pair);
      h = z.reshape({-1}).reshape(z.shape());
    }
    return h;
  };
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

auto seed_program = [](auto a) {
  auto ar = cg::all_reduce(a, "sum", pair);
  auto g = cg::matmul(a, a);
  auto c = cg::relu(a);
  auto d = cg::matmul(c, c);
  auto f = cg::eval(d * c * ar);
  auto fr = cg::all_reduce(f, "sum", pair);
  return cg::matmul(d + ar + fr, g);
};

auto tp_mlp = [](auto x, auto w1, auto w2) {
  return cg::wait_tensor(cg::all_reduce(cg::matmul(cg::gelu(cg::matmul(x, w1)), w2), "sum", pair));
};

}  // namespace

int main() {
  const cg::trace_options two{.rank = 0, .world_size = 2};
  std::printf("Scheduling time (ms), synthetic layered programs, one core\n");
  std::printf("%-30s %10s %10s %8s\n", "pass", "~1k nodes", "~10k nodes", "ratio");
  const std::vector<std::vector<std::string>> passes = {
      {"sink_waits"}, {"raise_comms"}, {"reorder_compute_for_overlap"}, {"overlap"},
      {"bucket_collectives"}, {"sink_waits", "raise_comms", "overlap"}};
  auto g1 = cg::trace(two, layered(170), cg::input<float>({8, 8}));
  auto g10 = cg::trace(two, layered(1700), cg::input<float>({8, 8}));
  std::printf("%-30s %10zu %10zu\n", "(nodes)", g1.size(), g10.size());
  for (const auto& p : passes) {
    double t[2];
    int k = 0;
    for (const cg::graph* g : {static_cast<const cg::graph*>(&g1), static_cast<const cg::graph*>(&g10)}) {
      std::vector<double> runs;
      for (int r = 0; r < 5; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        auto s = cg::schedule(*g, p);
        runs.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      t[k++] = median(runs);
    }
    std::string name;
    for (auto& s : p) name += (name.empty() ? "" : "+") + s;
    std::printf("%-30s %10.2f %10.2f %8.1f\n", name.c_str(), t[0], t[1], t[1] / t[0]);
  }

  cg::schedule_options opt;
  opt.model = cg::cost_model(cg::device_spec::h200());
  std::printf("\nPredicted on 2 x H200 (cost model): total ms, exposed communication ms / total communication ms\n");
  std::printf("%-34s %-36s %9s %9s %9s %7s\n", "program", "passes", "total", "exposed", "comm", "exposed%");
  auto row = [&](const char* prog, const cg::graph& g, const std::vector<std::string>& p) {
    auto s = cg::schedule(g, p, opt);
    auto tl = cg::predict(s, opt);
    std::string name;
    for (auto& x : p) name += (name.empty() ? "" : "+") + x;
    std::printf("%-34s %-36s %9.3f %9.3f %9.3f %6.1f%%\n", prog, name.empty() ? "(none)" : name.c_str(),
                tl.total_us / 1000, tl.exposed_comm_us / 1000, tl.comm_us / 1000, 100 * tl.exposed_ratio());
  };
  for (int n : {4096, 8192}) {
    auto g = cg::trace(two, seed_program, cg::input<cg::bf16>({n, n}));
    const std::string name = "seed program N=" + std::to_string(n);
    for (const auto& p : std::vector<std::vector<std::string>>{{}, {"sink_waits", "raise_comms"}, {"reorder_compute_for_overlap"}, {"overlap"}})
      row(name.c_str(), g, p);
  }
  const std::int64_t T = 8192, H = 8192;
  auto mlp = cg::trace(two, tp_mlp, cg::input<cg::bf16>({T, H}), cg::input<cg::bf16>({H, 4 * H / 2}),
                       cg::input<cg::bf16>({4 * H / 2, H}));
  row("TP MLP T=H=8192", mlp, {});
  row("TP MLP T=H=8192", mlp, {"overlap"});
  for (int chunks : {2, 4, 8}) {
    opt.decompose_chunks = chunks;
    const std::string name = "TP MLP, decomposed x" + std::to_string(chunks);
    row(name.c_str(), mlp, {"decompose_matmul_collectives", "overlap"});
  }
  return 0;
}
