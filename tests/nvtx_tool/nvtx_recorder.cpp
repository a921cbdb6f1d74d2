// tests/nvtx_tool/nvtx_recorder.cpp: an NVTX tool that records what ccgraph's NVTX domain
// receives, for tests/gpu/test_nvtx.cu. A shared library loaded by NVTX itself: NVTX's first
// call in a module (the program, and NCCL's own copy of NVTX) dlopens $NVTX_INJECTION64_PATH and
// calls its InitializeInjectionNvtx2 (a dynamic injection, nvtx3/nvtxDetail/nvtxInit.h), which
// points the module's NVTX entries for domains, registered strings and ranges here.
// Plain C++ on the CUDA toolkit's nvtx3 headers only (no ccgraph header): built by the host
// compiler in about a second. The test reads the record through nvtx_recorder.h.
#define NVTX_NO_IMPL  // a tool: NVTX's types and declarations, not its implementation
#include <nvtx3/nvToolsExt.h>

#include "nvtx_recorder.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct recorder {
  std::mutex mu;
  std::deque<std::string> domains;  // a domain handle points at its name here
  std::deque<std::string> strings;  // a registered string's handle points at it here (every domain)
  std::deque<std::string> ascii;    // copies of the ccgraph domain's ASCII range names
  std::vector<const char*> ccgraph_strings;  // the ccgraph domain's registered strings, in order
  std::vector<ccgraph_nvtx_event> events;    // the ccgraph domain's pushes and pops, in order
  int depth = 0;                             // of the ccgraph domain's ranges
  int max_depth = 0;
  long others = 0;  // ranges of other domains (NCCL's or cuBLAS's own, if any)
  int initialised = 0;
  int failed = 0;
};
recorder& rec() {
  static recorder r;  // never destroyed before NVTX's last call: a leak on purpose
  return r;
}

bool is_ccgraph(nvtxDomainHandle_t d) { return d && *reinterpret_cast<const std::string*>(d) == "ccgraph"; }

nvtxDomainHandle_t domain_create(const char* name) {
  std::lock_guard lk(rec().mu);
  rec().domains.emplace_back(name ? name : "");
  return reinterpret_cast<nvtxDomainHandle_t>(&rec().domains.back());
}

nvtxStringHandle_t register_string(nvtxDomainHandle_t d, const char* s) {
  std::lock_guard lk(rec().mu);
  rec().strings.emplace_back(s ? s : "");
  if (is_ccgraph(d)) rec().ccgraph_strings.push_back(rec().strings.back().c_str());
  return reinterpret_cast<nvtxStringHandle_t>(&rec().strings.back());
}

int range_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  std::lock_guard lk(rec().mu);
  if (!is_ccgraph(d)) return static_cast<int>(rec().others++);
  ccgraph_nvtx_event ev{};
  if (a && a->messageType == NVTX_MESSAGE_TYPE_REGISTERED && a->message.registered) {
    ev.name = reinterpret_cast<const std::string*>(a->message.registered)->c_str();
    ev.registered = 1;
  } else if (a && a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii) {
    ev.name = rec().ascii.emplace_back(a->message.ascii).c_str();
  } else {
    ev.name = "?";
  }
  ev.depth = ++rec().depth;
  rec().max_depth = std::max(rec().max_depth, rec().depth);
  rec().events.push_back(ev);
  return rec().depth - 1;
}

int range_pop(nvtxDomainHandle_t d) {
  std::lock_guard lk(rec().mu);
  if (!is_ccgraph(d)) return 0;
  ccgraph_nvtx_event ev{};
  ev.depth = --rec().depth;
  rec().events.push_back(ev);
  return rec().depth;
}

}  // namespace

extern "C" {

// NVTX's entry point for a dynamic injection (NvtxInitializeInjectionNvtxFunc_t): called once by
// each module's NVTX at its first call. Returns 1 even when it cannot install itself (recorded
// as `failed`): a 0 would make NVTX unload the library, and the test could not tell why.
__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const auto* cb = get_export_table
                       ? static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS))
                       : nullptr;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!cb || !cb->GetModuleFunctionTable || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) ||
      !table || size <= NVTX_CBID_CORE2_DomainRegisterStringA) {
    std::lock_guard lk(rec().mu);
    ++rec().failed;
    return 1;
  }
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create);
  *table[NVTX_CBID_CORE2_DomainRegisterStringA] = reinterpret_cast<NvtxFunctionPointer>(&register_string);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
  std::lock_guard lk(rec().mu);
  ++rec().initialised;
  return 1;
}

__attribute__((visibility("default"))) size_t ccgraph_nvtx_recorder_query(ccgraph_nvtx_record* record,
                                                                          ccgraph_nvtx_event* events,
                                                                          size_t first, size_t cap) {
  std::lock_guard lk(rec().mu);
  const recorder& r = rec();
  if (record) {
    record->initialised = r.initialised;
    record->failed = r.failed;
    record->depth = r.depth;
    record->max_depth = r.max_depth;
    record->events = r.events.size();
    record->strings = r.ccgraph_strings.size();
    record->domains = r.domains.size();
    record->other_ranges = r.others;
  }
  if (!events || first >= r.events.size()) return 0;
  const size_t n = std::min(cap, r.events.size() - first);
  std::copy_n(r.events.begin() + static_cast<std::ptrdiff_t>(first), n, events);
  return n;
}

__attribute__((visibility("default"))) const char* ccgraph_nvtx_recorder_string(size_t i) {
  std::lock_guard lk(rec().mu);
  return i < rec().ccgraph_strings.size() ? rec().ccgraph_strings[i] : nullptr;
}

}  // extern "C"
