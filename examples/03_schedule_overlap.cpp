// Example 03: the seeds' reorder program before and after each scheduling pass.
//
//   ar = all_reduce(a); g = a @ a; c = relu(a); d = c @ c; f = d * c * ar
//   fr = all_reduce(f); e = (d + ar + fr) @ g
//
// Traced once at N = 8192 (bf16, 2 ranks) to predict, with the H200 cost model, how much
// communication each schedule leaves exposed; then each schedule is run for real at N = 64 on
// two threads-backend ranks and checked against eager. Pass a file name to also write the
// Chrome trace of the `overlap` schedule (open it in Perfetto).
#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "programs.hpp"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace cg = ccgraph;

using ccgraph::examples::seed_program;

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

int main(int argc, char** argv) {
  const cg::group pair = std::vector<int>{0, 1};
  const std::vector<std::vector<std::string>> schedules = {
      {}, {"sink_waits"}, {"raise_comms"}, {"sink_waits", "raise_comms"}, {"reorder_compute_for_overlap"}, {"overlap"}};

  cg::schedule_options opt;
  opt.model = cg::cost_model(cg::device_spec::h200());
  auto big = cg::trace(cg::trace_options{.rank = 0, .world_size = 2}, seed_program(pair),
                       cg::input<cg::bf16>({8192, 8192}));
  std::cout << "The seeds' reorder program, traced at N = 8192 bf16:\n" << big << '\n';

  int failures = 0;
  double exposed_inductor = -1, exposed_ours = -1;
  for (const auto& passes : schedules) {
    auto s = cg::schedule(big, passes, opt);
    const auto tl = cg::predict(s, opt);
    std::cout << "passes [" << joined(passes) << "]\n  order: " << joined(cg::op_sequence(s))
              << "\n  predicted: total " << tl.total_us / 1000 << " ms, exposed communication "
              << tl.exposed_comm_us / 1000 << " ms of " << tl.comm_us / 1000 << " ms\n";
    if (passes == std::vector<std::string>{"reorder_compute_for_overlap"}) exposed_inductor = tl.exposed_comm_us;
    if (passes == std::vector<std::string>{"overlap"}) {
      exposed_ours = tl.exposed_comm_us;
      std::cout << '\n' << cg::overlap_report(tl) << '\n';
      if (argc > 1) std::ofstream(argv[1]) << cg::to_chrome_trace(tl, "seed program, overlap schedule");
    }
  }
  if (exposed_ours > exposed_inductor) {
    std::cout << "FAILED: overlap exposes more communication than reorder_compute_for_overlap\n";
    ++failures;
  }

  // Every schedule computes the same thing: run each at N = 64 on 2 ranks and compare to eager.
  std::vector<int> bad(2, 0);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    auto small = cg::trace(seed_program(pair), cg::input<float>({64, 64}));
    cg::tensor<float> a = cg::uniform<float>({64, 64}, -1, 1, 7 + static_cast<std::uint64_t>(ctx.rank()));
    const auto expected = seed_program(pair)(a).to_vector();
    for (const auto& passes : schedules) {
      auto exe = cg::compile(cg::schedule(small, passes, opt), ctx);
      if (exe(a).to_vector() != expected) ++bad[static_cast<std::size_t>(ctx.rank())];
    }
  });
  failures += bad[0] + bad[1];
  std::cout << "results of all " << schedules.size() << " schedules on 2 ranks "
            << (bad[0] + bad[1] == 0 ? "equal eager" : "DIFFER from eager") << '\n';
  std::cout << (failures == 0 ? "example 03: ok\n" : "example 03: FAILED\n");
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
