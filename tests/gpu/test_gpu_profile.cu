// Profiled calls on GPUs (basic_executor::run_profiled): CUDA timing events per node on the
// rank's stream and per collective on the stream it ran on; the refusal in cuda_graph mode; the
// NVTX ranges the executor opens per node (recorded through the device runtime's NVTX entries).
// Skipped without a GPU (the 2-rank case without two).
#include <ccgraph/cuda.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_gpu_profile {

namespace cg = ccgraph;

namespace {

std::vector<int> world_ranks(int n) {
  std::vector<int> r(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) r[static_cast<std::size_t>(i)] = i;
  return r;
}

/// Every node once, in order; intervals ordered and non-negative; collectives alone on the
/// communication track; the compute track in order (one stream).
void check_measured(const cg::graph& g, const cg::timeline& tl) {
  REQUIRE(tl.events.size() == g.nodes().size());
  double compute_free = 0, comm_free = 0;
  for (std::size_t i = 0; i < tl.events.size(); ++i) {
    const cg::timeline_event& ev = tl.events[i];
    CAPTURE(i);
    CHECK(ev.n == g.nodes()[i]);
    CHECK(ev.on_comm_stream == ev.n->is_collective());
    CHECK(ev.start_us >= 0);
    CHECK(ev.end_us >= ev.start_us);
    CHECK(ev.end_us <= tl.total_us + 1e-3);
    CHECK(ev.stall_us >= 0);
    if (ev.on_comm_stream) {
      CHECK(ev.start_us >= comm_free);
      comm_free = ev.end_us;
    } else {
      // CUDA events resolve about half a microsecond.
      CHECK(ev.start_us - ev.stall_us >= compute_free - 1.0);
      compute_free = ev.end_us;
    }
  }
}

/// A matmul of n x n on the compute stream beside an all_reduce of the input, then a small
/// pointwise op: the matmul is the longest compute node by far.
auto matmul_program(const cg::group& g) {
  return [g](auto a) {
    auto ar = cg::all_reduce(a, "sum", g);
    auto m = cg::matmul(a, a);
    auto m2 = cg::matmul(m, a);
    return cg::eval(cg::wait_tensor(ar) + cg::relu(m2) * 0.5f);
  };
}

void profile_on(int ranks) {
  const cg::group world = world_ranks(ranks);
  constexpr std::int64_t n = 4096;
  cg::cuda::run_gpus(ranks, [&](cg::rank_context& ctx) {
    auto g = cg::schedule(cg::trace(matmul_program(world), cg::input<float>({n, n})), {"sink_waits", "raise_comms"});
    auto run = cg::compile(g, ctx);
    const auto x = cg::uniform<float>({n, n}, -1, 1, 7 + static_cast<std::uint64_t>(ctx.rank())).cuda(ctx.rank());
    const auto plain = run(x).to_vector();
    for (int call = 0; call < 2; ++call) {  // the first call also makes the communicators
      INFO("rank " << ctx.rank() << ", call " << call);
      const auto p = run.profile(x);
      CHECK(p.result.to_vector() == plain);
      const cg::graph& eg = run.exec().graph_ref();
      check_measured(eg, p.measured);
      const cg::timeline_event* slowest = nullptr;
      int collectives = 0;
      for (const auto& ev : p.measured.events) {
        if (ev.on_comm_stream) {
          ++collectives;
          CHECK(ev.end_us > ev.start_us);  // an all_reduce of 64 MiB takes time
          continue;
        }
        if (!slowest || ev.end_us - ev.start_us > slowest->end_us - slowest->start_us) slowest = &ev;
      }
      CHECK(collectives == 1);
      REQUIRE(slowest != nullptr);
      CHECK(std::string(slowest->n->op()) == "matmul");
      // Two 4096^3 GEMMs: well over 100 us on any GPU.
      CHECK(p.measured.compute_us > 100);
      CHECK(p.measured.total_us >= p.measured.compute_us * 0.5);
      CHECK(p.measured.exposed_comm_us >= 0);
      const std::string json = cg::predicted_vs_measured_trace(cg::predict(g), p.measured);
      CHECK(json.find("\"measured\"") != std::string::npos);
    }
  });
}

/// Records what the executor asks of the device runtime's NVTX entries (so no tool is needed).
struct nvtx_recorder {
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::string>& names() {
    static std::vector<std::string> v;
    return v;
  }
  static std::vector<std::string>& pushed() {
    static std::vector<std::string> v;
    return v;
  }
  static int& depth() {
    static int d = 0;
    return d;
  }
  static void* reg(const char* label) {
    std::lock_guard lk(mu());
    names().emplace_back(label);
    return reinterpret_cast<void*>(names().size());  // 1-based index, never null
  }
  static void push(void* h) {
    std::lock_guard lk(mu());
    pushed().push_back(names().at(reinterpret_cast<std::size_t>(h) - 1));
    ++depth();
  }
  static void pop() {
    std::lock_guard lk(mu());
    --depth();
  }
};

}  // namespace

TEST_CASE("gpu_profile.events.1_gpu" * doctest::skip(ccgraph_test::gpu_count() < 1)) { profile_on(1); }

TEST_CASE("gpu_profile.events.2_gpus" * doctest::skip(ccgraph_test::gpu_count() < 2)) { profile_on(2); }

TEST_CASE("gpu_profile.cuda_graph_mode_is_refused" * doctest::skip(ccgraph_test::gpu_count() < 1)) {
  cg::cuda::run_gpus(1, [](cg::rank_context& ctx) {
    auto g = cg::trace(matmul_program(world_ranks(1)), cg::input<float>({64, 64}));
    auto replayed = cg::compile(g, ctx, {.cuda_graph = true});
    const auto x = cg::ones<float>({64, 64}).cuda(0);
    (void)replayed(x);
    std::string msg;
    try {
      (void)replayed.profile(x);
    } catch (const cg::error& e) {
      msg = e.what();
    }
    CHECK(msg.find("compiled graph: profile: this graph replays a CUDA Graph (compile_options::cuda_graph)") !=
          std::string::npos);
    // The same graph compiled without it profiles.
    auto eager = cg::compile(g, ctx);
    CHECK(eager.profile(x).measured.events.size() == eager.exec().graph_ref().nodes().size());
  });
}

TEST_CASE("gpu_profile.nvtx.one_range_per_node_named_like_the_trace" * doctest::skip(ccgraph_test::gpu_count() < 1)) {
  // The executor registers each node's label once, at compile, and opens a range per node it
  // runs; the runtime's NVTX entries are swapped for a recorder for this case.
  const cg::detail::device_runtime* real = cg::detail::device_runtime_slot();
  REQUIRE(real != nullptr);
  cg::detail::device_runtime recording = *real;
  recording.nvtx_register = &nvtx_recorder::reg;
  recording.nvtx_push = &nvtx_recorder::push;
  recording.nvtx_pop = &nvtx_recorder::pop;
  struct restore {
    const cg::detail::device_runtime* rt;
    ~restore() { cg::detail::device_runtime_slot() = rt; }
  } guard{real};
  cg::detail::device_runtime_slot() = &recording;
  std::vector<std::string> want;
  cg::cuda::run_gpus(1, [&](cg::rank_context& ctx) {
    auto g = cg::trace(matmul_program(world_ranks(1)), cg::input<float>({64, 64}));
    auto run = cg::compile(g, ctx);
    for (const cg::node* n : run.exec().graph_ref().nodes())
      if (n->category() != cg::op_category::output) want.push_back(cg::detail::node_label(*n));
    (void)run(cg::ones<float>({64, 64}).cuda(0));
    // A CPU rank's executor opens none.
  });
  cg::detail::device_runtime_slot() = real;
  std::lock_guard lk(nvtx_recorder::mu());
  CHECK(nvtx_recorder::pushed() == want);
  CHECK(nvtx_recorder::depth() == 0);
  // Labels are registered once per compiled graph: one name per node (the output's too).
  CHECK(nvtx_recorder::names().size() == want.size() + 1);
}

}  // namespace gpu_test_gpu_profile
