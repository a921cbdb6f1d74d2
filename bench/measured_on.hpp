// bench/measured_on.hpp: what the benches record in a calibration table about the machine it
// was measured on (cg::calibration::measured_on), so a table is not used for another machine's
// predictions unknowingly. The GPU benches add the device, driver, CUDA and NCCL versions.
#pragma once

#include <ccgraph/core/config.hpp>
#include <ccgraph/schedule/cost_model.hpp>

#include <ctime>
#include <fstream>
#include <string>
#include <thread>

namespace bench {

/// The CPU's model name from /proc/cpuinfo, or "unknown".
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown";
}

/// Today's date and time in UTC, ISO 8601 ("2026-11-27T17:40:00Z").
inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// Records this host in `c`: the date, ccgraph's version, the compiler, the CPU and its cores.
inline void record_host(ccgraph::calibration& c) {
  c.set_measured_on("date", utc_now());
  c.set_measured_on("ccgraph", std::to_string(CCGRAPH_VERSION_MAJOR) + "." + std::to_string(CCGRAPH_VERSION_MINOR) +
                                   "." + std::to_string(CCGRAPH_VERSION_PATCH));
#if defined(__clang__)
  c.set_measured_on("compiler", "clang " __clang_version__);
#elif defined(__GNUC__)
  c.set_measured_on("compiler", "g++ " __VERSION__);
#else
  c.set_measured_on("compiler", "unknown");
#endif
  c.set_measured_on("cpu", cpu_model());
  c.set_measured_on("cores", std::to_string(std::thread::hardware_concurrency()));
}

}  // namespace bench
