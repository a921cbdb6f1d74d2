// tests/nvtx_tool/host_check.cpp: the NVTX recorder (nvtx_recorder.cpp) works, without a GPU.
// Run with NVTX_INJECTION64_PATH set to the recorder library (CTest nvtx.recorder_host does),
// this program's NVTX loads it; ccgraph's NVTX wrappers (<ccgraph/cuda/nvtx.hpp>, which includes
// nvtx3 only) then open ranges, and the recorder must report exactly them, with their nesting,
// and count another domain's ranges apart. Exit 0: passed; 1: failed; 77: skipped (the variable
// is not set). tests/gpu/test_nvtx.cu reads the recorder the same way on a GPU.
#include <ccgraph/cuda/nvtx.hpp>

#include "nvtx_recorder.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  ++failures;
}

}  // namespace

int main() {
  const char* path = std::getenv("NVTX_INJECTION64_PATH");
  if (!path || !*path) {
    std::puts("skipped: NVTX_INJECTION64_PATH is not set (CTest nvtx.recorder_host sets it)");
    return 77;
  }
  nvtxInitialize(nullptr);  // NVTX loads its tool now
  void* handle = dlopen(path, RTLD_NOLOAD | RTLD_NOW);
  if (!handle) {
    std::fprintf(stderr, "FAILED: NVTX did not load %s\n", path);
    return 1;
  }
  const auto query = reinterpret_cast<ccgraph_nvtx_recorder_query_fn>(dlsym(handle, "ccgraph_nvtx_recorder_query"));
  const auto string = reinterpret_cast<ccgraph_nvtx_recorder_string_fn>(dlsym(handle, "ccgraph_nvtx_recorder_string"));
  if (!query || !string) {
    std::fprintf(stderr, "FAILED: %s is not the recorder (no ccgraph_nvtx_recorder_query)\n", path);
    return 1;
  }

  namespace nv = ccgraph::cuda::detail;
  void* matmul = nv::nvtx_register("%matmul matmul");
  void* ar = nv::nvtx_register("%all_reduce all_reduce");
  expect(matmul && ar && matmul != ar, "registered strings have distinct, non-null handles");
  // Another domain, as NCCL's own: counted apart, never among ccgraph's events.
  const nvtxDomainHandle_t other = nvtxDomainCreateA("other");
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = "elsewhere";

  nv::nvtx_push(matmul);
  nv::nvtx_pop();
  nv::nvtx_push(ar);
  nvtxDomainRangePushEx(other, &a);
  {
    nv::nvtx_scope inner("all_reduce");
  }
  nvtxDomainRangePop(other);
  nv::nvtx_pop();

  ccgraph_nvtx_record r{};
  std::vector<ccgraph_nvtx_event> ev(16);
  ev.resize(query(&r, ev.data(), 0, ev.size()));
  expect(r.initialised == 1 && r.failed == 0, "NVTX called InitializeInjectionNvtx2 once, and it installed itself (" +
                                                  std::to_string(r.initialised) + " installed, " +
                                                  std::to_string(r.failed) + " failed)");
  expect(r.domains == 2, "two domains created (" + std::to_string(r.domains) + ")");
  expect(r.strings == 2 && string(0) && string(1) && !string(2) && std::strcmp(string(0), "%matmul matmul") == 0 &&
             std::strcmp(string(1), "%all_reduce all_reduce") == 0,
         "the ccgraph domain's two strings are registered, in order");
  expect(r.other_ranges == 1, "one range in the other domain (" + std::to_string(r.other_ranges) + ")");
  expect(r.depth == 0 && r.max_depth == 2, "closed, 2 deep at most (depth " + std::to_string(r.depth) + ", max " +
                                               std::to_string(r.max_depth) + ")");
  struct want_event {
    const char* name;
    int registered, depth;
  };
  const want_event want[] = {{"%matmul matmul", 1, 1}, {nullptr, 0, 0}, {"%all_reduce all_reduce", 1, 1},
                             {"all_reduce", 0, 2},     {nullptr, 0, 1}, {nullptr, 0, 0}};
  std::string listing;
  for (const ccgraph_nvtx_event& e : ev)
    listing += std::string("  ") + (e.name ? e.name : "(pop)") + (e.name && e.registered ? " registered" : "") +
               " -> depth " + std::to_string(e.depth) + "\n";
  bool same = ev.size() == std::size(want) && r.events == std::size(want);
  for (std::size_t i = 0; same && i < ev.size(); ++i) {
    const want_event& w = want[i];
    same = (w.name ? ev[i].name && std::strcmp(ev[i].name, w.name) == 0 && ev[i].registered == w.registered
                   : !ev[i].name) &&
           ev[i].depth == w.depth;
  }
  expect(same, "the ccgraph domain's pushes and pops, in order, with their depths; recorded:\n" + listing);
  // A window of the events: from the third on, at most two.
  ccgraph_nvtx_event two[2]{};
  expect(query(nullptr, two, 2, 2) == 2 && two[0].name && std::strcmp(two[0].name, "%all_reduce all_reduce") == 0 &&
             two[1].name && std::strcmp(two[1].name, "all_reduce") == 0 && query(nullptr, two, 6, 2) == 0,
         "a window of the events");
  if (failures) return 1;
  std::printf("nvtx recorder: %zu events in the ccgraph domain, as expected\n", ev.size());
  return 0;
}
