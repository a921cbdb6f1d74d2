// NVTX ranges as a tool sees them (issue 18 item 3). The tool is tests/nvtx_tool/nvtx_recorder.cpp
// (target ccgraph_nvtx_recorder), a shared library NVTX loads itself from NVTX_INJECTION64_PATH
// (a dynamic injection, as nsys attaches), which records every range opened in ccgraph's domain.
// A compiled graph run eagerly on a GPU opens one range per node, named like the node's slice in
// the Chrome traces (detail::node_label) and registered when the graph compiles; the nccl
// backend's range for a collective (named after it) nests inside its node's; an eager
// collective opens one range named after it.
// CTest's gpu.nvtx_ranges runs these cases with NVTX_INJECTION64_PATH set to the recorder; in a
// run without it (or under nsys, whose tool is then the one loaded) they skip with a message.
// Skipped without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"
#include "../nvtx_tool/nvtx_recorder.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_nvtx {

namespace cg = ccgraph;

namespace {

/// The recorder library's entry points, or why there are none.
struct recorder_lib {
  ccgraph_nvtx_recorder_query_fn query = nullptr;
  ccgraph_nvtx_recorder_string_fn string = nullptr;
  std::string skip;  // not empty: the recorder is not the attached tool (skip, saying this)
  std::string fail;  // not empty: it should be and is not (fail, saying this)
};

recorder_lib find_recorder() {
  recorder_lib lib;
  const char* path = std::getenv("NVTX_INJECTION64_PATH");
  if (!path || !*path) {
    lib.skip = "NVTX_INJECTION64_PATH is not set: no NVTX tool to record the ranges (ctest's "
               "gpu.nvtx_ranges sets it to libccgraph_nvtx_recorder.so)";
    return lib;
  }
  // NVTX loads its tool at its first call in this program: make that now (a no-op if done).
  nvtxInitialize(nullptr);
  void* handle = dlopen(path, RTLD_NOLOAD | RTLD_NOW);  // only if NVTX has loaded it
  if (!handle) {
    lib.fail = std::string("NVTX_INJECTION64_PATH=") + path + " is set but NVTX has not loaded it";
    return lib;
  }
  lib.query = reinterpret_cast<ccgraph_nvtx_recorder_query_fn>(dlsym(handle, "ccgraph_nvtx_recorder_query"));
  lib.string = reinterpret_cast<ccgraph_nvtx_recorder_string_fn>(dlsym(handle, "ccgraph_nvtx_recorder_string"));
  if (!lib.query || !lib.string) {
    lib.query = nullptr;
    lib.skip = std::string("NVTX_INJECTION64_PATH=") + path +
               " is another NVTX tool (nsys?), not ccgraph's recorder: it sees the ranges instead";
  }
  return lib;
}

ccgraph_nvtx_record record_of(const recorder_lib& lib) {
  ccgraph_nvtx_record r{};
  lib.query(&r, nullptr, 0, 0);
  return r;
}

/// The ccgraph domain's events [first, last).
std::vector<ccgraph_nvtx_event> events_of(const recorder_lib& lib, std::size_t first, std::size_t last) {
  std::vector<ccgraph_nvtx_event> ev(last > first ? last - first : 0);
  ev.resize(lib.query(nullptr, ev.data(), first, ev.size()));
  return ev;
}

/// A push (name) or a pop (no name), with the depth after it, as the recorder reports them.
struct event {
  std::string name;  // empty: a pop
  bool registered = false;
  int depth = 0;
  bool operator==(const event&) const = default;
};

std::vector<event> plain(const std::vector<ccgraph_nvtx_event>& ev) {
  std::vector<event> out;
  for (const ccgraph_nvtx_event& e : ev)
    out.push_back({e.name ? e.name : "", e.name && e.registered, e.depth});
  return out;
}

std::string listing(const std::vector<event>& ev) {
  std::string s;
  for (const event& e : ev) {
    s += "  " + std::string(static_cast<std::size_t>(e.depth + (e.name.empty() ? 1 : 0)) * 2, ' ');
    s += e.name.empty() ? std::string("pop") : "push \"" + e.name + "\"" + (e.registered ? " (registered)" : " (ascii)");
    s += " -> depth " + std::to_string(e.depth) + "\n";
  }
  return s;
}

}  // namespace

TEST_CASE("nvtx.ranges.one_per_node_and_collective_as_a_tool_sees_them" * doctest::skip(!ccgraph_test::gpu_available())) {
  const recorder_lib lib = find_recorder();
  if (!lib.skip.empty()) {
    MESSAGE("skipped: " << lib.skip);
    return;
  }
  REQUIRE_MESSAGE(lib.fail.empty(), lib.fail);
  const ccgraph_nvtx_record at_start = record_of(lib);
  CHECK_MESSAGE(at_start.initialised >= 1, "NVTX did not call the recorder's InitializeInjectionNvtx2");
  CHECK_MESSAGE(at_start.failed == 0, "NVTX gave the recorder no callback table");
  REQUIRE(at_start.depth == 0);  // no ccgraph range open between test cases

  std::vector<event> want;         // the compiled graph's run
  std::vector<std::string> labels; // every node's, registered when it compiles
  std::size_t before = 0, after_graph = 0, after_eager = 0;
  cg::cuda::run_gpus(1, [&](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0};
    auto program = [&](auto a) {
      auto ar = cg::all_reduce(a, "sum", world);
      auto m = cg::matmul(a, a);
      return cg::eval(cg::wait_tensor(ar) + m * 2.f);
    };
    auto run = cg::compile(cg::trace(program, cg::input<float>({64, 64})), ctx);
    for (const cg::node* n : run.exec().graph_ref().nodes()) {
      labels.push_back(cg::detail::node_label(*n));
      if (n->category() == cg::op_category::output) continue;
      want.push_back({labels.back(), true, 1});
      if (n->is_collective()) {  // the backend's, inside its node's
        want.push_back({std::string(n->op()), false, 2});
        want.push_back({"", false, 1});
      }
      want.push_back({"", false, 0});
    }
    const auto x = cg::ones<float>({64, 64}).cuda(0);
    before = record_of(lib).events;
    (void)run(x);
    after_graph = record_of(lib).events;
    (void)cg::all_reduce(x, "sum", world).to_vector();  // eager
    cg::cuda::synchronize();
    after_eager = record_of(lib).events;
  });
  const ccgraph_nvtx_record at_end = record_of(lib);

  const std::vector<event> graph = plain(events_of(lib, before, after_graph));
  CHECK_MESSAGE(graph == want, "the compiled graph's ranges are one per node, named by node_label, with the "
                               "backend's collective range inside its node's; recorded:\n"
                                   << listing(graph) << "expected:\n" << listing(want));
  const std::vector<event> eager = plain(events_of(lib, after_graph, after_eager));
  const std::vector<event> eager_want{{"all_reduce", false, 1}, {"", false, 0}};
  CHECK_MESSAGE((eager.size() >= 2 && std::vector<event>(eager.begin(), eager.begin() + 2) == eager_want),
                "the eager all_reduce opened (and closed) a range named all_reduce; recorded:\n" << listing(eager));
  CHECK_MESSAGE(at_end.depth == 0, "every range was closed (depth " << at_end.depth << ")");
  int deepest = 0;
  for (const event& e : graph) deepest = std::max(deepest, e.depth);
  for (const event& e : eager) deepest = std::max(deepest, e.depth);
  CHECK_MESSAGE(deepest == 2, "the backend's range nests in its node's, and nothing deeper (max depth " << deepest << ")");

  // Every node's label (the output's too) was registered in the ccgraph domain.
  std::vector<std::string> registered;
  for (std::size_t i = 0; const char* s = lib.string(i); ++i) registered.emplace_back(s);
  for (const std::string& l : labels) {
    CAPTURE(l);
    CHECK(std::find(registered.begin(), registered.end(), l) != registered.end());
  }
}

}  // namespace gpu_test_nvtx
