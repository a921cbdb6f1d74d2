// bench/cupti_timeline.hpp: the GPU's own timeline of a program, from CUPTI's activity records
// (kernel, copy and set start/end stamps taken by the GPU), for the benches that explain their
// times kernel by kernel (bench_gpu_timeline, bench_gpu_train --timeline). nsys is not on the lent
// machines; CUPTI ships with the toolkit. One collector per process; `bench::start_cupti()` once,
// then `trace_steps` per program.
#pragma once

#include <ccgraph/cuda.hpp>

#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#define TIMELINE_CHECK_CUPTI(call)                                                          \
  do {                                                                                      \
    const CUptiResult timeline_r_ = (call);                                                 \
    if (timeline_r_ != CUPTI_SUCCESS) {                                                     \
      const char* timeline_s_ = nullptr;                                                    \
      cuptiGetResultString(timeline_r_, &timeline_s_);                                      \
      throw std::runtime_error(std::string(#call) + " failed: " + (timeline_s_ ? timeline_s_ : "?")); \
    }                                                                                       \
  } while (0)

namespace bench::cupti {

namespace cg = ccgraph;

enum class category { gemm, nccl, kernel, copy, set };

inline const char* name_of(category c) {
  switch (c) {
    case category::gemm: return "gemm";
    case category::nccl: return "nccl";
    case category::kernel: return "kernel";
    case category::copy: return "copy";
    case category::set: return "memset";
  }
  return "?";
}

struct record {
  category cat;
  std::string name;
  std::uint32_t device, stream;
  std::uint64_t start, end;  // ns, GPU clock
  int grid = 0;              // blocks, for kernels
};

inline std::mutex records_mu;
inline std::vector<record> records;

/// One CUDA runtime or driver API call (host clock): what the host spends issuing a step.
struct api_record {
  std::string name;  // "cudaGraphLaunch", "cuStreamWaitValue32", ...
  bool driver = false;
  std::uint32_t thread = 0;
  std::uint64_t start = 0, end = 0;  // ns
};
inline std::vector<api_record> api_records;  // guarded by records_mu

inline std::string short_name(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  // Template arguments say little in a table: keep the head of the name.
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

inline category classify(const std::string& name) {
  if (name.find("nccl") != std::string::npos || name.find("ncclDevKernel") != std::string::npos) return category::nccl;
  for (const char* g : {"gemm", "xmma", "cutlass", "sm90_", "cublas"})
    if (name.find(g) != std::string::npos) return category::gemm;
  return category::kernel;
}

inline void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  constexpr std::size_t bytes = std::size_t{8} << 20;
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, bytes));
  *size = bytes;
  *max_records = 0;
}

inline void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  CUpti_Activity* a = nullptr;
  std::vector<record> got;
  std::vector<api_record> apis;
  while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
    if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
      std::string n = short_name(k->name);
      const category c = classify(n);
      got.push_back({c, std::move(n), k->deviceId, k->streamId, k->start, k->end, k->gridX * k->gridY * k->gridZ});
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(a);
      got.push_back({category::copy, "copy " + std::to_string(m->bytes >> 10) + " KiB (kind " +
                                         std::to_string(m->copyKind) + ")",
                     m->deviceId, m->streamId, m->start, m->end});
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY2) {  // between GPUs (the copy-engine all_reduce)
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(a);
      got.push_back({category::copy,
                     "peer copy " + std::to_string(m->bytes >> 10) + " KiB (GPU " + std::to_string(m->srcDeviceId) +
                         " -> " + std::to_string(m->dstDeviceId) + ")",
                     m->deviceId, m->streamId, m->start, m->end});
    } else if (a->kind == CUPTI_ACTIVITY_KIND_RUNTIME || a->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const auto* r = reinterpret_cast<const CUpti_ActivityAPI*>(a);
      const bool drv = a->kind == CUPTI_ACTIVITY_KIND_DRIVER;
      const char* n = nullptr;
      if (cuptiGetCallbackName(drv ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, r->cbid, &n) != CUPTI_SUCCESS)
        n = nullptr;
      apis.push_back({n ? n : "?", drv, r->threadId, r->start, r->end});
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(a);
      got.push_back({category::set, "memset " + std::to_string(m->bytes >> 10) + " KiB", m->deviceId,
                     m->streamId, m->start, m->end});
    }
  }
  std::free(buffer);
  std::lock_guard lk(records_mu);
  records.insert(records.end(), got.begin(), got.end());
  api_records.insert(api_records.end(), apis.begin(), apis.end());
}

/// Everything recorded since the last call (all devices), after the GPU finished; the API
/// calls of the same stretch go to `apis` when given (else they are dropped).
inline std::vector<record> take_records(std::vector<api_record>* apis = nullptr) {
  CCGRAPH_CHECK_CUDA(cudaDeviceSynchronize());
  TIMELINE_CHECK_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  std::lock_guard lk(records_mu);
  if (apis) *apis = std::exchange(api_records, {});
  else api_records.clear();
  return std::exchange(records, {});
}

/// The API calls that took the most host time over `steps` steps of every rank's thread: name,
/// calls and microseconds per step, longest call. A driver call made inside a runtime call is
/// listed too (its time is part of the runtime call's).
inline void print_api_summary(const std::vector<api_record>& apis, int steps) {
  struct agg {
    int calls = 0;
    double total_us = 0, max_us = 0;
  };
  std::map<std::string, agg> by;
  for (const api_record& r : apis) {
    agg& g = by[(r.driver ? "drv " : "rt ") + r.name];
    const double us = static_cast<double>(r.end - r.start) / 1e3;
    ++g.calls, g.total_us += us, g.max_us = std::max(g.max_us, us);
  }
  std::vector<std::pair<std::string, agg>> v(by.begin(), by.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.total_us > b.second.total_us; });
  std::printf("\nHost API calls back to back (every rank's thread), per step:\n\n| call | calls | us | longest us |\n|---|---:|---:|---:|\n");
  for (std::size_t i = 0; i < v.size() && i < 12; ++i)
    std::printf("| %s | %.1f | %.1f | %.1f |\n", v[i].first.c_str(), v[i].second.calls / double(steps),
                v[i].second.total_us / steps, v[i].second.max_us);
}

/// Summary of one step's records on `device`: its span, idle time and time per category.
struct summary {
  double span_us = 0, idle_us = 0;
  std::map<category, double> busy_us;  // summed durations (overlapping kernels add up)
  std::map<category, int> count;
};

inline summary summarize(std::vector<record>& rs) {
  summary s;
  if (rs.empty()) return s;
  std::sort(rs.begin(), rs.end(), [](const record& a, const record& b) { return a.start < b.start; });
  const std::uint64_t t0 = rs.front().start;
  std::uint64_t reach = t0, t_end = t0;
  for (const record& r : rs) {
    if (r.start > reach) s.idle_us += static_cast<double>(r.start - reach) / 1e3;
    reach = std::max(reach, r.end);
    t_end = std::max(t_end, r.end);
    s.busy_us[r.cat] += static_cast<double>(r.end - r.start) / 1e3;
    ++s.count[r.cat];
  }
  s.span_us = static_cast<double>(t_end - t0) / 1e3;
  return s;
}

/// Records `steps` calls of `step` on this rank, one at a time; prints (on rank 0, for its
/// device) a summary row per step and the kernel list of the last one.
inline void trace_steps(const cg::rank_context& ctx, const std::string& title, int steps, bool list,
                 const std::function<void(int)>& step) {
  const bool printer = ctx.rank() == 0;
  for (int i = 0; i < 3; ++i) step(i);  // warm-up: plans, communicators, recordings
  const int b2b_steps = 2 * steps;
  std::vector<record> last;
  std::vector<summary> sums;
  for (int i = 0; i < steps; ++i) {
    if (printer) (void)take_records();
    step(i);
    if (!printer) {
      CCGRAPH_CHECK_CUDA(cudaDeviceSynchronize());
      continue;
    }
    std::vector<record> all = take_records(), mine;
    for (record& r : all)
      if (r.device == static_cast<std::uint32_t>(ctx.device().index)) mine.push_back(std::move(r));
    sums.push_back(summarize(mine));
    last = std::move(mine);
  }
  // The same steps back to back, as the benchmarks run them: the host issues ahead of the
  // GPU, so host gaps between launches are hidden unless the host is the slower side.
  if (printer) (void)take_records();
  const auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < b2b_steps; ++i) step(i);
  const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count();
  summary b2b;
  std::vector<std::string> gaps;  // the idle stretches back to back, with what ended them
  std::vector<api_record> apis;
  if (printer) {
    std::vector<record> all = take_records(&apis), mine;
    for (record& r : all)
      if (r.device == static_cast<std::uint32_t>(ctx.device().index)) mine.push_back(std::move(r));
    b2b = summarize(mine);  // sorts by start
    std::uint64_t reach = mine.empty() ? 0 : mine.front().start;
    for (const record& r : mine) {
      if (r.start > reach + 20000)
        gaps.push_back(std::to_string((r.start - reach) / 1000) + " us before " + name_of(r.cat) + ": " + r.name);
      reach = std::max(reach, r.end);
    }
  } else {
    CCGRAPH_CHECK_CUDA(cudaDeviceSynchronize());
  }
  if (!printer) return;
  std::printf("\n### %s\n\n| step | span us | idle us | gemm us (n) | nccl us (n) | other kernels us (n) | copies us (n) | memsets us (n) |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
              title.c_str());
  for (std::size_t i = 0; i < sums.size(); ++i) {
    summary& s = sums[i];
    std::printf("| %zu | %.1f | %.1f", i, s.span_us, s.idle_us);
    for (category c : {category::gemm, category::nccl, category::kernel, category::copy, category::set})
      std::printf(" | %.1f (%d)", s.busy_us[c], s.count[c]);
    std::printf(" |\n");
  }
  const double per = 1.0 / b2b_steps;
  std::printf("| %d back to back, per step | %.1f | %.1f", b2b_steps, b2b.span_us * per, b2b.idle_us * per);
  for (category c : {category::gemm, category::nccl, category::kernel, category::copy, category::set})
    std::printf(" | %.1f (%.1f)", b2b.busy_us[c] * per, b2b.count[c] * per);
  std::printf(" |\n");
  std::printf("\nBack to back: the host issued the %d steps in %.1f us (%.1f per step); idle stretches over "
              "20 us: %zu%s\n",
              b2b_steps, host_us, host_us / b2b_steps, gaps.size(), gaps.empty() ? "" : ":");
  for (const auto& g : gaps) std::printf("- %s\n", g.c_str());
  print_api_summary(apis, b2b_steps);
  if (!list || last.empty()) return;
  std::map<std::uint32_t, int> streams;  // CUPTI stream ids, numbered in order of appearance
  std::printf("\nKernels of the last step (start and end in us from the step's first record):\n\n| start | end | dur | stream | blocks | what |\n|---:|---:|---:|---:|---:|---|\n");
  const std::uint64_t t0 = last.front().start;
  for (const record& r : last) {
    const int sid = streams.emplace(r.stream, static_cast<int>(streams.size())).first->second;
    std::printf("| %.1f | %.1f | %.1f | %d | %d | %s: %s |\n", static_cast<double>(r.start - t0) / 1e3,
                static_cast<double>(r.end - t0) / 1e3, static_cast<double>(r.end - r.start) / 1e3, sid, r.grid,
                name_of(r.cat), r.name.c_str());
  }
  std::fflush(stdout);
}

/// Starts recording kernels, copies and sets (once per process, before the first step).
inline void start() {
  TIMELINE_CHECK_CUPTI(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  TIMELINE_CHECK_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  TIMELINE_CHECK_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  TIMELINE_CHECK_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  TIMELINE_CHECK_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2));
  TIMELINE_CHECK_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
  TIMELINE_CHECK_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER));
}

/// Hands the last records over (before the program exits).
inline void flush() { TIMELINE_CHECK_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)); }

}  // namespace bench::cupti

