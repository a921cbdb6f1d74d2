// NVTX ranges as a tool sees them (issue 18 item 3): this program is its own NVTX tool, a
// static injection (see nvtx3/nvtxDetail/nvtxInit.h) that records every range opened in each
// domain. It checks that a compiled graph run eagerly on a GPU opens one range per node in the
// domain "ccgraph", named like the node's slice in the Chrome traces (detail::node_label), with
// the nccl backend's range for the collective inside its node's, and that an eager collective
// opens one range named after it. Exit 0: passed; 1: failed; 77: skipped (no GPU, or another
// NVTX tool, such as nsys, is attached through NVTX_INJECTION64_PATH and takes precedence).
#include <cstdint>

// NVTX calls this unit's InitializeInjectionNvtx2_fnptr (a strong definition, below, instead
// of the header's weak one) at its first call when no tool was set through the environment.
#define NVTX_STATIC_INJECTION_IMPL
extern "C" int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(std::uint32_t));

#include <ccgraph/cuda.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace cg = ccgraph;

namespace {

struct recorder {
  std::mutex mu;
  std::deque<std::string> domains;  // a domain handle points at its name here
  std::deque<std::string> strings;  // a registered string's handle points at it here
  std::vector<std::string> ranges;  // "ccgraph/name" of each range opened there, in order
  int depth = 0;                    // of the ccgraph domain's ranges
  int max_depth = 0;
  int others = 0;                   // ranges of other domains (NCCL's or cuBLAS's own, if any)
  bool initialised = false;
};
recorder& rec() {
  static recorder r;
  return r;
}

nvtxDomainHandle_t domain_create(const char* name) {
  std::lock_guard lk(rec().mu);
  rec().domains.emplace_back(name);
  return reinterpret_cast<nvtxDomainHandle_t>(&rec().domains.back());
}

nvtxStringHandle_t register_string(nvtxDomainHandle_t, const char* s) {
  std::lock_guard lk(rec().mu);
  rec().strings.emplace_back(s);
  return reinterpret_cast<nvtxStringHandle_t>(&rec().strings.back());
}

bool is_ccgraph(nvtxDomainHandle_t d) { return d && *reinterpret_cast<const std::string*>(d) == "ccgraph"; }

int range_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  std::lock_guard lk(rec().mu);
  if (!is_ccgraph(d)) return rec().others++;
  std::string name = "ccgraph/";
  if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED)
    name += *reinterpret_cast<const std::string*>(a->message.registered);
  else if (a->messageType == NVTX_MESSAGE_TYPE_ASCII)
    name += a->message.ascii;
  else
    name += "?";
  rec().ranges.push_back(std::move(name));
  rec().max_depth = std::max(rec().max_depth, ++rec().depth);
  return rec().depth - 1;
}

int range_pop(nvtxDomainHandle_t d) {
  std::lock_guard lk(rec().mu);
  return is_ccgraph(d) ? --rec().depth : 0;
}

int init(const void* (*get_export_table)(std::uint32_t)) {
  const auto* cb = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || !table) return 0;
  if (size <= NVTX_CBID_CORE2_DomainCreateA) return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create);
  *table[NVTX_CBID_CORE2_DomainRegisterStringA] = reinterpret_cast<NvtxFunctionPointer>(&register_string);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
  rec().initialised = true;
  return 1;
}

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  ++failures;
}

}  // namespace

extern "C" {
int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(std::uint32_t)) = &init;
}

int main() {
  if (std::getenv("NVTX_INJECTION64_PATH")) {
    std::puts("skipped: another NVTX tool is attached (NVTX_INJECTION64_PATH)");
    return 77;
  }
  if (cg::cuda::device_count() < 1) {
    std::puts("skipped: no GPU");
    return 77;
  }
  std::vector<std::string> want;
  std::size_t graph_ranges = 0;
  cg::cuda::run_gpus(1, [&](cg::rank_context& ctx) {
    const cg::group world = std::vector<int>{0};
    auto program = [&](auto a) {
      auto ar = cg::all_reduce(a, "sum", world);
      auto m = cg::matmul(a, a);
      return cg::eval(cg::wait_tensor(ar) + m * 2.f);
    };
    auto run = cg::compile(cg::trace(program, cg::input<float>({64, 64})), ctx);
    for (const cg::node* n : run.exec().graph_ref().nodes()) {
      if (n->category() == cg::op_category::output) continue;
      want.push_back("ccgraph/" + cg::detail::node_label(*n));
      if (n->is_collective()) want.push_back("ccgraph/" + std::string(n->op()));  // the backend's, inside
    }
    const auto x = cg::ones<float>({64, 64}).cuda(0);
    {
      std::lock_guard lk(rec().mu);
      rec().ranges.clear();
    }
    (void)run(x);
    {
      std::lock_guard lk(rec().mu);
      graph_ranges = rec().ranges.size();
    }
    (void)cg::all_reduce(x, "sum", world).to_vector();  // eager
    cg::cuda::synchronize();
  });
  std::lock_guard lk(rec().mu);
  expect(rec().initialised, "NVTX did not call the static injection");
  std::vector<std::string> got(rec().ranges.begin(),
                               rec().ranges.begin() + static_cast<std::ptrdiff_t>(std::min(graph_ranges, rec().ranges.size())));
  std::string listing;
  for (const auto& r : rec().ranges) listing += "  " + r + "\n";
  expect(got == want, "the compiled graph's ranges are one per node, named by node_label; recorded:\n" + listing);
  expect(rec().ranges.size() > graph_ranges && rec().ranges[graph_ranges] == "ccgraph/all_reduce",
         "the eager all_reduce opened a range named all_reduce; recorded:\n" + listing);
  expect(rec().depth == 0, "every range was closed (depth " + std::to_string(rec().depth) + ")");
  expect(rec().max_depth == 2, "the backend's range nests in its node's (max depth " + std::to_string(rec().max_depth) + ")");
  if (failures) return 1;
  std::printf("nvtx ranges: %zu recorded in the ccgraph domain, as expected\n", rec().ranges.size());
  return 0;
}
