// bench_trace: the host cost of tracing a program and of interpreting the compiled graph.
//
// The program is a long chain on a 1-element float tensor, on 1 rank of the threads backend:
// mostly pointwise nodes (each a fused chain of three ops) and view nodes, with an
// all_reduce (plus its wait) every 16 steps, so that per-node times are host overhead, not
// arithmetic. For programs of about 1,000, 10,000 and 100,000 nodes it prints:
//   trace ms / us per node   - cg::trace of the generic function (symbolic values, fusion,
//                              inference, naming, the collective's fake world);
//   compile ms               - cg::compile (lint, last uses, memory plan), and without the
//                              memory plan (compile_options{.memory_plan = false});
//   run ms / us per node     - one call of the compiled graph: the interpreter's overhead per
//                              node, collectives included (launched on the comm worker, waited);
//   eager us per node        - the same function run eagerly on tensors, for comparison;
//   trace growth             - trace time per node relative to the smallest program: near 1.0
//                              means tracing grows linearly with program size.
// Medians of several runs (fewer for the largest program).
//
// A second table gives the per-call cost of cg::compile_function on programs of about 100 and
// 1,000 nodes, after the first call compiled them: a call of the compiled graph alone, a call
// under the default guard (trace, structural hash and comparison, then the same run), and
// under function_guard::arguments (the shapes are the key, no trace); the guard's overhead per
// node is the difference from the compiled graph's call.
#include <ccgraph/ccgraph.hpp>
#include <ccgraph/runtime/compiled_function.hpp>

#include "bench_args.hpp"

#include "../examples/programs.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

namespace cg = ccgraph;
using clock_type = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_ms(F&& f) {
  const auto t0 = clock_type::now();
  f();
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

/// The benchmark program (examples/programs.hpp), written once for tensors and symbolic values.
using ccgraph::examples::long_chain;

struct row {
  int steps;
  std::size_t nodes;
  double trace_ms, compile_ms, compile_no_plan_ms, run_ms, eager_ms;
};

row measure(int steps, int repeats) {
  row r{steps, 0, 0, 0, 0, 0, 0};
  cg::run_threads(1, [&](cg::rank_context& ctx) {
    auto fn = [steps](auto x) { return long_chain(x, steps); };
    const auto x = cg::full<float>({1}, 0.25f);
    std::vector<double> trace, compile, compile_no_plan, run, eager;
    for (int k = 0; k < repeats; ++k) {
      cg::typed_graph<cg::tensor<float>, float> g;
      trace.push_back(time_ms([&] { g = cg::trace(fn, cg::input<float>({1})); }));
      r.nodes = g.size();
      std::optional<cg::compiled_graph<cg::tensor<float>, float>> exe;
      compile_no_plan.push_back(time_ms([&] { exe.emplace(cg::compile(g, ctx, {.memory_plan = false})); }));
      compile.push_back(time_ms([&] { exe.emplace(cg::compile(g, ctx)); }));
      (void)(*exe)(x).to_vector();  // warm: the arena is allocated on the first call
      run.push_back(time_ms([&] { (void)(*exe)(x).to_vector(); }));
      eager.push_back(time_ms([&] { (void)fn(x).to_vector(); }));
    }
    r.trace_ms = median(trace);
    r.compile_ms = median(compile);
    r.compile_no_plan_ms = median(compile_no_plan);
    r.run_ms = median(run);
    r.eager_ms = median(eager);
  });
  return r;
}

struct function_row {
  std::size_t nodes;
  double graph_us, traced_us, arguments_us;
};

function_row measure_function(int steps, int calls) {
  function_row r{0, 0, 0, 0};
  cg::run_threads(1, [&](cg::rank_context& ctx) {
    auto fn = [steps](auto x) { return long_chain(x, steps); };
    const auto x = cg::full<float>({1}, 0.25f);
    const auto g = cg::trace(fn, cg::input<float>({1}));
    r.nodes = g.size();
    const auto exe = cg::compile(g, ctx);
    auto traced = cg::compile_function<float>(fn, ctx);
    auto by_arguments = cg::compile_function<float>(fn, ctx, {.guard = cg::function_guard::arguments});
    // Each kind of call in a run of its own (the first call compiles and is not counted), so
    // that one does not pay for the caches another evicted.
    auto per_call_us = [&](auto&& call) {
      (void)call(x).to_vector();
      std::vector<double> t;
      for (int k = 0; k < calls; ++k) t.push_back(time_ms([&] { (void)call(x).to_vector(); }));
      return 1e3 * median(t);
    };
    r.graph_us = per_call_us(exe);
    r.traced_us = per_call_us(traced);
    r.arguments_us = per_call_us(by_arguments);
  });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  // The largest program, in nodes (default 100,000): `bench_trace 10000` stops at 10,000.
  const bench::args args(argc, argv, "[MAX_NODES]", {}, {}, 1);
  const long max_nodes = static_cast<long>(args.integer(0, 100000));
  std::vector<row> rows;
  // 16 steps make 19 nodes: about 1,000, 10,000 and 100,000 nodes.
  for (auto [nodes, repeats] : {std::pair{1000, 9}, std::pair{10000, 7}, std::pair{100000, 3}})
    if (nodes <= max_nodes) rows.push_back(measure(nodes * 16 / 19, repeats));
  std::printf("%9s %10s %11s %12s %11s %16s %9s %12s %14s %12s\n", "nodes", "trace ms", "trace us/node",
              "trace growth", "compile ms", "compile w/o plan", "run ms", "run us/node", "eager us/node",
              "run / eager");
  const double base = rows.front().trace_ms / static_cast<double>(rows.front().nodes);
  for (const auto& r : rows) {
    const double n = static_cast<double>(r.nodes);
    std::printf("%9zu %10.2f %11.3f %12.2f %11.2f %16.2f %9.2f %12.3f %14.3f %12.2f\n", r.nodes, r.trace_ms,
                1e3 * r.trace_ms / n, (r.trace_ms / n) / base, r.compile_ms, r.compile_no_plan_ms, r.run_ms,
                1e3 * r.run_ms / n, 1e3 * r.eager_ms / n, r.run_ms / r.eager_ms);
  }
  std::printf("\ncompile_function, per call after the first:\n");
  std::printf("%9s %14s %16s %18s %20s %22s\n", "nodes", "graph call us", "guard=trace us", "guard=arguments us",
              "trace guard us/node", "arguments guard us");
  for (int nodes : {100, 1000}) {
    if (nodes > max_nodes) continue;
    const auto f = measure_function(nodes * 16 / 19, 41);
    std::printf("%9zu %14.1f %16.1f %18.1f %20.3f %22.2f\n", f.nodes, f.graph_us, f.traced_us, f.arguments_us,
                (f.traced_us - f.graph_us) / static_cast<double>(f.nodes), f.arguments_us - f.graph_us);
  }
  return 0;
}
