// bench_eager: host cost of eager functional collectives on the threads backend.
//
// For each collective and world size, on small tensors (64 floats):
//   issue us/op  - time the calling rank's thread spends inside the call (validation, output
//                  allocation, order checking, queueing): the host overhead a user pays per op;
//   pipelined    - wall time per op for K back-to-back ops followed by one wait;
//   round trip   - wall time per op when each op is waited before the next (issue -> result).
// Medians over repeats, rank 0's view. Wall times include the peer threads' scheduling, which
// on a machine with fewer cores than 2 x world threads dominates the round trip.
//
// A second table scales the world: one world all_reduce of 4 floats per rank at 256 to 4096
// ranks (2 threads each): the whole run_threads call, the same call with an empty function
// (thread start and join alone), the slowest rank's all_reduce from issue to result, and the
// process's peak resident memory so far. `bench_eager scale` prints only this table.
#include <ccgraph/ccgraph.hpp>

#include "bench_args.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <sys/resource.h>

namespace cg = ccgraph;
using clock_type = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct row {
  std::string op;
  int world;
  double issue_us, pipelined_us, round_trip_us;
};

using launch_fn = std::function<cg::tensor<float>(const cg::tensor<float>&, cg::rank_context&)>;

row measure(const std::string& name, int world, const launch_fn& launch) {
  constexpr int ops = 200, repeats = 7;
  std::vector<double> issue, pipelined, round_trip;
  cg::run_threads(world, [&](cg::rank_context& ctx) {
    auto x = cg::uniform<float>({64}, -1, 1, static_cast<std::uint64_t>(ctx.rank()));
    for (int w = 0; w < 20; ++w) launch(x, ctx).wait();  // warm up allocator and workers
    std::vector<cg::tensor<float>> outs(ops);
    for (int rep = 0; rep < repeats; ++rep) {
      double in_call = 0;
      const auto t0 = clock_type::now();
      for (int i = 0; i < ops; ++i) {
        const auto a = clock_type::now();
        outs[static_cast<std::size_t>(i)] = launch(x, ctx);
        in_call += std::chrono::duration<double, std::micro>(clock_type::now() - a).count();
      }
      for (auto& o : outs) o.wait();
      const double piped = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
      const auto t1 = clock_type::now();
      for (int i = 0; i < ops; ++i) launch(x, ctx).wait();
      const double rt = std::chrono::duration<double, std::micro>(clock_type::now() - t1).count();
      if (ctx.rank() == 0) {
        issue.push_back(in_call / ops);
        pipelined.push_back(piped / ops);
        round_trip.push_back(rt / ops);
      }
    }
  });
  return {name, world, median(issue), median(pipelined), median(round_trip)};
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

void scale_table() {
  std::printf("one world all_reduce (4 x f32 per rank), threads backend\n");
  std::printf("%6s %10s %12s %16s %12s\n", "ranks", "run s", "empty run s", "all_reduce s", "peak MiB");
  for (int n : {256, 1024, 2048, 4096}) {
    std::atomic<double> slowest{0};
    const auto t0 = clock_type::now();
    cg::run_threads(n, [&](cg::rank_context& ctx) {
      const auto a = clock_type::now();
      auto r = cg::all_reduce(cg::full<float>({4}, 1.f), "sum", ctx.world());
      if (r.to_vector()[0] != static_cast<float>(n)) std::abort();
      const double d = seconds_since(a);
      for (double cur = slowest.load(); d > cur && !slowest.compare_exchange_weak(cur, d);) {
      }
    });
    const double run_s = seconds_since(t0);
    const auto t1 = clock_type::now();
    cg::run_threads(n, [](cg::rank_context&) {});
    const double empty_s = seconds_since(t1);
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    std::printf("%6d %10.3f %12.3f %16.3f %12.1f\n", n, run_s, empty_s, slowest.load(),
                static_cast<double>(u.ru_maxrss) / 1024.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bench::args args(argc, argv, "[scale]", {}, {}, 1);
  if (!args.positional().empty() && args.positional()[0] != "scale") args.fail("unknown mode '" + args.positional()[0] + "'");
  if (!args.positional().empty()) {
    scale_table();
    return 0;
  }
  std::vector<std::pair<std::string, launch_fn>> ops = {
      {"all_reduce", [](const cg::tensor<float>& x, cg::rank_context& c) { return cg::all_reduce(x, "sum", c.world()); }},
      {"all_gather_tensor", [](const cg::tensor<float>& x, cg::rank_context& c) { return cg::all_gather_tensor(x, 0, c.world()); }},
      {"reduce_scatter_tensor", [](const cg::tensor<float>& x, cg::rank_context& c) {
         return cg::reduce_scatter_tensor(x, "sum", 0, c.world()); }},
      {"all_to_all_single", [](const cg::tensor<float>& x, cg::rank_context& c) {
         return cg::all_to_all_single(x, std::nullopt, std::nullopt, c.world()); }},
      {"broadcast", [](const cg::tensor<float>& x, cg::rank_context& c) { return cg::broadcast(x, 0, c.world()); }},
      {"all_reduce_coalesced(x4)", [](const cg::tensor<float>& x, cg::rank_context& c) {
         return cg::all_reduce_coalesced(std::vector<cg::tensor<float>>{x, x, x, x}, "sum", c.world()).back(); }},
  };
  std::printf("ccgraph eager collectives, threads backend, 64 x f32 per rank\n");
  std::printf("%-26s %5s %12s %14s %14s\n", "op", "world", "issue us/op", "pipelined us", "round trip us");
  for (int world : {2, 4}) {
    for (auto& [name, fn] : ops) {
      const row r = measure(name, world, fn);
      std::printf("%-26s %5d %12.2f %14.2f %14.2f\n", r.op.c_str(), r.world, r.issue_us,
                  r.pipelined_us, r.round_trip_us);
    }
  }
  std::printf("\n");
  scale_table();
  return 0;
}
