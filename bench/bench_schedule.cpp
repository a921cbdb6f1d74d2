// bench_schedule: how long scheduling takes, and what it buys.
//
// Table 1: wall time of tracing, of each pass and of the memory plan on synthetic layered
// programs of ~1,000, ~10,000 and ~100,000 nodes, one core (median of 5 runs; each pass runs
// on a fresh copy of the traced graph, the copy not timed; the memory plan is made for the
// order `overlap` gives; "of which graph::reorder" times the IR call each reordering pass ends
// with). Linear growth is 10x from a column to the next; the last rows are cg::schedule (copy,
// passes and lint) and trace + schedule, the figure PERF.md targets (10,000 nodes well under
// 100 ms). `bench_schedule [N [R]]` stops at programs of about N nodes (default 100,000; 300000
// adds a ~300,000-node column, 3x the one before) and takes the median of R runs.
// Table 1b: on `wide` programs (a sum of thousands of all_reduced matmul results, every one
// live until the sum reaches it) of ~1,000, ~10,000 and ~50,000 nodes: bucketing (default cap
// and a 64 KiB cap, many buckets), decomposition and the memory plan, with the plan's arena,
// its lower bound (the live peak) and the most buffers live at once.
// Table 2: predicted exposed communication (H200 cost model, 2 ranks) for the seeds' reorder
// program at N = 4096 and 8192 (bf16) and the TP MLP of PERF.md (T = H = 8192, bf16), with and
// without decomposition into row chunks.
#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/memory_plan.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "bench_args.hpp"

#include "../examples/programs.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace cg = ccgraph;

namespace {

const cg::group pair = std::vector<int>{0, 1};

// `layers` blocks of: matmul, a fused pointwise chain, two views, and every other block an
// all_reduce with its wait: about 5 nodes per block.
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

// `width` gradient-like values, each a matmul scaled by a constant and all_reduced, then all
// added up in order: 5 nodes per value, and every all_reduce result is live until the sum
// reaches it (thousands of values live at once). Independent all_reduces next to each other
// (bucketing merges them) of matmul results (decomposition splits each into row chunks).
auto wide(int width) {
  return [width](auto x) {
    std::vector<decltype(cg::wait_tensor(cg::all_reduce(x, "sum", pair)))> rs;
    for (int i = 0; i < width; ++i)
      rs.push_back(cg::wait_tensor(cg::all_reduce(cg::eval(cg::matmul(x, x) * float(i + 1)), "sum", pair)));
    auto acc = rs.front();
    for (int i = 1; i < width; ++i) acc = cg::eval(acc + rs[static_cast<std::size_t>(i)]);
    return acc;
  };
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const auto seed_program = cg::examples::seed_program(pair);
const auto tp_mlp = cg::examples::tp_mlp(pair);

template <class F>
double median_ms(int runs, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  const cg::trace_options two{.rank = 0, .world_size = 2};
  const bench::args args(argc, argv, "[MAX_NODES [RUNS]]", {}, {}, 2);
  const long max_nodes = static_cast<long>(args.integer(0, 100000));
  const int runs = static_cast<int>(args.integer(1, 5));
  std::vector<int> layers;
  for (int l : {200, 2000, 20000, 60000})
    if (5L * l <= max_nodes + max_nodes / 100) layers.push_back(l);
  // Rows of the table; each program is measured in full (and dropped) before the next larger
  // one is traced, so a smaller program's times do not pay for a larger one's heap.
  const std::vector<std::string> rows = {"trace", "sink_waits", "raise_comms", "reorder_compute_for_overlap",
                                         "overlap", "bucket_collectives", "  of which graph::reorder",
                                         "memory plan (plan_memory)", "schedule(sink+raise+overlap)",
                                         "trace + schedule"};
  std::vector<std::vector<double>> ms(rows.size());
  std::vector<std::size_t> sizes;
  const cg::schedule_options sopt;
  const std::vector<std::string> pipeline = {"sink_waits", "raise_comms", "overlap"};
  for (int l : layers) {
    std::size_t r = 0;
    ms[r++].push_back(median_ms(runs, [&] { (void)cg::trace(two, layered(l), cg::input<float>({8, 8})); }));
    const cg::graph g = cg::trace(two, layered(l), cg::input<float>({8, 8}));
    sizes.push_back(g.size());
    for (const char* pass :
         {"sink_waits", "raise_comms", "reorder_compute_for_overlap", "overlap", "bucket_collectives"}) {
      std::vector<double> t;
      for (int k = 0; k < runs; ++k) {
        cg::graph copy = g;
        const auto t0 = std::chrono::steady_clock::now();
        cg::apply_pass(copy, pass, sopt);
        t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      ms[r++].push_back(median(t));
    }
    {
      // What every reordering pass ends with (graph::reorder checks and applies the order): the
      // part of the rows above that is the IR's, not the pass's.
      cg::graph copy = g;
      ms[r++].push_back(median_ms(runs, [&] { copy.reorder(copy.nodes()); }));
    }
    const auto scheduled = cg::schedule(g, {"overlap"}, sopt);
    ms[r++].push_back(median_ms(runs, [&] { (void)cg::plan_memory(scheduled); }));
    ms[r++].push_back(median_ms(runs, [&] { (void)cg::schedule(g, pipeline, sopt); }));
    ms[r].push_back(ms[0].back() + ms[r - 1].back());
  }
  std::printf("Scheduling time (ms), synthetic layered programs, one core, median of %d\n", runs);
  const char* labels[] = {"~1k", "~10k", "~100k", "~300k"};
  std::printf("%-30s", "pass");
  for (std::size_t k = 0; k < sizes.size(); ++k) std::printf(" %10s", labels[k]);
  for (std::size_t k = 1; k < sizes.size(); ++k)
    std::printf(" %10s", (std::string(labels[k] + 1) + "/" + (labels[k - 1] + 1)).c_str());
  std::printf("\n%-30s", "(nodes)");
  for (std::size_t n : sizes) std::printf(" %10zu", n);
  std::printf("\n");
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::printf("%-30s", rows[r].c_str());
    for (double x : ms[r]) std::printf(" %10.2f", x);
    for (std::size_t k = 1; k < ms[r].size(); ++k) std::printf(" %9.1fx", ms[r][k] / ms[r][k - 1]);  // growth
    std::printf("\n");
  }

  // Table 1b: graphs with thousands of values live at once.
  {
    std::vector<int> widths;
    for (int w : {200, 2000, 10000})
      if (5L * w <= max_nodes + max_nodes / 100) widths.push_back(w);
    const std::vector<std::string> wrows = {"bucket_collectives", "bucket_collectives (64 KiB cap)",
                                            "decompose_matmul_collectives", "memory plan (plan_memory)",
                                            "  buffers live at once (max)", "  arena (KiB)", "  live peak (KiB)"};
    std::vector<std::vector<double>> wv(wrows.size());
    std::vector<std::size_t> wsizes;
    for (int w : widths) {
      const cg::graph g = cg::trace(two, wide(w), cg::input<float>({8, 8}));
      wsizes.push_back(g.size());
      std::size_t r = 0;
      for (std::int64_t cap : {std::int64_t{25} << 20, std::int64_t{64} << 10}) {
        cg::schedule_options o;
        o.bucket_cap_bytes = cap;
        std::vector<double> t;
        for (int k = 0; k < runs; ++k) {
          cg::graph copy = g;
          const auto t0 = std::chrono::steady_clock::now();
          cg::apply_pass(copy, "bucket_collectives", o);
          t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        wv[r++].push_back(median(t));
      }
      {
        std::vector<double> t;
        for (int k = 0; k < runs; ++k) {
          cg::graph copy = g;
          const auto t0 = std::chrono::steady_clock::now();
          cg::apply_pass(copy, "decompose_matmul_collectives", sopt);
          t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        wv[r++].push_back(median(t));
      }
      const auto scheduled = cg::schedule(g, {"overlap"}, sopt);
      wv[r++].push_back(median_ms(runs, [&] { (void)cg::plan_memory(scheduled); }));
      const cg::memory_plan plan = cg::plan_memory(scheduled);
      std::vector<int> delta(scheduled.size() + 1, 0);
      for (const auto& b : plan.buffers) {
        ++delta[b.first];
        --delta[std::min(b.last, scheduled.size() - 1) + 1];
      }
      int live = 0, most = 0;
      for (int d : delta) most = std::max(most, live += d);
      wv[r++].push_back(most);
      wv[r++].push_back(static_cast<double>(plan.arena_bytes) / 1024);
      wv[r++].push_back(static_cast<double>(plan.live_peak_bytes) / 1024);
    }
    std::printf("\nGraphs with many values live at once (ms unless noted), median of %d\n", runs);
    std::printf("%-34s", "pass");
    for (std::size_t n : wsizes) std::printf(" %10zu", n);
    std::printf("\n");
    for (std::size_t r = 0; r < wrows.size(); ++r) {
      std::printf("%-34s", wrows[r].c_str());
      for (double x : wv[r]) std::printf(" %10.2f", x);
      std::printf("\n");
    }
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

  // PERF.md's host-cost target: trace + schedule + compile of the seed program under 1 ms
  // (torch.compile: 1-4 s). compile() on a CPU rank lints the graph and plans its memory; on a
  // GPU the CUDA Graph is recorded and instantiated at the first call, which this leaves out.
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    std::vector<double> t;
    for (int k = 0; k < 50; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      auto g = cg::trace(seed_program, cg::input<cg::bf16>({8192, 8192}));
      auto s = cg::schedule(g, {"sink_waits", "raise_comms", "overlap"}, opt);
      auto exe = cg::compile(s, ctx);
      t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    if (ctx.rank() == 0)
      std::printf("\nseed program: trace + schedule(sink_waits, raise_comms, overlap) + compile: %.3f ms "
                  "(median of 50; %zu nodes)\n",
                  median(t), cg::trace(seed_program, cg::input<cg::bf16>({8192, 8192})).size());
  });
  return 0;
}
