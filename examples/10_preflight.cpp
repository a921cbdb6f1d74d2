// Example 10: preflight, a distributed program checked on one CPU before it runs.
//
// cg::preflight traces every rank's program (no data, no backend), checks that the ranks issue
// the same collectives in the same order, reports each rank's planned peak memory and writes
// the merged predicted timeline (one Chrome trace, a process per rank). Two programs:
//   - a tensor-parallel MLP step: x @ w1 -> gelu -> @ w2 -> all_reduce, then the data-parallel
//     gradient all_reduce; every rank agrees;
//   - the same step where the last rank "freezes" its second layer and skips that all_reduce
//     (a rank-dependent branch): on a real run the other ranks would wait forever. Preflight
//     names the collective each rank issues there and the line of this file that called it.
//
// With arguments it is the command cg::preflight_main makes of the first program:
//   example_10_preflight --world 4 --passes sink_waits,raise_comms --trace preflight.json
#include <ccgraph/ccgraph.hpp>
#include <ccgraph/runtime/preflight.hpp>

#include <iostream>
#include <string>

namespace cg = ccgraph;

namespace {

constexpr std::int64_t tokens = 64, hidden = 128, ffn = 256;

int line_of_grad_all_reduce = 0;  // where the mismatched program calls the skipped collective

// What one rank runs: its traced step. `frozen` skips the second gradient's all_reduce.
cg::graph step(cg::rank_context& ctx, bool frozen) {
  const cg::group world = ctx.world();
  return cg::trace(
      [&](auto x, auto w1, auto w2) {
        auto h = cg::eval(cg::gelu(cg::matmul(x, w1)));  // this rank's columns of the FFN
        auto y = cg::all_reduce(cg::matmul(h, w2), "sum", world);  // tensor parallel: partial sums
        auto g1 = cg::all_reduce(cg::matmul(x.transpose(0, 1), h), "avg", world);  // stand-in gradients
        auto p2 = cg::matmul(h.transpose(0, 1), y);
        if (frozen) return std::make_tuple(y, g1, decltype(y)(p2));  // never reduced on this rank
        line_of_grad_all_reduce = __LINE__ + 1;
        auto g2 = cg::all_reduce(p2, "avg", world);
        return std::make_tuple(y, g1, g2);
      },
      cg::input<float>({tokens, hidden}), cg::input<float>({hidden, ffn}), cg::input<float>({ffn, hidden}));
}

cg::graph agreeing(cg::rank_context& ctx) { return step(ctx, false); }
cg::graph mismatched(cg::rank_context& ctx) { return step(ctx, ctx.rank() == ctx.world_size() - 1); }

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return cg::preflight_main(argc, argv, agreeing);

  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    std::cout << "  " << (ok ? "[ok] " : "[FAILED] ") << what << "\n";
    failures += ok ? 0 : 1;
  };

  std::cout << "agreeing program, 4 ranks, scheduled with sink_waits and raise_comms:\n";
  cg::preflight_options opt;
  opt.passes = {"sink_waits", "raise_comms"};
  const cg::preflight_report good = cg::preflight(4, agreeing, opt);
  std::cout << good.str();
  check(good.ok(), "the ranks agree");
  check(good.ranks.size() == 4 && good.ranks[3].collectives == 3, "every rank issues 3 collectives");
  bool peaks = true;
  for (const auto& r : good.ranks) peaks = peaks && r.peak_bytes > 0 && r.peak_bytes == good.ranks[0].peak_bytes;
  check(peaks, "every rank plans the same positive peak memory (SPMD)");
  check(good.trace_json.find("\"rank 3\"") != std::string::npos, "the merged trace has a process per rank");

  std::cout << "\nmismatched program (the last rank skips a gradient all_reduce), 4 ranks:\n";
  const cg::preflight_report bad = cg::preflight(4, mismatched);
  std::cout << bad.str();
  const std::string here = std::string("10_preflight.cpp:") + std::to_string(line_of_grad_all_reduce);
  check(!bad.ok(), "preflight finds the mismatch");
  check(bad.problem.find("rank 3 issues no more collectives") != std::string::npos, "it names the rank that stops");
  check(bad.problem.find(here) != std::string::npos, "it names the line that called the collective");

  std::cout << (failures ? "FAILED\n" : "all checks passed\n");
  return failures ? 1 : 0;
}
