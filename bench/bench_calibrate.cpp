// bench_calibrate: measures the collectives of the threads backend and writes the calibration
// table the cost model loads (ccgraph/schedule/cost_model.hpp, `op,group_size,bytes,us`).
//
//   bench_calibrate [out.csv]     CSV to out.csv (or stdout), the comparison table to stderr
//
// all_reduce, all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single on world
// sizes 2 and 4, per-rank inputs of 4 KiB to 16 MiB (f32, powers of 4). Each point is the median
// round trip (issue, then wait) seen by rank 0 over repeats, random data; the number of
// repeats shrinks with the size (3 at the largest) and sizes from 1 MiB skip the warm-up, so
// the run takes seconds; the largest points dominate, so a slow or busy machine takes longer.
// Each op allocates its output, as eager code does, so page faults are part of the time. The
// table compares each point with the analytical prediction for device_spec::cpu_threads().
// The CSV's `#@` lines record the machine (bench/measured_on.hpp): backend, CPU, cores,
// compiler, date.
#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/cost_model.hpp>

#include "bench_args.hpp"
#include "measured_on.hpp"
#include "progress.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace cg = ccgraph;
using clock_type = std::chrono::steady_clock;

namespace {

using launch_fn = std::function<cg::tensor<float>(const cg::tensor<float>&, cg::rank_context&)>;

struct collective {
  cg::ops::collective_op op;  // for the model and the CSV name
  launch_fn launch;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median round trip in us of `launch` on `world` ranks with `bytes` of f32 per rank.
double measure(const launch_fn& launch, int world, std::int64_t bytes) {
  const std::int64_t numel = bytes / static_cast<std::int64_t>(sizeof(float));
  // About 10 MB of inputs per size over all ranks, between 3 and 100 repeats.
  const int repeats = static_cast<int>(std::clamp<std::int64_t>(10'000'000 / (bytes * world), 3, 100));
  std::vector<double> times;
  cg::run_threads(world, [&](cg::rank_context& ctx) {
    const auto x = cg::uniform<float>({numel}, -1, 1, static_cast<std::uint64_t>(ctx.rank() + 1));
    if (bytes < (1 << 20)) launch(x, ctx).wait();  // warm-up (large sizes fault their pages anyway)
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = clock_type::now();
      auto y = launch(x, ctx);
      y.wait();
      const double us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
      if (ctx.rank() == 0) times.push_back(us);
    }
  });
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  const bench::args args(argc, argv, "[OUT.csv]", {}, {}, 1);
  const std::vector<collective> colls = {
      {cg::ops::all_reduce{cg::reduce_op::sum},
       [](const cg::tensor<float>& x, cg::rank_context& c) { return cg::all_reduce(x, "sum", c.world()); }},
      {cg::ops::all_gather_into_tensor{0},
       [](const cg::tensor<float>& x, cg::rank_context& c) { return cg::all_gather_tensor(x, 0, c.world()); }},
      {cg::ops::reduce_scatter_tensor{cg::reduce_op::sum, 0},
       [](const cg::tensor<float>& x, cg::rank_context& c) {
         return cg::reduce_scatter_tensor(x, "sum", 0, c.world()); }},
      {cg::ops::all_to_all_single{},
       [](const cg::tensor<float>& x, cg::rank_context& c) {
         return cg::all_to_all_single(x, std::nullopt, std::nullopt, c.world()); }},
  };
  std::vector<std::int64_t> sizes;
  for (std::int64_t b = 4 << 10; b <= 16 << 20; b *= 4) sizes.push_back(b);

  const cg::cost_model model(cg::device_spec::cpu_threads());
  cg::calibration table;
  const auto start = clock_type::now();
  std::fprintf(stderr, "threads backend collectives: measured vs cost_model(cpu_threads) analytic\n");
  std::fprintf(stderr, "| %-22s | %5s | %10s | %12s | %12s | %7s | %9s |\n", "op", "world", "bytes",
               "measured us", "predicted us", "ratio", "GB/s");
  std::fprintf(stderr, "|%s|%s|%s|%s|%s|%s|%s|\n", std::string(24, '-').c_str(), std::string(7, '-').c_str(),
               std::string(12, '-').c_str(), std::string(14, '-').c_str(), std::string(14, '-').c_str(),
               std::string(9, '-').c_str(), std::string(11, '-').c_str());
  bench::progress prog(2 * colls.size() * sizes.size());  // on a terminal only
  for (int world : {2, 4}) {
    for (const auto& c : colls) {
      const std::string name(cg::ops::name_of(c.op));
      for (const auto bytes : sizes) {
        prog.step(name + ", " + std::to_string(world) + " ranks, " + std::to_string(bytes) + " bytes");
        const double us = measure(c.launch, world, bytes);
        prog.clear();
        table.add(name, world, bytes, us);
        const cg::tensor_meta in{cg::dtype::f32, {bytes / 4}};
        cg::ops::collective_op op = c.op;
        if (auto* a2a = std::get_if<cg::ops::all_to_all_single>(&op)) {  // even splits, for the model
          a2a->input_split_sizes.assign(static_cast<std::size_t>(world), bytes / 4 / world);
          a2a->output_split_sizes = a2a->input_split_sizes;
        }
        const double predicted = model.collective_us(op, {in}, world);
        std::fprintf(stderr, "| %-22s | %5d | %10lld | %12.1f | %12.1f | %7.2f | %9.2f |\n", name.c_str(), world,
                     static_cast<long long>(bytes), us, predicted, predicted / us, double(bytes) / us / 1e3);
      }
    }
  }
  std::fprintf(stderr, "%zu points in %.1f s; ratio = predicted / measured, GB/s = input bytes / measured\n",
               table.size(), std::chrono::duration<double>(clock_type::now() - start).count());

  table.set_measured_on("backend", "threads");
  bench::record_host(table);
  if (!args.positional().empty()) {
    const char* path = args.positional()[0].c_str();
    std::ofstream out(path);
    if (!out) {
      std::fprintf(stderr, "bench_calibrate: cannot write %s\n", path);
      return 1;
    }
    table.save(out);
    std::fprintf(stderr, "wrote %s\n", path);
  } else {
    table.save(std::cout);
  }
  return 0;
}
